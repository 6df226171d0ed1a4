//! Plugin side of the ABI: exporting a [`JitBackend`] as a [`PjBackendVtable`].
//!
//! Backends use [`export_backend!`](crate::export_backend); the functions here are what the
//! macro expands to and are public only for that reason.

use crate::{abi::*, CodeArena, CompileError, CompileRequest, ErrorKind, JitBackend, Region};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A vtable plus the C strings it points to, kept alive together.
pub struct ExportedBackend {
    vtable: PjBackendVtable,
    _name: CString,
    _version: CString,
}

impl ExportedBackend {
    /// Builds the vtable for `backend` around the given `extern "C"` trampolines.
    pub fn new(
        backend: &dyn JitBackend,
        detect: unsafe extern "C" fn() -> u64,
        compile: unsafe extern "C" fn(*const PjCompileRequest, *mut PjCompileResult) -> i32,
    ) -> Self {
        let name = CString::new(backend.name().replace('\0', "")).unwrap_or_default();
        let version = CString::new(backend.version().replace('\0', "")).unwrap_or_default();
        let vtable = PjBackendVtable {
            abi_version: PJ_ABI_VERSION,
            struct_size: size_of::<PjBackendVtable>() as u32,
            arch: backend.arch().code(),
            inline_kinds: backend.inline_kinds(),
            name: name.as_ptr(),
            version: version.as_ptr(),
            features: backend.supported_features(),
            detect_features: Some(detect),
            compile: Some(compile),
        };
        Self {
            vtable,
            _name: name,
            _version: version,
        }
    }

    /// The vtable (its string pointers live as long as `self`).
    pub fn vtable(&self) -> &PjBackendVtable {
        &self.vtable
    }
}

/// The arena a plugin was handed, seen through the [`CodeArena`] trait.
pub struct ForeignArena<'a> {
    vt: &'a PjArenaVtable,
}

impl<'a> ForeignArena<'a> {
    /// Checks the arena vtable's version and size before use.
    pub fn new(vt: &'a PjArenaVtable) -> Result<Self, CompileError> {
        if vt.abi_version != PJ_ABI_VERSION {
            return Err(CompileError::new(
                ErrorKind::Abi,
                format!(
                    "arena ABI version {} does not match backend ABI version {PJ_ABI_VERSION}",
                    vt.abi_version
                ),
            ));
        }
        if (vt.struct_size as usize) < size_of::<PjArenaVtable>() {
            return Err(CompileError::new(
                ErrorKind::Abi,
                format!(
                    "arena vtable is {} bytes, backend expects {}",
                    vt.struct_size,
                    size_of::<PjArenaVtable>()
                ),
            ));
        }
        if vt.alloc.is_none() || vt.write.is_none() || vt.free.is_none() {
            return Err(CompileError::new(
                ErrorKind::Abi,
                "arena vtable has a NULL entry point",
            ));
        }
        Ok(Self { vt })
    }
}

impl CodeArena for ForeignArena<'_> {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        let mut out = Region::default();
        let alloc = self.vt.alloc.expect("checked in new");
        // SAFETY: the host guarantees ctx stays valid during compile; `out` is a valid pointer.
        let status = unsafe { alloc(self.vt.ctx, size as u64, &mut out) };
        if status != PJ_OK {
            return Err(CompileError::new(
                ErrorKind::from_code(status),
                format!("code arena refused {size} bytes"),
            ));
        }
        if out.size < size as u64 {
            return Err(CompileError::new(
                ErrorKind::Arena,
                format!(
                    "code arena returned {} bytes for a {size}-byte request",
                    out.size
                ),
            ));
        }
        Ok(out)
    }

    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        let write = self.vt.write.expect("checked in new");
        // SAFETY: bytes is valid for len bytes; the arena bounds-checks the region.
        let status = unsafe {
            write(
                self.vt.ctx,
                region,
                offset as u64,
                bytes.as_ptr(),
                bytes.len() as u64,
            )
        };
        if status != PJ_OK {
            return Err(CompileError::new(
                ErrorKind::from_code(status),
                format!(
                    "code arena refused a {}-byte write at offset {offset}",
                    bytes.len()
                ),
            ));
        }
        Ok(())
    }

    fn free(&self, region: &Region) {
        let free = self.vt.free.expect("checked in new");
        // SAFETY: region came from this arena's alloc.
        unsafe { free(self.vt.ctx, region) }
    }
}

/// Runs `f`, turning a panic into `PJ_ERR_PANIC` with the panic message.
pub fn catch_panic<T>(f: impl FnOnce() -> Result<T, CompileError>) -> Result<T, CompileError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            Err(CompileError::new(
                ErrorKind::Panic,
                format!("backend panicked: {what}"),
            ))
        }
    }
}

/// `detect_features` trampoline body.
pub fn detect_entry(backend: &dyn JitBackend) -> u64 {
    catch_unwind(AssertUnwindSafe(|| backend.detect_features())).unwrap_or(0)
}

