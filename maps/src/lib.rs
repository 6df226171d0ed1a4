//! eBPF maps with the Linux kernel's semantics, for packjit's runtime: the map types,
//! `MapSpec` validation, the program-side operations behind the helpers (raw pointers, the
//! kernel helpers' return codes) and a safe host-side API (the `bpf(2)` map commands).
//!
//! | type | program side | layout |
//! |---|---|---|
//! | `ARRAY`, `PERCPU_ARRAY` | lookup (inlined by the JIT via [`Map::array_layout`]), update | values at `round_up(value_size, 8)`; per CPU one copy of the array |
//! | `HASH`, `PERCPU_HASH`, `LRU_HASH`, `LRU_PERCPU_HASH` | lookup (lock-free), update, delete | 64-byte bucket lines with 5 elements inline (key word + link) and an overflow chain; preallocated elements; values in their own slab |
//! | `LPM_TRIE` | lookup (lock-free, longest prefix), update, delete | the kernel's trie of nodes; values in their own slab |
//! | `QUEUE`, `STACK` | push, pop, peek | a ring under a mutex; values copied |
//! | `RINGBUF` | reserve, submit, discard, output, query | kernel record layout, data area mapped twice |
//! | `PROG_ARRAY` | (tail calls, via [`Map::prog_slot`]) | `u64` tokens the runtime owns |
//!
//! # Limits
//!
//! * `max_entries >= 1` for every type; hash maps: `max_entries <= 2^31`.
//! * `key_size`: 4 for arrays and prog arrays, 1..=[`MAX_KEY_SIZE`] (512, the kernel's
//!   `MAX_BPF_STACK`) for hashes, 5..=260 for LPM tries (a `u32` prefix length and 1..=256
//!   data bytes, the kernel's `LPM_KEY_SIZE_MIN/MAX`), 0 for queue/stack/ring buffer.
//! * `value_size`: 1..=[`MAX_VALUE_SIZE`] (1 MiB) for arrays, hashes, queues and stacks;
//!   1..=[`MAX_PERCPU_VALUE_SIZE`] (32 KiB, the kernel's `PCPU_MIN_UNIT_SIZE`) for per-CPU maps;
//!   4 for prog arrays; 0 for ring buffers. LPM tries refuse key and value sizes out of
//!   range with `EINVAL`, as the kernel's `trie_alloc` (other types: `E2BIG` above a limit).
//! * LPM tries: `max_entries <= 2^31`, as hashes.
//! * ring buffer: `max_entries` is the data size, a power of two and a multiple of the page
//!   size (`sysconf(_SC_PAGESIZE)`).
//! * flags: [`BPF_F_RDONLY_PROG`] for arrays, hashes, queues and stacks;
//!   [`BPF_F_NO_PREALLOC`] for HASH and PERCPU_HASH (the kernel refuses it for arrays,
//!   queues and LRU maps; elements are preallocated regardless — the semantics are the same),
//!   and required for LPM_TRIE, as the kernel requires it (value slots are preallocated
//!   there too; nodes are allocated on update);
//!   nothing for ring buffers and prog arrays. Any other bit is refused, naming the field.
//!
//! # Epochs
//!
//! Hash elements that are replaced or deleted are reused only after a grace period of the
//! default `crossbeam_epoch` collector, and then after the runs in progress at its end when
//! the embedder registered its runs ([`set_run_grace`]; the packjit runtime does). The raw
//! lookups take no pin of their own: the caller (the runtime, around a program run) must be
//! pinned, or inside a registered run, while it uses a pointer a lookup returned. The
//! host-side API pins by itself.
//!
//! # Differences from the kernel
//!
//! * Ring-buffer `pg_off` counts pages from the start of the data area; the kernel counts
//!   from its `struct bpf_ringbuf`, three pages (header, consumer and producer pages)
//!   earlier. Only the kernel itself reads `pg_off`.
//! * Values carry no `bpf_spin_lock` (no BTF), so `BPF_F_LOCK` is refused with `-EINVAL`,
//!   as the kernel refuses it for such values.
//! * Hash elements are preallocated (`max_entries` plus spares), but a replaced, deleted or
//!   evicted element is reused only after its grace period, where the kernel reuses it at
//!   once. While threads stay pinned or runs last (long or preempted program runs), churn can use up the
//!   spares: a program's insert of a new key then fails with `-E2BIG` (LRU: `-ENOMEM`)
//!   although the map holds fewer than `max_entries` keys. Host-side updates from a thread
//!   that is not pinned wait (up to 2 s) for the grace period instead.
//! * Ring-buffer space: a reservation fails when the producer would get `size` or more bytes
//!   ahead of the consumer (or of the oldest busy record), as the kernel's `> mask` test,
//!   so a ring never fills completely (at most `size - 8` bytes of records).
//! * LPM trie nodes are allocated per update, as the kernel's, but values live in a
//!   preallocated slab of `max_entries` plus spare slots, reused after a grace period. While
//!   threads stay pinned, churn can use up the spares: a program's update of a new prefix
//!   then fails with `-ENOMEM` (the kernel's answer when its node allocation fails), and a
//!   replacement writes the old value in place; host updates wait (up to 2 s) instead.
//! * A non-per-CPU hash update of an existing key publishes a new element (no torn reads);
//!   only when every spare element is still waiting for its grace period (a program
//!   replacing keys in a loop under one pin) does it copy in place, as the kernel does for
//!   arrays and per-CPU maps.

#![warn(missing_docs)]

mod array;
mod error;
mod grace;
mod hash;
mod lpm;
mod mem;
mod queue;
mod ringbuf;

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub use error::{errno, MapError};
pub use grace::{set_run_grace, RunGrace};
pub use ringbuf::{BPF_RINGBUF_BUSY_BIT, BPF_RINGBUF_DISCARD_BIT, BPF_RINGBUF_HDR_SZ};

