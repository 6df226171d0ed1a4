//! Golden disassembly of the emitted code (host side, `aarch64-linux-gnu-objdump`), plus the
//! error paths of `compile`.
//!
//! Host run only: these checks start binutils, and a child process started from a test that
//! qemu-user emulates can hang for good (qemu 7.2 forking a multithreaded guest; it cost a CI
//! run). The emitted bytes do not depend on where the compiler runs, so the x86-64 host run
//! covers them; the emulated runs execute the code instead.
#![cfg(target_arch = "x86_64")]

mod common;

use common::*;
use packjit_arm64::emit_program;
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
    let out = packjit_testkit::host_tool::output(
        Command::new("aarch64-linux-gnu-objdump")
            .args(["-D", "-b", "binary", "-m", "aarch64"])
            .arg(&path),
    );
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

const HELPER_ADDR: u64 = 0x0000_7f12_3456_7890;

fn check(name: &str, insns: &[[u8; 8]], features: u64, want: &[&str]) {
    let got = code(insns, &[helper(1, HELPER_ADDR)], features);
    assert_eq!(
        got,
        want,
        "{name}: emitted code changed:\n{}",
        got.join("\n")
    );
}

#[test]
fn minimal_program_has_no_frame() {
    // No calls, no stack, no r6-r9: nothing to save.
    check(
        "mov-exit",
        &[ins(0xb7, 0, 0, 0, 7), EXIT],
        0,
        &["mov x0, #0x7", "ret"],
    );
}

#[test]
fn add_imm12_shifted_negative_and_large() {
    check(
        "add",
        &[
            ins(0x07, 0, 0, 0, 4095),
            ins(0x07, 0, 0, 0, 0x12000),
            ins(0x07, 0, 0, 0, -7),
            ins(0x07, 0, 0, 0, 0x12345),
            EXIT,
        ],
        0,
        &[
            // r0 is read before any write (exit, add, cmpxchg): zeroed at entry.
            "mov x0, xzr",
            "add x0, x0, #0xfff",
            "add x0, x0, #0x12, lsl #12",
            "sub x0, x0, #0x7",
            "mov x10, #0x2345",
            "movk x10, #0x1, lsl #16",
            "add x0, x0, x10",
            "ret",
        ],
    );
}

#[test]
fn logical_immediates() {
    check(
        "logic",
        &[
            ins(0x57, 1, 0, 0, 0xff),
            ins(0x47, 1, 0, 0, 0x0ff0),
            ins(0xa7, 1, 0, 0, -1),
            ins(0x57, 1, 0, 0, 0x12345),
            ins(0x54, 1, 0, 0, -1),
            EXIT,
        ],
        0,
        &[
            // A program that calls nothing keeps r0 in x0 and r1 in x7: the context moves
            // over first, then r0, read before any write, is zeroed.
            "mov x7, x0",
            "mov x0, xzr",
            "and x7, x7, #0xff",
            "orr x7, x7, #0xff0",
            "mvn x7, x7",
            // 0x12345 is no bitmask immediate: through a scratch register.
            "mov x10, #0x2345",
            "movk x10, #0x1, lsl #16",
            "and x7, x7, x10",
            // and32 with all ones only zero-extends.
            "mov w7, w7",
            "ret",
        ],
    );
}

#[test]
fn wide_constants_touch_only_needed_halfwords() {
    let p: Vec<[u8; 8]> = [
        lddw(0, 0x1234_0000_0000_5678),
        lddw(0, 0xffff_ffff_ffff_1234),
        lddw(0, 0x5555_5555_5555_5555),
        lddw(0, 0x0123_4567_89ab_cdef),
    ]
    .concat()
    .into_iter()
    .chain([EXIT])
    .collect();
    check(
        "lddw",
        &p,
        0,
        &[
            "mov x0, #0x5678",
            "movk x0, #0x1234, lsl #48",
            "mov x0, #0xffffffffffff1234",
            "mov x0, #0x5555555555555555",
            "mov x0, #0xcdef",
            "movk x0, #0x89ab, lsl #16",
            "movk x0, #0x4567, lsl #32",
            "movk x0, #0x123, lsl #48",
            "ret",
        ],
    );
}

