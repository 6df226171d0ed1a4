//! Access analysis for the sandbox: a forward dataflow over each function's control-flow
//! graph that tracks, per BPF register, where its value comes from (the current frame's r10,
//! the context start, or a plain scalar) and an interval for the offset or value. Every
//! backend lowers its memory checks from the verdicts ([`AccessPlan`]), so a proof lives in
//! one place.
//!
//! # What is proven, and why it is Spectre-safe
//!
//! Only *data-derived* facts are used: constants, `and` masks, shifts, loads of narrow sizes,
//! r10 and the context start. Branch conditions are never used to narrow a value (but for a
//! map lookup's NULL test, see below), so every such fact holds on every (also mispredicted)
//! path: an access proven inside the current frame needs neither a check nor a clamp
//! ([`AccessCheck::None`]). Everything else keeps an exact
//! run-time check; the analysis then only picks which region to test inline.
//!
//! # Map values: the one fact a branch teaches
//!
//! A map lookup the host vouches for ([`Program::lookup_values`]) leaves in r0 either 0 or
//! the address of a value of `value_size` bytes. Right after the call r0 is
//! [`Base::Lookup`] (that call's result, not yet tested); a conditional jump that compares
//! exactly that result with 0 at 64 bits ([`narrow`]) makes it, and every copy or constant
//! offset of it, [`Base::Value`] on the edge where it is not 0. An access inside
//! `[0, value_size)` of a `Value` needs no check (a write only into a writable map's value).
//! Everything else keeps its check: a result used without the test (a NULL dereference
//! stops as out of bounds at run time), a pointer stored and reloaded (loads of 8 bytes
//! are unknown), one passed through a helper (calls clobber r0-r5).
//!
//! This is the only fact that rests on a branch, so it is the one that needs an argument
//! under misspeculation: when the NULL test is mispredicted, the register holds 0, and the
//! proven access reads or writes `0 + [0, value_size)`. Proofs are limited to the first
//! [`NULL_GUARD`] bytes of a value, the never-mapped first page (the same premise as the
//! check groups' clamp): such an access faults, the fault is squashed with the wrong path,
//! and no host data reaches the cache. Every other path's facts are data-derived as before. A
//! lookup's result registers are forgotten when the same call runs again (a loop), so a
//! later test of the new result never vouches for an older, untested one.
//!
//! # Across bpf-to-bpf calls
//!
//! A callee starts from what its callers pass: r1–r5 are the join over its call sites of the
//! callers' values there, a frame offset moved up by 512 (the callee's r10 is its caller's
//! minus one frame), the context start and scalars as they are ([`CallFacts`]). Functions
//! are analysed callers first (eBPF has no recursion), so one pass sees every call site.
//! In a function that always runs with at least `d` callers' frames above its own (the
//! shortest call path to it), a stack access is proven anywhere in
//! `[r10 - 512, r10 + 512·d)`: those frames are inside the stack block whenever it runs.
//! Both facts are data-derived (the caller's facts hold on every path into the call, and a
//! function is entered only by a direct call), so they hold under misspeculation too.
//!
//! # Lattice and termination
//!
//! A register's abstract value is a [`Val`]: a [`Base`] (`Scalar`, `Stack` = this function's
//! r10, `Ctx` = the context start) plus an interval `[lo, hi]` of signed 64-bit offsets (for
//! scalars: the value read as `i64`). An interval is exact arithmetic on integers: an
//! operation whose result may leave `i64` (that is, wrap modulo 2^64) goes to the full range
//! `[i64::MIN, i64::MAX]`, which stands for every 64-bit value, so no wrapped value is ever
//! described by a bounded interval. Values of different bases join to the full scalar range
//! (`top`): a pointer of unknown origin.
//!
//! The join of two intervals is their hull. States are kept only where paths meet (a
//! function's start and its jump targets, see [`for_each_state`]), visited lowest index
//! first. At a join, a bound of a register that moves for the [`WIDEN_AT`]th time jumps to
//! its extreme (widening), and so does every bound that moves once the join's state has grown
//! [`WIDEN_AFTER`] times; a base that changes goes to top. Each register's value can then
//! change only a bounded number of times (base once, each bound at most [`WIDEN_AT`] times),
//! and every cycle passes a jump target, so the iteration reaches a fixed point.
//!
//! The count per bound is what keeps loops cheap: a counter widens on its second step, after
//! two passes around its loop instead of the five the state-wide count alone took (each pass
//! runs the whole body again, and the passes were most of a sandboxed compile's analysis),
//! while a bound that settles after one move (a value chosen in the body, a pointer set once
//! in the loop) keeps its exact range. The state-wide count still bounds loops whose joins
//! see one register after another move once each (a value handed down a chain of copies).

use crate::{
    AluOp, AtomicOp, BranchKind, Cond, Op, Operand, Program, Reg, Size, Width, R10, STACK_SIZE,
};
use packjit_plugin_api::{PjMemRegion, PJ_REGION_WRITABLE};

/// What a value is relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Base {
    /// A number (or a pointer of unknown origin when the interval is full).
    Scalar,
    /// The current function's r10 plus the offset (a caller's frame is at a positive
    /// offset: 512 above r10 is the caller's r10).
    Stack,
    /// The context start plus the offset: r1 on entry to the program, or passed to a callee
    /// (the same address in every function).
    Ctx,
    /// The result of the map lookup at instruction [`Val::site`]
    /// ([`Program::lookup_values`]) plus the offset, not yet tested: 0 or a value's address.
    Lookup,
    /// The same result on a path where the program tested it non-zero ([`narrow`]): the
    /// address of a value of that lookup's `value_size` bytes, plus the offset.
    Value,
}

/// A map lookup whose non-NULL result the host vouches for
/// ([`packjit_plugin_api::PJ_HELPER_LOOKUP_VALUES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LookupValue {
    /// Instruction index of the `call`.
    pub at: u32,
    /// Bytes of the value a non-NULL result points to.
    pub value_size: u32,
    /// Whether the program may write it.
    pub writable: bool,
}

/// Proofs into a map value stay inside its first this many bytes: a mispredicted NULL test
/// leaves 0 in the pointer, and `[0, 4096)` is the first page, which is never mapped (see
/// the module docs).
pub const NULL_GUARD: u32 = 4096;

/// An abstract register value: `base + [lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Val {
    /// Origin of the value.
    pub base: Base,
    /// For [`Base::Lookup`] and [`Base::Value`]: the instruction index of the lookup whose
    /// result this is; 0 for every other base. Kept apart from [`Base`] (in the padding
    /// after it), so that `Base` stays one byte and compares as one: the dataflow compares
    /// bases at every join.
    pub site: u32,
    /// Smallest offset (or value).
    pub lo: i64,
    /// Largest offset (or value).
    pub hi: i64,
}

impl Val {
    /// Anything at all.
    pub const TOP: Val = Val {
        base: Base::Scalar,
        site: 0,
        lo: i64::MIN,
        hi: i64::MAX,
    };

    /// The constant `c`.
    pub const fn konst(c: i64) -> Val {
        Val {
            base: Base::Scalar,
            site: 0,
            lo: c,
            hi: c,
        }
    }

    fn range(base: Base, lo: i128, hi: i128) -> Val {
        if lo < i64::MIN as i128 || hi > i64::MAX as i128 {
            // May wrap modulo 2^64: every value is possible.
            Val {
                base,
                site: 0,
                lo: i64::MIN,
                hi: i64::MAX,
            }
        } else {
            Val {
                base,
                site: 0,
                lo: lo as i64,
                hi: hi as i64,
            }
        }
    }

    fn scalar(lo: i128, hi: i128) -> Val {
        Val::range(Base::Scalar, lo, hi)
    }

    fn is_full(&self) -> bool {
        self.lo == i64::MIN && self.hi == i64::MAX
    }

    /// A scalar whose value is in `[0, max]`, if this is one.
    fn nonneg_max(&self) -> Option<i64> {
        (self.base == Base::Scalar && self.lo >= 0).then_some(self.hi)
    }

    /// The same origin: the same base and, for a lookup's result, the same lookup.
    fn same_origin(&self, o: &Val) -> bool {
        self.base == o.base && self.site == o.site
    }

    /// This origin with offsets `[lo, hi]` (all values when they may wrap).
    fn moved(self, lo: i128, hi: i128) -> Val {
        Val {
            site: self.site,
            ..Val::range(self.base, lo, hi)
        }
    }

    fn join(self, o: Val) -> Val {
        if !self.same_origin(&o) {
            return Val::TOP;
        }
        Val {
            base: self.base,
            site: self.site,
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        }
    }

    /// Whether joining `v` leaves this value as it is.
    fn covers(&self, v: &Val) -> bool {
        if self.same_origin(v) {
            self.lo <= v.lo && v.hi <= self.hi
        } else {
            *self == Val::TOP
        }
    }

    /// The join with `v`, which this value does not cover, each bound that moves widened on
    /// its [`WIDEN_AT`]th move or with `widen`; `moves` counts them (low nibble `lo`, high
    /// nibble `hi`).
    fn joined_counting(self, v: Val, moves: &mut u8, widen: bool) -> Val {
        if !self.same_origin(&v) {
            return Val::TOP;
        }
        let mut lo = self.lo;
        if v.lo < lo {
            *moves += 1;
            lo = if widen || *moves & 0xf >= WIDEN_AT {
                i64::MIN
            } else {
                v.lo
            };
        }
        let mut hi = self.hi;
        if v.hi > hi {
            *moves += 0x10;
            hi = if widen || *moves >> 4 >= WIDEN_AT {
                i64::MAX
            } else {
                v.hi
            };
        }
        Val {
            base: self.base,
            site: self.site,
            lo,
            hi,
        }
    }
}

/// Abstract registers r0..r10.
pub type State = [Val; 11];

/// The move of one register's bound at a join that widens it (see the module docs).
pub const WIDEN_AT: u8 = 2;

/// Growths of a join's state after which every bound that still moves is widened (see the
/// module docs).
pub const WIDEN_AFTER: u32 = 3;

/// Largest value of a `bits`-wide unsigned field.
fn umax(bits: u32) -> i128 {
    (1i128 << bits) - 1
}

/// The abstract result of `dst = dst op src` at 64 bits.
fn alu64(op: AluOp, d: Val, s: Val) -> Val {
    let (dl, dh, sl, sh) = (d.lo as i128, d.hi as i128, s.lo as i128, s.hi as i128);
    let both_scalar = d.base == Base::Scalar && s.base == Base::Scalar;
    match op {
        AluOp::Mov => s,
        AluOp::Add => match (d.base, s.base) {
            (_, Base::Scalar) => d.moved(dl + sl, dh + sh),
            (Base::Scalar, _) => s.moved(dl + sl, dh + sh),
            _ => Val::TOP,
        },
        AluOp::Sub => match (d.base, s.base) {
            (_, Base::Scalar) => d.moved(dl - sh, dh - sl),
            // Two pointers of one origin: the difference of their offsets.
            _ if d.same_origin(&s) => Val::scalar(dl - sh, dh - sl),
            _ => Val::TOP,
        },
        // Masking with a non-negative value bounds the result by that value, whatever the
        // other operand is (even a pointer: the result is a number <= the mask).
        AluOp::And => match (d.nonneg_max(), s.nonneg_max()) {
            (Some(a), Some(b)) => Val::scalar(0, a.min(b) as i128),
            (Some(a), None) | (None, Some(a)) => Val::scalar(0, a as i128),
            _ => Val::TOP,
        },
        AluOp::Lsh if both_scalar && sl == sh => {
            let k = (sl & 63) as u32;
            if dl >= 0 && dh < (1i128 << (63 - k)) {
                Val::scalar(dl << k, dh << k)
            } else {
                Val::TOP
            }
        }
        AluOp::Rsh if both_scalar && sl == sh => {
            let k = (sl & 63) as u32;
            if dl >= 0 {
                Val::scalar(dl >> k, dh >> k)
            } else if k > 0 {
                Val::scalar(0, umax(64 - k))
            } else {
                d
            }
        }
        AluOp::Arsh if both_scalar && sl == sh => {
            let k = (sl & 63) as u32;
            Val::scalar(dl >> k, dh >> k)
        }
        AluOp::Mul if both_scalar && dl >= 0 && sl >= 0 => {
            // Products of non-negative ranges; beyond i64 the range goes full.
            match dh.checked_mul(sh) {
                Some(h) => Val::scalar(dl * sl, h),
                None => Val::TOP,
            }
        }
        AluOp::Div if both_scalar && dl >= 0 && sl >= 0 => {
            // Unsigned division of non-negative values never grows them; x / 0 = 0.
            Val::scalar(0, dh)
        }
        AluOp::Mod if both_scalar && sl > 0 && dl >= 0 => {
            // x % s < s, and x % s <= x; the divisor is never 0 here.
            Val::scalar(0, dh.min(sh - 1))
        }
        AluOp::Or | AluOp::Xor if both_scalar && dl >= 0 && sl >= 0 => {
            // Neither sets a bit above the highest of its operands.
            let m = dh.max(sh) as u64;
            let bits = 64 - m.leading_zeros();
            Val::scalar(0, umax(bits))
        }
        _ => Val::TOP,
    }
}

/// The abstract result of a 32-bit ALU operation (zero-extended result).
fn alu32(op: AluOp, d: Val, s: Val) -> Val {
    let full = Val::scalar(0, umax(32));
    let small = |v: Val| v.base == Base::Scalar && v.lo >= 0 && v.hi <= u32::MAX as i64;
    if op == AluOp::Mov {
        return if small(s) { s } else { full };
    }
    // With both operands in [0, 2^32) the 32-bit result equals the 64-bit one whenever that
    // one is in [0, 2^32) too: add, sub, mul, and, or, xor and lsh agree modulo 2^32; rsh,
    // div and mod see the same operands. The shift count is masked to 31, not 63.
    let s = if matches!(op, AluOp::Lsh | AluOp::Rsh) && s.lo == s.hi {
        Val::konst(s.lo & 31)
    } else {
        s
    };
    if !small(d) || !small(s) || matches!(op, AluOp::Arsh | AluOp::Sdiv | AluOp::Smod) {
        return full;
    }
    let r = alu64(op, d, s);
    if small(r) {
        r
    } else {
        full
    }
}

/// [`transfer`] at instruction `i` of `prog`, with what the program knows of a helper call's
/// result at compile time ([`Program::call_results`]: a folded array lookup's element).
pub fn transfer_at(prog: &Program, i: usize, st: &mut State) {
    let op = &prog.insts[i].op;
    transfer(st, op);
    if matches!(op, Op::CallHelper { .. }) {
        if !prog.lookup_values.is_empty() {
            lookup_result(prog, i, st);
        }
        if !prog.call_results.is_empty() {
            if let Ok(k) = prog.call_results.binary_search_by_key(&i, |&(at, _)| at) {
                // Host addresses are below 2^63: exact as an i64.
                st[0] = Val::konst(prog.call_results[k].1 as i64);
            }
        }
    }
}

/// r0 after the helper call at `i`, when it is a lookup the host vouches for: that call's
/// untested result ([`Base::Lookup`]). Out of line: most programs have none.
#[cold]
#[inline(never)]
fn lookup_result(prog: &Program, i: usize, st: &mut State) {
    let at = i as u32;
    if prog
        .lookup_values
        .binary_search_by_key(&at, |l| l.at)
        .is_err()
    {
        return;
    }
    // The call runs again: an untested result of its previous run (kept in r6-r9) is no
    // longer the result a test of r0 would tell about.
    for r in st.iter_mut().take(10) {
        if r.base == Base::Lookup && r.site == at {
            *r = Val::TOP;
        }
    }
    st[0] = Val {
        base: Base::Lookup,
        site: at,
        lo: 0,
        hi: 0,
    };
}

