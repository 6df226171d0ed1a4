//! Programs: load, batch load, run, free (deferred, RCU-style), epoch brackets, info,
//! native code and entry point.

use super::args::{arg, bytes, check_size, fill_name, null_ctx, out_arg};
use super::error::{boundary, boundary_status, invalid, run_failed, settle, succeeded};
use super::options::{load_options, PackjitLoadOptions};
use super::runtime::{runtime, PackjitRuntime, PENDING_HANDLES};
use super::{PjError, PjProgramEntry, DEAD_MAGIC, PACKJIT_NAME_LEN};
use core::ffi::{c_char, c_void};
use crossbeam_epoch as epoch;
use packjit_runtime::{Error, ErrorKind, Program, Runtime, Trust};
use std::cell::RefCell;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const PROGRAM_MAGIC: u64 = 0x706a_5f70_726f_6731; // "pj_prog1"

/// What a program is, filled by `packjit_program_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitProgramInfo {
    /// `sizeof(PackjitProgramInfo)`, set by the caller.
    pub struct_size: u32,
    /// `PJ_ARCH_*` code of the native code.
    pub arch: u32,
    /// 1 when `packjit_program_run` can run it in this process.
    pub executable: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Optional-feature bits the code uses.
    pub features: u64,
    /// Address of the entry point now (in the code arena for executable programs). For tools
    /// only: calling it directly bypasses the deferred-free protection unless the caller
    /// brackets reading it and the call with `packjit_epoch_enter` / `packjit_epoch_exit`.
    /// The arena's compaction may move the code later (the old copy stays valid until such a
    /// bracket ends); `packjit_program_entry` pins it for good.
    pub entry_addr: u64,
    /// Bytes of native code.
    pub code_size: u64,
    /// Native instructions emitted.
    pub native_insns: u64,
    /// NUL-terminated name of the backend that compiled it (truncated to fit).
    pub backend: [c_char; PACKJIT_NAME_LEN],
}

impl Default for PackjitProgramInfo {
    /// All zero with `struct_size` set: what `packjit_program_info` expects to be handed.
    fn default() -> Self {
        PackjitProgramInfo {
            struct_size: size_of::<PackjitProgramInfo>() as u32,
            arch: 0,
            executable: 0,
            reserved: 0,
            features: 0,
            entry_addr: 0,
            code_size: 0,
            native_insns: 0,
            backend: [0; PACKJIT_NAME_LEN],
        }
    }
}

/// An opaque compiled program. Thread-safe: any number of threads may run it at once, and
/// one may free it while others are running it.
pub struct PackjitProgram {
    pub(super) magic: AtomicU64,
    /// Set by the first `packjit_program_free`; the handle stays usable (RCU-style) until
    /// the deferred drop, so only a second free is refused.
    pub(super) freed: AtomicBool,
    /// Shared with the prog-array slots the program was put in (`packjit_prog_array_set`,
    /// `packjit_object_init_prog_arrays`): a slot keeps the program alive after the handle
    /// is freed.
    pub(super) prog: Arc<Program>,
    // Keeps the backends and helpers the code refers to alive even after
    // packjit_runtime_destroy.
    pub(super) _rt: Arc<Runtime>,
}

