//! Instruction forms and encoders over dynasm's riscv64 assembler.
//!
//! Every method emits one RISC-V instruction (or a fixed idiom) and picks the compressed
//! (C extension) encoding when the request allows it and the operands fit that encoding's
//! restrictions (non-zero registers, `x8`–`x15` for the CL/CS/CA/CB formats, 6-bit
//! immediates). Selection lives here, in one place, so the lowering code never thinks
//! about encodings. This layer knows RISC-V only: it takes native register numbers, the
//! front end's [`Width`] and its own operation enums, never eBPF instructions.

// dynasm expands a dynamic register `X(r)` to `r.into()` and casts immediates itself,
// which clippy flags as redundant in the generated code.
#![allow(clippy::useless_conversion, clippy::unnecessary_cast)]

use dynasmrt::riscv::RiscvRelocation;
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use packjit_frontend::analysis::EmitCapacity;
use packjit_frontend::reuse::{self, Reused};
use packjit_frontend::Width;

/// RISC-V register numbers by ABI name (the whole integer file the backend may name; not
/// every one is in use in every configuration).
#[allow(dead_code)]
pub mod reg {
    pub const ZERO: u8 = 0;
    pub const RA: u8 = 1;
    pub const SP: u8 = 2;
    pub const TP: u8 = 4;
    pub const T0: u8 = 5;
    pub const T1: u8 = 6;
    pub const T2: u8 = 7;
    pub const S1: u8 = 9;
    pub const A0: u8 = 10;
    pub const A1: u8 = 11;
    pub const A2: u8 = 12;
    pub const A3: u8 = 13;
    pub const A4: u8 = 14;
    pub const A5: u8 = 15;
    pub const A6: u8 = 16;
    pub const A7: u8 = 17;
    pub const S2: u8 = 18;
    pub const S3: u8 = 19;
    pub const S4: u8 = 20;
    pub const S5: u8 = 21;
    pub const S6: u8 = 22;
    pub const S7: u8 = 23;
    pub const S8: u8 = 24;
    pub const S9: u8 = 25;
    pub const S10: u8 = 26;
    pub const S11: u8 = 27;
    pub const T3: u8 = 28;
    pub const T4: u8 = 29;
    pub const T5: u8 = 30;
    pub const T6: u8 = 31;
}
use reg::*;

/// All instructions go through this macro so the target and the extension set the macro
/// accepts are stated once. The extension set is what the *assembler* may encode; whether
/// an optional instruction is used is decided at run time by [`Assembler`]'s feature flags.
macro_rules! rv {
    ($asm:expr; $($t:tt)*) => {
        dynasm!($asm
            ; .arch riscv64
            ; .feature I, M, A, C, Zbb, Zba
            ; $($t)*
        )
    };
}

/// A compressed (16-bit) instruction: counted as it is emitted, so the instruction count of
/// the code needs no scan of the variable-length stream ([`Assembler::native_insns`]).
macro_rules! rvc {
    ($emitter:expr; $($t:tt)*) => {{
        $emitter.compressed += 1;
        rv!($emitter.asm; $($t)*)
    }};
}

/// Three-register ALU instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum R3 {
    Add,
    Sub,
    And,
    Or,
    Xor,
    Addw,
    Subw,
    Mul,
    Mulw,
    Div,
    Divu,
    Divw,
    Divuw,
    Rem,
    Remu,
    Remw,
    Remuw,
    Sll,
    Srl,
    Sra,
    Sllw,
    Srlw,
    Sraw,
    Sltu,
}

/// AMO operations (the `amo<op>.{w,d}` family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amo {
    Add,
    And,
    Or,
    Xor,
    Swap,
}

/// Register-immediate ALU instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RI {
    Addi,
    Addiw,
    Andi,
    Ori,
    Xori,
    Slli,
    Srli,
    Srai,
    Slliw,
    Srliw,
    Sraiw,
    Sltiu,
}

/// Native conditional branch kinds (`b<kind> rs1, rs2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Br {
    Eq,
    Ne,
    Lt,
    Ge,
    Ltu,
    Geu,
}

impl Br {
    /// The branch taken exactly when `self` is not.
    pub fn invert(self) -> Br {
        match self {
            Br::Eq => Br::Ne,
            Br::Ne => Br::Eq,
            Br::Lt => Br::Ge,
            Br::Ge => Br::Lt,
            Br::Ltu => Br::Geu,
            Br::Geu => Br::Ltu,
        }
    }
}

/// Memory access widths and signedness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    B,
    Bu,
    H,
    Hu,
    W,
    Wu,
    D,
}

/// Does `v` fit a signed `bits`-bit immediate?
pub fn fits_signed(v: i64, bits: u32) -> bool {
    let lim = 1i64 << (bits - 1);
    (-lim..lim).contains(&v)
}

/// `x8`–`x15`: the registers the 3-bit fields of compressed formats can name.
fn pop(r: u8) -> bool {
    (8..16).contains(&r)
}

