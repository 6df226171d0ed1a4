//! Compaction: moving live programs so that each pack's free space stays in one run.
//!
//! Placement alone cannot keep free space together under churn: a program freed in the middle
//! of a pack leaves a hole only a new program of at most its size can fill. Compiled images are
//! position-independent (every backend emits its bytes before the arena picks an address:
//! internal branches are pc-relative, helpers, regions and tables are absolute addresses
//! materialised in registers), so a program can run from a copy anywhere in the arena.
//!
//! A move happens inside a commit, under the arena lock: the program's bytes are copied into a
//! hole (through the RW view), the commit's one cache-maintenance pass covers the copy
//! together with whatever else the batch wrote, then the program's entry switches to the copy
//! (a release store; callers load it with acquire after pinning the epoch), and the old copy
//! is freed like any program: after the epoch grace period, so a thread already running it
//! finishes there. Chunks whose grace period ends are released by the arena's next call (a
//! load's alloc or commit, a free, `reclaim`), never inside whichever thread's pin ended it,
//! and what retires code (a free, a hook swap) takes the step for what it released at once:
//! near a full arena one freed program's hole can be a fifth of all free space, and loads
//! leave the step to them (it cost loads 1% in the `churn` example). Which
//! programs move: the ones bordering their pack's largest free run
//! (so the space they leave joins it), each into the smallest hole elsewhere that fits it.
//! A border program too large for every hole, with free space on its far side, instead goes
//! to the far end of its own run (or to another pack's largest run, if that run has twice the
//! program to spare or the arena's longest run shrinks by no more than the split space
//! falls): that far-side space then joins the run, and the next program in line may fit a
//! hole. Of several such programs, the one with the most free space beyond it goes first.
//! Each of these moves lowers the split space, so they cannot cycle. When a border program
//! has no free space beyond it, the programs of the cheapest stretch that would be a free run
//! large enough for it without them move elsewhere, together ("making room"): into holes,
//! or failing those into another pack's largest run. Moves that gain nothing until their old
//! copies are released, so the search runs at most once per release, and only while
//! fragmentation is at least twice the threshold. Near a full arena the holes are many and
//! small and lie among small programs, so this is what keeps the split share down (the
//! `churn` benchmark). Every destination, like placement, avoids leaving a remainder smaller
//! than every allocation so far (a hole no program could fill). When no move gains at once,
//! a program filling the gap between two holes moves into a third ("coalescing", at most
//! once per release, the narrowest gap first): the two holes become one, which takes
//! programs none of them could, whether new loads or the border programs that were blocked.

use super::{leaves_unusable, mark_dirty, Alloc, Inner, Pack, State, CHUNK};
use packjit_plugin_api::Region;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// When and how much code the arena moves (see the module docs of `arena`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// Move code while fragmentation (`ArenaStats::fragmentation_permille`) is above this.
    pub threshold_permille: u32,
    /// At most this many bytes of code are copied per step: a free or hook swap that finds
    /// chunks released since the last step takes one, and so does a hook batch's commit; a
    /// load's commit only goes on with a step cut short by this budget. So no call pays for
    /// more than a bounded copy (the first move of a step may exceed it by one program).
    /// 0 = commits, frees and swaps move nothing; only [`PackedArena::compact`] calls do
    /// (maintenance the host schedules off its load path).
    ///
    /// [`PackedArena::compact`]: super::PackedArena::compact
    pub step_bytes: usize,
}

impl Default for Compaction {
    fn default() -> Self {
        Self {
            threshold_permille: 50,
            step_bytes: 32 << 10,
        }
    }
}

/// Told when a program's code moves (the runtime keeps its symbol index current with it).
/// One listener serves many programs; each call names the program by the key its
/// [`MoveWatch`] was given.
pub trait MoveListener: Send + Sync {
    /// The code of program `key` whose entry was at `old` now also runs at `new` (called
    /// under the arena lock, after the copy is committed and just before callers switch to
    /// it).
    fn moved(&self, key: u64, old: u64, new: u64);
    /// The old copy of program `key` at `old` is about to be released (its grace period is
    /// over).
    fn released(&self, key: u64, old: u64);
}

