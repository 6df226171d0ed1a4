//! Prologues, epilogues and the stack layout.
//!
//! ```text
//!  higher addresses
//!  ┌──────────────────────────┐
//!  │ return address (host)    │  rsp ≡ 8 (mod 16) at the entry
//!  │ saved rbp, rbx, r13–r15, │  only the callee-saved registers the program uses
//!  │ r12                      │  ← env.entry_sp (a stop restores rsp to here and pops)
//!  │ pad (push rax)           │  only when the pushes leave rsp misaligned for calls
//!  ├──────────────────────────┤  ← rbp = r10 of the entry frame = env.stack_end
//!  │ frame 0 (512 bytes)      │
//!  │ frame 1 (512 bytes)      │  one per level of the deepest bpf-to-bpf call chain;
//!  │ …                        │  a callee's r10 is its caller's r10 − 512
//!  ├──────────────────────────┤  ← rsp after the prologue = env.stack_start
//!  │ return address, callee   │  bpf-to-bpf calls and helper calls push below the block,
//!  │ saves, helper frames …   │  so no native data ever lives inside it
//!  └──────────────────────────┘
//! ```
//!
//! The entry of a program that makes tail calls has the uniform tail-call frame instead:
//! all of rbp, rbx, r13–r15, r12 pushed, the pad, then env and entry_sp (`TAIL_ENTRY_SKIP`
//! bytes, the same in every such program), so another such program's tail call jumps past
//! them (`FrameExit::TailEntry`); there entry_sp is below the pad.
//!
//! The whole stack block is reserved once by the entry (none when no function reads r10), so
//! the block is one contiguous region for the sandbox checks and zeroing it is one
//! `rep stosq`. A bpf-to-bpf call is `sub rbp, 512 ; call f ; add rbp, 512`; callees
//! reserve nothing. Every function body runs with rsp ≡ 0 (mod 16) when it makes calls, as
//! the SysV ABI requires at a helper call.

use crate::encode::{Gpr, Sz};
use crate::lower::{Codegen, CTX_END8, CTX_START8, ENTRY_SP8, STACK_END8, STACK_START8};
use crate::regs::*;
use dynasmrt::{dynasm, DynasmApi};
use packjit_frontend::analysis::{entry_zeroing, live_in, stack_block_size, CodegenMode};
use packjit_frontend::lower::{FrameExit, FrameHooks};
use packjit_frontend::ranges::AccessPlan;
use packjit_frontend::{op_kind, Program, STACK_SIZE};

/// The largest stack block the entry zeroes with plain stores (16 of them) rather than
/// `rep stosq`.
const STORED_ZEROING_MAX: usize = 128;

// The prologue's `dynasm!` text names r10's home (rbp) and r1's (rdi).
const _: () = assert!(REG_MAP[10] == RBP && REG_MAP[1] == RDI && REG_MAP[2] == RSI);

/// What one function saves.
#[derive(Clone, Debug)]
pub struct SubFrame {
    /// Callee-saved registers pushed by the prologue, in push order.
    pub saved: Vec<Gpr>,
    /// A `push rax` keeps rsp 16-byte aligned at calls.
    pub pad: bool,
}

/// The frame plan of a program.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Stack block bytes (0: no frame at all).
    pub block: usize,
    /// r12 holds `env`: the code is sandboxed, counts a budget, may stop at a `callx`, or
    /// passes the run's context on in a tail call.
    pub needs_env: bool,
    /// BPF registers (bits) read or written anywhere.
    pub used: u16,
    /// Registers the entry zeroes: those a run may read before writing them
    /// (`analysis::entry_zeroing`).
    pub zero: u16,
    /// Per function (index as `Program::subprogs`).
    pub subs: Vec<SubFrame>,
    /// The front end's access analysis (filled for sandboxed code by `lower::emit_decoded_with`).
    pub access: AccessPlan,
}

