//! Loads, stores and atomics, and the sandbox's inline checks of them.

use super::*;

impl Codegen<'_> {
    pub(crate) fn mem(&mut self, op: MemOp, size: Size, rt: u8, base: Reg, off: i16) {
        // r10-based accesses address the frame directly off its base (r10 = base + 512).
        let (b, o) = match self.d.access(base, off, size) {
            AccessLowering::Checked(check) => {
                let addr = self.check_access(check, size, op == MemOp::Store, base, off);
                self.clamp_reentered_base(base, off);
                (addr, 0)
            }
            AccessLowering::IndexBounded {
                base,
                off,
                index,
                end,
                ..
            } => (self.index_bounded(base, off, index, end), 0),
            AccessLowering::Direct { base: R10, off } => {
                (self.frame_base(), off as i64 + STACK_SIZE as i64)
            }
            AccessLowering::Direct { base, off } => (self.map[base as usize], off as i64),
        };
        let sz = size.bytes() as i64;
        let form = if o >= 0 && o % sz == 0 && o / sz < 4096 {
            AddrForm::Scaled
        } else if (-256..256).contains(&o) {
            AddrForm::Unscaled
        } else {
            // Out of both immediate forms: the offset goes in a register.
            self.mov_imm(T0, o as u64, W64);
            AddrForm::Index
        };
        let o = o as i32;
        macro_rules! acc {
            ($scaled:ident, $unscaled:ident, $fam:ident) => {
                match form {
                    AddrForm::Scaled => a64!(self.ops; $scaled $fam(rt), [XSP(b), o as u32]),
                    AddrForm::Unscaled => a64!(self.ops; $unscaled $fam(rt), [XSP(b), o]),
                    AddrForm::Index => a64!(self.ops; $scaled $fam(rt), [XSP(b), X(T0)]),
                }
            };
        }
        match (op, size) {
            (MemOp::Load { sign_extend: false }, Size::B) => acc!(ldrb, ldurb, W),
            (MemOp::Load { sign_extend: false }, Size::H) => acc!(ldrh, ldurh, W),
            (MemOp::Load { sign_extend: false }, Size::W) => acc!(ldr, ldur, W),
            (MemOp::Load { .. }, Size::DW) => acc!(ldr, ldur, X),
            (MemOp::Load { sign_extend: true }, Size::B) => acc!(ldrsb, ldursb, X),
            (MemOp::Load { sign_extend: true }, Size::H) => acc!(ldrsh, ldursh, X),
            (MemOp::Load { sign_extend: true }, Size::W) => acc!(ldrsw, ldursw, X),
            (MemOp::Store, Size::B) => acc!(strb, sturb, W),
            (MemOp::Store, Size::H) => acc!(strh, sturh, W),
            (MemOp::Store, Size::W) => acc!(str, stur, W),
            (MemOp::Store, Size::DW) => acc!(str, stur, X),
        }
    }

    /// Address of an atomic access in a register (LDXR/LDADD... take no offset).
    pub(crate) fn atomic_addr(&mut self, size: Size, base: Reg, off: i16) -> u8 {
        match self.d.access(base, off, size) {
            // Atomics count as writes.
            AccessLowering::Checked(check) => self.check_access(check, size, true, base, off),
            AccessLowering::IndexBounded {
                base,
                off,
                index,
                end,
                ..
            } => self.index_bounded(base, off, index, end),
            AccessLowering::Direct { base: R10, off } => {
                let fb = self.frame_base();
                self.add_imm_base(T0, fb, off as i64 + STACK_SIZE as i64);
                T0
            }
            AccessLowering::Direct { base, off: 0 } => self.map[base as usize],
            AccessLowering::Direct { base, off } => {
                self.add_imm(T0, self.map[base as usize], off as i64, W64);
                T0
            }
        }
    }

    /// ARMv8.1 LSE: one instruction. Fetching forms are fully ordered (`...AL`) as the
    /// kernel's BPF atomics are; plain read-modify-write uses the relaxed `ST...` alias.
    pub(crate) fn atomic_lse(
        &mut self,
        width: Width,
        op: AtomicOp,
        fetch: bool,
        a: u8,
        s: u8,
        r0: u8,
    ) {
        // LSE has no AND: clear the complement instead.
        let v = if op == AtomicOp::And {
            a64!(self.ops; mvn X(T1), X(s));
            T1
        } else {
            s
        };
        if !fetch {
            match (op, width) {
                (AtomicOp::Add, W64) => a64!(self.ops; stadd X(v), [X(a)]),
                (AtomicOp::Add, W32) => a64!(self.ops; stadd W(v), [X(a)]),
                (AtomicOp::Or, W64) => a64!(self.ops; stset X(v), [X(a)]),
                (AtomicOp::Or, W32) => a64!(self.ops; stset W(v), [X(a)]),
                (AtomicOp::And, W64) => a64!(self.ops; stclr X(v), [X(a)]),
                (AtomicOp::And, W32) => a64!(self.ops; stclr W(v), [X(a)]),
                (_, W64) => a64!(self.ops; steor X(v), [X(a)]),
                (_, W32) => a64!(self.ops; steor W(v), [X(a)]),
            }
            return;
        }
        // The old value lands in the source register (r0 for cmpxchg); W forms zero-extend.
        match (op, width) {
            (AtomicOp::Add, W64) => a64!(self.ops; ldaddal X(v), X(s), [X(a)]),
            (AtomicOp::Add, W32) => a64!(self.ops; ldaddal W(v), W(s), [X(a)]),
            (AtomicOp::Or, W64) => a64!(self.ops; ldsetal X(v), X(s), [X(a)]),
            (AtomicOp::Or, W32) => a64!(self.ops; ldsetal W(v), W(s), [X(a)]),
            (AtomicOp::And, W64) => a64!(self.ops; ldclral X(v), X(s), [X(a)]),
            (AtomicOp::And, W32) => a64!(self.ops; ldclral W(v), W(s), [X(a)]),
            (AtomicOp::Xor, W64) => a64!(self.ops; ldeoral X(v), X(s), [X(a)]),
            (AtomicOp::Xor, W32) => a64!(self.ops; ldeoral W(v), W(s), [X(a)]),
            (AtomicOp::Xchg, W64) => a64!(self.ops; swpal X(v), X(s), [X(a)]),
            (AtomicOp::Xchg, W32) => a64!(self.ops; swpal W(v), W(s), [X(a)]),
            // CAS compares with and returns into its first operand: r0 itself.
            (AtomicOp::Cmpxchg, W64) => a64!(self.ops; casal X(r0), X(s), [X(a)]),
            (AtomicOp::Cmpxchg, W32) => a64!(self.ops; casal W(r0), W(s), [X(a)]),
        }
    }

    /// Exclusive-monitor loops for CPUs without LSE. Fetching forms get release on the
    /// store plus a full barrier after, matching the ordering of the LSE `...AL` forms.
    pub(crate) fn atomic_llsc(
        &mut self,
        width: Width,
        op: AtomicOp,
        fetch: bool,
        a: u8,
        s: u8,
        r0: u8,
    ) {
        let (old, new, status) = (T1, T2, T3);
        if op == AtomicOp::Cmpxchg {
            if width == W64 {
                a64!(self.ops
                    ; retry:
                    ; ldxr X(old), [X(a)]
                    ; cmp X(old), X(r0)
                    ; b.ne >done
                    ; stlxr W(status), X(s), [X(a)]
                    ; cbnz W(status), <retry
                    ; done:
                    ; dmb ish
                    ; mov X(r0), X(old)
                );
            } else {
                a64!(self.ops
                    ; retry:
                    ; ldxr W(old), [X(a)]
                    ; cmp W(old), W(r0)
                    ; b.ne >done
                    ; stlxr W(status), W(s), [X(a)]
                    ; cbnz W(status), <retry
                    ; done:
                    ; dmb ish
                    ; mov W(r0), W(old)
                );
            }
            return;
        }
        a64!(self.ops; retry:);
        if width == W64 {
            a64!(self.ops; ldxr X(old), [X(a)]);
        } else {
            a64!(self.ops; ldxr W(old), [X(a)]);
        }
        let val = match (op, width) {
            (AtomicOp::Xchg, _) => s,
            (AtomicOp::Add, W64) => {
                a64!(self.ops; add X(new), X(old), X(s));
                new
            }
            (AtomicOp::Add, W32) => {
                a64!(self.ops; add W(new), W(old), W(s));
                new
            }
            (AtomicOp::Or, W64) => {
                a64!(self.ops; orr X(new), X(old), X(s));
                new
            }
            (AtomicOp::Or, W32) => {
                a64!(self.ops; orr W(new), W(old), W(s));
                new
            }
            (AtomicOp::And, W64) => {
                a64!(self.ops; and X(new), X(old), X(s));
                new
            }
            (AtomicOp::And, W32) => {
                a64!(self.ops; and W(new), W(old), W(s));
                new
            }
            (_, W64) => {
                a64!(self.ops; eor X(new), X(old), X(s));
                new
            }
            (_, W32) => {
                a64!(self.ops; eor W(new), W(old), W(s));
                new
            }
        };
        match (fetch, width) {
            (true, W64) => a64!(self.ops; stlxr W(status), X(val), [X(a)]),
            (true, W32) => a64!(self.ops; stlxr W(status), W(val), [X(a)]),
            (false, W64) => a64!(self.ops; stxr W(status), X(val), [X(a)]),
            (false, W32) => a64!(self.ops; stxr W(status), W(val), [X(a)]),
        }
        a64!(self.ops; cbnz W(status), <retry);
        if fetch {
            a64!(self.ops; dmb ish);
            if width == W64 {
                a64!(self.ops; mov X(s), X(old));
            } else {
                a64!(self.ops; mov W(s), W(old));
            }
        }
    }

    // ------------------------------------------------------------ sandbox checks

    /// Leaves in x9 the address of a `size`-byte access at `base + off`, checked against the
    /// context inline; other regions are tried out of line (see [`Cold::Access`]).
    ///
    /// ```text
    ///   add  x9, xb, #off          ; address (none for off = 0: xb is used in place)
    ///   sub  x14, x9, x23          ; t = addr - ctx_start (wraps when below)
    ///   subs x14, x24, x14         ; len - t: carry iff t <= len
    ///   ccmp x14, #size, #0, hs    ; carry iff len - t >= size (else flags = fail)
    ///   b.lo cold                  ; not in the context
    ///   csel x9, x9, xzr, hs       ; Spectre v1: a mispredicted b.lo sees address 0
    /// resume:
    /// ```
    ///
    /// The comparison is exact for every 64-bit address: `t <= len` rules out addresses
    /// below the context (t wraps past any length) before `len - t >= size` is tested.
    pub(crate) fn check_access(
        &mut self,
        check: AccessCheck,
        size: Size,
        write: bool,
        base: Reg,
        off: i16,
    ) -> u8 {
        // The register holding the address: the base itself for offset 0 (the CSEL then
        // writes x9, and the out-of-line side copies it first), else x9.
        let addr = self.offset_address(base, off);
        let s = size.bytes();
        if self.d.checks_in_full() {
            self.call_region_scan(addr, s, write);
            return T0;
        }
        let label = self.ops.new_dynamic_label();
        let resume = self.ops.new_dynamic_label();
        let stack_first = self.plan.block > 0 && check == AccessCheck::Stack;
        match check {
            AccessCheck::CtxConst { end } if end < 4096 => {
                // The base is the context start plus a constant (r1 = env.ctx_start at
                // entry): in the context iff end <= len.
                a64!(self.ops; cmp XSP(CTX_LEN), end);
                self.branch_if(Test::Flags(Cc::Lo), label);
                self.clamp_to(T0, addr, Cc::Hs);
            }
            _ if stack_first => {
                self.stack_check(addr, s);
                self.branch_if(Test::Flags(Cc::Hi), label);
                self.clamp_to(T0, addr, Cc::Ls);
            }
            _ => {
                let inside = self.ctx_check(addr, s);
                self.branch_if(Test::Flags(inside.invert()), label);
                self.clamp_to(T0, addr, inside);
            }
        }
        a64!(self.ops; =>resume);
        self.d.queue(Cold::Access {
            inst: self.d.cur,
            label,
            resume,
            size: s,
            write,
            site: addr,
        });
        // The clamped address is in x9; without the clamp (measurement only) the access
        // goes to the checked register itself, as it would with no clamp to make.
        if self.d.clamp {
            T0
        } else {
            addr
        }
    }

    /// The register holding `base + off`: the base itself for offset 0, else x9.
    fn offset_address(&mut self, base: Reg, off: i16) -> u8 {
        let b = self.src(base, T0);
        if off == 0 {
            return b;
        }
        if let Some((imm, false)) = fits_imm12(off as i64) {
            a64!(self.ops; add XSP(T0), XSP(b), imm);
        } else if let Some((imm, false)) = fits_imm12(-(off as i64)) {
            a64!(self.ops; sub XSP(T0), XSP(b), imm);
        } else {
            self.mov_imm(C0, off as i64 as u64, W64);
            a64!(self.ops; add X(T0), X(b), X(C0));
        }
        T0
    }

    /// Leaves in x9 the address of an access whose index every architectural path bounds
    /// ([`AccessLowering::IndexBounded`]): `base + off`, or 0 (the never-mapped first page)
    /// when `index + end <= ctx_len` fails, which only a mispredicted branch can bring. No
    /// branch: the test re-runs against the entry's own copy of the length (x24).
    ///
    /// ```text
    ///   cmp  xi, x24               ; end = 1: index < len
    ///   csel x9, xa, xzr, lo
    /// or
    ///   subs x14, x24, xi          ; len - index: carry iff index <= len
    ///   ccmp x14, #end, #0, hs     ; carry iff len - index >= end (else flags = fail)
    ///   csel x9, xa, xzr, hs
    /// ```
    pub(crate) fn index_bounded(&mut self, base: Reg, off: i16, index: Reg, end: u16) -> u8 {
        let addr = self.offset_address(base, off);
        let i = self.map[index as usize];
        if end == 1 {
            a64!(self.ops
                ; cmp X(i), X(CTX_LEN)
                ; csel X(T0), X(addr), xzr, lo
            );
            return T0;
        }
        a64!(self.ops; subs X(C0), X(CTX_LEN), X(i));
        if end < 32 {
            a64!(self.ops; ccmp X(C0), end as u32, 0, hs);
        } else {
            self.mov_imm(C1, end as u64, W64);
            a64!(self.ops; ccmp X(C0), X(C1), 0, hs);
        }
        a64!(self.ops; csel X(T0), X(addr), xzr, hs);
        T0
    }

    /// `dst = ok ? src : 0` (the Spectre-v1 clamp); nothing when the clamp is off for
    /// measurement (the access then uses `src`, see `check_access`).
    fn clamp_to(&mut self, dst: u8, src: u8, ok: Cc) {
        if !self.d.clamp {
            return;
        }
        match ok {
            Cc::Hs => a64!(self.ops; csel X(dst), X(src), xzr, hs),
            Cc::Lo => a64!(self.ops; csel X(dst), X(src), xzr, lo),
            _ => a64!(self.ops; csel X(dst), X(src), xzr, ls),
        }
    }

    /// A group's base clamped in place after its widened test: unchanged when `ok` holds,
    /// else `max(0, -lo)`, so every member's address is in `[0, hi - lo)`, the never-mapped
    /// first page (`ranges::GROUP_BELOW`). For `lo < 0` the select runs on `base + lo`
    /// (`start`, when the test computed it there, else made in place; `add`/`sub` leave
    /// the flags alone), and `-lo` is added back.
    fn clamp_group_base(&mut self, b: u8, lo: i16, start: u8, ok: Cc) {
        if !self.d.clamp {
            return;
        }
        if lo >= 0 {
            self.clamp_to(b, b, ok);
            return;
        }
        let below = (-(lo as i32)) as u32;
        if start == b {
            a64!(self.ops; sub XSP(b), XSP(b), below);
        }
        self.clamp_to(b, start, ok);
        a64!(self.ops; add XSP(b), XSP(b), below);
    }

    /// In a re-entered group's checked copy: the base itself from the member's clamped
    /// address (x9 = base + off, or 0 under a mispredicted check), so a jump that skips the
    /// group's check later never sees an unchecked base, also under misspeculation.
    fn clamp_reentered_base(&mut self, base: Reg, off: i16) {
        if !self.d.clamps_reentered_base() {
            return;
        }
        // Members' offsets are in [0, 2048) (see `ranges::group_accesses`).
        a64!(self.ops; sub XSP(self.map[base as usize]), XSP(T0), off as u32);
    }

    /// The shared full check (`region_scan`) of the current instruction's access at `addr`,
    /// which comes back with x9 = the address, clamped, only when the access is allowed
    /// (else the run stops there).
    fn call_region_scan(&mut self, addr: u8, size: u32, write: bool) {
        if addr != T0 {
            a64!(self.ops; mov X(T0), X(addr));
        }
        let access = size | if write { PJ_ACCESS_WRITE } else { 0 };
        let pc = self.d.pc() as u64;
        a64!(self.ops; movz X(C1), access, lsl 32);
        self.mov_imm(C2, pc, W64);
        // x30 is kept in x5 for functions that did not save their link register.
        let scan = self.region_scan;
        self.uses_region_scan = true;
        a64!(self.ops; mov x5, x30);
        self.site(scan, Reach::Jump);
        a64!(self.ops; bl =>scan ; mov x30, x5);
    }

    /// Flags for "`addr .. addr + size` is inside the context", and the condition that
    /// holds when it is: `hs` (`len - (addr - start) >= size`, the `ccmp` failing when the
    /// subtraction borrows), or for one byte `lo` (`addr - start < len`: no end to form, an
    /// address below the start wraps past any length), one instruction fewer.
    fn ctx_check(&mut self, addr: u8, size: u32) -> Cc {
        if size == 1 {
            a64!(self.ops
                ; sub X(C0), X(addr), X(CTX_LO)
                ; cmp X(C0), X(CTX_LEN)
            );
            return Cc::Lo;
        }
        a64!(self.ops
            ; sub X(C0), X(addr), X(CTX_LO)
            ; subs X(C0), X(CTX_LEN), X(C0)
            ; ccmp X(C0), size, 0, hs
        );
        Cc::Hs
    }

    /// Flags for "x9 .. x9 + size is inside the stack block": `ls` when it is. `block - size`
    /// fits CMP's imm12 (block <= 4096, size >= 1); an address below the block wraps past it.
    fn stack_check(&mut self, addr: u8, size: u32) {
        let block = self.plan.block;
        a64!(self.ops
            ; sub X(C0), X(addr), X(STACK_LO)
            ; cmp XSP(C0), block - size
        );
    }

    fn atomic_rmw(
        &mut self,
        width: Width,
        op: AtomicOp,
        fetch: bool,
        base: Reg,
        off: i16,
        src: Reg,
    ) {
        let a = self.atomic_addr(if width == W64 { Size::DW } else { Size::W }, base, off);
        let s = self.src(src, T4);
        let r0 = self.map[0];
        if self.lse {
            self.atomic_lse(width, op, fetch, a, s, r0);
        } else {
            self.atomic_llsc(width, op, fetch, a, s, r0);
        }
    }
}

