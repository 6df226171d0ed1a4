//! Random valid, terminating eBPF programs for differential testing, and a minimiser.
//!
//! A program is generated as a small tree ([`Node`]s in [`Func`]s) and encoded to bytecode,
//! so the minimiser can delete or flatten nodes and still produce valid programs.
//!
//! Invariants that make JIT and reference comparable:
//! * every register is written before it is read: prologues initialise r0–r8 (callees
//!   r0 and r6–r8; r1–r5 are their arguments), and every call node re-initialises r1–r5,
//!   which calls clobber;
//! * pointers never reach data: r9 holds the context pointer in the entry function and r10
//!   the frame; neither is ever an ALU/jump/store *value* operand, only a load/store base;
//! * memory accesses are naturally aligned (atomics require it on both targets) and stay in
//!   `[r10-64, r10)` or in the first [`CTX_DATA`] context bytes;
//! * control flow is forward jumps, plus loops `mov rC, n; body; sub rC, 1; jne rC, 0, back`
//!   whose counter (r6–r8) the body never writes (calls preserve r6–r9); local calls only go
//!   to higher-numbered functions (no recursion, bounded depth).
//!
//! At the end the entry function stores r0–r8 and its 64 stack bytes into the context
//! ([`CTX_REGS`], [`CTX_STACK`]), and callees fold their stack and r6–r8 into r0, so the
//! final context and r0 capture registers and stacks of every frame.

use crate::reference::HelperFn;
use packjit_frontend::RawInsn;

/// Context bytes the program reads and writes freely.
pub const CTX_DATA: usize = 128;
/// Where the entry frame's 64 stack bytes are copied at the end.
pub const CTX_STACK: usize = CTX_DATA;
/// Where r0–r8 are stored at the end.
pub const CTX_REGS: usize = CTX_STACK + 64;
/// Total context size.
pub const CTX_LEN: usize = CTX_REGS + 9 * 8;
/// Stack bytes used per frame.
pub const STACK_USED: i16 = 64;
/// Functions per program at most (entry included).
pub const MAX_FUNCS: usize = 4;

/// SplitMix64: small, fast, and reproducible from a seed on every host.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6a09_e667_f3bc_c909)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    /// A random element.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    /// A 32-bit immediate biased towards edge cases.
    pub fn imm32(&mut self) -> i32 {
        match self.below(8) {
            0 => self.pick(&[
                0,
                1,
                -1,
                2,
                i32::MIN,
                i32::MAX,
                0x8000,
                0xffff,
                -0x8000,
                31,
                32,
                63,
                64,
            ]),
            1 => self.below(70) as i32,
            2 => -(self.below(16) as i32),
            _ => self.next_u64() as i32,
        }
    }
    /// A 64-bit value biased towards edge cases.
    pub fn imm64(&mut self) -> u64 {
        match self.below(6) {
            0 => self.pick(&[
                0,
                1,
                u64::MAX,
                1 << 63,
                (1 << 63) - 1,
                0xffff_ffff,
                0x1_0000_0000,
                0x8000_0000,
            ]),
            1 => self.imm32() as i64 as u64,
            _ => self.next_u64(),
        }
    }
}

/// A piece of a generated function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// Straight-line instructions (an `lddw` is two slots).
    Insns(Vec<RawInsn>),
    /// A conditional jump (its `off` is filled in) over `body`.
    If { jmp: RawInsn, body: Vec<Node> },
    /// `mov counter, iters; body; counter -= 1; jne counter, 0, back` (`w32`: 32-bit forms).
    Loop {
        counter: u8,
        iters: i32,
        w32: bool,
        body: Vec<Node>,
    },
    /// `ja`/`ja32` over `body` (dead code that must still compile).
    Skip { wide: bool, body: Vec<Node> },
    /// `call local` to function `func`, then r1–r5 re-initialised with `reinit`.
    CallLocal { func: usize, reinit: [i32; 5] },
}

/// A generated function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Func {
    /// Initial values: entry function r0–r8 (index = register; r9 is the context pointer),
    /// callees r0, r6, r7, r8 (indices 0, 6, 7, 8).
    pub init: [u64; 9],
    /// Initial stack dwords (`[r10-8*(k+1)]`).
    pub stack: [u64; 8],
    /// The body.
    pub body: Vec<Node>,
}

/// A generated program and its initial context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenProgram {
    /// The seed it came from.
    pub seed: u64,
    /// Function 0 is the entry.
    pub funcs: Vec<Func>,
    /// Initial context ([`CTX_LEN`] bytes).
    pub ctx: Vec<u8>,
    /// Instruction budget of every run (escape programs; `None` for the others).
    pub budget: Option<u64>,
}

fn lddw(dst: u8, v: u64) -> [RawInsn; 2] {
    [
        RawInsn::new(0x18, dst, 0, 0, v as u32 as i32),
        RawInsn::new(0, 0, 0, 0, (v >> 32) as u32 as i32),
    ]
}

fn mov_imm(dst: u8, v: i32) -> RawInsn {
    RawInsn::new(0xb7, dst, 0, 0, v)
}

// ---------------------------------------------------------------------------------------
// Helpers shared by the JIT (extern "C"), the reference (same functions) and rbpf (wrappers).

/// Helper 1: mixes all five arguments.
pub extern "C" fn helper_mix(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ b
        ^ c.rotate_left(13)
        ^ d.wrapping_shl(7)
        ^ e.rotate_right(3)
}

/// Helper 2: `(a - b) rotl (c & 63)`.
pub extern "C" fn helper_rot(a: u64, b: u64, c: u64, _d: u64, _e: u64) -> u64 {
    a.wrapping_sub(b).rotate_left((c & 63) as u32)
}

fn rbpf_mix(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    helper_mix(a, b, c, d, e)
}
fn rbpf_rot(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    helper_rot(a, b, c, d, e)
}
fn rbpf_identity(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

/// Helpers generated programs call: `(id, extern "C" fn, rbpf fn)`. Id 5 is the suite's
/// identity helper.
pub fn helpers() -> Vec<(u32, HelperFn, crate::reference::RbpfHelper)> {
    vec![
        (
            1,
            helper_mix as HelperFn,
            rbpf_mix as crate::reference::RbpfHelper,
        ),
        (2, helper_rot, rbpf_rot),
        (5, crate::reference::helper_identity, rbpf_identity),
    ]
}

/// An id no helper has (a `callx` to it stops the program: `Stop::UnknownCallx`).
pub const UNKNOWN_HELPER_ID: i32 = 77;

// ---------------------------------------------------------------------------------------
// Generation

struct Ctx<'a> {
    rng: &'a mut Rng,
    /// Registers the current body may not write (loop counters).
    locked: Vec<u8>,
    /// Entry function: r9 is the context pointer.
    has_ctx: bool,
    /// Only instructions rbpf's interpreter implements with RFC 9669 semantics (see
    /// `reference::rbpf_unsupported`), so rbpf can serve as a second reference.
    classic: bool,
    /// Escape program: also out-of-bounds accesses, wild and null pointers, stack walks,
    /// unknown `callx` ids and budget-exhausting loops (see [`generate_escapes`]).
    escapes: bool,
    func_index: usize,
    funcs: &'a mut Vec<Option<Func>>,
}