/// `compile` trampoline body: validates the request, runs the backend, fills the result.
///
/// # Safety
/// `req` and `out` must be NULL or valid for reads/writes of the sizes they claim.
pub unsafe fn compile_entry(
    backend: &dyn JitBackend,
    req: *const PjCompileRequest,
    out: *mut PjCompileResult,
) -> i32 {
    if out.is_null() {
        return PJ_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: out is non-null and the caller promises it is writable; check its claimed size
    // before writing the whole struct.
    let out_size = unsafe { (*out).struct_size } as usize;
    if out_size < size_of::<PjCompileResult>() {
        return PJ_ERR_ABI;
    }
    let result = catch_panic(|| {
        if req.is_null() {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                "compile request is NULL",
            ));
        }
        // SAFETY: non-null, caller promises validity; size checked next.
        let req = unsafe { &*req };
        if (req.struct_size as usize) < size_of::<PjCompileRequest>() {
            return Err(CompileError::new(
                ErrorKind::Abi,
                format!(
                    "compile request is {} bytes, backend expects {}",
                    req.struct_size,
                    size_of::<PjCompileRequest>()
                ),
            ));
        }
        if req.arena.is_null() {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                "compile request has no arena",
            ));
        }
        let code = if req.code_len == 0 {
            &[][..]
        } else if req.code.is_null() {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                "bytecode pointer is NULL",
            ));
        } else {
            // SAFETY: non-null and the caller promises code_len readable bytes.
            unsafe { std::slice::from_raw_parts(req.code, req.code_len as usize) }
        };
        let helpers = if req.helper_count == 0 {
            &[][..]
        } else if req.helpers.is_null() {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                "helper table pointer is NULL",
            ));
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(req.helpers, req.helper_count as usize) }
        };
        // SAFETY: non-null checked above.
        let arena = ForeignArena::new(unsafe { &*req.arena })?;
        let rust_req = CompileRequest {
            code,
            helpers,
            features: req.features,
            flags: req.flags,
            blind_key: req.blind_key,
        };
        backend.compile(&rust_req, &arena)
    });
    let mut res = PjCompileResult {
        struct_size: size_of::<PjCompileResult>() as u32,
        ..PjCompileResult::default()
    };
    let status = match result {
        Ok(c) => {
            res.region = c.region;
            res.entry = c.entry;
            res.code_size = c.code_size as u64;
            res.native_insns = c.native_insns as u64;
            // SAFETY: `req` was checked non-null above; the host sized `pc_offsets` for
            // `pc_offsets_len` entries and keeps it alive for the call.
            let (table, len) = unsafe { ((*req).pc_offsets, (*req).pc_offsets_len) };
            if !table.is_null() && c.pc_offsets.len() as u64 == len {
                // SAFETY: as above: `len` writable entries.
                unsafe {
                    std::ptr::copy_nonoverlapping(c.pc_offsets.as_ptr(), table, c.pc_offsets.len())
                };
                res.pc_offsets_written = len;
            }
            PJ_OK
        }
        Err(e) => {
            res.error = e.to_c();
            e.kind.code()
        }
    };
    // SAFETY: size checked above.
    unsafe { out.write(res) };
    status
}

/// Exports a [`JitBackend`] from a plugin library.
///
/// `$symbol` is the exported entry symbol (a string literal), `$ty` the backend type and
/// `$ctor` an expression building it (evaluated once, on first use). The generated entry
/// catches panics and returns NULL if construction panics.
///
/// ```ignore
/// packjit_plugin_api::export_backend!("packjit_arm64_plugin_v1", Arm64Backend, Arm64Backend::new());
/// ```
#[macro_export]
macro_rules! export_backend {
    ($symbol:literal, $ty:ty, $ctor:expr) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
            static EXPORTED: ::std::sync::OnceLock<$crate::export::ExportedBackend> =
                ::std::sync::OnceLock::new();

            fn instance() -> &'static $ty {
                INSTANCE.get_or_init(|| $ctor)
            }

            unsafe extern "C" fn detect() -> u64 {
                $crate::export::detect_entry(instance())
            }

            unsafe extern "C" fn compile(
                req: *const $crate::PjCompileRequest,
                out: *mut $crate::PjCompileResult,
            ) -> i32 {
                match ::std::panic::catch_unwind(|| instance() as &dyn $crate::JitBackend) {
                    // SAFETY: forwarded from the host, which owns both pointers.
                    Ok(b) => unsafe { $crate::export::compile_entry(b, req, out) },
                    Err(_) => $crate::PJ_ERR_PANIC,
                }
            }

            #[export_name = $symbol]
            extern "C" fn entry() -> *const $crate::PjBackendVtable {
                ::std::panic::catch_unwind(|| {
                    EXPORTED
                        .get_or_init(|| {
                            $crate::export::ExportedBackend::new(instance(), detect, compile)
                        })
                        .vtable() as *const $crate::PjBackendVtable
                })
                .unwrap_or(::core::ptr::null())
            }
        };
    };
}
