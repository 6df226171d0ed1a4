//! eBPF maps: create, free, describe; the host's map operations (the `bpf(2)` map commands,
//! returning the kernel's negative errno); the ring-buffer consumer; prog-array slots.

use super::args::{arg, bytes, c_name, check_size, fill_name, out_arg};
use super::error::{boundary, boundary_errno, errno, invalid, MapFailure};
use super::program::{program, PackjitProgram};
use super::runtime::{runtime, PackjitRuntime};
use super::{DEAD_MAGIC, PACKJIT_NAME_LEN};
use core::ffi::{c_char, c_void};
use packjit_runtime::maps::{Map, MapError, MapSpec, MapType};
use packjit_runtime::{Error, ErrorKind};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const MAP_MAGIC: u64 = 0x706a_5f6d_6170_3121; // "pj_map1!"

/// An opaque reference to an eBPF map. The map itself is shared: every handle to it
/// (`packjit_map_create`, `packjit_map_ref`, `packjit_object_map`), every program loaded
/// with it and every object that has it keeps it alive; `packjit_map_free` releases this
/// handle's reference only. The map operations may run on any number of threads at once,
/// and concurrently with programs using the map; freeing a handle while another thread
/// uses that same handle is a caller bug (give each thread its own with `packjit_map_ref`).
pub struct PackjitMap {
    magic: AtomicU64,
    pub(super) map: Arc<Map>,
}

/// What a map is, filled by `packjit_map_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitMapInfo {
    /// `sizeof(PackjitMapInfo)`, set by the caller.
    pub struct_size: u32,
    /// `PACKJIT_MAP_TYPE_*` (the kernel's map type number).
    pub map_type: u32,
    /// Key bytes.
    pub key_size: u32,
    /// Value bytes as programs see them (one CPU's, for per-CPU maps).
    pub value_size: u32,
    /// Capacity (ring buffer: data size in bytes).
    pub max_entries: u32,
    /// `PACKJIT_BPF_F_*` map flags.
    pub flags: u32,
    /// Value bytes as the host exchanges them (`packjit_map_value_size`).
    pub host_value_size: u64,
    /// Elements now: hashes their count, arrays and prog arrays `max_entries`, queues and
    /// stacks the values held, ring buffers 0.
    pub entries: u64,
    /// NUL-terminated map name (truncated to fit).
    pub name: [c_char; PACKJIT_NAME_LEN],
}

impl Default for PackjitMapInfo {
    /// All zero with `struct_size` set: what `packjit_map_info` expects to be handed.
    fn default() -> Self {
        PackjitMapInfo {
            struct_size: size_of::<PackjitMapInfo>() as u32,
            map_type: 0,
            key_size: 0,
            value_size: 0,
            max_entries: 0,
            flags: 0,
            host_value_size: 0,
            entries: 0,
            name: [0; PACKJIT_NAME_LEN],
        }
    }
}

/// Ring-buffer consumer callback of `packjit_ringbuf_consume`: `user` as given, the record's
/// `len` bytes at `data` (readable during the call only).
pub type PackjitRingbufCallback =
    Option<unsafe extern "C" fn(user: *mut c_void, data: *const c_void, len: usize)>;

/// # Safety
/// `p` NULL, or a pointer to a live (or freed, not yet reused) map handle.
pub(super) unsafe fn map_handle<'a>(
    p: *const PackjitMap,
    what: &str,
) -> Result<&'a PackjitMap, Error> {
    // SAFETY: forwarded.
    let m = unsafe { arg(p, what) }?;
    match m.magic.load(Ordering::Acquire) {
        MAP_MAGIC => Ok(m),
        DEAD_MAGIC => Err(invalid(format!("{what}: map handle was already freed"))),
        _ => Err(invalid(format!("{what} is not a PackjitMap handle"))),
    }
}

/// A new handle holding a reference to `map`.
pub(super) fn new_map_handle(map: Arc<Map>) -> *mut PackjitMap {
    Box::into_raw(Box::new(PackjitMap {
        magic: AtomicU64::new(MAP_MAGIC),
        map,
    }))
}

