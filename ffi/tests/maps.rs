//! The map part of the C API, driven as a C host would: maps created from C with the
//! kernel's errno results, per-CPU value sizes, queues and stacks, bytecode naming maps
//! through `PackjitLoadOptions::maps`, a libbpf-style object (`tests/bpf/maps_run.c`,
//! compiled by clang at test time) whose ring buffer is consumed and whose prog array is
//! filled from C, and every NULL or garbage argument refused without a crash.

#[allow(dead_code)]
mod common;
#[path = "../../runtime/tests/elf_support/mod.rs"]
mod elf_support;
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;

use common::{check, host_runtime, load};
use elf_support::compile_bpf;
use packjit::*;
use std::collections::BTreeMap;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};

const ENOENT: i32 = 2;
const E2BIG: i32 = 7;
const EEXIST: i32 = 17;
const EINVAL: i32 = 22;
const EBUSY: i64 = 16;

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(packjit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn create(
    t: u32,
    k: u32,
    v: u32,
    max: u32,
    flags: u32,
    name: &str,
) -> Result<*mut PackjitMap, String> {
    let name = CString::new(name).unwrap();
    let mut m = null_mut();
    // SAFETY: NUL-terminated name; valid out pointer.
    let st = unsafe { packjit_map_create(t, k, v, max, flags, name.as_ptr(), &mut m) };
    if st == PJ_OK {
        assert!(!m.is_null());
        Ok(m)
    } else {
        assert!(m.is_null());
        assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
        Err(last_error())
    }
}

fn lookup(m: *const PackjitMap, key: &[u8], len: usize) -> Result<Vec<u8>, i32> {
    let mut v = vec![0u8; len];
    // SAFETY: buffers of the given lengths.
    let rc = unsafe {
        packjit_map_lookup(
            m,
            key.as_ptr().cast(),
            key.len(),
            v.as_mut_ptr().cast(),
            len,
        )
    };
    if rc == 0 {
        Ok(v)
    } else {
        Err(rc)
    }
}

fn update(m: *const PackjitMap, key: &[u8], value: &[u8], flags: u64) -> i32 {
    // SAFETY: buffers of the given lengths.
    unsafe {
        packjit_map_update(
            m,
            key.as_ptr().cast(),
            key.len(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    }
}

fn info(m: *const PackjitMap) -> PackjitMapInfo {
    let mut i = PackjitMapInfo::default();
    // SAFETY: live map; struct_size set.
    check(unsafe { packjit_map_info(m, &mut i) }, "packjit_map_info");
    i
}

fn keys(m: *const PackjitMap, key_size: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut next = vec![0u8; key_size];
    // SAFETY: buffers of key_size bytes.
    let mut rc = unsafe { packjit_map_next_key(m, null(), 0, next.as_mut_ptr().cast(), key_size) };
    while rc == 0 {
        out.push(next.clone());
        let k = next.clone();
        // SAFETY: as above.
        rc = unsafe {
            packjit_map_next_key(
                m,
                k.as_ptr().cast(),
                key_size,
                next.as_mut_ptr().cast(),
                key_size,
            )
        };
    }
    assert_eq!(rc, -ENOENT, "the walk ends with -ENOENT");
    out
}

#[test]
fn hash_map_operations_return_the_kernels_negative_errno() {
    let m = create(PACKJIT_MAP_TYPE_HASH, 4, 8, 3, 0, "flows").unwrap();
    let k = |i: u32| i.to_ne_bytes();
    let v = |x: u64| x.to_ne_bytes();
    assert_eq!(lookup(m, &k(1), 8), Err(-ENOENT));
    assert_eq!(packjit_last_error_code(), PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("`flows`"), "{}", last_error());
    assert_eq!(update(m, &k(1), &v(10), PACKJIT_BPF_NOEXIST), 0);
    assert_eq!(packjit_last_error_code(), PJ_OK);
    assert_eq!(update(m, &k(1), &v(11), PACKJIT_BPF_NOEXIST), -EEXIST);
    assert_eq!(update(m, &k(2), &v(20), PACKJIT_BPF_EXIST), -ENOENT);
    assert_eq!(update(m, &k(1), &v(12), PACKJIT_BPF_EXIST), 0);
    assert_eq!(lookup(m, &k(1), 8), Ok(v(12).to_vec()));
    assert_eq!(update(m, &k(2), &v(20), PACKJIT_BPF_ANY), 0);
    assert_eq!(update(m, &k(3), &v(30), PACKJIT_BPF_ANY), 0);
    assert_eq!(update(m, &k(4), &v(40), PACKJIT_BPF_ANY), -E2BIG, "full");
    assert_eq!(update(m, &k(4), &v(40), 99), -EINVAL, "unknown flags");
    let mut got = keys(m, 4);
    got.sort();
    assert_eq!(got, vec![k(1).to_vec(), k(2).to_vec(), k(3).to_vec()]);
    assert_eq!(info(m).entries, 3);
    // SAFETY: live map; 4-byte key.
    assert_eq!(unsafe { packjit_map_delete(m, k(2).as_ptr().cast(), 4) }, 0);
    // SAFETY: as above.
    let rc = unsafe { packjit_map_delete(m, k(2).as_ptr().cast(), 4) };
    assert_eq!(rc, -ENOENT);
    // Wrong lengths are -EINVAL naming the map and the length.
    assert_eq!(lookup(m, &[1, 2, 3], 8), Err(-EINVAL));
    assert!(last_error().contains("`flows`"), "{}", last_error());
    assert_eq!(lookup(m, &k(1), 4), Err(-EINVAL));
    assert!(last_error().contains("value_len is 4"), "{}", last_error());
    assert_eq!(update(m, &k(1), &[0; 7], PACKJIT_BPF_ANY), -EINVAL);
    let i = info(m);
    assert_eq!(
        (
            i.map_type,
            i.key_size,
            i.value_size,
            i.max_entries,
            i.flags,
            i.host_value_size,
            i.entries
        ),
        (PACKJIT_MAP_TYPE_HASH, 4, 8, 3, 0, 8, 2)
    );
    // SAFETY: NUL-terminated by the library.
    let name = unsafe { CStr::from_ptr(i.name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "flows");
    // A second reference outlives the first.
    let mut r = null_mut();
    // SAFETY: live map; valid out pointer.
    check(unsafe { packjit_map_ref(m, &mut r) }, "packjit_map_ref");
    // SAFETY: handles from create / ref, freed once each.
    unsafe { packjit_map_free(m) };
    assert_eq!(lookup(r, &k(1), 8), Ok(v(12).to_vec()));
    // SAFETY: as above.
    unsafe { packjit_map_free(r) };
}

#[test]
fn arrays_ring_buffers_and_prog_arrays_refuse_what_they_do_not_have() {
    let a = create(PACKJIT_MAP_TYPE_ARRAY, 4, 8, 4, 0, "arr").unwrap();
    assert_eq!(
        lookup(a, &9u32.to_ne_bytes(), 8),
        Err(-ENOENT),
        "index out of range"
    );
    assert_eq!(update(a, &9u32.to_ne_bytes(), &[0; 8], 0), -E2BIG);
    assert_eq!(
        update(a, &1u32.to_ne_bytes(), &[7; 8], PACKJIT_BPF_NOEXIST),
        -EEXIST
    );
    // SAFETY: live map; 4-byte key.
    let rc = unsafe { packjit_map_delete(a, 1u32.to_ne_bytes().as_ptr().cast(), 4) };
    assert_eq!(rc, -EINVAL, "array elements cannot be deleted");
    assert_eq!(keys(a, 4).len(), 4);
    let rb = create(PACKJIT_MAP_TYPE_RINGBUF, 0, 0, 1 << 16, 0, "rb").unwrap();
    let mut byte = 0u8;
    // SAFETY: a non-NULL zero-length buffer.
    let rc = unsafe { packjit_map_lookup(rb, null(), 0, (&mut byte as *mut u8).cast(), 0) };
    assert_eq!(rc, -PACKJIT_ENOTSUPP);
    assert_eq!(packjit_last_error_code(), PJ_ERR_UNSUPPORTED);
    assert!(last_error().contains("lookup"), "{}", last_error());
    // SAFETY: live map; the map type is refused before the buffer is looked at.
    let rc = unsafe { packjit_map_pop(a, null_mut(), 8) };
    assert_eq!(rc, -PACKJIT_ENOTSUPP, "pop on an array");
    let pa = create(PACKJIT_MAP_TYPE_PROG_ARRAY, 4, 4, 2, 0, "pa").unwrap();
    assert_eq!(update(pa, &0u32.to_ne_bytes(), &[0; 4], 0), -EINVAL);
    assert!(last_error().contains("prog array"), "{}", last_error());
    // SAFETY: handles from create, freed once.
    unsafe {
        packjit_map_free(a);
        packjit_map_free(rb);
        packjit_map_free(pa);
    }
}

#[test]
fn bad_specs_are_refused_naming_the_map_and_the_field() {
    let cases: [(u32, u32, u32, u32, u32, &str); 6] = [
        (4, 4, 4, 1, 0, "map_type"),
        (PACKJIT_MAP_TYPE_HASH, 0, 8, 16, 0, "key_size"),
        (PACKJIT_MAP_TYPE_ARRAY, 4, 0, 16, 0, "value_size"),
        (PACKJIT_MAP_TYPE_ARRAY, 4, 8, 0, 0, "max_entries"),
        (PACKJIT_MAP_TYPE_RINGBUF, 0, 0, 12345, 0, "max_entries"),
        (
            PACKJIT_MAP_TYPE_ARRAY,
            4,
            8,
            4,
            PACKJIT_BPF_F_NO_PREALLOC,
            "flags",
        ),
    ];
    for (t, k, v, max, flags, field) in cases {
        let e = create(t, k, v, max, flags, "bad").unwrap_err();
        assert!(e.contains("`bad`") && e.contains(field), "{field}: {e}");
    }
}

#[test]
fn per_cpu_values_come_once_per_possible_cpu_rounded_to_8_bytes() {
    let m = create(PACKJIT_MAP_TYPE_PERCPU_ARRAY, 4, 4, 2, 0, "pcpu").unwrap();
    let mut size = 0usize;
    // SAFETY: live map; valid out pointer.
    check(
        unsafe { packjit_map_value_size(m, &mut size) },
        "packjit_map_value_size",
    );
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc_nprocs_conf() };
    assert_eq!(size, cpus * 8);
    assert_eq!(info(m).host_value_size, size as u64);
    assert_eq!(info(m).value_size, 4);
    let value: Vec<u8> = (0..size).map(|i| i as u8).collect();
    assert_eq!(update(m, &1u32.to_ne_bytes(), &value, 0), 0);
    let got = lookup(m, &1u32.to_ne_bytes(), size).unwrap();
    for c in 0..cpus {
        assert_eq!(got[c * 8..c * 8 + 4], value[c * 8..c * 8 + 4], "cpu {c}");
    }
    assert_eq!(
        update(m, &1u32.to_ne_bytes(), &[0; 4], 0),
        -EINVAL,
        "one CPU's value"
    );
    assert_eq!(lookup(m, &1u32.to_ne_bytes(), 4), Err(-EINVAL));
    // SAFETY: handle from create.
    unsafe { packjit_map_free(m) };
}

/// `sysconf(_SC_NPROCESSORS_CONF)`, the library's possible-CPU count.
unsafe fn libc_nprocs_conf() -> usize {
    extern "C" {
        fn sysconf(name: i32) -> i64;
    }
    // _SC_NPROCESSORS_CONF is 83 in glibc and musl on every Linux arch.
    // SAFETY: no preconditions.
    unsafe { sysconf(83) }.max(1) as usize
}

#[test]
fn queues_and_stacks_push_pop_and_peek() {
    for (t, order) in [
        (PACKJIT_MAP_TYPE_QUEUE, [1u32, 2, 3]),
        (PACKJIT_MAP_TYPE_STACK, [3, 2, 1]),
    ] {
        let m = create(t, 0, 4, 3, 0, "q").unwrap();
        let mut v = 0u32;
        let vp = (&mut v as *mut u32).cast::<u8>();
        // SAFETY: live map; 4-byte buffers throughout.
        unsafe {
            assert_eq!(packjit_map_pop(m, vp.cast(), 4), -ENOENT, "empty");
            for x in 1u32..=3 {
                assert_eq!(
                    packjit_map_push(m, x.to_ne_bytes().as_ptr().cast(), 4, 0),
                    0
                );
            }
            assert_eq!(
                packjit_map_push(m, 9u32.to_ne_bytes().as_ptr().cast(), 4, 0),
                -E2BIG,
                "full"
            );
            assert_eq!(packjit_map_pop(m, vp.cast(), 8), -EINVAL, "wrong length");
            assert_eq!(info(m).entries, 3, "a refused pop removes nothing");
            assert_eq!(packjit_map_peek(m, vp.cast(), 4), 0);
            assert_eq!(v, order[0]);
            // Lookup on a queue/stack is peek.
            assert_eq!(lookup(m, &[], 4), Ok(order[0].to_ne_bytes().to_vec()));
            for want in order {
                assert_eq!(packjit_map_pop(m, vp.cast(), 4), 0);
                assert_eq!(v, want);
            }
            assert_eq!(packjit_map_peek(m, vp.cast(), 4), -ENOENT);
            packjit_map_free(m);
        }
    }
}

/// `*(u32 *)(r10 - 4) = 0; r0 = bpf_map_lookup_elem(map 0, r10 - 4); return r0 ? *(u64 *)r0
/// : 0`, hand-assembled: map 0 is named with `lddw r1, map` (`src = 1`, `imm = 0`).
fn read_array_slot_0() -> Vec<u8> {
    let insns: [[u8; 8]; 10] = [
        [0x62, 0x0a, 0xfc, 0xff, 0, 0, 0, 0], // stw [r10-4], 0
        [0x18, 0x11, 0, 0, 0, 0, 0, 0],       // lddw r1, map 0
        [0, 0, 0, 0, 0, 0, 0, 0],
        [0xbf, 0xa2, 0, 0, 0, 0, 0, 0],             // mov r2, r10
        [0x07, 0x02, 0, 0, 0xfc, 0xff, 0xff, 0xff], // add r2, -4
        [0x85, 0, 0, 0, 1, 0, 0, 0],                // call bpf_map_lookup_elem
        [0x55, 0x00, 0x02, 0, 0, 0, 0, 0],          // jne r0, 0, +2
        [0xb7, 0, 0, 0, 0, 0, 0, 0],                // mov r0, 0
        [0x95, 0, 0, 0, 0, 0, 0, 0],                // exit
        [0x79, 0x00, 0, 0, 0, 0, 0, 0],             // ldxdw r0, [r0]
    ];
    let mut v: Vec<u8> = insns.concat();
    v.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]); // exit
    v
}

fn run_ctx(p: *mut PackjitProgram, ctx: &mut [u8]) -> u64 {
    let mut r0 = 0;
    // SAFETY: a live program; the context is borrowed for the call.
    check(
        unsafe { packjit_program_run(p, ctx.as_mut_ptr().cast(), ctx.len(), &mut r0) },
        "packjit_program_run",
    );
    r0
}

#[test]
fn bytecode_names_maps_through_the_load_options() {
    let rt = host_runtime();
    let m = create(PACKJIT_MAP_TYPE_ARRAY, 4, 8, 1, 0, "cfg").unwrap();
    assert_eq!(
        update(
            m,
            &0u32.to_ne_bytes(),
            &0x1234_5678_9abcu64.to_ne_bytes(),
            0
        ),
        0
    );
    let code = read_array_slot_0();
    for flags in [0, PACKJIT_LOAD_TRUSTED] {
        let maps = [m.cast_const()];
        let mut opts = PackjitLoadOptions::default();
        // SAFETY: writable options.
        check(
            unsafe { packjit_load_options_init(&mut opts) },
            "packjit_load_options_init",
        );
        opts.flags = flags;
        opts.maps = maps.as_ptr();
        opts.map_count = 1;
        let mut p = null_mut();
        // SAFETY: live runtime; code and options borrowed for the call.
        check(
            unsafe { packjit_program_load(rt, code.as_ptr(), code.len(), &opts, &mut p) },
            "packjit_program_load with a map",
        );
        assert_eq!(run_ctx(p, &mut []), 0x1234_5678_9abc);
        assert_eq!(update(m, &0u32.to_ne_bytes(), &7u64.to_ne_bytes(), 0), 0);
        assert_eq!(
            run_ctx(p, &mut []),
            7,
            "the host's update is seen by the program"
        );
        assert_eq!(
            update(
                m,
                &0u32.to_ne_bytes(),
                &0x1234_5678_9abcu64.to_ne_bytes(),
                0
            ),
            0
        );
        // SAFETY: from packjit_program_load.
        unsafe { packjit_program_free(p) };
    }
    // Without the map the reference is refused; NULL maps with a count and a garbage
    // handle too.
    let mut p = null_mut();
    // SAFETY: live runtime; NULL options.
    let st = unsafe { packjit_program_load(rt, code.as_ptr(), code.len(), null(), &mut p) };
    assert_ne!(st, PJ_OK);
    assert!(p.is_null());
    let mut opts = PackjitLoadOptions::default();
    // SAFETY: writable options.
    check(
        unsafe { packjit_load_options_init(&mut opts) },
        "packjit_load_options_init",
    );
    opts.map_count = 1;
    // SAFETY: as above.
    let st = unsafe { packjit_program_load(rt, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("opts->maps is NULL"),
        "{}",
        last_error()
    );
    let garbage = [0u64; 8];
    let maps = [garbage.as_ptr().cast::<PackjitMap>()];
    opts.maps = maps.as_ptr();
    // SAFETY: as above; the garbage handle is readable memory.
    let st = unsafe { packjit_program_load(rt, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("opts->maps[0]"), "{}", last_error());
    // SAFETY: handles from create.
    unsafe {
        packjit_map_free(m);
        packjit_runtime_destroy(rt);
    }
}

/// The model of `maps_run.c` (as in runtime/tests/elf_maps.rs): (proto, len) → r0.
#[derive(Default)]
struct CounterModel {
    counts: BTreeMap<u32, u64>,
    bytes: [u64; 4],
    events: Vec<(u32, u32, u64)>,
}

impl CounterModel {
    fn packet(&mut self, proto: u32, len: u32, tail: bool) -> u64 {
        let seen = {
            let c = self.counts.entry(proto).or_insert(0);
            *c += 1;
            *c
        };
        self.bytes[(proto & 3) as usize] += len as u64;
        self.events.push((proto, len, seen));
        if proto & 1 == 1 && tail {
            self.bytes[3] += 1000;
            2
        } else {
            1
        }
    }
}

unsafe extern "C" fn collect(user: *mut c_void, data: *const c_void, len: usize) {
    // SAFETY: `user` is the test's Vec; the record is readable for `len` bytes.
    let (events, rec) = unsafe {
        (
            &mut *user.cast::<Vec<(u32, u32, u64)>>(),
            std::slice::from_raw_parts(data.cast::<u8>(), len),
        )
    };
    assert_eq!(len, 16);
    let u32_at = |o: usize| u32::from_le_bytes(rec[o..o + 4].try_into().unwrap());
    events.push((
        u32_at(0),
        u32_at(4),
        u64::from_le_bytes(rec[8..16].try_into().unwrap()),
    ));
}

struct Obj {
    rt: *mut PackjitRuntime,
    obj: *mut PackjitObject,
    count: *mut PackjitProgram,
    stage2: *mut PackjitProgram,
}

fn open_maps_run(host: &[(&str, *mut PackjitMap)], flags: u32) -> Obj {
    let bytes = compile_bpf("maps_run");
    let rt = host_runtime();
    let names: Vec<CString> = host
        .iter()
        .map(|(n, _)| CString::new(*n).unwrap())
        .collect();
    let name_ptrs: Vec<_> = names.iter().map(|n| n.as_ptr()).collect();
    let maps: Vec<_> = host.iter().map(|(_, m)| m.cast_const()).collect();
    let mut obj = null_mut();
    // SAFETY: the object bytes and arrays are borrowed for the call.
    check(
        unsafe {
            packjit_object_open(
                bytes.as_ptr(),
                bytes.len(),
                name_ptrs.as_ptr(),
                maps.as_ptr(),
                host.len(),
                &mut obj,
            )
        },
        "packjit_object_open",
    );
    drop(bytes); // the object keeps its own copy
    let mut opts = PackjitLoadOptions::default();
    // SAFETY: writable options.
    check(
        unsafe { packjit_load_options_init(&mut opts) },
        "packjit_load_options_init",
    );
    opts.flags = flags;
    let load = |sec: &str| {
        let sec = CString::new(sec).unwrap();
        let mut p = null_mut();
        // SAFETY: live object and runtime; NUL-terminated section.
        check(
            unsafe { packjit_object_load(obj, rt, sec.as_ptr(), null(), &opts, &mut p) },
            "packjit_object_load",
        );
        p
    };
    let (count, stage2) = (load("pj/count"), load("pj/stage2"));
    Obj {
        rt,
        obj,
        count,
        stage2,
    }
}

fn object_map(obj: *const PackjitObject, name: &str) -> *mut PackjitMap {
    let name = CString::new(name).unwrap();
    let mut m = null_mut();
    // SAFETY: live object; NUL-terminated name.
    check(
        unsafe { packjit_object_map(obj, name.as_ptr(), &mut m) },
        "packjit_object_map",
    );
    m
}

fn consume(rb: *const PackjitMap) -> Vec<(u32, u32, u64)> {
    let mut events: Vec<(u32, u32, u64)> = Vec::new();
    // SAFETY: live map; the callback reads the records and the Vec passed as `user`.
    let n =
        unsafe { packjit_ringbuf_consume(rb, Some(collect), (&mut events as *mut Vec<_>).cast()) };
    assert_eq!(n, events.len() as i64, "{}", last_error());
    events
}

#[test]
fn a_libbpf_object_runs_from_c_its_ring_buffer_is_consumed_and_its_prog_array_filled() {
    for flags in [0, PACKJIT_LOAD_TRUSTED] {
        let o = open_maps_run(&[], flags);
        let mut count = 0usize;
        // SAFETY: live object.
        check(
            unsafe { packjit_object_map_count(o.obj, &mut count) },
            "map_count",
        );
        let mut names = Vec::new();
        for i in 0..count {
            let mut buf = [0 as std::ffi::c_char; 32];
            // SAFETY: live object; a 32-byte buffer.
            check(
                unsafe { packjit_object_map_name(o.obj, i, buf.as_mut_ptr(), 32) },
                "name",
            );
            // SAFETY: NUL-terminated by the library.
            names.push(
                unsafe { CStr::from_ptr(buf.as_ptr()) }
                    .to_str()
                    .unwrap()
                    .to_string(),
            );
        }
        names.sort();
        assert_eq!(names, ["bytes", "counts", "events", "stages"]);
        let name = CString::new("stage2").unwrap();
        let names = [name.as_ptr()];
        let progs = [o.stage2.cast_const()];
        // SAFETY: live handles; arrays of one.
        check(
            unsafe {
                packjit_object_init_prog_arrays(o.obj, o.rt, names.as_ptr(), progs.as_ptr(), 1)
            },
            "packjit_object_init_prog_arrays",
        );
        let (counts, bytes, events, stages) = (
            object_map(o.obj, "counts"),
            object_map(o.obj, "bytes"),
            object_map(o.obj, "events"),
            object_map(o.obj, "stages"),
        );
        // The map handles are references of their own: the object may go first, and the
        // stage-2 handle too (its slot keeps the program).
        // SAFETY: handles from open / load, freed once.
        unsafe {
            packjit_object_free(o.obj);
            packjit_program_free(o.stage2);
        }
        let mut model = CounterModel::default();
        for (n, proto) in [6u8, 17, 6, 1, 17, 17, 58, 6].into_iter().enumerate() {
            let mut pkt = vec![proto; 20 + n];
            let want = model.packet(proto as u32, pkt.len() as u32, true);
            assert_eq!(
                run_ctx(o.count, &mut pkt),
                want,
                "flags {flags}, packet {n}"
            );
        }
        for (k, v) in &model.counts {
            assert_eq!(
                lookup(counts, &k.to_ne_bytes(), 8),
                Ok(v.to_ne_bytes().to_vec())
            );
        }
        assert_eq!(keys(counts, 4).len(), model.counts.len());
        for (k, v) in model.bytes.iter().enumerate() {
            assert_eq!(
                lookup(bytes, &(k as u32).to_ne_bytes(), 8),
                Ok(v.to_ne_bytes().to_vec())
            );
        }
        assert_eq!(consume(events), model.events, "flags {flags}");
        assert_eq!(consume(events), [], "consumed records are gone");
        // Emptying the slot from C: odd protocols no longer reach stage 2.
        // SAFETY: live runtime and map; NULL empties.
        check(
            unsafe { packjit_prog_array_set(o.rt, stages, 1, null()) },
            "empty slot",
        );
        let mut pkt = vec![17u8; 30];
        assert_eq!(run_ctx(o.count, &mut pkt), 1);
        // SAFETY: handles freed once.
        unsafe {
            for m in [counts, bytes, events, stages] {
                packjit_map_free(m);
            }
            packjit_program_free(o.count);
            packjit_runtime_destroy(o.rt);
        }
    }
}

#[test]
fn a_prog_array_slot_set_from_c_makes_the_tail_call_land() {
    let o = open_maps_run(&[], 0);
    let stages = object_map(o.obj, "stages");
    let mut pkt = vec![17u8; 24];
    assert_eq!(
        run_ctx(o.count, &mut pkt),
        1,
        "empty slot: the tail call falls through"
    );
    // SAFETY: live handles throughout.
    unsafe {
        check(
            packjit_prog_array_set(o.rt, stages, 1, o.stage2),
            "packjit_prog_array_set",
        );
        assert_eq!(
            run_ctx(o.count, &mut pkt),
            2,
            "the tail call lands in stage 2"
        );
        assert_eq!(
            run_ctx(o.count, &mut [6u8; 24]),
            1,
            "even protocols do not tail call"
        );
        // Out of range, not a prog array, freed or NULL handles: refused, naming them.
        assert_eq!(
            packjit_prog_array_set(o.rt, stages, 2, o.stage2),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("`stages` slot 2"), "{}", last_error());
        let counts = object_map(o.obj, "counts");
        assert_eq!(
            packjit_prog_array_set(o.rt, counts, 0, o.stage2),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("not a prog array"),
            "{}",
            last_error()
        );
        assert_eq!(
            packjit_prog_array_set(null(), stages, 1, o.stage2),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_prog_array_set(o.rt, null(), 1, o.stage2),
            PJ_ERR_INVALID_ARGUMENT
        );
        // A program of another runtime is refused.
        let rt2 = host_runtime();
        let other = load(rt2, &common::sized(2, 5));
        assert_eq!(
            packjit_prog_array_set(o.rt, stages, 0, other),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("another runtime"), "{}", last_error());
        packjit_program_free(other);
        packjit_runtime_destroy(rt2);
        // A hook batch cannot take over a program in a slot (the handle is kept).
        let mut hook = null_mut();
        check(packjit_hook_create(o.rt, &mut hook), "packjit_hook_create");
        let mut batch = null_mut();
        check(
            packjit_hook_batch_create(&mut batch),
            "packjit_hook_batch_create",
        );
        assert_eq!(
            packjit_hook_batch_attach(batch, hook, o.stage2),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("prog array"), "{}", last_error());
        packjit_hook_batch_discard(batch);
        packjit_hook_destroy(hook);
        // Freeing the handle leaves the program in its slot.
        packjit_program_free(o.stage2);
        assert_eq!(run_ctx(o.count, &mut pkt), 2);
        assert_eq!(
            packjit_prog_array_set(o.rt, stages, 1, o.stage2),
            PJ_ERR_INVALID_ARGUMENT
        );
        check(
            packjit_prog_array_set(o.rt, stages, 1, null()),
            "empty slot",
        );
        assert_eq!(run_ctx(o.count, &mut pkt), 1);
        packjit_map_free(counts);
        packjit_map_free(stages);
        packjit_object_free(o.obj);
        packjit_program_free(o.count);
        packjit_runtime_destroy(o.rt);
    }
}

#[test]
fn host_maps_serve_an_objects_maps_by_name() {
    let counts = create(PACKJIT_MAP_TYPE_HASH, 4, 8, 256, 0, "host_counts").unwrap();
    let o = open_maps_run(&[("counts", counts)], 0);
    run_ctx(o.count, &mut [6u8; 20]);
    run_ctx(o.count, &mut [6u8; 20]);
    assert_eq!(
        lookup(counts, &6u32.to_ne_bytes(), 8),
        Ok(2u64.to_ne_bytes().to_vec())
    );
    // A host map of another shape is refused naming it.
    let bytes = compile_bpf("maps_run");
    let wrong = create(PACKJIT_MAP_TYPE_HASH, 4, 4, 256, 0, "w").unwrap();
    let name = CString::new("counts").unwrap();
    let mut obj = null_mut();
    // SAFETY: borrowed arrays of one.
    let st = unsafe {
        packjit_object_open(
            bytes.as_ptr(),
            bytes.len(),
            [name.as_ptr()].as_ptr(),
            [wrong.cast_const()].as_ptr(),
            1,
            &mut obj,
        )
    };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(obj.is_null());
    assert!(last_error().contains("`counts`"), "{}", last_error());
    // SAFETY: handles freed once.
    unsafe {
        packjit_map_free(wrong);
        packjit_map_free(counts);
        packjit_object_free(o.obj);
        packjit_program_free(o.count);
        packjit_program_free(o.stage2);
        packjit_runtime_destroy(o.rt);
    }
}

unsafe extern "C" fn reenter(user: *mut c_void, _: *const c_void, _: usize) {
    // SAFETY: `user` is (the ring, the result slot).
    let (rb, out) = unsafe { &mut *user.cast::<(*const PackjitMap, i64)>() };
    // SAFETY: a live map; the callback is never called (the ring is busy).
    *out = unsafe { packjit_ringbuf_consume(*rb, Some(reenter), null_mut()) };
}

#[test]
fn a_callback_consuming_its_own_ring_again_gets_ebusy() {
    let o = open_maps_run(&[], 0);
    let events = object_map(o.obj, "events");
    run_ctx(o.count, &mut [6u8; 20]);
    let mut state: (*const PackjitMap, i64) = (events, 0);
    // SAFETY: live map; the callback gets `state`.
    let n = unsafe {
        packjit_ringbuf_consume(
            events,
            Some(reenter),
            (&mut state as *mut (*const PackjitMap, i64)).cast(),
        )
    };
    assert_eq!(n, 1);
    assert_eq!(state.1, -EBUSY);
    // SAFETY: handles freed once.
    unsafe {
        packjit_map_free(events);
        packjit_object_free(o.obj);
        packjit_program_free(o.count);
        packjit_program_free(o.stage2);
        packjit_runtime_destroy(o.rt);
    }
}

#[test]
fn null_and_garbage_arguments_are_refused_never_a_crash() {
    let garbage = [0x5au64; 16];
    let gm = garbage.as_ptr().cast::<PackjitMap>();
    let go = garbage.as_ptr().cast::<PackjitObject>();
    let gp = garbage.as_ptr().cast::<PackjitProgram>();
    let rt = host_runtime();
    let m = create(PACKJIT_MAP_TYPE_HASH, 4, 8, 4, 0, "m").unwrap();
    let k = 1u32.to_ne_bytes();
    let mut v = [0u8; 8];
    let mut sz = 0usize;
    let mut out_m = null_mut();
    let mut out_o = null_mut();
    let mut out_p = null_mut();
    let errno_is_einval = |rc: i64, what: &str| {
        assert_eq!(rc, -(EINVAL as i64), "{what}");
        assert_eq!(packjit_last_error_code(), PJ_ERR_INVALID_ARGUMENT, "{what}");
        assert!(!last_error().is_empty(), "{what}");
    };
    let refused = |st: i32, what: &str| {
        assert_eq!(st, PJ_ERR_INVALID_ARGUMENT, "{what}: {}", last_error());
    };
    // SAFETY: every pointer is NULL, a live handle, readable garbage, or a valid buffer.
    unsafe {
        for map in [null(), gm] {
            errno_is_einval(
                packjit_map_lookup(map, k.as_ptr().cast(), 4, v.as_mut_ptr().cast(), 8).into(),
                "lookup map",
            );
            errno_is_einval(
                packjit_map_update(map, k.as_ptr().cast(), 4, v.as_ptr().cast(), 8, 0).into(),
                "update map",
            );
            errno_is_einval(
                packjit_map_delete(map, k.as_ptr().cast(), 4).into(),
                "delete map",
            );
            errno_is_einval(
                packjit_map_next_key(map, null(), 0, v.as_mut_ptr().cast(), 4).into(),
                "next_key map",
            );
            errno_is_einval(
                packjit_map_push(map, v.as_ptr().cast(), 8, 0).into(),
                "push map",
            );
            errno_is_einval(
                packjit_map_pop(map, v.as_mut_ptr().cast(), 8).into(),
                "pop map",
            );
            errno_is_einval(
                packjit_map_peek(map, v.as_mut_ptr().cast(), 8).into(),
                "peek map",
            );
            errno_is_einval(
                packjit_ringbuf_consume(map, Some(collect), null_mut()),
                "consume map",
            );
            refused(packjit_map_value_size(map, &mut sz), "value_size map");
            let mut i = PackjitMapInfo::default();
            refused(packjit_map_info(map, &mut i), "info map");
            refused(packjit_map_ref(map, &mut out_m), "ref map");
            assert!(out_m.is_null());
            refused(
                packjit_prog_array_set(rt, map, 0, null()),
                "prog_array_set map",
            );
        }
        assert!(
            last_error().contains("not a PackjitMap handle"),
            "{}",
            last_error()
        );
        packjit_map_free(gm.cast_mut());
        assert_eq!(packjit_last_error_code(), PJ_ERR_INVALID_ARGUMENT);
        packjit_map_free(null_mut());
        // NULL buffers and lengths with a live map.
        errno_is_einval(
            packjit_map_lookup(m, null(), 4, v.as_mut_ptr().cast(), 8).into(),
            "NULL key",
        );
        errno_is_einval(
            packjit_map_lookup(m, k.as_ptr().cast(), 4, null_mut(), 8).into(),
            "NULL value",
        );
        errno_is_einval(
            packjit_map_update(m, k.as_ptr().cast(), 4, null(), 8, 0).into(),
            "NULL value",
        );
        errno_is_einval(packjit_map_delete(m, null(), 4).into(), "NULL key");
        errno_is_einval(
            packjit_map_next_key(m, null(), 0, null_mut(), 4).into(),
            "NULL next",
        );
        errno_is_einval(
            packjit_map_next_key(m, k.as_ptr().cast(), 4, v.as_mut_ptr().cast(), 8).into(),
            "next_len",
        );
        errno_is_einval(packjit_map_push(m, null(), 8, 0).into(), "NULL push");
        errno_is_einval(
            packjit_ringbuf_consume(m, Some(collect), null_mut()),
            "not a ring",
        );
        assert!(
            last_error().contains("BPF_MAP_TYPE_HASH"),
            "{}",
            last_error()
        );
        errno_is_einval(
            packjit_ringbuf_consume(m, None, null_mut()),
            "NULL callback",
        );
        refused(packjit_map_value_size(m, null_mut()), "NULL size");
        assert_eq!(packjit_map_info(m, null_mut()), PJ_ERR_INVALID_ARGUMENT);
        let mut bad = PackjitMapInfo {
            struct_size: 3,
            ..Default::default()
        };
        assert_eq!(packjit_map_info(m, &mut bad), PJ_ERR_ABI);
        refused(packjit_map_ref(m, null_mut()), "NULL out");
        refused(
            packjit_map_create(PACKJIT_MAP_TYPE_HASH, 4, 8, 4, 0, null(), null_mut()),
            "NULL out",
        );
        // NULL name is allowed ("map").
        check(
            packjit_map_create(PACKJIT_MAP_TYPE_HASH, 4, 8, 4, 0, null(), &mut out_m),
            "NULL name",
        );
        packjit_map_free(out_m);
        // Objects.
        refused(
            packjit_object_open(null(), 0, null(), null(), 0, &mut out_o),
            "empty object",
        );
        assert!(out_o.is_null());
        refused(
            packjit_object_open(null(), 8, null(), null(), 0, &mut out_o),
            "NULL object",
        );
        refused(
            packjit_object_open(garbage.as_ptr().cast(), 128, null(), null(), 0, &mut out_o),
            "garbage object",
        );
        refused(
            packjit_object_open(null(), 0, null(), null(), 1, &mut out_o),
            "NULL host arrays",
        );
        let bytes = compile_bpf("maps_run");
        refused(
            packjit_object_open(bytes.as_ptr(), bytes.len(), null(), null(), 0, null_mut()),
            "NULL out",
        );
        let nm = CString::new("counts").unwrap();
        refused(
            packjit_object_open(
                bytes.as_ptr(),
                bytes.len(),
                [nm.as_ptr()].as_ptr(),
                [gm].as_ptr(),
                1,
                &mut out_o,
            ),
            "garbage host map",
        );
        assert!(last_error().contains("host_maps[0]"), "{}", last_error());
        refused(
            packjit_object_open(
                bytes.as_ptr(),
                bytes.len(),
                [null()].as_ptr(),
                [m.cast_const()].as_ptr(),
                1,
                &mut out_o,
            ),
            "NULL host map name",
        );
        assert!(
            last_error().contains("host_map_names[0]"),
            "{}",
            last_error()
        );
        check(
            packjit_object_open(bytes.as_ptr(), bytes.len(), null(), null(), 0, &mut out_o),
            "open",
        );
        let sec = CString::new("pj/count").unwrap();
        for obj in [null(), go] {
            let mut n = 0usize;
            refused(packjit_object_map_count(obj, &mut n), "map_count obj");
            refused(packjit_object_map(obj, nm.as_ptr(), &mut out_m), "map obj");
            let mut buf = [0 as std::ffi::c_char; 16];
            refused(
                packjit_object_map_name(obj, 0, buf.as_mut_ptr(), 16),
                "map_name obj",
            );
            refused(
                packjit_object_load(obj, rt, sec.as_ptr(), null(), null(), &mut out_p),
                "load obj",
            );
            refused(
                packjit_object_init_prog_arrays(obj, rt, null(), null(), 0),
                "init obj",
            );
        }
        packjit_object_free(go.cast_mut());
        assert_eq!(packjit_last_error_code(), PJ_ERR_INVALID_ARGUMENT);
        packjit_object_free(null_mut());
        refused(packjit_object_map(out_o, null(), &mut out_m), "NULL name");
        let missing = CString::new("nope").unwrap();
        refused(
            packjit_object_map(out_o, missing.as_ptr(), &mut out_m),
            "unknown map",
        );
        assert!(
            last_error().contains("`nope`") && last_error().contains("`counts`"),
            "{}",
            last_error()
        );
        assert!(out_m.is_null());
        refused(
            packjit_object_map(out_o, nm.as_ptr(), null_mut()),
            "NULL out",
        );
        refused(packjit_object_map_count(out_o, null_mut()), "NULL count");
        refused(
            packjit_object_map_name(out_o, 0, null_mut(), 16),
            "NULL buf",
        );
        let mut tiny = [0 as std::ffi::c_char; 3];
        refused(
            packjit_object_map_name(out_o, 0, tiny.as_mut_ptr(), 3),
            "small buf",
        );
        assert!(last_error().contains("too small"), "{}", last_error());
        refused(
            packjit_object_map_name(out_o, 9, tiny.as_mut_ptr(), 3),
            "index",
        );
        refused(
            packjit_object_load(out_o, null(), sec.as_ptr(), null(), null(), &mut out_p),
            "NULL rt",
        );
        refused(
            packjit_object_load(out_o, rt, null(), null(), null(), &mut out_p),
            "no selector",
        );
        refused(
            packjit_object_load(out_o, rt, sec.as_ptr(), sec.as_ptr(), null(), &mut out_p),
            "two selectors",
        );
        refused(
            packjit_object_load(out_o, rt, sec.as_ptr(), null(), null(), null_mut()),
            "NULL out",
        );
        let mut opts = PackjitLoadOptions::default();
        check(
            packjit_load_options_init(&mut opts),
            "packjit_load_options_init",
        );
        let maps = [m.cast_const()];
        opts.maps = maps.as_ptr();
        opts.map_count = 1;
        refused(
            packjit_object_load(out_o, rt, sec.as_ptr(), null(), &opts, &mut out_p),
            "opts->maps",
        );
        assert!(last_error().contains("opts->maps"), "{}", last_error());
        assert!(out_p.is_null());
        let unknown = CString::new("pj/none").unwrap();
        assert_ne!(
            packjit_object_load(out_o, rt, unknown.as_ptr(), null(), null(), &mut out_p),
            PJ_OK
        );
        assert!(out_p.is_null());
        // init_prog_arrays: counts without arrays, NULL / garbage programs, missing names.
        refused(
            packjit_object_init_prog_arrays(out_o, rt, null(), null(), 1),
            "NULL arrays",
        );
        let st2 = CString::new("stage2").unwrap();
        refused(
            packjit_object_init_prog_arrays(out_o, rt, [st2.as_ptr()].as_ptr(), [gp].as_ptr(), 1),
            "garbage program",
        );
        assert!(last_error().contains("programs[0]"), "{}", last_error());
        refused(
            packjit_object_init_prog_arrays(
                out_o,
                rt,
                [st2.as_ptr()].as_ptr(),
                [null()].as_ptr(),
                1,
            ),
            "NULL program",
        );
        refused(
            packjit_object_init_prog_arrays(out_o, rt, null(), null(), 0),
            "nothing given",
        );
        assert!(
            last_error().contains("`stage2`") && last_error().contains("slot 1"),
            "{}",
            last_error()
        );
        refused(
            packjit_object_init_prog_arrays(out_o, null(), null(), null(), 0),
            "NULL rt",
        );
        // prog_array_set with a garbage program.
        let stages = object_map(out_o, "stages");
        refused(packjit_prog_array_set(rt, stages, 0, gp), "garbage program");
        assert!(last_error().contains("prog"), "{}", last_error());
        // A double free of a map handle is refused while the memory is not reused.
        packjit_map_free(stages);
        packjit_object_free(out_o);
        packjit_map_free(m);
        packjit_runtime_destroy(rt);
    }
}

#[test]
fn lpm_tries_match_the_longest_prefix_with_the_kernels_errno() {
    const ENOSPC: i32 = 28;
    let key = |plen: u32, a: [u8; 4]| [plen.to_ne_bytes(), a].concat();
    let v = |x: u64| x.to_ne_bytes();
    // The kernel refuses a trie without BPF_F_NO_PREALLOC, and data sizes past 256 bytes.
    let e = create(PACKJIT_MAP_TYPE_LPM_TRIE, 8, 8, 4, 0, "pre").unwrap_err();
    assert!(
        e.contains("`pre`") && e.contains("BPF_F_NO_PREALLOC"),
        "{e}"
    );
    let flags = PACKJIT_BPF_F_NO_PREALLOC;
    let e = create(PACKJIT_MAP_TYPE_LPM_TRIE, 261, 8, 4, flags, "wide").unwrap_err();
    assert!(e.contains("`wide`") && e.contains("key_size"), "{e}");
    let m = create(PACKJIT_MAP_TYPE_LPM_TRIE, 8, 8, 3, flags, "routes").unwrap();
    assert_eq!(
        update(m, &key(8, [10, 0, 0, 0]), &v(8), PACKJIT_BPF_NOEXIST),
        0
    );
    assert_eq!(
        update(m, &key(24, [10, 1, 2, 0]), &v(24), PACKJIT_BPF_ANY),
        0
    );
    assert_eq!(
        update(m, &key(8, [10, 9, 9, 9]), &v(9), PACKJIT_BPF_NOEXIST),
        -EEXIST
    );
    assert_eq!(
        update(m, &key(16, [10, 1, 0, 0]), &v(16), PACKJIT_BPF_EXIST),
        -ENOENT
    );
    assert_eq!(
        update(m, &key(33, [10, 1, 0, 0]), &v(16), PACKJIT_BPF_ANY),
        -EINVAL
    );
    assert_eq!(
        update(m, &key(16, [10, 1, 0, 0]), &v(16), PACKJIT_BPF_ANY),
        0
    );
    assert_eq!(
        update(m, &key(0, [0; 4]), &v(0), PACKJIT_BPF_ANY),
        -ENOSPC,
        "full"
    );
    assert!(last_error().contains("`routes`"), "{}", last_error());
    // Longest prefix within the key's own length.
    assert_eq!(lookup(m, &key(32, [10, 1, 2, 3]), 8), Ok(v(24).to_vec()));
    assert_eq!(lookup(m, &key(23, [10, 1, 2, 3]), 8), Ok(v(16).to_vec()));
    assert_eq!(lookup(m, &key(32, [10, 7, 0, 0]), 8), Ok(v(8).to_vec()));
    assert_eq!(lookup(m, &key(32, [11, 0, 0, 0]), 8), Err(-ENOENT));
    // next_key: the kernel's postorder, longer prefixes first.
    assert_eq!(
        keys(m, 8),
        [
            key(24, [10, 1, 2, 0]),
            key(16, [10, 1, 0, 0]),
            key(8, [10, 0, 0, 0])
        ]
    );
    // Exact deletes only.
    // SAFETY: live map; 8-byte keys.
    let del = |k: &[u8]| unsafe { packjit_map_delete(m, k.as_ptr().cast(), 8) };
    assert_eq!(del(&key(12, [10, 0, 0, 0])), -ENOENT);
    assert_eq!(del(&key(16, [10, 1, 0, 0])), 0);
    assert_eq!(lookup(m, &key(23, [10, 1, 2, 3]), 8), Ok(v(8).to_vec()));
    let i = info(m);
    assert_eq!(
        (i.map_type, i.key_size, i.entries, i.flags),
        (PACKJIT_MAP_TYPE_LPM_TRIE, 8, 2, flags)
    );
    // SAFETY: from create, freed once.
    unsafe { packjit_map_free(m) };
}
