use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Epoch reclamation is process-wide: a test that keeps a thread pinned on purpose stalls every
/// other test's `reclaim`. Tests that reclaim take this lock.
static EPOCH_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    EPOCH_TESTS.lock().unwrap_or_else(|p| p.into_inner())
}

fn ret_code(v: u16) -> Vec<u8> {
    probe::return_imm(v).expect("known host arch")
}

fn call(addr: u64) -> u64 {
    let _g = epoch_pin();
    // SAFETY: addr holds a committed `return imm` function.
    let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(addr as usize) };
    f()
}

fn install(a: &PackedArena, code: &[u8]) -> Region {
    let r = a.alloc(code.len()).unwrap();
    a.write(&r, 0, code).unwrap();
    r
}

/// Every mapping of this process, as (start, end, perms).
fn maps() -> Vec<(usize, usize, String)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .map(|l| {
            let mut it = l.split_whitespace();
            let range = it.next().unwrap();
            let perms = it.next().unwrap().to_string();
            let (s, e) = range.split_once('-').unwrap();
            (
                usize::from_str_radix(s, 16).unwrap(),
                usize::from_str_radix(e, 16).unwrap(),
                perms,
            )
        })
        .collect()
}

fn assert_no_wx(arena: &PackedArena, when: &str) {
    for (s, e, perms) in maps() {
        assert!(
            !(perms.contains('w') && perms.contains('x')),
            "{when}: mapping {s:#x}-{e:#x} is {perms} (writable and executable)"
        );
    }
    // With dual mapping the executable view is never writable, not even while filling.
    if !arena.stats().dual_mapped {
        return;
    }
    for (start, size) in arena.pack_ranges() {
        let m = maps();
        let covering = m.iter().filter(|(s, e, _)| *s < start + size && *e > start);
        for (_, _, perms) in covering {
            assert!(
                !perms.contains('w'),
                "{when}: pack at {start:#x} is writable: {perms}"
            );
        }
    }
}

#[test]
fn packs_at_64_byte_granularity() {
    let a = PackedArena::new(ArenaConfig {
        remap: RemapPolicy::Never,
        ..Default::default()
    })
    .unwrap();
    let r1 = a.alloc(1).unwrap();
    let r2 = a.alloc(65).unwrap();
    let r3 = a.alloc(64).unwrap();
    assert_eq!(r1.size, 64);
    assert_eq!(r2.size, 128);
    assert_eq!(r1.exec_addr % 64, 0);
    assert_eq!(r2.exec_addr, r1.exec_addr + 64);
    assert_eq!(r3.exec_addr, r2.exec_addr + 128);
    assert_eq!(
        r1.exec_addr as usize % DEFAULT_PACK_SIZE,
        0,
        "packs are 2 MiB aligned"
    );
    let s = a.stats();
    assert_eq!(
        (s.packs, s.bytes_reserved, s.bytes_used, s.allocations),
        (1, DEFAULT_PACK_SIZE, 256, 3)
    );
    // Freeing the middle one leaves a 128-byte hole that a 100-byte request reuses.
    a.free(&r2);
    let r4 = a.alloc(100).unwrap();
    assert_eq!(r4.exec_addr, r2.exec_addr);
}

#[test]
fn writes_are_bounds_checked_and_regions_validated() {
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    let r = a.alloc(10).unwrap();
    assert!(a.write(&r, 0, &[0; 64]).is_ok());
    let e = a.write(&r, 1, &[0; 64]).unwrap_err();
    assert!(e.message.contains("overflows a 64-byte region"), "{e}");
    let fake = Region {
        exec_addr: r.exec_addr + 64,
        size: 64,
        cookie: r.cookie,
    };
    assert!(a
        .write(&fake, 0, &[1])
        .unwrap_err()
        .message
        .contains("not an allocation"));
    let other = Region { cookie: 999, ..r };
    assert!(a
        .write(&other, 0, &[1])
        .unwrap_err()
        .message
        .contains("not from this arena"));
    // A lying size on free is refused too (the bitmap stays consistent).
    a.free(&Region { size: 4096, ..r });
    assert_eq!(a.stats().allocations, 1);
    a.free(&r);
    assert_eq!(a.stats().allocations, 0);
}

#[test]
fn oversized_requests_get_a_dedicated_pack_and_empty_packs_are_released() {
    let a = PackedArena::new(ArenaConfig {
        pack_size: 64 << 10,
        ..Default::default()
    })
    .unwrap();
    let big = a.alloc(200 << 10).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.packs, s.bytes_reserved),
        (1, 256 << 10),
        "rounded up to whole packs"
    );
    // The tail of the large pack is still packed into.
    let small = a.alloc(64).unwrap();
    assert_eq!(small.exec_addr, big.exec_addr + (200 << 10));
    assert_eq!(a.stats().packs, 1);
    a.free(&big);
    a.free(&small);
    assert_eq!(a.stats().packs, 0);
    assert_eq!(a.stats().bytes_reserved, 0);
}

#[test]
fn a_batch_release_takes_each_region_once_merges_neighbours_and_unmaps_emptied_packs() {
    let _serial = serial();
    let a = PackedArena::new(ArenaConfig {
        pack_size: 64 << 10,
        ..Default::default()
    })
    .unwrap();
    // Oversized requests get packs of their own (filled exactly), which the batch empties:
    // the first and the last pack, so that unmapping one moves the other in the pack list.
    let big_first = a.alloc(128 << 10).unwrap();
    let keep_first = install(&a, &ret_code(1));
    let gone: Vec<Region> = (0..3).map(|_| install(&a, &[0x5a; 100])).collect();
    let keep_last = install(&a, &ret_code(2));
    let big_last = a.alloc(128 << 10).unwrap();
    a.commit();
    let s = a.stats();
    assert_eq!(s.packs, 3);
    // Out of address order, across all three packs, as a hook batch hands them over.
    let batch = vec![gone[2], big_last, gone[0], big_first, gone[1]];
    for _ in &batch {
        a.expect_release();
    }
    a.release_after_grace(batch);
    assert_eq!(a.reclaim(), 0, "every region released and counted once");
    let s = a.stats();
    assert_eq!(s.packs, 1, "the emptied packs are unmapped");
    assert_eq!(s.bytes_used, 2 * CHUNK, "only the two kept programs remain");
    let trap = a.trap_pattern();
    let span = gone[2].exec_addr + gone[2].size - gone[0].exec_addr;
    let bytes = a.read_code(gone[0].exec_addr, span as usize).unwrap();
    assert!(
        bytes.chunks(trap.len()).all(|c| c == trap),
        "all three are traps"
    );
    // The three neighbours are one dirty range: one maintenance pass.
    let flushes = s.icache_flushes;
    a.commit();
    assert_eq!(a.stats().icache_flushes, flushes + 1);
    assert_eq!(call(keep_first.exec_addr), 1);
    assert_eq!(call(keep_last.exec_addr), 2);
}

