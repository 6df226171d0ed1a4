//! Frees take a compaction step: code moves into the holes the frees themselves release,
//! with no load after them, and the symbol index and perf map follow the moves.
//!
//! A binary of its own: the test ends grace periods by flushing the epoch, which only works
//! when no other thread of the process holds a pin. In a shared test binary, another test's
//! threads running programs can stay pinned across all the flushes.

mod host;

use host::{assert_listed_once, eager, sized};
use packjit::{ArenaConfig, Program, RuntimeConfig};

#[test]
fn frees_move_code_into_the_holes_they_release_and_symbols_follow() {
    // Compaction steps in every commit and in frees that release chunks.
    let rt = host::host_runtime_with(RuntimeConfig {
        arena: ArenaConfig {
            compaction: eager(),
            ..ArenaConfig::default()
        },
    });
    let dir = std::env::temp_dir().join(format!("packjit-reloc-free-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let map = dir.join("perf.map");
    rt.enable_perf_map_at(&map).unwrap();
    let mut progs: Vec<(Program, u64)> = (0..60)
        .map(|i| {
            let n = 2 + (i * 37) % 400;
            let p = rt
                .load(&sized(n, i as i32 + 1), &Default::default())
                .unwrap();
            (p, i as u64 + 1)
        })
        .collect();
    let before = rt.stats().moves;
    // Every other program goes, with no load after: whatever moves, moves in the frees. The
    // flushes before each free end the earlier frees' grace periods (as program runs' pins
    // would); the free releases those chunks and fills the holes.
    let mut i = 0;
    progs.retain(|_| {
        i += 1;
        if i % 2 == 1 {
            for _ in 0..4 {
                packjit::arena::epoch_pin().flush();
            }
        }
        i % 2 == 0
    });
    let by_frees = rt.stats().moves - before;
    assert!(by_frees > 0, "frees moved nothing: {:?}", rt.stats());
    assert_eq!(rt.reclaim(), 0);
    for (p, answer) in &progs {
        assert_eq!(p.call(&mut []).unwrap(), *answer, "{p:?}");
        let s = rt.symbolize(p.entry_addr() + 1).unwrap();
        assert_eq!((s.id, s.start, s.offset), (p.id(), p.entry_addr(), 1));
    }
    assert_listed_once(&rt, progs.iter().map(|(p, _)| p), &map);
    drop(progs);
    assert_eq!(rt.reclaim(), 0);
    let end = rt.stats();
    assert_eq!((end.packs, end.allocations, rt.live_programs()), (0, 0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}