thread_local! {
    // Guards taken by packjit_epoch_enter, released by packjit_epoch_exit.
    static EPOCH_GUARDS: RefCell<Vec<epoch::Guard>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// As `runtime`, for programs.
// Inline: out of line, its `Result` came back through memory on every run (perf, issue 43).
#[inline]
pub(super) unsafe fn program<'a>(p: *const PackjitProgram) -> Result<&'a PackjitProgram, Error> {
    // SAFETY: forwarded.
    let prog = unsafe { arg(p, "program") }?;
    match prog.magic.load(Ordering::Acquire) {
        PROGRAM_MAGIC => Ok(prog),
        m => Err(bad_program(m)),
    }
}

/// Why a handle with the wrong magic is refused (out of line: runs check every handle).
#[cold]
#[inline(never)]
fn bad_program(magic: u64) -> Error {
    if magic == DEAD_MAGIC {
        invalid("program was already freed")
    } else {
        invalid("program is not a PackjitProgram handle")
    }
}

pub(super) fn new_program(rt: &Arc<Runtime>, prog: Program) -> *mut PackjitProgram {
    Box::into_raw(Box::new(PackjitProgram {
        magic: AtomicU64::new(PROGRAM_MAGIC),
        freed: AtomicBool::new(false),
        prog: Arc::new(prog),
        _rt: rt.clone(),
    }))
}

/// Verifies, compiles and commits one program. `code` holds `code_len` bytes of eBPF
/// (little-endian 8-byte instructions); it is only read during the call. `opts` may be NULL
/// for the defaults. On success `*out` receives a new program (owned by the caller, released
/// with `packjit_program_free`); on failure `*out` is NULL and the last error names the pc
/// and the reason (e.g. `PJ_ERR_VERIFY`, `PJ_ERR_UNKNOWN_HELPER`, `PJ_ERR_UNSUPPORTED`).
///
/// # Safety
/// `rt` NULL or live; `code` NULL or readable for `code_len` bytes; `opts` NULL or a
/// `PackjitLoadOptions` with `struct_size` set; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_load(
    rt: *const PackjitRuntime,
    code: *const u8,
    code_len: usize,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
) -> i32 {
    boundary("packjit_program_load", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        // SAFETY: caller contract.
        let code = unsafe { bytes(code, code_len, "code") }?;
        let prog = match trust {
            Trust::Sandboxed => h.rt.load(code, &opts)?,
            // SAFETY: PACKJIT_LOAD_TRUSTED is the C caller's promise that the program only
            // touches memory it may (see the flag's documentation).
            Trust::Trusted => unsafe { h.rt.load_trusted(code, &opts) }?,
        };
        *out = new_program(&h.rt, prog);
        Ok(())
    })
}

/// Compiles `count` programs and commits them together (one protection/remap pass and one
/// instruction-cache pass for the whole batch). Program `i` is `codes[i]`, `code_lens[i]`
/// bytes. Every `out[i]` is written: a new program (owned by the caller, released with
/// `packjit_program_free`) or NULL when that program failed. `errors` may be NULL; otherwise
/// `errors[i]` receives program `i`'s status, pc and message (`code == PJ_OK` on success).
/// Returns `PJ_OK` when all succeeded, else the first failure's status (the last error then
/// reads "program i: pc N: ..."); the successful programs are returned even then.
///
/// # Safety
/// `rt` NULL or live; `codes` and `code_lens` NULL or arrays of `count` entries, each
/// `codes[i]` readable for `code_lens[i]` bytes (read during the call only); `opts` as for
/// `packjit_program_load`; `out` NULL or writable for `count` pointers; `errors` NULL or
/// writable for `count` `PjError`s.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_load_batch(
    rt: *const PackjitRuntime,
    codes: *const *const u8,
    code_lens: *const usize,
    count: usize,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
    errors: *mut PjError,
) -> i32 {
    boundary("packjit_program_load_batch", || {
        if count == 0 {
            // SAFETY: caller contract.
            unsafe { runtime(rt) }?;
            return Ok(());
        }
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        if count > (isize::MAX as usize) / size_of::<PjError>() {
            return Err(invalid(format!("count {count} is too large")));
        }
        // SAFETY: caller contract: `count` writable slots.
        let out = unsafe { std::slice::from_raw_parts_mut(out, count) };
        out.fill(core::ptr::null_mut());
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        if codes.is_null() || code_lens.is_null() {
            return Err(invalid("codes or code_lens is NULL"));
        }
        // SAFETY: caller contract.
        let (ptrs, lens) = unsafe {
            (
                std::slice::from_raw_parts(codes, count),
                std::slice::from_raw_parts(code_lens, count),
            )
        };
        let mut slices = Vec::with_capacity(count);
        for (i, (&p, &l)) in ptrs.iter().zip(lens).enumerate() {
            // SAFETY: caller contract.
            slices.push(unsafe { bytes(p, l, &format!("codes[{i}]")) }?);
        }
        let results = match trust {
            Trust::Sandboxed => h.rt.load_batch(&slices, &opts),
            // SAFETY: as in packjit_program_load.
            Trust::Trusted => unsafe { h.rt.load_batch_trusted(&slices, &opts) },
        };
        let mut first: Option<Error> = None;
        for (i, r) in results.into_iter().enumerate() {
            let err = match r {
                Ok(prog) => {
                    out[i] = new_program(&h.rt, prog);
                    PjError::default()
                }
                Err(e) => {
                    let c = e.to_c();
                    if first.is_none() {
                        // The per-program pc is in errors[i]; the summary names both.
                        first = Some(Error::new(e.kind, format!("program {i}: {e}")));
                    }
                    c
                }
            };
            if !errors.is_null() {
                // SAFETY: caller contract: `count` writable entries.
                unsafe { errors.add(i).write(err) };
            }
        }
        first.map_or(Ok(()), Err)
    })
}