/// What the conditional jump `op` teaches on one edge (`taken`, or the fall-through) about
/// a map lookup's result: compared with 0 at 64 bits and not 0 on this edge, that result and
/// every register holding it plus an offset become [`Base::Value`]. Only the exact result
/// (offset 0) is tested: `r0 + 8 != 0` says nothing about r0. The states of both edges are
/// applied after [`transfer_at`] (a jump changes no register).
pub fn narrow(op: &Op, st: &mut State, taken: bool) {
    let Op::Jcond {
        width: Width::W64,
        cond,
        dst,
        src: Operand::Imm(0),
        ..
    } = *op
    else {
        return;
    };
    let v = st[dst as usize];
    if v.base != Base::Lookup {
        return;
    }
    let at = v.site;
    let nonzero = match cond {
        Cond::Eq | Cond::Le => !taken,
        Cond::Ne | Cond::Gt => taken,
        _ => false,
    };
    if !nonzero || v.lo != 0 || v.hi != 0 {
        return;
    }
    for r in st.iter_mut().take(10) {
        if r.base == Base::Lookup && r.site == at {
            r.base = Base::Value;
        }
    }
}

/// Applies one instruction to `st` (the state before it, afterwards the state after it).
/// Calls are not followed: a call only clobbers what the calling convention lets it.
#[inline]
pub fn transfer(st: &mut State, op: &Op) {
    let get = |st: &State, o: Operand, w: Width| match o {
        Operand::Reg(r) => st[r as usize],
        Operand::Imm(i) => match w {
            Width::W64 => Val::konst(i as i64),
            Width::W32 => Val::konst(i as u32 as i64),
        },
    };
    match *op {
        Op::Alu {
            width,
            op,
            dst,
            src,
        } => {
            let d = st[dst as usize];
            let s = get(st, src, width);
            st[dst as usize] = match width {
                Width::W64 => alu64(op, d, s),
                Width::W32 => alu32(op, d, s),
            };
        }
        // A pointer moved by an unknown CPU's offset: nothing is known of it.
        Op::MovPerCpu { dst, .. } => st[dst as usize] = Val::TOP,
        Op::MovSx {
            width, dst, bits, ..
        } => {
            let m = 1i128 << (bits - 1);
            st[dst as usize] = match width {
                Width::W64 => Val::scalar(-m, m - 1),
                Width::W32 => Val::scalar(0, umax(32)),
            };
        }
        Op::Neg { width, dst } => {
            let d = st[dst as usize];
            st[dst as usize] = match width {
                Width::W64 if d.base == Base::Scalar => {
                    Val::scalar(-(d.hi as i128), -(d.lo as i128))
                }
                Width::W64 => Val::TOP,
                Width::W32 => Val::scalar(0, umax(32)),
            };
        }
        Op::End { bits, dst, .. } => {
            st[dst as usize] = if bits == 64 {
                Val::TOP
            } else {
                Val::scalar(0, umax(bits as u32))
            };
        }
        Op::LdImm64 { dst, imm } => st[dst as usize] = Val::konst(imm.get() as i64),
        Op::Load {
            size,
            sign_extend,
            dst,
            ..
        } => {
            let bits = size.bytes() * 8;
            st[dst as usize] = match (size, sign_extend) {
                (Size::DW, _) => Val::TOP,
                (_, false) => Val::scalar(0, umax(bits)),
                (_, true) => Val::scalar(-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
            };
        }
        Op::PacketLoad { size, .. } => {
            st[0] = match size {
                Size::DW => Val::TOP,
                _ => Val::scalar(0, umax(size.bytes() * 8)),
            };
        }
        Op::Store { .. } => {}
        Op::Atomic { op, fetch, src, .. } => {
            if op == AtomicOp::Cmpxchg {
                st[0] = Val::TOP;
            } else if fetch || op == AtomicOp::Xchg {
                st[src as usize] = Val::TOP;
            }
        }
        Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. } => {
            // r0 is the result; r1-r5 are clobbered; r6-r9 and r10 are preserved (helpers
            // and bpf-to-bpf calls alike, per the calling convention).
            for r in st.iter_mut().take(6) {
                *r = Val::TOP;
            }
        }
        Op::Ja { .. } | Op::Jcond { .. } | Op::Exit => {}
    }
}

/// The registers on entry to function `k` before its call sites are known: the entry gets
/// r1 = the context start, r2 = its length, r0 and r3-r9 zero; a callee knows nothing of
/// its arguments (the dataflow then fills in r1-r5 from its callers, see [`CallFacts`]).
/// r10 is the function's own frame pointer either way.
pub fn entry_state(k: usize) -> State {
    let mut st = [Val::TOP; 11];
    if k == 0 {
        for (r, v) in st.iter_mut().enumerate() {
            *v = Val::konst(0);
            if r == 1 {
                *v = Val {
                    base: Base::Ctx,
                    site: 0,
                    lo: 0,
                    hi: 0,
                };
            } else if r == 2 {
                // The length: nothing is assumed about it.
                *v = Val::TOP;
            }
        }
    }
    st[R10 as usize] = Val {
        base: Base::Stack,
        site: 0,
        lo: 0,
        hi: 0,
    };
    st
}

/// How one load, store or atomic is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessCheck {
    /// Not an access.
    NotAccess,
    /// Proven inside the current 512-byte frame (or a caller's frame that is above it on
    /// every call path, see [`classify_in`]), or inside one of the program's static
    /// regions ([`Program::static_regions`]), from data-derived facts on every path: no
    /// check and no clamp.
    None,
    /// The base is this function's r10 plus something: test the stack block inline first.
    Stack,
    /// Through a pointer a loop walks inside the current frame, proven by the loop's exit
    /// test on every architectural path ([`crate::walks`]): no check; the loop's back-edge
    /// clamps the pointer instead (see [`crate::walks::Walk`]).
    Walked,
    /// Through the pointer of a walk whose bounds only a run-time test on entry can prove
    /// ([`crate::walks::Guard`]): no check in the loop the guard lets run; in the loop's
    /// checked copy (taken when the guard fails) a check as for [`AccessCheck::Ctx`].
    Guarded,
    /// The base is exactly the context start plus a constant and the access starts at
    /// `end - size >= 0` bytes into the context: it is in the context iff `end <= ctx_len`.
    CtxConst {
        /// Offset of the access's end from the context start (`c + off + size`). At most
        /// `u32::MAX` ([`classify`] gives larger ends [`AccessCheck::Ctx`]): a `u64` here
        /// would double the per-instruction table.
        end: u32,
    },
    /// The base is the context start plus the index register `index` (plus a constant) and
    /// every path to the access compared the index with the context length so that the
    /// access ends at most `end` bytes past `ctx_start + index`, inside the context
    /// ([`crate::indexes`]): no branch, no out-of-line side; the backend re-tests
    /// `index + end <= ctx_len` branch-free and selects a harmless address when it fails,
    /// which only a mispredicted branch can make it do.
    CtxIndex {
        /// The register the access's base is `ctx_start + index + c` of.
        index: Reg,
        /// A register holding the context length at the access (every backend may use its
        /// own copy of the length instead).
        len: Option<Reg>,
        /// `c + off + size`: `index + end <= ctx_len` holds on every architectural path.
        end: u16,
    },
    /// The base is the context start plus something: test the context inline first.
    Ctx,
    /// Unknown origin.
    Unknown,
}

/// Checks widened over several accesses off one base register in one extended basic block
/// (see [`group_accesses`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    /// Base register, unmodified from the first member through the last.
    pub base: Reg,
    /// Instruction index of the first member (where the widened check goes).
    pub first: usize,
    /// Instruction index of the last member.
    pub last: usize,
    /// Smallest `off` of the members: at least [`GROUP_BELOW`]; when negative, `hi` is at
    /// most [`GROUP_BELOW_END`] and a mispredicted widened test clamps the base to `-lo`.
    pub lo: i16,
    /// Largest `off + size` of the members.
    pub hi: i32,
    /// Members' instruction indices, in order.
    pub members: Vec<usize>,
    /// How the widened range is tested (the members' common class, `Ctx`/`CtxConst`
    /// folded: `CtxConst.end` is the group's end).
    pub check: AccessCheck,
    /// Some jump re-enters this group with its accesses already validated (see
    /// [`AccessPlan::reentry`]): the backend binds a label right after the widened check
    /// and clamp, and in the checked copy clamps the base register itself after each
    /// member's check, so the base is safe under misspeculation on both paths.
    pub reentered: bool,
}

/// The analysis result every backend lowers its checks from (empty for trusted code).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessPlan {
    /// Per instruction index; empty when the plan has no accesses (read it through
    /// [`AccessPlan::check`]).
    pub checks: Vec<AccessCheck>,
    /// Check groups (see [`group_accesses`]); `group_of[i]` indexes into it.
    pub groups: Vec<Group>,
    /// For each instruction index, the group it belongs to; empty when there are no groups
    /// (read it through [`AccessPlan::group_of`]).
    pub group_of: Vec<Option<u32>>,
    /// Loops walking a pointer through the frame, sorted by head ([`crate::walks`]): each
    /// back-edge lands on a clamp of the pointer before the head.
    pub walks: Vec<crate::walks::Walk>,
    /// `(jump, group)` pairs, sorted by jump: the jump's target is the group's first member
    /// and, on every path to the jump, the group's accesses already ran validated with the
    /// base register unchanged since (see [`reentries`]). Such a jump goes past the group's
    /// check. This is what makes a loop-invariant check run once per loop entry.
    pub reentries: Vec<(usize, usize)>,
    /// Per instruction index, whether the lowering may jump to it: a branch or call target,
    /// or where a check group's or guarded walk's checked copy rejoins the straight-line
    /// code (the instruction after the group or the loop, which can be any instruction).
    /// Empty when the plan has no groups or walks: then the targets are all, and
    /// [`AccessPlan::jumped_to`] reads `Program::is_target`.
    pub jumped_to: Vec<bool>,
}

/// The per-instruction tables are megabytes for a large program: they go back to the
/// thread's spares ([`crate::reuse`]) for the next compile instead of to the allocator.
impl Drop for AccessPlan {
    fn drop(&mut self) {
        crate::reuse::give_back(std::mem::take(&mut self.checks));
        crate::reuse::give_back(std::mem::take(&mut self.group_of));
        crate::reuse::give_back(std::mem::take(&mut self.jumped_to));
    }
}

impl AccessPlan {
    /// May the lowering jump to instruction `i` of `prog` (the program the plan is for)?
    /// Only those instructions get a label of their own (see
    /// [`crate::analysis::instruction_labels`]).
    #[inline]
    pub fn jumped_to(&self, prog: &Program, i: usize) -> bool {
        if self.jumped_to.is_empty() {
            prog.is_target[i]
        } else {
            self.jumped_to[i]
        }
    }

    /// Is any access checked against the context start plus a constant, or an index
    /// ([`AccessCheck::CtxIndex`])? (Then the entry must make r1 exactly `env.ctx_start`.)
    pub fn uses_ctx_const(&self) -> bool {
        self.checks.iter().any(|c| {
            matches!(
                c,
                AccessCheck::CtxConst { .. } | AccessCheck::CtxIndex { .. }
            )
        }) || self
            .groups
            .iter()
            .any(|g| matches!(g.check, AccessCheck::CtxConst { .. }))
    }

    /// Is any access's index bounded by the context length ([`AccessCheck::CtxIndex`])?
    /// (Then the entry must make r2 exactly `env.ctx_end - env.ctx_start` as well.)
    pub fn uses_ctx_index(&self) -> bool {
        self.checks
            .iter()
            .any(|c| matches!(c, AccessCheck::CtxIndex { .. }))
    }

    /// The check of instruction `i` (`NotAccess` for non-memory instructions, and for every
    /// instruction of a plan with no accesses: trusted code and access-free programs carry
    /// no per-instruction table, which at 1 M instructions would be 16 MB of zeroes).
    pub fn check(&self, i: usize) -> AccessCheck {
        self.checks
            .get(i)
            .copied()
            .unwrap_or(AccessCheck::NotAccess)
    }

    /// The check group instruction `i` belongs to, if any.
    pub fn group_of(&self, i: usize) -> Option<usize> {
        self.group_of.get(i).copied().flatten().map(|g| g as usize)
    }

    /// The index of the walk whose head is instruction `i`, if any.
    pub fn walk_at_head(&self, i: usize) -> Option<usize> {
        self.walks.binary_search_by_key(&i, |w| w.head).ok()
    }

    /// The index of the walk whose back-edge is the jump at instruction `i`, if any. (Walks
    /// are disjoint loops, so sorted by head they are sorted by back-edge too.)
    pub fn walk_of_back_edge(&self, i: usize) -> Option<usize> {
        self.walks.binary_search_by_key(&i, |w| w.back_edge).ok()
    }

    /// Where the walked access at instruction `i` (base `base`, offset `off`) goes when the
    /// walk clamps into a shadow register ([`crate::walks::Walk::shadow`]): through the
    /// shadow, with the walk's step added when the access comes after `ptr += step` (the
    /// shadow is the pointer's value at the head). Otherwise through `base + off` itself.
    ///
    /// The offset cannot overflow: a walked access lies inside the 512-byte frame and the
    /// pointer's values at the head do too, so `off` and `off + step` are both within a
    /// frame's span of zero.
    pub fn walked_address(&self, i: usize, base: Reg, off: i16) -> (Reg, i16) {
        // (Trusted code has no plan: `checks` is empty.)
        if !matches!(
            self.checks.get(i),
            Some(AccessCheck::Walked | AccessCheck::Guarded)
        ) {
            return (base, off);
        }
        let k = self.walks.partition_point(|w| w.head <= i);
        let Some(w) = k.checked_sub(1).map(|k| &self.walks[k]) else {
            return (base, off);
        };
        match w.shadow {
            Some(shadow) if base == w.ptr && i <= w.back_edge => {
                let moved = if i > w.step_at { w.step as i16 } else { 0 };
                (shadow, off + moved)
            }
            _ => (base, off),
        }
    }

    /// Removes the counted walks ([`crate::walks::Counter`]), for a backend without their
    /// guard: their accesses go back to the stack block test they had.
    pub fn drop_counted_walks(&mut self) {
        let checks = &mut self.checks;
        self.walks.retain(|w| {
            if w.counter.is_none() {
                return true;
            }
            for c in &mut checks[w.head..w.back_edge] {
                if *c == AccessCheck::Guarded {
                    *c = AccessCheck::Stack;
                }
            }
            false
        });
    }

    /// The group whose check the jump at instruction `i` skips, if any.
    pub fn reentry(&self, i: usize) -> Option<usize> {
        self.reentries
            .binary_search_by_key(&i, |&(j, _)| j)
            .ok()
            .map(|k| self.reentries[k].1)
    }
}

fn access_of(op: &Op) -> Option<(Reg, i16, Size)> {
    match *op {
        Op::Load {
            base, off, size, ..
        }
        | Op::Store {
            base, off, size, ..
        }
        | Op::Atomic {
            base, off, size, ..
        } => Some((base, off, size)),
        _ => None,
    }
}

/// Classifies an access of `size` bytes at `base + off` with `base` abstractly `v`, in a
/// function with no frames above it known (the entry's view: only its own frame is proven).
pub fn classify(v: Val, off: i16, size: Size) -> AccessCheck {
    classify_in(v, off, size, 0)
}

/// [`classify`] in a function that runs with at least `above` bytes of its callers' frames
/// above its r10 on every call path ([`CallFacts::above`]): a stack access is proven inside
/// `[r10 - 512, r10 + above)`, which lies in the stack block whenever the function runs.
pub fn classify_in(v: Val, off: i16, size: Size, above: i64) -> AccessCheck {
    let (off, n) = (off as i128, size.bytes() as i128);
    let lo = v.lo as i128 + off;
    let hi = v.hi as i128 + off + n;
    match v.base {
        // The address is r10 + (offset) exactly (no wrap: the offset range is in i64 and
        // the stack block is far from both ends of the address space).
        Base::Stack if !v.is_full() && lo >= -(STACK_SIZE as i128) && hi <= above as i128 => {
            AccessCheck::None
        }
        Base::Stack => AccessCheck::Stack,
        // (addr - ctx_start) mod 2^64 = c + off exactly when c + off >= 0: the comparison
        // with the length is then the whole region test.
        Base::Ctx if v.lo == v.hi && lo >= 0 && hi <= u32::MAX as i128 => {
            AccessCheck::CtxConst { end: hi as u32 }
        }
        Base::Ctx => AccessCheck::Ctx,
        // Proven by `in_lookup_value` when inside the value, else checked.
        Base::Scalar | Base::Lookup | Base::Value => AccessCheck::Unknown,
    }
}

