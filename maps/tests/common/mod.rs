//! Shared helpers of the map tests.
#![allow(dead_code)]

use packjit_maps::{Map, MapSpec, MapType};
use std::sync::Arc;

/// Seeded xorshift64*: deterministic random sequences, seed printed by the tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn seed() -> u64 {
    std::env::var("PACKJIT_MAPS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001)
}

pub fn spec(name: &str, t: MapType, key_size: u32, value_size: u32, max_entries: u32) -> MapSpec {
    MapSpec {
        name: name.into(),
        map_type: t,
        key_size,
        value_size,
        max_entries,
        flags: 0,
    }
}

pub fn map(name: &str, t: MapType, key_size: u32, value_size: u32, max_entries: u32) -> Arc<Map> {
    Map::new(spec(name, t, key_size, value_size, max_entries)).expect("valid spec")
}

// Program-side calls with slices of the map's sizes: the length checks are the helper's
// contract that the raw functions rely on.

fn check(m: &Map, key: &[u8], value: Option<&[u8]>) {
    assert_eq!(key.len(), m.spec().key_size as usize, "key length");
    if let Some(v) = value {
        assert_eq!(v.len(), m.spec().value_size as usize, "value length");
    }
}

/// `bpf_map_update_elem` as a program calls it (pinned).
pub fn prog_update(m: &Map, key: &[u8], value: &[u8], flags: u64, cpu: u32) -> i64 {
    check(m, key, Some(value));
    let _pin = crossbeam_epoch::pin();
    // SAFETY: key and value have the map's key_size and value_size bytes.
    unsafe { m.update_raw(key.as_ptr(), value.as_ptr(), flags, cpu) }
}

/// `bpf_map_delete_elem` as a program calls it.
pub fn prog_delete(m: &Map, key: &[u8]) -> i64 {
    check(m, key, None);
    let _pin = crossbeam_epoch::pin();
    // SAFETY: key has key_size bytes.
    unsafe { m.delete_raw(key.as_ptr()) }
}

/// `bpf_map_lookup_elem` (percpu: `bpf_map_lookup_percpu_elem`): the value's address and a
/// copy of its bytes, read while pinned.
pub fn prog_lookup(m: &Map, key: &[u8], cpu: u32, percpu_elem: bool) -> Option<(usize, Vec<u8>)> {
    check(m, key, None);
    let _pin = crossbeam_epoch::pin();
    // SAFETY: key has key_size bytes; we are pinned while reading the value.
    let p = unsafe {
        if percpu_elem {
            m.lookup_percpu_raw(key.as_ptr(), cpu)
        } else {
            m.lookup_raw(key.as_ptr(), cpu)
        }
    };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null lookup result points to value_size bytes, valid while pinned.
    let v = unsafe { std::slice::from_raw_parts(p, m.spec().value_size as usize) }.to_vec();
    Some((p as usize, v))
}

/// `bpf_map_push_elem`.
pub fn prog_push(m: &Map, value: &[u8], flags: u64) -> i64 {
    check(m, &[], Some(value));
    // SAFETY: value has value_size bytes.
    unsafe { m.push_raw(value.as_ptr(), flags) }
}

/// `bpf_map_pop_elem` (`remove`) or `bpf_map_peek_elem`.
pub fn prog_take(m: &Map, out: &mut [u8], remove: bool) -> i64 {
    check(m, &[], Some(out));
    // SAFETY: out has value_size writable bytes.
    unsafe {
        if remove {
            m.pop_raw(out.as_mut_ptr())
        } else {
            m.peek_raw(out.as_mut_ptr())
        }
    }
}
