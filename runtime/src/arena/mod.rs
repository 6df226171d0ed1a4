//! The packed code arena: every backend's code lives here.
//!
//! Userspace twin of the kernel's `bpf_prog_pack`: large aligned packs carved into 64-byte
//! chunks, never writable and executable at the same address, trap-filled free space, one
//! cache-maintenance pass per batch commit, and frees deferred with `crossbeam-epoch` until no
//! thread can be running the code. See docs/ARCHITECTURE.md for the life cycle.

mod compact;
mod probe;
mod sys;

pub use compact::{Compaction, Movable, MoveListener, MoveWatch};

use crate::id_map::IdMap;
use crate::run_pin;
use crossbeam_epoch as epoch;
use packjit_plugin_api::{Arch, CodeArena, CompileError, ErrorKind, Region};
use std::collections::{hash_map, BTreeMap, BTreeSet};
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard};

/// Allocation granularity: programs start on 64-byte (cache-line) boundaries.
pub const CHUNK: usize = 64;
/// Empty pages a pack keeps resident before giving them back: up to 1 in this many of its
/// resident pages. Under churn a page emptied now is often refilled soon (compaction empties
/// the pages at a free run's edge, where the next placement goes); releasing it at once costs
/// a hole punch now and two page faults and a trap fill on reuse, per page. Released in one
/// sweep when the share is exceeded.
const IDLE_SHARE: usize = 32;

/// Default pack size (the kernel's `bpf_prog_pack` size on most arches).
pub const DEFAULT_PACK_SIZE: usize = 2 << 20;

/// How packs are mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MapMode {
    /// Dual mapping when memfd works, toggle otherwise.
    #[default]
    Auto,
    /// One memfd mapped twice: RW for writing, RX for running.
    DualMapping,
    /// One anonymous mapping, RW while filled, RX once committed (then sealed).
    Toggle,
}

/// Whether commit remaps the executable pages it touched (for emulators that ignore cache
/// maintenance, such as qemu-user 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RemapPolicy {
    /// Decide with a start-up self-probe.
    #[default]
    Auto,
    /// Always remap touched RX pages on commit.
    Always,
    /// Never remap.
    Never,
}

/// Where a new program goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// The smallest free run that fits, over all packs (ties: the fuller pack, then the
    /// lower address). Holes left by freed programs are refilled by programs of about their
    /// size instead of being nibbled by whatever comes first, so free space stays in few
    /// large runs under churn (see the `churn` benchmark). O(log n) per pack.
    #[default]
    BestFit,
    /// The lowest free run that fits, first pack first (the kernel's `bpf_prog_pack`
    /// bitmap search); kept for comparison.
    FirstFit,
    /// Best fit, but a request of at least `large_chunks` chunks is placed at the high end of
    /// its run instead of the low end, so small and large programs grow towards each other
    /// from the two ends of free space. Measured alternative (see the `churn` benchmark): it
    /// did not leave free space less split than plain best fit.
    BestFitTwoEnded {
        /// Requests of this many chunks or more go to the high end.
        large_chunks: usize,
    },
    /// Best fit over size classes: a request is rounded up to one of `2^steps_log2` classes
    /// per doubling (exact below `2^(steps_log2 + 1)` chunks), so a freed hole fits the next
    /// program of its class exactly. Measured alternative: the rounding wastes more
    /// resident memory inside allocations than it saves between them (lower code/resident
    /// in the `churn` benchmark), and free space is not less split.
    SizeClasses {
        /// log2 of the number of classes per doubling of the size.
        steps_log2: u32,
    },
}

/// Arena configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Placement policy.
    pub placement: Placement,
    /// Give pages that hold no program any more back to the kernel (they read as zeroes,
    /// like never-touched pages, and are trap-filled again when code is next placed there).
    /// A pack keeps up to 1 in 32 of its resident pages empty before it sweeps them all
    /// back: under churn most are refilled first, which saves the release and the refaults.
    pub release_free_pages: bool,
    /// Pack size in bytes (a multiple of the page size; rounded up otherwise).
    pub pack_size: usize,
    /// Mapping strategy.
    pub map_mode: MapMode,
    /// Stale-code handling.
    pub remap: RemapPolicy,
    /// Moving live code to keep free space in one run per pack (see [`Compaction`]);
    /// `None` = code never moves. Needs dual mapping (toggle-mode packs are sealed once
    /// committed, so nothing can be copied into them); ignored in toggle mode.
    pub compaction: Option<Compaction>,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            placement: Placement::BestFit,
            release_free_pages: true,
            pack_size: DEFAULT_PACK_SIZE,
            map_mode: MapMode::Auto,
            remap: RemapPolicy::Auto,
            compaction: Some(Compaction::default()),
        }
    }
}

/// Arena statistics (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Packs currently mapped.
    pub packs: usize,
    /// Bytes of address space held by packs.
    pub bytes_reserved: usize,
    /// Bytes handed out (64-byte granularity).
    pub bytes_used: usize,
    /// Bytes of machine code actually written into live regions.
    pub bytes_code: usize,
    /// Bytes of pack memory made resident (pages trap-filled because code was placed in
    /// them); the rest of each pack is untouched demand-zero memory.
    pub bytes_resident: usize,
    /// Live allocations (programs, and old copies of moved programs until their grace period
    /// ends).
    pub allocations: usize,
    /// External fragmentation in per mille: `sum over packs (free chunks - the pack's largest
    /// free run) / sum over packs free chunks` (0 when nothing is free or no pack's free space
    /// is split). Free space includes never-touched and released pages, so the figure falls
    /// when a pack is mapped and jumps when an emptied pack is unmapped, with the same holes.
    pub fragmentation_permille: u32,
    /// Commits performed.
    pub commits: u64,
    /// Instruction-cache maintenance passes (one per merged dirty range).
    pub icache_flushes: u64,
    /// Page ranges remapped for stale-code invalidation.
    pub remaps: u64,
    /// Regions waiting for their epoch to end.
    pub pending_frees: usize,
    /// Whether packs are dual-mapped (true) or toggled (false).
    pub dual_mapped: bool,
    /// Whether commits remap touched RX pages.
    pub remap_on_commit: bool,
    /// Programs moved by compaction so far.
    pub moves: u64,
    /// Bytes of code copied by compaction so far.
    pub bytes_moved: u64,
}

/// What a 64-byte chunk of a pack holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// Part of a live program's allocation.
    Code,
    /// Free, in a resident page already filled with trap instructions.
    TrapFilled,
    /// Free, in a page never touched or given back (costs no memory).
    Untouched,
}

/// One pack's occupancy map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackOccupancy {
    /// Executable address of the pack.
    pub base: usize,
    /// Chunks per page.
    pub page_chunks: usize,
    /// One entry per chunk.
    pub chunks: Vec<ChunkState>,
}

