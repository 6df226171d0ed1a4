//! BPF → x86-64 register map (the Linux kernel's x86 JIT map, with `r12` for the run
//! environment instead of the tail-call counter).

use crate::encode::Gpr;
use packjit_frontend::analysis::LoweringReads;
use packjit_frontend::Reg;

pub const RAX: Gpr = 0;
pub const RCX: Gpr = 1;
pub const RDX: Gpr = 2;
pub const RBX: Gpr = 3;
pub const RSP: Gpr = 4;
pub const RBP: Gpr = 5;
pub const RSI: Gpr = 6;
pub const RDI: Gpr = 7;
pub const R8: Gpr = 8;
pub const R9: Gpr = 9;
pub const R10: Gpr = 10;
pub const R11: Gpr = 11;
pub const R12: Gpr = 12;
pub const R13: Gpr = 13;
pub const R14: Gpr = 14;
pub const R15: Gpr = 15;

/// BPF register `rN` lives in `REG_MAP[N]`.
pub const REG_MAP: [Gpr; 13] = [
    RAX, // r0: the helpers' return register, so a helper result needs no move
    RDI, // r1: 1st SysV argument (also the entry's ctx)
    RSI, // r2: 2nd SysV argument (also the entry's ctx_len)
    RDX, // r3: 3rd SysV argument (the entry's env arrives here and moves to r12)
    RCX, // r4: 4th SysV argument (shift counts without BMI2 go through cl: see lower)
    R8,  // r5: 5th SysV argument
    RBX, // r6: callee-saved, survives helper calls; pushed only when used
    R13, // r7: callee-saved (r13 as a base always takes a disp8, like rbp)
    R14, // r8: callee-saved
    R15, // r9: callee-saved
    RBP, // r10: top of the current 512-byte frame (callee-saved; adjusted around calls)
    // AX, the blinding rewrite's register (`packjit_frontend::blind`): r9 is scratch that
    // no lowering writes before reading a register operand (shifts park rcx in r11,
    // divisions copy the divisor to r11 first); a checked store saves it across the check.
    R9,
    // ENV, the legacy packet loads' base for the context start (`packjit_frontend::packet`):
    // the register holding `env` (kept for such programs: `CodegenMode::keeps_env`).
    R12,
];

/// `PjExecEnv *`, kept for the whole run when the code can stop or is sandboxed.
pub const ENV: Gpr = R12;
/// Scratch registers: caller-saved, never BPF registers, dead between eBPF instructions.
pub const T9: Gpr = R9;
/// Second scratch (saved r0 across `div`/`cmpxchg` loops, check offsets).
pub const T10: Gpr = R10;
/// Third scratch (checked addresses, divisors, helper addresses for `call r11`).
pub const T11: Gpr = R11;

/// [`REG_MAP`] padded to 16 entries, so [`host`] indexes it without a bounds check (the
/// verifier admits r0–r10, the blinding rewrite adds r11, the packet loads r12; the padding
/// is never read).
const HOST: [Gpr; 16] = {
    let mut t = [0xff; 16];
    let mut r = 0;
    while r < REG_MAP.len() {
        t[r] = REG_MAP[r];
        r += 1;
    }
    t
};

/// Host register of BPF register `r`.
#[inline]
pub fn host(r: Reg) -> Gpr {
    debug_assert!(r <= 12, "BPF register r{r} (11: the blinding AX, 12: ENV)");
    HOST[(r & 15) as usize]
}

/// What the lowering reads beyond RFC 9669, for the entry's zeroing
/// (`analysis::entry_zeroing`): r0 for every atomic, because the fetch-and/or/xor lowering
/// preserves rax (r0) around its `lock cmpxchg` loop, so it counts as read there.
pub const LOWERING_READS: LoweringReads = LoweringReads {
    kinds: packjit_frontend::op_kind::ATOMIC,
    regs: 1,
};

/// Host callee-saved registers standing for BPF r6–r9 among the bits of `used`.
pub fn callee_saved_of(used: u16) -> impl Iterator<Item = Gpr> {
    (6..=9)
        .filter(move |r| used & (1 << r) != 0)
        .map(|r| REG_MAP[r])
}
