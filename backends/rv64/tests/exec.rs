//! Runs emitted code under qemu-riscv64 (or on RV64 hardware): fixed programs for every
//! instruction class, local calls, helpers, callx, branch-range edges, and differential
//! testing of random programs against the reference interpreter, on every feature path.
#![cfg(target_arch = "riscv64")]

mod common;
use common::*;
use packjit_plugin_api::HelperEntry;
use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};

const FEATURE_SETS: [u64; 4] = [
    0,
    FEATURE_C,
    FEATURE_ZBB | FEATURE_ZBA,
    FEATURE_C | FEATURE_ZBB | FEATURE_ZBA,
];

extern "C" fn mix(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    mix_ref(a, b, c, d, e)
}
fn mix_ref(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a.wrapping_mul(3) ^ b.rotate_left(7) ^ c.wrapping_add(d << 1) ^ e.wrapping_mul(0x9e37_79b9)
}
extern "C" fn plus_one(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_add(1)
}
fn plus_one_ref(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_add(1)
}

fn helpers() -> Vec<HelperEntry> {
    vec![
        HelperEntry {
            id: 1,
            reserved: 0,
            addr: mix as extern "C" fn(u64, u64, u64, u64, u64) -> u64 as usize as u64,
        },
        HelperEntry {
            id: 5,
            reserved: 0,
            addr: plus_one as extern "C" fn(u64, u64, u64, u64, u64) -> u64 as usize as u64,
        },
    ]
}
fn ref_helpers() -> Vec<(u32, Helper)> {
    vec![(1, mix_ref as Helper), (5, plus_one_ref as Helper)]
}

/// Runs on every feature path; checks against `expected` and the interpreter.
fn check(code: &[u8], mem: &[u8], expected: u64) {
    let mut m = mem.to_vec();
    assert_eq!(
        interpret(code, &mut m, &ref_helpers()),
        expected,
        "reference interpreter"
    );
    for f in FEATURE_SETS {
        let native = compile(code, &helpers(), f).unwrap_or_else(|e| panic!("features {f}: {e}"));
        let mut m2 = mem.to_vec();
        assert_eq!(run_native(&native, &mut m2), expected, "features {f}");
        assert_eq!(m2, m, "memory after run, features {f}");
    }
}

