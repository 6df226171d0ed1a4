//! The structural verifier: raw bytes → [`Program`], or an error naming pc and reason.
//!
//! This is not the kernel's verifier (no type tracking, no bounds on memory accesses); it
//! guarantees what a JIT needs to emit correct code: every instruction is a defined cpu v4
//! encoding with its unused fields zero, registers exist and r10 is never written, every
//! branch lands on an instruction start inside its own subprogram, no path falls off the
//! end of a subprogram, local calls form an acyclic graph at most [`MAX_CALL_DEPTH`] deep,
//! and helper ids are registered.

use crate::insn::{op::*, *};
use crate::op_kind;
use crate::{reuse, Branch, BranchKind, Compared, Program, Subprog};
use packjit_plugin_api::abi::{
    PJ_HELPER_CALLEE_TAIL_CALL, PJ_HELPER_LOOKUP_VALUES, PJ_HELPER_PERCPU_OFFSET,
    PJ_HELPER_STATIC_REGIONS, PJ_MOV_OFF_PERCPU,
};
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use std::cell::Cell;

/// Bytes of stack per (sub)program frame; r10 points at its top.
pub const STACK_SIZE: usize = 512;
/// Deepest chain of bpf-to-bpf calls accepted (entry frame included).
pub const MAX_CALL_DEPTH: usize = 8;
/// Largest program accepted, in slots (the kernel's limit for privileged programs).
pub const MAX_INSNS: usize = 1_000_000;

// Slot and instruction indices are `u32` in `Inst` (see `insn.rs`).
const _: () = assert!(MAX_INSNS <= u32::MAX as usize);

fn verr(pc: usize, msg: impl Into<String>) -> CompileError {
    CompileError::at(pc, ErrorKind::Verify, msg)
}

/// Encodings beyond cpu v4 that a request opted into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Accept packjit's per-CPU address instruction (`PJ_COMPILE_PERCPU_INSN`):
    /// `BPF_ALU64 | BPF_MOV | BPF_X` with `off = -1` decodes to [`Op::MovPerCpu`].
    pub percpu_insn: bool,
}

impl DecodeOptions {
    /// The options a request's `PJ_COMPILE_*` flags ask for.
    pub fn from_flags(flags: u32) -> DecodeOptions {
        DecodeOptions {
            percpu_insn: flags & packjit_plugin_api::abi::PJ_COMPILE_PERCPU_INSN != 0,
        }
    }
}

/// Decodes and verifies `code` against the helper table (plain cpu v4, no opt-ins).
pub fn decode(code: &[u8], helpers: &[HelperEntry]) -> Result<Program, CompileError> {
    decode_with(code, helpers, DecodeOptions::default())
}

/// [`decode`] accepting the encodings `opts` opts into.
pub fn decode_with(
    code: &[u8],
    helpers: &[HelperEntry],
    opts: DecodeOptions,
) -> Result<Program, CompileError> {
    if code.is_empty() {
        return Err(CompileError::new(ErrorKind::Verify, "empty program"));
    }
    if code.len() % 8 != 0 {
        return Err(CompileError::new(
            ErrorKind::Verify,
            format!("program length {} is not a multiple of 8 bytes", code.len()),
        ));
    }
    let slots = code.len() / 8;
    if slots > MAX_INSNS {
        return Err(CompileError::new(
            ErrorKind::Verify,
            format!("program has {slots} instructions, the limit is {MAX_INSNS}"),
        ));
    }
    // Pass 1: decode each instruction straight from the bytes (no intermediate copy: compile
    // time is dominated by memory traffic on large programs); branch targets stay as raw
    // offsets for now (see `pending_target`). Alongside, each instruction's effects
    // (registers read and written, its kind) come as one word; their OR over each block of
    // EFF_BLOCK instructions is kept, so the per-function summaries below need (almost) no
    // second look at the instructions; and the few instructions later passes must visit
    // (branches, local calls, `lddw`s) are listed. Indices (and `pc as u32`) fit u32
    // because MAX_INSNS does.
    // This thread's buffers from its last decode and its last dropped program.
    let mut kept = (DECODE_BUFFERS.try_with(Cell::take).ok().flatten()).unwrap_or_default();
    let mut insts = reuse::take_from(&mut kept.insts, slots);
    let mut blocks = reuse::take_from(&mut kept.blocks, slots / EFF_BLOCK + 1);
    let mut acc = BlockEffects::default();
    // Slot of every `lddw`, ascending: maps a slot to its instruction index (pass 2).
    let mut lddw_slots = reuse::take_from(&mut kept.lddw_slots, 0);
    // Every `ja`, conditional jump and local call, ascending, with its target slot until
    // pass 2 (`OUTSIDE` for a slot outside the program). (Sized for one branch per 4
    // instructions: clang's code has about one per 5, and a regrow copies the list.)
    let mut branches = reuse::take_from(&mut kept.branches, slots / 4 + 8);
    // Instruction index of every `lddw`, ascending (pairs with `lddw_slots`).
    let mut lddw_at = reuse::take_from(&mut kept.lddw_at, 0);
    // Instruction indices of the local calls among them (the call graph's edges).
    let mut local_calls = reuse::take_from(&mut kept.local_calls, 0);
    let mut exits = reuse::take_from(&mut kept.exits, 0);
    let mut pc = 0;
    while pc < slots {
        let raw = u64::from_le_bytes(code[pc * 8..pc * 8 + 8].try_into().expect("8 bytes"));
        let index = insts.len() as u32;
        let (eff, len) = match decode_fast(raw, pc as u32, &mut insts) {
            Some(eff) => (eff, 1),
            None => {
                let (op, len) = decode_one(code, pc, helpers, opts)?;
                insts.push(Inst { pc: pc as u32, op });
                (effects_of(&op), len)
            }
        };
        let kind = 1u16 << (eff >> EFF_KIND_SHIFT);
        if kind & (op_kind::JA | op_kind::JCOND | op_kind::CALL_LOCAL) != 0 {
            // Resolved now, while the instruction's cache line is at hand, by the `lddw`s
            // seen so far: exact for a target at or before this slot, and for a later one
            // unless an `lddw` lies in between (pass 2 rewrites those few). A slot outside
            // the program leaves the raw offset in place, for pass 2's error.
            let compared = Compared::of(&insts[index as usize].op);
            let (kind, target) = match &mut insts[index as usize].op {
                Op::Ja { target } => (BranchKind::Ja, target),
                Op::Jcond { target, .. } => (BranchKind::Jcond, target),
                Op::CallLocal { target } => (BranchKind::CallLocal, target),
                _ => unreachable!("the effect word says a branch"),
            };
            let slot = pc as i64 + 1 + pending_offset(*target);
            let slot = if (0..slots as i64).contains(&slot) {
                let slot = slot as usize;
                let before = if slot <= pc {
                    lddw_slots.partition_point(|&l| (l as usize) < slot)
                } else {
                    lddw_slots.len()
                };
                *target = (slot - before) as u32;
                slot as u32
            } else {
                OUTSIDE
            };
            branches.push(Branch {
                at: index,
                target: slot,
                kind,
                compared,
            });
            if kind == BranchKind::CallLocal {
                local_calls.push(index);
            }
        } else if kind == op_kind::LD_IMM64 {
            lddw_slots.push(pc as u32);
            lddw_at.push(index);
        } else if kind == op_kind::EXIT {
            exits.push(index);
        }
        acc.add(eff);
        if insts.len() % EFF_BLOCK == 0 {
            blocks.push(std::mem::take(&mut acc));
        }
        pc += len;
    }

    if insts.len() % EFF_BLOCK != 0 {
        blocks.push(acc);
    }

    // Pass 2 (the branch list only): check every target slot and turn it into an
    // instruction index. Every `lddw` before a slot makes its index one smaller than the
    // slot; a slot right after an `lddw`'s first half is its second half. Instructions are
    // read only for an error's pc, and written only where pass 1's count was short.
    for b in branches.iter_mut() {
        if b.target == OUTSIDE {
            let inst = &insts[b.at as usize];
            let (Op::Ja { target } | Op::Jcond { target, .. } | Op::CallLocal { target }) = inst.op
            else {
                unreachable!("only branches are listed")
            };
            let slot = inst.pc as i64 + 1 + pending_offset(target);
            return Err(verr(
                inst.pc as usize,
                format!("jump target {slot} is outside the program (0..{slots})"),
            ));
        }
        if lddw_slots.is_empty() {
            continue; // every index is its slot
        }
        let slot = b.target as usize;
        let before = lddw_slots.partition_point(|&l| (l as usize) < slot);
        if before > 0 && lddw_slots[before - 1] as usize + 1 == slot {
            return Err(verr(
                insts[b.at as usize].pc as usize,
                format!("jump target {slot} is the second half of LD_IMM64"),
            ));
        }
        b.target = (slot - before) as u32;
        // For a later target pass 1 counted the `lddw`s before the branch itself.
        if b.target > b.at && before != lddw_at.partition_point(|&i| i < b.at) {
            match &mut insts[b.at as usize].op {
                Op::Ja { target } | Op::Jcond { target, .. } | Op::CallLocal { target } => {
                    *target = b.target;
                }
                _ => unreachable!("only branches are listed"),
            }
        }
    }

    // Subprograms start at 0 and at every local-call target (a list made only when there
    // are calls: most programs are one function, and every allocation shows in their load).
    let mut called: Vec<usize> = Vec::new();
    if !local_calls.is_empty() {
        called.reserve(local_calls.len() + 1);
        called.push(0);
        called.extend(local_calls.iter().map(|&b| match insts[b as usize].op {
            Op::CallLocal { target } => target as usize,
            _ => unreachable!("only local calls are listed"),
        }));
        called.sort_unstable();
        called.dedup();
    }
    let starts: &[usize] = if called.is_empty() { &[0] } else { &called };
    let mut subprogs = reuse::take_from(&mut kept.subprogs, starts.len());
    let mut is_target = reuse::take_from(&mut kept.is_target, insts.len());
    is_target.resize(insts.len(), false);
    let mut next_branch = 0;
    for (k, &start) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(insts.len());
        let BlockEffects { regs, ops } = summary(&insts, &blocks, start, end);
        let mut writes = ((regs >> EFF_WRITES_SHIFT) & 0x3ff) as u16;
        if ops & op_kind::CALLS != 0 {
            // Calls clobber r1-r5 as far as the caller's register state goes.
            writes |= 0b11_1111;
        }
        let reads = (regs & 0x7ff) as u16;
        let sp = Subprog {
            start,
            end,
            writes,
            // A per-CPU mov's CPU id may come from a native call (register-preserving, so
            // no clobbers): the frame must be call-ready (link register, alignment).
            calls: ops & (op_kind::CALLS | op_kind::MOV_PERCPU) != 0,
            uses_stack: reads & (1 << R10) != 0,
            copies_r10: regs & EFF_COPIES_R10 != 0,
            reads,
            ops,
        };
        while next_branch < branches.len() && (branches[next_branch].at as usize) < end {
            let b = branches[next_branch];
            next_branch += 1;
            let target = b.target as usize;
            if b.kind != BranchKind::CallLocal && (target < sp.start || target >= sp.end) {
                return Err(verr(
                    insts[b.at as usize].pc as usize,
                    format!(
                        "jump to pc {} leaves the function starting at pc {}",
                        insts[target].pc, insts[sp.start].pc
                    ),
                ));
            }
            is_target[target] = true;
        }
        // The last instruction of each function must not fall through.
        let last = &insts[sp.end - 1];
        if !matches!(last.op, Op::Exit | Op::Ja { .. }) {
            return Err(verr(
                last.pc as usize,
                if sp.end == insts.len() {
                    "falls through past the end of the program".to_string()
                } else {
                    format!("falls through into the function at pc {}", insts[sp.end].pc)
                },
            ));
        }
        subprogs.push(sp);
    }

    let call_depth = if local_calls.is_empty() {
        1
    } else {
        check_call_depth(&insts, &subprogs, &local_calls)?
    };
    // The scratch lists go back for the next decode (on an error above they are freed).
    reuse::give_back_to(&mut kept.blocks, blocks);
    reuse::give_back_to(&mut kept.lddw_slots, lddw_slots);
    reuse::give_back_to(&mut kept.lddw_at, lddw_at);
    let _ = DECODE_BUFFERS.try_with(|k| k.set(Some(kept)));
    Ok(Program {
        insts,
        slots,
        subprogs,
        is_target,
        call_depth,
        branches,
        exits,
        local_calls,
        static_regions: Vec::new(),
        call_results: Vec::new(),
        expanded_calls: Vec::new(),
        lookup_values: Vec::new(),
    })
}

