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
    use std::sync::Arc;
    use std::time::Instant;

    const N: usize = 1000;
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(x86_stub::X86Stub)).unwrap();
    let opts = LoadOptions::default();
    let codes: Vec<Vec<u8>> = (0..N).map(|i| x86_stub::ret_prog(i as i32, 16)).collect();
    let drain = |rt: &Runtime| {
        while rt.reclaim() != 0 {}
    };
    let _ = &drain;
    let batch_load = |hooks: &[Hook]| {
        let mut b = HookBatch::new();
        for (h, c) in hooks.iter().zip(&codes) {
            b.load_attach(&rt, h, c, &opts).unwrap();
        }
        b.apply()
    };
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    println!("batch attach, {N} programs onto {N} hooks:");

    // A. Load, commit and attach onto empty hooks.
    let hooks: Vec<Hook> = (0..N).map(|_| Hook::new()).collect();
    let c0 = rt.stats().commits;
    let one = time(&mut || {
        for (h, c) in hooks.iter().zip(&codes) {
            h.attach(rt.load(c, &opts).unwrap()).unwrap();
        }
    });
    let commits_one = rt.stats().commits - c0;
    rt.detach_batch(hooks.iter());
    drain(&rt);
    let c0 = rt.stats().commits;
    let batched = time(&mut || {
        batch_load(&hooks);
    });
    let commits_batch = rt.stats().commits - c0;
    println!(
        "  load + commit + attach (empty hooks, no waiting): one by one {:.2} ms ({commits_one} commits) vs HookBatch {:.2} ms ({commits_batch} commit): {:.1}x",
        one * 1e3,
        batched * 1e3,
        one / batched
    );

    // B. Replace every attached program and wait until what was replaced is released (the
    //    kernel's measure: each one-by-one detach waited for its own grace period).
    drain(&rt);
    let one_sync = time(&mut || {
        for (h, c) in hooks.iter().zip(&codes) {
            h.attach(rt.load(c, &opts).unwrap()).unwrap();
            drain(&rt);
        }
    });
    let batched_sync = time(&mut || {
        batch_load(&hooks);
        drain(&rt);
    });
    let sync_ratio = one_sync / batched_sync;
    println!(
        "  replace all + wait for the replaced code to be released: one by one {:.2} ms vs HookBatch {:.2} ms: {:.1}x",
        one_sync * 1e3,
        batched_sync * 1e3,
        sync_ratio
    );

    // B'. The same while a thread keeps running every hook (hooks are normally live): a
    //     grace period now has to wait for that thread to leave its pinned region.
    let hooks = Arc::new(hooks);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let (hooks, stop) = (hooks.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut runs = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for h in hooks.iter() {
                    runs += h.run(&mut []).map_or(0, |r| r.is_ok() as u64);
                }
            }
            runs
        })
    };
    let one_live = time(&mut || {
        for (h, c) in hooks.iter().zip(&codes) {
            h.attach(rt.load(c, &opts).unwrap()).unwrap();
            drain(&rt);
        }
    });
    let batched_live = time(&mut || {
        batch_load(&hooks);
        drain(&rt);
    });
    // B''. Attach alone, as the kernel series measured it (bpftrace loads its programs, then
    //      attaches them): programs already loaded and committed, each one-by-one swap
    //      waiting for the release of what it replaced, the batch waiting once.
    // Programs loaded and committed, with nothing left pending.
    let preload = || -> Vec<_> {
        let refs: Vec<&[u8]> = codes.iter().map(|c| c.as_slice()).collect();
        let progs: Vec<_> = rt
            .load_batch(&refs, &opts)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        drain(&rt);
        progs
    };
    let mut progs = preload();
    let one_attach = time(&mut || {
        for (h, p) in hooks.iter().zip(progs.drain(..)) {
            h.attach(p).unwrap();
            drain(&rt);
        }
    });
    let mut progs = Some(preload());
    let batched_attach = time(&mut || {
        rt.attach_batch(hooks.iter().zip(progs.take().unwrap()))
            .unwrap();
        drain(&rt);
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = runner.join().unwrap();
    let live_ratio = one_live / batched_live;
    println!(
        "  same, one thread running the hooks meanwhile ({runs} runs): one by one {:.2} ms vs HookBatch {:.2} ms: {:.1}x",
        one_live * 1e3,
        batched_live * 1e3,
        live_ratio
    );
    let attach_ratio = one_attach / batched_attach;
    println!(
        "  attach alone (preloaded), release awaited, hooks running: one by one {:.2} ms vs attach_batch {:.2} ms: {:.1}x",
        one_attach * 1e3,
        batched_attach * 1e3,
        attach_ratio
    );
    let hooks = Arc::try_unwrap(hooks).ok().unwrap();

    // C. Swaps alone: programs already loaded and committed, replacing attached ones.
    let mut progs = preload();
    let one = time(&mut || {
        for (h, p) in hooks.iter().zip(progs.drain(..)) {
            h.attach(p).unwrap();
        }
    });
    drain(&rt);
    let mut progs = Some(preload());
    let batched = time(&mut || {
        rt.attach_batch(hooks.iter().zip(progs.take().unwrap()))
            .unwrap();
    });
    let t = Instant::now();
    drain(&rt);
    println!(
        "  swaps only (preloaded, replacing; no waiting): one by one {:.1} us vs attach_batch {:.1} us: {:.1}x (then {:.2} ms to release the 1000 replaced)",
        one * 1e6,
        batched * 1e6,
        one / batched,
        t.elapsed().as_secs_f64() * 1e3
    );
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
    println!(
        "batched vs one by one with release awaited: load + attach {sync_ratio:.1}x idle, \
         {live_ratio:.1}x with hooks running; attach alone with hooks running {attach_ratio:.1}x \
         (goal >= 10x)"
    );
}
