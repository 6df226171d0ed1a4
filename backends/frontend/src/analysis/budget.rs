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
}
