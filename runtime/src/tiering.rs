//! Adaptive tiering ([`Tier::Adaptive`]): a program loads on the baseline tier, counts its
//! calls, and once it has run [`TierPolicy::Calls`] times a background thread of its runtime
//! compiles it with the optimizing tier; the optimized code then replaces the baseline for
//! every new call, the code already running finishes where it is and is freed after its
//! grace period.
//!
//! ## The swap
//!
//! An adaptive [`Program`] owns no code of its own: it forwards each run to the program in
//! [`Tiering::current`], a boxed `Program` (the baseline first, the optimized one after the
//! tier-up). A run loads that pointer with `Acquire` after its run pin is taken (the pin is
//! taken by every entry: `Program::call`, hooks, the C API), so it sees either box whole.
//! The tier-up publishes the new box with one `AcqRel` swap (its code was committed before,
//! so the `Release` half orders the arena's commit and the box's fields before the pointer),
//! then retires the old box exactly as a hook retires a replaced program: counted as a
//! pending release, handed to the epoch, and released by the arena once the epoch's grace
//! period AND the run pins in progress at that point have ended (see [`crate::run_pin`]).
//! A run that loaded the old pointer holds a run pin from before the swap, so the old code
//! and box outlive it; runs that start later load the new pointer. Nothing is added to the
//! run's path but that pointer load (and the call counting below); the swap takes no lock a
//! run takes.
//!
//! ## Counting
//!
//! Each run of an adaptive program on the baseline does a `Relaxed` load of its countdown
//! and, while it is not zero, a `Relaxed` store of one less: no read-modify-write, so
//! concurrent runs may lose decrements (the threshold is approximate, never undercounted
//! by more than the number of threads racing). The run that stores zero requests the tier-up
//! (a lock, then a `try_send` to the pool); after it, and after the swap, the countdown
//! stays zero and the run pays one load and one well-predicted branch.
//!
//! ## The pool
//!
//! A runtime owns at most [`TieringConfig::threads`] compile threads, started at the first
//! request, fed through a bounded channel ([`TieringConfig::queue`] jobs), and joined when
//! the runtime drops (queued jobs are abandoned, not compiled). A job holds only a weak
//! reference to its program: a program freed before its compile starts is skipped, one
//! freed during it has its optimized code discarded. A full queue puts the request back:
//! the program counts another [`TierPolicy::Calls`] calls before asking again.

use crate::symbols::ProgramSymbol;
use crate::{
    arena, err, program_box, run_pin, tier, CallScan, CodeRelease, CompileEnv, Error, ErrorKind,
    HeapArena, LoadOptions, PackedArena, Program, RunError, RunPath, RunPlan, Tier, Tiered, Trust,
};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use packjit_plugin_api::{abi, Arch, Compiled, HelperEntry};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;

/// When an adaptive program ([`Tier::Adaptive`]) asks for the optimizing tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TierPolicy {
    /// After this many calls ([`crate::Program::call`], hook runs and C runs alike; counted
    /// without atomic read-modify-writes, so concurrent callers may miss a few). `Calls(0)`
    /// asks at load: the baseline runs while the optimizer works.
    Calls(u64),
    /// Never on its own: only when the host asks ([`crate::Program::request_tier_up`]).
    Manual,
}

/// Calls before an adaptive program tiers up by default. An optimizing compile costs
/// 10-100x a baseline one (0.1-5 ms on another core) and saves 10-55% of each run; at
/// 10,000 calls a program has spent at least as long running as the compile costs, unless
/// its runs are shorter than a few tens of nanoseconds, where there is little to gain.
pub const DEFAULT_TIER_UP_CALLS: u64 = 10_000;

impl Default for TierPolicy {
    fn default() -> Self {
        TierPolicy::Calls(DEFAULT_TIER_UP_CALLS)
    }
}

