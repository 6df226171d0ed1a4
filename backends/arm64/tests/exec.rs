//! Execution tests on arm64 (run under qemu-aarch64 by the cross rig): every instruction
//! class, both atomics paths, local calls with frames, helpers, callx, long branches.
#![cfg(target_arch = "aarch64")]

mod common;

use common::exec::{run_bytes, run_env, run_with};
use common::*;
use packjit_arm64::emit_program;
use packjit_arm64::FEATURE_LSE;
use packjit_plugin_api::abi::{PJ_STOP_NONE, PJ_STOP_UNKNOWN_CALLX};
use packjit_plugin_api::HelperEntry;

const BOTH: [u64; 2] = [0, FEATURE_LSE];

fn a64i(op: u8, dst: u8, imm: i32) -> [u8; 8] {
    ins(0x07 | op, dst, 0, 0, imm)
}
fn a64r(op: u8, dst: u8, src: u8) -> [u8; 8] {
    ins(0x0f | op, dst, src, 0, 0)
}
fn a32i(op: u8, dst: u8, imm: i32) -> [u8; 8] {
    ins(0x04 | op, dst, 0, 0, imm)
}
fn mov64(dst: u8, imm: i32) -> [u8; 8] {
    a64i(0xb0, dst, imm)
}
fn ld64(dst: u8, v: u64) -> Vec<[u8; 8]> {
    lddw(dst, v)
}

const ADD: u8 = 0x00;
const SUB: u8 = 0x10;
const MUL: u8 = 0x20;
const DIV: u8 = 0x30;
const OR: u8 = 0x40;
const AND: u8 = 0x50;
const LSH: u8 = 0x60;
const RSH: u8 = 0x70;
const MOD: u8 = 0x90;
const XOR: u8 = 0xa0;
const MOV: u8 = 0xb0;
const ARSH: u8 = 0xc0;

fn run(insns: &[[u8; 8]]) -> u64 {
    let mut results = BOTH
        .iter()
        .map(|&f| run_with(insns, &[], f, &mut [0u8; 64]));
    let first = results.next().unwrap();
    for r in results {
        assert_eq!(r, first, "LSE and LL/SC builds disagree");
    }
    first
}

/// `r0 = a; r1 = b; r0 = r0 op r1` (reg form) and `r0 = a; r0 op= imm b` when b fits.
fn binop(op: u8, off: i16, w64: bool, a: u64, b: u64) -> u64 {
    let mut p = ld64(0, a);
    p.extend(ld64(1, b));
    p.push(ins(if w64 { 0x0f } else { 0x0c } | op, 0, 1, off, 0));
    p.push(EXIT);
    let via_reg = run(&p);
    let imm = b as i64 as i32;
    let fits = if w64 { imm as i64 as u64 == b } else { true };
    if fits {
        let mut q = ld64(0, a);
        q.push(ins(if w64 { 0x07 } else { 0x04 } | op, 0, 0, off, imm));
        q.push(EXIT);
        assert_eq!(
            run(&q),
            via_reg,
            "imm and reg forms differ: op {op:#x} off {off} a {a:#x} b {b:#x}"
        );
    }
    via_reg
}

