//! Churn benchmark: does placement stay dense when programs come and go?
//!
//! 300,000 random loads and frees with up to ~2,000 live programs of 1–4,000 eBPF
//! instructions (the workload of issue 13), straight on the arena, the way `Runtime::load`
//! uses it: every load allocates, writes the program's bytes, commits, and registers the
//! code as relocatable; every free detaches it and releases its chunks at once (what an
//! epoch-deferred free does once its grace period ends). With compaction on, commits and frees move
//! programs into holes; their old copies are freed through the epoch like in the runtime
//! (the loop flushes this thread's epoch once per operation, which ends their grace periods;
//! the arena's next call releases them). Program lengths are log-uniform over 1..=4,000 instructions
//! (most programs are small, a few are large); native size = arm64 bytes for that many
//! instructions, calibrated at start-up with the real arm64 backend on ALU instructions.
//!
//! Every placement configuration runs the SAME operation sequence (same seed). Figures are
//! sampled every 1% of the operations (printed every 10%), then summarised side by side:
//! * fragmentation (`ArenaStats::fragmentation_permille`, unchanged definition): the share
//!   of free chunks lying outside their pack's largest free run, i.e.
//!   `sum over packs (free - largest free run) / sum over packs free`;
//! * split: those free bytes outside the largest runs (the numerator), in KiB;
//! * below peak: how far the used bytes are under their high-water mark so far — random frees
//!   leave holes where programs were, so split space follows this swing;
//! * used/resident: bytes handed out / bytes of pack memory resident (trap-filled pages);
//!   code/resident: bytes of code written / resident (differs from used/resident by the
//!   64-byte rounding and any size-class rounding);
//! * moved: bytes of code compaction copied per load (mean);
//! * maint/L: time spent in maintenance `compact` calls, per load (the "maintenance"
//!   configuration moves nothing in loads and calls `compact(32 KiB)` every 10 operations,
//!   outside the timed loads);
//! * load throughput: alloc + write + commit (+ compaction step) + register, per second.
//!
//! `cargo bench -p packjit --bench churn` (env: CHURN_OPS, CHURN_LIVE, CHURN_SEED, and
//! CHURN_ONLY=text to run only the configurations whose name contains it).
//! The same workload through the C API with real compiled programs:
//! `cargo run --release -p packjit-ffi --example churn`.

