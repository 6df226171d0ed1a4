//! The `#[repr(C)]` side of the plugin ABI.
//!
//! Everything in this module crosses a shared-object boundary, so it is plain data and
//! `extern "C"` function pointers only. Every struct that can grow starts with
//! `abi_version`/`struct_size` (vtables) or `struct_size` (request/result), so either side can
//! refuse a layout it does not know before touching anything else.

use core::ffi::{c_char, c_void};

/// Version of the plugin ABI described by this module. Bumped on any incompatible change.
/// 3: [`PjExecEnv::ctx_len`] appended (an older host's environment lacks it).
pub const PJ_ABI_VERSION: u32 = 3;

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

// The C API's statuses of a run that stopped (a [`Stop`](crate::Stop), decoded from
// [`PjExecEnv`]'s stop fields). No backend reports them: a compile that returned one would
// be read as `PJ_ERR_INTERNAL`.

/// A sandboxed program's memory access fell outside every region it may touch (run time).
pub const PJ_ERR_OUT_OF_BOUNDS: i32 = -12;
/// The program ran out of its instruction budget.
pub const PJ_ERR_BUDGET: i32 = -13;
/// A `callx` named a helper id with no registered helper.
pub const PJ_ERR_UNKNOWN_CALLX: i32 = -14;

/// `PjCompileRequest::flags`: emit sandboxed code (see [`PjExecEnv`] and
/// `docs/ARCHITECTURE.md`, "Sandbox contract"): every load, store and atomic whose safety is
/// not proven at compile time is checked against the context, the program's stack block and
/// the host's regions; registers r0, r3–r9 and the stack block start at zero.
pub const PJ_COMPILE_SANDBOX: u32 = 1 << 0;
/// `PjCompileRequest::flags`: count an instruction budget in [`PjExecEnv::budget`]; a taken
/// jump to an earlier or the same pc `t` from pc `s` charges `s - t + 1`, a bpf-to-bpf call
/// charges 1; when the charge exceeds the budget left the program stops at `s` with
/// [`PJ_STOP_BUDGET`] (the budget is left unchanged by the failing charge).
pub const PJ_COMPILE_BUDGET: u32 = 1 << 1;
/// `PjCompileRequest::flags`: blind 32- and 64-bit immediates with
/// [`PjCompileRequest::blind_key`] so no attacker-chosen constant appears verbatim in code.
pub const PJ_COMPILE_BLIND_CONSTANTS: u32 = 1 << 2;
/// `PjCompileRequest::flags`: accept packjit's internal per-CPU address instruction
/// (`BPF_ALU64 | BPF_MOV | BPF_X` with `off = -1`, the kernel's `BPF_MOV64_PERCPU_REG`
/// encoding; `imm` = per-CPU array id): `dst = src + cpu * slot_size` of that array, or
/// `dst = src` when the id is not in the table or `cpu >= cpus`. The helper table must hold
/// a [`PJ_HELPER_PERCPU_OFFSET`] entry. Without this flag the encoding is refused like any
/// reserved `off`.
pub const PJ_COMPILE_PERCPU_INSN: u32 = 1 << 3;
/// Every `PJ_COMPILE_*` flag defined by this ABI version.
pub const PJ_COMPILE_ALL_FLAGS: u32 =
    PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS | PJ_COMPILE_PERCPU_INSN;

/// [`PjExecEnv::stop_kind`]: the program returned normally.
pub const PJ_STOP_NONE: u32 = 0;
/// A checked access fell outside every allowed region.
pub const PJ_STOP_OUT_OF_BOUNDS: u32 = 1;
/// The instruction budget ran out.
pub const PJ_STOP_BUDGET: u32 = 2;
/// A `callx` named an unregistered helper id (`stop_addr` holds the id).
pub const PJ_STOP_UNKNOWN_CALLX: u32 = 3;

/// [`PjMemRegion::flags`]: the program may write the region (reads are always allowed).
pub const PJ_REGION_WRITABLE: u64 = 1;

/// A host memory region a sandboxed program may access.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjMemRegion {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// `PJ_REGION_*` bits.
    pub flags: u64,
}

