//! Branch sites and their forms, the program's jumps and conditional branches, the budget's
//! charges, and the walks' entry tests and pointer clamps.

use super::{Check, Codegen, Form, B_RANGE, CB_RANGE, CJ_RANGE, FAR_RANGE, J_RANGE};
use crate::encode::{fits_signed, reg::*, Br, R3, RI};
use crate::regs::{BUDGET, CTX_LEN, CTX_START};
use dynasmrt::DynamicLabel;
use packjit_frontend::lower::JumpHooks;
use packjit_frontend::lower::{Cold, Lowering};
use packjit_frontend::walks::{Counter, Guard, GuardRegion, COUNTED_CLAMP};
use packjit_frontend::{Cond, Operand, Reg, Width};
use Width::W32;

impl Codegen<'_> {
    // ---- branch sites ---------------------------------------------------------------------------

    fn next_site(&mut self, smallest: Form) -> (usize, Form) {
        let s = self.site;
        self.site += 1;
        let form = match self.forms.get(s) {
            Some(&known) => {
                let form = known.max(smallest);
                if form != known {
                    self.forms[s] = form;
                    self.raised.push(s);
                }
                form
            }
            None => {
                self.forms.push(smallest);
                smallest
            }
        };
        (s, form)
    }

    /// The site's smallest form: `smallest`, or for a branch back to a bound label, the
    /// shortest of `reach` (forms by length, with their displacement ranges) that reaches it
    /// now. A backward distance is known while emitting, so this spares the pass the
    /// relaxation driver would otherwise need to find that out (e.g. the stop paths after
    /// all code, branching back to the entry's epilogue, or a long loop). Later growth
    /// between the branch and its target is still checked after the pass.
    fn backward_form(
        &self,
        target: DynamicLabel,
        smallest: Form,
        reach: &[(Form, (isize, isize))],
    ) -> Form {
        // The longer forms' jump sits 4 bytes past the site's start (after the inverted
        // branch); measuring every form from there keeps the choice on the safe side.
        const SLACK: isize = 4;
        let Ok(to) = self.e.asm.labels().resolve_dynamic(target) else {
            return smallest;
        };
        let disp = to.0 as isize - self.e.pos() as isize - SLACK;
        reach
            .iter()
            .find(|&&(form, (lo, hi))| form >= smallest && (lo..=hi).contains(&disp))
            .map_or(Form::Far, |&(form, _)| form)
    }

    fn check(
        &mut self,
        site: usize,
        at: usize,
        target: DynamicLabel,
        range: (isize, isize),
        grow: Form,
    ) {
        self.checks.push(Check {
            site,
            at,
            target,
            lo: range.0 as i32,
            hi: range.1 as i32,
            grow,
        });
    }

    /// `if a <k> b goto target`, in the smallest form that reaches.
    pub(super) fn branch(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel) {
        self.branch_from(k, a, b, target, Form::Compressed);
    }

    /// `branch` to the cold side of the current instruction, queued now: from the form
    /// that reaches where the cold code is expected to land (see `ColdPlacement`), so the
    /// hot-to-cold branches of a long function do not all take a second pass to grow out of
    /// B-type's ±4 KiB. A checked copy (cold code itself, its cold sides right after it)
    /// keeps the usual first guess.
    pub(super) fn cold_branch(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel) {
        let islands = &self.d.islands;
        let at_least = if self.d.in_copy() || !islands.guessing() {
            Form::Compressed
        } else {
            let distance = islands.expected_distance(self.e.pos(), self.d.cur) as isize;
            [
                (Form::Compressed, CB_RANGE),
                (Form::Short, B_RANGE),
                (Form::Near, J_RANGE),
            ]
            .iter()
            .find(|(_, (_, hi))| distance <= *hi)
            .map_or(Form::Far, |&(form, _)| form)
        };
        self.branch_from(k, a, b, target, at_least);
    }

    /// `branch`, in `at_least` or a longer form.
    fn branch_from(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel, at_least: Form) {
        let compressible =
            self.plan.c && b == ZERO && matches!(k, Br::Eq | Br::Ne) && (8..16).contains(&a);
        let smallest = if compressible {
            Form::Compressed
        } else {
            Form::Short
        }
        .max(at_least);
        let reach = [
            (Form::Compressed, CB_RANGE),
            (Form::Short, B_RANGE),
            (Form::Near, J_RANGE),
        ];
        let smallest = self.backward_form(target, smallest, &reach);
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        match form {
            Form::Compressed => {
                self.e.cb_label(k == Br::Eq, a, target);
                self.check(site, at, target, CB_RANGE, Form::Short);
            }
            Form::Short => {
                self.e.b_label(k, a, b, target);
                self.check(site, at, target, B_RANGE, Form::Near);
            }
            Form::Near => {
                // Skip the 4-byte jal when the condition is false.
                self.e.b_off(k.invert(), a, b, 8);
                let at = self.e.pos();
                self.e.jal_label(ZERO, target);
                self.check(site, at, target, J_RANGE, Form::Far);
            }
            Form::Far => {
                self.e.b_off(k.invert(), a, b, 12);
                let at = self.e.pos();
                self.e.far_jump(T6, target);
                self.check(site, at, target, FAR_RANGE, Form::Far);
            }
        }
    }

    /// `goto target` ([`Lowering::jump`]), in `smallest` or a longer form.
    pub(super) fn jump_from(&mut self, target: DynamicLabel, smallest: Form) {
        let reach = [(Form::Compressed, CJ_RANGE), (Form::Short, J_RANGE)];
        let smallest = self.backward_form(target, smallest, &reach);
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        match form {
            Form::Compressed => {
                self.e.cj_label(target);
                self.check(site, at, target, CJ_RANGE, Form::Short);
            }
            Form::Short | Form::Near => {
                self.e.jal_label(ZERO, target);
                self.check(site, at, target, J_RANGE, Form::Far);
            }
            Form::Far => {
                self.e.far_jump(T6, target);
                self.check(site, at, target, FAR_RANGE, Form::Far);
            }
        }
    }

    /// `call target` (link in ra).
    pub(super) fn call(&mut self, target: DynamicLabel) {
        self.call_link(RA, target);
    }

    /// `call target` with the return address in `link`.
    pub(super) fn call_link(&mut self, link: u8, target: DynamicLabel) {
        let smallest = self.backward_form(target, Form::Short, &[(Form::Short, J_RANGE)]);
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        if form == Form::Far {
            self.e.far_call(link, target);
            self.check(site, at, target, FAR_RANGE, Form::Far);
        } else {
            self.e.jal_label(link, target);
            self.check(site, at, target, J_RANGE, Form::Far);
        }
    }

    // ---- jumps and branches --------------------------------------------------------------------

    /// `if a <cond> src goto target` (with `negate`: if not).
    fn jcond(
        &mut self,
        width: Width,
        cond: Cond,
        a: u8,
        src: Operand,
        target: DynamicLabel,
        negate: bool,
    ) {
        let fix = |k: Br| if negate { k.invert() } else { k };
        if cond == Cond::Set {
            match src {
                Operand::Imm(imm) if fits_signed(imm as i64, 12) => self.e.ri(RI::Andi, T0, a, imm),
                Operand::Imm(imm) => {
                    self.e.li(T1, imm as i64);
                    self.e.rrr(R3::And, T0, a, T1);
                }
                Operand::Reg(r) => self.e.rrr(R3::And, T0, a, self.map(r)),
            }
            if width == W32 {
                // Only the low halves count.
                self.e.ri(RI::Addiw, T0, T0, 0);
            }
            self.branch(fix(Br::Ne), T0, ZERO, target);
            return;
        }
        // JMP32 compares the low halves (and reads nothing above them: an operand's upper
        // half may be unread, see `Layout::upper_live`). Sign-extending *both* operands serves every
        // condition: it is the signed reading, and as a map from u32 to u64 it is monotonic,
        // so unsigned order and equality are preserved too. An immediate is already the
        // sign-extended value of its low 32 bits.
        let mut a = a;
        let b = match src {
            Operand::Imm(0) => ZERO,
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
            Operand::Reg(r) => {
                let r = self.map(r);
                if width == W32 {
                    self.e.ri(RI::Addiw, T1, r, 0);
                    T1
                } else {
                    r
                }
            }
        };
        if width == W32 {
            self.e.ri(RI::Addiw, T0, a, 0);
            a = T0;
        }
        let (k, x, y) = match cond {
            Cond::Eq => (Br::Eq, a, b),
            Cond::Ne => (Br::Ne, a, b),
            Cond::Gt => (Br::Ltu, b, a),
            Cond::Ge => (Br::Geu, a, b),
            Cond::Lt => (Br::Ltu, a, b),
            Cond::Le => (Br::Geu, b, a),
            Cond::Sgt => (Br::Lt, b, a),
            Cond::Sge => (Br::Ge, a, b),
            Cond::Slt => (Br::Lt, a, b),
            Cond::Sle => (Br::Ge, b, a),
            Cond::Set => unreachable!("handled above"),
        };
        self.branch(fix(k), x, y, target);
    }

    // ---- instruction budget --------------------------------------------------------------------

    /// The current instruction's taken back-edge to `target` (at `l`), when it charges the
    /// budget: the borrow is found before the subtraction and branched on after it, so the
    /// branch is the jump back, `sltiu t4, budget, c ; addi budget, budget, -c ; beqz t4, l`,
    /// three instructions per iteration where a test, a subtraction and a `j` back took
    /// four. The stop stub adds the charge back (the budget untouched; `budget_stop`).
    /// False (and nothing emitted) when the jump charges nothing.
    fn charged_jump(&mut self, target: usize, l: DynamicLabel) -> bool {
        let Some(c) = self.d.charge(target) else {
            return false;
        };
        // `sltiu`'s immediate is sign-extended from 12 bits, then compared unsigned: exact
        // for 0 < c < 2048. Charges are below `MAX_INSNS` (`li` for the rest).
        let small = c < 2048;
        if small {
            self.e.ri(RI::Sltiu, T4, BUDGET, c as i32);
            self.e.ri(RI::Addi, BUDGET, BUDGET, -(c as i32));
        } else {
            self.e.li(T3, c as i64);
            self.e.rrr(R3::Sltu, T4, BUDGET, T3);
            self.e.rrr(R3::Sub, BUDGET, BUDGET, T3);
        }
        self.branch(Br::Eq, T4, ZERO, l);
        let stop = self.e.new_label();
        self.d.queue(Cold::Budget {
            inst: self.d.cur,
            label: stop,
            charge: c,
        });
        self.jump(stop);
        true
    }

    /// Pays `amount` from the budget, or stops at the current instruction (budget untouched)
    /// if it cannot.
    pub(super) fn charge(&mut self, amount: u64) {
        let label = self.e.new_label();
        self.d.queue(Cold::Budget {
            inst: self.d.cur,
            label,
            charge: amount,
        });
        if amount == 1 {
            self.cold_branch(Br::Eq, BUDGET, ZERO, label);
            self.e.ri(RI::Addi, BUDGET, BUDGET, -1);
        } else {
            self.e.li(T3, amount as i64);
            self.cold_branch(Br::Ltu, BUDGET, T3, label);
            self.e.rrr(R3::Sub, BUDGET, BUDGET, T3);
        }
    }

    // ---- walks (`packjit_frontend::walks`) -----------------------------------------------------

    /// With Zbb a walk's clamp saturates instead of masking: min(p, r10 + last) is p itself
    /// on the architectural path and stays inside the frame on any other. A guarded walk has
    /// no compile-time `last`: it clamps with the mask. The limit is loop-invariant: kept in
    /// a second dead register when there is one (`Some`).
    fn walk_limit(&self, k: usize) -> (bool, Option<u8>) {
        let w = &self.d.access.walks[k];
        let saturate = self.plan.zbb && w.guard.is_none();
        let limit = match (saturate, self.d.walk_shadow(k), w.limit) {
            (true, Some(_), Some(l)) => Some(self.map(l)),
            _ => None,
        };
        (saturate, limit)
    }
}

