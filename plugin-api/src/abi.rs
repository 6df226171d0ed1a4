//! The `#[repr(C)]` side of the plugin ABI.
//!
//! Everything in this module crosses a shared-object boundary, so it is plain data and
//! `extern "C"` function pointers only. Every struct that can grow starts with
//! `abi_version`/`struct_size` (vtables) or `struct_size` (request/result), so either side can
//! refuse a layout it does not know before touching anything else.

use core::ffi::{c_char, c_void};

/// Version of the plugin ABI described by this module. Bumped on any incompatible change.
pub const PJ_ABI_VERSION: u32 = 1;

/// Architecture codes carried in [`PjBackendVtable::arch`].
pub const PJ_ARCH_X86_64: u32 = 1;
/// AArch64 (arm64).
pub const PJ_ARCH_AARCH64: u32 = 2;
/// RV64GC (riscv64).
pub const PJ_ARCH_RISCV64: u32 = 3;

/// Status codes returned by every fallible entry point (0 = success).
pub const PJ_OK: i32 = 0;
/// A NULL pointer, a bad size or another bad argument was passed.
pub const PJ_ERR_INVALID_ARGUMENT: i32 = -1;
/// The bytecode was rejected by the verifier (see `pc` and the message).
pub const PJ_ERR_VERIFY: i32 = -2;
/// The backend does not support an instruction or option.
pub const PJ_ERR_UNSUPPORTED: i32 = -3;
/// A helper call names an id that was not registered.
pub const PJ_ERR_UNKNOWN_HELPER: i32 = -4;
/// The program cannot be encoded for the target (e.g. a branch out of reach).
pub const PJ_ERR_ENCODING: i32 = -5;
/// The code arena could not provide memory.
pub const PJ_ERR_ARENA: i32 = -6;
/// ABI version, struct size or architecture mismatch.
pub const PJ_ERR_ABI: i32 = -7;
/// A panic was caught at the boundary.
pub const PJ_ERR_PANIC: i32 = -8;
/// A plugin could not be loaded (file, symbol).
pub const PJ_ERR_PLUGIN: i32 = -9;
/// The program cannot run here (compiled for another architecture, or not committed).
pub const PJ_ERR_NOT_EXECUTABLE: i32 = -10;
/// Something that should not happen did; the message says what.
pub const PJ_ERR_INTERNAL: i32 = -11;

/// Size of the inline message buffer in [`PjError`].
pub const PJ_ERROR_MESSAGE_LEN: usize = 240;

/// An error carried across the boundary without allocation: a status code, the eBPF
/// instruction index it concerns (or -1) and a NUL-terminated UTF-8 message.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PjError {
    /// One of the `PJ_ERR_*` codes, or `PJ_OK`.
    pub code: i32,
    /// Reserved, zero.
    pub reserved: u32,
    /// eBPF instruction index (in 8-byte slots) the error concerns, or -1.
    pub pc: i64,
    /// NUL-terminated message; truncated on a UTF-8 boundary if too long.
    pub message: [c_char; PJ_ERROR_MESSAGE_LEN],
}

impl Default for PjError {
    fn default() -> Self {
        Self {
            code: PJ_OK,
            reserved: 0,
            pc: -1,
            message: [0; PJ_ERROR_MESSAGE_LEN],
        }
    }
}

/// A block of code memory handed out by a code arena.
///
/// `exec_addr` is the address the code will run at; `cookie` is private to the arena that
/// issued the region (backends pass it back unchanged).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjRegion {
    /// Final (executable) address of the first byte.
    pub exec_addr: u64,
    /// Usable size in bytes (at least what was asked for).
    pub size: u64,
    /// Arena-private identification of the region.
    pub cookie: u64,
}

/// The code arena as seen by a backend: the host owns all code memory.
///
/// A backend asks for a region (`alloc`), writes its bytes (`write`, bounds-checked by the
/// arena) and returns it (`free`) only when compilation fails after allocation. It never maps,
/// protects or flushes memory: commit is the host's job, done once per batch.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PjArenaVtable {
    /// Must be [`PJ_ABI_VERSION`].
    pub abi_version: u32,
    /// `sizeof(PjArenaVtable)` as the host compiled it.
    pub struct_size: u32,
    /// Opaque host context passed to every call.
    pub ctx: *mut c_void,
    /// Allocates `size` bytes of code memory; fills `*out`. Returns a `PJ_*` status.
    pub alloc: Option<unsafe extern "C" fn(ctx: *mut c_void, size: u64, out: *mut PjRegion) -> i32>,
    /// Copies `len` bytes to `region` at `offset`. Returns a `PJ_*` status.
    pub write: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            region: *const PjRegion,
            offset: u64,
            bytes: *const u8,
            len: u64,
        ) -> i32,
    >,
    /// Returns a region that will not be used (compilation failed after `alloc`).
    pub free: Option<unsafe extern "C" fn(ctx: *mut c_void, region: *const PjRegion)>,
}

