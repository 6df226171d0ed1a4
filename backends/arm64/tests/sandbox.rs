//! The sandbox contract on arm64 (run under qemu-aarch64): every kind of escape stops cleanly
//! with the right kind, pc, address and access; in-bounds accesses to the context, the stack
//! block and host regions work; the budget stops loops at the jump; the conformance suite
//! passes sandboxed. Programs run through the local executor in `common::exec`, which passes
//! a `PjExecEnv` as the entry's third argument.
#![cfg(target_arch = "aarch64")]

mod common;

use common::exec::run_req;
use common::*;
use packjit_arm64::{emit_request, FEATURE_LSE};
use packjit_plugin_api::abi::*;
use packjit_plugin_api::{CompileRequest, HelperEntry};

const SANDBOX: u32 = PJ_COMPILE_SANDBOX;
const ALL: u32 = PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS;
/// Every sandboxed mode the stops must hold in, with both atomics paths.
const MODES: [(u32, u64); 4] = [
    (SANDBOX, 0),
    (SANDBOX, FEATURE_LSE),
    (ALL, 0),
    (SANDBOX | PJ_COMPILE_BLIND_CONSTANTS, FEATURE_LSE),
];

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok(u64),
    /// kind, pc, addr, access
    Stop(u32, u64, u64, u32),
}

fn run_mode(
    insns: &[[u8; 8]],
    flags: u32,
    features: u64,
    helpers: &[HelperEntry],
    mem: &mut [u8],
    regions: &[PjMemRegion],
    budget: u64,
) -> (Outcome, PjExecEnv) {
    let code = prog(insns);
    let req = CompileRequest {
        code: &code,
        helpers,
        features,
        flags,
        blind_key: 0x5eed_0000_1234_abcd,
    };
    let (r0, env) = run_req(&req, mem, regions, budget);
    let out = if env.stop_kind == PJ_STOP_NONE {
        Outcome::Ok(r0)
    } else {
        Outcome::Stop(env.stop_kind, env.stop_pc, env.stop_addr, env.stop_access)
    };
    (out, env)
}

/// Runs in every sandboxed mode and checks they agree; returns the outcome.
fn run(insns: &[[u8; 8]], mem: &mut [u8], regions: &[PjMemRegion]) -> Outcome {
    let snapshot = mem.to_vec();
    let mut first = None;
    for (flags, f) in MODES {
        mem.copy_from_slice(&snapshot);
        let (o, env) = run_mode(insns, flags, f, &[], mem, regions, u64::MAX);
        assert_eq!(
            env.stack_end - env.stack_start,
            packjit_frontend::analysis::stack_block_size(
                &packjit_frontend::decode(&prog(insns), &[]).unwrap()
            ) as u64,
            "the prologue writes the stack block bounds"
        );
        match &first {
            None => first = Some((o, mem.to_vec())),
            Some((want, m)) => {
                assert_eq!(&o, want, "mode flags {flags:#x} features {f:#x}");
                assert_eq!(&mem[..], &m[..], "memory differs in mode {flags:#x}");
            }
        }
    }
    first.unwrap().0
}

fn oob(pc: u64, addr: u64, size: u32, write: bool) -> Outcome {
    Outcome::Stop(
        PJ_STOP_OUT_OF_BOUNDS,
        pc,
        addr,
        size | if write { PJ_ACCESS_WRITE } else { 0 },
    )
}

fn ldx(size: u8, dst: u8, src: u8, off: i16) -> [u8; 8] {
    ins(0x61 | size, dst, src, off, 0)
}
fn stx(size: u8, dst: u8, src: u8, off: i16) -> [u8; 8] {
    ins(0x63 | size, dst, src, off, 0)
}
fn st(size: u8, dst: u8, off: i16, imm: i32) -> [u8; 8] {
    ins(0x62 | size, dst, 0, off, imm)
}
fn mov(dst: u8, imm: i32) -> [u8; 8] {
    ins(0xb7, dst, 0, 0, imm)
}
fn movr(dst: u8, src: u8) -> [u8; 8] {
    ins(0xbf, dst, src, 0, 0)
}
fn addi(dst: u8, imm: i32) -> [u8; 8] {
    ins(0x07, dst, 0, 0, imm)
}
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const DW: u8 = 0x18;