/// Decides saves, padding and the stack block.
pub fn plan(prog: &Program, mode: &CodegenMode) -> Plan {
    // Sandboxed entries zero the block, so its size is run time: only the part of the frame
    // the program can reach. Trusted entries only reserve it (`sub rsp`, the same for any
    // size), so they skip the reach analysis and reserve whole frames: a compile-time
    // saving of ~8% of a trusted load for at most 448 bytes more native stack.
    let block = if mode.sandboxed() {
        stack_block_size(prog)
    } else if prog.subprogs.iter().any(|s| s.uses_stack) {
        prog.call_depth * STACK_SIZE
    } else {
        0
    };
    // The front end's per-function summaries: no pass over the instructions here.
    let ops = prog.subprogs.iter().fold(0u16, |acc, sp| acc | sp.ops);
    let needs_env = mode.keeps_env(prog);
    // Registers read or written anywhere: `writes` adds r1-r5 at calls, which read them
    // anyway (`reads` has ARG_REGS there); see `regs::lowering_reads` for the atomics' r0.
    let used = prog
        .subprogs
        .iter()
        .fold(0u16, |acc, sp| acc | sp.reads | sp.writes)
        | if ops & op_kind::ATOMIC != 0 { 1 } else { 0 };
    let subs = prog
        .subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            let mut saved;
            if k == 0 && mode.tail_calls {
                // The uniform tail-call frame: see `TAIL_ENTRY_SKIP`.
                saved = UNIFORM_SAVES.to_vec();
            } else if k == 0 {
                // A stop unwinds from any depth straight to the entry's pops, skipping the
                // callees' restores: the entry saves every callee-saved register any
                // function touches (and the rest of the time this costs only the pushes).
                // (At most six: one allocation.)
                saved = Vec::with_capacity(6);
                if block > 0 {
                    saved.push(RBP);
                }
                saved.extend(callee_saved_of(used));
                if needs_env {
                    saved.push(ENV);
                }
            } else {
                saved = callee_saved_of(sp.writes).collect();
            }
            // rsp ≡ 8 at every function entry; after n pushes it is 8 + 8n: odd n aligns.
            // The uniform frame always has its pad (it is part of what tail calls skip).
            let pad = (sp.calls || (k == 0 && mode.tail_calls)) && saved.len() % 2 == 0;
            SubFrame { saved, pad }
        })
        .collect();
    Plan {
        block,
        needs_env,
        used,
        zero: entry_zeroing(prog, LOWERING_READS),
        subs,
        // Read only by sandboxed code, for which `lower::emit_decoded_with` fills it in.
        access: AccessPlan::default(),
    }
}

/// The entry saves of a program that makes tail calls (`CodegenMode::tail_calls`): every
/// callee-saved register the code can use, always in this order, whatever the program uses.
/// With them, a tail call between two such programs leaves the saves in place for the
/// target (its epilogue restores the host's registers from them) and jumps past its pushes,
/// as the kernel's JITs jump past the prologue of programs that all share one frame.
const UNIFORM_SAVES: [Gpr; 6] = [RBP, RBX, R13, R14, R15, ENV];

/// Bytes from the entry of a program with the uniform frame to its tail entry: `endbr64`
/// (4), the pushes of `UNIFORM_SAVES` (1 each for rbp and rbx, 2 each for r12–r15), the
/// pad (`push rax`, 1), `mov r12, rdx` (3) and `mov [r12 + entry_sp], rsp` (5): what the
/// caller's frame already holds (the same registers saved, `env`, `entry_sp`). The tail
/// entry reserves the stack block and sets the registers as the program's own entry does.
pub const TAIL_ENTRY_SKIP: u32 = 23;

impl Codegen<'_> {
    /// Is function `k`'s epilogue a bare `ret` (worth inlining at every `exit`)?
    pub(crate) fn bare_return(&self, k: usize) -> bool {
        let f = &self.plan.subs[k];
        f.saved.is_empty() && !f.pad && (k != 0 || self.plan.block == 0)
    }
}