impl Codegen<'_> {
    /// A counted walk's entry test (`packjit_frontend::walks::Counter`), with `p` the
    /// pointer and `j` the counter on entry:
    /// `q = p + lo - (r10 - 512) <= 512 - (end - lo)` and `j - 1 <= q >> shift` (unsigned),
    /// both as set-on-less-than bits or-ed into one verdict and one branch; under a
    /// mispredicted branch the loop starts from `COUNTED_CLAMP` (the verdict as a mask, no
    /// fence).
    fn counted_guard(&mut self, p: u8, c: Counter, g: Guard, fail: DynamicLabel) {
        let ctr = self.map(c.reg);
        let size = packjit_frontend::STACK_SIZE as i64;
        let room = size - (g.end as i64 - c.lo);
        // t0 = q; t2 = room < q; t3 = (q >> shift) < j - 1.
        self.e.rrr(R3::Sub, T0, p, self.map(packjit_frontend::R10));
        self.add_imm(T0, T0, size + c.lo, T1);
        self.e.ri(RI::Addi, T1, ZERO, room as i32);
        self.e.rrr(R3::Sltu, T2, T1, T0);
        if g.shift != 0 {
            self.e.ri(RI::Srli, T0, T0, g.shift as i32);
        }
        self.e.ri(RI::Addi, T3, ctr, -1);
        self.e.rrr(R3::Sltu, T3, T0, T3);
        self.e.rrr(R3::Or, T2, T2, T3);
        self.cold_branch(Br::Ne, T2, ZERO, fail);
        if self.d.clamp {
            self.e.rrr(R3::Sub, T3, ZERO, T2);
            self.clamp_where(p, T3);
        }
    }

    /// `p = COUNTED_CLAMP` where `mask` is all ones, `p` unchanged where it is 0, with no
    /// branch (t0 is scratch).
    fn clamp_where(&mut self, p: u8, mask: u8) {
        self.e.li(T0, COUNTED_CLAMP);
        self.e.rrr(R3::Xor, T0, T0, p);
        self.e.rrr(R3::And, T0, T0, mask);
        self.e.rrr(R3::Xor, p, p, T0);
    }
}

