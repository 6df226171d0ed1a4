//! Frames: what each (sub)program saves, where the eBPF stack lives, prologue and epilogue.
//!
//! All eBPF frames live in one contiguous **stack block** of
//! `analysis::stack_block_size(prog)` bytes (512 per level of the deepest call chain; 0 when
//! no function reads r10), carved out by the entry. The entry's r10 is the top of the block;
//! a callee's r10 is its caller's r10 − 512. Saved registers and return addresses live
//! outside the block, so in sandbox mode the block is one region for the checks and is zeroed
//! at entry. Trusted code uses the same layout (it just skips the zeroing).
//!
//! ```text
//!   higher addresses
//!   ┌────────────────────────────┐ ← caller's sp = stack_end = entry r10 (s5)
//!   │ frame 0 (entry), 512 bytes │
//!   │ frame 1, 512 bytes         │   callee r10 = caller r10 - 512
//!   │ …  (call_depth frames)     │
//!   ├────────────────────────────┤ ← stack_start
//!   │ entry saves                │   ra, s1–s11 as needed
//!   └────────────────────────────┘ ← entry sp = env.entry_sp (stops unwind to here)
//!   │ callee saves               │   ra, s1–s5 it changes (no eBPF bytes)
//!   └────────────────────────────┘ ← callee sp
//!   lower addresses
//! ```
//!
//! **Uniform tail-call frame.** The entry of a program that makes tail calls saves ra and
//! s0–s11 in a save area *above* its stack block, then sets env (`TAIL_ENTRY_SKIP` bytes,
//! uncompressed, the same in every such program); another such program's tail call releases
//! its block and jumps past them (`FrameExit::TailEntry`).
//!
//! **Stops.** A failed check, an exhausted budget or an unknown `callx` id leaves from any
//! depth: the stop path reloads sp from `env.entry_sp` and jumps to the entry's epilogue,
//! skipping callee epilogues. So when the code can stop, the entry saves every callee-saved
//! register any function changes.
//!
//! **Fresh registers.** r0 and r3–r9 start at zero in every mode (r1 = ctx, r2 = length, r10 =
//! frame). The entry zeroes only those a run could read before writing (see
//! `analysis::entry_zeroing`); zeroing the rest could not be observed.

use crate::encode::{fits_signed, reg::*, Mem, R3, RI};
use crate::lower::Codegen;
use crate::regs::{
    call_free_map, map, RegMap, BUDGET, CTX_LEN, CTX_START, ENV, REG_MAP, STACK_LEN, STACK_START,
};
use packjit_frontend::analysis::{
    entry_zeroing, live_in, stack_block_size, CodegenMode, LoweringReads,
};
use packjit_frontend::lower::{FrameExit, FrameHooks};
use packjit_frontend::{op_kind, Program, STACK_SIZE};
use packjit_plugin_api::abi::{
    PJ_ENV_BUDGET, PJ_ENV_CTX_END, PJ_ENV_CTX_START, PJ_ENV_ENTRY_SP, PJ_ENV_STACK_END,
    PJ_ENV_STACK_START,
};

/// Per-function frame layout.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    /// Registers saved in the prologue, in slot order (slot `i` at `sp + 8 i`).
    pub saves: Vec<u8>,
    /// Bytes of the save area (a multiple of 16, the RISC-V stack alignment).
    pub save_bytes: i32,
    /// Total bytes subtracted from sp: the save area, plus the stack block for the entry.
    pub size: i32,
    /// Bytes of `size` subtracted after the saves: 0, or the stack block of an entry with
    /// the uniform tail-call frame (saves on top, then the block below them).
    pub below_saves: i32,
}

/// The whole program's frame plan.
#[derive(Clone, Debug)]
pub struct Layout {
    /// One frame per subprogram (index 0 is the entry).
    pub frames: Vec<Frame>,
    /// Bytes of the stack block.
    pub block: i32,
    /// Can the code stop (sandbox checks, budget, `callx`)? Then it keeps `env` in [`ENV`].
    pub can_stop: bool,
    /// eBPF registers (bit n = rn) the entry sets to zero.
    pub zero: u16,
    /// Sandbox: the entry keeps [`CTX_LIM8`] (8-byte context accesses are tested against it).
    pub lim8: bool,
    /// Per instruction, the eBPF registers whose upper 32 bits may still be read
    /// (`analysis::upper_halves_live`): a 32-bit result whose upper half nobody reads skips
    /// its zero-extension. Computed at the first 32-bit ALU operation: many programs have
    /// none, and then the analysis costs nothing.
    pub upper_live: std::cell::OnceCell<Vec<u16>>,
    /// Where each eBPF register lives: [`REG_MAP`], or [`call_free_map`] when the program
    /// calls nothing.
    pub regs: RegMap,
}

