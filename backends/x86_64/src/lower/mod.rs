//! eBPF → x86-64 lowering: the ISA hooks of the shared driver
//! (`packjit_frontend::lower`), one short function per instruction class.
//!
//! Layout of the emitted code: the functions in bytecode order (the entry first, at offset
//! 0), each `prologue, body, epilogue` followed by its cold code; then, in sandbox mode, the
//! shared region-table scan, and the `callx` tables. All branches are PC-relative and
//! helpers are called through absolute addresses in r11, so the bytes run at any address.
//!
//! Files: `alu.rs` (arithmetic, division and its fix-ups), `mem.rs` (loads, stores, atomics
//! and their sandbox checks), `jump.rs` (jumps, budget charges, walks), `call.rs` (helpers,
//! `callx`, per-CPU, inlined built-ins), `cold.rs` (stop stubs, the shared access check).

mod alu;
mod call;
mod cold;
mod jump;
mod mem;

use crate::encode::{Assembler, Cc, Form, Gpr, Label, Sz, REL32_GROWTH, TYPICAL_HOT_BYTES};
use crate::frame::{plan, Plan};
use crate::regs::*;

use packjit_frontend::analysis::{CodegenMode, EmitCapacity};
use packjit_frontend::cold::ColdPlacement;
use packjit_frontend::lower::{self, Assembled, Driver, Lowering, Pass};
use packjit_frontend::ranges::{plan_accesses, AccessCheck, Group};
use packjit_frontend::relax::{BranchCheck, Relaxation};

use packjit_frontend::{Cond, Operand, Program, Reg, Size, Width};
use packjit_plugin_api::abi::*;
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::ops::Range;

use packjit_frontend::analysis::EmitOptions;
use packjit_frontend::lower::Emitted;

use alu::DivFix;
use cold::StopStubs;

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
pub(crate) const CTX_LEN8: i8 = env8(PJ_ENV_CTX_LEN);
pub(crate) const STACK_START8: i8 = env8(PJ_ENV_STACK_START);
pub(crate) const STACK_END8: i8 = env8(PJ_ENV_STACK_END);

// The `dynasm!` text names the register map's env (r12) and scratch registers (r9–r11).
const _: () = assert!(ENV == 12 && T9 == 9 && T10 == 10 && T11 == 11);

/// The lowering (`crate::emit_decoded`), with measurement switches (benches only, see [`EmitOptions`]).
pub fn emit_decoded_with(
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
    let relax = Relaxation::new(Form::Rel32, REL32_GROWTH, 0);
    // `jcc rel32` reaches ±2 GiB: no island is ever due, cold code stays after its function.
    let islands = ColdPlacement::new(usize::MAX, TYPICAL_HOT_BYTES);
    let plan = &plan;
    lower::emit(relax, islands, |forms: &[Form], islands| {
        let mut cg = Codegen::new(prog, helpers, mode, plan, forms.to_vec(), islands);
        cg.d.clamp = opts.spectre_clamp;
        cg.regrow = opts.regrow;
        Ok(cg)
    })
}

/// Groups whose widened test this backend encodes: a constant context end within `imm32`,
/// or a span within the `imm8` of [`Codegen::region_end`]. The others' members are checked
/// one by one.
fn encodes_group(g: &Group) -> bool {
    match g.check {
        AccessCheck::CtxConst { end } => end <= i32::MAX as u32,
        _ => g.hi - (g.lo as i32) < 128,
    }
}

/// One emission pass.
pub struct Codegen<'a> {
    /// The driver's state of this pass (x86-64's slow path of an access finds its address
    /// in r11, so an access site needs nothing more).
    pub(crate) d: Driver<'a, (), DivFix>,
    pub(crate) e: Assembler,
    pub(crate) plan: &'a Plan,
    helpers: &'a [HelperEntry],
    /// Entry epilogue after the pad: where a stop lands with rsp = env.entry_sp.
    pub(crate) entry_pops: Label,
    /// Stop stubs (budget, unknown `callx`), x86-64's own: shared by (kind, pc).
    stops: StopStubs,
    /// The shared full access check ([`Self::access_check_routine`]), made at the first use.
    access_check: Option<Label>,
    /// `callx` address tables (label, entries), placed after all code as data.
    callx_tables: Vec<(Label, Vec<u64>)>,
    /// A zero word placed after all code, made at the first use: the source of the
    /// `cmovae` that selects NULL for a sandboxed array lookup's key past the end.
    zero_word: Option<Label>,
    /// Where the tables and the zero word went (`Emitted::data`), in the code as emitted.
    data: Vec<Range<usize>>,
    /// Widen out-of-reach branches in place (`Pass::regrow`; `EmitOptions::regrow`).
    regrow: bool,
}

