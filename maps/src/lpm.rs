//! `BPF_MAP_TYPE_LPM_TRIE`: longest-prefix match over `struct { u32 prefixlen; u8 data[]; }`
//! keys, with the kernel's semantics (kernel/bpf/lpm_trie.c).
//!
//! The structure is the kernel's: a path-compressed binary trie whose nodes hold a prefix
//! (`prefixlen` bits of `data`, most significant bit of byte 0 first) and two children, the
//! child taken being the key's bit right after the node's prefix. A node is either a stored
//! prefix (it has a value slot) or *intermediate* (`slot == IM`: it only joins two subtrees,
//! and then always has both children). Every prefix that matches a key lies on the one path
//! from the root the key's bits choose, so a lookup is a single walk down.
//!
//! Concurrency, as the kernel's RCU trie: lookups take no lock. They load child links with
//! Acquire; writers (serialised on `writer`) build a node completely, value included, and
//! publish it with one Release store of the link that is to point to it. A node is never
//! changed once published, except that a delete may turn a stored node with two children
//! intermediate (its slot word, atomically). Nodes and value slots that leave the trie are
//! retired through the default crossbeam-epoch collector: a reader pinned when they left
//! keeps them (and the value a lookup returned) until it unpins.
//!
//! Values live in their own slab (`values`), apart from the nodes, links and keys: it is the
//! only memory a program reaches through a value pointer.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::errno::{EEXIST, EINVAL, ENOENT, ENOMEM, ENOSPC};
use crate::grace;
use crate::mem::{bytes, round8, AllocError, Slab};
use crate::{BPF_EXIST, BPF_NOEXIST};

/// The slot word of an intermediate node.
const IM: u32 = u32::MAX;

/// Smallest and largest `data` of a key, in bytes (the kernel's `LPM_DATA_SIZE_MIN/MAX`).
pub(crate) const DATA_SIZE_MIN: u32 = 1;
/// See [`DATA_SIZE_MIN`].
pub(crate) const DATA_SIZE_MAX: u32 = 256;

/// Retired nodes and slots go to the collector in batches of this many (one deferred closure
/// and one flush per batch, not per update).
const RETIRE_BATCH: usize = 8;

/// How long a host update waits for value slots to come back from their grace period.
const HOST_RECLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Data of up to this many bytes (IPv4 and IPv6 addresses, MAC addresses) is kept inside
/// the node: a lookup then touches one cache line per level instead of two.
const INLINE_DATA: usize = 16;

/// A node's key data: inside the node when small, else on the heap.
enum Data {
    Inline([u8; INLINE_DATA], u8),
    Heap(Box<[u8]>),
}

impl Data {
    fn new(d: &[u8]) -> Data {
        if d.len() <= INLINE_DATA {
            let mut b = [0u8; INLINE_DATA];
            b[..d.len()].copy_from_slice(d);
            Data::Inline(b, d.len() as u8)
        } else {
            Data::Heap(d.into())
        }
    }

    #[inline(always)]
    fn get(&self) -> &[u8] {
        match self {
            Data::Inline(b, n) => &b[..*n as usize],
            Data::Heap(b) => b,
        }
    }
}

struct Node {
    child: [AtomicPtr<Node>; 2],
    prefixlen: u32,
    /// Value slot index, or `IM`.
    slot: AtomicU32,
    /// The key's data as the update that made the node gave it, all `data_size` bytes (the
    /// kernel keeps the bits past `prefixlen` too, and `next_key` returns them).
    data: Data,
}

/// Nodes and slots that left the trie, freed (slots: made free again) when dropped, which
/// the collector does after their grace period.
struct Retired {
    nodes: Vec<*mut Node>,
    slots: Vec<u32>,
    free: Arc<Mutex<Vec<u32>>>,
}

// SAFETY: the node pointers are owned by the batch (unreachable from the trie since before it
// was handed over) and freed once, by whichever thread drops it.
unsafe impl Send for Retired {}

