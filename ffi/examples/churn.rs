//! Churn through the C API: does the code arena stay dense when programs come and go?
//!
//! The scenario of issue 13 as a new user would run it: a runtime from
//! `packjit_runtime_create`, the host's backend plugin from `packjit_load_host_plugin`, then
//! random `packjit_program_load` / `packjit_program_free` calls with up to `--live` programs
//! alive (after the ramp the live count wanders between 75% and 100% of it). Programs are
//! `mov r0, k ; (n - 2) x add r0, k ; exit` with n log-uniform over 2..=4,000 eBPF
//! instructions and k random, compiled sandboxed like any `packjit_program_load`; each is run
//! right after its load and again just before its free, and both answers must be k * (n - 1).
//! The same operation sequence (same seed) runs on three runtimes in one process, in lockstep
//! (each operation on every runtime before the next, the first of them rotating), so the
//! machine's noise weighs on all three alike:
//! * compaction off (`packjit_runtime_set_compaction(rt, 1000, 0)`: code never moves);
//! * the defaults: every free that finds chunks released moves up to a step of code into
//!   holes while fragmentation is above the threshold (loads leave that step to frees);
//! * maintenance only (`packjit_runtime_set_compaction(rt, threshold, 0)`): loads and frees
//!   move nothing; the host calls `packjit_runtime_compact(rt, --maint-bytes)` every
//!   `--maint-every` operations, timed apart from the loads (its cost is printed).
//!
//! Every 1% of the operations it samples `packjit_runtime_stats` (printing every 10%):
//! fragmentation (the arena's own figure: free chunks outside the largest free run of their
//! pack, per mille of all free chunks), split (those free KiB), below peak (KiB the used
//! bytes are under their high-water mark so far: random frees leave holes where programs
//! were, and split space follows this swing), used/resident, code/resident, pending frees. At the end
//! it frees everything, reclaims, and checks that no pack, allocation or pending free is
//! left.
//!
//! ```text
//! cargo run --release -p packjit-ffi --example churn -- [--ops N] [--live N] [--seed S]
//!     [--only off|on|maint] [--threshold PERMILLE] [--step BYTES] [--maint-every OPS]
//!     [--maint-bytes BYTES] [--rounds R]
//! source scripts/env.sh; packjit_cross_cargo aarch64-unknown-linux-gnu run --release \
//!     -p packjit-ffi --example churn -- --ops 30000
//! ```
//! Defaults: 300,000 operations, 2,000 live, seed 0xc0de. Plugins are looked for in
//! `$PACKJIT_PLUGIN_DIR`, else in the `deps/` directory next to this example (where cargo
//! puts the backend cdylibs this package's dev-dependencies build).
//!
//! It ends with each leg's load throughput over the compaction-off leg's. `--rounds R` runs
//! the whole sequence R times (tables from the first round only) and prints every round's
//! ratio, their mean and its 95% confidence interval.
//!
//! Load throughput is loads per second of `packjit_program_load` time (verify + compile +
//! place + write + commit); frees per second of `packjit_program_free` time (the code itself
//! is released later, after its grace period).

// The C API compiled into this example, called exactly as a C host would call it (the ffi
// crate builds no rlib; see tests/c_api.rs).
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;

