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
