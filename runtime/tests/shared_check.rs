//! The shared access check (docs/ARCHITECTURE.md, "One shared check per program"): an
//! access whose inline test fails passes its pc, size and direction to the program's one
//! copy of the full check in a packed descriptor. These tests run the host's backend
//! (natively, or under qemu-user for arm64 and RV64) at pcs past 16 bits, so every part of
//! the descriptor is exercised: the stop must name the exact pc, address, size and
//! direction, and accesses that only the stack block or a host region holds must pass.

mod host;

use packjit::{LoadOptions, MemRegion, RegionAccess, Stop};
use packjit_frontend::encode_insn as ins;

/// Straight-line filler: the accesses after it sit at pcs past 16 bits.
const FILLER: usize = 70_000;

fn with_filler(head: &[[u8; 8]], tail: &[[u8; 8]]) -> (Vec<u8>, usize) {
    let mut code: Vec<u8> = head.concat();
    for k in 0..FILLER {
        code.extend(ins(0x07, 0, 0, 0, (k % 7) as i32)); // r0 += k mod 7
    }
    let tail_pc = head.len() + FILLER;
    code.extend(tail.concat());
    (code, tail_pc)
}

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

#[test]
fn a_context_overrun_at_a_far_pc_stops_with_its_pc_address_size_and_direction() {
    let rt = host::host_runtime();
    // r1 is the context start plus a constant: the inline test is `end <= len`, and its
    // failure goes to the shared check, which finds no region for it.
    let (code, pc) = with_filler(
        &[ins(0xb7, 0, 0, 0, 0)],
        &[ins(0x63, 1, 0, 14, 0), EXIT], // *(u32 *)(r1 + 14) = r0
    );
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let mut ctx = [0u8; 16];
    let e = p.call(&mut ctx).unwrap_err();
    assert_eq!(
        e.stop(),
        Some(Stop::OutOfBounds {
            pc,
            addr: ctx.as_ptr() as u64 + 14,
            size: 4,
            write: true
        }),
        "{e}"
    );
    assert_eq!(ctx, [0; 16], "a refused write must not land");
    // With room for it the same store lands.
    let mut ctx = [0u8; 18];
    let sum: u64 = (0..FILLER as u64).map(|k| k % 7).sum();
    assert_eq!(p.call(&mut ctx).unwrap(), sum);
    assert_eq!(
        u32::from_le_bytes(ctx[14..18].try_into().unwrap()),
        sum as u32
    );
}

#[test]
fn a_pointer_the_analysis_cannot_bound_passes_through_regions_and_stops_exactly() {
    let rt = host::host_runtime();
    let table = Box::new(std::array::from_fn::<u8, 32, _>(|i| (i * 5 + 1) as u8));
    // SAFETY: `table` outlives the program and every call (dropped at the end of the test).
    let region = unsafe { MemRegion::new(table.as_ptr(), table.len(), RegionAccess::ReadOnly) };
    let opts = LoadOptions {
        regions: vec![region],
        ..Default::default()
    };
    // r2 = the table's address, read from the context (so the analysis knows nothing of
    // it); r3 = a stack address through a scalar it cannot bound either (the context's
    // second word, 0 at run time).
    let (code, pc) = with_filler(
        &[
            ins(0x79, 2, 1, 0, 0),  // r2 = *(u64 *)(r1 + 0)
            ins(0x79, 4, 1, 8, 0),  // r4 = *(u64 *)(r1 + 8)
            ins(0xbf, 3, 10, 0, 0), // r3 = r10
            ins(0x07, 3, 0, 0, -16),
            ins(0x0f, 3, 4, 0, 0), // r3 += r4
            ins(0xb7, 0, 0, 0, 0),
        ],
        &[
            ins(0x71, 5, 2, 31, 0), // r5 = *(u8 *)(r2 + 31): the host region
            ins(0x7b, 3, 5, 0, 0),  // *(u64 *)(r3 + 0) = r5: the stack block
            ins(0x79, 6, 3, 0, 0),  // r6 = *(u64 *)(r3 + 0)
            ins(0x0f, 0, 6, 0, 0),  // r0 += r6
            ins(0x6b, 2, 0, 6, 0),  // *(u16 *)(r2 + 6) = r0: refused, read-only
            EXIT,
        ],
    );
    let p = rt.load(&code, &opts).unwrap();
    let mut ctx = [0u8; 16];
    ctx[..8].copy_from_slice(&(table.as_ptr() as u64).to_le_bytes());
    let e = p.call(&mut ctx).unwrap_err();
    // The three accesses before it passed: the stop is the store's, four slots further.
    assert_eq!(
        e.stop(),
        Some(Stop::OutOfBounds {
            pc: pc + 4,
            addr: table.as_ptr() as u64 + 6,
            size: 2,
            write: true
        }),
        "{e}"
    );
    assert_eq!(table[6], 31, "a refused write must not land");
    // Past the table's end by one byte: a read stop, same pc rules.
    let (code, pc) = with_filler(
        &[ins(0x79, 2, 1, 0, 0)],
        &[ins(0x69, 0, 2, 31, 0), EXIT], // r0 = *(u16 *)(r2 + 31)
    );
    let e = rt.load(&code, &opts).unwrap().call(&mut ctx).unwrap_err();
    assert_eq!(
        e.stop(),
        Some(Stop::OutOfBounds {
            pc,
            addr: table.as_ptr() as u64 + 31,
            size: 2,
            write: false
        }),
        "{e}"
    );
    drop(table);
}