/// Per-run environment, the third argument of every program entry.
///
/// The host fills the input fields before each run and reads the stop fields after it; the
/// emitted code reads the inputs, counts the budget in place, and on a stop writes the stop
/// fields and returns (r0 is then meaningless). The layout is fixed: emitted code addresses
/// the fields by the `PJ_ENV_*` offsets below, so fields are only ever appended.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjExecEnv {
    /// Host regions (besides the context and the stack), `region_count` entries.
    pub regions: u64,
    /// Number of entries at `regions`.
    pub region_count: u64,
    /// First byte of the context (`r1` at entry).
    pub ctx_start: u64,
    /// One past the last byte of the context (`r1 + r2` at entry).
    pub ctx_end: u64,
    /// Instructions left (code compiled with [`PJ_COMPILE_BUDGET`] decrements it).
    pub budget: u64,
    /// `PJ_STOP_*`, written by the code when it stops.
    pub stop_kind: u32,
    /// Size of the failed access in bytes, with bit 8 set for a write.
    pub stop_access: u32,
    /// eBPF pc (slot index) of the instruction that stopped.
    pub stop_pc: u64,
    /// Address of the failed access, or the helper id of an unknown `callx`.
    pub stop_addr: u64,
    /// Lowest byte of the program's stack block (written by the prologue in sandbox mode).
    pub stack_start: u64,
    /// One past the highest byte of the stack block (the entry frame's r10).
    pub stack_end: u64,
    /// Native stack pointer at entry, kept by the code to unwind on a stop.
    pub entry_sp: u64,
    /// Tail calls this run has made (0 at entry); a tail call is refused at
    /// [`PJ_MAX_TAIL_CALLS`]. Read and written by the code of [`PJ_INLINE_PROG_ARRAY_TAIL_CALL`]
    /// and by the host's [`PJ_INLINE_TAIL_CALL`] chooser.
    pub tail_calls: u64,
    /// The host's description of the running program's maps, for its helpers (opaque to the
    /// code, which only copies a tail call target's [`PjTailTarget::maps`] here).
    pub maps: u64,
    /// The result (r0) of a tail call target entered from a bpf-to-bpf function, written by
    /// the [`PJ_HELPER_CALLEE_TAIL_CALL`] helper when it answers
    /// [`PJ_CALLEE_TAIL_RETURNED`], read by the calling code right after.
    pub callee_tail_r0: u64,
    /// `ctx_end - ctx_start`, written by the host with them (appended in ABI version 3).
    /// Sandboxed code may compare against it instead of loading both bounds (x86-64's
    /// context checks do, in one memory operand). A host that leaves it 0 sends every
    /// context access to the full check, which reads the bounds themselves: correct, only
    /// slower. One that writes more than the context's length lets sandboxed code past the
    /// context's end, as a wrong `ctx_end` would.
    pub ctx_len: u64,
}

/// Field offsets of [`PjExecEnv`] for emitted code.
pub const PJ_ENV_REGIONS: i32 = 0;
/// Offset of [`PjExecEnv::region_count`].
pub const PJ_ENV_REGION_COUNT: i32 = 8;
/// Offset of [`PjExecEnv::ctx_start`].
pub const PJ_ENV_CTX_START: i32 = 16;
/// Offset of [`PjExecEnv::ctx_end`].
pub const PJ_ENV_CTX_END: i32 = 24;
/// Offset of [`PjExecEnv::budget`].
pub const PJ_ENV_BUDGET: i32 = 32;
/// Offset of [`PjExecEnv::stop_kind`] (u32).
pub const PJ_ENV_STOP_KIND: i32 = 40;
/// Offset of [`PjExecEnv::stop_access`] (u32).
pub const PJ_ENV_STOP_ACCESS: i32 = 44;
/// Offset of [`PjExecEnv::stop_pc`].
pub const PJ_ENV_STOP_PC: i32 = 48;
/// Offset of [`PjExecEnv::stop_addr`].
pub const PJ_ENV_STOP_ADDR: i32 = 56;
/// Offset of [`PjExecEnv::stack_start`].
pub const PJ_ENV_STACK_START: i32 = 64;
/// Offset of [`PjExecEnv::stack_end`].
pub const PJ_ENV_STACK_END: i32 = 72;
/// Offset of [`PjExecEnv::entry_sp`].
pub const PJ_ENV_ENTRY_SP: i32 = 80;
/// Offset of [`PjExecEnv::tail_calls`].
pub const PJ_ENV_TAIL_CALLS: i32 = 88;
/// Offset of [`PjExecEnv::maps`].
pub const PJ_ENV_MAPS: i32 = 96;
/// Offset of [`PjExecEnv::callee_tail_r0`].
pub const PJ_ENV_CALLEE_TAIL_R0: i32 = 104;
/// Offset of [`PjExecEnv::ctx_len`].
pub const PJ_ENV_CTX_LEN: i32 = 112;
/// Bit of [`PjExecEnv::stop_access`] marking a write.
pub const PJ_ACCESS_WRITE: u32 = 1 << 8;

