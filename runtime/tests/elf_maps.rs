//! Maps from clang objects: BTF-defined maps in `.maps` (libbpf's convention, written out in
//! `tests/bpf/maps_defs.c` without libbpf's headers) and legacy `maps`-section maps are
//! described by `elf_maps`; `link` rewrites each `lddw` of a map to `src = 1`
//! (BPF_PSEUDO_MAP_FD), `imm` = the map's index. Malformed definitions and references get
//! named errors.

mod elf_support;
mod host;

use elf_support::*;
use packjit::elf::{elf_maps, link, ElfLoadOptions, ElfMapDef, Linked, BPF_PSEUDO_MAP_FD};
use packjit::{Error, ErrorKind, Tier};

fn link_sec(obj: &[u8], sec: &str) -> Result<Linked, Error> {
    link(obj, &ElfLoadOptions::section(sec), &|_| None)
}

fn assert_mentions(e: &Error, parts: &[&str]) {
    for p in parts {
        assert!(
            e.message.contains(p),
            "error {:?} does not mention {p:?}",
            e.message
        );
    }
}

fn def(name: &str, t: u32, k: u32, v: u32, max: u32, flags: u32) -> ElfMapDef {
    ElfMapDef {
        name: name.into(),
        map_type: t,
        key_size: k,
        value_size: v,
        max_entries: max,
        flags,
        initial_programs: Vec::new(),
    }
}

/// `(slot, dst, src, imm, second imm)` of every lddw.
fn lddws(code: &[u8]) -> Vec<(usize, u8, u8, u32, u32)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 16 <= code.len() {
        if code[i] == 0x18 {
            out.push((
                i / 8,
                code[i + 1] & 0x0f,
                code[i + 1] >> 4,
                rd(code, i + 4, 4) as u32,
                rd(code, i + 12, 4) as u32,
            ));
            i += 16;
        } else {
            i += 8;
        }
    }
    out
}

#[test]
fn btf_and_legacy_map_definitions_are_parsed_field_by_field() {
    let obj = compile_bpf("maps_defs");
    let maps = elf_maps(&obj).unwrap();
    let names: Vec<&str> = maps.iter().map(|m| m.name.as_str()).collect();
    // Symbol order: the static map (a local symbol) first, then the globals as clang emits them.
    assert_eq!(
        names,
        [
            "hidden",
            "hash",
            "array",
            "legacy",
            "queue",
            "jmp_table",
            "percpu_array",
            "percpu_hash",
            "lru",
            "ringbuf"
        ]
    );
    let by = |n: &str| maps.iter().find(|m| m.name == n).unwrap().clone();
    assert_eq!(by("hidden"), def("hidden", 2, 4, 4, 2, 0));
    // HASH, u32 key, u64 value, BPF_F_NO_PREALLOC.
    assert_eq!(by("hash"), def("hash", 1, 4, 8, 128, 1));
    // ARRAY of struct pair { u64; u32 } (16 bytes with padding).
    assert_eq!(by("array"), def("array", 2, 4, 16, 16, 0));
    assert_eq!(by("legacy"), def("legacy", 1, 8, 16, 32, 0));
    // QUEUE: no key.
    assert_eq!(by("queue"), def("queue", 22, 0, 4, 8, 0));
    // PERCPU_ARRAY with explicit key_size / value_size.
    assert_eq!(by("percpu_array"), def("percpu_array", 6, 4, 32, 4, 0));
    // PERCPU_HASH with pinning = LIBBPF_PIN_NONE (accepted).
    assert_eq!(by("percpu_hash"), def("percpu_hash", 5, 8, 4, 64, 0));
    // LRU_HASH: const struct key, typedef'd value.
    assert_eq!(by("lru"), def("lru", 9, 16, 16, 1000, 0));
    assert_eq!(by("ringbuf"), def("ringbuf", 27, 0, 0, 4096 * 4, 0));
    // PROG_ARRAY with `.values = { [1] = &prog_b }`.
    let mut jt = def("jmp_table", 3, 4, 4, 4, 0);
    jt.initial_programs = vec![(1, "prog_b".into())];
    assert_eq!(by("jmp_table"), jt);
}

