//! The instruction budget: what a taken back-edge and a bpf-to-bpf call charge.

use crate::Program;

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

/// The back-edges that close their loop: for each instruction some backward jump goes to,
/// the last such jump (by position), as instruction indices, ascending. A loop's other
/// back-edges (a `continue` in its middle, one arm of a diamond at its end) usually fall
/// through into more of the loop; the closing one is usually taken, and falls through out of
/// the loop. A backend may lower the two differently (x86-64 charges a closing back-edge
/// before its test and takes the charge back where the loop ends).
pub fn loop_latches(prog: &Program) -> Vec<u32> {
    let mut back: Vec<(u32, u32)> = (prog.branches.iter())
        .filter(|b| b.kind != crate::BranchKind::CallLocal && b.target <= b.at)
        .map(|b| (b.target, b.at))
        .collect();
    back.sort_unstable();
    // Sorted by target, then position: the last of each target's run closes its loop.
    let mut latches: Vec<u32> = (back.iter().enumerate())
        .filter(|&(k, &(target, _))| back.get(k + 1).is_none_or(|n| n.0 != target))
        .map(|(_, &(_, at))| at)
        .collect();
    latches.sort_unstable();
    latches
}

/// Budget charged by each bpf-to-bpf call (bounds the work of call-heavy straight-line code;
/// recursion is rejected at load, so calls alone cannot loop).
pub const CALL_CHARGE: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_back_edge_to_a_head_closes_its_loop() {
        // 0: r0 += 1 ; 1: if r0 == 5 goto 0 (a `continue`) ; 2: if r0 != 9 goto 0 (closes)
        // 3: r0 += 1 ; 4: if r0 != 20 goto 3 (an inner-after loop of its own) ; 5: exit
        use crate::encode_insn;
        let code: Vec<u8> = [
            encode_insn(0x07, 0, 0, 0, 1),
            encode_insn(0x15, 0, 0, -2, 5),
            encode_insn(0x55, 0, 0, -3, 9),
            encode_insn(0x07, 0, 0, 0, 1),
            encode_insn(0x55, 0, 0, -2, 20),
            encode_insn(0x95, 0, 0, 0, 0),
        ]
        .concat();
        let prog = crate::decode(&code, &[]).unwrap();
        assert_eq!(loop_latches(&prog), vec![2, 4]);
    }

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
}
