//! Host side of the ABI: a plugin vtable wrapped back into a [`JitBackend`], and a host
//! [`CodeArena`] presented to a plugin as a [`PjArenaVtable`].

use crate::{
    abi::*, Arch, CodeArena, CompileError, CompileRequest, Compiled, ErrorKind, JitBackend, Region,
};
use core::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Reads a static C string from a plugin, tolerating NULL and bad UTF-8.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that outlives the returned value.
unsafe fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: forwarded from the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A backend behind a vtable read from a plugin, validated once.
///
/// The caller keeps the library that provided the vtable loaded for as long as this value
/// (and any code it compiled) is alive.
pub struct LoadedBackend {
    vt: &'static PjBackendVtable,
    name: String,
    version: String,
    arch: Arch,
}

impl LoadedBackend {
    /// Validates a vtable: ABI version and struct size first, then the arch (against
    /// `expected_arch` when given), then the entry points.
    ///
    /// # Safety
    /// `vt` must be NULL or point to a vtable (of at least the 8 bytes holding version and
    /// size) that stays valid for `'static` — i.e. the library is never unloaded while this
    /// value exists.
    pub unsafe fn from_vtable(
        vt: *const PjBackendVtable,
        origin: &str,
        expected_arch: Option<Arch>,
    ) -> Result<Self, CompileError> {
        if vt.is_null() {
            return Err(CompileError::new(
                ErrorKind::Plugin,
                format!("{origin}: plugin entry returned NULL (its constructor failed)"),
            ));
        }
        // Read only the two header words before trusting the layout.
        // SAFETY: the caller promises at least the header is readable.
        let (version, size) = unsafe {
            let head = vt as *const u32;
            (head.read(), head.add(1).read())
        };
        if version != PJ_ABI_VERSION {
            return Err(CompileError::new(
                ErrorKind::Abi,
                format!(
                    "{origin}: plugin ABI version {version}, host ABI version {PJ_ABI_VERSION}"
                ),
            ));
        }
        if (size as usize) != size_of::<PjBackendVtable>() {
            return Err(CompileError::new(
                ErrorKind::Abi,
                format!(
                    "{origin}: plugin vtable is {size} bytes, host expects {} (same ABI version, different layout)",
                    size_of::<PjBackendVtable>()
                ),
            ));
        }
        // SAFETY: version and size match ours, so the layout is ours.
        let vt: &'static PjBackendVtable = unsafe { &*vt };
        let arch = Arch::from_code(vt.arch).ok_or_else(|| {
            CompileError::new(
                ErrorKind::Abi,
                format!(
                    "{origin}: plugin reports unknown architecture code {}",
                    vt.arch
                ),
            )
        })?;
        if let Some(want) = expected_arch {
            if want != arch {
                return Err(CompileError::new(
                    ErrorKind::Abi,
                    format!("{origin}: plugin emits {arch} code, host wants {want}"),
                ));
            }
        }
        if vt.compile.is_none() || vt.detect_features.is_none() {
            return Err(CompileError::new(
                ErrorKind::Abi,
                format!("{origin}: plugin vtable has a NULL entry point"),
            ));
        }
        // SAFETY: static strings per the ABI.
        let (name, version) = unsafe { (c_str(vt.name), c_str(vt.version)) };
        Ok(Self {
            vt,
            name,
            version,
            arch,
        })
    }

    /// The raw vtable.
    pub fn vtable(&self) -> &'static PjBackendVtable {
        self.vt
    }
}