#[test]
fn map_lddws_are_rewritten_to_pseudo_map_fd_with_the_map_index() {
    let obj = compile_bpf("maps_defs");
    let maps = elf_maps(&obj).unwrap();
    let idx = |n: &str| maps.iter().position(|m| m.name == n).unwrap() as u32;
    let l = link_sec(&obj, "pj/a").unwrap();
    let refs: Vec<(u8, u8, u32, u32)> = lddws(&l.code)
        .into_iter()
        .map(|(_, dst, src, imm, imm2)| (dst, src, imm, imm2))
        .collect();
    // Source order: hash, array, hidden (section symbol + addend), legacy, queue; all in r1.
    let want: Vec<(u8, u8, u32, u32)> = ["hash", "array", "hidden", "legacy", "queue"]
        .iter()
        .map(|n| (1, BPF_PSEUDO_MAP_FD, idx(n), 0))
        .collect();
    assert_eq!(refs, want);
    let mut used: Vec<usize> = want.iter().map(|w| w.2 as usize).collect();
    used.sort();
    assert_eq!(l.maps_used, used);
    // The bytecode decodes (lddw with src = 1 is a well-formed instruction).
    assert!(l.code.len() % 8 == 0 && !l.code.is_empty());
}

#[test]
fn programs_without_maps_link_as_before() {
    let obj = compile_bpf("maps_defs");
    let secs = sections(&obj);
    for sec in ["pj/plain", "pj/b"] {
        let l = link_sec(&obj, sec).unwrap();
        let (off, size, _, _) = secs.iter().find(|s| s.2 == sec).unwrap().clone();
        // No relocations: the section's bytes exactly.
        assert_eq!(l.code, obj[off..off + size], "{sec}");
        assert!(l.maps_used.is_empty());
    }
    // An object without map sections has no maps.
    assert!(elf_maps(&compile_bpf("globals")).unwrap().is_empty());
}

#[test]
fn a_program_loaded_alone_gets_its_own_maps() {
    let obj = compile_bpf("maps_defs");
    let rt = host::host_runtime();
    let p = rt
        .load_elf(&obj, &ElfLoadOptions::section("pj/a"), &Default::default())
        .unwrap();
    // Every map empty (arrays zeroed): the lookups find nothing, or zeros.
    for len in [0usize, 2, 15] {
        assert_eq!(p.call(&mut vec![0u8; len]).unwrap(), 0, "len {len}");
    }
}

#[test]
fn unknown_map_member_is_refused_naming_map_and_member() {
    let obj = compile_bpf("maps_bad_member");
    let e = elf_maps(&obj).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_mentions(
        &e,
        &[
            "map `painted`",
            ".maps",
            "unknown attribute member `colour`",
        ],
    );
    // Through link: the reference site is named too.
    let e = link_sec(&obj, "pj/m").unwrap_err();
    assert_mentions(
        &e,
        &[
            "section `pj/m`",
            "R_BPF_64_64",
            "`painted`",
            "unknown attribute member `colour`",
        ],
    );
}

#[test]
fn pinning_other_than_none_is_refused() {
    let obj = compile_bpf("maps_bad_pinning");
    let e = elf_maps(&obj).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_mentions(&e, &["map `pinned`", "`pinning` = 1", "LIBBPF_PIN_NONE"]);
}

#[test]
fn legacy_map_shorter_than_bpf_map_def_is_refused() {
    let obj = compile_bpf("maps_bad_legacy");
    let e = elf_maps(&obj).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_mentions(
        &e,
        &[
            "legacy map `stubby`",
            "section `maps`",
            "16 bytes",
            "at least 20",
        ],
    );
    let e = link_sec(&obj, "pj/m").unwrap_err();
    assert_mentions(&e, &["section `pj/m`", "`stubby`", "16 bytes"]);
}

#[test]
fn legacy_map_with_non_zero_extra_bytes_is_refused() {
    let obj = compile_bpf("maps_legacy_extra");
    let e = elf_maps(&obj).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_mentions(
        &e,
        &[
            "legacy map `longer`",
            "section `maps`",
            "byte 20 is not zero",
        ],
    );
}

#[test]
fn pointer_to_a_map_in_data_is_refused() {
    let obj = compile_bpf("maps_bad_data_ref");
    // The map itself is fine.
    assert_eq!(elf_maps(&obj).unwrap(), [def("table", 2, 4, 8, 4, 0)]);
    let e = link_sec(&obj, "pj/m").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_mentions(
        &e,
        &[
            "section `.data`",
            "R_BPF_64_ABS64",
            "`table`",
            "pointer to a map",
            "in data",
        ],
    );
}

