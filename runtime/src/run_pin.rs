//! Run pins: what keeps a program's code, a hook's attached program and a C handle alive
//! under a run, for the price of two plain stores to a thread-owned word.
//!
//! Until this module, every run pinned the `crossbeam-epoch` epoch. Its `pin` makes the
//! pinned epoch visible before the run reads the pointer it protects, with a full fence (a
//! locked `cmpxchg` on x86-64): 5-7 ns of the 8-12 a run cost over its raw entry (issue 43).
//! A run pin moves that fence to the side that frees, the way liburcu's "memb" flavour does:
//!
//! * a run counts a pin in its thread's word on entry, and on exit takes it back and, for
//!   the outermost run, counts one more run ended, with only a compiler fence on entry (no
//!   atomic read-modify-write, no lock, no allocation);
//! * whoever releases something a run may hold first unpublishes it, then takes a
//!   `Snapshot`: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on
//!   every CPU running one of the process's threads, so each thread either had its pins
//!   visible to the snapshot or reads the pointer after the barrier and sees it unpublished.
//!   Then it releases once every thread that held pins has ended another run
//!   (`Snapshot::passed`).
//!
//! Where `membarrier` is refused (old kernels, seccomp, emulators that lack it) runs use a
//! real `SeqCst` fence after the store and snapshots a `SeqCst` fence before reading: the
//! ordinary Dekker pairing, as `crossbeam-epoch` does.
//!
//! Nothing waits: releases that find a run still in progress stay queued, and the next
//! arena call (or [`collect`]) retries. The code arena releases code only after the epoch's
//! grace period AND a run pin's, so code that holds the epoch pinned (the rbpf bridge,
//! `packjit_epoch_enter`, tests) stays protected as before, and runs that hold only a run
//! pin are protected too.

use packjit_plugin_api::abi::PjExecEnv;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU64, AtomicU8};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// One thread's run state. Slots are leaked and reused by later threads: a snapshot may hold
/// a reference to one after its thread has gone.
struct Slot {
    /// The outermost runs the thread has ended (high 32 bits) and the pins it holds now (low
    /// 32 bits: a helper may run another program inside a run). Written only by the owning
    /// thread, a load and a store at each end of a run: two stores per run, where a depth
    /// and a sequence word apart took four (a run's cost over its raw entry is bound by its
    /// stores; issue 43).
    word: AtomicU64,
    /// Owned by a live thread.
    in_use: AtomicBool,
    /// The environment of the thread's outermost run (see [`RunPin::thread_env`]): kept
    /// from run to run, so that a run writes its inputs instead of building all of it.
    /// Touched only by the owning thread.
    env: UnsafeCell<PjExecEnv>,
}

// SAFETY: `word` and `in_use` are atomics; `env` is only ever accessed by the thread that
// owns the slot (through its own `RunPin`s), never by the threads that read `word`.
unsafe impl Sync for Slot {}

/// The low half of [`Slot::word`]: pins held.
const PINS: u64 = 0xffff_ffff;
/// One outermost run ended, in [`Slot::word`].
const RUN_ENDED: u64 = 1 << 32;

/// Every slot ever made (a handful: one per thread that ran a program at once).
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// How runs and snapshots order themselves (decided once, before the first run pin).
static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);
const UNDECIDED: u8 = 0;
/// Snapshots issue `membarrier`; runs need only a compiler fence.
const MEMBARRIER: u8 = 1;
/// No `membarrier`: runs and snapshots each issue a `SeqCst` fence.
const FENCES: u8 = 2;

thread_local! {
    /// This thread's slot (null until its first run).
    static SLOT: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
    /// Gives the slot back when the thread exits.
    static OWNER: SlotOwner = const { SlotOwner(Cell::new(std::ptr::null())) };
}

struct SlotOwner(Cell<*const Slot>);

