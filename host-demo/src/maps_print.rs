//! `run PROG.o --maps`: every map of the object after the runs, one block per map in the
//! object's order.
//!
//! ```text
//! map packets: BPF_MAP_TYPE_HASH, key 4 B, value 8 B, max_entries 256: 2 entries
//!   01 00 00 00 (1) -> 02 00 00 00 00 00 00 00 (2)
//!   06 00 00 00 (6) -> 01 00 00 00 00 00 00 00 (1)
//! map next: BPF_MAP_TYPE_PROG_ARRAY, max_entries 2
//!   [0] -> (empty)
//!   [1] -> icmp
//! ```
//!
//! Keys and values are printed as their bytes in memory order, followed by their
//! little-endian value in decimal when they are 1, 2, 4 or 8 bytes. Hash entries are sorted
//! by key (numerically for keys up to 8 bytes), so the output does not depend on hashing.
//! Arrays of up to [`ARRAY_SHOW_ALL`] entries are printed whole; longer ones only their
//! non-zero entries. LPM tries print `address/prefixlen` (dotted for IPv4 keys) in the trie's
//! `next_key` order. Per-CPU values are printed one line per CPU. Ring buffers print the
//! records they hold (consuming them), queues and stacks their values (popping them), prog
//! arrays each slot's program.

use packjit::maps::{Map, MapType};
use std::fmt::Write;

/// Arrays with at most this many entries are printed whole, zeros included.
pub const ARRAY_SHOW_ALL: u32 = 16;

/// Bytes as hex pairs, then ` (N)` for 1/2/4/8-byte little-endian integers.
pub fn hex_int(b: &[u8]) -> String {
    let mut s = hex(b);
    if matches!(b.len(), 1 | 2 | 4 | 8) {
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        let _ = write!(s, " ({})", u64::from_le_bytes(v));
    }
    s
}

/// Bytes as space-separated hex pairs.
pub fn hex(b: &[u8]) -> String {
    let v: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    v.join(" ")
}

/// Key order: numeric for keys up to 8 bytes, else bytewise.
fn key_order(k: &[u8]) -> (u64, Vec<u8>) {
    if k.len() <= 8 {
        let mut v = [0u8; 8];
        v[..k.len()].copy_from_slice(k);
        (u64::from_le_bytes(v), Vec::new())
    } else {
        (0, k.to_vec())
    }
}

/// An LPM trie key as `address/prefixlen`: dotted quad for 4 data bytes (IPv4), hex bytes
/// otherwise; the data's bits past the prefix are printed as stored.
fn prefix(k: &[u8]) -> String {
    let plen = u32::from_ne_bytes(k[..4].try_into().expect("LPM keys have 5..=260 bytes"));
    let data = &k[4..];
    if let [a, b, c, d] = data {
        format!("{a}.{b}.{c}.{d}/{plen}")
    } else {
        format!("{}/{plen}", hex(data))
    }
}

/// A value as lines: one for a plain map, one per CPU for a per-CPU map (each CPU's value
/// is `value_size` bytes at a stride rounded up to 8).
fn value_lines(map: &Map, v: &[u8]) -> Vec<String> {
    let spec = map.spec();
    if !spec.map_type.is_per_cpu() {
        return vec![hex_int(v)];
    }
    let size = spec.value_size as usize;
    let stride = size.div_ceil(8) * 8;
    v.chunks(stride.max(1))
        .enumerate()
        .map(|(cpu, c)| format!("cpu {cpu}: {}", hex_int(&c[..size.min(c.len())])))
        .collect()
}

/// `key -> value` (or per-CPU: the key, then one indented line per CPU).
fn entry(out: &mut String, map: &Map, key: &str, v: &[u8]) {
    let lines = value_lines(map, v);
    if let [one] = lines.as_slice() {
        let _ = writeln!(out, "  {key} -> {one}");
    } else {
        let _ = writeln!(out, "  {key}:");
        for l in lines {
            let _ = writeln!(out, "    {l}");
        }
    }
}

