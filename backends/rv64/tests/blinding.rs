//! Constant blinding (`PJ_COMPILE_BLIND_CONSTANTS`), host side: no immediate of the program
//! can be found in the emitted code.
//!
//! RISC-V never stores a 32-bit immediate as four contiguous bytes: `li` splits it into a
//! `lui` (upper 20 bits, rounded) and an `addi(w)` (low 12 bits), and 64-bit values into
//! shifted chunks. So two scans are made:
//!
//! 1. the raw bytes, for each immediate as the program states it (4 bytes little-endian, and
//!    8 bytes for `lddw`);
//! 2. every value the code *builds from immediates alone*: a constant tracker over the
//!    disassembly follows `li`, `lui`, `addi`/`addiw` and `slli` chains (whatever register
//!    they target) and records each value they produce; none may equal an immediate (as its
//!    32-bit pattern, its sign extension, or the 64-bit `lddw` value). The unblinding `xor`
//!    combines two registers and is deliberately not evaluated: the plain value exists only in
//!    a register at run time, never in the code.
//!
//! The same scans run on the unblinded code must find every immediate, which shows the
//! scanner can see what it looks for.
//!
//! Host run only: these checks start binutils, and a child process started from a test that
//! qemu-user emulates can hang for good (qemu 7.2 forking a multithreaded guest; it cost a CI
//! run). The emitted bytes do not depend on where the compiler runs, so the x86-64 host run
//! covers them; the emulated runs execute the code instead.
#![cfg(target_arch = "x86_64")]

mod common;
use common::*;
use packjit_plugin_api::abi::{PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_SANDBOX};
use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
use std::collections::{HashMap, HashSet};

const IMMS: [i32; 6] = [
    0x1234_5678,
    -0x2152_4111, // 0xdeadbeef
    0x0bad_f00d,
    0x7fff_f7ff,
    -0x3c3c_3c3d,
    0x55aa_33cc,
];
const WIDE: u64 = 0x8765_4321_0fed_cba9;

/// A program using each immediate in a different instruction class.
fn program() -> Vec<u8> {
    let [a, b] = lddw(3, WIDE);
    prog(&[
        ins(0xb7, 0, 0, 0, IMMS[0]),   // mov r0, imm
        ins(0x07, 0, 0, 0, IMMS[1]),   // add r0, imm
        ins(0xa4, 0, 0, 0, IMMS[2]),   // xor32 r0, imm
        ins(0x7a, 10, 0, -8, IMMS[3]), // stdw [r10-8], imm
        ins(0x15, 0, 0, 1, IMMS[4]),   // jeq r0, imm, +1
        ins(0x2f, 0, 0, 0, 0),         // mul r0, r0
        ins(0x37, 0, 0, 0, IMMS[5]),   // div r0, imm
        a,
        b,
        ins(0x0f, 0, 3, 0, 0),
        EXIT,
    ])
}

/// Every value built from immediates alone, by a constant tracker over the disassembly.
fn built_constants(code: &[u8]) -> HashSet<u64> {
    let mut known: HashMap<String, u64> = HashMap::new();
    let mut seen = HashSet::new();
    let num = |s: &str| -> Option<i64> {
        let s = s.trim();
        let (neg, s) = s.strip_prefix('-').map_or((false, s), |r| (true, r));
        let v = match s.strip_prefix("0x") {
            Some(h) => i64::from_str_radix(h, 16).ok()?,
            None => s.parse().ok()?,
        };
        Some(if neg { -v } else { v })
    };
    for line in disasm(code) {
        let line = line.trim_start_matches("c:");
        let Some((mnem, ops)) = line.split_once(' ') else {
            continue;
        };
        let ops: Vec<&str> = ops.split(',').collect();
        let dst = ops[0].to_string();
        let val = |r: &str| known.get(r).copied();
        let result: Option<u64> = match (mnem, ops.len()) {
            ("li", 2) => num(ops[1]).map(|v| v as u64),
            // objdump prints lui's 20-bit field; the value is sign-extended from bit 31.
            ("lui", 2) => num(ops[1]).map(|v| ((v << 12) as i32) as i64 as u64),
            // `add rd, rs, imm` is addi in objdump's numeric form; rs may be x0.
            ("add" | "addw", 3) => match (num(ops[2]), ops[1]) {
                (Some(imm), "x0") => Some(imm as u64),
                (Some(imm), rs) => val(rs).map(|v| {
                    let s = v.wrapping_add(imm as u64);
                    if mnem == "addw" {
                        s as i32 as i64 as u64
                    } else {
                        s
                    }
                }),
                (None, _) => None,
            },
            ("sll", 3) => match (num(ops[2]), val(ops[1])) {
                (Some(sh), Some(v)) => Some(v << sh),
                _ => None,
            },
            _ => None,
        };
        match result {
            Some(v) => {
                seen.insert(v);
                known.insert(dst, v);
            }
            None => {
                known.remove(&dst);
            }
        }
    }
    seen
}

/// The immediates the scanner looks for, as (bytes patterns, values).
fn findings(code: &[u8]) -> Vec<String> {
    let built = built_constants(code);
    let mut found = Vec::new();
    for imm in IMMS {
        let pat = imm.to_le_bytes();
        if code.windows(4).any(|w| w == pat) {
            found.push(format!("bytes of {imm:#x}"));
        }
        for v in [imm as i64 as u64, imm as u32 as u64] {
            if built.contains(&v) {
                found.push(format!("built {v:#x}"));
            }
        }
    }
    if code.windows(8).any(|w| w == WIDE.to_le_bytes()) {
        found.push(format!("bytes of {WIDE:#x}"));
    }
    for v in [WIDE, WIDE as u32 as u64, WIDE >> 32] {
        if built.contains(&v) {
            found.push(format!("built {v:#x}"));
        }
    }
    found
}

#[test]
fn no_immediate_survives_blinding() {
    let code = program();
    for features in [0, FEATURE_C, FEATURE_ZBB | FEATURE_ZBA | FEATURE_C] {
        // Without blinding the scanner finds every immediate (it can see them).
        let plain = compile_with(&code, &[], features, 0, 0).unwrap();
        let f = findings(&plain);
        for imm in IMMS {
            assert!(
                f.iter()
                    .any(|s| s.ends_with(&format!("{:#x}", imm as i64 as u64))
                        || s.ends_with(&format!("{:#x}", imm as u32))),
                "features {features:#x}: unblinded {imm:#x} not found; the scanner is blind: {f:?}"
            );
        }
        assert!(
            f.iter().any(|s| s.ends_with(&format!("{WIDE:#x}"))),
            "{f:?}"
        );
        for key in [1u64, 0x5eed_5eed_5eed_5eed, u64::MAX] {
            for flags in [
                PJ_COMPILE_BLIND_CONSTANTS,
                PJ_COMPILE_BLIND_CONSTANTS | PJ_COMPILE_SANDBOX,
            ] {
                let blinded = compile_with(&code, &[], features, flags, key).unwrap();
                let f = findings(&blinded);
                assert!(
                    f.is_empty(),
                    "features {features:#x} flags {flags:#x} key {key:#x}: {f:?}"
                );
            }
        }
    }
}

#[test]
fn blinding_depends_on_the_key() {
    let code = program();
    let a = compile_with(&code, &[], 0, PJ_COMPILE_BLIND_CONSTANTS, 1).unwrap();
    let b = compile_with(&code, &[], 0, PJ_COMPILE_BLIND_CONSTANTS, 2).unwrap();
    assert_ne!(a, b);
}