#[test]
fn conditional_branches_use_compare_and_branch_forms() {
    check(
        "branch",
        &[
            ins(0x15, 1, 0, 5, 0),
            ins(0x25, 1, 0, 4, 7),
            ins(0x45, 1, 0, 3, 8),
            ins(0xbd, 1, 2, 2, 0),
            ins(0xc6, 1, 0, 1, -5),
            ins(0xb7, 0, 0, 0, 1),
            EXIT,
        ],
        0,
        &[
            // r0 is read before any write (exit, add, cmpxchg): zeroed at entry.
            "mov x7, x0",
            "mov x0, xzr",
            "cbz x7, 0x2c",
            "cmp x7, #0x7",
            "b.hi 0x2c",
            "tbnz w7, #3, 0x2c",
            "cmp x7, x1",
            "b.ls 0x2c",
            "cmn w7, #0x5",
            "b.lt 0x2c",
            "mov x0, #0x1",
            "ret",
        ],
    );
}

#[test]
fn division_needs_no_guard_on_arm64() {
    // UDIV/SDIV return 0 for a zero divisor and never trap on MIN / -1; MSUB then gives
    // x % 0 = x. Immediates fold: / 0 -> 0, / 2^k -> LSR.
    check(
        "div",
        &[
            ins(0x3f, 1, 2, 0, 0),
            ins(0x9c, 1, 2, 0, 0),
            ins(0x3f, 1, 2, 1, 0),
            ins(0x37, 1, 0, 0, 0),
            ins(0x37, 1, 0, 0, 8),
            EXIT,
        ],
        0,
        &[
            // r0 is read before any write (exit, add, cmpxchg): zeroed at entry.
            "mov x7, x0",
            "mov x0, xzr",
            "udiv x7, x7, x1",
            "udiv w11, w7, w1",
            "msub w7, w11, w1, w7",
            "sdiv x7, x7, x1",
            "mov x7, #0x0",
            "lsr x7, x7, #3",
            "ret",
        ],
    );
}

#[test]
fn helper_call_saves_only_what_it_uses() {
    check(
        "helper",
        &[
            ins(0xbf, 6, 1, 0, 0),
            ins(0x85, 0, 0, 0, 1),
            ins(0x0f, 0, 6, 0, 0),
            EXIT,
        ],
        0,
        &[
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "str x19, [sp, #-16]!",
            // The helper may read r3-r5, never written: zeroed so no host value leaks.
            "mov x2, xzr",
            "mov x3, xzr",
            "mov x4, xzr",
            "mov x19, x0",
            // Arguments already in x0-x4: no shuffling, just the absolute address.
            "mov x9, #0x7890",
            "movk x9, #0x3456, lsl #16",
            "movk x9, #0x7f12, lsl #32",
            "blr x9",
            "mov x7, x0",
            "add x7, x7, x19",
            "mov x0, x7",
            "ldr x19, [sp], #16",
            "ldp x29, x30, [sp], #16",
            "ret",
        ],
    );
}

#[test]
fn atomics_lse() {
    check(
        "atomic_lse",
        &[
            ins(0xdb, 1, 2, 0, 0x00),
            ins(0xdb, 1, 2, 8, 0x01),
            ins(0xc3, 1, 2, 0, 0x51),
            ins(0xdb, 1, 2, 0, 0xf1),
            EXIT,
        ],
        FEATURE_LSE,
        &[
            // r0 is read before any write (exit, add, cmpxchg): zeroed at entry.
            "mov x7, x0",
            "mov x0, xzr",
            "stadd x1, [x7]",
            "add x9, x7, #0x8",
            "ldaddal x1, x1, [x9]",
            "mvn x10, x1",
            "ldclral w10, w1, [x7]",
            "casal x0, x1, [x7]",
            "ret",
        ],
    );
}

#[test]
fn atomics_exclusive_loops_without_lse() {
    check(
        "atomic_llsc",
        &[ins(0xdb, 1, 2, 0, 0x01), ins(0xdb, 1, 2, 0, 0xf1), EXIT],
        0,
        &[
            // r0 is read before any write (exit, add, cmpxchg): zeroed at entry.
            "mov x7, x0",
            "mov x0, xzr",
            "ldxr x10, [x7]",
            "add x11, x10, x1",
            "stlxr w12, x11, [x7]",
            "cbnz w12, 0x8",
            "dmb ish",
            "mov x1, x10",
            "ldxr x10, [x7]",
            "cmp x10, x0",
            "b.ne 0x34",
            "stlxr w12, x1, [x7]",
            "cbnz w12, 0x20",
            "dmb ish",
            "mov x0, x10",
            "ret",
        ],
    );
}

#[test]
fn stack_accesses_are_sp_relative() {
    check(
        "stack",
        &[
            ins(0x7a, 10, 0, -8, 0),
            ins(0x79, 0, 10, -8, 0),
            ins(0x61, 0, 10, -3, 0),
            ins(0xbf, 1, 10, 0, 0),
            EXIT,
        ],
        0,
        &[
            // Unaligned and out of LDUR's ±256: register offset.
            "sub sp, sp, #0x200",
            "str xzr, [sp, #504]",
            "ldr x0, [sp, #504]",
            "mov x9, #0x1fd",
            "ldr w0, [sp, x9]",
            "add x7, sp, #0x200",
            "add sp, sp, #0x200",
            "ret",
        ],
    );
}