impl Ctx<'_> {
    fn dst(&mut self) -> u8 {
        loop {
            let r = self.rng.below(9) as u8;
            if !self.locked.contains(&r) {
                return r;
            }
        }
    }
    fn src(&mut self) -> u8 {
        self.rng.below(9) as u8
    }

    fn body(&mut self, n: usize, depth: usize) -> Vec<Node> {
        (0..n).map(|_| self.node(depth)).collect()
    }

    fn node(&mut self, depth: usize) -> Node {
        if self.escapes && self.rng.chance(1, 16) {
            return self.escape();
        }
        let r = self.rng.below(100);
        match r {
            0..=34 => Node::Insns(vec![self.alu()]),
            35..=38 => {
                let d = self.dst();
                let v = self.rng.imm64();
                Node::Insns(lddw(d, v).to_vec())
            }
            39..=50 => Node::Insns(vec![self.mem_access(false)]),
            51..=57 if self.has_ctx => Node::Insns(vec![self.mem_access(true)]),
            51..=64 if self.classic => Node::Insns(vec![self.alu()]),
            51..=64 => Node::Insns(vec![self.atomic()]),
            65..=73 if depth < 3 => {
                let jmp = self.cond_jump();
                let n = 1 + self.rng.below(5) as usize;
                Node::If {
                    jmp,
                    body: self.body(n, depth + 1),
                }
            }
            74..=77 if depth < 2 => {
                let free: Vec<u8> = [6u8, 7, 8]
                    .into_iter()
                    .filter(|r| !self.locked.contains(r))
                    .collect();
                if free.is_empty() {
                    return Node::Insns(vec![self.alu()]);
                }
                let counter = self.rng.pick(&free);
                self.locked.push(counter);
                let n = 1 + self.rng.below(5) as usize;
                let body = self.body(n, depth + 1);
                self.locked.pop();
                Node::Loop {
                    counter,
                    iters: 1 + self.rng.below(4) as i32,
                    w32: self.rng.chance(1, 2),
                    body,
                }
            }
            78..=79 if depth < 3 => {
                let n = 1 + self.rng.below(3) as usize;
                let wide = !self.classic && self.rng.chance(1, 2);
                Node::Skip {
                    wide,
                    body: self.body(n, depth + 1),
                }
            }
            80..=85 => {
                // Helper call by id, then r1-r5 re-initialised (calls clobber them).
                let id = self.rng.pick(&[1, 2, 5]);
                let mut v = vec![RawInsn::new(0x85, 0, 0, 0, id)];
                v.extend(self.reinit());
                Node::Insns(v)
            }
            86..=92 if self.classic => Node::Insns(vec![self.alu()]),
            86..=88 => {
                // callx: helper id in a register (unknown ids stop the program: escape
                // programs only).
                let r = self.dst();
                let id = self.rng.pick(&[1, 2, 5]);
                let mut v = vec![mov_imm(r, id), RawInsn::new(0x8d, r, 0, 0, 0)];
                v.extend(self.reinit());
                Node::Insns(v)
            }
            89..=92 if self.funcs.len() < MAX_FUNCS && depth < 3 => {
                let func = self.new_func();
                let reinit = [0; 5].map(|_: i32| self.rng.imm32());
                Node::CallLocal { func, reinit }
            }
            _ => Node::Insns(vec![self.alu()]),
        }
    }

    /// One escape attempt. Pointers still never reach data: the scratch register `t` that
    /// holds a computed address is the load's destination or is overwritten right after the
    /// access, and stores never store it. Accesses that may land inside a region are
    /// naturally aligned (atomics must be); the others are out of bounds wherever they are.
    fn escape(&mut self) -> Node {
        let t = self.dst();
        // 0 load, 1 store reg, 2 store imm, 3 atomic (W or DW only).
        let access = self.rng.below(4);
        let sizes: &[(u8, i16)] = if access == 3 {
            &[(0x00, 4), (0x18, 8)]
        } else {
            &[(0x10, 1), (0x08, 2), (0x00, 4), (0x18, 8)]
        };
        let (szbits, size) = self.rng.pick(sizes);
        let overwrite_t = mov_imm(t, self.rng.imm32());
        let kind = self.rng.below(10);
        let mut v = Vec::new();
        let (base, off) = match kind {
            // Just past the context's end (the first offset still fits exactly), or before it.
            0 | 1 if self.has_ctx => {
                let off = if kind == 0 {
                    CTX_LEN as i16 - size + self.rng.below(size as u64 + 8) as i16
                } else {
                    -1 - self.rng.below(16) as i16
                };
                (9, off)
            }
            // Far from the context, relative to it (the address compares as an offset).
            2 if self.has_ctx => {
                v.extend(lddw(
                    t,
                    self.rng
                        .pick(&[1u64 << 12, 1 << 20, 1 << 32, 0xffff_ffff_ffff_f000]),
                ));
                v.push(RawInsn::new(0x0f, t, 9, 0, 0)); // add t, r9
                (t, 0)
            }
            // Below any stack block (at most 8 frames of 512 bytes), or just above the frame
            // (the entry frame's top is the block's end; a callee's is its caller's frame).
            3 => (10, -4096 - size * (1 + self.rng.below(4) as i16)),
            4 => (10, size * self.rng.below(4) as i16),
            // A stack pointer walked k frames down (inside the block or not, by call depth).
            5 => {
                let k = self.rng.below(9) as i32;
                let j = 8 * self.rng.below(64) as i32;
                v.push(RawInsn::new(0xbf, t, 10, 0, 0)); // mov t, r10
                v.push(RawInsn::new(0x07, t, 0, 0, -(512 * k + j) - size as i32)); // add t, -..
                (t, 0)
            }
            // Wild and null pointers.
            6 => {
                v.extend(lddw(
                    t,
                    self.rng.pick(&[
                        0x1000u64,
                        0xdead_0000,
                        0x4000_0000_0000,
                        0xffff_8000_0000_0000,
                        u64::MAX - 7,
                    ]),
                ));
                (t, size * self.rng.below(8) as i16)
            }
            7 => {
                v.push(mov_imm(t, 0));
                (t, size * self.rng.below(8) as i16)
            }
            // A callx to an id nobody registered.
            8 => {
                v.push(mov_imm(t, UNKNOWN_HELPER_ID));
                v.push(RawInsn::new(0x8d, t, 0, 0, 0));
                v.extend(self.reinit());
                return Node::Insns(v);
            }
            // Loops that outlast most budgets: a spin (`ja -1`) or a long counted loop.
            _ => {
                if self.rng.chance(1, 2) {
                    return Node::Insns(vec![RawInsn::new(0x05, 0, 0, -1, 0)]);
                }
                let free: Vec<u8> = [6u8, 7, 8]
                    .into_iter()
                    .filter(|r| !self.locked.contains(r))
                    .collect();
                if free.is_empty() {
                    return Node::Insns(vec![RawInsn::new(0x05, 0, 0, -1, 0)]);
                }
                let counter = self.rng.pick(&free);
                self.locked.push(counter);
                let body = vec![Node::Insns(vec![self.alu()])];
                self.locked.pop();
                return Node::Loop {
                    counter,
                    iters: 1000 + self.rng.below(200_000) as i32,
                    w32: self.rng.chance(1, 2),
                    body,
                };
            }
        };
        // The access: a load into t, a store of data (never t), or an atomic on data.
        let data = loop {
            let r = self.src();
            if r != t {
                break r;
            }
        };
        match access {
            0 => v.push(RawInsn::new(0x61 | szbits, t, base, off, 0)),
            1 => v.push(RawInsn::new(0x63 | szbits, base, data, off, 0)),
            2 => v.push(RawInsn::new(0x62 | szbits, base, 0, off, self.rng.imm32())),
            _ => {
                // Atomics are W or DW; fetching forms write `data` (not a loop counter).
                let dw = size == 8;
                let imm = self.rng.pick(&[0x00, 0x41, 0xa0, 0xe1, 0xf1]);
                let src = if imm & 1 == 1 && imm != 0xf1 {
                    loop {
                        let r = self.dst();
                        if r != t {
                            break r;
                        }
                    }
                } else {
                    data
                };
                v.push(RawInsn::new(
                    if dw { 0xdb } else { 0xc3 },
                    base,
                    src,
                    off,
                    imm,
                ));
            }
        }
        if base == t {
            v.push(overwrite_t);
        }
        Node::Insns(v)
    }

    fn reinit(&mut self) -> Vec<RawInsn> {
        (1..=5).map(|r| mov_imm(r, self.rng.imm32())).collect()
    }

    fn alu(&mut self) -> RawInsn {
        let cls = if self.rng.chance(1, 2) { 0x07 } else { 0x04 };
        let dst = self.dst();
        match self.rng.below(20) {
            0 if self.classic && cls == 0x07 => RawInsn::new(0x84, dst, 0, 0, 0), // neg32 (see rbpf_unsupported)
            0 => RawInsn::new(cls | 0x80, dst, 0, 0, 0),                          // neg
            1 | 2 if self.classic => {
                let opc = self.rng.pick(&[0xd4u8, 0xdc]);
                RawInsn::new(opc, dst, 0, 0, self.rng.pick(&[16, 32, 64]))
            }
            1 => {
                // le/be (ALU class) or bswap (ALU64 class), 16/32/64
                let opc = self.rng.pick(&[0xd4u8, 0xdc, 0xd7]);
                RawInsn::new(opc, dst, 0, 0, self.rng.pick(&[16, 32, 64]))
            }
            2 => {
                let bits = if cls == 0x07 {
                    self.rng.pick(&[8i16, 16, 32])
                } else {
                    self.rng.pick(&[8i16, 16])
                };
                RawInsn::new(cls | 0x08 | 0xb0, dst, self.src(), bits, 0)
            }
            _ => {
                let (code, off) = self.rng.pick(&[
                    (0x00u8, 0i16),
                    (0x10, 0),
                    (0x20, 0),
                    (0x30, 0),
                    (0x30, 1),
                    (0x40, 0),
                    (0x50, 0),
                    (0x60, 0),
                    (0x70, 0),
                    (0x90, 0),
                    (0x90, 1),
                    (0xa0, 0),
                    (0xb0, 0),
                    (0xc0, 0),
                ]);
                // rbpf: no signed division, and mod32 by zero keeps the upper half.
                let (code, off) = if self.classic && (off == 1 || (code == 0x90 && cls == 0x04)) {
                    (0x20, 0)
                } else {
                    (code, off)
                };
                if self.rng.chance(1, 2) {
                    RawInsn::new(cls | 0x08 | code, dst, self.src(), off, 0)
                } else {
                    RawInsn::new(cls | code, dst, 0, off, self.rng.imm32())
                }
            }
        }
    }

    /// A load or store on the stack (`ctx = false`) or the context, naturally aligned.
    fn mem_access(&mut self, ctx: bool) -> RawInsn {
        let (szbits, size) = self
            .rng
            .pick(&[(0x10u8, 1i16), (0x08, 2), (0x00, 4), (0x18, 8)]);
        let (base, off) = if ctx {
            (
                9,
                size * self.rng.below((CTX_DATA as i16 / size) as u64) as i16,
            )
        } else {
            (
                10,
                -size * (1 + self.rng.below((STACK_USED / size) as u64) as i16),
            )
        };
        match self.rng.below(4) {
            0 if size != 8 && !self.classic => {
                RawInsn::new(0x81 | szbits, self.dst(), base, off, 0)
            } // ldxs*
            0 | 1 => RawInsn::new(0x61 | szbits, self.dst(), base, off, 0),
            2 => RawInsn::new(0x63 | szbits, base, self.src(), off, 0),
            _ => RawInsn::new(0x62 | szbits, base, 0, off, self.rng.imm32()),
        }
    }

    fn atomic(&mut self) -> RawInsn {
        let dw = self.rng.chance(1, 2);
        let size: i16 = if dw { 8 } else { 4 };
        let (base, off) = if self.has_ctx && self.rng.chance(1, 2) {
            (
                9,
                size * self.rng.below((CTX_DATA as i16 / size) as u64) as i16,
            )
        } else {
            (
                10,
                -size * (1 + self.rng.below((STACK_USED / size) as u64) as i16),
            )
        };
        let imm = self
            .rng
            .pick(&[0x00, 0x01, 0x40, 0x41, 0x50, 0x51, 0xa0, 0xa1, 0xe1, 0xf1]);
        // Fetching forms write src (cmpxchg writes r0, which is never a loop counter).
        let src = if imm & 1 == 1 && imm != 0xf1 {
            self.dst()
        } else {
            self.src()
        };
        RawInsn::new(if dw { 0xdb } else { 0xc3 }, base, src, off, imm)
    }

    fn cond_jump(&mut self) -> RawInsn {
        let cls = if self.rng.chance(1, 2) { 0x05 } else { 0x06 };
        let code = self.rng.pick(&[
            0x10u8, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0xa0, 0xb0, 0xc0, 0xd0,
        ]);
        let dst = self.src();
        if self.rng.chance(1, 2) {
            RawInsn::new(cls | 0x08 | code, dst, self.src(), 0, 0)
        } else {
            let mut imm = self.rng.imm32();
            // rbpf zero-extends the imm of 64-bit unsigned/equality jumps; RFC 9669
            // sign-extends. Both agree on non-negative values.
            if self.classic
                && cls == 0x05
                && matches!(code, 0x10 | 0x20 | 0x30 | 0x50 | 0xa0 | 0xb0)
            {
                imm &= i32::MAX;
            }
            RawInsn::new(cls | code, dst, 0, 0, imm)
        }
    }

    fn new_func(&mut self) -> usize {
        let idx = self.funcs.len();
        self.funcs.push(None);
        let mut sub = Ctx {
            rng: self.rng,
            locked: Vec::new(),
            has_ctx: false,
            classic: false,
            escapes: self.escapes,
            func_index: idx,
            funcs: self.funcs,
        };
        let mut init = [0u64; 9];
        for r in [0, 6, 7, 8] {
            init[r] = sub.rng.imm64();
        }
        let stack = [0; 8].map(|_: u64| sub.rng.imm64());
        let n = 2 + sub.rng.below(10) as usize;
        let body = sub.body(n, 1);
        let _ = sub.func_index;
        self.funcs[idx] = Some(Func { init, stack, body });
        idx
    }
}

/// Generates the program for `seed`: valid, terminating, in bounds (every access inside the
/// context or `[r10-64, r10)`, every `callx` id registered), so it may run as trusted code.
pub fn generate(seed: u64) -> GenProgram {
    generate_with(seed, false)
}

/// Generates the escape program for `seed` (a different program from [`generate`]'s): the
/// same nodes plus, about one node in sixteen, an escape attempt — an access just past the
/// context's end or before its start, relative to the context but far away, below any stack
/// block or above the frame, through a stack pointer walked frames down, through a wild or a
/// null pointer (loads, stores and atomics) — a `callx` to an unregistered id, a spin
/// (`ja -1`) or a long counted loop; every run has a budget. Only sandboxed code may run it.
pub fn generate_escapes(seed: u64) -> GenProgram {
    generate_with(seed, true)
}

fn generate_with(seed: u64, escapes: bool) -> GenProgram {
    // Escape programs draw from another stream, so seed N gives unrelated programs.
    let mut rng = Rng::new(if escapes {
        seed ^ 0xe5ca_9e00_0000_0000
    } else {
        seed
    });
    let mut funcs: Vec<Option<Func>> = vec![None];
    let init = [0; 9].map(|_: u64| rng.imm64());
    let stack = [0; 8].map(|_: u64| rng.imm64());
    let n = 5 + rng.below(36) as usize;
    let budget = escapes.then(|| rng.pick(&[0, 1, 7, 60, 500, 5_000, 100_000, 1_000_000]));
    let body = {
        // One program in four sticks to rbpf's subset, so rbpf checks the reference too.
        let classic = !escapes && seed % 4 == 3;
        let mut c = Ctx {
            rng: &mut rng,
            locked: Vec::new(),
            has_ctx: true,
            classic,
            escapes,
            func_index: 0,
            funcs: &mut funcs,
        };
        c.body(n, 0)
    };
    funcs[0] = Some(Func { init, stack, body });
    let mut ctx = vec![0u8; CTX_LEN];
    for b in &mut ctx[..CTX_DATA] {
        *b = rng.next_u64() as u8;
    }
    GenProgram {
        seed,
        funcs: funcs
            .into_iter()
            .map(|f| f.expect("every function generated"))
            .collect(),
        ctx,
        budget,
    }
}

// ---------------------------------------------------------------------------------------
// Encoding

struct Enc {
    out: Vec<RawInsn>,
    /// (slot of a `call local`, callee function index)
    calls: Vec<(usize, usize)>,
}

impl Enc {
    fn nodes(&mut self, nodes: &[Node]) {
        for n in nodes {
            self.node(n);
        }
    }

