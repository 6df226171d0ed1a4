//! eBPF → AArch64 code generation.
//!
//! Layout of the emitted code: the subprograms in bytecode order, each as
//! `prologue, body, epilogue`; then (only when the program uses `callx`) one shared stub that
//! leaves the program with r0 = `u64::MAX`. The entry subprogram starts at offset 0. Every
//! branch is PC-relative and helpers are reached through absolute addresses in a scratch
//! register, so the bytes run at any address.
//!
//! ## Register map (like the kernel's arm64 JIT)
//!
//! | BPF | arm64 | why |
//! |-----|-------|-----|
//! | r0  | x7    | caller-saved, not an argument register: helper calls need no shuffling |
//! | r1–r5 | x0–x4 | the AAPCS64 argument registers: helpers and bpf-to-bpf calls get their arguments in place; the entry's `(ctx, len)` arrive as r1, r2 |
//! | r6–r9 | x19–x22 | callee-saved: they survive helper calls for free; saved only when written |
//! | r10 | — | never in a register: the frame is `[sp, sp+512)` so r10 = sp + 512 and stack accesses are `sp`-relative |
//! | scratch | x9–x13 | caller-saved temporaries, never live across eBPF instructions |
//! | x26 | | the entry frame's sp, kept only when `callx` sits inside a subprogram (to unwind all frames on an unknown id) |
//!
//! Division needs no guard: AArch64 `UDIV`/`SDIV` already return 0 for a zero divisor and
//! `SDIV` returns MIN for MIN / -1 (it never traps), and `MSUB` then yields `x % 0 = x` and
//! `MIN % -1 = 0` — exactly RFC 9669. Register shifts (`LSLV`...) take the count modulo the
//! width, which is eBPF's masking; 32-bit (`W`) results are zero-extended by the hardware.

// dynasm expands every dynamic register `X(r)` to `r.into()`; with `u8` registers that is an
// identity conversion clippy would flag at each of the ~200 sites.
#![allow(clippy::useless_conversion)]

use dynasmrt::aarch64::{
    encode_logical_immediate_32bit, encode_logical_immediate_64bit, Aarch64Relocation,
};
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use packjit_frontend::{
    AluOp, AtomicOp, Cond, EndKind, Inst, Op, Operand, Program, Reg, Size, Width, R10, STACK_SIZE,
};
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};

use crate::{FEATURE_LSE, SUPPORTED_FEATURES};

type Asm = VecAssembler<Aarch64Relocation>;

/// BPF register → arm64 register number (r10 has no register; see the module docs).
const REG_MAP: [u8; 10] = [7, 0, 1, 2, 3, 4, 19, 20, 21, 22];
/// Scratch registers (caller-saved, never live across eBPF instructions).
const T0: u8 = 9;
const T1: u8 = 10;
const T2: u8 = 11;
const T3: u8 = 12;
const T4: u8 = 13;
/// The zero register in the X/W families (and `sp` in the XSP family).
const ZR: u8 = 31;
/// Holds the entry frame's stack pointer for the `callx` unwind (callee-saved).
const ABORT_SP: u8 = 26;
/// Where the native return value arrives.
const RET: u8 = 0;

/// B.cond / CBZ / CBNZ: signed 19-bit word offset, ±1 MiB.
const COND_RANGE: i64 = 1 << 20;
/// TBZ / TBNZ: signed 14-bit word offset, ±32 KiB.
const TEST_RANGE: i64 = 1 << 15;
/// B / BL: signed 26-bit word offset, ±128 MiB.
const JUMP_RANGE: i64 = 1 << 27;

/// Result of [`emit_program`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// Machine code; offset 0 is the entry.
    pub bytes: Vec<u8>,
    /// Number of arm64 instructions (`bytes.len() / 4`).
    pub native_insns: usize,
    /// Byte offset of each eBPF instruction's code (indexed like `Program::insts`).
    pub inst_offsets: Vec<usize>,
    /// Emission passes needed to settle branch forms (1 unless some branch was out of range).
    pub passes: usize,
}

/// Verifies `code` against `helpers` and emits arm64 code using the optional `features`.
pub fn emit_program(
    code: &[u8],
    helpers: &[HelperEntry],
    features: u64,
) -> Result<Emitted, CompileError> {
    if features & !SUPPORTED_FEATURES != 0 {
        return Err(CompileError::new(
            ErrorKind::Unsupported,
            format!(
                "unknown arm64 feature bits 0x{:x} (supported: 0x{SUPPORTED_FEATURES:x})",
                features & !SUPPORTED_FEATURES
            ),
        ));
    }
    let prog = packjit_frontend::decode(code, helpers)?;
    emit_decoded(&prog, helpers, features)
}

/// Emits an already decoded program (see [`emit_program`]).
pub fn emit_decoded(
    prog: &Program,
    helpers: &[HelperEntry],
    features: u64,
) -> Result<Emitted, CompileError> {
    let frames = plan_frames(prog);
    // Conditional branches start in their short form; any found out of range after a pass is
    // switched to the long form (inverted condition around a B) and the code is emitted
    // again. The set only grows, so this settles; in practice one pass suffices.
    let mut long = vec![false; prog.insts.len()];
    let mut passes = 0;
    loop {
        passes += 1;
        let mut e = Emitter::new(
            prog,
            helpers,
            features & FEATURE_LSE != 0,
            &frames,
            long.clone(),
        );
        e.program()?;
        let (grew, offsets) = e.check_ranges(&mut long, passes)?;
        if !grew {
            let bytes = e.ops.finalize().map_err(|err| {
                CompileError::new(
                    ErrorKind::Encoding,
                    format!("arm64 relocation failed: {err}"),
                )
            })?;
            let native_insns = bytes.len() / 4;
            return Ok(Emitted {
                bytes,
                native_insns,
                inst_offsets: offsets,
                passes,
            });
        }
    }
}

/// What a subprogram's prologue saves and reserves.
#[derive(Clone, Debug)]
struct Frame {
    /// Push the frame record (x29, x30): the subprogram makes calls.
    save_lr: bool,
    /// Callee-saved registers to preserve, in push order.
    saved: Vec<u8>,
    /// Reserve the 512-byte BPF stack.
    stack: bool,
    /// Set x26 = sp after the pushes (entry subprogram, callx inside a subprogram).
    abort_anchor: bool,
}