#[test]
fn context_reads_and_writes_in_bounds_and_just_past_the_end() {
    let mut mem = [0u8; 16];
    for (i, b) in mem.iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    let base = mem.as_ptr() as u64;
    // Last 8 bytes, last byte, a 4-byte write at the end: all in bounds.
    let p = [ldx(DW, 0, 1, 8), ldx(B, 2, 1, 15), stx(W, 1, 2, 12), EXIT];
    assert_eq!(run(&p, &mut mem, &[]), Outcome::Ok(0x100f_0e0d_0c0b_0a09));
    assert_eq!(mem[12..16], [16, 0, 0, 0]);
    // One byte past: each size, read and write, and just below the start.
    for (size, n) in [(B, 1u32), (H, 2), (W, 4), (DW, 8)] {
        let off = 17 - n as i16;
        let p = [mov(0, 0), ldx(size, 0, 1, off), EXIT];
        assert_eq!(
            run(&p, &mut mem, &[]),
            oob(1, base + off as u64, n, false),
            "read {n}"
        );
        let p = [mov(0, 0), stx(size, 1, 0, off), EXIT];
        assert_eq!(
            run(&p, &mut mem, &[]),
            oob(1, base + off as u64, n, true),
            "write {n}"
        );
        let p = [mov(0, 0), st(size, 1, -1, 7), EXIT];
        assert_eq!(
            run(&p, &mut mem, &[]),
            oob(1, base - 1, n, true),
            "store below {n}"
        );
    }
    // The write that failed touched nothing.
    assert_eq!(mem[12..16], [16, 0, 0, 0]);
    // An empty context allows nothing, not even at its (dangling) start.
    let p = [mov(0, 0), ldx(B, 0, 1, 0), EXIT];
    let mut empty: [u8; 0] = [];
    let start = empty.as_ptr() as u64;
    assert_eq!(run(&p, &mut empty, &[]), oob(1, start, 1, false));
}

#[test]
fn wild_null_and_wrapping_pointers_stop() {
    let mut mem = [0u8; 8];
    for (ptr, what) in [
        (0u64, "null"),
        (0x0000_dead_beef_0000, "wild"),
        (u64::MAX - 3, "wraps past 2^64"),
        (0x8000_0000_0000_0000, "sign bit"),
    ] {
        let mut p = lddw(3, ptr);
        p.extend([mov(0, 0), ldx(DW, 0, 3, 0), EXIT]);
        assert_eq!(run(&p, &mut mem, &[]), oob(3, ptr, 8, false), "{what}");
        let mut p = lddw(3, ptr);
        p.extend([mov(0, 0), st(W, 3, 2, 1), EXIT]);
        assert_eq!(
            run(&p, &mut mem, &[]),
            oob(3, ptr.wrapping_add(2), 4, true),
            "{what}"
        );
    }
}

#[test]
fn regions_read_only_and_writable() {
    let mut mem = [0u8; 8];
    let ro = [7u8; 32];
    let mut rw = [0u8; 16];
    let regions = [
        PjMemRegion {
            start: ro.as_ptr() as u64,
            len: ro.len() as u64,
            flags: 0,
        },
        PjMemRegion {
            start: rw.as_mut_ptr() as u64,
            len: rw.len() as u64,
            flags: PJ_REGION_WRITABLE,
        },
    ];
    let (ro_at, rw_at) = (ro.as_ptr() as u64, rw.as_ptr() as u64);
    // r3 = ro, r4 = rw: read the last byte of ro, write the last 8 bytes of rw.
    let mut p = lddw(3, ro_at);
    p.extend(lddw(4, rw_at));
    p.extend([ldx(B, 0, 3, 31), stx(DW, 4, 0, 8), ldx(B, 0, 4, 8), EXIT]);
    assert_eq!(run(&p, &mut mem, &regions), Outcome::Ok(7));
    assert_eq!(rw[8], 7);
    // Writing the read-only region is refused; reading past either region's end too.
    let mut p = lddw(3, ro_at);
    p.extend([mov(0, 1), stx(B, 3, 0, 0), EXIT]);
    assert_eq!(run(&p, &mut mem, &regions), oob(3, ro_at, 1, true));
    let mut p = lddw(3, ro_at);
    p.extend([mov(0, 0), ldx(H, 0, 3, 31), EXIT]);
    assert_eq!(run(&p, &mut mem, &regions), oob(3, ro_at + 31, 2, false));
    let mut p = lddw(4, rw_at);
    p.extend([mov(0, 0), stx(DW, 4, 0, 9), EXIT]);
    assert_eq!(run(&p, &mut mem, &regions), oob(3, rw_at + 9, 8, true));
    assert_eq!(ro, [7u8; 32]);
    // Without the regions registered the same read stops.
    let mut p = lddw(3, ro_at);
    p.extend([ldx(B, 0, 3, 0), EXIT]);
    assert_eq!(run(&p, &mut mem, &[]), oob(2, ro_at, 1, false));
}

