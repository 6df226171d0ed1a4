//! The register map: which RV64 register holds each eBPF register, and the roles of the
//! native registers the lowering reserves.
//!
//! | eBPF | RV64 | why |
//! |------|------|-----|
//! | r0 | a5 (x15) | caller-saved (r0 is clobbered by every call anyway); in x8–x15 so C forms apply |
//! | r1–r5 | a0–a4 (x10–x14) | helper and local-call arguments are already in place |
//! | r6–r9 | s1–s4 (x9, x18–x20) | callee-saved: survive helper calls for free |
//! | r10 | s5 (x21) | callee-saved frame pointer of the current (sub)program |
//! | — | s6 (x22) | sp of the entry frame, for `callx`'s abort path |
//! | — | t0–t6, a6, a7 | scratch (never live across an eBPF instruction) |

use crate::encode::reg::*;

/// eBPF register → RV64 register, one row per eBPF register.
const REG_MAP: [u8; 11] = [
    A5, // r0: return value; caller-saved like r0 itself
    A0, // r1: first argument (context pointer at entry)
    A1, // r2: second argument (context length at entry)
    A2, // r3: third argument
    A3, // r4
    A4, // r5: fifth argument, last one a helper takes
    S1, // r6: callee-saved in both ABIs
    S2, // r7
    S3, // r8
    S4, // r9
    S5, // r10: frame pointer, read-only for the program
];

/// The native register holding eBPF register `r`.
pub fn map(r: u8) -> u8 {
    REG_MAP[r as usize]
}
