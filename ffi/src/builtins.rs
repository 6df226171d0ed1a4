//! The built-in helpers (`bpf_get_smp_processor_id`, `bpf_ktime_get_ns`, the per-CPU
//! array lookup) and per-CPU arrays.

use super::args::{check_size, out_arg};
use super::error::{boundary, invalid};
use super::program::{program, PackjitProgram};
use super::runtime::{runtime, PackjitRuntime};
use super::{PACKJIT_BUILTIN_CALL, PACKJIT_BUILTIN_HOST, PACKJIT_BUILTIN_INLINE};
use core::ffi::c_void;

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
        // A switch on a live runtime in the C API; in Rust, one of the test knobs.
        use packjit_runtime::testing::RuntimeTestExt as _;
        h.rt.set_inline_builtins(on != 0);
        Ok(())
    })
}
