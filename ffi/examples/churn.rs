//! Churn through the C API: does the code arena stay dense when programs come and go?
//!
//! The scenario of issue 13 as a new user would run it: a runtime from
//! `packjit_runtime_create`, the host's backend plugin from `packjit_load_host_plugin`, then
//! random `packjit_program_load` / `packjit_program_free` calls with up to `--live` programs
//! alive (after the ramp the live count wanders between 75% and 100% of it). Programs are
//! `mov r0, k ; (n - 2) x add r0, k ; exit` with n log-uniform over 2..=4,000 eBPF
//! instructions and k random, compiled sandboxed like any `packjit_program_load`; each is run
//! right after its load and again just before its free, and both answers must be k * (n - 1).
//! The same operation sequence (same seed) runs three times in one process, side by side:
//! * compaction off (`packjit_runtime_set_compaction(rt, 1000, 0)`: code never moves);
//! * the defaults: every load's commit, and every free that releases chunks, moves up to a
//!   step of code into holes while fragmentation is above the threshold;
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
//!     [--maint-bytes BYTES]
//! source scripts/env.sh; packjit_cross_cargo aarch64-unknown-linux-gnu run --release \
//!     -p packjit-ffi --example churn -- --ops 30000
//! ```
//! Defaults: 300,000 operations, 2,000 live, seed 0xc0de. Plugins are looked for in
//! `$PACKJIT_PLUGIN_DIR`, else in the `deps/` directory next to this example (where cargo
//! puts the backend cdylibs this package's dev-dependencies build).
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

