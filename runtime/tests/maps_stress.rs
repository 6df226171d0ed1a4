//! Maps and tail calls under concurrency (sandboxed programs on the host's backend; natively
//! on x86-64, under qemu-user for arm64 and RV64 with fewer iterations).
//!
//! Four threads run one program that (1) atomically adds 1 to its thread's own key of a
//! HASH map through the lookup's pointer, (2) updates one of four shared keys with BPF_ANY,
//! and (3) tail calls slot 0 of a prog array. Meanwhile the host updates and deletes the
//! shared keys and keeps replacing slot 0 with freshly loaded targets of two kinds (A adds
//! 1, B adds 2^32 to a second per-thread key and returns 1000 or 2000) or empties it (the
//! fall-through returns 7), dropping its own handle each time, so replaced targets are
//! freed while the threads run. Checked: every run's result is 1000, 2000 or 7; each
//! thread's own counter equals its runs; each thread's target counter equals A's and B's
//! results counted by the thread (so every tail call landed in a live target of one kind);
//! and once everything is dropped the runtime releases every program and the maps go.

mod host;

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{LoadOptions, Program};
use packjit_frontend::encode_insn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

const THREADS: usize = 4;
const SHARED_KEYS: u32 = 4;
/// Own keys are OWN + thread, target counters TARGET + thread.
const OWN: u32 = 100;
const TARGET: u32 = 200;
const FALL_THROUGH: u64 = 7;
const A_RESULT: u64 = 1000;
const B_RESULT: u64 = 2000;
/// A lookup of a key that must exist missed.
const MISSED: u64 = 99;
const E2BIG: u64 = (-7i64) as u64;

/// Runs per thread: fewer under qemu-user, where every run is emulated.
const RUNS: usize = if cfg!(target_arch = "x86_64") {
    400_000
} else {
    10_000
};

fn i(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> Vec<u8> {
    encode_insn(op, dst, src, off, imm).to_vec()
}

/// `lddw dst, map k`.
fn map_ref(dst: u8, k: i32) -> Vec<u8> {
    [i(0x18, dst, 1, 0, k), i(0, 0, 0, 0, 0)].concat()
}

const EXIT: u8 = 0x95;
const CALL: u8 = 0x85;

/// The threads' program; maps: 0 = counts (HASH), 1 = jumps (PROG_ARRAY). Context:
/// `[thread: u32, run: u32, update result: u64]`.
fn runner() -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0), // r6 = ctx
        i(0x61, 7, 6, 0, 0), // r7 = thread
        i(0xbf, 1, 7, 0, 0), // r1 = thread + OWN
        i(0x07, 1, 0, 0, OWN as i32),
        i(0x63, 10, 1, -4, 0), // *(u32 *)(r10 - 4) = r1
        map_ref(1, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        i(CALL, 0, 0, 0, 1), // r0 = lookup(counts, &own)
        i(0x55, 0, 0, 2, 0), // if r0 != 0 goto +2
        i(0xb7, 0, 0, 0, MISSED as i32),
        i(EXIT, 0, 0, 0, 0),
        i(0xb7, 1, 0, 0, 1),
        i(0xdb, 0, 1, 0, 0), // lock *(u64 *)(r0 + 0) += 1
        i(0x61, 1, 6, 4, 0), // r1 = run & (SHARED_KEYS - 1): a shared key
        i(0x57, 1, 0, 0, SHARED_KEYS as i32 - 1),
        i(0x63, 10, 1, -8, 0),
        i(0x7b, 10, 7, -16, 0), // value = thread
        map_ref(1, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -8),
        i(0xbf, 3, 10, 0, 0),
        i(0x07, 3, 0, 0, -16),
        i(0xb7, 4, 0, 0, 0), // BPF_ANY
        i(CALL, 0, 0, 0, 2), // update(counts, &shared, &thread, BPF_ANY)
        i(0x7b, 6, 0, 8, 0), // ctx.update_result = r0
        i(0xbf, 1, 6, 0, 0), // tail call (ctx, jumps, 0)
        map_ref(2, 1),
        i(0xb7, 3, 0, 0, 0),
        i(CALL, 0, 0, 0, 12),
        i(0xb7, 0, 0, 0, FALL_THROUGH as i32),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// A tail-call target (map 0 = counts): `lock counts[TARGET + thread] += add`; returns
/// `result`.
fn target(add_shift: i32, result: u64) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),
        i(0x61, 1, 6, 0, 0), // r1 = thread + TARGET
        i(0x07, 1, 0, 0, TARGET as i32),
        i(0x63, 10, 1, -4, 0),
        map_ref(1, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        i(CALL, 0, 0, 0, 1),
        i(0x55, 0, 0, 2, 0), // if r0 != 0 goto +2
        i(0xb7, 0, 0, 0, MISSED as i32),
        i(EXIT, 0, 0, 0, 0),
        i(0xb7, 1, 0, 0, 1), // r1 = 1 << add_shift
        i(0x67, 1, 0, 0, add_shift),
        i(0xdb, 0, 1, 0, 0), // lock *(u64 *)(r0 + 0) += r1
        i(0xb7, 0, 0, 0, result as i32),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

fn spec(name: &str, map_type: MapType, key: u32, value: u32, entries: u32) -> MapSpec {
    MapSpec {
        name: name.into(),
        map_type,
        key_size: key,
        value_size: value,
        max_entries: entries,
        flags: 0,
    }
}

/// xorshift64*, seeded from `PACKJIT_STRESS_SEED` or the clock (printed).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("PACKJIT_STRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("maps_stress seed: {seed} (PACKJIT_STRESS_SEED={seed} repeats it)");
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32
    }
}

