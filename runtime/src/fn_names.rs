//! Which rbpf standard helper a function pointer is, by its symbol: how the rbpf bridge
//! swaps rbpf's unchecked `memfrob` and `strcmp` for checked ones when a host registers
//! them (issue: the natural line to keep when switching from rbpf gave a sandboxed program
//! write access to host memory).
//!
//! Comparing addresses cannot tell: rustc inlines small functions across crates, so the
//! host's crate holds its own copy of `rbpf::helpers::memfrob`, at another address than
//! the bridge's (and Rust never promises one address per function). Every copy keeps the
//! function's mangled name in the object's symbol table, though, so the bridge asks
//! `dladdr` which object holds the pointer and where it is loaded, and finds the symbol
//! covering it in that object's `.symtab`. Where that cannot be read (a stripped binary,
//! no `/proc`, a JIT-made function), the answer is "unknown" and the bridge keeps what the
//! host registered, as its docs say.

use object::{Object, ObjectKind, ObjectSymbol};
use std::collections::HashMap;
use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::Mutex;

/// The rbpf helpers the bridge has checked versions of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RbpfHelper {
    Memfrob,
    Strcmp,
}

impl RbpfHelper {
    /// The part of the mangled name (legacy `_ZN4rbpf7helpers7memfrob17h..E` and v0
    /// `_RNvNtCs.._4rbpf7helpers7memfrob` alike) that names the function.
    const MANGLED: [(&'static str, RbpfHelper); 2] = [
        ("4rbpf7helpers7memfrob", RbpfHelper::Memfrob),
        ("4rbpf7helpers6strcmp", RbpfHelper::Strcmp),
    ];
}

/// An object's rbpf helper symbols: `[start, end)` as offsets the loaded address is
/// compared with (load bias removed for position-independent objects).
struct Symbols {
    relative: bool,
    helpers: Vec<(u64, u64, RbpfHelper)>,
}

fn symbols_of(path: &PathBuf) -> Option<Symbols> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let relative = file.kind() != ObjectKind::Executable;
    let helpers = file
        .symbols()
        .filter_map(|s| {
            let name = s.name().ok()?;
            let (_, which) = RbpfHelper::MANGLED
                .iter()
                .find(|(mangled, _)| name.contains(mangled))?;
            let size = s.size().max(1);
            Some((s.address(), s.address() + size, *which))
        })
        .collect();
    Some(Symbols { relative, helpers })
}

/// Which rbpf standard helper `addr` (a function's address) is, if its symbol says so.
pub(crate) fn rbpf_helper_at(addr: usize) -> Option<RbpfHelper> {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value for it to be filled.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address (it need not point anywhere) and fills `info`.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr set it to the object's NUL-terminated path, alive while it is loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let mut path = PathBuf::from(name.to_str().ok()?);
    if !path.is_absolute() {
        // The main program, as it was started: read it where the kernel keeps it.
        path = PathBuf::from("/proc/self/exe");
    }
    static CACHE: Mutex<Option<HashMap<PathBuf, Option<Symbols>>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let symbols = cache
        .get_or_insert_with(HashMap::new)
        .entry(path.clone())
        .or_insert_with(|| symbols_of(&path))
        .as_ref()?;
    let at = if symbols.relative {
        (addr as u64).wrapping_sub(info.dli_fbase as u64)
    } else {
        addr as u64
    };
    symbols
        .helpers
        .iter()
        .find(|&&(start, end, _)| (start..end).contains(&at))
        .map(|&(_, _, which)| which)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbpfs_helpers_are_recognised_by_symbol_and_nothing_else_is() {
        let memfrob: rbpf::ebpf::Helper = rbpf::helpers::memfrob;
        let strcmp: rbpf::ebpf::Helper = rbpf::helpers::strcmp;
        let sqrti: rbpf::ebpf::Helper = rbpf::helpers::sqrti;
        fn own(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
            0
        }
        let own: rbpf::ebpf::Helper = own;
        assert_eq!(rbpf_helper_at(memfrob as usize), Some(RbpfHelper::Memfrob));
        assert_eq!(rbpf_helper_at(strcmp as usize), Some(RbpfHelper::Strcmp));
        assert_eq!(rbpf_helper_at(sqrti as usize), None);
        assert_eq!(rbpf_helper_at(own as usize), None);
        assert_eq!(rbpf_helper_at(0), None);
    }
}
