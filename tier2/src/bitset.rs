//! Membership tests: a run of conditional jumps that sends one register to the same place
//! when it holds one of a few small constants becomes a range test and a branch on a bit of
//! a mask.
//!
//! clang compiles `c == ' ' || c == '\n' || c == '\t' || c == '\r'` to `jeq` chains and,
//! for the constants close together, a range test then `1 << c & MASK` (the `words` peer:
//! `if w8 == 32 goto T; if w8 > 13 goto F; w9 = 1; w9 <<= w8; w9 &= 0x2600; if w9 != 0
//! goto T; F:`). LLVM's x86 backend, given that bytecode, folds it all into one range test
//! and one `bt`; lifted one jump at a time it is three taken-or-not branches per byte in a
//! hot loop. Here it is lifted as `x < 64 && (MEMBERS >> x) & 1`: a branch on the range,
//! then one on the bit (values past every member, a text's letters, leave after one
//! compare; a branch-free range test cost them a mask, a shift and a select: `words` ran
//! ~22 native instructions a byte so, ~18 with the branch).
//!
//! Why the result is the same:
//! * only the run's first jump is replaced; its other instructions are lifted as they are,
//!   so a jump into the middle would still run them as written. A jump target ends the run
//!   anyway (it is then the fall-through exit), so that nothing is lifted twice over;
//! * every jump of the run compares one register at one width against constants, and goes
//!   to one of two places, so which of the two is reached is a function of that value only,
//!   and it is `taken` exactly for the members (each atom below adds the values it sends
//!   there, which all lie below 64);
//! * the only register the run writes is the scratch register of the shift test, and it
//!   must be dead at both exits (the front end's liveness), so not writing it is invisible;
//! * nothing in the run touches memory, calls or stops, and both exits lie after its start
//!   (no back-edge: the budget charges nothing inside).

use packjit_frontend::{AluOp, Cond, Inst, Op, Operand, Reg, Width, R10};

/// One run lifted as a single branch: to `taken` (an instruction index of the program) when
/// `reg` at `width` is a member (bit `v` of `members`, so every member is below 64), to
/// `other` otherwise.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct SetTest {
    pub reg: Reg,
    pub width: Width,
    pub members: u64,
    pub taken: usize,
    pub other: usize,
}

/// The function `start..start + insts.len()`: its instructions, which of them are jump
/// targets, and the front end's registers live on entry to each (one extra entry at the
/// end).
pub(crate) struct Function<'a> {
    pub insts: &'a [Inst],
    pub start: usize,
    pub is_target: &'a [bool],
    pub live_in: &'a [u16],
}

/// Per instruction of the function (index from its start): the test that replaces the run
/// starting there. The run's other instructions keep their lifting, which nothing reaches
/// (Cranelift drops it).
pub(crate) fn plan(f: &Function<'_>) -> Vec<Option<SetTest>> {
    let mut tests = vec![None; f.insts.len()];
    let mut k = 0;
    while k < f.insts.len() {
        match run_at(f, k) {
            Some((test, end)) => {
                tests[k] = Some(test);
                k = end;
            }
            None => k += 1,
        }
    }
    tests
}

/// The value a compare of width `width` sees in immediate `imm` (zero-extended from 32
/// bits, or sign-extended to 64), when it can be a member: below 64.
fn small(imm: i32, width: Width) -> Option<u32> {
    let v = match width {
        Width::W32 => u64::from(imm as u32),
        Width::W64 => imm as i64 as u64,
    };
    (v < 64).then_some(v as u32)
}

fn bits(width: Width) -> u32 {
    match width {
        Width::W32 => 32,
        Width::W64 => 64,
    }
}

