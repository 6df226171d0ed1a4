//! Loads, stores and atomics, and the sandbox's checks of their addresses: a check group's
//! widened test and each access's own inline test (its slow path is in [`super::cold`]).

use super::{AccessSite, Codegen, ACCESS_BITS};
use crate::encode::{fits_signed, reg::*, Amo, Br, Mem, R3, RI};
use crate::frame::CTX_LIM8;
use crate::regs::{CTX_LEN, CTX_START, STACK_LEN, STACK_START};
use dynasmrt::DynamicLabel;
use packjit_frontend::lower::{AccessLowering, Cold};
use packjit_frontend::lower::{Lowering, MemoryHooks};
use packjit_frontend::ranges::AccessCheck;
use packjit_frontend::{AtomicOp, Op, Operand, Reg, Size, Width};
use packjit_plugin_api::abi::PJ_ACCESS_WRITE;
use packjit_plugin_api::CompileError;
use Width::{W32, W64};

impl Codegen<'_> {
    /// The address operand of a load or store: checked (t0, 0) when the access needs its
    /// own check ([`packjit_frontend::lower::Driver::access`]), else `base + off` directly.
    fn mem_operand(&mut self, base: Reg, off: i16, size: Size, write: bool) -> (u8, i32) {
        match self.d.access(base, off, size) {
            AccessLowering::Checked(check) => {
                let operand =
                    self.check_access(check, self.map(base), off, size.bytes(), write, false);
                self.mask_reentered_base(base);
                operand
            }
            AccessLowering::IndexBounded {
                base,
                off,
                index,
                end,
                ..
            } => self.index_bounded(self.map(base), off, self.map(index), end, false),
            AccessLowering::Direct { base, off } => self.address(self.map(base), off, T0),
        }
    }

    /// In a re-entered group's checked copy: the base itself masked with the member's
    /// verdict (t3 = all ones inside, 0 under a mispredicted check), so a jump that skips
    /// the group's check later never sees an unchecked base, also under misspeculation.
    fn mask_reentered_base(&mut self, base: Reg) {
        if self.d.clamps_reentered_base() {
            self.e.rrr(R3::And, self.map(base), self.map(base), T3);
        }
    }

    /// The operand of an access whose index every architectural path bounds
    /// ([`AccessLowering::IndexBounded`]): `base + off` with the base masked by the verdict of
    /// `index + end <= ctx_len`, re-tested branch-free against the entry's copy of the length
    /// (s8), so an index only a mispredicted branch brings makes the access go to `0 + off`
    /// (as in [`Self::check_access`]). No branch, no out-of-line side.
    ///
    /// ```text
    ///   sltu  t3, xi, s8           ; index < len
    ///   sub   t2, s8, xi           ; end > 1: len - index (exact when index < len)
    ///   sltiu t2, t2, end          ;   1 iff fewer than end bytes remain
    ///   addi  t2, t2, -1           ;   all ones when they do
    ///   neg   t3, t3               ; all ones inside
    ///   and   t3, t3, t2           ; end > 1
    ///   and   t0, base, t3
    /// ```
    fn index_bounded(&mut self, base: u8, off: i16, index: u8, end: u16, bare: bool) -> (u8, i32) {
        self.e.rrr(R3::Sltu, T3, index, CTX_LEN);
        self.e.rrr(R3::Sub, T3, ZERO, T3);
        if end > 1 {
            self.e.rrr(R3::Sub, T2, CTX_LEN, index);
            if end < 2048 {
                self.e.ri(RI::Sltiu, T2, T2, end as i32);
            } else {
                self.e.li(T1, end as i64);
                self.e.rrr(R3::Sltu, T2, T2, T1);
            }
            self.e.ri(RI::Addi, T2, T2, -1);
            self.e.rrr(R3::And, T3, T3, T2);
        }
        if !bare && fits_signed(off as i64, 12) {
            self.e.rrr(R3::And, T0, base, T3);
            (T0, off as i32)
        } else {
            self.add_imm(T0, base, off as i64, T0);
            self.e.rrr(R3::And, T0, T0, T3);
            (T0, 0)
        }
    }

    /// t3 = 1 unless `end <= ctx_len` (t3 = 0): the whole test for an access ending `end`
    /// bytes past the context start.
    fn len_test(&mut self, end: u32) {
        if end < 2048 {
            self.e.ri(RI::Sltiu, T3, CTX_LEN, end as i32);
        } else {
            self.e.li(T2, end as i64);
            self.e.rrr(R3::Sltu, T3, CTX_LEN, T2);
        }
    }

    /// Checks `[base + off, base + off + size)` (`check`: what the front end knows of it);
    /// returns the (clamped) address as t0 plus an offset (a bare t0 when `bare`, for AMOs).
    ///
    /// For a region `[start, start + len)`, with `e = base + off + size - start` (mod 2^64),
    /// the access is inside exactly when `size <= e <= len`: an address below `start` or one
    /// whose end wraps past 2^64 gives `e < size`, one past the end `e > len`. So each
    /// region costs sub, addi, sltiu, sltu, or: no branch until the combined verdict.
    ///
    /// The context is tested inline; the stack block and the host regions out of line
    /// ([`Cold::Access`]). In a check group's checked copy the full check is called right
    /// away instead ([`packjit_frontend::lower::Driver::checks_in_full`]).
    ///
    /// Spectre v1: the verdict `t3` (0 = inside) also masks the base,
    /// `t0 = base & (t3 - 1)`, so if the branch on it is mispredicted the access goes to
    /// `0 + off` (|off| < 2 KiB: the unmapped page 0, or the top of the address space, which
    /// user code cannot map), never to the out-of-bounds address. Masking the base rather
    /// than `base + off` keeps the offset in the access, as trusted code has it.
    fn check_access(
        &mut self,
        check: AccessCheck,
        base: u8,
        off: i16,
        size: u32,
        write: bool,
        bare: bool,
    ) -> (u8, i32) {
        // The out-of-line side, from its label back to `resume`: none where the full check
        // is called right here.
        let slow_path = if self.d.checks_in_full() {
            self.call_region_stub(base, off, size, write);
            None
        } else {
            Some((self.inline_test(check, base, off, size), self.e.new_label()))
        };
        if let Some((_, resume)) = slow_path {
            self.e.bind(resume);
        }
        // Here t3 = 0 when the access is inside (the full check returns only then).
        let clamp = self.d.clamp;
        if clamp {
            self.e.ri(RI::Addi, T3, T3, -1);
        }
        let operand = if !bare && fits_signed(off as i64, 12) {
            if clamp {
                self.e.rrr(R3::And, T0, base, T3);
                (T0, off as i32)
            } else {
                (base, off as i32)
            }
        } else {
            self.add_imm(T0, base, off as i64, T0);
            if clamp {
                self.e.rrr(R3::And, T0, T0, T3);
            }
            (T0, 0)
        };
        if let Some((label, resume)) = slow_path {
            self.d.queue(Cold::Access {
                inst: self.d.cur,
                label,
                resume,
                size,
                write,
                site: AccessSite { base, off },
            });
        }
        operand
    }

    /// The inline test of `check_access`: t3 = 0 when `[base + off, + size)` is inside the
    /// region it tests, else a branch to the returned label, the out-of-line side.
    fn inline_test(&mut self, check: AccessCheck, base: u8, off: i16, size: u32) -> DynamicLabel {
        let label = self.e.new_label();
        let stack_first = self.layout.block > 0 && check == AccessCheck::Stack;
        let op = self.d.prog.insts[self.d.cur].op;
        // The stack block's length is a constant: `t = addr - stack_start` is inside iff
        // `t < block - size + 1`, an immediate when it fits SLTIU's 12 bits.
        let stack_lim = self.layout.block as i64 - size as i64 + 1;
        if stack_first && stack_lim < 2048 {
            self.e.rrr(R3::Sub, T2, base, STACK_START);
            if off != 0 {
                self.add_imm(T2, T2, off as i64, T3);
            }
            self.e.ri(RI::Sltiu, T3, T2, stack_lim as i32);
            self.cold_branch(Br::Eq, T3, ZERO, label);
            // Back to t3 = 0 = inside (see the CTX_LIM8 case below).
            self.e.ri(RI::Xori, T3, T3, 1);
        } else if self.layout.lim8 && lim8_access(&op, check, self.layout.block > 0) {
            // t = addr - start; inside iff t < CTX_LIM8 (t3 = 1). The verdict is flipped
            // to the usual t3 = 0 = inside after the branch, so a mispredicted branch on an
            // outside access (t3 = 0, flipped to 1) still masks the base to 0 below.
            self.e.rrr(R3::Sub, T2, base, CTX_START);
            if off != 0 {
                self.add_imm(T2, T2, off as i64, T3);
            }
            self.e.rrr(R3::Sltu, T3, T2, CTX_LIM8);
            self.cold_branch(Br::Eq, T3, ZERO, label);
            self.e.ri(RI::Xori, T3, T3, 1);
        } else if size == 1 && !stack_first && !matches!(check, AccessCheck::CtxConst { .. }) {
            // One byte: inside iff `t = addr - start < len` (an address below the start
            // wraps past any length), no end to form (`range_test`'s two more). Flipped as
            // above after the branch.
            self.byte_ctx_test(base, off);
            self.cold_branch(Br::Eq, T3, ZERO, label);
            self.e.ri(RI::Xori, T3, T3, 1);
        } else {
            match check {
                // The base is the context start plus a constant (a0 = env.ctx_start at
                // entry).
                AccessCheck::CtxConst { end } => self.len_test(end),
                _ if stack_first => self.range_test(base, off, size, STACK_START, STACK_LEN),
                _ => self.range_test(base, off, size, CTX_START, CTX_LEN),
            }
            self.cold_branch(Br::Ne, T3, ZERO, label);
        }
        label
    }

    /// The shared full check (`region_stub`: context, stack block, host regions) of the
    /// current instruction's access at `base + off`, which comes back with t3 = 0 only when
    /// the access is allowed (else the run stops there).
    fn call_region_stub(&mut self, base: u8, off: i16, size: u32, write: bool) {
        self.uses_stubs = true;
        self.uses_region_stub = true;
        // The stub wants the address in t0 and the access descriptor in t5.
        self.add_imm(T0, base, off as i64, T0);
        let access = size | if write { PJ_ACCESS_WRITE } else { 0 };
        let pc = self.d.pc() as i64;
        self.e.li(T5, (pc << ACCESS_BITS) | access as i64);
        let stub = self.region_stub;
        self.call_link(T6, stub);
    }

    /// t3 = 1 when the byte at `base + off` is in the context (`t2 = base + off - start <
    /// len`), else 0: the opposite sense of [`Self::range_test`].
    fn byte_ctx_test(&mut self, base: u8, off: i16) {
        self.e.rrr(R3::Sub, T2, base, CTX_START);
        if off != 0 {
            self.add_imm(T2, T2, off as i64, T3);
        }
        self.e.rrr(R3::Sltu, T3, T2, CTX_LEN);
    }

    /// t3 = 1 unless `[base + off, +size)` lies in `[start, start + len)` (t3 = 0); uses t2,
    /// t4.
    fn range_test(&mut self, base: u8, off: i16, size: u32, start: u8, len: u8) {
        self.e.rrr(R3::Sub, T2, base, start);
        self.add_imm(T2, T2, off as i64 + size as i64, T3);
        self.e.ri(RI::Sltiu, T3, T2, size as i32);
        self.e.rrr(R3::Sltu, T4, len, T2);
        self.e.rrr(R3::Or, T3, T3, T4);
    }

    /// `base + off` as a (register, 12-bit offset) pair, using `tmp` when `off` is too wide.
    fn address(&mut self, base: u8, off: i16, tmp: u8) -> (u8, i32) {
        if fits_signed(off as i64, 12) {
            (base, off as i32)
        } else {
            self.e.li(tmp, off as i64);
            self.e.rrr(R3::Add, tmp, base, tmp);
            (tmp, 0)
        }
    }

    /// An atomic on the address in `addr` (already checked in sandbox mode).
    fn atomic_amo(&mut self, width: Width, op: AtomicOp, fetch: bool, addr: u8, s: u8) {
        let amo = match op {
            AtomicOp::Add => Amo::Add,
            AtomicOp::And => Amo::And,
            AtomicOp::Or => Amo::Or,
            AtomicOp::Xor => Amo::Xor,
            AtomicOp::Xchg => Amo::Swap,
            AtomicOp::Cmpxchg => {
                // r0 = cmpxchg(addr, r0, s). lr.w sign-extends, so compare against the
                // sign-extended low half of r0.
                let r0 = self.map(0);
                let expect = if width == W64 {
                    r0
                } else {
                    self.e.ri(RI::Addiw, T2, r0, 0);
                    T2
                };
                self.e.cmpxchg_loop(width, addr, expect, s);
                if width == W64 {
                    self.e.mv(r0, T1);
                } else {
                    self.e.zext32(r0, T1);
                }
                return;
            }
        };
        if !fetch {
            self.e.amo_relaxed(amo, width, ZERO, s, addr);
            return;
        }
        self.e.amo_aqrl(amo, width, s, s, addr);
        if width == W32 {
            // amo*.w sign-extends the old value; BPF's 32-bit fetch zero-extends it.
            self.e.zext32(s, s);
        }
    }
}