/// The assembler: a dynasm `VecAssembler` plus the optional-extension switches.
pub struct Assembler {
    pub asm: VecAssembler<RiscvRelocation>,
    /// B- and J-type branches to labels, whose displacement [`Assembler::finish`] writes (a
    /// thread's spare buffer for a large program: a fresh one would fault its pages in on
    /// every compile).
    patches: Reused<Patch>,
    /// Use Zbb (`rev8`, `sext.b/h`, `zext.h`).
    pub zbb: bool,
    /// Use Zba (`add.uw` as `zext.w`).
    pub zba: bool,
    /// Use compressed encodings.
    pub c: bool,
    /// Byte ranges of data in the code (`callx` tables and their padding): not
    /// instructions (see [`count_insns_except`]).
    pub data: Vec<std::ops::Range<usize>>,
    /// Compressed instructions emitted so far (every one goes through `rvc!`).
    compressed: usize,
}

/// `jal` with rd = 0 and a zero displacement.
const JAL: u32 = 0x6f;

/// A branch to a label whose displacement is written after the last pass. dynasmrt 5.1
/// checks B- and J-type label displacements against a 12/20-bit signed field without the
/// implicit low zero bit, so it accepts only half the ISA's reach (±2 KiB and ±512 KiB
/// instead of ±4 KiB and ±1 MiB); encoding these branches here gives relaxation the full
/// range, and fewer long forms.
#[derive(Clone, Copy, Debug)]
struct Patch {
    /// Offset of the 4-byte instruction (emitted with displacement 0).
    at: usize,
    target: DynamicLabel,
    kind: PatchKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PatchKind {
    /// `b<cc>`: 13-bit signed, even, `imm[12|10:5]` in bits 31:25, `imm[4:1|11]` in 11:7.
    B,
    /// `jal`: 21-bit signed, even, `imm[20|10:1|11|19:12]` in bits 31:12.
    J,
}

/// B-type immediate bits for `disp`, if it is in reach (−4096..=4094, even).
pub fn b_type_imm(disp: i64) -> Option<u32> {
    if disp % 2 != 0 || !(-4096..=4094).contains(&disp) {
        return None;
    }
    let d = disp as u32;
    Some((d >> 12 & 1) << 31 | (d >> 5 & 0x3f) << 25 | (d >> 1 & 0xf) << 8 | (d >> 11 & 1) << 7)
}

/// J-type immediate bits for `disp`, if it is in reach (−2^20..=2^20−2, even).
pub fn j_type_imm(disp: i64) -> Option<u32> {
    if disp % 2 != 0 || !(-(1 << 20)..=(1 << 20) - 2).contains(&disp) {
        return None;
    }
    let d = disp as u32;
    Some(
        (d >> 20 & 1) << 31 | (d >> 1 & 0x3ff) << 21 | (d >> 11 & 1) << 20 | (d >> 12 & 0xff) << 12,
    )
}

impl Assembler {
    /// An assembler with buffers for `code_capacity` bytes (the lowering sizes all of its
    /// buffers instead: [`Assembler::with_capacity`]).
    #[cfg(test)]
    pub fn new(zbb: bool, zba: bool, c: bool, code_capacity: usize) -> Self {
        let capacity = EmitCapacity {
            code: code_capacity,
            labels: 0,
            branch_sites: 0,
        };
        Self::with_capacity(zbb, zba, c, capacity)
    }

    /// An assembler whose buffers hold `capacity` (B/J-type patches: `branch_sites`).
    pub fn with_capacity(zbb: bool, zba: bool, c: bool, capacity: EmitCapacity) -> Self {
        Self {
            asm: reuse::assembler(capacity.code, capacity.labels, 0),
            patches: reuse::take(capacity.branch_sites),
            zbb,
            zba,
            c,
            data: Vec::new(),
            compressed: 0,
        }
    }

    /// Instructions emitted so far, data excluded: every instruction is 4 bytes except the
    /// compressed ones, which were counted as they were emitted. (Equal to
    /// [`count_insns_except`] over the code, which tests check, without scanning it.)
    pub fn native_insns(&self) -> usize {
        let data: usize = self.data.iter().map(|r| r.len()).sum();
        let full_bytes = self.pos() - data - 2 * self.compressed;
        full_bytes / 4 + self.compressed
    }

    /// Current byte offset.
    pub fn pos(&self) -> usize {
        self.asm.offset().0
    }

    pub fn new_label(&mut self) -> DynamicLabel {
        self.asm.new_dynamic_label()
    }

    pub fn bind(&mut self, l: DynamicLabel) {
        self.asm.dynamic_label(l);
    }

    // ---- register moves and immediates -------------------------------------------------

    pub fn mv(&mut self, rd: u8, rs: u8) {
        if rd == rs {
            return;
        }
        if self.c && rd != ZERO && rs != ZERO {
            rvc!(self; c.mv X(rd), X(rs));
        } else {
            rv!(self.asm; mv X(rd), X(rs));
        }
    }

    /// `lui rd, value` where `value` has its low 12 bits clear and fits i32.
    fn lui(&mut self, rd: u8, value: i32) {
        let hi = value >> 12;
        if self.c && rd != ZERO && rd != SP && hi != 0 && (-32..32).contains(&hi) {
            rvc!(self; c.lui X(rd), value);
        } else {
            rv!(self.asm; lui X(rd), value);
        }
    }

