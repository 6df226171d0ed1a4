//! Differential testing: random valid programs ([`packjit_testkit::gen`]) run by the JIT and
//! by packjit's interpreter (the reference; rbpf's interpreter too where it implements every
//! instruction).
//!
//! * **In-bounds programs** ([`generate`](packjit_testkit::gen::generate)) run as trusted code
//!   and, when the backend accepts `PJ_COMPILE_SANDBOX`, as sandboxed code: r0, the context
//!   and the stack (dumped into the context) must match.
//! * **Escape programs** ([`generate_escapes`](packjit_testkit::gen::generate_escapes)):
//!   out-of-bounds accesses, wild and null pointers, stack walks, unknown `callx` ids and
//!   loops, with a budget, sandboxed only. Both sides must return the same r0 and context, or
//!   stop with the same kind and pc (and address where meaningful) leaving the same context.
//!   A backend that refuses the sandbox flag (`Unsupported`) is counted and printed as
//!   "skipped: backend without sandbox"; one that accepts it must handle every escape.
//! * `PACKJIT_DIFF_COUNT` programs of each kind per configuration (default natively on
//!   x86-64: 20,000 in-bounds and 20,000 escapes, no emulator in the way; on the other
//!   backends' native arch under qemu: 2000 and 1000; elsewhere, compile-only: 300 and 300),
//!   seeds
//!   `PACKJIT_DIFF_SEED` (default 0x5eed0000) onwards; the seed range is printed.
//! * **Long functions** ([`long_function_program`](packjit_testkit::gen::long_function_program)):
//!   two functions long enough for cold code islands, sandboxed, with a stop in either
//!   or none.
//! * A mismatch prints the seed, the difference and the minimised program, disassembled.

use packjit::{LoadOptions, Runtime};
use packjit_plugin_api::Arch;
use packjit_testkit::gen::{
    check_counted_walk_seed, check_ctx_walk_seed, check_escape_seed, check_index_walk_seed,
    check_long_function_seed, check_seed, check_walk_seed, counted_walk_program, ctx_walk_program,
    helpers, index_walk_program, walk_program, Checked, EscapeChecked, JitTarget,
};
use std::collections::BTreeMap;
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