/// The runtime's background compiles for adaptive programs
/// ([`crate::RuntimeConfig::tiering`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieringConfig {
    /// When adaptive programs loaded from now on tier up (see also
    /// [`crate::Runtime::set_tier_policy`]).
    pub policy: TierPolicy,
    /// Compile threads (at least 1), started at the first tier-up request.
    pub threads: usize,
    /// Requests that may wait for a thread; beyond, a request is put back (see [`TierPolicy`]).
    pub queue: usize,
}

impl Default for TieringConfig {
    fn default() -> Self {
        Self {
            policy: TierPolicy::default(),
            threads: 1,
            queue: 64,
        }
    }
}

/// Where a program stands with tiering ([`crate::Program::tier_status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierStatus {
    /// Loaded with [`Tier::Baseline`] or [`Tier::Optimized`]: that code, for good.
    Fixed(Tier),
    /// Adaptive, on the baseline, the tier-up not asked for yet (counting calls, or waiting
    /// for [`crate::Program::request_tier_up`] under [`TierPolicy::Manual`]).
    Baseline,
    /// Adaptive, on the baseline, queued or being compiled by the optimizing tier.
    Pending,
    /// Adaptive, the optimized code runs every new call.
    Optimized,
    /// Adaptive, on the baseline for good: the optimizing tier cannot take it (sandboxed,
    /// a tail call, a budget, a foreign arch, a build without the `optimizer` feature, ...: the
    /// error names it), found at load or by the compile. Not retried.
    Refused(Error),
    /// Adaptive, on the baseline for good: its code was fixed before the tier-up (its raw
    /// entry was handed out, [`crate::Program::entry`], or it went into a prog array), or
    /// its runtime was dropped with the request still queued.
    Settled,
}

/// What an owned [`CompileEnv`] holds: a tier-up's compile runs after the load returned.
struct OwnedEnv {
    arena: PackedArena,
    heap_arena: Arc<HeapArena>,
    symbols: Arc<crate::Symbols>,
    regions: Arc<[abi::PjMemRegion]>,
    overrides: crate::BuiltinOverrides,
}

/// Everything the optimizing compile of one program needs, kept from its load.
struct Inputs {
    env: OwnedEnv,
    code: Vec<u8>,
    opts: LoadOptions,
    helpers: Vec<HelperEntry>,
    trust: Trust,
    arch: Arch,
    id: u64,
}

impl Inputs {
    /// Compiles and commits the optimized program.
    fn compile(&self) -> Result<Program, Error> {
        let env = CompileEnv {
            arena: Some(&self.env.arena),
            heap_arena: &self.env.heap_arena,
            symbols: &self.env.symbols,
            regions: self.env.regions.clone(),
            overrides: self.env.overrides,
        };
        let backend = tier::optimizer(self.arch)?;
        let prog = env.compile(
            &self.code,
            &self.opts,
            &self.helpers,
            self.trust,
            true,
            backend,
            self.arch,
            self.id,
        )?;
        // Before it is published: no run may reach code that is not executable yet.
        self.env.arena.commit();
        Ok(prog)
    }
}

/// The state under [`Tiering::state`].
struct State {
    status: TierStatus,
    /// Until the request: what the compile needs.
    inputs: Option<Box<Inputs>>,
}

/// An adaptive program's tiering: its current code and where its tier-up stands.
pub(crate) struct Tiering {
    /// The program whose code new runs execute, boxed (never null while the adaptive program
    /// lives): the baseline, then the optimized one. See the module documentation.
    current: AtomicPtr<Program>,
    /// Calls left before the request; 0 once requested, or not counting.
    countdown: AtomicU64,
    /// What the countdown starts from again when the queue was full.
    threshold: u64,
    state: Mutex<State>,
    /// Signalled when the status leaves [`TierStatus::Pending`].
    settled: Condvar,
    /// The optimized program's line table and backend name, set before its swap: what the
    /// adaptive program's accessors that lend references return after it.
    optimized: OnceLock<(Arc<ProgramSymbol>, Arc<str>)>,
    pool: Weak<Pool>,
    me: Weak<Tiering>,
}

