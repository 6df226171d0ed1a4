//! `BPF_MAP_TYPE_HASH`, `PERCPU_HASH`, `LRU_HASH` and `LRU_PERCPU_HASH`.
//!
//! Layout (all preallocated, as the kernel's default):
//! * `buckets`: one 64-byte line per bucket (a power of two >= `max_entries / 2`), holding
//!   [`SLOTS`] elements inline as a key word and a link each, and the head of an overflow
//!   chain for the rare bucket that holds more. The key word is the key itself for keys of
//!   up to 8 bytes (zero-extended), so a lookup of such a key reads one bucket line, then
//!   the value: one cache miss before the value's, as a Swiss table's group and entry.
//!   Longer keys store their 64-bit hash there and compare the key in the element's node.
//! * `nodes`: per element `[next: u32 | hash: u32 | key, padded to 8]`: the overflow chain's
//!   link, the hash (the LRU sweep finds an element's bucket from it) and the key (for
//!   iteration, and the compare of long keys and chained elements).
//! * `values`: the value slab, per CPU for per-CPU maps (`[cpu][element]`), apart from all
//!   bookkeeping: it is the only memory a program reaches through a value pointer. Its
//!   first slot is padding no element uses, so element `i`'s value (CPU 0's) is slot
//!   `i + 1`, the element's link: the word lookup ([`WordLookup`]) goes from a link to its
//!   value with one multiply-add, and a link of 0 (seen under misspeculation) still
//!   addresses zeroed memory of the map's own, never the memory before the slab.
//! * a lock-free free list (Treiber stack with a generation tag against ABA) of element
//!   indices; `pool = max_entries + spare` elements, so an update that replaces an element
//!   finds a free one while the old copies wait out their grace period.
//!
//! Links (slots, chain heads, `next`) hold element index + 1, 0 for none, so zeroed memory
//! is an empty table.
//!
//! Lookups take no lock. Writers serialise per bucket on striped spin locks. An element is
//! filled while free, then published by a Release store of the link that points to it;
//! lookups load links with Acquire. A slot's key word changes only while its link is 0, and
//! an element leaves its slot or chain for good (it returns to the free list only after a
//! crossbeam-epoch grace period, which a pinned reader holds back), so a reader that loads
//! a slot's link, then its key word, then the same link again knows the word belongs to that
//! element; a changed link (a replacement) makes it read the slot again. A reader pinned on
//! the default collector never sees an element reused under it; a value pointer a program
//! got stays valid (and unchanged, except by programs) until the program's pin ends.
//!
//! A program's lookup of a 4- or 8-byte key in a HASH or LRU_HASH goes through a copy of
//! the few fields it needs kept in the [`Map`](crate::Map) itself ([`WordLookup`]): the
//! key's hash, one bucket line, its words compared, the validation above and the value
//! address, with nothing else on the way (no pointer to the table, no register saves);
//! anything rarer (a chain, a slot replaced while read) goes out of line to [`HashTable`].

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

use crate::error::errno::{E2BIG, EEXIST, EINVAL, ENOENT, ENOMEM};
use crate::grace;
use crate::mem::{atomic_u32s, bytes, round8, AllocError, Slab, SpinLock};
use crate::{BPF_EXIST, BPF_F_LOCK, BPF_NOEXIST};

/// "No element", as `find` returns it and in the free list.
const NIL: u32 = u32::MAX;

/// Elements held inline in a bucket line.
pub(crate) const SLOTS: usize = 5;

/// One bucket: a cache line. Slot `s` holds the link `slots[s]` (element + 1, 0 when the
/// slot is empty) and, while the link is not 0, that element's key word `words[s]`; `chain`
/// links the overflow elements through their nodes' `next`.
#[repr(C, align(64))]
struct Bucket {
    words: [AtomicU64; SLOTS],
    slots: [AtomicU32; SLOTS],
    chain: AtomicU32,
}

/// Where a key's element is linked, found under its bucket's lock.
enum Loc<'a> {
    /// Inline, in this slot of the bucket.
    Slot(usize),
    /// In the overflow chain: this link (the bucket's `chain` or a node's `next`) points at
    /// it; for a key not found, the link at the end of the chain.
    Chain(&'a AtomicU32),
}

// Element states. Only LIVE is relied on (as a hint) by the LRU sweep; the chain itself,
// walked under the bucket lock, is the truth.
const FREE: u8 = 0;
const FILLING: u8 = 1;
const LIVE: u8 = 2;
const RETIRED: u8 = 3;

/// Unlinked elements are handed to the epoch collector in batches of this size (one
/// deferred closure and one flush per batch instead of per element).
const RETIRE_BATCH: usize = 8;

/// How long a host update waits for elements to come back from their grace period before
/// it reports the map full.
const HOST_RECLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Fibonacci-hashing multiplier (2^64 / golden ratio), odd.
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// One multiply and a fold of the high half into the low one: the product's high bits
/// depend on every input bit, and the fold brings them to the low bits the bucket mask
/// keeps. Two instructions on top of the load for the 4- and 8-byte keys that dominate
/// eBPF maps (pids, addresses, ifindexes). Not collision-resistant against chosen keys
/// (the kernel's jhash with a random seed is not either); a per-map random seed keeps
/// bucket choice different between maps and runs.
#[inline(always)]
fn mix(x: u64) -> u64 {
    let h = x.wrapping_mul(K);
    h ^ (h >> 32)
}

pub(crate) struct HashTable {
    key_size: usize,
    value_size: usize,
    /// Bytes per node: 8 (next, hash) + key rounded up to 8.
    nstride: usize,
    vstride: usize,
    max_entries: usize,
    pool: usize,
    cpus: usize,
    percpu: bool,
    lru: bool,
    seed: u64,
    mask: usize,
    /// `nbuckets` [`Bucket`]s, 64-byte aligned.
    buckets: Slab,
    nbuckets: usize,
    locks: Box<[SpinLock]>,
    nodes: Slab,
    values: Slab,
    state: Box<[AtomicU8]>,
    /// LRU "referenced" bits (empty for non-LRU maps), set by lookups, cleared by the sweep.
    refbit: Box<[AtomicU8]>,
    /// Free-list head: generation tag << 32 | index.
    free_head: AtomicU64,
    free_next: Box<[AtomicU32]>,
    /// Elements never used yet are `[unused, pool)`: handed out by bumping this, after the
    /// free list, so the slabs' pages (zeroed lazily by the allocator's mmap) are touched
    /// only as far as the map ever needed.
    unused: AtomicUsize,
    count: AtomicUsize,
    retired: Mutex<Vec<u32>>,
    /// The LRU CLOCK hand; its mutex is the eviction lock.
    clock: Mutex<usize>,
}

/// What a program's lookup of a word key (4 or 8 bytes) in a shared-value table reads of
/// it, copied into the [`Map`](crate::Map) when the table is made: the map handle a
/// program passes is then all the lookup needs, with no load of a pointer to the table on
/// the way to the bucket. A cache line of its own: one miss at most, and no false sharing
/// with the map fields writers touch.
///
/// The pointers are the table's slabs, which live (and never move) as long as the map.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct WordLookup {
    seed: u64,
    buckets: *const Bucket,
    mask: usize,
    /// The value slab: the value of the element a link `l` names is at `l * vstride`.
    values: *mut u8,
    vstride: usize,
    /// The LRU referenced bits; null for a table without.
    refbit: *const AtomicU8,
}

