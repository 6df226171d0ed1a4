//! Which stack slots of a function become SSA values.
//!
//! A one-pass JIT keeps every `*(r10 + off)` in memory; most of what clang spills there is a
//! scalar local read back at the same offset and size. When nothing but `r10 + constant`
//! addresses the frame, such a slot is just a variable, and Cranelift keeps it in a register.
//!
//! The frame is private to the function exactly when r10 never leaves the base position of
//! a load, store or atomic: a helper, a callee or another register can only reach the frame
//! through a copy of r10 (an ALU source, a stored value, an atomic operand, a compared
//! operand). A slot `(off, size)` is promoted when the frame is private, the slot lies in
//! `[-512, 0)`, no atomic touches it, and every access that overlaps it has exactly its
//! offset and size: then no access reads bytes it wrote through another shape, and the
//! slots left in memory never overlap a promoted one.

use packjit_frontend::{Inst, Op, Operand, Size, R10, STACK_SIZE};

/// A stack slot: offset from r10 and access size.
pub(crate) type Slot = (i16, Size);

/// How one function's frame is kept.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct FramePlan {
    /// The slots that live in SSA variables, ascending by offset.
    pub slots: Vec<Slot>,
    /// Whether the frame needs memory at all: some access stays in memory, or r10 escapes.
    /// Without it the function reserves no stack (Cranelift keeps an unused slot).
    pub memory: bool,
}

/// The plan for `insts` (one function).
pub(crate) fn plan(insts: &[Inst]) -> FramePlan {
    let mut accesses: Vec<(Slot, bool)> = Vec::new();
    for inst in insts {
        if frame_escapes(&inst.op) {
            return FramePlan {
                slots: Vec::new(),
                memory: true,
            };
        }
        match inst.op {
            Op::Load {
                base: R10,
                off,
                size,
                ..
            }
            | Op::Store {
                base: R10,
                off,
                size,
                ..
            } => accesses.push(((off, size), false)),
            Op::Atomic {
                base: R10,
                off,
                size,
                ..
            } => accesses.push(((off, size), true)),
            _ => {}
        }
    }
    accesses.sort_by_key(|&((off, size), atomic)| (off, size.bytes(), atomic));
    accesses.dedup();
    let overlaps = |a: Slot, b: Slot| {
        let (a0, a1) = (a.0 as i32, a.0 as i32 + a.1.bytes() as i32);
        let (b0, b1) = (b.0 as i32, b.0 as i32 + b.1.bytes() as i32);
        a0 < b1 && b0 < a1
    };
    let in_frame =
        |s: Slot| s.0 as i32 >= -(STACK_SIZE as i32) && s.0 as i32 + s.1.bytes() as i32 <= 0;
    let mut out = Vec::new();
    for (i, &(slot, atomic)) in accesses.iter().enumerate() {
        let clash = accesses
            .iter()
            .enumerate()
            .any(|(j, &(other, other_atomic))| {
                j != i && overlaps(slot, other) && (other != slot || other_atomic)
            });
        if !atomic && !clash && in_frame(slot) {
            out.push(slot);
        }
    }
    let memory = accesses.len() > out.len();
    FramePlan { slots: out, memory }
}

/// `true` when `op` reads r10 other than as the base address of a memory access: a copy of
/// the frame pointer may then reach memory, a helper or a callee.
pub(crate) fn frame_escapes(op: &Op) -> bool {
    let reg = |o: Operand| o == Operand::Reg(R10);
    match *op {
        Op::Alu { src, .. } => reg(src),
        Op::MovSx { src, .. } | Op::MovPerCpu { src, .. } => src == R10,
        Op::Store { src, .. } => reg(src),
        Op::Atomic { src, .. } => src == R10,
        Op::Jcond { dst, src, .. } => dst == R10 || reg(src),
        Op::CallReg { reg: r } => r == R10,
        Op::PacketLoad { index, .. } => index == Some(R10),
        Op::Neg { dst, .. } | Op::End { dst, .. } => dst == R10,
        Op::Load { .. }
        | Op::LdImm64 { .. }
        | Op::Ja { .. }
        | Op::CallHelper { .. }
        | Op::CallLocal { .. }
        | Op::Exit => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(code: &[[u8; 8]]) -> Vec<Inst> {
        let bytes: Vec<u8> = code.iter().flatten().copied().collect();
        packjit_frontend::decode(&bytes, &[]).unwrap().insts.clone()
    }

    use packjit_frontend::encode_insn as i;

    #[test]
    fn same_shape_slots_promote_and_overlaps_do_not() {
        let insts = decode(&[
            i(0x7b, 10, 1, -8, 0),  // *(u64 *)(r10 - 8) = r1
            i(0x79, 0, 10, -8, 0),  // r0 = *(u64 *)(r10 - 8)
            i(0x63, 10, 1, -16, 0), // *(u32 *)(r10 - 16) = r1
            i(0x71, 2, 10, -14, 0), // r2 = *(u8 *)(r10 - 14): overlaps the u32
            i(0x95, 0, 0, 0, 0),
        ]);
        let p = plan(&insts);
        assert_eq!(p.slots, vec![(-8, Size::DW)]);
        assert!(p.memory);
    }

    #[test]
    fn a_frame_of_promoted_slots_needs_no_memory() {
        let insts = decode(&[
            i(0x7b, 10, 1, -8, 0), // *(u64 *)(r10 - 8) = r1
            i(0x79, 0, 10, -8, 0), // r0 = *(u64 *)(r10 - 8)
            i(0x95, 0, 0, 0, 0),
        ]);
        assert_eq!(
            plan(&insts),
            FramePlan {
                slots: vec![(-8, Size::DW)],
                memory: false
            }
        );
    }

    #[test]
    fn a_copied_frame_pointer_keeps_the_whole_frame_in_memory() {
        let insts = decode(&[
            i(0x7b, 10, 1, -8, 0), // *(u64 *)(r10 - 8) = r1
            i(0xbf, 2, 10, 0, 0),  // r2 = r10
            i(0x79, 0, 10, -8, 0), // r0 = *(u64 *)(r10 - 8)
            i(0x95, 0, 0, 0, 0),
        ]);
        assert_eq!(
            plan(&insts),
            FramePlan {
                slots: vec![],
                memory: true
            }
        );
    }

    #[test]
    fn atomics_keep_their_slot_in_memory() {
        let insts = decode(&[
            i(0x7b, 10, 1, -8, 0),  // *(u64 *)(r10 - 8) = r1
            i(0xdb, 10, 1, -8, 0),  // lock *(u64 *)(r10 - 8) += r1
            i(0x7b, 10, 1, -16, 0), // *(u64 *)(r10 - 16) = r1
            i(0x95, 0, 0, 0, 0),
        ]);
        assert_eq!(plan(&insts).slots, vec![(-16, Size::DW)]);
    }
}
