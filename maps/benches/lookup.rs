//! Hash lookups with 4- and 8-byte keys against `std::collections::HashMap` using the same
//! hash (one multiply and a fold): the goal is at most 1.5x its time per lookup.
//! Run with `cargo bench -p packjit-maps --bench lookup`.

use packjit_maps::{Map, MapSpec, MapType, BPF_ANY};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::time::Instant;

/// The maps' hash: multiply by the Fibonacci constant, fold the high half down.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("integer keys only")
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = n as u64;
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const N: u64 = 10_000;
const LOOKUPS: u64 = 20_000_000;

fn keys() -> Vec<u64> {
    (0..N)
        .map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 20)
        .collect()
}

fn bench<K: Copy + Eq + std::hash::Hash>(
    name: &str,
    ks: u32,
    conv: fn(u64) -> K,
    bytes: fn(&K) -> Vec<u8>,
) {
    let keys: Vec<K> = keys().into_iter().map(conv).collect();
    let mut std_map: HashMap<K, [u8; 8], BuildHasherDefault<Mix>> = HashMap::default();
    let m = Map::new(MapSpec {
        name: name.into(),
        map_type: MapType::Hash,
        key_size: ks,
        value_size: 8,
        max_entries: N as u32,
        flags: 0,
    })
    .unwrap();
    for k in &keys {
        std_map.insert(*k, [1; 8]);
        m.update(&bytes(k), &[1; 8], BPF_ANY).unwrap();
    }
    let t = Instant::now();
    let mut sum = 0u64;
    for i in 0..LOOKUPS {
        let k = &keys[(i % N) as usize];
        sum += black_box(std_map.get(black_box(k))).map_or(0, |v| v[0] as u64);
    }
    let std_ns = t.elapsed().as_nanos() as f64 / LOOKUPS as f64;
    let _pin = crossbeam_epoch::pin();
    let t = Instant::now();
    for i in 0..LOOKUPS {
        let k = &keys[(i % N) as usize];
        // SAFETY: K is the map's key_size bytes; pinned while the value is read.
        let p = unsafe { m.lookup_raw(black_box(k as *const K).cast(), 0) };
        if !p.is_null() {
            // SAFETY: a non-null value has 8 bytes.
            sum += u64::from(unsafe { p.read() });
        }
    }
    let map_ns = t.elapsed().as_nanos() as f64 / LOOKUPS as f64;
    assert_eq!(sum, 2 * LOOKUPS);
    println!(
        "{name}: std HashMap {std_ns:.2} ns, packjit-maps {map_ns:.2} ns per lookup ({:.2}x)",
        map_ns / std_ns
    );
}

fn main() {
    bench("u32 keys", 4, |k| k as u32, |k| k.to_ne_bytes().to_vec());
    bench("u64 keys", 8, |k| k, |k| k.to_ne_bytes().to_vec());
}
