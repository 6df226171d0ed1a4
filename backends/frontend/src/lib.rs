//! # packjit-frontend
//!
//! The arch-neutral front end every packjit backend shares:
//!
//! * [`decode`] turns raw eBPF bytes into typed [`Inst`]s, running the structural
//!   verifier on the way: opcode validity (RFC 9669, cpu v4), reserved fields zero,
//!   register numbers, jump targets inside the program and its subprogram, `LD_IMM64`
//!   pairing, no fall-through off the end, bounded static call depth, known helpers.
//! * [`Program`] is the result: one entry per instruction (LD_IMM64 is one entry covering two
//!   slots), jump targets resolved to instruction indices, subprogram boundaries, and which
//!   registers each subprogram writes (so a backend saves only what it clobbers).
//!
//! Every rejection is a [`CompileError`](packjit_plugin_api::CompileError) naming the pc and the reason.
//!
//! ```
//! // mov r0, 7 ; exit
//! let code = [0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
//! let prog = packjit_frontend::decode(&code, &[]).unwrap();
//! assert_eq!(prog.insts.len(), 2);
//! let err = packjit_frontend::decode(&code[..8], &[]).unwrap_err();
//! assert_eq!(err.to_string(), "pc 0: falls through past the end of the program");
//! ```

pub mod analysis;
pub mod blind;
pub mod cold;
pub mod indexes;
mod insn;
pub mod lower;
pub mod packet;
pub mod ranges;
pub mod relax;
pub mod reuse;
pub mod simplify;
pub mod target;
mod verify;
pub mod walks;

pub use insn::*;
pub use simplify::decode_for_lowering;
pub use verify::{decode, decode_with, DecodeOptions, MAX_CALL_DEPTH, MAX_INSNS, STACK_SIZE};

/// A decoded, verified program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// Instructions in order. `insts[i].pc` is the slot index of the instruction.
    pub insts: Vec<Inst>,
    /// Number of 8-byte slots in the bytecode.
    pub slots: usize,
    /// Subprograms (index 0 is the entry). Each covers a contiguous instruction range.
    pub subprogs: Vec<Subprog>,
    /// `true` for each instruction index some branch or call lands on.
    pub is_target: Vec<bool>,
    /// Frames in the deepest chain of bpf-to-bpf calls from the entry (1 without calls).
    pub call_depth: usize,
    /// Every `ja`, conditional jump and local call, ascending by index: the few
    /// instructions a pass over control flow needs to visit, with what such a pass reads of
    /// them.
    pub branches: Vec<Branch>,
    /// Indices of every `exit`, ascending.
    pub exits: Vec<u32>,
    /// Indices of every local call, ascending: the call graph without a pass over
    /// [`Program::branches`] (a third of a branchy program's instructions).
    pub local_calls: Vec<u32>,
    /// Memory the code may access unchecked where an access is proven inside it
    /// ([`packjit_plugin_api::PJ_HELPER_STATIC_REGIONS`]; filled by
    /// [`decode_for_lowering`] for sandboxed requests, empty otherwise).
    pub static_regions: Vec<packjit_plugin_api::PjMemRegion>,
    /// Helper calls whose result is known at compile time, ascending by index: array
    /// lookups with a constant key (the element's address, or 0 past the end), which the
    /// driver folds to that constant. Filled by [`decode_for_lowering`], so the access
    /// analysis knows r0 after them ([`ranges::transfer_at`]).
    pub call_results: Vec<(usize, u64)>,
    /// Map lookups whose non-NULL result the host vouches for
    /// ([`packjit_plugin_api::PJ_HELPER_LOOKUP_VALUES`]), ascending by instruction index:
    /// r0 after the call is 0 or points to a value of this many bytes, writable or not.
    /// Filled by [`decode_for_lowering`] for sandboxed requests (empty otherwise), so the
    /// access analysis proves accesses into the value after the program's NULL test
    /// ([`ranges::LookupValue`]).
    pub lookup_values: Vec<ranges::LookupValue>,
    /// Helper calls the driver expands into code that reads fewer argument registers than a
    /// call (r1-r5), ascending by instruction index, with the registers (bit n = rn) the
    /// expansion reads: the entry function's inlined prog-array tail calls, which read only
    /// the index r3 (none for a constant index). Filled by [`decode_for_lowering`], so the
    /// entry's zeroing ([`analysis::entry_zeroing`]) and the driver's dead argument setup
    /// count what the code reads, not what a call would.
    pub expanded_calls: Vec<(usize, u16)>,
}

/// A jump or local call as a pass over control flow sees it, without reading its
/// instruction: at 1 M instructions `insts` is 20 MB, and a pass that visits every branch
/// there touches nearly every cache line of it (one instruction in a few is a branch), from
/// memory rather than cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Branch {
    /// Instruction index of the branch.
    pub at: u32,
    /// Instruction index it goes to: always the `target` of its [`Op`].
    pub target: u32,
    /// Which of the three it is.
    pub kind: BranchKind,
    /// What a conditional jump compares; [`Compared::Nothing`] for `ja` and calls. Passes
    /// that look for loops of one shape (a walk's back-edge compares two registers at 64
    /// bits, see [`walks`]) read it here instead of from the instruction.
    pub compared: Compared,
}

