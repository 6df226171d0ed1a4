//! # packjit C API
//!
//! `libpackjit.so` / `libpackjit.a` and `include/packjit.h` (generated from this file by
//! cbindgen; see `ffi/cbindgen.toml` and `ffi/gen-header.sh`). The plugin ABI's C types
//! (`PjBackendVtable`, `PjCompileRequest`, ...) come from `packjit-plugin-api` and are emitted
//! into the same header, so a backend can be written in C against it.
//!
//! Conventions, all of them repeated in the header:
//!
//! * Every fallible call returns an `int32_t` status: `PJ_OK` (0) or a negative `PJ_ERR_*`
//!   code. On failure a message is left in the calling thread's last-error slot
//!   (`packjit_last_error`); a successful call clears it.
//! * NULL pointers, bad sizes and stale or foreign handles are reported as
//!   `PJ_ERR_INVALID_ARGUMENT`, never a crash (a handle is recognised by a magic word; a
//!   pointer to unmapped memory cannot be detected, of course).
//! * No Rust panic crosses the boundary: every exported function catches it and returns
//!   `PJ_ERR_PANIC`.
//! * Versioned structs start with `struct_size`; the caller sets it to `sizeof` the struct
//!   (the `*_init` functions do) and the library refuses other sizes with `PJ_ERR_ABI`.

use core::ffi::{c_char, c_void, CStr};
use crossbeam_epoch as epoch;
// The plugin ABI's C types (the header gets them through cbindgen's `parse_deps`).
pub use packjit_plugin_api::{
    PjArenaVtable, PjBackendVtable, PjCompileRequest, PjCompileResult, PjError, PjExecEnv,
    PjHelper, PjHelperFn, PjMemRegion, PjPluginEntry, PjProgramEntry, PjRegion,
};
use packjit_runtime::{
    helper_access_ok, AccessDirection, Arch, ArenaConfig, ArenaStats, BackendInfo, ElfLoadOptions,
    Error, ErrorKind, GlobalData, LoadOptions, MapMode, MemRegion, Program, RegionAccess,
    RemapPolicy, Runtime, RuntimeConfig, Trust,
};
use std::cell::RefCell;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

// The plugin ABI's constants, mirrored here because cbindgen only emits constants of the
// crate it generates for (it does emit the plugin-api *types*, via `parse_deps`). Each one is
// checked against packjit-plugin-api at compile time just below, so they cannot drift.

/// Version of the plugin ABI (`PjBackendVtable::abi_version`, `PjArenaVtable::abi_version`).
pub const PJ_ABI_VERSION: u32 = 2;
/// Architecture code: x86-64.
pub const PJ_ARCH_X86_64: u32 = 1;
/// Architecture code: AArch64 (arm64).
pub const PJ_ARCH_AARCH64: u32 = 2;
/// Architecture code: RV64GC (riscv64).
pub const PJ_ARCH_RISCV64: u32 = 3;
/// Status: success.
pub const PJ_OK: i32 = 0;
/// Status: a NULL pointer, a bad size, a stale handle or another bad argument.
pub const PJ_ERR_INVALID_ARGUMENT: i32 = -1;
/// Status: the bytecode was rejected by the verifier (see the pc and the message).
pub const PJ_ERR_VERIFY: i32 = -2;
/// Status: the backend does not support an instruction or option.
pub const PJ_ERR_UNSUPPORTED: i32 = -3;
/// Status: a helper call names an id that was not registered.
pub const PJ_ERR_UNKNOWN_HELPER: i32 = -4;
/// Status: the program cannot be encoded for the target (e.g. a branch out of reach).
pub const PJ_ERR_ENCODING: i32 = -5;
/// Status: the code arena could not provide memory.
pub const PJ_ERR_ARENA: i32 = -6;
/// Status: ABI version, struct size or architecture mismatch.
pub const PJ_ERR_ABI: i32 = -7;
/// Status: a panic was caught at the boundary.
pub const PJ_ERR_PANIC: i32 = -8;
/// Status: a plugin could not be loaded (file, symbol, arch).
pub const PJ_ERR_PLUGIN: i32 = -9;
/// Status: the program cannot run here (compiled for another architecture).
pub const PJ_ERR_NOT_EXECUTABLE: i32 = -10;
/// Status: something that should not happen did; the message says what.
pub const PJ_ERR_INTERNAL: i32 = -11;
/// Status: a sandboxed program's memory access fell outside every region it may touch
/// (`packjit_last_error` names the pc, the address, the size and read/write).
pub const PJ_ERR_OUT_OF_BOUNDS: i32 = -12;
/// Status: the program ran out of its instruction budget (the error names the pc).
pub const PJ_ERR_BUDGET: i32 = -13;
/// Status: a `callx` named a helper id with no registered helper (the error names pc and id).
pub const PJ_ERR_UNKNOWN_CALLX: i32 = -14;
/// `PjMemRegion::flags`: programs may write the region (reads are always allowed).
pub const PJ_REGION_WRITABLE: u64 = 1;
/// Size of the inline message buffer in `PjError`.
pub const PJ_ERROR_MESSAGE_LEN: usize = 240;
/// Name of the symbol a plugin exports: `const PjBackendVtable *packjit_plugin_v1(void)`
/// (see `PjPluginEntry`). A plugin that may also be linked statically next to others exports
/// `<libname>_plugin_v1` instead (`libpackjit_arm64.so` -> `packjit_arm64_plugin_v1`).
pub const PJ_PLUGIN_SYMBOL: &str = "packjit_plugin_v1";
mod abi_mirror {
    use packjit_plugin_api as api;
    macro_rules! same {
        ($($name:ident),*) => {
            $(const _: () = assert!(super::$name == api::$name);)*
        };
    }
    same!(
        PJ_ABI_VERSION,
        PJ_ARCH_X86_64,
        PJ_ARCH_AARCH64,
        PJ_ARCH_RISCV64,
        PJ_OK,
        PJ_ERR_INVALID_ARGUMENT,
        PJ_ERR_VERIFY,
        PJ_ERR_UNSUPPORTED,
        PJ_ERR_UNKNOWN_HELPER,
        PJ_ERR_ENCODING,
        PJ_ERR_ARENA,
        PJ_ERR_ABI,
        PJ_ERR_PANIC,
        PJ_ERR_PLUGIN,
        PJ_ERR_NOT_EXECUTABLE,
        PJ_ERR_INTERNAL,
        PJ_ERR_OUT_OF_BOUNDS,
        PJ_ERR_BUDGET,
        PJ_ERR_UNKNOWN_CALLX,
        PJ_REGION_WRITABLE,
        PJ_ERROR_MESSAGE_LEN
    );
    const _: () = {
        let (a, b) = (
            super::PJ_PLUGIN_SYMBOL.as_bytes(),
            api::PJ_PLUGIN_SYMBOL.as_bytes(),
        );
        assert!(a.len() == b.len());
        let mut i = 0;
        while i < a.len() {
            assert!(a[i] == b[i]);
            i += 1;
        }
    };
}

/// Signature of a helper: BPF r1-r5 in, r0 out. Same as `PjHelperFn`; spelled out so the
/// parameter can be NULL-checked (`Option`) and still be emitted as a plain C function
/// pointer.
type HelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;

/// Major version of this library (`packjit_version() >> 16`).
pub const PACKJIT_VERSION_MAJOR: u32 = 0;
/// Minor version of this library (`(packjit_version() >> 8) & 0xff`).
pub const PACKJIT_VERSION_MINOR: u32 = 1;
/// Patch version of this library (`packjit_version() & 0xff`).
pub const PACKJIT_VERSION_PATCH: u32 = 0;

/// `PackjitConfig::map_mode`: dual mapping when memfd works, RW/RX toggling otherwise.
pub const PACKJIT_MAP_AUTO: u32 = 0;
/// `PackjitConfig::map_mode`: one memfd mapped twice (RW view + RX view); fail if unavailable.
pub const PACKJIT_MAP_DUAL: u32 = 1;
/// `PackjitConfig::map_mode`: one anonymous mapping, RW while filled, RX (sealed) once committed.
pub const PACKJIT_MAP_TOGGLE: u32 = 2;

/// `PackjitConfig::remap_policy`: decide with a start-up self-probe (remap under qemu-user).
pub const PACKJIT_REMAP_AUTO: u32 = 0;
/// `PackjitConfig::remap_policy`: always remap touched executable pages on commit.
pub const PACKJIT_REMAP_ALWAYS: u32 = 1;
/// `PackjitConfig::remap_policy`: never remap (rely on cache maintenance alone).
pub const PACKJIT_REMAP_NEVER: u32 = 2;

