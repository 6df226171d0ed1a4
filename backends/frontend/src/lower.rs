//! The lowering contract: what a backend implements (the hook traits, [`Isa`]) and the
//! driver that does everything else once, for every backend ([`lower_program`], [`emit`]).
//!
//! A backend is its register table, its frame, the hooks (named after what they emit, the
//! same in every backend, one trait per concern and file: see [`Lowering`]) and its
//! encoders. The driver owns:
//!
//! * the pass loop with branch relaxation, and the result every backend returns
//!   ([`Emitted`], landings included);
//! * the function and instruction loop: entry and epilogue labels, instruction labels and
//!   offsets, islands of cold code ([`ColdPlacement`]);
//! * decoding each operation once and calling the hook of its class (`alu`, `load`,
//!   `branch`, `call_helper`, ...), with what is the same everywhere done here: a `goto`
//!   to the next instruction is nothing, a function's last `exit` falls into its
//!   epilogue, a helper id is resolved to its table entry;
//! * the sandbox's orchestration: where a check group's widened test goes and where a jump
//!   re-entering it lands, a walk's entry and the clamp its back-edge lands on, checked
//!   copies of groups and loops, and the answer to "how is this access lowered?"
//!   ([`Driver::access`]), asked once per access;
//! * the queue of cold code ([`Cold`]) and its placement;
//! * constant blinding: the rewrite of [`crate::blind`], applied as each instruction is
//!   lowered, so backends only map its register, [`crate::blind::AX`].
//!
//! ```text
//!   for each function k:      entries[k]: prologue(k)
//!     for each instruction i: [island of queued cold code]
//!                             [walk head: walk_guard, walk_entry, jump, walk_clamp]
//!                             labels[i]: [group_check] the hook of i's class
//!                                        (each operation of its blinding rewrite)
//!                             epilogues[k]: epilogue(k)
//!                             queued cold code: access_slow_path, budget_stop, isa_cold,
//!                             an array lookup's NULL,
//!                             checked copies (the hooks again, every access checked)
//!   program_end()             shared checks, stop paths, tables, constant pools
//! ```

use dynasmrt::DynamicLabel;
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::ops::Range;

use crate::analysis::{
    back_edge_charge, helper_code, helper_lowering, instruction_labels, is_frame_constant,
    percpu_plan, ArrayKey, BudgetLoop, CodegenMode, HelperCode, HelperLowering, PerCpuPlan,
};
use crate::blind::blind;
use crate::cold::ColdPlacement;
use crate::packet::{lower_packet_load, ENV};
use crate::ranges::{AccessCheck, AccessPlan, Group};
use crate::relax::{BranchCheck, Relaxation, Settled};
use crate::reuse::{self, Reused};
use crate::walks::Guard;
use crate::{
    op_kind, AluOp, AtomicOp, Cond, EndKind, Inst, Op, Operand, Program, Reg, Size, Width,
};

/// Out-of-line code of one instruction, emitted after its function (or in an island) so the
/// hot path stays dense. `A` is where the backend keeps an access's address for its slow
/// path; `F` is cold code only that ISA needs (x86-64's division fix-ups).
#[derive(Clone, Copy, Debug)]
pub enum Cold<A, F> {
    /// An access's inline test failed: the program's shared full check, back to `resume`
    /// when some region holds the access ([`MemoryHooks::access_slow_path`]).
    Access {
        inst: usize,
        label: DynamicLabel,
        resume: DynamicLabel,
        size: u32,
        write: bool,
        site: A,
    },
    /// A check group's widened test failed: the group's instructions again with a check per
    /// access, then on after the group.
    Group { group: usize, label: DynamicLabel },
    /// A guarded walk's entry test failed: the loop's checked copy, then on after the loop.
    Walk { walk: usize, label: DynamicLabel },
    /// The budget cannot pay `charge` at `inst`: stop there ([`StopHooks::budget_stop`]).
    Budget {
        inst: usize,
        label: DynamicLabel,
        charge: u64,
    },
    /// An inlined array lookup's key is past the end (the bounded form's branch, or a
    /// backend's `select_element` that branches: see `array_lookup`): r0 = NULL, then back
    /// to `resume`.
    NullResult {
        inst: usize,
        label: DynamicLabel,
        resume: DynamicLabel,
        /// The instructions `inst + 1..replay_to` run again after `r0 = 0`: those between
        /// the lookup and a NULL test it took over (`fused_null_test`), empty otherwise.
        replay_to: usize,
    },
    /// The entry's call at `inst` came back with a tail call pending: the entry's jump
    /// (`pending_tail_call`).
    PendingTailCall { inst: usize, label: DynamicLabel },
    /// Cold code of the ISA's own ([`StopHooks::isa_cold`]).
    Isa(F),
}

/// What a checked copy copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyOf {
    /// Check group `.0`'s members.
    Group(usize),
    /// Guarded walk `.0`'s loop, back-edge included.
    Loop(usize),
}

/// How the current load, store or atomic reaches memory ([`Driver::access`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLowering {
    /// With no check: trusted code, an access proven inside the frame, a walk's access, or
    /// a member of a check group whose widened test already ran. The address is
    /// `base + off`, through a walk's shadow register where the walk clamps into one.
    Direct { base: Reg, off: i16 },
    /// With its own check, whose inline test tries this region first.
    Checked(AccessCheck),
    /// Through `base + off = ctx_start + index + c + off`, which every architectural path
    /// keeps inside the context ([`AccessCheck::CtxIndex`]): no check; the backend's
    /// `index_bounded` re-tests `index + end <= ctx_len` branch-free (with the length in
    /// `len` or its own copy) and selects its harmless address when it fails, which only a
    /// mispredicted branch can make it do.
    IndexBounded {
        base: Reg,
        off: i16,
        index: Reg,
        len: Option<Reg>,
        end: u16,
    },
}

/// The driver's state of one emission pass, kept by the backend's lowering and read by its
/// hooks (`cur`, `copy`, labels).
pub struct Driver<'a, A: 'static, F: 'static> {
    pub prog: &'a Program,
    /// The request's helper table.
    pub helpers: &'a [HelperEntry],
    /// The sandbox's access analysis (empty in trusted code).
    pub access: &'a AccessPlan,
    pub mode: &'a CodegenMode,
    /// Emit the Spectre clamps (off only for measurement, see `EmitOptions`).
    pub clamp: bool,
    /// Index of the instruction being lowered.
    pub cur: usize,
    /// Emitting a group's or a guarded walk's checked copy: every access checks itself.
    pub copy: Option<CopyOf>,
    /// In a guarded walk's checked copy: the copy's head, where its back-edge goes.
    pub copy_head: Option<DynamicLabel>,
    /// Lowering an expansion of the current instruction (an inlined array lookup, a legacy
    /// packet load, an inlined tail call): its operations are the driver's, not the
    /// program's, so its accesses get no proof of the program's (`expansion_access`), and
    /// no backend fuses them with the next instruction.
    pub expansion: Expansion,
    /// An instruction the lowering fused into the one before it: only its label and
    /// offset are emitted.
    pub skip: Option<usize>,
    /// Array lookups whose key is a constant or has a known place in the frame, ascending
    /// by instruction index ([`crate::analysis::array_keys`]).
    pub array_keys: Vec<(usize, ArrayKey)>,
    /// Instructions that only passed arguments to a lookup that no longer reads them (its
    /// key folded, or read from the frame), ascending
    /// ([`crate::analysis::dead_key_arguments`]): only their label and offset are emitted.
    pub dead_arguments: Vec<usize>,
    /// Start of each instruction's code; only instructions jumped to have their own (see
    /// `instruction_labels`).
    pub labels: Reused<DynamicLabel>,
    /// Where each instruction's code starts, in emission order (= instruction order).
    pub offsets: Reused<u32>,
    /// Call entry of each function (before its prologue).
    pub entries: Vec<DynamicLabel>,
    /// Epilogue of each function.
    pub epilogues: Vec<DynamicLabel>,
    /// Per check group: the point right after its widened test and clamp, for the jumps
    /// that re-enter it validated (`AccessPlan::reentries`); `None` for other groups.
    pub group_resume: Vec<Option<DynamicLabel>>,
    /// Per check group: whether the backend encodes its widened test. The members of one
    /// it does not are checked one by one.
    pub group_encoded: Vec<bool>,
    /// Per walk (`AccessPlan::walks`): the pointer clamp its back-edge lands on.
    pub walk_clamps: Vec<DynamicLabel>,
    /// Per walk: for a counted walk (`walks::Counter`), its entry test, where jumps into the
    /// loop from outside land (it can be entered by jumps, not only by falling through).
    pub walk_entries: Vec<Option<DynamicLabel>>,
    /// Loops whose charges count the budget in a register, each with the label past its
    /// head's load, where its back-edges land: empty unless the backend asked
    /// ([`Driver::count_budget_in_loops`]).
    pub budget_loops: Vec<(BudgetLoop, DynamicLabel)>,
    /// Cold code queued for the current function.
    pub colds: Reused<Cold<A, F>>,
    /// Where the queued cold code goes: after the function, or in an island.
    pub islands: ColdPlacement,
    /// Which functions are reached only through calls in tail position, and whether one
    /// of them makes a tail call: found when first asked.
    tail_positions: Option<TailPositions>,
}

/// See [`Driver::in_tail_position`].
struct TailPositions {
    /// [`crate::analysis::tail_reached`].
    reached: Vec<bool>,
    /// Some function (not the entry) with `reached` set makes a tail call: it leaves the
    /// jump pending for the entry ([`jump_or_pend`]).
    pends: bool,
}

/// The most cold sides [`Driver::colds`] is sized for up front (it grows past that).
const COLD_QUEUE_MAX: usize = 4096;