/// A decode's buffers, kept per thread: the program's lists (handed back when a [`Program`]
/// is dropped, [`keep_program_lists`]) and the decode's own scratch lists. A small
/// program's load made some eight allocations here and as many frees when its program was
/// dropped, each pair about 100 host instructions (a tenth of a 14-instruction program's
/// load went to the allocator). Large buffers go to [`reuse`]'s spares instead.
#[derive(Default)]
struct DecodeBuffers {
    insts: Vec<Inst>,
    is_target: Vec<bool>,
    branches: Vec<Branch>,
    exits: Vec<u32>,
    local_calls: Vec<u32>,
    subprogs: Vec<Subprog>,
    blocks: Vec<BlockEffects>,
    lddw_slots: Vec<u32>,
    lddw_at: Vec<u32>,
}

thread_local! {
    /// This thread's [`DecodeBuffers`], taken out while a decode or a drop uses them (boxed:
    /// taking and putting back moves a pointer, not nine vectors).
    static DECODE_BUFFERS: Cell<Option<Box<DecodeBuffers>>> = const { Cell::new(None) };
}

/// Keeps a dropped program's lists for the next decode on this thread.
pub(crate) fn keep_program_lists(p: &mut Program) {
    // Nothing is kept during thread teardown.
    let _ = DECODE_BUFFERS.try_with(|k| {
        let mut kept = k.take().unwrap_or_default();
        reuse::give_back_to(&mut kept.insts, std::mem::take(&mut p.insts));
        reuse::give_back_to(&mut kept.is_target, std::mem::take(&mut p.is_target));
        reuse::give_back_to(&mut kept.branches, std::mem::take(&mut p.branches));
        reuse::give_back_to(&mut kept.exits, std::mem::take(&mut p.exits));
        reuse::give_back_to(&mut kept.local_calls, std::mem::take(&mut p.local_calls));
        reuse::give_back_to(&mut kept.subprogs, std::mem::take(&mut p.subprogs));
        k.set(Some(kept));
    });
}

/// [`Branch::target`] between the passes for a slot outside the program (no slot is this
/// large: see `MAX_INSNS`).
const OUTSIDE: u32 = u32::MAX;

/// As decoded, a branch's `target` holds its raw offset (`off`, or `imm` for `gotol` and
/// local calls) as the bits of an `i32`: the slot it names, `pc + 1 + offset`, may be
/// outside the program. Pass 1 resolves it at once when it is inside; otherwise it stays
/// until pass 2 reports it.
fn pending_target(offset: i32) -> u32 {
    offset as u32
}

/// The offset [`pending_target`] stored.
fn pending_offset(target: u32) -> i64 {
    target as i32 as i64
}

/// Checks the call graph is acyclic and at most [`MAX_CALL_DEPTH`] deep; returns the number
/// of frames in the deepest chain starting at the entry. `calls` lists the instruction
/// indices of every local call, ascending.
fn check_call_depth(
    insts: &[Inst],
    subprogs: &[Subprog],
    calls: &[u32],
) -> Result<usize, CompileError> {
    // Longest call chain from each subprogram, by DFS with cycle detection.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done(usize),
    }
    struct Graph<'a> {
        insts: &'a [Inst],
        subprogs: &'a [Subprog],
        calls: &'a [u32],
    }
    let g = Graph {
        insts,
        subprogs,
        calls,
    };
    let mut marks = vec![Mark::New; subprogs.len()];
    fn visit(s: usize, g: &Graph<'_>, marks: &mut [Mark]) -> Result<usize, CompileError> {
        match marks[s] {
            Mark::Done(d) => return Ok(d),
            Mark::Active => unreachable!("cycles are caught at the call site"),
            Mark::New => {}
        }
        marks[s] = Mark::Active;
        let mut depth = 1;
        let sp = &g.subprogs[s];
        let first = g.calls.partition_point(|&b| (b as usize) < sp.start);
        let last = g.calls.partition_point(|&b| (b as usize) < sp.end);
        for &b in &g.calls[first..last] {
            let inst = &g.insts[b as usize];
            if let Op::CallLocal { target } = inst.op {
                let target = target as usize;
                let callee = g
                    .subprogs
                    .binary_search_by_key(&target, |s| s.start)
                    .expect("target is a start");
                if marks[callee] == Mark::Active {
                    return Err(verr(
                        inst.pc as usize,
                        format!(
                            "recursive call to the function at pc {}",
                            g.insts[target].pc
                        ),
                    ));
                }
                depth = depth.max(1 + visit(callee, g, marks)?);
                if depth > MAX_CALL_DEPTH {
                    return Err(verr(
                        inst.pc as usize,
                        format!("call chain deeper than {MAX_CALL_DEPTH} frames"),
                    ));
                }
            }
        }
        marks[s] = Mark::Done(depth);
        Ok(depth)
    }
    let entry_depth = visit(0, &g, &mut marks)?;
    // Functions unreachable from the entry are still compiled; check them too.
    for s in 0..subprogs.len() {
        visit(s, &g, &mut marks)?;
    }
    Ok(entry_depth)
}