#[test]
fn memory_addressing_forms() {
    check(
        "mem",
        &[
            ins(0x79, 0, 1, 8, 0),
            ins(0x79, 0, 1, -8, 0),
            ins(0x79, 0, 1, 30001, 0),
            ins(0x81, 0, 1, 4, 0),
            ins(0x62, 1, 0, 4, 0x10000),
            EXIT,
        ],
        0,
        &[
            "mov x7, x0",
            "ldr x0, [x7, #8]",
            "ldur x0, [x7, #-8]",
            "mov x9, #0x7531",
            "ldr x0, [x7, x9]",
            "ldrsw x0, [x7, #4]",
            "mov w11, #0x10000",
            "str w11, [x7, #4]",
            "ret",
        ],
    );
}

#[test]
fn callx_compares_ids_and_stops() {
    check(
        "callx",
        &[ins(0x8d, 2, 0, 0, 0), EXIT],
        0,
        &[
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            // callx can stop: env (x2) is kept in x28 and the entry sp saved for the unwind.
            "str x28, [sp, #-16]!",
            "mov x28, x2",
            "mov x14, sp",
            "str x14, [x28, #80]",
            "mov x2, xzr",
            "mov x3, xzr",
            "mov x4, xzr",
            "cmp x1, #0x1",
            "b.ne 0x3c",
            "mov x11, #0x7890",
            "movk x11, #0x3456, lsl #16",
            "movk x11, #0x7f12, lsl #32",
            "b 0x4c",
            // No helper has the id: stop (kind 3 = PJ_STOP_UNKNOWN_CALLX, pc 0, addr = id).
            "mov x9, x1",
            "mov x16, #0x3",
            "mov x15, #0x0",
            "b 0x64",
            "blr x11",
            "mov x7, x0",
            "mov x0, x7",
            "ldr x28, [sp], #16",
            "ldp x29, x30, [sp], #16",
            "ret",
            // The shared stop path: env fields, sp = entry_sp, out through the entry's
            // restore.
            "str x16, [x28, #40]",
            "stp x15, x9, [x28, #48]",
            "ldr x14, [x28, #80]",
            "mov sp, x14",
            "b 0x54",
        ],
    );
}

#[test]
fn local_calls_need_no_argument_moves() {
    check(
        "local",
        &[
            ins(0x85, 0, 1, 0, 1),
            EXIT,
            ins(0xb7, 6, 0, 0, 1),
            ins(0xbf, 0, 6, 0, 0),
            EXIT,
        ],
        0,
        &[
            // The callee calls nothing: its r6 lives in caller-saved x14, so it saves
            // nothing; r0 stays in x7 for the caller.
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "bl 0x18",
            "mov x0, x7",
            "ldp x29, x30, [sp], #16",
            "ret",
            "mov x14, #0x1",
            "mov x7, x14",
            "ret",
        ],
    );
}

#[test]
fn far_conditional_branch_uses_the_long_form() {
    // jset r1, 4 over 30000 lddw (480 KiB): beyond TBNZ's ±32 KiB.
    let mut p = vec![ins(0x45, 1, 0, 30000, 4)];
    p.extend(std::iter::repeat_n(lddw(3, 0x1234_5678_9abc_def0), 15000).flatten());
    p.push(EXIT);
    let out = emit_program(&prog(&p), &[], 0).unwrap();
    assert_eq!(out.passes, 2);
    let d = disasm(&out.bytes[..16]);
    assert_eq!(
        d,
        [
            "mov x7, x0",
            "mov x0, xzr",
            "tbz w7, #2, 0x10",
            &format!("b 0x{:x}", out.bytes.len() - 4)
        ]
    );
}