    fn node(&mut self, n: &Node) {
        match n {
            Node::Insns(v) => self.out.extend_from_slice(v),
            Node::If { jmp, body } => {
                let at = self.out.len();
                self.out.push(*jmp);
                self.nodes(body);
                self.out[at].off = (self.out.len() - at - 1) as i16;
            }
            Node::Skip { wide, body } => {
                let at = self.out.len();
                self.out.push(if *wide {
                    RawInsn::new(0x06, 0, 0, 0, 0)
                } else {
                    RawInsn::new(0x05, 0, 0, 0, 0)
                });
                self.nodes(body);
                let d = self.out.len() - at - 1;
                if *wide {
                    self.out[at].imm = d as i32;
                } else {
                    self.out[at].off = d as i16;
                }
            }
            Node::Loop {
                counter,
                iters,
                w32,
                body,
            } => {
                let c = *counter;
                self.out.push(mov_imm(c, *iters));
                let start = self.out.len();
                self.nodes(body);
                // counter -= 1; loop while counter != 0 (64- or 32-bit forms).
                if *w32 {
                    self.out.push(RawInsn::new(0x14, c, 0, 0, 1)); // sub32 c, 1
                    let at = self.out.len();
                    self.out.push(RawInsn::new(
                        0x56,
                        c,
                        0,
                        (start as i64 - at as i64 - 1) as i16,
                        0,
                    ));
                // jne32 c, 0
                } else {
                    self.out.push(RawInsn::new(0x07, c, 0, 0, -1)); // add c, -1
                    let at = self.out.len();
                    self.out.push(RawInsn::new(
                        0x65,
                        c,
                        0,
                        (start as i64 - at as i64 - 1) as i16,
                        0,
                    ));
                    // jsgt c, 0
                }
            }
            Node::CallLocal { func, reinit } => {
                self.calls.push((self.out.len(), *func));
                self.out.push(RawInsn::new(0x85, 0, 1, 0, 0));
                for (k, v) in reinit.iter().enumerate() {
                    self.out.push(mov_imm(k as u8 + 1, *v));
                }
            }
        }
    }

    fn prologue(&mut self, f: &Func, entry: bool) {
        if entry {
            self.out.push(RawInsn::new(0xbf, 9, 1, 0, 0)); // mov r9, r1: the context pointer
        }
        let regs: &[usize] = if entry {
            &[0, 1, 2, 3, 4, 5, 6, 7, 8]
        } else {
            &[0, 6, 7, 8]
        };
        for &r in regs {
            let v = f.init[r];
            if v as i64 == v as i32 as i64 {
                self.out.push(mov_imm(r as u8, v as i32));
            } else {
                self.out.extend(lddw(r as u8, v));
            }
        }
        for (k, &v) in f.stack.iter().enumerate() {
            let off = -8 * (k as i16 + 1);
            if v as i64 == v as i32 as i64 {
                self.out.push(RawInsn::new(0x7a, 10, 0, off, v as i32)); // stdw
            } else {
                // Through r1 (entry) / r1 (callee: an argument, saved/restored around).
                let tmp = if entry { 1 } else { 0 };
                let saved = if entry { f.init[1] } else { f.init[0] };
                self.out.extend(lddw(tmp, v));
                self.out.push(RawInsn::new(0x7b, 10, tmp, off, 0));
                if saved as i64 == saved as i32 as i64 {
                    self.out.push(mov_imm(tmp, saved as i32));
                } else {
                    self.out.extend(lddw(tmp, saved));
                }
            }
        }
    }

    fn epilogue(&mut self, entry: bool) {
        if entry {
            for r in 0..9u8 {
                self.out.push(RawInsn::new(
                    0x7b,
                    9,
                    r,
                    (CTX_REGS + 8 * r as usize) as i16,
                    0,
                ));
            }
            for k in 0..8i16 {
                self.out.push(RawInsn::new(0x79, 1, 10, -8 * (k + 1), 0));
                self.out
                    .push(RawInsn::new(0x7b, 9, 1, CTX_STACK as i16 + 8 * k, 0));
            }
        } else {
            // r0 = r0 * 31 + slot, for each stack slot and r6-r8: the callee's state shows.
            for k in 0..8i16 {
                self.out.push(RawInsn::new(0x79, 1, 10, -8 * (k + 1), 0));
                self.out.push(RawInsn::new(0x27, 0, 0, 0, 31));
                self.out.push(RawInsn::new(0x0f, 0, 1, 0, 0));
            }
            for r in 6..=8u8 {
                self.out.push(RawInsn::new(0x27, 0, 0, 0, 31));
                self.out.push(RawInsn::new(0x0f, 0, r, 0, 0));
            }
        }
        self.out.push(RawInsn::new(0x95, 0, 0, 0, 0));
    }
}

fn called_funcs(nodes: &[Node], out: &mut Vec<usize>) {
    for n in nodes {
        match n {
            Node::CallLocal { func, .. } => out.push(*func),
            Node::If { body, .. } | Node::Loop { body, .. } | Node::Skip { body, .. } => {
                called_funcs(body, out)
            }
            Node::Insns(_) => {}
        }
    }
}

impl GenProgram {
    /// The bytecode.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc {
            out: Vec::new(),
            calls: Vec::new(),
        };
        // Emit only functions still called (the minimiser may have removed calls).
        let mut live = vec![false; self.funcs.len()];
        live[0] = true;
        for i in 0..self.funcs.len() {
            if live[i] {
                let mut c = Vec::new();
                called_funcs(&self.funcs[i].body, &mut c);
                for f in c {
                    live[f] = true;
                }
            }
        }
        let mut starts = vec![usize::MAX; self.funcs.len()];
        for (i, f) in self.funcs.iter().enumerate() {
            if !live[i] {
                continue;
            }
            starts[i] = e.out.len();
            e.prologue(f, i == 0);
            e.nodes(&f.body);
            e.epilogue(i == 0);
        }
        for &(slot, func) in &e.calls {
            e.out[slot].imm = (starts[func] as i64 - slot as i64 - 1) as i32;
        }
        e.out.iter().flat_map(|i| i.to_bytes()).collect()
    }

    /// Number of nodes (for reporting minimisation).
    pub fn size(&self) -> usize {
        fn count(ns: &[Node]) -> usize {
            ns.iter()
                .map(|n| match n {
                    Node::If { body, .. } | Node::Loop { body, .. } | Node::Skip { body, .. } => {
                        1 + count(body)
                    }
                    _ => 1,
                })
                .sum()
        }
        self.funcs.iter().map(|f| count(&f.body)).sum()
    }

    /// Every program one deletion or flattening smaller.
    fn shrinks(&self) -> Vec<GenProgram> {
        let mut out = Vec::new();
        for fi in 0..self.funcs.len() {
            let mut paths = Vec::new();
            collect_paths(&self.funcs[fi].body, &mut Vec::new(), &mut paths);
            for path in paths {
                // Delete the node.
                let mut p = self.clone();
                edit(&mut p.funcs[fi].body, &path, |v, i| {
                    v.remove(i);
                });
                out.push(p);
                // Replace a compound node by its body.
                let mut p = self.clone();
                let mut changed = false;
                edit(&mut p.funcs[fi].body, &path, |v, i| {
                    if let Node::If { body, .. }
                    | Node::Loop { body, .. }
                    | Node::Skip { body, .. } = v[i].clone()
                    {
                        v.splice(i..=i, body);
                        changed = true;
                    }
                });
                if changed {
                    out.push(p);
                }
            }
        }
        out
    }
}

fn collect_paths(nodes: &[Node], prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    for (i, n) in nodes.iter().enumerate() {
        prefix.push(i);
        out.push(prefix.clone());
        if let Node::If { body, .. } | Node::Loop { body, .. } | Node::Skip { body, .. } = n {
            collect_paths(body, prefix, out);
        }
        prefix.pop();
    }
}

fn edit(nodes: &mut Vec<Node>, path: &[usize], f: impl FnOnce(&mut Vec<Node>, usize)) {
    if path.len() == 1 {
        f(nodes, path[0]);
        return;
    }
    if let Node::If { body, .. } | Node::Loop { body, .. } | Node::Skip { body, .. } =
        &mut nodes[path[0]]
    {
        edit(body, &path[1..], f);
    }
}

/// Greedy minimisation: keep applying the first shrink for which `fails` still holds, until
/// none does (or `budget` candidate checks are spent).
pub fn minimise(
    prog: &GenProgram,
    mut fails: impl FnMut(&GenProgram) -> bool,
    budget: usize,
) -> GenProgram {
    let mut cur = prog.clone();
    let mut spent = 0;
    'outer: loop {
        for cand in cur.shrinks() {
            if spent >= budget {
                break 'outer;
            }
            spent += 1;
            if fails(&cand) {
                cur = cand;
                continue 'outer;
            }
        }
        break;
    }
    cur
}

// ---------------------------------------------------------------------------------------
// Differential execution

/// What a run leaves behind: r0 and the whole context (registers and stack dumped into it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Final r0.
    pub r0: u64,
    /// Final context bytes.
    pub ctx: Vec<u8>,
}

impl Observed {
    /// Describes how `other` differs from `self`.
    pub fn diff(&self, other: &Observed) -> String {
        let mut s = String::new();
        if self.r0 != other.r0 {
            s.push_str(&format!("r0 {:#x} vs {:#x}; ", self.r0, other.r0));
        }
        for (k, (a, b)) in self.ctx.chunks(8).zip(other.ctx.chunks(8)).enumerate() {
            if a != b {
                let off = 8 * k;
                let what = if off >= CTX_REGS {
                    format!("r{}", (off - CTX_REGS) / 8)
                } else if off >= CTX_STACK {
                    format!("stack [r10-{}]", 64 - (off - CTX_STACK))
                } else {
                    format!("ctx[{off}..{}]", off + 8)
                };
                s.push_str(&format!("{what}: {:02x?} vs {:02x?}; ", a, b));
            }
        }
        s
    }
}

/// The reference evaluator with the generator's helpers.
pub fn reference() -> crate::reference::Reference {
    let mut r = crate::reference::Reference::new();
    for (id, f, _) in helpers() {
        r = r.with_helper(id, f);
    }
    r
}

/// Runs `code` in the reference on a copy of `ctx`.
pub fn run_reference(code: &[u8], ctx: &[u8]) -> Result<Observed, String> {
    let mut c = ctx.to_vec();
    let o = reference().run(code, &mut c).map_err(|e| e.to_string())?;
    Ok(Observed { r0: o.r0, ctx: c })
}

/// `code` compiled by the optimizing tier (sandboxed, or trusted; no budget) and run on a copy
/// of `ctx`, against the reference on another: r0 and the context after the run must agree.
/// `what` names the case in a failure (its seed and source, say).
///
/// # Safety
/// Trusted (`sandboxed` false), `code` must touch no memory but `ctx` and its stack (as
/// the reference run of the same code shows for these inputs).
pub unsafe fn check_optimized_against_reference(
    rt: &packjit::Runtime,
    code: &[u8],
    ctx: &[u8],
    sandboxed: bool,
    what: &str,
) {
    let want = run_reference(code, ctx).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    let opts = packjit::LoadOptions {
        tier: packjit::Tier::Optimized,
        budget: packjit::Budget::Unlimited,
        ..packjit::LoadOptions::default()
    };
    let prog = if sandboxed {
        rt.load(code, &opts)
    } else {
        // SAFETY: the caller's contract.
        unsafe { rt.load_trusted(code, &opts) }
    }
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut got_ctx = ctx.to_vec();
    let r0 = prog
        .call(&mut got_ctx)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        (r0, &got_ctx),
        (want.r0, &want.ctx),
        "{what}, sandboxed: {sandboxed}: r0/context differ from the interpreter"
    );
}

