//! A hash map for keys the runtime hands out itself (program ids, chunk indices): nobody
//! outside chooses them, so one multiply spreads them over the table. SipHash, the default,
//! guards against chosen keys, and cost a batch release about 3% of its instructions.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// A map keyed by runtime-chosen integers (see the module doc).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of one integer key.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Keys arrive through `write_u64`/`write_usize`; anything else is folded in a byte
        // at a time.
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }

    fn write_u64(&mut self, key: u64) {
        // The odd constant (2^64 / golden ratio) moves every input bit into the high bits,
        // which hashbrown reads for its control bytes.
        self.0 = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, key: usize) {
        self.write_u64(key as u64);
    }
}
