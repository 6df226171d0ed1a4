//! `BPF_MAP_TYPE_LPM_TRIE` against a brute-force model of the kernel's documented semantics
//! (Documentation/bpf/map_lpm_trie.rst, kernel/bpf/lpm_trie.c): longest-prefix lookups,
//! update flags and errors, exact deletes, `next_key`'s postorder; creation errors; and
//! lookups from many threads while the host updates and deletes.

mod common;

use common::{prog_delete, prog_lookup, prog_update, seed, Rng};
use packjit_maps::{
    errno, Map, MapError, MapSpec, MapType, BPF_ANY, BPF_EXIST, BPF_F_LOCK, BPF_F_NO_PREALLOC,
    BPF_F_RDONLY_PROG, BPF_NOEXIST,
};
use std::cmp::Ordering;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

fn lpm_spec(name: &str, data: u32, value: u32, max: u32) -> MapSpec {
    MapSpec {
        name: name.into(),
        map_type: MapType::LpmTrie,
        key_size: 4 + data,
        value_size: value,
        max_entries: max,
        flags: BPF_F_NO_PREALLOC,
    }
}

fn key(plen: u32, data: &[u8]) -> Vec<u8> {
    let mut k = plen.to_ne_bytes().to_vec();
    k.extend_from_slice(data);
    k
}

fn v4(plen: u32, a: [u8; 4]) -> Vec<u8> {
    key(plen, &a)
}

fn bit(data: &[u8], i: u32) -> u8 {
    (data[i as usize / 8] >> (7 - i % 8)) & 1
}

/// Leading bits of `a` and `b` that agree, at most `limit`.
fn common(a: &[u8], b: &[u8], limit: u32) -> u32 {
    (0..limit)
        .find(|&i| bit(a, i) != bit(b, i))
        .unwrap_or(limit)
}

/// The model: stored prefixes with the full data of the update that stored them.
#[derive(Default)]
struct Model {
    entries: Vec<(u32, Vec<u8>, Vec<u8>)>,
}

impl Model {
    fn find(&self, plen: u32, data: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .position(|(p, d, _)| *p == plen && common(d, data, plen) == plen)
    }

    /// The longest stored prefix of at most the key's length that the key matches.
    fn lookup(&self, plen: u32, data: &[u8]) -> Option<&Vec<u8>> {
        self.entries
            .iter()
            .filter(|(p, d, _)| *p <= plen && common(d, data, *p) == *p)
            .max_by_key(|(p, _, _)| *p)
            .map(|(_, _, v)| v)
    }

    fn update(
        &mut self,
        plen: u32,
        data: &[u8],
        v: &[u8],
        flags: u64,
        bits: u32,
        max: usize,
    ) -> i64 {
        if flags > BPF_EXIST || plen > bits {
            return -(errno::EINVAL as i64);
        }
        match self.find(plen, data) {
            Some(_) if flags == BPF_NOEXIST => -(errno::EEXIST as i64),
            Some(i) => {
                self.entries[i] = (plen, data.to_vec(), v.to_vec());
                0
            }
            None if flags == BPF_EXIST => -(errno::ENOENT as i64),
            None if self.entries.len() == max => -(errno::ENOSPC as i64),
            None => {
                self.entries.push((plen, data.to_vec(), v.to_vec()));
                0
            }
        }
    }

    fn delete(&mut self, plen: u32, data: &[u8], bits: u32) -> i64 {
        if plen > bits {
            return -(errno::EINVAL as i64);
        }
        match self.find(plen, data) {
            Some(i) => {
                self.entries.remove(i);
                0
            }
            None => -(errno::ENOENT as i64),
        }
    }

    /// The kernel's postorder: a prefix after the longer prefixes it covers; otherwise the
    /// one with the 0 bit where they first differ first.
    fn order(a: &(u32, Vec<u8>, Vec<u8>), b: &(u32, Vec<u8>, Vec<u8>)) -> Ordering {
        let limit = a.0.min(b.0);
        let m = common(&a.1, &b.1, limit);
        if m == limit {
            b.0.cmp(&a.0)
        } else {
            bit(&a.1, m).cmp(&bit(&b.1, m))
        }
    }

