//! Constant blinding, once for every backend: a rewrite of each instruction that carries a
//! program constant into instructions whose constants are that value xored with a
//! per-instruction mask, and the mask, as the kernel's `bpf_jit_blind_constants` does.
//!
//! An attacker who controls a program's immediates controls bytes of the emitted code (a
//! JIT-spraying gadget hides in a 32-bit immediate). After the rewrite no immediate of the
//! program appears in the code: only `imm ^ mask` and `mask`, the mask derived from a
//! random per-program key and the instruction's pc ([`blinding_mask`]). The backends lower
//! the rewritten instructions like any others; they never see the key, and the only thing
//! blinding asks of them is a register for [`AX`], the rewrite's scratch register, in their
//! register map.
//!
//! | instruction | rewritten to |
//! |---|---|
//! | `dst = imm` (`mov`, 32 or 64 bits) | `dst = imm ^ m ; dst ^= m` |
//! | `dst <<= imm` (and the other shifts) | `dst <<= imm & 63` (31 at 32 bits): only the count reaches the code |
//! | `dst op= imm` | `ax = imm ^ m ; ax ^= m ; dst op= ax` |
//! | `if dst cond imm goto` | `ax = imm ^ m ; ax ^= m ; if dst cond ax goto` |
//! | `*(size *)(base + off) = imm` | `ax = imm ^ m ; ax ^= m ; *(size *)(base + off) = ax` |
//! | `dst = imm64` (`lddw`) | `dst = imm64 ^ m64 ; ax = m64 ; dst ^= ax` |
//! | `dst = src` per-CPU of array `id` | `ax = id ^ m ; ax ^= m ; dst = src` per-CPU of array `ax` |
//!
//! A zero immediate is left as it is. Every half of a mask has its top bit set, so no masked
//! value equals its constant. A 32-bit immediate and its mask are both sign-extended by the 64-bit `mov`/`xor`: the xor
//! of two sign-extended words is the sign extension of their xor, so `ax` holds exactly the
//! 64-bit value eBPF reads from `imm`, and 32-bit operations read its low half. Shifts,
//! divisions and compares by a register have the same results as by the immediate (RFC
//! 9669 masks shift counts and defines division by zero for both forms).

use crate::analysis::blinding_mask;
use crate::{AluOp, Inst, Op, Operand, Reg, Width};

/// The blinding rewrite's scratch register: a pseudo eBPF register after r10. Every backend
/// maps it to a native register that is dead between eBPF instructions and that its lowering
/// of a register operand never writes before reading that operand.
pub const AX: Reg = 11;

/// The instructions that stand for one blinded instruction, in order (at most three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blinded {
    ops: [Op; 3],
    len: usize,
}

impl Blinded {
    fn of(ops: &[Op]) -> Self {
        let mut all = [Op::Exit; 3];
        all[..ops.len()].copy_from_slice(ops);
        Blinded {
            ops: all,
            len: ops.len(),
        }
    }

    /// The rewritten instructions.
    pub fn ops(&self) -> &[Op] {
        &self.ops[..self.len]
    }
}