// ---- effect words -----------------------------------------------------------------------
//
// One `u32` per instruction: bits 0..=10 the registers it reads (`analysis::regs_read` with
// `ARG_REGS` for local calls), bits 11..=20 the register it writes (`Op::written_reg`), bit
// 21 [`EFF_COPIES_R10`], bits 24.. its `Op::kind_index`.

const EFF_WRITES_SHIFT: u32 = 11;
/// An ALU instruction with r10 as its source (`r2 = r10`, `r2 += r10`): r10's value, the
/// frame's address, flows into another register.
const EFF_COPIES_R10: u32 = 1 << 21;
const EFF_KIND_SHIFT: u32 = 24;

/// Instructions per [`BlockEffects`]: small, so a function boundary inside a block costs
/// few recomputed words; large enough that the blocks cost nothing per instruction.
const EFF_BLOCK: usize = 16;

/// The OR of the effect words of a block of instructions, kinds as [`op_kind`] bits.
#[derive(Clone, Copy, Default)]
struct BlockEffects {
    /// Effect words ORed, kind field masked off.
    regs: u32,
    /// Their kinds.
    ops: u16,
}

impl BlockEffects {
    #[inline(always)]
    fn add(&mut self, eff: u32) {
        self.regs |= eff & ((1 << EFF_KIND_SHIFT) - 1);
        self.ops |= 1 << (eff >> EFF_KIND_SHIFT);
    }
}

/// The effects of instructions `start..end`: whole blocks from `blocks` (block `b` covers
/// `b * EFF_BLOCK ..` up to the next block or the end of the program), the parts of blocks
/// at either edge recomputed.
fn summary(insts: &[Inst], blocks: &[BlockEffects], start: usize, end: usize) -> BlockEffects {
    let first = start.div_ceil(EFF_BLOCK);
    let last = if end == insts.len() {
        blocks.len()
    } else {
        end / EFF_BLOCK
    };
    let mut out = BlockEffects::default();
    if first >= last {
        for inst in &insts[start..end] {
            out.add(effects_of(&inst.op));
        }
        return out;
    }
    for b in &blocks[first..last] {
        out.regs |= b.regs;
        out.ops |= b.ops;
    }
    for inst in insts[start..first * EFF_BLOCK]
        .iter()
        .chain(&insts[(last * EFF_BLOCK).min(end)..end])
    {
        out.add(effects_of(&inst.op));
    }
    out
}

/// The effect word of any instruction (the slow path's; [`decode_fast`] builds the same
/// word from its table).
fn effects_of(op: &Op) -> u32 {
    let reads = u32::from(crate::analysis::regs_read(op, crate::analysis::ARG_REGS));
    let writes = op
        .written_reg()
        .map_or(0, |r| 1u32 << (EFF_WRITES_SHIFT + u32::from(r)));
    let copies_r10 = match op {
        Op::Alu {
            src: Operand::Reg(R10),
            ..
        } => EFF_COPIES_R10,
        _ => 0,
    };
    reads | writes | copies_r10 | (op.kind_index() << EFF_KIND_SHIFT)
}

// ---- the fast path: one table lookup per opcode ------------------------------------------
//
// The common encodings (ALU without the offset selectors, conditional jumps, `ja`, `exit`,
// loads and stores) are decoded from a 256-entry table: the entry says which raw fields must
// be zero, how large dst and src may be, and how to build the `Op` and its effect word. An
// instruction the table does not accept, valid or not, goes to `decode_one`, which stays the
// reference (and produces every error message), so the fast path can only ever agree with
// it; `tests::the_fast_table_agrees_with_decode_one` checks that over all 256 opcodes.

/// How [`decode_fast`] builds an instruction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FastKind {
    /// Not decoded by the table.
    Slow,
    /// `Op::Alu` with an immediate.
    AluK,
    /// `Op::Alu` with a register.
    AluX,
    /// `Op::Jcond` with an immediate.
    JcondK,
    /// `Op::Jcond` with a register.
    JcondX,
    /// `Op::Ja` (`off` form).
    Ja,
    /// `Op::Exit`.
    Exit,
    /// `Op::Load` (zero- or sign-extending).
    Load,
    /// `Op::Store` of an immediate.
    StoreK,
    /// `Op::Store` of a register.
    StoreX,
}

/// One opcode's table entry.
#[derive(Clone, Copy)]
struct Fast {
    kind: FastKind,
    /// Raw-slot bits that must be zero (field masks of `src`, `off`, `imm`, `dst`).
    zero: u64,
    /// Largest accepted dst and src register numbers.
    dst_max: u8,
    src_max: u8,
    width: Width,
    size: Size,
    sign_extend: bool,
    alu: AluOp,
    cond: Cond,
    /// Effect-word masks: which of `1 << dst`, `1 << src`, `1 << (dst + 11)` apply.
    reads_dst: u32,
    reads_src: u32,
    writes_dst: u32,
    /// The effect word's constant part (kind, fixed reads such as `exit`'s r0).
    eff: u32,
}

const M_DST: u64 = 0x0f << 8;
const M_SRC: u64 = 0xf0 << 8;
const M_OFF: u64 = 0xffff << 16;
const M_IMM: u64 = 0xffff_ffff << 32;

const SLOW: Fast = Fast {
    kind: FastKind::Slow,
    zero: 0,
    dst_max: 0,
    src_max: 0,
    width: Width::W64,
    size: Size::DW,
    sign_extend: false,
    alu: AluOp::Add,
    cond: Cond::Eq,
    reads_dst: 0,
    reads_src: 0,
    writes_dst: 0,
    eff: 0,
};

const fn size_of(opc: u8) -> Size {
    match opc & 0x18 {
        SIZE_W => Size::W,
        SIZE_H => Size::H,
        SIZE_B => Size::B,
        _ => Size::DW,
    }
}

/// The table entry of opcode `opc`, mirroring `decode_one`'s acceptance rules for the
/// encodings it covers.
const fn fast_entry(opc: u8) -> Fast {
    let class = opc & 0x07;
    let is_reg = opc & SRC_X != 0;
    let code = opc & 0xf0;
    let all = u32::MAX;
    match class {
        CLASS_ALU | CLASS_ALU64 => {
            let alu = match code {
                ALU_ADD => AluOp::Add,
                ALU_SUB => AluOp::Sub,
                ALU_MUL => AluOp::Mul,
                ALU_DIV => AluOp::Div,
                ALU_OR => AluOp::Or,
                ALU_AND => AluOp::And,
                ALU_LSH => AluOp::Lsh,
                ALU_RSH => AluOp::Rsh,
                ALU_MOD => AluOp::Mod,
                ALU_XOR => AluOp::Xor,
                ALU_MOV => AluOp::Mov,
                ALU_ARSH => AluOp::Arsh,
                // neg, end and the undefined codes: the slow path.
                _ => return SLOW,
            };
            let is_mov = code == ALU_MOV;
            Fast {
                kind: if is_reg {
                    FastKind::AluX
                } else {
                    FastKind::AluK
                },
                // A non-zero offset selects sdiv/smod/movsx/per-CPU mov: the slow path.
                zero: M_OFF | if is_reg { M_IMM } else { M_SRC },
                dst_max: 9,
                src_max: if is_reg { 10 } else { 0 },
                width: if class == CLASS_ALU64 {
                    Width::W64
                } else {
                    Width::W32
                },
                alu,
                // `mov` does not read its destination.
                reads_dst: if is_mov { 0 } else { all },
                reads_src: if is_reg { all } else { 0 },
                writes_dst: all,
                eff: 0 << EFF_KIND_SHIFT,
                ..SLOW
            }
        }
        CLASS_JMP | CLASS_JMP32 => {
            if opc == CLASS_JMP | JMP_JA {
                return Fast {
                    kind: FastKind::Ja,
                    zero: M_DST | M_SRC | M_IMM,
                    dst_max: 0,
                    src_max: 0,
                    eff: 9 << EFF_KIND_SHIFT,
                    ..SLOW
                };
            }
            if opc == CLASS_JMP | JMP_EXIT {
                return Fast {
                    kind: FastKind::Exit,
                    zero: M_DST | M_SRC | M_OFF | M_IMM,
                    dst_max: 0,
                    src_max: 0,
                    // exit reads r0.
                    eff: 1 | 14 << EFF_KIND_SHIFT,
                    ..SLOW
                };
            }
            // ja32, call, exit32 and the undefined codes: the slow path.
            let Some(cond) = jmp_cond(code) else {
                return SLOW;
            };
            Fast {
                kind: if is_reg {
                    FastKind::JcondX
                } else {
                    FastKind::JcondK
                },
                zero: if is_reg { M_IMM } else { M_SRC },
                dst_max: 10,
                src_max: if is_reg { 10 } else { 0 },
                width: if class == CLASS_JMP {
                    Width::W64
                } else {
                    Width::W32
                },
                cond,
                reads_dst: all,
                reads_src: if is_reg { all } else { 0 },
                eff: 10 << EFF_KIND_SHIFT,
                ..SLOW
            }
        }
        CLASS_LDX => {
            let size = size_of(opc);
            let sign_extend = match opc & 0xe0 {
                MODE_MEM => false,
                MODE_MEMSX if !matches!(size, Size::DW) => true,
                _ => return SLOW,
            };
            Fast {
                kind: FastKind::Load,
                zero: M_IMM,
                dst_max: 9,
                src_max: 10,
                size,
                sign_extend,
                reads_src: all,
                writes_dst: all,
                eff: 6 << EFF_KIND_SHIFT,
                ..SLOW
            }
        }
        CLASS_ST if opc & 0xe0 == MODE_MEM => Fast {
            kind: FastKind::StoreK,
            zero: M_SRC,
            dst_max: 10,
            src_max: 0,
            size: size_of(opc),
            reads_dst: all,
            eff: 7 << EFF_KIND_SHIFT,
            ..SLOW
        },
        CLASS_STX if opc & 0xe0 == MODE_MEM => Fast {
            kind: FastKind::StoreX,
            zero: M_IMM,
            dst_max: 10,
            src_max: 10,
            size: size_of(opc),
            reads_dst: all,
            reads_src: all,
            eff: 7 << EFF_KIND_SHIFT,
            ..SLOW
        },
        // lddw, the legacy loads, atomics, undefined modes: the slow path.
        _ => SLOW,
    }
}

