//! Loads, stores and atomics, and their sandbox checks: a check group's widened test, an
//! access's own inline test (the slow path is the shared routine of [`super::cold`]).

use super::cold;
use super::{mem_sz, Codegen, CTX_LEN8, CTX_START8, STACK_START8};
use crate::encode::{Arith, Cc, Gpr, Label, Sz};
use crate::regs::*;
use crate::FEATURE_MOVBE;
use dynasmrt::{dynasm, DynasmApi};
use packjit_frontend::blind::AX;
use packjit_frontend::lower::{AccessLowering, Cold, Expansion};
use packjit_frontend::lower::{CopyOf, MemoryHooks};
use packjit_frontend::ranges::AccessCheck;
use packjit_frontend::{AtomicOp, EndKind, Op, Operand, Reg, Size};
use packjit_plugin_api::CompileError;

impl Codegen<'_> {
    /// The memory operand of an access: `[base + off]`, or `[r11]` after a sandbox check.
    fn address(&mut self, base: Reg, off: i16, size: Size, write: bool) -> (Gpr, i32) {
        let check = match self.d.access(base, off, size) {
            AccessLowering::Direct { base, off } => return (host(base), off as i32),
            AccessLowering::IndexBounded {
                base,
                off,
                index,
                len,
                end,
            } => {
                self.index_bounded(host(base), off as i32, host(index), len.map(host), end);
                return (T11, 0);
            }
            AccessLowering::Checked(_) if self.d.checks_in_full() => {
                self.lea(T11, host(base), off as i32);
                let desc = cold::access_desc(self.d.pc(), size.bytes(), write);
                self.call_access_check(desc);
                return (T11, 0);
            }
            AccessLowering::Checked(check) => check,
        };
        match check {
            AccessCheck::CtxConst { end } if end <= i32::MAX as u32 => {
                self.ctx_len_check(host(base), off as i32, size, write, end)
            }
            _ => self.check(
                host(base),
                off as i32,
                size,
                write,
                check == AccessCheck::Stack,
            ),
        }
        (T11, 0)
    }

    /// The address of an access whose index every architectural path bounds
    /// ([`AccessLowering::IndexBounded`]): `r11 = base + off`, re-tested branch-free as
    /// `index + end <= len` and replaced with `env` (r12, a harmless mapped address, as the
    /// checks' clamp) when a mispredicted branch brought an index the compare would have
    /// stopped. With `end > 1` the test is two: `index < len` first, so that `index + end`
    /// (a context's length is far below 2^63) cannot wrap in the second. r9 (the length when
    /// no register holds it) and r10 are clobbered.
    fn index_bounded(&mut self, base: Gpr, off: i32, index: Gpr, len: Option<Gpr>, end: u16) {
        self.lea(T11, base, off);
        let len = len.unwrap_or_else(|| {
            self.ctx_len();
            T9
        });
        self.e.cmp_rr(Sz::B64, index, len);
        self.e.cmov(Cc::Ae, T11, ENV);
        if end > 1 {
            self.e.lea(T10, index, end as i32);
            self.e.cmp_rr(Sz::B64, T10, len);
            self.e.cmov(Cc::A, T11, ENV);
        }
    }

    /// `r11 = base + off`.
    pub(super) fn lea(&mut self, dst: Gpr, base: Gpr, off: i32) {
        if off == 0 {
            self.mov_rr(Sz::B64, dst, base);
        } else {
            self.e.lea(dst, base, off);
        }
    }

    /// `r9 = ctx_end - ctx_start`: the host's copy in `env.ctx_len`.
    pub(super) fn ctx_len(&mut self) {
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; mov r9, QWORD [BYTE r12 + CTX_LEN8]),
        );
    }

    /// Flags for "the context is shorter than `end`" (`B`): `end` fits an `i32`.
    fn ctx_len_below(&mut self, end: u32) {
        let end = end as i32;
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; cmp QWORD [BYTE r12 + CTX_LEN8], DWORD end),
        );
    }

    /// The check of an access whose base is the context start plus a constant (rdi =
    /// env.ctx_start at entry), ending `end` bytes into the context: inside iff
    /// `end <= len`. Otherwise the full check runs out of line ([`Cold::Access`]).
    fn ctx_len_check(&mut self, base: Gpr, off: i32, size: Size, write: bool, end: u32) {
        let (at, back) = (self.e.label(), self.e.label());
        self.lea(T11, base, off);
        self.ctx_len_below(end);
        self.cold_jump(Some(Cc::B), at);
        if self.d.clamp {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmovb r11, r12));
        }
        self.e.bind(back);
        self.queue_slow_path(at, back, size, write);
    }

    /// Sandbox check of `[base + off, + size)`: leaves the address in r11 (clamped under
    /// misspeculation) or stops. `stack_first`: the base derives from r10, so the stack
    /// block is tested inline instead of the context.
    ///
    /// One region is tested inline, falling through when the access is inside; otherwise
    /// the full check runs out of line ([`Cold::Access`]) and comes back to `ok` when some
    /// region holds the access. At `ok` the flags of the deciding compare are still live,
    /// and `cmova` replaces the address with `env` (a harmless, mapped address) should the
    /// branch have been mispredicted.
    fn check(&mut self, base: Gpr, off: i32, size: Size, write: bool, stack_first: bool) {
        let n = size.bytes() as i64;
        let (ok, at) = (self.e.label(), self.e.label());
        self.lea(T11, base, off);
        if n == 1 && !(stack_first && self.plan.block > 0) {
            return self.byte_ctx_check(at, write);
        }
        if stack_first && self.plan.block > 0 {
            self.stack_cmp(n);
        } else {
            self.ctx_cmp(n);
        }
        self.cold_jump(Some(Cc::A), at);
        self.e.bind(ok);
        if self.d.clamp {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmova r11, r12));
        }
        self.queue_slow_path(at, ok, size, write);
    }

    /// The context test of a one-byte access at r11: `r11 - start < len`. With one byte
    /// there is no end to compute, so no carry to force to all-ones (an address below the
    /// start wraps the difference past any length). The slow path comes back after the
    /// clamp: its own routine clamped on its deciding compare, whose flags (`jbe`) would
    /// fire this `cmovae`.
    fn byte_ctx_check(&mut self, at: Label, write: bool) {
        let back = self.e.label();
        self.e.asm(3, |ops| {
            dynasm!(ops ; .arch x64
                ; mov r10, r11
                ; sub r10, QWORD [BYTE r12 + CTX_START8]
                ; cmp r10, QWORD [BYTE r12 + CTX_LEN8]
            )
        });
        self.cold_jump(Some(Cc::Ae), at);
        if self.d.clamp {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmovae r11, r12));
        }
        self.e.bind(back);
        self.queue_slow_path(at, back, Size::B, write);
    }

    /// Queues the slow path of the current access's check: the shared routine, from `at`
    /// back to `resume` ([`Codegen::access_slow_path_at`]).
    fn queue_slow_path(&mut self, at: Label, resume: Label, size: Size, write: bool) {
        let inst = self.d.cur;
        self.d.queue(Cold::Access {
            inst,
            label: at,
            resume,
            size: size.bytes(),
            write,
            site: (),
        });
    }

    /// Flags for "`[r11, r11 + n)` is inside the context": "below or equal" when it is.
    /// `end = addr - start + n` (forced to all-ones when it wraps) against the length.
    fn ctx_cmp(&mut self, n: i64) {
        self.region_end(CTX_START8, n);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; cmp r10, QWORD [BYTE r12 + CTX_LEN8]),
        );
    }

    /// Flags for "`[r11, r11 + n)` is inside the stack block": "below or equal" when it is.
    ///
    /// The block's length is a constant, so with `u = r11 - stack_start` (mod 2^64) the
    /// access is inside exactly when `u <= block - n`: an address below the block wraps `u`
    /// past 2^63 (user addresses are below 2^47), far above any block. No end to force to
    /// all-ones, unlike the context's variable length ([`Self::region_end`]).
    fn stack_cmp(&mut self, n: i64) {
        self.stack_offset();
        self.e.cmp_ri(Sz::B64, T10, self.plan.block as i64 - n);
    }

    /// r10 = r11 - env.stack_start.
    fn stack_offset(&mut self) {
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov r10, r11
                ; sub r10, QWORD [BYTE r12 + STACK_START8]
            )
        });
    }

    /// r10 = r11 - [env + start] + n, all-ones if that wraps (r9 clobbered).
    fn region_end(&mut self, start: i8, n: i64) {
        self.mov_rr(Sz::B64, T10, T11);
        self.region_end_in_r10(start, n);
    }

    /// r10 = r10 - [env + start] + n, all-ones if that wraps (r9 clobbered).
    ///
    /// `sbb r9, r9` reads r9 on Intel cores (AMD's rename it as depending on the carry
    /// alone), so without the zeroing `xor` first each check waited for whatever last wrote
    /// r9: in the peers bench's `signed` the division's saved dividend, which hangs on the
    /// loads the previous check guarded, a chain through every iteration (sandboxed ÷
    /// trusted 2.2 there, 1.2-1.35 with the `xor`).
    fn region_end_in_r10(&mut self, start: i8, n: i64) {
        // n is an access size, or a group's span: under 128 (`encodes_group`).
        let n = n as i8;
        self.e.asm(5, |ops| {
            dynasm!(ops ; .arch x64
                ; xor r9d, r9d
                ; sub r10, QWORD [BYTE r12 + start]
                ; add r10, BYTE n
                ; sbb r9, r9 // -carry
                ; or r10, r9
            )
        });
    }
}