// SAFETY: the pointers are into slabs that are Send + Sync (see `Slab`), accessed as the
// table's own code accesses them.
unsafe impl Send for WordLookup {}
// SAFETY: as for Send.
unsafe impl Sync for WordLookup {}

impl WordLookup {
    /// The copy of a map that is no word-keyed hash: never used for a lookup.
    pub(crate) const NONE: WordLookup = WordLookup {
        seed: 0,
        buckets: std::ptr::null(),
        mask: 0,
        values: std::ptr::null_mut(),
        vstride: 0,
        refbit: std::ptr::null(),
    };

    /// [`HashTable::lookup_shared_word`] on the table this was copied from, for the
    /// common cases: a key found in a bucket slot whose validation holds at the first
    /// try, or a key absent from a bucket without a chain. Anything else is `slow()`'s
    /// (the table's own lookup), out of line.
    ///
    /// Every address it returns is null or inside the value slab, for any link a slot
    /// may hold (`0..=pool`): a program that mispredicts its NULL test, or a lookup that
    /// mispredicts a compare here, touches at worst another value or the padding slot.
    ///
    /// # Safety
    /// As [`HashTable::lookup_shared_word`] on the table this was copied from (which
    /// must still be alive), with `size_of::<W>() == key_size`, `!percpu`.
    #[inline(always)]
    pub unsafe fn lookup<W: Copy + Eq + Into<u64>>(
        &self,
        key: *const u8,
        slow: impl FnOnce() -> *mut u8,
    ) -> *mut u8 {
        // SAFETY: key_size == size_of::<W>() readable bytes.
        let word: u64 = unsafe { key.cast::<W>().read_unaligned() }.into();
        let h = mix(word ^ self.seed);
        // SAFETY: the index is masked to the table's bucket count; the slab holds that
        // many zeroed (valid) Buckets and outlives the map.
        let b = unsafe { &*self.buckets.add(h as u32 as usize & self.mask) };
        for s in 0..SLOTS {
            // Relaxed: a filter; the validation orders what it relies on. A branch per
            // slot, not a mask of all five compares: predicted, it lets the loads of the
            // link and the value start before the word has arrived.
            if b.words[s].load(Relaxed) == word {
                // The validation of `slot_match` (link, word, same link), its loads from
                // the line just read. Acquire (link): the element's value and the word
                // stored before the link; Acquire (word): orders the link's second load
                // after it.
                let l = b.slots[s].load(Acquire);
                let w = b.words[s].load(Acquire);
                let again = b.slots[s].load(Relaxed);
                if (l != 0) & (w == word) {
                    if again != l {
                        // Replaced between the loads (same key, a fresh element).
                        return slow();
                    }
                    if !self.refbit.is_null() {
                        // SAFETY: l - 1 < pool, the LRU table's refbit length.
                        let r = unsafe { &*self.refbit.add(l as usize - 1) };
                        // As `HashTable::referenced`.
                        if r.load(Relaxed) == 0 {
                            r.store(1, Relaxed);
                        }
                    }
                    // SAFETY: l <= pool: inside the slab of pool + 1 slots.
                    return unsafe { self.values.add(l as usize * self.vstride) };
                }
                // An empty slot that kept a stale word, or one refilled meanwhile with
                // another key: as `slot_match`, the next slots.
            }
        }
        if b.chain.load(Relaxed) == 0 {
            return std::ptr::null_mut();
        }
        slow()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HashTable {
    pub fn new(
        name: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        percpu: bool,
        lru: bool,
        cpus: usize,
    ) -> Result<HashTable, AllocError> {
        let max = max_entries as usize;
        let cpus = if percpu { cpus } else { 1 };
        // Spares for the elements that wait out their grace period after a replacement, a
        // delete or an eviction (the kernel, which reuses elements at once, keeps one extra
        // per CPU). Churn from several CPUs can retire many elements per epoch, so small
        // values get a generous pool; large ones (>= 64 KiB per element) a few per CPU.
        let ncpu = crate::Map::possible_cpus();
        let elem_bytes = round8(value_size as usize) * cpus;
        let spare = if elem_bytes >= 64 << 10 {
            (2 * ncpu).max(8)
        } else {
            (16 * ncpu).max(256)
        } + RETIRE_BATCH;
        let pool = max + spare;
        // Two elements per bucket on average when full: a bucket overflows its SLOTS
        // inline elements rarely (about 1% of elements end up in chains).
        let nbuckets = max.div_ceil(2).next_power_of_two();
        let nlocks = nbuckets.min(1024);
        let nstride = 8 + round8(key_size as usize);
        let vstride = round8(value_size as usize);
        // Large tables in huge pages (see `Slab::zeroed_huge`): lookups read them at random.
        let nodes = Slab::zeroed_huge(bytes(pool, nstride)?, 8)?;
        // One slot more: the padding slot 0 (see the module doc).
        let values = Slab::zeroed_huge(bytes(bytes(pool, cpus)? + 1, vstride)?, 8)?;
        let free_next = atomic_u32s(pool, NIL)?;
        let mut state = Vec::new();
        state
            .try_reserve_exact(pool)
            .map_err(|_| AllocError { bytes: pool as u64 })?;
        state.resize_with(pool, || AtomicU8::new(FREE));
        let mut refbit = Vec::new();
        if lru {
            refbit
                .try_reserve_exact(pool)
                .map_err(|_| AllocError { bytes: pool as u64 })?;
            refbit.resize_with(pool, || AtomicU8::new(0));
        }
        let seed = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(name)
        };
        Ok(HashTable {
            key_size: key_size as usize,
            value_size: value_size as usize,
            nstride,
            vstride,
            max_entries: max,
            pool,
            cpus,
            percpu,
            lru,
            seed,
            mask: nbuckets - 1,
            buckets: Slab::zeroed_huge(
                bytes(nbuckets, std::mem::size_of::<Bucket>())?,
                std::mem::align_of::<Bucket>(),
            )?,
            nbuckets,
            locks: (0..nlocks).map(|_| SpinLock::new()).collect(),
            nodes,
            values,
            state: state.into_boxed_slice(),
            refbit: refbit.into_boxed_slice(),
            free_head: AtomicU64::new(NIL as u64),
            free_next,
            unused: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            retired: Mutex::new(Vec::new()),
            clock: Mutex::new(0),
        })
    }

    /// The values programs may reach: the slab without its padding slot.
    pub fn values_region(&self) -> (*mut u8, usize) {
        // SAFETY: the slab has at least the padding slot's vstride bytes.
        let first = unsafe { self.values.ptr().add(self.vstride) };
        (first, self.values.len() - self.vstride)
    }

    /// The word lookup's copy of this table's fields (see [`WordLookup`]).
    pub fn word_lookup(&self) -> WordLookup {
        WordLookup {
            seed: self.seed,
            buckets: self.buckets.ptr().cast(),
            mask: self.mask,
            values: self.values.ptr(),
            vstride: self.vstride,
            refbit: if self.lru {
                self.refbit.as_ptr()
            } else {
                std::ptr::null()
            },
        }
    }

    pub fn len(&self) -> usize {
        self.count.load(Relaxed)
    }

    // ---- element access -------------------------------------------------------------

    #[inline(always)]
    fn node(&self, i: u32) -> *mut u8 {
        debug_assert!((i as usize) < self.pool);
        // SAFETY: every index stored in a link or the free list is < pool.
        unsafe { self.nodes.ptr().add(i as usize * self.nstride) }
    }

    #[inline(always)]
    fn next(&self, i: u32) -> &AtomicU32 {
        // SAFETY: the node's first 4 bytes are 8-aligned, live as long as self, and are only
        // ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.node(i).cast()) }
    }

    #[inline(always)]
    fn hash_of(&self, i: u32) -> &AtomicU32 {
        // SAFETY: as in `next`, for bytes 4..8 of the node.
        unsafe { AtomicU32::from_ptr(self.node(i).add(4).cast()) }
    }

    #[inline(always)]
    fn key_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: the key follows the 8-byte link header inside the node.
        unsafe { self.node(i).add(8) }
    }

