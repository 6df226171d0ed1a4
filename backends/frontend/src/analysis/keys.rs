//! Map keys known at compile time: the `u32` an array lookup's key pointer (r2) points to
//! when straight-line code just stored a constant there, as clang emits for
//! `u32 key = 0; bpf_map_lookup_elem(&map, &key)`:
//!
//! ```text
//! r1 = 0 ; *(u32 *)(r10 - 4) = r1 ; r2 = r10 ; r2 += -4 ; r1 = map ll ; call 1
//! ```
//!
//! The driver then emits the element's address (or NULL) as a constant instead of loading,
//! bounding and scaling the key: the lookup costs what a load of a global costs. A key the
//! program computes at run time (`u32 key = ctx->key`) is still found in the frame: the
//! lookup reads it from there (r10 + offset, never checked) instead of through r2, so the
//! argument setup is dead for it too.
//!
//! One forward pass over basic blocks. The facts are kept only while nothing can have
//! changed them: they are dropped at every instruction a branch or call lands on (another
//! path may arrive there), after `ja` and `exit`, at every call (a helper or callee may
//! write the stack through a pointer it was given) and at every store or atomic whose
//! address is not a known stack offset (it may be a stack pointer the pass lost track of).
//! The stack is little-endian on every target packjit emits for, so the key is the low four
//! bytes at its offset.

use super::liveness::regs_read;
use crate::{AluOp, Op, Operand, Program, Reg, Size, Width};

/// What the pass knows of a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Unknown,
    Const(u64),
    /// r10 + this many bytes.
    Stack(i64),
}

/// A constant the frame holds at `off..off + len` (from r10).
#[derive(Clone, Copy, Debug)]
struct Slot {
    off: i64,
    len: i64,
    value: u64,
}

struct Facts {
    regs: [Known; 11],
    slots: Vec<Slot>,
}

impl Facts {
    fn new() -> Self {
        let mut regs = [Known::Unknown; 11];
        regs[10] = Known::Stack(0);
        Facts {
            regs,
            slots: Vec::new(),
        }
    }

    fn set(&mut self, r: Reg, k: Known) {
        // r10 is read-only (the verifier refuses writes); r11+ is never a key pointer.
        if (r as usize) < 10 {
            self.regs[r as usize] = k;
        }
    }

    fn get(&self, r: Reg) -> Known {
        self.regs.get(r as usize).copied().unwrap_or(Known::Unknown)
    }

    /// A write of `len` bytes at stack offset `off` (or anywhere, `None`), of `value` when
    /// known.
    fn write(&mut self, at: Option<i64>, len: i64, value: Option<u64>) {
        let Some(off) = at else {
            self.slots.clear();
            return;
        };
        self.slots
            .retain(|s| s.off + s.len <= off || off + len <= s.off);
        if let Some(value) = value {
            self.slots.push(Slot { off, len, value });
        }
    }

    /// The `u32` at stack offset `off`, if one slot holds all four bytes.
    fn key_at(&self, off: i64) -> Option<u32> {
        let s = self
            .slots
            .iter()
            .find(|s| s.off <= off && off + 4 <= s.off + s.len)?;
        Some((s.value >> (8 * (off - s.off))) as u32)
    }

    fn clobber_call(&mut self) {
        self.slots.clear();
        for r in 0..=5 {
            self.regs[r] = Known::Unknown;
        }
    }
}

fn alu(facts: &mut Facts, width: Width, op: AluOp, dst: Reg, src: Operand) {
    let value = match src {
        Operand::Imm(imm) => Known::Const(imm as i64 as u64),
        Operand::Reg(r) => facts.get(r),
    };
    let result = match (width, op, facts.get(dst), value) {
        (Width::W64, AluOp::Mov, _, v) => v,
        (Width::W32, AluOp::Mov, _, Known::Const(c)) => Known::Const(c as u32 as u64),
        (Width::W64, AluOp::Add, Known::Stack(o), Known::Const(c)) => {
            Known::Stack(o.wrapping_add(c as i64))
        }
        (Width::W64, AluOp::Sub, Known::Stack(o), Known::Const(c)) => {
            Known::Stack(o.wrapping_sub(c as i64))
        }
        (Width::W64, AluOp::Add, Known::Const(a), Known::Const(b)) => {
            Known::Const(a.wrapping_add(b))
        }
        _ => Known::Unknown,
    };
    facts.set(dst, result);
}