/// `PackjitLoadOptions::flags`: use `features` exactly instead of what the CPU offers.
pub const PACKJIT_LOAD_FEATURES_EXACT: u32 = 1;
/// `PackjitLoadOptions::flags`: compile trusted code, without the sandbox's memory checks.
/// The caller promises every address the program computes is memory it may access (as after
/// the kernel's verifier). Without this flag programs are sandboxed: every access is checked
/// against the context, the program's stack, and the registered regions, and a stray access
/// stops the program with `PJ_ERR_OUT_OF_BOUNDS` instead of touching host memory.
pub const PACKJIT_LOAD_TRUSTED: u32 = 2;
/// `PackjitLoadOptions::flags`: count an instruction budget; every run gets
/// `PackjitLoadOptions::budget` instructions and stops with `PJ_ERR_BUDGET` when they run out
/// (a taken backward jump from pc s to pc t charges s - t + 1, a bpf-to-bpf call 1).
pub const PACKJIT_LOAD_BUDGET: u32 = 4;
/// `PackjitLoadOptions::flags`: blind immediates with a random per-program key, so constants
/// chosen by whoever wrote the program never appear verbatim in executable memory.
pub const PACKJIT_LOAD_BLIND_CONSTANTS: u32 = 8;
/// `PackjitLoadOptions::flags`: accept packjit's internal per-CPU address instruction
/// (`BPF_ALU64 | BPF_MOV | BPF_X` with `off = -1`, `imm` = an id from
/// `packjit_runtime_add_percpu_array`): `dst = src + cpu * slot_size` of that array, or
/// `dst = src` when the id is unknown to this load or the CPU is past the array's CPUs.
/// Without this flag the encoding is refused (a reserved `off`).
pub const PACKJIT_LOAD_PERCPU_INSN: u32 = 16;
const PACKJIT_LOAD_ALL_FLAGS: u32 = PACKJIT_LOAD_FEATURES_EXACT
    | PACKJIT_LOAD_TRUSTED
    | PACKJIT_LOAD_BUDGET
    | PACKJIT_LOAD_BLIND_CONSTANTS
    | PACKJIT_LOAD_PERCPU_INSN;

/// Capacity, including the NUL, of the name fields of the info structs.
pub const PACKJIT_NAME_LEN: usize = 64;
/// Capacity, including the NUL, of `PackjitBackendInfo::origin`.
pub const PACKJIT_PATH_LEN: usize = 256;

const RUNTIME_MAGIC: u64 = 0x706a_5f72_756e_7431; // "pj_runt1"
const PROGRAM_MAGIC: u64 = 0x706a_5f70_726f_6731; // "pj_prog1"
const DEAD_MAGIC: u64 = 0x706a_5f64_6561_6421; // "pj_dead!"

/// Runtime configuration, read by `packjit_runtime_create`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitConfig {
    /// `sizeof(PackjitConfig)`.
    pub struct_size: u32,
    /// One of the `PACKJIT_MAP_*` values.
    pub map_mode: u32,
    /// One of the `PACKJIT_REMAP_*` values.
    pub remap_policy: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Size of one code pack in bytes; 0 = the default (2 MiB). Rounded up to whole pages.
    pub pack_size: u64,
    /// Directory searched by `packjit_load_plugins` / `packjit_load_host_plugin` when they
    /// are given NULL; NULL = the defaults (`$PACKJIT_PLUGIN_DIR`, else the executable's
    /// directory and its parent). Borrowed: copied during `packjit_runtime_create`, so the
    /// caller may free it as soon as that call returns.
    pub plugin_dir: *const c_char,
}

/// Per-load options, read by `packjit_program_load` and `packjit_program_load_batch`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitLoadOptions {
    /// `sizeof(PackjitLoadOptions)`.
    pub struct_size: u32,
    /// Target architecture, a `PJ_ARCH_*` code; 0 = the host's. Programs for another
    /// architecture are compiled (for inspection and dumping) but cannot be run.
    pub arch: u32,
    /// `PACKJIT_LOAD_*` flags.
    pub flags: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// With `PACKJIT_LOAD_FEATURES_EXACT`: the exact optional-feature bits to use. Otherwise
    /// ignored (the CPU's features are used on the host arch, none for a foreign arch).
    pub features: u64,
    /// Feature bits to leave out (e.g. arm64 bit 0 forces the LSE-less atomics).
    pub disabled_features: u64,
    /// With `PACKJIT_LOAD_BUDGET`: instructions each run may execute.
    pub budget: u64,
    /// Host regions this program may access besides its context and stack (in addition to
    /// those of `packjit_runtime_add_region`), `region_count` entries; NULL when 0. Copied
    /// during the load; the memory they describe must stay valid while the program can run.
    pub regions: *const PjMemRegion,
    /// Number of entries in `regions`.
    pub region_count: u64,
}

impl Default for PackjitLoadOptions {
    fn default() -> Self {
        Self {
            struct_size: 0,
            arch: 0,
            flags: 0,
            reserved: 0,
            features: 0,
            disabled_features: 0,
            budget: 0,
            regions: core::ptr::null(),
            region_count: 0,
        }
    }
}

/// Code arena statistics, filled by `packjit_runtime_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PackjitArenaStats {
    /// `sizeof(PackjitArenaStats)`, set by the caller.
    pub struct_size: u32,
    /// 1 when packs are dual-mapped (memfd RW + RX views), 0 when toggled.
    pub dual_mapped: u32,
    /// 1 when commits remap the touched executable pages (stale-code workaround).
    pub remap_on_commit: u32,
    /// Free space not in the largest free run of its pack, per mille of all free space.
    pub fragmentation_permille: u32,
    /// Packs currently mapped.
    pub packs: u64,
    /// Bytes of address space held by packs.
    pub bytes_reserved: u64,
    /// Bytes handed out to programs (64-byte granularity).
    pub bytes_used: u64,
    /// Bytes of machine code written into live regions.
    pub bytes_code: u64,
    /// Live allocations (programs).
    pub allocations: u64,
    /// Commits performed (one per load, one per batch).
    pub commits: u64,
    /// Instruction-cache maintenance passes.
    pub icache_flushes: u64,
    /// Page ranges remapped for stale-code invalidation.
    pub remaps: u64,
    /// Freed regions still waiting for running threads to leave.
    pub pending_frees: u64,
    /// Bytes of pack memory made resident (pages trap-filled because code was placed in
    /// them); the rest of each pack is untouched demand-zero memory.
    pub bytes_resident: u64,
}

/// What a program is, filled by `packjit_program_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitProgramInfo {
    /// `sizeof(PackjitProgramInfo)`, set by the caller.
    pub struct_size: u32,
    /// `PJ_ARCH_*` code of the native code.
    pub arch: u32,
    /// 1 when `packjit_program_run` can run it in this process.
    pub executable: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Optional-feature bits the code uses.
    pub features: u64,
    /// Address of the entry point now (in the code arena for executable programs). For tools
    /// only: calling it directly bypasses the deferred-free protection unless the caller
    /// brackets reading it and the call with `packjit_epoch_enter` / `packjit_epoch_exit`.
    /// The arena's compaction may move the code later (the old copy stays valid until such a
    /// bracket ends); `packjit_program_entry` pins it for good.
    pub entry_addr: u64,
    /// Bytes of native code.
    pub code_size: u64,
    /// Native instructions emitted.
    pub native_insns: u64,
    /// NUL-terminated name of the backend that compiled it (truncated to fit).
    pub backend: [c_char; PACKJIT_NAME_LEN],
}

impl Default for PackjitProgramInfo {
    /// All zero with `struct_size` set: what `packjit_program_info` expects to be handed.
    fn default() -> Self {
        PackjitProgramInfo {
            struct_size: size_of::<PackjitProgramInfo>() as u32,
            arch: 0,
            executable: 0,
            reserved: 0,
            features: 0,
            entry_addr: 0,
            code_size: 0,
            native_insns: 0,
            backend: [0; PACKJIT_NAME_LEN],
        }
    }
}

/// [`PackjitBuiltins`]: the built-in helper is inlined into the code.
pub const PACKJIT_BUILTIN_INLINE: u32 = 1;
/// [`PackjitBuiltins`]: the built-in helper is a call (`sched_getcpu` /
/// `clock_gettime(CLOCK_MONOTONIC)`).
pub const PACKJIT_BUILTIN_CALL: u32 = 2;
/// [`PackjitBuiltins`]: the host registered its own helper under the id; it is called.
pub const PACKJIT_BUILTIN_HOST: u32 = 3;
/// [`PackjitBuiltins`]: the program was loaded without the built-ins.
pub const PACKJIT_BUILTIN_NONE: u32 = 0;

/// How the built-in helpers `bpf_get_smp_processor_id` (id 8) and `bpf_ktime_get_ns`
/// (id 5) are carried out, filled by `packjit_runtime_builtins` (what a load gets now) and
/// `packjit_program_builtins` (what a program got).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PackjitBuiltins {
    /// `sizeof(PackjitBuiltins)`, set by the caller.
    pub struct_size: u32,
    /// `PACKJIT_BUILTIN_*` of helper 8 (inline = one load of the rseq `cpu_id`).
    pub cpu_id: u32,
    /// `PACKJIT_BUILTIN_*` of helper 5 (inline = the CPU counter, scaled).
    pub clock: u32,
    /// `PACKJIT_BUILTIN_*` of the per-CPU array lookup (`PJ_HELPER_PERCPU_LOOKUP`).
    pub percpu_lookup: u32,
    /// With `cpu_id == PACKJIT_BUILTIN_INLINE`: offset of `cpu_id` from the thread pointer.
    pub rseq_offset: i64,
    /// With `clock == PACKJIT_BUILTIN_INLINE`: the counter frequency in Hz.
    pub clock_hz: u64,
}

