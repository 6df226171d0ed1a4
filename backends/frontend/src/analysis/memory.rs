//! The sandbox's memory rules: how big a program's stack block is, and which accesses are
//! proven inside the frame at compile time and which need a run-time check.

use crate::{AluOp, AtomicOp, Op, Program, Size, Width, R10, STACK_SIZE};

/// Bytes of the contiguous stack block a sandboxed run gets: one 512-byte frame per level of
/// the deepest call chain, or 0 when no function reads r10 (nothing could observe a frame).
/// A program of one function whose frame pointers all have offsets known at compile time
/// gets only the part of its frame it can reach ([`frame_reach`]), rounded up to
/// [`FRAME_LINE`] bytes.
///
/// Frame `k` (the entry is `k = 0`) is `[end - 512 (k + 1), end - 512 k)`; a callee's r10 is
/// its caller's r10 - 512. No native data lives inside the block, so the whole block is one
/// region for the checks and it is zeroed at entry (nothing of the host leaks in). Every
/// entry zeroes it, so its size is most of what a short sandboxed run costs over a trusted
/// one: 512 bytes took a `rep stosq` of ~15 ns on x86-64, where a program that keeps a map
/// key at r10 - 4 needs one line.
pub fn stack_block_size(prog: &Program) -> usize {
    if !prog.subprogs.iter().any(|s| s.uses_stack) {
        return 0;
    }
    if prog.subprogs.len() > 1 {
        return prog.call_depth * STACK_SIZE;
    }
    match frame_reach(prog) {
        Some(bytes) => bytes
            .next_multiple_of(FRAME_LINE)
            .clamp(FRAME_LINE, STACK_SIZE),
        None => STACK_SIZE,
    }
}

/// The granule of a reduced stack block: every backend zeroes it in whole rounds (arm64 64
/// bytes per round, RV64 32, x86-64 8) and keeps the stack pointer 16-byte aligned.
pub const FRAME_LINE: usize = 64;

/// What [`frame_reach`] knows of a register: whether it may hold the frame pointer r10 plus
/// an offset, and which. A register may also hold other values on other paths; only its
/// frame-derived values matter, so `At(c)` joined with `NotFrame` stays `At(c)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FrameVal {
    /// Never derived from r10.
    NotFrame,
    /// r10 + c when it is derived from r10.
    At(i64),
    /// Derived from r10 by arithmetic with unknown operands: any offset.
    Anywhere,
}

impl FrameVal {
    fn join(self, other: FrameVal) -> FrameVal {
        match (self, other) {
            (FrameVal::NotFrame, v) | (v, FrameVal::NotFrame) => v,
            (FrameVal::At(a), FrameVal::At(b)) if a == b => self,
            _ => FrameVal::Anywhere,
        }
    }

    fn is_frame(self) -> bool {
        self != FrameVal::NotFrame
    }
}

/// A register state of [`frame_reach`]: r0–r9 (r10 is always the frame pointer itself).
type FrameState = [FrameVal; 10];

/// [`frame_reach`]'s states, one per join: the entry and every jump target
/// (`Program::is_target`), found from the branch list (no pass over the instructions, no
/// per-instruction table); a conditional jump's fall-through continues the walk. Joins run
/// lowest first, so a program without loops visits each instruction once. (The result does
/// not depend on the order: states only grow, and every join runs in its final state.)
struct FrameJoins {
    /// Instruction index of each join, ascending.
    at: Vec<u32>,
    states: Vec<FrameState>,
    /// One bit per join: a state is stored (the first `words` words), the join is queued to
    /// run (the rest).
    bits: Vec<u64>,
    words: usize,
    /// No queued join in a word below this one.
    next: usize,
}

impl FrameJoins {
    fn new(prog: &Program) -> Self {
        let mut at: Vec<u32> = Vec::with_capacity(prog.branches.len() + 1);
        at.push(0);
        at.extend(prog.branches.iter().map(|b| b.target));
        at.sort_unstable();
        at.dedup();
        let words = at.len().div_ceil(64);
        let mut bits = vec![0u64; 2 * words];
        // The entry, reached with nothing derived from r10, queued.
        bits[0] = 1;
        bits[words] = 1;
        FrameJoins {
            states: vec![[FrameVal::NotFrame; 10]; at.len()],
            at,
            bits,
            words,
            next: 0,
        }
    }