/// One run of the whole workload on a fresh runtime.
fn leg(name: &str, mode: Mode, ops: u64, live_max: usize, seed: u64) -> Summary {
    println!("\n[{name}]");
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
    let mut t_maint = Duration::ZERO;
    let dir = std::env::var_os("PACKJIT_PLUGIN_DIR").unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("own path");
        exe.parent()
            .and_then(|d| d.parent())
            .expect("examples/ has a parent")
            .join("deps")
            .into_os_string()
    });
    let dir = CString::new(dir.into_encoded_bytes()).expect("no NUL in a path");
    // SAFETY: live runtime; NUL-terminated dir; NULL info.
    let st = unsafe { packjit_load_host_plugin(rt, dir.as_ptr(), null_mut()) };
    check(st, "packjit_load_host_plugin");
    let mut rng = Rng(seed);
    let mut live: Vec<Live> = Vec::with_capacity(live_max);
    let (mut t_load, mut t_free) = (Duration::ZERO, Duration::ZERO);
    let (mut loads, mut frees, mut runs) = (0u64, 0u64, 0u64);
    let step = (ops / 100).max(1);
    let (mut frag_max, mut frag_sum, mut ur_min, mut ur_sum, mut n) = (0.0f64, 0.0, 9.9f64, 0.0, 0);
    let (mut packs_max, mut peak_used, mut split_max) = (0, 0, 0);
    // (op, packs, used KiB, split KiB) at the highest fragmentation sample.
    let mut at_max = (0, 0, 0, 0);
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
    let started = Instant::now();
    for op in 1..=ops {
        let load = live.len() < live_max * 3 / 4 || (live.len() < live_max && rng.next() % 2 == 0);
        if load {
            let n = ((4000f64).powf(rng.unit()).round() as usize).max(2);
            let k = (rng.next() % 1000) as i32 + 1;
            let code = program(n, k);
            let mut prog = null_mut();
            let t = Instant::now();
            // SAFETY: live runtime; code borrowed for the call; NULL options = defaults
            // (sandboxed); valid out pointer.
            let st =
                unsafe { packjit_program_load(rt, code.as_ptr(), code.len(), null(), &mut prog) };
            t_load += t.elapsed();
            check(st, "packjit_program_load");
            loads += 1;
            let answer = k as u64 * (n as u64 - 1);
            assert_eq!(
                run(prog),
                answer,
                "program of {n} insns (k = {k}) right after load"
            );
            runs += 1;
            live.push(Live { prog, answer });
        } else {
            let l = live.swap_remove((rng.next() % live.len() as u64) as usize);
            assert_eq!(run(l.prog), l.answer, "program before its free");
            runs += 1;
            let t = Instant::now();
            // SAFETY: a live handle, freed once.
            unsafe { packjit_program_free(l.prog) };
            t_free += t.elapsed();
            frees += 1;
        }
        if let Mode::Maintenance(_, every, bytes) = mode {
            if op % every == 0 {
                let t = Instant::now();
                // SAFETY: live runtime; NULL moved.
                check(
                    unsafe { packjit_runtime_compact(rt, bytes, null_mut()) },
                    "packjit_runtime_compact",
                );
                t_maint += t.elapsed();
            }
        }
        if op % step == 0 {
            let s = stats(rt);
            let ur = s.bytes_used as f64 / s.bytes_resident.max(1) as f64;
            let cr = s.bytes_code as f64 / s.bytes_resident.max(1) as f64;
            let frag = s.fragmentation_permille as f64 / 10.0;
            peak_used = peak_used.max(s.bytes_used);
            // The metric's numerator, back from per mille of the free bytes.
            let split = (s.bytes_reserved - s.bytes_used) * s.fragmentation_permille as u64 / 1000;
            if op % (step * 10) == 0 {
                println!(
                    "  {op:>8} {:>6} {:>5} {:>9} {:>9} {:>10.3} {:>10.3} {:>7} {:>10} {:>6} {:>8.1}%",
                    live.len(),
                    s.packs,
                    s.bytes_used / 1024,
                    s.bytes_resident / 1024,
                    ur,
                    cr,
                    s.pending_frees,
                    (peak_used - s.bytes_used) / 1024,
                    split / 1024,
                    frag
                );
            }
            // Steady state: after the first tenth (the ramp while the packs first fill).
            if op > ops / 10 {
                if frag > frag_max {
                    frag_max = frag;
                    at_max = (op, s.packs, s.bytes_used / 1024, split / 1024);
                }
                split_max = split_max.max(split);
                ur_min = ur_min.min(ur);
                frag_sum += frag;
                ur_sum += ur;
                n += 1;
            }
            packs_max = packs_max.max(s.packs);
        }
    }
    let elapsed = started.elapsed();
    for l in live.drain(..) {
        assert_eq!(run(l.prog), l.answer, "program before the final free");
        runs += 1;
        // SAFETY: a live handle, freed once.
        unsafe { packjit_program_free(l.prog) };
    }
    let mut pending = u64::MAX;
    // SAFETY: live runtime; valid out pointer.
    check(
        unsafe { packjit_reclaim(rt, &mut pending) },
        "packjit_reclaim",
    );
    let end = stats(rt);
    println!(
        "end: {} packs, {} allocations, {} B used, {} B resident, {} pending frees",
        end.packs, end.allocations, end.bytes_used, end.bytes_resident, end.pending_frees
    );
    assert_eq!(
        (
            pending,
            end.packs,
            end.allocations,
            end.bytes_used,
            end.pending_frees
        ),
        (0, 0, 0, 0, 0),
        "everything released"
    );
    // SAFETY: live runtime, not used again.
    unsafe { packjit_runtime_destroy(rt) };
    let n = n.max(1) as f64;
    println!(
        "summary: {runs} runs all right; steady state fragmentation mean {:.1}% max {:.1}%, \
         split max {} KiB, used/resident mean {:.3} min {:.3}, packs max {packs_max}",
        frag_sum / n,
        frag_max,
        split_max / 1024,
        ur_sum / n,
        ur_min
    );
    println!(
        "fragmentation peak at op {}: {} packs, {} KiB used, {} KiB split",
        at_max.0, at_max.1, at_max.2, at_max.3
    );
    let s = Summary {
        maint_us: t_maint.as_secs_f64() * 1e6 / loads.max(1) as f64,
        frag_mean: frag_sum / n,
        frag_max,
        split_max: split_max / 1024,
        ur_mean: ur_sum / n,
        ur_min,
        packs_max,
        loads_per_s: loads as f64 / t_load.as_secs_f64(),
        us_per_load: t_load.as_secs_f64() * 1e6 / loads.max(1) as f64,
        frees_per_s: frees as f64 / t_free.as_secs_f64(),
    };
    println!(
        "throughput: {:.1}k loads/s ({loads} loads, {:.1} us each), {:.0}k frees/s ({frees}), \
         {:.1} s in all",
        s.loads_per_s / 1e3,
        s.us_per_load,
        s.frees_per_s / 1e3,
        elapsed.as_secs_f64()
    );
    s
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ops = arg(&args, "--ops", 300_000);
    let live_max = arg(&args, "--live", 2_000) as usize;
    let seed = arg(&args, "--seed", 0xc0de);
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
            "on, per load (default)",
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
    let results: Vec<_> = legs
        .iter()
        .map(|&(name, mode)| (name, leg(name, mode, ops, live_max, seed)))
        .collect();
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
    for (name, s) in &results {
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
}
