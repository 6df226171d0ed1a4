//! Helper calls (called or inlined), `callx` and its shared dispatch, local calls, and the
//! per-CPU address instruction.

use super::Codegen;
use crate::encode::{fits_signed, reg::*, Br, Mem, R3, RI};
use dynasmrt::DynamicLabel;
use packjit_frontend::analysis::{
    callx_plan, helper_code, CpuId, HelperCode, InlineHelper, PerCpuPlan, CALL_CHARGE,
};
use packjit_frontend::lower::Lowering;
use packjit_frontend::lower::{CallHooks, TargetCall};
use packjit_frontend::{Operand, Reg};
use packjit_plugin_api::abi::{
    PJ_CLOCK_MULT_FRAC, PJ_CLOCK_MULT_INT, PJ_CLOCK_OFFSET, PJ_PERCPU_ARRAYS, PJ_PERCPU_ARRAY_SIZE,
    PJ_PERCPU_BASE, PJ_PERCPU_COUNT, PJ_PERCPU_CPUS, PJ_PERCPU_CPU_ID_OFFSET, PJ_PERCPU_ENTRIES,
    PJ_PERCPU_SLOT_SIZE, PJ_PERCPU_VALUE_SIZE, PJ_STOP_UNKNOWN_CALLX,
};
use packjit_plugin_api::CompileError;
use packjit_plugin_api::HelperEntry;

impl Codegen<'_> {
    /// `callx` dispatch, shared by all `callx` sites: the helper id arrives in t2 and the
    /// site's pc in a7; a match tail-jumps to the helper (which returns straight to the call
    /// site); no match stops the program with `PJ_STOP_UNKNOWN_CALLX` (address = the id).
    /// Inlined helpers are compared for first; called ones are found through a table of
    /// addresses after the routine, or compared for one by one when their ids are too few
    /// or too sparse (`analysis::callx_plan`).
    pub(super) fn callx_dispatch(&mut self) {
        let plan = callx_plan(self.plan.helpers);
        let unknown = self.e.new_label();
        let cases: Vec<DynamicLabel> = plan.compared.iter().map(|_| self.e.new_label()).collect();
        // Ids are u32; a register value with upper bits set matches no helper.
        for (h, &l) in plan.compared.iter().zip(&cases) {
            self.e.li(T1, h.id as i64);
            self.branch(Br::Eq, T2, T1, l);
        }
        let table = self.e.new_label();
        if let Some(t) = &plan.table {
            // Unsigned bound (a huge id fails it), then the address, 0 for a hole.
            self.e.li(T1, t.len() as i64);
            self.branch(Br::Geu, T2, T1, unknown);
            self.e.la(T0, table);
            self.e.ri(RI::Slli, T1, T2, 3);
            self.e.rrr(R3::Add, T0, T0, T1);
            self.e.load(Mem::D, T0, T0, 0);
            self.branch(Br::Eq, T0, ZERO, unknown);
            self.e.jump_reg(T0);
        }
        self.e.bind(unknown);
        self.e.mv(T0, T2);
        // r0 means nothing after a stop; u64::MAX keeps the ABI v1 reading (`PJ_CALLX_UNKNOWN`)
        // for hosts that do not look at `stop_kind` yet.
        self.e.li(self.map(0), -1);
        self.e.li(A6, PJ_STOP_UNKNOWN_CALLX as i64);
        self.e.li(T1, 0);
        let stop = self.stop;
        self.jump(stop);
        for (h, &l) in plan.compared.iter().zip(&cases) {
            self.e.bind(l);
            match helper_code(h) {
                HelperCode::Call(addr) => {
                    self.e.li(T0, addr as i64);
                    self.e.jump_reg(T0);
                }
                HelperCode::Inline(inline) => {
                    // The site expects the result in a0, like a helper's (a0-a4 are dead
                    // after a call).
                    self.inline_helper(inline, A0);
                    self.e.ret();
                }
            }
        }
        if let Some(t) = &plan.table {
            // After a return: never fallen into.
            self.e.data_u64s(table, t);
        }
    }

    /// Per-CPU array lookup (r1 = a0 array id, r2 = a1 element index) against the host's
    /// table at `table`, result in `rd`: unsigned bounds checks on the id, the index and the
    /// CPU (each failing to 0), then `base + cpu * slot_size + index * value_size`. The CPU
    /// is the rseq `cpu_id` off `tp`, like the inlined helper 8. Uses t0-t3.
    fn inline_percpu_lookup(&mut self, table: u64, rd: u8) {
        let null = self.e.new_label();
        let done = self.e.new_label();
        let arr = |field: i32| PJ_PERCPU_ARRAYS + field;
        self.e.li(T1, table as i64);
        self.e.load(Mem::D, T0, T1, PJ_PERCPU_COUNT);
        self.branch(Br::Geu, A0, T0, null);
        self.e.li(T2, PJ_PERCPU_ARRAY_SIZE as i64);
        self.e.rrr(R3::Mul, T2, A0, T2);
        self.e.rrr(R3::Add, T2, T2, T1);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_ENTRIES));
        self.branch(Br::Geu, A1, T0, null);
        self.e.load(Mem::D, T0, T1, PJ_PERCPU_CPU_ID_OFFSET);
        self.e.rrr(R3::Add, T0, T0, TP);
        self.e.load(Mem::Wu, T3, T0, 0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_CPUS));
        self.branch(Br::Geu, T3, T0, null);
        // A mispredicted bound would index with whatever the rseq area holds: the CPU
        // becomes 0 there (t0 = cpu < cpus ? -1 : 0), so the result is NULL or one of the
        // array's elements on every path (the caller masked the index alike).
        self.e.rrr(R3::Sltu, T0, T3, T0);
        self.e.rrr(R3::Sub, T0, ZERO, T0);
        self.e.rrr(R3::And, T3, T3, T0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_SLOT_SIZE));
        self.e.rrr(R3::Mul, T3, T3, T0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_BASE));
        self.e.rrr(R3::Add, T3, T3, T0);
        self.e.load(Mem::D, T0, T2, arr(PJ_PERCPU_VALUE_SIZE));
        self.e.rrr(R3::Mul, T0, A1, T0);
        self.e.rrr(R3::Add, rd, T3, T0);
        self.jump(done);
        self.e.bind(null);
        self.e.li(rd, 0);
        self.e.bind(done);
    }

    /// The body of an inlined helper , result in `rd`; uses
    /// t0-t3 only.
    fn inline_helper(&mut self, how: InlineHelper, rd: u8) {
        match how {
            InlineHelper::RseqCpuId { offset } => {
                // glibc's rseq area sits at a fixed offset from tp in every thread; the
                // kernel rewrites its cpu_id after each migration.
                if fits_signed(offset, 12) {
                    self.e.load(Mem::Wu, rd, TP, offset as i32);
                } else {
                    self.e.li(T0, offset);
                    self.e.rrr(R3::Add, T0, T0, TP);
                    self.e.load(Mem::Wu, rd, T0, 0);
                }
            }
            InlineHelper::PerCpuLookup { table } => self.inline_percpu_lookup(table, rd),
            InlineHelper::CounterClock { scale } => {
                // ns = t * mult_int + hi64(t * mult_frac) + offset, scale read from the host.
                self.e.rdtime(T0);
                self.e.li(T1, scale as i64);
                self.e.load(Mem::D, T2, T1, PJ_CLOCK_MULT_FRAC);
                self.e.mulhu(T2, T0, T2);
                self.e.load(Mem::D, T3, T1, PJ_CLOCK_MULT_INT);
                self.e.rrr(R3::Mul, T0, T0, T3);
                self.e.rrr(R3::Add, T0, T0, T2);
                self.e.load(Mem::D, T3, T1, PJ_CLOCK_OFFSET);
                self.e.rrr(R3::Add, rd, T0, T3);
            }
        }
    }
}