/// Is an access of `size` bytes at `base + off`, with `base` abstractly `v`, inside the map
/// value a tested lookup result points to (and that value writable, for a write), within its
/// first [`NULL_GUARD`] bytes? See the module docs for why the test's branch is enough.
fn in_lookup_value(v: Val, off: i16, size: Size, writes: bool, lookups: &[LookupValue]) -> bool {
    if v.base != Base::Value {
        return false;
    }
    let at = v.site;
    let Ok(k) = lookups.binary_search_by_key(&at, |l| l.at) else {
        return false;
    };
    let l = lookups[k];
    // Exact integers: a bounded interval never stands for wrapped values.
    let lo = v.lo as i128 + off as i128;
    let end = v.hi as i128 + off as i128 + size.bytes() as i128;
    (writes <= l.writable) && lo >= 0 && end <= l.value_size.min(NULL_GUARD) as i128
}

/// Is an access of `size` bytes at `base + off`, with `base` abstractly the scalar `v`,
/// inside one static region on every path (and that region writable, for a write)? The
/// interval is data-derived (constants, masks, narrow loads; never a branch condition), so
/// the proof holds on mispredicted paths too and the access needs no clamp.
fn in_static_region(v: Val, off: i16, size: Size, writes: bool, regions: &[PjMemRegion]) -> bool {
    if v.base != Base::Scalar || v.is_full() || regions.is_empty() {
        return false;
    }
    // Exact integers: a `Val` interval never stands for wrapped values (see the module
    // docs), and an address at or above 2^63 reads as negative, below every region.
    let lo = v.lo as i128 + off as i128;
    let end = v.hi as i128 + off as i128 + size.bytes() as i128;
    regions.iter().any(|r| {
        let start = r.start as i128;
        (writes <= (r.flags & PJ_REGION_WRITABLE != 0))
            && lo >= start
            && end <= start + r.len as i128
    })
}

/// Leaders of basic blocks in `[start, end)`: the first instruction, every jump target and
/// every instruction after a jump. Built from the program's target flags and branch list
/// alone, without a pass over the instructions (at 1 M instructions they come from memory,
/// not cache). An instruction after an `exit` that is no jump target is unreachable: it is
/// left inside the block the `exit` ends, which every walk over a block stops at.
fn block_starts(prog: &Program, start: usize, end: usize) -> Vec<bool> {
    let mut lead = prog.is_target[start..end].to_vec();
    lead[0] = true;
    for b in prog
        .branches_in(start, end)
        .iter()
        .filter(|b| b.kind != BranchKind::CallLocal)
    {
        let (i, target) = (b.at as usize, b.target as usize);
        if (start..end).contains(&target) {
            lead[target - start] = true;
        }
        if i + 1 < end {
            lead[i + 1 - start] = true;
        }
    }
    lead
}

/// The state before each instruction (every register [`Val::TOP`] where no path reaches).
/// One state per instruction: for tests and tools; the backends' [`plan_accesses`] keeps
/// only the states at jump targets (see [`for_each_state`]).
pub fn states(prog: &Program) -> Vec<State> {
    let mut out = vec![[Val::TOP; 11]; prog.insts.len()];
    let all: Vec<usize> = (0..prog.insts.len()).collect();
    for_each_state(prog, &all, |i, st| out[i] = *st);
    out
}

/// Runs the dataflow over every function to its fixed point and calls `visit` with each
/// reachable instruction index in `wanted` and the state before it: ascending within each
/// function, the functions callers first (`CallFacts::order`).
///
/// States are stored only where paths meet: at the function's start and at jump targets.
/// Everywhere else the state follows from the previous instruction's, because a
/// conditional branch's fall-through has that one predecessor (its state is the branch's,
/// [`narrow`]ed for the fall-through: a lookup result tested non-zero there). So a pass starts at a stored state and runs straight down through
/// conditional branches (handing the state to each target on the way) until an `exit`, a
/// `ja`, or the next jump target. Every cycle of the control-flow graph holds a backward
/// jump, and so a jump target, which is where widening applies: the iteration ends.
///
/// Pending starts are taken lowest index first. A start outside every loop span (from a
/// backward jump's target to the jump) is then taken exactly once, with its final state:
/// only a backward jump across it could bring it or anything before it back. There the
/// wanted instructions are visited during the pass itself, while it is in cache. Wanted
/// instructions inside loop spans are replayed from the stored states once the iteration
/// has left the loop. A callee starts from its call sites' arguments ([`CallFacts`]); a
/// function with nothing wanted and nothing to pass on is skipped.
pub fn for_each_state(prog: &Program, wanted: &[usize], mut visit: impl FnMut(usize, &State)) {
    debug_assert!(wanted.windows(2).all(|w| w[0] < w[1]), "ascending");
    let calls = CallFacts::new(prog);
    calls.run(prog, wanted, |_, _| {}, |_, i, st| visit(i, st));
}

/// The call graph as the dataflow uses it: bpf-to-bpf calls pass their r1–r5 into the
/// callee's entry state.
///
/// A callee's r10 is its caller's r10 − 512 (one contiguous stack block, see
/// [`crate::analysis::stack_block_size`]): a caller's `Stack + [lo, hi]` is
/// `Stack + [lo + 512, hi + 512]` to the callee. `Ctx` is the context start, the same
/// address in every function, and scalars are scalars. A callee's r1–r5 are the join over
/// its call sites of those translations; r0 and r6–r9 are unknown. eBPF has no recursion
/// (`verify::check_call_depth` refuses cycles), so processing callers before callees sees
/// every call site before the callee starts: one pass, no fixed point over functions.
///
/// Spectre: the arguments are the caller's data-derived facts at the call, which hold on
/// every path into it, mispredicted branches included; a callee is entered only by a
/// direct call. Straight-line speculation past the code before a callee (the previous
/// function's last `ret`, a cold stub's `jmp`) would bring another function's registers:
/// sandboxed code puts a barrier there (`FrameHooks::speculation_barrier`: `int3` on
/// x86-64, `dsb nsh; isb` on arm64).
pub struct CallFacts {
    /// Function indices, every caller before its callees (the entry first).
    order: Vec<usize>,
    /// Per function: the fewest frames above its own over all call paths (0 for the entry
    /// and for a function no call reaches).
    frames_above: Vec<u32>,
    /// `(call instruction, callee)`, sorted by instruction.
    sites: Vec<(usize, usize)>,
}

impl CallFacts {
    /// The call graph of `prog` (linear in the functions and calls).
    pub fn new(prog: &Program) -> Self {
        let n = prog.subprogs.len();
        if n == 1 {
            return CallFacts {
                order: vec![0],
                frames_above: vec![0],
                sites: Vec::new(),
            };
        }
        let sites: Vec<(usize, usize)> = prog
            .local_calls
            .iter()
            .map(|&at| match prog.insts[at as usize].op {
                Op::CallLocal { target } => (at as usize, prog.subprog_of(target as usize)),
                _ => unreachable!("a local call"),
            })
            .collect();
        let mut callers = vec![0u32; n];
        for &(_, c) in &sites {
            callers[c] += 1;
        }
        // Kahn's order: a function goes once all its callers have. The entry first, then
        // the other roots (functions no call reaches: compiled, never run).
        let mut ready: Vec<usize> = (0..n).rev().filter(|&k| callers[k] == 0).collect();
        let mut frames_above = vec![u32::MAX; n];
        let mut order = Vec::with_capacity(n);
        while let Some(k) = ready.pop() {
            if frames_above[k] == u32::MAX {
                frames_above[k] = 0;
            }
            order.push(k);
            let sp = &prog.subprogs[k];
            let lo = sites.partition_point(|&(at, _)| at < sp.start);
            let hi = sites.partition_point(|&(at, _)| at < sp.end);
            for &(_, c) in &sites[lo..hi] {
                frames_above[c] = frames_above[c].min(frames_above[k] + 1);
                callers[c] -= 1;
                if callers[c] == 0 {
                    ready.push(c);
                }
            }
        }
        debug_assert_eq!(order.len(), n, "the verifier refuses recursion");
        // The entry runs at the top of the block. (No call reaches it: the verifier refuses
        // a call to it even from a function no call reaches; kept 0 whatever it allows.)
        frames_above[0] = 0;
        CallFacts {
            order,
            frames_above,
            sites,
        }
    }

    /// Bytes of callers' frames above function `k`'s r10 whenever it runs: 512 per frame
    /// on the shortest call path to it. Those frames are inside the stack block (the block
    /// holds the deepest chain), so `[r10 - 512, r10 + above)` is too.
    pub fn above(&self, k: usize) -> i64 {
        self.frames_above[k] as i64 * STACK_SIZE as i64
    }

    /// The dataflow of every function in [`CallFacts::order`], calling `visit(function,
    /// instruction, state)` for the wanted instructions. `more(k, list)` appends, ascending,
    /// instructions wanted only when function `k` receives an address in r1–r5 (a `Stack`
    /// or `Ctx` base): a function without one, that is not the entry and copies no r10, can
    /// hold no address of known base, so its accesses stay `Unknown` without a run (see
    /// [`plan_accesses`]); they are listed only for the few functions that do receive one.
    /// A function that can pass an address on (the entry, a copier of r10, a receiver of
    /// one) also runs for its call sites alone; any other passes nothing known (its call
    /// sites give their callees unknown arguments, without a look).
    fn run(
        &self,
        prog: &Program,
        wanted: &[usize],
        mut more: impl FnMut(usize, &mut Vec<usize>),
        mut visit: impl FnMut(usize, usize, &State),
    ) {
        // Per function: the join of its call sites' r1–r5 so far (`None`: no site reached).
        let mut args: Vec<Option<[Val; 5]>> = vec![None; prog.subprogs.len()];
        let (mut extra, mut at, mut merged) = (Vec::new(), Vec::new(), Vec::new());
        for &k in &self.order {
            let sp = &prog.subprogs[k];
            let mut entry = entry_state(k);
            if k != 0 {
                // No reached call site: never called, the arguments are anything.
                entry[1..=5].copy_from_slice(&args[k].unwrap_or([Val::TOP; 5]));
            }
            let receives = entry[1..=5].iter().any(|v| v.base != Base::Scalar);
            let w = &wanted[slice(wanted, sp.start, sp.end)];
            extra.clear();
            if receives {
                more(k, &mut extra);
            }
            let mut s = &self.sites[slice_sites(&self.sites, sp.start, sp.end)];
            if !(k == 0 || sp.copies_r10 || receives) {
                // Nothing known flows to the callees from here.
                for &(_, c) in s {
                    join_args(&mut args[c], [Val::TOP; 5]);
                }
                s = &[];
            }
            if w.is_empty() && extra.is_empty() && s.is_empty() {
                continue;
            }
            // The wanted list with the extra instructions and the call sites merged in
            // (linear: the entry's list can be most of a large program).
            let list: &[usize] = if extra.is_empty() && s.is_empty() {
                w
            } else {
                at.clear();
                at.extend(s.iter().map(|&(i, _)| i));
                merged.clear();
                merge_into(&mut merged, w, &extra);
                std::mem::swap(&mut merged, &mut extra);
                merged.clear();
                merge_into(&mut merged, &extra, &at);
                &merged
            };
            let mut sites = s.iter().peekable();
            Dataflow::new(prog, k, entry, list).run(&mut |i, st: &State| {
                // Visits come ascending: the call sites are passed in order (one not
                // visited is unreachable and passes nothing).
                while sites.next_if(|&&(j, _)| j < i).is_some() {}
                if let Some(&(_, c)) = sites.next_if(|&&(j, _)| j == i) {
                    let mut passed = [Val::TOP; 5];
                    for (p, v) in passed.iter_mut().zip(&st[1..=5]) {
                        *p = into_callee(*v);
                    }
                    join_args(&mut args[c], passed);
                    if w.binary_search(&i).is_err() {
                        // (Extra instructions are accesses, never calls.)
                        return;
                    }
                }
                visit(k, i, st);
            });
        }
    }
}

/// Appends the ascending union of the ascending lists `a` and `b` to `out`.
fn merge_into(out: &mut Vec<usize>, a: &[usize], b: &[usize]) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        out.push(x.min(y));
        i += (x <= y) as usize;
        j += (y <= x) as usize;
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
}

/// The entries of the ascending `list` in `lo..hi`.
fn slice(list: &[usize], lo: usize, hi: usize) -> std::ops::Range<usize> {
    list.partition_point(|&w| w < lo)..list.partition_point(|&w| w < hi)
}

/// The call sites among `sites` at instructions `lo..hi`.
fn slice_sites(sites: &[(usize, usize)], lo: usize, hi: usize) -> std::ops::Range<usize> {
    sites.partition_point(|&(at, _)| at < lo)..sites.partition_point(|&(at, _)| at < hi)
}

/// Joins one call site's arguments into a callee's.
fn join_args(into: &mut Option<[Val; 5]>, passed: [Val; 5]) {
    *into = Some(match *into {
        None => passed,
        Some(old) => {
            let mut joined = old;
            for (j, p) in joined.iter_mut().zip(passed) {
                *j = j.join(p);
            }
            joined
        }
    });
}

/// A caller's value as the callee sees it: the callee's r10 is one frame (512 bytes) below
/// the caller's, so a frame offset grows by 512; the context start and scalars are the same
/// everywhere. (Exact integers: an offset range that would leave `i64` goes full.)
fn into_callee(v: Val) -> Val {
    match v.base {
        Base::Stack => Val::range(
            Base::Stack,
            v.lo as i128 + STACK_SIZE as i128,
            v.hi as i128 + STACK_SIZE as i128,
        ),
        _ => v,
    }
}

/// One function's dataflow (see [`for_each_state`]).
struct Dataflow<'p> {
    prog: &'p Program,
    start: usize,
    end: usize,
    /// The last instruction that can reach a wanted one (see [`Dataflow::new`]): nothing
    /// past it is run.
    hi: usize,
    /// Per instruction of the function: 1 + index into `states` once reached, else 0.
    slot: Vec<u32>,
    /// Entry states of the reached joins in the order first reached, each with how often it
    /// has grown and each register's bounds have moved since (low nibble `lo`, high nibble
    /// `hi`).
    states: Vec<(State, u32, [u8; 11])>,
    /// Joins to run from, one bit per instruction of the function; none below `next`.
    pending: Vec<u64>,
    next: usize,
    /// One bit per instruction of the function: set inside a loop span `[target, jump]` of
    /// some backward jump.
    in_loop: Vec<u64>,
    /// This function's wanted instructions; those before `done` are visited or unreachable.
    wanted: &'p [usize],
    done: usize,
    /// Where the replay of wanted instructions in loops stands: the state before `at`, and
    /// whether `at` is reachable from there (not past a `ja` or `exit`).
    replay_at: usize,
    replay_state: State,
    replay_live: bool,
}

impl<'p> Dataflow<'p> {
    fn new(prog: &'p Program, k: usize, entry: State, wanted: &'p [usize]) -> Self {
        let sp = &prog.subprogs[k];
        let n = sp.end - sp.start;
        let branches = prog.branches_in(sp.start, sp.end);
        let mut loops: Vec<(usize, usize)> = branches
            .iter()
            .filter(|b| b.kind != BranchKind::CallLocal && b.target <= b.at)
            .map(|b| (b.target as usize, b.at as usize))
            .collect();
        loops.sort_unstable();
        loops.dedup_by(|later, earlier| {
            let overlaps = later.0 <= earlier.1;
            if overlaps {
                earlier.1 = earlier.1.max(later.1);
            }
            overlaps
        });
        // Only states before wanted instructions are asked for, and code past the last one
        // and past every backward jump into what comes before can reach none of them (a
        // path back needs such a jump): it only feeds itself, and is not run. By position:
        // a jump that moves `hi` is seen before any later one landing in what it adds.
        let mut hi = wanted.last().map_or(sp.start, |&w| w.max(sp.start));
        for b in prog.branches_in(hi + 1, sp.end) {
            if b.kind != BranchKind::CallLocal && (b.target as usize) <= hi {
                hi = b.at as usize;
            }
        }
        // Merged, the spans are disjoint: setting their bits is linear in the function.
        let mut in_loop = vec![0u64; n.div_ceil(64)];
        for &(head, jump) in &loops {
            for i in head - sp.start..=jump - sp.start {
                in_loop[i / 64] |= 1 << (i % 64);
            }
        }
        let mut flow = Dataflow {
            prog,
            start: sp.start,
            end: sp.end,
            hi,
            slot: crate::reuse::filled(n, 0),
            // One state per join reached: the entry and jump targets, so at most one per
            // branch besides the entry. Sized up front: a state is 264 bytes, and growing
            // from one by doublings copied them all several times per function.
            states: {
                let mut v = Vec::with_capacity(branches.len() + 1);
                v.push((entry, 0, [0; 11]));
                v
            },
            pending: vec![0; n.div_ceil(64)],
            next: 0,
            in_loop,
            wanted,
            done: 0,
            replay_at: sp.start,
            replay_state: [Val::TOP; 11],
            replay_live: false,
        };
        flow.slot[0] = 1;
        flow.pending[0] = 1;
        flow
    }

