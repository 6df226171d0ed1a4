//! Built-in helpers the runtime provides itself, and whether the backend inlines them.
//!
//! * `bpf_get_smp_processor_id` (kernel helper id 8, [`PJ_HELPER_GET_SMP_PROCESSOR_ID`]):
//!   inlined as one load of the rseq `cpu_id` through the thread pointer when glibc
//!   registered rseq for the process (`__rseq_size > 0`, glibc ≥ 2.35), else a call to
//!   `sched_getcpu`.
//! * `bpf_ktime_get_ns` (kernel helper id 5, [`PJ_HELPER_KTIME_GET_NS`]): inlined as a read of
//!   the CPU's constant-rate counter scaled to nanoseconds when the counter's frequency is
//!   known (see [`ClockImpl`]), else a call to `clock_gettime(CLOCK_MONOTONIC)`.
//!
//! * the per-CPU array lookup ([`PJ_HELPER_PERCPU_LOOKUP`], packjit's own id):
//!   `lookup(array_id, index)` → this CPU's element or NULL, inlined (bounds checks, the rseq
//!   `cpu_id`, one multiply-add per index) when rseq is registered, else a call using
//!   `sched_getcpu`. Arrays are registered with [`Runtime::add_percpu_array`](crate::Runtime::add_percpu_array);
//!   their memory is an ordinary read-write sandbox region.
//!
//! The choice is made once per process (the facts do not change), applied at every load,
//! and reported on each [`Program`](crate::Program) ([`Program::builtins`](crate::Program::builtins)) and by
//! [`Runtime::builtins`](crate::Runtime::builtins). A host that registers its own helper
//! under id 5 or 8 keeps it: the built-in only fills an id nobody registered.
//!
//! **Migration.** The CPU id is a hint, exactly as in the kernel: the thread may move to
//! another CPU right after the load (or the `sched_getcpu` call), so code must stay correct
//! whichever CPU's slot it then uses (atomics on per-CPU counters, not plain
//! read-modify-write, when threads can share a CPU).

use packjit_interp::hw;
use packjit_plugin_api::abi::*;
use packjit_plugin_api::HelperEntry;
use std::fmt;
use std::sync::OnceLock;

/// How a program's `bpf_get_smp_processor_id` (id 8) is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuIdImpl {
    /// Inlined: `u32` load at thread pointer + `offset` (the rseq `cpu_id`).
    InlineRseq {
        /// Byte offset from the thread pointer (`__rseq_offset + 4`).
        offset: i64,
    },
    /// A call to the runtime's helper around `sched_getcpu()` (rseq not registered, or the
    /// backend does not inline).
    CallSchedGetcpu,
    /// The host registered its own helper under id 8.
    Host,
}

/// How a program's `bpf_ktime_get_ns` (id 5) is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockImpl {
    /// Inlined: the CPU counter (`rdtsc` / `cntvct_el0` / `rdtime`) times the scale.
    InlineCounter {
        /// Counter frequency in Hz the scale was made from.
        hz: u64,
        /// Where the frequency came from.
        source: &'static str,
    },
    /// A call to the runtime's helper around `clock_gettime(CLOCK_MONOTONIC)`.
    CallClockGettime,
    /// The host registered its own helper under id 5.
    Host,
}

/// How a program's per-CPU array lookup ([`PJ_HELPER_PERCPU_LOOKUP`]) is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerCpuLookupImpl {
    /// Inlined: bounds checks, the rseq `cpu_id`, `base + cpu * slot + index * size`.
    Inline,
    /// A call to the runtime's lookup around `sched_getcpu()`.
    CallSchedGetcpu,
    /// The host registered its own helper under the id.
    Host,
}

/// What the runtime chose for the built-in helpers of one load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuiltinChoice {
    /// `bpf_get_smp_processor_id` (id 8).
    pub cpu_id: CpuIdImpl,
    /// `bpf_ktime_get_ns` (id 5).
    pub clock: ClockImpl,
    /// The per-CPU array lookup (id [`PJ_HELPER_PERCPU_LOOKUP`]).
    pub percpu_lookup: PerCpuLookupImpl,
}

impl fmt::Display for CpuIdImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuIdImpl::InlineRseq { offset } => {
                let sign = if *offset < 0 { '-' } else { '+' };
                write!(
                    f,
                    "inline (rseq cpu_id at thread pointer {sign} {:#x})",
                    offset.unsigned_abs()
                )
            }
            CpuIdImpl::CallSchedGetcpu => f.write_str("call (sched_getcpu)"),
            CpuIdImpl::Host => f.write_str("host helper"),
        }
    }
}

