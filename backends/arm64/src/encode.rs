//! Instruction forms and encoders: immediates (ADD/SUB imm12, bitmask, MOVZ/MOVN/MOVK),
//! register ALU forms, compares, and the branch forms with their reach. Branch relaxation
//! lives here too: every branch to a far label is recorded as a [`Site`] and re-emitted in
//! its long form when a pass finds it out of reach.

use dynasmrt::aarch64::{
    encode_logical_immediate_32bit, encode_logical_immediate_64bit, Aarch64Relocation,
};
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use packjit_frontend::relax::BranchCheck;
use packjit_frontend::{AluOp, Cond, Width, Width::W32, Width::W64};
use packjit_plugin_api::{CompileError, ErrorKind};

use crate::lower::Codegen;
use crate::regs::*;

pub(crate) type Asm = VecAssembler<Aarch64Relocation>;

/// B.cond / CBZ / CBNZ: signed 19-bit word offset, ±1 MiB.
const COND_RANGE: i64 = 1 << 20;
/// TBZ / TBNZ: signed 14-bit word offset, ±32 KiB.
const TEST_RANGE: i64 = 1 << 15;
/// B / BL: signed 26-bit word offset, ±128 MiB.
const JUMP_RANGE: i64 = 1 << 27;
/// The most hot code between cold islands (see `ColdPlacement`): an island then holds the
/// cold sides of at most 128 KiB of hot code (a few times that in bytes at the very most),
/// so the B.cond from the hot path to them stays well inside its ±1 MiB.
pub(crate) const ISLAND_SPAN: usize = 128 << 10;

/// Growth of one conditional branch going long: B.cond (4 bytes) becomes the inverted
/// B.cond and a B (8 bytes).
pub(crate) const LONG_FORM_GROWTH: isize = 4;
/// Relaxation passes before failing branches go straight to the long form (with two forms
/// that is the first growth anyway).
pub(crate) const GENTLE_PASSES: usize = 0;

/// Forms of a conditional branch, shortest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Form {
    /// B.cond / CBZ / TBZ straight to the target.
    Short,
    /// The inverted test around a B (±128 MiB).
    Long,
}

/// Kinds of PC-relative branch recorded for the range check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// B.cond, CBZ, CBNZ.
    Cond,
    /// TBZ, TBNZ.
    Test,
    /// B, BL.
    Jump,
}

impl Reach {
    pub(crate) fn range(self) -> i64 {
        match self {
            Reach::Cond => COND_RANGE,
            Reach::Test => TEST_RANGE,
            Reach::Jump => JUMP_RANGE,
        }
    }
}

/// A branch to a far label, checked after each pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Site {
    /// eBPF instruction index the branch belongs to.
    inst: u32,
    /// The conditional site number (emission order) of a short B.cond/CBZ/TBZ; `None` for
    /// B/BL, which have one form.
    pub(crate) cond: Option<u32>,
    /// Byte offset of the branch instruction.
    at: u32,
    target: DynamicLabel,
    reach: Reach,
}
// 32-bit fields: a program has at most 1 M instructions and a few hundred MB of code at the
// very most (B/BL refuse anything past 128 MiB anyway), and a 1 M-instruction program has
// hundreds of thousands of sites: 32 bytes each instead of 48.

/// AArch64 condition codes (only those eBPF needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cc {
    Eq,
    Ne,
    Hs,
    Lo,
    Hi,
    Ls,
    Ge,
    Lt,
    Gt,
    Le,
}

impl Cc {
    pub(crate) fn from_bpf(c: Cond) -> Cc {
        match c {
            Cond::Eq => Cc::Eq,
            Cond::Ne | Cond::Set => Cc::Ne,
            Cond::Gt => Cc::Hi,
            Cond::Ge => Cc::Hs,
            Cond::Lt => Cc::Lo,
            Cond::Le => Cc::Ls,
            Cond::Sgt => Cc::Gt,
            Cond::Sge => Cc::Ge,
            Cond::Slt => Cc::Lt,
            Cond::Sle => Cc::Le,
        }
    }

