//! Registers that hold one known constant at an instruction, on every path to it.
//!
//! clang loads a wide mask with `lddw` once, before the loop that uses it (the `sieve` peer:
//! `r0 = 0x1ffffffffffffff8` then `r8 &= r0` per iteration). Lifted as a variable, the loop
//! sees a loop-header value, not the constant, so neither Cranelift's rules nor the lift's
//! own patterns can use it; lifted as the constant, the mask is an immediate. A forward
//! dataflow over the function's instructions: a register is known where every path to the
//! instruction last wrote it with the same constant (`lddw`, `mov` of an immediate or of a
//! known register).

use packjit_frontend::{AluOp, Inst, Op, Operand, Width, R10};

/// The constants of r0–r9 on entry to one instruction: bit `r` of `known` set when
/// `values[r]` holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct Known {
    known: u16,
    values: [u64; 10],
}

impl Known {
    /// Register `r`'s constant, if it has one here.
    pub fn get(&self, r: u8) -> Option<u64> {
        (r != R10 && self.known & 1 << r != 0).then(|| self.values[r as usize])
    }

    fn set(&mut self, r: u8, v: Option<u64>) {
        if r == R10 {
            return;
        }
        match v {
            Some(v) => {
                self.known |= 1 << r;
                self.values[r as usize] = v;
            }
            None => self.known &= !(1 << r),
        }
    }

    /// What holds on both sides of a join.
    fn meet(&self, other: &Known) -> Known {
        let mut known = self.known & other.known;
        for r in 0..10 {
            if self.values[r] != other.values[r] {
                known &= !(1 << r);
            }
        }
        Known {
            known,
            values: self.values,
        }
    }

    /// The state after `op`.
    fn after(mut self, op: Op) -> Known {
        match op {
            Op::Alu {
                width,
                op: AluOp::Mov,
                dst,
                src,
            } => {
                let v = match src {
                    Operand::Imm(i) => Some(i as i64 as u64),
                    Operand::Reg(s) => self.get(s),
                };
                let v = match width {
                    Width::W64 => v,
                    Width::W32 => v.map(|v| v & u64::from(u32::MAX)),
                };
                self.set(dst, v);
            }
            Op::LdImm64 { dst, imm } => self.set(dst, Some(imm.get())),
            Op::Alu { dst, .. }
            | Op::MovSx { dst, .. }
            | Op::Neg { dst, .. }
            | Op::End { dst, .. }
            | Op::Load { dst, .. }
            | Op::MovPerCpu { dst, .. } => self.set(dst, None),
            // A fetching atomic writes its source register (a compare-exchange, r0).
            Op::Atomic { src, .. } => {
                self.set(src, None);
                self.set(0, None);
            }
            // Calls and legacy packet loads leave r0 and clobber r1–r5.
            Op::CallHelper { .. }
            | Op::CallReg { .. }
            | Op::CallLocal { .. }
            | Op::PacketLoad { .. } => {
                for r in 0..=5 {
                    self.set(r, None);
                }
            }
            Op::Store { .. } | Op::Ja { .. } | Op::Jcond { .. } | Op::Exit => {}
        }
        self
    }
}

