//! Errors of map creation and of the host-side operations.

use std::fmt;

/// Positive errno values the maps report, as the kernel's `bpf(2)` and helpers do.
pub mod errno {
    /// No such key / the queue is empty.
    pub const ENOENT: i32 = 2;
    /// Map full, array index out of range, or a size above its limit.
    pub const E2BIG: i32 = 7;
    /// Ring buffer out of space (`bpf_ringbuf_output`).
    pub const EAGAIN: i32 = 11;
    /// Out of memory (also: an LRU map that found nothing to evict).
    pub const ENOMEM: i32 = 12;
    /// LPM trie full (`bpf_map_update_elem` of a new prefix at `max_entries`).
    pub const ENOSPC: i32 = 28;
    /// Key already present (`BPF_NOEXIST`).
    pub const EEXIST: i32 = 17;
    /// Invalid argument: flags, sizes, operation on the wrong map type.
    pub const EINVAL: i32 = 22;
    /// The kernel's internal `ENOTSUPP`, which `bpf(2)` passes to user space unchanged for
    /// operations a map type does not have (e.g. lookup on a ring buffer).
    pub const ENOTSUPP: i32 = 524;
}

/// Errors of map creation and host operations. Every variant names the map; `Display`
/// also names the field or the cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapError {
    /// A `MapSpec` field the map type does not accept (`EINVAL`).
    InvalidSpec {
        /// Map name.
        map: String,
        /// `MapSpec` field: `key_size`, `value_size`, `max_entries`, `flags`.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A `MapSpec` size above its documented limit (`E2BIG`, as the kernel).
    TooBig {
        /// Map name.
        map: String,
        /// `MapSpec` field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted value.
        limit: u64,
    },
    /// The map's memory could not be allocated (`ENOMEM`).
    NoMemory {
        /// Map name.
        map: String,
        /// Bytes requested (saturated on overflow).
        bytes: u64,
    },
    /// A system call needed to create the map failed (ring buffer: `memfd_create`, `mmap`).
    Os {
        /// Map name.
        map: String,
        /// The call that failed.
        call: &'static str,
        /// Its errno.
        errno: i32,
    },
    /// No such key, or the queue/stack is empty (`ENOENT`).
    NotFound {
        /// Map name.
        map: String,
    },
    /// The key exists and `BPF_NOEXIST` was given (`EEXIST`).
    Exists {
        /// Map name.
        map: String,
    },
    /// No room: hash/queue full, or array index `>= max_entries` (`E2BIG`).
    Full {
        /// Map name.
        map: String,
        /// What had no room.
        reason: &'static str,
    },
    /// No room for a new prefix in an LPM trie (`ENOSPC`, as the kernel's trie returns
    /// where the hash maps return `E2BIG`).
    NoSpace {
        /// Map name.
        map: String,
    },
    /// Flags, key or value length not accepted (`EINVAL`).
    InvalidArgument {
        /// Map name.
        map: String,
        /// What was wrong.
        reason: String,
    },
    /// The map type has no such operation (`ENOTSUPP`, 524, as the kernel returns it).
    NotSupported {
        /// Map name.
        map: String,
        /// The operation.
        op: &'static str,
    },
}

impl MapError {
    /// The positive errno the kernel reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            MapError::InvalidSpec { .. } | MapError::InvalidArgument { .. } => errno::EINVAL,
            MapError::TooBig { .. } | MapError::Full { .. } => errno::E2BIG,
            MapError::NoMemory { .. } => errno::ENOMEM,
            MapError::Os { errno, .. } => *errno,
            MapError::NotFound { .. } => errno::ENOENT,
            MapError::NoSpace { .. } => errno::ENOSPC,
            MapError::Exists { .. } => errno::EEXIST,
            MapError::NotSupported { .. } => errno::ENOTSUPP,
        }
    }

    /// The map the error is about.
    pub fn map(&self) -> &str {
        match self {
            MapError::InvalidSpec { map, .. }
            | MapError::TooBig { map, .. }
            | MapError::NoMemory { map, .. }
            | MapError::Os { map, .. }
            | MapError::NotFound { map }
            | MapError::NoSpace { map }
            | MapError::Exists { map }
            | MapError::Full { map, .. }
            | MapError::InvalidArgument { map, .. }
            | MapError::NotSupported { map, .. } => map,
        }
    }
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::InvalidSpec { map, field, reason } => {
                write!(f, "map `{map}`: invalid {field}: {reason}")
            }
            MapError::TooBig {
                map,
                field,
                value,
                limit,
            } => {
                write!(f, "map `{map}`: {field} {value} is above the limit {limit}")
            }
            MapError::NoMemory { map, bytes } => {
                write!(f, "map `{map}`: cannot allocate {bytes} bytes")
            }
            MapError::Os { map, call, errno } => {
                write!(f, "map `{map}`: {call} failed with errno {errno}")
            }
            MapError::NotFound { map } => write!(f, "map `{map}`: no such element (ENOENT)"),
            MapError::Exists { map } => {
                write!(
                    f,
                    "map `{map}`: element exists and BPF_NOEXIST was given (EEXIST)"
                )
            }
            MapError::Full { map, reason } => write!(f, "map `{map}`: {reason} (E2BIG)"),
            MapError::NoSpace { map } => {
                write!(
                    f,
                    "map `{map}`: max_entries prefixes stored, no room for a new one (ENOSPC)"
                )
            }
            MapError::InvalidArgument { map, reason } => {
                write!(f, "map `{map}`: {reason} (EINVAL)")
            }
            MapError::NotSupported { map, op } => {
                write!(
                    f,
                    "map `{map}`: {op} is not supported by this map type (ENOTSUPP)"
                )
            }
        }
    }
}

impl std::error::Error for MapError {}