    /// Loads a 64-bit constant in the fewest instructions this simple scheme finds: `addi`
    /// for 12-bit values, `lui`(+`addiw`) for 32-bit values, otherwise the upper part
    /// recursively, shifted left past its trailing zeros, plus a 12-bit low part (the same
    /// decomposition the kernel's RV64 JIT and LLVM's base case use).
    pub fn li(&mut self, rd: u8, val: i64) {
        if fits_signed(val, 12) {
            self.ri(RI::Addi, rd, ZERO, val as i32);
            return;
        }
        // Low 12 bits, sign-extended; `upper` is what remains (rounded so lo is signed).
        let lo = (val << 52) >> 52;
        if fits_signed(val, 32) {
            // lui sign-extends bit 31 and addiw wraps at 32 bits, so this covers every i32
            // even when rounding makes `upper` 0x80000.
            let upper = ((val - lo) as i32) as i64;
            self.lui(rd, upper as i32);
            if lo != 0 {
                self.ri(RI::Addiw, rd, rd, lo as i32);
            }
            return;
        }
        let upper = val.wrapping_sub(lo) >> 12;
        let shift = upper.trailing_zeros();
        let rest = upper >> shift;
        self.li(rd, rest);
        self.ri(RI::Slli, rd, rd, (shift + 12) as i32);
        if lo != 0 {
            self.ri(RI::Addi, rd, rd, lo as i32);
        }
    }

    /// How many instructions [`Assembler::li`] emits for `val` (the same decomposition).
    pub fn li_len(val: i64) -> usize {
        if fits_signed(val, 12) {
            return 1;
        }
        let lo = (val << 52) >> 52;
        if fits_signed(val, 32) {
            return 1 + usize::from(lo != 0);
        }
        let upper = val.wrapping_sub(lo) >> 12;
        let rest = upper >> upper.trailing_zeros();
        Self::li_len(rest) + 1 + usize::from(lo != 0)
    }

    /// `auipc rd, hi; ld rd, lo(rd)`: the 8 bytes at label `l` (±2 GiB).
    pub fn ld_label(&mut self, rd: u8, l: DynamicLabel) {
        rv!(self.asm; ld X(rd), =>l);
    }

    /// `rd = base + (index << shift)`, `shift` ≤ 3: `shNadd` with Zba, else `slli` into
    /// `tmp` and `add` (one `add` for shift 0).
    pub fn scaled_add(&mut self, rd: u8, base: u8, index: u8, shift: u8, tmp: u8) {
        match (shift, self.zba) {
            (0, _) => self.rrr(R3::Add, rd, base, index),
            (1, true) => rv!(self.asm; sh1add X(rd), X(index), X(base)),
            (2, true) => rv!(self.asm; sh2add X(rd), X(index), X(base)),
            (3, true) => rv!(self.asm; sh3add X(rd), X(index), X(base)),
            (s, _) => {
                debug_assert!(s <= 3, "scaled_add shift {s}");
                self.ri(RI::Slli, tmp, index, i32::from(s));
                self.rrr(R3::Add, rd, base, tmp);
            }
        }
    }

    /// `rd = zero_extend(rs[31:0])`: `add.uw rd, rs, zero` with Zba, else a shift pair.
    pub fn zext32(&mut self, rd: u8, rs: u8) {
        if self.zba {
            rv!(self.asm; add.uw X(rd), X(rs), zero);
        } else {
            self.ri(RI::Slli, rd, rs, 32);
            self.ri(RI::Srli, rd, rd, 32);
        }
    }

    /// `rd = zero_extend(rs[15:0])`.
    pub fn zext16(&mut self, rd: u8, rs: u8) {
        if self.zbb {
            rv!(self.asm; zext.h X(rd), X(rs));
        } else {
            self.ri(RI::Slli, rd, rs, 48);
            self.ri(RI::Srli, rd, rd, 48);
        }
    }

    /// `rd = sign_extend(rs[bits-1:0])` for 8, 16, 32.
    pub fn sext(&mut self, rd: u8, rs: u8, bits: u8) {
        match bits {
            32 => self.ri(RI::Addiw, rd, rs, 0),
            8 if self.zbb => rv!(self.asm; sext.b X(rd), X(rs)),
            16 if self.zbb => rv!(self.asm; sext.h X(rd), X(rs)),
            _ => {
                let sh = 64 - bits as i32;
                self.ri(RI::Slli, rd, rs, sh);
                self.ri(RI::Srai, rd, rd, sh);
            }
        }
    }

    /// `minu rd, rs1, rs2` (Zbb only).
    pub fn minu(&mut self, rd: u8, rs1: u8, rs2: u8) {
        rv!(self.asm; minu X(rd), X(rs1), X(rs2));
    }

    /// `rev8 rd, rs` (Zbb only).
    pub fn rev8(&mut self, rd: u8, rs: u8) {
        rv!(self.asm; rev8 X(rd), X(rs));
    }

    // ---- ALU -----------------------------------------------------------------------------