/// Sandbox: `max(ctx_len - 7, 0)` (s0, callee-saved, otherwise unused): an 8-byte access at
/// `t = addr - ctx_start` (mod 2^64) is inside the context iff `t < CTX_LIM8`, one compare
/// instead of the two of the general region test (0 when the context is shorter than 8
/// bytes: then nothing passes).
pub(crate) const CTX_LIM8: u8 = 8;

/// Plans every function's frame for `mode`.
pub fn plan(prog: &Program, mode: &CodegenMode, lim8: bool) -> Layout {
    let lim8 = lim8 && mode.sandboxed();
    let block = stack_block_size(prog) as i32;
    let can_stop = mode.keeps_env(prog);
    let zero = entry_zeroing(prog, LOWERING_READS);
    let written_anywhere = prog.subprogs.iter().fold(0, |m, s| m | s.writes);
    let frames = prog
        .subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            let mut saves = Vec::new();
            let entry = k == 0;
            if sp.calls {
                saves.push(RA);
            }
            // A stop skips callee epilogues, so the entry restores what any callee changed.
            let changed = if entry && can_stop {
                written_anywhere | zero
            } else if entry {
                sp.writes | zero
            } else {
                sp.writes
            };
            for bpf in 6..=9 {
                if changed & (1 << bpf) != 0 {
                    saves.push(map(bpf));
                }
            }
            if block > 0 {
                saves.push(S5);
            }
            if entry && can_stop {
                saves.push(ENV);
            }
            if entry && mode.sandboxed() {
                saves.extend_from_slice(&[CTX_START, CTX_LEN]);
                // The stack block's bounds are read only by its tests, which a program
                // without a block has none of.
                if block > 0 {
                    saves.extend_from_slice(&[STACK_START, STACK_LEN]);
                }
            }
            if entry && lim8 {
                saves.push(CTX_LIM8);
            }
            if entry && mode.counts_budget() {
                saves.push(BUDGET);
            }
            let uniform = entry && mode.tail_calls;
            if uniform {
                // The uniform tail-call frame: see `TAIL_ENTRY_SKIP`.
                saves = UNIFORM_SAVES.to_vec();
            }
            let save_bytes = (saves.len() as i32 * 8 + 15) & !15;
            let size = save_bytes + if entry { block } else { 0 };
            Frame {
                saves,
                save_bytes,
                size,
                below_saves: if uniform { block } else { 0 },
            }
        })
        .collect();
    Layout {
        frames,
        block,
        can_stop,
        zero,
        lim8,
        upper_live: std::cell::OnceCell::new(),
        regs: if prog
            .subprogs
            .iter()
            .any(|sp| sp.ops & (op_kind::CALLS | op_kind::MOV_PERCPU) != 0)
        {
            REG_MAP
        } else {
            call_free_map()
        },
    }
}

/// The entry saves of a program that makes tail calls (`CodegenMode::tail_calls`): the
/// return address and every callee-saved register the code can use, always in this order,
/// whatever the program uses, and above the stack block (which the other entries keep
/// above their saves). With them, a tail call between two such programs releases only its
/// block, leaves the saves in place for the target (its epilogue restores the host's
/// registers from them) and jumps past its saves, as the kernel's JITs jump past the
/// prologue of programs that all share one frame.
/// The largest stack block the entry zeroes with straight-line stores (16 `sd`s) rather
/// than a loop.
const STORED_ZEROING_MAX: usize = 128;

const UNIFORM_SAVES: [u8; 13] = [RA, CTX_LIM8, S1, S2, S3, S4, S5, S6, S7, S8, S9, S10, S11];

/// Bytes from the entry of a program with the uniform frame to its tail entry: the save
/// area's `addi sp`, one `sd` per `UNIFORM_SAVES` and `mv s6, a2` (env), 4 bytes each (15
/// instructions). The prologue checks it. The tail entry reserves the block and sets
/// `env` and `entry_sp` again (the same values), then the rest of the program's own entry.
pub const TAIL_ENTRY_SKIP: u32 = 60;

/// What the lowering reads beyond RFC 9669, for the entry's zeroing: r0 for every atomic
/// (conservative: the fetch-and/or/xor loops keep r0's register live across them).
const LOWERING_READS: LoweringReads = LoweringReads {
    kinds: op_kind::ATOMIC,
    regs: 1,
};

