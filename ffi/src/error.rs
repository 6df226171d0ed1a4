//! Status strings, the thread-local last error and the boundary every exported function
//! runs its body through (it records the error and catches panics).

use super::{
    PJ_ERR_ABI, PJ_ERR_ARENA, PJ_ERR_BUDGET, PJ_ERR_ENCODING, PJ_ERR_INTERNAL,
    PJ_ERR_INVALID_ARGUMENT, PJ_ERR_NOT_EXECUTABLE, PJ_ERR_OUT_OF_BOUNDS, PJ_ERR_PANIC,
    PJ_ERR_PLUGIN, PJ_ERR_UNKNOWN_CALLX, PJ_ERR_UNKNOWN_HELPER, PJ_ERR_UNSUPPORTED, PJ_ERR_VERIFY,
    PJ_OK,
};
use core::ffi::{c_char, CStr};
use packjit_runtime::maps::MapError;
use packjit_runtime::{Error, ErrorKind, RunError, Stop};
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Message capacity of the thread-local last error (longer messages are cut on a UTF-8
/// boundary).
const LAST_ERROR_LEN: usize = 1024;

struct LastError {
    code: i32,
    pc: i64,
    /// Address of a refused access (`PJ_ERR_OUT_OF_BOUNDS`), else 0.
    addr: u64,
    msg: [c_char; LAST_ERROR_LEN],
}

thread_local! {
    // A fixed buffer per thread, so the pointer packjit_last_error returns stays valid for
    // the thread's life (only its contents change).
    static LAST_ERROR: RefCell<LastError> = const {
        RefCell::new(LastError { code: PJ_OK, pc: -1, addr: 0, msg: [0; LAST_ERROR_LEN] })
    };
    // Whether LAST_ERROR may hold anything but the cleared state: set before every write
    // to it, cleared once it is cleared. A successful call (every run) then reads one flag
    // instead of borrowing the 1 KiB buffer and comparing four fields (issue 43). A plain
    // `Cell<bool>` with a const initialiser and no destructor: its access is a bare
    // thread-pointer-relative load, with no lazy-registration check.
    static LAST_ERROR_SET: Cell<bool> = const { Cell::new(false) };
}

fn set_last(code: i32, pc: i64, msg: &str) {
    set_last_fault(code, pc, 0, msg)
}

/// A successful call clears the last error; a run path calls this each time, so it reads
/// one flag and writes only when there is something to clear.
#[inline]
fn set_last_ok() {
    if LAST_ERROR_SET.get() {
        clear_last();
    }
}

#[cold]
#[inline(never)]
fn clear_last() {
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.code = PJ_OK;
            l.pc = -1;
            l.addr = 0;
            l.msg[0] = 0;
            LAST_ERROR_SET.set(false);
        }
    });
}

#[cold]
#[inline(never)]
fn set_last_fault(code: i32, pc: i64, addr: u64, msg: &str) {
    // Before the write: a flag that says "clear" must never hide a recorded error.
    LAST_ERROR_SET.set(true);
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.code = code;
            l.pc = pc;
            l.addr = addr;
            packjit_plugin_api::write_c_message(&mut l.msg, msg);
        }
    });
}

/// What an exported function's body fails with: an [`Error`] (arguments, loading,
/// compiling, configuring) or, for the functions that run a program, a [`RunError`].
pub(super) enum Failure {
    Error(Error),
    Run(RunError),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Error(e)
    }
}

impl From<RunError> for Failure {
    fn from(e: RunError) -> Self {
        Failure::Run(e)
    }
}

/// The status of a run that returned no result, and the address for
/// `packjit_last_error_addr` (that of a refused access, else 0).
fn run_status(e: &RunError) -> (i32, u64) {
    match e {
        RunError::Stop(Stop::OutOfBounds { addr, .. }) => (PJ_ERR_OUT_OF_BOUNDS, *addr),
        RunError::Stop(Stop::Budget { .. }) => (PJ_ERR_BUDGET, 0),
        RunError::Stop(Stop::UnknownCallx { .. }) => (PJ_ERR_UNKNOWN_CALLX, 0),
        RunError::NotExecutable { .. } => (PJ_ERR_NOT_EXECUTABLE, 0),
        RunError::UnknownStop { .. } => (PJ_ERR_INTERNAL, 0),
    }
}

