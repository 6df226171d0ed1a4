//! Short conditional arms as selects (if-conversion): `if c goto T; <one or two ALU
//! instructions>; T:` is lifted as the arm computed unconditionally and each register it
//! writes chosen by `c` afterwards, with no branch.
//!
//! eBPF has no conditional move, so clang spells every `x = c ? a : b` and every
//! `n += !flag` as a jump over one instruction. In a loop over data those jumps go whichever
//! way the data says and mispredict; LLVM, lifting the same bytecode (llvmbpf), turns them
//! back into `setcc`, `adc` and `cmov`. The `words` peer, per byte: `w6 = 1; if w8 == 10
//! goto L; w6 = 0; goto L` (a newline count) and `if r7 != 0 goto M; r3 += 1; M:` (a word
//! count); Cranelift lowers a `select` of `1`/`0` to `setcc` and the rest to `cmov`.
//!
//! Only equality tests (`==`, `!=`, `&`) are converted. They are what classifies data in a
//! scan (a character, a flag), where the jumps mispredict. An ordering compare is mostly a
//! bound or a clamp (a loop limit, `min(rest, 16)`), which goes one way for long runs and
//! predicts well, and as a select it makes everything after it wait for the bound's
//! inputs: measured on the `calls` peer, its `min(rest, 16)` as a `cmov` cost the whole
//! program 25–35%.
//!
//! Why the result is the same:
//! * the arm is entered only by falling through the jump (none of its instructions is a
//!   jump target) and leaves only to `T`, by falling into it or by a `ja T` that is not a
//!   target either: both ways out of the jump end at `T`, having run the arm or not;
//! * the arm's instructions cannot fault, trap, stop or touch memory (ALU and move only,
//!   no division: this tier's division is branch-free but costs a division either way), so
//!   running them when the jump is taken changes nothing but the registers they write, and
//!   each of those gets back the value it had before the arm when it is;
//! * no back-edge is charged (a budgeted program is not converted), so both ways cost the
//!   budget nothing.

use packjit_frontend::{AluOp, Cond, Inst, Op, Reg};

/// At most this many ALU instructions per arm: each runs on both ways, so a longer arm
/// costs more on the path that skipped it than a well-predicted branch would (LLVM's
/// `SimplifyCFG` speculates about as much).
pub(crate) const MAX_ARM: usize = 2;

/// A conditional jump whose fall-through arm is lifted as selects.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Arm {
    /// Index (from the function's start) one past the arm's last ALU instruction.
    pub end: usize,
    /// Whether a `ja T` at `end` closes the arm (else the arm falls into `T` at `end`).
    pub closed_by_jump: bool,
    /// The distinct registers the arm writes, in order; `written` of them are used.
    pub regs: [Reg; MAX_ARM],
    pub written: usize,
}

impl Arm {
    /// The registers the arm writes.
    pub fn regs(&self) -> &[Reg] {
        &self.regs[..self.written]
    }

    /// Index one past the arm, its closing jump included: where lifting resumes.
    pub fn resume(&self) -> usize {
        self.end + usize::from(self.closed_by_jump)
    }
}

/// Per instruction of the function `start..start + insts.len()` (index from its start):
/// the arm lifted as selects when the instruction is a conditional jump that has one.
/// `is_target` says where control arrives other than by falling through (the function's
/// jump targets, and any other place the lifting jumps to); `lifted_as_is(k)`
/// says whether another plan (a membership test, a combined load) leaves instruction `k`
/// to the plain lifting.
pub(crate) fn plan(
    insts: &[Inst],
    start: usize,
    is_target: &[bool],
    lifted_as_is: impl Fn(usize) -> bool,
) -> Vec<Option<Arm>> {
    let mut arms = vec![None; insts.len()];
    for (k, inst) in insts.iter().enumerate() {
        let Op::Jcond { target, cond, .. } = inst.op else {
            continue;
        };
        if !matches!(cond, Cond::Eq | Cond::Ne | Cond::Set) || !lifted_as_is(k) {
            continue;
        }
        let Some(target) = (target as usize).checked_sub(start) else {
            continue;
        };
        arms[k] = arm_after(insts, start, is_target, k, target, &lifted_as_is);
    }
    arms
}

/// The arm after the conditional jump at `k` to `target` (both from the function's start,
/// which is `start` in the program).
fn arm_after(
    insts: &[Inst],
    start: usize,
    is_target: &[bool],
    k: usize,
    target: usize,
    lifted_as_is: &impl Fn(usize) -> bool,
) -> Option<Arm> {
    let mut arm = Arm {
        end: k + 1,
        closed_by_jump: false,
        regs: [0; MAX_ARM],
        written: 0,
    };
    loop {
        let j = arm.end;
        let empty = j == k + 1;
        if j == target && !empty {
            return Some(arm);
        }
        if j >= insts.len() || is_target[j] || !lifted_as_is(j) {
            return None;
        }
        match insts[j].op {
            Op::Ja { target: t } if !empty && t as usize == start + target => {
                arm.closed_by_jump = true;
                return Some(arm);
            }
            op => {
                let dst = pure_dst(&op)?;
                if j - k > MAX_ARM {
                    return None;
                }
                if !arm.regs().contains(&dst) {
                    arm.regs[arm.written] = dst;
                    arm.written += 1;
                }
                arm.end += 1;
            }
        }
    }
}

