//! Maps and tail calls on the host's backend (natively on x86-64, under qemu-user in the
//! cross runs), sandboxed and trusted: the kernel's map helpers by id, inlined array
//! lookups, and tail calls as jumps, each checked against what the kernel's semantics give.

mod host;

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{Budget, LoadOptions, Program, RunError, Stop, Trust};
use packjit_frontend::encode_insn;
use std::sync::Arc;

fn spec(name: &str, map_type: MapType, key: u32, value: u32, entries: u32) -> MapSpec {
    MapSpec {
        name: name.into(),
        map_type,
        key_size: key,
        value_size: value,
        max_entries: entries,
        flags: 0,
    }
}

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

/// Both modes: the sandboxed load, and the trusted one.
fn load_both(rt: &packjit::Runtime, code: &[u8], opts: &LoadOptions) -> Vec<Program> {
    let sandboxed = rt.load(code, opts).expect("sandboxed load");
    // SAFETY: the test programs only touch their stack and the maps' values, through the
    // pointers the helpers hand out, within the values' sizes.
    let trusted = unsafe { rt.load_trusted(code, opts) }.expect("trusted load");
    assert_eq!(sandboxed.trust(), Trust::Sandboxed);
    assert_eq!(trusted.trust(), Trust::Trusted);
    vec![sandboxed, trusted]
}