impl Drop for SlotOwner {
    fn drop(&mut self) {
        let slot = self.0.get();
        if slot.is_null() {
            return;
        }
        // A run started by a later thread-local destructor registers a new slot (or leaks
        // one, see `register`); it must never write this one once another thread owns it.
        let _ = SLOT.try_with(|s| s.set(std::ptr::null()));
        // SAFETY: slots are leaked, never freed.
        unsafe { &*slot }.in_use.store(false, Release);
    }
}

fn slots() -> MutexGuard<'static, Vec<&'static Slot>> {
    // Pushes and flag flips only: nothing half-done to poison.
    SLOTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Decides [`MODE`] once: `membarrier` when the kernel has the private expedited command
/// and lets this process register for it.
fn mode() -> u8 {
    static DECIDED: OnceLock<u8> = OnceLock::new();
    *DECIDED.get_or_init(|| {
        let m = if std::env::var_os("PACKJIT_RUN_PIN_FENCES").is_some() {
            FENCES
        } else if membarrier_register() {
            MEMBARRIER
        } else {
            FENCES
        };
        MODE.store(m, Relaxed);
        m
    })
}

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes two integer arguments and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long) }
}

fn membarrier_register() -> bool {
    let supported = membarrier(MEMBARRIER_CMD_QUERY);
    supported >= 0
        && supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
}

/// The calling thread's slot, claimed at its first run.
#[cold]
fn register() -> *const Slot {
    mode();
    let slot: &'static Slot = {
        let mut all = slots();
        match all.iter().find(|s| {
            s.in_use
                .compare_exchange(false, true, Acquire, Relaxed)
                .is_ok()
        }) {
            Some(s) => s,
            None => {
                let s: &'static Slot = Box::leak(Box::new(Slot {
                    word: AtomicU64::new(0),
                    in_use: AtomicBool::new(true),
                    env: UnsafeCell::new(PjExecEnv::default()),
                }));
                all.push(s);
                s
            }
        }
    };
    // A thread already tearing down its thread-locals cannot give the slot back: it stays
    // claimed for good (one leaked word pair), never shared.
    if OWNER.try_with(|o| o.0.set(slot)).is_ok() {
        SLOT.with(|s| s.set(slot));
    }
    slot
}

/// Held for the length of a run: what the run reads (its code, the hook slot's program, the
/// C handle) is not released until it is dropped (see the module documentation).
pub struct RunPin {
    slot: *const Slot,
}

impl RunPin {
    /// The environment the thread's outermost run keeps in its slot, for a run that is the
    /// only one in progress on this thread (the caller checks that: a run that starts inside
    /// another's helper, or any second use while one is in progress, needs its own). Its
    /// inputs are whatever the previous run wrote, and what a run may leave set (a stop, the
    /// tail-call count, a sandboxed run's stack bounds) is clear: each run writes its inputs,
    /// and clears the rest when it ends (`exec::run_outermost`).
    pub(crate) fn thread_env(&self) -> *mut PjExecEnv {
        // SAFETY: slots are leaked, never freed; this one is owned by this thread, the only
        // one that touches `env`.
        unsafe { &*self.slot }.env.get()
    }
}

/// Whether the calling thread is inside a run (holds a run pin).
pub fn inside() -> bool {
    let slot = SLOT.with(Cell::get);
    // SAFETY: slots are leaked, never freed.
    !slot.is_null() && unsafe { &*slot }.word.load(Relaxed) & PINS != 0
}

/// Registers run pins with the maps crate, so that a map element retired while a run may
/// hold a pointer into it is reused only after that run ([`packjit_maps::set_run_grace`]):
/// runs of programs with maps then need no epoch pin. Idempotent.
pub(crate) fn register_with_maps() {
    packjit_maps::set_run_grace(packjit_maps::RunGrace {
        defer,
        collect,
        inside_run: inside,
    });
}

/// Pins the calling thread for a run. Nested pins (a helper running another program) only
/// count.
#[inline]
pub fn enter() -> RunPin {
    let mut slot = SLOT.with(Cell::get);
    if slot.is_null() {
        slot = register();
    }
    enter_slot(slot)
}

