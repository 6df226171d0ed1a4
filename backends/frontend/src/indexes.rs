//! Index-bounded context accesses: `p = ctx + i; *(p + off)` where a dominating compare
//! proved `i + off + size <= ctx_len` (clang's `for (i = 0; i < len; i++) c = p[i]`).
//!
//! # What is proven
//!
//! A must-dataflow over the entry function (function 0) tracks, per register r0–r9:
//!
//! * whether it holds exactly the context length `LEN` (r2 at entry, and its copies) or
//!   exactly the context start (r1 at entry, and its copies);
//! * a **slack** `s` with `r + s <= LEN` as exact integers (no wrap): learned from an
//!   unsigned 64-bit compare against a register holding `LEN` or a value with a slack of
//!   its own (`i < len` gives 1, `i <= len` and `len >= i` give 0), in either operand order,
//!   on the edge where it holds (taken or fall-through); and from a constant `c` when the
//!   program tested `LEN >= c + s` (`if len == 0` falls through with `LEN >= 1`);
//! * a constant value (from `mov`/`lddw`, and `+=` of constants), for loop entries `i = 0`;
//! * for a pointer, `ctx_start + i + c` with `i` another register (`p = r1; p += i`): the
//!   relation dies when `p` or `i` is written.
//!
//! Joins keep what holds on every path (meet = intersection, smallest slack); any write of
//! a register forgets what was known of it, a call forgets r0–r5. 32-bit and signed compares
//! teach nothing. An access through `p = ctx_start + i + c` at offset `off` of `size` bytes
//! with `0 <= c + off` and `end = c + off + size <= slack(i)` is in the context on every
//! architectural path: [`AccessCheck::CtxIndex`].
//!
//! # Where `LEN` is r2, and r1 the start
//!
//! Only in function 0 and only because the entry makes it so: a plan with a `CtxIndex`
//! access sets r1 = `env.ctx_start` and r2 = `env.ctx_end - env.ctx_start` in the entry
//! (after the tail-call entry point, so programs entered by a tail call get them too),
//! whatever the caller passed (the runtime's runs, hooks, the C API and the rbpf bridge pass
//! exactly these; a caller of the plugin ABI might not). A bpf-to-bpf callee gets no facts:
//! its r2 is an argument.
//!
//! # Under speculation
//!
//! The slack rests on branches, so a mispredicted branch can reach the access with any
//! index. The relations it is tested through are data-derived (`p` is `ctx_start + i + c`
//! and the length register holds `LEN` on every path, mispredicted ones included), so the
//! backend re-tests `i + end <= LEN` branch-free at the access and selects a harmless
//! address when it fails (x86-64 `cmp` + `cmov`, arm64 `cmp`/`ccmp` + `csel`, RV64 `sltu`
//! and a mask): no branch, no out-of-line side, since architecturally the test never fails.

use crate::ranges::AccessCheck;
use crate::{AluOp, AtomicOp, BranchKind, Cond, Op, Operand, Program, Reg, Width};

/// The largest slack or access end tracked: clang's offsets past an index are a few bytes,
/// and a bound keeps the iteration short (slacks only shrink at joins).
pub const MAX_END: i32 = 4096;

/// Nothing known.
const NONE: i16 = -1;

/// Work allowed per instruction of the function before the analysis gives up (every
/// access then keeps its check): the lattice is finite but a slack can shrink one step per
/// round around a loop.
const WORK_PER_INST: usize = 16;

/// What holds of r0–r9 at one point of the entry function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Facts {
    /// Registers holding exactly the context length.
    len_regs: u16,
    /// Registers holding exactly the context start.
    start_regs: u16,
    /// `LEN >= len_min` (at most [`MAX_END`]).
    len_min: i32,
    /// `r + slack[r] <= LEN`, or [`NONE`].
    slack: [i16; 10],
    /// The register's value, when it is a known constant below 2^32 (larger ones are
    /// forgotten: only constants below [`MAX_END`] bound anything, and a state is copied
    /// at every join): `konst_vals[r]` when bit `r` of `konst_regs` is set, and 0
    /// otherwise. Plain integers with a mask rather than `Option`s, here and for
    /// `indexed`, because states are compared and met at every join: the arrays then
    /// compare as bytes. Read and written through [`Facts::konst`] and
    /// [`Facts::set_konst`].
    konst_regs: u16,
    konst_vals: [u32; 10],
    /// The register is `ctx_start + index + c`: `(index_of[r], index_add[r])` when bit `r`
    /// of `indexed_regs` is set (a write forgets the pointers indexed by it, and most
    /// states have none: no scan of all ten then), both 0 otherwise. See
    /// [`Facts::indexed`] and [`Facts::set_indexed`].
    indexed_regs: u16,
    index_of: [Reg; 10],
    index_add: [i16; 10],
}