#[test]
fn batch_commit_does_one_maintenance_pass_over_merged_ranges() {
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    let regions: Vec<Region> = (0..10).map(|i| install(&a, &ret_code(i))).collect();
    a.commit();
    let s = a.stats();
    assert_eq!(s.commits, 1);
    assert_eq!(
        s.icache_flushes, 1,
        "ten adjacent programs merge into one range"
    );
    for (i, r) in regions.iter().enumerate() {
        assert_eq!(call(r.exec_addr), i as u64);
    }
}

#[test]
fn w_xor_x_through_the_whole_life_cycle() {
    let _serial = serial();
    for mode in [MapMode::DualMapping, MapMode::Toggle] {
        let a = PackedArena::new(ArenaConfig {
            map_mode: mode,
            ..Default::default()
        })
        .unwrap();
        assert_no_wx(&a, "after create");
        let r = a.alloc(64).unwrap();
        assert_no_wx(&a, "after alloc");
        a.write(&r, 0, &ret_code(7)).unwrap();
        assert_no_wx(&a, "after write");
        a.commit();
        assert_no_wx(&a, "after commit");
        assert_eq!(call(r.exec_addr), 7);
        let keep = install(&a, &ret_code(8));
        a.commit();
        a.free_deferred(r);
        assert_eq!(a.reclaim(), 0);
        assert_no_wx(&a, "after free");
        assert_eq!(call(keep.exec_addr), 8);
    }
}

#[test]
fn freed_space_reads_back_as_traps() {
    let _serial = serial();
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    let keep = install(&a, &ret_code(1));
    let r = install(&a, &[0x5a; 100]);
    a.commit();
    a.free_deferred(r);
    assert_eq!(a.reclaim(), 0);
    let bytes = a.read_code(r.exec_addr, r.size as usize).unwrap();
    let trap = a.trap_pattern();
    assert!(
        bytes.chunks(trap.len()).all(|c| c == trap),
        "freed chunk holds {:02x?}, expected the trap pattern {trap:02x?}",
        &bytes[..16]
    );
    // The rest of a page holding code is trap-filled too, not just the freed chunk.
    let page = region::page::size() as u64;
    let page_end = (keep.exec_addr / page + 1) * page;
    let tail = a
        .read_code(
            r.exec_addr + r.size,
            (page_end - r.exec_addr - r.size) as usize,
        )
        .unwrap();
    assert!(tail.chunks(trap.len()).all(|c| c == trap));
    // Pages no code was ever placed in stay untouched (demand-zero, not resident).
    assert_eq!(a.stats().bytes_resident, page as usize);
}

/// The qemu-user stale-code problem: a freed chunk reused by a different program must run
/// the new program, while other threads keep running code in the same pack.
#[test]
fn reused_chunk_runs_the_new_program_while_other_threads_run_the_pack() {
    let _serial = serial();
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    let neighbours: Vec<Region> = (0..4).map(|i| install(&a, &ret_code(100 + i))).collect();
    a.commit();

    let stop = Arc::new(AtomicBool::new(false));
    // The rounds start only once every runner is inside its loop: on a loaded machine a
    // runner might otherwise not be scheduled before `stop` is set.
    let started = Arc::new(std::sync::Barrier::new(neighbours.len() + 1));
    let runners: Vec<_> = neighbours
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (addr, stop, started) = (r.exec_addr, stop.clone(), started.clone());
            std::thread::spawn(move || {
                assert_eq!(call(addr), 100 + i as u64);
                started.wait();
                let mut n = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(call(addr), 100 + i as u64);
                    n += 1;
                }
                n
            })
        })
        .collect();
    started.wait();

    for round in 0..20u16 {
        let victim = install(&a, &ret_code(200 + round));
        a.commit();
        assert_eq!(call(victim.exec_addr), 200 + round as u64);
        a.free_deferred(victim);
        assert_eq!(a.reclaim(), 0);
        let reused = install(&a, &ret_code(300 + round));
        assert_eq!(
            reused.exec_addr, victim.exec_addr,
            "first fit reuses the freed chunk"
        );
        a.commit();
        assert_eq!(
            call(reused.exec_addr),
            300 + round as u64,
            "stale code ran in round {round}"
        );
        a.free_deferred(reused);
        a.reclaim();
    }
    stop.store(true, Ordering::Relaxed);
    for t in runners {
        assert!(t.join().unwrap() > 0);
    }
}

#[test]
fn deferred_free_waits_for_pinned_threads() {
    let _serial = serial();
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    let r = install(&a, &ret_code(5));
    let _keep = install(&a, &ret_code(6));
    a.commit();
    let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let g = epoch_pin();
        pinned_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        drop(g);
    });
    pinned_rx.recv().unwrap();
    a.free_deferred(r);
    // While the other thread stays pinned, the code must stay in place.
    assert_eq!(a.reclaim(), 1);
    assert_eq!(call(r.exec_addr), 5);
    assert_eq!(a.stats().allocations, 2);
    release_tx.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().allocations, 1);
}

#[test]
fn chunks_past_their_grace_period_are_released_by_the_arenas_calls_not_by_pins() {
    let _serial = serial();
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    let r = install(&a, &ret_code(5));
    let _keep = install(&a, &ret_code(6));
    a.commit();
    a.free_deferred(r);
    // Pins and flushes (what program runs do) end the grace period, but release nothing:
    // no trap fill, page release or code move ever runs inside a program run's pin. Flush
    // until the grace period is over (other tests' threads may hold the epoch back a while).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !a.inner.graced_waiting.load(Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "the grace period never ended"
        );
        epoch_pin().flush();
        std::thread::yield_now();
    }
    let s = a.stats();
    assert_eq!((s.allocations, s.pending_frees), (2, 1));
    assert_eq!(call(r.exec_addr), 5, "still there");
    // The arena's next call releases it.
    let next = install(&a, &ret_code(7));
    let s = a.stats();
    assert_eq!((s.allocations, s.pending_frees), (2, 0));
    assert_eq!(
        next.exec_addr, r.exec_addr,
        "the load took the released chunks"
    );
    a.commit();
    assert_eq!(call(next.exec_addr), 7);
}

#[test]
fn toggle_mode_seals_committed_packs() {
    let a = PackedArena::new(ArenaConfig {
        map_mode: MapMode::Toggle,
        ..Default::default()
    })
    .unwrap();
    let r1 = install(&a, &ret_code(11));
    a.commit();
    let r2 = install(&a, &ret_code(12));
    a.commit();
    assert_ne!(
        r1.cookie, r2.cookie,
        "a committed pack is never written again"
    );
    assert_eq!((call(r1.exec_addr), call(r2.exec_addr)), (11, 12));
    assert!(!a.stats().dual_mapped);
}