use packjit::{
    ArenaConfig, CodeArena, Compaction, LoadOptions, Movable, PackedArena, Placement, Runtime,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `mov r0, 0 ; (n - 2) × add r0, 1 ; exit`.
fn alu_prog(n: usize) -> Vec<u8> {
    let mut v = vec![0xb7, 0, 0, 0, 0, 0, 0, 0];
    for _ in 2..n.max(2) {
        v.extend_from_slice(&[0x07, 0, 0, 0, 1, 0, 0, 0]);
    }
    v.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    v
}

/// (fixed bytes, bytes per instruction) of arm64 code, from two real compilations.
fn calibrate() -> (f64, f64) {
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .unwrap();
    let opts = LoadOptions {
        arch: Some(packjit::Arch::Aarch64),
        ..Default::default()
    };
    let size = |n| rt.load(&alu_prog(n), &opts).unwrap().code_size() as f64;
    let (a, b) = (size(2), size(4002));
    let per = (b - a) / 4000.0;
    (a - 2.0 * per, per)
}

#[derive(Default)]
struct Summary {
    frag_final: f64,
    frag_max: f64,
    /// (op, packs, used KiB, split KiB, reserved KiB) at the fragmentation peak.
    at_max: (u64, usize, usize, usize, usize),
    frag_mean: f64,
    split_max_kib: usize,
    ur_min: f64,
    ur_mean: f64,
    cr_min: f64,
    cr_mean: f64,
    packs_max: usize,
    moved_per_load: f64,
    /// Time in maintenance `compact` calls, per load.
    maint_ns_per_load: f64,
    pending_max: usize,
    loads_per_s: f64,
    frees_per_s: f64,
}

fn run(
    name: &str,
    cfg: ArenaConfig,
    seed: u64,
    ops: u64,
    live_max: usize,
    model: (f64, f64),
    maint: Option<(u64, usize)>,
) -> Summary {
    let arena = PackedArena::new(cfg).unwrap();
    let mut t_maint = Duration::ZERO;
    let mut rng = Rng(seed);
    let code = vec![0xd5u8; 64 << 10];
    let mut live: Vec<std::sync::Arc<Movable>> = Vec::with_capacity(live_max);
    let (mut t_load, mut t_free) = (Duration::ZERO, Duration::ZERO);
    let (mut loads, mut frees) = (0u64, 0u64);
    let mut sum = Summary {
        ur_min: f64::MAX,
        cr_min: f64::MAX,
        ..Default::default()
    };
    let (mut ur_sum, mut cr_sum, mut frag_sum, mut n_samples) = (0.0, 0.0, 0.0, 0);
    let mut peak_used = 0;
    // Sample every 1% of the operations so the maximum is not missed between prints.
    let step = (ops / 100).max(1);
    println!(
        "\n[{name}] placement {:?}, release free pages {}, {} KiB packs, compaction {:?}",
        cfg.placement,
        cfg.release_free_pages,
        cfg.pack_size / 1024,
        cfg.compaction
    );
    println!(
        "  {:>8} {:>6} {:>5} {:>9} {:>9} {:>10} {:>10} {:>10} {:>6} {:>10}",
        "ops",
        "live",
        "packs",
        "used KiB",
        "resid KiB",
        "used/resid",
        "code/resid",
        "below peak",
        "split",
        "fragment."
    );
    // Live count hovers between 75% and 100% of `live_max` after the initial ramp.
    for op in 1..=ops {
        let load = live.len() < live_max * 3 / 4 || (live.len() < live_max && rng.next() % 2 == 0);
        if load {
            let insns = (4000f64).powf(rng.unit()).round().max(1.0);
            let bytes = (model.0 + model.1 * insns).round().max(4.0) as usize;
            let t = Instant::now();
            let r = arena.alloc(bytes).unwrap();
            arena.write(&r, 0, &code[..bytes]).unwrap();
            arena.commit();
            let m = arena.make_movable(&r, r.exec_addr, None).unwrap();
            t_load += t.elapsed();
            loads += 1;
            live.push(m);
        } else {
            let m = live.swap_remove((rng.next() % live.len() as u64) as usize);
            let t = Instant::now();
            let r = arena.detach_movable(&m);
            arena.free(&r);
            t_free += t.elapsed();
            frees += 1;
        }
        // Lets the epoch advance so old copies of moved programs are released, as the
        // runtime's own pins and flushes do.
        packjit::arena::epoch_pin().flush();
        if let Some((every, bytes)) = maint {
            if op % every == 0 {
                let t = Instant::now();
                arena.compact(bytes);
                t_maint += t.elapsed();
            }
        }
        if op % step == 0 {
            let s = arena.stats();
            peak_used = peak_used.max(s.bytes_used);
            let ur = s.bytes_used as f64 / s.bytes_resident.max(1) as f64;
            let cr = s.bytes_code as f64 / s.bytes_resident.max(1) as f64;
            let frag = s.fragmentation_permille as f64 / 10.0;
            // The metric's numerator, back from per mille of the free bytes.
            let split_kib =
                (s.bytes_reserved - s.bytes_used) * s.fragmentation_permille as usize / 1000 / 1024;
            if op % (step * 10) == 0 {
                println!(
                    "  {op:>8} {:>6} {:>5} {:>9} {:>9} {:>10.3} {:>10.3} {:>10} {:>6} {:>9.1}%",
                    live.len(),
                    s.packs,
                    s.bytes_used / 1024,
                    s.bytes_resident / 1024,
                    ur,
                    cr,
                    (peak_used - s.bytes_used) / 1024,
                    split_kib,
                    frag
                );
            }
            // Steady state only: skip the first tenth (ramp-up, while the packs first fill).
            if op > ops / 10 {
                if frag > sum.frag_max {
                    sum.frag_max = frag;
                    sum.at_max = (
                        op,
                        s.packs,
                        s.bytes_used >> 10,
                        split_kib,
                        s.bytes_reserved >> 10,
                    );
                }
                sum.split_max_kib = sum.split_max_kib.max(split_kib);
                sum.ur_min = sum.ur_min.min(ur);
                sum.cr_min = sum.cr_min.min(cr);
                ur_sum += ur;
                cr_sum += cr;
                frag_sum += frag;
                n_samples += 1;
            }
            sum.frag_final = frag;
            sum.pending_max = sum.pending_max.max(s.pending_frees);
            sum.packs_max = sum.packs_max.max(s.packs);
        }
    }
    for m in live.drain(..) {
        arena.free(&arena.detach_movable(&m));
    }
    let moved = arena.stats().bytes_moved;
    assert_eq!(arena.reclaim(), 0, "old copies released");
    let end = arena.stats();
    assert_eq!(
        (end.packs, end.allocations, end.bytes_used),
        (0, 0, 0),
        "everything released"
    );
    let n = n_samples.max(1) as f64;
    sum.ur_mean = ur_sum / n;
    sum.cr_mean = cr_sum / n;
    sum.frag_mean = frag_sum / n;
    println!(
        "  fragmentation peak {:.1}% at op {}: {} packs, {} KiB used of {} KiB, {} KiB split",
        sum.frag_max, sum.at_max.0, sum.at_max.1, sum.at_max.2, sum.at_max.4, sum.at_max.3
    );
    sum.moved_per_load = moved as f64 / loads.max(1) as f64;
    sum.maint_ns_per_load = t_maint.as_secs_f64() * 1e9 / loads.max(1) as f64;
    sum.loads_per_s = loads as f64 / t_load.as_secs_f64();
    sum.frees_per_s = frees as f64 / t_free.as_secs_f64();
    sum
}

fn main() {
    let ops = env("CHURN_OPS", 300_000);
    let live = env("CHURN_LIVE", 2_000) as usize;
    let seed = env("CHURN_SEED", 0xc0de);
    let model = calibrate();
    println!(
        "churn: {ops} random loads/frees, up to {live} live programs of 1-4000 insns (log-uniform), seed {seed:#x}"
    );
    println!(
        "size model (arm64 backend, ALU code): {:.0} B + {:.2} B per eBPF insn",
        model.0, model.1
    );
    // Placement alternatives are measured without compaction, as before it existed.
    let on = ArenaConfig::default();
    let base = ArenaConfig {
        compaction: None,
        ..on
    };
    let configs = [
        (
            "first fit, no page release (the original)",
            ArenaConfig {
                placement: Placement::FirstFit,
                release_free_pages: false,
                ..base
            },
        ),
        (
            "first fit",
            ArenaConfig {
                placement: Placement::FirstFit,
                ..base
            },
        ),
        ("best fit, no compaction", base),
        ("best fit + compaction (default)", on),
        (
            "best fit + compaction, 16 KiB steps",
            ArenaConfig {
                compaction: Some(Compaction {
                    step_bytes: 16 << 10,
                    ..Compaction::default()
                }),
                ..on
            },
        ),
        (
            "best fit + compaction, maintenance",
            ArenaConfig {
                compaction: Some(Compaction {
                    step_bytes: 0,
                    ..Compaction::default()
                }),
                ..on
            },
        ),
        (
            "best fit + compaction, threshold 10%",
            ArenaConfig {
                compaction: Some(Compaction {
                    threshold_permille: 100,
                    ..Compaction::default()
                }),
                ..on
            },
        ),
        (
            "best fit, two-ended (>= 16 chunks high)",
            ArenaConfig {
                placement: Placement::BestFitTwoEnded { large_chunks: 16 },
                ..base
            },
        ),
        (
            "best fit, two-ended (>= 64 chunks high)",
            ArenaConfig {
                placement: Placement::BestFitTwoEnded { large_chunks: 64 },
                ..base
            },
        ),
        (
            "size classes, 4 per doubling",
            ArenaConfig {
                placement: Placement::SizeClasses { steps_log2: 2 },
                ..base
            },
        ),
        (
            "size classes, 16 per doubling",
            ArenaConfig {
                placement: Placement::SizeClasses { steps_log2: 4 },
                ..base
            },
        ),
        // Not a placement: shows how much the ratio depends on untouched address space.
        (
            "best fit, 4 MiB packs (metric check)",
            ArenaConfig {
                pack_size: 4 << 20,
                ..base
            },
        ),
    ];
    // CHURN_ONLY=word runs only the configurations whose name contains it.
    let only = std::env::var("CHURN_ONLY").unwrap_or_default();
    let results: Vec<_> = configs
        .iter()
        .filter(|(name, _)| name.contains(only.as_str()))
        .map(|&(name, cfg)| {
            // "maintenance": loads move nothing (step 0); a compaction call every 10 ops.
            let maint = name.contains("maintenance").then_some((10, 32 << 10));
            (name, run(name, cfg, seed, ops, live, model, maint))
        })
        .collect();
    println!(
        "\nsummary (steady state = samples every 1% after the first tenth of the ops; split = \
         free KiB outside the largest run of their pack):"
    );
    println!(
        "  {:<42} {:>17} {:>9} {:>15} {:>15} {:>5} {:>7} {:>7} {:>8} {:>8} {:>8}",
        "placement",
        "frag end/mean/max",
        "split max",
        "used/res min/avg",
        "code/res min/avg",
        "packs",
        "moved/L",
        "pending",
        "loads/s",
        "maint/L",
        "frees/s"
    );
    for (name, s) in &results {
        println!(
            "  {:<42} {:>4.1}/{:>4.1}/{:>4.1}% {:>5} KiB {:>7.3}/{:<7.3} {:>7.3}/{:<7.3} {:>5} {:>6.0}B {:>7} {:>7.0}k {:>6.0}ns {:>7.0}k",
            name,
            s.frag_final,
            s.frag_mean,
            s.frag_max,
            s.split_max_kib,
            s.ur_min,
            s.ur_mean,
            s.cr_min,
            s.cr_mean,
            s.packs_max,
            s.moved_per_load,
            s.pending_max,
            s.loads_per_s / 1e3,
            s.maint_ns_per_load,
            s.frees_per_s / 1e3
        );
    }
}