struct Pack {
    id: u64,
    /// Executable view.
    rx: *mut u8,
    /// Writable view (same as `rx` in toggle mode).
    rw: *mut u8,
    size: usize,
    fd: Option<libc::c_int>,
    /// One bit per chunk, set = in use.
    bitmap: Vec<u64>,
    /// One bit per chunk, set = the first chunk of an allocation (with `bitmap`, where one
    /// allocation ends and the next begins, without a lookup in `allocs`).
    starts: Vec<u64>,
    used_chunks: usize,
    /// Live allocations by first chunk (including old copies of moved programs until their
    /// grace period ends). Hashed: a load and a release each find one allocation, which an
    /// ordered map made a descent and, on removal, a shift of its leaf (a fifth of a batch
    /// release's instructions). What needs them in order (compaction) walks `starts`,
    /// which has a bit set exactly where this map has a key.
    allocs: IdMap<usize, Alloc>,
    /// Toggle mode: the pack holds committed code and is RX; never written again.
    sealed: bool,
    /// Pages already trap-filled (and so resident), one flag per page.
    filled_pages: Vec<bool>,
    /// Resident pages that hold no allocation (trap-filled, waiting to be released or
    /// reused; see [`IDLE_SHARE`]).
    idle_pages: usize,
    /// Free runs: first chunk → length, and the same runs ordered by (length, first chunk)
    /// for best fit. Always coalesced: no two runs touch.
    free_by_start: BTreeMap<usize, usize>,
    free_by_len: BTreeSet<(usize, usize)>,
}

impl Pack {
    fn chunks(&self) -> usize {
        self.size / CHUNK
    }

    fn bit(&self, i: usize) -> bool {
        self.bitmap[i / 64] & (1 << (i % 64)) != 0
    }

    /// Whether the used chunks `[start, end)` are exactly one allocation (no other begins
    /// inside).
    fn one_allocation(&self, start: usize, end: usize) -> bool {
        if self.starts[start / 64] & (1 << (start % 64)) == 0 {
            return false;
        }
        // A word at a time: gaps can be thousands of chunks.
        let mut i = start + 1;
        while i < end {
            let span = (64 - i % 64).min(end - i);
            let mask = if span == 64 { !0 } else { (1u64 << span) - 1 };
            if (self.starts[i / 64] >> (i % 64)) & mask != 0 {
                return false;
            }
            i += span;
        }
        true
    }

    /// The allocations starting in chunks `[lo, hi)`, in address order: their first chunks,
    /// read off `starts` a word at a time.
    fn alloc_starts(&self, lo: usize, hi: usize) -> impl Iterator<Item = usize> + '_ {
        let hi = hi.min(self.chunks());
        let mut i = lo;
        std::iter::from_fn(move || {
            while i < hi {
                let word = self.starts[i / 64] >> (i % 64);
                if word == 0 {
                    i = (i / 64 + 1) * 64;
                    continue;
                }
                let c = i + word.trailing_zeros() as usize;
                i = c + 1;
                return (c < hi).then_some(c);
            }
            None
        })
    }

    /// The first allocation starting at or above chunk `at`.
    fn alloc_from(&self, at: usize) -> Option<(usize, &Alloc)> {
        let c = self.alloc_starts(at, self.chunks()).next()?;
        Some((c, &self.allocs[&c]))
    }

    /// The last allocation starting below chunk `at`.
    fn alloc_below(&self, at: usize) -> Option<(usize, &Alloc)> {
        let mut w = at / 64;
        // Bits below `at` in its own word, then whole words downwards.
        let mut word = self
            .starts
            .get(w)
            .map_or(0, |&x| x & ((1u64 << (at % 64)) - 1));
        loop {
            if word != 0 {
                let c = w * 64 + 63 - word.leading_zeros() as usize;
                return Some((c, &self.allocs[&c]));
            }
            w = w.checked_sub(1)?;
            word = self.starts[w];
        }
    }

    fn set_range(&mut self, start: usize, n: usize, on: bool) {
        for i in start..start + n {
            if on {
                self.bitmap[i / 64] |= 1 << (i % 64);
            } else {
                self.bitmap[i / 64] &= !(1 << (i % 64));
            }
        }
    }

    /// First fit: the lowest run of `n` free chunks, scanning a bitmap word at a time.
    fn find_free(&self, n: usize) -> Option<usize> {
        // Packs are whole pages, so the chunk count is a multiple of 64: no partial word.
        let total = self.chunks();
        let mut i = 0;
        while i + n <= total {
            let bits = self.bitmap[i / 64] >> (i % 64);
            let left_in_word = 64 - i % 64;
            if bits & 1 == 1 {
                i += ((!bits).trailing_zeros() as usize).min(left_in_word);
                continue;
            }
            let start = i;
            loop {
                let bits = self.bitmap[i / 64] >> (i % 64);
                let left_in_word = 64 - i % 64;
                let free = (bits.trailing_zeros() as usize).min(left_in_word);
                i += free;
                if i - start >= n {
                    return Some(start);
                }
                if free < left_in_word || i >= total {
                    break;
                }
            }
        }
        None
    }

    /// (free chunks, largest free run).
    fn free_runs(&self) -> (usize, usize) {
        let free = self.chunks() - self.used_chunks;
        let best = self.free_by_len.last().map_or(0, |&(n, _)| n);
        (free, best)
    }

    /// The smallest free run of at least `n` chunks that fits exactly or leaves at least
    /// `usable` chunks, else the smallest of at least `n`: (its length, its first chunk).
    fn best_fit(&self, n: usize, usable: usize) -> Option<(usize, usize)> {
        let mut fits = self.free_by_len.range((n, 0)..);
        let &smallest = fits.next()?;
        if !leaves_unusable(smallest.0, n, usable) {
            return Some(smallest);
        }
        fits.find(|r| !leaves_unusable(r.0, n, usable))
            .or(Some(&smallest))
            .copied()
    }

    fn add_free(&mut self, start: usize, n: usize) {
        self.free_by_start.insert(start, n);
        self.free_by_len.insert((n, start));
    }

    fn remove_free(&mut self, start: usize) -> usize {
        let n = self.free_by_start.remove(&start).expect("a free run");
        self.free_by_len.remove(&(n, start));
        n
    }

    /// Takes chunks `[start, start + n)` out of the free run containing them.
    fn take_free(&mut self, start: usize, n: usize) {
        let (&rs, &rn) = self
            .free_by_start
            .range(..=start)
            .next_back()
            .expect("allocation inside a free run");
        debug_assert!(start + n <= rs + rn, "allocation inside a free run");
        self.remove_free(rs);
        if start > rs {
            self.add_free(rs, start - rs);
        }
        if rs + rn > start + n {
            self.add_free(start + n, rs + rn - start - n);
        }
    }

    /// Returns chunks `[start, start + n)` as a free run merged with its neighbours.
    fn give_free(&mut self, start: usize, n: usize) {
        let (mut s, mut e) = (start, start + n);
        if let Some((&ps, &pn)) = self.free_by_start.range(..s).next_back() {
            if ps + pn == s {
                self.remove_free(ps);
                s = ps;
            }
        }
        if self.free_by_start.contains_key(&e) {
            e += self.remove_free(e);
        }
        self.add_free(s, e - s);
    }

    /// Counts the pages overlapping chunks `[chunk, chunk + n)` (just freed) that now hold no
    /// allocation as idle.
    fn count_idle_pages(&mut self, chunk: usize, n: usize) {
        let page = sys::page_size();
        let pages = (chunk * CHUNK) / page..(chunk * CHUNK + n * CHUNK).div_ceil(page);
        self.idle_pages += pages
            .filter(|&pg| self.filled_pages[pg] && self.page_is_empty(pg))
            .count();
    }

    fn resident_pages(&self) -> usize {
        self.filled_pages.iter().filter(|&&f| f).count()
    }

    /// Whether page `pg` holds no allocated chunk.
    fn page_is_empty(&self, pg: usize) -> bool {
        let per_page = sys::page_size() / CHUNK;
        // Pages are whole bitmap words (at least 4 KiB = 64 chunks).
        self.bitmap[pg * per_page / 64..(pg + 1) * per_page / 64]
            .iter()
            .all(|&w| w == 0)
    }

    fn contains(&self, addr: u64) -> bool {
        let a = addr as usize;
        a >= self.rx as usize && a < self.rx as usize + self.size
    }

    /// Whether `region` claims to lie in this pack (its allocation is checked separately).
    fn holds(&self, region: &Region) -> bool {
        self.id == region.cookie && self.contains(region.exec_addr)
    }
}

