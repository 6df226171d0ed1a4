//! Helper calls, `callx`, inlined built-ins and per-CPU data.

use super::*;

impl Codegen<'_> {
    /// The body of an inlined helper ; r1-r5 stay intact.
    pub(crate) fn inline_helper(&mut self, how: InlineHelper) {
        let r0 = self.map[0];
        match how {
            InlineHelper::RseqCpuId { offset } => {
                // mrs x9, tpidr_el0: glibc's thread pointer; the rseq area sits at a fixed
                // offset from it, and the kernel rewrites its cpu_id after every migration.
                self.sysreg_read(T0, MRS_TPIDR_EL0);
                if (-256..256).contains(&offset) {
                    a64!(self.ops; ldur W(r0), [X(T0), offset as i32]);
                } else if offset >= 0 && offset % 4 == 0 && offset < 4 * 4096 {
                    a64!(self.ops; ldr W(r0), [X(T0), offset as u32]);
                } else {
                    self.mov_imm(T1, offset as u64, W64);
                    a64!(self.ops; ldr W(r0), [X(T0), X(T1)]);
                }
            }
            InlineHelper::PerCpuLookup { table } => self.inline_percpu_lookup(table),
            InlineHelper::CounterClock { scale } => {
                // isb first, as the kernel's counter read: without it the counter may be
                // sampled before earlier instructions (a time stamp taken "too early").
                a64!(self.ops; isb);
                self.sysreg_read(T0, MRS_CNTVCT_EL0);
                self.mov_imm(T1, scale, W64);
                a64!(self.ops
                    ; ldr X(T2), [X(T1), PJ_CLOCK_MULT_FRAC as u32]
                    ; umulh X(T3), X(T0), X(T2)
                    ; ldr X(T2), [X(T1), PJ_CLOCK_MULT_INT as u32]
                    ; madd X(T3), X(T0), X(T2), X(T3)
                    ; ldr X(T2), [X(T1), PJ_CLOCK_OFFSET as u32]
                    ; add X(r0), X(T3), X(T2)
                );
            }
        }
    }

    /// Per-CPU array lookup (r1 = x0 array id, r2 = x1 element index) against the host's
    /// table at `table`: unsigned bounds checks on the id, the index and the CPU (each
    /// failing to r0 = 0), then `base + cpu * slot_size + index * value_size` with two
    /// `madd`s. The CPU is the rseq `cpu_id` through `tpidr_el0`, like the inlined helper 8.
    fn inline_percpu_lookup(&mut self, table: u64) {
        let (r0, r1, r2) = (self.map[0], self.map[1], self.map[2]);
        let null = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        self.mov_imm(T1, table, W64);
        a64!(self.ops
            ; ldr X(T0), [X(T1), PJ_PERCPU_COUNT as u32]
            ; cmp X(r1), X(T0)
            ; b.hs =>null
        );
        self.mov_imm(T2, PJ_PERCPU_ARRAY_SIZE as u64, W64);
        a64!(self.ops
            ; madd X(T2), X(r1), X(T2), X(T1)
            ; add XSP(T2), XSP(T2), PJ_PERCPU_ARRAYS as u32
            ; ldr X(T0), [X(T2), PJ_PERCPU_ENTRIES as u32]
            ; cmp X(r2), X(T0)
            ; b.hs =>null
            ; ldr X(T0), [X(T1), PJ_PERCPU_CPU_ID_OFFSET as u32]
        );
        self.sysreg_read(T3, MRS_TPIDR_EL0);
        a64!(self.ops
            ; ldr W(T3), [X(T3), X(T0)]
            ; ldr X(T0), [X(T2), PJ_PERCPU_CPUS as u32]
            ; cmp X(T3), X(T0)
            ; b.hs =>null
            // A mispredicted bound would index with whatever the rseq area holds: the
            // CPU becomes 0 there, so the result is NULL or one of the array's elements on
            // every path (the caller masked the index alike).
            ; csel X(T3), X(T3), xzr, lo
            ; ldr X(T0), [X(T2), PJ_PERCPU_SLOT_SIZE as u32]
            ; ldr X(T4), [X(T2), PJ_PERCPU_BASE as u32]
            ; madd X(T4), X(T3), X(T0), X(T4)
            ; ldr X(T0), [X(T2), PJ_PERCPU_VALUE_SIZE as u32]
            ; madd X(r0), X(r2), X(T0), X(T4)
            ; b =>done
            ; =>null
            ; mov X(r0), xzr
            ; =>done
        );
    }

    /// `mrs Xt, <sysreg>`: `base` is the MRS encoding with Rt = 0.
    fn sysreg_read(&mut self, rt: u8, base: u32) {
        a64!(self.ops; .u32 base | rt as u32);
    }
}