/// Who hears about one program's moves: a shared listener and the key naming the program to
/// it (a shared listener costs no allocation per program, which a batch release would then
/// have to free).
pub struct MoveWatch {
    /// Told of every move.
    pub listener: Arc<dyn MoveListener>,
    /// Passed back with each call.
    pub key: u64,
}

/// Where a relocatable program's code is now. Shared by the program and the arena (which
/// moves it); the position changes only under the arena lock.
pub struct Movable {
    /// Start of the current region (executable address).
    exec: AtomicU64,
    /// Pack id of the current region.
    cookie: AtomicU64,
    size: u64,
    /// Entry point offset from the region start.
    entry_off: u64,
    /// `exec + entry_off`, kept beside them so that a run reads its entry in one load
    /// (issue 43: every run reads it before its entry).
    entry: AtomicU64,
    pinned: AtomicBool,
    watch: Option<MoveWatch>,
    /// Words outside that hold an address in the code (prog-array slots' tail entries,
    /// `PjTailTarget::tail_entry`), with its offset from the region start: rewritten by
    /// each move, so their readers jump in one load. Locked after the arena lock.
    tail_entries: Mutex<Vec<(usize, u64)>>,
}

impl std::fmt::Debug for Movable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Movable")
            .field("entry", &format_args!("{:#x}", self.entry()))
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

impl Movable {
    pub(super) fn new(region: &Region, entry: u64, watch: Option<MoveWatch>) -> Self {
        Self {
            exec: AtomicU64::new(region.exec_addr),
            cookie: AtomicU64::new(region.cookie),
            size: region.size,
            entry_off: entry - region.exec_addr,
            entry: AtomicU64::new(entry),
            pinned: AtomicBool::new(false),
            watch,
            tail_entries: Mutex::new(Vec::new()),
        }
    }

    /// Sets `word` to the address `offset` bytes into the code now and keeps it there as the
    /// code moves, until [`untrack_tail_entry`](Self::untrack_tail_entry). The same lock
    /// serializes this with a move's rewrite, so no move is missed.
    ///
    /// # Safety
    /// `word` stays valid until it is untracked.
    pub unsafe fn track_tail_entry(&self, word: *const AtomicU64, offset: u64) {
        let mut t = self.tail_entries.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: valid (the caller's promise).
        unsafe { &*word }.store(
            self.exec.load(Ordering::Acquire) + offset,
            Ordering::Release,
        );
        t.push((word as usize, offset));
    }

    /// Stops moving `word` with the code.
    pub fn untrack_tail_entry(&self, word: *const AtomicU64) {
        let mut t = self.tail_entries.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|&(w, _)| w != word as usize);
    }

    /// The word holding the code's base now and the entry's offset from it, for code that
    /// reads the entry itself (an inlined tail call, `PjTailTarget`): it must load the word
    /// under the same pin [`entry`](Self::entry) asks for.
    pub fn entry_parts(&self) -> (*const AtomicU64, u64) {
        (&self.exec, self.entry_off)
    }

    /// The entry point now. A caller that runs it must have pinned the epoch or taken a run
    /// pin ([`run_pin`](crate::run_pin)) BEFORE this load: then a move after the load frees
    /// the old copy only once the caller unpins (the arena waits for both).
    pub fn entry(&self) -> u64 {
        // Acquire pairs with the release store in `publish`: the copy's bytes and its cache
        // maintenance happen before any thread can see the new address.
        self.entry.load(Ordering::Acquire)
    }

    /// The region the code occupies now (stable while the arena lock is held or the program
    /// is pinned).
    pub fn region(&self) -> Region {
        Region {
            exec_addr: self.exec.load(Ordering::Acquire),
            size: self.size,
            cookie: self.cookie.load(Ordering::Acquire),
        }
    }