#[test]
fn alu64_semantics() {
    let min = i64::MIN as u64;
    assert_eq!(binop(ADD, 0, true, 5, u64::MAX), 4);
    assert_eq!(binop(SUB, 0, true, 5, 7), (-2i64) as u64);
    assert_eq!(binop(MUL, 0, true, 0x1_0000_0001, 3), 0x3_0000_0003);
    assert_eq!(binop(DIV, 0, true, 100, 7), 14);
    assert_eq!(binop(DIV, 0, true, 100, 0), 0);
    assert_eq!(
        binop(DIV, 0, true, 100, u64::MAX),
        0,
        "imm -1 is 2^64-1 unsigned"
    );
    assert_eq!(binop(DIV, 0, true, 1 << 40, 1 << 20), 1 << 20);
    assert_eq!(binop(DIV, 1, true, (-100i64) as u64, 7), (-14i64) as u64);
    assert_eq!(binop(DIV, 1, true, min, u64::MAX), min, "MIN / -1 = MIN");
    assert_eq!(binop(DIV, 1, true, 5, 0), 0);
    assert_eq!(binop(MOD, 0, true, 100, 7), 2);
    assert_eq!(binop(MOD, 0, true, 100, 0), 100);
    assert_eq!(binop(MOD, 0, true, 100, 64), 36);
    assert_eq!(binop(MOD, 1, true, (-100i64) as u64, 7), (-2i64) as u64);
    assert_eq!(binop(MOD, 1, true, 100, (-7i64) as u64), 2);
    assert_eq!(binop(MOD, 1, true, min, u64::MAX), 0, "MIN % -1 = 0");
    assert_eq!(binop(MOD, 1, true, (-5i64) as u64, 0), (-5i64) as u64);
    assert_eq!(binop(OR, 0, true, 0xf0, 0x0f), 0xff);
    assert_eq!(binop(OR, 0, true, 0x1234, 0x12345), 0x13375);
    assert_eq!(binop(AND, 0, true, 0xffff_ffff_ffff, 0xff00ff), 0xff00ff);
    assert_eq!(binop(AND, 0, true, 0xffff_ffff_ffff, 0x12345), 0x12345);
    assert_eq!(
        binop(AND, 0, true, 0xffff_ffff_ffff, u64::MAX),
        0xffff_ffff_ffff
    );
    assert_eq!(binop(XOR, 0, true, 0xff, u64::MAX), !0xffu64);
    assert_eq!(binop(XOR, 0, true, 0xff, 0x0f), 0xf0);
    assert_eq!(binop(LSH, 0, true, 1, 63), 1 << 63);
    assert_eq!(binop(LSH, 0, true, 1, 64 + 3), 8, "count masked to 63");
    assert_eq!(binop(RSH, 0, true, 1 << 63, 63), 1);
    assert_eq!(binop(RSH, 0, true, u64::MAX, 0), u64::MAX);
    assert_eq!(binop(ARSH, 0, true, 1 << 63, 63), u64::MAX);
    assert_eq!(binop(ARSH, 0, true, 1 << 63, 127), u64::MAX);
    assert_eq!(binop(MOV, 0, true, 1, u64::MAX), u64::MAX);
    assert_eq!(binop(ADD, 0, true, 1, 0x1000), 0x1001);
    assert_eq!(
        binop(ADD, 0, true, 1, (-0x1000i64) as u64),
        (-0xfffi64) as u64
    );
    assert_eq!(binop(ADD, 0, true, 1, 0x12345), 0x12346);
    assert_eq!(binop(SUB, 0, true, 0, i32::MIN as i64 as u64), 1 << 31);
}

#[test]
fn alu32_semantics() {
    let hi = 0xdead_beef_0000_0000u64;
    assert_eq!(binop(ADD, 0, false, hi | 5, u32::MAX as u64), 4);
    assert_eq!(binop(SUB, 0, false, hi | 5, 7), 0xffff_fffe);
    assert_eq!(binop(MUL, 0, false, hi | 0x8000_0000, 3), 0x8000_0000);
    assert_eq!(binop(DIV, 0, false, hi | 100, 7), 14);
    assert_eq!(binop(DIV, 0, false, hi | 100, 0), 0);
    assert_eq!(
        binop(DIV, 0, false, hi | 100, hi | 0),
        0,
        "divisor is the low half"
    );
    assert_eq!(
        binop(DIV, 1, false, 0x8000_0000, 0xffff_ffff),
        0x8000_0000,
        "INT_MIN / -1"
    );
    assert_eq!(
        binop(DIV, 1, false, (-100i32) as u32 as u64, 7),
        (-14i32) as u32 as u64
    );
    assert_eq!(
        binop(MOD, 0, false, hi | 100, 0),
        100,
        "x % 0 = x, zero-extended"
    );
    assert_eq!(binop(MOD, 1, false, 0x8000_0000, 0xffff_ffff), 0);
    assert_eq!(
        binop(MOD, 1, false, (-100i32) as u32 as u64, 7),
        (-2i32) as u32 as u64
    );
    assert_eq!(binop(OR, 0, false, hi, 0), 0);
    assert_eq!(
        binop(AND, 0, false, hi | 0xffff_ffff, 0xffff_ffff),
        0xffff_ffff
    );
    assert_eq!(binop(XOR, 0, false, hi | 0xf, 0xffff_ffff), 0xffff_fff0);
    assert_eq!(binop(LSH, 0, false, hi | 1, 31), 0x8000_0000);
    assert_eq!(
        binop(LSH, 0, false, hi | 1, 32 + 4),
        16,
        "count masked to 31"
    );
    assert_eq!(binop(RSH, 0, false, hi | 0x8000_0000, 31), 1);
    assert_eq!(binop(RSH, 0, false, hi | 0x8000_0000, 0), 0x8000_0000);
    assert_eq!(binop(ARSH, 0, false, hi | 0x8000_0000, 31), 0xffff_ffff);
    assert_eq!(binop(MOV, 0, false, hi, u32::MAX as u64), 0xffff_ffff);
    assert_eq!(binop(MOV, 0, false, hi, 0), 0);
}