/// One map's block. `slot_name(index)` names the program in a filled prog-array slot.
pub fn format_map(name: &str, map: &Map, slot_name: &dyn Fn(u32) -> Option<String>) -> String {
    let spec = map.spec();
    let t = spec.map_type;
    let mut out = format!("map {name}: {}", t.name());
    match t {
        MapType::RingBuf => {
            let mut records = Vec::new();
            map.ringbuf_consume(&mut |r: &[u8]| records.push(hex(r)));
            let _ = writeln!(
                out,
                ", {} B: {} record(s) consumed",
                spec.max_entries,
                records.len()
            );
            for (i, r) in records.iter().enumerate() {
                let _ = writeln!(out, "  #{i}: {r}");
            }
        }
        MapType::ProgArray => {
            let _ = writeln!(out, ", max_entries {}", spec.max_entries);
            for i in 0..spec.max_entries {
                let what = if map.prog_slot(i) == 0 {
                    "(empty)".to_string()
                } else {
                    slot_name(i).unwrap_or_else(|| "(a program)".into())
                };
                let _ = writeln!(out, "  [{i}] -> {what}");
            }
        }
        MapType::Queue | MapType::Stack => {
            let mut values = Vec::new();
            while let Ok(v) = map.pop() {
                values.push(v);
            }
            let _ = writeln!(
                out,
                ", value {} B, max_entries {}: {} value(s), {}",
                spec.value_size,
                spec.max_entries,
                values.len(),
                if t == MapType::Queue {
                    "oldest first"
                } else {
                    "newest first"
                }
            );
            for v in values {
                let _ = writeln!(out, "  {}", hex_int(&v));
            }
        }
        MapType::Array | MapType::PercpuArray => {
            let _ = writeln!(
                out,
                ", key {} B, value {} B, max_entries {}",
                spec.key_size, spec.value_size, spec.max_entries
            );
            let all = spec.max_entries <= ARRAY_SHOW_ALL;
            let mut zeros = 0u64;
            for i in 0..spec.max_entries {
                let Ok(v) = map.lookup(&i.to_ne_bytes()) else {
                    continue;
                };
                if !all && v.iter().all(|&b| b == 0) {
                    zeros += 1;
                    continue;
                }
                entry(&mut out, map, &format!("[{i}]"), &v);
            }
            if zeros > 0 {
                let _ = writeln!(out, "  ({zeros} all-zero entries not shown)");
            }
        }
        MapType::LpmTrie => {
            // The trie's own order (next_key's postorder): each prefix after the longer
            // prefixes it covers, which is how a reader checks the longest-match picture.
            let keys = map.keys();
            let _ = writeln!(
                out,
                ", key {} B, value {} B, max_entries {}: {} prefixes",
                spec.key_size,
                spec.value_size,
                spec.max_entries,
                keys.len()
            );
            for k in keys {
                if let Ok(v) = map.lookup(&k) {
                    entry(&mut out, map, &prefix(&k), &v);
                }
            }
        }
        MapType::Hash | MapType::PercpuHash | MapType::LruHash | MapType::LruPercpuHash => {
            let mut keys = map.keys();
            keys.sort_by_key(|k| key_order(k));
            let _ = writeln!(
                out,
                ", key {} B, value {} B, max_entries {}: {} entries",
                spec.key_size,
                spec.value_size,
                spec.max_entries,
                keys.len()
            );
            for k in keys {
                // An entry deleted since `keys` (nothing runs now, but be exact) is skipped.
                if let Ok(v) = map.lookup(&k) {
                    entry(&mut out, map, &hex_int(&k), &v);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use packjit::maps::MapSpec;

    fn spec(name: &str, map_type: MapType, key: u32, value: u32, max: u32) -> MapSpec {
        MapSpec {
            name: name.into(),
            map_type,
            key_size: key,
            value_size: value,
            max_entries: max,
            flags: 0,
        }
    }

    #[test]
    fn hash_entries_are_sorted_numerically_with_their_integer_values() {
        let m = Map::new(spec("h", MapType::Hash, 4, 8, 16)).unwrap();
        for (k, v) in [(256u32, 1u64), (2, 7), (17, 3)] {
            m.update(&k.to_le_bytes(), &v.to_le_bytes(), 0).unwrap();
        }
        let s = format_map("h", &m, &|_| None);
        assert_eq!(
            s,
            "map h: BPF_MAP_TYPE_HASH, key 4 B, value 8 B, max_entries 16: 3 entries\n\
             \x20 02 00 00 00 (2) -> 07 00 00 00 00 00 00 00 (7)\n\
             \x20 11 00 00 00 (17) -> 03 00 00 00 00 00 00 00 (3)\n\
             \x20 00 01 00 00 (256) -> 01 00 00 00 00 00 00 00 (1)\n"
        );
    }

    #[test]
    fn lpm_tries_print_their_prefixes_in_trie_order() {
        let mut sp = spec("routes", MapType::LpmTrie, 8, 4, 8);
        sp.flags = packjit::maps::BPF_F_NO_PREALLOC;
        let m = Map::new(sp).unwrap();
        for (plen, a, v) in [(8u32, [10u8, 0, 0, 0], 1u32), (24, [10, 1, 2, 0], 2)] {
            let k = [plen.to_ne_bytes(), a].concat();
            m.update(&k, &v.to_le_bytes(), 0).unwrap();
        }
        let s = format_map("routes", &m, &|_| None);
        assert_eq!(
            s,
            "map routes: BPF_MAP_TYPE_LPM_TRIE, key 8 B, value 4 B, max_entries 8: 2 prefixes\n\
             \x20 10.1.2.0/24 -> 02 00 00 00 (2)\n\
             \x20 10.0.0.0/8 -> 01 00 00 00 (1)\n"
        );
    }

    #[test]
    fn large_arrays_show_non_zero_entries_and_per_cpu_values_one_line_per_cpu() {
        let m = Map::new(spec("a", MapType::Array, 4, 4, 100)).unwrap();
        m.update(&5u32.to_le_bytes(), &9u32.to_le_bytes(), 0)
            .unwrap();
        let s = format_map("a", &m, &|_| None);
        assert!(s.contains("  [5] -> 09 00 00 00 (9)\n"), "{s}");
        assert!(s.contains("(99 all-zero entries not shown)"), "{s}");
        let cpus = Map::possible_cpus();
        let p = Map::new(spec("p", MapType::PercpuArray, 4, 4, 2)).unwrap();
        let mut v = vec![0u8; p.host_value_size()];
        v[..4].copy_from_slice(&3u32.to_le_bytes());
        p.update(&1u32.to_le_bytes(), &v, 0).unwrap();
        let s = format_map("p", &p, &|_| None);
        assert!(s.contains("  [1]:\n    cpu 0: 03 00 00 00 (3)\n"), "{s}");
        assert_eq!(s.matches("    cpu ").count(), 2 * cpus, "{s}");
    }
}