/// What the hot loop reads of an opcode's entry: the fields that must be zero, the row of
/// [`REGS`] for its register byte, how to build the `Op` and the effect word's constant part.
#[derive(Clone, Copy)]
struct Hot {
    zero: u64,
    regs: u8,
    kind: FastKind,
    width: Width,
    size: Size,
    sign_extend: bool,
    alu: AluOp,
    cond: Cond,
    eff: u32,
}

/// A [`REGS`] entry meaning "registers out of range (or not a fast encoding)".
const REGS_INVALID: u32 = 1 << 31;
/// The [`REGS`] row of encodings the table does not decode: every entry invalid.
const REGS_SLOW: u8 = 32;

/// The [`REGS`] row of a table entry: bit 0 reads dst, bit 1 reads src, bit 2 writes dst,
/// bit 3 dst may be r10 (else at most r9), bit 4 an ALU operation on src (so src = r10 sets
/// [`EFF_COPIES_R10`]).
const fn regs_row(f: &Fast) -> u8 {
    if matches!(f.kind, FastKind::Slow) {
        return REGS_SLOW;
    }
    // The rows accept src up to r10; an entry that allows less must zero src by its mask
    // (checked when the table is built, at compile time).
    assert!(f.src_max == 10 || (f.src_max == 0 && f.zero & M_SRC != 0));
    assert!(f.dst_max == 9 || f.dst_max == 10 || (f.dst_max == 0 && f.zero & M_DST != 0));
    (f.reads_dst != 0) as u8
        | ((f.reads_src != 0) as u8) << 1
        | ((f.writes_dst != 0) as u8) << 2
        | ((f.dst_max == 10) as u8) << 3
        | (matches!(f.kind, FastKind::AluX) as u8) << 4
}

/// `REGS[row][regs byte]`: the register part of the effect word for each dst/src pair, or
/// [`REGS_INVALID`] when dst or src is out of range. One load replaces the range checks and
/// the shifts. (An entry whose src must be 0 has `src` in its zero mask instead.)
static REGS: [[u32; 256]; 33] = {
    let mut t = [[REGS_INVALID; 256]; 33];
    let mut row = 0;
    while row < 32 {
        let dst_max = if row & 8 != 0 { 10 } else { 9 };
        let mut b = 0;
        while b < 256 {
            let (dst, src) = (b & 15, b >> 4);
            if dst <= dst_max && src <= 10 {
                let mut e = 0u32;
                if row & 1 != 0 {
                    e |= 1 << dst;
                }
                if row & 2 != 0 {
                    e |= 1 << src;
                }
                if row & 4 != 0 {
                    e |= 1 << (EFF_WRITES_SHIFT + dst as u32);
                }
                if row & 16 != 0 && src == 10 {
                    e |= EFF_COPIES_R10;
                }
                t[row][b] = e;
            }
            b += 1;
        }
        row += 1;
    }
    t
};

static FAST: [Hot; 256] = {
    let mut t = [Hot {
        zero: 0,
        regs: REGS_SLOW,
        kind: FastKind::Slow,
        width: Width::W64,
        size: Size::DW,
        sign_extend: false,
        alu: AluOp::Add,
        cond: Cond::Eq,
        eff: 0,
    }; 256];
    let mut opc = 0;
    while opc < 256 {
        let f = fast_entry(opc as u8);
        t[opc] = Hot {
            zero: f.zero,
            regs: regs_row(&f),
            kind: f.kind,
            width: f.width,
            size: f.size,
            sign_extend: f.sign_extend,
            alu: f.alu,
            cond: f.cond,
            eff: f.eff,
        };
        opc += 1;
    }
    t
};

/// Decodes the slot `raw` (little-endian bytes as a `u64`) at `pc` through the table and
/// appends it to `insts`: `Some(effect word)` when the table covers the encoding and every
/// field is valid, `None` (nothing appended) otherwise; then `decode_one` decides, and names
/// any error. (Each arm pushes its own `Op` so it is written straight into the vector.)
#[inline(always)]
fn decode_fast(raw: u64, pc: u32, insts: &mut Vec<Inst>) -> Option<u32> {
    let f = &FAST[(raw & 0xff) as usize];
    let regs = REGS[f.regs as usize][((raw >> 8) & 0xff) as usize];
    if raw & f.zero != 0 || regs & REGS_INVALID != 0 {
        return None;
    }
    let dst = ((raw >> 8) & 0x0f) as u8;
    let src = ((raw >> 12) & 0x0f) as u8;
    let off = (raw >> 16) as u16 as i16;
    let imm = (raw >> 32) as u32 as i32;
    let op = |op| Inst { pc, op };
    match f.kind {
        FastKind::AluK => insts.push(op(Op::Alu {
            width: f.width,
            op: f.alu,
            dst,
            src: Operand::Imm(imm),
        })),
        FastKind::AluX => insts.push(op(Op::Alu {
            width: f.width,
            op: f.alu,
            dst,
            src: Operand::Reg(src),
        })),
        FastKind::JcondK => insts.push(op(Op::Jcond {
            width: f.width,
            cond: f.cond,
            dst,
            src: Operand::Imm(imm),
            target: pending_target(off.into()),
        })),
        FastKind::JcondX => insts.push(op(Op::Jcond {
            width: f.width,
            cond: f.cond,
            dst,
            src: Operand::Reg(src),
            target: pending_target(off.into()),
        })),
        FastKind::Ja => insts.push(op(Op::Ja {
            target: pending_target(off.into()),
        })),
        FastKind::Exit => insts.push(op(Op::Exit)),
        FastKind::Load => insts.push(op(Op::Load {
            size: f.size,
            sign_extend: f.sign_extend,
            dst,
            base: src,
            off,
        })),
        FastKind::StoreK => insts.push(op(Op::Store {
            size: f.size,
            base: dst,
            off,
            src: Operand::Imm(imm),
        })),
        FastKind::StoreX => insts.push(op(Op::Store {
            size: f.size,
            base: dst,
            off,
            src: Operand::Reg(src),
        })),
        FastKind::Slow => return None,
    }
    Some(f.eff | regs)
}

fn check_reg(pc: usize, what: &str, r: u8) -> Result<Reg, CompileError> {
    if r > 10 {
        return Err(verr(pc, format!("invalid {what} register r{r}")));
    }
    Ok(r)
}

fn check_dst_writable(pc: usize, r: u8) -> Result<Reg, CompileError> {
    check_reg(pc, "destination", r)?;
    if r == R10 {
        return Err(verr(pc, "r10 (the frame pointer) is read-only"));
    }
    Ok(r)
}

fn zero(pc: usize, name: &str, field: &str, value: i64) -> Result<(), CompileError> {
    if value != 0 {
        return Err(verr(
            pc,
            format!("{name}: reserved field {field} must be 0, is {value}"),
        ));
    }
    Ok(())
}

fn unknown(pc: usize, i: &RawInsn) -> CompileError {
    verr(pc, format!("unknown opcode 0x{:02x}", i.opc))
}

