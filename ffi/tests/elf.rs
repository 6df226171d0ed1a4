//! The ELF part of the C API, driven as a C host would: `packjit_program_load_elf` on an
//! object clang compiles from `tests/bpf/globals.c` at test time, the global-data
//! accessors, and the named errors. Programs run where a backend targets the host (arm64 /
//! riscv64 under qemu in the cross runs); elsewhere they are compiled for arm64 only.

#[path = "../../runtime/tests/elf_support/mod.rs"]
mod elf_support;
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;

use elf_support::*;
use packjit::*;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};

// Keep the rlibs linked so cargo builds the cdylibs this test loads.
#[allow(unused_imports)]
use {packjit_arm64 as _, packjit_rv64 as _};

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(packjit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

struct Rt(*mut PackjitRuntime);

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: created by packjit_runtime_create, destroyed once.
        unsafe { packjit_runtime_destroy(self.0) };
    }
}

fn runtime(with_helper: bool) -> Rt {
    let mut rt = null_mut();
    // SAFETY: valid out pointer; NULL config = defaults.
    assert_eq!(unsafe { packjit_runtime_create(null(), &mut rt) }, PJ_OK);
    let rt = Rt(rt);
    let mut n = 0u64;
    // SAFETY: live runtime; NULL dir = next to the test binary.
    let st = unsafe { packjit_load_plugins(rt.0, null(), &mut n) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    if with_helper {
        let name = CString::new("pj_mix").unwrap();
        // SAFETY: live runtime; a static helper.
        let st = unsafe { packjit_register_helper(rt.0, PJ_MIX_ID, name.as_ptr(), Some(pj_mix)) };
        assert_eq!(st, PJ_OK, "{}", last_error());
    }
    rt
}

/// The host's arch code when a loaded backend targets it, else arm64 (compile only).
fn arch_and_runnable() -> (u32, bool) {
    match packjit_runtime::Arch::host() {
        Some(a @ (packjit_runtime::Arch::Aarch64 | packjit_runtime::Arch::Riscv64)) => {
            (a.code(), true)
        }
        _ => (packjit_runtime::Arch::Aarch64.code(), false),
    }
}

fn load_elf(
    rt: &Rt,
    obj: &[u8],
    section: Option<&str>,
    function: Option<&str>,
    flags: u32,
) -> Result<*mut PackjitProgram, (i32, String)> {
    let s = section.map(|s| CString::new(s).unwrap());
    let f = function.map(|s| CString::new(s).unwrap());
    let opts = PackjitLoadOptions {
        struct_size: std::mem::size_of::<PackjitLoadOptions>() as u32,
        arch: arch_and_runnable().0,
        flags,
        ..Default::default()
    };
    let mut p = null_mut();
    // SAFETY: valid runtime, buffers, strings and out pointer.
    let st = unsafe {
        packjit_program_load_elf(
            rt.0,
            obj.as_ptr(),
            obj.len(),
            s.as_ref().map_or(null(), |s| s.as_ptr()),
            f.as_ref().map_or(null(), |s| s.as_ptr()),
            &opts,
            &mut p,
        )
    };
    if st == PJ_OK {
        Ok(p)
    } else {
        assert!(p.is_null());
        Err((st, last_error()))
    }
}

fn global_u64(p: *const PackjitProgram, name: &str) -> u64 {
    let n = CString::new(name).unwrap();
    let mut size = 0usize;
    // SAFETY: live program, valid name and out pointer.
    let st = unsafe { packjit_program_global_size(p, n.as_ptr(), &mut size) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    assert!(size <= 8);
    let mut b = [0u8; 8];
    // SAFETY: `size` bytes fit in b.
    let st = unsafe { packjit_program_global_read(p, n.as_ptr(), 0, b.as_mut_ptr(), size) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    u64::from_le_bytes(b)
}

#[test]
fn load_elf_run_and_access_globals_through_the_c_api() {
    let rt = runtime(true);
    let obj = compile_bpf("globals");
    let p = match load_elf(&rt, &obj, Some("pj/globals"), None, 0) {
        Ok(p) => p,
        // Backends without the sandbox yet: trusted (the test program stays in bounds).
        Err((PJ_ERR_UNSUPPORTED, _)) => {
            load_elf(&rt, &obj, Some("pj/globals"), None, PACKJIT_LOAD_TRUSTED).unwrap()
        }
        Err(e) => panic!("{e:?}"),
    };
    assert_eq!(global_u64(p, "runs"), 7, ".data initial value");
    let runs = CString::new("runs").unwrap();
    let v = 1000u64.to_le_bytes();
    // SAFETY: live program; 8 readable bytes.
    let st = unsafe { packjit_program_global_write(p, runs.as_ptr(), 0, v.as_ptr(), 8) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    assert_eq!(global_u64(p, "runs"), 1000);
    // Out of range and unknown names are errors.
    // SAFETY: as above.
    let st = unsafe { packjit_program_global_write(p, runs.as_ptr(), 4, v.as_ptr(), 8) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("outside `runs`"), "{}", last_error());
    let nope = CString::new("nope").unwrap();
    let mut size = 0usize;
    // SAFETY: as above.
    let st = unsafe { packjit_program_global_size(p, nope.as_ptr(), &mut size) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    if arch_and_runnable().1 {
        let mut ctx = [5u8, 6, 7];
        let mut r0 = 0;
        // SAFETY: live program, ctx buffer.
        let st = unsafe { packjit_program_run(p, ctx.as_mut_ptr().cast(), ctx.len(), &mut r0) };
        assert_eq!(st, PJ_OK, "{}", last_error());
        assert_eq!(global_u64(p, "runs"), 1001);
        assert_eq!(global_u64(p, "bytes_seen"), 3);
        assert_eq!(global_u64(p, "last_len"), 3);
    }
    // SAFETY: freed once.
    unsafe { packjit_program_free(p) };
}

#[test]
fn load_elf_errors_are_named() {
    let obj = compile_bpf("globals");
    let rt = runtime(false);
    let (st, m) = load_elf(&rt, &obj, Some("pj/globals"), None, 0).unwrap_err();
    assert_eq!(st, PJ_ERR_UNKNOWN_HELPER);
    assert!(m.contains("`pj_mix`") && m.contains("R_BPF_64_32"), "{m}");
    let (st, m) = load_elf(&rt, &obj, None, None, 0).unwrap_err();
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(m.contains("exactly one of section and function"), "{m}");
    let (st, m) = load_elf(&rt, &obj, Some("a"), Some("b"), 0).unwrap_err();
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT, "{m}");
    let (st, m) = load_elf(&rt, &obj[..100], Some("pj/globals"), None, 0).unwrap_err();
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(m.starts_with("ELF: "), "{m}");
    let maps = compile_bpf("bad_maps");
    let (st, m) = load_elf(&rt, &maps, Some("pj/maps"), None, 0).unwrap_err();
    assert_eq!(st, PJ_ERR_UNSUPPORTED);
    assert!(m.contains(".maps"), "{m}");
    // A program loaded from bytecode has no globals.
    let code = [0xb7u8, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let opts = PackjitLoadOptions {
        struct_size: std::mem::size_of::<PackjitLoadOptions>() as u32,
        arch: packjit_runtime::Arch::Aarch64.code(),
        flags: PACKJIT_LOAD_TRUSTED,
        ..Default::default()
    };
    let mut p = null_mut();
    // SAFETY: valid arguments.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    let runs = CString::new("runs").unwrap();
    let mut size = 0;
    // SAFETY: live program.
    let st = unsafe { packjit_program_global_size(p, runs.as_ptr(), &mut size) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("no globals"), "{}", last_error());
    // SAFETY: freed once.
    unsafe { packjit_program_free(p) };
}