impl fmt::Display for ClockImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockImpl::InlineCounter { hz, source } => {
                write!(f, "inline (counter at {hz} Hz, from {source})")
            }
            ClockImpl::CallClockGettime => f.write_str("call (clock_gettime MONOTONIC)"),
            ClockImpl::Host => f.write_str("host helper"),
        }
    }
}

impl fmt::Display for PerCpuLookupImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PerCpuLookupImpl::Inline => "inline (rseq cpu_id)",
            PerCpuLookupImpl::CallSchedGetcpu => "call (sched_getcpu)",
            PerCpuLookupImpl::Host => "host helper",
        })
    }
}

impl fmt::Display for BuiltinChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu id: {}; clock: {}; per-CPU lookup: {}",
            self.cpu_id, self.clock, self.percpu_lookup
        )
    }
}

/// Every per-CPU array registered in this process, by id (add-only: an id never changes
/// meaning, so code inlined with a snapshot and the fallback agree on every id the
/// snapshot has).
static PERCPU_ARRAYS: std::sync::RwLock<Vec<PjPerCpuArray>> = std::sync::RwLock::new(Vec::new());

/// Registers a per-CPU array; returns its id (process-wide).
pub(crate) fn register_percpu_array(a: PjPerCpuArray) -> u32 {
    let mut v = PERCPU_ARRAYS.write().unwrap_or_else(|p| p.into_inner());
    v.push(a);
    (v.len() - 1) as u32
}

/// The fallback of [`PJ_HELPER_PERCPU_LOOKUP`]: this CPU's element `index` of array `id`
/// (`sched_getcpu`), or 0 when out of bounds.
pub extern "C" fn builtin_percpu_lookup(id: u64, index: u64, _: u64, _: u64, _: u64) -> u64 {
    let v = PERCPU_ARRAYS.read().unwrap_or_else(|p| p.into_inner());
    let Some(a) = usize::try_from(id).ok().and_then(|i| v.get(i)) else {
        return 0;
    };
    a.lookup(builtin_get_smp_processor_id(0, 0, 0, 0, 0), index)
}

/// The table the inlined lookup reads: `PjPerCpuTable` then the arrays, as `u64` words
/// (owned by the program: the code reads it for its whole life).
pub(crate) fn percpu_table(cpu_id_offset: i64) -> Box<[u64]> {
    let v = PERCPU_ARRAYS.read().unwrap_or_else(|p| p.into_inner());
    let mut t = vec![v.len() as u64, cpu_id_offset as u64];
    for a in v.iter() {
        t.extend([a.base, a.slot_size, a.value_size, a.entries, a.cpus]);
    }
    t.into_boxed_slice()
}

/// The fallback of id 8: the CPU this thread runs on (0 if `sched_getcpu` fails).
pub extern "C" fn builtin_get_smp_processor_id(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as u64
}

/// The fallback of id 5: `CLOCK_MONOTONIC` in nanoseconds.
pub extern "C" fn builtin_ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    monotonic_ns()
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// glibc's rseq registration, read through `dlsym` so a libc without the symbols (older
/// glibc, musl) simply means "not registered".
///
/// Returns the offset of `cpu_id` from the thread pointer when glibc registered rseq
/// (`__rseq_size > 0`) and this thread's `cpu_id` holds a CPU (not the kernel's
/// `RSEQ_CPU_ID_UNINITIALIZED` / `REGISTRATION_FAILED`, both negative).
pub fn glibc_rseq_cpu_id_offset() -> Option<i64> {
    static CACHE: OnceLock<Option<i64>> = OnceLock::new();
    *CACHE.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names.
        let (size, off) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
            )
        };
        if size.is_null() || off.is_null() {
            return None;
        }
        // SAFETY: glibc documents `const unsigned int __rseq_size` and
        // `const ptrdiff_t __rseq_offset`, set before main and never changed.
        let (size, off) = unsafe { (*(size as *const u32), *(off as *const isize)) };
        if size == 0 {
            return None;
        }
        let offset = off as i64 + 4; // offsetof(struct rseq, cpu_id)
                                     // SAFETY: registered rseq: the area is live at this offset in every glibc thread.
        let cpu = unsafe { hw::rseq_cpu_id(offset) } as i32;
        (cpu >= 0).then_some(offset)
    })
}