fn reads_r10(op: &Op) -> bool {
    let reg = |o: Operand| o == Operand::Reg(R10);
    match *op {
        Op::Alu { src, .. } => reg(src),
        Op::MovSx { src, .. } => src == R10,
        Op::Load { base, .. } => base == R10,
        Op::Store { base, src, .. } => base == R10 || reg(src),
        Op::Atomic { base, src, .. } => base == R10 || src == R10,
        Op::Jcond { dst, src, .. } => dst == R10 || reg(src),
        Op::CallReg { reg } => reg == R10,
        _ => false,
    }
}

fn plan_frames(prog: &Program) -> Vec<Frame> {
    let callx_in_sub = prog.subprogs.iter().skip(1).any(|sp| {
        prog.insts[sp.start..sp.end]
            .iter()
            .any(|i| matches!(i.op, Op::CallReg { .. }))
    });
    let all_writes = prog.subprogs.iter().fold(0u16, |acc, sp| acc | sp.writes);
    prog.subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            let insts = &prog.insts[sp.start..sp.end];
            let calls = insts.iter().any(|i| {
                matches!(
                    i.op,
                    Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. }
                )
            });
            let stack = insts.iter().any(|i| reads_r10(&i.op));
            let mut writes = insts
                .iter()
                .filter_map(|i| i.op.written_reg())
                .fold(0u16, |a, r| a | 1 << r);
            writes |= sp.writes;
            let abort_anchor = k == 0 && callx_in_sub;
            if abort_anchor {
                // An unknown callx id unwinds straight from a nested frame to the entry's
                // epilogue, skipping the callees' restores: the entry must then preserve
                // every callee-saved register any subprogram touches.
                writes |= all_writes;
            }
            let mut saved: Vec<u8> = (6..=9)
                .filter(|r| writes & (1 << r) != 0)
                .map(|r| REG_MAP[r])
                .collect();
            if abort_anchor {
                saved.push(ABORT_SP);
            }
            Frame {
                save_lr: calls,
                saved,
                stack,
                abort_anchor,
            }
        })
        .collect()
}

/// Kinds of PC-relative branch recorded for the range check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// B.cond, CBZ, CBNZ.
    Cond,
    /// TBZ, TBNZ.
    Test,
    /// B, BL.
    Jump,
}

impl Reach {
    fn range(self) -> i64 {
        match self {
            Reach::Cond => COND_RANGE,
            Reach::Test => TEST_RANGE,
            Reach::Jump => JUMP_RANGE,
        }
    }
}

/// A branch to a far label, checked after each pass.
#[derive(Clone, Copy, Debug)]
struct Site {
    /// eBPF instruction index the branch belongs to.
    inst: usize,
    /// Byte offset of the branch instruction.
    at: usize,
    target: DynamicLabel,
    reach: Reach,
}

/// AArch64 condition codes (only those eBPF needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cc {
    Eq,
    Ne,
    Hs,
    Lo,
    Hi,
    Ls,
    Ge,
    Lt,
    Gt,
    Le,
}

impl Cc {
    fn from_bpf(c: Cond) -> Cc {
        match c {
            Cond::Eq => Cc::Eq,
            Cond::Ne | Cond::Set => Cc::Ne,
            Cond::Gt => Cc::Hi,
            Cond::Ge => Cc::Hs,
            Cond::Lt => Cc::Lo,
            Cond::Le => Cc::Ls,
            Cond::Sgt => Cc::Gt,
            Cond::Sge => Cc::Ge,
            Cond::Slt => Cc::Lt,
            Cond::Sle => Cc::Le,
        }
    }

    fn invert(self) -> Cc {
        match self {
            Cc::Eq => Cc::Ne,
            Cc::Ne => Cc::Eq,
            Cc::Hs => Cc::Lo,
            Cc::Lo => Cc::Hs,
            Cc::Hi => Cc::Ls,
            Cc::Ls => Cc::Hi,
            Cc::Ge => Cc::Lt,
            Cc::Lt => Cc::Ge,
            Cc::Gt => Cc::Le,
            Cc::Le => Cc::Gt,
        }
    }
}

/// How a conditional jump tests its operands.
#[derive(Clone, Copy, Debug)]
enum Test {
    /// Flags were set by CMP/CMN/TST; branch on the condition.
    Flags(Cc),
    /// CBZ (`zero`) or CBNZ on the register.
    Zero { reg: u8, w64: bool, zero: bool },
    /// TBZ (`set == false`) or TBNZ on one bit.
    Bit { reg: u8, bit: u32, set: bool },
}

struct Emitter<'a> {
    prog: &'a Program,
    helpers: &'a [HelperEntry],
    lse: bool,
    frames: &'a [Frame],
    long: Vec<bool>,
    ops: Asm,
    /// Start of each instruction's code (after the prologue for subprogram starts).
    labels: Vec<DynamicLabel>,
    /// Call entry of each subprogram (before its prologue).
    entries: Vec<DynamicLabel>,
    /// Epilogue of each subprogram.
    epilogues: Vec<DynamicLabel>,
    /// Entry epilogue past the stack release: where the callx abort lands.
    restore: DynamicLabel,
    abort: Option<DynamicLabel>,
    sites: Vec<Site>,
    cur: usize,
}

macro_rules! a64 {
    ($ops:expr; $($t:tt)*) => {
        dynasm!($ops ; .arch aarch64 ; $($t)*)
    };
}

fn w64(width: Width) -> bool {
    width == Width::W64
}

fn fits_imm12(v: i64) -> Option<(u32, bool)> {
    // ADD/SUB/CMP immediates: 12 bits, optionally shifted left by 12.
    if (0..4096).contains(&v) {
        Some((v as u32, false))
    } else if v & 0xfff == 0 && (0..4096).contains(&(v >> 12)) {
        Some(((v >> 12) as u32, true))
    } else {
        None
    }
}

fn logical_ok(v: u64, w64: bool) -> bool {
    if w64 {
        encode_logical_immediate_64bit(v).is_some()
    } else {
        encode_logical_immediate_32bit(v as u32).is_some()
    }
}