impl<'a, A: Copy + 'static, F: Copy + 'static> Driver<'a, A, F> {
    /// The state of a new pass; `new_label` makes a label in the pass's assembler and
    /// `encodes_group` says which check groups' widened tests the backend can encode.
    pub fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        access: &'a AccessPlan,
        mode: &'a CodegenMode,
        islands: ColdPlacement,
        mut new_label: impl FnMut() -> DynamicLabel,
        encodes_group: impl Fn(&Group) -> bool,
    ) -> Self {
        let unbound = new_label();
        let labels = instruction_labels(prog, access, unbound, &mut new_label);
        let functions = prog.subprogs.len();
        let entries = (0..functions).map(|_| new_label()).collect();
        let epilogues = (0..functions).map(|_| new_label()).collect();
        let group_encoded: Vec<bool> = access.groups.iter().map(encodes_group).collect();
        let group_resume = (access.groups.iter().zip(&group_encoded))
            .map(|(g, &encoded)| (g.reentered && encoded).then(&mut new_label))
            .collect();
        let walk_clamps = access.walks.iter().map(|_| new_label()).collect();
        let walk_entries = (access.walks.iter())
            .map(|w| w.counter.is_some().then(&mut new_label))
            .collect();
        let lookup = |id: u32| {
            let h = helpers.iter().find(|h| h.id == id)?;
            match helper_lowering(h) {
                HelperLowering::ArrayLookup(array) => Some(array),
                _ => None,
            }
        };
        let (mut array_keys, mut dead_arguments) = if helpers
            .iter()
            .any(|h| matches!(helper_lowering(h), HelperLowering::ArrayLookup(_)))
        {
            let keys = crate::analysis::array_keys(prog, |id| lookup(id).is_some());
            let dead: Vec<usize> = keys
                .iter()
                .filter(|&&(at, _)| match prog.insts[at].op {
                    Op::CallHelper { id } => lookup(id).is_some_and(|a| a.percpu_id.is_none()),
                    _ => false,
                })
                .flat_map(|&(at, _)| crate::analysis::dead_key_arguments(prog, at))
                .collect();
            (keys, dead)
        } else {
            (Vec::new(), Vec::new())
        };
        // The inlined tail calls' argument setup they do not read (`Program::expanded_calls`).
        dead_arguments.extend(
            (prog.expanded_calls.iter())
                .flat_map(|&(at, read)| crate::analysis::dead_arguments(prog, at, read)),
        );
        dead_arguments.sort_unstable();
        dead_arguments.dedup();
        // The bounded form takes the key in the register the program stored it from, where
        // that register still holds it and the form needs no scratch write to it (no shift
        // before the add, no multiply, the bound an immediate; sandboxed code's select
        // leaves the key unchanged too).
        for (at, key) in &mut array_keys {
            let ArrayKey::Frame(off) = *key else { continue };
            let Op::CallHelper { id } = prog.insts[*at].op else {
                continue;
            };
            let fits = lookup(id).is_some_and(|a| {
                a.percpu_id.is_none()
                    && a.value_stride.is_power_of_two()
                    && a.value_stride <= 8
                    && i32::try_from(a.max_entries).is_ok()
            });
            let skipped = |j: usize| dead_arguments.binary_search(&j).is_ok();
            if let Some(r) = fits
                .then(|| crate::analysis::forwarded_key(prog, *at, off, skipped))
                .flatten()
            {
                *key = ArrayKey::Register(r);
            }
        }
        Driver {
            prog,
            helpers,
            access,
            mode,
            clamp: true,
            cur: 0,
            copy: None,
            copy_head: None,
            expansion: Expansion::None,
            skip: None,
            array_keys,
            dead_arguments,
            labels,
            offsets: reuse::take(prog.insts.len()),
            entries,
            epilogues,
            group_resume,
            group_encoded,
            walk_clamps,
            walk_entries,
            budget_loops: Vec::new(),
            // Checked code queues a cold side per check, most of its instructions' worth in a
            // function: a buffer of this thread's that holds them (up to a bound), not one
            // regrown by doublings from empty (four or five reallocations per load of a
            // hundred checked instructions).
            colds: if mode.sandboxed() || mode.counts_budget() {
                let large =
                    reuse::REUSE_MIN_BYTES.div_ceil(std::mem::size_of::<Cold<A, F>>().max(1));
                reuse::take(prog.insts.len().clamp(large, COLD_QUEUE_MAX))
            } else {
                Reused::default()
            },
            islands,
            tail_positions: None,
        }
    }

    /// For a backend whose budget lives in memory: counts the charges of the loops
    /// [`crate::analysis::budget_loops`] finds in a register while they run (the backend's
    /// `candidates`, BPF registers whose host registers its lowering never uses beyond
    /// what the program does). The driver calls [`JumpHooks::load_budget`] at such a
    /// loop's head, on the way in, and lands the loop's back-edges past it; the backend's
    /// charges ask [`Driver::budget_register`]. A loop holding a walk (whose clamp may
    /// write a register the program leaves free) or entered by a jump that lands past its
    /// head's start (a validated check group's re-entry, a counted walk's entry test) is
    /// left alone.
    pub fn count_budget_in_loops(
        &mut self,
        candidates: &[Reg],
        mut new_label: impl FnMut() -> DynamicLabel,
    ) {
        if !self.mode.counts_budget() {
            return;
        }
        let access = self.access;
        let enters = |at: usize, head: usize| {
            access.reentry(at).is_none() && access.walk_at_head(head).is_none()
        };
        self.budget_loops = crate::analysis::budget_loops(self.prog, candidates, enters)
            .into_iter()
            .filter(|l| !(access.walks.iter()).any(|w| (l.head..=l.last).contains(&w.head)))
            .map(|l| (l, new_label()))
            .collect();
    }

    /// The register the current instruction's budget charge counts in, when it is inside
    /// one of the loops of [`Driver::count_budget_in_loops`]; `None`: in memory.
    #[inline]
    pub fn budget_register(&self) -> Option<Reg> {
        self.budget_loop_of(self.cur).map(|(l, _)| l.reg)
    }

    #[inline]
    fn budget_loop_of(&self, i: usize) -> Option<&(BudgetLoop, DynamicLabel)> {
        if self.budget_loops.is_empty() {
            return None;
        }
        (self.budget_loops.iter()).find(|(l, _)| (l.head..=l.last).contains(&i))
    }

    /// Whether function `k` is reached only through calls in tail position
    /// ([`crate::analysis::tail_reached`]), so that its tail calls leave the jump to the
    /// entry (`jump_or_pend`).
    pub fn in_tail_position(&mut self, k: usize) -> bool {
        self.tail_positions().reached[k]
    }

    /// Whether the entry's local call at `at` may come back with a tail call pending
    /// (`jump_or_pend`): a call in tail position into a function reached only so, in a
    /// program where such a function makes a tail call.
    pub fn may_come_back_pending(&mut self, at: usize) -> bool {
        let prog = self.prog;
        // Without a tail call in the helper table nothing is ever pending: most programs
        // with calls never build the tables below.
        if !self.mode.tail_calls {
            return false;
        }
        let Op::CallLocal { target } = prog.insts[at].op else {
            return false;
        };
        let t = self.tail_positions();
        t.pends
            && t.reached[prog.subprog_of(target as usize)]
            && crate::analysis::returns_after(prog, at)
    }

    fn tail_positions(&mut self) -> &TailPositions {
        let (prog, helpers) = (self.prog, self.helpers);
        self.tail_positions.get_or_insert_with(|| {
            let reached = crate::analysis::tail_reached(prog);
            let tail_call = |id: u32| {
                helpers.iter().any(|h| {
                    h.id == id
                        && matches!(
                            helper_lowering(h),
                            HelperLowering::TailCall { .. } | HelperLowering::ProgArrayTailCall(_)
                        )
                })
            };
            let pends = (1..prog.subprogs.len()).filter(|&k| reached[k]).any(|k| {
                let sp = &prog.subprogs[k];
                prog.insts[sp.start..sp.end]
                    .iter()
                    .any(|inst| matches!(inst.op, Op::CallHelper { id } if tail_call(id)))
            });
            TailPositions { reached, pends }
        })
    }

    /// The current instruction's eBPF pc.
    #[inline]
    pub fn pc(&self) -> usize {
        self.prog.insts[self.cur].pc as usize
    }

    /// The helper-table entry of helper `id` (the verifier refused calls of unknown ids, so
    /// an error here means a backend asked for one its lowering needs, like the per-CPU
    /// table).
    pub fn helper(&self, id: u32) -> Result<HelperEntry, CompileError> {
        let found = self.helpers.iter().find(|h| h.id == id).copied();
        found.ok_or_else(|| {
            self.error(
                ErrorKind::UnknownHelper,
                format!("helper id {id} is not in the helper table"),
            )
        })
    }

    /// Is instruction `i` emitted by another (fused into the one before it) or not at all
    /// (a folded lookup's dead argument)?
    pub fn skipped(&self, i: usize) -> bool {
        self.skip == Some(i)
            || (!self.dead_arguments.is_empty() && self.dead_arguments.binary_search(&i).is_ok())
    }

    /// Where the current per-CPU address instruction finds its table and the CPU
    /// ([`crate::analysis::percpu_plan`]).
    pub fn percpu(&self) -> Result<PerCpuPlan, CompileError> {
        percpu_plan(self.helpers).map_err(|(kind, msg)| self.error(kind, msg))
    }

    /// A compile error at the current instruction.
    pub fn error(&self, kind: ErrorKind, msg: impl Into<String>) -> CompileError {
        CompileError::at(self.pc(), kind, msg)
    }

    /// In a checked copy (every access checks itself)?
    #[inline]
    pub fn in_copy(&self) -> bool {
        self.copy.is_some()
    }

    /// In a check group's checked copy, a checked access calls the program's shared full
    /// check (context, stack block, host regions) straight away, without the inline test of
    /// one region its hot-path form makes first. The copy runs only where the group's
    /// widened test failed: some member is outside that test's region, so the run stops at
    /// it, or the members lie in another region (a host region, a map value), which only
    /// the full check finds. Either way the inline test would send the access out of line;
    /// skipping it saves its code and its slow-path stub (x86-64: 15 bytes a member, not 45).
    /// A walk's copy keeps the inline test: it runs whenever its entry test fails, which a
    /// loop that exits early by its data may do on every run with all of its accesses
    /// inside the context.
    #[inline]
    pub fn checks_in_full(&self) -> bool {
        matches!(self.copy, Some(CopyOf::Group(_)))
    }

    /// How the current instruction's memory access (`size` bytes at `base + off`) is
    /// lowered: the sandbox's whole decision, asked once per access.
    // Asked per memory instruction: inlined into each backend's access lowering (a call
    // here cost x86-64 compiles 2-3% in `compile_bench`).
    #[inline(always)]
    pub fn access(&self, base: Reg, off: i16, size: Size) -> AccessLowering {
        // Trusted code asks nothing more (and has no plan to ask); frame-constant accesses
        // are proven without the dataflow, in every mode.
        if !self.mode.sandboxed() || is_frame_constant(base, off, size) {
            return AccessLowering::Direct { base, off };
        }
        if self.expansion != Expansion::None {
            return self.expansion_access(base, off, size);
        }
        if self.unchecked() {
            let (base, off) = self.walked_address(base, off);
            return AccessLowering::Direct { base, off };
        }
        match (self.access.check(self.cur), self.copy) {
            // A frame walk's checked copy: the pointer came from the frame, so the stack
            // block's inline test is the one that passes (any region still gets the full
            // check out of line).
            (AccessCheck::Guarded, Some(CopyOf::Loop(k)))
                if (self.access.walks[k].guard)
                    .is_some_and(|g| g.region == crate::walks::GuardRegion::Frame) =>
            {
                AccessLowering::Checked(AccessCheck::Stack)
            }
            // Without the clamp (measurement only) nothing is left to emit.
            (AccessCheck::CtxIndex { .. }, _) if !self.clamp => {
                AccessLowering::Direct { base, off }
            }
            (AccessCheck::CtxIndex { index, len, end }, _) => AccessLowering::IndexBounded {
                base,
                off,
                index,
                len,
                end,
            },
            (check, _) => AccessLowering::Checked(check),
        }
    }

    /// An access of an expansion of the current instruction (sandboxed code). A packet
    /// load's ([`crate::packet`]) first load reads the run's own environment ([`ENV`]):
    /// no check; its second is checked, trying the context first. An array lookup's one
    /// access is its key, which programs keep on their stack: the stack block is tested
    /// inline first. Any address the inline test misses still gets the full check, out of
    /// line.
    #[cold]
    fn expansion_access(&self, base: Reg, off: i16, size: Size) -> AccessLowering {
        if self.expansion == Expansion::RuntimeMemory {
            return AccessLowering::Direct { base, off };
        }
        match self.prog.insts[self.cur].op {
            Op::PacketLoad { .. } if base == ENV => AccessLowering::Direct { base, off },
            Op::PacketLoad {
                size: s,
                index,
                off: imm,
            } => {
                debug_assert_eq!(size, s);
                AccessLowering::Checked(crate::packet::packet_check(s, index, imm))
            }
            _ => AccessLowering::Checked(AccessCheck::Stack),
        }
    }

    /// Whether the current (checked-class) access needs no check of its own: proven inside
    /// the frame (by the data or by its walk), or a member of an encoded check group on the
    /// hot path, whose widened test the driver emitted before the group.
    #[inline]
    fn unchecked(&self) -> bool {
        match self.access.check(self.cur) {
            AccessCheck::None | AccessCheck::Walked => return true,
            AccessCheck::Guarded => return !self.in_copy(),
            _ => {}
        }
        if self.in_copy() {
            return false;
        }
        (self.access.group_of(self.cur)).is_some_and(|g| self.group_encoded[g])
    }

    /// Base and offset of an unchecked access: through its walk's shadow when the walk
    /// clamps into one (`AccessPlan::walked_address`; without the clamp, measurement only,
    /// the access uses the pointer itself).
    #[inline]
    fn walked_address(&self, base: Reg, off: i16) -> (Reg, i16) {
        if self.clamp {
            self.access.walked_address(self.cur, base, off)
        } else {
            (base, off)
        }
    }

    /// The register a walk's clamp writes its copy of the pointer to (`Walk::shadow`),
    /// when there is one and clamping is on.
    #[inline]
    pub fn walk_shadow(&self, walk: usize) -> Option<Reg> {
        self.access.walks[walk].shadow.filter(|_| self.clamp)
    }

    /// In a checked copy, at a member of a re-entered group, with clamping on: the base must
    /// itself be clamped from its checked address, so a jump that skips the group's test
    /// later never sees an unchecked base, also under misspeculation.
    #[inline]
    pub fn clamps_reentered_base(&self) -> bool {
        self.in_copy()
            && self.clamp
            && (self.access.group_of(self.cur)).is_some_and(|g| self.access.groups[g].reentered)
    }

    /// Where the jump at the current instruction to `target` lands: on the pointer clamp
    /// when it is a walk's back-edge (the copy's head inside a walk's checked copy), past
    /// the target group's test when the front end found the group already validated on
    /// every path to the jump, else at the target.
    #[inline]
    pub fn jump_label(&self, target: usize) -> DynamicLabel {
        if let Some(k) = self.access.walk_of_back_edge(self.cur) {
            return self.copy_head.unwrap_or(self.walk_clamps[k]);
        }
        // Into a counted walk from outside it: through its entry test, also where a group
        // starting at its head could be re-entered.
        if let Some(entry) = self.walk_entry(target) {
            return entry;
        }
        match self
            .access
            .reentry(self.cur)
            .and_then(|g| self.group_resume[g])
        {
            Some(resume) => resume,
            None => match self.budget_loop_of(self.cur) {
                // A back-edge to its loop's head: past the budget's load.
                Some(&(l, past_load)) if l.head == target => past_load,
                _ => self.labels[target],
            },
        }
    }

    /// The entry test of the counted walk (`walks::Counter`) whose head is instruction `i`,
    /// if any: where everything entering the loop from outside lands.
    #[inline]
    fn walk_entry(&self, i: usize) -> Option<DynamicLabel> {
        if self.walk_entries.is_empty() {
            return None;
        }
        (self.access.walk_at_head(i)).and_then(|k| self.walk_entries[k])
    }

    /// Where code coming back from out of line (a checked copy) enters instruction `i`: its
    /// label, or a counted walk's entry test.
    #[inline]
    pub fn landing(&self, i: usize) -> DynamicLabel {
        self.walk_entry(i).unwrap_or(self.labels[i])
    }

    /// What the budget charges for the current instruction's jump or call to `target`:
    /// `None` when the program counts no budget or the jump is no back-edge.
    #[inline]
    pub fn charge(&self, target: usize) -> Option<u64> {
        if !self.mode.counts_budget() {
            return None;
        }
        back_edge_charge(self.prog, self.cur, target)
    }

    /// Queues a check's cold side.
    #[inline]
    pub fn queue(&mut self, cold: Cold<A, F>) {
        self.colds.push(cold);
    }
}

