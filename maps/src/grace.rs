//! When a retired element may be reused: after the epoch's grace period, and after the
//! embedder's runs in progress then, if it registered them ([`set_run_grace`]).
//!
//! Host-side map calls pin the `crossbeam_epoch` collector; a program run need not. A pin
//! costs a fenced read-modify-write per run, which is most of what a short program's run
//! costs over calling its code (issue 43). So an embedder whose runs are tracked more
//! cheaply (packjit's run pins: two plain stores per run, the fence moved to the side that
//! frees) registers that tracking here, and every retired element then waits for both: the
//! epoch's grace period (host readers), then the runs that were in progress when it ended
//! (programs holding a value pointer). An element leaves its table before it is retired, so
//! a run that starts after the second wait began cannot reach it.

use std::sync::OnceLock;

/// An embedder's run tracking, as [`set_run_grace`] takes it.
#[derive(Clone, Copy, Debug)]
pub struct RunGrace {
    /// Queues a release until every run in progress now has ended.
    pub defer: fn(Box<dyn FnOnce() + Send>),
    /// Performs the queued releases whose runs have ended; never waits.
    pub collect: fn(),
    /// Whether the calling thread is inside a run: a map call from there must not wait for
    /// the runs to end (its own is one of them).
    pub inside_run: fn() -> bool,
}

static RUN_GRACE: OnceLock<RunGrace> = OnceLock::new();

/// Registers the embedder's run tracking, once per process (a second registration is
/// ignored and returns `false`). Register it before the first run that is not pinned to the
/// epoch: elements retired before are then still held through the runs (the second wait is
/// chosen when the epoch's ends, not when the element is retired).
pub fn set_run_grace(grace: RunGrace) -> bool {
    RUN_GRACE.set(grace).is_ok()
}

/// Defers `release` past the epoch's grace period and then the registered runs'.
pub(crate) fn defer_release(release: impl FnOnce() + Send + 'static) {
    let guard = crossbeam_epoch::pin();
    // Every reader that could still hold what `release` frees was pinned (or inside a run)
    // before this point; see the module doc for the runs.
    guard.defer(move || match RUN_GRACE.get() {
        Some(g) => (g.defer)(Box::new(release)),
        None => release(),
    });
    // To the global queue now: left in this thread's local bag, the release could wait for
    // as long as the thread stays idle.
    guard.flush();
    collect_runs();
}

/// Lets both waits advance: the epoch's, then the runs' (whose releases this performs when
/// their runs have ended).
pub(crate) fn advance() {
    crossbeam_epoch::pin().flush();
    collect_runs();
}

fn collect_runs() {
    if let Some(g) = RUN_GRACE.get() {
        (g.collect)();
    }
}

/// Whether a map call on this thread may wait for the grace periods: not from inside an
/// epoch pin or a run, which would wait for itself.
pub(crate) fn may_wait() -> bool {
    !crossbeam_epoch::is_pinned() && !RUN_GRACE.get().is_some_and(|g| (g.inside_run)())
}
