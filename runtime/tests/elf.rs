//! Programs from clang: `tests/bpf/*.c` compiled with `clang -O2 -target bpf -mcpu=v4` at
//! test time, loaded from the `.o` and run by every backend that targets this host (on
//! arm64 / riscv64 under qemu-user in the cross runs), compared with the same C built by gcc.
//! Where no backend targets the host the programs are still linked and compiled for every
//! loaded backend (the run itself is checked by the cross runs).
//!
//! Set `PACKJIT_ELF_SEED` to vary the inputs.

mod elf_support;

use elf_support::*;
use packjit::elf::{link, ElfLoadOptions};
use packjit::{Arch, ErrorKind, LoadOptions, Program, Runtime, Stop, StopKind};

// Keep the rlibs linked so cargo builds the cdylibs this test loads.
#[allow(unused_imports)]
use {packjit_arm64 as _, packjit_rv64 as _};

fn runtime() -> Runtime {
    let rt = Runtime::new().unwrap();
    rt.load_plugins(None)
        .expect("backend plugins next to the test binary");
    rt.register_helper(PJ_MIX_ID, "pj_mix", pj_mix).unwrap();
    rt
}

fn seed() -> u64 {
    let s = std::env::var("PACKJIT_ELF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_e1f0);
    eprintln!("PACKJIT_ELF_SEED={s}");
    s
}

/// Loads sandboxed; where a backend does not implement the sandbox yet (it refuses the
/// compile flags as unsupported), loads trusted instead and says so. The test programs stay inside their
/// context and globals, so trusted code is sound for them.
fn load(rt: &Runtime, obj: &[u8], sel: &ElfLoadOptions, opts: &LoadOptions) -> Program {
    match rt.load_elf(obj, sel, opts) {
        Ok(p) => p,
        Err(e) if e.kind == ErrorKind::Unsupported => {
            eprintln!("note: {e}; loading trusted");
            // SAFETY: the tests/bpf programs only touch their context and globals.
            unsafe { rt.load_elf_trusted(obj, sel, opts) }
                .unwrap_or_else(|e| panic!("{:?}: {e}", sel.program))
        }
        Err(e) => panic!("{:?}: {e}", sel.program),
    }
}

fn sandboxed(rt: &Runtime) -> bool {
    rt.load(
        &[0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0],
        &LoadOptions::default(),
    )
    .is_ok()
}

/// Loads `sel` of `obj` for every backend; returns the program that runs here, if any.
fn load_all(rt: &Runtime, obj: &[u8], sel: &ElfLoadOptions) -> Option<Program> {
    let mut native = None;
    for b in rt.backends() {
        let p = load(
            rt,
            obj,
            sel,
            &LoadOptions {
                arch: Some(b.arch),
                ..Default::default()
            },
        );
        assert!(p.code_size() > 0);
        if p.is_executable() {
            native = Some(p);
        }
    }
    if native.is_none() {
        eprintln!(
            "note: no backend targets {} here; linked and compiled only (runs are checked under qemu)",
            Arch::host().map_or("this host", |a| a.name())
        );
    }
    native
}

fn check_against_gcc(name: &str, sel: ElfLoadOptions, entry: &str) {
    let rt = runtime();
    let obj = compile_bpf(name);
    let ins = inputs(seed(), 40);
    let (want, want_globals) = native(name, entry, &ins);
    assert_eq!(want.len(), ins.len());
    let Some(prog) = load_all(&rt, &obj, &sel) else {
        return;
    };
    for (i, (mem, w)) in ins.iter().zip(&want).enumerate() {
        let mut m = mem.clone();
        let r0 = prog
            .call(&mut m)
            .unwrap_or_else(|e| panic!("{name} run {i}: {e}"));
        assert_eq!(
            Run { r0, mem: m },
            *w,
            "{name} run {i} (input {mem:02x?}) differs from gcc"
        );
    }
    let g = prog.globals().unwrap();
    for (sym, v) in &want_globals {
        let got = match sym.split_once('[') {
            // `histogram[3]`: element of a u32 array.
            Some((base, idx)) => {
                let i: usize = idx.trim_end_matches(']').parse().unwrap();
                let mut b = [0u8; 4];
                g.read_into(base, 4 * i, &mut b).unwrap();
                u64::from(u32::from_le_bytes(b))
            }
            None => g.read_u64(sym).unwrap(),
        };
        assert_eq!(got, *v, "{name}: global {sym} after {} runs", ins.len());
    }
}

#[test]
fn globals_program_matches_gcc() {
    check_against_gcc(
        "globals",
        ElfLoadOptions::section("pj/globals"),
        "prog_globals",
    );
}

#[test]
fn cross_section_calls_match_gcc_selected_by_function() {
    check_against_gcc(
        "calls",
        ElfLoadOptions::function("prog_calls"),
        "prog_calls",
    );
}

#[test]
fn linking_places_each_called_function_once_and_resolves_the_extern() {
    let obj = compile_bpf("globals");
    let l = link(&obj, &ElfLoadOptions::section("pj/globals"), &|n| {
        (n == "pj_mix").then_some(PJ_MIX_ID)
    })
    .unwrap();
    let names: Vec<&str> = l.functions.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["pj/globals", "hash_str", "mix_byte"]);
    assert_eq!(l.externs, [("pj_mix".to_string(), PJ_MIX_ID)]);
    // Every call is now either a helper call to pj_mix or pc-relative inside the code.
    let slots = l.code.len() / 8;
    for s in 0..slots {
        let i = &l.code[s * 8..s * 8 + 8];
        if i[0] == 0x85 {
            let imm = i32::from_le_bytes(i[4..8].try_into().unwrap());
            match i[1] >> 4 {
                0 => assert_eq!(imm as u32, PJ_MIX_ID),
                1 => {
                    let t = s as i64 + 1 + i64::from(imm);
                    assert!(
                        l.functions.iter().any(|&(_, b)| b as i64 == t),
                        "call at {s} lands at {t}, not a function start"
                    );
                }
                k => panic!("call with src {k}"),
            }
        }
    }
    packjit::decode(&l.code, &[packjit_plugin_api_entry()]).unwrap();
    // The sections the program may touch, with their access.
    let secs: Vec<(&str, bool)> = l
        .data
        .sections()
        .iter()
        .map(|s| (s.name(), s.writable()))
        .collect();
    for want in [(".rodata", false), (".data", true), (".bss", true)] {
        assert!(secs.contains(&want), "{want:?} in {secs:?}");
    }
    assert!(secs.iter().any(|(n, w)| n.starts_with(".rodata.str") && !w));
    // String literals are where the data relocation says: names[] points at "alpha".
    let g = &l.data;
    let names_ptr = {
        let mut b = [0u8; 8];
        let ro = g.sections().iter().find(|s| s.name() == ".rodata").unwrap();
        let v = ro.to_vec();
        b.copy_from_slice(&v[0x40..0x48]);
        u64::from_le_bytes(b)
    };
    let strs = g
        .sections()
        .iter()
        .find(|s| s.name().starts_with(".rodata.str"))
        .unwrap();
    let off = (names_ptr - strs.addr()) as usize;
    assert_eq!(&strs.to_vec()[off..off + 6], b"alpha\0");
    assert_eq!(
        g.read_u64("runs").unwrap(),
        7,
        ".data initialised from the object"
    );
    assert_eq!(g.read_u64("bytes_seen").unwrap(), 0, ".bss zeroed");
}