/// What the driver lowers at the current instruction besides its own operation
/// ([`Driver::expansion`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expansion {
    /// The instruction's own operation.
    None,
    /// Operations whose accesses reach the program's memory (a lookup's key, a packet load's
    /// data) or the run's `env` ([`ENV`]): checked as `expansion_access` says.
    ProgramMemory,
    /// Operations whose accesses all read or write the runtime's own structures (the run's
    /// `env`, a prog array's slots, a tail call target's description) at addresses the
    /// program cannot choose: an inlined tail call's. No check.
    RuntimeMemory,
}

/// What every backend implements: the ISA hooks the driver calls, named after what they
/// emit, in traits each implemented in the backend's file of that concern. The driver
/// decodes each instruction's operation once and calls the hook of its class:
///
/// | trait | backend file | hooks |
/// |---|---|---|
/// | [`Lowering`] | `lower/mod.rs` | the assembler's position, labels and jumps |
/// | [`FrameHooks`] | `frame.rs` | prologue, epilogue, a function's register map |
/// | [`AluHooks`] | `lower/alu.rs` | ALU operations, sign extension, negation, byte order, 64-bit constants |
/// | [`MemoryHooks`] | `lower/mem.rs` | loads, stores, atomics; a check group's widened test, an access's slow path |
/// | [`JumpHooks`] | `lower/jump.rs` | jumps, conditional branches, `exit`; a walk's entry, extent test and pointer clamp |
/// | [`CallHooks`] | `lower/call.rs` | helper calls, `callx`, local calls, the per-CPU address |
/// | [`StopHooks`] | `lower/cold.rs` | budget stops, the ISA's own cold code, the program's end |
///
/// [`Isa`] names them all. The state the hooks share with the driver is [`Driver`],
/// reached through [`Lowering::driver`]; `driver().cur` is the instruction being lowered.
pub trait Lowering<'a> {
    /// Where an access's address is for its slow path (a register, or base and offset).
    type AccessSite: Copy + 'static;
    /// Cold code only this ISA needs; `std::convert::Infallible` when there is none.
    type IsaCold: Copy + 'static;

    fn driver(&mut self) -> &mut Driver<'a, Self::AccessSite, Self::IsaCold>;
    /// Bytes emitted so far.
    fn position(&self) -> usize;
    fn new_label(&mut self) -> DynamicLabel;
    fn bind(&mut self, label: DynamicLabel);
    /// An unconditional jump.
    fn jump(&mut self, label: DynamicLabel);
    /// The hot path's jump over an island of cold code (a form that reaches the island's
    /// end from its first pass).
    fn jump_over_island(&mut self, label: DynamicLabel) {
        self.jump(label);
    }
}

/// A function's frame.
pub trait FrameHooks<'a>: Lowering<'a> {
    fn prologue(&mut self, func: usize);
    /// The epilogue of `func`, after the driver bound `epilogues[func]`.
    fn epilogue(&mut self, func: usize);
    /// Before emitting code of `func` (its body, or cold code of its instructions): select
    /// that function's register map, if the backend has one per function.
    fn enter_function(&mut self, _func: usize) {}
    /// Before a callee's entry in sandboxed code, where no path falls through: a barrier
    /// against straight-line speculation past the code before it (the previous function's
    /// `ret`, a cold stub's `jmp`), which would run the callee with another function's
    /// registers while its proofs rest on what its callers pass
    /// ([`crate::ranges::CallFacts`]). Never executed.
    fn speculation_barrier(&mut self);
    /// A tail call's jump, in the entry function, once the driver found the entry to
    /// continue in (r0, never 0: the driver branches around a failed tail call): leave the
    /// entry's frame as `exit` says ([`FrameExit::TailCall`]: as its epilogue does, budget
    /// written back, saved registers restored; [`FrameExit::TailEntry`]: the same but the
    /// saved registers and the return address stay) and jump to r0. A
    /// [`FrameExit::TailCall`] passes the run's arguments (context `env.ctx_start`, length
    /// `env.ctx_end - env.ctx_start`, `env`); a [`FrameExit::TailEntry`] passes only `env`
    /// (in its register): the uniform frame's tail entry reloads the context and its length
    /// from `env` itself, only where its program reads them before writing.
    fn tail_jump(&mut self, exit: FrameExit);
    /// Bytes from a program's entry to its tail entry when the entry has the uniform
    /// tail-call frame (`CodegenMode::tail_calls`): every callee-saved register the backend
    /// ever uses (and the return address, where it is a register) saved in one fixed order
    /// by a fixed sequence, so the same for every such program of the backend. A
    /// [`FrameExit::TailEntry`] jump lands there, the caller's saves serving the target.
    /// The runtime adds it to the target's entry when it sets a prog-array slot
    /// (`PjTailTarget::tail_entry`; its table of skips is tested against the backends').
    fn tail_entry_skip(&self) -> u32;
}

/// How a backend leaves the entry's frame (its `epilogue`, or its `tail_jump`): the frame
/// is undone the same way, but only a return hands r0 to the host and is where a stop lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameExit {
    /// Back to the host: r0 is the result; a stop unwinds to here.
    Return,
    /// On to another program's entry: r0 is not the result.
    TailCall,
    /// On to another program's tail entry (both entries have the uniform tail-call frame):
    /// only the stack block is released; the saved registers stay, now the target's.
    TailEntry,
}

/// Register arithmetic (RFC 9669 semantics: 32-bit results zero-extended, shift counts
/// masked, division by zero and `MIN / -1` defined).
pub trait AluHooks<'a>: Lowering<'a> {
    /// `dst = dst op src` (`dst = src` for `mov`).
    fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand);
    /// `dst = sign_extend(low bits of src)`.
    fn movsx(&mut self, width: Width, dst: Reg, src: Reg, bits: u8) -> Result<(), CompileError>;
    fn neg(&mut self, width: Width, dst: Reg);
    /// `le`/`be`/`bswap` of the low `bits` of `dst`, zero-extended.
    fn byte_order(&mut self, kind: EndKind, bits: u8, dst: Reg);
    /// `dst = imm` (`lddw`).
    fn load_imm64(&mut self, dst: Reg, imm: u64);
    /// `dst = base + (index << shift)`, 64-bit, with `shift` ≤ 3: an element's address in
    /// one instruction where the ISA has one (x86-64 `lea`, arm64 `add … lsl`, RV64
    /// `shNadd` with Zba). Only the driver's expansions use it (never r10, never blinded).
    fn scaled_add(&mut self, dst: Reg, base: Reg, index: Reg, shift: u8);
    /// Sandboxed array lookups: `dst = index < max ? dst + (index << shift) : 0` (`dst`
    /// holds the array's base; `index` a zero-extended `u32` in r1-r9, left unchanged;
    /// `max` an immediate or r3; `shift` < 32), where no index at or past `max` ever forms
    /// an address, not even on a mispredicted path (Spectre v1). A backend either selects
    /// 0 without a branch (a conditional move: [`PastEnd::Selected`]) or branches to
    /// `past_end` after masking the index it adds ([`PastEnd::Branched`]: the driver then
    /// places `dst = 0` there, out of line).
    fn select_element(
        &mut self,
        dst: Reg,
        index: Reg,
        max: Operand,
        shift: u8,
        past_end: DynamicLabel,
    ) -> PastEnd;
}

/// What a backend's [`AluHooks::select_element`] did with an index past the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PastEnd {
    /// It selected 0 in line: `past_end` is unused.
    Selected,
    /// It branches to `past_end`, where the driver sets 0 and comes back.
    Branched,
}

/// Memory access, and the sandbox's checks of it (ask [`Driver::access`] how).
pub trait MemoryHooks<'a>: Lowering<'a> {
    fn load(&mut self, size: Size, sign_extend: bool, dst: Reg, base: Reg, off: i16);
    fn store(&mut self, size: Size, base: Reg, off: i16, src: Operand);
    fn atomic(&mut self, size: Size, op: AtomicOp, fetch: bool, base: Reg, off: i16, src: Reg);
    /// Check group `group`'s widened test before its first member, then the base clamped in
    /// place; branches to `fail` (the group's checked copy) when the test fails. The driver
    /// then binds the group's resume label and queues the copy.
    fn group_check(&mut self, group: usize, fail: DynamicLabel);
    /// The slow path of a checked access whose inline test failed, at `label`: the shared
    /// full check, then back to `resume`.
    fn access_slow_path(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        resume: DynamicLabel,
        size: u32,
        write: bool,
        site: Self::AccessSite,
    ) -> Result<(), CompileError>;
    /// After a checked copy's last instruction, before the driver's jump on past it.
    fn checked_copy_done(&mut self, _copy: CopyOf) {}
}

/// Control flow inside a function, and loops that walk a pointer (`walks`). Jumps land on
/// [`Driver::jump_label`] and back-edges pay [`Driver::charge`].
pub trait JumpHooks<'a>: Lowering<'a> {
    /// `goto target` (never the next instruction: the driver drops those).
    fn goto(&mut self, target: usize);
    /// `if dst cond src goto target`.
    fn branch(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, target: usize);
    /// `if dst cond src goto label`, in a driver's expansion: `label` is the driver's own,
    /// bound later in the same instruction, or a later instruction's start that the
    /// expansion jumps to as that instruction would (never a back-edge, never charged).
    fn branch_to(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, label: DynamicLabel);
    /// Right after an [`AluHooks::select_element`] that answered [`PastEnd::Selected`] into
    /// `dst`: a jump to `to` when it selected 0, standing for the program's NULL test of
    /// `dst` (the driver's `fused_null_test`). The test itself by default; a backend whose
    /// select leaves the bound's compare in the flags branches on them instead (one
    /// instruction where the test takes two).
    fn branch_if_selected_null(&mut self, dst: Reg, to: DynamicLabel) {
        self.branch_to(Width::W64, Cond::Eq, dst, Operand::Imm(0), to);
    }
    /// `exit` of `func` anywhere but as its last instruction on the hot path, which falls
    /// into the epilogue.
    fn exit(&mut self, func: usize);
    /// A walk's entry, before the jump to its head: copies the pointer into the walk's
    /// shadow and loads loop-invariant limits.
    fn walk_entry(&mut self, walk: usize);
    /// A guarded walk's entry test; branches to `fail` (the loop's checked copy) when the
    /// walk may leave its region.
    fn walk_guard(&mut self, walk: usize, guard: Guard, fail: DynamicLabel);
    /// The pointer clamp a walk's back-edge lands on (only with clamping on); falls into
    /// the head.
    fn walk_clamp(&mut self, walk: usize);
    /// At the head of a loop whose charges count in `reg` ([`Driver::count_budget_in_loops`],
    /// asked for only by a backend that implements this): `reg` = the budget.
    fn load_budget(&mut self, reg: Reg) {
        let _ = reg;
    }
}

