//! ALU instructions: moves, arithmetic, shifts, division (with its out-of-line fix-ups for
//! the divisors x86 traps on), sign extension, byte swaps, 64-bit immediates.

use super::{sz_of, Codegen, MapReg};
use crate::encode::{Arith, Cc, Gpr, Label, Shift, Sz};
use crate::regs::*;
use crate::FEATURE_BMI2;
use packjit_frontend::lower::Cold;
use packjit_frontend::lower::{AluHooks, PastEnd};
use packjit_frontend::{AluOp, EndKind, Operand, Reg, Width};
use packjit_plugin_api::CompileError;

/// x86-64's own cold code: the fix-ups of a register divisor x86 `div`/`idiv` trap on,
/// placed after the function so the common path takes no jump.
#[derive(Clone, Copy, Debug)]
pub enum DivFix {
    /// Divisor 0: r11 = 0 (div) or the dividend in rax (mod).
    Zero {
        at: Label,
        back: Label,
        sz: Sz,
        rem: bool,
    },
    /// Signed divisor -1: r11 = -rax (MIN stays MIN, no trap) or 0 (mod).
    Minus1 {
        at: Label,
        back: Label,
        sz: Sz,
        rem: bool,
    },
}

impl Codegen<'_> {
    /// Shifts. x86 masks the count to 31/63 itself, which is eBPF's rule.
    #[inline(always)]
    fn shift(&mut self, op: Shift, sz: Sz, d: Gpr, src: Operand) {
        match src {
            Operand::Imm(i) => {
                let n = i & if sz == Sz::B64 { 63 } else { 31 };
                if n == 0 {
                    // No shift, but a 32-bit result is still zero-extended.
                    if sz == Sz::B32 {
                        self.mov_rr(Sz::B32, d, d);
                    }
                } else {
                    self.e.shift_ri(op, sz, d, n as u8);
                }
            }
            Operand::Reg(s) => {
                let s = s as Gpr; // already a host register here
                if self.d.mode.features & FEATURE_BMI2 != 0 {
                    self.e.shiftx(op, sz, d, d, s);
                } else if s == RCX {
                    self.e.shift_cl(op, sz, d);
                } else {
                    // The count must be in cl, which is BPF r4: park rcx in r11.
                    self.mov_rr(Sz::B64, T11, RCX);
                    self.mov_rr(Sz::B64, RCX, s);
                    let target = if d == RCX { T11 } else { d };
                    self.e.shift_cl(op, sz, target);
                    self.mov_rr(if d == RCX { sz } else { Sz::B64 }, RCX, T11);
                }
            }
        }
    }

    /// Division and remainder. x86 `div`/`idiv` trap on a zero divisor and `idiv` on
    /// MIN / -1; eBPF wants x / 0 = 0, x % 0 = x, MIN / -1 = MIN, MIN % -1 = 0. Constant
    /// divisors are decided at compile time (no branch); a register divisor is tested.
    fn div(&mut self, sz: Sz, op: AluOp, d: Gpr, src: Operand) {
        let signed = matches!(op, AluOp::Sdiv | AluOp::Smod);
        let rem = matches!(op, AluOp::Mod | AluOp::Smod);
        if let Operand::Imm(i) = src {
            if i == 0 {
                if rem {
                    if sz == Sz::B32 {
                        self.mov_rr(Sz::B32, d, d);
                    }
                } else {
                    self.xor_zero(d);
                }
                return;
            }
            if i == -1 && signed {
                if rem {
                    self.xor_zero(d);
                } else {
                    self.e.neg(sz, d); // MIN stays MIN
                }
                return;
            }
            let v = if sz == Sz::B32 {
                i as u32 as i64
            } else {
                i as i64
            };
            self.mov_ri(T11, v);
        } else if let Operand::Reg(s) = src {
            self.mov_rr(Sz::B64, T11, s as Gpr);
        }
        let checks = matches!(src, Operand::Reg(_));
        if d != RAX {
            self.mov_rr(Sz::B64, T10, RAX);
        }
        if d != RDX {
            self.mov_rr(Sz::B64, T9, RDX);
        }
        self.mov_rr(Sz::B64, RAX, d);
        let done = self.e.label();
        if checks {
            // The rare divisors branch to cold code after the function, so the common
            // path takes no jump.
            let zero = self.e.label();
            self.e.test_rr(sz, T11, T11);
            self.cold_jump(Some(Cc::E), zero);
            self.d.queue(Cold::Isa(DivFix::Zero {
                at: zero,
                back: done,
                sz,
                rem,
            }));
            if signed {
                let minus1 = self.e.label();
                self.e.cmp_ri(sz, T11, -1);
                self.cold_jump(Some(Cc::E), minus1);
                self.d.queue(Cold::Isa(DivFix::Minus1 {
                    at: minus1,
                    back: done,
                    sz,
                    rem,
                }));
            }
        }
        if signed {
            self.e.sign_extend_rax(sz);
        } else {
            self.xor_zero(RDX);
        }
        if signed {
            self.e.idiv(sz, T11);
        } else {
            self.e.div(sz, T11);
        }
        self.mov_rr(sz, T11, if rem { RDX } else { RAX });
        self.e.bind(done);
        if d != RAX {
            self.mov_rr(Sz::B64, RAX, T10);
        }
        if d != RDX {
            self.mov_rr(Sz::B64, RDX, T9);
        }
        self.mov_rr(sz, d, T11);
    }

    /// A division's fix-up ([`DivFix`]): r11 = the eBPF result, then back to the division's
    /// end.
    pub(super) fn div_fix(&mut self, fix: DivFix) {
        match fix {
            DivFix::Zero { at, back, sz, rem } => {
                self.e.bind(at);
                if rem {
                    self.mov_rr(sz, T11, RAX);
                } else {
                    self.xor_zero(T11);
                }
                self.e.jump(None, back);
            }
            DivFix::Minus1 { at, back, sz, rem } => {
                self.e.bind(at);
                if rem {
                    self.xor_zero(T11);
                } else {
                    self.e.neg(sz, RAX);
                    self.mov_rr(sz, T11, RAX);
                }
                self.e.jump(None, back);
            }
        }
    }
}