fn builtins_to_c(b: Option<packjit_runtime::BuiltinChoice>) -> PackjitBuiltins {
    use packjit_runtime::{ClockImpl, CpuIdImpl, PerCpuLookupImpl};
    let mut o = PackjitBuiltins {
        struct_size: size_of::<PackjitBuiltins>() as u32,
        ..Default::default()
    };
    if let Some(b) = b {
        o.cpu_id = match b.cpu_id {
            CpuIdImpl::InlineRseq { offset } => {
                o.rseq_offset = offset;
                PACKJIT_BUILTIN_INLINE
            }
            CpuIdImpl::CallSchedGetcpu => PACKJIT_BUILTIN_CALL,
            CpuIdImpl::Host => PACKJIT_BUILTIN_HOST,
        };
        o.clock = match b.clock {
            ClockImpl::InlineCounter { hz, .. } => {
                o.clock_hz = hz;
                PACKJIT_BUILTIN_INLINE
            }
            ClockImpl::CallClockGettime => PACKJIT_BUILTIN_CALL,
            ClockImpl::Host => PACKJIT_BUILTIN_HOST,
        };
        o.percpu_lookup = match b.percpu_lookup {
            PerCpuLookupImpl::Inline => PACKJIT_BUILTIN_INLINE,
            PerCpuLookupImpl::CallSchedGetcpu => PACKJIT_BUILTIN_CALL,
            PerCpuLookupImpl::Host => PACKJIT_BUILTIN_HOST,
        };
    }
    o
}

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

/// An opaque runtime: backends, helpers and the packed code arena. Thread-safe: every
/// function taking a `PackjitRuntime *` may be called from several threads at once.
pub struct PackjitRuntime {
    magic: AtomicU64,
    rt: Arc<Runtime>,
    plugin_dir: Option<PathBuf>,
}

/// An opaque compiled program. Thread-safe: any number of threads may run it at once, and
/// one may free it while others are running it.
pub struct PackjitProgram {
    magic: AtomicU64,
    /// Set by the first `packjit_program_free`; the handle stays usable (RCU-style) until
    /// the deferred drop, so only a second free is refused.
    freed: AtomicBool,
    prog: Program,
    // Keeps the backends and helpers the code refers to alive even after
    // packjit_runtime_destroy.
    _rt: Arc<Runtime>,
}

// ---------------------------------------------------------------------------------------
// Errors and the boundary.

/// Message capacity of the thread-local last error (longer messages are cut on a UTF-8
/// boundary).
const LAST_ERROR_LEN: usize = 1024;

struct LastError {
    code: i32,
    pc: i64,
    /// Address of a refused access (`PJ_ERR_OUT_OF_BOUNDS`), else 0.
    addr: u64,
    msg: [c_char; LAST_ERROR_LEN],
}

thread_local! {
    // A fixed buffer per thread, so the pointer packjit_last_error returns stays valid for
    // the thread's life (only its contents change).
    static LAST_ERROR: RefCell<LastError> = const {
        RefCell::new(LastError { code: PJ_OK, pc: -1, addr: 0, msg: [0; LAST_ERROR_LEN] })
    };
    // Guards taken by packjit_epoch_enter, released by packjit_epoch_exit.
    static EPOCH_GUARDS: RefCell<Vec<epoch::Guard>> = const { RefCell::new(Vec::new()) };
}

fn set_last(code: i32, pc: i64, msg: &str) {
    set_last_fault(code, pc, 0, msg)
}

fn set_last_fault(code: i32, pc: i64, addr: u64, msg: &str) {
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.code = code;
            l.pc = pc;
            l.addr = addr;
            packjit_plugin_api::write_c_message(&mut l.msg, msg);
        }
    });
}

fn record(e: &Error) -> i32 {
    let code = e.kind.code();
    set_last_fault(
        code,
        e.pc.map_or(-1, |p| p as i64),
        e.fault.map_or(0, |f| f.addr),
        &e.to_string(),
    );
    code
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs an exported function's body: catches panics, records the error, returns the status.
fn boundary(what: &str, f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last(PJ_OK, -1, "");
            PJ_OK
        }
        Ok(Err(e)) => record(&e),
        Err(p) => {
            set_last(
                PJ_ERR_PANIC,
                -1,
                &format!(
                    "{what}: panic caught at the C boundary: {}",
                    panic_message(&*p)
                ),
            );
            PJ_ERR_PANIC
        }
    }
}

/// Checks a caller-provided pointer.
///
/// # Safety
/// `p` must be NULL or valid for reads of `T` for `'a`.
unsafe fn arg<'a, T>(p: *const T, what: &str) -> Result<&'a T, Error> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if p.cast::<u8>().align_offset(align_of::<T>()) != 0 {
        return Err(invalid(format!("{what} is misaligned")));
    }
    // SAFETY: non-null and aligned; validity is the caller's contract.
    Ok(unsafe { &*p })
}

/// Checks a caller-provided output pointer.
///
/// # Safety
/// `p` must be NULL or valid for writes of `T` for `'a`.
unsafe fn out_arg<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Error> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if p.cast::<u8>().align_offset(align_of::<T>()) != 0 {
        return Err(invalid(format!("{what} is misaligned")));
    }
    // SAFETY: as above.
    Ok(unsafe { &mut *p })
}

/// Checks the `struct_size` word at the start of a versioned struct.
///
/// # Safety
/// `p` must be NULL or point to at least 4 readable bytes.
unsafe fn check_size<T>(p: *const T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if p.cast::<u8>().align_offset(align_of::<T>()) != 0 {
        return Err(invalid(format!("{what} is misaligned")));
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
unsafe fn c_path(p: *const c_char, what: &str) -> Result<PathBuf, Error> {
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
/// `p` must be NULL, or a pointer to a live (or recently freed, not yet reclaimed) runtime.
unsafe fn runtime<'a>(p: *const PackjitRuntime) -> Result<&'a PackjitRuntime, Error> {
    // SAFETY: forwarded.
    let rt = unsafe { arg(p, "runtime") }?;
    match rt.magic.load(Ordering::Acquire) {
        RUNTIME_MAGIC => Ok(rt),
        DEAD_MAGIC => Err(invalid("runtime was already destroyed")),
        _ => Err(invalid("runtime is not a PackjitRuntime handle")),
    }
}

/// # Safety
/// As `runtime`, for programs.
unsafe fn program<'a>(p: *const PackjitProgram) -> Result<&'a PackjitProgram, Error> {
    // SAFETY: forwarded.
    let prog = unsafe { arg(p, "program") }?;
    match prog.magic.load(Ordering::Acquire) {
        PROGRAM_MAGIC => Ok(prog),
        DEAD_MAGIC => Err(invalid("program was already freed")),
        _ => Err(invalid("program is not a PackjitProgram handle")),
    }
}

fn fill_name(dst: &mut [c_char], s: &str) {
    packjit_plugin_api::write_c_message(dst, s);
}

fn arch_from_code(code: u32, what: &str) -> Result<Option<Arch>, Error> {
    if code == 0 {
        return Ok(None);
    }
    Arch::from_code(code).map(Some).ok_or_else(|| {
        invalid(format!(
            "{what} {code} is not a PJ_ARCH_* code (1 = x86_64, 2 = aarch64, 3 = riscv64)"
        ))
    })
}

// ---------------------------------------------------------------------------------------
// Version and errors.

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

/// A short description of a status code ("ok", "invalid argument", ...). Returns a static
/// NUL-terminated string owned by the library (never NULL, never freed); unknown codes give
/// "unknown status code".
#[no_mangle]
pub extern "C" fn packjit_status_str(code: i32) -> *const c_char {
    let s: &'static CStr = match code {
        PJ_OK => c"ok",
        PJ_ERR_INVALID_ARGUMENT => c"invalid argument",
        PJ_ERR_VERIFY => c"bytecode rejected by the verifier",
        PJ_ERR_UNSUPPORTED => c"unsupported by the backend",
        PJ_ERR_UNKNOWN_HELPER => c"unknown helper",
        PJ_ERR_ENCODING => c"cannot be encoded for the target",
        PJ_ERR_ARENA => c"code arena exhausted",
        PJ_ERR_ABI => c"ABI mismatch",
        PJ_ERR_PANIC => c"panic caught at the boundary",
        PJ_ERR_PLUGIN => c"plugin could not be loaded",
        PJ_ERR_NOT_EXECUTABLE => c"program cannot run here",
        PJ_ERR_INTERNAL => c"internal error",
        PJ_ERR_OUT_OF_BOUNDS => c"memory access out of bounds",
        PJ_ERR_BUDGET => c"instruction budget exhausted",
        PJ_ERR_UNKNOWN_CALLX => c"callx to an unregistered helper id",
        _ => c"unknown status code",
    };
    s.as_ptr()
}

/// The message of the last failed packjit call on the calling thread ("" after a successful
/// call), e.g. "pc 3: unknown helper id 9". Never NULL.
///
/// Ownership: the buffer belongs to the library and to the calling thread; it stays
/// allocated for the thread's life, but its contents are overwritten by the next packjit
/// call on that thread, so copy it if you need it later. Do not free it.
#[no_mangle]
pub extern "C" fn packjit_last_error() -> *const c_char {
    LAST_ERROR
        // SAFETY: only the field's address is taken; the thread-local outlives the thread's
        // use of the pointer.
        .try_with(|l| unsafe { core::ptr::addr_of!((*l.as_ptr()).msg) }.cast::<c_char>())
        .unwrap_or(c"thread is exiting".as_ptr())
}

/// The status code of the last packjit call on the calling thread (`PJ_OK` after a success).
#[no_mangle]
pub extern "C" fn packjit_last_error_code() -> i32 {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map_or(PJ_ERR_INTERNAL, |l| l.code))
        .unwrap_or(PJ_ERR_INTERNAL)
}

/// The eBPF instruction index (in 8-byte slots) the last error on the calling thread is
/// about, or -1 when it is not about one instruction.
#[no_mangle]
pub extern "C" fn packjit_last_error_pc() -> i64 {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map_or(-1, |l| l.pc))
        .unwrap_or(-1)
}