#[test]
fn best_fit_refills_the_smallest_hole_and_first_fit_the_lowest() {
    for (placement, want_second) in [(Placement::BestFit, true), (Placement::FirstFit, false)] {
        let a = PackedArena::new(ArenaConfig {
            placement,
            remap: RemapPolicy::Never,
            ..Default::default()
        })
        .unwrap();
        // [big 4 chunks][sep][small 2 chunks][sep]: free both holes, then ask for 2 chunks.
        let big = a.alloc(4 * CHUNK).unwrap();
        let _s1 = a.alloc(CHUNK).unwrap();
        let small = a.alloc(2 * CHUNK).unwrap();
        let _s2 = a.alloc(CHUNK).unwrap();
        a.free(&big);
        a.free(&small);
        let r = a.alloc(2 * CHUNK - 5).unwrap();
        let want = if want_second {
            small.exec_addr
        } else {
            big.exec_addr
        };
        assert_eq!(r.exec_addr, want, "{placement:?}");
        // Best fit leaves the 4-chunk hole whole; first fit splits it into 2 + the 2 of the
        // small hole: 4 chunks outside the pack's largest run (the tail) either way, and the
        // free runs are coalesced (no run is counted twice).
        let s = a.stats();
        assert_eq!(s.bytes_used, 4 * CHUNK);
        let free = a.config().pack_size / CHUNK - 4;
        let split = 4;
        assert_eq!(
            s.fragmentation_permille as usize,
            split * 1000 / free,
            "{placement:?}"
        );
    }
}

#[test]
fn best_fit_leaves_no_remainder_smaller_than_every_allocation() {
    for smallest in [2, 1] {
        let a = PackedArena::new(ArenaConfig {
            remap: RemapPolicy::Never,
            compaction: None,
            ..Default::default()
        })
        .unwrap();
        // [A 2][h1 3][B 2][h2 5][C 2], every allocation 2 chunks or more (then one of 1 chunk).
        // A 2-chunk request in h1 would leave a chunk no such program can use, so it goes to
        // h2 (leaving 3) unless a 1-chunk allocation has been seen.
        let sizes = [2, 3, 2, 5, 2];
        let r: Vec<Region> = sizes.iter().map(|&n| a.alloc(n * CHUNK).unwrap()).collect();
        if smallest == 1 {
            let one = a.alloc(CHUNK).unwrap();
            a.free(&one);
        }
        a.free(&r[1]);
        a.free(&r[3]);
        let got = a.alloc(2 * CHUNK).unwrap();
        let want = if smallest == 2 { &r[3] } else { &r[1] };
        assert_eq!(
            got.exec_addr, want.exec_addr,
            "smallest allocation {smallest}"
        );
        if smallest == 2 {
            // An exact fit leaves nothing: a 3-chunk request takes h1.
            let exact = a.alloc(3 * CHUNK).unwrap();
            assert_eq!(exact.exec_addr, r[1].exec_addr);
        }
    }
}

#[test]
fn pages_left_without_code_are_released_and_refilled_on_reuse() {
    let _s = serial();
    let page = sys::page_size();
    for release in [true, false] {
        let a = PackedArena::new(ArenaConfig {
            release_free_pages: release,
            ..Default::default()
        })
        .unwrap();
        let keep = install(&a, &ret_code(1));
        // Three pages' worth: the two pages it covers entirely become empty when it goes.
        let big = a.alloc(3 * page).unwrap();
        a.write(&big, 0, &vec![0xcc; 3 * page]).unwrap();
        a.commit();
        let before = a.stats().bytes_resident;
        assert_eq!(before, 4 * page, "first page (shared) + 3 more");
        a.free(&big);
        let after = a.stats().bytes_resident;
        if release {
            // `big` covered pages 1 and 2 wholly and the first chunk of page 3; page 0 still
            // holds `keep`.
            assert_eq!(
                after, page,
                "only the page holding live code stays resident"
            );
        } else {
            assert_eq!(after, before, "without release the high-water mark stays");
        }
        // Reuse: the released pages are trap-filled again and hold working code.
        let again = install(&a, &ret_code(7));
        a.commit();
        assert_eq!(call(again.exec_addr), 7);
        assert_eq!(call(keep.exec_addr), 1);
        let code = a.read_code(again.exec_addr + 64, 64).unwrap_or_default();
        assert!(
            code.is_empty()
                || code
                    .chunks(a.trap_pattern().len())
                    .all(|c| c == a.trap_pattern()),
            "free space after the program is trap-filled"
        );
    }
}

#[test]
fn a_few_empty_pages_stay_resident_until_they_exceed_their_share() {
    let _s = serial();
    let page = sys::page_size();
    let a = PackedArena::new(ArenaConfig::default()).unwrap();
    // 2 × IDLE_SHARE programs of one page each, filling the first pages of one pack.
    let count = 2 * super::IDLE_SHARE;
    let regions: Vec<Region> = (0..count)
        .map(|_| {
            let r = a.alloc(page).unwrap();
            a.write(&r, 0, &vec![0xcc; page]).unwrap();
            r
        })
        .collect();
    a.commit();
    let resident = |a: &PackedArena| a.stats().bytes_resident / page;
    assert_eq!(resident(&a), count);
    // Up to 1 in IDLE_SHARE resident pages may sit empty: the next program likely goes there.
    a.free(&regions[0]);
    a.free(&regions[1]);
    assert_eq!(
        resident(&a),
        count,
        "two idle pages of {count} stay resident"
    );
    // Refilling an idle page costs no new page.
    let again = a.alloc(page).unwrap();
    assert_eq!(
        again.exec_addr, regions[0].exec_addr,
        "best fit reuses the hole"
    );
    assert_eq!(resident(&a), count);
    a.free(&again);
    // A third idle page exceeds the share: every idle page goes back at once.
    a.free(&regions[2]);
    assert_eq!(
        resident(&a),
        count - 3,
        "all three idle pages released together"
    );
    assert_eq!(a.stats().bytes_used, (count - 3) * page);
    for r in &regions[3..] {
        a.free(r);
    }
    assert_eq!(a.stats().packs, 0);
}

#[test]
fn without_page_release_a_refilled_empty_page_keeps_the_books() {
    let _s = serial();
    let page = sys::page_size();
    let a = PackedArena::new(ArenaConfig {
        release_free_pages: false,
        ..Default::default()
    })
    .unwrap();
    let (first, second) = (a.alloc(page).unwrap(), a.alloc(page).unwrap());
    a.write(&first, 0, &vec![0xcc; page]).unwrap();
    a.write(&second, 0, &vec![0xcc; page]).unwrap();
    a.commit();
    a.free(&first);
    assert_eq!(a.stats().bytes_resident, 2 * page, "nothing is released");
    // The emptied page is resident and idle: placing code there takes it off the idle count
    // (which frees counted, even with nothing to release).
    let again = a.alloc(page).unwrap();
    assert_eq!(again.exec_addr, first.exec_addr, "best fit reuses the hole");
    assert_eq!(a.stats().bytes_resident, 2 * page);
    a.free(&again);
    a.free(&second);
    assert_eq!(a.stats().packs, 0);
}

/// Every placement policy the arena offers (the default first).
const PLACEMENTS: [Placement; 5] = [
    Placement::BestFit,
    Placement::FirstFit,
    Placement::BestFitTwoEnded { large_chunks: 4 },
    Placement::SizeClasses { steps_log2: 1 },
    Placement::SizeClasses { steps_log2: 3 },
];