impl Drop for Retired {
    fn drop(&mut self) {
        for &n in &self.nodes {
            // SAFETY: each came from Box::into_raw, left the trie, and is freed only here.
            drop(unsafe { Box::from_raw(n) });
        }
        if !self.slots.is_empty() {
            lock(&self.free).append(&mut self.slots);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bit `index` of `data`, most significant bit of byte 0 first (network order).
#[inline(always)]
fn bit(data: &[u8], index: u32) -> usize {
    (data[(index / 8) as usize] >> (7 - index % 8)) as usize & 1
}

/// How many leading bits of `a` and `b` agree, at most `limit` (the kernel's
/// `longest_prefix_match` with `limit = min(node, key prefixlen)`).
#[inline(always)]
fn common_bits(a: &[u8], b: &[u8], limit: u32) -> u32 {
    let mut m = 0u32;
    let mut i = 0usize;
    // Eight bytes at a time as big-endian words: the first differing bit is the highest set
    // bit of the xor, whichever chunk size compares it.
    while m < limit && i + 8 <= a.len() {
        let x = u64::from_be_bytes(a[i..i + 8].try_into().expect("8 bytes"))
            ^ u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if x != 0 {
            return (m + x.leading_zeros()).min(limit);
        }
        m += 64;
        i += 8;
    }
    if m < limit && i + 4 <= a.len() {
        let x = u32::from_be_bytes(a[i..i + 4].try_into().expect("4 bytes"))
            ^ u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        if x != 0 {
            return (m + x.leading_zeros()).min(limit);
        }
        m += 32;
        i += 4;
    }
    while m < limit && i < a.len() {
        let x = a[i] ^ b[i];
        if x != 0 {
            return (m + x.leading_zeros()).min(limit);
        }
        m += 8;
        i += 1;
    }
    m.min(limit)
}

pub(crate) struct LpmTrie {
    data_size: usize,
    max_prefixlen: u32,
    value_size: usize,
    vstride: usize,
    max_entries: usize,
    pool: usize,
    root: AtomicPtr<Node>,
    values: Slab,
    /// Stored prefixes (intermediate nodes not counted), written under `writer`.
    count: AtomicUsize,
    /// Serialises the writers (update, delete), as the kernel's `trie->lock`.
    writer: Mutex<()>,
    /// Value slots free for reuse: returned by retired batches after their grace period, or
    /// by an update that did not publish the slot it took.
    free: Arc<Mutex<Vec<u32>>>,
    /// Slots never used yet are `[unused, pool)`: handed out after the free list, so the
    /// slab's pages are touched only as far as the map ever needed.
    unused: AtomicUsize,
    /// The batch being gathered (lock order: `writer`, then `retired`, then `free`).
    retired: Mutex<Vec<*mut Node>>,
    retired_slots: Mutex<Vec<u32>>,
}

// SAFETY: the raw node pointers are shared the way the module doc describes (published by
// Release, read under epoch pins or inside registered runs, written only under `writer`); the batch vectors are behind
// mutexes.
unsafe impl Send for LpmTrie {}
// SAFETY: as for Send.
unsafe impl Sync for LpmTrie {}

impl LpmTrie {
    /// `key_size` is 4 + the data size (checked by the caller: 1..=256 data bytes).
    pub fn new(key_size: u32, value_size: u32, max_entries: u32) -> Result<LpmTrie, AllocError> {
        let data_size = key_size as usize - 4;
        let max = max_entries as usize;
        // Spares for the slots that wait out their grace period after a replacement or a
        // delete (the kernel allocates nodes on demand; values here have a fixed slab).
        let ncpu = crate::Map::possible_cpus();
        let spare = if round8(value_size as usize) >= 64 << 10 {
            (2 * ncpu).max(8)
        } else {
            (16 * ncpu).max(256)
        } + RETIRE_BATCH;
        let pool = max + spare;
        let vstride = round8(value_size as usize);
        Ok(LpmTrie {
            data_size,
            max_prefixlen: 8 * data_size as u32,
            value_size: value_size as usize,
            vstride,
            max_entries: max,
            pool,
            root: AtomicPtr::new(ptr::null_mut()),
            values: Slab::zeroed(bytes(pool, vstride)?)?,
            count: AtomicUsize::new(0),
            writer: Mutex::new(()),
            free: Arc::new(Mutex::new(Vec::new())),
            unused: AtomicUsize::new(0),
            retired: Mutex::new(Vec::new()),
            retired_slots: Mutex::new(Vec::new()),
        })
    }

    pub fn values_region(&self) -> (*mut u8, usize) {
        (self.values.ptr(), self.values.len())
    }

    pub fn len(&self) -> usize {
        self.count.load(Relaxed)
    }

    #[inline(always)]
    fn value_ptr(&self, slot: u32) -> *mut u8 {
        debug_assert!((slot as usize) < self.pool);
        // SAFETY: every slot index handed out is < pool.
        unsafe { self.values.ptr().add(slot as usize * self.vstride) }
    }

    /// The prefix length and data of the key at `key`.
    ///
    /// # Safety
    /// `key` points to `4 + data_size` readable bytes that stay unchanged during the borrow.
    #[inline(always)]
    unsafe fn split_key<'k>(&self, key: *const u8) -> (u32, &'k [u8]) {
        // SAFETY: forwarded from the caller.
        unsafe {
            (
                key.cast::<u32>().read_unaligned(),
                std::slice::from_raw_parts(key.add(4), self.data_size),
            )
        }
    }

    /// # Safety
    /// `n` is reachable: read under an epoch pin or inside a registered run, or under `writer`.
    #[inline(always)]
    unsafe fn node<'a>(n: *mut Node) -> &'a Node {
        // SAFETY: forwarded from the caller; retired nodes are freed after a grace period.
        unsafe { &*n }
    }

    // ---- program and host operations ---------------------------------------------------

    /// `bpf_map_lookup_elem`: the value of the longest stored prefix that matches the key
    /// within the key's own prefix length, or null.
    ///
    /// # Safety
    /// `key` points to key_size readable bytes; the caller is pinned on the default epoch
    /// collector for as long as it uses the returned pointer.
    #[inline]
    pub unsafe fn lookup(&self, key: *const u8) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        let (plen, kdata) = unsafe { self.split_key(key) };
        let mut found = IM;
        let mut n = self.root.load(Acquire);
        while !n.is_null() {
            // SAFETY: reached through Acquire link loads under the caller's pin.
            let node = unsafe { Self::node(n) };
            let m = common_bits(node.data.get(), kdata, node.prefixlen.min(plen));
            if m < node.prefixlen {
                break;
            }
            let s = node.slot.load(Acquire);
            if s != IM {
                found = s;
            }
            // A full-length prefix has no children (and no bit after it to choose by).
            if m == self.max_prefixlen {
                break;
            }
            n = node.child[bit(kdata, node.prefixlen)].load(Acquire);
        }
        if found == IM {
            ptr::null_mut()
        } else {
            self.value_ptr(found)
        }
    }

    /// A value slot for a new node: a free one, a never-used one, or (out of both) one back
    /// from its grace period. A host caller not inside a pin waits for the pinned threads
    /// (bounded by [`HOST_RECLAIM_WAIT`]); a program's own pin holds the epoch back, so it
    /// tries a few rounds only. `IM` when none came.
    fn take_slot(&self, host: bool) -> u32 {
        let host = host && grace::may_wait();
        let start = std::time::Instant::now();
        for r in 0u32.. {
            if let Some(s) = lock(&self.free).pop() {
                return s;
            }
            if let Ok(s) = self
                .unused
                .fetch_update(Relaxed, Relaxed, |u| (u < self.pool).then_some(u + 1))
            {
                return s as u32;
            }
            if r == 0 {
                self.hand_over_batch();
            }
            grace::advance();
            if !host && r >= 32 || host && start.elapsed() > HOST_RECLAIM_WAIT {
                return IM;
            }
            if host && r >= 3 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
        IM
    }

    /// Gives the gathered retired nodes and slots to the collector.
    fn hand_over_batch(&self) {
        let nodes = std::mem::take(&mut *lock(&self.retired));
        let slots = std::mem::take(&mut *lock(&self.retired_slots));
        if nodes.is_empty() && slots.is_empty() {
            return;
        }
        let batch = Retired {
            nodes,
            slots,
            free: Arc::clone(&self.free),
        };
        // Every reader that could still be on one of these nodes, or hold one of these
        // values, was pinned (or inside a run) before they left the trie, hence before this
        // point; the batch is dropped only once all of them are done.
        grace::defer_release(move || drop(batch));
    }

    /// Retires a node that left the trie and/or a slot no node refers to any more.
    fn retire(&self, node: Option<*mut Node>, slot: Option<u32>) {
        let full = {
            let mut nodes = lock(&self.retired);
            let mut slots = lock(&self.retired_slots);
            nodes.extend(node);
            slots.extend(slot);
            nodes.len() + slots.len() >= RETIRE_BATCH
        };
        if full {
            self.hand_over_batch();
        }
    }

    /// The kernel's `trie_check_add_elem`: may a new prefix be stored? Counts it if so.
    fn check_add(&self, flags: u64) -> i64 {
        if flags == BPF_EXIST {
            return -(ENOENT as i64);
        }
        if self.count.load(Relaxed) >= self.max_entries {
            return -(ENOSPC as i64);
        }
        0
    }

    /// `bpf_map_update_elem`: 0, or -EINVAL (flags, prefixlen above the data's bits),
    /// -EEXIST (`BPF_NOEXIST` on a stored prefix), -ENOENT (`BPF_EXIST` on a missing one),
    /// -ENOSPC (a new prefix in a full trie), -ENOMEM (no value slot came back in time).
    ///
    /// # Safety
    /// `key` points to key_size and `value` to value_size readable bytes.
    pub unsafe fn update(&self, key: *const u8, value: *const u8, flags: u64, host: bool) -> i64 {
        if flags > BPF_EXIST {
            return -(EINVAL as i64);
        }
        // SAFETY: forwarded from the caller.
        let (plen, kdata) = unsafe { self.split_key(key) };
        if plen > self.max_prefixlen {
            return -(EINVAL as i64);
        }
        // As the kernel allocates its node before taking the lock: the value is in place
        // before anything can see it.
        let slot = self.take_slot(host);
        if slot != IM {
            // SAFETY: value_size readable bytes; the slot is ours and unpublished.
            unsafe { ptr::copy(value, self.value_ptr(slot), self.value_size) };
        }
        let new = Box::into_raw(Box::new(Node {
            child: [
                AtomicPtr::new(ptr::null_mut()),
                AtomicPtr::new(ptr::null_mut()),
            ],
            prefixlen: plen,
            slot: AtomicU32::new(slot),
            data: Data::new(kdata),
        }));
        let _w = lock(&self.writer);
        // SAFETY: `new` is ours until published.
        let new_ref = unsafe { &*new };
        let fail = |code: i64| {
            // SAFETY: never published.
            drop(unsafe { Box::from_raw(new) });
            if slot != IM {
                lock(&self.free).push(slot);
            }
            code
        };
        // Find the link to attach at: down while the node's prefix is a proper prefix of
        // the key's.
        let mut link = &self.root;
        let mut matchlen = 0;
        let mut n;
        loop {
            // Relaxed: every writer of the links holds the lock we hold.
            n = link.load(Relaxed);
            if n.is_null() {
                break;
            }
            // SAFETY: linked, and we hold the writer lock.
            let node = unsafe { Self::node(n) };
            matchlen = common_bits(node.data.get(), kdata, node.prefixlen.min(plen));
            if node.prefixlen != matchlen || node.prefixlen == plen {
                break;
            }
            link = &node.child[bit(kdata, node.prefixlen)];
        }
        if n.is_null() {
            let e = self.check_add(flags);
            if e != 0 {
                return fail(e);
            }
            if slot == IM {
                return fail(-(ENOMEM as i64));
            }
            self.count.fetch_add(1, Relaxed);
            // Release: the node's data and value are visible to whoever loads the link.
            link.store(new, Release);
            return 0;
        }
        // SAFETY: as above.
        let node = unsafe { Self::node(n) };
        if node.prefixlen == matchlen {
            // The very prefix: replace the node (stored or intermediate) by the new one.
            let old_slot = node.slot.load(Relaxed);
            let mut slot_in_use = slot;
            if old_slot != IM {
                if flags == BPF_NOEXIST {
                    return fail(-(EEXIST as i64));
                }
                if slot == IM {
                    // Every spare slot waits for its grace period (a program replacing
                    // prefixes in a loop under one pin): write the old slot in place, as
                    // the kernel's arrays do, rather than fail a replacement.
                    // SAFETY: value_size readable bytes; the slot is the live node's.
                    unsafe { ptr::copy(value, self.value_ptr(old_slot), self.value_size) };
                    new_ref.slot.store(old_slot, Relaxed);
                    slot_in_use = old_slot;
                }
            } else {
                let e = self.check_add(flags);
                if e != 0 {
                    return fail(e);
                }
                if slot == IM {
                    return fail(-(ENOMEM as i64));
                }
                self.count.fetch_add(1, Relaxed);
            }
            for b in 0..2 {
                new_ref.child[b].store(node.child[b].load(Relaxed), Relaxed);
            }
            // Release: readers that load the link see the new node whole; those already on
            // the old one continue into the same children.
            link.store(new, Release);
            let freed = (old_slot != IM && old_slot != slot_in_use).then_some(old_slot);
            self.retire(Some(n), freed);
            return 0;
        }
        let e = self.check_add(flags);
        if e != 0 {
            return fail(e);
        }
        if slot == IM {
            return fail(-(ENOMEM as i64));
        }
        self.count.fetch_add(1, Relaxed);
        if matchlen == plen {
            // The new prefix is a proper prefix of the node's: it goes in between.
            new_ref.child[bit(node.data.get(), matchlen)].store(n, Relaxed);
            link.store(new, Release);
            return 0;
        }
        // They part at bit `matchlen`: an intermediate node of that length joins them.
        let im = Box::into_raw(Box::new(Node {
            // Both links set below; the node's side first, the new node's over it.
            child: [AtomicPtr::new(n), AtomicPtr::new(n)],
            prefixlen: matchlen,
            slot: AtomicU32::new(IM),
            data: Data::new(node.data.get()),
        }));
        // SAFETY: ours until published.
        unsafe { &*im }.child[bit(kdata, matchlen)].store(new, Relaxed);
        link.store(im, Release);
        0
    }

    /// `bpf_map_delete_elem` of exactly this prefix: 0, -ENOENT (not stored), -EINVAL
    /// (prefixlen above the data's bits).
    ///
    /// # Safety
    /// `key` points to key_size readable bytes.
    pub unsafe fn delete(&self, key: *const u8) -> i64 {
        // SAFETY: forwarded from the caller.
        let (plen, kdata) = unsafe { self.split_key(key) };
        if plen > self.max_prefixlen {
            return -(EINVAL as i64);
        }
        let _w = lock(&self.writer);
        let mut trim = &self.root;
        let mut trim2 = trim;
        let mut parent: *mut Node = ptr::null_mut();
        let mut matchlen = 0;
        let mut n;
        loop {
            n = trim.load(Relaxed);
            if n.is_null() {
                break;
            }
            // SAFETY: linked; writer lock held.
            let node = unsafe { Self::node(n) };
            matchlen = common_bits(node.data.get(), kdata, node.prefixlen.min(plen));
            if node.prefixlen != matchlen || node.prefixlen == plen {
                break;
            }
            parent = n;
            trim2 = trim;
            trim = &node.child[bit(kdata, node.prefixlen)];
        }
        if n.is_null() {
            return -(ENOENT as i64);
        }
        // SAFETY: as above.
        let node = unsafe { Self::node(n) };
        let slot = node.slot.load(Relaxed);
        if node.prefixlen != plen || node.prefixlen != matchlen || slot == IM {
            return -(ENOENT as i64);
        }
        self.count.fetch_sub(1, Relaxed);
        let c0 = node.child[0].load(Relaxed);
        let c1 = node.child[1].load(Relaxed);
        if !c0.is_null() && !c1.is_null() {
            // Still needed to join its subtrees: it turns intermediate. Release pairs with
            // lookups' Acquire of the slot word; one that read the slot before keeps the
            // value until its pin ends (the slot is retired, not freed).
            node.slot.store(IM, Release);
            self.retire(None, Some(slot));
            return 0;
        }
        if !parent.is_null() && c0.is_null() && c1.is_null() {
            // SAFETY: linked; writer lock held.
            let p = unsafe { Self::node(parent) };
            if p.slot.load(Relaxed) == IM {
                // A leaf under an intermediate node: the intermediate node goes too, its
                // other child takes its place.
                let i = usize::from(p.child[0].load(Relaxed) == n);
                trim2.store(p.child[i].load(Relaxed), Release);
                self.retire(Some(n), Some(slot));
                self.retire(Some(parent), None);
                return 0;
            }
        }
        // Zero or one child: it takes the node's place.
        trim.store(if c0.is_null() { c1 } else { c0 }, Release);
        self.retire(Some(n), Some(slot));
        0
    }

    // ---- host side ---------------------------------------------------------------------

    /// A copy of the value [`Self::lookup`] finds.
    pub fn read(&self, key: &[u8]) -> Option<Vec<u8>> {
        let _pin = crossbeam_epoch::pin();
        // SAFETY: the caller checked key.len() == key_size; pinned.
        let v = unsafe { self.lookup(key.as_ptr()) };
        if v.is_null() {
            return None;
        }
        let mut out = vec![0u8; self.value_size];
        // SAFETY: the slot stays allocated while pinned; out has value_size bytes.
        unsafe { ptr::copy(v, out.as_mut_ptr(), self.value_size) };
        Some(out)
    }

    fn key_of(node: &Node) -> Vec<u8> {
        let mut k = node.prefixlen.to_ne_bytes().to_vec();
        k.extend_from_slice(node.data.get());
        k
    }

    /// The first stored node of the subtree at `n` in postorder (children before parents,
    /// the 0 child before the 1 child), as the kernel's `find_leftmost`.
    ///
    /// # Safety
    /// The caller is pinned.
    unsafe fn leftmost<'a>(mut n: *mut Node) -> Option<&'a Node> {
        let mut found = None;
        while !n.is_null() {
            // SAFETY: reached through Acquire link loads under the caller's pin.
            let node = unsafe { Self::node(n) };
            let c0 = node.child[0].load(Acquire);
            if node.slot.load(Acquire) == IM {
                n = c0;
            } else {
                found = Some(node);
                n = if c0.is_null() {
                    node.child[1].load(Acquire)
                } else {
                    c0
                };
            }
        }
        found
    }

    /// Kernel `trie_get_next_key`: the stored prefix after `key` in postorder; no key, a
    /// prefix length above the data's bits or a prefix not stored gives the first.
    pub fn next_key(&self, key: Option<&[u8]>) -> Option<Vec<u8>> {
        let _pin = crossbeam_epoch::pin();
        let root = self.root.load(Acquire);
        // SAFETY: pinned (as are all node reads below, reached through Acquire loads).
        let first = || unsafe { Self::leftmost(root) }.map(Self::key_of);
        let Some(key) = key else {
            return first();
        };
        // SAFETY: the caller checked the length.
        let (plen, kdata) = unsafe { self.split_key(key.as_ptr()) };
        if plen > self.max_prefixlen {
            return first();
        }
        let mut stack: Vec<*mut Node> = Vec::new();
        let mut n = root;
        let mut matchlen = 0;
        while !n.is_null() {
            stack.push(n);
            // SAFETY: pinned; reached through Acquire loads.
            let node = unsafe { Self::node(n) };
            matchlen = common_bits(node.data.get(), kdata, node.prefixlen.min(plen));
            if node.prefixlen != matchlen || node.prefixlen == plen {
                break;
            }
            n = node.child[bit(kdata, node.prefixlen)].load(Acquire);
        }
        if n.is_null() {
            return first();
        }
        // SAFETY: pinned; reached through Acquire loads.
        let node = unsafe { Self::node(n) };
        if node.prefixlen != plen || node.prefixlen != matchlen || node.slot.load(Acquire) == IM {
            return first();
        }
        // The key's node: next in postorder is the leftmost of the right sibling subtree if
        // we came from the 0 side and there is one, else the first stored ancestor.
        let mut i = stack.len() - 1;
        while i > 0 {
            let cur = stack[i];
            // SAFETY: pinned; an ancestor on the walk above.
            let parent = unsafe { Self::node(stack[i - 1]) };
            if parent.child[0].load(Acquire) == cur {
                let right = parent.child[1].load(Acquire);
                if !right.is_null() {
                    // SAFETY: pinned.
                    return unsafe { Self::leftmost(right) }.map(Self::key_of);
                }
            }
            if parent.slot.load(Acquire) != IM {
                return Some(Self::key_of(parent));
            }
            i -= 1;
        }
        None
    }

    /// Every stored key, in `next_key`'s order.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let _pin = crossbeam_epoch::pin();
        let mut out = Vec::new();
        // Iterative postorder: (node, children done).
        let mut stack = vec![(self.root.load(Acquire), false)];
        while let Some((n, done)) = stack.pop() {
            if n.is_null() {
                continue;
            }
            // SAFETY: pinned; reached through Acquire loads.
            let node = unsafe { Self::node(n) };
            if done {
                if node.slot.load(Acquire) != IM {
                    out.push(Self::key_of(node));
                }
            } else {
                stack.push((n, true));
                stack.push((node.child[1].load(Acquire), false));
                stack.push((node.child[0].load(Acquire), false));
            }
        }
        out
    }
}

impl Drop for LpmTrie {
    fn drop(&mut self) {
        // No reader is left (the map is being dropped): free the live nodes; the gathered
        // batch frees itself.
        let mut stack = vec![*self.root.get_mut()];
        while let Some(n) = stack.pop() {
            if n.is_null() {
                continue;
            }
            // SAFETY: every linked node came from Box::into_raw and is linked exactly once.
            let node = unsafe { Box::from_raw(n) };
            stack.push(node.child[0].load(Relaxed));
            stack.push(node.child[1].load(Relaxed));
        }
        drop(Retired {
            nodes: std::mem::take(self.retired.get_mut().unwrap_or_else(|e| e.into_inner())),
            slots: Vec::new(),
            free: Arc::clone(&self.free),
        });
    }
}