/// The address of the access refused by the last `PJ_ERR_OUT_OF_BOUNDS` on the calling
/// thread (0 for other errors).
#[no_mangle]
pub extern "C" fn packjit_last_error_addr() -> u64 {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map_or(0, |l| l.addr))
        .unwrap_or(0)
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

// ---------------------------------------------------------------------------------------
// Runtime.

/// Fills `*cfg` with the defaults (auto map mode, auto remap, 2 MiB packs, default plugin
/// directories) and sets `struct_size`.
///
/// # Safety
/// `cfg` must be NULL or point to writable memory for a `PackjitConfig` (borrowed for the
/// call only).
#[no_mangle]
pub unsafe extern "C" fn packjit_config_init(cfg: *mut PackjitConfig) -> i32 {
    boundary("packjit_config_init", || {
        // SAFETY: caller contract.
        let cfg = unsafe { out_arg(cfg, "cfg") }?;
        *cfg = PackjitConfig {
            struct_size: size_of::<PackjitConfig>() as u32,
            map_mode: PACKJIT_MAP_AUTO,
            remap_policy: PACKJIT_REMAP_AUTO,
            reserved: 0,
            pack_size: 0,
            plugin_dir: core::ptr::null(),
        };
        Ok(())
    })
}

/// Creates a runtime. `cfg` may be NULL for the defaults. On success `*out` receives a new
/// runtime (ownership passes to the caller, who releases it with
/// `packjit_runtime_destroy`); on failure `*out` is set to NULL.
///
/// # Safety
/// `cfg` must be NULL or point to a `PackjitConfig` (borrowed for the call; `plugin_dir` is
/// copied). `out` must be NULL or point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_create(
    cfg: *const PackjitConfig,
    out: *mut *mut PackjitRuntime,
) -> i32 {
    boundary("packjit_runtime_create", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        let mut arena = ArenaConfig::default();
        let mut plugin_dir = None;
        if !cfg.is_null() {
            // SAFETY: caller contract.
            unsafe { check_size(cfg, "cfg") }?;
            // SAFETY: size checked.
            let c = unsafe { &*cfg };
            arena.map_mode = match c.map_mode {
                PACKJIT_MAP_AUTO => MapMode::Auto,
                PACKJIT_MAP_DUAL => MapMode::DualMapping,
                PACKJIT_MAP_TOGGLE => MapMode::Toggle,
                m => {
                    return Err(invalid(format!(
                        "cfg->map_mode {m} is not a PACKJIT_MAP_* value"
                    )))
                }
            };
            arena.remap = match c.remap_policy {
                PACKJIT_REMAP_AUTO => RemapPolicy::Auto,
                PACKJIT_REMAP_ALWAYS => RemapPolicy::Always,
                PACKJIT_REMAP_NEVER => RemapPolicy::Never,
                m => {
                    return Err(invalid(format!(
                        "cfg->remap_policy {m} is not a PACKJIT_REMAP_* value"
                    )))
                }
            };
            if c.pack_size != 0 {
                // 1 GiB is far beyond any sensible pack; a larger value is almost
                // certainly a unit mistake, and would reserve that much address space.
                if c.pack_size > 1 << 30 {
                    return Err(invalid(format!(
                        "cfg->pack_size {} exceeds the 1 GiB limit",
                        c.pack_size
                    )));
                }
                arena.pack_size = c.pack_size as usize;
            }
            if !c.plugin_dir.is_null() {
                // SAFETY: NUL-terminated per the contract.
                plugin_dir = Some(unsafe { c_path(c.plugin_dir, "cfg->plugin_dir") }?);
            }
        }
        let rt = Runtime::with_config(RuntimeConfig { arena })?;
        *out = Box::into_raw(Box::new(PackjitRuntime {
            magic: AtomicU64::new(RUNTIME_MAGIC),
            rt: Arc::new(rt),
            plugin_dir,
        }));
        Ok(())
    })
}

/// Number of freed program handles whose deferred drop has not run yet.
static PENDING_HANDLES: AtomicUsize = AtomicUsize::new(0);

/// Drives deferred frees (program handles and code regions) until none is pending or about
/// a second has passed (another thread may be pinned); returns how many arena frees remain.
fn drain(rt: &Runtime) -> usize {
    packjit_runtime::arena::flush_epoch_until(|| PENDING_HANDLES.load(Ordering::Acquire) == 0);
    rt.reclaim()
}

/// Destroys a runtime. NULL is ignored. Programs still alive keep what they need (the
/// arena, backends and helpers) and remain runnable until each is freed; the plugin
/// libraries stay loaded until then. Waits briefly for deferred frees to finish so that a
/// clean shutdown leaves nothing behind. Destroying twice is detected while the memory is
/// still mapped (recorded as an error, otherwise ignored), but is a caller bug.
///
/// # Safety
/// `rt` must be NULL or a handle from `packjit_runtime_create`; it must not be used again.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_destroy(rt: *mut PackjitRuntime) {
    if rt.is_null() {
        return;
    }
    boundary("packjit_runtime_destroy", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if h.magic.swap(DEAD_MAGIC, Ordering::AcqRel) != RUNTIME_MAGIC {
            return Err(invalid("runtime was destroyed concurrently"));
        }
        // SAFETY: created by Box::into_raw in packjit_runtime_create; the magic swap makes
        // this the only destroy.
        let h = unsafe { Box::from_raw(rt) };
        drain(&h.rt);
        drop(h);
        Ok(())
    });
}

/// Statistics of the runtime's executable code arena (zeroes on a host architecture
/// without one).
///
/// # Safety
/// `rt` must be NULL or a live runtime; `out` must be NULL or point to a
/// `PackjitArenaStats` whose `struct_size` the caller has set.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_stats(
    rt: *const PackjitRuntime,
    out: *mut PackjitArenaStats,
) -> i32 {
    boundary("packjit_runtime_stats", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        unsafe { check_size(out, "out") }?;
        let s: ArenaStats = h.rt.stats();
        // SAFETY: checked above.
        unsafe {
            *out = PackjitArenaStats {
                struct_size: size_of::<PackjitArenaStats>() as u32,
                dual_mapped: s.dual_mapped as u32,
                remap_on_commit: s.remap_on_commit as u32,
                fragmentation_permille: s.fragmentation_permille,
                packs: s.packs as u64,
                bytes_reserved: s.bytes_reserved as u64,
                bytes_used: s.bytes_used as u64,
                bytes_code: s.bytes_code as u64,
                allocations: s.allocations as u64,
                commits: s.commits,
                icache_flushes: s.icache_flushes,
                remaps: s.remaps,
                pending_frees: s.pending_frees as u64,
                bytes_resident: s.bytes_resident as u64,
            }
        };
        Ok(())
    })
}

/// Runs deferred frees whose grace period has ended (waiting up to about a second for
/// threads still running freed code). `pending` (may be NULL) receives the number of code
/// regions still waiting.
///
/// # Safety
/// `rt` must be NULL or a live runtime; `pending` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_reclaim(rt: *const PackjitRuntime, pending: *mut u64) -> i32 {
    boundary("packjit_reclaim", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        let left = drain(&h.rt);
        if !pending.is_null() {
            // SAFETY: caller contract.
            *unsafe { out_arg(pending, "pending") }? = left as u64;
        }
        Ok(())
    })
}

