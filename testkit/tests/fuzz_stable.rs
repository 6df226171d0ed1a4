//! Stable-toolchain fuzzing: the cargo-fuzz entry (`packjit_testkit::fuzz::compile_both`)
//! over random bytes, mutated suite programs and mutated generated programs. No panic, no
//! hang (each input must finish in 5 s), every rejection a clean error; on x86-64 every
//! accepted input also runs natively, sandboxed and budgeted (`fuzz::run_sandboxed`).
//! `PACKJIT_FUZZ_COUNT` inputs (default 20,000 on x86-64, 3000 elsewhere), `PACKJIT_FUZZ_SEED`
//! to vary the stream.

use packjit_testkit::conformance::{load_suite, suite_dir};
use packjit_testkit::fuzz::{compile_both, mutate, run_sandboxed};
use packjit_testkit::gen::{generate, Rng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

#[test]
fn verify_and_compile_never_panic_or_hang() {
    // Native x86-64 (no emulator) affords 20,000 inputs in seconds.
    let default = if cfg!(target_arch = "x86_64") {
        20_000
    } else {
        3000
    };
    let count = packjit_testkit::env_u64("PACKJIT_FUZZ_COUNT").unwrap_or(default);
    let seed = packjit_testkit::env_u64("PACKJIT_FUZZ_SEED").unwrap_or(0xf022);
    let mut rng = Rng::new(seed);
    let corpus: Vec<Vec<u8>> = load_suite(&suite_dir())
        .expect("suite")
        .into_iter()
        .filter_map(|c| c.program.ok())
        .collect();
    let mut slowest = Duration::ZERO;
    // Native runs by stop kind (none, out of bounds, budget, unknown callx).
    let mut ran = [0u64; 4];
    for i in 0..count {
        let mut input = match i % 3 {
            0 => (0..8 * (1 + rng.below(12)))
                .map(|_| rng.next_u64() as u8)
                .collect(),
            1 => corpus[rng.below(corpus.len() as u64) as usize].clone(),
            _ => generate(rng.next_u64()).encode(),
        };
        // Every sixth input is a valid generated program, unmutated: it must compile.
        if i % 3 != 0 && i % 6 != 5 {
            mutate(&mut rng, &mut input);
        }
        let t = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| {
            compile_both(&input);
            run_sandboxed(&input)
        })) {
            Ok(Some(kind)) => ran[kind as usize] += 1,
            Ok(None) => {}
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!(
                    "input {i} (PACKJIT_FUZZ_SEED={seed:#x}): {}\nbytes: {:02x?}\n{}",
                    msg.unwrap_or_default(),
                    input,
                    packjit_testkit::disasm::disassemble(&input, true)
                );
            }
        }
        let dt = t.elapsed();
        slowest = slowest.max(dt);
        assert!(
            dt < Duration::from_secs(5),
            "input {i} took {dt:?}: {:02x?}",
            input
        );
    }
    println!(
        "fuzz: {count} inputs from seed {seed:#x}, slowest {slowest:?}; run natively (x86-64, \
         sandboxed): {} returned, {} out of bounds, {} out of budget, {} unknown callx",
        ran[0], ran[1], ran[2], ran[3]
    );
    if cfg!(target_arch = "x86_64") {
        assert!(
            ran.iter().sum::<u64>() >= count / 10,
            "too few inputs ran natively: {ran:?}"
        );
    }
}
