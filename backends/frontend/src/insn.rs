//! Raw eBPF encoding constants (RFC 9669) and the typed instruction form backends consume.

/// Opcode field constants.
pub mod op {
    /// Instruction classes (low 3 bits).
    pub const CLASS_LD: u8 = 0x00;
    pub const CLASS_LDX: u8 = 0x01;
    pub const CLASS_ST: u8 = 0x02;
    pub const CLASS_STX: u8 = 0x03;
    pub const CLASS_ALU: u8 = 0x04;
    pub const CLASS_JMP: u8 = 0x05;
    pub const CLASS_JMP32: u8 = 0x06;
    pub const CLASS_ALU64: u8 = 0x07;

    /// Source bit of ALU/JMP classes.
    pub const SRC_K: u8 = 0x00;
    pub const SRC_X: u8 = 0x08;

    /// Size field of load/store classes.
    pub const SIZE_W: u8 = 0x00;
    pub const SIZE_H: u8 = 0x08;
    pub const SIZE_B: u8 = 0x10;
    pub const SIZE_DW: u8 = 0x18;

    /// Mode field of load/store classes.
    pub const MODE_IMM: u8 = 0x00;
    /// Legacy packet access (class LD only): `LD_ABS` and `LD_IND`.
    pub const MODE_ABS: u8 = 0x20;
    pub const MODE_IND: u8 = 0x40;
    pub const MODE_MEM: u8 = 0x60;
    pub const MODE_MEMSX: u8 = 0x80;
    pub const MODE_ATOMIC: u8 = 0xc0;

    /// ALU operations (high 4 bits).
    pub const ALU_ADD: u8 = 0x00;
    pub const ALU_SUB: u8 = 0x10;
    pub const ALU_MUL: u8 = 0x20;
    pub const ALU_DIV: u8 = 0x30;
    pub const ALU_OR: u8 = 0x40;
    pub const ALU_AND: u8 = 0x50;
    pub const ALU_LSH: u8 = 0x60;
    pub const ALU_RSH: u8 = 0x70;
    pub const ALU_NEG: u8 = 0x80;
    pub const ALU_MOD: u8 = 0x90;
    pub const ALU_XOR: u8 = 0xa0;
    pub const ALU_MOV: u8 = 0xb0;
    pub const ALU_ARSH: u8 = 0xc0;
    pub const ALU_END: u8 = 0xd0;

    /// JMP operations (high 4 bits).
    pub const JMP_JA: u8 = 0x00;
    pub const JMP_JEQ: u8 = 0x10;
    pub const JMP_JGT: u8 = 0x20;
    pub const JMP_JGE: u8 = 0x30;
    pub const JMP_JSET: u8 = 0x40;
    pub const JMP_JNE: u8 = 0x50;
    pub const JMP_JSGT: u8 = 0x60;
    pub const JMP_JSGE: u8 = 0x70;
    pub const JMP_CALL: u8 = 0x80;
    pub const JMP_EXIT: u8 = 0x90;
    pub const JMP_JLT: u8 = 0xa0;
    pub const JMP_JLE: u8 = 0xb0;
    pub const JMP_JSLT: u8 = 0xc0;
    pub const JMP_JSLE: u8 = 0xd0;

    /// Atomic operations (in `imm`).
    pub const ATOMIC_ADD: i32 = 0x00;
    pub const ATOMIC_OR: i32 = 0x40;
    pub const ATOMIC_AND: i32 = 0x50;
    pub const ATOMIC_XOR: i32 = 0xa0;
    pub const ATOMIC_FETCH: i32 = 0x01;
    pub const ATOMIC_XCHG: i32 = 0xe0 | ATOMIC_FETCH;
    pub const ATOMIC_CMPXCHG: i32 = 0xf0 | ATOMIC_FETCH;

    /// `src` values of `call`.
    pub const CALL_HELPER: u8 = 0;
    pub const CALL_LOCAL: u8 = 1;

    /// `LD_IMM64` opcode (`BPF_LD | BPF_IMM | BPF_DW`).
    pub const LD_IMM64: u8 = 0x18;
}

