//! Hash maps under concurrent program-side and host-side use, under epoch pins.

mod common;

use common::{map, prog_delete, prog_lookup, prog_update, Rng};
use packjit_maps::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

const THREADS: u64 = 4;
const ROUNDS: u64 = 3_000;

/// Each thread owns one key whose value it increments atomically through lookup_raw
/// pointers; all threads and the host also update, delete and look up a set of shared keys.
/// Owned keys are never replaced, so every increment must be in the final totals.
fn stress(t: MapType) {
    let m = map("conc", t, 8, 16, 64);
    let cpus = Map::possible_cpus() as u32;
    for th in 0..THREADS {
        m.update(
            &(1000 + th).to_ne_bytes(),
            &vec![0; m.host_value_size()],
            BPF_NOEXIST,
        )
        .unwrap();
    }
    let barrier = Arc::new(Barrier::new(THREADS as usize + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|th| {
            let m = Arc::clone(&m);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut rng = Rng(0x1234_5678 + th);
                let own = (1000 + th).to_ne_bytes();
                let cpu = th as u32 % cpus;
                barrier.wait();
                for round in 0..ROUNDS {
                    // Short pins, as one program run each: long ones would hold back the
                    // epoch for every other thread.
                    let pin = crossbeam_epoch::pin();
                    // SAFETY: own has key_size bytes; pinned while the pointer is used.
                    let p = unsafe { m.lookup_raw(own.as_ptr(), cpu) };
                    assert!(!p.is_null(), "own key {th} vanished");
                    // SAFETY: values are 8-aligned with 16 bytes; the first 8 are only ever
                    // accessed atomically by the workers while the key lives.
                    unsafe { AtomicU64::from_ptr(p.cast()) }.fetch_add(1, Ordering::Relaxed);
                    drop(pin);
                    let shared = (rng.below(16)).to_ne_bytes();
                    let mut v = [0u8; 16];
                    v[..8].copy_from_slice(&round.to_ne_bytes());
                    v[8..].copy_from_slice(&round.to_ne_bytes());
                    match rng.below(4) {
                        0 => {
                            // An insert may fail while every spare element waits for a
                            // grace period that pinned, preempted threads hold back
                            // (documented: -E2BIG, LRU -ENOMEM); nothing else may fail.
                            let rc = prog_update(&m, &shared, &v, BPF_ANY, cpu);
                            assert!(rc == 0 || rc == -7 || rc == -12, "update {rc}");
                        }
                        1 => {
                            let rc = prog_delete(&m, &shared);
                            assert!(rc == 0 || rc == -2, "delete {rc}");
                        }
                        _ => {
                            if let Some((_, got)) = prog_lookup(&m, &shared, cpu, false) {
                                // Non-per-CPU updates publish a fresh element: both halves
                                // of a value seen through a pointer always agree.
                                if !t.is_per_cpu() {
                                    assert_eq!(got[..8], got[8..], "torn value");
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    barrier.wait();
    // The host works the same shared keys meanwhile.
    let mut rng = Rng(99);
    let hv = vec![0u8; m.host_value_size()];
    for _ in 0..ROUNDS {
        let k = rng.below(16).to_ne_bytes();
        match rng.below(3) {
            0 => {
                let _ = m.update(&k, &hv, BPF_ANY);
            }
            1 => {
                let _ = m.delete(&k);
            }
            _ => {
                let _ = m.lookup(&k);
                let _ = m.next_key(Some(&k));
            }
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    let stride = 16;
    for th in 0..THREADS {
        let v = m.lookup(&(1000 + th).to_ne_bytes()).unwrap();
        let cpu = if t.is_per_cpu() {
            (th as u32 % cpus) as usize
        } else {
            0
        };
        let n = u64::from_ne_bytes(v[cpu * stride..cpu * stride + 8].try_into().unwrap());
        assert_eq!(n, ROUNDS, "{}: thread {th}'s increments", t.name());
    }
    // Consistency: len matches the keys reachable, each once.
    let keys = m.keys();
    let mut dedup = keys.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), keys.len());
    assert_eq!(keys.len(), m.len(), "{}: count", t.name());
    assert!(m.len() <= 64);
    // Unpinned again, the map recovers: the host can fill it to max_entries.
    for k in 0u64..64 {
        let _ = m.update(&(5000 + k).to_ne_bytes(), &hv, BPF_ANY);
    }
    assert_eq!(m.len(), 64, "{}: full after refilling", t.name());
}

#[test]
fn hash_concurrent_program_and_host() {
    stress(MapType::Hash);
}

#[test]
fn percpu_hash_concurrent_program_and_host() {
    stress(MapType::PercpuHash);
}

#[test]
fn lru_hash_concurrent_program_and_host() {
    stress(MapType::LruHash);
}

#[test]
fn lru_churn_keeps_count_at_max() {
    // Four threads insert distinct keys into a small LRU map: it never holds more than
    // max_entries, and once the threads are done the host inserts evict as usual.
    let m = map("churn", MapType::LruHash, 4, 8, 32);
    let threads: Vec<_> = (0..4u32)
        .map(|th| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..2_000u32 {
                    let k = (th << 24 | i).to_ne_bytes();
                    let rc = prog_update(&m, &k, &[1; 8], BPF_ANY, th);
                    assert!(rc == 0 || rc == -12, "thread {th} insert {i}: {rc}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(m.len() <= 32);
    for k in 0..40u32 {
        m.update(&(u32::MAX - k).to_ne_bytes(), &[2; 8], BPF_ANY)
            .unwrap();
    }
    assert_eq!(m.len(), 32);
    assert_eq!(m.keys().len(), 32);
}

/// Programs' word lookups (`lookup_hash_word`, `lookup_hash_word_in_pool`) while other
/// threads replace, delete and re-insert the same keys: a lookup finds each key that is
/// never deleted, and every value it returns is one of that key's (its first word is the
/// key), never a reused element's. (Its generation words may be torn: when churn has every
/// spare element waiting out its grace period, a replacement copies in place, as the crate
/// doc says.)
fn word_lookups_under_replacement<W: KeyWord>(t: MapType) {
    let size = std::mem::size_of::<W>() as u32;
    // 16 keys in a table of 8 buckets: slots and chains both in use. An LRU map evicts a
    // live key when an insert finds it full, as the kernel's does, and a full count can
    // be reached with a key absent: an insert holds its count slot while it waits for a
    // free element, and a second insert of the same key then finds none. Two spare count
    // slots (one per writer) keep the never-deleted keys from eviction (18 entries make 16
    // buckets: fewer chains there; the plain maps cover those).
    let max_entries = if t == MapType::LruHash { 18 } else { 16 };
    let m = map("word", t, size, 24, max_entries);
    let word = move |k: u64| -> Vec<u8> { k.to_le_bytes()[..size as usize].to_vec() };
    let value = |k: u64, gen: u64| -> Vec<u8> {
        [k, gen, gen].iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    for k in 0..16 {
        m.update(&word(k), &value(k, 0), BPF_ANY).unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|th| {
            let (m, stop) = (Arc::clone(&m), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = Rng(0xabcd + th);
                let mut gen = 1;
                while !stop.load(Ordering::Relaxed) {
                    // Keys 0..8 are replaced only; keys 8..16 deleted and re-inserted too.
                    let k = rng.below(16);
                    gen += 1;
                    let rc = if k >= 8 && rng.below(2) == 0 {
                        prog_delete(&m, &word(k))
                    } else {
                        prog_update(&m, &word(k), &value(k, gen), BPF_ANY, 0)
                    };
                    assert!(rc == 0 || rc == -2 || rc == -7 || rc == -12, "{rc}");
                }
            })
        })
        .collect();
    let mut rng = Rng(7);
    let (mut found, mut checked) = (0u64, 0u64);
    for round in 0..200_000u64 {
        let k = rng.below(16);
        let key = word(k);
        let _pin = crossbeam_epoch::pin();
        // SAFETY: key_size bytes at `key`; `is_hash_word::<W>()`; pinned while read.
        let p = unsafe {
            if round % 2 == 0 {
                m.lookup_hash_word::<W>(key.as_ptr())
            } else {
                m.lookup_hash_word_in_pool::<W>(key.as_ptr())
            }
        };
        if p.is_null() {
            assert!(k >= 8, "key {k}, never deleted, not found");
            continue;
        }
        found += 1;
        // SAFETY: 24 bytes, 8-aligned; the element stays as published while pinned.
        let v: [u64; 3] = unsafe { p.cast::<[u64; 3]>().read() };
        assert_eq!(v[0], k, "another key's value");
        checked += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert!(found > 100_000 && checked == found);
}

#[test]
fn word_lookups_see_only_their_keys_values_under_replacement() {
    assert!(map("w", MapType::Hash, 4, 8, 1).is_hash_word::<u32>());
    word_lookups_under_replacement::<u32>(MapType::Hash);
    word_lookups_under_replacement::<u64>(MapType::Hash);
    word_lookups_under_replacement::<u64>(MapType::LruHash);
}
