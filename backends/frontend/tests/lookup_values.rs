//! The access analysis' map-value fact (`ranges::Base::Lookup` / `Value`): after a lookup
//! the host vouches for (`Program::lookup_values`), accesses inside `[0, value_size)` of the
//! result are proven on the path where the program tested it against 0, and nowhere else.

use packjit_frontend::ranges::{plan_accesses, AccessCheck, LookupValue, NULL_GUARD};
use packjit_frontend::{decode, encode_insn as ins, Program};
use packjit_plugin_api::{HelperEntry, PJ_INLINE_NONE};

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];
const CALL: u8 = 0x85;

/// `r1 = handle ; r2 = r10 - 4 ; call 1` (instruction 3 is the call), then `rest`.
fn program(rest: &[[u8; 8]]) -> Vec<[u8; 8]> {
    let mut code = vec![
        ins(0x18, 1, 0, 0, 0x1000),
        ins(0, 0, 0, 0, 0),
        ins(0xbf, 2, 10, 0, 0),
        ins(0x07, 2, 0, 0, -4),
        ins(CALL, 0, 0, 0, 1),
    ];
    code.extend_from_slice(rest);
    code
}

/// The plan of `code` with the lookups at these instructions vouched for, each of
/// `value_size` bytes, writable or not.
fn plan_with(
    code: &[[u8; 8]],
    lookups: &[usize],
    value_size: u32,
    writable: bool,
) -> Vec<AccessCheck> {
    let helpers = [HelperEntry {
        id: 1,
        inline_kind: PJ_INLINE_NONE,
        addr: 0x1234,
    }];
    let mut p: Program = decode(&code.concat(), &helpers).expect("decodes");
    p.lookup_values = lookups
        .iter()
        .map(|&at| {
            assert!(matches!(
                p.insts[at].op,
                packjit_frontend::Op::CallHelper { .. }
            ));
            LookupValue {
                at: at as u32,
                value_size,
                writable,
            }
        })
        .collect();
    plan_accesses(&p, true).checks.clone()
}

/// The call is instruction 3 (after the two-slot `lddw`, one instruction).
const AT: usize = 3;

#[test]
fn a_tested_result_proves_the_value_and_not_one_byte_past_it() {
    for (fall_through, test) in [(true, 0x15), (false, 0x55)] {
        // `if r0 == 0 goto +2` (fall through non-NULL), or `if r0 != 0 goto +1` (taken).
        let body = if fall_through {
            vec![
                ins(test, 0, 0, 2, 0),
                ins(0x71, 3, 0, 23, 0), // r3 = *(u8 *)(r0 + 23): the last byte
                ins(0x71, 4, 0, 24, 0), // r4 = *(u8 *)(r0 + 24): one past
                EXIT,
            ]
        } else {
            vec![
                ins(test, 0, 0, 1, 0),
                EXIT,
                ins(0x71, 3, 0, 23, 0),
                ins(0x71, 4, 0, 24, 0),
                EXIT,
            ]
        };
        let checks = plan_with(&program(&body), &[AT], 24, true);
        let first = if fall_through { AT + 2 } else { AT + 3 };
        assert_eq!(
            checks[first],
            AccessCheck::None,
            "fall_through {fall_through}"
        );
        assert_eq!(
            checks[first + 1],
            AccessCheck::Unknown,
            "fall_through {fall_through}"
        );
    }
}

#[test]
fn copies_and_constant_offsets_of_the_result_are_proven_and_negative_offsets_are_not() {
    let checks = plan_with(
        &program(&[
            ins(0xbf, 6, 0, 0, 0),   // r6 = r0 (copied before the test)
            ins(0x07, 6, 0, 0, 8),   // r6 += 8
            ins(0x15, 0, 0, 4, 0),   // if r0 == 0 goto exit
            ins(0x79, 3, 6, 8, 0),   // *(u64 *)(r6 + 8): bytes 16..24
            ins(0x79, 3, 6, -8, 0),  // bytes 0..8
            ins(0x79, 3, 6, -16, 0), // below the value
            ins(0x7b, 6, 3, 8, 0),   // a write: 16..24
            EXIT,
        ]),
        &[AT],
        24,
        true,
    );
    assert_eq!(checks[AT + 4], AccessCheck::None);
    assert_eq!(checks[AT + 5], AccessCheck::None);
    assert_eq!(checks[AT + 6], AccessCheck::Unknown);
    assert_eq!(checks[AT + 7], AccessCheck::None);
}

#[test]
fn an_untested_result_stays_checked() {
    // Used without a test, or after a test of r0 + 8 (which says nothing of r0), or after a
    // test at 32 bits (the upper half may be non-zero).
    for test in [
        vec![],
        vec![
            ins(0xbf, 6, 0, 0, 0),
            ins(0x07, 6, 0, 0, 8),
            ins(0x15, 6, 0, 1, 0),
        ],
        vec![ins(0x16, 0, 0, 1, 0)],
    ] {
        let mut body = test.clone();
        body.push(ins(0x79, 3, 0, 0, 0));
        body.push(EXIT);
        let checks = plan_with(&program(&body), &[AT], 8, true);
        let load = AT + 1 + test.len();
        assert_eq!(
            checks[load],
            AccessCheck::Unknown,
            "after {} test insns",
            test.len()
        );
    }
    // A lookup the host did not vouch for: nothing is known of its result.
    let body = [ins(0x15, 0, 0, 1, 0), ins(0x79, 3, 0, 0, 0), EXIT];
    let checks = plan_with(&program(&body), &[], 8, true);
    assert_eq!(checks[AT + 2], AccessCheck::Unknown);
}