    /// Whether the code is pinned (never moved again).
    pub fn is_pinned(&self) -> bool {
        self.pinned.load(Ordering::Relaxed)
    }

    pub(super) fn set_pinned(&self) {
        self.pinned.store(true, Ordering::Relaxed);
    }
}

/// One relocation done in a commit, published once the commit's maintenance is done.
pub(super) struct Move {
    pub movable: Arc<Movable>,
    pub old: Region,
    pub new: Region,
}

impl Move {
    /// Switches callers to the copy (under the arena lock, after the cache maintenance).
    pub fn publish(&self) {
        let m = &self.movable;
        if let Some(w) = &m.watch {
            w.listener.moved(
                w.key,
                self.old.exec_addr + m.entry_off,
                self.new.exec_addr + m.entry_off,
            );
        }
        m.cookie.store(self.new.cookie, Ordering::Release);
        let t = m.tail_entries.lock().unwrap_or_else(|e| e.into_inner());
        m.exec.store(self.new.exec_addr, Ordering::Release);
        m.entry
            .store(self.new.exec_addr + m.entry_off, Ordering::Release);
        for &(word, offset) in t.iter() {
            // SAFETY: tracked words stay valid until untracked, which takes this lock. The
            // release store orders the copy's bytes before the new address, as for `exec`.
            unsafe { &*(word as *const AtomicU64) }
                .store(self.new.exec_addr + offset, Ordering::Release);
        }
    }

    /// Tells the listener the old copy goes (run just before its chunks are released).
    pub fn released(movable: &Movable, old: &Region) {
        if let Some(w) = &movable.watch {
            w.listener
                .released(w.key, old.exec_addr + movable.entry_off);
        }
    }
}

/// `sum over packs (free - largest run) / sum free`, per mille (as `ArenaStats`).
pub(super) fn fragmentation_permille(packs: &[Pack]) -> u32 {
    let (mut free, mut split) = (0usize, 0usize);
    for p in packs {
        let (f, best) = p.free_runs();
        free += f;
        split += f - best;
    }
    (split * 1000).checked_div(free).unwrap_or(0) as u32
}

/// How far past old copies and freed programs waiting for their grace period a boundary
/// search walks (they will join the free run once released).
const WALK: usize = 8;

/// The first movable allocation below (`up == false`) or above the free run
/// `[start, start + len)`, stepping over adjacent allocations that are on their way out.
fn boundary(p: &Pack, start: usize, len: usize, up: bool) -> Option<usize> {
    let mut at = if up { start + len } else { start };
    for _ in 0..WALK {
        let (c, a) = if up {
            p.alloc_from(at)?
        } else {
            p.alloc_below(at)?
        };
        // Only allocations touching the run (or a leaving one that touches it) count: past a
        // free run the walk would pick a program whose best hole could be that very run,
        // which joins the largest run anyway once the leaving copy is released.
        let touching = if up { c == at } else { c + a.chunks == at };
        if !touching {
            return None;
        }
        if a.movable.is_some() {
            return Some(c);
        }
        if !a.leaving {
            return None;
        }
        at = if up { c + a.chunks } else { c };
    }
    None
}

/// The smallest free run of at least `n` chunks that is not its pack's largest run, of those
/// that leave no remainder under `usable` chunks if there are any: (pack index, first chunk).
fn best_hole(packs: &[Pack], n: usize, usable: usize) -> Option<At> {
    best_hole_except(packs, n, usable, &[])
}

/// [`best_hole`], leaving out the runs at `except` (pack index, first chunk).
fn best_hole_except(packs: &[Pack], n: usize, usable: usize, except: &[At]) -> Option<At> {
    packs
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.sealed)
        .filter_map(|(i, p)| {
            let largest = p.free_by_len.last().copied();
            let mut fits = p
                .free_by_len
                .range((n, 0)..)
                .filter(|&&r| Some(r) != largest && !except.contains(&(i, r.1)));
            let &first = fits.next()?;
            let (len, c) = if leaves_unusable(first.0, n, usable) {
                fits.find(|r| !leaves_unusable(r.0, n, usable))
                    .copied()
                    .unwrap_or(first)
            } else {
                first
            };
            let unusable = leaves_unusable(len, n, usable);
            Some(((unusable, len, p.chunks() - p.used_chunks), (i, c)))
        })
        .min_by_key(|&(key, _)| key)
        .map(|(_, at)| at)
}

