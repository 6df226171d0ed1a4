//! Differential runs of the sandboxed, budgeted and blinded code against the testkit's
//! reference evaluator (the trusted configuration runs in `testkit/tests/differential.rs`).
//! The generated programs stay inside their context and stack, so a sandboxed run must give
//! the same r0, context and stack as the reference: a false stop is a failure.
//!
//! `PACKJIT_DIFF_COUNT` programs per mode (default 3000), seeds from `PACKJIT_DIFF_SEED`
//! (default 0x5eed0000); the range is printed.
#![cfg(target_arch = "x86_64")]

mod common;

use common::Jit;
use packjit_plugin_api::abi::*;
use packjit_plugin_api::HelperEntry;
use packjit_testkit::gen::{check_seed, helpers};

fn run(flags: u32, features: u64) {
    let mut jit = Jit::new(flags, features);
    jit.helpers = helpers()
        .into_iter()
        .map(|(id, f, _)| HelperEntry {
            id,
            inline_kind: 0,
            addr: f as *const () as usize as u64,
        })
        .collect();
    let count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(3000);
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x5eed_0000);
    for seed in base..base + count {
        if let Err(m) = check_seed(&jit, seed) {
            panic!("flags {flags:#x} features {features:#x}: {m}");
        }
    }
    packjit_testkit::report(&format!(
        "differential x86_64 (flags {flags:#x}, features {features:#x}): seeds {base:#x}..{:#x}: {count} matched the reference",
        base + count
    ));
}

#[test]
fn sandboxed() {
    run(PJ_COMPILE_SANDBOX, 0);
}

#[test]
fn sandboxed_budgeted_blinded_with_features() {
    run(
        PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS,
        packjit_x86_64::SUPPORTED_FEATURES,
    );
}
