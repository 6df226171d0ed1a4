//! Adaptive tiering (`Tier::Adaptive`) on the machine the test runs on: natively on x86-64,
//! under qemu-user in the aarch64 and riscv64 cross runs.
//!
//! * Differential: every conformance case and `PACKJIT_DIFF_COUNT` random programs (default
//!   1000 natively on x86-64, 200 under qemu; seeds from `PACKJIT_DIFF_SEED`, default
//!   0x7e1e0000, printed) run on the baseline, again right after the tier-up was asked for
//!   (either tier may answer), and after it: the three runs must agree with each other
//!   (r0 and context), and the last with the reference.
//! * Stress: 4 threads call programs and hooks while the main thread loads, replaces and
//!   frees them as they tier up; no wrong answer, and all code released at the end. The same
//!   for programs with maps (array, hash and per-CPU lookups), each tier's code bound to the
//!   same maps.

use packjit::{
    Budget, Hook, LoadOptions, Program, Runtime, RuntimeConfig, Tier, TierPolicy, TierStatus,
    TieringConfig,
};
use packjit_plugin_api::Arch;
use packjit_testkit::conformance::{
    ensure_suite_helper, load_suite, run_cases, suite_dir, Engine, Loaded,
};
use packjit_testkit::gen::{check_seed, helpers, Checked};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

fn adaptive() -> LoadOptions {
    LoadOptions {
        tier: Tier::Adaptive,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    }
}

fn runtime(policy: TierPolicy) -> Runtime {
    Runtime::with_config(RuntimeConfig {
        tiering: TieringConfig {
            policy,
            ..TieringConfig::default()
        },
        ..RuntimeConfig::default()
    })
    .unwrap()
}

/// Trusted adaptive loads (manual policy) whose every run is three: before, during and
/// after the tier-up.
struct ThreeRuns<'r>(&'r Runtime);

struct ThreeRunsLoaded(Program);

impl Engine for ThreeRuns<'_> {
    fn label(&self) -> String {
        format!(
            "{} adaptive (baseline, during, optimized), trusted",
            Arch::host().unwrap()
        )
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        // SAFETY: the suite's programs and the generator's stay inside their context and
        // stack (both are checked against the reference, which runs them in bounds).
        let p = unsafe { self.0.load_trusted(code, &adaptive()) }.map_err(|e| e.to_string())?;
        Ok(Box::new(ThreeRunsLoaded(p)))
    }
}

impl Loaded for ThreeRunsLoaded {
    fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
        let p = &self.0;
        let once = |m: &mut Vec<u8>| p.call(m).map_err(|e| e.to_string());
        let (mut before, mut during) = (mem.to_vec(), mem.to_vec());
        if p.tier_status() != TierStatus::Baseline {
            return Some(Err(format!("loaded as {:?}", p.tier_status())));
        }
        let r_before = once(&mut before);
        p.request_tier_up();
        let r_during = once(&mut during);
        match p.wait_tier_up() {
            TierStatus::Optimized => {}
            other => return Some(Err(format!("tier-up ended {other:?}"))),
        }
        if p.tier() != Tier::Optimized {
            return Some(Err("tier() is not Optimized after the tier-up".into()));
        }
        let mut after = mem.to_vec();
        let r_after = once(&mut after);
        if (&r_before, &before) != (&r_after, &after) || (&r_during, &during) != (&r_after, &after)
        {
            return Some(Err(format!(
                "tiers disagree: baseline {r_before:?}, during {r_during:?}, optimized {r_after:?} \
                 (contexts equal: {}, {})",
                before == after,
                during == after
            )));
        }
        mem.copy_from_slice(&after);
        Some(r_after)
    }
}

#[test]
fn conformance_suite_before_during_and_after_tier_up() {
    let rt = runtime(TierPolicy::Manual);
    ensure_suite_helper(&rt).unwrap();
    let cases = load_suite(&suite_dir()).expect("conformance suite");
    let s = run_cases(&ThreeRuns(&rt), &cases, &[]);
    packjit_testkit::report(&s.to_string());
    assert_eq!(s.failed, 0, "{}", s.report());
    assert_eq!(s.compile_only, 0, "every case must run natively");
    assert!(s.passed >= 350, "only {} passed: {}", s.passed, s.report());
}

