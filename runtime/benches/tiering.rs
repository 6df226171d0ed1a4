//! Adaptive tiering (`Tier::Adaptive`) against the baseline, side by side in one process:
//!
//! 1. Load to first result: `load_trusted` + one call, Baseline vs Adaptive (manual policy:
//!    the load only; and `Calls(0)`: the optimizing compile queued at load, on a thread of
//!    its own while the first result is computed).
//! 2. Per call: a baseline program, an adaptive one before its tier-up (not counting:
//!    manual policy; counting: a threshold it never reaches), and the same after it.
//! 3. What a swap costs a running caller: ns per call of a thread calling one program while
//!    the main thread (a) sleeps, (b) loads 100 programs with `Tier::Optimized` (the
//!    optimizing compiles alone), (c) loads 100 adaptive programs and tiers each up (the
//!    same compiles, plus a swap and a retirement each).
//!
//! Programs: `tiny` (r0 = ctx[0] + 1) and `loop` (100 iterations of a dependent add chain).
//! Medians of `ROUNDS` interleaved rounds.
//!
//! `cargo bench -p packjit --features optimizer --bench tiering`

use packjit::{Budget, LoadOptions, Program, Runtime, RuntimeConfig, Tier, TierPolicy};
use packjit::{TierStatus, TieringConfig};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

const ROUNDS: usize = 7;

fn insn(op: u8, regs: u8, off: i16, imm: u32) -> Vec<u8> {
    let mut b = vec![op, regs];
    b.extend_from_slice(&off.to_le_bytes());
    b.extend_from_slice(&imm.to_le_bytes());
    b
}

fn tiny() -> Vec<u8> {
    [
        insn(0x71, 0x10, 0, 0), // ldxb r0, [r1]
        insn(0x07, 0x00, 0, 1), // add r0, 1
        insn(0x95, 0, 0, 0),
    ]
    .concat()
}