#[test]
fn alu_classes() {
    // 64-bit and 32-bit results, zero-extension, division edge cases.
    let cases: Vec<(Vec<[u8; 8]>, u64)> = vec![
        (vec![ins(0xb7, 0, 0, 0, -1), ins(0x04, 0, 0, 0, 1)], 0), // add32 wraps, zero-extends
        (vec![ins(0xb4, 0, 0, 0, -1)], 0xffff_ffff),              // mov32 -1
        (vec![ins(0xb7, 0, 0, 0, 7), ins(0x37, 0, 0, 0, 0)], 0),  // div by imm 0
        (vec![ins(0xb7, 0, 0, 0, 7), ins(0x97, 0, 0, 0, 0)], 7),  // mod by imm 0
        (
            vec![
                ins(0xb7, 0, 0, 0, 7),
                ins(0xb7, 1, 0, 0, 0),
                ins(0x3f, 0, 1, 0, 0),
            ],
            0,
        ),
        (
            vec![
                ins(0xb7, 0, 0, 0, 7),
                ins(0xb7, 1, 0, 0, 0),
                ins(0x9f, 0, 1, 0, 0),
            ],
            7,
        ),
        (
            vec![
                ins(0xb7, 0, 0, 0, -7),
                ins(0xb7, 1, 0, 0, 0),
                ins(0x3f, 0, 1, 1, 0),
            ],
            0,
        ), // sdiv 0
        // 32-bit divisor whose low half is zero: 32-bit division by zero.
        (
            vec![
                ins(0xb7, 0, 0, 0, 9),
                lddw(1, 1 << 32)[0],
                lddw(1, 1 << 32)[1],
                ins(0x3c, 0, 1, 0, 0),
            ],
            0,
        ),
        (
            vec![
                ins(0xb7, 0, 0, 0, 9),
                lddw(1, 1 << 32)[0],
                lddw(1, 1 << 32)[1],
                ins(0x9c, 0, 1, 0, 0),
            ],
            9,
        ),
        // MIN / -1 and MIN % -1
        (
            vec![
                lddw(0, 1 << 63)[0],
                lddw(0, 1 << 63)[1],
                ins(0x37, 0, 0, 1, -1),
            ],
            1 << 63,
        ),
        (
            vec![
                lddw(0, 1 << 63)[0],
                lddw(0, 1 << 63)[1],
                ins(0x97, 0, 0, 1, -1),
            ],
            0,
        ),
        (
            vec![ins(0xb4, 0, 0, 0, i32::MIN), ins(0x34, 0, 0, 1, -1)],
            0x8000_0000,
        ),
        // unsigned 64-bit division by imm -1 (sign-extended to u64::MAX)
        (vec![ins(0xb7, 0, 0, 0, -2), ins(0x37, 0, 0, 0, -1)], 0),
        (vec![ins(0xb7, 0, 0, 0, -1), ins(0x37, 0, 0, 0, -1)], 1),
        // powers of two
        (
            vec![ins(0xb7, 0, 0, 0, -1), ins(0x34, 0, 0, 0, 16)],
            0x0fff_ffff,
        ),
        (
            vec![ins(0xb7, 0, 0, 0, -1), ins(0x94, 0, 0, 0, 4096)],
            0xfff,
        ),
        (
            vec![ins(0xb7, 0, 0, 0, -1), ins(0x97, 0, 0, 0, i32::MIN)],
            0x7fff_ffff,
        ), // mod 0xffffffff80000000
        // shifts mask their counts
        (vec![ins(0xb7, 0, 0, 0, 1), ins(0x67, 0, 0, 0, 65)], 2),
        (
            vec![
                ins(0xb4, 0, 0, 0, 0xf8),
                ins(0x64, 0, 0, 0, 28),
                ins(0xc4, 0, 0, 0, 48),
            ],
            0xffff_8000,
        ),
        (
            vec![ins(0xb7, 0, 0, 0, -1), ins(0x74, 0, 0, 0, 0)],
            0xffff_ffff,
        ), // rsh32 by 0
        // neg, movsx, bswap, le
        (
            vec![ins(0xb7, 0, 0, 0, 1), ins(0x84, 0, 0, 0, 0)],
            0xffff_ffff,
        ),
        (
            vec![ins(0xb7, 1, 0, 0, 0x80), ins(0xbf, 0, 1, 8, 0)],
            (-128i64) as u64,
        ),
        (
            vec![ins(0xb7, 1, 0, 0, 0x8000), ins(0xbc, 0, 1, 16, 0)],
            0xffff_8000,
        ),
        (
            vec![
                lddw(0, 0x0102_0304_0506_0708)[0],
                lddw(0, 0x0102_0304_0506_0708)[1],
                ins(0xd7, 0, 0, 0, 64),
            ],
            0x0807_0605_0403_0201,
        ),
        (
            vec![
                lddw(0, 0x0102_0304_0506_0708)[0],
                lddw(0, 0x0102_0304_0506_0708)[1],
                ins(0xdc, 0, 0, 0, 32),
            ],
            0x0807_0605,
        ),
        (
            vec![
                lddw(0, 0x0102_0304_0506_0708)[0],
                lddw(0, 0x0102_0304_0506_0708)[1],
                ins(0xdc, 0, 0, 0, 16),
            ],
            0x0807,
        ),
        (
            vec![
                lddw(0, 0x0102_0304_0506_0708)[0],
                lddw(0, 0x0102_0304_0506_0708)[1],
                ins(0xd4, 0, 0, 0, 16),
            ],
            0x0708,
        ),
        (
            vec![
                lddw(0, 0x0102_0304_0506_0708)[0],
                lddw(0, 0x0102_0304_0506_0708)[1],
                ins(0xd4, 0, 0, 0, 32),
            ],
            0x0506_0708,
        ),
        // large immediates
        (
            vec![
                ins(0xb7, 0, 0, 0, 0x7fff_ffff),
                ins(0x07, 0, 0, 0, 0x7fff_f800),
            ],
            0xffff_f7ff,
        ),
        (
            vec![
                lddw(0, 0x8000_0000_0000_0001)[0],
                lddw(0, 0x8000_0000_0000_0001)[1],
            ],
            0x8000_0000_0000_0001,
        ),
        (
            vec![
                lddw(0, 0xffff_ffff_0000_0000)[0],
                lddw(0, 0xffff_ffff_0000_0000)[1],
            ],
            0xffff_ffff_0000_0000,
        ),
    ];
    for (body, want) in cases {
        let mut slots = body.clone();
        slots.push(EXIT);
        check(&prog(&slots), &[], want);
    }
}

