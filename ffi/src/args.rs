//! Checks of the C arguments: pointers, versioned struct sizes, strings, byte ranges; and
//! the fixed-size name fields of the output structs.

use super::error::invalid;
use core::ffi::{c_char, CStr};
use packjit_runtime::{Error, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The error for a NULL argument: out of line, so the checks every run makes stay a test
/// and a branch.
#[cold]
#[inline(never)]
fn null_arg(what: &str) -> Error {
    invalid(format!("{what} is NULL"))
}

/// The error for a misaligned argument (out of line, as [`null_arg`]).
#[cold]
#[inline(never)]
fn misaligned_arg(what: &str) -> Error {
    invalid(format!("{what} is misaligned"))
}

/// The error for a run given a NULL context with a length (out of line, as [`null_arg`]).
#[cold]
#[inline(never)]
pub(super) fn null_ctx(len: usize) -> Error {
    invalid(format!("ctx is NULL but ctx_len is {len}"))
}

/// Checks a caller-provided pointer.
///
/// # Safety
/// `p` must be NULL or valid for reads of `T` for `'a`.
#[inline]
pub(super) unsafe fn arg<'a, T>(p: *const T, what: &str) -> Result<&'a T, Error> {
    if p.is_null() {
        return Err(null_arg(what));
    }
    if !p.is_aligned() {
        return Err(misaligned_arg(what));
    }
    // SAFETY: non-null and aligned; validity is the caller's contract.
    Ok(unsafe { &*p })
}

/// Checks a caller-provided output pointer.
///
/// # Safety
/// `p` must be NULL or valid for writes of `T` for `'a`.
#[inline]
pub(super) unsafe fn out_arg<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Error> {
    if p.is_null() {
        return Err(null_arg(what));
    }
    if !p.is_aligned() {
        return Err(misaligned_arg(what));
    }
    // SAFETY: as above.
    Ok(unsafe { &mut *p })
}

/// Checks the `struct_size` word at the start of a versioned struct.
///
/// # Safety
/// `p` must be NULL or point to at least 4 readable bytes.
pub(super) unsafe fn check_size<T>(p: *const T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(null_arg(what));
    }
    if !p.is_aligned() {
        return Err(misaligned_arg(what));
    }
    // SAFETY: every versioned struct starts with a u32 struct_size.
    let size = unsafe { p.cast::<u32>().read() } as usize;
    if size != size_of::<T>() {
        return Err(Error::new(
            ErrorKind::Abi,
            format!(
                "{what}->struct_size is {size}, this library expects {} (set it to sizeof, or use the _init function)",
                size_of::<T>()
            ),
        ));
    }
    Ok(())
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
pub(super) unsafe fn c_path(p: *const c_char, what: &str) -> Result<PathBuf, Error> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: NUL-terminated per the caller.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    if bytes.is_empty() {
        return Err(invalid(format!("{what} is empty")));
    }
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// # Safety
/// `p` NULL or NUL-terminated.
pub(super) unsafe fn c_name(p: *const c_char, what: &str) -> Result<Option<String>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: NUL-terminated per the caller.
    let s = unsafe { CStr::from_ptr(p) };
    let s = s
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))?;
    if s.is_empty() {
        return Err(invalid(format!("{what} is empty")));
    }
    Ok(Some(s.to_string()))
}

/// # Safety
/// `code` NULL or valid for `len` bytes.
pub(super) unsafe fn bytes<'a>(code: *const u8, len: usize, what: &str) -> Result<&'a [u8], Error> {
    if code.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(invalid(format!("{what} is NULL but its length is {len}")))
        };
    }
    if len > isize::MAX as usize {
        return Err(invalid(format!("{what}: length {len} is too large")));
    }
    // SAFETY: caller contract.
    Ok(unsafe { std::slice::from_raw_parts(code, len) })
}

pub(super) fn fill_name(dst: &mut [c_char], s: &str) {
    packjit_plugin_api::write_c_message(dst, s);
}