#[test]
fn reference_into_the_middle_of_a_map_is_refused() {
    let mut obj = compile_bpf("maps_defs");
    // The lddw of `hash` at pj/a+0x20: its first immediate is the implicit addend; 8 points
    // at hash's second attribute.
    let secs = sections(&obj);
    let (code, _, _, _) = secs.iter().find(|s| s.2 == "pj/a").unwrap().clone();
    assert_eq!(obj[code + 0x20], 0x18);
    obj[code + 0x24..code + 0x28].copy_from_slice(&8u32.to_le_bytes());
    let e = link_sec(&obj, "pj/a").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_mentions(
        &e,
        &[
            "section `pj/a`",
            "offset 0x20",
            "`hash`",
            "0x8 bytes into map `hash`",
            "map's start",
        ],
    );
    // The static map through the section symbol: `.maps` + 0x78 is `hidden`; + 0x7c is not.
    let mut obj = compile_bpf("maps_defs");
    let at = code + 0xa8 + 4;
    assert_eq!(rd(&obj, at, 4), 0x78);
    obj[at..at + 4].copy_from_slice(&0x7cu32.to_le_bytes());
    let e = link_sec(&obj, "pj/a").unwrap_err();
    assert_mentions(
        &e,
        &["offset 0xa8", "`.maps`", "0x4 bytes into map `hidden`"],
    );
}

#[test]
fn relocation_in_maps_outside_values_is_refused() {
    let mut obj = compile_bpf("maps_defs");
    // Move the `values` relocation of jmp_table (at .maps+0x28, slot 1) onto its
    // `max_entries` member (offset 8).
    let e = rel_entry(&obj, ".rel.maps", 0x28);
    obj[e..e + 8].copy_from_slice(&0x8u64.to_le_bytes());
    let err = elf_maps(&obj).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported);
    assert_mentions(
        &err,
        &[
            "map `jmp_table`",
            "offset 0x8",
            "R_BPF_64_ABS64",
            "`prog_b`",
            "values",
        ],
    );
}

/// Random corruption of an object with maps (bit flips, byte stores, truncation):
/// `elf_maps` and `link` return, never panic, and their errors say where they come from.
#[test]
fn corrupted_map_objects_never_panic() {
    let seed = std::env::var("PACKJIT_ELF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x3a95_u64);
    eprintln!("PACKJIT_ELF_SEED={seed}");
    let objs = [compile_bpf("maps_defs"), compile_bpf("maps_bad_data_ref")];
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut m = objs[(next() % 2) as usize].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % m.len();
            match next() % 3 {
                0 => m[at] ^= 1 << (next() % 8),
                1 => m[at] = next() as u8,
                _ => m.truncate(at.max(1)),
            }
        }
        match elf_maps(&m) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(e.message.starts_with("ELF: "), "{e}");
                err += 1;
            }
        }
        for sec in ["pj/a", "pj/m"] {
            if let Err(e) = link_sec(&m, sec) {
                assert!(e.message.starts_with("ELF: "), "{e}");
            }
        }
    }
    eprintln!("corrupted map objects: {ok} parsed, {err} refused");
    assert!(err > 0 && ok > 0);
}

/// The model of `maps_run.c` after one packet: (proto, len) → r0; counts, bytes, events.
#[derive(Default)]
struct CounterModel {
    counts: std::collections::BTreeMap<u32, u64>,
    bytes: [u64; 4],
    events: Vec<(u32, u32, u64)>,
}

impl CounterModel {
    fn packet(&mut self, proto: u32, len: u32) -> u64 {
        let seen = {
            let c = self.counts.entry(proto).or_insert(0);
            *c += 1;
            *c
        };
        self.bytes[(proto & 3) as usize] += len as u64;
        self.events.push((proto, len, seen));
        if proto & 1 == 1 {
            self.bytes[3] += 1000;
            2
        } else {
            1
        }
    }
}

