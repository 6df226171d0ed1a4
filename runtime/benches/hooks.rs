//! Batch attach and symbol lookup benchmarks (host-native; the x86-64 stub backend stands in
//! for a JIT, so only the runtime's own machinery is measured).
//!
//! 1. 1,000 programs onto 1,000 hooks: loaded and attached one by one (a commit and a
//!    retirement per program) vs one `HookBatch` (one commit, one grace period); then the
//!    same for replacing all 1,000, including reclamation of what was replaced; and attach
//!    alone (programs loaded beforehand, as bpftrace attaches), each one-by-one swap waiting
//!    for what it replaced, the batch waiting once, while a thread runs the hooks.
//! 2. Address → program lookup at 10,000 live programs: ns per lookup, against a linear scan
//!    (kallsyms before its rbtree).
//! 3. The perf map kept current: a free and a load at 1,000 and 10,000 live programs.
//!
//! `cargo bench -p packjit --bench hooks` (x86-64 hosts).

#[cfg(target_arch = "x86_64")]
#[path = "common/x86_stub.rs"]
mod x86_stub;

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("hooks bench: needs an x86-64 host (stub backend)");
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use packjit::{Hook, HookBatch, LoadOptions, Runtime};
    use std::cell::Cell;
    use std::sync::Arc;
    use std::time::Instant;

    const N: usize = 1000;
    /// Each case runs this many times, one by one and batched alternating (which goes first
    /// alternates too), so that the machine's drift hits both sides alike; figures are
    /// medians.
    const ROUNDS: usize = 7;
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(x86_stub::X86Stub)).unwrap();
    let opts = LoadOptions::default();
    let codes: Vec<Vec<u8>> = (0..N).map(|i| x86_stub::ret_prog(i as i32, 16)).collect();
    let drain = |rt: &Runtime| while rt.reclaim() != 0 {};
    let batch_load = |hooks: &[Hook]| {
        let mut b = HookBatch::new();
        for (h, c) in hooks.iter().zip(&codes) {
            b.load_attach(&rt, h, c, &opts).unwrap();
        }
        b.apply()
    };
    // Programs loaded and committed, with nothing left pending.
    let preload_into = |rt: &Runtime| -> Vec<_> {
        let refs: Vec<&[u8]> = codes.iter().map(|c| c.as_slice()).collect();
        let progs: Vec<_> = rt
            .load_batch(&refs, &opts)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        drain(rt);
        progs
    };
    let preload = || preload_into(&rt);
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    println!("batch attach, {N} programs onto {N} hooks (median of {ROUNDS} alternating rounds):");
    let hooks: Arc<Vec<Hook>> = Arc::new((0..N).map(|_| Hook::new()).collect());

    // A. Load, commit and attach onto empty hooks (commits counted in the timed part).
    let commits = |f: &mut dyn FnMut()| {
        let c0 = rt.stats().commits;
        f();
        rt.stats().commits - c0
    };
    let (commits_one, commits_batch) = (Cell::new(0), Cell::new(0));
    let load_attach = paired(
        ROUNDS,
        &mut || {
            rt.detach_batch(hooks.iter());
            drain(&rt);
            time(&mut || {
                commits_one.set(commits(&mut || {
                    for (h, c) in hooks.iter().zip(&codes) {
                        h.attach(rt.load(c, &opts).unwrap()).unwrap();
                    }
                }))
            })
        },
        &mut || {
            rt.detach_batch(hooks.iter());
            drain(&rt);
            time(&mut || {
                commits_batch.set(commits(&mut || {
                    batch_load(&hooks);
                }))
            })
        },
    );
    load_attach.print(&format!(
        "load + commit + attach (empty hooks, no waiting; {} commits vs {})",
        commits_one.get(),
        commits_batch.get()
    ));

    // B. Replace every attached program and wait until what was replaced is released (the
    //    kernel's measure: each one-by-one detach waited for its own grace period).
    let replace_all = |hooks: &[Hook]| {
        paired(
            ROUNDS,
            &mut || {
                drain(&rt);
                time(&mut || {
                    for (h, c) in hooks.iter().zip(&codes) {
                        h.attach(rt.load(c, &opts).unwrap()).unwrap();
                        drain(&rt);
                    }
                })
            },
            &mut || {
                drain(&rt);
                time(&mut || {
                    batch_load(hooks);
                    drain(&rt);
                })
            },
        )
    };
    let idle = replace_all(&hooks);
    idle.print("replace all + wait for the replaced code to be released");

    // B'. The same while a thread keeps running every hook (hooks are normally live): a
    //     grace period now has to wait for that thread to leave its pinned region.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let (hooks, stop) = (hooks.clone(), stop.clone());
        std::thread::spawn(move || {
            // Runs, runs over 100 us (a 16-instruction program takes well under one: those
            // did someone else's work or were preempted), and the longest.
            let (mut runs, mut slow, mut longest) = (0u64, 0u64, 0f64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for h in hooks.iter() {
                    let t = Instant::now();
                    runs += h.run(&mut []).map_or(0, |r| r.is_ok() as u64);
                    let took = t.elapsed().as_secs_f64();
                    slow += (took > 100e-6) as u64;
                    longest = longest.max(took);
                }
            }
            (runs, slow, longest)
        })
    };
    let live = replace_all(&hooks);
    // B''. Attach alone, as the kernel series measured it (bpftrace loads its programs, then
    //      attaches them): programs already loaded and committed, each one-by-one swap
    //      waiting for the release of what it replaced, the batch waiting once.
    let attach_alone = |rt: &Runtime| {
        // Every round replaces programs of `rt` itself.
        rt.attach_batch(hooks.iter().zip(preload_into(rt))).unwrap();
        paired(
            ROUNDS,
            &mut || {
                let mut progs = preload_into(rt);
                time(&mut || {
                    for (h, p) in hooks.iter().zip(progs.drain(..)) {
                        h.attach(p).unwrap();
                        drain(rt);
                    }
                })
            },
            &mut || {
                let mut progs = Some(preload_into(rt));
                time(&mut || {
                    rt.attach_batch(hooks.iter().zip(progs.take().unwrap()))
                        .unwrap();
                    drain(rt);
                })
            },
        )
    };
    let attach = attach_alone(&rt);
    // The same in a runtime that keeps the perf map current for profilers: every release
    //  rewrites the map without the released programs, once per batch.
    let rt_mapped = Runtime::new().unwrap();
    rt_mapped.add_backend(Arc::new(x86_stub::X86Stub)).unwrap();
    let map = std::env::temp_dir().join(format!("packjit-hooks-bench-{}.map", std::process::id()));
    rt_mapped.enable_perf_map_at(&map).unwrap();
    let attach_mapped = attach_alone(&rt_mapped);
    // Back to this runtime's programs, the mapped runtime's released.
    rt.attach_batch(hooks.iter().zip(preload())).unwrap();
    drain(&rt_mapped);
    assert_eq!(rt_mapped.live_programs(), 0);
    drop(rt_mapped);
    std::fs::remove_file(&map).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (runs, slow, longest) = runner.join().unwrap();
    live.print(&format!(
        "same, one thread running the hooks meanwhile ({runs} runs in all)"
    ));
    attach.print("attach alone (preloaded), release awaited, hooks running");
    attach_mapped.print("the same, perf map kept current");
    println!(
        "  hook runs over 100 us during these three: {slow} of {runs} (longest {:.0} us)",
        longest * 1e6
    );

    // C. Swaps alone: programs already loaded and committed, replacing attached ones. The
    //    batch's release comes after its timing and the one-by-one swaps release as they
    //    go, so this ratio flatters the batch: a cost floor per swap, not a measure of
    //    batching.
    let swaps = paired(
        ROUNDS,
        &mut || {
            let mut progs = preload();
            time(&mut || {
                for (h, p) in hooks.iter().zip(progs.drain(..)) {
                    h.attach(p).unwrap();
                }
            })
        },
        &mut || {
            let mut progs = Some(preload());
            time(&mut || {
                rt.attach_batch(hooks.iter().zip(progs.take().unwrap()))
                    .unwrap();
            })
        },
    );
    let release = time(&mut || drain(&rt));
    swaps.print(&format!(
        "swaps only (preloaded, replacing; no waiting; then {:.2} ms to release the batch's {N})",
        release * 1e3
    ));
    drop(hooks);
    drain(&rt);

    println!("address -> program lookup (BTreeMap, O(log n)) vs linear scan:");
    for live in [1_000usize, 10_000] {
        let progs: Vec<_> = (0..live)
            .map(|i| {
                rt.load(&x86_stub::ret_prog(i as i32, 2 + i % 64), &opts)
                    .unwrap()
            })
            .collect();
        let syms = rt.symbols();
        // Addresses inside random programs (xorshift), computed up front.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let addrs: Vec<u64> = (0..100_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let p = &progs[(x % live as u64) as usize];
                p.entry_addr() + (x >> 32) % p.code_size() as u64
            })
            .collect();
        // A program's first lookup inverts its line table (once, lazily, not at load): take
        // those first, so the figure is the steady-state lookup.
        for p in &progs {
            std::hint::black_box(rt.symbolize(p.entry_addr()));
        }
        let t = Instant::now();
        let mut hits = 0u64;
        for &a in &addrs {
            hits += rt.symbolize(a).map_or(0, |s| s.id & 1);
        }
        let ns_tree = t.elapsed().as_nanos() as f64 / addrs.len() as f64;
        let t = Instant::now();
        let mut hits_lin = 0u64;
        for &a in &addrs[..10_000] {
            hits_lin += syms
                .iter()
                .find(|s| a >= s.start && a < s.start + s.size)
                .map_or(0, |s| s.id & 1);
        }
        let ns_lin = t.elapsed().as_nanos() as f64 / 10_000.0;
        std::hint::black_box((hits, hits_lin));
        println!(
            "  {live:>6} live programs: {ns_tree:.0} ns per lookup (linear scan: {ns_lin:.0} ns, {:.0}x)",
            ns_lin / ns_tree
        );
        drop(progs);
        drain(&rt);
    }

    // 3. Keeping the perf map current: each release rewrites it (it must not list freed
    //    code), so a free costs time in proportion to the live programs.
    println!("perf map kept current: a free (released) and a load, at n live programs:");
    for live in [1_000usize, 10_000] {
        let rt = Runtime::new().unwrap();
        rt.add_backend(Arc::new(x86_stub::X86Stub)).unwrap();
        let map =
            std::env::temp_dir().join(format!("packjit-hooks-bench-{}.map", std::process::id()));
        rt.enable_perf_map_at(&map).unwrap();
        let mut progs: Vec<_> = (0..live)
            .map(|i| rt.load(&x86_stub::ret_prog(i as i32, 16), &opts).unwrap())
            .collect();
        const CYCLES: usize = 200;
        let t = Instant::now();
        for i in 0..CYCLES {
            progs.swap_remove(i * 7 % live);
            drain(&rt);
            progs.push(rt.load(&x86_stub::ret_prog(i as i32, 16), &opts).unwrap());
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / CYCLES as f64;
        println!("  {live:>6} live programs: {us:.0} us per free + load");
        drop(progs);
        drain(&rt);
        std::fs::remove_file(&map).unwrap();
    }
    println!(
        "batched vs one by one with release awaited: load + attach {:.1}x idle, \
         {:.1}x with hooks running; attach alone with hooks running {:.1}x (goal >= 10x), \
         {:.1}x with the perf map kept current",
        idle.ratio(),
        live.ratio(),
        attach.ratio(),
        attach_mapped.ratio()
    );
}

