//! The instruction budget: what a taken back-edge and a bpf-to-bpf call charge, and the
//! loops whose charges a backend without a reserved budget register can count in a
//! register the loop leaves free ([`budget_loops`]).

use crate::{op_kind, BranchKind, Program, Reg};

/// What a taken jump from instruction index `from` to index `to` charges the budget:
/// `from.pc - to.pc + 1` for a jump to an earlier or the same pc (a back-edge), nothing for a
/// forward jump. A bpf-to-bpf call charges [`CALL_CHARGE`]. The check happens before the
/// jump: if the charge exceeds the budget left, the program stops at `from.pc` with the
/// budget untouched.
///
/// Indices are in pc order, so a forward jump is told apart without reading the target's
/// instruction: at 1 M instructions that read was a cache miss for nearly every jump.
#[inline]
pub fn back_edge_charge(prog: &Program, from: usize, to: usize) -> Option<u64> {
    (to <= from).then(|| (prog.insts[from].pc - prog.insts[to].pc + 1) as u64)
}

/// A loop of the entry function whose back-edges may count the budget in `reg`
/// ([`budget_loops`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetLoop {
    /// The loop's head, the target of its back-edges: where the register is loaded, on
    /// the way in from outside; the back-edges land past the load.
    pub head: usize,
    /// The loop's last back-edge: the loop is `head..=last`.
    pub last: usize,
    /// A BPF register no instruction of the loop mentions and that no exit of the loop
    /// leaves live: the budget's home while the loop runs.
    pub reg: Reg,
}

/// The loops of the entry function whose charges can count the budget in a register
/// rather than in memory, outermost first, for a backend whose budget otherwise lives in
/// memory (x86-64): while a loop runs, `reg` holds the budget, loaded at the head, and
/// each charge subtracts there and stores the result back, so memory always holds the
/// budget too (any code that reads it, a stop, the loop's exits, sees it current). A
/// charge then reads no memory: on CPUs that do not rename memory, a branchy loop's
/// read-modify-write of the budget waits for the last charge's store each time (measured
/// +75% on short loops that mispredict their exits, docs/BENCHMARKS.md).
///
/// A loop is `head..=last` (the target of back-edges and the last of them) and qualifies
/// when it is entered only at its head (no jump from outside lands inside; `enters`
/// approves each jump from outside to the head: the backend's landing for it must be the
/// head's start), makes no call of any kind and no legacy packet load (they clobber
/// registers and may read the budget), and leaves one of `candidates` unmentioned and
/// dead at every exit (by [`super::live_in`]). A loop inside a chosen one is not
/// considered: its back-edges count in the outer loop's register.
pub fn budget_loops(
    prog: &Program,
    candidates: &[Reg],
    enters: impl Fn(usize, usize) -> bool,
) -> Vec<BudgetLoop> {
    let Some(sp) = prog.subprogs.first() else {
        return Vec::new();
    };
    let (start, end) = (sp.start, sp.end);
    let mut loops: Vec<(usize, usize)> = (prog.branches_in(start, end).iter())
        .filter(|b| b.kind != BranchKind::CallLocal && b.target <= b.at)
        .map(|b| (b.target as usize, b.at as usize))
        .collect();
    if loops.is_empty() {
        return Vec::new();
    }
    loops.sort_unstable();
    // One loop per head, up to its last back-edge.
    loops.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.max(later.1);
        }
        same
    });
    // Each instruction's reads and writes, and the function's liveness: worked out once,
    // and only when a loop gets that far (no call in it, entered at its head); they are
    // most of this analysis' cost.
    let mut reads_writes: Vec<(u16, u16)> = Vec::new();
    let mut live: Option<Vec<u16>> = None;
    let mut chosen = Vec::new();
    let mut free_from = start;
    for (head, last) in loops {
        if head < free_from {
            continue;
        }
        let inside = |i: u32| (head..=last).contains(&(i as usize));
        let kinds = (head..=last).fold(0u16, |k, i| k | prog.kind(i));
        if kinds & (op_kind::CALLS | op_kind::PACKET_LOAD | op_kind::MOV_PERCPU) != 0 {
            continue;
        }
        // Entered only at the head, by jumps the backend lands at its start.
        let mut from_outside = (prog.branches_in(start, head).iter())
            .chain(prog.branches_in(last + 1, end))
            .filter(|b| b.kind != BranchKind::CallLocal && inside(b.target));
        if from_outside.any(|b| b.target as usize != head || !enters(b.at as usize, head)) {
            continue;
        }
        if reads_writes.is_empty() {
            reads_writes = (start..end)
                .map(|i| (prog.reads(i), prog.writes(i)))
                .collect();
        }
        let mentioned =
            (reads_writes[head - start..=last - start].iter()).fold(0u16, |m, &(r, w)| m | r | w);
        if candidates.iter().all(|&r| mentioned & (1 << r) != 0) {
            continue;
        }
        let live = live
            .get_or_insert_with(|| super::liveness::live_in_from(prog, start, end, &reads_writes));
        // What the loop's exits leave live: jumps out, and falling through past `last`.
        let mut live_out = 0u16;
        for b in prog.branches_in(head, last + 1) {
            if b.kind != BranchKind::CallLocal && !inside(b.target) {
                live_out |= live[b.target as usize - start];
            }
        }
        if prog.kind(last) & (op_kind::JA | op_kind::EXIT) == 0 {
            live_out |= live[last + 1 - start];
        }
        let Some(&reg) = candidates
            .iter()
            .find(|&&r| (mentioned | live_out) & (1 << r) == 0)
        else {
            continue;
        };
        chosen.push(BudgetLoop { head, last, reg });
        free_from = last + 1;
    }
    chosen
}

