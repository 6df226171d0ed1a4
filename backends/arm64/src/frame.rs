//! Prologue and epilogue (`FrameHooks`), and what each function saves.
//!
//! ```text
//!   higher addresses
//!   +------------------------------+  <- sp at entry (16-byte aligned)
//!   | x29, x30 (frame record)      |  only when the function calls
//!   | saved x19..x22, x23..x28     |  only those it uses (pairs; a lone one takes 16 bytes);
//!   |                              |  the entry of a program that can stop saves every
//!   |                              |  x19..x22 any function writes (a stop skips callees'
//!   |                              |  restores)
//!   +------------------------------+  <- env.entry_sp (entry; a stop unwinds to here)
//!   | trusted: BPF frame, 512 B    |  per function reading r10; r10 = sp + 512
//!   | sandbox: the stack block     |  entry only: stack_block_size(prog) bytes, zeroed;
//!   |   [stack_start, stack_end)   |  frame k = [end - 512 (k+1), end - 512 k), r10 = x25+512
//!   +------------------------------+  <- sp while the body runs
//!   | callees' frame records ...   |  native data stays below the block, never inside it
//!   lower addresses
//! ```
//!
//! The entry of a program that makes tail calls has the uniform tail-call frame: the frame
//! record and all of x19–x28 saved, then env and entry_sp (`TAIL_ENTRY_SKIP` bytes, the same
//! in every such program), so another such program's tail call jumps past them
//! (`FrameExit::TailEntry`).
//!
//! A stop (failed check, budget, unknown `callx` id) stores the stop fields of `env`, loads
//! `env.entry_sp` into sp and branches to the entry's `restore` label, which writes the
//! budget back, restores the entry's saved registers and returns: no callee epilogue runs,
//! which is why the entry saves every callee-saved register any function touches.

use dynasmrt::{dynasm, DynasmApi, DynasmLabelApi};
use packjit_frontend::analysis::{
    entry_zeroing, live_in, stack_block_size, CodegenMode, LoweringReads,
};
use packjit_frontend::ranges::{plan_accesses, AccessPlan};
use packjit_frontend::{op_kind, Program, STACK_SIZE};
use packjit_plugin_api::abi::{
    PJ_ENV_BUDGET, PJ_ENV_CTX_START, PJ_ENV_ENTRY_SP, PJ_ENV_STACK_START,
};

use crate::lower::Codegen;
use crate::regs::*;
use packjit_frontend::lower::{FrameExit, FrameHooks};

/// What a function's prologue saves and reserves.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    /// Push the frame record (x29, x30): the function makes calls.
    pub(crate) save_lr: bool,
    /// Callee-saved registers to preserve, in push order.
    pub(crate) saved: Vec<u8>,
    /// Trusted code: reserve a 512-byte BPF frame on the native stack.
    pub(crate) native_frame: bool,
    /// Where the function keeps each BPF register (see [`RegMap`]).
    pub(crate) map: RegMap,
}

/// Program-wide decisions the prologue, the epilogue and the lowering share.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) frames: Vec<Frame>,
    /// The code can stop (sandbox, budget or `callx`): env lives in x28, entry_sp is kept.
    pub(crate) can_stop: bool,
    /// Sandbox stack block size in bytes (0 in trusted code or when nothing reads r10).
    pub(crate) block: u32,
    /// BPF registers (bit n = rn) the entry zeroes: those possibly read before written.
    pub(crate) zero: u16,
    /// The front end's access analysis (sandbox only; empty in trusted code): how each
    /// load, store and atomic is checked, and which share one check.
    pub(crate) access: AccessPlan,
}

