//! The register map: which arm64 register holds each BPF register, and which registers the
//! lowering may use as scratch. Modelled on the kernel's `arch/arm64/net/bpf_jit_comp.c`.
//!
//! | BPF | arm64 | why |
//! |-----|-------|-----|
//! | r0  | x7    | caller-saved, not an argument register: helper calls need no shuffling |
//! | r1–r5 | x0–x4 | the AAPCS64 argument registers: helpers and bpf-to-bpf calls get their arguments in place; the entry's `(ctx, len)` arrive as r1, r2 |
//! | r6–r9 | x19–x22 | callee-saved: they survive helper calls for free; saved only when written |
//! | r10 | — | never in a register: the frame is `[sp, sp+512)` so r10 = sp + 512 and stack accesses are `sp`-relative |
//! | scratch | x9–x13 | caller-saved temporaries, never live across eBPF instructions |
//! | x26 | | the entry frame's sp, kept only when `callx` sits inside a subprogram (to unwind all frames on an unknown id) |

/// BPF register → arm64 register number (r10 has no register; see the module docs).
pub(crate) const REG_MAP: [u8; 10] = [
    7,  // r0: return value; x7 is caller-saved and outside the argument registers
    0,  // r1: first argument (ctx at entry), also the helper's first argument
    1,  // r2: second argument (ctx_len at entry)
    2,  // r3: third argument
    3,  // r4: fourth argument
    4,  // r5: fifth argument
    19, // r6: callee-saved, survives helper calls without spills
    20, // r7: callee-saved
    21, // r8: callee-saved
    22, // r9: callee-saved
];

/// Scratch registers: caller-saved, never live across eBPF instructions.
/// T0 holds addresses and offsets, T1 materialised immediates, T2 stored values and helper
/// addresses, T3 exclusive-monitor status, T4 a materialised r10 source.
pub(crate) const T0: u8 = 9;
pub(crate) const T1: u8 = 10;
pub(crate) const T2: u8 = 11;
pub(crate) const T3: u8 = 12;
pub(crate) const T4: u8 = 13;
/// The zero register in the X/W families (and `sp` in the XSP family).
pub(crate) const ZR: u8 = 31;
/// Holds the entry frame's stack pointer for the `callx` unwind (callee-saved).
pub(crate) const ABORT_SP: u8 = 26;
/// Where the native return value arrives (and where the entry returns r0).
pub(crate) const RET: u8 = 0;