/// Calls.
pub trait CallHooks<'a>: Lowering<'a> {
    /// `call helper` (resolved by the driver; called, or inlined by its `inline_kind`).
    fn call_helper(&mut self, helper: &HelperEntry) -> Result<(), CompileError>;
    /// `callx reg`: the helper whose id is in `reg` (`analysis::callx_plan`).
    fn callx(&mut self, reg: Reg);
    /// A bpf-to-bpf call of the function starting at instruction `target`.
    fn call_local(&mut self, target: usize);
    /// The per-CPU address of `src` in array `array` (`Op::MovPerCpu`).
    fn mov_percpu(&mut self, dst: Reg, src: Reg, array: Operand) -> Result<(), CompileError>;
    /// `call runner`, a helper that runs another program on this run's `env`
    /// ([`packjit_plugin_api::PJ_HELPER_CALLEE_TAIL_CALL`]): as [`CallHooks::call_helper`],
    /// with the budget written to `env` before the call and read back after, where the code
    /// keeps it in a register (the target counts on from what `env` holds).
    fn call_runner(&mut self, runner: &HelperEntry) -> Result<(), CompileError>;
    /// A tail call's target entered as a callee (a tail call inside a bpf-to-bpf function,
    /// see `prog_array_tail_call`), with r0 = the target's whole entry and r3 = its
    /// `PjTailTarget`: push the `env` words at `call.saved` on the native stack, copy
    /// `call.switched` from the record to `env`, call r0 as the host calls a program
    /// (context `env.ctx_start`, length `env.ctx_end - env.ctx_start`, `env`), with the
    /// budget in `env` across the call where the code keeps it in a register, then pop the
    /// saved words back. r0 = the target's result; r1-r5 are clobbered.
    fn call_tail_target(&mut self, call: &TargetCall);
}

/// What [`CallHooks::call_tail_target`] keeps of `env` across a target's run, and what it
/// switches to the target's before: `env` offsets (an even count: 16-byte pushes keep every
/// backend's stack aligned at the call) and (`PjTailTarget` offset, `env` offset) pairs.
#[derive(Clone, Copy, Debug)]
pub struct TargetCall {
    pub saved: &'static [i32],
    pub switched: &'static [(i32, i32)],
}

/// Cold code and the program's end.
pub trait StopHooks<'a>: Lowering<'a> {
    /// At `label`: the budget could not pay `charge` at `inst`; stop there.
    fn budget_stop(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        charge: u64,
    ) -> Result<(), CompileError>;
    /// Stop the run with the stop `env` already records (a tail call target entered from a
    /// bpf-to-bpf function stopped): unwind to the entry's restores as every stop does,
    /// without writing the stop's kind, pc or address. Never falls through.
    fn stop_recorded(&mut self);
    /// Cold code of the ISA's own.
    fn isa_cold(&mut self, cold: Self::IsaCold) -> Result<(), CompileError>;
    /// After queued cold code was placed, before instruction `next`.
    fn cold_placed(&mut self, _next: usize) {}
    /// After every function: the shared check, stop paths, tables, constants.
    fn program_end(&mut self) -> Result<(), CompileError>;
}

/// Everything the driver needs of a backend's lowering: all the hook traits.
pub trait Isa<'a>:
    FrameHooks<'a> + AluHooks<'a> + MemoryHooks<'a> + JumpHooks<'a> + CallHooks<'a> + StopHooks<'a>
{
}

impl<'a, T> Isa<'a> for T where
    T: FrameHooks<'a>
        + AluHooks<'a>
        + MemoryHooks<'a>
        + JumpHooks<'a>
        + CallHooks<'a>
        + StopHooks<'a>
{
}

/// One emission pass over the whole program.
pub fn lower_program<'a, L: Isa<'a>>(l: &mut L) -> Result<(), CompileError> {
    let prog = l.driver().prog;
    // Walks and check groups exist only in sandboxed code: trusted code skips the
    // per-instruction lookups.
    let walks = !l.driver().access.walks.is_empty();
    let groups = !l.driver().access.groups.is_empty();
    // Likewise the loops that count the budget in a register (x86-64's budgeted code).
    let budget_loops = !l.driver().budget_loops.is_empty();
    let blind_key = l.driver().mode.blind_key;
    for (k, sp) in prog.subprogs.iter().enumerate() {
        if k > 0 && l.driver().mode.sandboxed() {
            l.speculation_barrier();
        }
        let entry = l.driver().entries[k];
        l.bind(entry);
        l.driver().cur = sp.start;
        l.enter_function(k);
        l.prologue(k);
        let pos = l.position();
        l.driver()
            .islands
            .begin_function(pos, sp.start, sp.end, prog.insts.len());
        // Zipped with the instructions: no bounds check per instruction in the hot loop.
        for (i, inst) in (sp.start..).zip(&prog.insts[sp.start..sp.end]) {
            let pos = l.position();
            let d = l.driver();
            let queued = !d.colds.is_empty();
            if d.islands.island_due(pos, i, queued) {
                island(l, i)?;
            }
            let d = l.driver();
            d.cur = i;
            d.islands.note_instruction(i, &inst.op);
            if walks {
                if let Some(w) = d.access.walk_at_head(i) {
                    walk_head(l, w, i);
                }
            }
            // The instruction starts here (after a walk's clamp, which only the walk's
            // back-edge reaches). Code is far below 4 GiB: at most `MAX_INSNS` instructions.
            let pos = l.position() as u32;
            let d = l.driver();
            d.offsets.push(pos);
            if d.access.jumped_to(prog, i) {
                let label = d.labels[i];
                l.bind(label);
            }
            if budget_loops {
                let head_of = (l.driver().budget_loops.iter()).find(|(lp, _)| lp.head == i);
                if let Some(&(lp, past_load)) = head_of {
                    l.load_budget(lp.reg);
                    l.bind(past_load);
                }
            }
            if l.driver().skipped(i) {
                continue;
            }
            if groups {
                group_check_at(l, i);
            }
            lower_instruction(l, k, i, inst, blind_key)?;
        }
        let epilogue = l.driver().epilogues[k];
        l.bind(epilogue);
        l.epilogue(k);
        emit_queued_cold(l, sp.end)?;
    }
    l.program_end()
}

/// Instruction `i` of function `k`, through the blinding rewrite when the program's
/// constants are blinded ([`blind`]): the backend lowers the rewritten operations one by
/// one, all at `i` (same pc, same labels), and never sees the key.
#[inline(always)]
fn lower_instruction<'a, L: Isa<'a>>(
    l: &mut L,
    k: usize,
    i: usize,
    inst: &Inst,
    blind_key: Option<u64>,
) -> Result<(), CompileError> {
    let Some(blinded) = blind_key.and_then(|key| blind(inst, key)) else {
        return lower_op(l, k, i, inst.op);
    };
    for &op in blinded.ops() {
        lower_op(l, k, i, op)?;
    }
    Ok(())
}

/// One operation of instruction `i` of function `k`, through the hook of its class.
#[inline(always)]
fn lower_op<'a, L: Isa<'a>>(l: &mut L, k: usize, i: usize, op: Op) -> Result<(), CompileError> {
    match op {
        Op::Alu {
            width,
            op,
            dst,
            src,
        } => l.alu(width, op, dst, src),
        Op::MovSx {
            width,
            dst,
            src,
            bits,
        } => l.movsx(width, dst, src, bits)?,
        Op::MovPerCpu { dst, src, array } => l.mov_percpu(dst, src, array)?,
        Op::Neg { width, dst } => l.neg(width, dst),
        Op::End { kind, bits, dst } => l.byte_order(kind, bits, dst),
        Op::LdImm64 { dst, imm } => l.load_imm64(dst, imm.get()),
        Op::Load {
            size,
            sign_extend,
            dst,
            base,
            off,
        } => l.load(size, sign_extend, dst, base, off),
        Op::Store {
            size,
            base,
            off,
            src,
        } => l.store(size, base, off, src),
        Op::Atomic {
            size,
            op,
            fetch,
            base,
            off,
            src,
        } => l.atomic(size, op, fetch, base, off, src),
        // A jump to the next instruction is a no-op.
        Op::Ja { target } if target as usize == i + 1 => {}
        Op::Ja { target } => l.goto(target as usize),
        Op::Jcond {
            width,
            cond,
            dst,
            src,
            target,
        } => l.branch(width, cond, dst, src, target as usize),
        Op::CallHelper { id } => {
            let helper = l.driver().helper(id)?;
            match helper_lowering(&helper) {
                HelperLowering::TailCall { chooser } => tail_call(l, k, helper, chooser)?,
                HelperLowering::ProgArrayTailCall(array) => {
                    prog_array_tail_call(l, k, helper.id, array)?
                }
                HelperLowering::ArrayLookup(array) => array_lookup(l, array)?,
                HelperLowering::Code(HelperCode::Call(_)) => {
                    l.call_helper(&helper)?;
                    clear_helper_arguments(l);
                }
                HelperLowering::Code(HelperCode::Inline(_)) => l.call_helper(&helper)?,
            }
        }
        Op::CallReg { reg } => {
            l.callx(reg);
            clear_helper_arguments(l);
        }
        Op::CallLocal { target } => {
            l.call_local(target as usize);
            if k == 0 && l.driver().may_come_back_pending(i) {
                pending_tail_call_check(l, i);
            }
        }
        Op::PacketLoad { size, index, off } => lower_packet_load(l, size, index, off),
        Op::Exit => {
            // The last instruction of a function falls into its epilogue (a checked copy
            // never ends one).
            let d = l.driver();
            if d.in_copy() || i + 1 != d.prog.subprogs[k].end {
                l.exit(k);
            }
        }
    }
    Ok(())
}

/// A tail call (`PJ_INLINE_TAIL_CALL`): the chooser is called like a helper with the
/// program's r1-r3 (context, prog array, index) and answers the entry to continue in, or 0;
/// the backend's `tail_jump` leaves the frame and jumps there. Only the entry function
/// leaves its frame for another program's; a function reached only through calls in tail
/// position leaves the jump to the entry ([`jump_or_pend`]); in a bpf-to-bpf function
/// whose callers go on after it the callers' frames stay, and the target is entered as a
/// callee ([`callee_tail_call`]).
fn tail_call<'a, L: Isa<'a>>(
    l: &mut L,
    k: usize,
    helper: HelperEntry,
    chooser: u64,
) -> Result<(), CompileError> {
    if k > 0 && !l.driver().in_tail_position(k) {
        return callee_tail_call(l, k, helper.id);
    }
    let call = HelperEntry {
        inline_kind: packjit_plugin_api::PJ_INLINE_NONE,
        addr: chooser,
        ..helper
    };
    l.call_helper(&call)?;
    let failed = l.new_label();
    l.branch_to(Width::W64, Cond::Eq, 0, Operand::Imm(0), failed);
    jump_or_pend(l, k, FrameExit::TailCall);
    // Falling through: the tail call failed, and r0 = 0 says so.
    l.bind(failed);
    clear_helper_arguments(l);
    Ok(())
}

/// What a function reached only through calls in tail position leaves in `env.stop_kind`
/// when it makes a tail call, returning the entry to continue in as its r0: the target's
/// tail entry ([`FrameExit::TailEntry`]) or its whole entry. Apart from every `PJ_STOP_*`;
/// the entry's code consumes it right after the call it returns from
/// ([`Cold::PendingTailCall`]), so no host ever reads it.
const PENDING_TAIL_ENTRY: i32 = 0x7e00;
/// See [`PENDING_TAIL_ENTRY`].
const PENDING_WHOLE_ENTRY: i32 = 0x7e01;

