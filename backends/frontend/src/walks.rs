//! Walked stack pointers: loops that step a pointer through their frame, proven in bounds
//! from the loop's own exit test, with one branch-free clamp per iteration instead of a
//! check per access.
//!
//! ```text
//!   r3 = r10 - 512          ; a = -512 (exact, data-derived)
//! head:
//!   r4 = *(u64 *)(r3 + 0)   ; r3 in {r10 - 512, r10 - 504, ..., r10 - 8}
//!   r3 += 8                 ; c = 8, the only write of r3 in the loop
//!   if r3 != r10 goto head  ; b = 0: the walk ends exactly at b ((b - a) % c == 0)
//! ```
//!
//! [`ranges`](crate::ranges) cannot prove the load: it never narrows a value by a branch, so
//! its interval for r3 widens to everything at the loop head. Here the exit test *is* used,
//! for the architectural path only: every value r3 takes at the head is `a + c·t` for the
//! iterations `t` the test lets through, so every access through it is inside the frame and
//! needs no check. Speculation is what the exit test cannot bound: a mispredicted back-edge
//! runs the body again with r3 past the end. So the back-edge lands on a **clamp** that
//! redoes the test and zeroes the pointer when the loop should have ended
//! (`r3 = (r3 != r10) ? r3 : 0`, a conditional select, no branch). From 0 the speculative
//! walk steps at most [`MAX_STEP`] bytes per iteration, far inside the never-mapped first
//! 64 KiB (offsets are below 2 KiB), so no access leaves the frame, also speculatively. The
//! first iteration, entered by falling through, needs no clamp: the entry value is exact.
//!
//! A loop qualifies when (all checked in [`find`]):
//! * its last instruction is the only jump to its first (single entry, by falling through
//!   from an instruction that can fall through), no jump from outside lands inside it, and
//!   jumps inside it only leave it (so each iteration runs the body straight down);
//! * it makes no calls;
//! * the pointer is written once in the loop, by `ptr += c` (64-bit, `1 <= c <= MAX_STEP`),
//!   and the bound register not at all;
//! * on entry, both are this frame's r10 plus exact offsets `a` and `b` (data-derived, so
//!   they hold on every path);
//! * the back-edge is a 64-bit unsigned `ptr != bound` (with `b > a` and `(b - a) % c == 0`,
//!   so the walk meets the bound exactly instead of stepping over it), `ptr < bound` or
//!   `ptr <= bound` (either operand order).
//!
//! Each load or store through the pointer whose whole range over all those values lies in
//! the current 512-byte frame becomes [`AccessCheck::Walked`]; a walk without any is dropped.
//!
//! **Guarded walks.** The same loop shape with a bound only the run time knows cannot be
//! proven at compile time: through the context (`p = ctx; loop: … *(u64 *)p …; p += 8;
//! if p < ctx + len goto loop`, where whether the last 8-byte load stays inside depends on
//! the length), or through the frame up to a run-time length. With a power-of-two step,
//! such a loop gets a [`Guard`]: one test on entry, before the first iteration, that the
//! whole walk lies in the context (or, for a pointer into the frame, in the current frame).
//! The backend emits the loop twice: the hot copy, where the accesses through the
//! pointer at non-negative offsets ([`AccessCheck::Guarded`]) have no check and the
//! back-edge clamps as above, and a checked copy out of line, which the entry runs instead
//! when the guard fails (it stops exactly where the reference does). The guard's verdict
//! also selects the pointer (itself, or 0 under a mispredicted guard branch; x86-64 uses
//! `lfence` there), so the hot copy is never entered speculatively on a bad walk. The cost
//! per loop entry is about ten instructions; per iteration it is the clamp alone.
//!
//! **Counted walks.** A loop that walks a pointer down the frame while a separate counter
//! ends it (`p = &a[j]`, as clang leaves `while (j > 0 && …) { a[j] = a[j - 1]; j--; }`):
//!
//! ```text
//! head:
//!   r9 = *(u32 *)(r6 - 4)   ; a[j - 1]
//!   if r9 <= r5 goto out    ; other exits only leave the loop
//!   r7 += -1                ; the counter's one write
//!   *(u32 *)(r6 + 0) = r9   ; a[j]
//!   r6 += -4                ; the pointer's one write: p = base + 4·j on every path
//!   if r7 != 0 goto head    ; the back-edge tests the counter, not the pointer
//! ```
//!
//! Nothing the data says bounds `j` (a branch before the loop does), and nothing relates
//! `p` to `j` in the range analysis. Both come from a run-time test on entry instead
//! ([`Counter`]): with `p` and `j` on entry, the head values are `p - s·t` for `t = 0 ..
//! j - 1` (the two step together, one iteration each, and only the back-edge goes back), so
//! every access lies in `[p - s·(j - 1) + lo, p + end)`; the guard tests that this is inside
//! the current frame and `j >= 1`, with no branch between its verdict and a select of the
//! pointer (a mispredicted guard enters the loop with the pointer at [`COUNTED_CLAMP`], far
//! inside the never-mapped first 64 KiB). The loop may be entered by jumps from anywhere
//! outside it (the backend lands them on the guard). The back-edge's clamp tests the counter,
//! signed `j > 0`, and moves the pointer to [`COUNTED_CLAMP`] when it fails: architecturally
//! `j` is in `1 ..= j₀` there, under a mispredicted back-edge it is 0 or below, and the
//! pointer walks down from the clamp at most [`MAX_STEP`] bytes per iteration. The guard
//! needs no `lfence` (a fence per loop entry cost more than the checks it saves, see the
//! index walks in `docs/BENCHMARKS.md`): x86-64 and arm64 fold its two tests into one
//! branch with selects, RV64 with set-on-less-than bits; a backend without the guard drops
//! them ([`crate::ranges::AccessPlan::drop_counted_walks`]).

use crate::ranges::{for_each_state, transfer_at, AccessCheck, Base, State, Val};
use crate::{AluOp, Compared, Cond, Op, Operand, Program, Reg, Width, STACK_SIZE};

