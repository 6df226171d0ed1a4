//! Lowering of verified eBPF (`packjit_frontend::Program`) to RV64: the ISA hooks of the
//! shared driver (`packjit_frontend::lower`), which owns the function and instruction loop,
//! the sandbox's orchestration, the cold queue and the pass loop. One [`Codegen`] per pass;
//! one file per instruction class ([`alu`], [`mem`], [`jump`], [`call`]) and the stop paths
//! ([`cold`]), over the encoders of [`crate::encode`]. Register map: [`crate::regs`];
//! frames: [`crate::frame`].
//!
//! ## Branches
//!
//! Every branch is a *site* with a form: compressed (`c.beqz`/`c.bnez` ±256 B, `c.j`
//! ±2 KiB), short (`b<cc>` ±4 KiB, `jal` ±1 MiB, encoded by `Assembler::finish` at the ISA's
//! full reach), near (inverted `b<cc>` over `jal`) or far (inverted `b<cc>` over
//! `auipc`+`jalr`, ±2 GiB). Code is emitted with every site in its smallest form; after each
//! pass the front end's relaxation driver (`packjit_frontend::relax`) checks each site's
//! displacement against its form's range and grows the failing sites, with a proven bound on
//! the passes; code is never emitted with a branch that does not reach.

mod alu;
mod call;
mod cold;
mod jump;
mod mem;

use crate::encode::{count_insns_except, Assembler};
use crate::frame::Layout;
use crate::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
use dynasmrt::DynamicLabel;
use packjit_frontend::analysis::{CodegenMode, EmitCapacity, EmitOptions};
use packjit_frontend::cold::ColdPlacement;
use packjit_frontend::lower::{self, Assembled, Driver, Emitted, Lowering, Pass};
use packjit_frontend::ranges::{plan_accesses, AccessPlan};
use packjit_frontend::relax::{BranchCheck, Relaxation};
use packjit_frontend::reuse::{self, Reused};

use packjit_frontend::{op_kind, Program};
use packjit_plugin_api::abi::PJ_ACCESS_WRITE;
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::cell::Cell;
use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A branch site's encoding, smallest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Form {
    Compressed,
    Short,
    Near,
    Far,
}

/// A displacement to verify after a pass.
struct Check {
    site: usize,
    /// Offset of the instruction whose displacement field holds the distance.
    at: usize,
    target: DynamicLabel,
    /// Inclusive displacement range of the current form (every form's reach is under
    /// ±2 GiB, so 32 bits hold it and a check takes 32 bytes, not 48).
    lo: i32,
    hi: i32,
    /// The form to grow to if the check fails.
    grow: Form,
}

/// Where a checked access's address is, for its slow path: the native base register and
/// the offset (the slow path recomputes `base + off` into t0, which the hot path may have
/// clamped).
#[derive(Clone, Copy, Debug)]
pub struct AccessSite {
    base: u8,
    off: i16,
}

/// Bits of a checked access's descriptor (t5 on its cold side) below its pc: the
/// `PJ_ACCESS_*` word (size, write bit). `li` builds any descriptor in at most two
/// instructions: pcs are below `MAX_INSNS`, so it stays under 2^31.
const ACCESS_BITS: u32 = 9;
const _: () = assert!(PJ_ACCESS_WRITE < 1 << ACCESS_BITS);
const _: () = assert!((packjit_frontend::MAX_INSNS as u64) << ACCESS_BITS < 1 << 31);

