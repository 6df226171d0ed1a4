//! Which instructions can run, given the constants the code computes itself.
//!
//! A CO-RE relocation nothing in the target satisfies is *poisoned* (libbpf's term): the
//! program may still load as long as no path reaches the instruction. clang guards such
//! reads with `bpf_core_field_exists()` and friends, which relocate to a `mov` of 0 or 1
//! followed by a compare of that register, so the guard is decided by constants alone:
//!
//! ```text
//! r1 = 0                   ; FIELD_EXISTS, resolved: the field is not in the target
//! if r1 == 0 goto +1
//! r0 = *(u32 *)(r6 + 8)    ; FIELD_BYTE_OFFSET, unsatisfiable: poisoned
//! ```
//!
//! The kernel's verifier proves such code dead with its full abstract interpretation; this
//! is the part of it those guards need: each register is a known 64-bit constant or
//! unknown, joined where paths meet, and a conditional jump whose operands are both known
//! follows only the edge it takes. Memory is not tracked (a load gives unknown), calls leave
//! r0–r5 unknown and r6–r9 as they were (the calling convention), and a callee starts with
//! every register unknown. Anything the analysis cannot decide counts as reachable, so an
//! error never depends on a guess.

use crate::{AluOp, Op, Operand, Program, Width};

/// What the analysis knows of the registers before an instruction: `Some(c)` for a known
/// constant (r0–r10; r10 is never known).
type State = [Option<u64>; 11];

const UNKNOWN: State = [None; 11];

/// `reachable[i]`: some path from the entry reaches instruction `i`, where a conditional
/// jump whose operands are constants on every path into it follows only its taken edge.
pub fn reachable(prog: &Program) -> Vec<bool> {
    let n = prog.insts.len();
    let mut states: Vec<Option<State>> = vec![None; n];
    let mut work: Vec<usize> = Vec::new();
    let reach = |states: &mut [Option<State>], work: &mut Vec<usize>, i: usize, st: &State| {
        if i < n && join(&mut states[i], st) {
            work.push(i);
        }
    };
    if n > 0 {
        reach(&mut states, &mut work, 0, &UNKNOWN);
    }
    while let Some(i) = work.pop() {
        let mut st = states[i].expect("queued with a state");
        match prog.insts[i].op {
            Op::Exit => {}
            Op::Ja { target } => reach(&mut states, &mut work, target as usize, &st),
            Op::Jcond {
                width,
                cond,
                dst,
                src,
                target,
            } => {
                let b = match src {
                    Operand::Imm(imm) => Some(imm as i64 as u64),
                    Operand::Reg(r) => st[r as usize],
                };
                let decided = st[dst as usize].zip(b).map(|(a, b)| match width {
                    Width::W32 => cond.eval(width, a as u32 as u64, b as u32 as u64),
                    Width::W64 => cond.eval(width, a, b),
                });
                if decided != Some(false) {
                    reach(&mut states, &mut work, target as usize, &st);
                }
                if decided != Some(true) {
                    reach(&mut states, &mut work, i + 1, &st);
                }
            }
            Op::CallLocal { target } => {
                reach(&mut states, &mut work, target as usize, &UNKNOWN);
                st[..=5].fill(None);
                reach(&mut states, &mut work, i + 1, &st);
            }
            Op::CallHelper { .. } | Op::CallReg { .. } => {
                st[..=5].fill(None);
                reach(&mut states, &mut work, i + 1, &st);
            }
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => {
                let b = match src {
                    Operand::Imm(imm) => Some(imm as i64 as u64),
                    Operand::Reg(r) => st[r as usize],
                };
                st[dst as usize] = alu(width, op, st[dst as usize], b);
                reach(&mut states, &mut work, i + 1, &st);
            }
            ref op => {
                if let Some(r) = op.written_reg() {
                    st[r as usize] = None;
                }
                reach(&mut states, &mut work, i + 1, &st);
            }
        }
    }
    states.iter().map(Option::is_some).collect()
}

/// Joins `st` into the state an instruction has so far; whether that changed it.
fn join(into: &mut Option<State>, st: &State) -> bool {
    let Some(old) = into else {
        *into = Some(*st);
        return true;
    };
    let mut changed = false;
    for (o, new) in old.iter_mut().zip(st) {
        if o.is_some() && o != new {
            *o = None;
            changed = true;
        }
    }
    changed
}

/// `dst op src` on known constants, as the interpreter computes it; `None` when an operand
/// is unknown or the operation is one the guards above never need (division, signed ops).
fn alu(width: Width, op: AluOp, dst: Option<u64>, src: Option<u64>) -> Option<u64> {
    let b = src?;
    let a = if op == AluOp::Mov { 0 } else { dst? };
    let bits = match width {
        Width::W32 => 32,
        Width::W64 => 64,
    };
    let shift = (b & (bits - 1)) as u32;
    let v = match op {
        AluOp::Mov => b,
        AluOp::Add => a.wrapping_add(b),
        AluOp::Sub => a.wrapping_sub(b),
        AluOp::Mul => a.wrapping_mul(b),
        AluOp::Or => a | b,
        AluOp::And => a & b,
        AluOp::Xor => a ^ b,
        AluOp::Lsh => a << shift,
        AluOp::Rsh if width == Width::W32 => (a as u32 >> shift) as u64,
        AluOp::Rsh => a >> shift,
        _ => return None,
    };
    Some(match width {
        Width::W32 => v as u32 as u64,
        Width::W64 => v,
    })
}