use error::errno::{E2BIG, EEXIST, EINVAL, ENOENT, ENOMEM, ENOSPC, ENOTSUPP};

/// Update flag: create or replace.
pub const BPF_ANY: u64 = 0;
/// Update flag: create only (`-EEXIST` if present).
pub const BPF_NOEXIST: u64 = 1;
/// Update flag: replace only (`-ENOENT` if absent); on a full queue/stack: drop the oldest.
pub const BPF_EXIST: u64 = 2;
/// Update flag: take the value's `bpf_spin_lock` (refused here: values have none).
pub const BPF_F_LOCK: u64 = 4;
/// Map flag: hash maps allocate on demand (accepted; elements are preallocated anyway).
/// Required by LPM tries, as in the kernel.
pub const BPF_F_NO_PREALLOC: u32 = 1;
/// Map flag: programs may only read the values (regions are reported read-only).
pub const BPF_F_RDONLY_PROG: u32 = 1 << 7;
/// Ring-buffer submit/output flag (ignored: there is no waiting consumer to wake).
pub const BPF_RB_NO_WAKEUP: u64 = 1;
/// Ring-buffer submit/output flag (ignored).
pub const BPF_RB_FORCE_WAKEUP: u64 = 2;
/// `bpf_ringbuf_query`: bytes between consumer and producer.
pub const BPF_RB_AVAIL_DATA: u64 = 0;
/// `bpf_ringbuf_query`: data area size.
pub const BPF_RB_RING_SIZE: u64 = 1;
/// `bpf_ringbuf_query`: consumer position.
pub const BPF_RB_CONS_POS: u64 = 2;
/// `bpf_ringbuf_query`: producer position.
pub const BPF_RB_PROD_POS: u64 = 3;

/// Largest hash key (the kernel's `MAX_BPF_STACK`).
pub const MAX_KEY_SIZE: u32 = 512;
/// Largest value of a non-per-CPU map.
pub const MAX_VALUE_SIZE: u32 = 1 << 20;
/// Largest value of a per-CPU map (the kernel's `PCPU_MIN_UNIT_SIZE`).
pub const MAX_PERCPU_VALUE_SIZE: u32 = 32 << 10;
/// Largest hash `max_entries` (bucket count stays a power of two in `u32`).
pub const MAX_HASH_ENTRIES: u32 = 1 << 31;

/// The key widths of [`Map::lookup_hash_word`]: `u32` and `u64`.
pub trait KeyWord: Copy + Eq + Into<u64> + sealed::Sealed {}
impl KeyWord for u32 {}
impl KeyWord for u64 {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

/// Kernel map type numbers (`enum bpf_map_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MapType {
    /// `BPF_MAP_TYPE_HASH`
    Hash = 1,
    /// `BPF_MAP_TYPE_ARRAY`
    Array = 2,
    /// `BPF_MAP_TYPE_PROG_ARRAY`
    ProgArray = 3,
    /// `BPF_MAP_TYPE_PERCPU_HASH`
    PercpuHash = 5,
    /// `BPF_MAP_TYPE_PERCPU_ARRAY`
    PercpuArray = 6,
    /// `BPF_MAP_TYPE_LRU_HASH`
    LruHash = 9,
    /// `BPF_MAP_TYPE_LRU_PERCPU_HASH`
    LruPercpuHash = 10,
    /// `BPF_MAP_TYPE_LPM_TRIE`
    LpmTrie = 11,
    /// `BPF_MAP_TYPE_QUEUE`
    Queue = 22,
    /// `BPF_MAP_TYPE_STACK`
    Stack = 23,
    /// `BPF_MAP_TYPE_RINGBUF`
    RingBuf = 27,
}

impl MapType {
    /// The type with kernel number `t`, if supported.
    pub fn from_raw(t: u32) -> Option<MapType> {
        use MapType::*;
        Some(match t {
            1 => Hash,
            2 => Array,
            3 => ProgArray,
            5 => PercpuHash,
            6 => PercpuArray,
            9 => LruHash,
            10 => LruPercpuHash,
            11 => LpmTrie,
            22 => Queue,
            23 => Stack,
            27 => RingBuf,
            _ => return None,
        })
    }

    /// The kernel's name, e.g. `BPF_MAP_TYPE_HASH`.
    pub fn name(self) -> &'static str {
        match self {
            MapType::Hash => "BPF_MAP_TYPE_HASH",
            MapType::Array => "BPF_MAP_TYPE_ARRAY",
            MapType::ProgArray => "BPF_MAP_TYPE_PROG_ARRAY",
            MapType::PercpuHash => "BPF_MAP_TYPE_PERCPU_HASH",
            MapType::PercpuArray => "BPF_MAP_TYPE_PERCPU_ARRAY",
            MapType::LruHash => "BPF_MAP_TYPE_LRU_HASH",
            MapType::LruPercpuHash => "BPF_MAP_TYPE_LRU_PERCPU_HASH",
            MapType::LpmTrie => "BPF_MAP_TYPE_LPM_TRIE",
            MapType::Queue => "BPF_MAP_TYPE_QUEUE",
            MapType::Stack => "BPF_MAP_TYPE_STACK",
            MapType::RingBuf => "BPF_MAP_TYPE_RINGBUF",
        }
    }

    /// Whether values exist once per possible CPU.
    pub fn is_per_cpu(self) -> bool {
        matches!(
            self,
            MapType::PercpuHash | MapType::PercpuArray | MapType::LruPercpuHash
        )
    }

    /// Map flags the kernel accepts for this type (of those packjit knows).
    fn allowed_flags(self) -> u32 {
        match self {
            MapType::Hash | MapType::PercpuHash | MapType::LpmTrie => {
                BPF_F_RDONLY_PROG | BPF_F_NO_PREALLOC
            }
            MapType::Array
            | MapType::PercpuArray
            | MapType::LruHash
            | MapType::LruPercpuHash
            | MapType::Queue
            | MapType::Stack => BPF_F_RDONLY_PROG,
            MapType::ProgArray | MapType::RingBuf => 0,
        }
    }
}

