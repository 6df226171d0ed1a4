//! Lowering of verified eBPF (`packjit_frontend::Program`) to RV64: one short function per
//! instruction class, over the encoders of [`crate::encode`]. Register map: [`crate::regs`];
//! frames: [`crate::frame`].
//!
//! ## Branches
//!
//! Every branch is a *site* with a form: compressed (`c.beqz`/`c.bnez` ±256 B, `c.j`
//! ±2 KiB), short (`b<cc>` ±4 KiB, `jal` ±1 MiB, encoded by `Emitter::finish` at the ISA's
//! full reach), near (inverted `b<cc>` over `jal`) or far (inverted `b<cc>` over
//! `auipc`+`jalr`, ±2 GiB). Code is emitted with every site in its smallest form; after each
//! pass the front end's relaxation driver (`packjit_frontend::relax`) checks each site's
//! displacement against its form's range and grows the failing sites, with a proven bound on
//! the passes; code is never emitted with a branch that does not reach.

use crate::encode::{count_insns_except, fits_signed, reg::*, Amo, Br, Emitter, Mem, R3, RI};
use crate::frame::{Layout, CTX_LIM8};
use crate::regs::{BLINDED, BUDGET, CTX_LEN, CTX_START, ENV, STACK_LEN, STACK_START};
use dynasmrt::DynamicLabel;
use packjit_frontend::analysis::{
    back_edge_charge, blinding_mask, callx_plan, checked_access, helper_lowering,
    instruction_labels, stack_block_size, upper_halves_live, CodegenMode, EmitCapacity,
    HelperLowering, CALL_CHARGE,
};
use packjit_frontend::cold::ColdPlacement;
use packjit_frontend::ranges::{plan_accesses, AccessCheck, AccessPlan};
use packjit_frontend::relax::{BranchCheck, Relaxation, Settled};
use packjit_frontend::scratch::{self, Reused};
use packjit_frontend::walks::{Guard, GuardRegion, Walk};
use packjit_frontend::{
    op_kind, AluOp, AtomicOp, Cond, EndKind, Inst, Op, Operand, Program, Reg, Size, Width,
};
use packjit_plugin_api::abi::{
    PJ_ACCESS_WRITE, PJ_CLOCK_MULT_FRAC, PJ_CLOCK_MULT_INT, PJ_CLOCK_OFFSET, PJ_ENV_ENTRY_SP,
    PJ_ENV_REGIONS, PJ_ENV_REGION_COUNT, PJ_ENV_STOP_ACCESS, PJ_ENV_STOP_ADDR, PJ_ENV_STOP_KIND,
    PJ_ENV_STOP_PC, PJ_HELPER_GET_SMP_PROCESSOR_ID, PJ_HELPER_PERCPU_OFFSET, PJ_PERCPU_ARRAYS,
    PJ_PERCPU_ARRAY_SIZE, PJ_PERCPU_BASE, PJ_PERCPU_COUNT, PJ_PERCPU_CPUS, PJ_PERCPU_CPU_ID_OFFSET,
    PJ_PERCPU_ENTRIES, PJ_PERCPU_SLOT_SIZE, PJ_PERCPU_VALUE_SIZE, PJ_STOP_BUDGET,
    PJ_STOP_OUT_OF_BOUNDS, PJ_STOP_UNKNOWN_CALLX,
};
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::ops::RangeInclusive;
use Width::{W32, W64};

/// The per-CPU mov's table address and how helper 8 (its CPU id) is lowered: a call or the
/// inline rseq load; anything else is refused (message without the pc).
fn percpu_parts(helpers: &[HelperEntry]) -> Result<(u64, HelperLowering), String> {
    let entry = |id: u32| {
        helpers
            .iter()
            .find(|h| h.id == id)
            .ok_or_else(|| format!("per-CPU mov needs helper id {id:#x} in the helper table"))
    };
    let table = entry(PJ_HELPER_PERCPU_OFFSET)?.addr;
    match helper_lowering(entry(PJ_HELPER_GET_SMP_PROCESSOR_ID)?) {
        l @ (HelperLowering::Call(_) | HelperLowering::RseqCpuId { .. }) => Ok((table, l)),
        _ => Err("per-CPU mov: helper 8 must be a call or the inline rseq load".into()),
    }
}

/// A branch site's encoding, smallest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Form {
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

/// Bits of a checked access's descriptor (t5 on its cold side) below its pc: the
/// `PJ_ACCESS_*` word (size, write bit). `li` builds any descriptor in at most two
/// instructions: pcs are below `MAX_INSNS`, so it stays under 2^31.
const ACCESS_BITS: u32 = 9;
const _: () = assert!(PJ_ACCESS_WRITE < 1 << ACCESS_BITS);
const _: () = assert!((packjit_frontend::MAX_INSNS as u64) << ACCESS_BITS < 1 << 31);

// Displacement ranges of each form, as the ISA defines them: B- and J-type branches to
// labels are encoded by `Emitter::finish` (dynasmrt 5.1 would accept only half their reach).
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

pub struct Options {
    pub zbb: bool,
    pub zba: bool,
    pub c: bool,
    /// Sandbox, budget and blinding, as validated by the front end.
    pub mode: CodegenMode,
    /// Measurement switches (benches only; see [`crate::EmitOptions`]).
    pub measure: crate::EmitOptions,
}

/// Out-of-line code a site needs, emitted after all functions (off the hot path).
#[derive(Clone, Copy, Debug)]
enum Cold {
    /// The rest of a sandbox check whose inline test failed: the shared check
    /// (`region_scan`: context, stack block, host regions); returns to `resume` with t3 = 0
    /// or stops.
    Access {
        label: DynamicLabel,
        resume: DynamicLabel,
        base: u8,
        off: i16,
        size: u32,
        pc: usize,
        write: bool,
    },
    /// A check group's widened test failed: run the group's instructions again with a
    /// check per access, then continue after the group.
    Group { label: DynamicLabel, group: usize },
    /// A guarded walk's entry test failed: run the loop's checked copy, then continue after
    /// the loop.
    Walk { label: DynamicLabel, walk: usize },
    /// The budget cannot pay for the jump or call at `pc`: stop there.
    Budget { label: DynamicLabel, pc: usize },
}

/// What a checked copy ([`Codegen::checked_copy`]) copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyOf {
    /// A check group's members.
    Group,
    /// A guarded walk's loop, back-edge included.
    Loop,
}

/// Constants `li` builds in at most this many instructions stay inline; wider ones (three
/// or more `li` steps past a 32-bit value: the two-slot constants of `lddw`) come from the
/// constant pool in two, plus 8 bytes of data shared by equal constants.
const POOL_MIN_LI: usize = 3;

/// What a 32-bit ALU result's upper half must hold (see `Layout::upper_live`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upper {
    /// Zero, as RFC 9669 defines it: something may read it.
    Zero,
    /// Anything: nothing reads it before the register is written again.
    Unread,
}

pub struct Codegen<'a> {
    pub(crate) prog: &'a Program,
    helpers: &'a [HelperEntry],
    opts: Options,
    pub(crate) layout: Layout,
    pub(crate) mode: CodegenMode,
    has_callx: bool,
    relax: Relaxation<Form>,
    // per-pass state
    pub(crate) e: Emitter,
    site: usize,
    checks: Reused<Check>,
    /// Start of each instruction's code; only instructions jumped to have their own (see
    /// `instruction_labels`).
    insn_labels: Reused<DynamicLabel>,
    /// Where each instruction's code starts, in emission order (= instruction order).
    insn_offsets: Reused<u32>,
    entry_labels: Vec<DynamicLabel>,
    exit_labels: Vec<DynamicLabel>,
    dispatch: Option<DynamicLabel>,
    /// 64-bit constants loaded from the code image (value, label), each once; placed after
    /// all code by [`Codegen::pass`].
    pool: Vec<(u64, DynamicLabel)>,
    /// Label of each value in `pool`.
    pooled: std::collections::HashMap<u64, DynamicLabel>,
    cold: Vec<Cold>,
    /// Where the queued cold code goes: after the function, or in an island.
    islands: ColdPlacement,
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
    /// The front end's access analysis (empty in trusted code).
    access: AccessPlan,
    /// Emitting a group's or a guarded walk's checked copy: every access checks itself.
    copy: bool,
    /// Emitting a guarded walk's checked copy: the copy's head, where its back-edge goes.
    copy_head: Option<DynamicLabel>,
    /// Per check group: the point right after its widened check and mask, for the jumps
    /// that re-enter it validated (`AccessPlan::reentries`); `None` for other groups.
    group_resume: Vec<Option<DynamicLabel>>,
    /// Per walk (`AccessPlan::walks`): the pointer clamp its back-edge lands on.
    walk_clamps: Vec<DynamicLabel>,
    /// Index (into `prog.insts`) of the instruction being lowered.
    cur: usize,
}

/// Passes after which every still-failing site jumps straight to the far form (the shared
/// driver's pass bound is this + 2).
const GENTLE_PASSES: usize = 4;
/// The most one site's growth in one pass adds to the code (c.beqz, 2 bytes, straight to
/// the far form, 12 bytes).
const GROWTH_BOUND: isize = 10;

