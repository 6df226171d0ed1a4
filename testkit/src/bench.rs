//! The programs every backend's sandbox benchmark runs, trusted and sandboxed side by side:
//! one definition, so the three arches measure the same thing.

use packjit_frontend::analysis::EmitOptions;
use packjit_frontend::encode_insn as ins;
use packjit_plugin_api::abi::{
    PjExecEnv, PjProgramEntry, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX, PJ_STOP_NONE,
};
use std::ops::Range;

/// The modes each program is compiled in, side by side: `(name, PJ_COMPILE_* flags,
/// measurement switches)`. The `noclamp`/`nogroup` rows exist only to show what the Spectre
/// clamp and the check groups cost on their own.
pub fn sandbox_modes() -> [(&'static str, u32, EmitOptions); 5] {
    let on = EmitOptions::default();
    [
        ("trusted", 0, on),
        ("sandbox", PJ_COMPILE_SANDBOX, on),
        (
            "sandbox,noclamp",
            PJ_COMPILE_SANDBOX,
            EmitOptions {
                spectre_clamp: false,
                ..on
            },
        ),
        (
            "sandbox,nogroup",
            PJ_COMPILE_SANDBOX,
            EmitOptions {
                group_checks: false,
                ..on
            },
        ),
        ("sandbox+budget", PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET, on),
    ]
}

/// Runs code at `entry` on `mem` with a fresh environment (context = `mem`, unlimited
/// budget) and returns r0; a stop is a bench bug and panics.
///
/// # Safety
/// `entry` must be executable code emitted for the `PjProgramEntry` ABI, mapped for the call.
pub unsafe fn call_entry(entry: *const u8, mem: &mut [u8]) -> u64 {
    let mut env = PjExecEnv {
        ctx_start: mem.as_ptr() as u64,
        ctx_end: mem.as_ptr() as u64 + mem.len() as u64,
        ctx_len: mem.len() as u64,
        budget: u64::MAX,
        ..Default::default()
    };
    // SAFETY: the caller vouches for `entry`; `env` and `mem` outlive the call.
    let r0 = unsafe {
        let f: PjProgramEntry = std::mem::transmute(entry);
        f(mem.as_mut_ptr(), mem.len() as u64, &mut env)
    };
    assert_eq!(env.stop_kind, PJ_STOP_NONE, "{env:?}");
    r0
}

/// Where the back-edge of a loop whose head is instruction `head` (code at native offset
/// `head_offset`) lands, given the backend's `landings` (`(instruction, offset)`: past a
/// re-entered group's check, or on a walk's pointer clamp before the head). The benches
/// count a loop's hot path from there.
pub fn loop_landing(head: usize, head_offset: usize, landings: &[(usize, usize)]) -> usize {
    landings
        .iter()
        .find(|&&(i, _)| i == head)
        .map_or(head_offset, |&(_, at)| at)
}

/// A benchmark program and the instructions of its hot loop.
pub struct SandboxProgram {
    /// What the program does, as the benches print it.
    pub name: &'static str,
    /// Bytecode.
    pub code: Vec<u8>,
    /// The hot loop, as instruction indices (an `lddw` counts once, like `Program::insts`).
    pub hot: Range<usize>,
}

impl SandboxProgram {
    /// The hot loop as bytecode slots (an `lddw` counts twice).
    pub fn hot_slots(&self) -> Range<usize> {
        let prog = packjit_frontend::decode(&self.code, &[]).expect("bench programs verify");
        let slot = |i: usize| prog.insts[i].pc as usize;
        slot(self.hot.start)..slot(self.hot.end)
    }
}

/// Context hash, compute, a stack table walked by a loop, a masked (provable) stack table
/// and a header parse.
pub fn sandbox_programs() -> Vec<SandboxProgram> {
    // Hashes the context 8 bytes at a time through a moving pointer: every load checked,
    // hitting the context (the inline fast path).
    let ctx_hash = [
        ins(0xbf, 3, 1, 0, 0),      // r3 = ctx
        ins(0x0f, 2, 1, 0, 0),      // r2 = ctx + len
        ins(0x18, 0, 0, 0, 0x1234), // r0 = 0x1234 (lddw)
        ins(0, 0, 0, 0, 0),
        ins(0x18, 5, 0, 0, 0x1b3), // r5 = FNV prime
        ins(0, 0, 0, 0, 0x100),
        ins(0x79, 4, 3, 0, 0),  // loop: r4 = *(u64 *)r3
        ins(0xaf, 0, 4, 0, 0),  // r0 ^= r4
        ins(0x2f, 0, 5, 0, 0),  // r0 *= r5
        ins(0x07, 3, 0, 0, 8),  // r3 += 8
        ins(0x2d, 2, 3, -5, 0), // if r2 > r3 goto loop
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // Arithmetic only: an LCG mixed with shifts (what budget charges cost).
    let compute = [
        ins(0xb7, 0, 0, 0, 1),
        ins(0xb7, 6, 0, 0, 0),
        ins(0x27, 0, 0, 0, 0x41c6_4e6d), // loop: r0 *= a
        ins(0x07, 0, 0, 0, 12345),
        ins(0xbf, 7, 0, 0, 0),
        ins(0x77, 7, 0, 0, 17),
        ins(0xaf, 0, 7, 0, 0),
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -7, 4096),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // A 64-slot table on the stack, filled at constant offsets (proven, unchecked).
    let fill: Vec<[u8; 8]> = (0..64i16)
        .map(|k| ins(0x7a, 10, 0, -8 * (k + 1), k as i32 * 3 + 1))
        .collect();
    // Read back through a pointer bounded only by the loop's branch: checked.
    let mut stack_table = fill.clone();
    stack_table.extend([
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 6, 0, 0, 0),
        ins(0xbf, 3, 10, 0, 0), // outer: r3 = r10 - 512
        ins(0x07, 3, 0, 0, -512),
        ins(0x79, 4, 3, 0, 0), // inner: r4 = *(u64 *)r3
        ins(0x0f, 0, 4, 0, 0),
        ins(0x07, 3, 0, 0, 8),
        ins(0x5d, 3, 10, -4, 0), // if r3 != r10 goto inner
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -8, 64),
        ins(0x95, 0, 0, 0, 0),
    ]);
    // Read back through a masked index: proven inside the frame, no check.
    let mut masked = fill;
    masked.extend([
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 6, 0, 0, 0),
        ins(0xbf, 4, 6, 0, 0), // loop: r4 = ((i << 3) & 0x1f8)
        ins(0x67, 4, 0, 0, 3),
        ins(0x57, 4, 0, 0, 0x1f8),
        ins(0xbf, 3, 10, 0, 0), // r3 = r10 - 512 + r4
        ins(0x07, 3, 0, 0, -512),
        ins(0x0f, 3, 4, 0, 0),
        ins(0x79, 5, 3, 0, 0),
        ins(0x0f, 0, 5, 0, 0),
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -10, 4096),
        ins(0x95, 0, 0, 0, 0),
    ]);
    // Five loads at constant offsets from the context start: one check group.
    let header = [
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 6, 0, 0, 0),
        ins(0x69, 2, 1, 12, 0), // loop
        ins(0x71, 3, 1, 23, 0),
        ins(0x61, 4, 1, 26, 0),
        ins(0x61, 5, 1, 30, 0),
        ins(0x69, 7, 1, 34, 0),
        ins(0x0f, 0, 2, 0, 0),
        ins(0xaf, 0, 3, 0, 0),
        ins(0x0f, 0, 4, 0, 0),
        ins(0xaf, 0, 5, 0, 0),
        ins(0x0f, 0, 7, 0, 0),
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -12, 4096),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let program = |name, code, hot| SandboxProgram { name, code, hot };
    vec![
        program("ctx hash (4 KiB, checked loads)", ctx_hash, 4..9),
        program("compute (no memory)", compute, 2..9),
        program(
            "stack table (checked stack pointer)",
            stack_table.concat(),
            68..72,
        ),
        program(
            "stack table, masked index (proven)",
            masked.concat(),
            66..76,
        ),
        program("header parse (5 ctx loads, 1 group)", header, 2..14),
    ]
}

