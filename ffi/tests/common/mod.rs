//! Helpers shared by the C API test binaries that link the library's source (`mod packjit`).

use crate::packjit::*;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};

pub fn check(st: i32, what: &str) {
    // SAFETY: never NULL, NUL-terminated.
    let msg = unsafe { CStr::from_ptr(packjit_last_error()) }.to_string_lossy();
    assert_eq!(st, PJ_OK, "{what}: {msg}");
}

/// `mov r0, k - (n - 2) ; (n - 2) x add r0, 1 ; exit`: returns k, n instructions long (an
/// `add r0, 0` could be compiled to nothing).
pub fn sized(n: usize, k: i32) -> Vec<u8> {
    let mut v = vec![0xb7, 0, 0, 0];
    v.extend_from_slice(&(k - (n as i32 - 2).max(0)).to_le_bytes());
    for _ in 2..n {
        v.extend_from_slice(&[0x07, 0, 0, 0, 1, 0, 0, 0]);
    }
    v.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    v
}

pub fn run(p: *mut PackjitProgram) -> u64 {
    let mut r0 = 0;
    // SAFETY: a live program; an empty context.
    check(
        unsafe { packjit_program_run(p, null_mut(), 0, &mut r0) },
        "packjit_program_run",
    );
    r0
}

/// A runtime with the host's real backend plugin (the cdylibs sit next to the test binary, as
/// dev-dependencies).
pub fn host_runtime() -> *mut PackjitRuntime {
    let mut rt = null_mut();
    // SAFETY: NULL config; valid out pointer.
    check(
        unsafe { packjit_runtime_create(null(), &mut rt) },
        "packjit_runtime_create",
    );
    let exe = std::env::current_exe().unwrap();
    let dir = CString::new(exe.parent().unwrap().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: live runtime; NUL-terminated path; NULL info.
    check(
        unsafe { packjit_load_host_plugin(rt, dir.as_ptr(), null_mut()) },
        "packjit_load_host_plugin",
    );
    rt
}

/// Loads `code` (NULL options).
pub fn load(rt: *mut PackjitRuntime, code: &[u8]) -> *mut PackjitProgram {
    let mut p = null_mut();
    // SAFETY: live runtime; code borrowed for the call; NULL options.
    check(
        unsafe { packjit_program_load(rt, code.as_ptr(), code.len(), null(), &mut p) },
        "packjit_program_load",
    );
    p
}