#[cold]
#[inline(never)]
fn record(f: &Failure) -> i32 {
    let (code, pc, addr, msg) = match f {
        Failure::Error(e) => (e.kind.code(), e.pc, 0, e.to_string()),
        Failure::Run(e) => {
            let (code, addr) = run_status(e);
            (code, e.pc(), addr, e.to_string())
        }
    };
    set_last_fault(code, pc.map_or(-1, |p| p as i64), addr, &msg);
    code
}

pub(super) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs an exported function's body: catches panics, records the error, returns the status.
pub(super) fn boundary(what: &str, f: impl FnOnce() -> Result<(), Error>) -> i32 {
    boundary_run(what, || f().map_err(Failure::Error))
}

/// [`boundary`] for the functions that run a program, whose body may also end in a
/// [`RunError`].
pub(super) fn boundary_run(what: &str, f: impl FnOnce() -> Result<(), Failure>) -> i32 {
    // The status is settled inside the closure, so what crosses `catch_unwind` is an `i32`:
    // a `Result<Result<(), Failure>, _>` was copied out of it in pieces that the next load
    // read back across two stores, a failed store-forward of ~5 ns on every
    // `packjit_program_run` (perf, issue 43).
    let status = catch_unwind(AssertUnwindSafe(|| match f() {
        Ok(()) => {
            set_last_ok();
            PJ_OK
        }
        Err(e) => fail(e),
    }));
    match status {
        Ok(code) => code,
        Err(p) => panicked(what, p),
    }
}

/// [`boundary_run`] for a body that settles its status itself (a run path whose common
/// case must not build a `Result`: see `packjit_program_run`).
#[inline(always)]
pub(super) fn boundary_status(what: &str, f: impl FnOnce() -> i32) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(p) => panicked(what, p),
    }
}

/// The status of a body's result, recorded as [`boundary_run`] records it (for a body
/// inside [`boundary_status`]).
#[inline]
pub(super) fn settle(r: Result<(), Failure>) -> i32 {
    match r {
        Ok(()) => succeeded(),
        Err(e) => fail(e),
    }
}

/// `PJ_OK`, with the last error cleared.
#[inline]
pub(super) fn succeeded() -> i32 {
    set_last_ok();
    PJ_OK
}

/// Records a run that stopped and gives its status; out of line, as [`fail`].
#[cold]
#[inline(never)]
pub(super) fn run_failed(e: RunError) -> i32 {
    record(&Failure::Run(e))
}

/// Records a failure and gives its status; out of line, so that the failure's construction,
/// message and drop stay out of the success path every run takes.
#[cold]
#[inline(never)]
fn fail(e: Failure) -> i32 {
    record(&e)
}

/// Records a panic caught at the boundary.
#[cold]
#[inline(never)]
fn panicked(what: &str, p: Box<dyn std::any::Any + Send>) -> i32 {
    set_last(
        PJ_ERR_PANIC,
        -1,
        &format!(
            "{what}: panic caught at the C boundary: {}",
            panic_message(&*p)
        ),
    );
    PJ_ERR_PANIC
}

/// What a map operation (the functions that return a negative errno) fails with: a bad C
/// argument (`-EINVAL`) or the map's own error (its errno).
pub(super) enum MapFailure {
    Arg(Error),
    Map(MapError),
}

impl From<Error> for MapFailure {
    fn from(e: Error) -> Self {
        MapFailure::Arg(e)
    }
}

impl From<MapError> for MapFailure {
    fn from(e: MapError) -> Self {
        MapFailure::Map(e)
    }
}

/// Linux errno values the map functions return negated (the same on every Linux arch).
pub(super) mod errno {
    pub const EFAULT: i64 = 14;
    pub const EBUSY: i64 = 16;
    pub const EINVAL: i64 = 22;
}

/// [`boundary`] for the map operations, which return a count (>= 0) or a negative errno as
/// the kernel's `bpf(2)` and libbpf do. A bad argument gives `-EINVAL` (last error
/// `PJ_ERR_INVALID_ARGUMENT`, or `PJ_ERR_ABI`), a map error its errno (last error
/// `PJ_ERR_UNSUPPORTED` for `ENOTSUPP`, else `PJ_ERR_INVALID_ARGUMENT`), a panic `-EFAULT`
/// (last error `PJ_ERR_PANIC`).
pub(super) fn boundary_errno(what: &str, f: impl FnOnce() -> Result<i64, MapFailure>) -> i64 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => {
            set_last_ok();
            n
        }
        Ok(Err(MapFailure::Arg(e))) => {
            record(&Failure::Error(e));
            -errno::EINVAL
        }
        Ok(Err(MapFailure::Map(e))) => {
            let code = if e.errno() == super::PACKJIT_ENOTSUPP {
                PJ_ERR_UNSUPPORTED
            } else {
                PJ_ERR_INVALID_ARGUMENT
            };
            set_last(code, -1, &format!("{what}: {e}"));
            -i64::from(e.errno())
        }
        Err(p) => {
            set_last(
                PJ_ERR_PANIC,
                -1,
                &format!(
                    "{what}: panic caught at the C boundary: {}",
                    panic_message(&*p)
                ),
            );
            -errno::EFAULT
        }
    }
}