/// Decodes the instruction at `pc`; returns it and its length in slots. (Kept out of line:
/// the table decodes the common encodings, and this code inlined into the decode loop would
/// cost the loop its registers.)
#[inline(never)]
fn decode_one(
    code: &[u8],
    pc: usize,
    helpers: &[HelperEntry],
    opts: DecodeOptions,
) -> Result<(Op, usize), CompileError> {
    let slot = |pc: usize| -> Option<RawInsn> {
        let bytes = code.get(pc * 8..pc * 8 + 8)?;
        Some(RawInsn::from_bytes(bytes.try_into().expect("8 bytes")))
    };
    let i = slot(pc).expect("pc is inside the program");
    let class = i.opc & 0x07;
    match class {
        CLASS_ALU | CLASS_ALU64 => {
            let op = decode_alu(pc, &i, opts)?;
            if matches!(op, Op::MovPerCpu { .. })
                && !helpers.iter().any(|h| h.id == PJ_HELPER_PERCPU_OFFSET)
            {
                return Err(CompileError::at(
                    pc,
                    ErrorKind::UnknownHelper,
                    "per-CPU mov (off -1) without a per-CPU table entry (helper id 0x70430002) in the helper table",
                ));
            }
            Ok((op, 1))
        }
        CLASS_JMP | CLASS_JMP32 => decode_jmp(pc, &i, helpers).map(|op| (op, 1)),
        CLASS_LD if matches!(i.opc & 0xe0, MODE_ABS | MODE_IND) => {
            decode_packet_load(pc, &i).map(|op| (op, 1))
        }
        CLASS_LD => {
            if i.opc != LD_IMM64 {
                return Err(unknown(pc, &i));
            }
            if i.src != 0 {
                return Err(verr(
                    pc,
                    format!(
                        "lddw: pseudo source {} (map/BTF references) is not supported",
                        i.src
                    ),
                ));
            }
            zero(pc, "lddw", "offset", i.off.into())?;
            let dst = check_dst_writable(pc, i.dst)?;
            let Some(next) = slot(pc + 1) else {
                return Err(verr(pc, "lddw is missing its second slot"));
            };
            if next.opc != 0 || next.dst != 0 || next.src != 0 || next.off != 0 {
                return Err(verr(
                    pc + 1,
                    "second slot of lddw must have opcode, registers and offset 0",
                ));
            }
            let imm = Imm64::new((i.imm as u32 as u64) | ((next.imm as u32 as u64) << 32));
            Ok((Op::LdImm64 { dst, imm }, 2))
        }
        CLASS_LDX => {
            let size = size_of_opc(i.opc);
            let mode = i.opc & 0xe0;
            let sign_extend = match mode {
                MODE_MEM => false,
                MODE_MEMSX if size != Size::DW => true,
                _ => return Err(unknown(pc, &i)),
            };
            zero(pc, "ldx", "imm", i.imm.into())?;
            let dst = check_dst_writable(pc, i.dst)?;
            let base = check_reg(pc, "source", i.src)?;
            Ok((
                Op::Load {
                    size,
                    sign_extend,
                    dst,
                    base,
                    off: i.off,
                },
                1,
            ))
        }
        CLASS_ST => {
            if i.opc & 0xe0 != MODE_MEM {
                return Err(unknown(pc, &i));
            }
            zero(pc, "st", "src", i.src.into())?;
            let base = check_reg(pc, "destination", i.dst)?;
            Ok((
                Op::Store {
                    size: size_of_opc(i.opc),
                    base,
                    off: i.off,
                    src: Operand::Imm(i.imm),
                },
                1,
            ))
        }
        CLASS_STX => {
            let size = size_of_opc(i.opc);
            let base = check_reg(pc, "destination", i.dst)?;
            let src = check_reg(pc, "source", i.src)?;
            match i.opc & 0xe0 {
                MODE_MEM => {
                    zero(pc, "stx", "imm", i.imm.into())?;
                    Ok((
                        Op::Store {
                            size,
                            base,
                            off: i.off,
                            src: Operand::Reg(src),
                        },
                        1,
                    ))
                }
                MODE_ATOMIC => {
                    if !matches!(size, Size::W | Size::DW) {
                        return Err(verr(
                            pc,
                            format!(
                                "opcode 0x{:02x}: atomics exist only for 32 and 64 bits",
                                i.opc
                            ),
                        ));
                    }
                    let (op, fetch) = match i.imm {
                        ATOMIC_ADD => (AtomicOp::Add, false),
                        ATOMIC_OR => (AtomicOp::Or, false),
                        ATOMIC_AND => (AtomicOp::And, false),
                        ATOMIC_XOR => (AtomicOp::Xor, false),
                        x if x == ATOMIC_ADD | ATOMIC_FETCH => (AtomicOp::Add, true),
                        x if x == ATOMIC_OR | ATOMIC_FETCH => (AtomicOp::Or, true),
                        x if x == ATOMIC_AND | ATOMIC_FETCH => (AtomicOp::And, true),
                        x if x == ATOMIC_XOR | ATOMIC_FETCH => (AtomicOp::Xor, true),
                        ATOMIC_XCHG => (AtomicOp::Xchg, true),
                        ATOMIC_CMPXCHG => (AtomicOp::Cmpxchg, true),
                        other => {
                            return Err(verr(
                                pc,
                                format!("unknown atomic operation 0x{other:02x} in imm"),
                            ))
                        }
                    };
                    if fetch && op != AtomicOp::Cmpxchg && src == R10 {
                        return Err(verr(
                            pc,
                            "atomic fetch into r10 (the frame pointer) is not allowed",
                        ));
                    }
                    Ok((
                        Op::Atomic {
                            size,
                            op,
                            fetch,
                            base,
                            off: i.off,
                            src,
                        },
                        1,
                    ))
                }
                _ => Err(unknown(pc, &i)),
            }
        }
        _ => unreachable!("3-bit class"),
    }
}

/// Legacy packet access, `LD_ABS` (mode 0x20) and `LD_IND` (0x40), in the four sizes (rbpf
/// has the 8-byte forms 0x38 and 0x58, the kernel does not): `dst` and `off` are reserved
/// (0), as is `src` for `LD_ABS`; `LD_IND` reads its index from `src` (r0-r10). The
/// immediate is the offset, read as a `u32` ([`Op::PacketLoad`]).
fn decode_packet_load(pc: usize, i: &RawInsn) -> Result<Op, CompileError> {
    let size = size_of_opc(i.opc);
    let abs = i.opc & 0xe0 == MODE_ABS;
    let name = format!(
        "{}{} (opcode 0x{:02x})",
        if abs { "ldabs" } else { "ldind" },
        match size {
            Size::B => "b",
            Size::H => "h",
            Size::W => "w",
            Size::DW => "dw",
        },
        i.opc
    );
    zero(pc, &name, "dst", i.dst.into())?;
    zero(pc, &name, "offset", i.off.into())?;
    let index = if abs {
        zero(pc, &name, "src", i.src.into())?;
        None
    } else {
        Some(check_reg(pc, "index (source)", i.src)?)
    };
    Ok(Op::PacketLoad {
        size,
        index,
        off: i.imm as u32,
    })
}

fn size_of_opc(opc: u8) -> Size {
    match opc & 0x18 {
        SIZE_W => Size::W,
        SIZE_H => Size::H,
        SIZE_B => Size::B,
        _ => Size::DW,
    }
}

fn decode_alu(pc: usize, i: &RawInsn, opts: DecodeOptions) -> Result<Op, CompileError> {
    let width = if i.opc & 0x07 == CLASS_ALU64 {
        Width::W64
    } else {
        Width::W32
    };
    let is_reg = i.opc & SRC_X != 0;
    let code = i.opc & 0xf0;
    let name = alu_name(code);
    let dst = check_dst_writable(pc, i.dst)?;
    match code {
        ALU_NEG => {
            if is_reg {
                return Err(unknown(pc, i));
            }
            zero(pc, name, "src", i.src.into())?;
            zero(pc, name, "offset", i.off.into())?;
            zero(pc, name, "imm", i.imm.into())?;
            Ok(Op::Neg { width, dst })
        }
        ALU_END => {
            let kind = match (width, is_reg) {
                (Width::W32, false) => EndKind::ToLe,
                (Width::W32, true) => EndKind::ToBe,
                (Width::W64, false) => EndKind::Swap,
                (Width::W64, true) => return Err(unknown(pc, i)),
            };
            zero(pc, name, "src", i.src.into())?;
            zero(pc, name, "offset", i.off.into())?;
            if !matches!(i.imm, 16 | 32 | 64) {
                return Err(verr(
                    pc,
                    format!("{name}: width {} must be 16, 32 or 64", i.imm),
                ));
            }
            Ok(Op::End {
                kind,
                bits: i.imm as u8,
                dst,
            })
        }
        _ => {
            let op = match code {
                ALU_ADD => AluOp::Add,
                ALU_SUB => AluOp::Sub,
                ALU_MUL => AluOp::Mul,
                ALU_DIV if i.off == 1 => AluOp::Sdiv,
                ALU_DIV => AluOp::Div,
                ALU_MOD if i.off == 1 => AluOp::Smod,
                ALU_MOD => AluOp::Mod,
                ALU_OR => AluOp::Or,
                ALU_AND => AluOp::And,
                ALU_LSH => AluOp::Lsh,
                ALU_RSH => AluOp::Rsh,
                ALU_ARSH => AluOp::Arsh,
                ALU_XOR => AluOp::Xor,
                ALU_MOV => AluOp::Mov,
                _ => return Err(unknown(pc, i)),
            };
            // Offset is an operation selector for div/mod (1 = signed) and mov (movsx bits).
            let off_ok = match op {
                AluOp::Sdiv | AluOp::Smod => true,
                AluOp::Mov if is_reg => {
                    matches!(i.off, 0 | 8 | 16)
                        || (i.off == 32 && width == Width::W64)
                        || (i.off == PJ_MOV_OFF_PERCPU && width == Width::W64 && opts.percpu_insn)
                }
                _ => i.off == 0,
            };
            if !off_ok {
                return Err(verr(
                    pc,
                    format!("{name}: reserved field offset must be 0, is {}", i.off),
                ));
            }
            if is_reg {
                if op == AluOp::Mov && i.off == PJ_MOV_OFF_PERCPU {
                    // imm is the per-CPU array id here, not a reserved field.
                    let src = check_reg(pc, "source", i.src)?;
                    return Ok(Op::MovPerCpu {
                        dst,
                        src,
                        array: Operand::Imm(i.imm),
                    });
                }
                zero(pc, name, "imm", i.imm.into())?;
                let src = check_reg(pc, "source", i.src)?;
                if op == AluOp::Mov && i.off != 0 {
                    return Ok(Op::MovSx {
                        width,
                        dst,
                        src,
                        bits: i.off as u8,
                    });
                }
                Ok(Op::Alu {
                    width,
                    op,
                    dst,
                    src: Operand::Reg(src),
                })
            } else {
                zero(pc, name, "src", i.src.into())?;
                Ok(Op::Alu {
                    width,
                    op,
                    dst,
                    src: Operand::Imm(i.imm),
                })
            }
        }
    }
}

