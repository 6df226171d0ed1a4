//! eBPF → AArch64 lowering: the front end's hooks (`packjit_frontend::lower`), one short
//! function per instruction class, each class in its file.
//!
//! Layout of the emitted code: the functions in bytecode order, each as `prologue, body,
//! epilogue, cold code`; then the program's shared access check (when some check's cold side
//! calls it) and the stop paths (`lower/cold.rs`), which a failed check, an exhausted budget
//! or an unknown `callx` id reach. The entry function starts at offset 0. Every branch is
//! PC-relative and helpers are reached through absolute addresses in a scratch register, so
//! the bytes run at any address.
//!
//! Division needs no guard: AArch64 `UDIV`/`SDIV` already return 0 for a zero divisor and
//! `SDIV` returns MIN for MIN / -1 (it never traps), and `MSUB` then yields `x % 0 = x` and
//! `MIN % -1 = 0` — exactly RFC 9669. Register shifts (`LSLV`...) take the count modulo the
//! width, which is eBPF's masking; 32-bit (`W`) results are zero-extended by the hardware.

mod alu;
mod call;
mod cold;
mod jump;
mod mem;

use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi};
use packjit_frontend::{
    AluOp, AtomicOp, Cond, EndKind, Op, Operand, Program, Reg, Size, Width, Width::W32, Width::W64,
    R10, STACK_SIZE,
};
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::convert::Infallible;

use crate::encode::*;
use crate::frame::{plan, Plan};
use crate::regs::*;
use crate::FEATURE_LSE;
use packjit_frontend::analysis::CodegenMode;
use packjit_frontend::analysis::{
    callx_plan, helper_code, CpuId, EmitCapacity, HelperCode, InlineHelper, PerCpuPlan, CALL_CHARGE,
};
use packjit_frontend::cold::ColdPlacement;
use packjit_frontend::lower::{
    self, AccessLowering, AluHooks, Assembled, CallHooks, Cold, Driver, JumpHooks, Lowering,
    MemoryHooks, Pass, PastEnd, StopHooks, TargetCall,
};
use packjit_frontend::ranges::AccessCheck;
use packjit_frontend::relax::{BranchCheck, Relaxation};
use packjit_frontend::reuse::{self, Reused};
use packjit_frontend::walks::{Guard, GuardRegion, Walk};
use packjit_plugin_api::abi::{
    PJ_ACCESS_WRITE, PJ_CLOCK_MULT_FRAC, PJ_CLOCK_MULT_INT, PJ_CLOCK_OFFSET, PJ_ENV_REGIONS,
    PJ_PERCPU_ARRAYS, PJ_PERCPU_ARRAY_SIZE, PJ_PERCPU_BASE, PJ_PERCPU_COUNT, PJ_PERCPU_CPUS,
    PJ_PERCPU_CPU_ID_OFFSET, PJ_PERCPU_ENTRIES, PJ_PERCPU_SLOT_SIZE, PJ_PERCPU_VALUE_SIZE,
    PJ_STOP_OUT_OF_BOUNDS, PJ_STOP_UNKNOWN_CALLX,
};

/// `mrs x0, tpidr_el0` (op0=3 op1=3 CRn=13 CRm=0 op2=2): the EL0 thread pointer.
const MRS_TPIDR_EL0: u32 = 0xd53b_d040;
/// `mrs x0, cntvct_el0` (op0=3 op1=3 CRn=14 CRm=0 op2=2): the virtual counter.
const MRS_CNTVCT_EL0: u32 = 0xd53b_e040;

use packjit_frontend::analysis::EmitOptions;
use packjit_frontend::lower::Emitted;

/// The lowering (`crate::emit_decoded`), with measurement switches (see [`EmitOptions`]; benches only).
#[doc(hidden)]
pub fn emit_decoded_with(
    prog: &Program,
    helpers: &[HelperEntry],
    mode: &CodegenMode,
    opts: EmitOptions,
) -> Result<Emitted, CompileError> {
    let plan = plan(prog, mode, opts.group_checks);
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
        let mut ops: Asm = reuse::assembler(cap.code, cap.labels, cap.branch_sites);
        let d = Driver::new(
            prog,
            helpers,
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
            sites: reuse::take(cap.branch_sites),
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
        let bytes = reuse::assembled(self.ops).map_err(|err| {
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

    const LONGEST_BRANCH: &'static str = "the ±128 MiB of an arm64 B";
}
