//! Backend plugins: loading them, and describing the loaded backends.

use super::args::{c_path, check_size, fill_name, out_arg};
use super::error::{boundary, invalid};
use super::runtime::{runtime, PackjitRuntime};
use super::{PACKJIT_NAME_LEN, PACKJIT_PATH_LEN};
use core::ffi::c_char;
use packjit_runtime::{Arch, BackendInfo, Error, ErrorKind};
use std::path::PathBuf;

/// A loaded backend, filled by the plugin-loading calls and `packjit_backend_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitBackendInfo {
    /// `sizeof(PackjitBackendInfo)`, set by the caller.
    pub struct_size: u32,
    /// `PJ_ARCH_*` code of the code it emits.
    pub arch: u32,
    /// Optional-feature bits it understands.
    pub supported_features: u64,
    /// Optional-feature bits the running CPU offers (0 for a foreign arch).
    pub detected_features: u64,
    /// NUL-terminated backend name (truncated to fit).
    pub name: [c_char; PACKJIT_NAME_LEN],
    /// NUL-terminated backend version (truncated to fit).
    pub version: [c_char; PACKJIT_NAME_LEN],
    /// NUL-terminated plugin path, or "static" (truncated to fit).
    pub origin: [c_char; PACKJIT_PATH_LEN],
}

/// # Safety
/// `out` must be NULL or a `PackjitBackendInfo` with `struct_size` set.
unsafe fn write_backend_info(
    info: &BackendInfo,
    out: *mut PackjitBackendInfo,
) -> Result<(), Error> {
    if out.is_null() {
        return Ok(());
    }
    // SAFETY: caller contract.
    unsafe { check_size(out, "info") }?;
    let mut o = PackjitBackendInfo {
        struct_size: size_of::<PackjitBackendInfo>() as u32,
        arch: info.arch.code(),
        supported_features: info.supported_features,
        detected_features: info.detected_features,
        name: [0; PACKJIT_NAME_LEN],
        version: [0; PACKJIT_NAME_LEN],
        origin: [0; PACKJIT_PATH_LEN],
    };
    fill_name(&mut o.name, &info.name);
    fill_name(&mut o.version, &info.version);
    fill_name(&mut o.origin, &info.origin);
    // SAFETY: checked.
    unsafe { *out = o };
    Ok(())
}

/// Loads a backend plugin library (a file exporting `packjit_plugin_v1` or
/// `<libname>_plugin_v1`) and adds its backend. One backend per architecture: loading a
/// second one for the same arch fails with `PJ_ERR_PLUGIN`. The library stays loaded while
/// the runtime or any of its programs lives. `info` may be NULL; otherwise it receives the
/// backend's description.
///
/// # Safety
/// `rt` must be NULL or a live runtime; `path` NULL or a NUL-terminated path (borrowed for
/// the call); `info` NULL or a `PackjitBackendInfo` with `struct_size` set. Loading a
/// library runs its initialisers: only load trusted plugins.
#[no_mangle]
pub unsafe extern "C" fn packjit_load_plugin(
    rt: *const PackjitRuntime,
    path: *const c_char,
    info: *mut PackjitBackendInfo,
) -> i32 {
    boundary("packjit_load_plugin", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let path = unsafe { c_path(path, "path") }?;
        if !info.is_null() {
            // SAFETY: validate before loading, so a bad struct leaves nothing loaded.
            unsafe { check_size(info, "info") }?;
        }
        let bi = h.rt.load_plugin(&path)?;
        // SAFETY: caller contract.
        unsafe { write_backend_info(&bi, info) }
    })
}

/// # Safety
/// `dir` NULL or NUL-terminated.
unsafe fn plugin_dirs(h: &PackjitRuntime, dir: *const c_char) -> Result<Vec<PathBuf>, Error> {
    Ok(if !dir.is_null() {
        // SAFETY: caller contract.
        vec![unsafe { c_path(dir, "dir") }?]
    } else if let Some(d) = &h.plugin_dir {
        vec![d.clone()]
    } else {
        packjit_runtime::default_plugin_dirs()
    })
}