fn alu_name(code: u8) -> &'static str {
    match code {
        ALU_ADD => "add",
        ALU_SUB => "sub",
        ALU_MUL => "mul",
        ALU_DIV => "div",
        ALU_OR => "or",
        ALU_AND => "and",
        ALU_LSH => "lsh",
        ALU_RSH => "rsh",
        ALU_NEG => "neg",
        ALU_MOD => "mod",
        ALU_XOR => "xor",
        ALU_MOV => "mov",
        ALU_ARSH => "arsh",
        ALU_END => "end",
        _ => "alu",
    }
}

fn decode_jmp(pc: usize, i: &RawInsn, helpers: &[HelperEntry]) -> Result<Op, CompileError> {
    let width = if i.opc & 0x07 == CLASS_JMP {
        Width::W64
    } else {
        Width::W32
    };
    let is_reg = i.opc & SRC_X != 0;
    let code = i.opc & 0xf0;
    match code {
        JMP_JA => {
            if is_reg {
                return Err(unknown(pc, i));
            }
            zero(pc, "ja", "src", i.src.into())?;
            zero(pc, "ja", "dst", i.dst.into())?;
            // JMP|JA takes its offset from `off`, JMP32|JA (gotol) from `imm`.
            let off = match width {
                Width::W64 => {
                    zero(pc, "ja", "imm", i.imm.into())?;
                    i.off.into()
                }
                Width::W32 => {
                    zero(pc, "ja32", "offset", i.off.into())?;
                    i.imm
                }
            };
            Ok(Op::Ja {
                target: pending_target(off),
            })
        }
        JMP_CALL => {
            if width == Width::W32 {
                return Err(unknown(pc, i));
            }
            zero(pc, "call", "offset", i.off.into())?;
            if is_reg {
                // callx: the register holding the helper id is in dst (Linux's encoding).
                zero(pc, "callx", "src", i.src.into())?;
                zero(pc, "callx", "imm", i.imm.into())?;
                let reg = check_reg(pc, "call target", i.dst)?;
                return Ok(Op::CallReg { reg });
            }
            zero(pc, "call", "dst", i.dst.into())?;
            match i.src {
                CALL_HELPER => {
                    let id = i.imm as u32;
                    if id == PJ_HELPER_PERCPU_OFFSET {
                        return Err(CompileError::at(
                            pc,
                            ErrorKind::UnknownHelper,
                            format!("call to helper id {id:#x}: reserved for the per-CPU mov, not callable"),
                        ));
                    }
                    if id == PJ_HELPER_STATIC_REGIONS {
                        return Err(CompileError::at(
                            pc,
                            ErrorKind::UnknownHelper,
                            format!(
                                "call to helper id {id:#x}: the static-region table, not callable"
                            ),
                        ));
                    }
                    if id == PJ_HELPER_CALLEE_TAIL_CALL {
                        return Err(CompileError::at(
                            pc,
                            ErrorKind::UnknownHelper,
                            format!(
                                "call to helper id {id:#x}: the runner of tail calls from bpf-to-bpf functions, not callable"
                            ),
                        ));
                    }
                    if id == PJ_HELPER_LOOKUP_VALUES {
                        return Err(CompileError::at(
                            pc,
                            ErrorKind::UnknownHelper,
                            format!(
                                "call to helper id {id:#x}: the lookup-value table, not callable"
                            ),
                        ));
                    }
                    if !helpers.iter().any(|h| h.id == id) {
                        return Err(CompileError::at(
                            pc,
                            ErrorKind::UnknownHelper,
                            format!("call to unknown helper id {id}"),
                        ));
                    }
                    Ok(Op::CallHelper { id })
                }
                CALL_LOCAL => Ok(Op::CallLocal {
                    target: pending_target(i.imm),
                }),
                other => Err(verr(
                    pc,
                    format!(
                        "call: unsupported call kind src={other} (BTF calls are not supported)"
                    ),
                )),
            }
        }
        JMP_EXIT => {
            if width == Width::W32 || is_reg {
                return Err(unknown(pc, i));
            }
            zero(pc, "exit", "dst", i.dst.into())?;
            zero(pc, "exit", "src", i.src.into())?;
            zero(pc, "exit", "offset", i.off.into())?;
            zero(pc, "exit", "imm", i.imm.into())?;
            Ok(Op::Exit)
        }
        _ => {
            let Some(cond) = jmp_cond(code) else {
                return Err(unknown(pc, i));
            };
            let dst = check_reg(pc, "destination", i.dst)?;
            let src = if is_reg {
                zero(pc, "jmp", "imm", i.imm.into())?;
                Operand::Reg(check_reg(pc, "source", i.src)?)
            } else {
                zero(pc, "jmp", "src", i.src.into())?;
                Operand::Imm(i.imm)
            };
            Ok(Op::Jcond {
                width,
                cond,
                dst,
                src,
                target: pending_target(i.off.into()),
            })
        }
    }
}