#[test]
fn stack_block_through_pointers_and_walked_out() {
    let mut mem = [0u8; 8];
    // r1 = r10 - 16; *(u64 *)r1 = 5; r0 = *(u64 *)(r10 - 16) + *(u64 *)(r10 - 8) (zeroed)
    let p = [
        movr(1, 10),
        addi(1, -16),
        st(DW, 1, 0, 5),
        ldx(DW, 0, 10, -16),
        ldx(DW, 2, 10, -8),
        ins(0x0f, 0, 2, 0, 0),
        EXIT,
    ];
    assert_eq!(run(&p, &mut mem, &[]), Outcome::Ok(5));
    // r10 + 0 (one past the block) and r10 - 520 (below a one-frame block) stop; reading
    // through r10 itself with a constant offset outside the frame is checked too.
    let p = [movr(1, 10), mov(0, 0), stx(B, 1, 0, 0), EXIT];
    match run(&p, &mut mem, &[]) {
        Outcome::Stop(PJ_STOP_OUT_OF_BOUNDS, 2, _, 0x101) => {}
        o => panic!("{o:?}"),
    }
    let p = [
        movr(1, 10),
        addi(1, -520),
        mov(0, 0),
        ldx(DW, 0, 1, 0),
        EXIT,
    ];
    match run(&p, &mut mem, &[]) {
        Outcome::Stop(PJ_STOP_OUT_OF_BOUNDS, 3, _, 8) => {}
        o => panic!("{o:?}"),
    }
    let p = [mov(0, 0), ldx(DW, 0, 10, 8), EXIT];
    match run(&p, &mut mem, &[]) {
        Outcome::Stop(PJ_STOP_OUT_OF_BOUNDS, 1, _, 8) => {}
        o => panic!("{o:?}"),
    }
    // A callee writes through its caller's frame pointer (inside the block: allowed), and
    // its own frame is the 512 bytes below.
    // main: r1 = r10 - 8; call f; r0 = *(r10 - 8); exit
    // f:    *(u64 *)r1 = 42; *(r10 - 8) = 1; r2 = r10; r2 -= 1024; *(u8 *)r2 = 1 (below: stops)
    let p = [
        movr(1, 10),
        addi(1, -8),
        ins(0x85, 0, 1, 0, 2),
        ldx(DW, 0, 10, -8),
        EXIT,
        st(DW, 1, 0, 42),
        st(DW, 10, -8, 1),
        mov(0, 0),
        EXIT,
    ];
    assert_eq!(run(&p, &mut mem, &[]), Outcome::Ok(42));
    let p = [
        ins(0x85, 0, 1, 0, 1),
        EXIT,
        movr(2, 10),
        addi(2, -1024),
        mov(0, 0),
        st(B, 2, 0, 1),
        EXIT,
    ];
    match run(&p, &mut mem, &[]) {
        Outcome::Stop(PJ_STOP_OUT_OF_BOUNDS, 5, _, 0x101) => {}
        o => panic!("{o:?}"),
    }
}

