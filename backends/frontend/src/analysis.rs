//! Target-independent facts the backends lower from: which instructions touch the frame,
//! how big a sandboxed program's stack block is, what an access must be checked against,
//! what a back-edge charges the instruction budget, and how constants are blinded.
//!
//! Every rule here is also what the reference evaluator implements, so a rule lives in one
//! place and the differential tests compare like with like.

use crate::ranges::AccessPlan;
use crate::{op_kind, BranchKind, Op, Operand, Program, Size, Width, R10, STACK_SIZE};
use packjit_plugin_api::{
    pj_inline_bit, CompileError, CompileRequest, ErrorKind, HelperEntry, PJ_COMPILE_ALL_FLAGS,
    PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_BUDGET, PJ_COMPILE_PERCPU_INSN, PJ_COMPILE_SANDBOX,
    PJ_HELPER_PERCPU_OFFSET, PJ_INLINE_COUNTER_CLOCK, PJ_INLINE_NONE, PJ_INLINE_PERCPU_LOOKUP,
    PJ_INLINE_RSEQ_CPU_ID,
};

/// One label per instruction for the lowering to jump to, made by `new_label`: a label of
/// its own for each instruction `access` says may be jumped to (the branch and call targets,
/// and where sandboxed code's checked copies rejoin, see [`AccessPlan::jumped_to`]), and for
/// the others `unbound`, a label the lowering never binds (a jump to it fails the final
/// patching loudly).
///
/// Labelling only those matters at scale: an assembler label is a table slot, a bind and a
/// lookup, and most instructions are jumped to by nothing.
pub fn instruction_labels<L: Copy + 'static>(
    prog: &Program,
    access: &AccessPlan,
    unbound: L,
    mut new_label: impl FnMut() -> L,
) -> crate::scratch::Reused<L> {
    // Filled first, then overwritten at the few targets: cheaper than a push per
    // instruction.
    let mut labels = crate::scratch::take(prog.insts.len());
    labels.resize(prog.insts.len(), unbound);
    for (i, label) in labels.iter_mut().enumerate() {
        if access.jumped_to(prog, i) {
            *label = new_label();
        }
    }
    labels
}

/// How much a lowering's buffers should hold for one program, so that each is allocated
/// once: regrowing a buffer copies it, into fresh pages when it is large (page faults were
/// a third of a 1 M-instruction compile). Generous for large programs, whose untouched
/// capacity costs nothing, and small enough for a small program's buffers to come from the
/// allocator's fast per-thread cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmitCapacity {
    /// Code bytes.
    pub code: usize,
    /// Assembler labels: the instructions jumped to (branch and call targets, and when
    /// sandboxed where checked copies rejoin, see [`instruction_labels`]), two per function,
    /// and the sandbox's and the budget's (at most two per instruction).
    pub labels: usize,
    /// Label-relative branch and call sites: the program's branches (some lower to two),
    /// the calls and epilogue jumps per function, and the checks' branches.
    pub branch_sites: usize,
}

impl EmitCapacity {
    /// For `prog` in `mode`, by a backend that emits up to `code_per_insn.0` bytes per
    /// instruction in trusted code and `code_per_insn.1` with checks (sandbox or budget).
    pub fn for_program(prog: &Program, mode: &CodegenMode, code_per_insn: (usize, usize)) -> Self {
        let n = prog.insts.len();
        let functions = prog.subprogs.len();
        let branches = prog.branches.len();
        let checked = mode.sandboxed() || mode.counts_budget();
        let (per_insn, checked_labels, checked_sites) = if checked {
            (code_per_insn.1, 3 * n, 2 * n)
        } else {
            (code_per_insn.0, 0, 0)
        };
        EmitCapacity {
            code: 128 + n * per_insn,
            labels: branches + 2 * functions + checked_labels + 16,
            branch_sites: 2 * branches + 4 * functions + checked_sites + 8,
        }
    }
}

/// r1–r5, the argument registers of helper and local calls (bit n = rn).
pub const ARG_REGS: u16 = 0b11_1110;

/// The BPF registers `op` reads (bit n = rn), by RFC 9669 semantics: what a register's value
/// can influence. A local call reads what its callee may read before writing it
/// (`local_call_reads`; [`ARG_REGS`] when unknown); a helper call may read all five
/// arguments; `exit` reads r0. Backends decide from this which registers the entry must
/// zero (nothing of the host may leak in) and which callee-saved registers to preserve; a
/// backend whose lowering of an instruction also *preserves* a register around it (e.g. r0
/// around a compare-exchange loop) adds that register itself.
pub fn regs_read(op: &Op, local_call_reads: u16) -> u16 {
    let r = |x: u8| 1u16 << x;
    let o = |x: Operand| match x {
        Operand::Reg(x) => r(x),
        Operand::Imm(_) => 0,
    };
    match *op {
        Op::Alu {
            op: crate::AluOp::Mov,
            src,
            ..
        } => o(src),
        Op::Alu { dst, src, .. } => r(dst) | o(src),
        Op::MovSx { src, .. } | Op::MovPerCpu { src, .. } => r(src),
        Op::Neg { dst, .. } | Op::End { dst, .. } => r(dst),
        Op::LdImm64 { .. } | Op::Ja { .. } => 0,
        Op::Load { base, .. } => r(base),
        Op::Store { base, src, .. } => r(base) | o(src),
        Op::Atomic { base, src, op, .. } => {
            r(base)
                | r(src)
                | if op == crate::AtomicOp::Cmpxchg {
                    r(0)
                } else {
                    0
                }
        }
        Op::Jcond { dst, src, .. } => r(dst) | o(src),
        Op::CallHelper { .. } => ARG_REGS,
        Op::CallReg { reg } => ARG_REGS | r(reg),
        Op::CallLocal { .. } => local_call_reads,
        Op::Exit => r(0),
    }
}