/// `inst` blinded with the program's key, or `None` when it carries no constant to hide.
pub fn blind(inst: &Inst, program_key: u64) -> Option<Blinded> {
    // The top bit of each 32-bit half is set: no half of the mask is zero, so no masked
    // half equals the constant's.
    let mask = blinding_mask(program_key, inst.pc as usize) | 0x8000_0000_8000_0000;
    // 32-bit masks for 32-bit immediates: each half costs one instruction pair at most.
    let m = mask as u32 as i32;
    let load_ax = |imm: i32| {
        [
            alu(Width::W64, AluOp::Mov, AX, imm ^ m),
            alu(Width::W64, AluOp::Xor, AX, m),
        ]
    };
    match inst.op {
        // Zero hides nothing.
        Op::Alu {
            src: Operand::Imm(0),
            ..
        }
        | Op::Jcond {
            src: Operand::Imm(0),
            ..
        }
        | Op::Store {
            src: Operand::Imm(0),
            ..
        }
        | Op::MovPerCpu {
            array: Operand::Imm(0),
            ..
        } => None,
        Op::LdImm64 { imm, .. } if imm.get() == 0 => None,
        // A shift's count is masked to 5 or 6 bits (RFC 9669): only that reaches the code.
        Op::Alu {
            width,
            op: op @ (AluOp::Lsh | AluOp::Rsh | AluOp::Arsh),
            dst,
            src: Operand::Imm(count),
        } => {
            let bits = if width == Width::W64 { 63 } else { 31 };
            Some(Blinded::of(&[alu(width, op, dst, count & bits)]))
        }
        Op::Alu {
            width,
            op: AluOp::Mov,
            dst,
            src: Operand::Imm(imm),
        } => Some(Blinded::of(&[
            alu(width, AluOp::Mov, dst, imm ^ m),
            alu(width, AluOp::Xor, dst, m),
        ])),
        Op::Alu {
            width,
            op,
            dst,
            src: Operand::Imm(imm),
        } => {
            let [a, b] = load_ax(imm);
            Some(Blinded::of(&[
                a,
                b,
                Op::Alu {
                    width,
                    op,
                    dst,
                    src: Operand::Reg(AX),
                },
            ]))
        }
        Op::Jcond {
            src: Operand::Imm(imm),
            width,
            cond,
            dst,
            target,
        } => {
            let [a, b] = load_ax(imm);
            let jump = Op::Jcond {
                width,
                cond,
                dst,
                src: Operand::Reg(AX),
                target,
            };
            Some(Blinded::of(&[a, b, jump]))
        }
        Op::Store {
            size,
            base,
            off,
            src: Operand::Imm(imm),
        } => {
            let [a, b] = load_ax(imm);
            let store = Op::Store {
                size,
                base,
                off,
                src: Operand::Reg(AX),
            };
            Some(Blinded::of(&[a, b, store]))
        }
        Op::MovPerCpu {
            dst,
            src,
            array: Operand::Imm(id),
        } => {
            let [a, b] = load_ax(id);
            let mov = Op::MovPerCpu {
                dst,
                src,
                array: Operand::Reg(AX),
            };
            Some(Blinded::of(&[a, b, mov]))
        }
        Op::LdImm64 { dst, imm } => Some(Blinded::of(&[
            Op::LdImm64 {
                dst,
                imm: (imm.get() ^ mask).into(),
            },
            Op::LdImm64 {
                dst: AX,
                imm: mask.into(),
            },
            Op::Alu {
                width: Width::W64,
                op: AluOp::Xor,
                dst,
                src: Operand::Reg(AX),
            },
        ])),
        _ => None,
    }
}