/// Random loads and frees (alone, or in batches released together) on small packs (so
/// several packs come and go), checking after every step what placement must never break:
/// 64-byte alignment, regions inside a pack, no two live regions overlapping, space handed
/// out reading as traps until written, freed space reading as traps (or zeroes once its page
/// was given back), live code intact, and the statistics adding up.
#[test]
fn random_churn_keeps_placement_invariants() {
    let seed = std::env::var("ARENA_CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("random_churn_keeps_placement_invariants: ARENA_CHURN_SEED={seed}");
    let page = sys::page_size();
    for placement in PLACEMENTS {
        let a = PackedArena::new(ArenaConfig {
            placement,
            pack_size: 16 * page,
            ..Default::default()
        })
        .unwrap();
        let trap = a.trap_pattern();
        let mut rng = seed;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Live regions by address: (region, requested bytes, fill byte).
        let mut live: BTreeMap<u64, (Region, usize, u8)> = BTreeMap::new();
        for step in 0..2_000u32 {
            let ctx = format!("{placement:?}, seed {seed}, step {step}");
            if live.len() < 8 || (live.len() < 120 && next() % 2 == 0) {
                // Mostly small, sometimes several pages (spanning page boundaries).
                let want = if next() % 8 == 0 {
                    1 + (next() % (3 * page as u64)) as usize
                } else {
                    1 + (next() % 700) as usize
                };
                let r = a.alloc(want).unwrap();
                let (start, size) = (r.exec_addr, r.size as usize);
                assert_eq!(start % CHUNK as u64, 0, "{ctx}: alignment");
                assert_eq!(size % CHUNK, 0, "{ctx}: size in whole chunks");
                assert!(size >= want, "{ctx}: {size} bytes for {want}");
                let exact = want.div_ceil(CHUNK) * CHUNK;
                if let Placement::SizeClasses { steps_log2 } = placement {
                    // Rounding wastes at most one class step: 1 / 2^steps_log2 of the size.
                    assert!(
                        size - exact <= exact >> steps_log2,
                        "{ctx}: class of {want}"
                    );
                } else {
                    assert_eq!(size, exact, "{ctx}: 64-byte rounding only");
                }
                assert!(
                    a.pack_ranges()
                        .iter()
                        .any(|&(b, s)| start as usize >= b && start as usize + size <= b + s),
                    "{ctx}: region {start:#x}+{size} inside one pack"
                );
                if let Some((_, (p, _, _))) = live.range(..start).next_back() {
                    assert!(
                        p.exec_addr + p.size <= start,
                        "{ctx}: overlaps the previous"
                    );
                }
                if let Some((_, (n, _, _))) = live.range(start..).next() {
                    assert!(
                        start + size as u64 <= n.exec_addr,
                        "{ctx}: overlaps the next"
                    );
                }
                let fresh = a.read_code(start, size).unwrap();
                assert!(
                    fresh.chunks(trap.len()).all(|c| c == trap),
                    "{ctx}: new region at {start:#x} is not trap-filled before it is written"
                );
                let fill = (step % 251) as u8 + 1;
                a.write(&r, 0, &vec![fill; want]).unwrap();
                live.insert(start, (r, want, fill));
            } else {
                // One free, or a batch of up to 8 in one release (as a hook batch retires
                // them), in random order.
                let batch = if next() % 4 == 0 { 1 + next() % 8 } else { 1 };
                let mut freed = Vec::new();
                for _ in 0..batch.min(live.len() as u64) {
                    let nth = (next() % live.len() as u64) as usize;
                    let key = *live.keys().nth(nth).unwrap();
                    freed.push(live.remove(&key).unwrap().0);
                }
                if let [r] = freed[..] {
                    a.free(&r);
                } else {
                    for _ in &freed {
                        a.expect_release();
                    }
                    a.release_after_grace(freed.clone());
                    assert_eq!(a.reclaim(), 0, "{ctx}: the batch is released");
                }
                // Whatever is left of their packs: trap-filled, or zero where the page went
                // back.
                let occ = a.occupancy();
                for r in freed {
                    if let Some(p) = occ.iter().find(|p| {
                        p.base as u64 <= r.exec_addr
                            && r.exec_addr < (p.base + p.chunks.len() * CHUNK) as u64
                    }) {
                        let first = (r.exec_addr as usize - p.base) / CHUNK;
                        for c in first..first + r.size as usize / CHUNK {
                            let bytes = a.read_code((p.base + c * CHUNK) as u64, CHUNK).unwrap();
                            match p.chunks[c] {
                                ChunkState::TrapFilled => assert!(
                                    bytes.chunks(trap.len()).all(|t| t == trap),
                                    "{ctx}: freed chunk {c} is not trap-filled"
                                ),
                                ChunkState::Untouched => {
                                    assert!(
                                        bytes.iter().all(|&b| b == 0),
                                        "{ctx}: released chunk {c}"
                                    )
                                }
                                ChunkState::Code => panic!("{ctx}: freed chunk {c} still in use"),
                            }
                        }
                    }
                }
            }
            // Every live region still holds exactly what was written into it.
            if step % 100 == 0 {
                for (r, want, fill) in live.values() {
                    let bytes = a.read_code(r.exec_addr, *want).unwrap();
                    assert!(bytes.iter().all(|b| b == fill), "{ctx}: region clobbered");
                }
            }
            let s = a.stats();
            let used: u64 = live.values().map(|(r, _, _)| r.size).sum();
            assert_eq!(
                (s.allocations, s.bytes_used as u64),
                (live.len(), used),
                "{ctx}"
            );
            assert!(s.fragmentation_permille <= 1000, "{ctx}");
        }
        for (r, _, _) in live.into_values() {
            a.free(&r);
        }
        assert_eq!(a.stats().packs, 0, "{placement:?}: every pack released");
    }
}

/// A freed region's chunks go back to the arena only after its grace period: while a thread
/// is pinned, new programs are placed elsewhere; once reclaimed, the next program of that
/// size gets the same chunks (every placement refills an exactly fitting hole), and runs.
#[test]
fn freed_chunks_are_reused_only_after_the_grace_period() {
    let _serial = serial();
    for placement in PLACEMENTS {
        let a = PackedArena::new(ArenaConfig {
            placement,
            ..Default::default()
        })
        .unwrap();
        let _before = install(&a, &ret_code(1));
        let victim = install(&a, &ret_code(2));
        let _after = install(&a, &ret_code(3));
        a.commit();
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let g = epoch_pin();
            pinned_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(g);
        });
        pinned_rx.recv().unwrap();
        a.free_deferred(victim);
        assert_eq!(
            a.reclaim(),
            1,
            "{placement:?}: pinned thread holds the free back"
        );
        let early = install(&a, &ret_code(4));
        assert_ne!(
            early.exec_addr, victim.exec_addr,
            "{placement:?}: chunks reused inside their grace period"
        );
        a.commit();
        assert_eq!(
            call(victim.exec_addr),
            2,
            "{placement:?}: old code still in place"
        );
        release_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(a.reclaim(), 0, "{placement:?}");
        let late = install(&a, &ret_code(5));
        assert_eq!(
            late.exec_addr, victim.exec_addr,
            "{placement:?}: the hole is refilled after the grace period"
        );
        a.commit();
        assert_eq!(call(late.exec_addr), 5, "{placement:?}");
        assert_eq!(call(early.exec_addr), 4, "{placement:?}");
    }
}