/// A tail call that goes, r0 = the entry to continue in: in the entry function, the
/// backend's `tail_jump`. In a function reached only through calls in tail position
/// ([`crate::analysis::tail_reached`]) the jump is left pending for the entry
/// ([`PENDING_TAIL_ENTRY`] or [`PENDING_WHOLE_ENTRY`] in `env.stop_kind`, the target in
/// r0) and the function returns: its callers only return too, so the entry then jumps from
/// right after its call ([`pending_tail_call_check`]). Every `call` on the way is left by
/// its `ret`, so the host's return after the target's is predicted (leaving the frames by
/// resetting the stack pointer skipped those returns: each run's last returns then missed
/// the return-address predictor, ~8 ns per run).
fn jump_or_pend<'a, L: Isa<'a>>(l: &mut L, k: usize, exit: FrameExit) {
    use packjit_plugin_api::abi::PJ_ENV_STOP_KIND;
    if k == 0 {
        l.tail_jump(exit);
        return;
    }
    let kind = match exit {
        FrameExit::TailEntry => PENDING_TAIL_ENTRY,
        _ => PENDING_WHOLE_ENTRY,
    };
    in_runtime_memory(l, |l| {
        l.alu(Width::W64, AluOp::Mov, 4, Operand::Imm(kind));
        l.store(Size::W, ENV, PJ_ENV_STOP_KIND as i16, Operand::Reg(4));
    });
    l.exit(k);
}

/// `emit` with the driver's accesses to `env` unchecked ([`Expansion::RuntimeMemory`]),
/// then the expansion as it was.
fn in_runtime_memory<'a, L: Isa<'a>>(l: &mut L, emit: impl FnOnce(&mut L)) {
    let was = std::mem::replace(&mut l.driver().expansion, Expansion::RuntimeMemory);
    emit(l);
    l.driver().expansion = was;
}

/// After the entry's call at `at` in tail position into a function that may leave a tail
/// call pending ([`jump_or_pend`]): `if env.stop_kind != 0` the pending jump, out of line
/// ([`Cold::PendingTailCall`]). No stop returns here (a stop unwinds the whole run), so a
/// kind set here is always a pending tail call.
fn pending_tail_call_check<'a, L: Isa<'a>>(l: &mut L, at: usize) {
    use packjit_plugin_api::abi::{PJ_ENV_STOP_KIND, PJ_STOP_NONE};
    let label = l.new_label();
    // r4: dead after the call, as r1-r5 are after every call.
    in_runtime_memory(l, |l| {
        l.load(Size::W, false, 4, ENV, PJ_ENV_STOP_KIND as i16)
    });
    l.branch_to(
        Width::W32,
        Cond::Ne,
        4,
        Operand::Imm(PJ_STOP_NONE as i32),
        label,
    );
    l.driver().queue(Cold::PendingTailCall { inst: at, label });
}

/// The pending tail call's jump ([`pending_tail_call_check`], r4 = its kind, r0 = the
/// entry to continue in): the kind cleared, then the entry's jump as if the tail call had
/// been made here.
fn pending_tail_call<'a, L: Isa<'a>>(l: &mut L, label: DynamicLabel) {
    use packjit_plugin_api::abi::{PJ_ENV_STOP_KIND, PJ_STOP_NONE};
    l.bind(label);
    in_runtime_memory(l, |l| {
        l.alu(Width::W64, AluOp::Mov, 5, Operand::Imm(PJ_STOP_NONE as i32));
        l.store(Size::W, ENV, PJ_ENV_STOP_KIND as i16, Operand::Reg(5));
    });
    let whole = l.new_label();
    l.branch_to(
        Width::W32,
        Cond::Eq,
        4,
        Operand::Imm(PENDING_WHOLE_ENTRY),
        whole,
    );
    l.tail_jump(FrameExit::TailEntry);
    l.bind(whole);
    l.tail_jump(FrameExit::TailCall);
}

/// The deepest call chains (frames, the entry's included) of a program with a tail call
/// inside a bpf-to-bpf function. Such a target is entered as a callee, on top of the
/// native stack its callers hold: the whole stack block of the program (512 bytes per
/// level of its deepest chain, reserved by the entry), its saves and the runner's frame.
/// Up to [`packjit_plugin_api::PJ_MAX_TAIL_CALLS`] entries nest so (each one counts), so at
/// 4 frames (2 KiB) the chain holds at most 33 × (2 KiB + under 1 KiB of saves and the
/// runner's frame) ≈ 100 KiB of native stack, plus what the innermost target uses. The
/// kernel's own bound is in bytes of declared stack: under 256 above a tail-calling
/// subprogram (`check_max_stack_depth`); packjit's frames are fixed at 512 bytes.
pub const MAX_TAIL_CALLING_DEPTH: usize = 4;

/// A tail call inside a bpf-to-bpf function runs its target on top of the callers' frames:
/// refused where the call chains are deeper than [`MAX_TAIL_CALLING_DEPTH`].
fn callee_depth_check<'a, L: Isa<'a>>(l: &mut L, id: u32) -> Result<(), CompileError> {
    let d = l.driver();
    if d.prog.call_depth > MAX_TAIL_CALLING_DEPTH {
        let depth = d.prog.call_depth;
        return Err(d.error(
            ErrorKind::Unsupported,
            format!(
                "tail call (helper {id}) inside a bpf-to-bpf function of a program whose call chains are {depth} frames deep: at most {MAX_TAIL_CALLING_DEPTH} (the target runs on top of its callers' frames)"
            ),
        ));
    }
    Ok(())
}

/// The rest of a proven prog array's tail call inside a bpf-to-bpf function, once r3 holds
/// the slot's `PjTailTarget`: the target is entered as a callee, as the kernel runs it
/// (x86-64 since 5.10, arm64 since 6.0): its `exit` returns to this function's caller with
/// the target's r0, and the count stays the run's. The backend's `call_tail_target` keeps
/// what the target's whole entry overwrites in `env` (`entry_sp`, and the stack block's
/// bounds in sandboxed code) and what the switch replaces (maps, and sandboxed, regions):
///
/// ```text
/// r0 = *target->code_base[mode] ; if r0 == 0 goto out   none for the other mode's code
/// r5 = target->entry_offset ; r0 += r5
/// env->tail_calls = r4 + 1
/// call_tail_target (r0, r3)        env saved, switched to the target's, entry called, restored
/// r4 = env->stop_kind ; if r4 != 0 goto stopped
/// exit                             r0: the target's result, this function's
/// stopped: stop_recorded           the target's stop (kind, pc) ends the whole run
/// ```
///
/// The same tests as the entry's jump and the chooser's, on the same count; with no
/// runtime call between (the runner, `callee_tail_call`, serves the chooser's form).
fn target_as_callee<'a, L: Isa<'a>>(l: &mut L, k: usize, mode_off: i32, out: DynamicLabel) {
    use packjit_plugin_api::abi::{
        PJ_ENV_ENTRY_SP, PJ_ENV_MAPS, PJ_ENV_REGIONS, PJ_ENV_REGION_COUNT, PJ_ENV_STACK_END,
        PJ_ENV_STACK_START, PJ_ENV_STOP_KIND, PJ_ENV_TAIL_CALLS, PJ_STOP_NONE, PJ_TAIL_TARGET_MAPS,
        PJ_TAIL_TARGET_REGIONS, PJ_TAIL_TARGET_REGION_COUNT,
    };
    use Width::{W32, W64};
    // Sandboxed entries publish their stack block's bounds; trusted code never reads the
    // regions (nothing is checked), so only the maps switch there.
    const SANDBOXED: TargetCall = TargetCall {
        saved: &[
            PJ_ENV_ENTRY_SP,
            PJ_ENV_STACK_START,
            PJ_ENV_STACK_END,
            PJ_ENV_REGIONS,
            PJ_ENV_REGION_COUNT,
            PJ_ENV_MAPS,
        ],
        switched: &[
            (PJ_TAIL_TARGET_REGIONS, PJ_ENV_REGIONS),
            (PJ_TAIL_TARGET_REGION_COUNT, PJ_ENV_REGION_COUNT),
            (PJ_TAIL_TARGET_MAPS, PJ_ENV_MAPS),
        ],
    };
    const TRUSTED: TargetCall = TargetCall {
        saved: &[PJ_ENV_ENTRY_SP, PJ_ENV_MAPS],
        switched: &[(PJ_TAIL_TARGET_MAPS, PJ_ENV_MAPS)],
    };
    let call = if l.driver().mode.sandboxed() {
        SANDBOXED
    } else {
        TRUSTED
    };
    whole_entry(l, mode_off, out);
    l.alu(W64, AluOp::Add, 4, Operand::Imm(1));
    l.store(Size::DW, ENV, PJ_ENV_TAIL_CALLS as i16, Operand::Reg(4));
    l.call_tail_target(&call);
    let stopped = l.new_label();
    l.load(Size::W, false, 4, ENV, PJ_ENV_STOP_KIND as i16);
    l.branch_to(W32, Cond::Ne, 4, Operand::Imm(PJ_STOP_NONE as i32), stopped);
    l.exit(k);
    l.bind(stopped);
    l.stop_recorded();
}

/// `r0` = the whole entry of the target record in r3, for code of the mode whose word is
/// `mode_off` into the per-mode pairs: `*target->code_base[mode] + target->entry_offset`,
/// or on to `out` when the base word is 0 (a target of the other trust). r5 is clobbered.
fn whole_entry<'a, L: Isa<'a>>(l: &mut L, mode_off: i32, out: DynamicLabel) {
    use packjit_plugin_api::abi::{PJ_TAIL_TARGET_CODE_BASE, PJ_TAIL_TARGET_ENTRY_OFFSET};
    l.load(
        Size::DW,
        false,
        0,
        3,
        (PJ_TAIL_TARGET_CODE_BASE + mode_off) as i16,
    );
    l.load(Size::DW, false, 0, 0, 0);
    l.branch_to(Width::W64, Cond::Eq, 0, Operand::Imm(0), out);
    l.load(Size::DW, false, 5, 3, PJ_TAIL_TARGET_ENTRY_OFFSET as i16);
    l.alu(Width::W64, AluOp::Add, 0, Operand::Reg(5));
}

/// A tail call through a chooser inside a bpf-to-bpf function (helper `id`; a proven prog
/// array's is expanded in line instead, `prog_array_tail_call`): the target is entered as a
/// callee. The runner ([`packjit_plugin_api::PJ_HELPER_CALLEE_TAIL_CALL`]) gets the
/// program's r1-r3, makes the tail call's tests on the run's count, and runs the target's
/// whole entry on `env` (what the entry overwrites for this run saved and restored around
/// it); its answer says what happened:
///
/// ```text
/// call runner                    r1 = ctx, r2 = prog array, r3 = index; budget kept in env
/// r1-r5 = 0                      sandboxed (as after any helper)
/// if r0 == FELL_THROUGH goto out r0 = 0: on with the next instruction
/// if r0 != RETURNED goto stopped
/// r0 = env->callee_tail_r0 ; exit   the target's result is this function's
/// stopped: stop_recorded         the target's stop (kind, pc) ends the whole run
/// out:
/// ```
///
/// A target's `exit` so returns to this function's caller with the target's r0, as the
/// kernel's does; the count stays the run's (the runner never resets it). The runner's
/// reads are of the runtime's structures; the code's one read here is of `env`.
fn callee_tail_call<'a, L: Isa<'a>>(l: &mut L, k: usize, id: u32) -> Result<(), CompileError> {
    use packjit_plugin_api::abi::{
        PJ_CALLEE_TAIL_FELL_THROUGH, PJ_CALLEE_TAIL_RETURNED, PJ_ENV_CALLEE_TAIL_R0,
        PJ_HELPER_CALLEE_TAIL_CALL,
    };
    callee_depth_check(l, id)?;
    let d = l.driver();
    let Some(runner) = d
        .helpers
        .iter()
        .find(|h| h.id == PJ_HELPER_CALLEE_TAIL_CALL)
        .copied()
    else {
        return Err(d.error(
            ErrorKind::Unsupported,
            format!(
                "tail call (helper {id}) inside a bpf-to-bpf function: the host has no runner for it (helper id {PJ_HELPER_CALLEE_TAIL_CALL:#x})"
            ),
        ));
    };
    l.call_runner(&runner)?;
    clear_helper_arguments(l);
    let (out, stopped) = (l.new_label(), l.new_label());
    l.branch_to(
        Width::W64,
        Cond::Eq,
        0,
        Operand::Imm(PJ_CALLEE_TAIL_FELL_THROUGH as i32),
        out,
    );
    l.branch_to(
        Width::W64,
        Cond::Ne,
        0,
        Operand::Imm(PJ_CALLEE_TAIL_RETURNED as i32),
        stopped,
    );
    l.driver().expansion = Expansion::RuntimeMemory;
    l.load(Size::DW, false, 0, ENV, PJ_ENV_CALLEE_TAIL_R0 as i16);
    l.driver().expansion = Expansion::None;
    l.exit(k);
    l.bind(stopped);
    l.stop_recorded();
    l.bind(out);
    Ok(())
}