/// The registers live on entry to each instruction of the function `start..end` (bit n =
/// rn; entry `k` is instruction `start + k`, and the extra last entry, for falling off the
/// end, is empty): read by some path from there before being written.
///
/// Conservative where a backend could otherwise be surprised: calls kill only r0 (what a
/// caller-saved r1–r5 holds after a helper is not defined, but it may well be the value from
/// before the call, so that value counts as live), a local call reads all of r1–r5, and the
/// `exit` of a called function reads r0–r5 (its caller may read them after the call, which
/// RFC 9669 leaves undefined but the registers are shared, so that value counts too).
pub fn live_in(prog: &Program, start: usize, end: usize) -> Vec<u16> {
    let at_exit = if start == 0 { 1 } else { 1 | ARG_REGS };
    backward(prog, start, end, |i| {
        if prog.kind(i) == op_kind::EXIT {
            (at_exit, 0)
        } else {
            (prog.reads(i), prog.writes(i))
        }
    })
}

/// Backward dataflow over the function `start..end` to its fixpoint, for transfers of the
/// form `live before = reads | (live after & !kills)`: `gen_kill(i)` gives instruction `i`'s
/// `(reads, kills)`, and what is live after it is the union over its successors (falling off
/// the end has nothing live). A loop adds a pass per nesting level carrying a new bit
/// backwards, plus one to confirm; without a back-edge one pass is final.
fn backward(
    prog: &Program,
    start: usize,
    end: usize,
    gen_kill: impl Fn(usize) -> (u16, u16),
) -> Vec<u16> {
    use crate::op_kind::{EXIT, JA, JCOND};
    let n = end - start;
    let mut live = vec![0u16; n + 1];
    let target = |k: usize| match prog.insts[start + k].op {
        Op::Ja { target } | Op::Jcond { target, .. } => target as usize - start,
        _ => unreachable!("only jumps have targets"),
    };
    let out = |live: &[u16], k: usize| {
        let kind = prog.kind(start + k);
        if kind & (EXIT | JA | JCOND) == 0 {
            live[k + 1]
        } else if kind == JA {
            live[target(k)]
        } else if kind == JCOND {
            live[k + 1] | live[target(k)]
        } else {
            0
        }
    };
    let mut back_edge = false;
    for k in (0..n).rev() {
        if prog.kind(start + k) & (JA | JCOND) != 0 {
            back_edge |= target(k) <= k;
        }
        let (reads, kills) = gen_kill(start + k);
        live[k] = reads | (out(&live, k) & !kills);
    }
    while back_edge {
        let mut changed = false;
        for k in (0..n).rev() {
            let (reads, kills) = gen_kill(start + k);
            let v = reads | (out(&live, k) & !kills);
            changed |= v != live[k];
            live[k] = v;
        }
        back_edge = changed;
    }
    live
}

/// r0 and r3–r9: the registers the host does not set at entry (r1 = context, r2 = its
/// length, r10 = frame pointer).
pub const FRESH_REGS: u16 = 0b11_1111_1001;

/// The largest program whose entry zeroing is exact. Exactness saves at most eight
/// instructions per program (one per register zeroed): worth a dataflow pass per loop level
/// on small programs, where those instructions are a visible share of the code, and not on
/// large ones, where they are not but the passes are a visible share of compile time.
pub const EXACT_ZEROING_MAX: usize = 512;

/// Registers a backend's lowering reads beyond RFC 9669: every instruction of the
/// [`op_kind`] bits `kinds` also reads `regs` (a register it briefly uses as
/// scratch and restores, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoweringReads {
    /// Instruction kinds (`op_kind` bits).
    pub kinds: u16,
    /// The registers (bit n = rn) they also read.
    pub regs: u16,
}

impl LoweringReads {
    /// A lowering that reads what RFC 9669 says and nothing more.
    pub const NONE: LoweringReads = LoweringReads { kinds: 0, regs: 0 };

    fn of(self, kind: u16) -> u16 {
        if kind & self.kinds != 0 {
            self.regs
        } else {
            0
        }
    }
}