// Displacement ranges of each form, as the ISA defines them: B- and J-type branches to
// labels are encoded by `Assembler::finish` (dynasmrt 5.1 would accept only half their reach).
const CB_RANGE: (isize, isize) = (-256, 254);
const CJ_RANGE: (isize, isize) = (-2048, 2046);
const B_RANGE: (isize, isize) = (-4096, 4094);
const J_RANGE: (isize, isize) = (-(1 << 20), (1 << 20) - 2);
/// dynasm's `auipc`-pair relocation limits (see its RISC-V language reference).
const FAR_RANGE: (isize, isize) = (-0x8000_0000, 0x7FFF_F7FF);
/// The most hot code between cold islands (see `ColdPlacement`): an island then holds the
/// cold sides of at most 128 KiB of hot code (a few times that in bytes at the very most),
/// so the hot-to-cold branches stay well inside `jal`'s ±1 MiB.
const ISLAND_SPAN: usize = 128 << 10;
/// Hot code bytes per instruction in code with cold sides, a first guess (see
/// `ColdPlacement`): a checked access takes some 16 bytes, most other instructions 2 to 4.
const TYPICAL_HOT_BYTES: usize = 8;
/// Passes after which every still-failing site jumps straight to the far form (the shared
/// driver's pass bound is this + 2).
const GENTLE_PASSES: usize = 4;
/// The most one site's growth in one pass adds to the code (c.beqz, 2 bytes, straight to
/// the far form, 12 bytes).
const GROWTH_BOUND: isize = 10;

/// Constants `li` builds in at most this many instructions stay inline; wider ones (three
/// or more `li` steps past a 32-bit value: the two-slot constants of `lddw`) come from the
/// constant pool in two, plus 8 bytes of data shared by equal constants.
pub(super) const POOL_MIN_LI: usize = 3;

/// What a 32-bit ALU result's upper half must hold (see `Layout::upper_live`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upper {
    /// Zero, as RFC 9669 defines it: something may read it.
    Zero,
    /// Anything: nothing reads it before the register is written again.
    Unread,
}

/// What every pass of one program shares, worked out once before the first.
struct Plan<'a> {
    prog: &'a Program,
    helpers: &'a [HelperEntry],
    mode: &'a CodegenMode,
    /// Optional extensions the request allows.
    zbb: bool,
    zba: bool,
    c: bool,
    /// Measurement switches (benches only; see [`EmitOptions`]).
    opts: EmitOptions,
    has_callx: bool,
    /// The front end's access analysis (empty in trusted code).
    access: AccessPlan,
    layout: Layout,
    /// Buffer sizes for the next pass: a first guess, then the last pass's code size (code
    /// only grows between passes), so a later pass never grows its buffer.
    capacity: Cell<EmitCapacity>,
}

impl<'a> Plan<'a> {
    fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        mode: &'a CodegenMode,
        opts: EmitOptions,
    ) -> Result<Self, CompileError> {
        // From the functions' summaries: at 1 M instructions a pass over them is a trip
        // through memory.
        let has_callx = prog.subprogs.iter().any(|s| s.ops & op_kind::CALL_REG != 0);
        let access = if mode.sandboxed() {
            plan_accesses(prog, opts.group_checks)
        } else {
            AccessPlan::default()
        };
        // Any 8-byte access whose inline test is the context's general one?
        // Whether there is a stack block at all (`stack_block_size(prog) > 0`), without
        // running its frame analysis a second time (`frame::plan` sizes the block).
        let block = prog.subprogs.iter().any(|s| s.uses_stack);
        let lim8 = mode.sandboxed()
            && (prog.insts.iter().enumerate())
                .any(|(i, inst)| mem::lim8_access(&inst.op, access.check(i), block));
        let layout = crate::frame::plan(prog, mode, lim8);
        // Bytes per instruction, trusted / checked (RV64 averages 5.3 / 35 with C): a first
        // guess; later passes know the code size.
        let capacity = EmitCapacity::for_program(prog, mode, (8, 40));
        Ok(Plan {
            prog,
            helpers,
            mode,
            zbb: mode.features & FEATURE_ZBB != 0,
            zba: mode.features & FEATURE_ZBA != 0,
            c: mode.features & FEATURE_C != 0,
            opts,
            has_callx,
            access,
            layout,
            capacity: Cell::new(capacity),
        })
    }
}