/// Largest pointer step: from a clamped 0, a speculation window of a few hundred iterations
/// stays inside the first 64 KiB, which Linux never maps (`vm.mmap_min_addr`).
pub const MAX_STEP: i64 = 64;

/// Where a counted walk's clamp puts its pointer ([`Counter`]): the middle of the
/// never-mapped first 64 KiB, so a speculative walk down from it by at most [`MAX_STEP`]
/// bytes per iteration, with offsets within [`COUNTED_REACH`] of it, stays in that page
/// range for hundreds of iterations.
pub const COUNTED_CLAMP: i64 = 1 << 15;

/// Largest distance of a counted walk's accesses from the pointer, below or above.
pub const COUNTED_REACH: i64 = 2048;

/// The counter of a counted walk (see the module docs): the loop's back-edge is
/// `if reg != 0 goto head`, its one write in the loop `reg += -1`, and the pointer's one
/// write `ptr += step` with `step = -2^shift` ([`Guard::shift`]). The walk's [`Guard`] (region
/// [`GuardRegion::Frame`], `end` the largest end offset) is tested with `lo`:
///
/// ```text
///   q = p + lo - (r10 - 512)              (unsigned)
///   q <= 512 - (end - lo)  and  j - 1 <= q >> shift
/// ```
///
/// which is exactly "every access of every iteration lies in the frame, and `j >= 1`"
/// (`s·(j - 1) <= q` is the lowest iteration's lowest access at or above the frame's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Counter {
    /// The counting register.
    pub reg: Reg,
    /// The smallest offset of a guarded access from the pointer's head value, in
    /// `-COUNTED_REACH..=0` or above (the step is part of it past the pointer's step).
    pub lo: i64,
}

/// A loop walking `ptr` through the frame (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Walk {
    /// First instruction of the loop: where the back-edge lands (after the clamp).
    pub head: usize,
    /// The back-edge: the loop's last instruction, a conditional jump to `head`.
    pub back_edge: usize,
    /// The walked pointer.
    pub ptr: Reg,
    /// The loop-invariant register it is compared with.
    pub bound: Reg,
    /// The loop goes on while `ptr cont bound` (unsigned, 64-bit): `Ne`, `Lt` or `Le`.
    pub cont: Cond,
    /// The largest value the pointer has at the head, as an offset from this frame's r10
    /// (its smallest is its exact entry value): a backend may saturate the pointer at
    /// `r10 + last` instead of zeroing it (RV64 with Zbb: `minu`).
    pub last: i64,
    /// Instruction index of the loop's one `ptr += step`.
    pub step_at: usize,
    /// The step, `1..=MAX_STEP`.
    pub step: i64,
    /// A caller-saved register (r0–r5) the loop neither reads nor writes and that is dead
    /// at every exit of the loop, when there is one. The clamp then writes the pointer's
    /// clamped copy there, and the walked accesses go through the copy (past the step with
    /// the step added to their offset, see [`crate::ranges::AccessPlan::walked_address`]):
    /// the pointer itself is never clamped, so the clamp stays off the loop-carried chain
    /// (`ptr += step` alone), where it would add its latency to every iteration. `None`:
    /// the clamp zeroes the pointer in place.
    ///
    /// The copy's clamp tests the *order* `ptr < bound` (`<=` for a `Le` walk), also for a
    /// `!=` walk: the walk meets its bound exactly from below, so that is the loop's own test
    /// on the architectural path, and under misspeculation a pointer that ran past the
    /// bound keeps failing it (a `!=` test would pass again one step later, and the pointer
    /// is no longer reset to 0 by its own clamp).
    pub shadow: Option<Reg>,
    /// A second register like [`Walk::shadow`], when there is one: a backend that needs a
    /// loop-invariant value in a register sets it once on entry instead of every iteration
    /// (RV64 with Zbb: `r10 + last` for the clamp's `minu`; arm64 in the sandbox: r10 itself
    /// for a walk bounded by r10, which has no register of its own there).
    pub limit: Option<Reg>,
    /// For a walk whose bounds are only known at run time ([`AccessCheck::Guarded`]
    /// accesses): the test the backend runs on entry, before the first iteration, choosing
    /// between this loop with no checks on those accesses and its checked copy. `None` for
    /// a walk proven at compile time (`Walked`).
    pub guard: Option<Guard>,
    /// For a counted walk: its counter ([`Counter`]); `None` for a walk that compares the
    /// pointer itself.
    pub counter: Option<Counter>,
}

/// Where a guarded walk must stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GuardRegion {
    /// The context, `[ctx_start, ctx_start + ctx_len)`.
    Context,
    /// The current function's frame, `[r10 - 512, r10)` (a pointer into the frame whose
    /// bound is only known at run time: a buffer filled up to a length).
    Frame,
}

/// The entry test of a guarded walk: with `p` and `b` the pointer and the bound on entry,
/// and `q = p - start` for the region `[start, start + len)` ([`GuardRegion`]), the walk
/// stays inside the region iff (unsigned, 64-bit)
///
/// ```text
///   end <= len  and  q <= len - end
///   and  D >> shift <= (len - end - q) >> shift,  D = b - p - bias
/// ```
///
/// (for a `!=` walk `D` rotated right by `shift` instead of shifted). Why: the head values
/// are `p + step·t` for `t = 0..=T`, every access of the walk lies in
/// `[p, p + step·T + end)` (the guarded ones start at non-negative offsets from the head
/// value), and `step·T` is `D` rounded down to a multiple of the step, with `bias` 1 for
/// `<` (the largest value below `b`), 0 for `<=` and `step` for `!=` (the last value is
/// exactly `b - step`). `D` wraps to a huge value exactly when the loop would run once or
/// never meet its bound (`b <= p`, or for `!=` also `b - p` not a multiple of the step: the
/// rotation moves the remainder into the top bits); those loops take the checked copy,
/// which is correct for any input, only slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    /// The region the walk must stay in.
    pub region: GuardRegion,
    /// log2 of the step.
    pub shift: u32,
    /// Subtracted from `b - p`: 1 for `<`, 0 for `<=`, the step for `!=`.
    pub bias: u64,
    /// The largest end offset of a guarded access from the pointer's head value (below
    /// 2048).
    pub end: u64,
}

