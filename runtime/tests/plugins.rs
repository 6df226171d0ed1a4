//! The whole path through real plugins: dlopen the backend cdylibs, compile into the shared
//! arena, run natively (x86-64 on the dev host; arm64 / riscv64 under qemu-user in CI), reuse
//! freed chunks.

use packjit::{Arch, ErrorKind, LoadOptions, RunError, Runtime};

// Keep the rlibs linked so cargo builds the cdylibs this test loads.
#[allow(unused_imports)]
use {packjit_arm64 as _, packjit_rv64 as _, packjit_x86_64 as _};

fn runtime_with_plugins() -> Runtime {
    let rt = Runtime::new().unwrap();
    let loaded = rt
        .load_plugins(None)
        .expect("backend plugins next to the test binary");
    let mut arches: Vec<Arch> = loaded.iter().map(|b| b.arch).collect();
    arches.sort_by_key(|a| a.code());
    assert_eq!(arches, vec![Arch::X86_64, Arch::Aarch64, Arch::Riscv64]);
    for b in &loaded {
        assert!(
            b.origin.ends_with(".so"),
            "{} was not loaded from a shared object",
            b.origin
        );
    }
    rt
}

/// `mov r0, value ; exit`.
fn ret(value: i32) -> Vec<u8> {
    let mut v = vec![0xb7, 0, 0, 0];
    v.extend_from_slice(&value.to_le_bytes());
    v.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    v
}

#[test]
fn plugins_compile_for_their_arch_and_native_code_runs_from_the_arena() {
    let rt = runtime_with_plugins();
    for arch in [Arch::X86_64, Arch::Aarch64, Arch::Riscv64] {
        let p = rt
            .load(
                &ret(42),
                &LoadOptions {
                    arch: Some(arch),
                    ..Default::default()
                },
            )
            .unwrap();
        // x86-64 instructions have any length; arm64 and RV64 ones are 2- or 4-byte units.
        assert!(p.code_size() > 0 && (arch == Arch::X86_64 || p.code_size() % 2 == 0));
        assert_eq!(p.arch(), arch);
        if Some(arch) == Arch::host() {
            assert!(p.is_executable());
            assert_eq!(p.call(&mut []).unwrap(), 42);
            let ranges = rt.arena().unwrap().pack_ranges();
            let addr = p.entry_addr() as usize;
            assert!(
                ranges.iter().any(|&(s, n)| addr >= s && addr < s + n),
                "code runs from the arena"
            );
        } else {
            let e = p.call(&mut []).unwrap_err();
            assert!(matches!(e, RunError::NotExecutable { .. }), "{e}");
        }
    }
}

#[test]
fn a_plugin_for_the_wrong_arch_is_refused_naming_both_sides() {
    let dir = packjit::default_plugin_dirs()
        .into_iter()
        .find(|d| !packjit::plugin_files(d).is_empty())
        .unwrap();
    let arm = dir.join("libpackjit_arm64.so");
    let rt = Runtime::new().unwrap();
    let e = rt.load_plugin_for(&arm, Some(Arch::Riscv64)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Abi);
    assert!(
        e.message
            .ends_with("plugin emits aarch64 code, host wants riscv64"),
        "{e}"
    );
    // A second backend for the same arch is refused too.
    rt.load_plugin(&arm).unwrap();
    let e = rt.load_plugin(&arm).unwrap_err();
    assert!(
        e.message
            .contains("a backend for aarch64 is already loaded"),
        "{e}"
    );
}

// Executing needs a host with a backend: x86-64 natively, arm64 / riscv64 under qemu-user.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[test]
fn freed_chunks_are_reused_by_other_programs_while_threads_run_the_pack() {
    use packjit::Program;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let host = Arch::host().unwrap();
    let rt = Arc::new(runtime_with_plugins());
    let opts = LoadOptions {
        arch: Some(host),
        ..Default::default()
    };
    let neighbours: Vec<Arc<Program>> = (0..3)
        .map(|i| Arc::new(rt.load(&ret(100 + i), &opts).unwrap()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let calls: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..neighbours.len()).map(|_| Default::default()).collect());
    let runners: Vec<_> = neighbours
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (p, stop, calls) = (p.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(p.call(&mut []).unwrap(), 100 + i as u64);
                    calls[i].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // The rounds start once every runner is running the pack (on a loaded machine a
    // thread can otherwise first be scheduled after they are over).
    while calls.iter().any(|c| c.load(Ordering::Relaxed) == 0) {
        std::thread::yield_now();
    }
    let before: Vec<u64> = calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    for round in 0..25 {
        let old = rt.load(&ret(1000 + round), &opts).unwrap();
        assert_eq!(old.call(&mut []).unwrap(), 1000 + round as u64);
        let addr = old.entry_addr();
        drop(old);
        assert_eq!(rt.reclaim(), 0);
        let new = rt.load(&ret(2000 + round), &opts).unwrap();
        assert_eq!(new.entry_addr(), addr, "the freed chunk is reused");
        assert_eq!(
            new.call(&mut []).unwrap(),
            2000 + round as u64,
            "stale code ran in round {round}"
        );
        drop(new);
        assert_eq!(rt.reclaim(), 0);
    }
    let during: Vec<u64> = calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    stop.store(true, Ordering::Relaxed);
    for t in runners {
        t.join().unwrap();
    }
    // Every runner ran the pack while chunks were freed and reused around it (a runner
    // preempted for all 25 rounds is possible in principle on a loaded machine, but the
    // rounds take milliseconds; at least one must have overlapped them).
    assert!(
        before.iter().zip(&during).any(|(b, d)| d > b),
        "no runner called during the rounds: {before:?} -> {during:?}"
    );
}

// Executing needs a host with a backend: x86-64 natively, arm64 / riscv64 under qemu-user.
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]
#[test]
fn a_batch_is_committed_once() {
    use packjit::Program;
    let host = Arch::host().unwrap();
    let rt = runtime_with_plugins();
    let codes: Vec<Vec<u8>> = (0..50).map(ret).collect();
    let refs: Vec<&[u8]> = codes.iter().map(|c| c.as_slice()).collect();
    let before = rt.stats().commits;
    let progs: Vec<Program> = rt
        .load_batch(
            &refs,
            &LoadOptions {
                arch: Some(host),
                ..Default::default()
            },
        )
        .into_iter()
        .map(|p| p.unwrap())
        .collect();
    assert_eq!(rt.stats().commits, before + 1);
    for (i, p) in progs.iter().enumerate() {
        assert_eq!(p.call(&mut []).unwrap(), i as u64);
    }
}