/// A raw 8-byte instruction slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawInsn {
    /// Opcode byte.
    pub opc: u8,
    /// Destination register (low nibble of byte 1).
    pub dst: u8,
    /// Source register (high nibble of byte 1).
    pub src: u8,
    /// Signed 16-bit offset.
    pub off: i16,
    /// Signed 32-bit immediate.
    pub imm: i32,
}

impl RawInsn {
    /// An instruction from its fields.
    pub const fn new(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Self {
            opc,
            dst,
            src,
            off,
            imm,
        }
    }

    /// Decodes slot bytes (little-endian, as on every target packjit supports).
    pub fn from_bytes(b: &[u8; 8]) -> Self {
        Self {
            opc: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Encodes the slot.
    pub fn to_bytes(self) -> [u8; 8] {
        let o = self.off.to_le_bytes();
        let i = self.imm.to_le_bytes();
        [
            self.opc,
            (self.src << 4) | (self.dst & 0x0f),
            o[0],
            o[1],
            i[0],
            i[1],
            i[2],
            i[3],
        ]
    }
}

/// The 8 bytes of one instruction slot from its fields: the shorthand tests, benches and
/// tools use to write bytecode by hand (`encode_insn(0xb7, 0, 0, 0, 7)` is `mov r0, 7`).
pub fn encode_insn(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    RawInsn::new(opc, dst, src, off, imm).to_bytes()
}

/// A BPF register number, 0..=10.
pub type Reg = u8;

/// BPF's frame pointer (read-only).
pub const R10: Reg = 10;

/// Operand width of ALU and JMP operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Width {
    /// 32-bit: operands are the low halves; ALU results are zero-extended to 64 bits.
    W32,
    /// 64-bit.
    W64,
}

/// Second operand of ALU, JMP and store instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// A register.
    Reg(Reg),
    /// A 32-bit immediate, sign-extended to 64 bits for 64-bit operations.
    Imm(i32),
}

/// Binary ALU operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AluOp {
    /// Wrapping add.
    Add,
    /// Wrapping subtract.
    Sub,
    /// Wrapping multiply.
    Mul,
    /// Unsigned divide; x / 0 = 0.
    Div,
    /// Signed divide; x / 0 = 0, MIN / -1 = MIN.
    Sdiv,
    /// Unsigned remainder; x % 0 = x.
    Mod,
    /// Signed remainder (sign of the dividend); x % 0 = x, MIN % -1 = 0.
    Smod,
    /// Bitwise or.
    Or,
    /// Bitwise and.
    And,
    /// Bitwise xor.
    Xor,
    /// Shift left, count masked to the width.
    Lsh,
    /// Logical shift right, count masked.
    Rsh,
    /// Arithmetic shift right, count masked.
    Arsh,
    /// Move.
    Mov,
}

/// Byte-order operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndKind {
    /// Convert to little-endian: on little-endian targets, truncate to `bits` (zero-extend).
    ToLe,
    /// Convert to big-endian: swap the low `bits` and zero-extend.
    ToBe,
    /// Unconditional swap (cpu v4 `bswap`), same as `ToBe` on little-endian targets.
    Swap,
}

/// Memory access sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Size {
    /// 1 byte.
    B,
    /// 2 bytes.
    H,
    /// 4 bytes.
    W,
    /// 8 bytes.
    DW,
}

impl Size {
    /// Size in bytes.
    pub const fn bytes(self) -> u32 {
        match self {
            Size::B => 1,
            Size::H => 2,
            Size::W => 4,
            Size::DW => 8,
        }
    }
}

/// Atomic read-modify-write operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// `*addr += src`.
    Add,
    /// `*addr |= src`.
    Or,
    /// `*addr &= src`.
    And,
    /// `*addr ^= src`.
    Xor,
    /// `src = xchg(*addr, src)` (always fetches).
    Xchg,
    /// `r0 = cmpxchg(*addr, r0, src)` (always fetches, into r0).
    Cmpxchg,
}

/// Branch conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cond {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// Unsigned `>`.
    Gt,
    /// Unsigned `>=`.
    Ge,
    /// Unsigned `<`.
    Lt,
    /// Unsigned `<=`.
    Le,
    /// Signed `>`.
    Sgt,
    /// Signed `>=`.
    Sge,
    /// Signed `<`.
    Slt,
    /// Signed `<=`.
    Sle,
    /// `(dst & src) != 0`.
    Set,
}