fn packjit_plugin_api_entry() -> packjit_plugin_api::HelperEntry {
    packjit_plugin_api::HelperEntry {
        id: PJ_MIX_ID,
        inline_kind: 0,
        addr: pj_mix as packjit::PjHelperFn as usize as u64,
    }
}

#[test]
fn host_reads_and_writes_globals_between_runs() {
    let rt = runtime();
    let obj = compile_bpf("globals");
    let Some(prog) = load_all(&rt, &obj, &ElfLoadOptions::section("pj/globals")) else {
        // Still exercise the accessors on the compiled (not runnable) program.
        let p = load(
            &rt,
            &obj,
            &ElfLoadOptions::section("pj/globals"),
            &LoadOptions {
                arch: Some(Arch::Aarch64),
                ..Default::default()
            },
        );
        let g = p.globals().unwrap();
        g.write("runs", 0, &100u64.to_le_bytes()).unwrap();
        assert_eq!(g.read_u64("runs").unwrap(), 100);
        assert!(
            g.write("runs", 4, &[0; 8]).is_err(),
            "write past the symbol"
        );
        assert!(g.read("nope").is_err());
        return;
    };
    let g = prog.globals().unwrap();
    assert_eq!(g.read_u64("runs").unwrap(), 7);
    g.write("runs", 0, &100u64.to_le_bytes()).unwrap();
    prog.call(&mut [1, 2, 3]).unwrap();
    assert_eq!(g.read_u64("runs").unwrap(), 101);
    assert_eq!(g.read_u64("bytes_seen").unwrap(), 3);
    assert_eq!(g.read_u64("last_len").unwrap(), 3);
    // By section: .bss holds bytes_seen and last_len.
    let bss = g.read(".bss").unwrap();
    assert!(bss.len() >= 12);
    g.write(".bss", 0, &vec![0; bss.len()]).unwrap();
    assert_eq!(g.read_u64("bytes_seen").unwrap(), 0);
    // Each loaded program has its own globals.
    let other = load(
        &rt,
        &obj,
        &ElfLoadOptions::section("pj/globals"),
        &LoadOptions::default(),
    );
    assert_eq!(other.globals().unwrap().read_u64("runs").unwrap(), 7);
}

#[test]
fn sandbox_stops_rodata_writes_and_context_overruns() {
    let rt = runtime();
    let obj = compile_bpf("sandbox");
    if Arch::host().is_some() && !sandboxed(&rt) {
        eprintln!("note: the backends do not implement the sandbox yet; nothing to check");
        return;
    }
    let Some(w) = load_all(&rt, &obj, &ElfLoadOptions::section("pj/rodata_write")) else {
        return;
    };
    let rodata = w
        .globals()
        .unwrap()
        .sections()
        .iter()
        .find(|s| s.name() == ".rodata")
        .unwrap()
        .addr();
    let e = w.call(&mut [0u8; 2]).unwrap_err();
    let Some(Stop::OutOfBounds { addr, .. }) = e.stop() else {
        panic!("{e}");
    };
    assert_eq!(addr, rodata + 16, "{e}");
    assert_eq!(w.globals().unwrap().read(".rodata").unwrap()[16], 3);
    let r = rt
        .load_elf(
            &obj,
            &ElfLoadOptions::section("pj/oob_read"),
            &LoadOptions::default(),
        )
        .unwrap();
    let e = r.call(&mut [0u8; 8]).unwrap_err();
    assert_eq!(
        e.stop().map(|s| s.kind()),
        Some(StopKind::OutOfBounds),
        "{e}"
    );
    let s = rt
        .load_elf(
            &obj,
            &ElfLoadOptions::section("pj/spin"),
            &LoadOptions {
                budget: packjit::Budget::Limit(10_000),
                ..Default::default()
            },
        )
        .unwrap();
    let e = s.call(&mut []).unwrap_err();
    assert_eq!(e.stop().map(|s| s.kind()), Some(StopKind::Budget), "{e}");
}