fn join_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Loads every plugin (`libpackjit_*.so`) in `dir`; `dir` NULL means the configured
/// `plugin_dir`, else the default directories (the first one holding plugins wins). Fails
/// if none is found or any fails to load (those loaded before the failure stay loaded).
/// `loaded` (may be NULL) receives the number of backends added.
///
/// # Safety
/// `rt` NULL or live; `dir` NULL or NUL-terminated (borrowed); `loaded` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_load_plugins(
    rt: *const PackjitRuntime,
    dir: *const c_char,
    loaded: *mut u64,
) -> i32 {
    boundary("packjit_load_plugins", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if !loaded.is_null() {
            // SAFETY: caller contract.
            *unsafe { out_arg(loaded, "loaded") }? = 0;
        }
        // SAFETY: caller contract.
        let dirs = unsafe { plugin_dirs(h, dir) }?;
        let mut n = 0u64;
        let mut result = Err(Error::new(
            ErrorKind::Plugin,
            format!(
                "no packjit plugins (libpackjit_*.so) in {}",
                join_dirs(&dirs)
            ),
        ));
        for d in &dirs {
            let files = packjit_runtime::plugin_files(d);
            if files.is_empty() {
                continue;
            }
            result = files.iter().try_for_each(|f| {
                h.rt.load_plugin(f)?;
                n += 1;
                Ok(())
            });
            break;
        }
        if !loaded.is_null() {
            // SAFETY: checked above.
            unsafe { *loaded = n };
        }
        result
    })
}

/// Loads the plugin that emits code for the host architecture: tries each
/// `libpackjit_*.so` of `dir` (NULL: the configured `plugin_dir`, else the default
/// directories) and keeps the first whose backend targets this CPU; the others are unloaded
/// again. `info` (may be NULL) receives its description. Fails with `PJ_ERR_PLUGIN` naming
/// every file tried and why when none fits.
///
/// # Safety
/// As `packjit_load_plugins`; `info` NULL or with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_load_host_plugin(
    rt: *const PackjitRuntime,
    dir: *const c_char,
    info: *mut PackjitBackendInfo,
) -> i32 {
    boundary("packjit_load_host_plugin", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if !info.is_null() {
            // SAFETY: caller contract.
            unsafe { check_size(info, "info") }?;
        }
        let host = Arch::host().ok_or_else(|| {
            Error::new(
                ErrorKind::Plugin,
                "packjit does not know this host architecture",
            )
        })?;
        // SAFETY: caller contract.
        let dirs = unsafe { plugin_dirs(h, dir) }?;
        let mut tried = Vec::new();
        for d in &dirs {
            for f in packjit_runtime::plugin_files(d) {
                match h.rt.load_plugin_for(&f, Some(host)) {
                    // SAFETY: caller contract.
                    Ok(bi) => return unsafe { write_backend_info(&bi, info) },
                    Err(e) => tried.push(e.to_string()),
                }
            }
        }
        Err(Error::new(
            ErrorKind::Plugin,
            if tried.is_empty() {
                format!(
                    "no packjit plugins (libpackjit_*.so) in {}",
                    join_dirs(&dirs)
                )
            } else {
                format!("no plugin for {host} among: {}", tried.join("; "))
            },
        ))
    })
}

/// Number of loaded backends, into `*count`.
///
/// # Safety
/// `rt` NULL or live; `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_backend_count(rt: *const PackjitRuntime, count: *mut u64) -> i32 {
    boundary("packjit_backend_count", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        *unsafe { out_arg(count, "count") }? = h.rt.backends().len() as u64;
        Ok(())
    })
}

/// Describes loaded backend number `index` (0-based, in load order).
///
/// # Safety
/// `rt` NULL or live; `info` NULL or a `PackjitBackendInfo` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_backend_info(
    rt: *const PackjitRuntime,
    index: u64,
    info: *mut PackjitBackendInfo,
) -> i32 {
    boundary("packjit_backend_info", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if info.is_null() {
            return Err(invalid("info is NULL"));
        }
        let all = h.rt.backends();
        let bi = usize::try_from(index)
            .ok()
            .and_then(|i| all.get(i))
            .ok_or_else(|| {
                invalid(format!(
                    "backend index {index} out of range ({} loaded)",
                    all.len()
                ))
            })?;
        // SAFETY: caller contract.
        unsafe { write_backend_info(bi, info) }
    })
}