    /// Joins `st` into the state of the join at instruction `to`, queueing it if that
    /// changed it. (Past the end: the verifier refuses a path that falls off the program.)
    fn flow(&mut self, to: usize, st: &FrameState) {
        let Ok(b) = self.at.binary_search(&(to as u32)) else {
            return;
        };
        let (w, bit) = (b / 64, 1u64 << (b % 64));
        if self.bits[w] & bit == 0 {
            self.bits[w] |= bit;
            self.states[b] = *st;
        } else {
            let mut changed = false;
            for (o, v) in self.states[b].iter_mut().zip(st) {
                let j = o.join(*v);
                changed |= j != *o;
                *o = j;
            }
            if !changed {
                return;
            }
        }
        self.bits[self.words + w] |= bit;
        self.next = self.next.min(w);
    }

    /// The lowest queued join, taken off the queue: its instruction index and state.
    fn pop(&mut self) -> Option<(usize, FrameState)> {
        let pending = &mut self.bits[self.words..];
        let w = (self.next..self.words).find(|&w| pending[w] != 0)?;
        self.next = w;
        let b = w * 64 + pending[w].trailing_zeros() as usize;
        pending[w] &= pending[w] - 1;
        Some((self.at[b] as usize, self.states[b]))
    }
}

/// Where [`frame_step`] leaves the walk of a block.
enum FrameStep {
    /// On to the next instruction.
    Next,
    /// The path ends.
    Exit,
    /// Only to `target` (`ja`).
    Jump(usize),
    /// To `target` as well as on (a conditional jump).
    Branch(usize),
}

/// [`frame_reach`]'s transfer of one instruction: `st` updated, `lowest` lowered to the
/// lowest frame offset the instruction reaches; `None` when the frame's reach cannot be
/// bounded (a frame pointer moved by an unknown amount and used, or stored).
#[inline]
fn frame_step(op: &Op, st: &mut FrameState, lowest: &mut i64) -> Option<FrameStep> {
    use crate::Operand::{Imm, Reg};
    let get = |st: &FrameState, r: u8| {
        if r == 10 {
            FrameVal::At(0)
        } else {
            st[r as usize]
        }
    };
    let mut reach = |base: FrameVal, off: i64| match base {
        FrameVal::NotFrame => Some(()),
        FrameVal::At(c) => {
            *lowest = (*lowest).min(c.saturating_add(off));
            Some(())
        }
        FrameVal::Anywhere => None,
    };
    match *op {
        Op::Alu {
            width,
            op,
            dst,
            src,
        } => {
            let a = get(st, dst);
            let v = match (width, op, src) {
                (Width::W64, AluOp::Mov, Reg(r)) => get(st, r),
                (_, AluOp::Mov, Imm(_)) => FrameVal::NotFrame,
                (Width::W64, AluOp::Add | AluOp::Sub, Imm(k)) => match a {
                    FrameVal::At(c) if op == AluOp::Add => {
                        FrameVal::At(c.saturating_add(i64::from(k)))
                    }
                    FrameVal::At(c) => FrameVal::At(c.saturating_sub(i64::from(k))),
                    v => v,
                },
                (_, AluOp::Mov, Reg(r)) => match get(st, r) {
                    FrameVal::NotFrame => FrameVal::NotFrame,
                    _ => FrameVal::Anywhere,
                },
                (_, _, src) => {
                    let b = match src {
                        Reg(r) => get(st, r),
                        Imm(_) => FrameVal::NotFrame,
                    };
                    if a.is_frame() || b.is_frame() {
                        FrameVal::Anywhere
                    } else {
                        FrameVal::NotFrame
                    }
                }
            };
            st[dst as usize] = v;
        }
        Op::MovSx { dst, src, .. } | Op::MovPerCpu { dst, src, .. } => {
            st[dst as usize] = match get(st, src) {
                FrameVal::NotFrame => FrameVal::NotFrame,
                _ => FrameVal::Anywhere,
            };
        }
        Op::Neg { dst, .. } | Op::End { dst, .. } => {
            if st[dst as usize].is_frame() {
                st[dst as usize] = FrameVal::Anywhere;
            }
        }
        Op::LdImm64 { dst, .. } => st[dst as usize] = FrameVal::NotFrame,
        Op::Load { dst, base, off, .. } => {
            reach(get(st, base), i64::from(off))?;
            st[dst as usize] = FrameVal::NotFrame;
        }
        Op::Store { base, off, src, .. } => {
            reach(get(st, base), i64::from(off))?;
            if let Reg(r) = src {
                if get(st, r).is_frame() {
                    return None;
                }
            }
        }
        Op::Atomic {
            base,
            off,
            src,
            op,
            fetch,
            ..
        } => {
            reach(get(st, base), i64::from(off))?;
            if get(st, src).is_frame() {
                return None;
            }
            if op == AtomicOp::Cmpxchg {
                st[0] = FrameVal::NotFrame;
            } else if fetch || op == AtomicOp::Xchg {
                st[src as usize] = FrameVal::NotFrame;
            }
        }
        Op::PacketLoad { .. } => st[0] = FrameVal::NotFrame,
        Op::CallHelper { .. } | Op::CallReg { .. } => {
            // A helper may use [ptr, r10) of a frame pointer it gets, in any argument (its
            // arity is not known here).
            for &arg in &st[1..=5] {
                reach(arg, 0)?;
            }
            st[..=5].fill(FrameVal::NotFrame);
        }
        Op::CallLocal { .. } => return None,
        Op::Exit => return Some(FrameStep::Exit),
        Op::Ja { target } => return Some(FrameStep::Jump(target as usize)),
        Op::Jcond { target, .. } => return Some(FrameStep::Branch(target as usize)),
    }
    Some(FrameStep::Next)
}