/// [`enter`] for a thread that has run before, without a call on the way: `None` on the
/// thread's first run (then [`enter`] registers it). For run paths that keep every call
/// out of their common case (the C API's: each call on the way made the compiler save
/// registers around it, stores a run pays for; issue 43).
#[inline]
pub fn try_enter() -> Option<RunPin> {
    let slot = SLOT.with(Cell::get);
    (!slot.is_null()).then(|| enter_slot(slot))
}

#[inline(always)]
fn enter_slot(slot: *const Slot) -> RunPin {
    // SAFETY: slots are leaked, never freed, and this one is owned by this thread.
    let s = unsafe { &*slot };
    // Only this thread writes the word: a load and a store, not a read-modify-write.
    let word = s.word.load(Relaxed);
    s.word.store(word + 1, Relaxed);
    if word & PINS == 0 {
        if MODE.load(Relaxed) == MEMBARRIER {
            // The store must precede the run's loads in program order; the CPU may still
            // reorder them, which a snapshot's membarrier makes harmless.
            compiler_fence(SeqCst);
        } else {
            fence(SeqCst);
        }
    }
    RunPin { slot }
}

impl Drop for RunPin {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `enter`.
        let s = unsafe { &*self.slot };
        let word = s.word.load(Relaxed);
        // The last pin counts the outermost run as ended.
        let left = if word & PINS == 1 {
            word - 1 + RUN_ENDED
        } else {
            word - 1
        };
        // Release: everything the run read or wrote happens before a snapshot that sees the
        // run ended (its load is Acquire) releases anything.
        s.word.store(left, Release);
    }
}

