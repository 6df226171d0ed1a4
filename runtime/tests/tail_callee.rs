//! Tail calls made inside bpf-to-bpf functions (natively on x86-64, under qemu-user in the
//! cross runs), sandboxed and trusted: the target is entered as a callee, its `exit`
//! returns to the function's caller with the target's r0, the count of 33 is the run's,
//! and a stop in the target ends the whole run.

mod elf_support;
mod host;

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{Budget, LoadOptions, Program, RunError, Stop, Tier, Trust};
use packjit_frontend::encode_insn;
use std::sync::Arc;

/// One instruction.
fn i(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> Vec<u8> {
    encode_insn(op, dst, src, off, imm).to_vec()
}

/// `lddw dst, map k` (`BPF_PSEUDO_MAP_FD`).
fn map_ref(dst: u8, k: i32) -> Vec<u8> {
    [i(0x18, dst, 1, 0, k), i(0, 0, 0, 0, 0)].concat()
}

const EXIT: u8 = 0x95;
const CALL: u8 = 0x85;
const TRUSTS: [Trust; 2] = [Trust::Sandboxed, Trust::Trusted];

/// Both trusts on the baseline, and on the optimizing tier where this build has it (whose
/// tail calls, the entry's too, all nest their targets through the runner). The programs of
/// one case share a tier; a printed line names the case a failure comes from.
fn modes() -> Vec<(Tier, Trust)> {
    let tiers: &[Tier] = if Tier::Optimized.is_built() {
        &[Tier::Baseline, Tier::Optimized]
    } else {
        &[Tier::Baseline]
    };
    let modes = tiers.iter().flat_map(|&t| TRUSTS.map(|trust| (t, trust)));
    modes
        .inspect(|(tier, trust)| println!("case: {tier:?}, {trust:?}"))
        .collect()
}

/// What [`caller`] adds to its function's result: r7 (1000), r8 (500) and the u64 it keeps
/// at r10 - 8 (1000), all set before the call.
const CALLER_ADDS: u64 = 2500;

/// Counts itself in mem[1], keeps 1000 in r7, 500 in r8 and 1000 at r10 - 8, calls `f`,
/// sets mem[3] = 1 after the call, and returns f's r0 + r7 + r8 + *(r10 - 8). `f` writes
/// r6-r9 and its own frame (which the caller must not see), then tail calls slot
/// mem[`index_at`] of prog array 0, and returns -1 when the tail call falls through.
fn caller_at(index_at: i16) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),        // 0: r6 = ctx
        i(0x71, 2, 6, 1, 0),        // 1: r2 = mem[1]
        i(0x07, 2, 0, 0, 1),        // 2: r2 += 1
        i(0x73, 6, 2, 1, 0),        // 3: mem[1] = r2
        i(0xb7, 7, 0, 0, 1000),     // 4: r7 = 1000
        i(0xb7, 8, 0, 0, 500),      // 5: r8 = 500
        i(0x7b, 10, 7, -8, 0),      // 6: *(u64 *)(r10 - 8) = r7
        i(0xbf, 1, 6, 0, 0),        // 7: r1 = ctx
        i(CALL, 0, 1, 0, 6),        // 8: call f (pc 15)
        i(0x72, 6, 0, 3, 1),        // 9: mem[3] = 1
        i(0x0f, 0, 7, 0, 0),        // 10: r0 += r7
        i(0x0f, 0, 8, 0, 0),        // 11: r0 += r8
        i(0x79, 1, 10, -8, 0),      // 12: r1 = *(u64 *)(r10 - 8)
        i(0x0f, 0, 1, 0, 0),        // 13: r0 += r1
        i(EXIT, 0, 0, 0, 0),        // 14
        i(0xb7, 6, 0, 0, 1),        // 15: f: r6 = 1
        i(0xb7, 7, 0, 0, 2),        // 16: r7 = 2
        i(0xb7, 8, 0, 0, 3),        // 17: r8 = 3
        i(0xb7, 9, 0, 0, 4),        // 18: r9 = 4
        i(0x7b, 10, 9, -8, 0),      // 19: *(u64 *)(r10 - 8) = r9 (f's own frame)
        i(0x71, 3, 1, index_at, 0), // 20: r3 = mem[index_at]
        map_ref(2, 0),              // 21: r2 = prog array
        i(CALL, 0, 0, 0, 12),       // 23: bpf_tail_call(ctx, map, index)
        i(0xb7, 0, 0, 0, -1),       // 24: fell through
        i(EXIT, 0, 0, 0, 0),        // 25
    ]
    .concat()
}

/// [`caller_at`] mem[2]: the lddw right before the call proves the array (inline form).
fn caller() -> Vec<u8> {
    caller_at(2)
}

/// [`caller`] with `f`'s prog array not proven at its tail call (a jump lands between the
/// `lddw` and the call): the chooser's form of the tail call.
fn caller_through_chooser() -> Vec<u8> {
    let mut code = caller();
    code.truncate(21 * 8);
    code.extend(
        [
            map_ref(2, 0),        // 21: r2 = prog array
            i(0x05, 0, 0, 0, 0),  // 23: ja +0: the call starts a basic block
            i(CALL, 0, 0, 0, 12), // 24: bpf_tail_call
            i(0xb7, 0, 0, 0, -1), // 25
            i(EXIT, 0, 0, 0, 0),  // 26
        ]
        .concat(),
    );
    code
}

