//! # packjit-testkit
//!
//! The harness every packjit backend is judged by:
//!
//! * [`data`]: reader for bpf_conformance `.data` files;
//! * [`asm`] / [`disasm`]: the bpf_conformance assembly dialect, both ways (re-exported from
//!   the `packjit-asm` crate);
//! * [`reference`](mod@reference): the RFC 9669 (cpu v4) reference, packjit's own interpreter (`packjit-interp`),
//!   plus an adaptor over rbpf's interpreter as a second, independent reference;
//! * [`conformance`]: runs the suite against a `packjit::Runtime` (or any [`conformance::Engine`]);
//! * [`gen`]: random valid, terminating programs for differential testing, with a minimiser;
//! * [`fuzz`]: the entry the cargo-fuzz target and the stable fuzz test share.

pub mod bench;
pub mod conformance;
pub mod corpus;
pub mod data;
pub mod density;
pub mod fuzz;
pub mod gen;
pub mod host_tool;
pub mod inline_cases;
pub mod reference;

pub use packjit_asm::{asm, disasm};

/// Prints a summary line straight to stderr, past the test harness's output capture, so the
/// per-arch counts show up in every test run (captured `println!` output is only shown for
/// failing tests).
pub fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Reads a numeric setting (seed, count) from the environment: decimal or `0x` hex.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}
