//! The bpf_conformance suite against every backend.
//!
//! * On a backend's native arch every test is compiled *and run*, and r0 compared: x86-64
//!   on the host, aarch64 and riscv64 under qemu-user in the cross runs. The
//!   `negative/unused-*` cases must be rejected at load time.
//! * On any other host every test is at least compiled (and every must-reject case
//!   rejected): compile-only.
//!
//! x86-64 runs with no extensions, BMI2, MOVBE and all of them; arm64 with LSE atomics off
//! and on; RV64 with no extensions and with Zbb+Zba+C.
//! Each configuration prints `arch (features …): N passed, N failed, N skipped`.

use packjit::Runtime;
use packjit_plugin_api::Arch;
use packjit_testkit::conformance::{run_suite_xfail, suite_dir, Summary};
use std::sync::Arc;

/// Cases expected to fail, with the reason. Kept explicit so it can only shrink: a listed case
/// that passes fails the run (see `conformance::run_cases`). Empty: every case must pass.
const EXPECTED_TO_FAIL: &[(&str, &str)] = &[];

fn runtime() -> Runtime {
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .expect("arm64 backend");
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .expect("rv64 backend");
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .expect("x86-64 backend");
    rt
}

fn check(arch: Arch, features: u64) -> Summary {
    let rt = runtime();
    let s = run_suite_xfail(&rt, arch, Some(features), &suite_dir(), EXPECTED_TO_FAIL);
    let native = Arch::host() == Some(arch);
    assert_eq!(s.failed, 0, "{}", s.report());
    assert!(
        s.passed >= 350,
        "only {} cases passed: is the suite complete?\n{}",
        s.passed,
        s.report()
    );
    if native {
        assert_eq!(
            s.compile_only, 0,
            "on the native arch every case must really run"
        );
    }
    s
}

#[test]
fn arm64_without_lse() {
    check(Arch::Aarch64, 0);
}

#[test]
fn arm64_with_lse() {
    check(Arch::Aarch64, packjit_arm64::FEATURE_LSE);
}

#[test]
fn rv64_base() {
    check(Arch::Riscv64, 0);
}

#[test]
fn rv64_all_extensions() {
    use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
    check(Arch::Riscv64, FEATURE_ZBB | FEATURE_ZBA | FEATURE_C);
}

#[test]
fn x86_64_base() {
    check(Arch::X86_64, 0);
}

#[test]
fn x86_64_bmi2() {
    check(Arch::X86_64, packjit_x86_64::FEATURE_BMI2);
}

#[test]
fn x86_64_movbe() {
    check(Arch::X86_64, packjit_x86_64::FEATURE_MOVBE);
}

#[test]
fn x86_64_all_features() {
    check(Arch::X86_64, packjit_x86_64::SUPPORTED_FEATURES);
}
