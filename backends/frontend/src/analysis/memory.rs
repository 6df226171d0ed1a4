//! The sandbox's memory rules: how big a program's stack block is, and which accesses are
//! proven inside the frame at compile time and which need a run-time check.

use crate::{Op, Program, Size, R10, STACK_SIZE};

/// Bytes of the contiguous stack block a sandboxed run gets: one 512-byte frame per level of
/// the deepest call chain, or 0 when no function reads r10 (nothing could observe a frame).
///
/// Frame `k` (the entry is `k = 0`) is `[end - 512 (k + 1), end - 512 k)`; a callee's r10 is
/// its caller's r10 - 512. No native data lives inside the block, so the whole block is one
/// region for the checks and it is zeroed at entry (nothing of the host leaks in).
pub fn stack_block_size(prog: &Program) -> usize {
    if prog.subprogs.iter().any(|s| s.uses_stack) {
        prog.call_depth * STACK_SIZE
    } else {
        0
    }
}

/// Is `[r10 + off, r10 + off + size)` inside the current frame? Such accesses are proven safe
/// at compile time and carry no run-time check.
pub fn is_frame_constant(base: u8, off: i16, size: Size) -> bool {
    base == R10 && off as i64 >= -(STACK_SIZE as i64) && off as i64 + size.bytes() as i64 <= 0
}

/// Does this instruction need a sandbox check? `Some((base, off, size))` for loads, stores
/// and atomics whose address is not [frame-constant](is_frame_constant).
pub fn checked_access(op: &Op) -> Option<(u8, i16, Size)> {
    let (base, off, size) = match *op {
        Op::Load {
            base, off, size, ..
        }
        | Op::Store {
            base, off, size, ..
        }
        | Op::Atomic {
            base, off, size, ..
        } => (base, off, size),
        _ => return None,
    };
    (!is_frame_constant(base, off, size)).then_some((base, off, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_constant_bounds() {
        assert!(is_frame_constant(R10, -8, Size::DW));
        assert!(is_frame_constant(R10, -512, Size::DW));
        assert!(!is_frame_constant(R10, -513, Size::B));
        assert!(!is_frame_constant(R10, -4, Size::DW));
        assert!(!is_frame_constant(R10, 0, Size::B));
        assert!(!is_frame_constant(1, -8, Size::DW));
    }

    #[test]
    fn stack_block_follows_call_depth() {
        // mov r1, r10 ; call +1 ; exit ; (f1) mov r0, 0 ; exit
        let code: Vec<u8> = [
            [0xbf, 0xa1, 0, 0, 0, 0, 0, 0],
            [0x85, 0x10, 0, 0, 1, 0, 0, 0],
            [0x95, 0, 0, 0, 0, 0, 0, 0],
            [0xb7, 0, 0, 0, 0, 0, 0, 0],
            [0x95, 0, 0, 0, 0, 0, 0, 0],
        ]
        .concat();
        let p = crate::decode(&code, &[]).unwrap();
        assert_eq!(p.call_depth, 2);
        assert_eq!(stack_block_size(&p), 1024);
    }
}