/// A tail call through a prog array known at compile time
/// (`PJ_INLINE_PROG_ARRAY_TAIL_CALL`), as the kernel's JITs emit it, in ordinary operations
/// and the backend's `tail_jump`; r3 is the index, r2 (the array) is not read:
///
/// ```text
/// w3 = w3                                   the index is a u32 (sandboxed with padded
///                                           slots: a 32-bit compare, the mask clears the rest)
/// if r3 >= max goto out
/// r4 = env->tail_calls ; if r4 >= 33 goto out
/// r5 = r3 ; r5 -= max ; r5 s>>= 63 ; r3 &= r5   sandboxed: index 0 past the bound, also
///                                           speculatively (`r3 &= index_slots - 1` where
///                                           the runtime padded the slots)
/// r5 = slots ; r5 += r3 << 3 ; r3 = *r5 ; if r3 == 0 goto out   the target, or an empty slot
/// r0 = target->tail_entry[mode] ; if r0 == 0 goto full
/// env->tail_calls = r4 + 1
/// env->maps = the target's, and in sandboxed code env->regions, env->region_count
/// tail_jump (r0, TailEntry)                 saves kept, the target's skipped
/// full:                                     a target without the uniform frame
/// r0 = *target->code_base[mode] ; if r0 == 0 goto out   none for the other mode's code
/// r5 = target->entry_offset ; r0 += r5
/// env->tail_calls = r4 + 1 ; env->maps, regions as above
/// tail_jump (r0, TailCall)                  the whole frame left, the whole entry run
/// out: r0 = 0
/// ```
///
/// The common case is the first jump: the runtime keeps in `tail_entry[mode]` the address
/// past the target's saves when the target's entry has the uniform frame of the caller's
/// backend and mode (it moves it with the code), so the frame decision, the code base and
/// the entry offset cost the caller one load. The caller's own entry has the uniform frame:
/// it makes tail calls (`CodegenMode::tail_calls`), and the runtime sets `tail_entry` only
/// when the target's code came from a backend of this contract with the same mode, so the
/// saves the target's epilogue restores are exactly the caller's.
///
/// Trusted code does not mask the index: like the kernel, which masks it only for
/// unprivileged programs, it leaves Spectre v1 to the host that vouched for the program.
///
/// Every access reads the runtime's structures at addresses the program does not choose
/// (the slot's index is bounded first), so none is checked ([`Expansion::RuntimeMemory`]).
/// The slot is read without a fence: the runtime publishes a target with release ordering,
/// and every later load goes through the loaded address (an address dependency, which
/// x86-64's TSO, arm64 and RVWMO all order).
fn prog_array_tail_call<'a, L: Isa<'a>>(
    l: &mut L,
    k: usize,
    id: u32,
    array: crate::analysis::ProgArray,
) -> Result<(), CompileError> {
    use packjit_plugin_api::abi::{
        PJ_ENV_MAPS, PJ_ENV_REGIONS, PJ_ENV_REGION_COUNT, PJ_ENV_TAIL_CALLS, PJ_TAIL_TARGET_MAPS,
        PJ_TAIL_TARGET_REGIONS, PJ_TAIL_TARGET_REGION_COUNT, PJ_TAIL_TARGET_TAIL_ENTRY,
    };
    use AluOp::*;
    use Width::{W32, W64};
    // Entered as a callee in a function whose callers go on after it; jumped to from the
    // entry and, through it, from a function reached only through calls in tail position.
    let as_callee = k > 0 && !l.driver().in_tail_position(k);
    if as_callee {
        callee_depth_check(l, id)?;
    }
    let sandboxed = l.driver().mode.sandboxed();
    // The other mode's word is 8 further in both per-mode pairs.
    let mode_off = if sandboxed { 8 } else { 0 };
    let known = {
        let d = l.driver();
        known_index(d.prog, k, d.cur)
    };
    if known.is_some_and(|index| index >= array.max_entries) {
        // Past the end: the tail call always falls through.
        l.alu(W64, Mov, 0, Operand::Imm(0));
        clear_helper_arguments(l);
        return Ok(());
    }
    l.driver().expansion = Expansion::RuntimeMemory;
    let out = l.new_label();
    match known {
        // The slot's address is a constant: nothing to bound or mask (the kernel's JITs
        // patch a direct jump for a constant index).
        Some(index) => {
            tail_call_count(l, out);
            l.load_imm64(5, array.slots + 8 * u64::from(index));
        }
        None => {
            // The index is a u32. Sandboxed, where the runtime padded the slots, the mask
            // below clears the upper half (a positive immediate), so a 32-bit compare bounds
            // it; else it is zero-extended first.
            let masked = sandboxed && array.index_slots != 0;
            if !masked {
                l.alu(W32, Mov, 3, Operand::Reg(3));
            }
            // The bound, as an immediate when it fits one (the compare and the subtraction
            // sign-extend it).
            let max = match i32::try_from(array.max_entries) {
                Ok(max) => Operand::Imm(max),
                Err(_) => {
                    l.load_imm64(1, u64::from(array.max_entries));
                    Operand::Reg(1)
                }
            };
            l.branch_to(if masked { W32 } else { W64 }, Cond::Ge, 3, max, out);
            tail_call_count(l, out);
            // Sandboxed: the index bounded also under a mispredicted branch. Where the
            // runtime padded the slots to a power of two (empty past the end), one `and`
            // keeps the read among them; else index 0 past the bound, by a computed mask.
            match array.index_slots {
                _ if !sandboxed => {}
                0 => {
                    l.alu(W64, Mov, 5, Operand::Reg(3));
                    l.alu(W64, Sub, 5, max);
                    l.alu(W64, Arsh, 5, Operand::Imm(63));
                    l.alu(W64, And, 3, Operand::Reg(5));
                }
                n => l.alu(W64, And, 3, Operand::Imm((n - 1) as i32)),
            }
            l.load_imm64(5, array.slots);
            l.scaled_add(5, 5, 3, 3);
        }
    }
    l.load(Size::DW, false, 3, 5, 0);
    l.branch_to(W64, Cond::Eq, 3, Operand::Imm(0), out);
    if as_callee {
        target_as_callee(l, k, mode_off, out);
        l.bind(out);
        l.alu(W64, Mov, 0, Operand::Imm(0));
        l.driver().expansion = Expansion::None;
        clear_helper_arguments(l);
        return Ok(());
    }
    // The run switched over to the target: counted, its maps (and regions) in env.
    // Trusted code and its helpers never read the regions (nothing is checked).
    let switch = |l: &mut L| {
        l.alu(W64, Add, 4, Operand::Imm(1));
        l.store(Size::DW, ENV, PJ_ENV_TAIL_CALLS as i16, Operand::Reg(4));
        let switched: &[(i32, i32)] = if sandboxed {
            &[
                (PJ_TAIL_TARGET_REGIONS, PJ_ENV_REGIONS),
                (PJ_TAIL_TARGET_REGION_COUNT, PJ_ENV_REGION_COUNT),
                (PJ_TAIL_TARGET_MAPS, PJ_ENV_MAPS),
            ]
        } else {
            &[(PJ_TAIL_TARGET_MAPS, PJ_ENV_MAPS)]
        };
        for &(from, to) in switched {
            l.load(Size::DW, false, 5, 3, from as i16);
            l.store(Size::DW, ENV, to as i16, Operand::Reg(5));
        }
    };
    let full = l.new_label();
    l.load(
        Size::DW,
        false,
        0,
        3,
        (PJ_TAIL_TARGET_TAIL_ENTRY + mode_off) as i16,
    );
    l.branch_to(W64, Cond::Eq, 0, Operand::Imm(0), full);
    switch(l);
    jump_or_pend(l, k, FrameExit::TailEntry);
    l.bind(full);
    whole_entry(l, mode_off, out);
    switch(l);
    jump_or_pend(l, k, FrameExit::TailCall);
    l.bind(out);
    l.alu(W64, Mov, 0, Operand::Imm(0));
    l.driver().expansion = Expansion::None;
    clear_helper_arguments(l);
    Ok(())
}

/// `r4 = env->tail_calls ; if r4 >= 33 goto out`: the chain's count, stored back (plus one)
/// only by a tail call that goes.
fn tail_call_count<'a, L: Isa<'a>>(l: &mut L, out: DynamicLabel) {
    use packjit_plugin_api::abi::{PJ_ENV_TAIL_CALLS, PJ_MAX_TAIL_CALLS};
    l.load(Size::DW, false, 4, ENV, PJ_ENV_TAIL_CALLS as i16);
    l.branch_to(
        Width::W64,
        Cond::Ge,
        4,
        Operand::Imm(PJ_MAX_TAIL_CALLS as i32),
        out,
    );
}

/// The tail call's index (r3) at instruction `at` of function `k`, when straight-line code
/// just before it set r3 to a constant (`mov r3, imm`, the usual form: a program picks its
/// next stage by number). The scan stops at a jump target, a jump, a call or anything else
/// that writes r3, so the value holds on every path to `at`.
pub(crate) fn known_index(prog: &crate::Program, k: usize, at: usize) -> Option<u32> {
    let start = prog.subprogs[k].start;
    let mut j = at;
    while j > start && !prog.is_target[j] {
        j -= 1;
        match prog.insts[j].op {
            // A 64-bit mov sign-extends the immediate; the index is its low 32 bits either way.
            Op::Alu {
                op: AluOp::Mov,
                dst: 3,
                src: Operand::Imm(imm),
                ..
            } => return Some(imm as u32),
            _ if prog.kind(j) & op_kind::STRAIGHT_LINE_END != 0 => return None,
            _ if prog.writes(j) & (1 << 3) != 0 => return None,
            _ => {}
        }
    }
    None
}

