//! Compile cost per eBPF instruction, counted in executed machine instructions (callgrind's
//! `Ir`), which unlike wall time does not move with the machine's load: packjit's x86-64
//! JIT (trusted and sandboxed) against rbpf's (`EbpfVmRaw::new` + `jit_compile`), on the
//! straight-line program `x86_bench` also times (`packjit_testkit::bench::straight_line_program`).
//!
//! ```text
//! cargo build --release -p packjit-x86-64 --example compile_cost
//! target/release/examples/compile_cost            # runs itself under callgrind, prints the table
//! ```
//!
//! How the figure is computed: for each engine the binary runs itself twice under
//! `valgrind --tool=callgrind`, once compiling the program `N` times (default 200) and once
//! compiling it 0 times (everything else identical: start-up, program construction, exit),
//! and reads each run's total `Ir` from the `summary:` line of its output file.
//!
//! ```text
//! Ir/insn = (Ir(N compiles) - Ir(0 compiles)) / (N * slots)
//! ```
//!
//! so start-up costs cancel and the figure includes everything a compile does (allocation,
//! freeing the result). The child mode can be run by hand to profile one engine:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=cg.out \
//!     target/release/examples/compile_cost run trusted 200
//! callgrind_annotate --inclusive=yes cg.out | head -60
//! ```
//!
//! Engines: `trusted` (`emit_request`, flags 0, no CPU features: the code `x86_bench`
//! times), `sandboxed` (`PJ_COMPILE_SANDBOX`), `rbpf` (`EbpfVmRaw::new` + `jit_compile`, then
//! drop). packjit's figure stops at the emitted bytes (no arena install), like rbpf's.

use packjit_plugin_api::abi::PJ_COMPILE_SANDBOX;
use packjit_plugin_api::CompileRequest;
use packjit_x86_64::emit_request;
use std::hint::black_box;
use std::process::Command;

const ENGINES: [&str; 3] = ["trusted", "sandboxed", "rbpf"];

/// Compiles `code` `n` times with `engine`.
fn run(engine: &str, n: usize, code: &[u8]) {
    for _ in 0..n {
        match engine {
            "trusted" | "sandboxed" => {
                let req = CompileRequest {
                    code: black_box(code),
                    helpers: &[],
                    features: 0,
                    flags: if engine == "sandboxed" {
                        PJ_COMPILE_SANDBOX
                    } else {
                        0
                    },
                    blind_key: 0,
                };
                black_box(emit_request(&req).expect("compiles"));
            }
            "rbpf" => {
                let mut vm = rbpf::EbpfVmRaw::new(Some(black_box(code))).expect("rbpf accepts");
                vm.jit_compile().expect("rbpf jit_compile");
                black_box(&vm);
            }
            other => panic!("unknown engine {other:?} (one of {ENGINES:?})"),
        }
    }
}

/// Total Ir of one callgrind run of this binary in child mode.
fn callgrind_ir(exe: &str, engine: &str, n: usize) -> u64 {
    let out = std::env::temp_dir().join(format!(
        "packjit-compile-cost-{}-{engine}-{n}.out",
        std::process::id()
    ));
    let status = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args([exe, "run", engine, &n.to_string()])
        .status()
        .expect("valgrind runs (is it installed?)");
    assert!(status.success(), "callgrind run of {engine} x{n} failed");
    let text = std::fs::read_to_string(&out).expect("callgrind output");
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("totals:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a summary line with the Ir total")
}

fn main() {
    let code = packjit_testkit::bench::straight_line_program();
    let slots = code.len() / 8;
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("run") {
        let engine = args.get(2).expect("usage: compile_cost run ENGINE N");
        let n = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(200);
        run(engine, n, &code);
        return;
    }
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200);
    let exe = std::env::current_exe().expect("own path");
    let exe = exe.to_str().expect("utf-8 path");
    println!("compile cost, callgrind Ir per eBPF instruction ({slots}-slot straight-line program, {n} compiles minus 0):");
    let mut rbpf = None;
    let mut rows = Vec::new();
    for engine in ENGINES {
        let ir = callgrind_ir(exe, engine, n) - callgrind_ir(exe, engine, 0);
        let per = ir as f64 / (n * slots) as f64;
        if engine == "rbpf" {
            rbpf = Some(per);
        }
        rows.push((engine, per));
    }
    let rbpf = rbpf.expect("rbpf row");
    for (engine, per) in rows {
        println!("{engine:<10} {per:8.1} Ir/insn {:7.2}x rbpf", per / rbpf);
    }
}
