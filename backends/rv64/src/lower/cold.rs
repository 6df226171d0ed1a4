//! Cold code and the per-program stubs it ends in: an access's slow path into the shared
//! region scan, the budget's stop, the stop path every stop leaves by, and the local copies
//! of the stubs a long function's cold code gets when the program's end is out of reach.

use super::{Codegen, Form, ACCESS_BITS};
use crate::encode::{reg::*, Br, Mem, R3, RI};
use crate::regs::{BUDGET, CTX_LEN, CTX_START, ENV, STACK_LEN, STACK_START};
use dynasmrt::DynamicLabel;
use packjit_frontend::lower::Lowering;
use packjit_frontend::lower::StopHooks;
use packjit_frontend::Op;
use packjit_plugin_api::abi::{
    PJ_ENV_ENTRY_SP, PJ_ENV_REGIONS, PJ_ENV_REGION_COUNT, PJ_ENV_STOP_ACCESS, PJ_ENV_STOP_ADDR,
    PJ_ENV_STOP_KIND, PJ_ENV_STOP_PC, PJ_STOP_BUDGET, PJ_STOP_OUT_OF_BOUNDS,
};
use packjit_plugin_api::CompileError;
use std::convert::Infallible;

impl Codegen<'_> {
    /// The per-program stubs: the region scan, and the stop paths.
    pub(super) fn emit_stops(&mut self) {
        if !self.layout.can_stop {
            return;
        }
        if self.uses_region_stub {
            self.region_scan();
        }
        if self.d.mode.counts_budget() {
            self.e.bind(self.stop_budget);
            self.e.li(A6, PJ_STOP_BUDGET as i64);
            self.e.li(T0, 0);
            self.e.li(T1, 0);
            // Falls through into the stop path.
        }
        // Stop: a6 = kind, a7 = pc, t0 = address (or callx id), t1 = access. Unwinds from any
        // depth: sp back to the entry frame, then the entry's epilogue restores what the
        // entry saved (which covers every callee-saved register any function changes).
        self.e.bind(self.stop);
        self.e.store(Mem::W, A6, ENV, PJ_ENV_STOP_KIND);
        self.e.store(Mem::W, T1, ENV, PJ_ENV_STOP_ACCESS);
        self.e.store(Mem::D, A7, ENV, PJ_ENV_STOP_PC);
        self.e.store(Mem::D, T0, ENV, PJ_ENV_STOP_ADDR);
        self.e.load(Mem::D, SP, ENV, PJ_ENV_ENTRY_SP);
        let exit = self.d.epilogues[0];
        if self.e.asm.labels().resolve_dynamic(exit).is_ok() {
            self.jump(exit);
        } else {
            // A copy of the stubs inside the entry function (see `stubs_if_far`), which is
            // long enough to need one: its epilogue is ahead, likely beyond `jal`.
            self.jump_from(exit, Form::Far);
        }
    }

    /// The shared check of an access whose inline test failed: the context, the stack block
    /// (when the program has one), then `env.regions`, for one holding `[t0, t0 + size)`
    /// (and writable for a write); t5 = pc << ACCESS_BITS | access, return address in t6.
    /// Returns t3 = 0 (the verdict the caller masks with, so a mispredicted "found" still
    /// masks to 0), or stops.
    ///
    /// Its branches stay within the stub and the stop path right after it, so none grows to
    /// the far form (which would clobber t6).
    fn region_scan(&mut self) {
        let (top, found, back, fail) = (
            self.e.new_label(),
            self.e.new_label(),
            self.e.new_label(),
            self.e.new_label(),
        );
        self.e.bind(self.region_stub);
        // t1 = size; per region, e = t0 - start + size is inside when size <= e <= len.
        self.e.ri(RI::Andi, T1, T5, 0xff);
        let regions: &[(u8, u8)] = if self.layout.block > 0 {
            &[(CTX_START, CTX_LEN), (STACK_START, STACK_LEN)]
        } else {
            &[(CTX_START, CTX_LEN)]
        };
        for &(start, len) in regions {
            self.e.rrr(R3::Sub, T4, T0, start);
            self.e.rrr(R3::Add, T4, T4, T1);
            self.e.rrr(R3::Sltu, T3, T4, T1);
            self.e.rrr(R3::Sltu, T4, len, T4);
            self.e.rrr(R3::Or, T3, T3, T4);
            self.branch(Br::Eq, T3, ZERO, back);
        }
        self.e.load(Mem::D, T2, ENV, PJ_ENV_REGIONS);
        self.e.load(Mem::D, T3, ENV, PJ_ENV_REGION_COUNT);
        self.e.bind(top);
        self.branch(Br::Eq, T3, ZERO, fail);
        self.e.load(Mem::D, T4, T2, 0);
        self.e.rrr(R3::Sub, T4, T0, T4);
        self.e.ri(RI::Andi, T1, T5, 0xff);
        self.e.rrr(R3::Add, T4, T4, T1);
        self.e.rrr(R3::Sltu, T1, T4, T1);
        self.e.load(Mem::D, A6, T2, 8);
        self.e.rrr(R3::Sltu, A6, A6, T4);
        self.e.rrr(R3::Or, T1, T1, A6);
        // A write needs PJ_REGION_WRITABLE (bit 0 of flags): bad |= write & !writable (a6 is
        // 0 or 1, so the pc above the write bit in t4 does not matter).
        self.e.load(Mem::D, A6, T2, 16);
        self.e.ri(RI::Xori, A6, A6, 1);
        self.e.ri(RI::Andi, A6, A6, 1);
        self.e.ri(RI::Srli, T4, T5, 8);
        self.e.rrr(R3::And, A6, A6, T4);
        self.e.rrr(R3::Or, T1, T1, A6);
        self.branch(Br::Eq, T1, ZERO, found);
        self.e.ri(RI::Addi, T2, T2, 24);
        self.e.ri(RI::Addi, T3, T3, -1);
        self.jump(top);
        self.e.bind(found);
        self.e.mv(T3, T1);
        self.e.bind(back);
        self.e.jump_reg(T6);
        self.e.bind(fail);
        self.e.li(A6, PJ_STOP_OUT_OF_BOUNDS as i64);
        self.e.ri(RI::Srli, A7, T5, ACCESS_BITS as i32);
        self.e.ri(RI::Andi, T1, T5, (1 << ACCESS_BITS) - 1);
        let stop = self.stop;
        self.jump(stop);
    }
}