/// Moves that make a hole for a border program of `n` chunks that fits none: the programs in
/// the cheapest stretch that would be one free run of at least `n` chunks without them, each
/// to where [`evacuate`]'s dry run puts it (a hole outside the stretch, or another pack's
/// largest run). They gain nothing themselves; once their old copies are
/// released, the border program (or a new load) fits the stretch and the split space falls by
/// its size. A stretch may cost at most `n` chunks (the eventual gain) and `left` bytes. Only
/// the pack with the most split space is searched: its holes lie closest together, and the
/// search runs inside loads. An empty plan: no stretch qualifies, or one is free already
/// once old copies are released (a room made earlier, not yet taken).
fn make_room(
    packs: &[Pack],
    n: usize,
    left: usize,
    usable: usize,
    segs: &mut Vec<Segment>,
) -> Vec<(At, At)> {
    if n == 0 {
        return Vec::new();
    }
    let Some((qi, q)) = packs
        .iter()
        .enumerate()
        .filter(|(_, q)| !q.sealed)
        .max_by_key(|(_, q)| {
            let (free, best) = q.free_runs();
            free - best
        })
    else {
        return Vec::new();
    };
    // A program larger than every hole cannot leave a stretch, so it bounds one.
    let widest_hole = packs
        .iter()
        .filter(|p| !p.sealed)
        .filter_map(|p| p.free_by_len.iter().rev().nth(1).map(|r| r.0))
        .max()
        .unwrap_or(0);
    segments(q, widest_hole, segs);
    let budget = n.min(left / CHUNK);
    // A stretch whose programs do not all fit the holes outside it is tried again without
    // programs as large as the one that did not fit (a few times: this runs inside loads).
    let mut largest_movable = widest_hole;
    for _ in 0..ROOM_TRIES {
        let Some((lo, hi)) = cheapest_stretch(segs, n, budget, largest_movable) else {
            return Vec::new();
        };
        match evacuate(packs, qi, lo, hi, usable) {
            Ok(plan) => return plan,
            Err(unplaced) => largest_movable = unplaced - 1,
        }
    }
    Vec::new()
}

/// How many stretches [`make_room`] tries.
const ROOM_TRIES: usize = 3;

/// The first and end chunk of the cheapest run of `segs` that spans at least `n` chunks and
/// copies at most `budget`, holding no program over `largest_movable` chunks. `None` also when
/// the cheapest copies nothing: that room is on its way (free once old copies are released).
fn cheapest_stretch(
    segs: &[Segment],
    n: usize,
    budget: usize,
    largest_movable: usize,
) -> Option<(usize, usize)> {
    let cost = |s: &Segment| s.cost.filter(|&c| c <= largest_movable);
    // (chunks to copy, first chunk, end chunk) of the cheapest so far.
    let mut best: Option<(usize, usize, usize)> = None;
    // A window [i, j) over segments that may be part of a stretch: its chunks, its copy.
    let (mut j, mut len, mut copy) = (0, 0, 0);
    for i in 0..segs.len() {
        let Some(first_copy) = cost(&segs[i]) else {
            (j, len, copy) = (i + 1, 0, 0);
            continue;
        };
        while len < n && j < segs.len() {
            let Some(c) = cost(&segs[j]) else { break };
            len += segs[j].chunks;
            copy += c;
            j += 1;
        }
        if len >= n && copy <= budget && best.is_none_or(|b| copy < b.0) {
            best = Some((copy, segs[i].start, segs[j - 1].start + segs[j - 1].chunks));
        }
        // Here j > i: segment i qualifies, and the window was shorter than `n` before it.
        len -= segs[i].chunks;
        copy -= first_copy;
    }
    best.filter(|b| b.0 > 0).map(|(_, lo, hi)| (lo, hi))
}

