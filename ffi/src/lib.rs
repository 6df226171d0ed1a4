//! # packjit C API
//!
//! `libpackjit.so` / `libpackjit.a` and `include/packjit.h` (generated from this crate by
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
//! * Exception: the map operations (`packjit_map_lookup` / `_update` / `_delete` /
//!   `_next_key` / `_push` / `_pop` / `_peek`, `packjit_ringbuf_consume`) return 0 (or a
//!   count) or the kernel's NEGATIVE ERRNO (`-ENOENT`, `-EEXIST`, `-E2BIG`, `-EINVAL`,
//!   `-PACKJIT_ENOTSUPP`, ...), as `bpf(2)` / libbpf do, with the message in the last error
//!   as usual; bad arguments there are `-EINVAL`, a caught panic `-EFAULT`.
//! * Versioned structs start with `struct_size`; the caller sets it to `sizeof` the struct
//!   (the `*_init` functions do) and the library refuses other sizes with `PJ_ERR_ABI`.
//!   A struct that grew by appended fields also takes the size it had before they were
//!   added (`PackjitLoadOptions` without `tier_up_calls`), with the new fields' defaults.

// The C API, one module per object. cbindgen reads this file's items, then each module in
// the order of these declarations: that order is the order of the functions (and of the
// structs they use) in include/packjit.h, so the declarations follow the API, not the
// alphabet (the blank lines keep rustfmt from sorting them). Every constant of the header is
// defined in this file, so the order of the constants does not depend on the modules.

// Library and plugin ABI versions.
mod version;

// Status strings, the thread-local last error and the boundary that catches panics.
mod error;

// Checks of the C arguments: pointers, versioned struct sizes, strings, byte ranges.
mod args;

// Runtime: configuration, create / destroy, arena statistics, reclaim, compaction.
mod runtime;

// Backend plugins and backend descriptions.
mod plugins;

// Host helpers: registration, and the access check helpers written in C call.
mod helpers;

// Host memory regions programs may access.
mod regions;

// eBPF maps: create, the host's map operations, ring-buffer consumer, prog-array slots.
mod maps;

// Per-load options.
mod options;

// Programs: load, batch load, run, free, epoch brackets, info, code, entry.
mod program;

// Adaptive tiering: the runtime's policy, a program's tier.
mod tiering;

// Programs from relocatable eBPF objects (clang), and their global data.
mod elf;

// eBPF objects with maps: open, their maps, load programs, fill prog arrays.
mod object;

// The built-in helpers and per-CPU arrays.
mod builtins;

// Hooks (attach points) and batch attach.
mod hooks;

// Symbolization, the perf map and gdb JIT registration.
mod symbols;

// The plugin ABI's C types (the header gets them through cbindgen's `parse_deps`).
pub use packjit_plugin_api::{
    PjArenaVtable, PjBackendVtable, PjCompileRequest, PjCompileResult, PjError, PjExecEnv,
    PjHelper, PjHelperFn, PjMemRegion, PjPluginEntry, PjProgramEntry, PjRegion,
};
// Everything the modules export, at the crate root as before the split into modules.
pub use builtins::*;
pub use elf::*;
pub use error::*;
pub use helpers::*;
pub use hooks::*;
pub use maps::*;
pub use object::*;
pub use options::*;
pub use plugins::*;
pub use program::*;
pub use regions::*;
pub use runtime::*;
pub use symbols::*;
pub use tiering::*;
pub use version::*;

// The plugin ABI's constants, mirrored here because cbindgen only emits constants of the
// crate it generates for (it does emit the plugin-api *types*, via `parse_deps`). Each one is
// checked against packjit-plugin-api at compile time just below, so they cannot drift.

