//! Facts across bpf-to-bpf calls (`packjit_frontend::ranges::CallFacts`): a callee that gets
//! a caller's frame pointer or the context pointer in r1 reads through it without a check
//! when the access is proven inside the stack block or keeps the context check, and an
//! access past the block or the context still stops exactly where the reference does. Runs
//! the host's backend (natively, or under qemu-user for arm64 and RV64).

mod host;

use packjit::{LoadOptions, Runtime, Stop};
use packjit_frontend::encode_insn as ins;
use packjit_frontend::ranges::{plan_accesses, AccessCheck};

fn runtime() -> Runtime {
    host::host_runtime()
}

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

/// entry: *(u64 *)(r10 - 8) = 42 ; r1 = r10 - 8 ; call f ; exit.
/// f (pc 5): r0 = *(u64 *)(r1 + 0) (the caller's slot: proven) ; then `tail` ; exit.
fn frame_program(tail: [u8; 8]) -> Vec<u8> {
    [
        ins(0x7a, 10, 0, -8, 42), // 0: *(u64 *)(r10 - 8) = 42
        ins(0xbf, 1, 10, 0, 0),   // 1: r1 = r10
        ins(0x07, 1, 0, 0, -8),   // 2: r1 += -8
        ins(0x85, 0, 1, 0, 1),    // 3: call f
        EXIT,                     // 4
        ins(0x79, 0, 1, 0, 0),    // 5: f: r0 = *(u64 *)(r1 + 0)
        tail,                     // 6
        EXIT,                     // 7
    ]
    .concat()
}

fn checks(code: &[u8]) -> Vec<AccessCheck> {
    let prog = packjit_frontend::decode(code, &[]).unwrap();
    plan_accesses(&prog, true).checks.clone()
}

#[test]
fn a_callee_reads_its_callers_slot_unchecked() {
    // 6: r0 += 1 (no access).
    let code = frame_program(ins(0x07, 0, 0, 0, 1));
    assert_eq!(checks(&code)[5], AccessCheck::None);
    let rt = runtime();
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let mut ctx = [0u8; 16];
    assert_eq!(p.call(&mut ctx).unwrap(), 43);
}

#[test]
fn a_callee_indexing_past_the_block_stops() {
    // 6: r2 = *(u64 *)(r1 + 8): f's r10 + 512 = the entry's r10, the block's end.
    let code = frame_program(ins(0x79, 2, 1, 8, 0));
    let c = checks(&code);
    assert_eq!((c[5], c[6]), (AccessCheck::None, AccessCheck::Stack));
    let rt = runtime();
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let mut ctx = [0u8; 16];
    let e = p.call(&mut ctx).unwrap_err();
    match e.stop() {
        Some(Stop::OutOfBounds {
            pc: 6,
            size: 8,
            write: false,
            ..
        }) => {}
        other => panic!("expected a stop at pc 6, got {other:?}: {e}"),
    }
    // Below the callee's frame: *(u8 *)(r1 - 1024) = f's r10 - 520, past the block's start.
    let code = frame_program(ins(0x72, 1, 0, -1024, 7));
    assert_eq!(checks(&code)[6], AccessCheck::Stack);
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let e = p.call(&mut ctx).unwrap_err();
    assert!(
        matches!(
            e.stop(),
            Some(Stop::OutOfBounds {
                pc: 6,
                size: 1,
                write: true,
                ..
            })
        ),
        "{e}"
    );
}

#[test]
fn a_callee_indexing_past_the_context_stops() {
    // entry: call f with r1 = the context start ; f: r0 = *(u32 *)(r1 + 12) (inside) ;
    // r2 = *(u32 *)(r1 + 16) (the first byte past a 16-byte context).
    let code = [
        ins(0x85, 0, 1, 0, 1),  // 0: call f
        EXIT,                   // 1
        ins(0x61, 0, 1, 12, 0), // 2: f: r0 = *(u32 *)(r1 + 12)
        ins(0x61, 2, 1, 16, 0), // 3: r2 = *(u32 *)(r1 + 16)
        EXIT,                   // 4
    ]
    .concat();
    let c = checks(&code);
    assert_eq!(c[2], AccessCheck::CtxConst { end: 16 });
    assert_eq!(c[3], AccessCheck::CtxConst { end: 20 });
    let rt = runtime();
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let mut ctx = [0u8; 16];
    ctx[12] = 5;
    let e = p.call(&mut ctx).unwrap_err();
    assert_eq!(
        e.stop(),
        Some(Stop::OutOfBounds {
            pc: 3,
            addr: ctx.as_ptr() as u64 + 16,
            size: 4,
            write: false
        }),
        "{e}"
    );
    // With a 20-byte context the same program reads both.
    let mut ctx = [0u8; 20];
    ctx[12] = 5;
    ctx[16] = 9;
    assert_eq!(p.call(&mut ctx).unwrap(), 5);
}