/// Writes r6-r9 and its own frame, returns `r0`.
fn leaf(r0: i32) -> Vec<u8> {
    [
        i(0xb7, 6, 0, 0, 111),
        i(0xb7, 7, 0, 0, 222),
        i(0xb7, 8, 0, 0, 333),
        i(0xb7, 9, 0, 0, 444),
        i(0x7b, 10, 9, -8, 0),
        i(0x7b, 10, 9, -512, 0),
        i(0xb7, 0, 0, 0, r0),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// Spins at pc 2 (`ja -1`) until the budget ends the run there.
fn spinning_target() -> Vec<u8> {
    [
        i(0xb7, 0, 0, 0, 0),
        i(0xb7, 6, 0, 0, 9),
        i(0x05, 0, 0, -1, 0), // pc 2: ja -1
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// Reads past a 4-byte context at pc 1 (sandboxed: stopped there).
fn reading_past_the_context() -> Vec<u8> {
    [
        i(0xb7, 0, 0, 0, 0),
        i(0x71, 0, 1, 64, 0), // pc 1: r0 = *(u8 *)(ctx + 64)
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// Spins mem[6..8] rounds (back-edge at pc 3), then returns 9.
fn counting_target() -> Vec<u8> {
    [spin_rounds(1, 6), i(0xb7, 0, 0, 0, 9), i(EXIT, 0, 0, 0, 0)].concat()
}

/// Counts itself in mem[1], tail calls slot mem[0] from its entry function, and returns
/// `base` + mem[1] as it found it when that tail call falls through.
fn entry_tail_caller(base: i32) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),
        i(0x71, 7, 6, 1, 0), // r7 = mem[1]
        i(0xbf, 8, 7, 0, 0),
        i(0x07, 8, 0, 0, 1),
        i(0x73, 6, 8, 1, 0), // mem[1] = r7 + 1
        i(0x71, 3, 6, 0, 0), // r3 = mem[0]
        map_ref(2, 0),
        i(CALL, 0, 0, 0, 12),
        i(0xbf, 0, 7, 0, 0),
        i(0x07, 0, 0, 0, base),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

fn prog_array(entries: u32) -> (Arc<Map>, LoadOptions) {
    let jumps = Map::new(MapSpec {
        name: "jumps".into(),
        map_type: MapType::ProgArray,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        flags: 0,
    })
    .unwrap();
    let opts = LoadOptions {
        maps: vec![jumps.clone()],
        ..Default::default()
    };
    (jumps, opts)
}

fn load_as(rt: &packjit::Runtime, trust: Trust, code: &[u8], opts: &LoadOptions) -> Arc<Program> {
    Arc::new(match trust {
        Trust::Sandboxed => rt.load(code, opts).unwrap(),
        // SAFETY: the test programs touch only their context and stack, within bounds.
        Trust::Trusted => unsafe { rt.load_trusted(code, opts) }.unwrap(),
    })
}

#[test]
fn a_target_entered_from_a_function_returns_to_its_caller_whose_registers_and_stack_survive() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, opts) = prog_array(4);
        let opts = LoadOptions { tier, ..opts };
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        rt.set_prog_array(&jumps, 2, Some(load(&leaf(7)))).unwrap();
        for (how, c) in [
            ("inline", load(&caller())),
            ("chooser", load(&caller_through_chooser())),
        ] {
            let mut mem = [0u8, 0, 2, 0];
            assert_eq!(
                c.call(&mut mem).unwrap(),
                7 + CALLER_ADDS,
                "{trust:?} {how}: the target's r0 is f's, r7, r8 and the frame the caller's"
            );
            assert_eq!(mem[1], 1, "{trust:?} {how}: the caller ran once");
            // Empty slot, out of range: f goes on after its tail call.
            for slot in [3u8, 4, 200] {
                let mut mem = [0u8, 0, slot, 0];
                assert_eq!(
                    c.call(&mut mem).unwrap(),
                    CALLER_ADDS.wrapping_sub(1),
                    "{trust:?} {how}: slot {slot} falls through in f"
                );
            }
            // A target of the other trust is not entered.
            let other = load_as(&rt, trust_other(trust), &leaf(9), &opts);
            rt.set_prog_array(&jumps, 3, Some(other)).unwrap();
            let mut mem = [0u8, 0, 3, 0];
            assert_eq!(
                c.call(&mut mem).unwrap(),
                CALLER_ADDS.wrapping_sub(1),
                "{trust:?} {how}"
            );
            rt.set_prog_array(&jumps, 3, None).unwrap();
        }
    }
}

/// A hash map of `u32` keys and `u64` values holding `key 0 = value`.
fn hash_holding(name: &str, value: u64) -> Arc<Map> {
    let m = Map::new(MapSpec {
        name: name.into(),
        map_type: MapType::Hash,
        key_size: 4,
        value_size: 8,
        max_entries: 4,
        flags: 0,
    })
    .unwrap();
    m.update(&0u32.to_le_bytes(), &value.to_le_bytes(), 0)
        .unwrap();
    m
}

/// `r0 = *lookup(map k, key 0)`, or `missing` when the lookup finds nothing. The map is
/// not proven at the call (a jump lands between), so the helper looks the handle up among
/// the running program's maps (NULL for a map it does not have), and the value is read
/// through a pointer nothing vouched for: sandboxed, checked against the running program's
/// regions.
fn read_own_map(k: i32, missing: i32) -> Vec<u8> {
    [
        i(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0
        i(0xbf, 2, 10, 0, 0),  // r2 = r10
        i(0x07, 2, 0, 0, -4),  // r2 += -4
        map_ref(1, k),         // r1 = map k
        i(0x05, 0, 0, 0, 0),   // ja +0: the call starts a basic block
        i(CALL, 0, 0, 0, 1),   // bpf_map_lookup_elem
        i(0x55, 0, 0, 2, 0),   // if r0 != 0 goto +2
        i(0xb7, 0, 0, 0, missing),
        i(EXIT, 0, 0, 0, 0),
        i(0x79, 0, 0, 0, 0), // r0 = *(u64 *)(r0 + 0)
    ]
    .concat()
}

#[test]
fn a_target_entered_from_a_function_has_its_own_maps_and_its_caller_gets_its_own_back() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, _) = prog_array(1);
        // The target reads its own map (40); the caller, after f returns, its own (2).
        let target = {
            let opts = LoadOptions {
                tier,
                maps: vec![hash_holding("theirs", 40)],
                ..Default::default()
            };
            load_as(
                &rt,
                trust,
                &[read_own_map(0, 1), i(EXIT, 0, 0, 0, 0)].concat(),
                &opts,
            )
        };
        rt.set_prog_array(&jumps, 0, Some(target)).unwrap();
        let opts = LoadOptions {
            tier,
            maps: vec![jumps.clone(), hash_holding("mine", 2)],
            ..Default::default()
        };
        // 0: call f; r6 = r0; r0 = *lookup(map 1) (1000000 if missing) + r6; exit.
        // f (pc 15): tail call slot 0 of map 0; -1 if it falls through.
        let caller = |chooser: bool| {
            let main = [
                i(CALL, 0, 1, 0, 14),
                i(0xbf, 6, 0, 0, 0),
                read_own_map(1, 1_000_000),
                i(0x0f, 0, 6, 0, 0),
                i(EXIT, 0, 0, 0, 0),
            ]
            .concat();
            assert_eq!(main.len(), 15 * 8);
            let mut f = [i(0xb7, 3, 0, 0, 0), map_ref(2, 0)].concat();
            if chooser {
                f.extend(i(0x05, 0, 0, 0, 0)); // ja +0: the call starts a basic block
            }
            f.extend(
                [
                    i(CALL, 0, 0, 0, 12),
                    i(0xb7, 0, 0, 0, -1),
                    i(EXIT, 0, 0, 0, 0),
                ]
                .concat(),
            );
            load_as(&rt, trust, &[main, f].concat(), &opts)
        };
        for (how, c) in [("inline", caller(false)), ("chooser", caller(true))] {
            let mut mem = [0u8; 4];
            assert_eq!(
                c.call(&mut mem).unwrap(),
                42,
                "{trust:?} {how}: the target read 40 from its map, the caller 2 from its own"
            );
        }
    }
}

