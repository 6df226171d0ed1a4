//! ALU, byte swap and sign-extension moves.

use super::*;

impl<'a> AluHooks<'a> for Codegen<'a> {
    fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let d = self.map[dst as usize];
        let imm = match src {
            // r10 is sp + 512: one ADD, not a materialise-then-move.
            Operand::Reg(R10) if op == AluOp::Mov && width == W64 => {
                let fb = self.frame_base();
                a64!(self.ops; add XSP(d), XSP(fb), STACK_SIZE as u32);
                return;
            }
            Operand::Reg(r) => {
                let s = self.src(r, T0);
                self.alu_rrr(op, width, d, d, s);
                return;
            }
            Operand::Imm(imm) => imm,
        };
        // The immediate is sign-extended to 64 bits for ALU64; ALU works on its low 32 bits.
        let v64 = imm as i64;
        let bits = if width == W64 {
            v64 as u64
        } else {
            imm as u32 as u64
        };
        let all = if width == W64 { u64::MAX } else { 0xffff_ffff };
        match op {
            AluOp::Mov => self.mov_imm(d, bits, width),
            AluOp::Add => self.add_imm(d, d, v64, width),
            AluOp::Sub => self.add_imm(d, d, v64.wrapping_neg(), width),
            AluOp::And | AluOp::Or | AluOp::Xor => match (op, bits) {
                (AluOp::And, 0) => self.mov_imm(d, 0, width),
                (AluOp::Or, b) if b == all => self.mov_imm(d, all, width),
                (AluOp::And, b) if b == all => self.mov_reg(d, d, width),
                (AluOp::Or | AluOp::Xor, 0) => self.mov_reg(d, d, width),
                (AluOp::Xor, b) if b == all => {
                    if width == W64 {
                        a64!(self.ops; mvn X(d), X(d));
                    } else {
                        a64!(self.ops; mvn W(d), W(d));
                    }
                }
                (_, b) if logical_ok(b, width) => match (op, width) {
                    (AluOp::And, W64) => a64!(self.ops; and XSP(d), X(d), b),
                    (AluOp::And, W32) => a64!(self.ops; and WSP(d), W(d), b as u32),
                    (AluOp::Or, W64) => a64!(self.ops; orr XSP(d), X(d), b),
                    (AluOp::Or, W32) => a64!(self.ops; orr WSP(d), W(d), b as u32),
                    (AluOp::Xor, W64) => a64!(self.ops; eor XSP(d), X(d), b),
                    (_, _) => a64!(self.ops; eor WSP(d), W(d), b as u32),
                },
                (_, b) => {
                    self.mov_imm(T1, b, width);
                    self.alu_rrr(op, width, d, d, T1);
                }
            },
            AluOp::Lsh | AluOp::Rsh | AluOp::Arsh => {
                // Shift counts are masked to the width, as the register forms do.
                let sh = (imm as u32) & if width == W64 { 63 } else { 31 };
                match (op, width) {
                    _ if sh == 0 => self.mov_reg(d, d, width),
                    (AluOp::Lsh, W64) => a64!(self.ops; lsl X(d), X(d), sh),
                    (AluOp::Lsh, W32) => a64!(self.ops; lsl W(d), W(d), sh),
                    (AluOp::Rsh, W64) => a64!(self.ops; lsr X(d), X(d), sh),
                    (AluOp::Rsh, W32) => a64!(self.ops; lsr W(d), W(d), sh),
                    (_, W64) => a64!(self.ops; asr X(d), X(d), sh),
                    (_, W32) => a64!(self.ops; asr W(d), W(d), sh),
                }
            }
            AluOp::Div | AluOp::Sdiv if bits == 0 => self.mov_imm(d, 0, width),
            AluOp::Mod | AluOp::Smod if bits == 0 => self.mov_reg(d, d, width),
            AluOp::Div if bits.is_power_of_two() => {
                // Unsigned division by 2^k is a shift.
                let sh = bits.trailing_zeros();
                if width == W64 {
                    a64!(self.ops; lsr X(d), X(d), sh);
                } else {
                    a64!(self.ops; lsr W(d), W(d), sh);
                }
            }
            AluOp::Mod if bits.is_power_of_two() && logical_ok(bits - 1, width) => {
                // Unsigned remainder by 2^k keeps the low k bits.
                if width == W64 {
                    a64!(self.ops; and XSP(d), X(d), bits - 1);
                } else {
                    a64!(self.ops; and WSP(d), W(d), (bits - 1) as u32);
                }
            }
            AluOp::Mul | AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => {
                self.mov_imm(T1, bits, width);
                self.alu_rrr(op, width, d, d, T1);
            }
        }
    }

    fn movsx(&mut self, width: Width, dst: Reg, src: Reg, bits: u8) -> Result<(), CompileError> {
        let d = self.map[dst as usize];
        let s = self.src(src, T0);
        match (width, bits) {
            (W64, 8) => a64!(self.ops; sxtb X(d), W(s)),
            (W64, 16) => a64!(self.ops; sxth X(d), W(s)),
            (W64, 32) => a64!(self.ops; sxtw X(d), W(s)),
            // 32-bit movsx: sign-extend into the low half, upper half zeroed by W.
            (W32, 8) => a64!(self.ops; sxtb W(d), W(s)),
            (W32, 16) => a64!(self.ops; sxth W(d), W(s)),
            _ => {
                return Err(self.err(
                    ErrorKind::Unsupported,
                    format!("movsx from {bits} bits at {width:?}"),
                ))
            }
        }

        Ok(())
    }

    fn neg(&mut self, width: Width, dst: Reg) {
        let d = self.map[dst as usize];
        if width == W64 {
            a64!(self.ops; neg X(d), X(d));
        } else {
            a64!(self.ops; neg W(d), W(d));
        }
    }

    fn byte_order(&mut self, kind: EndKind, bits: u8, dst: Reg) {
        let d = self.map[dst as usize];
        match (kind, bits) {
            // Little-endian target: "to little-endian" only truncates.
            (EndKind::ToLe, 16) => a64!(self.ops; uxth W(d), W(d)),
            (EndKind::ToLe, 32) => self.zext32(d),
            (EndKind::ToLe, _) => {}
            (_, 16) => a64!(self.ops; rev16 W(d), W(d) ; uxth W(d), W(d)),
            (_, 32) => a64!(self.ops; rev W(d), W(d)),
            (_, _) => a64!(self.ops; rev X(d), X(d)),
        }
    }
    fn load_imm64(&mut self, dst: Reg, imm: u64) {
        self.mov_imm(self.map[dst as usize], imm, W64);
    }

    fn scaled_add(&mut self, dst: Reg, base: Reg, index: Reg, shift: u8) {
        debug_assert!(shift <= 3 && base != R10 && index != R10);
        let (d, b, i) = (
            self.map[dst as usize],
            self.map[base as usize],
            self.map[index as usize],
        );
        a64!(self.ops; add X(d), X(b), X(i), lsl shift as u32);
    }

    /// `cmp index, max ; add dst, dst, index, lsl shift ; csel dst, dst, xzr, lo`: the
    /// select is data-dependent (the kernel's and Cranelift's Spectre-v1 guard on arm64),
    /// so no mispredicted path sees an element past the end.
    fn select_element(
        &mut self,
        dst: Reg,
        index: Reg,
        max: Operand,
        shift: u8,
        _past_end: DynamicLabel,
    ) -> PastEnd {
        let (d, i) = (self.map[dst as usize], self.map[index as usize]);
        match max {
            Operand::Imm(m) => self.cmp_imm(i, i64::from(m), W64),
            Operand::Reg(r) => {
                let m = self.map[r as usize];
                a64!(self.ops; cmp X(i), X(m));
            }
        }
        a64!(self.ops
            ; add X(d), X(d), X(i), lsl shift as u32
            ; csel X(d), X(d), xzr, lo
        );
        PastEnd::Selected
    }
}
