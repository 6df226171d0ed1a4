//! Map semantics against models of the kernel's rules: spec validation, a differential
//! test of random operation sequences on arrays and every hash flavour, LRU eviction,
//! queues and stacks, prog arrays.

mod common;

use common::{map, prog_delete, prog_lookup, prog_push, prog_take, prog_update, seed, spec, Rng};
use packjit_maps::*;
use std::collections::BTreeMap;

const ENOENT: i64 = -2;
const E2BIG: i64 = -7;
const EEXIST: i64 = -17;
const EINVAL: i64 = -22;

#[test]
fn invalid_specs_are_refused_naming_map_and_field() {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let cases: Vec<(MapSpec, &str, i32)> = vec![
        (spec("v0", MapType::Hash, 4, 0, 8), "value_size", 22),
        (spec("v0a", MapType::Array, 4, 0, 8), "value_size", 22),
        (spec("m0", MapType::Array, 4, 8, 0), "max_entries", 22),
        (spec("m0h", MapType::LruHash, 4, 8, 0), "max_entries", 22),
        (spec("k8", MapType::Array, 8, 8, 4), "key_size", 22),
        (spec("k0", MapType::PercpuArray, 0, 8, 4), "key_size", 22),
        (spec("kh0", MapType::Hash, 0, 8, 4), "key_size", 22),
        (spec("kbig", MapType::Hash, 513, 8, 4), "key_size", 7),
        (
            spec("vbig", MapType::Array, 4, (1 << 20) + 1, 4),
            "value_size",
            7,
        ),
        (
            spec("pcvbig", MapType::PercpuHash, 4, (32 << 10) + 1, 4),
            "value_size",
            7,
        ),
        (
            spec("rb3", MapType::RingBuf, 0, 0, 3 * page as u32),
            "max_entries",
            22,
        ),
        (
            spec("rbsmall", MapType::RingBuf, 0, 0, 64),
            "max_entries",
            22,
        ),
        (
            spec("rbkey", MapType::RingBuf, 4, 0, page as u32),
            "key_size",
            22,
        ),
        (
            spec("rbval", MapType::RingBuf, 0, 4, page as u32),
            "value_size",
            22,
        ),
        (spec("qkey", MapType::Queue, 4, 4, 4), "key_size", 22),
        (spec("sval", MapType::Stack, 0, 0, 4), "value_size", 22),
        (spec("pa", MapType::ProgArray, 4, 8, 4), "value_size", 22),
        (
            MapSpec {
                flags: 1 << 20,
                ..spec("flags", MapType::Hash, 4, 4, 4)
            },
            "flags",
            22,
        ),
        (
            MapSpec {
                flags: BPF_F_NO_PREALLOC,
                ..spec("np", MapType::Array, 4, 4, 4)
            },
            "flags",
            22,
        ),
        (
            MapSpec {
                flags: BPF_F_NO_PREALLOC,
                ..spec("nplru", MapType::LruHash, 4, 4, 4)
            },
            "flags",
            22,
        ),
        (
            MapSpec {
                flags: BPF_F_RDONLY_PROG,
                ..spec("rorb", MapType::RingBuf, 0, 0, page as u32)
            },
            "flags",
            22,
        ),
    ];
    for (s, field, errno) in cases {
        let name = s.name.clone();
        let e = Map::new(s).expect_err(&name);
        let text = e.to_string();
        assert!(text.contains(&format!("`{name}`")), "{text}");
        assert!(text.contains(field), "{name}: {text} should name {field}");
        assert_eq!(e.errno(), errno, "{name}: {text}");
        assert_eq!(e.map(), name);
    }
    // The accepted corner cases.
    Map::new(spec("rb", MapType::RingBuf, 0, 0, page as u32)).unwrap();
    Map::new(MapSpec {
        flags: BPF_F_NO_PREALLOC,
        ..spec("np", MapType::Hash, 4, 4, 4)
    })
    .unwrap();
    Map::new(spec("k512", MapType::Hash, 512, 1, 1)).unwrap();
}