use packjit::*;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
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

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(packjit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn check(st: i32, what: &str) {
    assert_eq!(st, PJ_OK, "{what}: {}", last_error());
}

/// `mov r0, k ; (n - 2) x add r0, k ; exit`, which returns k * (n - 1).
fn program(n: usize, k: i32) -> Vec<u8> {
    let imm = k.to_le_bytes();
    let mut v = Vec::with_capacity(n * 8);
    v.extend_from_slice(&[0xb7, 0, 0, 0]);
    v.extend_from_slice(&imm);
    for _ in 2..n {
        v.extend_from_slice(&[0x07, 0, 0, 0]);
        v.extend_from_slice(&imm);
    }
    v.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    v
}

struct Live {
    prog: *mut PackjitProgram,
    answer: u64,
}

fn run(prog: *mut PackjitProgram) -> u64 {
    let mut ctx = [0u8; 8];
    let mut r0 = 0;
    // SAFETY: a live program handle; ctx is a valid 8-byte buffer for the call.
    let st = unsafe { packjit_program_run(prog, ctx.as_mut_ptr().cast(), ctx.len(), &mut r0) };
    check(st, "packjit_program_run");
    r0
}

fn stats(rt: *const PackjitRuntime) -> PackjitArenaStats {
    let mut s = PackjitArenaStats {
        struct_size: std::mem::size_of::<PackjitArenaStats>() as u32,
        ..Default::default()
    };
    // SAFETY: live runtime, struct_size set.
    check(
        unsafe { packjit_runtime_stats(rt, &mut s) },
        "packjit_runtime_stats",
    );
    s
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => {
            let v = args
                .get(i + 1)
                .unwrap_or_else(|| panic!("{name} needs a value"));
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{name} {v}: {e}"))
        }
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Off,
    /// (threshold, step bytes) of `packjit_runtime_set_compaction`.
    OnLoad(u32, u64),
    /// (threshold, every N ops, max bytes per `packjit_runtime_compact`).
    Maintenance(u32, u64, u64),
}

struct Summary {
    maint_us: f64,
    frag_mean: f64,
    frag_max: f64,
    split_max: u64,
    ur_mean: f64,
    ur_min: f64,
    packs_max: u64,
    loads_per_s: f64,
    us_per_load: f64,
    frees_per_s: f64,
}

/// Whether a round prints each leg's tables (the first round) or only returns the summaries
/// (the repeat rounds of `--rounds`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Tables,
    Quiet,
}

/// One operation of the workload, the same for every leg.
enum Op {
    /// Load `mov r0, k ; (n - 2) x add r0, k ; exit`.
    Load { n: usize, k: i32 },
    /// Free the live program at this index (`swap_remove` order, the same in every leg).
    Free(usize),
}

/// The workload on one runtime: its state and its figures so far.
struct Leg {
    name: &'static str,
    mode: Mode,
    rt: *mut PackjitRuntime,
    live: Vec<Live>,
    t_load: Duration,
    t_free: Duration,
    t_maint: Duration,
    loads: u64,
    frees: u64,
    runs: u64,
    frag_max: f64,
    frag_sum: f64,
    ur_min: f64,
    ur_sum: f64,
    samples: u64,
    packs_max: u64,
    peak_used: u64,
    split_max: u64,
    /// (op, packs, used KiB, split KiB) at the highest fragmentation sample.
    at_max: (u64, u64, u64, u64),
    /// The table printed for this leg (a row every 10% of the operations).
    rows: Vec<String>,
}

/// Where the backend plugins are: `$PACKJIT_PLUGIN_DIR`, else `deps/` next to `examples/`.
fn plugin_dir() -> CString {
    let dir = std::env::var_os("PACKJIT_PLUGIN_DIR").unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("own path");
        exe.parent()
            .and_then(|d| d.parent())
            .expect("examples/ has a parent")
            .join("deps")
            .into_os_string()
    });
    CString::new(dir.into_encoded_bytes()).expect("no NUL in a path")
}

impl Leg {
    /// A fresh runtime with the host's plugin and this leg's compaction settings.
    fn new(name: &'static str, mode: Mode) -> Leg {
        let mut rt = null_mut();
        // SAFETY: NULL config = defaults; valid out pointer.
        check(
            unsafe { packjit_runtime_create(null(), &mut rt) },
            "packjit_runtime_create",
        );
        let (threshold, step) = match mode {
            Mode::Off => (1000, 0),
            Mode::OnLoad(t, s) => (t, s),
            Mode::Maintenance(t, ..) => (t, 0),
        };
        // SAFETY: live runtime.
        check(
            unsafe { packjit_runtime_set_compaction(rt, threshold, step) },
            "packjit_runtime_set_compaction",
        );
        let dir = plugin_dir();
        // SAFETY: live runtime; NUL-terminated dir; NULL info.
        let st = unsafe { packjit_load_host_plugin(rt, dir.as_ptr(), null_mut()) };
        check(st, "packjit_load_host_plugin");
        Leg {
            name,
            mode,
            rt,
            live: Vec::new(),
            t_load: Duration::ZERO,
            t_free: Duration::ZERO,
            t_maint: Duration::ZERO,
            loads: 0,
            frees: 0,
            runs: 0,
            frag_max: 0.0,
            frag_sum: 0.0,
            ur_min: 9.9,
            ur_sum: 0.0,
            samples: 0,
            packs_max: 0,
            peak_used: 0,
            split_max: 0,
            at_max: (0, 0, 0, 0),
            rows: Vec::new(),
        }
    }

