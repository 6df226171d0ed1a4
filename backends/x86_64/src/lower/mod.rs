//! eBPF → x86-64 lowering: one short function per instruction class.
//!
//! Layout of the emitted code: the functions in bytecode order (the entry first, at offset
//! 0), each `prologue, body, epilogue`; then the out-of-line stop stubs and, in sandbox mode,
//! the shared region-table scan. All branches are PC-relative and helpers are called through
//! absolute addresses in r11, so the bytes run at any address.

use crate::encode::{Cc, Enc, Form, Gpr, Label, Sz, REL32_GROWTH, TYPICAL_HOT_BYTES};
use crate::frame::{plan, Plan};
use crate::regs::*;
use crate::{FEATURE_BMI2, FEATURE_MOVBE};
use dynasmrt::{dynasm, DynasmApi};
use packjit_frontend::analysis::{
    back_edge_charge, blinding_mask, callx_plan, checked_access, helper_lowering,
    instruction_labels, CodegenMode, EmitCapacity, HelperLowering, CALL_CHARGE,
};
use packjit_frontend::cold::ColdPlacement;
use packjit_frontend::ranges::{plan_accesses, AccessCheck};
use packjit_frontend::relax::{Relaxation, Settled};
use packjit_frontend::scratch::{self, Reused};
use packjit_frontend::walks::{Guard, GuardRegion, Walk};
use packjit_frontend::{
    AluOp, AtomicOp, Cond, EndKind, Inst, Op, Operand, Program, Reg, Size, Width, MAX_INSNS,
    STACK_SIZE,
};
use packjit_plugin_api::abi::*;
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::ops::RangeInclusive;

/// An env field offset as a `disp8`, for `dynasm!` text: dynasm sizes a displacement only
/// when it is a literal, so the env offsets (Rust constants) are passed as `BYTE`s, and
/// this refuses (at compile time) any that would not fit.
const fn env8(off: i32) -> i8 {
    assert!(off >= -128 && off < 128, "env offset beyond disp8");
    off as i8
}

pub(crate) const REGION_COUNT8: i8 = env8(PJ_ENV_REGION_COUNT);
pub(crate) const STOP_KIND8: i8 = env8(PJ_ENV_STOP_KIND);
pub(crate) const STOP_ACCESS8: i8 = env8(PJ_ENV_STOP_ACCESS);
pub(crate) const STOP_PC8: i8 = env8(PJ_ENV_STOP_PC);
pub(crate) const STOP_ADDR8: i8 = env8(PJ_ENV_STOP_ADDR);
pub(crate) const ENTRY_SP8: i8 = env8(PJ_ENV_ENTRY_SP);
pub(crate) const CTX_START8: i8 = env8(PJ_ENV_CTX_START);
pub(crate) const CTX_END8: i8 = env8(PJ_ENV_CTX_END);
pub(crate) const STACK_START8: i8 = env8(PJ_ENV_STACK_START);
pub(crate) const STACK_END8: i8 = env8(PJ_ENV_STACK_END);

// The `dynasm!` text names the register map's env (r12) and scratch registers (r9–r11).
const _: () = assert!(ENV == 12 && T9 == 9 && T10 == 10 && T11 == 11);

/// Result of [`emit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// Machine code; offset 0 is the entry.
    pub bytes: Reused<u8>,
    /// x86-64 instructions emitted.
    pub native_insns: usize,
    /// Byte offset of each eBPF instruction's code (indexed like `Program::insts`).
    pub inst_offsets: Reused<u32>,
    /// Emission passes needed to settle the branch forms.
    pub passes: usize,
    /// `(instruction, native offset)`, sorted: jumps to that instruction that land elsewhere
    /// than its code's start. A back-edge that skips a re-entered check group's check
    /// (`ranges::reentries`) lands past the check; a walk's back-edge (`walks`) lands on the
    /// pointer clamp before the head. A loop runs from its back-edge's landing.
    pub landings: Vec<(usize, usize)>,
}

pub use packjit_frontend::analysis::EmitOptions;

/// Emits a decoded program.
pub fn emit(
    prog: &Program,
    helpers: &[HelperEntry],
    mode: &CodegenMode,
) -> Result<Emitted, CompileError> {
    emit_with(prog, helpers, mode, EmitOptions::default())
}

/// [`emit`] with measurement switches (benches only, see [`EmitOptions`]).
pub fn emit_with(
    prog: &Program,
    helpers: &[HelperEntry],
    mode: &CodegenMode,
    opts: EmitOptions,
) -> Result<Emitted, CompileError> {
    let mut plan = plan(prog, mode);
    if mode.sandboxed() {
        plan.access = plan_accesses(prog, opts.group_checks);
    }
    // Branches start as rel8; the shared relaxation driver grows those out of reach to
    // rel32 and the code is emitted again (two passes at most in practice).
    let mut relax = Relaxation::new(Form::Rel32, REL32_GROWTH, 0);
    // `jcc rel32` reaches ±2 GiB: no island is ever due, cold code stays after its function.
    let mut islands = ColdPlacement::new(usize::MAX, TYPICAL_HOT_BYTES);
    loop {
        relax.begin_pass();
        islands.begin_pass(relax.passes());
        let forms = relax.forms().to_vec();
        let mut em = Emitter::new(prog, helpers, mode, &plan, forms, islands);
        em.clamp = opts.spectre_clamp;
        em.program()?;
        islands = em.islands;
        // Usual case: every branch reaches in the form it was emitted in, which is exactly
        // when `settle` would say `Done`; skip building its inputs.
        let fit =
            em.e.branches_fit()
                .map_err(|m| CompileError::new(ErrorKind::Encoding, m))?;
        let settled = if fit {
            Settled::Done
        } else {
            let checks =
                em.e.branch_checks()
                    .map_err(|m| CompileError::new(ErrorKind::Encoding, m))?;
            // Later passes start from the forms this one emitted (a guessed or far backward
            // rel32 stays one).
            for (site, form) in em.e.emitted_forms() {
                relax.form(site, form);
            }
            relax.settle(&checks, |c| {
                CompileError::new(
                    ErrorKind::Encoding,
                    format!("branch displacement {} exceeds rel32", c.disp),
                )
            })?
        };
        match settled {
            Settled::Done => {
                let passes = relax.passes();
                let native_insns = em.e.insns;
                let groups = em.plan.access.groups.iter().zip(&em.group_resume);
                let walks = em.plan.access.walks.iter().zip(&em.walk_clamps);
                let mut landings: Vec<(usize, usize)> = groups
                    .filter_map(|(g, l)| Some((g.first, em.e.offset_of((*l)?)?)))
                    .chain(walks.filter_map(|(w, &l)| Some((w.head, em.e.offset_of(l)?))))
                    .collect();
                landings.sort_unstable();
                let offsets = std::mem::take(&mut em.inst_offsets);
                let bytes =
                    em.e.finish()
                        .map_err(|m| CompileError::new(ErrorKind::Internal, m))?;
                return Ok(Emitted {
                    native_insns,
                    bytes,
                    inst_offsets: offsets,
                    passes,
                    landings,
                });
            }
            Settled::Again => {}
        }
    }
}

/// Why the code stops (out-of-line stub contents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Budget exhausted.
    Budget,
    /// `callx` id with no helper: id in the given register.
    Callx { reg: Gpr },
}

/// An out-of-line stop stub, linked to the previous stub of its pc.
struct StopStub {
    label: Label,
    stop: Stop,
    pc: usize,
    next_same_pc: u32,
    placed: bool,
}

/// The end of a pc's stub chain.
const NO_STUB: u32 = u32::MAX;

/// What a checked copy ([`Emitter::checked_copy`]) copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyOf {
    /// A check group's members.
    Group,
    /// A guarded walk's loop, back-edge included.
    Loop,
}

/// Rarely taken code, kept out of the straight-line path.
#[derive(Clone, Copy, Debug)]
enum Cold {
    /// An access's inline region test failed: the full check ([`Emitter::access_check_routine`],
    /// shared by the whole program), back to `back` when some region holds the access.
    Access { at: Label, back: Label, desc: u32 },
    /// A check group's widened test failed: the group's instructions again with a check
    /// per access, then on after the group.
    Group { at: Label, group: usize },
    /// A guarded walk's entry test failed: the loop's checked copy, then on after the loop.
    Walk { at: Label, walk: usize },
    /// Divisor 0: r11 = 0 (div) or the dividend in rax (mod).
    DivZero {
        at: Label,
        back: Label,
        sz: Sz,
        rem: bool,
    },
    /// Signed divisor -1: r11 = -rax (MIN stays MIN, no trap) or 0 (mod).
    DivMinus1 {
        at: Label,
        back: Label,
        sz: Sz,
        rem: bool,
    },
}

/// One emission pass.
pub struct Emitter<'a> {
    pub(crate) e: Enc,
    pub(crate) plan: &'a Plan,
    pub(crate) mode: &'a CodegenMode,
    prog: &'a Program,
    helpers: &'a [HelperEntry],
    /// Body label of each instruction (only those jumped to have their own, see
    /// `instruction_labels`).
    inst_label: Reused<Label>,
    /// Where each instruction's code starts, in emission order (= instruction order).
    inst_offsets: Reused<u32>,
    /// Prologue label of each function.
    sub_entry: Vec<Label>,
    /// Epilogue label of each function.
    sub_exit: Vec<Label>,
    /// Entry epilogue after the pad: where a stop lands with rsp = env.entry_sp.
    pub(crate) entry_pops: Label,
    /// Stop stubs (budget, unknown `callx`; out-of-bounds stops are the shared access
    /// check's) in emission order. They are shared by (kind, pc), the checked copies of
    /// groups and loops asking again for their instructions' stubs.
    stops: Vec<StopStub>,
    /// Per pc (a bytecode slot, as stops report), its last stop stub (`NO_STUB` if none),
    /// the head of that pc's chain: a large budgeted program asks for a stub per back-edge
    /// and call, so they are found by pc, not by a scan. Allocated at the first stub.
    stop_by_pc: Vec<u32>,
    /// Stubs asked for but not placed yet, placed after the current function's cold code.
    unplaced_stubs: Vec<u32>,
    /// The stops' shared tail (unwind to the entry's pops), placed with the first stub.
    stop_tail: Option<Label>,
    /// Cold blocks of the current function, emitted after its epilogue.
    cold: Vec<Cold>,
    /// Where the queued cold code is expected to land, for the first form of the jumps to
    /// it (`ColdPlacement`; on x86-64 always after the function).
    islands: ColdPlacement,
    /// The shared full access check ([`Self::access_check_routine`]), made at the first use.
    access_check: Option<Label>,
    /// `callx` address tables (label, entries), placed after all code as data.
    callx_tables: Vec<(Label, Vec<u64>)>,
    /// Instruction index to skip (fused into the previous one).
    skip: Option<usize>,
    /// Index of the instruction being lowered.
    cur: usize,
    /// Emitting a group's or a guarded walk's checked copy: every access checks itself.
    copy: bool,
    /// Emitting a guarded walk's checked copy: the copy's head, where its back-edge goes.
    copy_head: Option<Label>,
    /// Per check group: the point right after its widened check and clamp, for the jumps
    /// that re-enter it validated (`AccessPlan::reentries`); `None` for other groups.
    group_resume: Vec<Option<Label>>,
    /// Per walk (`AccessPlan::walks`): the pointer clamp its back-edge lands on.
    walk_clamps: Vec<Label>,
    /// Emit the Spectre clamp on hot paths (off only for measurement, see [`EmitOptions`]).
    clamp: bool,
}

