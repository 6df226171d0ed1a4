//! Hooks: programs attached, swapped and detached while other threads run through the hook;
//! replaced programs are retired through the epoch, never freed under a running thread.

use packjit::{Arch, ErrorKind, Hook, LoadOptions, Runtime};
use std::sync::Arc;

// Only its program builder is used here (the tests run the real x86-64 backend).
#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
#[path = "../benches/common/x86_stub.rs"]
mod x86_stub;

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
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let rt = Arc::new(runtime());
    let hook = Arc::new(Hook::new());
    assert_eq!(hook.run(&mut []), None, "nothing attached yet");
    hook.attach(rt.load(&ret(0), &LoadOptions::default()).unwrap())
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (hook, stop, running) = (hook.clone(), stop.clone(), running.clone());
            std::thread::spawn(move || {
                // Versions only move forward: a reader never sees an older program after a
                // newer one, and never a value no program returns.
                let (mut last, mut runs) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let v = hook
                        .run(&mut [])
                        .expect("a program stays attached")
                        .expect("the program runs");
                    assert!(v >= last && v <= 200, "saw {v} after {last}");
                    last = v;
                    runs += 1;
                    if runs == 1 {
                        running.fetch_add(1, Ordering::Release);
                    }
                }
                runs
            })
        })
        .collect();
    // The swaps start once every reader is running programs, so they race with the swaps
    // even on a loaded machine where threads start late.
    while running.load(Ordering::Acquire) < 3 {
        std::thread::yield_now();
    }

    for version in 1..=200 {
        hook.attach(rt.load(&ret(version), &LoadOptions::default()).unwrap())
            .unwrap();
        assert_eq!(hook.run(&mut []).map(Result::unwrap), Some(version as u64));
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }

    // 200 programs were replaced; once the readers are gone every one of them is freed.
    hook.detach();
    assert!(!hook.is_attached());
    assert_eq!(hook.run(&mut []), None);
    // One epoch stage: the hook retires the Program and releases its code after it.
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

#[cfg(target_arch = "x86_64")]
#[test]
fn hook_run_returns_the_programs_stop() {
    let rt = runtime();
    let hook = Hook::new();
    // ldxdw r0, [r1 + 100] ; exit — out of bounds for an 8-byte context.
    let code = [0x79, 0x10, 100, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    hook.attach(rt.load(&code, &LoadOptions::default()).unwrap())
        .unwrap();
    let e = hook.run(&mut [0u8; 8]).unwrap().unwrap_err();
    assert_eq!(
        e.stop().map(|s| (s.kind(), s.pc())),
        Some((packjit::StopKind::OutOfBounds, 0)),
        "{e}"
    );
    assert_eq!(
        hook.run(&mut [7u8; 108]).map(Result::unwrap),
        Some(0x0707_0707_0707_0707)
    );
}

#[cfg(target_arch = "x86_64")]
/// Reclaims until every retired program is released (or a generous bound passes).
fn drain(rt: &Runtime) {
    for _ in 0..2000 {
        packjit::arena::epoch_pin().flush();
        if rt.reclaim() == 0 && rt.live_programs() == rt.stats().allocations {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn batch_attach_under_running_threads_loses_no_run_and_frees_every_replaced_program() {
    use packjit::HookBatch;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const HOOKS: usize = 64;
    const ROUNDS: i32 = 40;

    let rt = Arc::new(runtime());
    let hooks: Arc<Vec<Hook>> = Arc::new((0..HOOKS).map(|_| Hook::new()).collect());
    let mut batch = HookBatch::new();
    for (i, h) in hooks.iter().enumerate() {
        batch
            .load_attach(
                &rt,
                h,
                &x86_stub::ret_prog(i as i32 * 1000, 4),
                &LoadOptions::default(),
            )
            .unwrap();
    }
    assert_eq!(batch.apply(), 0, "nothing was attached before");
    let commits_before = rt.stats().commits;

    let stop = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (hooks, stop, running) = (hooks.clone(), stop.clone(), running.clone());
            std::thread::spawn(move || {
                // Per hook, versions only move forward and every run finds a program.
                let mut last = vec![0i64; HOOKS];
                let (mut attempted, mut ran) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    for (i, h) in hooks.iter().enumerate() {
                        attempted += 1;
                        if let Some(Ok(v)) = h.run(&mut []) {
                            let version = v as i64 - i as i64 * 1000;
                            assert!(
                                (0..=ROUNDS as i64).contains(&version) && version >= last[i],
                                "hook {i}: version {version} after {}",
                                last[i]
                            );
                            last[i] = version;
                            ran += 1;
                        }
                    }
                    if attempted == HOOKS as u64 {
                        running.fetch_add(1, Ordering::Release);
                    }
                }
                (attempted, ran)
            })
        })
        .collect();
    // The batches start once both readers are running the hooks (see above).
    while running.load(Ordering::Acquire) < 2 {
        std::thread::yield_now();
    }

    let mut replaced = 0;
    for round in 1..=ROUNDS {
        let mut batch = HookBatch::new();
        for (i, h) in hooks.iter().enumerate() {
            let code = x86_stub::ret_prog(i as i32 * 1000 + round, 4);
            batch
                .load_attach(&rt, h, &code, &LoadOptions::default())
                .unwrap();
        }
        replaced += batch.apply();
        // Let the readers see this round's programs.
        std::thread::yield_now();
    }
    assert_eq!(
        replaced,
        HOOKS * ROUNDS as usize,
        "each batch replaced every hook"
    );
    assert_eq!(
        rt.stats().commits - commits_before,
        ROUNDS as u64,
        "one arena commit per batch"
    );
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let (attempted, ran) = r.join().unwrap();
        assert!(attempted > 0);
        assert_eq!(ran, attempted, "every run found a program and it ran");
    }
    for (i, h) in hooks.iter().enumerate() {
        assert_eq!(
            h.run(&mut []).map(Result::unwrap),
            Some(i as u64 * 1000 + ROUNDS as u64)
        );
    }

    // Every replaced program is released; only the attached ones stay.
    drain(&rt);
    assert_eq!(rt.reclaim(), 0, "no free pending");
    assert_eq!(rt.live_programs(), HOOKS);
    assert_eq!(rt.stats().allocations, HOOKS);
    assert_eq!(rt.detach_batch(hooks.iter()), HOOKS);
    drain(&rt);
    assert_eq!(rt.live_programs(), 0);
    assert_eq!(rt.stats().allocations, 0, "detached programs are released");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_batch_with_a_foreign_program_attaches_nothing() {
    let rt = runtime();
    let hooks = [Hook::new(), Hook::new()];
    let native = rt
        .load(&x86_stub::ret_prog(1, 2), &LoadOptions::default())
        .unwrap();
    let foreign = rt
        .load(
            &ret(2),
            &LoadOptions {
                arch: Some(Arch::Aarch64),
                name: Some("arm".into()),
                ..Default::default()
            },
        )
        .unwrap();
    let e = rt
        .attach_batch([(&hooks[0], native), (&hooks[1], foreign)])
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotExecutable);
    assert!(e.message.contains("arm"), "{}", e.message);
    assert!(hooks.iter().all(|h| !h.is_attached()));
}