    pub fn rrr(&mut self, op: R3, rd: u8, rs1: u8, rs2: u8) {
        // Compressed two-address forms: rd must equal one source (the other one for
        // commutative operations).
        if self.c && rd != ZERO {
            let commutative = matches!(op, R3::Add | R3::And | R3::Or | R3::Xor | R3::Addw);
            let (a, b) = if rd == rs1 {
                (rs1, rs2)
            } else if commutative && rd == rs2 {
                (rs2, rs1)
            } else {
                (ZERO, ZERO)
            };
            if a == rd {
                match op {
                    R3::Add if b != ZERO => {
                        rvc!(self; c.add X(a), X(b));
                        return;
                    }
                    R3::Sub | R3::And | R3::Or | R3::Xor | R3::Addw | R3::Subw
                        if pop(a) && pop(b) =>
                    {
                        match op {
                            R3::Sub => rvc!(self; c.sub X(a), X(b)),
                            R3::And => rvc!(self; c.and X(a), X(b)),
                            R3::Or => rvc!(self; c.or X(a), X(b)),
                            R3::Xor => rvc!(self; c.xor X(a), X(b)),
                            R3::Addw => rvc!(self; c.addw X(a), X(b)),
                            _ => rvc!(self; c.subw X(a), X(b)),
                        }
                        return;
                    }
                    _ => {}
                }
            }
        }
        match op {
            R3::Add => rv!(self.asm; add X(rd), X(rs1), X(rs2)),
            R3::Sub => rv!(self.asm; sub X(rd), X(rs1), X(rs2)),
            R3::And => rv!(self.asm; and X(rd), X(rs1), X(rs2)),
            R3::Or => rv!(self.asm; or X(rd), X(rs1), X(rs2)),
            R3::Xor => rv!(self.asm; xor X(rd), X(rs1), X(rs2)),
            R3::Addw => rv!(self.asm; addw X(rd), X(rs1), X(rs2)),
            R3::Subw => rv!(self.asm; subw X(rd), X(rs1), X(rs2)),
            R3::Mul => rv!(self.asm; mul X(rd), X(rs1), X(rs2)),
            R3::Mulw => rv!(self.asm; mulw X(rd), X(rs1), X(rs2)),
            R3::Div => rv!(self.asm; div X(rd), X(rs1), X(rs2)),
            R3::Divu => rv!(self.asm; divu X(rd), X(rs1), X(rs2)),
            R3::Divw => rv!(self.asm; divw X(rd), X(rs1), X(rs2)),
            R3::Divuw => rv!(self.asm; divuw X(rd), X(rs1), X(rs2)),
            R3::Rem => rv!(self.asm; rem X(rd), X(rs1), X(rs2)),
            R3::Remu => rv!(self.asm; remu X(rd), X(rs1), X(rs2)),
            R3::Remw => rv!(self.asm; remw X(rd), X(rs1), X(rs2)),
            R3::Remuw => rv!(self.asm; remuw X(rd), X(rs1), X(rs2)),
            R3::Sll => rv!(self.asm; sll X(rd), X(rs1), X(rs2)),
            R3::Srl => rv!(self.asm; srl X(rd), X(rs1), X(rs2)),
            R3::Sra => rv!(self.asm; sra X(rd), X(rs1), X(rs2)),
            R3::Sllw => rv!(self.asm; sllw X(rd), X(rs1), X(rs2)),
            R3::Srlw => rv!(self.asm; srlw X(rd), X(rs1), X(rs2)),
            R3::Sraw => rv!(self.asm; sraw X(rd), X(rs1), X(rs2)),
            R3::Sltu => rv!(self.asm; sltu X(rd), X(rs1), X(rs2)),
        }
    }

    /// Register-immediate form. Callers guarantee the immediate's range (12-bit signed, or
    /// the shift amount's width); dynasm would panic otherwise.
    pub fn ri(&mut self, op: RI, rd: u8, rs: u8, imm: i32) {
        if self.c && rd != ZERO {
            let imm6 = (-32..32).contains(&imm);
            let done = match op {
                RI::Addi if rs == ZERO && imm6 => {
                    rvc!(self; c.li X(rd), imm);
                    true
                }
                RI::Addi if rs == rd && imm6 && imm != 0 => {
                    rvc!(self; c.addi X(rd), imm);
                    true
                }
                RI::Addi
                    if rs == SP
                        && rd == SP
                        && imm != 0
                        && imm % 16 == 0
                        && (-512..512).contains(&imm) =>
                {
                    rvc!(self; c.addi16sp sp, imm);
                    true
                }
                RI::Addi if rs == SP && pop(rd) && imm > 0 && imm % 4 == 0 && imm < 1024 => {
                    rvc!(self; c.addi4spn X(rd), sp, imm as u32);
                    true
                }
                RI::Addi if imm == 0 && rs != ZERO => {
                    rvc!(self; c.mv X(rd), X(rs));
                    true
                }
                RI::Addiw if rs == rd && imm6 => {
                    rvc!(self; c.addiw X(rd), imm);
                    true
                }
                RI::Andi if rs == rd && pop(rd) && imm6 => {
                    rvc!(self; c.andi X(rd), imm);
                    true
                }
                RI::Slli if rs == rd && imm != 0 => {
                    rvc!(self; c.slli X(rd), imm as u32);
                    true
                }
                RI::Srli if rs == rd && pop(rd) && imm != 0 => {
                    rvc!(self; c.srli X(rd), imm as u32);
                    true
                }
                RI::Srai if rs == rd && pop(rd) && imm != 0 => {
                    rvc!(self; c.srai X(rd), imm as u32);
                    true
                }
                _ => false,
            };
            if done {
                return;
            }
        }
        match op {
            RI::Addi => rv!(self.asm; addi X(rd), X(rs), imm),
            RI::Addiw => rv!(self.asm; addiw X(rd), X(rs), imm),
            RI::Andi => rv!(self.asm; andi X(rd), X(rs), imm),
            RI::Ori => rv!(self.asm; ori X(rd), X(rs), imm),
            RI::Xori => rv!(self.asm; xori X(rd), X(rs), imm),
            RI::Slli => rv!(self.asm; slli X(rd), X(rs), imm as u32),
            RI::Srli => rv!(self.asm; srli X(rd), X(rs), imm as u32),
            RI::Srai => rv!(self.asm; srai X(rd), X(rs), imm as u32),
            RI::Slliw => rv!(self.asm; slliw X(rd), X(rs), imm as u32),
            RI::Srliw => rv!(self.asm; srliw X(rd), X(rs), imm as u32),
            RI::Sraiw => rv!(self.asm; sraiw X(rd), X(rs), imm as u32),
            RI::Sltiu => rv!(self.asm; sltiu X(rd), X(rs), imm),
        }
    }