#[test]
fn random_programs_agree_across_the_tier_up() {
    let rt = runtime(TierPolicy::Manual);
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    let emulated = !cfg!(target_arch = "x86_64");
    let count =
        packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(if emulated { 200 } else { 1000 });
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x7e1e_0000);
    let engine = ThreeRuns(&rt);
    for seed in base..base + count {
        match check_seed(&engine, seed) {
            Ok(Checked::Agree { .. }) => {}
            Ok(Checked::CompiledOnly { .. }) => panic!("seed {seed:#x}: native code did not run"),
            Err(m) => panic!("adaptive tier-up: {m}"),
        }
    }
    packjit_testkit::report(&format!(
        "adaptive differential ({}): seeds {base:#x}..{:#x}: {count} programs agreed before, during and after their tier-up, and with the reference",
        Arch::host().unwrap(),
        base + count
    ));
}

#[test]
fn a_hot_program_tiers_up_on_its_own_and_what_the_tier_refuses_stays_baseline() {
    let rt = runtime(TierPolicy::Calls(50));
    // r0 = ctx[0] + 1
    let code = [
        0x71, 0x10, 0, 0, 0, 0, 0, 0, 0x07, 0, 0, 0, 1, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0,
    ];
    let perf_map = std::env::temp_dir().join(format!("packjit-tiering-{}.map", std::process::id()));
    rt.enable_perf_map_at(&perf_map).unwrap();
    // SAFETY: reads one byte of its context; every call passes one.
    let p = unsafe { rt.load_trusted(&code, &adaptive()) }.unwrap();
    let baseline_backend = p.backend_name().to_string();
    let baseline_entry = p.entry_addr();
    for i in 0..49u8 {
        assert_eq!(p.call(&mut [i]).unwrap(), u64::from(i) + 1);
        assert_eq!(p.tier_status(), TierStatus::Baseline, "call {i}");
    }
    assert_eq!(p.call(&mut [7]).unwrap(), 8);
    assert_eq!(p.wait_tier_up(), TierStatus::Optimized);
    assert_eq!(p.tier(), Tier::Optimized);
    assert_ne!(p.backend_name(), baseline_backend);
    assert_eq!(p.call(&mut [41]).unwrap(), 42);
    // The symbol index names the optimized code, under the program's name.
    let sym = rt
        .symbolize(p.entry_addr())
        .expect("optimized code is listed");
    assert_eq!(&*sym.name, p.name());
    // The baseline code is released after its grace period, and unlisted with it: the perf
    // map names the optimized code alone.
    assert_ne!(p.entry_addr(), baseline_entry);
    assert_eq!(rt.reclaim(), 0);
    assert_eq!(rt.live_programs(), 1);
    assert!(rt.symbolize(baseline_entry).is_none());
    let map = std::fs::read_to_string(&perf_map).unwrap();
    let lines: Vec<&str> = map.lines().filter(|l| l.ends_with(p.name())).collect();
    assert_eq!(lines.len(), 1, "{map}");
    let start = u64::from_str_radix(lines[0].split(' ').next().unwrap(), 16).unwrap();
    assert_eq!(start, p.entry_addr(), "{map}");
    let _ = std::fs::remove_file(&perf_map);

    // Sandboxed: the optimizing tier does not take it; it loads and stays on the baseline.
    let s = rt.load(&code, &adaptive()).unwrap();
    match s.tier_status() {
        TierStatus::Refused(e) => assert!(e.to_string().contains("sandboxed"), "{e}"),
        other => panic!("{other:?}"),
    }
    for _ in 0..200 {
        assert_eq!(s.call(&mut [1]).unwrap(), 2);
    }
    assert_eq!(s.tier(), Tier::Baseline);
    assert_eq!(s.request_tier_up(), s.tier_status());
}