/// The counter clock's scale and where its frequency came from, when this process can
/// inline a correct nanosecond clock; `None` means the fallback call.
///
/// * x86-64: only an invariant TSC (CPUID 0x8000_0007 EDX bit 8) that the kernel itself
///   uses as its clocksource (so it is synchronised across CPUs); the frequency from CPUID
///   0x15 (crystal × ratio), else the hypervisor's timing leaf 0x4000_0010, else measured
///   against `CLOCK_MONOTONIC` over 20 ms (rate error a few ppm).
/// * arm64: `cntfrq_el0` (the architected frequency, exact).
/// * RV64: the device tree's `/cpus/timebase-frequency` (exact); absent (e.g. qemu-user on
///   an x86 host, where `rdtime` returns the host's TSC at an unknown rate) → fallback.
pub fn counter_clock() -> Option<(&'static PjClockScale, u64, &'static str)> {
    static CACHE: OnceLock<Option<(PjClockScale, u64, &'static str)>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let (hz, source) = counter_frequency()?;
            Some((scale_for(hz), hz, source))
        })
        .as_ref()
        .map(|(s, hz, src)| (s, *hz, *src))
}

#[cfg(target_arch = "x86_64")]
fn counter_frequency() -> Option<(u64, &'static str)> {
    use core::arch::x86_64::__cpuid;
    let ext = __cpuid(0x8000_0000).eax;
    let invariant = ext >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0;
    let clocksource =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    if !invariant || clocksource.trim() != "tsc" {
        return None;
    }
    let max = __cpuid(0).eax;
    if max >= 0x15 {
        let l = __cpuid(0x15);
        if l.eax != 0 && l.ebx != 0 && l.ecx != 0 {
            return Some((l.ecx as u64 * l.ebx as u64 / l.eax as u64, "CPUID 0x15"));
        }
    }
    if __cpuid(1).ecx & (1 << 31) != 0 {
        let hv_max = __cpuid(0x4000_0000).eax;
        if hv_max >= 0x4000_0010 {
            let khz = __cpuid(0x4000_0010).eax;
            if khz != 0 {
                return Some((khz as u64 * 1000, "hypervisor CPUID 0x40000010"));
            }
        }
    }
    Some((measure_counter_hz(), "measured against CLOCK_MONOTONIC"))
}

#[cfg(target_arch = "aarch64")]
fn counter_frequency() -> Option<(u64, &'static str)> {
    let hz = hw::counter_frequency_register();
    (hz != 0).then_some((hz, "cntfrq_el0"))
}

#[cfg(target_arch = "riscv64")]
fn counter_frequency() -> Option<(u64, &'static str)> {
    let b = std::fs::read("/proc/device-tree/cpus/timebase-frequency").ok()?;
    let hz = match b.len() {
        4 => u32::from_be_bytes(b[..4].try_into().ok()?) as u64,
        8 => u64::from_be_bytes(b[..8].try_into().ok()?),
        _ => return None,
    };
    (hz != 0).then_some((hz, "device tree timebase-frequency"))
}

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
fn counter_frequency() -> Option<(u64, &'static str)> {
    None
}

/// The counter's rate against `CLOCK_MONOTONIC` over ~20 ms (each end bracketed by two
/// clock reads, so the error is the read jitter over 20 ms: a few ppm).
pub fn measure_counter_hz() -> u64 {
    let (c0, t0) = paired_reading();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (c1, t1) = paired_reading();
    let dt = t1.saturating_sub(t0).max(1) as u128;
    ((c1.wrapping_sub(c0) as u128 * 1_000_000_000) / dt) as u64
}

/// A counter value and the `CLOCK_MONOTONIC` time at the same moment: the tightest of a few
/// `clock, counter, clock` brackets, with the midpoint of the clock reads.
fn paired_reading() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..16 {
        let a = monotonic_ns();
        let c = hw::read_counter();
        let b = monotonic_ns();
        if b - a < best.0 {
            best = (b - a, c, a + (b - a) / 2);
        }
    }
    (best.1, best.2)
}

/// The scale turning counter ticks at `hz` into nanoseconds on `CLOCK_MONOTONIC`'s time
/// line: 1e9 / hz as 64.64 fixed point, and the offset measured now.
pub fn scale_for(hz: u64) -> PjClockScale {
    let hz = hz.max(1) as u128;
    let mult_int = (1_000_000_000 / hz) as u64;
    let mult_frac = (((1_000_000_000 % hz) << 64) / hz) as u64;
    let mut s = PjClockScale {
        mult_int,
        mult_frac,
        offset: 0,
    };
    let (c, t) = paired_reading();
    s.offset = t.wrapping_sub(s.apply(c));
    s
}