#[test]
fn sandboxed_context_load_checks_inline_and_clamps() {
    // r2 += r1 (ctx + len); r0 = *(u64 *)r2; r0 = *(u64 *)(r1 + 8): a pointer at an
    // unknown offset into the context gets the full context check, r1 (the context start:
    // the front end's range analysis knows) only compares off + size with the length.
    // Both clamp the address with CSEL on the failing side (Spectre v1) and load from x9.
    let code = prog(&[
        ins(0x0f, 2, 1, 0, 0),
        ins(0x79, 0, 2, 0, 0),
        ins(0x79, 0, 1, 8, 0),
        EXIT,
    ]);
    let out = packjit_arm64::emit_request(&CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: packjit_plugin_api::PJ_COMPILE_SANDBOX,
        blind_key: 0,
    })
    .unwrap();
    let d = disasm(&out.bytes);
    // The program calls nothing: r0 is in x0, r1 in x7.
    let at = d.iter().position(|l| l == "add x1, x1, x7").unwrap();
    let cold = |l: &str| l.starts_with("b.cc ");
    assert!(cold(&d[at + 4]) && cold(&d[at + 9]), "{d:#?}");
    let mut got: Vec<&str> = d[at..at + 12].iter().map(|s| s.as_str()).collect();
    got[4] = "b.cc cold";
    got[9] = "b.cc cold";
    assert_eq!(
        got,
        [
            "add x1, x1, x7",
            "sub x14, x1, x23",
            "subs x14, x24, x14",
            "ccmp x14, #0x8, #0x0, cs",
            "b.cc cold",
            "csel x9, x1, xzr, cs",
            "ldr x0, [x9]",
            "add x9, x7, #0x8",
            "cmp x24, #0x10",
            "b.cc cold",
            "csel x9, x9, xzr, cs",
            "ldr x0, [x9]",
        ]
    );
    // The frame is not on the native stack in the sandbox; no budget path without budget.
    assert!(!d.iter().any(|l| l.starts_with("sub sp")), "{d:#?}");
    assert!(!d.iter().any(|l| l == "mov x16, #0x2"), "{d:#?}");
}

#[test]
fn sandboxed_byte_load_tests_the_context_start_and_length_only() {
    // r2 += r1; r0 = *(u8 *)r2: one byte at an unknown offset into the context is inside
    // exactly when `addr - start < len` (an address below the start wraps past any
    // length): no end to form, so `sub; cmp`, the cold branch on `cs` and the clamp on
    // `cc` (lo), one instruction fewer than the wider accesses' `subs; ccmp`.
    let code = prog(&[ins(0x0f, 2, 1, 0, 0), ins(0x71, 0, 2, 0, 0), EXIT]);
    let out = packjit_arm64::emit_request(&CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: packjit_plugin_api::PJ_COMPILE_SANDBOX,
        blind_key: 0,
    })
    .unwrap();
    let d = disasm(&out.bytes);
    let at = d.iter().position(|l| l == "add x1, x1, x7").unwrap();
    assert!(d[at + 3].starts_with("b.cs "), "{d:#?}");
    let mut got: Vec<&str> = d[at..at + 6].iter().map(|s| s.as_str()).collect();
    got[3] = "b.cs cold";
    assert_eq!(
        got,
        [
            "add x1, x1, x7",
            "sub x14, x1, x23",
            "cmp x14, x24",
            "b.cs cold",
            "csel x9, x1, xzr, cc",
            "ldrb w0, [x9]",
        ]
    );
}

// ---------------------------------------------------------------- errors and the trait

fn req<'a>(code: &'a [u8], helpers: &'a [HelperEntry]) -> CompileRequest<'a> {
    CompileRequest {
        code,
        helpers,
        features: 0,
        flags: 0,
        blind_key: 0,
    }
}

#[test]
fn backend_identity() {
    let be = Arm64Backend::new();
    assert_eq!(be.arch(), packjit_plugin_api::Arch::Aarch64);
    assert_eq!(be.name(), "packjit-arm64");
    assert_eq!(be.version(), env!("CARGO_PKG_VERSION"));
    assert_eq!(be.supported_features(), FEATURE_LSE);
    if cfg!(not(target_arch = "aarch64")) {
        assert_eq!(be.detect_features(), 0);
    }
}

#[test]
fn compile_installs_into_the_arena() {
    let be = Arm64Backend::new();
    let arena = VecArena::default();
    let code = prog(&[ins(0xb7, 0, 0, 0, 7), EXIT]);
    let c = be.compile(&req(&code, &[]), &arena).unwrap();
    assert_eq!(c.code_size, 8);
    assert_eq!(c.native_insns, 2);
    assert_eq!(c.entry, c.region.exec_addr);
    let mem = arena.mem.borrow();
    assert_eq!(disasm(&mem[..8]), ["mov x0, #0x7", "ret"]);
}