    pub(crate) fn invert(self) -> Cc {
        match self {
            Cc::Eq => Cc::Ne,
            Cc::Ne => Cc::Eq,
            Cc::Hs => Cc::Lo,
            Cc::Lo => Cc::Hs,
            Cc::Hi => Cc::Ls,
            Cc::Ls => Cc::Hi,
            Cc::Ge => Cc::Lt,
            Cc::Lt => Cc::Ge,
            Cc::Gt => Cc::Le,
            Cc::Le => Cc::Gt,
        }
    }
}

/// How a conditional jump tests its operands.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Test {
    /// Flags were set by CMP/CMN/TST; branch on the condition.
    Flags(Cc),
    /// CBZ (`zero`) or CBNZ on the register.
    Zero { reg: u8, width: Width, zero: bool },
    /// TBZ (`set == false`) or TBNZ on one bit.
    Bit { reg: u8, bit: u32, set: bool },
}

/// ADD/SUB/CMP immediates: 12 bits, optionally shifted left by 12; `(imm12, shifted)`.
pub(crate) fn fits_imm12(v: i64) -> Option<(u32, bool)> {
    // ADD/SUB/CMP immediates: 12 bits, optionally shifted left by 12.
    if (0..4096).contains(&v) {
        Some((v as u32, false))
    } else if v & 0xfff == 0 && (0..4096).contains(&(v >> 12)) {
        Some(((v >> 12) as u32, true))
    } else {
        None
    }
}

/// Is `v` an AND/ORR/EOR/TST bitmask immediate at `width`?
pub(crate) fn logical_ok(v: u64, width: Width) -> bool {
    if width == W64 {
        encode_logical_immediate_64bit(v).is_some()
    } else {
        encode_logical_immediate_32bit(v as u32).is_some()
    }
}