    fn run(mut self, visit: &mut impl FnMut(usize, &State)) {
        while let Some(b) = self.pop() {
            let settled = !self.in_loop(b);
            if settled {
                self.replay_before(b, visit);
            }
            let mut st = self.states[self.slot[b - self.start] as usize - 1].0;
            let mut i = b;
            loop {
                if settled && self.wanted.get(self.done) == Some(&i) {
                    visit(i, &st);
                    self.done += 1;
                }
                let op = self.prog.insts[i].op;
                transfer_at(self.prog, i, &mut st);
                match op {
                    Op::Ja { target } => {
                        self.hand_over(target as usize, &st);
                        break;
                    }
                    Op::Jcond { target, .. } if !self.prog.lookup_values.is_empty() => {
                        let mut taken = st;
                        narrow(&op, &mut taken, true);
                        self.hand_over(target as usize, &taken);
                        narrow(&op, &mut st, false);
                    }
                    Op::Jcond { target, .. } => self.hand_over(target as usize, &st),
                    Op::Exit => break,
                    _ => {}
                }
                i += 1;
                if i == self.end || i > self.hi {
                    break;
                }
                if self.prog.is_target[i] {
                    self.hand_over(i, &st);
                    break;
                }
            }
        }
        self.replay_before(self.end, visit);
        crate::reuse::give_back(self.slot);
    }

    /// The lowest pending join, taken off the list.
    fn pop(&mut self) -> Option<usize> {
        let mut word = self.next / 64;
        let mut bits = self.pending.get(word)? & (u64::MAX << (self.next % 64));
        while bits == 0 {
            word += 1;
            bits = *self.pending.get(word)?;
        }
        let t = word * 64 + bits.trailing_zeros() as usize;
        self.pending[word] &= !(1 << (t % 64));
        self.next = t;
        Some(self.start + t)
    }

    /// Whether instruction `i` lies in a loop span: a later pass may still change its state.
    fn in_loop(&self, i: usize) -> bool {
        let i = i - self.start;
        self.in_loop[i / 64] & (1 << (i % 64)) != 0
    }

    /// Whether instruction `i` is a join: the function's start or a jump target (the only
    /// call target inside a function is its start).
    fn is_join(&self, i: usize) -> bool {
        i == self.start || self.prog.is_target[i]
    }

    /// Joins `st` into the entry state of `target` and queues it if that changed it.
    fn hand_over(&mut self, target: usize, st: &State) {
        if !(self.start..self.end).contains(&target) || target > self.hi {
            return;
        }
        let t = target - self.start;
        let s = self.slot[t];
        if s == 0 {
            self.states.push((*st, 0, [0; 11]));
            self.slot[t] = self.states.len() as u32;
        } else {
            let (old, grown, moves) = &mut self.states[s as usize - 1];
            // Most joins change nothing (a loop's back-edge once the head is stable, the
            // second way into a join): tested without building the joined state.
            if old.iter().zip(st).all(|(o, v)| o.covers(v)) {
                return;
            }
            *grown += 1;
            let widen = *grown > WIDEN_AFTER;
            for ((o, &v), m) in old.iter_mut().zip(st).zip(moves.iter_mut()) {
                if !o.covers(&v) {
                    *o = o.joined_counting(v, m, widen);
                }
            }
        }
        self.pending[t / 64] |= 1 << (t % 64);
        self.next = self.next.min(t);
    }

    /// Visits the wanted instructions before `limit` not visited yet, each from the stored
    /// state of its join (all final: no pass will go back before `limit`).
    fn replay_before(&mut self, limit: usize, visit: &mut impl FnMut(usize, &State)) {
        while let Some(&w) = self.wanted.get(self.done).filter(|&&w| w < limit) {
            self.done += 1;
            // The join nearest before `w`, unless none lies between the replay's place and
            // `w`.
            let mut from = w;
            while from > self.replay_at && !self.is_join(from) {
                from -= 1;
            }
            if self.is_join(from) {
                self.replay_at = from;
                let s = self.slot[from - self.start];
                self.replay_live = s != 0;
                if s != 0 {
                    self.replay_state = self.states[s as usize - 1].0;
                }
            }
            while self.replay_live && self.replay_at < w {
                let op = self.prog.insts[self.replay_at].op;
                transfer_at(self.prog, self.replay_at, &mut self.replay_state);
                if !self.prog.lookup_values.is_empty() {
                    narrow(&op, &mut self.replay_state, false);
                }
                self.replay_live = !matches!(op, Op::Ja { .. } | Op::Exit);
                self.replay_at += 1;
            }
            self.replay_at = w;
            if self.replay_live {
                visit(w, &self.replay_state);
            }
        }
    }
}

/// Lowest member offset of a check group. Clang addresses a run of bytes off a pointer
/// it advanced past their first (`r5 = r1 + 3; *(u8 *)(r5 - 3) … *(u8 *)(r5 + 4)`), so
/// groups take members below their base too. The widened test's clamp then sets the base
/// to `-lo` (not 0) under a mispredicted test, so every member's address stays in
/// `[0, hi - lo)`, below 2 KiB, in the never-mapped first page, as for groups at
/// non-negative offsets; for that a group with `lo < 0` keeps `hi <= GROUP_BELOW_END`.
/// Such groups are never re-entered ([`reentries`] candidates keep `lo >= 0`): a checked
/// copy's per-member clamps of the base would not keep that window.
pub const GROUP_BELOW: i16 = -1024;

/// Largest member end (`off + size`) of a check group reaching below its base (see
/// [`GROUP_BELOW`]): its span is then at most 2047 bytes, within every backend's short
/// immediates.
pub const GROUP_BELOW_END: i32 = 1023;

/// Whether a forward conditional jump between a group's first and last members can leave
/// it early (`first` and `last` are accesses, so only the instructions between them).
pub fn exits_early(prog: &Program, g: &Group) -> bool {
    // A group of one has nothing between.
    (g.first + 1..g.last).any(|i| matches!(prog.insts[i].op, Op::Jcond { .. }))
}

/// Whether the code after group `g` updates its base from itself (`base += 4`, say) before
/// any jump lands or the code leaves for good: the base is then carried from one loop
/// iteration to the next, and a group's clamp of the base in place puts a compare and a
/// select on that chain every iteration, where the members' own checks (each on a copy of
/// the address) stay off it. Measured on the peers bench's insertion sort (`a[j] = a[j - 1]`
/// through a pointer stepped by -4): a two-member group there made the loop ~15% slower than
/// two checks. So groups of the kinds that rest on this rule (below their base, or left
/// early) keep two members only when the base is not carried; three or more win anyway.
fn carried(prog: &Program, g: &Group) -> bool {
    // A last member that loads into the base ends the base's life (`r4 = *(u8 *)(r4 + 4)`):
    // what follows updates the loaded byte, not the base.
    if prog.insts[g.last].op.written_reg() == Some(g.base) {
        return false;
    }
    let end = prog.subprogs[prog.subprog_of(g.first)].end;
    for i in g.last + 1..end {
        if prog.is_target[i] {
            return false;
        }
        let op = prog.insts[i].op;
        match op {
            Op::Alu { op: alu, dst, .. } if dst == g.base => return alu != AluOp::Mov,
            Op::Ja { .. }
            | Op::Exit
            | Op::CallHelper { .. }
            | Op::CallReg { .. }
            | Op::CallLocal { .. } => return false,
            _ if op.written_reg() == Some(g.base) => return false,
            _ => {}
        }
    }
    false
}

/// Loads and stores that can share one check: in one extended basic block (forward
/// conditional jumps may leave it, nothing jumps into it), off one base register
/// that no instruction in between writes (calls end a group anyway), with offsets in
/// `[GROUP_BELOW, 2048)` (so the widened range's bounds suit the backends' short
/// immediates; a group below its base spans at most `[GROUP_BELOW, GROUP_BELOW_END)`), every
/// member checked against the same region (all `Ctx`/`CtxConst`, all `Stack` or all
/// `Unknown`), and only straight-line ALU and memory instructions in between (atomics keep
/// their own checks).
///
/// A backend tests `[base + lo, base + hi)` once, before the first member. If that passes,
/// every member's access passes (each is inside that range of one region, and the base is
/// unchanged), so the members run unchecked off the base clamped once (Spectre v1); a
/// jump that leaves the group early skips members it tested for nothing. If it fails,
/// nothing of the group has run yet: the backend runs a copy of instructions
/// `first..=last` with per-access checks instead (its jumps leave to where the originals
/// go), which stops exactly where the reference does (pc, address, and the stores before
/// it done), also when the reference would have left the group before the member the
/// widened test failed for.
pub fn group_accesses(prog: &Program, checks: &[AccessCheck]) -> Vec<Group> {
    form_groups(prog, checks, 2)
}

/// [`group_accesses`] keeping groups of at least `min_members`. With 1, single accesses
/// that some jump lands on are kept too: the candidates for [`reentries`].
fn form_groups(prog: &Program, checks: &[AccessCheck], min_members: usize) -> Vec<Group> {
    let mut groups = Vec::new();
    // The open group's members; copied out only for a group that is kept (most single
    // accesses are not), so forming groups allocates per kept group, not per access.
    let mut members: Vec<usize> = Vec::new();
    for sp in &prog.subprogs {
        let mut open: Option<Group> = None;
        let close =
            |open: &mut Option<Group>, members: &mut Vec<usize>, groups: &mut Vec<Group>| {
                if let Some(mut g) = open.take() {
                    let n = members.len();
                    if n >= min_members
                        && (n > 1 || prog.is_target[g.first])
                        && !(n < 3 && (g.lo < 0 || exits_early(prog, &g)) && carried(prog, &g))
                    {
                        g.members = members.clone();
                        groups.push(g);
                    }
                }
                members.clear();
            };
        for (i, &check) in checks.iter().enumerate().take(sp.end).skip(sp.start) {
            // With no group open, only an access can start one (most instructions are
            // passed on their verdict alone, without reading them).
            if open.is_none() && check == AccessCheck::NotAccess {
                continue;
            }
            // A block ends a group at a jump target; after a jump or call the group is
            // closed already (neither is straight-line).
            if prog.is_target[i] {
                close(&mut open, &mut members, &mut groups);
            }
            let op = prog.insts[i].op;
            if !stays_in_group(&op, i) {
                close(&mut open, &mut members, &mut groups);
                continue;
            }
            let class = |c: AccessCheck| match c {
                AccessCheck::CtxConst { .. } => AccessCheck::Ctx,
                c => c,
            };
            if let (Some((base, off, size)), c) = (access_of(&op), check) {
                // A load or store off another base, lowered alike in both copies (proven,
                // or checked on its own), stays out of the open group and leaves it open:
                // clang interleaves a loop's context reads with stores through a stack
                // pointer (`absorb(&a, p, n)` in the peers bench: `p[i]` read three times
                // around `a->sum` and `a->xor` stored), and a parser's reads of two headers;
                // closing there cost each run of reads its own test. See
                // `keeps_group_open`.
                if keeps_group_open(prog, i, sp.end, c, open.as_ref().map(|g| g.base)) {
                    continue;
                }
                let groupable = matches!(
                    c,
                    AccessCheck::Stack
                        | AccessCheck::Ctx
                        | AccessCheck::CtxConst { .. }
                        | AccessCheck::Unknown
                ) && (GROUP_BELOW..2048).contains(&off)
                    && base != R10
                    && matches!(op, Op::Load { .. } | Op::Store { .. });
                let end = off as i32 + size.bytes() as i32;
                // A group reaching below its base keeps its whole span in
                // `[GROUP_BELOW, GROUP_BELOW_END)`: see `GROUP_BELOW`.
                let window = |lo: i16, hi: i32| lo >= 0 || hi <= GROUP_BELOW_END;
                let fits = open.as_ref().is_some_and(|g| {
                    g.base == base
                        && class(g.check) == class(c)
                        && groupable
                        && window(g.lo.min(off), g.hi.max(end))
                });
                if fits {
                    let g = open.as_mut().expect("checked above");
                    members.push(i);
                    g.last = i;
                    g.lo = g.lo.min(off);
                    g.hi = g.hi.max(end);
                    g.check = match (g.check, c) {
                        (AccessCheck::CtxConst { end: a }, AccessCheck::CtxConst { end: b }) => {
                            AccessCheck::CtxConst { end: a.max(b) }
                        }
                        (AccessCheck::CtxConst { .. }, _) | (_, AccessCheck::CtxConst { .. }) => {
                            AccessCheck::Ctx
                        }
                        (a, _) => a,
                    };
                } else {
                    close(&mut open, &mut members, &mut groups);
                    if groupable {
                        open = Some(Group {
                            base,
                            first: i,
                            last: i,
                            lo: off,
                            hi: end,
                            members: Vec::new(),
                            check: c,
                            reentered: false,
                        });
                        members.push(i);
                    }
                }
            }
            // Writing the base ends the group (the load's own dst included: `r1 = *(r1+0)`).
            if let (Some(g), Some(w)) = (open.as_ref(), op.written_reg()) {
                if w == g.base {
                    close(&mut open, &mut members, &mut groups);
                }
            }
        }
        close(&mut open, &mut members, &mut groups);
    }
    groups
}

/// Whether access `i` (checked `check`) passes through an open check group on `open_base`
/// without ending it: a plain load or store off another base, writing neither that base nor
/// anything the group tests (a load's destination is not the base), that is lowered the same
/// on the hot path and in the group's checked copy, so that neither copy depends on the
/// group's test for it:
///
/// * proven in bounds ([`AccessCheck::None`]: no code of its own); clang interleaves a
///   loop's context reads with stores through a stack pointer (`absorb` in the peers bench);
/// * checked on its own (`Stack`, `Ctx`, `CtxConst`, `Unknown`) or re-tested branch-free
///   ([`AccessCheck::CtxIndex`]), when it stands alone between the group's members: the
///   next access off either base (before the straight line ends) is off the group's.
///   Packet parsers read two headers interleaved (`ip[…]`, `tcp[12]`, `ip[…]` in `parse`):
///   closing at the lone read split one header's run into several groups, a widened test
///   each. A run of accesses off the other base still closes the group, to form its own.
///
/// Atomics and walked or guarded accesses (their checks depend on which copy runs) end it.
fn keeps_group_open(
    prog: &Program,
    i: usize,
    end: usize,
    check: AccessCheck,
    open_base: Option<Reg>,
) -> bool {
    let Some(g) = open_base else {
        return false;
    };
    let op = prog.insts[i].op;
    let other = match op {
        Op::Load { base, .. } | Op::Store { base, .. } if base != g => base,
        _ => return false,
    };
    if op.written_reg() == Some(g) {
        return false;
    }
    match check {
        AccessCheck::None => true,
        AccessCheck::CtxIndex { .. }
        | AccessCheck::Stack
        | AccessCheck::Ctx
        | AccessCheck::CtxConst { .. }
        | AccessCheck::Unknown => stands_alone(prog, i, end, g, other),
        _ => false,
    }
}

/// Whether instruction `i` (`op`) can lie inside a check group: straight-line ALU and memory
/// instructions, and a forward conditional jump, which only leaves the group early: the
/// members after it run on its fall-through alone (no jump lands inside a group), so the
/// group is an extended basic block (see [`exits_early`]).
fn stays_in_group(op: &Op, i: usize) -> bool {
    matches!(
        op,
        Op::Alu { .. }
            | Op::MovSx { .. }
            | Op::Neg { .. }
            | Op::End { .. }
            | Op::LdImm64 { .. }
            | Op::Load { .. }
            | Op::Store { .. }
            | Op::Atomic { .. }
    ) || matches!(*op, Op::Jcond { target, .. } if target as usize > i)
}