    fn sorted_keys(&self) -> Vec<Vec<u8>> {
        let mut e: Vec<_> = self.entries.clone();
        e.sort_by(Self::order);
        e.iter().map(|(p, d, _)| key(*p, d)).collect()
    }

    fn next_key(&self, k: Option<(u32, &[u8])>) -> Option<Vec<u8>> {
        let keys = self.sorted_keys();
        let Some((plen, data)) = k else {
            return keys.first().cloned();
        };
        match self.find(plen, data) {
            None => keys.first().cloned(),
            Some(i) => {
                let (p, d, _) = &self.entries[i];
                let at = keys.iter().position(|x| *x == key(*p, d)).unwrap();
                keys.get(at + 1).cloned()
            }
        }
    }
}

/// Random keys that share prefixes often: one of a few bases with its bits past a random
/// point randomised, and a random prefix length (sometimes past the data's bits).
fn random_key(rng: &mut Rng, bases: &[Vec<u8>], bits: u32) -> (u32, Vec<u8>) {
    let mut d = bases[rng.below(bases.len() as u64) as usize].clone();
    let keep = rng.below(bits as u64 + 1) as u32;
    for i in keep..bits {
        if rng.below(2) == 1 {
            d[i as usize / 8] ^= 0x80 >> (i % 8);
        }
    }
    let plen = if rng.below(40) == 0 {
        bits + 1 + rng.below(8) as u32
    } else {
        rng.below(bits as u64 + 1) as u32
    };
    (plen, d)
}

fn differential(data: u32, max: u32, ops: usize, seed: u64) {
    println!("LPM_TRIE: data {data} B, max_entries {max}, seed {seed:#x}");
    let bits = 8 * data;
    let m = Map::new(lpm_spec("lpm", data, 8, max)).unwrap();
    let mut model = Model::default();
    let mut rng = Rng(seed);
    let bases: Vec<Vec<u8>> = (0..3)
        .map(|_| (0..data).map(|_| rng.next_u64() as u8).collect())
        .collect();
    for step in 0..ops {
        let ctx = format!("data {data} seed {seed:#x} step {step}");
        let (plen, d) = random_key(&mut rng, &bases, bits);
        let k = key(plen, &d);
        let program = rng.below(2) == 0;
        match rng.below(10) {
            0..=3 => {
                let flags = [BPF_ANY, BPF_ANY, BPF_NOEXIST, BPF_EXIST, 3, BPF_F_LOCK]
                    [rng.below(6) as usize];
                let v = rng.next_u64().to_ne_bytes();
                let want = model.update(plen, &d, &v, flags, bits, max as usize);
                let got = if program {
                    prog_update(&m, &k, &v, flags, 0)
                } else {
                    m.update(&k, &v, flags)
                        .map_or_else(|e| -(e.errno() as i64), |()| 0)
                };
                assert_eq!(got, want, "update /{plen} flags {flags}: {ctx}");
            }
            4..=5 => {
                let want = model.delete(plen, &d, bits);
                let got = if program {
                    prog_delete(&m, &k)
                } else {
                    m.delete(&k).map_or_else(|e| -(e.errno() as i64), |()| 0)
                };
                assert_eq!(got, want, "delete /{plen}: {ctx}");
            }
            6..=8 => {
                let want = model.lookup(plen, &d).cloned();
                let got = if program {
                    prog_lookup(&m, &k, 0, false).map(|(_, v)| v)
                } else {
                    m.lookup(&k).ok()
                };
                assert_eq!(got, want, "lookup /{plen}: {ctx}");
            }
            _ => {
                let from = (rng.below(4) != 0).then_some((plen, d.as_slice()));
                let want = model.next_key(from);
                let got = m.next_key(from.map(|_| k.as_slice())).ok();
                assert_eq!(got, want, "next_key after /{plen}: {ctx}");
            }
        }
        assert_eq!(m.len(), model.entries.len(), "len: {ctx}");
        if step % 64 == 0 {
            assert_eq!(m.keys(), model.sorted_keys(), "keys: {ctx}");
            // Walking next_key from None visits every key in the same order.
            let mut walk = Vec::new();
            let mut at: Option<Vec<u8>> = None;
            while let Ok(n) = m.next_key(at.as_deref()) {
                walk.push(n.clone());
                at = Some(n);
                assert!(walk.len() <= model.entries.len(), "next_key loops: {ctx}");
            }
            assert_eq!(walk, model.sorted_keys(), "next_key walk: {ctx}");
        }
    }
}

