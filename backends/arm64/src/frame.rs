//! Prologue and epilogue, one place for both.
//!
//! ```text
//!   higher addresses
//!   +---------------------------+  <- sp at entry (16-byte aligned)
//!   | x29, x30 (frame record)   |  only when the subprogram calls
//!   | saved x19..x22 [, x26]    |  only those written (pairs; a lone one takes 16 bytes)
//!   +---------------------------+  <- x26 (entry only, when callx can unwind from a callee)
//!   | BPF frame, 512 bytes      |  only when the subprogram reads r10; r10 = sp + 512
//!   +---------------------------+  <- sp while the body runs
//!   lower addresses
//! ```

use dynasmrt::{dynasm, DynasmApi, DynasmLabelApi};
use packjit_frontend::analysis::reads_r10;
use packjit_frontend::{Op, Program, STACK_SIZE};

use crate::lower::Emitter;
use crate::regs::*;

/// What a subprogram's prologue saves and reserves.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    /// Push the frame record (x29, x30): the subprogram makes calls.
    pub(crate) save_lr: bool,
    /// Callee-saved registers to preserve, in push order.
    pub(crate) saved: Vec<u8>,
    /// Reserve the 512-byte BPF stack.
    pub(crate) stack: bool,
    /// Set x26 = sp after the pushes (entry subprogram, callx inside a subprogram).
    pub(crate) abort_anchor: bool,
}

pub(crate) fn plan_frames(prog: &Program) -> Vec<Frame> {
    let callx_in_sub = prog.subprogs.iter().skip(1).any(|sp| {
        prog.insts[sp.start..sp.end]
            .iter()
            .any(|i| matches!(i.op, Op::CallReg { .. }))
    });
    let all_writes = prog.subprogs.iter().fold(0u16, |acc, sp| acc | sp.writes);
    prog.subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            let insts = &prog.insts[sp.start..sp.end];
            let calls = insts.iter().any(|i| {
                matches!(
                    i.op,
                    Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. }
                )
            });
            let stack = insts.iter().any(|i| reads_r10(&i.op));
            let mut writes = insts
                .iter()
                .filter_map(|i| i.op.written_reg())
                .fold(0u16, |a, r| a | 1 << r);
            writes |= sp.writes;
            let abort_anchor = k == 0 && callx_in_sub;
            if abort_anchor {
                // An unknown callx id unwinds straight from a nested frame to the entry's
                // epilogue, skipping the callees' restores: the entry must then preserve
                // every callee-saved register any subprogram touches.
                writes |= all_writes;
            }
            let mut saved: Vec<u8> = (6..=9)
                .filter(|r| writes & (1 << r) != 0)
                .map(|r| REG_MAP[r])
                .collect();
            if abort_anchor {
                saved.push(ABORT_SP);
            }
            Frame {
                save_lr: calls,
                saved,
                stack,
                abort_anchor,
            }
        })
        .collect()
}

impl Emitter<'_> {
    pub(crate) fn prologue(&mut self, k: usize) {
        let f = &self.frames[k];
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
        if f.abort_anchor {
            a64!(self.ops; mov XSP(ABORT_SP), sp);
        }
        if f.stack {
            a64!(self.ops; sub sp, sp, STACK_SIZE as u32);
        }
    }

    pub(crate) fn epilogue(&mut self, k: usize) {
        let f = self.frames[k].clone();
        let epi = self.epilogues[k];
        a64!(self.ops; =>epi);
        if f.stack {
            a64!(self.ops; add sp, sp, STACK_SIZE as u32);
        }
        if k == 0 {
            let restore = self.restore;
            // Only the entry returns to native code: r0 goes to x0. Subprograms return r0
            // in x7 where their caller expects it.
            a64!(self.ops; =>restore ; mov X(RET), X(REG_MAP[0]));
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
        a64!(self.ops; ret);
    }
}