impl Cond {
    /// The condition true exactly when `self` is false (`None` for [`Cond::Set`], which has
    /// no eBPF negation).
    pub fn negated(self) -> Option<Cond> {
        Some(match self {
            Cond::Eq => Cond::Ne,
            Cond::Ne => Cond::Eq,
            Cond::Gt => Cond::Le,
            Cond::Le => Cond::Gt,
            Cond::Ge => Cond::Lt,
            Cond::Lt => Cond::Ge,
            Cond::Sgt => Cond::Sle,
            Cond::Sle => Cond::Sgt,
            Cond::Sge => Cond::Slt,
            Cond::Slt => Cond::Sge,
            Cond::Set => return None,
        })
    }

    /// Evaluates the condition on two operands already reduced to the operation's width
    /// (for 32-bit compares: zero-extended low halves; signed conditions reinterpret them at
    /// `width`).
    pub fn eval(self, width: Width, a: u64, b: u64) -> bool {
        let (sa, sb) = match width {
            Width::W32 => (a as u32 as i32 as i64, b as u32 as i32 as i64),
            Width::W64 => (a as i64, b as i64),
        };
        match self {
            Cond::Eq => a == b,
            Cond::Ne => a != b,
            Cond::Gt => a > b,
            Cond::Ge => a >= b,
            Cond::Lt => a < b,
            Cond::Le => a <= b,
            Cond::Sgt => sa > sb,
            Cond::Sge => sa >= sb,
            Cond::Slt => sa < sb,
            Cond::Sle => sa <= sb,
            Cond::Set => a & b != 0,
        }
    }
}

/// A verified instruction in typed form. Jump and call targets are instruction indices
/// (into [`Program::insts`](crate::Program::insts)), not slot offsets; they are `u32`
/// ([`MAX_INSNS`](crate::MAX_INSNS) fits) to keep [`Inst`] small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `dst = dst op src` (or `dst = src` for `Mov`) at `width`.
    Alu {
        width: Width,
        op: AluOp,
        dst: Reg,
        src: Operand,
    },
    /// `dst = sign_extend(src, bits)` at `width` (cpu v4 `movsx`; `bits` is 8, 16 or 32).
    MovSx {
        width: Width,
        dst: Reg,
        src: Reg,
        bits: u8,
    },
    /// packjit's per-CPU address instruction (opt-in `PJ_COMPILE_PERCPU_INSN`; the kernel's
    /// `BPF_MOV64_PERCPU_REG` encoding with `imm` = per-CPU array id):
    /// `dst = src + cpu * slot_size` of per-CPU array `array`, or `dst = src` when the array
    /// is not in the program's table or `cpu >= cpus`. The result is an ordinary pointer:
    /// sandboxed accesses through it are checked like any other. `array` is the id: the
    /// instruction's constant (`Operand::Imm`, read as a `u32`), or a register holding it
    /// (the blinding rewrite's [`crate::blind::AX`]; an id that is not a `u32` is in no
    /// table).
    MovPerCpu { dst: Reg, src: Reg, array: Operand },
    /// `dst = -dst` at `width`.
    Neg { width: Width, dst: Reg },
    /// Byte-order conversion of the low `bits` (16, 32, 64) of `dst`.
    End { kind: EndKind, bits: u8, dst: Reg },
    /// `dst = imm` (64-bit; two slots).
    LdImm64 { dst: Reg, imm: Imm64 },
    /// `dst = *(size *)(base + off)`, zero- or sign-extended.
    Load {
        size: Size,
        sign_extend: bool,
        dst: Reg,
        base: Reg,
        off: i16,
    },
    /// `*(size *)(base + off) = src` (register or immediate).
    Store {
        size: Size,
        base: Reg,
        off: i16,
        src: Operand,
    },
    /// Atomic operation on `*(size *)(base + off)` (`size` is W or DW).
    Atomic {
        size: Size,
        op: AtomicOp,
        fetch: bool,
        base: Reg,
        off: i16,
        src: Reg,
    },
    /// Unconditional jump to instruction index `target` (`ja` or `ja32`).
    Ja { target: u32 },
    /// Conditional jump.
    Jcond {
        width: Width,
        cond: Cond,
        dst: Reg,
        src: Operand,
        target: u32,
    },
    /// Call helper `id` (registered, so its address is in the request's helper table).
    CallHelper { id: u32 },
    /// Call the helper whose id is in register `reg` (`callx`).
    CallReg { reg: Reg },
    /// Call the subprogram starting at instruction index `target`.
    CallLocal { target: u32 },
    /// Return r0 from the current (sub)program.
    Exit,
    /// Legacy packet access (`LD_ABS` / `LD_IND`, class LD, modes 0x20 / 0x40), with rbpf
    /// 0.4.1's semantics: `r0 = *(size *)(ctx + index + off)`, zero-extended, in the
    /// target's byte order (no swap), where `ctx` is r1's value at the program's entry (the
    /// context start, `PjExecEnv::ctx_start`), `index` the register of `LD_IND` (none for
    /// `LD_ABS`) and `off` the immediate read as a `u32`. r1-r5 are preserved. The access is
    /// an ordinary load: sandboxed code checks it. Lowered by the front end's rewrite
    /// ([`crate::packet`]); see there for where this differs from the kernel.
    PacketLoad {
        size: Size,
        index: Option<Reg>,
        off: u32,
    },
}

