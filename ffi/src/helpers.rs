//! Host helpers: registration, and the access check helpers written in C call.

use super::error::{boundary, invalid};
use super::runtime::{runtime, PackjitRuntime};
use core::ffi::{c_char, CStr};
use packjit_runtime::{helper_access_ok, AccessDirection};
use std::panic::catch_unwind;

/// Signature of a helper: BPF r1-r5 in, r0 out. Same as `PjHelperFn`; spelled out so the
/// parameter can be NULL-checked (`Option`) and still be emitted as a plain C function
/// pointer.
type HelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;

/// Registers helper `id` (the immediate of `call id` instructions): `fn` receives BPF r1-r5
/// and returns r0. Ids are unique per runtime (re-registering fails with
/// `PJ_ERR_INVALID_ARGUMENT`). Only programs loaded afterwards can call it.
///
/// # Safety
/// `rt` NULL or live. `name` NULL or NUL-terminated (copied; used in diagnostics). `fn` must
/// be NULL (refused) or a function that stays valid while any program using it lives and is
/// safe to call from any thread that runs those programs.
#[no_mangle]
pub unsafe extern "C" fn packjit_register_helper(
    rt: *const PackjitRuntime,
    id: u32,
    name: *const c_char,
    r#fn: Option<unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64>,
) -> i32 {
    boundary("packjit_register_helper", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if name.is_null() {
            return Err(invalid(format!("helper {id}: name is NULL")));
        }
        // SAFETY: NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let f = r#fn.ok_or_else(|| invalid(format!("helper {id} ({name}): fn is NULL")))?;
        h.rt.register_helper(id, &name, f as HelperFn)
    })
}

/// For helpers written in C: may the program running on the calling thread access
/// `[addr, addr + len)` (`write` non-zero for a write)? The same rule as the program's own
/// checks: its context, its stack, and the regions it was given. 0 when no program runs on
/// this thread. A helper that dereferences a pointer argument calls this first, so a
/// sandboxed program cannot use the helper to reach memory it could not reach itself.
#[no_mangle]
pub extern "C" fn packjit_helper_access_ok(addr: u64, len: u64, write: i32) -> i32 {
    let direction = if write != 0 {
        AccessDirection::Write
    } else {
        AccessDirection::Read
    };
    catch_unwind(|| helper_access_ok(addr, len, direction) as i32).unwrap_or(0)
}
