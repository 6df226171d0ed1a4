//! Relocation: JIT images are position-independent, so compaction may move them.
//!
//! Runs on whatever machine runs it, with that arch's backend (natively on x86-64, under
//! qemu-user for arm64 and RV64 in the cross test runs): a compiled image copied to another
//! address of the arena runs there with the same results and stops, and programs the arena
//! moves keep answering right (also while other threads run them), keep their symbols, and
//! are released exactly once.

mod host;

use host::{assert_listed_once, eager, insn, sized};

use packjit::{
    ArenaConfig, CodeArena, Compaction, Hook, LoadOptions, Program, Runtime, RuntimeConfig,
};
use packjit_plugin_api::abi;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

unsafe extern "C" fn add(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_add(b)
}

/// A runtime for this host with `compaction`.
fn runtime(compaction: Option<Compaction>) -> Runtime {
    let rt = host::host_runtime_with(RuntimeConfig {
        arena: ArenaConfig {
            compaction,
            ..ArenaConfig::default()
        },
        ..Default::default()
    });
    rt.register_helper(1, "add", add).unwrap();
    rt
}

/// Every kind of code reference a program makes: a loop (backward conditional branch), a
/// helper call, the inlined CPU-id built-in, a bpf-to-bpf call, `lddw`, context loads and
/// stores (sandbox checks with their stop path), and a conditional branch over `skip`
/// instructions (long enough for RV64's far form). Returns `12 * ctx[0] + 3`; writes
/// 0x1122334455667788 to ctx[8] and the CPU id to ctx[16].
fn everything(skip: usize) -> Vec<u8> {
    let mut v: Vec<[u8; 8]> = vec![
        insn(0xbf, 9, 1, 0, 0),                                          // mov r9, r1
        insn(0x79, 6, 9, 0, 0),                                          // ldxdw r6, [r9+0]
        insn(0xb7, 0, 0, 0, 0),                                          // mov r0, 0
        insn(0xb7, 7, 0, 0, 0),                                          // mov r7, 0
        insn(0x0f, 0, 6, 0, 0),                                          // add r0, r6
        insn(0x07, 7, 0, 0, 1),                                          // add r7, 1
        insn(0xa5, 7, 0, -3, 10),                                        // jlt r7, 10, -3
        insn(0xbf, 1, 0, 0, 0),                                          // mov r1, r0
        insn(0xb7, 2, 0, 0, 3),                                          // mov r2, 3
        insn(0x85, 0, 0, 0, 1),                                          // call 1 (add)
        insn(0xbf, 8, 0, 0, 0),                                          // mov r8, r0
        insn(0x85, 0, 0, 0, abi::PJ_HELPER_GET_SMP_PROCESSOR_ID as i32), // cpu id
        insn(0x7b, 9, 0, 16, 0),                                         // stxdw [r9+16], r0
    ];
    let call_at = v.len();
    v.push([0; 8]); // call local, patched below
    v.push(insn(0x0f, 0, 8, 0, 0)); // add r0, r8
    let lddw = 0x1122_3344_5566_7788u64;
    v.push(insn(0x18, 3, 0, 0, lddw as u32 as i32));
    v.push(insn(0, 0, 0, 0, (lddw >> 32) as u32 as i32));
    v.push(insn(0x7b, 9, 3, 8, 0)); // stxdw [r9+8], r3
    v.push(insn(0x15, 7, 0, skip as i16, 10)); // jeq r7, 10, +skip (always taken)
    for _ in 0..skip {
        v.push(insn(0x07, 0, 0, 0, 1000)); // add r0, 1000 (never runs)
    }
    v.push(insn(0x95, 0, 0, 0, 0)); // exit
    let sub = v.len();
    v.push(insn(0xbf, 0, 6, 0, 0)); // mov r0, r6
    v.push(insn(0x27, 0, 0, 0, 2)); // mul r0, 2
    v.push(insn(0x95, 0, 0, 0, 0)); // exit
    v[call_at] = insn(0x85, 0, 1, 0, (sub - call_at - 1) as i32);
    v.concat()
}

/// Runs the code at `entry` as `exec` would, with `p`'s regions: (r0, stop kind, stop pc).
///
/// # Safety
/// `entry` must be committed code compiled like `p`.
unsafe fn run_at(p: &Program, entry: u64, ctx: &mut [u8]) -> (u64, u32, u64) {
    let regions = p.regions();
    let mut env = abi::PjExecEnv {
        regions: regions.as_ptr() as u64,
        region_count: regions.len() as u64,
        ctx_start: ctx.as_ptr() as u64,
        ctx_end: ctx.as_ptr() as u64 + ctx.len() as u64,
        ctx_len: ctx.len() as u64,
        budget: u64::MAX,
        ..Default::default()
    };
    let _pin = packjit::arena::epoch_pin();
    // SAFETY: the caller's promise; `env` and `ctx` outlive the call.
    let f: packjit::PjProgramEntry = unsafe { std::mem::transmute(entry as usize) };
    // SAFETY: as above.
    let r0 = unsafe { f(ctx.as_mut_ptr(), ctx.len() as u64, &mut env) };
    (r0, env.stop_kind, env.stop_pc)
}