fn alu(width: Width, op: AluOp, dst: Reg, imm: i32) -> Op {
    Op::Alu {
        width,
        op,
        dst,
        src: Operand::Imm(imm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cond, Size};

    /// The value `ops` leave in `reg`, for the `mov`/`xor` immediates and `lddw`s the rewrite
    /// emits (register operands are not followed).
    fn value_of(ops: &[Op], reg: Reg) -> u64 {
        let mut v = 0u64;
        for op in ops {
            match *op {
                Op::Alu {
                    width,
                    op,
                    dst,
                    src: Operand::Imm(imm),
                } if dst == reg => {
                    let imm = imm as i64 as u64;
                    v = match op {
                        AluOp::Mov => imm,
                        AluOp::Xor => v ^ imm,
                        _ => panic!("unexpected {op:?}"),
                    };
                    if width == Width::W32 {
                        v &= 0xffff_ffff;
                    }
                }
                Op::LdImm64 { dst, imm } if dst == reg => v = imm.get(),
                _ => {}
            }
        }
        v
    }

    fn mask_of(ops: &[Op]) -> u64 {
        ops.iter()
            .find_map(|op| match *op {
                Op::LdImm64 { dst: AX, imm } => Some(imm.get()),
                _ => None,
            })
            .unwrap_or(0)
    }

    fn inst(op: Op) -> Inst {
        Inst { op, pc: 7 }
    }

    #[test]
    fn immediates_become_ax_with_the_same_value_and_never_appear() {
        for key in [1u64, 0xdead_beef_0042, u64::MAX] {
            for imm in [1, -1, 0x7fff_ffff, i32::MIN, 0x1234_5678] {
                let add = inst(alu(Width::W64, AluOp::Add, 3, imm));
                let b = blind(&add, key).expect("an ALU immediate is blinded");
                let ops = b.ops();
                assert_eq!(ops.len(), 3);
                assert_eq!(value_of(&ops[..2], AX), imm as i64 as u64, "key {key:#x}");
                assert!(matches!(
                    ops[2],
                    Op::Alu {
                        op: AluOp::Add,
                        dst: 3,
                        src: Operand::Reg(AX),
                        ..
                    }
                ));
                for op in ops {
                    if let Op::Alu {
                        src: Operand::Imm(v),
                        ..
                    } = *op
                    {
                        assert_ne!(v, imm, "imm {imm:#x} key {key:#x}: {ops:?}");
                    }
                }
                let mov = inst(alu(Width::W32, AluOp::Mov, 4, imm));
                let ops = blind(&mov, key).unwrap().ops().to_vec();
                assert_eq!(ops.len(), 2, "a mov needs no AX");
                assert_eq!(value_of(&ops, 4), imm as u32 as u64);
            }
        }
    }

    #[test]
    fn jumps_stores_and_lddw_are_blinded() {
        let key = 0x5eed;
        let jump = Op::Jcond {
            width: Width::W32,
            cond: Cond::Gt,
            dst: 2,
            src: Operand::Imm(99),
            target: 4,
        };
        let ops = blind(&inst(jump), key).unwrap().ops().to_vec();
        assert_eq!(value_of(&ops[..2], AX), 99);
        assert!(matches!(
            ops[2],
            Op::Jcond {
                src: Operand::Reg(AX),
                target: 4,
                cond: Cond::Gt,
                ..
            }
        ));
        let store = Op::Store {
            size: Size::H,
            base: 10,
            off: -8,
            src: Operand::Imm(-2),
        };
        let ops = blind(&inst(store), key).unwrap().ops().to_vec();
        assert_eq!(value_of(&ops[..2], AX), -2i64 as u64);
        assert!(matches!(
            ops[2],
            Op::Store {
                src: Operand::Reg(AX),
                off: -8,
                ..
            }
        ));
        let value = 0x0123_4567_89ab_cdefu64;
        let lddw = Op::LdImm64 {
            dst: 6,
            imm: value.into(),
        };
        let ops = blind(&inst(lddw), key).unwrap().ops().to_vec();
        let Op::LdImm64 { imm: masked, .. } = ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(masked.get() ^ mask_of(&ops), value);
        assert_ne!(masked.get() as u32, value as u32);
        assert_ne!((masked.get() >> 32) as u32, (value >> 32) as u32);
        assert!(matches!(
            ops[2],
            Op::Alu {
                op: AluOp::Xor,
                dst: 6,
                src: Operand::Reg(AX),
                ..
            }
        ));
    }

    #[test]
    fn instructions_without_constants_are_left_alone() {
        let reg = Op::Alu {
            width: Width::W64,
            op: AluOp::Add,
            dst: 1,
            src: Operand::Reg(2),
        };
        assert_eq!(blind(&inst(reg), 3), None);
        assert_eq!(blind(&inst(Op::Exit), 3), None);
        assert_eq!(blind(&inst(alu(Width::W64, AluOp::Add, 1, 0)), 3), None);
    }

    #[test]
    fn shift_counts_are_masked_not_blinded() {
        let shl = inst(alu(Width::W32, AluOp::Lsh, 1, 0x7fff_fff3));
        let ops = blind(&shl, 5).unwrap().ops().to_vec();
        assert_eq!(ops, [alu(Width::W32, AluOp::Lsh, 1, 0x13)]);
        let sar = inst(alu(Width::W64, AluOp::Arsh, 1, -1));
        assert_eq!(
            blind(&sar, 5).unwrap().ops(),
            [alu(Width::W64, AluOp::Arsh, 1, 63)]
        );
    }

    #[test]
    fn per_cpu_ids_go_through_ax() {
        let mov = Op::MovPerCpu {
            dst: 2,
            src: 3,
            array: Operand::Imm(0x1234_5678),
        };
        let ops = blind(&inst(mov), 9).unwrap().ops().to_vec();
        assert_eq!(value_of(&ops[..2], AX), 0x1234_5678);
        assert!(matches!(
            ops[2],
            Op::MovPerCpu {
                array: Operand::Reg(AX),
                dst: 2,
                src: 3
            }
        ));
    }
}
