//! Load combining: the bytes a program assembles with loads, shifts and ors become one wide
//! load (and a byte swap for big-endian assembly).
//!
//! clang splits every load it cannot prove aligned into byte loads and rebuilds the value
//! (`w = p[0] | p[1] << 8 | … | p[7] << 56`; a network field as `p[0] << 8 | p[1]`): 22 eBPF
//! instructions for one 8-byte word. The baseline JIT emits them one by one. Here a pass
//! over each basic block follows which memory bytes each register holds at which byte
//! position; an `or` whose result is 2, 4 or 8 contiguous bytes in order (or in reverse
//! order) is lifted as that load instead. The byte loads, shifts and ors that then feed
//! nothing are not lifted at all: Cranelift removes dead arithmetic, but not dead loads.
//!
//! Why the value is the same:
//! * the bytes come from one base: the base register as it was at one of the byte loads
//!   (the lifter takes its SSA value there, so a later write of the register, even by the
//!   last byte load itself, does not matter);
//! * every store, atomic and call forgets what is known (memory may have changed, calls
//!   clobber r1–r5), and so does a block boundary;
//! * an instruction is left out only when what it wrote is dead (the front end's liveness
//!   at the block's end, then backwards through the block with the wide loads in place),
//!   and only if it cannot have an effect of its own: ALU operations, constants, and loads
//!   that cannot stop the program.
//!
//! Sandboxed, only loads the front end proved inside a region take part: the wide load then
//! touches exactly the bytes those loads were allowed to touch, and a checked load, which
//! stops the program by itself when out of bounds, stays as it is.
//!
//! Only on hosts where an unaligned load is an ordinary load (x86-64, aarch64). RISC-V may
//! trap on one and leave it to the kernel to emulate, which costs far more than the bytes.

use packjit_frontend::analysis::{regs_read, ARG_REGS};
use packjit_frontend::{AluOp, Inst, Op, Operand, Reg, Size, Width, R10};

/// What the lifter does with one instruction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Action {
    /// Lifted as it is.
    Lift,
    /// Not lifted: what it computes is only used through a wide load.
    Skip,
    /// Lifted as a wide load (an `or` that completes an assembly).
    Wide(WideLoad),
}

/// In which order the assembled bytes sit in memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ByteOrder {
    /// Lowest address in the lowest byte: a plain load on these hosts.
    Little,
    /// Lowest address in the highest byte (network order): a load, then a byte swap.
    Big,
}

/// `size` bytes at `base + off`, zero-extended, where `base` is register `base` as
/// instruction `base_at` (function-relative index, one of the byte loads) reads it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct WideLoad {
    pub base: Reg,
    pub base_at: usize,
    pub off: i16,
    pub size: Size,
    pub order: ByteOrder,
}

/// The actions for one function, and at which instructions the lifter must take a base
/// register's value for a later wide load.
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    pub capture: Vec<bool>,
}

/// One register's known content: byte `j` of the value (bits `8j..8j + 8`) is the memory
/// byte at `base + at[j]`, or zero where `at[j]` is `None`. The base is register `base` in
/// its `version` (see [`plan`]), as read by instruction `base_at`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Bytes {
    base: Reg,
    version: u32,
    base_at: usize,
    at: [Option<i16>; 8],
}

impl Bytes {
    /// The value at `width`: a 32-bit operation sees (and leaves) only the low four bytes.
    fn at_width(mut self, width: Width) -> Self {
        if width == Width::W32 {
            self.at[4..].fill(None);
        }
        self
    }

    fn shifted_left(mut self, bytes: usize, width: Width) -> Self {
        self.at.rotate_right(bytes);
        self.at[..bytes].fill(None);
        self.at_width(width)
    }

    fn shifted_right(mut self, bytes: usize) -> Self {
        self.at.rotate_left(bytes);
        self.at[8 - bytes..].fill(None);
        self
    }

    /// `self | other`, when both hold bytes of one base at distinct positions.
    fn or(self, other: Self) -> Option<Self> {
        if (self.base, self.version) != (other.base, other.version) {
            return None;
        }
        let mut at = self.at;
        for (mine, theirs) in at.iter_mut().zip(other.at) {
            match (*mine, theirs) {
                (Some(_), Some(_)) => return None,
                (None, t) => *mine = t,
                (Some(_), None) => {}
            }
        }
        Some(Self { at, ..self })
    }