/// The compile-time benchmark's "straight-line" program (443 slots, no helper calls): a
/// xorshift step repeated 40 times with a forward branch every 11 instructions, so fixed
/// per-program costs do not dominate and rbpf's JIT (fixed-size buffer) still accepts it.
/// `x86_bench` times it and `compile_cost` counts its instructions under callgrind.
pub fn straight_line_program() -> Vec<u8> {
    let mut src = String::from("mov %r0, 0\nmov %r3, 0x12345\n");
    for k in 0..40 {
        src.push_str(&format!(
            "mov %r4, %r3\nlsh %r4, 13\nxor %r3, %r4\nmov %r4, %r3\nrsh %r4, 7\nxor %r3, %r4\n\
             mov %r4, %r3\nlsh %r4, 17\nxor %r3, %r4\njeq %r3, {k}, +1\nadd %r0, %r3\n"
        ));
    }
    src.push_str("exit");
    crate::asm::assemble(&src).expect("the straight-line program assembles")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_loops_are_whole_loops() {
        for p in sandbox_programs() {
            let prog = packjit_frontend::decode(&p.code, &[]).unwrap();
            let last = prog.insts[p.hot.end - 1].op;
            assert!(
                matches!(last, packjit_frontend::Op::Jcond { target, .. } if target as usize == p.hot.start),
                "{}: {:?} is not a loop from its back-edge to its head",
                p.name,
                p.hot
            );
        }
        assert_eq!(sandbox_programs()[0].hot_slots(), 6..11);
    }
}