#[test]
fn memory_and_atomics() {
    let mem: Vec<u8> = (0..64u8).collect();
    // ldxdw r0, [r1+8]; ldxh sign-extending; stores of every size; atomics 32/64.
    let p = prog(&[
        ins(0x79, 0, 1, 8, 0),  // r0 = *(u64*)(r1+8)
        ins(0x91, 3, 1, 63, 0), // r3 = *(s8*)(r1+63)  (63 = 0x3f)
        ins(0x0f, 0, 3, 0, 0),
        ins(0x72, 1, 0, 0, -1),     // *(u8*)(r1+0) = 0xff
        ins(0x6a, 1, 0, 2, 0x1234), // *(u16*)(r1+2) = 0x1234
        ins(0x62, 10, 0, -8, 77),   // stack word
        ins(0x61, 4, 10, -8, 0),
        ins(0x0f, 0, 4, 0, 0),
        ins(0xb7, 5, 0, 0, 3),
        ins(0xdb, 1, 5, 16, 0x01), // fetch add 64 at r1+16 -> r5 = old
        ins(0x0f, 0, 5, 0, 0),
        ins(0xb4, 5, 0, 0, -1),
        ins(0xc3, 1, 5, 24, 0xa1), // fetch xor 32 -> zero-extended old
        ins(0x0f, 0, 5, 0, 0),
        ins(0xc3, 1, 5, 28, 0x50), // and 32, no fetch
        ins(0xb7, 5, 0, 0, 9),
        ins(0xdb, 1, 5, 32, 0xe1), // xchg 64
        ins(0x0f, 0, 5, 0, 0),
        ins(0x79, 0, 1, 32, 0), // cmpxchg: r0 = current value -> succeeds
        ins(0xb7, 5, 0, 0, 0x55),
        ins(0xdb, 1, 5, 32, 0xf1),
        ins(0x79, 6, 1, 32, 0),
        ins(0x0f, 0, 6, 0, 0),
        ins(0xb4, 0, 0, 0, 1), // cmpxchg32 that fails: r0 = old
        ins(0xc3, 1, 5, 40, 0xf1),
        EXIT,
    ]);
    let mut m = mem.clone();
    let want = interpret(&p, &mut m, &[]);
    check(&p, &mem, want);
    // Large offsets and negative offsets go through the address path.
    let big = vec![0u8; 40000];
    let p = prog(&[
        ins(0x7a, 1, 0, 30000, 0x1234_5678),
        ins(0x07, 1, 0, 0, 32000),
        ins(0x79, 0, 1, -2000, 0),
        ins(0xb7, 2, 0, 0, 5),
        ins(0xc3, 1, 2, -2000, 0x00),
        ins(0x61, 3, 1, -2000, 0),
        ins(0x0f, 0, 3, 0, 0),
        EXIT,
    ]);
    check(&p, &big, 0x1234_5678 * 2 + 5);
}

#[test]
fn jumps_all_conditions() {
    // For each condition (JMP and JMP32, reg and imm): r0 = cond ? 1 : 0.
    let vals: [i64; 6] = [0, 1, -1, 0x7fff_ffff, -0x8000_0000, 0x1_0000_0001];
    for class in [0x05u8, 0x06] {
        for code in [
            0x10u8, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0xa0, 0xb0, 0xc0, 0xd0,
        ] {
            for &a in &vals {
                for &b in &vals {
                    let mut slots = vec![lddw(1, a as u64)[0], lddw(1, a as u64)[1]];
                    slots.extend(lddw(2, b as u64));
                    slots.push(ins(0xb7, 0, 0, 0, 0));
                    if b == b as i32 as i64 {
                        slots.push(ins(class | code, 1, 0, 1, b as i32));
                    } else {
                        slots.push(ins(class | code | 8, 1, 2, 1, 0));
                    }
                    slots.push(EXIT);
                    slots.push(ins(0xb7, 0, 0, 0, 1));
                    slots.push(EXIT);
                    let p = prog(&slots);
                    let want = interpret(&p, &mut [], &[]);
                    check(&p, &[], want);
                }
            }
        }
    }
}