fn trust_other(t: Trust) -> Trust {
    match t {
        Trust::Sandboxed => Trust::Trusted,
        Trust::Trusted => Trust::Sandboxed,
    }
}

#[test]
fn chains_of_function_and_entry_tail_calls_share_one_limit_of_33() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, opts) = prog_array(4);
        let opts = LoadOptions { tier, ..opts };
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        for (how, c) in [
            ("inline", load(&caller())),
            ("chooser", load(&caller_through_chooser())),
        ] {
            // Only function tail calls, each target entered inside the previous one: the
            // host's run and 33 tail calls run the caller 34 times; the 34th tail call
            // falls through (-1) and every level adds its own registers and frame.
            rt.set_prog_array(&jumps, 1, Some(c.clone())).unwrap();
            let mut mem = [0u8, 0, 1, 0];
            let r0 = c.call(&mut mem).unwrap();
            assert_eq!(
                mem[1], 34,
                "{trust:?} {how}: 33 tail calls, then one falls through"
            );
            assert_eq!(r0, 34 * CALLER_ADDS - 1, "{trust:?} {how}");
            // Alternating: the caller's f enters slot 2 (an entry tail caller), which tail
            // calls slot 1 (the caller) from its entry function, and so on. Runs 0, 2, …,
            // 32 are the caller, 1, 3, …, 33 the entry tail caller, whose 34th tail call
            // falls through: it returns 50 + 33; each caller adds its own.
            rt.set_prog_array(&jumps, 2, Some(load(&entry_tail_caller(50))))
                .unwrap();
            let mut mem = [1u8, 0, 2, 0];
            let r0 = c.call(&mut mem).unwrap();
            assert_eq!(mem[1], 34, "{trust:?} {how}: one count for both kinds");
            assert_eq!(r0, 50 + 33 + 17 * CALLER_ADDS, "{trust:?} {how}");
            // The count is the run's: the next run starts again at 0.
            let mut mem = [1u8, 0, 2, 0];
            assert_eq!(c.call(&mut mem).unwrap(), r0, "{trust:?} {how}");
            rt.set_prog_array(&jumps, 1, None).unwrap();
            rt.set_prog_array(&jumps, 2, None).unwrap();
        }
    }
}