/// Runs `code` in rbpf on a copy of `ctx`, when rbpf supports every instruction.
pub fn run_rbpf(code: &[u8], ctx: &[u8]) -> Option<Result<Observed, String>> {
    let mut c = ctx.to_vec();
    let table: Vec<(u32, crate::reference::RbpfHelper)> =
        helpers().into_iter().map(|(id, _, f)| (id, f)).collect();
    let r = crate::reference::run_rbpf(code, &mut c, &table)?;
    Some(r.map(|r0| Observed { r0, ctx: c }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_programs_verify_and_terminate_in_the_reference() {
        let mut rbpf_checked = 0;
        for seed in 0..400 {
            let p = generate(seed);
            let code = p.encode();
            let r = run_reference(&code, &p.ctx).unwrap_or_else(|e| {
                panic!(
                    "seed {seed}: {e}\n{}",
                    crate::disasm::disassemble(&code, true)
                )
            });
            if let Some(b) = run_rbpf(&code, &p.ctx) {
                rbpf_checked += 1;
                let b = b.unwrap_or_else(|e| panic!("seed {seed}: rbpf: {e}"));
                assert_eq!(r, b, "seed {seed}: reference vs rbpf: {}", r.diff(&b));
            }
        }
        assert!(rbpf_checked >= 80, "{rbpf_checked}");
    }

    #[test]
    fn escape_programs_verify_and_stop_in_every_way_in_the_reference() {
        use std::collections::BTreeMap;
        let mut ends: BTreeMap<String, usize> = BTreeMap::new();
        let mut faults = (0, 0); // (reads, writes)
        for seed in 0..600 {
            let p = generate_escapes(seed);
            assert!(p.budget.is_some());
            let code = p.encode();
            let r = run_reference_sandboxed(&code, &p).unwrap_or_else(|e| {
                panic!(
                    "seed {seed}: {e}\n{}",
                    crate::disasm::disassemble(&code, true)
                )
            });
            let key = match &r.end {
                End::Exit(_) => "exit".to_string(),
                End::Stop(s) => {
                    match s {
                        Stop::OutOfBounds { write: false, .. } => faults.0 += 1,
                        Stop::OutOfBounds { write: true, .. } => faults.1 += 1,
                        _ => {}
                    }
                    format!("{:?}", s.kind())
                }
            };
            *ends.entry(key).or_default() += 1;
        }
        println!("escape ends over 600 seeds: {ends:?}, faults (read, write) {faults:?}");
        for (k, min) in [
            ("exit", 40),
            ("OutOfBounds", 150),
            ("Budget", 40),
            ("UnknownCallx", 15),
        ] {
            assert!(ends.get(k).copied().unwrap_or(0) >= min, "{k}: {ends:?}");
        }
        assert!(faults.0 >= 30 && faults.1 >= 30, "{faults:?}");
        // The in-bounds generator never escapes.
        assert_eq!(generate(5).budget, None);
    }

    #[test]
    fn generation_is_deterministic_and_varied() {
        assert_eq!(generate(7), generate(7));
        assert_ne!(generate(7).encode(), generate(8).encode());
        let with_calls = (0..200).filter(|&s| generate(s).funcs.len() > 1).count();
        assert!(with_calls > 20, "{with_calls}");
    }

    #[test]
    fn minimiser_keeps_the_failure_and_shrinks() {
        // "Failure": the program contains a 32-bit sdiv. The minimum is that one node.
        let has_sdiv32 = |p: &GenProgram| {
            p.encode()
                .chunks(8)
                .any(|c| c[0] & 0xf7 == 0x34 && c[2] == 1)
        };
        let seed = (0..1000)
            .find(|&s| has_sdiv32(&generate(s)) && generate(s).size() > 10)
            .unwrap();
        let p = generate(seed);
        let m = minimise(&p, has_sdiv32, 10_000);
        assert!(has_sdiv32(&m));
        assert_eq!(m.size(), 1, "{:?}", m.funcs[0].body);
        run_reference(&m.encode(), &m.ctx).unwrap();
    }
}

/// A differential mismatch, already minimised.
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// The seed of the original program.
    pub seed: u64,
    /// What differed (on the minimised program).
    pub what: String,
    /// The minimised program.
    pub minimised: GenProgram,
    /// Node count before minimisation.
    pub original_size: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = self.minimised.encode();
        writeln!(
            f,
            "differential mismatch, seed {:#x} (rerun: PACKJIT_DIFF_SEED={:#x} PACKJIT_DIFF_COUNT=1)",
            self.seed, self.seed
        )?;
        writeln!(
            f,
            "minimised from {} to {} nodes: {}",
            self.original_size,
            self.minimised.size(),
            self.what
        )?;
        writeln!(
            f,
            "initial context: {:02x?}",
            &self.minimised.ctx[..CTX_DATA]
        )?;
        if let Some(b) = self.minimised.budget {
            writeln!(f, "budget: {b} (escape program: PACKJIT_DIFF_ESCAPES)")?;
        }
        write!(f, "{}", crate::disasm::disassemble(&code, true))
    }
}

/// Outcome of checking one program against an engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// JIT and reference agree (and rbpf, when `rbpf` is true).
    Agree { rbpf: bool },
    /// The engine compiled it but cannot run it here.
    CompiledOnly { rbpf: bool },
}

fn compare_once(
    engine: &dyn crate::conformance::Engine,
    p: &GenProgram,
) -> Result<Checked, String> {
    let code = p.encode();
    let want = run_reference(&code, &p.ctx).map_err(|e| format!("reference failed: {e}"))?;
    let rbpf = match run_rbpf(&code, &p.ctx) {
        None => false,
        Some(Ok(b)) if b == want => true,
        Some(Ok(b)) => return Err(format!("reference vs rbpf: {}", want.diff(&b))),
        Some(Err(e)) => return Err(format!("rbpf failed: {e}")),
    };
    let mut loaded = engine
        .load(&code)
        .map_err(|e| format!("JIT rejected a valid program: {e}"))?;
    let mut ctx = p.ctx.clone();
    match loaded.run(&mut ctx) {
        None => Ok(Checked::CompiledOnly { rbpf }),
        Some(Err(e)) => Err(format!("JIT run failed: {e}")),
        Some(Ok(r0)) => {
            let got = Observed { r0, ctx };
            if got == want {
                Ok(Checked::Agree { rbpf })
            } else {
                Err(format!("reference vs JIT: {}", want.diff(&got)))
            }
        }
    }
}

/// Checks the program of `seed` on `engine` against the references; on a mismatch, minimises
/// it (keeping "still mismatches") and returns the report.
pub fn check_seed(
    engine: &dyn crate::conformance::Engine,
    seed: u64,
) -> Result<Checked, Box<Mismatch>> {
    let p = generate(seed);
    match compare_once(engine, &p) {
        Ok(c) => Ok(c),
        Err(_) => {
            let m = minimise(&p, |c| compare_once(engine, c).is_err(), 5_000);
            let what = compare_once(engine, &m).err().unwrap_or_default();
            Err(Box::new(Mismatch {
                seed,
                what,
                minimised: m,
                original_size: p.size(),
            }))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sandboxed differential execution: escapes, budgets, stops

use packjit::{Error as JitError, ErrorKind, LoadOptions, RunError, Runtime, Stop, StopKind};

/// Bytes of unallocated-to-the-program slack on each side of the context in differential
/// runs: addresses near the context (before it, just past it, a page away) then fall into
/// memory the harness owns rather than into whatever the allocator put next to it (the
/// interpreter's stack block lives on the heap too), so they are out of bounds on both sides
/// for the same reason. 2 MiB, more than the ±1 MiB window in which `stops_agree` compares
/// fault addresses relative to the context: the interpreter's stack block is then never
/// inside that window (natively on x86-64 it was, 170 KiB from the context, and its
/// stack-relative faults were compared as context-relative ones).
pub const CTX_GUARD: usize = 2 << 20;

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The program returned r0.
    Exit(u64),
    /// The program was stopped (out of bounds, budget, unknown `callx`).
    Stop(Stop),
}

/// What a sandboxed run leaves behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxRun {
    /// How it ended.
    pub end: End,
    /// The context afterwards (writes before a stop included).
    pub ctx: Vec<u8>,
    /// Where the context was during the run (to compare faults relative to it).
    pub ctx_addr: u64,
    /// Where the stack block was, when known (the interpreter's; JIT code does not say).
    pub stack: Option<std::ops::Range<u64>>,
}

/// Runs `f` on a copy of `ctx` placed inside [`CTX_GUARD`] bytes on each side.
/// The buffer is allocated once per thread (a fresh 4 MiB mapping per run would cost more
/// than the run); only the context part is ever handed out.
fn guarded<R>(ctx: &[u8], f: impl FnOnce(&mut [u8]) -> R) -> (R, Vec<u8>, u64) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| {
        let mut buf = b.borrow_mut();
        buf.resize(CTX_GUARD + ctx.len() + CTX_GUARD, 0);
        let c = &mut buf[CTX_GUARD..CTX_GUARD + ctx.len()];
        c.copy_from_slice(ctx);
        let addr = c.as_ptr() as u64;
        let r = f(c);
        (r, c.to_vec(), addr)
    })
}

/// Runs `code` in the interpreter with the program's budget, as sandboxed JIT code would run.
pub fn run_reference_sandboxed(code: &[u8], p: &GenProgram) -> Result<SandboxRun, String> {
    run_reference_code(code, &p.ctx, p.budget)
}

/// [`run_reference_sandboxed`] for bytecode with its context and budget.
fn run_reference_code(code: &[u8], ctx: &[u8], budget: Option<u64>) -> Result<SandboxRun, String> {
    let r = reference();
    let prog = r.interp.load(code).map_err(|e| e.to_string())?;
    let budget = budget.or(r.budget);
    let ((res, stack), ctx, ctx_addr) = guarded(ctx, |c| r.interp.run_traced(&prog, c, budget));
    Ok(SandboxRun {
        end: match res {
            Ok(o) => End::Exit(o.r0),
            Err(stop) => End::Stop(stop),
        },
        ctx,
        ctx_addr,
        stack: Some(stack),
    })
}

/// A runtime compiling for one arch and feature set, trusted or sandboxed.
pub struct JitTarget<'r> {
    /// The runtime (backends and the generator's helpers).
    pub rt: &'r Runtime,
    /// Arch and features (`budget` is set per program).
    pub opts: LoadOptions,
}

impl JitTarget<'_> {
    /// For messages.
    pub fn label(&self) -> String {
        use crate::conformance::Engine;
        crate::conformance::RuntimeEngine {
            rt: self.rt,
            opts: self.opts.clone(),
        }
        .label()
    }

    /// `Err(why)` when the backend refuses sandboxed code with a budget (a backend that does
    /// not implement `PJ_COMPILE_SANDBOX`/`PJ_COMPILE_BUDGET` yet reports `Unsupported`).
    pub fn sandbox_supported(&self) -> Result<(), String> {
        let exit0 = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
        match self.load(&exit0, true, Some(1)) {
            Ok(_) => Ok(()),
            Err(e) if e.kind == ErrorKind::Unsupported => Err(e.to_string()),
            Err(e) => panic!(
                "{}: a trivial sandboxed program failed to load: {e}",
                self.label()
            ),
        }
    }

    /// Loads `code` sandboxed, or trusted. Trusted loads are only made for [`generate`]'s
    /// programs, which stay in bounds by construction.
    pub fn load(
        &self,
        code: &[u8],
        sandboxed: bool,
        budget: Option<u64>,
    ) -> Result<packjit::Program, JitError> {
        // `None`: no counting at all (the reference runs without a budget too), not the
        // runtime's default budget for sandboxed loads.
        let opts = LoadOptions {
            budget: budget.map_or(packjit::Budget::Unlimited, packjit::Budget::Limit),
            ..self.opts.clone()
        };
        if sandboxed {
            self.rt.load(code, &opts)
        } else {
            // SAFETY: callers load trusted only programs from `generate`, whose accesses stay
            // inside the context and `[r10-64, r10)` and whose `callx` ids are registered
            // (see the module docs); the differential then checks the JIT keeps them there.
            unsafe { self.rt.load_trusted(code, &opts) }
        }
    }

    /// The target as a conformance [`Engine`](crate::conformance::Engine) for in-bounds
    /// programs (trusted or sandboxed, no budget).
    pub fn engine(&self, sandboxed: bool) -> ModeEngine<'_, '_> {
        ModeEngine {
            target: self,
            sandboxed,
        }
    }
}

/// [`JitTarget`] in one mode, as an [`Engine`](crate::conformance::Engine).
pub struct ModeEngine<'t, 'r> {
    target: &'t JitTarget<'r>,
    sandboxed: bool,
}

impl crate::conformance::Engine for ModeEngine<'_, '_> {
    fn label(&self) -> String {
        format!(
            "{} {}",
            self.target.label(),
            if self.sandboxed {
                "sandboxed"
            } else {
                "trusted"
            }
        )
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn crate::conformance::Loaded + 'a>, String> {
        let p = self
            .target
            .load(code, self.sandboxed, None)
            .map_err(|e| e.to_string())?;
        Ok(Box::new(p))
    }
}