#[cfg(test)]
mod tests {
    use super::reachable;

    const fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let o = off.to_le_bytes();
        let i = imm.to_le_bytes();
        [op, (src << 4) | dst, o[0], o[1], i[0], i[1], i[2], i[3]]
    }
    const EXIT: [u8; 8] = insn(0x95, 0, 0, 0, 0);

    fn reach(insns: &[[u8; 8]]) -> Vec<bool> {
        reachable(&super::super::program(insns))
    }

    #[test]
    fn a_guard_on_a_constant_cuts_its_dead_edge() {
        // r1 = 0 ; if r1 == 0 goto +1 ; r0 = *(u32 *)(r6 + 8) ; exit
        let r = reach(&[
            insn(0xb7, 1, 0, 0, 0),
            insn(0x15, 1, 0, 1, 0),
            insn(0x61, 0, 6, 8, 0),
            EXIT,
        ]);
        assert_eq!(r, [true, true, false, true]);
        // The same guard with the field present: both the read and the exit run.
        let r = reach(&[
            insn(0xb7, 1, 0, 0, 1),
            insn(0x15, 1, 0, 1, 0),
            insn(0x61, 0, 6, 8, 0),
            EXIT,
        ]);
        assert_eq!(r, [true; 4]);
    }

    #[test]
    fn constants_flow_through_alu_and_32_bit_compares() {
        // w1 = -1 ; r1 &= 6 ; r1 <<= 1 ; if w1 != 12 goto +1 ; exit ; r0 = 1 ; exit
        let r = reach(&[
            insn(0xb4, 1, 0, 0, -1),
            insn(0x57, 1, 0, 0, 6),
            insn(0x67, 1, 0, 0, 1),
            insn(0x56, 1, 0, 1, 12),
            EXIT,
            insn(0xb7, 0, 0, 0, 1),
            EXIT,
        ]);
        assert_eq!(r, [true, true, true, true, true, false, false]);
    }

    #[test]
    fn a_value_that_differs_between_paths_decides_nothing() {
        // r2 = *(u32 *)(r1 + 0) ; r3 = 0 ; if r2 == 0 goto +1 ; r3 = 1 ;
        // if r3 == 0 goto +1 ; r0 = 5 ; exit
        let r = reach(&[
            insn(0x61, 2, 1, 0, 0),
            insn(0xb7, 3, 0, 0, 0),
            insn(0x15, 2, 0, 1, 0),
            insn(0xb7, 3, 0, 0, 1),
            insn(0x15, 3, 0, 1, 0),
            insn(0xb7, 0, 0, 0, 5),
            EXIT,
        ]);
        assert_eq!(r, [true; 7]);
    }

    #[test]
    fn calls_forget_r0_to_r5_and_keep_r6_to_r9() {
        // r1 = 0 ; r6 = 0 ; call 1 ; if r1 == 0 goto +2 ; if r6 != 0 goto +1 ; exit ; exit
        let r = reach(&[
            insn(0xb7, 1, 0, 0, 0),
            insn(0xb7, 6, 0, 0, 0),
            insn(0x85, 0, 0, 0, 1),
            insn(0x15, 1, 0, 2, 0),
            insn(0x55, 6, 0, 1, 0),
            EXIT,
            EXIT,
        ]);
        // r1 is unknown after the call (both edges); r6 is still 0 (never jumps).
        assert_eq!(r, [true, true, true, true, true, true, true]);
        let r = reach(&[
            insn(0xb7, 6, 0, 0, 0),
            insn(0x85, 0, 0, 0, 1),
            insn(0x55, 6, 0, 1, 0),
            EXIT,
            EXIT,
        ]);
        assert_eq!(r, [true, true, true, true, false]);
    }

    #[test]
    fn a_callee_is_reached_through_its_calls_only() {
        // entry: r1 = 1 ; if r1 == 0 goto +1 ; call +1 ; exit.  f: r0 = 2 ; exit.
        let r = reach(&[
            insn(0xb7, 1, 0, 0, 1),
            insn(0x15, 1, 0, 1, 0),
            insn(0x85, 0, 1, 0, 1),
            EXIT,
            insn(0xb7, 0, 0, 0, 2),
            EXIT,
        ]);
        assert_eq!(r, [true; 6]);
        // The call is dead, and so is the callee.
        let r = reach(&[
            insn(0xb7, 1, 0, 0, 0),
            insn(0x15, 1, 0, 1, 0),
            insn(0x85, 0, 1, 0, 1),
            EXIT,
            insn(0xb7, 0, 0, 0, 2),
            EXIT,
        ]);
        assert_eq!(r, [true, true, false, true, false, false]);
    }

    #[test]
    fn a_loop_reaches_its_fixed_point() {
        // r1 = 0 ; L: r1 += 1 ; if r1 < 4 goto L ; exit — r1 is unknown at L once the
        // back-edge joins, so both edges of the test stay.
        let r = reach(&[
            insn(0xb7, 1, 0, 0, 0),
            insn(0x07, 1, 0, 0, 1),
            insn(0xa5, 1, 0, -2, 4),
            EXIT,
        ]);
        assert_eq!(r, [true; 4]);
    }
}
