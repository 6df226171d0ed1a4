//! Termination by default through the C API: a sandboxed program loaded with default options
//! gets `PACKJIT_DEFAULT_BUDGET` instructions per run; `PACKJIT_LOAD_NO_BUDGET` opts out, and
//! asking for both a budget and none is refused.

#[allow(dead_code)]
mod common;
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;

use common::{check, host_runtime, load};
use packjit::*;
use std::ffi::CStr;
use std::ptr::null_mut;

/// `r0 += 1; goto -2` for ever.
const SPIN: [u8; 24] = [
    0x07, 0, 0, 0, 1, 0, 0, 0, //
    0x05, 0, 0xfe, 0xff, 0, 0, 0, 0, //
    0x95, 0, 0, 0, 0, 0, 0, 0,
];

/// `r0 += 1; if r0 < 1000 goto -2; exit`.
const COUNT: [u8; 24] = [
    0x07, 0, 0, 0, 1, 0, 0, 0, //
    0xa5, 0, 0xfe, 0xff, 0xe8, 3, 0, 0, //
    0x95, 0, 0, 0, 0, 0, 0, 0,
];

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(packjit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_spin_loaded_with_default_options_stops_with_a_budget_error() {
    let rt = host_runtime();
    let p = load(rt, &SPIN);
    let mut r0 = 0;
    // SAFETY: live program; empty context.
    let st = unsafe { packjit_program_run(p, null_mut(), 0, &mut r0) };
    assert_eq!(st, PJ_ERR_BUDGET, "{}", last_error());
    assert!(last_error().contains("pc 1"), "{}", last_error());

    // Opted out: no counting; a bounded loop runs to its end either way.
    let mut opts = PackjitLoadOptions::default();
    // SAFETY: valid out pointer.
    check(unsafe { packjit_load_options_init(&mut opts) }, "options");
    opts.flags = PACKJIT_LOAD_NO_BUDGET;
    let mut q = null_mut();
    // SAFETY: live runtime, borrowed code and options.
    check(
        unsafe { packjit_program_load(rt, COUNT.as_ptr(), COUNT.len(), &opts, &mut q) },
        "load with no budget",
    );
    // SAFETY: live program; empty context.
    check(
        unsafe { packjit_program_run(q, null_mut(), 0, &mut r0) },
        "run",
    );
    assert_eq!(r0, 1000);
    opts.flags = PACKJIT_LOAD_NO_BUDGET | PACKJIT_LOAD_BUDGET;
    let mut bad = null_mut();
    // SAFETY: as above.
    let st = unsafe { packjit_program_load(rt, COUNT.as_ptr(), COUNT.len(), &opts, &mut bad) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("PACKJIT_LOAD_NO_BUDGET"),
        "{}",
        last_error()
    );
    assert!(bad.is_null());
    // SAFETY: each freed once; the runtime last.
    unsafe {
        packjit_program_free(p);
        packjit_program_free(q);
        packjit_runtime_destroy(rt);
    }
}