    pub fn seqz(&mut self, rd: u8, rs: u8) {
        rv!(self.asm; seqz X(rd), X(rs));
    }

    /// `rd = -rs`; the W32 form (`negw`) sign-extends the 32-bit result.
    pub fn neg(&mut self, width: Width, rd: u8, rs: u8) {
        if width == Width::W32 {
            rv!(self.asm; negw X(rd), X(rs));
        } else {
            rv!(self.asm; neg X(rd), X(rs));
        }
    }

    // ---- memory ----------------------------------------------------------------------------

    /// `rd = *(base + off)`, `off` a 12-bit signed immediate.
    pub fn load(&mut self, m: Mem, rd: u8, base: u8, off: i32) {
        if self.c && rd != ZERO {
            match m {
                Mem::D if base == SP && (0..512).contains(&off) && off % 8 == 0 => {
                    rvc!(self; c.ldsp X(rd), [sp, off as u32]);
                    return;
                }
                Mem::D if pop(rd) && pop(base) && (0..256).contains(&off) && off % 8 == 0 => {
                    rvc!(self; c.ld X(rd), [X(base), off as u32]);
                    return;
                }
                Mem::W if pop(rd) && pop(base) && (0..128).contains(&off) && off % 4 == 0 => {
                    rvc!(self; c.lw X(rd), [X(base), off as u32]);
                    return;
                }
                _ => {}
            }
        }
        match m {
            Mem::B => rv!(self.asm; lb X(rd), [X(base), off]),
            Mem::Bu => rv!(self.asm; lbu X(rd), [X(base), off]),
            Mem::H => rv!(self.asm; lh X(rd), [X(base), off]),
            Mem::Hu => rv!(self.asm; lhu X(rd), [X(base), off]),
            Mem::W => rv!(self.asm; lw X(rd), [X(base), off]),
            Mem::Wu => rv!(self.asm; lwu X(rd), [X(base), off]),
            Mem::D => rv!(self.asm; ld X(rd), [X(base), off]),
        }
    }

    /// `*(base + off) = rs` (width from `m`; signedness ignored).
    pub fn store(&mut self, m: Mem, rs: u8, base: u8, off: i32) {
        if self.c {
            match m {
                Mem::D if base == SP && (0..512).contains(&off) && off % 8 == 0 => {
                    rvc!(self; c.sdsp X(rs), [sp, off as u32]);
                    return;
                }
                Mem::D if pop(rs) && pop(base) && (0..256).contains(&off) && off % 8 == 0 => {
                    rvc!(self; c.sd X(rs), [X(base), off as u32]);
                    return;
                }
                Mem::W | Mem::Wu
                    if pop(rs) && pop(base) && (0..128).contains(&off) && off % 4 == 0 =>
                {
                    rvc!(self; c.sw X(rs), [X(base), off as u32]);
                    return;
                }
                _ => {}
            }
        }
        match m {
            Mem::B | Mem::Bu => rv!(self.asm; sb X(rs), [X(base), off]),
            Mem::H | Mem::Hu => rv!(self.asm; sh X(rs), [X(base), off]),
            Mem::W | Mem::Wu => rv!(self.asm; sw X(rs), [X(base), off]),
            Mem::D => rv!(self.asm; sd X(rs), [X(base), off]),
        }
    }

    // ---- control flow ------------------------------------------------------------------------

    /// `jalr ra, rs, 0`: call through a register.
    pub fn call_reg(&mut self, rs: u8) {
        if self.c {
            rvc!(self; c.jalr X(rs));
        } else {
            rv!(self.asm; jalr X(rs));
        }
    }