    #[inline(always)]
    fn value_ptr(&self, i: u32, cpu: usize) -> *mut u8 {
        debug_assert!(cpu < self.cpus);
        // SAFETY: (cpu, i) < (cpus, pool): inside the value slab, after its padding slot.
        unsafe {
            self.values
                .ptr()
                .add((cpu * self.pool + i as usize + 1) * self.vstride)
        }
    }

    #[inline(always)]
    fn bucket_of(&self, h: u64) -> usize {
        h as u32 as usize & self.mask
    }

    /// # Safety
    /// `key` points to key_size readable bytes.
    #[inline(always)]
    unsafe fn hash_key(&self, key: *const u8) -> u64 {
        // SAFETY: (all reads) the caller guarantees key_size readable bytes.
        unsafe {
            match self.key_size {
                4 => mix(key.cast::<u32>().read_unaligned() as u64 ^ self.seed),
                8 => mix(key.cast::<u64>().read_unaligned() ^ self.seed),
                n => {
                    let mut h = self.seed ^ n as u64;
                    let mut off = 0;
                    while off + 8 <= n {
                        h = mix(h ^ key.add(off).cast::<u64>().read_unaligned());
                        off += 8;
                    }
                    if off < n {
                        let mut tail = [0u8; 8];
                        std::ptr::copy_nonoverlapping(key.add(off), tail.as_mut_ptr(), n - off);
                        h = mix(h ^ u64::from_le_bytes(tail));
                    }
                    h
                }
            }
        }
    }

    /// # Safety
    /// `key` points to key_size readable bytes; element `i` is reachable from a chain the
    /// caller walks under an epoch pin, inside a registered run, or under the bucket lock (so its key is not being written).
    #[inline(always)]
    unsafe fn key_eq(&self, i: u32, key: *const u8, h: u64) -> bool {
        let k = self.key_ptr(i);
        // SAFETY: both point to key_size readable bytes (the node's key is 8-aligned).
        unsafe {
            match self.key_size {
                4 => k.cast::<u32>().read() == key.cast::<u32>().read_unaligned(),
                8 => k.cast::<u64>().read() == key.cast::<u64>().read_unaligned(),
                n => {
                    self.hash_of(i).load(Relaxed) == h as u32
                        && std::slice::from_raw_parts(k, n) == std::slice::from_raw_parts(key, n)
                }
            }
        }
    }

    #[inline(always)]
    fn bucket(&self, b: usize) -> &Bucket {
        debug_assert!(b < self.nbuckets);
        // SAFETY: b < nbuckets (callers mask or bound it); the slab holds nbuckets zeroed,
        // 64-aligned Buckets (all-zero atomics are valid), alive as long as self.
        unsafe { &*self.buckets.ptr().cast::<Bucket>().add(b) }
    }

    /// The word a bucket slot holds for this key: the key zero-extended (keys of up to 8
    /// bytes), else its hash.
    ///
    /// # Safety
    /// `key` points to key_size readable bytes.
    #[inline(always)]
    unsafe fn key_word(&self, key: *const u8, h: u64) -> u64 {
        // SAFETY: key_size readable bytes.
        unsafe {
            match self.key_size {
                4 => key.cast::<u32>().read_unaligned() as u64,
                8 => key.cast::<u64>().read_unaligned(),
                n if n < 8 => {
                    let mut w = [0u8; 8];
                    std::ptr::copy_nonoverlapping(key, w.as_mut_ptr(), n);
                    u64::from_ne_bytes(w)
                }
                _ => h,
            }
        }
    }

    /// Slot `s` of `b`, whose word was seen equal to `word`: its element if it holds the
    /// key, validated as the module doc says (link, word, same link again); `None` if the
    /// slot is empty or holds another key.
    ///
    /// # Safety
    /// As `find`.
    #[inline(always)]
    unsafe fn slot_match(
        &self,
        b: &Bucket,
        s: usize,
        word: u64,
        key: *const u8,
        h: u64,
    ) -> Option<u32> {
        loop {
            // Acquire: the element's node and value, and the word stored before the link.
            let l = b.slots[s].load(Acquire);
            // Acquire: orders the link's second load after the word's.
            if l == 0 || b.words[s].load(Acquire) != word {
                return None;
            }
            if b.slots[s].load(Relaxed) == l {
                let i = l - 1;
                // Long keys: the word is the hash; the node has the key (immutable while
                // the pin holds the element).
                // SAFETY: forwarded from the caller; i is published.
                let same = self.key_size <= 8 || unsafe { self.key_eq(i, key, h) };
                return same.then_some(i);
            }
            // Replaced meanwhile (same key, a fresh element): read the slot again.
        }
    }

    /// The overflow chain of `b`: the element with the key, or NIL.
    ///
    /// # Safety
    /// As `find`.
    #[inline(never)]
    unsafe fn find_chained(&self, b: &Bucket, key: *const u8, h: u64) -> u32 {
        let mut l = b.chain.load(Acquire);
        while l != 0 {
            let i = l - 1;
            // SAFETY: forwarded from the caller; i was published by a Release link store.
            if unsafe { self.key_eq(i, key, h) } {
                return i;
            }
            l = self.next(i).load(Acquire);
        }
        NIL
    }

    /// Lock-free lookup: the bucket's slots, then its overflow chain.
    ///
    /// # Safety
    /// As `key_eq`; the caller is pinned on the default epoch collector.
    #[inline(always)]
    unsafe fn find(&self, key: *const u8, h: u64) -> u32 {
        let b = self.bucket(self.bucket_of(h));
        // SAFETY: forwarded from the caller.
        let word = unsafe { self.key_word(key, h) };
        for s in 0..SLOTS {
            if b.words[s].load(Relaxed) == word {
                // SAFETY: forwarded from the caller.
                if let Some(i) = unsafe { self.slot_match(b, s, word, key, h) } {
                    return i;
                }
            }
        }
        if b.chain.load(Relaxed) == 0 {
            return NIL;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.find_chained(b, key, h) }
    }

