//! Arena benchmarks, printed as figures (all measured side by side in one run):
//!
//! 1. alloc + free throughput (immediate and epoch-deferred frees);
//! 2. packing density for 1,000 programs of mixed sizes (64 B – 4 KiB), against mapping one
//!    page (or more) per program as ubpf does;
//! 3. one batch commit of 1,000 programs vs 1,000 single commits.
//!
//! `cargo bench -p packjit --bench arena` (host), or under qemu via scripts/bench.sh.

use packjit::{ArenaConfig, CodeArena, PackedArena};
use std::time::Instant;

/// Small deterministic generator (xorshift64*), so every run measures the same sizes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn size(&mut self) -> usize {
        64 + (self.next() % (4096 - 64 + 1)) as usize
    }
}

fn main() {
    let seed = 0x5eed_u64;
    println!("arena benchmarks (sizes from xorshift seed {seed:#x})");
    let page = region::page::size();
    throughput(seed);
    density(seed, page);
    batch_commit(seed);
}

fn throughput(seed: u64) {
    let arena = PackedArena::new(ArenaConfig::default()).unwrap();
    let mut rng = Rng(seed);
    let rounds = 20_000;
    let live = 256;
    let mut ring = Vec::with_capacity(live);
    let t = Instant::now();
    for _ in 0..rounds {
        if ring.len() == live {
            let r = ring.swap_remove((rng.next() % live as u64) as usize);
            arena.free(&r);
        }
        ring.push(arena.alloc(rng.size()).unwrap());
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "alloc+free: {rounds} allocs and {} frees (~{live} live, 64 B-4 KiB) in {:.1} ms: {:.0} k alloc+free pairs/s",
        rounds - live,
        dt * 1e3,
        rounds as f64 / dt / 1e3
    );
    for r in ring.drain(..) {
        arena.free(&r);
    }

    let t = Instant::now();
    for _ in 0..rounds {
        if ring.len() == live {
            let r = ring.swap_remove((rng.next() % live as u64) as usize);
            arena.free_deferred(r);
        }
        ring.push(arena.alloc(rng.size()).unwrap());
    }
    let pending = arena.reclaim();
    let dt = t.elapsed().as_secs_f64();
    println!(
        "alloc+deferred free (epoch): {rounds} allocs in {:.1} ms: {:.0} k pairs/s ({pending} still pending)",
        dt * 1e3,
        rounds as f64 / dt / 1e3
    );
}

fn density(seed: u64, page: usize) {
    let arena = PackedArena::new(ArenaConfig::default()).unwrap();
    let mut rng = Rng(seed ^ 1);
    let sizes: Vec<usize> = (0..1000).map(|_| rng.size()).collect();
    let regions: Vec<_> = sizes
        .iter()
        .map(|&s| {
            let r = arena.alloc(s).unwrap();
            arena.write(&r, 0, &vec![0x90; s]).unwrap();
            r
        })
        .collect();
    arena.commit();
    let st = arena.stats();
    let code: usize = sizes.iter().sum();
    let mut pages: Vec<usize> = regions
        .iter()
        .flat_map(|r| {
            let s = r.exec_addr as usize / page;
            let e = (r.exec_addr as usize + r.size as usize - 1) / page;
            s..=e
        })
        .collect();
    pages.sort_unstable();
    pages.dedup();
    let one_page_each: usize = sizes.iter().map(|s| s.div_ceil(page)).sum();
    println!(
        "packing 1000 programs of 64 B-4 KiB ({} KiB of code):",
        code / 1024
    );
    println!(
        "  code bytes / bytes allocated (64 B chunks): {:.3}",
        code as f64 / st.bytes_used as f64
    );
    println!(
        "  bytes allocated / bytes in pages holding code: {:.3} ({} pages of {page} B)",
        st.bytes_used as f64 / (pages.len() * page) as f64,
        pages.len()
    );
    println!(
        "  bytes allocated / bytes resident: {:.3} ({} KiB resident: pages are trap-filled when first used)",
        st.bytes_used as f64 / st.bytes_resident as f64,
        st.bytes_resident / 1024
    );
    println!(
        "  bytes allocated / address space reserved: {:.3} ({} pack(s), {} KiB reserved)",
        st.bytes_used as f64 / st.bytes_reserved as f64,
        st.packs,
        st.bytes_reserved / 1024
    );
    println!(
        "  pages touched: {} packed vs {} with one mapping per program (ubpf-style): {:.2}x fewer",
        pages.len(),
        one_page_each,
        one_page_each as f64 / pages.len() as f64
    );
    // Fill the packs to see the steady-state ratio when they are full.
    let packs = arena.pack_ranges();
    let mut extra = vec![];
    loop {
        let r = arena.alloc(rng.size()).unwrap();
        let a = r.exec_addr as usize;
        if !packs.iter().any(|&(s, n)| a >= s && a < s + n) {
            arena.free(&r);
            break;
        }
        extra.push(r);
    }
    let full = arena.stats();
    println!(
        "  with the same packs filled ({} programs): bytes allocated / address space reserved: {:.3}",
        1000 + extra.len(),
        full.bytes_used as f64 / full.bytes_reserved as f64
    );
}

fn batch_commit(seed: u64) {
    let mut rng = Rng(seed ^ 2);
    let sizes: Vec<usize> = (0..1000).map(|_| rng.size()).collect();
    let code = vec![0xc3u8; 4096];

    // Only the commits are timed: allocation and writing are the same work in both cases.
    let single = PackedArena::new(ArenaConfig::default()).unwrap();
    let mut t_single = 0.0;
    for &s in &sizes {
        let r = single.alloc(s).unwrap();
        single.write(&r, 0, &code[..s]).unwrap();
        let t = Instant::now();
        single.commit();
        t_single += t.elapsed().as_secs_f64();
    }

    let batch = PackedArena::new(ArenaConfig::default()).unwrap();
    for &s in &sizes {
        let r = batch.alloc(s).unwrap();
        batch.write(&r, 0, &code[..s]).unwrap();
    }
    let t = Instant::now();
    batch.commit();
    let t_batch = t.elapsed().as_secs_f64();
    let (ss, bs) = (single.stats(), batch.stats());
    println!(
        "commit 1000 programs (commit time only): 1000 single commits {:.3} ms ({} flushes, {} remaps) vs one batch commit {:.3} ms ({} flushes, {} remaps): batch is {:.1}x faster",
        t_single * 1e3,
        ss.icache_flushes,
        ss.remaps,
        t_batch * 1e3,
        bs.icache_flushes,
        bs.remaps,
        t_single / t_batch
    );
}