/// Where each program in chunks `[lo, hi)` of pack `qi` goes: largest first, each into the
/// smallest hole outside the stretch that fits it (a dry run: nothing moves). Failing every
/// hole, the start of another pack's largest run, as far as it stays that pack's largest:
/// such a move adds to the split space until the stretch is filled, but then the stretch's
/// filling still gains its size less what went there. `Err` with the size of the first
/// program nothing takes.
fn evacuate(
    packs: &[Pack],
    qi: usize,
    lo: usize,
    hi: usize,
    usable: usize,
) -> Result<Vec<(At, At)>, usize> {
    // Where programs may go, smallest first: (usable length, pack, first chunk).
    let mut holes: Vec<(usize, usize, usize)> = Vec::new();
    for (pi, p) in packs.iter().enumerate().filter(|(_, p)| !p.sealed) {
        let mut runs = p.free_by_len.iter().rev();
        let Some(&(largest, at)) = runs.next() else {
            continue;
        };
        let mut others = runs.peekable();
        let second = others.peek().map_or(0, |r| r.0);
        if pi != qi && largest > second {
            holes.push((largest - second, pi, at));
        }
        holes.extend(
            others
                .filter(|&&(_, c)| !(pi == qi && (lo..hi).contains(&c)))
                .map(|&(len, c)| (len, pi, c)),
        );
    }
    holes.sort_unstable();
    let q = &packs[qi];
    let mut programs: Vec<(usize, usize)> = q
        .alloc_starts(lo, hi)
        .map(|c| (c, &q.allocs[&c]))
        .filter(|(_, a)| !a.leaving)
        .map(|(c, a)| (a.chunks, c))
        .collect();
    programs.sort_unstable_by(|a, b| b.cmp(a));
    let mut plan = Vec::with_capacity(programs.len());
    for (size, c) in programs {
        let first = holes.partition_point(|h| h.0 < size);
        if first == holes.len() {
            return Err(size);
        }
        let k = (first..holes.len())
            .find(|&k| !leaves_unusable(holes[k].0, size, usable))
            .unwrap_or(first);
        let (len, pi, at) = holes.remove(k);
        plan.push(((qi, c), (pi, at)));
        if len > size {
            let rest = (len - size, pi, at + size);
            let k = holes.partition_point(|h| *h < rest);
            holes.insert(k, rest);
        }
    }
    Ok(plan)
}

/// A stretch of a pack in address order, for [`make_room`].
#[derive(Clone, Copy)]
pub(super) struct Segment {
    start: usize,
    chunks: usize,
    /// Chunks copied to move it away: none for free runs and old copies (they are free or
    /// will be), its size for a movable program; `None` for what cannot be part of a stretch
    /// (the pack's largest run, where a border program goes anyway; programs that are pinned
    /// or larger than every hole).
    cost: Option<usize>,
}

/// Pack `q` as segments, into `segs` (a buffer kept across searches).
fn segments(q: &Pack, widest_hole: usize, segs: &mut Vec<Segment>) {
    let largest = q.free_by_len.last().map(|&(_, c)| c);
    let free = |(&start, &chunks): (&usize, &usize)| Segment {
        start,
        chunks,
        cost: (Some(start) != largest).then_some(0),
    };
    segs.clear();
    let mut runs = q.free_by_start.iter().peekable();
    for start in q.alloc_starts(0, q.chunks()) {
        let a = &q.allocs[&start];
        while let Some(run) = runs.next_if(|(&r, _)| r < start) {
            segs.push(free(run));
        }
        let cost = if a.leaving {
            Some(0)
        } else if a.movable.is_some() && a.chunks <= widest_hole {
            Some(a.chunks)
        } else {
            None
        };
        segs.push(Segment {
            start,
            chunks: a.chunks,
            cost,
        });
    }
    segs.extend(runs.map(free));
}