/// For each instruction index, in ascending order, that calls a helper `is_array_lookup`
/// accepts with r2 pointing to a stack `u32` the pass knows: the index and the key.
pub fn constant_array_keys(
    prog: &Program,
    is_array_lookup: impl Fn(u32) -> bool,
) -> Vec<(usize, u32)> {
    array_keys(prog, is_array_lookup)
        .into_iter()
        .filter_map(|(at, key)| match key {
            ArrayKey::Const(k) => Some((at, k)),
            ArrayKey::Frame(_) | ArrayKey::Register(_) => None,
        })
        .collect()
}

/// Where an array lookup's key is, when the pass knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayKey {
    /// This constant.
    Const(u32),
    /// The `u32` at r10 + this offset, inside the frame (a frame-constant read, proven in
    /// every mode), whose value is known only when the program runs.
    Frame(i16),
    /// A frame key still in this register, zero-extended ([`forwarded_key`]; the driver's
    /// choice, never [`array_keys`]' answer).
    Register(Reg),
}

/// For each instruction index, in ascending order, that calls a helper `is_array_lookup`
/// accepts with r2 pointing into the frame: the index and the key, a constant where
/// straight-line code just stored one, else its place in the frame. A frame key needs its
/// four bytes inside the frame (`is_frame_constant`): r2 anywhere else is left to the
/// lookup's own read through r2.
pub fn array_keys(prog: &Program, is_array_lookup: impl Fn(u32) -> bool) -> Vec<(usize, ArrayKey)> {
    let mut keys = Vec::new();
    let mut facts = Facts::new();
    for (i, inst) in prog.insts.iter().enumerate() {
        if prog.is_target[i] {
            facts = Facts::new();
        }
        match inst.op {
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => alu(&mut facts, width, op, dst, src),
            Op::LdImm64 { dst, imm } => facts.set(dst, Known::Const(imm.get())),
            Op::MovSx { dst, .. }
            | Op::MovPerCpu { dst, .. }
            | Op::Neg { dst, .. }
            | Op::End { dst, .. }
            | Op::Load { dst, .. } => facts.set(dst, Known::Unknown),
            // A load from the context into r0: no memory written.
            Op::PacketLoad { .. } => facts.set(0, Known::Unknown),
            Op::Store {
                size,
                base,
                off,
                src,
            } => {
                let at = match facts.get(base) {
                    Known::Stack(o) => Some(o.wrapping_add(off as i64)),
                    _ => None,
                };
                let value = match src {
                    Operand::Imm(imm) => Some(imm as i64 as u64),
                    Operand::Reg(r) => match facts.get(r) {
                        Known::Const(c) => Some(c),
                        _ => None,
                    },
                };
                let len = size.bytes() as i64;
                let value = value.filter(|_| matches!(size, Size::W | Size::DW));
                facts.write(at, len, value);
            }
            Op::Atomic {
                size,
                fetch,
                base,
                off,
                src,
                ..
            } => {
                let at = match facts.get(base) {
                    Known::Stack(o) => Some(o.wrapping_add(off as i64)),
                    _ => None,
                };
                facts.write(at, size.bytes() as i64, None);
                // A fetch returns the old value in `src` (r0 for cmpxchg).
                if fetch {
                    facts.set(src, Known::Unknown);
                }
                facts.set(0, Known::Unknown);
            }
            Op::CallHelper { id } => {
                if is_array_lookup(id) {
                    if let Known::Stack(off) = facts.get(2) {
                        if let Some(key) = facts.key_at(off) {
                            keys.push((i, ArrayKey::Const(key)));
                        } else if let Some(off) = i16::try_from(off)
                            .ok()
                            .filter(|&o| super::is_frame_constant(crate::R10, o, Size::W))
                        {
                            keys.push((i, ArrayKey::Frame(off)));
                        }
                    }
                }
                facts.clobber_call();
            }
            Op::CallReg { .. } | Op::CallLocal { .. } => facts.clobber_call(),
            Op::Ja { .. } | Op::Exit => facts = Facts::new(),
            Op::Jcond { .. } => {}
        }
    }
    keys
}

