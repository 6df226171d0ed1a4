//! Jumps, the budget charge of back-edges, and the walks' entry tests and pointer clamps
//! (`packjit_frontend::walks`; where they go is the driver's).

use super::cold::Stop;
use super::{cc_of, sz_of, Codegen, CTX_START8};
use crate::encode::{Arith, Cc, Gpr, Label, Sz};
use crate::regs::*;
use dynasmrt::{dynasm, DynasmApi};
use packjit_frontend::lower::JumpHooks;
use packjit_frontend::walks::{Counter, Guard, GuardRegion, COUNTED_CLAMP};
use packjit_frontend::{Cond, Op, Operand, Reg, Width, STACK_SIZE};
use packjit_plugin_api::abi::PJ_ENV_BUDGET;

impl Codegen<'_> {
    /// A taken back-edge to `target` (at `l`) that charges the budget: the charge's own
    /// branch is the jump, `sub [budget], c ; jae l ; jmp stop`, so a loop's iteration runs
    /// one branch for both rather than a `jb` over to the stop and a `jmp` back. False (and
    /// nothing emitted) when the jump charges nothing.
    ///
    /// Inside a loop that counts in a register (`Driver::budget_register`), the charge is
    /// `sub reg, c ; mov [budget], reg` (a store, never a load of the budget: memory stays
    /// current for everything that reads it) and its stub puts both back.
    fn charged_jump(&mut self, target: usize, l: Label) -> bool {
        let Some(c) = self.d.charge(target) else {
            return false;
        };
        let stop = self.charge_only(c);
        self.e.jump(Some(Cc::Ae), l);
        let stop = self.stop_label(stop, self.d.pc());
        self.cold_jump(None, stop);
        true
    }

    /// The charge of `amount`, its borrow in CF (a `mov` leaves the flags alone), and the
    /// stop that takes it back.
    fn charge_only(&mut self, amount: u64) -> Stop {
        let charge = amount as u32;
        match self.d.budget_register() {
            Some(r) => {
                let reg = host(r);
                self.e.arith_ri(Arith::Sub, Sz::B64, reg, amount as i64);
                self.e.store(Sz::B64, ENV, PJ_ENV_BUDGET, reg);
                Stop::BudgetInRegister { charge, reg }
            }
            None => {
                // `sub QWORD [r12 + disp8], imm8` stays table-driven: dynasm-rs 5.1 lists
                // the imm32 form (0x81) of memory-operand sub before the imm8 one (0x83),
                // so even a `BYTE` immediate is encoded as an imm32 (three bytes longer).
                // Charges are below `MAX_INSNS`, within imm32.
                self.e
                    .arith_mi(Arith::Sub, ENV, PJ_ENV_BUDGET, amount as i64);
                Stop::Budget { charge }
            }
        }
    }

    /// The flags a conditional jump `dst cond src` tests.
    pub(super) fn compare(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand) {
        let sz = sz_of(width);
        let d = host(dst);
        match src {
            Operand::Reg(s) if cond == Cond::Set => self.e.test_rr(sz, d, host(s)),
            Operand::Reg(s) => self.e.cmp_rr(sz, d, host(s)),
            Operand::Imm(0) if matches!(cond, Cond::Eq | Cond::Ne) => {
                // Two bytes shorter than `cmp d, 0`.
                self.e.test_rr(sz, d, d);
            }
            Operand::Imm(i) if cond == Cond::Set => {
                // `test r8, imm8` sees exactly the bits a small positive mask can hit.
                let sz = if (0..=0xff).contains(&i) { Sz::B8 } else { sz };
                self.e.test_ri(sz, d, i as i64);
            }
            Operand::Imm(i) => self.e.cmp_ri(sz, d, i as i64),
        }
    }

    /// Budget: stop at `pc` (budget untouched) if `amount` exceeds it, else subtract.
    ///
    /// One read-modify-write: `sub` borrows (CF) exactly when `amount` exceeds the budget,
    /// and the stop stub adds the charge back ([`Stop::Budget`]), so a stop still reports
    /// the budget that was left. A `cmp` before the `sub` would read the counter twice per
    /// back-edge.
    pub(super) fn charge(&mut self, pc: usize, amount: u64) {
        let stop = self.charge_only(amount);
        let stop = self.stop_label(stop, pc);
        self.cold_jump(Some(Cc::B), stop);
    }
}