#[test]
fn atomics_out_of_bounds_stop_as_writes() {
    let mut mem = [0u8; 16];
    let base = mem.as_ptr() as u64;
    for (opc, n) in [(0xdb, 8u32), (0xc3, 4)] {
        for imm in [0x00, 0x01, 0x51, 0xe1, 0xf1] {
            let p = [
                mov(0, 0),
                mov(2, 1),
                ins(opc, 1, 2, 16 - n as i16 + 1, imm),
                EXIT,
            ];
            assert_eq!(
                run(&p, &mut mem, &[]),
                oob(2, base + 17 - n as u64, n, true),
                "atomic {opc:#x} {imm:#x}"
            );
            // In bounds it works: add 1 at the last slot.
            let p = [
                mov(0, 0),
                mov(2, 1),
                ins(opc, 1, 2, 16 - n as i16, 0x00),
                EXIT,
            ];
            assert_eq!(run(&p, &mut mem, &[]), Outcome::Ok(0));
        }
    }
    assert_eq!(
        mem[8], 5,
        "five in-bounds adds of 1 on the 64-bit slot [8, 16)"
    );
    assert_eq!(mem[12], 5, "and five on the 32-bit slot [12, 16)");
}

#[test]
fn registers_start_at_zero_in_every_mode() {
    // r0 = r3 | r4 | r5 | r6 | r7 | r8 | r9 (r3 arrives holding the env pointer)
    let mut p = vec![movr(0, 3)];
    for r in 4..=9 {
        p.push(ins(0x4f, 0, r, 0, 0));
    }
    p.push(EXIT);
    let mut mem = [0u8; 4];
    for flags in [0, SANDBOX, ALL] {
        let (o, _) = run_mode(&p, flags, 0, &[], &mut mem, &[], u64::MAX);
        assert_eq!(o, Outcome::Ok(0), "flags {flags:#x}");
    }
}

#[test]
fn budget_stops_at_the_back_edge_with_the_budget_untouched() {
    let mut mem = [0u8; 4];
    // pc0: r0 = 0; pc1: r0 += 1; pc2: if r0 < 100 goto pc1; pc3: exit — 99 taken back-edges
    // charging 2 each.
    let p = [mov(0, 0), addi(0, 1), ins(0xa5, 0, 0, -2, 100), EXIT];
    for flags in [PJ_COMPILE_BUDGET, ALL] {
        let (o, env) = run_mode(&p, flags, 0, &[], &mut mem, &[], 1000);
        assert_eq!(o, Outcome::Ok(100));
        assert_eq!(env.budget, 1000 - 99 * 2);
        let (o, env) = run_mode(&p, flags, 0, &[], &mut mem, &[], 198);
        assert_eq!((o, env.budget), (Outcome::Ok(100), 0), "exactly enough");
        let (o, env) = run_mode(&p, flags, 0, &[], &mut mem, &[], 51);
        assert_eq!(o, Outcome::Stop(PJ_STOP_BUDGET, 2, 0, 0));
        assert_eq!(env.budget, 1, "the failing charge leaves the budget");
    }
    // An infinite loop (ja -1) stops; so does an infinite chain of local calls.
    let p = [mov(0, 0), ins(0x05, 0, 0, -1, 0), EXIT];
    let (o, env) = run_mode(&p, ALL, 0, &[], &mut mem, &[], 1_000_000);
    assert_eq!((o, env.budget), (Outcome::Stop(PJ_STOP_BUDGET, 1, 0, 0), 0));
    // main: loop { call f } ; f: exit — each iteration charges 1 (call) + 2 (back-edge).
    let p = [
        mov(0, 0),
        ins(0x85, 0, 1, 0, 2),
        ins(0x05, 0, 0, -2, 0),
        EXIT,
        EXIT,
    ];
    let (o, env) = run_mode(&p, PJ_COMPILE_BUDGET | SANDBOX, 0, &[], &mut mem, &[], 10);
    // 10 = call 1 + back-edge 2 + call 1 + back-edge 2 + call 1 + back-edge 2 + call 1: the
    // fourth back-edge (pc 2) finds 0 left.
    assert_eq!((o, env.budget), (Outcome::Stop(PJ_STOP_BUDGET, 2, 0, 0), 0));
}