/// Version of the plugin ABI (`PjBackendVtable::abi_version`, `PjArenaVtable::abi_version`).
pub const PJ_ABI_VERSION: u32 = 3;
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
/// Without it (and without `PACKJIT_LOAD_NO_BUDGET`) sandboxed programs get
/// `PACKJIT_DEFAULT_BUDGET` instructions per run and trusted ones count none.
pub const PACKJIT_LOAD_BUDGET: u32 = 4;
/// `PackjitLoadOptions::flags`: no instruction budget, also for a sandboxed program: it may
/// run for ever (the host opts out of termination explicitly).
pub const PACKJIT_LOAD_NO_BUDGET: u32 = 32;
/// Instructions per run a sandboxed program gets unless its load says otherwise.
pub const PACKJIT_DEFAULT_BUDGET: u64 = packjit_runtime::DEFAULT_BUDGET;
/// `PackjitLoadOptions::flags`: blind immediates with a random per-program key, so constants
/// chosen by whoever wrote the program never appear verbatim in executable memory.
pub const PACKJIT_LOAD_BLIND_CONSTANTS: u32 = 8;
/// `PackjitLoadOptions::flags`: accept packjit's internal per-CPU address instruction
/// (`BPF_ALU64 | BPF_MOV | BPF_X` with `off = -1`, `imm` = an id from
/// `packjit_runtime_add_percpu_array`): `dst = src + cpu * slot_size` of that array, or
/// `dst = src` when the id is unknown to this load or the CPU is past the array's CPUs.
/// Without this flag the encoding is refused (a reserved `off`).
pub const PACKJIT_LOAD_PERCPU_INSN: u32 = 16;
/// `PackjitLoadOptions::flags`: compile with the optimizing tier (Cranelift) instead of the
/// baseline JIT: slower to compile, faster to run. Host architecture only; trusted or
/// sandboxed, with or without a budget, with maps (array lookups inline, other map helpers
/// as calls) and tail calls (each nests its target, ~6 ns where the baseline jumps); no
/// blinding or per-CPU instruction yet: those fail with `PJ_ERR_UNSUPPORTED` naming what. A library
/// built without the `optimizer` cargo feature refuses it the same way.
pub const PACKJIT_LOAD_OPTIMIZE: u32 = 64;
/// `PackjitLoadOptions::flags`: adaptive tiering. The program loads on the baseline JIT (as
/// fast as without the flag) and is recompiled by the optimizing tier on a background thread
/// of the runtime once it has run as often as the runtime's policy says
/// (`packjit_runtime_set_tier_policy`); new runs then take the optimized code, runs already
/// inside finish on the old one, which is freed after them. A program the optimizing tier
/// cannot take (sandboxed, a tail call, a budget, ..., or a library built without the `optimizer`
/// cargo feature) loads the same and stays on the baseline: `packjit_program_tier_status`
/// reports `PACKJIT_TIER_STATUS_REFUSED`. Not with `PACKJIT_LOAD_OPTIMIZE`.
pub const PACKJIT_LOAD_ADAPTIVE: u32 = 128;
/// `PackjitLoadOptions::flags`, with `PACKJIT_LOAD_ADAPTIVE` only: this program's tier-up
/// policy is `PackjitLoadOptions::tier_up_calls` (a run count, or `PACKJIT_TIER_MANUAL`)
/// instead of the runtime's (`packjit_runtime_set_tier_policy`).
pub const PACKJIT_LOAD_TIER_POLICY: u32 = 256;

/// `packjit_runtime_set_tier_policy`: no tier-up on a call count; only
/// `packjit_program_request_tier_up` asks for one.
pub const PACKJIT_TIER_MANUAL: u64 = u64::MAX;
/// `packjit_program_tier`: the baseline JIT's code runs.
pub const PACKJIT_TIER_BASELINE: u32 = 1;
/// `packjit_program_tier`: the optimizing tier's code runs.
pub const PACKJIT_TIER_OPTIMIZED: u32 = 2;
/// `packjit_program_tier_status`: not adaptive; the tier it was loaded with stays.
pub const PACKJIT_TIER_STATUS_FIXED: u32 = 1;
/// `packjit_program_tier_status`: adaptive, on the baseline, tier-up not asked for yet.
pub const PACKJIT_TIER_STATUS_BASELINE: u32 = 2;
/// `packjit_program_tier_status`: adaptive, queued or compiling in the background.
pub const PACKJIT_TIER_STATUS_PENDING: u32 = 3;
/// `packjit_program_tier_status`: adaptive, the optimized code runs new calls.
pub const PACKJIT_TIER_STATUS_OPTIMIZED: u32 = 4;
/// `packjit_program_tier_status`: adaptive, on the baseline for good: the optimizing tier
/// cannot take it.
pub const PACKJIT_TIER_STATUS_REFUSED: u32 = 5;
/// `packjit_program_tier_status`: adaptive, on the baseline for good: its entry was taken
/// (`packjit_program_entry`, a prog array) or its runtime shut down first.
pub const PACKJIT_TIER_STATUS_SETTLED: u32 = 6;

/// Capacity, including the NUL, of the name fields of the info structs.
pub const PACKJIT_NAME_LEN: usize = 64;
/// Capacity, including the NUL, of `PackjitBackendInfo::origin`.
pub const PACKJIT_PATH_LEN: usize = 256;

/// [`PackjitBuiltins`]: the built-in helper is inlined into the code.
pub const PACKJIT_BUILTIN_INLINE: u32 = 1;
/// [`PackjitBuiltins`]: the built-in helper is a call (`sched_getcpu` /
/// `clock_gettime(CLOCK_MONOTONIC)`).
pub const PACKJIT_BUILTIN_CALL: u32 = 2;
/// [`PackjitBuiltins`]: the host registered its own helper under the id; it is called.
pub const PACKJIT_BUILTIN_HOST: u32 = 3;
/// [`PackjitBuiltins`]: the program was loaded without the built-ins.
pub const PACKJIT_BUILTIN_NONE: u32 = 0;