/// key = mem[0] (u32 on the stack at r10-4); v = lookup(map, &key); if v: *v += 1,
/// r0 = *v; else update(map, &key, &one, BPF_NOEXIST), r0 = 100 + its result.
fn counter_program() -> Vec<u8> {
    [
        i(0x71, 6, 1, 0, 0),   // r6 = *(u8 *)(r1 + 0)
        i(0x63, 10, 6, -4, 0), // *(u32 *)(r10 - 4) = r6
        map_ref(1, 0),         // r1 = map 0
        i(0xbf, 2, 10, 0, 0),  // r2 = r10
        i(0x07, 2, 0, 0, -4),  // r2 += -4
        i(CALL, 0, 0, 0, 1),   // call bpf_map_lookup_elem
        i(0x15, 0, 0, 5, 0),   // if r0 == 0 goto +5
        i(0x79, 1, 0, 0, 0),   // r1 = *(u64 *)(r0 + 0)
        i(0x07, 1, 0, 0, 1),   // r1 += 1
        i(0x7b, 0, 1, 0, 0),   // *(u64 *)(r0 + 0) = r1
        i(0xbf, 0, 1, 0, 0),   // r0 = r1; exit
        i(EXIT, 0, 0, 0, 0),
        i(0x7a, 10, 0, -16, 1), // *(u64 *)(r10 - 16) = 1
        map_ref(1, 0),          // r1 = map 0
        i(0xbf, 2, 10, 0, 0),   // r2 = r10 - 4
        i(0x07, 2, 0, 0, -4),
        i(0xbf, 3, 10, 0, 0), // r3 = r10 - 16
        i(0x07, 3, 0, 0, -16),
        i(0xb7, 4, 0, 0, 1),   // r4 = BPF_NOEXIST
        i(CALL, 0, 0, 0, 2),   // call bpf_map_update_elem
        i(0x07, 0, 0, 0, 100), // r0 += 100
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn hash_counters_follow_the_kernels_semantics_in_both_modes() {
    let rt = host::host_runtime();
    for flavour in [MapType::Hash, MapType::LruHash] {
        let map = Map::new(spec("counts", flavour, 4, 8, 16)).unwrap();
        let opts = LoadOptions {
            maps: vec![map.clone()],
            ..Default::default()
        };
        let programs = load_both(&rt, &counter_program(), &opts);
        let mut model = std::collections::BTreeMap::<u32, u64>::new();
        for (round, key) in [3u8, 3, 9, 3, 200, 9].into_iter().enumerate() {
            let p = &programs[round % 2];
            let r0 = p.call(&mut [key, 0, 0, 0]).unwrap();
            let expected = match model.get_mut(&(key as u32)) {
                Some(v) => {
                    *v += 1;
                    *v
                }
                None => {
                    model.insert(key as u32, 1);
                    100
                }
            };
            assert_eq!(r0, expected, "{flavour:?} round {round}, key {key}");
        }
        for (k, v) in &model {
            assert_eq!(
                map.lookup(&k.to_le_bytes()).unwrap(),
                v.to_le_bytes().to_vec(),
                "{flavour:?}: host sees key {k}"
            );
        }
    }
}

/// r0 = lookup(array, &mem[0..4]); if r0: r0 = *(u64 *)(r0 + off); else r0 = 777.
fn array_program(off: i16) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0), // r6 = ctx
        map_ref(1, 0),
        i(0xbf, 2, 6, 0, 0), // r2 = ctx: the key
        i(CALL, 0, 0, 0, 1),
        i(0x15, 0, 0, 2, 0), // if r0 == 0 goto +2
        i(0x79, 0, 0, off, 0),
        i(EXIT, 0, 0, 0, 0),
        i(0xb7, 0, 0, 0, 777),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn array_lookups_are_inlined_bounded_and_checked() {
    let rt = host::host_runtime();
    let map = Map::new(spec("table", MapType::Array, 4, 16, 5)).unwrap();
    for i in 0..5u32 {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&(1000 + i as u64).to_le_bytes());
        v[8..].copy_from_slice(&(2000 + i as u64).to_le_bytes());
        map.update(&i.to_le_bytes(), &v, 0).unwrap();
    }
    let opts = LoadOptions {
        maps: vec![map.clone()],
        ..Default::default()
    };
    for p in load_both(&rt, &array_program(8), &opts) {
        for i in 0..5u32 {
            assert_eq!(p.call(&mut i.to_le_bytes()).unwrap(), 2000 + i as u64);
        }
        for key in [5u32, 6, 1 << 31, u32::MAX] {
            assert_eq!(p.call(&mut key.to_le_bytes()).unwrap(), 777, "key {key}");
        }
    }
    // Sandboxed: reading past the value's memory stops cleanly (the last element's value
    // ends where the map's value memory ends).
    let past = rt.load(&array_program(16), &opts).unwrap();
    match past.call(&mut 4u32.to_le_bytes()) {
        Err(RunError::Stop(Stop::OutOfBounds { .. })) => {}
        other => panic!("a read past the array: {other:?}"),
    }
    // The key pointer is checked like any other access: a key outside the program's memory.
    let wild = [
        map_ref(1, 0),
        i(0xb7, 2, 0, 0, 0x1000), // r2 = 0x1000
        i(CALL, 0, 0, 0, 1),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat();
    match rt.load(&wild, &opts).unwrap().call(&mut []) {
        Err(RunError::Stop(Stop::OutOfBounds { addr: 0x1000, .. })) => {}
        other => panic!("a wild key pointer: {other:?}"),
    }
}

/// `*(u64 *)(r10 - 8) = *(u64 *)ctx; r0 = lookup(map 0, r10 - 8); r0 = r0 ? *(u64 *)(r0 +
/// off) : 777`, as clang emits it: the key is the low four bytes of the context's first
/// eight, in the frame at a known place, its value known only at run time.
fn frame_key_program(off: i16) -> Vec<u8> {
    [
        i(0x79, 1, 1, 0, 0),   // r1 = *(u64 *)(r1 + 0)
        i(0x7b, 10, 1, -8, 0), // *(u64 *)(r10 - 8) = r1
        i(0xbf, 2, 10, 0, 0),  // r2 = r10
        i(0x07, 2, 0, 0, -8),  // r2 += -8
        map_ref(1, 0),
        i(CALL, 0, 0, 0, 1),
        i(0x15, 0, 0, 2, 0), // if r0 == 0 goto +2
        i(0x79, 0, 0, off, 0),
        i(EXIT, 0, 0, 0, 0),
        i(0xb7, 0, 0, 0, 777),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// clang's form for `u32 key = ctx->key`: the key loaded as a `u32` (zero-extended) and
/// stored from that register, which trusted code's lookup then uses without reading the
/// key back (`analysis::forwarded_key`, for strides up to 8).
fn stored_key_program(off: i16) -> Vec<u8> {
    [
        i(0x61, 1, 1, 0, 0),   // r1 = *(u32 *)(r1 + 0)
        i(0x63, 10, 1, -4, 0), // *(u32 *)(r10 - 4) = r1
        i(0xbf, 2, 10, 0, 0),  // r2 = r10
        i(0x07, 2, 0, 0, -4),  // r2 += -4
        map_ref(1, 0),
        i(CALL, 0, 0, 0, 1),
        i(0x15, 0, 0, 2, 0), // if r0 == 0 goto +2
        i(0x79, 0, 0, off, 0),
        i(EXIT, 0, 0, 0, 0),
        i(0xb7, 0, 0, 0, 777),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn frame_keys_are_read_from_the_frame_bounded_and_scaled_for_every_stride() {
    let rt = host::host_runtime();
    // Value sizes whose element strides (8-byte rounded) take each scaling: a shifted add
    // (8), a shift first (16, 32, 64), a multiply (24); one element, and a million. Bounds a
    // power of two up to 2048 (RV64's sandboxed select tests them by the mask itself) and
    // others.
    let cases = [
        (8u32, 7u32),
        (16, 3),
        (24, 5),
        (64, 1),
        (8, 1 << 20),
        (8, 4),
        (32, 2048),
        (16, 4096),
    ];
    for (value_size, entries) in cases {
        let map = Map::new(spec("table", MapType::Array, 4, value_size, entries)).unwrap();
        let mut probe = vec![0, 1, entries / 2, entries - 1];
        probe.retain(|&k| k < entries);
        for &k in &probe {
            let mut v = vec![0u8; value_size as usize];
            let at = value_size as usize - 8;
            v[at..].copy_from_slice(&(5000 + u64::from(k)).to_le_bytes());
            map.update(&k.to_le_bytes(), &v, 0).unwrap();
        }
        let opts = LoadOptions {
            maps: vec![map.clone()],
            ..Default::default()
        };
        let last = (value_size - 8) as i16;
        let programs = [frame_key_program(last), stored_key_program(last)];
        for p in programs.iter().flat_map(|code| load_both(&rt, code, &opts)) {
            let run = |key: u32, high: u32| {
                let mut mem = ((u64::from(high) << 32) | u64::from(key)).to_le_bytes();
                p.call(&mut mem).unwrap()
            };
            for &k in &probe {
                // The upper half of the stored word is not part of the key.
                for high in [0, 0xdead_beef] {
                    let got = run(k, high);
                    assert_eq!(
                        got,
                        5000 + u64::from(k),
                        "{:?} size {value_size} key {k}",
                        p.trust()
                    );
                }
            }
            for k in [entries, entries + 1, 1 << 31, u32::MAX] {
                assert_eq!(run(k, 0), 777, "{:?} size {value_size} key {k}", p.trust());
            }
        }
    }
    // Reading the key from the frame drops the argument setup and, sandboxed, the key's
    // check: shorter than the same program with a jump landing on the call, where the key
    // is read through r2.
    let map = Map::new(spec("table", MapType::Array, 4, 8, 4)).unwrap();
    map.update(&3u32.to_le_bytes(), &9u64.to_le_bytes(), 0)
        .unwrap();
    let opts = LoadOptions {
        maps: vec![map],
        ..Default::default()
    };
    let mut through_r2 = frame_key_program(0);
    // `ja +0` before the map reference (pc 4, byte 32) makes it a jump target: the pass
    // forgets r2 there (the lookup, in the map reference's block, is still inlined).
    through_r2.splice(32..32, i(0x05, 0, 0, 0, 0));
    // Trusted, the key stored from a register still holding it is not read back: shorter
    // than the same program with a jump landing between the store and the call (the key is
    // then read from the frame).
    let mut read_back = stored_key_program(0);
    read_back.splice(16..16, i(0x05, 0, 0, 0, 0)); // pc 2: ja +0
                                                   // SAFETY: the programs touch their stack and an element of the map.
    let (forwarded, from_frame) = unsafe {
        (
            rt.load_trusted(&stored_key_program(0), &opts).unwrap(),
            rt.load_trusted(&read_back, &opts).unwrap(),
        )
    };
    for key in [3u32, 4] {
        let want = if key == 3 { 9 } else { 777 };
        assert_eq!(forwarded.call(&mut key.to_le_bytes()).unwrap(), want);
        assert_eq!(from_frame.call(&mut key.to_le_bytes()).unwrap(), want);
    }
    assert!(
        forwarded.native_insns() < from_frame.native_insns(),
        "forwarded {} vs read back {}",
        forwarded.native_insns(),
        from_frame.native_insns()
    );
    for (frame, read) in load_both(&rt, &frame_key_program(0), &opts)
        .into_iter()
        .zip(load_both(&rt, &through_r2, &opts))
    {
        let mut key = 3u64.to_le_bytes();
        assert_eq!(frame.call(&mut key).unwrap(), 9);
        assert_eq!(read.call(&mut key).unwrap(), 9);
        assert!(
            frame.native_insns() < read.native_insns(),
            "{:?}: frame key {} vs read through r2 {}",
            frame.trust(),
            frame.native_insns(),
            read.native_insns()
        );
    }
}

/// `*(u32 *)(r10 - 4) = key; r0 = lookup(map 0, r10 - 4); r0 = r0 ? *(u64 *)(r0 + off) : 777`:
/// the key is a constant the front end folds into the element's address.
fn constant_key_program(key: i32, off: i16) -> Vec<u8> {
    [
        i(0xb7, 1, 0, 0, key), // r1 = key
        i(0x63, 10, 1, -4, 0), // *(u32 *)(r10 - 4) = r1
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        map_ref(1, 0),
        i(CALL, 0, 0, 0, 1),
        i(0x15, 0, 0, 2, 0),
        i(0x79, 0, 0, off, 0),
        i(EXIT, 0, 0, 0, 0),
        i(0xb7, 0, 0, 0, 777),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn constant_keys_fold_to_the_element_or_null_and_stay_checked() {
    let rt = host::host_runtime();
    let map = Map::new(spec("table", MapType::Array, 4, 16, 5)).unwrap();
    for i in 0..5u32 {
        let mut v = [0u8; 16];
        v[8..].copy_from_slice(&(3000 + i as u64).to_le_bytes());
        map.update(&i.to_le_bytes(), &v, 0).unwrap();
    }
    let opts = LoadOptions {
        maps: vec![map.clone()],
        ..Default::default()
    };
    for key in [0, 4, 5, -1, i32::MIN] {
        let want = if (0..5).contains(&key) {
            3000 + key as u64
        } else {
            777
        };
        for p in load_both(&rt, &constant_key_program(key, 8), &opts) {
            assert_eq!(p.call(&mut []).unwrap(), want, "key {key}, {:?}", p.trust());
        }
    }
    // The folded lookup is shorter than the one that reads its key: no load, bound or
    // scaling is left.
    let mut read_key = constant_key_program(2, 8);
    // The same program with a jump landing between the key's store and the call: another
    // path could arrive there, so the key is read.
    read_key.splice(16..16, i(0x05, 0, 0, 0, 0)); // pc 2: ja +0
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let load = |code: &[u8]| match trust {
            Trust::Sandboxed => rt.load(code, &opts).unwrap(),
            // SAFETY: the program touches its stack and an element of the map.
            Trust::Trusted => unsafe { rt.load_trusted(code, &opts) }.unwrap(),
        };
        let folded = load(&constant_key_program(2, 8));
        let unfolded = load(&read_key);
        assert_eq!(unfolded.call(&mut []).unwrap(), 3002);
        assert!(
            folded.native_insns() < unfolded.native_insns(),
            "{trust:?}: folded {} vs read {}",
            folded.native_insns(),
            unfolded.native_insns()
        );
    }
    // Sandboxed: the load through a folded element inside the array is proven (the access
    // analysis knows r0 after the folded call, and map values are static regions), so a use
    // costs no more native instructions than trusted; past the last value it is checked.
    let uses = |n: usize| {
        let one = [
            i(0xb7, 1, 0, 0, 2),
            i(0x63, 10, 1, -4, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            map_ref(1, 0),
            i(CALL, 0, 0, 0, 1),
            i(0x15, 0, 0, 2, 0), // if r0 == 0 skip the load and the add
            i(0x79, 7, 0, 8, 0),
            i(0x0f, 6, 7, 0, 0),
        ]
        .concat();
        let mut code = [one.repeat(n), i(0xbf, 0, 6, 0, 0), i(EXIT, 0, 0, 0, 0)].concat();
        code.splice(0..0, i(0xb7, 6, 0, 0, 0));
        code
    };
    let per_use: Vec<i64> = [Trust::Sandboxed, Trust::Trusted]
        .into_iter()
        .map(|trust| {
            let insns = |n| {
                let p = match trust {
                    Trust::Sandboxed => rt.load(&uses(n), &opts).unwrap(),
                    // SAFETY: the program touches its stack and an element of the map.
                    Trust::Trusted => unsafe { rt.load_trusted(&uses(n), &opts) }.unwrap(),
                };
                assert_eq!(p.call(&mut []).unwrap(), 3002 * n as u64, "{trust:?}");
                p.native_insns() as i64
            };
            insns(2) - insns(1)
        })
        .collect();
    assert!(
        per_use[0] <= per_use[1],
        "native instructions per use, sandboxed {} vs trusted {}",
        per_use[0],
        per_use[1]
    );
    // Sandboxed: a constant element's address is still checked; reading past the last
    // value stops.
    let past = rt.load(&constant_key_program(4, 16), &opts).unwrap();
    match past.call(&mut []) {
        Err(RunError::Stop(Stop::OutOfBounds { .. })) => {}
        other => panic!("a read past the array: {other:?}"),
    }
    // Per-CPU arrays take the constant key too (this CPU's copy).
    let percpu = Map::new(spec("pc", MapType::PercpuArray, 4, 8, 3)).unwrap();
    let cpus = Map::possible_cpus();
    let values: Vec<u8> = (0..cpus as u64).flat_map(|_| 41u64.to_le_bytes()).collect();
    percpu.update(&2u32.to_le_bytes(), &values, 0).unwrap();
    let opts = LoadOptions {
        maps: vec![percpu],
        ..Default::default()
    };
    for p in load_both(&rt, &constant_key_program(2, 0), &opts) {
        assert_eq!(p.call(&mut []).unwrap(), 41, "{:?}", p.trust());
    }
    for p in load_both(&rt, &constant_key_program(3, 0), &opts) {
        assert_eq!(p.call(&mut []).unwrap(), 777, "{:?}", p.trust());
    }
}

/// How a test program tests its lookup's result for NULL.
#[derive(Clone, Copy, Debug, PartialEq)]
enum NullTest {
    /// `if r0 == 0 goto null` right after the call; then the load through r0.
    Direct,
    /// `r6 = r0; if r6 == 0 goto null`; then the load through r0.
    Copy,
    /// clang's `if (!v) return 0; return *v;` (`r1 = r0; r0 = 0; if r1 == 0 goto out`),
    /// with 7 for 0 so that a NULL result shows the instructions before the test ran: `r1 =
    /// r0; r0 = 7; if r1 == 0 goto out` (7 returned); then the load through r1.
    Clang,
}

/// `key = K` (a constant) or `key = *(u32 *)(ctx + 0)`; `r0 = lookup(map 0, &key)`; the
/// NULL test of `shape`, optionally with a `goto +0` landing on it (`test_joined`); then
/// `*(u64 *)(v + 8)`, or 777 for NULL (7 for [`NullTest::Clang`]).
fn null_tested_program(key: Option<i32>, shape: NullTest, test_joined: bool) -> Vec<u8> {
    let mut code = vec![match key {
        Some(k) => i(0xb7, 1, 0, 0, k),
        None => i(0x61, 1, 1, 0, 0), // r1 = *(u32 *)(r1 + 0)
    }];
    code.extend([
        i(0x63, 10, 1, -4, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        map_ref(1, 0),
        i(CALL, 0, 0, 0, 1),
    ]);
    let (tested, value) = match shape {
        NullTest::Direct => (0, 0),
        NullTest::Copy => {
            code.push(i(0xbf, 6, 0, 0, 0)); // r6 = r0
            (6, 0)
        }
        NullTest::Clang => {
            code.push(i(0xbf, 1, 0, 0, 0)); // r1 = r0
            code.push(i(0xb7, 0, 0, 0, 7)); // r0 = 7
            (1, 1)
        }
    };
    if test_joined {
        code.push(i(0x05, 0, 0, 0, 0)); // goto +0: the test is a jump target
    }
    if shape == NullTest::Clang {
        code.extend([
            i(0x15, tested, 0, 1, 0),
            i(0x79, 0, value, 8, 0),
            i(EXIT, 0, 0, 0, 0),
        ]);
    } else {
        code.extend([
            i(0x15, tested, 0, 2, 0),
            i(0x79, 0, value, 8, 0),
            i(EXIT, 0, 0, 0, 0),
            i(0xb7, 0, 0, 0, 777),
            i(EXIT, 0, 0, 0, 0),
        ]);
    }
    code.concat()
}

/// The NULL test after an inlined array lookup costs nothing where the lookup knows the
/// answer: after a constant key it is decided at compile time (the front end's rewrite),
/// and after a run-time key the lookup's own bound sends NULL to where the test would
/// (trusted: the out-of-line NULL goes there, running clang's `r1 = r0; r0 = 0` again;
/// sandboxed: a branch on the select's flags on x86-64, the NULL's own branch on RV64 for a
/// power-of-two bound). Where another path reaches the test it stays, and every form gives
/// the kernel's results for keys inside and outside the array, for a bound that is a power
/// of two and one that is not.
#[test]
fn null_tests_after_inlined_lookups_are_decided_or_taken_over() {
    let rt = host::host_runtime();
    let shapes = [NullTest::Direct, NullTest::Copy, NullTest::Clang];
    for entries in [5u32, 8] {
        let map = Map::new(spec("table", MapType::Array, 4, 16, entries)).unwrap();
        for k in 0..entries {
            let mut v = [0u8; 16];
            v[8..].copy_from_slice(&(3000 + u64::from(k)).to_le_bytes());
            map.update(&k.to_le_bytes(), &v, 0).unwrap();
        }
        let opts = LoadOptions {
            maps: vec![map],
            ..Default::default()
        };
        let want = |key: i64, shape: NullTest| match shape {
            _ if (0..i64::from(entries)).contains(&key) => 3000 + key as u64,
            NullTest::Clang => 7,
            _ => 777,
        };
        for key in [0i64, 4, 5, 7, 8, -1, i64::from(i32::MIN)] {
            for shape in shapes {
                for test_joined in [false, true] {
                    let case =
                        format!("{entries} entries, key {key}, {shape:?}, joined {test_joined}");
                    // A constant key...
                    let code = null_tested_program(Some(key as i32), shape, test_joined);
                    for p in load_both(&rt, &code, &opts) {
                        let got = p.call(&mut []).unwrap();
                        assert_eq!(got, want(key, shape), "constant, {case}, {:?}", p.trust());
                    }
                    // ...and the same key read from the context.
                    let code = null_tested_program(None, shape, test_joined);
                    let mut ctx = (key as u32).to_le_bytes();
                    for p in load_both(&rt, &code, &opts) {
                        let got = p.call(&mut ctx).unwrap();
                        let want = want(i64::from(key as u32), shape);
                        assert_eq!(got, want, "from the context, {case}, {:?}", p.trust());
                    }
                }
            }
        }
        let size = |code: &[u8], trust: Trust| {
            let p = match trust {
                Trust::Sandboxed => rt.load(code, &opts).unwrap(),
                // SAFETY: the program touches its stack, its context and an element of the
                // map.
                Trust::Trusted => unsafe { rt.load_trusted(code, &opts) }.unwrap(),
            };
            p.native_insns()
        };
        for trust in [Trust::Sandboxed, Trust::Trusted] {
            for shape in shapes {
                // Decided: the test lowers to nothing, unless a jump lands on it (the `goto
                // +0` itself lowers to nothing).
                let decided = size(&null_tested_program(Some(2), shape, false), trust);
                let kept = size(&null_tested_program(Some(2), shape, true), trust);
                assert!(
                    decided < kept,
                    "{entries} entries, {trust:?}, {shape:?}: decided {decided} vs kept {kept}"
                );
                // Taken over. Trusted code drops the test, and so does RV64's branching
                // sandboxed select (a power-of-two bound); the in-line selects of x86-64 and
                // arm64 (and RV64's for other bounds) branch on their verdict for a test right
                // after the call: x86-64's `jae` for `test` + `je`, arm64's `cbz` and RV64's
                // `beqz` one instruction as the test was. Where the lookup's out-of-line NULL
                // goes on to the test's target, the instructions between the call and the
                // test (one `mov` each) are emitted a second time there: the total may grow
                // by them where the test was one instruction; the found path is shorter.
                let fused = size(&null_tested_program(None, shape, false), trust);
                let kept = size(&null_tested_program(None, shape, true), trust);
                let between = match shape {
                    NullTest::Direct => 0,
                    NullTest::Copy => 1,
                    NullTest::Clang => 2,
                };
                let riscv_branches = cfg!(target_arch = "riscv64") && entries.is_power_of_two();
                let replays = trust == Trust::Trusted || riscv_branches;
                let x86 = cfg!(target_arch = "x86_64");
                let strictly = match shape {
                    NullTest::Direct => replays || x86,
                    NullTest::Copy => trust == Trust::Trusted && x86,
                    NullTest::Clang => false,
                };
                let limit = if replays { kept + between } else { kept };
                assert!(
                    fused <= limit && (!strictly || fused < kept),
                    "{entries} entries, {trust:?}, {shape:?}: fused {fused} vs kept {kept}"
                );
            }
        }
    }
}

/// The NULL test jumping back, as clang places a shared `return` before a later lookup:
/// `goto +2; r0 = 777; exit; key = *(u32 *)(ctx + 0); r0 = lookup(map 0, &key); [goto +0;]
/// if r0 == 0 goto (r0 = 777); r0 = *(u64 *)(r0 + 8); exit`.
fn null_tested_backward(test_joined: bool) -> Vec<u8> {
    let test_slot: i16 = if test_joined { 11 } else { 10 };
    let mut code = vec![
        i(0x05, 0, 0, 2, 0),
        i(0xb7, 0, 0, 0, 777),
        i(EXIT, 0, 0, 0, 0),
        i(0x61, 1, 1, 0, 0),
        i(0x63, 10, 1, -4, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        map_ref(1, 0),
        i(CALL, 0, 0, 0, 1),
    ];
    if test_joined {
        code.push(i(0x05, 0, 0, 0, 0));
    }
    code.extend([
        i(0x15, 0, 0, -test_slot, 0), // back to `r0 = 777` (slot 1)
        i(0x79, 0, 0, 8, 0),
        i(EXIT, 0, 0, 0, 0),
    ]);
    code.concat()
}

/// A NULL test that jumps back is taken over only by trusted code without a budget: with
/// one, the back-edge's charge stays where the test is (the trusted run stops where the
/// sandboxed one does, at every budget).
#[test]
fn backward_null_tests_are_taken_over_only_without_a_budget() {
    let rt = host::host_runtime();
    let map = Map::new(spec("table", MapType::Array, 4, 16, 5)).unwrap();
    let mut v = [0u8; 16];
    v[8..].copy_from_slice(&3002u64.to_le_bytes());
    map.update(&2u32.to_le_bytes(), &v, 0).unwrap();
    let with = |budget| LoadOptions {
        maps: vec![map.clone()],
        budget,
        ..Default::default()
    };
    let opts = with(Budget::Default);
    for key in [2u32, 3, 5, u32::MAX] {
        let want = match key {
            2 => 3002,
            3 => 0,
            _ => 777,
        };
        for joined in [false, true] {
            for p in load_both(&rt, &null_tested_backward(joined), &opts) {
                let got = p.call(&mut key.to_le_bytes()).unwrap();
                assert_eq!(got, want, "key {key}, joined {joined}, {:?}", p.trust());
            }
        }
    }
    let load_trusted = |code: &[u8]| {
        // SAFETY: the program touches its stack, its context and an element of the map.
        unsafe { rt.load_trusted(code, &opts) }.unwrap()
    };
    let fused = load_trusted(&null_tested_backward(false));
    let kept = load_trusted(&null_tested_backward(true));
    assert!(
        fused.native_insns() < kept.native_insns(),
        "fused {} vs kept {}",
        fused.native_insns(),
        kept.native_insns()
    );
    let mut stopped = 0;
    for budget in 0..24 {
        let opts = with(Budget::Limit(budget));
        let runs: Vec<_> = load_both(&rt, &null_tested_backward(false), &opts)
            .iter()
            .map(|p| {
                p.call(&mut 9u32.to_le_bytes())
                    .map_err(|e| format!("{e:?}"))
            })
            .collect();
        assert_eq!(runs[0], runs[1], "budget {budget}: sandboxed, trusted");
        stopped += usize::from(runs[1].is_err());
    }
    // The budgets cover both sides of the back-edge's charge.
    assert!((1..24).contains(&stopped), "{stopped} of 24 runs stopped");
}

#[test]
fn a_lookups_null_is_in_no_region() {
    let rt = host::host_runtime();
    let map = Map::new(spec("h", MapType::Hash, 4, 8, 4)).unwrap();
    let opts = LoadOptions {
        maps: vec![map],
        ..Default::default()
    };
    // No NULL test: the sandbox must stop the load through NULL.
    let code = [
        i(0x62, 10, 0, -4, 42), // *(u32 *)(r10 - 4) = 42
        map_ref(1, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        i(CALL, 0, 0, 0, 1),
        i(0x79, 0, 0, 0, 0),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat();
    match rt.load(&code, &opts).unwrap().call(&mut []) {
        Err(RunError::Stop(Stop::OutOfBounds { addr: 0, .. })) => {}
        other => panic!("a load through NULL: {other:?}"),
    }
}

#[test]
fn a_forged_map_handle_gets_the_helpers_failure_value() {
    let rt = host::host_runtime();
    let map = Map::new(spec("h", MapType::Hash, 4, 8, 4)).unwrap();
    let opts = LoadOptions {
        maps: vec![map],
        ..Default::default()
    };
    // r1 = a stack address instead of a map: lookup gives NULL, update -EINVAL.
    let code = [
        i(0x62, 10, 0, -8, 1),
        i(0xbf, 1, 10, 0, 0),
        i(0x07, 1, 0, 0, -8),
        i(0xbf, 2, 1, 0, 0),
        i(0xbf, 3, 1, 0, 0),
        i(0xb7, 4, 0, 0, 0),
        i(CALL, 0, 0, 0, 2),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat();
    let r0 = rt.load(&code, &opts).unwrap().call(&mut []).unwrap();
    assert_eq!(r0 as i64, -22);
}

#[test]
fn a_map_reference_past_the_loads_maps_is_refused_naming_the_pc() {
    let rt = host::host_runtime();
    let code = [i(0xb7, 0, 0, 0, 0), map_ref(1, 3), i(EXIT, 0, 0, 0, 0)].concat();
    let e = rt.load(&code, &LoadOptions::default()).unwrap_err();
    assert!(
        e.to_string().contains("pc 1") && e.to_string().contains("map 3"),
        "{e}"
    );
}

/// A program that tail calls slot `mem[0]` of prog array map 0, and returns `fallback`
/// when the tail call fails.
fn tail_caller(fallback: i32) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),  // r6 = ctx
        i(0x71, 3, 1, 0, 0),  // r3 = mem[0]
        map_ref(2, 0),        // r2 = prog array
        i(CALL, 0, 0, 0, 12), // bpf_tail_call(ctx, map, index)
        i(0xb7, 0, 0, 0, fallback),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// [`tail_caller`] with the prog array not proven at the call (a jump lands between the
/// `lddw` and the call), so the host's chooser makes the tail call instead of inline code.
fn tail_caller_through_chooser(fallback: i32) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),  // r6 = ctx
        i(0x79, 3, 1, 0, 0),  // r3 = mem[0..8] (all 64 bits)
        map_ref(2, 0),        // r2 = prog array
        i(0x05, 0, 0, 0, 0),  // ja +0: the call starts a basic block
        i(CALL, 0, 0, 0, 12), // bpf_tail_call(ctx, map, index)
        i(0xb7, 0, 0, 0, fallback),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// [`tail_caller`] reading all 64 bits of mem[0..8] as the index (inline code).
fn tail_caller_wide(fallback: i32) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),
        i(0x79, 3, 1, 0, 0), // r3 = mem[0..8]
        map_ref(2, 0),
        i(CALL, 0, 0, 0, 12),
        i(0xb7, 0, 0, 0, fallback),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// Bumps mem[1] and tail calls slot mem[0] again (a loop of tail calls the kernel's limit
/// of 33 ends); returns `base` + mem[1] as it found it.
fn tail_target(base: i32) -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),
        i(0x71, 7, 6, 1, 0), // r7 = mem[1]
        i(0xbf, 8, 7, 0, 0),
        i(0x07, 8, 0, 0, 1),
        i(0x73, 6, 8, 1, 0),   // mem[1] = r7 + 1
        i(0x71, 3, 6, 0, 0),   // r3 = mem[0]
        i(0x25, 7, 0, 3, 200), // if mem[1] > 200 (never) skip the tail call
        map_ref(2, 0),
        i(CALL, 0, 0, 0, 12),
        i(0xbf, 0, 7, 0, 0), // r0 = base + old mem[1]
        i(0x07, 0, 0, 0, base),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

/// A prog array of 4 slots, and load options naming it as map 0.
fn prog_array_of_4() -> (Arc<Map>, LoadOptions) {
    let jumps = Map::new(spec("jumps", MapType::ProgArray, 4, 4, 4)).unwrap();
    let opts = LoadOptions {
        maps: vec![jumps.clone()],
        ..Default::default()
    };
    (jumps, opts)
}

/// `code` loaded as `trust` (tail-call tests: the programs touch only their context and
/// stack).
fn load_as(rt: &packjit::Runtime, trust: Trust, code: &[u8], opts: &LoadOptions) -> Arc<Program> {
    Arc::new(match trust {
        Trust::Sandboxed => rt.load(code, opts).unwrap(),
        // SAFETY: see above.
        Trust::Trusted => unsafe { rt.load_trusted(code, opts) }.unwrap(),
    })
}

#[test]
fn tail_calls_jump_to_the_slot_fall_through_when_empty_and_stop_after_33() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let (jumps, opts) = prog_array_of_4();
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        let caller = load(&tail_caller(-1));
        // Empty slot and out of range: the tail call falls through.
        for index in [1u8, 9] {
            let mut mem = [index, 0];
            assert_eq!(caller.call(&mut mem).unwrap() as i64, -1, "{trust:?}");
        }
        // Slot 1: a target that tail calls slot 2 (empty) and returns 50 + mem[1].
        rt.set_prog_array(&jumps, 1, Some(load(&tail_target(50))))
            .unwrap();
        let mut mem = [1u8, 7];
        // Slot 1 loops into slot 1: 1 tail call from the caller, then 32 more from the
        // target, then the 34th fails and the innermost returns.
        let r0 = caller.call(&mut mem).unwrap();
        assert_eq!(
            mem[1],
            7 + 33,
            "{trust:?}: 33 tail calls ran the target 33 times"
        );
        assert_eq!(r0, 50 + 7 + 32, "{trust:?}: the last target's result");
        // A target of the other trust is not jumped to.
        let other = match trust {
            Trust::Sandboxed => {
                // SAFETY: the program touches only its context and stack.
                Arc::new(unsafe { rt.load_trusted(&tail_target(60), &opts) }.unwrap())
            }
            Trust::Trusted => Arc::new(rt.load(&tail_target(60), &opts).unwrap()),
        };
        rt.set_prog_array(&jumps, 1, Some(other)).unwrap();
        assert_eq!(caller.call(&mut [1, 0]).unwrap() as i64, -1, "{trust:?}");
        rt.set_prog_array(&jumps, 1, None).unwrap();
    }
}

/// [`tail_caller`] with more argument setup the inlined tail call never reads, `copies`
/// times: r1 = ctx again, r4 and r5 written just before the call.
fn tail_caller_with_dead_setup(fallback: i32, copies: usize) -> Vec<u8> {
    let setup = [
        i(0xbf, 1, 6, 0, 0), // r1 = r6
        i(0xb7, 4, 0, 0, 7), // r4 = 7
        i(0xbf, 5, 6, 0, 0), // r5 = r6
    ]
    .concat();
    [
        i(0xbf, 6, 1, 0, 0), // r6 = ctx
        i(0x71, 3, 1, 0, 0), // r3 = mem[0]
        map_ref(2, 0),       // r2 = prog array
        setup.repeat(copies),
        i(CALL, 0, 0, 0, 12),
        i(0xb7, 0, 0, 0, fallback),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn an_inlined_tail_call_emits_no_argument_setup_it_does_not_read() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let (jumps, opts) = prog_array_of_4();
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        let (once, twice) = (
            load(&tail_caller_with_dead_setup(-1, 1)),
            load(&tail_caller_with_dead_setup(-1, 2)),
        );
        // Three more instructions writing the same registers, none emitted: the same code.
        assert_eq!(
            once.native_insns(),
            twice.native_insns(),
            "{trust:?}: the dead setup was emitted"
        );
        rt.set_prog_array(&jumps, 1, Some(load(&tail_target(50))))
            .unwrap();
        for p in [&once, &twice] {
            assert_eq!(p.call(&mut [9, 0]).unwrap() as i64, -1, "{trust:?}");
            let mut mem = [1u8, 7];
            assert_eq!(p.call(&mut mem).unwrap(), 50 + 7 + 32, "{trust:?}");
        }
        // A constant index: its `mov r3` is not emitted either (the slot is an immediate).
        let constant = |setups: usize| {
            [
                map_ref(2, 0),
                i(0xb7, 3, 0, 0, 2).repeat(setups),
                i(0xb7, 3, 0, 0, 1),
                i(CALL, 0, 0, 0, 12),
                i(0xb7, 0, 0, 0, -1),
                i(EXIT, 0, 0, 0, 0),
            ]
            .concat()
        };
        let (one, three) = (load(&constant(0)), load(&constant(2)));
        assert_eq!(one.native_insns(), three.native_insns(), "{trust:?}");
        for p in [&one, &three] {
            assert_eq!(p.call(&mut [1, 7]).unwrap(), 50 + 7 + 32, "{trust:?}");
        }
        rt.set_prog_array(&jumps, 1, None).unwrap();
    }
}

#[test]
fn inlined_and_chosen_tail_calls_share_one_limit_and_read_the_index_as_a_u32() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let (jumps, opts) = prog_array_of_4();
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        // The target (inline tail calls) loops into its own slot, 1.
        rt.set_prog_array(&jumps, 1, Some(load(&tail_target(50))))
            .unwrap();
        for (how, caller) in [
            ("inline", load(&tail_caller_wide(-1))),
            ("chooser", load(&tail_caller_through_chooser(-1))),
        ] {
            // mem[0..8] = the index, mem[1] doubles as the target's counter: index 1 with
            // mem[1] = 0 is slot 1; 1 + 2^32 is slot 1 too (the kernel's index is a u32).
            for index in [1u64, 1 + (1 << 32), 1 + (7 << 40)] {
                let mut mem = index.to_le_bytes();
                let r0 = caller.call(&mut mem).unwrap();
                assert_eq!(
                    mem[1], 33,
                    "{trust:?} {how} {index:#x}: one limit of 33 over both kinds"
                );
                assert_eq!(r0, 50 + 32, "{trust:?} {how} {index:#x}");
            }
            // Out of range in the low 32 bits: falls through.
            for index in [4u64, 0xffff_ffff, 4 + (1 << 32)] {
                let mut mem = index.to_le_bytes();
                assert_eq!(
                    caller.call(&mut mem).unwrap() as i64,
                    -1,
                    "{trust:?} {how} {index:#x}"
                );
            }
        }
        rt.set_prog_array(&jumps, 1, None).unwrap();
    }
}

#[test]
fn a_map_passed_to_a_helper_that_does_not_take_its_type_is_refused_naming_pc_helper_and_map() {
    let rt = host::host_runtime();
    let events = Map::new(spec("events", MapType::RingBuf, 0, 0, 4096 * 4)).unwrap();
    let counts = Map::new(spec("counts", MapType::Hash, 4, 8, 4)).unwrap();
    let opts = LoadOptions {
        maps: vec![events, counts],
        ..Default::default()
    };
    // A lookup in a ring buffer.
    let lookup = [
        i(0x62, 10, 0, -4, 0),
        map_ref(1, 0),
        i(0xbf, 2, 10, 0, 0),
        i(0x07, 2, 0, 0, -4),
        i(CALL, 0, 0, 0, 1),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat();
    let e = rt.load(&lookup, &opts).unwrap_err().to_string();
    for want in [
        "pc 5",
        "bpf_map_lookup_elem",
        "`events`",
        "BPF_MAP_TYPE_RINGBUF",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
    // A tail call through a hash map.
    let tail = [
        map_ref(2, 1),
        i(0xb7, 3, 0, 0, 0),
        i(CALL, 0, 0, 0, 12),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat();
    let e = rt.load(&tail, &opts).unwrap_err().to_string();
    for want in ["pc 3", "bpf_tail_call", "`counts`", "BPF_MAP_TYPE_HASH"] {
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// `r0 = bpf_for_each_map_elem(map 0, cb, ctx = mem, 0)`; the callback adds key * 1000 +
/// *value to the u64 at ctx and stops (returns 1) when the key equals mem[8].
fn for_each_program() -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),
        map_ref(1, 0),
        i(0x18, 2, 4, 0, 5), // r2 = the callback at pc 3 + 1 + 5 = 9
        i(0, 0, 0, 0, 0),
        i(0xbf, 3, 6, 0, 0),
        i(0xb7, 4, 0, 0, 0),
        i(CALL, 0, 0, 0, 164),
        i(EXIT, 0, 0, 0, 0),
        // pc 9: r1 = map, r2 = &key, r3 = value, r4 = ctx.
        i(0x61, 5, 2, 0, 0), // r5 = key
        i(0xbf, 0, 5, 0, 0),
        i(0x27, 0, 0, 0, 1000), // r0 = key * 1000
        i(0x79, 1, 3, 0, 0),    // + *value
        i(0x0f, 0, 1, 0, 0),
        i(0x79, 1, 4, 0, 0), // *ctx += r0
        i(0x0f, 1, 0, 0, 0),
        i(0x7b, 4, 1, 0, 0),
        i(0x71, 1, 4, 8, 0), // stop key
        i(0xb7, 0, 0, 0, 0),
        i(0x5d, 5, 1, 1, 0),
        i(0xb7, 0, 0, 0, 1),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn for_each_map_elem_visits_an_arrays_elements_in_order_until_stopped() {
    let rt = host::host_runtime();
    for map_type in [MapType::Array, MapType::PercpuArray] {
        let map = Map::new(spec("vals", map_type, 4, 8, 5)).unwrap();
        if map_type == MapType::Array {
            for k in 0..5u32 {
                map.update(&k.to_le_bytes(), &(k as u64 + 1).to_le_bytes(), 0)
                    .unwrap();
            }
        }
        let opts = LoadOptions {
            maps: vec![map],
            ..Default::default()
        };
        for p in load_both(&rt, &for_each_program(), &opts) {
            let values = |k: u64| if map_type == MapType::Array { k + 1 } else { 0 };
            for stop in [255u8, 2] {
                let mut mem = [0u8; 9];
                mem[8] = stop;
                let visited = p.call(&mut mem).unwrap();
                let last = (stop as u64).min(4);
                assert_eq!(visited, last + 1, "{map_type:?} stop {stop}");
                let sum: u64 = (0..=last).map(|k| k * 1000 + values(k)).sum();
                assert_eq!(u64::from_le_bytes(mem[..8].try_into().unwrap()), sum);
            }
        }
    }
}

/// The hash flavours' keys 0..n with value k + 1 (every CPU's copy, for per-CPU maps).
fn filled_hash(map_type: MapType, n: u32) -> Arc<Map> {
    let map = Map::new(spec("vals", map_type, 4, 8, 16)).unwrap();
    for k in 0..n {
        let mut v = vec![0u8; map.host_value_size()];
        for c in v.chunks_mut(8) {
            c.copy_from_slice(&(k as u64 + 1).to_le_bytes());
        }
        map.update(&k.to_le_bytes(), &v, 0).unwrap();
    }
    map
}

#[test]
fn for_each_map_elem_visits_a_hash_maps_elements_in_bucket_order_until_stopped() {
    let rt = host::host_runtime();
    for map_type in [
        MapType::Hash,
        MapType::PercpuHash,
        MapType::LruHash,
        MapType::LruPercpuHash,
    ] {
        let map = filled_hash(map_type, 5);
        // The kernel's walk goes bucket by bucket, as `keys` lists them.
        let order: Vec<u64> = map
            .keys()
            .iter()
            .map(|k| u32::from_le_bytes(k[..4].try_into().unwrap()) as u64)
            .collect();
        assert_eq!(order.len(), 5);
        let opts = LoadOptions {
            maps: vec![map.clone()],
            ..Default::default()
        };
        for p in load_both(&rt, &for_each_program(), &opts) {
            for stop in [255u8, 2, order[0] as u8] {
                let mut mem = [0u8; 9];
                mem[8] = stop;
                let visited = p.call(&mut mem).unwrap();
                let n = order
                    .iter()
                    .position(|&k| k == stop as u64)
                    .map_or(5, |i| i + 1);
                assert_eq!(
                    visited, n as u64,
                    "{map_type:?} stop {stop}, order {order:?}"
                );
                let sum: u64 = order[..n].iter().map(|k| k * 1000 + k + 1).sum();
                assert_eq!(u64::from_le_bytes(mem[..8].try_into().unwrap()), sum);
            }
        }
    }
}

/// `bpf_for_each_map_elem(map 0, cb, ctx, 0)` where the callback deletes the element it is
/// given (`bpf_map_delete_elem(map, key)`) and goes on.
fn for_each_delete_program() -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0),
        map_ref(1, 0),
        i(0x18, 2, 4, 0, 5), // r2 = the callback at pc 3 + 1 + 5 = 9
        i(0, 0, 0, 0, 0),
        i(0xbf, 3, 6, 0, 0),
        i(0xb7, 4, 0, 0, 0),
        i(CALL, 0, 0, 0, 164),
        i(EXIT, 0, 0, 0, 0),
        // pc 9: r1 = map, r2 = &key: delete it, continue.
        i(CALL, 0, 0, 0, 3),
        i(0xb7, 0, 0, 0, 0),
        i(EXIT, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn a_for_each_callback_that_deletes_each_element_still_visits_them_all() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        for map_type in [MapType::Hash, MapType::LruPercpuHash] {
            let map = filled_hash(map_type, 12);
            let opts = LoadOptions {
                maps: vec![map.clone()],
                ..Default::default()
            };
            let p = load_both(&rt, &for_each_delete_program(), &opts)
                .into_iter()
                .find(|p| p.trust() == trust)
                .unwrap();
            let visited = p.call(&mut [0u8; 8]).unwrap();
            assert_eq!(visited, 12, "{map_type:?} {trust:?}");
            assert!(map.is_empty(), "{map_type:?} {trust:?}: {} left", map.len());
            // An empty map: no call, 0 visited.
            assert_eq!(p.call(&mut [0u8; 8]).unwrap(), 0);
        }
    }
}

#[test]
fn for_each_map_elem_refuses_keys_that_do_not_fit_its_frame_and_non_zero_flags() {
    let rt = host::host_runtime();
    let wide = Map::new(spec("wide", MapType::Hash, 481, 8, 4)).unwrap();
    let opts = LoadOptions {
        maps: vec![wide],
        ..Default::default()
    };
    let e = rt.load(&for_each_program(), &opts).unwrap_err().to_string();
    assert!(
        e.contains("pc 7") && e.contains("`wide`") && e.contains("481"),
        "{e}"
    );
    // flags != 0: -EINVAL, no element visited.
    let map = filled_hash(MapType::Hash, 3);
    let opts = LoadOptions {
        maps: vec![map],
        ..Default::default()
    };
    let mut code = for_each_program();
    code[8 * 6..8 * 7].copy_from_slice(&i(0xb7, 4, 0, 0, 1)); // r4 = 1
    for p in load_both(&rt, &code, &opts) {
        let mut mem = [0u8; 9];
        assert_eq!(p.call(&mut mem).unwrap() as i64, -22);
        assert_eq!(mem, [0; 9]);
    }
}

#[test]
fn a_map_reference_into_a_register_that_does_not_exist_is_a_verifier_error() {
    let rt = host::host_runtime();
    let map = Map::new(spec("h", MapType::Hash, 4, 8, 4)).unwrap();
    let opts = LoadOptions {
        maps: vec![map],
        ..Default::default()
    };
    // lddw r12, map 0 (register field 12): refused with a named error, no panic.
    let code = [map_ref(12, 0), i(0xb7, 0, 0, 0, 0), i(EXIT, 0, 0, 0, 0)].concat();
    let e = rt.load(&code, &opts).unwrap_err();
    assert!(e.to_string().contains("pc 0"), "{e}");
}

#[test]
fn helpers_an_lpm_trie_does_not_take_are_refused_naming_pc_helper_and_map() {
    let rt = host::host_runtime();
    let trie = Map::new(MapSpec {
        flags: packjit::maps::BPF_F_NO_PREALLOC,
        ..spec("routes", MapType::LpmTrie, 8, 8, 4)
    })
    .unwrap();
    let opts = LoadOptions {
        maps: vec![trie],
        ..Default::default()
    };
    // r1 = the trie, r2 = a key on the stack, r3 = 0: lookup_percpu (195), push (87).
    for (helper, name) in [
        (195, "bpf_map_lookup_percpu_elem"),
        (87, "bpf_map_push_elem"),
    ] {
        let code = [
            i(0x7a, 10, 0, -8, 0),
            map_ref(1, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -8),
            i(0xb7, 3, 0, 0, 0),
            i(CALL, 0, 0, 0, helper),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        let e = rt.load(&code, &opts).unwrap_err().to_string();
        for want in ["pc 6", name, "`routes`", "BPF_MAP_TYPE_LPM_TRIE"] {
            assert!(e.contains(want), "{want}: {e}");
        }
    }
    // bpf_for_each_map_elem: the kernel's trie has no iteration callback.
    let e = rt.load(&for_each_program(), &opts).unwrap_err().to_string();
    assert!(
        e.contains("pc 7") && e.contains("`routes`") && e.contains("BPF_MAP_TYPE_LPM_TRIE"),
        "{e}"
    );
}

/// Tail calls between programs of every frame shape, entered past the target's saves (both
/// have the uniform tail-call frame) or at its full entry (the target has none: it makes no
/// tail calls; or the slot was set with `set_prog_array_full_entry`). The chain is steered
/// by the context: mem[0] is the slot `deep` tail calls, mem[2] the one `leaf` does, mem[1]
/// counts `leaf`'s runs, mem[8..16] is what `deep` computed.
mod frames {
    use super::*;

    /// The uniform frame with a stack block of two levels: r6-r9 in use, a bpf-to-bpf call
    /// that writes its own frame, then the tail call through slot mem[0]; -1 if it fails.
    pub fn deep() -> Vec<u8> {
        [
            i(0xbf, 6, 1, 0, 0),    // r6 = ctx
            i(0xb7, 7, 0, 0, 0x11), // r7 = 0x11
            i(0xb7, 8, 0, 0, 0x22), // r8 = 0x22
            i(0xb7, 9, 0, 0, 0x33), // r9 = 0x33
            i(0x7b, 10, 7, -8, 0),  // *(u64 *)(r10 - 8) = r7
            i(CALL, 0, 1, 0, 13),   // r0 = f() (pc 19)
            i(0x79, 1, 10, -8, 0),  // r1 = *(u64 *)(r10 - 8): 0x11, f's frame is its own
            i(0x0f, 7, 0, 0, 0),    // r7 += r0 (5)
            i(0x0f, 7, 1, 0, 0),    // r7 += r1 (0x11)
            i(0x0f, 7, 8, 0, 0),    // r7 += r8
            i(0x0f, 7, 9, 0, 0),    // r7 += r9: 0x11 + 5 + 0x11 + 0x22 + 0x33
            i(0x7b, 6, 7, 8, 0),    // mem[8..16] = r7
            i(0xbf, 1, 6, 0, 0),    // r1 = ctx
            map_ref(2, 0),          // r2 = the prog array
            i(0x71, 3, 6, 0, 0),    // r3 = mem[0]
            i(CALL, 0, 0, 0, 12),   // bpf_tail_call
            i(0xb7, 0, 0, 0, -1),   // r0 = -1
            i(EXIT, 0, 0, 0, 0),
            // pc 19, f: its own frame, then r0 = 5.
            i(0x7a, 10, 0, -8, 99), // *(u64 *)(r10 - 8) = 99
            i(0xb7, 0, 0, 0, 5),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// The uniform frame without a stack block: counts itself in mem[1], tail calls slot
    /// mem[2]; when that fails, r0 = mem[8..16] + 1000.
    pub fn leaf() -> Vec<u8> {
        [
            i(0xbf, 6, 1, 0, 0),  // r6 = ctx
            i(0x71, 7, 6, 1, 0),  // r7 = mem[1]
            i(0x07, 7, 0, 0, 1),  // r7 += 1
            i(0x73, 6, 7, 1, 0),  // mem[1] = r7
            i(0xbf, 1, 6, 0, 0),  // r1 = ctx
            map_ref(2, 0),        // r2 = the prog array
            i(0x71, 3, 6, 2, 0),  // r3 = mem[2]
            i(CALL, 0, 0, 0, 12), // bpf_tail_call
            i(0x79, 0, 6, 8, 0),  // r0 = mem[8..16]
            i(0x07, 0, 0, 0, 1000),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// No tail call, so no uniform frame: a stack block of two levels and r6-r7; r0 =
    /// mem[8..16] + 2003.
    pub fn plain() -> Vec<u8> {
        [
            i(0xbf, 6, 1, 0, 0),   // r6 = ctx
            i(0x79, 7, 6, 8, 0),   // r7 = mem[8..16]
            i(0x7b, 10, 7, -8, 0), // *(u64 *)(r10 - 8) = r7
            i(CALL, 0, 1, 0, 4),   // r0 = g() (pc 8)
            i(0x79, 1, 10, -8, 0), // r1 = *(u64 *)(r10 - 8)
            i(0x0f, 0, 1, 0, 0),   // r0 += r1
            i(0x07, 0, 0, 0, 2000),
            i(EXIT, 0, 0, 0, 0),
            // pc 8, g: r0 = 3 through its own frame.
            i(0x7a, 10, 0, -8, 3),
            i(0x79, 0, 10, -8, 0),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// What `deep` leaves in mem[8..16].
    pub const DEEP: u64 = 0x11 + 5 + 0x11 + 0x22 + 0x33;
}

#[test]
fn tail_calls_past_the_saves_and_at_the_full_entry_mix_frames_and_keep_the_limit() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        for full_entry in [false, true] {
            let (jumps, opts) = prog_array_of_4();
            let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
            let deep = load(&frames::deep());
            let set = |slot: u32, p: &Arc<Program>| {
                if full_entry {
                    rt.set_prog_array_full_entry(&jumps, slot, Some(p.clone()))
                } else {
                    rt.set_prog_array(&jumps, slot, Some(p.clone()))
                }
                .unwrap()
            };
            set(0, &load(&frames::leaf()));
            set(1, &load(&frames::plain()));
            set(2, &deep);
            let what = format!("{trust:?}, full entry {full_entry}");
            // (mem[0], mem[2]) → (r0, leaf's runs).
            let cases: [((u8, u8), (i64, u8)); 5] = [
                // deep → leaf → plain (no uniform frame: always the full entry).
                ((0, 1), (frames::DEEP as i64 + 2003, 1)),
                // deep → leaf → leaf … : 33 tail calls, the 34th fails in leaf.
                ((0, 0), (frames::DEEP as i64 + 1000, 33)),
                // deep → deep … : the 34th fails in deep.
                ((2, 3), (-1, 0)),
                // deep → leaf → deep → leaf …: tail call 33 reaches leaf, whose fails.
                ((0, 2), (frames::DEEP as i64 + 1000, 17)),
                // deep → plain directly, and an empty slot.
                ((1, 0), (frames::DEEP as i64 + 2003, 0)),
            ];
            // Many runs: a frame left wrong (a saved register, the stack pointer) shows as a
            // wrong value or a crash of the loop around the calls.
            for round in 0..50 {
                for ((first, next), (r0, runs)) in cases {
                    let mut mem = [0u8; 16];
                    mem[0] = first;
                    mem[2] = next;
                    let got = deep.call(&mut mem).unwrap() as i64;
                    assert_eq!(got, r0, "{what}, round {round}, ({first}, {next})");
                    assert_eq!(mem[1], runs, "{what}, round {round}, ({first}, {next})");
                    assert_eq!(
                        u64::from_le_bytes(mem[8..].try_into().unwrap()),
                        frames::DEEP
                    );
                }
                let mut mem = [3u8; 16];
                assert_eq!(
                    deep.call(&mut mem).unwrap() as i64,
                    -1,
                    "{what}: slot 3 is empty"
                );
            }
            for slot in 0..3 {
                rt.set_prog_array(&jumps, slot, None).unwrap();
            }
        }
    }
}

#[test]
fn a_stop_after_a_tail_call_past_the_saves_unwinds_to_the_host_and_the_next_run_is_whole() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let (jumps, mut opts) = prog_array_of_4();
        opts.budget = packjit::Budget::Limit(10_000);
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        let deep = load(&frames::deep());
        // Slot 0: a program with the uniform frame (it has a tail call it never reaches)
        // that loops for ever, so the budget stops it at pc 1; slot 1 (sandboxed only): one
        // that reads past its context, stopped at pc 0.
        let spin = [
            i(0xb7, 0, 0, 0, 0),
            i(0x05, 0, 0, -1, 0), // pc 1: goto pc 1
            map_ref(2, 0),
            i(CALL, 0, 0, 0, 12),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        let wild = [
            i(0x79, 0, 1, 4000, 0), // r0 = *(u64 *)(ctx + 4000)
            map_ref(2, 0),
            i(CALL, 0, 0, 0, 12),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        // Slot 3: no tail call (so no uniform frame: entered at its full entry), a stack
        // frame, and the same endless loop at pc 1.
        let spin_on_stack = [
            i(0x7a, 10, 0, -8, 1), // *(u64 *)(r10 - 8) = 1
            i(0x05, 0, 0, -1, 0),  // pc 1: goto pc 1
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        rt.set_prog_array(&jumps, 0, Some(load(&spin))).unwrap();
        rt.set_prog_array(&jumps, 1, Some(load(&wild))).unwrap();
        rt.set_prog_array(&jumps, 2, Some(load(&frames::leaf())))
            .unwrap();
        rt.set_prog_array(&jumps, 3, Some(load(&spin_on_stack)))
            .unwrap();
        for round in 0..20 {
            for first in [0u8, 3] {
                let mut mem = [0u8; 16];
                mem[0] = first;
                match deep.call(&mut mem) {
                    Err(RunError::Stop(Stop::Budget { pc: 1 })) => {}
                    other => panic!("{trust:?} round {round}, slot {first}: {other:?}"),
                }
            }
            if trust == Trust::Sandboxed {
                let mut mem = [1u8; 16];
                match deep.call(&mut mem) {
                    Err(RunError::Stop(Stop::OutOfBounds { pc: 0, .. })) => {}
                    other => panic!("{trust:?} round {round}: {other:?}"),
                }
            }
            // deep → leaf → (slot 4, out of range): a whole run after the stops.
            let mut mem = [0u8; 16];
            mem[0] = 2;
            mem[2] = 4;
            assert_eq!(
                deep.call(&mut mem).unwrap(),
                frames::DEEP + 1000,
                "{trust:?} round {round}"
            );
            assert_eq!(mem[1], 1);
        }
        for slot in 0..4 {
            rt.set_prog_array(&jumps, slot, None).unwrap();
        }
    }
}

#[test]
fn constant_index_tail_calls_reach_their_slot_keep_the_limit_and_targets_read_r1_and_r2() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let (jumps, opts) = prog_array_of_4();
        let load = |code: &[u8]| load_as(&rt, trust, code, &opts);
        // `r3 = index` right before the call: the inline code addresses the slot directly.
        let caller = |index: i32| {
            [
                i(0xbf, 6, 1, 0, 0),
                map_ref(2, 0),
                i(0xb7, 3, 0, 0, index),
                i(CALL, 0, 0, 0, 12),
                i(0xb7, 0, 0, 0, -1),
                i(EXIT, 0, 0, 0, 0),
            ]
            .concat()
        };
        // The constant on one path only (a jump lands after it): the index is read at run
        // time, mem[0] when it is not 0, else 3.
        let mixed = [
            i(0x71, 3, 1, 0, 0),  // r3 = mem[0]
            i(0x55, 3, 0, 1, 0),  // if r3 != 0 goto +1
            i(0xb7, 3, 0, 0, 3),  // r3 = 3
            map_ref(2, 0),        // (a jump target)
            i(CALL, 0, 0, 0, 12), // bpf_tail_call
            i(0xb7, 0, 0, 0, -2),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        // Slot 0: reads r2 (the context's length) and r1 at its entry; it has the uniform
        // frame (a tail call, with a constant index past the end: never made).
        let reads_args = [
            i(0xbf, 6, 2, 0, 0), // r6 = r2 (length)
            i(0x71, 7, 1, 1, 0), // r7 = mem[1]
            i(0x0f, 6, 7, 0, 0), // r6 += r7
            map_ref(2, 0),
            i(0xb7, 3, 0, 0, 9),
            i(CALL, 0, 0, 0, 12),
            i(0xbf, 0, 6, 0, 0),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        // Slot 2: mem[2] += 1, then tail calls slot 2 again (a constant index).
        let link = [
            i(0xbf, 6, 1, 0, 0),
            i(0x71, 7, 6, 2, 0),
            i(0x07, 7, 0, 0, 1),
            i(0x73, 6, 7, 2, 0), // mem[2] += 1
            map_ref(2, 0),
            i(0xbf, 1, 6, 0, 0),
            i(0xb7, 3, 0, 0, 2),
            i(CALL, 0, 0, 0, 12),
            i(0x71, 0, 6, 2, 0), // r0 = mem[2]
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat();
        let reads_args = load(&reads_args);
        let link = load(&link);
        rt.set_prog_array(&jumps, 0, Some(reads_args.clone()))
            .unwrap();
        rt.set_prog_array(&jumps, 2, Some(link.clone())).unwrap();
        for round in 0..20 {
            let what = format!("{trust:?}, round {round}");
            // Entered by the host and by a tail call: the same r1 and r2.
            let mut mem = [0u8; 16];
            mem[1] = 5;
            assert_eq!(reads_args.call(&mut mem).unwrap(), 21, "{what}");
            assert_eq!(load(&caller(0)).call(&mut mem).unwrap(), 21, "{what}");
            let mut short = [0u8, 7, 0];
            assert_eq!(load(&caller(0)).call(&mut short).unwrap(), 10, "{what}");
            // Empty, past the end (no tail call emitted), and far past it.
            for index in [1, 3, 4, 9, -1] {
                assert_eq!(
                    load(&caller(index)).call(&mut mem).unwrap() as i64,
                    -1,
                    "{what}, index {index}"
                );
            }
            // The limit: the host's run and 33 tail calls run the link 34 times.
            let mut mem = [0u8; 16];
            assert_eq!(link.call(&mut mem).unwrap(), 34, "{what}");
            let mut mem = [0u8; 16];
            assert_eq!(load(&caller(2)).call(&mut mem).unwrap(), 33, "{what}");
            // The index read at run time where the constant holds on one path only.
            let mixed = load(&mixed);
            let mut mem = [2u8; 16];
            mem[2] = 0;
            assert_eq!(mixed.call(&mut mem).unwrap(), 33, "{what}");
            let mut mem = [0u8; 16];
            assert_eq!(mixed.call(&mut mem).unwrap() as i64, -2, "{what}: slot 3");
        }
        for slot in [0, 2] {
            rt.set_prog_array(&jumps, slot, None).unwrap();
        }
    }
}

#[test]
fn a_prog_array_of_3_padded_to_4_hides_its_padding_and_bounds_every_index() {
    let rt = host::host_runtime();
    for trust in [Trust::Sandboxed, Trust::Trusted] {
        let jumps = Map::new(spec("jumps3", MapType::ProgArray, 4, 4, 3)).unwrap();
        let opts = LoadOptions {
            maps: vec![jumps.clone()],
            ..Default::default()
        };
        // The padding is not a slot: 3 keys, slot 3 cannot be set.
        assert_eq!((jumps.len(), jumps.keys().len()), (3, 3));
        assert!(rt
            .set_prog_array(&jumps, 3, Some(load_as(&rt, trust, &tail_target(0), &opts)))
            .is_err());
        // Slot k returns 100 k (+ mem[1]: 0): each a program with the uniform frame.
        for k in 0..3u32 {
            let target = [
                i(0xb7, 6, 0, 0, 100 * k as i32),
                map_ref(2, 0),
                i(0xb7, 3, 0, 0, 7), // a tail call never made (constant past the end)
                i(CALL, 0, 0, 0, 12),
                i(0xbf, 0, 6, 0, 0),
                i(EXIT, 0, 0, 0, 0),
            ]
            .concat();
            rt.set_prog_array(&jumps, k, Some(load_as(&rt, trust, &target, &opts)))
                .unwrap();
        }
        // The index read from mem[0..8], all 64 bits: only the low 32 count.
        let caller = load_as(&rt, trust, &tail_caller_wide(-1), &opts);
        let indices: [u64; 11] = [0, 1, 2, 3, 4, 5, 7, 8, 0x1_0000_0001, 0xffff_ffff, u64::MAX];
        for index in indices {
            let mut mem = [0u8; 16];
            mem[..8].copy_from_slice(&index.to_le_bytes());
            let want = match index as u32 {
                k @ 0..=2 => u64::from(k) * 100,
                _ => u64::MAX,
            };
            assert_eq!(
                caller.call(&mut mem).unwrap(),
                want,
                "{trust:?}, index {index:#x}"
            );
        }
        for k in 0..3 {
            rt.set_prog_array(&jumps, k, None).unwrap();
        }
    }
}

/// `key = *(u32 *)ctx ; r0 = lookup(map 0, &key)`, then `tail` (which ends in `exit`), as
/// clang emits a lookup with a run-time key.
fn lookup_then(tail: &[Vec<u8>]) -> Vec<u8> {
    let head = [
        i(0x61, 1, 1, 0, 0),   // r1 = *(u32 *)(r1 + 0)
        i(0x63, 10, 1, -4, 0), // *(u32 *)(r10 - 4) = r1
        i(0xbf, 2, 10, 0, 0),  // r2 = r10
        i(0x07, 2, 0, 0, -4),  // r2 += -4
        map_ref(1, 0),
        i(CALL, 0, 0, 0, 1),
    ];
    head.iter().chain(tail).flatten().copied().collect()
}

/// `if r0 == 0 goto +1 (r0 = 0, exit) ; r0 = *(u8 *)(r0 + off) ; exit`.
fn tested_byte(off: i16) -> Vec<u8> {
    lookup_then(&[
        i(0x15, 0, 0, 1, 0),
        i(0x71, 0, 0, off, 0),
        i(EXIT, 0, 0, 0, 0),
    ])
}

fn array_of_5x16(flags: u32) -> (Arc<Map>, LoadOptions) {
    let mut s = spec("values", MapType::Array, 4, 16, 5);
    s.flags = flags;
    let map = Map::new(s).unwrap();
    for k in 0..5u32 {
        let v: Vec<u8> = (0..16).map(|b| (16 * k + b) as u8).collect();
        map.update(&k.to_le_bytes(), &v, 0).unwrap();
    }
    let opts = LoadOptions {
        maps: vec![map.clone()],
        ..Default::default()
    };
    (map, opts)
}

fn out_of_bounds(r: Result<u64, RunError>) -> Option<(u64, u32, bool)> {
    match r {
        Err(RunError::Stop(Stop::OutOfBounds {
            addr, size, write, ..
        })) => Some((addr, size, write)),
        _ => None,
    }
}

#[test]
fn a_tested_lookup_result_reads_its_last_byte_and_stops_one_past_the_arrays_end() {
    let rt = host::host_runtime();
    let (_, opts) = array_of_5x16(0);
    // The value's last byte: proven (no check) sandboxed, and right in both modes.
    for p in load_both(&rt, &tested_byte(15), &opts) {
        for k in 0..5u32 {
            assert_eq!(p.call(&mut k.to_le_bytes()).unwrap(), (16 * k + 15) as u64);
        }
        assert_eq!(p.call(&mut 5u32.to_le_bytes()).unwrap(), 0, "NULL, tested");
    }
    // One byte past the last element's value is past the map's value memory: not proven, so
    // its check stops the run there (the byte before it ran unchecked, above).
    let past = rt.load(&tested_byte(16), &opts).unwrap();
    let proven = rt.load(&tested_byte(15), &opts).unwrap();
    assert!(
        proven.native_insns() + 4 <= past.native_insns(),
        "the last byte's load carries no check: {} against {} native instructions",
        proven.native_insns(),
        past.native_insns()
    );
    assert_eq!(
        past.call(&mut 3u32.to_le_bytes()).unwrap(),
        64,
        "key 4's first byte"
    );
    let (addr, size, write) =
        out_of_bounds(past.call(&mut 4u32.to_le_bytes())).expect("one past the array stops");
    assert_eq!((size, write), (1, false));
    assert_eq!(addr % 16, 0, "the address past element 4: {addr:#x}");
    // The same for a hash map's value: its last byte reads right in both modes.
    let hash = Map::new(spec("h", MapType::Hash, 4, 8, 4)).unwrap();
    hash.update(
        &7u32.to_le_bytes(),
        &0x1122_3344_5566_7788u64.to_le_bytes(),
        0,
    )
    .unwrap();
    let opts = LoadOptions {
        maps: vec![hash],
        ..Default::default()
    };
    for p in load_both(&rt, &tested_byte(7), &opts) {
        assert_eq!(p.call(&mut 7u32.to_le_bytes()).unwrap(), 0x11);
        assert_eq!(p.call(&mut 8u32.to_le_bytes()).unwrap(), 0);
    }
    let (proven, past) = (
        rt.load(&tested_byte(7), &opts).unwrap(),
        rt.load(&tested_byte(8), &opts).unwrap(),
    );
    // Not vouched for on RV64 hosts (the pool clamp in Rust may be a branch there).
    assert!(
        cfg!(target_arch = "riscv64") || proven.native_insns() + 4 <= past.native_insns(),
        "the hash value's last byte carries no check: {} against {}",
        proven.native_insns(),
        past.native_insns()
    );
}

/// A per-CPU array's tested lookup result: this CPU's element, its last byte read with no
/// check in sandboxed code where the load inlines the per-CPU lookup (its key masked by the
/// driver, its CPU by the backend, so the runtime vouches for the result); NULL past the end,
/// for a key from the context and for a constant key alike.
#[test]
fn a_tested_per_cpu_lookup_result_is_this_cpus_value_and_proven_where_inlined() {
    use packjit::PerCpuLookupImpl;
    let rt = host::host_runtime();
    let map = Map::new(spec("pcpu", MapType::PercpuArray, 4, 16, 5)).unwrap();
    let cpus = Map::possible_cpus();
    for k in 0..5u32 {
        let v: Vec<u8> = (0..cpus)
            .flat_map(|_| (0..16).map(move |b| (16 * k + b) as u8))
            .collect();
        map.update(&k.to_le_bytes(), &v, 0).unwrap();
    }
    let opts = LoadOptions {
        maps: vec![map.clone()],
        ..Default::default()
    };
    for p in load_both(&rt, &tested_byte(15), &opts) {
        for k in 0..5u32 {
            assert_eq!(
                p.call(&mut k.to_le_bytes()).unwrap(),
                (16 * k + 15) as u64,
                "{:?}",
                p.trust()
            );
        }
        for k in [5u32, 6, 1 << 16, u32::MAX] {
            assert_eq!(p.call(&mut k.to_le_bytes()).unwrap(), 0, "key {k:#x}: NULL");
        }
    }
    // A constant key: stored as an immediate, known to the driver.
    let constant = |key: i32| {
        [
            i(0x62, 10, 0, -4, key), // *(u32 *)(r10 - 4) = key
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, -4),
            map_ref(1, 0),
            i(CALL, 0, 0, 0, 1),
            i(0x15, 0, 0, 1, 0),
            i(0x71, 0, 0, 15, 0),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat()
    };
    for p in load_both(&rt, &constant(3), &opts) {
        assert_eq!(p.call(&mut []).unwrap(), 63, "{:?}", p.trust());
    }
    for key in [5, 7, -1] {
        for p in load_both(&rt, &constant(key), &opts) {
            assert_eq!(p.call(&mut []).unwrap(), 0, "{:?} key {key}", p.trust());
        }
    }
    // The proof: the last byte's load carries no check where the lookup is inlined (not
    // under emulators without rseq, where it calls `sched_getcpu`'s fallback, which
    // branches); one byte further is checked.
    let (proven, past) = (
        rt.load(&tested_byte(15), &opts).unwrap(),
        rt.load(&tested_byte(16), &opts).unwrap(),
    );
    let inlined = proven
        .builtins()
        .is_some_and(|b| b.percpu_lookup == PerCpuLookupImpl::Inline);
    println!(
        "per-CPU lookup: {:?}; native instructions {} proven, {} one past",
        proven.builtins().map(|b| b.percpu_lookup),
        proven.native_insns(),
        past.native_insns()
    );
    if inlined {
        assert!(
            proven.native_insns() + 4 <= past.native_insns(),
            "the per-CPU value's last byte carries no check: {} against {}",
            proven.native_insns(),
            past.native_insns()
        );
    } else {
        assert!(proven.native_insns() + 4 > past.native_insns());
    }
    // Writes through it stay where they belong: this CPU's element 2 only.
    let add = lookup_then(&[
        i(0x15, 0, 0, 3, 0),
        i(0x71, 1, 0, 15, 0),
        i(0x07, 1, 0, 0, 1),
        i(0x73, 0, 1, 15, 0),
        i(0xb7, 0, 0, 0, 0),
        i(EXIT, 0, 0, 0, 0),
    ]);
    let p = rt.load(&add, &opts).unwrap();
    p.call(&mut 2u32.to_le_bytes()).unwrap();
    let all = map.lookup(&2u32.to_le_bytes()).unwrap();
    let bumped = all.chunks(16).filter(|v| v[15] == 48).count();
    assert_eq!(bumped, 1, "one CPU's copy of element 2 written");
    assert!(all.chunks(16).all(|v| v[15] == 47 || v[15] == 48));
}

#[test]
fn an_untested_lookup_result_stops_cleanly_on_null() {
    let rt = host::host_runtime();
    let (_, opts) = array_of_5x16(0);
    // No test at all; a test of r0 + 8 (which says nothing of r0); the wrong edge.
    let untested = [
        lookup_then(&[i(0x71, 0, 0, 0, 0), i(EXIT, 0, 0, 0, 0)]),
        lookup_then(&[
            i(0xbf, 6, 0, 0, 0),
            i(0x07, 6, 0, 0, 8),
            i(0x15, 6, 0, 1, 0),
            i(0x71, 0, 0, 0, 0),
            i(EXIT, 0, 0, 0, 0),
        ]),
        // The load on the NULL edge of the test: `if r0 != 0 goto +2`.
        lookup_then(&[
            i(0x55, 0, 0, 2, 0),
            i(0x71, 0, 0, 0, 0),
            i(EXIT, 0, 0, 0, 0),
            i(0x71, 0, 0, 0, 0),
            i(EXIT, 0, 0, 0, 0),
        ]),
    ];
    for (n, code) in untested.iter().enumerate() {
        let p = rt.load(code, &opts).unwrap();
        assert_eq!(p.call(&mut 2u32.to_le_bytes()).unwrap(), 32, "program {n}");
        assert_eq!(
            out_of_bounds(p.call(&mut 5u32.to_le_bytes())),
            Some((0, 1, false)),
            "program {n}: NULL dereferenced"
        );
    }
}

#[test]
fn writes_through_a_read_only_maps_value_stay_refused() {
    let rt = host::host_runtime();
    let (map, opts) = array_of_5x16(packjit::maps::BPF_F_RDONLY_PROG);
    // if r0 == 0 goto exit ; r1 = *(u8 *)(r0 + 3) ; *(u8 *)(r0 + 3) = 99 ; r0 = r1
    let code = lookup_then(&[
        i(0x15, 0, 0, 3, 0),
        i(0x71, 1, 0, 3, 0),
        i(0x72, 0, 0, 3, 99),
        i(0xbf, 0, 1, 0, 0),
        i(EXIT, 0, 0, 0, 0),
    ]);
    let p = rt.load(&code, &opts).unwrap();
    let (_, size, write) = out_of_bounds(p.call(&mut 1u32.to_le_bytes())).expect("refused");
    assert_eq!((size, write), (1, true));
    assert_eq!(map.lookup(&1u32.to_le_bytes()).unwrap()[3], 19, "unchanged");
    // The read alone is fine.
    let read = lookup_then(&[
        i(0x15, 0, 0, 1, 0),
        i(0x71, 0, 0, 3, 0),
        i(EXIT, 0, 0, 0, 0),
    ]);
    assert_eq!(
        rt.load(&read, &opts)
            .unwrap()
            .call(&mut 1u32.to_le_bytes())
            .unwrap(),
        19
    );
}

#[test]
fn a_value_pointer_stored_to_the_stack_and_reloaded_is_checked_again() {
    let rt = host::host_runtime();
    let (_, opts) = array_of_5x16(0);
    // if r0 == 0 goto exit ; *(u64 *)(r10 - 16) = r0 ; r6 = *(u64 *)(r10 - 16) ;
    // r6 += 8 ; r0 = *(u8 *)(r6 + off - 8)
    let code = |off: i16| {
        lookup_then(&[
            i(0x15, 0, 0, 4, 0),
            i(0x7b, 10, 0, -16, 0),
            i(0x79, 6, 10, -16, 0),
            i(0x07, 6, 0, 0, 8),
            i(0x71, 0, 6, off - 8, 0),
            i(EXIT, 0, 0, 0, 0),
        ])
    };
    let inside = rt.load(&code(15), &opts).unwrap();
    assert_eq!(inside.call(&mut 4u32.to_le_bytes()).unwrap(), 79);
    let past = rt.load(&code(16), &opts).unwrap();
    assert_eq!(past.call(&mut 3u32.to_le_bytes()).unwrap(), 64);
    let (_, size, write) = out_of_bounds(past.call(&mut 4u32.to_le_bytes())).expect("checked");
    assert_eq!((size, write), (1, false));
}

#[test]
fn a_sandboxed_hash_lookup_skips_the_key_check_only_for_a_key_inside_the_frame() {
    let rt = host::host_runtime();
    let hash = Map::new(spec("h", MapType::Hash, 4, 8, 4)).unwrap();
    hash.update(&7u32.to_le_bytes(), &42u64.to_le_bytes(), 0)
        .unwrap();
    let opts = LoadOptions {
        maps: vec![hash],
        ..Default::default()
    };
    // *(u32 *)(r10 - 4) = 7 ; r2 = r10 + off ; r0 = lookup ; r0 = r0 ? *(u64 *)r0 : 777
    let code = |off: i32| {
        [
            i(0x62, 10, 0, -4, 7),
            map_ref(1, 0),
            i(0xbf, 2, 10, 0, 0),
            i(0x07, 2, 0, 0, off),
            i(CALL, 0, 0, 0, 1),
            i(0x15, 0, 0, 2, 0),
            i(0x79, 0, 0, 0, 0),
            i(EXIT, 0, 0, 0, 0),
            i(0xb7, 0, 0, 0, 777),
            i(EXIT, 0, 0, 0, 0),
        ]
        .concat()
    };
    let p = rt.load(&code(-4), &opts).unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 42);
    // Its last byte past r10 (the stack block's end): the helper checks the key and
    // refuses it (NULL), as before.
    let p = rt.load(&code(-3), &opts).unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 777);
}