/// The registers among [`FRESH_REGS`] the entry must zero, so that nothing of the host leaks
/// in and every run sees them start at zero: those some path reads before any instruction
/// writes them, through any depth of local calls. Exact up to paths (a branch the program
/// can never take still counts), where a per-block scan would zero everything read anywhere
/// past the first branch.
///
/// * A helper call or `callx` reads r1–r5 (its arity is not known) and leaves r0–r5 written:
///   afterwards they hold the helper's values, not the host's entry values.
/// * A local call reads what its callee reads before writing (computed per function, to a
///   fixpoint over the call graph, so recursion terminates) and writes r0. That kill is
///   exact: `exit` reads r0, so a callee with a path that leaves r0 unwritten reads it, and
///   the call then reads it too.
/// * `exit` reads r0.
/// * `lowering` adds what the backend's lowering reads beyond RFC 9669.
///
/// Cheap in the usual case: the entry's first straight-line stretch runs first, whole, on
/// every path, so what it reads before writing must be zeroed and what it writes first never
/// is; once that settles every register read anywhere, the dataflow is skipped. Programs
/// over [`EXACT_ZEROING_MAX`] instructions zero what the stretch leaves open instead.
pub fn entry_zeroing(prog: &Program, lowering: LoweringReads) -> u16 {
    const CALLER_SAVED: u16 = 1 | ARG_REGS;
    let (reads, kinds) = prog
        .subprogs
        .iter()
        .fold((0u16, 0u16), |(r, k), sp| (r | sp.reads, k | sp.ops));
    let extra = if kinds & lowering.kinds != 0 {
        lowering.regs
    } else {
        0
    };
    let open = FRESH_REGS & (reads | extra);
    // The stretch runs to the first jump, exit or local call, through jump targets: any
    // path that re-enters it at a target got there after running all of it once, so what it
    // wrote first was written then.
    let (mut early, mut written) = (0u16, 0u16);
    for i in 0..prog.subprogs[0].end {
        let kind = prog.kind(i);
        if kind == op_kind::CALL_LOCAL {
            break;
        }
        early |= (prog.reads(i) | lowering.of(kind)) & !written & open;
        written |= if kind & (op_kind::CALL_HELPER | op_kind::CALL_REG) != 0 {
            CALLER_SAVED
        } else {
            prog.writes(i)
        };
        if (early | written) & open == open {
            return early;
        }
        if kind & (op_kind::JA | op_kind::JCOND | op_kind::EXIT) != 0 {
            break;
        }
    }
    if prog.insts.len() > EXACT_ZEROING_MAX {
        // Whatever the stretch left open is zeroed: sound (a register some path reads
        // unwritten is among them), and at most eight needless instructions.
        return early | (open & !written);
    }
    // The verifier rejects recursion, so the call graph is acyclic: with callees first, one
    // round settles every function.
    let mut exposed = vec![0u16; prog.subprogs.len()];
    let single = [0usize];
    let order = if prog.subprogs.len() == 1 {
        None
    } else {
        Some(callees_first(prog))
    };
    for &k in order.as_deref().unwrap_or(&single) {
        let sp = &prog.subprogs[k];
        let live = backward(prog, sp.start, sp.end, |i| {
            let kind = prog.kind(i);
            let reads = prog.reads(i) | lowering.of(kind);
            if kind & (op_kind::CALL_HELPER | op_kind::CALL_REG) != 0 {
                (reads, CALLER_SAVED)
            } else if kind == op_kind::CALL_LOCAL {
                let Op::CallLocal { target } = prog.insts[i].op else {
                    unreachable!("the kind says local call")
                };
                (exposed[prog.subprog_of(target as usize)], 1)
            } else {
                (reads, prog.writes(i))
            }
        });
        exposed[k] = live[0];
    }
    exposed[0] & FRESH_REGS
}

/// The functions of `prog` (indices into `subprogs`), every callee before its callers: a
/// post-order walk of the call graph, whose edges are the local calls among the decoder's
/// branch list. The verifier rejects recursion, so the graph is acyclic.
fn callees_first(prog: &Program) -> Vec<usize> {
    let n = prog.subprogs.len();
    let mut callees: Vec<Vec<usize>> = vec![Vec::new(); n];
    for b in prog
        .branches
        .iter()
        .filter(|b| b.kind == BranchKind::CallLocal)
    {
        callees[prog.subprog_of(b.at as usize)].push(prog.subprog_of(b.target as usize));
    }
    let (mut order, mut seen) = (Vec::with_capacity(n), vec![false; n]);
    for root in 0..n {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        // (function, next callee to visit)
        let mut stack = vec![(root, 0usize)];
        while let Some(&mut (k, ref mut next)) = stack.last_mut() {
            if let Some(&c) = callees[k].get(*next) {
                *next += 1;
                if !seen[c] {
                    seen[c] = true;
                    stack.push((c, 0));
                }
            } else {
                order.push(k);
                stack.pop();
            }
        }
    }
    order
}

/// For a backend whose 32-bit operations leave the upper half of their result undefined
/// unless it clears it (RV64's `addw` sign-extends, say): the registers (bit n = rn) whose
/// upper 32 bits some path may still read, on entry to each instruction (index as
/// [`Program::insts`], plus one past the end). After a 32-bit ALU operation at `i` whose
/// destination is not in entry `i + 1`, nothing ever looks at the upper half, and the
/// zero-extension RFC 9669 asks for cannot be observed.
///
/// What reads only the low halves, by RFC 9669: every 32-bit ALU operation (`mov32`'s source;
/// both operands of the others, division and modulo included), every 32-bit conditional
/// jump and the value of a 1-, 2- or 4-byte store. A backend using this must lower exactly
/// those reading nothing above bit 31 of their inputs. Everything else reads whole
/// registers, conservatively: `exit` reads r0 (in a called function r0–r9, which its caller
/// may go on to read), a local call reads r0–r9 (its callee may), helpers and `callx` read
/// r1–r5 and leave r0–r5 written.
pub fn upper_halves_live(prog: &Program) -> Vec<u16> {
    const ALL: u16 = 0b11_1111_1111;
    const CALLER_SAVED: u16 = 1 | ARG_REGS;
    let mut all = Vec::with_capacity(prog.insts.len() + 1);
    for (k, sp) in prog.subprogs.iter().enumerate() {
        let at_exit = if k == 0 { 1 } else { ALL };
        let live = backward(prog, sp.start, sp.end, |i| {
            let op = &prog.insts[i].op;
            let (reads, kills) = match *op {
                Op::Alu {
                    width: Width::W32, ..
                } => (0, op.written_reg().map_or(0, |r| 1u16 << r)),
                Op::Jcond {
                    width: Width::W32, ..
                } => (0, 0),
                Op::Store {
                    size: Size::B | Size::H | Size::W,
                    base,
                    ..
                } => (1u16 << base, 0),
                Op::Exit => (at_exit, 0),
                Op::CallLocal { .. } => (ALL, 1),
                Op::CallHelper { .. } | Op::CallReg { .. } => {
                    (regs_read(op, ARG_REGS), CALLER_SAVED)
                }
                _ => (
                    regs_read(op, ARG_REGS),
                    op.written_reg().map_or(0, |r| 1u16 << r),
                ),
            };
            (reads & ALL, kills)
        });
        all.extend_from_slice(&live[..sp.end - sp.start]);
    }
    all.push(0);
    all
}