/// A map creation error as a status: spec errors are `PJ_ERR_INVALID_ARGUMENT`, failed
/// allocations and system calls `PJ_ERR_INTERNAL`.
pub(super) fn create_error(e: MapError) -> Error {
    let kind = match e {
        MapError::NoMemory { .. } | MapError::Os { .. } => ErrorKind::Internal,
        _ => ErrorKind::InvalidArgument,
    };
    Error::new(kind, e.to_string())
}

/// Creates a map, as `BPF_MAP_CREATE`: `map_type` a `PACKJIT_MAP_TYPE_*` (the kernel's
/// number), `key_size` / `value_size` in bytes (value: one CPU's for per-CPU maps),
/// `max_entries` its capacity (ring buffer: data size), `flags` `PACKJIT_BPF_F_*`, `name`
/// for errors and `packjit_map_info` (NULL = "map"; copied). Limits: key_size 4 for arrays
/// and prog arrays, 1..512 for hashes, 5..260 for LPM tries, 0 for queue/stack/ring buffer; value_size
/// 1..1 MiB (per-CPU: 1..32 KiB), 4 for prog arrays, 0 for ring buffers; max_entries >= 1
/// (a ring buffer's a power-of-two multiple of the page size). A refused spec fails with
/// `PJ_ERR_INVALID_ARGUMENT` naming the map and the field (e.g. "map `m`: invalid key_size:
/// ..."). On success `*out` receives a new handle (the caller's reference, released with
/// `packjit_map_free`); on failure NULL.
///
/// # Safety
/// `name` NULL or NUL-terminated; `out` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: *const c_char,
    out: *mut *mut PackjitMap,
) -> i32 {
    boundary("packjit_map_create", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let name = unsafe { c_name(name, "name") }?.unwrap_or_else(|| "map".to_string());
        let t = MapType::from_raw(map_type).ok_or_else(|| {
            invalid(format!(
                "map `{name}`: invalid map_type: {map_type} is not a PACKJIT_MAP_TYPE_* value (1, 2, 3, 5, 6, 9, 10, 11, 22, 23, 27)"
            ))
        })?;
        let map = Map::new(MapSpec {
            name,
            map_type: t,
            key_size,
            value_size,
            max_entries,
            flags,
        })
        .map_err(create_error)?;
        *out = new_map_handle(map);
        Ok(())
    })
}

/// A new handle to the same map as `map` (another reference: each is released with its
/// own `packjit_map_free`).
///
/// # Safety
/// `map` NULL or live; `out` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_ref(map: *const PackjitMap, out: *mut *mut PackjitMap) -> i32 {
    boundary("packjit_map_ref", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let m = unsafe { map_handle(map, "map") }?;
        *out = new_map_handle(m.map.clone());
        Ok(())
    })
}

/// Releases a map handle. NULL is ignored. The map itself lives on while other handles,
/// programs loaded with it, prog-array slots holding such programs, or objects have it;
/// its memory goes with the last of them. A second free of the same handle is refused
/// (recorded as the last error) while the memory is not reused, but is a caller bug.
///
/// # Safety
/// `map` NULL or a handle from `packjit_map_create` / `_ref` / `packjit_object_map` that no
/// other thread is using.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_free(map: *mut PackjitMap) {
    if map.is_null() {
        return;
    }
    boundary("packjit_map_free", || {
        // SAFETY: caller contract.
        let m = unsafe { map_handle(map, "map") }?;
        if m.magic.swap(DEAD_MAGIC, Ordering::AcqRel) != MAP_MAGIC {
            return Err(invalid("map handle was freed concurrently"));
        }
        // SAFETY: from Box::into_raw; the magic swap made this the only free.
        drop(unsafe { Box::from_raw(map) });
        Ok(())
    });
}