/// Sets the code arena's compaction (moving live programs into holes so free space stays
/// in one run per pack; on by default): code moves while fragmentation is above
/// `threshold_permille`: at most `step_bytes` per free or hook swap that finds chunks
/// released (loads leave that step to them), and up to the limit given to
/// `packjit_runtime_compact`. `step_bytes` 0 = frees and swaps move nothing, only
/// `packjit_runtime_compact` does;
/// `threshold_permille` 1000 or more turns compaction off.
/// Programs whose raw entry was taken (`packjit_program_entry`) never move. No effect when
/// the arena is not dual-mapped.
///
/// # Safety
/// `rt` must be NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_set_compaction(
    rt: *const PackjitRuntime,
    threshold_permille: u32,
    step_bytes: u64,
) -> i32 {
    boundary("packjit_runtime_set_compaction", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if let Some(a) = h.rt.arena() {
            a.set_compaction(
                (threshold_permille < 1000).then(|| packjit_runtime::Compaction {
                    threshold_permille,
                    step_bytes: usize::try_from(step_bytes).unwrap_or(usize::MAX),
                }),
            );
        }
        Ok(())
    })
}

/// A compaction step the host can schedule (e.g. when idle): moves up to `max_bytes` of
/// program code while fragmentation is above the threshold, in one commit. `moved` (may be
/// NULL) receives the bytes moved.
///
/// # Safety
/// `rt` must be NULL or a live runtime; `moved` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_compact(
    rt: *const PackjitRuntime,
    max_bytes: u64,
    moved: *mut u64,
) -> i32 {
    boundary("packjit_runtime_compact", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        let n =
            h.rt.compact(usize::try_from(max_bytes).unwrap_or(usize::MAX));
        if !moved.is_null() {
            // SAFETY: caller contract.
            *unsafe { out_arg(moved, "moved") }? = n as u64;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Plugins.

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

// ---------------------------------------------------------------------------------------
// Helpers.

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

// ---------------------------------------------------------------------------------------
// Programs.

/// Registers host memory every program loaded from now on may access under the sandbox
/// (read-only, or read-write with `PJ_REGION_WRITABLE`). Programs loaded earlier keep the
/// regions they were loaded with.
///
/// # Safety
/// `rt` NULL or live; `region` NULL or readable. The memory the region describes must stay
/// valid (and writable, for a writable region) while any program loaded after this call can
/// run.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_add_region(
    rt: *const PackjitRuntime,
    region: *const PjMemRegion,
) -> i32 {
    boundary("packjit_runtime_add_region", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let r = unsafe { arg(region, "region") }?;
        h.rt.add_region(region_from_c(r, "region")?);
        Ok(())
    })
}

/// Fills `*opts` with the defaults (host arch, CPU features) and sets `struct_size`.
///
/// # Safety
/// `opts` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_load_options_init(opts: *mut PackjitLoadOptions) -> i32 {
    boundary("packjit_load_options_init", || {
        // SAFETY: caller contract.
        let o = unsafe { out_arg(opts, "opts") }?;
        *o = PackjitLoadOptions {
            struct_size: size_of::<PackjitLoadOptions>() as u32,
            ..Default::default()
        };
        Ok(())
    })
}

/// # Safety
/// `opts` NULL or a `PackjitLoadOptions`.
unsafe fn load_options(opts: *const PackjitLoadOptions) -> Result<(LoadOptions, Trust), Error> {
    if opts.is_null() {
        return Ok((LoadOptions::default(), Trust::Sandboxed));
    }
    // SAFETY: caller contract.
    unsafe { check_size(opts, "opts") }?;
    // SAFETY: checked.
    let o = unsafe { &*opts };
    if o.flags & !PACKJIT_LOAD_ALL_FLAGS != 0 {
        return Err(invalid(format!(
            "opts->flags {:#x}: unknown bits {:#x}",
            o.flags,
            o.flags & !PACKJIT_LOAD_ALL_FLAGS
        )));
    }
    if o.regions.is_null() && o.region_count != 0 {
        return Err(invalid(format!(
            "opts->regions is NULL but opts->region_count is {}",
            o.region_count
        )));
    }
    let regions = if o.region_count == 0 {
        Vec::new()
    } else {
        // SAFETY: caller contract: `region_count` readable entries.
        let raw = unsafe { std::slice::from_raw_parts(o.regions, o.region_count as usize) };
        raw.iter()
            .enumerate()
            .map(|(i, r)| region_from_c(r, &format!("opts->regions[{i}]")))
            .collect::<Result<_, _>>()?
    };
    Ok((
        LoadOptions {
            arch: arch_from_code(o.arch, "opts->arch")?,
            features: (o.flags & PACKJIT_LOAD_FEATURES_EXACT != 0).then_some(o.features),
            disable_features: o.disabled_features,
            budget: (o.flags & PACKJIT_LOAD_BUDGET != 0).then_some(o.budget),
            blind_constants: o.flags & PACKJIT_LOAD_BLIND_CONSTANTS != 0,
            percpu_insn: o.flags & PACKJIT_LOAD_PERCPU_INSN != 0,
            regions,
            ..Default::default()
        },
        if o.flags & PACKJIT_LOAD_TRUSTED != 0 {
            Trust::Trusted
        } else {
            Trust::Sandboxed
        },
    ))
}

/// A C region description as a runtime region.
///
/// The C caller's promise about the memory (documented on `PjMemRegion` users) is what makes
/// building the `MemRegion` sound.
fn region_from_c(r: &PjMemRegion, what: &str) -> Result<MemRegion, Error> {
    if r.flags & !PJ_REGION_WRITABLE != 0 {
        return Err(invalid(format!(
            "{what}.flags {:#x}: unknown bits {:#x}",
            r.flags,
            r.flags & !PJ_REGION_WRITABLE
        )));
    }
    if r.start.checked_add(r.len).is_none() {
        return Err(invalid(format!(
            "{what}: start {:#x} + len {:#x} wraps around",
            r.start, r.len
        )));
    }
    let access = if r.flags & PJ_REGION_WRITABLE != 0 {
        RegionAccess::ReadWrite
    } else {
        RegionAccess::ReadOnly
    };
    // SAFETY: the C API's contract (packjit_runtime_add_region, PackjitLoadOptions::regions):
    // the caller keeps the memory valid while programs given it can run.
    Ok(unsafe { MemRegion::new(r.start as *const u8, r.len as usize, access) })
}

/// # Safety
/// `code` NULL or valid for `len` bytes.
unsafe fn bytes<'a>(code: *const u8, len: usize, what: &str) -> Result<&'a [u8], Error> {
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

fn new_program(rt: &Arc<Runtime>, prog: Program) -> *mut PackjitProgram {
    Box::into_raw(Box::new(PackjitProgram {
        magic: AtomicU64::new(PROGRAM_MAGIC),
        freed: AtomicBool::new(false),
        prog,
        _rt: rt.clone(),
    }))
}

/// Verifies, compiles and commits one program. `code` holds `code_len` bytes of eBPF
/// (little-endian 8-byte instructions); it is only read during the call. `opts` may be NULL
/// for the defaults. On success `*out` receives a new program (owned by the caller, released
/// with `packjit_program_free`); on failure `*out` is NULL and the last error names the pc
/// and the reason (e.g. `PJ_ERR_VERIFY`, `PJ_ERR_UNKNOWN_HELPER`, `PJ_ERR_UNSUPPORTED`).
///
/// # Safety
/// `rt` NULL or live; `code` NULL or readable for `code_len` bytes; `opts` NULL or a
/// `PackjitLoadOptions` with `struct_size` set; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_load(
    rt: *const PackjitRuntime,
    code: *const u8,
    code_len: usize,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
) -> i32 {
    boundary("packjit_program_load", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        // SAFETY: caller contract.
        let code = unsafe { bytes(code, code_len, "code") }?;
        let prog = match trust {
            Trust::Sandboxed => h.rt.load(code, &opts)?,
            // SAFETY: PACKJIT_LOAD_TRUSTED is the C caller's promise that the program only
            // touches memory it may (see the flag's documentation).
            Trust::Trusted => unsafe { h.rt.load_trusted(code, &opts) }?,
        };
        *out = new_program(&h.rt, prog);
        Ok(())
    })
}

/// # Safety
/// `p` NULL or NUL-terminated.
unsafe fn c_name(p: *const c_char, what: &str) -> Result<Option<String>, Error> {
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

/// Loads one program from a relocatable eBPF object (`clang -O2 -target bpf -c`, `obj_len`
/// bytes, read during the call only). Select the program with exactly one of `section` (a
/// code section name, e.g. `"xdp"`; the entry is its first instruction) or `function` (a
/// function symbol); the other must be NULL. Functions it calls are linked in, `extern`
/// functions resolve to the helpers registered under their names, and the object's
/// `.rodata*` / `.data*` / `.bss*` are copied into memory the program owns (read-only /
/// read-write regions under the sandbox); read and write them with
/// `packjit_program_global_*`. `opts` as for `packjit_program_load`. Errors name the
/// section, symbol, relocation type and offset (e.g. `PJ_ERR_UNKNOWN_HELPER` for an
/// unresolved extern, `PJ_ERR_UNSUPPORTED` for maps or unknown relocations,
/// `PJ_ERR_INVALID_ARGUMENT` for malformed objects).
///
/// # Safety
/// `rt` NULL or live; `obj` NULL or readable for `obj_len` bytes; `section` and `function`
/// NULL or NUL-terminated; `opts` NULL or a `PackjitLoadOptions` with `struct_size` set;
/// `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_load_elf(
    rt: *const PackjitRuntime,
    obj: *const u8,
    obj_len: usize,
    section: *const c_char,
    function: *const c_char,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
) -> i32 {
    boundary("packjit_program_load_elf", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        // SAFETY: caller contract.
        let obj = unsafe { bytes(obj, obj_len, "obj") }?;
        // SAFETY: caller contract.
        let sel = match unsafe { (c_name(section, "section")?, c_name(function, "function")?) } {
            (Some(s), None) => ElfLoadOptions::section(&s),
            (None, Some(f)) => ElfLoadOptions::function(&f),
            _ => {
                return Err(invalid(
                    "give exactly one of section and function (the other NULL)",
                ))
            }
        };
        let prog = match trust {
            Trust::Sandboxed => h.rt.load_elf(obj, &sel, &opts)?,
            // SAFETY: PACKJIT_LOAD_TRUSTED is the C caller's promise that the program only
            // touches memory it may (see the flag's documentation).
            Trust::Trusted => unsafe { h.rt.load_elf_trusted(obj, &sel, &opts) }?,
        };
        *out = new_program(&h.rt, prog);
        Ok(())
    })
}

