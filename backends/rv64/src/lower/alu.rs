//! ALU operations, division and remainder, byte swaps.

use super::POOL_MIN_LI;
use super::{Codegen, Upper};
use crate::encode::Assembler;
use crate::encode::{fits_signed, reg::*, Br, R3, RI};
use dynasmrt::DynamicLabel;
use packjit_frontend::analysis::upper_halves_live;
use packjit_frontend::lower::{AluHooks, Expansion, PastEnd};
use packjit_frontend::{AluOp, EndKind, Operand, Reg, Width};
use packjit_plugin_api::CompileError;
use Width::{W32, W64};

impl Codegen<'_> {
    /// `rd = base + (index << shift)` for any shift (`scaled_add` takes up to 3), through
    /// t1, never t0.
    fn shifted_add(&mut self, rd: u8, base: u8, index: u8, shift: u8) {
        if shift <= 3 {
            self.e.scaled_add(rd, base, index, shift, T1);
        } else {
            self.e.ri(RI::Slli, T1, index, i32::from(shift));
            self.e.rrr(R3::Add, rd, base, T1);
        }
    }

    fn alu(&mut self, width: Width, op: AluOp, d: u8, src: Operand, upper: Upper) {
        // Every 32-bit form below reads only bits 31:0 of its inputs (the `*w` instructions,
        // and/or/xor, whose low half depends on low halves only, `slli 32` tests): inputs
        // whose upper half was left unread hold anything there.
        let zext = width == W32 && upper == Upper::Zero;
        match op {
            AluOp::Mov => {
                match (src, width) {
                    (Operand::Reg(s), W64) => self.e.mv(d, self.map(s)),
                    (Operand::Reg(s), W32) if zext => self.e.zext32(d, self.map(s)),
                    (Operand::Reg(s), W32) => self.e.mv(d, self.map(s)),
                    (Operand::Imm(imm), W64) => self.e.li(d, imm as i64),
                    (Operand::Imm(imm), W32) if zext => self.e.li(d, imm as u32 as i64),
                    // Sign-extended is as good and often shorter (-1 is one `li`).
                    (Operand::Imm(imm), W32) => self.e.li(d, imm as i64),
                }
                return;
            }
            AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => {
                self.divmod(width, op, d, src, upper);
                return;
            }
            _ => {}
        }
        // Immediate fast paths that avoid materialising the constant.
        if let Operand::Imm(imm) = src {
            let imm64 = imm as i64;
            let (ri, val) = match op {
                AluOp::Add => (Some(if width == W32 { RI::Addiw } else { RI::Addi }), imm64),
                AluOp::Sub => (
                    Some(if width == W32 { RI::Addiw } else { RI::Addi }),
                    -imm64,
                ),
                AluOp::And => (Some(RI::Andi), imm64),
                AluOp::Or => (Some(RI::Ori), imm64),
                AluOp::Xor => (Some(RI::Xori), imm64),
                AluOp::Lsh => (Some(if width == W32 { RI::Slliw } else { RI::Slli }), imm64),
                AluOp::Rsh => (Some(if width == W32 { RI::Srliw } else { RI::Srli }), imm64),
                AluOp::Arsh => (Some(if width == W32 { RI::Sraiw } else { RI::Srai }), imm64),
                _ => (None, 0),
            };
            if let Some(ri) = ri {
                let is_shift = matches!(op, AluOp::Lsh | AluOp::Rsh | AluOp::Arsh);
                if is_shift {
                    // Shift counts are masked to the operand width (RFC 9669).
                    let sh = (imm as u32 & if width == W32 { 31 } else { 63 }) as i32;
                    self.e.ri(ri, d, d, sh);
                    // srliw by a non-zero amount already leaves bits 63:32 clear.
                    if zext && !(op == AluOp::Rsh && sh != 0) {
                        self.e.zext32(d, d);
                    }
                    return;
                }
                if fits_signed(val, 12) {
                    self.e.ri(ri, d, d, val as i32);
                    // andi with a non-negative mask already clears bits 63:32.
                    if zext && !(op == AluOp::And && val >= 0) {
                        self.e.zext32(d, d);
                    }
                    return;
                }
            }
        }
        let s = match src {
            Operand::Reg(r) => self.map(r),
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
        };
        let r3 = match (op, width) {
            (AluOp::Add, W64) => R3::Add,
            (AluOp::Add, W32) => R3::Addw,
            (AluOp::Sub, W64) => R3::Sub,
            (AluOp::Sub, W32) => R3::Subw,
            (AluOp::Mul, W64) => R3::Mul,
            (AluOp::Mul, W32) => R3::Mulw,
            (AluOp::And, _) => R3::And,
            (AluOp::Or, _) => R3::Or,
            (AluOp::Xor, _) => R3::Xor,
            // The hardware uses the low 6 (5 for *w) bits of the count: exactly BPF's mask.
            (AluOp::Lsh, W64) => R3::Sll,
            (AluOp::Lsh, W32) => R3::Sllw,
            (AluOp::Rsh, W64) => R3::Srl,
            (AluOp::Rsh, W32) => R3::Srlw,
            (AluOp::Arsh, W64) => R3::Sra,
            (AluOp::Arsh, W32) => R3::Sraw,
            _ => unreachable!("mov and div/mod handled above"),
        };
        self.e.rrr(r3, d, d, s);
        if zext {
            self.e.zext32(d, d);
        }
    }

    fn divmod(&mut self, width: Width, op: AluOp, d: u8, src: Operand, upper: Upper) {
        let zext = width == W32 && upper == Upper::Zero;
        let is_div = matches!(op, AluOp::Div | AluOp::Sdiv);
        let r3 = match (op, width) {
            (AluOp::Div, W64) => R3::Divu,
            (AluOp::Div, W32) => R3::Divuw,
            (AluOp::Sdiv, W64) => R3::Div,
            (AluOp::Sdiv, W32) => R3::Divw,
            (AluOp::Mod, W64) => R3::Remu,
            (AluOp::Mod, W32) => R3::Remuw,
            (AluOp::Smod, W64) => R3::Rem,
            _ => R3::Remw,
        };
        match src {
            Operand::Imm(0) => {
                // x / 0 = 0; x % 0 = x (truncated to 32 bits for ALU32).
                if is_div {
                    self.e.li(d, 0);
                } else if zext {
                    self.e.zext32(d, d);
                }
            }
            Operand::Imm(imm) => {
                // Unsigned ops see the immediate sign-extended to 64 bits (ALU64) or as
                // a u32 (ALU32); powers of two become shifts and masks.
                let unsigned = matches!(op, AluOp::Div | AluOp::Mod);
                let divisor: u64 = if width == W32 {
                    imm as u32 as u64
                } else {
                    imm as i64 as u64
                };
                if unsigned && divisor.is_power_of_two() {
                    let k = divisor.trailing_zeros() as i32;
                    if is_div {
                        if k == 0 {
                            if zext {
                                self.e.zext32(d, d);
                            }
                        } else if width == W32 {
                            // srliw by k > 0 zero-fills bits 63:32.
                            self.e.ri(RI::Srliw, d, d, k);
                        } else {
                            self.e.ri(RI::Srli, d, d, k);
                        }
                    } else if k == 0 {
                        self.e.li(d, 0);
                    } else if k < 11 {
                        self.e.ri(RI::Andi, d, d, (1 << k) - 1);
                    } else {
                        // Keep the low k bits (k ≤ 31 for ALU32, so bits 63:32 end clear).
                        self.e.ri(RI::Slli, d, d, 64 - k);
                        self.e.ri(RI::Srli, d, d, 64 - k);
                    }
                    return;
                }
                // A non-zero divisor: no guard needed; MIN / -1 does not trap on RISC-V.
                self.e.li(T1, imm as i64);
                self.e.rrr(r3, d, d, T1);
                if zext {
                    self.e.zext32(d, d);
                }
            }
            Operand::Reg(s) => {
                let s = self.map(s);
                if is_div {
                    // RISC-V returns all-ones for x / 0; BPF wants 0. Branch-free:
                    // mask = (divisor == 0) - 1, computed before d (which may be s) changes.
                    if width == W32 {
                        self.e.ri(RI::Slli, T1, s, 32);
                        self.e.seqz(T1, T1);
                    } else {
                        self.e.seqz(T1, s);
                    }
                    self.e.rrr(r3, d, d, s);
                    self.e.ri(RI::Addi, T1, T1, -1);
                    self.e.rrr(R3::And, d, d, T1);
                } else {
                    // rem/remu already return the dividend for a zero divisor, and 0 for
                    // MIN % -1: exactly BPF's semantics.
                    self.e.rrr(r3, d, d, s);
                }
                if zext {
                    self.e.zext32(d, d);
                }
            }
        }
    }
}

