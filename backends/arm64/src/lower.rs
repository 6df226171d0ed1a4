//! eBPF → AArch64 lowering: one short function per instruction class.
//!
//! Layout of the emitted code: the subprograms in bytecode order, each as
//! `prologue, body, epilogue`; then (only when the program uses `callx`) one shared stub that
//! leaves the program with r0 = `u64::MAX`. The entry subprogram starts at offset 0. Every
//! branch is PC-relative and helpers are reached through absolute addresses in a scratch
//! register, so the bytes run at any address.
//!
//! Division needs no guard: AArch64 `UDIV`/`SDIV` already return 0 for a zero divisor and
//! `SDIV` returns MIN for MIN / -1 (it never traps), and `MSUB` then yields `x % 0 = x` and
//! `MIN % -1 = 0` — exactly RFC 9669. Register shifts (`LSLV`...) take the count modulo the
//! width, which is eBPF's masking; 32-bit (`W`) results are zero-extended by the hardware.

use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi};
use packjit_frontend::{
    AluOp, AtomicOp, Cond, EndKind, Inst, Op, Operand, Program, Reg, Size, Width, Width::W32,
    Width::W64, R10, STACK_SIZE,
};
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::convert::Infallible;

use crate::encode::*;
use crate::frame::{plan, Plan};
use crate::regs::*;
use crate::FEATURE_LSE;
use packjit_frontend::analysis::CodegenMode;
use packjit_frontend::analysis::{
    callx_plan, helper_lowering, EmitCapacity, HelperLowering, CALL_CHARGE,
};
use packjit_frontend::cold::ColdPlacement;
use packjit_frontend::lower::{self, AccessLowering, Assembled, Cold, Driver, Lowering, Pass};
use packjit_frontend::ranges::AccessCheck;
use packjit_frontend::relax::{BranchCheck, Relaxation};
use packjit_frontend::scratch::{self, Reused};
use packjit_frontend::walks::{Guard, GuardRegion, Walk};
use packjit_plugin_api::abi::{
    PJ_ACCESS_WRITE, PJ_CLOCK_MULT_FRAC, PJ_CLOCK_MULT_INT, PJ_CLOCK_OFFSET, PJ_ENV_REGIONS,
    PJ_HELPER_GET_SMP_PROCESSOR_ID, PJ_HELPER_PERCPU_OFFSET, PJ_PERCPU_ARRAYS,
    PJ_PERCPU_ARRAY_SIZE, PJ_PERCPU_BASE, PJ_PERCPU_COUNT, PJ_PERCPU_CPUS, PJ_PERCPU_CPU_ID_OFFSET,
    PJ_PERCPU_ENTRIES, PJ_PERCPU_SLOT_SIZE, PJ_PERCPU_VALUE_SIZE, PJ_STOP_OUT_OF_BOUNDS,
    PJ_STOP_UNKNOWN_CALLX,
};

/// `mrs x0, tpidr_el0` (op0=3 op1=3 CRn=13 CRm=0 op2=2): the EL0 thread pointer.
const MRS_TPIDR_EL0: u32 = 0xd53b_d040;
/// `mrs x0, cntvct_el0` (op0=3 op1=3 CRn=14 CRm=0 op2=2): the virtual counter.
const MRS_CNTVCT_EL0: u32 = 0xd53b_e040;

pub use packjit_frontend::analysis::EmitOptions;
pub use packjit_frontend::lower::Emitted;

/// Emits an already decoded program for `mode` (see [`crate::emit_program`]).
pub fn emit_decoded(
    prog: &Program,
    helpers: &[HelperEntry],
    mode: &CodegenMode,
) -> Result<Emitted, CompileError> {
    emit_decoded_with(prog, helpers, mode, EmitOptions::default())
}

/// [`emit_decoded`] with measurement switches (see [`EmitOptions`]; benches only).
#[doc(hidden)]
pub fn emit_decoded_with(
    prog: &Program,
    helpers: &[HelperEntry],
    mode: &CodegenMode,
    opts: EmitOptions,
) -> Result<Emitted, CompileError> {
    let plan = plan(
        prog,
        mode.sandboxed(),
        mode.counts_budget(),
        opts.group_checks,
    );
    // Conditional branches start in their short form; the shared relaxation driver switches
    // those found out of range to the long form (inverted condition around a B), and the code
    // is emitted again. In practice one pass suffices.
    let relax = Relaxation::new(Form::Long, LONG_FORM_GROWTH, GENTLE_PASSES);
    // B.cond reaches ±1 MiB: no cold side is guessed far, only islands keep them near.
    let islands = ColdPlacement::new(ISLAND_SPAN, 0);
    lower::emit(relax, islands, |forms, islands| {
        let mut cg = Codegen::new(prog, helpers, mode, &plan, forms.to_vec(), islands);
        cg.d.clamp = opts.spectre_clamp;
        Ok(cg)
    })
}

/// The arm64 lowering of one emission pass: the driver's state, the ISA's own labels and
/// the assembler.
pub(crate) struct Codegen<'a> {
    /// The shared driver's state (`packjit_frontend::lower`). An access's slow path needs
    /// the register holding its unclamped address.
    pub(crate) d: Driver<'a, u8, Infallible>,
    pub(crate) helpers: &'a [HelperEntry],
    pub(crate) lse: bool,
    pub(crate) plan: &'a Plan,
    /// Form of each conditional branch site (by emission order), from the relaxation driver.
    pub(crate) forms: Vec<Form>,
    /// Conditional branch sites emitted so far in this pass.
    pub(crate) cond_sites: usize,
    pub(crate) ops: Asm,
    /// Entry epilogue past the stack release: where every stop lands.
    pub(crate) restore: DynamicLabel,
    /// Shared stop path (see `Codegen::stop_paths`).
    pub(crate) stop: DynamicLabel,
    /// Shared budget stop path.
    pub(crate) stop_budget: DynamicLabel,
    /// The shared access check (sandbox; see [`Self::region_scan`]).
    pub(crate) region_scan: DynamicLabel,
    /// Some access's cold side calls the shared check, so the program gets one (a program
    /// whose accesses all pass their inline tests or need none has no use for it).
    uses_region_scan: bool,
    pub(crate) sites: Reused<Site>,
    /// The register map of the function being emitted (`Frame::map`).
    pub(crate) map: RegMap,
    /// Byte ranges of data in the code (`callx` tables and their padding): not
    /// instructions.
    pub(crate) data: Vec<std::ops::Range<usize>>,
}