impl<'a> MemoryHooks<'a> for Codegen<'a> {
    fn load(&mut self, size: Size, sign_extend: bool, dst: Reg, base: Reg, off: i16) {
        self.mem(
            MemOp::Load { sign_extend },
            size,
            self.map[dst as usize],
            base,
            off,
        );
    }

    fn store(&mut self, size: Size, base: Reg, off: i16, src: Operand) {
        let v = match src {
            Operand::Reg(r) => self.src(r, T2),
            Operand::Imm(0) => ZR,
            Operand::Imm(imm) => {
                // Only the stored bytes matter: materialise the narrowest value.
                let v = match size {
                    Size::B => imm as u8 as u64,
                    Size::H => imm as u16 as u64,
                    Size::W => imm as u32 as u64,
                    Size::DW => imm as i64 as u64,
                };
                self.mov_imm(T2, v, if size == Size::DW { W64 } else { W32 });
                T2
            }
        };
        self.mem(MemOp::Store, size, v, base, off);
    }

    fn atomic(&mut self, size: Size, op: AtomicOp, fetch: bool, base: Reg, off: i16, src: Reg) {
        let width = if size == Size::DW { W64 } else { W32 };
        self.atomic_rmw(width, op, fetch, base, off, src);
    }

    /// The widened check of group `gi`, `[base + lo, base + hi)` in one region, then the
    /// base itself clamped in place: on the architectural path it keeps its value (the
    /// check passed), under a mispredicted branch it becomes `max(0, -lo)`, so no member
    /// can reach memory out of bounds. On failure the group's checked copy runs instead.
    fn group_check(&mut self, gi: usize, label: DynamicLabel) {
        let g = &self.plan.access.groups[gi];
        let (b, lo, span, check) = (
            self.map[g.base as usize],
            g.lo,
            (g.hi - g.lo as i32) as u32,
            g.check,
        );
        // The group's first address (the length test of `CtxConst` needs none).
        let addr = if lo == 0 || matches!(check, AccessCheck::CtxConst { .. }) {
            b
        } else if lo < 0 {
            // Members below the base (`ranges::GROUP_BELOW`): lo >= -1024, an imm12.
            a64!(self.ops; sub XSP(T0), XSP(b), (-(lo as i32)) as u32);
            T0
        } else {
            a64!(self.ops; add XSP(T0), XSP(b), lo as u32);
            T0
        };
        match check {
            AccessCheck::CtxConst { end } => {
                if end < 4096 {
                    a64!(self.ops; cmp XSP(CTX_LEN), end);
                } else {
                    self.mov_imm(C1, end.into(), W64);
                    a64!(self.ops; cmp X(CTX_LEN), X(C1));
                }
                self.branch_if(Test::Flags(Cc::Lo), label);
                self.clamp_group_base(b, lo, addr, Cc::Hs);
            }
            AccessCheck::Stack if span <= self.plan.block => {
                let block = self.plan.block;
                a64!(self.ops
                    ; sub X(C0), X(addr), X(STACK_LO)
                    ; cmp XSP(C0), block - span
                );
                self.branch_if(Test::Flags(Cc::Hi), label);
                self.clamp_group_base(b, lo, addr, Cc::Ls);
            }
            _ => {
                // The context (a sufficient test for any group: all members inside it pass).
                let inside = if span < 32 {
                    self.ctx_check(addr, span)
                } else {
                    self.mov_imm(C1, span as u64, W64);
                    a64!(self.ops
                        ; sub X(C0), X(addr), X(CTX_LO)
                        ; subs X(C0), X(CTX_LEN), X(C0)
                        ; ccmp X(C0), X(C1), 0, hs
                    );
                    Cc::Hs
                };
                self.branch_if(Test::Flags(inside.invert()), label);
                self.clamp_group_base(b, lo, addr, inside);
            }
        }
    }

    /// Everything but the address and the descriptor is the shared check's: a checked
    /// access's cold side is six to eight instructions.
    fn access_slow_path(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        resume: DynamicLabel,
        size: u32,
        write: bool,
        addr: u8,
    ) -> Result<(), CompileError> {
        a64!(self.ops; =>label);
        debug_assert_eq!(inst, self.d.cur);
        self.call_region_scan(addr, size, write);
        self.b(resume);
        Ok(())
    }
}