/// Is `op` an 8-byte access whose inline test is the context's general one (so it uses
/// [`CTX_LIM8`])? `block`: the program has a stack block (then `Stack` accesses test it
/// first instead).
pub(super) fn lim8_access(op: &Op, check: AccessCheck, block: bool) -> bool {
    let size8 = matches!(
        op,
        Op::Load { size: Size::DW, .. }
            | Op::Store { size: Size::DW, .. }
            | Op::Atomic { size: Size::DW, .. }
    );
    size8
        && match check {
            AccessCheck::Ctx | AccessCheck::Unknown | AccessCheck::Guarded => true,
            AccessCheck::Stack => !block,
            _ => false,
        }
}

impl<'a> MemoryHooks<'a> for Codegen<'a> {
    fn load(&mut self, size: Size, sign_extend: bool, dst: Reg, base: Reg, off: i16) {
        let m = match (size, sign_extend) {
            (Size::B, false) => Mem::Bu,
            (Size::B, true) => Mem::B,
            (Size::H, false) => Mem::Hu,
            (Size::H, true) => Mem::H,
            (Size::W, false) => Mem::Wu,
            (Size::W, true) => Mem::W,
            (Size::DW, _) => Mem::D,
        };
        let (b, o) = self.mem_operand(base, off, size, false);
        self.e.load(m, self.map(dst), b, o);
    }

    fn store(&mut self, size: Size, base: Reg, off: i16, src: Operand) {
        // The address first: the sandbox check's out-of-line path uses t1.
        let (b, o) = self.mem_operand(base, off, size, true);
        let v = match src {
            Operand::Reg(r) => self.map(r),
            Operand::Imm(0) => ZERO,
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
        };
        let m = match size {
            Size::B => Mem::B,
            Size::H => Mem::H,
            Size::W => Mem::W,
            Size::DW => Mem::D,
        };
        self.e.store(m, v, b, o);
    }

    fn atomic(&mut self, size: Size, aop: AtomicOp, fetch: bool, base: Reg, off: i16, src: Reg) {
        // AMOs take a bare register address.
        let addr = match self.d.access(base, off, size) {
            AccessLowering::Checked(check) => {
                self.check_access(check, self.map(base), off, size.bytes(), true, true);
                T0
            }
            AccessLowering::IndexBounded {
                base,
                off,
                index,
                end,
                ..
            } => {
                self.index_bounded(self.map(base), off, self.map(index), end, true);
                T0
            }
            AccessLowering::Direct { base, off: 0 } => self.map(base),
            AccessLowering::Direct { base, off } => {
                self.add_imm(T0, self.map(base), off as i64, T0);
                T0
            }
        };
        // The verifier allows only W and DW atomics.
        let width = if size == Size::DW { W64 } else { W32 };
        self.atomic_amo(width, aop, fetch, addr, self.map(src))
    }

    /// Group `g`'s widened test of `[base + lo, base + hi)` in one region, then the base
    /// masked in place (`base &= t3 - 1`): unchanged when the test passed, `max(0, -lo)`
    /// under a mispredicted branch, so no member reaches memory out of bounds (Spectre v1).
    /// On failure the group's checked copy runs (at `fail`).
    fn group_check(&mut self, g: usize, fail: DynamicLabel) {
        let grp = &self.d.access.groups[g];
        let (b, lo, span, check) = (
            self.map(grp.base),
            grp.lo,
            (grp.hi - grp.lo as i32) as u32,
            grp.check,
        );
        // t3 = 1 outside, 0 inside; or for a one-byte group the other way round.
        let byte = span == 1 && !matches!(check, AccessCheck::CtxConst { .. } | AccessCheck::Stack);
        match check {
            AccessCheck::CtxConst { end } => self.len_test(end),
            AccessCheck::Stack if span < 2048 && self.layout.block > 0 => {
                self.range_test(b, lo, span, STACK_START, STACK_LEN)
            }
            _ if byte => self.byte_ctx_test(b, lo),
            // The context: a sufficient test for any group (spans stay below 2 KiB).
            _ => self.range_test(b, lo, span, CTX_START, CTX_LEN),
        }
        self.cold_branch(if byte { Br::Eq } else { Br::Ne }, T3, ZERO, fail);
        if self.d.clamp {
            // The mask: all ones where the test passed (on a mispredicted branch 0).
            if byte {
                self.e.rrr(R3::Sub, T3, ZERO, T3);
            } else {
                self.e.ri(RI::Addi, T3, T3, -1);
            }
            if lo < 0 {
                // Members below the base (`ranges::GROUP_BELOW`, lo >= -1024): the mask goes
                // on `base + lo`, so a mispredicted test leaves base = -lo and every member
                // in `[0, hi - lo)`.
                self.e.ri(RI::Addi, b, b, lo as i32);
                self.e.rrr(R3::And, b, b, T3);
                self.e.ri(RI::Addi, b, b, -(lo as i32));
            } else {
                self.e.rrr(R3::And, b, b, T3);
            }
        }
    }

    /// The rest of the check of instruction `inst`'s access, whose inline test failed: the
    /// shared check (`region_scan`: context, stack block, host regions), which returns to
    /// `resume` with t3 = 0 or stops.
    fn access_slow_path(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        resume: DynamicLabel,
        size: u32,
        write: bool,
        site: AccessSite,
    ) -> Result<(), CompileError> {
        self.e.bind(label);
        debug_assert_eq!(inst, self.d.cur);
        self.call_region_stub(site.base, site.off, size, write);
        self.jump(resume);
        Ok(())
    }
}