fn looping() -> Vec<u8> {
    [
        insn(0x71, 0x12, 0, 0),        // ldxb r2, [r1]
        insn(0xb7, 0x00, 0, 0),        // mov r0, 0
        insn(0xb7, 0x03, 0, 100),      // mov r3, 100
        insn(0xbf, 0x24, 0, 0),        // loop: mov r4, r2
        insn(0x27, 0x04, 0, 3),        // mul r4, 3
        insn(0x0f, 0x40, 0, 0),        // add r0, r4
        insn(0x07, 0x03, 0, u32::MAX), // add r3, -1
        insn(0x55, 0x03, -5, 0),       // jne r3, 0, loop
        insn(0x95, 0, 0, 0),
    ]
    .concat()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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

fn opts(tier: Tier) -> LoadOptions {
    LoadOptions {
        tier,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    }
}

fn load(rt: &Runtime, code: &[u8], tier: Tier) -> Program {
    // SAFETY: both programs read one byte of their context; every call passes one.
    unsafe { rt.load_trusted(code, &opts(tier)) }.unwrap()
}

fn ns_per_call(p: &Program, calls: u32) -> f64 {
    let mut ctx = [7u8];
    let t = Instant::now();
    for _ in 0..calls {
        black_box(p.call(black_box(&mut ctx)).unwrap());
    }
    t.elapsed().as_nanos() as f64 / f64::from(calls)
}

fn main() {
    if !Tier::Optimized.is_built() {
        println!("tiering bench: needs the `optimizer` feature (--features optimizer)");
        return;
    }
    let manual = runtime(TierPolicy::Manual);
    let at_load = runtime(TierPolicy::Calls(0));
    let never = runtime(TierPolicy::Calls(u64::MAX));
    let programs = [("tiny", tiny()), ("loop", looping())];

    println!("1. load to first result (us, median of {ROUNDS} rounds x 200 loads)");
    println!(
        "{:<6} {:>10} {:>18} {:>20}",
        "prog", "baseline", "adaptive (manual)", "adaptive (Calls(0))"
    );
    for (name, code) in &programs {
        let mut cols = [vec![], vec![], vec![]];
        for _ in 0..ROUNDS {
            for (i, (rt, tier)) in [
                (&manual, Tier::Baseline),
                (&manual, Tier::Adaptive),
                (&at_load, Tier::Adaptive),
            ]
            .into_iter()
            .enumerate()
            {
                let mut keep = Vec::with_capacity(200);
                let t = Instant::now();
                for _ in 0..200 {
                    let p = load(rt, code, tier);
                    black_box(p.call(&mut [7]).unwrap());
                    keep.push(p);
                }
                cols[i].push(t.elapsed().as_secs_f64() * 1e6 / 200.0);
                // The queued compiles finish outside the timed part.
                for p in &keep {
                    p.wait_tier_up();
                }
            }
        }
        let [b, m, z] = cols.map(median);
        println!("{name:<6} {b:>10.2} {m:>18.2} {z:>20.2}");
    }

    println!("\n2. ns per call (median of {ROUNDS} rounds x 2,000,000 calls)");
    println!(
        "{:<6} {:>10} {:>22} {:>22} {:>12}",
        "prog", "baseline", "adaptive, not counting", "adaptive, counting", "optimized"
    );
    for (name, code) in &programs {
        let base = load(&manual, code, Tier::Baseline);
        let idle = load(&manual, code, Tier::Adaptive);
        let counting = load(&never, code, Tier::Adaptive);
        let opt = load(&manual, code, Tier::Adaptive);
        opt.request_tier_up();
        assert_eq!(opt.wait_tier_up(), TierStatus::Optimized);
        let mut cols = [vec![], vec![], vec![], vec![]];
        for _ in 0..ROUNDS {
            for (i, p) in [&base, &idle, &counting, &opt].into_iter().enumerate() {
                cols[i].push(ns_per_call(p, 2_000_000));
            }
        }
        assert_eq!(counting.tier_status(), TierStatus::Baseline);
        let [b, i, c, o] = cols.map(median);
        println!("{name:<6} {b:>10.2} {i:>22.2} {c:>22.2} {o:>12.2}");
    }

    println!("\n3. a running caller's ns per call (`tiny`, baseline) while the main thread works");
    println!("   (median of {ROUNDS} rounds of 100 loads each)");
    let rt = Arc::new(runtime(TierPolicy::Manual));
    let target = Arc::new(load(&rt, &tiny(), Tier::Baseline));
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, nanos) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let caller = {
        let (target, stop) = (target.clone(), stop.clone());
        let (calls, nanos) = (calls.clone(), nanos.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let t = Instant::now();
                let n = 20_000;
                for _ in 0..n {
                    black_box(target.call(black_box(&mut [7])).unwrap());
                }
                calls.fetch_add(n, Relaxed);
                nanos.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            }
        })
    };
    let window = |work: &mut dyn FnMut()| {
        let (c0, n0) = (calls.load(Relaxed), nanos.load(Relaxed));
        work();
        let (c1, n1) = (calls.load(Relaxed), nanos.load(Relaxed));
        (n1 - n0) as f64 / (c1 - c0).max(1) as f64
    };
    let code = looping();
    let mut cols = [vec![], vec![], vec![]];
    for round in 0..ROUNDS {
        // (b) and (c) do the same optimizing compiles; (c) adds the baseline load, the swap
        // and the retirement of the baseline code (its release, a membarrier). (a) sleeps
        // as long as (c) took. The order turns every round.
        let mut took = std::time::Duration::ZERO;
        for case in (0..3).map(|i| (i + round) % 3) {
            let ns = match case {
                0 => window(&mut || {
                    std::thread::sleep(took.max(std::time::Duration::from_millis(50)))
                }),
                1 => window(&mut || {
                    for _ in 0..100 {
                        let p = load(&rt, &code, Tier::Optimized);
                        black_box(p.call(&mut [7]).unwrap());
                    }
                    rt.reclaim();
                }),
                _ => {
                    let t = Instant::now();
                    let ns = window(&mut || {
                        for _ in 0..100 {
                            let p = load(&rt, &code, Tier::Adaptive);
                            p.request_tier_up();
                            assert_eq!(p.wait_tier_up(), TierStatus::Optimized);
                            black_box(p.call(&mut [7]).unwrap());
                        }
                        rt.reclaim();
                    });
                    took = t.elapsed();
                    ns
                }
            };
            cols[case].push(ns);
        }
    }
    stop.store(true, Relaxed);
    caller.join().unwrap();
    let [a, b, c] = cols.map(median);
    println!(
        "   (a) idle {a:.2}   (b) 100 optimized loads {b:.2}   (c) 100 adaptive loads + tier-ups (swaps) {c:.2}"
    );
}
