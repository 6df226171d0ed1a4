//! Arbitrary bytes → verifier + both backends (no features / all features), compiled into a
//! heap-backed arena. A panic, a hang (libFuzzer's -timeout), a backend accepting what the
//! verifier rejects, or rejecting a verified program for a non-encoding reason is a finding.
//! The same entry runs on stable in `testkit/tests/fuzz_stable.rs`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packjit_testkit::fuzz::compile_both(data);
    // On x86-64 hosts the accepted programs also run, sandboxed and budgeted.
    packjit_testkit::fuzz::run_sandboxed(data);
});