    /// `jalr zero, rs, 0`.
    pub fn jump_reg(&mut self, rs: u8) {
        if self.c {
            rvc!(self; c.jr X(rs));
        } else {
            rv!(self.asm; jalr zero, X(rs), 0);
        }
    }

    /// Conditional branch to a label (±4 KiB, the full B-type reach: see [`Patch`]).
    pub fn b_label(&mut self, k: Br, a: u8, b: u8, l: DynamicLabel) {
        let at = self.pos();
        self.b_off(k, a, b, 0);
        self.patches.push(Patch {
            at,
            target: l,
            kind: PatchKind::B,
        });
    }

    /// Conditional branch by a fixed byte offset (always the 4-byte encoding, so sequences
    /// with hand-computed offsets stay exact).
    pub fn b_off(&mut self, k: Br, a: u8, b: u8, off: i32) {
        match k {
            Br::Eq => rv!(self.asm; beq X(a), X(b), off),
            Br::Ne => rv!(self.asm; bne X(a), X(b), off),
            Br::Lt => rv!(self.asm; blt X(a), X(b), off),
            Br::Ge => rv!(self.asm; bge X(a), X(b), off),
            Br::Ltu => rv!(self.asm; bltu X(a), X(b), off),
            Br::Geu => rv!(self.asm; bgeu X(a), X(b), off),
        }
    }

    /// `c.beqz`/`c.bnez` to a label (±256 B; `a` in x8–x15).
    pub fn cb_label(&mut self, eq: bool, a: u8, l: DynamicLabel) {
        if eq {
            rvc!(self; c.beqz X(a), =>l);
        } else {
            rvc!(self; c.bnez X(a), =>l);
        }
    }

    /// `c.j` (±2 KiB).
    pub fn cj_label(&mut self, l: DynamicLabel) {
        rvc!(self; c.j =>l);
    }

    /// `jal rd, label` (±1 MiB, the full J-type reach: see [`Patch`]).
    pub fn jal_label(&mut self, rd: u8, l: DynamicLabel) {
        let at = self.pos();
        self.asm.push_u32(JAL | u32::from(rd) << 7);
        self.patches.push(Patch {
            at,
            target: l,
            kind: PatchKind::J,
        });
    }

    /// The finished code: dynasmrt's relocations applied, then the displacement of every
    /// B- and J-type branch to a label written in. Branch relaxation has sized every
    /// branch for its distance, so one out of reach here is an internal error.
    pub fn finish(self) -> Result<Reused<u8>, String> {
        let mut targets = reuse::take(self.patches.len());
        for p in &self.patches {
            let t = self
                .asm
                .labels()
                .resolve_dynamic(p.target)
                .map_err(|e| format!("unbound label: {e}"))?;
            targets.push(t.0);
        }
        let mut code =
            reuse::assembled(self.asm).map_err(|e| format!("cannot encode the program: {e}"))?;
        for (p, &target) in self.patches.iter().zip(targets.iter()) {
            let disp = target as i64 - p.at as i64;
            let imm = match p.kind {
                PatchKind::B => b_type_imm(disp),
                PatchKind::J => j_type_imm(disp),
            }
            .ok_or_else(|| {
                format!(
                    "internal: {:?} branch at {} cannot reach {disp} bytes",
                    p.kind, p.at
                )
            })?;
            let word = &mut code[p.at..p.at + 4];
            let old = u32::from_le_bytes(word.try_into().expect("4 bytes"));
            word.copy_from_slice(&(old | imm).to_le_bytes());
        }
        Ok(code)
    }

    /// `auipc rd, hi; addi rd, rd, lo`: the address of label `l` (±2 GiB).
    pub fn la(&mut self, rd: u8, l: DynamicLabel) {
        rv!(self.asm; la X(rd), =>l);
    }

    /// 8-byte aligned data at label `l`, after code that never falls into it (the zero
    /// padding parcels are illegal instructions); recorded in [`Assembler::data`].
    pub fn data_u64s(&mut self, l: DynamicLabel, words: &[u64]) {
        let start = self.pos();
        self.asm.align(8, 0);
        self.bind(l);
        for &w in words {
            self.asm.push_u64(w);
        }
        self.data.push(start..self.pos());
    }

    /// `auipc tmp, hi; jalr zero, tmp, lo` (±2 GiB).
    pub fn far_jump(&mut self, tmp: u8, l: DynamicLabel) {
        rv!(self.asm; jump =>l, X(tmp));
    }

    /// `auipc rd, hi; jalr rd, rd, lo` (±2 GiB), the return address in `rd`.
    pub fn far_call(&mut self, rd: u8, l: DynamicLabel) {
        rv!(self.asm; call X(rd), =>l);
    }

    /// Zeroes `[start, end)` 32 bytes per iteration (`end - start` a non-zero multiple of 32;
    /// both 8-byte aligned); `tmp` walks the range.
    pub fn zero_fill(&mut self, start: u8, end: u8, tmp: u8) {
        rv!(self.asm
            ; mv X(tmp), X(start)
            ; fill:
            ; sd zero, [X(tmp), 0]
            ; sd zero, [X(tmp), 8]
            ; sd zero, [X(tmp), 16]
            ; sd zero, [X(tmp), 24]
            ; addi X(tmp), X(tmp), 32
            ; bltu X(tmp), X(end), <fill
        );
    }

