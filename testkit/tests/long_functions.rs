//! Cold code islands (`packjit_frontend::cold`): in functions longer than the island span,
//! the arm64 and RV64 backends place the cold sides of checks inside the function, so every
//! branch to them reaches in its first form and the program compiles in one pass. (x86-64's
//! jumps reach ±2 GiB: its cold code stays after each function.) Running these programs,
//! stops included, is part of the differential test (`differential.rs`). The last test
//! holds every backend to one emission pass on programs of 1 k to 100 k instructions.

use packjit_frontend::analysis::EmitOptions;
use packjit_plugin_api::abi::PJ_COMPILE_SANDBOX;
use packjit_plugin_api::{CompileRequest, JitBackend};
use packjit_testkit::gen::long_function_program;

fn request(code: &[u8], features: u64) -> CompileRequest<'_> {
    CompileRequest {
        code,
        helpers: &[],
        features,
        flags: PJ_COMPILE_SANDBOX,
        blind_key: 0,
    }
}

#[test]
fn long_functions_get_islands_and_compile_in_one_pass() {
    for seed in 0..4 {
        let code = long_function_program(seed);
        for features in [0, packjit_arm64::Arm64Backend::new().supported_features()] {
            let e =
                packjit_arm64::emit_request_with(&request(&code, features), EmitOptions::default())
                    .unwrap();
            assert_eq!(e.passes, 1, "arm64 {features:#x} seed {seed}");
            assert!(e.islands >= 2, "arm64 {features:#x}: {} islands", e.islands);
        }
        for features in [0, packjit_rv64::SUPPORTED_FEATURES] {
            let m =
                packjit_rv64::emit_request_with(&request(&code, features), EmitOptions::default())
                    .unwrap();
            assert_eq!(m.passes, 1, "rv64 {features:#x} seed {seed}");
            assert!(m.islands >= 2, "rv64 {features:#x}: {} islands", m.islands);
        }
    }
}

/// Every backend compiles sandboxed and trusted programs of 1 k to 100 k instructions (one
/// in six a checked access) in its first pass: each branch starts in a form that reaches,
/// the jumps inside the shared access check included.
#[test]
fn sized_programs_compile_in_one_pass_on_every_backend() {
    use packjit_testkit::gen::sized_program;
    for (n, functions) in [(1_000, 4), (10_000, 8), (100_000, 8)] {
        let code = sized_program(n, functions);
        for flags in [0, PJ_COMPILE_SANDBOX] {
            let arm64 = packjit_arm64::Arm64Backend::new().supported_features();
            let req = CompileRequest {
                flags,
                ..request(&code, arm64)
            };
            let e = packjit_arm64::emit_request_with(&req, EmitOptions::default()).unwrap();
            assert_eq!(e.passes, 1, "arm64, {n} instructions, flags {flags:#x}");
            let req = CompileRequest {
                flags,
                ..request(&code, packjit_rv64::SUPPORTED_FEATURES)
            };
            let m = packjit_rv64::emit_request_with(&req, EmitOptions::default()).unwrap();
            assert_eq!(m.passes, 1, "rv64, {n} instructions, flags {flags:#x}");
            let x = packjit_x86_64::emit_request(&packjit_plugin_api::CompileRequest {
                code: &code,
                helpers: &[],
                features: packjit_x86_64::SUPPORTED_FEATURES,
                flags,
                blind_key: 0,
            })
            .unwrap();
            assert_eq!(x.passes, 1, "x86-64, {n} instructions, flags {flags:#x}");
        }
    }
}