#[test]
fn neg_movsx_end() {
    let mut p = ld64(0, 5);
    p.push(a64i(0x80, 0, 0));
    p.push(EXIT);
    assert_eq!(run(&p), (-5i64) as u64);
    let mut p = ld64(0, 0xffff_ffff_0000_0005);
    p.push(a32i(0x80, 0, 0));
    p.push(EXIT);
    assert_eq!(run(&p), 0xffff_fffb);
    for (w64, bits, v, want) in [
        (true, 8, 0x80u64, 0xffff_ffff_ffff_ff80u64),
        (true, 16, 0x1_8000, 0xffff_ffff_ffff_8000),
        (true, 32, 0x8000_0000, 0xffff_ffff_8000_0000),
        (false, 8, 0xff_ff80, 0xffff_ff80),
        (false, 16, 0x7fff, 0x7fff),
    ] {
        let mut p = ld64(1, v);
        p.push(ins(if w64 { 0xbf } else { 0xbc }, 0, 1, bits, 0));
        p.push(EXIT);
        assert_eq!(run(&p), want, "movsx{bits} w64={w64}");
    }
    let v = 0x0123_4567_89ab_cdefu64;
    for (opc, imm, want) in [
        (0xd4, 16, 0xcdefu64),
        (0xd4, 32, 0x89ab_cdef),
        (0xd4, 64, v),
        (0xdc, 16, 0xefcd),
        (0xdc, 32, 0xefcd_ab89),
        (0xdc, 64, 0xefcd_ab89_6745_2301),
        (0xd7, 16, 0xefcd),
        (0xd7, 32, 0xefcd_ab89),
        (0xd7, 64, 0xefcd_ab89_6745_2301),
    ] {
        let mut p = ld64(0, v);
        p.push(ins(opc, 0, 0, 0, imm));
        p.push(EXIT);
        assert_eq!(run(&p), want, "end {opc:#x} {imm}");
    }
}

#[test]
fn immediates_of_every_shape() {
    for v in [
        0u64,
        1,
        0xffff,
        0x1_0000,
        0xffff_0000,
        0xffff_ffff,
        0x1_0000_0000,
        0x8000_0000_0000_0000,
        u64::MAX,
        0xffff_ffff_ffff_0000,
        0xffff_1234_ffff_ffff,
        0x5555_5555_5555_5555,
        0x0f0f_0f0f_0f0f_0f0f,
        0x0123_4567_89ab_cdef,
        0xfedc_ba98_7654_3210,
        0x0000_1234_0000_5678,
    ] {
        let mut p = ld64(0, v);
        p.push(EXIT);
        assert_eq!(run(&p), v, "lddw {v:#x}");
    }
    for imm in [
        0,
        1,
        -1,
        4095,
        4096,
        -4096,
        0x7fff_ffff,
        i32::MIN,
        0x5555_5555,
        0x00ff_00ff,
        -0x10000,
    ] {
        assert_eq!(run(&[mov64(0, imm), EXIT]), imm as i64 as u64);
        assert_eq!(run(&[a32i(MOV, 0, imm), EXIT]), imm as u32 as u64);
    }
}

fn jmp_taken(opc: u8, a: u64, b: u64) -> bool {
    // r0 = 1; if (r1 op r2) goto +1; r0 = 0; exit   (reg form; the imm form when b fits)
    let mut p = ld64(1, a);
    p.extend(ld64(2, b));
    p.push(mov64(0, 1));
    p.push(ins(opc | 0x08, 1, 2, 1, 0));
    p.push(mov64(0, 0));
    p.push(EXIT);
    let r = run(&p) == 1;
    let w64 = opc & 7 == 5;
    let imm = b as i64 as i32;
    if !w64 || imm as i64 as u64 == b {
        let mut q = ld64(1, a);
        q.push(mov64(0, 1));
        q.push(ins(opc, 1, 0, 1, imm));
        q.push(mov64(0, 0));
        q.push(EXIT);
        assert_eq!(
            run(&q) == 1,
            r,
            "imm/reg forms of {opc:#x} differ on {a:#x}, {b:#x}"
        );
    }
    r
}