#[test]
fn unknown_callx_stops_in_every_mode() {
    unsafe extern "C" fn seven(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        7
    }
    let h = [helper(3, seven as *const () as u64)];
    let mut mem = [0u8; 4];
    for flags in [0, SANDBOX, ALL] {
        let p = [mov(6, 3), ins(0x8d, 6, 0, 0, 0), EXIT];
        let (o, _) = run_mode(&p, flags, 0, &h, &mut mem, &[], u64::MAX);
        assert_eq!(o, Outcome::Ok(7));
        let p = [mov(6, 4), ins(0x8d, 6, 0, 0, 0), EXIT];
        let (o, _) = run_mode(&p, flags, 0, &h, &mut mem, &[], u64::MAX);
        assert_eq!(
            o,
            Outcome::Stop(PJ_STOP_UNKNOWN_CALLX, 1, 4, 0),
            "{flags:#x}"
        );
    }
}

#[test]
fn blinded_code_holds_no_program_immediate() {
    // Immediates chosen to be distinctive; every place an immediate can come from.
    let imms: [i32; 5] = [
        0x1234_5678,
        -0x2152_4111,
        0x7eed_beef,
        0x0bad_f00d,
        0x5151_5151,
    ];
    let mut p = vec![
        mov(0, imms[0]),
        addi(0, imms[1]),
        ins(0x15, 0, 0, 1, imms[2]),
        st(W, 1, 0, imms[3]),
    ];
    p.extend(lddw(2, (imms[4] as u32 as u64) << 32 | 0x1357_9bdf));
    p.push(EXIT);
    let code = prog(&p);
    let halves = |v: u32| [v & 0xffff, v >> 16];
    let imm16_fields = |bytes: &[u8]| -> Vec<u32> {
        // MOVZ/MOVN/MOVK (64- and 32-bit): bits 5..21 hold the halfword.
        bytes
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .filter(|w| w & 0x1f80_0000 == 0x1280_0000)
            .map(|w| (w >> 5) & 0xffff)
            .collect()
    };
    let all: Vec<u32> = imms
        .iter()
        .map(|&i| i as u32)
        .chain([0x1357_9bdf])
        .collect();
    let emit = |flags: u32, key: u64| {
        emit_request(&CompileRequest {
            code: &code,
            helpers: &[],
            features: 0,
            flags,
            blind_key: key,
        })
        .unwrap()
        .bytes
    };
    // Control: unblinded code does carry the halfwords (so the scan can fail).
    let plain = imm16_fields(&emit(SANDBOX, 0));
    assert!(all
        .iter()
        .any(|&v| halves(v).iter().all(|h| plain.contains(h))));
    for key in [1u64, 0xdead_beef_cafe_f00d, u64::MAX] {
        let bytes = emit(ALL, key);
        for v in &all {
            assert!(
                !bytes.windows(4).any(|w| w == v.to_le_bytes()),
                "immediate {v:#x} verbatim in the code (key {key:#x})"
            );
            let fields = imm16_fields(&bytes);
            assert!(
                !halves(*v).iter().all(|h| fields.contains(h)),
                "both halves of {v:#x} in MOV fields (key {key:#x})"
            );
        }
        // And the blinded code computes the same.
        let mut mem = [0u8; 8];
        let (o, _) = run_mode(&p, ALL, 0, &[], &mut mem, &[], u64::MAX);
        let mut mem2 = [0u8; 8];
        let (o2, _) = run_mode(&p, 0, 0, &[], &mut mem2, &[], u64::MAX);
        assert_eq!((o, mem), (o2, mem2));
    }
}

// ---------------------------------------------------------------- conformance, sandboxed

mod conformance {
    use super::*;
    use packjit_testkit::conformance::{load_suite, run_cases, suite_dir, Engine, Loaded};
    use packjit_testkit::reference::helper_identity;

    struct Sandboxed {
        flags: u32,
        features: u64,
        helpers: Vec<HelperEntry>,
    }

    struct Code(Vec<u8>);