/// A candidate before the entry values are known.
struct Candidate {
    walk: Walk,
}

/// Finds the walks of `prog` and marks the accesses they prove as [`AccessCheck::Walked`] in
/// `checks` (indexed by instruction). Returns the walks, sorted by head. (One dataflow run of
/// its own; [`crate::ranges::plan_accesses`] shares its run through [`Candidates`].)
pub fn find(prog: &Program, checks: &mut [AccessCheck]) -> Vec<Walk> {
    let mut cands = Candidates::new(prog);
    if !cands.is_empty() {
        let mut watch = cands.observation_points();
        watch.dedup();
        for_each_state(prog, &watch, |i, st| cands.observe(prog, i, st));
    }
    cands.prove(prog, checks)
}

/// Loops that pass the structural conditions, waiting for their entry values.
pub struct Candidates {
    cands: Vec<Candidate>,
    /// Per candidate: the pointer's and the bound's values falling into the head.
    entry: Vec<Option<(Val, Val)>>,
}

impl Candidates {
    /// The structural pass. Linear in the program: the conditions that can fail anywhere in
    /// a loop (a landing inside it, a call in it) are answered from prefix counts, and the
    /// loops that pass them are disjoint (a second loop's head would be a landing inside
    /// the first), so only disjoint bodies are scanned.
    pub fn new(prog: &Program) -> Self {
        let none = Candidates {
            cands: Vec::new(),
            entry: Vec::new(),
        };
        // From the branch list alone, without reading even the branches' instructions: at
        // 1 M instructions that read missed the cache once per backward jump, most of what
        // a sandboxed compile lost to memory there.
        let back_edges = prog
            .branches
            .iter()
            .any(|b| b.compared == Compared::RegReg(Width::W64) && b.target < b.at);
        if !back_edges {
            return none;
        }
        let n = prog.insts.len();
        // landings[i]: jumps landing on i; before[i]: landings / calls among 0..i.
        let mut landings = vec![0u32; n];
        for inst in &prog.insts {
            if let Op::Ja { target } | Op::Jcond { target, .. } = inst.op {
                landings[target as usize] += 1;
            }
        }
        let mut landed_before = Vec::with_capacity(n + 1);
        let mut calls_before = Vec::with_capacity(n + 1);
        let (mut l, mut c) = (0u32, 0u32);
        for (inst, &k) in prog.insts.iter().zip(&landings) {
            landed_before.push(l);
            calls_before.push(c);
            l += k;
            c += matches!(
                inst.op,
                Op::CallHelper { .. }
                    | Op::CallReg { .. }
                    | Op::CallLocal { .. }
                    | Op::MovPerCpu { .. }
            ) as u32;
        }
        landed_before.push(l);
        calls_before.push(c);
        let mut cands: Vec<Candidate> = Vec::new();
        for sp in &prog.subprogs {
            for j in sp.start..sp.end {
                let Op::Jcond {
                    width: Width::W64,
                    cond,
                    dst,
                    src: Operand::Reg(src),
                    target: head,
                } = prog.insts[j].op
                else {
                    continue;
                };
                let head = head as usize;
                if head <= sp.start || head >= j {
                    continue;
                }
                // Entered only by falling through from `head - 1`; the back-edge is the only
                // jump to the head and nothing lands inside the loop (which also rules out
                // jumps inside it that stay inside it); no calls.
                if landings[head] != 1
                    || matches!(prog.insts[head - 1].op, Op::Ja { .. } | Op::Exit)
                    || landed_before[j + 1] != landed_before[head + 1]
                    || calls_before[j] != calls_before[head]
                {
                    continue;
                }
                // Either operand order: `ptr cont bound` or `bound cont' ptr`.
                let orders = [
                    match cond {
                        Cond::Ne | Cond::Lt | Cond::Le => Some((dst, src, cond)),
                        _ => None,
                    },
                    match cond {
                        Cond::Ne => Some((src, dst, Cond::Ne)),
                        Cond::Gt => Some((src, dst, Cond::Lt)),
                        Cond::Ge => Some((src, dst, Cond::Le)),
                        _ => None,
                    },
                ];
                for (ptr, bound, cont) in orders.into_iter().flatten() {
                    if let Some(c) = candidate(prog, head, j, ptr, bound, cont) {
                        cands.push(c);
                        break;
                    }
                }
            }
        }
        // Sorted by head (subprograms are in order, and disjoint loops by back-edge).
        cands.sort_unstable_by_key(|c| c.walk.head);
        let entry = vec![None; cands.len()];
        Candidates { cands, entry }
    }

    /// Whether there is nothing to prove (no dataflow needed).
    pub fn is_empty(&self) -> bool {
        self.cands.is_empty()
    }

    /// The instructions [`Candidates::observe`] needs the state before, ascending: each
    /// candidate's instruction before its head.
    pub fn observation_points(&self) -> Vec<usize> {
        self.cands
            .iter()
            .filter_map(|c| c.walk.head.checked_sub(1))
            .collect()
    }

    /// Records the entry values when `i` is the instruction before a candidate's head
    /// (`st` is the state before `i`; the head is entered by falling through from it).
    pub fn observe(&mut self, prog: &Program, i: usize, st: &State) {
        let Ok(k) = self.cands.binary_search_by_key(&(i + 1), |c| c.walk.head) else {
            return;
        };
        let c = &self.cands[k];
        let mut after = *st;
        transfer_at(prog, i, &mut after);
        self.entry[k] = Some((after[c.walk.ptr as usize], after[c.walk.bound as usize]));
    }

