//! Register dataflow: which registers an instruction reads, which are live where, which the
//! entry must zero so that nothing of the host leaks in, and whose upper 32 bits some path
//! may still read.

use crate::{op_kind, BranchKind, Op, Operand, Program, Size, Width};
use packjit_plugin_api::{CompileError, ErrorKind};
use std::cell::Cell;

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
        Op::MovSx { src, .. } => r(src),
        Op::MovPerCpu { src, array, .. } => r(src) | o(array),
        Op::Neg { dst, .. } | Op::End { dst, .. } => r(dst),
        Op::LdImm64 { .. } | Op::Ja { .. } => 0,
        Op::Load { base, .. } => r(base),
        Op::PacketLoad { index, .. } => index.map_or(0, r),
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

/// [`live_in`] from each instruction's `(reads, writes)` (entry `k` for instruction
/// `start + k`, as [`Program::reads`] and [`Program::writes`] give them), for a caller that
/// has them already.
pub(crate) fn live_in_from(
    prog: &Program,
    start: usize,
    end: usize,
    reads_writes: &[(u16, u16)],
) -> Vec<u16> {
    let at_exit = if start == 0 { 1 } else { 1 | ARG_REGS };
    backward(prog, start, end, |i| {
        if prog.kind(i) == op_kind::EXIT {
            (at_exit, 0)
        } else {
            reads_writes[i - start]
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
    // Each instruction's transfer and successors, worked out once: a loop runs the
    // passes again, and re-deciding them per pass was most of a pass's cost.
    // (reads, kills, next, jump): what is live after `k` is live[next] | live[jump], with
    // `n` (nothing live) standing for "no such successor".
    let mut steps: Vec<(u16, u16, u32, u32)> = Vec::with_capacity(n);
    let mut back_edge = false;
    for k in 0..n {
        let (reads, kills) = gen_kill(start + k);
        let kind = prog.kind(start + k);
        let target = || match prog.insts[start + k].op {
            Op::Ja { target } | Op::Jcond { target, .. } => target as usize - start,
            _ => unreachable!("only jumps have targets"),
        };
        let (next, jump) = if kind & (EXIT | JA | JCOND) == 0 {
            (k + 1, n)
        } else if kind == JA {
            (target(), n)
        } else if kind == JCOND {
            (k + 1, target())
        } else {
            (n, n)
        };
        back_edge |= kind & (JA | JCOND) != 0 && target() <= k;
        steps.push((reads, kills, next as u32, jump as u32));
    }
    let pass = |live: &mut [u16]| {
        let mut changed = false;
        for (k, &(reads, kills, next, jump)) in steps.iter().enumerate().rev() {
            let v = reads | ((live[next as usize] | live[jump as usize]) & !kills);
            changed |= v != live[k];
            live[k] = v;
        }
        changed
    };
    // Without a back-edge one pass is final; a loop adds a pass per nesting level carrying
    // a new bit backwards, plus one to confirm.
    let mut changed = pass(&mut live);
    while back_edge && changed {
        changed = pass(&mut live);
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
/// * A helper call or `callx` reads r1–r5 (its arity is not known; a call the driver
///   expands, only what the expansion reads: [`Program::expanded_calls`]) and leaves r0–r5
///   written: afterwards they hold the helper's values, not the host's entry values.
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
        early |= (call_reads(prog, i) | lowering.of(kind)) & !written & open;
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
    // round settles every function. Each register's question (is it read before written on
    // some path?) is independent of the others', and only `open`'s can have a yes (nothing
    // reads the rest anywhere), so every function is asked about `open` alone.
    // This thread's buffers from its last load (see `SCRATCH`), taken out so that nothing
    // here can find them borrowed.
    let mut scratch: Box<Scratch> =
        (SCRATCH.try_with(Cell::take).ok().flatten()).unwrap_or_default();
    let mut exposed = std::mem::take(&mut scratch.exposed);
    exposed.clear();
    exposed.resize(prog.subprogs.len(), 0u16);
    let single = [0usize];
    let order = if prog.subprogs.len() == 1 {
        None
    } else {
        Some(callees_first(prog))
    };
    for &k in order.as_deref().unwrap_or(&single) {
        let sp = &prog.subprogs[k];
        exposed[k] = exposed_reads(prog, sp.start, sp.end, open, &mut scratch, |i| {
            let op = &prog.insts[i].op;
            let reads = call_reads(prog, i) | lowering.of(op.kind_bit());
            match *op {
                Op::CallHelper { .. } | Op::CallReg { .. } => (reads, CALLER_SAVED),
                Op::CallLocal { target } => (exposed[prog.subprog_of(target as usize)], 1),
                _ => (reads, op.written_reg().map_or(0, |r| 1 << r)),
            }
        });
    }
    let zeroed = exposed[0] & FRESH_REGS;
    scratch.exposed = exposed;
    // Kept for the next load on this thread (nothing is kept during thread teardown).
    let _ = SCRATCH.try_with(|s| s.set(Some(scratch)));
    zeroed
}

/// What instruction `i` reads, where a helper call the driver expands reads only what its
/// expansion does ([`Program::expanded_calls`]: an inlined tail call reads no more than
/// r3), not every argument register.
#[inline]
fn call_reads(prog: &Program, i: usize) -> u16 {
    let reads = prog.reads(i);
    if prog.expanded_calls.is_empty() || !matches!(prog.insts[i].op, Op::CallHelper { .. }) {
        return reads;
    }
    match prog.expanded_calls.binary_search_by_key(&i, |&(at, _)| at) {
        Ok(k) => (reads & !ARG_REGS) | prog.expanded_calls[k].1,
        Err(_) => reads,
    }
}

thread_local! {
    /// [`entry_zeroing`]'s buffers, kept per thread between loads: at most
    /// [`EXACT_ZEROING_MAX`] entries each but for the worklist, and for a small program their
    /// allocation and release cost more than its walk. (Boxed: taking and putting them
    /// back moves a pointer.)
    static SCRATCH: Cell<Option<Box<Scratch>>> = const { Cell::new(None) };
}

/// The registers among `mask` that some path from the function's first instruction reads
/// before writing, with `gen_kill(i)` instruction `i`'s `(reads, kills)`: the registers
/// [`backward`]'s liveness would find live on entry, computed forwards instead.
///
/// Forwards, each instruction carries the registers of `mask` still unwritten on some path
/// reaching it, and only grows; an instruction is revisited only when a new register
/// arrives (at most once per register of `mask`), and nothing is visited once every path
/// has written them all. Backwards, each loop nesting level cost a pass over the whole
/// function: 21–31% of a load on loop-heavy clang programs (issue 45).
fn exposed_reads(
    prog: &Program,
    start: usize,
    end: usize,
    mask: u16,
    scratch: &mut Scratch,
    gen_kill: impl Fn(usize) -> (u16, u16),
) -> u16 {
    let n = end - start;
    if n == 0 || mask == 0 {
        return 0;
    }
    // unwritten[k]: registers of `mask` unwritten on some path to instruction start + k.
    let Scratch {
        unwritten, work, ..
    } = scratch;
    unwritten.clear();
    unwritten.resize(n, 0);
    unwritten[0] = mask;
    let mut exposed = 0u16;
    work.clear();
    work.push(0usize);
    while let Some(mut k) = work.pop() {
        // Runs along the fall-through edge without the worklist: straight-line code is
        // one visit per instruction.
        loop {
            let u = unwritten[k];
            let (reads, kills) = gen_kill(start + k);
            exposed |= reads & u;
            if exposed == mask {
                return exposed;
            }
            let out = u & !kills;
            // One look at the instruction for its successors (this loop is the analysis).
            let (jump, ends) = match prog.insts[start + k].op {
                Op::Ja { target } => (Some(target), true),
                Op::Jcond { target, .. } => (Some(target), false),
                Op::Exit => (None, true),
                _ => (None, false),
            };
            if let Some(target) = jump {
                let t = target as usize - start;
                if out & !unwritten[t] != 0 {
                    unwritten[t] |= out;
                    work.push(t);
                }
            }
            if ends || k + 1 == n || out & !unwritten[k + 1] == 0 {
                break;
            }
            k += 1;
            unwritten[k] |= out;
        }
    }
    exposed
}

/// The buffers of [`entry_zeroing`] and its [`exposed_reads`] walks, reused for every
/// function and, through `SCRATCH`, every load on a thread.
#[derive(Default)]
struct Scratch {
    /// Per instruction of the function walked: registers still unwritten on some path.
    unwritten: Vec<u16>,
    /// Jump targets whose `unwritten` grew and are still to be walked from.
    work: Vec<usize>,
    /// Per function: the registers it reads before writing.
    exposed: Vec<u16>,
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

/// Refuses a program that reads one of r1–r5 after a call, before writing it, on some path
/// (the kernel's verifier rule): after a call those registers hold whatever the helper or
/// callee left, host addresses among them. The call's own arguments are not such reads
/// (which of r1–r5 a helper takes is the helper's business; sandboxed code zeroes them after
/// each helper call, see `lower`). The error names the pc and the register.
pub fn refuse_reads_after_calls(prog: &Program) -> Result<(), CompileError> {
    use crate::op_kind::{CALLS, EXIT, JA, JCOND};
    for sp in &prog.subprogs {
        // Only a call leaves registers undefined: a function without one has nothing to
        // refuse, and most programs have none (a dataflow pass per loop level saved).
        if sp.ops & CALLS == 0 {
            continue;
        }
        let (start, n) = (sp.start, sp.end - sp.start);
        // Per instruction: registers a call may have left undefined on some path to it. A
        // worklist from the calls forward: an instruction is revisited only when its set
        // grows, at most five times (r1-r5), and only what a call reaches is visited at all
        // (the loop-level passes over every instruction this replaced were a sixth of a
        // sandboxed compile).
        let mut dead = vec![0u16; n + 1];
        let target = |k: usize| match prog.insts[start + k].op {
            Op::Ja { target } | Op::Jcond { target, .. } => target as usize - start,
            _ => unreachable!("only jumps have targets"),
        };
        let mut work: Vec<usize> = (0..n)
            .filter(|&k| prog.kind(start + k) & CALLS != 0)
            .collect();
        while let Some(k) = work.pop() {
            let kind = prog.kind(start + k);
            let mut out = dead[k] & !prog.writes(start + k);
            if kind & CALLS != 0 {
                out |= ARG_REGS;
            }
            let mut flow = |to: usize| {
                if dead[to] | out != dead[to] {
                    dead[to] |= out;
                    if to < n {
                        work.push(to);
                    }
                }
            };
            if kind & (JA | JCOND) != 0 {
                flow(target(k));
            }
            if kind & (JA | EXIT) == 0 {
                flow(k + 1);
            }
        }
        for (k, &dead_here) in dead[..n].iter().enumerate() {
            let i = start + k;
            let kind = prog.kind(i);
            let reads = match prog.insts[i].op {
                Op::CallReg { reg } => 1 << reg,
                _ if kind & CALLS != 0 => 0,
                _ => prog.reads(i),
            };
            let bad = reads & dead_here & ARG_REGS;
            if bad != 0 {
                let reg = bad.trailing_zeros();
                return Err(CompileError::at(
                    prog.insts[i].pc as usize,
                    ErrorKind::Verify,
                    format!(
                        "r{reg} is read after a call before it is written (r1-r5 are undefined after a call)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::program;

    #[test]
    fn reads_of_r1_to_r5_after_a_call_are_refused_on_every_path_and_nowhere_else() {
        use crate::encode_insn as i;
        let check =
            |p: &[[u8; 8]]| refuse_reads_after_calls(&program(p)).map_err(|e| (e.pc, e.message));
        // Written after the call: accepted. The callee at pc 4 reads its argument r1.
        let ok = [
            i(0x85, 0, 1, 0, 3), // call pc 4
            i(0xb7, 1, 0, 0, 5),
            i(0xbf, 0, 1, 0, 0),
            i(0x95, 0, 0, 0, 0),
            i(0xbf, 0, 1, 0, 0), // pc 4: r0 = r1 (an argument, not a read after a call)
            i(0x95, 0, 0, 0, 0),
        ];
        assert_eq!(check(&ok), Ok(()));
        // Written on one arm only: the other path reads r2 after the call.
        let one_arm = [
            i(0x85, 0, 1, 0, 5), // call pc 6
            i(0x15, 0, 0, 1, 0), // if r0 == 0 goto +1
            i(0xb7, 2, 0, 0, 1),
            i(0xbf, 0, 2, 0, 0), // pc 3 reads r2
            i(0x95, 0, 0, 0, 0),
            i(0x95, 0, 0, 0, 0),
            i(0xb7, 0, 0, 0, 0), // pc 6
            i(0x95, 0, 0, 0, 0),
        ];
        let (pc, msg) = check(&one_arm).unwrap_err();
        assert_eq!(pc, Some(3));
        assert!(msg.contains("r2"), "{msg}");
        // Around a loop: the call at the end of the body leaves r3 undefined at the head,
        // which reads it (reached only through the back-edge).
        let around_loop = [
            i(0xb7, 3, 0, 0, 1),
            i(0xb7, 6, 0, 0, 4),
            i(0xbf, 0, 3, 0, 0), // pc 2: the loop head reads r3
            i(0x85, 0, 1, 0, 3), // call pc 7
            i(0x07, 6, 0, 0, -1),
            i(0x55, 6, 0, -4, 0), // if r6 != 0 goto pc 2
            i(0x95, 0, 0, 0, 0),
            i(0xb7, 0, 0, 0, 0), // pc 7
            i(0x95, 0, 0, 0, 0),
        ];
        let (pc, msg) = check(&around_loop).unwrap_err();
        assert_eq!(pc, Some(2));
        assert!(msg.contains("r3"), "{msg}");
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
        // A helper call reads r1-r5: r3-r5, never written, are zeroed. Expanded into code
        // that reads only r3 (an inlined tail call), only r3 is; in the exact analysis too
        // (after a branch).
        for branch_first in [false, true] {
            let mut code = vec![i(0x85, 0, 0, 0, 1), mov(0, 0), exit]; // call 1
            if branch_first {
                code.insert(0, i(0x05, 0, 0, 0, 0)); // ja +0
            }
            let call = usize::from(branch_first);
            let mut p = program(&code);
            assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 0b11_1000);
            p.expanded_calls = vec![(call, 1 << 3)];
            assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 1 << 3);
            p.expanded_calls = vec![(call, 0)];
            assert_eq!(entry_zeroing(&p, LoweringReads::NONE), 0);
        }
    }

    /// [`entry_zeroing`]'s dataflow as it was before [`exposed_reads`]: backward liveness
    /// over whole functions, a pass per loop level, on every register. The oracle the
    /// forward version must match exactly (the entry's code depends on it).
    fn entry_zeroing_by_backward(prog: &Program, lowering: LoweringReads) -> u16 {
        const CALLER_SAVED: u16 = 1 | ARG_REGS;
        let mut exposed = vec![0u16; prog.subprogs.len()];
        let order = if prog.subprogs.len() == 1 {
            vec![0]
        } else {
            callees_first(prog)
        };
        for k in order {
            let sp = &prog.subprogs[k];
            let live = backward(prog, sp.start, sp.end, |i| {
                let kind = prog.kind(i);
                let reads = prog.reads(i) | lowering.of(kind);
                if kind & (op_kind::CALL_HELPER | op_kind::CALL_REG) != 0 {
                    (reads, CALLER_SAVED)
                } else if let Op::CallLocal { target } = prog.insts[i].op {
                    (exposed[prog.subprog_of(target as usize)], 1)
                } else {
                    (reads, prog.writes(i))
                }
            });
            exposed[k] = live[0];
        }
        exposed[0] & FRESH_REGS
    }

    /// A random program of up to three functions (the entry calls the others, the second may
    /// call the third): moves, ALU, loads, helper calls, jumps anywhere inside the function
    /// (loops included) and exits, every register used.
    fn random_program(seed: &mut u64) -> Program {
        use crate::encode_insn as i;
        let mut rnd = |n: u64| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed % n
        };
        let funcs = 1 + rnd(3) as usize;
        let lens: Vec<usize> = (0..funcs).map(|_| 4 + rnd(30) as usize).collect();
        let starts: Vec<usize> = lens
            .iter()
            .scan(0, |at, &l| {
                let s = *at;
                *at += l;
                Some(s)
            })
            .collect();
        let mut code = Vec::new();
        for f in 0..funcs {
            let (start, n) = (starts[f], lens[f]);
            for k in 0..n - 1 {
                let at = start + k;
                let (d, s) = (rnd(10) as u8, rnd(11) as u8);
                let off = (start as i64 + rnd(n as u64) as i64 - at as i64 - 1) as i16;
                code.push(match rnd(12) {
                    0 => i(0xb7, d, 0, 0, 1),   // r_d = 1
                    1 => i(0x0f, d, s, 0, 0),   // r_d += r_s
                    2 => i(0xbc, d, s, 0, 0),   // w_d = w_s
                    3 => i(0x79, d, s, 0, 0),   // r_d = *(u64 *)(r_s + 0)
                    4 => i(0x7b, d, s, 0, 0),   // *(u64 *)(r_d + 0) = r_s
                    5 => i(0x85, 0, 0, 0, 1),   // call helper 1
                    6 => i(0x15, d, 0, off, 0), // if r_d == 0 goto target
                    7 => i(0x5d, d, s, off, 0), // if r_d != r_s goto target
                    8 => i(0x05, 0, 0, off, 0), // goto target
                    9 => i(0x95, 0, 0, 0, 0),   // exit
                    10 if f + 1 < funcs => {
                        // call a later function (never an earlier one: no recursion)
                        let callee = f + 1 + rnd((funcs - f - 1) as u64) as usize;
                        i(
                            0x85,
                            0,
                            1,
                            0,
                            (starts[callee] as i64 - at as i64 - 1) as i32,
                        )
                    }
                    _ => i(0x07, d, 0, 0, 3), // r_d += 3
                });
            }
            code.push(i(0x95, 0, 0, 0, 0));
        }
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        crate::decode(&code.concat(), &helpers).unwrap()
    }

    #[test]
    fn forward_entry_zeroing_matches_backward_liveness_on_random_programs() {
        let seed0 = 0x5eed_2e40_u64;
        println!("seed: {seed0:#x}");
        let mut seed = seed0;
        let lowerings = [
            LoweringReads::NONE,
            LoweringReads {
                kinds: crate::op_kind::EXIT,
                regs: 1 << 5,
            },
            LoweringReads {
                kinds: crate::op_kind::CALL_HELPER | crate::op_kind::JCOND,
                regs: 1 << 9 | 1 << 0,
            },
        ];
        for _ in 0..3000 {
            let p = random_program(&mut seed);
            for l in lowerings {
                assert_eq!(
                    entry_zeroing(&p, l),
                    entry_zeroing_by_backward(&p, l),
                    "{l:?} on {:?}",
                    p.insts
                );
            }
        }
    }

    /// The refusal as first written: every instruction of a function with a call, pass after
    /// pass until nothing changes. The reference for the worklist.
    fn refusal_by_passes(prog: &Program) -> Result<(), (usize, u32)> {
        use crate::op_kind::{CALLS, EXIT, JA};
        for sp in &prog.subprogs {
            let (start, n) = (sp.start, sp.end - sp.start);
            let mut dead = vec![0u16; n + 1];
            loop {
                let mut changed = false;
                for k in 0..n {
                    let kind = prog.kind(start + k);
                    let mut out = dead[k] & !prog.writes(start + k);
                    if kind & CALLS != 0 {
                        out |= ARG_REGS;
                    }
                    let mut succs = Vec::new();
                    if let Op::Ja { target } | Op::Jcond { target, .. } = prog.insts[start + k].op {
                        succs.push(target as usize - start);
                    }
                    if kind & (JA | EXIT) == 0 {
                        succs.push(k + 1);
                    }
                    for to in succs {
                        changed |= dead[to] | out != dead[to];
                        dead[to] |= out;
                    }
                }
                if !changed {
                    break;
                }
            }
            for (k, &d) in dead[..n].iter().enumerate() {
                let i = start + k;
                let reads = match prog.insts[i].op {
                    Op::CallReg { reg } => 1 << reg,
                    _ if prog.kind(i) & CALLS != 0 => 0,
                    _ => prog.reads(i),
                };
                let bad = reads & d & ARG_REGS;
                if bad != 0 {
                    return Err((prog.insts[i].pc as usize, bad.trailing_zeros()));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_refusal_worklist_matches_the_pass_by_pass_fixpoint_on_random_programs() {
        let seed0 = 0x5eed_a11c_u64;
        println!("seed: {seed0:#x}");
        let mut seed = seed0;
        let (mut refused, mut accepted) = (0, 0);
        for _ in 0..3000 {
            let p = random_program(&mut seed);
            let got = refuse_reads_after_calls(&p).map_err(|e| {
                let reg = e.message[1..]
                    .split(' ')
                    .next()
                    .unwrap()
                    .parse::<u32>()
                    .unwrap();
                (e.pc.unwrap(), reg)
            });
            assert_eq!(got, refusal_by_passes(&p), "on {:?}", p.insts);
            if got.is_err() {
                refused += 1;
            } else {
                accepted += 1;
            }
        }
        // Both outcomes are exercised.
        assert!(
            refused > 100 && accepted > 100,
            "{refused} refused, {accepted} accepted"
        );
    }
}