/// Inline support a load may use, after the test overrides.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Facts {
    pub rseq_offset: Option<i64>,
    pub clock: Option<(&'static PjClockScale, u64, &'static str)>,
    /// Whether the per-CPU lookup may be inlined (its table is built only then).
    pub percpu_lookup: bool,
}

/// The built-ins a load's code can call (a `call` naming them, or any `callx`): only those
/// are prepared for inlining.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wanted {
    pub clock: bool,
    pub percpu_lookup: bool,
}

/// Adds the built-in entries (ids 5 and 8) the host did not register to `table`, inline
/// when `facts` and the backend's `inline_kinds` allow, and reports the choice.
pub(crate) fn add_builtins(
    table: &mut Vec<HelperEntry>,
    facts: Facts,
    inline_kinds: u32,
    allow_inline: bool,
) -> (BuiltinChoice, Option<Box<[u64]>>) {
    let has = |t: &Vec<HelperEntry>, id| t.iter().any(|h| h.id == id);
    let cpu_id = if has(table, PJ_HELPER_GET_SMP_PROCESSOR_ID) {
        CpuIdImpl::Host
    } else {
        let inline = facts
            .rseq_offset
            .filter(|_| allow_inline && inline_kinds & pj_inline_bit(PJ_INLINE_RSEQ_CPU_ID) != 0);
        table.push(match inline {
            Some(offset) => HelperEntry {
                id: PJ_HELPER_GET_SMP_PROCESSOR_ID,
                inline_kind: PJ_INLINE_RSEQ_CPU_ID,
                addr: offset as u64,
            },
            None => HelperEntry {
                id: PJ_HELPER_GET_SMP_PROCESSOR_ID,
                inline_kind: PJ_INLINE_NONE,
                addr: builtin_get_smp_processor_id as *const () as u64,
            },
        });
        match inline {
            Some(offset) => CpuIdImpl::InlineRseq { offset },
            None => CpuIdImpl::CallSchedGetcpu,
        }
    };
    let clock = if has(table, PJ_HELPER_KTIME_GET_NS) {
        ClockImpl::Host
    } else {
        let inline = facts
            .clock
            .filter(|_| allow_inline && inline_kinds & pj_inline_bit(PJ_INLINE_COUNTER_CLOCK) != 0);
        table.push(match inline {
            Some((scale, _, _)) => HelperEntry {
                id: PJ_HELPER_KTIME_GET_NS,
                inline_kind: PJ_INLINE_COUNTER_CLOCK,
                addr: scale as *const PjClockScale as u64,
            },
            None => HelperEntry {
                id: PJ_HELPER_KTIME_GET_NS,
                inline_kind: PJ_INLINE_NONE,
                addr: builtin_ktime_get_ns as *const () as u64,
            },
        });
        match inline {
            Some((_, hz, source)) => ClockImpl::InlineCounter { hz, source },
            None => ClockImpl::CallClockGettime,
        }
    };
    let mut percpu_table_box = None;
    let percpu_lookup = if has(table, PJ_HELPER_PERCPU_LOOKUP) {
        PerCpuLookupImpl::Host
    } else {
        let inline = facts.rseq_offset.filter(|_| {
            facts.percpu_lookup
                && allow_inline
                && inline_kinds & pj_inline_bit(PJ_INLINE_PERCPU_LOOKUP) != 0
        });
        match inline {
            Some(offset) => {
                let t = percpu_table(offset);
                table.push(HelperEntry {
                    id: PJ_HELPER_PERCPU_LOOKUP,
                    inline_kind: PJ_INLINE_PERCPU_LOOKUP,
                    addr: t.as_ptr() as u64,
                });
                percpu_table_box = Some(t);
                PerCpuLookupImpl::Inline
            }
            None => {
                table.push(HelperEntry {
                    id: PJ_HELPER_PERCPU_LOOKUP,
                    inline_kind: PJ_INLINE_NONE,
                    addr: builtin_percpu_lookup as *const () as u64,
                });
                PerCpuLookupImpl::CallSchedGetcpu
            }
        }
    };
    (
        BuiltinChoice {
            cpu_id,
            clock,
            percpu_lookup,
        },
        percpu_table_box,
    )
}
