//! Untrusted code ends on its own: a sandboxed load gets `DEFAULT_BUDGET` instructions per
//! call unless the host opts out (`Budget::Unlimited`) or sets its own, on the host's backend
//! (natively on x86-64, under qemu-user in the cross runs).

mod host;

use packjit::{Budget, LoadOptions, Stop};
use packjit_frontend::encode_insn;

/// `r0 += 1; goto -2` for ever (pc 1 jumps back to pc 0).
fn spin() -> Vec<u8> {
    [
        encode_insn(0x07, 0, 0, 0, 1),
        encode_insn(0x05, 0, 0, -2, 0),
        encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

/// A loop of `n` iterations, then r0 = n.
fn count_to(n: i32) -> Vec<u8> {
    [
        encode_insn(0x07, 0, 0, 0, 1),
        encode_insn(0xa5, 0, 0, -2, n), // if r0 < n goto pc 0
        encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn a_sandboxed_spin_stops_with_the_default_budget_naming_its_pc() {
    let rt = host::host_runtime();
    let p = rt.load(&spin(), &LoadOptions::default()).unwrap();
    match p.call(&mut []) {
        Err(e) => assert_eq!(e.stop(), Some(Stop::Budget { pc: 1 }), "{e}"),
        Ok(r0) => panic!("a spin returned {r0}"),
    }
    // The default is large enough for real work.
    assert!(
        p.call(&mut []).is_err(),
        "every call gets its own budget and uses it up"
    );
    let q = rt
        .load(&count_to(1_000_000), &LoadOptions::default())
        .unwrap();
    assert_eq!(q.call(&mut []).unwrap(), 1_000_000);
}

#[test]
fn the_host_sets_its_own_budget_or_opts_out() {
    let rt = host::host_runtime();
    let limited = LoadOptions {
        budget: Budget::Limit(100),
        ..Default::default()
    };
    let p = rt.load(&count_to(1000), &limited).unwrap();
    assert!(matches!(
        p.call(&mut []).unwrap_err().stop(),
        Some(Stop::Budget { .. })
    ));
    // Opted out: no counting compiled in, the same loop runs to its end.
    let unlimited = LoadOptions {
        budget: Budget::Unlimited,
        ..Default::default()
    };
    let p = rt.load(&count_to(1000), &unlimited).unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 1000);
    let counted = rt.load(&count_to(1000), &LoadOptions::default()).unwrap();
    assert!(
        p.code_size() < counted.code_size(),
        "no budget code when opted out: {} vs {}",
        p.code_size(),
        counted.code_size()
    );
    // Trusted code counts nothing by default (its loader vouched for it).
    // SAFETY: the loop touches no memory.
    let t = unsafe { rt.load_trusted(&count_to(1000), &LoadOptions::default()) }.unwrap();
    assert_eq!(t.call(&mut []).unwrap(), 1000);
}
