//! The register map: which arm64 register holds each BPF register, which hold the sandbox's
//! run-time state, and which the lowering may use as scratch. Modelled on the kernel's
//! `arch/arm64/net/bpf_jit_comp.c`.
//!
//! | BPF / role | arm64 | why |
//! |-----|-------|-----|
//! | r0  | x7    | caller-saved, not an argument register: helper calls need no shuffling (x0 in a program that calls nothing, see `RegMap`) |
//! | r1–r5 | x0–x4 | the AAPCS64 argument registers: helpers and bpf-to-bpf calls get their arguments in place; the entry's `(ctx, len)` arrive as r1, r2 |
//! | r6–r9 | x19–x22 | callee-saved: they survive helper calls for free; saved only when written (x14–x17 in trusted functions that call nothing, see `RegMap`) |
//! | r10 (trusted) | — | the frame is `[sp, sp+512)`: r10 = sp + 512, stack accesses are `sp`-relative |
//! | r10 (sandbox) | x25 = r10 − 512 | the frame lives in the contiguous stack block, below its caller's: a register, moved by 512 around each local call |
//! | env | x28 | the `PjExecEnv *` (third entry argument), kept whenever the program can stop |
//! | budget | x27 | instructions left (budget mode); written back to `env.budget` on every exit |
//! | stack block start | x26 | sandbox: `env.stack_start`, for the stack-block check |
//! | ctx start, ctx length | x23, x24 | sandbox: the context bounds the inline check compares against |
//! | scratch | x9–x13 | caller-saved temporaries of the lowering, never live across eBPF instructions |
//! | check scratch | x14–x17, x5, x6, x8 | the sandbox checks and stop paths only (x9 holds the checked address) |
//! | AX (blinding) | x13 | the blinding rewrite's register for a masked constant (`packjit_frontend::blind`) |
//! | ENV (packet loads) | x28 | the env register again, as the base the legacy packet loads' rewrite reads the context start through (`packjit_frontend::packet`) |
//!
//! Every register in the callee-saved range x23–x28 is constant for a run (x25 is restored
//! after each local call), so helpers — AAPCS64 functions — preserve them for free.

/// BPF register → arm64 register number, and the blinding register (see the module docs).
pub(crate) const REG_MAP: RegMap = [
    7,  // r0: return value; x7 is caller-saved and outside the argument registers
    0,  // r1: first argument (ctx at entry), also the helper's first argument
    1,  // r2: second argument (ctx_len at entry)
    2,  // r3: third argument (the env pointer arrives here: moved to ENV before r3 is zeroed)
    3,  // r4: fourth argument
    4,  // r5: fifth argument
    19, // r6: callee-saved, survives helper calls without spills
    20, // r7: callee-saved
    21, // r8: callee-saved
    22, // r9: callee-saved
    // r10 has no register (see the module docs): the lowering never reads this entry.
    ZR,
    // The blinding rewrite's AX (`packjit_frontend::blind`): x13 is lowering scratch that
    // nothing lowering an instruction with a register operand writes (it holds a stored
    // value across a failed inline check, whose shared check uses x6, x8, x10, x12, x14-x17).
    T4,
    // ENV, the legacy packet loads' base for the context start (`packjit_frontend::packet`):
    // x28, which holds `env` (kept for such programs: `CodegenMode::keeps_env`).
    ENV,
];

/// The lowest callee-saved register (x19–x28 are callee-saved in AAPCS64).
pub(crate) const CALLEE_SAVED_FIRST: u8 = 19;

/// A function's register map (BPF register → arm64 register). Every function that calls
/// anything uses [`REG_MAP`], the calling convention between functions and helpers. A
/// function that calls nothing owes nobody a convention, so two cheaper maps apply there
/// (the tables above show [`REG_MAP`]):
///
/// * r6–r9 in x14–x17 instead of x19–x22, when the code is trusted and cannot stop: those
///   are the sandbox's and the stop paths' scratch, free otherwise, and caller-saved, so
///   the function saves and restores nothing (a leaf needs no callee-saved register).
/// * r0 in x0 and r1 in x7, when the whole program calls nothing (so it is one function):
///   r0 is then already where the entry returns it, and the context moves to x7 only when
///   the program reads r1 before writing it.
pub(crate) type RegMap = [u8; 13];

/// The map of a function that makes no calls: see [`RegMap`].
pub(crate) fn leaf_map(scratch_free: bool, whole_program_leaf: bool) -> RegMap {
    let mut map = REG_MAP;
    if scratch_free {
        map[6..10].copy_from_slice(&[14, 15, 16, 17]);
    }
    if whole_program_leaf {
        map[0] = RET;
        map[1] = 7;
    }
    map
}

/// Scratch registers: caller-saved, never live across eBPF instructions.
/// T0 holds addresses and offsets, T1 materialised immediates, T2 stored values and helper
/// addresses, T3 exclusive-monitor status, T4 a materialised r10 source and the blinding
/// rewrite's AX.
pub(crate) const T0: u8 = 9;
pub(crate) const T1: u8 = 10;
pub(crate) const T2: u8 = 11;
pub(crate) const T3: u8 = 12;
pub(crate) const T4: u8 = 13;
/// Check scratch: `C0` the offset into a region, `C1` the stop word (kind | access << 32),
/// `C2` the stop pc, `C3` where a successful out-of-line check resumes.
pub(crate) const C0: u8 = 14;
pub(crate) const C1: u8 = 16;
pub(crate) const C2: u8 = 15;
pub(crate) const C3: u8 = 17;
/// The zero register in the X/W families (and `sp` in the XSP family).
pub(crate) const ZR: u8 = 31;
/// Where the native return value arrives (and where the entry returns r0).
pub(crate) const RET: u8 = 0;

/// `PjExecEnv *` for the whole run (callee-saved).
pub(crate) const ENV: u8 = 28;
/// Budget left (callee-saved; budget mode).
pub(crate) const BUDGET: u8 = 27;
/// `env.stack_start` (callee-saved; sandbox with a stack block).
pub(crate) const STACK_LO: u8 = 26;
/// Frame base = r10 − 512 of the running function (sandbox with a stack block).
pub(crate) const FP: u8 = 25;
/// Context length (callee-saved; sandbox).
pub(crate) const CTX_LEN: u8 = 24;
/// Context start (callee-saved; sandbox).
pub(crate) const CTX_LO: u8 = 23;