    impl Engine for Sandboxed {
        fn label(&self) -> String {
            format!(
                "aarch64 local executor (flags {:#x}, features {:#x})",
                self.flags, self.features
            )
        }
        fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
            let out = emit_request(&CompileRequest {
                code,
                helpers: &self.helpers,
                features: self.features,
                flags: self.flags,
                blind_key: 0x0123_4567_89ab_cdef,
            })
            .map_err(|e| e.to_string())?;
            Ok(Box::new(Code(out.bytes.into_vec())))
        }
    }

    impl Loaded for Code {
        fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
            let (r0, env) = common::exec::run_env(&self.0, mem, &[], 1 << 40);
            Some(if env.stop_kind == PJ_STOP_NONE {
                Ok(r0)
            } else {
                Err(format!(
                    "stopped: kind {} pc {} addr {:#x} access {:#x}",
                    env.stop_kind, env.stop_pc, env.stop_addr, env.stop_access
                ))
            })
        }
    }

    #[test]
    fn suite_passes_sandboxed() {
        let cases = load_suite(&suite_dir()).expect("conformance suite");
        for (flags, features) in [(SANDBOX, 0), (ALL, FEATURE_LSE)] {
            let engine = Sandboxed {
                flags,
                features,
                helpers: vec![helper(5, helper_identity as *const () as u64)],
            };
            let s = run_cases(&engine, &cases, &[]);
            eprintln!("{s}");
            assert_eq!(s.failed, 0, "{}", s.report());
            assert!(s.passed >= 350, "{}", s.report());
        }
    }
}

#[test]
fn far_cold_paths_land_in_an_island_within_reach() {
    // A checked load and a back-edge charge at the start, then 1.1 MiB of code (beyond
    // B.cond's ±1 MiB): their out-of-line sides go in an island 128 KiB on
    // (`packjit_frontend::cold`), so the short forms reach them in one pass. (Long
    // B.cond forms, which a cold side no longer needs, are exercised in exec.rs.)
    let mut mem = [0u8; 8];
    let mut p = vec![
        mov(0, 0),
        ldx(DW, 2, 1, 8), // one past the context: stops at pc 1 through the far cold side
        ins(0x05, 0, 0, 1, 0),
    ];
    p.push(ins(0x05, 0, 0, -4, 0)); // pc 3: back-edge to pc 0 (never reached)
    p.extend(std::iter::repeat_n(lddw(3, 0x1234_5678_9abc_def0), 70_000).flatten());
    p.push(EXIT);
    let code = prog(&p);
    let out = emit_request(&CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: SANDBOX | PJ_COMPILE_BUDGET,
        blind_key: 0,
    })
    .unwrap();
    assert!(out.bytes.len() > 1 << 20, "{} bytes", out.bytes.len());
    assert_eq!((out.islands, out.passes), (1, 1));
    let (o, _) = run_mode(&p, SANDBOX | PJ_COMPILE_BUDGET, 0, &[], &mut mem, &[], 100);
    assert_eq!(o, oob(1, mem.as_ptr() as u64 + 8, 8, false));
    // A spin at pc 1 whose budget stop is emitted after the same 1.1 MiB.
    p[1] = ins(0x05, 0, 0, -1, 0);
    let (o, env) = run_mode(&p, SANDBOX | PJ_COMPILE_BUDGET, 0, &[], &mut mem, &[], 100);
    assert_eq!((o, env.budget), (Outcome::Stop(PJ_STOP_BUDGET, 1, 0, 0), 0));
}

#[test]
fn context_base_shortcut_only_where_the_base_is_the_context() {
    unsafe extern "C" fn zero(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        0
    }
    let mut mem = [5u8; 16];
    let base = mem.as_ptr() as u64;
    // r6 = r1 in the first block: the shortcut; the exact end still holds.
    let p = [movr(6, 1), ldx(DW, 0, 6, 8), EXIT];
    assert_eq!(run(&p, &mut mem, &[]), Outcome::Ok(0x0505_0505_0505_0505));
    let p = [movr(6, 1), mov(0, 0), ldx(B, 0, 6, 16), EXIT];
    assert_eq!(run(&p, &mut mem, &[]), oob(2, base + 16, 1, false));
    // r6 read (zero) before the copy: a null pointer, not the context.
    let p = [ldx(B, 0, 6, 0), movr(6, 1), EXIT];
    assert_eq!(run(&p, &mut mem, &[]), oob(0, 0, 1, false));
    // r1 after a helper call is what the helper left: sandboxed code may not read it (the
    // load is refused), so no shortcut can take it for the context.
    let h = [helper(1, zero as *const () as u64)];
    let p = [
        ins(0x85, 0, 0, 0, 1),
        movr(6, 1),
        mov(0, 0),
        ldx(B, 0, 6, 3),
        EXIT,
    ];
    for (flags, f) in MODES {
        let code = prog(&p);
        let req = CompileRequest {
            code: &code,
            helpers: &h,
            features: f,
            flags,
            blind_key: 1,
        };
        let e = emit_request(&req).unwrap_err();
        assert_eq!(e.pc, Some(1), "{flags:#x}: {e}");
        assert!(e.message.contains("r1 is read after a call"), "{e}");
    }
    // r1 changed later in the function: no shortcut for r1 anywhere.
    let p = [
        mov(0, 0),
        ldx(B, 0, 1, 15),
        addi(1, 8),
        ldx(B, 2, 1, 8),
        EXIT,
    ];
    assert_eq!(run(&p, &mut mem, &[]), oob(3, base + 16, 1, false));
}