#[test]
fn a_read_only_value_is_proven_for_reads_only() {
    let body = [
        ins(0x15, 0, 0, 3, 0),
        ins(0x79, 3, 0, 0, 0), // read
        ins(0x7b, 0, 3, 0, 0), // write
        ins(0xdb, 0, 3, 0, 0), // atomic add
        EXIT,
    ];
    let checks = plan_with(&program(&body), &[AT], 8, false);
    assert_eq!(checks[AT + 2], AccessCheck::None);
    assert_eq!(checks[AT + 3], AccessCheck::Unknown);
    assert_eq!(checks[AT + 4], AccessCheck::Unknown);
    let checks = plan_with(&program(&body), &[AT], 8, true);
    assert_eq!(&checks[AT + 2..AT + 5], [AccessCheck::None; 3]);
}

#[test]
fn a_pointer_stored_to_the_stack_and_reloaded_stays_checked() {
    let body = [
        ins(0x15, 0, 0, 3, 0),
        ins(0x7b, 10, 0, -16, 0), // *(u64 *)(r10 - 16) = r0
        ins(0x79, 6, 10, -16, 0), // r6 = *(u64 *)(r10 - 16)
        ins(0x79, 3, 6, 0, 0),    // r3 = *(u64 *)(r6 + 0)
        EXIT,
    ];
    let checks = plan_with(&program(&body), &[AT], 8, true);
    assert_eq!(checks[AT + 4], AccessCheck::Unknown);
}

#[test]
fn a_pointer_through_a_helper_call_stays_checked() {
    // r1 = r0 after the test; call 1 again (not vouched for): r1 is clobbered, r6 is kept.
    let body = [
        ins(0x15, 0, 0, 5, 0),
        ins(0xbf, 6, 0, 0, 0),
        ins(0xbf, 1, 0, 0, 0),
        ins(CALL, 0, 0, 0, 1),
        ins(0x79, 3, 1, 0, 0), // through the clobbered r1
        ins(0x79, 3, 6, 0, 0), // through r6, still the tested value
        EXIT,
    ];
    let checks = plan_with(&program(&body), &[AT], 8, true);
    assert_eq!(checks[AT + 5], AccessCheck::Unknown);
    assert_eq!(checks[AT + 6], AccessCheck::None);
}

#[test]
fn a_loops_earlier_untested_result_is_not_vouched_for_by_this_rounds_test() {
    // r6 = r0 before the test, then the next round's call and its test of r0: r6 is the
    // previous round's result (or round one's 0), never proven; r0 is.
    let code = [
        ins(0xb7, 6, 0, 0, 0),      // 0: r6 = 0
        ins(0x18, 1, 0, 0, 0x1000), // 1: r1 = handle
        ins(0, 0, 0, 0, 0),
        ins(0xbf, 2, 10, 0, 0),  // 2
        ins(0x07, 2, 0, 0, -4),  // 3
        ins(CALL, 0, 0, 0, 1),   // 4: the lookup
        ins(0x15, 0, 0, 2, 0),   // 5: if r0 == 0 goto 8
        ins(0x79, 3, 6, 0, 0),   // 6: through r6
        ins(0x79, 3, 0, 0, 0),   // 7: through r0, tested
        ins(0xbf, 6, 0, 0, 0),   // 8: r6 = r0 (untested on the path from 5)
        ins(0x05, 0, 0, -10, 0), // 9: goto 1 (slot offsets: the lddw takes two)
        EXIT,                    // 10
    ];
    let checks = plan_with(&code, &[4], 8, true);
    assert_eq!(checks[6], AccessCheck::Unknown);
    assert_eq!(checks[7], AccessCheck::None);
}

#[test]
fn proofs_stay_inside_the_never_mapped_first_page() {
    // A value larger than the guard: its first NULL_GUARD bytes are proven, the rest checked
    // (a mispredicted NULL test leaves 0 in the pointer).
    let g = NULL_GUARD as i16;
    let body = [
        ins(0x15, 0, 0, 2, 0),
        ins(0x71, 3, 0, g - 1, 0),
        ins(0x71, 3, 0, g, 0),
        EXIT,
    ];
    let checks = plan_with(&program(&body), &[AT], 2 * NULL_GUARD, true);
    assert_eq!(checks[AT + 2], AccessCheck::None);
    assert_eq!(checks[AT + 3], AccessCheck::Unknown);
}

#[test]
fn a_test_of_one_lookups_result_says_nothing_of_anothers() {
    // r6 = lookup A's result ; lookup B ; if r0 == 0 goto exit ; *(r6 + 0) ; *(r0 + 0)
    let code = program(&[
        ins(0xbf, 6, 0, 0, 0),      // 4: r6 = r0 (lookup A, untested)
        ins(0x18, 1, 0, 0, 0x1000), // 5
        ins(0, 0, 0, 0, 0),
        ins(0xbf, 2, 10, 0, 0), // 6
        ins(0x07, 2, 0, 0, -4), // 7
        ins(CALL, 0, 0, 0, 1),  // 8: lookup B
        ins(0x15, 0, 0, 2, 0),  // 9
        ins(0x79, 3, 6, 0, 0),  // 10: A's, never tested
        ins(0x79, 3, 0, 0, 0),  // 11: B's, tested
        EXIT,
    ]);
    let checks = plan_with(&code, &[AT, 8], 8, true);
    assert_eq!(checks[10], AccessCheck::Unknown);
    assert_eq!(checks[11], AccessCheck::None);
}