#[test]
fn a_compiled_image_runs_from_a_copy_elsewhere_in_the_arena() {
    let rt = runtime(None);
    let arena = rt.arena().unwrap().clone();
    use packjit::Budget::{Limit, Unlimited};
    for (skip, budget) in [(0, Unlimited), (3000, Unlimited), (10, Limit(1_000_000))] {
        let opts = LoadOptions {
            budget,
            ..Default::default()
        };
        let p = rt.load(&everything(skip), &opts).unwrap();
        let code = p.code();
        assert_eq!(code.len(), p.code_size());
        // A region elsewhere: a spacer first, so the copy cannot land at the same offset
        // modulo any page or pack boundary the code might (wrongly) depend on.
        let spacer = arena.alloc(4096 + 64 * 7).unwrap();
        let copy = arena.alloc(code.len()).unwrap();
        arena.write(&copy, 0, &code).unwrap();
        arena.commit();
        assert_ne!(copy.exec_addr, p.region().exec_addr);
        let entry = copy.exec_addr + (p.entry_addr() - p.region().exec_addr);
        for x in [0u64, 1, 77, u64::MAX / 24] {
            let mut a = [0u8; 24];
            a[..8].copy_from_slice(&x.to_le_bytes());
            let mut b = a;
            let want = p.call(&mut a).unwrap();
            assert_eq!(want, x.wrapping_mul(12).wrapping_add(3), "skip {skip}");
            // SAFETY: a committed copy of `p`'s code.
            let (r0, stop, _) = unsafe { run_at(&p, entry, &mut b) };
            assert_eq!(
                (r0, stop),
                (want, abi::PJ_STOP_NONE),
                "copy, skip {skip}, x {x}"
            );
            assert_eq!(a[8..16], b[8..16], "lddw store from the copy");
            assert!(
                u64::from_le_bytes(b[16..24].try_into().unwrap()) < 4096,
                "cpu id"
            );
        }
        // The sandbox's stop path from the copy: a context too short for the load at pc 1.
        let mut short = [0u8; 4];
        let e = p.call(&mut short).unwrap_err();
        // SAFETY: as above.
        let (_, stop, pc) = unsafe { run_at(&p, entry, &mut short) };
        assert_eq!(
            (stop, Some(pc as usize)),
            (abi::PJ_STOP_OUT_OF_BOUNDS, e.pc())
        );
        arena.free(&copy);
        arena.free(&spacer);
    }
}

/// Compacts until nothing more moves (old copies reclaimed between steps).
fn compact_fully(rt: &Runtime) -> usize {
    let mut moved = 0;
    for _ in 0..100 {
        assert_eq!(rt.reclaim(), 0);
        let m = rt.compact(usize::MAX);
        if m == 0 {
            break;
        }
        moved += m;
    }
    assert_eq!(rt.reclaim(), 0);
    moved
}