impl Facts {
    const EMPTY: Facts = Facts {
        len_regs: 0,
        start_regs: 0,
        len_min: 0,
        slack: [NONE; 10],
        konst_regs: 0,
        konst_vals: [0; 10],
        indexed_regs: 0,
        index_of: [0; 10],
        index_add: [0; 10],
    };

    /// The entry function's registers on entry: r1 the start, r2 the length, r0 and r3–r9
    /// zero.
    fn entry() -> Facts {
        let mut f = Facts::EMPTY;
        f.start_regs = 1 << 1;
        f.len_regs = 1 << 2;
        for r in [0usize, 3, 4, 5, 6, 7, 8, 9] {
            f.set_konst(r, Some(0));
        }
        f
    }

    /// The largest `s` known with `r + s <= LEN`, or [`NONE`].
    fn slack_of(&self, r: Reg) -> i32 {
        let r = r as usize;
        if r >= 10 {
            return NONE as i32;
        }
        let mut s = self.slack[r] as i32;
        if self.len_regs & (1 << r) != 0 {
            s = s.max(0);
        }
        if let Some(c) = self.konst(r) {
            if c as i64 <= self.len_min as i64 {
                s = s.max(self.len_min - c as i32);
            }
        }
        s
    }

    /// `r` gets a new value nothing is known of, and every relation through it dies.
    fn forget(&mut self, r: Reg) {
        let r = r as usize;
        if r >= 10 {
            return;
        }
        self.len_regs &= !(1 << r);
        self.start_regs &= !(1 << r);
        self.slack[r] = NONE;
        self.set_konst(r, None);
        self.set_indexed(r, None);
        let mut left = self.indexed_regs;
        while left != 0 {
            let p = left.trailing_zeros() as usize;
            left &= left - 1;
            if self.index_of[p] as usize == r {
                self.set_indexed(p, None);
            }
        }
    }

    fn konst(&self, r: usize) -> Option<u32> {
        (self.konst_regs & (1 << r) != 0).then_some(self.konst_vals[r])
    }

    fn set_konst(&mut self, r: usize, v: Option<u32>) {
        self.konst_vals[r] = v.unwrap_or(0);
        if v.is_some() {
            self.konst_regs |= 1 << r;
        } else {
            self.konst_regs &= !(1 << r);
        }
    }

    fn indexed(&self, r: usize) -> Option<(Reg, i16)> {
        (self.indexed_regs & (1 << r) != 0).then_some((self.index_of[r], self.index_add[r]))
    }

    fn set_indexed(&mut self, r: usize, v: Option<(Reg, i16)>) {
        let (i, c) = v.unwrap_or((0, 0));
        self.index_of[r] = i;
        self.index_add[r] = c;
        if v.is_some() {
            self.indexed_regs |= 1 << r;
        } else {
            self.indexed_regs &= !(1 << r);
        }
    }

    fn learn_slack(&mut self, r: Reg, s: i32) {
        if (r as usize) < 10 && s >= 0 {
            let s = s.min(MAX_END) as i16;
            self.slack[r as usize] = self.slack[r as usize].max(s);
        }
    }

    /// What the relation `x < y` (`strict`) or `x <= y`, unsigned 64-bit, teaches.
    fn learn(&mut self, x: Side, y: Side, strict: bool) {
        let Side::Reg(ry) = y else {
            // An upper bound by a constant says nothing of LEN.
            return;
        };
        let sy = self.slack_of(ry);
        if sy < 0 {
            return;
        }
        // x + strict <= y <= LEN - sy.
        let gained = sy + strict as i32;
        let value = match x {
            Side::Reg(rx) => {
                self.learn_slack(rx, gained);
                ((rx as usize) < 10)
                    .then(|| self.konst(rx as usize))
                    .flatten()
                    .map(u64::from)
            }
            Side::Imm(c) => Some(c),
        };
        if let Some(c) = value {
            if c <= MAX_END as u64 {
                self.len_min = self.len_min.max((c as i32 + gained).min(MAX_END));
            }
        }
    }