/// The condition of a conditional jump's operation code (`BPF_OP` bits), or `None` for
/// `ja`, `call`, `exit` and the undefined codes.
const fn jmp_cond(code: u8) -> Option<Cond> {
    Some(match code {
        JMP_JEQ => Cond::Eq,
        JMP_JGT => Cond::Gt,
        JMP_JGE => Cond::Ge,
        JMP_JSET => Cond::Set,
        JMP_JNE => Cond::Ne,
        JMP_JSGT => Cond::Sgt,
        JMP_JSGE => Cond::Sge,
        JMP_JLT => Cond::Lt,
        JMP_JLE => Cond::Le,
        JMP_JSLT => Cond::Slt,
        JMP_JSLE => Cond::Sle,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::encode_insn as ins;

    fn prog(insns: &[[u8; 8]]) -> Vec<u8> {
        insns.concat()
    }

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    fn err(code: &[u8]) -> String {
        decode(
            code,
            &[HelperEntry {
                id: 1,
                inline_kind: 0,
                addr: 0x1000,
            }],
        )
        .unwrap_err()
        .to_string()
    }

    /// The table-driven fast path against the reference decoder, over every opcode and a
    /// grid of register and field values around each rule's edges: whatever the table
    /// accepts, `decode_one` accepts with the same `Op`, and the effect word matches the
    /// generic one. (What the table refuses goes to `decode_one` itself.)
    #[test]
    fn the_fast_table_agrees_with_decode_one() {
        let helpers = [HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        let offs = [0i16, 1, -1, 7, 8, 16, 32, -8, i16::MIN, i16::MAX];
        let imms = [0i32, 1, -1, 16, 32, 64, 0x01, 0x41, 0xe1, 0xf1, i32::MIN];
        let (mut accepted, mut checked) = (0usize, 0usize);
        for opc in 0..=255u8 {
            for dst in 0..16u8 {
                for src in 0..16u8 {
                    for &off in &offs {
                        for &imm in &imms {
                            let raw = RawInsn::new(opc, dst, src, off, imm).to_bytes();
                            let code = [raw, [0; 8]].concat();
                            let mut out = Vec::new();
                            let Some(eff) = decode_fast(u64::from_le_bytes(raw), 0, &mut out)
                            else {
                                assert!(out.is_empty());
                                continue;
                            };
                            assert_eq!(out.len(), 1);
                            let op = out[0].op;
                            accepted += 1;
                            for percpu_insn in [false, true] {
                                let want =
                                    decode_one(&code, 0, &helpers, DecodeOptions { percpu_insn });
                                assert_eq!(
                                    want.as_ref().ok(),
                                    Some(&(op, 1)),
                                    "opcode {opc:#04x} dst {dst} src {src} off {off} imm {imm}"
                                );
                                checked += 1;
                            }
                            assert_eq!(eff, effects_of(&op), "{op:?}");
                        }
                    }
                }
            }
        }
        // The table covers the common encodings (not a vacuous pass).
        assert!(accepted > 50_000, "{accepted} fast decodes");
        assert_eq!(checked, 2 * accepted);
        // And every opcode the reference accepts with all-zero fields but the table refuses
        // is one of the documented slow-path encodings.
        for opc in 0..=255u8 {
            let fast = decode_fast(u64::from(opc), 0, &mut Vec::new()).is_some();
            let code = [[opc, 0, 0, 0, 0, 0, 0, 0], [0; 8]].concat();
            let slow_ok = decode_one(&code, 0, &helpers, DecodeOptions::default()).is_ok();
            if slow_ok && !fast {
                let class = opc & 7;
                let code4 = opc & 0xf0;
                assert!(
                    opc == LD_IMM64
                        || (matches!(class, CLASS_ALU | CLASS_ALU64)
                            && matches!(code4, ALU_NEG | ALU_END))
                        || (matches!(class, CLASS_JMP | CLASS_JMP32)
                            && matches!(code4, JMP_JA | JMP_CALL))
                        || (class == CLASS_STX && opc & 0xe0 == MODE_ATOMIC)
                        // Legacy packet loads (rare: rbpf's programs only).
                        || (class == CLASS_LD && matches!(opc & 0xe0, MODE_ABS | MODE_IND)),
                    "opcode {opc:#04x} is valid but not on the fast path"
                );
            }
        }
    }

    /// The per-function summaries come from per-block ORs plus recomputed edges: check them
    /// against a plain fold over each function's instructions, with function boundaries
    /// inside blocks, on block edges and functions shorter than a block.
    #[test]
    fn function_summaries_match_a_plain_fold() {
        for lens in [
            vec![3, 1, 1],
            vec![16, 16, 16],
            vec![15, 17, 40, 2, 33],
            vec![70, 5, 64, 1, 19],
            vec![1, 100],
        ] {
            // Entry: call each function, then exit; function k: a mix of writes and reads,
            // a store through r10 in every third, a copy of r10 in every third, exit.
            let mut code = Vec::new();
            let calls = lens.len() - 1;
            let mut at = calls + 1;
            for len in &lens[1..] {
                code.push(ins(0x85, 0, 1, 0, (at - code.len() - 1) as i32));
                at += len;
            }
            code.push(EXIT);
            for (k, &len) in lens.iter().enumerate().skip(1) {
                for j in 0..len - 1 {
                    let r = ((k + j) % 9 + 1) as u8;
                    code.push(match j % 4 {
                        0 => ins(0xb7, r, 0, 0, 1),
                        1 => ins(0x0f, r, (r % 9) + 1, 0, 0),
                        2 if k % 3 == 0 => ins(0x7b, 10, r, -8, 0),
                        2 if k % 3 == 1 => ins(0xbf, r, 10, 0, 0), // r = r10
                        _ => ins(0x65, r, 0, 0, 3),                // jsgt r, 3, +0
                    });
                }
                code.push(EXIT);
            }
            let p = decode(&prog(&code), &[]).unwrap();
            assert_eq!(p.subprogs.len(), lens.len());
            for sp in &p.subprogs {
                let (mut reads, mut writes, mut ops) = (0u16, 0u16, 0u16);
                for inst in &p.insts[sp.start..sp.end] {
                    reads |= crate::analysis::regs_read(&inst.op, crate::analysis::ARG_REGS);
                    writes |= inst.op.written_reg().map_or(0, |r| 1 << r);
                    ops |= inst.op.kind_bit();
                }
                if ops & op_kind::CALLS != 0 {
                    writes |= 0b11_1111;
                }
                assert_eq!(
                    (sp.reads, sp.writes, sp.ops),
                    (reads, writes, ops),
                    "{lens:?}"
                );
                assert_eq!(sp.uses_stack, reads & (1 << 10) != 0, "{lens:?}");
                let copies_r10 = p.insts[sp.start..sp.end].iter().any(|inst| {
                    matches!(
                        inst.op,
                        Op::Alu {
                            src: Operand::Reg(10),
                            ..
                        }
                    )
                });
                assert_eq!(sp.copies_r10, copies_r10, "{lens:?}");
            }
        }
    }

    /// A large program's instruction buffer is reused by the next large decode on the same
    /// thread (no fresh pages), and the result is the same.
    #[test]
    fn large_programs_reuse_the_instruction_buffer() {
        let n = crate::reuse::REUSE_MIN_BYTES / std::mem::size_of::<Inst>() + 10;
        let mut code = vec![ins(0xb7, 0, 0, 0, 1); n - 1];
        code.push(EXIT);
        let code = prog(&code);
        let first = decode(&code, &[]).unwrap();
        let (ptr, want) = (first.insts.as_ptr(), first.clone());
        drop(first);
        let again = decode(&code, &[]).unwrap();
        assert_eq!(again.insts.as_ptr(), ptr);
        assert_eq!(again, want);
        // Small programs do not take it.
        let small = decode(&prog(&[EXIT]), &[]).unwrap();
        assert_ne!(small.insts.as_ptr(), ptr);
    }

    #[test]
    fn accepts_every_alu_form() {
        for class in [CLASS_ALU, CLASS_ALU64] {
            for code in [
                ALU_ADD, ALU_SUB, ALU_MUL, ALU_DIV, ALU_OR, ALU_AND, ALU_LSH, ALU_RSH, ALU_MOD,
                ALU_XOR, ALU_MOV, ALU_ARSH,
            ] {
                let k = ins(class | code, 1, 0, 0, 3);
                let x = ins(class | code | SRC_X, 1, 2, 0, 0);
                decode(&prog(&[k, x, EXIT]), &[]).unwrap();
            }
        }
        // sdiv/smod and movsx use the offset field.
        decode(
            &prog(&[
                ins(0x3f, 1, 2, 1, 0),
                ins(0x9c, 1, 2, 1, 0),
                ins(0xbf, 1, 2, 32, 0),
                EXIT,
            ]),
            &[],
        )
        .unwrap();
        assert!(err(&prog(&[ins(0xbc, 1, 2, 32, 0), EXIT])).contains("offset must be 0, is 32"));
    }

    #[test]
    fn rejects_reserved_fields_naming_pc_and_field() {
        assert_eq!(
            err(&prog(&[ins(0x07, 0, 0, 1, 1), EXIT])),
            "pc 0: reserved field offset must be 0, is 1".replace("reserved", "add: reserved")
        );
        assert_eq!(
            err(&prog(&[ins(0x07, 0, 1, 0, 1), EXIT])),
            "pc 0: add: reserved field src must be 0, is 1"
        );
        assert_eq!(
            err(&prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x95, 0, 0, 0, 1)])),
            "pc 1: exit: reserved field imm must be 0, is 1"
        );
        assert_eq!(
            err(&prog(&[ins(0x85, 1, 0, 0, 1), EXIT])),
            "pc 0: call: reserved field dst must be 0, is 1"
        );
        assert_eq!(
            err(&prog(&[ins(0x05, 0, 0, 0, 1), EXIT])),
            "pc 0: ja: reserved field imm must be 0, is 1"
        );
    }

    #[test]
    fn rejects_bad_registers_and_opcodes() {
        assert_eq!(
            err(&prog(&[ins(0xb7, 11, 0, 0, 0), EXIT])),
            "pc 0: invalid destination register r11"
        );
        assert_eq!(
            err(&prog(&[ins(0xb7, 10, 0, 0, 0), EXIT])),
            "pc 0: r10 (the frame pointer) is read-only"
        );
        assert_eq!(
            err(&prog(&[ins(0xf7, 1, 0, 0, 0), EXIT])),
            "pc 0: unknown opcode 0xf7"
        );
        assert_eq!(
            err(&prog(&[ins(0x8e, 0, 0, 0, 0), EXIT])),
            "pc 0: unknown opcode 0x8e"
        );
    }

    #[test]
    fn jump_targets_across_lddw_resolve_to_instruction_indices() {
        let lddw = [ins(0x18, 1, 0, 0, 1), ins(0, 0, 0, 0, 0)];
        // A forward target found to be the second half of an lddw only once that lddw is
        // decoded: still refused.
        let code = prog(&[
            ins(0x15, 1, 0, 4, 0), // slot 0: if r1 == 0 goto slot 5
            lddw[0],               // slots 1-2
            lddw[1],
            ins(0x05, 0, 0, 2, 0), // slot 3: goto slot 6
            lddw[0],               // slots 4-5
            lddw[1],
            ins(0xb7, 0, 0, 0, 7), // slot 6
            EXIT,                  // slot 7
        ]);
        assert_eq!(
            err(&code),
            "pc 0: jump target 5 is the second half of LD_IMM64"
        );
        let code = prog(&[
            ins(0x15, 1, 0, 5, 0),  // 0 (slot 0): if r1 == 0 goto slot 6
            lddw[0],                // 1 (slots 1-2)
            lddw[1],                //
            ins(0x05, 0, 0, 2, 0),  // 2 (slot 3): goto slot 6
            lddw[0],                // 3 (slots 4-5)
            lddw[1],                //
            ins(0xb7, 0, 0, 0, 7),  // 4 (slot 6): r0 = 7
            ins(0x15, 0, 0, -4, 0), // 5 (slot 7): if r0 == 0 goto slot 4 (the second lddw)
            ins(0x05, 0, 0, -9, 0), // 6 (slot 8): goto slot 0
            EXIT,                   // 7 (slot 9)
        ]);
        let p = decode(&code, &[]).unwrap();
        let targets: Vec<(u32, u32)> = p.branches.iter().map(|b| (b.at, b.target)).collect();
        assert_eq!(targets, [(0, 4), (2, 4), (5, 3), (6, 0)]);
        for b in &p.branches {
            let (Op::Ja { target } | Op::Jcond { target, .. }) = p.insts[b.at as usize].op else {
                panic!("instruction {} is a jump", b.at);
            };
            assert_eq!(target, b.target, "instruction {}", b.at);
        }
        assert_eq!(p.exits, [7]);
    }

    #[test]
    fn checks_jumps_and_fallthrough() {
        assert_eq!(
            err(&prog(&[ins(0x05, 0, 0, 5, 0), EXIT])),
            "pc 0: jump target 6 is outside the program (0..2)"
        );
        assert_eq!(
            err(&prog(&[ins(0x05, 0, 0, -2, 0), EXIT])),
            "pc 0: jump target -1 is outside the program (0..2)"
        );
        let lddw = [ins(0x18, 1, 0, 0, 1), ins(0, 0, 0, 0, 0)];
        assert_eq!(
            err(&prog(&[ins(0x05, 0, 0, 1, 0), lddw[0], lddw[1], EXIT])),
            "pc 0: jump target 2 is the second half of LD_IMM64"
        );
        assert_eq!(
            err(&prog(&[ins(0xb7, 0, 0, 0, 0)])),
            "pc 0: falls through past the end of the program"
        );
        assert_eq!(
            err(&prog(&[lddw[0]])),
            "pc 0: lddw is missing its second slot"
        );
        assert_eq!(
            err(&prog(&[lddw[0], ins(0, 1, 0, 0, 0), EXIT])),
            "pc 1: second slot of lddw must have opcode, registers and offset 0"
        );
        assert_eq!(
            err(&[0u8; 12]),
            "program length 12 is not a multiple of 8 bytes"
        );
        assert_eq!(err(&[]), "empty program");
    }

    #[test]
    fn helpers_and_calls() {
        assert_eq!(
            err(&prog(&[ins(0x85, 0, 0, 0, 9), EXIT])),
            "pc 0: call to unknown helper id 9"
        );
        // call local +1 ; exit ; (f:) exit
        let p = decode(&prog(&[ins(0x85, 0, 1, 0, 1), EXIT, EXIT]), &[]).unwrap();
        assert_eq!(p.subprogs.len(), 2);
        assert_eq!(p.insts[0].op, Op::CallLocal { target: 2 });
        // Recursion is refused.
        assert_eq!(
            err(&prog(&[ins(0x85, 0, 1, 0, -1), EXIT])),
            "pc 0: recursive call to the function at pc 0"
        );
        // A function falling into the next one is refused.
        assert_eq!(
            err(&prog(&[ins(0x85, 0, 1, 0, 1), ins(0xb7, 0, 0, 0, 0), EXIT])),
            "pc 1: falls through into the function at pc 2"
        );
        // Jumps may not leave their function.
        assert_eq!(
            err(&prog(&[
                ins(0x85, 0, 1, 0, 2),
                ins(0x05, 0, 0, 1, 0),
                EXIT,
                EXIT
            ])),
            "pc 1: jump to pc 3 leaves the function starting at pc 0"
        );
    }

    #[test]
    fn call_depth_is_bounded() {
        // f0 calls f1 calls ... f8: nine frames. Each function is [call +1, exit], the last
        // is [exit]; the error names the outermost call of the too-deep chain.
        let mut code = vec![];
        for _ in 0..8 {
            code.push(ins(0x85, 0, 1, 0, 1));
            code.push(EXIT);
        }
        code.push(EXIT);
        assert_eq!(err(&prog(&code)), "pc 0: call chain deeper than 8 frames");
        let ok: Vec<_> = code[2..].to_vec();
        decode(&prog(&ok), &[]).unwrap();
    }

    #[test]
    fn ja32_and_atomics() {
        let p = decode(&prog(&[ins(0x06, 0, 0, 0, 1), EXIT, EXIT]), &[]).unwrap();
        assert_eq!(p.insts[0].op, Op::Ja { target: 2 });
        assert_eq!(
            err(&prog(&[ins(0xc3, 1, 2, 0, 0x03), EXIT])),
            "pc 0: unknown atomic operation 0x03 in imm"
        );
        assert_eq!(
            err(&prog(&[ins(0xd3, 1, 2, 0, 0), EXIT])),
            "pc 0: opcode 0xd3: atomics exist only for 32 and 64 bits"
        );
        let p = decode(&prog(&[ins(0xdb, 10, 1, -8, 0xf1), EXIT]), &[]).unwrap();
        assert_eq!(p.subprogs[0].writes & 1, 1, "cmpxchg writes r0");
        assert!(p.subprogs[0].uses_stack);
        // r10 as the *value* of an atomic (its address is stored) also needs the frame.
        let p = decode(&prog(&[ins(0xdb, 1, 10, 0, 0x00), EXIT]), &[]).unwrap();
        assert!(p.subprogs[0].uses_stack);
        let p = decode(&prog(&[ins(0x8d, 10, 0, 0, 0), EXIT]), &[]).unwrap();
        assert!(
            p.subprogs[0].uses_stack,
            "callx r10 reads the frame pointer"
        );
    }

    #[test]
    fn the_per_cpu_mov_needs_the_opt_in_and_its_table_entry() {
        let table = HelperEntry {
            id: PJ_HELPER_PERCPU_OFFSET,
            inline_kind: 0,
            addr: 0x1000,
        };
        // r0 = 0 ; r2 = percpu(r1, array 7) ; exit
        let code = prog(&[ins(0xb7, 0, 0, 0, 0), ins(0xbf, 2, 1, -1, 7), EXIT]);
        let on = DecodeOptions { percpu_insn: true };
        // Without the opt-in: a reserved offset, at its pc.
        let e = decode(&code, &[table]).unwrap_err();
        assert_eq!(e.pc, Some(1));
        assert!(e.to_string().contains("offset must be 0, is -1"), "{e}");
        // Opted in, without the table entry: refused at the pc.
        let e = decode_with(&code, &[], on).unwrap_err();
        assert_eq!(e.pc, Some(1));
        assert!(e.to_string().contains("per-CPU"), "{e}");
        let p = decode_with(&code, &[table], on).unwrap();
        assert_eq!(
            p.insts[1].op,
            Op::MovPerCpu {
                dst: 2,
                src: 1,
                array: Operand::Imm(7)
            }
        );
        assert!(p.subprogs[0].calls, "its CPU id may come from a call");
        // Only the 64-bit register form: mov32 and mov-immediate keep off = 0.
        for bad in [ins(0xbc, 2, 1, -1, 7), ins(0xb7, 2, 0, -1, 7)] {
            let c = prog(&[ins(0xb7, 0, 0, 0, 0), bad, EXIT]);
            assert_eq!(decode_with(&c, &[table], on).unwrap_err().pc, Some(1));
        }
        // Other offsets stay reserved; r10 is still not writable.
        let c = prog(&[ins(0xb7, 0, 0, 0, 0), ins(0xbf, 2, 1, -2, 0), EXIT]);
        assert_eq!(decode_with(&c, &[table], on).unwrap_err().pc, Some(1));
        let c = prog(&[ins(0xb7, 0, 0, 0, 0), ins(0xbf, 10, 1, -1, 0), EXIT]);
        assert_eq!(decode_with(&c, &[table], on).unwrap_err().pc, Some(1));
        // The table's id is not a callable helper, opt-in or not.
        let c = prog(&[ins(0x85, 0, 0, 0, PJ_HELPER_PERCPU_OFFSET as i32), EXIT]);
        let e = decode_with(&c, &[table], on).unwrap_err();
        assert_eq!(e.pc, Some(0));
        assert!(e.to_string().contains("not callable"), "{e}");
    }
}