/// One live allocation.
struct Alloc {
    chunks: usize,
    /// Bytes of code written.
    code: usize,
    /// Set while the allocation is the current home of a relocatable, unpinned program.
    movable: Option<Arc<Movable>>,
    /// The old copy of a moved program, or a freed program, waiting for its grace period.
    leaving: bool,
}

impl Alloc {
    /// Whether `region`, found starting at this allocation, is exactly it.
    fn matches(&self, region: &Region) -> bool {
        (self.chunks * CHUNK) as u64 == region.size
    }
}

/// Whether `n` chunks placed in a free run of `len` leave a remainder smaller than `usable`
/// (the smallest allocation so far): a hole no program fills until a neighbour goes.
fn leaves_unusable(len: usize, n: usize, usable: usize) -> bool {
    len > n && len - n < usable
}

struct State {
    packs: Vec<Pack>,
    /// Compaction settings in force (changeable at run time, see `set_compaction`).
    compaction: Option<Compaction>,
    /// Releases so far, and its value when a compaction search last found nothing to move.
    releases: u64,
    fruitless: Option<u64>,
    /// Its value when compaction last searched for a move that makes room.
    room_searched_at: u64,
    /// Its value when compaction last searched for holes to merge.
    coalesced_at: u64,
    /// Its value when a compaction step last ran (in a commit or after releases).
    settled_at: u64,
    /// The next commit steps even without a release since the last step: that step stopped
    /// at its byte budget with fragmentation still above the threshold, or the compaction
    /// settings changed.
    step_due: bool,
    /// Scratch space for the search that makes room (kept: it runs inside frees and swaps).
    segments: Vec<compact::Segment>,
    /// Chunks of the smallest allocation placed so far.
    smallest_alloc: usize,
    next_id: u64,
    /// Executable ranges written since the last commit: start → end.
    dirty: BTreeMap<usize, usize>,
}

// SAFETY: the raw pointers in `Pack` are addresses of mappings owned by the arena, only
// dereferenced under the state mutex.
unsafe impl Send for State {}

struct Inner {
    cfg: ArenaConfig,
    trap: &'static [u8],
    dual: bool,
    remap: bool,
    membarrier: bool,
    state: Mutex<State>,
    commits: AtomicU64,
    flushes: AtomicU64,
    remaps: AtomicU64,
    pending: AtomicUsize,
    moves: AtomicU64,
    bytes_moved: AtomicU64,
    /// Regions whose grace period has ended, waiting for the arena's next call to release
    /// them (see [`Graced`]).
    graced: Mutex<GracedQueue>,
    /// Set after a push to `graced`: lets the arena's calls skip its lock when nothing waits.
    graced_waiting: AtomicBool,
    /// Set while `graced` holds batches waiting for runs to end.
    runs_waiting: AtomicBool,
    /// Old copies of moved programs not released yet (see [`PackedArena::hasten_old_copies`]).
    old_copies: AtomicUsize,
    /// Loads since the arena last flushed the epoch (each free flushes).
    loads_unflushed: AtomicUsize,
}

/// Regions an epoch callback found past their grace period, or retired programs to drop
/// (see [`PackedArena::after_grace`]). The callback runs inside whichever thread's pin or
/// flush advanced the epoch (a program run, often), so it only queues them: the arena's own
/// calls (alloc, commit, frees, reclaim) release them, under the arena lock, and then take
/// the compaction step the new holes call for. Program runs never do trap fills, page
/// releases, code moves or other threads' program drops.
struct Graced {
    regions: Vec<Region>,
    /// Runs just before the regions are released (symbols of the old code go), so nothing
    /// else can have been placed there yet.
    before: Option<Box<dyn FnOnce() + Send>>,
    /// How many of `regions` are old copies of moved programs.
    old_copies: usize,
}

/// What epoch callbacks leave for the arena's next call (see [`Graced`]).
#[derive(Default)]
struct GracedQueue {
    entries: Vec<Graced>,
    /// The runtime owning the arena is gone: nothing may call the arena again, so work that
    /// would wait here for its next call (see [`PackedArena::after_grace`]) runs at once.
    orphaned: bool,
    /// Entries past the epoch's grace period, each batch waiting for the runs in progress
    /// when it was taken off `entries` to end (runs hold a run pin, not the epoch: see
    /// [`run_pin`](crate::run_pin)).
    waiting_runs: Vec<(run_pin::Snapshot, Vec<Graced>)>,
}

/// Loads in a row that find old copies of moved programs waiting before one flushes the
/// epoch (see [`PackedArena::hasten_old_copies`]).
const LOADS_BEFORE_FLUSH: usize = 2;

/// When a commit takes a compaction step.
#[derive(Clone, Copy)]
enum StepIf {
    /// A maintenance call: always.
    Always,
    /// The last step stopped at its budget, or the settings changed.
    Due,
    /// That, or chunks were released since the last step.
    DueOrReleased,
}

/// The packed code arena. Cheap to clone (shared).
#[derive(Clone)]
pub struct PackedArena {
    inner: Arc<Inner>,
}

impl PackedArena {
    /// Whether `self` and `other` are handles to the same arena.
    pub(crate) fn is_same(&self, other: &PackedArena) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for PackedArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedArena")
            .field("stats", &self.stats())
            .finish()
    }
}

fn arena_err(msg: impl Into<String>) -> CompileError {
    CompileError::new(ErrorKind::Arena, msg)
}

impl PackedArena {
    /// Creates an arena for code of the host architecture.
    pub fn new(cfg: ArenaConfig) -> Result<Self, CompileError> {
        let arch = Arch::host().ok_or_else(|| arena_err("unknown host architecture"))?;
        Self::with_trap(cfg, arch.trap_pattern())
    }