// ------------------------------------------------- range analysis: proofs and check groups

/// A proven access (masked index into the frame) runs with no check, and a group of context
/// accesses off one base stops exactly where the reference does, with the stores before the
/// faulting access done, whichever member is the first out of bounds.
#[test]
fn grouped_and_proven_accesses_match_the_reference() {
    let seed = packjit_testkit::env_u64("PACKJIT_GROUP_SEED").unwrap_or(0x9e0u64);
    let count = packjit_testkit::env_u64("PACKJIT_GROUP_COUNT").unwrap_or(600);
    eprintln!("group differential: seeds {seed:#x}..{:#x}", seed + count);
    let (mut grouped, mut grouped_stops, mut proven) = (0, 0, 0);
    // Programs whose loop re-enters a group past its check.
    let mut reentered = 0u32;
    // Programs with a group reaching below its base (`ranges::GROUP_BELOW`).
    let mut below = 0u32;
    // Programs with a group a jump may leave early (`ranges::exits_early`).
    let mut early = 0u32;
    // Programs with a group left open across a proven access off another base, and
    // across one checked on its own (`ranges::keeps_group_open`).
    let (mut spanning, mut spanning_checked) = (0u32, 0u32);
    for s in seed..seed + count {
        let (code, len) = packjit_testkit::gen::group_program(s);
        let p: Vec<[u8; 8]> = code
            .chunks_exact(8)
            .map(|c| c.try_into().expect("8-byte slots"))
            .collect();
        let plan = packjit_frontend::ranges::plan_accesses(
            &packjit_frontend::decode(&prog(&p), &[]).unwrap(),
            true,
        );
        let has_group = !plan.groups.is_empty();
        grouped += has_group as u32;
        proven += plan
            .checks
            .contains(&packjit_frontend::ranges::AccessCheck::None) as u32;
        reentered += !plan.reentries.is_empty() as u32;
        below += plan.groups.iter().any(|g| g.lo < 0) as u32;
        let decoded = packjit_frontend::decode(&code, &[]).unwrap();
        early +=
            (plan.groups.iter()).any(|g| packjit_frontend::ranges::exits_early(&decoded, g)) as u32;
        let (across_proven, across_checked) = packjit_testkit::gen::group_spans(&plan);
        spanning += across_proven as u32;
        spanning_checked += across_checked as u32;
        let reference = packjit_testkit::reference::Reference::new();
        let mut want_mem: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        let want_base = want_mem.as_ptr() as u64;
        let want = reference.run(&prog(&p), &mut want_mem);
        for (flags, f) in MODES {
            let mut mem: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
            let base = mem.as_ptr() as u64;
            let (o, _) = run_mode(&p, flags, f, &[], &mut mem, &[], u64::MAX);
            let ctx_rel = |a: u64, b: u64| a.wrapping_sub(b);
            match (&want, o) {
                (Ok(w), Outcome::Ok(r0)) => assert_eq!(w.r0, r0, "seed {s:#x} flags {flags:#x}"),
                (
                    Err(packjit_testkit::reference::EvalError::Stop(
                        packjit_testkit::reference::Stop::OutOfBounds {
                            pc,
                            addr,
                            size,
                            write,
                        },
                    )),
                    Outcome::Stop(kind, jpc, jaddr, access),
                ) => {
                    assert_eq!(kind, PJ_STOP_OUT_OF_BOUNDS, "seed {s:#x}");
                    assert_eq!(*pc as u64, jpc, "seed {s:#x} flags {flags:#x}");
                    assert_eq!(
                        ctx_rel(*addr, want_base),
                        ctx_rel(jaddr, base),
                        "seed {s:#x} flags {flags:#x}"
                    );
                    assert_eq!(
                        *size | if *write { PJ_ACCESS_WRITE } else { 0 },
                        access,
                        "seed {s:#x}"
                    );
                }
                (w, o) => panic!("seed {s:#x} flags {flags:#x}: reference {w:?}, jit {o:?}"),
            }
            assert_eq!(
                mem, want_mem,
                "context differs: seed {s:#x} flags {flags:#x}"
            );
        }
        grouped_stops += (has_group && want.is_err()) as u32;
    }
    eprintln!("  {grouped} programs with check groups ({grouped_stops} of them stop, {reentered} re-enter one in a loop, {below} reach below their base, {early} may be left early, {spanning} stay open across a proven access, {spanning_checked} across a checked one), {proven} with proven accesses");
    // The generator must exercise what it is for.
    assert!(
        grouped > count as u32 / 3
            && reentered > count as u32 / 10
            && below > count as u32 / 20
            && early > count as u32 / 20
            && spanning > count as u32 / 20
            && spanning_checked > count as u32 / 20
            && grouped_stops > 20
            && proven > 20
    );
}

