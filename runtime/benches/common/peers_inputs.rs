//! What the side-by-side benches give every engine alike: the programs' sources compiled
//! by clang, the helper they call as `pj_mix` (id [`HELPER_ID`]), and each program's context.
//! Included by path from `runtime/benches/peers.rs` and from `benches/peers-native` (a crate
//! outside the workspace), so both measure the same thing.

use std::path::Path;

/// The id `pj_mix` is linked to, for every engine.
pub const HELPER_ID: u32 = 77;

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

/// `<sources>/<name>.c` (the repository's `tests/bpf/peers`) compiled with
/// `-O2 -g -target bpf <cpu>`.
pub fn compile_object(sources: &Path, name: &str, cpu: &str) -> Vec<u8> {
    let cc = clang();
    let src = sources.join(format!("{name}.c"));
    let dir = std::env::temp_dir().join(format!("packjit-peers-{name}-{}", std::process::id()));
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