#[test]
fn size_classes_round_up_by_at_most_one_step() {
    // Exact below 2^(steps_log2 + 1) chunks, then 2^steps_log2 classes per doubling.
    assert_eq!(
        (1..=8).map(|n| size_class(n, 2)).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6, 7, 8]
    );
    assert_eq!(
        (9..=17).map(|n| size_class(n, 2)).collect::<Vec<_>>(),
        [10, 10, 12, 12, 14, 14, 16, 16, 20]
    );
    for steps_log2 in 0..5 {
        for n in 1..5_000 {
            let c = size_class(n, steps_log2);
            assert!(
                c >= n && c - n <= n >> steps_log2,
                "{n} -> {c} ({steps_log2})"
            );
            assert_eq!(size_class(c, steps_log2), c, "classes are fixed points");
        }
    }
}

#[test]
fn compaction_moves_the_program_bordering_free_space_into_a_hole() {
    let _s = serial();
    let a = PackedArena::new(ArenaConfig {
        compaction: Some(Compaction {
            threshold_permille: 0,
            step_bytes: 0, // only explicit `compact` calls move code
        }),
        // One page: a 3-chunk hole is a visible share of the free space.
        pack_size: sys::page_size(),
        ..ArenaConfig::default()
    })
    .unwrap();
    if a.compaction().is_none() {
        return; // no memfd: toggle mode, where compaction is off (checked below)
    }
    // A (1 chunk) B (3 chunks) C (1) D (2 chunks: fits B's hole), then the free tail.
    let code = |v: u16, chunks: usize| {
        let mut c = ret_code(v);
        c.resize(chunks * CHUNK, 0);
        c
    };
    let regions: Vec<Region> = [(1, 1), (2, 3), (3, 1), (4, 2)]
        .iter()
        .map(|&(v, n)| install(&a, &code(v, n)))
        .collect();
    a.commit();
    let movables: Vec<Arc<Movable>> = regions
        .iter()
        .map(|r| a.make_movable(r, r.exec_addr, None).unwrap())
        .collect();
    a.free_deferred(a.detach_movable(&movables[1]));
    assert_eq!(a.reclaim(), 0);
    let before = a.stats();
    assert!(before.fragmentation_permille > 0);
    let d_old = movables[3].entry();
    // D borders the free tail and fits B's hole; its old copy is on its way out, so C borders
    // the free space next and fits the rest of the hole: both move in one step.
    assert_eq!(a.compact(1 << 20), 3 * CHUNK, "D and C move");
    let d_new = movables[3].entry();
    assert_eq!(d_new, regions[1].exec_addr, "into B's hole");
    assert_eq!(movables[2].entry(), regions[1].exec_addr + 2 * CHUNK as u64);
    assert_eq!(call(d_new), 4);
    assert_eq!(call(movables[2].entry()), 3);
    assert_eq!(
        call(d_old),
        4,
        "the old copy stays until its grace period ends"
    );
    assert_eq!(
        a.read_movable(&movables[3], 2 * CHUNK),
        a.read_code(d_old, 2 * CHUNK)
    );
    let s = a.stats();
    assert_eq!(
        (s.moves, s.bytes_moved, s.pending_frees),
        (2, 3 * CHUNK as u64, 2)
    );
    assert_eq!(a.reclaim(), 0);
    let trap = a.trap_pattern();
    assert_eq!(
        a.read_code(d_old, trap.len()),
        Some(trap.to_vec()),
        "trap-filled"
    );
    assert_eq!(
        a.stats().fragmentation_permille,
        0,
        "all free space in one run"
    );
    // Pinned code never moves; a freed program is not moved either.
    assert_eq!(a.pin_movable(&movables[0]), regions[0].exec_addr);
    assert!(movables[0].is_pinned());
    assert_eq!(a.compact(1 << 20), 0);
    for m in [&movables[0], &movables[2], &movables[3]] {
        a.free_deferred(a.detach_movable(m));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);

    let t = PackedArena::new(ArenaConfig {
        map_mode: MapMode::Toggle,
        ..ArenaConfig::default()
    })
    .unwrap();
    assert_eq!(
        t.compaction(),
        None,
        "toggle-mode packs are sealed: nothing can move"
    );
    t.set_compaction(Some(Compaction::default()));
    assert_eq!(t.compaction(), None);
}

#[test]
fn a_free_fills_the_hole_an_earlier_free_left_without_waiting_for_a_load() {
    let _s = serial();
    // Commits (and so frees) move code, or only `compact` calls do (maintenance).
    for step_bytes in [32 << 10, 0] {
        let Some(a) = compacting_arena_with_steps(1, step_bytes) else {
            return;
        };
        // X (1) A (1) B (3) C (1) D (2), then the free tail. B goes first; its chunks are
        // released (grace period over) with no load or free after.
        let m = install_movable(&a, &[1, 1, 3, 1, 2]);
        let (b_at, d_old) = (m[2].entry(), m[4].entry());
        a.free_deferred(a.detach_movable(&m[2]));
        assert_eq!(a.reclaim(), 0);
        assert!(a.stats().fragmentation_permille > 0);
        assert_eq!(a.stats().moves, 0, "releases alone move nothing");
        // The next free finds B's chunks released: D, bordering the tail, fills B's hole. X's
        // chunk stays pending until `hold` goes (so another test's epoch traffic cannot free
        // it early and give compaction more to move).
        let hold = epoch_pin();
        a.free_deferred(a.detach_movable(&m[0]));
        if step_bytes == 0 {
            assert_eq!(a.stats().moves, 0, "maintenance mode: frees move nothing");
            assert_eq!(m[4].entry(), d_old);
            assert_eq!(a.compact(1 << 20), 3 * CHUNK, "D and C move when asked");
        } else {
            assert!(a.stats().moves >= 1, "the free moved code");
        }
        assert_eq!(m[4].entry(), b_at, "D into B's hole");
        assert_eq!(call(m[4].entry()), 5);
        assert_eq!(
            call(d_old),
            5,
            "the old copy runs until its grace period ends"
        );
        assert_eq!(call(m[3].entry()), 4);
        drop(hold);
        assert_eq!(a.reclaim(), 0);
        for x in [&m[1], &m[3], &m[4]] {
            a.free_deferred(a.detach_movable(x));
        }
        assert_eq!(a.reclaim(), 0);
        assert_eq!(a.stats().packs, 0);
    }
}

