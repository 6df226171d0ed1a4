//! A digest of the code every backend emits for a fixed corpus, in every mode: the
//! conformance suite, the sandbox bench programs, the inlined built-ins and generated
//! programs (plain and escaping), each trusted, sandboxed, sandboxed with a budget and
//! blinded, with no optional CPU features and with all of them.
//!
//! A refactoring of the lowering that must not change the code prints the same lines
//! before and after (`cargo run --release -p packjit-testkit --example emit_digest`); a
//! line that differs names the backend, mode and features, and `--verbose` lists every
//! program's digest so the first differing one can be found.

use packjit_plugin_api::abi::{PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX};
use packjit_plugin_api::{CompileRequest, HelperEntry, JitBackend};
use packjit_testkit::fuzz::VecArena;
use packjit_testkit::inline_cases;
use std::hash::{Hash, Hasher};

/// Generated programs of each kind (the same seeds every run).
const GENERATED: u64 = 300;

fn main() {
    let verbose = std::env::args().any(|a| a == "--verbose");
    let corpus = corpus();
    let backends: [(&str, &dyn JitBackend, u64); 3] = [
        (
            "arm64",
            &packjit_arm64::Arm64Backend::new(),
            packjit_arm64::SUPPORTED_FEATURES,
        ),
        (
            "rv64",
            &packjit_rv64::Rv64Backend::new(),
            packjit_rv64::SUPPORTED_FEATURES,
        ),
        (
            "x86-64",
            &packjit_x86_64::X86Backend::new(),
            packjit_x86_64::SUPPORTED_FEATURES,
        ),
    ];
    let modes: [(&str, u32); 5] = [
        ("trusted", 0),
        ("sandbox", PJ_COMPILE_SANDBOX),
        ("sandbox+budget", PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET),
        ("blinded", PJ_COMPILE_BLIND_CONSTANTS),
        (
            "sandbox+blinded",
            PJ_COMPILE_SANDBOX | PJ_COMPILE_BLIND_CONSTANTS,
        ),
    ];
    for (arch, backend, all_features) in backends {
        for (mode, flags) in modes {
            for features in [0, all_features] {
                let mut total = std::collections::hash_map::DefaultHasher::new();
                let (mut compiled, mut refused) = (0, 0);
                for (name, code, helpers) in &corpus {
                    let arena = VecArena::default();
                    let req = CompileRequest {
                        code,
                        helpers,
                        features,
                        flags,
                        blind_key: 0x5eed_1234_abcd_0042,
                    };
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    match backend.compile(&req, &arena) {
                        Ok(c) => {
                            compiled += 1;
                            arena.bytes(&c.region).hash(&mut h);
                            (c.entry - c.region.exec_addr, c.code_size, c.native_insns)
                                .hash(&mut h);
                            c.pc_offsets.hash(&mut h);
                        }
                        Err(e) => {
                            refused += 1;
                            e.to_string().hash(&mut h);
                        }
                    }
                    let digest = h.finish();
                    digest.hash(&mut total);
                    if verbose {
                        println!("  {arch} {mode} {features:#x} {name}: {digest:016x}");
                    }
                }
                println!(
                    "{arch:7} {mode:16} features {features:#04x}: {:016x} ({compiled} compiled, \
                     {refused} refused)",
                    total.finish()
                );
            }
        }
    }
}

/// `(name, bytecode, helpers)` of every program in the corpus.
fn corpus() -> Vec<(String, Vec<u8>, Vec<HelperEntry>)> {
    let mut corpus = packjit_testkit::corpus::fixed_programs();
    let dense = 0x7f00_0000_0000;
    corpus.push((
        "dense callx".into(),
        inline_cases::dense_callx_table(dense),
        inline_cases::dense_callx_helpers(dense),
    ));
    corpus.extend(packjit_testkit::corpus::generated_programs(GENERATED));
    corpus
}