impl<'a> AluHooks<'a> for Codegen<'a> {
    #[inline(always)]
    fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let sz = sz_of(width);
        let d = host(dst);
        let reg = host;
        match op {
            AluOp::Mov => match src {
                Operand::Reg(s) => self.mov_rr(sz, d, reg(s)),
                Operand::Imm(i) if sz == Sz::B32 => self.mov_ri(d, i as u32 as i64),
                Operand::Imm(i) => self.mov_ri(d, i as i64),
            },
            AluOp::Add | AluOp::Sub | AluOp::And | AluOp::Or | AluOp::Xor => {
                let op = match op {
                    AluOp::Add => Arith::Add,
                    AluOp::Or => Arith::Or,
                    AluOp::And => Arith::And,
                    AluOp::Sub => Arith::Sub,
                    _ => Arith::Xor,
                };
                match src {
                    Operand::Reg(s) => self.e.arith_rr(op, sz, d, reg(s)),
                    Operand::Imm(i) => self.e.arith_ri(op, sz, d, i as i64),
                }
            }
            AluOp::Mul => match src {
                Operand::Reg(s) => self.e.imul_rr(sz, d, reg(s)),
                Operand::Imm(i) => self.e.imul_rri(sz, d, d, i),
            },
            AluOp::Div | AluOp::Mod | AluOp::Sdiv | AluOp::Smod => {
                let src = match src {
                    Operand::Reg(s) => Operand::Reg(reg(s)),
                    i => i,
                };
                self.div(sz, op, d, src)
            }
            AluOp::Lsh | AluOp::Rsh | AluOp::Arsh => {
                let op = match op {
                    AluOp::Lsh => Shift::Shl,
                    AluOp::Rsh => Shift::Shr,
                    _ => Shift::Sar,
                };
                self.shift(op, sz, d, src.map_reg(reg))
            }
        }
    }

    fn movsx(&mut self, width: Width, dst: Reg, src: Reg, bits: u8) -> Result<(), CompileError> {
        let (d, s) = (host(dst), host(src));
        let sz = sz_of(width);
        match bits {
            8 => self.e.movsx8(sz, d, s),
            16 => self.e.movsx16(sz, d, s),
            _ if sz == Sz::B64 => self.e.movsxd(d, s),
            _ => self.mov_rr(Sz::B32, d, s),
        }
        Ok(())
    }

    fn neg(&mut self, width: Width, dst: Reg) {
        self.e.neg(sz_of(width), host(dst));
    }

    fn byte_order(&mut self, kind: EndKind, bits: u8, dst: Reg) {
        let d = host(dst);
        match (kind, bits) {
            (EndKind::ToLe, 16) => self.e.movzx16(d, d),
            (EndKind::ToLe, 32) => self.mov_rr(Sz::B32, d, d),
            (EndKind::ToLe, _) => {}
            (_, 16) => {
                // rol r16, 8 swaps the two low bytes; movzx clears the rest.
                self.e.shift_ri(Shift::Rol, Sz::B16, d, 8);
                self.e.movzx16(d, d);
            }
            (_, 32) => self.e.bswap(Sz::B32, d),
            _ => self.e.bswap(Sz::B64, d),
        }
    }

    fn load_imm64(&mut self, dst: Reg, imm: u64) {
        self.mov_ri(host(dst), imm as i64);
    }

    fn scaled_add(&mut self, dst: Reg, base: Reg, index: Reg, shift: u8) {
        self.e.lea_index(host(dst), host(base), host(index), shift);
    }

    /// `cmp index, max ; lea dst, [dst + index << shift] ; cmovae dst, [rip + zero]`:
    /// `cmov` is not predicted (it waits for the compare's flags), so no mispredicted path
    /// sees an element past the end. Its source is a zero word after the code, since x86
    /// has no `cmov` from an immediate.
    fn select_element(
        &mut self,
        dst: Reg,
        index: Reg,
        max: Operand,
        shift: u8,
        _past_end: Label,
    ) -> PastEnd {
        let (d, i) = (host(dst), host(index));
        // `lea` scales by at most 8: shift the rest on a copy, before the compare (a shift
        // writes the flags).
        let (scaled, scale) = if shift > 3 {
            self.mov_rr(Sz::B64, T10, i);
            self.e.shift_ri(Shift::Shl, Sz::B64, T10, shift - 3);
            (T10, 3)
        } else {
            (i, shift)
        };
        match max {
            Operand::Imm(m) => self.e.cmp_ri(Sz::B64, i, i64::from(m)),
            Operand::Reg(r) => self.e.cmp_rr(Sz::B64, i, host(r)),
        }
        self.e.lea_index(d, d, scaled, scale);
        let zero = match self.zero_word {
            Some(l) => l,
            None => *self.zero_word.insert(self.e.label()),
        };
        self.e.cmov_rip(Cc::Ae, d, zero);
        PastEnd::Selected
    }
}
