//! The optimizing tier (`Tier::Optimized`) sandboxed, against the sandbox escape programs:
//! out-of-bounds accesses of every kind, unknown `callx` ids, loops that outlast their
//! budget, loops walking the frame and the context, long functions with a stop in each
//! body. Natively on x86-64, under qemu-user in the aarch64 and riscv64 cross runs (the
//! tier compiles for the emulated host). A binary of its own: under qemu each test binary
//! has its own time limit.

use packjit::{Budget, LoadOptions, Runtime, Tier};
use packjit_plugin_api::Arch;
use packjit_testkit::gen::{
    check_ctx_walk_seed, check_escape_seed, check_long_function_seed, check_walk_seed, helpers,
    EscapeChecked, JitTarget,
};
use std::collections::BTreeMap;

fn optimized() -> LoadOptions {
    LoadOptions {
        tier: Tier::Optimized,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    }
}

/// How a sandboxed run ended, as the summaries count it.
fn end_key(end: EscapeChecked) -> String {
    match end {
        EscapeChecked::Finished => "finished".to_string(),
        EscapeChecked::Stopped(kind) => format!("{kind:?}"),
        EscapeChecked::CompiledOnly => "compile-only".to_string(),
    }
}

/// The sandbox escape programs (out-of-bounds accesses of every kind, unknown `callx` ids,
/// loops that outlast their budget), loops walking the frame and the context, and long
/// functions with a stop in each body, sandboxed on the tier: each run must end as the
/// reference's does (r0 and context, or the same stop: kind, pc, address, size, direction).
/// `PACKJIT_DIFF_COUNT` programs of each kind (default 5000 natively on x86-64, 60 under
/// qemu, where the reference's budgeted loops are slow), seeds from `PACKJIT_DIFF_SEED`
/// (default 0x5eed_0000); the range is printed.
#[test]
fn escapes_stop_where_the_reference_stops() {
    let rt = Runtime::new().unwrap();
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    let emulated = !cfg!(target_arch = "x86_64");
    let count =
        packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(if emulated { 60 } else { 5000 });
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x5eed_0000);
    let target = JitTarget {
        rt: &rt,
        opts: optimized(),
    };
    target
        .sandbox_supported()
        .expect("the tier takes sandboxed, budgeted code");
    let tally = |what: &str, check: &dyn Fn(u64) -> Result<EscapeChecked, String>, n: u64| {
        let mut ends = BTreeMap::<String, u64>::new();
        for seed in base..base + n {
            let end = check(seed).unwrap_or_else(|m| panic!("optimized tier, {what}: {m}"));
            *ends.entry(end_key(end)).or_default() += 1;
        }
        assert!(!ends.contains_key("compile-only"), "{what}: {ends:?}");
        ends
    };
    let escapes = tally(
        "escapes",
        &|seed| check_escape_seed(&target, seed).map_err(|m| m.to_string()),
        count,
    );
    // Every way a run can end must have come up.
    for kind in ["finished", "OutOfBounds", "Budget", "UnknownCallx"] {
        assert!(
            escapes.get(kind).copied().unwrap_or(0) > 0,
            "no {kind}: {escapes:?}"
        );
    }
    let walks = tally("walks", &|seed| check_walk_seed(&target, seed), count);
    let ctx_walks = tally(
        "context walks",
        &|seed| check_ctx_walk_seed(&target, seed),
        count,
    );
    let long = tally(
        "long functions",
        &|seed| check_long_function_seed(&target, seed),
        8,
    );
    packjit_testkit::report(&format!(
        "optimized tier escapes ({}, sandboxed, budgeted): seeds {base:#x}..{:#x}: escapes {escapes:?}, walks {walks:?}, context walks {ctx_walks:?}, long functions {long:?}: all matched the reference",
        Arch::host().unwrap(),
        base + count
    ));
}