#[test]
fn bad_requests_are_errors_naming_pc_and_reason() {
    let be = Arm64Backend::new();
    let arena = VecArena::default();
    let call9 = prog(&[ins(0x85, 0, 0, 0, 9), EXIT]);
    let e = be
        .compile(&req(&call9, &[helper(1, 0x1000)]), &arena)
        .unwrap_err();
    assert_eq!((e.kind, e.pc), (ErrorKind::UnknownHelper, Some(0)));
    assert_eq!(e.to_string(), "pc 0: call to unknown helper id 9");

    let ok = prog(&[EXIT]);
    let mut r = req(&ok, &[]);
    r.flags = 1 << 7;
    let e = be.compile(&r, &arena).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("flags 0x80"), "{e}");

    let mut r = req(&ok, &[]);
    r.features = 1 << 5;
    let e = be.compile(&r, &arena).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("0x20"), "{e}");

    let bad = prog(&[ins(0xb7, 0, 0, 0, 0), ins(0xf7, 1, 0, 0, 0), EXIT]);
    let e = be.compile(&req(&bad, &[]), &arena).unwrap_err();
    assert_eq!((e.kind, e.pc), (ErrorKind::Verify, Some(1)));
    assert_eq!(e.to_string(), "pc 1: unknown opcode 0xf7");

    let e = be.compile(&req(&ok[..4], &[]), &arena).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Verify);

    // Nothing was allocated for failed compiles.
    assert!(arena.mem.borrow().is_empty());

    let full = VecArena {
        fail_alloc: true,
        ..Default::default()
    };
    let e = be.compile(&req(&ok, &[]), &full).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Arena);
}

#[test]
fn malformed_programs_are_refused_with_a_pc() {
    // A sample of malformed encodings (the conformance `negative/` cases run through the
    // testkit harness): each is refused with a pc, nothing is emitted.
    let be = Arm64Backend::new();
    let arena = VecArena::default();
    for (what, p) in [
        (
            "reserved src on imm alu",
            prog(&[ins(0x07, 0, 1, 0, 1), EXIT]),
        ),
        ("write to r10", prog(&[ins(0xb7, 10, 0, 0, 0), EXIT])),
        ("register 11", prog(&[ins(0xbf, 0, 11, 0, 0), EXIT])),
        ("jump out", prog(&[ins(0x05, 0, 0, 7, 0), EXIT])),
        ("fall off", prog(&[ins(0xb7, 0, 0, 0, 0)])),
        ("bad atomic", prog(&[ins(0xdb, 1, 2, 0, 0x02), EXIT])),
        ("bad end width", prog(&[ins(0xd4, 0, 0, 0, 8), EXIT])),
        ("ld_abs with a dst", prog(&[ins(0x20, 1, 0, 0, 0), EXIT])),
        ("ld class, mem mode", prog(&[ins(0x60, 0, 0, 0, 0), EXIT])),
    ] {
        let e = be.compile(&req(&p, &[]), &arena).unwrap_err();
        assert!(e.pc.is_some(), "{what}: {e}");
    }
}

#[test]
fn every_mode_compiles_the_conformance_corpus() {
    // Host-side: each of the 8 flag combinations with and without LSE compiles every suite
    // program the trusted build compiles (and refuses the same ones), and the sandboxed code
    // is never smaller than the trusted code.
    use packjit_plugin_api::{PJ_COMPILE_ALL_FLAGS, PJ_COMPILE_PERCPU_INSN, PJ_COMPILE_SANDBOX};
    let cases =
        packjit_testkit::conformance::load_suite(&packjit_testkit::conformance::suite_dir())
            .expect("conformance suite");
    let helpers = [helper(5, HELPER_ADDR)];
    let mut compiled = 0;
    for case in &cases {
        let Ok(code) = &case.program else { continue };
        for features in [0, FEATURE_LSE] {
            let build = |flags: u32| {
                packjit_arm64::emit_request(&CompileRequest {
                    code,
                    helpers: &helpers,
                    features,
                    flags,
                    blind_key: 0x77,
                })
            };
            let trusted = build(0);
            // Every combination of the code-generation modes. The per-CPU opt-in only widens
            // what the decoder accepts (and needs its table entry), so it is not a mode here.
            for flags in (1..=PJ_COMPILE_ALL_FLAGS).filter(|f| f & PJ_COMPILE_PERCPU_INSN == 0) {
                let out = build(flags);
                match (&trusted, &out) {
                    (Ok(t), Ok(o)) => {
                        compiled += 1;
                        if flags & PJ_COMPILE_SANDBOX != 0 {
                            assert!(o.bytes.len() >= t.bytes.len(), "{}", case.name);
                        }
                    }
                    (Err(a), Err(b)) => assert_eq!(a, b, "{}", case.name),
                    (a, b) => panic!("{} flags {flags:#x}: {a:?} vs {b:?}", case.name),
                }
            }
        }
    }
    assert!(compiled >= 300 * 14, "{compiled}");
}

