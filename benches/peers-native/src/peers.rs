//! The programs, their contexts and the helper, as `runtime/benches/peers.rs` has them.
//!
//! Duplicated, not shared: that bench is a `harness = false` bench of the workspace and this
//! crate is outside it; moving these into a module both include by path would rewrite the
//! top of `peers.rs` under another branch's changes. Keep the two in step: same programs,
//! same `clang` flags, same contexts, same helper, or the tables stop being comparable.

use std::path::Path;

/// The id `pj_mix` is linked to, for every engine.
pub const HELPER_ID: u32 = 77;

/// Programs: (section `peers/<name>`, object). `signed` needs cpu v4 (`sdiv`, `smod`,
/// `movsx`); the others are built for cpu v3 so rbpf runs the same bytecode.
pub const PROGRAMS: &[(&str, &str)] = &[
    ("fnv", "peers"),
    ("xxh", "peers"),
    ("crc32", "peers"),
    ("sort", "peers"),
    ("sieve", "peers"),
    ("parse", "peers"),
    ("signed", "peers_v4"),
    ("calls", "peers"),
    ("helper", "peers"),
    ("words", "peers"),
    ("kv", "peers"),
];

/// What a peer engine is known to do wrong with a program.
#[derive(Clone, Copy)]
pub enum Known {
    /// Compiles it but computes a wrong result: its compile time is shown, its run time not.
    Wrong(&'static str),
    /// Refuses to load or compile it.
    Refuses(&'static str),
}

/// (engine title, program, what it does and why). The bench fails if one of these changes,
/// or if an engine not listed disagrees with packjit.
const KNOWN: &[(&str, &str, Known)] = &[
    (
        "rbpf JIT",
        "calls",
        Known::Wrong(
            "rbpf's JIT gives a bpf-to-bpf callee no stack frame of its own (r10 stays the \
             caller's), so the callee's spills overwrite the caller's locals",
        ),
    ),
    (
        "rbpf JIT",
        "signed",
        Known::Wrong(
            "rbpf 0.4 predates cpu v4: it reads sdiv/smod (off = 1) as div/mod and movsx as mov",
        ),
    ),
    (
        "llvmbpf",
        "signed",
        Known::Wrong(
            "llvmbpf (658ba89) ignores the ALU offset field cpu v4 added: sdiv/smod lift to \
             udiv/urem, movsx to a plain mov",
        ),
    ),
    (
        "ubpf JIT",
        "calls",
        Known::Refuses(
            "ubpf's loader wants each sub-program to end in exit or an unconditional jump, but \
             tests the second-to-last instruction for the jump (insts[end_index - 2] in \
             ubpf_vm.c), so the entry function, which clang ends with `goto`, is refused",
        ),
    ),
];

pub fn known(program: &str, engine: &str) -> Option<Known> {
    KNOWN
        .iter()
        .find(|(e, p, _)| *e == engine && *p == program)
        .map(|(_, _, k)| *k)
}

/// The helper the programs call as `pj_mix`, with the C ABI (packjit, ubpf, llvmbpf).
pub unsafe extern "C" fn pj_mix(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    rbpf_mix(a, b, c, d, e)
}

/// The same helper for rbpf.
pub fn rbpf_mix(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.rotate_left(13) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The clang the ELF tests use: `$PACKJIT_CLANG`, else the newest `clang-N` on PATH, else
/// `clang`.
pub fn clang() -> String {
    let mut candidates: Vec<String> = std::env::var("PACKJIT_CLANG").into_iter().collect();
    candidates.extend((14..=21).rev().map(|v| format!("clang-{v}")));
    candidates.push("clang".into());
    candidates
        .into_iter()
        .find(|c| {
            std::process::Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("clang not found: `source scripts/env.sh && packjit_install`")
}

/// `tests/bpf/peers/<name>.c` compiled with `-O2 -g -target bpf <cpu>`.
pub fn compile_object(name: &str, cpu: &str) -> Vec<u8> {
    let cc = clang();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/bpf/peers")
        .join(format!("{name}.c"));
    let dir = std::env::temp_dir().join(format!("packjit-peers-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let obj = dir.join(format!("{name}.o"));
    let out = std::process::Command::new(&cc)
        .args(["-O2", "-g", "-target", "bpf", cpu, "-c"])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&obj).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// The context each program gets, deterministic.
pub fn input(name: &str) -> Vec<u8> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    match name {
        "sort" => (0..256).map(|_| rnd() as u8).collect(),
        "sieve" => 2000u16.to_le_bytes().to_vec(),
        "parse" => {
            let mut p = vec![0u8; 14 + 20 + 20 + 16];
            p[12] = 0x08; // IPv4
            let ip = &mut p[14..34];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&56u16.to_be_bytes());
            ip[8] = 64;
            ip[9] = 6; // TCP
            ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
            ip[16..20].copy_from_slice(&[192, 168, 1, 20]);
            let tcp = &mut p[34..54];
            tcp[0..2].copy_from_slice(&44321u16.to_be_bytes());
            tcp[2..4].copy_from_slice(&443u16.to_be_bytes());
            tcp[12] = 5 << 4;
            tcp[13] = 0x18;
            p
        }
        "words" => b"the quick brown fox jumps over the lazy dog\n\tand then  it naps\r\n"
            .iter()
            .copied()
            .cycle()
            .take(1024)
            .collect(),
        "kv" => b"len=1500;ttl=64;host=example.org;port=8080;proto=tcp;flags=;mss=1460;"
            .iter()
            .copied()
            .cycle()
            .take(280)
            .collect(),
        _ => (0..512).map(|_| rnd() as u8).collect(),
    }
}