    pub fn ret(&mut self) {
        if self.c {
            rvc!(self; c.jr ra);
        } else {
            rv!(self.asm; ret);
        }
    }

    /// `mulhu rd, rs1, rs2`: the high 64 bits of the unsigned 128-bit product (M).
    pub fn mulhu(&mut self, rd: u8, rs1: u8, rs2: u8) {
        rv!(self.asm; mulhu X(rd), X(rs1), X(rs2));
    }

    /// `rdtime rd` (`csrrs rd, time, x0`, Zicntr): the platform's constant-rate timer.
    pub fn rdtime(&mut self, rd: u8) {
        // csr 0xc01 (time), rs1 = x0, funct3 = 2 (csrrs), opcode SYSTEM.
        self.asm.push_u32(0xc010_2073 | (rd as u32) << 7);
    }

    // ---- atomics ---------------------------------------------------------------------------

    /// AMO without ordering (non-fetch BPF atomics are unordered, like the kernel's JIT).
    pub fn amo_relaxed(&mut self, op: Amo, width: Width, rd: u8, rs: u8, addr: u8) {
        use Amo::*;
        let dw = width == Width::W64;
        match (op, dw) {
            (Add, false) => rv!(self.asm; amoadd.w X(rd), X(rs), [X(addr)]),
            (Add, true) => rv!(self.asm; amoadd.d X(rd), X(rs), [X(addr)]),
            (And, false) => rv!(self.asm; amoand.w X(rd), X(rs), [X(addr)]),
            (And, true) => rv!(self.asm; amoand.d X(rd), X(rs), [X(addr)]),
            (Or, false) => rv!(self.asm; amoor.w X(rd), X(rs), [X(addr)]),
            (Or, true) => rv!(self.asm; amoor.d X(rd), X(rs), [X(addr)]),
            (Xor, false) => rv!(self.asm; amoxor.w X(rd), X(rs), [X(addr)]),
            (Xor, true) => rv!(self.asm; amoxor.d X(rd), X(rs), [X(addr)]),
            (Swap, false) => rv!(self.asm; amoswap.w X(rd), X(rs), [X(addr)]),
            (Swap, true) => rv!(self.asm; amoswap.d X(rd), X(rs), [X(addr)]),
        }
    }

    /// AMO with aq+rl: BPF's FETCH forms (and xchg) are fully ordered.
    pub fn amo_aqrl(&mut self, op: Amo, width: Width, rd: u8, rs: u8, addr: u8) {
        use Amo::*;
        let dw = width == Width::W64;
        match (op, dw) {
            (Add, false) => rv!(self.asm; amoadd.w.aqrl X(rd), X(rs), [X(addr)]),
            (Add, true) => rv!(self.asm; amoadd.d.aqrl X(rd), X(rs), [X(addr)]),
            (And, false) => rv!(self.asm; amoand.w.aqrl X(rd), X(rs), [X(addr)]),
            (And, true) => rv!(self.asm; amoand.d.aqrl X(rd), X(rs), [X(addr)]),
            (Or, false) => rv!(self.asm; amoor.w.aqrl X(rd), X(rs), [X(addr)]),
            (Or, true) => rv!(self.asm; amoor.d.aqrl X(rd), X(rs), [X(addr)]),
            (Xor, false) => rv!(self.asm; amoxor.w.aqrl X(rd), X(rs), [X(addr)]),
            (Xor, true) => rv!(self.asm; amoxor.d.aqrl X(rd), X(rs), [X(addr)]),
            (Swap, false) => rv!(self.asm; amoswap.w.aqrl X(rd), X(rs), [X(addr)]),
            (Swap, true) => rv!(self.asm; amoswap.d.aqrl X(rd), X(rs), [X(addr)]),
        }
    }