pub(crate) fn plan(prog: &Program, mode: &CodegenMode, groups: bool) -> Plan {
    let (sandbox, budget) = (mode.sandboxed(), mode.counts_budget());
    // Everything here comes from the functions' summaries, never from a pass over the
    // instructions (at 1 M instructions that is a trip through memory).
    let can_stop = mode.keeps_env(prog);
    let block = if sandbox {
        stack_block_size(prog) as u32
    } else {
        0
    };
    let all_writes = prog.subprogs.iter().fold(0u16, |acc, sp| acc | sp.writes);
    let zero = entry_zeroing(prog, LoweringReads::NONE);
    let program_calls = prog
        .subprogs
        .iter()
        .any(|sp| sp.ops & (op_kind::CALLS | op_kind::MOV_PERCPU) != 0);
    let frames = prog
        .subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            // Helper, `callx` or local calls, or a per-CPU mov (which may call for the CPU id).
            let calls = sp.calls;
            // Every register an instruction writes, and r0-r5 where there are calls.
            let mut writes = sp.writes;
            if k == 0 {
                // The entry zeroes what may be read unwritten: x19..x22 among them are the
                // host's and must be restored.
                writes |= zero;
                if can_stop && prog.subprogs.len() > 1 {
                    // A stop unwinds straight from a nested frame to the entry's epilogue,
                    // skipping the callees' restores.
                    writes |= all_writes;
                }
            }
            // A called function that reads r6–r9 before writing them reads its caller's
            // values (x19–x22): it keeps the standard map.
            const R6_R9: u16 = 0b11_1100_0000;
            let reads_callers_r6_r9 =
                k > 0 && sp.reads & R6_R9 != 0 && live_in(prog, sp.start, sp.end)[0] & R6_R9 != 0;
            let map = if calls {
                REG_MAP
            } else {
                leaf_map(
                    !sandbox && !can_stop && !reads_callers_r6_r9,
                    !program_calls,
                )
            };
            let mut saved: Vec<u8> = (6..=9)
                .filter(|r| writes & (1 << r) != 0)
                .map(|r| map[r])
                .filter(|&x| x >= CALLEE_SAVED_FIRST)
                .collect();
            if k == 0 {
                if sandbox {
                    saved.extend([CTX_LO, CTX_LEN]);
                }
                if block > 0 {
                    saved.extend([FP, STACK_LO]);
                }
                if budget {
                    saved.push(BUDGET);
                }
                if can_stop {
                    saved.push(ENV);
                }
            }
            if k == 0 && mode.tail_calls {
                // The uniform tail-call frame: see `TAIL_ENTRY_SKIP`.
                saved = UNIFORM_SAVES.to_vec();
            }
            Frame {
                // A stop reaches the entry's restore from anywhere, x30 clobbered by some
                // `bl` on the way: an entry that calls keeps its return address. In a leaf
                // entry the only `bl` is the region scan's, whose stop puts x30 back from x5
                // (`region_scan`); the uniform tail-call frame always has the record
                // (`TAIL_ENTRY_SKIP`).
                save_lr: calls || (k == 0 && mode.tail_calls),
                saved,
                native_frame: !sandbox && sp.uses_stack,
                map,
            }
        })
        .collect();
    Plan {
        access: if sandbox {
            plan_accesses(prog, groups)
        } else {
            AccessPlan::default()
        },
        frames,
        can_stop,
        block,
        zero,
    }
}

/// The entry saves of a program that makes tail calls (`CodegenMode::tail_calls`, which
/// also keeps `env`, so the frame record is saved too): every callee-saved register the
/// code can use, always in this order, whatever the program uses. With them, a tail call
/// between two such programs leaves the saves in place for the target (its epilogue restores
/// the host's registers from them) and jumps past its saves, as the kernel's arm64 JIT
/// jumps to `PROLOGUE_OFFSET` of programs that all share one frame.
const UNIFORM_SAVES: [u8; 10] = [19, 20, 21, 22, 23, 24, 25, 26, 27, 28];

/// Bytes from the entry of a program with the uniform frame to its tail entry: the frame
/// record (`stp x29, x30` and `mov x29, sp`), five `stp` of `UNIFORM_SAVES`, then `env`
/// (`mov x28, x2`) and `entry_sp` (`mov`, `str`): what the caller's frame already holds. The
/// tail entry reserves the program's own frame and sets its registers.
pub const TAIL_ENTRY_SKIP: u32 = 40;

/// The largest stack block the entry zeroes with straight-line stores (8 `stp`s) rather
/// than a loop.
const STORED_ZEROING_MAX: usize = 128;