/// Makes `base` (just compiled by the baseline for an adaptive load) adaptive: a forwarding
/// program around it, or `base` itself, marked refused, when the optimizing tier cannot take
/// it. Nothing but the refusal checks and a copy of the load's inputs is done here: the
/// load's latency is the baseline's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn adapt(
    mut base: Program,
    env: &CompileEnv<'_>,
    code: &[u8],
    opts: &LoadOptions,
    helpers: &[HelperEntry],
    trust: Trust,
    pool: &Arc<Pool>,
) -> Program {
    let refusal = refusal(&base, code, opts, trust);
    let (Ok(()), Some(arena)) = (refusal.clone(), env.arena.filter(|_| base.executable)) else {
        let why = refusal.err().unwrap_or_else(|| {
            err(
                ErrorKind::Unsupported,
                "optimized tier: compiles for the host only",
            )
        });
        base.tiering = Tiered::Refused(Box::new(why));
        return base;
    };
    let policy = opts.tier_policy.unwrap_or_else(|| pool.policy());
    let threshold = match policy {
        TierPolicy::Calls(n) => n,
        TierPolicy::Manual => 0,
    };
    let inputs = Box::new(Inputs {
        env: OwnedEnv {
            arena: arena.clone(),
            heap_arena: env.heap_arena.clone(),
            symbols: env.symbols.clone(),
            regions: env.regions.clone(),
            overrides: env.overrides,
        },
        code: code.to_vec(),
        opts: LoadOptions {
            tier: Tier::Optimized,
            name: Some(base.name().to_string()),
            features: None,
            disable_features: 0,
            ..opts.clone()
        },
        helpers: helpers.to_vec(),
        trust,
        arch: base.arch,
        id: base.id,
    });
    let compiled = Compiled {
        region: base.compiled.region,
        entry: base.compiled.entry,
        code_size: base.compiled.code_size,
        native_insns: base.compiled.native_insns,
        pc_offsets: Vec::new(),
    };
    let (symbol, arch, features, backend, budget, regions, id, builtins) = (
        base.symbol.clone(),
        base.arch,
        base.features,
        base.backend.clone(),
        base.budget,
        base.regions.clone(),
        base.id,
        base.builtins,
    );
    let t = Arc::new_cyclic(|me| Tiering {
        current: AtomicPtr::new(Box::into_raw(program_box::boxed(base))),
        countdown: AtomicU64::new(threshold),
        threshold,
        state: Mutex::new(State {
            status: TierStatus::Baseline,
            inputs: Some(inputs),
        }),
        settled: Condvar::new(),
        optimized: OnceLock::new(),
        pool: Arc::downgrade(pool),
        me: me.clone(),
    });
    if policy == TierPolicy::Calls(0) {
        t.request();
    }
    Program {
        compiled,
        symbol,
        arch,
        features,
        executable: true,
        owner: crate::ArenaRef::Packed(arena.clone()),
        backend,
        trust,
        budget,
        regions,
        id,
        movable: None,
        symbols: None,
        // The code is `current`'s: dropping the adaptive program hands it on (see its `Drop`).
        code_release: CodeRelease::Released,
        elf: None,
        builtins,
        _percpu_tables: None,
        maps: None,
        run: RunPlan::new(RunPath::Adaptive, budget, None),
        tiering: Tiered::Adaptive(t),
        // Programs that tail call do not tier (`refusal`): no tail calls here;
        // a prog-array slot asks the code it settles on (`Program::settled_code`).
        uniform_tail_frame: false,
    }
}