#[test]
fn a_stop_in_a_target_entered_from_a_function_ends_the_run_with_the_targets_pc() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, mut opts) = prog_array(4);
        opts.budget = Budget::Limit(10_000);
        opts.tier = tier;
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        let c = load(&caller());
        // Slot 2 spins at pc 2: the budget ends the run there.
        let spin = spinning_target();
        rt.set_prog_array(&jumps, 2, Some(load(&spin))).unwrap();
        let mut mem = [0u8, 0, 2, 0];
        assert_eq!(
            c.call(&mut mem).unwrap_err(),
            RunError::Stop(Stop::Budget { pc: 2 }),
            "{trust:?}"
        );
        assert_eq!(mem[1], 1, "{trust:?}");
        assert_eq!(
            mem[3], 0,
            "{trust:?}: the caller did not go on after the stop"
        );
        // From the entry function: nothing after the tail call runs either.
        let entry_caller = [
            i(0xbf, 6, 1, 0, 0),
            i(0x71, 3, 6, 2, 0), // r3 = mem[2]
            map_ref(2, 0),
            i(CALL, 0, 0, 0, 12),
            i(0x72, 6, 0, 3, 1), // mem[3] = 1
            i(0xb7, 0, 0, 0, 5),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        let mut mem = [0u8, 0, 2, 0];
        assert_eq!(
            load(&entry_caller).call(&mut mem).unwrap_err(),
            RunError::Stop(Stop::Budget { pc: 2 }),
            "{trust:?}"
        );
        assert_eq!(
            mem[3], 0,
            "{trust:?}: the entry did not go on after the stop"
        );
        // The next runs are whole: a leaf in the slot, and an empty one.
        rt.set_prog_array(&jumps, 2, Some(load(&leaf(7)))).unwrap();
        for _ in 0..3 {
            assert_eq!(c.call(&mut [0, 0, 2, 0]).unwrap(), 7 + CALLER_ADDS);
            assert_eq!(
                c.call(&mut [0, 0, 3, 0]).unwrap(),
                CALLER_ADDS.wrapping_sub(1)
            );
        }
        if trust == Trust::Sandboxed {
            // An access past the context at pc 1 of the target.
            let oob = reading_past_the_context();
            rt.set_prog_array(&jumps, 2, Some(load(&oob))).unwrap();
            let e = c.call(&mut [0, 0, 2, 0]).unwrap_err();
            assert!(
                matches!(
                    e,
                    RunError::Stop(Stop::OutOfBounds {
                        pc: 1,
                        size: 1,
                        write: false,
                        ..
                    })
                ),
                "{e:?}"
            );
            rt.set_prog_array(&jumps, 2, Some(load(&leaf(8)))).unwrap();
            assert_eq!(c.call(&mut [0, 0, 2, 0]).unwrap(), 8 + CALLER_ADDS);
        }
        // A stop two targets deep: the caller's f enters slot 2, another caller whose f
        // enters slot mem[0] = 3, the spin. Neither caller goes on (mem[3] stays 0).
        rt.set_prog_array(&jumps, 2, Some(load(&caller_at(0))))
            .unwrap();
        rt.set_prog_array(&jumps, 3, Some(load(&spin))).unwrap();
        let mut mem = [3u8, 0, 2, 0];
        assert_eq!(
            c.call(&mut mem).unwrap_err(),
            RunError::Stop(Stop::Budget { pc: 2 }),
            "{trust:?}"
        );
        assert_eq!(mem[1], 2, "{trust:?}: both callers ran");
        assert_eq!(mem[3], 0, "{trust:?}: no caller went on after the stop");
        rt.set_prog_array(&jumps, 3, Some(load(&leaf(6)))).unwrap();
        let mut mem = [3u8, 0, 2, 0];
        assert_eq!(c.call(&mut mem).unwrap(), 6 + 2 * CALLER_ADDS, "{trust:?}");
        assert_eq!(mem[3], 1, "{trust:?}");
        for slot in [2, 3] {
            rt.set_prog_array(&jumps, slot, None).unwrap();
        }
    }
}

/// Keeps a 2-frame stack block (it calls `f`); after f's tail call returns, reads the
/// stack at r10 - mem[4..6] and the context at ctx + mem[6..8] (offsets the checks see only
/// at run time), and returns f's r0.
fn bounds_caller() -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),   // 0: r6 = ctx
        i(0xbf, 1, 6, 0, 0),   // 1: r1 = ctx
        i(CALL, 0, 1, 0, 9),   // 2: call f (pc 12)
        i(0x69, 2, 6, 4, 0),   // 3: r2 = *(u16 *)(ctx + 4)
        i(0xbf, 3, 10, 0, 0),  // 4: r3 = r10
        i(0x1f, 3, 2, 0, 0),   // 5: r3 -= r2
        i(0x71, 4, 3, 0, 0),   // 6: r4 = *(u8 *)(r3 + 0), checked
        i(0x69, 2, 6, 6, 0),   // 7: r2 = *(u16 *)(ctx + 6)
        i(0xbf, 3, 6, 0, 0),   // 8: r3 = ctx
        i(0x0f, 3, 2, 0, 0),   // 9: r3 += r2
        i(0x71, 4, 3, 0, 0),   // 10: r4 = *(u8 *)(r3 + 0), checked
        i(EXIT, 0, 0, 0, 0),   // 11
        i(0x7b, 10, 1, -8, 0), // 12: f: its own frame used
        i(0x71, 3, 1, 2, 0),   // 13: r3 = mem[2]
        map_ref(2, 0),         // 14
        i(CALL, 0, 0, 0, 12),  // 16
        i(0xb7, 0, 0, 0, -1),  // 17
        i(EXIT, 0, 0, 0, 0),   // 18
    ]
    .concat()
}