#[test]
fn every_condition_both_widths() {
    use packjit_frontend::{Cond, Width};
    let conds = [
        (0x10, Cond::Eq),
        (0x20, Cond::Gt),
        (0x30, Cond::Ge),
        (0x40, Cond::Set),
        (0x50, Cond::Ne),
        (0x60, Cond::Sgt),
        (0x70, Cond::Sge),
        (0xa0, Cond::Lt),
        (0xb0, Cond::Le),
        (0xc0, Cond::Slt),
        (0xd0, Cond::Sle),
    ];
    let vals = [
        0u64,
        1,
        2,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        1 << 32,
        0x1_0000_0001,
        i64::MAX as u64,
        1 << 63,
        u64::MAX,
        4095,
        4096,
        (-4096i64) as u64,
        (-5i64) as u64,
    ];
    for (code, cond) in conds {
        for (class, width) in [(0x05u8, Width::W64), (0x06, Width::W32)] {
            for &a in &vals {
                for &b in &vals {
                    let (ra, rb) = match width {
                        Width::W64 => (a, b),
                        Width::W32 => (a as u32 as u64, b as u32 as u64),
                    };
                    let want = cond.eval(width, ra, rb);
                    assert_eq!(
                        jmp_taken(class | code, a, b),
                        want,
                        "{cond:?} {width:?} {a:#x} {b:#x}"
                    );
                }
            }
        }
    }
}

#[test]
fn loads_and_stores() {
    let mut mem: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(0x80))
        .collect();
    let orig = mem.clone();
    let rd = |off: usize, n: usize| -> u64 {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&orig[off..off + n]);
        u64::from_le_bytes(b)
    };
    for f in BOTH {
        for (opc, n, sx) in [
            (0x71u8, 1usize, false),
            (0x69, 2, false),
            (0x61, 4, false),
            (0x79, 8, false),
            (0x91, 1, true),
            (0x89, 2, true),
            (0x81, 4, true),
        ] {
            for off in [0i16, 1, 3, 8, 17, 24] {
                let got = run_with(&[ins(opc, 0, 1, off, 0), EXIT], &[], f, &mut mem);
                let raw = rd(off as usize, n);
                let want = if sx {
                    ((raw << (64 - 8 * n)) as i64 >> (64 - 8 * n)) as u64
                } else {
                    raw
                };
                assert_eq!(got, want, "load {opc:#x} off {off}");
            }
        }
        // Negative offsets from a pointer into the middle of the buffer.
        let p = [ins(0x07, 1, 0, 0, 40), ins(0x79, 0, 1, -33, 0), EXIT];
        assert_eq!(run_with(&p, &[], f, &mut mem), rd(7, 8));
        // Stores: imm and reg, all sizes, then read back the whole dword.
        for (opc, n) in [(0x72u8, 1usize), (0x6a, 2), (0x62, 4), (0x7a, 8)] {
            let mut m = [0u8; 64];
            let p = [ins(opc, 1, 0, 5, -2), ins(0x79, 0, 1, 5, 0), EXIT];
            let got = run_with(&p, &[], f, &mut m);
            let want = if n == 8 {
                u64::MAX - 1
            } else {
                (u64::MAX - 1) & ((1u64 << (8 * n)) - 1)
            };
            assert_eq!(got, want, "st {opc:#x}");
            let mut m = [0u8; 64];
            let mut p = ld64(2, 0x1122_3344_5566_7788);
            p.extend([ins(opc | 0x01, 1, 2, 9, 0), ins(0x79, 0, 1, 9, 0), EXIT]);
            let got = run_with(&p, &[], f, &mut m);
            assert_eq!(
                got,
                0x1122_3344_5566_7788
                    & if n == 8 {
                        u64::MAX
                    } else {
                        (1u64 << (8 * n)) - 1
                    }
            );
        }
        // Store of zero and of r10-relative values.
        let mut m = [0xffu8; 16];
        assert_eq!(
            run_with(
                &[ins(0x7a, 1, 0, 0, 0), ins(0x79, 0, 1, 0, 0), EXIT],
                &[],
                f,
                &mut m
            ),
            0
        );
        // Large offsets (register-offset addressing).
        let mut big = vec![0u8; 40000];
        big[30001..30009].copy_from_slice(&0xabcdu64.to_le_bytes());
        assert_eq!(
            run_with(&[ins(0x79, 0, 1, 30001, 0), EXIT], &[], f, &mut big),
            0xabcd
        );
        let p = [
            ins(0x07, 1, 0, 0, 30001 + 300),
            ins(0x79, 0, 1, -300, 0),
            EXIT,
        ];
        assert_eq!(run_with(&p, &[], f, &mut big), 0xabcd);
        assert_eq!(mem, orig);
    }
}