#[test]
fn random_operations_match_the_brute_force_model() {
    let s = seed();
    // Data sizes that take each path of the bit comparison: bytes, a u32 word, a u64 word,
    // words and bytes, IPv6.
    for (i, (data, max)) in [
        (1, 6),
        (2, 12),
        (4, 16),
        (5, 64),
        (8, 24),
        (9, 32),
        (16, 48),
    ]
    .into_iter()
    .enumerate()
    {
        differential(data, max, 4000, s.wrapping_add(i as u64 * 0x9E37_79B9));
    }
}

#[test]
fn ipv4_longest_prefix_and_the_kernel_documentation_example() {
    let m = Map::new(lpm_spec("routes", 4, 8, 16)).unwrap();
    let put = |plen, a: [u8; 4], v: u64| m.update(&v4(plen, a), &v.to_ne_bytes(), BPF_ANY);
    put(16, [192, 168, 0, 0], 16).unwrap();
    put(24, [192, 168, 0, 0], 240).unwrap();
    put(24, [192, 168, 1, 0], 241).unwrap();
    put(24, [192, 168, 128, 0], 2128).unwrap();
    put(0, [0, 0, 0, 0], 1).unwrap();
    let get = |plen, a: [u8; 4]| {
        m.lookup(&v4(plen, a))
            .map(|v| u64::from_ne_bytes(v.try_into().unwrap()))
    };
    assert_eq!(get(32, [192, 168, 0, 7]), Ok(240));
    assert_eq!(get(32, [192, 168, 1, 255]), Ok(241));
    assert_eq!(get(32, [192, 168, 200, 1]), Ok(16));
    assert_eq!(get(32, [10, 1, 1, 1]), Ok(1));
    // The key's own prefix length bounds the match: /20 cannot reach the /24s.
    assert_eq!(get(20, [192, 168, 0, 7]), Ok(16));
    assert_eq!(get(15, [192, 168, 0, 7]), Ok(1));
    // A prefix length past the data's bits is an exact address for lookups.
    assert_eq!(get(40, [192, 168, 1, 1]), Ok(241));
    // The kernel documentation's postorder, then the default route last.
    let order: Vec<Vec<u8>> = m.keys();
    assert_eq!(
        order,
        [
            v4(24, [192, 168, 0, 0]),
            v4(24, [192, 168, 1, 0]),
            v4(24, [192, 168, 128, 0]),
            v4(16, [192, 168, 0, 0]),
            v4(0, [0, 0, 0, 0]),
        ]
    );
    // next_key: unknown key, NULL, and a prefixlen past 32 all give the first.
    for from in [
        None,
        Some(v4(24, [10, 0, 0, 0])),
        Some(v4(33, [192, 168, 0, 0])),
    ] {
        assert_eq!(m.next_key(from.as_deref()).unwrap(), order[0]);
    }
    assert!(matches!(
        m.next_key(Some(&order[4])),
        Err(MapError::NotFound { .. })
    ));
    // Deleting the /16 keeps it as the joint of its subtrees; lookups fall to the /0.
    m.delete(&v4(16, [192, 168, 0, 0])).unwrap();
    assert_eq!(get(32, [192, 168, 200, 1]), Ok(1));
    assert_eq!(get(32, [192, 168, 1, 3]), Ok(241));
    assert!(matches!(
        m.delete(&v4(16, [192, 168, 0, 0])),
        Err(MapError::NotFound { .. })
    ));
    // Only exact prefixes delete.
    assert!(matches!(
        m.delete(&v4(24, [192, 168, 2, 0])),
        Err(MapError::NotFound { .. })
    ));
    assert!(matches!(
        m.delete(&v4(23, [192, 168, 0, 0])),
        Err(MapError::NotFound { .. })
    ));
    assert_eq!(m.len(), 4);
    // next_key returns the data bytes the update gave, bits past the prefix included.
    let empty = Map::new(lpm_spec("e", 4, 8, 4)).unwrap();
    assert!(matches!(
        empty.next_key(None),
        Err(MapError::NotFound { .. })
    ));
    empty
        .update(&v4(8, [10, 1, 2, 3]), &[0; 8], BPF_ANY)
        .unwrap();
    assert_eq!(empty.next_key(None).unwrap(), v4(8, [10, 1, 2, 3]));
    assert_eq!(empty.lookup(&v4(32, [10, 9, 9, 9])).unwrap(), [0; 8]);
}

