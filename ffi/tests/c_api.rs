//! The C API, driven from Rust exactly as a C host would call it, with a backend written in
//! C (ffi/tests/c-backend/c_backend.c, compiled here into a plugin and loaded by the
//! runtime): load, run, batch, dump, stats, errors, bad arguments, deferred free.

// The C API compiled into this test binary. The ffi crate builds no rlib: its library is
// named `packjit` (for libpackjit.so / libpackjit.a), the runtime's rlib already has that
// file name, and cargo refuses to let two rlibs collide.
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;
use packjit::*;
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The C compiler for the target this test runs on (a cross gcc under qemu; the guest's
/// execve of the x86 compiler goes straight to the host kernel). `PACKJIT_CC` overrides.
fn c_compiler() -> String {
    if let Ok(cc) = std::env::var("PACKJIT_CC") {
        return cc;
    }
    let native = Command::new("uname")
        .arg("-m")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let me = std::env::consts::ARCH;
    if native == me {
        "cc".into()
    } else {
        match me {
            "aarch64" => "aarch64-linux-gnu-gcc".into(),
            "riscv64" => "riscv64-linux-gnu-gcc".into(),
            _ => "cc".into(),
        }
    }
}

/// Builds the C backend once per test process.
fn c_backend() -> &'static CString {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{}-libpackjit_cbackend.so", std::env::consts::ARCH));
        let cc = c_compiler();
        let res = Command::new(&cc)
            .args([
                "-std=c99",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-shared",
            ])
            .args(["-fPIC", "-O1", "-o"])
            .arg(&out)
            .arg("-I")
            .arg(dir.join("../include"))
            .arg(dir.join("tests/c-backend/c_backend.c"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(
            res.status.success(),
            "{cc} failed on c_backend.c:\n{}",
            String::from_utf8_lossy(&res.stderr)
        );
        CString::new(out.into_os_string().into_encoded_bytes()).unwrap()
    })
}

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(packjit_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn insn(op: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = op;
    b[1] = regs;
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

fn prog(insns: &[[u8; 8]]) -> Vec<u8> {
    insns.concat()
}

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

fn mov_r0(imm: i32) -> Vec<u8> {
    prog(&[insn(0xb7, 0, 0, imm), EXIT])
}

struct Rt(*mut PackjitRuntime);

fn trusted_opts() -> PackjitLoadOptions {
    let mut opts = PackjitLoadOptions::default();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { packjit_load_options_init(&mut opts) }, PJ_OK);
    opts.flags = PACKJIT_LOAD_TRUSTED;
    opts
}

impl Rt {
    fn new() -> Self {
        let mut rt = null_mut();
        // SAFETY: valid out pointer; NULL config = defaults.
        let st = unsafe { packjit_runtime_create(null(), &mut rt) };
        assert_eq!(st, PJ_OK, "{}", last_error());
        Self(rt)
    }

    fn with_backend() -> Self {
        let rt = Self::new();
        let mut info = info_struct();
        // SAFETY: valid runtime, path and info.
        let st = unsafe { packjit_load_plugin(rt.0, c_backend().as_ptr(), &mut info) };
        assert_eq!(st, PJ_OK, "{}", last_error());
        rt
    }

    /// Loads trusted code: the C test backend emits plain code and (rightly) refuses the
    /// sandbox flag it cannot honour.
    fn load(&self, code: &[u8]) -> Result<*mut PackjitProgram, (i32, String, i64)> {
        let mut p = null_mut();
        let opts = trusted_opts();
        // SAFETY: valid runtime, buffers and options.
        let st = unsafe { packjit_program_load(self.0, code.as_ptr(), code.len(), &opts, &mut p) };
        if st == PJ_OK {
            assert!(!p.is_null());
            Ok(p)
        } else {
            assert!(p.is_null(), "failed load must leave *out NULL");
            Err((st, last_error(), packjit_last_error_pc()))
        }
    }

    fn stats(&self) -> PackjitArenaStats {
        let mut s = PackjitArenaStats {
            struct_size: size_of::<PackjitArenaStats>() as u32,
            ..Default::default()
        };
        // SAFETY: valid runtime and out struct.
        assert_eq!(unsafe { packjit_runtime_stats(self.0, &mut s) }, PJ_OK);
        s
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        // SAFETY: created by packjit_runtime_create, destroyed once.
        unsafe { packjit_runtime_destroy(self.0) };
    }
}

fn info_struct() -> PackjitBackendInfo {
    PackjitBackendInfo {
        struct_size: size_of::<PackjitBackendInfo>() as u32,
        arch: 0,
        supported_features: 0,
        detected_features: 0,
        name: [0; PACKJIT_NAME_LEN],
        version: [0; PACKJIT_NAME_LEN],
        origin: [0; PACKJIT_PATH_LEN],
    }
}

fn run(p: *const PackjitProgram) -> Result<u64, (i32, String)> {
    let mut r0 = 0u64;
    let mut ctx = [0u8; 16];
    // SAFETY: valid program (or deliberately bad, which must be refused), valid ctx.
    let st = unsafe { packjit_program_run(p, ctx.as_mut_ptr().cast(), ctx.len(), &mut r0) };
    if st == PJ_OK {
        Ok(r0)
    } else {
        Err((st, last_error()))
    }
}

fn host_arch_code() -> u32 {
    match std::env::consts::ARCH {
        "x86_64" => PJ_ARCH_X86_64,
        "aarch64" => PJ_ARCH_AARCH64,
        "riscv64" => PJ_ARCH_RISCV64,
        other => panic!("no C backend for {other}"),
    }
}

#[test]
fn c_backend_loads_compiles_and_runs() {
    let rt = Rt::new();
    let mut info = info_struct();
    // SAFETY: valid arguments.
    let st = unsafe { packjit_load_plugin(rt.0, c_backend().as_ptr(), &mut info) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    // SAFETY: NUL-terminated by the library.
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "cbackend");
    assert_eq!(info.arch, host_arch_code());
    let mut count = 0;
    // SAFETY: valid arguments.
    assert_eq!(unsafe { packjit_backend_count(rt.0, &mut count) }, PJ_OK);
    assert_eq!(count, 1);
    // A second backend for the same arch is refused.
    // SAFETY: valid arguments.
    let st = unsafe { packjit_load_plugin(rt.0, c_backend().as_ptr(), null_mut()) };
    assert_eq!(st, PJ_ERR_PLUGIN);
    assert!(last_error().contains("already loaded"), "{}", last_error());

    // 64-bit mov sign-extends, 32-bit mov zero-extends: both visible in r0.
    for (code, want) in [
        (mov_r0(42), 42u64),
        (mov_r0(-7), (-7i64) as u64),
        (mov_r0(i32::MIN), i32::MIN as i64 as u64),
        (prog(&[insn(0xb4, 0, 0, -1), EXIT]), 0xffff_ffff),
    ] {
        let p = rt.load(&code).expect("compiles");
        assert_eq!(run(p), Ok(want));
        // SAFETY: loaded above, freed once.
        unsafe { packjit_program_free(p) };
    }

    let p = rt.load(&mov_r0(42)).unwrap();
    let mut pi = PackjitProgramInfo::default();
    // SAFETY: valid arguments.
    assert_eq!(unsafe { packjit_program_info(p, &mut pi) }, PJ_OK);
    assert_eq!(pi.arch, host_arch_code());
    assert_eq!(pi.executable, 1);
    assert_ne!(pi.entry_addr, 0);

    // Dump: size query, too-small buffer, then the real copy.
    let mut size = 0usize;
    assert_eq!(
        // SAFETY: valid arguments.
        unsafe { packjit_program_code(p, null_mut(), 0, &mut size) },
        PJ_OK
    );
    assert_eq!(size as u64, pi.code_size);
    let mut small = vec![0u8; size - 1];
    // SAFETY: buffer of the given length.
    let st = unsafe { packjit_program_code(p, small.as_mut_ptr(), small.len(), &mut size) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("too small"), "{}", last_error());
    let mut code = vec![0u8; size];
    assert_eq!(
        // SAFETY: buffer of the given length.
        unsafe { packjit_program_code(p, code.as_mut_ptr(), code.len(), &mut size) },
        PJ_OK
    );
    if cfg!(target_arch = "x86_64") {
        assert_eq!(
            code,
            [0x48, 0xc7, 0xc0, 42, 0, 0, 0, 0xc3],
            "mov rax, 42; ret"
        );
    }
    // The entry point can be called directly too.
    let mut entry: Option<PjProgramEntry> = None;
    // SAFETY: valid arguments (Option<fn> has the C pointer layout).
    let st =
        unsafe { packjit_program_entry(p, (&mut entry as *mut Option<PjProgramEntry>).cast()) };
    assert_eq!(st, PJ_OK);
    packjit_epoch_enter();
    assert_eq!(
        // SAFETY: committed code with the PjProgramEntry signature; the program is alive.
        unsafe { entry.unwrap()(null_mut(), 0, &mut packjit_plugin_api::PjExecEnv::default()) },
        42
    );
    packjit_epoch_exit();

    // SAFETY: valid arguments. Let the frees above finish first.
    assert_eq!(unsafe { packjit_reclaim(rt.0, null_mut()) }, PJ_OK);
    let s = rt.stats();
    assert_eq!(s.allocations, 1, "{s:?}");
    assert_eq!(s.bytes_code, pi.code_size);
    // SAFETY: freed once.
    unsafe { packjit_program_free(p) };
    let mut pending = 99;
    // SAFETY: valid arguments.
    assert_eq!(unsafe { packjit_reclaim(rt.0, &mut pending) }, PJ_OK);
    assert_eq!(pending, 0);
    assert_eq!(rt.stats().allocations, 0);
}

#[test]
fn c_backend_refusals_name_the_pc_and_opcode() {
    let rt = Rt::with_backend();
    // mov r1, 1; exit: wrong destination register at pc 0.
    let (st, msg, pc) = rt.load(&prog(&[insn(0xb7, 1, 0, 1), EXIT])).unwrap_err();
    assert_eq!((st, pc), (PJ_ERR_UNSUPPORTED, 0), "{msg}");
    assert!(msg.starts_with("pc 0: opcode 0xb7 (regs 0x01)"), "{msg}");
    assert!(msg.contains("only `mov r0, imm; exit`"), "{msg}");
    assert_eq!(packjit_last_error_code(), PJ_ERR_UNSUPPORTED);
    // SAFETY: static string.
    let s = unsafe { CStr::from_ptr(packjit_status_str(st)) };
    assert_eq!(s.to_str().unwrap(), "unsupported by the backend");

    // mov r0, 1; add r0, 1; exit: unsupported second instruction.
    let (st, msg, pc) = rt
        .load(&prog(&[insn(0xb7, 0, 0, 1), insn(0x07, 0, 0, 1), EXIT]))
        .unwrap_err();
    assert_eq!((st, pc), (PJ_ERR_UNSUPPORTED, 1), "{msg}");
    assert!(msg.starts_with("pc 1: opcode 0x07"), "{msg}");

    // Trailing instructions after exit.
    let (st, _, pc) = rt
        .load(&prog(&[insn(0xb7, 0, 0, 1), EXIT, EXIT]))
        .unwrap_err();
    assert_eq!((st, pc), (PJ_ERR_UNSUPPORTED, 2));
    // Malformed bytecode: no exit, odd length, empty.
    let (st, msg, _) = rt.load(&prog(&[insn(0xb7, 0, 0, 1)])).unwrap_err();
    assert_eq!(st, PJ_ERR_VERIFY, "{msg}");
    let (st, _, _) = rt.load(&[0xb7, 0, 0]).unwrap_err();
    assert_eq!(st, PJ_ERR_VERIFY);
    let (st, _, pc) = rt.load(&[]).unwrap_err();
    assert_eq!((st, pc), (PJ_ERR_VERIFY, -1));
    // Nothing was left allocated by the failures.
    assert_eq!(rt.stats().allocations, 0);

    // A success clears the last error.
    let p = rt.load(&mov_r0(1)).unwrap();
    assert_eq!(last_error(), "");
    assert_eq!(packjit_last_error_code(), PJ_OK);
    assert_eq!(packjit_last_error_pc(), -1);
    // SAFETY: freed once.
    unsafe { packjit_program_free(p) };
}

#[test]
fn batch_commits_once_and_reports_each_program() {
    let rt = Rt::with_backend();
    let codes = [
        mov_r0(1),
        prog(&[insn(0xbf, 0x10, 0, 0), EXIT]),
        mov_r0(3),
        mov_r0(4),
    ];
    let ptrs: Vec<*const u8> = codes.iter().map(|c| c.as_ptr()).collect();
    let lens: Vec<usize> = codes.iter().map(|c| c.len()).collect();
    let mut out = [null_mut(); 4];
    let mut errs = [PjError::default(); 4];
    let before = rt.stats().commits;
    let opts = trusted_opts();
    // SAFETY: arrays of 4.
    let st = unsafe {
        packjit_program_load_batch(
            rt.0,
            ptrs.as_ptr(),
            lens.as_ptr(),
            4,
            &opts,
            out.as_mut_ptr(),
            errs.as_mut_ptr(),
        )
    };
    assert_eq!(st, PJ_ERR_UNSUPPORTED);
    assert!(
        last_error().starts_with("program 1: pc 0: opcode 0xbf"),
        "{}",
        last_error()
    );
    assert!(out[1].is_null());
    assert_eq!(errs[1].code, PJ_ERR_UNSUPPORTED);
    assert_eq!(errs[1].pc, 0);
    assert_eq!(errs[0].code, PJ_OK);
    assert_eq!(
        rt.stats().commits,
        before + 1,
        "one commit for the whole batch"
    );
    for (i, want) in [(0, 1), (2, 3), (3, 4)] {
        assert_eq!(run(out[i]), Ok(want));
    }
    for p in out {
        // SAFETY: each freed once; NULL ignored.
        unsafe { packjit_program_free(p) };
    }
    // An empty batch is fine; a NULL out array is not.
    assert_eq!(
        // SAFETY: count 0 reads nothing.
        unsafe {
            packjit_program_load_batch(rt.0, null(), null(), 0, null(), null_mut(), null_mut())
        },
        PJ_OK
    );
    assert_eq!(
        // SAFETY: refused before any access.
        unsafe {
            packjit_program_load_batch(
                rt.0,
                ptrs.as_ptr(),
                lens.as_ptr(),
                4,
                null(),
                null_mut(),
                null_mut(),
            )
        },
        PJ_ERR_INVALID_ARGUMENT
    );
}

#[test]
fn null_and_bad_arguments_are_errors_not_crashes() {
    let mut rt = null_mut();
    // SAFETY: every call below passes NULL or deliberately wrong values the API must refuse.
    unsafe {
        assert_eq!(
            packjit_runtime_create(null(), null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(last_error(), "out is NULL");
        let mut cfg = std::mem::zeroed::<PackjitConfig>();
        assert_eq!(packjit_runtime_create(&cfg, &mut rt), PJ_ERR_ABI);
        assert!(
            last_error().contains("struct_size is 0"),
            "{}",
            last_error()
        );
        assert_eq!(packjit_config_init(&mut cfg), PJ_OK);
        cfg.map_mode = 7;
        assert_eq!(
            packjit_runtime_create(&cfg, &mut rt),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(rt.is_null());
        assert_eq!(packjit_config_init(null_mut()), PJ_ERR_INVALID_ARGUMENT);
        assert_eq!(
            packjit_load_options_init(null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );

        let mut s = PackjitArenaStats::default();
        assert_eq!(
            packjit_runtime_stats(null(), &mut s),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(last_error(), "runtime is NULL");
        assert_eq!(
            packjit_load_plugin(null(), c"x".as_ptr(), null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_register_helper(null(), 1, c"h".as_ptr(), None),
            PJ_ERR_INVALID_ARGUMENT
        );
        let mut p = null_mut();
        assert_eq!(
            packjit_program_load(null(), null(), 0, null(), &mut p),
            PJ_ERR_INVALID_ARGUMENT
        );
        let mut r0 = 0;
        assert_eq!(
            packjit_program_run(null(), null_mut(), 0, &mut r0),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_program_info(null(), null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_program_code(null(), null_mut(), 0, null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        packjit_program_free(null_mut());
        packjit_runtime_destroy(null_mut());

        let rt = Rt::with_backend();
        // Wrong struct sizes on output structs.
        assert_eq!(packjit_runtime_stats(rt.0, &mut s), PJ_ERR_ABI);
        // Bad paths, helpers, options.
        assert_eq!(
            packjit_load_plugin(rt.0, null(), null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_load_plugin(rt.0, c"/nonexistent/libpackjit_x.so".as_ptr(), null_mut()),
            PJ_ERR_PLUGIN
        );
        assert!(
            last_error().contains("/nonexistent/libpackjit_x.so: cannot load"),
            "{}",
            last_error()
        );
        assert_eq!(
            packjit_register_helper(rt.0, 1, c"h".as_ptr(), None),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("helper 1 (h): fn is NULL"),
            "{}",
            last_error()
        );
        assert_eq!(
            packjit_register_helper(rt.0, 1, null(), None),
            PJ_ERR_INVALID_ARGUMENT
        );
        let code = mov_r0(5);
        assert_eq!(
            packjit_program_load(rt.0, null(), 16, null(), &mut p),
            PJ_ERR_INVALID_ARGUMENT
        );
        let mut opts = PackjitLoadOptions::default();
        assert_eq!(
            packjit_program_load(rt.0, code.as_ptr(), 16, &opts, &mut p),
            PJ_ERR_ABI
        );
        assert_eq!(packjit_load_options_init(&mut opts), PJ_OK);
        opts.arch = 9;
        assert_eq!(
            packjit_program_load(rt.0, code.as_ptr(), 16, &opts, &mut p),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("opts->arch 9"), "{}", last_error());
        opts.arch = 0;
        opts.flags = PACKJIT_LOAD_FEATURES_EXACT;
        opts.features = 1;
        assert_eq!(
            packjit_program_load(rt.0, code.as_ptr(), 16, &opts, &mut p),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("not supported by cbackend"),
            "{}",
            last_error()
        );
        // No backend for a foreign arch.
        opts.flags = 0;
        opts.arch = if host_arch_code() == PJ_ARCH_RISCV64 {
            PJ_ARCH_AARCH64
        } else {
            PJ_ARCH_RISCV64
        };
        assert_eq!(
            packjit_program_load(rt.0, code.as_ptr(), 16, &opts, &mut p),
            PJ_ERR_PLUGIN
        );
        assert!(
            last_error().contains("no backend loaded"),
            "{}",
            last_error()
        );

        // Handles of the wrong kind are recognised.
        let fake = [0u64; 8];
        assert_eq!(
            run(fake.as_ptr().cast()).unwrap_err().0,
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("not a PackjitProgram handle"),
            "{}",
            last_error()
        );
        assert_eq!(run(rt.0.cast()).unwrap_err().0, PJ_ERR_INVALID_ARGUMENT);
        let mut n = 0;
        assert_eq!(
            packjit_backend_count(fake.as_ptr().cast(), &mut n),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_backend_info(rt.0, 5, &mut info_struct()),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("index 5 out of range (1 loaded)"),
            "{}",
            last_error()
        );

        // ctx NULL with a length, r0 NULL.
        let p = rt.load(&code).unwrap();
        assert_eq!(
            packjit_program_run(p, null_mut(), 8, &mut r0),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            packjit_program_run(p, null_mut(), 0, null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert_eq!(packjit_program_run(p, null_mut(), 0, &mut r0), PJ_OK);
        assert_eq!(r0, 5);
        // Inside an epoch bracket a freed handle stays valid (RCU-style) and a second free
        // is refused.
        packjit_epoch_enter();
        packjit_program_free(p);
        assert_eq!(run(p), Ok(5));
        packjit_program_free(p); // double free: detected, ignored
        assert_eq!(last_error(), "program was already freed");
        packjit_epoch_exit();
        packjit_epoch_exit(); // unbalanced: recorded, harmless
        assert!(last_error().contains("without packjit_epoch_enter"));
    }
}

#[test]
fn version_and_status_strings() {
    assert_eq!(
        packjit_version(),
        (PACKJIT_VERSION_MAJOR << 16) | (PACKJIT_VERSION_MINOR << 8) | PACKJIT_VERSION_PATCH
    );
    // SAFETY: static string.
    let v = unsafe { CStr::from_ptr(packjit_version_string()) };
    assert_eq!(
        v.to_str().unwrap(),
        format!("{PACKJIT_VERSION_MAJOR}.{PACKJIT_VERSION_MINOR}.{PACKJIT_VERSION_PATCH}")
    );
    assert_eq!(packjit_abi_version(), PJ_ABI_VERSION);
    let mut seen = std::collections::HashSet::new();
    for code in PJ_ERR_UNKNOWN_CALLX..=PJ_OK {
        // SAFETY: static string.
        let s = unsafe { CStr::from_ptr(packjit_status_str(code)) }
            .to_str()
            .unwrap();
        assert_ne!(s, "unknown status code", "code {code}");
        assert!(seen.insert(s), "duplicate description {s:?}");
    }
    // SAFETY: static string.
    let s = unsafe { CStr::from_ptr(packjit_status_str(-99)) };
    assert_eq!(s.to_str().unwrap(), "unknown status code");
}

/// Readers run the published program in a loop while the writer swaps in new programs and
/// frees the old ones: the deferred free must keep every handle and its code valid for the
/// readers that still hold it, and each reader must see one of the published values.
#[test]
fn free_while_other_threads_run() {
    let rt = Arc::new(Rt::with_backend());
    let slot = Arc::new(AtomicPtr::new(rt.load(&mov_r0(100)).unwrap()));
    let stop = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (slot, stop, runs) = (slot.clone(), stop.clone(), runs.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    packjit_epoch_enter();
                    let p = slot.load(Ordering::Acquire);
                    let r = run(p);
                    packjit_epoch_exit();
                    let r0 = r.expect("published program runs");
                    assert!((100..200).contains(&r0), "r0 {r0}");
                    runs.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for i in 1..100 {
        let new = rt.load(&mov_r0(100 + i)).unwrap();
        let old = slot.swap(new, Ordering::AcqRel);
        // SAFETY: unpublished above; readers that still hold it are pinned.
        unsafe { packjit_program_free(old) };
    }
    while runs.load(Ordering::Relaxed) < 1000 {
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    // SAFETY: the last published program, freed once.
    unsafe { packjit_program_free(slot.load(Ordering::Acquire)) };
    let mut pending = 1;
    // SAFETY: valid arguments.
    assert_eq!(unsafe { packjit_reclaim(rt.0, &mut pending) }, PJ_OK);
    assert_eq!(pending, 0);
    assert_eq!(rt.stats().allocations, 0);
}

// SAFETY: (test only) the runtime handle is thread-safe; Rt is shared read-only.
unsafe impl Send for Rt {}
// SAFETY: as above.
unsafe impl Sync for Rt {}

/// A program handle may outlive the runtime that made it.
#[test]
fn programs_outlive_their_runtime() {
    let rt = Rt::with_backend();
    let p = rt.load(&mov_r0(9)).unwrap();
    drop(rt);
    assert_eq!(run(p), Ok(9));
    // SAFETY: freed once.
    unsafe { packjit_program_free(p) };
}

/// Messages longer than the thread-local buffer are cut, still NUL-terminated UTF-8, and the
/// buffer's address is stable for the thread.
#[test]
fn long_error_messages_are_truncated_safely() {
    let rt = Rt::new();
    let long = CString::new(format!("/nonexistent/{}/libpackjit_x.so", "é".repeat(1500))).unwrap();
    let before = packjit_last_error();
    // SAFETY: valid arguments.
    let st = unsafe { packjit_load_plugin(rt.0, long.as_ptr(), null_mut()) };
    assert_eq!(st, PJ_ERR_PLUGIN);
    assert_eq!(packjit_last_error(), before, "stable buffer");
    let msg = last_error();
    assert!(msg.len() < 1024 && msg.len() > 1000, "{}", msg.len());
    assert!(msg.starts_with("/nonexistent/éé"));
    assert!(
        // SAFETY: NUL-terminated.
        unsafe { CStr::from_ptr(packjit_last_error()) }
            .to_str()
            .is_ok(),
        "cut on a char boundary"
    );
}

/// A panic inside a C API call comes back as `PJ_ERR_PANIC` with its message; the process
/// does not abort, and the next call works normally.
#[test]
fn a_panic_inside_the_api_is_an_error_code() {
    assert_eq!(packjit_test_panic_inside(), PJ_ERR_PANIC);
    assert_eq!(packjit_last_error_code(), PJ_ERR_PANIC);
    let msg = last_error();
    assert!(
        msg.contains("packjit_test_panic_inside: panic caught at the C boundary")
            && msg.contains("index out of bounds"),
        "{msg}"
    );
    let rt = Rt::new();
    assert_eq!(packjit_last_error_code(), PJ_OK);
    drop(rt);
}

/// Sandboxing is the default: a backend that cannot honour it refuses, naming the flag; the
/// sandbox options and regions are validated with messages naming the field.
#[test]
fn sandbox_is_the_default_and_options_are_checked() {
    let rt = Rt::with_backend();
    let code = mov_r0(1);
    let mut p = null_mut();
    // SAFETY: valid runtime and buffers; NULL options = defaults (sandboxed, with the
    // default budget: PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET).
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), null(), &mut p) };
    assert_eq!(st, PJ_ERR_UNSUPPORTED);
    assert!(
        last_error().contains("unknown compile flags 0x3"),
        "{}",
        last_error()
    );

    let mut opts = trusted_opts();
    let region = PjMemRegion {
        start: 0x1000,
        len: 16,
        flags: 4,
    };
    opts.regions = &region;
    opts.region_count = 1;
    // SAFETY: valid arguments; the region is only validated, never accessed.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("opts->regions[0].flags 0x4"),
        "{}",
        last_error()
    );
    opts.regions = null();
    // SAFETY: as above.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("opts->regions is NULL"),
        "{}",
        last_error()
    );
    let wrapping = PjMemRegion {
        start: u64::MAX - 1,
        len: 16,
        flags: PJ_REGION_WRITABLE,
    };
    // SAFETY: valid runtime and region (validated only).
    let st = unsafe { packjit_runtime_add_region(rt.0, &wrapping) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("wraps around"), "{}", last_error());
    opts.region_count = 0;
    opts.flags = PACKJIT_LOAD_TRUSTED | 512;
    // SAFETY: as above.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("unknown bits 0x200"),
        "{}",
        last_error()
    );
}

/// `PACKJIT_LOAD_OPTIMIZE`: the optimizing tier with the library's `optimizer` feature (no
/// backend plugin needed), trusted and sandboxed; a named refusal without it.
#[test]
fn load_optimize_compiles_with_the_tier_or_is_refused_by_name() {
    let rt = Rt::new();
    let code = mov_r0(42);
    let mut p = null_mut();
    let mut opts = trusted_opts();
    opts.flags |= PACKJIT_LOAD_OPTIMIZE;
    // SAFETY: valid runtime, code, options and out pointer; `mov r0, 42; exit` touches no
    // memory.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    // The runtime's build decides, not this crate's feature: another crate of a workspace
    // build (the test kit) may turn the runtime's `optimizer` on.
    if packjit_runtime::Tier::Optimized.is_built() {
        assert_eq!(st, PJ_OK, "{}", last_error());
        assert_eq!(run(p), Ok(42));
        // SAFETY: p came from packjit_program_load.
        unsafe { packjit_program_free(p) };
    } else {
        assert_eq!(st, PJ_ERR_UNSUPPORTED);
        assert!(last_error().contains("`optimizer`"), "{}", last_error());
    }
    // Sandboxed: the tier compiles it with the checks and the budget.
    opts.flags = PACKJIT_LOAD_OPTIMIZE;
    // SAFETY: as above.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    if packjit_runtime::Tier::Optimized.is_built() {
        assert_eq!(st, PJ_OK, "{}", last_error());
        assert_eq!(run(p), Ok(42));
        // SAFETY: p came from packjit_program_load.
        unsafe { packjit_program_free(p) };
    } else {
        assert_eq!(st, PJ_ERR_UNSUPPORTED);
        assert!(last_error().contains("optimized tier"), "{}", last_error());
    }
}

/// `PACKJIT_LOAD_ADAPTIVE` and the runtime's tier policy: a trusted program loads on the
/// baseline (the C test backend), counts its runs and moves to the optimizing tier with the
/// library's `optimizer` feature; without it (and for sandboxed code) it stays on the
/// baseline, refused by name, and the load succeeds either way.
#[test]
fn load_adaptive_tiers_up_by_the_runtime_policy() {
    let rt = Rt::with_backend();
    let code = mov_r0(42);
    let status = |p: *const PackjitProgram| {
        let mut s = 0;
        // SAFETY: live program, valid out pointer.
        assert_eq!(unsafe { packjit_program_tier_status(p, &mut s) }, PJ_OK);
        s
    };
    let tier = |p: *const PackjitProgram| {
        let mut t = 0;
        // SAFETY: live program, valid out pointer.
        assert_eq!(unsafe { packjit_program_tier(p, &mut t) }, PJ_OK);
        t
    };
    let built = packjit_runtime::Tier::Optimized.is_built();
    let mut opts = trusted_opts();
    opts.flags |= PACKJIT_LOAD_ADAPTIVE;
    let load = |opts: &PackjitLoadOptions| {
        let mut p = null_mut();
        // SAFETY: valid runtime, code, options and out pointer; `mov r0, 42; exit` touches
        // no memory.
        let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), opts, &mut p) };
        assert_eq!(st, PJ_OK, "{}", last_error());
        p
    };

    // After 3 runs.
    // SAFETY: live runtime.
    assert_eq!(unsafe { packjit_runtime_set_tier_policy(rt.0, 3) }, PJ_OK);
    let p = load(&opts);
    assert_eq!(tier(p), PACKJIT_TIER_BASELINE);
    if built {
        assert_eq!(status(p), PACKJIT_TIER_STATUS_BASELINE);
    } else {
        assert_eq!(status(p), PACKJIT_TIER_STATUS_REFUSED);
    }
    for _ in 0..3 {
        assert_eq!(run(p), Ok(42));
    }
    let mut s = 0;
    // SAFETY: live program, valid out pointer.
    assert_eq!(unsafe { packjit_program_wait_tier_up(p, &mut s) }, PJ_OK);
    if built {
        assert_eq!(s, PACKJIT_TIER_STATUS_OPTIMIZED);
        assert_eq!(tier(p), PACKJIT_TIER_OPTIMIZED);
    } else {
        assert_eq!(s, PACKJIT_TIER_STATUS_REFUSED);
        assert_eq!(tier(p), PACKJIT_TIER_BASELINE);
    }
    assert_eq!(run(p), Ok(42));
    // SAFETY: p came from packjit_program_load.
    unsafe { packjit_program_free(p) };

    // Manual: runs do not tier up; a request does.
    // SAFETY: live runtime.
    let st = unsafe { packjit_runtime_set_tier_policy(rt.0, PACKJIT_TIER_MANUAL) };
    assert_eq!(st, PJ_OK);
    let p = load(&opts);
    for _ in 0..100 {
        assert_eq!(run(p), Ok(42));
    }
    if built {
        assert_eq!(status(p), PACKJIT_TIER_STATUS_BASELINE);
        // SAFETY: live program, valid out pointer.
        assert_eq!(unsafe { packjit_program_request_tier_up(p, &mut s) }, PJ_OK);
        assert!(
            matches!(
                s,
                PACKJIT_TIER_STATUS_PENDING | PACKJIT_TIER_STATUS_OPTIMIZED
            ),
            "{s}"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { packjit_program_wait_tier_up(p, &mut s) }, PJ_OK);
        assert_eq!(s, PACKJIT_TIER_STATUS_OPTIMIZED);
    }
    assert_eq!(run(p), Ok(42));
    // SAFETY: p came from packjit_program_load.
    unsafe { packjit_program_free(p) };

    // A program loaded without the flag is fixed.
    let p = load(&trusted_opts());
    assert_eq!(status(p), PACKJIT_TIER_STATUS_FIXED);
    // SAFETY: p came from packjit_program_load.
    unsafe { packjit_program_free(p) };

    // Both tier flags: refused by name.
    opts.flags |= PACKJIT_LOAD_OPTIMIZE;
    let mut p = null_mut();
    // SAFETY: as above.
    let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), &opts, &mut p) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("PACKJIT_LOAD_ADAPTIVE"),
        "{}",
        last_error()
    );
}

/// `PACKJIT_LOAD_TIER_POLICY`: one adaptive program's own policy over the runtime's, the
/// older struct without the field still loading, and the flag refused where it cannot apply.
#[test]
fn load_adaptive_takes_a_per_load_tier_policy() {
    let rt = Rt::with_backend();
    let code = mov_r0(7);
    let status = |p: *const PackjitProgram| {
        let mut s = 0;
        // SAFETY: live program, valid out pointer.
        assert_eq!(unsafe { packjit_program_tier_status(p, &mut s) }, PJ_OK);
        s
    };
    let try_load = |opts: &PackjitLoadOptions| {
        let mut p = null_mut();
        // SAFETY: valid runtime, code, options (readable for their struct_size) and out
        // pointer; `mov r0, 7; exit` touches no memory.
        let st = unsafe { packjit_program_load(rt.0, code.as_ptr(), code.len(), opts, &mut p) };
        (st, p)
    };
    let built = packjit_runtime::Tier::Optimized.is_built();
    // The runtime never tiers up on its own; this program after 2 runs.
    // SAFETY: live runtime.
    let st = unsafe { packjit_runtime_set_tier_policy(rt.0, PACKJIT_TIER_MANUAL) };
    assert_eq!(st, PJ_OK);
    let mut opts = trusted_opts();
    opts.flags |= PACKJIT_LOAD_ADAPTIVE | PACKJIT_LOAD_TIER_POLICY;
    opts.tier_up_calls = 2;
    let (st, p) = try_load(&opts);
    assert_eq!(st, PJ_OK, "{}", last_error());
    for _ in 0..2 {
        assert_eq!(run(p), Ok(7));
    }
    let mut s = 0;
    // SAFETY: live program, valid out pointer.
    assert_eq!(unsafe { packjit_program_wait_tier_up(p, &mut s) }, PJ_OK);
    if built {
        assert_eq!(s, PACKJIT_TIER_STATUS_OPTIMIZED);
    } else {
        assert_eq!(s, PACKJIT_TIER_STATUS_REFUSED);
    }
    assert_eq!(run(p), Ok(7));
    // SAFETY: p came from packjit_program_load.
    unsafe { packjit_program_free(p) };

    // The other way round: the runtime tiers up after 1 run, this program only on request.
    // SAFETY: live runtime.
    assert_eq!(unsafe { packjit_runtime_set_tier_policy(rt.0, 1) }, PJ_OK);
    opts.tier_up_calls = PACKJIT_TIER_MANUAL;
    let (st, p) = try_load(&opts);
    assert_eq!(st, PJ_OK, "{}", last_error());
    for _ in 0..50 {
        assert_eq!(run(p), Ok(7));
    }
    if built {
        assert_eq!(status(p), PACKJIT_TIER_STATUS_BASELINE);
    }
    // SAFETY: p came from packjit_program_load.
    unsafe { packjit_program_free(p) };

    // A host built against the struct before `tier_up_calls`: it loads with the runtime's
    // policy (1 run), and the flag that needs the missing field is refused by name.
    let v1_size = std::mem::offset_of!(PackjitLoadOptions, tier_up_calls) as u32;
    let mut old = trusted_opts();
    old.struct_size = v1_size;
    old.flags |= PACKJIT_LOAD_ADAPTIVE;
    old.tier_up_calls = 0xdead; // beyond the old struct: never read
    let (st, p) = try_load(&old);
    assert_eq!(st, PJ_OK, "{}", last_error());
    assert_eq!(run(p), Ok(7));
    // SAFETY: live program, valid out pointer.
    assert_eq!(unsafe { packjit_program_wait_tier_up(p, &mut s) }, PJ_OK);
    if built {
        assert_eq!(s, PACKJIT_TIER_STATUS_OPTIMIZED);
    }
    // SAFETY: p came from packjit_program_load.
    unsafe { packjit_program_free(p) };
    old.flags |= PACKJIT_LOAD_TIER_POLICY;
    let (st, p) = try_load(&old);
    assert_eq!((st, p), (PJ_ERR_ABI, null_mut()));
    assert!(last_error().contains("tier_up_calls"), "{}", last_error());
    // Any other size is still refused.
    old.struct_size = v1_size + 4;
    assert_eq!(try_load(&old).0, PJ_ERR_ABI);

    // The policy without adaptive tiering: refused by name, not ignored.
    let mut fixed = trusted_opts();
    fixed.flags |= PACKJIT_LOAD_TIER_POLICY;
    let (st, p) = try_load(&fixed);
    assert_eq!((st, p), (PJ_ERR_INVALID_ARGUMENT, null_mut()));
    assert!(
        last_error().contains("PACKJIT_LOAD_TIER_POLICY without PACKJIT_LOAD_ADAPTIVE"),
        "{}",
        last_error()
    );
}

#[test]
fn hooks_batch_attach_and_symbols_through_the_c_api() {
    let rt = Rt::with_backend();
    let hooks: Vec<*mut PackjitHook> = (0..8)
        .map(|_| {
            let mut h = null_mut();
            // SAFETY: valid runtime and out pointer.
            assert_eq!(unsafe { packjit_hook_create(rt.0, &mut h) }, PJ_OK);
            h
        })
        .collect();
    let run_hook = |h: *const PackjitHook| {
        let mut r0 = 0;
        // SAFETY: live hook, no context.
        let st = unsafe { packjit_hook_run(h, null_mut(), 0, &mut r0) };
        (st, r0)
    };
    assert_eq!(
        run_hook(hooks[0]).0,
        PJ_ERR_NOT_EXECUTABLE,
        "nothing attached"
    );

    let commits = rt.stats().commits;
    for round in 0..3i32 {
        let mut b = null_mut();
        // SAFETY: valid out pointer.
        assert_eq!(unsafe { packjit_hook_batch_create(&mut b) }, PJ_OK);
        for (i, &h) in hooks.iter().enumerate() {
            let code = mov_r0(round * 100 + i as i32);
            let st = if i % 2 == 0 {
                // The C backend compiles trusted code only (it emits no sandbox checks).
                let opts = trusted_opts();
                // SAFETY: live batch and hook; valid code and options.
                unsafe { packjit_hook_batch_load_attach(b, h, code.as_ptr(), code.len(), &opts) }
            } else {
                // A program loaded on its own, handed over to the batch.
                let p = rt.load(&code).unwrap();
                // SAFETY: live batch, hook and program (consumed).
                unsafe { packjit_hook_batch_attach(b, h, p) }
            };
            assert_eq!(st, PJ_OK, "{}", last_error());
        }
        let mut replaced = u64::MAX;
        // SAFETY: live batch (consumed).
        assert_eq!(unsafe { packjit_hook_batch_apply(b, &mut replaced) }, PJ_OK);
        assert_eq!(replaced, if round == 0 { 0 } else { 8 });
        for (i, &h) in hooks.iter().enumerate() {
            assert_eq!(run_hook(h), (PJ_OK, (round * 100 + i as i32) as u64));
        }
    }
    // Per round: one commit for the 4 batch-loaded programs, one per separately loaded one.
    assert_eq!(rt.stats().commits - commits, 3 * (1 + 4));

    // Symbols: the attached program's entry resolves to it.
    let mut p = rt.load(&mov_r0(5)).unwrap();
    let mut sym = PackjitSymbol {
        found: 9,
        ..PackjitSymbol::default()
    };
    // SAFETY: live program, sized struct.
    assert_eq!(unsafe { packjit_program_symbol(p, &mut sym) }, PJ_OK);
    assert_eq!(sym.found, 1);
    let (start, id) = (sym.start, sym.id);
    // SAFETY: NUL-terminated by fill_name.
    let name = unsafe { CStr::from_ptr(sym.name.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(name, format!("prog_{id}"));
    // SAFETY: live runtime, sized struct.
    let st = unsafe { packjit_symbolize(rt.0, start + 1, &mut sym) };
    assert_eq!(st, PJ_OK);
    assert_eq!(
        (sym.found, sym.id, sym.start, sym.offset, sym.pc),
        (1, id, start, 1, -1)
    );
    // SAFETY: live runtime, sized struct.
    assert_eq!(unsafe { packjit_symbolize(rt.0, 8, &mut sym) }, PJ_OK);
    assert_eq!(sym.found, 0);

    // A taken-over handle is dead; a program of another runtime is refused.
    let mut b = null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { packjit_hook_batch_create(&mut b) }, PJ_OK);
    // SAFETY: live batch, hook, program (consumed).
    assert_eq!(unsafe { packjit_hook_batch_attach(b, hooks[0], p) }, PJ_OK);
    // The handle was taken over (its memory is gone): forget it.
    p = null_mut();
    let other = Rt::with_backend();
    let foreign = other.load(&mov_r0(1)).unwrap();
    // SAFETY: live batch and hook; program from another runtime.
    let st = unsafe { packjit_hook_batch_attach(b, hooks[1], foreign) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("different runtimes"),
        "{}",
        last_error()
    );
    // SAFETY: the refused program is still the caller's.
    unsafe { packjit_program_free(foreign) };
    for &h in &hooks[2..] {
        // SAFETY: live batch and hooks.
        assert_eq!(unsafe { packjit_hook_batch_detach(b, h) }, PJ_OK);
    }
    let mut replaced = 0;
    // SAFETY: live batch (consumed).
    assert_eq!(unsafe { packjit_hook_batch_apply(b, &mut replaced) }, PJ_OK);
    assert_eq!(replaced, 1 + 6);
    assert_eq!(run_hook(hooks[0]), (PJ_OK, 5));
    assert_eq!(run_hook(hooks[2]).0, PJ_ERR_NOT_EXECUTABLE);
    assert!(p.is_null());
    for h in hooks {
        // SAFETY: created above, destroyed once.
        unsafe { packjit_hook_destroy(h) };
    }
}

/// (start, size, name) of a program, from `packjit_program_symbol`.
fn symbol_of(p: *const PackjitProgram) -> (u64, u64, String) {
    let mut sym = PackjitSymbol::default();
    // SAFETY: live program, sized struct.
    assert_eq!(unsafe { packjit_program_symbol(p, &mut sym) }, PJ_OK);
    assert_eq!(sym.found, 1);
    // SAFETY: NUL-terminated by the library.
    let name = unsafe { CStr::from_ptr(sym.name.as_ptr()) };
    (sym.start, sym.size, name.to_str().unwrap().to_string())
}

#[test]
fn gdb_registration_through_the_c_api() {
    // SAFETY: NULL must be refused, not dereferenced.
    let st = unsafe { packjit_gdb_jit_enable(null()) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    let rt = Rt::with_backend();
    let before = rt.load(&mov_r0(3)).unwrap();
    // SAFETY: live runtime.
    let st = unsafe { packjit_gdb_jit_enable(rt.0) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    let after = rt.load(&mov_r0(4)).unwrap();
    let syms = [symbol_of(before), symbol_of(after)];
    let listed = packjit_runtime::gdb_jit::registered_programs();
    for s in &syms {
        // The list is process-wide, but no other test here registers anything.
        assert_eq!(
            listed.iter().filter(|e| *e == s).count(),
            1,
            "{s:?} in {listed:?}"
        );
    }
    for p in [before, after] {
        // SAFETY: loaded above, freed once.
        unsafe { packjit_program_free(p) };
    }
    let mut pending = 1;
    // SAFETY: live runtime, valid out pointer.
    assert_eq!(unsafe { packjit_reclaim(rt.0, &mut pending) }, PJ_OK);
    assert_eq!(pending, 0);
    let listed = packjit_runtime::gdb_jit::registered_programs();
    for s in &syms {
        assert!(
            !listed.contains(s),
            "{s:?} still registered after reclamation"
        );
    }
}

fn builtins_struct() -> PackjitBuiltins {
    PackjitBuiltins {
        struct_size: size_of::<PackjitBuiltins>() as u32,
        ..Default::default()
    }
}

/// The C test backend predates inlining: its vtable's `inline_kinds` (formerly `reserved`)
/// is 0, so the runtime gives it plain calls for the built-in helpers and says so.
#[test]
fn builtins_are_reported_and_an_older_plugin_gets_calls() {
    let rt = Rt::new();
    let mut b = builtins_struct();
    // SAFETY: live runtime, sized out struct.
    assert_eq!(unsafe { packjit_runtime_builtins(rt.0, &mut b) }, PJ_OK);
    assert_eq!(
        (b.cpu_id, b.clock),
        (PACKJIT_BUILTIN_NONE, PACKJIT_BUILTIN_NONE)
    );
    drop(rt);

    let rt = Rt::with_backend();
    let mut b = builtins_struct();
    // SAFETY: as above.
    assert_eq!(unsafe { packjit_runtime_builtins(rt.0, &mut b) }, PJ_OK);
    assert_eq!(
        (b.cpu_id, b.clock),
        (PACKJIT_BUILTIN_CALL, PACKJIT_BUILTIN_CALL)
    );
    let p = rt.load(&mov_r0(5)).unwrap();
    let mut pb = builtins_struct();
    // SAFETY: live program, sized out struct.
    assert_eq!(unsafe { packjit_program_builtins(p, &mut pb) }, PJ_OK);
    assert_eq!(
        (pb.cpu_id, pb.clock),
        (PACKJIT_BUILTIN_CALL, PACKJIT_BUILTIN_CALL)
    );
    // SAFETY: live runtime.
    let st = unsafe { packjit_runtime_set_inline_builtins(rt.0, 0) };
    assert_eq!(st, PJ_OK);
    assert_eq!(pb.percpu_lookup, PACKJIT_BUILTIN_CALL);
    // A per-CPU array: 2 CPUs x 4 u64s; bad geometry and NULLs are refused.
    let mut mem = vec![0u64; 8];
    let mut id = u32::MAX;
    // SAFETY: `mem` outlives every program of this runtime (dropped after it).
    unsafe {
        assert_eq!(
            packjit_runtime_add_percpu_array(rt.0, mem.as_mut_ptr().cast(), 32, 8, 4, 2, &mut id),
            PJ_OK
        );
        assert_ne!(id, u32::MAX);
        assert_eq!(
            packjit_runtime_add_percpu_array(rt.0, mem.as_mut_ptr().cast(), 32, 8, 5, 2, &mut id),
            PJ_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("do not fit"), "{}", last_error());
        assert_eq!(
            packjit_runtime_add_percpu_array(rt.0, null_mut(), 32, 8, 4, 2, &mut id),
            PJ_ERR_INVALID_ARGUMENT
        );
    }
    let mut bad = builtins_struct();
    bad.struct_size = 4;
    // SAFETY: deliberately wrong size / NULL: must be refused.
    unsafe {
        assert_eq!(packjit_program_builtins(p, &mut bad), PJ_ERR_ABI);
        assert_eq!(
            packjit_runtime_builtins(rt.0, null_mut()),
            PJ_ERR_INVALID_ARGUMENT
        );
        packjit_program_free(p);
    }
}

#[test]
fn perf_map_through_the_c_api() {
    // SAFETY: NULL must be refused, not dereferenced.
    let st = unsafe { packjit_perf_map_enable(null(), null()) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    let path = std::env::temp_dir().join(format!("packjit-capi-{}.map", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let rt = Rt::with_backend();
    let before = rt.load(&mov_r0(3)).unwrap();
    // SAFETY: live runtime, NUL-terminated path.
    let st = unsafe { packjit_perf_map_enable(rt.0, c_path.as_ptr()) };
    assert_eq!(st, PJ_OK, "{}", last_error());
    let progs: Vec<*mut PackjitProgram> = std::iter::once(before)
        .chain((0..5).map(|i| rt.load(&mov_r0(i)).unwrap()))
        .collect();
    // Read as perf reads a line: hex start, one separator, hex size, one separator, the name.
    let listed = || {
        let mut v: Vec<(u64, u64, String)> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| {
                let mut it = l.splitn(3, ' ');
                let hex = |f: Option<&str>| u64::from_str_radix(f.unwrap(), 16).unwrap();
                (
                    hex(it.next()),
                    hex(it.next()),
                    it.next().unwrap().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let want = |ps: &[*mut PackjitProgram]| {
        let mut v: Vec<_> = ps.iter().map(|&p| symbol_of(p)).collect();
        v.sort();
        v
    };
    assert_eq!(listed(), want(&progs), "programs loaded before and after");
    // A second runtime cannot keep the same file.
    let other = Rt::with_backend();
    // SAFETY: live runtime, NUL-terminated path.
    let st = unsafe { packjit_perf_map_enable(other.0, c_path.as_ptr()) };
    assert_eq!(st, PJ_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("another runtime"), "{}", last_error());
    for &p in &progs[..3] {
        // SAFETY: loaded above, freed once.
        unsafe { packjit_program_free(p) };
    }
    let mut pending = 1;
    // SAFETY: live runtime, valid out pointer.
    assert_eq!(unsafe { packjit_reclaim(rt.0, &mut pending) }, PJ_OK);
    assert_eq!(pending, 0);
    assert_eq!(listed(), want(&progs[3..]), "freed programs are gone");
    for &p in &progs[3..] {
        // SAFETY: loaded above, freed once.
        unsafe { packjit_program_free(p) };
    }
    // SAFETY: live runtime, valid out pointer.
    assert_eq!(unsafe { packjit_reclaim(rt.0, &mut pending) }, PJ_OK);
    assert_eq!(listed(), vec![]);
    std::fs::remove_file(&path).unwrap();
}
