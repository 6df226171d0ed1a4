//! Out-of-line code of x86-64's own: the jumps to cold code, the stop stubs (budget,
//! unknown `callx`) shared by pc, the budget stops' one record of kind and pc, the stops'
//! common tail, and the program's one full access check that every checked access's slow
//! path calls.

use super::alu::DivFix;
use super::cc_of;
use super::{Codegen, CTX_END8, CTX_START8, ENTRY_SP8, REGION_COUNT8, STACK_START8};
use super::{STOP_ACCESS8, STOP_ADDR8, STOP_KIND8, STOP_PC8};
use crate::encode::{Arith, Cc, Form, Gpr, Label, Sz};
use crate::regs::*;
use dynasmrt::{dynasm, DynasmApi};
use packjit_frontend::lower::StopHooks;
use packjit_frontend::{Cond, Operand, Reg, Width, MAX_INSNS};
use packjit_plugin_api::abi::*;
use packjit_plugin_api::CompileError;

/// Why the code stops (out-of-line stub contents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Budget exhausted: the charge already subtracted (wrapping), added back by the stub.
    Budget {
        /// The back-edge's or call's charge at this pc.
        charge: u32,
    },
    /// Budget exhausted in a loop that counts in `reg` (`Driver::budget_register`): the
    /// charge already subtracted there and stored; the stub adds it back to both.
    BudgetInRegister { charge: u32, reg: Gpr },
    /// `callx` id with no helper: id in the given register.
    Callx { reg: Gpr },
    /// Budget exhausted at the back-edge that closes its loop, which charges before its
    /// test (`JumpHooks::branch`): the stub adds the charge back, then makes the test. Not
    /// taken, the loop ends as usual (at `ended`, past the hot path's own refund); taken,
    /// the run stops, as the reference's does only then.
    ClosingBackEdge {
        charge: u32,
        width: Width,
        cond: Cond,
        dst: Reg,
        src: Operand,
        ended: Label,
    },
}

/// An out-of-line stop stub, linked to the previous stub of its pc.
struct StopStub {
    label: Label,
    stop: Stop,
    pc: usize,
    next_same_pc: u32,
    placed: bool,
}

/// The end of a pc's stub chain.
const NO_STUB: u32 = u32::MAX;

/// The stop stubs of a pass. They are shared by (kind, pc): the checked copies of groups
/// and loops ask again for their instructions' stubs.
#[derive(Default)]
pub(super) struct StopStubs {
    /// In emission order.
    stubs: Vec<StopStub>,
    /// Per pc (a bytecode slot, as stops report), its last stop stub (`NO_STUB` if none),
    /// the head of that pc's chain: a large budgeted program asks for a stub per back-edge
    /// and call, so they are found by pc, not by a scan. Allocated at the first stub.
    by_pc: Vec<u32>,
    /// Stubs asked for but not placed yet, placed after the current function's cold code.
    unplaced: Vec<u32>,
    /// The stops' shared tail (unwind to the entry's pops), placed with the first stub.
    tail: Option<Label>,
    /// The budget stops' shared record (kind, and the pc the stub leaves in eax), placed
    /// with the first budget stub; it falls into `tail` or jumps there.
    budget_record: Option<Label>,
}

impl StopStubs {
    /// Whether every stub asked for was placed.
    pub(super) fn all_placed(&self) -> bool {
        self.unplaced.is_empty()
    }
}