/// How an escape program ended on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EscapeChecked {
    /// Both returned the same r0 and context.
    Finished,
    /// Both stopped with this kind at the same pc (and address, where meaningful), with the
    /// same context.
    Stopped(StopKind),
    /// The target compiled it but cannot run it here (foreign arch).
    CompiledOnly,
}

/// Do two stops agree? Kind and pc always; for memory, size and direction, and the address
/// exactly (wild and null pointers) or relative to the context (accesses near it). An address
/// relative to the stack block cannot be compared (JIT code does not report where its block
/// was), so when the reference's fault lies within 64 KiB of its own stack block (`want_stack`)
/// and the JIT's is not a context-relative address, kind, pc, size and direction decide.
fn stops_agree(
    want: &Stop,
    want_ctx: u64,
    want_stack: Option<&std::ops::Range<u64>>,
    got: &Stop,
    got_ctx: u64,
) -> Result<(), String> {
    if (want.kind(), want.pc()) != (got.kind(), got.pc()) {
        return Err(format!(
            "stop {:?} at pc {} vs {:?} at pc {} ({want} vs {got})",
            want.kind(),
            want.pc(),
            got.kind(),
            got.pc()
        ));
    }
    let (
        &Stop::OutOfBounds {
            addr: want_addr,
            size: want_size,
            write: want_write,
            ..
        },
        &Stop::OutOfBounds {
            addr: got_addr,
            size: got_size,
            write: got_write,
            ..
        },
    ) = (want, got)
    else {
        return Ok(());
    };
    if (want_size, want_write) != (got_size, got_write) {
        return Err(format!("fault {want:?} vs {got:?}"));
    }
    const SLACK: u64 = 1 << 16;
    let near_ctx = |a: u64, ctx: u64| {
        a.wrapping_sub(ctx).wrapping_add(SLACK) < SLACK + (CTX_LEN as u64) + SLACK
    };
    let stack_relative = want_stack.is_some_and(|s| {
        want_addr >= s.start.saturating_sub(SLACK) && want_addr < s.end.saturating_add(SLACK)
    }) && !near_ctx(got_addr, got_ctx);
    let same = want_addr == got_addr
        || want_addr.wrapping_sub(want_ctx) == got_addr.wrapping_sub(got_ctx)
        || stack_relative;
    if same {
        Ok(())
    } else {
        Err(format!(
            "fault address {want_addr:#x} (context {want_ctx:#x}) vs {got_addr:#x} (context \
             {got_ctx:#x})"
        ))
    }
}

fn compare_escape(target: &JitTarget<'_>, p: &GenProgram) -> Result<EscapeChecked, String> {
    compare_sandboxed(target, &p.encode(), &p.ctx, p.budget)
}

/// Runs `code` sandboxed on `target` and in the reference, on copies of `ctx`, and compares
/// how they end (see [`EscapeChecked`]).
fn compare_sandboxed(
    target: &JitTarget<'_>,
    code: &[u8],
    ctx: &[u8],
    budget: Option<u64>,
) -> Result<EscapeChecked, String> {
    let want =
        run_reference_code(code, ctx, budget).map_err(|e| format!("reference rejected it: {e}"))?;
    let prog = target
        .load(code, true, budget)
        .map_err(|e| format!("JIT rejected a valid program: {e}"))?;
    if !prog.is_executable() {
        return Ok(EscapeChecked::CompiledOnly);
    }
    let (res, ctx, ctx_addr) = guarded(ctx, |c| prog.call(c));
    let got = SandboxRun {
        end: match res {
            Ok(r0) => End::Exit(r0),
            Err(RunError::Stop(s)) => End::Stop(s),
            Err(e) => return Err(format!("JIT run failed: {e}")),
        },
        ctx,
        ctx_addr,
        stack: None,
    };
    let memory = |what: &str| {
        let a = Observed {
            r0: 0,
            ctx: want.ctx.clone(),
        };
        let b = Observed {
            r0: 0,
            ctx: got.ctx.clone(),
        };
        format!("{what}; context differs: {}", a.diff(&b))
    };
    match (&want.end, &got.end) {
        (End::Exit(a), End::Exit(b)) => {
            let (a, b) = (
                Observed {
                    r0: *a,
                    ctx: want.ctx.clone(),
                },
                Observed {
                    r0: *b,
                    ctx: got.ctx.clone(),
                },
            );
            if a == b {
                Ok(EscapeChecked::Finished)
            } else {
                Err(format!("reference vs JIT: {}", a.diff(&b)))
            }
        }
        (End::Stop(a), End::Stop(b)) => {
            stops_agree(a, want.ctx_addr, want.stack.as_ref(), b, got.ctx_addr)
                .map_err(|e| format!("reference vs JIT: {e}"))?;
            if want.ctx != got.ctx {
                return Err(memory(&format!("both stopped ({a})")));
            }
            Ok(EscapeChecked::Stopped(a.kind()))
        }
        (End::Exit(r0), End::Stop(e)) => {
            Err(format!("reference returned r0 = {r0:#x}, JIT stopped: {e}"))
        }
        (End::Stop(e), End::Exit(r0)) => Err(format!(
            "reference stopped ({e}), JIT returned r0 = {r0:#x}"
        )),
    }
}

/// Checks the escape program of `seed` ([`generate_escapes`]) sandboxed on `target` against
/// the interpreter; on a mismatch, minimises it and returns the report.
pub fn check_escape_seed(
    target: &JitTarget<'_>,
    seed: u64,
) -> Result<EscapeChecked, Box<Mismatch>> {
    let p = generate_escapes(seed);
    match compare_escape(target, &p) {
        Ok(c) => Ok(c),
        Err(_) => {
            let m = minimise(&p, |c| compare_escape(target, c).is_err(), 5_000);
            let what = compare_escape(target, &m).err().unwrap_or_default();
            Err(Box::new(Mismatch {
                seed,
                what,
                minimised: m,
                original_size: p.size(),
            }))
        }
    }
}

/// Checks the walk program of `seed` ([`walk_program`]) sandboxed on `target` against the
/// interpreter; every other seed also counts a budget (with a charge at each back-edge, the
/// clamp redoes the loop's compare), one that may run out inside the loop. `Err` names the
/// seed, the difference and the program, disassembled.
pub fn check_walk_seed(target: &JitTarget<'_>, seed: u64) -> Result<EscapeChecked, String> {
    let code = walk_program(seed);
    let budget = (seed % 2 == 1).then_some(seed / 2 % 1500);
    compare_sandboxed(target, &code, &[0x5a; 16], budget).map_err(|what| {
        format!(
            "walk seed {seed:#x}: {what}\n{}",
            crate::disasm::disassemble(&code, true)
        )
    })
}

#[cfg(test)]
mod sandbox_tests {
    use super::*;

    fn oob(pc: usize, addr: u64, write: bool) -> Stop {
        Stop::OutOfBounds {
            pc,
            addr,
            size: 4,
            write,
        }
    }

    #[test]
    fn stops_compare_kind_pc_fault_and_address_where_meaningful() {
        let (c1, c2) = (0x10_0000, 0x90_0000);
        let stack = 0x7000_0000..0x7000_1000;
        let agree = |a: &Stop, b: &Stop| stops_agree(a, c1, Some(&stack), b, c2);
        // Same absolute (wild) address; same offset from the context.
        assert!(agree(&oob(3, 0x1000, true), &oob(3, 0x1000, true)).is_ok());
        assert!(agree(&oob(3, c1 + 264, false), &oob(3, c2 + 264, false)).is_ok());
        // Off by one from the context's end, another pc, another direction: caught.
        assert!(agree(&oob(3, c1 + 264, false), &oob(3, c2 + 265, false)).is_err());
        assert!(agree(&oob(3, 0x1000, true), &oob(4, 0x1000, true)).is_err());
        assert!(agree(&oob(3, 0x1000, true), &oob(3, 0x1000, false)).is_err());
        // Near the reference's stack block (stack-relative): kind, pc, size and direction.
        assert!(agree(&oob(3, 0x7000_1000, true), &oob(3, 1 << 45, true)).is_ok());
        // Elsewhere, a differing address is a mismatch.
        assert!(agree(&oob(3, 1 << 46, true), &oob(3, 1 << 45, true)).is_err());
        let budget = |pc| Stop::Budget { pc };
        assert!(agree(&budget(9), &budget(9)).is_ok());
        assert!(agree(&budget(9), &budget(8)).is_err());
        assert!(agree(&budget(9), &oob(9, 0, false)).is_err());
    }
}

/// A valid program of about `n` slots in `functions` subprograms, for compile-time scaling
/// benchmarks (not for running: its loops are not meant to terminate quickly). Every function
/// repeats ALU work, a stack store, a load through r1 (the context in the entry function, an
/// unknown pointer in the others, so the sandbox's access analysis has work everywhere, as
/// in programs that read their context or a map value), a forward and a backward conditional
/// jump, and calls the next function: the shapes whose analyses or branch fixing could go
/// quadratic. The ALU immediates cycle through 0..251 whatever the size, so every size
/// lowers the same instruction mix (immediates that grew with the program took arm64 and
/// RV64 an extra constant-building instruction at 1 M, not at 1 k).
pub fn sized_program(n: usize, functions: usize) -> Vec<u8> {
    let per = (n / functions.max(1)).max(8);
    let mut out = Vec::with_capacity(n * 8);
    let mut push = |opc: u8, dst: u8, src: u8, off: i16, imm: i32| {
        out.extend_from_slice(
            &RawInsn {
                opc,
                dst,
                src,
                off,
                imm,
            }
            .to_bytes(),
        );
    };
    for f in 0..functions.max(1) {
        let last = f + 1 == functions.max(1);
        for k in 0..per - 4 {
            match k % 6 {
                0 => push(0x07, 1, 0, 0, (k % 251) as i32), // add r1, k mod 251
                1 => push(0x7b, 10, 1, -8, 0),              // stxdw [r10-8], r1
                2 => push(0x61, 2, 1, 0, 0),                // ldxw r2, [r1+0]
                3 => push(0x0f, 0, 2, 0, 0),                // add r0, r2
                4 => push(0x55, 0, 0, 1, 7),                // jne r0, 7, +1
                _ => push(0xa5, 1, 0, -2, 1_000_000_000),   // jlt r1, 1e9, -2 (back-edge)
            }
        }
        if last {
            push(0xb7, 0, 0, 0, 0);
            push(0xb7, 0, 0, 0, 1);
        } else {
            push(0xb7, 1, 0, 0, 1);
            push(0x85, 0, 1, 0, 2); // call the next function (it starts after our exit)
        }
        push(0xb7, 0, 0, 0, 0);
        push(0x95, 0, 0, 0, 0);
    }
    out
}

