//! Cold code islands (`packjit_frontend::cold`): in functions longer than the island span,
//! the arm64 and RV64 backends place the cold sides of checks inside the function, so every
//! branch to them reaches in its first form and the program compiles in one pass. (x86-64's
//! jumps reach ±2 GiB: its cold code stays after each function.) Running these programs,
//! stops included, is part of the differential test (`differential.rs`).

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
        let rv = packjit_rv64::Rv64Backend::new();
        for features in [0, rv.supported_features()] {
            let m = rv
                .emit_for_measurement(&request(&code, features), EmitOptions::default())
                .unwrap();
            assert_eq!(m.passes, 1, "rv64 {features:#x} seed {seed}");
            assert!(m.islands >= 2, "rv64 {features:#x}: {} islands", m.islands);
        }
    }
}