#[test]
fn update_and_delete_errors_are_the_kernels() {
    let m = Map::new(lpm_spec("t", 4, 8, 2)).unwrap();
    let v = 7u64.to_ne_bytes();
    let code = |r: Result<(), MapError>| r.map_or_else(|e| e.errno(), |()| 0);
    // Prefix length above 32: EINVAL for update and delete.
    assert_eq!(
        code(m.update(&v4(33, [1, 2, 3, 4]), &v, BPF_ANY)),
        errno::EINVAL
    );
    assert_eq!(code(m.delete(&v4(33, [1, 2, 3, 4]))), errno::EINVAL);
    // Flags above BPF_EXIST (BPF_F_LOCK included): EINVAL.
    assert_eq!(code(m.update(&v4(8, [1, 0, 0, 0]), &v, 3)), errno::EINVAL);
    assert_eq!(
        code(m.update(&v4(8, [1, 0, 0, 0]), &v, BPF_F_LOCK)),
        errno::EINVAL
    );
    assert_eq!(
        code(m.update(&v4(8, [1, 0, 0, 0]), &v, BPF_EXIST)),
        errno::ENOENT
    );
    assert_eq!(code(m.update(&v4(8, [1, 0, 0, 0]), &v, BPF_NOEXIST)), 0);
    assert_eq!(
        code(m.update(&v4(8, [1, 9, 9, 9]), &v, BPF_NOEXIST)),
        errno::EEXIST
    );
    assert_eq!(code(m.update(&v4(8, [1, 0, 0, 0]), &v, BPF_EXIST)), 0);
    assert_eq!(code(m.update(&v4(16, [1, 2, 0, 0]), &v, BPF_ANY)), 0);
    // Full: a new prefix gets ENOSPC (from programs and the host), a replacement succeeds.
    let full = m.update(&v4(24, [1, 2, 3, 0]), &v, BPF_ANY).unwrap_err();
    assert!(matches!(full, MapError::NoSpace { .. }), "{full}");
    assert_eq!(full.errno(), errno::ENOSPC);
    assert!(full.to_string().contains("`t`"), "{full}");
    assert_eq!(
        prog_update(&m, &v4(24, [1, 2, 3, 0]), &v, BPF_ANY, 0),
        -(errno::ENOSPC as i64)
    );
    assert_eq!(
        code(m.update(&v4(16, [1, 2, 0, 0]), &9u64.to_ne_bytes(), BPF_ANY)),
        0
    );
    assert_eq!(m.lookup(&v4(32, [1, 2, 3, 4])).unwrap(), 9u64.to_ne_bytes());
    // Turned intermediate by a delete (two children), the prefix counts as new again.
    let t = Map::new(lpm_spec("im", 4, 8, 3)).unwrap();
    for (p, a) in [
        (8, [10, 0, 0, 0]),
        (16, [10, 0, 0, 0]),
        (16, [10, 128, 0, 0]),
    ] {
        t.update(&v4(p, a), &v, BPF_ANY).unwrap();
    }
    t.delete(&v4(8, [10, 0, 0, 0])).unwrap();
    assert_eq!(
        code(t.update(&v4(8, [10, 0, 0, 0]), &v, BPF_EXIST)),
        errno::ENOENT
    );
    assert_eq!(code(t.update(&v4(8, [10, 0, 0, 0]), &v, BPF_NOEXIST)), 0);
    assert_eq!(t.len(), 3);
    // Programs: lookups in a map without a match get NULL, their deletes ENOENT.
    assert_eq!(prog_lookup(&t, &v4(32, [11, 0, 0, 0]), 0, false), None);
    assert_eq!(
        prog_delete(&t, &v4(8, [11, 0, 0, 0])),
        -(errno::ENOENT as i64)
    );
    // lookup_percpu, push/pop: not for tries.
    assert_eq!(prog_lookup(&t, &v4(32, [10, 0, 0, 1]), 0, true), None);
    assert!(matches!(t.pop(), Err(MapError::NotSupported { .. })));
}