/// Per thread: (results of A, results of B, fall-throughs, update results -E2BIG).
type Tally = (u64, u64, u64, u64);

#[test]
fn threads_tail_call_through_swapped_slots_and_count_exactly_under_host_churn() {
    let rt = host::host_runtime();
    let counts = Map::new(spec("counts", MapType::Hash, 4, 8, 64)).unwrap();
    let jumps = Map::new(spec("jumps", MapType::ProgArray, 4, 4, 1)).unwrap();
    for t in 0..THREADS as u32 {
        for k in [OWN + t, TARGET + t] {
            counts
                .update(&k.to_le_bytes(), &0u64.to_le_bytes(), 0)
                .unwrap();
        }
    }
    let runner_opts = LoadOptions {
        maps: vec![counts.clone(), jumps.clone()],
        ..Default::default()
    };
    let target_opts = LoadOptions {
        maps: vec![counts.clone()],
        ..Default::default()
    };
    let runner = Arc::new(rt.load(&runner(), &runner_opts).unwrap());
    let (code_a, code_b) = (target(0, A_RESULT), target(32, B_RESULT));
    let load_target = |b: bool| -> Arc<Program> {
        Arc::new(
            rt.load(if b { &code_b } else { &code_a }, &target_opts)
                .unwrap(),
        )
    };
    rt.set_prog_array(&jumps, 0, Some(load_target(false)))
        .unwrap();

    let ready = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (runner, ready, finished) = (runner.clone(), ready.clone(), finished.clone());
            std::thread::spawn(move || -> Tally {
                // Race only once every thread and the host are running.
                ready.fetch_add(1, Ordering::AcqRel);
                while ready.load(Ordering::Acquire) < THREADS + 1 {
                    std::hint::spin_loop();
                }
                let mut tally: Tally = (0, 0, 0, 0);
                for run in 0..RUNS {
                    let mut ctx = [0u8; 16];
                    ctx[..4].copy_from_slice(&(t as u32).to_le_bytes());
                    ctx[4..8].copy_from_slice(&(run as u32).to_le_bytes());
                    let r0 = runner.call(&mut ctx).expect("the runner runs");
                    match r0 {
                        A_RESULT => tally.0 += 1,
                        B_RESULT => tally.1 += 1,
                        FALL_THROUGH => tally.2 += 1,
                        other => panic!("thread {t}, run {run}: result {other}"),
                    }
                    let update = u64::from_le_bytes(ctx[8..16].try_into().unwrap());
                    match update {
                        0 => {}
                        // A new key while every spare element waits for its grace period.
                        E2BIG => tally.3 += 1,
                        other => panic!("thread {t}, run {run}: update gave {}", other as i64),
                    }
                }
                finished.fetch_add(1, Ordering::Release);
                tally
            })
        })
        .collect();

    // The host: swaps the slot (a new A or B target, or empty) and updates or deletes the
    // shared keys until every thread is done.
    let mut rng = Rng::new();
    ready.fetch_add(1, Ordering::AcqRel);
    while ready.load(Ordering::Acquire) < THREADS + 1 {
        std::hint::spin_loop();
    }
    let (mut swaps, mut host_ops) = (0u64, 0u64);
    while finished.load(Ordering::Acquire) < THREADS {
        let r = rng.next();
        let slot = match r % 5 {
            0 | 1 => Some(load_target(false)),
            2 | 3 => Some(load_target(true)),
            _ => None,
        };
        rt.set_prog_array(&jumps, 0, slot).unwrap();
        swaps += 1;
        for _ in 0..4 {
            let r = rng.next();
            let key = (r as u32 % SHARED_KEYS).to_le_bytes();
            if r & 16 == 0 {
                counts.update(&key, &9999u64.to_le_bytes(), 0).unwrap();
            } else {
                // Absent already (deleted by the host before) is fine.
                let _ = counts.delete(&key);
            }
            host_ops += 1;
        }
        rt.reclaim();
    }
    let tallies: Vec<Tally> = threads.into_iter().map(|h| h.join().unwrap()).collect();

    let value = |k: u32| -> u64 {
        u64::from_le_bytes(counts.lookup(&k.to_le_bytes()).unwrap().try_into().unwrap())
    };
    let (mut a_total, mut b_total, mut falls, mut e2big) = (0, 0, 0, 0);
    for (t, &(a, b, fall, big)) in tallies.iter().enumerate() {
        let t32 = t as u32;
        assert_eq!(
            a + b + fall,
            RUNS as u64,
            "thread {t}: every run accounted for"
        );
        assert_eq!(
            value(OWN + t32),
            RUNS as u64,
            "thread {t}: own counter exact"
        );
        assert_eq!(
            value(TARGET + t32),
            a + (b << 32),
            "thread {t}: target counter = A's results + B's results << 32"
        );
        a_total += a;
        b_total += b;
        falls += fall;
        e2big += big;
    }
    // Shared keys hold a thread's number, the host's 9999, or are absent.
    for k in 0..SHARED_KEYS {
        if let Ok(v) = counts.lookup(&k.to_le_bytes()) {
            let v = u64::from_le_bytes(v.try_into().unwrap());
            assert!(v < THREADS as u64 || v == 9999, "shared key {k} = {v}");
        }
    }
    println!(
        "{} runs: A {a_total}, B {b_total}, fall-through {falls}; shared-key inserts refused \
         (E2BIG) {e2big}; host: {swaps} slot swaps, {host_ops} shared-key updates/deletes",
        THREADS * RUNS
    );
    assert!(swaps > 1, "the host swapped the slot while the threads ran");
    assert!(a_total + b_total > 0, "some tail calls landed");

    // Everything dropped: every program is released and the maps go with their last
    // owners (the slot's program holds the counts map; the runner both).
    rt.set_prog_array(&jumps, 0, None).unwrap();
    let (weak_counts, weak_jumps): (Weak<Map>, Weak<Map>) =
        (Arc::downgrade(&counts), Arc::downgrade(&jumps));
    drop((runner, counts, jumps, runner_opts, target_opts));
    for _ in 0..2000 {
        packjit::arena::epoch_pin().flush();
        rt.reclaim();
        if rt.live_programs() == 0
            && rt.stats().allocations == 0
            && weak_counts.strong_count() == 0
            && weak_jumps.strong_count() == 0
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(rt.reclaim(), 0, "no free pending");
    assert_eq!(rt.live_programs(), 0, "every program released");
    assert_eq!(rt.stats().allocations, 0, "every program's code released");
    assert_eq!(weak_counts.strong_count(), 0, "the hash map is freed");
    assert_eq!(weak_jumps.strong_count(), 0, "the prog array is freed");
}