#[test]
fn map_types_round_trip() {
    for raw in 0..40 {
        if let Some(t) = MapType::from_raw(raw) {
            assert_eq!(t as u32, raw);
            assert!(t.name().starts_with("BPF_MAP_TYPE_"));
        }
    }
    assert_eq!(MapType::from_raw(27), Some(MapType::RingBuf));
    assert_eq!(
        MapType::LruPercpuHash.name(),
        "BPF_MAP_TYPE_LRU_PERCPU_HASH"
    );
    assert!(MapType::PercpuArray.is_per_cpu() && !MapType::LruHash.is_per_cpu());
}

/// The kernel's update rules as a model; `lru` models eviction by syncing with the map.
struct Model {
    max: usize,
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn key_of(rng: &mut Rng, ks: usize, space: u64) -> Vec<u8> {
    let k = rng.below(space);
    let mut v = k.to_le_bytes().to_vec();
    v.resize(ks, 0);
    if ks > 8 {
        // Vary a later word too, so multi-word hashing and comparison are exercised.
        v[ks - 1] = (k % 3) as u8;
    }
    v
}

fn value_of(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn hash_differential(t: MapType, ks: u32, vs: u32, max: u32, ops: usize, seed: u64) {
    println!("{}: ks {ks} vs {vs} max {max} seed {seed:#x}", t.name());
    let m = map("diff", t, ks, vs, max);
    let lru = matches!(t, MapType::LruHash | MapType::LruPercpuHash);
    let percpu = t.is_per_cpu();
    let cpus = Map::possible_cpus();
    let stride = (vs as usize + 7) & !7;
    let host_vs = m.host_value_size();
    let mut rng = Rng(seed);
    let mut model = Model {
        max: max as usize,
        entries: BTreeMap::new(),
    };
    let space = max as u64 * 2;
    let _pin_cell = ();
    for step in 0..ops {
        let ctx = format!("{} seed {seed:#x} step {step}", t.name());
        let key = key_of(&mut rng, ks as usize, space);
        match rng.below(10) {
            0..=3 => {
                // Update, host or program side, with a random (sometimes invalid) flag.
                let flags =
                    [BPF_ANY, BPF_NOEXIST, BPF_EXIST, BPF_F_LOCK, 3, 9][rng.below(6) as usize];
                let program = rng.below(2) == 0;
                let cpu = rng.below(cpus as u64) as usize;
                let one = value_of(&mut rng, vs as usize);
                let present = model.entries.contains_key(&key);
                let expect = if flags > BPF_EXIST || (flags & !BPF_F_LOCK) > BPF_EXIST {
                    EINVAL
                } else if present && flags == BPF_NOEXIST {
                    EEXIST
                } else if !present && flags == BPF_EXIST {
                    ENOENT
                } else if !present && model.entries.len() == model.max && !lru {
                    E2BIG
                } else {
                    0
                };
                let got = if program {
                    prog_update(&m, &key, &one, flags, cpu as u32)
                } else {
                    let mut full = vec![0u8; host_vs];
                    for c in 0..if percpu { cpus } else { 1 } {
                        let v = value_of(&mut rng, vs as usize);
                        full[c * stride..c * stride + vs as usize].copy_from_slice(&v);
                    }
                    let r = m.update(&key, &full, flags);
                    if r.is_ok() {
                        // Host writes: every CPU's value from the buffer.
                        let before = model.entries.len();
                        if !present && lru && before == model.max {
                            sync_evicted(&m, &mut model, &key, &ctx);
                        }
                        model.entries.insert(key.clone(), full);
                    }
                    let code = r.map_or_else(|e| -(e.errno() as i64), |()| 0);
                    assert_eq!(code, expect, "{ctx}: host update flags {flags}");
                    continue;
                };
                assert_eq!(got, expect, "{ctx}: program update flags {flags}");
                if got == 0 {
                    if !present && lru && model.entries.len() == model.max {
                        sync_evicted(&m, &mut model, &key, &ctx);
                    }
                    let entry = model
                        .entries
                        .entry(key.clone())
                        .or_insert_with(|| vec![0u8; host_vs]);
                    let c = if percpu { cpu } else { 0 };
                    if !present {
                        entry.iter_mut().for_each(|b| *b = 0);
                    }
                    entry[c * stride..c * stride + vs as usize].copy_from_slice(&one);
                }
            }
            4..=5 => {
                let program = rng.below(2) == 0;
                let present = model.entries.remove(&key).is_some();
                let got = if program {
                    prog_delete(&m, &key)
                } else {
                    m.delete(&key).map_or_else(|e| -(e.errno() as i64), |()| 0)
                };
                assert_eq!(got, if present { 0 } else { ENOENT }, "{ctx}: delete");
            }
            6..=8 => {
                let want = model.entries.get(&key);
                match m.lookup(&key) {
                    Ok(v) => assert_eq!(Some(&v), want, "{ctx}: host lookup"),
                    Err(e) => {
                        assert_eq!(want, None, "{ctx}: host lookup {e}");
                        assert_eq!(e.errno(), 2);
                    }
                }
                let cpu = rng.below(cpus as u64) as usize;
                let got = prog_lookup(&m, &key, cpu as u32, false);
                match want {
                    None => assert_eq!(got, None, "{ctx}: program lookup of an absent key"),
                    Some(w) => {
                        let c = if percpu { cpu } else { 0 };
                        let (p, bytes) = got.expect("present key");
                        assert_eq!(
                            bytes,
                            &w[c * stride..c * stride + vs as usize],
                            "{ctx}: program lookup"
                        );
                        assert_eq!(p % 8, 0);
                        let in_region = m
                            .value_regions()
                            .iter()
                            .any(|&(s, n, _)| p >= s as usize && p + vs as usize <= s as usize + n);
                        assert!(in_region, "{ctx}: value outside value_regions");
                        if percpu {
                            assert_eq!(
                                prog_lookup(&m, &key, cpu as u32, true).map(|x| x.0),
                                Some(p)
                            );
                        }
                    }
                }
                if percpu {
                    assert_eq!(prog_lookup(&m, &key, cpus as u32, true), None);
                } else {
                    assert_eq!(
                        prog_lookup(&m, &key, 0, true),
                        None,
                        "lookup_percpu on a shared map"
                    );
                }
            }
            _ => check_iteration(&m, &model, &ctx),
        }
        assert_eq!(m.len(), model.entries.len(), "{ctx}: len");
    }
    check_iteration(&m, &model, "final");
}

/// After an LRU insert into a full map: exactly one old key is gone; drop it from the model.
fn sync_evicted(m: &Map, model: &mut Model, new: &[u8], ctx: &str) {
    let gone: Vec<Vec<u8>> = model
        .entries
        .keys()
        .filter(|k| m.lookup(k).is_err())
        .cloned()
        .collect();
    assert_eq!(gone.len(), 1, "{ctx}: one key evicted, got {gone:?}");
    assert_ne!(gone[0], new);
    model.entries.remove(&gone[0]);
}

fn check_iteration(m: &Map, model: &Model, ctx: &str) {
    let mut seen = Vec::new();
    let mut cur: Option<Vec<u8>> = None;
    loop {
        match m.next_key(cur.as_deref()) {
            Ok(k) => {
                seen.push(k.clone());
                cur = Some(k);
                assert!(seen.len() <= model.entries.len(), "{ctx}: next_key loops");
            }
            Err(e) => {
                assert_eq!(e.errno(), 2, "{ctx}: {e}");
                break;
            }
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "{ctx}: next_key repeats a key");
    assert_eq!(
        sorted,
        model.entries.keys().cloned().collect::<Vec<_>>(),
        "{ctx}: next_key covers"
    );
    let mut keys = m.keys();
    keys.sort();
    assert_eq!(keys, sorted, "{ctx}: keys()");
    // A key not in the map restarts iteration at the first key, as the kernel.
    if let Some(first) = seen.first() {
        let missing = vec![0xeeu8; m.spec().key_size as usize];
        if !model.entries.contains_key(&missing) {
            assert_eq!(&m.next_key(Some(&missing)).unwrap(), first);
        }
    }
}

#[test]
fn hash_flavours_match_the_model() {
    let s = seed();
    for (i, t) in [
        MapType::Hash,
        MapType::PercpuHash,
        MapType::LruHash,
        MapType::LruPercpuHash,
    ]
    .into_iter()
    .enumerate()
    {
        for (j, &(ks, vs, max)) in [(4, 8, 16), (8, 12, 32), (13, 3, 8), (4, 8, 1)]
            .iter()
            .enumerate()
        {
            hash_differential(
                t,
                ks,
                vs,
                max,
                1500,
                s ^ (((i * 8 + j) as u64 + 1) * 0x9e37_79b9),
            );
        }
    }
}

#[test]
fn array_matches_the_model() {
    let s = seed();
    for (t, vs, max) in [
        (MapType::Array, 12u32, 10u32),
        (MapType::PercpuArray, 8, 5),
        (MapType::Array, 1, 1),
    ] {
        println!("{}: seed {s:#x}", t.name());
        let m = map("arr", t, 4, vs, max);
        let percpu = t.is_per_cpu();
        let cpus = if percpu { Map::possible_cpus() } else { 1 };
        let stride = (vs as usize + 7) & !7;
        let host_vs = m.host_value_size();
        assert_eq!(host_vs, if percpu { cpus * stride } else { vs as usize });
        let mut model = vec![vec![0u8; host_vs]; max as usize];
        let mut rng = Rng(s);
        let layout = m.array_layout().unwrap();
        assert_eq!(layout.value_stride, stride as u64);
        assert_eq!(
            layout.cpu_stride,
            if percpu {
                stride as u64 * max as u64
            } else {
                0
            }
        );
        assert_eq!(layout.cpus as usize, cpus);
        assert_eq!(layout.base as usize % 8, 0);
        for step in 0..2000 {
            let ctx = format!("{} seed {s:#x} step {step}", t.name());
            let idx = rng.below(max as u64 + 2) as u32;
            let key = idx.to_ne_bytes();
            match rng.below(5) {
                0 | 1 => {
                    let flags = [
                        BPF_ANY,
                        BPF_NOEXIST,
                        BPF_EXIST,
                        BPF_F_LOCK,
                        3,
                        BPF_NOEXIST | BPF_F_LOCK,
                    ][rng.below(6) as usize];
                    let bad = if percpu {
                        flags > BPF_EXIST
                    } else {
                        flags & !BPF_F_LOCK > BPF_EXIST
                    };
                    let expect = if bad {
                        EINVAL
                    } else if idx >= max {
                        E2BIG
                    } else if flags & BPF_NOEXIST != 0 {
                        EEXIST
                    } else if flags & BPF_F_LOCK != 0 {
                        EINVAL
                    } else {
                        0
                    };
                    let cpu = rng.below(cpus as u64) as usize;
                    let len = if rng.below(2) == 0 {
                        vs as usize
                    } else {
                        host_vs
                    };
                    let v = value_of(&mut rng, len);
                    let got = if v.len() == vs as usize && (percpu || rng.below(2) == 0) {
                        let r = prog_update(&m, &key, &v, flags, cpu as u32);
                        if r == 0 {
                            model[idx as usize][cpu * stride..cpu * stride + vs as usize]
                                .copy_from_slice(&v);
                        }
                        r
                    } else {
                        let mut full = vec![0u8; host_vs];
                        for c in 0..cpus {
                            full[c * stride..c * stride + vs as usize].copy_from_slice(
                                &v[..vs as usize]
                                    .iter()
                                    .map(|b| b ^ c as u8)
                                    .collect::<Vec<_>>(),
                            );
                        }
                        let r = m
                            .update(&key, &full, flags)
                            .map_or_else(|e| -(e.errno() as i64), |()| 0);
                        if r == 0 {
                            model[idx as usize] = full;
                        }
                        r
                    };
                    assert_eq!(got, expect, "{ctx}: update idx {idx} flags {flags}");
                }
                2 => {
                    assert_eq!(prog_delete(&m, &key), EINVAL, "{ctx}");
                    assert_eq!(m.delete(&key).unwrap_err().errno(), 22);
                }
                _ => {
                    let cpu = rng.below(cpus as u64) as usize;
                    let got = prog_lookup(&m, &key, cpu as u32, false);
                    if idx >= max {
                        assert_eq!(got, None, "{ctx}");
                        assert_eq!(m.lookup(&key).unwrap_err().errno(), 2);
                        continue;
                    }
                    let (p, bytes) = got.expect("index in range");
                    let want = &model[idx as usize][cpu * stride..cpu * stride + vs as usize];
                    assert_eq!(bytes, want, "{ctx}");
                    let inl = layout.base as usize
                        + cpu * layout.cpu_stride as usize
                        + idx as usize * stride;
                    assert_eq!(p, inl, "{ctx}: array_layout addressing");
                    assert_eq!(m.lookup(&key).unwrap(), model[idx as usize], "{ctx}");
                }
            }
        }
        // next_key: index order, None / out of range -> 0, last -> ENOENT.
        let mut seen = vec![];
        let mut cur = None;
        while let Ok(k) = m.next_key(cur.as_deref()) {
            seen.push(u32::from_ne_bytes(k[..].try_into().unwrap()));
            cur = Some(k);
        }
        assert_eq!(seen, (0..max).collect::<Vec<_>>());
        assert_eq!(
            m.next_key(Some(&(max + 5).to_ne_bytes())).unwrap(),
            0u32.to_ne_bytes()
        );
        assert_eq!(m.len(), max as usize);
        // for_each visits indices in order and counts the stopping element.
        let mut visited = 0;
        let n = m.for_each(|k, _| {
            assert_eq!(u32::from_ne_bytes(k.try_into().unwrap()), visited);
            visited += 1;
            visited < 2.min(max)
        });
        assert_eq!(n, 2.min(max) as u64);
    }
}

#[test]
fn lru_evicts_and_keeps_recently_used_keys() {
    for t in [MapType::LruHash, MapType::LruPercpuHash] {
        let max = 64u32;
        let m = map("lru", t, 4, 8, max);
        let v = [7u8; 8];
        let host_v = vec![7u8; m.host_value_size()];
        for k in 0..max {
            m.update(&k.to_ne_bytes(), &host_v, BPF_NOEXIST).unwrap();
        }
        assert_eq!(m.len(), max as usize);
        // Insert another 32 keys; before each, look up the "hot" keys 0..16 from a program.
        for k in max..max + 32 {
            for hot in 0..16u32 {
                let found = prog_lookup(&m, &hot.to_ne_bytes(), 0, false);
                assert!(
                    found.is_some(),
                    "{}: hot key {hot} evicted before inserting {k}",
                    t.name()
                );
            }
            assert_eq!(prog_update(&m, &k.to_ne_bytes(), &v, BPF_ANY, 0), 0);
            assert_eq!(
                m.len(),
                max as usize,
                "{}: LRU stays at max_entries",
                t.name()
            );
        }
        let present = |k: u32| m.lookup(&k.to_ne_bytes()).is_ok();
        assert!((0..16).all(present), "{}: every hot key survives", t.name());
        let cold_left = (16..max).filter(|&k| present(k)).count();
        assert_eq!(
            cold_left,
            (max - 16 - 32) as usize,
            "{}: the 32 evictions hit cold keys",
            t.name()
        );
        assert!((max..max + 32).all(present));
        // NOEXIST on an existing key is still refused; EXIST on a missing key too.
        assert_eq!(
            m.update(&0u32.to_ne_bytes(), &host_v, BPF_NOEXIST)
                .unwrap_err()
                .errno(),
            17
        );
        assert_eq!(
            m.update(&9999u32.to_ne_bytes(), &host_v, BPF_EXIST)
                .unwrap_err()
                .errno(),
            2
        );
    }
}

#[test]
fn hash_full_and_replacement_under_a_long_pin() {
    // A program replacing one key many times under one pin exhausts the spare elements;
    // replacement must keep working (in place), and a full map refuses new keys with E2BIG.
    let m = map("full", MapType::Hash, 8, 8, 4);
    let pin = crossbeam_epoch::pin();
    for k in 0u64..4 {
        assert_eq!(
            prog_update(&m, &k.to_ne_bytes(), &k.to_ne_bytes(), BPF_ANY, 0),
            0
        );
    }
    assert_eq!(
        prog_update(&m, &9u64.to_ne_bytes(), &[0; 8], BPF_ANY, 0),
        E2BIG
    );
    for i in 0u64..2000 {
        assert_eq!(
            prog_update(&m, &1u64.to_ne_bytes(), &i.to_ne_bytes(), BPF_EXIST, 0),
            0
        );
        let (_, v) = prog_lookup(&m, &1u64.to_ne_bytes(), 0, false).unwrap();
        assert_eq!(v, i.to_ne_bytes());
    }
    assert_eq!(m.len(), 4);
    drop(pin);
    // After the pin, deletes and inserts recycle elements again.
    for round in 0u64..50 {
        for k in 0u64..4 {
            m.delete(&k.to_ne_bytes()).unwrap();
        }
        for k in 0u64..4 {
            m.update(&(k + round).to_ne_bytes(), &k.to_ne_bytes(), BPF_NOEXIST)
                .unwrap();
        }
        for k in 0u64..4 {
            m.delete(&(k + round).to_ne_bytes()).unwrap();
        }
        for k in 0u64..4 {
            m.update(&k.to_ne_bytes(), &k.to_ne_bytes(), BPF_NOEXIST)
                .unwrap();
        }
    }
    // for_each: every element once; the value pointer is the element's value.
    let mut n = 0;
    let visited = m.for_each(|k, v| {
        let (p, _) = prog_lookup(&m, k, 0, false).unwrap();
        assert_eq!(p, v as usize);
        n += 1;
        true
    });
    assert_eq!((visited, n), (4, 4));
    let stopped = m.for_each(|_, _| false);
    assert_eq!(
        stopped, 1,
        "the element that stops the walk counts, as in the kernel"
    );
}

#[test]
fn queue_and_stack() {
    for t in [MapType::Queue, MapType::Stack] {
        let m = map("qs", t, 0, 4, 3);
        let fifo = t == MapType::Queue;
        assert_eq!(m.pop().unwrap_err().errno(), 2);
        for i in 1u32..=3 {
            m.push(&i.to_ne_bytes(), BPF_ANY).unwrap();
        }
        assert_eq!(m.push(&4u32.to_ne_bytes(), BPF_ANY).unwrap_err().errno(), 7);
        assert_eq!(prog_push(&m, &4u32.to_ne_bytes(), BPF_NOEXIST), EINVAL);
        // BPF_EXIST on a full map drops the oldest (1), for stacks too.
        assert_eq!(prog_push(&m, &4u32.to_ne_bytes(), BPF_EXIST), 0);
        assert_eq!(m.len(), 3);
        let mut out = [0u8; 4];
        assert_eq!(prog_take(&m, &mut out, false), 0);
        assert_eq!(u32::from_ne_bytes(out), if fifo { 2 } else { 4 });
        assert_eq!(m.lookup(&[]).unwrap(), out.to_vec());
        let order: Vec<u32> = (0..3)
            .map(|_| {
                assert_eq!(prog_take(&m, &mut out, true), 0);
                u32::from_ne_bytes(out)
            })
            .collect();
        assert_eq!(order, if fifo { vec![2, 3, 4] } else { vec![4, 3, 2] });
        assert_eq!(prog_take(&m, &mut out, true), ENOENT);
        assert_eq!(prog_take(&m, &mut out, false), ENOENT);
        assert_eq!(prog_lookup(&m, &[], 0, false), None);
        assert!(m.value_regions().is_empty());
        m.update(&[], &9u32.to_ne_bytes(), BPF_ANY).unwrap();
        assert_eq!(m.pop().unwrap(), 9u32.to_ne_bytes());
    }
}

#[test]
fn prog_array_slots() {
    let m = map("jmp", MapType::ProgArray, 4, 4, 4);
    assert_eq!(m.prog_slot(2), 0);
    assert_eq!(m.set_prog_slot(2, 77).unwrap(), 0);
    assert_eq!(m.set_prog_slot(2, 78).unwrap(), 77);
    assert_eq!(m.prog_slot(2), 78);
    assert_eq!(m.prog_slot(99), 0);
    assert_eq!(m.set_prog_slot(4, 1).unwrap_err().errno(), 7);
    m.delete(&2u32.to_ne_bytes()).unwrap();
    assert_eq!(m.delete(&2u32.to_ne_bytes()).unwrap_err().errno(), 2);
    assert_eq!(m.delete(&9u32.to_ne_bytes()).unwrap_err().errno(), 7);
    assert_eq!(prog_lookup(&m, &0u32.to_ne_bytes(), 0, false), None);
    assert_eq!(m.keys().len(), 4);
    assert!(m.array_layout().is_none());
    let ro = Map::new(MapSpec {
        flags: BPF_F_RDONLY_PROG,
        ..spec("ro", MapType::Array, 4, 4, 2)
    })
    .unwrap();
    assert!(ro.value_regions().iter().all(|r| !r.2));
}

/// `iter_next_raw`, the step of a program's `bpf_for_each_map_elem` over a hash map: every
/// key once in `keys` order with its value, and a walk that deletes each element as it goes
/// still reaches them all (it continues from the deleted element's link, under one pin).
#[test]
fn hash_iteration_steps_visit_every_key_once_even_while_deleting() {
    for t in [
        MapType::Hash,
        MapType::PercpuHash,
        MapType::LruHash,
        MapType::LruPercpuHash,
    ] {
        // 40 keys in 64 buckets: some chains of two or more.
        let m = map("walk", t, 4, 8, 64);
        for k in 0..40u32 {
            let mut v = vec![0u8; m.host_value_size()];
            for c in v.chunks_mut(8) {
                c.copy_from_slice(&(u64::from(k) * 3).to_ne_bytes());
            }
            m.update(&k.to_ne_bytes(), &v, 0).unwrap();
        }
        let walk = |delete: bool| {
            let _pin = crossbeam_epoch::pin();
            let (mut cursor, mut key, mut seen) = (0u64, [0u8; 4], Vec::new());
            loop {
                // SAFETY: 4 writable key bytes; pinned for the whole walk.
                let (v, next) = unsafe { m.iter_next_raw(cursor, key.as_mut_ptr(), 0) };
                if v.is_null() {
                    break;
                }
                let k = u32::from_ne_bytes(key);
                // SAFETY: a value of 8 bytes, valid while pinned.
                assert_eq!(unsafe { v.cast::<u64>().read() }, u64::from(k) * 3, "{t:?}");
                seen.push(key.to_vec());
                if delete {
                    m.delete(&key).unwrap();
                }
                cursor = next;
            }
            seen
        };
        assert_eq!(walk(false), m.keys(), "{t:?}");
        let keys = m.keys();
        assert_eq!(walk(true), keys, "{t:?}: deleting while walking");
        assert!(m.is_empty(), "{t:?}");
        // Other map types have no such walk.
        let a = map("a", MapType::Array, 4, 8, 4);
        // SAFETY: 4 writable bytes.
        let (v, _) = unsafe { a.iter_next_raw(0, [0u8; 4].as_mut_ptr(), 0) };
        assert!(v.is_null());
    }
}