/// How a sandboxed run ended, as the summaries count it.
fn end_key(end: EscapeChecked) -> String {
    match end {
        EscapeChecked::Finished => "finished".to_string(),
        EscapeChecked::Stopped(kind) => format!("{kind:?}"),
        EscapeChecked::CompiledOnly => "compile-only".to_string(),
    }
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
    // Native x86-64 runs without an emulator: 20,000 programs of each kind cost seconds.
    let (default_count, default_escapes) = match (native, arch) {
        (true, Arch::X86_64) => (20_000, 20_000),
        (true, _) => (2000, 1000),
        (false, _) => (300, 300),
    };
    let env_count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT");
    let count = env_count.unwrap_or(default_count);
    let escape_count = env_count.unwrap_or(default_escapes);
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x5eed_0000);
    let target = JitTarget {
        rt: &rt,
        opts: LoadOptions {
            arch: Some(arch),
            features: Some(features),
            ..LoadOptions::default()
        },
    };
    let label = format!("{arch} (features {features:#x})");
    let sandbox = target.sandbox_supported();
    let current = Arc::new(AtomicU64::new(base));
    watchdog(label.clone(), current.clone());

    // In-bounds programs: trusted, and sandboxed where the backend has the sandbox.
    let modes: &[bool] = if sandbox.is_ok() {
        &[false, true]
    } else {
        &[false]
    };
    let mut in_bounds = String::new();
    for &sandboxed in modes {
        let engine = target.engine(sandboxed);
        let (mut ran, mut compiled, mut with_rbpf) = (0u64, 0u64, 0u64);
        for seed in base..base + count {
            current.store(seed, Ordering::Relaxed);
            match check_seed(&engine, seed) {
                Ok(Checked::Agree { rbpf }) => {
                    ran += 1;
                    with_rbpf += rbpf as u64;
                }
                Ok(Checked::CompiledOnly { rbpf }) => {
                    compiled += 1;
                    with_rbpf += rbpf as u64;
                }
                Err(m) => panic!(
                    "{label} {}: {m}",
                    if sandboxed { "sandboxed" } else { "trusted" }
                ),
            }
        }
        if native {
            assert_eq!(ran, count, "on the native arch every program must run");
        }
        in_bounds.push_str(&format!(
            "; {}: {ran} run and matched, {compiled} compile-only, {with_rbpf} also matched rbpf",
            if sandboxed { "sandboxed" } else { "trusted" }
        ));
    }

    // Escape programs: sandboxed only.
    let escapes = match &sandbox {
        Err(why) => format!("escapes: {escape_count} skipped: backend without sandbox ({why})"),
        Ok(()) => {
            let mut ends: BTreeMap<String, u64> = BTreeMap::new();
            for seed in base..base + escape_count {
                current.store(seed, Ordering::Relaxed);
                let key = match check_escape_seed(&target, seed) {
                    Ok(end) => end_key(end),
                    Err(m) => panic!("{label} escapes: {m}"),
                };
                *ends.entry(key).or_default() += 1;
            }
            if native {
                assert!(!ends.contains_key("compile-only"), "{ends:?}");
            }
            // Loops walking a pointer through the frame (`packjit_frontend::walks`): proven
            // walks run with a clamp instead of checks; the rest must stop where the
            // reference does.
            let mut walk_ends = BTreeMap::<String, u64>::new();
            let (mut proven, mut frame_guarded, mut shadowed, mut in_place) = (0u64, 0, 0, 0);
            for seed in base..base + escape_count {
                current.store(seed, Ordering::Relaxed);
                let prog = packjit_frontend::decode(&walk_program(seed), &[]).unwrap();
                let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
                let walks = &plan.walks;
                proven += walks.iter().any(|w| w.guard.is_none()) as u64;
                frame_guarded += walks.iter().any(|w| w.guard.is_some()) as u64;
                shadowed += walks.iter().any(|w| w.shadow.is_some()) as u64;
                in_place += walks.iter().any(|w| w.shadow.is_none()) as u64;
                let key = match check_walk_seed(&target, seed) {
                    Ok(end) => end_key(end),
                    Err(m) => panic!("{label} walks: {m}"),
                };
                *walk_ends.entry(key).or_default() += 1;
            }
            // The generator must exercise both sides: proven walks and (where the code
            // runs) stopped ones.
            assert!(proven * 5 > escape_count, "{proven} proven walks");
            assert!(
                frame_guarded * 10 > escape_count,
                "{frame_guarded} guarded frame walks"
            );
            // ... and both clamps: into a shadow register, and in place.
            assert!(
                shadowed * 10 > escape_count && in_place * 20 > escape_count,
                "{shadowed} walks through a shadow, {in_place} clamped in place"
            );
            if native {
                let stopped = walk_ends.get("OutOfBounds").copied().unwrap_or(0);
                assert!(stopped * 10 > escape_count, "{walk_ends:?}");
            }
            // Loops walking the context, whose bounds only an entry guard can prove: the
            // guard passes for some seeds and sends others to the checked copy.
            let (mut ctx_ends, mut guarded) = (BTreeMap::<String, u64>::new(), 0u64);
            for seed in base..base + escape_count {
                current.store(seed, Ordering::Relaxed);
                let (code, _) = ctx_walk_program(seed);
                let prog = packjit_frontend::decode(&code, &[]).unwrap();
                let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
                let walks = &plan.walks;
                guarded += walks.iter().any(|w| w.guard.is_some()) as u64;
                let key = match check_ctx_walk_seed(&target, seed) {
                    Ok(end) => end_key(end),
                    Err(m) => panic!("{label} context walks: {m}"),
                };
                *ctx_ends.entry(key).or_default() += 1;
            }
            assert!(guarded * 4 > escape_count, "{guarded} guarded walks");
            // Loops stepping a pointer down the frame while a counter ends them
            // (`packjit_frontend::walks::Counter`, every backend): the guard passes for some
            // seeds and sends others to the checked copy, which must stop where the
            // reference does.
            let (mut counted_ends, mut counted) = (BTreeMap::<String, u64>::new(), 0u64);
            for seed in base..base + escape_count {
                current.store(seed, Ordering::Relaxed);
                let (code, _) = counted_walk_program(seed);
                let prog = packjit_frontend::decode(&code, &[]).unwrap();
                let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
                counted += plan.walks.iter().any(|w| w.counter.is_some()) as u64;
                let key = match check_counted_walk_seed(&target, seed) {
                    Ok(end) => end_key(end),
                    Err(m) => panic!("{label} counted walks: {m}"),
                };
                *counted_ends.entry(key).or_default() += 1;
            }
            assert!(counted * 3 > escape_count, "{counted} counted walks");
            if native {
                let (done, stopped) = (
                    counted_ends.get("finished").copied().unwrap_or(0),
                    counted_ends.get("OutOfBounds").copied().unwrap_or(0),
                );
                assert!(
                    done * 5 > escape_count && stopped * 10 > escape_count,
                    "{counted_ends:?}"
                );
            }
            if native {
                let (done, stopped) = (
                    ctx_ends.get("finished").copied().unwrap_or(0),
                    ctx_ends.get("OutOfBounds").copied().unwrap_or(0),
                );
                assert!(
                    done * 5 > escape_count && stopped * 10 > escape_count,
                    "{ctx_ends:?}"
                );
            }
            // Loops indexing the context (`packjit_frontend::indexes`): proven accesses run
            // with only the branch-free re-test, and every run must end as the
            // reference's, also where the proof must not hold (off by one, the index or
            // the length written, 32-bit or signed tests).
            let (mut index_ends, mut indexed) = (BTreeMap::<String, u64>::new(), 0u64);
            for seed in base..base + escape_count * 2 {
                current.store(seed, Ordering::Relaxed);
                let (code, _) = index_walk_program(seed);
                let prog = packjit_frontend::decode(&code, &[]).unwrap();
                let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
                indexed += plan.uses_ctx_index() as u64;
                let key = match check_index_walk_seed(&target, seed) {
                    Ok(end) => end_key(end),
                    Err(m) => panic!("{label} index walks: {m}"),
                };
                *index_ends.entry(key).or_default() += 1;
            }
            eprintln!(
                "differential {label}: index walks, seeds {base:#x}..{:#x}: {indexed} with \
                 index-bounded accesses, {index_ends:?}",
                base + escape_count * 2
            );
            assert!(
                indexed * 10 > escape_count,
                "{indexed} index-bounded programs"
            );
            if native {
                let (done, stopped) = (
                    index_ends.get("finished").copied().unwrap_or(0),
                    index_ends.get("OutOfBounds").copied().unwrap_or(0),
                );
                assert!(
                    done * 5 > escape_count && stopped * 10 > escape_count,
                    "{index_ends:?}"
                );
            }
            // Long functions, their cold code in islands (`packjit_frontend::cold`): seeds
            // cycle through no stop and a stop in each of the three bodies.
            let long_count = match (native, arch) {
                (true, Arch::X86_64) => 16,
                _ => 8,
            };
            let mut long_ends = BTreeMap::<String, u64>::new();
            for seed in base..base + long_count {
                current.store(seed, Ordering::Relaxed);
                let key = match check_long_function_seed(&target, seed) {
                    Ok(end) => end_key(end),
                    Err(m) => panic!("{label} long functions: {m}"),
                };
                *long_ends.entry(key).or_default() += 1;
            }
            if native {
                assert_eq!(
                    (long_ends.get("finished"), long_ends.get("OutOfBounds")),
                    (Some(&(long_count / 4)), Some(&(long_count / 4 * 3))),
                    "{long_ends:?}"
                );
            }
            format!(
                "escapes (sandboxed, budgeted): {ends:?} matched; walks: {walk_ends:?} matched, {proven} proven, {frame_guarded} guarded ({shadowed} clamped into a shadow register); context walks: {ctx_ends:?} matched, {guarded} guarded; counted walks: {counted_ends:?} matched, {counted} counted; long functions: {long_ends:?} matched"
            )
        }
    };
    current.store(u64::MAX, Ordering::Relaxed);
    packjit_testkit::report(&format!(
        "differential {label}: seeds {base:#x}..{:#x}{in_bounds}; {escapes}",
        base + count.max(escape_count)
    ));
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