#[test]
fn stack_frame() {
    // Every size, aligned and not, at the top and bottom of the 512-byte frame.
    for off in [-8i16, -512, -511, -260, -257, -256, -1] {
        for (st, ld, n) in [
            (0x7bu8, 0x79u8, 8i16),
            (0x63, 0x61, 4),
            (0x6b, 0x69, 2),
            (0x73, 0x71, 1),
        ] {
            if off + n > 0 {
                continue;
            }
            let mut p = ld64(1, 0x0102_0304_0506_0708);
            p.extend([ins(st, 10, 1, off, 0), ins(ld, 0, 10, off, 0), EXIT]);
            let want = 0x0102_0304_0506_0708u64
                & if n == 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * n)) - 1
                };
            assert_eq!(run(&p), want, "stack off {off} size {n}");
        }
    }
    // r10 as a value: r1 = r10; *(r1 - 8) = 7; r0 = *(r10 - 8)
    let p = [
        a64r(MOV, 1, 10),
        ins(0x7a, 1, 0, -8, 7),
        ins(0x79, 0, 10, -8, 0),
        EXIT,
    ];
    assert_eq!(run(&p), 7);
    // r10 - 512 is 16-byte aligned and frames do not overlap the saved registers.
    let p = [a64r(MOV, 0, 10), a64i(AND, 0, 15), EXIT];
    assert_eq!(run(&p), 0);
}

#[test]
fn atomics_both_paths() {
    let init = 0x0000_0001_8000_0003u64;
    let src = 0x0000_00f0_8000_0005u64;
    for f in BOTH {
        for (imm, w64, f_mem, fetch) in [
            (
                0x00,
                true,
                (|m: u64, s: u64| m.wrapping_add(s)) as fn(u64, u64) -> u64,
                false,
            ),
            (0x40, true, |m, s| m | s, false),
            (0x50, true, |m, s| m & s, false),
            (0xa0, true, |m, s| m ^ s, false),
            (0x01, true, |m, s| m.wrapping_add(s), true),
            (0x41, true, |m, s| m | s, true),
            (0x51, true, |m, s| m & s, true),
            (0xa1, true, |m, s| m ^ s, true),
            (0xe1, true, |_, s| s, true),
            (
                0x00,
                false,
                |m, s| (m as u32).wrapping_add(s as u32) as u64,
                false,
            ),
            (0x40, false, |m, s| ((m | s) as u32) as u64, false),
            (0x50, false, |m, s| ((m & s) as u32) as u64, false),
            (0xa0, false, |m, s| ((m ^ s) as u32) as u64, false),
            (
                0x01,
                false,
                |m, s| (m as u32).wrapping_add(s as u32) as u64,
                true,
            ),
            (0x41, false, |m, s| ((m | s) as u32) as u64, true),
            (0x51, false, |m, s| ((m & s) as u32) as u64, true),
            (0xa1, false, |m, s| ((m ^ s) as u32) as u64, true),
            (0xe1, false, |_, s| s as u32 as u64, true),
        ] {
            let mut m = [0u8; 16];
            m[8..16].copy_from_slice(&init.to_le_bytes());
            let opc = if w64 { 0xdb } else { 0xc3 };
            // r2 = src; atomic [r1+8], r2; r0 = r2 (fetched or unchanged)
            let mut p = ld64(2, src);
            p.extend([ins(opc, 1, 2, 8, imm), a64r(MOV, 0, 2), EXIT]);
            let got = run_with(&p, &[], f, &mut m);
            let after = u64::from_le_bytes(m[8..16].try_into().unwrap());
            let mem_want = if w64 {
                f_mem(init, src)
            } else {
                (init & !0xffff_ffff) | f_mem(init, src)
            };
            assert_eq!(
                after, mem_want,
                "memory after atomic {imm:#x} w64={w64} features={f}"
            );
            let reg_want = if fetch {
                if w64 {
                    init
                } else {
                    init as u32 as u64
                }
            } else {
                src
            };
            assert_eq!(
                got, reg_want,
                "register after atomic {imm:#x} w64={w64} features={f}"
            );
        }
        // cmpxchg: success and failure, 64 and 32 bit (r0 compared, old value into r0).
        for (w64, r0, expect_swap) in [
            (true, init, true),
            (true, init + 1, false),
            (false, init | 0xffff_ffff_0000_0000, true),
            (false, 4, false),
        ] {
            let mut m = [0u8; 16];
            m[0..8].copy_from_slice(&init.to_le_bytes());
            let mut p = ld64(0, r0);
            p.extend(ld64(2, src));
            p.extend([ins(if w64 { 0xdb } else { 0xc3 }, 1, 2, 0, 0xf1), EXIT]);
            let got = run_with(&p, &[], f, &mut m);
            let after = u64::from_le_bytes(m[0..8].try_into().unwrap());
            let want_mem = match (expect_swap, w64) {
                (false, _) => init,
                (true, true) => src,
                (true, false) => (init & !0xffff_ffff) | (src & 0xffff_ffff),
            };
            assert_eq!(after, want_mem, "cmpxchg w64={w64} r0={r0:#x} features={f}");
            assert_eq!(got, if w64 { init } else { init as u32 as u64 });
        }
        // Atomics on the stack (address from sp) and with a large offset.
        let p = [
            mov64(1, 5),
            ins(0x7a, 10, 0, -16, 10),
            ins(0xdb, 10, 1, -16, 0x01),
            ins(0x79, 0, 10, -16, 0),
            a64r(ADD, 0, 1),
            EXIT,
        ];
        assert_eq!(run_with(&p, &[], f, &mut []), 15 + 10);
    }
}