/// An array map lookup (`PJ_INLINE_ARRAY_LOOKUP`), as ordinary operations every backend
/// already lowers, at the call's pc: r2 points to the `u32` key. The key is read from the
/// frame at its known place when the key analysis found one (`Driver::array_keys`: the
/// argument setup is then not emitted), else through r2 (checked like any load of unknown
/// origin). It is bounded with a branch to an out-of-line NULL, as the kernel's
/// `map_gen_lookup` does:
///
/// ```text
/// r1 = *(u32 *)(r10 + off)       the key
/// if r1 >= max goto null         (cold: r0 = 0, back after the lookup)
/// r0 = base ; r0 += r1 << log2(stride)   one `scaled_add`
/// ```
///
/// Sandboxed code selects instead (`selected_element`): `r0 = r1 < max ? base + (r1 <<
/// log2(stride)) : 0` by the backend's Spectre-safe select, a conditional move where the
/// ISA has one (a stride that is not a power of two keeps the branch, and the Spectre-v1
/// mask `spectre_mask` after it).
///
/// Where the program stored the key from a register that still holds it, zero-extended
/// (`ArrayKey::Register`, [`crate::analysis::forwarded_key`]), the bound and the add use
/// that register and the key is not read back (the select leaves it unchanged).
///
/// The select (or the mask) keeps a mispredicted bound inside the array: no index at or
/// past `max` forms an address on any path. The program's own NULL test on the result then
/// makes it a map value to the access analysis (`ranges::Base::Value`, from the runtime's
/// `PJ_HELPER_LOOKUP_VALUES` record of the call), so the value load needs no check.
///
/// A per-CPU array passes the key to the per-CPU lookup, which picks this CPU's copy.
///
/// A key known at compile time is not read: r0 = the element's address, or NULL past the
/// end, as one constant; a per-CPU lookup gets the key as an immediate.
fn array_lookup<'a, L: Isa<'a>>(
    l: &mut L,
    array: crate::analysis::ArrayLookup,
) -> Result<(), CompileError> {
    use AluOp::*;
    use Width::W64;
    let d = l.driver();
    let percpu = match array.percpu_id {
        Some(id) => Some((id, d.helper(packjit_plugin_api::PJ_HELPER_PERCPU_LOOKUP)?)),
        None => None,
    };
    let cur = d.cur;
    let known = d
        .array_keys
        .binary_search_by_key(&cur, |&(at, _)| at)
        .ok()
        .map(|k| d.array_keys[k].1);
    let key = if percpu.is_some() { 2 } else { 1 };
    match known {
        Some(ArrayKey::Const(k)) if percpu.is_none() => {
            match array.element(k) {
                0 => l.alu(W64, Mov, 0, Operand::Imm(0)),
                addr => l.load_imm64(0, addr),
            }
            return Ok(());
        }
        // Sandboxed: a constant past the end is NULL here, so no index the per-CPU lookup
        // could mispredict past its bound is ever passed to it (see below).
        Some(ArrayKey::Const(k)) if d.mode.sandboxed() && k >= array.max_entries => {
            l.alu(W64, Mov, 0, Operand::Imm(0));
            return Ok(());
        }
        Some(ArrayKey::Const(k)) => l.load_imm64(key, u64::from(k)),
        // Frame-constant: proven in every mode (`Driver::access`).
        Some(ArrayKey::Frame(off)) => l.load(Size::W, false, key, crate::R10, off),
        // Trusted, in the register it was stored from (`Driver::new` checked the form
        // needs no write to it): bound and scale it there.
        Some(ArrayKey::Register(r)) => {
            let max = Operand::Imm(array.max_entries as i32);
            let shift = array.value_stride.trailing_zeros() as u8;
            if l.driver().mode.sandboxed() {
                return selected_element(l, array.base, r, max, shift);
            }
            return bounded_element(l, array.base, r, max, |_| shift);
        }
        None => {
            d.expansion = Expansion::ProgramMemory;
            l.load(Size::W, false, key, 2, 0);
            l.driver().expansion = Expansion::None;
        }
    }
    if let Some((id, lookup)) = percpu {
        // Sandboxed: the key is bounded and masked here, as for a plain array, before the
        // per-CPU lookup tests it again. Its own bound is a branch, which a mispredicted path
        // could pass with any index; with the mask every index it sees is below `max` on
        // every path, so the result is NULL or one of this CPU's elements (the backends mask
        // the CPU number the same way), and the runtime can vouch for it
        // (`PJ_HELPER_LOOKUP_VALUES`).
        let lookup_call = |l: &mut L| {
            l.alu(W64, Mov, 1, Operand::Imm(id as i32));
            l.call_helper(&lookup)?;
            if matches!(helper_code(&lookup), HelperCode::Call(_)) {
                clear_helper_arguments(l);
            }
            Ok(())
        };
        if !l.driver().mode.sandboxed() || matches!(known, Some(ArrayKey::Const(_))) {
            return lookup_call(l);
        }
        let max = array_bound(l, array.max_entries);
        // The per-CPU lookup may answer NULL itself: the program's test stays.
        return bounded(
            l,
            key,
            max,
            |l| {
                spectre_mask(l, key, array.max_entries, max);
                lookup_call(l)
            },
            false,
        );
    }
    let max = array_bound(l, array.max_entries);
    let sandboxed = l.driver().mode.sandboxed();
    let stride = array.value_stride;
    if sandboxed && stride.is_power_of_two() {
        return selected_element(l, array.base, 1, max, stride.trailing_zeros() as u8);
    }
    bounded_element(l, array.base, 1, max, |l| {
        if sandboxed {
            spectre_mask(l, 1, array.max_entries, max);
        }
        if stride.is_power_of_two() {
            let log = stride.trailing_zeros() as u8;
            // `scaled_add` shifts by up to 3; a larger power of two shifts the key first.
            if log > 3 {
                l.alu(W64, Lsh, 1, Operand::Imm(i32::from(log - 3)));
            }
            log.min(3)
        } else {
            l.load_imm64(2, stride);
            l.alu(W64, Mul, 1, Operand::Reg(2));
            0
        }
    })
}

/// Sandboxed code's Spectre-v1 mask on an array index the bound test (`index < max`, a
/// branch) let through, so that a mispredicted bound cannot index past the array: with
/// `max` a power of two, `index &= max - 1` (the kernel's `index_mask`; exact for every
/// index the branch admits, and inside the array for any other); else the branch-free
/// `index &= (index - max) s>> 63` (all ones below the bound, 0 at or above it: element 0).
/// `index` is in r1-r5 (the call clobbers them); the scratch is another of them, never
/// r3, where a bound that fits no immediate is.
fn spectre_mask<'a, L: Isa<'a>>(l: &mut L, index: Reg, max_entries: u32, max: Operand) {
    use AluOp::*;
    use Width::W64;
    if max_entries.is_power_of_two() {
        // max_entries <= 2^31: the mask fits an immediate.
        l.alu(W64, And, index, Operand::Imm((max_entries - 1) as i32));
        return;
    }
    let scratch = if index == 2 { 4 } else { 2 };
    l.alu(W64, Mov, scratch, Operand::Reg(index));
    l.alu(W64, Sub, scratch, max);
    l.alu(W64, Arsh, scratch, Operand::Imm(63));
    l.alu(W64, And, index, Operand::Reg(scratch));
}

/// An array's bound as an operand: an immediate when it fits one (compares and
/// subtractions sign-extend it), else r3.
fn array_bound<'a, L: Isa<'a>>(l: &mut L, max_entries: u32) -> Operand {
    match i32::try_from(max_entries) {
        Ok(max) => Operand::Imm(max),
        Err(_) => {
            l.load_imm64(3, u64::from(max_entries));
            Operand::Reg(3)
        }
    }
}

/// `if index >= max goto null`, then `found`, with `null` out of line (`Cold::NullResult`:
/// r0 = 0, then back after `found`'s code, or on to where the program's NULL test goes
/// when `found` forms an element's address: [`fused_null_test`]).
fn bounded<'a, L: Isa<'a>>(
    l: &mut L,
    index: Reg,
    max: Operand,
    found: impl FnOnce(&mut L) -> Result<(), CompileError>,
    forms_address: bool,
) -> Result<(), CompileError> {
    let null = l.new_label();
    l.branch_to(Width::W64, Cond::Ge, index, max, null);
    found(l)?;
    match forms_address.then(|| fused_null_test(l, true)).flatten() {
        Some(test) => null_result_to(l, null, test),
        None => null_result_at(l, null),
    }
    Ok(())
}

/// The out-of-line `r0 = 0` at `null`, going on where the NULL test `test` sends NULL
/// ([`Cold::NullResult`]).
fn null_result_to<'a, L: Isa<'a>>(l: &mut L, null: DynamicLabel, test: FusedNullTest) {
    let inst = l.driver().cur;
    l.driver().queue(Cold::NullResult {
        inst,
        label: null,
        resume: test.taken,
        replay_to: test.at,
    });
}

/// A program's NULL test an inlined lookup takes over ([`fused_null_test`]).
#[derive(Clone, Copy)]
struct FusedNullTest {
    /// Where NULL goes.
    taken: DynamicLabel,
    /// The test's instruction index; the ones between the lookup and it run on the NULL
    /// path too.
    at: usize,
}

/// The program's NULL test of an inlined lookup that forms an element's address, if the
/// lookup can take it over: `if rX == 0 goto L`, 64-bit, where rX holds the lookup's
/// result (r0, or a 64-bit copy), forward (or backward in trusted code without a budget),
/// with at most [`NULL_TEST_REACH`] register-only instructions between the call and it
/// (`replay`: else none), and no jump landing on any of them. The lookup's bound then
/// sends NULL to `L` itself: the out-of-line `r0 = 0` runs the instructions in between
/// again (as clang's `r1 = r0; r0 = 0; if r1 == 0` needs) and goes on to `L`, or the
/// select's branch does ([`AluHooks::branch_if_selected_null`], when nothing is in
/// between). The test is not emitted ([`Driver::skip`]): on the found path rX is an
/// element's address, never 0. `if (!v) return 0;` after a lookup then costs nothing in
/// trusted code and one branch on the bound's flags in sandboxed code. The analyses still
/// see the test (the program is unchanged), and under a mispredicted bound r0 is 0 or
/// inside the array, as with the test.
fn fused_null_test<'a, L: Isa<'a>>(l: &mut L, replay: bool) -> Option<FusedNullTest> {
    let d = l.driver();
    if d.in_copy() {
        return None;
    }
    let end = d.prog.subprogs[d.prog.subprog_of(d.cur)].end;
    let reach = if replay { NULL_TEST_REACH } else { 0 };
    // The registers holding the lookup's result (bit n = rn).
    let mut holding: u16 = 1;
    for at in d.cur + 1..end.min(d.cur + 2 + reach) {
        if d.access.jumped_to(d.prog, at) {
            return None;
        }
        match d.prog.insts[at].op {
            Op::Jcond {
                width: Width::W64,
                cond: Cond::Eq,
                dst,
                src: Operand::Imm(0),
                target,
            } if holding & (1 << dst) != 0 => {
                // A back-edge pays the budget and may land on a walk's clamp where it is
                // lowered: only trusted code without a budget (no walks there) jumps back
                // from the lookup.
                if target as usize <= at && (d.mode.sandboxed() || d.mode.counts_budget()) {
                    return None;
                }
                // Asked at the lookup, not at the test: a re-entry past a check group that
                // the front end may allow the test's jump is not taken (the group's test
                // runs), which is safe.
                let taken = d.jump_label(target as usize);
                d.skip = Some(at);
                return Some(FusedNullTest { taken, at });
            }
            // Only register arithmetic runs again on the NULL path.
            _ if d.prog.kind(at)
                & (op_kind::ALU | op_kind::NEG | op_kind::END | op_kind::MOV_SX)
                != 0 =>
            {
                holding = d.prog.copies_after(at, holding)
            }
            _ => return None,
        }
    }
    None
}

/// How many instructions may stand between a lookup and the NULL test it takes over (run
/// a second time on the NULL path): clang's `r1 = r0; r0 = 0` before `if r1 == 0`.
const NULL_TEST_REACH: usize = 2;

/// Here: where the out-of-line `r0 = 0` at `null` comes back to ([`Cold::NullResult`]).
fn null_result_at<'a, L: Isa<'a>>(l: &mut L, null: DynamicLabel) {
    let resume = l.new_label();
    l.bind(resume);
    let inst = l.driver().cur;
    l.driver().queue(Cold::NullResult {
        inst,
        label: null,
        resume,
        replay_to: inst + 1,
    });
}

/// The bounded element's address: `if index >= max goto null`, then `scale` (which scales
/// the index in place as far as needed and answers the shift left for the add), `r0 =
/// base ; r0 += index << shift` (see [`bounded`]).
fn bounded_element<'a, L: Isa<'a>>(
    l: &mut L,
    base: u64,
    index: Reg,
    max: Operand,
    scale: impl FnOnce(&mut L) -> u8,
) -> Result<(), CompileError> {
    bounded(
        l,
        index,
        max,
        |l| {
            let shift = scale(l);
            l.load_imm64(0, base);
            l.scaled_add(0, 0, index, shift);
            Ok(())
        },
        true,
    )
}

/// Sandboxed code's element address, `r0 = index < max ? base + (index << shift) : 0`,
/// by the backend's Spectre-safe select ([`AluHooks::select_element`]): a conditional move
/// where the ISA has one, so the bound costs a compare and the select, not a branch and a
/// mask besides.
fn selected_element<'a, L: Isa<'a>>(
    l: &mut L,
    base: u64,
    index: Reg,
    max: Operand,
    shift: u8,
) -> Result<(), CompileError> {
    l.load_imm64(0, base);
    let past_end = l.new_label();
    // A select that branches goes on from its out-of-line NULL, where the instructions
    // before the test can run again; an in-line select branches right after itself, so
    // only a test right after the call is taken over.
    let form = l.select_element(0, index, max, shift, past_end);
    match (form, fused_null_test(l, form == PastEnd::Branched)) {
        (PastEnd::Branched, None) => null_result_at(l, past_end),
        (PastEnd::Branched, Some(test)) => null_result_to(l, past_end, test),
        (PastEnd::Selected, Some(test)) => l.branch_if_selected_null(0, test.taken),
        (PastEnd::Selected, None) => {}
    }
    Ok(())
}

/// After a called helper (or a `callx`, which may call one), in sandboxed code: r1-r5 = 0.
/// A helper leaves whatever it likes in the argument registers (eBPF leaves them undefined
/// after a call), host stack and context addresses among them; the program must not see
/// them. Inlined helpers touch none of r1-r5.
fn clear_helper_arguments<'a, L: Isa<'a>>(l: &mut L) {
    if !l.driver().mode.sandboxed() {
        return;
    }
    for r in 1..=5 {
        l.alu(Width::W64, AluOp::Mov, r, Operand::Imm(0));
    }
}