impl<'a> Codegen<'a> {
    pub fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        opts: Options,
    ) -> Result<Self, CompileError> {
        // From the functions' summaries: at 1 M instructions a pass over them is a trip
        // through memory.
        let has_callx = prog.subprogs.iter().any(|s| s.ops & op_kind::CALL_REG != 0);
        // The verifier already refuses unknown helper ids; resolving them here as well keeps
        // the lowering from ever emitting a call to a made-up address. Only the functions
        // that call helpers or have a per-CPU mov are looked at.
        let calling = prog
            .subprogs
            .iter()
            .filter(|s| s.ops & (op_kind::CALL_HELPER | op_kind::MOV_PERCPU) != 0);
        for inst in calling.flat_map(|s| &prog.insts[s.start..s.end]) {
            let pc = inst.pc as usize;
            if let Op::CallHelper { id } = inst.op {
                if !helpers.iter().any(|h| h.id == id) {
                    return Err(CompileError::at(
                        pc,
                        ErrorKind::UnknownHelper,
                        format!("call to unknown helper id {id}"),
                    ));
                }
            }
            if let Op::MovPerCpu { .. } = inst.op {
                percpu_parts(helpers)
                    .map_err(|m| CompileError::at(pc, ErrorKind::UnknownHelper, m))?;
            }
        }
        let access = if opts.mode.sandboxed() {
            plan_accesses(prog, opts.measure.group_checks)
        } else {
            AccessPlan::default()
        };
        // Any 8-byte access whose inline test is the context's general one?
        let block = stack_block_size(prog) > 0;
        let lim8 = opts.mode.sandboxed()
            && (prog.insts.iter().enumerate())
                .any(|(i, inst)| lim8_access(&inst.op, access.check(i), block));
        let layout = crate::frame::plan(prog, &opts.mode, has_callx, lim8);
        let mut e = Emitter::new(opts.zbb, opts.zba, opts.c, 0);
        let dummy = e.new_label();
        Ok(Self {
            prog,
            helpers,
            layout,
            mode: opts.mode,
            has_callx,
            relax: Relaxation::new(Form::Far, GROWTH_BOUND, GENTLE_PASSES),
            e,
            opts,
            site: 0,
            checks: Reused::default(),
            insn_labels: Reused::default(),
            insn_offsets: Reused::default(),
            entry_labels: Vec::new(),
            exit_labels: Vec::new(),
            dispatch: None,
            pool: Vec::new(),
            pooled: std::collections::HashMap::new(),
            cold: Vec::new(),
            islands: ColdPlacement::new(ISLAND_SPAN, TYPICAL_HOT_BYTES),
            uses_stubs: false,
            uses_region_stub: false,
            stop: dummy,
            stop_budget: dummy,
            region_stub: dummy,
            access,
            copy: false,
            copy_head: None,
            group_resume: Vec::new(),
            walk_clamps: Vec::new(),
            cur: 0,
        })
    }

    /// Emits the program, re-emitting with grown branch forms until every branch reaches.
    /// Returns the code and the line table (`Compiled::pc_offsets`: where each bytecode
    /// slot's native code starts).
    pub fn run(mut self) -> Result<crate::Measured, CompileError> {
        // Bytes per instruction, trusted / checked (RV64 averages 5.3 / 35 with C): a first
        // guess; later passes know the code size.
        let mut capacity = EmitCapacity::for_program(self.prog, &self.mode, (8, 40));
        loop {
            self.relax.begin_pass();
            self.islands.begin_pass(self.relax.passes());
            self.pass(capacity);
            capacity.code = self.e.pos() + 64;
            let checks = std::mem::take(&mut self.checks);
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
            for c in &checks {
                if !(c.lo as isize..=c.hi as isize).contains(&disp(c)?) {
                    all_reach = false;
                    break;
                }
            }
            let mut sites = Vec::new();
            if !all_reach {
                sites.reserve_exact(checks.len());
                for c in &checks {
                    sites.push(BranchCheck {
                        site: c.site,
                        at: c.at,
                        disp: disp(c)?,
                        range: (c.lo as isize, c.hi as isize),
                        grow: c.grow,
                    });
                }
            }
            let settled = self.relax.settle(&sites, |c| {
                CompileError::new(
                    ErrorKind::Encoding,
                    format!(
                        "program too large: a branch spans {} bytes, beyond the ±2 GiB reach \
                         of auipc+jalr",
                        c.disp
                    ),
                )
            })?;
            if settled == Settled::Done {
                let labels = self.e.asm.labels();
                let table = self.prog.line_table(std::mem::take(&mut self.insn_offsets));
                let at = |l: DynamicLabel| labels.resolve_dynamic(l).ok().map(|o| o.0);
                let groups = self.access.groups.iter().zip(&self.group_resume);
                let walks = self.access.walks.iter().zip(&self.walk_clamps);
                let mut landings: Vec<(usize, usize)> = groups
                    .filter_map(|(g, l)| Some((g.first, at((*l)?)?)))
                    .chain(walks.filter_map(|(w, &l)| Some((w.head, at(l)?))))
                    .collect();
                landings.sort_unstable();
                let e = std::mem::replace(&mut self.e, Emitter::new(false, false, false, 0));
                let native_insns = e.native_insns();
                let e_data = e.data.clone();
                let code = e
                    .finish()
                    .map_err(|err| CompileError::new(ErrorKind::Encoding, err))?;
                // The count kept while emitting must match a scan of the code (every debug
                // build, so every test compile, checks it).
                debug_assert_eq!(
                    native_insns,
                    count_insns_except(&code, &e_data),
                    "compressed-instruction count"
                );
                return Ok(crate::Measured {
                    passes: self.relax.passes(),
                    islands: self.islands.islands(),
                    native_insns,
                    bytes: code,
                    line_table: table,
                    landings,
                });
            }
        }
    }

    fn pass(&mut self, capacity: EmitCapacity) {
        let n = self.prog.insts.len();
        self.e = Emitter::with_capacity(self.opts.zbb, self.opts.zba, self.opts.c, capacity);
        self.site = 0;
        self.checks = scratch::take(capacity.branch_sites);
        let unbound = self.e.new_label();
        self.insn_labels =
            instruction_labels(self.prog, &self.access, unbound, || self.e.new_label());
        self.insn_offsets = scratch::take(n);
        self.entry_labels = (0..self.prog.subprogs.len())
            .map(|_| self.e.new_label())
            .collect();
        self.exit_labels = (0..self.prog.subprogs.len())
            .map(|_| self.e.new_label())
            .collect();
        self.walk_clamps = (0..self.access.walks.len())
            .map(|_| self.e.new_label())
            .collect();
        self.group_resume = (0..self.access.groups.len())
            .map(|g| self.access.groups[g].reentered.then(|| self.e.new_label()))
            .collect();
        self.dispatch = if self.has_callx {
            Some(self.e.new_label())
        } else {
            None
        };
        self.cold.clear();
        self.uses_stubs = false;
        self.uses_region_stub = false;
        self.stop = self.e.new_label();
        self.stop_budget = self.e.new_label();
        self.region_stub = self.e.new_label();

        for k in 0..self.prog.subprogs.len() {
            let sp = self.prog.subprogs[k].clone();
            let l = self.entry_labels[k];
            self.e.bind(l);
            self.prologue(k);
            let program_end = self.prog.insts.len();
            self.islands
                .begin_function(self.e.pos(), sp.start, sp.end, program_end);
            for i in sp.start..sp.end {
                if self
                    .islands
                    .island_due(self.e.pos(), i, !self.cold.is_empty())
                {
                    self.island(i);
                }
                self.cur = i;
                self.islands.note_instruction(i, &self.prog.insts[i].op);
                self.walk_clamp_at(i);
                // The instruction starts here (after a walk's clamp, which only the walk's
                // back-edge reaches).
                // (Code is far below 4 GiB: at most `MAX_INSNS` instructions.)
                self.insn_offsets.push(self.e.pos() as u32);
                if self.access.jumped_to(self.prog, i) {
                    let l = self.insn_labels[i];
                    self.e.bind(l);
                }
                let inst = self.prog.insts[i];
                let last = i + 1 == sp.end;
                self.group_check_at(i);
                self.inst(k, i, &inst, last);
            }
            let l = self.exit_labels[k];
            self.e.bind(l);
            self.epilogue(k);
            self.emit_queued_cold(sp.end);
        }
        if let Some(d) = self.dispatch {
            self.e.bind(d);
            self.callx_dispatch();
        }
        self.emit_stops();
        self.pooled.clear();
        for (value, l) in std::mem::take(&mut self.pool) {
            self.e.data_u64s(l, &[value]);
        }
    }

    /// `rd = imm`, the 64-bit constant of an `lddw`: from the constant pool when `li` would
    /// take more than [`POOL_MIN_LI`] instructions (`auipc` + `ld`: two, whatever the value).
    fn lddw(&mut self, rd: u8, imm: u64) {
        if Emitter::li_len(imm as i64) <= POOL_MIN_LI {
            self.e.li(rd, imm as i64);
            return;
        }
        let l = match self.pooled.get(&imm) {
            Some(&l) => l,
            None => {
                let l = self.e.new_label();
                self.pool.push((imm, l));
                self.pooled.insert(imm, l);
                l
            }
        };
        self.e.ld_label(rd, l);
    }

    /// `callx` dispatch, shared by all `callx` sites: the helper id arrives in t2 and the
    /// site's pc in a7; a match tail-jumps to the helper (which returns straight to the call
    /// site); no match stops the program with `PJ_STOP_UNKNOWN_CALLX` (address = the id).
    /// Inlined helpers are compared for first; called ones are found through a table of
    /// addresses after the routine, or compared for one by one when their ids are too few
    /// or too sparse (`analysis::callx_plan`).
    fn callx_dispatch(&mut self) {
        let plan = callx_plan(self.helpers);
        let unknown = self.e.new_label();
        let cases: Vec<DynamicLabel> = plan.compared.iter().map(|_| self.e.new_label()).collect();
        // Ids are u32; a register value with upper bits set matches no helper.
        for (h, &l) in plan.compared.iter().zip(&cases) {
            self.e.li(T1, h.id as i64);
            self.branch(Br::Eq, T2, T1, l);
        }
        let table = self.e.new_label();
        if let Some(t) = &plan.table {
            // Unsigned bound (a huge id fails it), then the address, 0 for a hole.
            self.e.li(T1, t.len() as i64);
            self.branch(Br::Geu, T2, T1, unknown);
            self.e.la(T0, table);
            self.e.ri(RI::Slli, T1, T2, 3);
            self.e.rrr(R3::Add, T0, T0, T1);
            self.e.load(Mem::D, T0, T0, 0);
            self.branch(Br::Eq, T0, ZERO, unknown);
            self.e.jump_reg(T0);
        }
        self.e.bind(unknown);
        self.e.mv(T0, T2);
        // r0 means nothing after a stop; u64::MAX keeps the ABI v1 reading (`PJ_CALLX_UNKNOWN`)
        // for hosts that do not look at `stop_kind` yet.
        self.e.li(self.map(0), -1);
        self.e.li(A6, PJ_STOP_UNKNOWN_CALLX as i64);
        self.e.li(T1, 0);
        let stop = self.stop;
        self.jump(stop);
        for (h, &l) in plan.compared.iter().zip(&cases) {
            self.e.bind(l);
            match helper_lowering(h) {
                HelperLowering::Call(addr) => {
                    self.e.li(T0, addr as i64);
                    self.e.jump_reg(T0);
                }
                inline => {
                    // The site expects the result in a0, like a helper's (a0-a4 are dead
                    // after a call).
                    self.inline_helper(inline, A0);
                    self.e.ret();
                }
            }
        }
        if let Some(t) = &plan.table {
            // After a return: never fallen into.
            self.e.data_u64s(table, t);
        }
    }

    /// The per-CPU address instruction: `dst = src + cpu * slot_size` of array `array` in the
    /// table of the `PJ_HELPER_PERCPU_OFFSET` entry, `dst = src` when `array >= count` or
    /// `cpu >= cpus` (so the offset never leaves the registered area). The CPU comes the way
    /// helper 8 does: the rseq load off `tp`, or a call with the caller-saved eBPF registers
    /// (r0 = a5, r1–r5 = a0–a4) stored around it, so nothing but `dst` changes.
    fn mov_percpu(&mut self, pc: usize, dst: Reg, src: Reg, array: u32) {
        let (table, cpu) = percpu_parts(self.helpers).expect("checked in Codegen::new");
        match cpu {
            HelperLowering::Call(addr) => {
                // 48 bytes keep sp 16-byte aligned, as the psABI requires at the call.
                const SAVED: [u8; 6] = [A0, A1, A2, A3, A4, A5];
                self.e.ri(RI::Addi, SP, SP, -48);
                for (k, r) in SAVED.into_iter().enumerate() {
                    self.e.store(Mem::D, r, SP, 8 * k as i32);
                }
                self.e.li(T0, addr as i64);
                self.e.call_reg(T0);
                self.e.mv(T3, A0);
                for (k, r) in SAVED.into_iter().enumerate() {
                    self.e.load(Mem::D, r, SP, 8 * k as i32);
                }
                self.e.ri(RI::Addi, SP, SP, 48);
            }
            inline => self.inline_helper(inline, T3),
        }
        // cpu in t3; the id is the program's constant: blinded like any immediate (a 32-bit
        // mask, both words zero-extended), and the array's address is computed at run time.
        let done = self.e.new_label();
        match self.mode.blind_key {
            Some(key) => {
                let m = blinding_mask(key, pc) & 0xffff_ffff;
                self.e.li(T2, (array as u64 ^ m) as i64);
                self.e.li(T1, m as i64);
                self.e.rrr(R3::Xor, T2, T2, T1);
            }
            None => self.e.li(T2, array as i64),
        }
        self.e.li(T4, 0);
        self.e.li(T1, table as i64);
        self.e.load(Mem::D, T0, T1, PJ_PERCPU_COUNT);
        self.branch(Br::Geu, T2, T0, done);
        self.e.li(T0, PJ_PERCPU_ARRAY_SIZE as i64);
        self.e.rrr(R3::Mul, T2, T2, T0);
        self.e.rrr(R3::Add, T1, T1, T2);
        self.e
            .load(Mem::D, T0, T1, PJ_PERCPU_ARRAYS + PJ_PERCPU_CPUS);
        self.branch(Br::Geu, T3, T0, done);
        self.e
            .load(Mem::D, T0, T1, PJ_PERCPU_ARRAYS + PJ_PERCPU_SLOT_SIZE);
        self.e.rrr(R3::Mul, T4, T3, T0);
        self.e.bind(done);
        self.e.rrr(R3::Add, self.map(dst), self.map(src), T4);
    }

    /// Per-CPU array lookup (r1 = a0 array id, r2 = a1 element index) against the host's
    /// table at `table`, result in `rd`: unsigned bounds checks on the id, the index and the
    /// CPU (each failing to 0), then `base + cpu * slot_size + index * value_size`. The CPU
    /// is the rseq `cpu_id` off `tp`, like the inlined helper 8. Uses t0-t3.
    fn inline_percpu_lookup(&mut self, table: u64, rd: u8) {
        let null = self.e.new_label();
        let done = self.e.new_label();
        let arr = |field: i32| PJ_PERCPU_ARRAYS + field;
        self.e.li(T1, table as i64);
        self.e.load(Mem::D, T0, T1, PJ_PERCPU_COUNT);
        self.branch(Br::Geu, A0, T0, null);
        self.e.li(T2, PJ_PERCPU_ARRAY_SIZE as i64);
        self.e.rrr(R3::Mul, T2, A0, T2);
        self.e.rrr(R3::Add, T2, T2, T1);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_ENTRIES));
        self.branch(Br::Geu, A1, T0, null);
        self.e.load(Mem::D, T0, T1, PJ_PERCPU_CPU_ID_OFFSET);
        self.e.rrr(R3::Add, T0, T0, TP);
        self.e.load(Mem::Wu, T3, T0, 0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_CPUS));
        self.branch(Br::Geu, T3, T0, null);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_SLOT_SIZE));
        self.e.rrr(R3::Mul, T3, T3, T0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_BASE));
        self.e.rrr(R3::Add, T3, T3, T0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_VALUE_SIZE));
        self.e.rrr(R3::Mul, T0, A1, T0);
        self.e.rrr(R3::Add, rd, T3, T0);
        self.jump(done);
        self.e.bind(null);
        self.e.li(rd, 0);
        self.e.bind(done);
    }

    /// The body of an inlined helper (never [`HelperLowering::Call`]), result in `rd`; uses
    /// t0-t3 only.
    fn inline_helper(&mut self, how: HelperLowering, rd: u8) {
        match how {
            HelperLowering::Call(_) => unreachable!("calls are emitted by the caller"),
            HelperLowering::RseqCpuId { offset } => {
                // glibc's rseq area sits at a fixed offset from tp in every thread; the
                // kernel rewrites its cpu_id after each migration.
                if fits_signed(offset, 12) {
                    self.e.load(Mem::Wu, rd, TP, offset as i32);
                } else {
                    self.e.li(T0, offset);
                    self.e.rrr(R3::Add, T0, T0, TP);
                    self.e.load(Mem::Wu, rd, T0, 0);
                }
            }
            HelperLowering::PerCpuLookup { table } => self.inline_percpu_lookup(table, rd),
            HelperLowering::CounterClock { scale } => {
                // ns = t * mult_int + hi64(t * mult_frac) + offset, scale read from the host.
                self.e.rdtime(T0);
                self.e.li(T1, scale as i64);
                self.e.load(Mem::D, T2, T1, PJ_CLOCK_MULT_FRAC);
                self.e.mulhu(T2, T0, T2);
                self.e.load(Mem::D, T3, T1, PJ_CLOCK_MULT_INT);
                self.e.rrr(R3::Mul, T0, T0, T3);
                self.e.rrr(R3::Add, T0, T0, T2);
                self.e.load(Mem::D, T3, T1, PJ_CLOCK_OFFSET);
                self.e.rrr(R3::Add, rd, T0, T3);
            }
        }
    }

    // ---- branch sites ---------------------------------------------------------------------------

    fn next_site(&mut self, smallest: Form) -> (usize, Form) {
        let s = self.site;
        self.site += 1;
        (s, self.relax.form(s, smallest))
    }

    /// The site's smallest form: `smallest`, or for a branch back to a bound label, the
    /// shortest of `reach` (forms by length, with their displacement ranges) that reaches it
    /// now. A backward distance is known while emitting, so this spares the pass the
    /// relaxation driver would otherwise need to find that out (e.g. the stop paths after
    /// all code, branching back to the entry's epilogue, or a long loop). Later growth
    /// between the branch and its target is still checked after the pass.
    fn backward_form(
        &self,
        target: DynamicLabel,
        smallest: Form,
        reach: &[(Form, (isize, isize))],
    ) -> Form {
        // The longer forms' jump sits 4 bytes past the site's start (after the inverted
        // branch); measuring every form from there keeps the choice on the safe side.
        const SLACK: isize = 4;
        let Ok(to) = self.e.asm.labels().resolve_dynamic(target) else {
            return smallest;
        };
        let disp = to.0 as isize - self.e.pos() as isize - SLACK;
        reach
            .iter()
            .find(|&&(form, (lo, hi))| form >= smallest && (lo..=hi).contains(&disp))
            .map_or(Form::Far, |&(form, _)| form)
    }

    fn check(
        &mut self,
        site: usize,
        at: usize,
        target: DynamicLabel,
        range: (isize, isize),
        grow: Form,
    ) {
        self.checks.push(Check {
            site,
            at,
            target,
            lo: range.0 as i32,
            hi: range.1 as i32,
            grow,
        });
    }

    /// `if a <k> b goto target`, in the smallest form that reaches.
    fn branch(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel) {
        self.branch_from(k, a, b, target, Form::Compressed);
    }

    /// `branch` to the cold side of the current instruction, queued now: from the form
    /// that reaches where the cold code is expected to land (see `ColdPlacement`), so the
    /// hot-to-cold branches of a long function do not all take a second pass to grow out of
    /// B-type's ±4 KiB. A checked copy (cold code itself, its cold sides right after it)
    /// keeps the usual first guess.
    fn cold_branch(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel) {
        let at_least = if self.copy || !self.islands.guessing() {
            Form::Compressed
        } else {
            let distance = self.islands.expected_distance(self.e.pos(), self.cur) as isize;
            [
                (Form::Compressed, CB_RANGE),
                (Form::Short, B_RANGE),
                (Form::Near, J_RANGE),
            ]
            .iter()
            .find(|(_, (_, hi))| distance <= *hi)
            .map_or(Form::Far, |&(form, _)| form)
        };
        self.branch_from(k, a, b, target, at_least);
    }

    /// `branch`, in `at_least` or a longer form.
    fn branch_from(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel, at_least: Form) {
        let compressible =
            self.opts.c && b == ZERO && matches!(k, Br::Eq | Br::Ne) && (8..16).contains(&a);
        let smallest = if compressible {
            Form::Compressed
        } else {
            Form::Short
        }
        .max(at_least);
        let reach = [
            (Form::Compressed, CB_RANGE),
            (Form::Short, B_RANGE),
            (Form::Near, J_RANGE),
        ];
        let smallest = self.backward_form(target, smallest, &reach);
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        match form {
            Form::Compressed => {
                self.e.cb_label(k == Br::Eq, a, target);
                self.check(site, at, target, CB_RANGE, Form::Short);
            }
            Form::Short => {
                self.e.b_label(k, a, b, target);
                self.check(site, at, target, B_RANGE, Form::Near);
            }
            Form::Near => {
                // Skip the 4-byte jal when the condition is false.
                self.e.b_off(k.invert(), a, b, 8);
                let at = self.e.pos();
                self.e.jal_label(ZERO, target);
                self.check(site, at, target, J_RANGE, Form::Far);
            }
            Form::Far => {
                self.e.b_off(k.invert(), a, b, 12);
                let at = self.e.pos();
                self.e.far_jump(T6, target);
                self.check(site, at, target, FAR_RANGE, Form::Far);
            }
        }
    }

    /// `goto target`.
    fn jump(&mut self, target: DynamicLabel) {
        let smallest = if self.opts.c {
            Form::Compressed
        } else {
            Form::Short
        };
        self.jump_from(target, smallest);
    }

    /// `jump`, in `smallest` or a longer form.
    fn jump_from(&mut self, target: DynamicLabel, smallest: Form) {
        let reach = [(Form::Compressed, CJ_RANGE), (Form::Short, J_RANGE)];
        let smallest = self.backward_form(target, smallest, &reach);
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        match form {
            Form::Compressed => {
                self.e.cj_label(target);
                self.check(site, at, target, CJ_RANGE, Form::Short);
            }
            Form::Short | Form::Near => {
                self.e.jal_label(ZERO, target);
                self.check(site, at, target, J_RANGE, Form::Far);
            }
            Form::Far => {
                self.e.far_jump(T6, target);
                self.check(site, at, target, FAR_RANGE, Form::Far);
            }
        }
    }

    /// `call target` (link in ra).
    fn call(&mut self, target: DynamicLabel) {
        self.call_link(RA, target);
    }

    /// `call target` with the return address in `link`.
    fn call_link(&mut self, link: u8, target: DynamicLabel) {
        let smallest = self.backward_form(target, Form::Short, &[(Form::Short, J_RANGE)]);
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        if form == Form::Far {
            self.e.far_call(link, target);
            self.check(site, at, target, FAR_RANGE, Form::Far);
        } else {
            self.e.jal_label(link, target);
            self.check(site, at, target, J_RANGE, Form::Far);
        }
    }

    /// The native register holding eBPF register `r` in this program (`Layout::regs`).
    pub(crate) fn map(&self, r: u8) -> u8 {
        self.layout.regs[r as usize]
    }

    // ---- instructions ----------------------------------------------------------------------------

    fn inst(&mut self, k: usize, i: usize, inst: &Inst, last: bool) {
        let op = match self.mode.blind_key {
            Some(key) => match self.blind(key, inst) {
                Some(op) => op,
                None => return,
            },
            None => inst.op,
        };
        let pc = inst.pc as usize;
        match op {
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => {
                // (The analysis runs at the first 32-bit operation, if any.)
                let upper = match width {
                    W64 => Upper::Zero,
                    W32 => {
                        let live = self
                            .layout
                            .upper_live
                            .get_or_init(|| upper_halves_live(self.prog));
                        if live[i + 1] & (1 << dst) != 0 {
                            Upper::Zero
                        } else {
                            Upper::Unread
                        }
                    }
                };
                self.alu(width, op, self.map(dst), src, upper)
            }
            Op::MovSx {
                width,
                dst,
                src,
                bits,
            } => {
                let (d, s) = (self.map(dst), self.map(src));
                self.e.sext(d, s, bits);
                if width == W32 {
                    self.e.zext32(d, d);
                }
            }
            Op::MovPerCpu { dst, src, array } => self.mov_percpu(pc, dst, src, array),
            Op::Neg { width, dst } => {
                let d = self.map(dst);
                self.e.neg(width, d, d);
                if width == W32 {
                    self.e.zext32(d, d);
                }
            }
            Op::End { kind, bits, dst } => self.end(kind, bits, self.map(dst)),
            Op::LdImm64 { dst, imm } => self.lddw(self.map(dst), imm.get()),
            Op::Load {
                size,
                sign_extend,
                dst,
                ..
            } => {
                let m = match (size, sign_extend) {
                    (Size::B, false) => Mem::Bu,
                    (Size::B, true) => Mem::B,
                    (Size::H, false) => Mem::Hu,
                    (Size::H, true) => Mem::H,
                    (Size::W, false) => Mem::Wu,
                    (Size::W, true) => Mem::W,
                    (Size::DW, _) => Mem::D,
                };
                let (b, o) = self.mem_operand(pc, &op, false);
                self.e.load(m, self.map(dst), b, o);
            }
            Op::Store { size, src, .. } => {
                // The address first: the sandbox check's out-of-line path uses t1.
                let (b, o) = self.mem_operand(pc, &op, true);
                let v = match src {
                    Operand::Reg(r) => self.map(r),
                    Operand::Imm(0) => ZERO,
                    Operand::Imm(imm) => {
                        self.e.li(T1, imm as i64);
                        T1
                    }
                };
                let m = match size {
                    Size::B => Mem::B,
                    Size::H => Mem::H,
                    Size::W => Mem::W,
                    Size::DW => Mem::D,
                };
                self.e.store(m, v, b, o);
            }
            Op::Atomic {
                size,
                op: aop,
                fetch,
                base,
                off,
                src,
            } => {
                // AMOs take a bare register address.
                let addr = if self.mode.sandboxed()
                    && checked_access(&op).is_some()
                    && !self.unchecked_access(base)
                {
                    self.check_access(pc, self.map(base), off, size.bytes(), true, true);
                    T0
                } else if off == 0 {
                    self.map(base)
                } else {
                    self.add_imm(T0, self.map(base), off as i64, T0);
                    T0
                };
                // The verifier allows only W and DW atomics.
                let width = if size == Size::DW { W64 } else { W32 };
                self.atomic(width, aop, fetch, addr, self.map(src))
            }
            Op::Ja { target } => {
                let target = target as usize;
                if let Some(charge) = self.charge_of(i, target) {
                    self.charge(pc, charge);
                    let l = self.jump_label(i, target);
                    self.jump(l);
                } else if target != i + 1 {
                    // (A jump to the next instruction is a no-op.)
                    let l = self.jump_label(i, target);
                    self.jump(l);
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
                let l = self.jump_label(i, target);
                if let Some(charge) = self.charge_of(i, target) {
                    // Taken back-edge: pay first, on the taken path only.
                    let skip = self.e.new_label();
                    self.jcond(width, cond, self.map(dst), src, skip, true);
                    self.charge(pc, charge);
                    self.jump(l);
                    self.e.bind(skip);
                } else {
                    self.jcond(width, cond, self.map(dst), src, l, false);
                }
            }
            Op::CallHelper { id } => {
                let Some(h) = self.helpers.iter().find(|h| h.id == id) else {
                    unreachable!("Codegen::new resolved every helper id");
                };
                match helper_lowering(h) {
                    HelperLowering::Call(addr) => {
                        self.e.li(T0, addr as i64);
                        self.e.call_reg(T0);
                        self.e.mv(A5, A0);
                        self.after_helper();
                    }
                    // r1-r5 untouched: nothing of the host to hide.
                    inline => self.inline_helper(inline, A5),
                }
            }
            Op::CallReg { reg } => {
                self.e.mv(T2, self.map(reg));
                // The dispatch names this pc if the id turns out unknown.
                self.e.li(A7, pc as i64);
                let d = self.dispatch.expect("dispatch exists when callx does");
                self.call(d);
                self.e.mv(A5, A0);
                self.after_helper();
            }
            Op::CallLocal { target } => {
                if self.mode.counts_budget() {
                    self.charge(pc, CALL_CHARGE);
                }
                // r1-r5 are already in a0-a4 and r0 comes back in a5: nothing to marshal.
                let sub = self.prog.subprog_of(target as usize);
                let l = self.entry_labels[sub];
                self.call(l);
            }
            Op::Exit => {
                if !last {
                    let l = self.exit_labels[k];
                    self.jump(l);
                }
            }
        }
    }

    /// A helper leaves whatever it likes in a0-a4 (eBPF r1-r5); sandboxed code must not see
    /// host values, so it gets zeros there (eBPF leaves r1-r5 undefined after a call).
    fn after_helper(&mut self) {
        if self.mode.sandboxed() {
            for r in [A0, A1, A2, A3, A4] {
                self.e.li(r, 0);
            }
        }
    }

    // ---- constant blinding ---------------------------------------------------------------------

    /// Blinds the immediate of `inst`: materialises `imm ^ mask` and the mask, xors them at
    /// run time, and returns the op with the immediate replaced by the [`BLINDED`] register
    /// (a7); `None` when the instruction is fully emitted here (`lddw`).
    fn blind(&mut self, key: u64, inst: &Inst) -> Option<Op> {
        let mask = blinding_mask(key, inst.pc as usize);
        let mut op = inst.op;
        let src = match &mut op {
            Op::Alu { src, .. } | Op::Store { src, .. } | Op::Jcond { src, .. } => src,
            Op::LdImm64 { dst, imm } => {
                let d = self.map(*dst);
                self.e.li(d, (imm.get() ^ mask) as i64);
                self.e.li(T1, mask as i64);
                self.e.rrr(R3::Xor, d, d, T1);
                return None;
            }
            _ => return Some(op),
        };
        if let Operand::Imm(imm) = *src {
            // 32-bit mask, sign-extended like the immediate: the xor of two sign-extended
            // words is the sign extension of their xor, i.e. exactly eBPF's 64-bit view of
            // `imm`, and each half costs at most lui + addiw.
            let m = mask as u32 as i32;
            self.e.li(A7, (imm ^ m) as i64);
            self.e.li(T1, m as i64);
            self.e.rrr(R3::Xor, A7, A7, T1);
            *src = Operand::Reg(BLINDED);
        }
        Some(op)
    }

    // ---- instruction budget --------------------------------------------------------------------

    /// What the taken jump from instruction index `from` to index `target` charges, when
    /// counting.
    fn charge_of(&self, from: usize, target: usize) -> Option<u64> {
        if !self.mode.counts_budget() {
            return None;
        }
        back_edge_charge(self.prog, from, target)
    }

    /// Pays `amount` from the budget, or stops at `pc` (budget untouched) if it cannot.
    fn charge(&mut self, pc: usize, amount: u64) {
        let label = self.e.new_label();
        self.cold.push(Cold::Budget { label, pc });
        if amount == 1 {
            self.cold_branch(Br::Eq, BUDGET, ZERO, label);
            self.e.ri(RI::Addi, BUDGET, BUDGET, -1);
        } else {
            self.e.li(T3, amount as i64);
            self.cold_branch(Br::Ltu, BUDGET, T3, label);
            self.e.rrr(R3::Sub, BUDGET, BUDGET, T3);
        }
    }

    // ---- sandbox -------------------------------------------------------------------------------

    /// The address operand of a load or store: checked (t0, 0) in sandbox mode unless the
    /// front end proves it frame-constant, else `base + off` directly.
    fn mem_operand(&mut self, pc: usize, op: &Op, write: bool) -> (u8, i32) {
        let (Op::Load { base, off, .. } | Op::Store { base, off, .. }) = *op else {
            unreachable!("mem_operand is for loads and stores");
        };
        if self.mode.sandboxed() {
            if let Some((_, _, size)) = checked_access(op) {
                if !self.unchecked_access(base) {
                    let operand =
                        self.check_access(pc, self.map(base), off, size.bytes(), write, false);
                    self.mask_reentered_base(base);
                    return operand;
                }
            }
        }
        let (base, off) = self.walked_address(base, off);
        self.address(self.map(base), off, T0)
    }

    /// Does any check assume r1 = the context start (see `frame`'s entry)?
    pub(crate) fn access_uses_ctx_const(&self) -> bool {
        self.access.uses_ctx_const()
    }

    /// Whether the current access goes to `base + off` with no check of its own: proven
    /// inside the frame (by the data or by its walk), or a member of a check group on the
    /// hot path (whose widened check `group_check_at` emitted).
    fn unchecked_access(&mut self, _base: Reg) -> bool {
        let i = self.cur;
        match self.access.check(i) {
            AccessCheck::None | AccessCheck::Walked => return true,
            AccessCheck::Guarded => return !self.copy,
            _ => {}
        }
        if self.copy {
            return false;
        }
        self.access.group_of(i).is_some()
    }

    /// A group's widened check, where its first member's code starts: before anything of
    /// that instruction (an immediate to store, say), so a re-entering jump that lands
    /// right after the check skips nothing else.
    fn group_check_at(&mut self, i: usize) {
        if let Some(g) = self.access.group_of(i) {
            if self.access.groups[g].first == i {
                self.group_check(g);
            }
        }
    }

    /// Group `g`'s widened test of `[base + lo, base + hi)` in one region, then the base
    /// masked in place (`base &= t3 - 1`): unchanged when the test passed, 0 under a
    /// mispredicted branch, so no member reaches memory out of bounds (Spectre v1). On
    /// failure the group's checked copy runs ([`Cold::Group`]).
    fn group_check(&mut self, g: usize) {
        let grp = &self.access.groups[g];
        let (b, lo, span, check) = (
            self.map(grp.base),
            grp.lo,
            (grp.hi - grp.lo as i32) as u32,
            grp.check,
        );
        let label = self.e.new_label();
        match check {
            AccessCheck::CtxConst { end } => self.len_test(end),
            AccessCheck::Stack if span < 2048 => {
                self.range_test(b, lo, span, STACK_START, STACK_LEN)
            }
            // The context: a sufficient test for any group (spans stay below 2 KiB).
            _ => self.range_test(b, lo, span, CTX_START, CTX_LEN),
        }
        self.cold_branch(Br::Ne, T3, ZERO, label);
        if self.opts.measure.spectre_clamp {
            self.e.ri(RI::Addi, T3, T3, -1);
            self.e.rrr(R3::And, b, b, T3);
        }
        if let Some(resume) = self.group_resume[g] {
            self.e.bind(resume);
        }
        self.cold.push(Cold::Group { label, group: g });
    }

    /// Where the jump at instruction `i` lands: on the pointer clamp when it is a walk's
    /// back-edge, past the target group's check when the front end found the group already
    /// validated on every path to the jump, else at the target.
    fn jump_label(&self, i: usize, target: usize) -> DynamicLabel {
        if let Some(k) = self.access.walk_of_back_edge(i) {
            return self.copy_head.unwrap_or(self.walk_clamps[k]);
        }
        match self.access.reentry(i).and_then(|g| self.group_resume[g]) {
            Some(resume) => resume,
            None => self.insn_labels[target],
        }
    }

    /// Before a walk's head (`packjit_frontend::walks`): the entry (which first copies the
    /// pointer into the walk's shadow register, when it has one) jumps over the pointer
    /// clamp its back-edge lands on. The clamp redoes the loop's test and, with no branch,
    /// gives the shadow the pointer or 0 (or, without a shadow, zeroes the pointer itself)
    /// when the loop should have ended (a mispredicted back-edge).
    fn walk_clamp_at(&mut self, i: usize) {
        let Some(k) = self.access.walk_at_head(i) else {
            return;
        };
        let w = self.access.walks[k];
        let (head, clamp) = (self.insn_labels[i], self.walk_clamps[k]);
        let (p, b) = (self.map(w.ptr), self.map(w.bound));
        // With a shadow the clamp writes the pointer's copy there (see `Walk::shadow`), and
        // the first iteration's copy is the exact entry value.
        let shadow = self.walk_shadow(&w).map(|s| self.map(s));
        if let Some(guard) = w.guard {
            self.walk_guard(k, &w, guard);
        }
        // With Zbb the clamp saturates instead: min(p, r10 + last) is p itself on the
        // architectural path and stays inside the frame on any other. The limit is
        // loop-invariant: kept in a second dead register when there is one.
        // A guarded walk has no compile-time `last`: it clamps with the mask.
        let saturate = self.opts.zbb && w.guard.is_none();
        let limit = match (saturate, shadow, w.limit) {
            (true, Some(_), Some(l)) => Some(self.map(l)),
            _ => None,
        };
        if let Some(s) = shadow {
            self.e.mv(s, p);
        }
        if let Some(l) = limit {
            self.add_imm(l, self.map(packjit_frontend::R10), w.last, T3);
        }
        self.jump(head);
        self.e.bind(clamp);
        if !self.opts.measure.spectre_clamp {
            return;
        }
        let dst = shadow.unwrap_or(p);
        if saturate {
            let l = limit.unwrap_or_else(|| {
                self.add_imm(T3, self.map(packjit_frontend::R10), w.last, T3);
                T3
            });
            self.e.minu(dst, p, l);
            return;
        }
        // t3 = all ones while the loop goes on, else 0. An exact `!=` walk meets its bound
        // from below, so `p < b` is the same test on the architectural path (and zeroes
        // every p past the bound under misspeculation). For `<` that is the sign of p - b,
        // exact because walk pointers and bounds are user addresses, far closer than 2^63
        // apart (and under qemu far cheaper than `sltu`'s set-on-condition).
        if w.cont == Cond::Le {
            self.e.rrr(R3::Sltu, T3, b, p);
            self.e.ri(RI::Addi, T3, T3, -1);
        } else {
            self.e.rrr(R3::Sub, T3, p, b);
            self.e.ri(RI::Srai, T3, T3, 63);
        }
        self.e.rrr(R3::And, dst, p, T3);
    }

    /// A guarded walk's entry test (`packjit_frontend::walks::Guard`), as one verdict with
    /// no branch until it is complete (t2 = 0 when the walk stays inside the context): on
    /// failure the loop's checked copy runs ([`Cold::Walk`]); on success the pointer is
    /// masked with the verdict (itself architecturally, 0 under a mispredicted branch, from
    /// where a speculative walk stays in the unmapped first 64 KiB).
    fn walk_guard(&mut self, k: usize, w: &Walk, g: Guard) {
        let (p, b) = (self.map(w.ptr), self.map(w.bound));
        let (end, bias, shift) = (g.end as i32, g.bias as i32, g.shift as i32);
        // t0 = q = p - start; t1 = len - end; t2 = (len < end) | (len - end < q).
        match g.region {
            GuardRegion::Context => {
                self.e.rrr(R3::Sub, T0, p, CTX_START);
                self.e.ri(RI::Addi, T1, CTX_LEN, -end);
                self.e.ri(RI::Sltiu, T2, CTX_LEN, end);
                self.e.rrr(R3::Sltu, T3, T1, T0);
                self.e.rrr(R3::Or, T2, T2, T3);
            }
            GuardRegion::Frame => {
                // The frame is [r10 - 512, r10), and 512 >= end.
                let size = packjit_frontend::STACK_SIZE as i32;
                self.e.rrr(R3::Sub, T0, p, self.map(packjit_frontend::R10));
                self.e.ri(RI::Addi, T0, T0, size);
                self.e.ri(RI::Addi, T1, ZERO, size - end);
                self.e.rrr(R3::Sltu, T2, T1, T0);
            }
        }
        // t1 = (len - end - q) >> shift; t0 = (b - p - bias) >> shift, a `!=` walk's
        // remainder (low bits) failing the test.
        self.e.rrr(R3::Sub, T1, T1, T0);
        self.e.rrr(R3::Sub, T0, b, p);
        if bias != 0 {
            self.e.ri(RI::Addi, T0, T0, -bias);
        }
        if shift != 0 {
            if w.cont == Cond::Ne {
                self.e.ri(RI::Andi, T3, T0, (1 << shift) - 1);
                self.e.rrr(R3::Sltu, T3, ZERO, T3);
                self.e.rrr(R3::Or, T2, T2, T3);
            }
            self.e.ri(RI::Srli, T1, T1, shift);
            self.e.ri(RI::Srli, T0, T0, shift);
        }
        self.e.rrr(R3::Sltu, T3, T1, T0);
        self.e.rrr(R3::Or, T2, T2, T3);
        let label = self.e.new_label();
        self.cold_branch(Br::Ne, T2, ZERO, label);
        if self.opts.measure.spectre_clamp {
            self.e.ri(RI::Addi, T2, T2, -1);
            self.e.rrr(R3::And, p, p, T2);
        }
        self.cold.push(Cold::Walk { label, walk: k });
    }

    /// The register a walk's clamp writes its copy of the pointer to (`Walk::shadow`),
    /// when there is one and clamping is on (without the clamp, measurement only, the
    /// accesses use the pointer itself).
    fn walk_shadow(&self, w: &Walk) -> Option<Reg> {
        w.shadow.filter(|_| self.opts.measure.spectre_clamp)
    }

    /// Base and offset of the current (unchecked) access: through its walk's shadow when
    /// the walk clamps into one (`AccessPlan::walked_address`).
    fn walked_address(&self, base: Reg, off: i16) -> (Reg, i16) {
        if self.opts.measure.spectre_clamp {
            self.access.walked_address(self.cur, base, off)
        } else {
            (base, off)
        }
    }

    /// In a re-entered group's checked copy: the base itself masked with the member's
    /// verdict (t3 = all ones inside, 0 under a mispredicted check), so a jump that skips
    /// the group's check later never sees an unchecked base, also under misspeculation.
    fn mask_reentered_base(&mut self, base: Reg) {
        let reentered = self
            .access
            .group_of(self.cur)
            .is_some_and(|g| self.access.groups[g].reentered);
        if self.copy && reentered && self.opts.measure.spectre_clamp {
            self.e.rrr(R3::And, self.map(base), self.map(base), T3);
        }
    }

    /// t3 = 1 unless `end <= ctx_len` (t3 = 0): the whole test for an access ending `end`
    /// bytes past the context start.
    fn len_test(&mut self, end: u32) {
        if end < 2048 {
            self.e.ri(RI::Sltiu, T3, CTX_LEN, end as i32);
        } else {
            self.e.li(T2, end as i64);
            self.e.rrr(R3::Sltu, T3, CTX_LEN, T2);
        }
    }

    /// Checks `[base + off, base + off + size)`; returns the (clamped) address as t0 plus an
    /// offset (a bare t0 when `bare`, for AMOs).
    ///
    /// For a region `[start, start + len)`, with `e = base + off + size - start` (mod 2^64),
    /// the access is inside exactly when `size <= e <= len`: an address below `start` or one
    /// whose end wraps past 2^64 gives `e < size`, one past the end `e > len`. So each
    /// region costs sub, addi, sltiu, sltu, or: no branch until the combined verdict.
    ///
    /// The context is tested inline; the stack block and the host regions out of line
    /// ([`Cold::Access`]). Spectre v1: the verdict `t3` (0 = inside) also masks the base,
    /// `t0 = base & (t3 - 1)`, so if the branch on it is mispredicted the access goes to
    /// `0 + off` (|off| < 2 KiB: the unmapped page 0, or the top of the address space, which
    /// user code cannot map), never to the out-of-bounds address. Masking the base rather
    /// than `base + off` keeps the offset in the access, as trusted code has it.
    fn check_access(
        &mut self,
        pc: usize,
        base: u8,
        off: i16,
        size: u32,
        write: bool,
        bare: bool,
    ) -> (u8, i32) {
        let label = self.e.new_label();
        let resume = self.e.new_label();
        let check = self.access.check(self.cur);
        let stack_first = self.layout.block > 0 && check == AccessCheck::Stack;
        let op = self.prog.insts[self.cur].op;
        // The stack block's length is a constant: `t = addr - stack_start` is inside iff
        // `t < block - size + 1`, an immediate when it fits SLTIU's 12 bits.
        let stack_lim = self.layout.block as i64 - size as i64 + 1;
        if stack_first && stack_lim < 2048 {
            self.e.rrr(R3::Sub, T2, base, STACK_START);
            if off != 0 {
                self.add_imm(T2, T2, off as i64, T3);
            }
            self.e.ri(RI::Sltiu, T3, T2, stack_lim as i32);
            self.cold_branch(Br::Eq, T3, ZERO, label);
            // Back to t3 = 0 = inside (see the CTX_LIM8 case below).
            self.e.ri(RI::Xori, T3, T3, 1);
        } else if self.layout.lim8 && lim8_access(&op, check, self.layout.block > 0) {
            // t = addr - start; inside iff t < CTX_LIM8 (t3 = 1). The verdict is flipped
            // to the usual t3 = 0 = inside after the branch, so a mispredicted branch on an
            // outside access (t3 = 0, flipped to 1) still masks the base to 0 below.
            self.e.rrr(R3::Sub, T2, base, CTX_START);
            if off != 0 {
                self.add_imm(T2, T2, off as i64, T3);
            }
            self.e.rrr(R3::Sltu, T3, T2, CTX_LIM8);
            self.cold_branch(Br::Eq, T3, ZERO, label);
            self.e.ri(RI::Xori, T3, T3, 1);
        } else {
            match check {
                // The base is the context start plus a constant (a0 = env.ctx_start at
                // entry).
                AccessCheck::CtxConst { end } => self.len_test(end),
                _ if stack_first => self.range_test(base, off, size, STACK_START, STACK_LEN),
                _ => self.range_test(base, off, size, CTX_START, CTX_LEN),
            }
            self.cold_branch(Br::Ne, T3, ZERO, label);
        }
        self.e.bind(resume);
        let clamp = self.opts.measure.spectre_clamp;
        if clamp {
            self.e.ri(RI::Addi, T3, T3, -1);
        }
        let operand = if !bare && fits_signed(off as i64, 12) {
            if clamp {
                self.e.rrr(R3::And, T0, base, T3);
                (T0, off as i32)
            } else {
                (base, off as i32)
            }
        } else {
            self.add_imm(T0, base, off as i64, T0);
            if clamp {
                self.e.rrr(R3::And, T0, T0, T3);
            }
            (T0, 0)
        };
        self.cold.push(Cold::Access {
            label,
            resume,
            base,
            off,
            size,
            pc,
            write,
        });
        operand
    }

    /// t3 = 1 unless `[base + off, +size)` lies in `[start, start + len)` (t3 = 0); uses t2,
    /// t4.
    fn range_test(&mut self, base: u8, off: i16, size: u32, start: u8, len: u8) {
        self.e.rrr(R3::Sub, T2, base, start);
        self.add_imm(T2, T2, off as i64 + size as i64, T3);
        self.e.ri(RI::Sltiu, T3, T2, size as i32);
        self.e.rrr(R3::Sltu, T4, len, T2);
        self.e.rrr(R3::Or, T3, T3, T4);
    }

    /// The checked copy of the instructions `range` at `label` (a loop's back-edge then goes
    /// to the copy's own head), then on after them: neither a group nor a loop ends its
    /// function.
    fn checked_copy(&mut self, label: DynamicLabel, range: RangeInclusive<usize>, of: CopyOf) {
        let k = self.prog.subprog_of(*range.start());
        let next = self.insn_labels[range.end() + 1];
        self.e.bind(label);
        self.copy = true;
        self.copy_head = (of == CopyOf::Loop).then_some(label);
        for i in range {
            let inst = self.prog.insts[i];
            self.cur = i;
            self.inst(k, i, &inst, false);
        }
        (self.copy, self.copy_head) = (false, None);
        self.jump(next);
    }

    /// The queued cold code, here (before instruction `next`): after its function or in an
    /// island (`ColdPlacement`). When the program's stubs are expected beyond `jal`'s reach,
    /// the cold code that uses them gets its own copy, after it; later cold code uses the
    /// next copy.
    fn emit_queued_cold(&mut self, next: usize) {
        let start = self.e.pos();
        // A group's checked copy adds the cold sides of its own checks.
        while !self.cold.is_empty() {
            for c in std::mem::take(&mut self.cold) {
                self.emit_cold(c);
            }
        }
        if self.uses_stubs && self.islands.local_stubs_due(self.e.pos(), next) {
            self.emit_stops();
            self.stop = self.e.new_label();
            self.stop_budget = self.e.new_label();
            self.region_stub = self.e.new_label();
            self.uses_stubs = false;
            self.uses_region_stub = false;
        }
        self.islands.cold_placed(start, self.e.pos());
    }

    /// The queued cold code between two instructions, jumped over by the hot path. An
    /// island holds the cold code of at most [`ISLAND_SPAN`] bytes of hot code, well inside
    /// `jal`'s ±1 MiB, so the jump starts in that form (a compressed `c.j` would rarely
    /// reach and cost a pass to find out).
    fn island(&mut self, next: usize) {
        let over = self.e.new_label();
        self.jump_from(over, Form::Short);
        self.emit_queued_cold(next);
        self.e.bind(over);
    }

    fn emit_cold(&mut self, c: Cold) {
        match c {
            Cold::Budget { label, pc } => {
                self.uses_stubs = true;
                self.e.bind(label);
                self.e.li(A7, pc as i64);
                let l = self.stop_budget;
                self.jump(l);
            }
            Cold::Group { label, group } => {
                let g = &self.access.groups[group];
                self.checked_copy(label, g.first..=g.last, CopyOf::Group);
            }
            Cold::Walk { label, walk } => {
                let w = &self.access.walks[walk];
                self.checked_copy(label, w.head..=w.back_edge, CopyOf::Loop);
            }
            Cold::Access {
                label,
                resume,
                base,
                off,
                size,
                pc,
                write,
            } => {
                self.uses_stubs = true;
                self.uses_region_stub = true;
                self.e.bind(label);
                // Everything else is the shared check's: it wants the address in t0 and
                // the access descriptor in t5.
                self.add_imm(T0, base, off as i64, T0);
                let access = size | if write { PJ_ACCESS_WRITE } else { 0 };
                self.e.li(T5, ((pc as i64) << ACCESS_BITS) | access as i64);
                let stub = self.region_stub;
                self.call_link(T6, stub);
                self.jump(resume);
            }
        }
    }

    /// The per-program stubs: the region scan, and the stop paths.
    fn emit_stops(&mut self) {
        if !self.layout.can_stop {
            return;
        }
        if self.uses_region_stub {
            self.region_scan();
        }
        if self.mode.counts_budget() {
            self.e.bind(self.stop_budget);
            self.e.li(A6, PJ_STOP_BUDGET as i64);
            self.e.li(T0, 0);
            self.e.li(T1, 0);
            // Falls through into the stop path.
        }
        // Stop: a6 = kind, a7 = pc, t0 = address (or callx id), t1 = access. Unwinds from any
        // depth: sp back to the entry frame, then the entry's epilogue restores what the
        // entry saved (which covers every callee-saved register any function changes).
        self.e.bind(self.stop);
        self.e.store(Mem::W, A6, ENV, PJ_ENV_STOP_KIND);
        self.e.store(Mem::W, T1, ENV, PJ_ENV_STOP_ACCESS);
        self.e.store(Mem::D, A7, ENV, PJ_ENV_STOP_PC);
        self.e.store(Mem::D, T0, ENV, PJ_ENV_STOP_ADDR);
        self.e.load(Mem::D, SP, ENV, PJ_ENV_ENTRY_SP);
        let exit = self.exit_labels[0];
        if self.e.asm.labels().resolve_dynamic(exit).is_ok() {
            self.jump(exit);
        } else {
            // A copy of the stubs inside the entry function (see `emit_queued_cold`), which
            // is long enough to need one: its epilogue is ahead, likely beyond `jal`.
            self.jump_from(exit, Form::Far);
        }
    }

    /// The shared check of an access whose inline test failed: the context, the stack block
    /// (when the program has one), then `env.regions`, for one holding `[t0, t0 + size)`
    /// (and writable for a write); t5 = pc << ACCESS_BITS | access, return address in t6.
    /// Returns t3 = 0 (the verdict the caller masks with, so a mispredicted "found" still
    /// masks to 0), or stops.
    ///
    /// Its branches stay within the stub and the stop path right after it, so none grows to
    /// the far form (which would clobber t6).
    fn region_scan(&mut self) {
        let (top, found, back, fail) = (
            self.e.new_label(),
            self.e.new_label(),
            self.e.new_label(),
            self.e.new_label(),
        );
        self.e.bind(self.region_stub);
        // t1 = size; per region, e = t0 - start + size is inside when size <= e <= len.
        self.e.ri(RI::Andi, T1, T5, 0xff);
        let regions: &[(u8, u8)] = if self.layout.block > 0 {
            &[(CTX_START, CTX_LEN), (STACK_START, STACK_LEN)]
        } else {
            &[(CTX_START, CTX_LEN)]
        };
        for &(start, len) in regions {
            self.e.rrr(R3::Sub, T4, T0, start);
            self.e.rrr(R3::Add, T4, T4, T1);
            self.e.rrr(R3::Sltu, T3, T4, T1);
            self.e.rrr(R3::Sltu, T4, len, T4);
            self.e.rrr(R3::Or, T3, T3, T4);
            self.branch(Br::Eq, T3, ZERO, back);
        }
        self.e.load(Mem::D, T2, ENV, PJ_ENV_REGIONS);
        self.e.load(Mem::D, T3, ENV, PJ_ENV_REGION_COUNT);
        self.e.bind(top);
        self.branch(Br::Eq, T3, ZERO, fail);
        self.e.load(Mem::D, T4, T2, 0);
        self.e.rrr(R3::Sub, T4, T0, T4);
        self.e.ri(RI::Andi, T1, T5, 0xff);
        self.e.rrr(R3::Add, T4, T4, T1);
        self.e.rrr(R3::Sltu, T1, T4, T1);
        self.e.load(Mem::D, A6, T2, 8);
        self.e.rrr(R3::Sltu, A6, A6, T4);
        self.e.rrr(R3::Or, T1, T1, A6);
        // A write needs PJ_REGION_WRITABLE (bit 0 of flags): bad |= write & !writable (a6 is
        // 0 or 1, so the pc above the write bit in t4 does not matter).
        self.e.load(Mem::D, A6, T2, 16);
        self.e.ri(RI::Xori, A6, A6, 1);
        self.e.ri(RI::Andi, A6, A6, 1);
        self.e.ri(RI::Srli, T4, T5, 8);
        self.e.rrr(R3::And, A6, A6, T4);
        self.e.rrr(R3::Or, T1, T1, A6);
        self.branch(Br::Eq, T1, ZERO, found);
        self.e.ri(RI::Addi, T2, T2, 24);
        self.e.ri(RI::Addi, T3, T3, -1);
        self.jump(top);
        self.e.bind(found);
        self.e.mv(T3, T1);
        self.e.bind(back);
        self.e.jump_reg(T6);
        self.e.bind(fail);
        self.e.li(A6, PJ_STOP_OUT_OF_BOUNDS as i64);
        self.e.ri(RI::Srli, A7, T5, ACCESS_BITS as i32);
        self.e.ri(RI::Andi, T1, T5, (1 << ACCESS_BITS) - 1);
        let stop = self.stop;
        self.jump(stop);
    }

    /// `base + off` as a (register, 12-bit offset) pair, using `tmp` when `off` is too wide.
    fn address(&mut self, base: u8, off: i16, tmp: u8) -> (u8, i32) {
        if fits_signed(off as i64, 12) {
            (base, off as i32)
        } else {
            self.e.li(tmp, off as i64);
            self.e.rrr(R3::Add, tmp, base, tmp);
            (tmp, 0)
        }
    }

    fn alu(&mut self, width: Width, op: AluOp, d: u8, src: Operand, upper: Upper) {
        // Every 32-bit form below reads only bits 31:0 of its inputs (the `*w` instructions,
        // and/or/xor, whose low half depends on low halves only, `slli 32` tests): inputs
        // whose upper half was left unread hold anything there.
        let zext = width == W32 && upper == Upper::Zero;
        match op {
            AluOp::Mov => {
                match (src, width) {
                    (Operand::Reg(s), W64) => self.e.mv(d, self.map(s)),
                    (Operand::Reg(s), W32) if zext => self.e.zext32(d, self.map(s)),
                    (Operand::Reg(s), W32) => self.e.mv(d, self.map(s)),
                    (Operand::Imm(imm), W64) => self.e.li(d, imm as i64),
                    (Operand::Imm(imm), W32) if zext => self.e.li(d, imm as u32 as i64),
                    // Sign-extended is as good and often shorter (-1 is one `li`).
                    (Operand::Imm(imm), W32) => self.e.li(d, imm as i64),
                }
                return;
            }
            AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => {
                self.divmod(width, op, d, src, upper);
                return;
            }
            _ => {}
        }
        // Immediate fast paths that avoid materialising the constant.
        if let Operand::Imm(imm) = src {
            let imm64 = imm as i64;
            let (ri, val) = match op {
                AluOp::Add => (Some(if width == W32 { RI::Addiw } else { RI::Addi }), imm64),
                AluOp::Sub => (
                    Some(if width == W32 { RI::Addiw } else { RI::Addi }),
                    -imm64,
                ),
                AluOp::And => (Some(RI::Andi), imm64),
                AluOp::Or => (Some(RI::Ori), imm64),
                AluOp::Xor => (Some(RI::Xori), imm64),
                AluOp::Lsh => (Some(if width == W32 { RI::Slliw } else { RI::Slli }), imm64),
                AluOp::Rsh => (Some(if width == W32 { RI::Srliw } else { RI::Srli }), imm64),
                AluOp::Arsh => (Some(if width == W32 { RI::Sraiw } else { RI::Srai }), imm64),
                _ => (None, 0),
            };
            if let Some(ri) = ri {
                let is_shift = matches!(op, AluOp::Lsh | AluOp::Rsh | AluOp::Arsh);
                if is_shift {
                    // Shift counts are masked to the operand width (RFC 9669).
                    let sh = (imm as u32 & if width == W32 { 31 } else { 63 }) as i32;
                    self.e.ri(ri, d, d, sh);
                    // srliw by a non-zero amount already leaves bits 63:32 clear.
                    if zext && !(op == AluOp::Rsh && sh != 0) {
                        self.e.zext32(d, d);
                    }
                    return;
                }
                if fits_signed(val, 12) {
                    self.e.ri(ri, d, d, val as i32);
                    // andi with a non-negative mask already clears bits 63:32.
                    if zext && !(op == AluOp::And && val >= 0) {
                        self.e.zext32(d, d);
                    }
                    return;
                }
            }
        }
        let s = match src {
            Operand::Reg(r) => self.map(r),
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
        };
        let r3 = match (op, width) {
            (AluOp::Add, W64) => R3::Add,
            (AluOp::Add, W32) => R3::Addw,
            (AluOp::Sub, W64) => R3::Sub,
            (AluOp::Sub, W32) => R3::Subw,
            (AluOp::Mul, W64) => R3::Mul,
            (AluOp::Mul, W32) => R3::Mulw,
            (AluOp::And, _) => R3::And,
            (AluOp::Or, _) => R3::Or,
            (AluOp::Xor, _) => R3::Xor,
            // The hardware uses the low 6 (5 for *w) bits of the count: exactly BPF's mask.
            (AluOp::Lsh, W64) => R3::Sll,
            (AluOp::Lsh, W32) => R3::Sllw,
            (AluOp::Rsh, W64) => R3::Srl,
            (AluOp::Rsh, W32) => R3::Srlw,
            (AluOp::Arsh, W64) => R3::Sra,
            (AluOp::Arsh, W32) => R3::Sraw,
            _ => unreachable!("mov and div/mod handled above"),
        };
        self.e.rrr(r3, d, d, s);
        if zext {
            self.e.zext32(d, d);
        }
    }

    fn divmod(&mut self, width: Width, op: AluOp, d: u8, src: Operand, upper: Upper) {
        let zext = width == W32 && upper == Upper::Zero;
        let is_div = matches!(op, AluOp::Div | AluOp::Sdiv);
        let r3 = match (op, width) {
            (AluOp::Div, W64) => R3::Divu,
            (AluOp::Div, W32) => R3::Divuw,
            (AluOp::Sdiv, W64) => R3::Div,
            (AluOp::Sdiv, W32) => R3::Divw,
            (AluOp::Mod, W64) => R3::Remu,
            (AluOp::Mod, W32) => R3::Remuw,
            (AluOp::Smod, W64) => R3::Rem,
            _ => R3::Remw,
        };
        match src {
            Operand::Imm(0) => {
                // x / 0 = 0; x % 0 = x (truncated to 32 bits for ALU32).
                if is_div {
                    self.e.li(d, 0);
                } else if zext {
                    self.e.zext32(d, d);
                }
            }
            Operand::Imm(imm) => {
                // Unsigned ops see the immediate sign-extended to 64 bits (ALU64) or as
                // a u32 (ALU32); powers of two become shifts and masks.
                let unsigned = matches!(op, AluOp::Div | AluOp::Mod);
                let divisor: u64 = if width == W32 {
                    imm as u32 as u64
                } else {
                    imm as i64 as u64
                };
                if unsigned && divisor.is_power_of_two() {
                    let k = divisor.trailing_zeros() as i32;
                    if is_div {
                        if k == 0 {
                            if zext {
                                self.e.zext32(d, d);
                            }
                        } else if width == W32 {
                            // srliw by k > 0 zero-fills bits 63:32.
                            self.e.ri(RI::Srliw, d, d, k);
                        } else {
                            self.e.ri(RI::Srli, d, d, k);
                        }
                    } else if k == 0 {
                        self.e.li(d, 0);
                    } else if k < 11 {
                        self.e.ri(RI::Andi, d, d, (1 << k) - 1);
                    } else {
                        // Keep the low k bits (k ≤ 31 for ALU32, so bits 63:32 end clear).
                        self.e.ri(RI::Slli, d, d, 64 - k);
                        self.e.ri(RI::Srli, d, d, 64 - k);
                    }
                    return;
                }
                // A non-zero divisor: no guard needed; MIN / -1 does not trap on RISC-V.
                self.e.li(T1, imm as i64);
                self.e.rrr(r3, d, d, T1);
                if zext {
                    self.e.zext32(d, d);
                }
            }
            Operand::Reg(s) => {
                let s = self.map(s);
                if is_div {
                    // RISC-V returns all-ones for x / 0; BPF wants 0. Branch-free:
                    // mask = (divisor == 0) - 1, computed before d (which may be s) changes.
                    if width == W32 {
                        self.e.ri(RI::Slli, T1, s, 32);
                        self.e.seqz(T1, T1);
                    } else {
                        self.e.seqz(T1, s);
                    }
                    self.e.rrr(r3, d, d, s);
                    self.e.ri(RI::Addi, T1, T1, -1);
                    self.e.rrr(R3::And, d, d, T1);
                } else {
                    // rem/remu already return the dividend for a zero divisor, and 0 for
                    // MIN % -1: exactly BPF's semantics.
                    self.e.rrr(r3, d, d, s);
                }
                if zext {
                    self.e.zext32(d, d);
                }
            }
        }
    }

    fn end(&mut self, kind: EndKind, bits: u8, d: u8) {
        if kind == EndKind::ToLe {
            // Little-endian target: truncate to `bits`, zero-extended.
            match bits {
                16 => self.e.zext16(d, d),
                32 => self.e.zext32(d, d),
                _ => {}
            }
            return;
        }
        if self.opts.zbb {
            self.e.rev8(d, d);
            if bits < 64 {
                self.e.ri(RI::Srli, d, d, 64 - bits as i32);
            }
            return;
        }
        // Baseline: assemble the swapped value byte by byte in t1:
        // byte i of d goes to byte (n-1-i) of the result. Only the low n bytes of d are
        // read, so the result is already zero-extended.
        let n = bits as i32 / 8;
        for i in 0..n {
            let src = if i == 0 {
                d
            } else {
                self.e.ri(RI::Srli, T0, d, 8 * i);
                T0
            };
            let top_of_64 = i == 7; // srli by 56 leaves exactly one byte
            let dst = if i == 0 { T1 } else { T0 };
            if !top_of_64 {
                self.e.ri(RI::Andi, dst, src, 0xff);
            }
            let sh = 8 * (n - 1 - i);
            if sh != 0 {
                self.e.ri(RI::Slli, dst, dst, sh);
            }
            if i != 0 {
                self.e.rrr(R3::Or, T1, T1, T0);
            }
        }
        self.e.mv(d, T1);
    }

    /// An atomic on the address in `addr` (already checked in sandbox mode).
    fn atomic(&mut self, width: Width, op: AtomicOp, fetch: bool, addr: u8, s: u8) {
        let amo = match op {
            AtomicOp::Add => Amo::Add,
            AtomicOp::And => Amo::And,
            AtomicOp::Or => Amo::Or,
            AtomicOp::Xor => Amo::Xor,
            AtomicOp::Xchg => Amo::Swap,
            AtomicOp::Cmpxchg => {
                // r0 = cmpxchg(addr, r0, s). lr.w sign-extends, so compare against the
                // sign-extended low half of r0.
                let r0 = self.map(0);
                let expect = if width == W64 {
                    r0
                } else {
                    self.e.ri(RI::Addiw, T2, r0, 0);
                    T2
                };
                self.e.cmpxchg_loop(width, addr, expect, s);
                if width == W64 {
                    self.e.mv(r0, T1);
                } else {
                    self.e.zext32(r0, T1);
                }
                return;
            }
        };
        if !fetch {
            self.e.amo_relaxed(amo, width, ZERO, s, addr);
            return;
        }
        self.e.amo_aqrl(amo, width, s, s, addr);
        if width == W32 {
            // amo*.w sign-extends the old value; BPF's 32-bit fetch zero-extends it.
            self.e.zext32(s, s);
        }
    }

    /// `if a <cond> src goto target` (with `negate`: if not).
    fn jcond(
        &mut self,
        width: Width,
        cond: Cond,
        a: u8,
        src: Operand,
        target: DynamicLabel,
        negate: bool,
    ) {
        let fix = |k: Br| if negate { k.invert() } else { k };
        if cond == Cond::Set {
            match src {
                Operand::Imm(imm) if fits_signed(imm as i64, 12) => self.e.ri(RI::Andi, T0, a, imm),
                Operand::Imm(imm) => {
                    self.e.li(T1, imm as i64);
                    self.e.rrr(R3::And, T0, a, T1);
                }
                Operand::Reg(r) => self.e.rrr(R3::And, T0, a, self.map(r)),
            }
            if width == W32 {
                // Only the low halves count.
                self.e.ri(RI::Addiw, T0, T0, 0);
            }
            self.branch(fix(Br::Ne), T0, ZERO, target);
            return;
        }
        // JMP32 compares the low halves (and reads nothing above them: an operand's upper
        // half may be unread, see `Layout::upper_live`). Sign-extending *both* operands serves every
        // condition: it is the signed reading, and as a map from u32 to u64 it is monotonic,
        // so unsigned order and equality are preserved too. An immediate is already the
        // sign-extended value of its low 32 bits.
        let mut a = a;
        let b = match src {
            Operand::Imm(0) => ZERO,
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
            Operand::Reg(r) => {
                let r = self.map(r);
                if width == W32 {
                    self.e.ri(RI::Addiw, T1, r, 0);
                    T1
                } else {
                    r
                }
            }
        };
        if width == W32 {
            self.e.ri(RI::Addiw, T0, a, 0);
            a = T0;
        }
        let (k, x, y) = match cond {
            Cond::Eq => (Br::Eq, a, b),
            Cond::Ne => (Br::Ne, a, b),
            Cond::Gt => (Br::Ltu, b, a),
            Cond::Ge => (Br::Geu, a, b),
            Cond::Lt => (Br::Ltu, a, b),
            Cond::Le => (Br::Geu, b, a),
            Cond::Sgt => (Br::Lt, b, a),
            Cond::Sge => (Br::Ge, a, b),
            Cond::Slt => (Br::Lt, a, b),
            Cond::Sle => (Br::Ge, b, a),
            Cond::Set => unreachable!("handled above"),
        };
        self.branch(fix(k), x, y, target);
    }
}

/// Is `op` an 8-byte access whose inline test is the context's general one (so it uses
/// [`CTX_LIM8`])? `block`: the program has a stack block (then `Stack` accesses test it
/// first instead).
fn lim8_access(op: &Op, check: AccessCheck, block: bool) -> bool {
    let size8 = matches!(
        op,
        Op::Load { size: Size::DW, .. }
            | Op::Store { size: Size::DW, .. }
            | Op::Atomic { size: Size::DW, .. }
    );
    size8
        && match check {
            AccessCheck::Ctx | AccessCheck::Unknown | AccessCheck::Guarded => true,
            AccessCheck::Stack => !block,
            _ => false,
        }
}

fn internal(msg: String) -> CompileError {
    CompileError::new(ErrorKind::Internal, msg)
}