#[test]
fn after_a_target_entered_from_a_function_the_callers_bounds_are_its_own_again() {
    let rt = host::host_runtime();
    for (tier, _) in modes().into_iter().filter(|m| m.1 == Trust::Sandboxed) {
        let (jumps, opts) = prog_array(4);
        let opts = LoadOptions { tier, ..opts };
        let c = load_as(&rt, Trust::Sandboxed, &bounds_caller(), &opts);
        // The target has a stack block of its own (below the caller's on the native stack).
        let big = [
            i(0x7a, 10, 0, -512, 5), // *(u64 *)(r10 - 512) = 5
            i(0x79, 0, 10, -512, 0),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        rt.set_prog_array(&jumps, 2, Some(load_as(&rt, Trust::Sandboxed, &big, &opts)))
            .unwrap();
        let mem = |stack: u16, ctx: u16| {
            let mut m = [0u8; 16];
            m[2] = 2;
            m[4..6].copy_from_slice(&stack.to_le_bytes());
            m[6..8].copy_from_slice(&ctx.to_le_bytes());
            m
        };
        // Inside the caller's block (two frames: 1024 bytes) and context: allowed.
        for (stack, ctx) in [(1, 0), (1024, 15), (600, 8)] {
            assert_eq!(c.call(&mut mem(stack, ctx)).unwrap(), 5, "{stack} {ctx}");
        }
        // Below the caller's block, where the target's block and the runner's frame were,
        // and past the context: stopped at the caller's pcs.
        for stack in [1025, 1100, 1300, 1600, 2000, 3000] {
            let e = c.call(&mut mem(stack, 0)).unwrap_err();
            assert!(
                matches!(e, RunError::Stop(Stop::OutOfBounds { pc: 6, .. })),
                "r10 - {stack}: {e:?}"
            );
        }
        let e = c.call(&mut mem(1, 16)).unwrap_err();
        assert!(
            matches!(e, RunError::Stop(Stop::OutOfBounds { pc: 10, .. })),
            "{e:?}"
        );
    }
}

/// `depth` functions each calling the next (the entry first), the first callee tail
/// calling slot 0: a call chain `depth` frames deep. The entry goes on after its call
/// (`r0 += 0`), so the tail call enters its target as a callee.
fn chain(depth: usize) -> Vec<u8> {
    let mut code = vec![
        i(CALL, 0, 1, 0, 2),
        i(0x07, 0, 0, 0, 0),
        i(EXIT, 0, 0, 0, 0),
    ];
    // The first callee, at pc 3: tail calls, then calls the next function.
    code.push(map_ref(2, 0));
    code.push(i(0xb7, 3, 0, 0, 0));
    code.push(i(CALL, 0, 0, 0, 12)); // pc 6
    for _ in 2..depth {
        code.push(i(CALL, 0, 1, 0, 1));
        code.push(i(EXIT, 0, 0, 0, 0));
    }
    code.push(i(0xb7, 0, 0, 0, 3));
    code.push(i(EXIT, 0, 0, 0, 0));
    code.concat()
}

#[test]
fn a_function_tail_call_in_a_program_with_deeper_call_chains_than_4_frames_is_refused() {
    let rt = host::host_runtime();
    let (jumps, opts) = prog_array(2);
    for trust in TRUSTS {
        let ok = load_as(&rt, trust, &chain(4), &opts);
        // Slot 0 empty: the tail call falls through, the chain returns 3.
        assert_eq!(ok.call(&mut [0u8; 4]).unwrap(), 3, "{trust:?}");
        rt.set_prog_array(&jumps, 0, Some(load_as(&rt, trust, &leaf(4), &opts)))
            .unwrap();
        assert_eq!(ok.call(&mut [0u8; 4]).unwrap(), 4, "{trust:?}");
        rt.set_prog_array(&jumps, 0, None).unwrap();
        let e = match trust {
            Trust::Sandboxed => rt.load(&chain(5), &opts).unwrap_err(),
            // SAFETY: refused at load, never run.
            Trust::Trusted => unsafe { rt.load_trusted(&chain(5), &opts) }.unwrap_err(),
        }
        .to_string();
        for want in ["pc 6", "bpf-to-bpf function", "5 frames deep", "at most 4"] {
            assert!(e.contains(want), "{trust:?} {want}: {e}");
        }
    }
}

#[test]
fn a_clang_built_tail_call_from_a_static_noinline_function_runs_from_the_object() {
    use packjit::elf::ElfLoadOptions;
    use packjit::ElfObject;
    let obj = elf_support::compile_bpf("tail_callee");
    let rt = host::host_runtime();
    for trusted in [false, true] {
        let object = ElfObject::open(&obj, &[]).unwrap();
        let load = |section: &str| -> Arc<Program> {
            let sel = ElfLoadOptions::section(section);
            Arc::new(if trusted {
                // SAFETY: the programs touch their packet and their stack only.
                unsafe { object.load_trusted(&rt, &sel, &Default::default()) }.unwrap()
            } else {
                object.load(&rt, &sel, &Default::default()).unwrap()
            })
        };
        let entry = load("pj/entry");
        let entry_return = load("pj/entry_return");
        let stage = load("pj/stage");
        object
            .init_prog_arrays(&rt, &[("stage", stage.clone())])
            .unwrap();
        // Slot 1 (set statically): the stage's result is dispatch's; the entry adds its
        // own 3 * pkt[2] (a register across the call) and 7 (its frame).
        let mut pkt = [1u8, 20, 5, 0];
        assert_eq!(
            entry.call(&mut pkt).unwrap(),
            1000 + 20 + 15 + 7,
            "{trusted}"
        );
        assert_eq!(pkt[3], 1, "trusted {trusted}: the stage ran once");
        // Empty slot, out of range: dispatch goes on.
        for slot in [0u8, 2, 3, 4, 255] {
            let mut pkt = [slot, 20, 5, 0];
            assert_eq!(
                entry.call(&mut pkt).unwrap(),
                100 + 20 + 15 + 7,
                "trusted {trusted}, slot {slot}"
            );
            assert_eq!(pkt[3], 0);
        }
        // `return dispatch(pkt)`: the call in tail position, the stage's result the run's.
        let mut pkt = [1u8, 20, 5, 0];
        assert_eq!(entry_return.call(&mut pkt).unwrap(), 1000 + 20, "{trusted}");
        assert_eq!(pkt[3], 1, "trusted {trusted}: the stage ran once");
        for slot in [0u8, 2, 4, 255] {
            let mut pkt = [slot, 20, 5, 0];
            assert_eq!(
                entry_return.call(&mut pkt).unwrap(),
                100 + 20,
                "trusted {trusted}, slot {slot}"
            );
        }
        rt.set_prog_array(object.map("stages").unwrap(), 1, None)
            .unwrap();
    }
}

/// `r7 = *(u16 *)(r6 + off)`, then that many rounds of a two-instruction loop (none at 0):
/// four instructions, one back-edge per round after the first.
fn spin_rounds(base: u8, off: i16) -> Vec<u8> {
    [
        i(0x69, 7, base, off, 0), // r7 = *(u16 *)(base + off)
        i(0x15, 7, 0, 2, 0),      // if r7 == 0 goto +2
        i(0x17, 7, 0, 0, 1),      // r7 -= 1
        i(0x55, 7, 0, -2, 0),     // if r7 != 0 goto -2
    ]
    .concat()
}

/// Spins mem[4..6] rounds, calls f (which tail calls slot mem[2]), spins mem[8..10] rounds
/// and returns f's r0.
fn budget_caller() -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),  // 0
        spin_rounds(6, 4),    // 1-4
        i(0xbf, 1, 6, 0, 0),  // 5
        i(CALL, 0, 1, 0, 5),  // 6: call f (pc 12)
        spin_rounds(6, 8),    // 7-10
        i(EXIT, 0, 0, 0, 0),  // 11
        i(0x71, 3, 1, 2, 0),  // 12: f: r3 = mem[2]
        map_ref(2, 0),        // 13
        i(CALL, 0, 0, 0, 12), // 15
        i(0xb7, 0, 0, 0, -1), // 16
        i(EXIT, 0, 0, 0, 0),  // 17
    ]
    .concat()
}