/// Whether the memory checks of the sandbox are emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryChecks {
    /// Trusted code: accesses go to whatever address the program computes.
    Unchecked,
    /// Sandboxed code: every access not proven safe is checked at run time.
    Checked,
}

/// Whether the instruction budget is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Budget {
    /// No counting.
    Unlimited,
    /// Back-edges and calls charge `PjExecEnv::budget` (see [`back_edge_charge`]).
    Counted,
}

/// How a request asks the code to be generated, validated once for every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodegenMode {
    /// Memory checks (sandbox) on or off.
    pub memory: MemoryChecks,
    /// Instruction budget on or off.
    pub budget: Budget,
    /// `Some(key)` when immediates are blinded with a key derived from `key`.
    pub blind_key: Option<u64>,
    /// Optional CPU features the backend may use.
    pub features: u64,
}

impl CodegenMode {
    /// Trusted code, no budget, no blinding, no optional features.
    pub const TRUSTED: CodegenMode = CodegenMode {
        memory: MemoryChecks::Unchecked,
        budget: Budget::Unlimited,
        blind_key: None,
        features: 0,
    };

    /// Is this sandboxed code?
    pub fn sandboxed(&self) -> bool {
        self.memory == MemoryChecks::Checked
    }

    /// Does the code count the budget?
    pub fn counts_budget(&self) -> bool {
        self.budget == Budget::Counted
    }
}

/// Validates the request's flags and feature bits against what `arch` (a backend name such as
/// "arm64") supports, with the same messages for every backend.
pub fn validate_request(
    req: &CompileRequest<'_>,
    arch: &str,
    supported_features: u64,
) -> Result<CodegenMode, CompileError> {
    if req.flags & !PJ_COMPILE_ALL_FLAGS != 0 {
        return Err(CompileError::new(
            ErrorKind::Unsupported,
            format!(
                "unknown compile flags 0x{:x} (defined: 0x{PJ_COMPILE_ALL_FLAGS:x})",
                req.flags & !PJ_COMPILE_ALL_FLAGS
            ),
        ));
    }
    if req.flags & PJ_COMPILE_PERCPU_INSN != 0
        && !req.helpers.iter().any(|h| h.id == PJ_HELPER_PERCPU_OFFSET)
    {
        return Err(CompileError::new(
            ErrorKind::InvalidArgument,
            format!("PJ_COMPILE_PERCPU_INSN without a per-CPU table entry (helper id {PJ_HELPER_PERCPU_OFFSET:#x})"),
        ));
    }
    if req.features & !supported_features != 0 {
        return Err(CompileError::new(
            ErrorKind::Unsupported,
            format!(
                "unknown {arch} feature bits 0x{:x} (supported: 0x{supported_features:x})",
                req.features & !supported_features
            ),
        ));
    }
    Ok(CodegenMode {
        memory: if req.flags & PJ_COMPILE_SANDBOX != 0 {
            MemoryChecks::Checked
        } else {
            MemoryChecks::Unchecked
        },
        budget: if req.flags & PJ_COMPILE_BUDGET != 0 {
            Budget::Counted
        } else {
            Budget::Unlimited
        },
        blind_key: (req.flags & PJ_COMPILE_BLIND_CONSTANTS != 0).then_some(req.blind_key),
        features: req.features,
    })
}

/// Bytes of the contiguous stack block a sandboxed run gets: one 512-byte frame per level of
/// the deepest call chain, or 0 when no function reads r10 (nothing could observe a frame).
///
/// Frame `k` (the entry is `k = 0`) is `[end - 512 (k + 1), end - 512 k)`; a callee's r10 is
/// its caller's r10 - 512. No native data lives inside the block, so the whole block is one
/// region for the checks and it is zeroed at entry (nothing of the host leaks in).
pub fn stack_block_size(prog: &Program) -> usize {
    if prog.subprogs.iter().any(|s| s.uses_stack) {
        prog.call_depth * STACK_SIZE
    } else {
        0
    }
}

/// Is `[r10 + off, r10 + off + size)` inside the current frame? Such accesses are proven safe
/// at compile time and carry no run-time check.
pub fn is_frame_constant(base: u8, off: i16, size: Size) -> bool {
    base == R10 && off as i64 >= -(STACK_SIZE as i64) && off as i64 + size.bytes() as i64 <= 0
}

/// Does this instruction need a sandbox check? `Some((base, off, size))` for loads, stores
/// and atomics whose address is not [frame-constant](is_frame_constant).
pub fn checked_access(op: &Op) -> Option<(u8, i16, Size)> {
    let (base, off, size) = match *op {
        Op::Load {
            base, off, size, ..
        }
        | Op::Store {
            base, off, size, ..
        }
        | Op::Atomic {
            base, off, size, ..
        } => (base, off, size),
        _ => return None,
    };
    (!is_frame_constant(base, off, size)).then_some((base, off, size))
}

