//! Hooks: programs attached, swapped and detached while other threads run through the hook;
//! replaced programs are retired through the epoch, never freed under a running thread.

use packjit::{Arch, ErrorKind, Hook, LoadOptions, Runtime};
use std::sync::Arc;

fn runtime() -> Runtime {
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .unwrap();
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
fn a_program_for_another_arch_cannot_be_attached() {
    let rt = runtime();
    let foreign = [Arch::Aarch64, Arch::Riscv64]
        .into_iter()
        .find(|a| Some(*a) != Arch::host())
        .unwrap();
    let p = rt
        .load(
            &ret(1),
            &LoadOptions {
                arch: Some(foreign),
                ..Default::default()
            },
        )
        .unwrap();
    let hook = Hook::new();
    let e = hook.attach(p).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotExecutable);
    assert!(!hook.is_attached());
    assert_eq!(hook.run(&mut []), None);
}

// Running attached programs needs an arm64 or riscv64 host (qemu-user in the cross runs).
#[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
#[test]
fn programs_are_swapped_under_running_threads_and_retired_safely() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let rt = Arc::new(runtime());
    let hook = Arc::new(Hook::new());
    assert_eq!(hook.run(&mut []), None, "nothing attached yet");
    hook.attach(rt.load(&ret(0), &LoadOptions::default()).unwrap())
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (hook, stop) = (hook.clone(), stop.clone());
            std::thread::spawn(move || {
                // Versions only move forward: a reader never sees an older program after a
                // newer one, and never a value no program returns.
                let (mut last, mut runs) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let v = hook.run(&mut []).expect("a program stays attached");
                    assert!(v >= last && v <= 200, "saw {v} after {last}");
                    last = v;
                    runs += 1;
                }
                runs
            })
        })
        .collect();

    for version in 1..=200 {
        hook.attach(rt.load(&ret(version), &LoadOptions::default()).unwrap())
            .unwrap();
        assert_eq!(hook.run(&mut []), Some(version as u64));
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }

    // 200 programs were replaced; once the readers are gone every one of them is freed.
    hook.detach();
    assert!(!hook.is_attached());
    assert_eq!(hook.run(&mut []), None);
    // Two epoch stages: the hook retires the Program, whose drop then defers the code free.
    for _ in 0..1000 {
        packjit::arena::epoch_pin().flush();
        rt.reclaim();
        if rt.stats().allocations == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(rt.reclaim(), 0);
    assert_eq!(rt.stats().allocations, 0, "retired programs are released");
}