/// Bytes below r10 that a single-function program can reach through frame pointers: the
/// lowest offset of any access or helper argument derived from r10 (a helper may use
/// `[ptr, r10)` whole). `None` when it cannot be bounded at compile time: a frame pointer
/// moved by an unknown amount and then used, or a frame pointer stored to memory (a later
/// load could bring it back as something the sandbox's own analysis still tracks as a
/// frame address).
///
/// Why a block this size is enough: the sandbox's checks and the helpers' pointer checks
/// accept only the block as the stack region, so a pointer built any other way (from a
/// helper's result, or from the context by arithmetic) reaches nothing below it; and
/// every access the checks skip as proven inside the frame is at a constant offset from a
/// register this analysis tracks, so it is inside the reach.
pub fn frame_reach(prog: &Program) -> Option<usize> {
    let insts = &prog.insts;
    let n = insts.len();
    if n == 0 {
        return Some(0);
    }
    let mut joins = FrameJoins::new(prog);
    let mut lowest = 0i64;
    while let Some((start, state)) = joins.pop() {
        let mut st = state;
        let mut i = start;
        loop {
            match frame_step(&insts[i].op, &mut st, &mut lowest)? {
                FrameStep::Next => {}
                FrameStep::Exit => break,
                FrameStep::Jump(target) => {
                    joins.flow(target, &st);
                    break;
                }
                FrameStep::Branch(target) => joins.flow(target, &st),
            }
            i += 1;
            if i >= n {
                break;
            }
            if prog.is_target[i] {
                joins.flow(i, &st);
                break;
            }
        }
    }
    Some(usize::try_from(lowest.unsigned_abs()).map_or(STACK_SIZE, |b| b.min(STACK_SIZE)))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The traversal as first written (a table of block heads, a state per block, a stack
    /// of blocks to run) over the same transfer ([`frame_step`]): the reference for the
    /// join-list traversal.
    fn frame_reach_by_blocks(prog: &Program) -> Option<usize> {
        type State = [FrameVal; 10];
        let insts = &prog.insts;
        let n = insts.len();
        // Blocks start at the entry, at jump targets and after conditional jumps; the dataflow
        // keeps a state per block start only.
        const NONE: u32 = u32::MAX;
        let mut head = vec![NONE; n];
        let mut starts = vec![0usize];
        let mark = |i: usize, head: &mut Vec<u32>, starts: &mut Vec<usize>| {
            if i < n && head[i] == NONE {
                head[i] = starts.len() as u32;
                starts.push(i);
            }
        };
        if n == 0 {
            return Some(0);
        }
        head[0] = 0;
        for (i, inst) in insts.iter().enumerate() {
            match inst.op {
                Op::Ja { target } => mark(target as usize, &mut head, &mut starts),
                Op::Jcond { target, .. } => {
                    mark(target as usize, &mut head, &mut starts);
                    mark(i + 1, &mut head, &mut starts);
                }
                _ => {}
            }
        }
        let mut states: Vec<Option<State>> = vec![None; starts.len()];
        states[0] = Some([FrameVal::NotFrame; 10]);
        let mut work = vec![0usize];
        let mut lowest = 0i64;
        let flow = |to: usize, st: &State, states: &mut [Option<State>], work: &mut Vec<usize>| {
            // Past the end: the verifier refuses a path that falls off the program.
            let Some(&b) = head.get(to).filter(|&&b| b != NONE) else {
                return;
            };
            let b = b as usize;
            match &mut states[b] {
                None => {
                    states[b] = Some(*st);
                    work.push(b);
                }
                Some(old) => {
                    let mut changed = false;
                    for (o, v) in old.iter_mut().zip(st) {
                        let j = o.join(*v);
                        changed |= j != *o;
                        *o = j;
                    }
                    if changed {
                        work.push(b);
                    }
                }
            }
        };
        while let Some(b) = work.pop() {
            let mut st = states[b].expect("queued with a state");
            let mut i = starts[b];
            loop {
                match frame_step(&insts[i].op, &mut st, &mut lowest)? {
                    FrameStep::Next => {}
                    FrameStep::Exit => break,
                    FrameStep::Jump(target) => {
                        flow(target, &st, &mut states, &mut work);
                        break;
                    }
                    FrameStep::Branch(target) => {
                        flow(target, &st, &mut states, &mut work);
                        flow(i + 1, &st, &mut states, &mut work);
                        break;
                    }
                }
                i += 1;
                if i >= n {
                    break;
                }
                if head[i] != NONE {
                    flow(i, &st, &mut states, &mut work);
                    break;
                }
            }
        }
        Some(usize::try_from(lowest.unsigned_abs()).map_or(STACK_SIZE, |b| b.min(STACK_SIZE)))
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

    fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let o = off.to_le_bytes();
        let i = imm.to_le_bytes();
        [op, (src << 4) | dst, o[0], o[1], i[0], i[1], i[2], i[3]]
    }

    fn block_of(insns: &[[u8; 8]]) -> usize {
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        stack_block_size(&crate::decode(&insns.concat(), &helpers).unwrap())
    }

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    /// A random one-function program that moves frame pointers around: copies of r10,
    /// constant and unknown offsets, accesses and helper calls through them, frame pointers
    /// stored, jumps anywhere (loops included).
    fn random_frame_program(seed: &mut u64) -> Program {
        let mut rnd = |n: u64| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed % n
        };
        let n = 3 + rnd(40) as usize;
        let mut code = Vec::new();
        for at in 0..n - 1 {
            let (d, s) = (rnd(10) as u8, rnd(11) as u8);
            // Memory operands: r10 itself half the time.
            let base = if rnd(2) == 0 { 10 } else { rnd(10) as u8 };
            let off = -8 * (rnd(70) as i16);
            let target = (rnd(n as u64) as i64 - at as i64 - 1) as i16;
            code.push(match rnd(16) {
                0 | 1 => insn(0xbf, d, 10, 0, 0),                  // r_d = r10
                2 | 3 => insn(0x07, d, 0, 0, -8 * rnd(40) as i32), // r_d += -8k
                4 => insn(0x17, d, 0, 0, 8 * rnd(8) as i32),       // r_d -= 8k
                5 => insn(0x0f, d, s, 0, 0),                       // r_d += r_s
                6 => insn(0xbc, d, s, 0, 0),                       // w_d = w_s
                7 => insn(0x79, d, base, off, 0),                  // r_d = *(u64 *)(base + off)
                8 => insn(0x7b, base, s, off, 0),                  // *(u64 *)(base + off) = r_s
                9 => insn(0x62, base, 0, off, 0),                  // *(u32 *)(base + off) = 0
                10 => insn(0xdb, base, d, off, 0), // lock *(u64 *)(base + off) += r_d
                11 => insn(0x85, 0, 0, 0, 1),      // call 1
                12 => insn(0x15, d, 0, target, 0), // if r_d == 0 goto
                13 => insn(0x05, 0, 0, target, 0), // goto
                14 => EXIT,
                _ => insn(0xb7, d, 0, 0, 7), // r_d = 7
            });
        }
        code.push(EXIT);
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        crate::decode(&code.concat(), &helpers).unwrap()
    }

    #[test]
    fn join_list_frame_reach_matches_the_block_version_on_random_programs() {
        let seed0 = 0xf4a3_e5ee_d001_u64;
        println!("seed: {seed0:#x}");
        let mut seed = seed0;
        let mut bounded = 0;
        for _ in 0..20_000 {
            let p = random_frame_program(&mut seed);
            let reach = frame_reach(&p);
            assert_eq!(reach, frame_reach_by_blocks(&p), "{:?}", p.insts);
            bounded += usize::from(reach.is_some_and(|r| r > 0));
        }
        // Both outcomes are exercised.
        assert!((2_000..18_000).contains(&bounded), "{bounded}");
    }

    #[test]
    fn a_single_function_gets_the_lines_of_its_frame_it_reaches() {
        // A map key at r10 - 4 handed to a helper: one line.
        let key = [
            insn(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0
            insn(0xbf, 2, 10, 0, 0),  // r2 = r10
            insn(0x07, 2, 0, 0, -4),  // r2 += -4
            insn(0x85, 0, 0, 0, 1),   // call 1
            EXIT,
        ];
        assert_eq!(block_of(&key), 64);
        // A helper argument reaches from its pointer to r10: 100 bytes are two lines.
        let arg = [
            insn(0xbf, 3, 10, 0, 0),
            insn(0x17, 3, 0, 0, 100), // r3 -= 100
            insn(0x85, 0, 0, 0, 1),
            EXIT,
        ];
        assert_eq!(block_of(&arg), 128);
        // Copies and constant moves of r10 keep their offsets: r10 - 300 - 8 is the lowest.
        let deep = [
            insn(0xbf, 6, 10, 0, 0),
            insn(0x07, 6, 0, 0, -300),
            insn(0xbf, 7, 6, 0, 0),
            insn(0x7a, 7, 0, -8, 1), // *(u64 *)(r7 - 8) = 1
            insn(0x79, 0, 10, -16, 0),
            EXIT,
        ];
        assert_eq!(block_of(&deep), 320);
        // r10 read but never used as an address: the smallest block.
        assert_eq!(block_of(&[insn(0xbf, 0, 10, 0, 0), EXIT]), 64);
        // Offsets past the frame are still one frame (the access itself is refused at run
        // time, as before).
        assert_eq!(block_of(&[insn(0x71, 0, 10, -600, 0), EXIT]), 512);
        // Both sides of a branch: the lower offset counts.
        let branches = [
            insn(0xbf, 2, 10, 0, 0),
            insn(0x15, 1, 0, 2, 0), // if r1 == 0 goto +2
            insn(0x07, 2, 0, 0, -200),
            insn(0x05, 0, 0, 1, 0), // goto +1
            insn(0x07, 2, 0, 0, -8),
            insn(0x71, 0, 2, 0, 0), // r0 = *(u8 *)(r2 + 0): r10 - 200 or r10 - 8
            EXIT,
        ];
        assert_eq!(
            block_of(&branches),
            512,
            "two offsets joined are any offset"
        );
        let one_side = [
            insn(0xbf, 2, 10, 0, 0),
            insn(0x15, 1, 0, 1, 0), // if r1 == 0 goto +1
            insn(0x72, 10, 0, -200, 7),
            insn(0x72, 10, 0, -8, 7),
            insn(0xb7, 0, 0, 0, 0),
            EXIT,
        ];
        assert_eq!(block_of(&one_side), 256);
    }

    #[test]
    fn frame_pointers_with_unknown_offsets_or_stored_get_the_whole_frame() {
        // r2 = r10 + r3: any offset.
        let indexed = [
            insn(0xbf, 2, 10, 0, 0),
            insn(0x0f, 2, 3, 0, 0),
            insn(0x72, 2, 0, -1, 0),
            EXIT,
        ];
        assert_eq!(block_of(&indexed), 512);
        // A 32-bit move of r10 is not an address the analysis can follow.
        let truncated = [insn(0xbc, 2, 10, 0, 0), insn(0x71, 0, 2, 0, 0), EXIT];
        assert_eq!(block_of(&truncated), 512);
        // A frame pointer stored to memory: a reload could bring it back.
        let spilled = [insn(0x7b, 10, 10, -8, 0), EXIT];
        assert_eq!(block_of(&spilled), 512);
        let spilled_copy = [
            insn(0xbf, 1, 10, 0, 0),
            insn(0x07, 1, 0, 0, -8),
            insn(0xdb, 10, 1, -16, 0), // lock *(u64 *)(r10 - 16) += r1
            EXIT,
        ];
        assert_eq!(block_of(&spilled_copy), 512);
        // The same frame pointer moved by unknown amounts in a loop.
        let walk = [
            insn(0xbf, 2, 10, 0, 0),
            insn(0x07, 2, 0, 0, -8),
            insn(0x72, 2, 0, 0, 0), // loop: *(u8 *)(r2 + 0) = 0
            insn(0x07, 2, 0, 0, -8),
            insn(0x55, 1, 0, -3, 0), // if r1 != 0 goto loop
            EXIT,
        ];
        assert_eq!(block_of(&walk), 512);
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