const _: () = {
    assert!(core::mem::offset_of!(PjExecEnv, regions) == PJ_ENV_REGIONS as usize);
    assert!(core::mem::offset_of!(PjExecEnv, region_count) == PJ_ENV_REGION_COUNT as usize);
    assert!(core::mem::offset_of!(PjExecEnv, ctx_start) == PJ_ENV_CTX_START as usize);
    assert!(core::mem::offset_of!(PjExecEnv, ctx_end) == PJ_ENV_CTX_END as usize);
    assert!(core::mem::offset_of!(PjExecEnv, budget) == PJ_ENV_BUDGET as usize);
    assert!(core::mem::offset_of!(PjExecEnv, stop_kind) == PJ_ENV_STOP_KIND as usize);
    assert!(core::mem::offset_of!(PjExecEnv, stop_access) == PJ_ENV_STOP_ACCESS as usize);
    assert!(core::mem::offset_of!(PjExecEnv, stop_pc) == PJ_ENV_STOP_PC as usize);
    assert!(core::mem::offset_of!(PjExecEnv, stop_addr) == PJ_ENV_STOP_ADDR as usize);
    assert!(core::mem::offset_of!(PjExecEnv, stack_start) == PJ_ENV_STACK_START as usize);
    assert!(core::mem::offset_of!(PjExecEnv, stack_end) == PJ_ENV_STACK_END as usize);
    assert!(core::mem::offset_of!(PjExecEnv, entry_sp) == PJ_ENV_ENTRY_SP as usize);
    assert!(core::mem::offset_of!(PjExecEnv, tail_calls) == PJ_ENV_TAIL_CALLS as usize);
    assert!(core::mem::offset_of!(PjExecEnv, maps) == PJ_ENV_MAPS as usize);
    assert!(core::mem::offset_of!(PjExecEnv, callee_tail_r0) == PJ_ENV_CALLEE_TAIL_R0 as usize);
    assert!(core::mem::offset_of!(PjExecEnv, ctx_len) == PJ_ENV_CTX_LEN as usize);
    assert!(core::mem::offset_of!(PjTailTarget, code_base) == PJ_TAIL_TARGET_CODE_BASE as usize);
    assert!(
        core::mem::offset_of!(PjTailTarget, entry_offset) == PJ_TAIL_TARGET_ENTRY_OFFSET as usize
    );
    assert!(core::mem::offset_of!(PjTailTarget, regions) == PJ_TAIL_TARGET_REGIONS as usize);
    assert!(
        core::mem::offset_of!(PjTailTarget, region_count) == PJ_TAIL_TARGET_REGION_COUNT as usize
    );
    assert!(core::mem::offset_of!(PjTailTarget, maps) == PJ_TAIL_TARGET_MAPS as usize);
    assert!(
        core::mem::offset_of!(PjTailTarget, uniform_frame) == PJ_TAIL_TARGET_UNIFORM_FRAME as usize
    );
    assert!(core::mem::offset_of!(PjTailTarget, tail_entry) == PJ_TAIL_TARGET_TAIL_ENTRY as usize);
    assert!(core::mem::size_of::<PjMemRegion>() == 24);
};

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

/// One entry of the helper table.
///
/// With `inline_kind == PJ_INLINE_NONE` helper `id` lives at `addr`, an
/// `extern "C" fn(u64, u64, u64, u64, u64) -> u64`. Any other `inline_kind` asks the backend
/// to emit the helper's body in place of the call (at `call imm` and at a matching `callx`),
/// and `addr` carries that kind's parameter instead of a function address. A host sends a
/// kind only to a backend whose [`PjBackendVtable::inline_kinds`] has its bit: this field
/// was `reserved` (zero) before, so an older backend never sees one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjHelper {
    /// The id used by `call imm` instructions.
    pub id: u32,
    /// `PJ_INLINE_*`: how the backend emits calls to this id.
    pub inline_kind: u32,
    /// Address of the helper function, or the inline kind's parameter.
    pub addr: u64,
}

/// Kernel helper id of `bpf_ktime_get_ns` (monotonic nanoseconds), inlinable as
/// [`PJ_INLINE_COUNTER_CLOCK`].
pub const PJ_HELPER_KTIME_GET_NS: u32 = 5;
/// Kernel helper id of `bpf_get_smp_processor_id` (the CPU the thread runs on), inlinable as
/// [`PJ_INLINE_RSEQ_CPU_ID`].
pub const PJ_HELPER_GET_SMP_PROCESSOR_ID: u32 = 8;

/// [`PjHelper::inline_kind`]: a plain call to `addr`.
pub const PJ_INLINE_NONE: u32 = 0;
/// [`PjHelper::inline_kind`]: r0 = the 32-bit `cpu_id` field of this thread's registered
/// `struct rseq`, read at `thread pointer + addr` (`addr` is a signed byte offset: glibc's
/// `__rseq_offset + 4`). The thread pointer is `fs` on x86-64, `tpidr_el0` on arm64, `tp` on
/// RV64. r1–r5 are left unchanged. The value may be stale by the time it is used (the thread
/// can migrate right after the load), exactly like the kernel helper.
pub const PJ_INLINE_RSEQ_CPU_ID: u32 = 1;
/// [`PjHelper::inline_kind`]: r0 = monotonic nanoseconds from the CPU's counter, scaled as
/// the [`PjClockScale`] at `addr` says. The emitted code reads the scale from `addr` at run
/// time, so the host keeps it alive (and unchanged) as long as the code can run. x86-64 reads
/// `rdtsc`, arm64 `cntvct_el0`, RV64 `rdtime`. r1–r5 are left unchanged.
pub const PJ_INLINE_COUNTER_CLOCK: u32 = 2;