/// The register that still holds the frame key at `off` when the lookup at `call` runs, if
/// straight-line code right before stored it there from a register (`*(u32 *)(r10 + off) =
/// rS`, or the 8-byte store) that no emitted instruction wrote since (`skipped` are the
/// instructions not emitted: a dead argument's write never reaches the native register),
/// and whose upper half is zero: its last write before the store is an unsigned load of at
/// most four bytes, which zero-extends natively on every target (unlike 32-bit ALU results
/// on RV64, whose upper half may be left unread and unwritten). The lookup then uses the
/// register and does not read the key back. Not r0, which the lookup writes first.
pub fn forwarded_key(
    prog: &Program,
    call: usize,
    off: i16,
    skipped: impl Fn(usize) -> bool,
) -> Option<Reg> {
    let sub = &prog.subprogs[prog.subprog_of(call)];
    if prog.is_target[call] {
        return None;
    }
    let overlaps = |o: i16, size: Size| {
        let (a, b) = (i64::from(o), i64::from(o) + size.bytes() as i64);
        a < i64::from(off) + 4 && i64::from(off) < b
    };
    // Registers the emitted code wrote between the store and the call.
    let mut written: u16 = 0;
    let mut found = None;
    let mut j = call;
    while j > sub.start {
        j -= 1;
        let op = prog.insts[j].op;
        if !skipped(j) {
            match op {
                Op::Store {
                    size: Size::W | Size::DW,
                    base: crate::R10,
                    off: o,
                    src: Operand::Reg(r),
                } if o == off => {
                    found = Some(r);
                }
                Op::Store {
                    base, off: o, size, ..
                } => {
                    if base != crate::R10 || overlaps(o, size) {
                        return None;
                    }
                }
                Op::Atomic {
                    base,
                    off: o,
                    size,
                    fetch,
                    src,
                    ..
                } => {
                    if base != crate::R10 || overlaps(o, size) {
                        return None;
                    }
                    written |= 1;
                    if fetch {
                        written |= 1 << src;
                    }
                }
                Op::Alu { dst, .. }
                | Op::MovSx { dst, .. }
                | Op::MovPerCpu { dst, .. }
                | Op::Neg { dst, .. }
                | Op::End { dst, .. }
                | Op::LdImm64 { dst, .. }
                | Op::Load { dst, .. } => written |= 1 << dst,
                Op::PacketLoad { .. }
                | Op::Ja { .. }
                | Op::Jcond { .. }
                | Op::CallHelper { .. }
                | Op::CallReg { .. }
                | Op::CallLocal { .. }
                | Op::Exit => return None,
            }
        }
        if found.is_some() || prog.is_target[j] {
            break;
        }
    }
    let reg = found?;
    if reg == 0 || reg >= 10 || written & (1 << reg) != 0 {
        return None;
    }
    // The register's last write before the store: an unsigned load of at most four bytes.
    while j > sub.start && !prog.is_target[j] {
        j -= 1;
        if skipped(j) {
            continue;
        }
        match prog.insts[j].op {
            Op::Load {
                size: Size::B | Size::H | Size::W,
                sign_extend: false,
                dst,
                ..
            } if dst == reg => return Some(reg),
            Op::Alu { dst, .. }
            | Op::MovSx { dst, .. }
            | Op::MovPerCpu { dst, .. }
            | Op::Neg { dst, .. }
            | Op::End { dst, .. }
            | Op::LdImm64 { dst, .. }
            | Op::Load { dst, .. }
                if dst == reg =>
            {
                return None
            }
            Op::Atomic {
                fetch: true, src, ..
            } if src == reg => return None,
            Op::Alu { .. }
            | Op::MovSx { .. }
            | Op::MovPerCpu { .. }
            | Op::Neg { .. }
            | Op::End { .. }
            | Op::LdImm64 { .. }
            | Op::Load { .. }
            | Op::Store { .. }
            | Op::Atomic { .. } => {}
            Op::PacketLoad { .. }
            | Op::Ja { .. }
            | Op::Jcond { .. }
            | Op::CallHelper { .. }
            | Op::CallReg { .. }
            | Op::CallLocal { .. }
            | Op::Exit => return None,
        }
    }
    None
}