    /// The compare-and-swap loop:
    /// ```text
    ///   1: lr.{w,d}.aqrl t1, [addr]
    ///      bne  t1, expect, 2f
    ///      sc.{w,d}.rl t3, new, [addr]
    ///      bnez t3, 1b
    ///   2: fence rw, rw
    /// ```
    /// The old value is left in `t1` (sign-extended for W32). `sc.rl` plus the trailing fence
    /// make the operation fully ordered, as BPF requires of cmpxchg. The loop stays within a
    /// few bytes, so its branches are the plain B-type forms with local labels.
    pub fn cmpxchg_loop(&mut self, width: Width, addr: u8, expect: u8, new: u8) {
        match width {
            Width::W64 => rv!(self.asm
                ; retry:
                ; lr.d.aqrl X(T1), [X(addr)]
                ; bne X(T1), X(expect), >done
                ; sc.d.rl X(T3), X(new), [X(addr)]
                ; bne X(T3), zero, <retry
                ; done:
                ; fence rw, rw
            ),
            Width::W32 => rv!(self.asm
                ; retry:
                ; lr.w.aqrl X(T1), [X(addr)]
                ; bne X(T1), X(expect), >done
                ; sc.w.rl X(T3), X(new), [X(addr)]
                ; bne X(T3), zero, <retry
                ; done:
                ; fence rw, rw
            ),
        }
    }
}

/// [`count_insns`] over `code` without the byte ranges `data` (sorted, disjoint).
pub fn count_insns_except(code: &[u8], data: &[std::ops::Range<usize>]) -> usize {
    let mut n = 0;
    let mut at = 0;
    for r in data {
        n += count_insns(&code[at..r.start]);
        at = r.end;
    }
    n + count_insns(&code[at..])
}

/// Counts RISC-V instructions in an encoded stream: a parcel whose low two bits are `11`
/// starts a 32-bit instruction, anything else is a 16-bit compressed one.
pub fn count_insns(code: &[u8]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i + 1 < code.len() {
        i += if code[i] & 3 == 3 { 4 } else { 2 };
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn li_len_counts_what_li_emits() {
        let mut vals = vec![
            0i64,
            1,
            -1,
            2047,
            -2048,
            2048,
            0x7fff_ffff,
            -0x8000_0000,
            0x8000_0000,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vals.extend([x as i64, (x >> (x % 64)) as i64, (x as i64) >> (x % 64)]);
        }
        for v in vals {
            let mut e = Assembler::new(false, false, false, 64);
            e.li(T0, v);
            let code = e.finish().unwrap();
            assert_eq!(Assembler::li_len(v), count_insns(&code), "{v:#x}");
        }
    }

    /// The displacement back out of B-type immediate bits.
    fn b_disp(w: u32) -> i64 {
        let imm =
            (w >> 31 & 1) << 12 | (w >> 7 & 1) << 11 | (w >> 25 & 0x3f) << 5 | (w >> 8 & 0xf) << 1;
        ((imm << 19) as i32 >> 19) as i64
    }

    /// The displacement back out of J-type immediate bits.
    fn j_disp(w: u32) -> i64 {
        let imm = (w >> 31 & 1) << 20
            | (w >> 12 & 0xff) << 12
            | (w >> 20 & 1) << 11
            | (w >> 21 & 0x3ff) << 1;
        ((imm << 11) as i32 >> 11) as i64
    }

    #[test]
    fn immediates_round_trip_over_the_full_reach_and_stop_at_its_ends() {
        for d in [-4096, -4094, -2050, -2048, -2, 0, 2, 2046, 2048, 4094] {
            assert_eq!(b_disp(b_type_imm(d).unwrap()), d, "B {d}");
        }
        for d in [-4098, 4096, 3, -1] {
            assert_eq!(b_type_imm(d), None, "B {d}");
        }
        for d in [
            -(1 << 20),
            -(1 << 19) - 2,
            -2,
            0,
            2,
            (1 << 19) + 2,
            (1 << 20) - 2,
        ] {
            assert_eq!(j_disp(j_type_imm(d).unwrap()), d, "J {d}");
        }
        for d in [-(1 << 20) - 2, 1 << 20, 1] {
            assert_eq!(j_type_imm(d), None, "J {d}");
        }
    }

    /// Where dynasmrt can encode a label branch itself, `finish` writes the same word.
    #[test]
    fn patched_branches_match_dynasm_where_it_reaches() {
        for gap in [0usize, 8, 1000, 2032] {
            for forward in [true, false] {
                let ours = {
                    let mut e = Assembler::new(false, false, false, 0);
                    let l = e.new_label();
                    if !forward {
                        e.bind(l);
                        e.asm.extend(std::iter::repeat_n(0x13u8, gap));
                    }
                    e.b_label(Br::Ltu, 10, 11, l);
                    e.jal_label(1, l);
                    if forward {
                        e.asm.extend(std::iter::repeat_n(0x13u8, gap));
                        e.bind(l);
                    }
                    e.finish().unwrap()
                };
                let theirs = {
                    let mut asm = VecAssembler::<RiscvRelocation>::new(0);
                    let l = asm.new_dynamic_label();
                    if !forward {
                        asm.dynamic_label(l);
                        asm.extend(std::iter::repeat_n(0x13u8, gap));
                    }
                    dynasm!(asm; .arch riscv64 ; bltu x10, x11, =>l ; jal x1, =>l);
                    if forward {
                        asm.extend(std::iter::repeat_n(0x13u8, gap));
                        asm.dynamic_label(l);
                    }
                    asm.finalize().unwrap()
                };
                assert_eq!(ours, theirs, "gap {gap}, forward {forward}");
            }
        }
    }

    /// Beyond dynasmrt's reach (±2 KiB for B-type), up to the ISA's ±4 KiB.
    #[test]
    fn b_type_reaches_four_kib() {
        let mut e = Assembler::new(false, false, false, 0);
        let l = e.new_label();
        e.b_label(Br::Eq, 5, 6, l);
        e.asm.extend(std::iter::repeat_n(0x13u8, 4090));
        e.bind(l);
        let code = e.finish().unwrap();
        let w = u32::from_le_bytes(code[..4].try_into().unwrap());
        assert_eq!(b_disp(w), 4094);
        assert_eq!(
            w & 0x01ff_f07f,
            5 << 15 | 6 << 20 | 0x63,
            "opcode and registers kept"
        );
    }
}
