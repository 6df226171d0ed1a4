//! Differential testing: random valid, terminating programs ([`packjit_testkit::gen`]) run by
//! the JIT and by the reference evaluator (and rbpf's interpreter where it implements every
//! instruction); r0, the context and the stack (dumped into the context) must match.
//!
//! * `PACKJIT_DIFF_COUNT` programs per configuration (default 20,000 natively on x86-64,
//!   2000 on the other backends' native arch, 300 compile-only elsewhere), seeds `PACKJIT_DIFF_SEED` (default 0x5eed0000)
//!   onwards; the seed range is printed.
//! * A mismatch prints the seed, the difference and the minimised program, disassembled.

use packjit::{LoadOptions, Runtime};
use packjit_plugin_api::Arch;
use packjit_testkit::conformance::RuntimeEngine;
use packjit_testkit::gen::{check_seed, helpers, Checked};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Native code cannot be interrupted: if a (broken) JIT loops forever on a program the
/// reference finished, report the seed and end the process instead of hanging CI.
fn watchdog(label: String, current: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_secs(60));
            let now = current.load(Ordering::Relaxed);
            if now == last && now != u64::MAX {
                eprintln!("differential {label}: seed {now:#x} has not finished in 60 s (JIT hang?); rerun with PACKJIT_DIFF_SEED={now:#x} PACKJIT_DIFF_COUNT=1");
                std::process::exit(101);
            }
            last = now;
        }
    });
}

fn run(arch: Arch, features: u64) {
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .unwrap();
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    let native = Arch::host() == Some(arch);
    // Native x86-64 runs without an emulator: 20,000 programs cost seconds there.
    let default_count = match (native, arch) {
        (true, Arch::X86_64) => 20_000,
        (true, _) => 2000,
        (false, _) => 300,
    };
    let count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(default_count);
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x5eed_0000);
    let engine = RuntimeEngine {
        rt: &rt,
        opts: LoadOptions {
            arch: Some(arch),
            features: Some(features),
            ..LoadOptions::default()
        },
    };
    let (mut ran, mut compiled, mut with_rbpf) = (0, 0, 0);
    let current = Arc::new(AtomicU64::new(base));
    watchdog(format!("{arch} features {features:#x}"), current.clone());
    for seed in base..base + count {
        current.store(seed, Ordering::Relaxed);
        match check_seed(&engine, seed) {
            Ok(Checked::Agree { rbpf }) => {
                ran += 1;
                with_rbpf += rbpf as u32;
            }
            Ok(Checked::CompiledOnly { rbpf }) => {
                compiled += 1;
                with_rbpf += rbpf as u32;
            }
            Err(m) => panic!("{arch} features {features:#x}: {m}"),
        }
    }
    current.store(u64::MAX, Ordering::Relaxed);
    packjit_testkit::report(&format!(
        "differential {arch} (features {features:#x}): seeds {base:#x}..{:#x}: {ran} run and matched, {compiled} compile-only, {with_rbpf} also matched rbpf",
        base + count
    ));
    if native {
        assert_eq!(ran, count, "on the native arch every program must run");
    }
}

#[test]
fn arm64_without_lse() {
    run(Arch::Aarch64, 0);
}

#[test]
fn arm64_with_lse() {
    run(Arch::Aarch64, packjit_arm64::FEATURE_LSE);
}

#[test]
fn rv64_base() {
    run(Arch::Riscv64, 0);
}

#[test]
fn rv64_all_extensions() {
    use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
    run(Arch::Riscv64, FEATURE_ZBB | FEATURE_ZBA | FEATURE_C);
}

#[test]
fn x86_64_base() {
    run(Arch::X86_64, 0);
}

#[test]
fn x86_64_all_features() {
    run(Arch::X86_64, packjit_x86_64::SUPPORTED_FEATURES);
}