impl<'a> MemoryHooks<'a> for Codegen<'a> {
    fn load(&mut self, size: Size, sx: bool, dst: Reg, base: Reg, off: i16) {
        let i = self.d.cur;
        let (b, off) = self.address(base, off, size, false);
        let d = host(dst);
        // MOVBE: a load followed by a byte swap of the same width into the same register
        // (the usual ntohs/ntohl/be64 pattern) becomes one swapping load.
        // Not in a driver expansion: its next operation is not the program's next instruction.
        if self.d.mode.features & FEATURE_MOVBE != 0
            && !sx
            && size != Size::B
            && self.d.expansion == Expansion::None
        {
            if let Some(next) = self.d.prog.insts.get(i + 1) {
                let bits = size.bytes() as u8 * 8;
                if let Op::End {
                    kind: EndKind::ToBe | EndKind::Swap,
                    bits: nb,
                    dst: nd,
                } = next.op
                {
                    if nd == dst && nb == bits && !self.d.prog.is_target[i + 1] {
                        let sz = match size {
                            Size::H => Sz::B16,
                            Size::W => Sz::B32,
                            _ => Sz::B64,
                        };
                        self.e.movbe_load(sz, d, b, off);
                        if size == Size::H {
                            self.e.movzx16(d, d);
                        }
                        self.d.skip = Some(i + 1);
                        return;
                    }
                }
            }
        }
        match (size, sx) {
            (Size::B | Size::H, false) => self.e.load_zx(mem_sz(size), d, b, off),
            (Size::W, false) => self.e.load(Sz::B32, d, b, off),
            (Size::DW, _) => self.e.load(Sz::B64, d, b, off),
            (_, true) => self.e.load_sx(mem_sz(size), d, b, off),
        }
    }

    fn store(&mut self, size: Size, base: Reg, off: i16, src: Operand) {
        let sz = mem_sz(size);
        if src == Operand::Reg(AX)
            && matches!(
                self.d.access(base, off, size),
                AccessLowering::Checked(_) | AccessLowering::IndexBounded { .. }
            )
        {
            // A blinded constant (in r9, the blinding rewrite's AX) waits on the native stack
            // while the check, which uses r9-r11, runs; the address ends in r11.
            self.e.push(host(AX));
            let (b, off) = self.address(base, off, size, true);
            self.e.pop(T10);
            self.e.store(sz, b, off, T10);
            return;
        }
        let (b, off) = self.address(base, off, size, true);
        match src {
            Operand::Reg(s) => self.e.store(sz, b, off, host(s)),
            Operand::Imm(i) => self.e.store_imm(sz, b, off, i),
        }
    }

    /// Atomics. Every `lock`-prefixed read-modify-write (and `xchg` with memory, locked
    /// implicitly) is a full barrier on x86, so all forms are sequentially consistent, as
    /// the kernel documents for BPF's fetching atomics.
    #[allow(clippy::too_many_arguments)]
    fn atomic(&mut self, size: Size, op: AtomicOp, fetch: bool, base: Reg, off: i16, src: Reg) {
        let sz = mem_sz(size);
        let s = host(src);
        let needs_loop = fetch && matches!(op, AtomicOp::And | AtomicOp::Or | AtomicOp::Xor);
        let (b, off) = if needs_loop && !self.d.mode.sandboxed() {
            // The loop below uses rax: take the address first in case base is r0.
            self.e.lea(T11, host(base), off as i32);
            (T11, 0)
        } else {
            match self.address(base, off, size, true) {
                // Likewise for a sandboxed access the range analysis proved (no check, so
                // the base register itself is the address).
                (RAX, off) if needs_loop => {
                    self.e.lea(T11, RAX, off);
                    (T11, 0)
                }
                a => a,
            }
        };
        let arith = match op {
            AtomicOp::Add => Arith::Add,
            AtomicOp::Or => Arith::Or,
            AtomicOp::And => Arith::And,
            _ => Arith::Xor,
        };
        match (op, fetch) {
            (AtomicOp::Add | AtomicOp::Or | AtomicOp::And | AtomicOp::Xor, false) => {
                self.e.lock_arith(arith, sz, b, off, s)
            }
            (AtomicOp::Add, true) => self.e.lock_xadd(sz, b, off, s),
            (AtomicOp::Xchg, _) => self.e.xchg(sz, b, off, s),
            (AtomicOp::Cmpxchg, _) => {
                self.e.lock_cmpxchg(sz, b, off, s);
                if sz == Sz::B32 {
                    // On success a 32-bit cmpxchg leaves rax's upper half alone; eBPF's r0
                    // is the zero-extended old value either way.
                    self.mov_rr(Sz::B32, RAX, RAX);
                }
            }
            (_, true) => {
                // fetch-and/or/xor: a cmpxchg loop. r10 keeps r0 (rax is cmpxchg's
                // comparand); when src is r0 its value is read from there.
                let sv = if s == RAX { T10 } else { s };
                self.mov_rr(Sz::B64, T10, RAX);
                self.e.load(sz, RAX, b, off);
                let again = self.e.label();
                self.e.bind(again);
                self.mov_rr(Sz::B64, T9, RAX);
                self.e.arith_rr(arith, sz, T9, sv);
                self.e.lock_cmpxchg(sz, b, off, T9);
                self.e.jump(Some(Cc::Ne), again);
                // src = old value (zero-extended for 32-bit); r0 restored unless it is src.
                self.mov_rr(sz, s, RAX);
                if s != RAX {
                    self.mov_rr(Sz::B64, RAX, T10);
                }
            }
        }
    }

    /// Group `g`'s widened test of `[base + lo, base + hi)` in one region, then the base
    /// itself clamped in place to `max(0, -lo)` under a mispredicted branch (architecturally
    /// it keeps its value: the test passed), so every member's address falls in the
    /// never-mapped first page, `[0, hi - lo)` ([`packjit_frontend::ranges::GROUP_BELOW`]).
    /// On failure the group's checked copy runs (at `at`, queued by the driver).
    fn group_check(&mut self, g: usize, at: Label) {
        let grp = &self.d.access.groups[g];
        let (b, lo, span, check) = (
            host(grp.base),
            grp.lo as i32,
            (grp.hi - grp.lo as i32) as i64,
            grp.check,
        );
        let fail = match check {
            AccessCheck::CtxConst { end } => {
                self.ctx_len_below(end);
                Cc::B
            }
            AccessCheck::Stack if (span as usize) <= self.plan.block => {
                // As the context's below: the failing side is the group's checked copy, so
                // the offset is formed in r10 directly, no address kept in r11.
                self.lea(T10, b, lo);
                self.e.asm(
                    1,
                    |ops| dynasm!(ops ; .arch x64 ; sub r10, QWORD [BYTE r12 + STACK_START8]),
                );
                self.e.cmp_ri(Sz::B64, T10, self.plan.block as i64 - span);
                Cc::A
            }
            _ if span == 1 => {
                // One byte (the members are one-byte accesses at one offset): its offset
                // from the context's start, wrapped past any length when below it, is
                // inside exactly when below the length; no end, no carry to force (as
                // `byte_ctx_check`).
                self.lea(T10, b, lo);
                self.e.asm(2, |ops| {
                    dynasm!(ops ; .arch x64
                        ; sub r10, QWORD [BYTE r12 + CTX_START8]
                        ; cmp r10, QWORD [BYTE r12 + CTX_LEN8]
                    )
                });
                Cc::Ae
            }
            _ => {
                // The context: a sufficient test for any group. The failing side is the
                // group's checked copy, which checks each access itself: no address kept
                // in r11 for it.
                self.lea(T10, b, lo);
                self.region_end_in_r10(CTX_START8, span);
                self.e.asm(
                    1,
                    |ops| dynasm!(ops ; .arch x64 ; cmp r10, QWORD [BYTE r12 + CTX_LEN8]),
                );
                Cc::A
            }
        };
        self.cold_jump(Some(fail), at);
        if self.d.clamp {
            // `mov`, not `xor`: it leaves the flags alone.
            self.e.mov_r32_imm(T9, (-lo).max(0) as u32);
            self.e.cmov(fail, b, T9);
        }
    }

    fn access_slow_path(
        &mut self,
        inst: usize,
        label: Label,
        resume: Label,
        size: u32,
        write: bool,
        _site: (),
    ) -> Result<(), CompileError> {
        let pc = self.d.prog.insts[inst].pc as usize;
        self.access_slow_path_at(label, resume, cold::access_desc(pc, size, write));
        Ok(())
    }

    fn checked_copy_done(&mut self, copy: CopyOf) {
        let CopyOf::Group(g) = copy else { return };
        if self.d.access.groups[g].reentered && self.d.clamp {
            // A jump may later skip this group's check, trusting the base: no instruction
            // after this point runs before every member's check above has resolved, so a
            // mispredicted one cannot carry an unchecked base past here (LFENCE, the x86
            // speculation barrier).
            self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; lfence));
        }
    }
}
