//! The machine reads behind the inlined helpers (`PJ_INLINE_*`), done the way the backends'
//! code does them, so the interpreter and the JIT agree: the thread pointer (for the rseq
//! `cpu_id`) and the constant-rate counter (for the monotonic clock). The runtime uses the
//! same functions to decide, at load time, whether inlining is possible.

/// The thread pointer the backends read: `fs` base on x86-64 (glibc keeps the TCB's own
/// address at `fs:0`), `tpidr_el0` on arm64, `tp` on RV64; 0 elsewhere.
pub fn thread_pointer() -> usize {
    #[allow(unused_mut)]
    let mut tp: usize = 0;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: glibc's TCB header starts with a pointer to itself (`tcbhead_t::tcb`), so
    // `fs:0` is the fs base; reading it has no side effects.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reading the EL0 thread register has no side effects.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    #[cfg(target_arch = "riscv64")]
    // SAFETY: copying tp has no side effects.
    unsafe {
        std::arch::asm!("mv {}, tp", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    tp
}

/// This thread's rseq `cpu_id`: the `u32` at `thread_pointer() + offset`.
///
/// # Safety
/// `thread pointer + offset` must be a readable, 4-byte aligned `u32` in every thread that
/// calls this (glibc's `__rseq_offset + 4` when `__rseq_size > 0`).
pub unsafe fn rseq_cpu_id(offset: i64) -> u32 {
    let p = (thread_pointer() as i64).wrapping_add(offset) as *const u32;
    // SAFETY: promised by the caller; volatile because the kernel rewrites it behind our back.
    unsafe { p.read_volatile() }
}

/// The constant-rate counter the backends read: `rdtsc` (x86-64), `cntvct_el0` after an
/// `isb` (arm64), `rdtime` (RV64); 0 elsewhere.
pub fn read_counter() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc only reads the time-stamp counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let c: u64;
        // SAFETY: reading the virtual counter (EL0-accessible on Linux) has no side effects.
        unsafe {
            std::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) c, options(nostack, nomem, preserves_flags));
        }
        c
    }
    #[cfg(target_arch = "riscv64")]
    {
        let c: u64;
        // SAFETY: rdtime only reads the time CSR.
        unsafe {
            std::arch::asm!("rdtime {}", out(reg) c, options(nostack, nomem, preserves_flags));
        }
        c
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64"
    )))]
    {
        0
    }
}

/// arm64's `cntfrq_el0`: the counter frequency in Hz (0 elsewhere).
pub fn counter_frequency_register() -> u64 {
    #[allow(unused_mut)]
    let mut f: u64 = 0;
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reading the counter-frequency register has no side effects.
    unsafe {
        std::arch::asm!("mrs {}, cntfrq_el0", out(reg) f, options(nostack, nomem, preserves_flags));
    }
    f
}