/// A program generator's random choices: `rnd(n)` is in `0..n`, from a xorshift stream
/// seeded by `seed` scrambled with `mix` (a generator may pick its own, to draw a stream
/// unrelated to another's from the same seed).
fn seeded_choices(seed: u64, mix: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed.wrapping_mul(mix) | 1;
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// A random program for the sandbox's check groups: context accesses (and masked, provable
/// stack accesses, and context accesses off a second base, checked one by one) off one base
/// register, with a context length that may cut through the group. Half of them run the
/// accesses in a loop of 1–3 iterations, whose back-edge re-enters the group past its check
/// (`ranges::reentries`) unless the loop also moves the base. Returns the bytecode and the
/// context length to run it with. The backends' group differentials run these against the
/// reference: r0, the context bytes, and on a stop its pc, address, size and direction must
/// agree.
pub fn group_program(seed: u64) -> (Vec<u8>, usize) {
    use packjit_frontend::encode_insn as ins;
    let mut rnd = seeded_choices(seed, 0x9e37_79b9_7f4a_7c15);
    let mov = |d: u8, s: u8| ins(0xbf, d, s, 0, 0);
    let addi = |d: u8, i: i32| ins(0x07, d, 0, 0, i);
    let mut p = vec![ins(0xb7, 0, 0, 0, 0)];
    // The base: the context start, start + constant, start + masked length, or a copy.
    let base = match rnd(4) {
        0 => 1,
        1 => {
            p.push(mov(6, 1));
            p.push(addi(6, rnd(24) as i32));
            6
        }
        2 => {
            p.push(mov(6, 2));
            p.push(ins(0x57, 6, 0, 0, 15)); // r6 &= 15
            p.push(ins(0x0f, 6, 1, 0, 0)); // r6 += r1
            6
        }
        _ => {
            p.push(mov(7, 1));
            7
        }
    };
    // A second base into the context, r5 = r1 + 0..8 (r1 itself when it is not the first):
    // its accesses keep the group open, each with its own check (`ranges::keeps_group_open`).
    let other = if base == 1 {
        p.push(mov(5, 1));
        p.push(addi(5, rnd(8) as i32));
        5
    } else {
        1
    };
    let looped = rnd(2) == 0;
    // For a third of the bases past the context start, offsets in [-16, 24): groups that
    // reach below their base (`ranges::GROUP_BELOW`), out of bounds below the context
    // for some seeds. Taken from the seed, not `rnd`, so the other choices stay as they were.
    let below = if base == 6 && (seed >> 3) % 3 == 0 {
        16
    } else {
        0
    };
    if looped {
        p.push(ins(0xb7, 4, 0, 0, 1 + rnd(3) as i32)); // r4 = iterations
    }
    let head = p.len();
    let sizes = [0x00u8, 0x08, 0x10, 0x18]; // W, H, B, DW
                                            // In a third of the programs, after some members, `if r0 > k goto exit`: groups that a
                                            // jump may leave early (`ranges::exits_early`), taken or not depending on the bytes
                                            // read. Also from the seed, not `rnd`. The jumps' offsets are set once `exit` is placed.
    let branchy = (seed >> 5) % 3 == 0;
    let mut exits = Vec::new();
    for k in 0..2 + rnd(6) {
        if branchy && k > 0 && (seed >> (8 + k)) & 1 != 0 {
            exits.push(p.len());
            p.push(ins(0x25, 0, 0, 0, ((seed >> (16 + 8 * k)) & 0x3ff) as i32));
        }
        let size = sizes[rnd(4) as usize];
        let off = rnd(40) as i16 - below;
        match rnd(8) {
            0 => p.push(ins(0x63 | size, base, 0, off, 0)),
            1 => p.push(ins(0x62 | size, base, 0, off, rnd(1000) as i32)),
            2 => {
                // A masked index into the frame: proven, no check, and off another base, so
                // an open group stays open across it (`ranges::keeps_group_open`).
                p.push(mov(8, 0));
                p.push(ins(0x57, 8, 0, 0, 0x1f8));
                p.push(mov(9, 10));
                p.push(addi(9, -512));
                p.push(ins(0x0f, 9, 8, 0, 0));
                p.push(ins(0x7b, 9, 0, 0, 0));
                if (seed >> 2) % 5 == 0 {
                    // In a fifth of the programs (from the seed), the proven load reloads
                    // the group's base moved 128 bytes on, past the context's end: that
                    // must end the group, and the later members stop out of bounds (a
                    // group kept open would read them unchecked off the moved base).
                    p.push(mov(3, base));
                    p.push(addi(3, 128));
                    p.push(ins(0x7b, 9, 3, 0, 0));
                    p.push(ins(0x79, base, 9, 0, 0));
                } else {
                    p.push(ins(0x79, 3, 9, 0, 0));
                    p.push(ins(0x0f, 0, 3, 0, 0));
                }
            }
            3 if size != 0x10 => {
                // A load and its byte swap (fused into one MOVBE load when available).
                p.push(ins(0x61 | size, 3, base, off, 0));
                let bits = match size {
                    0x08 => 16,
                    0x00 => 32,
                    _ => 64,
                };
                p.push(ins(0xdc, 3, 0, 0, bits));
                p.push(ins(0x0f, 0, 3, 0, 0));
            }
            7 => {
                // Off the second base, within or past a short context: a load or a store,
                // checked alone whichever copy of the group runs.
                let off = rnd(48) as i16;
                if rnd(3) == 0 {
                    p.push(ins(0x62 | size, other, 0, off, rnd(1000) as i32));
                } else {
                    p.push(ins(0x61 | size, 3, other, off, 0));
                    p.push(ins(0x0f, 0, 3, 0, 0));
                }
            }
            _ => {
                p.push(ins(0x61 | size, 3, base, off, 0));
                p.push(ins(0x0f, 0, 3, 0, 0)); // r0 += r3
            }
        }
    }
    if looped {
        if rnd(4) == 0 {
            // Move the base: every iteration is checked anew.
            p.push(addi(base, 8 * rnd(3) as i32));
        }
        p.push(ins(0x17, 4, 0, 0, 1)); // r4 -= 1
        let back = head as i64 - (p.len() as i64 + 1);
        p.push(ins(0x55, 4, 0, back as i16, 0)); // if r4 != 0 goto head
    }
    for &j in &exits {
        let off = (p.len() - j - 1) as i16;
        p[j][2..4].copy_from_slice(&off.to_le_bytes());
    }
    p.push(ins(0x95, 0, 0, 0, 0));
    (p.concat(), 1 + rnd(56) as usize)
}

/// Whether one of `plan`'s check groups stays open across an access off another base
/// (`ranges::keeps_group_open`): `(proven, checked)`, for one proven in bounds and for one
/// checked on its own. The group differentials count both, so that a generator change that
/// stops producing them is noticed.
pub fn group_spans(plan: &packjit_frontend::ranges::AccessPlan) -> (bool, bool) {
    use packjit_frontend::ranges::AccessCheck;
    let across = |proven: bool| {
        plan.groups.iter().any(|g| {
            (g.first..g.last).any(|i| {
                plan.group_of(i).is_none()
                    && match plan.checks[i] {
                        AccessCheck::NotAccess => false,
                        AccessCheck::None => proven,
                        _ => !proven,
                    }
            })
        })
    };
    (across(true), across(false))
}

/// A random loop walking a pointer through the context, whose bounds only the run time
/// knows (`packjit_frontend::walks::Guard`): the pointer starts at or near the context
/// start, the bound is the context's end (from r2, the length), that end less a little, or
/// the start plus a constant, the step is a power of two or not, and the exit test is of
/// every kind; loads and stores through the pointer at small offsets (some negative, some
/// past the step), sometimes an early exit. Also returns the context length to run it with
/// (0 to 300 bytes, some not a multiple of the step): the entry guard passes for many seeds
/// and fails for many (the checked copy then runs, and must stop exactly where the reference
/// does).
pub fn ctx_walk_program(seed: u64) -> (Vec<u8>, usize) {
    use packjit_frontend::encode_insn as ins;
    let mut rnd = seeded_choices(seed, 0x9e37_79b9_7f4a_7c15);
    let len = [0, 1, 7, 8, 16, 24, 64, 64, 100, 256, 256, 300][rnd(12) as usize];
    let mut p = vec![ins(0xb7, 0, 0, 0, 0)];
    let start = [0, 0, 0, 8, 3, 16, 64][rnd(7) as usize];
    p.push(ins(0xbf, 3, 1, 0, 0)); // r3 = r1 + start
    p.push(ins(0x07, 3, 0, 0, start));
    let bound = match rnd(3) {
        0 => {
            p.push(ins(0x0f, 2, 1, 0, 0)); // r2 = r1 + len (the context's end)
            2
        }
        1 => {
            p.push(ins(0x0f, 2, 1, 0, 0)); // r2 = end - tail
            p.push(ins(0x07, 2, 0, 0, -(rnd(9) as i32)));
            2
        }
        _ => {
            p.push(ins(0xbf, 7, 1, 0, 0)); // r7 = r1 + constant
            p.push(ins(0x07, 7, 0, 0, [8, 64, 256, 512][rnd(4) as usize]));
            7
        }
    };
    let step = [1, 2, 4, 8, 8, 8, 16, 3, 64][rnd(9) as usize];
    let head = p.len();
    let sizes = [0x00u8, 0x08, 0x10, 0x18]; // W, H, B, DW
    let access = |p: &mut Vec<[u8; 8]>, rnd: &mut dyn FnMut(u64) -> u64| {
        let size = sizes[rnd(4) as usize];
        let off = [0, 0, 0, 1, 4, -1, -8, 8, 12][rnd(9) as usize];
        match rnd(4) {
            0 => p.push(ins(0x62 | size, 3, 0, off, rnd(100) as i32)), // *(r3 + off) = imm
            1 => p.push(ins(0x63 | size, 3, 0, off, 0)),               // *(r3 + off) = r0
            _ => {
                p.push(ins(0x61 | size, 4, 3, off, 0)); // r4 = *(r3 + off)
                p.push(ins(0xaf, 0, 4, 0, 0)); // r0 ^= r4
                p.push(ins(0x27, 0, 0, 0, 0x1b3)); // r0 *= 0x1b3
            }
        }
    };
    for _ in 0..1 + rnd(2) {
        access(&mut p, &mut rnd);
    }
    if rnd(3) == 0 {
        p.push(ins(0xbf, 5, 4, 0, 0)); // r5 = r4 (one caller-saved register less)
    }
    close_walk(&mut p, &mut rnd, &access, head, bound, step, 1 << 30);
    p.push(ins(0xb7, 0, 0, 0, 7)); // out: r0 = 7
    p.push(ins(0x95, 0, 0, 0, 0));
    (p.concat(), len)
}

/// A generated walk's access through r3: pushes its instructions, choosing with the random
/// source it is given.
type PushAccess<'a> = dyn Fn(&mut Vec<[u8; 8]>, &mut dyn FnMut(u64) -> u64) + 'a;

/// Ends a generated walk over r3 (random choices from `rnd`): sometimes an early exit
/// (`if r0 > exit_above`, which leaves the loop, so the walk stays provable), `r3 += step`,
/// sometimes one more `access` after the step (through a shadow register its offset moves by
/// the step), the back-edge to `head` with an exit test of every kind (`!=` in both operand
/// orders, `<`, `>`, `<=`, `>=` against `bound`), then `exit`. The early exit lands past
/// that `exit`, at whatever the caller adds next.
fn close_walk(
    p: &mut Vec<[u8; 8]>,
    rnd: &mut dyn FnMut(u64) -> u64,
    access: &PushAccess<'_>,
    head: usize,
    bound: u8,
    step: i32,
    exit_above: i32,
) {
    use packjit_frontend::encode_insn as ins;
    let early_exit = (rnd(4) == 0).then(|| {
        p.push(ins(0x25, 0, 0, 0, exit_above)); // if r0 > exit_above goto out (patched below)
        p.len() - 1
    });
    p.push(ins(0x07, 3, 0, 0, step)); // r3 += step
    if rnd(3) == 0 {
        access(p, rnd);
    }
    let back = head as i64 - (p.len() as i64 + 1);
    let (op, dst, src) = match rnd(6) {
        0 => (0x5d, 3, bound), // r3 != bound
        1 => (0x5d, bound, 3),
        2 => (0xad, 3, bound), // r3 < bound
        3 => (0x2d, bound, 3), // bound > r3
        4 => (0xbd, 3, bound), // r3 <= bound
        _ => (0x3d, bound, 3), // bound >= r3
    };
    p.push(ins(op, dst, src, back as i16, 0));
    p.push(ins(0x95, 0, 0, 0, 0));
    if let Some(at) = early_exit {
        p[at] = ins(0x25, 0, 0, (p.len() - at - 1) as i16, exit_above);
    }
}

/// Checks the context walk of `seed` ([`ctx_walk_program`]) sandboxed on `target` against
/// the interpreter, every third seed with a budget. `Err` names the seed, the difference and
/// the program, disassembled.
pub fn check_ctx_walk_seed(target: &JitTarget<'_>, seed: u64) -> Result<EscapeChecked, String> {
    let (code, len) = ctx_walk_program(seed);
    let ctx: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(37) ^ 0x5a)
        .collect();
    let budget = (seed % 3 == 2).then_some(seed / 3 % 2000);
    compare_sandboxed(target, &code, &ctx, budget).map_err(|what| {
        format!(
            "context walk seed {seed:#x} (len {len}): {what}\n{}",
            crate::disasm::disassemble(&code, true)
        )
    })
}