impl Codegen<'_> {
    /// `jcc` (or `jmp`) to the cold side of the current instruction or to a stop stub, both
    /// placed after the function: `rel32` from the first pass when that is expected beyond
    /// `rel8` (see `ColdPlacement`), as it is in all but the shortest functions of checked
    /// or budgeted code, instead of a second pass to find that out. Trusted code (whose only
    /// cold sides are the rare divisors) and checked copies (cold code themselves, their
    /// cold sides right after them) guess short.
    pub(super) fn cold_jump(&mut self, cc: Option<Cc>, label: Label) {
        let d = &self.d;
        let checked = d.mode.sandboxed() || d.mode.counts_budget();
        let far = checked
            && d.islands.guessing()
            && !d.in_copy()
            && d.islands.expected_distance(self.e.pos(), d.cur) > i8::MAX as usize;
        let at_least = if far { Form::Rel32 } else { Form::Rel8 };
        self.e.jump_at_least(cc, label, at_least);
    }

    /// The label of the stop stub for (`stop`, `pc`), placed after the current function's
    /// cold code unless a cold block places it first.
    pub(super) fn stop_label(&mut self, stop: Stop, pc: usize) -> Label {
        let stub = self.stop_stub(stop, pc);
        self.stops.stubs[stub].label
    }

    /// The stop stub for (`stop`, `pc`), made on the first request.
    fn stop_stub(&mut self, stop: Stop, pc: usize) -> usize {
        let stops = &mut self.stops;
        if stops.by_pc.is_empty() {
            stops.by_pc = vec![NO_STUB; self.d.prog.slots];
            // Not regrown from empty by doublings (a budgeted loop asks for a few).
            stops.stubs.reserve(16);
            stops.unplaced.reserve(16);
        }
        let mut k = stops.by_pc[pc];
        while k != NO_STUB {
            let stub = &stops.stubs[k as usize];
            if stub.stop == stop {
                return k as usize;
            }
            k = stub.next_same_pc;
        }
        let label = self.e.label();
        let k = stops.stubs.len();
        stops.stubs.push(StopStub {
            label,
            stop,
            pc,
            next_same_pc: stops.by_pc[pc],
            placed: false,
        });
        stops.by_pc[pc] = k as u32;
        stops.unplaced.push(k as u32);
        k
    }

    /// A stop stub, here: record kind, pc (and address, access or id), then unwind to the
    /// entry's pops with the native sp saved at entry. The first stub placed carries that
    /// shared tail; the others jump back to it.
    fn place_stub(&mut self, k: usize) {
        let StopStub {
            label, stop, pc, ..
        } = self.stops.stubs[k];
        self.stops.stubs[k].placed = true;
        self.e.bind(label);
        let kind = match stop {
            Stop::Budget { charge } => {
                self.e
                    .arith_mi(Arith::Add, ENV, PJ_ENV_BUDGET, charge as i64);
                PJ_STOP_BUDGET
            }
            Stop::BudgetInRegister { charge, reg } => {
                self.e.arith_ri(Arith::Add, Sz::B64, reg, charge as i64);
                self.e.store(Sz::B64, ENV, PJ_ENV_BUDGET, reg);
                PJ_STOP_BUDGET
            }
            Stop::ClosingBackEdge {
                charge,
                width,
                cond,
                dst,
                src,
                ended,
            } => {
                self.e
                    .arith_mi(Arith::Add, ENV, PJ_ENV_BUDGET, charge as i64);
                self.compare(width, cond, dst, src);
                self.e.jump(Some(cc_of(cond).invert()), ended);
                PJ_STOP_BUDGET
            }
            Stop::Callx { reg } => {
                // The id's register is chosen at run time: the table-driven form
                // keeps it REX-free when it can be (see encode.rs).
                self.e.store(Sz::B64, ENV, PJ_ENV_STOP_ADDR, reg);
                PJ_STOP_UNKNOWN_CALLX
            }
        };
        // pc < MAX_INSNS (10⁶), so it fits the sign-extended imm32.
        let pc = pc as i32;
        if kind == PJ_STOP_BUDGET {
            self.budget_stop_record(pc);
            return;
        }
        let kind = kind as i32;
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov DWORD [BYTE r12 + STOP_KIND8], DWORD kind
                ; mov QWORD [BYTE r12 + STOP_PC8], DWORD pc
            )
        });
        self.stop_tail();
    }

    /// A budget stop's record: the pc in eax, then the budget stops' shared record of kind
    /// and pc, here the first time (every later budget stop jumps to it). Budgeted code has
    /// a stub per back-edge and call: with the record shared, each holds its refund, a
    /// 5-byte `mov` and a jump, about half of what its own kind and pc stores took. eax is
    /// free: r0 is -1 after any stop (the tail sets it), and a closing back-edge's test,
    /// which may read r0, runs before.
    fn budget_stop_record(&mut self, pc: i32) {
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; mov eax, DWORD pc));
        if !self.place_once(|stops| &mut stops.budget_record) {
            return;
        }
        const KIND: i32 = PJ_STOP_BUDGET as i32;
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov DWORD [BYTE r12 + STOP_KIND8], DWORD KIND
                ; mov QWORD [BYTE r12 + STOP_PC8], rax
            )
        });
        self.stop_tail();
    }

    /// Shared stop code placed once: a jump to it when `slot` holds its label (false), else
    /// its label bound here (true: the caller emits it now).
    fn place_once(&mut self, slot: impl Fn(&mut StopStubs) -> &mut Option<Label>) -> bool {
        if let Some(placed) = *slot(&mut self.stops) {
            self.e.jump(None, placed);
            return false;
        }
        let here = self.e.label();
        self.e.bind(here);
        *slot(&mut self.stops) = Some(here);
        true
    }

    /// The stops' shared tail, here the first time (every later stop jumps to it): unwind
    /// to the entry's pops with the native sp saved at entry.
    fn stop_tail(&mut self) {
        if !self.place_once(|stops| &mut stops.tail) {
            return;
        }
        // r0 is meaningless after a stop; u64::MAX is what hosts of the ABI v1 contract
        // (`PJ_CALLX_UNKNOWN`) read from an unknown callx, so both agree.
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; or rax, BYTE -1
                ; mov rsp, QWORD [BYTE r12 + ENTRY_SP8]
            )
        });
        let l = self.entry_pops;
        self.e.jump(None, l);
    }

    /// The cold side of an access check, r11 = the address: the full check, then back.
    /// Three instructions (13 to 16 bytes) per checked access; everything else is shared.
    pub(super) fn access_slow_path_at(&mut self, at: Label, back: Label, desc: u32) {
        self.e.bind(at);
        self.call_access_check(desc);
        self.e.jump(None, back);
    }

    /// The shared full check of the access `desc` ([`access_desc`]) at r11, which comes
    /// back clamped only when the access is allowed (else the run stops there).
    pub(super) fn call_access_check(&mut self, desc: u32) {
        let routine = match self.access_check {
            Some(l) => l,
            None => {
                let l = self.e.label();
                self.access_check = Some(l);
                l
            }
        };
        self.mov_ri(T10, desc as i64);
        self.e.call_label(routine);
    }

    /// The full access check, one copy per program, called from every access's cold side
    /// with r11 = address and r10d = the access descriptor ([`access_desc`]). Tries the
    /// context, the stack block (when the program has one) and the host regions in turn;
    /// returns when one holds `[r11, +size)` (any write needing `PJ_REGION_WRITABLE`),
    /// otherwise records the stop and unwinds. Clobbers r9 and r10 only.
    ///
    /// Every way to `done` is a `jbe` on the deciding compare, with its flags still live
    /// there, so the `cmova` replaces the address with `env` (a harmless, mapped address)
    /// should that branch have been mispredicted; the context test is branch-free up to its
    /// compare for the same reason (a below-start address becomes an all-ones end instead
    /// of taking a branch that could be mispredicted too).
    ///
    /// Every register here is fixed, so the routine is written in `dynasm!` directly and
    /// dynasm picks REX, SIB and displacement sizes (env offsets: see `env8`; the regions
    /// pointer, at offset 0, is `[r12]`, which has no displacement at all).
    pub(super) fn access_check_routine(&mut self, l: Label) {
        const _: () = assert!(PJ_ENV_REGIONS == 0);
        const WRITE: i32 = PJ_ACCESS_WRITE as i32;
        const WRITABLE: i8 = {
            assert!(PJ_REGION_WRITABLE < 128);
            PJ_REGION_WRITABLE as i8
        };
        const ACCESS_MASK: i32 = (1 << ACCESS_BITS) - 1;
        const SHIFT: i8 = ACCESS_BITS as i8;
        const OOB: i32 = PJ_STOP_OUT_OF_BOUNDS as i32;
        self.e.bind(l);
        let (top, next, fail, done, check) = (
            self.e.label(),
            self.e.label(),
            self.e.label(),
            self.e.label(),
            self.e.label(),
        );
        // rdx = size for the whole routine. Context: rax = addr - start + size, all-ones
        // when that wraps, against rcx = the context's length. rcx is zeroed first so that
        // `sbb` does not wait for the program's r4 (Intel reads it, `region_end_in_r10`).
        self.e.asm(12, |ops| {
            dynasm!(ops ; .arch x64
                ; push rax
                ; push rcx
                ; push rdx
                ; xor ecx, ecx
                ; movzx edx, r10b
                ; mov rax, r11
                ; sub rax, QWORD [BYTE r12 + CTX_START8]
                ; add rax, rdx
                ; sbb rcx, rcx
                ; or rax, rcx
                ; mov rcx, QWORD [BYTE r12 + CTX_END8]
                ; sub rcx, QWORD [BYTE r12 + CTX_START8]
            )
        });
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp rax, rcx));
        self.e.jump(Some(Cc::Be), done);
        if self.plan.block > 0 {
            // The stack block: inside iff `addr - stack_start <= block - size` (see
            // `stack_cmp`; the block is at most a few KiB, so it fits the imm32).
            let block = self.plan.block as i32;
            self.e.asm(5, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov rax, r11
                    ; sub rax, QWORD [BYTE r12 + STACK_START8]
                    ; mov ecx, DWORD block
                    ; sub rcx, rdx
                    ; cmp rax, rcx
                )
            });
            self.e.jump(Some(Cc::Be), done);
        }
        self.e.asm(2, |ops| {
            dynasm!(ops ; .arch x64
                ; mov rcx, QWORD [BYTE r12 + REGION_COUNT8]
                ; mov rax, QWORD [r12]
            )
        });
        self.e.bind(top);
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; test rcx, rcx));
        self.e.jump(Some(Cc::E), fail);
        // A write needs PJ_REGION_WRITABLE.
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; test r10d, DWORD WRITE));
        self.e.jump(Some(Cc::E), check);
        self.e.asm(
            1,
            |ops| dynasm!(ops ; .arch x64 ; test BYTE [rax + 16], BYTE WRITABLE),
        );
        self.e.jump(Some(Cc::E), next);
        self.e.bind(check);
        // r9 = addr - start
        self.e.asm(
            2,
            |ops| dynasm!(ops ; .arch x64 ; mov r9, r11 ; sub r9, QWORD [rax]),
        );
        self.e.jump(Some(Cc::B), next);
        // r9 += size, carry = wrapped
        self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; add r9, rdx));
        self.e.jump(Some(Cc::B), next);
        self.e
            .asm(1, |ops| dynasm!(ops ; .arch x64 ; cmp r9, QWORD [rax + 8]));
        self.e.jump(Some(Cc::Be), done);
        self.e.bind(next);
        // Next entry: PjMemRegion is { start, len, flags }, 24 bytes (asserted in abi.rs).
        self.e.asm(
            2,
            |ops| dynasm!(ops ; .arch x64 ; add rax, BYTE 24 ; dec rcx),
        );
        self.e.jump(None, top);
        // Found, ahead of the stop so that every jump here is short: the flags are the
        // deciding compare's, which none of the pops touches.
        self.e.bind(done);
        self.e.asm(5, |ops| {
            dynasm!(ops ; .arch x64
                ; pop rdx
                ; pop rcx
                ; pop rax
                ; cmova r11, r12
                ; ret
            )
        });
        // No region holds it: stop with the address, the access and the pc (the pushes
        // and the return address go with the unwind).
        self.e.bind(fail);
        self.e.asm(7, |ops| {
            dynasm!(ops ; .arch x64
                ; mov QWORD [BYTE r12 + STOP_ADDR8], r11
                ; mov r9d, r10d
                ; shr r9d, SHIFT
                ; mov QWORD [BYTE r12 + STOP_PC8], r9
                ; and r10d, DWORD ACCESS_MASK
                ; mov DWORD [BYTE r12 + STOP_ACCESS8], r10d
                ; mov DWORD [BYTE r12 + STOP_KIND8], DWORD OOB
            )
        });
        self.stop_tail();
    }
}

