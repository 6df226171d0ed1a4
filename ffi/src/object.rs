//! eBPF objects with maps (libbpf-style clang objects): open (creating the object's maps or
//! taking the host's), their maps, loading their programs, filling their prog arrays.

use super::args::{arg, bytes, c_name, out_arg};
use super::error::{boundary, invalid};
use super::maps::{map_handle, new_map_handle, slot_program, PackjitMap};
use super::options::{load_options, PackjitLoadOptions};
use super::program::{new_program, PackjitProgram};
use super::runtime::{runtime, PackjitRuntime};
use super::DEAD_MAGIC;
use core::ffi::c_char;
use packjit_runtime::maps::Map;
use packjit_runtime::{ElfLoadOptions, ElfObject, Error, Trust};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const OBJECT_MAGIC: u64 = 0x706a_5f6f_626a_3121; // "pj_obj1!"

/// An opaque eBPF object: a relocatable clang object (copied) and its maps. Every program
/// loaded from it uses the same maps. Its functions may be called from several threads at
/// once; freeing it while another thread uses it is a caller bug.
pub struct PackjitObject {
    magic: AtomicU64,
    obj: ElfObject,
}

/// # Safety
/// `p` NULL or a pointer to a live (or freed, not yet reused) object.
unsafe fn object<'a>(p: *const PackjitObject) -> Result<&'a PackjitObject, Error> {
    // SAFETY: forwarded.
    let o = unsafe { arg(p, "obj") }?;
    match o.magic.load(Ordering::Acquire) {
        OBJECT_MAGIC => Ok(o),
        DEAD_MAGIC => Err(invalid("obj was already freed")),
        _ => Err(invalid("obj is not a PackjitObject handle")),
    }
}

/// # Safety
/// `names` NULL or `n` NUL-terminated strings (or NULLs).
unsafe fn names_arg(
    names: *const *const c_char,
    n: usize,
    what: &str,
) -> Result<Vec<String>, Error> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if names.is_null() {
        return Err(invalid(format!("{what} is NULL but the count is {n}")));
    }
    // SAFETY: caller contract: `n` readable entries.
    let raw = unsafe { std::slice::from_raw_parts(names, n) };
    raw.iter()
        .enumerate()
        .map(|(i, &p)| {
            let w = format!("{what}[{i}]");
            // SAFETY: caller contract.
            unsafe { c_name(p, &w) }?.ok_or_else(|| invalid(format!("{w} is NULL")))
        })
        .collect()
}

/// # Safety
/// `ptrs` NULL or `n` readable pointers.
unsafe fn ptrs_arg<'a, T>(
    ptrs: *const *const T,
    n: usize,
    what: &str,
) -> Result<&'a [*const T], Error> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptrs.is_null() {
        return Err(invalid(format!("{what} is NULL but the count is {n}")));
    }
    if n > isize::MAX as usize / size_of::<*const T>() {
        return Err(invalid(format!("{what}: count {n} is too large")));
    }
    // SAFETY: caller contract.
    Ok(unsafe { std::slice::from_raw_parts(ptrs, n) })
}

