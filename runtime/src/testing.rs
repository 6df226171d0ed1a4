//! Knobs for tests, benchmarks and emulators, kept out of [`Runtime`]'s everyday API.
//!
//! A host gets the built-in helpers right without them: the runtime detects rseq and the
//! counter clock itself and inlines where it can (see [`builtins`]). These
//! overrides exist to compare the inline and call paths (benchmarks), and to run the inline
//! paths where detection says no (qemu-user has no rseq syscall, and RV64 under qemu no
//! known counter rate). Bring them in with the extension trait:
//!
//! ```
//! use packjit::testing::RuntimeTestExt;
//! let rt = packjit::Runtime::new()?;
//! rt.set_inline_builtins(false); // every later load calls sched_getcpu / clock_gettime
//! # Ok::<(), packjit::Error>(())
//! ```

use crate::{abi, builtins, Runtime};

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Runtime {}
}

/// Test, benchmark and emulator overrides of how later loads treat the built-in helpers
/// (ids 5 and 8; see [`builtins`]). Implemented for [`Runtime`] only. Each applies to
/// programs loaded after it; programs loaded before keep what they got
/// ([`Program::builtins`](crate::Program::builtins) says what that was).
pub trait RuntimeTestExt: sealed::Sealed {
    /// Turns inlining of the built-in helpers on (the default) or off (every load calls
    /// `sched_getcpu` / `clock_gettime`; benchmarks compare the two).
    fn set_inline_builtins(&self, on: bool);

    /// Overrides the rseq detection for later loads: `Some(offset)` inlines the CPU id as a
    /// `u32` load at thread pointer + `offset`, `None` forces the `sched_getcpu` call.
    /// For tests and emulators (qemu-user 7.2 has no rseq syscall, so glibc registers none):
    /// a test can point `offset` at a thread-local `cpu_id` it keeps current itself.
    ///
    /// # Safety
    /// With `Some(offset)`, thread pointer + `offset` must be a readable, aligned `u32` in
    /// every thread that runs a program loaded afterwards, for as long as it can run.
    unsafe fn set_rseq_cpu_id_offset(&self, offset: Option<i64>);

    /// Overrides the counter-clock detection for later loads: `Some(hz)` inlines the clock
    /// with a scale made for a counter at `hz` (e.g. [`builtins::measure_counter_hz`] where
    /// the platform does not tell the frequency), `None` forces the `clock_gettime` call.
    /// Each call with `Some` leaks one 24-byte scale (code reads it for its whole life).
    fn set_counter_clock_hz(&self, hz: Option<u64>);
}

impl RuntimeTestExt for Runtime {
    fn set_inline_builtins(&self, on: bool) {
        self.builtin_overrides
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .inline = on;
    }

    unsafe fn set_rseq_cpu_id_offset(&self, offset: Option<i64>) {
        self.builtin_overrides
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .rseq = Some(offset);
    }

    fn set_counter_clock_hz(&self, hz: Option<u64>) {
        let clock = hz.map(|hz| {
            let scale: &'static abi::PjClockScale = Box::leak(Box::new(builtins::scale_for(hz)));
            (scale, hz, "set by the host")
        });
        self.builtin_overrides
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clock = Some(clock);
    }
}