impl<'a> FrameHooks<'a> for Codegen<'a> {
    /// Function `k`'s prologue (bound at its call label).
    fn prologue(&mut self, k: usize) {
        let plan = self.plan;
        let f = &plan.subs[k];
        let start = self.e.pos();
        if k == 0 {
            // endbr64: the entry is reached by an indirect call from the host, which must
            // work under CET/IBT. Callees are reached only by direct `call`s.
            self.e.endbr64();
        }
        for &r in &f.saved {
            self.e.push(r);
        }
        let uniform = k == 0 && self.d.mode.tail_calls;
        if uniform {
            // The pad first, then env and entry_sp (a stop unwinds to below the pad).
            self.e.push_rax();
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov r12, rdx
                    ; mov QWORD [BYTE r12 + ENTRY_SP8], rsp
                )
            });
            // Other programs' tail calls land here: the code above must be the same bytes
            // in every program with the uniform frame.
            assert_eq!(
                self.e.pos() - start,
                TAIL_ENTRY_SKIP as usize,
                "the uniform frame's saves changed size: update TAIL_ENTRY_SKIP"
            );
            // They land with an indirect `jmp`, which CET/IBT checks like the host's call.
            self.e.endbr64();
            // A tail call arrives with the caller's r1 and r2: the entry's arguments are set
            // here again from env, and only those the program reads before writing, rather
            // than by every caller (at the host's entry they already hold these values).
            let end = self.d.prog.subprogs[0].end;
            let live = live_in(self.d.prog, 0, end)[0];
            let ctx_later = self.d.mode.sandboxed() && self.plan.access.uses_ctx_const();
            if live & (1 << 2) != 0 {
                self.e.asm(3, |ops| {
                    dynasm!(ops ; .arch x64
                        ; mov rdi, QWORD [BYTE r12 + CTX_START8]
                        ; mov rsi, QWORD [BYTE r12 + CTX_END8]
                        ; sub rsi, rdi
                    )
                });
            } else if live & (1 << 1) != 0 && !ctx_later {
                self.e.asm(
                    1,
                    |ops| dynasm!(ops ; .arch x64 ; mov rdi, QWORD [BYTE r12 + CTX_START8]),
                );
            }
        }
        if k != 0 {
            if f.pad {
                self.e.push_rax();
            }
            return;
        }
        if self.plan.needs_env && !uniform {
            // env = the third argument; where a stop unwinds to: just above the pad and
            // the stack block.
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov r12, rdx
                    ; mov QWORD [BYTE r12 + ENTRY_SP8], rsp
                )
            });
        }
        if f.pad && !uniform {
            self.e.push_rax();
        }
        let block = self.plan.block;
        if block > 0 {
            self.mov_rr(Sz::B64, RBP, RSP);
            self.e.sub_ri(Sz::B64, RSP, block as i64);
            if self.d.mode.sandboxed() {
                // Publish the block's bounds, then zero it (nothing of the host leaks in).
                self.e.asm(2, |ops| {
                    dynasm!(ops ; .arch x64
                        ; mov QWORD [BYTE r12 + STACK_END8], rbp
                        ; mov QWORD [BYTE r12 + STACK_START8], rsp
                    )
                });
                self.xor_zero(RAX);
                if block <= STORED_ZEROING_MAX {
                    // A few lines: plain stores. `rep stosq` costs tens of cycles to start,
                    // more than a short run's whole body.
                    for at in (0..block).step_by(8) {
                        self.e.store(Sz::B64, RSP, at as i32, RAX);
                    }
                } else {
                    // rdi (= r1, ctx) parked in r9 across rep stosq.
                    self.e.asm(2, |ops| {
                        dynasm!(ops ; .arch x64
                            ; mov r9, rdi
                            ; mov rdi, rsp
                        )
                    });
                    self.mov_ri(RCX, (block / 8) as i64);
                    self.e.rep_stosq();
                    self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; mov rdi, r9));
                }
            }
        }
        if self.d.mode.sandboxed() && self.plan.access.uses_ctx_const() {
            // Checks against the context start plus a constant assume r1 is exactly
            // env.ctx_start.
            self.e.asm(
                1,
                |ops| dynasm!(ops ; .arch x64 ; mov rdi, QWORD [BYTE r12 + CTX_START8]),
            );
        }
        if self.d.mode.sandboxed() && self.plan.access.uses_ctx_index() {
            // Index-bounded accesses rest on r2 being exactly the context's length
            // (`packjit_frontend::indexes`), whatever the caller passed.
            self.e.asm(2, |ops| {
                dynasm!(ops ; .arch x64
                    ; mov rsi, QWORD [BYTE r12 + CTX_END8]
                    ; sub rsi, rdi
                )
            });
        }
        // r0 and r3–r9 start at zero (only those the program can observe).
        for r in [0u8, 3, 4, 5, 6, 7, 8, 9] {
            if self.plan.zero & (1 << r) != 0 {
                self.xor_zero(host(r));
            }
        }
    }

    /// Function `k`'s epilogue: undo the prologue and return r0 (already in rax).
    fn epilogue(&mut self, k: usize) {
        self.leave_frame(k, FrameExit::Return);
        self.e.ret();
    }

    fn speculation_barrier(&mut self) {
        self.e.int3();
    }

    fn tail_entry_skip(&self) -> u32 {
        TAIL_ENTRY_SKIP
    }

    fn tail_jump(&mut self, exit: FrameExit) {
        if exit == FrameExit::TailEntry {
            // env stays in r12 and the pad, entry_sp and the saves stay: only the stack
            // block goes. The target's tail entry sets the arguments it reads (`prologue`).
            self.leave_frame(0, exit);
            self.e.asm(1, |ops| dynasm!(ops ; .arch x64 ; jmp rax));
            return;
        }
        // rdx (r3, dead: a call clobbered it) carries env past the restores of r12.
        self.mov_rr(Sz::B64, RDX, ENV);
        self.leave_frame(0, exit);
        // The entry's arguments again: the run's context and env. rax (the target) and
        // rdx are caller-saved, so the restores above left them alone.
        self.e.asm(4, |ops| {
            dynasm!(ops ; .arch x64
                ; mov rdi, QWORD [BYTE rdx + CTX_START8]
                ; mov rsi, QWORD [BYTE rdx + CTX_END8]
                ; sub rsi, rdi
                ; jmp rax
            )
        });
    }
}

impl Codegen<'_> {
    /// Function `k`'s frame undone, up to its return: the stack block released, the pad
    /// popped, the saved registers restored (the entry's return binds, before the restores,
    /// the label its stop path jumps to).
    fn leave_frame(&mut self, k: usize, exit: FrameExit) {
        let plan = self.plan;
        let f = &plan.subs[k];
        if k == 0 && self.plan.block > 0 {
            // rbp = r10 is the entry's rsp before the block was reserved.
            self.mov_rr(Sz::B64, RSP, RBP);
        }
        if exit == FrameExit::TailEntry {
            // The pad and the saves stay for the target, whose epilogue restores them.
            return;
        }
        // The uniform frame's entry_sp is below its pad: a stop lands before its pop.
        let uniform = k == 0 && self.d.mode.tail_calls;
        if uniform && exit == FrameExit::Return {
            let l = self.entry_pops;
            self.e.bind(l);
        }
        if f.pad {
            self.e.pop_rcx(); // rcx (r4) is dead at a return
        }
        if k == 0 && !uniform && exit == FrameExit::Return {
            let l = self.entry_pops;
            self.e.bind(l);
        }
        for &r in f.saved.iter().rev() {
            self.e.pop(r);
        }
    }
}