/// Describes a map.
///
/// # Safety
/// `map` NULL or live; `info` NULL or a `PackjitMapInfo` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_info(
    map: *const PackjitMap,
    info: *mut PackjitMapInfo,
) -> i32 {
    boundary("packjit_map_info", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        // SAFETY: caller contract.
        unsafe { check_size(info, "info") }?;
        let s = m.spec();
        let mut o = PackjitMapInfo {
            map_type: s.map_type as u32,
            key_size: s.key_size,
            value_size: s.value_size,
            max_entries: s.max_entries,
            flags: s.flags,
            host_value_size: m.host_value_size() as u64,
            entries: m.len() as u64,
            ..Default::default()
        };
        fill_name(&mut o.name, &s.name);
        // SAFETY: checked.
        unsafe { *info = o };
        Ok(())
    })
}

/// `*size` receives the bytes of a value as the host exchanges it (`value_len` of
/// `packjit_map_lookup` / `_update`): `value_size`, except for per-CPU maps, whose values
/// come as one copy per possible CPU (`sysconf(_SC_NPROCESSORS_CONF)`), each rounded up to
/// 8 bytes, as with the kernel's `bpf(2)`.
///
/// # Safety
/// `map` NULL or live; `size` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_value_size(map: *const PackjitMap, size: *mut usize) -> i32 {
    boundary("packjit_map_value_size", || {
        // SAFETY: caller contract.
        let size = unsafe { out_arg(size, "size") }?;
        // SAFETY: caller contract.
        *size = unsafe { map_handle(map, "map") }?.map.host_value_size();
        Ok(())
    })
}

/// Copies `src` into the caller's `len`-byte buffer `dst`, which must be exactly as long.
///
/// # Safety
/// `dst` NULL or writable for `len` bytes.
unsafe fn copy_out(
    map: &Map,
    src: &[u8],
    dst: *mut u8,
    len: usize,
    what: &str,
) -> Result<(), MapFailure> {
    if dst.is_null() {
        return Err(invalid(format!("{what} is NULL")).into());
    }
    if len != src.len() {
        return Err(invalid(format!(
            "{what}_len is {len}, map `{}` gives {} bytes",
            map.spec().name,
            src.len()
        ))
        .into());
    }
    // SAFETY: caller contract; lengths equal.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
    Ok(())
}

/// Checks an output buffer's length against what the op will write, before the op runs
/// (so that a pop, say, does not remove a value the caller cannot take).
fn check_out_len(
    map: &Map,
    ptr: *mut u8,
    len: usize,
    want: usize,
    what: &str,
) -> Result<(), MapFailure> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")).into());
    }
    if len != want {
        return Err(invalid(format!(
            "{what}_len is {len}, map `{}` takes {want} bytes",
            map.spec().name
        ))
        .into());
    }
    Ok(())
}

/// `BPF_MAP_LOOKUP_ELEM`: copies the value of `key` into `value` (`value_len` must be
/// `packjit_map_value_size`; per-CPU maps give every CPU's copy). Queue/stack: peek (key
/// NULL, key_len 0).
///
/// Like every map operation (`packjit_map_*`, `packjit_ringbuf_consume`) it returns 0 (or
/// a count) on success and the kernel's NEGATIVE ERRNO on failure, not a `PJ_ERR_*` code,
/// so results compare with `errno.h`: `-ENOENT` no such key / empty queue, `-EEXIST` key
/// present with `PACKJIT_BPF_NOEXIST`, `-E2BIG` map full or index out of range, `-ENOMEM`,
/// `-EINVAL` a bad argument (NULL, wrong length, stale handle, flags) or operation,
/// `-PACKJIT_ENOTSUPP` (-524) an operation the map type does not have, `-EFAULT` a panic
/// caught at the boundary. The last error names the map, the operation and the errno
/// (`packjit_last_error_code()`: `PJ_ERR_PANIC` for -EFAULT, `PJ_ERR_UNSUPPORTED` for
/// -ENOTSUPP, `PJ_ERR_INVALID_ARGUMENT` otherwise).
///
/// # Safety
/// `map` NULL or live; `key` NULL or readable for `key_len` bytes; `value` NULL or writable
/// for `value_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_lookup(
    map: *const PackjitMap,
    key: *const c_void,
    key_len: usize,
    value: *mut c_void,
    value_len: usize,
) -> i32 {
    let (key, value) = (key.cast::<u8>(), value.cast::<u8>());
    boundary_errno("packjit_map_lookup", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        // SAFETY: caller contract.
        let key = unsafe { bytes(key, key_len, "key") }?;
        let want = if matches!(m.spec().map_type, MapType::Queue | MapType::Stack) {
            m.spec().value_size as usize
        } else {
            m.host_value_size()
        };
        check_out_len(m, value, value_len, want, "value")?;
        let v = m.lookup(key)?;
        // SAFETY: caller contract.
        unsafe { copy_out(m, &v, value, value_len, "value") }?;
        Ok(0)
    }) as i32
}