    /// What the conditional jump teaches on its `taken` edge or its fall-through.
    fn narrow(&mut self, op: &Op, taken: bool) {
        let Op::Jcond {
            width: Width::W64,
            cond,
            dst,
            src,
            ..
        } = *op
        else {
            return;
        };
        let (d, s) = (
            Side::Reg(dst),
            match src {
                Operand::Reg(r) => Side::Reg(r),
                Operand::Imm(i) => Side::Imm(i as i64 as u64),
            },
        );
        // Each edge as `x < y` or `x <= y`.
        match (cond, taken) {
            (Cond::Lt, true) | (Cond::Ge, false) => self.learn(d, s, true),
            (Cond::Lt, false) | (Cond::Ge, true) => self.learn(s, d, false),
            (Cond::Le, true) | (Cond::Gt, false) => self.learn(d, s, false),
            (Cond::Le, false) | (Cond::Gt, true) => self.learn(s, d, true),
            (Cond::Eq, true) => {
                self.learn(d, s, false);
                self.learn(s, d, false);
            }
            // x != 0, unsigned: 0 < x.
            (Cond::Eq, false) | (Cond::Ne, true) if s == Side::Imm(0) => {
                self.learn(Side::Imm(0), d, true)
            }
            _ => {}
        }
    }

    /// The instruction's effect on the registers (not its edges: see [`Facts::narrow`]).
    fn transfer(&mut self, op: &Op) {
        match *op {
            Op::Alu {
                width: Width::W64,
                op: AluOp::Mov,
                dst,
                src: Operand::Reg(s),
            } => {
                if dst == s || dst >= 10 {
                    return;
                }
                self.forget(dst);
                if s >= 10 {
                    return;
                }
                let (d, s) = (dst as usize, s as usize);
                self.len_regs |= ((self.len_regs >> s) & 1) << d;
                self.start_regs |= ((self.start_regs >> s) & 1) << d;
                self.slack[d] = self.slack[s];
                self.set_konst(d, self.konst(s));
                self.set_indexed(d, self.indexed(s));
            }
            Op::Alu {
                width,
                op: AluOp::Mov,
                dst,
                src: Operand::Imm(i),
            } => {
                self.forget(dst);
                if dst < 10 {
                    self.set_konst(
                        dst as usize,
                        small(match width {
                            Width::W64 => i as i64 as u64,
                            Width::W32 => i as u32 as u64,
                        }),
                    );
                }
            }
            Op::Alu {
                width: Width::W64,
                op: op @ (AluOp::Add | AluOp::Sub),
                dst,
                src: Operand::Imm(i),
            } if dst < 10 => {
                let i = if op == AluOp::Add {
                    i as i64
                } else {
                    -(i as i64)
                };
                let d = dst as usize;
                let konst = self
                    .konst(d)
                    .and_then(|c| small((c as u64).wrapping_add(i as u64)));
                let indexed = self.indexed(d).and_then(|(x, c)| {
                    let c = c as i64 + i;
                    (c.abs() <= MAX_END as i64).then_some((x, c as i16))
                });
                self.forget(dst);
                self.set_konst(d, konst);
                self.set_indexed(d, indexed);
            }
            Op::Alu {
                width: Width::W64,
                op: AluOp::Add,
                dst,
                src: Operand::Reg(s),
            } if dst < 10 && s < 10 && dst != s => {
                let d = dst as usize;
                let konst = match (self.konst(d), self.konst(s as usize)) {
                    (Some(a), Some(b)) => small(a as u64 + b as u64),
                    _ => None,
                };
                // The start plus an index: the pointer `ctx[i]`.
                let indexed = (self.start_regs & (1 << d) != 0 && self.start_regs & (1 << s) == 0)
                    .then_some((s, 0));
                self.forget(dst);
                self.set_konst(d, konst);
                self.set_indexed(d, indexed);
            }
            Op::LdImm64 { dst, imm } => {
                self.forget(dst);
                if dst < 10 {
                    self.set_konst(dst as usize, small(imm.get()));
                }
            }
            Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. } => {
                for r in 0..=5 {
                    self.forget(r);
                }
            }
            Op::Atomic {
                op: AtomicOp::Xchg,
                src,
                ..
            } => self.forget(src),
            _ => {
                if let Some(w) = op.written_reg() {
                    self.forget(w);
                }
            }
        }
    }

    /// What holds on both `self`'s paths and `o`'s, `slacks` being `o`'s
    /// [`Facts::slacks`]. `self` is a stored join state, whose `slack` is already
    /// [`Facts::slack_of`] for every register ([`Facts::normalized`]), so only `o`'s are
    /// computed: a join runs at every jump, and it was most of the analysis' cost. The result is normalized too (a register's length or constant
    /// bound survives only where both sides have it, and is then below both slacks).
    fn meet_with(&self, o: &Facts, slacks: [i32; 10]) -> Facts {
        let mut m = *self;
        m.len_regs &= o.len_regs;
        m.start_regs &= o.start_regs;
        m.len_min = self.len_min.min(o.len_min);
        for (r, b) in slacks.into_iter().enumerate() {
            m.slack[r] = (self.slack[r] as i32).min(b).max(NONE as i32) as i16;
            // Absent entries are 0 on both sides: a differing value or presence clears.
            if self.konst_vals[r] != o.konst_vals[r]
                || (self.konst_regs ^ o.konst_regs) & (1 << r) != 0
            {
                m.set_konst(r, None);
            }
            if (self.index_of[r], self.index_add[r]) != (o.index_of[r], o.index_add[r])
                || (self.indexed_regs ^ o.indexed_regs) & (1 << r) != 0
            {
                m.set_indexed(r, None);
            }
        }
        m
    }

    /// Whether meeting `o` (whose [`Facts::slacks`] are `slacks`) leaves this stored
    /// (normalized) state as it is: everything it knows, `o` knows too.
    fn covers(&self, o: &Facts, slacks: &[i32; 10]) -> bool {
        let within = |mine: u16, theirs: u16| mine & !theirs == 0;
        if !within(self.len_regs, o.len_regs)
            || !within(self.start_regs, o.start_regs)
            || self.len_min > o.len_min
            || !within(self.konst_regs, o.konst_regs)
            || !within(self.indexed_regs, o.indexed_regs)
        {
            return false;
        }
        (0..10).all(|r| {
            self.slack[r] as i32 <= slacks[r].max(NONE as i32)
                && (self.konst_regs & (1 << r) == 0 || self.konst_vals[r] == o.konst_vals[r])
                && (self.indexed_regs & (1 << r) == 0
                    || (self.index_of[r], self.index_add[r]) == (o.index_of[r], o.index_add[r]))
        })
    }

    /// The same facts with every register's `slack` raised to [`Facts::slack_of`]: what
    /// the analysis reads of a slack is only ever `slack_of` (a copy takes the length and
    /// constant with it, a write forgets all three), so this changes no conclusion, and
    /// stored states in this form make [`Facts::meet_with`] cheaper and equal facts compare
    /// equal.
    fn normalized(&self) -> Facts {
        let mut n = *self;
        for (r, s) in self.slacks().into_iter().enumerate() {
            n.slack[r] = s.max(NONE as i32) as i16;
        }
        n
    }

    /// [`Facts::slack_of`] of r0–r9.
    fn slacks(&self) -> [i32; 10] {
        let mut s = [0i32; 10];
        for (r, out) in s.iter_mut().enumerate() {
            let mut v = self.slack[r] as i32;
            if self.len_regs & (1 << r) != 0 {
                v = v.max(0);
            }
            if let Some(c) = self.konst(r) {
                if c as i64 <= self.len_min as i64 {
                    v = v.max(self.len_min - c as i32);
                }
            }
            *out = v;
        }
        s
    }

    /// The plan of an access of `size` bytes at `base + off`, if the facts bound it.
    fn classify(&self, base: Reg, off: i16, size: u32) -> Option<AccessCheck> {
        let (index, c) = ((base as usize) < 10)
            .then(|| self.indexed(base as usize))
            .flatten()?;
        let start = c as i32 + off as i32;
        let end = start + size as i32;
        if start < 0 || end > self.slack_of(index) {
            return None;
        }
        let len = (0..10u8).find(|&r| self.len_regs & (1 << r) != 0);
        Some(AccessCheck::CtxIndex {
            index,
            len,
            end: end as u16,
        })
    }
}

