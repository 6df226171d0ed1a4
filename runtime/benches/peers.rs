//! Side by side in one process: packjit (trusted and sandboxed, default budget; and the
//! optimizing tier, trusted and sandboxed, with the `optimizer` feature) against rbpf 0.4.1's x86-64 JIT on clang-built C programs nobody tuned for packjit
//! (`tests/bpf/peers/*.c`: hashes, CRC-32 with a `.rodata` table, a sort and a sieve on the
//! stack, a packet parser, signed arithmetic, bpf-to-bpf calls with stack and context
//! pointers, a helper loop, a text scan, a key=value parser).
//!
//! The objects are compiled at bench time with the clang the ELF tests use (`-O2 -g -target
//! bpf`, `-mcpu=v3` so rbpf runs the same bytecode; the signed program needs cpu v4's `sdiv`
//! and `smod`, so it is built with `-mcpu=v4` and rbpf's columns are "—" for it).
//!
//! Every engine gets the same linked bytecode (`packjit::elf::link`: calls into `.text` placed
//! after the entry, `.rodata` addresses patched into the `lddw`s, the extern `pj_mix` resolved
//! to helper 77) and the same context: r1 = pointer, r2 = length (rbpf: `EbpfVmMbuff` with
//! the context as its mbuff). Results are asserted equal between engines before anything is
//! timed.
//!
//! * run time: ns per run, the median over `ROUNDS` rounds of a batch of runs sized to about
//!   `BATCH_NS`; engines and programs are interleaved round by round.
//! * compile time: µs per compile, the median of `COMPILES` single compiles per round, then
//!   the median over rounds. packjit: `Runtime::load_trusted` / `Runtime::load` of the linked
//!   bytecode (verify, analyses, emit, install into the arena, commit: everything a load
//!   does); rbpf: `EbpfVmMbuff::new` (its verifier) + `jit_compile`.
//! * code size: bytes of native code, sandboxed ÷ trusted.
//! * the optimizing tier sandboxed (same options as the sandboxed baseline load: default
//!   budget): run and compile time ÷ the tier trusted and ÷ the baseline sandboxed, side by
//!   side, and its code size.
//!
//! `cargo bench -p packjit --features optimizer --bench peers` (`-- --quick` for one round,
//! for a smoke run; `-- --compile-only` times only the baseline compiles and rbpf's, the
//! compile table alone, for before/after comparisons of compile time). Without the feature the optimized columns are "—".
//! `PEERS_SANDBOX_BUDGET=unlimited` loads the sandboxed programs without an instruction
//! budget (the budget's share of the cost).

#[path = "../tests/host/mod.rs"]
mod host;
#[path = "common/peers_inputs.rs"]
mod peers_inputs;

use packjit::elf::{link, ElfLoadOptions, Linked};
use packjit::{LoadOptions, Program, Runtime, Tier};
use peers_inputs::{input, pj_mix, rbpf_mix, HELPER_ID};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// What rbpf 0.4.1 does with a program.
#[derive(Clone, Copy, PartialEq)]
enum Rbpf {
    /// Compiles and runs it, with packjit's result.
    Runs,
    /// Compiles it but computes a wrong result. Compile time is shown, run time is not.
    /// `calls`: rbpf's JIT gives a bpf-to-bpf callee no stack frame of its own (r10 stays the
    /// caller's), so the callee's spills overwrite the caller's locals. `signed`: rbpf
    /// predates cpu v4 and reads `sdiv`/`smod` (`off` = 1) as `div`/`mod` and `movsx` as
    /// `mov`.
    WrongResult,
    /// Refuses it.
    #[allow(dead_code)]
    Refuses,
}

/// Programs: (section, object, what rbpf does with it).
const PROGRAMS: &[(&str, &str, Rbpf)] = &[
    ("fnv", "peers", Rbpf::Runs),
    ("xxh", "peers", Rbpf::Runs),
    ("crc32", "peers", Rbpf::Runs),
    ("sort", "peers", Rbpf::Runs),
    ("sieve", "peers", Rbpf::Runs),
    ("parse", "peers", Rbpf::Runs),
    ("signed", "peers_v4", Rbpf::WrongResult),
    ("calls", "peers", Rbpf::WrongResult),
    ("helper", "peers", Rbpf::Runs),
    ("words", "peers", Rbpf::Runs),
    ("kv", "peers", Rbpf::Runs),
];