/// What a map is: the fields of `BPF_MAP_CREATE` packjit uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// Name, for errors.
    pub name: String,
    /// Type.
    pub map_type: MapType,
    /// Key bytes.
    pub key_size: u32,
    /// Value bytes (one CPU's, for per-CPU maps).
    pub value_size: u32,
    /// Capacity (ring buffer: data area bytes).
    pub max_entries: u32,
    /// `BPF_F_*` map flags.
    pub flags: u32,
}

/// Where an ARRAY / PERCPU_ARRAY keeps its values, for lookups the JIT inlines: value
/// `i` of CPU `c` is at `base + c * cpu_stride + i * value_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayLayout {
    /// First value (8-byte aligned).
    pub base: *mut u8,
    /// `round_up(value_size, 8)`, the kernel's `elem_size`.
    pub value_stride: u64,
    /// Number of values per CPU.
    pub max_entries: u32,
    /// Bytes between two CPUs' copies of the array; 0 for ARRAY.
    pub cpu_stride: u64,
    /// Copies: `possible_cpus()` for PERCPU_ARRAY, 1 for ARRAY.
    pub cpus: u32,
}

enum Kind {
    Array(array::ArrayMap),
    Hash(Arc<hash::HashTable>),
    Lpm(Box<lpm::LpmTrie>),
    Queue(queue::QueueMap),
    RingBuf(Box<ringbuf::RingBuf>),
    Prog(ProgSlots),
}

/// A prog array's `max_entries` slots (what it derefs to), padded with slots that stay empty
/// up to a power of two when that is at most [`PROG_PAD_MAX`]: an inlined tail call in
/// sandboxed code then bounds its index against speculation with one `and`
/// ([`Map::prog_index_slots`]), as the kernel pads its arrays for unprivileged programs.
struct ProgSlots {
    all: Box<[AtomicU64]>,
    len: usize,
}

/// The largest padded prog array (slots).
const PROG_PAD_MAX: u32 = 1 << 16;

impl std::ops::Deref for ProgSlots {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        &self.all[..self.len]
    }
}

/// One eBPF map. Created behind an `Arc`; `Send + Sync`; every operation may run
/// concurrently with every other, from programs and the host alike.
pub struct Map {
    /// A word-keyed HASH / LRU_HASH's copy of what its programs' lookups read
    /// ([`Map::lookup_hash_word`]); unused for other maps.
    word: hash::WordLookup,
    spec: MapSpec,
    kind: Kind,
    /// `possible_cpus()` for per-CPU maps, 1 otherwise.
    cpus: usize,
}

fn rc(e: i32) -> i64 {
    -(e as i64)
}

fn round8(n: usize) -> usize {
    mem::round8(n)
}