#[test]
fn a_libbpf_style_counter_with_a_ring_buffer_and_a_tail_call_runs_from_the_object() {
    use packjit::ElfObject;
    use std::sync::Arc;
    let obj = compile_bpf("maps_run");
    let rt = host::host_runtime();
    // The tail-calling program and its target each from either tier, where this build has
    // the optimizing one (whose tail calls nest the target through the runner).
    let tiers: &[Tier] = if Tier::Optimized.is_built() {
        &[Tier::Baseline, Tier::Optimized]
    } else {
        &[Tier::Baseline]
    };
    let combos = tiers
        .iter()
        .flat_map(|&caller| tiers.iter().map(move |&target| (caller, target)));
    for ((caller_tier, target_tier), trusted) in
        combos.flat_map(|c| [false, true].map(move |trusted| (c, trusted)))
    {
        let object = ElfObject::open(&obj, &[]).unwrap();
        let load_as = |section: &str, tier: Tier| -> Result<Arc<packjit::Program>, Error> {
            let sel = ElfLoadOptions::section(section);
            let opts = packjit::LoadOptions {
                tier,
                ..Default::default()
            };
            Ok(Arc::new(if trusted {
                // SAFETY: the program touches its packet, its stack and map values only.
                unsafe { object.load_trusted(&rt, &sel, &opts) }?
            } else {
                object.load(&rt, &sel, &opts)?
            }))
        };
        if (caller_tier, target_tier, trusted) == (Tier::Optimized, Tier::Optimized, true) {
            // Adaptive tiering leaves a tail-calling program on the baseline, saying why.
            let a = load_as("pj/count", Tier::Adaptive).unwrap();
            match a.tier_status() {
                packjit::TierStatus::Refused(e) => {
                    assert_mentions(&e, &["adaptive tiering", "tail call"])
                }
                other => panic!("{other:?}"),
            }
        }
        let count = load_as("pj/count", caller_tier).unwrap();
        assert_eq!(count.tier(), caller_tier);
        let stage2 = load_as("pj/stage2", target_tier).unwrap();
        assert_eq!(stage2.tier(), target_tier);
        object
            .init_prog_arrays(&rt, &[("stage2", stage2.clone())])
            .unwrap();
        let mut model = CounterModel::default();
        for (n, proto) in [6u8, 17, 6, 1, 17, 17, 58, 6].into_iter().enumerate() {
            let mut pkt = vec![proto; 20 + n];
            let r0 = count.call(&mut pkt).unwrap();
            let want = model.packet(proto as u32, pkt.len() as u32);
            assert_eq!(
                r0, want,
                "{caller_tier:?} -> {target_tier:?}, trusted {trusted}, packet {n} (proto {proto})"
            );
        }
        let counts = object.map("counts").unwrap();
        for (k, v) in &model.counts {
            assert_eq!(counts.lookup(&k.to_le_bytes()).unwrap(), v.to_le_bytes());
        }
        assert_eq!(counts.len(), model.counts.len());
        let bytes = object.map("bytes").unwrap();
        for (k, v) in model.bytes.iter().enumerate() {
            assert_eq!(
                bytes.lookup(&(k as u32).to_le_bytes()).unwrap(),
                v.to_le_bytes(),
                "bytes[{k}]"
            );
        }
        let mut events = Vec::new();
        object
            .map("events")
            .unwrap()
            .ringbuf_consume(&mut |rec: &[u8]| {
                let u32_at = |o: usize| u32::from_le_bytes(rec[o..o + 4].try_into().unwrap());
                let seen = u64::from_le_bytes(rec[8..16].try_into().unwrap());
                events.push((u32_at(0), u32_at(4), seen));
            });
        assert_eq!(events, model.events, "trusted {trusted}");
        // The slots keep their programs (and so the maps) alive: empty them.
        rt.set_prog_array(object.map("stages").unwrap(), 1, None)
            .unwrap();
    }
}

#[test]
fn a_prog_array_naming_a_program_not_loaded_is_refused_and_fills_nothing() {
    let obj = compile_bpf("maps_run");
    let rt = host::host_runtime();
    let object = packjit::ElfObject::open(&obj, &[]).unwrap();
    let e = object.init_prog_arrays(&rt, &[]).unwrap_err();
    assert_mentions(&e, &["`stages`", "slot 1", "`stage2`"]);
}