/// A random loop walking a pointer through the stack frame, for the walked-pointer proofs
/// (`packjit_frontend::walks`): a start near the frame's bottom, a step, a bound (r10 or
/// near it) and an exit test of every kind the analysis knows (and some it does not), with
/// loads and stores through the pointer at small offsets and sometimes an early exit. Many
/// walks are provable; many step over their bound or reach past the frame, and then the
/// checks must stop them exactly where the reference does. The frame is filled first, so
/// the loads read known values. Returns the bytecode; the backends' walk differentials run
/// it against the reference (r0, or the stop's pc, address, size and direction).
pub fn walk_program(seed: u64) -> Vec<u8> {
    use packjit_frontend::encode_insn as ins;
    let mut rnd = seeded_choices(seed, 0x2545_f491_4f6c_dd1d);
    let mut p = vec![ins(0xb7, 0, 0, 0, 0)];
    // Fill the frame: r10 - 8k = k * 3 + 1.
    for k in 1..=64i16 {
        p.push(ins(0x7a, 10, 0, -8 * k, k as i32 * 3 + 1));
    }
    let start = -[512, 512, 504, 520, 256, 8][rnd(6) as usize] - rnd(3) as i32 * 8;
    let step = [1, 2, 4, 8, 8, 8, 16, 24, 64, 128][rnd(10) as usize];
    p.push(ins(0xbf, 3, 10, 0, 0)); // r3 = r10 + start
    p.push(ins(0x07, 3, 0, 0, start));
    // The bound: r10 itself, r7 = r10 + a small offset, or r7 = r10 - a length only the
    // run time knows (from the context; the walk is then guarded, not proven).
    let bound = match rnd(3) {
        0 => 10,
        1 => {
            p.push(ins(0xbf, 7, 10, 0, 0));
            p.push(ins(0x07, 7, 0, 0, -(rnd(5) as i32) * 8));
            7
        }
        _ => {
            p.push(ins(0x71, 5, 1, 0, 0)); // r5 = *(u8 *)r1 (0x5a)
            p.push(ins(0xa7, 5, 0, 0, rnd(1024) as i32)); // r5 ^= k
            if rnd(3) != 0 {
                p.push(ins(0x57, 5, 0, 0, 0x1f8)); // r5 &= 0x1f8
            }
            p.push(ins(0xbf, 7, 10, 0, 0)); // r7 = r10 - r5
            p.push(ins(0x1f, 7, 5, 0, 0));
            7
        }
    };
    let head = p.len();
    let sizes = [0x00u8, 0x08, 0x10, 0x18]; // W, H, B, DW
    let access = |p: &mut Vec<[u8; 8]>, rnd: &mut dyn FnMut(u64) -> u64| {
        let size = sizes[rnd(4) as usize];
        let off = rnd(24) as i16 - 8;
        match rnd(4) {
            0 => p.push(ins(0x62 | size, 3, 0, off, rnd(100) as i32)), // *(r3 + off) = imm
            1 => p.push(ins(0x63 | size, 3, 0, off, 0)),               // *(r3 + off) = r0
            _ => {
                p.push(ins(0x61 | size, 4, 3, off, 0)); // r4 = *(r3 + off)
                p.push(ins(0x0f, 0, 4, 0, 0)); // r0 += r4
            }
        }
    };
    for _ in 0..1 + rnd(3) {
        access(&mut p, &mut rnd);
    }
    // Which caller-saved registers the loop keeps busy, so the clamp's shadow register
    // (`Walk::shadow`) varies: r1 free, r1 taken (r2 or, when the early exit reads r2, r5),
    // or all taken (the clamp goes back in place).
    match rnd(3) {
        0 => {}
        1 => p.push(ins(0xbf, 1, 4, 0, 0)), // r1 = r4
        _ => {
            p.push(ins(0xbf, 1, 4, 0, 0)); // r1 = r4
            p.push(ins(0xb7, 2, 0, 0, 7)); // r2 = 7
            p.push(ins(0xbf, 5, 0, 0, 0)); // r5 = r0
        }
    }
    // Its early exit's target reads r2.
    close_walk(&mut p, &mut rnd, &access, head, bound, step, 1 << 20);
    p.push(ins(0x0f, 0, 2, 0, 0)); // out: r0 += r2 (the context length)
    p.push(ins(0x95, 0, 0, 0, 0));
    p.concat()
}

/// A random loop stepping a pointer down the frame while a second register counts the
/// iterations down to 0, for the counted walks (`packjit_frontend::walks::Counter`), as
/// clang leaves an insertion sort's inner loop: `r6 = r10 + start`, `r7 = j₀` (both
/// sometimes from the context, so only the run time knows them), then a body with loads and
/// stores through r6 at small offsets around one `r7 += -1` and one `r6 -= step`, sometimes
/// an early exit, and `if r7 != 0 goto head`. Half the loops are entered by a jump from
/// below (the setup after the loop), as clang lays out a nested loop. Many walks stay in the
/// frame; others start with a count of 0 (which wraps and walks off the frame), count
/// further than the frame reaches, or start too high or too low, and must stop exactly where
/// the reference does. Some seeds break a counted walk's shape (a step of 3, the counter
/// stepped by 2, the pointer written twice) and must stay checked. The frame is filled first
/// so the loads read known values. Returns the bytecode and a 16-byte context (byte 0 the
/// count, byte 1 the start's distance below r10 in 8-byte units, when taken from it).
pub fn counted_walk_program(seed: u64) -> (Vec<u8>, Vec<u8>) {
    use packjit_frontend::encode_insn as ins;
    let mut rnd = seeded_choices(seed, 0x94d0_49bb_1331_11eb);
    let mut ctx = vec![0u8; 16];
    ctx[0] = [0, 1, 2, 5, 20, 63, 64, 70, 130, 200][rnd(10) as usize];
    ctx[1] = [0, 1, 8, 31, 32, 33, 40, 63, 64, 65][rnd(10) as usize];
    let mut p = vec![ins(0xb7, 0, 0, 0, 0)];
    for k in 1..=64i16 {
        p.push(ins(0x7a, 10, 0, -8 * k, k as i32 * 5 + 2)); // *(u64 *)(r10 - 8k) = 5k + 2
    }
    let step = [1, 2, 4, 4, 4, 8, 8, 16, 64, 3][rnd(10) as usize];
    let setup = |p: &mut Vec<[u8; 8]>, rnd: &mut dyn FnMut(u64) -> u64| {
        if rnd(2) == 0 {
            p.push(ins(0x71, 7, 1, 0, 0)); // r7 = *(u8 *)(r1 + 0)
        } else {
            p.push(ins(0xb7, 7, 0, 0, ctx[0] as i32)); // r7 = count
        }
        p.push(ins(0xbf, 6, 10, 0, 0)); // r6 = r10
        if rnd(2) == 0 {
            p.push(ins(0x71, 5, 1, 1, 0)); // r5 = *(u8 *)(r1 + 1)
            p.push(ins(0x67, 5, 0, 0, 3)); // r5 <<= 3
            p.push(ins(0x1f, 6, 5, 0, 0)); // r6 -= r5
        } else {
            p.push(ins(0x07, 6, 0, 0, -8 * ctx[1] as i32)); // r6 += -8 · ctx[1]
        }
    };
    let by_jump = rnd(2) == 0;
    let entry_jump = if by_jump {
        p.push(ins(0x05, 0, 0, 0, 0)); // goto setup (patched below)
        Some(p.len() - 1)
    } else {
        setup(&mut p, &mut rnd);
        if rnd(3) == 0 {
            // A context walk that runs once (its bound is its start), which its guard sends
            // to the checked copy: the copy rejoins right at the counted walk's head, and
            // must go through its guard too.
            p.push(ins(0xbf, 8, 1, 0, 0)); // r8 = r1
            p.push(ins(0xbf, 9, 1, 0, 0)); // r9 = r1
            p.push(ins(0x71, 4, 8, 0, 0)); // r4 = *(u8 *)(r8 + 0)
            p.push(ins(0x0f, 0, 4, 0, 0)); // r0 += r4
            p.push(ins(0x07, 8, 0, 0, 1)); // r8 += 1
            p.push(ins(0xad, 8, 9, -4, 0)); // if r8 < r9 goto r4 = …
        }
        None
    };
    let head = p.len();
    let sizes = [0x00u8, 0x08, 0x10, 0x18]; // W, H, B, DW
    let access = |p: &mut Vec<[u8; 8]>, rnd: &mut dyn FnMut(u64) -> u64| {
        let size = sizes[rnd(4) as usize];
        let off = rnd(32) as i16 - 16;
        match rnd(3) {
            0 => p.push(ins(0x63 | size, 6, 0, off, 0)), // *(r6 + off) = r0
            _ => {
                p.push(ins(0x61 | size, 4, 6, off, 0)); // r4 = *(r6 + off)
                p.push(ins(0x0f, 0, 4, 0, 0)); // r0 += r4
            }
        }
    };
    let mut early_exits = Vec::new();
    for k in 0..4 {
        // At least one access (first), so every loop ends: in the frame or past it.
        for _ in 0..rnd(2).max((k == 0) as u64) {
            access(&mut p, &mut rnd);
        }
        if rnd(6) == 0 {
            p.push(ins(0x25, 0, 0, 0, 1 << 30)); // if r0 > 2^30 goto out (patched below)
            early_exits.push(p.len() - 1);
        }
        match k {
            1 => {
                let by = if rnd(12) == 0 { -2 } else { -1 };
                p.push(ins(0x07, 7, 0, 0, by)); // r7 += -1
            }
            2 => {
                p.push(ins(0x07, 6, 0, 0, -step)); // r6 -= step
                if rnd(12) == 0 {
                    p.push(ins(0x07, 6, 0, 0, 0)); // r6 += 0: a second write
                }
            }
            _ => {}
        }
    }
    let back = head as i64 - (p.len() as i64 + 1);
    p.push(ins(0x55, 7, 0, back as i16, 0)); // if r7 != 0 goto head
    let out = p.len();
    p.push(ins(0x0f, 0, 7, 0, 0)); // out: r0 += r7
    p.push(ins(0x95, 0, 0, 0, 0));
    for at in early_exits {
        p[at] = ins(0x25, 0, 0, (out - at - 1) as i16, 1 << 30);
    }
    if let Some(at) = entry_jump {
        let setup_at = p.len();
        p[at] = ins(0x05, 0, 0, (setup_at - at - 1) as i16, 0);
        setup(&mut p, &mut rnd);
        let back = head as i64 - (p.len() as i64 + 1);
        p.push(ins(0x05, 0, 0, back as i16, 0)); // goto head
    }
    (p.concat(), ctx)
}

/// Checks the counted walk of `seed` ([`counted_walk_program`]) sandboxed on `target`
/// against the interpreter, every third seed with a budget. `Err` names the seed, the
/// difference and the program, disassembled.
pub fn check_counted_walk_seed(target: &JitTarget<'_>, seed: u64) -> Result<EscapeChecked, String> {
    let (code, ctx) = counted_walk_program(seed);
    let budget = (seed % 3 == 1).then_some(seed / 3 % 3000);
    compare_sandboxed(target, &code, &ctx, budget).map_err(|what| {
        format!(
            "counted walk seed {seed:#x} (ctx {:?}): {what}\n{}",
            &ctx[..2],
            crate::disasm::disassemble(&code, true)
        )
    })
}

/// Instructions in each function of [`long_function_program`]: enough hot code (well over
/// the backends' 128 KiB island span) for cold code islands inside every function.
pub const LONG_FUNCTION: usize = 24_000;