/// The registers a loop may count the budget in (`Driver::count_budget_in_loops`): r5,
/// r4 and r3 (caller-saved host registers; the lowering's own uses of rcx and rdx, shifts
/// and divisions, put the program's value back), and those of r6–r9 the program uses
/// somewhere (the entry saves them for the host; one it never mentions is not saved).
fn budget_loop_registers(used: u16) -> Vec<Reg> {
    [5, 9, 8, 7, 6, 4, 3]
        .into_iter()
        .filter(|&r| r < 6 || used & (1 << r) != 0)
        .collect()
}

impl<'a> Codegen<'a> {
    #[inline(always)]
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
        let mut e = Assembler::with_capacity(forms, cap.code, cap.labels, cap.branch_sites);
        let mut d = Driver::new(
            prog,
            helpers,
            &plan.access,
            mode,
            islands,
            || e.label(),
            encodes_group,
        );
        if mode.counts_budget() {
            d.count_budget_in_loops(&budget_loop_registers(plan.used), || e.label());
        }
        let entry_pops = e.label();
        Codegen {
            d,
            e,
            plan,
            helpers,
            entry_pops,
            stops: StopStubs::default(),
            access_check: None,
            callx_tables: Vec::new(),
            zero_word: None,
            data: Vec::new(),
            regrow: true,
        }
    }

    // ---- small emit helpers -------------------------------------------------------------

    /// `mov dst, src`, unless it is a 64-bit move to itself (a 32-bit one zero-extends).
    pub(crate) fn mov_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        if dst != src || sz != Sz::B64 {
            self.e.mov_rr(sz, dst, src);
        }
    }

    /// `xor r32, r32`: the shortest zeroing idiom (and a dependency breaker).
    pub(crate) fn xor_zero(&mut self, r: Gpr) {
        self.e.xor_rr(Sz::B32, r, r);
    }

    /// 64-bit `r = v`, shortest form: `xor` for 0, `mov r32, imm32` (zero-extends) for
    /// values below 2³², `mov r64, simm32` for negative 32-bit values, else `movabs`.
    pub(crate) fn mov_ri(&mut self, r: Gpr, v: i64) {
        if v == 0 {
            self.xor_zero(r);
        } else if let Ok(v) = u32::try_from(v) {
            self.e.mov_r32_imm(r, v);
        } else if let Ok(v) = i32::try_from(v) {
            self.e.mov_r64_simm32(r, v);
        } else {
            self.e.movabs(r, v);
        }
    }
}

impl<'a> Lowering<'a> for Codegen<'a> {
    type AccessSite = ();
    type IsaCold = DivFix;

    fn driver(&mut self) -> &mut Driver<'a, (), DivFix> {
        &mut self.d
    }

    fn position(&self) -> usize {
        self.e.pos()
    }

    fn new_label(&mut self) -> Label {
        self.e.label()
    }

    fn bind(&mut self, label: Label) {
        self.e.bind(label);
    }

    fn jump(&mut self, label: Label) {
        self.e.jump(None, label);
    }
}

impl<'a> Pass<'a> for Codegen<'a> {
    type Form = Form;

    fn branch_checks(&mut self) -> Result<Option<Vec<BranchCheck<Form>>>, CompileError> {
        let encoding = |m| CompileError::new(ErrorKind::Encoding, m);
        // Usual case: every branch reaches in the form it was emitted in, which is exactly
        // when `settle` would say `Done`; skip building its inputs.
        if self.e.branches_fit().map_err(encoding)? {
            return Ok(None);
        }
        self.e.branch_checks().map(Some).map_err(encoding)
    }

    fn emitted_forms(&self) -> Vec<(usize, Form)> {
        // Later passes start from the forms this one emitted (a guessed or far backward
        // rel32 stays one). Sized up front: a collected filter would regrow from empty.
        let mut forms = Vec::with_capacity(self.e.sites());
        forms.extend(self.e.emitted_forms());
        forms
    }

    fn regrow(&mut self, forms: &[Form]) -> bool {
        // Branch forms are the only thing a later pass changes, and the encoder widens them
        // in place (`Assembler::regrow`): the second pass most checked or 100-instruction
        // programs needed was half their lowering (issue 45).
        self.regrow && self.e.regrow(forms)
    }

    fn relocate(&self, offsets: &mut [u32]) {
        // Instructions are emitted in order: their offsets ascend.
        let mut moved = self.e.ascending();
        for o in offsets {
            *o = moved.moved(*o as usize) as u32;
        }
    }

    fn resolve(&self, label: Label) -> Option<usize> {
        self.e.offset_of(label)
    }

    fn finish(self) -> Result<Assembled, CompileError> {
        let native_insns = self.e.insns;
        // Moved with the code a regrow widened (only the zero word's code is regrowable).
        let data = (self.data.iter())
            .map(|r| self.e.moved(r.start)..self.e.moved(r.start) + r.len())
            .collect();
        let bytes = self
            .e
            .finish()
            .map_err(|m| CompileError::new(ErrorKind::Internal, m))?;
        Ok(Assembled {
            bytes,
            native_insns,
            data,
        })
    }

    const LONGEST_BRANCH: &'static str = "the ±2 GiB of rel32";
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
