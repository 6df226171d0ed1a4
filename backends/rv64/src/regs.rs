//! The register map: which RV64 register holds each eBPF register, and the roles of the
//! native registers the lowering reserves.
//!
//! | eBPF | RV64 | why |
//! |------|------|-----|
//! | r0 | a5 (x15) | caller-saved (r0 is clobbered by every call anyway); in x8–x15 so C forms apply (a0 in a program that calls nothing, see [`call_free_map`]) |
//! | r1–r5 | a0–a4 (x10–x14) | helper and local-call arguments are already in place (r1 in a5 in a program that calls nothing) |
//! | r6–r9 | s1–s4 (x9, x18–x20) | callee-saved: survive helper calls for free |
//! | r10 | s5 (x21) | callee-saved frame pointer of the current (sub)program |
//! | — | s6 (x22) | the run's `PjExecEnv *` (entry argument a2), when the code can stop |
//! | — | s7, s8 (x23, x24) | sandbox: context start and length (from `env`) |
//! | — | s9, s10 (x25, x26) | sandbox: stack block start and length |
//! | — | s11 (x27) | budget: instructions left (written back to `env` on return) |
//! | AX | a7 (x17) | the blinding rewrite's register for a masked constant (`packjit_frontend::blind`) |
//! | ENV | s6 (x22) | the env register, as the legacy packet loads' base for the context start (`packjit_frontend::packet`) |
//! | — | t0–t6, a6 | scratch (never live across an eBPF instruction) |
//!
//! s6–s11 are set by the entry and never changed by callees, so only the entry saves them.

use crate::encode::reg::*;

/// eBPF register → RV64 register, one row per eBPF register, one for the blinding
/// rewrite's AX and one for the packet loads' ENV.
pub type RegMap = [u8; 13];

/// The map of programs that call something: helpers and local calls find their arguments
/// in place and return in a5.
pub const REG_MAP: RegMap = [
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
    A7, // AX: the blinding rewrite's register (`packjit_frontend::blind::AX`); written only on a stop path otherwise
    S6, // ENV: the legacy packet loads' base for the context start (`packjit_frontend::packet::ENV`): the env register
];

/// The run's `PjExecEnv *`: callee-saved, so helpers and local calls keep it.
pub const ENV: u8 = S6;
/// Sandbox: first byte of the context.
pub const CTX_START: u8 = S7;
/// Sandbox: context length in bytes.
pub const CTX_LEN: u8 = S8;
/// Sandbox: first byte of the stack block.
pub const STACK_START: u8 = S9;
/// Sandbox: stack block length in bytes.
pub const STACK_LEN: u8 = S10;
/// Budget: instructions left.
pub const BUDGET: u8 = S11;

/// The native register holding eBPF register `r` under [`REG_MAP`].
pub fn map(r: u8) -> u8 {
    REG_MAP[r as usize]
}

/// The map of a program that calls nothing (no helper, `callx`, local call or per-CPU
/// mov): it owes nobody a calling convention, so r0 lives in a0, where the entry returns
/// it, and r1 in a5; the context moves there only when the program reads r1 before writing
/// it.
pub fn call_free_map() -> RegMap {
    let mut m = REG_MAP;
    m.swap(0, 1);
    m
}
