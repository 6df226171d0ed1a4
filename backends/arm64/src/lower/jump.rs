//! Conditional jumps, walks (entry, guard, clamp) and the budget charged on back-edges.

use super::*;
use packjit_frontend::walks::{Counter, COUNTED_CLAMP};

impl Codegen<'_> {
    /// A counted walk's entry test (`packjit_frontend::walks::Counter`), with `p` the
    /// pointer and `j` the counter on entry:
    /// `q = p + lo - (r10 - 512) <= 512 - (end - lo)` and `j - 1 <= q >> shift` (unsigned).
    /// The first test's failure turns the second's operands into a sure failure (`j - 1` all
    /// ones, `q` 0) with `csinv`/`csel`, so one branch decides, and the select of the pointer
    /// after it reads the same flags: under a mispredicted branch the loop starts from
    /// `COUNTED_CLAMP`, with no fence.
    fn counted_guard(&mut self, p: u8, c: Counter, g: Guard, fail: DynamicLabel) {
        let ctr = self.map[c.reg as usize];
        let room = STACK_SIZE as i64 - (g.end as i64 - c.lo);
        // FP is r10 - 512, the frame's first byte.
        a64!(self.ops; sub X(C0), X(p), X(FP));
        self.add_imm(C0, C0, c.lo, W64);
        self.mov_imm(C1, room as u64, W64);
        a64!(self.ops
            ; cmp X(C0), X(C1)
            ; sub XSP(T0), XSP(ctr), 1
            ; csinv X(T0), X(T0), xzr, ls
            ; csel X(C0), X(C0), xzr, ls
        );
        if g.shift != 0 {
            a64!(self.ops; lsr X(C0), X(C0), g.shift);
        }
        a64!(self.ops; cmp X(T0), X(C0));
        self.branch_if(Test::Flags(Cc::Hi), fail);
        if self.d.clamp {
            // `movz`/`movk` leave the flags alone.
            self.mov_imm(T1, COUNTED_CLAMP as u64, W64);
            a64!(self.ops; csel X(p), X(p), X(T1), ls);
        }
    }

    /// A conditional jump to instruction `target` from instruction `i`. A taken back-edge
    /// in budget mode charges the budget first: the inverted test skips the charge.
    pub(crate) fn jcond(
        &mut self,
        width: Width,
        cond: Cond,
        dst: Reg,
        src: Operand,
        target: usize,
    ) {
        let Some(test) = self.jtest(width, cond, dst, src) else {
            return;
        };
        let label = self.d.jump_label(target);
        if self.d.charge(target).is_some() {
            let skip = self.ops.new_dynamic_label();
            self.branch_if(invert(test), skip);
            self.charged_jump(target, label);
            a64!(self.ops; =>skip);
        } else {
            self.branch_if(test, label);
        }
    }

    /// The register a walk bounded by r10 keeps r10 in (`Walk::limit`, set on entry), so
    /// its back-edge compares with no `add` per iteration; `None` elsewhere (and in a
    /// guarded walk's checked copy, which is entered before the entry sets it).
    fn walk_r10(&self, w: &Walk) -> Option<u8> {
        (w.bound == R10 && !self.d.in_copy())
            .then_some(w.limit)
            .flatten()
            .map(|l| self.map[l as usize])
    }

    /// [`Self::src`] for a conditional jump's operands: r10 from the walk's register at a
    /// walk's back-edge ([`Self::walk_r10`]).
    fn jump_src(&mut self, r: Reg, tmp: u8) -> u8 {
        if r == R10 {
            let walk = self.plan.access.walk_of_back_edge(self.d.cur);
            if let Some(l) = walk.and_then(|k| self.walk_r10(&self.plan.access.walks[k])) {
                return l;
            }
        }
        self.src(r, tmp)
    }

    /// `dst = cc ? src : 0`.
    fn csel_or_zero(&mut self, dst: u8, src: u8, cc: Cc) {
        match cc {
            Cc::Eq => a64!(self.ops; csel X(dst), X(src), xzr, eq),
            Cc::Ne => a64!(self.ops; csel X(dst), X(src), xzr, ne),
            Cc::Hs => a64!(self.ops; csel X(dst), X(src), xzr, hs),
            Cc::Lo => a64!(self.ops; csel X(dst), X(src), xzr, lo),
            Cc::Hi => a64!(self.ops; csel X(dst), X(src), xzr, hi),
            Cc::Ls => a64!(self.ops; csel X(dst), X(src), xzr, ls),
            Cc::Ge => a64!(self.ops; csel X(dst), X(src), xzr, ge),
            Cc::Lt => a64!(self.ops; csel X(dst), X(src), xzr, lt),
            Cc::Gt => a64!(self.ops; csel X(dst), X(src), xzr, gt),
            Cc::Le => a64!(self.ops; csel X(dst), X(src), xzr, le),
        }
    }

    /// Sets flags (or picks a compare-and-branch form) for a conditional jump; `None` when
    /// the jump can never be taken.
    fn jtest(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand) -> Option<Test> {
        let d = self.jump_src(dst, T0);
        let imm = match src {
            Operand::Reg(r) => {
                let s = self.jump_src(r, T1);
                return Some(self.jcmp_reg(width, cond, d, s));
            }
            Operand::Imm(imm) => imm,
        };
        let v = imm as i64;
        let bits = if width == W64 {
            v as u64
        } else {
            imm as u32 as u64
        };
        Some(match cond {
            Cond::Eq | Cond::Ne if v == 0 => Test::Zero {
                reg: d,
                width,
                zero: cond == Cond::Eq,
            },
            // x & 0 is never non-zero: the branch is never taken.
            Cond::Set if bits == 0 => return None,
            Cond::Set if bits.is_power_of_two() => Test::Bit {
                reg: d,
                bit: bits.trailing_zeros(),
                set: true,
            },
            Cond::Set => {
                if logical_ok(bits, width) {
                    if width == W64 {
                        a64!(self.ops; tst X(d), bits);
                    } else {
                        a64!(self.ops; tst W(d), bits as u32);
                    }
                } else {
                    self.mov_imm(T1, bits, width);
                    if width == W64 {
                        a64!(self.ops; tst X(d), X(T1));
                    } else {
                        a64!(self.ops; tst W(d), W(T1));
                    }
                }
                Test::Flags(Cc::Ne)
            }
            _ => {
                self.cmp_imm(d, v, width);
                Test::Flags(Cc::from_bpf(cond))
            }
        })
    }

    fn jcmp_reg(&mut self, width: Width, cond: Cond, d: u8, s: u8) -> Test {
        match (cond, width) {
            (Cond::Set, W64) => a64!(self.ops; tst X(d), X(s)),
            (Cond::Set, W32) => a64!(self.ops; tst W(d), W(s)),
            (_, W64) => a64!(self.ops; cmp X(d), X(s)),
            (_, W32) => a64!(self.ops; cmp W(d), W(s)),
        }
        Test::Flags(Cc::from_bpf(cond))
    }

    // ------------------------------------------------------------ budget

    /// The current instruction's taken back-edge to `target` (at `label`), when it charges
    /// the budget: the charge's own branch is the jump, `subs ; b.hs label ; b stop`, one
    /// branch per iteration for both rather than a `b.lo` over to the stop and a `b` back.
    /// False (and nothing emitted) when the jump charges nothing.
    fn charged_jump(&mut self, target: usize, label: DynamicLabel) -> bool {
        let Some(c) = self.d.charge(target) else {
            return false;
        };
        self.subtract_charge(c);
        self.branch_if(Test::Flags(Cc::Hs), label);
        let stop = self.budget_stop_label(c);
        self.b(stop);
        true
    }

    /// `budget -= c`, or stop at this pc with the budget untouched when `c` exceeds it.
    /// Hot path: SUBS + B.LO (not taken); the cold side adds `c` back.
    pub(crate) fn charge(&mut self, c: u64) {
        self.subtract_charge(c);
        let stop = self.budget_stop_label(c);
        self.branch_if(Test::Flags(Cc::Lo), stop);
    }

    /// `subs budget, budget, c`: borrows (LO) exactly when `c` exceeds the budget.
    fn subtract_charge(&mut self, c: u64) {
        if let Some((imm, false)) = fits_imm12(c as i64) {
            a64!(self.ops; subs X(BUDGET), XSP(BUDGET), imm);
        } else {
            self.mov_imm(C0, c, W64);
            a64!(self.ops; subs X(BUDGET), X(BUDGET), X(C0));
        }
    }

    /// The cold stop of a charge `c` at this pc that borrowed (it adds `c` back).
    fn budget_stop_label(&mut self, c: u64) -> DynamicLabel {
        let label = self.ops.new_dynamic_label();
        self.d.queue(Cold::Budget {
            inst: self.d.cur,
            label,
            charge: c,
        });
        label
    }
}