#[test]
fn a_commit_steps_after_a_release_a_step_cut_short_or_new_settings() {
    let _s = serial();
    // Maintenance mode first: releases alone move nothing.
    let Some(a) = compacting_arena(1) else {
        return;
    };
    // X (1) A (1) B (3) C (1) D (2), then the free tail; B goes and its chunks are released.
    let m = install_movable(&a, &[1, 1, 3, 1, 2]);
    let b_at = m[2].entry();
    a.free_deferred(a.detach_movable(&m[2]));
    assert_eq!(a.reclaim(), 0);
    let hold = epoch_pin();
    a.commit();
    assert_eq!(a.stats().moves, 0, "maintenance mode: commits move nothing");
    // Commits move from now on, a chunk per step: the settings changed, so the next commit
    // steps with no release since. D (the first move may exceed the budget) fills most of
    // B's hole.
    a.set_compaction(Some(Compaction {
        threshold_permille: 0,
        step_bytes: CHUNK,
    }));
    a.commit();
    assert_eq!(a.stats().moves, 1, "new settings: the commit stepped");
    assert_eq!(m[4].entry(), b_at, "D into B's hole");
    // That step stopped at its budget: the next commit goes on (still no release, `hold`
    // keeps D's old copy) and C fills the rest of the hole.
    a.commit();
    assert_eq!(
        a.stats().moves,
        2,
        "a step cut short goes on at the next commit"
    );
    assert_eq!(m[3].entry(), b_at + 2 * CHUNK as u64, "C after D");
    assert_eq!((call(m[3].entry()), call(m[4].entry())), (4, 5));
    drop(hold);
    assert_eq!(a.reclaim(), 0);
    for x in [&m[0], &m[1], &m[3], &m[4]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);
}

/// Installs programs of the given chunk counts in order (return values 1, 2, ...), commits
/// them and makes each movable.
fn install_movable(a: &PackedArena, chunks: &[usize]) -> Vec<Arc<Movable>> {
    let regions: Vec<Region> = chunks
        .iter()
        .zip(1u16..)
        .map(|(&n, v)| {
            let mut c = ret_code(v);
            c.resize(n * CHUNK, 0);
            install(a, &c)
        })
        .collect();
    a.commit();
    regions
        .iter()
        .map(|r| a.make_movable(r, r.exec_addr, None).unwrap())
        .collect()
}

fn compacting_arena(pack_pages: usize) -> Option<PackedArena> {
    // Only explicit `compact` calls move code.
    compacting_arena_with_steps(pack_pages, 0)
}

/// [`compacting_arena`] whose commits (and frees) move up to `step_bytes` of code.
fn compacting_arena_with_steps(pack_pages: usize, step_bytes: usize) -> Option<PackedArena> {
    let a = PackedArena::new(ArenaConfig {
        compaction: Some(Compaction {
            threshold_permille: 0,
            step_bytes,
        }),
        pack_size: pack_pages * sys::page_size(),
        ..ArenaConfig::default()
    })
    .unwrap();
    // Without memfd the arena toggles protections and compaction is off (tested above).
    a.compaction().is_some().then_some(a)
}

#[test]
fn a_program_too_large_for_every_hole_moves_to_the_far_end_of_its_run() {
    let _s = serial();
    let Some(a) = compacting_arena(1) else {
        return;
    };
    let page_chunks = sys::page_size() / CHUNK;
    // A (1 chunk) B (2) C (4), then the free tail. Freeing B leaves a hole smaller than C, so C
    // fits no hole; but B's hole is on C's far side, so moving C to the tail's far end makes
    // the hole, C's old chunks and the tail one run.
    let m = install_movable(&a, &[1, 2, 4]);
    let c_old = m[2].entry();
    a.free_deferred(a.detach_movable(&m[1]));
    assert_eq!(a.reclaim(), 0);
    assert!(a.stats().fragmentation_permille > 0);
    assert_eq!(a.compact(1 << 20), 4 * CHUNK, "C moves");
    let base = c_old - 3 * CHUNK as u64;
    assert_eq!(m[2].entry(), base + ((page_chunks - 4) * CHUNK) as u64);
    assert_eq!(call(m[2].entry()), 3);
    assert_eq!(
        call(c_old),
        3,
        "the old copy runs until its grace period ends"
    );
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().fragmentation_permille, 0, "one free run");
    // Nothing left to gain: C's far side is now the end of the pack.
    assert_eq!(a.compact(1 << 20), 0);
    for x in [&m[0], &m[2]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);
}

#[test]
fn a_program_larger_than_its_own_run_moves_to_a_roomier_pack() {
    // Pack 1: A (1) B (2) C (30) F (20) D (rest). Pack 2: E (1) and free space. Freeing B and F
    // leaves F's run (20 chunks) as pack 1's largest: C, below it, is larger than that run and
    // than B's hole, and D above it has no free space beyond. C goes to pack 2, and B's hole,
    // C's chunks and F's run become one run.
    let pack_chunks = 2 * sys::page_size() / CHUNK;
    c_moves_next_to_e(&[1, 2, 30, 20, pack_chunks - 53, 1], false);
}

#[test]
fn near_a_full_arena_a_program_moves_to_a_run_about_the_size_of_the_one_it_frees() {
    // Pack 1: A (1, pinned) B (24) C (30) F (16) D (rest). Pack 2: E (all but 60 chunks) and
    // its free run of 60. Freeing B and F leaves B's run (24) as pack 1's largest, with C
    // above it: C fits no hole, has F's run on its far side, and its own run is smaller than
    // it. Pack 2's run has nowhere near twice C to spare (60 < 24 + 2 * 30), but once C's old
    // copy is released B's run, C's chunks and F's run make a run of 70, longer than the 60
    // C takes from: the arena's largest run grows, and the split space falls by F's 16.
    let pack_chunks = 2 * sys::page_size() / CHUNK;
    c_moves_next_to_e(&[1, 24, 30, 16, pack_chunks - 71, pack_chunks - 60], true);
}

/// Installs A B C F D E (`chunks`; E opens a second pack of two pages), pins A if asked, frees
/// B and F, and checks that a compaction step moves C (30 chunks) and only C, to right after
/// E; that both copies answer until the old one is released; and that each pack's free space
/// is one run after that.
fn c_moves_next_to_e(chunks: &[usize; 6], pin_a: bool) {
    let _s = serial();
    let Some(a) = compacting_arena(2) else {
        return;
    };
    let m = install_movable(&a, chunks);
    assert_eq!(a.stats().packs, 2);
    if pin_a {
        a.pin_movable(&m[0]);
    }
    let (c_old, e) = (m[2].entry(), m[5].entry());
    for x in [&m[1], &m[3]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert!(a.stats().fragmentation_permille > 0);
    assert_eq!(a.compact(1 << 20), 30 * CHUNK, "C moves");
    assert_eq!(
        m[2].entry(),
        e + (chunks[5] * CHUNK) as u64,
        "right after E, in pack 2"
    );
    assert_eq!(call(m[2].entry()), 3);
    assert_eq!(
        call(c_old),
        3,
        "the old copy runs until its grace period ends"
    );
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().fragmentation_permille, 0, "one run per pack");
    for x in [&m[0], &m[2], &m[4], &m[5]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);
}