/// Runs a program with `ctx` as its context (r1 = ctx, r2 = ctx_len); `*r0` receives the
/// result. `ctx` may be NULL only with `ctx_len` 0. Fails with `PJ_ERR_NOT_EXECUTABLE` for a
/// program compiled for another architecture. A program that stops fails the call with
/// `PJ_ERR_OUT_OF_BOUNDS`, `PJ_ERR_BUDGET` or `PJ_ERR_UNKNOWN_CALLX`; the last error then
/// names the eBPF pc (`packjit_last_error_pc`) and, for memory, the address
/// (`packjit_last_error_addr`), the size and read/write. Safe to call from many threads at once, and
/// while another thread frees the program: the code and the handle stay valid until every
/// call that had started has returned.
///
/// # Safety
/// `prog` NULL or a live program. `ctx`/`ctx_len` must describe memory the program may read
/// and write (borrowed for the call); the program dereferences the addresses it computes,
/// unchecked unless the program is sandboxed (the default). `r0` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_run(
    prog: *const PackjitProgram,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
) -> i32 {
    boundary_status("packjit_program_run", || {
        // The common case first, with no call on its way but the program's: a run's cost
        // over its raw entry is its stores, and every call on the way (a thread's first
        // pin, an error's construction) made the compiler save registers around it (issue
        // 43). Anything else takes `run_checked`, which repeats every test and names what
        // failed.
        if plain_run_args(prog.cast(), ctx, ctx_len, r0) {
            if let Some(pin) = packjit_runtime::run_pin::try_enter() {
                // SAFETY: non-null and aligned; a live program by the caller's contract, and
                // kept so by the pin taken before this read (free defers the drop).
                let p = unsafe { &*prog };
                if p.magic.load(Ordering::Acquire) == PROGRAM_MAGIC {
                    // SAFETY: caller contract on ctx and r0; the run is pinned since before
                    // the handle was read.
                    if let Some(status) = unsafe { run_common(&p.prog, ctx, ctx_len, r0, &pin) } {
                        return status;
                    }
                }
            }
        }
        // SAFETY: forwarded.
        unsafe { run_checked(prog, ctx, ctx_len, r0) }
    })
}

/// The common case of both run functions (this one and `packjit_hook_run`): the program's
/// own code as the thread's only run, its status settled in place; `None`, having run
/// nothing, otherwise.
///
/// # Safety
/// `ctx`/`ctx_len` as for `packjit_program_run`; `r0` non-null, aligned and writable; `pin`
/// taken before the handle that led to `prog` was read.
#[inline(always)]
pub(super) unsafe fn run_common(
    prog: &Program,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
    pin: &packjit_runtime::run_pin::RunPin,
) -> Option<i32> {
    // SAFETY: forwarded.
    match unsafe { prog.call_raw_outermost(ctx.cast(), ctx_len, pin) }? {
        Ok(v) => {
            // SAFETY: non-null and aligned, writable by the caller's contract.
            unsafe { *r0 = v };
            Some(succeeded())
        }
        Err(e) => Some(run_failed(e)),
    }
}

/// Arguments a run may take without a closer look: both pointers non-null and aligned, and
/// a context pointer wherever there is a context. (`run_checked` names what is wrong.)
#[inline(always)]
pub(super) fn plain_run_args(
    handle: *const u64,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
) -> bool {
    !handle.is_null()
        && handle.is_aligned()
        && !r0.is_null()
        && r0.is_aligned()
        && (!ctx.is_null() || ctx_len == 0)
}

/// `packjit_program_run` with every argument checked and each failure named.
///
/// # Safety
/// As `packjit_program_run`.
#[inline(never)]
unsafe fn run_checked(
    prog: *const PackjitProgram,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
) -> i32 {
    settle((|| {
        // Pin before touching the handle: a concurrent packjit_program_free defers dropping
        // it (and its code) until this run pin is gone (see the deferred drop there). A run
        // pin, not the epoch: two plain stores instead of a fenced read-modify-write.
        let pin = packjit_runtime::run_pin::enter();
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        // SAFETY: caller contract.
        let r0 = unsafe { out_arg(r0, "r0") }?;
        if ctx.is_null() && ctx_len != 0 {
            return Err(null_ctx(ctx_len).into());
        }
        // SAFETY: caller contract on ctx; the run is pinned since before the handle was read.
        *r0 = unsafe { p.prog.call_raw_pinned(ctx.cast(), ctx_len, &pin) }?;
        Ok(())
    })())
}