/// How far [`stands_alone`] looks: a group's members are a few instructions apart.
const ALONE_LOOKAHEAD: usize = 32;

/// Whether the next access after `i` off `group_base` or `other` comes, on the straight
/// line from `i` (what a group may span: [`stays_in_group`], no jump target), before any off
/// `other` and before `group_base` is written: the access at `i` off `other` is alone
/// between two of the group's.
fn stands_alone(prog: &Program, i: usize, end: usize, group_base: Reg, other: Reg) -> bool {
    for j in i + 1..end.min(i + 1 + ALONE_LOOKAHEAD) {
        let op = prog.insts[j].op;
        if prog.is_target[j] || !stays_in_group(&op, j) {
            return false;
        }
        if let Op::Load { base, .. } | Op::Store { base, .. } | Op::Atomic { base, .. } = op {
            if base == group_base {
                return true;
            }
            if base == other {
                return false;
            }
        }
        if op.written_reg() == Some(group_base) {
            return false;
        }
    }
    false
}

/// The full analysis: every access's check and the check groups. `with_groups = false`
/// leaves accesses to be checked one by one.
pub fn plan_accesses(prog: &Program, with_groups: bool) -> AccessPlan {
    use crate::op_kind::{ATOMIC, LOAD, STORE};
    // A program without loads, stores or atomics has nothing to check: skip the dataflow.
    if prog
        .subprogs
        .iter()
        .all(|sp| sp.ops & (LOAD | STORE | ATOMIC) == 0)
    {
        return AccessPlan::default();
    }
    // r10 is the frame pointer in every state of every function (nothing writes it, and
    // calls leave it), so accesses through it need no dataflow: most programs' spills and
    // fills are decided here, and a function whose every access is one of them is not
    // analysed at all. Other accesses that no path reaches keep the verdict for an unknown
    // base (checked).
    //
    // Outside the entry function, a register holds an address of known base only after an
    // ALU instruction copies r10, or when a caller passes one in r1-r5 ([`CallFacts`]; the
    // context start arrives in r1 of the entry alone). Without either, every other access
    // there is `Unknown`, which is what the dataflow would find, so it is not run for them
    // (their accesses are wanted only if the dataflow finds an address passed in: `more`).
    let frame = entry_state(0)[R10 as usize];
    let calls = CallFacts::new(prog);
    // At most one per instruction; sized once rather than regrown by doublings (four or
    // five reallocations on a checked program of a hundred instructions).
    let mut accesses = Vec::with_capacity(prog.insts.len());
    let mut checks: Vec<AccessCheck> = crate::reuse::take_vec(prog.insts.len());
    // With static regions, a constant address (an ELF global, a map value) may be proven
    // in any function.
    // So may a map value through a tested lookup result.
    let statics = !prog.static_regions.is_empty() || !prog.lookup_values.is_empty();
    for (k, sp) in prog.subprogs.iter().enumerate() {
        let analysed = k == 0 || sp.copies_r10 || statics;
        let above = calls.above(k);
        checks.extend(
            prog.insts[sp.start..sp.end]
                .iter()
                .enumerate()
                .map(|(j, inst)| match access_of(&inst.op) {
                    Some((R10, off, size)) => classify_in(frame, off, size, above),
                    Some(_) => {
                        if analysed {
                            accesses.push(sp.start + j);
                        }
                        AccessCheck::Unknown
                    }
                    None => AccessCheck::NotAccess,
                }),
        );
    }
    // Walked pointers take their entry values from the same dataflow run.
    let mut walk_candidates = crate::walks::Candidates::new(prog);
    let mut wanted = walk_candidates.observation_points();
    if wanted.is_empty() {
        wanted = accesses;
    } else {
        wanted.extend(accesses);
        wanted.sort_unstable();
        wanted.dedup();
    }
    let regions = &prog.static_regions[..];
    // A function not analysed above that receives an address: its accesses, listed then.
    let more = |k: usize, list: &mut Vec<usize>| {
        let sp = &prog.subprogs[k];
        if k == 0 || sp.copies_r10 || statics {
            return;
        }
        list.extend((sp.start..sp.end).filter(
            |&i| matches!(access_of(&prog.insts[i].op), Some((base, _, _)) if base != R10),
        ));
    };
    calls.run(prog, &wanted, more, |k, i, st| {
        let op = &prog.insts[i].op;
        if let Some((base, off, size)) = access_of(op) {
            let v = st[base as usize];
            let writes = !matches!(op, Op::Load { .. });
            checks[i] = match classify_in(v, off, size, calls.above(k)) {
                AccessCheck::Unknown if in_static_region(v, off, size, writes, regions) => {
                    AccessCheck::None
                }
                AccessCheck::Unknown
                    if in_lookup_value(v, off, size, writes, &prog.lookup_values) =>
                {
                    AccessCheck::None
                }
                check => check,
            };
        }
        walk_candidates.observe(prog, i, st);
    });
    let walks = walk_candidates.prove(prog, &mut checks);
    let walks = crate::walks::counted(prog, &mut checks, walks);
    crate::indexes::bound_indexes(prog, &mut checks);
    let (groups, reentries) = if with_groups {
        // Single accesses are candidates too: as a group of one they can be re-entered,
        // otherwise they keep their own check.
        let candidates = form_groups(prog, &checks, 1);
        let mut found = reentries(prog, &candidates);
        // A group reaching below its base is never re-entered (see `GROUP_BELOW`), nor one
        // that a jump can leave early (`exits_early`): re-entry rests on the whole group
        // having run validated.
        found.retain(|&(_, k)| candidates[k].lo >= 0 && !exits_early(prog, &candidates[k]));
        // A walk's back-edge lands on its clamp.
        found.retain(|&(j, _)| walks.binary_search_by_key(&j, |w| w.back_edge).is_err());
        let mut reentered = vec![false; candidates.len()];
        for &(_, k) in &found {
            reentered[k] = true;
        }
        let mut renumber = vec![usize::MAX; candidates.len()];
        let mut groups = Vec::new();
        for (k, mut g) in candidates.into_iter().enumerate() {
            if g.members.len() > 1 || reentered[k] {
                g.reentered = reentered[k];
                renumber[k] = groups.len();
                groups.push(g);
            }
        }
        let found = found.into_iter().map(|(j, k)| (j, renumber[k])).collect();
        (groups, found)
    } else {
        (Vec::new(), Vec::new())
    };
    // No table without groups: at 1 M instructions it would be 8 MB of `None`.
    let mut group_of = if groups.is_empty() {
        Vec::new()
    } else {
        crate::reuse::filled(prog.insts.len(), None)
    };
    for (g, grp) in groups.iter().enumerate() {
        for &m in &grp.members {
            group_of[m] = Some(g as u32);
        }
    }
    // Checked copies rejoin after their group or loop, an instruction of the same function:
    // neither a group nor a loop ends its function.
    let rejoins = groups
        .iter()
        .map(|g| g.last + 1)
        .chain(walks.iter().map(|w| w.back_edge + 1));
    let mut jumped_to = Vec::new();
    for i in rejoins {
        if jumped_to.is_empty() {
            jumped_to = crate::reuse::take_vec(prog.insts.len());
            jumped_to.extend_from_slice(&prog.is_target);
        }
        jumped_to[i] = true;
    }
    AccessPlan {
        checks,
        groups,
        group_of,
        walks,
        reentries,
        jumped_to,
    }
}

