//! Loads end the grace periods of compaction's old copies. A moved program's old copy keeps
//! the free runs on either side of it apart until it is released, and only epoch flushes end
//! grace periods: frees flush, and a load flushes while old copies wait, so a run of loads
//! with no free among them releases them too.
//!
//! A binary of its own: a grace period ends only when no thread of the process holds a pin
//! from before it, and other tests' threads running programs would hold one at random (and
//! their flushes would end this test's grace periods for it).

mod host;

use host::{drop_every_other, sized};
use packjit::{ArenaConfig, Compaction, RuntimeConfig};

#[test]
fn loads_alone_release_the_old_copies_of_moved_programs() {
    // Code moves only in `compact` calls: loads and frees move nothing themselves.
    let rt = host::host_runtime_with(RuntimeConfig {
        arena: ArenaConfig {
            compaction: Some(Compaction {
                threshold_permille: 0,
                step_bytes: 0,
            }),
            ..ArenaConfig::default()
        },
        ..Default::default()
    });
    let mut progs: Vec<_> = (0..40)
        .map(|i| {
            let k = i as i32 + 1;
            (
                rt.load(&sized(2 + (i * 37) % 400, k), &Default::default())
                    .unwrap(),
                k,
            )
        })
        .collect();
    drop_every_other(&mut progs);
    assert_eq!(rt.reclaim(), 0);
    let moved = rt.compact(1 << 20);
    let s = rt.stats();
    assert!(moved > 0 && s.pending_frees > 0, "nothing moved: {s:?}");
    let mut loaded = Vec::new();
    while rt.stats().pending_frees > 0 && loaded.len() < 8 {
        loaded.push(rt.load(&sized(2, 7), &Default::default()).unwrap());
    }
    let s = rt.stats();
    assert_eq!(
        s.pending_frees,
        0,
        "old copies still waiting after {} loads: {s:?}",
        loaded.len()
    );
    for (p, k) in &progs {
        assert_eq!(p.call(&mut []).unwrap(), *k as u64);
    }
    for p in &loaded {
        assert_eq!(p.call(&mut []).unwrap(), 7);
    }
}