#[test]
fn helpers_callx_and_local_calls() {
    // call helper 1 with r1..r5, keep r6 across the call.
    let p = prog(&[
        ins(0xb7, 6, 0, 0, 1000),
        ins(0xb7, 1, 0, 0, 1),
        ins(0xb7, 2, 0, 0, 2),
        ins(0xb7, 3, 0, 0, 3),
        ins(0xb7, 4, 0, 0, 4),
        ins(0xb7, 5, 0, 0, 5),
        ins(0x85, 0, 0, 0, 1),
        ins(0x0f, 0, 6, 0, 0),
        EXIT,
    ]);
    check(&p, &[], mix_ref(1, 2, 3, 4, 5) + 1000);
    // callx known id, then unknown id from inside a nested local call: u64::MAX at once.
    let p = prog(&[
        ins(0xb7, 1, 0, 0, 41),
        ins(0xb7, 2, 0, 0, 5),
        ins(0x8d, 2, 0, 0, 0), // callx r2 (id 5) -> 42
        ins(0xbf, 6, 0, 0, 0),
        ins(0x85, 0, 1, 0, 2), // call local +2
        ins(0x0f, 0, 6, 0, 0),
        EXIT,
        ins(0xb7, 7, 0, 0, 77), // f: clobbers r7, then callx 99 (unknown)
        ins(0xb7, 3, 0, 0, 99),
        ins(0x8d, 3, 0, 0, 0),
        ins(0xb7, 0, 0, 0, 3),
        EXIT,
    ]);
    check(&p, &[], u64::MAX);
    // Local calls: each function has its own frame; r6-r9 survive; r10 restored.
    let p = prog(&[
        ins(0x7a, 10, 0, -8, 11), // [r10-8] = 11
        ins(0xb7, 6, 0, 0, 6),
        ins(0xb7, 9, 0, 0, 9),
        ins(0xb7, 1, 0, 0, 100),
        ins(0x85, 0, 1, 0, 5),   // call f
        ins(0x79, 2, 10, -8, 0), // still 11
        ins(0x0f, 0, 2, 0, 0),
        ins(0x0f, 0, 6, 0, 0),
        ins(0x0f, 0, 9, 0, 0),
        EXIT,
        // f(r1): own frame, writes r6/r9, calls g, returns r1 + g(r1)
        ins(0x7a, 10, 0, -8, 500),
        ins(0xb7, 6, 0, 0, 60),
        ins(0xb7, 9, 0, 0, 90),
        ins(0xbf, 7, 1, 0, 0),
        ins(0x85, 0, 1, 0, 4), // call g
        ins(0x0f, 0, 7, 0, 0),
        ins(0x79, 3, 10, -8, 0),
        ins(0x0f, 0, 3, 0, 0), // + 500
        EXIT,
        // g(r1) = r1 * 2 via stack
        ins(0x7b, 10, 1, -16, 0),
        ins(0x79, 0, 10, -16, 0),
        ins(0x27, 0, 0, 0, 2),
        EXIT,
    ]);
    check(&p, &[], 11 + 6 + 9 + (100 + 200 + 500));
}

/// `ja` over `n` filler instructions, and a conditional branch back over them, so
/// displacements straddle every form's range limit.
fn long_jump_program(n: usize) -> Vec<u8> {
    let mut slots = vec![ins(0xb7, 0, 0, 0, 0), ins(0xb7, 1, 0, 0, 0)];
    // 0: r0 = 0; 1: r1 = 0; 2: ja +n+2 (to the check)
    slots.push(ins(0x05, 0, 0, (n + 2) as i16, 0));
    let loop_start = slots.len();
    for _ in 0..n {
        slots.push(ins(0x07, 0, 0, 0, 1000)); // 4 bytes each (12-bit imm, not compressible)
    }
    slots.push(ins(0x07, 1, 0, 0, 1));
    slots.push(EXIT);
    // check: if r1 == 0 goto loop_start (runs the body once); else exit
    let here = slots.len();
    let back = loop_start as i64 - (here as i64 + 1);
    slots.push(ins(0x15, 1, 0, back as i16, 0));
    slots.push(EXIT);
    prog(&slots)
}

#[test]
fn branch_range_edges() {
    // Around c.beqz (±256 B), c.j (±2 KiB), b<cc> (±4 KiB) and the i16 offset limit.
    for n in [
        60,
        61,
        62,
        63,
        64,
        65,
        500,
        510,
        511,
        512,
        513,
        1020,
        1022,
        1023,
        1024,
        1025,
        1030,
        8000,
        32000,
        32767 - 4,
    ] {
        let p = long_jump_program(n);
        let want = 1000 * n as u64;
        check(&p, &[], want);
    }
}

