//! A freed program's code goes with its handle: `packjit_program_free` defers dropping the
//! handle by one epoch grace period, and runs of a handle pin before touching it, so once
//! that period has ended no thread can be in the code either. The handle's deferred drop
//! hands the code straight back (`Program::drop_after_own_grace`) instead of deferring it a
//! second time behind one more flush.
//!
//! A binary of its own: the epoch advances only when no thread holds an older pin, and other
//! tests' threads would hold some at random.

mod common;
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;
use common::{check, host_runtime, load, run, sized};
use packjit::*;

fn allocations(rt: *mut PackjitRuntime) -> u64 {
    let mut s = PackjitArenaStats {
        struct_size: std::mem::size_of::<PackjitArenaStats>() as u32,
        ..Default::default()
    };
    // SAFETY: live runtime; struct_size set.
    check(
        unsafe { packjit_runtime_stats(rt, &mut s) },
        "packjit_runtime_stats",
    );
    s.allocations
}

#[test]
fn the_next_free_releases_the_code_of_the_one_before() {
    let rt = host_runtime();
    let (p, q, r) = (
        load(rt, &sized(40, 1)),
        load(rt, &sized(40, 2)),
        load(rt, &sized(40, 3)),
    );
    assert_eq!((run(p), run(q), run(r)), (1, 2, 3));
    assert_eq!(allocations(rt), 3);
    // A thread's first epoch pin (and every 128th) tries to advance the epoch itself, and
    // then the flush in the same call cannot: runs used to take this thread's first pin,
    // but they hold a run pin now, so take it here, away from the frees.
    packjit_epoch_enter();
    packjit_epoch_exit();
    // Each free's flush advances the epoch one step; a deferral runs two steps after it was
    // queued. So q's free ends p's handle's grace period, and p's code goes with it. With a
    // second deferral for the code it would still be allocated here.
    // SAFETY: live programs, each freed once.
    unsafe { packjit_program_free(p) };
    assert_eq!(allocations(rt), 3);
    // SAFETY: as above.
    unsafe { packjit_program_free(q) };
    assert_eq!(
        allocations(rt),
        2,
        "p's code outlived its handle's grace period"
    );
    assert_eq!(run(r), 3);
    // SAFETY: as above.
    unsafe { packjit_program_free(r) };
    let mut pending = 1;
    // SAFETY: live runtime; valid out pointer.
    check(
        unsafe { packjit_reclaim(rt, &mut pending) },
        "packjit_reclaim",
    );
    assert_eq!((pending, allocations(rt)), (0, 0));
    // SAFETY: live runtime, destroyed once.
    unsafe { packjit_runtime_destroy(rt) };
}