/// Frees a program. NULL is ignored. Safe while other threads use it, RCU-style: the handle
/// and the code stay valid until every thread that was inside `packjit_program_run` (or
/// inside `packjit_epoch_enter`/`packjit_epoch_exit`) when free was called has left, and
/// are released after that. So a host can unpublish the pointer, free it at once, and
/// readers that fetched it inside `packjit_epoch_enter`/`_exit` may still run it. A thread
/// that starts using the handle after free without such a bracket is a caller bug. A second
/// free of the same handle is refused (recorded as the last error, otherwise ignored) as
/// long as the handle has not been reclaimed yet.
///
/// # Safety
/// `prog` NULL or a handle from `packjit_program_load`/`_batch`.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_free(prog: *mut PackjitProgram) {
    if prog.is_null() {
        return;
    }
    boundary("packjit_program_free", || {
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        if p.freed.swap(true, Ordering::AcqRel) {
            return Err(invalid("program was already freed"));
        }
        struct Handle(*mut PackjitProgram);
        // SAFETY: PackjitProgram is Send (Program and Arc<Runtime> are); the raw pointer
        // only carries it to whichever thread runs the deferred drop.
        unsafe impl Send for Handle {}
        let handle = Handle(prog);
        let rt = p._rt.clone();
        PENDING_HANDLES.fetch_add(1, Ordering::AcqRel);
        let guard = epoch::pin();
        // Two waits: the epoch's grace period (for threads inside `packjit_epoch_enter`
        // brackets), then the end of the runs in progress after it (`packjit_program_run`
        // holds a run pin, not the epoch; see `run_pin`).
        guard.defer(move || {
            let h = handle;
            packjit_runtime::run_pin::defer(Box::new(move || {
                let h = h;
                // SAFETY: from Box::into_raw; the `freed` swap made this the only free, and
                // the epoch and the run pins guarantee no runner still holds it.
                unsafe { drop_handle(h.0) }
            }));
        });
        guard.flush();
        drop(guard);
        // What this flush ended (earlier frees' handles and code): released here, with the
        // compaction step their holes call for, not left to the next load.
        if let Some(a) = rt.arena() {
            a.release_due();
        } else {
            packjit_runtime::run_pin::collect();
        }
        Ok(())
    });
}

/// The deferred end of `packjit_program_free`.
///
/// # Safety
/// `prog` came from `Box::into_raw` in `new_program`, is dropped only here, and no thread can
/// still be using it.
unsafe fn drop_handle(prog: *mut PackjitProgram) {
    // SAFETY: caller contract.
    let b = unsafe { Box::from_raw(prog) };
    // A stale pointer used after this point (a caller bug) is then refused as long
    // as the allocator leaves the word alone.
    b.magic.store(DEAD_MAGIC, Ordering::Release);
    let PackjitProgram { prog, _rt, .. } = *b;
    match Arc::try_unwrap(prog) {
        // SAFETY: runners pin before touching the handle and run its program only
        // through it (or inside an epoch bracket), so the grace period that just
        // ended covers the code too. Only queued here: this may run inside any
        // thread's pin.
        Ok(prog) => unsafe { prog.drop_after_own_grace() },
        // A prog-array slot still holds it: the last owner's drop releases the code
        // after a grace period of its own (tail calls reach it without the handle).
        Err(shared) => drop(shared),
    }
    drop(_rt);
    PENDING_HANDLES.fetch_sub(1, Ordering::AcqRel);
}

/// Pins the calling thread's epoch: programs freed from now on (code and handles) stay
/// valid until the matching `packjit_epoch_exit` on this thread. Nestable. Use it to
/// bracket "load the published program pointer, then run it" so that a concurrent
/// `packjit_program_free` cannot slip in between, or to call `entry_addr` directly.
#[no_mangle]
pub extern "C" fn packjit_epoch_enter() {
    let _ = catch_unwind(|| {
        let _ = EPOCH_GUARDS.try_with(|g| g.borrow_mut().push(epoch::pin()));
    });
}

/// Ends the innermost `packjit_epoch_enter` of the calling thread. Without one it does
/// nothing but record `PJ_ERR_INVALID_ARGUMENT` as the last error.
#[no_mangle]
pub extern "C" fn packjit_epoch_exit() {
    boundary("packjit_epoch_exit", || {
        let popped = EPOCH_GUARDS
            .try_with(|g| g.borrow_mut().pop())
            .ok()
            .flatten();
        popped
            .map(drop)
            .ok_or_else(|| invalid("packjit_epoch_exit without packjit_epoch_enter"))
    });
}