impl JitBackend for LoadedBackend {
    fn arch(&self) -> Arch {
        self.arch
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn supported_features(&self) -> u64 {
        self.vt.features
    }

    fn inline_kinds(&self) -> u32 {
        self.vt.inline_kinds
    }

    fn detect_features(&self) -> u64 {
        let detect = self.vt.detect_features.expect("checked at load");
        // SAFETY: plugin entry point validated at load; it takes no arguments.
        unsafe { detect() }
    }

    fn compile(
        &self,
        req: &CompileRequest<'_>,
        arena: &dyn CodeArena,
    ) -> Result<Compiled, CompileError> {
        let arena_vt = arena_vtable(&arena);
        let mut line_table = vec![crate::NO_NATIVE_CODE; req.code.len() / 8];
        let c_req = PjCompileRequest {
            struct_size: size_of::<PjCompileRequest>() as u32,
            flags: req.flags,
            code: req.code.as_ptr(),
            code_len: req.code.len() as u64,
            helpers: req.helpers.as_ptr(),
            helper_count: req.helpers.len() as u64,
            features: req.features,
            arena: &arena_vt,
            blind_key: req.blind_key,
            pc_offsets: line_table.as_mut_ptr(),
            pc_offsets_len: line_table.len() as u64,
        };
        let mut out = PjCompileResult {
            struct_size: size_of::<PjCompileResult>() as u32,
            ..PjCompileResult::default()
        };
        let compile = self.vt.compile.expect("checked at load");
        // SAFETY: all pointers are valid for the duration of the call.
        let status = unsafe { compile(&c_req, &mut out) };
        if status != PJ_OK {
            let mut err = CompileError::from_c(&out.error);
            if out.error.code == PJ_OK {
                err.kind = ErrorKind::from_code(status);
            }
            return Err(err);
        }
        if out.pc_offsets_written != line_table.len() as u64 {
            line_table.clear();
        }
        Ok(Compiled {
            region: out.region,
            entry: out.entry,
            code_size: out.code_size as usize,
            native_insns: out.native_insns as usize,
            pc_offsets: line_table,
        })
    }
}

/// Builds an arena vtable whose context is `arena` (a `&&dyn CodeArena`), valid while the
/// borrow lives. Panics in the host arena never unwind into the plugin.
pub fn arena_vtable<'a>(arena: &'a &'a dyn CodeArena) -> PjArenaVtable {
    PjArenaVtable {
        abi_version: PJ_ABI_VERSION,
        struct_size: size_of::<PjArenaVtable>() as u32,
        ctx: arena as *const &dyn CodeArena as *mut c_void,
        alloc: Some(arena_alloc),
        write: Some(arena_write),
        free: Some(arena_free),
    }
}

/// # Safety
/// `ctx` is the `&&dyn CodeArena` installed by [`arena_vtable`].
unsafe fn arena_of<'a>(ctx: *mut c_void) -> &'a dyn CodeArena {
    // SAFETY: see above.
    unsafe { *(ctx as *const &dyn CodeArena) }
}