impl Codegen<'_> {
    /// A counted walk's entry test (`packjit_frontend::walks::Counter`), with `p` the
    /// pointer and `j` the counter on entry:
    /// `q = p + lo - (rbp - 512) <= 512 - (end - lo)` and `j - 1 <= q >> shift` (unsigned).
    /// The first test's failure turns the second's operands into a sure failure (`j - 1` all
    /// ones, `q` 0) with selects, so one branch decides, and the select of the pointer after
    /// it reads the same flags: under a mispredicted branch the loop starts from
    /// `COUNTED_CLAMP`, with no fence.
    fn counted_guard(&mut self, p: Gpr, c: Counter, g: Guard, at: Label) {
        let ctr = host(c.reg);
        let bias = STACK_SIZE as i32 + c.lo as i32;
        let room = STACK_SIZE as i32 - (g.end as i32 - c.lo as i32);
        let shift = g.shift as i8;
        self.mov_rr(Sz::B64, T11, p);
        self.e.sub_rr(Sz::B64, T11, RBP);
        self.e.add_ri(Sz::B64, T11, bias as i64);
        self.mov_rr(Sz::B64, T10, ctr);
        self.e.sub_ri(Sz::B64, T10, 1);
        self.e.cmp_ri(Sz::B64, T11, room as i64);
        // `mov`s leave the flags alone.
        self.e.mov_r64_simm32(T9, -1);
        self.e.cmov(Cc::A, T10, T9);
        self.e.mov_r32_imm(T9, 0);
        self.e.cmov(Cc::A, T11, T9);
        if shift != 0 {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; shr r11, shift));
        }
        self.e.cmp_rr(Sz::B64, T10, T11);
        self.cold_jump(Some(Cc::A), at);
        if self.d.clamp {
            self.e.mov_r32_imm(T9, COUNTED_CLAMP as u32);
            self.e.cmov(Cc::A, p, T9);
        }
    }
}