impl<'a> Codegen<'a> {
    pub(crate) fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        mode: &'a CodegenMode,
        plan: &'a Plan,
        forms: Vec<Form>,
        islands: ColdPlacement,
    ) -> Self {
        // Bytes per instruction, trusted / checked (arm64 averages 5.3 / 36).
        let cap = EmitCapacity::for_program(prog, mode, (8, 40));
        let mut ops: Asm = scratch::assembler(cap.code, cap.labels, cap.branch_sites);
        let d = Driver::new(
            prog,
            &plan.access,
            mode,
            islands,
            || ops.new_dynamic_label(),
            |_| true,
        );
        let restore = ops.new_dynamic_label();
        let stop = ops.new_dynamic_label();
        let stop_budget = ops.new_dynamic_label();
        let region_scan = ops.new_dynamic_label();
        Codegen {
            d,
            helpers,
            lse: mode.features & FEATURE_LSE != 0,
            plan,
            forms,
            cond_sites: 0,
            ops,
            restore,
            stop,
            stop_budget,
            region_scan,
            uses_region_scan: false,
            sites: scratch::take(cap.branch_sites),
            map: plan.frames[0].map,
            data: Vec::new(),
        }
    }

    pub(crate) fn off(&self) -> usize {
        self.ops.offset().0
    }

    pub(crate) fn err(&self, kind: ErrorKind, msg: impl Into<String>) -> CompileError {
        self.d.error(kind, msg)
    }

    /// The register the frame is addressed from and r10's offset from it: sp in trusted
    /// code (r10 = sp + 512), x25 in the sandbox's stack block (r10 = x25 + 512).
    pub(crate) fn frame_base(&self) -> u8 {
        if self.d.mode.sandboxed() {
            FP
        } else {
            ZR
        }
    }

    /// The arm64 register holding BPF register `r`'s value; r10 is materialised in `tmp`.
    pub(crate) fn src(&mut self, r: Reg, tmp: u8) -> u8 {
        if r == R10 {
            let fb = self.frame_base();
            a64!(self.ops; add XSP(tmp), XSP(fb), STACK_SIZE as u32);
            tmp
        } else {
            self.map[r as usize]
        }
    }

    // ---------------------------------------------------------------- instructions

    pub(crate) fn inst(&mut self, k: usize, i: usize, inst: &Inst) -> Result<(), CompileError> {
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
                let d = self.map[dst as usize];
                let s = self.src(src, T0);
                match (width, bits) {
                    (W64, 8) => a64!(self.ops; sxtb X(d), W(s)),
                    (W64, 16) => a64!(self.ops; sxth X(d), W(s)),
                    (W64, 32) => a64!(self.ops; sxtw X(d), W(s)),
                    // 32-bit movsx: sign-extend into the low half, upper half zeroed by W.
                    (W32, 8) => a64!(self.ops; sxtb W(d), W(s)),
                    (W32, 16) => a64!(self.ops; sxth W(d), W(s)),
                    _ => {
                        return Err(self.err(
                            ErrorKind::Unsupported,
                            format!("movsx from {bits} bits at {width:?}"),
                        ))
                    }
                }
            }
            Op::Neg { width, dst } => {
                let d = self.map[dst as usize];
                if width == W64 {
                    a64!(self.ops; neg X(d), X(d));
                } else {
                    a64!(self.ops; neg W(d), W(d));
                }
            }
            Op::End { kind, bits, dst } => self.end(kind, bits, self.map[dst as usize]),
            Op::LdImm64 { dst, imm } => self.imm(self.map[dst as usize], imm.get(), W64),
            Op::Load {
                size,
                sign_extend,
                dst,
                base,
                off,
            } => self.mem(
                MemOp::Load { sign_extend },
                size,
                self.map[dst as usize],
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
                        self.imm(T2, v, if size == Size::DW { W64 } else { W32 });
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
            } => self.atomic(
                if size == Size::DW { W64 } else { W32 },
                op,
                fetch,
                base,
                off,
                src,
            ),
            Op::Ja { target } => {
                let target = target as usize;
                // A jump to the next instruction is a no-op.
                if target != i + 1 {
                    self.charge_back_edge(target);
                    self.b(self.d.jump_label(target));
                }
            }
            Op::Jcond {
                width,
                cond,
                dst,
                src,
                target,
            } => {
                let target = target as usize;
                if target != i + 1 {
                    self.jcond(width, cond, dst, src, target);
                }
            }
            Op::CallHelper { id } => {
                let Some(h) = self.helpers.iter().find(|h| h.id == id).copied() else {
                    return Err(self.err(
                        ErrorKind::UnknownHelper,
                        format!("call to unknown helper id {id}"),
                    ));
                };
                match helper_lowering(&h) {
                    HelperLowering::Call(addr) => {
                        // BPF r1-r5 already sit in x0-x4; the helper's x0 result becomes r0.
                        self.mov_imm(T0, addr, W64);
                        a64!(self.ops; blr X(T0) ; mov X(self.map[0]), X(RET));
                    }
                    inline => self.inline_helper(inline),
                }
            }
            Op::CallReg { reg } => self.callx(reg),
            Op::MovPerCpu { dst, src, array } => self.mov_percpu(dst, src, array)?,
            Op::CallLocal { target } => {
                let sub = self.d.prog.subprog_of(target as usize);
                let entry = self.d.entries[sub];
                if self.d.mode.counts_budget() {
                    self.charge(CALL_CHARGE);
                }
                // Arguments in x0-x4, result in x7: the BPF calling convention is native.
                // In the sandbox's stack block the callee's frame is the 512 bytes below.
                let block = self.plan.block > 0;
                if block {
                    a64!(self.ops; sub XSP(FP), XSP(FP), STACK_SIZE as u32);
                }
                self.site(entry, Reach::Jump);
                a64!(self.ops; bl =>entry);
                if block {
                    a64!(self.ops; add XSP(FP), XSP(FP), STACK_SIZE as u32);
                }
            }
            Op::Exit => {
                // The epilogue follows the last instruction of the subprogram.
                if i + 1 != self.d.prog.subprogs[k].end {
                    self.b(self.d.epilogues[k]);
                }
            }
        }
        Ok(())
    }

    pub(crate) fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let d = self.map[dst as usize];
        let imm = match src {
            // r10 is sp + 512: one ADD, not a materialise-then-move.
            Operand::Reg(R10) if op == AluOp::Mov && width == W64 => {
                let fb = self.frame_base();
                a64!(self.ops; add XSP(d), XSP(fb), STACK_SIZE as u32);
                return;
            }
            Operand::Reg(r) => {
                let s = self.src(r, T0);
                self.alu_rrr(op, width, d, d, s);
                return;
            }
            Operand::Imm(imm) if self.d.mode.blind_key.is_some() => {
                // Blinded: the immediate only ever exists masked in the code, so every
                // operation takes it from a register.
                if op == AluOp::Mov {
                    self.imm32(d, imm, width);
                } else {
                    self.imm32(T1, imm, width);
                    self.alu_rrr(op, width, d, d, T1);
                }
                return;
            }
            Operand::Imm(imm) => imm,
        };
        // The immediate is sign-extended to 64 bits for ALU64; ALU works on its low 32 bits.
        let v64 = imm as i64;
        let bits = if width == W64 {
            v64 as u64
        } else {
            imm as u32 as u64
        };
        let all = if width == W64 { u64::MAX } else { 0xffff_ffff };
        match op {
            AluOp::Mov => self.mov_imm(d, bits, width),
            AluOp::Add => self.add_imm(d, d, v64, width),
            AluOp::Sub => self.add_imm(d, d, v64.wrapping_neg(), width),
            AluOp::And | AluOp::Or | AluOp::Xor => match (op, bits) {
                (AluOp::And, 0) => self.mov_imm(d, 0, width),
                (AluOp::Or, b) if b == all => self.mov_imm(d, all, width),
                (AluOp::And, b) if b == all => self.mov_reg(d, d, width),
                (AluOp::Or | AluOp::Xor, 0) => self.mov_reg(d, d, width),
                (AluOp::Xor, b) if b == all => {
                    if width == W64 {
                        a64!(self.ops; mvn X(d), X(d));
                    } else {
                        a64!(self.ops; mvn W(d), W(d));
                    }
                }
                (_, b) if logical_ok(b, width) => match (op, width) {
                    (AluOp::And, W64) => a64!(self.ops; and XSP(d), X(d), b),
                    (AluOp::And, W32) => a64!(self.ops; and WSP(d), W(d), b as u32),
                    (AluOp::Or, W64) => a64!(self.ops; orr XSP(d), X(d), b),
                    (AluOp::Or, W32) => a64!(self.ops; orr WSP(d), W(d), b as u32),
                    (AluOp::Xor, W64) => a64!(self.ops; eor XSP(d), X(d), b),
                    (_, _) => a64!(self.ops; eor WSP(d), W(d), b as u32),
                },
                (_, b) => {
                    self.mov_imm(T1, b, width);
                    self.alu_rrr(op, width, d, d, T1);
                }
            },
            AluOp::Lsh | AluOp::Rsh | AluOp::Arsh => {
                // Shift counts are masked to the width, as the register forms do.
                let sh = (imm as u32) & if width == W64 { 63 } else { 31 };
                match (op, width) {
                    _ if sh == 0 => self.mov_reg(d, d, width),
                    (AluOp::Lsh, W64) => a64!(self.ops; lsl X(d), X(d), sh),
                    (AluOp::Lsh, W32) => a64!(self.ops; lsl W(d), W(d), sh),
                    (AluOp::Rsh, W64) => a64!(self.ops; lsr X(d), X(d), sh),
                    (AluOp::Rsh, W32) => a64!(self.ops; lsr W(d), W(d), sh),
                    (_, W64) => a64!(self.ops; asr X(d), X(d), sh),
                    (_, W32) => a64!(self.ops; asr W(d), W(d), sh),
                }
            }
            AluOp::Div | AluOp::Sdiv if bits == 0 => self.mov_imm(d, 0, width),
            AluOp::Mod | AluOp::Smod if bits == 0 => self.mov_reg(d, d, width),
            AluOp::Div if bits.is_power_of_two() => {
                // Unsigned division by 2^k is a shift.
                let sh = bits.trailing_zeros();
                if width == W64 {
                    a64!(self.ops; lsr X(d), X(d), sh);
                } else {
                    a64!(self.ops; lsr W(d), W(d), sh);
                }
            }
            AluOp::Mod if bits.is_power_of_two() && logical_ok(bits - 1, width) => {
                // Unsigned remainder by 2^k keeps the low k bits.
                if width == W64 {
                    a64!(self.ops; and XSP(d), X(d), bits - 1);
                } else {
                    a64!(self.ops; and WSP(d), W(d), (bits - 1) as u32);
                }
            }
            AluOp::Mul | AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => {
                self.mov_imm(T1, bits, width);
                self.alu_rrr(op, width, d, d, T1);
            }
        }
    }

    pub(crate) fn end(&mut self, kind: EndKind, bits: u8, d: u8) {
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

    pub(crate) fn mem(&mut self, op: MemOp, size: Size, rt: u8, base: Reg, off: i16) {
        let inst = self.d.prog.insts[self.d.cur].op;
        // r10-based accesses address the frame directly off its base (r10 = base + 512).
        let (b, o) = match self.d.access(&inst) {
            AccessLowering::Checked(_) => {
                let addr = self.check_access(size, op == MemOp::Store, base, off);
                self.clamp_reentered_base(base, off);
                (addr, 0)
            }
            AccessLowering::Direct { base: R10, off } => {
                (self.frame_base(), off as i64 + STACK_SIZE as i64)
            }
            AccessLowering::Direct { base, off } => (self.map[base as usize], off as i64),
        };
        let sz = size.bytes() as i64;
        let form = if o >= 0 && o % sz == 0 && o / sz < 4096 {
            AddrForm::Scaled
        } else if (-256..256).contains(&o) {
            AddrForm::Unscaled
        } else {
            // Out of both immediate forms: the offset goes in a register.
            self.mov_imm(T0, o as u64, W64);
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
    pub(crate) fn atomic_addr(&mut self, size: Size, base: Reg, off: i16) -> u8 {
        let inst = self.d.prog.insts[self.d.cur].op;
        match self.d.access(&inst) {
            // Atomics count as writes.
            AccessLowering::Checked(_) => self.check_access(size, true, base, off),
            AccessLowering::Direct { base: R10, off } => {
                let fb = self.frame_base();
                self.add_imm_base(T0, fb, off as i64 + STACK_SIZE as i64);
                T0
            }
            AccessLowering::Direct { base, off: 0 } => self.map[base as usize],
            AccessLowering::Direct { base, off } => {
                self.add_imm(T0, self.map[base as usize], off as i64, W64);
                T0
            }
        }
    }

    pub(crate) fn atomic(
        &mut self,
        width: Width,
        op: AtomicOp,
        fetch: bool,
        base: Reg,
        off: i16,
        src: Reg,
    ) {
        let a = self.atomic_addr(if width == W64 { Size::DW } else { Size::W }, base, off);
        let s = self.src(src, T4);
        let r0 = self.map[0];
        if self.lse {
            self.atomic_lse(width, op, fetch, a, s, r0);
        } else {
            self.atomic_llsc(width, op, fetch, a, s, r0);
        }
    }

    /// ARMv8.1 LSE: one instruction. Fetching forms are fully ordered (`...AL`) as the
    /// kernel's BPF atomics are; plain read-modify-write uses the relaxed `ST...` alias.
    pub(crate) fn atomic_lse(
        &mut self,
        width: Width,
        op: AtomicOp,
        fetch: bool,
        a: u8,
        s: u8,
        r0: u8,
    ) {
        // LSE has no AND: clear the complement instead.
        let v = if op == AtomicOp::And {
            a64!(self.ops; mvn X(T1), X(s));
            T1
        } else {
            s
        };
        if !fetch {
            match (op, width) {
                (AtomicOp::Add, W64) => a64!(self.ops; stadd X(v), [X(a)]),
                (AtomicOp::Add, W32) => a64!(self.ops; stadd W(v), [X(a)]),
                (AtomicOp::Or, W64) => a64!(self.ops; stset X(v), [X(a)]),
                (AtomicOp::Or, W32) => a64!(self.ops; stset W(v), [X(a)]),
                (AtomicOp::And, W64) => a64!(self.ops; stclr X(v), [X(a)]),
                (AtomicOp::And, W32) => a64!(self.ops; stclr W(v), [X(a)]),
                (_, W64) => a64!(self.ops; steor X(v), [X(a)]),
                (_, W32) => a64!(self.ops; steor W(v), [X(a)]),
            }
            return;
        }
        // The old value lands in the source register (r0 for cmpxchg); W forms zero-extend.
        match (op, width) {
            (AtomicOp::Add, W64) => a64!(self.ops; ldaddal X(v), X(s), [X(a)]),
            (AtomicOp::Add, W32) => a64!(self.ops; ldaddal W(v), W(s), [X(a)]),
            (AtomicOp::Or, W64) => a64!(self.ops; ldsetal X(v), X(s), [X(a)]),
            (AtomicOp::Or, W32) => a64!(self.ops; ldsetal W(v), W(s), [X(a)]),
            (AtomicOp::And, W64) => a64!(self.ops; ldclral X(v), X(s), [X(a)]),
            (AtomicOp::And, W32) => a64!(self.ops; ldclral W(v), W(s), [X(a)]),
            (AtomicOp::Xor, W64) => a64!(self.ops; ldeoral X(v), X(s), [X(a)]),
            (AtomicOp::Xor, W32) => a64!(self.ops; ldeoral W(v), W(s), [X(a)]),
            (AtomicOp::Xchg, W64) => a64!(self.ops; swpal X(v), X(s), [X(a)]),
            (AtomicOp::Xchg, W32) => a64!(self.ops; swpal W(v), W(s), [X(a)]),
            // CAS compares with and returns into its first operand: r0 itself.
            (AtomicOp::Cmpxchg, W64) => a64!(self.ops; casal X(r0), X(s), [X(a)]),
            (AtomicOp::Cmpxchg, W32) => a64!(self.ops; casal W(r0), W(s), [X(a)]),
        }
    }

    /// Exclusive-monitor loops for CPUs without LSE. Fetching forms get release on the
    /// store plus a full barrier after, matching the ordering of the LSE `...AL` forms.
    pub(crate) fn atomic_llsc(
        &mut self,
        width: Width,
        op: AtomicOp,
        fetch: bool,
        a: u8,
        s: u8,
        r0: u8,
    ) {
        let (old, new, status) = (T1, T2, T3);
        if op == AtomicOp::Cmpxchg {
            if width == W64 {
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
        if width == W64 {
            a64!(self.ops; ldxr X(old), [X(a)]);
        } else {
            a64!(self.ops; ldxr W(old), [X(a)]);
        }
        let val = match (op, width) {
            (AtomicOp::Xchg, _) => s,
            (AtomicOp::Add, W64) => {
                a64!(self.ops; add X(new), X(old), X(s));
                new
            }
            (AtomicOp::Add, W32) => {
                a64!(self.ops; add W(new), W(old), W(s));
                new
            }
            (AtomicOp::Or, W64) => {
                a64!(self.ops; orr X(new), X(old), X(s));
                new
            }
            (AtomicOp::Or, W32) => {
                a64!(self.ops; orr W(new), W(old), W(s));
                new
            }
            (AtomicOp::And, W64) => {
                a64!(self.ops; and X(new), X(old), X(s));
                new
            }
            (AtomicOp::And, W32) => {
                a64!(self.ops; and W(new), W(old), W(s));
                new
            }
            (_, W64) => {
                a64!(self.ops; eor X(new), X(old), X(s));
                new
            }
            (_, W32) => {
                a64!(self.ops; eor W(new), W(old), W(s));
                new
            }
        };
        match (fetch, width) {
            (true, W64) => a64!(self.ops; stlxr W(status), X(val), [X(a)]),
            (true, W32) => a64!(self.ops; stlxr W(status), W(val), [X(a)]),
            (false, W64) => a64!(self.ops; stxr W(status), X(val), [X(a)]),
            (false, W32) => a64!(self.ops; stxr W(status), W(val), [X(a)]),
        }
        a64!(self.ops; cbnz W(status), <retry);
        if fetch {
            a64!(self.ops; dmb ish);
            if width == W64 {
                a64!(self.ops; mov X(s), X(old));
            } else {
                a64!(self.ops; mov W(s), W(old));
            }
        }
    }

    /// A conditional jump to instruction `target` from instruction `i`. A taken back-edge
    /// in budget mode charges the budget first: the inverted test skips the charge.
    pub(crate) fn jcond(
        &mut self,
        width: Width,
        cond: Cond,
        dst: Reg,
        src: Operand,
        target: usize,
    ) {
        let Some(test) = self.jtest(width, cond, dst, src) else {
            return;
        };
        let label = self.d.jump_label(target);
        if self.d.charge(target).is_some() {
            let skip = self.ops.new_dynamic_label();
            self.branch_if(invert(test), skip);
            self.charge_back_edge(target);
            self.b(label);
            a64!(self.ops; =>skip);
        } else {
            self.branch_if(test, label);
        }
    }

    /// A walk's entry (`packjit_frontend::walks`): the pointer's first copy into the walk's
    /// shadow (exact, it needs no clamp) and r10 into the walk's register.
    pub(crate) fn walk_entry_code(&mut self, k: usize) {
        let w = self.plan.access.walks[k];
        let p = self.map[w.ptr as usize];
        if let Some(s) = self.d.walk_shadow(k).map(|s| self.map[s as usize]) {
            a64!(self.ops; mov X(s), X(p));
        }
        if let Some(l) = self.walk_r10(&w) {
            a64!(self.ops; add XSP(l), XSP(FP), STACK_SIZE as u32);
        }
    }

    /// The pointer clamp a walk's back-edge lands on: it redoes the loop's test and, with
    /// no branch, gives the shadow the pointer or 0 (or, without a shadow, zeroes the
    /// pointer itself) when the loop should have ended (a mispredicted back-edge).
    pub(crate) fn walk_clamp_code(&mut self, k: usize) {
        let w = self.plan.access.walks[k];
        let p = self.map[w.ptr as usize];
        let shadow = self.d.walk_shadow(k).map(|s| self.map[s as usize]);
        if let Some(s) = shadow {
            // The copy from the sign of the pointer's distance to the bound, with no flags:
            // s = p & ((p - b) >> 63) is p while p < b and 0 from b on (`<=`: the complement
            // of the sign of b - p). Exact because walk pointers and bounds are user
            // addresses, far closer than 2^63 apart. Two instructions instead of one `csel`,
            // but still off the pointer's chain, free of the back-edge's flags (no compare
            // to redo after a budget charge), and much cheaper under qemu's translation.
            let b = match self.walk_r10(&w) {
                Some(l) => l,
                None => self.src(w.bound, T1),
            };
            if w.cont == Cond::Le {
                a64!(self.ops; sub X(T0), X(b), X(p) ; bic X(s), X(p), X(T0), asr 63);
            } else {
                a64!(self.ops; sub X(T0), X(p), X(b) ; and X(s), X(p), X(T0), asr 63);
            }
            return;
        }
        let Op::Jcond { dst, .. } = self.d.prog.insts[w.back_edge].op else {
            unreachable!("a walk's back-edge is a conditional jump");
        };
        // The back-edge compares two registers (`cmp dst, src`, never a compare-and-branch
        // form), and only its taken side reaches here: without a budget charge in between,
        // its flags are still live, and its own condition is "the loop goes on".
        let budget = self.d.mode.counts_budget();
        if budget {
            let b = match self.walk_r10(&w) {
                Some(l) => l,
                None => self.src(w.bound, T1),
            };
            a64!(self.ops; cmp X(p), X(b));
        }
        let ptr_first = budget || dst == w.ptr;
        let cc = match (w.cont, ptr_first) {
            (Cond::Ne, _) => Cc::Ne,
            (Cond::Lt, true) => Cc::Lo,
            (Cond::Lt, false) => Cc::Hi,
            (_, true) => Cc::Ls,
            (_, false) => Cc::Hs,
        };
        self.csel_or_zero(p, p, cc);
    }

    /// A guarded walk's entry test (`packjit_frontend::walks::Guard`), with no branch until
    /// its combined verdict: the context bounds via `ccmp`, then the walk's extent. On
    /// failure the loop's checked copy runs ([`Cold::Walk`]); on success the pointer is
    /// selected on the verdict's flags (itself architecturally, 0 under a mispredicted
    /// branch, from where a speculative walk stays in the unmapped first 64 KiB).
    pub(crate) fn walk_guard_code(&mut self, k: usize, g: Guard, fail: DynamicLabel) {
        let w = self.plan.access.walks[k];
        let p = self.map[w.ptr as usize];
        let b = self.src(w.bound, T1);
        let (end, bias, shift) = (g.end as u32, g.bias as u32, g.shift);
        match g.region {
            // q = p - ctx_start; len - end (hs when len >= end); then q <= len - end.
            GuardRegion::Context => a64!(self.ops
                ; sub X(C0), X(p), X(CTX_LO)
                ; subs X(C1), XSP(CTX_LEN), end
                ; ccmp X(C0), X(C1), 2, hs
            ),
            // q = p - (r10 - 512); the frame's length is 512 >= end.
            GuardRegion::Frame => {
                self.mov_imm(C1, (STACK_SIZE as u32 - end) as u64, W64);
                a64!(self.ops
                    ; sub X(C0), X(p), X(FP)
                    ; cmp X(C0), X(C1)
                );
            }
        }
        a64!(self.ops
            ; sub X(C1), X(C1), X(C0)
            ; sub X(T0), X(b), X(p)
        );
        if bias != 0 {
            a64!(self.ops; sub XSP(T0), XSP(T0), bias);
        }
        if shift != 0 {
            a64!(self.ops; lsr X(C1), X(C1), shift);
            if w.cont == Cond::Ne {
                a64!(self.ops; ror X(T0), X(T0), shift);
            } else {
                a64!(self.ops; lsr X(T0), X(T0), shift);
            }
        }
        a64!(self.ops; ccmp X(T0), X(C1), 2, ls);
        self.branch_if(Test::Flags(Cc::Hi), fail);
        if self.d.clamp {
            a64!(self.ops; csel X(p), X(p), xzr, ls);
        }
    }

    /// The register a walk bounded by r10 keeps r10 in (`Walk::limit`, set on entry), so
    /// its back-edge compares with no `add` per iteration; `None` elsewhere (and in a
    /// guarded walk's checked copy, which is entered before the entry sets it).
    fn walk_r10(&self, w: &Walk) -> Option<u8> {
        (w.bound == R10 && !self.d.in_copy())
            .then_some(w.limit)
            .flatten()
            .map(|l| self.map[l as usize])
    }

    /// [`Self::src`] for a conditional jump's operands: r10 from the walk's register at a
    /// walk's back-edge ([`Self::walk_r10`]).
    fn jump_src(&mut self, r: Reg, tmp: u8) -> u8 {
        if r == R10 {
            let walk = self.plan.access.walk_of_back_edge(self.d.cur);
            if let Some(l) = walk.and_then(|k| self.walk_r10(&self.plan.access.walks[k])) {
                return l;
            }
        }
        self.src(r, tmp)
    }

    /// `dst = cc ? src : 0`.
    fn csel_or_zero(&mut self, dst: u8, src: u8, cc: Cc) {
        match cc {
            Cc::Eq => a64!(self.ops; csel X(dst), X(src), xzr, eq),
            Cc::Ne => a64!(self.ops; csel X(dst), X(src), xzr, ne),
            Cc::Hs => a64!(self.ops; csel X(dst), X(src), xzr, hs),
            Cc::Lo => a64!(self.ops; csel X(dst), X(src), xzr, lo),
            Cc::Hi => a64!(self.ops; csel X(dst), X(src), xzr, hi),
            Cc::Ls => a64!(self.ops; csel X(dst), X(src), xzr, ls),
            Cc::Ge => a64!(self.ops; csel X(dst), X(src), xzr, ge),
            Cc::Lt => a64!(self.ops; csel X(dst), X(src), xzr, lt),
            Cc::Gt => a64!(self.ops; csel X(dst), X(src), xzr, gt),
            Cc::Le => a64!(self.ops; csel X(dst), X(src), xzr, le),
        }
    }

    /// Sets flags (or picks a compare-and-branch form) for a conditional jump; `None` when
    /// the jump can never be taken.
    fn jtest(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand) -> Option<Test> {
        let d = self.jump_src(dst, T0);
        let imm = match src {
            Operand::Reg(r) => {
                let s = self.jump_src(r, T1);
                return Some(self.jcmp_reg(width, cond, d, s));
            }
            Operand::Imm(imm) if self.d.mode.blind_key.is_some() => {
                self.imm32(T1, imm, width);
                return Some(self.jcmp_reg(width, cond, d, T1));
            }
            Operand::Imm(imm) => imm,
        };
        let v = imm as i64;
        let bits = if width == W64 {
            v as u64
        } else {
            imm as u32 as u64
        };
        Some(match cond {
            Cond::Eq | Cond::Ne if v == 0 => Test::Zero {
                reg: d,
                width,
                zero: cond == Cond::Eq,
            },
            // x & 0 is never non-zero: the branch is never taken.
            Cond::Set if bits == 0 => return None,
            Cond::Set if bits.is_power_of_two() => Test::Bit {
                reg: d,
                bit: bits.trailing_zeros(),
                set: true,
            },
            Cond::Set => {
                if logical_ok(bits, width) {
                    if width == W64 {
                        a64!(self.ops; tst X(d), bits);
                    } else {
                        a64!(self.ops; tst W(d), bits as u32);
                    }
                } else {
                    self.mov_imm(T1, bits, width);
                    if width == W64 {
                        a64!(self.ops; tst X(d), X(T1));
                    } else {
                        a64!(self.ops; tst W(d), W(T1));
                    }
                }
                Test::Flags(Cc::Ne)
            }
            _ => {
                self.cmp_imm(d, v, width);
                Test::Flags(Cc::from_bpf(cond))
            }
        })
    }

    fn jcmp_reg(&mut self, width: Width, cond: Cond, d: u8, s: u8) -> Test {
        match (cond, width) {
            (Cond::Set, W64) => a64!(self.ops; tst X(d), X(s)),
            (Cond::Set, W32) => a64!(self.ops; tst W(d), W(s)),
            (_, W64) => a64!(self.ops; cmp X(d), X(s)),
            (_, W32) => a64!(self.ops; cmp W(d), W(s)),
        }
        Test::Flags(Cc::from_bpf(cond))
    }

    /// `callx reg`: compare the id in the register against each registered helper and call
    /// the match; no match stops the program with `PJ_STOP_UNKNOWN_CALLX` (stop_addr = id).
    pub(crate) fn callx(&mut self, reg: Reg) {
        let r = self.src(reg, T0);
        let plan = callx_plan(self.helpers);
        let call = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        let unknown = self.ops.new_dynamic_label();
        // Compares are on the full 64-bit register: 0x1_0000_0005 is not helper 5.
        for h in &plan.compared {
            self.cmp_imm_u64(r, h.id as u64);
            a64!(self.ops; b.ne >next);
            match helper_lowering(h) {
                HelperLowering::Call(addr) => {
                    self.mov_imm(T2, addr, W64);
                    a64!(self.ops; b =>call);
                }
                inline => {
                    self.inline_helper(inline);
                    a64!(self.ops; b =>done);
                }
            }
            a64!(self.ops; next:);
        }
        let table = self.ops.new_dynamic_label();
        if let Some(t) = &plan.table {
            // Unsigned bound (a huge or "negative" id fails it), then the address, 0 for a
            // hole.
            self.cmp_imm_u64(r, t.len() as u64);
            a64!(self.ops
                ; b.hs =>unknown
                ; adr X(T2), =>table
                ; ldr X(T2), [X(T2), X(r), lsl 3]
                ; cbnz X(T2), =>call
            );
        }
        // No helper has this id: stop at this pc with the id as the address.
        a64!(self.ops; =>unknown);
        if r != T0 {
            a64!(self.ops; mov X(T0), X(r));
        }
        let pc = self.d.prog.insts[self.d.cur].pc as u64;
        self.mov_imm(C1, PJ_STOP_UNKNOWN_CALLX as u64, W64);
        self.mov_imm(C2, pc, W64);
        self.b(self.stop);
        if let Some(t) = &plan.table {
            // Data after the unconditional branch, never executed: 8-byte aligned for the
            // load (the padding is `udf #0`); counted as data, not instructions.
            let start = self.off();
            self.ops.align(8, 0);
            a64!(self.ops; =>table);
            for &addr in t {
                self.ops.push_u64(addr);
            }
            self.data.push(start..self.off());
        }
        a64!(self.ops; =>call ; blr X(T2) ; mov X(self.map[0]), X(RET) ; =>done);
    }

    /// The body of an inlined helper (never [`HelperLowering::Call`]); r1-r5 stay intact.
    pub(crate) fn inline_helper(&mut self, how: HelperLowering) {
        let r0 = self.map[0];
        match how {
            HelperLowering::Call(_) => unreachable!("calls are emitted by the caller"),
            HelperLowering::RseqCpuId { offset } => {
                // mrs x9, tpidr_el0: glibc's thread pointer; the rseq area sits at a fixed
                // offset from it, and the kernel rewrites its cpu_id after every migration.
                self.sysreg_read(T0, MRS_TPIDR_EL0);
                if (-256..256).contains(&offset) {
                    a64!(self.ops; ldur W(r0), [X(T0), offset as i32]);
                } else if offset >= 0 && offset % 4 == 0 && offset < 4 * 4096 {
                    a64!(self.ops; ldr W(r0), [X(T0), offset as u32]);
                } else {
                    self.mov_imm(T1, offset as u64, W64);
                    a64!(self.ops; ldr W(r0), [X(T0), X(T1)]);
                }
            }
            HelperLowering::PerCpuLookup { table } => self.inline_percpu_lookup(table),
            HelperLowering::CounterClock { scale } => {
                // isb first, as the kernel's counter read: without it the counter may be
                // sampled before earlier instructions (a time stamp taken "too early").
                a64!(self.ops; isb);
                self.sysreg_read(T0, MRS_CNTVCT_EL0);
                self.mov_imm(T1, scale, W64);
                a64!(self.ops
                    ; ldr X(T2), [X(T1), PJ_CLOCK_MULT_FRAC as u32]
                    ; umulh X(T3), X(T0), X(T2)
                    ; ldr X(T2), [X(T1), PJ_CLOCK_MULT_INT as u32]
                    ; madd X(T3), X(T0), X(T2), X(T3)
                    ; ldr X(T2), [X(T1), PJ_CLOCK_OFFSET as u32]
                    ; add X(r0), X(T3), X(T2)
                );
            }
        }
    }

    /// Per-CPU array lookup (r1 = x0 array id, r2 = x1 element index) against the host's
    /// table at `table`: unsigned bounds checks on the id, the index and the CPU (each
    /// failing to r0 = 0), then `base + cpu * slot_size + index * value_size` with two
    /// `madd`s. The CPU is the rseq `cpu_id` through `tpidr_el0`, like the inlined helper 8.
    fn inline_percpu_lookup(&mut self, table: u64) {
        let (r0, r1, r2) = (self.map[0], self.map[1], self.map[2]);
        let null = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        self.mov_imm(T1, table, W64);
        a64!(self.ops
            ; ldr X(T0), [X(T1), PJ_PERCPU_COUNT as u32]
            ; cmp X(r1), X(T0)
            ; b.hs =>null
        );
        self.mov_imm(T2, PJ_PERCPU_ARRAY_SIZE as u64, W64);
        a64!(self.ops
            ; madd X(T2), X(r1), X(T2), X(T1)
            ; add XSP(T2), XSP(T2), PJ_PERCPU_ARRAYS as u32
            ; ldr X(T0), [X(T2), PJ_PERCPU_ENTRIES as u32]
            ; cmp X(r2), X(T0)
            ; b.hs =>null
            ; ldr X(T0), [X(T1), PJ_PERCPU_CPU_ID_OFFSET as u32]
        );
        self.sysreg_read(T3, MRS_TPIDR_EL0);
        a64!(self.ops
            ; ldr W(T3), [X(T3), X(T0)]
            ; ldr X(T0), [X(T2), PJ_PERCPU_CPUS as u32]
            ; cmp X(T3), X(T0)
            ; b.hs =>null
            ; ldr X(T0), [X(T2), PJ_PERCPU_SLOT_SIZE as u32]
            ; ldr X(T4), [X(T2), PJ_PERCPU_BASE as u32]
            ; madd X(T4), X(T3), X(T0), X(T4)
            ; ldr X(T0), [X(T2), PJ_PERCPU_VALUE_SIZE as u32]
            ; madd X(r0), X(r2), X(T0), X(T4)
            ; b =>done
            ; =>null
            ; mov X(r0), xzr
            ; =>done
        );
    }

    /// The per-CPU address instruction: `dst = src + cpu * slot_size` of array `array` in the
    /// table of the `PJ_HELPER_PERCPU_OFFSET` entry, `dst = src` when `array >= count` or
    /// `cpu >= cpus` (so the offset never leaves the registered area). The CPU comes the way
    /// helper 8 does: the rseq load through `tpidr_el0`, or a call with the caller-saved BPF
    /// registers (r0 = x7, r1–r5 = x0–x4) stored around it, so nothing but `dst` changes.
    fn mov_percpu(&mut self, dst: Reg, src: Reg, array: u32) -> Result<(), CompileError> {
        let entry = |s: &Self, id: u32| {
            s.helpers
                .iter()
                .find(|h| h.id == id)
                .copied()
                .ok_or_else(|| {
                    s.err(
                        ErrorKind::UnknownHelper,
                        format!("per-CPU mov needs helper id {id:#x} in the helper table"),
                    )
                })
        };
        let table = entry(self, PJ_HELPER_PERCPU_OFFSET)?.addr;
        let cpu = entry(self, PJ_HELPER_GET_SMP_PROCESSOR_ID)?;
        match helper_lowering(&cpu) {
            HelperLowering::RseqCpuId { offset } => {
                self.sysreg_read(T0, MRS_TPIDR_EL0);
                if (-256..256).contains(&offset) {
                    a64!(self.ops; ldur W(T4), [X(T0), offset as i32]);
                } else {
                    self.mov_imm(T1, offset as u64, W64);
                    a64!(self.ops; ldr W(T4), [X(T0), X(T1)]);
                }
            }
            HelperLowering::Call(addr) => {
                // 48 bytes keep sp 16-byte aligned, as AAPCS64 requires at the call.
                let r0 = self.map[0];
                a64!(self.ops
                    ; stp x0, x1, [sp, -48]!
                    ; stp x2, x3, [sp, 16]
                    ; stp x4, X(r0), [sp, 32]
                );
                self.mov_imm(T2, addr, W64);
                a64!(self.ops
                    ; blr X(T2)
                    ; mov X(T4), X(RET)
                    ; ldp x4, X(r0), [sp, 32]
                    ; ldp x2, x3, [sp, 16]
                    ; ldp x0, x1, [sp], 48
                );
            }
            _ => {
                return Err(self.err(
                    ErrorKind::Unsupported,
                    "per-CPU mov: helper 8 must be a call or the inline rseq load",
                ))
            }
        }
        // cpu in T4; the id is the program's constant: blinded like any immediate (`imm`
        // uses T3), and the array's address is computed at run time.
        let done = self.ops.new_dynamic_label();
        self.imm(T2, array as u64, W32);
        self.mov_imm(T1, table, W64);
        a64!(self.ops
            ; mov X(T3), xzr
            ; ldr X(T0), [X(T1), PJ_PERCPU_COUNT as u32]
            ; cmp X(T0), X(T2)
            ; b.ls =>done
        );
        self.mov_imm(T0, PJ_PERCPU_ARRAY_SIZE as u64, W64);
        a64!(self.ops
            ; madd X(T1), X(T2), X(T0), X(T1)
            ; ldr X(T0), [X(T1), (PJ_PERCPU_ARRAYS + PJ_PERCPU_CPUS) as u32]
            ; cmp X(T4), X(T0)
            ; b.hs =>done
            ; ldr X(T0), [X(T1), (PJ_PERCPU_ARRAYS + PJ_PERCPU_SLOT_SIZE) as u32]
            ; mul X(T3), X(T4), X(T0)
            ; =>done
        );
        let s = self.src(src, T0);
        let d = self.map[dst as usize];
        a64!(self.ops; add X(d), X(s), X(T3));
        Ok(())
    }

    /// `mrs Xt, <sysreg>`: `base` is the MRS encoding with Rt = 0.
    fn sysreg_read(&mut self, rt: u8, base: u32) {
        a64!(self.ops; .u32 base | rt as u32);
    }

    // ------------------------------------------------------------ budget

    /// Charges the current instruction's taken back-edge to `target`, if it is one.
    pub(crate) fn charge_back_edge(&mut self, target: usize) {
        if let Some(c) = self.d.charge(target) {
            self.charge(c);
        }
    }

    /// `budget -= c`, or stop at this pc with the budget untouched when `c` exceeds it.
    /// Hot path: SUBS + B.LO (not taken); the cold side adds `c` back.
    pub(crate) fn charge(&mut self, c: u64) {
        if let Some((imm, false)) = fits_imm12(c as i64) {
            a64!(self.ops; subs X(BUDGET), XSP(BUDGET), imm);
        } else {
            self.mov_imm(C0, c, W64);
            a64!(self.ops; subs X(BUDGET), X(BUDGET), X(C0));
        }
        let label = self.ops.new_dynamic_label();
        self.branch_if(Test::Flags(Cc::Lo), label);
        self.d.queue(Cold::Budget {
            inst: self.d.cur,
            label,
            charge: c,
        });
    }

    // ------------------------------------------------------------ sandbox checks

    /// Leaves in x9 the address of a `size`-byte access at `base + off`, checked against the
    /// context inline; other regions are tried out of line (see [`Cold::Access`]).
    ///
    /// ```text
    ///   add  x9, xb, #off          ; address (none for off = 0: xb is used in place)
    ///   sub  x14, x9, x23          ; t = addr - ctx_start (wraps when below)
    ///   subs x14, x24, x14         ; len - t: carry iff t <= len
    ///   ccmp x14, #size, #0, hs    ; carry iff len - t >= size (else flags = fail)
    ///   b.lo cold                  ; not in the context
    ///   csel x9, x9, xzr, hs       ; Spectre v1: a mispredicted b.lo sees address 0
    /// resume:
    /// ```
    ///
    /// The comparison is exact for every 64-bit address: `t <= len` rules out addresses
    /// below the context (t wraps past any length) before `len - t >= size` is tested.
    pub(crate) fn check_access(&mut self, size: Size, write: bool, base: Reg, off: i16) -> u8 {
        let b = self.src(base, T0);
        // The register holding the address: the base itself for offset 0 (the CSEL then
        // writes x9, and the out-of-line side copies it first), else x9.
        let addr = if off == 0 { b } else { T0 };
        if off != 0 {
            if let Some((imm, false)) = fits_imm12(off as i64) {
                a64!(self.ops; add XSP(T0), XSP(b), imm);
            } else if let Some((imm, false)) = fits_imm12(-(off as i64)) {
                a64!(self.ops; sub XSP(T0), XSP(b), imm);
            } else {
                self.mov_imm(C0, off as i64 as u64, W64);
                a64!(self.ops; add X(T0), X(b), X(C0));
            }
        }
        let s = size.bytes();
        let label = self.ops.new_dynamic_label();
        let resume = self.ops.new_dynamic_label();
        let check = self.plan.access.check(self.d.cur);
        let stack_first = self.plan.block > 0 && check == AccessCheck::Stack;
        match check {
            AccessCheck::CtxConst { end } if end < 4096 => {
                // The base is the context start plus a constant (r1 = env.ctx_start at
                // entry): in the context iff end <= len.
                a64!(self.ops; cmp XSP(CTX_LEN), end);
                self.branch_if(Test::Flags(Cc::Lo), label);
                self.clamp_to(T0, addr, Cc::Hs);
            }
            _ if stack_first => {
                self.stack_check(addr, s);
                self.branch_if(Test::Flags(Cc::Hi), label);
                self.clamp_to(T0, addr, Cc::Ls);
            }
            _ => {
                self.ctx_check(addr, s);
                self.branch_if(Test::Flags(Cc::Lo), label);
                self.clamp_to(T0, addr, Cc::Hs);
            }
        }
        a64!(self.ops; =>resume);
        self.d.queue(Cold::Access {
            inst: self.d.cur,
            label,
            resume,
            size: s,
            write,
            site: addr,
        });
        // The clamped address is in x9; without the clamp (measurement only) the access
        // goes to the checked register itself, as it would with no clamp to make.
        if self.d.clamp {
            T0
        } else {
            addr
        }
    }

    /// `dst = ok ? src : 0` (the Spectre-v1 clamp); nothing when the clamp is off for
    /// measurement (the access then uses `src`, see `check_access`).
    fn clamp_to(&mut self, dst: u8, src: u8, ok: Cc) {
        if !self.d.clamp {
            return;
        }
        match ok {
            Cc::Hs => a64!(self.ops; csel X(dst), X(src), xzr, hs),
            _ => a64!(self.ops; csel X(dst), X(src), xzr, ls),
        }
    }

    /// The widened check of group `gi`, `[base + lo, base + hi)` in one region, then the
    /// base itself clamped in place: on the architectural path it keeps its value (the
    /// check passed), under a mispredicted branch it becomes 0, so no member can reach
    /// memory out of bounds. On failure the group's checked copy runs instead.
    pub(crate) fn group_check_code(&mut self, gi: usize, label: DynamicLabel) {
        let g = &self.plan.access.groups[gi];
        let (b, lo, span, check) = (
            self.map[g.base as usize],
            g.lo,
            (g.hi - g.lo as i32) as u32,
            g.check,
        );
        // The group's first address (the length test of `CtxConst` needs none).
        let addr = if lo == 0 || matches!(check, AccessCheck::CtxConst { .. }) {
            b
        } else {
            a64!(self.ops; add XSP(T0), XSP(b), lo as u32);
            T0
        };
        match check {
            AccessCheck::CtxConst { end } => {
                if end < 4096 {
                    a64!(self.ops; cmp XSP(CTX_LEN), end);
                } else {
                    self.mov_imm(C1, end.into(), W64);
                    a64!(self.ops; cmp X(CTX_LEN), X(C1));
                }
                self.branch_if(Test::Flags(Cc::Lo), label);
                self.clamp_to(b, b, Cc::Hs);
            }
            AccessCheck::Stack if span <= self.plan.block => {
                let block = self.plan.block;
                a64!(self.ops
                    ; sub X(C0), X(addr), X(STACK_LO)
                    ; cmp XSP(C0), block - span
                );
                self.branch_if(Test::Flags(Cc::Hi), label);
                self.clamp_to(b, b, Cc::Ls);
            }
            _ => {
                // The context (a sufficient test for any group: all members inside it pass).
                if span < 32 {
                    self.ctx_check(addr, span);
                } else {
                    self.mov_imm(C1, span as u64, W64);
                    a64!(self.ops
                        ; sub X(C0), X(addr), X(CTX_LO)
                        ; subs X(C0), X(CTX_LEN), X(C0)
                        ; ccmp X(C0), X(C1), 0, hs
                    );
                }
                self.branch_if(Test::Flags(Cc::Lo), label);
                self.clamp_to(b, b, Cc::Hs);
            }
        }
    }

    /// In a re-entered group's checked copy: the base itself from the member's clamped
    /// address (x9 = base + off, or 0 under a mispredicted check), so a jump that skips the
    /// group's check later never sees an unchecked base, also under misspeculation.
    fn clamp_reentered_base(&mut self, base: Reg, off: i16) {
        if !self.d.clamps_reentered_base() {
            return;
        }
        // Members' offsets are in [0, 2048) (see `ranges::group_accesses`).
        a64!(self.ops; sub XSP(self.map[base as usize]), XSP(T0), off as u32);
    }

    /// Flags for "x9 .. x9 + size is inside the context": `hs` when it is.
    fn ctx_check(&mut self, addr: u8, size: u32) {
        a64!(self.ops
            ; sub X(C0), X(addr), X(CTX_LO)
            ; subs X(C0), X(CTX_LEN), X(C0)
            ; ccmp X(C0), size, 0, hs
        );
    }

    /// Flags for "x9 .. x9 + size is inside the stack block": `ls` when it is. `block - size`
    /// fits CMP's imm12 (block <= 4096, size >= 1); an address below the block wraps past it.
    fn stack_check(&mut self, addr: u8, size: u32) {
        let block = self.plan.block;
        a64!(self.ops
            ; sub X(C0), X(addr), X(STACK_LO)
            ; cmp XSP(C0), block - size
        );
    }

    /// The per-program check of an access whose inline test failed: the context, the stack
    /// block (when the program has one), then `env.regions`. In: x9 = address, C1 = the
    /// access in bits 32..41 (size in 32..40, write in bit 40), C2 = pc. Returns with x9
    /// clamped on success; on failure it stops (out of bounds, C1 gets its kind). Uses x6,
    /// x8, x10, x12, x14, x17: none holds a value across a checked access.
    ///
    /// Each region's test leaves `hs` exactly when `[x9, +size)` is inside
    /// (`len - (x9 - start) >= size`, the subtraction's borrow folded in by `ccmp`), and
    /// every way to `found` is a `b.hs` on those flags: a mispredicted one clamps to 0.
    pub(crate) fn region_scan(&mut self) {
        let (scan, stop) = (self.region_scan, self.stop);
        a64!(self.ops
            ; =>scan
            ; ubfx x10, X(C1), 32, 8
            ; sub x14, X(T0), X(CTX_LO)
            ; subs x17, X(CTX_LEN), x14
            ; ccmp x17, x10, 0, hs
            ; b.hs >found
        );
        if self.plan.block > 0 {
            // The block is at most a few KiB (movz's 16 bits).
            let block = self.plan.block;
            a64!(self.ops
                ; sub x14, X(T0), X(STACK_LO)
                ; movz x17, block
                ; subs x17, x17, x14
                ; ccmp x17, x10, 0, hs
                ; b.hs >found
            );
        }
        a64!(self.ops
            ; ldp x6, x8, [X(ENV), PJ_ENV_REGIONS]
            ; cbz x8, >fail
            ; next:
            ; ldp x14, x17, [x6]
            ; ldr x12, [x6, 16]
            ; add x6, x6, 24
            ; sub x14, X(T0), x14
            ; subs x17, x17, x14
            ; ccmp x17, x10, 0, hs
            ; b.lo >skip
            // A read fits any region; a write needs PJ_REGION_WRITABLE (bit 0).
            ; tbz X(C1), 40, >found
            ; tbnz x12, 0, >found
            ; skip:
            ; subs x8, x8, 1
            ; b.ne <next
            ; fail:
            ; orr XSP(C1), X(C1), PJ_STOP_OUT_OF_BOUNDS as u64
            ; b =>stop
            ; found:
            // Flags are the deciding ccmp's: a mispredicted branch here clamps to 0.
            ; csel X(T0), X(T0), xzr, hs
            ; ret
        );
    }
}

impl<'a> Lowering<'a> for Codegen<'a> {
    type AccessSite = u8;
    type IsaCold = Infallible;

    fn driver(&mut self) -> &mut Driver<'a, u8, Infallible> {
        &mut self.d
    }

    fn position(&self) -> usize {
        self.off()
    }

    fn new_label(&mut self) -> DynamicLabel {
        self.ops.new_dynamic_label()
    }

    fn bind(&mut self, label: DynamicLabel) {
        a64!(self.ops; =>label);
    }

    fn jump(&mut self, label: DynamicLabel) {
        self.b(label);
    }

    fn prologue(&mut self, func: usize) {
        self.function_prologue(func);
    }

    fn epilogue(&mut self, func: usize) {
        self.function_epilogue(func);
    }

    fn enter_function(&mut self, func: usize) {
        self.map = self.plan.frames[func].map;
    }

    fn instruction(&mut self, func: usize, i: usize, inst: &Inst) -> Result<(), CompileError> {
        self.inst(func, i, inst)
    }

    fn group_check(&mut self, group: usize, fail: DynamicLabel) {
        self.group_check_code(group, fail);
    }

    fn walk_guard(&mut self, walk: usize, guard: Guard, fail: DynamicLabel) {
        self.walk_guard_code(walk, guard, fail);
    }

    fn walk_entry(&mut self, walk: usize) {
        self.walk_entry_code(walk);
    }

    fn walk_clamp(&mut self, walk: usize) {
        self.walk_clamp_code(walk);
    }

    /// Everything but the address and the descriptor is the shared check's: a checked
    /// access's cold side is six to eight instructions.
    fn access_slow_path(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        resume: DynamicLabel,
        size: u32,
        write: bool,
        addr: u8,
    ) -> Result<(), CompileError> {
        a64!(self.ops; =>label);
        if addr != T0 {
            a64!(self.ops; mov X(T0), X(addr));
        }
        let access = size | if write { PJ_ACCESS_WRITE } else { 0 };
        let pc = self.d.prog.insts[inst].pc as u64;
        a64!(self.ops; movz X(C1), access, lsl 32);
        self.mov_imm(C2, pc, W64);
        // The check returns only on success (x9 clamped), so x30 is kept in x5 for
        // functions that did not save their link register.
        let scan = self.region_scan;
        self.uses_region_scan = true;
        a64!(self.ops; mov x5, x30);
        self.site(scan, Reach::Jump);
        a64!(self.ops; bl =>scan ; mov x30, x5);
        self.b(resume);
        Ok(())
    }

    /// The charge is added back, so the budget a stop reports is what was left.
    fn budget_stop(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        charge: u64,
    ) -> Result<(), CompileError> {
        a64!(self.ops; =>label);
        if let Some((imm, false)) = fits_imm12(charge as i64) {
            a64!(self.ops; add XSP(BUDGET), XSP(BUDGET), imm);
        } else {
            self.mov_imm(C0, charge, W64);
            a64!(self.ops; add X(BUDGET), X(BUDGET), X(C0));
        }
        let pc = self.d.prog.insts[inst].pc as u64;
        self.mov_imm(C2, pc, W64);
        self.b(self.stop_budget);
        Ok(())
    }

    fn isa_cold(&mut self, cold: Infallible) -> Result<(), CompileError> {
        match cold {}
    }

    fn program_end(&mut self) -> Result<(), CompileError> {
        if self.uses_region_scan {
            self.region_scan();
        }
        self.stop_paths();
        Ok(())
    }
}

impl<'a> Pass<'a> for Codegen<'a> {
    type Form = Form;

    fn branch_checks(&mut self) -> Result<Option<Vec<BranchCheck<Form>>>, CompileError> {
        let checks = Codegen::branch_checks(self)?;
        Ok((!checks.is_empty()).then_some(checks))
    }

    /// Conditional sites are emitted short unless a previous pass made them long, and a
    /// long one leaves no conditional site behind (its inverted test skips a plain B): every
    /// site recorded here is a short one.
    fn emitted_forms(&self) -> Vec<(usize, Form)> {
        let short = self.sites.iter().filter_map(|s| s.cond);
        short.map(|site| (site as usize, Form::Short)).collect()
    }

    fn resolve(&self, label: DynamicLabel) -> Option<usize> {
        self.ops.labels().resolve_dynamic(label).ok().map(|o| o.0)
    }

    fn finish(self) -> Result<Assembled, CompileError> {
        let data = self.data;
        let bytes = scratch::assembled(self.ops).map_err(|err| {
            CompileError::new(
                ErrorKind::Encoding,
                format!("arm64 relocation failed: {err}"),
            )
        })?;
        let data_bytes: usize = data.iter().map(|r| r.len()).sum();
        let native_insns = (bytes.len() - data_bytes) / 4;
        Ok(Assembled {
            bytes,
            native_insns,
            data,
        })
    }

    fn unreachable_branch(c: &BranchCheck<Form>) -> CompileError {
        CompileError::new(
            ErrorKind::Encoding,
            format!("conditional branch spans {} bytes of arm64 code", c.disp),
        )
    }
}