/// `BPF_MAP_UPDATE_ELEM`: sets `key` to `value` (`value_len` = `packjit_map_value_size`;
/// per-CPU maps take every CPU's copy) with `flags` `PACKJIT_BPF_ANY` / `_NOEXIST` /
/// `_EXIST`. Queue/stack: push (key NULL, key_len 0). Returns 0 or a negative errno (see
/// `packjit_map_lookup`). Prog-array slots are set with `packjit_prog_array_set` (-EINVAL
/// here).
///
/// # Safety
/// `map` NULL or live; `key` NULL or readable for `key_len` bytes; `value` NULL or readable
/// for `value_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_update(
    map: *const PackjitMap,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
    flags: u64,
) -> i32 {
    let (key, value) = (key.cast::<u8>(), value.cast::<u8>());
    boundary_errno("packjit_map_update", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        // SAFETY: caller contract.
        let key = unsafe { bytes(key, key_len, "key") }?;
        // SAFETY: caller contract.
        let value = unsafe { bytes(value, value_len, "value") }?;
        m.update(key, value, flags)?;
        Ok(0)
    }) as i32
}

/// `BPF_MAP_DELETE_ELEM`: removes `key`. Returns 0 or a negative errno (see
/// `packjit_map_lookup`; `-ENOENT` when absent, `-EINVAL` for arrays, whose elements always
/// exist).
///
/// # Safety
/// `map` NULL or live; `key` NULL or readable for `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_delete(
    map: *const PackjitMap,
    key: *const c_void,
    key_len: usize,
) -> i32 {
    let key = key.cast::<u8>();
    boundary_errno("packjit_map_delete", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        // SAFETY: caller contract.
        let key = unsafe { bytes(key, key_len, "key") }?;
        m.delete(key)?;
        Ok(0)
    }) as i32
}

/// `BPF_MAP_GET_NEXT_KEY`: writes the key after `key` into `next` (`next_len` = the key
/// size). `key` NULL (its `key_len` is then ignored), or a key not in the map, gives the
/// first key; after the last key it returns `-ENOENT`. Arrays go in index order, hashes in
/// bucket order. Returns 0 or a negative errno (see `packjit_map_lookup`).
///
/// ```c
/// uint32_t k, next;
/// for (int rc = packjit_map_next_key(m, NULL, 0, &next, 4); rc == 0;
///      k = next, rc = packjit_map_next_key(m, &k, 4, &next, 4))
///     use(next);
/// ```
///
/// # Safety
/// `map` NULL or live; `key` NULL or readable for `key_len` bytes; `next` NULL or writable
/// for `next_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_next_key(
    map: *const PackjitMap,
    key: *const c_void,
    key_len: usize,
    next: *mut c_void,
    next_len: usize,
) -> i32 {
    let (key, next) = (key.cast::<u8>(), next.cast::<u8>());
    boundary_errno("packjit_map_next_key", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        let key = if key.is_null() {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { bytes(key, key_len, "key") }?)
        };
        check_out_len(m, next, next_len, m.spec().key_size as usize, "next")?;
        let k = m.next_key(key)?;
        // SAFETY: caller contract.
        unsafe { copy_out(m, &k, next, next_len, "next") }?;
        Ok(0)
    }) as i32
}

