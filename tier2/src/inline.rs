//! Which bpf-to-bpf calls Cranelift inlines: small leaf functions.
//!
//! Every eBPF function is lifted to a Cranelift function of its own ([`crate::lift`]), and a
//! call between them is a native call under the host's C convention: the caller's live
//! values go to callee-saved registers or spill slots around it, and the callee's frame is
//! set up and torn down each time. clang's `static __noinline` helpers that do a few
//! instructions of work per call (`peers.c`'s `calls`: one call per 16-byte chunk) pay that
//! on every iteration; LLVM's JIT inlines them. Here Cranelift's own inliner
//! ([`cranelift_codegen::Context::inline`]) does, with the callee's lifted function as the
//! body: the lifting already gives the callee's semantics exactly (its r10 argument, its
//! stop test's `return`, its budget charges), so the inlined body needs no translation of
//! its own. A callee's `return` becomes a jump to the call's continuation, where the
//! caller's test of `env.stop_kind` still follows, so a stop inside the inlined body still
//! ends the run at the same pc.
//!
//! The policy: a function that makes no local call of its own (no recursion to bound, and
//! one level of inlining covers the helpers clang leaves out of line) and no tail call (the
//! runner's nesting depth is counted per native frame), up to [`MAX_INLINED_INSNS`]
//! eBPF instructions, and at most [`MAX_INLINED_FRAMES`] copies per caller that bring a
//! stack frame of their own. The out-of-line copy is still compiled: other call sites and
//! the line table (the inlined copy carries no source locations) keep it.

use cranelift_codegen::inline::{Inline, InlineCommand};
use cranelift_codegen::ir::{self, ExternalName, Opcode};
use packjit_frontend::{Op, Program};
use std::borrow::Cow;

/// The largest callee inlined, in eBPF instructions: the size of a short hashing or folding
/// helper, not of a program's main loop (each call site gets a copy).
pub(crate) const MAX_INLINED_INSNS: usize = 64;

/// Per function (index as `Program::subprogs`): may its calls be inlined?
pub(crate) fn inlinable(prog: &Program, tail_calls: &[u32]) -> Vec<bool> {
    prog.subprogs
        .iter()
        .enumerate()
        .map(|(k, sp)| {
            k != 0
                && sp.end - sp.start <= MAX_INLINED_INSNS
                && !prog.insts[sp.start..sp.end].iter().any(|i| match i.op {
                    Op::CallLocal { .. } => true,
                    Op::CallHelper { id } => tail_calls.contains(&id),
                    _ => false,
                })
        })
        .collect()
}

/// Does function `k` call a function `inlinable` allows?
pub(crate) fn calls_inlinable(prog: &Program, k: usize, inlinable: &[bool]) -> bool {
    let sp = &prog.subprogs[k];
    prog.insts[sp.start..sp.end].iter().any(|i| match i.op {
        Op::CallLocal { target } => inlinable[prog.subprog_of(target as usize)],
        _ => false,
    })
}

/// The most inlined copies with a stack frame of their own (a trusted callee that keeps
/// some of its frame in memory: a 512-byte Cranelift slot) per caller. Each copy keeps its
/// own slot in the caller's frame (Cranelift does not share them), so without a bound a
/// function calling such a leaf from many sites would grow its native frame by 512 bytes a
/// site; the baseline needs 512 bytes per call level. Further sites keep the call.
pub(crate) const MAX_INLINED_FRAMES: usize = 4;

/// The [`Inline`] policy over one program's lifted functions, for one caller.
pub(crate) struct Inliner<'a> {
    /// Every function as lifted, index as `Program::subprogs`.
    pub lifted: &'a [ir::Function],
    pub inlinable: &'a [bool],
    /// Copies with a frame inlined into this caller so far.
    pub frames: usize,
}

impl Inline for Inliner<'_> {
    fn inline(
        &mut self,
        caller: &ir::Function,
        _call_inst: ir::Inst,
        call_opcode: ir::Opcode,
        callee: ir::FuncRef,
        _call_args: &[ir::Value],
    ) -> InlineCommand<'_> {
        if call_opcode != Opcode::Call {
            return InlineCommand::KeepCall;
        }
        // The lifter names function k `UserExternalName::new(0, k)` (`lift::call_local`).
        let ExternalName::User(name) = caller.dfg.ext_funcs[callee].name else {
            return InlineCommand::KeepCall;
        };
        let index = caller.params.user_named_funcs()[name].index as usize;
        match (self.inlinable.get(index), self.lifted.get(index)) {
            (Some(true), Some(body)) => {
                if !body.sized_stack_slots.is_empty() {
                    if self.frames == MAX_INLINED_FRAMES {
                        return InlineCommand::KeepCall;
                    }
                    self.frames += 1;
                }
                InlineCommand::Inline {
                    callee: Cow::Borrowed(body),
                    // Inlinable callees make no local calls: nothing more to visit.
                    visit_callee: false,
                }
            }
            _ => InlineCommand::KeepCall,
        }
    }
}