/// A short description of a status code ("ok", "invalid argument", ...). Returns a static
/// NUL-terminated string owned by the library (never NULL, never freed); unknown codes give
/// "unknown status code".
#[no_mangle]
pub extern "C" fn packjit_status_str(code: i32) -> *const c_char {
    let s: &'static CStr = match code {
        PJ_OK => c"ok",
        PJ_ERR_INVALID_ARGUMENT => c"invalid argument",
        PJ_ERR_VERIFY => c"bytecode rejected by the verifier",
        PJ_ERR_UNSUPPORTED => c"unsupported by the backend",
        PJ_ERR_UNKNOWN_HELPER => c"unknown helper",
        PJ_ERR_ENCODING => c"cannot be encoded for the target",
        PJ_ERR_ARENA => c"code arena exhausted",
        PJ_ERR_ABI => c"ABI mismatch",
        PJ_ERR_PANIC => c"panic caught at the boundary",
        PJ_ERR_PLUGIN => c"plugin could not be loaded",
        PJ_ERR_NOT_EXECUTABLE => c"program cannot run here",
        PJ_ERR_INTERNAL => c"internal error",
        PJ_ERR_OUT_OF_BOUNDS => c"memory access out of bounds",
        PJ_ERR_BUDGET => c"instruction budget exhausted",
        PJ_ERR_UNKNOWN_CALLX => c"callx to an unregistered helper id",
        _ => c"unknown status code",
    };
    s.as_ptr()
}

/// The message of the last failed packjit call on the calling thread ("" after a successful
/// call), e.g. "pc 3: unknown helper id 9". Never NULL.
///
/// Ownership: the buffer belongs to the library and to the calling thread; it stays
/// allocated for the thread's life, but its contents are overwritten by the next packjit
/// call on that thread, so copy it if you need it later. Do not free it.
#[no_mangle]
pub extern "C" fn packjit_last_error() -> *const c_char {
    LAST_ERROR
        // SAFETY: only the field's address is taken; the thread-local outlives the thread's
        // use of the pointer.
        .try_with(|l| unsafe { core::ptr::addr_of!((*l.as_ptr()).msg) }.cast::<c_char>())
        .unwrap_or(c"thread is exiting".as_ptr())
}

/// The status code of the last packjit call on the calling thread (`PJ_OK` after a success).
#[no_mangle]
pub extern "C" fn packjit_last_error_code() -> i32 {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map_or(PJ_ERR_INTERNAL, |l| l.code))
        .unwrap_or(PJ_ERR_INTERNAL)
}

/// The eBPF instruction index (in 8-byte slots) the last error on the calling thread is
/// about, or -1 when it is not about one instruction.
#[no_mangle]
pub extern "C" fn packjit_last_error_pc() -> i64 {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map_or(-1, |l| l.pc))
        .unwrap_or(-1)
}

/// The address of the access refused by the last `PJ_ERR_OUT_OF_BOUNDS` on the calling
/// thread (0 for other errors).
#[no_mangle]
pub extern "C" fn packjit_last_error_addr() -> u64 {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map_or(0, |l| l.addr))
        .unwrap_or(0)
}

/// Test-only: a C API entry whose body panics, to prove the boundary turns a panic into
/// `PJ_ERR_PANIC` instead of unwinding into C (every exported function runs its body through
/// the same `boundary`). Compiled only into the crate's own tests, never into the library.
#[cfg(test)]
#[no_mangle]
pub extern "C" fn packjit_test_panic_inside() -> i32 {
    boundary("packjit_test_panic_inside", || {
        let v: Vec<u8> = Vec::new();
        // A real out-of-bounds index, the kind of bug the boundary exists for.
        let i = v.len() + 3;
        let _ = v[i];
        Ok(())
    })
}