impl Codegen<'_> {
    /// After a pass: the displacement of every conditional branch site for the relaxation
    /// driver, or none at all when every site reaches in the form it was emitted in (the
    /// usual case, in which the relaxation driver would settle on this pass anyway). B/BL
    /// out of ±128 MiB is an error here: they have no longer form.
    pub(crate) fn branch_checks(&self) -> Result<Vec<BranchCheck<Form>>, CompileError> {
        let labels = self.ops.labels();
        let at = |l: DynamicLabel| -> Result<i64, CompileError> {
            labels.resolve_dynamic(l).map(|o| o.0 as i64).map_err(|e| {
                CompileError::new(ErrorKind::Internal, format!("unresolved arm64 label: {e}"))
            })
        };
        let mut all_reach = true;
        for s in &self.sites {
            let range = s.reach.range();
            if !(-range..range).contains(&(at(s.target)? - s.at as i64)) {
                all_reach = false;
                break;
            }
        }
        if all_reach {
            return Ok(Vec::new());
        }
        let mut checks = Vec::with_capacity(self.cond_sites);
        for s in &self.sites {
            let dist = at(s.target)? - s.at as i64;
            let range = s.reach.range();
            match s.cond {
                Some(site) => checks.push(BranchCheck {
                    site: site as usize,
                    at: s.at as usize,
                    disp: dist as isize,
                    range: (-range as isize, range as isize - 1),
                    grow: Form::Long,
                }),
                None if !(-range..range).contains(&dist) => {
                    return Err(CompileError::at(
                        self.d.prog.insts[s.inst as usize].pc as usize,
                        ErrorKind::Encoding,
                        format!(
                            "branch spans {dist} bytes of arm64 code, beyond the ±128 MiB reach of B/BL"
                        ),
                    ))
                }
                None => {}
            }
        }
        Ok(checks)
    }

    /// `rd = value` in the fewest instructions: one ORR for a bitmask immediate, else MOVZ
    /// or MOVN (whichever leaves fewer halfwords to patch) plus one MOVK per remaining
    /// halfword. 32-bit forms write W, which zero-extends.
    pub(crate) fn mov_imm(&mut self, rd: u8, value: u64, width: Width) {
        let n = if width == W64 { 4 } else { 2 };
        let value = if width == W64 {
            value
        } else {
            value & 0xffff_ffff
        };
        let hw = |i: u32| ((value >> (16 * i)) & 0xffff) as u32;
        let zeros = (0..n).filter(|&i| hw(i) == 0).count();
        let ones = (0..n).filter(|&i| hw(i) == 0xffff).count();
        let need_movz = (n as usize - zeros).max(1);
        let need_movn = (n as usize - ones).max(1);
        if need_movz.min(need_movn) > 1 && logical_ok(value, width) {
            if width == W64 {
                a64!(self.ops; orr XSP(rd), xzr, value);
            } else {
                a64!(self.ops; orr WSP(rd), wzr, value as u32);
            }
            return;
        }
        let inverted = need_movn < need_movz;
        let skip = if inverted { 0xffff } else { 0 };
        let mut first = true;
        for i in 0..n {
            let h = hw(i);
            let sh = 16 * i;
            if first {
                // The first instruction sets every halfword: pick the lowest one that
                // differs from the fill pattern (or halfword 0 if none does).
                if h == skip && i != n - 1 && (i + 1..n).any(|j| hw(j) != skip) {
                    continue;
                }
                first = false;
                match (inverted, width) {
                    (false, W64) => a64!(self.ops; movz X(rd), h, lsl sh),
                    (false, W32) => a64!(self.ops; movz W(rd), h, lsl sh),
                    (true, W64) => a64!(self.ops; movn X(rd), !h & 0xffff, lsl sh),
                    (true, W32) => a64!(self.ops; movn W(rd), !h & 0xffff, lsl sh),
                }
            } else if h != skip {
                if width == W64 {
                    a64!(self.ops; movk X(rd), h, lsl sh);
                } else {
                    a64!(self.ops; movk W(rd), h, lsl sh);
                }
            }
        }
    }

    /// 32-bit zero-extension of `rd` in place (what a W-register write would have done).
    pub(crate) fn zext32(&mut self, rd: u8) {
        a64!(self.ops; mov W(rd), W(rd));
    }

    pub(crate) fn mov_reg(&mut self, rd: u8, rs: u8, width: Width) {
        if width == W64 {
            if rd != rs {
                a64!(self.ops; mov X(rd), X(rs));
            }
        } else {
            a64!(self.ops; mov W(rd), W(rs));
        }
    }

    /// `rd = rn + v` (v already reduced to the operation's width semantics).
    pub(crate) fn add_imm(&mut self, rd: u8, rn: u8, v: i64, width: Width) {
        if v == 0 {
            self.mov_reg(rd, rn, width);
        } else if let Some((imm, sh)) = fits_imm12(v) {
            match (width, sh) {
                (W64, false) => a64!(self.ops; add XSP(rd), XSP(rn), imm),
                (W64, true) => a64!(self.ops; add XSP(rd), XSP(rn), imm, lsl 12),
                (W32, false) => a64!(self.ops; add WSP(rd), WSP(rn), imm),
                (W32, true) => a64!(self.ops; add WSP(rd), WSP(rn), imm, lsl 12),
            }
        } else if let Some((imm, sh)) = fits_imm12(v.wrapping_neg()) {
            match (width, sh) {
                (W64, false) => a64!(self.ops; sub XSP(rd), XSP(rn), imm),
                (W64, true) => a64!(self.ops; sub XSP(rd), XSP(rn), imm, lsl 12),
                (W32, false) => a64!(self.ops; sub WSP(rd), WSP(rn), imm),
                (W32, true) => a64!(self.ops; sub WSP(rd), WSP(rn), imm, lsl 12),
            }
        } else {
            self.mov_imm(T1, v as u64, width);
            self.alu_rrr(AluOp::Add, width, rd, rn, T1);
        }
    }

    /// `rd = rn op rm` for the register forms.
    pub(crate) fn alu_rrr(&mut self, op: AluOp, width: Width, d: u8, n: u8, m: u8) {
        match (op, width) {
            (AluOp::Add, W64) => a64!(self.ops; add X(d), X(n), X(m)),
            (AluOp::Add, W32) => a64!(self.ops; add W(d), W(n), W(m)),
            (AluOp::Sub, W64) => a64!(self.ops; sub X(d), X(n), X(m)),
            (AluOp::Sub, W32) => a64!(self.ops; sub W(d), W(n), W(m)),
            (AluOp::Mul, W64) => a64!(self.ops; mul X(d), X(n), X(m)),
            (AluOp::Mul, W32) => a64!(self.ops; mul W(d), W(n), W(m)),
            (AluOp::Div, W64) => a64!(self.ops; udiv X(d), X(n), X(m)),
            (AluOp::Div, W32) => a64!(self.ops; udiv W(d), W(n), W(m)),
            (AluOp::Sdiv, W64) => a64!(self.ops; sdiv X(d), X(n), X(m)),
            (AluOp::Sdiv, W32) => a64!(self.ops; sdiv W(d), W(n), W(m)),
            (AluOp::Mod, W64) => {
                a64!(self.ops; udiv X(T2), X(n), X(m) ; msub X(d), X(T2), X(m), X(n))
            }
            (AluOp::Mod, W32) => {
                a64!(self.ops; udiv W(T2), W(n), W(m) ; msub W(d), W(T2), W(m), W(n))
            }
            (AluOp::Smod, W64) => {
                a64!(self.ops; sdiv X(T2), X(n), X(m) ; msub X(d), X(T2), X(m), X(n))
            }
            (AluOp::Smod, W32) => {
                a64!(self.ops; sdiv W(T2), W(n), W(m) ; msub W(d), W(T2), W(m), W(n))
            }
            (AluOp::Or, W64) => a64!(self.ops; orr X(d), X(n), X(m)),
            (AluOp::Or, W32) => a64!(self.ops; orr W(d), W(n), W(m)),
            (AluOp::And, W64) => a64!(self.ops; and X(d), X(n), X(m)),
            (AluOp::And, W32) => a64!(self.ops; and W(d), W(n), W(m)),
            (AluOp::Xor, W64) => a64!(self.ops; eor X(d), X(n), X(m)),
            (AluOp::Xor, W32) => a64!(self.ops; eor W(d), W(n), W(m)),
            (AluOp::Lsh, W64) => a64!(self.ops; lslv X(d), X(n), X(m)),
            (AluOp::Lsh, W32) => a64!(self.ops; lslv W(d), W(n), W(m)),
            (AluOp::Rsh, W64) => a64!(self.ops; lsrv X(d), X(n), X(m)),
            (AluOp::Rsh, W32) => a64!(self.ops; lsrv W(d), W(n), W(m)),
            (AluOp::Arsh, W64) => a64!(self.ops; asrv X(d), X(n), X(m)),
            (AluOp::Arsh, W32) => a64!(self.ops; asrv W(d), W(n), W(m)),
            (AluOp::Mov, _) => self.mov_reg(d, m, width),
        }
    }

    /// Records a branch to a far label for the range check.
    pub(crate) fn site(&mut self, target: DynamicLabel, reach: Reach) {
        self.site_with_form(target, reach, None);
    }

    fn site_with_form(&mut self, target: DynamicLabel, reach: Reach, cond: Option<usize>) {
        let at = self.off();
        self.sites.push(Site {
            inst: self.d.cur as u32,
            cond: cond.map(|c| c as u32),
            at: at as u32,
            target,
            reach,
        });
    }

    pub(crate) fn b(&mut self, target: DynamicLabel) {
        self.site(target, Reach::Jump);
        a64!(self.ops; b =>target);
    }

    pub(crate) fn b_cond(&mut self, cc: Cc, l: DynamicLabel) {
        match cc {
            Cc::Eq => a64!(self.ops; b.eq =>l),
            Cc::Ne => a64!(self.ops; b.ne =>l),
            Cc::Hs => a64!(self.ops; b.hs =>l),
            Cc::Lo => a64!(self.ops; b.lo =>l),
            Cc::Hi => a64!(self.ops; b.hi =>l),
            Cc::Ls => a64!(self.ops; b.ls =>l),
            Cc::Ge => a64!(self.ops; b.ge =>l),
            Cc::Lt => a64!(self.ops; b.lt =>l),
            Cc::Gt => a64!(self.ops; b.gt =>l),
            Cc::Le => a64!(self.ops; b.le =>l),
        }
    }

    /// Emits the branch for `test` to `target`: short form, or when the previous pass found
    /// it out of reach, the inverted test around an unconditional B (±128 MiB).
    pub(crate) fn branch_if(&mut self, test: Test, target: DynamicLabel) {
        let site = self.cond_sites;
        self.cond_sites += 1;
        if self.forms.get(site) == Some(&Form::Long) {
            let skip = self.ops.new_dynamic_label();
            self.emit_test(invert(test), skip);
            self.b(target);
            a64!(self.ops; =>skip);
        } else {
            let reach = if matches!(test, Test::Bit { .. }) {
                Reach::Test
            } else {
                Reach::Cond
            };
            self.site_with_form(target, reach, Some(site));
            self.emit_test(test, target);
        }
    }

    pub(crate) fn emit_test(&mut self, test: Test, l: DynamicLabel) {
        match test {
            Test::Flags(cc) => self.b_cond(cc, l),
            Test::Zero {
                reg,
                width: W64,
                zero: true,
            } => a64!(self.ops; cbz X(reg), =>l),
            Test::Zero {
                reg,
                width: W64,
                zero: false,
            } => a64!(self.ops; cbnz X(reg), =>l),
            Test::Zero {
                reg,
                width: W32,
                zero: true,
            } => a64!(self.ops; cbz W(reg), =>l),
            Test::Zero {
                reg,
                width: W32,
                zero: false,
            } => a64!(self.ops; cbnz W(reg), =>l),
            Test::Bit {
                reg,
                bit,
                set: true,
            } => a64!(self.ops; tbnz X(reg), bit, =>l),
            Test::Bit {
                reg,
                bit,
                set: false,
            } => a64!(self.ops; tbz X(reg), bit, =>l),
        }
    }

    /// `rd = base + v` where base may be sp (XSP family).
    pub(crate) fn add_imm_base(&mut self, rd: u8, base: u8, v: i64) {
        if let Some((imm, false)) = fits_imm12(v) {
            a64!(self.ops; add XSP(rd), XSP(base), imm);
        } else {
            self.mov_imm(rd, v as u64, W64);
            a64!(self.ops; add XSP(rd), XSP(base), X(rd));
        }
    }

    /// Flags from `rn - v` at `width`: CMP with an (optionally shifted) imm12, CMN with the
    /// negated one for a small negative `v`, else through a register.
    pub(crate) fn cmp_imm(&mut self, rn: u8, v: i64, width: Width) {
        if let Some((imm, sh)) = fits_imm12(v) {
            match (width, sh) {
                (W64, false) => a64!(self.ops; cmp XSP(rn), imm),
                (W64, true) => a64!(self.ops; cmp XSP(rn), imm, lsl 12),
                (W32, false) => a64!(self.ops; cmp WSP(rn), imm),
                (W32, true) => a64!(self.ops; cmp WSP(rn), imm, lsl 12),
            }
        } else if let Some((imm, sh)) = fits_imm12(v.wrapping_neg()) {
            match (width, sh) {
                (W64, false) => a64!(self.ops; cmn XSP(rn), imm),
                (W64, true) => a64!(self.ops; cmn XSP(rn), imm, lsl 12),
                (W32, false) => a64!(self.ops; cmn WSP(rn), imm),
                (W32, true) => a64!(self.ops; cmn WSP(rn), imm, lsl 12),
            }
        } else {
            self.mov_imm(T1, v as u64, width);
            if width == W64 {
                a64!(self.ops; cmp X(rn), X(T1));
            } else {
                a64!(self.ops; cmp W(rn), W(T1));
            }
        }
    }

    /// Flags from `rn - v` for a full 64-bit unsigned `v`.
    pub(crate) fn cmp_imm_u64(&mut self, rn: u8, v: u64) {
        if let Some((imm, false)) = fits_imm12(v as i64) {
            a64!(self.ops; cmp XSP(rn), imm);
        } else {
            self.mov_imm(T1, v, W64);
            a64!(self.ops; cmp X(rn), X(T1));
        }
    }
}

pub(crate) fn invert(t: Test) -> Test {
    match t {
        Test::Flags(cc) => Test::Flags(cc.invert()),
        Test::Zero { reg, width, zero } => Test::Zero {
            reg,
            width,
            zero: !zero,
        },
        Test::Bit { reg, bit, set } => Test::Bit {
            reg,
            bit,
            set: !set,
        },
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemOp {
    Load { sign_extend: bool },
    Store,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrForm {
    /// `[base, #imm]`, unsigned 12-bit offset scaled by the access size.
    Scaled,
    /// `LDUR`/`STUR`: signed 9-bit byte offset.
    Unscaled,
    /// `[base, x9]`: the offset materialised in T0.
    Index,
}
