//! Runs emitted code under qemu-riscv64 (or on RV64 hardware) through `packjit::Runtime`
//! (the rv64 backend as a static rlib, code in the shared W^X arena; fixed programs both
//! sandboxed and trusted): fixed programs for every
//! instruction class, local calls, helpers, callx, branch-range edges, the >1 MiB program, on
//! every feature path, with expected values checked against the testkit's reference
//! evaluator; and random programs from the testkit's generator on the feature sets the
//! testkit's own differential test does not cover.
#![cfg(target_arch = "riscv64")]

mod common;
use common::*;
use packjit::{LoadOptions, Program, Runtime};
use packjit_plugin_api::{Arch, PjHelperFn};
use packjit_rv64::{Rv64Backend, FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
use packjit_testkit::reference::Reference;
use std::sync::{Arc, OnceLock};

const FEATURE_SETS: [u64; 4] = [
    0,
    FEATURE_C,
    FEATURE_ZBB | FEATURE_ZBA,
    FEATURE_C | FEATURE_ZBB | FEATURE_ZBA,
];

extern "C" fn mix(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a.wrapping_mul(3) ^ b.rotate_left(7) ^ c.wrapping_add(d << 1) ^ e.wrapping_mul(0x9e37_79b9)
}
extern "C" fn plus_one(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_add(1)
}

/// Helper ids the fixed programs call: (id, name, function), for the runtime and the reference.
const HELPERS: [(u32, &str, PjHelperFn); 2] = [(1, "mix", mix), (5, "plus_one", plus_one)];

/// One runtime for every fixed-program test (it is shared across threads by design).
fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let rt = Runtime::new().expect("runtime");
        rt.add_backend(Arc::new(Rv64Backend::new()))
            .expect("rv64 backend");
        for (id, name, f) in HELPERS {
            rt.register_helper(id, name, f).expect("helper");
        }
        rt
    })
}

fn reference() -> Reference {
    HELPERS
        .iter()
        .fold(Reference::new(), |r, &(id, _, f)| r.with_helper(id, f))
}

/// The reference's r0 for `code` on `mem` (which it updates).
fn expected(code: &[u8], mem: &mut [u8]) -> u64 {
    reference()
        .run(code, mem)
        .unwrap_or_else(|e| panic!("reference evaluator: {e}"))
        .r0
}

/// Compiles for RV64 with exactly `features` into the runtime's arena, sandboxed (the
/// runtime's default).
fn load(code: &[u8], features: u64) -> Program {
    load_mode(code, features, false)
}

/// [`load`], or trusted (unchecked) code when `trusted`.
fn load_mode(code: &[u8], features: u64, trusted: bool) -> Program {
    let opts = LoadOptions {
        arch: Some(Arch::Riscv64),
        features: Some(features),
        ..LoadOptions::default()
    };
    let p = if trusted {
        // SAFETY: the fixed test programs touch only their context and stack (each is
        // also run sandboxed, which would stop on anything else).
        unsafe { runtime().load_trusted(code, &opts) }
    } else {
        runtime().load(code, &opts)
    };
    let p = p.unwrap_or_else(|e| panic!("features {features:#x} trusted {trusted}: {e}"));
    assert_eq!(p.features(), features);
    // The reported count excludes data in the code (the constant pool, `callx` tables),
    // which a scan of the bytes would count as parcels.
    let scanned = packjit_rv64::native_insn_count(&p.code());
    assert!(
        p.native_insns() > 0 && p.native_insns() <= scanned,
        "features {features:#x}: {} native instructions reported, {scanned} parcels",
        p.native_insns()
    );
    p
}

/// Runs on every feature path, sandboxed and trusted; checks r0 against `want` and the
/// reference, and the context afterwards against the reference's.
fn check(code: &[u8], mem: &[u8], want: u64) {
    let mut m = mem.to_vec();
    assert_eq!(expected(code, &mut m), want, "reference evaluator");
    for f in FEATURE_SETS {
        for trusted in [false, true] {
            let mut m2 = mem.to_vec();
            let got = load_mode(code, f, trusted)
                .call(&mut m2)
                .unwrap_or_else(|e| panic!("features {f:#x} trusted {trusted}: {e}"));
            assert_eq!(got, want, "features {f:#x} trusted {trusted}");
            assert_eq!(m2, m, "memory after run, features {f:#x} trusted {trusted}");
        }
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
    let want = expected(&p, &mut mem.clone());
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
                    let want = expected(&p, &mut []);
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
    check(&p, &[], mix(1, 2, 3, 4, 5) + 1000);
    // callx known id, then unknown id from inside a nested local call: the program stops at
    // once with an UnknownCallx error naming the callx's pc (9), in the reference too.
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
    let e = reference().run(&p, &mut []).unwrap_err();
    assert!(e.to_string().contains("pc 9"), "reference: {e}");
    for f in FEATURE_SETS {
        let e = load(&p, f).call(&mut []).unwrap_err();
        assert_eq!(
            e.stop(),
            Some(packjit::Stop::UnknownCallx { pc: 9, id: 99 }),
            "features {f:#x}: {e}"
        );
        assert!(e.to_string().contains("helper id 99"), "{e}");
    }
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
        let native = load(&p, f);
        assert!(
            native.code_size() > 1 << 20,
            "code is {} bytes",
            native.code_size()
        );
        assert_eq!(
            native.call(&mut []).unwrap(),
            1000 * n as u64,
            "features {f:#x}"
        );
    }
}

// ---- differential testing ---------------------------------------------------------------------

/// testkit/tests/differential.rs runs the generator's programs on RV64 with no extensions
/// and with all of them (C+Zbb+Zba); this covers the two partial sets, C alone and Zbb+Zba
/// without C, with the same generator, checker and minimiser. Seeds and count honour the
/// same `PACKJIT_DIFF_SEED` / `PACKJIT_DIFF_COUNT` the mismatch report names.
#[test]
fn differential_partial_feature_sets() {
    use packjit_testkit::conformance::RuntimeEngine;
    use packjit_testkit::gen::{check_seed, helpers, Checked};
    // Its own runtime: the generator's helper ids overlap the fixed programs' ones.
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(Rv64Backend::new())).unwrap();
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    let count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(2000);
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x5eed_0000);
    for features in [FEATURE_C, FEATURE_ZBB | FEATURE_ZBA] {
        let engine = RuntimeEngine {
            rt: &rt,
            opts: LoadOptions {
                arch: Some(Arch::Riscv64),
                features: Some(features),
                ..LoadOptions::default()
            },
        };
        let mut with_rbpf = 0;
        for seed in base..base + count {
            match check_seed(&engine, seed) {
                Ok(Checked::Agree { rbpf }) => with_rbpf += rbpf as u64,
                Ok(Checked::CompiledOnly { .. }) => {
                    panic!("seed {seed:#x}: compiled but not run on the native arch")
                }
                Err(m) => panic!("features {features:#x}: {m}"),
            }
        }
        packjit_testkit::report(&format!(
            "rv64 differential (features {features:#x}): seeds {base:#x}..{:#x}: {count} run and matched, {with_rbpf} also matched rbpf",
            base + count
        ));
    }
}