impl<'a> Emitter<'a> {
    fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        mode: &'a CodegenMode,
        plan: &'a Plan,
        forms: Vec<Form>,
        islands: ColdPlacement,
    ) -> Self {
        // Bytes per instruction, trusted / checked (x86-64 averages under 6 / 25).
        let cap = EmitCapacity::for_program(prog, mode, (8, 32));
        let mut e = Enc::with_capacity(forms, cap.code, cap.labels, cap.branch_sites);
        let unbound = e.label();
        let inst_label = instruction_labels(prog, &plan.access, unbound, || e.label());
        let sub_entry = prog.subprogs.iter().map(|_| e.label()).collect();
        let sub_exit = prog.subprogs.iter().map(|_| e.label()).collect();
        let entry_pops = e.label();
        let group_resume = plan
            .access
            .groups
            .iter()
            .map(|g| g.reentered.then(|| e.label()))
            .collect();
        let walk_clamps = plan.access.walks.iter().map(|_| e.label()).collect();
        Emitter {
            e,
            plan,
            mode,
            prog,
            helpers,
            inst_label,
            inst_offsets: scratch::take(prog.insts.len()),
            sub_entry,
            sub_exit,
            entry_pops,
            stops: Vec::new(),
            stop_by_pc: Vec::new(),
            unplaced_stubs: Vec::new(),
            stop_tail: None,
            callx_tables: Vec::new(),
            cold: Vec::new(),
            islands,
            access_check: None,
            skip: None,
            cur: 0,
            copy: false,
            copy_head: None,
            group_resume,
            walk_clamps,
            clamp: true,
        }
    }

    fn program(&mut self) -> Result<(), CompileError> {
        // The program outlives the emitter: its instructions are lowered by reference.
        let prog = self.prog;
        // Walks and check groups exist only in sandboxed code: trusted code skips the
        // per-instruction lookups.
        let (walks, groups) = (
            !self.plan.access.walks.is_empty(),
            !self.plan.access.groups.is_empty(),
        );
        for k in 0..prog.subprogs.len() {
            let (start, end) = (prog.subprogs[k].start, prog.subprogs[k].end);
            let l = self.sub_entry[k];
            self.e.bind(l);
            self.prologue(k);
            let program_end = prog.insts.len();
            self.islands
                .begin_function(self.e.pos(), start, end, program_end);
            for (i, inst) in prog.insts[start..end]
                .iter()
                .enumerate()
                .map(|(n, x)| (start + n, x))
            {
                // Never due here (see `emit_with`); the call keeps the estimate's books.
                let queued = !self.cold.is_empty();
                let island = self.islands.island_due(self.e.pos(), i, queued);
                debug_assert!(!island, "x86-64 places no islands");
                self.cur = i;
                if walks {
                    self.walk_clamp_at(i);
                }
                // The instruction starts here (after a walk's clamp, which only the walk's
                // back-edge reaches).
                // (Code is far below 4 GiB: at most `MAX_INSNS` instructions.)
                self.inst_offsets.push(self.e.pos() as u32);
                if self.plan.access.jumped_to(prog, i) {
                    let l = self.inst_label[i];
                    self.e.bind(l);
                }
                if self.skip == Some(i) {
                    continue;
                }
                self.cur = i;
                if groups {
                    self.group_check_at(i);
                }
                self.inst(i, k, inst)?;
            }
            let l = self.sub_exit[k];
            self.e.bind(l);
            self.epilogue(k);
            self.cold_blocks()?;
        }
        // Every stub was placed with its function's cold code (`cold_blocks`).
        debug_assert!(self.unplaced_stubs.is_empty());
        if let Some(l) = self.access_check {
            self.access_check_routine(l);
        }
        for (l, table) in std::mem::take(&mut self.callx_tables) {
            self.e.data_u64(l, &table);
        }
        Ok(())
    }

    #[inline(always)]
    fn inst(&mut self, i: usize, k: usize, inst: &Inst) -> Result<(), CompileError> {
        let pc = inst.pc as usize;
        match inst.op {
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => self.alu(pc, width, op, dst, src),
            Op::MovSx {
                width,
                dst,
                src,
                bits,
            } => self.movsx(width, dst, src, bits),
            Op::MovPerCpu { dst, src, array } => self.mov_percpu(inst, dst, src, array)?,
            Op::Neg { width, dst } => self.e.rr(&[], sz_of(width), &[0xf7], 3, host(dst)),
            Op::End { kind, bits, dst } => self.end(kind, bits, dst),
            Op::LdImm64 { dst, imm } => self.ld_imm64(pc, dst, imm.get()),
            Op::Load {
                size,
                sign_extend,
                dst,
                base,
                off,
            } => self.load(i, inst, size, sign_extend, dst, base, off),
            Op::Store {
                size,
                base,
                off,
                src,
            } => self.store(inst, size, base, off, src),
            Op::Atomic {
                size,
                op,
                fetch,
                base,
                off,
                src,
            } => self.atomic(inst, size, op, fetch, base, off, src),
            Op::Ja { target } => self.ja(inst, target as usize),
            Op::Jcond {
                width,
                cond,
                dst,
                src,
                target,
            } => self.jcond(inst, width, cond, dst, src, target as usize),
            Op::CallHelper { id } => {
                let h = self.helper_entry(inst, id)?;
                self.call_helper(&h)?;
            }
            Op::CallReg { reg } => self.callx(pc, reg),
            Op::CallLocal { target } => self.call_local(pc, target as usize),
            Op::Exit => self.exit(i, k),
        }
        Ok(())
    }

    // ---- small emit helpers -------------------------------------------------------------

    /// `mov dst, src` (a 32-bit move zero-extends, so it is never skipped).
    pub(crate) fn mov_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        if dst != src || sz != Sz::B64 {
            self.e.rr(&[], sz, &[0x89], src, dst);
        }
    }

    /// `xor r32, r32`: the shortest zeroing idiom (and a dependency breaker).
    pub(crate) fn xor_zero(&mut self, r: Gpr) {
        self.e.rr(&[], Sz::B32, &[0x31], r, r);
    }

    /// 64-bit `r = v`, shortest form: `xor` for 0, `mov r32, imm32` (zero-extends) for
    /// values below 2³², `mov r64, simm32` for negative 32-bit values, else `movabs`.
    pub(crate) fn mov_ri(&mut self, r: Gpr, v: i64) {
        if v == 0 {
            self.xor_zero(r);
        } else if u32::try_from(v).is_ok() {
            self.e.op_plus_r(Sz::B32, &[0xb8], r);
            self.e.imm_bytes(v, 4);
        } else if i32::try_from(v).is_ok() {
            self.e.rr(&[], Sz::B64, &[0xc7], 0, r);
            self.e.imm_bytes(v, 4);
        } else {
            self.e.op_plus_r(Sz::B64, &[0xb8], r);
            self.e.imm_bytes(v, 8);
        }
    }

    /// Group-1 `op r, imm` (`digit`: 0 add, 1 or, 4 and, 5 sub, 6 xor, 7 cmp): `imm8` when it
    /// fits, the one-byte-shorter rax form for other `imm32`s.
    pub(crate) fn alu_ri(&mut self, digit: u8, sz: Sz, r: Gpr, imm: i64) {
        if i8::try_from(imm).is_ok() {
            self.e.rr(&[], sz, &[0x83], digit, r);
            self.e.imm_bytes(imm, 1);
        } else if r == RAX {
            let op = 0x05 | (digit << 3);
            if sz == Sz::B64 {
                self.e.raw(&[0x48, op]);
            } else {
                self.e.raw(&[op]);
            }
            self.e.imm_bytes(imm, 4);
        } else {
            self.e.rr(&[], sz, &[0x81], digit, r);
            self.e.imm_bytes(imm, 4);
        }
    }

    /// Group-1 `op qword [base + disp], imm`.
    fn alu_mi(&mut self, digit: u8, base: Gpr, disp: i32, imm: i64) {
        if i8::try_from(imm).is_ok() {
            self.e.rm(&[], Sz::B64, &[0x83], digit, base, disp);
            self.e.imm_bytes(imm, 1);
        } else {
            self.e.rm(&[], Sz::B64, &[0x81], digit, base, disp);
            self.e.imm_bytes(imm, 4);
        }
    }

    /// The blinding mask for the immediate at `pc`, or `None` when blinding is off.
    fn mask(&self, pc: usize) -> Option<u64> {
        self.mode.blind_key.map(|k| blinding_mask(k, pc))
    }

    /// `r = sign_extend(imm)`, blinded when asked: `mov r, imm ^ m ; xor r, m`.
    fn imm_to(&mut self, pc: usize, r: Gpr, imm: i32) {
        match self.mask(pc) {
            None => self.mov_ri(r, imm as i64),
            Some(m) => {
                // The mask is forced to a full 32-bit pattern so both halves are imm32
                // fields and neither equals the immediate.
                let m = (m as u32 | 0x8000_0000) as i32;
                self.e.rr(&[], Sz::B64, &[0xc7], 0, r);
                self.e.imm_bytes((imm ^ m) as i64, 4);
                self.e.rr(&[], Sz::B64, &[0x81], 6, r);
                self.e.imm_bytes(m as i64, 4);
            }
        }
    }

    /// The label of the stop stub for (`stop`, `pc`), placed after the current function's
    /// cold code unless a cold block places it first.
    fn stop_label(&mut self, stop: Stop, pc: usize) -> Label {
        let stub = self.stop_stub(stop, pc);
        self.stops[stub].label
    }

    /// The stop stub for (`stop`, `pc`), made on the first request.
    fn stop_stub(&mut self, stop: Stop, pc: usize) -> usize {
        if self.stop_by_pc.is_empty() {
            self.stop_by_pc = vec![NO_STUB; self.prog.slots];
        }
        let mut k = self.stop_by_pc[pc];
        while k != NO_STUB {
            let stub = &self.stops[k as usize];
            if stub.stop == stop {
                return k as usize;
            }
            k = stub.next_same_pc;
        }
        let label = self.e.label();
        let k = self.stops.len();
        self.stops.push(StopStub {
            label,
            stop,
            pc,
            next_same_pc: self.stop_by_pc[pc],
            placed: false,
        });
        self.stop_by_pc[pc] = k as u32;
        self.unplaced_stubs.push(k as u32);
        k
    }

    // ---- ALU --------------------------------------------------------------------------

    #[inline(always)]
    fn alu(&mut self, pc: usize, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let sz = sz_of(width);
        let d = host(dst);
        // Blinded immediates go through r11 and use the register form.
        let src = match (src, self.mask(pc)) {
            (Operand::Imm(i), Some(_))
                if !matches!(op, AluOp::Lsh | AluOp::Rsh | AluOp::Arsh | AluOp::Mov) =>
            {
                if matches!(op, AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod)
                    && (i == 0 || i == -1)
                {
                    Operand::Imm(i) // special-cased below without emitting the value
                } else {
                    self.imm_to(pc, T11, i);
                    Operand::Reg(u8::MAX)
                }
            }
            _ => src,
        };
        // u8::MAX marks "the blinded immediate in r11".
        let reg = |r: Reg| if r == u8::MAX { T11 } else { host(r) };
        match op {
            AluOp::Mov => match src {
                Operand::Reg(s) => self.mov_rr(sz, d, reg(s)),
                Operand::Imm(i) => match self.mask(pc) {
                    Some(_) => {
                        self.imm_to(pc, d, i);
                        if sz == Sz::B32 {
                            self.mov_rr(Sz::B32, d, d);
                        }
                    }
                    None if sz == Sz::B32 => self.mov_ri(d, i as u32 as i64),
                    None => self.mov_ri(d, i as i64),
                },
            },
            AluOp::Add | AluOp::Sub | AluOp::And | AluOp::Or | AluOp::Xor => {
                let (opc, digit) = match op {
                    AluOp::Add => (0x01, 0),
                    AluOp::Or => (0x09, 1),
                    AluOp::And => (0x21, 4),
                    AluOp::Sub => (0x29, 5),
                    _ => (0x31, 6),
                };
                match src {
                    Operand::Reg(s) => self.e.rr(&[], sz, &[opc], reg(s), d),
                    Operand::Imm(i) => self.alu_ri(digit, sz, d, i as i64),
                }
            }
            AluOp::Mul => match src {
                Operand::Reg(s) => self.e.rr(&[], sz, &[0x0f, 0xaf], d, reg(s)),
                Operand::Imm(i) if i8::try_from(i).is_ok() => {
                    self.e.rr(&[], sz, &[0x6b], d, d);
                    self.e.imm_bytes(i as i64, 1);
                }
                Operand::Imm(i) => {
                    self.e.rr(&[], sz, &[0x69], d, d);
                    self.e.imm_bytes(i as i64, 4);
                }
            },
            AluOp::Div | AluOp::Mod | AluOp::Sdiv | AluOp::Smod => {
                let src = match src {
                    Operand::Reg(s) => Operand::Reg(reg(s)),
                    i => i,
                };
                self.div(sz, op, d, src)
            }
            AluOp::Lsh | AluOp::Rsh | AluOp::Arsh => {
                let digit = match op {
                    AluOp::Lsh => 4,
                    AluOp::Rsh => 5,
                    _ => 7,
                };
                self.shift(sz, digit, d, src.map_reg(reg))
            }
        }
    }

    /// Shifts. x86 masks the count to 31/63 itself, which is eBPF's rule.
    #[inline(always)]
    fn shift(&mut self, sz: Sz, digit: u8, d: Gpr, src: Operand) {
        match src {
            Operand::Imm(i) => {
                let n = i & if sz == Sz::B64 { 63 } else { 31 };
                if n == 0 {
                    // No shift, but a 32-bit result is still zero-extended.
                    if sz == Sz::B32 {
                        self.mov_rr(Sz::B32, d, d);
                    }
                } else if n == 1 {
                    self.e.rr(&[], sz, &[0xd1], digit, d);
                } else {
                    self.e.rr(&[], sz, &[0xc1], digit, d);
                    self.e.imm_bytes(n as i64, 1);
                }
            }
            Operand::Reg(s) => {
                let s = s as Gpr; // already a host register here
                if self.mode.features & FEATURE_BMI2 != 0 {
                    // shlx/shrx/sarx d, d, s: any count register, flags untouched.
                    let pp = match digit {
                        4 => 1,
                        5 => 3,
                        _ => 2,
                    };
                    self.e.vex_0f38_rr(sz == Sz::B64, pp, 0xf7, d, d, s);
                } else if s == RCX {
                    self.e.rr(&[], sz, &[0xd3], digit, d);
                } else {
                    // The count must be in cl, which is BPF r4: park rcx in r11.
                    self.mov_rr(Sz::B64, T11, RCX);
                    self.mov_rr(Sz::B64, RCX, s);
                    let target = if d == RCX { T11 } else { d };
                    self.e.rr(&[], sz, &[0xd3], digit, target);
                    self.mov_rr(if d == RCX { sz } else { Sz::B64 }, RCX, T11);
                }
            }
        }
    }

    /// Division and remainder. x86 `div`/`idiv` trap on a zero divisor and `idiv` on
    /// MIN / -1; eBPF wants x / 0 = 0, x % 0 = x, MIN / -1 = MIN, MIN % -1 = 0. Constant
    /// divisors are decided at compile time (no branch); a register divisor is tested.
    fn div(&mut self, sz: Sz, op: AluOp, d: Gpr, src: Operand) {
        let signed = matches!(op, AluOp::Sdiv | AluOp::Smod);
        let rem = matches!(op, AluOp::Mod | AluOp::Smod);
        if let Operand::Imm(i) = src {
            if i == 0 {
                if rem {
                    if sz == Sz::B32 {
                        self.mov_rr(Sz::B32, d, d);
                    }
                } else {
                    self.xor_zero(d);
                }
                return;
            }
            if i == -1 && signed {
                if rem {
                    self.xor_zero(d);
                } else {
                    self.e.rr(&[], sz, &[0xf7], 3, d); // neg: MIN stays MIN
                }
                return;
            }
            let v = if sz == Sz::B32 {
                i as u32 as i64
            } else {
                i as i64
            };
            self.mov_ri(T11, v);
        } else if let Operand::Reg(s) = src {
            self.mov_rr(Sz::B64, T11, s as Gpr);
        }
        let checks = matches!(src, Operand::Reg(_));
        if d != RAX {
            self.mov_rr(Sz::B64, T10, RAX);
        }
        if d != RDX {
            self.mov_rr(Sz::B64, T9, RDX);
        }
        self.mov_rr(Sz::B64, RAX, d);
        let done = self.e.label();
        if checks {
            // The rare divisors branch to cold code after the function, so the common
            // path takes no jump.
            let zero = self.e.label();
            self.e.rr(&[], sz, &[0x85], T11, T11);
            self.cold_jump(Some(Cc::E), zero);
            self.cold.push(Cold::DivZero {
                at: zero,
                back: done,
                sz,
                rem,
            });
            if signed {
                let minus1 = self.e.label();
                self.alu_ri(7, sz, T11, -1);
                self.cold_jump(Some(Cc::E), minus1);
                self.cold.push(Cold::DivMinus1 {
                    at: minus1,
                    back: done,
                    sz,
                    rem,
                });
            }
        }
        if signed {
            self.e.sign_extend_rax(sz);
        } else {
            self.xor_zero(RDX);
        }
        self.e.rr(&[], sz, &[0xf7], if signed { 7 } else { 6 }, T11);
        self.mov_rr(sz, T11, if rem { RDX } else { RAX });
        self.e.bind(done);
        if d != RAX {
            self.mov_rr(Sz::B64, RAX, T10);
        }
        if d != RDX {
            self.mov_rr(Sz::B64, RDX, T9);
        }
        self.mov_rr(sz, d, T11);
    }

    fn movsx(&mut self, width: Width, dst: Reg, src: Reg, bits: u8) {
        let (d, s) = (host(dst), host(src));
        let sz = sz_of(width);
        match bits {
            8 => {
                // A byte source in 4–7 (sil, dil) needs a REX prefix.
                let rex = (4..8).contains(&s) && sz != Sz::B64 && d < 8 && s < 8;
                if rex {
                    self.e
                        .raw(&[0x40, 0x0f, 0xbe, 0xc0 | ((d & 7) << 3) | (s & 7)]);
                } else {
                    self.e.rr(&[], sz, &[0x0f, 0xbe], d, s);
                }
            }
            16 => self.e.rr(&[], sz, &[0x0f, 0xbf], d, s),
            _ if sz == Sz::B64 => self.e.rr(&[], Sz::B64, &[0x63], d, s),
            _ => self.mov_rr(Sz::B32, d, s),
        }
    }

    fn end(&mut self, kind: EndKind, bits: u8, dst: Reg) {
        let d = host(dst);
        match (kind, bits) {
            (EndKind::ToLe, 16) => self.e.rr(&[], Sz::B32, &[0x0f, 0xb7], d, d),
            (EndKind::ToLe, 32) => self.mov_rr(Sz::B32, d, d),
            (EndKind::ToLe, _) => {}
            (_, 16) => {
                // rol r16, 8 swaps the two low bytes; movzx clears the rest.
                self.e.rr(&[], Sz::B16, &[0xc1], 0, d);
                self.e.imm_bytes(8, 1);
                self.e.rr(&[], Sz::B32, &[0x0f, 0xb7], d, d);
            }
            (_, 32) => self.e.op_plus_r(Sz::B32, &[0x0f, 0xc8], d),
            _ => self.e.op_plus_r(Sz::B64, &[0x0f, 0xc8], d),
        }
    }

    fn ld_imm64(&mut self, pc: usize, dst: Reg, imm: u64) {
        let d = host(dst);
        match self.mask(pc) {
            None => self.mov_ri(d, imm as i64),
            Some(m) => {
                // Both halves blinded: movabs d, imm ^ m ; movabs r11, m ; xor d, r11.
                let m = m | 0x8000_0000_8000_0000;
                self.e.op_plus_r(Sz::B64, &[0xb8], d);
                self.e.imm_bytes((imm ^ m) as i64, 8);
                self.e.op_plus_r(Sz::B64, &[0xb8], T11);
                self.e.imm_bytes(m as i64, 8);
                self.e.rr(&[], Sz::B64, &[0x31], T11, d);
            }
        }
    }

    // ---- memory -------------------------------------------------------------------------

    /// The memory operand of an access: `[base + off]`, or `[r11]` after a sandbox check.
    fn address(&mut self, inst: &Inst, write: bool) -> (Gpr, i32) {
        match (self.mode.sandboxed(), checked_access(&inst.op)) {
            (true, Some((base, off, size))) if !self.unchecked_access() => {
                let check = self.plan.access.check(self.cur);
                let pc = inst.pc as usize;
                match check {
                    AccessCheck::CtxConst { end } if end <= i32::MAX as u32 => {
                        self.ctx_len_check(pc, host(base), off as i32, size, write, end)
                    }
                    _ => self.check(
                        pc,
                        host(base),
                        off as i32,
                        size,
                        write,
                        check == AccessCheck::Stack,
                    ),
                }
                (T11, 0)
            }
            _ => {
                let (base, off) = match inst.op {
                    Op::Load { base, off, .. }
                    | Op::Store { base, off, .. }
                    | Op::Atomic { base, off, .. } => (base, off),
                    _ => unreachable!("address of a non-memory instruction"),
                };
                let (base, off) = self.walked_address(base, off);
                (host(base), off as i32)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn load(
        &mut self,
        i: usize,
        inst: &Inst,
        size: Size,
        sx: bool,
        dst: Reg,
        _base: Reg,
        _off: i16,
    ) {
        let (b, off) = self.address(inst, false);
        let d = host(dst);
        // MOVBE: a load followed by a byte swap of the same width into the same register
        // (the usual ntohs/ntohl/be64 pattern) becomes one swapping load.
        if self.mode.features & FEATURE_MOVBE != 0 && !sx && size != Size::B {
            if let Some(next) = self.prog.insts.get(i + 1) {
                let bits = size.bytes() as u8 * 8;
                if let Op::End {
                    kind: EndKind::ToBe | EndKind::Swap,
                    bits: nb,
                    dst: nd,
                } = next.op
                {
                    if nd == dst && nb == bits && !self.prog.is_target[i + 1] {
                        let sz = match size {
                            Size::H => Sz::B16,
                            Size::W => Sz::B32,
                            _ => Sz::B64,
                        };
                        self.e.rm(&[], sz, &[0x0f, 0x38, 0xf0], d, b, off);
                        if size == Size::H {
                            self.e.rr(&[], Sz::B32, &[0x0f, 0xb7], d, d);
                        }
                        self.skip = Some(i + 1);
                        return;
                    }
                }
            }
        }
        let (sz, op): (Sz, &[u8]) = match (size, sx) {
            (Size::B, false) => (Sz::B32, &[0x0f, 0xb6]),
            (Size::H, false) => (Sz::B32, &[0x0f, 0xb7]),
            (Size::W, false) => (Sz::B32, &[0x8b]),
            (Size::DW, _) => (Sz::B64, &[0x8b]),
            (Size::B, true) => (Sz::B64, &[0x0f, 0xbe]),
            (Size::H, true) => (Sz::B64, &[0x0f, 0xbf]),
            (Size::W, true) => (Sz::B64, &[0x63]),
        };
        self.e.rm(&[], sz, op, d, b, off);
    }

    fn store(&mut self, inst: &Inst, size: Size, _base: Reg, _off: i16, src: Operand) {
        let pc = inst.pc as usize;
        let (b, off) = self.address(inst, true);
        let sz = mem_sz(size);
        match src {
            Operand::Reg(s) => {
                let op = if size == Size::B { 0x88 } else { 0x89 };
                self.e.rm(&[], sz, &[op], host(s), b, off);
            }
            Operand::Imm(i) if self.mask(pc).is_some() => {
                self.imm_to(pc, T10, i);
                let op = if size == Size::B { 0x88 } else { 0x89 };
                self.e.rm(&[], sz, &[op], T10, b, off);
            }
            Operand::Imm(i) => {
                let op = if size == Size::B { 0xc6 } else { 0xc7 };
                self.e.rm(&[], sz, &[op], 0, b, off);
                let n = match size {
                    Size::B => 1,
                    Size::H => 2,
                    _ => 4,
                };
                self.e.imm_bytes(i as i64, n);
            }
        }
    }

    /// Atomics. Every `lock`-prefixed read-modify-write (and `xchg` with memory, locked
    /// implicitly) is a full barrier on x86, so all forms are sequentially consistent, as
    /// the kernel documents for BPF's fetching atomics.
    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &mut self,
        inst: &Inst,
        size: Size,
        op: AtomicOp,
        fetch: bool,
        base: Reg,
        off: i16,
        src: Reg,
    ) {
        let sz = mem_sz(size);
        let s = host(src);
        let needs_loop = fetch && matches!(op, AtomicOp::And | AtomicOp::Or | AtomicOp::Xor);
        let (b, off) = if needs_loop && !self.mode.sandboxed() {
            // The loop below uses rax: take the address first in case base is r0.
            self.e
                .rm(&[], Sz::B64, &[0x8d], T11, host(base), off as i32);
            (T11, 0)
        } else {
            match self.address(inst, true) {
                // Likewise for a sandboxed access the range analysis proved (no check, so
                // the base register itself is the address).
                (RAX, off) if needs_loop => {
                    self.e.rm(&[], Sz::B64, &[0x8d], T11, RAX, off);
                    (T11, 0)
                }
                a => a,
            }
        };
        let lock: &[u8] = &[0xf0];
        match (op, fetch) {
            (AtomicOp::Add, false) => self.e.rm(lock, sz, &[0x01], s, b, off),
            (AtomicOp::Or, false) => self.e.rm(lock, sz, &[0x09], s, b, off),
            (AtomicOp::And, false) => self.e.rm(lock, sz, &[0x21], s, b, off),
            (AtomicOp::Xor, false) => self.e.rm(lock, sz, &[0x31], s, b, off),
            (AtomicOp::Add, true) => self.e.rm(lock, sz, &[0x0f, 0xc1], s, b, off), // xadd
            (AtomicOp::Xchg, _) => self.e.rm(&[], sz, &[0x87], s, b, off),
            (AtomicOp::Cmpxchg, _) => {
                self.e.rm(lock, sz, &[0x0f, 0xb1], s, b, off);
                if sz == Sz::B32 {
                    // On success a 32-bit cmpxchg leaves rax's upper half alone; eBPF's r0
                    // is the zero-extended old value either way.
                    self.mov_rr(Sz::B32, RAX, RAX);
                }
            }
            (_, true) => {
                // fetch-and/or/xor: a cmpxchg loop. r10 keeps r0 (rax is cmpxchg's
                // comparand); when src is r0 its value is read from there.
                let opc = match op {
                    AtomicOp::And => 0x21,
                    AtomicOp::Or => 0x09,
                    _ => 0x31,
                };
                let sv = if s == RAX { T10 } else { s };
                self.mov_rr(Sz::B64, T10, RAX);
                self.e.rm(&[], sz, &[0x8b], RAX, b, off);
                let again = self.e.label();
                self.e.bind(again);
                self.mov_rr(Sz::B64, T9, RAX);
                self.e.rr(&[], sz, &[opc], sv, T9);
                self.e.rm(lock, sz, &[0x0f, 0xb1], T9, b, off);
                self.e.jump(Some(Cc::Ne), again);
                // src = old value (zero-extended for 32-bit); r0 restored unless it is src.
                self.mov_rr(sz, s, RAX);
                if s != RAX {
                    self.mov_rr(Sz::B64, RAX, T10);
                }
            }
        }
    }

    /// Whether the current access goes to `base + off` with no check of its own: proven
    /// inside the frame (by the data or by its walk), or a member of a check group on the
    /// hot path (whose widened check `group_check_at` emitted).
    fn unchecked_access(&mut self) -> bool {
        let i = self.cur;
        match self.plan.access.check(i) {
            AccessCheck::None | AccessCheck::Walked => return true,
            AccessCheck::Guarded => return !self.copy,
            _ => {}
        }
        if self.copy {
            return false;
        }
        let Some(g) = self.plan.access.group_of(i) else {
            return false;
        };
        self.group_supported(g)
    }

    /// A group's widened check, where its first member's code starts: before anything of
    /// that instruction (an immediate to store, say), so a re-entering jump that lands
    /// right after the check skips nothing else.
    fn group_check_at(&mut self, i: usize) {
        if let Some(g) = self.plan.access.group_of(i) {
            if self.plan.access.groups[g].first == i && self.group_supported(g) {
                self.group_check(g);
            }
        }
    }

    /// Groups whose widened test this backend encodes: a constant context end within
    /// `imm32`, or a span within the `imm8` of [`Self::region_end`].
    fn group_supported(&self, g: usize) -> bool {
        let grp = &self.plan.access.groups[g];
        match grp.check {
            AccessCheck::CtxConst { end } => end <= i32::MAX as u32,
            _ => grp.hi - (grp.lo as i32) < 128,
        }
    }

    /// Group `g`'s widened test of `[base + lo, base + hi)` in one region, then the base
    /// itself clamped in place to 0 under a mispredicted branch (architecturally it keeps
    /// its value: the test passed), so no member reaches memory out of bounds. On failure
    /// the group's checked copy runs ([`Cold::Group`]).
    fn group_check(&mut self, g: usize) {
        let grp = &self.plan.access.groups[g];
        let (b, lo, span, check) = (
            host(grp.base),
            grp.lo as i32,
            (grp.hi - grp.lo as i32) as i64,
            grp.check,
        );
        let at = self.e.label();
        let fail = match check {
            AccessCheck::CtxConst { end } => {
                self.ctx_len();
                self.alu_ri(7, Sz::B64, T9, end as i64); // cmp len, end
                Cc::B
            }
            AccessCheck::Stack if (span as usize) <= self.plan.block => {
                self.lea(T11, b, lo);
                self.stack_offset();
                self.alu_ri(7, Sz::B64, T10, self.plan.block as i64 - span);
                Cc::A
            }
            _ => {
                // The context: a sufficient test for any group.
                self.lea(T11, b, lo);
                self.region_end(CTX_START8, span);
                self.ctx_len();
                self.e.rr(&[], Sz::B64, &[0x39], T9, T10); // cmp end, len
                Cc::A
            }
        };
        self.cold_jump(Some(fail), at);
        if self.clamp {
            // mov r9d, 0 (leaves the flags) ; cmov<fail> base, r9
            self.e.op_plus_r(Sz::B32, &[0xb8], T9);
            self.e.imm_bytes(0, 4);
            self.e.rr(&[], Sz::B64, &[0x0f, 0x40 | fail as u8], b, T9);
        }
        if let Some(resume) = self.group_resume[g] {
            self.e.bind(resume);
        }
        self.cold.push(Cold::Group { at, group: g });
    }

    /// `r11 = base + off`.
    fn lea(&mut self, dst: Gpr, base: Gpr, off: i32) {
        if off == 0 {
            self.mov_rr(Sz::B64, dst, base);
        } else {
            self.e.rm(&[], Sz::B64, &[0x8d], dst, base, off);
        }
    }

    /// `r9 = ctx_end - ctx_start`.
    fn ctx_len(&mut self) {
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov r9, QWORD [BYTE r12 + CTX_END8]
                ; sub r9, QWORD [BYTE r12 + CTX_START8]
            )
        });
    }

    /// The check of an access whose base is the context start plus a constant (rdi =
    /// env.ctx_start at entry), ending `end` bytes into the context: inside iff
    /// `end <= len`. Otherwise the full check runs out of line ([`Cold::Access`]).
    fn ctx_len_check(&mut self, pc: usize, base: Gpr, off: i32, size: Size, write: bool, end: u32) {
        let (at, back) = (self.e.label(), self.e.label());
        self.lea(T11, base, off);
        self.ctx_len();
        self.alu_ri(7, Sz::B64, T9, end as i64); // cmp len, end
        self.cold_jump(Some(Cc::B), at);
        if self.clamp {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmovb r11, r12));
        }
        self.e.bind(back);
        let desc = access_desc(pc, size, write);
        self.cold.push(Cold::Access { at, back, desc });
    }

    /// Sandbox check of `[base + off, + size)`: leaves the address in r11 (clamped under
    /// misspeculation) or stops. `stack_first`: the base derives from r10, so the stack
    /// block is tested inline instead of the context.
    ///
    /// One region is tested inline, falling through when the access is inside; otherwise
    /// the full check runs out of line ([`Cold::Access`]) and comes back to `ok` when some
    /// region holds the access. At `ok` the flags of the deciding compare are still live,
    /// and `cmova` replaces the address with `env` (a harmless, mapped address) should the
    /// branch have been mispredicted.
    fn check(
        &mut self,
        pc: usize,
        base: Gpr,
        off: i32,
        size: Size,
        write: bool,
        stack_first: bool,
    ) {
        let n = size.bytes() as i64;
        let (ok, at) = (self.e.label(), self.e.label());
        self.lea(T11, base, off);
        if stack_first && self.plan.block > 0 {
            self.stack_cmp(n);
        } else {
            self.ctx_cmp(n);
        }
        self.cold_jump(Some(Cc::A), at);
        self.e.bind(ok);
        if self.clamp {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmova r11, r12));
        }
        let desc = access_desc(pc, size, write);
        self.cold.push(Cold::Access { at, back: ok, desc });
    }

    /// The cold side of an access check, r11 = the address: the full check, then back.
    /// Three instructions (13 to 16 bytes) per checked access; everything else is shared.
    fn access_slow_path(&mut self, at: Label, back: Label, desc: u32) {
        self.e.bind(at);
        let routine = match self.access_check {
            Some(l) => l,
            None => {
                let l = self.e.label();
                self.access_check = Some(l);
                l
            }
        };
        self.mov_ri(T10, desc as i64);
        self.e.call_label(routine);
        // The routine returns only when the access is allowed (else it stops the run).
        self.e.jump(None, back);
    }

    /// Flags for "`[r11, r11 + n)` is inside the context": "below or equal" when it is.
    /// `end = addr - start + n` (forced to all-ones when it wraps) against the length.
    fn ctx_cmp(&mut self, n: i64) {
        self.region_end(CTX_START8, n);
        self.ctx_len();
        // cmp r10, r9 in the MR form (0x39) the backend has always emitted: dynasm-rs picks
        // the equally long RM form (0x3b) for register pairs.
        self.e.rr(&[], Sz::B64, &[0x39], T9, T10);
    }

    /// Flags for "`[r11, r11 + n)` is inside the stack block": "below or equal" when it is.
    ///
    /// The block's length is a constant, so with `u = r11 - stack_start` (mod 2^64) the
    /// access is inside exactly when `u <= block - n`: an address below the block wraps `u`
    /// past 2^63 (user addresses are below 2^47), far above any block. No end to force to
    /// all-ones, unlike the context's variable length ([`Self::region_end`]).
    fn stack_cmp(&mut self, n: i64) {
        self.stack_offset();
        self.alu_ri(7, Sz::B64, T10, self.plan.block as i64 - n);
    }

    /// r10 = r11 - env.stack_start.
    fn stack_offset(&mut self) {
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov r10, r11
                ; sub r10, QWORD [BYTE r12 + STACK_START8]
            )
        });
    }

    /// r10 = r11 - [env + start] + n, all-ones if that wraps (r9 clobbered).
    fn region_end(&mut self, start: i8, n: i64) {
        // n is an access size, 1..=8.
        let n = n as i8;
        self.e.asm(5, |ops| {
            dynasm!(ops ; .arch x64
                ; mov r10, r11
                ; sub r10, QWORD [BYTE r12 + start]
                ; add r10, BYTE n
                ; sbb r9, r9 // -carry
                ; or r10, r9
            )
        });
    }

    /// The full access check, one copy per program, called from every access's cold side
    /// with r11 = address and r10d = the access descriptor ([`access_desc`]). Tries the
    /// context, the stack block (when the program has one) and the host regions in turn;
    /// returns when one holds `[r11, +size)` (any write needing `PJ_REGION_WRITABLE`),
    /// otherwise records the stop and unwinds. Clobbers r9 and r10 only.
    ///
    /// Every way to `done` is a `jbe` on the deciding compare, with its flags still live
    /// there, so the `cmova` replaces the address with `env` (a harmless, mapped address)
    /// should that branch have been mispredicted; the context test is branch-free up to its
    /// compare for the same reason (a below-start address becomes an all-ones end instead
    /// of taking a branch that could be mispredicted too).
    ///
    /// Every register here is fixed, so the routine is written in `dynasm!` directly and
    /// dynasm picks REX, SIB and displacement sizes (env offsets: see [`env8`]; the regions
    /// pointer, at offset 0, is `[r12]`, which has no displacement at all).
    fn access_check_routine(&mut self, l: Label) {
        const _: () = assert!(PJ_ENV_REGIONS == 0);
        const WRITE: i32 = PJ_ACCESS_WRITE as i32;
        const WRITABLE: i8 = {
            assert!(PJ_REGION_WRITABLE < 128);
            PJ_REGION_WRITABLE as i8
        };
        const ACCESS_MASK: i32 = (1 << ACCESS_BITS) - 1;
        const SHIFT: i8 = ACCESS_BITS as i8;
        const OOB: i32 = PJ_STOP_OUT_OF_BOUNDS as i32;
        self.e.bind(l);
        let (top, next, fail, done, check) = (
            self.e.label(),
            self.e.label(),
            self.e.label(),
            self.e.label(),
            self.e.label(),
        );
        // rdx = size for the whole routine. Context: rax = addr - start + size, all-ones
        // when that wraps, against rcx = the context's length.
        self.e.asm(11, |ops| {
            dynasm!(ops ; .arch x64
                ; push rax
                ; push rcx
                ; push rdx
                ; movzx edx, r10b
                ; mov rax, r11
                ; sub rax, QWORD [BYTE r12 + CTX_START8]
                ; add rax, rdx
                ; sbb rcx, rcx
                ; or rax, rcx
                ; mov rcx, QWORD [BYTE r12 + CTX_END8]
                ; sub rcx, QWORD [BYTE r12 + CTX_START8]
            )
        });
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp rax, rcx));
        self.e.jump(Some(Cc::Be), done);
        if self.plan.block > 0 {
            // The stack block: inside iff `addr - stack_start <= block - size` (see
            // `stack_cmp`; the block is at most a few KiB, so it fits the imm32).
            let block = self.plan.block as i32;
            self.e.asm(5, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov rax, r11
                    ; sub rax, QWORD [BYTE r12 + STACK_START8]
                    ; mov ecx, DWORD block
                    ; sub rcx, rdx
                    ; cmp rax, rcx
                )
            });
            self.e.jump(Some(Cc::Be), done);
        }
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov rcx, QWORD [BYTE r12 + REGION_COUNT8]
                ; mov rax, QWORD [r12]
            )
        });
        self.e.bind(top);
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; test rcx, rcx));
        self.e.jump(Some(Cc::E), fail);
        // A write needs PJ_REGION_WRITABLE.
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; test r10d, DWORD WRITE));
        self.e.jump(Some(Cc::E), check);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; test BYTE [rax + 16], BYTE WRITABLE),
        );
        self.e.jump(Some(Cc::E), next);
        self.e.bind(check);
        // r9 = addr - start
        self.e.asm(
            2,
            |ops| dynasm!(ops ; .arch x64 ; mov r9, r11 ; sub r9, QWORD [rax]),
        );
        self.e.jump(Some(Cc::B), next);
        // r9 += size, carry = wrapped
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; add r9, rdx));
        self.e.jump(Some(Cc::B), next);
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp r9, QWORD [rax + 8]));
        self.e.jump(Some(Cc::Be), done);
        self.e.bind(next);
        // Next entry: PjMemRegion is { start, len, flags }, 24 bytes (asserted in abi.rs).
        self.e.asm(
            2,
            |ops| dynasm!(ops ; .arch x64 ; add rax, BYTE 24 ; dec rcx),
        );
        self.e.jump(None, top);
        // Found, ahead of the stop so that every jump here is short: the flags are the
        // deciding compare's, which none of the pops touches.
        self.e.bind(done);
        self.e.asm(5, |ops| {
            dynasm!(ops ; .arch x64
                ; pop rdx
                ; pop rcx
                ; pop rax
                ; cmova r11, r12
                ; ret
            )
        });
        // No region holds it: stop with the address, the access and the pc (the pushes
        // and the return address go with the unwind).
        self.e.bind(fail);
        self.e.asm(7, |ops| {
            dynasm!(ops ; .arch x64
                ; mov QWORD [BYTE r12 + STOP_ADDR8], r11
                ; mov r9d, r10d
                ; shr r9d, SHIFT
                ; mov QWORD [BYTE r12 + STOP_PC8], r9
                ; and r10d, DWORD ACCESS_MASK
                ; mov DWORD [BYTE r12 + STOP_ACCESS8], r10d
                ; mov DWORD [BYTE r12 + STOP_KIND8], DWORD OOB
            )
        });
        self.stop_tail();
    }

    // ---- control flow -------------------------------------------------------------------

    fn ja(&mut self, inst: &Inst, target: usize) {
        if target == self.cur + 1 {
            // A jump to the next instruction is a no-op.
            return;
        }
        self.charge_back_edge(inst, target);
        let l = self.jump_label(target);
        self.e.jump(None, l);
    }

    /// Where the current jump lands: on the pointer clamp when it is a walk's back-edge, past
    /// the target group's check when the front end found the group already validated on
    /// every path to the jump (and this backend emitted the group's widened check, see
    /// [`Self::group_supported`]), else at the target.
    fn jump_label(&self, target: usize) -> Label {
        if let Some(k) = self.plan.access.walk_of_back_edge(self.cur) {
            return self.copy_head.unwrap_or(self.walk_clamps[k]);
        }
        match self.plan.access.reentry(self.cur) {
            Some(g) if self.group_supported(g) => {
                self.group_resume[g].expect("re-entered groups have a resume label")
            }
            _ => self.inst_label[target],
        }
    }

    /// Before a walk's head (`packjit_frontend::walks`): the entry (which first copies the
    /// pointer into the walk's shadow register, when it has one) jumps over the pointer
    /// clamp its back-edge lands on. The clamp redoes the loop's test and, with no branch,
    /// gives the shadow the pointer or 0 (or, without a shadow, zeroes the pointer itself)
    /// when the loop should have ended (a mispredicted back-edge).
    fn walk_clamp_at(&mut self, i: usize) {
        let Some(k) = self.plan.access.walk_at_head(i) else {
            return;
        };
        let w = self.plan.access.walks[k];
        let (head, clamp) = (self.inst_label[i], self.walk_clamps[k]);
        let (p, b) = (host(w.ptr), host(w.bound));
        let shadow = self.walk_shadow(&w).map(host);
        if let Some(guard) = w.guard {
            self.walk_guard(k, &w, guard);
        }
        if let Some(s) = shadow {
            // mov s, p: the first iteration's pointer is exact, its copy needs no clamp.
            self.e.rr(&[], Sz::B64, &[0x89], p, s);
        }
        self.e.jump(None, head);
        self.e.bind(clamp);
        if !self.clamp {
            return;
        }
        let Op::Jcond { cond, dst, .. } = self.prog.insts[w.back_edge].op else {
            unreachable!("a walk's back-edge is a conditional jump");
        };
        // The back-edge compares two registers (`cmp dst, src`) and only its taken side
        // reaches here: without a budget charge in between, its flags are still live, and
        // its own condition is "the loop goes on".
        let budget = self.mode.counts_budget();
        if budget {
            // cmp p, b
            self.e.rr(&[], Sz::B64, &[0x39], b, p);
        }
        let ptr_first = budget || dst == w.ptr;
        if let Some(s) = shadow {
            // The copy wants the order, `p < b` (`<=` for `Le`; see `Walk::shadow`), from
            // the same flags: mov s32, 0 (leaves the flags) ; cmov<inside> s, p. Both off
            // the pointer's own chain.
            let inside = match (w.cont, ptr_first) {
                (Cond::Le, true) => Cc::Be,
                (Cond::Le, false) => Cc::Ae,
                (_, true) => Cc::B,
                (_, false) => Cc::A,
            };
            self.e.op_plus_r(Sz::B32, &[0xb8], s);
            self.e.imm_bytes(0, 4);
            self.e.rr(&[], Sz::B64, &[0x0f, 0x40 | inside as u8], s, p);
            return;
        }
        let ended = if budget {
            match w.cont {
                Cond::Ne => Cc::E,
                Cond::Lt => Cc::Ae,
                _ => Cc::A,
            }
        } else {
            cc_of(cond).invert()
        };
        // mov r9d, 0 (leaves the flags) ; cmov<loop ended> p, r9
        self.e.op_plus_r(Sz::B32, &[0xb8], T9);
        self.e.imm_bytes(0, 4);
        self.e.rr(&[], Sz::B64, &[0x0f, 0x40 | ended as u8], p, T9);
    }

    /// A guarded walk's entry test (`packjit_frontend::walks::Guard`): the context bounds,
    /// then the walk's extent; any failure runs the loop's checked copy ([`Cold::Walk`]).
    /// Then `lfence`, once per loop entry: nothing of the unchecked loop runs before the
    /// test's branches have resolved, so a mispredicted one cannot run it on a bad walk.
    fn walk_guard(&mut self, k: usize, w: &Walk, g: Guard) {
        let (p, b) = (host(w.ptr), host(w.bound));
        let at = self.e.label();
        let (end, bias, shift) = (g.end as i32, g.bias as i32, g.shift as i8);
        // r9 = len - end, r11 = q = p - start; r9 = len - end - q.
        self.mov_rr(Sz::B64, T11, p);
        match g.region {
            GuardRegion::Context => {
                self.ctx_len();
                self.e
                    .asm(1, |ops| dynasm!(ops ; .arch x64 ; sub r9, DWORD end));
                self.cold_jump(Some(Cc::B), at);
                self.e.asm(
                    1,
                    |ops| dynasm!(ops ; .arch x64 ; sub r11, QWORD [BYTE r12 + CTX_START8]),
                );
            }
            GuardRegion::Frame => {
                // The frame is [rbp - 512, rbp), and 512 >= end.
                let room = STACK_SIZE as i32 - end;
                self.e.asm(3, |ops| {
                    dynasm!(ops ; .arch x64
                        ; mov r9d, DWORD room
                        ; sub r11, rbp
                        ; add r11, DWORD STACK_SIZE as i32
                    )
                });
            }
        }
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; sub r9, r11));
        self.cold_jump(Some(Cc::B), at);
        // r10 = b - p - bias: the last head value's offset from p, before rounding down.
        self.mov_rr(Sz::B64, T10, b);
        self.e.rr(&[], Sz::B64, &[0x29], p, T10);
        if bias != 0 {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; sub r10, DWORD bias));
        }
        if shift != 0 {
            let ne = w.cont == Cond::Ne;
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64 ; shr r9, shift);
                if ne {
                    dynasm!(ops ; .arch x64 ; ror r10, shift);
                } else {
                    dynasm!(ops ; .arch x64 ; shr r10, shift);
                }
            });
        }
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp r10, r9));
        self.cold_jump(Some(Cc::A), at);
        if self.clamp {
            self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; lfence));
        }
        self.cold.push(Cold::Walk { at, walk: k });
    }

    /// The register a walk's clamp writes its copy of the pointer to (`Walk::shadow`),
    /// when there is one and clamping is on (without the clamp, measurement only, the
    /// accesses use the pointer itself).
    fn walk_shadow(&self, w: &Walk) -> Option<Reg> {
        w.shadow.filter(|_| self.clamp)
    }

    /// Base and offset of the current (unchecked) access: through its walk's shadow when
    /// the walk clamps into one (`AccessPlan::walked_address`).
    fn walked_address(&self, base: Reg, off: i16) -> (Reg, i16) {
        if self.clamp {
            self.plan.access.walked_address(self.cur, base, off)
        } else {
            (base, off)
        }
    }

    fn jcond(
        &mut self,
        inst: &Inst,
        width: Width,
        cond: Cond,
        dst: Reg,
        src: Operand,
        target: usize,
    ) {
        let pc = inst.pc as usize;
        let sz = sz_of(width);
        let d = host(dst);
        match src {
            Operand::Reg(s) if cond == Cond::Set => self.e.rr(&[], sz, &[0x85], host(s), d),
            Operand::Reg(s) => self.e.rr(&[], sz, &[0x39], host(s), d),
            Operand::Imm(i) if self.mask(pc).is_some() => {
                self.imm_to(pc, T11, i);
                let op = if cond == Cond::Set { 0x85 } else { 0x39 };
                self.e.rr(&[], sz, &[op], T11, d);
            }
            Operand::Imm(0) if matches!(cond, Cond::Eq | Cond::Ne) => {
                // test d, d: two bytes shorter than cmp d, 0.
                self.e.rr(&[], sz, &[0x85], d, d);
            }
            Operand::Imm(i) if cond == Cond::Set => {
                if (0..=0xff).contains(&i) {
                    // test r8, imm8 sees exactly the bits a small positive mask can hit.
                    self.e.rr(&[], Sz::B8, &[0xf6], 0, d);
                    self.e.imm_bytes(i as i64, 1);
                } else {
                    self.e.rr(&[], sz, &[0xf7], 0, d);
                    self.e.imm_bytes(i as i64, 4);
                }
            }
            Operand::Imm(i) => self.alu_ri(7, sz, d, i as i64),
        }
        let cc = cc_of(cond);
        let l = self.jump_label(target);
        if self.mode.counts_budget() && back_edge_charge(self.prog, self.cur, target).is_some() {
            let skip = self.e.label();
            self.e.jump(Some(cc.invert()), skip);
            self.charge_back_edge(inst, target);
            self.e.jump(None, l);
            self.e.bind(skip);
        } else {
            self.e.jump(Some(cc), l);
        }
    }

    fn charge_back_edge(&mut self, inst: &Inst, target: usize) {
        if !self.mode.counts_budget() {
            return;
        }
        if let Some(c) = back_edge_charge(self.prog, self.cur, target) {
            self.charge(inst.pc as usize, c);
        }
    }

    /// Budget: stop at `pc` (budget untouched) if `amount` exceeds it, else subtract.
    fn charge(&mut self, pc: usize, amount: u64) {
        // `cmp/sub QWORD [r12 + disp8], imm8` stay table-driven: dynasm-rs 5.1 lists the
        // imm32 form (0x81) of cmp and of memory-operand sub before the imm8 one (0x83), so
        // even a `BYTE` immediate is encoded as an imm32 (three bytes longer).
        self.alu_mi(7, ENV, PJ_ENV_BUDGET, amount as i64);
        let stop = self.stop_label(Stop::Budget, pc);
        self.cold_jump(Some(Cc::B), stop);
        self.alu_mi(5, ENV, PJ_ENV_BUDGET, amount as i64);
    }

    fn helper_entry(&self, inst: &Inst, id: u32) -> Result<HelperEntry, CompileError> {
        self.helpers
            .iter()
            .find(|h| h.id == id)
            .copied()
            .ok_or_else(|| {
                CompileError::at(
                    inst.pc as usize,
                    ErrorKind::UnknownHelper,
                    format!("call to unregistered helper id {id}"),
                )
            })
    }

    /// One helper-table entry at a `call imm` or a `callx` match: a call, or the body of an
    /// inlined helper (see [`HelperLowering`]).
    fn call_helper(&mut self, h: &HelperEntry) -> Result<(), CompileError> {
        match helper_lowering(h) {
            HelperLowering::Call(addr) => self.call_abs(addr),
            HelperLowering::RseqCpuId { offset } => self.inline_rseq_cpu_id(h.id, offset)?,
            HelperLowering::CounterClock { scale } => self.inline_tsc_clock(scale),
            HelperLowering::PerCpuLookup { table } => self.inline_percpu_lookup(table),
        }
        Ok(())
    }

    /// Per-CPU array lookup (r1 = array id, r2 = element index) against the host's table at
    /// `table`: three unsigned bounds checks (id, index, CPU), each failing to r0 = 0, then
    /// `base + cpu * slot_size + index * value_size`. The CPU is the rseq `cpu_id` read
    /// through `fs`, like the inlined helper 8. r1–r5 may be clobbered (it is a call).
    fn inline_percpu_lookup(&mut self, table: u64) {
        let null = self.e.label();
        let done = self.e.label();
        let (arrays, size) = (PJ_PERCPU_ARRAYS, PJ_PERCPU_ARRAY_SIZE);
        let (cpu_off, base, slot, vsz, ent, cpus) = (
            PJ_PERCPU_CPU_ID_OFFSET as i8,
            PJ_PERCPU_BASE as i8,
            PJ_PERCPU_SLOT_SIZE as i8,
            PJ_PERCPU_VALUE_SIZE as i8,
            PJ_PERCPU_ENTRIES as i8,
            PJ_PERCPU_CPUS as i8,
        );
        self.mov_ri(T11, table as i64);
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp rdi, QWORD [r11]));
        self.e.jump(Some(Cc::Ae), null);
        self.e.asm(3, |ops| {
            dynasm!(ops
                ; .arch x64
                ; imul r9, rdi, size
                ; lea r9, [r11 + r9 + arrays]
                ; cmp rsi, QWORD [BYTE r9 + ent]
            )
        });
        self.e.jump(Some(Cc::Ae), null);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; mov r10, QWORD [BYTE r11 + cpu_off]),
        );
        // fs ; mov eax, [r10] (REX.B for r10): the rseq cpu_id, zero-extended.
        self.e.raw(&[0x64, 0x41, 0x8b, 0x02]);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; cmp rax, QWORD [BYTE r9 + cpus]),
        );
        self.e.jump(Some(Cc::Ae), null);
        self.e.asm(4, |ops| {
            dynasm!(ops
                ; .arch x64
                ; imul rax, QWORD [BYTE r9 + slot]
                ; imul rsi, QWORD [BYTE r9 + vsz]
                ; add rax, rsi
                ; add rax, QWORD [BYTE r9 + base]
            )
        });
        self.e.jump(None, done);
        self.e.bind(null);
        self.xor_zero(RAX);
        self.e.bind(done);
    }

    /// The per-CPU address instruction: `dst = src + cpu * slot_size` of array `array` in the
    /// table of the `PJ_HELPER_PERCPU_OFFSET` entry, `dst = src` when `array >= count` or
    /// `cpu >= cpus` (so the offset never leaves the registered area). The CPU comes the way
    /// helper 8 does: `fs`-relative rseq load, or a call with every caller-saved BPF register
    /// (r0–r5) pushed around it, so nothing but `dst` changes.
    fn mov_percpu(
        &mut self,
        inst: &Inst,
        dst: Reg,
        src: Reg,
        array: u32,
    ) -> Result<(), CompileError> {
        let pc = inst.pc as usize;
        let table = self.helper_entry(inst, PJ_HELPER_PERCPU_OFFSET)?.addr;
        let cpu = self.helper_entry(inst, PJ_HELPER_GET_SMP_PROCESSOR_ID)?;
        match helper_lowering(&cpu) {
            HelperLowering::RseqCpuId { offset } => {
                let disp = i32::try_from(offset).map_err(|_| {
                    CompileError::at(
                        pc,
                        ErrorKind::InvalidArgument,
                        format!(
                            "per-CPU mov: rseq offset {offset} does not fit a 32-bit displacement"
                        ),
                    )
                })?;
                // fs ; mov r10d, [disp32] (REX.R; ModRM reg=r10 rm=SIB; SIB no base/index).
                let mut b = vec![0x64, 0x44, 0x8b, 0x14, 0x25];
                b.extend_from_slice(&disp.to_le_bytes());
                self.e.raw(&b);
            }
            HelperLowering::Call(addr) => {
                // Six pushes keep rsp 16-byte aligned at the call, as at any helper call.
                self.e.asm(6, |ops| {
                    dynasm!(ops ; .arch x64 ; push rax ; push rdi ; push rsi ; push rdx ; push rcx ; push r8)
                });
                self.call_abs(addr);
                self.e.asm(7, |ops| {
                    dynasm!(ops ; .arch x64 ; mov r10, rax ; pop r8 ; pop rcx ; pop rdx ; pop rsi ; pop rdi ; pop rax)
                });
            }
            _ => {
                return Err(CompileError::at(
                    pc,
                    ErrorKind::Unsupported,
                    "per-CPU mov: helper 8 must be a call or the inline rseq load",
                ))
            }
        }
        let zero = self.e.label();
        let done = self.e.label();
        // An id past i32 cannot be in the table (it would need 2^31 arrays): offset 0.
        if let Ok(id) = i32::try_from(array) {
            let (slot, cpus) = (
                (PJ_PERCPU_ARRAYS + PJ_PERCPU_SLOT_SIZE) as i8,
                (PJ_PERCPU_ARRAYS + PJ_PERCPU_CPUS) as i8,
            );
            // The id is the program's constant: blinded like any immediate, and the array's
            // address is computed at run time (no id-derived constant in the code).
            self.imm_to(pc, T9, id);
            self.mov_ri(T11, table as i64);
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp QWORD [r11], r9));
            self.e.jump(Some(Cc::Be), zero);
            self.e.asm(3, |ops| {
                dynasm!(ops
                    ; .arch x64
                    ; imul r9, r9, PJ_PERCPU_ARRAY_SIZE
                    ; add r11, r9
                    ; cmp r10, QWORD [BYTE r11 + cpus]
                )
            });
            self.e.jump(Some(Cc::Ae), zero);
            self.e.asm(
                2,
                |ops| dynasm!(ops ; .arch x64 ; mov r9, r10 ; imul r9, QWORD [BYTE r11 + slot]),
            );
            self.e.jump(None, done);
        }
        self.e.bind(zero);
        self.xor_zero(T9);
        self.e.bind(done);
        self.mov_rr(Sz::B64, host(dst), host(src));
        // add dst, r9
        self.e.rr(&[], Sz::B64, &[0x01], T9, host(dst));
        Ok(())
    }

    /// `mov eax, fs:[offset]`: glibc keeps the thread's `struct rseq` at a fixed offset from
    /// the thread pointer (`fs` base), and the kernel stores the current CPU in its `cpu_id`
    /// on every return to user space after a migration. One load, zero-extending into r0.
    fn inline_rseq_cpu_id(&mut self, id: u32, offset: i64) -> Result<(), CompileError> {
        let disp = i32::try_from(offset).map_err(|_| {
            CompileError::new(
                ErrorKind::InvalidArgument,
                format!("helper id {id}: rseq offset {offset} does not fit a 32-bit displacement"),
            )
        })?;
        // fs ; mov r32, r/m32 ; ModRM mod=00 rm=100 (SIB) ; SIB no base, no index: [disp32].
        let mut b = vec![0x64, 0x8b, 0x04, 0x25];
        b.extend_from_slice(&disp.to_le_bytes());
        self.e.raw(&b);
        Ok(())
    }

    /// `rdtsc` scaled to nanoseconds with the host's `PjClockScale` at `scale`:
    /// `ns = tsc * mult_int + hi64(tsc * mult_frac) + offset`. `rdtsc` and `mul` write rdx
    /// (BPF r3), so it is kept in r10 and restored: the inlined helper leaves r1–r5 alone.
    fn inline_tsc_clock(&mut self, scale: u64) {
        let (int, frac, off) = (
            PJ_CLOCK_MULT_INT as i8,
            PJ_CLOCK_MULT_FRAC as i8,
            PJ_CLOCK_OFFSET as i8,
        );
        self.mov_rr(Sz::B64, T10, RDX);
        self.mov_ri(T11, scale as i64);
        self.e.asm(9, |ops| {
            dynasm!(ops
                ; .arch x64
                ; rdtsc
                ; shl rdx, 32
                ; or rax, rdx
                ; mov r9, rax
                ; mul QWORD [BYTE r11 + frac]
                ; imul r9, QWORD [BYTE r11 + int]
                ; add r9, rdx
                ; add r9, QWORD [BYTE r11 + off]
                ; mov rax, r9
            )
        });
        self.mov_rr(Sz::B64, RDX, T10);
    }

    /// `movabs r11, addr ; call r11`: helpers live anywhere in the address space.
    fn call_abs(&mut self, addr: u64) {
        self.mov_ri(T11, addr as i64);
        self.e.call_r11();
    }

    /// `callx reg`: the id in `reg` picks the helper (the table is fixed at compile time,
    /// see `analysis::callx_plan`): inlined helpers are compared for first, then called
    /// ones through a table of addresses in the code image, or compared for one by one when
    /// their ids are too few or too sparse. No match stops the program with
    /// PJ_STOP_UNKNOWN_CALLX.
    fn callx(&mut self, pc: usize, reg: Reg) {
        let r = host(reg);
        let done = self.e.label();
        let plan = callx_plan(self.helpers);
        let stop = self.stop_label(Stop::Callx { reg: r }, pc);
        let cmp = |em: &mut Self, id: u32| {
            if i32::try_from(id).is_ok() {
                em.alu_ri(7, Sz::B64, r, id as i64);
            } else {
                em.mov_ri(T11, id as i64);
                em.e.rr(&[], Sz::B64, &[0x39], T11, r);
            }
        };
        // Kinds were checked when the table was validated (`call_helper` only fails on an
        // unknown kind), so these cannot fail here.
        if let Some(table) = plan.table {
            for h in &plan.compared {
                let next = self.e.label();
                cmp(self, h.id);
                self.e.jump(Some(Cc::Ne), next);
                let _ = self.call_helper(h);
                self.e.jump(None, done);
                self.e.bind(next);
            }
            // Unsigned bound (a huge or "negative" id fails it), then the address, 0 for a
            // hole.
            let at = self.e.label();
            cmp(self, table.len() as u32);
            self.cold_jump(Some(Cc::Ae), stop);
            self.e.load_table_entry(T11, at, r);
            self.cold_jump(Some(Cc::E), stop);
            self.e.call_r11();
            self.callx_tables.push((at, table));
            self.e.bind(done);
            return;
        }
        // All but the last id branch to their call; the last one falls into its call and
        // a miss goes to the stop.
        let helpers = plan.compared;
        let Some((last, rest)) = helpers.split_last() else {
            self.cold_jump(None, stop);
            return;
        };
        let mut hits = Vec::new();
        for h in rest {
            let l = self.e.label();
            cmp(self, h.id);
            self.e.jump(Some(Cc::E), l);
            hits.push((l, *h));
        }
        cmp(self, last.id);
        self.cold_jump(Some(Cc::Ne), stop);
        let _ = self.call_helper(last);
        for (l, h) in hits {
            self.e.jump(None, done);
            self.e.bind(l);
            let _ = self.call_helper(&h);
        }
        self.e.bind(done);
    }

    fn call_local(&mut self, pc: usize, target: usize) {
        if self.mode.counts_budget() {
            self.charge(pc, CALL_CHARGE);
        }
        let k = self.prog.subprog_of(target);
        let l = self.sub_entry[k];
        if self.plan.block > 0 {
            // The callee's r10 is ours minus one frame.
            self.alu_ri(5, Sz::B64, RBP, STACK_SIZE as i64);
        }
        self.e.call_label(l);
        if self.plan.block > 0 {
            self.alu_ri(0, Sz::B64, RBP, STACK_SIZE as i64);
        }
    }

    fn exit(&mut self, i: usize, k: usize) {
        if i + 1 == self.prog.subprogs[k].end {
            return; // falls into the epilogue
        }
        if self.bare_return(k) {
            self.e.ret();
        } else {
            let l = self.sub_exit[k];
            self.e.jump(None, l);
        }
    }

    fn cold_blocks(&mut self) -> Result<(), CompileError> {
        let start = self.e.pos();
        // A group's checked copy adds cold blocks of its own.
        while !self.cold.is_empty() {
            self.cold_round()?;
        }
        self.place_unplaced_stubs();
        self.islands.cold_placed(start, self.e.pos());
        Ok(())
    }

    /// `jcc` (or `jmp`) to the cold side of the current instruction or to a stop stub, both
    /// placed after the function: `rel32` from the first pass when that is expected beyond
    /// `rel8` (see `ColdPlacement`), as it is in all but the shortest functions of checked
    /// or budgeted code, instead of a second pass to find that out. Trusted code (whose only
    /// cold sides are the rare divisors) and checked copies (cold code themselves, their
    /// cold sides right after them) guess short.
    fn cold_jump(&mut self, cc: Option<Cc>, label: Label) {
        let checked = self.mode.sandboxed() || self.mode.counts_budget();
        let far = checked
            && self.islands.guessing()
            && !self.copy
            && self.islands.expected_distance(self.e.pos(), self.cur) > i8::MAX as usize;
        let at_least = if far { Form::Rel32 } else { Form::Rel8 };
        self.e.jump_at_least(cc, label, at_least);
    }

    /// The checked copy of the instructions `range` at `at` (a loop's back-edge then goes to
    /// the copy's own head); the caller goes on from its end.
    fn checked_copy(
        &mut self,
        at: Label,
        range: RangeInclusive<usize>,
        of: CopyOf,
    ) -> Result<(), CompileError> {
        let k = self.prog.subprog_of(*range.start());
        self.e.bind(at);
        self.copy = true;
        self.copy_head = (of == CopyOf::Loop).then_some(at);
        self.skip = None;
        for i in range {
            if self.skip == Some(i) {
                // Fused into the previous instruction (also in this copy).
                continue;
            }
            let inst = self.prog.insts[i];
            self.cur = i;
            self.inst(i, k, &inst)?;
        }
        (self.copy, self.copy_head, self.skip) = (false, None, None);
        Ok(())
    }

    fn cold_round(&mut self) -> Result<(), CompileError> {
        for c in std::mem::take(&mut self.cold) {
            match c {
                Cold::Access { at, back, desc } => self.access_slow_path(at, back, desc),
                Cold::Group { at, group } => {
                    let g = &self.plan.access.groups[group];
                    let (range, reentered) = (g.first..=g.last, g.reentered);
                    let last = g.last;
                    self.checked_copy(at, range, CopyOf::Group)?;
                    if reentered && self.clamp {
                        // A jump may later skip this group's check, trusting the base: no
                        // instruction after this point runs before every member's check
                        // above has resolved, so a mispredicted one cannot carry an
                        // unchecked base past here (LFENCE, the x86 speculation barrier).
                        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; lfence));
                    }
                    // On after the group; an instruction fused into the last member was
                    // done by it, and its label is where the one after it starts.
                    let next = self.inst_label[last + 1];
                    self.e.jump(None, next);
                }
                Cold::Walk { at, walk } => {
                    let w = &self.plan.access.walks[walk];
                    let (range, back_edge) = (w.head..=w.back_edge, w.back_edge);
                    self.checked_copy(at, range, CopyOf::Loop)?;
                    // The back-edge falls through: a loop never ends its function.
                    let next = self.inst_label[back_edge + 1];
                    self.e.jump(None, next);
                }
                Cold::DivZero { at, back, sz, rem } => {
                    self.e.bind(at);
                    if rem {
                        self.mov_rr(sz, T11, RAX);
                    } else {
                        self.xor_zero(T11);
                    }
                    self.e.jump(None, back);
                }
                Cold::DivMinus1 { at, back, sz, rem } => {
                    self.e.bind(at);
                    if rem {
                        self.xor_zero(T11);
                    } else {
                        self.e.rr(&[], sz, &[0xf7], 3, RAX);
                        self.mov_rr(sz, T11, RAX);
                    }
                    self.e.jump(None, back);
                }
            }
        }
        Ok(())
    }

    /// The stubs asked for and not placed by a cold block yet.
    fn place_unplaced_stubs(&mut self) {
        for k in std::mem::take(&mut self.unplaced_stubs) {
            if !self.stops[k as usize].placed {
                self.place_stub(k as usize);
            }
        }
    }

    /// A stop stub, here: record kind, pc (and address, access or id), then unwind to the
    /// entry's pops with the native sp saved at entry. The first stub placed carries that
    /// shared tail; the others jump back to it.
    fn place_stub(&mut self, k: usize) {
        let StopStub {
            label, stop, pc, ..
        } = self.stops[k];
        self.stops[k].placed = true;
        self.e.bind(label);
        let kind = match stop {
            Stop::Budget => PJ_STOP_BUDGET,
            Stop::Callx { reg } => {
                // The id's register is chosen at run time: the table-driven form
                // keeps it REX-free when it can be (see encode.rs).
                self.e.rm(&[], Sz::B64, &[0x89], reg, ENV, PJ_ENV_STOP_ADDR);
                PJ_STOP_UNKNOWN_CALLX
            }
        };
        let kind = kind as i32;
        // pc < MAX_INSNS (10⁶), so it fits the sign-extended imm32.
        let pc = pc as i32;
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov DWORD [BYTE r12 + STOP_KIND8], DWORD kind
                ; mov QWORD [BYTE r12 + STOP_PC8], DWORD pc
            )
        });
        self.stop_tail();
    }

    /// The stops' shared tail, here the first time (every later stop jumps to it): unwind
    /// to the entry's pops with the native sp saved at entry.
    fn stop_tail(&mut self) {
        if let Some(tail) = self.stop_tail {
            self.e.jump(None, tail);
            return;
        }
        let tail = self.e.label();
        self.e.bind(tail);
        self.stop_tail = Some(tail);
        // r0 is meaningless after a stop; u64::MAX is what hosts of the ABI v1 contract
        // (`PJ_CALLX_UNKNOWN`) read from an unknown callx, so both agree.
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; or rax, BYTE -1
                ; mov rsp, QWORD [BYTE r12 + ENTRY_SP8]
            )
        });
        let l = self.entry_pops;
        self.e.jump(None, l);
    }
}