unsafe extern "C" fn h_sum(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a.wrapping_add(b * 10)
        .wrapping_add(c * 100)
        .wrapping_add(d * 1000)
        .wrapping_add(e * 10000)
}
unsafe extern "C" fn h_identity(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

fn helpers() -> Vec<HelperEntry> {
    vec![
        helper(1, h_sum as *const () as u64),
        helper(0x12345, h_identity as *const () as u64),
    ]
}

#[test]
fn helper_calls_preserve_r6_to_r9_and_r10() {
    let p = [
        mov64(6, 60),
        mov64(7, 70),
        mov64(8, 80),
        mov64(9, 90),
        ins(0x7a, 10, 0, -8, 99),
        mov64(1, 1),
        mov64(2, 2),
        mov64(3, 3),
        mov64(4, 4),
        mov64(5, 5),
        ins(0x85, 0, 0, 0, 1),
        a64r(ADD, 0, 6),
        a64r(ADD, 0, 7),
        a64r(ADD, 0, 8),
        a64r(ADD, 0, 9),
        ins(0x79, 1, 10, -8, 0),
        a64r(ADD, 0, 1),
        EXIT,
    ];
    for f in BOTH {
        assert_eq!(run_with(&p, &helpers(), f, &mut []), 54321 + 300 + 99);
    }
    let p = [mov64(1, 77), ins(0x85, 0, 0, 0, 0x12345), EXIT];
    assert_eq!(run_with(&p, &helpers(), 0, &mut []), 77);
}

/// Runs trusted code that may stop; returns r0, or the stop as `(kind, pc, addr)`.
fn run_stop(
    insns: &[[u8; 8]],
    helpers: &[HelperEntry],
    features: u64,
) -> Result<u64, (u32, u64, u64)> {
    let out = emit_program(&prog(insns), helpers, features).unwrap();
    let (r0, env) = run_env(&out.bytes, &mut [], &[], u64::MAX);
    if env.stop_kind == PJ_STOP_NONE {
        Ok(r0)
    } else {
        Err((env.stop_kind, env.stop_pc, env.stop_addr))
    }
}

#[test]
fn callx_dispatch_and_unknown_id() {
    // r1..r5 = 1..5; r7 = id; callx r7 (at pc 7: five movs and a two-slot lddw before it)
    for (id, want) in [
        (1u64, Ok(54321u64)),
        (0x12345, Ok(1)),
        (2, Err((PJ_STOP_UNKNOWN_CALLX, 7, 2))),
        (
            0x1_0000_0001,
            Err((PJ_STOP_UNKNOWN_CALLX, 7, 0x1_0000_0001)),
        ),
    ] {
        let mut p = vec![
            mov64(1, 1),
            mov64(2, 2),
            mov64(3, 3),
            mov64(4, 4),
            mov64(5, 5),
        ];
        p.extend(ld64(7, id));
        p.extend([ins(0x8d, 7, 0, 0, 0), EXIT]);
        for f in BOTH {
            assert_eq!(run_stop(&p, &helpers(), f), want, "callx id {id:#x}");
        }
    }
    // Unknown id from inside a nested subprogram unwinds every frame and keeps r6-r9 of the
    // caller (the host's callee-saved registers) intact.
    // main: r6 = 6; call f; r0 = 0; exit     f: r7 = 7; call g; exit    g: r8 = 8; r1 = 99; callx r1; exit
    let p = [
        mov64(6, 6),
        ins(0x85, 0, 1, 0, 2),
        mov64(0, 0),
        EXIT,
        mov64(7, 7),
        ins(0x85, 0, 1, 0, 1),
        EXIT,
        mov64(8, 8),
        mov64(1, 99),
        ins(0x8d, 1, 0, 0, 0),
        EXIT,
    ];
    for f in BOTH {
        assert_eq!(
            run_stop(&p, &helpers(), f),
            Err((PJ_STOP_UNKNOWN_CALLX, 9, 99))
        );
        // And with no helpers at all.
        assert_eq!(run_stop(&p, &[], f), Err((PJ_STOP_UNKNOWN_CALLX, 9, 99)));
    }
}

#[test]
fn local_calls_have_own_frames() {
    // main: r6 = 100; *(r10-8) = 1; r1 = 5; call f; r0 += r6; r0 += *(r10-8); exit
    // f:    r6 = 1000; *(r10-8) = 2; r0 = r1 * 2; r0 += *(r10-8); exit   (-> 12)
    let p = [
        mov64(6, 100),
        ins(0x7a, 10, 0, -8, 1),
        mov64(1, 5),
        ins(0x85, 0, 1, 0, 4),
        a64r(ADD, 0, 6),
        ins(0x79, 2, 10, -8, 0),
        a64r(ADD, 0, 2),
        EXIT,
        mov64(6, 1000),
        ins(0x7a, 10, 0, -8, 2),
        a64r(MOV, 0, 1),
        a64i(MUL, 0, 2),
        ins(0x79, 3, 10, -8, 0),
        a64r(ADD, 0, 3),
        EXIT,
    ];
    assert_eq!(run(&p), 12 + 100 + 1);
    // A chain eight frames deep (the verifier's limit), each adding its own depth.
    let mut p = vec![];
    for _ in 0..7 {
        p.push(ins(0x85, 0, 1, 0, 2));
        p.push(a64i(ADD, 0, 1));
        p.push(EXIT);
    }
    p.push(mov64(0, 0));
    p.push(EXIT);
    assert_eq!(run(&p), 7);
    // A loop back to the first instruction of a subprogram does not re-run its prologue.
    // main: call f; exit   f: r0 += 1; if r0 < 10 goto f_start; exit
    let p = [
        mov64(0, 0),
        ins(0x85, 0, 1, 0, 1),
        EXIT,
        a64i(ADD, 0, 1),
        ins(0xa5, 0, 0, -2, 10),
        EXIT,
    ];
    assert_eq!(run(&p), 10);
}

#[test]
fn loops_ja32_and_exit_not_last() {
    // r0 = 0; r1 = 100; loop: r0 += r1; r1 -= 1; if r1 != 0 goto loop; exit
    let p = [
        mov64(0, 0),
        mov64(1, 100),
        a64r(ADD, 0, 1),
        a64i(SUB, 1, 1),
        ins(0x55, 1, 0, -3, 0),
        EXIT,
    ];
    assert_eq!(run(&p), 5050);
    // ja32 (gotol) over an exit; exit in the middle.
    let p = [
        mov64(0, 1),
        ins(0x06, 0, 0, 0, 2),
        mov64(0, 2),
        EXIT,
        mov64(0, 3),
        EXIT,
    ];
    assert_eq!(run(&p), 3);
}

/// Helpers 100..164, all the identity on r1: a `callx` naming the last one compiles to a
/// ~1.5 KiB compare chain, so a few hundred eBPF slots span megabytes of arm64 code.
fn padding_helpers() -> Vec<HelperEntry> {
    (100..164)
        .map(|id| helper(id, h_identity as *const () as u64))
        .collect()
}

/// r0 = 1; r1 = 5; r6 = 163; r7 = taken; r8 = 0; if (jmp r7) goto end; pad x callx r6; end: exit
fn forward(jmp: [u8; 8], pad: usize, taken: bool) -> Vec<[u8; 8]> {
    let mut j = jmp;
    j[2..4].copy_from_slice(&(pad as i16).to_le_bytes());
    let mut p = vec![
        mov64(0, 1),
        mov64(1, 5),
        mov64(6, 163),
        mov64(7, taken as i32),
        mov64(8, 0),
        j,
    ];
    p.extend(std::iter::repeat_n(ins(0x8d, 6, 0, 0, 0), pad));
    p.push(EXIT);
    p
}

#[test]
fn branch_ranges() {
    let hs = padding_helpers();
    let one = emit_program(&prog(&forward(ins(0x55, 7, 0, 0, 0), 1, false)), &hs, 0).unwrap();
    let per_slot = one.bytes.len();
    assert!(per_slot > 1024, "callx padding is {per_slot} bytes");
    // cbnz (jne 0), tbnz (jset 1), b.hi (jgt 0), cmp+b.ne (jne reg), each in range and past
    // its reach (TBNZ ±32 KiB, the others ±1 MiB).
    for jmp in [
        ins(0x55, 7, 0, 0, 0),
        ins(0x45, 7, 0, 0, 1),
        ins(0x25, 7, 0, 0, 0),
        ins(0x5d, 7, 8, 0, 0),
    ] {
        for pad in [2usize, 40, 1100] {
            for taken in [false, true] {
                for f in BOTH {
                    let p = forward(jmp, pad, taken);
                    let out = emit_program(&prog(&p), &hs, f).unwrap();
                    let span = out.bytes.len();
                    let want = if taken { 1 } else { 5 };
                    assert_eq!(
                        run_bytes(&out.bytes, &mut []),
                        want,
                        "jmp {:#x} pad {pad} ({span} bytes) taken {taken}",
                        jmp[0]
                    );
                    let reach = if jmp[0] == 0x45 { 32 << 10 } else { 1 << 20 };
                    assert_eq!(
                        out.passes,
                        if span > reach { 2 } else { 1 },
                        "jmp {:#x} pad {pad}",
                        jmp[0]
                    );
                }
            }
        }
    }
    // Backward: r9 counts iterations of a loop body spanning > 1 MiB.
    // r1 = 5; r6 = 163; r8 = 3; loop: pad x callx r6; r9 += 1; r8 -= 1; if r8 != 0 goto loop; r0 = r9; exit
    let pad = 1100;
    let mut p = vec![mov64(1, 5), mov64(6, 163), mov64(8, 3), mov64(9, 0)];
    p.extend(std::iter::repeat_n(ins(0x8d, 6, 0, 0, 0), pad));
    p.extend([
        a64i(ADD, 9, 1),
        a64i(SUB, 8, 1),
        ins(0x55, 8, 0, -(pad as i16 + 3), 0),
        a64r(MOV, 0, 9),
        EXIT,
    ]);
    let out = emit_program(&prog(&p), &hs, 0).unwrap();
    assert_eq!(out.passes, 2);
    assert_eq!(run_bytes(&out.bytes, &mut []), 3);
}

#[test]
fn long_conditional_forms_are_used_only_when_needed() {
    let near = emit_program(
        &prog(&[mov64(0, 0), ins(0x55, 1, 0, 1, 0), mov64(0, 1), EXIT]),
        &[],
        0,
    )
    .unwrap();
    assert_eq!(near.passes, 1);
    let mut p = vec![mov64(0, 0), ins(0x55, 1, 0, 30000, 0)];
    p.extend(std::iter::repeat_n(ld64(3, 0x1234_5678_9abc_def0), 15000).flatten());
    p.push(EXIT);
    let far = emit_program(&prog(&p), &[], 0).unwrap();
    assert_eq!(
        far.passes, 1,
        "30000 lddw x4 insns = 480 KiB is within CBNZ reach"
    );
    let mut p = vec![mov64(0, 0), ins(0x45, 2, 0, 30000, 4)];
    p.extend(std::iter::repeat_n(ld64(0, 0x1234_5678_9abc_def0), 15000).flatten());
    p.push(EXIT);
    let far = emit_program(&prog(&p), &[], 0).unwrap();
    assert_eq!(
        far.passes, 2,
        "TBNZ beyond 32 KiB is re-emitted in the long form"
    );
    let mut m = [0u8; 8];
    assert_eq!(run_bytes(&far.bytes, &mut m), 0x1234_5678_9abc_def0);
}