#[test]
fn per_cpu_lru_queue_stack_and_callback_programs_from_clang_match_the_model() {
    use packjit::ElfObject;
    let obj = compile_bpf("maps_kinds");
    let rt = host::host_runtime();
    let input = |key: u32, n: u32| [key.to_le_bytes(), n.to_le_bytes()].concat();
    // The optimizing tier too, where this build has it (its map helpers are calls).
    let tiers: &[Tier] = if Tier::Optimized.is_built() {
        &[Tier::Baseline, Tier::Optimized]
    } else {
        &[Tier::Baseline]
    };
    for (&tier, trusted) in tiers
        .iter()
        .flat_map(|t| [false, true].map(move |trusted| (t, trusted)))
    {
        let object = ElfObject::open(&obj, &[]).unwrap();
        let opts = packjit::LoadOptions {
            tier,
            ..Default::default()
        };
        let load = |section: &str| {
            let sel = ElfLoadOptions::section(section);
            let p = if trusted {
                // SAFETY: the programs touch their input, their stack and map values only.
                unsafe { object.load_trusted(&rt, &sel, &opts) }.unwrap()
            } else {
                object.load(&rt, &sel, &opts).unwrap()
            };
            assert_eq!(p.tier(), tier, "{section}");
            p
        };
        // Per-CPU: whichever CPUs the runs landed on, the copies add up.
        let percpu = load("pj/percpu");
        for (k, n) in [(1u32, 5u32), (1, 7), (2, 1), (5, 10)] {
            percpu.call(&mut input(k, n)).unwrap();
        }
        let sum_over_cpus = |map: &str, key: u32| -> u64 {
            let v = object.map(map).unwrap().lookup(&key.to_le_bytes()).unwrap();
            v.chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .sum()
        };
        assert_eq!(
            sum_over_cpus("pcpu", 1),
            5 + 7 + 10,
            "{tier:?}, trusted {trusted}"
        );
        assert_eq!(sum_over_cpus("pcpu", 2), 1);
        assert_eq!(sum_over_cpus("pcpu_hash", 1), 3);
        // LRU of 4: every insert succeeds, at most 4 stay, the newest among them.
        let lru = load("pj/lru");
        for k in 0..8u32 {
            let present = lru.call(&mut input(k, 100 + k)).unwrap();
            assert_eq!(present, (k as u64 + 1).min(4), "after inserting {k}");
            let newest = object.map("lru").unwrap().lookup(&k.to_le_bytes()).unwrap();
            assert_eq!(newest, (100 + k as u64).to_le_bytes());
        }
        assert_eq!(load("pj/queues").call(&mut input(0, 3)).unwrap(), 123_321);
        // bpf_loop with a static callback.
        let lp = load("pj/loop");
        assert_eq!(lp.call(&mut input(255, 10)).unwrap(), 285 * 1000 + 10);
        assert_eq!(lp.call(&mut input(3, 10)).unwrap(), 14 * 1000 + 4);
        // bpf_for_each_map_elem over the array the host filled.
        let table = object.map("table").unwrap();
        for k in 0..8u32 {
            table
                .update(&k.to_le_bytes(), &(k as u64 + 1).to_le_bytes(), 0)
                .unwrap();
        }
        let each = load("pj/each");
        assert_eq!(each.call(&mut input(255, 0)).unwrap(), 3628 * 100 + 8);
        assert_eq!(each.call(&mut input(2, 0)).unwrap(), 603 * 100 + 3);
        // bpf_for_each_map_elem over hash maps: the host sets every CPU's copy of the
        // per-CPU hash (keys 1, 2 from pj/percpu) so the walk's CPU does not matter; the LRU
        // holds 4 keys. The walk goes in bucket order, as `keys` lists them.
        let pcpu_hash = object.map("pcpu_hash").unwrap();
        let order: Vec<u64> = pcpu_hash
            .keys()
            .iter()
            .map(|k| u32::from_le_bytes(k[..4].try_into().unwrap()) as u64)
            .collect();
        for &k in &order {
            let v: Vec<u8> = (0..packjit::maps::Map::possible_cpus())
                .flat_map(|_| (k * 10).to_le_bytes())
                .collect();
            pcpu_hash.update(&(k as u32).to_le_bytes(), &v, 0).unwrap();
        }
        let each_hash = load("pj/each_hash");
        for stop in [255u32, order[0] as u32] {
            let n = order
                .iter()
                .position(|&k| k == stop as u64)
                .map_or(order.len(), |i| i + 1);
            let total: u64 = order[..n].iter().map(|k| k * 10 * 100 + k).sum();
            let r = each_hash.call(&mut input(stop, 0)).unwrap();
            assert_eq!(
                r & 0xffff_ffff,
                total * 100 + n as u64,
                "stop {stop}, order {order:?}"
            );
            assert_eq!(r >> 32, 4, "the LRU's 4 keys");
        }
    }
}

