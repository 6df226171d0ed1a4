//! Maps from Rust: create an array and a hash map, hand them to a program, run it on a few
//! packets, read the maps back.
//!
//! `cargo run -p packjit --example maps` (and `--example ringbuf` for events to the host)
//!
//! The program (hand-assembled below; from C it would be a libbpf-style object, see
//! `tests/bpf/demo_maps.c` and `packjit-demo run ... --maps`) does, for a packet whose first
//! byte is a protocol number:
//!
//! ```c
//! u32 proto = len ? pkt[0] : 0;
//! u64 *n = bpf_map_lookup_elem(&counts, &proto);      // hash: protocol -> packets
//! if (n) __sync_fetch_and_add(n, 1);
//! else   { u64 one = 1; bpf_map_update_elem(&counts, &proto, &one, BPF_ANY); }
//! u32 k = proto & 3;
//! u64 *b = bpf_map_lookup_elem(&bytes, &k);           // array[4]: bytes per class
//! if (b) __sync_fetch_and_add(b, len);
//! return proto;
//! ```

use packjit::maps::{Map, MapSpec, MapType, BPF_ANY};
use packjit::{LoadOptions, Runtime};
use packjit_frontend::encode_insn as i;

/// `lddw dst, map k`: the kernel loader's encoding (`src = BPF_PSEUDO_MAP_FD`, `imm = k`),
/// `k` indexing `LoadOptions::maps`.
fn ld_map(dst: u8, k: i32) -> [[u8; 8]; 2] {
    [i(0x18, dst, 1, 0, k), i(0, 0, 0, 0, 0)]
}

/// Map indices in `LoadOptions::maps`.
const BYTES: i32 = 0;
const COUNTS: i32 = 1;

fn program() -> Vec<u8> {
    let mut p: Vec<[u8; 8]> = vec![
        i(0xbf, 6, 1, 0, 0),   // r6 = r1 (packet)
        i(0xbf, 7, 2, 0, 0),   // r7 = r2 (length)
        i(0xb7, 8, 0, 0, 0),   // r8 = 0 (proto)
        i(0x15, 7, 0, 1, 0),   // if r7 == 0 goto +1
        i(0x71, 8, 6, 0, 0),   // r8 = *(u8 *)(r6 + 0)
        i(0x63, 10, 8, -4, 0), // *(u32 *)(r10 - 4) = r8: the hash key
    ];
    // n = bpf_map_lookup_elem(&counts, &proto)
    p.extend(ld_map(1, COUNTS));
    p.extend([
        i(0xbf, 2, 10, 0, 0), // r2 = r10
        i(0x07, 2, 0, 0, -4), // r2 += -4
        i(0x85, 0, 0, 0, 1),  // call bpf_map_lookup_elem
        i(0x15, 0, 0, 3, 0),  // if r0 == 0 goto insert (+3)
        i(0xb7, 1, 0, 0, 1),  // r1 = 1
        i(0xdb, 0, 1, 0, 0),  // lock *(u64 *)(r0 + 0) += r1
        i(0x05, 0, 0, 9, 0),  // goto array (+9)
        // insert: bpf_map_update_elem(&counts, &proto, &one, BPF_ANY)
        i(0x7a, 10, 0, -16, 1), // *(u64 *)(r10 - 16) = 1
    ]);
    p.extend(ld_map(1, COUNTS));
    p.extend([
        i(0xbf, 2, 10, 0, 0),  // r2 = r10
        i(0x07, 2, 0, 0, -4),  // r2 += -4
        i(0xbf, 3, 10, 0, 0),  // r3 = r10
        i(0x07, 3, 0, 0, -16), // r3 += -16
        i(0xb7, 4, 0, 0, BPF_ANY as i32),
        i(0x85, 0, 0, 0, 2), // call bpf_map_update_elem
        // array: b = bpf_map_lookup_elem(&bytes, &(proto & 3))
        i(0xbf, 1, 8, 0, 0),   // r1 = r8
        i(0x57, 1, 0, 0, 3),   // r1 &= 3
        i(0x63, 10, 1, -8, 0), // *(u32 *)(r10 - 8) = r1
    ]);
    p.extend(ld_map(1, BYTES));
    p.extend([
        i(0xbf, 2, 10, 0, 0), // r2 = r10
        i(0x07, 2, 0, 0, -8), // r2 += -8
        i(0x85, 0, 0, 0, 1),  // call bpf_map_lookup_elem (inlined for arrays)
        i(0x15, 0, 0, 1, 0),  // if r0 == 0 goto +1
        i(0xdb, 0, 7, 0, 0),  // lock *(u64 *)(r0 + 0) += r7
        i(0xbf, 0, 8, 0, 0),  // r0 = r8
        i(0x95, 0, 0, 0, 0),  // exit
    ]);
    p.concat()
}

fn spec(name: &str, map_type: MapType, max_entries: u32) -> MapSpec {
    MapSpec {
        name: name.into(),
        map_type,
        key_size: 4,
        value_size: 8,
        max_entries,
        flags: 0,
    }
}

fn u64_of(v: &[u8]) -> u64 {
    u64::from_le_bytes(v.try_into().expect("8-byte value"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A runtime with the host's backend linked in (cargo feature `backend-<arch>`, on by
    // default; a host could `load_plugins` instead).
    let rt = Runtime::new()?;

    // The maps, created by the host. Both may be shared by several programs and threads.
    let bytes = Map::new(spec("bytes", MapType::Array, 4))?;
    let counts = Map::new(spec("counts", MapType::Hash, 64))?;
    // The host may write them too: start protocol 17's count at 100.
    counts.update(&17u32.to_le_bytes(), &100u64.to_le_bytes(), BPF_ANY)?;

    // Sandboxed load: the program may touch its packet, its stack and the maps' values.
    // `maps[k]` is what `lddw rX, map k` refers to.
    let prog = rt.load(
        &program(),
        &LoadOptions {
            maps: vec![bytes.clone(), counts.clone()],
            ..Default::default()
        },
    )?;

    for packet in [
        &[6u8, 0, 0, 0][..],
        &[17, 0],
        &[6, 1, 2, 3, 4, 5],
        &[1; 9],
        &[],
    ] {
        let mut packet = packet.to_vec();
        let r0 = prog.call(&mut packet)?;
        println!("packet {packet:02x?}: r0 = {r0}");
    }

    // Read them back: the hash in key order, the array by index.
    let mut keys: Vec<u32> = counts
        .keys()
        .iter()
        .map(|k| u32::from_le_bytes(k[..].try_into().expect("4-byte key")))
        .collect();
    keys.sort();
    println!("counts ({} entries):", counts.len());
    for k in keys {
        println!(
            "  proto {k:>3} -> {} packets",
            u64_of(&counts.lookup(&k.to_le_bytes())?)
        );
    }
    println!("bytes:");
    for k in 0..bytes.spec().max_entries {
        println!("  [{k}] -> {}", u64_of(&bytes.lookup(&k.to_le_bytes())?));
    }
    Ok(())
}