/// One entry of the helper table: helper `id` lives at `addr`, an
/// `extern "C" fn(u64, u64, u64, u64, u64) -> u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjHelper {
    /// The id used by `call imm` instructions.
    pub id: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Address of the helper function.
    pub addr: u64,
}

/// Everything a backend needs to compile one program.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PjCompileRequest {
    /// `sizeof(PjCompileRequest)` as the host compiled it.
    pub struct_size: u32,
    /// `PJ_COMPILE_*` flags.
    pub flags: u32,
    /// eBPF bytecode, `code_len` bytes (a multiple of 8), little-endian instructions.
    pub code: *const u8,
    /// Length of `code` in bytes.
    pub code_len: u64,
    /// Helper table, `helper_count` entries.
    pub helpers: *const PjHelper,
    /// Number of entries in `helpers`.
    pub helper_count: u64,
    /// Optional CPU features the backend may use (a subset of its `features`).
    pub features: u64,
    /// Where the code goes.
    pub arena: *const PjArenaVtable,
}

/// What a backend reports back.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct PjCompileResult {
    /// `sizeof(PjCompileResult)` as the host compiled it; the backend checks it.
    pub struct_size: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The region holding the code (owned by the host from now on).
    pub region: PjRegion,
    /// Entry point: `u64 (*)(void *ctx, uint64_t ctx_len)`.
    pub entry: u64,
    /// Bytes of machine code written.
    pub code_size: u64,
    /// Native instructions emitted.
    pub native_insns: u64,
    /// Set when the call does not return `PJ_OK`.
    pub error: PjError,
}

/// The vtable a plugin exports.
///
/// The host reads `abi_version`, `struct_size` and `arch` first and refuses a mismatch before
/// touching any other field.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PjBackendVtable {
    /// Must be [`PJ_ABI_VERSION`].
    pub abi_version: u32,
    /// `sizeof(PjBackendVtable)` as the plugin compiled it.
    pub struct_size: u32,
    /// One of the `PJ_ARCH_*` codes: the architecture the backend emits code for.
    pub arch: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// NUL-terminated backend name, static.
    pub name: *const c_char,
    /// NUL-terminated version string, static.
    pub version: *const c_char,
    /// Optional-feature bits this backend understands (arch-specific meaning).
    pub features: u64,
    /// Returns the optional features the CPU running this process offers.
    pub detect_features: Option<unsafe extern "C" fn() -> u64>,
    /// Compiles `req` into the arena; fills `out`. Returns a `PJ_*` status.
    pub compile: Option<
        unsafe extern "C" fn(req: *const PjCompileRequest, out: *mut PjCompileResult) -> i32,
    >,
}

// SAFETY: the vtables hold only pointers to static data and functions (or, for the arena, a
// context the host promises is usable from any thread while the vtable is alive).
unsafe impl Send for PjBackendVtable {}
unsafe impl Sync for PjBackendVtable {}
unsafe impl Send for PjArenaVtable {}
unsafe impl Sync for PjArenaVtable {}

/// Name of the symbol a plugin library exports: `const PjBackendVtable *packjit_plugin_v1(void)`.
///
/// A library that may also be linked statically next to other backends (the Rust backends
/// are `rlib`s too) exports `<libname>_plugin_v1` instead, where `<libname>` is the file name
/// without `lib` and extension (`libpackjit_arm64.so` → `packjit_arm64_plugin_v1`); the
/// loader tries both.
pub const PJ_PLUGIN_SYMBOL: &str = "packjit_plugin_v1";

/// Signature of the exported entry symbol.
pub type PjPluginEntry = unsafe extern "C" fn() -> *const PjBackendVtable;

/// Signature of JIT-compiled code: `r1 = ctx`, `r2 = ctx_len`, returns r0.
pub type PjProgramEntry = unsafe extern "C" fn(ctx: *mut u8, ctx_len: u64) -> u64;

/// Signature of a helper function.
pub type PjHelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;
