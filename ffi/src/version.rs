//! Library and plugin ABI versions.

use super::{PACKJIT_VERSION_MAJOR, PACKJIT_VERSION_MINOR, PACKJIT_VERSION_PATCH};
use core::ffi::{c_char, CStr};

/// The library version: `(major << 16) | (minor << 8) | patch`. Compare with the
/// `PACKJIT_VERSION_*` macros to detect a header/library mismatch.
#[no_mangle]
pub extern "C" fn packjit_version() -> u32 {
    (PACKJIT_VERSION_MAJOR << 16) | (PACKJIT_VERSION_MINOR << 8) | PACKJIT_VERSION_PATCH
}

/// The library version as a static NUL-terminated string (e.g. "0.1.0"). Owned by the
/// library; never freed; valid for the life of the process.
#[no_mangle]
pub extern "C" fn packjit_version_string() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"?",
        };
    V.as_ptr()
}

/// The plugin ABI version this library speaks (`PJ_ABI_VERSION` of its build).
#[no_mangle]
pub extern "C" fn packjit_abi_version() -> u32 {
    packjit_plugin_api::PJ_ABI_VERSION
}