/// Describes a program.
///
/// # Safety
/// `prog` NULL or live; `info` NULL or a `PackjitProgramInfo` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_info(
    prog: *const PackjitProgram,
    info: *mut PackjitProgramInfo,
) -> i32 {
    boundary("packjit_program_info", || {
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        // SAFETY: caller contract.
        unsafe { check_size(info, "info") }?;
        let mut o = PackjitProgramInfo {
            struct_size: size_of::<PackjitProgramInfo>() as u32,
            arch: p.arch().code(),
            executable: p.is_executable() as u32,
            reserved: 0,
            features: p.features(),
            entry_addr: p.entry_addr(),
            code_size: p.code_size() as u64,
            native_insns: p.native_insns() as u64,
            backend: [0; PACKJIT_NAME_LEN],
        };
        fill_name(&mut o.backend, p.backend_name());
        // SAFETY: checked.
        unsafe { *info = o };
        Ok(())
    })
}

/// Copies a program's native code into a caller buffer (for disassemblers and tools).
/// `*size` always receives the code size. With `buf` NULL (or `buf_len` 0) nothing is
/// copied and the call succeeds: use it to query the size first. With a buffer smaller than
/// the code nothing is copied and `PJ_ERR_INVALID_ARGUMENT` is returned.
///
/// # Safety
/// `prog` NULL or live; `buf` NULL or writable for `buf_len` bytes (borrowed for the call);
/// `size` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_code(
    prog: *const PackjitProgram,
    buf: *mut u8,
    buf_len: usize,
    size: *mut usize,
) -> i32 {
    boundary("packjit_program_code", || {
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        // SAFETY: caller contract.
        let size = unsafe { out_arg(size, "size") }?;
        let n = p.code_size();
        *size = n;
        if buf.is_null() || buf_len == 0 {
            return Ok(());
        }
        if buf_len < n {
            return Err(invalid(format!(
                "buffer of {buf_len} bytes is too small for {n} bytes of code"
            )));
        }
        let code = p.code();
        if code.len() != n {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "code of {n} bytes could not be read back ({} read)",
                    code.len()
                ),
            ));
        }
        // SAFETY: caller contract; n <= buf_len.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), buf, n) };
        Ok(())
    })
}

/// Stores the program's entry point (`PjProgramEntry`: `uint64_t (*)(uint8_t *ctx, uint64_t
/// ctx_len, PjExecEnv *env)`) in `*entry`, for hosts that dispatch themselves. `env` must
/// point to a `PjExecEnv` for this call: `ctx_start`/`ctx_end` bracketing the context and
/// `ctx_len` their difference (0 is safe, only slower: see `PjExecEnv::ctx_len`),
/// `budget` (code loaded with a budget counts it down), `regions`/`region_count` the host
/// regions the program may touch besides its context and stack (the runtime's and the
/// load's), the stop fields zero. After the call, `stop_kind != PJ_STOP_NONE` means the
/// program stopped at `stop_pc` (r0 is then meaningless). Helpers that check pointer
/// arguments (`packjit_helper_access_ok`, the map helpers) see only runs started by
/// `packjit_program_run`, so prefer it unless the dispatch cost matters. Fails with
/// `PJ_ERR_NOT_EXECUTABLE` (and stores NULL) when the program cannot run here. The pointer
/// is valid while the program lives (taking it pins the code: compaction never moves it);
/// a caller racing with `packjit_program_free` must hold `packjit_epoch_enter` around
/// fetching and calling it.
///
/// # Safety
/// `prog` NULL or live; `entry` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_entry(
    prog: *const PackjitProgram,
    entry: *mut PjProgramEntry,
) -> i32 {
    boundary("packjit_program_entry", || {
        // `Option<fn>` has the layout of a nullable C function pointer, so NULL can be
        // stored. SAFETY: caller contract.
        let entry = unsafe { out_arg(entry.cast::<Option<PjProgramEntry>>(), "entry") }?;
        *entry = None;
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        *entry = Some(p.entry().ok_or_else(|| {
            Error::new(
                ErrorKind::NotExecutable,
                format!("program was compiled for {}, not for this host", p.arch()),
            )
        })?);
        Ok(())
    })
}