    /// `find` for the 4- and 8-byte keys that dominate eBPF maps, monomorphised: one load
    /// of the key, the hash, and compares of the bucket's words, with nothing decided per
    /// slot but the compare.
    ///
    /// # Safety
    /// As `find`, with `size_of::<W>() == key_size`.
    #[inline(always)]
    unsafe fn find_word<W: Copy + Eq + Into<u64>>(&self, key: *const u8) -> u32 {
        // SAFETY: key_size == size_of::<W>() readable bytes.
        let word: u64 = unsafe { key.cast::<W>().read_unaligned() }.into();
        let h = mix(word ^ self.seed);
        let b = self.bucket(self.bucket_of(h));
        for s in 0..SLOTS {
            if b.words[s].load(Relaxed) == word {
                // SAFETY: forwarded from the caller.
                if let Some(i) = unsafe { self.slot_match(b, s, word, key, h) } {
                    return i;
                }
            }
        }
        if b.chain.load(Relaxed) == 0 {
            return NIL;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.find_chained(b, key, h) }
    }

    /// Under the bucket lock: where the key's element is linked and the element, or, for a
    /// key not found, NIL with the end of the chain; and a free slot of the bucket, if any.
    ///
    /// # Safety
    /// As `key_eq`; the caller holds the bucket's lock.
    unsafe fn find_locked(&self, key: *const u8, h: u64) -> (Loc<'_>, u32, Option<usize>) {
        let b = self.bucket(self.bucket_of(h));
        // SAFETY: forwarded from the caller.
        let word = unsafe { self.key_word(key, h) };
        let mut free = None;
        for s in 0..SLOTS {
            // Relaxed: every writer of the bucket holds the lock we hold.
            let l = b.slots[s].load(Relaxed);
            if l == 0 {
                free = free.or(Some(s));
                continue;
            }
            // Long keys: the word is the hash; the node has the key.
            let same = b.words[s].load(Relaxed) == word
                && (self.key_size <= 8 ||
                    // SAFETY: forwarded from the caller; the element is linked.
                    unsafe { self.key_eq(l - 1, key, h) });
            if same {
                return (Loc::Slot(s), l - 1, free);
            }
        }
        let mut link = &b.chain;
        loop {
            let l = link.load(Relaxed);
            // SAFETY: forwarded from the caller.
            if l == 0 || unsafe { self.key_eq(l - 1, key, h) } {
                return (Loc::Chain(link), l.wrapping_sub(1), free);
            }
            link = self.next(l - 1);
        }
    }

    /// Unlinks element `i` from `loc` (bucket `b`, lock held). Release: a reader that
    /// loads the changed link sees a consistent successor chain.
    fn unlink(&self, b: &Bucket, loc: Loc<'_>, i: u32) {
        match loc {
            Loc::Slot(s) => b.slots[s].store(0, Release),
            Loc::Chain(link) => link.store(self.next(i).load(Relaxed), Release),
        }
    }

