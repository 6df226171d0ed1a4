//! Frees and hook swaps take a compaction step: code moves into the holes they themselves
//! release, with no load after them, and the symbol index and perf map follow the moves.
//!
//! A binary of its own, its tests one at a time: they end grace periods by flushing the
//! epoch, which only works when no other thread of the process holds a pin. In a shared test
//! binary, another test's threads running programs can stay pinned across all the flushes.

mod host;

use host::{assert_listed_once, eager, sized};
use packjit::{ArenaConfig, Hook, HookBatch, Program, Runtime, RuntimeConfig};
use std::sync::Mutex;

/// Held by each test: one at a time (see above).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A runtime whose arena compacts at any fragmentation, with room for a whole step.
fn eager_runtime() -> Runtime {
    host::host_runtime_with(RuntimeConfig {
        arena: ArenaConfig {
            compaction: eager(),
            ..ArenaConfig::default()
        },
        ..Default::default()
    })
}

#[test]
fn frees_move_code_into_the_holes_they_release_and_symbols_follow() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Frees that find chunks released take a compaction step, at any fragmentation.
    let rt = eager_runtime();
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

#[test]
fn hook_swaps_move_code_into_the_holes_they_release() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A host that retires code only through hooks: nothing is freed through a `Program` drop
    // and no load follows the detaches, so only the swaps can move code.
    let rt = eager_runtime();
    let hooks: Vec<(Hook, u64)> = (0..60)
        .map(|i| {
            let hook = Hook::new();
            let n = 2 + (i * 37) % 400;
            let prog = rt
                .load(&sized(n, i as i32 + 1), &Default::default())
                .unwrap();
            hook.attach(prog).unwrap();
            (hook, i as u64 + 1)
        })
        .collect();
    let before = rt.stats().moves;
    // Every other hook detaches; the flushes before each end the earlier detaches' grace
    // periods (as program runs' pins would), and the detach releases those chunks.
    for (hook, _) in hooks.iter().step_by(2) {
        for _ in 0..4 {
            packjit::arena::epoch_pin().flush();
        }
        hook.detach();
    }
    let by_swaps = rt.stats().moves - before;
    assert!(by_swaps > 0, "hook swaps moved nothing: {:?}", rt.stats());
    for (hook, answer) in hooks.iter().skip(1).step_by(2) {
        assert_eq!(hook.run(&mut []).unwrap().unwrap(), *answer);
    }
    for (hook, _) in &hooks {
        hook.detach();
    }
    assert_eq!(rt.reclaim(), 0);
    let end = rt.stats();
    assert_eq!((end.packs, end.allocations, rt.live_programs()), (0, 0, 0));
}