/// One case's rounds: seconds one by one and batched, per round.
#[cfg(target_arch = "x86_64")]
struct Paired {
    one: Vec<f64>,
    batched: Vec<f64>,
}

/// Runs `one` and `batched` (each returns the seconds of its timed part) `rounds` times,
/// alternating, the side that goes first alternating too.
#[cfg(target_arch = "x86_64")]
fn paired(rounds: usize, one: &mut dyn FnMut() -> f64, batched: &mut dyn FnMut() -> f64) -> Paired {
    let mut p = Paired {
        one: Vec::new(),
        batched: Vec::new(),
    };
    for r in 0..rounds {
        if r % 2 == 0 {
            p.one.push(one());
            p.batched.push(batched());
        } else {
            p.batched.push(batched());
            p.one.push(one());
        }
    }
    p
}

#[cfg(target_arch = "x86_64")]
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(target_arch = "x86_64")]
impl Paired {
    /// Per-round ratios (one by one ÷ batched).
    fn ratios(&self) -> Vec<f64> {
        self.one
            .iter()
            .zip(&self.batched)
            .map(|(o, b)| o / b)
            .collect()
    }

    fn ratio(&self) -> f64 {
        median(&self.ratios())
    }

    fn print(&self, what: &str) {
        let r = self.ratios();
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
        println!(
            "  {what}: one by one {:.2} ms vs batched {:.2} ms: {:.1}x (rounds {lo:.1}-{hi:.1}x)",
            median(&self.one) * 1e3,
            median(&self.batched) * 1e3,
            self.ratio()
        );
    }
}