/// Opens a relocatable eBPF object (`clang -O2 -target bpf -c`, `obj_len` bytes, copied):
/// reads its BTF-defined (`.maps`) and legacy (`maps`) map definitions and creates its maps,
/// except those the host supplies: `host_map_names[i]` is served by `host_maps[i]`
/// (`host_map_count` pairs; both NULL when 0), which must have the object's type, key and
/// value sizes (the object takes its own reference; the handles stay the caller's). Errors
/// name the map and the field (`PJ_ERR_INVALID_ARGUMENT`, `PJ_ERR_UNSUPPORTED`). On success
/// `*out` receives a new object (the caller's, released with `packjit_object_free`); on
/// failure NULL.
///
/// # Safety
/// `obj` NULL or readable for `obj_len` bytes; `host_map_names` / `host_maps` NULL or
/// `host_map_count` NUL-terminated names / live map handles; `out` NULL (refused) or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_open(
    obj: *const u8,
    obj_len: usize,
    host_map_names: *const *const c_char,
    host_maps: *const *const PackjitMap,
    host_map_count: usize,
    out: *mut *mut PackjitObject,
) -> i32 {
    boundary("packjit_object_open", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let obj = unsafe { bytes(obj, obj_len, "obj") }?;
        // SAFETY: caller contract.
        let names = unsafe { names_arg(host_map_names, host_map_count, "host_map_names") }?;
        // SAFETY: caller contract.
        let handles = unsafe { ptrs_arg(host_maps, host_map_count, "host_maps") }?;
        let mut maps: Vec<Arc<Map>> = Vec::with_capacity(handles.len());
        for (i, &m) in handles.iter().enumerate() {
            // SAFETY: caller contract.
            maps.push(
                unsafe { map_handle(m, &format!("host_maps[{i}]")) }?
                    .map
                    .clone(),
            );
        }
        let host: Vec<(&str, Arc<Map>)> = names.iter().map(String::as_str).zip(maps).collect();
        let o = ElfObject::open(obj, &host)?;
        *out = Box::into_raw(Box::new(PackjitObject {
            magic: AtomicU64::new(OBJECT_MAGIC),
            obj: o,
        }));
        Ok(())
    })
}

/// Releases an object. NULL is ignored. Its maps live on while programs loaded from it,
/// prog-array slots holding them, or map handles (`packjit_object_map`) have them.
///
/// # Safety
/// `obj` NULL or a handle from `packjit_object_open` no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_free(obj: *mut PackjitObject) {
    if obj.is_null() {
        return;
    }
    boundary("packjit_object_free", || {
        // SAFETY: caller contract.
        let o = unsafe { object(obj) }?;
        if o.magic.swap(DEAD_MAGIC, Ordering::AcqRel) != OBJECT_MAGIC {
            return Err(invalid("obj was freed concurrently"));
        }
        // SAFETY: from Box::into_raw; the magic swap made this the only free.
        drop(unsafe { Box::from_raw(obj) });
        Ok(())
    });
}

/// `*count` receives the number of the object's maps (`packjit_object_map_name` names
/// them, in the object's order).
///
/// # Safety
/// `obj` NULL or live; `count` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_map_count(
    obj: *const PackjitObject,
    count: *mut usize,
) -> i32 {
    boundary("packjit_object_map_count", || {
        // SAFETY: caller contract.
        let count = unsafe { out_arg(count, "count") }?;
        // SAFETY: caller contract.
        *count = unsafe { object(obj) }?.obj.maps().count();
        Ok(())
    })
}

/// Copies the name of the object's map `index` (NUL-terminated) into `buf` (`buf_len`
/// bytes); a buffer too small is refused (nothing copied) naming the size needed.
///
/// # Safety
/// `obj` NULL or live; `buf` NULL (refused) or writable for `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_map_name(
    obj: *const PackjitObject,
    index: usize,
    buf: *mut c_char,
    buf_len: usize,
) -> i32 {
    boundary("packjit_object_map_name", || {
        // SAFETY: caller contract.
        let o = unsafe { object(obj) }?;
        if buf.is_null() {
            return Err(invalid("buf is NULL"));
        }
        let n = o.obj.maps().count();
        let (name, _) = o
            .obj
            .maps()
            .nth(index)
            .ok_or_else(|| invalid(format!("index {index}: the object has {n} maps")))?;
        if name.len() >= buf_len {
            return Err(invalid(format!(
                "buf_len {buf_len} is too small for map name `{name}` ({} bytes with the NUL)",
                name.len() + 1
            )));
        }
        // SAFETY: caller contract; name.len() + 1 <= buf_len.
        unsafe {
            core::ptr::copy_nonoverlapping(name.as_ptr(), buf.cast::<u8>(), name.len());
            *buf.add(name.len()) = 0;
        }
        Ok(())
    })
}