/// Checks a spec against the kernel's rules and packjit's limits.
fn validate(spec: &MapSpec) -> Result<(), MapError> {
    let t = spec.map_type;
    let map = || spec.name.clone();
    let invalid = |field: &'static str, reason: String| MapError::InvalidSpec {
        map: map(),
        field,
        reason,
    };
    let too_big = |field: &'static str, value: u32, limit: u32| MapError::TooBig {
        map: map(),
        field,
        value: value as u64,
        limit: limit as u64,
    };
    let unknown = spec.flags & !t.allowed_flags();
    if unknown != 0 {
        return Err(invalid(
            "flags",
            format!(
                "{unknown:#x} not accepted for {} (accepted: {:#x})",
                t.name(),
                t.allowed_flags()
            ),
        ));
    }
    if spec.max_entries == 0 {
        return Err(invalid("max_entries", "must be at least 1".into()));
    }
    let value_limit = if t.is_per_cpu() {
        MAX_PERCPU_VALUE_SIZE
    } else {
        MAX_VALUE_SIZE
    };
    let need_key = |k: u32| {
        if spec.key_size != k {
            Err(invalid(
                "key_size",
                format!("must be {k} for {}, got {}", t.name(), spec.key_size),
            ))
        } else {
            Ok(())
        }
    };
    let need_value = || {
        if spec.value_size == 0 {
            Err(invalid(
                "value_size",
                format!("must be at least 1 for {}", t.name()),
            ))
        } else if spec.value_size > value_limit {
            Err(too_big("value_size", spec.value_size, value_limit))
        } else {
            Ok(())
        }
    };
    match t {
        MapType::Array | MapType::PercpuArray => {
            need_key(4)?;
            need_value()?;
        }
        MapType::ProgArray => {
            need_key(4)?;
            if spec.value_size != 4 {
                return Err(invalid(
                    "value_size",
                    format!("must be 4 for {}, got {}", t.name(), spec.value_size),
                ));
            }
        }
        MapType::Hash | MapType::PercpuHash | MapType::LruHash | MapType::LruPercpuHash => {
            if spec.key_size == 0 {
                return Err(invalid(
                    "key_size",
                    format!("must be at least 1 for {}", t.name()),
                ));
            }
            if spec.key_size > MAX_KEY_SIZE {
                return Err(too_big("key_size", spec.key_size, MAX_KEY_SIZE));
            }
            need_value()?;
            if spec.max_entries > MAX_HASH_ENTRIES {
                return Err(too_big("max_entries", spec.max_entries, MAX_HASH_ENTRIES));
            }
        }
        MapType::LpmTrie => {
            // The kernel's trie_alloc: every refusal is EINVAL.
            if spec.flags & BPF_F_NO_PREALLOC == 0 {
                return Err(invalid(
                    "flags",
                    format!(
                        "{} requires BPF_F_NO_PREALLOC ({BPF_F_NO_PREALLOC:#x})",
                        t.name()
                    ),
                ));
            }
            let keys = 4 + lpm::DATA_SIZE_MIN..=4 + lpm::DATA_SIZE_MAX;
            if !keys.contains(&spec.key_size) {
                return Err(invalid(
                    "key_size",
                    format!(
                        "must be {}..={} for {} (a u32 prefixlen and 1..=256 data bytes), got {}",
                        keys.start(),
                        keys.end(),
                        t.name(),
                        spec.key_size
                    ),
                ));
            }
            if !(1..=MAX_VALUE_SIZE).contains(&spec.value_size) {
                return Err(invalid(
                    "value_size",
                    format!(
                        "must be 1..={MAX_VALUE_SIZE} for {}, got {}",
                        t.name(),
                        spec.value_size
                    ),
                ));
            }
            if spec.max_entries > MAX_HASH_ENTRIES {
                return Err(too_big("max_entries", spec.max_entries, MAX_HASH_ENTRIES));
            }
        }
        MapType::Queue | MapType::Stack => {
            need_key(0)?;
            need_value()?;
        }
        MapType::RingBuf => {
            need_key(0)?;
            if spec.value_size != 0 {
                return Err(invalid(
                    "value_size",
                    format!("must be 0 for {}, got {}", t.name(), spec.value_size),
                ));
            }
            let page = mem::page_size() as u32;
            if !spec.max_entries.is_power_of_two() || spec.max_entries % page != 0 {
                return Err(invalid(
                    "max_entries",
                    format!(
                        "ring buffer size {} must be a power of two and a multiple of the page size {page}",
                        spec.max_entries
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Map {
    /// Creates a map after validating its spec (see the crate docs' limits). Per-CPU maps
    /// hold `possible_cpus()` copies of each value.
    pub fn new(spec: MapSpec) -> Result<Arc<Map>, MapError> {
        validate(&spec)?;
        let t = spec.map_type;
        let cpus = if t.is_per_cpu() {
            Self::possible_cpus()
        } else {
            1
        };
        let oom = |e: mem::AllocError| MapError::NoMemory {
            map: spec.name.clone(),
            bytes: e.bytes,
        };
        let kind = match t {
            MapType::Array | MapType::PercpuArray => Kind::Array(
                array::ArrayMap::new(spec.value_size, spec.max_entries, t.is_per_cpu(), cpus)
                    .map_err(oom)?,
            ),
            MapType::Hash | MapType::PercpuHash | MapType::LruHash | MapType::LruPercpuHash => {
                Kind::Hash(Arc::new(
                    hash::HashTable::new(
                        &spec.name,
                        spec.key_size,
                        spec.value_size,
                        spec.max_entries,
                        t.is_per_cpu(),
                        matches!(t, MapType::LruHash | MapType::LruPercpuHash),
                        cpus,
                    )
                    .map_err(oom)?,
                ))
            }
            MapType::Queue | MapType::Stack => Kind::Queue(
                queue::QueueMap::new(spec.value_size, spec.max_entries, t == MapType::Stack)
                    .map_err(oom)?,
            ),
            MapType::RingBuf => {
                let os = |(call, errno)| MapError::Os {
                    map: spec.name.clone(),
                    call,
                    errno,
                };
                Kind::RingBuf(Box::new(
                    ringbuf::RingBuf::new(spec.max_entries as usize).map_err(os)?,
                ))
            }
            MapType::LpmTrie => Kind::Lpm(Box::new(
                lpm::LpmTrie::new(spec.key_size, spec.value_size, spec.max_entries).map_err(oom)?,
            )),
            MapType::ProgArray => {
                let all = match spec.max_entries {
                    n @ 1..=PROG_PAD_MAX => n.next_power_of_two(),
                    n => n,
                } as usize;
                let mut v = Vec::new();
                v.try_reserve_exact(all).map_err(|_| {
                    oom(mem::AllocError {
                        bytes: all as u64 * 8,
                    })
                })?;
                v.resize_with(all, || AtomicU64::new(0));
                Kind::Prog(ProgSlots {
                    all: v.into_boxed_slice(),
                    len: spec.max_entries as usize,
                })
            }
        };
        let word = match &kind {
            Kind::Hash(h) => h.word_lookup(),
            _ => hash::WordLookup::NONE,
        };
        Ok(Arc::new(Map {
            word,
            spec,
            kind,
            cpus,
        }))
    }

    /// The spec the map was created with.
    pub fn spec(&self) -> &MapSpec {
        &self.spec
    }

    /// Number of CPU ids a thread can report (`sysconf(_SC_NPROCESSORS_CONF)`, which is
    /// glibc's and musl's `get_nprocs_conf`), cached; at least 1.
    pub fn possible_cpus() -> usize {
        static CPUS: OnceLock<usize> = OnceLock::new();
        // SAFETY: sysconf has no preconditions.
        *CPUS.get_or_init(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
    }

    /// This CPU's copy: `cpu` folded into range for per-CPU maps, 0 otherwise. The common
    /// cases (in range, or a shared map) cost a compare, not a division.
    #[inline(always)]
    fn cpu_index(&self, cpu: u32) -> usize {
        let c = cpu as usize;
        if c < self.cpus {
            c
        } else if self.cpus == 1 {
            0
        } else {
            c % self.cpus
        }
    }

    // ---- program side --------------------------------------------------------------------

    /// `bpf_map_lookup_elem`: this CPU's value pointer, or null (also for queue, stack, ring
    /// buffer and prog array).
    ///
    /// # Safety
    /// `key` points to `key_size` readable bytes. For hash maps the caller is pinned on the
    /// default `crossbeam_epoch` collector while it uses the returned pointer.
    #[inline(always)]
    pub unsafe fn lookup_raw(&self, key: *const u8, cpu: u32) -> *mut u8 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Hash(h) => unsafe { h.lookup(key, self.cpu_index(cpu)) },
            // SAFETY: forwarded from the caller.
            Kind::Array(a) => unsafe { a.lookup(key, self.cpu_index(cpu)) },
            // SAFETY: forwarded from the caller.
            Kind::Lpm(t) => unsafe { t.lookup(key) },
            _ => ptr::null_mut(),
        }
    }

    /// Whether [`Map::lookup_hash_word`] serves this map with `W`-sized keys: a `HASH` or
    /// `LRU_HASH` (values shared by all CPUs) whose keys are `size_of::<W>()` bytes.
    pub fn is_hash_word<W: KeyWord>(&self) -> bool {
        matches!(&self.kind, Kind::Hash(h) if h.is_shared_word::<W>())
    }

    /// `bpf_map_lookup_elem` for a map [`Map::is_hash_word`] accepted, for callers that
    /// checked that once (a program's call site bound to this map): the value pointer or
    /// null, with no dispatch on the key size and no CPU id.
    ///
    /// # Safety
    /// As [`Map::lookup_raw`]; `self.is_hash_word::<W>()`.
    #[inline(always)]
    pub unsafe fn lookup_hash_word<W: KeyWord>(&self, key: *const u8) -> *mut u8 {
        debug_assert!(self.is_hash_word::<W>());
        // SAFETY: forwarded from the caller; `word` is this hash map's copy (its table
        // lives as long as self).
        unsafe {
            self.word
                .lookup::<W>(key, || self.hash_word_slow::<W, false>(key))
        }
    }

    /// The table's own word lookup, for the cases [`hash::WordLookup::lookup`] leaves to
    /// it (chains, a slot replaced while read): out of line, so the common path keeps
    /// no registers of the caller's to save.
    ///
    /// # Safety
    /// As [`Map::lookup_hash_word`].
    #[cold]
    #[inline(never)]
    unsafe fn hash_word_slow<W: KeyWord, const CLAMP: bool>(&self, key: *const u8) -> *mut u8 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Hash(h) => unsafe { h.lookup_shared_word::<W, CLAMP>(key) },
            _ => ptr::null_mut(),
        }
    }

    /// [`Map::lookup_hash_word`] whose address stays in the value memory under
    /// misspeculation, for sandboxed code that accesses the value unchecked after its own
    /// NULL test: the common path computes it from the element's link, which addresses the
    /// value slab (its padding slot for 0) whatever the link; the rare path from the element
    /// index clamped into the pool before the NULL test (a `min`: `cmov` on x86-64, `csel`
    /// on arm64).
    ///
    /// # Safety
    /// As [`Map::lookup_hash_word`].
    #[inline(always)]
    pub unsafe fn lookup_hash_word_in_pool<W: KeyWord>(&self, key: *const u8) -> *mut u8 {
        debug_assert!(self.is_hash_word::<W>());
        // SAFETY: as in `lookup_hash_word`; the fast path's addresses are in the slab
        // for any link (see `WordLookup::lookup`), the slow one clamps.
        unsafe {
            self.word
                .lookup::<W>(key, || self.hash_word_slow::<W, true>(key))
        }
    }

    /// `bpf_map_lookup_percpu_elem`: CPU `cpu`'s value, null if `cpu >= possible_cpus()` or
    /// the map is not per-CPU.
    ///
    /// # Safety
    /// As [`Map::lookup_raw`].
    pub unsafe fn lookup_percpu_raw(&self, key: *const u8, cpu: u32) -> *mut u8 {
        if !self.spec.map_type.is_per_cpu() || cpu as usize >= self.cpus {
            return ptr::null_mut();
        }
        // SAFETY: forwarded from the caller; cpu is in range.
        unsafe { self.lookup_raw(key, cpu) }
    }

    /// `bpf_map_update_elem` from a program: 0 or -errno, by the kernel's rules. Per-CPU
    /// maps: only this CPU's value is written (a new element gets zeroes on other CPUs).
    ///
    /// # Safety
    /// `key` points to `key_size` and `value` to `value_size` readable bytes; the caller is
    /// pinned as for [`Map::lookup_raw`].
    pub unsafe fn update_raw(&self, key: *const u8, value: *const u8, flags: u64, cpu: u32) -> i64 {
        let cpu = self.cpu_index(cpu);
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Hash(h) => unsafe { h.update(key, value, flags, Some(cpu)) },
            // SAFETY: forwarded from the caller.
            Kind::Array(a) => unsafe { a.update(key, value, flags, Some(cpu)) },
            // SAFETY: forwarded from the caller.
            Kind::Lpm(t) => unsafe { t.update(key, value, flags, false) },
            Kind::RingBuf(_) => rc(ENOTSUPP),
            // Queues take push_elem; prog arrays are updated by the host only.
            Kind::Queue(_) | Kind::Prog(_) => rc(EINVAL),
        }
    }

    /// `bpf_map_delete_elem`: arrays -EINVAL; hashes -ENOENT if absent; prog arrays clear
    /// the slot (-E2BIG out of range, -ENOENT if empty).
    ///
    /// # Safety
    /// `key` points to `key_size` readable bytes.
    pub unsafe fn delete_raw(&self, key: *const u8) -> i64 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Hash(h) => unsafe { h.delete(key) },
            // SAFETY: forwarded from the caller.
            Kind::Lpm(t) => unsafe { t.delete(key) },
            Kind::Array(_) | Kind::Queue(_) => rc(EINVAL),
            Kind::RingBuf(_) => rc(ENOTSUPP),
            Kind::Prog(slots) => {
                // SAFETY: 4 readable bytes.
                let i = unsafe { key.cast::<u32>().read_unaligned() } as usize;
                match slots.get(i) {
                    None => rc(E2BIG),
                    Some(s) if s.swap(0, Ordering::AcqRel) == 0 => rc(ENOENT),
                    Some(_) => 0,
                }
            }
        }
    }

    /// `bpf_map_push_elem`: queue/stack only (-EINVAL otherwise).
    ///
    /// # Safety
    /// `value` points to `value_size` readable bytes.
    pub unsafe fn push_raw(&self, value: *const u8, flags: u64) -> i64 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Queue(q) => unsafe { q.push(value, flags) },
            _ => rc(EINVAL),
        }
    }

    /// `bpf_map_pop_elem`: -ENOENT when empty.
    ///
    /// # Safety
    /// `value` points to `value_size` writable bytes.
    pub unsafe fn pop_raw(&self, value: *mut u8) -> i64 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Queue(q) => unsafe { q.take(value, true) },
            _ => rc(EINVAL),
        }
    }

    /// `bpf_map_peek_elem`: -ENOENT when empty.
    ///
    /// # Safety
    /// `value` points to `value_size` writable bytes.
    pub unsafe fn peek_raw(&self, value: *mut u8) -> i64 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Queue(q) => unsafe { q.take(value, false) },
            _ => rc(EINVAL),
        }
    }

    /// `bpf_ringbuf_reserve`: a pointer to `size` writable bytes inside the data area, or
    /// null (flags != 0, no room, not a ring buffer).
    ///
    /// # Safety
    /// None beyond Rust's; unsafe because the pointer must be given back exactly once to
    /// submit or discard, or the ring stalls at this record.
    pub unsafe fn ringbuf_reserve_raw(&self, size: u64, flags: u64) -> *mut u8 {
        match &self.kind {
            Kind::RingBuf(r) => r.reserve(size, flags),
            _ => ptr::null_mut(),
        }
    }

    /// `bpf_ringbuf_submit` (wake-up flags ignored).
    ///
    /// # Safety
    /// `data` was returned by [`Map::ringbuf_reserve_raw`] of this map and not yet
    /// submitted or discarded (other pointers are ignored).
    pub unsafe fn ringbuf_submit_raw(&self, data: *mut u8, _flags: u64) {
        if let Kind::RingBuf(r) = &self.kind {
            r.commit(data, false);
        }
    }

    /// `bpf_ringbuf_discard` (wake-up flags ignored).
    ///
    /// # Safety
    /// As [`Map::ringbuf_submit_raw`].
    pub unsafe fn ringbuf_discard_raw(&self, data: *mut u8, _flags: u64) {
        if let Kind::RingBuf(r) = &self.kind {
            r.commit(data, true);
        }
    }

    /// `bpf_ringbuf_output`: 0, -EAGAIN when there is no room, -EINVAL for unknown flags.
    ///
    /// # Safety
    /// `data` points to `size` readable bytes.
    pub unsafe fn ringbuf_output_raw(&self, data: *const u8, size: u64, flags: u64) -> i64 {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::RingBuf(r) => unsafe { r.output(data, size, flags) },
            _ => rc(EINVAL),
        }
    }

    /// `bpf_ringbuf_query`: `BPF_RB_AVAIL_DATA`, `RING_SIZE`, `CONS_POS`, `PROD_POS`; 0 for
    /// other flags or maps.
    pub fn ringbuf_query(&self, flags: u64) -> u64 {
        match &self.kind {
            Kind::RingBuf(r) => r.query(flags),
            _ => 0,
        }
    }

    // ---- sandbox regions -----------------------------------------------------------------

    /// `(start, len, writable)` of each block of value memory a program may reach through
    /// pointers from this map: array values, the hash value slab, the ring buffer's data
    /// area (both views). Keys, chain links, free lists and positions are elsewhere, so an
    /// overrun from a value reaches only other values of this map. Read-only under
    /// `BPF_F_RDONLY_PROG` (ring buffers are always writable).
    pub fn value_regions(&self) -> Vec<(*mut u8, usize, bool)> {
        let writable = self.spec.flags & BPF_F_RDONLY_PROG == 0;
        match &self.kind {
            Kind::Array(a) => vec![(a.base(), a.bytes(), writable)],
            Kind::Hash(h) => {
                let (p, n) = h.values_region();
                vec![(p, n, writable)]
            }
            Kind::Lpm(t) => {
                let (p, n) = t.values_region();
                vec![(p, n, writable)]
            }
            Kind::RingBuf(r) => {
                let (p, n) = r.region();
                vec![(p, n, true)]
            }
            Kind::Queue(_) | Kind::Prog(_) => Vec::new(),
        }
    }

    /// The layout of an ARRAY / PERCPU_ARRAY for inlined lookups; `None` for other types.
    pub fn array_layout(&self) -> Option<ArrayLayout> {
        match &self.kind {
            Kind::Array(a) => Some(ArrayLayout {
                base: a.base(),
                value_stride: a.stride() as u64,
                max_entries: a.max_entries(),
                cpu_stride: a.cpu_stride() as u64,
                cpus: a.cpus() as u32,
            }),
            _ => None,
        }
    }

    // ---- host side -----------------------------------------------------------------------

    fn err(&self, code: i64, what: &'static str) -> MapError {
        let map = self.spec.name.clone();
        match -code as i32 {
            ENOENT => MapError::NotFound { map },
            EEXIST => MapError::Exists { map },
            E2BIG => MapError::Full { map, reason: what },
            ENOSPC => MapError::NoSpace { map },
            ENOMEM => MapError::NoMemory { map, bytes: 0 },
            ENOTSUPP => MapError::NotSupported { map, op: what },
            _ => MapError::InvalidArgument {
                map,
                reason: format!("{what}: invalid flags or arguments"),
            },
        }
    }

    fn check(&self, code: i64, what: &'static str) -> Result<(), MapError> {
        if code == 0 {
            Ok(())
        } else {
            Err(self.err(code, what))
        }
    }

    fn check_len(&self, what: &'static str, got: usize, want: usize) -> Result<(), MapError> {
        if got == want {
            Ok(())
        } else {
            Err(MapError::InvalidArgument {
                map: self.spec.name.clone(),
                reason: format!("{what} is {got} bytes, the map takes {want}"),
            })
        }
    }

    /// Bytes of a value as the host exchanges it: per-CPU maps `possible_cpus()` values each
    /// rounded up to 8 (the syscall API's layout), else `value_size`.
    pub fn host_value_size(&self) -> usize {
        if self.spec.map_type.is_per_cpu() {
            self.cpus * round8(self.spec.value_size as usize)
        } else {
            self.spec.value_size as usize
        }
    }

    fn unsupported(&self, op: &'static str) -> MapError {
        MapError::NotSupported {
            map: self.spec.name.clone(),
            op,
        }
    }

    /// `BPF_MAP_LOOKUP_ELEM`: a copy of the value (per-CPU: every CPU's); queue/stack: peek.
    pub fn lookup(&self, key: &[u8]) -> Result<Vec<u8>, MapError> {
        self.check_len("key", key.len(), self.spec.key_size as usize)?;
        match &self.kind {
            Kind::Hash(h) => h.read(key).ok_or_else(|| self.err(rc(ENOENT), "lookup")),
            Kind::Lpm(t) => t.read(key).ok_or_else(|| self.err(rc(ENOENT), "lookup")),
            Kind::Array(a) => {
                let i = u32::from_ne_bytes(key.try_into().expect("length checked"));
                if i >= a.max_entries() {
                    return Err(self.err(rc(ENOENT), "lookup"));
                }
                Ok(a.read(i))
            }
            Kind::Queue(_) => self.peek(),
            Kind::RingBuf(_) | Kind::Prog(_) => Err(self.unsupported("lookup")),
        }
    }

    /// `BPF_MAP_UPDATE_ELEM` with the kernel's flag rules (per-CPU: every CPU's value);
    /// queue/stack: push.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        self.check_len("key", key.len(), self.spec.key_size as usize)?;
        self.check_len("value", value.len(), self.host_value_size())?;
        let code = match &self.kind {
            // SAFETY: lengths checked above.
            Kind::Hash(h) => unsafe { h.update(key.as_ptr(), value.as_ptr(), flags, None) },
            // SAFETY: lengths checked above.
            Kind::Array(a) => unsafe { a.update(key.as_ptr(), value.as_ptr(), flags, None) },
            // SAFETY: lengths checked above.
            Kind::Lpm(t) => unsafe { t.update(key.as_ptr(), value.as_ptr(), flags, true) },
            Kind::Queue(_) => return self.push(value, flags),
            Kind::RingBuf(_) => return Err(self.unsupported("update")),
            Kind::Prog(_) => {
                return Err(MapError::InvalidArgument {
                    map: self.spec.name.clone(),
                    reason: "prog array slots are set with set_prog_slot".into(),
                })
            }
        };
        self.check(code, "update: map full or index >= max_entries")
    }

    /// `BPF_MAP_DELETE_ELEM`.
    pub fn delete(&self, key: &[u8]) -> Result<(), MapError> {
        self.check_len("key", key.len(), self.spec.key_size as usize)?;
        // SAFETY: length checked above; delete pins internally where it needs to.
        let code = unsafe { self.delete_raw(key.as_ptr()) };
        self.check(code, "delete")
    }

    /// `BPF_MAP_GET_NEXT_KEY`: `None` or a missing key gives the first key; after the last,
    /// `NotFound`. Arrays go in index order, hashes in bucket order, LPM tries in the
    /// kernel's postorder (a prefix after every longer prefix it covers; otherwise the 0 bit
    /// before the 1 bit where two prefixes first differ).
    pub fn next_key(&self, key: Option<&[u8]>) -> Result<Vec<u8>, MapError> {
        if let Some(k) = key {
            self.check_len("key", k.len(), self.spec.key_size as usize)?;
        }
        let next = match &self.kind {
            Kind::Hash(h) => h.next_key(key),
            Kind::Lpm(t) => t.next_key(key),
            Kind::Array(a) => a
                .next_key(key.map(|k| u32::from_ne_bytes(k.try_into().expect("length checked"))))
                .map(|i| i.to_ne_bytes().to_vec()),
            Kind::Prog(slots) => {
                let i = key.map(|k| u32::from_ne_bytes(k.try_into().expect("length checked")));
                match i {
                    Some(i) if (i as usize) < slots.len() => {
                        (i as usize + 1 < slots.len()).then(|| (i + 1).to_ne_bytes().to_vec())
                    }
                    _ => Some(0u32.to_ne_bytes().to_vec()),
                }
            }
            Kind::Queue(_) | Kind::RingBuf(_) => return Err(self.unsupported("next_key")),
        };
        next.ok_or_else(|| self.err(rc(ENOENT), "next_key"))
    }

    /// Every key, each once (hashes: bucket order, LPM tries: postorder, as `next_key`
    /// walks them; arrays and prog arrays: every index). Empty for queues, stacks and ring
    /// buffers.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        match &self.kind {
            Kind::Hash(h) => h.keys(),
            Kind::Lpm(t) => t.keys(),
            Kind::Array(a) => (0..a.max_entries())
                .map(|i| i.to_ne_bytes().to_vec())
                .collect(),
            Kind::Prog(s) => (0..s.len() as u32)
                .map(|i| i.to_ne_bytes().to_vec())
                .collect(),
            Kind::Queue(_) | Kind::RingBuf(_) => Vec::new(),
        }
    }

    /// Elements: hashes and LPM tries their count, arrays and prog arrays `max_entries` (every index
    /// exists), queues/stacks the values held, ring buffers 0.
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Hash(h) => h.len(),
            Kind::Lpm(t) => t.len(),
            Kind::Array(a) => a.max_entries() as usize,
            Kind::Prog(s) => s.len(),
            Kind::Queue(q) => q.len(),
            Kind::RingBuf(_) => 0,
        }
    }

    /// `len() == 0`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `bpf_for_each_map_elem` for arrays and hashes: calls `f(key, CPU cpu's value)` until
    /// it returns false; returns the elements visited, the stopping one included (as the
    /// kernel). Hash keys are passed as a pointer to a copy, valid during the call. 0 for
    /// other map types (LPM tries included: the kernel's trie has no `for_each` either).
    ///
    /// # Safety
    /// The callback gets raw pointers: it may read `key_size` bytes at the key and read or
    /// write `value_size` bytes at the value, during the call only.
    pub unsafe fn for_each_raw(
        &self,
        cpu: u32,
        f: &mut dyn FnMut(*const u8, *mut u8) -> bool,
    ) -> u64 {
        let cpu = self.cpu_index(cpu);
        match &self.kind {
            Kind::Hash(h) => h.for_each(cpu, f),
            Kind::Array(a) => a.for_each(cpu, f),
            _ => 0,
        }
    }

    /// One step of `bpf_for_each_map_elem` over a hash map (HASH, PERCPU_HASH and the LRU
    /// flavours) run in a program: the element after `cursor` (0 starts), its key copied
    /// to `key_out`, this CPU's value returned with the cursor to pass next; null at the
    /// end and for other map types. An element the callback deletes does not end or skip
    /// the walk (it goes on from the deleted element's link, as the kernel's RCU walk).
    ///
    /// # Safety
    /// `key_out` has `key_size` writable bytes; the caller is pinned on the default
    /// `crossbeam_epoch` collector from the first step until it no longer uses any value.
    pub unsafe fn iter_next_raw(&self, cursor: u64, key_out: *mut u8, cpu: u32) -> (*mut u8, u64) {
        match &self.kind {
            // SAFETY: forwarded from the caller.
            Kind::Hash(h) => unsafe { h.iter_next(cursor, key_out, self.cpu_index(cpu)) },
            _ => (ptr::null_mut(), cursor),
        }
    }

    /// Safe [`Map::for_each_raw`] on CPU 0's values: `f(key, value pointer)`.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], *mut u8) -> bool) -> u64 {
        let ks = self.spec.key_size as usize;
        // SAFETY: the key pointer the map passes has key_size readable bytes for the call.
        unsafe { self.for_each_raw(0, &mut |k, v| f(std::slice::from_raw_parts(k, ks), v)) }
    }

    /// Queue/stack push (`BPF_EXIST` on a full map drops the oldest value).
    pub fn push(&self, value: &[u8], flags: u64) -> Result<(), MapError> {
        self.check_len("value", value.len(), self.spec.value_size as usize)?;
        match &self.kind {
            Kind::Queue(q) => {
                // SAFETY: length checked above.
                let code = unsafe { q.push(value.as_ptr(), flags) };
                self.check(code, "push: queue full")
            }
            _ => Err(self.unsupported("push")),
        }
    }

    fn take(&self, remove: bool) -> Result<Vec<u8>, MapError> {
        match &self.kind {
            Kind::Queue(q) => {
                let mut v = vec![0u8; self.spec.value_size as usize];
                // SAFETY: v has value_size writable bytes.
                self.check(unsafe { q.take(v.as_mut_ptr(), remove) }, "pop")?;
                Ok(v)
            }
            _ => Err(self.unsupported(if remove { "pop" } else { "peek" })),
        }
    }

    /// Queue: the oldest value, removed; stack: the newest. `NotFound` when empty.
    pub fn pop(&self) -> Result<Vec<u8>, MapError> {
        self.take(true)
    }

    /// As [`Map::pop`] without removing.
    pub fn peek(&self) -> Result<Vec<u8>, MapError> {
        self.take(false)
    }

    /// Ring-buffer consumer: delivers every submitted record in order, skips discarded
    /// ones, stops at the first record still reserved; returns the records delivered. The
    /// consumer position advances (Release) after each record, so producers see the space.
    pub fn ringbuf_consume(&self, f: &mut dyn FnMut(&[u8])) -> usize {
        match &self.kind {
            Kind::RingBuf(r) => r.consume(f),
            _ => 0,
        }
    }

    /// A prog array's slots, for code that reads them itself (an inlined tail call): the
    /// first slot and their number. The slots live as long as the map; each is written
    /// with release ordering ([`Self::set_prog_slot`]). `None` for other map types.
    pub fn prog_slots(&self) -> Option<(*const AtomicU64, u32)> {
        match &self.kind {
            Kind::Prog(s) => Some((s.as_ptr(), s.len() as u32)),
            _ => None,
        }
    }

    /// For a prog array whose slots are padded: the slots readable from
    /// [`prog_slots`](Self::prog_slots), a power of two (those from `max_entries` on stay
    /// empty), so an index masked by it minus one reads a slot, maybe empty. 0 otherwise.
    pub fn prog_index_slots(&self) -> u32 {
        match &self.kind {
            Kind::Prog(s) if s.all.len().is_power_of_two() => s.all.len() as u32,
            _ => 0,
        }
    }

    /// The token in prog-array slot `index` (Acquire), 0 if empty or out of range.
    pub fn prog_slot(&self, index: u32) -> u64 {
        match &self.kind {
            // Acquire pairs with set_prog_slot's release: whatever the runtime published
            // before storing the token is visible to the tail call that loads it.
            Kind::Prog(s) => s
                .get(index as usize)
                .map_or(0, |s| s.load(Ordering::Acquire)),
            _ => 0,
        }
    }

    /// Sets prog-array slot `index` (0 empties it) and returns the old token.
    pub fn set_prog_slot(&self, index: u32, token: u64) -> Result<u64, MapError> {
        match &self.kind {
            Kind::Prog(s) => match s.get(index as usize) {
                Some(slot) => Ok(slot.swap(token, Ordering::AcqRel)),
                None => Err(self.err(rc(E2BIG), "set_prog_slot: index >= max_entries")),
            },
            _ => Err(self.unsupported("set_prog_slot")),
        }
    }
}

impl std::fmt::Debug for Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("spec", &self.spec)
            .field("len", &self.len())
            .finish()
    }
}