/// Flushes the epoch from this thread, as a thread running hooks does with its pins, often
/// enough to end any grace period (other tests' threads may hold it up for a while).
#[cfg(target_arch = "x86_64")]
fn end_grace_periods_without_the_arena() {
    for _ in 0..200 {
        packjit::arena::epoch_pin().flush();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_retired_batch_is_dropped_by_the_arena_not_by_whoever_ends_its_grace_period() {
    const HOOKS: usize = 8;
    let rt = runtime();
    let hooks: Vec<Hook> = (0..HOOKS).map(|_| Hook::new()).collect();
    let progs = (0..HOOKS).map(|i| {
        rt.load(&x86_stub::ret_prog(i as i32, 2), &LoadOptions::default())
            .unwrap()
    });
    rt.attach_batch(hooks.iter().zip(progs)).unwrap();
    assert_eq!(rt.detach_batch(hooks.iter()), HOOKS);
    // The epoch callback that finds the grace period over runs in this thread's flushes; it
    // only queues the programs (a hook run must not pay for dropping them).
    end_grace_periods_without_the_arena();
    assert_eq!(
        rt.live_programs(),
        HOOKS,
        "dropped inside an epoch callback"
    );
    assert_eq!(rt.stats().allocations, HOOKS);
    // The arena's next call drops them and releases their code.
    assert_eq!(rt.reclaim(), 0);
    assert_eq!(rt.live_programs(), 0);
    assert_eq!(rt.stats().allocations, 0);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn programs_retired_after_their_runtime_is_dropped_are_still_dropped() {
    const HOOKS: usize = 4;
    let map = std::env::temp_dir().join(format!(
        "packjit-hook-test-orphan-{}.map",
        std::process::id()
    ));
    let lines = || std::fs::read_to_string(&map).unwrap().lines().count();
    let hooks: Vec<Hook> = (0..HOOKS).map(|_| Hook::new()).collect();
    {
        let rt = runtime();
        rt.enable_perf_map_at(&map).unwrap();
        let progs = (0..HOOKS).map(|i| {
            rt.load(&x86_stub::ret_prog(i as i32, 2), &LoadOptions::default())
                .unwrap()
        });
        rt.attach_batch(hooks.iter().zip(progs)).unwrap();
        assert_eq!(lines(), HOOKS);
    }
    // The hooks keep the programs (and their arena) alive and runnable.
    assert_eq!(hooks[3].run(&mut []).map(Result::unwrap), Some(3));
    let mut batch = packjit::HookBatch::new();
    for h in &hooks {
        batch.detach(h);
    }
    assert_eq!(batch.apply(), HOOKS);
    // No arena call will come: the programs go in the epoch callback itself.
    end_grace_periods_without_the_arena();
    assert_eq!(
        lines(),
        0,
        "programs retired after the runtime left are listed still"
    );
    std::fs::remove_file(&map).unwrap();
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_program_dropped_after_its_own_grace_waits_for_the_arenas_next_call() {
    let rt = runtime();
    let p = rt
        .load(&x86_stub::ret_prog(7, 2), &LoadOptions::default())
        .unwrap();
    assert_eq!(rt.live_programs(), 1);
    // SAFETY: nothing ever ran the program or can reach it.
    unsafe { p.drop_after_own_grace() };
    // Queued, not dropped: the C API calls this inside epoch callbacks, which may run in any
    // thread's pin.
    assert_eq!(rt.live_programs(), 1);
    assert_eq!(rt.stats().allocations, 1);
    assert_eq!(rt.reclaim(), 0);
    assert_eq!(rt.live_programs(), 0);
    assert_eq!(rt.stats().allocations, 0);
}