/// [`PjHelper::inline_kind`] of [`PJ_HELPER_PERCPU_LOOKUP`]: the per-CPU array lookup,
/// inlined. `addr` points to a [`PjPerCpuTable`] header followed by `count`
/// [`PjPerCpuArray`]s, read by the code at run time (the host keeps it alive and unchanged
/// while the code can run). With r1 = array id and r2 = element index:
/// `r0 = base + cpu * slot_size + index * value_size` where `cpu` is the `u32` at thread
/// pointer + `cpu_id_offset` (the rseq `cpu_id`), or r0 = 0 when `id >= count`,
/// `index >= entries` or `cpu >= cpus`. r1–r5 are clobbered, as by a call. The CPU number
/// is masked after its bound (0 where the bound fails, without a branch), so that a
/// mispredicted bound still yields NULL or an element: sandboxed loads bound and mask the
/// index before this code, and the host then vouches for the result like an array's
/// ([`PJ_HELPER_LOOKUP_VALUES`]).
pub const PJ_INLINE_PERCPU_LOOKUP: u32 = 3;

/// [`PjHelper::inline_kind`]: a tail call (the kernel's `bpf_tail_call`, helper id 12).
/// `addr` is an `extern "C" fn(ctx, prog_array, index, 0, 0) -> u64` the code calls like a
/// helper; it returns the entry address of the program to continue in, or 0 when the slot
/// is empty, the index out of range or the chain too long (then the code falls through to
/// the next instruction with r0 = 0, as the kernel's tail call does). On a non-zero answer
/// the code leaves its frame as its `exit` would (budget written back, callee-saved
/// registers restored) and jumps to that entry with the arguments of the current run: the
/// context `env.ctx_start`, its length `env.ctx_end - env.ctx_start`, and `env`. The
/// function at `addr` updates `env` for the program it chose (its regions), so the program
/// reached runs exactly as if the host had called it, on the same native stack. Inside a
/// bpf-to-bpf function (whose callers' frames stay) packjit's backends call the table's
/// [`PJ_HELPER_CALLEE_TAIL_CALL`] entry instead, and refuse the tail call when the table has
/// none.
pub const PJ_INLINE_TAIL_CALL: u32 = 4;

/// [`PjHelper::inline_kind`]: an array map lookup, inlined (the kernel's `map_gen_lookup`).
/// `addr` points to a [`PjArrayMap`] the backend reads while it compiles (its values become
/// immediates). With r2 = pointer to the `u32` key: r0 = `base + key * value_stride`, or 0
/// when `key >= max_entries`; the key is read like any program load (checked in sandboxed
/// code). In sandboxed code no key at or past `max_entries` forms an address, not even on a
/// mispredicted path (packjit's backends select the NULL with a conditional move, or mask
/// the key after the bound's branch), so a mispredicted bound cannot index past the array.
/// For a per-CPU array (`percpu_id != PJ_ARRAY_NOT_PERCPU`) the key is
/// passed to the [`PJ_HELPER_PERCPU_LOOKUP`] entry of the same table with r1 = `percpu_id`.
/// r1–r5 are clobbered, as by a call.
pub const PJ_INLINE_ARRAY_LOOKUP: u32 = 5;

/// [`PjHelper::inline_kind`]: a tail call through a prog array known at compile time (the
/// kernel's JITs emit the same sequence). `addr` points to a [`PjProgArray`] the backend
/// reads while it compiles. With r3 = the index: when `(u32)r3 < max_entries`,
/// `env.tail_calls < PJ_MAX_TAIL_CALLS`, the slot holds a [`PjTailTarget`] and that target's
/// `code_base[mode]` word (mode: 0 trusted code, 1 sandboxed) is non-zero, the code counts the
/// tail call in `env`, copies the target's regions and maps into `env`, and leaves its frame
/// and jumps to the entry as for [`PJ_INLINE_TAIL_CALL`]; otherwise it falls through with
/// r0 = 0. The slot's index is masked branch-free before it addresses the slots, so a
/// mispredicted bound cannot read past them (packjit's own backends mask it in sandboxed
/// code only, as the kernel masks it for unprivileged programs only). r1–r5 are clobbered, as
/// by a call. When the target's [`PjTailTarget::uniform_frame`] is set, a backend whose
/// tail-calling programs all have its uniform entry frame (packjit's own) leaves only its
/// stack block, keeps the saved registers for the target and jumps past the target's saves,
/// to [`PjTailTarget::tail_entry`]; the target's tail entry reloads the context and its
/// length from `env` where its program reads them. Inside a bpf-to-bpf function (whose
/// callers' frames stay) the code calls the target's whole entry instead, as the host does,
/// with what that entry and the switch overwrite in `env` for the caller (`entry_sp`, the
/// stack block's bounds, the regions, the maps) saved on the native stack and restored
/// after; the target's result is the function's, and a stop it recorded ends the run.
pub const PJ_INLINE_PROG_ARRAY_TAIL_CALL: u32 = 6;