#[test]
fn over_one_mib_of_code_uses_every_branch_form() {
    // A function whose body is > 1 MiB: a `ja` (gotol) over it and a conditional branch
    // back across it exceed jal's ±1 MiB and need auipc+jalr.
    let n = 300_000usize;
    let mut slots = vec![ins(0xb7, 0, 0, 0, 0), ins(0xb7, 1, 0, 0, 0)];
    slots.push(ins(0x06, 0, 0, 0, (n + 2) as i32)); // gotol
    let loop_start = slots.len();
    for _ in 0..n {
        slots.push(ins(0x07, 0, 0, 0, 1000));
    }
    slots.push(ins(0x07, 1, 0, 0, 1));
    slots.push(EXIT);
    // r1 == 0: jump back over > 1 MiB via an inverted branch around a far jump: since the
    // condition form only has an i16 offset, hop through a gotol.
    slots.push(ins(0x55, 1, 0, 1, 0));
    let here = slots.len();
    slots.push(ins(0x06, 0, 0, 0, loop_start as i32 - (here as i32 + 1)));
    slots.push(EXIT);
    let p = prog(&slots);
    for f in FEATURE_SETS {
        let code = compile(&p, &helpers(), f).unwrap();
        assert!(code.len() > 1 << 20, "code is {} bytes", code.len());
        assert_eq!(run_native(&code, &mut []), 1000 * n as u64, "features {f}");
    }
}

// ---- differential testing ---------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn imm(&mut self) -> i32 {
        match self.below(6) {
            0 => self.below(4) as i32 - 1,
            1 => self.below(64) as i32 - 32,
            2 => self.below(4096) as i32 - 2048,
            3 => 1 << self.below(31),
            4 => [i32::MIN, i32::MAX, -1, 0x7ff, 0x800, -0x801][self.below(6) as usize],
            _ => self.next() as i32,
        }
    }
}

/// A random straight-line-with-forward-branches program over r0–r9, a 64-byte stack area
/// and helper 1; ends by folding every register into r0.
fn random_program(rng: &mut Rng) -> Vec<u8> {
    let mut s: Vec<[u8; 8]> = Vec::new();
    for r in 0..10u8 {
        let v = rng.next();
        s.extend(lddw(r, v));
    }
    for k in 0..8i16 {
        s.push(ins(0x7b, 10, (k % 10) as u8, -8 * (k + 1), 0));
    }
    let body = 20 + rng.below(40) as usize;
    let mut pending: Vec<usize> = Vec::new(); // indices of jumps to patch to the end
    for _ in 0..body {
        let dst = rng.below(10) as u8;
        let src = rng.below(10) as u8;
        let w = if rng.below(2) == 0 { 0x07u8 } else { 0x04 };
        match rng.below(12) {
            0..=4 => {
                let ops = [
                    0x00u8, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xa0, 0xb0, 0xc0,
                ];
                let op = ops[rng.below(ops.len() as u64) as usize];
                let signed = matches!(op, 0x30 | 0x90) && rng.below(2) == 0;
                let off = if signed { 1 } else { 0 };
                if rng.below(2) == 0 {
                    s.push(ins(w | op | 8, dst, src, off, 0));
                } else {
                    s.push(ins(w | op, dst, 0, off, rng.imm()));
                }
            }
            5 => s.push(ins(w | 0x80, dst, 0, 0, 0)),
            6 => {
                let bits = [8i16, 16, 32][rng.below(if w == 0x07 { 3 } else { 2 }) as usize];
                s.push(ins(w | 0xb0 | 8, dst, src, bits, 0));
            }
            7 => {
                let opc = [0xd4u8, 0xdc, 0xd7][rng.below(3) as usize];
                s.push(ins(opc, dst, 0, 0, [16, 32, 64][rng.below(3) as usize]));
            }
            8 => {
                let slot = -8 * (rng.below(8) as i16 + 1);
                let (sz, adj) =
                    [(0x18u8, 0), (0x00, 4), (0x08, 6), (0x10, 7)][rng.below(4) as usize];
                let off = slot + adj;
                match rng.below(4) {
                    0 => s.push(ins(0x61 | sz, dst, 10, off, 0)),
                    1 => s.push(ins(0x81 | sz, dst, 10, off, 0).map_or_ldx(sz)),
                    2 => s.push(ins(0x63 | sz, 10, src, off, 0)),
                    _ => s.push(ins(0x62 | sz, 10, 0, off, rng.imm())),
                }
            }
            9 => {
                let slot = -8 * (rng.below(8) as i16 + 1);
                let dw = rng.below(2) == 0;
                let ops = [0x00, 0x40, 0x50, 0xa0, 0x01, 0x41, 0x51, 0xa1, 0xe1, 0xf1];
                let op = ops[rng.below(ops.len() as u64) as usize];
                s.push(ins(if dw { 0xdb } else { 0xc3 }, 10, src, slot, op));
            }
            10 => {
                let class = if rng.below(2) == 0 { 0x05u8 } else { 0x06 };
                let conds = [
                    0x10u8, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0xa0, 0xb0, 0xc0, 0xd0,
                ];
                let c = conds[rng.below(conds.len() as u64) as usize];
                pending.push(s.len());
                if rng.below(2) == 0 {
                    s.push(ins(class | c | 8, dst, src, 0, 0));
                } else {
                    s.push(ins(class | c, dst, 0, 0, rng.imm()));
                }
            }
            _ => {
                s.push(ins(0x85, 0, 0, 0, 1));
                // Calls leave r1-r5 undefined: give them fresh values.
                for r in 1..6u8 {
                    s.push(ins(0xb7, r, 0, 0, rng.imm()));
                }
            }
        }
        // Let some branches land here instead of at the end.
        if !pending.is_empty() && rng.below(4) == 0 {
            let j = pending.remove(0);
            let off = s.len() as i64 - (j as i64 + 1);
            s[j][2..4].copy_from_slice(&(off as i16).to_le_bytes());
        }
    }
    let end = s.len();
    for j in pending {
        let off = end as i64 - (j as i64 + 1);
        s[j][2..4].copy_from_slice(&(off as i16).to_le_bytes());
    }
    for r in 1..10u8 {
        s.push(ins(0x27, 0, 0, 0, 31));
        s.push(ins(0xaf, 0, r, 0, 0));
    }
    s.push(EXIT);
    prog(&s)
}