/// A move that merges two holes: the program filling a gap between two free runs (neither
/// its pack's largest) into the smallest other hole that fits it. Like [`make_room`] it gains
/// nothing at once; once its old copy is released the two runs and its chunks are one, and
/// the destination hole shrinks or vanishes, so the arena has at least one free run fewer
/// (moves of this kind cannot cycle). The narrowest such gap goes first: the cheapest copy.
fn coalesce(packs: &[Pack], left: usize, usable: usize) -> Option<(At, At)> {
    // (gap chunks, pack, gap start, hole below, hole above), the narrowest so far. A gap is
    // what lies between two consecutive free runs.
    let mut best: Option<(usize, usize, usize, usize, usize)> = None;
    for (qi, q) in packs.iter().enumerate().filter(|(_, q)| !q.sealed) {
        let largest = q.free_by_len.last().map(|&(_, c)| c);
        let mut runs = q.free_by_start.iter().peekable();
        while let Some((&below, &below_len)) = runs.next() {
            let Some((&above, _)) = runs.peek() else {
                break;
            };
            let c = below + below_len;
            let gap = above - c;
            // Next to the largest run the program is a border program, which `pick` handles.
            if best.is_some_and(|b| b.0 <= gap)
                || gap * CHUNK > left
                || largest == Some(below)
                || largest == Some(above)
                || !q.one_allocation(c, above)
            {
                continue;
            }
            best = Some((gap, qi, c, below, above));
        }
    }
    let (gap, qi, c, below, above) = best?;
    let a = packs[qi].allocs.get(&c);
    debug_assert_eq!(
        a.map(|a| a.chunks),
        Some(gap),
        "start bits agree with allocs"
    );
    a?.movable.as_ref()?;
    let dst = best_hole_except(packs, gap, usable, &[(qi, below), (qi, above)])?;
    Some(((qi, c), dst))
}

/// [`make_room`] runs only above this many times the compaction threshold.
const ROOM_GATE: u32 = 2;

/// One compaction step under the lock: moves programs (copy + dirty marking) while
/// fragmentation is above the threshold and `budget` bytes last. The caller commits, then
/// publishes each move and frees the old copies after their grace period.
pub(super) fn step(inner: &Inner, st: &mut State, budget: Option<usize>) -> Vec<Move> {
    let Some(cfg) = st.compaction else {
        return Vec::new();
    };
    // A search that found nothing stays fruitless until chunks are released: a release makes
    // or widens a hole, or takes away an old copy blocking a boundary. (Placements only fill
    // holes, and a program placed at a run's edge fitted no hole when it was placed.)
    if st.fruitless == Some(st.releases) && budget.is_none() {
        return Vec::new();
    }
    let mut left = budget.unwrap_or(cfg.step_bytes);
    let mut moves = Vec::new();
    // Maintenance mode (`step_bytes` 0): a commit has nothing to spend, nor leaves anything due.
    st.step_due = false;
    if left == 0 {
        return moves;
    }
    loop {
        let frag = fragmentation_permille(&st.packs);
        if frag <= cfg.threshold_permille {
            break;
        }
        if left == 0 {
            // Cut short: the next commit goes on without waiting for a release.
            st.step_due = true;
            break;
        }
        // The first move of a step may exceed the budget (a program larger than the step
        // would otherwise never move); later ones must fit what is left.
        let room = if moves.is_empty() { usize::MAX } else { left };
        let found = match pick(&st.packs, room, st.smallest_alloc) {
            Choice::Move(src, dst) => Some((src, dst)),
            // Nothing gains at once. Moves that gain only once their old copy is released are
            // worth their copy only when the split space is well above the threshold, and
            // searched for at most once per release (what completes them).
            _ if frag <= ROOM_GATE * cfg.threshold_permille => None,
            Choice::Blocked { smallest } => {
                let plan = make_room_once(st, smallest, room);
                if !plan.is_empty() {
                    for (src, dst) in plan {
                        moves.push(relocate(inner, st, src, dst));
                    }
                    // The room exists only once the old copies are released.
                    break;
                }
                coalesce_once(st, room)
            }
            Choice::Nothing => coalesce_once(st, room),
        };
        let Some((src, dst)) = found else {
            if moves.is_empty() {
                // Nothing movable at all (not merely nothing within what is left).
                st.fruitless = Some(st.releases);
            }
            break;
        };
        let n = st.packs[src.0].allocs[&src.1].chunks;
        moves.push(relocate(inner, st, src, dst));
        left = left.saturating_sub(n * CHUNK);
    }
    moves
}