#[test]
fn a_program_between_two_holes_moves_away_to_make_room_for_a_blocked_one() {
    let _s = serial();
    let Some(a) = compacting_arena(1) else {
        return;
    };
    // A (1) h1 (3) P (2) h2 (3) X (1) h3 (2) Y (1) B (8), then the free tail. Once the h's are
    // freed, B borders the tail but fits no hole, and Y (code) is on its far side. P moved
    // into h3 turns h1, P and h2 into one 8-chunk hole; B then fits it.
    let m = install_movable(&a, &[1, 3, 2, 3, 1, 2, 1, 8]);
    let base = m[0].entry();
    let chunk = |i: u64| base + i * CHUNK as u64;
    for x in [&m[1], &m[3], &m[5]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(
        a.compact(1 << 20),
        2 * CHUNK,
        "only P moves: its room needs a release"
    );
    assert_eq!(m[2].entry(), chunk(10), "into h3");
    assert_eq!(call(m[2].entry()), 3);
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.compact(1 << 20), 8 * CHUNK, "B moves into the room");
    assert_eq!(m[7].entry(), chunk(1));
    assert_eq!(call(m[7].entry()), 8);
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().fragmentation_permille, 0, "one free run");
    for x in [&m[0], &m[2], &m[4], &m[6], &m[7]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);
}

/// Chunks of A h1 P h2 Q h3 X h4 Y B (the h's to be freed by [`free_holes`]), then the free
/// tail.
const STRETCH_LAYOUT: [usize; 10] = [1, 2, 1, 2, 1, 2, 1, 3, 1, 8];

/// Frees and releases h1 to h4 of [`STRETCH_LAYOUT`].
fn free_holes(a: &PackedArena, m: &[Arc<Movable>]) {
    for i in [1, 3, 5, 7] {
        a.free_deferred(a.detach_movable(&m[i]));
    }
    assert_eq!(a.reclaim(), 0);
}

/// Frees and releases the programs of [`STRETCH_LAYOUT`]; the arena gives its pack back.
fn free_all_but_holes(a: &PackedArena, m: &[Arc<Movable>]) {
    for i in [0, 2, 4, 6, 8, 9] {
        a.free_deferred(a.detach_movable(&m[i]));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);
}

#[test]
fn the_programs_of_the_cheapest_stretch_move_away_together_to_make_room() {
    let _s = serial();
    let Some(a) = compacting_arena(1) else {
        return;
    };
    // B borders the tail but fits no hole, and no hole with one program next to it makes 8
    // chunks. h1 P h2 Q h3 does, for two chunks of copying: P and Q move into h4 in one step,
    // and once their old copies are released B fits there.
    let m = install_movable(&a, &STRETCH_LAYOUT);
    let chunk = |i: u64| m[0].entry() + i * CHUNK as u64;
    free_holes(&a, &m);
    // Pinned until the room is checked: the old copies' grace period cannot end before,
    // whatever other tests' threads do to the process-wide epoch meanwhile.
    let hold = epoch_pin();
    assert_eq!(a.compact(1 << 20), 2 * CHUNK, "P and Q move, nothing else");
    let mut moved = [m[2].entry(), m[4].entry()];
    moved.sort_unstable();
    assert_eq!(moved, [chunk(10), chunk(11)], "both into h4");
    assert_eq!((call(m[2].entry()), call(m[4].entry())), (3, 5));
    assert_eq!(a.compact(1 << 20), 0, "the room needs a release");
    drop(hold);
    assert_eq!(a.reclaim(), 0);
    // B moves into the room; then Y borders the tail and fills what is left of h4.
    assert_eq!(a.compact(1 << 20), 9 * CHUNK, "B and Y move");
    assert_eq!((m[9].entry(), m[8].entry()), (chunk(1), chunk(12)));
    assert_eq!((call(m[9].entry()), call(m[8].entry())), (10, 9));
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().fragmentation_permille, 0, "one free run");
    free_all_but_holes(&a, &m);
}

#[test]
fn a_pinned_program_bounds_a_stretch() {
    let _s = serial();
    let Some(a) = compacting_arena(1) else {
        return;
    };
    // Q pinned (a host holds its raw entry): no stretch of 8 chunks avoids it, so nothing
    // makes room; coalescing moves P (the narrowest gap between two holes, the lower one of
    // two) into h3 instead.
    let m = install_movable(&a, &STRETCH_LAYOUT);
    let chunk = |i: u64| m[0].entry() + i * CHUNK as u64;
    let q = a.pin_movable(&m[4]);
    free_holes(&a, &m);
    assert_eq!(a.compact(1 << 20), CHUNK, "only P moves");
    assert_eq!(m[2].entry(), chunk(7), "into h3");
    assert_eq!(m[4].entry(), q, "Q stays");
    assert_eq!(call(q), 5);
    assert_eq!(a.reclaim(), 0);
    free_all_but_holes(&a, &m);
}