    fn apply(&mut self, op_index: u64, op: &Op, code: &[u8]) {
        match *op {
            Op::Load { n, k } => {
                let mut prog = null_mut();
                let t = Instant::now();
                // SAFETY: live runtime; code borrowed for the call; NULL options = defaults
                // (sandboxed); valid out pointer.
                let st = unsafe {
                    packjit_program_load(self.rt, code.as_ptr(), code.len(), null(), &mut prog)
                };
                self.t_load += t.elapsed();
                check(st, "packjit_program_load");
                self.loads += 1;
                let answer = k as u64 * (n as u64 - 1);
                assert_eq!(
                    run(prog),
                    answer,
                    "{}: program of {n} insns (k = {k}) right after load",
                    self.name
                );
                self.runs += 1;
                self.live.push(Live { prog, answer });
            }
            Op::Free(i) => {
                let l = self.live.swap_remove(i);
                assert_eq!(
                    run(l.prog),
                    l.answer,
                    "{}: program before its free",
                    self.name
                );
                self.runs += 1;
                let t = Instant::now();
                // SAFETY: a live handle, freed once.
                unsafe { packjit_program_free(l.prog) };
                self.t_free += t.elapsed();
                self.frees += 1;
            }
        }
        if let Mode::Maintenance(_, every, bytes) = self.mode {
            if op_index % every == 0 {
                let t = Instant::now();
                // SAFETY: live runtime; NULL moved.
                check(
                    unsafe { packjit_runtime_compact(self.rt, bytes, null_mut()) },
                    "packjit_runtime_compact",
                );
                self.t_maint += t.elapsed();
            }
        }
    }

    /// Samples the arena's figures after operation `op` of `ops`; `row` keeps a table row.
    fn sample(&mut self, op: u64, ops: u64, row: bool) {
        let s = stats(self.rt);
        let ur = s.bytes_used as f64 / s.bytes_resident.max(1) as f64;
        let cr = s.bytes_code as f64 / s.bytes_resident.max(1) as f64;
        let frag = s.fragmentation_permille as f64 / 10.0;
        self.peak_used = self.peak_used.max(s.bytes_used);
        // The metric's numerator, back from per mille of the free bytes.
        let split = (s.bytes_reserved - s.bytes_used) * s.fragmentation_permille as u64 / 1000;
        if row {
            self.rows.push(format!(
                "  {op:>8} {:>6} {:>5} {:>9} {:>9} {:>10.3} {:>10.3} {:>7} {:>10} {:>6} {:>8.1}%",
                self.live.len(),
                s.packs,
                s.bytes_used / 1024,
                s.bytes_resident / 1024,
                ur,
                cr,
                s.pending_frees,
                (self.peak_used - s.bytes_used) / 1024,
                split / 1024,
                frag
            ));
        }
        // Steady state: after the first tenth (the ramp while the packs first fill).
        if op > ops / 10 {
            if frag > self.frag_max {
                self.frag_max = frag;
                self.at_max = (op, s.packs, s.bytes_used / 1024, split / 1024);
            }
            self.split_max = self.split_max.max(split);
            self.ur_min = self.ur_min.min(ur);
            self.frag_sum += frag;
            self.ur_sum += ur;
            self.samples += 1;
        }
        self.packs_max = self.packs_max.max(s.packs);
    }