impl Codegen<'_> {
    /// `rd = rs + imm` for any 32-bit `imm` (`tmp` holds a wide immediate).
    pub(crate) fn add_imm(&mut self, rd: u8, rs: u8, imm: i64, tmp: u8) {
        if fits_signed(imm, 12) {
            self.e.ri(RI::Addi, rd, rs, imm as i32);
        } else {
            self.e.li(tmp, imm);
            self.e.rrr(R3::Add, rd, rs, tmp);
        }
    }
}

impl<'a> FrameHooks<'a> for Codegen<'a> {
    fn prologue(&mut self, k: usize) {
        let f = self.layout.frames[k].clone();
        let start = self.e.pos();
        let uniform = k == 0 && self.d.mode.tail_calls;
        // The uniform frame's code up to its tail entry is the same bytes in every program,
        // with or without the C extension: no compressed forms there.
        let compressed = self.e.c;
        self.e.c = compressed && !uniform;
        let above = f.size - f.below_saves;
        if above > 0 {
            self.add_imm(SP, SP, -(above as i64), T0);
        }
        // Saves sit at the bottom of their area (small sp offsets: c.sdsp/c.ldsp reach them).
        for (slot, &r) in f.saves.iter().enumerate() {
            self.e.store(Mem::D, r, SP, slot as i32 * 8);
        }
        if uniform {
            // env arrives in a2 (eBPF r3, zeroed below); a tail call keeps it.
            self.e.mv(ENV, A2);
            self.e.c = compressed;
            // Other programs' tail calls land here: the code above must be the same
            // instructions in every program with the uniform frame.
            assert_eq!(
                self.e.pos() - start,
                TAIL_ENTRY_SKIP as usize,
                "the uniform frame's saves changed size: update TAIL_ENTRY_SKIP"
            );
            // A tail call arrives with the caller's r1 and r2: the entry's arguments are set
            // here again from env, and only those the program reads before writing, rather
            // than by every caller (at the host's entry they already hold these values).
            let end = self.d.prog.subprogs[0].end;
            let live = live_in(self.d.prog, 0, end)[0];
            let ctx_placed = self.d.mode.sandboxed() && self.d.access.uses_ctx_const();
            if live & (1 << 2) != 0 {
                self.e.load(Mem::D, A0, ENV, PJ_ENV_CTX_START);
                self.e.load(Mem::D, A1, ENV, PJ_ENV_CTX_END);
                self.e.rrr(R3::Sub, A1, A1, A0);
            } else if live & (1 << 1) != 0 && !ctx_placed {
                self.e.load(Mem::D, A0, ENV, PJ_ENV_CTX_START);
            }
        }
        if f.below_saves > 0 {
            self.add_imm(SP, SP, -(f.below_saves as i64), T0);
        }
        let block = self.layout.block;
        if k != 0 {
            if block > 0 {
                // A callee's frame is the next 512 bytes down the block.
                self.e.ri(RI::Addi, S5, S5, -(STACK_SIZE as i32));
            }
            return;
        }
        if self.layout.can_stop {
            // env arrives in a2 (eBPF r3, zeroed below); keep it for the run, and record
            // where a stop unwinds to (below the block, which the epilogue releases first).
            if !uniform {
                self.e.mv(ENV, A2);
            }
            self.e.store(Mem::D, SP, ENV, PJ_ENV_ENTRY_SP);
        }
        // The block: above the saves, or (uniform frame) below them.
        let block_start = if f.below_saves > 0 { 0 } else { f.save_bytes };
        if block > 0 {
            self.add_imm(S5, SP, (block_start + block) as i64, T0);
        }
        if self.d.mode.sandboxed() {
            self.e.load(Mem::D, CTX_START, ENV, PJ_ENV_CTX_START);
            self.e.load(Mem::D, CTX_LEN, ENV, PJ_ENV_CTX_END);
            self.e.rrr(R3::Sub, CTX_LEN, CTX_LEN, CTX_START);
            if self.layout.lim8 {
                // CTX_LIM8 = len - 7, or 0 when len < 8 (mask = -(len >= 8)).
                self.e.ri(RI::Addi, CTX_LIM8, CTX_LEN, -7);
                self.e.ri(RI::Sltiu, T0, CTX_LEN, 8);
                self.e.ri(RI::Addi, T0, T0, -1);
                self.e.rrr(R3::And, CTX_LIM8, CTX_LIM8, T0);
            }
            if self.d.access.uses_ctx_const() {
                // Checks against the context start plus a constant assume r1 is exactly
                // env.ctx_start.
                self.e.mv(self.map(1), CTX_START);
            }
            if self.d.access.uses_ctx_index() {
                // Index-bounded accesses rest on r2 being exactly the context's length
                // (`packjit_frontend::indexes`), whatever the caller passed.
                self.e.mv(self.map(2), CTX_LEN);
            }
            if block > 0 {
                self.add_imm(STACK_START, SP, block_start as i64, T0);
                self.e.li(STACK_LEN, block as i64);
                self.e.store(Mem::D, STACK_START, ENV, PJ_ENV_STACK_START);
                self.e.store(Mem::D, S5, ENV, PJ_ENV_STACK_END);
            } else {
                // No block: an empty stack region for the helpers' checks (a tail call may
                // arrive from a program that had one).
                self.e.store(Mem::D, ZERO, ENV, PJ_ENV_STACK_START);
                self.e.store(Mem::D, ZERO, ENV, PJ_ENV_STACK_END);
            }
            if block > 0 && block as usize <= STORED_ZEROING_MAX {
                // Nothing of the host leaks in: the block starts zeroed. A few lines: plain
                // stores, no loop to predict.
                for at in (0..block).step_by(8) {
                    self.e.store(Mem::D, ZERO, STACK_START, at);
                }
            } else if block > 0 {
                self.e.zero_fill(STACK_START, S5, T0);
            }
        }
        let ctx_placed = self.d.mode.sandboxed() && self.d.access.uses_ctx_const();
        if self.map(1) != A0 && !ctx_placed {
            // r1 does not live in a0 (`call_free_map`): move the context over, before r0
            // (now a0) is zeroed, unless nothing reads it first.
            let end = self.d.prog.subprogs[0].end;
            if live_in(self.d.prog, 0, end)[0] & (1 << 1) != 0 {
                self.e.mv(self.map(1), A0);
            }
        }
        if self.d.mode.counts_budget() {
            self.e.load(Mem::D, BUDGET, ENV, PJ_ENV_BUDGET);
        }
        for r in 0..10u8 {
            if self.layout.zero & (1 << r) != 0 {
                self.e.li(self.map(r), 0);
            }
        }
    }

    fn epilogue(&mut self, k: usize) {
        self.leave_frame(k, FrameExit::Return);
        self.e.ret();
    }

    /// RISC-V defines no speculation barrier, and no RV64 core is known to speculate past an
    /// unconditional `jal`/`jalr`: nothing is emitted.
    fn speculation_barrier(&mut self) {}

    fn tail_entry_skip(&self) -> u32 {
        TAIL_ENTRY_SKIP
    }

    fn tail_jump(&mut self, exit: FrameExit) {
        if exit == FrameExit::TailEntry {
            // env stays in s6 and the saves stay: only the block goes. The target's tail
            // entry sets the arguments it reads (`prologue`).
            self.e.mv(T1, self.map(0));
            self.leave_frame(0, exit);
            self.e.jump_reg(T1);
            return;
        }
        // t1 holds the target through the restores (caller-saved, no eBPF register, not the
        // t0 the frame's release may use); a2 (r3, dead after the call) holds env.
        self.e.mv(T1, self.map(0));
        self.e.mv(A2, ENV);
        self.leave_frame(0, exit);
        self.e.load(Mem::D, A0, A2, PJ_ENV_CTX_START);
        self.e.load(Mem::D, A1, A2, PJ_ENV_CTX_END);
        self.e.rrr(R3::Sub, A1, A1, A0);
        self.e.jump_reg(T1);
    }
}

impl Codegen<'_> {
    /// Function `k`'s frame undone, up to its return: the budget written back, the saved
    /// registers restored, the frame released.
    fn leave_frame(&mut self, k: usize, exit: FrameExit) {
        let f = self.layout.frames[k].clone();
        if k == 0 {
            if self.d.mode.counts_budget() {
                // The host reads what is left (also after a stop, which lands here).
                self.e.store(Mem::D, BUDGET, ENV, PJ_ENV_BUDGET);
            }
            // The entry returns eBPF r0 in a0.
            if exit == FrameExit::Return && self.map(0) != A0 {
                self.e.mv(A0, self.map(0));
            }
        }
        if f.below_saves > 0 {
            self.add_imm(SP, SP, f.below_saves as i64, T0);
        }
        if exit == FrameExit::TailEntry {
            // The saves stay for the target, whose epilogue restores them.
            return;
        }
        for (slot, &r) in f.saves.iter().enumerate() {
            self.e.load(Mem::D, r, SP, slot as i32 * 8);
        }
        let above = f.size - f.below_saves;
        if above > 0 {
            self.add_imm(SP, SP, above as i64, T0);
        }
    }
}
