//! Hooks (attach points) and batches of attach / detach operations.

use super::args::{arg, bytes, null_ctx, out_arg};
use super::error::{boundary, boundary_status, invalid, settle};
use super::options::{load_options, PackjitLoadOptions};
use super::program::{plain_run_args, program, run_common, PackjitProgram};
use super::runtime::{runtime, PackjitRuntime};
use super::DEAD_MAGIC;
use core::ffi::c_void;
use crossbeam_epoch as epoch;
use packjit_runtime::{Error, ErrorKind, Runtime, Trust};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const HOOK_MAGIC: u64 = 0x706a_5f68_6f6f_6b31; // "pj_hook1"
const BATCH_MAGIC: u64 = 0x706a_5f62_6174_6331; // "pj_batc1"

/// An opaque attach point: `packjit_hook_run` runs whatever program is attached at that
/// moment. Thread-safe: any number of threads may run it while another attaches or detaches
/// (alone or in a batch); replaced programs are freed once no running thread can be in them.
pub struct PackjitHook {
    magic: AtomicU64,
    hook: packjit_runtime::Hook,
    // Keeps the backends and helpers attached code refers to alive.
    rt: Arc<Runtime>,
}

/// An opaque batch of attach/detach operations, applied by `packjit_hook_batch_apply` with
/// one code commit and one grace period for everything it replaces. Not thread-safe: one
/// thread builds and applies it.
pub struct PackjitHookBatch {
    magic: AtomicU64,
    // The hooks are borrowed from the caller, who keeps them alive until apply or discard
    // (the documented contract of every batch function); hence the 'static.
    batch: packjit_runtime::HookBatch<'static>,
}

/// # Safety
/// As `runtime`, for hooks.
#[inline]
unsafe fn hook<'a>(p: *const PackjitHook) -> Result<&'a PackjitHook, Error> {
    // SAFETY: forwarded.
    let h = unsafe { arg(p, "hook") }?;
    match h.magic.load(Ordering::Acquire) {
        HOOK_MAGIC => Ok(h),
        m => Err(bad_hook(m)),
    }
}

/// Why a handle with the wrong magic is refused (out of line: runs check every handle).
#[cold]
#[inline(never)]
fn bad_hook(magic: u64) -> Error {
    if magic == DEAD_MAGIC {
        invalid("hook was already destroyed")
    } else {
        invalid("hook is not a PackjitHook handle")
    }
}

/// # Safety
/// `p` NULL or a live batch.
unsafe fn batch<'a>(p: *mut PackjitHookBatch) -> Result<&'a mut PackjitHookBatch, Error> {
    // SAFETY: forwarded.
    let b = unsafe { out_arg(p, "batch") }?;
    match b.magic.load(Ordering::Acquire) {
        BATCH_MAGIC => Ok(b),
        _ => Err(invalid("batch is not a live PackjitHookBatch handle")),
    }
}

/// Creates an empty hook whose programs come from `rt`.
///
/// # Safety
/// `rt` NULL or live; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_create(
    rt: *const PackjitRuntime,
    out: *mut *mut PackjitHook,
) -> i32 {
    boundary("packjit_hook_create", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        *out = Box::into_raw(Box::new(PackjitHook {
            magic: AtomicU64::new(HOOK_MAGIC),
            hook: packjit_runtime::Hook::new(),
            rt: h.rt.clone(),
        }));
        Ok(())
    })
}

/// Detaches the hook's program (freed after the grace period) and destroys the hook. NULL is
/// ignored. Threads still inside `packjit_hook_run` finish safely; starting a run after this
/// call is a caller bug.
///
/// # Safety
/// `hook` NULL or a handle from `packjit_hook_create`, not in any unapplied batch.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_destroy(hook_: *mut PackjitHook) {
    if hook_.is_null() {
        return;
    }
    boundary("packjit_hook_destroy", || {
        // SAFETY: caller contract.
        let h = unsafe { hook(hook_) }?;
        if h.magic.swap(DEAD_MAGIC, Ordering::AcqRel) != HOOK_MAGIC {
            return Err(invalid("hook was already destroyed"));
        }
        h.hook.detach();
        struct Handle(*mut PackjitHook);
        // SAFETY: PackjitHook is Send; the pointer only carries it to the deferred drop.
        unsafe impl Send for Handle {}
        let handle = Handle(hook_);
        let guard = epoch::pin();
        guard.defer(move || {
            let h = handle;
            // Then the runs in progress (packjit_hook_run holds a run pin, not the epoch).
            packjit_runtime::run_pin::defer(Box::new(move || {
                let h = h;
                // SAFETY: from Box::into_raw; the magic swap made this the only destroy, and
                // runners pinned before it (epoch or run pin) have left by the time this runs.
                drop(unsafe { Box::from_raw(h.0) });
            }));
        });
        guard.flush();
        Ok(())
    });
}