impl Codegen<'_> {
    /// The entry's run-time state after env and entry_sp (set by `prologue` right after the
    /// saves): the sandbox's bounds and stack block, the budget, and zeroed registers.
    fn entry_state(&mut self) {
        if self.d.mode.sandboxed() {
            a64!(self.ops
                ; ldp X(CTX_LO), X(CTX_LEN), [X(ENV), PJ_ENV_CTX_START]
                ; sub X(CTX_LEN), X(CTX_LEN), X(CTX_LO)
            );
            if self.plan.access.uses_ctx_const() {
                // Checks against the context start plus a constant assume r1 is exactly
                // env.ctx_start.
                a64!(self.ops; mov X(self.map[1]), X(CTX_LO));
            }
            if self.plan.access.uses_ctx_index() {
                // Index-bounded accesses rest on r2 being exactly the context's length
                // (`packjit_frontend::indexes`), whatever the caller passed.
                a64!(self.ops; mov X(self.map[2]), X(CTX_LEN));
            }
            let block = self.plan.block;
            if block > 0 {
                // 512..4096 bytes: one SUB (imm12, or 4096 as 1 << 12).
                if block < 4096 {
                    a64!(self.ops; sub sp, sp, block);
                } else {
                    a64!(self.ops; sub sp, sp, block >> 12, lsl 12);
                }
                a64!(self.ops
                    ; mov XSP(STACK_LO), sp
                    ; add XSP(C3), XSP(STACK_LO), block - 1
                    ; add XSP(C3), XSP(C3), 1
                    ; stp X(STACK_LO), X(C3), [X(ENV), PJ_ENV_STACK_START]
                    ; sub XSP(FP), XSP(C3), STACK_SIZE as u32
                );
                if block as usize <= STORED_ZEROING_MAX {
                    // A few lines: plain stores, no loop to predict.
                    for at in (0..block).step_by(16) {
                        a64!(self.ops; stp xzr, xzr, [X(STACK_LO), at as i32]);
                    }
                } else {
                    // Zero the block, 64 bytes per round (block is a multiple of 64,
                    // `analysis::FRAME_LINE`).
                    a64!(self.ops
                        ; mov X(C0), X(STACK_LO)
                        ; zero:
                        ; stp xzr, xzr, [X(C0)], 16
                        ; stp xzr, xzr, [X(C0)], 16
                        ; stp xzr, xzr, [X(C0)], 16
                        ; stp xzr, xzr, [X(C0)], 16
                        ; cmp X(C0), X(C3)
                        ; b.ne <zero
                    );
                }
            } else {
                a64!(self.ops; stp xzr, xzr, [X(ENV), PJ_ENV_STACK_START]);
            }
        }
        let ctx_placed = self.d.mode.sandboxed() && self.plan.access.uses_ctx_const();
        if self.map[1] != RET && !ctx_placed {
            // r1 does not live in x0 (see `RegMap`): move the context over, before r0 (now
            // x0) is zeroed, unless nothing reads it first.
            let end = self.d.prog.subprogs[0].end;
            if live_in(self.d.prog, 0, end)[0] & (1 << 1) != 0 {
                a64!(self.ops; mov X(self.map[1]), X(RET));
            }
        }
        if self.d.mode.counts_budget() {
            a64!(self.ops; ldr X(BUDGET), [X(ENV), PJ_ENV_BUDGET as u32]);
        }
        for r in 0..10u8 {
            if self.plan.zero & (1 << r) != 0 {
                a64!(self.ops; mov X(self.map[r as usize]), xzr);
            }
        }
    }
}

impl Codegen<'_> {
    /// Function `k`'s frame undone, up to its return: frames released, the budget written
    /// back, the saved registers and the frame record restored.
    fn leave_frame(&mut self, k: usize, exit: FrameExit) {
        let f = self.plan.frames[k].clone();
        if f.native_frame {
            a64!(self.ops; add sp, sp, STACK_SIZE as u32);
        }
        if k == 0 {
            let block = self.plan.block;
            if block > 0 {
                if block < 4096 {
                    a64!(self.ops; add sp, sp, block);
                } else {
                    a64!(self.ops; add sp, sp, block >> 12, lsl 12);
                }
            }
            if exit == FrameExit::Return {
                let restore = self.restore;
                a64!(self.ops; =>restore);
            }
            if self.d.mode.counts_budget() {
                a64!(self.ops; str X(BUDGET), [X(ENV), PJ_ENV_BUDGET as u32]);
            }
            // Only the entry returns to native code: r0 goes to x0. Functions return r0
            // in x7 where their caller expects it.
            if exit == FrameExit::Return && self.map[0] != RET {
                a64!(self.ops; mov X(RET), X(self.map[0]));
            }
            if exit == FrameExit::TailEntry {
                // The saves and the frame record stay for the target, whose epilogue
                // restores them.
                return;
            }
        }
        for pair in f.saved.chunks(2).rev() {
            match *pair {
                [a, b] => a64!(self.ops; ldp X(a), X(b), [sp], 16),
                [a] => a64!(self.ops; ldr X(a), [sp], 16),
                _ => unreachable!(),
            }
        }
        if f.save_lr {
            a64!(self.ops; ldp x29, x30, [sp], 16);
        }
    }
}

