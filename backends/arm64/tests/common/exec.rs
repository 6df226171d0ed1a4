//! Running emitted code on an arm64 host (qemu-aarch64 in CI): a private RW→RX mapping per
//! program, independent of the runtime's arena.

use super::prog;
use packjit_arm64::emit_program;
use packjit_plugin_api::HelperEntry;

extern "C" {
    fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
}

/// Compiles `insns` and runs them with `mem` as r1 (and its length as r2).
pub fn run_with(insns: &[[u8; 8]], helpers: &[HelperEntry], features: u64, mem: &mut [u8]) -> u64 {
    let out =
        emit_program(&prog(insns), helpers, features).unwrap_or_else(|e| panic!("compile: {e}"));
    run_bytes(&out.bytes, mem)
}

pub fn run_bytes(bytes: &[u8], mem: &mut [u8]) -> u64 {
    let len = bytes.len().div_ceil(4096).max(1) * 4096;
    // SAFETY: a fresh private mapping; written while RW, executed only after mprotect RX and
    // the cache maintenance.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len());
        assert_eq!(libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC), 0);
        __clear_cache(p as *mut _, (p as *mut libc::c_char).add(bytes.len()));
        let f: extern "C" fn(*mut u8, u64) -> u64 = std::mem::transmute(p);
        let r = f(mem.as_mut_ptr(), mem.len() as u64);
        libc::munmap(p, len);
        r
    }
}