#[test]
fn an_entry_handed_out_settles_the_program() {
    let rt = runtime(TierPolicy::Manual);
    let code = [0xb7, 0, 0, 0, 9, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: touches no memory.
    let p = unsafe { rt.load_trusted(&code, &adaptive()) }.unwrap();
    let entry = p.entry().unwrap();
    assert_eq!(p.tier_status(), TierStatus::Settled);
    assert_eq!(p.request_tier_up(), TierStatus::Settled);
    // The code stays where the entry points.
    assert_eq!(entry as usize as u64, p.entry_addr());
    assert_eq!(p.call(&mut []).unwrap(), 9);
}

/// `ldxdw r2, [r1]; r0 = 0 (via variant v); r3 = n; loop { r4 = r2 + k; r0 += r4; r3 -= 1 }`:
/// `n * (x + k)` for every variant, each variant different code.
fn stress_program(k: u32, v: u32) -> Vec<u8> {
    let n = k + 8;
    let insn = |op: u8, regs: u8, off: i16, imm: u32| {
        let mut b = vec![op, regs];
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&imm.to_le_bytes());
        b
    };
    [
        insn(0x79, 0x12, 0, 0),        // ldxdw r2, [r1 + 0]
        insn(0xb7, 0x00, 0, v),        // mov r0, v
        insn(0x17, 0x00, 0, v),        // sub r0, v
        insn(0xb7, 0x03, 0, n),        // mov r3, n
        insn(0xbf, 0x24, 0, 0),        // loop: mov r4, r2
        insn(0x07, 0x04, 0, k),        // add r4, k
        insn(0x0f, 0x40, 0, 0),        // add r0, r4
        insn(0x07, 0x03, 0, u32::MAX), // add r3, -1
        insn(0x55, 0x03, -5, 0),       // jne r3, 0, loop
        insn(0x95, 0, 0, 0),           // exit
    ]
    .concat()
}

fn stress_want(k: u32, x: u64) -> u64 {
    u64::from(k + 8).wrapping_mul(x.wrapping_add(u64::from(k)))
}