/// `pj/array` of `tests/bpf/maps_kinds.c`: array lookups with keys the caller picks, inlined
/// by every tier (the optimizing tier's Cranelift sequence and the baseline's), sandboxed and
/// trusted: elements in range, the first key past the end and the top of `u32` (NULL), and
/// the map's contents after the runs, as the kernel's semantics give them. Then the same
/// program adaptive: a trusted program with maps tiers up and goes on from the same map.
#[test]
fn inlined_array_lookups_match_on_every_tier_and_adaptive_programs_with_maps_tier_up() {
    use packjit::{ElfObject, TierPolicy, TierStatus};
    let obj = compile_bpf("maps_kinds");
    let rt = host::host_runtime();
    let input = |key: u32, n: u32| [key.to_le_bytes(), n.to_le_bytes()].concat();
    let tiers: &[Tier] = if Tier::Optimized.is_built() {
        &[Tier::Baseline, Tier::Optimized]
    } else {
        &[Tier::Baseline]
    };
    // (key, n) -> result; the element values after all of them.
    let runs = [
        ((0u32, 5u32), 5u64),
        ((6, 2), 2),
        ((8, 1), 0xdead),
        ((u32::MAX, 1), 0xdead),
        ((5, 3), 5),
    ];
    let after: [u64; 8] = [5, 5, 5, 0, 0, 3, 5, 5];
    let contents = |object: &ElfObject| -> Vec<u64> {
        let table = object.map("table").unwrap();
        (0..8u32)
            .map(|k| {
                u64::from_le_bytes(table.lookup(&k.to_le_bytes()).unwrap().try_into().unwrap())
            })
            .collect()
    };
    for (&tier, trusted) in tiers
        .iter()
        .flat_map(|t| [false, true].map(move |trusted| (t, trusted)))
    {
        let object = ElfObject::open(&obj, &[]).unwrap();
        let opts = packjit::LoadOptions {
            tier,
            ..Default::default()
        };
        let sel = ElfLoadOptions::section("pj/array");
        let p = if trusted {
            // SAFETY: the program touches its input, its stack and the array's values only.
            unsafe { object.load_trusted(&rt, &sel, &opts) }.unwrap()
        } else {
            object.load(&rt, &sel, &opts).unwrap()
        };
        assert_eq!(p.tier(), tier);
        for ((key, n), want) in runs {
            let got = p.call(&mut input(key, n)).unwrap();
            assert_eq!(got, want, "{tier:?}, trusted {trusted}, key {key:#x}");
        }
        assert_eq!(contents(&object), after, "{tier:?}, trusted {trusted}");
    }
    if !Tier::Optimized.is_built() {
        return;
    }
    // Adaptive: tiers up at load (`Calls(0)`), runs on from the same map.
    let object = ElfObject::open(&obj, &[]).unwrap();
    let adaptive = packjit::LoadOptions {
        tier: Tier::Adaptive,
        tier_policy: Some(TierPolicy::Manual),
        ..Default::default()
    };
    let sel = ElfLoadOptions::section("pj/array");
    // SAFETY: as above.
    let a = unsafe { object.load_trusted(&rt, &sel, &adaptive) }.unwrap();
    assert_eq!(a.tier_status(), TierStatus::Baseline);
    let ((key, n), want) = runs[0];
    assert_eq!(a.call(&mut input(key, n)).unwrap(), want);
    a.request_tier_up();
    assert_eq!(a.wait_tier_up(), TierStatus::Optimized);
    for ((key, n), want) in &runs[1..] {
        assert_eq!(a.call(&mut input(*key, *n)).unwrap(), *want, "key {key:#x}");
    }
    assert_eq!(contents(&object), after);
}

