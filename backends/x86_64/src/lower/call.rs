//! Helper calls (`call imm`, `callx`), the inlined built-ins, the per-CPU address
//! instruction, bpf-to-bpf calls and `exit`.

use super::cold::Stop;
use super::Codegen;
use crate::encode::{Cc, Sz};
use crate::lower::{CTX_END8, CTX_START8};
use crate::regs::*;
use dynasmrt::{dynasm, DynasmApi};
use packjit_frontend::analysis::{
    callx_plan, helper_code, CpuId, HelperCode, InlineHelper, PerCpuPlan, CALL_CHARGE,
};
use packjit_frontend::lower::{CallHooks, TargetCall};
use packjit_frontend::{Operand, Reg, STACK_SIZE};
use packjit_plugin_api::abi::*;
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};

impl Codegen<'_> {
    /// Per-CPU array lookup (r1 = array id, r2 = element index) against the host's table at
    /// `table`: three unsigned bounds checks (id, index, CPU), each failing to r0 = 0, then
    /// `base + cpu * slot_size + index * value_size`. The CPU is the rseq `cpu_id` read
    /// through `fs`, like the inlined helper 8. r1–r5 may be clobbered (it is a call).
    fn inline_percpu_lookup(&mut self, table: u64) {
        let null = self.e.label();
        let done = self.e.label();
        let (arrays, size) = (PJ_PERCPU_ARRAYS, PJ_PERCPU_ARRAY_SIZE);
        let (cpu_off, base, slot, vsz, ent, cpus) = (
            PJ_PERCPU_CPU_ID_OFFSET as i8,
            PJ_PERCPU_BASE as i8,
            PJ_PERCPU_SLOT_SIZE as i8,
            PJ_PERCPU_VALUE_SIZE as i8,
            PJ_PERCPU_ENTRIES as i8,
            PJ_PERCPU_CPUS as i8,
        );
        self.mov_ri(T11, table as i64);
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp rdi, QWORD [r11]));
        self.e.jump(Some(Cc::Ae), null);
        self.e.asm(3, |ops| {
            dynasm!(ops
                ; .arch x64
                ; imul r9, rdi, size
                ; lea r9, [r11 + r9 + arrays]
                ; cmp rsi, QWORD [BYTE r9 + ent]
            )
        });
        self.e.jump(Some(Cc::Ae), null);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; mov r10, QWORD [BYTE r11 + cpu_off]),
        );
        // The rseq cpu_id, zero-extended.
        self.e.fs_load32(RAX, T10, 0);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; cmp rax, QWORD [BYTE r9 + cpus]),
        );
        self.e.jump(Some(Cc::Ae), null);
        // A mispredicted bound would index with whatever the rseq area holds: the CPU
        // becomes 0 there (r10 = cpu < cpus ? -1 : 0 from the compare's carry), so the result
        // is NULL or one of the array's elements on every path (the caller masked the index
        // alike).
        self.e.asm(2, |ops| {
            dynasm!(ops
                ; .arch x64
                ; sbb r10, r10
                ; and rax, r10
            )
        });
        self.e.asm(4, |ops| {
            dynasm!(ops
                ; .arch x64
                ; imul rax, QWORD [BYTE r9 + slot]
                ; imul rsi, QWORD [BYTE r9 + vsz]
                ; add rax, rsi
                ; add rax, QWORD [BYTE r9 + base]
            )
        });
        self.e.jump(None, done);
        self.e.bind(null);
        self.xor_zero(RAX);
        self.e.bind(done);
    }

    /// `mov eax, fs:[offset]`: glibc keeps the thread's `struct rseq` at a fixed offset from
    /// the thread pointer (`fs` base), and the kernel stores the current CPU in its `cpu_id`
    /// on every return to user space after a migration. One load, zero-extending into r0.
    fn inline_rseq_cpu_id(&mut self, id: u32, offset: i64) -> Result<(), CompileError> {
        let disp = i32::try_from(offset).map_err(|_| {
            CompileError::new(
                ErrorKind::InvalidArgument,
                format!("helper id {id}: rseq offset {offset} does not fit a 32-bit displacement"),
            )
        })?;
        self.e.fs_load32_abs(RAX, disp);
        Ok(())
    }

    /// `rdtsc` scaled to nanoseconds with the host's `PjClockScale` at `scale`:
    /// `ns = tsc * mult_int + hi64(tsc * mult_frac) + offset`. `rdtsc` and `mul` write rdx
    /// (BPF r3), so it is kept in r10 and restored: the inlined helper leaves r1–r5 alone.
    fn inline_tsc_clock(&mut self, scale: u64) {
        let (int, frac, off) = (
            PJ_CLOCK_MULT_INT as i8,
            PJ_CLOCK_MULT_FRAC as i8,
            PJ_CLOCK_OFFSET as i8,
        );
        self.mov_rr(Sz::B64, T10, RDX);
        self.mov_ri(T11, scale as i64);
        self.e.asm(9, |ops| {
            dynasm!(ops
                ; .arch x64
                ; rdtsc
                ; shl rdx, 32
                ; or rax, rdx
                ; mov r9, rax
                ; mul QWORD [BYTE r11 + frac]
                ; imul r9, QWORD [BYTE r11 + int]
                ; add r9, rdx
                ; add r9, QWORD [BYTE r11 + off]
                ; mov rax, r9
            )
        });
        self.mov_rr(Sz::B64, RDX, T10);
    }

    /// `movabs r11, addr ; call r11`: helpers live anywhere in the address space.
    fn call_abs(&mut self, addr: u64) {
        self.mov_ri(T11, addr as i64);
        self.e.call_r11();
    }
}

