//! Compile throughput at three program sizes, for the front end alone and for each backend's
//! whole compile (decode, verify, analyses, lowering, branch fixing, install into an arena),
//! in eBPF instructions per second. Compile time must grow linearly with program size, so
//! each row ends with the 1 M figure as a fraction of the 1 k one.
//!
//! ```text
//! cargo run --release -p packjit-testkit --example compile_bench [ENGINE] [--curve]
//! ```
//!
//! (`ENGINE`: only the engines whose name contains it, e.g. `x86-64` or `front`.
//! `--curve`: seven sizes from 1 k to 1 M instead of three, to see where throughput falls
//! off: where a compile's working set outgrows the host's last-level cache. It also prints
//! the rate at which this host reads and writes memory at a few buffer sizes.)
//!
//! Backends compile with all their optional CPU features, trusted and sandboxed (the
//! runtime's default: the access analysis and the checks add to compile time).
//!
//! Every backend compiles on any host (nothing is executed), so all rows are measured here,
//! side by side: sizes and engines are interleaved round by round and the best round of each
//! is kept, because a shared machine's noise would otherwise favour whoever ran last.

use packjit_plugin_api::abi::PJ_COMPILE_SANDBOX;
use packjit_plugin_api::{CodeArena, CompileRequest, JitBackend};
use packjit_testkit::fuzz::VecArena;
use packjit_testkit::gen::sized_program;
use std::time::Instant;

/// (eBPF slots, functions) of the three programs.
const SIZES: [(usize, usize); 3] = [(1_000, 4), (100_000, 8), (1_000_000, 8)];
/// The sizes of `--curve`.
const CURVE: [(usize, usize); 7] = [
    (1_000, 4),
    (100_000, 8),
    (300_000, 8),
    (500_000, 8),
    (700_000, 8),
    (850_000, 8),
    (1_000_000, 8),
];
const ROUNDS: usize = 5;
/// Instructions compiled per round and size: enough that one round takes tens of ms.
const WORK: usize = 2_000_000;

enum Engine {
    FrontEnd,
    /// A backend and the `PJ_COMPILE_*` flags it compiles with.
    Backend(Box<dyn JitBackend>, u32),
}

impl Engine {
    fn name(&self) -> String {
        match self {
            Engine::FrontEnd => "front end (decode, verify, analyses)".into(),
            Engine::Backend(b, flags) => format!(
                "{} {}",
                b.name(),
                if *flags & PJ_COMPILE_SANDBOX != 0 {
                    "sandboxed"
                } else {
                    "trusted"
                }
            ),
        }
    }

    fn compile(&self, code: &[u8], arena: &VecArena) {
        match self {
            Engine::FrontEnd => {
                let p = packjit_frontend::decode(code, &[]).expect("valid program");
                std::hint::black_box(packjit_frontend::analysis::stack_block_size(&p));
            }
            Engine::Backend(b, flags) => {
                let req = CompileRequest {
                    code,
                    helpers: &[],
                    features: b.supported_features(),
                    flags: *flags,
                    blind_key: 0,
                };
                let c = b.compile(&req, arena).expect("compiles");
                arena.free(&c.region);
            }
        }
    }
}

fn main() {
    // An optional argument keeps only the engines whose name contains it (e.g. `x86-64` or
    // `front`), for profiling one of them.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let curve = args.iter().any(|a| a == "--curve");
    let only = args.iter().find(|a| !a.starts_with("--"));
    let sizes: &[(usize, usize)] = if curve { &CURVE } else { &SIZES };
    let mut engines = vec![Engine::FrontEnd];
    for flags in [0, PJ_COMPILE_SANDBOX] {
        engines.push(Engine::Backend(
            Box::new(packjit_arm64::Arm64Backend::new()),
            flags,
        ));
        engines.push(Engine::Backend(
            Box::new(packjit_rv64::Rv64Backend::new()),
            flags,
        ));
        engines.push(Engine::Backend(
            Box::new(packjit_x86_64::X86Backend::new()),
            flags,
        ));
    }
    if let Some(only) = only {
        engines.retain(|e| e.name().contains(only.as_str()));
    }
    let programs: Vec<Vec<u8>> = sizes.iter().map(|&(n, f)| sized_program(n, f)).collect();
    let arena = VecArena::default();
    // best[engine][size]: the fastest round, in eBPF instructions per second.
    let mut best = vec![vec![0f64; sizes.len()]; engines.len()];
    for _ in 0..ROUNDS {
        for (s, code) in programs.iter().enumerate() {
            let slots = code.len() / 8;
            let reps = (WORK / slots).max(1);
            for (e, engine) in engines.iter().enumerate() {
                let start = Instant::now();
                for _ in 0..reps {
                    engine.compile(code, &arena);
                }
                let rate = (slots * reps) as f64 / start.elapsed().as_secs_f64();
                best[e][s] = best[e][s].max(rate);
            }
        }
    }
    println!("compile throughput, M eBPF insns/s (best of {ROUNDS} interleaved rounds):");
    let label = |&(n, _): &(usize, usize)| match n {
        1_000_000 => "1 M".to_string(),
        n => format!("{} k", n / 1000),
    };
    let header: String = sizes.iter().map(|s| format!(" {:>8}", label(s))).collect();
    println!("{:<44}{header} {:>10}", "engine", "1 M / 1 k");
    for (engine, rates) in engines.iter().zip(&best) {
        let figures: String = rates.iter().map(|r| format!(" {:>8.1}", r / 1e6)).collect();
        let ratio = rates[rates.len() - 1] / rates[0];
        println!("{:<44}{figures} {ratio:>10.2}", engine.name());
    }
    let slots: Vec<String> = programs.iter().map(|p| (p.len() / 8).to_string()).collect();
    println!("(program sizes: {} slots)", slots.join(" / "));
    if curve {
        memory_probe();
    }
}

/// Reads and writes one word per 64-byte line over buffers of growing size: the rate falls
/// where a buffer no longer fits the caches, which is where compile throughput falls too.
fn memory_probe() {
    let mut rates = Vec::new();
    for mib in [4usize, 16, 32, 64, 128] {
        let words = mib << 17;
        let mut buf: Vec<u64> = (0..words as u64).collect();
        let passes = (4usize << 30) / (words * 8);
        let mut sum = 0u64;
        let start = Instant::now();
        for _ in 0..passes {
            for w in buf.iter_mut().step_by(8) {
                sum = sum.wrapping_add(*w);
                *w = sum;
            }
            std::hint::black_box(&mut buf);
        }
        let rate = (passes * words * 8) as f64 / start.elapsed().as_secs_f64() / 1e9;
        std::hint::black_box(sum);
        rates.push(format!("{mib} MiB {rate:.0}"));
    }
    println!(
        "memory, GB/s of lines read and written back: {}",
        rates.join(", ")
    );
}
