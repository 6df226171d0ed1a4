//! # packjit-rv64
//!
//! The RV64 JIT backend of packjit: verified eBPF (RFC 9669, cpu v4) in, position-independent
//! RV64IMAC machine code out, emitted with dynasm's riscv64 assembler and written into the
//! host's code arena. Optional extensions, each used only when the request's feature bits
//! allow it:
//!
//! * [`FEATURE_ZBB`]: `rev8` for byte swaps, `sext.b/h` and `zext.h` for extensions;
//! * [`FEATURE_ZBA`]: `add.uw rd, rs, zero` (`zext.w`) for 32-bit zero-extension;
//! * [`FEATURE_C`]: compressed encodings wherever operands allow.
//!
//! Compile flags (validated by the front end): `PJ_COMPILE_SANDBOX` checks every access not
//! proven safe against the context, the stack block and `env.regions`, Spectre-safely;
//! `PJ_COMPILE_BUDGET` charges taken back-edges and local calls; `PJ_COMPILE_BLIND_CONSTANTS`
//! blinds every immediate. See the crate README for the code each one emits and its cost.
//!
//! Usable statically (`Rv64Backend` implements [`JitBackend`](packjit_plugin_api::JitBackend)) or as a plugin
//! (`libpackjit_rv64.so`, entry symbol `packjit_rv64_plugin_v1`); [`emit_program`] and
//! [`emit_request`] give the code without an arena (tools, tests).
//!
//! ```
//! use packjit_plugin_api::{Arch, JitBackend};
//! let b = packjit_rv64::Rv64Backend::new();
//! assert_eq!(b.arch(), Arch::Riscv64);
//! // mov r0, 7 ; exit  ->  li a0, 7 ; ret (a program that calls nothing keeps r0 in a0)
//! let code = [0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
//! let out = packjit_rv64::emit_program(&code, &[], 0).unwrap();
//! assert_eq!(out.bytes[..], [0x13, 0x05, 0x70, 0x00, 0x67, 0x80, 0x00, 0x00]);
//! ```

mod encode;
mod frame;
/// Bytes from the entry of a program with the uniform tail-call frame to its tail entry
/// (the runtime keeps the same figure for the address it stores in a prog-array slot).
pub use frame::TAIL_ENTRY_SKIP;
mod lower;
mod regs;

#[doc(hidden)]
pub use lower::emit_decoded_with;

use packjit_frontend::target::{Target, EVERY_INLINE_KIND};
use packjit_plugin_api::Arch;

/// Zbb (basic bit manipulation) is available.
pub const FEATURE_ZBB: u64 = 1 << 0;
/// Zba (address generation) is available.
pub const FEATURE_ZBA: u64 = 1 << 1;
/// C (compressed instructions) may be used.
pub const FEATURE_C: u64 = 1 << 2;
/// Every feature bit this backend understands.
pub const SUPPORTED_FEATURES: u64 = FEATURE_ZBB | FEATURE_ZBA | FEATURE_C;

/// The RV64 backend as the front end's entry points see it.
pub const TARGET: Target = Target {
    arch: Arch::Riscv64,
    isa: "riscv64",
    name: "packjit-rv64",
    detect_features: detect::detect,
    supported_features: SUPPORTED_FEATURES,
    inline_kinds: EVERY_INLINE_KIND,
    lower: emit_decoded_with,
};

/// The RV64 backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rv64Backend;

impl Rv64Backend {
    /// Creates the backend (stateless).
    pub fn new() -> Self {
        Self
    }
}

/// Counts native instructions in RV64 code (16- and 32-bit parcels).
pub fn native_insn_count(code: &[u8]) -> usize {
    encode::count_insns(code)
}

packjit_frontend::backend_crate!(Rv64Backend, TARGET);

/// Run-time CPU feature detection.
pub mod detect {
    #[cfg(target_arch = "riscv64")]
    use super::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};

    /// Features of the running CPU: `riscv_hwprobe` (Linux 6.4+), else the `isa` line of
    /// `/proc/cpuinfo`, else nothing. Always 0 on other architectures.
    pub fn detect() -> u64 {
        #[cfg(target_arch = "riscv64")]
        {
            if let Some(f) = hwprobe() {
                return f;
            }
            if let Ok(s) = std::fs::read_to_string("/proc/cpuinfo") {
                return parse_cpuinfo(&s);
            }
        }
        0
    }

    #[cfg(target_arch = "riscv64")]
    fn hwprobe() -> Option<u64> {
        #[repr(C)]
        struct Pair {
            key: i64,
            value: u64,
        }
        const SYS_RISCV_HWPROBE: libc::c_long = 258;
        const KEY_IMA_EXT_0: i64 = 4;
        const IMA_C: u64 = 1 << 1;
        const EXT_ZBA: u64 = 1 << 3;
        const EXT_ZBB: u64 = 1 << 4;
        let mut pair = Pair {
            key: KEY_IMA_EXT_0,
            value: 0,
        };
        // SAFETY: one valid pair, no cpu set (all CPUs), flags 0.
        let rc = unsafe {
            libc::syscall(
                SYS_RISCV_HWPROBE,
                &mut pair as *mut Pair,
                1usize,
                0usize,
                0usize,
                0u32,
            )
        };
        // The kernel sets key to -1 when it does not know it.
        if rc != 0 || pair.key != KEY_IMA_EXT_0 {
            return None;
        }
        let mut f = 0;
        if pair.value & IMA_C != 0 {
            f |= FEATURE_C;
        }
        if pair.value & EXT_ZBA != 0 {
            f |= FEATURE_ZBA;
        }
        if pair.value & EXT_ZBB != 0 {
            f |= FEATURE_ZBB;
        }
        Some(f)
    }

    /// Parses an `isa : rv64imafdc_zba_zbb...` line (the features common to every hart).
    pub fn parse_cpuinfo(s: &str) -> u64 {
        let mut common: Option<u64> = None;
        for line in s.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            if k.trim() != "isa" {
                continue;
            }
            let isa = v.trim().to_ascii_lowercase();
            let Some(rest) = isa.strip_prefix("rv64") else {
                continue;
            };
            let mut parts = rest.split('_');
            let base = parts.next().unwrap_or("");
            let mut f = 0;
            if base.contains('c') {
                f |= 1 << 2;
            }
            for ext in parts {
                match ext {
                    "zba" => f |= 1 << 1,
                    "zbb" => f |= 1 << 0,
                    _ => {}
                }
            }
            common = Some(common.map_or(f, |c| c & f));
        }
        common.unwrap_or(0)
    }
}

packjit_plugin_api::export_backend!("packjit_rv64_plugin_v1", Rv64Backend, Rv64Backend::new());