/// A constant worth keeping (see [`Facts::konst`]).
fn small(v: u64) -> Option<u32> {
    u32::try_from(v).ok()
}

/// One side of a compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Reg(Reg),
    Imm(u64),
}

/// Gives the entry function's context accesses that are still checked (`Ctx` or `Unknown`)
/// and whose index is bounded on every path [`AccessCheck::CtxIndex`] (see the module docs).
pub fn bound_indexes(prog: &Program, checks: &mut [AccessCheck]) {
    let Some(sp) = prog.subprogs.first() else {
        return;
    };
    let (start, end) = (sp.start, sp.end);
    let candidate = |c: &AccessCheck| matches!(c, AccessCheck::Ctx | AccessCheck::Unknown);
    if checks.len() < end || !checks[start..end].iter().any(candidate) {
        return;
    }
    // Without an unsigned 64-bit compare of two registers nothing is bounded by the
    // length, and without `p += i` no pointer is indexed: most programs have one or the
    // other only, and a look at the instructions costs less than the dataflow.
    let (mut compares, mut adds) = (false, false);
    for inst in &prog.insts[start..end] {
        match inst.op {
            Op::Jcond {
                width: Width::W64,
                cond: Cond::Lt | Cond::Le | Cond::Gt | Cond::Ge | Cond::Eq,
                src: Operand::Reg(_),
                ..
            } => compares = true,
            Op::Alu {
                width: Width::W64,
                op: AluOp::Add,
                src: Operand::Reg(_),
                ..
            } => adds = true,
            _ => {}
        }
    }
    if !(compares && adds) {
        return;
    }
    let n = end - start;
    // Facts matter only where a path leads on to a candidate: clang's programs often read
    // the context in a first loop and then work on the stack, and the later loops' joins
    // were most of the analysis. Nothing past `hi` can reach the last candidate (a path
    // back needs a backward jump from past `hi` to before it), so the analysis stops
    // there: the code left out only feeds code left out.
    let Some(last) = (start..end).rev().find(|&i| {
        candidate(&checks[i])
            && matches!(
                prog.insts[i].op,
                Op::Load { .. } | Op::Store { .. } | Op::Atomic { .. }
            )
    }) else {
        return;
    };
    let mut hi = last;
    // By position: a backward jump that extends `hi` is seen before any later one that
    // lands inside the extension.
    for b in prog.branches_in(last + 1, end) {
        if b.kind != BranchKind::CallLocal && b.target as usize <= hi {
            hi = b.at as usize;
        }
    }
    let is_useful = |i: usize| i <= hi;
    // States only where paths meet (the function's start and jump targets), each ~250
    // bytes: per instruction they would be that much per instruction of a large program.
    let mut slot: Vec<u32> = crate::reuse::filled(n, 0);
    let mut states: Vec<Facts> = vec![Facts::entry().normalized()];
    slot[0] = 1;
    // Joins to run from, one bit per instruction, taken lowest first.
    let mut pending = vec![0u64; n.div_ceil(64)];
    pending[0] = 1;
    let mut next = 0usize;
    let mut work = 0usize;
    let budget = n * WORK_PER_INST + 1024;
    let hand_over = |slot: &mut Vec<u32>,
                     states: &mut Vec<Facts>,
                     pending: &mut Vec<u64>,
                     next: &mut usize,
                     target: usize,
                     f: &Facts| {
        if !(start..end).contains(&target) || !is_useful(target) {
            return;
        }
        let k = slot[target - start];
        if k == 0 {
            states.push(f.normalized());
            slot[target - start] = states.len() as u32;
        } else {
            let old = &mut states[k as usize - 1];
            let slacks = f.slacks();
            // Most joins change nothing (a loop's head once stable): tested without
            // building the met state.
            if old.covers(f, &slacks) {
                return;
            }
            *old = old.meet_with(f, slacks);
        }
        let t = target - start;
        pending[t / 64] |= 1 << (t % 64);
        *next = (*next).min(t);
    };
    loop {
        let mut word = next / 64;
        let Some(&w) = pending.get(word) else { break };
        let mut bits = w & (u64::MAX << (next % 64));
        while bits == 0 && word + 1 < pending.len() {
            word += 1;
            bits = pending[word];
        }
        if bits == 0 {
            break;
        }
        let t = word * 64 + bits.trailing_zeros() as usize;
        pending[word] &= !(1 << (t % 64));
        next = t;
        let b = start + t;
        let mut f = states[slot[b - start] as usize - 1];
        let mut i = b;
        loop {
            work += 1;
            if work > budget {
                crate::reuse::give_back(slot);
                return;
            }
            let op = prog.insts[i].op;
            f.transfer(&op);
            match op {
                Op::Ja { target } => {
                    hand_over(
                        &mut slot,
                        &mut states,
                        &mut pending,
                        &mut next,
                        target as usize,
                        &f,
                    );
                    break;
                }
                Op::Jcond { target, .. } => {
                    let mut taken = f;
                    taken.narrow(&op, true);
                    hand_over(
                        &mut slot,
                        &mut states,
                        &mut pending,
                        &mut next,
                        target as usize,
                        &taken,
                    );
                    f.narrow(&op, false);
                }
                Op::Exit => break,
                _ => {}
            }
            i += 1;
            if i == end || !is_useful(i) {
                break;
            }
            if prog.is_target[i] {
                hand_over(&mut slot, &mut states, &mut pending, &mut next, i, &f);
                break;
            }
        }
    }
    // The final states, straight down from each join (one state updated in place).
    let (mut f, mut live) = (Facts::EMPTY, false);
    for i in start..=last {
        if i == start || prog.is_target[i] {
            let k = slot[i - start];
            live = k != 0;
            if live {
                f = states[k as usize - 1];
            }
        }
        if !live {
            continue;
        }
        let op = prog.insts[i].op;
        if candidate(&checks[i]) {
            if let Op::Load {
                base, off, size, ..
            }
            | Op::Store {
                base, off, size, ..
            }
            | Op::Atomic {
                base, off, size, ..
            } = op
            {
                if let Some(c) = f.classify(base, off, size.bytes()) {
                    checks[i] = c;
                }
            }
        }
        f.transfer(&op);
        match op {
            Op::Ja { .. } | Op::Exit => live = false,
            Op::Jcond { .. } => f.narrow(&op, false),
            _ => {}
        }
    }
    crate::reuse::give_back(slot);
}

