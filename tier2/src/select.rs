//! Branches over one ALU instruction become selects: `if c goto T; rX op= y; [goto T;] T:`
//! is `rX = c ? rX : (rX op y); goto T`.
//!
//! clang keeps `nlines += c == '\n'` and `if (!in_word) nwords++` of the `words` peer as
//! such branches (`w6 = 1; if w8 == 10 goto L; w6 = 0; goto L`), and LLVM's x86 backend,
//! given that bytecode, turns them back into `sete` and `adc`/`cmov`. Lifted as branches,
//! they are two more data-dependent branches per byte, and Cranelift puts the register
//! moves of their join on split edges; as selects they are a conditional move.
//!
//! Why the value is the same: on both paths the only instruction between the branch and the
//! join is the ALU instruction, which cannot stop the program or touch memory, so running it
//! unconditionally and keeping its result only on the fall-through path leaves every
//! register as either path would. Neither the instruction nor the `goto` after it may be a
//! jump target (another path into the join's middle). The lifter keeps the branch when it
//! would charge the budget (a back-edge: the stop's pc would depend on the path).

use packjit_frontend::{AluOp, Inst, Op};

/// Per instruction of the function `start..start + insts.len()` (index from its start): for
/// a conditional jump that skips one ALU instruction, the join (an instruction index of the
/// program) and whether a `goto` to it follows the ALU instruction (its pc may be charged).
pub(crate) fn plan(insts: &[Inst], start: usize, is_target: &[bool]) -> Vec<Option<Skip>> {
    (0..insts.len())
        .map(|k| {
            let Op::Jcond { target, .. } = insts[k].op else {
                return None;
            };
            let join = target as usize;
            let Some(Op::Alu { op, .. }) = insts.get(k + 1).map(|i| i.op) else {
                return None;
            };
            // Cheap, non-trapping operations only: the select runs them on both paths.
            let cheap = matches!(
                op,
                AluOp::Mov
                    | AluOp::Add
                    | AluOp::Sub
                    | AluOp::Or
                    | AluOp::And
                    | AluOp::Xor
                    | AluOp::Lsh
                    | AluOp::Rsh
                    | AluOp::Arsh
            );
            if !cheap || is_target[k + 1] {
                return None;
            }
            if join == start + k + 2 {
                return Some(Skip { join, goto: None });
            }
            match insts.get(k + 2).map(|i| i.op) {
                Some(Op::Ja { target }) if target as usize == join && !is_target[k + 2] => {
                    Some(Skip {
                        join,
                        goto: Some(start + k + 2),
                    })
                }
                _ => None,
            }
        })
        .collect()
}

/// A conditional jump to `join` over one ALU instruction, then a `goto join` at instruction
/// `goto` (program index) or the join itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Skip {
    pub join: usize,
    pub goto: Option<usize>,
}