/// The longest chain of tail calls one run may make, as in the kernel (`MAX_TAIL_CALL_CNT`).
pub const PJ_MAX_TAIL_CALLS: u32 = 33;

/// A prog array's slots, for [`PJ_INLINE_PROG_ARRAY_TAIL_CALL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjProgArray {
    /// `max_entries` words, each 0 or the address of a [`PjTailTarget`] (published with
    /// release ordering; the code reads the target's fields through the loaded address, an
    /// address dependency every supported ISA orders).
    pub slots: u64,
    /// Slots; an index at or above it finds nothing.
    pub max_entries: u32,
    /// 0, or the slots readable at `slots`: a power of two at least `max_entries`, those
    /// from `max_entries` on always 0, so an index masked by `index_slots - 1` reads a slot
    /// even under a mispredicted bound (one `and` instead of a computed mask).
    pub index_slots: u32,
}

/// What a prog-array slot points to: what a tail call into the program needs, read by the
/// code of [`PJ_INLINE_PROG_ARRAY_TAIL_CALL`]. The host keeps it alive until no run can be in
/// a tail call that read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjTailTarget {
    /// By the caller's mode (0: trusted code, 1: sandboxed code): the address of a word
    /// holding the base of the target's code now (code can move, see compaction), or of a
    /// zero word when the target's code is of the other mode (a tail call never crosses the
    /// sandbox's boundary).
    pub code_base: [u64; 2],
    /// The target's entry, from that base.
    pub entry_offset: u64,
    /// The target's regions ([`PjExecEnv::regions`]).
    pub regions: u64,
    /// [`PjExecEnv::region_count`] for them.
    pub region_count: u64,
    /// [`PjExecEnv::maps`] for the target.
    pub maps: u64,
    /// 1 when the target's entry has its backend's uniform tail-call frame (the frame of every
    /// program that makes tail calls, see [`PJ_INLINE_PROG_ARRAY_TAIL_CALL`]); else 0. A
    /// caller of the same backend then leaves its saved registers in place and jumps past the
    /// target's saves (the backend's fixed `tail_entry_skip` bytes after the entry), as the
    /// kernel's JITs jump past the prologue of a program with the same frame.
    pub uniform_frame: u64,
    /// By the caller's mode, as `code_base`: for a caller of packjit's own backends, whose
    /// tail-calling programs all have the uniform frame, the address to jump to with only its
    /// stack block left: past the target's saves (its backend's fixed `tail_entry_skip`
    /// bytes after the entry), the frame decision taken once, when the slot was set. 0 when
    /// the target's entry has no uniform frame or its code is of the other mode (the caller
    /// then goes through `code_base`). The host rewrites it (atomically, before the old
    /// code is released) when the code moves.
    pub tail_entry: [u64; 2],
}

/// Offset of [`PjTailTarget::code_base`] (trusted code's word; sandboxed code's is 8 further).
pub const PJ_TAIL_TARGET_CODE_BASE: i32 = 0;
/// Offset of [`PjTailTarget::entry_offset`].
pub const PJ_TAIL_TARGET_ENTRY_OFFSET: i32 = 16;
/// Offset of [`PjTailTarget::regions`].
pub const PJ_TAIL_TARGET_REGIONS: i32 = 24;
/// Offset of [`PjTailTarget::region_count`].
pub const PJ_TAIL_TARGET_REGION_COUNT: i32 = 32;
/// Offset of [`PjTailTarget::maps`].
pub const PJ_TAIL_TARGET_MAPS: i32 = 40;
/// Offset of [`PjTailTarget::uniform_frame`].
pub const PJ_TAIL_TARGET_UNIFORM_FRAME: i32 = 48;
/// Offset of [`PjTailTarget::tail_entry`] (trusted code's word; sandboxed code's is 8
/// further).
pub const PJ_TAIL_TARGET_TAIL_ENTRY: i32 = 56;