/// Why the optimizing tier cannot take `base`'s load, if it cannot.
fn refusal(base: &Program, code: &[u8], opts: &LoadOptions, trust: Trust) -> Result<(), Error> {
    tier::optimizer(base.arch)?;
    let scan = CallScan::of(code);
    // An ELF program's data sections are given to the adaptive program after this (see
    // `elf.rs`), so they live as long as either tier's code, which names their addresses.
    tier::refuse_unsupported(opts)?;
    // The optimizing tier's tail calls nest their targets through the runtime's runner
    // (~6 ns each), the baseline's are jumps (under 1 ns): a program that tail calls would
    // often get slower by tiering up, so it stays on the baseline (`Tier::Optimized` takes
    // it when asked).
    if scan.calls(code, crate::maps::helper_ids::TAIL_CALL) {
        return Err(crate::err(
            ErrorKind::Unsupported,
            "adaptive tiering: programs that tail call stay on the baseline, whose tail \
             calls are jumps (the optimizing tier's nest their targets)",
        ));
    }
    // Maps need nothing more: the tier-up's compile binds the maps of `opts` again (tables
    // the code names, per-CPU registrations, lookup facts), and the optimized program owns
    // that binding as the baseline owns its own; both name the same maps, so the values a
    // run sees do not depend on the tier, and the swap retires the baseline's binding with
    // its code.
    // The tier compiles sandboxed programs when asked (`Tier::Optimized`), but without the
    // baseline's check groups and walk proofs its code is slower than the sandboxed
    // baseline's (BENCHMARKS.md, "The optimizing tier sandboxed, side by side"): tiering one up would
    // make it slower, so an adaptive sandboxed program stays where it is.
    if trust == Trust::Sandboxed {
        return Err(crate::err(
            ErrorKind::Unsupported,
            "adaptive tiering: sandboxed programs stay on the baseline, whose checked code \
             is faster than the optimizing tier's for now",
        ));
    }
    Ok(())
}

impl Tiering {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a call toward the tier-up (see the module documentation).
    #[inline(always)]
    pub(crate) fn count(&self) {
        let left = self.countdown.load(Relaxed);
        if left != 0 {
            self.countdown.store(left - 1, Relaxed);
            if left == 1 {
                self.request();
            }
        }
    }

    /// The program new runs execute. The caller holds a run pin taken before this load, and
    /// uses the reference only under it.
    #[inline(always)]
    pub(crate) fn current(&self) -> &Program {
        // SAFETY: never null while the adaptive program lives (`&self` is reached through
        // it); a box replaced by the swap is released only after the run pins in progress
        // at the swap have ended (the caller's among them, see above).
        unsafe { &*self.current.load(Acquire) }
    }

    /// `f` of the program new runs execute now, under a run pin of its own.
    pub(crate) fn with_current<R>(&self, f: impl FnOnce(&Program) -> R) -> R {
        let _pin = run_pin::enter();
        f(self.current())
    }

    /// Queues the tier-up, if it was not asked for yet.
    #[cold]
    #[inline(never)]
    pub(crate) fn request(&self) -> TierStatus {
        self.countdown.store(0, Relaxed);
        let mut st = self.lock();
        if st.status != TierStatus::Baseline {
            return st.status.clone();
        }
        let (Some(pool), Some(inputs), Some(me)) =
            (self.pool.upgrade(), st.inputs.take(), self.me.upgrade())
        else {
            st.status = TierStatus::Settled;
            return st.status.clone();
        };
        // Under the state's lock, so the worker finds the status pending.
        match pool.submit(Job {
            target: Arc::downgrade(&me),
            inputs,
        }) {
            Ok(()) => st.status = TierStatus::Pending,
            Err(job) => {
                // Full: ask again after another round of calls.
                st.inputs = Some(job.inputs);
                self.countdown.store(self.threshold.max(1), Relaxed);
            }
        }
        st.status.clone()
    }

    pub(crate) fn status(&self) -> TierStatus {
        self.lock().status.clone()
    }