/// Budget charged by each bpf-to-bpf call (bounds the work of call-heavy straight-line code;
/// recursion is rejected at load, so calls alone cannot loop).
pub const CALL_CHARGE: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges() {
        // Index (slot): 0 (0-1) lddw; 1 (2) ja -3, to 0; 2 (3) ja -1, to itself; 3 (4) ja +0;
        // 4 (5) exit.
        use crate::encode_insn;
        let mut code = encode_insn(0x18, 0, 0, 0, 7).to_vec();
        code.extend(encode_insn(0, 0, 0, 0, 0));
        for off in [-3, -1, 0] {
            code.extend(encode_insn(0x05, 0, 0, off, 0));
        }
        code.extend(encode_insn(0x95, 0, 0, 0, 0));
        let prog = crate::decode(&code, &[]).unwrap();
        assert_eq!(back_edge_charge(&prog, 1, 0), Some(3));
        assert_eq!(back_edge_charge(&prog, 2, 2), Some(1));
        assert_eq!(back_edge_charge(&prog, 3, 4), None);
    }

    /// Decodes `(opcode, dst, src, off, imm)` instructions.
    fn program(insns: &[(u8, u8, u8, i16, i32)]) -> Program {
        let code: Vec<u8> = insns
            .iter()
            .flat_map(|&(o, d, s, off, imm)| crate::encode_insn(o, d, s, off, imm))
            .collect();
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        crate::decode(&code, &helpers).unwrap()
    }

    const ANY: fn(usize, usize) -> bool = |_, _| true;

    #[test]
    fn a_loop_counts_in_the_first_register_it_leaves_free_and_dead() {
        // 0: r0 = 0; 1: r1 += 1 (head); 2: r0 += r1; 3: if r1 < 9 goto 1; 4: r0 += r5;
        // 5: exit. r5 is unmentioned in the loop but read after it: r4 is the one.
        let prog = program(&[
            (0xb7, 0, 0, 0, 0),
            (0x07, 1, 0, 0, 1),
            (0x0f, 0, 1, 0, 0),
            (0xa5, 1, 0, -3, 9),
            (0x0f, 0, 5, 0, 0),
            (0x95, 0, 0, 0, 0),
        ]);
        let loops = budget_loops(&prog, &[5, 4, 3], ANY);
        assert_eq!(
            loops,
            [BudgetLoop {
                head: 1,
                last: 3,
                reg: 4
            }]
        );
        // No candidate left: no loop.
        assert_eq!(budget_loops(&prog, &[5, 1], ANY), []);
        // The backend's landing decides too: a jump from outside must land at the head.
        let entered = program(&[
            (0x15, 1, 0, 0, 0), // 0: if r1 == 0 goto 1 (a jump from outside to the head)
            (0x07, 1, 0, 0, 1),
            (0xa5, 1, 0, -2, 9),
            (0x95, 0, 0, 0, 0),
        ]);
        assert_eq!(budget_loops(&entered, &[5], ANY).len(), 1);
        assert_eq!(budget_loops(&entered, &[5], |at, _| at != 0), []);
    }

    #[test]
    fn loops_that_call_or_are_entered_inside_keep_the_budget_in_memory() {
        // A helper call in the loop.
        let calls = program(&[(0x85, 0, 0, 0, 1), (0x55, 0, 0, -2, 0), (0x95, 0, 0, 0, 0)]);
        assert_eq!(budget_loops(&calls, &[5, 4], ANY), []);
        // clang's rotated loop, entered at its test: 0: goto 2; 1: r1 += 1 (head);
        // 2: if r1 < 9 goto 1; 3: exit.
        let rotated = program(&[
            (0x05, 0, 0, 1, 0),
            (0x07, 1, 0, 0, 1),
            (0xa5, 1, 0, -2, 9),
            (0x95, 0, 0, 0, 0),
        ]);
        assert_eq!(budget_loops(&rotated, &[5, 4], ANY), []);
    }

    #[test]
    fn an_inner_loop_counts_in_its_outer_loops_register() {
        // 0: r1 += 1 (outer head); 1: r2 += 1 (inner head); 2: if r2 < 9 goto 1;
        // 3: if r1 < 9 goto 0; 4: exit.
        let prog = program(&[
            (0x07, 1, 0, 0, 1),
            (0x07, 2, 0, 0, 1),
            (0xa5, 2, 0, -2, 9),
            (0xa5, 1, 0, -4, 9),
            (0x95, 0, 0, 0, 0),
        ]);
        assert_eq!(
            budget_loops(&prog, &[5], ANY),
            [BudgetLoop {
                head: 0,
                last: 3,
                reg: 5
            }]
        );
    }
}