/// One verified instruction: where it sits and what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Inst {
    /// Slot index in the bytecode (what error messages call the pc). A `u32`:
    /// [`MAX_INSNS`](crate::MAX_INSNS) fits.
    pub pc: u32,
    /// The operation.
    pub op: Op,
}

// Every pass (decode, analysis, each backend's lowering) walks the `Vec<Inst>`, and at 1 M
// instructions compile time is bound by the memory traffic over it: padding `Inst` to 64
// bytes made 1 M-instruction compiles ~23% slower (1 k unchanged). Hence `u32` pcs and
// targets and the two-half [`Imm64`]: 20 bytes, alignment 4 (it was 32 bytes, alignment 8).
const _: () = assert!(std::mem::size_of::<Inst>() == 20 && std::mem::align_of::<Inst>() == 4);
const _: () = assert!(std::mem::size_of::<Op>() == 16 && std::mem::align_of::<Op>() == 4);

/// The 64-bit immediate of [`Op::LdImm64`], kept as two `u32` halves.
///
/// A `u64` field would give [`Op`], and so [`Inst`], 8-byte alignment, growing `Inst` from
/// 20 to 24 bytes (see the size assertions above); the halves keep it at alignment 4.
/// `Debug` shows the value as a `u64`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Imm64 {
    lo: u32,
    hi: u32,
}

impl Imm64 {
    /// The immediate `value`.
    pub const fn new(value: u64) -> Self {
        Self {
            lo: value as u32,
            hi: (value >> 32) as u32,
        }
    }

    /// The value.
    pub const fn get(self) -> u64 {
        (self.hi as u64) << 32 | self.lo as u64
    }
}

impl From<u64> for Imm64 {
    fn from(value: u64) -> Self {
        Self::new(value)
    }
}

impl From<Imm64> for u64 {
    fn from(imm: Imm64) -> Self {
        imm.get()
    }
}

impl std::fmt::Debug for Imm64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl Op {
    /// The BPF register this instruction writes, if any (for register-save decisions).
    pub fn written_reg(&self) -> Option<Reg> {
        match *self {
            Op::Alu { dst, .. }
            | Op::MovSx { dst, .. }
            | Op::MovPerCpu { dst, .. }
            | Op::Neg { dst, .. }
            | Op::End { dst, .. }
            | Op::LdImm64 { dst, .. }
            | Op::Load { dst, .. } => Some(dst),
            Op::PacketLoad { .. } => Some(0),
            Op::Atomic {
                op: AtomicOp::Cmpxchg,
                ..
            } => Some(0),
            Op::Atomic {
                fetch: true, src, ..
            } => Some(src),
            Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. } => Some(0),
            _ => None,
        }
    }
}