/// The lowering (`crate::emit_decoded`), with measurement switches (see [`EmitOptions`]; benches only).
#[doc(hidden)]
pub fn emit_decoded_with(
    prog: &Program,
    helpers: &[HelperEntry],
    mode: &CodegenMode,
    opts: EmitOptions,
) -> Result<Emitted, CompileError> {
    // The lowering guarantees every immediate's range before handing it to dynasm (which
    // panics on a bad one); should that ever be wrong, report it rather than unwind into the
    // host.
    catch_unwind(AssertUnwindSafe(|| {
        let plan = Plan::new(prog, helpers, mode, opts)?;
        lower::emit(
            Relaxation::new(Form::Far, GROWTH_BOUND, GENTLE_PASSES),
            ColdPlacement::new(ISLAND_SPAN, TYPICAL_HOT_BYTES),
            |forms, islands| Ok(Codegen::new(&plan, forms, islands)),
        )
    }))
    .unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(CompileError::new(
            ErrorKind::Internal,
            format!("rv64 emitter failed: {what}"),
        ))
    })
}

/// One emission pass: the driver's state, the assembler and what only RV64 keeps.
pub struct Codegen<'a> {
    pub(crate) d: Driver<'a, AccessSite, Infallible>,
    pub(crate) e: Assembler,
    plan: &'a Plan<'a>,
    pub(crate) layout: &'a Layout,
    /// Every branch site's form: the relaxation's from the passes before, then the sites
    /// this pass numbered first.
    forms: Vec<Form>,
    /// Sites the relaxation knew at the start of the pass.
    known: usize,
    /// Known sites this pass emitted in a longer form than the relaxation had for them.
    raised: Vec<usize>,
    site: usize,
    checks: Reused<Check>,
    dispatch: Option<DynamicLabel>,
    /// 64-bit constants loaded from the code image (value, label), each once; placed after
    /// all code by [`Lowering::program_end`].
    pool: Vec<(u64, DynamicLabel)>,
    /// Label of each value in `pool`.
    pooled: std::collections::HashMap<u64, DynamicLabel>,
    /// Cold code placed since the last copy of the stubs branches to them.
    uses_stubs: bool,
    /// ... and some of it to the shared access check (`region_scan`), which a copy of the
    /// stubs then includes (a program whose accesses all pass their inline tests or need
    /// none has no use for it).
    uses_region_stub: bool,
    /// Shared stop path: a6 = kind, a7 = pc, t0 = address, t1 = access (see `emit_stops`).
    stop: DynamicLabel,
    stop_budget: DynamicLabel,
    region_stub: DynamicLabel,
}

impl<'a> Codegen<'a> {
    fn new(plan: &'a Plan<'a>, forms: &[Form], islands: ColdPlacement) -> Self {
        let capacity = plan.capacity.get();
        let mut e = Assembler::with_capacity(plan.zbb, plan.zba, plan.c, capacity);
        let mut d = Driver::new(
            plan.prog,
            plan.helpers,
            &plan.access,
            plan.mode,
            islands,
            || e.new_label(),
            // Every group's widened test has an encoding: the context's range test holds
            // any group's span.
            |_| true,
        );
        d.clamp = plan.opts.spectre_clamp;
        let dispatch = plan.has_callx.then(|| e.new_label());
        let (stop, stop_budget, region_stub) = (e.new_label(), e.new_label(), e.new_label());
        Codegen {
            d,
            e,
            plan,
            layout: &plan.layout,
            forms: forms.to_vec(),
            known: forms.len(),
            raised: Vec::new(),
            site: 0,
            checks: reuse::take(capacity.branch_sites),
            dispatch,
            pool: Vec::new(),
            pooled: std::collections::HashMap::new(),
            uses_stubs: false,
            uses_region_stub: false,
            stop,
            stop_budget,
            region_stub,
        }
    }

