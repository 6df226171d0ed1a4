//! Shared by the ELF tests: compile `tests/bpf/*.c` with clang at test time (no committed
//! objects), build the same source natively with gcc as the oracle, and the helper both use.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The helper the C programs declare `extern u64 pj_mix(u64, u64)`; `tests/bpf/shim.c` has
/// the same function for the native build.
pub unsafe extern "C" fn pj_mix(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.rotate_left(13) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Helper id `pj_mix` is registered under (the C code never sees it: it resolves by name).
pub const PJ_MIX_ID: u32 = 77;

pub fn bpf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/bpf")
}

/// A fresh path in this process's scratch directory for `file`. Each call gets its own:
/// the tests of one binary run on several threads and build the same sources at once, and a
/// reader must never see another thread's half-written object or binary.
pub fn scratch_path(file: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("packjit-elf-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(format!("{call}-{file}"))
}

/// Child processes are host (x86-64) tools even when this test runs under qemu-user; the
/// runner's guest library path must not leak into them.
fn host_cmd(prog: &str) -> Command {
    let mut c = Command::new(prog);
    c.env_remove("LD_LIBRARY_PATH");
    c
}

/// The testkit's host-tool runner, shared by source: the runtime's tests cannot depend on
/// the testkit, which depends on the runtime.
#[path = "../../../testkit/src/host_tool.rs"]
mod host_tool;
use host_tool::output as run_host;

/// The clang to use and its `-mcpu`: `$PACKJIT_CLANG`, else the newest `clang-N` on PATH,
/// else `clang`. cpu v4 needs LLVM 18+; older clangs get `-mcpu=v3`.
///
/// Missing clang is a test FAILURE, not a skip: `scripts/env.sh` installs it.
pub fn clang() -> (String, &'static str) {
    let mut candidates: Vec<String> = std::env::var("PACKJIT_CLANG").into_iter().collect();
    candidates.extend((14..=21).rev().map(|v| format!("clang-{v}")));
    candidates.push("clang".into());
    for c in candidates {
        let Ok(out) = run_host(host_cmd(&c).arg("--version")) else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let major: u32 = text
            .split("version ")
            .nth(1)
            .and_then(|v| v.split('.').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return (c, if major >= 18 { "-mcpu=v4" } else { "-mcpu=v3" });
    }
    panic!(
        "clang not found (tried $PACKJIT_CLANG, clang-21..clang-14, clang): the ELF tests compile \
         tests/bpf/*.c at test time. Install it with `source scripts/env.sh && packjit_install` \
         (Debian package clang-19)."
    );
}

/// Compiles `tests/bpf/<name>.c` to an eBPF object and returns its bytes.
pub fn compile_bpf(name: &str) -> Vec<u8> {
    let (cc, cpu) = clang();
    let src = bpf_dir().join(format!("{name}.c"));
    let obj = scratch_path(&format!("{name}.bpf.o"));
    let out = run_host(
        host_cmd(&cc)
            .args(["-O2", "-g", "-target", "bpf", cpu, "-c"])
            .arg(&src)
            .arg("-o")
            .arg(&obj),
    )
    .unwrap();
    assert!(
        out.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&obj).unwrap()
}

/// One native run: r0 and the context afterwards.
#[derive(Debug, PartialEq, Eq)]
pub struct Run {
    pub r0: u64,
    pub mem: Vec<u8>,
}

/// Builds `tests/bpf/<name>.c` natively with gcc around `shim.c`, runs `entry` over `inputs`
/// in one process (globals carry over, as they do across calls of one loaded program) and
/// returns the runs and the globals the program reports.
pub fn native(name: &str, entry: &str, inputs: &[Vec<u8>]) -> (Vec<Run>, Vec<(String, u64)>) {
    let dir = bpf_dir();
    let exe = scratch_path(&format!("{name}.native"));
    let out = run_host(
        host_cmd("gcc")
            .args(["-O2", "-DPJ_NATIVE", &format!("-DENTRY={entry}")])
            .arg(dir.join(format!("{name}.c")))
            .arg(dir.join("shim.c"))
            .arg("-o")
            .arg(&exe),
    )
    .expect("gcc (the native oracle) must be installed");
    assert!(
        out.status.success(),
        "gcc failed on {name}.c:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex: Vec<String> = inputs
        .iter()
        .map(|m| m.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    let out = run_host(host_cmd(exe.to_str().unwrap()).args(&hex)).unwrap();
    assert!(out.status.success(), "native {name} failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut runs = Vec::new();
    let mut globals = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["r0", r0, "mem", mem @ ..] => runs.push(Run {
                r0: u64::from_str_radix(r0, 16).unwrap(),
                mem: mem
                    .first()
                    .map(|m| {
                        (0..m.len() / 2)
                            .map(|i| u8::from_str_radix(&m[2 * i..2 * i + 2], 16).unwrap())
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            ["global", n, v] => globals.push((n.to_string(), u64::from_str_radix(v, 16).unwrap())),
            _ => panic!("unexpected native output line {line:?}"),
        }
    }
    (runs, globals)
}

/// Deterministic inputs of varied lengths (0 included: an empty context).
pub fn inputs(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|i| {
            let len = if i == 0 { 0 } else { (next() % 80) as usize };
            (0..len).map(|_| next() as u8).collect()
        })
        .collect()
}

/// A little-endian u32 or u64 read from an object's bytes.
pub fn rd(b: &[u8], off: usize, n: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..n].copy_from_slice(&b[off..off + n]);
    u64::from_le_bytes(v)
}

/// `(file offset, size, name)` of every section header of an ELF64 object.
pub fn sections(b: &[u8]) -> Vec<(usize, usize, String, u32)> {
    let shoff = rd(b, 0x28, 8) as usize;
    let shnum = rd(b, 0x3c, 2) as usize;
    let shstrndx = rd(b, 0x3e, 2) as usize;
    let sh = |i: usize| shoff + i * 64;
    let stroff = rd(b, sh(shstrndx) + 0x18, 8) as usize;
    (0..shnum)
        .map(|i| {
            let name_off = rd(b, sh(i), 4) as usize;
            let name: String = b[stroff + name_off..]
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as char)
                .collect();
            (
                rd(b, sh(i) + 0x18, 8) as usize,
                rd(b, sh(i) + 0x20, 8) as usize,
                name,
                rd(b, sh(i) + 4, 4) as u32,
            )
        })
        .collect()
}

/// Index of symbol `name` in `.symtab`.
pub fn symbol_index(b: &[u8], name: &str) -> u32 {
    let secs = sections(b);
    let (symoff, symsize, _, _) = secs.iter().find(|s| s.2 == ".symtab").unwrap().clone();
    let (stroff, _, _, _) = secs.iter().find(|s| s.2 == ".strtab").unwrap().clone();
    for i in 0..symsize / 24 {
        let e = symoff + i * 24;
        let n = rd(b, e, 4) as usize;
        let s: String = b[stroff + n..]
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as char)
            .collect();
        if s == name {
            return i as u32;
        }
    }
    panic!("no symbol {name}");
}

/// File offset of the REL entry of section `rel_sec` whose r_offset is `off`.
pub fn rel_entry(b: &[u8], rel_sec: &str, off: u64) -> usize {
    let secs = sections(b);
    let (o, n, _, _) = secs
        .iter()
        .find(|s| s.2 == rel_sec)
        .unwrap_or_else(|| panic!("no section {rel_sec}"))
        .clone();
    (0..n / 16)
        .map(|i| o + i * 16)
        .find(|&e| rd(b, e, 8) == off)
        .unwrap_or_else(|| panic!("no relocation at {off:#x} in {rel_sec}"))
}