trait MapReg {
    fn map_reg(self, f: impl Fn(Reg) -> Gpr) -> Operand;
}

impl MapReg for Operand {
    /// Replaces a BPF register by its host register (numbers reused as `Reg`).
    fn map_reg(self, f: impl Fn(Reg) -> Gpr) -> Operand {
        match self {
            Operand::Reg(r) => Operand::Reg(f(r)),
            i => i,
        }
    }
}

/// Bits of an access descriptor below its pc: the `PJ_ACCESS_*` word (size, write bit).
const ACCESS_BITS: u32 = 9;
const _: () = assert!(PJ_ACCESS_WRITE < 1 << ACCESS_BITS);
// Every pc fits above the access bits of a positive imm32 (pcs are below `MAX_INSNS`).
const _: () = assert!((MAX_INSNS as u64) << ACCESS_BITS < 1 << 31);

/// What the shared access check gets in r10d: `pc << ACCESS_BITS | access`, one `mov` per
/// checked access; the stop it may record names the pc and the access.
fn access_desc(pc: usize, size: Size, write: bool) -> u32 {
    let access = size.bytes() | if write { PJ_ACCESS_WRITE } else { 0 };
    (pc as u32) << ACCESS_BITS | access
}

fn sz_of(w: Width) -> Sz {
    match w {
        Width::W32 => Sz::B32,
        Width::W64 => Sz::B64,
    }
}

fn mem_sz(s: Size) -> Sz {
    match s {
        Size::B => Sz::B8,
        Size::H => Sz::B16,
        Size::W => Sz::B32,
        Size::DW => Sz::B64,
    }
}

fn cc_of(c: Cond) -> Cc {
    match c {
        Cond::Eq => Cc::E,
        Cond::Ne | Cond::Set => Cc::Ne,
        Cond::Gt => Cc::A,
        Cond::Ge => Cc::Ae,
        Cond::Lt => Cc::B,
        Cond::Le => Cc::Be,
        Cond::Sgt => Cc::G,
        Cond::Sge => Cc::Ge,
        Cond::Slt => Cc::L,
        Cond::Sle => Cc::Le,
    }
}
