//! # packjit-arm64
//!
//! The AArch64 backend of packjit: verified eBPF (RFC 9669, cpu v4) in, position-independent
//! arm64 machine code out, written into the host's code arena.
//!
//! * [`Arm64Backend`] implements [`JitBackend`](packjit_plugin_api::JitBackend); the crate is also a plugin
//!   (`libpackjit_arm64.so`, symbol `packjit_arm64_plugin_v1`).
//! * Optional CPU features: [`FEATURE_LSE`] (ARMv8.1 atomics). Without it, atomics are
//!   LDXR/STXR loops; a host can force that path by passing `features = 0`.
//! * [`emit_program`] / [`emit_request`] give the bytes without an arena (tools, tests).
//! * Every compile flag of the sandbox contract (`docs/ARCHITECTURE.md`): `PJ_COMPILE_SANDBOX`
//!   (inline bounds checks with a CSEL clamp, a zeroed contiguous stack block),
//!   `PJ_COMPILE_BUDGET` (charges at back-edges and local calls) and
//!   `PJ_COMPILE_BLIND_CONSTANTS`; in every mode r0 and r3–r9 start at zero and an unknown
//!   `callx` id stops the program (`PJ_STOP_UNKNOWN_CALLX`).
//!
//! The code generator has the file set every packjit backend has: [`regs`] (register map),
//! `frame` (prologue, epilogue, stack layout), `lower` (one function per instruction class),
//! `encode` (instruction forms, immediates, branch forms and relaxation).
//!
//! ```
//! use packjit_arm64::Arm64Backend;
//! use packjit_plugin_api::{Arch, JitBackend};
//! let be = Arm64Backend::new();
//! assert_eq!(be.arch(), Arch::Aarch64);
//! // mov r0, 7 ; exit  ->  mov x0, #7 ; ret (a program that calls nothing keeps r0 in x0)
//! let code = [0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
//! let out = packjit_arm64::emit_program(&code, &[], 0).unwrap();
//! assert_eq!(out.bytes.len(), 8);
//! ```

// dynasm expands every dynamic register `X(r)` to `r.into()`; with `u8` registers that is an
// identity conversion clippy would flag at each of the ~200 sites.
#![allow(clippy::useless_conversion)]

/// `dynasm!` for aarch64, the one assembler macro every module uses.
macro_rules! a64 {
    ($ops:expr; $($t:tt)*) => {
        dynasm!($ops ; .arch aarch64 ; $($t)*)
    };
}

mod encode;
mod frame;
/// Bytes from the entry of a program with the uniform tail-call frame to its tail entry
/// (the runtime keeps the same figure for the address it stores in a prog-array slot).
pub use frame::TAIL_ENTRY_SKIP;
mod lower;
pub mod regs;

#[doc(hidden)]
pub use lower::emit_decoded_with;

use packjit_frontend::target::{Target, EVERY_INLINE_KIND};
use packjit_plugin_api::Arch;

/// LSE atomics (ARMv8.1 `LDADD`/`SWP`/`CAS`...): one instruction per eBPF atomic instead of
/// an exclusive-monitor loop.
pub const FEATURE_LSE: u64 = 1 << 0;

/// Every feature bit this backend understands.
pub const SUPPORTED_FEATURES: u64 = FEATURE_LSE;

/// The arm64 backend as the front end's entry points see it.
pub const TARGET: Target = Target {
    arch: Arch::Aarch64,
    isa: "arm64",
    name: "packjit-arm64",
    detect_features: detect_cpu_features,
    supported_features: SUPPORTED_FEATURES,
    inline_kinds: EVERY_INLINE_KIND,
    lower: emit_decoded_with,
};

/// The arm64 JIT backend. Stateless: one instance can compile for any number of threads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Arm64Backend;

impl Arm64Backend {
    /// A backend instance.
    pub const fn new() -> Self {
        Arm64Backend
    }
}

/// What the CPU running this process offers (`AT_HWCAP`); 0 when not running on arm64.
pub fn detect_cpu_features() -> u64 {
    #[cfg(all(target_arch = "aarch64", target_os = "linux"))]
    {
        // SAFETY: getauxval has no preconditions; it returns 0 for absent entries.
        let hwcap = unsafe { libc::getauxval(libc::AT_HWCAP) };
        if hwcap & libc::HWCAP_ATOMICS != 0 {
            return FEATURE_LSE;
        }
    }
    0
}

packjit_frontend::backend_crate!(Arm64Backend, TARGET);

packjit_plugin_api::export_backend!("packjit_arm64_plugin_v1", Arm64Backend, Arm64Backend::new());