impl<'a> JumpHooks<'a> for Codegen<'a> {
    fn load_budget(&mut self, reg: Reg) {
        self.e.load(Sz::B64, host(reg), ENV, PJ_ENV_BUDGET);
    }

    fn goto(&mut self, target: usize) {
        let l = self.d.jump_label(target);
        if !self.charged_jump(target, l) {
            self.e.jump(None, l);
        }
    }

    fn branch(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, target: usize) {
        let cc = cc_of(cond);
        let l = self.d.jump_label(target);
        let Some(charge) = self.d.charge(target) else {
            self.compare(width, cond, dst, src);
            self.e.jump(Some(cc), l);
            return;
        };
        if self.d.access.walk_of_back_edge(self.d.cur).is_none() {
            // Charged only when taken, behind an inverted jump.
            self.compare(width, cond, dst, src);
            let skip = self.e.label();
            self.e.jump(Some(cc.invert()), skip);
            self.charged_jump(target, l);
            self.e.bind(skip);
            return;
        }
        // A walk's back-edge (`packjit_frontend::walks`: the one jump to its head, taken on
        // every iteration but the last) charges before its test and takes the charge back
        // where the loop ends, once per loop: the loop goes on with one conditional jump
        // instead of an inverted jump over the charge and a `jmp`, and the test's flags are
        // live at the clamp it lands on, which reads them instead of making the test again.
        // Nothing reads the budget between the charge and its refund. A charge that borrows
        // goes to the pc's stop stub, which takes it back and makes the test
        // ([`Stop::ClosingBackEdge`]), so the run stops exactly where the reference does:
        // only if the back-edge is taken. Other back-edges keep the form above: the refund
        // and the stub's test cost about ten bytes a loop, and measured no faster on the
        // peers' loops without a clamp (docs/BENCHMARKS.md).
        let ended = self.e.label();
        let stop = self.stop_label(
            Stop::ClosingBackEdge {
                charge: charge as u32,
                width,
                cond,
                dst,
                src,
                ended,
            },
            self.d.pc(),
        );
        self.e
            .arith_mi(Arith::Sub, ENV, PJ_ENV_BUDGET, charge as i64);
        self.cold_jump(Some(Cc::B), stop);
        self.compare(width, cond, dst, src);
        self.e.jump(Some(cc), l);
        self.e
            .arith_mi(Arith::Add, ENV, PJ_ENV_BUDGET, charge as i64);
        self.e.bind(ended);
    }

    fn branch_to(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand, label: Label) {
        self.compare(width, cond, dst, src);
        self.e.jump(Some(cc_of(cond)), label);
    }

    /// `select_element`'s `cmp` of the index with the bound still sets the flags (`lea` and
    /// `cmov` write none): `jae` is the select's NULL, one instruction for `test` + `je`.
    fn branch_if_selected_null(&mut self, _dst: Reg, to: Label) {
        self.e.jump(Some(Cc::Ae), to);
    }

    fn exit(&mut self, k: usize) {
        if self.bare_return(k) {
            self.e.ret();
        } else {
            let l = self.d.epilogues[k];
            self.e.jump(None, l);
        }
    }

    fn walk_entry(&mut self, walk: usize) {
        if let Some(s) = self.d.walk_shadow(walk) {
            // mov s, p: the first iteration's pointer is exact, its copy needs no clamp.
            let p = host(self.d.access.walks[walk].ptr);
            self.e.mov_rr(Sz::B64, host(s), p);
        }
    }

    /// A guarded walk's entry test (`packjit_frontend::walks::Guard`): the context bounds,
    /// then the walk's extent; any failure runs the loop's checked copy (at `at`, queued by
    /// the driver). Then `lfence`, once per loop entry: nothing of the unchecked loop runs
    /// before the test's branches have resolved, so a mispredicted one cannot run it on a
    /// bad walk.
    fn walk_guard(&mut self, k: usize, g: Guard, at: Label) {
        let w = self.d.access.walks[k];
        if let Some(c) = w.counter {
            return self.counted_guard(host(w.ptr), c, g, at);
        }
        let (p, b) = (host(w.ptr), host(w.bound));
        let (end, bias, shift) = (g.end as i32, g.bias as i32, g.shift as i8);
        // r9 = len - end, r11 = q = p - start; r9 = len - end - q.
        self.mov_rr(Sz::B64, T11, p);
        match g.region {
            GuardRegion::Context => {
                self.ctx_len();
                self.e
                    .asm(1, |ops| dynasm!(ops ; .arch x64 ; sub r9, DWORD end));
                self.cold_jump(Some(Cc::B), at);
                self.e.asm(
                    1,
                    |ops| dynasm!(ops ; .arch x64 ; sub r11, QWORD [BYTE r12 + CTX_START8]),
                );
            }
            GuardRegion::Frame => {
                // The frame is [rbp - 512, rbp), and 512 >= end.
                let room = STACK_SIZE as i32 - end;
                self.e.asm(3, |ops| {
                    dynasm!(ops ; .arch x64
                        ; mov r9d, DWORD room
                        ; sub r11, rbp
                        ; add r11, DWORD STACK_SIZE as i32
                    )
                });
            }
        }
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; sub r9, r11));
        self.cold_jump(Some(Cc::B), at);
        // r10 = b - p - bias: the last head value's offset from p, before rounding down.
        self.mov_rr(Sz::B64, T10, b);
        self.e.sub_rr(Sz::B64, T10, p);
        if bias != 0 {
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; sub r10, DWORD bias));
        }
        if shift != 0 {
            let ne = w.cont == Cond::Ne;
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64 ; shr r9, shift);
                if ne {
                    dynasm!(ops ; .arch x64 ; ror r10, shift);
                } else {
                    dynasm!(ops ; .arch x64 ; shr r10, shift);
                }
            });
        }
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp r10, r9));
        self.cold_jump(Some(Cc::A), at);
        if self.d.clamp {
            self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; lfence));
        }
    }

    /// The pointer clamp a walk's back-edge lands on. It redoes the loop's test and, with
    /// no branch, gives the shadow the pointer or 0 (or, without a shadow, zeroes the
    /// pointer itself) when the loop should have ended (a mispredicted back-edge).
    fn walk_clamp(&mut self, k: usize) {
        // Only the loop's back-edge lands here, and its test is the last thing it does, a
        // budget charge included (`JumpHooks::branch`): its flags are live, and its own
        // condition is "the loop goes on".
        let w = self.d.access.walks[k];
        if w.counter.is_some() {
            // Architecturally the counter is in `1 ..= j₀` here; at 0 or below (signed) the
            // back-edge was mispredicted. The back-edge's `test ctr, ctr` (64-bit: see
            // `walks::counted`) set the flags `cmovle` reads.
            self.e.mov_r32_imm(T9, COUNTED_CLAMP as u32);
            self.e.cmov(Cc::Le, host(w.ptr), T9);
            return;
        }
        let p = host(w.ptr);
        let shadow = self.d.walk_shadow(k).map(host);
        let Op::Jcond { cond, dst, .. } = self.d.prog.insts[w.back_edge].op else {
            unreachable!("a walk's back-edge is a conditional jump");
        };
        // The back-edge compared two registers, `cmp dst, src`.
        let ptr_first = dst == w.ptr;
        if let Some(s) = shadow {
            // The copy wants the order, `p < b` (`<=` for `Le`; see `Walk::shadow`), from
            // the same flags (`mov`, not `xor`, leaves them alone). Both off the pointer's own
            // chain.
            let inside = match (w.cont, ptr_first) {
                (Cond::Le, true) => Cc::Be,
                (Cond::Le, false) => Cc::Ae,
                (_, true) => Cc::B,
                (_, false) => Cc::A,
            };
            self.e.mov_r32_imm(s, 0);
            self.e.cmov(inside, s, p);
            return;
        }
        // `mov`, not `xor`: it leaves the flags alone.
        self.e.mov_r32_imm(T9, 0);
        self.e.cmov(cc_of(cond).invert(), p, T9);
    }
}