/// [`make_room`] for a blocked border program of `n` chunks, unless it ran since the last
/// release.
fn make_room_once(st: &mut State, n: usize, left: usize) -> Vec<(At, At)> {
    if st.releases == st.room_searched_at {
        return Vec::new();
    }
    st.room_searched_at = st.releases;
    make_room(&st.packs, n, left, st.smallest_alloc, &mut st.segments)
}

/// [`coalesce`], unless it ran since the last release: bigger holes take bigger programs,
/// from new loads or from the largest runs' borders, so split space drains faster.
fn coalesce_once(st: &mut State, left: usize) -> Option<(At, At)> {
    if st.releases == st.coalesced_at {
        return None;
    }
    st.coalesced_at = st.releases;
    coalesce(&st.packs, left, st.smallest_alloc)
}

/// A place in the arena: (pack index, first chunk).
type At = (usize, usize);

/// What [`pick`] found.
enum Choice {
    /// Move the program at the first place to the second.
    Move(At, At),
    /// Programs border the largest runs but fit no hole; the smallest has this many chunks.
    Blocked {
        smallest: usize,
    },
    Nothing,
}

/// Chooses a move that gains at once: a border program into a hole, or past its run.
fn pick(packs: &[Pack], left: usize, usable: usize) -> Choice {
    // Packs with the most split space first: that is where a move gains most. (A handful of
    // packs: repeated maximum, no allocation.)
    let split = |i: usize| {
        let (f, best) = packs[i].free_runs();
        f - best
    };
    let count = packs.len().min(64);
    // One bit per pack.
    let mut tried = 0u64;
    // Of the border programs that fit no hole but have free space on their far side, the one
    // whose move past its run merges the most: (far side chunks, from, to).
    let mut past_run: Option<(usize, At, At)> = None;
    let mut smallest_blocked = None;
    for _ in 0..count {
        let Some((_, pi)) = (0..count)
            .filter(|&i| tried & (1 << i) == 0 && !packs[i].sealed)
            .map(|i| (split(i), i))
            .filter(|&(s, _)| s > 0)
            .max()
        else {
            break;
        };
        tried |= 1 << pi;
        let p = &packs[pi];
        let Some(&(len, start)) = p.free_by_len.last() else {
            continue;
        };
        for up in [false, true] {
            let Some(c) = boundary(p, start, len, up) else {
                continue;
            };
            let n = p.allocs[&c].chunks;
            if n * CHUNK > left {
                continue;
            }
            // Into a hole first: such a move shrinks a hole and grows the largest run by the
            // same amount (once the old copy is released).
            if let Some(dst) = best_hole(packs, n, usable) {
                return Choice::Move((pi, c), dst);
            }
            smallest_blocked = Some(smallest_blocked.map_or(n, |b: usize| b.min(n)));
            // Free space on the program's far side joins the run once it leaves.
            let far = far_side_free(p, c, n, up);
            if far > past_run.map_or(0, |m| m.0) {
                if let Some(dst) = largest_run_move(packs, pi, n, up, far) {
                    past_run = Some((far, (pi, c), dst));
                }
            }
        }
    }
    if let Some((_, src, dst)) = past_run {
        return Choice::Move(src, dst);
    }
    match smallest_blocked {
        Some(smallest) => Choice::Blocked { smallest },
        None => Choice::Nothing,
    }
}