/// One bit per [`Op`] variant, for [`Subprog::ops`](crate::Subprog::ops): which kinds of
/// instruction a function contains, so a backend can ask "any `callx`?" or "any atomic?"
/// without another pass over the instructions.
pub mod op_kind {
    /// [`Op::Alu`](super::Op::Alu).
    pub const ALU: u16 = 1 << 0;
    /// [`Op::MovSx`](super::Op::MovSx).
    pub const MOV_SX: u16 = 1 << 1;
    /// [`Op::MovPerCpu`](super::Op::MovPerCpu).
    pub const MOV_PERCPU: u16 = 1 << 2;
    /// [`Op::Neg`](super::Op::Neg).
    pub const NEG: u16 = 1 << 3;
    /// [`Op::End`](super::Op::End).
    pub const END: u16 = 1 << 4;
    /// [`Op::LdImm64`](super::Op::LdImm64).
    pub const LD_IMM64: u16 = 1 << 5;
    /// [`Op::Load`](super::Op::Load).
    pub const LOAD: u16 = 1 << 6;
    /// [`Op::Store`](super::Op::Store).
    pub const STORE: u16 = 1 << 7;
    /// [`Op::Atomic`](super::Op::Atomic).
    pub const ATOMIC: u16 = 1 << 8;
    /// [`Op::Ja`](super::Op::Ja).
    pub const JA: u16 = 1 << 9;
    /// [`Op::Jcond`](super::Op::Jcond).
    pub const JCOND: u16 = 1 << 10;
    /// [`Op::CallHelper`](super::Op::CallHelper).
    pub const CALL_HELPER: u16 = 1 << 11;
    /// [`Op::CallReg`](super::Op::CallReg).
    pub const CALL_REG: u16 = 1 << 12;
    /// [`Op::CallLocal`](super::Op::CallLocal).
    pub const CALL_LOCAL: u16 = 1 << 13;
    /// [`Op::Exit`](super::Op::Exit).
    pub const EXIT: u16 = 1 << 14;
    /// [`Op::PacketLoad`](super::Op::PacketLoad) (legacy `LD_ABS` / `LD_IND`).
    pub const PACKET_LOAD: u16 = 1 << 15;
    /// The calls of every kind (helper, `callx`, local): they clobber r1–r5.
    pub const CALLS: u16 = CALL_HELPER | CALL_REG | CALL_LOCAL;
    /// What ends the straight-line stretch a pass follows a value through: jumps, `exit`,
    /// calls (they clobber r1–r5) and legacy packet loads (they may end the run).
    pub const STRAIGHT_LINE_END: u16 = JA | JCOND | EXIT | CALLS | PACKET_LOAD;
}

impl Op {
    /// This instruction's [`op_kind`] bit.
    pub fn kind_bit(&self) -> u16 {
        1 << self.kind_index()
    }

    /// The bit number of [`Op::kind_bit`] (0..=15).
    pub(crate) fn kind_index(&self) -> u32 {
        match self {
            Op::Alu { .. } => 0,
            Op::MovSx { .. } => 1,
            Op::MovPerCpu { .. } => 2,
            Op::Neg { .. } => 3,
            Op::End { .. } => 4,
            Op::LdImm64 { .. } => 5,
            Op::Load { .. } => 6,
            Op::Store { .. } => 7,
            Op::Atomic { .. } => 8,
            Op::Ja { .. } => 9,
            Op::Jcond { .. } => 10,
            Op::CallHelper { .. } => 11,
            Op::CallReg { .. } => 12,
            Op::CallLocal { .. } => 13,
            Op::Exit => 14,
            Op::PacketLoad { .. } => 15,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imm64_round_trips_and_prints_as_u64() {
        for v in [
            0,
            1,
            u32::MAX as u64,
            1 << 32,
            0x1234_5678_9abc_def0,
            u64::MAX,
        ] {
            let imm = Imm64::new(v);
            assert_eq!(imm.get(), v);
            assert_eq!(u64::from(Imm64::from(v)), v);
            assert_eq!(format!("{imm:?}"), format!("{v:?}"));
        }
        let op = Op::LdImm64 {
            dst: 1,
            imm: Imm64::new(5),
        };
        assert_eq!(format!("{op:?}"), "LdImm64 { dst: 1, imm: 5 }");
    }
}