#[test]
fn creation_is_refused_as_the_kernel_refuses_it() {
    let cases: [(MapSpec, &str); 7] = [
        (
            MapSpec {
                flags: 0,
                ..lpm_spec("prealloc", 4, 8, 4)
            },
            "BPF_F_NO_PREALLOC",
        ),
        (lpm_spec("k4", 0, 8, 4), "key_size"),
        (lpm_spec("k261", 257, 8, 4), "key_size"),
        (lpm_spec("v0", 4, 0, 4), "value_size"),
        (lpm_spec("vbig", 4, (1 << 20) + 1, 4), "value_size"),
        (lpm_spec("m0", 4, 8, 0), "max_entries"),
        (
            MapSpec {
                flags: BPF_F_NO_PREALLOC | 2,
                ..lpm_spec("f", 4, 8, 4)
            },
            "flags",
        ),
    ];
    for (spec, what) in cases {
        let name = spec.name.clone();
        let e = Map::new(spec).unwrap_err();
        assert_eq!(e.errno(), errno::EINVAL, "{name}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("`{name}`")) && text.contains(what),
            "{text}"
        );
    }
    // The extremes of the data size, and the read-only flag, are accepted.
    for data in [1, 256] {
        let m = Map::new(lpm_spec("ok", data, 1, 1)).unwrap();
        assert_eq!(m.spec().map_type.name(), "BPF_MAP_TYPE_LPM_TRIE");
        assert_eq!(MapType::from_raw(11), Some(MapType::LpmTrie));
    }
    let ro = Map::new(MapSpec {
        flags: BPF_F_NO_PREALLOC | BPF_F_RDONLY_PROG,
        ..lpm_spec("ro", 4, 8, 4)
    })
    .unwrap();
    assert!(ro.value_regions().iter().all(|&(_, _, w)| !w));
}

#[test]
fn value_pointers_point_into_the_value_region_and_survive_replacement_while_pinned() {
    let m = Map::new(lpm_spec("pin", 4, 16, 4)).unwrap();
    m.update(&v4(8, [10, 0, 0, 0]), &[1; 16], BPF_ANY).unwrap();
    let regions = m.value_regions();
    assert_eq!(regions.len(), 1);
    let (start, len, writable) = regions[0];
    assert!(writable);
    let guard = crossbeam_epoch::pin();
    // SAFETY: 8 readable key bytes; pinned while the pointer is used.
    let p = unsafe { m.lookup_raw(v4(32, [10, 1, 2, 3]).as_ptr(), 0) };
    assert!(!p.is_null());
    assert!((start as usize..start as usize + len).contains(&(p as usize)));
    assert!(p as usize + 16 <= start as usize + len);
    // The host replaces and deletes the prefix; the program's pointer still reads the old
    // value until its pin ends.
    m.update(&v4(8, [10, 0, 0, 0]), &[2; 16], BPF_ANY).unwrap();
    m.delete(&v4(8, [10, 0, 0, 0])).unwrap();
    for _ in 0..64 {
        m.update(&v4(32, [1, 1, 1, 1]), &[3; 16], BPF_ANY).unwrap();
        m.delete(&v4(32, [1, 1, 1, 1])).unwrap();
    }
    // SAFETY: still pinned: the slot has not been reused.
    assert_eq!(unsafe { std::slice::from_raw_parts(p, 16) }, [1; 16]);
    drop(guard);
    assert!(m.lookup(&v4(32, [10, 1, 2, 3])).is_err());
}

