//! Running emitted code on an arm64 host (qemu-aarch64 in CI): a private RW→RX mapping per
//! program, independent of the runtime's arena, called with a `PjExecEnv` as its third
//! argument (the local executor until the runtime's sandbox API is used everywhere).

use super::prog;
use packjit_arm64::{emit_program, emit_request};
use packjit_plugin_api::abi::{PjExecEnv, PjMemRegion, PJ_STOP_NONE};
use packjit_plugin_api::{CompileRequest, HelperEntry};

extern "C" {
    fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
}

/// Compiles `insns` (trusted) and runs them with `mem` as r1 (and its length as r2);
/// asserts the run did not stop.
pub fn run_with(insns: &[[u8; 8]], helpers: &[HelperEntry], features: u64, mem: &mut [u8]) -> u64 {
    let out =
        emit_program(&prog(insns), helpers, features).unwrap_or_else(|e| panic!("compile: {e}"));
    run_bytes(&out.bytes, mem)
}

/// Runs code that must not stop.
pub fn run_bytes(bytes: &[u8], mem: &mut [u8]) -> u64 {
    let (r0, env) = run_env(bytes, mem, &[], u64::MAX);
    assert_eq!(env.stop_kind, PJ_STOP_NONE, "unexpected stop: {env:?}");
    r0
}

/// Compiles `req` and runs it; returns r0 and the env after the run.
pub fn run_req(
    req: &CompileRequest<'_>,
    mem: &mut [u8],
    regions: &[PjMemRegion],
    budget: u64,
) -> (u64, PjExecEnv) {
    let out = emit_request(req).unwrap_or_else(|e| panic!("compile: {e}"));
    run_env(&out.bytes, mem, regions, budget)
}

/// Runs `bytes` with an env describing `mem`, `regions` and `budget`.
pub fn run_env(
    bytes: &[u8],
    mem: &mut [u8],
    regions: &[PjMemRegion],
    budget: u64,
) -> (u64, PjExecEnv) {
    let mut env = PjExecEnv {
        regions: regions.as_ptr() as u64,
        region_count: regions.len() as u64,
        ctx_start: mem.as_ptr() as u64,
        ctx_end: mem.as_ptr() as u64 + mem.len() as u64,
        ctx_len: mem.len() as u64,
        budget,
        ..Default::default()
    };
    let len = bytes.len().div_ceil(4096).max(1) * 4096;
    // SAFETY: a fresh private mapping; written while RW, executed only after mprotect RX and
    // the cache maintenance; the code follows the PjProgramEntry ABI.
    let r0 = unsafe {
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
        let f: packjit_plugin_api::abi::PjProgramEntry = std::mem::transmute(p);
        let r = f(mem.as_mut_ptr(), mem.len() as u64, &mut env);
        libc::munmap(p, len);
        r
    };
    (r0, env)
}
