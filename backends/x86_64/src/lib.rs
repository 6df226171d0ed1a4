//! # packjit-x86-64
//!
//! The x86-64 backend of packjit: verified eBPF (RFC 9669, cpu v4) in, position-independent
//! x86-64 machine code out, written into the host's code arena. On an x86-64 host (where
//! most users first try packjit) its code runs natively.
//!
//! * [`X86Backend`] implements [`JitBackend`](packjit_plugin_api::JitBackend); the crate is also a plugin
//!   (`libpackjit_x86_64.so`, symbol `packjit_x86_64_plugin_v1`).
//! * Optional CPU features, detected at run time: [`FEATURE_BMI2`] (`shlx`/`shrx`/`sarx`:
//!   register shifts without going through `cl`, which is BPF r4) and [`FEATURE_MOVBE`]
//!   (a load followed by a byte swap becomes one `movbe`).
//! * The request's `PJ_COMPILE_*` flags (sandbox, budget, constant blinding) are honoured as
//!   `docs/ARCHITECTURE.md` ("Sandbox contract") describes.
//!
//! Files: [`regs`] (register map), [`frame`] (prologue, epilogue, stack layout), [`lower`]
//! (one function per instruction class), [`encode`] (instruction forms, branch relaxation).
//!
//! ```
//! use packjit_plugin_api::{Arch, JitBackend};
//! let be = packjit_x86_64::X86Backend::new();
//! assert_eq!(be.arch(), Arch::X86_64);
//! // mov r0, 7 ; exit  ->  endbr64 ; mov eax, 7 ; ret
//! let code = [0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
//! let out = packjit_x86_64::emit_program(&code, &[], 0).unwrap();
//! assert_eq!(out.bytes, [0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 7, 0, 0, 0, 0xc3]);
//! ```

pub mod encode;
pub mod frame;
pub mod lower;
pub mod regs;

#[doc(hidden)]
pub use lower::emit_decoded_with;

use packjit_frontend::target::{Target, EVERY_INLINE_KIND};
use packjit_plugin_api::Arch;

/// BMI2: `shlx`/`shrx`/`sarx` take the count in any register and leave flags alone.
pub const FEATURE_BMI2: u64 = 1 << 0;
/// MOVBE: byte-swapping loads (`ldx` + `be16/32/64` of the same register fuse).
pub const FEATURE_MOVBE: u64 = 1 << 1;
/// Every feature bit this backend understands.
pub const SUPPORTED_FEATURES: u64 = FEATURE_BMI2 | FEATURE_MOVBE;

/// The x86-64 backend as the front end's entry points see it.
pub const TARGET: Target = Target {
    arch: Arch::X86_64,
    isa: "x86-64",
    name: "packjit-x86-64",
    detect_features: detect_cpu_features,
    supported_features: SUPPORTED_FEATURES,
    inline_kinds: EVERY_INLINE_KIND,
    lower: emit_decoded_with,
};

/// The x86-64 JIT backend. Stateless: one instance compiles for any number of threads.
#[derive(Clone, Copy, Debug, Default)]
pub struct X86Backend;

impl X86Backend {
    /// A backend instance.
    pub const fn new() -> Self {
        X86Backend
    }
}

/// What the CPU running this process offers (CPUID via std's detection); 0 elsewhere.
pub fn detect_cpu_features() -> u64 {
    #[allow(unused_mut)]
    let mut f = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("bmi2") {
            f |= FEATURE_BMI2;
        }
        if std::arch::is_x86_feature_detected!("movbe") {
            f |= FEATURE_MOVBE;
        }
    }
    f
}

packjit_frontend::backend_crate!(X86Backend, TARGET);

packjit_plugin_api::export_backend!("packjit_x86_64_plugin_v1", X86Backend, X86Backend::new());