/// A small xorshift, seeded per thread (the seed is printed).
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn four_threads_call_programs_and_hooks_while_they_tier_up_and_are_freed() {
    const SLOTS: usize = 4;
    let emulated = !cfg!(target_arch = "x86_64");
    let rounds = packjit_testkit::env_u64("PACKJIT_STRESS_ROUNDS").unwrap_or(if emulated {
        60
    } else {
        300
    });
    let seed = packjit_testkit::env_u64("PACKJIT_STRESS_SEED").unwrap_or(0x5eed_7e1e);
    let rt = runtime(TierPolicy::Calls(20));
    let arena = rt.arena().expect("host arena").clone();
    let start = arena.stats();
    let programs: Arc<Vec<RwLock<Option<Arc<Program>>>>> =
        Arc::new((0..SLOTS).map(|_| RwLock::new(None)).collect());
    let hooks: Arc<Vec<Hook>> = Arc::new((0..SLOTS).map(|_| Hook::new()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let (runs, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (programs, hooks, stop) = (programs.clone(), hooks.clone(), stop.clone());
            let (runs, wrong) = (runs.clone(), wrong.clone());
            std::thread::spawn(move || {
                let mut s = seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                while !stop.load(Relaxed) {
                    let k = (next(&mut s) % SLOTS as u64) as usize;
                    let x = next(&mut s);
                    let want = stress_want(k as u32, x);
                    let mut ctx = x.to_le_bytes();
                    let p = programs[k].read().unwrap().clone();
                    if let Some(p) = p {
                        runs.fetch_add(1, Relaxed);
                        if p.call(&mut ctx) != Ok(want) {
                            wrong.fetch_add(1, Relaxed);
                        }
                    }
                    let mut ctx = x.to_le_bytes();
                    if let Some(r) = hooks[k].run(&mut ctx) {
                        runs.fetch_add(1, Relaxed);
                        if r != Ok(want) {
                            wrong.fetch_add(1, Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let mut s = seed;
    let (mut optimized, mut dropped_pending, mut refused) = (0u64, 0u64, 0u64);
    let mut tally = |p: &Program| match p.tier_status() {
        TierStatus::Optimized => optimized += 1,
        TierStatus::Pending => dropped_pending += 1,
        TierStatus::Refused(_) => refused += 1,
        _ => {}
    };
    for round in 0..rounds {
        // Now and then a new policy: at load, soon, or only when asked.
        rt.set_tier_policy(match round % 4 {
            0 => TierPolicy::Calls(0),
            1 => TierPolicy::Calls(5),
            2 => TierPolicy::Calls(40),
            _ => TierPolicy::Manual,
        });
        for k in 0..SLOTS {
            let code = stress_program(k as u32, (next(&mut s) % 1000) as u32);
            let opts = adaptive();
            // One program in eight sandboxed: refused by the tier, stays baseline.
            let p = if next(&mut s) % 8 == 0 {
                rt.load(&code, &opts).unwrap()
            } else {
                // SAFETY: reads 8 bytes of its context; every caller passes 8.
                unsafe { rt.load_trusted(&code, &opts) }.unwrap()
            };
            if next(&mut s) % 3 == 0 {
                p.request_tier_up();
            }
            if next(&mut s) % 2 == 0 {
                let old = programs[k].write().unwrap().replace(Arc::new(p));
                if let Some(old) = old {
                    tally(&old);
                }
            } else {
                hooks[k].attach(p).unwrap();
            }
        }
        // Let the callers run the new programs for a moment (not a synchronisation: the
        // test's assertions do not depend on how long).
        std::thread::yield_now();
    }
    // At least one tier-up under the callers for certain, however slow the compiles (qemu):
    // a program they run, tiered up while they run it.
    // SAFETY: as in the rounds.
    let last = Arc::new(unsafe { rt.load_trusted(&stress_program(0, 1), &adaptive()) }.unwrap());
    if let Some(old) = programs[0].write().unwrap().replace(last.clone()) {
        tally(&old);
    }
    request_until_queued(&last);
    assert_eq!(last.wait_tier_up(), TierStatus::Optimized);
    drop(last);
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    for slot in programs.iter() {
        if let Some(p) = slot.write().unwrap().take() {
            tally(&p);
        }
    }
    for h in hooks.iter() {
        h.detach();
    }
    let (runs, wrong) = (runs.load(Relaxed), wrong.load(Relaxed));
    // Joins the compile threads (a compile under way finishes and is discarded).
    drop(rt);
    let pending = arena.reclaim();
    let end = arena.stats();
    packjit_testkit::report(&format!(
        "tiering stress ({}, seed {seed:#x}): {rounds} rounds, {runs} runs, {wrong} wrong; \
         programs freed optimized {optimized}, while pending {dropped_pending}, refused {refused}",
        Arch::host().unwrap()
    ));
    assert_eq!(wrong, 0, "seed {seed:#x}");
    assert!(runs > 0);
    assert!(optimized > 0, "no program tiered up");
    // One load in eight is sandboxed: 40 loads or more try one for all but 1 in 200 seeds.
    assert!(refused > 0 || rounds < 10, "no sandboxed program was tried");
    assert_eq!(pending, 0, "frees still pending");
    assert_eq!(end.allocations, start.allocations, "code left allocated");
    assert_eq!(end.bytes_used, start.bytes_used, "code left allocated");
}

/// A runtime dropped with tier-ups queued: its compile threads are joined, the queued
/// requests abandoned, and the programs, which outlive it, keep running whichever code they
/// had (settled on the baseline, or optimized by a compile that was under way).
#[test]
fn a_runtime_dropped_with_tier_ups_queued_leaves_its_programs_running() {
    let rt = Runtime::with_config(RuntimeConfig {
        tiering: TieringConfig {
            policy: TierPolicy::Calls(0),
            threads: 1,
            queue: 64,
        },
        ..RuntimeConfig::default()
    })
    .unwrap();
    let arena = rt.arena().expect("host arena").clone();
    let progs: Vec<Program> = (0..32u32)
        .map(|k| {
            let code = stress_program(k % 4, k);
            // SAFETY: reads 8 bytes of its context; every call passes 8.
            unsafe { rt.load_trusted(&code, &adaptive()) }.unwrap()
        })
        .collect();
    drop(rt);
    let (mut settled, mut optimized) = (0, 0);
    for (k, p) in progs.iter().enumerate() {
        match p.wait_tier_up() {
            TierStatus::Settled => settled += 1,
            TierStatus::Optimized => optimized += 1,
            other => panic!("program {k}: {other:?}"),
        }
        let x = 1000 + k as u64;
        assert_eq!(
            p.call(&mut x.to_le_bytes()),
            Ok(stress_want(k as u32 % 4, x))
        );
        // Settled for good: no request is queued any more.
        assert!(matches!(
            p.request_tier_up(),
            TierStatus::Settled | TierStatus::Optimized
        ));
    }
    packjit_testkit::report(&format!(
        "runtime dropped with 32 tier-ups queued: {optimized} optimized, {settled} settled"
    ));
    assert_eq!(settled + optimized, 32);
    drop(progs);
    assert_eq!(arena.reclaim(), 0);
    assert_eq!(arena.stats().allocations, 0);
}

/// A load's own policy wins over the runtime's.
#[test]
fn a_load_may_bring_its_own_policy() {
    let rt = runtime(TierPolicy::Manual);
    let code = [0xb7, 0, 0, 0, 5, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let opts = LoadOptions {
        tier_policy: Some(TierPolicy::Calls(3)),
        ..adaptive()
    };
    // SAFETY: touches no memory.
    let p = unsafe { rt.load_trusted(&code, &opts) }.unwrap();
    // SAFETY: as above.
    let q = unsafe { rt.load_trusted(&code, &adaptive()) }.unwrap();
    for _ in 0..3 {
        assert_eq!(p.call(&mut []), Ok(5));
        assert_eq!(q.call(&mut []), Ok(5));
    }
    assert_eq!(p.wait_tier_up(), TierStatus::Optimized);
    assert_eq!(q.wait_tier_up(), TierStatus::Baseline);
}

#[test]
fn adaptive_programs_in_a_prog_array_are_reached_on_the_code_they_settled_on() {
    use packjit::maps::{Map, MapSpec, MapType};
    use packjit_frontend::encode_insn as i;
    let rt = runtime(TierPolicy::Manual);
    let jumps = Map::new(MapSpec {
        name: "jumps".into(),
        map_type: MapType::ProgArray,
        key_size: 4,
        value_size: 4,
        max_entries: 2,
        flags: 0,
    })
    .unwrap();
    let opts = LoadOptions {
        maps: vec![jumps.clone()],
        ..LoadOptions::default()
    };
    // Tail calls slot ctx[0]; -1 when that fails.
    let caller = [
        i(0x71, 3, 1, 0, 0),
        i(0x18, 2, 1, 0, 0),
        i(0, 0, 0, 0, 0),
        i(0x85, 0, 0, 0, 12),
        i(0xb7, 0, 0, 0, -1),
        i(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // r0 = ctx[1] + 1; no maps, so the optimizing tier takes it.
    let target = [
        i(0x71, 0, 1, 1, 0),
        i(0x07, 0, 0, 0, 1),
        i(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // SAFETY: they read two bytes of their context; every call passes two.
    let (caller, early, late) = unsafe {
        (
            rt.load_trusted(&caller, &opts).unwrap(),
            Arc::new(rt.load_trusted(&target, &adaptive()).unwrap()),
            Arc::new(rt.load_trusted(&target, &adaptive()).unwrap()),
        )
    };
    // Optimized before it goes in a slot: its code (no uniform frame) is entered whole.
    late.request_tier_up();
    assert_eq!(late.wait_tier_up(), TierStatus::Optimized);
    rt.set_prog_array(&jumps, 1, Some(late.clone())).unwrap();
    // In a slot on the baseline: it stays there, so the slot's address stays good.
    rt.set_prog_array(&jumps, 0, Some(early.clone())).unwrap();
    early.request_tier_up();
    assert_eq!(early.wait_tier_up(), TierStatus::Settled);
    for round in 0..100u8 {
        for slot in 0..2u8 {
            let r0 = caller.call(&mut [slot, round]).unwrap();
            assert_eq!(r0, u64::from(round) + 1, "slot {slot}, round {round}");
        }
        assert_eq!(caller.call(&mut [2, round]).unwrap() as i64, -1);
    }
    for slot in 0..2 {
        rt.set_prog_array(&jumps, slot, None).unwrap();
    }
}

/// `x = *(u64 *)ctx; v = lookup(array, &(x & 3)); c = lookup(hash, &(x & 3)); r0 = *v + *c +
/// x`, and a per-CPU counter bumped: a program with maps of three kinds (the array lookup
/// inlined on both tiers, the hash lookup a call, the per-CPU lookup inlined by the baseline
/// and called by the optimizing tier). `v` picks one of four variants of the code.
fn map_program(v: u32) -> Vec<u8> {
    let insn = |op: u8, dst: u8, src: u8, off: i16, imm: i32| {
        packjit_frontend::encode_insn(op, dst, src, off, imm).to_vec()
    };
    let map = |dst: u8, k: i32| [insn(0x18, dst, 1, 0, k), insn(0, 0, 0, 0, 0)].concat();
    let lookup = |k: i32, key_off: i16| {
        [
            map(1, k),
            insn(0xbf, 2, 10, 0, 0),
            insn(0x07, 2, 0, 0, i32::from(key_off)),
            insn(0x85, 0, 0, 0, 1),
        ]
        .concat()
    };
    [
        insn(0x79, 7, 1, 0, 0),          // r7 = *(u64 *)(r1 + 0)
        insn(0xbf, 6, 7, 0, 0),          // r6 = r7
        insn(0x57, 6, 0, 0, 3),          // r6 &= 3
        insn(0x63, 10, 6, -4, 0),        // *(u32 *)(r10 - 4) = r6
        insn(0x62, 10, 0, -8, v as i32), // *(u32 *)(r10 - 8) = v (the per-CPU key)
        lookup(0, -4),                   // array
        insn(0x15, 0, 0, 21, 0),         // if r0 == 0 goto null
        insn(0x79, 8, 0, 0, 0),          // r8 = *v
        lookup(1, -4),                   // hash
        insn(0x15, 0, 0, 14, 0),         // if r0 == 0 goto null
        insn(0x79, 0, 0, 0, 0),          // r0 = *c
        insn(0x0f, 8, 0, 0, 0),          // r8 += r0
        insn(0x0f, 8, 7, 0, 0),          // r8 += r7
        lookup(2, -8),                   // per-CPU counter
        insn(0x15, 0, 0, 3, 0),          // if r0 == 0 goto out
        insn(0x79, 1, 0, 0, 0),          // r1 = *c
        insn(0x07, 1, 0, 0, 1),          // r1 += 1
        insn(0x7b, 0, 1, 0, 0),          // *c = r1
        insn(0xbf, 0, 8, 0, 0),          // out: r0 = r8
        insn(0x95, 0, 0, 0, 0),          // exit
        insn(0xb7, 0, 0, 0, -1),         // null: r0 = -1
        insn(0x95, 0, 0, 0, 0),          // exit
    ]
    .concat()
}

/// Programs with maps, trusted and adaptive, tier up while 4 threads call them (each tier's
/// code bound to the same maps), are replaced and freed: every answer right, and all code
/// released at the end.
#[test]
fn programs_with_maps_tier_up_under_four_threads_calling_them() {
    use packjit::maps::{Map, MapSpec, MapType};
    const SLOTS: usize = 3;
    let emulated = !cfg!(target_arch = "x86_64");
    let rounds = packjit_testkit::env_u64("PACKJIT_STRESS_ROUNDS").unwrap_or(if emulated {
        30
    } else {
        150
    });
    let seed = packjit_testkit::env_u64("PACKJIT_STRESS_SEED").unwrap_or(0x5eed_3a95);
    let spec = |name: &str, map_type, max_entries| MapSpec {
        name: name.into(),
        map_type,
        key_size: 4,
        value_size: 8,
        max_entries,
        flags: 0,
    };
    let array = Map::new(spec("array", MapType::Array, 4)).unwrap();
    let hash = Map::new(spec("hash", MapType::Hash, 8)).unwrap();
    let counters = Map::new(spec("counters", MapType::PercpuArray, 4)).unwrap();
    fn table(k: u64) -> u64 {
        1000 * (k + 1)
    }
    fn bonus(k: u64) -> u64 {
        7 * k + 3
    }
    for k in 0..4u32 {
        let key = k.to_le_bytes();
        array
            .update(&key, &table(k.into()).to_le_bytes(), 0)
            .unwrap();
        hash.update(&key, &bonus(k.into()).to_le_bytes(), 0)
            .unwrap();
    }
    fn want(x: u64) -> u64 {
        table(x & 3) + bonus(x & 3) + x
    }
    let opts = LoadOptions {
        maps: vec![array, hash, counters],
        ..adaptive()
    };
    let rt = runtime(TierPolicy::Calls(10));
    let arena = rt.arena().expect("host arena").clone();
    let start = arena.stats();
    let programs: Arc<Vec<RwLock<Option<Arc<Program>>>>> =
        Arc::new((0..SLOTS).map(|_| RwLock::new(None)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let (runs, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (programs, stop) = (programs.clone(), stop.clone());
            let (runs, wrong) = (runs.clone(), wrong.clone());
            std::thread::spawn(move || {
                let mut s = seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                while !stop.load(Relaxed) {
                    let k = (next(&mut s) % SLOTS as u64) as usize;
                    let x = next(&mut s) >> 8;
                    let p = programs[k].read().unwrap().clone();
                    if let Some(p) = p {
                        runs.fetch_add(1, Relaxed);
                        if p.call(&mut x.to_le_bytes()) != Ok(want(x)) {
                            wrong.fetch_add(1, Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let mut s = seed;
    let mut optimized = 0u64;
    let mut tally = |p: &Program| {
        if p.tier_status() == TierStatus::Optimized {
            optimized += 1;
        }
    };
    for _ in 0..rounds {
        for slot in programs.iter() {
            let code = map_program((next(&mut s) % 4) as u32);
            // SAFETY: reads 8 bytes of its context (every caller passes 8), its stack and
            // the values the lookups hand out.
            let p = unsafe { rt.load_trusted(&code, &opts) }.unwrap();
            if next(&mut s) % 2 == 0 {
                p.request_tier_up();
            }
            if let Some(old) = slot.write().unwrap().replace(Arc::new(p)) {
                tally(&old);
            }
        }
        std::thread::yield_now();
    }
    // One tier-up under the callers for certain.
    // SAFETY: as in the rounds.
    let last = Arc::new(unsafe { rt.load_trusted(&map_program(0), &opts) }.unwrap());
    if let Some(old) = programs[0].write().unwrap().replace(last.clone()) {
        tally(&old);
    }
    request_until_queued(&last);
    assert_eq!(last.wait_tier_up(), TierStatus::Optimized);
    for x in [0u64, 5, u64::MAX >> 8] {
        assert_eq!(last.call(&mut x.to_le_bytes()), Ok(want(x)));
    }
    drop(last);
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    for slot in programs.iter() {
        if let Some(p) = slot.write().unwrap().take() {
            tally(&p);
        }
    }
    let (runs, wrong) = (runs.load(Relaxed), wrong.load(Relaxed));
    drop(opts);
    drop(rt);
    let pending = arena.reclaim();
    let end = arena.stats();
    packjit_testkit::report(&format!(
        "tiering stress with maps ({}, seed {seed:#x}): {rounds} rounds, {runs} runs, {wrong} \
         wrong; programs freed optimized {optimized}",
        Arch::host().unwrap()
    ));
    assert_eq!(wrong, 0, "seed {seed:#x}");
    assert!(runs > 0);
    assert!(optimized > 0, "no program tiered up");
    assert_eq!(pending, 0, "frees still pending");
    assert_eq!(end.allocations, start.allocations, "code left allocated");
    assert_eq!(end.bytes_used, start.bytes_used, "code left allocated");
}

/// Asks for `p`'s tier-up until the compile queue takes it. The queue is bounded: after the
/// stress rounds' requests it may be full, and a request that finds it full leaves the
/// program on the baseline, to be asked again after its next calls
/// ([`Program::request_tier_up`] returns [`TierStatus::Baseline`] then, and
/// `wait_tier_up` returns at once).
fn request_until_queued(p: &Program) {
    let start = std::time::Instant::now();
    while p.request_tier_up() == TierStatus::Baseline {
        assert!(
            start.elapsed().as_secs() < 60,
            "the compile queue never took the request"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