    /// Proves what the entry values allow: marks the walked accesses in `checks` and
    /// returns the walks, sorted by head.
    pub fn prove(self, prog: &Program, checks: &mut [AccessCheck]) -> Vec<Walk> {
        let mut walks = Vec::new();
        // Liveness per function, computed for the first walk that needs it.
        let mut live: Option<(usize, Vec<u16>)> = None;
        for (c, vals) in self.cands.iter().zip(self.entry) {
            let Some((p, b)) = vals else { continue };
            let found = prove_in_frame(prog, c, p, b, checks)
                .or_else(|| guard_at_run_time(prog, c, p, checks));
            let Some((last, guard)) = found else {
                continue;
            };
            let sp = &prog.subprogs[prog.subprog_of(c.walk.head)];
            if live.as_ref().is_none_or(|(start, _)| *start != sp.start) {
                live = Some((sp.start, crate::analysis::live_in(prog, sp.start, sp.end)));
            }
            let (start, live) = live.as_ref().expect("computed above");
            let free = free_registers(prog, &c.walk, |i| live[i - start]);
            let mut free = (0..=5).filter(|&r| free & (1 << r) != 0);
            walks.push(Walk {
                last,
                guard,
                shadow: free.next(),
                limit: free.next(),
                ..c.walk
            });
        }
        walks
    }
}

/// The loads and stores through the walked pointer in the body: `(index, offset from the
/// pointer's value at the head, size)` (past the step, the step is part of the offset).
fn pointer_accesses<'a>(
    prog: &'a Program,
    c: &'a Candidate,
) -> impl Iterator<Item = (usize, i64, i64)> + 'a {
    let body = c.walk.head..c.walk.back_edge;
    body.clone()
        .zip(&prog.insts[body])
        .filter_map(move |(m, inst)| match inst.op {
            Op::Load {
                base, off, size, ..
            }
            | Op::Store {
                base, off, size, ..
            } if base == c.walk.ptr => {
                let moved = if m > c.walk.step_at { c.walk.step } else { 0 };
                Some((m, moved + off as i64, size.bytes() as i64))
            }
            _ => None,
        })
}

/// A walk through the frame, proven at compile time: marks the accesses
/// [`AccessCheck::Walked`] and returns `(last, None)`, or `None` when nothing is proven.
fn prove_in_frame(
    prog: &Program,
    c: &Candidate,
    p: Val,
    b: Val,
    checks: &mut [AccessCheck],
) -> Option<(i64, Option<Guard>)> {
    let exact = |v: Val| (v.base == Base::Stack && v.lo == v.hi).then_some(v.lo);
    let (a, b) = (exact(p)?, exact(b)?);
    let step = c.walk.step;
    // The pointer's values at the head, as a range stepped by `step`.
    // (Offsets are within a frame's reach of r10: no overflow in this arithmetic.)
    let last = match c.walk.cont {
        Cond::Ne if b > a && (b - a) % step == 0 => b - step,
        Cond::Ne => return None,
        // The largest a + c·t below (or at) b; just a when the first test fails.
        Cond::Lt if b > a => a + (b - 1 - a) / step * step,
        _ if b >= a => a + (b - a) / step * step,
        _ => a,
    };
    let mut proven = false;
    for (m, off, size) in pointer_accesses(prog, c) {
        if checks[m] == AccessCheck::None {
            continue;
        }
        if a + off >= -(STACK_SIZE as i64) && last + off + size <= 0 {
            checks[m] = AccessCheck::Walked;
            proven = true;
        }
    }
    proven.then_some((last, None))
}

/// A walk whose bounds are only known at run time (see the module docs): the accesses at
/// non-negative offsets from the head value become [`AccessCheck::Guarded`],
/// and the walk gets a [`Guard`] for the backend to test on entry. A power-of-two step keeps
/// the guard's arithmetic to shifts.
fn guard_at_run_time(
    prog: &Program,
    c: &Candidate,
    p: Val,
    checks: &mut [AccessCheck],
) -> Option<(i64, Option<Guard>)> {
    let step = c.walk.step;
    if !(step as u64).is_power_of_two() {
        return None;
    }
    // A pointer into the frame is tested against the current frame, any other against the
    // context (where a pointer of unknown origin is most likely to point).
    let (region, limit) = match p.base {
        Base::Stack => (GuardRegion::Frame, STACK_SIZE as i64),
        _ => (GuardRegion::Context, 2048),
    };
    // Ends below 2 KiB keep the guard's constants in every backend's short immediates (and
    // the shadow's offsets, step included, far inside an `i16`); in the frame, an end past
    // 512 could never pass.
    let guarded = |m: usize, off: i64, size: i64| {
        off >= 0
            && off + size <= limit
            && off + size < 2048
            && match region {
                GuardRegion::Frame => checks[m] == AccessCheck::Stack,
                GuardRegion::Context => {
                    matches!(checks[m], AccessCheck::Ctx | AccessCheck::Unknown)
                }
            }
    };
    let end = pointer_accesses(prog, c)
        .filter(|&(m, off, size)| guarded(m, off, size))
        .map(|(_, off, size)| off + size)
        .max()?;
    let members: Vec<usize> = pointer_accesses(prog, c)
        .filter(|&(m, off, size)| guarded(m, off, size))
        .map(|(m, _, _)| m)
        .collect();
    for m in members {
        checks[m] = AccessCheck::Guarded;
    }
    let bias = match c.walk.cont {
        Cond::Lt => 1,
        Cond::Ne => step as u64,
        _ => 0,
    };
    Some((
        0,
        Some(Guard {
            region,
            shift: step.trailing_zeros(),
            bias,
            end: end as u64,
        }),
    ))
}

/// The registers free for [`Walk::shadow`] and [`Walk::limit`] (bit n = rn): among r0–r5
/// (caller-saved on every backend, so writing one costs no save), those no instruction of
/// the loop mentions and that are dead where the loop can go next (`live_in(i)`): past the
/// back-edge and at every jump that leaves.
fn free_registers(prog: &Program, walk: &Walk, live_in: impl Fn(usize) -> u16) -> u16 {
    use crate::analysis::{regs_read, ARG_REGS};
    let mut taken = live_in(walk.back_edge + 1);
    for inst in &prog.insts[walk.head..=walk.back_edge] {
        taken |= regs_read(&inst.op, ARG_REGS) | inst.op.written_reg().map_or(0, |r| 1 << r);
        if let Op::Ja { target } | Op::Jcond { target, .. } = inst.op {
            let target = target as usize;
            if target != walk.head {
                taken |= live_in(target);
            }
        }
    }
    !taken & 0b11_1111
}