/// # Safety
/// `prog` NULL or live; `name` NULL or NUL-terminated.
unsafe fn globals_of<'a>(
    prog: *const PackjitProgram,
    name: *const c_char,
) -> Result<(&'a GlobalData, String), Error> {
    // SAFETY: caller contract.
    let p = &unsafe { program(prog) }?.prog;
    // SAFETY: caller contract.
    let name = unsafe { c_name(name, "name") }?.ok_or_else(|| invalid("name is NULL"))?;
    let g = p
        .globals()
        .ok_or_else(|| invalid("program was not loaded from an ELF object: it has no globals"))?;
    Ok((g, name))
}

/// Size in bytes of a program's global data `name`: a section (`".data"`, `".bss"`,
/// `".rodata"`, ...) or a data symbol (a global or static variable). Sections win when a
/// symbol has the same name.
///
/// # Safety
/// `prog` NULL or live; `name` NULL (refused) or NUL-terminated; `size` NULL (refused) or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_global_size(
    prog: *const PackjitProgram,
    name: *const c_char,
    size: *mut usize,
) -> i32 {
    boundary("packjit_program_global_size", || {
        // SAFETY: caller contract.
        let size = unsafe { out_arg(size, "size") }?;
        // SAFETY: caller contract.
        let (g, name) = unsafe { globals_of(prog, name) }?;
        *size = g.size_of(&name)?;
        Ok(())
    })
}

/// Copies `len` bytes at `offset` of global data `name` (section or symbol, as for
/// `packjit_program_global_size`) into `buf`. The range must lie inside it. Safe while other
/// threads run the program (bytes are copied one by one with relaxed atomics: a value the
/// program is writing at the same time may be torn).
///
/// # Safety
/// `prog` NULL or live; `name` NULL (refused) or NUL-terminated; `buf` NULL (only with `len`
/// 0) or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_global_read(
    prog: *const PackjitProgram,
    name: *const c_char,
    offset: usize,
    buf: *mut u8,
    len: usize,
) -> i32 {
    boundary("packjit_program_global_read", || {
        // SAFETY: caller contract.
        let (g, name) = unsafe { globals_of(prog, name) }?;
        if buf.is_null() && len != 0 {
            return Err(invalid(format!("buf is NULL but len is {len}")));
        }
        let mut tmp = vec![0u8; len];
        g.read_into(&name, offset, &mut tmp)?;
        if len != 0 {
            // SAFETY: caller contract: `buf` writable for `len` bytes.
            unsafe { core::ptr::copy_nonoverlapping(tmp.as_ptr(), buf, len) };
        }
        Ok(())
    })
}

/// Writes `len` bytes from `data` at `offset` of global data `name` (section or symbol). The
/// host may write `.rodata` too (it is read-only for the program only), e.g. to set a table
/// before the first run.
///
/// # Safety
/// `prog` NULL or live; `name` NULL (refused) or NUL-terminated; `data` NULL (only with
/// `len` 0) or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_global_write(
    prog: *const PackjitProgram,
    name: *const c_char,
    offset: usize,
    data: *const u8,
    len: usize,
) -> i32 {
    boundary("packjit_program_global_write", || {
        // SAFETY: caller contract.
        let (g, name) = unsafe { globals_of(prog, name) }?;
        // SAFETY: caller contract.
        let data = unsafe { bytes(data, len, "data") }?;
        g.write(&name, offset, data)
    })
}

/// Compiles `count` programs and commits them together (one protection/remap pass and one
/// instruction-cache pass for the whole batch). Program `i` is `codes[i]`, `code_lens[i]`
/// bytes. Every `out[i]` is written: a new program (owned by the caller, released with
/// `packjit_program_free`) or NULL when that program failed. `errors` may be NULL; otherwise
/// `errors[i]` receives program `i`'s status, pc and message (`code == PJ_OK` on success).
/// Returns `PJ_OK` when all succeeded, else the first failure's status (the last error then
/// reads "program i: pc N: ..."); the successful programs are returned even then.
///
/// # Safety
/// `rt` NULL or live; `codes` and `code_lens` NULL or arrays of `count` entries, each
/// `codes[i]` readable for `code_lens[i]` bytes (read during the call only); `opts` as for
/// `packjit_program_load`; `out` NULL or writable for `count` pointers; `errors` NULL or
/// writable for `count` `PjError`s.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_load_batch(
    rt: *const PackjitRuntime,
    codes: *const *const u8,
    code_lens: *const usize,
    count: usize,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
    errors: *mut PjError,
) -> i32 {
    boundary("packjit_program_load_batch", || {
        if count == 0 {
            // SAFETY: caller contract.
            unsafe { runtime(rt) }?;
            return Ok(());
        }
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        if count > (isize::MAX as usize) / size_of::<PjError>() {
            return Err(invalid(format!("count {count} is too large")));
        }
        // SAFETY: caller contract: `count` writable slots.
        let out = unsafe { std::slice::from_raw_parts_mut(out, count) };
        out.fill(core::ptr::null_mut());
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        if codes.is_null() || code_lens.is_null() {
            return Err(invalid("codes or code_lens is NULL"));
        }
        // SAFETY: caller contract.
        let (ptrs, lens) = unsafe {
            (
                std::slice::from_raw_parts(codes, count),
                std::slice::from_raw_parts(code_lens, count),
            )
        };
        let mut slices = Vec::with_capacity(count);
        for (i, (&p, &l)) in ptrs.iter().zip(lens).enumerate() {
            // SAFETY: caller contract.
            slices.push(unsafe { bytes(p, l, &format!("codes[{i}]")) }?);
        }
        let results = match trust {
            Trust::Sandboxed => h.rt.load_batch(&slices, &opts),
            // SAFETY: as in packjit_program_load.
            Trust::Trusted => unsafe { h.rt.load_batch_trusted(&slices, &opts) },
        };
        let mut first: Option<Error> = None;
        for (i, r) in results.into_iter().enumerate() {
            let err = match r {
                Ok(prog) => {
                    out[i] = new_program(&h.rt, prog);
                    PjError::default()
                }
                Err(e) => {
                    let c = e.to_c();
                    if first.is_none() {
                        // The per-program pc is in errors[i]; the summary names both.
                        first = Some(Error::new(e.kind, format!("program {i}: {e}")));
                    }
                    c
                }
            };
            if !errors.is_null() {
                // SAFETY: caller contract: `count` writable entries.
                unsafe { errors.add(i).write(err) };
            }
        }
        first.map_or(Ok(()), Err)
    })
}

/// Runs a program with `ctx` as its context (r1 = ctx, r2 = ctx_len); `*r0` receives the
/// result. `ctx` may be NULL only with `ctx_len` 0. Fails with `PJ_ERR_NOT_EXECUTABLE` for a
/// program compiled for another architecture. A program that stops fails the call with
/// `PJ_ERR_OUT_OF_BOUNDS`, `PJ_ERR_BUDGET` or `PJ_ERR_UNKNOWN_CALLX`; the last error then
/// names the eBPF pc (`packjit_last_error_pc`) and, for memory, the address
/// (`packjit_last_error_addr`), the size and read/write. Safe to call from many threads at once, and
/// while another thread frees the program: the code and the handle stay valid until every
/// call that had started has returned.
///
/// # Safety
/// `prog` NULL or a live program. `ctx`/`ctx_len` must describe memory the program may read
/// and write (borrowed for the call); the program dereferences the addresses it computes,
/// unchecked unless the program is sandboxed (the default). `r0` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_run(
    prog: *const PackjitProgram,
    ctx: *mut c_void,
    ctx_len: usize,
    r0: *mut u64,
) -> i32 {
    boundary("packjit_program_run", || {
        // Pin before touching the handle: a concurrent packjit_program_free defers dropping
        // it (and its code) until this guard is gone.
        let _guard = packjit_runtime::arena::epoch_pin();
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        // SAFETY: caller contract.
        let r0 = unsafe { out_arg(r0, "r0") }?;
        if ctx.is_null() && ctx_len != 0 {
            return Err(invalid(format!("ctx is NULL but ctx_len is {ctx_len}")));
        }
        // SAFETY: caller contract on ctx; the epoch is pinned (call_raw pins again, cheaply).
        *r0 = unsafe { p.prog.call_raw(ctx.cast(), ctx_len) }?;
        Ok(())
    })
}