/// What a taken jump from instruction index `from` to index `to` charges the budget:
/// `from.pc - to.pc + 1` for a jump to an earlier or the same pc (a back-edge), nothing for a
/// forward jump. A bpf-to-bpf call charges [`CALL_CHARGE`]. The check happens before the
/// jump: if the charge exceeds the budget left, the program stops at `from.pc` with the
/// budget untouched.
///
/// Indices are in pc order, so a forward jump is told apart without reading the target's
/// instruction: at 1 M instructions that read was a cache miss for nearly every jump.
#[inline]
pub fn back_edge_charge(prog: &Program, from: usize, to: usize) -> Option<u64> {
    (to <= from).then(|| (prog.insts[from].pc - prog.insts[to].pc + 1) as u64)
}

/// Budget charged by each bpf-to-bpf call (bounds the work of call-heavy straight-line code;
/// recursion is rejected at load, so calls alone cannot loop).
pub const CALL_CHARGE: u64 = 1;

/// The per-constant blinding key for the instruction at `pc`: a SplitMix64 step over the
/// program key and the pc, so equal immediates at different pcs get different masks.
pub fn blinding_mask(program_key: u64, pc: usize) -> u64 {
    let mut z = program_key ^ (pc as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(insns: &[[u8; 8]]) -> Program {
        crate::decode(
            &insns.concat(),
            &[HelperEntry {
                id: 1,
                inline_kind: 0,
                addr: 0x1000,
            }],
        )
        .expect("valid program")
    }

    #[test]
    fn callx_tables_need_enough_dense_called_helpers() {
        let h = |id, inline_kind, addr| HelperEntry {
            id,
            inline_kind,
            addr,
        };
        let called = |ids: &[u32]| -> Vec<HelperEntry> {
            ids.iter()
                .map(|&id| h(id, PJ_INLINE_NONE, 0x1000 + id as u64))
                .collect()
        };
        // Dense: a table with 0 in the holes; an inlined helper, the per-CPU entry and a
        // large id stay out of it; the first entry for an id wins.
        let mut hs = called(&[1, 2, 3, 5]);
        hs.push(h(8, PJ_INLINE_RSEQ_CPU_ID, 0x70));
        hs.push(h(PJ_HELPER_PERCPU_OFFSET, PJ_INLINE_NONE, 0x9999));
        hs.push(h(2, PJ_INLINE_NONE, 0x7777));
        hs.push(h(0x7043_0001, PJ_INLINE_NONE, 0x8888));
        let plan = callx_plan(&hs);
        assert_eq!(plan.table, Some(vec![0, 0x1001, 0x1002, 0x1003, 0, 0x1005]));
        // Compared for: the inlined one, then the id too large for any table.
        let compared: Vec<u32> = plan.compared.iter().map(|h| h.id).collect();
        assert_eq!(compared, [8, 0x7043_0001]);
        // Too few, too sparse (largest id ≥ 4 × count), or past the size limit: compares.
        let few = callx_plan(&called(&[1, 2, 3]));
        assert_eq!((few.table, few.compared.len()), (None, 3));
        assert_eq!(callx_plan(&called(&[1, 2, 3, 16])).table, None);
        assert!(callx_plan(&called(&[1, 2, 3, 15])).table.is_some());
        let many: Vec<u32> = (400..600).collect();
        assert_eq!(callx_plan(&called(&many)).table, None);
    }

    #[test]
    fn labels_go_on_targets_and_where_checked_copies_rejoin() {
        use crate::encode_insn as i;
        let prog = program(&[
            i(0xb7, 0, 0, 0, 0), // 0: r0 = 0
            i(0x61, 2, 1, 0, 0), // 1: r2 = *(u32 *)(r1 + 0)  } a check group
            i(0x61, 3, 1, 4, 0), // 2: r3 = *(u32 *)(r1 + 4)  }
            i(0x15, 2, 0, 1, 0), // 3: if r2 == 0 goto 5
            i(0x07, 0, 0, 0, 1), // 4: r0 += 1
            i(0x95, 0, 0, 0, 0), // 5: exit
        ]);
        let mut next = 0;
        let mut new_label = || {
            next += 1;
            next
        };
        // Trusted code (no access plan): only the jump target.
        let trusted = AccessPlan::default();
        let labels = instruction_labels(&prog, &trusted, 0, &mut new_label);
        assert_eq!(*labels, [0, 0, 0, 0, 0, 1]);
        // Sandboxed: the group's checked copy rejoins at 3, after its last member.
        let sandboxed = crate::ranges::plan_accesses(&prog, true);
        assert_eq!(
            sandboxed
                .groups
                .iter()
                .map(|g| (g.first, g.last))
                .collect::<Vec<_>>(),
            [(1, 2)]
        );
        let labels = instruction_labels(&prog, &sandboxed, 0, &mut new_label);
        assert_eq!(*labels, [0, 0, 0, 2, 0, 3]);
        let jumped_to: Vec<bool> = (0..6).map(|k| sandboxed.jumped_to(&prog, k)).collect();
        assert_eq!(jumped_to, [false, false, false, true, false, true]);
    }

    #[test]
    fn large_programs_zero_what_the_first_stretch_leaves_open() {
        use crate::encode_insn as i;
        // r6 is written on both arms before it is read: exact zeroing leaves it alone.
        let code = |filler: usize| {
            let mut p = vec![
                i(0x15, 1, 0, 2, 0), // if r1 == 0 goto +2
                i(0xb7, 6, 0, 0, 1),
                i(0x05, 0, 0, 1, 0), // goto +1
                i(0xb7, 6, 0, 0, 2),
                i(0xbf, 0, 6, 0, 0), // r0 = r6
            ];
            p.extend(std::iter::repeat_n(i(0x07, 0, 0, 0, 1), filler));
            p.push(i(0x95, 0, 0, 0, 0));
            program(&p)
        };
        assert_eq!(entry_zeroing(&code(0), LoweringReads::NONE), 0);
        // Past the limit, what the stretch up to the first branch did not decide is zeroed:
        // a superset of the exact answer, never less.
        let big = code(EXACT_ZEROING_MAX);
        assert!(big.insts.len() > EXACT_ZEROING_MAX);
        assert_eq!(entry_zeroing(&big, LoweringReads::NONE), 1 << 6 | 1);
    }

    #[test]
    fn upper_halves_are_live_only_until_a_whole_register_read() {
        use crate::encode_insn as i;
        let p = program(&[
            i(0xa4, 1, 0, 0, -1),  // 0: xor32 r1, -1
            i(0x04, 1, 0, 0, 1),   // 1: add32 r1, 1     (reads r1's low half)
            i(0x63, 10, 1, -4, 0), // 2: *(u32 *)(r10 - 4) = r1 (low half)
            i(0x16, 1, 0, 1, 7),   // 3: if w1 == 7 goto 5 (low half)
            i(0xbf, 0, 1, 0, 0),   // 4: r0 = r1          (all of r1)
            i(0x85, 0, 0, 0, 1),   // 5: call helper 1   (all of r1–r5; r0–r5 written)
            i(0x95, 0, 0, 0, 0),   // 6: exit            (all of r0)
        ]);
        let live = upper_halves_live(&p);
        assert_eq!(live.len(), p.insts.len() + 1);
        let r1 = |k: usize| live[k] & (1 << 1) != 0;
        // r1's upper half is read at 4 (on one path) and 5: live up to 3, but 0's and 1's
        // results are read only by 32-bit operations before 1 and 1 overwrites them.
        assert!(!r1(1), "xor32's result is read only by add32");
        assert!(r1(2) && r1(3) && r1(4) && r1(5));
        assert!(!r1(6), "the call wrote r1");
        assert_eq!(live[6], 1, "exit reads r0");
    }

    #[test]
    fn the_entry_zeroes_exactly_what_some_path_reads_before_writing() {
        use crate::encode_insn as i;
        let mov = |d, imm| i(0xb7, d, 0, 0, imm);
        let exit = i(0x95, 0, 0, 0, 0);
        // r6 is written on both arms before the join reads it, r7 on one arm only; r4 is read
        // by a move and r3 by the helper call (whose arity is unknown); r5 is written before
        // the call reads it.
        let p = program(&[
            mov(0, 0),
            i(0x15, 1, 0, 2, 0), // if r1 == 0 goto +2
            mov(6, 1),
            i(0x05, 0, 0, 2, 0), // goto +2
            mov(6, 2),
            mov(7, 3),
            i(0x0f, 0, 6, 0, 0), // r0 += r6
            i(0x0f, 0, 7, 0, 0), // r0 += r7
            i(0xbf, 5, 4, 0, 0), // r5 = r4
            i(0x85, 0, 0, 0, 1), // call helper 1
            i(0x0f, 0, 3, 0, 0), // r0 += r3
            exit,
        ]);
        assert_eq!(
            entry_zeroing(&p, LoweringReads::NONE),
            1 << 7 | 1 << 4 | 1 << 3
        );
        // r8 is read by a callee before anything writes it. The callee writes r0 and r9
        // before its caller reads them: the call writes r0, but of the rest nothing counts
        // as written for certain.
        let p = program(&[
            i(0x85, 0, 1, 0, 2), // call local +2
            i(0x0f, 0, 9, 0, 0), // r0 += r9
            exit,
            i(0xbf, 0, 8, 0, 0), // r0 = r8
            mov(9, 1),
            exit,
        ]);
        assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 1 << 8 | 1 << 9);
        // A loop whose head is inside the entry's first stretch: r7 is written before the
        // head, r8 only after its read there (so the first pass reads it unwritten).
        let p = program(&[
            mov(0, 0),
            mov(7, 1),
            i(0x0f, 0, 7, 0, 0), // head: r0 += r7
            i(0x0f, 0, 8, 0, 0), // r0 += r8
            mov(8, 2),
            i(0x55, 0, 0, -4, 9), // if r0 != 9 goto head
            exit,
        ]);
        assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 1 << 8);
        // A callee that may exit without writing r0 hands its caller's r0 back.
        let p = program(&[
            i(0x85, 0, 1, 0, 1), // call local +1
            exit,
            i(0x15, 1, 0, 1, 0), // if r1 == 0 goto +1
            mov(0, 1),
            exit,
        ]);
        assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 1);
        // A backend's extra read counts like any other.
        let p = program(&[mov(0, 0), exit]);
        assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 0);
        let exit_reads_r5 = LoweringReads {
            kinds: crate::op_kind::EXIT,
            regs: 1 << 5,
        };
        assert_eq!(entry_zeroing(&p, exit_reads_r5), 1 << 5);
    }

    #[test]
    fn inline_kinds_are_checked_against_the_backend_and_decoded_once() {
        let cpu = HelperEntry {
            id: 8,
            inline_kind: PJ_INLINE_RSEQ_CPU_ID,
            addr: (-0x70i64) as u64,
        };
        let clock = HelperEntry {
            id: 5,
            inline_kind: PJ_INLINE_COUNTER_CLOCK,
            addr: 0x1000,
        };
        let call = HelperEntry {
            id: 1,
            inline_kind: PJ_INLINE_NONE,
            addr: 0x2000,
        };
        let both = pj_inline_bit(PJ_INLINE_RSEQ_CPU_ID) | pj_inline_bit(PJ_INLINE_COUNTER_CLOCK);
        assert!(validate_inline_kinds(&[cpu, clock, call], "x", both).is_ok());
        // A backend that does not announce a kind refuses it, naming the helper.
        let e = validate_inline_kinds(&[call, clock], "arm64", pj_inline_bit(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(
            e.message
                .starts_with("helper id 5: inline kind 2 is not supported by the arm64 backend"),
            "{e}"
        );
        let odd = HelperEntry {
            inline_kind: 40,
            ..call
        };
        assert!(validate_inline_kinds(&[odd], "x", u32::MAX).is_err());
        let null_clock = HelperEntry { addr: 0, ..clock };
        assert_eq!(
            validate_inline_kinds(&[null_clock], "x", both)
                .unwrap_err()
                .kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            helper_lowering(&cpu),
            HelperLowering::RseqCpuId { offset: -0x70 }
        );
        assert_eq!(
            helper_lowering(&clock),
            HelperLowering::CounterClock { scale: 0x1000 }
        );
        assert_eq!(helper_lowering(&call), HelperLowering::Call(0x2000));
    }

    #[test]
    fn frame_constant_bounds() {
        assert!(is_frame_constant(R10, -8, Size::DW));
        assert!(is_frame_constant(R10, -512, Size::DW));
        assert!(!is_frame_constant(R10, -513, Size::B));
        assert!(!is_frame_constant(R10, -4, Size::DW));
        assert!(!is_frame_constant(R10, 0, Size::B));
        assert!(!is_frame_constant(1, -8, Size::DW));
    }

    #[test]
    fn charges() {
        // Index (slot): 0 (0-1) lddw; 1 (2) ja -3, to 0; 2 (3) ja -1, to itself; 3 (4) ja +0;
        // 4 (5) exit.
        use crate::encode_insn;
        let mut code = encode_insn(0x18, 0, 0, 0, 7).to_vec();
        code.extend(encode_insn(0, 0, 0, 0, 0));
        for off in [-3, -1, 0] {
            code.extend(encode_insn(0x05, 0, 0, off, 0));
        }
        code.extend(encode_insn(0x95, 0, 0, 0, 0));
        let prog = crate::decode(&code, &[]).unwrap();
        assert_eq!(back_edge_charge(&prog, 1, 0), Some(3));
        assert_eq!(back_edge_charge(&prog, 2, 2), Some(1));
        assert_eq!(back_edge_charge(&prog, 3, 4), None);
    }

    #[test]
    fn request_validation_names_the_bits() {
        let req = CompileRequest {
            code: &[],
            helpers: &[],
            features: 0b100,
            flags: 0,
            blind_key: 0,
        };
        let e = validate_request(&req, "arm64", 1).unwrap_err();
        assert_eq!(e.message, "unknown arm64 feature bits 0x4 (supported: 0x1)");
        let e = validate_request(
            &CompileRequest {
                features: 0,
                flags: 1 << 7,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap_err();
        assert!(e.message.starts_with("unknown compile flags 0x80"), "{e}");
        let m = validate_request(
            &CompileRequest {
                features: 1,
                flags: PJ_COMPILE_SANDBOX | PJ_COMPILE_BLIND_CONSTANTS,
                blind_key: 9,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap();
        assert!(m.sandboxed() && !m.counts_budget());
        assert_eq!(m.blind_key, Some(9));
        // The per-CPU mov opt-in needs the table entry it reads.
        let e = validate_request(
            &CompileRequest {
                flags: PJ_COMPILE_PERCPU_INSN,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("PJ_COMPILE_PERCPU_INSN"), "{e}");
        let table = [HelperEntry {
            id: PJ_HELPER_PERCPU_OFFSET,
            inline_kind: 0,
            addr: 0x1000,
        }];
        validate_request(
            &CompileRequest {
                flags: PJ_COMPILE_PERCPU_INSN,
                features: 0,
                helpers: &table,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap();
        // A table entry claiming an inline kind, or NULL, is refused.
        for bad in [
            HelperEntry {
                inline_kind: PJ_INLINE_PERCPU_LOOKUP,
                ..table[0]
            },
            HelperEntry {
                addr: 0,
                ..table[0]
            },
        ] {
            assert!(validate_inline_kinds(&[bad], "arm64", u32::MAX).is_err());
        }
    }

    #[test]
    fn stack_block_follows_call_depth() {
        // mov r1, r10 ; call +1 ; exit ; (f1) mov r0, 0 ; exit
        let code: Vec<u8> = [
            [0xbf, 0xa1, 0, 0, 0, 0, 0, 0],
            [0x85, 0x10, 0, 0, 1, 0, 0, 0],
            [0x95, 0, 0, 0, 0, 0, 0, 0],
            [0xb7, 0, 0, 0, 0, 0, 0, 0],
            [0x95, 0, 0, 0, 0, 0, 0, 0],
        ]
        .concat();
        let p = crate::decode(&code, &[]).unwrap();
        assert_eq!(p.call_depth, 2);
        assert_eq!(stack_block_size(&p), 1024);
    }
}

/// How a backend emits `call imm` (and a `callx` match) for one helper-table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelperLowering {
    /// `call` the `extern "C"` function at this address.
    Call(u64),
    /// r0 = the `u32` at `thread pointer + offset` (this thread's rseq `cpu_id`), zero-extended.
    RseqCpuId {
        /// Signed byte offset from the thread pointer.
        offset: i64,
    },
    /// r0 = monotonic nanoseconds from the CPU counter, scaled by the `PjClockScale` the code
    /// reads at `scale` when it runs.
    CounterClock {
        /// Address of the host's `PjClockScale`.
        scale: u64,
    },
    /// r0 = this CPU's element `r2` of per-CPU array `r1`, or 0 (see
    /// `PJ_INLINE_PERCPU_LOOKUP`); the code reads the table at `table` when it runs.
    PerCpuLookup {
        /// Address of the host's `PjPerCpuTable` (arrays follow it).
        table: u64,
    },
}

/// The lowering of `h` (its kind already checked by [`validate_inline_kinds`]).
pub fn helper_lowering(h: &HelperEntry) -> HelperLowering {
    match h.inline_kind {
        PJ_INLINE_RSEQ_CPU_ID => HelperLowering::RseqCpuId {
            offset: h.addr as i64,
        },
        PJ_INLINE_COUNTER_CLOCK => HelperLowering::CounterClock { scale: h.addr },
        PJ_INLINE_PERCPU_LOOKUP => HelperLowering::PerCpuLookup { table: h.addr },
        _ => HelperLowering::Call(h.addr),
    }
}

/// How a `callx` site finds the helper its register names (by id, as `call imm` does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallxPlan {
    /// Helpers compared for one by one, first, in this order: the inlined ones, then the
    /// called ones `table` does not hold (all of them when there is no table).
    pub compared: Vec<HelperEntry>,
    /// `table[id]`: the address of called helper `id`, or 0 where there is none. Present
    /// when enough called ids are small and dense (see [`callx_plan`]): the site then
    /// bounds-checks the id, loads the address and tests it for 0, a constant number of
    /// instructions instead of a compare and an address per helper. A backend places the
    /// table in the code image (it is data: never executed, and not counted as
    /// instructions).
    pub table: Option<Vec<u64>>,
}

/// Below this many tabled helpers a `callx` site compares ids; from here on a table is
/// shorter and constant-time.
pub const CALLX_TABLE_MIN: usize = 4;

/// The largest `callx` table: 512 entries (4 KiB of code image per program). Ids from here
/// up (packjit's own built-ins, say) are compared for.
pub const CALLX_TABLE_MAX: usize = 512;

/// The helpers a `callx` can reach, and which go in a table: the first entry for an id wins
/// (as in `CompileRequest::helper`), and the per-CPU table entry is not callable. Called
/// helpers with ids under [`CALLX_TABLE_MAX`] form a table when there are at least
/// [`CALLX_TABLE_MIN`] of them and the largest id is under 4 × their count (holes stay a
/// minority of the table's bytes); a helper at address 0 counts as none.
pub fn callx_plan(helpers: &[HelperEntry]) -> CallxPlan {
    let mut seen = std::collections::HashSet::new();
    let (mut inlined, mut called) = (Vec::new(), Vec::new());
    for h in helpers {
        if h.id == PJ_HELPER_PERCPU_OFFSET || !seen.insert(h.id) {
            continue;
        }
        match helper_lowering(h) {
            HelperLowering::Call(_) => called.push(*h),
            _ => inlined.push(*h),
        }
    }
    let small: Vec<&HelperEntry> = called
        .iter()
        .filter(|h| (h.id as usize) < CALLX_TABLE_MAX)
        .collect();
    let max_id = small.iter().map(|h| h.id as usize).max().unwrap_or(0);
    let table = (small.len() >= CALLX_TABLE_MIN && max_id < 4 * small.len()).then(|| {
        let mut t = vec![0u64; max_id + 1];
        for h in &small {
            t[h.id as usize] = h.addr;
        }
        t
    });
    let tabled = |h: &HelperEntry| table.is_some() && (h.id as usize) < CALLX_TABLE_MAX;
    let mut compared = inlined;
    compared.extend(called.iter().filter(|h| !tabled(h)));
    CallxPlan { compared, table }
}

/// Refuses helper entries whose `inline_kind` the backend (`arch`, supporting the
/// `pj_inline_bit` set `supported`) does not emit, or whose parameter cannot be right (a
/// NULL clock scale), with the same messages for every backend.
pub fn validate_inline_kinds(
    helpers: &[HelperEntry],
    arch: &str,
    supported: u32,
) -> Result<(), CompileError> {
    for h in helpers {
        let k = h.inline_kind;
        if h.id == PJ_HELPER_PERCPU_OFFSET && (k != PJ_INLINE_NONE || h.addr == 0) {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "helper id {:#x} (per-CPU table): inline kind must be 0 and the table non-NULL, is kind {k}, table {:#x}",
                    h.id, h.addr
                ),
            ));
        }
        if k == PJ_INLINE_NONE {
            continue;
        }
        if k >= 32 || supported & pj_inline_bit(k) == 0 {
            return Err(CompileError::new(
                ErrorKind::Unsupported,
                format!(
                    "helper id {}: inline kind {k} is not supported by the {arch} backend (supported bits: 0x{supported:x})",
                    h.id
                ),
            ));
        }
        if (k == PJ_INLINE_COUNTER_CLOCK || k == PJ_INLINE_PERCPU_LOOKUP) && h.addr == 0 {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "helper id {}: inline kind {k} with a NULL parameter block",
                    h.id
                ),
            ));
        }
    }
    Ok(())
}

/// Code-generation switches that exist **only for measurement** (the sandbox benches). Each
/// backend takes them through a hidden Rust-only entry point, never from the plugin ABI or
/// the runtime, which always emit with [`EmitOptions::default`]. Turning `spectre_clamp` off
/// makes sandboxed code unsafe under speculation.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmitOptions {
    /// Emit the Spectre-v1 clamp (conditional select/move or mask) after each inline check.
    pub spectre_clamp: bool,
    /// Share one widened check among grouped accesses (`ranges::group_accesses`).
    pub group_checks: bool,
}

impl Default for EmitOptions {
    fn default() -> Self {
        EmitOptions {
            spectre_clamp: true,
            group_checks: true,
        }
    }
}