/// The inlined built-ins (`packjit_testkit::inline_cases`, the same on every arch): the rseq
/// CPU id is `mrs tpidr_el0` and one load, the clock reads `cntvct_el0` (after an `isb`) and
/// scales it with the 64.64 factor the host keeps at `addr`, the per-CPU lookup
/// bounds-checks array id, index and CPU before forming `base + cpu * slot + index * size`,
/// and the per-CPU address instruction adds `cpu * slot_size` (0 for an unknown array or
/// CPU). Trusted code: the sequences and the entry only.
#[test]
fn inlined_builtins_are_short_sequences() {
    let helpers = packjit_testkit::inline_cases::helpers();
    let want: [&[&str]; 4] = [
        &[
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "mov x2, xzr",
            "mov x3, xzr",
            "mov x4, xzr",
            "mrs x9, tpidr_el0",
            "ldur w7, [x9, #-84]",
            "mov x0, x7",
            "ldp x29, x30, [sp], #16",
            "ret",
        ],
        &[
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "mov x2, xzr",
            "mov x3, xzr",
            "mov x4, xzr",
            "isb",
            "mrs x9, cntvct_el0",
            "mov x10, #0x5000",
            "movk x10, #0x1234, lsl #16",
            "movk x10, #0x7f00, lsl #32",
            "ldr x11, [x10, #8]",
            "umulh x12, x9, x11",
            "ldr x11, [x10]",
            "madd x12, x9, x11, x12",
            "ldr x11, [x10, #16]",
            "add x7, x12, x11",
            "mov x0, x7",
            "ldp x29, x30, [sp], #16",
            "ret",
        ],
        &[
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "mov x2, xzr",
            "mov x3, xzr",
            "mov x4, xzr",
            "mov x0, #0x0",
            "mov x1, #0x3",
            "mov x10, #0x6000",
            "movk x10, #0x1234, lsl #16",
            "movk x10, #0x7f00, lsl #32",
            "ldr x9, [x10]",
            "cmp x0, x9",
            "b.cs 0x80",
            "mov x11, #0x28",
            "madd x11, x0, x11, x10",
            "add x11, x11, #0x10",
            "ldr x9, [x11, #24]",
            "cmp x1, x9",
            "b.cs 0x80",
            "ldr x9, [x10, #8]",
            "mrs x12, tpidr_el0",
            "ldr w12, [x12, x9]",
            "ldr x9, [x11, #32]",
            "cmp x12, x9",
            "b.cs 0x80",
            "csel x12, x12, xzr, cc",
            "ldr x9, [x11, #8]",
            "ldr x13, [x11]",
            "madd x13, x12, x9, x13",
            "ldr x9, [x11, #16]",
            "madd x7, x1, x9, x13",
            "b 0x84",
            "mov x7, xzr",
            "mov x0, x7",
            "ldp x29, x30, [sp], #16",
            "ret",
        ],
        &[
            "stp x29, x30, [sp, #-16]!",
            "mov x29, sp",
            "mrs x9, tpidr_el0",
            "ldur w13, [x9, #-84]",
            "mov w11, #0x0",
            "mov x10, #0x6000",
            "movk x10, #0x1234, lsl #16",
            "movk x10, #0x7f00, lsl #32",
            "mov x12, xzr",
            "ldr x9, [x10]",
            "cmp x9, x11",
            "b.ls 0x4c",
            "mov x9, #0x28",
            "madd x10, x11, x9, x10",
            "ldr x9, [x10, #48]",
            "cmp x13, x9",
            "b.cs 0x4c",
            "ldr x9, [x10, #24]",
            "mul x12, x13, x9",
            "add x7, x0, x12",
            "mov x0, x7",
            "ldp x29, x30, [sp], #16",
            "ret",
        ],
    ];
    for ((name, code, flags), want) in packjit_testkit::inline_cases::programs().iter().zip(want) {
        let out = packjit_arm64::emit_request(&CompileRequest {
            code,
            helpers: &helpers,
            features: 0,
            flags: *flags,
            blind_key: 0,
        })
        .unwrap();
        let got = disasm(&out.bytes);
        assert_eq!(got, want, "{name}:\n{}", got.join("\n"));
    }
}