/// Per instruction of the function `start..start + insts.len()` (index from its start), the
/// constants known on entry to it. Nothing is known at the function's entry (its
/// parameters and the entry's zeroed registers are left to Cranelift), nor where no path
/// from the entry leads.
pub(crate) fn plan(insts: &[Inst], start: usize) -> Vec<Known> {
    let n = insts.len();
    let mut at: Vec<Option<Known>> = vec![None; n];
    if n == 0 {
        return Vec::new();
    }
    at[0] = Some(Known::default());
    let mut pending = vec![false; n];
    pending[0] = true;
    let mut work = vec![0usize];
    while let Some(i) = work.pop() {
        pending[i] = false;
        let Some(state) = at[i] else { continue };
        let out = state.after(insts[i].op);
        let mut flow = |to: usize, at: &mut Vec<Option<Known>>| {
            let Some(k) = to.checked_sub(start).filter(|&k| k < n) else {
                return;
            };
            let next = match at[k] {
                None => out,
                Some(old) => old.meet(&out),
            };
            if at[k] != Some(next) {
                at[k] = Some(next);
                if !pending[k] {
                    pending[k] = true;
                    work.push(k);
                }
            }
        };
        match insts[i].op {
            Op::Exit => {}
            Op::Ja { target } => flow(target as usize, &mut at),
            Op::Jcond { target, .. } => {
                flow(target as usize, &mut at);
                flow(start + i + 1, &mut at);
            }
            _ => flow(start + i + 1, &mut at),
        }
    }
    at.into_iter().map(Option::unwrap_or_default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use packjit_frontend::{Cond, Imm64, Size};

    fn inst(op: Op) -> Inst {
        Inst { pc: 0, op }
    }

    fn lddw(dst: u8, v: u64) -> Op {
        Op::LdImm64 {
            dst,
            imm: Imm64::new(v),
        }
    }

    #[test]
    fn a_constant_loaded_before_a_loop_is_known_inside_it_until_written() {
        // 0: r0 = M; 1: r8 = r0 (loop); 2: r8 &= r0; 3: if r8 != 0 goto 1; 4: r0 = *(r10-8);
        // 5: exit
        let m = 0x1fff_ffff_ffff_fff8;
        let insts: Vec<Inst> = [
            lddw(0, m),
            Op::Alu {
                width: Width::W64,
                op: AluOp::Mov,
                dst: 8,
                src: Operand::Reg(0),
            },
            Op::Alu {
                width: Width::W64,
                op: AluOp::And,
                dst: 8,
                src: Operand::Reg(0),
            },
            Op::Jcond {
                width: Width::W64,
                cond: Cond::Ne,
                dst: 8,
                src: Operand::Imm(0),
                target: 1,
            },
            Op::Load {
                size: Size::DW,
                sign_extend: false,
                dst: 0,
                base: R10,
                off: -8,
            },
            Op::Exit,
        ]
        .into_iter()
        .map(inst)
        .collect();
        let p = plan(&insts, 0);
        assert_eq!(p[0].get(0), None);
        for (i, known) in p.iter().enumerate().take(5).skip(1) {
            assert_eq!(known.get(0), Some(m), "at {i}");
        }
        // r8 is a copy on the first pass, varies after the `and` (the back-edge's meet).
        assert_eq!(p[2].get(8), Some(m));
        assert_eq!(p[1].get(8), None);
        assert_eq!(p[5].get(0), None);
    }

    #[test]
    fn paths_with_different_constants_or_a_call_know_nothing() {
        let mov = |dst, imm| Op::Alu {
            width: Width::W32,
            op: AluOp::Mov,
            dst,
            src: Operand::Imm(imm),
        };
        // 0: if r1 == 0 goto 3; 1: w2 = -1; 2: goto 4; 3: w2 = 7; 4: w3 = -1; 5: call 1;
        // 6: exit
        let insts: Vec<Inst> = [
            Op::Jcond {
                width: Width::W64,
                cond: Cond::Eq,
                dst: 1,
                src: Operand::Imm(0),
                target: 3,
            },
            mov(2, -1),
            Op::Ja { target: 4 },
            mov(2, 7),
            mov(3, -1),
            Op::CallHelper { id: 1 },
            Op::Exit,
        ]
        .into_iter()
        .map(inst)
        .collect();
        let p = plan(&insts, 0);
        assert_eq!(p[2].get(2), Some(0xffff_ffff), "a 32-bit mov zero-extends");
        assert_eq!(p[4].get(2), None);
        assert_eq!(p[5].get(3), Some(0xffff_ffff));
        assert_eq!(p[6].get(3), None, "a call clobbers r1-r5");
    }
}