/// Runs the hook's program on `ctx` (as `packjit_program_run`); `*r0` receives r0. Returns
/// `PJ_ERR_NOT_EXECUTABLE` when nothing is attached, and the program's own error (e.g.
/// `PJ_ERR_OUT_OF_BOUNDS`) when it stops on one.
///
/// # Safety
/// `hook` NULL or live; `ctx`/`ctx_len` as for `packjit_program_run`; `r0` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_run(
    hook_: *const PackjitHook,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
) -> i32 {
    boundary_status("packjit_hook_run", || {
        // The common case with no call on its way but the program's, as in
        // packjit_program_run; anything else takes `run_checked`.
        if plain_run_args(hook_.cast(), ctx, ctx_len, r0) {
            if let Some(pin) = packjit_runtime::run_pin::try_enter() {
                // SAFETY: non-null and aligned; a live hook by the caller's contract, and kept
                // so by the pin taken before this read.
                let h = unsafe { &*hook_ };
                if h.magic.load(Ordering::Acquire) == HOOK_MAGIC {
                    if let Some(prog) = h.hook.attached_pinned(&pin) {
                        // SAFETY: caller contract on ctx and r0; the program is held by the
                        // pin taken before the handle was read.
                        if let Some(status) = unsafe { run_common(prog, ctx, ctx_len, r0, &pin) } {
                            return status;
                        }
                    }
                }
            }
        }
        // SAFETY: forwarded.
        unsafe { run_checked(hook_, ctx, ctx_len, r0) }
    })
}

/// `packjit_hook_run` with every argument checked and each failure named.
///
/// # Safety
/// As `packjit_hook_run`.
#[inline(never)]
unsafe fn run_checked(
    hook_: *const PackjitHook,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
) -> i32 {
    settle((|| {
        // A run pin, as in packjit_program_run: the handle's deferred drop waits for it.
        let pin = packjit_runtime::run_pin::enter();
        // SAFETY: caller contract.
        let h = unsafe { hook(hook_) }?;
        // SAFETY: caller contract.
        let r0 = unsafe { out_arg(r0, "r0") }?;
        if ctx.is_null() && ctx_len != 0 {
            return Err(null_ctx(ctx_len).into());
        }
        let prog = h.hook.attached_pinned(&pin).ok_or_else(nothing_attached)?;
        // The program's own `Result`, as packjit_program_run gets it: `Hook::run_pinned`'s
        // `Option<Result<..>>` failed a store-forward on every run (perf, issue 43).
        // SAFETY: caller contract on ctx; the program is held by the pin taken before the
        // handle was read.
        *r0 = unsafe { prog.call_raw_pinned(ctx.cast(), ctx_len, &pin) }?;
        Ok(())
    })())
}

/// The error for a run of an empty hook (out of line, as `bad_hook`).
#[cold]
#[inline(never)]
fn nothing_attached() -> Error {
    Error::new(
        ErrorKind::NotExecutable,
        "no program is attached to the hook",
    )
}

/// Creates an empty batch.
///
/// # Safety
/// `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_batch_create(out: *mut *mut PackjitHookBatch) -> i32 {
    boundary("packjit_hook_batch_create", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = Box::into_raw(Box::new(PackjitHookBatch {
            magic: AtomicU64::new(BATCH_MAGIC),
            batch: packjit_runtime::HookBatch::new(),
        }));
        Ok(())
    })
}