#[test]
fn with_no_gaining_move_a_program_between_two_holes_moves_to_merge_them() {
    let _s = serial();
    let Some(a) = compacting_arena(1) else {
        return;
    };
    // A (1) h1 (2) P (1) h2 (2) X (1) h3 (1) Y (1) B (8), then the free tail. Once the h's are
    // freed, B borders the tail but fits no hole, and no hole with its neighbours makes room
    // for it. P (the narrowest gap between two holes) moves into h3, so that h1, P and h2
    // become one 5-chunk hole.
    let m = install_movable(&a, &[1, 2, 1, 2, 1, 1, 1, 8]);
    let base = m[0].entry();
    let chunk = |i: u64| base + i * CHUNK as u64;
    for x in [&m[1], &m[3], &m[5]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    let split_before = a.stats().fragmentation_permille;
    // Pinned until the second step: P's old copy stays unreleased until then (see
    // `the_programs_of_the_cheapest_stretch_move_away_together_to_make_room`).
    let hold = epoch_pin();
    assert_eq!(a.compact(1 << 20), CHUNK, "only P moves");
    assert_eq!(m[2].entry(), chunk(7), "into h3");
    assert_eq!(call(m[2].entry()), 3);
    assert_eq!(a.compact(1 << 20), 0, "nothing more until a release");
    drop(hold);
    assert_eq!(a.reclaim(), 0);
    // The split share is unchanged (5 chunks of holes before and after), but they are one
    // hole now: a 5-chunk program fits where none did.
    assert_eq!(a.stats().fragmentation_permille, split_before);
    let mut code = ret_code(9);
    code.resize(5 * CHUNK, 0);
    let r = install(&a, &code);
    assert_eq!(r.exec_addr, chunk(1), "best fit: the merged hole");
    a.commit();
    assert_eq!(call(r.exec_addr), 9);
    a.free_deferred(r);
    for x in [&m[0], &m[2], &m[4], &m[6], &m[7]] {
        a.free_deferred(a.detach_movable(x));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0);
}

/// Random loads, frees and pins of movable programs, with compaction steps of random budgets
/// between them: every live program keeps answering from wherever it was moved, no two
/// overlap, and everything is released at the end. (Debug builds also check the start bits
/// against the allocations at every coalescing search.)
#[test]
fn random_churn_with_compaction_keeps_every_program_running() {
    let _s = serial();
    // Moves only in `compact` calls (maintenance), and moves in every commit and free too.
    for step_bytes in [0, 8 << 10] {
        let Some(a) = compacting_arena_with_steps(16, step_bytes) else {
            return;
        };
        churn_with_compaction(&a, step_bytes);
    }
}

fn churn_with_compaction(a: &PackedArena, step_bytes: usize) {
    let seed = std::env::var("ARENA_COMPACT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("random_churn_with_compaction_keeps_every_program_running: ARENA_COMPACT_SEED={seed}");
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // (program, the value it returns, pinned entry if pinned)
    let mut live: Vec<(Arc<Movable>, u16, Option<u64>)> = Vec::new();
    let (mut moved, mut moved_by_frees) = (0, 0);
    for step in 0..3_000u32 {
        let ctx = format!("seed {seed}, step_bytes {step_bytes}, step {step}");
        if live.len() < 8 || (live.len() < 150 && next() % 2 == 0) {
            // Mostly a few chunks, sometimes a few hundred (a pack is 1,024 on 4 KiB pages).
            let chunks = if next() % 16 == 0 {
                1 + (next() % 300) as usize
            } else {
                1 + (next() % 24) as usize
            };
            let v = (step % 60_000) as u16 + 1;
            let mut code = ret_code(v);
            code.resize(chunks * CHUNK, 0);
            let r = install(a, &code);
            a.commit();
            live.push((a.make_movable(&r, r.exec_addr, None).unwrap(), v, None));
        } else if next() % 64 == 0 {
            let i = (next() % live.len() as u64) as usize;
            if live[i].2.is_none() {
                live[i].2 = Some(a.pin_movable(&live[i].0));
            }
        } else {
            let i = (next() % live.len() as u64) as usize;
            let (m, _, _) = live.swap_remove(i);
            let before = a.stats().moves;
            a.free_deferred(a.detach_movable(&m));
            moved_by_frees += a.stats().moves - before;
        }
        moved += a.compact(((next() % 16) as usize + 1) << 12);
        if next() % 3 == 0 {
            a.reclaim();
        }
        if step % 25 == 0 {
            let mut regions: Vec<Region> = live.iter().map(|(m, _, _)| m.region()).collect();
            regions.sort_by_key(|r| r.exec_addr);
            for w in regions.windows(2) {
                assert!(
                    w[0].exec_addr + w[0].size <= w[1].exec_addr,
                    "{ctx}: {w:?} overlap"
                );
            }
            for (m, v, pinned) in &live {
                assert_eq!(call(m.entry()), u64::from(*v), "{ctx}");
                if let Some(at) = pinned {
                    assert_eq!(m.entry(), *at, "{ctx}: a pinned program moved");
                }
            }
        }
    }
    assert!(moved > 0, "seed {seed}: compaction calls moved nothing");
    if step_bytes == 0 {
        assert_eq!(
            moved_by_frees, 0,
            "seed {seed}: frees moved code in maintenance mode"
        );
    } else {
        // Frees release earlier frees' chunks (after their grace period) and fill the holes.
        assert!(moved_by_frees > 0, "seed {seed}: no free moved code");
    }
    for (m, _, _) in live {
        a.free_deferred(a.detach_movable(&m));
    }
    assert_eq!(a.reclaim(), 0);
    assert_eq!(a.stats().packs, 0, "seed {seed}: every pack released");
}

#[test]
fn start_bits_tell_one_allocation_from_several_across_words() {
    let _s = serial();
    let a = PackedArena::new(ArenaConfig {
        pack_size: 4 * sys::page_size(),
        ..ArenaConfig::default()
    })
    .unwrap();
    // Sizes that cross 64-chunk words: chunks [0, 3), [3, 73), [73, 74), [74, 204).
    let sizes = [3, 70, 1, 130];
    let regions: Vec<Region> = sizes.iter().map(|&n| a.alloc(n * CHUNK).unwrap()).collect();
    let st = a.lock();
    let p = &st.packs[0];
    let mut start = 0;
    for (k, &n) in sizes.iter().enumerate() {
        assert!(p.one_allocation(start, start + n), "[{start}, +{n})");
        // (The range is taken as used: past the last allocation there is no answer.)
        if k + 1 < sizes.len() {
            assert!(
                !p.one_allocation(start, start + n + 1),
                "past [{start}, +{n})"
            );
        }
        if n > 1 {
            assert!(
                !p.one_allocation(start + 1, start + n),
                "inside [{start}, +{n})"
            );
        }
        start += n;
    }
    assert!(!p.one_allocation(3, 74), "two allocations");
    drop(st);
    a.free(&regions[1]);
    let st = a.lock();
    assert!(
        !st.packs[0].one_allocation(3, 73),
        "freed: no allocation begins at 3"
    );
    drop(st);
    for r in [&regions[0], &regions[2], &regions[3]] {
        a.free(r);
    }
}

#[test]
fn allocations_are_walked_in_address_order_across_words() {
    let _s = serial();
    let a = PackedArena::new(ArenaConfig {
        pack_size: 4 * sys::page_size(),
        ..ArenaConfig::default()
    })
    .unwrap();
    // 256 chunks: [0, 3), [3, 73), [73, 74), [74, 204), [204, 256); then [3, 73) and
    // [204, 256) freed, so a walk must skip a whole empty word (64..128 holds no start) and
    // the end.
    let sizes = [3, 70, 1, 130, 52];
    let regions: Vec<Region> = sizes.iter().map(|&n| a.alloc(n * CHUNK).unwrap()).collect();
    a.free(&regions[1]);
    a.free(&regions[4]);
    let st = a.lock();
    assert_eq!(st.packs.len(), 1, "all in one pack");
    let p = &st.packs[0];
    assert_eq!(p.chunks(), 256);
    let all: Vec<usize> = p.alloc_starts(0, p.chunks()).collect();
    assert_eq!(all, [0, 73, 74]);
    assert_eq!(p.alloc_starts(1, 74).collect::<Vec<_>>(), [73]);
    assert_eq!(p.alloc_starts(75, p.chunks()).count(), 0);
    let from = |at| p.alloc_from(at).map(|(c, a)| (c, a.chunks));
    let below = |at| p.alloc_below(at).map(|(c, a)| (c, a.chunks));
    assert_eq!(from(0), Some((0, 3)));
    assert_eq!(from(1), Some((73, 1)), "over the empty word");
    assert_eq!(from(74), Some((74, 130)));
    assert_eq!(from(75), None);
    assert_eq!(below(0), None);
    assert_eq!(below(1), Some((0, 3)));
    assert_eq!(below(73), Some((0, 3)), "over the empty word");
    assert_eq!(below(128), Some((74, 130)), "from a word boundary");
    assert_eq!(below(p.chunks()), Some((74, 130)), "from the end");
    drop(st);
    for r in [0, 2, 3] {
        a.free(&regions[r]);
    }
}