/// Frees a program. NULL is ignored. Safe while other threads use it, RCU-style: the handle
/// and the code stay valid until every thread that was inside `packjit_program_run` (or
/// inside `packjit_epoch_enter`/`packjit_epoch_exit`) when free was called has left, and
/// are released after that. So a host can unpublish the pointer, free it at once, and
/// readers that fetched it inside `packjit_epoch_enter`/`_exit` may still run it. A thread
/// that starts using the handle after free without such a bracket is a caller bug. A second
/// free of the same handle is refused (recorded as the last error, otherwise ignored) as
/// long as the handle has not been reclaimed yet.
///
/// # Safety
/// `prog` NULL or a handle from `packjit_program_load`/`_batch`.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_free(prog: *mut PackjitProgram) {
    if prog.is_null() {
        return;
    }
    boundary("packjit_program_free", || {
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        if p.freed.swap(true, Ordering::AcqRel) {
            return Err(invalid("program was already freed"));
        }
        struct Handle(*mut PackjitProgram);
        // SAFETY: PackjitProgram is Send (Program and Arc<Runtime> are); the raw pointer
        // only carries it to whichever thread runs the deferred drop.
        unsafe impl Send for Handle {}
        let handle = Handle(prog);
        let rt = p._rt.clone();
        PENDING_HANDLES.fetch_add(1, Ordering::AcqRel);
        let guard = epoch::pin();
        guard.defer(move || {
            let h = handle;
            // SAFETY: from Box::into_raw; the `freed` swap made this the only free, and the
            // epoch guarantees no pinned runner still holds it.
            let b = unsafe { Box::from_raw(h.0) };
            // A stale pointer used after this point (a caller bug) is then refused as long
            // as the allocator leaves the word alone.
            b.magic.store(DEAD_MAGIC, Ordering::Release);
            let PackjitProgram { prog, _rt, .. } = *b;
            // SAFETY: runners pin before touching the handle and run its program only
            // through it (or inside an epoch bracket), so the grace period that just ended
            // covers the code too. Only queued here: this may run inside any thread's pin.
            unsafe { prog.drop_after_own_grace() };
            drop(_rt);
            PENDING_HANDLES.fetch_sub(1, Ordering::AcqRel);
        });
        guard.flush();
        drop(guard);
        // What this flush ended (earlier frees' code): released here, with the compaction
        // step their holes call for, not left to the next load.
        if let Some(a) = rt.arena() {
            a.release_due();
        }
        Ok(())
    });
}

/// Pins the calling thread's epoch: programs freed from now on (code and handles) stay
/// valid until the matching `packjit_epoch_exit` on this thread. Nestable. Use it to
/// bracket "load the published program pointer, then run it" so that a concurrent
/// `packjit_program_free` cannot slip in between, or to call `entry_addr` directly.
#[no_mangle]
pub extern "C" fn packjit_epoch_enter() {
    let _ = catch_unwind(|| {
        let _ = EPOCH_GUARDS.try_with(|g| g.borrow_mut().push(epoch::pin()));
    });
}

/// Ends the innermost `packjit_epoch_enter` of the calling thread. Without one it does
/// nothing but record `PJ_ERR_INVALID_ARGUMENT` as the last error.
#[no_mangle]
pub extern "C" fn packjit_epoch_exit() {
    boundary("packjit_epoch_exit", || {
        let popped = EPOCH_GUARDS
            .try_with(|g| g.borrow_mut().pop())
            .ok()
            .flatten();
        popped
            .map(drop)
            .ok_or_else(|| invalid("packjit_epoch_exit without packjit_epoch_enter"))
    });
}

/// Describes a program.
///
/// # Safety
/// `prog` NULL or live; `info` NULL or a `PackjitProgramInfo` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_info(
    prog: *const PackjitProgram,
    info: *mut PackjitProgramInfo,
) -> i32 {
    boundary("packjit_program_info", || {
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        // SAFETY: caller contract.
        unsafe { check_size(info, "info") }?;
        let mut o = PackjitProgramInfo {
            struct_size: size_of::<PackjitProgramInfo>() as u32,
            arch: p.arch().code(),
            executable: p.is_executable() as u32,
            reserved: 0,
            features: p.features(),
            entry_addr: p.entry_addr(),
            code_size: p.code_size() as u64,
            native_insns: p.native_insns() as u64,
            backend: [0; PACKJIT_NAME_LEN],
        };
        fill_name(&mut o.backend, p.backend_name());
        // SAFETY: checked.
        unsafe { *info = o };
        Ok(())
    })
}

/// What the built-in helpers (ids 5 and 8) became in `prog`: inlined, called, or the
/// host's own helper (`PACKJIT_BUILTIN_*`). Code that cannot call the clock or the per-CPU
/// lookup (no `call` naming it, no `callx`) reports it as called: nothing was prepared to
/// inline it.
///
/// # Safety
/// `prog` NULL or live; `out` NULL or a `PackjitBuiltins` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_builtins(
    prog: *const PackjitProgram,
    out: *mut PackjitBuiltins,
) -> i32 {
    boundary("packjit_program_builtins", || {
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        // SAFETY: caller contract.
        unsafe { check_size(out, "out") }?;
        // SAFETY: checked.
        unsafe { *out = builtins_to_c(p.builtins()) };
        Ok(())
    })
}

/// What a load for the host architecture gets now for the built-in helpers (all
/// `PACKJIT_BUILTIN_NONE` when no host backend is loaded).
///
/// # Safety
/// `rt` NULL or live; `out` NULL or a `PackjitBuiltins` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_builtins(
    rt: *const PackjitRuntime,
    out: *mut PackjitBuiltins,
) -> i32 {
    boundary("packjit_runtime_builtins", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        unsafe { check_size(out, "out") }?;
        // SAFETY: checked.
        unsafe { *out = builtins_to_c(h.rt.builtins()) };
        Ok(())
    })
}

/// Registers a per-CPU array: `cpus` slots of `slot_size` bytes from `base`, each holding
/// `entries` values of `value_size` bytes. `*id` receives its id (process-wide), which
/// programs pass in r1 to the lookup helper `PJ_HELPER_PERCPU_LOOKUP` (r2 = element index;
/// r0 = this CPU's element or NULL). The memory becomes a read-write sandbox region for
/// programs loaded from now on.
///
/// # Safety
/// `rt` NULL or live; `id` NULL or writable; `cpus * slot_size` bytes from `base` must stay
/// valid and writable while any program loaded afterwards can run.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_add_percpu_array(
    rt: *const PackjitRuntime,
    base: *mut c_void,
    slot_size: u64,
    value_size: u64,
    entries: u64,
    cpus: u64,
    id: *mut u32,
) -> i32 {
    boundary("packjit_runtime_add_percpu_array", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let out = unsafe { out_arg(id, "id") }?;
        if base.is_null() {
            return Err(invalid("base is NULL"));
        }
        let size = |v: u64| usize::try_from(v).map_err(|_| invalid("size does not fit usize"));
        // SAFETY: forwarded from the caller's promise about the memory.
        *out = unsafe {
            h.rt.add_percpu_array(
                base.cast(),
                size(slot_size)?,
                size(value_size)?,
                size(entries)?,
                size(cpus)?,
            )
        }?;
        Ok(())
    })
}

/// Allows (`on != 0`, the default) or forbids inlining the built-in helpers in programs
/// loaded from now on (forbidden: they call `sched_getcpu` / `clock_gettime`).
///
/// # Safety
/// `rt` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_set_inline_builtins(
    rt: *const PackjitRuntime,
    on: u32,
) -> i32 {
    boundary("packjit_runtime_set_inline_builtins", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        h.rt.set_inline_builtins(on != 0);
        Ok(())
    })
}

/// Copies a program's native code into a caller buffer (for disassemblers and tools).
/// `*size` always receives the code size. With `buf` NULL (or `buf_len` 0) nothing is
/// copied and the call succeeds: use it to query the size first. With a buffer smaller than
/// the code nothing is copied and `PJ_ERR_INVALID_ARGUMENT` is returned.
///
/// # Safety
/// `prog` NULL or live; `buf` NULL or writable for `buf_len` bytes (borrowed for the call);
/// `size` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_code(
    prog: *const PackjitProgram,
    buf: *mut u8,
    buf_len: usize,
    size: *mut usize,
) -> i32 {
    boundary("packjit_program_code", || {
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        // SAFETY: caller contract.
        let size = unsafe { out_arg(size, "size") }?;
        let n = p.code_size();
        *size = n;
        if buf.is_null() || buf_len == 0 {
            return Ok(());
        }
        if buf_len < n {
            return Err(invalid(format!(
                "buffer of {buf_len} bytes is too small for {n} bytes of code"
            )));
        }
        let code = p.code();
        if code.len() != n {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "code of {n} bytes could not be read back ({} read)",
                    code.len()
                ),
            ));
        }
        // SAFETY: caller contract; n <= buf_len.
        unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), buf, n) };
        Ok(())
    })
}