impl<'a> AluHooks<'a> for Codegen<'a> {
    /// `dst <op>= src`: a 32-bit result is zero-extended only where
    /// something reads its upper half.
    fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let i = self.d.cur;
        // (The analysis runs at the first 32-bit operation, if any.)
        let upper = match width {
            W64 => Upper::Zero,
            // A driver's expansion reads its own results within the instruction, where the
            // liveness (of the program's instructions) does not look.
            W32 if self.d.expansion != Expansion::None => Upper::Zero,
            W32 => {
                let prog = self.d.prog;
                let live = self
                    .layout
                    .upper_live
                    .get_or_init(|| upper_halves_live(prog));
                if live[i + 1] & (1 << dst) != 0 {
                    Upper::Zero
                } else {
                    Upper::Unread
                }
            }
        };
        self.alu(width, op, self.map(dst), src, upper)
    }

    fn movsx(&mut self, width: Width, dst: Reg, src: Reg, bits: u8) -> Result<(), CompileError> {
        let (d, s) = (self.map(dst), self.map(src));
        self.e.sext(d, s, bits);
        if width == W32 {
            self.e.zext32(d, d);
        }
        Ok(())
    }

    fn neg(&mut self, width: Width, dst: Reg) {
        let d = self.map(dst);
        self.e.neg(width, d, d);
        if width == W32 {
            self.e.zext32(d, d);
        }
    }

    fn byte_order(&mut self, kind: EndKind, bits: u8, dst: Reg) {
        let d = self.map(dst);
        if kind == EndKind::ToLe {
            // Little-endian target: truncate to `bits`, zero-extended.
            match bits {
                16 => self.e.zext16(d, d),
                32 => self.e.zext32(d, d),
                _ => {}
            }
            return;
        }
        if self.plan.zbb {
            self.e.rev8(d, d);
            if bits < 64 {
                self.e.ri(RI::Srli, d, d, 64 - bits as i32);
            }
            return;
        }
        // Baseline: assemble the swapped value byte by byte in t1:
        // byte i of d goes to byte (n-1-i) of the result. Only the low n bytes of d are
        // read, so the result is already zero-extended.
        let n = bits as i32 / 8;
        for i in 0..n {
            let src = if i == 0 {
                d
            } else {
                self.e.ri(RI::Srli, T0, d, 8 * i);
                T0
            };
            let top_of_64 = i == 7; // srli by 56 leaves exactly one byte
            let dst = if i == 0 { T1 } else { T0 };
            if !top_of_64 {
                self.e.ri(RI::Andi, dst, src, 0xff);
            }
            let sh = 8 * (n - 1 - i);
            if sh != 0 {
                self.e.ri(RI::Slli, dst, dst, sh);
            }
            if i != 0 {
                self.e.rrr(R3::Or, T1, T1, T0);
            }
        }
        self.e.mv(d, T1);
    }
    fn scaled_add(&mut self, dst: Reg, base: Reg, index: Reg, shift: u8) {
        let (d, b, i) = (self.map(dst), self.map(base), self.map(index));
        self.e.scaled_add(d, b, i, shift, T0);
    }

    /// RV64 has no conditional move (Zicond is not assumed), so a power-of-two bound the
    /// `andi` immediate holds is tested by the mask itself: `t0 = index & (max - 1)` equals
    /// the index exactly when it is below `max`, and the address is formed from `t0`,
    /// inside the array on every path. Other bounds select without a branch: `t0 =
    /// -(index < max)` (all ones or zero), `dst = (dst + index << shift) & t0`.
    fn select_element(
        &mut self,
        dst: Reg,
        index: Reg,
        max: Operand,
        shift: u8,
        past_end: DynamicLabel,
    ) -> PastEnd {
        let (d, i) = (self.map(dst), self.map(index));
        match max {
            Operand::Imm(m) if (1..=2048).contains(&m) && (m as u32).is_power_of_two() => {
                self.e.ri(RI::Andi, T0, i, m - 1);
                self.cold_branch(Br::Ne, T0, i, past_end);
                self.shifted_add(d, d, T0, shift);
                PastEnd::Branched
            }
            _ => {
                match max {
                    Operand::Imm(m) if m < 2048 => self.e.ri(RI::Sltiu, T0, i, m),
                    Operand::Imm(m) => {
                        self.e.li(T1, i64::from(m));
                        self.e.rrr(R3::Sltu, T0, i, T1);
                    }
                    Operand::Reg(r) => self.e.rrr(R3::Sltu, T0, i, self.map(r)),
                }
                self.e.neg(W64, T0, T0);
                self.shifted_add(d, d, i, shift);
                self.e.rrr(R3::And, d, d, T0);
                PastEnd::Selected
            }
        }
    }

    /// `dst = imm`, the 64-bit constant of an `lddw`: from the constant pool when `li` would
    /// take more than [`POOL_MIN_LI`] instructions (`auipc` + `ld`: two, whatever the value).
    fn load_imm64(&mut self, dst: Reg, imm: u64) {
        let rd = self.map(dst);
        if Assembler::li_len(imm as i64) <= POOL_MIN_LI {
            self.e.li(rd, imm as i64);
            return;
        }
        let l = match self.pooled.get(&imm) {
            Some(&l) => l,
            None => {
                let l = self.e.new_label();
                self.pool.push((imm, l));
                self.pooled.insert(imm, l);
                l
            }
        };
        self.e.ld_label(rd, l);
    }
}