#[test]
fn a_target_entered_from_a_function_counts_on_the_runs_budget_and_gives_back_the_rest() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, mut opts) = prog_array(4);
        opts.budget = Budget::Limit(1 << 20);
        opts.tier = tier;
        let c = load_as(&rt, trust, &budget_caller(), &opts);
        let target = counting_target();
        rt.set_prog_array(&jumps, 2, Some(load_as(&rt, trust, &target, &opts)))
            .unwrap();
        let mem = |before: u16, inside: u16, after: u16| {
            let mut m = [0u8; 16];
            m[2] = 2;
            m[4..6].copy_from_slice(&before.to_le_bytes());
            m[6..8].copy_from_slice(&inside.to_le_bytes());
            m[8..10].copy_from_slice(&after.to_le_bytes());
            m
        };
        // The least budget a run needs (the runs are deterministic).
        let least = |m: [u8; 16]| {
            let (mut lo, mut hi) = (1u64, 1u64 << 20);
            assert_eq!(c.call_with_budget(&mut m.clone(), hi).unwrap(), 9);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if c.call_with_budget(&mut m.clone(), mid).is_ok() {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        };
        // One budget for the run: the same 3000 rounds cost the same wherever they run,
        // before the call, in the target, after it, or split over the three.
        let all_before = least(mem(3000, 0, 0));
        for (before, inside, after) in [(0, 3000, 0), (0, 0, 3000), (1000, 1000, 1000)] {
            let need = least(mem(before, inside, after));
            assert!(
                need.abs_diff(all_before) <= 8,
                "{tier:?} {trust:?} ({before}, {inside}, {after}): {need} vs {all_before}"
            );
        }
        // One short: the stop is where the budget ran out.
        for (m, pc) in [(mem(1000, 2000, 0), 3), (mem(1000, 1000, 1000), 10)] {
            let need = least(m);
            assert_eq!(
                c.call_with_budget(&mut m.clone(), need - 1).unwrap_err(),
                RunError::Stop(Stop::Budget { pc }),
                "{tier:?} {trust:?}"
            );
        }
        rt.set_prog_array(&jumps, 2, None).unwrap();
    }
}