/// Queue/stack push (`bpf_map_push_elem`): `value_len` = the map's value_size; `flags`
/// `PACKJIT_BPF_EXIST` drops the oldest value when full (else `-E2BIG`). Returns 0 or a
/// negative errno (see `packjit_map_lookup`; `-PACKJIT_ENOTSUPP` for other map types).
///
/// # Safety
/// `map` NULL or live; `value` NULL or readable for `value_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_push(
    map: *const PackjitMap,
    value: *const c_void,
    value_len: usize,
    flags: u64,
) -> i32 {
    let value = value.cast::<u8>();
    boundary_errno("packjit_map_push", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        // SAFETY: caller contract.
        let value = unsafe { bytes(value, value_len, "value") }?;
        m.push(value, flags)?;
        Ok(0)
    }) as i32
}

/// # Safety
/// As `packjit_map_pop`.
unsafe fn take(
    what: &str,
    map: *const PackjitMap,
    value: *mut c_void,
    value_len: usize,
    remove: bool,
) -> i32 {
    let value = value.cast::<u8>();
    boundary_errno(what, || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        if !matches!(m.spec().map_type, MapType::Queue | MapType::Stack) {
            return Err(MapError::NotSupported {
                map: m.spec().name.clone(),
                op: if remove { "pop" } else { "peek" },
            }
            .into());
        }
        check_out_len(m, value, value_len, m.spec().value_size as usize, "value")?;
        let v = if remove { m.pop() } else { m.peek() }?;
        // SAFETY: caller contract.
        unsafe { copy_out(m, &v, value, value_len, "value") }?;
        Ok(0)
    }) as i32
}

/// Queue: removes the oldest value into `value`; stack: the newest (`value_len` = the
/// map's value_size). Returns 0, `-ENOENT` when empty, or another negative errno (see
/// `packjit_map_lookup`; `-PACKJIT_ENOTSUPP` for other map types).
///
/// # Safety
/// `map` NULL or live; `value` NULL or writable for `value_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_pop(
    map: *const PackjitMap,
    value: *mut c_void,
    value_len: usize,
) -> i32 {
    // SAFETY: forwarded.
    unsafe { take("packjit_map_pop", map, value, value_len, true) }
}

/// As `packjit_map_pop` without removing the value.
///
/// # Safety
/// As `packjit_map_pop`.
#[no_mangle]
pub unsafe extern "C" fn packjit_map_peek(
    map: *const PackjitMap,
    value: *mut c_void,
    value_len: usize,
) -> i32 {
    // SAFETY: forwarded.
    unsafe { take("packjit_map_peek", map, value, value_len, false) }
}