impl<'a> CallHooks<'a> for Codegen<'a> {
    fn call_helper(&mut self, h: &HelperEntry) -> Result<(), CompileError> {
        match helper_code(h) {
            HelperCode::Call(addr) => {
                self.e.li(T0, addr as i64);
                self.e.call_reg(T0);
                self.e.mv(A5, A0);
            }
            // r1-r5 untouched: nothing of the host to hide.
            HelperCode::Inline(inline) => self.inline_helper(inline, A5),
        }
        Ok(())
    }

    /// `callx reg`, through the shared dispatch.
    fn callx(&mut self, reg: Reg) {
        let pc = self.d.pc();
        self.e.mv(T2, self.map(reg));
        // The dispatch names this pc if the id turns out unknown.
        self.e.li(A7, pc as i64);
        let d = self.dispatch.expect("dispatch exists when callx does");
        self.call(d);
        self.e.mv(A5, A0);
    }

    /// A call of the function starting at instruction `target`.
    fn call_local(&mut self, target: usize) {
        if self.d.mode.counts_budget() {
            self.charge(CALL_CHARGE);
        }
        // r1-r5 are already in a0-a4 and r0 comes back in a5: nothing to marshal.
        let sub = self.d.prog.subprog_of(target);
        let l = self.d.entries[sub];
        self.call(l);
    }

    /// The budget lives in s11 (`BUDGET`) while the code runs: `env` gets it for the target,
    /// which counts on from there, and gives back what is left.
    fn call_runner(&mut self, runner: &HelperEntry) -> Result<(), CompileError> {
        use crate::regs::{BUDGET, ENV};
        use packjit_plugin_api::abi::PJ_ENV_BUDGET;
        let budget = self.d.mode.counts_budget();
        if budget {
            self.e.store(Mem::D, BUDGET, ENV, PJ_ENV_BUDGET);
        }
        self.call_helper(runner)?;
        if budget {
            self.e.load(Mem::D, BUDGET, ENV, PJ_ENV_BUDGET);
        }
        Ok(())
    }

    /// r0 (a5) holds the target's entry and r3 (a2) its record. The saved words go below
    /// sp, an even count keeping it 16-byte aligned at the call; the budget goes through
    /// `env` as for the runner.
    fn call_tail_target(&mut self, call: &TargetCall) {
        use crate::regs::{BUDGET, ENV};
        use packjit_plugin_api::abi::{PJ_ENV_BUDGET, PJ_ENV_CTX_END, PJ_ENV_CTX_START};
        let (r0, r3) = (self.map(0), self.map(3));
        let frame = 8 * call.saved.len() as i32;
        self.e.ri(RI::Addi, SP, SP, -frame);
        for (k, &off) in call.saved.iter().enumerate() {
            self.e.load(Mem::D, T0, ENV, off);
            self.e.store(Mem::D, T0, SP, 8 * k as i32);
        }
        for &(from, to) in call.switched {
            self.e.load(Mem::D, T0, r3, from);
            self.e.store(Mem::D, T0, ENV, to);
        }
        let budget = self.d.mode.counts_budget();
        if budget {
            self.e.store(Mem::D, BUDGET, ENV, PJ_ENV_BUDGET);
        }
        self.e.load(Mem::D, A0, ENV, PJ_ENV_CTX_START);
        self.e.load(Mem::D, A1, ENV, PJ_ENV_CTX_END);
        self.e.rrr(R3::Sub, A1, A1, A0);
        self.e.mv(A2, ENV);
        self.e.call_reg(r0);
        self.e.mv(r0, A0);
        for (k, &off) in call.saved.iter().enumerate() {
            self.e.load(Mem::D, T0, SP, 8 * k as i32);
            self.e.store(Mem::D, T0, ENV, off);
        }
        self.e.ri(RI::Addi, SP, SP, frame);
        if budget {
            self.e.load(Mem::D, BUDGET, ENV, PJ_ENV_BUDGET);
        }
    }

    /// The per-CPU address instruction: `dst = src + cpu * slot_size` of array `array` in the
    /// table of the `PJ_HELPER_PERCPU_OFFSET` entry, `dst = src` when `array >= count` or
    /// `cpu >= cpus` (so the offset never leaves the registered area). The CPU comes the way
    /// helper 8 does: the rseq load off `tp`, or a call with the caller-saved eBPF registers
    /// (r0 = a5, r1–r5 = a0–a4) stored around it, so nothing but `dst` changes.
    fn mov_percpu(&mut self, dst: Reg, src: Reg, array: Operand) -> Result<(), CompileError> {
        let PerCpuPlan { table, cpu } = self.d.percpu()?;
        match cpu {
            CpuId::Call(addr) => {
                // 48 bytes keep sp 16-byte aligned, as the psABI requires at the call; an id
                // in a register (the blinding rewrite's a7) is kept too, in 64.
                const SAVED: [u8; 7] = [A0, A1, A2, A3, A4, A5, A7];
                let (saved, frame) = match array {
                    Operand::Reg(_) => (&SAVED[..], 64),
                    Operand::Imm(_) => (&SAVED[..6], 48),
                };
                self.e.ri(RI::Addi, SP, SP, -frame);
                for (k, &r) in saved.iter().enumerate() {
                    self.e.store(Mem::D, r, SP, 8 * k as i32);
                }
                self.e.li(T0, addr as i64);
                self.e.call_reg(T0);
                self.e.mv(T3, A0);
                for (k, &r) in saved.iter().enumerate() {
                    self.e.load(Mem::D, r, SP, 8 * k as i32);
                }
                self.e.ri(RI::Addi, SP, SP, frame);
            }
            CpuId::Rseq { offset } => self.inline_helper(InlineHelper::RseqCpuId { offset }, T3),
        }
        // cpu in t3; the array's address is computed at run time.
        let done = self.e.new_label();
        match array {
            Operand::Imm(id) => self.e.li(T2, id as u32 as i64),
            // An id that is no `u32` (sign-extended by the rewrite) fails the count test.
            Operand::Reg(r) => self.e.mv(T2, self.map(r)),
        }
        self.e.li(T4, 0);
        self.e.li(T1, table as i64);
        self.e.load(Mem::D, T0, T1, PJ_PERCPU_COUNT);
        self.branch(Br::Geu, T2, T0, done);
        self.e.li(T0, PJ_PERCPU_ARRAY_SIZE as i64);
        self.e.rrr(R3::Mul, T2, T2, T0);
        self.e.rrr(R3::Add, T1, T1, T2);
        self.e
            .load(Mem::D, T0, T1, PJ_PERCPU_ARRAYS + PJ_PERCPU_CPUS);
        self.branch(Br::Geu, T3, T0, done);
        self.e
            .load(Mem::D, T0, T1, PJ_PERCPU_ARRAYS + PJ_PERCPU_SLOT_SIZE);
        self.e.rrr(R3::Mul, T4, T3, T0);
        self.e.bind(done);
        self.e.rrr(R3::Add, self.map(dst), self.map(src), T4);
        Ok(())
    }
}