/// The rest of the module docs' conditions for the loop `head..=back_edge` (landings and
/// calls are checked by the caller): the pointer written once, by `ptr += c`, the bound
/// never.
fn candidate(
    prog: &Program,
    head: usize,
    back_edge: usize,
    ptr: Reg,
    bound: Reg,
    cont: Cond,
) -> Option<Candidate> {
    if ptr == bound || ptr == crate::R10 {
        return None;
    }
    let mut step = None;
    for (i, inst) in (head..back_edge).zip(&prog.insts[head..back_edge]) {
        let op = inst.op;
        match op.written_reg() {
            Some(w) if w == bound => return None,
            Some(w) if w == ptr => {
                let Op::Alu {
                    width: Width::W64,
                    op: AluOp::Add,
                    src: Operand::Imm(c),
                    ..
                } = op
                else {
                    return None;
                };
                if step.is_some() || !(1..=MAX_STEP).contains(&(c as i64)) {
                    return None;
                }
                step = Some((i, c as i64));
            }
            _ => {}
        }
    }
    let (step_at, step) = step?;
    Some(Candidate {
        walk: Walk {
            head,
            back_edge,
            ptr,
            bound,
            cont,
            last: 0,
            step_at,
            step,
            shadow: None,
            limit: None,
            guard: None,
            counter: None,
        },
    })
}

/// The counted walks of `prog` (see the module docs), added to `walks` (the other walks,
/// sorted by head) when disjoint from them, in head order. Their accesses through the
/// pointer that `checks` tests against the stack block become [`AccessCheck::Guarded`].
pub fn counted(prog: &Program, checks: &mut [AccessCheck], mut walks: Vec<Walk>) -> Vec<Walk> {
    let mut found = Vec::new();
    for b in &prog.branches {
        if b.compared != Compared::RegImm(Width::W64) || b.target >= b.at {
            continue;
        }
        let (head, back_edge) = (b.target as usize, b.at as usize);
        let Op::Jcond {
            cond: Cond::Ne,
            dst: ctr,
            src: Operand::Imm(0),
            ..
        } = prog.insts[back_edge].op
        else {
            continue;
        };
        let sp = &prog.subprogs[prog.subprog_of(back_edge)];
        let overlaps = |w: &Walk| w.head <= back_edge && head <= w.back_edge;
        if head <= sp.start || walks.iter().chain(&found).any(overlaps) {
            continue;
        }
        if let Some(w) = counted_walk(prog, head, back_edge, ctr, checks) {
            found.push(w);
        }
    }
    if !found.is_empty() {
        walks.extend(found);
        walks.sort_unstable_by_key(|w| w.head);
    }
    walks
}

/// The loop `head..=back_edge` with counter `ctr` as a counted walk, if it is one.
fn counted_walk(
    prog: &Program,
    head: usize,
    back_edge: usize,
    ctr: Reg,
    checks: &mut [AccessCheck],
) -> Option<Walk> {
    // Straight down each iteration: nothing lands inside the loop but on its head, only the
    // back-edge goes back to the head, jumps inside leave; no calls.
    if (head + 1..=back_edge).any(|i| prog.is_target[i]) || ctr == crate::R10 {
        return None;
    }
    let body = head..back_edge;
    let mut ctr_step = None;
    for (i, inst) in body.clone().zip(&prog.insts[body.clone()]) {
        match inst.op {
            Op::Ja { target } | Op::Jcond { target, .. }
                if (head..=back_edge).contains(&(target as usize)) =>
            {
                return None
            }
            Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. } => return None,
            Op::MovPerCpu { .. } => return None,
            _ => {}
        }
        if inst.op.written_reg() == Some(ctr) {
            let one_down = matches!(
                inst.op,
                Op::Alu {
                    width: Width::W64,
                    op: AluOp::Add,
                    src: Operand::Imm(-1),
                    ..
                }
            );
            if !one_down || ctr_step.is_some() {
                return None;
            }
            ctr_step = Some(i);
        }
    }
    ctr_step?;
    // The pointer: the base of an access the stack block test guards, written once in the
    // loop, by a power-of-two step down.
    let ptr = body
        .clone()
        .find_map(|m| match access_base(&prog.insts[m].op) {
            Some(base) if checks[m] == AccessCheck::Stack && base != ctr && base != crate::R10 => {
                Some(base)
            }
            _ => None,
        })?;
    let mut step = None;
    for (i, inst) in body.clone().zip(&prog.insts[body.clone()]) {
        if inst.op.written_reg() != Some(ptr) {
            continue;
        }
        let Op::Alu {
            width: Width::W64,
            op: AluOp::Add,
            src: Operand::Imm(c),
            ..
        } = inst.op
        else {
            return None;
        };
        let c = -(c as i64);
        if step.is_some() || !(1..=MAX_STEP).contains(&c) || !(c as u64).is_power_of_two() {
            return None;
        }
        step = Some((i, -c));
    }
    let (step_at, step) = step?;
    let mut walk = Walk {
        head,
        back_edge,
        ptr,
        bound: ctr,
        cont: Cond::Ne,
        last: 0,
        step_at,
        step,
        shadow: None,
        limit: None,
        guard: None,
        counter: None,
    };
    let c = Candidate { walk };
    let guarded = |m: usize, off: i64, size: i64| {
        checks[m] == AccessCheck::Stack && off >= -COUNTED_REACH && off + size <= COUNTED_REACH
    };
    let members: Vec<(usize, i64, i64)> = pointer_accesses(prog, &c)
        .filter(|&(m, off, size)| guarded(m, off, size))
        .collect();
    let lo = members.iter().map(|&(_, off, _)| off).min()?;
    let end = members.iter().map(|&(_, off, size)| off + size).max()?;
    // An extent wider than the frame could never pass the guard.
    if end - lo > STACK_SIZE as i64 {
        return None;
    }
    for &(m, _, _) in &members {
        checks[m] = AccessCheck::Guarded;
    }
    walk = c.walk;
    walk.guard = Some(Guard {
        region: GuardRegion::Frame,
        shift: (-step).trailing_zeros(),
        bias: 0,
        end: end as u64,
    });
    walk.counter = Some(Counter { reg: ctr, lo });
    Some(walk)
}