    /// Waits until the status is not [`TierStatus::Pending`] and returns it.
    pub(crate) fn wait(&self) -> TierStatus {
        let mut st = self.lock();
        while st.status == TierStatus::Pending {
            st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.status.clone()
    }

    /// The optimized program's line table and backend name, once it runs.
    pub(crate) fn optimized(&self) -> Option<&(Arc<ProgramSymbol>, Arc<str>)> {
        self.optimized.get()
    }

    /// Fixes the current code for good (its address is about to be handed out) and returns
    /// it: no swap happens after this, so the box lives as long as the adaptive program.
    pub(crate) fn settle(&self) -> &Program {
        self.countdown.store(0, Relaxed);
        let mut st = self.lock();
        if matches!(st.status, TierStatus::Baseline | TierStatus::Pending) {
            st.status = TierStatus::Settled;
            st.inputs = None;
            self.settled.notify_all();
        }
        // SAFETY: the status is final, so no swap replaces the box; it lives until the
        // adaptive program drops (`release`), which `&self` outlives.
        unsafe { &*self.current.load(Acquire) }
    }

    /// A worker's result: swaps the optimized code in, or records why not.
    fn finish(&self, result: Result<Program, Error>) {
        let mut st = self.lock();
        if st.status != TierStatus::Pending {
            // Settled or freed meanwhile: the code was never published; a plain drop frees it.
            drop(st);
            drop(result);
            return;
        }
        let old = match result {
            Err(e) => {
                st.status = TierStatus::Refused(e);
                None
            }
            Ok(prog) => {
                let _ = self
                    .optimized
                    .set((prog.symbol.clone(), prog.backend.clone()));
                let new = Box::into_raw(program_box::boxed(prog));
                st.status = TierStatus::Optimized;
                // SAFETY: the box the swap unpublished, owned here alone.
                let old = unsafe { Box::from_raw(self.current.swap(new, AcqRel)) };
                // Pending before anyone learns of the tier-up: a waiter's `reclaim` then
                // waits for the baseline's release.
                old.note_retiring();
                Some(old)
            }
        };
        self.settled.notify_all();
        drop(st);
        if let Some(old) = old {
            retire(old);
        }
    }

    /// The adaptive program is dropping (`how`: whether its own grace period has passed):
    /// cancels a pending tier-up and hands the current code to the arena.
    pub(crate) fn release(&self, how: Release) {
        let mut st = self.lock();
        st.status = TierStatus::Settled;
        st.inputs = None;
        self.settled.notify_all();
        let cur = self.current.swap(std::ptr::null_mut(), AcqRel);
        drop(st);
        if cur.is_null() {
            return;
        }
        // SAFETY: the box `current` held, unpublished by the swap: no later run can reach it
        // (the adaptive program is gone), and runs in progress are covered by `how`.
        let cur = unsafe { Box::from_raw(cur) };
        match how {
            Release::GracePassed => (*cur).drop_after_grace(),
            Release::AfterOwnGrace => drop(cur),
        }
    }
}

/// How an adaptive program's code is released when it drops.
pub(crate) enum Release {
    /// No run can be in it any more (a hook's or the C API's retirement waited).
    GracePassed,
    /// Runs may still be finishing: its own grace period first.
    AfterOwnGrace,
}

/// Retires a program a swap replaced (counted as pending already): released once the
/// epoch's grace period and the run pins in progress now have ended, as a hook retires its
/// old program.
fn retire(old: Box<Program>) {
    let Some(arena) = old.packed_arena().cloned() else {
        (*old).drop_after_grace();
        return;
    };
    let queue = arena.clone();
    let guard = arena::epoch_pin();
    let raw = Box::into_raw(old) as usize;
    // SAFETY: `raw` is the unpublished box, owned by this closure alone; it runs after every
    // thread pinned before the swap has unpinned, and `after_grace` further waits for the
    // run pins in progress when it is taken off the arena's queue.
    unsafe {
        guard.defer_unchecked(move || {
            let old = Box::from_raw(raw as *mut Program);
            queue.after_grace(Box::new(move || (*old).drop_after_grace()));
        });
    }
    guard.flush();
    drop(guard);
    arena.release_due();
}

/// A request for the optimizing tier.
struct Job {
    target: Weak<Tiering>,
    inputs: Box<Inputs>,
}

/// A runtime's compile threads.
pub(crate) struct Pool {
    config: TieringConfig,
    policy: Mutex<TierPolicy>,
    channel: Mutex<Channel>,
    stopping: Arc<AtomicBool>,
}

struct Channel {
    /// `None` once shut down.
    tx: Option<Sender<Job>>,
    rx: Receiver<Job>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    pub(crate) fn new(config: TieringConfig) -> Arc<Pool> {
        let (tx, rx) = crossbeam_channel::bounded(config.queue.max(1));
        Arc::new(Pool {
            config,
            policy: Mutex::new(config.policy),
            channel: Mutex::new(Channel {
                tx: Some(tx),
                rx,
                threads: Vec::new(),
            }),
            stopping: Arc::new(AtomicBool::new(false)),
        })
    }