#[cfg(test)]
mod tests {
    use crate::encode_insn as ins;
    use crate::ranges::{plan_accesses, AccessCheck};

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    /// `words`' loop: `r4 = 0; if r2 == 0 goto out; goto test; head: <before>; r5 = r1;
    /// r5 += r4; r8 = *(size *)(r5 + off); r4 += 1; test: <test> goto head; out: exit`,
    /// returning the check of the load.
    fn loop_check(before: &[[u8; 8]], size: u8, off: i16, test: [u8; 8]) -> AccessCheck {
        let mut code = vec![
            ins(0xb7, 0, 0, 0, 0),
            ins(0xb7, 4, 0, 0, 0),
            ins(0x15, 2, 0, 0, 0), // if r2 == 0 goto out (patched)
            ins(0x05, 0, 0, 0, 0), // goto test (patched)
        ];
        let head = code.len();
        code.extend_from_slice(before);
        code.push(ins(0xbf, 5, 1, 0, 0));
        code.push(ins(0x0f, 5, 4, 0, 0));
        let load = code.len();
        code.push(ins(0x61 | size, 8, 5, off, 0));
        code.push(ins(0x07, 4, 0, 0, 1));
        let at = code.len();
        let mut t = test;
        t[2..4].copy_from_slice(&((head as i16) - (at as i16 + 1)).to_le_bytes());
        code.push(t);
        let out = code.len();
        code[2] = ins(0x15, 2, 0, (out - 3) as i16, 0);
        code[3] = ins(0x05, 0, 0, (at - 4) as i16, 0);
        code.push(EXIT);
        let prog = crate::decode(&code.concat(), &[]).unwrap();
        plan_accesses(&prog, true).check(load)
    }