#[test]
fn hook_batches_compact_within_their_one_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = eager_runtime();
    let dir = std::env::temp_dir().join(format!("packjit-reloc-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let map = dir.join("perf.map");
    rt.enable_perf_map_at(&map).unwrap();
    let hooks: Vec<Hook> = (0..60).map(|_| Hook::new()).collect();
    let mut batch = HookBatch::new();
    for (i, hook) in hooks.iter().enumerate() {
        let n = 2 + (i * 37) % 400;
        batch
            .load_attach(&rt, hook, &sized(n, i as i32 + 1), &Default::default())
            .unwrap();
    }
    batch.apply();
    let before = rt.stats();
    // Each round replaces half the hooks' programs with 2-instruction ones: the old ones
    // leave holes once their grace period ends (the flushes), and the next batch's commit
    // moves code into them.
    const ROUNDS: usize = 6;
    for round in 0..ROUNDS {
        for _ in 0..4 {
            packjit::arena::epoch_pin().flush();
        }
        let mut batch = HookBatch::new();
        for (i, hook) in hooks.iter().enumerate().skip(round % 2).step_by(2) {
            let k = (1000 * (round + 1) + i) as i32;
            batch
                .load_attach(&rt, hook, &sized(2, k), &Default::default())
                .unwrap();
        }
        assert_eq!(batch.apply(), 30);
    }
    let after = rt.stats();
    assert_eq!(
        after.commits - before.commits,
        ROUNDS as u64,
        "one commit per batch, moves included"
    );
    assert!(
        after.moves > before.moves,
        "batches moved nothing: {after:?}"
    );
    for (i, hook) in hooks.iter().enumerate() {
        let round = if i % 2 == (ROUNDS - 1) % 2 {
            ROUNDS
        } else {
            ROUNDS - 1
        };
        assert_eq!(
            hook.run(&mut []).unwrap().unwrap(),
            (1000 * round + i) as u64
        );
    }
    // Once every replaced program (moved ones among them) is released, the index and the
    // perf map list exactly the attached programs: each batch unlisted what it replaced, at
    // the address it had then.
    assert_eq!(rt.reclaim(), 0);
    let mut attached: Vec<(u64, String)> = hooks.iter().map(|h| h.attached().unwrap()).collect();
    attached.sort();
    let mut listed: Vec<(u64, String)> = rt
        .symbols()
        .iter()
        .map(|s| (s.id, s.name.to_string()))
        .collect();
    listed.sort();
    assert_eq!(listed, attached);
    let mut mapped: Vec<String> = std::fs::read_to_string(&map)
        .unwrap()
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    mapped.sort();
    let mut names: Vec<String> = attached.into_iter().map(|(_, n)| n).collect();
    names.sort();
    assert_eq!(mapped, names);
    for hook in &hooks {
        hook.detach();
    }
    assert_eq!(rt.reclaim(), 0);
    let end = rt.stats();
    assert_eq!((end.packs, end.allocations, rt.live_programs()), (0, 0, 0));
    assert_eq!(std::fs::read_to_string(&map).unwrap(), "");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tail_calls_follow_targets_that_compaction_moved() {
    use packjit::maps::{Map, MapSpec, MapType};
    use packjit::LoadOptions;
    use std::sync::Arc;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = eager_runtime();
    let jumps = Map::new(MapSpec {
        name: "jumps".into(),
        map_type: MapType::ProgArray,
        key_size: 4,
        value_size: 4,
        max_entries: 40,
        flags: 0,
    })
    .unwrap();
    let opts = LoadOptions {
        maps: vec![jumps.clone()],
        ..Default::default()
    };
    let i = |op, dst, src, off, imm| packjit_frontend::encode_insn(op, dst, src, off, imm).to_vec();
    let map_ref = |dst| [i(0x18, dst, 1, 0, 0), i(0, 0, 0, 0, 0)].concat();
    // Tail calls slot mem[0]: inline (the prog array proven at the call), or through the
    // host's chooser (a jump lands between the `lddw` and the call).
    let caller = |form: usize| {
        let mut code = [i(0x71, 3, 1, 0, 0), map_ref(2)].concat();
        if form == 1 {
            code.extend(i(0x05, 0, 0, 0, 0));
        }
        [
            code,
            i(0x85, 0, 0, 0, 12),
            i(0xb7, 0, 0, 0, -1),
            i(0x95, 0, 0, 0, 0),
        ]
        .concat()
    };
    let callers = [
        rt.load(&caller(0), &opts).unwrap(),
        rt.load(&caller(1), &opts).unwrap(),
    ];
    // Fillers and targets interleaved; freeing the fillers moves the targets down.
    let mut fillers = Vec::new();
    let mut targets = Vec::new();
    for k in 0..40u32 {
        fillers.push(rt.load(&sized(2 + (k as usize * 37) % 300, 1), &Default::default()));
        // Odd slots: programs with the uniform tail-call frame (they have a tail call, never
        // made: a constant index past the end), entered past their saves through the address
        // the runtime keeps in the slot's target and must move with the code.
        let mut code = sized(3 + k as usize, 1000 + k as i32);
        if k % 2 == 1 {
            code = [i(0xb7, 3, 0, 0, 77), map_ref(2), i(0x85, 0, 0, 0, 12), code].concat();
        }
        let t = Arc::new(rt.load(&code, &opts).unwrap());
        rt.set_prog_array(&jumps, k, Some(t.clone())).unwrap();
        targets.push(t);
    }
    let before: Vec<u64> = targets.iter().map(|t| t.entry_addr()).collect();
    for f in fillers {
        for _ in 0..4 {
            packjit::arena::epoch_pin().flush();
        }
        drop(f);
    }
    let moved = |parity| {
        (targets.iter().zip(&before).enumerate())
            .filter(|&(k, (t, &b))| k % 2 == parity && t.entry_addr() != b)
            .count()
    };
    assert!(moved(0) > 0, "no plain target moved: {:?}", rt.stats());
    assert!(moved(1) > 0, "no uniform target moved: {:?}", rt.stats());
    // The old copies are released; each tail call must reach the copy where it is now.
    for _ in 0..4 {
        packjit::arena::epoch_pin().flush();
    }
    rt.reclaim();
    for (how, c) in callers.iter().enumerate() {
        for k in 0..40u8 {
            let r0 = c.call(&mut [k]).unwrap();
            assert_eq!(r0, 1000 + u64::from(k), "caller {how}, slot {k}");
        }
    }
}
