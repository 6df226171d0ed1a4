//! Rewrites of a verified program that every backend lowers to shorter code, applied once
//! here for all of them. The reference evaluator runs programs as [`decode`](crate::decode)
//! returns them, without these rewrites, so the differential tests check each one.

use crate::{op_kind, verify::decode_with, DecodeOptions, Op, Program};
use packjit_plugin_api::{CompileError, CompileRequest};

/// Decodes and verifies a request's code (with the encodings its flags opt into), then
/// applies the rewrites below: the program a backend lowers.
pub fn decode_for_lowering(req: &CompileRequest<'_>) -> Result<Program, CompileError> {
    let mut prog = decode_with(req.code, req.helpers, DecodeOptions::from_flags(req.flags))?;
    fold_branches_over_jumps(&mut prog);
    Ok(prog)
}

/// `if c goto L; goto T; L:` becomes `if !c goto T; goto L`, and a jump to the next
/// instruction lowers to nothing: one branch where there were two. Compilers emit the pair
/// for an `if` whose body is far away; so do hand-written tests. `if c goto L; exit; L:` is
/// the same pair with `T` the function's last instruction, when that is an `exit`: any
/// `exit` of a function returns the same r0, so first every forward jump to an `exit` goes
/// straight to the last one (which also saves a hop where an early `exit` is itself a
/// jump to the epilogue).
///
/// Only where it cannot change what anything else sees:
/// * the `goto` (or `exit`) is not a jump target (nothing else reaches it);
/// * every jump that moves still jumps forward, so no back-edge moves and the budget
///   charges (at back-edges, by pc distance) stay as they are;
/// * `c` has a negation (`jset` has none).
pub fn fold_branches_over_jumps(prog: &mut Program) {
    // Only jumps are visited (the decoder lists them).
    let branches = std::mem::take(&mut prog.branches);
    let last_exit_of = |prog: &Program, i: usize| {
        let end = prog.subprogs[prog.subprog_of(i)].end;
        matches!(prog.insts[end - 1].op, Op::Exit).then_some(end - 1)
    };
    let mut moved = false;
    for &b in &branches {
        let i = b as usize;
        let (Op::Ja { target } | Op::Jcond { target, .. }) = prog.insts[i].op else {
            continue;
        };
        let target = target as usize;
        if target <= i || !matches!(prog.insts[target].op, Op::Exit) {
            continue;
        }
        if let Some(last) = last_exit_of(prog, i).filter(|&last| target < last) {
            if let Op::Ja { target } | Op::Jcond { target, .. } = &mut prog.insts[i].op {
                *target = last as u32;
            }
            moved = true;
        }
    }
    if moved {
        recompute_targets(prog, &branches);
    }
    // The list stays complete: an `exit` that becomes a `goto` joins it (sorted in after).
    let mut new_gotos = Vec::new();
    for &b in &branches {
        let i = b as usize;
        let Op::Jcond { cond, target, .. } = prog.insts[i].op else {
            continue;
        };
        if target as usize != i + 2 || prog.is_target[i + 1] {
            continue;
        }
        let (far, was_exit) = match prog.insts[i + 1].op {
            Op::Ja { target } => (target as usize, false),
            Op::Exit => match last_exit_of(prog, i) {
                Some(e) => (e, true),
                None => continue,
            },
            _ => continue,
        };
        let Some(negated) = cond.negated() else {
            continue;
        };
        if far <= i + 2 {
            continue;
        }
        if let Op::Jcond { cond, target, .. } = &mut prog.insts[i].op {
            *cond = negated;
            *target = far as u32;
        }
        prog.insts[i + 1].op = Op::Ja { target: b + 2 };
        if was_exit {
            new_gotos.push(b + 1);
            let k = prog.subprog_of(i);
            prog.subprogs[k].ops |= op_kind::JA;
        }
        // `L` stays a target (of the new `goto`); `T` was one, or is a last `exit`.
        prog.is_target[far] = true;
    }
    let mut branches = branches;
    if !new_gotos.is_empty() {
        branches.extend(new_gotos);
        branches.sort_unstable();
    }
    prog.branches = branches;
}

/// `is_target` from the jumps and calls, as the verifier first computes it.
fn recompute_targets(prog: &mut Program, branches: &[u32]) {
    prog.is_target.iter_mut().for_each(|t| *t = false);
    for &b in branches {
        if let Op::Ja { target } | Op::Jcond { target, .. } | Op::CallLocal { target } =
            prog.insts[b as usize].op
        {
            prog.is_target[target as usize] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_insn as i, Cond};

    fn folded(insns: &[[u8; 8]]) -> Program {
        let mut prog = crate::decode(&insns.concat(), &[]).expect("valid program");
        fold_branches_over_jumps(&mut prog);
        prog
    }

    fn jcond(prog: &Program, k: usize) -> (Cond, u32) {
        match prog.insts[k].op {
            Op::Jcond { cond, target, .. } => (cond, target),
            ref op => panic!("instruction {k} is {op:?}"),
        }
    }

    #[test]
    fn a_branch_over_a_forward_jump_becomes_one_negated_branch() {
        let exit = i(0x95, 0, 0, 0, 0);
        let p = folded(&[
            i(0xb7, 0, 0, 0, 0), // 0: r0 = 0
            i(0x2d, 1, 2, 1, 0), // 1: if r1 > r2 goto 3
            i(0x05, 0, 0, 2, 0), // 2: goto 5
            i(0xb7, 0, 0, 0, 1), // 3: r0 = 1
            i(0x55, 1, 0, 1, 7), // 4: if r1 != 7 goto 6
            exit,                // 5: exit (a target: goes to the last exit first)
            i(0xb7, 0, 0, 0, 2), // 6: r0 = 2
            exit,                // 7
        ]);
        // The jump's target, an exit, became the last exit first.
        assert_eq!(jcond(&p, 1), (Cond::Le, 7), "negated, to the jump's target");
        assert_eq!(
            p.insts[2].op,
            Op::Ja { target: 3 },
            "the jump now goes nowhere"
        );
        assert_eq!(
            jcond(&p, 4),
            (Cond::Eq, 7),
            "over an exit: to the last exit"
        );
        assert_eq!(p.insts[5].op, Op::Ja { target: 6 });
        assert!(!p.is_target[2] && p.is_target[3] && p.is_target[6] && p.is_target[7]);
        assert!(!p.is_target[5], "nothing jumps to the early exit any more");
        assert_eq!(p.branches, [1, 2, 4, 5], "the new goto is listed");
    }

    #[test]
    fn what_would_change_budgets_or_other_paths_stays() {
        let exit = i(0x95, 0, 0, 0, 0);
        let code = [
            i(0xb7, 0, 0, 0, 0),  // 0: r0 = 0
            i(0x45, 1, 0, 1, 1),  // 1: if r1 & 1 goto 3   (jset: no negation)
            i(0x05, 0, 0, 3, 0),  // 2: goto 6
            i(0x15, 1, 0, 1, 0),  // 3: if r1 == 0 goto 5
            i(0x05, 0, 0, -5, 0), // 4: goto 0            (backward: a budget back-edge)
            i(0x15, 1, 0, 1, 2),  // 5: if r1 == 2 goto 7
            i(0x05, 0, 0, 1, 0),  // 6: goto 8            (a target of 2)
            i(0xb7, 0, 0, 0, 1),  // 7: r0 = 1
            exit,                 // 8
        ];
        let p = folded(&code);
        let plain = crate::decode(&code.concat(), &[]).unwrap();
        assert_eq!(p, plain);
    }
}