/// [`PjArrayMap::percpu_id`] of an array that is not per-CPU.
pub const PJ_ARRAY_NOT_PERCPU: u32 = u32::MAX;

/// The layout of one array map, for [`PJ_INLINE_ARRAY_LOOKUP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjArrayMap {
    /// Element 0.
    pub base: u64,
    /// Bytes from one element to the next.
    pub value_stride: u64,
    /// Elements; a key at or above it finds nothing.
    pub max_entries: u32,
    /// The array's id in the [`PJ_HELPER_PERCPU_LOOKUP`] table, or [`PJ_ARRAY_NOT_PERCPU`].
    pub percpu_id: u32,
}

/// packjit's per-CPU array lookup helper id (outside the kernel's helper ids):
/// `void *lookup(u64 array_id, u64 index)`, this CPU's element or NULL. Inlinable as
/// [`PJ_INLINE_PERCPU_LOOKUP`].
pub const PJ_HELPER_PERCPU_LOOKUP: u32 = 0x7043_0001;

/// Not a callable helper: the helper-table entry describing the per-CPU address instruction
/// of [`PJ_COMPILE_PERCPU_INSN`]. Its `inline_kind` is [`PJ_INLINE_NONE`] and `addr` points
/// to a [`PjPerCpuTable`] followed by its arrays (read at run time; the host keeps it alive
/// and unchanged while the code can run). The CPU is whatever the table's
/// [`PJ_HELPER_GET_SMP_PROCESSOR_ID`] entry yields (inline rseq load or a call). A `call`
/// of this id is refused at decode time and `callx` never matches it.
pub const PJ_HELPER_PERCPU_OFFSET: u32 = 0x7043_0002;

/// Not a callable helper: the helper-table entry naming the program's static regions, for
/// sandboxed code. `addr` points to a [`PjStaticRegions`] header followed by `count`
/// [`PjMemRegion`]s, read while compiling only. The host promises what a region passed to a
/// run promises, for as long as the code can run: each region's memory stays valid, and
/// writable where it has [`PJ_REGION_WRITABLE`]. The code then needs no run-time test for an
/// access the front end proves inside one of them (a global or map value at a constant, or
/// masked, offset); every other access is checked as before, against the regions of the run.
/// A `call` of this id is refused at decode time and `callx` never matches it.
pub const PJ_HELPER_STATIC_REGIONS: u32 = 0x7043_0003;

/// The most static regions a request may name (more is refused; a program needs one per
/// map value block and ELF data section).
pub const PJ_STATIC_REGIONS_MAX: u64 = 4096;

/// Header of the [`PJ_HELPER_STATIC_REGIONS`] table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjStaticRegions {
    /// Regions following the header.
    pub count: u64,
}

/// Not a callable helper: the helper-table entry naming the program's map lookups whose
/// result the host vouches for, for sandboxed code. `addr` points to a [`PjLookupValues`]
/// header followed by `count` [`PjLookupValue`]s, read while compiling only. Each record
/// promises: the `call` at eBPF slot `pc` (as the request's code has it) returns in r0
/// either 0 or the address of a value of exactly `value_size` bytes of a map's value memory,
/// which stays valid for as long as the code can run (as a static region does), and which
/// the program may write when `flags` has [`PJ_REGION_WRITABLE`]. The front end then proves
/// accesses inside `[r0, r0 + value_size)` on the path where the program tested r0 against
/// 0 (`packjit_frontend::ranges`); a NULL dereferenced without the test, an access past the
/// value or a write to a read-only value stays checked against the run's regions.
/// A `call` of this id is refused at decode time and `callx` never matches it.
pub const PJ_HELPER_LOOKUP_VALUES: u32 = 0x7043_0004;

/// packjit's runner of a tail call made inside a bpf-to-bpf function through a chooser
/// ([`PJ_INLINE_TAIL_CALL`]; not callable by programs: a `call` of this id is refused at
/// decode time and `callx` never matches it).
/// The code of such a tail call calls it like a helper with the program's r1-r3 (context,
/// prog array, index). It makes the tail call's tests on the run's count
/// ([`PjExecEnv::tail_calls`], shared with the whole chain), and when the call goes, runs
/// the target's whole entry on the same `env`, as a native call: what the entry overwrites
/// for the caller (`entry_sp`, the stack bounds, the regions, the maps) is saved before and
/// restored after, the count and a stop are not. It answers [`PJ_CALLEE_TAIL_FELL_THROUGH`],
/// [`PJ_CALLEE_TAIL_RETURNED`] (the target's r0 in [`PjExecEnv::callee_tail_r0`]) or
/// [`PJ_CALLEE_TAIL_STOPPED`] (the target's stop recorded in `env`). The code keeps the
/// budget in `env` across the call (the target counts on from it). A host that has no such
/// entry gets such tail calls refused at load.
pub const PJ_HELPER_CALLEE_TAIL_CALL: u32 = 0x7043_0005;