    fn with_trap(mut cfg: ArenaConfig, trap: &'static [u8]) -> Result<Self, CompileError> {
        let page = sys::page_size();
        cfg.pack_size = cfg.pack_size.max(page).div_ceil(page) * page;
        let dual = match cfg.map_mode {
            MapMode::Toggle => false,
            MapMode::DualMapping => {
                sys::memfd(page)
                    .map(sys::close)
                    .map_err(|e| arena_err(format!("memfd_create: {e}")))?;
                true
            }
            MapMode::Auto => sys::memfd(page).map(sys::close).is_ok(),
        };
        let remap = match cfg.remap {
            RemapPolicy::Always => true,
            RemapPolicy::Never => false,
            RemapPolicy::Auto => dual && probe::stale_code_after_rewrite(),
        };
        let membarrier = sys::CORES_NEED_SYNC && sys::membarrier_register();
        let inner = Inner {
            cfg,
            trap,
            dual,
            remap,
            membarrier,
            state: Mutex::new(State {
                packs: Vec::new(),
                // Moving code means copying it into packs that hold committed code, which
                // only the RW view of a dual mapping allows.
                compaction: cfg.compaction.filter(|_| dual),
                releases: 0,
                fruitless: None,
                room_searched_at: 0,
                coalesced_at: 0,
                settled_at: 0,
                step_due: false,
                segments: Vec::new(),
                smallest_alloc: usize::MAX,
                next_id: 1,
                dirty: BTreeMap::new(),
            }),
            commits: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            remaps: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            graced: Mutex::new(GracedQueue::default()),
            graced_waiting: AtomicBool::new(false),
            runs_waiting: AtomicBool::new(false),
            old_copies: AtomicUsize::new(0),
            loads_unflushed: AtomicUsize::new(0),
            moves: AtomicU64::new(0),
            bytes_moved: AtomicU64::new(0),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    /// Makes everything written since the last commit executable and coherent: one pass of
    /// cache maintenance (and, where needed, remapping) over all dirty ranges of the batch.
    ///
    /// With compaction on and fragmentation above its threshold, the commit first moves up
    /// to [`Compaction::step_bytes`] of relocatable code (see [`make_movable`]) into holes
    /// when the last step stopped at its budget or the settings changed (frees and hook swaps
    /// take the step for what they release, [`release_due`](Self::release_due)); the copies
    /// share the batch's maintenance pass, and callers switch to them after it.
    ///
    /// [`make_movable`]: Self::make_movable
    pub fn commit(&self) {
        // A load's commit moves code only to finish a step cut short by its budget, or after
        // new settings. The step that releases call for is taken by whoever retires code
        // (`release_due`: frees, hook swaps), so chunks a load's own call released wait for
        // the next of those, and loads keep their throughput. (Stepping here after every
        // release cost loads 1% in the `churn` example, on top of what they gain from density.)
        self.commit_stepping(None, StepIf::Due);
    }

    /// [`commit`](Self::commit), also taking the step for chunks released since the last
    /// step, as [`release_due`](Self::release_due) would: a hook batch's commit, so that what
    /// earlier batches retired is compacted within the batch's one commit.
    pub(crate) fn commit_settling_releases(&self) {
        self.commit_stepping(None, StepIf::DueOrReleased);
    }

    /// A maintenance step the host can schedule: commits, moving up to `max_bytes` of code
    /// while fragmentation is above the threshold. Returns the bytes moved (0 when
    /// compaction is off or nothing needs or can move).
    pub fn compact(&self, max_bytes: usize) -> usize {
        self.commit_stepping(Some(max_bytes), StepIf::Always)
    }

    fn commit_stepping(&self, budget: Option<usize>, when: StepIf) -> usize {
        self.inner.release_graced();
        let mut st = self.lock();
        let step = match when {
            StepIf::Always => true,
            StepIf::Due => st.step_due,
            StepIf::DueOrReleased => st.step_due || st.settled_at != st.releases,
        };
        let moves = if step {
            st.settled_at = st.releases;
            compact::step(&self.inner, &mut st, budget)
        } else {
            Vec::new()
        };
        self.inner.commit_locked(&mut st);
        self.publish(st, moves)
    }

    /// What a free (or a hook swap) does after queueing what it retires, for hosts that retire
    /// programs themselves ([`Program::drop_after_own_grace`](crate::Program::drop_after_own_grace)).
    /// Releases what is past its grace period, then, if chunks were released since the last
    /// compaction step, takes the step a commit would (same budget and gates) at once, so
    /// that the holes a free leaves are filled from the largest runs' borders now rather than
    /// at the next load (near a full arena one freed program can be a fifth of all free
    /// space). Without moves nothing is committed: released chunks hold trap fill, never
    /// executed, and wait for the next commit.
    pub fn release_due(&self) {
        self.inner.release_graced();
        let mut st = self.lock();
        if st.settled_at == st.releases {
            return;
        }
        // Maintenance mode (`step_bytes` 0): code moves only in `compact` calls.
        if st.compaction.is_none_or(|c| c.step_bytes == 0) {
            return;
        }
        st.settled_at = st.releases;
        let moves = compact::step(&self.inner, &mut st, None);
        if moves.is_empty() {
            return;
        }
        self.inner.commit_locked(&mut st);
        self.publish(st, moves);
    }

    /// Switches each moved program to its copy (after the commit that made the copies
    /// coherent) and frees the old copies after their grace period. Returns the bytes moved.
    fn publish(&self, st: MutexGuard<'_, State>, moves: Vec<compact::Move>) -> usize {
        // After the maintenance pass: the copies are coherent before anyone can branch there.
        for m in &moves {
            m.publish();
        }
        drop(st);
        if moves.is_empty() {
            return 0;
        }
        let bytes = moves.iter().map(|m| m.new.size as usize).sum();
        // One deferred function for all old copies of the step (one grace period, one
        // flush). A thread that loaded an old entry did so while pinned, before this
        // deferral: the old copy outlives its call.
        let old_copies = moves.len();
        self.inner.pending.fetch_add(old_copies, Relaxed);
        self.inner.old_copies.fetch_add(old_copies, Relaxed);
        let regions = moves.iter().map(|m| m.old).collect();
        let before = move || {
            for m in &moves {
                compact::Move::released(&m.movable, &m.old);
            }
        };
        self.defer_release(regions, Some(Box::new(before)), old_copies);
        bytes
    }

    /// Queues `regions` for release once no thread can still be executing them: one deferred
    /// function, one flush (see [`Graced`]).
    fn defer_release(
        &self,
        regions: Vec<Region>,
        before: Option<Box<dyn FnOnce() + Send>>,
        old_copies: usize,
    ) {
        let inner = self.inner.clone();
        let guard = epoch::pin();
        guard.defer(move || {
            inner.queue_graced(Graced {
                regions,
                before,
                old_copies,
            })
        });
        guard.flush();
        self.inner.loads_unflushed.store(0, Relaxed);
    }

    /// Moves along the grace periods of compaction's old copies when they wait through a run
    /// of loads: an epoch flush once `LOADS_BEFORE_FLUSH` (2) loads in a row found them waiting
    /// (the runtime calls this as a load starts). Until an old copy is released, the free
    /// runs on either side of where its program was stay apart, and only flushes end grace
    /// periods; frees flush, loads did not. Not every load: the flush ends other frees' grace
    /// periods too, and their release (trap fills, page releases) would move from frees into
    /// loads.
    pub fn hasten_old_copies(&self) {
        let inner = &self.inner;
        if inner.old_copies.load(Relaxed) == 0 {
            return;
        }
        if inner.loads_unflushed.fetch_add(1, Relaxed) + 1 >= LOADS_BEFORE_FLUSH {
            epoch::pin().flush();
            inner.loads_unflushed.store(0, Relaxed);
        }
    }

    /// Compaction settings in force (`None` in toggle mode, whatever was asked).
    pub fn compaction(&self) -> Option<Compaction> {
        self.lock().compaction
    }

    /// Turns compaction on (`Some`) or off from the next commit on; ignored in toggle mode.
    pub fn set_compaction(&self, c: Option<Compaction>) {
        let dual = self.inner.dual;
        let mut st = self.lock();
        st.compaction = c.filter(|_| dual);
        st.step_due = true;
    }

    /// Makes the program in `region` (entry point `entry`, its code completely written)
    /// relocatable: compaction may move it from now on (also before its first commit: a move
    /// copies it, and the commit that makes the copy executable covers the original's bytes
    /// too), and the returned handle always holds its current position.
    /// `watch` is told of every move. Callers run the code only through
    /// [`Movable::entry`], loaded after pinning the epoch (see [`epoch_pin`]), and free it
    /// with [`detach_movable`](Self::detach_movable) + a deferred free of the region that
    /// returns.
    pub fn make_movable(
        &self,
        region: &Region,
        entry: u64,
        watch: Option<MoveWatch>,
    ) -> Result<Arc<Movable>, CompileError> {
        if entry < region.exec_addr || entry >= region.exec_addr + region.size {
            return Err(arena_err(format!(
                "entry {entry:#x} is outside its region at {:#x}",
                region.exec_addr
            )));
        }
        let mut st = self.lock();
        let (pi, chunk) = Inner::locate(&st, region)?;
        let m = Arc::new(Movable::new(region, entry, watch));
        st.packs[pi]
            .allocs
            .get_mut(&chunk)
            .expect("located")
            .movable = Some(m.clone());
        Ok(m)
    }

    /// Pins a relocatable program where it is now (for hosts handed its raw entry address)
    /// and returns its entry. No move can be in flight: moves happen under the same lock.
    pub fn pin_movable(&self, m: &Movable) -> u64 {
        let mut st = self.lock();
        m.set_pinned();
        if let Ok((pi, chunk)) = Inner::locate(&st, &m.region()) {
            st.packs[pi]
                .allocs
                .get_mut(&chunk)
                .expect("located")
                .movable = None;
        }
        m.entry()
    }

    /// Stops moving a program that is being freed and returns the region it occupies now,
    /// which the caller frees (after its grace period).
    pub fn detach_movable(&self, m: &Movable) -> Region {
        Inner::detach_locked(&mut self.lock(), m)
    }

    /// [`detach_movable`](Self::detach_movable) for many programs under one lock (a hook
    /// batch retiring them): their regions now, in the same order.
    pub(crate) fn detach_movables(&self, ms: &[&Movable]) -> Vec<Region> {
        let mut st = self.lock();
        ms.iter()
            .map(|m| Inner::detach_locked(&mut st, m))
            .collect()
    }

    /// Releases `region` once no thread can still be executing it (see [`epoch_pin`]): at the
    /// arena's first call after its grace period. Releases what is past its
    /// grace period now (earlier frees, often ended by this call's flush), and takes a
    /// compaction step for the holes, as a commit would.
    pub fn free_deferred(&self, region: Region) {
        self.inner.pending.fetch_add(1, Relaxed);
        self.defer_release(vec![region], None, 0);
        // The flush may have ended earlier frees' grace periods.
        self.release_due();
    }

    /// Like [`free_deferred`](Self::free_deferred), running `before` (e.g. dropping the
    /// region's symbol) after the grace period and just before the chunks are released, so
    /// nothing else can have been placed there yet.
    pub fn free_deferred_then(&self, region: Region, before: impl FnOnce() + Send + 'static) {
        self.inner.pending.fetch_add(1, Relaxed);
        self.defer_release(vec![region], Some(Box::new(before)), 0);
        self.release_due();
    }

    /// Releases `regions`, whose grace period has already passed (a batch retirement that
    /// waited once for many programs), at the arena's next call, all under one lock: this
    /// runs inside the retirement's epoch callback (see [`Graced`]). Each counts in
    /// `pending_frees` from [`expect_release`](Self::expect_release) on.
    pub(crate) fn release_after_grace(&self, regions: Vec<Region>) {
        self.inner.queue_graced(Graced {
            regions,
            before: None,
            old_copies: 0,
        });
    }

    /// Runs `drop_retired`, which drops programs whose grace period has passed, at the arena's
    /// next call rather than inside the epoch callback that found the grace period over. That
    /// callback runs in whichever thread's pin or flush advanced the epoch, often one running
    /// a hook, and a hook run must not pay for dropping another thread's programs (unlisting
    /// their symbols, perhaps rewriting the perf map, freeing their allocations: a third of a
    /// millisecond for a batch of a thousand). The queued programs hold this arena, so once
    /// its runtime is gone ([`orphan`](Self::orphan)) this drops them at once instead.
    pub(crate) fn after_grace(&self, drop_retired: Box<dyn FnOnce() + Send>) {
        let mut queue = self.inner.graced();
        let orphaned = queue.orphaned;
        queue.entries.push(Graced {
            regions: Vec::new(),
            before: Some(drop_retired),
            old_copies: 0,
        });
        drop(queue);
        self.inner.graced_waiting.store(true, Release);
        if orphaned {
            // Not on the epoch's grace alone: runs hold run pins, so the programs go once the
            // runs in progress now have ended (at once if none is).
            Inner::release_orphaned(&self.inner);
        }
    }

    /// The runtime owning the arena is dropping its handle: runs what waits for the arena's
    /// next call, and from now on [`after_grace`](Self::after_grace) work at once (the
    /// arena stays alive as long as a program holds it).
    pub(crate) fn orphan(&self) {
        self.inner.graced().orphaned = true;
        self.inner.graced_waiting.store(true, Release);
        Inner::release_orphaned(&self.inner);
    }

    /// Counts one region retired by a batch as pending until `release_after_grace`.
    pub(crate) fn expect_release(&self) {
        self.inner.pending.fetch_add(1, Relaxed);
    }

    /// Drives epoch reclamation until no deferred free is pending (or gives up after a
    /// bounded number of attempts, e.g. while another thread stays pinned). Returns the number
    /// still pending.
    pub fn reclaim(&self) -> usize {
        flush_epoch_until(|| {
            self.inner.release_graced();
            self.inner.pending.load(Relaxed) == 0
        });
        self.inner.release_graced();
        self.inner.pending.load(Relaxed)
    }

    /// A statistics snapshot.
    pub fn stats(&self) -> ArenaStats {
        let st = self.lock();
        let mut s = ArenaStats {
            commits: self.inner.commits.load(Relaxed),
            icache_flushes: self.inner.flushes.load(Relaxed),
            remaps: self.inner.remaps.load(Relaxed),
            pending_frees: self.inner.pending.load(Relaxed),
            dual_mapped: self.inner.dual,
            remap_on_commit: self.inner.remap,
            moves: self.inner.moves.load(Relaxed),
            bytes_moved: self.inner.bytes_moved.load(Relaxed),
            ..ArenaStats::default()
        };
        for p in &st.packs {
            s.packs += 1;
            s.bytes_reserved += p.size;
            s.bytes_used += p.used_chunks * CHUNK;
            s.allocations += p.allocs.len();
            s.bytes_code += p.allocs.values().map(|a| a.code).sum::<usize>();
            s.bytes_resident += p.filled_pages.iter().filter(|&&f| f).count() * sys::page_size();
        }
        s.fragmentation_permille = compact::fragmentation_permille(&st.packs);
        s
    }

    /// The executable address range of every pack (for W^X and layout checks).
    pub fn pack_ranges(&self) -> Vec<(usize, usize)> {
        self.lock()
            .packs
            .iter()
            .map(|p| (p.rx as usize, p.size))
            .collect()
    }

    /// Copies `len` bytes at `addr` out of a pack (live code or trap-filled free space).
    pub fn read_code(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        Self::read_locked(&self.lock(), addr, len)
    }

    fn read_locked(st: &State, addr: u64, len: usize) -> Option<Vec<u8>> {
        let p = st
            .packs
            .iter()
            .find(|p| p.contains(addr) && p.contains(addr + len.max(1) as u64 - 1))?;
        let off = (addr - p.rx as u64) as usize;
        // SAFETY: inside a mapped, readable pack; we hold the lock so it is not unmapped.
        Some(unsafe { std::slice::from_raw_parts(p.rw.add(off), len) }.to_vec())
    }

    /// Copies `len` bytes of a relocatable program's code from its entry, wherever it is
    /// (the lock keeps it from moving while we read).
    pub fn read_movable(&self, m: &Movable, len: usize) -> Option<Vec<u8>> {
        let st = self.lock();
        Self::read_locked(&st, m.entry(), len)
    }

    /// Every pack's occupancy, one state per 64-byte chunk, in address order within a pack
    /// (for drawing maps; see `packjit-demo stats --map`).
    pub fn occupancy(&self) -> Vec<PackOccupancy> {
        let st = self.lock();
        let per_page = sys::page_size() / CHUNK;
        st.packs
            .iter()
            .map(|p| PackOccupancy {
                base: p.rx as usize,
                page_chunks: per_page,
                chunks: (0..p.chunks())
                    .map(|c| {
                        if p.bit(c) {
                            ChunkState::Code
                        } else if p.filled_pages[c / per_page] {
                            ChunkState::TrapFilled
                        } else {
                            ChunkState::Untouched
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// The trap pattern free space is filled with.
    pub fn trap_pattern(&self) -> &'static [u8] {
        self.inner.trap
    }

    /// The configuration in force (pack size rounded to pages).
    pub fn config(&self) -> ArenaConfig {
        self.inner.cfg
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the bitmap half-updated in a way that
        // breaks safety (only accounting), so keep going after poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn graced(&self) -> MutexGuard<'_, GracedQueue> {
        // A push or a take: nothing half-done to poison.
        self.graced.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called from epoch callbacks: no arena lock, no work beyond a push.
    fn queue_graced(&self, g: Graced) {
        self.graced().entries.push(g);
        // After the push: a caller that sees the flag finds the entry. One that clears it
        // just before this store takes the entry anyway, or leaves it to the next call.
        self.graced_waiting.store(true, Release);
    }

    /// [`release_graced`](Self::release_graced) for an arena no runtime calls any more:
    /// what waits for runs to end is retried from an epoch callback (the next flush, as a
    /// hook swap or a free does) until it is gone, since no arena call will come for it.
    fn release_orphaned(inner: &Arc<Inner>) {
        inner.release_graced();
        if inner.runs_waiting.load(Acquire) {
            let again = inner.clone();
            let guard = epoch::pin();
            guard.defer(move || Inner::release_orphaned(&again));
            guard.flush();
        }
    }

    /// Releases every queued region (see [`Graced`]) that no run can still be executing:
    /// past the epoch's grace period (they were queued by its callback) and past the runs in
    /// progress when they were taken off the queue (see [`run_pin`](crate::run_pin)). Never
    /// waits: a batch whose runs are still going stays for a later call.
    fn release_graced(&self) {
        // What the C API's handles wait for (they hold programs, whose release queues here).
        run_pin::collect();
        // Again while there is something new: dropping queued programs queues their regions.
        loop {
            let fresh = self.graced_waiting.swap(false, Acquire);
            if !fresh && !self.runs_waiting.load(Acquire) {
                return;
            }
            // Taken out first: `before` may drop symbols (their own lock), and `release_now`
            // takes the arena lock; neither runs under the queue's.
            let taken = if fresh {
                std::mem::take(&mut self.graced().entries)
            } else {
                Vec::new()
            };
            // Taken after the entries were retired (they were unpublished before their
            // epoch grace period began), outside the queue's lock (a system call).
            let snap = (!taken.is_empty()).then(run_pin::Snapshot::take);
            let queued: Vec<Graced> = {
                let mut q = self.graced();
                if let Some(snap) = snap {
                    q.waiting_runs.push((snap, taken));
                }
                let mut ready = Vec::new();
                q.waiting_runs.retain_mut(|(snap, batch)| {
                    if snap.passed() {
                        ready.append(batch);
                        false
                    } else {
                        true
                    }
                });
                self.runs_waiting.store(!q.waiting_runs.is_empty(), Release);
                ready
            };
            if queued.is_empty() && !fresh {
                return;
            }
            for g in queued {
                if let Some(before) = g.before {
                    before();
                }
                self.release_now(&g.regions);
                self.pending.fetch_sub(g.regions.len(), Relaxed);
                self.old_copies.fetch_sub(g.old_copies, Relaxed);
            }
        }
    }

    fn new_pack(&self, st: &mut State, min_size: usize) -> Result<usize, CompileError> {
        let page = sys::page_size();
        let size = min_size.div_ceil(self.cfg.pack_size) * self.cfg.pack_size;
        let size = size.div_ceil(page) * page;
        let align = self
            .cfg
            .pack_size
            .next_power_of_two()
            .min(2 << 20)
            .max(page);
        let base = sys::reserve_aligned(size, align).map_err(|e| arena_err(e.to_string()))?;
        let (rx, rw, fd) = if self.dual {
            let fd = sys::memfd(size).map_err(|e| {
                sys::unmap(base, size);
                arena_err(format!("memfd_create: {e}"))
            })?;
            let views = sys::map_shared(fd, 0, size, libc::PROT_READ | libc::PROT_EXEC, Some(base))
                .and_then(|rx| {
                    sys::map_shared(fd, 0, size, libc::PROT_READ | libc::PROT_WRITE, None)
                        .map(|rw| (rx, rw))
                });
            match views {
                Ok((rx, rw)) => (rx, rw, Some(fd)),
                Err(e) => {
                    sys::unmap(base, size);
                    sys::close(fd);
                    return Err(arena_err(e.to_string()));
                }
            }
        } else {
            let p = sys::map_anon_rw(base, size).map_err(|e| {
                sys::unmap(base, size);
                arena_err(e.to_string())
            })?;
            (p, p, None)
        };
        // Pages are trap-filled lazily, when code is first placed in them (see `alloc`), so a
        // 2 MiB pack holding one small program costs one resident page, not 2 MiB.
        let id = st.next_id;
        st.next_id += 1;
        let chunks = size / CHUNK;
        st.packs.push(Pack {
            id,
            rx,
            rw,
            size,
            fd,
            bitmap: vec![0; chunks.div_ceil(64)],
            starts: vec![0; chunks.div_ceil(64)],
            used_chunks: 0,
            allocs: IdMap::default(),
            sealed: false,
            filled_pages: vec![false; size / page],
            idle_pages: 0,
            free_by_start: BTreeMap::from([(0, chunks)]),
            free_by_len: BTreeSet::from([(chunks, 0)]),
        });
        Ok(st.packs.len() - 1)
    }

    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        if size == 0 {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                "zero-sized code allocation",
            ));
        }
        let n = match self.cfg.placement {
            Placement::SizeClasses { steps_log2 } => size_class(size.div_ceil(CHUNK), steps_log2),
            _ => size.div_ceil(CHUNK),
        };
        // Chunks past their grace period first: they may take this program.
        self.release_graced();
        let mut st = self.lock();
        // A remainder smaller than every allocation so far would be a hole no program fills
        // (on arm64, for one, no program is a single chunk).
        st.smallest_alloc = st.smallest_alloc.min(n);
        let smallest = st.smallest_alloc;
        let open = st.packs.iter().enumerate().filter(|(_, p)| !p.sealed);
        let found = match self.cfg.placement {
            Placement::FirstFit => open
                .clone()
                .find_map(|(i, p)| p.find_free(n).map(|c| (i, c))),
            // Smallest run first (of those that leave no unusable remainder); among equal runs
            // the fuller pack (so emptier packs drain and can be released), then the lower
            // address.
            Placement::BestFit
            | Placement::BestFitTwoEnded { .. }
            | Placement::SizeClasses { .. } => open
                .filter_map(|(i, p)| {
                    p.best_fit(n, smallest).map(|(len, c)| {
                        let unusable = leaves_unusable(len, n, smallest);
                        let free = p.chunks() - p.used_chunks;
                        ((unusable, len, free, p.rx as usize), (i, c))
                    })
                })
                .min_by_key(|&(key, _)| key)
                .map(|(_, found)| found),
        };
        let (pi, c) = match found {
            Some(f) => f,
            None => (self.new_pack(&mut st, n * CHUNK)?, 0),
        };
        // `c` is the first chunk of the chosen free run (of a new pack: chunk 0).
        let chunk = match self.cfg.placement {
            Placement::BestFitTwoEnded { large_chunks } if n >= large_chunks => {
                c + st.packs[pi].free_by_start[&c] - n
            }
            _ => c,
        };
        Ok(self.place(&mut st, pi, chunk, n))
    }

    /// Hands out the free chunks `[chunk, chunk + n)` of pack `pi`.
    fn place(&self, st: &mut State, pi: usize, chunk: usize, n: usize) -> Region {
        let p = &mut st.packs[pi];
        let page = sys::page_size();
        let pages = (chunk * CHUNK) / page..(chunk * CHUNK + n * CHUNK).div_ceil(page);
        p.idle_pages -= pages
            .clone()
            .filter(|&pg| p.filled_pages[pg] && p.page_is_empty(pg))
            .count();
        p.set_range(chunk, n, true);
        p.take_free(chunk, n);
        // Trap-fill the pages this region touches for the first time, so the space around the
        // program in those pages traps if ever jumped to.
        for pg in pages {
            if !p.filled_pages[pg] {
                // SAFETY: a whole page inside the pack's RW view.
                fill_trap(unsafe { p.rw.add(pg * page) }, page, self.trap);
                p.filled_pages[pg] = true;
            }
        }
        p.used_chunks += n;
        p.starts[chunk / 64] |= 1 << (chunk % 64);
        p.allocs.insert(
            chunk,
            Alloc {
                chunks: n,
                code: 0,
                movable: None,
                leaving: false,
            },
        );
        Region {
            exec_addr: p.rx as u64 + (chunk * CHUNK) as u64,
            size: (n * CHUNK) as u64,
            cookie: p.id,
        }
    }

    /// Finds the pack and first chunk of a live region, validating it.
    fn locate(st: &State, region: &Region) -> Result<(usize, usize), CompileError> {
        match Self::pack_and_chunk(st, region) {
            Some((pi, chunk))
                if st.packs[pi]
                    .allocs
                    .get(&chunk)
                    .is_some_and(|a| a.matches(region)) =>
            {
                Ok((pi, chunk))
            }
            _ if !st.packs.iter().any(|p| p.holds(region)) => Err(arena_err(format!(
                "region at {:#x} is not from this arena",
                region.exec_addr
            ))),
            _ => Err(arena_err(format!(
                "region at {:#x} ({} bytes) is not an allocation of this arena",
                region.exec_addr, region.size
            ))),
        }
    }

    /// The pack a region lies in and the chunk it starts at, for callers that check the
    /// allocation in the same map operation that uses it (one search of the pack's map).
    fn pack_and_chunk(st: &State, region: &Region) -> Option<(usize, usize)> {
        let pi = st.packs.iter().position(|p| p.holds(region))?;
        let off = (region.exec_addr - st.packs[pi].rx as u64) as usize;
        (off % CHUNK == 0).then_some((pi, off / CHUNK))
    }

    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e as u64 <= region.size)
            .ok_or_else(|| {
                arena_err(format!(
                    "write of {} bytes at offset {offset} overflows a {}-byte region",
                    bytes.len(),
                    region.size
                ))
            })?;
        let mut st = self.lock();
        let (pi, chunk) = Self::locate(&st, region)?;
        let p = &mut st.packs[pi];
        if p.sealed {
            return Err(arena_err("region belongs to a committed (sealed) pack"));
        }
        let off = chunk * CHUNK + offset;
        // SAFETY: bounds checked against the region, which lies inside the RW view.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.rw.add(off), bytes.len()) };
        let alloc = p.allocs.get_mut(&chunk).expect("located");
        alloc.code = alloc.code.max(end);
        // Track dirt at chunk granularity so neighbouring programs of one batch merge into a
        // single maintenance range.
        let start = p.rx as usize + off / CHUNK * CHUNK;
        let end_addr = (p.rx as usize + off + bytes.len()).div_ceil(CHUNK) * CHUNK;
        mark_dirty(&mut st.dirty, start, end_addr);
        Ok(())
    }

    /// See [`PackedArena::detach_movable`]. Moves happen under the same lock, so the region
    /// read here is where the code stays.
    fn detach_locked(st: &mut State, m: &Movable) -> Region {
        let region = m.region();
        if let Some((pi, chunk)) = Self::pack_and_chunk(st, &region) {
            if let Some(a) = st.packs[pi]
                .allocs
                .get_mut(&chunk)
                .filter(|a| a.matches(&region))
            {
                a.movable = None;
                a.leaving = true;
            }
        }
        region
    }

    /// Returns regions' chunks, all under one lock (a hook batch retires many at once):
    /// clear, trap-fill where the pack is writable, and unmap packs left empty. Adjacent
    /// regions are filled and marked dirty as one range, and idle pages are given back once
    /// per pack, after the last region.
    fn release_now(&self, regions: &[Region]) {
        let mut st = self.lock();
        // (pack index, first chunk, chunks) of the regions that are ours, in address order so
        // that neighbours merge.
        let mut runs: Vec<(usize, usize, usize)> = Vec::with_capacity(regions.len());
        for region in regions {
            let Some((pi, chunk)) = Self::pack_and_chunk(&st, region) else {
                continue;
            };
            let p = &mut st.packs[pi];
            let n = match p.allocs.entry(chunk) {
                hash_map::Entry::Occupied(a) if a.get().matches(region) => a.remove().chunks,
                _ => continue,
            };
            p.starts[chunk / 64] &= !(1 << (chunk % 64));
            p.used_chunks -= n;
            st.releases += 1;
            runs.push((pi, chunk, n));
        }
        runs.sort_unstable();
        let mut i = 0;
        while i < runs.len() {
            let (pi, start, mut n) = runs[i];
            i += 1;
            while i < runs.len() && runs[i].0 == pi && runs[i].1 == start + n {
                n += runs[i].2;
                i += 1;
            }
            let p = &mut st.packs[pi];
            p.set_range(start, n, false);
            // Once per run of neighbours: the free lists merge them anyway.
            p.give_free(start, n);
            // An emptied pack is unmapped below; a sealed one is never written again.
            if p.used_chunks == 0 || p.sealed {
                continue;
            }
            let off = start * CHUNK;
            // SAFETY: the chunks are inside the RW view and no longer handed out.
            fill_trap(unsafe { p.rw.add(off) }, n * CHUNK, self.trap);
            // Idle pages are counted whatever the policy (placements count them back down).
            p.count_idle_pages(start, n);
            let exec = p.rx as usize + off;
            mark_dirty(&mut st.dirty, exec, exec + n * CHUNK);
        }
        let mut touched: Vec<usize> = runs.iter().map(|r| r.0).collect();
        touched.dedup();
        // Highest index first: `swap_remove` only moves packs from above the removed one.
        for &pi in touched.iter().rev() {
            let p = &mut st.packs[pi];
            if p.used_chunks == 0 {
                let p = st.packs.swap_remove(pi);
                let (lo, hi) = (p.rx as usize, p.rx as usize + p.size);
                st.dirty.retain(|&s, _| s < lo || s >= hi);
                drop_pack(p);
            } else if !p.sealed
                && self.cfg.release_free_pages
                && p.idle_pages * IDLE_SHARE > p.resident_pages()
            {
                Self::release_idle_pages(p);
            }
        }
    }

    /// Gives all of the pack's idle pages back to the kernel (see [`IDLE_SHARE`]), so
    /// `bytes_resident` tracks live code rather than the high-water mark. Only called after
    /// a grace period: nothing can execute in a page without an allocation.
    fn release_idle_pages(p: &mut Pack) {
        let page = sys::page_size();
        let mut pg = 0;
        while pg < p.filled_pages.len() {
            // A run of consecutive idle pages: one syscall for all of them.
            let start = pg;
            while pg < p.filled_pages.len() && p.filled_pages[pg] && p.page_is_empty(pg) {
                pg += 1;
            }
            if pg > start && sys::release_pages(p.fd, p.rw, start * page, (pg - start) * page) {
                p.filled_pages[start..pg].fill(false);
                p.idle_pages -= pg - start;
            }
            pg += 1;
        }
    }

    fn commit_locked(&self, st: &mut State) {
        let dirty = std::mem::take(&mut st.dirty);
        self.commits.fetch_add(1, Relaxed);
        if dirty.is_empty() {
            return;
        }
        let page = sys::page_size();
        for (&start, &end) in &dirty {
            if self.remap {
                // qemu-user only drops translations when the executable view is remapped: map
                // the same memfd pages again in place, still RX (never dropping PROT_EXEC).
                let lo = start & !(page - 1);
                let hi = end.div_ceil(page) * page;
                if let Some(p) = st.packs.iter().find(|p| p.contains(lo as u64)) {
                    let fd = p.fd.expect("remap only in dual mode");
                    let off = lo - p.rx as usize;
                    if sys::map_shared(
                        fd,
                        off,
                        hi - lo,
                        libc::PROT_READ | libc::PROT_EXEC,
                        Some(lo as *mut u8),
                    )
                    .is_ok()
                    {
                        self.remaps.fetch_add(1, Relaxed);
                    }
                }
            }
            sys::flush_icache(start, end - start);
            self.flushes.fetch_add(1, Relaxed);
        }
        if !self.dual {
            // Toggle mode: make every touched pack RX and seal it.
            for p in st.packs.iter_mut().filter(|p| !p.sealed) {
                let touched = dirty
                    .range(..p.rx as usize + p.size)
                    .any(|(&s, _)| p.contains(s as u64));
                if touched {
                    // SAFETY: our own mapping; it holds no code that is running yet.
                    let _ =
                        unsafe { region::protect(p.rx, p.size, region::Protection::READ_EXECUTE) };
                    p.sealed = true;
                }
            }
        }
        if self.membarrier {
            sys::membarrier_sync_core();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for p in st.packs.drain(..) {
            drop_pack(p);
        }
    }
}

fn drop_pack(p: Pack) {
    sys::unmap(p.rx, p.size);
    if p.rw != p.rx {
        sys::unmap(p.rw, p.size);
    }
    if let Some(fd) = p.fd {
        sys::close(fd);
    }
}

fn mark_dirty(dirty: &mut BTreeMap<usize, usize>, start: usize, end: usize) {
    // Merge with an overlapping or adjacent earlier range, then swallow later ones.
    let (mut s, mut e) = (start, end);
    if let Some((&ps, &pe)) = dirty.range(..=s).next_back() {
        if pe >= s {
            s = ps;
            e = e.max(pe);
        }
    }
    // Ranges starting inside [s, e] are swallowed (none, mostly: then nothing is allocated).
    use std::ops::Bound::{Excluded, Included};
    while let Some((&a, &b)) = dirty.range((Excluded(s), Included(e))).next() {
        dirty.remove(&a);
        e = e.max(b);
    }
    dirty.insert(s, e);
}

/// `n` chunks rounded up to its size class: exact below `2^(steps_log2 + 1)`, then
/// `2^steps_log2` evenly spaced classes per doubling (at most 1 / 2^steps_log2 wasted).
fn size_class(n: usize, steps_log2: u32) -> usize {
    let log2 = usize::BITS - 1 - n.max(1).leading_zeros();
    let step = 1usize << log2.saturating_sub(steps_log2);
    n.div_ceil(step) * step
}

fn fill_trap(dst: *mut u8, len: usize, trap: &[u8]) {
    // SAFETY: callers pass writable ranges they own.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst, len) };
    // Seed one pattern, then double the filled prefix: a handful of large copies instead of
    // one tiny copy per instruction slot. Ranges are chunk-aligned, so the pattern stays in
    // phase with instruction boundaries.
    let seed = len.min(trap.len());
    buf[..seed].copy_from_slice(&trap[..seed]);
    let mut filled = seed;
    while filled < len {
        let n = filled.min(len - filled);
        buf.copy_within(..n, filled);
        filled += n;
    }
}

impl CodeArena for PackedArena {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        self.inner.alloc(size)
    }

    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        self.inner.write(region, offset, bytes)
    }

    fn free(&self, region: &Region) {
        // Never committed, so never executed: release at once.
        self.inner.release_now(std::slice::from_ref(region));
        self.release_due();
    }
}

/// Flushes the epoch until `done` holds (checked first) or about a second has passed, e.g.
/// while another thread stays pinned; returns whether it held. Each flush can advance the
/// global epoch by one step once no thread is pinned in an older one, and a deferred function
/// runs two steps after it was queued. With threads pinned only for short program runs that
/// takes microseconds, so this yields for the first 2 ms (a 500 us sleep after a few yields
/// used to double a batch attach's whole wait), then naps in doubling steps up to 1 ms, so a
/// busy machine still gets there.
pub fn flush_epoch_until(mut done: impl FnMut() -> bool) -> bool {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    let mut nap = Duration::from_micros(20);
    loop {
        // What waits for runs rather than for the epoch (the C API's freed handles).
        crate::run_pin::collect();
        if done() {
            return true;
        }
        let waited = start.elapsed();
        if waited >= Duration::from_secs(1) {
            return false;
        }
        epoch::pin().flush();
        if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }
}

/// Pins the current thread's epoch: code freed after this point stays mapped until the guard
/// is dropped. Program calls and hook dispatch hold one.
pub fn epoch_pin() -> epoch::Guard {
    epoch::pin()
}

#[cfg(test)]
mod tests;