    /// The load this content is, if it is 2, 4 or 8 contiguous bytes in either order.
    fn as_load(&self) -> Option<WideLoad> {
        let n = self.at.iter().take_while(|b| b.is_some()).count();
        let size = match n {
            2 => Size::H,
            4 => Size::W,
            8 => Size::DW,
            _ => return None,
        };
        if self.at[n..].iter().any(Option::is_some) {
            return None;
        }
        let first = self.at[0]?;
        let follows = |step: i16| (0..n).all(|j| self.at[j] == first.checked_add(step * j as i16));
        let (off, order) = if follows(1) {
            (first, ByteOrder::Little)
        } else if follows(-1) {
            (first.checked_sub(n as i16 - 1)?, ByteOrder::Big)
        } else {
            return None;
        };
        Some(WideLoad {
            base: self.base,
            base_at: self.base_at,
            off,
            size,
            order,
        })
    }
}

/// What registers r0–r9 hold within the current block.
struct Known {
    regs: [Option<Bytes>; 10],
    /// Per register r0–r10: bumped at each write, so two reads of a register with the same
    /// version read the same value.
    version: [u32; 11],
}

impl Known {
    fn get(&self, r: Reg, width: Width) -> Option<Bytes> {
        Some(self.regs.get(r as usize).copied()??.at_width(width))
    }

    fn set(&mut self, r: Reg, content: Option<Bytes>) {
        if let Some(slot) = self.regs.get_mut(r as usize) {
            *slot = content;
        }
    }

    /// What an `or` of `dst` and `src` at `width` would hold.
    fn or(&self, width: Width, dst: Reg, src: Reg) -> Option<Bytes> {
        self.get(dst, width)?.or(self.get(src, width)?)
    }

    /// Records what instruction `k` leaves in the registers.
    fn step(&mut self, k: usize, op: &Op, proven: bool) {
        let content = match *op {
            Op::Load {
                size,
                sign_extend: false,
                base,
                off,
                ..
            } if base != R10 && proven => {
                let mut at = [None; 8];
                for (j, b) in at.iter_mut().enumerate().take(size.bytes() as usize) {
                    *b = off.checked_add(j as i16);
                }
                // A byte whose offset leaves `i16` is not addressable from the base by one
                // load: such loads take no part.
                let whole = at.iter().take(size.bytes() as usize).all(Option::is_some);
                let bytes = Bytes {
                    base,
                    version: self.version[base as usize],
                    base_at: k,
                    at,
                };
                whole.then_some(bytes)
            }
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => match (op, src) {
                (AluOp::Mov, Operand::Reg(s)) => self.get(s, width),
                (AluOp::Lsh, Operand::Imm(k)) if whole_bytes(k, width) => self
                    .get(dst, width)
                    .map(|b| b.shifted_left(k as usize / 8, width)),
                (AluOp::Rsh, Operand::Imm(k)) if whole_bytes(k, width) => self
                    .get(dst, width)
                    .map(|b| b.shifted_right(k as usize / 8)),
                (AluOp::Or, Operand::Reg(s)) => self.or(width, dst, s),
                _ => None,
            },
            _ => None,
        };
        if writes_memory_or_calls(op) {
            self.regs = [None; 10];
        }
        if let Some(r) = op.written_reg() {
            self.set(r, content);
            self.version[r as usize] += 1;
        }
        if is_call(op) {
            // The callee clobbers r1–r5.
            for r in 1..=5 {
                self.version[r] += 1;
            }
        }
    }
}

/// A shift by whole bytes, within the operation's width.
fn whole_bytes(k: i32, width: Width) -> bool {
    let bits = match width {
        Width::W32 => 32,
        Width::W64 => 64,
    };
    k % 8 == 0 && (0..bits).contains(&k)
}

fn is_call(op: &Op) -> bool {
    matches!(
        op,
        Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. } | Op::PacketLoad { .. }
    )
}