/// The Spectre clamps that no functional test can see, on the bench's loops
/// (`packjit_testkit::bench`): the walked stack pointer's loop (back-edge lands on the
/// pointer's copy into a dead register, masked with the sign of its distance to the bound,
/// then the load through that copy), the context walk (the same, after an entry test), the
/// header-parse loop (back-edge lands past the group's check: no check per iteration), and
/// that loop's checked copy, which rebuilds the base from each member's clamped address.
#[test]
fn loops_clamp_what_they_no_longer_check() {
    let programs = packjit_testkit::bench::sandbox_programs();
    let hot_loop = |name: &str| -> (Vec<String>, Vec<String>) {
        let p = programs.iter().find(|p| p.name.starts_with(name)).unwrap();
        let out = packjit_arm64::emit_request(&CompileRequest {
            code: &p.code,
            helpers: &[],
            features: 0,
            flags: packjit_plugin_api::PJ_COMPILE_SANDBOX,
            blind_key: 0,
        })
        .unwrap();
        let from = packjit_testkit::bench::loop_landing(
            p.hot.start,
            out.inst_offsets[p.hot.start] as usize,
            &out.landings,
        );
        let to = out.inst_offsets[p.hot.end] as usize;
        (disasm(&out.bytes[from..to]), disasm(&out.bytes))
    };
    let want: [&[&str]; 2] = [
        &[
            // The clamp writes the pointer's copy (r1, dead in and after the loop; x7, as
            // the program calls nothing, which puts r0 in x0), off the pointer's own chain
            // (`add x2, x2, #8` alone): p & sign(p - r10).
            "sub x9, x2, x1",
            "and x7, x2, x9, asr #63",
            "ldr x3, [x7]",
            "add x0, x0, x3",
            "add x2, x2, #0x8",
            // r10 (no register of its own in the sandbox) kept in a second dead register
            // (r2 = x1), set on entry, instead of materialised every iteration.
            "cmp x2, x1",
            "b.ne 0x0",
        ],
        &[
            "ldrh w1, [x7, #12]",
            "ldrb w2, [x7, #23]",
            "ldur w3, [x7, #26]",
            "ldur w4, [x7, #30]",
            "ldrh w20, [x7, #34]",
            "add x0, x0, x1",
            "eor x0, x0, x2",
            "add x0, x0, x3",
            "eor x0, x0, x4",
            "add x0, x0, x20",
            "add x19, x19, #0x1",
            "cmp x19, #0x1, lsl #12",
            "b.cc 0x0",
        ],
    ];
    // The context walk: a guarded walk (bounds known at run time), no check in the loop,
    // the pointer's clamped copy in r1 (p & sign(p - bound); x7, as the program calls
    // nothing, which also puts r0 in x0). The entry test is one verdict (two `ccmp`s) that
    // also selects the pointer.
    let (ctx_walk, all) = hot_loop("ctx hash");
    let want_ctx = [
        "sub x9, x2, x1",
        "and x7, x2, x9, asr #63",
        "ldr x3, [x7]",
        "eor x0, x0, x3",
        "mul x0, x0, x4",
        "add x2, x2, #0x8",
        "cmp x1, x2",
        "b.hi 0x0",
    ];
    assert_eq!(ctx_walk, want_ctx, "context walk:\n{}", ctx_walk.join("\n"));
    for line in [
        "ccmp x14, x16, #0x2, cs",
        "ccmp x9, x16, #0x2, ls",
        "csel x2, x2, xzr, ls",
    ] {
        assert!(
            all.iter().any(|l| l == line),
            "{line} missing:\n{}",
            all.join("\n")
        );
    }
    let (walk, all_walk) = hot_loop("stack table (checked");
    assert_eq!(walk, want[0], "walk:\n{}", walk.join("\n"));
    let entry = ["mov x7, x2", "add x1, x25, #0x200"];
    assert!(
        all_walk.windows(2).any(|w| w == entry),
        "{}",
        all_walk.join("\n")
    );
    let (header, all) = hot_loop("header parse");
    assert_eq!(header, want[1], "header:\n{}", header.join("\n"));
    // The checked copy: each member's check, then the base (x7 = r1) from its clamped
    // address.
    for off in [0xc, 0x17, 0x1a, 0x1e, 0x22] {
        let clamp = format!("sub x7, x9, #0x{off:x}");
        assert!(all.contains(&clamp), "{clamp} missing:\n{}", all.join("\n"));
    }
}

#[test]
fn callx_dispatches_through_a_table_when_ids_are_dense() {
    // Six helpers, ids 1..=7 without 4 (a hole): bound, address, test for a hole, call.
    let hs = packjit_testkit::inline_cases::dense_callx_helpers(HELPER_ADDR);
    let out = emit_program(&prog(&[ins(0x8d, 3, 0, 0, 0), EXIT]), &hs, 0).unwrap();
    let d = disasm(&out.bytes[..0x48]);
    assert_eq!(
        d[9..],
        [
            "cmp x2, #0x8",
            "b.cs 0x38",
            "adr x11, 0x48",
            "ldr x11, [x11, x2, lsl #3]",
            "cbnz x11, 0x88",
            // An unknown id: the stop, with the id as the address.
            "mov x9, x2",
            "mov x16, #0x3",
            "mov x15, #0x0",
            "b 0xa0",
        ],
        "{d:#?}"
    );
    // The table after the stop's branch: 8-byte aligned data, 0 for the ids without a
    // helper, not counted as instructions. The call follows it.
    assert_eq!(
        out.bytes[0x48..0x88],
        packjit_testkit::inline_cases::dense_callx_table(HELPER_ADDR)
    );
    assert_eq!(disasm(&out.bytes[0x88..0x90]), ["blr x11", "mov x7, x0"]);
    assert_eq!(out.native_insns * 4, out.bytes.len() - 64);
}