    const B: u8 = 0x10;
    const H: u8 = 0x08;

    #[test]
    fn words_loop_is_index_bounded() {
        let want = AccessCheck::CtxIndex {
            index: 4,
            len: Some(2),
            end: 1,
        };
        // i < len, and len > i: the operand orders.
        assert_eq!(loop_check(&[], B, 0, ins(0xad, 4, 2, 0, 0)), want);
        assert_eq!(loop_check(&[], B, 0, ins(0x2d, 2, 4, 0, 0)), want);
        // A copy of the length bounds it as well; the lowest register holding it is named.
        let copy = [ins(0xbf, 6, 2, 0, 0)];
        assert_eq!(loop_check(&copy, B, 0, ins(0xad, 4, 2, 0, 0)), want);
        // The length register written after the compare (a top-tested loop): the fact
        // about the index stays, but no register holds the length.
        let code = [
            ins(0xb7, 0, 0, 0, 0),
            ins(0x71, 4, 1, 0, 0), // r4 = *(u8 *)(r1 + 0), checked as it is
            ins(0x3d, 4, 2, 6, 0), // if r4 >= r2 goto out
            ins(0xbf, 6, 2, 0, 0), // r6 = r2
            ins(0xb7, 2, 0, 0, 7), // r2 = 7
            ins(0xbf, 5, 1, 0, 0),
            ins(0x0f, 5, 4, 0, 0),
            ins(0x71, 3, 5, 0, 0), // r3 = *(u8 *)(r5 + 0)
            ins(0xbf, 2, 6, 0, 0), // r2 = r6
            EXIT,
        ];
        let prog = crate::decode(&code.concat(), &[]).unwrap();
        assert_eq!(
            plan_accesses(&prog, true).check(7),
            AccessCheck::CtxIndex {
                index: 4,
                len: Some(6),
                end: 1
            }
        );
    }