/// Queues attaching `prog` to `hook` and TAKES OVER the program handle: on success and on
/// failure alike (unless an argument is invalid) `prog` is consumed and must not be used or
/// freed again; it may not be in use by other threads at the time of the call. A program in
/// a prog-array slot (`packjit_prog_array_set`) is refused (`PJ_ERR_INVALID_ARGUMENT`,
/// handle kept): a hook owns its program alone. Fails with
/// `PJ_ERR_NOT_EXECUTABLE` for a program that cannot run here and `PJ_ERR_INVALID_ARGUMENT`
/// for a program from another runtime than the hook's.
///
/// # Safety
/// `batch` NULL or live; `hook` NULL or live until the batch is applied or discarded; `prog`
/// NULL or a live program handle nobody else is using.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_batch_attach(
    batch_: *mut PackjitHookBatch,
    hook_: *const PackjitHook,
    prog: *mut PackjitProgram,
) -> i32 {
    boundary("packjit_hook_batch_attach", || {
        // SAFETY: caller contract.
        let b = unsafe { batch(batch_) }?;
        // SAFETY: caller contract.
        let h: &'static PackjitHook = unsafe { hook(hook_) }?;
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        if !Arc::ptr_eq(&p._rt, &h.rt) {
            return Err(invalid("program and hook belong to different runtimes"));
        }
        if Arc::strong_count(&p.prog) != 1 {
            return Err(invalid(
                "program is in a prog array (or was emptied from one less than a grace period ago): a hook cannot take it over",
            ));
        }
        if p.freed.swap(true, Ordering::AcqRel) {
            return Err(invalid("program was already freed"));
        }
        p.magic.store(DEAD_MAGIC, Ordering::Release);
        // SAFETY: from Box::into_raw; the `freed` swap made this the only owner, and the
        // caller guarantees no other thread uses the handle.
        let owned = unsafe { Box::from_raw(prog) };
        // The count was 1 and only the handle (now ours) could have cloned it.
        let prog = Arc::try_unwrap(owned.prog)
            .map_err(|_| Error::new(ErrorKind::Internal, "program was shared after the check"))?;
        b.batch.attach(&h.hook, prog)?;
        Ok(())
    })
}

/// Compiles `code` with the hook's runtime WITHOUT committing it and queues attaching it to
/// `hook`; `packjit_hook_batch_apply` commits all such code at once.
///
/// # Safety
/// `batch` NULL or live; `hook` NULL or live until the batch is applied or discarded; `code`
/// and `opts` as for `packjit_program_load`.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_batch_load_attach(
    batch_: *mut PackjitHookBatch,
    hook_: *const PackjitHook,
    code: *const u8,
    code_len: usize,
    opts: *const PackjitLoadOptions,
) -> i32 {
    boundary("packjit_hook_batch_load_attach", || {
        // SAFETY: caller contract.
        let b = unsafe { batch(batch_) }?;
        // SAFETY: caller contract.
        let h: &'static PackjitHook = unsafe { hook(hook_) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        // SAFETY: caller contract.
        let code = unsafe { bytes(code, code_len, "code") }?;
        match trust {
            Trust::Sandboxed => b.batch.load_attach(&h.rt, &h.hook, code, &opts)?,
            // SAFETY: the caller asked for trusted code in `opts`, the same promise as
            // packjit_program_load with that flag.
            Trust::Trusted => unsafe { b.batch.load_attach_trusted(&h.rt, &h.hook, code, &opts) }?,
        };
        Ok(())
    })
}

/// Queues detaching whatever `hook` holds when the batch is applied.
///
/// # Safety
/// `batch` NULL or live; `hook` NULL or live until the batch is applied or discarded.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_batch_detach(
    batch_: *mut PackjitHookBatch,
    hook_: *const PackjitHook,
) -> i32 {
    boundary("packjit_hook_batch_detach", || {
        // SAFETY: caller contract.
        let b = unsafe { batch(batch_) }?;
        // SAFETY: caller contract.
        let h: &'static PackjitHook = unsafe { hook(hook_) }?;
        b.batch.detach(&h.hook);
        Ok(())
    })
}

/// Applies and destroys the batch: one commit for the code it loaded, every swap, and one
/// grace period for all the programs it replaced or detached (`*replaced` receives their
/// count; `replaced` may be NULL).
///
/// # Safety
/// `batch` NULL or live (consumed); `replaced` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_batch_apply(
    batch_: *mut PackjitHookBatch,
    replaced: *mut u64,
) -> i32 {
    boundary("packjit_hook_batch_apply", || {
        // SAFETY: caller contract.
        unsafe { batch(batch_) }?;
        // SAFETY: checked live; from Box::into_raw; consumed here.
        let b = unsafe { Box::from_raw(batch_) };
        b.magic.store(DEAD_MAGIC, Ordering::Release);
        let n = b.batch.apply();
        if !replaced.is_null() {
            // SAFETY: caller contract.
            unsafe { *out_arg(replaced, "replaced")? = n as u64 };
        }
        Ok(())
    })
}

/// Destroys a batch without applying it (its loaded and taken-over programs are freed).
/// NULL is ignored.
///
/// # Safety
/// `batch` NULL or live (consumed).
#[no_mangle]
pub unsafe extern "C" fn packjit_hook_batch_discard(batch_: *mut PackjitHookBatch) {
    if batch_.is_null() {
        return;
    }
    boundary("packjit_hook_batch_discard", || {
        // SAFETY: caller contract.
        unsafe { batch(batch_) }?;
        // SAFETY: checked live; from Box::into_raw; consumed here.
        let b = unsafe { Box::from_raw(batch_) };
        b.magic.store(DEAD_MAGIC, Ordering::Release);
        Ok(())
    });
}