/// The base register of a load or store.
fn access_base(op: &Op) -> Option<Reg> {
    match *op {
        Op::Load { base, .. } | Op::Store { base, .. } => Some(base),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode_insn as ins;
    use crate::ranges::plan_accesses;

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    /// `r3 = r10 + start ; head: r4 = *(u64 *)(r3 + off) ; r0 += r4 ; r3 += step ;
    /// back-edge ; exit`, returning the plan.
    fn walk(start: i32, off: i16, step: i32, back_edge: [u8; 8]) -> crate::ranges::AccessPlan {
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, start),
            ins(0x79, 4, 3, off, 0), // 3: head
            ins(0x0f, 0, 4, 0, 0),
            ins(0x07, 3, 0, 0, step),
            back_edge, // 6
            EXIT,
        ]
        .concat();
        plan_accesses(&crate::decode(&code, &[]).unwrap(), true)
    }

    /// `if dst <cond> src goto head` at instruction 6 (head = 3).
    fn back(op: u8, dst: u8, src: u8) -> [u8; 8] {
        ins(op, dst, src, -4, 0)
    }

    const JNE: u8 = 0x5d;
    const JLT: u8 = 0xad;
    const JLE: u8 = 0xbd;
    const JGT: u8 = 0x2d;

    #[test]
    fn the_benchmarks_stack_walk_is_proven() {
        let a = walk(-512, 0, 8, back(JNE, 3, 10));
        assert_eq!(a.checks[3], AccessCheck::Walked);
        assert_eq!(
            a.walks,
            vec![Walk {
                head: 3,
                back_edge: 6,
                ptr: 3,
                bound: 10,
                cont: Cond::Ne,
                // r3 at the head: r10 - 512 .. r10 - 8.
                last: -8,
                step_at: 5,
                step: 8,
                // r0 is read after the loop, r3 and r4 are used in it: r1 is free.
                shadow: Some(1),
                limit: Some(2),
                guard: None,
                counter: None,
            }]
        );
        assert_eq!(a.walk_at_head(3), Some(0));
        assert_eq!(a.walk_of_back_edge(6), Some(0));
        assert_eq!((a.walk_at_head(6), a.walk_of_back_edge(3)), (None, None));
        // The other operand order, and `<` in both spellings.
        assert_eq!(
            walk(-512, 0, 8, back(JNE, 10, 3)).checks[3],
            AccessCheck::Walked
        );
        assert_eq!(
            walk(-512, 0, 8, back(JLT, 3, 10)).checks[3],
            AccessCheck::Walked
        );
        let gt = walk(-512, 0, 8, back(JGT, 10, 3));
        assert_eq!(gt.checks[3], AccessCheck::Walked);
        assert_eq!(gt.walks[0].cont, Cond::Lt);
    }

    /// `r6 = r10 - 256 ; r7 = 5 ; head: r9 = *(u32 *)(r6 - 4) ; r7 += ctr_step ;
    /// *(u32 *)(r6 + 0) = r9 ; r6 += ptr_step ; <extra> ; if r7 != 0 goto head ; exit`
    /// (an insertion sort's inner loop), returning the plan.
    fn counted(ctr_step: i32, ptr_step: i32, extra: &[[u8; 8]]) -> crate::ranges::AccessPlan {
        let mut code = vec![
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 6, 10, 0, 0),
            ins(0x07, 6, 0, 0, -256),
            ins(0xb7, 7, 0, 0, 5),
            ins(0x61, 9, 6, -4, 0), // 4: head
            ins(0x07, 7, 0, 0, ctr_step),
            ins(0x63, 6, 9, 0, 0),
            ins(0x07, 6, 0, 0, ptr_step),
        ];
        code.extend_from_slice(extra);
        let back = 4 - (code.len() as i16 + 1);
        code.push(ins(0x55, 7, 0, back, 0));
        code.push(EXIT);
        plan_accesses(&crate::decode(&code.concat(), &[]).unwrap(), true)
    }

    #[test]
    fn a_pointer_stepped_with_a_counter_is_a_counted_walk() {
        let a = counted(-1, -4, &[]);
        assert_eq!(
            (a.checks[4], a.checks[6]),
            (AccessCheck::Guarded, AccessCheck::Guarded)
        );
        let w = &a.walks[..];
        assert_eq!(w.len(), 1);
        assert_eq!(
            (w[0].head, w[0].back_edge, w[0].ptr, w[0].step),
            (4, 8, 6, -4)
        );
        // Accesses from r6 - 4 (the load) to r6 + 4 (the store, before the step).
        assert_eq!(w[0].counter, Some(Counter { reg: 7, lo: -4 }));
        assert_eq!(
            w[0].guard,
            Some(Guard {
                region: GuardRegion::Frame,
                shift: 2,
                bias: 0,
                end: 4,
            })
        );
        // Not for a backend without the guard: the accesses go back to their checks.
        let mut dropped = a.clone();
        dropped.drop_counted_walks();
        assert!(dropped.walks.is_empty());
        assert_eq!(
            (dropped.checks[4], dropped.checks[6]),
            (AccessCheck::Stack, AccessCheck::Stack)
        );
        // A counter stepped by 2 can pass 0; a step that is no power of two; the pointer
        // written twice; a jump landing inside the loop: all keep their checks.
        let unchanged = |a: crate::ranges::AccessPlan| {
            assert!(a.walks.is_empty(), "{:?}", a.walks);
            assert_eq!(a.checks[4], AccessCheck::Stack);
        };
        unchanged(counted(-2, -4, &[]));
        unchanged(counted(-1, -3, &[]));
        unchanged(counted(-1, -4, &[ins(0x07, 6, 0, 0, 0)]));
        unchanged(counted(-1, -4, &[ins(0x15, 9, 0, -3, 0)])); // if r9 == 0 goto 6
                                                               // The counter written elsewhere in the loop.
        unchanged(counted(-1, -4, &[ins(0xb7, 7, 0, 0, 3)]));
        // A jump from before the loop into its body (to the store).
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 6, 10, 0, 0),
            ins(0x07, 6, 0, 0, -256),
            ins(0xb7, 7, 0, 0, 5),
            ins(0x55, 1, 0, 2, 0),  // if r1 != 0 goto 7
            ins(0x61, 9, 6, -4, 0), // 5: head
            ins(0x07, 7, 0, 0, -1),
            ins(0x63, 6, 9, 0, 0),
            ins(0x07, 6, 0, 0, -4),
            ins(0x55, 7, 0, -5, 0),
            EXIT,
        ];
        let a = plan_accesses(&crate::decode(&code.concat(), &[]).unwrap(), true);
        assert!(a.walks.is_empty(), "{:?}", a.walks);
        assert_eq!(a.checks[7], AccessCheck::Stack);
    }

    #[test]
    fn the_shadow_is_a_register_dead_in_and_after_the_loop() {
        // `r3 = r10 - 512 ; head: r4 = *(r3 + 0) ; <body> ; r3 += 8 ; if r3 != r10 goto
        // head ; <tail> ; exit`: the shadow the walk picks.
        let shadow = |body: &[[u8; 8]], tail: &[[u8; 8]]| {
            let mut code = vec![
                ins(0xb7, 0, 0, 0, 0),
                ins(0xbf, 3, 10, 0, 0),
                ins(0x07, 3, 0, 0, -512),
                ins(0x79, 4, 3, 0, 0),
            ];
            code.extend_from_slice(body);
            code.push(ins(0x07, 3, 0, 0, 8));
            let back = -(code.len() as i16 + 1 - 3);
            code.push(ins(JNE, 3, 10, back, 0));
            code.extend_from_slice(tail);
            code.push(EXIT);
            let a = plan_accesses(&crate::decode(&code.concat(), &[]).unwrap(), true);
            assert_eq!(a.checks[3], AccessCheck::Walked);
            a.walks[0].shadow
        };
        assert_eq!(shadow(&[], &[]), Some(1));
        // r1 read after the loop: live at its exit.
        assert_eq!(shadow(&[], &[ins(0x0f, 0, 1, 0, 0)]), Some(2));
        // r1 read in the loop, r5 written in it.
        let body = [ins(0x0f, 0, 1, 0, 0), ins(0xb7, 5, 0, 0, 1)];
        assert_eq!(shadow(&body, &[]), Some(2));
        // r1 live only where a jump leaves the loop (to `r0 += r1 ; exit`), not past the
        // back-edge (`exit`).
        let body = [ins(0x15, 4, 0, 3, 0)];
        let tail = [EXIT, ins(0x0f, 0, 1, 0, 0)];
        assert_eq!(shadow(&body, &tail), Some(2));
        assert_eq!(shadow(&[ins(0x15, 4, 0, 2, 0)], &tail), Some(1));
        // Every caller-saved register busy: the clamp goes back in place.
        let body = [
            ins(0x0f, 0, 1, 0, 0),
            ins(0x0f, 0, 2, 0, 0),
            ins(0x0f, 0, 5, 0, 0),
        ];
        assert_eq!(shadow(&body, &[]), None);
    }

    /// `r3 = r1 + start ; r2 = r1 + r2 ; head: <body> ; r3 += step ; back-edge ; exit`.
    fn ctx_walk(start: i32, body: &[[u8; 8]], step: i32, op: u8) -> crate::ranges::AccessPlan {
        let mut code = vec![
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 3, 1, 0, 0),
            ins(0x07, 3, 0, 0, start),
            ins(0x0f, 2, 1, 0, 0),
        ];
        code.extend_from_slice(body);
        code.push(ins(0x07, 3, 0, 0, step));
        let back = -(code.len() as i16 + 1 - 4);
        code.push(ins(op, 3, 2, back, 0));
        code.push(EXIT);
        plan_accesses(&crate::decode(&code.concat(), &[]).unwrap(), true)
    }

    #[test]
    fn a_called_function_leaves_its_argument_registers_alone() {
        // main: call sub ; exit. sub: the benchmark's stack walk ; exit. The caller may read
        // r1–r5 after the call, so none of them is dead at the walk's exit: no shadow.
        let code = [
            ins(0x85, 0, 1, 0, 1), // call +1
            EXIT,
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x79, 4, 3, 0, 0), // 5: head
            ins(0x0f, 0, 4, 0, 0),
            ins(0x07, 3, 0, 0, 8),
            ins(JNE, 3, 10, -4, 0),
            EXIT,
        ]
        .concat();
        let a = plan_accesses(&crate::decode(&code, &[]).unwrap(), true);
        assert_eq!(a.checks[5], AccessCheck::Walked);
        assert_eq!((a.walks[0].shadow, a.walks[0].limit), (None, None));
    }

    #[test]
    fn context_walks_get_an_entry_guard() {
        // The bench's context hash: `r4 = *(u64 *)(r3 + 0) ; … ; r3 += 8 ; if r3 < r2`.
        let load = ins(0x79, 4, 3, 0, 0);
        let a = ctx_walk(0, &[load, ins(0xaf, 0, 4, 0, 0)], 8, JLT);
        assert_eq!(a.checks[4], AccessCheck::Guarded);
        let guard = a.walks[0].guard;
        assert_eq!(
            guard,
            Some(Guard {
                region: GuardRegion::Context,
                shift: 3,
                bias: 1,
                end: 8
            })
        );
        // `!=` subtracts a whole step; an access past the step counts it in its end.
        let after = ctx_walk(0, &[], 4, JNE);
        assert!(after.walks.is_empty(), "no access, no walk");
        let code_after = [ins(0x61, 4, 3, 0, 0)];
        let ne = ctx_walk(0, &code_after, 4, JNE);
        assert_eq!(ne.walks[0].guard.map(|g| (g.bias, g.end)), Some((4, 4)));
        // A step that is not a power of two, or an access below the head value: no guard
        // (the accesses keep their checks).
        let odd = ctx_walk(0, &[load], 24, JLT);
        assert_ne!(odd.checks[4], AccessCheck::Guarded);
        assert!(odd.walks.is_empty());
        let below = ctx_walk(8, &[ins(0x79, 4, 3, -8, 0)], 8, JLT);
        assert_ne!(below.checks[4], AccessCheck::Guarded);
        // The frame's walks are proven at compile time instead, never guarded.
        assert_eq!(walk(-512, 0, 8, back(JNE, 3, 10)).walks[0].guard, None);
    }

    #[test]
    fn frame_walks_up_to_a_run_time_length_are_guarded_in_the_frame() {
        // r3 = r10 - 512 ; r7 = r10 - (r2 & 0x1f8) ; head: r4 = *(u64 *)r3 ; r3 += 8 ;
        // if r3 < r7 goto head
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x57, 2, 0, 0, 0x1f8),
            ins(0xbf, 7, 10, 0, 0),
            ins(0x1f, 7, 2, 0, 0),
            ins(0x79, 4, 3, 0, 0), // 6: head
            ins(0x07, 3, 0, 0, 8),
            ins(JLT, 3, 7, -3, 0),
            EXIT,
        ]
        .concat();
        let a = plan_accesses(&crate::decode(&code, &[]).unwrap(), true);
        assert_eq!(a.checks[6], AccessCheck::Guarded);
        assert_eq!(
            a.walks[0].guard.map(|g| (g.region, g.end)),
            Some((GuardRegion::Frame, 8))
        );
    }

    #[test]
    fn a_walk_that_steps_over_its_bound_is_not_proven() {
        // 512 is not a multiple of 24: r3 never equals r10 and walks on past it.
        let a = walk(-512, 0, 24, back(JNE, 3, 10));
        assert_ne!(a.checks[3], AccessCheck::Walked);
        assert!(a.walks.is_empty());
        // With `<` it stops below r10 instead: r3 in {r10 - 512, r10 - 488, ..., r10 - 8},
        // so the 8-byte load ends at r10 at most.
        let lt = walk(-512, 0, 24, back(JLT, 3, 10));
        assert_eq!(lt.checks[3], AccessCheck::Walked);
        // The largest value below r10 on the way: -512 + 21 * 24.
        assert_eq!(lt.walks[0].last, -8);
    }

    #[test]
    fn accesses_reaching_past_the_frame_keep_their_check() {
        // r3 up to r10 - 8: a load at r3 + 8 ends at r10 + 8.
        assert_ne!(
            walk(-512, 8, 8, back(JNE, 3, 10)).checks[3],
            AccessCheck::Walked
        );
        // `<=` lets r3 reach r10 itself.
        assert_ne!(
            walk(-512, 0, 8, back(JLE, 3, 10)).checks[3],
            AccessCheck::Walked
        );
        // Starting below the frame.
        assert_ne!(
            walk(-520, 0, 8, back(JNE, 3, 10)).checks[3],
            AccessCheck::Walked
        );
        // A step the clamp's speculation argument does not cover.
        assert_ne!(
            walk(-512, 0, 128, back(JNE, 3, 10)).checks[3],
            AccessCheck::Walked
        );
    }

    #[test]
    fn loops_with_other_entries_calls_or_writes_are_not_walks() {
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        let plan = |body: &[[u8; 8]]| {
            let mut code = vec![
                ins(0xb7, 0, 0, 0, 0),
                ins(0xbf, 3, 10, 0, 0),
                ins(0x07, 3, 0, 0, -512),
                ins(0x79, 4, 3, 0, 0), // 3: head
            ];
            code.extend_from_slice(body);
            code.push(ins(0x07, 3, 0, 0, 8));
            let back = -(code.len() as i16 + 1 - 3);
            code.push(ins(JNE, 3, 10, back, 0));
            code.push(EXIT);
            plan_accesses(&crate::decode(&code.concat(), &helpers).unwrap(), true)
        };
        assert_eq!(plan(&[]).checks[3], AccessCheck::Walked);
        // A call (which might clobber the pointer's registers' neighbours) ends it.
        assert_ne!(
            plan(&[ins(0x85, 0, 0, 0, 1)]).checks[3],
            AccessCheck::Walked
        );
        // A second write of the pointer.
        assert_ne!(
            plan(&[ins(0x07, 3, 0, 0, 8)]).checks[3],
            AccessCheck::Walked
        );
        assert_ne!(
            plan(&[ins(0xbf, 3, 4, 0, 0)]).checks[3],
            AccessCheck::Walked
        );
        // A jump inside the loop that stays inside it (a skipped step).
        assert_ne!(
            plan(&[ins(0x05, 0, 0, 0, 0)]).checks[3],
            AccessCheck::Walked
        );
        // A jump that leaves the loop is fine.
        assert_eq!(
            plan(&[ins(0x15, 4, 0, 2, 0)]).checks[3],
            AccessCheck::Walked
        );
    }

    #[test]
    fn a_jump_into_the_loop_from_outside_defeats_the_walk() {
        // 1: if r2 == 0 goto 4 (into the loop head, with r3 = garbage)
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0x15, 2, 0, 2, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x79, 4, 3, 0, 0), // 4: head
            ins(0x07, 3, 0, 0, 8),
            ins(JNE, 3, 10, -3, 0),
            EXIT,
        ]
        .concat();
        let a = plan_accesses(&crate::decode(&code, &[]).unwrap(), true);
        assert_ne!(a.checks[4], AccessCheck::Walked);
    }

    #[test]
    fn an_inexact_entry_value_is_not_a_walk() {
        // r3 = r10 - 512 + (r2 & 8): two possible starts.
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0x57, 2, 0, 0, 8),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x0f, 3, 2, 0, 0),
            ins(0x79, 4, 3, 0, 0), // 5: head
            ins(0x07, 3, 0, 0, 16),
            ins(JLT, 3, 10, -3, 0),
            EXIT,
        ]
        .concat();
        let a = plan_accesses(&crate::decode(&code, &[]).unwrap(), true);
        assert_ne!(a.checks[5], AccessCheck::Walked);
    }
}