/// `tests/bpf/lpm_trie.c`: a BTF-defined LPM trie routing IPv4 addresses, filled by the host
/// and by the program, checked against a brute-force longest-prefix model, sandboxed and
/// trusted.
#[test]
fn lpm_trie_routes_from_clang_match_the_longest_prefix_model() {
    use packjit::maps::BPF_NOEXIST;
    use packjit::ElfObject;
    let obj = compile_bpf("lpm_trie");
    let maps = elf_maps(&obj).unwrap();
    // LPM_TRIE, struct { u32 prefixlen; u8 addr[4]; } key, struct route value,
    // BPF_F_NO_PREALLOC; and the legacy `maps` section's one with u32 values.
    let by = |n: &str| maps.iter().find(|m| m.name == n).unwrap().clone();
    assert_eq!(maps.len(), 2);
    assert_eq!(by("routes"), def("routes", 11, 8, 8, 64, 1));
    assert_eq!(by("legacy_routes"), def("legacy_routes", 11, 8, 4, 16, 1));
    let rt = host::host_runtime();
    let seed = std::env::var("PACKJIT_LPM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1b_4a11_u64);
    println!("lpm_trie.c: seed {seed:#x}");
    let req = |a: [u8; 4], plen: u32, id: u32, flags: u32| {
        [
            a.to_vec(),
            plen.to_le_bytes().to_vec(),
            id.to_le_bytes().to_vec(),
            flags.to_le_bytes().to_vec(),
        ]
        .concat()
    };
    let lpm_key = |a: [u8; 4], plen: u32| [plen.to_ne_bytes().to_vec(), a.to_vec()].concat();
    let masked = |a: [u8; 4], plen: u32| {
        let m = if plen == 0 {
            0
        } else {
            u32::MAX << (32 - plen)
        };
        u32::from_be_bytes(a) & m
    };
    for trusted in [false, true] {
        let object = ElfObject::open(&obj, &[]).unwrap();
        let load = |section: &str| {
            let sel = ElfLoadOptions::section(section);
            if trusted {
                // SAFETY: the programs touch their input, their stack and map values only.
                unsafe { object.load_trusted(&rt, &sel, &Default::default()) }.unwrap()
            } else {
                object.load(&rt, &sel, &Default::default()).unwrap()
            }
        };
        let (matcher, add, del) = (load("pj/match"), load("pj/add"), load("pj/del"));
        // The legacy map: stores from the program, longest match from the program.
        let legacy = load("pj/legacy");
        let route = |a: [u8; 4], plen: u32, id: u32, store: bool| {
            legacy.call(&mut req(a, plen, id, store as u32)).unwrap()
        };
        assert_eq!(route([10, 1, 2, 3], 0, 0, false), 0xffff_ffff);
        assert_eq!(route([10, 0, 0, 0], 8, 7, true), 7);
        assert_eq!(route([10, 1, 2, 3], 0, 0, false), 7);
        assert_eq!(route([10, 1, 0, 0], 16, 9, true), 9);
        assert_eq!(route([10, 1, 2, 3], 0, 0, false), 9);
        assert_eq!(route([10, 2, 2, 3], 0, 0, false), 7);
        assert_eq!(route([11, 1, 2, 3], 0, 0, false), 0xffff_ffff);
        assert_eq!(
            route([10, 1, 0, 0], 33, 9, true) as i64,
            -22,
            "prefixlen 33"
        );
        assert_eq!(object.map("legacy_routes").unwrap().len(), 2);
        let routes = object.map("routes").unwrap();
        // The host's table: a default route and the kernel documentation's example.
        let mut model: Vec<(u32, u32, u32)> = Vec::new(); // (network, prefixlen, id)
        for (a, plen, id) in [
            ([0, 0, 0, 0], 0u32, 1u32),
            ([192, 168, 0, 0], 16, 2),
            ([192, 168, 0, 0], 24, 3),
            ([192, 168, 1, 0], 24, 4),
            ([192, 168, 128, 0], 24, 5),
        ] {
            let v = [id.to_le_bytes(), 0u32.to_le_bytes()].concat();
            routes.update(&lpm_key(a, plen), &v, 0).unwrap();
            model.push((masked(a, plen), plen, id));
        }
        let mut rng = seed | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut hits = std::collections::HashMap::<u32, u32>::new();
        for step in 0..400 {
            let r = next();
            let a = [
                [10, 192, 172][(r % 3) as usize],
                [168, 0, 16, 1][(r >> 8) as usize % 4],
                (r >> 16) as u8 & 0x83,
                (r >> 24) as u8,
            ];
            let plen = (r >> 32) as u32 % 33;
            let ctx = format!("trusted {trusted} seed {seed:#x} step {step}");
            match (r >> 40) % 4 {
                0 => {
                    // Add with BPF_NOEXIST from the program: 0 or -EEXIST, as the model says.
                    let id = 100 + step as u32;
                    let exists = model
                        .iter()
                        .any(|&(n, p, _)| p == plen && n == masked(a, plen));
                    let got = add.call(&mut req(a, plen, id, BPF_NOEXIST as u32)).unwrap() as i64;
                    if exists {
                        assert_eq!(got, -17, "{ctx}");
                    } else if model.len() == 64 {
                        assert_eq!(got, -28, "{ctx}");
                    } else {
                        assert_eq!(got, 0, "{ctx}");
                        model.push((masked(a, plen), plen, id));
                    }
                }
                1 => {
                    let at = model
                        .iter()
                        .position(|&(n, p, _)| p == plen && n == masked(a, plen));
                    let got = del.call(&mut req(a, plen, 0, 0)).unwrap() as i64;
                    match at {
                        Some(i) => {
                            assert_eq!(got, 0, "{ctx}");
                            let (_, _, id) = model.remove(i);
                            hits.remove(&id);
                        }
                        None => assert_eq!(got, -2, "{ctx}"),
                    }
                }
                _ => {
                    let addr = u32::from_be_bytes(a);
                    let want = model
                        .iter()
                        .filter(|&&(n, p, _)| masked(addr.to_be_bytes(), p) == n)
                        .max_by_key(|&&(_, p, _)| p)
                        .map_or(0xffff_ffff, |&(_, _, id)| id);
                    let got = matcher.call(&mut req(a, 0, 0, 0)).unwrap();
                    assert_eq!(got, u64::from(want), "route {a:?}: {ctx}");
                    if want != 0xffff_ffff {
                        *hits.entry(want).or_default() += 1;
                    }
                }
            }
        }
        // The run exercised the trie: routes the program added, matches beyond the default.
        assert!(
            model.len() > 20 && hits.len() > 3,
            "{} routes, {} hit",
            model.len(),
            hits.len()
        );
        // The hit counts the program incremented in place, read by the host.
        assert_eq!(routes.len(), model.len());
        for &(n, p, id) in &model {
            let v = routes.lookup(&lpm_key(n.to_be_bytes(), p)).unwrap();
            let got = u32::from_le_bytes(v[4..8].try_into().unwrap());
            assert_eq!(
                got,
                hits.get(&id).copied().unwrap_or(0),
                "hits of /{p} id {id}"
            );
        }
    }
}

/// `lpm_trie.c`'s router on four threads (two sandboxed, two trusted) while the host adds,
/// replaces and deletes routes below a permanent 10.0.0.0/8: every address finds a route
/// (the /8 at worst), and the route found covers the address. Route ids index a table of
/// candidate routes fixed before the race.
#[test]
fn lpm_trie_lookups_from_programs_race_host_updates_and_deletes() {
    use packjit::ElfObject;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let obj = compile_bpf("lpm_trie");
    let rt = host::host_runtime();
    let object = ElfObject::open(&obj, &[]).unwrap();
    let sel = ElfLoadOptions::section("pj/match");
    let sandboxed = Arc::new(object.load(&rt, &sel, &Default::default()).unwrap());
    // SAFETY: the program touches its input, its stack and the map's values only.
    let trusted = Arc::new(unsafe { object.load_trusted(&rt, &sel, &Default::default()) }.unwrap());
    let routes = object.map("routes").unwrap();
    let seed = std::env::var("PACKJIT_LPM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x57_2e55_u64);
    println!("lpm_trie.c race: seed {seed:#x}");
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Candidate routes: id 0 is 10.0.0.0/8, the others /9../32 networks inside it.
    let mut cand: Vec<(u32, u32)> = vec![(0x0a00_0000, 8)];
    for _ in 1..48 {
        let r = next();
        let plen = 9 + (r % 24) as u32;
        let addr = 0x0a00_0000 | ((r >> 8) as u32 & 0x0003_ffff) << 6;
        cand.push((addr & (u32::MAX << (32 - plen)), plen));
    }
    let cand = Arc::new(cand);
    let key = |(net, plen): (u32, u32)| [plen.to_ne_bytes(), net.to_be_bytes()].concat();
    let value = |id: u32| [id.to_le_bytes(), 0u32.to_le_bytes()].concat();
    routes.update(&key(cand[0]), &value(0), 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let p = if t % 2 == 0 {
                sandboxed.clone()
            } else {
                trusted.clone()
            };
            let (cand, stop) = (cand.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut x = seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut runs = 0u64;
                while !stop.load(Ordering::Relaxed) || runs < 100 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly addresses inside some candidate route, so matches go deep.
                    let (net, plen) = cand[(x % cand.len() as u64) as usize];
                    let host_bits = if plen == 32 {
                        0
                    } else {
                        (x >> 32) as u32 >> plen
                    };
                    let addr = net | host_bits;
                    let mut ctx = [0u8; 16];
                    ctx[..4].copy_from_slice(&addr.to_be_bytes());
                    let id = p.call(&mut ctx).unwrap();
                    let &(rnet, rplen) = cand.get(id as usize).unwrap_or_else(|| {
                        panic!("thread {t}: {addr:#x} got route id {id:#x} (seed {seed:#x})")
                    });
                    let mask = u32::MAX << (32 - rplen);
                    assert_eq!(
                        addr & mask,
                        rnet,
                        "thread {t}: {addr:#x} routed by {rnet:#x}/{rplen} (seed {seed:#x})"
                    );
                    runs += 1;
                }
                runs
            })
        })
        .collect();
    for _ in 0..4000 {
        let r = next();
        let id = 1 + (r % (cand.len() as u64 - 1)) as u32;
        if r >> 40 & 3 == 0 {
            let _ = routes.delete(&key(cand[id as usize]));
        } else {
            routes
                .update(&key(cand[id as usize]), &value(id), 0)
                .unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let runs: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(runs >= 400, "{runs} runs");
    // Afterwards the trie holds the /8 and whatever the host left, each with its own id.
    for k in routes.keys() {
        let id = u32::from_le_bytes(routes.lookup(&k).unwrap()[..4].try_into().unwrap());
        assert_eq!(key(cand[id as usize]), k);
    }
}