/// Readers look up addresses under a fixed /8 while the host adds, replaces and deletes
/// longer prefixes below it: every lookup finds a prefix that matches the address (the /8
/// at worst), with a value that is whole (both halves name the same prefix).
#[test]
fn lookups_race_host_updates_and_deletes() {
    let s = seed();
    println!("LPM_TRIE stress: seed {s:#x}");
    let m = Map::new(lpm_spec("race", 4, 16, 512)).unwrap();
    let value = |plen: u32, a: [u8; 4]| {
        let w = (u64::from(plen) << 32) | u64::from(u32::from_be_bytes(a));
        [w.to_ne_bytes(), w.to_ne_bytes()].concat()
    };
    m.update(&v4(8, [10, 0, 0, 0]), &value(8, [10, 0, 0, 0]), BPF_ANY)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let looked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..3)
        .map(|t| {
            let (m, stop, looked) = (Arc::clone(&m), Arc::clone(&stop), Arc::clone(&looked));
            std::thread::spawn(move || {
                let mut rng = Rng(s ^ ((t + 1) * 0x1234_5678));
                while !stop.load(Relaxed) {
                    let a = [
                        10,
                        rng.below(4) as u8,
                        rng.below(256) as u8,
                        rng.next_u64() as u8,
                    ];
                    let (_, v) = prog_lookup(&m, &v4(32, a), 0, false)
                        .unwrap_or_else(|| panic!("no match for {a:?} (seed {s:#x})"));
                    let w = u64::from_ne_bytes(v[..8].try_into().unwrap());
                    assert_eq!(v[..8], v[8..], "torn value for {a:?} (seed {s:#x})");
                    let plen = (w >> 32) as u32;
                    let net = (w as u32).to_be_bytes();
                    assert!((8..=32).contains(&plen), "{a:?}: /{plen}");
                    assert_eq!(
                        common(&net, &a, plen),
                        plen,
                        "{a:?} got {net:?}/{plen} (seed {s:#x})"
                    );
                    looked.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();
    let mut rng = Rng(s);
    let mut model = Model::default();
    for step in 0..20_000 {
        let plen = 9 + rng.below(24) as u32;
        let mut a = [
            10,
            rng.below(4) as u8,
            rng.below(256) as u8,
            rng.next_u64() as u8,
        ];
        // Canonical network address, so the value names exactly the stored prefix.
        let mask = u32::MAX << (32 - plen);
        a = (u32::from_be_bytes(a) & mask).to_be_bytes();
        if rng.below(3) == 0 {
            let want = model.delete(plen, &a, 32);
            let got = m
                .delete(&v4(plen, a))
                .map_or_else(|e| -(e.errno() as i64), |()| 0);
            assert_eq!(got, want, "delete step {step} (seed {s:#x})");
        } else {
            let v = value(plen, a);
            let want = model.update(plen, &a, &v, BPF_ANY, 32, 511);
            let got = m
                .update(&v4(plen, a), &v, BPF_ANY)
                .map_or_else(|e| -(e.errno() as i64), |()| 0);
            assert_eq!(got, want, "update step {step} (seed {s:#x})");
        }
    }
    stop.store(true, Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert!(looked.load(Relaxed) > 0);
    assert_eq!(m.len(), model.entries.len() + 1);
    // After the race, every lookup agrees with the model (plus the /8).
    model
        .entries
        .push((8, vec![10, 0, 0, 0], value(8, [10, 0, 0, 0])));
    for _ in 0..2000 {
        let a = [
            10,
            rng.below(4) as u8,
            rng.below(256) as u8,
            rng.next_u64() as u8,
        ];
        assert_eq!(
            m.lookup(&v4(32, a)).ok().as_ref(),
            model.lookup(32, &a),
            "{a:?} (seed {s:#x})"
        );
    }
}