impl<'a> Emitter<'a> {
    fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        lse: bool,
        frames: &'a [Frame],
        long: Vec<bool>,
    ) -> Self {
        let mut ops = Asm::new(0);
        let labels = (0..prog.insts.len())
            .map(|_| ops.new_dynamic_label())
            .collect();
        let entries = (0..prog.subprogs.len())
            .map(|_| ops.new_dynamic_label())
            .collect();
        let epilogues = (0..prog.subprogs.len())
            .map(|_| ops.new_dynamic_label())
            .collect();
        let restore = ops.new_dynamic_label();
        let abort = prog
            .insts
            .iter()
            .any(|i| matches!(i.op, Op::CallReg { .. }))
            .then(|| ops.new_dynamic_label());
        Emitter {
            prog,
            helpers,
            lse,
            frames,
            long,
            ops,
            labels,
            entries,
            epilogues,
            restore,
            abort,
            sites: Vec::new(),
            cur: 0,
        }
    }

    fn off(&self) -> usize {
        self.ops.offset().0
    }

    fn err(&self, kind: ErrorKind, msg: impl Into<String>) -> CompileError {
        CompileError::at(self.prog.insts[self.cur].pc, kind, msg)
    }

    /// After a pass: switches out-of-range conditional branches to the long form (returns
    /// `true` when that changed anything); refuses unconditional ones out of ±128 MiB.
    fn check_ranges(
        &self,
        long: &mut [bool],
        pass: usize,
    ) -> Result<(bool, Vec<usize>), CompileError> {
        let labels = self.ops.labels();
        let at = |l: DynamicLabel| -> Result<i64, CompileError> {
            labels.resolve_dynamic(l).map(|o| o.0 as i64).map_err(|e| {
                CompileError::new(ErrorKind::Internal, format!("unresolved arm64 label: {e}"))
            })
        };
        let mut grew = false;
        for s in &self.sites {
            let dist = at(s.target)? - s.at as i64;
            let range = s.reach.range();
            // After a few passes, convert with a safety margin so a cascade of growth
            // cannot keep the loop going.
            let range = if pass >= 4 { range / 2 } else { range };
            if (-range..range).contains(&dist) {
                continue;
            }
            match s.reach {
                Reach::Jump => {
                    return Err(CompileError::at(
                        self.prog.insts[s.inst].pc,
                        ErrorKind::Encoding,
                        format!(
                            "branch spans {dist} bytes of arm64 code, beyond the ±128 MiB reach of B/BL"
                        ),
                    ))
                }
                Reach::Cond | Reach::Test => {
                    if !long[s.inst] {
                        long[s.inst] = true;
                        grew = true;
                    }
                }
            }
        }
        let offsets = self
            .labels
            .iter()
            .map(|&l| at(l).map(|o| o as usize))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((grew, offsets))
    }

    // ---------------------------------------------------------------- program structure

    fn program(&mut self) -> Result<(), CompileError> {
        for k in 0..self.prog.subprogs.len() {
            let sp = self.prog.subprogs[k].clone();
            let entry = self.entries[k];
            a64!(self.ops; =>entry);
            self.cur = sp.start;
            self.prologue(k);
            for i in sp.start..sp.end {
                self.cur = i;
                let label = self.labels[i];
                a64!(self.ops; =>label);
                let inst = self.prog.insts[i];
                self.inst(k, i, &inst)?;
            }
            self.epilogue(k);
        }
        if let Some(abort) = self.abort {
            // callx with an unregistered id: r0 = u64::MAX, leave the whole program.
            let restore = self.restore;
            a64!(self.ops; =>abort ; movn X(REG_MAP[0]), 0);
            if self.frames[0].abort_anchor {
                // Possibly nested: drop every frame above the entry's saved registers.
                a64!(self.ops; mov sp, XSP(ABORT_SP) ; b =>restore);
            } else {
                // callx only in the entry: its own epilogue releases the stack.
                let epi = self.epilogues[0];
                a64!(self.ops; b =>epi);
            }
        }
        Ok(())
    }

    fn prologue(&mut self, k: usize) {
        let f = &self.frames[k];
        if f.save_lr {
            // Frame record first so unwinders and debuggers can walk JIT frames.
            a64!(self.ops; stp x29, x30, [sp, -16]! ; mov x29, sp);
        }
        for pair in f.saved.chunks(2) {
            match *pair {
                [a, b] => a64!(self.ops; stp X(a), X(b), [sp, -16]!),
                // sp must stay 16-byte aligned: a lone register still takes 16 bytes.
                [a] => a64!(self.ops; str X(a), [sp, -16]!),
                _ => unreachable!(),
            }
        }
        if f.abort_anchor {
            a64!(self.ops; mov XSP(ABORT_SP), sp);
        }
        if f.stack {
            a64!(self.ops; sub sp, sp, STACK_SIZE as u32);
        }
    }

    fn epilogue(&mut self, k: usize) {
        let f = self.frames[k].clone();
        let epi = self.epilogues[k];
        a64!(self.ops; =>epi);
        if f.stack {
            a64!(self.ops; add sp, sp, STACK_SIZE as u32);
        }
        if k == 0 {
            let restore = self.restore;
            // Only the entry returns to native code: r0 goes to x0. Subprograms return r0
            // in x7 where their caller expects it.
            a64!(self.ops; =>restore ; mov X(RET), X(REG_MAP[0]));
        }
        for pair in f.saved.chunks(2).rev() {
            match *pair {
                [a, b] => a64!(self.ops; ldp X(a), X(b), [sp], 16),
                [a] => a64!(self.ops; ldr X(a), [sp], 16),
                _ => unreachable!(),
            }
        }
        if f.save_lr {
            a64!(self.ops; ldp x29, x30, [sp], 16);
        }
        a64!(self.ops; ret);
    }

    // ---------------------------------------------------------------- helpers

    /// The arm64 register holding BPF register `r`'s value; r10 is materialised in `tmp`.
    fn src(&mut self, r: Reg, tmp: u8) -> u8 {
        if r == R10 {
            a64!(self.ops; add XSP(tmp), sp, STACK_SIZE as u32);
            tmp
        } else {
            REG_MAP[r as usize]
        }
    }

    /// `rd = value` in the fewest instructions: one ORR for a bitmask immediate, else MOVZ
    /// or MOVN (whichever leaves fewer halfwords to patch) plus one MOVK per remaining
    /// halfword. 32-bit forms write W, which zero-extends.
    fn mov_imm(&mut self, rd: u8, value: u64, w64: bool) {
        let n = if w64 { 4 } else { 2 };
        let value = if w64 { value } else { value & 0xffff_ffff };
        let hw = |i: u32| ((value >> (16 * i)) & 0xffff) as u32;
        let zeros = (0..n).filter(|&i| hw(i) == 0).count();
        let ones = (0..n).filter(|&i| hw(i) == 0xffff).count();
        let need_movz = (n as usize - zeros).max(1);
        let need_movn = (n as usize - ones).max(1);
        if need_movz.min(need_movn) > 1 && logical_ok(value, w64) {
            if w64 {
                a64!(self.ops; orr XSP(rd), xzr, value);
            } else {
                a64!(self.ops; orr WSP(rd), wzr, value as u32);
            }
            return;
        }
        let inverted = need_movn < need_movz;
        let skip = if inverted { 0xffff } else { 0 };
        let mut first = true;
        for i in 0..n {
            let h = hw(i);
            let sh = 16 * i;
            if first {
                // The first instruction sets every halfword: pick the lowest one that
                // differs from the fill pattern (or halfword 0 if none does).
                if h == skip && i != n - 1 && (i + 1..n).any(|j| hw(j) != skip) {
                    continue;
                }
                first = false;
                match (inverted, w64) {
                    (false, true) => a64!(self.ops; movz X(rd), h, lsl sh),
                    (false, false) => a64!(self.ops; movz W(rd), h, lsl sh),
                    (true, true) => a64!(self.ops; movn X(rd), !h & 0xffff, lsl sh),
                    (true, false) => a64!(self.ops; movn W(rd), !h & 0xffff, lsl sh),
                }
            } else if h != skip {
                if w64 {
                    a64!(self.ops; movk X(rd), h, lsl sh);
                } else {
                    a64!(self.ops; movk W(rd), h, lsl sh);
                }
            }
        }
    }

    /// 32-bit zero-extension of `rd` in place (what a W-register write would have done).
    fn zext32(&mut self, rd: u8) {
        a64!(self.ops; mov W(rd), W(rd));
    }

    fn mov_reg(&mut self, rd: u8, rs: u8, w64: bool) {
        if w64 {
            if rd != rs {
                a64!(self.ops; mov X(rd), X(rs));
            }
        } else {
            a64!(self.ops; mov W(rd), W(rs));
        }
    }

    /// `rd = rn + v` (v already reduced to the operation's width semantics).
    fn add_imm(&mut self, rd: u8, rn: u8, v: i64, w64: bool) {
        if v == 0 {
            self.mov_reg(rd, rn, w64);
        } else if let Some((imm, sh)) = fits_imm12(v) {
            match (w64, sh) {
                (true, false) => a64!(self.ops; add XSP(rd), XSP(rn), imm),
                (true, true) => a64!(self.ops; add XSP(rd), XSP(rn), imm, lsl 12),
                (false, false) => a64!(self.ops; add WSP(rd), WSP(rn), imm),
                (false, true) => a64!(self.ops; add WSP(rd), WSP(rn), imm, lsl 12),
            }
        } else if let Some((imm, sh)) = fits_imm12(v.wrapping_neg()) {
            match (w64, sh) {
                (true, false) => a64!(self.ops; sub XSP(rd), XSP(rn), imm),
                (true, true) => a64!(self.ops; sub XSP(rd), XSP(rn), imm, lsl 12),
                (false, false) => a64!(self.ops; sub WSP(rd), WSP(rn), imm),
                (false, true) => a64!(self.ops; sub WSP(rd), WSP(rn), imm, lsl 12),
            }
        } else {
            self.mov_imm(T1, v as u64, w64);
            self.alu_rrr(AluOp::Add, w64, rd, rn, T1);
        }
    }

    /// `rd = rn op rm` for the register forms.
    fn alu_rrr(&mut self, op: AluOp, w: bool, d: u8, n: u8, m: u8) {
        match (op, w) {
            (AluOp::Add, true) => a64!(self.ops; add X(d), X(n), X(m)),
            (AluOp::Add, false) => a64!(self.ops; add W(d), W(n), W(m)),
            (AluOp::Sub, true) => a64!(self.ops; sub X(d), X(n), X(m)),
            (AluOp::Sub, false) => a64!(self.ops; sub W(d), W(n), W(m)),
            (AluOp::Mul, true) => a64!(self.ops; mul X(d), X(n), X(m)),
            (AluOp::Mul, false) => a64!(self.ops; mul W(d), W(n), W(m)),
            (AluOp::Div, true) => a64!(self.ops; udiv X(d), X(n), X(m)),
            (AluOp::Div, false) => a64!(self.ops; udiv W(d), W(n), W(m)),
            (AluOp::Sdiv, true) => a64!(self.ops; sdiv X(d), X(n), X(m)),
            (AluOp::Sdiv, false) => a64!(self.ops; sdiv W(d), W(n), W(m)),
            (AluOp::Mod, true) => {
                a64!(self.ops; udiv X(T2), X(n), X(m) ; msub X(d), X(T2), X(m), X(n))
            }
            (AluOp::Mod, false) => {
                a64!(self.ops; udiv W(T2), W(n), W(m) ; msub W(d), W(T2), W(m), W(n))
            }
            (AluOp::Smod, true) => {
                a64!(self.ops; sdiv X(T2), X(n), X(m) ; msub X(d), X(T2), X(m), X(n))
            }
            (AluOp::Smod, false) => {
                a64!(self.ops; sdiv W(T2), W(n), W(m) ; msub W(d), W(T2), W(m), W(n))
            }
            (AluOp::Or, true) => a64!(self.ops; orr X(d), X(n), X(m)),
            (AluOp::Or, false) => a64!(self.ops; orr W(d), W(n), W(m)),
            (AluOp::And, true) => a64!(self.ops; and X(d), X(n), X(m)),
            (AluOp::And, false) => a64!(self.ops; and W(d), W(n), W(m)),
            (AluOp::Xor, true) => a64!(self.ops; eor X(d), X(n), X(m)),
            (AluOp::Xor, false) => a64!(self.ops; eor W(d), W(n), W(m)),
            (AluOp::Lsh, true) => a64!(self.ops; lslv X(d), X(n), X(m)),
            (AluOp::Lsh, false) => a64!(self.ops; lslv W(d), W(n), W(m)),
            (AluOp::Rsh, true) => a64!(self.ops; lsrv X(d), X(n), X(m)),
            (AluOp::Rsh, false) => a64!(self.ops; lsrv W(d), W(n), W(m)),
            (AluOp::Arsh, true) => a64!(self.ops; asrv X(d), X(n), X(m)),
            (AluOp::Arsh, false) => a64!(self.ops; asrv W(d), W(n), W(m)),
            (AluOp::Mov, _) => self.mov_reg(d, m, w),
        }
    }

    /// Records a branch to a far label for the range check.
    fn site(&mut self, target: DynamicLabel, reach: Reach) {
        let at = self.off();
        self.sites.push(Site {
            inst: self.cur,
            at,
            target,
            reach,
        });
    }

    fn b(&mut self, target: DynamicLabel) {
        self.site(target, Reach::Jump);
        a64!(self.ops; b =>target);
    }

    fn b_cond(&mut self, cc: Cc, l: DynamicLabel) {
        match cc {
            Cc::Eq => a64!(self.ops; b.eq =>l),
            Cc::Ne => a64!(self.ops; b.ne =>l),
            Cc::Hs => a64!(self.ops; b.hs =>l),
            Cc::Lo => a64!(self.ops; b.lo =>l),
            Cc::Hi => a64!(self.ops; b.hi =>l),
            Cc::Ls => a64!(self.ops; b.ls =>l),
            Cc::Ge => a64!(self.ops; b.ge =>l),
            Cc::Lt => a64!(self.ops; b.lt =>l),
            Cc::Gt => a64!(self.ops; b.gt =>l),
            Cc::Le => a64!(self.ops; b.le =>l),
        }
    }

    /// Emits the branch for `test` to `target`: short form, or when the previous pass found
    /// it out of reach, the inverted test around an unconditional B (±128 MiB).
    fn branch_if(&mut self, test: Test, target: DynamicLabel) {
        if self.long[self.cur] {
            let skip = self.ops.new_dynamic_label();
            self.emit_test(invert(test), skip);
            self.b(target);
            a64!(self.ops; =>skip);
        } else {
            let reach = if matches!(test, Test::Bit { .. }) {
                Reach::Test
            } else {
                Reach::Cond
            };
            self.site(target, reach);
            self.emit_test(test, target);
        }
    }

    fn emit_test(&mut self, test: Test, l: DynamicLabel) {
        match test {
            Test::Flags(cc) => self.b_cond(cc, l),
            Test::Zero {
                reg,
                w64: true,
                zero: true,
            } => a64!(self.ops; cbz X(reg), =>l),
            Test::Zero {
                reg,
                w64: true,
                zero: false,
            } => a64!(self.ops; cbnz X(reg), =>l),
            Test::Zero {
                reg,
                w64: false,
                zero: true,
            } => a64!(self.ops; cbz W(reg), =>l),
            Test::Zero {
                reg,
                w64: false,
                zero: false,
            } => a64!(self.ops; cbnz W(reg), =>l),
            Test::Bit {
                reg,
                bit,
                set: true,
            } => a64!(self.ops; tbnz X(reg), bit, =>l),
            Test::Bit {
                reg,
                bit,
                set: false,
            } => a64!(self.ops; tbz X(reg), bit, =>l),
        }
    }

    // ---------------------------------------------------------------- instructions

    fn inst(&mut self, k: usize, i: usize, inst: &Inst) -> Result<(), CompileError> {
        match inst.op {
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => self.alu(width, op, dst, src),
            Op::MovSx {
                width,
                dst,
                src,
                bits,
            } => {
                let d = REG_MAP[dst as usize];
                let s = self.src(src, T0);
                match (w64(width), bits) {
                    (true, 8) => a64!(self.ops; sxtb X(d), W(s)),
                    (true, 16) => a64!(self.ops; sxth X(d), W(s)),
                    (true, 32) => a64!(self.ops; sxtw X(d), W(s)),
                    // 32-bit movsx: sign-extend into the low half, upper half zeroed by W.
                    (false, 8) => a64!(self.ops; sxtb W(d), W(s)),
                    (false, 16) => a64!(self.ops; sxth W(d), W(s)),
                    _ => {
                        return Err(self.err(
                            ErrorKind::Unsupported,
                            format!("movsx from {bits} bits at {width:?}"),
                        ))
                    }
                }
            }
            Op::Neg { width, dst } => {
                let d = REG_MAP[dst as usize];
                if w64(width) {
                    a64!(self.ops; neg X(d), X(d));
                } else {
                    a64!(self.ops; neg W(d), W(d));
                }
            }
            Op::End { kind, bits, dst } => self.end(kind, bits, REG_MAP[dst as usize]),
            Op::LdImm64 { dst, imm } => self.mov_imm(REG_MAP[dst as usize], imm, true),
            Op::Load {
                size,
                sign_extend,
                dst,
                base,
                off,
            } => self.mem(
                MemOp::Load { sign_extend },
                size,
                REG_MAP[dst as usize],
                base,
                off,
            ),
            Op::Store {
                size,
                base,
                off,
                src,
            } => {
                let v = match src {
                    Operand::Reg(r) => self.src(r, T2),
                    Operand::Imm(0) => ZR,
                    Operand::Imm(imm) => {
                        // Only the stored bytes matter: materialise the narrowest value.
                        let v = match size {
                            Size::B => imm as u8 as u64,
                            Size::H => imm as u16 as u64,
                            Size::W => imm as u32 as u64,
                            Size::DW => imm as i64 as u64,
                        };
                        self.mov_imm(T2, v, size == Size::DW);
                        T2
                    }
                };
                self.mem(MemOp::Store, size, v, base, off)
            }
            Op::Atomic {
                size,
                op,
                fetch,
                base,
                off,
                src,
            } => self.atomic(size == Size::DW, op, fetch, base, off, src),
            Op::Ja { target } => {
                // A jump to the next instruction is a no-op.
                if target != i + 1 {
                    self.b(self.labels[target]);
                }
            }
            Op::Jcond {
                width,
                cond,
                dst,
                src,
                target,
            } => {
                if target != i + 1 {
                    self.jcond(w64(width), cond, dst, src, self.labels[target]);
                }
            }
            Op::CallHelper { id } => {
                let Some(addr) = self.helpers.iter().find(|h| h.id == id).map(|h| h.addr) else {
                    return Err(self.err(
                        ErrorKind::UnknownHelper,
                        format!("call to unknown helper id {id}"),
                    ));
                };
                // BPF r1-r5 already sit in x0-x4; the helper's x0 result becomes r0.
                self.mov_imm(T0, addr, true);
                a64!(self.ops; blr X(T0) ; mov X(REG_MAP[0]), X(RET));
            }
            Op::CallReg { reg } => self.callx(reg),
            Op::CallLocal { target } => {
                let sub = self.prog.subprog_of(target);
                let entry = self.entries[sub];
                // Arguments in x0-x4, result in x7: the BPF calling convention is native.
                self.site(entry, Reach::Jump);
                a64!(self.ops; bl =>entry);
            }
            Op::Exit => {
                // The epilogue follows the last instruction of the subprogram.
                if i + 1 != self.prog.subprogs[k].end {
                    self.b(self.epilogues[k]);
                }
            }
        }
        Ok(())
    }

    fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let w = w64(width);
        let d = REG_MAP[dst as usize];
        let imm = match src {
            // r10 is sp + 512: one ADD, not a materialise-then-move.
            Operand::Reg(R10) if op == AluOp::Mov && w => {
                a64!(self.ops; add XSP(d), sp, STACK_SIZE as u32);
                return;
            }
            Operand::Reg(r) => {
                let s = self.src(r, T0);
                self.alu_rrr(op, w, d, d, s);
                return;
            }
            Operand::Imm(imm) => imm,
        };
        // The immediate is sign-extended to 64 bits for ALU64; ALU works on its low 32 bits.
        let v64 = imm as i64;
        let bits = if w { v64 as u64 } else { imm as u32 as u64 };
        let all = if w { u64::MAX } else { 0xffff_ffff };
        match op {
            AluOp::Mov => self.mov_imm(d, bits, w),
            AluOp::Add => self.add_imm(d, d, v64, w),
            AluOp::Sub => self.add_imm(d, d, v64.wrapping_neg(), w),
            AluOp::And | AluOp::Or | AluOp::Xor => match (op, bits) {
                (AluOp::And, 0) => self.mov_imm(d, 0, w),
                (AluOp::Or, b) if b == all => self.mov_imm(d, all, w),
                (AluOp::And, b) if b == all => self.mov_reg(d, d, w),
                (AluOp::Or | AluOp::Xor, 0) => self.mov_reg(d, d, w),
                (AluOp::Xor, b) if b == all => {
                    if w {
                        a64!(self.ops; mvn X(d), X(d));
                    } else {
                        a64!(self.ops; mvn W(d), W(d));
                    }
                }
                (_, b) if logical_ok(b, w) => match (op, w) {
                    (AluOp::And, true) => a64!(self.ops; and XSP(d), X(d), b),
                    (AluOp::And, false) => a64!(self.ops; and WSP(d), W(d), b as u32),
                    (AluOp::Or, true) => a64!(self.ops; orr XSP(d), X(d), b),
                    (AluOp::Or, false) => a64!(self.ops; orr WSP(d), W(d), b as u32),
                    (AluOp::Xor, true) => a64!(self.ops; eor XSP(d), X(d), b),
                    (_, _) => a64!(self.ops; eor WSP(d), W(d), b as u32),
                },
                (_, b) => {
                    self.mov_imm(T1, b, w);
                    self.alu_rrr(op, w, d, d, T1);
                }
            },
            AluOp::Lsh | AluOp::Rsh | AluOp::Arsh => {
                // Shift counts are masked to the width, as the register forms do.
                let sh = (imm as u32) & if w { 63 } else { 31 };
                match (op, w) {
                    _ if sh == 0 => self.mov_reg(d, d, w),
                    (AluOp::Lsh, true) => a64!(self.ops; lsl X(d), X(d), sh),
                    (AluOp::Lsh, false) => a64!(self.ops; lsl W(d), W(d), sh),
                    (AluOp::Rsh, true) => a64!(self.ops; lsr X(d), X(d), sh),
                    (AluOp::Rsh, false) => a64!(self.ops; lsr W(d), W(d), sh),
                    (_, true) => a64!(self.ops; asr X(d), X(d), sh),
                    (_, false) => a64!(self.ops; asr W(d), W(d), sh),
                }
            }
            AluOp::Div | AluOp::Sdiv if bits == 0 => self.mov_imm(d, 0, w),
            AluOp::Mod | AluOp::Smod if bits == 0 => self.mov_reg(d, d, w),
            AluOp::Div if bits.is_power_of_two() => {
                // Unsigned division by 2^k is a shift.
                let sh = bits.trailing_zeros();
                if w {
                    a64!(self.ops; lsr X(d), X(d), sh);
                } else {
                    a64!(self.ops; lsr W(d), W(d), sh);
                }
            }
            AluOp::Mod if bits.is_power_of_two() && logical_ok(bits - 1, w) => {
                // Unsigned remainder by 2^k keeps the low k bits.
                if w {
                    a64!(self.ops; and XSP(d), X(d), bits - 1);
                } else {
                    a64!(self.ops; and WSP(d), W(d), (bits - 1) as u32);
                }
            }
            AluOp::Mul | AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => {
                self.mov_imm(T1, bits, w);
                self.alu_rrr(op, w, d, d, T1);
            }
        }
    }

    fn end(&mut self, kind: EndKind, bits: u8, d: u8) {
        match (kind, bits) {
            // Little-endian target: "to little-endian" only truncates.
            (EndKind::ToLe, 16) => a64!(self.ops; uxth W(d), W(d)),
            (EndKind::ToLe, 32) => self.zext32(d),
            (EndKind::ToLe, _) => {}
            (_, 16) => a64!(self.ops; rev16 W(d), W(d) ; uxth W(d), W(d)),
            (_, 32) => a64!(self.ops; rev W(d), W(d)),
            (_, _) => a64!(self.ops; rev X(d), X(d)),
        }
    }

    fn mem(&mut self, op: MemOp, size: Size, rt: u8, base: Reg, off: i16) {
        // r10-based accesses address the frame directly off sp (r10 = sp + 512).
        let (b, o) = if base == R10 {
            (ZR, off as i64 + STACK_SIZE as i64)
        } else {
            (REG_MAP[base as usize], off as i64)
        };
        let sz = size.bytes() as i64;
        let form = if o >= 0 && o % sz == 0 && o / sz < 4096 {
            AddrForm::Scaled
        } else if (-256..256).contains(&o) {
            AddrForm::Unscaled
        } else {
            // Out of both immediate forms: the offset goes in a register.
            self.mov_imm(T0, o as u64, true);
            AddrForm::Index
        };
        let o = o as i32;
        macro_rules! acc {
            ($scaled:ident, $unscaled:ident, $fam:ident) => {
                match form {
                    AddrForm::Scaled => a64!(self.ops; $scaled $fam(rt), [XSP(b), o as u32]),
                    AddrForm::Unscaled => a64!(self.ops; $unscaled $fam(rt), [XSP(b), o]),
                    AddrForm::Index => a64!(self.ops; $scaled $fam(rt), [XSP(b), X(T0)]),
                }
            };
        }
        match (op, size) {
            (MemOp::Load { sign_extend: false }, Size::B) => acc!(ldrb, ldurb, W),
            (MemOp::Load { sign_extend: false }, Size::H) => acc!(ldrh, ldurh, W),
            (MemOp::Load { sign_extend: false }, Size::W) => acc!(ldr, ldur, W),
            (MemOp::Load { .. }, Size::DW) => acc!(ldr, ldur, X),
            (MemOp::Load { sign_extend: true }, Size::B) => acc!(ldrsb, ldursb, X),
            (MemOp::Load { sign_extend: true }, Size::H) => acc!(ldrsh, ldursh, X),
            (MemOp::Load { sign_extend: true }, Size::W) => acc!(ldrsw, ldursw, X),
            (MemOp::Store, Size::B) => acc!(strb, sturb, W),
            (MemOp::Store, Size::H) => acc!(strh, sturh, W),
            (MemOp::Store, Size::W) => acc!(str, stur, W),
            (MemOp::Store, Size::DW) => acc!(str, stur, X),
        }
    }

    /// Address of an atomic access in a register (LDXR/LDADD... take no offset).
    fn atomic_addr(&mut self, base: Reg, off: i16) -> u8 {
        if base == R10 {
            self.add_imm_sp(T0, off as i64 + STACK_SIZE as i64);
            T0
        } else if off == 0 {
            REG_MAP[base as usize]
        } else {
            self.add_imm(T0, REG_MAP[base as usize], off as i64, true);
            T0
        }
    }

    fn add_imm_sp(&mut self, rd: u8, v: i64) {
        if let Some((imm, false)) = fits_imm12(v) {
            a64!(self.ops; add XSP(rd), sp, imm);
        } else {
            self.mov_imm(rd, v as u64, true);
            a64!(self.ops; add XSP(rd), sp, X(rd));
        }
    }

    fn atomic(&mut self, w: bool, op: AtomicOp, fetch: bool, base: Reg, off: i16, src: Reg) {
        let a = self.atomic_addr(base, off);
        let s = self.src(src, T4);
        let r0 = REG_MAP[0];
        if self.lse {
            self.atomic_lse(w, op, fetch, a, s, r0);
        } else {
            self.atomic_llsc(w, op, fetch, a, s, r0);
        }
    }

    /// ARMv8.1 LSE: one instruction. Fetching forms are fully ordered (`...AL`) as the
    /// kernel's BPF atomics are; plain read-modify-write uses the relaxed `ST...` alias.
    fn atomic_lse(&mut self, w: bool, op: AtomicOp, fetch: bool, a: u8, s: u8, r0: u8) {
        // LSE has no AND: clear the complement instead.
        let v = if op == AtomicOp::And {
            a64!(self.ops; mvn X(T1), X(s));
            T1
        } else {
            s
        };
        if !fetch {
            match (op, w) {
                (AtomicOp::Add, true) => a64!(self.ops; stadd X(v), [X(a)]),
                (AtomicOp::Add, false) => a64!(self.ops; stadd W(v), [X(a)]),
                (AtomicOp::Or, true) => a64!(self.ops; stset X(v), [X(a)]),
                (AtomicOp::Or, false) => a64!(self.ops; stset W(v), [X(a)]),
                (AtomicOp::And, true) => a64!(self.ops; stclr X(v), [X(a)]),
                (AtomicOp::And, false) => a64!(self.ops; stclr W(v), [X(a)]),
                (_, true) => a64!(self.ops; steor X(v), [X(a)]),
                (_, false) => a64!(self.ops; steor W(v), [X(a)]),
            }
            return;
        }
        // The old value lands in the source register (r0 for cmpxchg); W forms zero-extend.
        match (op, w) {
            (AtomicOp::Add, true) => a64!(self.ops; ldaddal X(v), X(s), [X(a)]),
            (AtomicOp::Add, false) => a64!(self.ops; ldaddal W(v), W(s), [X(a)]),
            (AtomicOp::Or, true) => a64!(self.ops; ldsetal X(v), X(s), [X(a)]),
            (AtomicOp::Or, false) => a64!(self.ops; ldsetal W(v), W(s), [X(a)]),
            (AtomicOp::And, true) => a64!(self.ops; ldclral X(v), X(s), [X(a)]),
            (AtomicOp::And, false) => a64!(self.ops; ldclral W(v), W(s), [X(a)]),
            (AtomicOp::Xor, true) => a64!(self.ops; ldeoral X(v), X(s), [X(a)]),
            (AtomicOp::Xor, false) => a64!(self.ops; ldeoral W(v), W(s), [X(a)]),
            (AtomicOp::Xchg, true) => a64!(self.ops; swpal X(v), X(s), [X(a)]),
            (AtomicOp::Xchg, false) => a64!(self.ops; swpal W(v), W(s), [X(a)]),
            // CAS compares with and returns into its first operand: r0 itself.
            (AtomicOp::Cmpxchg, true) => a64!(self.ops; casal X(r0), X(s), [X(a)]),
            (AtomicOp::Cmpxchg, false) => a64!(self.ops; casal W(r0), W(s), [X(a)]),
        }
    }

    /// Exclusive-monitor loops for CPUs without LSE. Fetching forms get release on the
    /// store plus a full barrier after, matching the ordering of the LSE `...AL` forms.
    fn atomic_llsc(&mut self, w: bool, op: AtomicOp, fetch: bool, a: u8, s: u8, r0: u8) {
        let (old, new, status) = (T1, T2, T3);
        if op == AtomicOp::Cmpxchg {
            if w {
                a64!(self.ops
                    ; retry:
                    ; ldxr X(old), [X(a)]
                    ; cmp X(old), X(r0)
                    ; b.ne >done
                    ; stlxr W(status), X(s), [X(a)]
                    ; cbnz W(status), <retry
                    ; done:
                    ; dmb ish
                    ; mov X(r0), X(old)
                );
            } else {
                a64!(self.ops
                    ; retry:
                    ; ldxr W(old), [X(a)]
                    ; cmp W(old), W(r0)
                    ; b.ne >done
                    ; stlxr W(status), W(s), [X(a)]
                    ; cbnz W(status), <retry
                    ; done:
                    ; dmb ish
                    ; mov W(r0), W(old)
                );
            }
            return;
        }
        a64!(self.ops; retry:);
        if w {
            a64!(self.ops; ldxr X(old), [X(a)]);
        } else {
            a64!(self.ops; ldxr W(old), [X(a)]);
        }
        let val = match (op, w) {
            (AtomicOp::Xchg, _) => s,
            (AtomicOp::Add, true) => {
                a64!(self.ops; add X(new), X(old), X(s));
                new
            }
            (AtomicOp::Add, false) => {
                a64!(self.ops; add W(new), W(old), W(s));
                new
            }
            (AtomicOp::Or, true) => {
                a64!(self.ops; orr X(new), X(old), X(s));
                new
            }
            (AtomicOp::Or, false) => {
                a64!(self.ops; orr W(new), W(old), W(s));
                new
            }
            (AtomicOp::And, true) => {
                a64!(self.ops; and X(new), X(old), X(s));
                new
            }
            (AtomicOp::And, false) => {
                a64!(self.ops; and W(new), W(old), W(s));
                new
            }
            (_, true) => {
                a64!(self.ops; eor X(new), X(old), X(s));
                new
            }
            (_, false) => {
                a64!(self.ops; eor W(new), W(old), W(s));
                new
            }
        };
        match (fetch, w) {
            (true, true) => a64!(self.ops; stlxr W(status), X(val), [X(a)]),
            (true, false) => a64!(self.ops; stlxr W(status), W(val), [X(a)]),
            (false, true) => a64!(self.ops; stxr W(status), X(val), [X(a)]),
            (false, false) => a64!(self.ops; stxr W(status), W(val), [X(a)]),
        }
        a64!(self.ops; cbnz W(status), <retry);
        if fetch {
            a64!(self.ops; dmb ish);
            if w {
                a64!(self.ops; mov X(s), X(old));
            } else {
                a64!(self.ops; mov W(s), W(old));
            }
        }
    }

    fn jcond(&mut self, w: bool, cond: Cond, dst: Reg, src: Operand, target: DynamicLabel) {
        let d = self.src(dst, T0);
        let test = match src {
            Operand::Reg(r) => {
                let s = self.src(r, T1);
                match (cond, w) {
                    (Cond::Set, true) => a64!(self.ops; tst X(d), X(s)),
                    (Cond::Set, false) => a64!(self.ops; tst W(d), W(s)),
                    (_, true) => a64!(self.ops; cmp X(d), X(s)),
                    (_, false) => a64!(self.ops; cmp W(d), W(s)),
                }
                Test::Flags(Cc::from_bpf(cond))
            }
            Operand::Imm(imm) => {
                let v = imm as i64;
                let bits = if w { v as u64 } else { imm as u32 as u64 };
                match cond {
                    Cond::Eq | Cond::Ne if v == 0 => Test::Zero {
                        reg: d,
                        w64: w,
                        zero: cond == Cond::Eq,
                    },
                    // x & 0 is never non-zero: the branch is never taken.
                    Cond::Set if bits == 0 => return,
                    Cond::Set if bits.is_power_of_two() => Test::Bit {
                        reg: d,
                        bit: bits.trailing_zeros(),
                        set: true,
                    },
                    Cond::Set => {
                        if logical_ok(bits, w) {
                            if w {
                                a64!(self.ops; tst X(d), bits);
                            } else {
                                a64!(self.ops; tst W(d), bits as u32);
                            }
                        } else {
                            self.mov_imm(T1, bits, w);
                            if w {
                                a64!(self.ops; tst X(d), X(T1));
                            } else {
                                a64!(self.ops; tst W(d), W(T1));
                            }
                        }
                        Test::Flags(Cc::Ne)
                    }
                    _ => {
                        self.cmp_imm(d, v, w);
                        Test::Flags(Cc::from_bpf(cond))
                    }
                }
            }
        };
        self.branch_if(test, target);
    }

    /// Flags from `rn - v`: CMP #imm12, CMN #imm12 for small negatives (same flags for a
    /// non-zero v), else through a register.
    fn cmp_imm(&mut self, rn: u8, v: i64, w: bool) {
        if let Some((imm, sh)) = fits_imm12(v) {
            match (w, sh) {
                (true, false) => a64!(self.ops; cmp XSP(rn), imm),
                (true, true) => a64!(self.ops; cmp XSP(rn), imm, lsl 12),
                (false, false) => a64!(self.ops; cmp WSP(rn), imm),
                (false, true) => a64!(self.ops; cmp WSP(rn), imm, lsl 12),
            }
        } else if let Some((imm, sh)) = fits_imm12(v.wrapping_neg()) {
            match (w, sh) {
                (true, false) => a64!(self.ops; cmn XSP(rn), imm),
                (true, true) => a64!(self.ops; cmn XSP(rn), imm, lsl 12),
                (false, false) => a64!(self.ops; cmn WSP(rn), imm),
                (false, true) => a64!(self.ops; cmn WSP(rn), imm, lsl 12),
            }
        } else {
            self.mov_imm(T1, v as u64, w);
            if w {
                a64!(self.ops; cmp X(rn), X(T1));
            } else {
                a64!(self.ops; cmp W(rn), W(T1));
            }
        }
    }

    /// `callx reg`: compare the id in the register against each registered helper and call
    /// the match; no match leaves the program with r0 = u64::MAX.
    fn callx(&mut self, reg: Reg) {
        let abort = self.abort.expect("abort stub exists when callx does");
        let r = self.src(reg, T0);
        let mut seen = Vec::new();
        let table: Vec<HelperEntry> = self
            .helpers
            .iter()
            .filter(|h| {
                // The first entry for an id wins, as in `CompileRequest::helper`.
                let fresh = !seen.contains(&h.id);
                seen.push(h.id);
                fresh
            })
            .copied()
            .collect();
        let call = self.ops.new_dynamic_label();
        for (n, h) in table.iter().enumerate() {
            // Compare the full 64-bit register: 0x1_0000_0005 is not helper 5.
            self.cmp_imm_u64(r, h.id as u64);
            if n + 1 < table.len() {
                a64!(self.ops; b.ne >next);
                self.mov_imm(T2, h.addr, true);
                a64!(self.ops; b =>call ; next:);
            } else {
                a64!(self.ops; b.eq >found);
                self.b(abort);
                a64!(self.ops; found:);
                self.mov_imm(T2, h.addr, true);
            }
        }
        if table.is_empty() {
            self.b(abort);
            return;
        }
        a64!(self.ops; =>call ; blr X(T2) ; mov X(REG_MAP[0]), X(RET));
    }

    fn cmp_imm_u64(&mut self, rn: u8, v: u64) {
        if let Some((imm, false)) = fits_imm12(v as i64) {
            a64!(self.ops; cmp XSP(rn), imm);
        } else {
            self.mov_imm(T1, v, true);
            a64!(self.ops; cmp X(rn), X(T1));
        }
    }
}

fn invert(t: Test) -> Test {
    match t {
        Test::Flags(cc) => Test::Flags(cc.invert()),
        Test::Zero { reg, w64, zero } => Test::Zero {
            reg,
            w64,
            zero: !zero,
        },
        Test::Bit { reg, bit, set } => Test::Bit {
            reg,
            bit,
            set: !set,
        },
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum MemOp {
    Load { sign_extend: bool },
    Store,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum AddrForm {
    /// `[base, #imm]`, unsigned 12-bit offset scaled by the access size.
    Scaled,
    /// `LDUR`/`STUR`: signed 9-bit byte offset.
    Unscaled,
    /// `[base, x9]`: the offset materialised in T0.
    Index,
}