#[test]
fn a_program_cannot_call_the_runner_itself() {
    use packjit_plugin_api::PJ_HELPER_CALLEE_TAIL_CALL;
    let rt = host::host_runtime();
    let (_jumps, opts) = prog_array(2);
    // A tail call puts the runner in the load's helper table; a direct call of its id at
    // pc 5 is still refused.
    let code = [
        map_ref(2, 0),
        i(0xb7, 3, 0, 0, 0),
        i(CALL, 0, 0, 0, 12),
        i(0xb7, 1, 0, 0, 0),
        i(CALL, 0, 0, 0, PJ_HELPER_CALLEE_TAIL_CALL as i32),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat();
    for trust in TRUSTS {
        let e = match trust {
            Trust::Sandboxed => rt.load(&code, &opts).unwrap_err(),
            // SAFETY: refused at load, never run.
            Trust::Trusted => unsafe { rt.load_trusted(&code, &opts) }.unwrap_err(),
        }
        .to_string();
        assert!(
            e.contains("pc 5") && e.contains("not callable"),
            "{trust:?}: {e}"
        );
    }
}

// ---- Functions reached only through calls in tail position --------------------------------
//
// `return f(ctx)` compiles to `call f; exit`: nothing but `exit`s runs after such a call, so
// a tail call inside `f` leaves every frame and jumps to its target as the entry's does
// (`analysis::tail_reached`). These tests hold that to what entering the target as a callee
// gives.

/// Counts itself in mem[1] and keeps a u64 in its frame, then `return f(ctx)` through
/// `depth` functions (the entry first, each `call next; exit`); the last writes r6-r9 and
/// its own frame, tail calls slot mem[`index_at`] of prog array 0 (through a chooser when
/// `chooser`: a jump lands between the `lddw` and the call), and returns -1 when that falls
/// through.
fn tail_position_caller(depth: usize, index_at: i16, chooser: bool) -> Vec<u8> {
    let mut code = vec![
        i(0xbf, 6, 1, 0, 0),   // r6 = ctx
        i(0x71, 2, 6, 1, 0),   // r2 = mem[1]
        i(0x07, 2, 0, 0, 1),   // r2 += 1
        i(0x73, 6, 2, 1, 0),   // mem[1] = r2
        i(0x7b, 10, 6, -8, 0), // *(u64 *)(r10 - 8) = r6
        i(0xbf, 1, 6, 0, 0),   // r1 = ctx
    ];
    for _ in 1..depth {
        code.push(i(CALL, 0, 1, 0, 1)); // call the next function, right after this exit
        code.push(i(EXIT, 0, 0, 0, 0));
    }
    code.extend([
        i(0xb7, 6, 0, 0, 1),
        i(0xb7, 7, 0, 0, 2),
        i(0xb7, 8, 0, 0, 3),
        i(0xb7, 9, 0, 0, 4),
        i(0x7b, 10, 9, -8, 0),      // its own frame
        i(0x71, 3, 1, index_at, 0), // r3 = mem[index_at]
        map_ref(2, 0),
    ]);
    if chooser {
        code.push(i(0x05, 0, 0, 0, 0)); // ja +0: the call starts a basic block
    }
    code.extend([
        i(CALL, 0, 0, 0, 12),
        i(0xb7, 0, 0, 0, -1),
        i(EXIT, 0, 0, 0, 0),
    ]);
    code.concat()
}

#[test]
fn a_function_reached_only_through_calls_in_tail_position_ends_the_run_with_its_targets_r0() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, opts) = prog_array(4);
        let opts = LoadOptions { tier, ..opts };
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        rt.set_prog_array(&jumps, 2, Some(load(&leaf(7)))).unwrap();
        // Five frames: deeper than a target entered as a callee may run on
        // (`MAX_TAIL_CALLING_DEPTH`), none of them kept here. The optimizing tier nests
        // every tail call's target, the entry's too, and keeps that bound.
        let depths: &[usize] = match tier {
            Tier::Optimized => &[2, 3],
            _ => &[2, 3, 5],
        };
        for &depth in depths {
            for chooser in [false, true] {
                let case = format!("{tier:?} {trust:?}, depth {depth}, chooser {chooser}");
                let c = load(&tail_position_caller(depth, 2, chooser));
                let mut mem = [0u8, 0, 2, 0];
                assert_eq!(c.call(&mut mem).unwrap(), 7, "{case}: the target's r0");
                assert_eq!(mem[1], 1, "{case}: the caller ran once");
                // Empty slot, out of range: the function goes on after its tail call.
                for slot in [3u8, 4, 200] {
                    let mut mem = [0u8, 0, slot, 0];
                    assert_eq!(c.call(&mut mem).unwrap(), u64::MAX, "{case}, slot {slot}");
                }
                // A target of the other trust is not entered.
                let other = load_as(&rt, trust_other(trust), &leaf(9), &opts);
                rt.set_prog_array(&jumps, 3, Some(other)).unwrap();
                assert_eq!(c.call(&mut [0u8, 0, 3, 0]).unwrap(), u64::MAX, "{case}");
                // The caller in its own slot: the host's run and 33 tail calls, one count
                // for the run; the 34th falls through.
                rt.set_prog_array(&jumps, 1, Some(c.clone())).unwrap();
                let mut mem = [0u8, 0, 1, 0];
                assert_eq!(c.call(&mut mem).unwrap(), u64::MAX, "{case}");
                assert_eq!(mem[1], 34, "{case}: 33 tail calls, then one falls through");
                // Alternating with a tail call from an entry function (slot 2 calls slot 1
                // from its entry, slot 1 is this caller): still one count of 33.
                rt.set_prog_array(&jumps, 2, Some(load(&entry_tail_caller(50))))
                    .unwrap();
                let mut mem = [1u8, 0, 2, 0];
                let r0 = c.call(&mut mem).unwrap();
                assert_eq!(mem[1], 34, "{case}: one count for both kinds");
                assert_eq!(r0, 50 + 33, "{case}: the last entry tail caller's result");
                rt.set_prog_array(&jumps, 1, None).unwrap();
                rt.set_prog_array(&jumps, 2, Some(load(&leaf(7)))).unwrap();
            }
        }
    }
}

#[test]
fn a_function_one_of_whose_callers_goes_on_after_the_call_enters_its_target_as_a_callee() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, opts) = prog_array(4);
        let opts = LoadOptions { tier, ..opts };
        rt.set_prog_array(&jumps, 2, Some(load_as(&rt, trust, &leaf(7), &opts)))
            .unwrap();
        // The entry calls f twice: first going on after it (mem[3] = r0), then in tail
        // position. Had f's tail call left the frames, the run would end in the first call.
        let code = [
            i(0xbf, 6, 1, 0, 0),  // 0: r6 = ctx
            i(0xbf, 1, 6, 0, 0),  // 1: r1 = ctx
            i(CALL, 0, 1, 0, 4),  // 2: call f (pc 7)
            i(0x73, 6, 0, 3, 0),  // 3: mem[3] = r0
            i(0xbf, 1, 6, 0, 0),  // 4: r1 = ctx
            i(CALL, 0, 1, 0, 1),  // 5: call f, in tail position
            i(EXIT, 0, 0, 0, 0),  // 6
            i(0x71, 3, 1, 2, 0),  // 7: f: r3 = mem[2]
            map_ref(2, 0),        // 8
            i(CALL, 0, 0, 0, 12), // 10
            i(0xb7, 0, 0, 0, -1), // 11
            i(EXIT, 0, 0, 0, 0),  // 12
        ]
        .concat();
        let c = load_as(&rt, trust, &code, &opts);
        let mut mem = [0u8, 0, 2, 0];
        assert_eq!(c.call(&mut mem).unwrap(), 7, "{tier:?} {trust:?}");
        assert_eq!(
            mem[3], 7,
            "{tier:?} {trust:?}: the entry went on after the first call"
        );
    }
}