/// The instructions before a folded lookup at `call` whose only use was to pass it
/// arguments: [`dead_arguments`] of a call that reads none of r1-r5 once folded.
pub fn dead_key_arguments(prog: &Program, call: usize) -> Vec<usize> {
    dead_arguments(prog, call, 0)
}

/// The instructions before a helper call the driver expands itself (a folded or inlined
/// array lookup, an inlined tail call) whose only use was to pass it arguments: register
/// writes (no memory access, so nothing that could stop) to r1-r5 that nothing reads
/// before the call, where the expansion reads only the registers in the mask `read` (bit
/// `r` for `r`) and leaves r1-r5 undefined after, as any call. The scan goes back through
/// straight-line code only: it stops at a branch, a call or an `exit` (a path leaving there
/// may read the register), and after an instruction another path lands on (from there on,
/// every path runs into the call).
pub fn dead_arguments(prog: &Program, call: usize, read: u16) -> Vec<usize> {
    const ARGS: u16 = 0b11_1110;
    let sub = &prog.subprogs[prog.subprog_of(call)];
    // r1-r5 whose value at this point the call and what follows may still read.
    let mut live: u16 = read & ARGS;
    let mut dead = Vec::new();
    for j in (sub.start..call).rev() {
        let op = prog.insts[j].op;
        let pure_write = match op {
            Op::Alu { dst, .. }
            | Op::MovSx { dst, .. }
            | Op::Neg { dst, .. }
            | Op::End { dst, .. }
            | Op::LdImm64 { dst, .. } => Some(dst),
            // Memory accesses stay (a sandboxed one may stop the program); what they write
            // is kept live, which only keeps more.
            Op::Load { .. }
            | Op::Store { .. }
            | Op::Atomic { .. }
            | Op::MovPerCpu { .. }
            | Op::PacketLoad { .. } => None,
            Op::Ja { .. }
            | Op::Jcond { .. }
            | Op::CallHelper { .. }
            | Op::CallReg { .. }
            | Op::CallLocal { .. }
            | Op::Exit => break,
        };
        let reads = regs_read(&op, 0) & ARGS;
        match pure_write {
            Some(dst) if ARGS & (1 << dst) != 0 && live & (1 << dst) == 0 => dead.push(j),
            Some(dst) => live = (live & !(1u16 << dst)) | reads,
            None => live |= reads,
        }
        if prog.is_target[j] {
            break;
        }
    }
    dead.reverse();
    dead
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode_insn as i;

    const LOOKUP: u32 = 1;

    fn keys(p: &[[u8; 8]]) -> Vec<(usize, u32)> {
        constant_array_keys(&crate::analysis::program(p), |id| id == LOOKUP)
    }

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    #[test]
    fn clangs_constant_key_is_found() {
        // r1 = 7 ; *(u32 *)(r10 - 4) = r1 ; r2 = r10 ; r2 += -4 ; call 1 ; exit
        let p = [
            i(0xb7, 1, 0, 0, 7),
            i(0x63, 10, 1, -4, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        assert_eq!(keys(&p), vec![(4, 7)]);
        // The same through `st` with an immediate and a key inside a 64-bit store.
        let st = [
            i(0x62, 10, 0, -8, 9),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -8),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        assert_eq!(keys(&st), vec![(3, 9)]);
        let dw = [
            i(0x18, 1, 0, 0, 5),
            i(0, 0, 0, 0, 6), // r1 = 6 << 32 | 5
            i(0x7b, 10, 1, -8, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4), // the high half
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        assert_eq!(keys(&dw), vec![(4, 6)]);
    }

    #[test]
    fn a_key_that_may_have_changed_is_not_known() {
        let call = i(0x85, 0, 0, 0, LOOKUP as i32);
        let prefix = [
            i(0x62, 10, 0, -4, 3),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
        ];
        let with = |middle: &[[u8; 8]]| {
            let mut p = prefix.to_vec();
            p.extend_from_slice(middle);
            p.push(call);
            p.push(EXIT);
            keys(&p)
        };
        assert_eq!(with(&[]), vec![(3, 3)]);
        // A byte of the key overwritten through r10, or through a copy of a stack pointer.
        assert!(with(&[i(0x72, 10, 0, -2, 1)]).is_empty());
        assert!(with(&[i(0xbf, 3, 10, 0, 0), i(0x72, 3, 0, -1, 1)]).is_empty());
        // A store through a pointer the pass does not know (it may point to the stack).
        assert!(with(&[i(0x79, 3, 1, 0, 0), i(0x62, 3, 0, 0, 1)]).is_empty());
        // An atomic on the key.
        assert!(with(&[i(0xc3, 10, 1, -4, 0)]).is_empty());
        // A call in between (a helper may write through the r2 it was given): the first
        // lookup knows its key, the second does not.
        assert_eq!(
            with(&[call, i(0xbf, 2, 10, 0, 0), i(0x07, 2, 0, 0, -4)]),
            vec![(3, 3)]
        );
        // r2 pointing elsewhere, or loaded.
        assert!(with(&[i(0x07, 2, 0, 0, 4)]).is_empty());
        assert!(with(&[i(0x79, 2, 1, 0, 0)]).is_empty());
        // A store elsewhere leaves the key alone.
        assert_eq!(with(&[i(0x62, 10, 0, -8, 1)]), vec![(4, 3)]);
        // A half-word store is not remembered, but still overwrites.
        assert!(with(&[i(0x6a, 10, 0, -4, 1)]).is_empty());
    }

    #[test]
    fn a_run_time_key_is_found_at_its_place_in_the_frame() {
        let frame = |p: &[[u8; 8]]| array_keys(&crate::analysis::program(p), |id| id == LOOKUP);
        let call = i(0x85, 0, 0, 0, LOOKUP as i32);
        // clang's `u32 key = ctx->key`: r1 = *(u32 *)(r1 + 0) ; *(u32 *)(r10 - 4) = r1 ;
        // r2 = r10 ; r2 += -4 ; call
        let key_setup = |r2_off: i32| {
            vec![
                i(0x61, 1, 1, 0, 0),
                i(0x63, 10, 1, -4, 0),
                i(0xbf, 2, 10, 0, 0),
                i(0x07, 2, 0, 0, r2_off),
                call,
                EXIT,
            ]
        };
        assert_eq!(frame(&key_setup(-4)), vec![(4, ArrayKey::Frame(-4))]);
        // Any four bytes inside the frame, written or not (the lookup reads what is there).
        assert_eq!(frame(&key_setup(-512)), vec![(4, ArrayKey::Frame(-512))]);
        // Not wholly inside the frame: its last bytes, above r10, below the frame.
        for off in [-3, 0, 4, -513, -600] {
            assert!(frame(&key_setup(off)).is_empty(), "r10 {off:+}");
        }
        // A constant key is still a constant, and the constant-key list has only those.
        let mut konst = key_setup(-4);
        konst[0] = i(0xb7, 1, 0, 0, 3);
        assert_eq!(frame(&konst), vec![(4, ArrayKey::Const(3))]);
        let p = crate::analysis::program(&key_setup(-4));
        assert!(constant_array_keys(&p, |id| id == LOOKUP).is_empty());
        // r2 forgotten (a joining path, a load, another call before): no place.
        let mut joined = key_setup(-4);
        joined.insert(0, i(0x15, 1, 0, 4, 0)); // if r1 == 0 goto the call
        assert!(frame(&joined).is_empty());
        let mut loaded = key_setup(-4);
        loaded.insert(4, i(0x79, 2, 10, -8, 0));
        assert!(frame(&loaded).is_empty());
        let mut called = key_setup(-4);
        called.insert(4, call);
        assert_eq!(frame(&called), vec![(4, ArrayKey::Frame(-4))]);
    }

    #[test]
    fn a_stored_key_is_forwarded_only_from_a_zero_extended_untouched_register() {
        // clang: r1 = *(u32 *)(r1 + 0) ; *(u32 *)(r10 - 4) = r1 ; r2 = r10 ; r2 += -4 ;
        // r1 = map ll ; call. The lddw is a dead argument, not emitted: r1 still holds the key.
        let clang = vec![
            i(0x61, 1, 1, 0, 0),
            i(0x63, 10, 1, -4, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            i(0x18, 1, 0, 0, 0x1234),
            i(0, 0, 0, 0, 0),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        let fwd = |p: &[[u8; 8]], off: i16| {
            let prog = crate::analysis::program(p);
            let call = prog
                .insts
                .iter()
                .position(|x| matches!(x.op, Op::CallHelper { .. }))
                .unwrap();
            let dead = dead_key_arguments(&prog, call);
            forwarded_key(&prog, call, off, |j| dead.contains(&j))
        };
        assert_eq!(fwd(&clang, -4), Some(1));
        // Another offset than the one stored.
        assert_eq!(fwd(&clang, -8), None);
        // The lddw emitted (not skipped): r1 is the map.
        let prog = crate::analysis::program(&clang);
        assert_eq!(forwarded_key(&prog, 5, -4, |_| false), None);
        let with = |k: usize, x: [u8; 8]| {
            let mut p = clang.clone();
            p[k] = x;
            fwd(&p, -4)
        };
        // An 8-byte store of the same register serves (the key is its low half).
        assert_eq!(with(1, i(0x7b, 10, 1, -4, 0)), Some(1));
        // The upper half not known zero: an 8-byte or sign-extending load, a 32-bit ALU
        // result (RV64 may leave its upper half unwritten), a constant.
        assert_eq!(with(0, i(0x79, 1, 1, 0, 0)), None);
        assert_eq!(with(0, i(0x81, 1, 1, 0, 0)), None);
        assert_eq!(with(0, i(0xbc, 1, 1, 0, 0)), None);
        assert_eq!(with(0, i(0xb7, 1, 0, 0, 3)), None);
        // Narrower unsigned loads zero-extend too; a byte store is not the key.
        assert_eq!(with(0, i(0x71, 1, 1, 0, 0)), Some(1));
        assert_eq!(with(1, i(0x73, 10, 1, -4, 0)), None);
        // Between the store and the call: an emitted write to the register (a load; a dead
        // ALU write is not emitted and leaves it), a store over a byte of the key, a store
        // through another pointer (it may point here), a join.
        assert_eq!(with(2, i(0x61, 1, 10, -8, 0)), None);
        assert_eq!(with(2, i(0x07, 1, 0, 0, 1)), Some(1));
        assert_eq!(with(2, i(0x72, 10, 0, -1, 7)), None);
        assert_eq!(with(2, i(0x72, 3, 0, 0, 7)), None);
        assert_eq!(with(2, i(0x72, 10, 0, -5, 7)), Some(1));
        let mut joined = clang.clone();
        joined.insert(0, i(0x15, 3, 0, 2, 0)); // if r3 == 0 goto pc 3 (r2 = r10)
        assert_eq!(fwd(&joined, -4), None);
        // r0 is the lookup's own result register.
        let mut r0 = clang.clone();
        r0[0] = i(0x61, 0, 1, 0, 0);
        r0[1] = i(0x63, 10, 0, -4, 0);
        assert_eq!(fwd(&r0, -4), None);
    }

    #[test]
    fn facts_end_where_another_path_joins() {
        // if r1 == 0 goto +1 ; *(u32 *)(r10 - 4) = 1 ; pc 2: r2 = r10 ; r2 += -4 ; call
        // The store is skipped on one path into pc 2.
        let p = [
            i(0x62, 10, 0, -4, 2),
            i(0x15, 1, 0, 1, 0),
            i(0x62, 10, 0, -4, 1),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        assert!(keys(&p).is_empty());
        // A conditional branch that does not land inside keeps the facts on its fall-through.
        let fall = [
            i(0x62, 10, 0, -4, 2),
            i(0x15, 1, 0, 4, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
            EXIT,
        ];
        assert_eq!(keys(&fall), vec![(4, 2)]);
    }

    #[test]
    fn arguments_the_expansion_reads_stay_live() {
        // r1 = 1 ; r2 = 2 ; r3 = 3 ; r4 = r3 ; call ; exit
        let p = [
            i(0xb7, 1, 0, 0, 1),
            i(0xb7, 2, 0, 0, 2),
            i(0xb7, 3, 0, 0, 3),
            i(0xbf, 4, 3, 0, 0),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        let prog = crate::analysis::program(&p);
        // An inlined tail call reads only the index, r3.
        assert_eq!(dead_arguments(&prog, 4, 1 << 3), vec![0, 1, 3]);
        // A folded one (a constant index) reads none.
        assert_eq!(dead_arguments(&prog, 4, 0), vec![0, 1, 2, 3]);
        // Reading r4 keeps r3, which it copies, too.
        assert_eq!(dead_arguments(&prog, 4, 1 << 4), vec![0, 1]);
    }

    #[test]
    fn only_argument_setup_nothing_else_reads_is_dead() {
        let dead =
            |p: &[[u8; 8]], call: usize| dead_key_arguments(&crate::analysis::program(p), call);
        // r1 = 7 ; *(u32 *)(r10 - 4) = r1 ; r2 = r10 ; r2 += -4 ; r1 = map ; call
        let p = [
            i(0xb7, 1, 0, 0, 7),
            i(0x63, 10, 1, -4, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            i(0x18, 1, 0, 0, 0x1234),
            i(0, 0, 0, 0, 0),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
        ];
        // The store reads r1 = 7: that write stays; r2 and the map's r1 go.
        assert_eq!(dead(&p, 5), vec![2, 3, 4]);
        // r3 = r2 before the call keeps nothing alive (r3 is dead too); r6 = r2 does.
        let mut copy3 = p.to_vec();
        copy3.insert(6, i(0xbf, 3, 2, 0, 0));
        assert_eq!(dead(&copy3, 6), vec![2, 3, 4, 5]);
        let mut copy6 = p.to_vec();
        copy6.insert(6, i(0xbf, 6, 2, 0, 0));
        assert_eq!(dead(&copy6, 6), vec![4]);
        // A load through r2 keeps it (and its setup) alive.
        let mut load = p.to_vec();
        load.insert(6, i(0x61, 6, 2, 0, 0));
        assert_eq!(dead(&load, 6), vec![4]);
        // A branch between ends the scan: the write before it stays, since its target
        // reads r2.
        let branch = [
            i(0xbf, 2, 10, 0, 0),
            i(0x15, 6, 0, 3, 0), // if r6 == 0 goto pc 5
            i(0x07, 2, 0, 0, -4),
            i(0x85, 0, 0, 0, LOOKUP as i32),
            EXIT,
            i(0xbf, 0, 2, 0, 0), // pc 5: r0 = r2
            EXIT,
        ];
        assert_eq!(dead(&branch, 3), vec![2]);
    }
}