impl<'a> CallHooks<'a> for Codegen<'a> {
    fn call_helper(&mut self, h: &HelperEntry) -> Result<(), CompileError> {
        match helper_code(h) {
            HelperCode::Call(addr) => {
                // BPF r1-r5 already sit in x0-x4; the helper's x0 result becomes r0.
                self.mov_imm(T0, addr, W64);
                a64!(self.ops; blr X(T0) ; mov X(self.map[0]), X(RET));
            }
            HelperCode::Inline(inline) => self.inline_helper(inline),
        }
        Ok(())
    }

    /// `callx reg`: compare the id in the register against each registered helper and call
    /// the match; no match stops the program with `PJ_STOP_UNKNOWN_CALLX` (stop_addr = id).
    fn callx(&mut self, reg: Reg) {
        let r = self.src(reg, T0);
        let plan = callx_plan(self.helpers);
        let call = self.ops.new_dynamic_label();
        let done = self.ops.new_dynamic_label();
        let unknown = self.ops.new_dynamic_label();
        // Compares are on the full 64-bit register: 0x1_0000_0005 is not helper 5.
        for h in &plan.compared {
            self.cmp_imm_u64(r, h.id as u64);
            a64!(self.ops; b.ne >next);
            match helper_code(h) {
                HelperCode::Call(addr) => {
                    self.mov_imm(T2, addr, W64);
                    a64!(self.ops; b =>call);
                }
                HelperCode::Inline(inline) => {
                    self.inline_helper(inline);
                    a64!(self.ops; b =>done);
                }
            }
            a64!(self.ops; next:);
        }
        let table = self.ops.new_dynamic_label();
        if let Some(t) = &plan.table {
            // Unsigned bound (a huge or "negative" id fails it), then the address, 0 for a
            // hole.
            self.cmp_imm_u64(r, t.len() as u64);
            a64!(self.ops
                ; b.hs =>unknown
                ; adr X(T2), =>table
                ; ldr X(T2), [X(T2), X(r), lsl 3]
                ; cbnz X(T2), =>call
            );
        }
        // No helper has this id: stop at this pc with the id as the address.
        a64!(self.ops; =>unknown);
        if r != T0 {
            a64!(self.ops; mov X(T0), X(r));
        }
        let pc = self.d.prog.insts[self.d.cur].pc as u64;
        self.mov_imm(C1, PJ_STOP_UNKNOWN_CALLX as u64, W64);
        self.mov_imm(C2, pc, W64);
        self.b(self.stop);
        if let Some(t) = &plan.table {
            // Data after the unconditional branch, never executed: 8-byte aligned for the
            // load (the padding is `udf #0`); counted as data, not instructions.
            let start = self.off();
            self.ops.align(8, 0);
            a64!(self.ops; =>table);
            for &addr in t {
                self.ops.push_u64(addr);
            }
            self.data.push(start..self.off());
        }
        a64!(self.ops; =>call ; blr X(T2) ; mov X(self.map[0]), X(RET) ; =>done);
    }

    fn call_local(&mut self, target: usize) {
        let sub = self.d.prog.subprog_of(target);
        let entry = self.d.entries[sub];
        if self.d.mode.counts_budget() {
            self.charge(CALL_CHARGE);
        }
        // Arguments in x0-x4, result in x7: the BPF calling convention is native.
        // In the sandbox's stack block the callee's frame is the 512 bytes below.
        let block = self.plan.block > 0;
        if block {
            a64!(self.ops; sub XSP(FP), XSP(FP), STACK_SIZE as u32);
        }
        self.site(entry, Reach::Jump);
        a64!(self.ops; bl =>entry);
        if block {
            a64!(self.ops; add XSP(FP), XSP(FP), STACK_SIZE as u32);
        }
    }

    /// The budget lives in x27 (`BUDGET`) while the code runs: `env` gets it for the target,
    /// which counts on from there, and gives back what is left.
    fn call_runner(&mut self, runner: &HelperEntry) -> Result<(), CompileError> {
        use packjit_plugin_api::abi::PJ_ENV_BUDGET;
        let budget = self.d.mode.counts_budget();
        if budget {
            a64!(self.ops; str X(BUDGET), [X(ENV), PJ_ENV_BUDGET as u32]);
        }
        self.call_helper(runner)?;
        if budget {
            a64!(self.ops; ldr X(BUDGET), [X(ENV), PJ_ENV_BUDGET as u32]);
        }
        Ok(())
    }

    /// r0 (x7) holds the target's entry and r3 (x2) its record. The saved words go below
    /// sp, an even count keeping it 16-byte aligned; the budget goes through `env` as for
    /// the runner.
    fn call_tail_target(&mut self, call: &TargetCall) {
        use packjit_plugin_api::abi::{PJ_ENV_BUDGET, PJ_ENV_CTX_START};
        let (r0, r3) = (self.map[0], self.map[3]);
        let frame = 8 * call.saved.len() as u32;
        a64!(self.ops; sub sp, sp, frame);
        for (k, &off) in call.saved.iter().enumerate() {
            a64!(self.ops
                ; ldr X(T0), [X(ENV), off as u32]
                ; str X(T0), [sp, 8 * k as u32]
            );
        }
        for &(from, to) in call.switched {
            a64!(self.ops
                ; ldr X(T0), [X(r3), from as u32]
                ; str X(T0), [X(ENV), to as u32]
            );
        }
        let budget = self.d.mode.counts_budget();
        if budget {
            a64!(self.ops; str X(BUDGET), [X(ENV), PJ_ENV_BUDGET as u32]);
        }
        // ctx_end follows ctx_start in env: one ldp.
        a64!(self.ops
            ; ldp x0, x1, [X(ENV), PJ_ENV_CTX_START]
            ; sub x1, x1, x0
            ; mov x2, X(ENV)
            ; blr X(r0)
            ; mov X(r0), X(RET)
        );
        for (k, &off) in call.saved.iter().enumerate() {
            a64!(self.ops
                ; ldr X(T0), [sp, 8 * k as u32]
                ; str X(T0), [X(ENV), off as u32]
            );
        }
        a64!(self.ops; add sp, sp, frame);
        if budget {
            a64!(self.ops; ldr X(BUDGET), [X(ENV), PJ_ENV_BUDGET as u32]);
        }
    }

    /// The per-CPU address instruction: `dst = src + cpu * slot_size` of array `array` in the
    /// table of the `PJ_HELPER_PERCPU_OFFSET` entry, `dst = src` when `array >= count` or
    /// `cpu >= cpus` (so the offset never leaves the registered area). The CPU comes the way
    /// helper 8 does: the rseq load through `tpidr_el0`, or a call with the caller-saved BPF
    /// registers (r0 = x7, r1–r5 = x0–x4) stored around it, so nothing but `dst` changes.
    fn mov_percpu(&mut self, dst: Reg, src: Reg, array: Operand) -> Result<(), CompileError> {
        let PerCpuPlan { table, cpu } = self.d.percpu()?;
        // An id in a register (the blinding rewrite's AX, x13, where the CPU id goes
        // below) moves to T2 first, and is kept in the save area across a call.
        let id_in_register = match array {
            Operand::Reg(r) => {
                a64!(self.ops; mov X(T2), X(self.map[r as usize]));
                true
            }
            Operand::Imm(_) => false,
        };
        match cpu {
            CpuId::Rseq { offset } => {
                self.sysreg_read(T0, MRS_TPIDR_EL0);
                if (-256..256).contains(&offset) {
                    a64!(self.ops; ldur W(T4), [X(T0), offset as i32]);
                } else {
                    self.mov_imm(T1, offset as u64, W64);
                    a64!(self.ops; ldr W(T4), [X(T0), X(T1)]);
                }
            }
            CpuId::Call(addr) => {
                // 48 bytes keep sp 16-byte aligned, as AAPCS64 requires at the call.
                let r0 = self.map[0];
                if id_in_register {
                    a64!(self.ops; stp x0, x1, [sp, -64]! ; str X(T2), [sp, 48]);
                } else {
                    a64!(self.ops; stp x0, x1, [sp, -48]!);
                }
                a64!(self.ops
                    ; stp x2, x3, [sp, 16]
                    ; stp x4, X(r0), [sp, 32]
                );
                self.mov_imm(T2, addr, W64);
                a64!(self.ops
                    ; blr X(T2)
                    ; mov X(T4), X(RET)
                    ; ldp x4, X(r0), [sp, 32]
                    ; ldp x2, x3, [sp, 16]
                );
                if id_in_register {
                    a64!(self.ops; ldr X(T2), [sp, 48] ; ldp x0, x1, [sp], 64);
                } else {
                    a64!(self.ops; ldp x0, x1, [sp], 48);
                }
            }
        }
        // cpu in T4; the array's address is computed at run time.
        let done = self.ops.new_dynamic_label();
        if let Operand::Imm(id) = array {
            self.mov_imm(T2, id as u32 as u64, W32);
        }
        self.mov_imm(T1, table, W64);
        a64!(self.ops
            ; mov X(T3), xzr
            ; ldr X(T0), [X(T1), PJ_PERCPU_COUNT as u32]
            ; cmp X(T0), X(T2)
            ; b.ls =>done
        );
        self.mov_imm(T0, PJ_PERCPU_ARRAY_SIZE as u64, W64);
        a64!(self.ops
            ; madd X(T1), X(T2), X(T0), X(T1)
            ; ldr X(T0), [X(T1), (PJ_PERCPU_ARRAYS + PJ_PERCPU_CPUS) as u32]
            ; cmp X(T4), X(T0)
            ; b.hs =>done
            ; ldr X(T0), [X(T1), (PJ_PERCPU_ARRAYS + PJ_PERCPU_SLOT_SIZE) as u32]
            ; mul X(T3), X(T4), X(T0)
            ; =>done
        );
        let s = self.src(src, T0);
        let d = self.map[dst as usize];
        a64!(self.ops; add X(d), X(s), X(T3));
        Ok(())
    }
}