/// Stores the program's entry point (`PjProgramEntry`: `uint64_t (*)(uint8_t *ctx, uint64_t
/// ctx_len)`) in `*entry`, for hosts that dispatch themselves. Fails with
/// `PJ_ERR_NOT_EXECUTABLE` (and stores NULL) when the program cannot run here. The pointer
/// is valid while the program lives (taking it pins the code: compaction never moves it);
/// a caller racing with `packjit_program_free` must hold `packjit_epoch_enter` around
/// fetching and calling it.
///
/// # Safety
/// `prog` NULL or live; `entry` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_entry(
    prog: *const PackjitProgram,
    entry: *mut PjProgramEntry,
) -> i32 {
    boundary("packjit_program_entry", || {
        // `Option<fn>` has the layout of a nullable C function pointer, so NULL can be
        // stored. SAFETY: caller contract.
        let entry = unsafe { out_arg(entry.cast::<Option<PjProgramEntry>>(), "entry") }?;
        *entry = None;
        // SAFETY: caller contract.
        let p = &unsafe { program(prog) }?.prog;
        *entry = Some(p.entry().ok_or_else(|| {
            Error::new(
                ErrorKind::NotExecutable,
                format!("program was compiled for {}, not for this host", p.arch()),
            )
        })?);
        Ok(())
    })
}

/// Test-only: a C API entry whose body panics, to prove the boundary turns a panic into
/// `PJ_ERR_PANIC` instead of unwinding into C (every exported function runs its body through
/// the same `boundary`). Compiled only into the crate's own tests, never into the library.
#[cfg(test)]
#[no_mangle]
pub extern "C" fn packjit_test_panic_inside() -> i32 {
    boundary("packjit_test_panic_inside", || {
        let v: Vec<u8> = Vec::new();
        // A real out-of-bounds index, the kind of bug the boundary exists for.
        let i = v.len() + 3;
        let _ = v[i];
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Hooks, batch attach and symbols.

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

/// What lies at a native address, filled by `packjit_symbolize` and `packjit_program_symbol`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitSymbol {
    /// `sizeof(PackjitSymbol)`, set by the caller.
    pub struct_size: u32,
    /// 1 when a live program covers the address (the other fields are then set), else 0.
    pub found: u32,
    /// Program id, unique within its runtime.
    pub id: u64,
    /// Entry address of the program's code.
    pub start: u64,
    /// Bytes of machine code.
    pub size: u64,
    /// Offset of the address from `start`.
    pub offset: u64,
    /// eBPF pc at the address (from the backend's line table), or -1 when unknown.
    pub pc: i64,
    /// NUL-terminated program name (`prog_<id>` unless named; truncated to fit).
    pub name: [c_char; PACKJIT_NAME_LEN],
}

impl Default for PackjitSymbol {
    /// Nothing found, with `struct_size` set: what `packjit_symbolize` and
    /// `packjit_program_symbol` expect to be handed, and what they report for no program.
    fn default() -> Self {
        PackjitSymbol {
            struct_size: size_of::<PackjitSymbol>() as u32,
            found: 0,
            id: 0,
            start: 0,
            size: 0,
            offset: 0,
            pc: -1,
            name: [0; PACKJIT_NAME_LEN],
        }
    }
}

/// # Safety
/// As `runtime`, for hooks.
unsafe fn hook<'a>(p: *const PackjitHook) -> Result<&'a PackjitHook, Error> {
    // SAFETY: forwarded.
    let h = unsafe { arg(p, "hook") }?;
    match h.magic.load(Ordering::Acquire) {
        HOOK_MAGIC => Ok(h),
        DEAD_MAGIC => Err(invalid("hook was already destroyed")),
        _ => Err(invalid("hook is not a PackjitHook handle")),
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
            // SAFETY: from Box::into_raw; the magic swap made this the only destroy, and
            // runners pinned before it have left by the time this runs.
            drop(unsafe { Box::from_raw(h.0) });
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
    boundary("packjit_hook_run", || {
        let _guard = packjit_runtime::arena::epoch_pin();
        // SAFETY: caller contract.
        let h = unsafe { hook(hook_) }?;
        // SAFETY: caller contract.
        let r0 = unsafe { out_arg(r0, "r0") }?;
        if ctx.is_null() && ctx_len != 0 {
            return Err(invalid(format!("ctx is NULL but ctx_len is {ctx_len}")));
        }
        let mem: &mut [u8] = if ctx_len == 0 {
            &mut []
        } else {
            // SAFETY: caller contract: ctx is readable and writable for ctx_len bytes.
            unsafe { std::slice::from_raw_parts_mut(ctx.cast(), ctx_len) }
        };
        match h.hook.run(mem) {
            Some(r) => *r0 = r?,
            None => {
                return Err(Error::new(
                    ErrorKind::NotExecutable,
                    "no program is attached to the hook",
                ))
            }
        }
        Ok(())
    })
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
/// freed again; it may not be in use by other threads at the time of the call. Fails with
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
        if p.freed.swap(true, Ordering::AcqRel) {
            return Err(invalid("program was already freed"));
        }
        p.magic.store(DEAD_MAGIC, Ordering::Release);
        // SAFETY: from Box::into_raw; the `freed` swap made this the only owner, and the
        // caller guarantees no other thread uses the handle.
        let owned = unsafe { Box::from_raw(prog) };
        b.batch.attach(&h.hook, owned.prog)?;
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

fn write_symbol(out: &mut PackjitSymbol, s: Option<packjit_runtime::SymbolInfo>) {
    *out = PackjitSymbol::default();
    if let Some(s) = s {
        out.found = 1;
        out.id = s.id;
        out.start = s.start;
        out.size = s.size;
        out.offset = s.offset;
        out.pc = s.pc.map_or(-1, |p| p as i64);
        fill_name(&mut out.name, &s.name);
    }
}

/// Which program's native code covers `addr` (an O(log n) search of the runtime's address
/// index). `sym->found` is 0 when none does; that is not an error.
///
/// # Safety
/// `rt` NULL or live; `sym` NULL or a `PackjitSymbol` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_symbolize(
    rt: *const PackjitRuntime,
    addr: u64,
    sym: *mut PackjitSymbol,
) -> i32 {
    boundary("packjit_symbolize", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        unsafe { check_size(sym, "sym") }?;
        // SAFETY: checked.
        write_symbol(unsafe { &mut *sym }, h.rt.symbolize(addr));
        Ok(())
    })
}

/// A program's id, name, address and size (`found` is 0 for a program compiled for another
/// architecture: it has no executable address).
///
/// # Safety
/// `prog` NULL or live; `sym` NULL or a `PackjitSymbol` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_symbol(
    prog: *const PackjitProgram,
    sym: *mut PackjitSymbol,
) -> i32 {
    boundary("packjit_program_symbol", || {
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        // SAFETY: caller contract.
        unsafe { check_size(sym, "sym") }?;
        let s = p
            ._rt
            .symbolize(p.prog.entry_addr())
            .filter(|s| s.id == p.prog.id());
        // SAFETY: checked.
        let out = unsafe { &mut *sym };
        write_symbol(out, s);
        if out.found == 0 {
            out.id = p.prog.id();
            fill_name(&mut out.name, p.prog.name());
        }
        Ok(())
    })
}

/// Writes the perf map (`path`, or `/tmp/perf-<pid>.map` when NULL) and keeps it current as
/// programs are loaded and reclaimed, so `perf report` names JIT code. Lines are padded to
/// one width (leading zeros in the hex size) so that a release updates the file in place;
/// names longer than about 230 bytes are cut. One runtime keeps a given path: another
/// runtime of the process enabling it gets `PJ_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `rt` NULL or live; `path` NULL or a NUL-terminated string (copied).
#[no_mangle]
pub unsafe extern "C" fn packjit_perf_map_enable(
    rt: *const PackjitRuntime,
    path: *const c_char,
) -> i32 {
    boundary("packjit_perf_map_enable", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if path.is_null() {
            h.rt.enable_perf_map()?;
        } else {
            // SAFETY: caller contract.
            let p = unsafe { c_path(path, "path") }?;
            h.rt.enable_perf_map_at(&p)?;
        }
        Ok(())
    })
}

/// Registers the runtime's programs with gdb's JIT interface: those live now and every one
/// loaded (or moved by compaction) later, until its code is reclaimed. In gdb, `break
/// <program name>` then stops in the program (`hbreak` when the arena is dual mapped, the
/// default: gdb cannot write breakpoints into its read-only shared view) and `bt` names it.
/// Idempotent; PJ_ERR_UNSUPPORTED on an architecture gdb registration does not describe.
///
/// # Safety
/// `rt` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn packjit_gdb_jit_enable(rt: *const PackjitRuntime) -> i32 {
    boundary("packjit_gdb_jit_enable", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        h.rt.enable_gdb_jit()
    })
}