/// The object's map `name` (its symbol, e.g. `"counts"`): `*out` receives a NEW handle
/// (a reference of the caller's, released with `packjit_map_free`, independent of the
/// object: it stays valid after `packjit_object_free`). An unknown name is refused naming
/// it; `*out` is then NULL.
///
/// # Safety
/// `obj` NULL or live; `name` NULL (refused) or NUL-terminated; `out` NULL (refused) or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_map(
    obj: *const PackjitObject,
    name: *const c_char,
    out: *mut *mut PackjitMap,
) -> i32 {
    boundary("packjit_object_map", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: caller contract.
        let name = unsafe { c_name(name, "name") }?.ok_or_else(|| invalid("name is NULL"))?;
        let m = o.obj.map(&name).ok_or_else(|| {
            let have: Vec<_> = o.obj.maps().map(|(n, _)| format!("`{n}`")).collect();
            invalid(format!(
                "the object has no map `{name}` (it has: {})",
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ))
        })?;
        *out = new_map_handle(m.clone());
        Ok(())
    })
}

/// Loads one program of the object with the object's maps, as `packjit_program_load_elf`
/// (exactly one of `section` / `function`, the other NULL; sandboxed unless `opts` has
/// `PACKJIT_LOAD_TRUSTED`; `opts` NULL for the defaults, `opts->maps` must be empty). Every
/// program loaded from one object shares its maps. On success `*out` receives a new
/// program (the caller's, released with `packjit_program_free`); on failure NULL and the
/// error names the section, symbol or relocation.
///
/// # Safety
/// `obj`, `rt` NULL or live; `section`, `function` NULL or NUL-terminated; `opts` NULL or a
/// `PackjitLoadOptions` with `struct_size` set; `out` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_load(
    obj: *const PackjitObject,
    rt: *const PackjitRuntime,
    section: *const c_char,
    function: *const c_char,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
) -> i32 {
    boundary("packjit_object_load", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        if !opts.maps.is_empty() {
            return Err(invalid(
                "opts->maps must be empty: an object's programs use the object's maps (pass host maps to packjit_object_open)",
            ));
        }
        // SAFETY: caller contract.
        let sel = match unsafe { (c_name(section, "section")?, c_name(function, "function")?) } {
            (Some(s), None) => ElfLoadOptions::section(&s),
            (None, Some(f)) => ElfLoadOptions::function(&f),
            _ => {
                return Err(invalid(
                    "give exactly one of section and function (the other NULL)",
                ))
            }
        };
        let prog = match trust {
            Trust::Sandboxed => o.obj.load(&h.rt, &sel, &opts)?,
            // SAFETY: PACKJIT_LOAD_TRUSTED is the C caller's promise that the program only
            // touches memory it may (see the flag's documentation).
            Trust::Trusted => unsafe { o.obj.load_trusted(&h.rt, &sel, &opts) }?,
        };
        *out = new_program(&h.rt, prog);
        Ok(())
    })
}

/// Fills the prog arrays the object initialises statically (`.values = { [i] = &prog }`),
/// as libbpf does after loading: `names[i]` (a function or section name) is `programs[i]`
/// (`count` pairs, programs of `rt`). A slot naming a program not given is refused naming
/// the map, the slot and the program, and then no slot is filled. The slots take their own
/// references (see `packjit_prog_array_set`: the handles stay the caller's, and the slots
/// keep the programs, and through them the maps, alive until emptied).
///
/// # Safety
/// `obj`, `rt` NULL or live; `names` / `programs` NULL or `count` NUL-terminated names /
/// live program handles.
#[no_mangle]
pub unsafe extern "C" fn packjit_object_init_prog_arrays(
    obj: *const PackjitObject,
    rt: *const PackjitRuntime,
    names: *const *const c_char,
    programs: *const *const PackjitProgram,
    count: usize,
) -> i32 {
    boundary("packjit_object_init_prog_arrays", || {
        // SAFETY: caller contract.
        let o = unsafe { object(obj) }?;
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let names = unsafe { names_arg(names, count, "names") }?;
        // SAFETY: caller contract.
        let ptrs = unsafe { ptrs_arg(programs, count, "programs") }?;
        let mut progs = Vec::with_capacity(count);
        for (i, &p) in ptrs.iter().enumerate() {
            // SAFETY: caller contract.
            progs.push(unsafe { slot_program(h, p, &format!("programs[{i}]")) }?);
        }
        let pairs: Vec<(&str, _)> = names.iter().map(String::as_str).zip(progs).collect();
        o.obj.init_prog_arrays(&h.rt, &pairs)
    })
}
