//! Functions reached only through calls in tail position: `call f` followed by `exit`
//! (directly or through `ja`s), made by the entry or by a function that is itself reached
//! only so. clang emits `return f(ctx)` that way.
//!
//! Whatever such a function returns, the run returns, and nothing runs after it but the
//! callers' `exit`s, which charge no budget (`budget.rs`: back-edges and calls do) and read
//! nothing of `env`. So a tail call made inside it need not enter its target as a callee
//! (the kernel's way, which keeps the callers' state for after the target's return): it
//! returns with the jump pending, and the entry jumps as its own tail calls do
//! (`lower::jump_or_pend`). The target's `exit` then ends the run with its r0, which is
//! what the callers' `exit`s would have returned.

use crate::{BranchKind, Op, Program};

/// At most this many `ja`s are followed from a call to its `exit`: clang joins a function's
/// returns in one `exit` block, one jump away.
const JUMPS_TO_EXIT: usize = 4;

/// `tail[k]`: every call into function `k` is in tail position, in the entry or in a
/// function with `tail` set (the entry: `true`). A function no call reaches: `false`.
pub fn tail_reached(prog: &Program) -> Vec<bool> {
    let n = prog.subprogs.len();
    let callee_of = |target: u32| {
        prog.subprogs
            .partition_point(|s| s.start < target as usize)
            .min(n - 1)
    };
    let calls: Vec<(usize, usize, bool)> = prog
        .branches
        .iter()
        .filter(|b| b.kind == BranchKind::CallLocal)
        .map(|b| {
            let caller = prog.subprog_of(b.at as usize);
            let end = prog.subprogs[caller].end;
            (
                caller,
                callee_of(b.target),
                returns_from(prog, b.at as usize + 1, end),
            )
        })
        .collect();
    let mut tail = vec![false; n];
    if n == 0 {
        return tail;
    }
    tail[0] = true;
    for &(_, callee, _) in &calls {
        tail[callee] = callee != 0;
    }
    // Cleared where a call site is not in tail position, or is in a function that is not
    // reached so: a decreasing fixed point, settled within the call chains' depth (the
    // call graph has no cycles: the verifier refuses recursion).
    let mut changed = true;
    while changed {
        changed = false;
        for &(caller, callee, returns) in &calls {
            if tail[callee] && callee != 0 && !(returns && tail[caller]) {
                tail[callee] = false;
                changed = true;
            }
        }
    }
    tail
}

/// Whether the local call at `call` is in tail position: an `exit` after it, directly or
/// through `ja`s.
pub fn returns_after(prog: &Program, call: usize) -> bool {
    let end = prog.subprogs[prog.subprog_of(call)].end;
    returns_from(prog, call + 1, end)
}

/// Whether instruction `i` of a function ending before `end` is an `exit`, or `ja`s that
/// lead to one with nothing else run.
fn returns_from(prog: &Program, mut i: usize, end: usize) -> bool {
    for _ in 0..=JUMPS_TO_EXIT {
        if i >= end {
            return false;
        }
        match prog.insts[i].op {
            Op::Exit => return true,
            Op::Ja { target } => i = target as usize,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::tail_reached;
    use crate::encode_insn as ins;

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    fn call(rel: i32) -> [u8; 8] {
        ins(0x85, 0, 1, 0, rel)
    }

    fn reached(code: &[[u8; 8]]) -> Vec<bool> {
        tail_reached(&crate::decode(&code.concat(), &[]).unwrap())
    }

    #[test]
    fn a_call_followed_by_exit_is_in_tail_position_and_one_followed_by_anything_else_is_not() {
        // 0: call f ; 1: exit ; 2: f: call g ; 3: r0 += 1 ; 4: exit ; 5: g: r0 = 7 ; 6: exit
        let code = [
            call(1),
            EXIT,
            call(2),
            ins(0x07, 0, 0, 0, 1),
            EXIT,
            ins(0xb7, 0, 0, 0, 7),
            EXIT,
        ];
        assert_eq!(reached(&code), [true, true, false]);
    }

    #[test]
    fn tail_position_reaches_through_jumps_to_the_exit_and_down_call_chains() {
        // 0: call f ; 1: ja +1 ; 2: r0 = 1 ; 3: exit ; 4: f: call g ; 5: exit ; 6: g: exit
        let code = [
            call(3),
            ins(0x05, 0, 0, 1, 0),
            ins(0xb7, 0, 0, 0, 1),
            EXIT,
            call(1),
            EXIT,
            EXIT,
        ];
        assert_eq!(reached(&code), [true, true, true]);
    }

    #[test]
    fn one_call_site_that_goes_on_after_the_call_clears_the_function_and_its_callees() {
        // 0: call f ; 1: call f ; 2: exit ; 3: f: call g ; 4: exit ; 5: g: exit
        let code = [call(2), call(1), EXIT, call(1), EXIT, EXIT];
        assert_eq!(reached(&code), [true, false, false]);
    }
}