/// [`PJ_HELPER_CALLEE_TAIL_CALL`]'s answer: no tail call (empty slot, index out of range,
/// count exhausted, a program of the other trust); the code goes on with r0 = 0.
pub const PJ_CALLEE_TAIL_FELL_THROUGH: u64 = 0;
/// [`PJ_HELPER_CALLEE_TAIL_CALL`]'s answer: the target ran and returned; the calling
/// function returns its r0 ([`PjExecEnv::callee_tail_r0`]) to its own caller.
pub const PJ_CALLEE_TAIL_RETURNED: u64 = 1;
/// [`PJ_HELPER_CALLEE_TAIL_CALL`]'s answer: the target stopped, as `env` records; the run
/// stops there.
pub const PJ_CALLEE_TAIL_STOPPED: u64 = 2;

/// Header of the [`PJ_HELPER_LOOKUP_VALUES`] table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjLookupValues {
    /// Records following the header.
    pub count: u64,
}

/// One map lookup site of the [`PJ_HELPER_LOOKUP_VALUES`] table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjLookupValue {
    /// The eBPF slot of the `call`.
    pub pc: u32,
    /// Bytes of the value its non-NULL result points to.
    pub value_size: u32,
    /// [`PJ_REGION_WRITABLE`] when the program may write the value.
    pub flags: u64,
}

/// `off` of the per-CPU address instruction (the kernel's `BPF_ADDR_PERCPU`).
pub const PJ_MOV_OFF_PERCPU: i16 = -1;

/// Header of the per-CPU array table of [`PJ_INLINE_PERCPU_LOOKUP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjPerCpuTable {
    /// Arrays following the header.
    pub count: u64,
    /// Offset of the rseq `cpu_id` from the thread pointer.
    pub cpu_id_offset: i64,
}

/// One per-CPU array: `cpus` slots of `slot_size` bytes from `base`, each holding
/// `entries` values of `value_size` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjPerCpuArray {
    /// CPU 0's slot.
    pub base: u64,
    /// Bytes from one CPU's slot to the next.
    pub slot_size: u64,
    /// Bytes per element.
    pub value_size: u64,
    /// Elements per slot.
    pub entries: u64,
    /// Slots (CPUs) in the array.
    pub cpus: u64,
}

/// Offsets for emitted code: the table header's fields and the first array.
pub const PJ_PERCPU_COUNT: i32 = 0;
/// Offset of [`PjPerCpuTable::cpu_id_offset`].
pub const PJ_PERCPU_CPU_ID_OFFSET: i32 = 8;
/// Offset of the first [`PjPerCpuArray`] after the header.
pub const PJ_PERCPU_ARRAYS: i32 = 16;
/// Size of one [`PjPerCpuArray`].
pub const PJ_PERCPU_ARRAY_SIZE: i32 = 40;
/// Offset of [`PjPerCpuArray::base`].
pub const PJ_PERCPU_BASE: i32 = 0;
/// Offset of [`PjPerCpuArray::slot_size`].
pub const PJ_PERCPU_SLOT_SIZE: i32 = 8;
/// Offset of [`PjPerCpuArray::value_size`].
pub const PJ_PERCPU_VALUE_SIZE: i32 = 16;
/// Offset of [`PjPerCpuArray::entries`].
pub const PJ_PERCPU_ENTRIES: i32 = 24;
/// Offset of [`PjPerCpuArray::cpus`].
pub const PJ_PERCPU_CPUS: i32 = 32;

const _: () = {
    assert!(core::mem::offset_of!(PjPerCpuTable, count) == PJ_PERCPU_COUNT as usize);
    assert!(
        core::mem::offset_of!(PjPerCpuTable, cpu_id_offset) == PJ_PERCPU_CPU_ID_OFFSET as usize
    );
    assert!(core::mem::size_of::<PjPerCpuTable>() == PJ_PERCPU_ARRAYS as usize);
    assert!(core::mem::size_of::<PjPerCpuArray>() == PJ_PERCPU_ARRAY_SIZE as usize);
    assert!(core::mem::offset_of!(PjPerCpuArray, base) == PJ_PERCPU_BASE as usize);
    assert!(core::mem::offset_of!(PjPerCpuArray, slot_size) == PJ_PERCPU_SLOT_SIZE as usize);
    assert!(core::mem::offset_of!(PjPerCpuArray, value_size) == PJ_PERCPU_VALUE_SIZE as usize);
    assert!(core::mem::offset_of!(PjPerCpuArray, entries) == PJ_PERCPU_ENTRIES as usize);
    assert!(core::mem::offset_of!(PjPerCpuArray, cpus) == PJ_PERCPU_CPUS as usize);
};