/// The jumps that may skip a group's check: `(jump, group)` pairs, sorted by jump, where the
/// jump targets the group's first member and every path to the jump ran the group's members
/// validated, with the base register unwritten since.
///
/// **Why skipping is exact.** Whether an access is allowed depends only on its address,
/// size and direction and on the run's regions (context, stack block, host regions), which
/// stay fixed for the whole run. The members ran validated: the widened check passed, or the
/// checked copy checked each one (a stop ends the run). With the base unchanged, running
/// them again touches the same bytes in the same way, so every member is allowed again and
/// the reference evaluator, which checks each access, cannot stop there either.
///
/// **Why skipping is Spectre-safe.** On the widened check's path the base register was
/// clamped in place (0 under a mispredicted check); the checked copy of a re-entered group
/// clamps the base after each member's check too. So on every path that reaches a skipping
/// jump, also a mispredicted one, the base is either validated or 0.
///
/// **The analysis.** A must-dataflow over each function's blocks: one bit per candidate
/// (a group whose first member is some jump's target; at most 64 per function), meet =
/// intersection, nothing known at the function's entry. Writing a register forgets the
/// groups based on it (a call also forgets those based on r1–r5, which it clobbers); a
/// group's last member adds the group unless it writes the base itself. Each block's state
/// only shrinks, so the worklist ends after at most 64 changes per block.
pub fn reentries(prog: &Program, groups: &[Group]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for sp in &prog.subprogs {
        // Jump targets from the branch list (no pass over the instructions): `is_target`
        // marks jump and call targets, and the only call target inside a function is its
        // start, which counts only when a jump goes there too.
        let range = sp.start..sp.end;
        let start_is_jump_target = prog
            .branches_in(sp.start, sp.end)
            .iter()
            .any(|b| b.kind != BranchKind::CallLocal && b.target as usize == sp.start);
        let jump_target = |i: usize| prog.is_target[i] && (i != sp.start || start_is_jump_target);
        // Candidates of this function: (first member, group index), sorted by first.
        // Groups are sorted by first member: this function's are one slice of them.
        let lo = groups.partition_point(|g| g.first < sp.start);
        let hi = groups.partition_point(|g| g.first < sp.end);
        let cands: Vec<(usize, usize)> = (lo..hi)
            .filter(|&k| jump_target(groups[k].first))
            .map(|k| (groups[k].first, k))
            .take(64)
            .collect();
        if cands.is_empty() {
            continue;
        }
        let mut base_mask = [0u64; 11];
        // (last member, bit, base), sorted by last member (groups are disjoint).
        let mut lasts: Vec<(usize, u64, Reg)> = Vec::with_capacity(cands.len());
        for (bit, &(_, k)) in cands.iter().enumerate() {
            let g = &groups[k];
            base_mask[g.base as usize] |= 1 << bit;
            lasts.push((g.last, 1 << bit, g.base));
        }
        lasts.sort_unstable_by_key(|&(l, _, _)| l);
        let step = |st: u64, i: usize| -> u64 {
            let op = prog.insts[i].op;
            let mut st = st;
            let written = op.written_reg();
            if let Some(w) = written {
                st &= !base_mask[w as usize];
            }
            if matches!(
                op,
                Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. }
            ) {
                for mask in &base_mask[1..=5] {
                    st &= !mask;
                }
            }
            if let Ok(k) = lasts.binary_search_by_key(&i, |&(l, _, _)| l) {
                let (_, bit, base) = lasts[k];
                if written != Some(base) {
                    st |= bit;
                }
            }
            st
        };
        let lead = block_starts(prog, sp.start, sp.end);
        let all = if cands.len() == 64 {
            u64::MAX
        } else {
            (1u64 << cands.len()) - 1
        };
        // Block entry states by leader; unreached blocks keep `all` (no path constrains).
        let mut entry = vec![all; sp.end - sp.start];
        entry[0] = 0;
        let mut work: Vec<usize> = (sp.start..sp.end)
            .filter(|&i| lead[i - sp.start])
            .rev()
            .collect();
        let mut queued = lead.clone();
        // Walks the block at leader `b` from `st`, calling `at_jump(jump, target, state)`
        // and returning the successors with the state on each edge.
        let walk = |b: usize, mut st: u64, at_jump: &mut dyn FnMut(usize, usize, u64)| {
            let mut succs: [(usize, u64); 2] = [(usize::MAX, 0); 2];
            let mut i = b;
            loop {
                match prog.insts[i].op {
                    Op::Ja { target } => {
                        let target = target as usize;
                        at_jump(i, target, st);
                        succs[0] = (target, st);
                        break;
                    }
                    Op::Jcond { target, .. } => {
                        let target = target as usize;
                        at_jump(i, target, st);
                        succs[0] = (target, st);
                        succs[1] = (i + 1, st);
                        break;
                    }
                    Op::Exit => break,
                    _ => st = step(st, i),
                }
                i += 1;
                if i >= sp.end {
                    break;
                }
                if lead[i - sp.start] {
                    succs[0] = (i, st);
                    break;
                }
            }
            succs
        };
        while let Some(b) = work.pop() {
            queued[b - sp.start] = false;
            for (s, st) in walk(b, entry[b - sp.start], &mut |_, _, _| {}) {
                if s >= sp.end {
                    continue;
                }
                let new = entry[s - sp.start] & st;
                if new != entry[s - sp.start] {
                    entry[s - sp.start] = new;
                    if !queued[s - sp.start] {
                        queued[s - sp.start] = true;
                        work.push(s);
                    }
                }
            }
        }
        for b in range.clone().filter(|&i| lead[i - sp.start]) {
            walk(b, entry[b - sp.start], &mut |j, target, st| {
                if let Ok(c) = cands.binary_search_by_key(&target, |&(f, _)| f) {
                    if st & (1 << c) != 0 {
                        out.push((j, cands[c].1));
                    }
                }
            });
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode_insn as ins;

    fn plan(code: &[[u8; 8]]) -> (Program, AccessPlan) {
        let p = crate::decode(&code.concat(), &[]).unwrap();
        let a = plan_accesses(&p, true);
        (p, a)
    }

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    #[test]
    fn masked_index_into_frame_is_proven() {
        // r3 = r10 - 512 ; r2 &= 0x1f8 (r2: the context length, unknown) ; r3 += r2 ;
        // r0 = *(u64 *)(r3 + 0) ; exit
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x57, 2, 0, 0, 0x1f8),
            ins(0x0f, 3, 2, 0, 0),
            ins(0x79, 0, 3, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[4], AccessCheck::None);
        // 0x1f8 + 8 = 512: the last slot ends exactly at r10.
    }

    #[test]
    fn mask_one_too_wide_keeps_the_check() {
        // r2 &= 0x1ff: index up to 511, an 8-byte load there ends 7 bytes past r10.
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x57, 2, 0, 0, 0x1ff),
            ins(0x0f, 3, 2, 0, 0),
            ins(0x79, 0, 3, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[4], AccessCheck::Stack);
    }

    #[test]
    fn shifted_index_is_proven_and_wide_shift_is_not() {
        // r4 = *(u8 *)(r1 + 0) ; r4 &= 63 ; r4 <<= 3 ; r3 = r10 ; r3 -= 512 ; r3 += r4 ;
        // r0 = *(u64 *)(r3 + 0)
        let prog = |shift: i32| {
            plan(&[
                ins(0x71, 4, 1, 0, 0),
                ins(0x57, 4, 0, 0, 63),
                ins(0x67, 4, 0, 0, shift),
                ins(0xbf, 3, 10, 0, 0),
                ins(0x17, 3, 0, 0, 512),
                ins(0x0f, 3, 4, 0, 0),
                ins(0x79, 0, 3, 0, 0),
                EXIT,
            ])
        };
        assert_eq!(prog(3).1.checks[6], AccessCheck::None);
        assert_eq!(prog(4).1.checks[6], AccessCheck::Stack);
        // The ctx load itself is a constant-offset context access.
        assert_eq!(prog(3).1.checks[0], AccessCheck::CtxConst { end: 1 });
    }

    #[test]
    fn unknown_scalar_added_to_r10_is_checked() {
        // r3 = r10 ; r3 += r2 (the context length: unbounded) ; *(u8 *)(r3 - 1) = 0
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x0f, 3, 2, 0, 0),
            ins(0x72, 3, 0, -1, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[2], AccessCheck::Stack);
        // A loaded 64-bit value is anything.
        let (_, a) = plan(&[
            ins(0x79, 4, 1, 0, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x0f, 3, 4, 0, 0),
            ins(0x72, 3, 0, -1, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[3], AccessCheck::Stack);
    }

    #[test]
    fn wraparound_never_gives_a_bounded_range() {
        // r4 = 0x7fff_ffff_ffff_ffff (lddw) ; r4 += 0x7fff_ffff_ffff_ffff: wraps to -2, which
        // must not be read as a bounded value. r3 = r10 + r4 - 8 would be in the frame.
        let big = i64::MAX as u64;
        let lddw = |r: u8, v: u64| {
            [
                ins(0x18, r, 0, 0, v as u32 as i32),
                ins(0, 0, 0, 0, (v >> 32) as u32 as i32),
            ]
        };
        let [a0, a1] = lddw(4, big);
        let [b0, b1] = lddw(5, big);
        let (_, a) = plan(&[
            a0,
            a1,
            b0,
            b1,
            ins(0x0f, 4, 5, 0, 0), // r4 += r5 (= -2 mod 2^64)
            ins(0xbf, 3, 10, 0, 0),
            ins(0x0f, 3, 4, 0, 0),
            ins(0x71, 0, 3, -8, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[5], AccessCheck::Stack);
        // Shifting a masked value past bit 63 is not bounded either.
        let (_, a) = plan(&[
            ins(0x57, 2, 0, 0, 0xff),
            ins(0x67, 2, 0, 0, 60),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x0f, 3, 2, 0, 0),
            ins(0x71, 0, 3, -8, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[4], AccessCheck::Stack);
        // Negating the minimum, and a 32-bit add that carries out of 32 bits.
        let (_, a) = plan(&[
            ins(0xb4, 4, 0, 0, -1), // w4 = 0xffffffff
            ins(0x04, 4, 0, 0, 9),  // w4 += 9 -> 8
            ins(0xbf, 3, 10, 0, 0),
            ins(0x1f, 3, 4, 0, 0), // r3 -= r4
            ins(0x79, 0, 3, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[4], AccessCheck::Stack);
    }

    #[test]
    fn merged_provenances_are_unknown() {
        // if r2 == 0 goto A ; r3 = r10 - 8 ; goto B ; A: r3 = r1 ; B: r0 = *(u8 *)(r3 + 0)
        let (_, a) = plan(&[
            ins(0x15, 2, 0, 3, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -8),
            ins(0x05, 0, 0, 1, 0),
            ins(0xbf, 3, 1, 0, 0),
            ins(0x71, 0, 3, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[5], AccessCheck::Unknown);
        // Two stack offsets merge to their hull, still inside the frame.
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x15, 2, 0, 2, 0),
            ins(0x07, 3, 0, 0, -8),
            ins(0x05, 0, 0, 1, 0),
            ins(0x07, 3, 0, 0, -64),
            ins(0x71, 0, 3, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[5], AccessCheck::None);
    }

    #[test]
    fn loop_walking_out_of_the_frame_is_checked() {
        // r3 = r10 - 8 ; loop: *(u64 *)(r3 + 0) = 0 ; r3 -= 8 ; if r3 != r1 goto loop
        // The branch condition bounds nothing; widening makes the offset unbounded below.
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -8),
            ins(0x7a, 3, 0, 0, 0),
            ins(0x07, 3, 0, 0, -8),
            ins(0x5d, 3, 1, -3, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[2], AccessCheck::Stack);
        // A loop that bounds its pointer only by its exit test: this analysis never uses a
        // branch (facts from branches would not survive misprediction); `walks` proves it
        // for the architectural path and the back-edge clamps the pointer instead.
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -512),
            ins(0x79, 4, 3, 0, 0),
            ins(0x07, 3, 0, 0, 8),
            ins(0x5d, 3, 10, -3, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[2], AccessCheck::Walked);
        assert_eq!(a.walks.len(), 1);
    }

    #[test]
    fn calls_clobber_r1_to_r5_and_keep_r6_to_r9() {
        // r3 = r10 - 8 ; r6 = r10 - 16 ; call 1 ; *(u64 *)(r3) ; *(u64 *)(r6) ; exit
        let (_, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -8),
            ins(0xbf, 6, 10, 0, 0),
            ins(0x07, 6, 0, 0, -16),
            ins(0x85, 0, 1, 0, 3), // call local +3
            ins(0x79, 0, 3, 0, 0),
            ins(0x79, 0, 6, 0, 0),
            EXIT,
            ins(0xb7, 0, 0, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[5], AccessCheck::Unknown);
        assert_eq!(a.checks[6], AccessCheck::None);
        // The context start in r1 does not survive a call either.
        let (_, a) = plan(&[
            ins(0x85, 0, 1, 0, 2),
            ins(0x71, 0, 1, 0, 0),
            EXIT,
            ins(0xb7, 0, 0, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[1], AccessCheck::Unknown);
    }

    #[test]
    fn subprograms_have_their_own_frames() {
        // entry: r1 = r10 - 8 ; call f ; exit.  f: r0 = *(u64 *)(r1 + 0) (the caller's
        // slot, passed in: f's r10 + 504) ; r0 = *(u64 *)(r10 - 8) (own frame: proven) ;
        // r3 = r10 + 8 (caller's frame, one frame above f on every path) ;
        // r0 = *(u8 *)(r3 - 1) ; r0 = *(u8 *)(r3 + 504) (past the block's end) ; exit
        let (_, a) = plan(&[
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -8),
            ins(0x85, 0, 1, 0, 1),
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            ins(0x79, 0, 10, -8, 0),
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, 8),
            ins(0x71, 0, 3, -1, 0),
            ins(0x71, 0, 3, 504, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[4], AccessCheck::None);
        assert_eq!(a.checks[5], AccessCheck::None);
        assert_eq!(a.checks[8], AccessCheck::None);
        assert_eq!(a.checks[9], AccessCheck::Stack);
        // r1 is not the context in a callee.
        assert!(!a.uses_ctx_const() || a.checks[4] != AccessCheck::CtxConst { end: 8 });
    }

    #[test]
    fn context_offsets() {
        // r0 = *(u32 *)(r1 + 12) ; r6 = r1 ; r6 += 14 ; r0 = *(u16 *)(r6 + 2) ;
        // r6 -= 20 ; r0 = *(u8 *)(r6 + 0) (before the context: not constant-checkable)
        let (_, a) = plan(&[
            ins(0x61, 0, 1, 12, 0),
            ins(0xbf, 6, 1, 0, 0),
            ins(0x07, 6, 0, 0, 14),
            ins(0x69, 0, 6, 2, 0),
            ins(0x17, 6, 0, 0, 20),
            ins(0x71, 0, 6, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[0], AccessCheck::CtxConst { end: 16 });
        assert_eq!(a.checks[3], AccessCheck::CtxConst { end: 18 });
        assert_eq!(a.checks[5], AccessCheck::Ctx);
    }

    #[test]
    fn groups_stop_at_writes_of_the_base() {
        // r2 = *(u16 *)(r1 + 12) ; r3 = *(u8 *)(r1 + 23) ; r4 = *(u32 *)(r1 + 26) ;
        // *(u8 *)(r1 + 0) = 1 ; r5 = *(u8 *)(r1 + 1) ; r1 = *(u64 *)(r1 + 8) ;
        // r0 = *(u8 *)(r1 + 0) ; exit
        let (_, a) = plan(&[
            ins(0x69, 2, 1, 12, 0),
            ins(0x71, 3, 1, 23, 0),
            ins(0x61, 4, 1, 26, 0),
            ins(0x72, 1, 0, 0, 1),
            ins(0x71, 5, 1, 1, 0),
            ins(0x79, 1, 1, 8, 0),
            ins(0x71, 0, 1, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        let g = &a.groups[0];
        // The load that overwrites r1 is the group's last member; the store is a member.
        assert_eq!((g.first, g.last, g.lo, g.hi), (0, 5, 0, 30));
        assert_eq!(g.members, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(g.check, AccessCheck::CtxConst { end: 30 });
        assert_eq!(a.group_of[6], None);
        assert_eq!(a.checks[6], AccessCheck::Unknown);
    }

    #[test]
    fn proven_accesses_off_another_base_leave_a_group_open() {
        // Off r2 (the length: of unknown origin, so the reloaded r2 is of the same class):
        // r3 = *(u8 *)(r2 + 0) ; r6 = r2 ; r6 += 64 ; *(u64 *)(r10 - 8) = r6 (proven) ;
        // r4 = *(u8 *)(r2 + 1) ; r5 = *(u64 *)(r10 - 8) (proven) ; r5 = *(u8 *)(r2 + 2) ;
        // r2 = *(u64 *)(r10 - 8) (proven, but writes the base: ends the group) ;
        // r0 = *(u8 *)(r2 + 0) ; r0 = *(u8 *)(r2 + 1) ; exit
        let (_, a) = plan(&[
            ins(0x71, 3, 2, 0, 0),
            ins(0xbf, 6, 2, 0, 0),
            ins(0x07, 6, 0, 0, 64),
            ins(0x7b, 10, 6, -8, 0),
            ins(0x71, 4, 2, 1, 0),
            ins(0x79, 5, 10, -8, 0),
            ins(0x71, 5, 2, 2, 0),
            ins(0x79, 2, 10, -8, 0),
            ins(0x71, 0, 2, 0, 0),
            ins(0x71, 0, 2, 1, 0),
            EXIT,
        ]);
        for i in [3, 5, 7] {
            assert_eq!(a.checks[i], AccessCheck::None, "pc {i}");
        }
        assert_eq!(a.checks[8], AccessCheck::Unknown);
        assert_eq!(a.groups.len(), 2, "{:?}", a.groups);
        assert_eq!(a.groups[0].members, vec![0, 4, 6]);
        assert_eq!((a.groups[0].lo, a.groups[0].hi), (0, 3));
        assert_eq!(a.group_of(3), None);
        // The reloaded base starts a group of its own.
        assert_eq!(a.groups[1].members, vec![8, 9]);
    }

    #[test]
    fn checked_accesses_off_another_base_leave_a_group_open_too() {
        // `parse`'s headers: r3 = r1 + 14 (ip), r4 = r1 + 34 (tcp), read interleaved:
        // ip[0] ; tcp[12] ; ip[9] ; *(u8 *)(r4 + 13) = 1 ; ip[2] ; tcp[0] ; tcp[2] ; exit.
        // The tcp accesses are checked one by one while ip's group is open (they neither
        // join it nor end it); once ip's group ends (the base written) tcp's run is a group.
        let (_, a) = plan(&[
            ins(0xbf, 3, 1, 0, 0),
            ins(0x07, 3, 0, 0, 14),
            ins(0xbf, 4, 1, 0, 0),
            ins(0x07, 4, 0, 0, 34),
            ins(0x71, 0, 3, 0, 0),
            ins(0x71, 5, 4, 12, 0),
            ins(0x71, 5, 3, 9, 0),
            ins(0x72, 4, 0, 13, 1),
            ins(0x71, 5, 3, 2, 0),
            ins(0xb7, 3, 0, 0, 0),
            ins(0x71, 5, 4, 0, 0),
            ins(0x69, 5, 4, 2, 0),
            EXIT,
        ]);
        assert_eq!(a.groups.len(), 2, "{:?}", a.groups);
        assert_eq!(a.groups[0].members, vec![4, 6, 8]);
        assert_eq!((a.groups[0].lo, a.groups[0].hi), (0, 10));
        for i in [5, 7] {
            assert_eq!(a.group_of(i), None, "pc {i}");
            assert!(
                matches!(a.checks[i], AccessCheck::Ctx | AccessCheck::CtxConst { .. }),
                "pc {i}: {:?}",
                a.checks[i]
            );
        }
        assert_eq!(a.groups[1].members, vec![10, 11]);
        // A run of accesses off the other base closes the group and forms its own:
        // ip[0] ; ip[1] ; tcp[0] ; tcp[1] ; ip[2].
        let (_, a) = plan(&[
            ins(0xbf, 3, 1, 0, 0),
            ins(0xbf, 4, 1, 0, 0),
            ins(0x71, 0, 3, 0, 0),
            ins(0x71, 5, 3, 1, 0),
            ins(0x71, 5, 4, 0, 0),
            ins(0x71, 5, 4, 1, 0),
            ins(0x71, 5, 3, 2, 0),
            EXIT,
        ]);
        let members: Vec<_> = a.groups.iter().map(|g| g.members.clone()).collect();
        assert_eq!(members, vec![vec![2, 3], vec![4, 5]]);
        // An atomic off another base still ends the group.
        let (_, a) = plan(&[
            ins(0xbf, 3, 1, 0, 0),
            ins(0xbf, 4, 1, 0, 0),
            ins(0x71, 0, 3, 0, 0),
            ins(0xdb, 4, 5, 8, 0), // lock *(u64 *)(r4 + 8) += r5
            ins(0x71, 5, 3, 9, 0),
            EXIT,
        ]);
        assert!(
            a.groups.iter().all(|g| g.members.len() < 2),
            "{:?}",
            a.groups
        );
    }

    #[test]
    fn groups_take_members_below_their_base() {
        // clang's byte run: r5 = r1 + 3 ; loads off r5 at -3, -2, +4 (one group), +1023,
        // +1000 (a group above its base may end past GROUP_BELOW_END), -1 (would end the
        // window past GROUP_BELOW_END: a new group), -2, -1025 (below GROUP_BELOW) ; exit
        let (_, a) = plan(&[
            ins(0xbf, 5, 1, 0, 0),
            ins(0x07, 5, 0, 0, 3),
            ins(0x71, 6, 5, -3, 0),
            ins(0x71, 7, 5, -2, 0),
            ins(0x71, 8, 5, 4, 0),
            ins(0x71, 9, 5, 1023, 0),
            ins(0x71, 9, 5, 1000, 0),
            ins(0x71, 9, 5, -1, 0),
            ins(0x71, 9, 5, -2, 0),
            ins(0x71, 0, 5, -1025, 0),
            EXIT,
        ]);
        let spans: Vec<_> = (a.groups.iter())
            .map(|g| (g.first, g.last, g.lo, g.hi, g.check))
            .collect();
        assert_eq!(
            spans,
            vec![
                (2, 4, -3, 5, AccessCheck::CtxConst { end: 8 }),
                (5, 6, 1000, 1024, AccessCheck::CtxConst { end: 1027 }),
                (7, 8, -2, 0, AccessCheck::CtxConst { end: 3 }),
            ]
        );
        assert_eq!(a.group_of[9], None);
        assert_eq!(a.checks[9], AccessCheck::Ctx);
        for g in &a.groups {
            assert!(g.lo >= GROUP_BELOW && (g.lo >= 0 || g.hi <= GROUP_BELOW_END));
        }
    }

    #[test]
    fn groups_extend_past_forward_exits() {
        // r6 = r2 & 15 ; r6 += r1 ; r2 = *(u8 *)(r6 - 4) ; if r2 > 9 goto exit ;
        // r3 = *(u8 *)(r6 + 0) ; if r3 == 0 goto +0 (lands on the next: a target) ;
        // r4 = *(u8 *)(r6 + 8) ; r5 = *(u8 *)(r6 + 9) ; exit
        let (p, a) = plan(&[
            ins(0xbf, 6, 2, 0, 0),
            ins(0x57, 6, 0, 0, 15),
            ins(0x0f, 6, 1, 0, 0),
            ins(0x71, 2, 6, -4, 0),
            ins(0x25, 2, 0, 4, 9),
            ins(0x71, 3, 6, 0, 0),
            ins(0x15, 3, 0, 0, 0),
            ins(0x71, 4, 6, 8, 0),
            ins(0x71, 5, 6, 9, 0),
            EXIT,
        ]);
        let spans: Vec<_> = (a.groups.iter())
            .map(|g| (g.first, g.last, g.lo, g.hi, exits_early(&p, g)))
            .collect();
        assert_eq!(spans, vec![(3, 5, -4, 1, true), (7, 8, 8, 10, false)]);
    }

    #[test]
    fn two_member_groups_on_a_carried_base_are_not_formed() {
        // The peers bench's insertion sort: loop: r9 = *(u32 *)(r6 - 4) ; if r9 <= r5
        // goto out ; *(u32 *)(r6 + 0) = r9 ; r6 += -4 ; if r7 != 0 goto loop ; out: exit.
        // A third member keeps the group.
        let body = |third: bool| {
            let mut p = vec![
                ins(0xbf, 6, 10, 0, 0),
                ins(0x07, 6, 0, 0, -200),
                ins(0x61, 9, 6, -4, 0),
                ins(0xbd, 9, 5, 0, 0),
                ins(0x63, 6, 9, 0, 0),
            ];
            if third {
                p.push(ins(0x63, 6, 9, 4, 0));
            }
            p.push(ins(0x07, 6, 0, 0, -4));
            let back = 2 - (p.len() as i16 + 1);
            p.push(ins(0x55, 7, 0, back, 0));
            p.push(EXIT);
            let out = p.len() - 1;
            p[3] = ins(0xbd, 9, 5, (out - 4) as i16, 0);
            p
        };
        let (_, a) = plan(&body(false));
        assert!(a.groups.is_empty(), "{:?}", a.groups);
        let (prog, a) = plan(&body(true));
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert!(carried(&prog, &a.groups[0]) && exits_early(&prog, &a.groups[0]));
        assert_eq!(a.groups[0].members, vec![2, 4, 5]);
        // A last member loading into the base ends it: `r6 += -4` then updates the load.
        let mut p = body(true);
        p[5] = ins(0x61, 6, 6, 4, 0);
        let (prog, a) = plan(&p);
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert!(!carried(&prog, &a.groups[0]));
    }

    #[test]
    fn a_group_left_early_is_not_reentered() {
        // The header loop with `if r2 > 9 goto exit` between its two loads.
        let mut p = header_loop(&[]);
        p.insert(3, ins(0x25, 2, 0, 5, 9));
        let back = p.len() - 2;
        p[back] = ins(0xa5, 6, 0, -(back as i16 + 1 - 2), 100);
        let (prog, a) = plan(&p);
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert!(exits_early(&prog, &a.groups[0]));
        assert!(!a.groups[0].reentered);
        assert!(a.reentries.is_empty(), "{:?}", a.reentries);
    }

    #[test]
    fn a_group_below_its_base_is_not_reentered() {
        // The header loop with its loads at -12 and -1 off r1 + 16.
        let mut p = vec![ins(0x07, 1, 0, 0, 16)];
        p.extend(header_loop(&[]).into_iter().map(|i| match i[0] {
            0x69 | 0x71 => {
                let mut i = i;
                let off = i16::from_le_bytes([i[2], i[3]]) - 24;
                i[2..4].copy_from_slice(&off.to_le_bytes());
                i
            }
            _ => i,
        }));
        let (_, a) = plan(&p);
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert_eq!((a.groups[0].lo, a.groups[0].hi), (-12, 0));
        assert!(!a.groups[0].reentered);
        assert!(a.reentries.is_empty(), "{:?}", a.reentries);
    }

    #[test]
    fn groups_end_at_calls_and_blocks() {
        // r2 = *(u8 *)(r6 + 0) ; if r2 == 0 goto +0 ; r3 = *(u8 *)(r6 + 1) ; call 1 (helper)
        // ; r3 = *(u8 *)(r6 + 2) ; r3 = *(u8 *)(r6 + 3) ; exit
        let code = [
            ins(0x71, 2, 6, 0, 0),
            ins(0x15, 2, 0, 0, 0),
            ins(0x71, 3, 6, 1, 0),
            ins(0x85, 0, 0, 0, 1),
            ins(0x71, 3, 6, 2, 0),
            ins(0x71, 3, 6, 3, 0),
            EXIT,
        ]
        .concat();
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        let p = crate::decode(&code, &helpers).unwrap();
        let a = plan_accesses(&p, true);
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert_eq!(a.groups[0].members, vec![4, 5]);
        assert_eq!(a.groups[0].check, AccessCheck::Unknown);
    }

    #[test]
    fn widening_terminates_on_counting_loops() {
        // r3 = 0 ; loop: r3 += 1 ; r4 = r3 ; r4 *= 3 ; if r3 < 1000000 goto loop ; exit
        let (_, a) = plan(&[
            ins(0xb7, 3, 0, 0, 0),
            ins(0x07, 3, 0, 0, 1),
            ins(0xbf, 4, 3, 0, 0),
            ins(0x27, 4, 0, 0, 3),
            ins(0xa5, 3, 0, -4, 1_000_000),
            EXIT,
        ]);
        assert!(a.groups.is_empty());
        let p = crate::decode(
            &[
                ins(0xb7, 3, 0, 0, 0),
                ins(0x07, 3, 0, 0, 1),
                ins(0xa5, 3, 0, -2, 1_000_000),
                EXIT,
            ]
            .concat(),
            &[],
        )
        .unwrap();
        // Without branch facts the counter may wrap: after widening it is every value.
        let st = states(&p);
        assert_eq!(st[1][3], Val::TOP);
    }

    #[test]
    fn a_counter_widens_on_its_second_move_and_a_pointer_set_once_stays_exact() {
        // r0 = 0 ; r1 = r10 - 16 ; r2 = r10 - 16
        // loop: *(u64 *)(r1 + 0) = 0 ; r1 = r2 ; r2 = r10 - 8 ; r0 += 1 ;
        //       if r0 < 100 goto loop
        // r1 and r2 each move once (to `r10 + [-16, -8]`), so the store is proven; the
        // counter widens on its second move (and then, with nothing to say it cannot wrap,
        // is every value), which takes the loop's head three joins to settle.
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -16),
            ins(0xbf, 2, 1, 0, 0),
            ins(0x7a, 1, 0, 0, 0),
            ins(0xbf, 1, 2, 0, 0),
            ins(0xbf, 2, 10, 0, 0),
            ins(0x07, 2, 0, 0, -8),
            ins(0x07, 0, 0, 0, 1),
            ins(0xa5, 0, 0, -6, 100),
            EXIT,
        ];
        let (p, a) = plan(&code);
        assert_eq!(a.checks[4], AccessCheck::None);
        let st = states(&p);
        assert_eq!(
            (st[4][1].base, st[4][1].lo, st[4][1].hi),
            (Base::Stack, -16, -8)
        );
        assert_eq!(
            (st[4][2].base, st[4][2].lo, st[4][2].hi),
            (Base::Stack, -16, -8)
        );
        assert_eq!(st[4][0], Val::TOP);
        // A bound that moves twice widens at once, though the state grew only twice:
        // r1 = r10 - 24 ; r2 = r10 - 16 ; loop: the same. r1 takes r10 - 24, then - 16, then
        // - 8, so its upper bound moves twice and goes to the top.
        let (p, a) = plan(&[
            ins(0xb7, 0, 0, 0, 0),
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -24),
            ins(0xbf, 2, 10, 0, 0),
            ins(0x07, 2, 0, 0, -16),
            ins(0x7a, 1, 0, 0, 0),
            ins(0xbf, 1, 2, 0, 0),
            ins(0xbf, 2, 10, 0, 0),
            ins(0x07, 2, 0, 0, -8),
            ins(0x07, 0, 0, 0, 1),
            ins(0xa5, 0, 0, -6, 100),
            EXIT,
        ]);
        assert_eq!(a.checks[5], AccessCheck::Stack);
        let st = states(&p);
        assert_eq!(
            (st[5][1].base, st[5][1].lo, st[5][1].hi),
            (Base::Stack, -24, i64::MAX)
        );
    }

    #[test]
    fn replayed_states_match_the_stored_ones() {
        // A loop, a merge, a call and an unreachable block: plan_accesses (replay from block
        // entries) and states (one state per instruction) must classify alike.
        let (p, a) = plan(&[
            ins(0xbf, 3, 10, 0, 0),
            ins(0x07, 3, 0, 0, -64),
            ins(0x15, 2, 0, 1, 0),
            ins(0x07, 3, 0, 0, 8),
            ins(0x79, 4, 3, 0, 0),
            ins(0x07, 3, 0, 0, 8),
            ins(0x85, 0, 1, 0, 5),
            ins(0x79, 4, 1, 8, 0),
            ins(0xa5, 4, 0, -5, 9),
            EXIT,
            ins(0x71, 0, 1, 0, 0), // unreachable
            EXIT,
            ins(0x79, 0, 10, -8, 0),
            EXIT,
        ]);
        let st = states(&p);
        for (i, inst) in p.insts.iter().enumerate() {
            if let Some((base, off, size)) = access_of(&inst.op) {
                assert_eq!(
                    a.checks[i],
                    classify(st[i][base as usize], off, size),
                    "inst {i}"
                );
            }
        }
        assert_eq!(a.checks[10], AccessCheck::Unknown);
        assert_eq!(a.checks[12], AccessCheck::None);
    }

    /// A random single-function program: moves, copies of r10, ALU with immediates and
    /// registers, narrow and wide loads, and jumps anywhere (`loops`) or only forward.
    fn random_program(seed: &mut u64, loops: bool) -> Program {
        let mut rnd = |n: u64| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed % n
        };
        let n = 8 + rnd(40) as usize;
        let mut code = Vec::with_capacity(n);
        for i in 0..n - 1 {
            let (d, s) = (rnd(10) as u8, rnd(11) as u8);
            let small = rnd(64) as i32 - 16;
            let target = if loops {
                rnd(n as u64) as i64
            } else {
                (i + 1 + rnd((n - 1 - i) as u64) as usize) as i64
            };
            let off = (target - i as i64 - 1) as i16;
            code.push(match rnd(12) {
                0 => ins(0xb7, d, 0, 0, small),         // r_d = imm
                1 => ins(0xbf, d, 10, 0, 0),            // r_d = r10
                2 => ins(0x07, d, 0, 0, small * 8),     // r_d += imm
                3 => ins(0x57, d, 0, 0, 0xff),          // r_d &= 0xff
                4 => ins(0x0f, d, s, 0, 0),             // r_d += r_s
                5 => ins(0x71, d, s, small as i16, 0),  // r_d = *(u8 *)(r_s + off)
                6 => ins(0x79, d, s, 0, 0),             // r_d = *(u64 *)(r_s + 0)
                7 => ins(0x67, d, 0, 0, rnd(8) as i32), // r_d <<= k
                8 => ins(0xb4, d, 0, 0, small),         // w_d = imm
                9 => ins(0x15, d, 0, off, small),       // if r_d == imm goto target
                10 => ins(0x05, 0, 0, off, 0),          // goto target
                _ => ins(0x1f, d, s, 0, 0),             // r_d -= r_s
            });
        }
        code.push(EXIT);
        crate::decode(&code.concat(), &[]).unwrap()
    }

    /// Instructions some path from the start reaches (conditions ignored, as the dataflow
    /// ignores them), and each one's successors.
    fn reachable(p: &Program) -> (Vec<bool>, Vec<Vec<usize>>) {
        let succs: Vec<Vec<usize>> = p
            .insts
            .iter()
            .enumerate()
            .map(|(i, inst)| match inst.op {
                Op::Ja { target } => vec![target as usize],
                Op::Jcond { target, .. } => vec![i + 1, target as usize],
                Op::Exit => vec![],
                _ => vec![i + 1],
            })
            .collect();
        let mut seen = vec![false; p.insts.len()];
        let mut work = vec![0];
        while let Some(i) = work.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                work.extend(&succs[i]);
            }
        }
        (seen, succs)
    }

    /// 400 random programs from `seed` (printed), each with its reachable instructions and
    /// successors.
    fn random_programs(
        mut seed: u64,
        loops: bool,
    ) -> impl Iterator<Item = (Program, Vec<bool>, Vec<Vec<usize>>)> {
        println!("seed: {seed:#x}");
        (0..400).map(move |_| {
            let p = random_program(&mut seed, loops);
            let (seen, succs) = reachable(&p);
            (p, seen, succs)
        })
    }

    #[test]
    fn states_are_the_exact_join_over_paths_without_loops() {
        // Without a backward jump nothing is widened: the state before each reachable
        // instruction is the join over every path to it, which one pass in order over all
        // instructions (a state at each) computes directly.
        for (p, seen, succs) in random_programs(0x5eed_a11c, false) {
            let mut naive: Vec<Option<State>> = vec![None; p.insts.len()];
            naive[0] = Some(entry_state(0));
            for i in 0..p.insts.len() {
                let Some(mut st) = naive[i] else { continue };
                transfer(&mut st, &p.insts[i].op);
                for &s in &succs[i] {
                    naive[s] = Some(match naive[s] {
                        None => st,
                        Some(old) => std::array::from_fn(|r| old[r].join(st[r])),
                    });
                }
            }
            let st = states(&p);
            for i in 0..p.insts.len() {
                assert_eq!(naive[i].is_some(), seen[i]);
                if let Some(expected) = naive[i] {
                    assert_eq!(st[i], expected, "inst {i} of {:?}", p.insts);
                }
            }
        }
    }

    #[test]
    fn states_are_a_fixed_point_with_loops() {
        // Soundness whatever the visiting order and widening: every reachable instruction's
        // state, carried through it, is covered by each successor's state, and the start's
        // covers the entry state. With that, induction over any run shows every concrete
        // value inside its abstract one.
        for (p, seen, succs) in random_programs(0x5eed_100b, true) {
            let st = states(&p);
            let covers = |a: &State, b: &State| a.iter().zip(b).all(|(x, y)| x.covers(y));
            assert!(covers(&st[0], &entry_state(0)));
            for i in (0..p.insts.len()).filter(|&i| seen[i]) {
                let mut after = st[i];
                transfer(&mut after, &p.insts[i].op);
                for &s in &succs[i] {
                    assert!(covers(&st[s], &after), "edge {i} -> {s} of {:?}", p.insts);
                }
            }
        }
    }

    #[test]
    fn a_few_wanted_instructions_get_the_states_of_all_wanted() {
        // The run stops past the last wanted instruction and the backward jumps into what
        // comes before it: what it leaves out must change no wanted state.
        let mut pick = 0x5eed_c0deu64;
        for (p, seen, _) in random_programs(0x5eed_0c07, true) {
            let all = states(&p);
            pick ^= pick << 13;
            pick ^= pick >> 7;
            pick ^= pick << 17;
            let wanted: Vec<usize> = (0..p.insts.len())
                .filter(|&i| (pick >> (i % 64)) & 1 != 0 && i < p.insts.len() / 2)
                .collect();
            let mut got = Vec::new();
            for_each_state(&p, &wanted, |i, st| got.push((i, *st)));
            let expected: Vec<(usize, State)> = wanted
                .iter()
                .filter(|&&i| seen[i])
                .map(|&i| (i, all[i]))
                .collect();
            assert_eq!(got, expected, "wanted {wanted:?} of {:?}", p.insts);
        }
    }

    #[test]
    fn callees_are_analysed_only_when_they_copy_r10() {
        // Function 1 gets r1 from its caller (a scalar: checked either way) and never copies
        // r10: not analysed. Function 2 builds a frame pointer from r10: analysed, and its
        // access is proven.
        let (p, a) = plan(&[
            ins(0xb7, 1, 0, 0, 0), // r1 = 0: no address passed in
            ins(0x85, 0, 1, 0, 2), // call function 1
            ins(0x85, 0, 1, 0, 3), // call function 2
            EXIT,
            ins(0x71, 0, 1, 0, 0), // function 1: r0 = *(u8 *)(r1 + 0)
            EXIT,
            ins(0xbf, 2, 10, 0, 0), // function 2: r2 = r10
            ins(0x07, 2, 0, 0, -8),
            ins(0x79, 0, 2, 0, 0),
            ins(0x71, 3, 1, 0, 0),
            EXIT,
        ]);
        let copies: Vec<bool> = p.subprogs.iter().map(|sp| sp.copies_r10).collect();
        assert_eq!(copies, [false, false, true]);
        assert_eq!(a.checks[4], AccessCheck::Unknown);
        assert_eq!(a.checks[8], AccessCheck::None);
        assert_eq!(a.checks[9], AccessCheck::Unknown);
    }

    #[test]
    fn frame_accesses_are_decided_without_the_dataflow() {
        // Function 1 only spills and fills through r10 (one in its frame, one above it, in
        // its caller's: proven too, see `CallFacts::above`; past the block's end checked):
        // it is not analysed, yet its verdicts are those of the frame pointer's state.
        // An unreachable r10 access gets the same verdict: it never runs.
        let (p, a) = plan(&[
            ins(0x71, 0, 1, 0, 0), // ctx byte: the dataflow decides it
            ins(0x85, 0, 1, 0, 1), // call function 1
            EXIT,
            ins(0x7b, 10, 1, -8, 0),
            ins(0x79, 0, 10, 0, 0),
            ins(0x79, 0, 10, 512, 0),
            EXIT,
            ins(0x79, 0, 10, -16, 0), // unreachable
            EXIT,
        ]);
        assert_eq!(a.checks[0], AccessCheck::CtxConst { end: 1 });
        assert_eq!(a.checks[3], AccessCheck::None);
        assert_eq!(a.checks[4], AccessCheck::None);
        assert_eq!(a.checks[5], AccessCheck::Stack);
        assert_eq!(a.checks[7], AccessCheck::None);
        let mut visited = Vec::new();
        for_each_state(&p, &[0, 4], |i, _| visited.push(i));
        assert_eq!(visited, [0, 4], "function 1 is analysed when asked for");
        let mut visited = Vec::new();
        for_each_state(&p, &[0], |i, _| visited.push(i));
        assert_eq!(visited, [0]);
    }

    #[test]
    fn transfer_functions_are_sound_on_samples() {
        // Concrete check: for random operand values inside random intervals, the concrete
        // result lies in the abstract one (or the abstract result is full).
        let mut seed = 0x5eed_1234_u64;
        println!("transfer sample seed: {seed:#x}");
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let ops = [
            AluOp::Add,
            AluOp::Sub,
            AluOp::Mul,
            AluOp::Div,
            AluOp::Mod,
            AluOp::Or,
            AluOp::And,
            AluOp::Xor,
            AluOp::Lsh,
            AluOp::Rsh,
            AluOp::Arsh,
        ];
        let pick = |r: u64| -> i64 {
            match r % 4 {
                0 => (r >> 8) as i64 % 300 - 20,
                1 => (r >> 8) as i64,
                2 => ((r >> 8) % 70) as i64,
                _ => (r >> 8) as u32 as i64,
            }
        };
        for _ in 0..200_000 {
            let op = ops[(rnd() % ops.len() as u64) as usize];
            let (mut a, mut b) = (pick(rnd()), pick(rnd()));
            if a > b {
                std::mem::swap(&mut a, &mut b);
            }
            let (mut c, mut d) = (pick(rnd()), pick(rnd()));
            if c > d {
                std::mem::swap(&mut c, &mut d);
            }
            let x = a
                .wrapping_add((rnd() % ((b.wrapping_sub(a)) as u64).wrapping_add(1).max(1)) as i64);
            let y = c
                .wrapping_add((rnd() % ((d.wrapping_sub(c)) as u64).wrapping_add(1).max(1)) as i64);
            if x < a || x > b || y < c || y > d {
                continue;
            }
            let dv = Val::scalar(a as i128, b as i128);
            let sv = Val::scalar(c as i128, d as i128);
            let (xu, yu) = (x as u64, y as u64);
            let r64 = match op {
                AluOp::Add => xu.wrapping_add(yu),
                AluOp::Sub => xu.wrapping_sub(yu),
                AluOp::Mul => xu.wrapping_mul(yu),
                AluOp::Div => xu.checked_div(yu).unwrap_or(0),
                AluOp::Mod => xu.checked_rem(yu).unwrap_or(xu),
                AluOp::Or => xu | yu,
                AluOp::And => xu & yu,
                AluOp::Xor => xu ^ yu,
                AluOp::Lsh => xu << (yu & 63),
                AluOp::Rsh => xu >> (yu & 63),
                _ => ((xu as i64) >> (yu & 63)) as u64,
            };
            let v = alu64(op, dv, sv);
            assert!(
                v.lo <= r64 as i64 && r64 as i64 <= v.hi,
                "{op:?} [{a},{b}] [{c},{d}] x={x} y={y} -> {} not in {v:?}",
                r64 as i64
            );
            let (x32, y32) = (xu as u32, yu as u32);
            let r32 = match op {
                AluOp::Add => x32.wrapping_add(y32),
                AluOp::Sub => x32.wrapping_sub(y32),
                AluOp::Mul => x32.wrapping_mul(y32),
                AluOp::Div => x32.checked_div(y32).unwrap_or(0),
                AluOp::Mod => x32.checked_rem(y32).unwrap_or(x32),
                AluOp::Or => x32 | y32,
                AluOp::And => x32 & y32,
                AluOp::Xor => x32 ^ y32,
                AluOp::Lsh => x32 << (y32 & 31),
                AluOp::Rsh => x32 >> (y32 & 31),
                _ => ((x32 as i32) >> (y32 & 31)) as u32,
            } as i64;
            let v = alu32(op, dv, sv);
            assert!(
                v.lo <= r32 && r32 <= v.hi,
                "32-bit {op:?} [{a},{b}] [{c},{d}] x={x} y={y} -> {r32} not in {v:?}"
            );
        }
    }

    /// The bench's header-parse loop: five context loads at constant offsets, re-run by the
    /// back-edge with r1 unchanged.
    fn header_loop(extra_in_body: &[[u8; 8]]) -> Vec<[u8; 8]> {
        let mut p = vec![
            ins(0xb7, 0, 0, 0, 0),  // 0: r0 = 0
            ins(0xb7, 6, 0, 0, 0),  // 1: r6 = 0
            ins(0x69, 2, 1, 12, 0), // 2: loop: r2 = *(u16 *)(r1 + 12)
            ins(0x71, 3, 1, 23, 0), // 3
            ins(0x0f, 0, 2, 0, 0),  // 4: r0 += r2
            ins(0x0f, 0, 3, 0, 0),  // 5: r0 += r3
        ];
        p.extend_from_slice(extra_in_body);
        p.push(ins(0x07, 6, 0, 0, 1)); // r6 += 1
        let back = -(p.len() as i16 + 1 - 2);
        p.push(ins(0xa5, 6, 0, back, 100)); // if r6 < 100 goto loop
        p.push(EXIT);
        p
    }

    #[test]
    fn loop_invariant_group_is_reentered_by_its_back_edge() {
        let (_, a) = plan(&header_loop(&[]));
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert!(a.groups[0].reentered);
        assert_eq!(a.reentries, vec![(7, 0)]);
        assert_eq!(a.reentry(7), Some(0));
        assert_eq!(a.reentry(6), None);
    }

    #[test]
    fn writing_the_base_in_the_loop_keeps_the_check() {
        // r1 += 0 still writes r1: the next iteration's accesses may go elsewhere.
        let (_, a) = plan(&header_loop(&[ins(0x07, 1, 0, 0, 0)]));
        assert!(a.reentries.is_empty(), "{:?}", a.reentries);
        assert!(!a.groups[0].reentered);
        // A copy of the base written does not matter.
        let (_, a) = plan(&header_loop(&[ins(0xbf, 7, 1, 0, 0)]));
        assert_eq!(a.reentries.len(), 1);
    }

    #[test]
    fn calls_forget_groups_based_on_argument_registers() {
        let helpers = [packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }];
        let call = ins(0x85, 0, 0, 0, 1);
        let p = crate::decode(&header_loop(&[call]).concat(), &helpers).unwrap();
        assert!(plan_accesses(&p, true).reentries.is_empty());
        // The same loop on r6 (preserved across calls) keeps its reentry.
        let mut code = header_loop(&[call]);
        code.insert(0, ins(0xbf, 7, 1, 0, 0)); // r7 = r1, then loads off r7
        for (k, insn) in code.iter_mut().enumerate() {
            if k == 3 || k == 4 {
                insn[1] = (insn[1] & 0x0f) | 7 << 4;
            }
        }
        let p = crate::decode(&code.concat(), &helpers).unwrap();
        let a = plan_accesses(&p, true);
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert_eq!(a.groups[0].base, 7);
        assert_eq!(a.reentries.len(), 1, "{:?}", a);
    }

    #[test]
    fn only_jumps_after_the_group_ran_skip_its_check() {
        // 0: r6 = 0 ; 1: if r2 == 0 goto 3 (into the loop head, group not yet run)
        // 2: r6 = 5 ; 3: loop: r3 = *(u8 *)(r1 + 4) ; 4: r0 = r3 ; 5: r6 += 1
        // 6: if r6 < 9 goto 3 ; 7: exit
        let (_, a) = plan(&[
            ins(0xb7, 6, 0, 0, 0),
            ins(0x15, 2, 0, 1, 0),
            ins(0xb7, 6, 0, 0, 5),
            ins(0x71, 3, 1, 4, 0),
            ins(0xbf, 0, 3, 0, 0),
            ins(0x07, 6, 0, 0, 1),
            ins(0xa5, 6, 0, -4, 9),
            EXIT,
        ]);
        // A single access becomes a group of one because the back-edge re-enters it.
        assert_eq!(a.groups.len(), 1, "{:?}", a.groups);
        assert_eq!(a.groups[0].members, vec![3]);
        assert_eq!(a.reentries, vec![(6, 0)]);
    }

    #[test]
    fn a_member_overwriting_the_base_is_not_reentered() {
        // loop: r2 = *(u8 *)(r1 + 0) ; r1 = *(u64 *)(r1 + 8) ; if r2 != 0 goto loop
        let (_, a) = plan(&[
            ins(0x71, 2, 1, 0, 0),
            ins(0x79, 1, 1, 8, 0),
            ins(0x55, 2, 0, -3, 0),
            EXIT,
        ]);
        assert!(a.reentries.is_empty(), "{:?}", a.reentries);
    }

    #[test]
    fn a_path_around_the_group_blocks_reentry() {
        // 0: r6 = 0 ; 1: loop: if r6 == 3 goto 3 ; 2: r3 = *(u8 *)(r1 + 4) (skipped on
        // one path) ; 3: r6 += 1 ; 4: if r6 < 9 goto 1 ; 5: exit. The group's first member
        // is not a jump target here, and the back-edge target is no member at all.
        let (_, a) = plan(&[
            ins(0xb7, 6, 0, 0, 0),
            ins(0x15, 6, 0, 1, 3),
            ins(0x71, 3, 1, 4, 0),
            ins(0x07, 6, 0, 0, 1),
            ins(0xa5, 6, 0, -4, 9),
            EXIT,
        ]);
        assert!(a.reentries.is_empty(), "{:?}", a.reentries);
        // Same shape, but the jump over the access lands on the access's own block head:
        // 0: r6 = 0 ; 1: loop: r3 = *(u8 *)(r1 + 4) ; 2: if r6 == 3 goto 4 ; 3: r6 += 2 ;
        // 4: r6 += 1 ; 5: if r6 < 9 goto 1 ; 6: exit. Both paths ran the access.
        let (_, a) = plan(&[
            ins(0xb7, 6, 0, 0, 0),
            ins(0x71, 3, 1, 4, 0),
            ins(0x15, 6, 0, 1, 3),
            ins(0x07, 6, 0, 0, 2),
            ins(0x07, 6, 0, 0, 1),
            ins(0xa5, 6, 0, -5, 9),
            EXIT,
        ]);
        assert_eq!(a.reentries, vec![(5, 0)]);
    }

    // Call facts: a callee starts from its call sites' r1-r5.

    /// `call` of the function `imm` instructions after the next one.
    fn call(imm: i32) -> [u8; 8] {
        ins(0x85, 0, 1, 0, imm)
    }

    #[test]
    fn callee_reads_its_callers_slot_through_r1() {
        // 0: r1 = r10 ; 1: r1 += -8 ; 2: call f ; 3: r0 = 0 ; 4: exit
        // f (5): r0 = *(u64 *)(r1 + 0) ; *(u32 *)(r1 + 4) = 0 ; exit
        let (p, a) = plan(&[
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -8),
            call(2),
            ins(0xb7, 0, 0, 0, 0),
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            ins(0x62, 1, 0, 4, 0),
            EXIT,
        ]);
        // r1 is the callee's r10 + 504: the caller's slot at -8, inside the block whenever
        // f runs (one frame above it).
        assert_eq!(CallFacts::new(&p).above(1), 512);
        assert_eq!(a.checks[5], AccessCheck::None);
        assert_eq!(a.checks[6], AccessCheck::None);
        let st = states(&p);
        assert_eq!(
            st[5][1],
            Val {
                base: Base::Stack,
                site: 0,
                lo: 504,
                hi: 504
            }
        );
    }

    #[test]
    fn callee_indexing_past_the_block_is_not_proven() {
        // r1 = r10 (the callee's r10 + 512: the block's end) ; call f
        // f: *(u8 *)(r1 + 0) past the end; *(u64 *)(r1 - 1032) below the callee's frame;
        //    *(u64 *)(r1 - 8) the caller's last slot (proven).
        let (_, a) = plan(&[
            ins(0xbf, 1, 10, 0, 0),
            call(2),
            ins(0xb7, 0, 0, 0, 0),
            EXIT,
            ins(0x71, 0, 1, 0, 0),
            ins(0x79, 0, 1, -1032, 0),
            ins(0x79, 0, 1, -8, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[4], AccessCheck::Stack);
        assert_eq!(a.checks[5], AccessCheck::Stack);
        assert_eq!(a.checks[6], AccessCheck::None);
    }

    #[test]
    fn two_call_sites_with_different_bases_prove_nothing() {
        // 0: r6 = r1 (ctx) ; 1: r1 = r10 ; 2: r1 += -8 ; 3: call f ; 4: r1 = r6 ; 5: call f ;
        // 6: r0 = 0 ; 7: exit ; f (8): r0 = *(u64 *)(r1 + 0) ; exit
        let (p, a) = plan(&[
            ins(0xbf, 6, 1, 0, 0),
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -8),
            call(4),
            ins(0xbf, 1, 6, 0, 0),
            call(2),
            ins(0xb7, 0, 0, 0, 0),
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[8], AccessCheck::Unknown);
        assert_eq!(states(&p)[8][1], Val::TOP);
        // Two frame offsets of one base join to their hull: still proven.
        let (_, a) = plan(&[
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -8),
            call(4),
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -16),
            call(1),
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[7], AccessCheck::None);
    }

    #[test]
    fn context_passed_to_a_callee_keeps_ctx_checks() {
        // r1 (the context start) passed as is, and with an unknown offset in r2.
        // f: *(u32 *)(r1 + 4) ; *(u8 *)(r2 + 0)
        let (_, a) = plan(&[
            ins(0xbf, 2, 1, 0, 0),
            ins(0x79, 3, 1, 0, 0),
            ins(0x0f, 2, 3, 0, 0),
            call(1),
            EXIT,
            ins(0x61, 0, 1, 4, 0),
            ins(0x71, 0, 2, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[5], AccessCheck::CtxConst { end: 8 });
        assert_eq!(a.checks[6], AccessCheck::Ctx);
        // The entry must then make r1 exactly the context start.
        assert!(a.uses_ctx_const());
    }

    #[test]
    fn facts_pass_down_a_chain_and_frames_above_take_the_shortest_path() {
        // entry: r1 = r10 - 8 ; call f ; call g ; exit
        // f: call g ; exit   (g at depth 2 through f, depth 1 directly)
        // g: r0 = *(u64 *)(r1 + 0)
        let (p, a) = plan(&[
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -8),
            call(2), // f at 5
            call(3), // g at 7
            EXIT,
            call(1), // f: g
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            EXIT,
        ]);
        let calls = CallFacts::new(&p);
        assert_eq!((calls.above(1), calls.above(2)), (512, 512));
        // From the entry r1 is g's r10 + 504; through f it is g's r10 + 1016; r1 after the
        // first call is unknown anyway: g's r1 joins to top.
        assert_eq!(a.checks[7], AccessCheck::Unknown);
        // Only through f: g's r1 = r10 + 1016, proven with two frames above.
        let (p, a) = plan(&[
            ins(0xbf, 1, 10, 0, 0),
            ins(0x07, 1, 0, 0, -8),
            call(1), // f at 4
            EXIT,
            call(1), // f: g at 6
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            ins(0x79, 0, 1, 8, 0),
            EXIT,
        ]);
        assert_eq!(CallFacts::new(&p).above(2), 1024);
        assert_eq!(a.checks[6], AccessCheck::None);
        // r1 + 8 = g's r10 + 1024: the block's end.
        assert_eq!(a.checks[7], AccessCheck::Stack);
    }

    #[test]
    fn the_entry_is_never_a_callee() {
        // `frames_above[0] = 0` relies on it: a call to the entry is refused even from a
        // function no call reaches.
        let code = [ins(0xb7, 0, 0, 0, 0), EXIT, call(-3), EXIT].concat();
        assert!(crate::decode(&code, &[]).is_err());
    }

    #[test]
    fn callee_with_nothing_passed_in_is_not_analysed() {
        // r1 = 7 (a scalar) ; call f ; f: r0 = *(u64 *)(r1 + 0), no r10 copy: Unknown
        // without a dataflow run.
        let (_, a) = plan(&[
            ins(0xb7, 1, 0, 0, 7),
            call(1),
            EXIT,
            ins(0x79, 0, 1, 0, 0),
            EXIT,
        ]);
        assert_eq!(a.checks[3], AccessCheck::Unknown);
    }
}