impl<'a> StopHooks<'a> for Codegen<'a> {
    /// The budget cannot pay for the jump or call of instruction `inst`: stop there.
    fn budget_stop(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        charge: u64,
    ) -> Result<(), CompileError> {
        self.uses_stubs = true;
        self.e.bind(label);
        // A back-edge subtracts its charge before branching on the borrow it found first
        // (`charged_jump`): added back here, so the stop leaves the budget as it was. A
        // call's charge is tested before it is subtracted (`charge`).
        if !matches!(self.d.prog.insts[inst].op, Op::CallLocal { .. }) {
            if charge < 2048 {
                self.e.ri(RI::Addi, BUDGET, BUDGET, charge as i32);
            } else {
                self.e.li(T3, charge as i64);
                self.e.rrr(R3::Add, BUDGET, BUDGET, T3);
            }
        }
        self.e.li(A7, self.d.prog.insts[inst].pc as i64);
        let l = self.stop_budget;
        self.jump(l);
        Ok(())
    }

    /// The stop path's unwind, past its stores: the entry's epilogue is behind (the entry
    /// is the first function), so the jump's form is known.
    fn stop_recorded(&mut self) {
        self.e.load(Mem::D, SP, ENV, PJ_ENV_ENTRY_SP);
        let exit = self.d.epilogues[0];
        self.jump(exit);
    }

    fn isa_cold(&mut self, cold: Infallible) -> Result<(), CompileError> {
        match cold {}
    }

    /// After cold code placed before instruction `next`: when the program's stubs are
    /// expected beyond `jal`'s reach, the cold code that uses them gets its own copy, here;
    /// later cold code uses the next copy.
    fn cold_placed(&mut self, next: usize) {
        if self.uses_stubs && self.d.islands.local_stubs_due(self.e.pos(), next) {
            self.emit_stops();
            self.stop = self.e.new_label();
            self.stop_budget = self.e.new_label();
            self.region_stub = self.e.new_label();
            self.uses_stubs = false;
            self.uses_region_stub = false;
        }
    }

    fn program_end(&mut self) -> Result<(), CompileError> {
        if let Some(d) = self.dispatch {
            self.e.bind(d);
            self.callx_dispatch();
        }
        self.emit_stops();
        self.pooled.clear();
        for (value, l) in std::mem::take(&mut self.pool) {
            self.e.data_u64s(l, &[value]);
        }
        Ok(())
    }
}