impl<'a> JumpHooks<'a> for Codegen<'a> {
    /// `goto target`: charged first when it is a back-edge; nothing for a
    /// jump to the next instruction.
    fn goto(&mut self, target: usize) {
        let l = self.d.jump_label(target);
        if !self.charged_jump(target, l) && target != self.d.cur + 1 {
            self.jump(l);
        }
    }

    /// `if dst <cond> src goto target`.
    fn branch(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, target: usize) {
        let l = self.d.jump_label(target);
        if self.d.charge(target).is_some() {
            // Taken back-edge: pay first, on the taken path only.
            let skip = self.e.new_label();
            self.jcond(width, cond, self.map(dst), src, skip, true);
            self.charged_jump(target, l);
            self.e.bind(skip);
        } else {
            self.jcond(width, cond, self.map(dst), src, l, false);
        }
    }

    fn branch_to(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, label: DynamicLabel) {
        self.jcond(width, cond, self.map(dst), src, label, false);
    }

    fn exit(&mut self, func: usize) {
        let l = self.d.epilogues[func];
        self.jump(l);
    }

    /// A walk's entry, before the jump to its head: the pointer copied into the walk's
    /// shadow register, when it has one (the clamp writes the copy there, see
    /// `Walk::shadow`, and the first iteration's copy is the exact entry value), and the
    /// saturating clamp's limit.
    fn walk_entry(&mut self, k: usize) {
        let w = self.d.access.walks[k];
        let p = self.map(w.ptr);
        if let Some(s) = self.d.walk_shadow(k) {
            self.e.mv(self.map(s), p);
        }
        if let (_, Some(l)) = self.walk_limit(k) {
            self.add_imm(l, self.map(packjit_frontend::R10), w.last, T3);
        }
    }

    /// A guarded walk's entry test (`packjit_frontend::walks::Guard`), as one verdict with
    /// no branch until it is complete (t2 = 0 when the walk stays inside the context): on
    /// failure the loop's checked copy runs (at `fail`); on success the pointer is masked
    /// with the verdict (itself architecturally, 0 under a mispredicted branch, from where a
    /// speculative walk stays in the unmapped first 64 KiB).
    fn walk_guard(&mut self, k: usize, g: Guard, fail: DynamicLabel) {
        let w = self.d.access.walks[k];
        if let Some(c) = w.counter {
            return self.counted_guard(self.map(w.ptr), c, g, fail);
        }
        let (p, b) = (self.map(w.ptr), self.map(w.bound));
        let (end, bias, shift) = (g.end as i32, g.bias as i32, g.shift as i32);
        // t0 = q = p - start; t1 = len - end; t2 = (len < end) | (len - end < q).
        match g.region {
            GuardRegion::Context => {
                self.e.rrr(R3::Sub, T0, p, CTX_START);
                self.e.ri(RI::Addi, T1, CTX_LEN, -end);
                self.e.ri(RI::Sltiu, T2, CTX_LEN, end);
                self.e.rrr(R3::Sltu, T3, T1, T0);
                self.e.rrr(R3::Or, T2, T2, T3);
            }
            GuardRegion::Frame => {
                // The frame is [r10 - 512, r10), and 512 >= end.
                let size = packjit_frontend::STACK_SIZE as i32;
                self.e.rrr(R3::Sub, T0, p, self.map(packjit_frontend::R10));
                self.e.ri(RI::Addi, T0, T0, size);
                self.e.ri(RI::Addi, T1, ZERO, size - end);
                self.e.rrr(R3::Sltu, T2, T1, T0);
            }
        }
        // t1 = (len - end - q) >> shift; t0 = (b - p - bias) >> shift, a `!=` walk's
        // remainder (low bits) failing the test.
        self.e.rrr(R3::Sub, T1, T1, T0);
        self.e.rrr(R3::Sub, T0, b, p);
        if bias != 0 {
            self.e.ri(RI::Addi, T0, T0, -bias);
        }
        if shift != 0 {
            if w.cont == Cond::Ne {
                self.e.ri(RI::Andi, T3, T0, (1 << shift) - 1);
                self.e.rrr(R3::Sltu, T3, ZERO, T3);
                self.e.rrr(R3::Or, T2, T2, T3);
            }
            self.e.ri(RI::Srli, T1, T1, shift);
            self.e.ri(RI::Srli, T0, T0, shift);
        }
        self.e.rrr(R3::Sltu, T3, T1, T0);
        self.e.rrr(R3::Or, T2, T2, T3);
        self.cold_branch(Br::Ne, T2, ZERO, fail);
        if self.d.clamp {
            self.e.ri(RI::Addi, T2, T2, -1);
            self.e.rrr(R3::And, p, p, T2);
        }
    }

    /// The clamp a walk's back-edge lands on: redoes the loop's test and, with no branch,
    /// gives the shadow the pointer or 0 (or, without a shadow, zeroes the pointer itself)
    /// when the loop should have ended (a mispredicted back-edge).
    fn walk_clamp(&mut self, k: usize) {
        let w = self.d.access.walks[k];
        if let Some(c) = w.counter {
            // Architecturally the counter is in `1 ..= j₀` here; at 0 or below (signed) the
            // back-edge was mispredicted: t3 = all ones then (the sign of j - 1; the counter
            // only counts down from a tested j ≥ 1, so it never wraps).
            let (p, ctr) = (self.map(w.ptr), self.map(c.reg));
            self.e.ri(RI::Addi, T3, ctr, -1);
            self.e.ri(RI::Srai, T3, T3, 63);
            self.clamp_where(p, T3);
            return;
        }
        let (p, b) = (self.map(w.ptr), self.map(w.bound));
        let dst = self.d.walk_shadow(k).map_or(p, |s| self.map(s));
        let (saturate, limit) = self.walk_limit(k);
        if saturate {
            let l = limit.unwrap_or_else(|| {
                self.add_imm(T3, self.map(packjit_frontend::R10), w.last, T3);
                T3
            });
            self.e.minu(dst, p, l);
            return;
        }
        // t3 = all ones while the loop goes on, else 0. An exact `!=` walk meets its bound
        // from below, so `p < b` is the same test on the architectural path (and zeroes
        // every p past the bound under misspeculation). For `<` that is the sign of p - b,
        // exact because walk pointers and bounds are user addresses, far closer than 2^63
        // apart (and under qemu far cheaper than `sltu`'s set-on-condition).
        if w.cont == Cond::Le {
            self.e.rrr(R3::Sltu, T3, b, p);
            self.e.ri(RI::Addi, T3, T3, -1);
        } else {
            self.e.rrr(R3::Sub, T3, p, b);
            self.e.ri(RI::Srai, T3, T3, 63);
        }
        self.e.rrr(R3::And, dst, p, T3);
    }
}