/// Every combination of a frame pointer `r10 - k` passed to a callee and an access
/// `*(size *)(r1 + off)` there, inside the block or past either end of it, and a context
/// pointer `ctx + c` with an access at `off` from it: the result is the byte or word in
/// memory (the block is zeroed at entry, the entry's slot at -8 holds 42; the context holds
/// `i + 1` at byte i), or a stop at the access exactly when it leaves its region.
#[test]
fn callee_accesses_through_passed_pointers_match_the_regions() {
    let rt = runtime();
    const LEN: usize = 24;
    let size_bits = |size: i64| match size {
        1 => 0x10u8,
        4 => 0x00,
        _ => 0x18,
    };
    let (mut ran, mut proven, mut inside_n) = (0, 0, 0);
    for k in [0i64, 8, 16, 256, 504, 512, 520] {
        for off in [-1024i64, -1016, -520, -512, -8, -1, 0, 8, 504, 512, 520] {
            for size in [1i64, 8] {
                // entry: *(u64 *)(r10 - 8) = 42 ; r1 = r10 - k ; call f ; exit
                // f: r0 = *(size *)(r1 + off) ; exit
                let code = [
                    ins(0x7a, 10, 0, -8, 42),
                    ins(0xbf, 1, 10, 0, 0),
                    ins(0x07, 1, 0, 0, -k as i32),
                    ins(0x85, 0, 1, 0, 1),
                    EXIT,
                    ins(0x61 | size_bits(size), 0, 1, off as i16, 0),
                    EXIT,
                ]
                .concat();
                let p = rt.load(&code, &LoadOptions::default()).unwrap();
                let mut ctx = [0u8; LEN];
                // The address as an offset from the entry's r10 (the block's end); the block
                // is two frames.
                let at = off - k;
                let r = p.call(&mut ctx);
                let inside = at >= -1024 && at + size <= 0;
                inside_n += inside as usize;
                if checks(&code)[5] == AccessCheck::None {
                    assert!(inside, "proven but outside: k {k} off {off} size {size}");
                    proven += 1;
                }
                if inside {
                    // Little-endian: 42 is the byte at -8, the rest of the block is 0.
                    let want = (0..size)
                        .filter(|b| at + b == -8)
                        .map(|b| 42u64 << (8 * b))
                        .sum::<u64>();
                    assert_eq!(r.unwrap(), want, "k {k} off {off} size {size}");
                } else {
                    let e = r.unwrap_err();
                    assert!(
                        matches!(e.stop(), Some(Stop::OutOfBounds { pc: 5, .. })),
                        "k {k} off {off} size {size}: {e}"
                    );
                }
                ran += 1;
            }
        }
    }
    for c in [0i64, 4, 16, 23, 24] {
        for off in [-8i64, -1, 0, 3, 16, 20, 23] {
            for size in [1i64, 4, 8] {
                // entry: r2 = r1 + c ; call f ; exit.  f: r0 = *(size *)(r2 + off) ; exit
                let code = [
                    ins(0xbf, 2, 1, 0, 0),
                    ins(0x07, 2, 0, 0, c as i32),
                    ins(0x85, 0, 1, 0, 1),
                    EXIT,
                    ins(0x61 | size_bits(size), 0, 2, off as i16, 0),
                    EXIT,
                ]
                .concat();
                let p = rt.load(&code, &LoadOptions::default()).unwrap();
                let mut ctx: [u8; LEN] = std::array::from_fn(|i| i as u8 + 1);
                let at = c + off;
                let r = p.call(&mut ctx);
                if at >= 0 && at + size <= LEN as i64 {
                    let mut want = 0u64;
                    for b in (0..size).rev() {
                        want = want << 8 | ctx[(at + b) as usize] as u64;
                    }
                    assert_eq!(r.unwrap(), want, "c {c} off {off} size {size}");
                } else {
                    let e = r.unwrap_err();
                    assert_eq!(
                        e.stop(),
                        Some(Stop::OutOfBounds {
                            pc: 4,
                            addr: (ctx.as_ptr() as u64).wrapping_add(at as u64),
                            size: size as u32,
                            write: false
                        }),
                        "c {c} off {off} size {size}: {e}"
                    );
                }
                ran += 1;
            }
        }
    }
    assert_eq!(ran, 7 * 11 * 2 + 5 * 7 * 3);
    // f's [r10 - 512, r10 + 512) (its frame and its caller's, above it on every path) is
    // the whole block: every access inside it through the exact pointer is proven.
    assert_eq!(proven, inside_n);
}