/// A program of two long functions for the backends' cold code islands
/// (`packjit_frontend::cold`): every access goes through a pointer the analysis cannot
/// bound (the frame pointer minus 64 plus a context word, 0 at run time), copied afresh
/// before each access so that no two share a check group: each has a cold side of its own,
/// and the functions are long enough that this cold code lands in islands inside them, some
/// with their own copies of the region scan and the stop path. Each access's inline
/// context test fails at run time and its cold side, in an island, finds the stack.
/// Depending on `seed`, one access 4 KiB past the pointer stops the program in the entry
/// function (before or after the call), in the callee, or nowhere (r0 then sums what was
/// stored and loaded). Run it with a 16-byte zeroed context.
pub fn long_function_program(seed: u64) -> Vec<u8> {
    use packjit_frontend::encode_insn as ins;
    // Which body (0: entry before the call, 1: entry after it, 2: callee) stops, and where.
    let stop_in = match seed % 4 {
        0 => None,
        k => Some((
            (k - 1) as usize,
            (seed / 4 % 997) as usize * (LONG_FUNCTION / 2) / 997,
        )),
    };
    // r7 = r10 - 64 + (a context word in `word`), r8 = 0: the pointer and the running sum.
    let pointer = |code: &mut Vec<[u8; 8]>, word: u8| {
        code.push(ins(0xbf, 7, 10, 0, 0)); // mov r7, r10
        code.push(ins(0x07, 7, 0, 0, -64)); // add r7, -64
        code.push(ins(0x0f, 7, word, 0, 0)); // add r7, r<word>
        code.push(ins(0xb7, 8, 0, 0, 0)); // mov r8, 0
    };
    let body = |code: &mut Vec<[u8; 8]>, which: usize| {
        for k in 0..LONG_FUNCTION / 2 {
            if stop_in == Some((which, k)) {
                code.push(ins(0x61, 2, 7, 4096, 0)); // ldxw r2, [r7+4096]: outside everything
            }
            let off = (k % 15 * 4) as i16;
            code.push(match k % 5 {
                0 | 2 => ins(0xbf, 3, 7, 0, 0), // mov r3, r7
                1 => ins(0x63, 3, 8, off, 0),   // stxw [r3+off], r8
                3 => ins(0x61, 2, 3, off, 0),   // ldxw r2, [r3+off]
                _ => ins(0x0f, 8, 2, 0, 0),     // add r8, r2
            });
        }
    };
    // Entry: r6 = ctx[8..16]; the pointer; half its body; call the callee with r6; the
    // other half; r0 = r8 + what the callee returned.
    let mut code = vec![ins(0x79, 6, 1, 8, 0)]; // ldxdw r6, [r1+8]
    pointer(&mut code, 6);
    body(&mut code, 0);
    code.push(ins(0xbf, 1, 6, 0, 0)); // mov r1, r6
    let call_at = code.len();
    code.push([0; 8]); // the call, once the callee's place is known
    code.push(ins(0xbf, 9, 0, 0, 0)); // mov r9, r0
    body(&mut code, 1);
    code.push(ins(0xbf, 0, 8, 0, 0)); // mov r0, r8
    code.push(ins(0x0f, 0, 9, 0, 0)); // add r0, r9
    code.push(ins(0x95, 0, 0, 0, 0)); // exit
    let callee = code.len();
    code[call_at] = ins(0x85, 0, 1, 0, (callee - call_at - 1) as i32); // call callee
    pointer(&mut code, 1);
    body(&mut code, 2);
    code.push(ins(0xbf, 0, 8, 0, 0)); // mov r0, r8
    code.push(ins(0x95, 0, 0, 0, 0)); // exit
    code.concat()
}

/// Checks [`long_function_program`] of `seed` sandboxed on `target` against the
/// interpreter (r0, or the stop's kind, pc, address, size and direction).
pub fn check_long_function_seed(
    target: &JitTarget<'_>,
    seed: u64,
) -> Result<EscapeChecked, String> {
    let code = long_function_program(seed);
    compare_sandboxed(target, &code, &[0; 16], None)
        .map_err(|what| format!("long-function seed {seed:#x}: {what}"))
}

/// A random loop indexing the context (`c = p[i]` for `i` up to the length), for the
/// index-bounded accesses (`packjit_frontend::indexes`): the index starts at 0, a small
/// constant, a context byte, the length, the length less 3 (wrapping when shorter), or
/// all ones; the bound is r2 (the length), a copy of it, the length plus 1 (one byte too
/// many), the length less 2, or a constant; the test is at the top (exit edge) or at the
/// bottom (continue edge), in every direction and operand order, off by one (`i <= len`),
/// 64 or 32 bits; sometimes the length is tested non-zero first, sometimes the index is
/// written between the test and the access, sometimes the length register is. Loads and
/// stores through `r1 + i` at small offsets and every size. Also returns the context length
/// to run it with (0 to 300 bytes). Many accesses are proven and many are not; every run
/// must end as the reference's does (r0, the context bytes, or the stop's pc and address).
pub fn index_walk_program(seed: u64) -> (Vec<u8>, usize) {
    use packjit_frontend::encode_insn as ins;
    let mut rnd = seeded_choices(seed, 0x2545_f491_4f6c_dd1d);
    let len = [0, 1, 2, 3, 7, 8, 9, 16, 64, 100, 255, 300][rnd(12) as usize];
    let mut p = vec![ins(0xb7, 0, 0, 0, 0)]; // r0 = 0
                                             // Patched to jump to `out` once its place is known.
    let mut to_out = Vec::new();
    if rnd(3) == 0 {
        to_out.push(p.len());
        p.push(ins(0x15, 2, 0, 0, 0)); // if r2 == 0 goto out
    }
    match rnd(10) {
        0 => p.push(ins(0x71, 4, 1, 0, 0)), // r4 = *(u8 *)(r1 + 0): attacker-chosen
        1 => p.push(ins(0xbf, 4, 2, 0, 0)), // r4 = len
        2 => {
            p.push(ins(0xbf, 4, 2, 0, 0)); // r4 = len - 3 (wraps when shorter)
            p.push(ins(0x07, 4, 0, 0, -3));
        }
        3 => p.push(ins(0xb7, 4, 0, 0, -1)), // r4 = all ones
        4 => p.push(ins(0xb7, 4, 0, 0, rnd(4) as i32)),
        _ => p.push(ins(0xb7, 4, 0, 0, 0)),
    }
    let bound: u8 = match rnd(10) {
        0 => {
            p.push(ins(0xbf, 6, 2, 0, 0)); // r6 = len
            6
        }
        1 => {
            p.push(ins(0x07, 2, 0, 0, 1)); // len + 1: one byte too many
            2
        }
        2 => {
            p.push(ins(0xbf, 6, 2, 0, 0)); // r6 = len - 2
            p.push(ins(0x07, 6, 0, 0, -2));
            6
        }
        3 => {
            p.push(ins(0xb7, 6, 0, 0, [4, 16, 64][rnd(3) as usize])); // a constant
            6
        }
        _ => 2,
    };
    let wide = rnd(6) != 0;
    let class = if wide { 0x05 } else { 0x06 };
    let step = [1, 1, 1, 2, 4][rnd(5) as usize];
    let sizes = [0x10u8, 0x10, 0x10, 0x08, 0x00, 0x18]; // B, B, B, H, W, DW
    let body = |p: &mut Vec<[u8; 8]>, rnd: &mut dyn FnMut(u64) -> u64, with_ptr: bool| {
        match if with_ptr { rnd(14) } else { 13 } {
            0 => p.push(ins(0x07, 4, 0, 0, 1)), // the index written after its test
            1 => p.push(ins(0xbf, 4, 0, 0, 0)), // r4 = r0
            2 => p.push(ins(0xbf, 2, 0, 0, 0)), // the length register written: r2 = r0
            _ => {}
        }
        let (ptr, idx_first) = (5u8, rnd(8) != 0);
        if !with_ptr {
        } else if idx_first {
            p.push(ins(0xbf, ptr, 1, 0, 0)); // r5 = r1; r5 += r4
            p.push(ins(0x0f, ptr, 4, 0, 0));
        } else {
            p.push(ins(0xbf, ptr, 4, 0, 0)); // r5 = r4; r5 += r1
            p.push(ins(0x0f, ptr, 1, 0, 0));
        }
        if rnd(6) == 0 {
            p.push(ins(0x07, ptr, 0, 0, [1, -1, 2][rnd(3) as usize])); // r5 += c
        }
        for _ in 0..1 + rnd(2) {
            let size = sizes[rnd(6) as usize];
            let off = [0, 0, 0, 0, 0, 0, 1, 2, 3, -1][rnd(10) as usize];
            if rnd(4) == 0 {
                p.push(ins(0x63 | size, ptr, 0, off, 0)); // *(r5 + off) = r0
            } else {
                p.push(ins(0x61 | size, 8, ptr, off, 0)); // r8 = *(r5 + off)
                p.push(ins(0xaf, 0, 8, 0, 0)); // r0 ^= r8
                p.push(ins(0x27, 0, 0, 0, 0x1b3)); // r0 *= 0x1b3
            }
        }
        p.push(ins(0x07, 4, 0, 0, step)); // i += step
    };
    // (op, dst, src): the continue test `i < bound` in every spelling, or off by one.
    let continue_test = |rnd: &mut dyn FnMut(u64) -> u64| match rnd(10) {
        0 => (0xad, 4, bound), // i < b
        1 => (0x2d, bound, 4), // b > i
        2 => (0xbd, 4, bound), // i <= b: one too many
        3 => (0x3d, bound, 4), // b >= i: one too many
        4 => (0x5d, 4, bound), // i != b
        5 => (0xcd, 4, bound), // i s< b
        _ => (0xad, 4, bound),
    };
    let negate = |op: u8| match op {
        0xad => 0x3d, // !(i < b): i >= b
        0x2d => 0xbd, // !(b > i): b <= i
        0xbd => 0x2d, // !(i <= b): i > b
        0x3d => 0xad, // !(b >= i): b < i
        0x5d => 0x1d, // !(i != b): i == b
        _ => 0xdd,    // !(i s< b): i s>= b
    };
    let (op64, dst, src) = continue_test(&mut rnd);
    let op = (op64 & 0xf8) | class;
    if rnd(2) == 0 {
        // Test at the top: `if !(continue) goto out`, body, `goto head`.
        let head = p.len();
        // Sometimes the pointer is made from the index before the test and the index
        // written after it: the test then says nothing of the pointer.
        let early_ptr = rnd(4) == 0;
        if early_ptr {
            p.push(ins(0xbf, 5, 1, 0, 0)); // r5 = r1; r5 += r4
            p.push(ins(0x0f, 5, 4, 0, 0));
            p.push(match rnd(3) {
                0 => ins(0xb7, 4, 0, 0, 0),  // r4 = 0
                1 => ins(0x07, 4, 0, 0, -1), // r4 -= 1
                _ => ins(0x07, 4, 0, 0, 1),  // r4 += 1
            });
        }
        to_out.push(p.len());
        p.push(ins((negate(op64) & 0xf8) | class, dst, src, 0, 0));
        body(&mut p, &mut rnd, !early_ptr);
        let back = head as i64 - (p.len() as i64 + 1);
        p.push(ins(0x05, 0, 0, back as i16, 0));
    } else {
        // Test at the bottom, entered by a jump to it (clang's rotated loop).
        let enter = p.len();
        p.push(ins(0x05, 0, 0, 0, 0));
        let head = p.len();
        body(&mut p, &mut rnd, true);
        let test = p.len();
        p[enter] = ins(0x05, 0, 0, (test - enter - 1) as i16, 0);
        let back = head as i64 - (p.len() as i64 + 1);
        p.push(ins(op, dst, src, back as i16, 0));
    }
    let out = p.len();
    for &at in &to_out {
        let mut raw = p[at];
        raw[2..4].copy_from_slice(&((out - at - 1) as i16).to_le_bytes());
        p[at] = raw;
    }
    p.push(ins(0x95, 0, 0, 0, 0));
    (p.concat(), len)
}

/// Checks the index walk of `seed` ([`index_walk_program`]) sandboxed on `target` against the
/// interpreter, with a budget. `Err` names the seed, the difference and the program,
/// disassembled.
pub fn check_index_walk_seed(target: &JitTarget<'_>, seed: u64) -> Result<EscapeChecked, String> {
    let (code, len) = index_walk_program(seed);
    let ctx: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(37) ^ 0x5a)
        .collect();
    // Always a budget: an index written from r0 may never reach its bound.
    let budget = Some(500 + seed % 8000);
    compare_sandboxed(target, &code, &ctx, budget).map_err(|what| {
        format!(
            "index walk seed {seed:#x} (len {len}): {what}\n{}",
            crate::disasm::disassemble(&code, true)
        )
    })
}