#[test]
fn compaction_moves_programs_which_keep_their_answers_code_and_symbols() {
    let rt = runtime(None);
    let dir = std::env::temp_dir().join(format!("packjit-reloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let map = dir.join("perf.map");
    rt.enable_perf_map_at(&map).unwrap();
    let mut progs: Vec<(Program, i32, Vec<u8>)> = (0..60)
        .map(|i| {
            let n = 2 + (i * 37) % 400;
            let p = rt
                .load(&sized(n, i as i32 + 1), &Default::default())
                .unwrap();
            let code = p.code();
            (p, i as i32 + 1, code)
        })
        .collect();
    // Holes all over the pack for compaction to fill.
    host::drop_every_other(&mut progs);
    assert_eq!(rt.reclaim(), 0);
    let before = rt.stats();
    assert!(before.fragmentation_permille > 0, "{before:?}");
    let was: Vec<u64> = progs.iter().map(|(p, ..)| p.entry_addr()).collect();
    rt.arena().unwrap().set_compaction(eager());
    let moved = compact_fully(&rt);
    let after = rt.stats();
    assert!(moved > 0 && after.moves > 0, "{after:?}");
    assert!(
        after.fragmentation_permille < before.fragmentation_permille,
        "{} -> {}",
        before.fragmentation_permille,
        after.fragmentation_permille
    );
    let now: Vec<u64> = progs.iter().map(|(p, ..)| p.entry_addr()).collect();
    let n_moved = was.iter().zip(&now).filter(|(a, b)| a != b).count();
    assert!(n_moved > 0);
    println!(
        "moved {n_moved} of {} programs ({moved} bytes); fragmentation {} -> {} per mille",
        progs.len(),
        before.fragmentation_permille,
        after.fragmentation_permille
    );
    for (p, k, code) in &progs {
        assert_eq!(p.call(&mut []).unwrap(), *k as u64, "{p:?}");
        assert_eq!(&p.code(), code, "same bytes at the new place");
        let s = rt.symbolize(p.entry_addr() + 1).unwrap();
        assert_eq!((s.id, s.start, s.offset), (p.id(), p.entry_addr(), 1));
    }
    // Old copies are gone from the index and the perf map once reclaimed; every live program
    // is listed exactly once, at its current address.
    // (Another moved program may now start at a freed old address: it is listed there under
    // its own id.)
    for ((p, ..), (a, b)) in progs
        .iter()
        .zip(was.iter().zip(&now))
        .filter(|(_, (a, b))| a != b)
    {
        if let Some(s) = rt.symbolize(*a) {
            assert_ne!(
                s.id,
                p.id(),
                "{p:?} still listed at its old address {a:#x} (now {b:#x})"
            );
        }
    }
    assert_listed_once(&rt, progs.iter().map(|(p, ..)| p), &map);
    drop(progs);
    assert_eq!(rt.reclaim(), 0);
    let end = rt.stats();
    assert_eq!((end.packs, end.allocations, rt.live_programs()), (0, 0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_whose_raw_entry_was_handed_out_is_pinned() {
    let rt = runtime(eager());
    // Shrinking sizes: the last (movable) program fits the holes the earlier ones leave.
    let progs: Vec<Program> = (0..20)
        .map(|i| {
            rt.load(&sized(2 + (20 - i) * 29, 5), &Default::default())
                .unwrap()
        })
        .collect();
    let mut keep = Vec::new();
    let mut pinned = Vec::new();
    for (i, p) in progs.into_iter().enumerate() {
        match i % 3 {
            0 => drop(p),
            1 => keep.push(p),
            _ => {
                let f = p.entry().unwrap();
                assert!(!p.is_movable());
                pinned.push((p, f as usize as u64));
            }
        }
    }
    compact_fully(&rt);
    let st = rt.stats();
    assert!(st.moves > 0, "{st:?}");
    for (p, addr) in &pinned {
        assert_eq!(p.entry_addr(), *addr, "pinned code stays");
        assert_eq!(p.call(&mut []).unwrap(), 5);
    }
    for p in &keep {
        assert!(p.is_movable());
        assert_eq!(p.call(&mut []).unwrap(), 5);
    }
}

#[test]
fn moves_under_threads_running_the_programs_lose_no_run() {
    // Hooks run by 3 threads while the main thread keeps replacing programs (making holes)
    // and compacting: every run must return its hook's value, whichever copy it ran.
    let rt = runtime(eager());
    let hooks: Vec<Hook> = (0..8).map(|_| Hook::new()).collect();
    let seed = 0x5eed_u64;
    println!("seed {seed:#x}");
    let mut rng = seed;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for (i, h) in hooks.iter().enumerate() {
        h.attach(
            rt.load(
                &sized(2 + (next() % 300) as usize, i as i32 + 1),
                &Default::default(),
            )
            .unwrap(),
        )
        .unwrap();
    }
    let stop = AtomicBool::new(false);
    let runs = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..3 {
            let (hooks, stop, runs) = (&hooks, &stop, &runs);
            s.spawn(move || {
                let mut i = t;
                while !stop.load(Relaxed) {
                    let h = i % hooks.len();
                    let r = hooks[h].run(&mut []).unwrap().unwrap();
                    assert_eq!(r, h as u64 + 1, "hook {h}");
                    runs.fetch_add(1, Relaxed);
                    i += 1;
                }
            });
        }
        // The moves start once the runners are running (a loaded machine may start them late).
        while runs.load(Relaxed) < 3 {
            std::thread::yield_now();
        }
        let mut spare: Vec<Program> = Vec::new();
        for round in 0..300 {
            let h = (next() % hooks.len() as u64) as usize;
            let p = rt
                .load(
                    &sized(2 + (next() % 400) as usize, h as i32 + 1),
                    &Default::default(),
                )
                .unwrap();
            hooks[h].attach(p).unwrap();
            // Programs that come and go beside them keep making holes.
            spare.push(
                rt.load(&sized(2 + (next() % 200) as usize, 9), &Default::default())
                    .unwrap(),
            );
            if spare.len() > 20 {
                spare.swap_remove((next() % spare.len() as u64) as usize);
            }
            if round % 10 == 0 {
                // Freed code becomes holes only once released.
                rt.reclaim();
                rt.compact(1 << 20);
            }
        }
        // Drop the spare programs (holes) and compact while the threads still run.
        spare.clear();
        for _ in 0..50 {
            rt.reclaim();
            if rt.compact(1 << 20) == 0 {
                break;
            }
        }
        stop.store(true, Relaxed);
    });
    let st = rt.stats();
    println!("{} runs, {} moves", runs.load(Relaxed), st.moves);
    assert!(st.moves > 0, "{st:?}");
    assert!(runs.load(Relaxed) > 0);
    drop(hooks);
    assert_eq!(rt.reclaim(), 0);
}