    /// The native register holding eBPF register `r` in this program (`Layout::regs`).
    pub(crate) fn map(&self, r: u8) -> u8 {
        self.layout.regs[r as usize]
    }
}

impl<'a> Lowering<'a> for Codegen<'a> {
    type AccessSite = AccessSite;
    type IsaCold = Infallible;

    fn driver(&mut self) -> &mut Driver<'a, AccessSite, Infallible> {
        &mut self.d
    }

    fn position(&self) -> usize {
        self.e.pos()
    }

    fn new_label(&mut self) -> DynamicLabel {
        self.e.new_label()
    }

    fn bind(&mut self, label: DynamicLabel) {
        self.e.bind(label);
    }

    fn jump(&mut self, label: DynamicLabel) {
        let smallest = if self.plan.c {
            Form::Compressed
        } else {
            Form::Short
        };
        self.jump_from(label, smallest);
    }

    /// An island holds the cold code of at most [`ISLAND_SPAN`] bytes of hot code, well
    /// inside `jal`'s ±1 MiB, so the jump starts in that form (a compressed `c.j` would
    /// rarely reach and cost a pass to find out).
    fn jump_over_island(&mut self, label: DynamicLabel) {
        self.jump_from(label, Form::Short);
    }
}

impl<'a> Pass<'a> for Codegen<'a> {
    type Form = Form;

    fn branch_checks(&mut self) -> Result<Option<Vec<BranchCheck<Form>>>, CompileError> {
        let mut capacity = self.plan.capacity.get();
        capacity.code = self.e.pos() + 64;
        self.plan.capacity.set(capacity);
        let labels = self.e.asm.labels();
        let disp = |c: &Check| -> Result<isize, CompileError> {
            let target = labels
                .resolve_dynamic(c.target)
                .map_err(|e| internal(format!("unbound label: {e}")))?;
            Ok(target.0 as isize - c.at as isize)
        };
        // Usual case: every site reaches in the form it was emitted in, which is exactly
        // when `settle` would say `Done`; skip building its inputs.
        let mut all_reach = true;
        for c in self.checks.iter() {
            if !(c.lo as isize..=c.hi as isize).contains(&disp(c)?) {
                all_reach = false;
                break;
            }
        }
        if all_reach {
            return Ok(None);
        }
        let mut sites = Vec::with_capacity(self.checks.len());
        for c in self.checks.iter() {
            sites.push(BranchCheck {
                site: c.site,
                at: c.at,
                disp: disp(c)?,
                range: (c.lo as isize, c.hi as isize),
                grow: c.grow,
            });
        }
        Ok(Some(sites))
    }

    fn emitted_forms(&self) -> Vec<(usize, Form)> {
        // In site order, the new ones last: the relaxation numbers a site it has not seen
        // as the next one.
        let new = self.known..self.forms.len();
        (self.raised.iter().copied().chain(new))
            .map(|s| (s, self.forms[s]))
            .collect()
    }

    fn resolve(&self, label: DynamicLabel) -> Option<usize> {
        self.e.asm.labels().resolve_dynamic(label).ok().map(|o| o.0)
    }

    fn finish(self) -> Result<Assembled, CompileError> {
        let mut e = self.e;
        let native_insns = e.native_insns();
        let data = std::mem::take(&mut e.data);
        let bytes = e
            .finish()
            .map_err(|err| CompileError::new(ErrorKind::Encoding, err))?;
        // The count kept while emitting must match a scan of the code (every debug build,
        // so every test compile, checks it).
        debug_assert_eq!(
            native_insns,
            count_insns_except(&bytes, &data),
            "compressed-instruction count"
        );
        Ok(Assembled {
            bytes,
            native_insns,
            data,
        })
    }

    const LONGEST_BRANCH: &'static str = "the ±2 GiB of auipc+jalr";
}

fn internal(msg: String) -> CompileError {
    CompileError::new(ErrorKind::Internal, msg)
}
