//! Frames: what each (sub)program saves, prologue and epilogue.
//!
//! ```text
//!   higher addresses
//!   ┌──────────────────────────┐ ← caller's sp = r10 (s5) of a function that reads r10
//!   │ 512-byte eBPF stack      │   valid eBPF accesses: [r10 - 512, r10)
//!   ├──────────────────────────┤
//!   │ saved registers          │   ra (if it calls), s1–s4 it writes, s5 (if it has a stack)
//!   └──────────────────────────┘ ← sp (saves at small offsets: c.sdsp / c.ldsp reach them)
//!   lower addresses
//! ```
//!
//! Functions that never read r10 get no stack area at all: nothing could observe it.

use crate::encode::{reg::*, Mem, RI};
use crate::lower::Codegen;
use packjit_frontend::{analysis::reads_r10, Program};

/// Per-function frame layout.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    /// Registers saved in the prologue, in slot order.
    pub saves: Vec<u8>,
    /// Has a 512-byte BPF stack (reads r10).
    pub stack: bool,
    /// Total bytes subtracted from sp.
    pub size: i32,
}

/// Plans every function's frame.
pub fn plan(prog: &Program, has_callx: bool) -> Vec<Frame> {
    prog.subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            let insts = &prog.insts[sp.start..sp.end];
            let stack = insts.iter().any(|i| reads_r10(&i.op));
            let mut saves = Vec::new();
            if k == 0 && has_callx {
                // callx's abort path leaves from any depth straight through the entry
                // epilogue, skipping callee epilogues: the entry must restore every
                // callee-saved register any function may have changed.
                saves.extend_from_slice(&[RA, S1, S2, S3, S4, S5, S6]);
            } else {
                if sp.calls {
                    saves.push(RA);
                }
                for (bpf, native) in [(6, S1), (7, S2), (8, S3), (9, S4)] {
                    if sp.writes & (1 << bpf) != 0 {
                        saves.push(native);
                    }
                }
                if stack {
                    saves.push(S5);
                }
            }
            let save_bytes = (saves.len() as i32 * 8 + 15) & !15;
            let size = save_bytes
                + if stack {
                    packjit_frontend::STACK_SIZE as i32
                } else {
                    0
                };
            Frame { saves, stack, size }
        })
        .collect()
}

impl Codegen<'_> {
    pub(crate) fn prologue(&mut self, k: usize) {
        let f = self.frames[k].clone();
        if f.size > 0 {
            self.e.ri(RI::Addi, SP, SP, -f.size);
        }
        // Saves sit at the bottom of the frame (small sp offsets: c.sdsp/c.ldsp reach
        // them), the 512-byte BPF area on top, so r10 is the caller's sp.
        for (slot, &r) in f.saves.iter().enumerate() {
            self.e.store(Mem::D, r, SP, slot as i32 * 8);
        }
        if f.stack {
            self.e.ri(RI::Addi, S5, SP, f.size);
        }
        if k == 0 && self.has_callx {
            self.e.mv(S6, SP);
        }
    }

    pub(crate) fn epilogue(&mut self, k: usize) {
        let f = self.frames[k].clone();
        if k == 0 {
            // The entry returns BPF r0 in a0.
            self.e.mv(A0, A5);
        }
        for (slot, &r) in f.saves.iter().enumerate() {
            self.e.load(Mem::D, r, SP, slot as i32 * 8);
        }
        if f.size > 0 {
            self.e.ri(RI::Addi, SP, SP, f.size);
        }
        self.e.ret();
    }
}