unsafe extern "C" fn arena_alloc(ctx: *mut c_void, size: u64, out: *mut PjRegion) -> i32 {
    if out.is_null() {
        return PJ_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: ctx installed by arena_vtable.
    let arena = unsafe { arena_of(ctx) };
    match catch_unwind(AssertUnwindSafe(|| arena.alloc(size as usize))) {
        Ok(Ok(region)) => {
            // SAFETY: out non-null, provided by the plugin.
            unsafe { out.write(region) };
            PJ_OK
        }
        Ok(Err(e)) => e.kind.code(),
        Err(_) => PJ_ERR_PANIC,
    }
}

unsafe extern "C" fn arena_write(
    ctx: *mut c_void,
    region: *const PjRegion,
    offset: u64,
    bytes: *const u8,
    len: u64,
) -> i32 {
    if region.is_null() || (bytes.is_null() && len != 0) {
        return PJ_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: ctx installed by arena_vtable; pointers checked non-null, lengths from caller.
    let (arena, region, bytes) = unsafe {
        let bytes = if len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(bytes, len as usize)
        };
        (arena_of(ctx), *region, bytes)
    };
    match catch_unwind(AssertUnwindSafe(|| {
        arena.write(&region, offset as usize, bytes)
    })) {
        Ok(Ok(())) => PJ_OK,
        Ok(Err(e)) => e.kind.code(),
        Err(_) => PJ_ERR_PANIC,
    }
}

unsafe extern "C" fn arena_free(ctx: *mut c_void, region: *const PjRegion) {
    if region.is_null() {
        return;
    }
    // SAFETY: as above.
    let (arena, region): (&dyn CodeArena, Region) = unsafe { (arena_of(ctx), *region) };
    let _ = catch_unwind(AssertUnwindSafe(|| arena.free(&region)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    struct VecArena {
        bytes: RefCell<Vec<u8>>,
        freed: RefCell<usize>,
    }

    impl CodeArena for VecArena {
        fn alloc(&self, size: usize) -> Result<Region, CompileError> {
            self.bytes.borrow_mut().resize(size, 0);
            Ok(Region {
                exec_addr: 0x1000,
                size: size as u64,
                cookie: 7,
            })
        }
        fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
            if region.cookie != 7 || offset + bytes.len() > region.size as usize {
                return Err(CompileError::new(ErrorKind::Arena, "out of bounds"));
            }
            self.bytes.borrow_mut()[offset..offset + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
        fn free(&self, _region: &Region) {
            *self.freed.borrow_mut() += 1;
        }
    }

    struct Fake {
        panic: bool,
        arch: Arch,
    }

    impl JitBackend for Fake {
        fn arch(&self) -> Arch {
            self.arch
        }
        fn name(&self) -> &str {
            "fake"
        }
        fn version(&self) -> &str {
            "1.2.3"
        }
        fn supported_features(&self) -> u64 {
            0b11
        }
        fn detect_features(&self) -> u64 {
            0b01
        }
        fn compile(
            &self,
            req: &CompileRequest<'_>,
            arena: &dyn CodeArena,
        ) -> Result<Compiled, CompileError> {
            if self.panic {
                panic!("deliberate");
            }
            if req.code.is_empty() {
                return Err(CompileError::at(0, ErrorKind::Verify, "empty program"));
            }
            crate::install_code(arena, &req.code[..4], 1)
        }
    }

    fn exported(panic: bool, arch: Arch) -> &'static PjBackendVtable {
        // Leak one backend per test: the trampolines need 'static state, as in a real plugin.
        let b: &'static Fake = Box::leak(Box::new(Fake { panic, arch }));
        thread_local! { static CUR: RefCell<Option<&'static Fake>> = const { RefCell::new(None) }; }
        CUR.with(|c| *c.borrow_mut() = Some(b));
        unsafe extern "C" fn detect() -> u64 {
            CUR.with(|c| crate::export::detect_entry(c.borrow().unwrap()))
        }
        unsafe extern "C" fn compile(r: *const PjCompileRequest, o: *mut PjCompileResult) -> i32 {
            // SAFETY: pointers straight from LoadedBackend::compile, valid for the call.
            CUR.with(|c| unsafe { crate::export::compile_entry(c.borrow().unwrap(), r, o) })
        }
        let e = Box::leak(Box::new(crate::export::ExportedBackend::new(
            b, detect, compile,
        )));
        e.vtable()
    }

    #[test]
    fn round_trip_through_vtables() {
        let vt = exported(false, Arch::Aarch64);
        // SAFETY: a vtable built by ExportedBackend, static for the test.
        let b = unsafe { LoadedBackend::from_vtable(vt, "test", Some(Arch::Aarch64)) }.unwrap();
        assert_eq!(
            (b.name(), b.version(), b.arch()),
            ("fake", "1.2.3", Arch::Aarch64)
        );
        assert_eq!((b.supported_features(), b.detect_features()), (0b11, 0b01));
        let arena = VecArena {
            bytes: RefCell::new(vec![]),
            freed: RefCell::new(0),
        };
        let code = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let req = CompileRequest {
            code: &code,
            helpers: &[],
            features: 0,
            flags: 0,
            blind_key: 0,
        };
        let c = b.compile(&req, &arena).unwrap();
        assert_eq!(c.entry, 0x1000);
        assert_eq!(c.code_size, 4);
        assert_eq!(*arena.bytes.borrow(), vec![1, 2, 3, 4]);

        let err = b
            .compile(&CompileRequest { code: &[], ..req }, &arena)
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Verify);
        assert_eq!(err.to_string(), "pc 0: empty program");
    }

    #[test]
    fn panic_becomes_error() {
        let vt = exported(true, Arch::Riscv64);
        // SAFETY: as above.
        let b = unsafe { LoadedBackend::from_vtable(vt, "test", None) }.unwrap();
        let arena = VecArena {
            bytes: RefCell::new(vec![]),
            freed: RefCell::new(0),
        };
        let req = CompileRequest {
            code: &[0; 8],
            helpers: &[],
            features: 0,
            flags: 0,
            blind_key: 0,
        };
        let err = b.compile(&req, &arena).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Panic);
        assert!(err.message.contains("deliberate"), "{}", err.message);
    }

    #[test]
    fn mismatches_are_refused_naming_both_sides() {
        let good = *exported(false, Arch::Aarch64);
        let mut bad = good;
        bad.abi_version = 99;
        // SAFETY: a complete vtable value; only its header fields were altered.
        let e = unsafe { LoadedBackend::from_vtable(&bad, "libx.so", None) }
            .err()
            .unwrap();
        assert_eq!(e.kind, ErrorKind::Abi);
        assert!(
            e.message.contains("libx.so") && e.message.contains("99"),
            "{}",
            e.message
        );
        assert!(e
            .message
            .contains(&format!("host ABI version {PJ_ABI_VERSION}")));

        let mut bad = good;
        bad.struct_size = 8;
        // SAFETY: as above.
        let e = unsafe { LoadedBackend::from_vtable(&bad, "libx.so", None) }
            .err()
            .unwrap();
        assert!(
            e.message.contains("8 bytes") && e.message.contains("host expects"),
            "{}",
            e.message
        );

        // SAFETY: as above.
        let e = unsafe { LoadedBackend::from_vtable(&good, "libx.so", Some(Arch::Riscv64)) }
            .err()
            .unwrap();
        assert_eq!(
            e.message,
            "libx.so: plugin emits aarch64 code, host wants riscv64"
        );

        let mut bad = good;
        bad.arch = 42;
        // SAFETY: as above.
        let e = unsafe { LoadedBackend::from_vtable(&bad, "libx.so", None) }
            .err()
            .unwrap();
        assert!(e.message.contains("unknown architecture code 42"));

        let mut bad = good;
        bad.compile = None;
        // SAFETY: as above.
        let e = unsafe { LoadedBackend::from_vtable(&bad, "libx.so", None) }
            .err()
            .unwrap();
        assert!(e.message.contains("NULL entry point"));
    }

    #[test]
    fn error_messages_truncate_on_char_boundaries() {
        let long = "é".repeat(500);
        let e = CompileError::at(5, ErrorKind::Encoding, long);
        let c = e.to_c();
        let back = CompileError::from_c(&c);
        assert_eq!(back.pc, Some(5));
        assert_eq!(back.kind, ErrorKind::Encoding);
        assert!(back.message.chars().all(|ch| ch == 'é'));
        assert!(back.message.len() < PJ_ERROR_MESSAGE_LEN);
    }

    #[test]
    fn small_result_struct_is_refused() {
        let vt = exported(false, Arch::Aarch64);
        let mut out = PjCompileResult {
            struct_size: 4,
            ..Default::default()
        };
        // SAFETY: the entry must refuse a NULL request without touching it; `out` is valid.
        let status = unsafe { (vt.compile.unwrap())(core::ptr::null(), &mut out) };
        assert_eq!(status, PJ_ERR_ABI);
        let mut out = PjCompileResult {
            struct_size: size_of::<PjCompileResult>() as u32,
            ..Default::default()
        };
        // SAFETY: as above.
        let status = unsafe { (vt.compile.unwrap())(core::ptr::null(), &mut out) };
        assert_eq!(status, PJ_ERR_INVALID_ARGUMENT);
        assert!(CompileError::from_c(&out.error).message.contains("NULL"));
    }
}