impl<'a> JumpHooks<'a> for Codegen<'a> {
    fn goto(&mut self, target: usize) {
        let label = self.d.jump_label(target);
        if !self.charged_jump(target, label) {
            self.b(label);
        }
    }

    fn branch(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, target: usize) {
        // A branch to the next instruction is a no-op whichever way it goes.
        if target != self.d.cur + 1 {
            self.jcond(width, cond, dst, src, target);
        }
    }

    fn branch_to(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, label: DynamicLabel) {
        if let Some(test) = self.jtest(width, cond, dst, src) {
            self.branch_if(test, label);
        }
    }

    fn exit(&mut self, func: usize) {
        self.b(self.d.epilogues[func]);
    }

    /// A walk's entry (`packjit_frontend::walks`): the pointer's first copy into the walk's
    /// shadow (exact, it needs no clamp) and r10 into the walk's register.
    fn walk_entry(&mut self, k: usize) {
        let w = self.plan.access.walks[k];
        let p = self.map[w.ptr as usize];
        if let Some(s) = self.d.walk_shadow(k).map(|s| self.map[s as usize]) {
            a64!(self.ops; mov X(s), X(p));
        }
        if let Some(l) = self.walk_r10(&w) {
            a64!(self.ops; add XSP(l), XSP(FP), STACK_SIZE as u32);
        }
    }

    /// A guarded walk's entry test (`packjit_frontend::walks::Guard`), with no branch until
    /// its combined verdict: the context bounds via `ccmp`, then the walk's extent. On
    /// failure the loop's checked copy runs ([`Cold::Walk`]); on success the pointer is
    /// selected on the verdict's flags (itself architecturally, 0 under a mispredicted
    /// branch, from where a speculative walk stays in the unmapped first 64 KiB).
    fn walk_guard(&mut self, k: usize, g: Guard, fail: DynamicLabel) {
        let w = self.plan.access.walks[k];
        if let Some(c) = w.counter {
            return self.counted_guard(self.map[w.ptr as usize], c, g, fail);
        }
        let p = self.map[w.ptr as usize];
        let b = self.src(w.bound, T1);
        let (end, bias, shift) = (g.end as u32, g.bias as u32, g.shift);
        match g.region {
            // q = p - ctx_start; len - end (hs when len >= end); then q <= len - end.
            GuardRegion::Context => a64!(self.ops
                ; sub X(C0), X(p), X(CTX_LO)
                ; subs X(C1), XSP(CTX_LEN), end
                ; ccmp X(C0), X(C1), 2, hs
            ),
            // q = p - (r10 - 512); the frame's length is 512 >= end.
            GuardRegion::Frame => {
                self.mov_imm(C1, (STACK_SIZE as u32 - end) as u64, W64);
                a64!(self.ops
                    ; sub X(C0), X(p), X(FP)
                    ; cmp X(C0), X(C1)
                );
            }
        }
        a64!(self.ops
            ; sub X(C1), X(C1), X(C0)
            ; sub X(T0), X(b), X(p)
        );
        if bias != 0 {
            a64!(self.ops; sub XSP(T0), XSP(T0), bias);
        }
        if shift != 0 {
            a64!(self.ops; lsr X(C1), X(C1), shift);
            if w.cont == Cond::Ne {
                a64!(self.ops; ror X(T0), X(T0), shift);
            } else {
                a64!(self.ops; lsr X(T0), X(T0), shift);
            }
        }
        a64!(self.ops; ccmp X(T0), X(C1), 2, ls);
        self.branch_if(Test::Flags(Cc::Hi), fail);
        if self.d.clamp {
            a64!(self.ops; csel X(p), X(p), xzr, ls);
        }
    }

    /// The pointer clamp a walk's back-edge lands on: it redoes the loop's test and, with
    /// no branch, gives the shadow the pointer or 0 (or, without a shadow, zeroes the
    /// pointer itself) when the loop should have ended (a mispredicted back-edge).
    fn walk_clamp(&mut self, k: usize) {
        let w = self.plan.access.walks[k];
        if let Some(c) = w.counter {
            // Architecturally the counter is in `1 ..= j₀` here; at 0 or below (signed) the
            // back-edge was mispredicted.
            let (p, ctr) = (self.map[w.ptr as usize], self.map[c.reg as usize]);
            a64!(self.ops; cmp XSP(ctr), 0);
            self.mov_imm(T0, COUNTED_CLAMP as u64, W64);
            a64!(self.ops; csel X(p), X(p), X(T0), gt);
            return;
        }
        let p = self.map[w.ptr as usize];
        let shadow = self.d.walk_shadow(k).map(|s| self.map[s as usize]);
        if let Some(s) = shadow {
            // The copy from the sign of the pointer's distance to the bound, with no flags:
            // s = p & ((p - b) >> 63) is p while p < b and 0 from b on (`<=`: the complement
            // of the sign of b - p). Exact because walk pointers and bounds are user
            // addresses, far closer than 2^63 apart. Two instructions instead of one `csel`,
            // but still off the pointer's chain, free of the back-edge's flags (no compare
            // to redo after a budget charge), and much cheaper under qemu's translation.
            let b = match self.walk_r10(&w) {
                Some(l) => l,
                None => self.src(w.bound, T1),
            };
            if w.cont == Cond::Le {
                a64!(self.ops; sub X(T0), X(b), X(p) ; bic X(s), X(p), X(T0), asr 63);
            } else {
                a64!(self.ops; sub X(T0), X(p), X(b) ; and X(s), X(p), X(T0), asr 63);
            }
            return;
        }
        let Op::Jcond { dst, .. } = self.d.prog.insts[w.back_edge].op else {
            unreachable!("a walk's back-edge is a conditional jump");
        };
        // The back-edge compares two registers (`cmp dst, src`, never a compare-and-branch
        // form), and only its taken side reaches here: without a budget charge in between,
        // its flags are still live, and its own condition is "the loop goes on".
        let budget = self.d.mode.counts_budget();
        if budget {
            let b = match self.walk_r10(&w) {
                Some(l) => l,
                None => self.src(w.bound, T1),
            };
            a64!(self.ops; cmp X(p), X(b));
        }
        let ptr_first = budget || dst == w.ptr;
        let cc = match (w.cont, ptr_first) {
            (Cond::Ne, _) => Cc::Ne,
            (Cond::Lt, true) => Cc::Lo,
            (Cond::Lt, false) => Cc::Hi,
            (_, true) => Cc::Ls,
            (_, false) => Cc::Hs,
        };
        self.csel_or_zero(p, p, cc);
    }
}