/// The register an instruction writes when it does nothing else: no memory, no call, no
/// jump, no stop, no division.
fn pure_dst(op: &Op) -> Option<Reg> {
    match *op {
        Op::Alu { op, dst, .. } => match op {
            AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => None,
            _ => Some(dst),
        },
        Op::MovSx { dst, .. } | Op::Neg { dst, .. } | Op::End { dst, .. } => Some(dst),
        Op::LdImm64 { dst, .. } => Some(dst),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use packjit_frontend::{Cond, Operand, Size, Width, R10};

    fn add(dst: Reg, imm: i32) -> Op {
        Op::Alu {
            width: Width::W64,
            op: AluOp::Add,
            dst,
            src: Operand::Imm(imm),
        }
    }

    fn jeq(dst: Reg, imm: i32, target: u32) -> Op {
        Op::Jcond {
            width: Width::W64,
            cond: Cond::Eq,
            dst,
            src: Operand::Imm(imm),
            target,
        }
    }

    /// The plan of `ops` as a function starting at `start`, every instruction left to the
    /// plain lifting; `targets` are the jump targets (from the function's start).
    fn plan_of(ops: &[Op], start: usize, targets: &[usize]) -> Vec<Option<Arm>> {
        let insts: Vec<Inst> = ops
            .iter()
            .enumerate()
            .map(|(k, &op)| Inst { pc: k as u32, op })
            .collect();
        let mut is_target = vec![false; ops.len()];
        for &t in targets {
            is_target[t] = true;
        }
        plan(&insts, start, &is_target, |_| true)
    }

    fn arm(end: usize, closed_by_jump: bool, regs: &[Reg]) -> Option<Arm> {
        let mut a = Arm {
            end,
            closed_by_jump,
            regs: [0; MAX_ARM],
            written: regs.len(),
        };
        a.regs[..regs.len()].copy_from_slice(regs);
        Some(a)
    }

    #[test]
    fn a_jump_over_one_or_two_alu_instructions_is_an_arm() {
        // 0: if r1 == 0 goto 2; 1: r3 += 1; 2: exit (the function starts at pc 10).
        let arms = plan_of(&[jeq(1, 0, 12), add(3, 1), Op::Exit], 10, &[2]);
        assert_eq!(arms, vec![arm(2, false, &[3]), None, None]);
        // Two instructions, one register written twice: it is listed once.
        let arms = plan_of(&[jeq(1, 0, 3), add(3, 1), add(3, 2), Op::Exit], 0, &[3]);
        assert_eq!(arms[0], arm(3, false, &[3]));
        let arms = plan_of(&[jeq(1, 0, 3), add(3, 1), add(4, 2), Op::Exit], 0, &[3]);
        assert_eq!(arms[0], arm(3, false, &[3, 4]));
    }

    #[test]
    fn an_arm_closed_by_a_jump_to_the_same_target_may_go_backwards() {
        // words' newline count: 0: r6 += 1 (loop head); 1: if r8 == 10 goto 0; 2: r6 = 0;
        // 3: goto `ja` (0 closes the arm).
        let mov0 = Op::Alu {
            width: Width::W32,
            op: AluOp::Mov,
            dst: 6,
            src: Operand::Imm(0),
        };
        let closed_by = |ja: u32| {
            [
                add(6, 1),
                jeq(8, 10, 0),
                mov0,
                Op::Ja { target: ja },
                Op::Exit,
            ]
        };
        assert_eq!(plan_of(&closed_by(0), 0, &[0])[1], arm(3, true, &[6]));
        assert_eq!(arm(3, true, &[6]).unwrap().resume(), 4);
        // A `ja` elsewhere does not close it; nor does a jump with nothing before it.
        assert_eq!(plan_of(&closed_by(4), 0, &[0, 4])[1], None);
        let ops = [jeq(8, 10, 2), Op::Ja { target: 2 }, Op::Exit];
        assert_eq!(plan_of(&ops, 0, &[2])[0], None);
        // Backwards with no closing jump: the arm runs on past the jump's target.
        let ops = [add(6, 1), jeq(8, 10, 0), mov0, Op::Exit];
        assert_eq!(plan_of(&ops, 0, &[0])[1], None);
    }

    #[test]
    fn long_arms_memory_calls_divisions_and_entries_keep_the_jump() {
        let three = [jeq(1, 0, 4), add(3, 1), add(4, 1), add(5, 1), Op::Exit];
        assert_eq!(plan_of(&three, 0, &[4])[0], None);
        let load = Op::Load {
            size: Size::W,
            sign_extend: false,
            dst: 3,
            base: R10,
            off: -8,
        };
        assert_eq!(plan_of(&[jeq(1, 0, 2), load, Op::Exit], 0, &[2])[0], None);
        let call = Op::CallHelper { id: 5 };
        assert_eq!(plan_of(&[jeq(1, 0, 2), call, Op::Exit], 0, &[2])[0], None);
        let div = Op::Alu {
            width: Width::W64,
            op: AluOp::Div,
            dst: 3,
            src: Operand::Reg(2),
        };
        assert_eq!(plan_of(&[jeq(1, 0, 2), div, Op::Exit], 0, &[2])[0], None);
        // An ordering compare: a bound or a clamp, left a branch.
        let jlt = Op::Jcond {
            width: Width::W64,
            cond: Cond::Lt,
            dst: 1,
            src: Operand::Imm(16),
            target: 2,
        };
        assert_eq!(plan_of(&[jlt, add(1, 1), Op::Exit], 0, &[2])[0], None);
        // 1 is reached from elsewhere: not only by falling through the jump at 0.
        let ops = [jeq(1, 0, 2), add(3, 1), Op::Exit];
        assert_eq!(plan_of(&ops, 0, &[1, 2])[0], None);
        // An instruction another plan lifts keeps the jump too.
        let insts: Vec<Inst> = ops.iter().map(|&op| Inst { pc: 0, op }).collect();
        let arms = plan(&insts, 0, &[false, false, true], |k| k != 1);
        assert_eq!(arms[0], None);
    }
}