/// A check group reaching below its base (clang's byte run off an advanced pointer,
/// `ranges::GROUP_BELOW`): one widened test of `[r5 - 3, r5 + 5)` against the context, then
/// the Spectre clamp selects on `r5 - 3`, so a mispredicted test leaves the base at 3 (not
/// 0) and both members in the never-mapped first page; the members load unchecked.
#[test]
fn group_below_its_base_clamps_the_base_to_minus_lo() {
    let code = prog(&[
        ins(0xbf, 5, 2, 0, 0),
        ins(0x57, 5, 0, 0, 15),
        ins(0x0f, 5, 1, 0, 0),
        ins(0x07, 5, 0, 0, 3),
        ins(0x71, 6, 5, -3, 0),
        ins(0x71, 7, 5, 4, 0),
        ins(0x0f, 6, 7, 0, 0),
        ins(0xbf, 0, 6, 0, 0),
        EXIT,
    ]);
    let out = packjit_arm64::emit_request(&CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: packjit_plugin_api::PJ_COMPILE_SANDBOX,
        blind_key: 0,
    })
    .unwrap();
    let d = disasm(&out.bytes);
    let at = d.iter().position(|l| l.starts_with("sub x9, ")).unwrap();
    let mut got: Vec<&str> = d[at..at + 10].iter().map(|s| s.as_str()).collect();
    assert!(got[4].starts_with("b.cc "), "{d:#?}");
    got[4] = "b.cc cold";
    assert_eq!(
        got,
        [
            "sub x9, x4, #0x3",
            "sub x14, x9, x23",
            "subs x14, x24, x14",
            "ccmp x14, #0x8, #0x0, cs",
            "b.cc cold",
            "csel x4, x9, xzr, cs",
            "add x4, x4, #0x3",
            "ldurb w19, [x4, #-3]",
            "ldrb w20, [x4, #4]",
            "add x19, x19, x20",
        ],
        "{d:#?}"
    );
}

/// The clamp no functional test can see on an index-bounded context access
/// (`packjit_frontend::indexes`): `words`' loop, `r3 = *(u8 *)(r1 + r4)` with `r4 < r2` on
/// every path, re-tests the index against the length branch-free and selects a harmless
/// address before the load.
#[test]
fn index_bounded_access_clamps_its_address() {
    use packjit_frontend::encode_insn as ins;
    let code = [
        ins(0xb7, 0, 0, 0, 0),  // r0 = 0
        ins(0xb7, 4, 0, 0, 0),  // r4 = 0
        ins(0x15, 2, 0, 7, 0),  // if r2 == 0 goto out
        ins(0x05, 0, 0, 5, 0),  // goto test
        ins(0xbf, 5, 1, 0, 0),  // head: r5 = r1
        ins(0x0f, 5, 4, 0, 0),  // r5 += r4
        ins(0x71, 3, 5, 0, 0),  // r3 = *(u8 *)(r5 + 0)
        ins(0x0f, 0, 3, 0, 0),  // r0 += r3
        ins(0x07, 4, 0, 0, 1),  // r4 += 1
        ins(0xad, 4, 2, -6, 0), // test: if r4 < r2 goto head
        ins(0x95, 0, 0, 0, 0),  // out: exit
    ]
    .concat();
    let out = packjit_arm64::emit_request(&packjit_plugin_api::CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: packjit_plugin_api::abi::PJ_COMPILE_SANDBOX,
        blind_key: 1,
    })
    .unwrap();
    let got = disasm(&out.bytes);
    let want: &[&str] = INDEX_CLAMP;
    assert!(
        got.windows(want.len()).any(|w| w == want),
        "no {want:?} in:\n{}",
        got.join("\n")
    );
}

/// `index_bounded_access_clamps_its_address`'s window: `r4 < len` (x24) re-tested, address 0
/// selected when it fails, the load through x9.
const INDEX_CLAMP: &[&str] = &["cmp x3, x24", "csel x9, x4, xzr, cc", "ldrb w2, [x9]"];