/// A check group far into the context (its end beyond CMP's 12-bit immediate) and one with a
/// span beyond CCMP's 5-bit immediate: in bounds they run; cut short, they stop at the first
/// faulting member, with the store before it done.
#[test]
fn wide_and_far_check_groups_stop_exactly() {
    // r6 = r1 + 4090 ; *(u8 *)(r6 + 0) = 7 ; r0 = *(u64 *)(r6 + 8) ; r2 = *(u8 *)(r6 + 40) ;
    // r0 += r2 ; exit
    let p = [
        movr(6, 1),
        addi(6, 4090),
        st(B, 6, 0, 7),
        ldx(DW, 0, 6, 8),
        ldx(B, 2, 6, 40),
        ins(0x0f, 0, 2, 0, 0),
        EXIT,
    ];
    let mut mem = vec![1u8; 4131];
    assert_eq!(
        run(&p, &mut mem, &[]),
        Outcome::Ok(0x0101_0101_0101_0101 + 1)
    );
    assert_eq!(mem[4090], 7);
    let mut mem = vec![1u8; 4130];
    let base = mem.as_ptr() as u64;
    assert_eq!(run(&p, &mut mem, &[]), oob(4, base + 4130, 1, false));
    assert_eq!(mem[4090], 7, "the store before the faulting load ran");
    let mut mem = vec![1u8; 4100];
    let base = mem.as_ptr() as u64;
    assert_eq!(run(&p, &mut mem, &[]), oob(3, base + 4098, 8, false));
    // The same shape off a pointer at an unknown offset into the context (the group tests
    // the context's general range, span 41 > 31).
    let q = [
        movr(6, 2),
        ins(0x57, 6, 0, 0, 1), // r6 = len & 1
        ins(0x0f, 6, 1, 0, 0), // r6 += r1
        st(B, 6, 0, 7),
        ldx(DW, 0, 6, 8),
        ldx(B, 2, 6, 40),
        ins(0x0f, 0, 2, 0, 0),
        EXIT,
    ];
    let mut mem = vec![1u8; 42]; // r6 = ctx + 0: everything fits
    assert_eq!(
        run(&q, &mut mem, &[]),
        Outcome::Ok(0x0101_0101_0101_0101 + 1)
    );
    let mut mem = vec![1u8; 41]; // r6 = ctx + 1: the byte at 41 is one past the end
    let base = mem.as_ptr() as u64;
    assert_eq!(run(&q, &mut mem, &[]), oob(5, base + 41, 1, false));
    assert_eq!(mem[1], 7);
}