impl<'a> CallHooks<'a> for Codegen<'a> {
    /// One helper-table entry at a `call imm` or a `callx` match: a call, or the body of an
    /// inlined helper (see [`HelperCode`]).
    fn call_helper(&mut self, h: &HelperEntry) -> Result<(), CompileError> {
        match helper_code(h) {
            HelperCode::Call(addr) => self.call_abs(addr),
            HelperCode::Inline(InlineHelper::RseqCpuId { offset }) => {
                self.inline_rseq_cpu_id(h.id, offset)?
            }
            HelperCode::Inline(InlineHelper::CounterClock { scale }) => {
                self.inline_tsc_clock(scale)
            }
            HelperCode::Inline(InlineHelper::PerCpuLookup { table }) => {
                self.inline_percpu_lookup(table)
            }
        }
        Ok(())
    }

    /// `callx reg`: the id in `reg` picks the helper (the table is fixed at compile time,
    /// see `analysis::callx_plan`): inlined helpers are compared for first, then called
    /// ones through a table of addresses in the code image, or compared for one by one when
    /// their ids are too few or too sparse. No match stops the program with
    /// PJ_STOP_UNKNOWN_CALLX.
    fn callx(&mut self, reg: Reg) {
        let pc = self.d.pc();
        let r = host(reg);
        let done = self.e.label();
        let plan = callx_plan(self.helpers);
        let stop = self.stop_label(Stop::Callx { reg: r }, pc);
        let cmp = |em: &mut Self, id: u32| {
            if i32::try_from(id).is_ok() {
                em.e.cmp_ri(Sz::B64, r, id as i64);
            } else {
                em.mov_ri(T11, id as i64);
                em.e.cmp_rr(Sz::B64, r, T11);
            }
        };
        // Kinds were checked when the table was validated (`call_helper` only fails on an
        // unknown kind), so these cannot fail here.
        if let Some(table) = plan.table {
            for h in &plan.compared {
                let next = self.e.label();
                cmp(self, h.id);
                self.e.jump(Some(Cc::Ne), next);
                let _ = self.call_helper(h);
                self.e.jump(None, done);
                self.e.bind(next);
            }
            // Unsigned bound (a huge or "negative" id fails it), then the address, 0 for a
            // hole.
            let at = self.e.label();
            cmp(self, table.len() as u32);
            self.cold_jump(Some(Cc::Ae), stop);
            self.e.load_table_entry(T11, at, r);
            self.cold_jump(Some(Cc::E), stop);
            self.e.call_r11();
            self.callx_tables.push((at, table));
            self.e.bind(done);
            return;
        }
        // All but the last id branch to their call; the last one falls into its call and
        // a miss goes to the stop.
        let helpers = plan.compared;
        let Some((last, rest)) = helpers.split_last() else {
            self.cold_jump(None, stop);
            return;
        };
        let mut hits = Vec::new();
        for h in rest {
            let l = self.e.label();
            cmp(self, h.id);
            self.e.jump(Some(Cc::E), l);
            hits.push((l, *h));
        }
        cmp(self, last.id);
        self.cold_jump(Some(Cc::Ne), stop);
        let _ = self.call_helper(last);
        for (l, h) in hits {
            self.e.jump(None, done);
            self.e.bind(l);
            let _ = self.call_helper(&h);
        }
        self.e.bind(done);
    }

    fn call_local(&mut self, target: usize) {
        let pc = self.d.pc();
        if self.d.mode.counts_budget() {
            self.charge(pc, CALL_CHARGE);
        }
        let k = self.d.prog.subprog_of(target);
        let l = self.d.entries[k];
        if self.plan.block > 0 {
            // The callee's r10 is ours minus one frame.
            self.e.sub_ri(Sz::B64, RBP, STACK_SIZE as i64);
        }
        self.e.call_label(l);
        if self.plan.block > 0 {
            self.e.add_ri(Sz::B64, RBP, STACK_SIZE as i64);
        }
    }

    /// The budget lives in `env` already (`sub [r12 + budget]`): a plain call.
    fn call_runner(&mut self, runner: &HelperEntry) -> Result<(), CompileError> {
        self.call_helper(runner)
    }

    /// The budget lives in `env` already; r3 (rdx) holds the target record and r0 (rax)
    /// its entry. The saved words go on the native stack, below everything the target's
    /// stop unwinds to (its own `entry_sp`), an even count keeping rsp 16-byte aligned.
    /// Plain moves rather than `push`/`pop` of memory operands: measured ~1 ns faster per
    /// sandboxed tail call here. Every `env` and `PjTailTarget` offset is under 128: disp8.
    fn call_tail_target(&mut self, call: &TargetCall) {
        debug_assert!(call.saved.iter().all(|&o| o < 128) && call.saved.len() < 16);
        let frame = 8 * call.saved.len() as i32;
        self.e.sub_ri(Sz::B64, RSP, frame as i64);
        for (k, &off) in call.saved.iter().enumerate() {
            let at = 8 * k as i8;
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov r8, QWORD [BYTE r12 + off as i8]
                    ; mov QWORD [BYTE rsp + at], r8
                )
            });
        }
        for &(from, to) in call.switched {
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov r8, QWORD [BYTE rdx + from as i8]
                    ; mov QWORD [BYTE r12 + to as i8], r8
                )
            });
        }
        self.e.asm(5, |ops| {
            dynasm!(ops ; .arch x64
                ; mov rdi, QWORD [BYTE r12 + CTX_START8]
                ; mov rsi, QWORD [BYTE r12 + CTX_END8]
                ; sub rsi, rdi
                ; mov rdx, r12
                ; call rax
            )
        });
        for (k, &off) in call.saved.iter().enumerate() {
            let at = 8 * k as i8;
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov r8, QWORD [BYTE rsp + at]
                    ; mov QWORD [BYTE r12 + off as i8], r8
                )
            });
        }
        self.e.add_ri(Sz::B64, RSP, frame as i64);
    }

    /// The per-CPU address instruction: `dst = src + cpu * slot_size` of array `array` in the
    /// table of the `PJ_HELPER_PERCPU_OFFSET` entry, `dst = src` when `array >= count` or
    /// `cpu >= cpus` (so the offset never leaves the registered area). The CPU comes the way
    /// helper 8 does: `fs`-relative rseq load, or a call with every caller-saved BPF register
    /// (r0–r5) pushed around it, so nothing but `dst` changes.
    fn mov_percpu(&mut self, dst: Reg, src: Reg, array: Operand) -> Result<(), CompileError> {
        let pc = self.d.pc();
        let PerCpuPlan { table, cpu } = self.d.percpu()?;
        match cpu {
            CpuId::Rseq { offset } => {
                let disp = i32::try_from(offset).map_err(|_| {
                    CompileError::at(
                        pc,
                        ErrorKind::InvalidArgument,
                        format!(
                            "per-CPU mov: rseq offset {offset} does not fit a 32-bit displacement"
                        ),
                    )
                })?;
                self.e.fs_load32_abs(T10, disp);
            }
            CpuId::Call(addr) => {
                // An id in r9 (the blinding rewrite's AX) is kept across the call too, with
                // 8 bytes of padding: rsp stays 16-byte aligned at the call.
                let id_in_r9 = matches!(array, Operand::Reg(_));
                if id_in_r9 {
                    self.e
                        .asm(2, |ops| dynasm!(ops ; .arch x64 ; push r9 ; sub rsp, 8));
                }
                // Six pushes keep rsp 16-byte aligned at the call, as at any helper call.
                self.e.asm(6, |ops| {
                    dynasm!(ops ; .arch x64 ; push rax ; push rdi ; push rsi ; push rdx ; push rcx ; push r8)
                });
                self.call_abs(addr);
                self.e.asm(7, |ops| {
                    dynasm!(ops ; .arch x64 ; mov r10, rax ; pop r8 ; pop rcx ; pop rdx ; pop rsi ; pop rdi ; pop rax)
                });
                if id_in_r9 {
                    self.e
                        .asm(2, |ops| dynasm!(ops ; .arch x64 ; add rsp, 8 ; pop r9));
                }
            }
        }
        let zero = self.e.label();
        let done = self.e.label();
        // An id past i32 cannot be in the table (it would need 2^31 arrays): offset 0. One
        // in r9 (the blinding rewrite's AX) is sign-extended: past i32, it fails the count.
        let id = match array {
            Operand::Imm(id) => i32::try_from(id as u32).ok().map(Operand::Imm),
            Operand::Reg(r) => Some(Operand::Reg(r)),
        };
        if let Some(id) = id {
            let (slot, cpus) = (
                (PJ_PERCPU_ARRAYS + PJ_PERCPU_SLOT_SIZE) as i8,
                (PJ_PERCPU_ARRAYS + PJ_PERCPU_CPUS) as i8,
            );
            // The array's address is computed at run time.
            if let Operand::Imm(id) = id {
                self.mov_ri(T9, id as i64);
            }
            self.mov_ri(T11, table as i64);
            self.e
                .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp QWORD [r11], r9));
            self.e.jump(Some(Cc::Be), zero);
            self.e.asm(3, |ops| {
                dynasm!(ops
                    ; .arch x64
                    ; imul r9, r9, PJ_PERCPU_ARRAY_SIZE
                    ; add r11, r9
                    ; cmp r10, QWORD [BYTE r11 + cpus]
                )
            });
            self.e.jump(Some(Cc::Ae), zero);
            self.e.asm(
                2,
                |ops| dynasm!(ops ; .arch x64 ; mov r9, r10 ; imul r9, QWORD [BYTE r11 + slot]),
            );
            self.e.jump(None, done);
        }
        self.e.bind(zero);
        self.xor_zero(T9);
        self.e.bind(done);
        self.mov_rr(Sz::B64, host(dst), host(src));
        self.e.add_rr(Sz::B64, host(dst), T9);
        Ok(())
    }
}