/// The free chunks right beyond the program at chunk `c` (`n` chunks) on the side away from
/// its pack's largest run (above it when `up`): what joins that run once the program leaves.
fn far_side_free(p: &Pack, c: usize, n: usize, up: bool) -> usize {
    if up {
        p.free_by_start.get(&(c + n)).copied().unwrap_or(0)
    } else {
        match p.free_by_start.range(..c).next_back() {
            Some((&s, &len)) if s + len == c => len,
            _ => 0,
        }
    }
}

/// Where a program of `n` chunks bordering pack `pi`'s largest run (above it when `up`) can go
/// so that the `far` free chunks on its far side merge with that run: the far end of the run
/// itself, or else the start of another pack's largest run with room to spare. Neither
/// shrinks a hole, but once the old copy is released the split space is `far` chunks lower,
/// and the next program in line is uncovered, which may fit a hole. Each such move lowers
/// the split space, so they cannot cycle.
fn largest_run_move(packs: &[Pack], pi: usize, n: usize, up: bool, far: usize) -> Option<At> {
    let &(len, start) = packs[pi].free_by_len.last()?;
    if len > n {
        // The far end, so that the run, the program's old chunks and its far side become one.
        return Some((pi, if up { start } else { start + len - n }));
    }
    // Another pack's run must stay its pack's largest (else that pack's split space grows),
    // with twice the program to spare; or, failing that, the arena's longest run may shrink
    // by no more than the split space falls: the run the program leaves, once merged, is at
    // least the destination's length less `far`. (Near a full arena the runs are short and
    // alike, and only the second holds; it still keeps a large program from moving far for
    // a small gain.)
    let merged = len + n + far;
    packs
        .iter()
        .enumerate()
        .filter(|&(q, p)| q != pi && !p.sealed)
        .filter_map(|(q, p)| {
            let mut runs = p.free_by_len.iter().rev();
            let &(l, s) = runs.next()?;
            let second = runs.next().map_or(0, |r| r.0);
            let spare = l >= len + 2 * n || (l >= n && merged + far >= l);
            (spare && l - n >= second).then_some((l, q, s))
        })
        .max()
        .map(|(_, q, s)| (q, s))
}

/// Copies the program at `src` to the free chunks at `dst` and marks the copy dirty.
fn relocate(inner: &Inner, st: &mut State, src: (usize, usize), dst: (usize, usize)) -> Move {
    let (n, code, movable) = {
        let a: &mut Alloc = st.packs[src.0].allocs.get_mut(&src.1).expect("a program");
        a.leaving = true;
        (a.chunks, a.code, a.movable.take().expect("movable"))
    };
    let new = inner.place(st, dst.0, dst.1, n);
    {
        let a = st.packs[dst.0].allocs.get_mut(&dst.1).expect("placed");
        a.code = code;
        a.movable = Some(movable.clone());
    }
    let (sp, dp) = (&st.packs[src.0], &st.packs[dst.0]);
    // SAFETY: both ranges lie inside RW views of live packs; the destination was free and the
    // source is allocated, so they do not overlap. `code` ≤ the region size.
    unsafe {
        std::ptr::copy_nonoverlapping(sp.rw.add(src.1 * CHUNK), dp.rw.add(dst.1 * CHUNK), code)
    };
    let old = Region {
        exec_addr: sp.rx as u64 + (src.1 * CHUNK) as u64,
        size: (n * CHUNK) as u64,
        cookie: sp.id,
    };
    let start = new.exec_addr as usize;
    mark_dirty(&mut st.dirty, start, start + code.div_ceil(CHUNK) * CHUNK);
    inner.moves.fetch_add(1, Ordering::Relaxed);
    inner.bytes_moved.fetch_add(code as u64, Ordering::Relaxed);
    Move { movable, old, new }
}