impl PjPerCpuArray {
    /// The lookup the emitted code performs, for `cpu` (0 = NULL).
    pub fn lookup(&self, cpu: u64, index: u64) -> u64 {
        if index >= self.entries || cpu >= self.cpus {
            return 0;
        }
        self.base
            .wrapping_add(cpu.wrapping_mul(self.slot_size))
            .wrapping_add(index.wrapping_mul(self.value_size))
    }
}

/// How a counter value `c` becomes nanoseconds for [`PJ_INLINE_COUNTER_CLOCK`]:
/// `ns = c * mult_int + ((c as u128 * mult_frac as u128) >> 64) + offset` (wrapping), i.e. a
/// 64.64 fixed-point multiplier `mult_int + mult_frac / 2^64` (exact to 2^-64 ns per tick)
/// plus the offset that puts the result on `CLOCK_MONOTONIC`'s time line at calibration.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PjClockScale {
    /// Whole nanoseconds per tick.
    pub mult_int: u64,
    /// Fractional nanoseconds per tick, in units of 2^-64.
    pub mult_frac: u64,
    /// Added last (wrapping).
    pub offset: u64,
}

/// Offset of [`PjClockScale::mult_int`] for emitted code.
pub const PJ_CLOCK_MULT_INT: i32 = 0;
/// Offset of [`PjClockScale::mult_frac`].
pub const PJ_CLOCK_MULT_FRAC: i32 = 8;
/// Offset of [`PjClockScale::offset`].
pub const PJ_CLOCK_OFFSET: i32 = 16;

const _: () = {
    assert!(core::mem::offset_of!(PjClockScale, mult_int) == PJ_CLOCK_MULT_INT as usize);
    assert!(core::mem::offset_of!(PjClockScale, mult_frac) == PJ_CLOCK_MULT_FRAC as usize);
    assert!(core::mem::offset_of!(PjClockScale, offset) == PJ_CLOCK_OFFSET as usize);
    assert!(core::mem::size_of::<PjHelper>() == 16);
};

impl PjClockScale {
    /// Nanoseconds for counter value `c` (the emitted code computes exactly this).
    pub const fn apply(&self, c: u64) -> u64 {
        c.wrapping_mul(self.mult_int)
            .wrapping_add(((c as u128 * self.mult_frac as u128) >> 64) as u64)
            .wrapping_add(self.offset)
    }
}

/// The bit of [`PjBackendVtable::inline_kinds`] announcing support for `kind`.
pub const fn pj_inline_bit(kind: u32) -> u32 {
    1 << kind
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
    /// Per-program random key for [`PJ_COMPILE_BLIND_CONSTANTS`] (ignored without it).
    pub blind_key: u64,
    /// Optional line table the backend fills: `pc_offsets_len` entries, one per bytecode
    /// slot, each the byte offset of that slot's native code (`u32::MAX` for the second slot
    /// of `lddw`). NULL when the host does not want it.
    pub pc_offsets: *mut u32,
    /// Entries at `pc_offsets` (the number of slots, `code_len / 8`).
    pub pc_offsets_len: u64,
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
    /// Entry point: `u64 (*)(void *ctx, uint64_t ctx_len, PjExecEnv *env)`.
    pub entry: u64,
    /// Bytes of machine code written.
    pub code_size: u64,
    /// Native instructions emitted.
    pub native_insns: u64,
    /// Entries of the request's `pc_offsets` the backend wrote (0 when it keeps no line table).
    pub pc_offsets_written: u64,
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
    /// Bit `pj_inline_bit(k)` set for every `PJ_INLINE_*` kind `k` the backend emits inline
    /// (see [`PjHelper::inline_kind`]). Was `reserved` (zero) before inlining existed, so a
    /// host reads an older plugin as supporting none.
    pub inline_kinds: u32,
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

// SAFETY: a backend vtable holds only pointers to static strings and functions.
unsafe impl Send for PjBackendVtable {}
// SAFETY: as above; nothing in it is mutated after construction.
unsafe impl Sync for PjBackendVtable {}
// SAFETY: an arena vtable's context is one the host promises is usable from any thread while
// the vtable is alive.
unsafe impl Send for PjArenaVtable {}
// SAFETY: as above.
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

/// Signature of JIT-compiled code: `r1 = ctx`, `r2 = ctx_len`, returns r0. `env` is always a
/// valid [`PjExecEnv`] with `ctx_start`/`ctx_end`/`budget`/`regions` filled and the stop
/// fields zero; after the call `stop_kind != PJ_STOP_NONE` means the program stopped.
pub type PjProgramEntry =
    unsafe extern "C" fn(ctx: *mut u8, ctx_len: u64, env: *mut PjExecEnv) -> u64;

/// Signature of a helper function.
pub type PjHelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;
