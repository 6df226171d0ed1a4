//! Golden disassembly of the emitted code (host side, `aarch64-linux-gnu-objdump`), plus the
//! error paths of `compile`.

mod common;

use common::*;
use packjit_arm64::emit::emit_program;
use packjit_arm64::{Arm64Backend, FEATURE_LSE};
use packjit_plugin_api::{CompileRequest, ErrorKind, HelperEntry, JitBackend};
use std::process::Command;

/// Disassembles `bytes` with the cross objdump: one `mnemonic operands` line per instruction.
fn disasm(bytes: &[u8]) -> Vec<String> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "packjit-arm64-golden-{}-{:x}.bin",
        std::process::id(),
        {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(bytes)
        }
    ));
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new("aarch64-linux-gnu-objdump")
        .args(["-D", "-b", "binary", "-m", "aarch64"])
        .arg(&path)
        .output();
    std::fs::remove_file(&path).ok();
    let out = out.expect("aarch64-linux-gnu-objdump must be installed for the golden tests");
    assert!(
        out.status.success(),
        "objdump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            // "   4:	d2800007 	movz	x7, #0x7" -> "movz x7, #0x7"
            let mut parts = l.splitn(3, '\t');
            let addr = parts.next()?;
            if !addr.trim_end().ends_with(':') {
                return None;
            }
            parts.next()?;
            let text = parts.next()?.trim();
            // Drop objdump's "// #imm" and "<label>" annotations.
            let text = text.split("//").next().unwrap().trim();
            Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

fn code(insns: &[[u8; 8]], helpers: &[HelperEntry], features: u64) -> Vec<String> {
    let out = emit_program(&prog(insns), helpers, features).unwrap();
    assert_eq!(out.native_insns * 4, out.bytes.len());
    disasm(&out.bytes)
}

#[test]
fn dump() {
    let l = code(
        &[ins(0xb7, 0, 0, 0, 7), ins(0x07, 0, 0, 0, 4095), EXIT],
        &[],
        0,
    );
    println!("{l:#?}");
}