/// The operands of a [`BranchKind::Jcond`], as its [`Op::Jcond`] has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compared {
    /// Not a conditional jump.
    Nothing,
    /// A register against the immediate, at this width.
    RegImm(Width),
    /// Two registers, at this width.
    RegReg(Width),
}

impl Compared {
    /// What `op` compares.
    pub fn of(op: &Op) -> Compared {
        match *op {
            Op::Jcond {
                width,
                src: Operand::Reg(_),
                ..
            } => Compared::RegReg(width),
            Op::Jcond { width, .. } => Compared::RegImm(width),
            _ => Compared::Nothing,
        }
    }
}

/// What a [`Branch`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BranchKind {
    /// [`Op::Ja`].
    Ja,
    /// [`Op::Jcond`].
    Jcond,
    /// [`Op::CallLocal`].
    CallLocal,
}

impl Drop for Program {
    fn drop(&mut self) {
        // The lists go back to this thread for its next decode (large ones to its spares).
        verify::keep_program_lists(self);
    }
}

/// A function inside the program: the entry or the target of a local call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subprog {
    /// First instruction index (into [`Program::insts`]).
    pub start: usize,
    /// One past the last instruction index.
    pub end: usize,
    /// Bit `n` set when BPF register `rn` is written in this subprogram (r0..r9).
    pub writes: u16,
    /// `true` when the subprogram makes helper or local calls (or has a per-CPU mov, which
    /// may call for the CPU id).
    pub calls: bool,
    /// `true` when the subprogram touches its stack frame through r10.
    pub uses_stack: bool,
    /// `true` when an ALU instruction has r10 as its source (`r2 = r10`): only then can a
    /// register other than r10 hold an address in this function's frame.
    pub copies_r10: bool,
    /// Bit `n` set when BPF register `rn` is read in this subprogram, by
    /// [`analysis::regs_read`] with [`analysis::ARG_REGS`] for local calls (r10 included).
    pub reads: u16,
    /// The [`op_kind`] bits of the instructions in this subprogram.
    pub ops: u16,
}

impl Program {
    /// Registers instruction `i` reads (bit n = rn), as [`analysis::regs_read`] says (r1–r5
    /// for a local call).
    #[inline]
    pub fn reads(&self, i: usize) -> u16 {
        analysis::regs_read(&self.insts[i].op, analysis::ARG_REGS)
    }

    /// The register instruction `i` writes (bit n = rn; 0 for none).
    #[inline]
    pub fn writes(&self, i: usize) -> u16 {
        self.insts[i].op.written_reg().map_or(0, |r| 1 << r)
    }

    /// The registers holding one value (bit n = rn) after instruction `i`, from `holding`
    /// before it: a 64-bit `mov` from one of them copies the value, any other write
    /// replaces what it writes. For straight-line code (see
    /// [`op_kind::STRAIGHT_LINE_END`]).
    #[inline]
    pub fn copies_after(&self, i: usize, holding: u16) -> u16 {
        match self.insts[i].op {
            Op::Alu {
                width: Width::W64,
                op: AluOp::Mov,
                dst,
                src: Operand::Reg(src),
            } if holding & (1 << src) != 0 => holding | (1 << dst),
            _ => holding & !self.writes(i),
        }
    }

    /// Instruction `i`'s [`op_kind`] bit.
    #[inline]
    pub fn kind(&self, i: usize) -> u16 {
        self.insts[i].op.kind_bit()
    }

    /// The branches (jumps and local calls) at instruction indices `start..end`: one slice
    /// of [`Program::branches`], found by binary search.
    pub fn branches_in(&self, start: usize, end: usize) -> &[Branch] {
        let lo = self.branches.partition_point(|b| (b.at as usize) < start);
        let hi = self.branches.partition_point(|b| (b.at as usize) < end);
        &self.branches[lo..hi]
    }

    /// The subprogram containing instruction index `i`.
    pub fn subprog_of(&self, i: usize) -> usize {
        self.subprogs.partition_point(|s| s.end <= i)
    }

    /// The line table for the plugin ABI (`Compiled::pc_offsets`) from a lowering's
    /// `inst_offsets` (entry `i`: where instruction `i`'s native code starts): one entry per
    /// bytecode slot, with `NO_NATIVE_CODE` for the second slot of `lddw`. Without `lddw`
    /// instruction i is slot i and the offsets are the table: handed over, not copied (at
    /// 1 M instructions a copy is another 4 MB through memory).
    pub fn line_table(&self, inst_offsets: reuse::Reused<u32>) -> Vec<u32> {
        if self.slots == self.insts.len() && inst_offsets.len() == self.slots {
            return inst_offsets.into_vec();
        }
        let mut table = vec![packjit_plugin_api::NO_NATIVE_CODE; self.slots];
        for (inst, &o) in self.insts.iter().zip(inst_offsets.iter()) {
            table[inst.pc as usize] = o;
        }
        table
    }
}