fn writes_memory_or_calls(op: &Op) -> bool {
    is_call(op)
        || matches!(
            op,
            Op::Store { .. } | Op::Atomic { .. } | Op::MovPerCpu { .. }
        )
}

/// Whether leaving instruction `op` out changes nothing but the register it writes.
fn is_pure(op: &Op, proven: bool) -> bool {
    match *op {
        Op::Alu { .. }
        | Op::MovSx { .. }
        | Op::Neg { .. }
        | Op::End { .. }
        | Op::LdImm64 { .. } => true,
        Op::Load { base, .. } => base != R10 && proven,
        _ => false,
    }
}

/// The function being planned: its instructions, which of them a branch lands on, and the
/// registers live into each ([`packjit_frontend::analysis::live_in`]).
pub(crate) struct Function<'a> {
    pub insts: &'a [Inst],
    /// Index of `insts[0]` in the program (branch targets are program indices).
    pub start: usize,
    pub is_target: &'a [bool],
    pub live_in: &'a [u16],
}

impl Function<'_> {
    /// The registers live after the last instruction of the block that ends before `end`.
    fn live_after_block(&self, end: usize) -> u16 {
        let live_at = |k: usize| self.live_in.get(k).copied().unwrap_or(0);
        match self.insts[end - 1].op {
            // As the front end counts it: a called function's r1–r5 stay live at its exit.
            Op::Exit if self.start == 0 => 0,
            Op::Exit => ARG_REGS,
            Op::Ja { target } => live_at(target as usize - self.start),
            Op::Jcond { target, .. } => live_at(end) | live_at(target as usize - self.start),
            _ => live_at(end),
        }
    }
}

/// The plan for one function. `proven(k)`: the load at `insts[k]` cannot stop the program
/// (always in trusted code; sandboxed, proven inside a region by the front end).
pub(crate) fn plan(f: &Function<'_>, proven: impl Fn(usize) -> bool) -> Plan {
    let n = f.insts.len();
    let mut actions = vec![Action::Lift; n];
    let mut capture = vec![false; n];
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n && !f.is_target[end] && !ends_block(&f.insts[end - 1].op) {
            end += 1;
        }
        let live_out = f.live_after_block(end);
        plan_block(
            f.insts,
            start..end,
            live_out,
            &proven,
            &mut actions,
            &mut capture,
        );
        start = end;
    }
    Plan { actions, capture }
}

fn ends_block(op: &Op) -> bool {
    matches!(op, Op::Ja { .. } | Op::Jcond { .. } | Op::Exit)
}

fn plan_block(
    insts: &[Inst],
    block: std::ops::Range<usize>,
    live_out: u16,
    proven: &impl Fn(usize) -> bool,
    actions: &mut [Action],
    capture: &mut [bool],
) {
    let mut known = Known {
        regs: [None; 10],
        version: [0; 11],
    };
    let mut any = false;
    for k in block.clone() {
        let op = &insts[k].op;
        if let Op::Alu {
            width,
            op: AluOp::Or,
            dst,
            src: Operand::Reg(src),
        } = *op
        {
            if let Some(wide) = known.or(width, dst, src).and_then(|b| b.as_load()) {
                actions[k] = Action::Wide(wide);
                any = true;
            }
        }
        known.step(k, op, proven(k));
    }
    if !any {
        return;
    }
    // Backward over the block: leave out what only fed wide loads (see the module docs).
    let mut live = live_out;
    let mut bases_needed: Vec<(usize, Reg)> = Vec::new();
    for k in block.rev() {
        let op = &insts[k].op;
        let writes = op.written_reg().map_or(0, |r| 1u16 << r);
        let dead = writes != 0 && live & writes == 0;
        match actions[k] {
            Action::Wide(_) if dead => actions[k] = Action::Skip,
            Action::Wide(w) => {
                bases_needed.push((w.base_at, w.base));
                live &= !writes;
            }
            _ if dead && is_pure(op, proven(k)) => actions[k] = Action::Skip,
            _ => live = (live & !writes) | regs_read(op, ARG_REGS),
        }
        // A wide load reads its base as this instruction did.
        for &(_, base) in bases_needed.iter().filter(|(at, _)| *at == k) {
            live |= 1 << base;
            capture[k] = true;
        }
    }
}