/// A group's widened test, where its first member's code starts: before anything of that
/// instruction (an immediate to store, say), so a re-entering jump that lands right after
/// the test skips nothing else.
fn group_check_at<'a, L: Isa<'a>>(l: &mut L, i: usize) {
    let d = l.driver();
    let Some(g) = d.access.group_of(i) else {
        return;
    };
    if d.access.groups[g].first != i || !d.group_encoded[g] {
        return;
    }
    let fail = l.new_label();
    l.group_check(g, fail);
    let d = l.driver();
    if let Some(resume) = d.group_resume[g] {
        l.bind(resume);
    }
    l.driver().queue(Cold::Group {
        group: g,
        label: fail,
    });
}

/// Before a walk's head (`walks`): the entry (guarded walks test their extent first) jumps
/// over the pointer clamp its back-edge lands on. The clamp redoes the loop's test and,
/// with no branch, gives the shadow the pointer or 0 (or, without a shadow, zeroes the
/// pointer itself) when the loop should have ended (a mispredicted back-edge).
fn walk_head<'a, L: Isa<'a>>(l: &mut L, k: usize, head: usize) {
    let d = l.driver();
    let (guard, head_label, clamp_label) =
        (d.access.walks[k].guard, d.labels[head], d.walk_clamps[k]);
    if let Some(entry) = d.walk_entries[k] {
        l.bind(entry);
    }
    if let Some(guard) = guard {
        let fail = l.new_label();
        l.walk_guard(k, guard, fail);
        l.driver().queue(Cold::Walk {
            walk: k,
            label: fail,
        });
    }
    l.walk_entry(k);
    l.jump(head_label);
    l.bind(clamp_label);
    if l.driver().clamp {
        l.walk_clamp(k);
    }
}

/// The queued cold code, here (before instruction `next`): after its function or in an
/// island. A checked copy adds the cold sides of its own checks.
fn emit_queued_cold<'a, L: Isa<'a>>(l: &mut L, next: usize) -> Result<(), CompileError> {
    let start = l.position();
    while !l.driver().colds.is_empty() {
        let mut colds = std::mem::take(&mut l.driver().colds);
        for cold in colds.drain(..) {
            emit_cold(l, cold)?;
        }
        // The emptied queue serves the next round (when nothing new was queued meanwhile)
        // and the next function.
        if l.driver().colds.capacity() == 0 {
            l.driver().colds = colds;
        }
    }
    l.cold_placed(next);
    let end = l.position();
    l.driver().islands.cold_placed(start, end);
    Ok(())
}

/// The queued cold code between two instructions, jumped over by the hot path.
fn island<'a, L: Isa<'a>>(l: &mut L, next: usize) -> Result<(), CompileError> {
    let over = l.new_label();
    l.jump_over_island(over);
    emit_queued_cold(l, next)?;
    l.bind(over);
    Ok(())
}

fn emit_cold<'a, L: Isa<'a>>(
    l: &mut L,
    cold: Cold<L::AccessSite, L::IsaCold>,
) -> Result<(), CompileError> {
    let d = l.driver();
    let access = d.access;
    let at = match cold {
        Cold::Group { group, .. } => Some(d.access.groups[group].first),
        Cold::Walk { walk, .. } => Some(d.access.walks[walk].head),
        Cold::Budget { inst, .. }
        | Cold::Access { inst, .. }
        | Cold::NullResult { inst, .. }
        | Cold::PendingTailCall { inst, .. } => Some(inst),
        Cold::Isa(_) => None,
    };
    if let Some(at) = at {
        let func = d.prog.subprog_of(at);
        d.cur = at;
        l.enter_function(func);
    }
    match cold {
        Cold::Group { group, label } => {
            let g = &access.groups[group];
            checked_copy(l, label, g.first, g.last, CopyOf::Group(group))
        }
        Cold::Walk { walk, label } => {
            let w = &access.walks[walk];
            checked_copy(l, label, w.head, w.back_edge, CopyOf::Loop(walk))
        }
        Cold::Access {
            inst,
            label,
            resume,
            size,
            write,
            site,
        } => l.access_slow_path(inst, label, resume, size, write, site),
        Cold::Budget {
            inst,
            label,
            charge,
        } => l.budget_stop(inst, label, charge),
        Cold::NullResult {
            inst,
            label,
            resume,
            replay_to,
        } => {
            l.bind(label);
            l.alu(Width::W64, AluOp::Mov, 0, Operand::Imm(0));
            let prog = l.driver().prog;
            let func = prog.subprog_of(inst);
            for j in inst + 1..replay_to {
                l.driver().cur = j;
                let blind_key = l.driver().mode.blind_key;
                lower_instruction(l, func, j, &prog.insts[j], blind_key)?;
            }
            l.jump(resume);
            Ok(())
        }
        Cold::PendingTailCall { label, .. } => {
            pending_tail_call(l, label);
            Ok(())
        }
        Cold::Isa(f) => l.isa_cold(f),
    }
}

/// The checked copy of instructions `first..=last` at `label` (a loop's back-edge then goes
/// to the copy's own head), then on after them: neither a group nor a loop ends its
/// function.
fn checked_copy<'a, L: Isa<'a>>(
    l: &mut L,
    label: DynamicLabel,
    first: usize,
    last: usize,
    of: CopyOf,
) -> Result<(), CompileError> {
    let prog = l.driver().prog;
    let k = prog.subprog_of(first);
    l.bind(label);
    let d = l.driver();
    d.copy = Some(of);
    d.copy_head = matches!(of, CopyOf::Loop(_)).then_some(label);
    d.skip = None;
    for i in first..=last {
        if l.driver().skipped(i) {
            // Fused into the previous instruction, or a folded lookup's argument (also in
            // this copy).
            continue;
        }
        l.driver().cur = i;
        let blind_key = l.driver().mode.blind_key;
        lower_instruction(l, k, i, &prog.insts[i], blind_key)?;
    }
    let d = l.driver();
    (d.copy, d.copy_head, d.skip) = (None, None, None);
    l.checked_copy_done(of);
    // On after the copy; an instruction fused into the last one was done by it, and its
    // label is where the one after it starts.
    let next = l.driver().landing(last + 1);
    l.jump(next);
    Ok(())
}

/// A pass's code as the backend's assembler finished it.
pub struct Assembled {
    pub bytes: Reused<u8>,
    /// Native instructions in `bytes`, data excluded.
    pub native_insns: usize,
    /// Byte ranges of data in `bytes` (tables, constant pools and their padding).
    pub data: Vec<Range<usize>>,
}

/// One pass's lowering as [`emit`] drives it: an [`Isa`] that can also report its
/// branch sites and hand over its code.
pub trait Pass<'a>: Isa<'a> + Sized {
    /// The branch forms the backend relaxes.
    type Form: Copy + Ord + std::fmt::Debug;
    /// `None` when every branch site reaches in the form it was emitted in (the usual
    /// case, cheap to tell); else every site, for [`Relaxation::settle`].
    fn branch_checks(&mut self) -> Result<Option<Vec<BranchCheck<Self::Form>>>, CompileError>;
    /// The forms this pass emitted where they are longer than asked for (guessed far):
    /// later passes start from them.
    fn emitted_forms(&self) -> Vec<(usize, Self::Form)> {
        Vec::new()
    }
    /// Makes this pass's code the code the next pass would emit with `forms` (the
    /// relaxation's forms after it settled this pass), without emitting again: possible
    /// where a later pass's code is this one's with some branches in longer forms
    /// (`ColdPlacement` replays the first pass's position-dependent choices) and the backend
    /// can widen them in place. Returns false, changing nothing, where it cannot; then a new
    /// pass is emitted. After it, [`Pass::resolve`], [`Pass::relocate`], the branch checks
    /// and [`Pass::finish`] describe the widened code.
    fn regrow(&mut self, _forms: &[Self::Form]) -> bool {
        false
    }
    /// Moves offsets recorded while emitting (the driver's instruction offsets) to where the
    /// code after [`Pass::regrow`] has them.
    fn relocate(&self, _offsets: &mut [u32]) {}
    /// Resolved offset of a bound label.
    fn resolve(&self, label: DynamicLabel) -> Option<usize>;
    fn finish(self) -> Result<Assembled, CompileError>;
    /// The reach of the longest branch form, for the error that says a program is too
    /// large for the ISA (`"the ±2 GiB of rel32"`).
    const LONGEST_BRANCH: &'static str;
}

/// The result of lowering a program: the same in every backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// Machine code; offset 0 is the entry.
    pub bytes: Reused<u8>,
    /// Native instructions (data excluded).
    pub native_insns: usize,
    /// Byte ranges of data in `bytes` (`callx` tables, constants, padding), ascending.
    pub data: Vec<Range<usize>>,
    /// Byte offset of each eBPF instruction's code (indexed like `Program::insts`).
    pub inst_offsets: Reused<u32>,
    /// Relaxation passes needed to settle branch forms (1 unless some branch was out of
    /// range), emitted or made by widening the previous pass's code ([`Pass::regrow`]).
    pub passes: usize,
    /// Cold code islands inside functions ([`ColdPlacement`]).
    pub islands: usize,
    /// `(instruction, native offset)`, sorted: jumps to that instruction that land elsewhere
    /// than its code's start. A back-edge that skips a re-entered check group's test
    /// (`ranges::reentries`) lands past the test; a walk's back-edge (`walks`) lands on the
    /// pointer clamp before the head. A loop runs from its back-edge's landing.
    pub landings: Vec<(usize, usize)>,
}

/// Lowers a program: passes of `new_pass` (given the forms to emit and the cold placement)
/// until every branch reaches, with `relax` growing the sites that do not. Where the backend
/// can widen a pass's branches in place ([`Pass::regrow`]), that replaces emitting the pass
/// again (it counts as a pass all the same: the relaxation's bounds are per pass).
pub fn emit<'a, P: Pass<'a>>(
    mut relax: Relaxation<P::Form>,
    mut islands: ColdPlacement,
    mut new_pass: impl FnMut(&[P::Form], ColdPlacement) -> Result<P, CompileError>,
) -> Result<Emitted, CompileError> {
    let mut pass = 'passes: loop {
        relax.begin_pass();
        islands.begin_pass(relax.passes());
        let mut pass = new_pass(relax.forms(), islands)?;
        lower_program(&mut pass)?;
        islands = pass.driver().islands.clone();
        loop {
            let settled = match pass.branch_checks()? {
                None => Settled::Done,
                Some(checks) => {
                    relax.reserve(checks.len());
                    for (site, form) in pass.emitted_forms() {
                        relax.form(site, form);
                    }
                    relax.settle(&checks, |c| {
                        CompileError::new(
                            ErrorKind::Encoding,
                            format!(
                                "program too large: the branch at code offset {} spans {} \
                                 bytes, beyond {}",
                                c.at,
                                c.disp,
                                P::LONGEST_BRANCH
                            ),
                        )
                    })?
                }
            };
            if settled == Settled::Done {
                break 'passes pass;
            }
            if !pass.regrow(relax.forms()) {
                continue 'passes;
            }
            relax.begin_pass();
        }
    };
    let d = pass.driver();
    let (access, resumes, clamps) = (
        d.access,
        std::mem::take(&mut d.group_resume),
        std::mem::take(&mut d.walk_clamps),
    );
    let landings = landings(access, &resumes, &clamps, |l| pass.resolve(l));
    let mut inst_offsets = std::mem::take(&mut pass.driver().offsets);
    pass.relocate(&mut inst_offsets);
    let code = pass.finish()?;
    Ok(Emitted {
        bytes: code.bytes,
        native_insns: code.native_insns,
        data: code.data,
        inst_offsets,
        passes: relax.passes(),
        islands: islands.islands(),
        landings,
    })
}

/// `(instruction, native offset)`, sorted: jumps to that instruction that land elsewhere
/// than its code's start (see [`Emitted::landings`]).
fn landings(
    access: &AccessPlan,
    group_resume: &[Option<DynamicLabel>],
    walk_clamps: &[DynamicLabel],
    resolve: impl Fn(DynamicLabel) -> Option<usize>,
) -> Vec<(usize, usize)> {
    let groups = access.groups.iter().zip(group_resume);
    let walks = access.walks.iter().zip(walk_clamps);
    let mut landings: Vec<(usize, usize)> = groups
        .filter_map(|(g, l)| Some((g.first, resolve((*l)?)?)))
        .chain(walks.filter_map(|(w, &l)| Some((w.head, resolve(l)?))))
        .collect();
    landings.sort_unstable();
    landings
}