    /// Runs and frees what is left, checks that the arena gave everything back, destroys
    /// the runtime and prints (with `Output::Tables`) the leg's table and figures.
    fn finish(mut self, elapsed: Duration, out: Output) -> Summary {
        for l in self.live.drain(..) {
            assert_eq!(
                run(l.prog),
                l.answer,
                "{}: program before the final free",
                self.name
            );
            self.runs += 1;
            // SAFETY: a live handle, freed once.
            unsafe { packjit_program_free(l.prog) };
        }
        let mut pending = u64::MAX;
        // SAFETY: live runtime; valid out pointer.
        check(
            unsafe { packjit_reclaim(self.rt, &mut pending) },
            "packjit_reclaim",
        );
        let end = stats(self.rt);
        assert_eq!(
            (
                pending,
                end.packs,
                end.allocations,
                end.bytes_used,
                end.pending_frees
            ),
            (0, 0, 0, 0, 0),
            "{}: everything released",
            self.name
        );
        // SAFETY: live runtime, not used again.
        unsafe { packjit_runtime_destroy(self.rt) };
        let n = self.samples.max(1) as f64;
        let s = Summary {
            maint_us: self.t_maint.as_secs_f64() * 1e6 / self.loads.max(1) as f64,
            frag_mean: self.frag_sum / n,
            frag_max: self.frag_max,
            split_max: self.split_max / 1024,
            ur_mean: self.ur_sum / n,
            ur_min: self.ur_min,
            packs_max: self.packs_max,
            loads_per_s: self.loads as f64 / self.t_load.as_secs_f64(),
            us_per_load: self.t_load.as_secs_f64() * 1e6 / self.loads.max(1) as f64,
            frees_per_s: self.frees as f64 / self.t_free.as_secs_f64(),
        };
        if out == Output::Quiet {
            return s;
        }
        println!("\n[{}]", self.name);
        println!(
            "  {:>8} {:>6} {:>5} {:>9} {:>9} {:>10} {:>10} {:>7} {:>10} {:>6} {:>9}",
            "ops",
            "live",
            "packs",
            "used KiB",
            "resid KiB",
            "used/resid",
            "code/resid",
            "pending",
            "below peak",
            "split",
            "fragment."
        );
        for row in &self.rows {
            println!("{row}");
        }
        println!(
            "end: {} packs, {} allocations, {} B used, {} B resident, {} pending frees",
            end.packs, end.allocations, end.bytes_used, end.bytes_resident, end.pending_frees
        );
        println!(
            "summary: {} runs all right; steady state fragmentation mean {:.1}% max {:.1}%, \
             split max {} KiB, used/resident mean {:.3} min {:.3}, packs max {}",
            self.runs, s.frag_mean, s.frag_max, s.split_max, s.ur_mean, s.ur_min, s.packs_max
        );
        let m = self.at_max;
        println!(
            "fragmentation peak at op {}: {} packs, {} KiB used, {} KiB split",
            m.0, m.1, m.2, m.3
        );
        println!(
            "throughput: {:.1}k loads/s ({} loads, {:.1} us each), {:.0}k frees/s ({}), \
             {:.1} s for all legs",
            s.loads_per_s / 1e3,
            self.loads,
            s.us_per_load,
            s.frees_per_s / 1e3,
            self.frees,
            elapsed.as_secs_f64()
        );
        s
    }
}