/// The runs in progress at one moment (taken after what they might hold was unpublished):
/// each such thread's word, with the count of runs it had ended then.
#[derive(Default)]
pub(crate) struct Snapshot(Vec<(&'static AtomicU64, u64)>);

impl Snapshot {
    /// The runs in progress now. Call it after unpublishing what is to be released (and, for
    /// the arena, after the epoch's grace period, which follows the unpublishing).
    pub(crate) fn take() -> Snapshot {
        if mode() == MEMBARRIER {
            if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 {
                // Registered at start-up, so it cannot fail; if it somehow does, release
                // nothing on this snapshot's word.
                return Snapshot(vec![]).never();
            }
        } else {
            fence(SeqCst);
        }
        let in_runs = slots()
            .iter()
            .filter_map(|&s| {
                let word = s.word.load(Acquire);
                (word & PINS != 0).then_some((&s.word, word >> 32))
            })
            .collect();
        Snapshot(in_runs)
    }

    /// A snapshot that never passes.
    fn never(mut self) -> Snapshot {
        static NEVER: AtomicU64 = AtomicU64::new(1);
        self.0.push((&NEVER, 0));
        self
    }

    /// Whether every run in progress at the snapshot has ended (a thread has ended another
    /// outermost run since: its count moved on; after 2^32 runs it may look unmoved, which
    /// only waits longer). Acquire: those runs' accesses happen before whatever the caller
    /// releases next.
    pub(crate) fn passed(&mut self) -> bool {
        self.0
            .retain(|(word, ended)| word.load(Acquire) >> 32 == *ended);
        self.0.is_empty()
    }
}

/// Work waiting for the runs in progress when it was queued to end, with their snapshot
/// (`None`: not taken yet).
type Batch = (Option<Snapshot>, Vec<Box<dyn FnOnce() + Send>>);

static DEFERRED: Mutex<Vec<Batch>> = Mutex::new(Vec::new());
static DEFERRED_WAITING: AtomicBool = AtomicBool::new(false);

fn deferred() -> MutexGuard<'static, Vec<Batch>> {
    // Pushes and takes only.
    DEFERRED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` once every run in progress now has ended, at a later [`collect`] (any arena
/// call, a reclaim, a C free). For what a run reads that the arena does not own (the C API's
/// handles). Cheap: may be called from an epoch callback.
pub fn defer(f: Box<dyn FnOnce() + Send>) {
    let mut q = deferred();
    match q.last_mut() {
        Some((None, fs)) => fs.push(f),
        _ => q.push((None, vec![f])),
    }
    drop(q);
    DEFERRED_WAITING.store(true, Release);
}

/// Runs what [`defer`] queued whose runs have ended; never waits.
pub fn collect() {
    if !DEFERRED_WAITING.load(Acquire) {
        return;
    }
    let fresh = deferred().last().is_some_and(|(s, _)| s.is_none());
    // Taken outside the queue's lock: membarrier is a system call.
    let snap = fresh.then(Snapshot::take);
    let ready: Vec<Box<dyn FnOnce() + Send>> = {
        let mut q = deferred();
        if let Some(snap) = snap {
            // Everything still without a snapshot was queued before this one was taken.
            for b in q.iter_mut().filter(|b| b.0.is_none()) {
                b.0 = Some(Snapshot(snap.0.clone()));
            }
        }
        let mut ready = Vec::new();
        q.retain_mut(|(s, fs)| {
            if s.as_mut().is_some_and(Snapshot::passed) {
                ready.append(fs);
                false
            } else {
                true
            }
        });
        DEFERRED_WAITING.store(!q.is_empty(), Release);
        ready
    };
    // Outside the lock: dropping a handle may free a program, which calls the arena, which
    // collects again.
    for f in ready {
        f();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    impl Snapshot {
        /// This thread's part of the snapshot: other tests' threads may be inside runs of
        /// their own.
        fn own(mut self) -> Snapshot {
            let slot = SLOT.with(Cell::get);
            // SAFETY: slots are leaked, never freed.
            let word = &unsafe { &*slot }.word;
            self.0.retain(|(w, _)| std::ptr::eq(*w, word));
            self
        }
    }

    #[test]
    fn a_snapshot_waits_for_the_runs_in_progress_only() {
        let pin = enter();
        let inner = enter();
        drop(inner);
        let mut snap = Snapshot::take().own();
        assert!(!snap.passed(), "this thread is inside a run");
        drop(pin);
        assert!(snap.passed());
        // A run that starts after the snapshot does not hold it back.
        let mut snap = Snapshot::take().own();
        let later = enter();
        assert!(snap.passed());
        // Nor does the next run of a thread whose run the snapshot saw: the count of ended
        // runs moved on, though the thread holds a pin again.
        let mut snap = Snapshot::take().own();
        assert!(!snap.passed());
        drop(later);
        let _next = enter();
        assert!(inside());
        assert!(snap.passed());
    }

    #[test]
    fn pins_dropped_out_of_order_still_end_the_run_once() {
        let outer = enter();
        let inner = enter();
        let mut snap = Snapshot::take().own();
        drop(outer);
        assert!(inside(), "one pin is still held");
        assert!(!snap.passed(), "the run has not ended");
        drop(inner);
        assert!(!inside());
        assert!(snap.passed());
    }

    #[test]
    fn deferred_work_runs_once_the_runs_have_ended() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (started, is_started) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _pin = enter();
            started.send(()).unwrap();
            wait.recv().unwrap();
        });
        is_started.recv().unwrap();
        let r = ran.clone();
        defer(Box::new(move || {
            r.fetch_add(1, SeqCst);
        }));
        collect();
        assert_eq!(
            ran.load(SeqCst),
            0,
            "a run that started earlier is in progress"
        );
        go.send(()).unwrap();
        t.join().unwrap();
        // Other tests' threads may be inside runs of their own at a snapshot: retry.
        let start = std::time::Instant::now();
        while ran.load(SeqCst) == 0 && start.elapsed().as_secs() < 10 {
            collect();
            std::thread::yield_now();
        }
        assert_eq!(ran.load(SeqCst), 1);
    }
}