    #[test]
    fn what_the_compare_does_not_prove_stays_checked() {
        let checked = |c: AccessCheck| !matches!(c, AccessCheck::CtxIndex { .. });
        // One byte too generous: i <= len, len >= i.
        assert!(checked(loop_check(&[], B, 0, ins(0xbd, 4, 2, 0, 0))));
        assert!(checked(loop_check(&[], B, 0, ins(0x3d, 2, 4, 0, 0))));
        // Past the bound: two bytes, or one byte further.
        assert!(checked(loop_check(&[], H, 0, ins(0xad, 4, 2, 0, 0))));
        assert!(checked(loop_check(&[], B, 1, ins(0xad, 4, 2, 0, 0))));
        assert!(checked(loop_check(&[], B, -1, ins(0xad, 4, 2, 0, 0))));
        // 32-bit, signed and != compares teach nothing.
        assert!(checked(loop_check(&[], B, 0, ins(0xae, 4, 2, 0, 0))));
        assert!(checked(loop_check(&[], B, 0, ins(0xcd, 4, 2, 0, 0))));
        assert!(checked(loop_check(&[], B, 0, ins(0x5d, 4, 2, 0, 0))));
        // The index written between the compare and the access.
        assert!(checked(loop_check(
            &[ins(0x07, 4, 0, 0, 1)],
            B,
            0,
            ins(0xad, 4, 2, 0, 0)
        )));
        // The length changed before the compare: r2 is no longer the length.
        assert!(checked(loop_check(
            &[ins(0x07, 2, 0, 0, 1)],
            B,
            0,
            ins(0xad, 4, 2, 0, 0)
        )));
    }