/// One round: the same operations on every leg's runtime in lockstep, each operation on
/// every leg before the next (which leg goes first rotates), so that the machine's speed
/// drifting over the run weighs on every leg alike.
fn round(
    legs: &[(&'static str, Mode)],
    ops: u64,
    live_max: usize,
    seed: u64,
    out: Output,
) -> Vec<Summary> {
    let mut runtimes: Vec<Leg> = legs
        .iter()
        .map(|&(name, mode)| Leg::new(name, mode))
        .collect();
    let mut rng = Rng(seed);
    let step = (ops / 100).max(1);
    let started = Instant::now();
    for op_index in 1..=ops {
        // Every leg has the same live count: the operations so far were the same.
        let live = runtimes[0].live.len();
        let load = live < live_max * 3 / 4 || (live < live_max && rng.next() % 2 == 0);
        let (op, code) = if load {
            let n = ((4000f64).powf(rng.unit()).round() as usize).max(2);
            let k = (rng.next() % 1000) as i32 + 1;
            (Op::Load { n, k }, program(n, k))
        } else {
            (Op::Free((rng.next() % live as u64) as usize), Vec::new())
        };
        let first = op_index as usize % runtimes.len();
        for k in 0..runtimes.len() {
            let i = (first + k) % runtimes.len();
            runtimes[i].apply(op_index, &op, &code);
        }
        if op_index % step == 0 {
            let row = out == Output::Tables && op_index % (step * 10) == 0;
            for leg in &mut runtimes {
                leg.sample(op_index, ops, row);
            }
        }
    }
    let elapsed = started.elapsed();
    runtimes
        .into_iter()
        .map(|leg| leg.finish(elapsed, out))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ops = arg(&args, "--ops", 300_000);
    let live_max = arg(&args, "--live", 2_000) as usize;
    let seed = arg(&args, "--seed", 0xc0de);
    let rounds = arg(&args, "--rounds", 1).max(1) as usize;
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    println!(
        "churn through the C API: {ops} random loads/frees, up to {live_max} live programs of \
         2-4000 insns (log-uniform), seed {seed:#x}, {}",
        std::env::consts::ARCH
    );
    let d = packjit_runtime::Compaction::default();
    let threshold = arg(&args, "--threshold", d.threshold_permille as u64) as u32;
    let step = arg(&args, "--step", d.step_bytes as u64);
    let every = arg(&args, "--maint-every", 10);
    let bytes = arg(&args, "--maint-bytes", 32 << 10);
    let legs: Vec<(&str, Mode)> = [
        ("off", "compaction off", Mode::Off),
        (
            "on",
            "on, in frees (default)",
            Mode::OnLoad(threshold, step),
        ),
        (
            "maint",
            "on, maintenance calls",
            Mode::Maintenance(threshold, every, bytes),
        ),
    ]
    .into_iter()
    .filter(|(key, ..)| only.as_deref().is_none_or(|o| o == *key))
    .map(|(_, name, mode)| (name, mode))
    .collect();
    assert!(!legs.is_empty(), "--only takes off, on or maint");
    let results = round(&legs, ops, live_max, seed, Output::Tables);
    let mut loads_per_s: Vec<Vec<f64>> = vec![results.iter().map(|s| s.loads_per_s).collect()];
    for r in 1..rounds {
        let rates: Vec<f64> = round(&legs, ops, live_max, seed, Output::Quiet)
            .iter()
            .map(|s| s.loads_per_s)
            .collect();
        println!("round {}: loads/s {:.0?}", r + 1, rates);
        loads_per_s.push(rates);
    }
    println!("\nsummary (steady state = samples every 1% after the first tenth of the ops):");
    println!(
        "  {:<24} {:>15} {:>9} {:>15} {:>5} {:>9} {:>9} {:>10} {:>8}",
        "arena",
        "frag mean/max",
        "split max",
        "used/res min/avg",
        "packs",
        "loads/s",
        "us/load",
        "maint/load",
        "frees/s"
    );
    for ((name, _), s) in legs.iter().zip(&results) {
        println!(
            "  {:<24} {:>6.1}/{:>5.1}% {:>5} KiB {:>7.3}/{:<7.3} {:>5} {:>8.1}k {:>9.1} {:>8.2}us {:>7.0}k",
            name,
            s.frag_mean,
            s.frag_max,
            s.split_max,
            s.ur_min,
            s.ur_mean,
            s.packs_max,
            s.loads_per_s / 1e3,
            s.us_per_load,
            s.maint_us,
            s.frees_per_s / 1e3
        );
    }
    load_ratios(&legs, &loads_per_s);
}

/// Each leg's load throughput over the compaction-off leg's in the same round: the rounds'
/// ratios, their mean and (from two rounds on) its 95% confidence interval (Student's t),
/// which says whether a difference is the arena's or the machine's noise.
fn load_ratios(legs: &[(&str, Mode)], loads_per_s: &[Vec<f64>]) {
    let Some(base) = legs.iter().position(|(_, m)| matches!(m, Mode::Off)) else {
        return;
    };
    let n = loads_per_s.len();
    println!("\nload throughput over compaction off, same round ({n} rounds):");
    for (i, (name, _)) in legs.iter().enumerate().filter(|&(i, _)| i != base) {
        let ratios: Vec<f64> = loads_per_s.iter().map(|r| r[i] / r[base]).collect();
        let mean = ratios.iter().sum::<f64>() / n as f64;
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
        let interval = if n > 1 {
            let var = ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let half = t_975(n - 1) * (var / n as f64).sqrt();
            format!(", 95% CI {:.3}..{:.3}", mean - half, mean + half)
        } else {
            String::new()
        };
        println!(
            "  {name:<24} mean {mean:.3}{interval}   ({})",
            each.join(" ")
        );
    }
}
/// The 97.5th percentile of Student's t with `df` degrees of freedom (two-sided 95%).
fn t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        // Within 0.003 of the exact value from 31 on.
        _ => 1.96 + 2.4 / df as f64,
    }
}