    fn lock_bucket(&self, h: u64) -> crate::mem::SpinGuard<'_> {
        self.locks[self.bucket_of(h) & (self.locks.len() - 1)].lock()
    }

    // ---- program and host operations ---------------------------------------------------

    /// `bpf_map_lookup_elem`: CPU `cpu`'s value of the key, or null.
    ///
    /// # Safety
    /// `key` points to key_size readable bytes; the caller is pinned on the default epoch
    /// collector for as long as it uses the returned pointer; `cpu < cpus`.
    #[inline(always)]
    pub unsafe fn lookup(&self, key: *const u8, cpu: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        let i = unsafe {
            match self.key_size {
                4 => self.find_word::<u32>(key),
                8 => self.find_word::<u64>(key),
                _ => self.find(key, self.hash_key(key)),
            }
        };
        if i == NIL {
            return std::ptr::null_mut();
        }
        self.referenced(i);
        self.value_ptr(i, cpu)
    }

    /// `lookup` for a map whose values are shared (not per-CPU) with `W`-sized keys, for
    /// callers that checked both once (a program's call site bound to this map): no
    /// dispatch on the key size, no CPU.
    ///
    /// # Safety
    /// As `lookup`, with `size_of::<W>() == key_size` and `!percpu`.
    #[inline(always)]
    pub unsafe fn lookup_shared_word<W: Copy + Eq + Into<u64>, const CLAMP: bool>(
        &self,
        key: *const u8,
    ) -> *mut u8 {
        debug_assert!(std::mem::size_of::<W>() == self.key_size && !self.percpu);
        // SAFETY: forwarded from the caller.
        let i = unsafe { self.find_word::<W>(key) };
        // With CLAMP, the address comes before the test, from the index clamped into the
        // pool (`min`, a conditional select): a caller that mispredicts the NULL test below
        // (or a mispredicted key compare that hands over NIL) still gets an address inside
        // the value slab, never past it. Sandboxed code accesses the value through the
        // result without a check once the program tested it (`PJ_HELPER_LOOKUP_VALUES`).
        let slot = if CLAMP {
            (i as usize).min(self.pool - 1)
        } else {
            i as usize
        };
        if i == NIL {
            return std::ptr::null_mut();
        }
        self.referenced(i);
        // SAFETY: slot < pool: inside the (one CPU's) value slab (i < pool when not NIL).
        unsafe { self.values.ptr().add((slot + 1) * self.vstride) }
    }

    /// Whether `lookup_shared_word::<W>` serves this table.
    pub fn is_shared_word<W>(&self) -> bool {
        !self.percpu && self.key_size == std::mem::size_of::<W>()
    }

    /// An LRU lookup marks the element referenced.
    #[inline(always)]
    fn referenced(&self, i: u32) {
        if self.lru {
            // Test before set: a hot key's bit stays set, so lookups do not keep dirtying
            // its cache line. Relaxed: the bit is a hint for the sweep, nothing hangs on it.
            let r = &self.refbit[i as usize];
            if r.load(Relaxed) == 0 {
                r.store(1, Relaxed);
            }
        }
    }

    /// Writes the value(s) into element `i`: CPU c's only (`Some(c)`), or every CPU's from
    /// `cpus` values at vstride (`None`).
    ///
    /// # Safety
    /// `value` as described; nobody else writes element `i`'s values concurrently except
    /// programs through their pointers.
    unsafe fn write_value(&self, i: u32, value: *const u8, cpu: Option<usize>) {
        match cpu {
            // SAFETY: value_size readable bytes; the destination slot has vstride.
            Some(c) => unsafe { std::ptr::copy(value, self.value_ptr(i, c), self.value_size) },
            None => {
                for c in 0..self.cpus {
                    // SAFETY: the host passes cpus values at vstride.
                    unsafe {
                        std::ptr::copy(
                            value.add(c * self.vstride),
                            self.value_ptr(i, c),
                            self.value_size,
                        )
                    };
                }
            }
        }
    }

    /// Fills a free (unpublished) element: key, hash, and value(s). For per-CPU maps a new
    /// element written from one CPU gets zeroes on every other CPU, as the kernel does.
    ///
    /// # Safety
    /// `i` came from `pop_free` and is not yet published; key/value as for `update`.
    unsafe fn fill(&self, i: u32, key: *const u8, h: u64, value: *const u8, cpu: Option<usize>) {
        let k = self.key_ptr(i);
        // SAFETY: the element is ours alone until published; the node has round8(key_size)
        // key bytes and every CPU's slot has vstride bytes.
        unsafe {
            std::ptr::write_bytes(k, 0, self.nstride - 8);
            std::ptr::copy_nonoverlapping(key, k, self.key_size);
            for c in 0..self.cpus {
                std::ptr::write_bytes(self.value_ptr(i, c), 0, self.vstride);
            }
            self.write_value(i, value, cpu);
        }
        self.hash_of(i).store(h as u32, Relaxed);
    }

    fn pop_free(&self) -> u32 {
        // Acquire pairs with push_free's Release: the element's last owner (the deferred
        // release after its grace period) is done with it before we write into it.
        let mut head = self.free_head.load(Acquire);
        loop {
            let i = head as u32;
            if i == NIL {
                return match self
                    .unused
                    .fetch_update(Relaxed, Relaxed, |u| (u < self.pool).then_some(u + 1))
                {
                    Ok(u) => {
                        self.state[u].store(FILLING, Relaxed);
                        u as u32
                    }
                    Err(_) => NIL,
                };
            }
            // A stale `next` (the element popped and pushed meanwhile) is caught by the tag.
            let next = self.free_next[i as usize].load(Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | next as u64;
            match self
                .free_head
                .compare_exchange_weak(head, new, Acquire, Acquire)
            {
                Ok(_) => {
                    self.state[i as usize].store(FILLING, Relaxed);
                    return i;
                }
                Err(h) => head = h,
            }
        }
    }

    fn push_free(&self, i: u32) {
        self.state[i as usize].store(FREE, Relaxed);
        let mut head = self.free_head.load(Relaxed);
        loop {
            self.free_next[i as usize].store(head as u32, Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | i as u64;
            match self
                .free_head
                .compare_exchange_weak(head, new, Release, Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// An unlinked element: free it after a grace period (batched).
    fn retire(self: &Arc<Self>, i: u32) {
        let batch = {
            let mut r = lock(&self.retired);
            r.push(i);
            if r.len() < RETIRE_BATCH {
                return;
            }
            std::mem::take(&mut *r)
        };
        self.defer_release(batch);
    }

    fn defer_release(self: &Arc<Self>, batch: Vec<u32>) {
        if batch.is_empty() {
            return;
        }
        let table = Arc::clone(self);
        // Every reader that could still hold one of these elements was pinned (or inside a
        // run) before this point; the release waits for all of them.
        grace::defer_release(move || {
            for i in batch {
                table.push_free(i);
            }
        });
    }

    /// Out of free elements: hand over the retired batch and let the collector advance.
    /// A host caller (not inside a program's pin) waits, like `synchronize_rcu`, for the
    /// threads pinned meanwhile to move on (bounded: [`HOST_RECLAIM_WAIT`]); a program's
    /// call cannot wait long (its own pin holds the epoch back: only garbage older than its
    /// pin can come back), so it gives the collector a few rounds and gives up.
    fn reclaim(self: &Arc<Self>, host: bool) {
        // A host thread that is itself pinned would wait for its own pin: treat it as a
        // program.
        let host = host && grace::may_wait();
        let batch = std::mem::take(&mut *lock(&self.retired));
        self.defer_release(batch);
        let start = std::time::Instant::now();
        for r in 0u32.. {
            if self.free_head.load(Relaxed) as u32 != NIL || self.unused.load(Relaxed) < self.pool {
                return;
            }
            grace::advance();
            if !host && r >= 32 || host && start.elapsed() > HOST_RECLAIM_WAIT {
                return;
            }
            if host && r >= 3 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn reserve_count(&self) -> bool {
        self.count
            .fetch_update(Relaxed, Relaxed, |c| {
                if c < self.max_entries {
                    Some(c + 1)
                } else {
                    None
                }
            })
            .is_ok()
    }

    /// `bpf_map_update_elem` with the kernel's return codes. `cpu`: `Some(c)` from a
    /// program (per-CPU maps: only CPU c's value), `None` from the host (every CPU's value).
    ///
    /// # Safety
    /// `key` points to key_size readable bytes, `value` to value_size (host, per-CPU:
    /// cpus * vstride) readable bytes; program callers are pinned.
    pub unsafe fn update(
        self: &Arc<Self>,
        key: *const u8,
        value: *const u8,
        flags: u64,
        cpu: Option<usize>,
    ) -> i64 {
        // Kernel order: flag validity first (per-CPU and LRU maps have no BPF_F_LOCK), then
        // BPF_F_LOCK needs a bpf_spin_lock in the value, which BTF-less values never have.
        if (self.percpu || self.lru) && flags > BPF_EXIST
            || flags & !BPF_F_LOCK > BPF_EXIST
            || flags & BPF_F_LOCK != 0
        {
            return -(EINVAL as i64);
        }
        let host = cpu.is_none();
        let cpu = cpu.map(|c| if self.percpu { c } else { 0 });
        // SAFETY: key_size readable bytes.
        let h = unsafe { self.hash_key(key) };
        let mut attempts = 0;
        // A count slot this update holds (reserved, or inherited from an LRU eviction),
        // carried across retries and given back if the key turns out to exist.
        let mut reserved = false;
        let give_back = |reserved: &mut bool| {
            if std::mem::take(reserved) {
                self.count.fetch_sub(1, Relaxed);
            }
        };
        loop {
            attempts += 1;
            // A non-per-CPU update always publishes a fresh copy (readers never see a value
            // half written), prepared before taking the lock.
            let mut fresh = NIL;
            if !self.percpu {
                fresh = self.pop_free();
                if fresh != NIL {
                    // SAFETY: fresh is unpublished; key/value per the contract.
                    unsafe { self.fill(fresh, key, h, value, cpu) };
                }
            }
            let guard = self.lock_bucket(h);
            // SAFETY: bucket lock held; key readable.
            let (loc, old, free) = unsafe { self.find_locked(key, h) };
            let b = self.bucket(self.bucket_of(h));
            let err = if old != NIL && flags & BPF_NOEXIST != 0 {
                -(EEXIST as i64)
            } else if old == NIL && flags & BPF_EXIST != 0 {
                -(ENOENT as i64)
            } else {
                0
            };
            if err != 0 {
                drop(guard);
                give_back(&mut reserved);
                if fresh != NIL {
                    self.push_free(fresh);
                }
                return err;
            }
            if old != NIL {
                give_back(&mut reserved);
                if self.percpu || fresh == NIL {
                    // Per-CPU maps update in place, as the kernel. A non-per-CPU map lands
                    // here only when every spare element waits for a grace period (a
                    // program replacing keys in a loop under one pin): an in-place copy,
                    // what the kernel does for arrays, rather than failing a replacement.
                    // SAFETY: old is linked and we hold its bucket's lock.
                    unsafe { self.write_value(old, value, cpu) };
                    if self.lru {
                        // The kernel marks an LRU element updated in place as referenced.
                        self.refbit[old as usize].store(1, Relaxed);
                    }
                    return 0;
                }
                self.state[fresh as usize].store(LIVE, Relaxed);
                if self.lru {
                    // A new element starts unreferenced, as the kernel's LRU node: only a
                    // lookup marks it.
                    self.refbit[fresh as usize].store(0, Relaxed);
                }
                // Release: the fresh element's key and value are visible to any reader that
                // loads this link. Readers already on `old` continue down its intact chain;
                // readers of a slot see the same word with a changed link and read it again.
                match loc {
                    Loc::Slot(s) => b.slots[s].store(fresh + 1, Release),
                    Loc::Chain(link) => {
                        self.next(fresh)
                            .store(self.next(old).load(Relaxed), Relaxed);
                        link.store(fresh + 1, Release);
                    }
                }
                self.state[old as usize].store(RETIRED, Relaxed);
                drop(guard);
                self.retire(old);
                return 0;
            }
            if !reserved {
                reserved = self.reserve_count();
            }
            if !reserved {
                drop(guard);
                if fresh != NIL {
                    self.push_free(fresh);
                }
                // Evict with no bucket lock held (the eviction lock is always taken before a
                // bucket lock, never after). The victim's count slot passes to this update,
                // so concurrent inserters cannot take it and starve us.
                if self.lru && self.evict_one() {
                    reserved = true;
                    continue;
                }
                return if self.lru {
                    -(ENOMEM as i64)
                } else {
                    -(E2BIG as i64)
                };
            }
            let elem = if self.percpu {
                let e = self.pop_free();
                if e != NIL {
                    // SAFETY: e is unpublished; key/value per the contract.
                    unsafe { self.fill(e, key, h, value, cpu) };
                }
                e
            } else {
                fresh
            };
            if elem == NIL {
                drop(guard);
                if attempts < 4 {
                    self.reclaim(host);
                    continue;
                }
                give_back(&mut reserved);
                return if self.lru {
                    -(ENOMEM as i64)
                } else {
                    -(E2BIG as i64)
                };
            }
            self.state[elem as usize].store(LIVE, Relaxed);
            if self.lru {
                self.refbit[elem as usize].store(0, Relaxed);
            }
            match free {
                Some(s) => {
                    // The word first (Release: after the slot's clearing, for a reader
                    // that validates against the link), then the link that publishes key,
                    // hash and value.
                    // SAFETY: key_size readable bytes.
                    b.words[s].store(unsafe { self.key_word(key, h) }, Release);
                    b.slots[s].store(elem + 1, Release);
                }
                None => {
                    self.next(elem).store(b.chain.load(Relaxed), Relaxed);
                    // Release publishes key, hash, value and next together.
                    b.chain.store(elem + 1, Release);
                }
            }
            return 0;
        }
    }

    /// `bpf_map_delete_elem`: 0 or -ENOENT.
    ///
    /// # Safety
    /// `key` points to key_size readable bytes.
    pub unsafe fn delete(self: &Arc<Self>, key: *const u8) -> i64 {
        // SAFETY: forwarded.
        let h = unsafe { self.hash_key(key) };
        let guard = self.lock_bucket(h);
        // SAFETY: lock held.
        let (loc, i, _) = unsafe { self.find_locked(key, h) };
        if i == NIL {
            return -(ENOENT as i64);
        }
        self.unlink(self.bucket(self.bucket_of(h)), loc, i);
        self.state[i as usize].store(RETIRED, Relaxed);
        self.count.fetch_sub(1, Relaxed);
        drop(guard);
        self.retire(i);
        0
    }

    /// CLOCK sweep over the element pool under the eviction lock: a LIVE element whose
    /// referenced bit is set gets it cleared and survives this pass; the first one found
    /// clear is evicted. This approximates the kernel's active/inactive LRU lists: a key
    /// looked up (or updated) since the hand last passed survives; among the others the
    /// victim is whichever the hand reaches first, not necessarily the oldest. New elements
    /// start unreferenced (as kernel LRU nodes); when every element is referenced, one sweep
    /// clears them all and the element after the hand goes.
    ///
    /// The victim's count slot passes to the caller (the count is not decremented).
    fn evict_one(self: &Arc<Self>) -> bool {
        let mut hand = lock(&self.clock);
        for _ in 0..2 * self.pool + 1 {
            let i = *hand as u32;
            *hand = if *hand + 1 == self.pool { 0 } else { *hand + 1 };
            if self.state[i as usize].load(Relaxed) != LIVE {
                continue;
            }
            if self.refbit[i as usize].load(Relaxed) != 0 {
                self.refbit[i as usize].store(0, Relaxed);
                continue;
            }
            // The stored hash may be stale if the element was recycled since the state
            // load; finding `i` itself in the bucket under the lock is what decides.
            let h = self.hash_of(i).load(Relaxed) as u64;
            let guard = self.lock_bucket(h);
            let b = self.bucket(self.bucket_of(h));
            let slot = (0..SLOTS).find(|&s| b.slots[s].load(Relaxed) == i + 1);
            let loc = match slot {
                Some(s) => Some(Loc::Slot(s)),
                None => {
                    let mut link = &b.chain;
                    loop {
                        let l = link.load(Relaxed);
                        if l == 0 {
                            break None;
                        }
                        if l == i + 1 {
                            break Some(Loc::Chain(link));
                        }
                        link = self.next(l - 1);
                    }
                }
            };
            if let Some(loc) = loc {
                self.unlink(b, loc, i);
                self.state[i as usize].store(RETIRED, Relaxed);
                drop(guard);
                drop(hand);
                self.retire(i);
                return true;
            }
        }
        false
    }

    // ---- host side ---------------------------------------------------------------------

    /// Copies the key's value(s) out (per-CPU: every CPU's at vstride).
    pub fn read(&self, key: &[u8]) -> Option<Vec<u8>> {
        let _pin = crossbeam_epoch::pin();
        // SAFETY: the caller checked key.len() == key_size; pinned.
        let i = unsafe { self.find(key.as_ptr(), self.hash_key(key.as_ptr())) };
        if i == NIL {
            return None;
        }
        let mut out = vec![
            0u8;
            if self.percpu {
                self.cpus * self.vstride
            } else {
                self.value_size
            }
        ];
        for c in 0..self.cpus {
            // SAFETY: the element stays allocated while pinned; out has room.
            unsafe {
                std::ptr::copy(
                    self.value_ptr(i, c),
                    out.as_mut_ptr().add(c * self.vstride),
                    self.value_size,
                )
            };
        }
        Some(out)
    }

    fn key_vec(&self, i: u32) -> Vec<u8> {
        // SAFETY: i is linked (reached from a bucket under a pin); its key is not written.
        unsafe { std::slice::from_raw_parts(self.key_ptr(i), self.key_size) }.to_vec()
    }

    /// The first element of bucket `b` after position `after`, with its own position.
    /// Positions: 0 is the bucket's start; `s + 1` slot `s`; `SLOTS + 1 + i` chained
    /// element `i` (the walk goes on from its `next`, which a deleted element keeps until
    /// its grace period ends). Bucket order: the slots, then the chain. A forged position
    /// gives some other walk, never an access outside the table (indices are bounded).
    fn next_in_bucket(&self, b: usize, after: u32) -> Option<(u32, u32)> {
        let bk = self.bucket(b);
        let l = if after as usize <= SLOTS {
            for s in after as usize..SLOTS {
                let l = bk.slots[s].load(Acquire);
                if l != 0 {
                    return Some((l - 1, s as u32 + 1));
                }
            }
            bk.chain.load(Acquire)
        } else {
            let i = after - SLOTS as u32 - 1;
            if i as usize >= self.pool {
                return None;
            }
            self.next(i).load(Acquire)
        };
        (l != 0).then(|| (l - 1, SLOTS as u32 + l))
    }

    /// The position (as `next_in_bucket`'s) of element `i` in bucket `b`, if it is there.
    fn position_of(&self, b: usize, i: u32) -> Option<u32> {
        let bk = self.bucket(b);
        if let Some(s) = (0..SLOTS).find(|&s| bk.slots[s].load(Acquire) == i + 1) {
            return Some(s as u32 + 1);
        }
        let mut l = bk.chain.load(Acquire);
        while l != 0 {
            if l == i + 1 {
                return Some(SLOTS as u32 + l);
            }
            l = self.next(l - 1).load(Acquire);
        }
        None
    }

    fn first_from(&self, bucket: usize) -> Option<Vec<u8>> {
        (bucket..self.nbuckets)
            .find_map(|b| self.next_in_bucket(b, 0))
            .map(|(i, _)| self.key_vec(i))
    }

    /// Kernel `htab_map_get_next_key`: the element after `key` in bucket order; no key or a
    /// missing one restarts at the first element.
    pub fn next_key(&self, key: Option<&[u8]>) -> Option<Vec<u8>> {
        let _pin = crossbeam_epoch::pin();
        let Some(key) = key else {
            return self.first_from(0);
        };
        // SAFETY: the caller checked the length; pinned.
        let h = unsafe { self.hash_key(key.as_ptr()) };
        // SAFETY: as above.
        let i = unsafe { self.find(key.as_ptr(), h) };
        if i == NIL {
            return self.first_from(0);
        }
        let b = self.bucket_of(h);
        // Gone meanwhile (a concurrent delete): go on with the next bucket.
        if let Some((n, _)) = self
            .position_of(b, i)
            .and_then(|at| self.next_in_bucket(b, at))
        {
            return Some(self.key_vec(n));
        }
        self.first_from(b + 1)
    }

    /// Visits every element in bucket order until `f` returns false.
    fn walk(&self, mut f: impl FnMut(u32) -> bool) {
        for b in 0..self.nbuckets {
            let mut at = 0;
            while let Some((i, next)) = self.next_in_bucket(b, at) {
                if !f(i) {
                    return;
                }
                at = next;
            }
        }
    }

    /// Every key, in bucket order, each once.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let _pin = crossbeam_epoch::pin();
        let mut out = Vec::new();
        self.walk(|i| {
            out.push(self.key_vec(i));
            true
        });
        out
    }

    /// One step of `bpf_for_each_map_elem` run by a program: the element after `cursor`
    /// (0: the first), its key copied to `key_out` and CPU `cpu`'s value returned, with the
    /// cursor to continue from; null at the end. The cursor is `bucket << 32 | position` of
    /// the element just visited (see `next_in_bucket`), so an element deleted (by the
    /// callback, say) since it was visited does not end or skip the walk, as the kernel's
    /// RCU walk; the caller's pin holds back the grace period a chained element's link
    /// needs.
    ///
    /// # Safety
    /// `key_out` has key_size writable bytes; the caller is pinned on the default epoch
    /// collector from the first step to its use of the last value; `cpu < cpus`.
    pub unsafe fn iter_next(&self, cursor: u64, key_out: *mut u8, cpu: usize) -> (*mut u8, u64) {
        let mut bucket = (cursor >> 32) as usize;
        let mut after = cursor as u32;
        while bucket < self.nbuckets {
            if let Some((i, at)) = self.next_in_bucket(bucket, after) {
                // SAFETY: i was reached through Acquire link loads under the caller's pin, so
                // its key is not rewritten; key_out has key_size bytes.
                unsafe { std::ptr::copy_nonoverlapping(self.key_ptr(i), key_out, self.key_size) };
                return (self.value_ptr(i, cpu), (bucket as u64) << 32 | at as u64);
            }
            bucket += 1;
            after = 0;
        }
        (std::ptr::null_mut(), cursor)
    }

    /// `bpf_for_each_map_elem`: f(key copy, CPU `cpu`'s value) per element until it returns
    /// false; counts the element that stopped it. The key pointer is to a copy (the nodes
    /// are bookkeeping no program may reach), valid during the call.
    pub fn for_each(&self, cpu: usize, f: &mut dyn FnMut(*const u8, *mut u8) -> bool) -> u64 {
        let _pin = crossbeam_epoch::pin();
        let mut key = vec![0u8; self.key_size];
        let mut n = 0;
        self.walk(|i| {
            // SAFETY: i is reachable under our pin, so its key is not rewritten.
            unsafe {
                std::ptr::copy_nonoverlapping(self.key_ptr(i), key.as_mut_ptr(), self.key_size)
            };
            n += 1;
            f(key.as_ptr(), self.value_ptr(i, cpu))
        });
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A table whose keys all land in bucket 0 (mask 0): SLOTS inline, the rest chained, so
    /// every operation meets both kinds of link.
    fn one_bucket(key_size: u32, max: u32) -> Arc<HashTable> {
        let mut t = HashTable::new("one", key_size, 8, max, false, false, 1).unwrap();
        t.mask = 0;
        Arc::new(t)
    }

    fn key(k: u64, size: u32) -> Vec<u8> {
        let mut v = k.to_le_bytes().to_vec();
        v.resize(size as usize, 0x5a);
        v
    }

    fn get(t: &HashTable, k: &[u8]) -> Option<u64> {
        t.read(k)
            .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
    }

    #[test]
    fn slots_and_overflow_chain_follow_a_model() {
        // 4, 8 (word keys), 3 (a short word key) and 12 (hashed: the word is the hash).
        for key_size in [4u32, 8, 3, 12] {
            let t = one_bucket(key_size, 24);
            let mut model = BTreeMap::new();
            let mut x = 0x2545_F491_4F6C_DD1Du64 ^ key_size as u64;
            let mut chained_seen = false;
            for step in 0..4000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = key(x % 40, key_size);
                let v = step.to_le_bytes();
                // Host updates, unpinned: they wait for replaced elements' grace periods
                // instead of failing when churn has used up the spares.
                match x % 3 {
                    0 | 1 => {
                        // SAFETY: key_size and 8 readable bytes.
                        let rc = unsafe { t.update(k.as_ptr(), v.as_ptr(), 0, None) };
                        if model.len() < 24 || model.contains_key(&k) {
                            assert_eq!(rc, 0, "size {key_size} step {step}");
                            model.insert(k.clone(), step);
                        } else {
                            assert_eq!(rc, -(E2BIG as i64), "size {key_size} step {step}");
                        }
                    }
                    _ => {
                        // SAFETY: key_size readable bytes.
                        let rc = unsafe { t.delete(k.as_ptr()) };
                        let want = if model.remove(&k).is_some() {
                            0
                        } else {
                            -(ENOENT as i64)
                        };
                        assert_eq!(rc, want, "size {key_size} step {step}");
                    }
                }
                assert_eq!(
                    get(&t, &k),
                    model.get(&k).copied(),
                    "size {key_size} step {step}"
                );
                chained_seen |= t.bucket(0).chain.load(Relaxed) != 0;
                if step % 97 == 0 {
                    let _pin = crossbeam_epoch::pin();
                    for (mk, mv) in &model {
                        assert_eq!(get(&t, mk), Some(*mv));
                        // SAFETY: key_size readable bytes; pinned.
                        let p = unsafe { t.lookup(mk.as_ptr(), 0) };
                        // SAFETY: a value has 8 bytes.
                        assert_eq!(unsafe { p.cast::<u64>().read() }, *mv);
                    }
                    // next_key walks every key once, in the order keys() and for_each give.
                    let mut walked = Vec::new();
                    let mut cur: Option<Vec<u8>> = None;
                    while let Some(n) = t.next_key(cur.as_deref()) {
                        walked.push(n.clone());
                        assert!(walked.len() <= model.len(), "next_key loops");
                        cur = Some(n);
                    }
                    assert_eq!(walked, t.keys());
                    let mut each = Vec::new();
                    t.for_each(0, &mut |k, _| {
                        // SAFETY: the key copy has key_size bytes during the call.
                        each.push(
                            unsafe { std::slice::from_raw_parts(k, key_size as usize) }.to_vec(),
                        );
                        true
                    });
                    assert_eq!(walked, each);
                    let mut sorted = walked.clone();
                    sorted.sort();
                    assert_eq!(sorted, model.keys().cloned().collect::<Vec<_>>());
                }
            }
            assert!(chained_seen, "size {key_size}: the overflow chain was used");
        }
    }

    /// The word lookup (`WordLookup`, the copy programs use) against the table's own
    /// lookup and a model, through inserts, replacements and deletes in one bucket (slots
    /// and chain), for both word widths, with and without LRU: the same pointers, the
    /// fast path taking the slot hits and absent keys, the slow path only the chain.
    #[test]
    fn word_lookup_matches_the_tables_lookup() {
        fn run<W: Copy + Eq + Into<u64>>(lru: bool) {
            let size = std::mem::size_of::<W>() as u32;
            let mut t = HashTable::new("word", size, 8, 24, false, lru, 1).unwrap();
            t.mask = 0;
            let t = Arc::new(t);
            let d = t.word_lookup();
            let mut model = BTreeMap::new();
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ size as u64 ^ lru as u64;
            let (mut fast, mut slow) = (0u32, 0u32);
            for step in 0..3000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = key(x % 30, size);
                let v = (step * 7).to_le_bytes();
                if x % 4 == 0 {
                    // SAFETY: key_size readable bytes.
                    let rc = unsafe { t.delete(k.as_ptr()) };
                    assert_eq!(rc == 0, model.remove(&k).is_some());
                } else if model.len() < 24 || model.contains_key(&k) {
                    // SAFETY: key_size and 8 readable bytes.
                    assert_eq!(unsafe { t.update(k.as_ptr(), v.as_ptr(), 0, None) }, 0);
                    model.insert(k.clone(), step * 7);
                }
                let _pin = crossbeam_epoch::pin();
                for probe in [x % 30, (x >> 8) % 30, 31] {
                    let k = key(probe, size);
                    let used_slow = std::cell::Cell::new(false);
                    t.refbit.iter().for_each(|r| r.store(0, Relaxed));
                    // SAFETY: key_size readable bytes; pinned; the table outlives `d`.
                    let p = unsafe {
                        d.lookup::<W>(k.as_ptr(), || {
                            used_slow.set(true);
                            t.lookup_shared_word::<W, true>(k.as_ptr())
                        })
                    };
                    if lru && !p.is_null() {
                        let i = (p as usize - t.values.ptr() as usize) / t.vstride - 1;
                        assert_eq!(t.refbit[i].load(Relaxed), 1, "referenced");
                    }
                    // SAFETY: as above.
                    let want = unsafe { t.lookup(k.as_ptr(), 0) };
                    assert_eq!(p, want, "size {size} lru {lru} step {step} key {probe}");
                    match model.get(&k) {
                        // SAFETY: a value has 8 bytes.
                        Some(&v) => assert_eq!(unsafe { p.cast::<u64>().read() }, v),
                        None => assert!(p.is_null()),
                    }
                    if !p.is_null() {
                        let (start, len) = t.values_region();
                        assert!(p >= start && p < start.wrapping_add(len));
                    }
                    // Nothing writes meanwhile: a key in a slot is the fast path's.
                    let b = t.bucket(0);
                    let in_slot = !p.is_null()
                        && (0..SLOTS).any(|s| {
                            let l = b.slots[s].load(Relaxed) as usize;
                            l != 0 && t.value_ptr(l as u32 - 1, 0) == p
                        });
                    assert_eq!(used_slow.get(), !in_slot && b.chain.load(Relaxed) != 0);
                    if used_slow.get() {
                        slow += 1;
                    } else {
                        fast += 1;
                    }
                }
            }
            // More keys than slots: both paths were taken.
            assert!(slow > 0 && fast > 0, "fast {fast} slow {slow}");
        }
        for lru in [false, true] {
            run::<u32>(lru);
            run::<u64>(lru);
        }
    }

    #[test]
    fn iteration_steps_survive_deleting_the_current_element() {
        let t = one_bucket(8, 16);
        let _pin = crossbeam_epoch::pin();
        for k in 0..16u64 {
            let (k, v) = (k.to_le_bytes(), [1u8; 8]);
            // SAFETY: 8 readable bytes each.
            assert_eq!(unsafe { t.update(k.as_ptr(), v.as_ptr(), 0, None) }, 0);
        }
        let (mut cursor, mut seen) = (0, Vec::new());
        let mut key = [0u8; 8];
        loop {
            // SAFETY: 8 writable bytes; pinned.
            let (v, next) = unsafe { t.iter_next(cursor, key.as_mut_ptr(), 0) };
            if v.is_null() {
                break;
            }
            seen.push(u64::from_le_bytes(key));
            // SAFETY: 8 readable bytes.
            assert_eq!(unsafe { t.delete(key.as_ptr()) }, 0);
            cursor = next;
        }
        seen.sort();
        assert_eq!(seen, (0..16).collect::<Vec<_>>());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn huge_tables_are_zeroed_and_usable() {
        // 1 Mi entries: buckets, nodes and values are huge-page mappings.
        let t = Arc::new(HashTable::new("big", 8, 8, 1 << 20, false, false, 1).unwrap());
        assert!(t.buckets.len() >= 2 << 20);
        let _pin = crossbeam_epoch::pin();
        for k in (0..1u64 << 20).step_by(4099) {
            let (kb, v) = (k.to_le_bytes(), (k * 3).to_le_bytes());
            // SAFETY: 8 readable bytes each.
            assert_eq!(unsafe { t.update(kb.as_ptr(), v.as_ptr(), 0, Some(0)) }, 0);
        }
        for k in (0..1u64 << 20).step_by(4099) {
            assert_eq!(get(&t, &k.to_le_bytes()), Some(k * 3));
            assert_eq!(get(&t, &(k + 1).to_le_bytes()), None);
        }
    }
}