    #[test]
    fn a_back_edge_after_the_last_access_still_joins() {
        // `i = 0; if len == 0 goto out; head: p = r1 + i; r8 = *(u8 *)p; <more>; i += 1;
        // if i != 1000 goto head; out: exit`. On the first pass `ctx[0]` is in bounds (len
        // >= 1), but the back-edge, past the last access and past `more`'s loop, brings
        // any `i`: the access stays checked. `more` is a loop of its own after the access
        // (r3 counts down), which the analysis leaves out; the back-edge it must not.
        let code = [
            ins(0xb7, 4, 0, 0, 0),
            ins(0x15, 2, 0, 9, 0),     // if r2 == 0 goto out
            ins(0xbf, 5, 1, 0, 0),     // head: r5 = r1
            ins(0x0f, 5, 4, 0, 0),     // r5 += r4
            ins(0x71, 8, 5, 0, 0),     // r8 = *(u8 *)(r5 + 0)
            ins(0xb7, 3, 0, 0, 4),     // r3 = 4
            ins(0x07, 3, 0, 0, -1),    // more: r3 -= 1
            ins(0x55, 3, 0, -2, 0),    // if r3 != 0 goto more
            ins(0x07, 4, 0, 0, 1),     // r4 += 1
            ins(0x55, 4, 0, -8, 1000), // if r4 != 1000 goto head
            ins(0x2d, 6, 7, 0, 0),     // if r6 > r7 goto out (a compare of two registers)
            EXIT,
        ];
        let prog = crate::decode(&code.concat(), &[]).unwrap();
        assert!(!matches!(
            plan_accesses(&prog, true).check(4),
            AccessCheck::CtxIndex { .. }
        ));
    }

    /// Random facts with few values per field, so that pairs often agree.
    fn random_facts(seed: &mut u64) -> super::Facts {
        let mut rnd = |n: u64| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed % n
        };
        let mut f = super::Facts::EMPTY;
        f.len_regs = (rnd(1024) & rnd(1024)) as u16;
        f.start_regs = (rnd(1024) & rnd(1024)) as u16;
        f.len_min = rnd(3) as i32;
        for r in 0..10 {
            f.slack[r] = rnd(4) as i16 - 1;
            if rnd(2) == 0 {
                f.set_konst(r, Some(rnd(3) as u32));
            }
            if rnd(3) == 0 {
                f.set_indexed(r, Some((rnd(2) as u8, rnd(2) as i16)));
            }
        }
        f
    }

    #[test]
    fn covers_is_a_meet_that_changes_nothing() {
        // The join's shortcut must say "unchanged" exactly when the meet would leave the
        // stored (normalized) state as it is; both answers must come up often.
        let mut seed = 0x5eed_c0e5_u64;
        let (mut same, mut changed) = (0, 0);
        for _ in 0..20_000 {
            let old = random_facts(&mut seed).normalized();
            // `old` with one field nudged either way (or none): the pairs where one
            // condition alone decides.
            let other = random_facts(&mut seed);
            let mut o = old;
            let r = (seed % 10) as usize;
            match (seed >> 8) % 9 {
                0 => o.len_regs ^= 1 << r,
                1 => o.start_regs ^= 1 << r,
                2 => o.len_min += if seed & (1 << 20) != 0 { 1 } else { -1 },
                3 => o.slack[r] += if seed & (1 << 20) != 0 { 1 } else { -1 },
                4 => o.set_konst(r, other.konst(r)),
                5 => o.set_indexed(r, other.indexed(r)),
                6 => o = other,
                _ => {}
            }
            let slacks = o.slacks();
            let unchanged = old.meet_with(&o, slacks) == old;
            assert_eq!(old.covers(&o, &slacks), unchanged, "{old:?} meets {o:?}");
            if unchanged {
                same += 1;
            } else {
                changed += 1;
            }
        }
        assert!(
            same > 1000 && changed > 1000,
            "{same} unchanged, {changed} changed"
        );
    }

    #[test]
    fn a_callee_gets_no_facts() {
        // Function 1 has the entry's shape, but its r1 and r2 are its caller's arguments.
        let code = [
            ins(0x85, 0, 1, 0, 1), // call function 1
            EXIT,
            ins(0xb7, 0, 0, 0, 0),
            ins(0xb7, 4, 0, 0, 0),
            ins(0x3d, 4, 2, 4, 0), // if r4 >= r2 goto out
            ins(0xbf, 5, 1, 0, 0),
            ins(0x0f, 5, 4, 0, 0),
            ins(0x71, 0, 5, 0, 0),
            ins(0x07, 4, 0, 0, 1),
            EXIT,
        ];
        let prog = crate::decode(&code.concat(), &[]).unwrap();
        let plan = plan_accesses(&prog, true);
        assert!(!matches!(plan.check(7), AccessCheck::CtxIndex { .. }));
        assert!(!plan.uses_ctx_index());
    }
}