impl<'a> FrameHooks<'a> for Codegen<'a> {
    fn prologue(&mut self, k: usize) {
        let f = self.plan.frames[k].clone();
        let start = self.ops.offset().0;
        if f.save_lr {
            // Frame record first so unwinders and debuggers can walk JIT frames.
            a64!(self.ops; stp x29, x30, [sp, -16]! ; mov x29, sp);
        }
        for pair in f.saved.chunks(2) {
            match *pair {
                [a, b] => a64!(self.ops; stp X(a), X(b), [sp, -16]!),
                // sp must stay 16-byte aligned: a lone register still takes 16 bytes.
                [a] => a64!(self.ops; str X(a), [sp, -16]!),
                _ => unreachable!(),
            }
        }
        if k == 0 && self.plan.can_stop {
            // env arrives in x2, which is r3: keep it before r3 is zeroed. A stop unwinds
            // to here, right after the saves: the `restore` label follows the release of
            // the entry's native frame and block, so entry_sp is taken before either.
            a64!(self.ops
                ; mov X(ENV), x2
                ; mov XSP(C0), sp
                ; str X(C0), [X(ENV), PJ_ENV_ENTRY_SP as u32]
            );
        }
        if k == 0 && self.d.mode.tail_calls {
            // Other programs' tail calls land here: the code above must be the same
            // instructions in every program with the uniform frame.
            assert_eq!(
                self.ops.offset().0 - start,
                TAIL_ENTRY_SKIP as usize,
                "the uniform frame's saves changed size: update TAIL_ENTRY_SKIP"
            );
            // A tail call arrives with the caller's r1 and r2: the entry's arguments are set
            // here again from env, and only those the program reads before writing, rather
            // than by every caller (at the host's entry they already hold these values).
            let end = self.d.prog.subprogs[0].end;
            let live = live_in(self.d.prog, 0, end)[0];
            let ctx_placed = self.d.mode.sandboxed() && self.plan.access.uses_ctx_const();
            if live & (1 << 2) != 0 {
                a64!(self.ops
                    ; ldp x0, x1, [X(ENV), PJ_ENV_CTX_START]
                    ; sub x1, x1, x0
                );
            } else if live & (1 << 1) != 0 && !ctx_placed {
                a64!(self.ops; ldr x0, [X(ENV), PJ_ENV_CTX_START as u32]);
            }
        }
        if f.native_frame {
            a64!(self.ops; sub sp, sp, STACK_SIZE as u32);
        }
        if k == 0 {
            self.entry_state();
        }
    }

    /// The epilogue of function `k`, after its label (bound by the driver).
    fn epilogue(&mut self, k: usize) {
        self.leave_frame(k, FrameExit::Return);
        a64!(self.ops; ret);
    }

    /// `dsb nsh; isb`, the barrier compilers put after `ret` and `br` against straight-line
    /// speculation on Arm cores (`sb` needs FEAT_SB).
    fn speculation_barrier(&mut self) {
        a64!(self.ops; dsb nsh; isb);
    }

    fn tail_entry_skip(&self) -> u32 {
        TAIL_ENTRY_SKIP
    }

    fn tail_jump(&mut self, exit: FrameExit) {
        let r0 = self.map[0];
        if exit == FrameExit::TailEntry {
            // env stays in x28, and entry_sp and the saves stay: only the frames go. The
            // target's tail entry sets the arguments it reads (`prologue`).
            a64!(self.ops; mov x16, X(r0));
            self.leave_frame(0, exit);
            a64!(self.ops; br x16);
            return;
        }
        // x16 (IP0) holds the target through the restores: caller-saved, no eBPF register,
        // and a `br x16` may land on a `bti c`. x2 (r3, dead after the call) holds env.
        a64!(self.ops
            ; mov x16, X(r0)
            ; mov x2, X(ENV)
        );
        self.leave_frame(0, exit);
        a64!(self.ops
            ; ldp x0, x1, [x2, PJ_ENV_CTX_START]
            ; sub x1, x1, x0
            ; br x16
        );
    }

    fn enter_function(&mut self, func: usize) {
        self.map = self.plan.frames[func].map;
    }
}