trait LdxSx {
    fn map_or_ldx(self, sz: u8) -> [u8; 8];
}
impl LdxSx for [u8; 8] {
    /// Sign-extending loads do not exist for 64 bits: use a plain load there.
    fn map_or_ldx(mut self, sz: u8) -> [u8; 8] {
        if sz == 0x18 {
            self[0] = 0x61 | sz;
        }
        self
    }
}

/// Greedily replaces instructions by `ja +0` (a no-op that keeps every jump offset valid)
/// while the native result still disagrees with the interpreter.
fn minimize(p: &[u8], f: u64) -> Vec<u8> {
    let mut cur = p.to_vec();
    let nop = ins(0x05, 0, 0, 0, 0);
    let differs = |c: &[u8]| -> bool {
        match compile(c, &helpers(), f) {
            Ok(code) => run_native(&code, &mut []) != interpret(c, &mut [], &ref_helpers()),
            Err(_) => false,
        }
    };
    let slots = cur.len() / 8;
    // Keep the register and stack set-up (20 + 8 slots): removing it would read
    // uninitialised stack.
    let mut i = 28;
    while i < slots - 1 {
        if cur[i * 8] == 0x18 {
            i += 2;
            continue;
        }
        let mut cand = cur.clone();
        cand[i * 8..i * 8 + 8].copy_from_slice(&nop);
        if differs(&cand) {
            cur = cand;
        }
        i += 1;
    }
    cur
}

#[test]
fn differential_random_programs() {
    let count: usize = std::env::var("PACKJIT_DIFF_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for n in 0..count {
        let p = random_program(&mut rng);
        let want = interpret(&p, &mut [], &ref_helpers());
        for f in FEATURE_SETS {
            let code = compile(&p, &helpers(), f).unwrap_or_else(|e| panic!("program {n}: {e}"));
            let got = run_native(&code, &mut []);
            if got != want {
                let small = minimize(&p, f);
                let listing: Vec<String> = small
                    .chunks(8)
                    .enumerate()
                    .filter(|(_, c)| c[0] != 0x05 || c[2..4] != [0, 0])
                    .map(|(i, c)| format!("{i}: {:02x?}", c))
                    .collect();
                panic!(
                    "program {n}, features {f}: got {got:#x}, want {want:#x}\n{}",
                    listing.join("\n")
                );
            }
        }
    }
}