    fn channel(&self) -> MutexGuard<'_, Channel> {
        self.channel.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn policy(&self) -> TierPolicy {
        *self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_policy(&self, policy: TierPolicy) {
        *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    /// Queues `job`, starting the threads at the first; gives it back when the queue is
    /// full or the pool shut down.
    fn submit(&self, job: Job) -> Result<(), Job> {
        let mut ch = self.channel();
        let Some(tx) = &ch.tx else {
            return Err(job);
        };
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => return Err(job),
        }
        while ch.threads.len() < self.config.threads.max(1) {
            let rx = ch.rx.clone();
            let stopping = self.stopping.clone();
            let spawned = std::thread::Builder::new()
                .name("packjit-tier-up".into())
                .spawn(move || work(&rx, &stopping));
            match spawned {
                Ok(h) => ch.threads.push(h),
                // The job stays queued for the threads there are; with none it is
                // abandoned (settled) when the runtime drops.
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Stops the threads: queued jobs are abandoned (their programs settle on the
    /// baseline), a compile under way finishes first.
    pub(crate) fn shut_down(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let (threads, rx) = {
            let mut ch = self.channel();
            ch.tx = None;
            (std::mem::take(&mut ch.threads), ch.rx.clone())
        };
        for h in threads {
            let _ = h.join();
        }
        // Without threads (or after them): what is still queued.
        abandon(&rx);
    }
}

fn abandon(rx: &Receiver<Job>) {
    while let Ok(job) = rx.try_recv() {
        if let Some(t) = job.target.upgrade() {
            t.finish_abandoned();
        }
    }
}

impl Tiering {
    fn finish_abandoned(&self) {
        let mut st = self.lock();
        if st.status == TierStatus::Pending {
            st.status = TierStatus::Settled;
            self.settled.notify_all();
        }
    }

    fn is_pending(&self) -> bool {
        self.lock().status == TierStatus::Pending
    }
}

/// A compile thread: takes jobs until the pool shuts down.
fn work(rx: &Receiver<Job>, stopping: &AtomicBool) {
    while let Ok(job) = rx.recv() {
        let Some(t) = job.target.upgrade() else {
            // Freed before its turn: cancelled.
            continue;
        };
        if stopping.load(Acquire) {
            t.finish_abandoned();
            continue;
        }
        if !t.is_pending() {
            continue;
        }
        t.finish(job.inputs.compile());
    }
}

/// Runs of an adaptive program (see [`Program::run_pinned`]).
impl Tiering {
    /// # Safety
    /// As [`Program::run_pinned`].
    #[inline(always)]
    pub(crate) unsafe fn run_pinned(
        &self,
        ctx: *mut u8,
        len: usize,
        budget: u64,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        self.count();
        // SAFETY: forwarded; `pin` is held, so `current` outlives the run.
        unsafe { self.current().run_own_code(ctx, len, budget, pin) }
    }
}

impl Drop for Tiering {
    fn drop(&mut self) {
        // `release` took the code; a program that never reached it (a panic between
        // `adapt`'s steps) still frees it after its own grace period.
        let cur = *self.current.get_mut();
        if !cur.is_null() {
            // SAFETY: the box `current` held, reachable from nothing else now.
            drop(unsafe { Box::from_raw(cur) });
        }
    }
}