#[test]
fn a_stop_in_a_target_jumped_to_from_a_function_in_tail_position_ends_the_run() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, mut opts) = prog_array(4);
        opts.budget = Budget::Limit(10_000);
        opts.tier = tier;
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        let c = load(&tail_position_caller(3, 2, false));
        let spin = spinning_target();
        rt.set_prog_array(&jumps, 2, Some(load(&spin))).unwrap();
        assert_eq!(
            c.call(&mut [0u8, 0, 2, 0]).unwrap_err(),
            RunError::Stop(Stop::Budget { pc: 2 }),
            "{tier:?} {trust:?}"
        );
        if trust == Trust::Sandboxed {
            let oob = reading_past_the_context();
            rt.set_prog_array(&jumps, 2, Some(load(&oob))).unwrap();
            let e = c.call(&mut [0u8, 0, 2, 0]).unwrap_err();
            assert!(
                matches!(e, RunError::Stop(Stop::OutOfBounds { pc: 1, size: 1, .. })),
                "{tier:?}: {e:?}"
            );
        }
        // The next runs are whole.
        rt.set_prog_array(&jumps, 2, Some(load(&leaf(5)))).unwrap();
        for _ in 0..3 {
            assert_eq!(
                c.call(&mut [0u8, 0, 2, 0]).unwrap(),
                5,
                "{tier:?} {trust:?}"
            );
            assert_eq!(c.call(&mut [0u8, 0, 3, 0]).unwrap(), u64::MAX);
        }
    }
}

/// Spins mem[4..6] rounds, then `return f(ctx)` (`in_tail_position`) or `r0 = f(ctx); r0
/// += 0; return r0`, both with the call's function at pc 9; f spins mem[8..10] rounds and
/// tail calls slot mem[2], returning -1 when that falls through. The call is at pc 7 in
/// tail position, at pc 6 otherwise.
fn budget_tail_caller(in_tail_position: bool) -> Vec<u8> {
    let call = if in_tail_position {
        [
            i(0x07, 0, 0, 0, 0),
            i(CALL, 0, 1, 0, 1),
            i(EXIT, 0, 0, 0, 0),
        ]
    } else {
        [
            i(CALL, 0, 1, 0, 2),
            i(0x07, 0, 0, 0, 0),
            i(EXIT, 0, 0, 0, 0),
        ]
    };
    [
        i(0xbf, 6, 1, 0, 0),  // 0
        spin_rounds(6, 4),    // 1-4
        i(0xbf, 1, 6, 0, 0),  // 5
        call.concat(),        // 6-8
        i(0xbf, 6, 1, 0, 0),  // 9: f: r6 = ctx
        spin_rounds(6, 8),    // 10-13
        i(0x71, 3, 6, 2, 0),  // 14: r3 = mem[2]
        map_ref(2, 0),        // 15
        i(CALL, 0, 0, 0, 12), // 17
        i(0xb7, 0, 0, 0, -1), // 18
        i(EXIT, 0, 0, 0, 0),  // 19
    ]
    .concat()
}

#[test]
fn a_jump_from_a_function_in_tail_position_counts_the_budget_as_entering_the_target_does() {
    let rt = host::host_runtime();
    for (tier, trust) in modes() {
        let (jumps, mut opts) = prog_array(4);
        opts.budget = Budget::Limit(1 << 20);
        opts.tier = tier;
        let jumping = load_as(&rt, trust, &budget_tail_caller(true), &opts);
        let entering = load_as(&rt, trust, &budget_tail_caller(false), &opts);
        let target = counting_target();
        rt.set_prog_array(&jumps, 2, Some(load_as(&rt, trust, &target, &opts)))
            .unwrap();
        let mut m = [0u8; 16];
        m[2] = 2;
        m[4] = 3; // rounds before the call
        m[6] = 4; // in the target
        m[8] = 2; // in f
        let (mut stops, mut finished) = (0, 0);
        for budget in 0..80 {
            let a = jumping.call_with_budget(&mut m.clone(), budget);
            let b = entering.call_with_budget(&mut m.clone(), budget);
            let case = format!("{tier:?} {trust:?}, budget {budget}: {a:?} / {b:?}");
            match (&a, &b) {
                (Ok(x), Ok(y)) => {
                    assert_eq!((x, y), (&9, &9), "{case}");
                    finished += 1;
                }
                // The same place, but for the call itself, one slot apart in the two.
                (
                    Err(RunError::Stop(Stop::Budget { pc: p })),
                    Err(RunError::Stop(Stop::Budget { pc: q })),
                ) => {
                    assert!(p == q || (*p, *q) == (7, 6), "{case}");
                    stops += 1;
                }
                _ => panic!("{case}"),
            }
        }
        assert!(
            stops > 0 && finished > 0,
            "{tier:?} {trust:?}: {stops} / {finished}"
        );
        rt.set_prog_array(&jumps, 2, None).unwrap();
    }
}