/// The run starting at instruction `k`, with the index where it ends (exclusive), when it
/// has at least two jumps.
fn run_at(f: &Function<'_>, k: usize) -> Option<(SetTest, usize)> {
    let ins = |j: usize| f.insts.get(j).map(|i| i.op);
    let mut value: Option<(Reg, Width)> = None;
    let mut taken: Option<usize> = None;
    let mut other: Option<usize> = None;
    let mut members = 0u64;
    let mut jumps = 0;
    let mut scratch: Option<Reg> = None;
    let mut j = k;
    // Whether register `dst` at `width` is the run's value (the first compare fixes it).
    let same = |value: &mut Option<(Reg, Width)>, dst: Reg, width: Width| {
        dst != R10 && *value.get_or_insert((dst, width)) == (dst, width)
    };
    loop {
        if j > k && f.is_target[j] {
            break;
        }
        let Some(Op::Jcond {
            width,
            cond,
            dst,
            src: Operand::Imm(imm),
            target,
        }) = ins(j)
        else {
            break;
        };
        let target = target as usize;
        match cond {
            // `x == K → taken`, falls through otherwise.
            Cond::Eq => {
                let Some(member) = small(imm, width) else {
                    break;
                };
                if taken.is_some_and(|t| t != target) || !same(&mut value, dst, width) {
                    break;
                }
                taken = Some(target);
                members |= 1 << member;
                jumps += 1;
                j += 1;
            }
            // The last compare inverted: `x != K → other`, falling through to `taken`.
            Cond::Ne => {
                let Some(member) = small(imm, width) else {
                    break;
                };
                if taken != Some(f.start + j + 1) || !same(&mut value, dst, width) {
                    break;
                }
                members |= 1 << member;
                other = Some(target);
                jumps += 1;
                j += 1;
                break;
            }
            // `if x > N goto F; s = 1; s <<= x; s &= MASK; if s != 0 goto T; F:`.
            Cond::Gt => {
                let Some((group, test_target, s)) = shift_test(f, j, width, dst, imm) else {
                    break;
                };
                if taken.is_some_and(|t| t != test_target) || !same(&mut value, dst, width) {
                    break;
                }
                taken = Some(test_target);
                members |= group;
                scratch = Some(s);
                jumps += 2;
                j += 5;
                break;
            }
            _ => break,
        }
    }
    let (reg, width) = value?;
    let taken = taken?;
    let other = other.unwrap_or(f.start + j);
    if jumps < 2 || taken <= f.start + k || other <= f.start + k {
        return None;
    }
    if let Some(s) = scratch {
        let live = |at: usize| f.live_in[at - f.start] & (1 << s) != 0;
        if live(taken) || live(other) {
            return None;
        }
    }
    Some((
        SetTest {
            reg,
            width,
            members,
            taken,
            other,
        },
        j,
    ))
}

/// The shift test starting with the `jgt x, N` at `j`: the values it sends to its `jne`'s
/// target, that target, and the scratch register; when the four instructions after the
/// `jgt` are the shift test on `x`, none of them is a jump target, and the `jgt` jumps to
/// just after them.
fn shift_test(
    f: &Function<'_>,
    j: usize,
    width: Width,
    x: Reg,
    imm: i32,
) -> Option<(u64, usize, Reg)> {
    let ins: Vec<Op> = (j..j + 5)
        .map(|i| f.insts.get(i).map(|i| i.op))
        .collect::<Option<_>>()?;
    let Op::Jcond { target: over, .. } = ins[0] else {
        return None;
    };
    if over as usize != f.start + j + 5 || (j + 1..j + 5).any(|i| f.is_target[i]) {
        return None;
    }
    // Above the bound, the shift test is not reached: members are `0..=N`.
    let bound = match width {
        Width::W32 => u64::from(imm as u32),
        Width::W64 => imm as i64 as u64,
    };
    let (
        Op::Alu {
            op: AluOp::Mov,
            dst: s,
            src: Operand::Imm(1),
            ..
        },
        Op::Alu {
            op: AluOp::Lsh,
            width: shift_width,
            dst: s1,
            src: Operand::Reg(amount),
        },
        Op::Alu {
            op: AluOp::And,
            width: and_width,
            dst: s2,
            src: Operand::Imm(mask),
        },
        Op::Jcond {
            width: test_width,
            cond: Cond::Ne,
            dst: s3,
            src: Operand::Imm(0),
            target,
        },
    ) = (ins[1], ins[2], ins[3], ins[4])
    else {
        return None;
    };
    // The shift counts are masked (to 5 or 6 bits); below the bound they are `x` itself.
    if s == x || s == R10 || s1 != s || s2 != s || s3 != s || amount != x {
        return None;
    }
    if bound >= u64::from(bits(shift_width)) {
        return None;
    }
    let below_bound = if bound == 63 {
        u64::MAX
    } else {
        (1u64 << (bound + 1)) - 1
    };
    let mask = match and_width {
        Width::W32 => u64::from(mask as u32),
        Width::W64 => mask as i64 as u64,
    };
    let tested = match test_width {
        Width::W32 => u64::from(u32::MAX),
        Width::W64 => u64::MAX,
    };
    Some((below_bound & mask & tested, target as usize, s))
}
