//! What `packjit_program_run` and `packjit_hook_run` report, now that their success path
//! only reads a flag to learn whether the last error needs clearing (issue 43): every
//! failure still records code, pc, address and message on the calling thread; the next
//! success clears all four; bad handles and arguments are still refused; an empty hook says
//! so.

#[allow(dead_code)]
mod common;
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;

use common::{check, host_runtime, load};
use packjit::*;
use std::ffi::CStr;
use std::ptr::null_mut;

/// `r0 = *(u32 *)(r1 + 16); exit`: out of bounds on a 16-byte context (sandboxed).
const READ_PAST: [u8; 16] = [
    0x61, 0x10, 16, 0, 0, 0, 0, 0, //
    0x95, 0, 0, 0, 0, 0, 0, 0,
];

/// `r0 = *(u32 *)(r1 + 0); exit`.
const READ_FIRST: [u8; 16] = [
    0x61, 0x10, 0, 0, 0, 0, 0, 0, //
    0x95, 0, 0, 0, 0, 0, 0, 0,
];

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(packjit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Code, pc, address and message of the calling thread's last error.
fn last() -> (i32, i64, u64, String) {
    (
        packjit_last_error_code(),
        packjit_last_error_pc(),
        packjit_last_error_addr(),
        last_error(),
    )
}

fn cleared() -> (i32, i64, u64, String) {
    (PJ_OK, -1, 0, String::new())
}

#[test]
fn a_stop_is_recorded_in_full_and_the_next_success_clears_it() {
    let rt = host_runtime();
    let bad = load(rt, &READ_PAST);
    let good = load(rt, &READ_FIRST);
    let mut ctx = [7u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let at = ctx.as_ptr() as u64 + 16;
    let mut r0 = 0;
    for round in 0..3 {
        // SAFETY: live program; ctx is 16 writable bytes.
        let st = unsafe { packjit_program_run(bad, ctx.as_mut_ptr().cast(), 16, &mut r0) };
        assert_eq!(st, PJ_ERR_OUT_OF_BOUNDS, "round {round}: {}", last_error());
        let (code, pc, addr, msg) = last();
        assert_eq!((code, pc, addr), (PJ_ERR_OUT_OF_BOUNDS, 0, at), "{msg}");
        assert!(msg.starts_with("pc 0: out of bounds"), "{msg}");

        // SAFETY: as above.
        let st = unsafe { packjit_program_run(good, ctx.as_mut_ptr().cast(), 16, &mut r0) };
        assert_eq!((st, r0), (PJ_OK, 7));
        assert_eq!(last(), cleared(), "round {round}");
        // A second success on a clear state leaves it clear.
        // SAFETY: as above.
        check(
            unsafe { packjit_program_run(good, ctx.as_mut_ptr().cast(), 16, &mut r0) },
            "run",
        );
        assert_eq!(last(), cleared());
    }
    // A failure of another kind after a success is recorded too: a NULL context with a
    // length, then a NULL r0.
    // SAFETY: the arguments are refused before anything is dereferenced.
    let st = unsafe { packjit_program_run(good, null_mut(), 4, &mut r0) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "ctx is NULL but ctx_len is 4");
    assert_eq!(packjit_last_error_pc(), -1);
    // SAFETY: as above.
    let st = unsafe { packjit_program_run(good, ctx.as_mut_ptr().cast(), 16, null_mut()) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "r0 is NULL");

    // Errors are per thread: another thread starts clear and its failure stays its own.
    let (b, g) = (bad as usize, good as usize);
    std::thread::spawn(move || {
        assert_eq!(last(), cleared());
        let mut ctx = [0u8; 16];
        let mut r0 = 0;
        // SAFETY: live program; ctx is 16 writable bytes.
        let st =
            unsafe { packjit_program_run(b as *const _, ctx.as_mut_ptr().cast(), 16, &mut r0) };
        assert_eq!(st, PJ_ERR_OUT_OF_BOUNDS);
        // SAFETY: as above.
        let st =
            unsafe { packjit_program_run(g as *const _, ctx.as_mut_ptr().cast(), 16, &mut r0) };
        assert_eq!(st, PJ_OK);
        assert_eq!(last(), cleared());
    })
    .join()
    .unwrap();
    assert_eq!(
        last_error(),
        "r0 is NULL",
        "this thread's error is untouched"
    );

    // SAFETY: each freed once; the runtime last.
    unsafe {
        packjit_program_free(bad);
        packjit_program_free(good);
        packjit_runtime_destroy(rt);
    }
}

#[test]
fn foreign_handles_are_refused_by_the_run_path() {
    let rt = host_runtime();
    let good = load(rt, &READ_FIRST);
    let mut ctx = [1u8; 16];
    let mut r0 = 0;
    // SAFETY: live program; ctx is 16 writable bytes.
    check(
        unsafe { packjit_program_run(good, ctx.as_mut_ptr().cast(), 16, &mut r0) },
        "run",
    );
    // Memory that is no handle (aligned, readable, the wrong magic).
    let fake = [0u64; 8];
    // SAFETY: the handle is refused on its magic before anything else is read.
    let st =
        unsafe { packjit_program_run(fake.as_ptr().cast(), ctx.as_mut_ptr().cast(), 16, &mut r0) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "program is not a PackjitProgram handle");
    // SAFETY: as above, for a hook.
    let st =
        unsafe { packjit_hook_run(fake.as_ptr().cast(), ctx.as_mut_ptr().cast(), 16, &mut r0) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "hook is not a PackjitHook handle");
    // Misaligned and NULL handles.
    // SAFETY: refused on alignment / NULL before any read.
    let st = unsafe {
        packjit_program_run(
            fake.as_ptr().cast::<u8>().add(1).cast(),
            ctx.as_mut_ptr().cast(),
            16,
            &mut r0,
        )
    };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "program is misaligned");
    // SAFETY: as above.
    let st = unsafe { packjit_program_run(std::ptr::null(), ctx.as_mut_ptr().cast(), 16, &mut r0) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "program is NULL");
    // SAFETY: freed once; the runtime last.
    unsafe {
        packjit_program_free(good);
        packjit_runtime_destroy(rt);
    }
}

#[test]
fn hook_runs_report_empty_hooks_and_stops_and_clear_on_success() {
    let rt = host_runtime();
    let mut hook = null_mut();
    // SAFETY: live runtime; valid out pointer.
    check(unsafe { packjit_hook_create(rt, &mut hook) }, "hook");
    let mut ctx = [9u8; 16];
    let at = ctx.as_ptr() as u64 + 16;
    let mut r0 = 0;
    // SAFETY: live hook; ctx is 16 writable bytes.
    let st = unsafe { packjit_hook_run(hook, ctx.as_mut_ptr().cast(), 16, &mut r0) };
    assert_eq!(st, PJ_ERR_NOT_EXECUTABLE);
    assert_eq!(last_error(), "no program is attached to the hook");

    let attach = |code: &[u8]| {
        let mut batch = null_mut();
        // SAFETY: valid out pointer; live batch and hook; code borrowed; default options.
        unsafe {
            check(packjit_hook_batch_create(&mut batch), "batch");
            check(
                packjit_hook_batch_load_attach(
                    batch,
                    hook,
                    code.as_ptr(),
                    code.len(),
                    std::ptr::null(),
                ),
                "load_attach",
            );
            check(packjit_hook_batch_apply(batch, null_mut()), "apply");
        }
    };
    attach(&READ_PAST);
    // SAFETY: as above.
    let st = unsafe { packjit_hook_run(hook, ctx.as_mut_ptr().cast(), 16, &mut r0) };
    assert_eq!(st, PJ_ERR_OUT_OF_BOUNDS, "{}", last_error());
    let (code, pc, addr, msg) = last();
    assert_eq!((code, pc, addr), (PJ_ERR_OUT_OF_BOUNDS, 0, at), "{msg}");

    attach(&READ_FIRST);
    // SAFETY: as above.
    check(
        unsafe { packjit_hook_run(hook, ctx.as_mut_ptr().cast(), 16, &mut r0) },
        "hook run",
    );
    assert_eq!(r0, 0x0909_0909);
    assert_eq!(last(), cleared());
    // SAFETY: the hook and the runtime destroyed once, the runtime last.
    unsafe {
        packjit_hook_destroy(hook);
        packjit_runtime_destroy(rt);
    }
}