/// Bits of an access descriptor below its pc: the `PJ_ACCESS_*` word (size, write bit).
const ACCESS_BITS: u32 = 9;
const _: () = assert!(PJ_ACCESS_WRITE < 1 << ACCESS_BITS);
// Every pc fits above the access bits of a positive imm32 (pcs are below `MAX_INSNS`).
const _: () = assert!((MAX_INSNS as u64) << ACCESS_BITS < 1 << 31);

/// What the shared access check gets in r10d: `pc << ACCESS_BITS | access`, one `mov` per
/// checked access; the stop it may record names the pc and the access.
pub(super) fn access_desc(pc: usize, size: u32, write: bool) -> u32 {
    let access = size | if write { PJ_ACCESS_WRITE } else { 0 };
    (pc as u32) << ACCESS_BITS | access
}

impl<'a> StopHooks<'a> for Codegen<'a> {
    fn budget_stop(&mut self, _: usize, _: Label, _: u64) -> Result<(), CompileError> {
        unreachable!(
            "x86-64 charges the budget against a stop stub shared by pc (`Stop::Budget`), \
             never through the driver's Cold::Budget"
        )
    }

    fn stop_recorded(&mut self) {
        self.stop_tail();
    }

    fn isa_cold(&mut self, cold: DivFix) -> Result<(), CompileError> {
        self.div_fix(cold);
        Ok(())
    }

    /// The stubs asked for and not placed by a cold block yet.
    fn cold_placed(&mut self, _next: usize) {
        for k in std::mem::take(&mut self.stops.unplaced) {
            if !self.stops.stubs[k as usize].placed {
                self.place_stub(k as usize);
            }
        }
    }

    fn program_end(&mut self) -> Result<(), CompileError> {
        // Every stub was placed with its function's cold code (`cold_placed`).
        debug_assert!(self.stops.all_placed());
        if let Some(l) = self.access_check {
            self.access_check_routine(l);
        }
        if let Some(l) = self.zero_word {
            let start = self.e.pos();
            self.e.data_zero_u64(l);
            self.data.push(start..self.e.pos());
        }
        for (l, table) in std::mem::take(&mut self.callx_tables) {
            let start = self.e.pos();
            self.e.data_u64(l, &table);
            self.data.push(start..self.e.pos());
        }
        Ok(())
    }
}