thread_local! {
    // The ring buffers this thread is consuming (a callback consuming the same ring again
    // would deadlock on its consumer lock).
    static CONSUMING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Ring-buffer consumer (libbpf's `ring_buffer__consume`): calls `callback(user, data,
/// len)` for every record submitted so far, in order; discarded records are skipped, and
/// consumption stops at the first record a program has reserved but not yet submitted.
/// Returns the number of records delivered (>= 0) or a negative errno: `-EINVAL` for a
/// NULL callback or a map that is not a ring buffer, `-EBUSY` when called from a callback
/// consuming the same ring (see `packjit_map_lookup` for the rest). Every available record
/// is delivered: there is no early stop (each record's space goes back to the producers as
/// soon as its callback returns, so a record not delivered would be lost). One consumer
/// at a time: concurrent calls on one ring take turns. Programs may keep producing during
/// the call; records submitted meanwhile may be delivered too.
///
/// # Safety
/// `map` NULL or live; `callback` NULL (refused) or a function that may read `len` bytes at
/// `data` during the call only; `user` is passed through untouched.
#[no_mangle]
pub unsafe extern "C" fn packjit_ringbuf_consume(
    map: *const PackjitMap,
    callback: PackjitRingbufCallback,
    user: *mut c_void,
) -> i64 {
    boundary_errno("packjit_ringbuf_consume", || {
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        let cb = callback.ok_or_else(|| invalid("callback is NULL"))?;
        if m.spec().map_type != MapType::RingBuf {
            return Err(MapError::InvalidArgument {
                map: m.spec().name.clone(),
                reason: format!(
                    "consume: the map is a {}, not a BPF_MAP_TYPE_RINGBUF",
                    m.spec().map_type.name()
                ),
            }
            .into());
        }
        let key = Arc::as_ptr(m) as usize;
        let busy = CONSUMING.with(|c| {
            let mut c = c.borrow_mut();
            let busy = c.contains(&key);
            if !busy {
                c.push(key);
            }
            busy
        });
        if busy {
            return Ok(-errno::EBUSY);
        }
        struct Done(usize);
        impl Drop for Done {
            fn drop(&mut self) {
                let _ = CONSUMING.try_with(|c| c.borrow_mut().retain(|&k| k != self.0));
            }
        }
        let _done = Done(key);
        let n = m.ringbuf_consume(&mut |rec: &[u8]| {
            // SAFETY: caller contract on the callback; the record is readable for the call.
            unsafe { cb(user, rec.as_ptr().cast(), rec.len()) }
        });
        Ok(n as i64)
    })
}

/// Puts `prog` in slot `index` of prog array `map` (`prog` NULL empties the slot),
/// atomically for running programs: a tail call sees the old or the new program, never a
/// freed one; the replaced program is released once no run can still be in it. A tail
/// call only continues in a program of the caller's trust (sandboxed or
/// `PACKJIT_LOAD_TRUSTED`) that can run here; otherwise it falls through, as into an empty
/// slot.
///
/// Ownership: the slot takes its own reference to the program; `prog`'s handle stays the
/// caller's (free it whenever: the program lives on in the slot until the slot is emptied
/// or replaced). A program in a slot keeps the maps it was loaded with alive, the prog
/// array among them: empty the slots to release them. Fails with
/// `PJ_ERR_INVALID_ARGUMENT` when `map` is not a prog array, `index` >= its max_entries,
/// or `prog` is freed or from another runtime.
///
/// # Safety
/// `rt`, `map` NULL or live; `prog` NULL or a live program handle.
#[no_mangle]
pub unsafe extern "C" fn packjit_prog_array_set(
    rt: *const PackjitRuntime,
    map: *const PackjitMap,
    index: u32,
    prog: *const PackjitProgram,
) -> i32 {
    boundary("packjit_prog_array_set", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let m = &unsafe { map_handle(map, "map") }?.map;
        let p = if prog.is_null() {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { slot_program(h, prog, "prog") }?)
        };
        h.rt.set_prog_array(m, index, p).map_err(|e| {
            Error::new(
                e.kind,
                format!("prog array `{}` slot {index}: {}", m.spec().name, e.message),
            )
        })
    })
}

/// The program of a handle, for a prog-array slot of `h`'s runtime.
///
/// # Safety
/// `prog` NULL or a live program handle.
pub(super) unsafe fn slot_program(
    h: &PackjitRuntime,
    prog: *const PackjitProgram,
    what: &str,
) -> Result<Arc<packjit_runtime::Program>, Error> {
    // SAFETY: caller contract.
    let p = unsafe { program(prog) }.map_err(|e| invalid(format!("{what}: {}", e.message)))?;
    if p.freed.load(Ordering::Acquire) {
        return Err(invalid(format!("{what}: program was already freed")));
    }
    if !Arc::ptr_eq(&p._rt, &h.rt) {
        return Err(invalid(format!(
            "{what}: program belongs to another runtime"
        )));
    }
    Ok(p.prog.clone())
}