/// `tests/bpf/peers/<name>.c` compiled with `-O2 -g -target bpf <cpu>`.
fn compile_object(name: &str, cpu: &str) -> Vec<u8> {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/bpf/peers");
    peers_inputs::compile_object(&sources, name, cpu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

struct Case {
    name: &'static str,
    linked: Linked,
    opts: LoadOptions,
    ctx: Vec<u8>,
    trusted: Program,
    sandboxed: Program,
    /// The optimizing tier's code (trusted), when this build has the tier and it takes the
    /// program.
    optimized: Option<Program>,
    /// The optimizing tier's sandboxed code (the baseline sandboxed load's options).
    opt_sandboxed: Option<Program>,
    /// The options of an optimized load.
    opt_opts: LoadOptions,
    /// The options of an optimized sandboxed load.
    opt_sbx_opts: LoadOptions,
    /// rbpf's JIT of the program, when it runs it correctly.
    rbpf: Option<rbpf::EbpfVmMbuff<'static>>,
    /// Whether rbpf compiles it (timed even when its result is wrong).
    rbpf_compiles: bool,
    /// Runs per timed batch.
    batch: usize,
    /// Samples per engine: trusted, sandboxed, rbpf, optimized, optimized sandboxed.
    run: [Vec<f64>; ENGINES],
    compile: [Vec<f64>; ENGINES],
}

/// Engines timed per program (see `Case::run`).
const ENGINES: usize = 5;

/// ns per run of `f` over `n` runs.
fn time_runs(n: usize, mut f: impl FnMut() -> u64) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// One rbpf JIT run with `ctx` as the mbuff (r1 = pointer, r2 = length).
fn rbpf_run(vm: &rbpf::EbpfVmMbuff<'static>, ctx: &mut [u8]) -> u64 {
    // SAFETY: the VM's lifetime parameter is the bytecode's ('static, leaked); the mbuff
    // only has to outlive this call, which is all rbpf uses it for (it keeps no reference).
    // The programs stay inside the context, their stack and `.rodata` (checked by the
    // sandboxed run made before any rbpf run).
    unsafe {
        let mbuff: &'static mut [u8] = std::slice::from_raw_parts_mut(ctx.as_mut_ptr(), ctx.len());
        vm.execute_program_jit(&mut [], mbuff).unwrap()
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // Only the baseline's compiles (trusted, sandboxed) and rbpf's: no run timing and no
    // optimizing tier in the timed rounds, so that a compile comparison takes seconds.
    let compile_only = std::env::args().any(|a| a == "--compile-only");
    let rounds = if quick { 1 } else { 7 };
    let compiles = if quick { 20 } else { 200 };
    const BATCH_NS: f64 = 2e6;

    let rt: Runtime = host::host_runtime();
    rt.register_helper(HELPER_ID, "pj_mix", pj_mix).unwrap();
    let v3 = compile_object("peers", "-mcpu=v3");
    let v4 = compile_object("peers_v4", "-mcpu=v4");

    let mut cases: Vec<Case> = Vec::new();
    for &(name, obj, rbpf_does) in PROGRAMS {
        let bytes = if obj == "peers" { &v3 } else { &v4 };
        let linked = link(
            bytes,
            &ElfLoadOptions::section(&format!("peers/{name}")),
            &|n| (n == "pj_mix").then_some(HELPER_ID),
        )
        .unwrap_or_else(|e| panic!("link {name}: {e}"));
        // `PEERS_DUMP=dir`: the linked bytecode of each program as `dir/<name>.bin`, for a
        // disassembler or `cargo run -p packjit-tier2 --example dump`.
        if let Some(dir) = std::env::var_os("PEERS_DUMP") {
            std::fs::write(Path::new(&dir).join(format!("{name}.bin")), &linked.code).unwrap();
        }
        let opts = LoadOptions {
            regions: linked.data.regions(),
            name: Some(name.into()),
            ..LoadOptions::default()
        };
        // SAFETY: the programs only touch their context, stack and `.rodata` (the regions);
        // the sandboxed copy of each, run first below, would stop on anything else.
        let trusted = unsafe { rt.load_trusted(&linked.code, &opts) }
            .unwrap_or_else(|e| panic!("packjit trusted {name}: {e}"));
        // `PEERS_SANDBOX_BUDGET=unlimited` loads the sandboxed copies without counting, to
        // tell the budget's share of the sandbox's cost from the memory checks'.
        let sbx_opts = match std::env::var("PEERS_SANDBOX_BUDGET").as_deref() {
            Ok("unlimited") => LoadOptions {
                budget: packjit::Budget::Unlimited,
                ..opts.clone()
            },
            _ => opts.clone(),
        };
        let sandboxed = rt
            .load(&linked.code, &sbx_opts)
            .unwrap_or_else(|e| panic!("packjit sandboxed {name}: {e}"));
        let opt_opts = LoadOptions {
            tier: Tier::Optimized,
            ..opts.clone()
        };
        // SAFETY: as the trusted load above.
        let optimized = match unsafe { rt.load_trusted(&linked.code, &opt_opts) } {
            Ok(p) => Some(p),
            Err(e) if e.kind == packjit::ErrorKind::Unsupported => {
                eprintln!("{name}: no optimized column ({e})");
                None
            }
            Err(e) => panic!("packjit optimized {name}: {e}"),
        };
        let opt_sbx_opts = LoadOptions {
            tier: Tier::Optimized,
            ..sbx_opts.clone()
        };
        let opt_sandboxed = match rt.load(&linked.code, &opt_sbx_opts) {
            Ok(p) => Some(p),
            Err(e) if e.kind == packjit::ErrorKind::Unsupported => {
                eprintln!("{name}: no optimized sandboxed column ({e})");
                None
            }
            Err(e) => panic!("packjit optimized sandboxed {name}: {e}"),
        };
        let mut ctx = input(name);
        let want = sandboxed.call(&mut ctx).unwrap();
        assert_eq!(trusted.call(&mut ctx).unwrap(), want, "{name}: trusted");
        if let Some(o) = &optimized {
            assert_eq!(o.call(&mut ctx).unwrap(), want, "{name}: optimized");
        }
        if let Some(o) = &opt_sandboxed {
            assert_eq!(
                o.call(&mut ctx).unwrap(),
                want,
                "{name}: optimized sandboxed"
            );
        }
        let rbpf_compiles = rbpf_does != Rbpf::Refuses;
        if !rbpf_compiles {
            assert!(
                rbpf::EbpfVmMbuff::new(Some(&linked.code)).is_err(),
                "rbpf now accepts {name}: time it"
            );
        }
        let rbpf = rbpf_compiles.then(|| {
            // The bytecode lives as long as the bench (rbpf's VM borrows it).
            let code: &'static [u8] = Box::leak(linked.code.clone().into_boxed_slice());
            let mut vm = rbpf::EbpfVmMbuff::new(Some(code))
                .unwrap_or_else(|e| panic!("rbpf new {name}: {e}"));
            vm.register_helper(HELPER_ID, rbpf_mix).unwrap();
            vm.jit_compile()
                .unwrap_or_else(|e| panic!("rbpf jit {name}: {e}"));
            let got = rbpf_run(&vm, &mut ctx);
            if rbpf_does == Rbpf::WrongResult {
                assert_ne!(got, want, "rbpf now runs {name} right: time it");
                None
            } else {
                assert_eq!(got, want, "{name}: rbpf JIT");
                Some(vm)
            }
        });
        let rbpf = rbpf.flatten();
        let per_run = time_runs(200, || sandboxed.call(&mut ctx).unwrap());
        let batch = ((BATCH_NS / per_run.max(1.0)) as usize).clamp(10, 1_000_000);
        cases.push(Case {
            name,
            linked,
            opts,
            ctx,
            trusted,
            sandboxed,
            optimized,
            opt_sandboxed,
            opt_opts,
            opt_sbx_opts,
            rbpf,
            rbpf_compiles,
            batch,
            run: Default::default(),
            compile: Default::default(),
        });
    }

    // `--load-loop trusted|sandboxed [passes]`: only loads, every program in turn, 100 loads
    // each per pass (by default passes for ~3 s), for a profiler (`perf record -e cpu-clock
    // target/release/deps/peers-* --load-loop trusted`, or callgrind with a pass count).
    if let Some(i) = std::env::args().position(|a| a == "--load-loop") {
        let args: Vec<String> = std::env::args().collect();
        let trusted = args.get(i + 1).map(String::as_str) == Some("trusted");
        let passes: Option<u32> = args.get(i + 2).and_then(|n| n.parse().ok());
        let t = Instant::now();
        let mut done = 0;
        while passes.map_or(t.elapsed().as_secs() < 3, |n| done < n) {
            done += 1;
            // `PEERS_ONLY=name` profiles one program's loads.
            let only = std::env::var("PEERS_ONLY").ok();
            for c in cases
                .iter()
                .filter(|c| only.as_deref().is_none_or(|o| o == c.name))
            {
                for _ in 0..100 {
                    let p = if trusted {
                        // SAFETY: compiled only, never run.
                        unsafe { rt.load_trusted(&c.linked.code, &c.opts) }
                    } else {
                        rt.load(&c.linked.code, &c.opts)
                    };
                    drop(black_box(p.unwrap()));
                }
            }
        }
        return;
    }

    for round in 0..rounds {
        for k in 0..cases.len() {
            let n = cases.len();
            let c = &mut cases[(k + round) % n];
            let ctx = &mut c.ctx;
            for e in 0..ENGINES {
                if compile_only {
                    break;
                }
                let ns = match (e + round) % ENGINES {
                    0 => (0, time_runs(c.batch, || c.trusted.call(ctx).unwrap())),
                    1 => (1, time_runs(c.batch, || c.sandboxed.call(ctx).unwrap())),
                    2 => match &c.rbpf {
                        Some(vm) => (2, time_runs(c.batch, || rbpf_run(vm, ctx))),
                        None => continue,
                    },
                    3 => match &c.optimized {
                        Some(p) => (3, time_runs(c.batch, || p.call(ctx).unwrap())),
                        None => continue,
                    },
                    _ => match &c.opt_sandboxed {
                        Some(p) => (4, time_runs(c.batch, || p.call(ctx).unwrap())),
                        None => continue,
                    },
                };
                c.run[ns.0].push(ns.1);
            }
            for e in 0..ENGINES {
                let which = (e + round) % ENGINES;
                if compile_only && (which == 3 || which == 4) {
                    continue;
                }
                let mut samples = Vec::with_capacity(compiles);
                for _ in 0..compiles {
                    let t = Instant::now();
                    match which {
                        0 => {
                            // SAFETY: compiled only, never run.
                            let p = unsafe { rt.load_trusted(&c.linked.code, &c.opts) }.unwrap();
                            samples.push(t.elapsed().as_nanos() as f64);
                            drop(p);
                        }
                        1 => {
                            let p = rt.load(&c.linked.code, &c.opts).unwrap();
                            samples.push(t.elapsed().as_nanos() as f64);
                            drop(p);
                        }
                        3 => {
                            if c.optimized.is_none() {
                                break;
                            }
                            // SAFETY: compiled only, never run.
                            let p = unsafe { rt.load_trusted(&c.linked.code, &c.opt_opts) };
                            let p = p.unwrap();
                            samples.push(t.elapsed().as_nanos() as f64);
                            drop(p);
                        }
                        4 => {
                            if c.opt_sandboxed.is_none() {
                                break;
                            }
                            let p = rt.load(&c.linked.code, &c.opt_sbx_opts).unwrap();
                            samples.push(t.elapsed().as_nanos() as f64);
                            drop(p);
                        }
                        _ => {
                            if !c.rbpf_compiles {
                                break;
                            }
                            let mut vm = rbpf::EbpfVmMbuff::new(Some(&c.linked.code)).unwrap();
                            vm.register_helper(HELPER_ID, rbpf_mix).unwrap();
                            vm.jit_compile().unwrap();
                            samples.push(t.elapsed().as_nanos() as f64);
                            drop(black_box(vm));
                        }
                    }
                }
                if !samples.is_empty() {
                    c.compile[which].push(median(samples) / 1e3);
                }
            }
        }
    }

    let dash = || "—".to_string();
    let f2 = |x: f64| format!("{x:.2}");
    if compile_only {
        compile_table(&cases, compiles);
        return;
    }
    let mut g_sbx = Vec::new();
    let mut g_rb = Vec::new();
    let mut g_rb_sbx = Vec::new();
    let (mut g_opt, mut g_opt_rb) = (Vec::new(), Vec::new());
    println!(
        "\nrun time, ns per run (median of {rounds} rounds); ratios: sandboxed ÷ trusted, \
         packjit ÷ rbpf JIT, optimized tier ÷ baseline trusted and ÷ rbpf JIT\n"
    );
    println!("| program | insns | ctx bytes | packjit trusted | packjit sandboxed | sbx ÷ tr | rbpf JIT | tr ÷ rbpf | sbx ÷ rbpf | optimized | opt ÷ tr | opt ÷ rbpf |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in &cases {
        let tr = median(c.run[0].clone());
        let sb = median(c.run[1].clone());
        g_sbx.push(sb / tr);
        let (rb, r1, r2) = if c.run[2].is_empty() {
            (dash(), dash(), dash())
        } else {
            let rb = median(c.run[2].clone());
            g_rb.push(tr / rb);
            g_rb_sbx.push(sb / rb);
            (format!("{rb:.1}"), f2(tr / rb), f2(sb / rb))
        };
        let (op, o1, o2) = if c.run[3].is_empty() {
            (dash(), dash(), dash())
        } else {
            let op = median(c.run[3].clone());
            g_opt.push(op / tr);
            let o2 = if c.run[2].is_empty() {
                dash()
            } else {
                let rb = median(c.run[2].clone());
                g_opt_rb.push(op / rb);
                f2(op / rb)
            };
            (format!("{op:.1}"), f2(op / tr), o2)
        };
        println!(
            "| {} | {} | {} | {tr:.1} | {sb:.1} | {} | {rb} | {r1} | {r2} | {op} | {o1} | {o2} |",
            c.name,
            c.linked.code.len() / 8,
            c.ctx.len(),
            f2(sb / tr)
        );
    }
    let gm = |v: &[f64]| if v.is_empty() { dash() } else { f2(geomean(v)) };
    println!(
        "| geometric mean | | | | | {} | | {} | {} | | {} | {} |",
        f2(geomean(&g_sbx)),
        f2(geomean(&g_rb)),
        f2(geomean(&g_rb_sbx)),
        gm(&g_opt),
        gm(&g_opt_rb)
    );
    let worst = g_sbx.iter().copied().fold(0.0, f64::max);
    println!("\nworst sandboxed ÷ trusted: {worst:.2}");

    compile_table(&cases, compiles);
    optimized_sandboxed_table(&cases);
}

/// Compile time per program (trusted, sandboxed, rbpf's JIT; the optimizing tier's when it
/// was timed) and code size.
fn compile_table(cases: &[Case], compiles: usize) {
    let dash = || "—".to_string();
    let f2 = |x: f64| format!("{x:.2}");
    let gm = |v: &[f64]| if v.is_empty() { dash() } else { f2(geomean(v)) };
    let (mut c_sbx, mut c_rb, mut c_rb_sbx, mut size) = (vec![], vec![], vec![], vec![]);
    let mut c_opt = vec![];
    println!(
        "\ncompile time, µs per program (median of {compiles} compiles, median over rounds); \
         code size, bytes\n"
    );
    println!("| program | insns | packjit trusted | packjit sandboxed | sbx ÷ tr | rbpf JIT | tr ÷ rbpf | sbx ÷ rbpf | code trusted | code sandboxed | size sbx ÷ tr | optimized | opt ÷ tr | code optimized |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in cases {
        let tr = median(c.compile[0].clone());
        let sb = median(c.compile[1].clone());
        c_sbx.push(sb / tr);
        let (rb, r1, r2) = if c.compile[2].is_empty() {
            (dash(), dash(), dash())
        } else {
            let rb = median(c.compile[2].clone());
            c_rb.push(tr / rb);
            c_rb_sbx.push(sb / rb);
            (format!("{rb:.2}"), f2(tr / rb), f2(sb / rb))
        };
        let (ct, cs) = (c.trusted.code_size(), c.sandboxed.code_size());
        size.push(cs as f64 / ct as f64);
        let (op, o1, oc) = match (&c.optimized, c.compile[3].is_empty()) {
            (Some(p), false) => {
                let op = median(c.compile[3].clone());
                c_opt.push(op / tr);
                (format!("{op:.2}"), f2(op / tr), p.code_size().to_string())
            }
            _ => (dash(), dash(), dash()),
        };
        println!(
            "| {} | {} | {tr:.2} | {sb:.2} | {} | {rb} | {r1} | {r2} | {ct} | {cs} | {} | {op} | {o1} | {oc} |",
            c.name,
            c.linked.code.len() / 8,
            f2(sb / tr),
            f2(cs as f64 / ct as f64)
        );
    }
    println!(
        "| geometric mean | | | | {} | | {} | {} | | | {} | | {} | |",
        f2(geomean(&c_sbx)),
        f2(geomean(&c_rb)),
        f2(geomean(&c_rb_sbx)),
        f2(geomean(&size)),
        gm(&c_opt)
    );
}

/// The optimizing tier sandboxed against the tier trusted and the baseline sandboxed, side
/// by side: run time (ns), compile time (µs) and code size (bytes).
fn optimized_sandboxed_table(cases: &[Case]) {
    let f2 = |x: f64| format!("{x:.2}");
    println!(
        "\noptimized sandboxed: run time (ns per run) and compile time (µs), ÷ optimized \
         trusted and ÷ baseline sandboxed; code size (bytes)\n"
    );
    println!("| program | opt sbx run | ÷ opt tr | ÷ base sbx | opt sbx compile | ÷ opt tr | ÷ base sbx | code opt sbx | code opt tr | code base sbx |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let (mut g_run_tr, mut g_run_sbx, mut g_c_tr, mut g_c_sbx) = (vec![], vec![], vec![], vec![]);
    for c in cases {
        let (Some(os), Some(ot)) = (&c.opt_sandboxed, &c.optimized) else {
            println!("| {} | — | — | — | — | — | — | — | — | — |", c.name);
            continue;
        };
        if c.run[3].is_empty() || c.run[4].is_empty() {
            continue;
        }
        let (run, run_tr, run_sbx) = (
            median(c.run[4].clone()),
            median(c.run[3].clone()),
            median(c.run[1].clone()),
        );
        let (comp, comp_tr, comp_sbx) = (
            median(c.compile[4].clone()),
            median(c.compile[3].clone()),
            median(c.compile[1].clone()),
        );
        g_run_tr.push(run / run_tr);
        g_run_sbx.push(run / run_sbx);
        g_c_tr.push(comp / comp_tr);
        g_c_sbx.push(comp / comp_sbx);
        println!(
            "| {} | {run:.1} | {} | {} | {comp:.2} | {} | {} | {} | {} | {} |",
            c.name,
            f2(run / run_tr),
            f2(run / run_sbx),
            f2(comp / comp_tr),
            f2(comp / comp_sbx),
            os.code_size(),
            ot.code_size(),
            c.sandboxed.code_size()
        );
    }
    if !g_run_tr.is_empty() {
        println!(
            "| geometric mean | | {} | {} | | {} | {} | | | |",
            f2(geomean(&g_run_tr)),
            f2(geomean(&g_run_sbx)),
            f2(geomean(&g_c_tr)),
            f2(geomean(&g_c_sbx))
        );
    }
}
