//! Loading backend plugins with `libloading`.

use packjit_plugin_api::{
    host::LoadedBackend, Arch, CompileError, ErrorKind, PjPluginEntry, PJ_PLUGIN_SYMBOL,
};
use std::path::{Path, PathBuf};

/// A plugin library and the backend it exports. The library must outlive every use of the
/// backend, so both travel together.
pub(crate) struct Plugin {
    pub backend: LoadedBackend,
    pub library: libloading::Library,
}

fn plugin_err(msg: String) -> CompileError {
    CompileError::new(ErrorKind::Plugin, msg)
}

/// `libpackjit_arm64.so` → `packjit_arm64_plugin_v1`.
fn per_library_symbol(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = file.split('.').next()?;
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    Some(format!("{stem}_plugin_v1"))
}

/// Opens a plugin, finds its entry symbol and validates the vtable (version, size, arch).
pub(crate) fn load(path: &Path, expected_arch: Option<Arch>) -> Result<Plugin, CompileError> {
    let origin = path.display().to_string();
    // RTLD_NODELETE: a plugin's code and statics stay mapped for the life of the process,
    // even after its runtime is dropped — JIT code it produced may still be running, and
    // plugin statics (its exported vtable and strings) are never half-torn-down.
    // SAFETY: loading a library runs its initialisers; plugins are trusted code by contract.
    let library: libloading::Library = unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libc::RTLD_NODELETE,
        )
    }
    .map_err(|e| plugin_err(format!("{origin}: cannot load: {e}")))?
    .into();
    let mut tried = vec![PJ_PLUGIN_SYMBOL.to_string()];
    tried.extend(per_library_symbol(path));
    let entry = tried.iter().find_map(|name| {
        // SAFETY: the symbol has the PjPluginEntry signature by contract of the ABI.
        unsafe { library.get::<PjPluginEntry>(name.as_bytes()) }
            .ok()
            .map(|s| *s)
    });
    let Some(entry) = entry else {
        return Err(plugin_err(format!(
            "{origin}: not a packjit plugin (none of the symbols {} is exported)",
            tried.join(", ")
        )));
    };
    // SAFETY: calling the plugin's entry; it returns a pointer to its static vtable.
    let vt = unsafe { entry() };
    // SAFETY: the vtable lives in `library`, which we keep alongside the backend.
    let backend = unsafe { LoadedBackend::from_vtable(vt, &origin, expected_arch) }?;
    Ok(Plugin { backend, library })
}

/// Where plugins are looked for when no directory is given: `PACKJIT_PLUGIN_DIR`, else the
/// directory of the running executable and its parent (cargo puts test binaries in `deps/`,
/// one level below the libraries).
pub fn default_plugin_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("PACKJIT_PLUGIN_DIR") {
        return vec![PathBuf::from(d)];
    }
    let mut dirs = vec![];
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            dirs.push(dir.to_path_buf());
            if let Some(up) = dir.parent() {
                dirs.push(up.to_path_buf());
            }
        }
    }
    dirs
}

/// Plugin files in `dir`: `libpackjit_*.so` (the C library `libpackjit.so` is not a plugin).
pub fn plugin_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libpackjit_") && n.ends_with(".so"))
        })
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_names_follow_the_library_name() {
        assert_eq!(
            per_library_symbol(Path::new("/x/libpackjit_arm64.so")).as_deref(),
            Some("packjit_arm64_plugin_v1")
        );
        assert_eq!(
            per_library_symbol(Path::new("libfoo.so.1")).as_deref(),
            Some("foo_plugin_v1")
        );
    }

    #[test]
    fn missing_files_and_non_plugins_are_refused_clearly() {
        let e = load(Path::new("/nonexistent/libpackjit_x.so"), None)
            .err()
            .unwrap();
        assert_eq!(e.kind, ErrorKind::Plugin);
        assert!(
            e.message
                .starts_with("/nonexistent/libpackjit_x.so: cannot load"),
            "{e}"
        );
        // The libc this process already uses is a real shared object but not a plugin.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc_path = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.ends_with("/libc.so.6"))
            .expect("libc is mapped");
        let e = load(Path::new(libc_path), None).err().unwrap();
        assert!(e.message.contains("not a packjit plugin"), "{e}");
    }
}