/// `packjit_map_create`: `BPF_MAP_TYPE_HASH` (the kernel's map type numbers throughout, so
/// `linux/bpf.h`'s `BPF_MAP_TYPE_*` work as well).
pub const PACKJIT_MAP_TYPE_HASH: u32 = 1;
/// `packjit_map_create`: `BPF_MAP_TYPE_ARRAY` (4-byte keys, every index exists).
pub const PACKJIT_MAP_TYPE_ARRAY: u32 = 2;
/// `packjit_map_create`: `BPF_MAP_TYPE_PROG_ARRAY` (4-byte keys and values; slots are set
/// with `packjit_prog_array_set`).
pub const PACKJIT_MAP_TYPE_PROG_ARRAY: u32 = 3;
/// `packjit_map_create`: `BPF_MAP_TYPE_PERCPU_HASH`.
pub const PACKJIT_MAP_TYPE_PERCPU_HASH: u32 = 5;
/// `packjit_map_create`: `BPF_MAP_TYPE_PERCPU_ARRAY`.
pub const PACKJIT_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
/// `packjit_map_create`: `BPF_MAP_TYPE_LRU_HASH`.
pub const PACKJIT_MAP_TYPE_LRU_HASH: u32 = 9;
/// `packjit_map_create`: `BPF_MAP_TYPE_LRU_PERCPU_HASH`.
pub const PACKJIT_MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;
/// `packjit_map_create`: `BPF_MAP_TYPE_LPM_TRIE` (key: a host-order `u32` prefix length,
/// then 1..=256 data bytes compared most significant bit first; flags must include
/// `PACKJIT_BPF_F_NO_PREALLOC`, as in the kernel).
pub const PACKJIT_MAP_TYPE_LPM_TRIE: u32 = 11;
/// `packjit_map_create`: `BPF_MAP_TYPE_QUEUE` (key_size 0).
pub const PACKJIT_MAP_TYPE_QUEUE: u32 = 22;
/// `packjit_map_create`: `BPF_MAP_TYPE_STACK` (key_size 0).
pub const PACKJIT_MAP_TYPE_STACK: u32 = 23;
/// `packjit_map_create`: `BPF_MAP_TYPE_RINGBUF` (key_size and value_size 0; max_entries is
/// the data size, a power of two and a multiple of the page size).
pub const PACKJIT_MAP_TYPE_RINGBUF: u32 = 27;
/// `packjit_map_update` / `packjit_map_push` flag: create or replace.
pub const PACKJIT_BPF_ANY: u64 = 0;
/// `packjit_map_update` flag: create only (`-EEXIST` when the key is present).
pub const PACKJIT_BPF_NOEXIST: u64 = 1;
/// `packjit_map_update` flag: replace only (`-ENOENT` when absent); `packjit_map_push` on a
/// full queue/stack: drop the oldest value.
pub const PACKJIT_BPF_EXIST: u64 = 2;
/// `packjit_map_create` flag: hash maps allocate on demand (accepted for HASH and
/// PERCPU_HASH; elements are preallocated anyway); required for LPM_TRIE.
pub const PACKJIT_BPF_F_NO_PREALLOC: u32 = 1;
/// `packjit_map_create` flag: programs may only read the values (the host may write).
pub const PACKJIT_BPF_F_RDONLY_PROG: u32 = 1 << 7;
/// The kernel's internal `ENOTSUPP` (524; not in `errno.h`), which `bpf(2)` passes to user
/// space unchanged: map operations return `-PACKJIT_ENOTSUPP` for an operation the map
/// type does not have (e.g. `packjit_map_lookup` on a ring buffer).
pub const PACKJIT_ENOTSUPP: i32 = 524;

mod map_mirror {
    use packjit_runtime::maps as m;
    use packjit_runtime::maps::MapType as T;
    macro_rules! same {
        ($($a:ident == $b:expr),* $(,)?) => {
            $(const _: () = assert!(super::$a == $b);)*
        };
    }
    same!(
        PACKJIT_MAP_TYPE_HASH == T::Hash as u32,
        PACKJIT_MAP_TYPE_ARRAY == T::Array as u32,
        PACKJIT_MAP_TYPE_PROG_ARRAY == T::ProgArray as u32,
        PACKJIT_MAP_TYPE_PERCPU_HASH == T::PercpuHash as u32,
        PACKJIT_MAP_TYPE_PERCPU_ARRAY == T::PercpuArray as u32,
        PACKJIT_MAP_TYPE_LRU_HASH == T::LruHash as u32,
        PACKJIT_MAP_TYPE_LRU_PERCPU_HASH == T::LruPercpuHash as u32,
        PACKJIT_MAP_TYPE_LPM_TRIE == T::LpmTrie as u32,
        PACKJIT_MAP_TYPE_QUEUE == T::Queue as u32,
        PACKJIT_MAP_TYPE_STACK == T::Stack as u32,
        PACKJIT_MAP_TYPE_RINGBUF == T::RingBuf as u32,
        PACKJIT_BPF_ANY == m::BPF_ANY,
        PACKJIT_BPF_NOEXIST == m::BPF_NOEXIST,
        PACKJIT_BPF_EXIST == m::BPF_EXIST,
        PACKJIT_BPF_F_NO_PREALLOC == m::BPF_F_NO_PREALLOC,
        PACKJIT_BPF_F_RDONLY_PROG == m::BPF_F_RDONLY_PROG,
    );
}

// The magic word of a destroyed or freed handle (runtime, program, hook); the live handles'
// words are next to their types.
const DEAD_MAGIC: u64 = 0x706a_5f64_6561_6421; // "pj_dead!"
