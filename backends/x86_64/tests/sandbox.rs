//! The sandbox contract, natively: the conformance suite under every compile mode, escapes
//! that must stop with kind + pc (+ address and access), the budget, and constant blinding.
#![cfg(target_arch = "x86_64")]

mod common;

use common::*;
use packjit_plugin_api::abi::*;
use packjit_testkit::conformance::{load_suite, run_cases, suite_dir};
use packjit_x86_64::{FEATURE_BMI2, FEATURE_MOVBE, SUPPORTED_FEATURES};

const SANDBOX: u32 = PJ_COMPILE_SANDBOX;
const ALL: u32 = PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS;

fn suite(flags: u32, features: u64) {
    let jit = Jit::new(flags, features);
    let cases = load_suite(&suite_dir()).expect("suite");
    let s = run_cases(&jit, &cases, &[]);
    packjit_testkit::report(&s.to_string());
    assert_eq!(s.failed, 0, "{}", s.report());
    assert_eq!(s.compile_only, 0);
    assert_eq!(s.passed, 358, "{}", s.report());
}

#[test]
fn conformance_sandboxed_without_features() {
    suite(SANDBOX, 0);
}

#[test]
fn conformance_sandboxed_each_feature() {
    suite(SANDBOX, FEATURE_BMI2);
    suite(SANDBOX, FEATURE_MOVBE);
    suite(SANDBOX, SUPPORTED_FEATURES);
}

#[test]
fn conformance_budget_and_blinding() {
    suite(PJ_COMPILE_BUDGET, 0);
    suite(PJ_COMPILE_BLIND_CONSTANTS, SUPPORTED_FEATURES);
    suite(ALL, 0);
    suite(ALL, SUPPORTED_FEATURES);
}

/// Runs `src` sandboxed on `mem`; returns the outcome.
fn run_with(jit: &Jit, src: &str, mem: &mut [u8]) -> Outcome {
    let code = jit.compile(&asm(src)).expect("compiles");
    code.run(mem)
}

fn stop(o: &Outcome) -> (u32, u64, u64, u32) {
    o.result().expect_err("must stop")
}

#[test]
fn reads_and_writes_inside_the_context_pass() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let o = run_with(
        &jit,
        "ldxdw %r0, [%r1+0]\nstxb [%r1+7], %r0\nldxb %r2, [%r1+7]\nadd %r0, %r2\nexit",
        &mut mem,
    );
    assert_eq!(o.result(), Ok(0x0807_0605_0403_0201 + 1));
    assert_eq!(mem[7], 1);
}

#[test]
fn read_past_the_context_end_stops_with_address_and_size() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [0u8; 16];
    let base = mem.as_ptr() as u64;
    // The last byte is fine, a 2-byte read of it is not.
    let o = run_with(
        &jit,
        "ldxb %r0, [%r1+15]\nldxh %r0, [%r1+15]\nexit",
        &mut mem,
    );
    assert_eq!(stop(&o), (PJ_STOP_OUT_OF_BOUNDS, 1, base + 15, 2));
    // Below the start.
    let o = run_with(&jit, "mov %r0, 0\nldxb %r0, [%r1-1]\nexit", &mut mem);
    assert_eq!(stop(&o), (PJ_STOP_OUT_OF_BOUNDS, 1, base - 1, 1));
}

/// A host that leaves `env.ctx_len` 0 (as a zeroed `PjExecEnv` has it) gets the same
/// results and the same stops, through the full check, which reads the bounds
/// themselves: every context test form (one byte off an unknown base, a constant offset,
/// a widened group, a multi-byte access) fails inline and passes out of line.
#[test]
fn a_zero_ctx_len_only_sends_context_accesses_to_the_full_check() {
    let jit = Jit::new(SANDBOX, 0);
    let src = "ldxb %r3, [%r1+0]
and %r3, 3
mov %r4, %r1
add %r4, %r3
               ldxb %r0, [%r4+1]
ldxh %r5, [%r4+2]
add %r0, %r5
               ldxb %r5, [%r4+4]
ldxb %r6, [%r4+5]
add %r5, %r6
add %r0, %r5
               ldxw %r5, [%r1+8]
add %r0, %r5
exit";
    let code = jit.compile(&asm(src)).expect("compiles");
    let fresh = || [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    let (mut a, mut b) = (fresh(), fresh());
    let want = code.run(&mut a);
    let got = code.run_with_ctx_len(&mut b, 0);
    assert_eq!(want.result(), Ok(3 + (5 << 8 | 4) + 6 + 7 + 0x0c0b_0a09));
    assert_eq!(got.result(), want.result());
    // Past the end: the same stop either way (pc 12, the 4-byte read at 11).
    let code = jit
        .compile(&asm("ldxw %r0, [%r1+11]
exit"))
        .expect("compiles");
    let (mut a, mut b) = (fresh(), fresh());
    let base = a.as_ptr() as u64;
    let want = code.run(&mut a);
    assert_eq!(stop(&want), (PJ_STOP_OUT_OF_BOUNDS, 0, base + 11, 4));
    let got = code.run_with_ctx_len(&mut b, 0);
    assert_eq!(
        stop(&got),
        (PJ_STOP_OUT_OF_BOUNDS, 0, b.as_ptr() as u64 + 11, 4)
    );
}

#[test]
fn wild_null_and_wrapping_addresses_stop() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [0u8; 8];
    let o = run_with(
        &jit,
        "lddw %r2, 0xdead0000beef\nldxw %r0, [%r2+4]\nexit",
        &mut mem,
    );
    assert_eq!(stop(&o), (PJ_STOP_OUT_OF_BOUNDS, 2, 0xdead_0000_bef3, 4));
    let o = run_with(&jit, "mov %r2, 0\nstxdw [%r2+0], %r1\nexit", &mut mem);
    assert_eq!(stop(&o), (PJ_STOP_OUT_OF_BOUNDS, 1, 0, 8 | WRITE));
    // An address 4 bytes below 2^64: addr + size wraps to a small number.
    let o = run_with(&jit, "mov %r2, -4\nldxdw %r0, [%r2+0]\nexit", &mut mem);
    assert_eq!(stop(&o), (PJ_STOP_OUT_OF_BOUNDS, 1, u64::MAX - 3, 8));
}

#[test]
fn stack_is_zeroed_and_walking_out_of_it_stops() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [0u8; 8];
    // Unwritten stack reads as zero; r3–r9 start at zero.
    let o = run_with(
        &jit,
        "ldxdw %r0, [%r10-512]\nor %r0, %r3\nor %r0, %r6\nor %r0, %r9\nexit",
        &mut mem,
    );
    assert_eq!(o.result(), Ok(0));
    assert_eq!(o.env.stack_end - o.env.stack_start, 512);
    // A copy of r10 is checked: the frame is fine, one byte above or below is not.
    let o = run_with(
        &jit,
        "mov %r2, %r10\nstxdw [%r2-8], %r2\nldxb %r0, [%r2-512]\nldxb %r0, [%r2+0]\nexit",
        &mut mem,
    );
    let (kind, pc, addr, acc) = stop(&o);
    assert_eq!((kind, pc, acc), (PJ_STOP_OUT_OF_BOUNDS, 3, 1));
    assert_eq!(addr, o.env.stack_end);
    let o = run_with(&jit, "mov %r2, %r10\nldxb %r0, [%r2-513]\nexit", &mut mem);
    assert_eq!(stop(&o).1, 1);
    assert_eq!(stop(&o).2, o.env.stack_start - 1);
}

#[test]
fn a_callee_frame_is_part_of_the_block() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [0u8; 8];
    // The callee writes through a pointer into its caller's frame (r1 = caller r10 - 8),
    // then reads below its own frame (outside the 2-frame block).
    let src = "mov %r1, %r10\nadd %r1, -8\ncall local f\nldxdw %r0, [%r10-8]\nexit\n\
               f:\nstdw [%r1+0], 42\nmov %r2, %r10\nldxb %r3, [%r2-512]\nmov %r0, 0\nldxb %r3, [%r2-513]\nexit";
    let o = run_with(&jit, src, &mut mem);
    assert_eq!(o.env.stack_end - o.env.stack_start, 1024);
    let (kind, pc, addr, _) = stop(&o);
    assert_eq!((kind, pc), (PJ_STOP_OUT_OF_BOUNDS, 9));
    assert_eq!(addr, o.env.stack_start - 1);
    let ok = "mov %r1, %r10\nadd %r1, -8\ncall local f\nldxdw %r0, [%r10-8]\nexit\n\
              f:\nstdw [%r1+0], 42\nexit";
    assert_eq!(run_with(&jit, ok, &mut mem).result(), Ok(42));
}

#[test]
fn host_regions_read_only_and_writable() {
    let mut jit = Jit::new(SANDBOX, 0);
    let ro = vec![7u8; 32];
    let mut rw = vec![0u8; 16];
    jit.regions = vec![
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
    let (ro_a, rw_a) = (ro.as_ptr() as u64, rw.as_ptr() as u64);
    let mut mem = [0u8; 4];
    let read_ro = format!("lddw %r2, {ro_a:#x}\nldxdw %r0, [%r2+24]\nexit");
    assert_eq!(
        run_with(&jit, &read_ro, &mut mem).result(),
        Ok(0x0707_0707_0707_0707)
    );
    let write_ro = format!("lddw %r2, {ro_a:#x}\nstb [%r2+0], 1\nexit");
    assert_eq!(
        stop(&run_with(&jit, &write_ro, &mut mem)),
        (PJ_STOP_OUT_OF_BOUNDS, 2, ro_a, 1 | WRITE)
    );
    let past_ro = format!("lddw %r2, {ro_a:#x}\nldxdw %r0, [%r2+25]\nexit");
    assert_eq!(
        stop(&run_with(&jit, &past_ro, &mut mem)),
        (PJ_STOP_OUT_OF_BOUNDS, 2, ro_a + 25, 8)
    );
    let write_rw = format!("lddw %r2, {rw_a:#x}\nstdw [%r2+8], 99\nldxdw %r0, [%r2+8]\nexit");
    assert_eq!(run_with(&jit, &write_rw, &mut mem).result(), Ok(99));
    assert_eq!(rw[8], 99);
    assert_eq!(ro, vec![7u8; 32], "the read-only region was not written");
}

#[test]
fn atomics_are_checked_as_writes() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [0u8; 12];
    let base = mem.as_ptr() as u64;
    let o = run_with(
        &jit,
        "mov %r2, 5\nlock add32 [%r1+8], %r2\nlock fetch or [%r1+8], %r2\nexit",
        &mut mem,
    );
    // The 4-byte add fits, the 8-byte fetch-or at the same address does not.
    assert_eq!(stop(&o), (PJ_STOP_OUT_OF_BOUNDS, 2, base + 8, 8 | WRITE));
    assert_eq!(
        &mem[8..],
        &[5, 0, 0, 0],
        "the in-bounds atomic ran, the refused one did not"
    );
}

#[test]
fn budget_stops_an_infinite_loop_at_its_back_edge() {
    let mut jit = Jit::new(PJ_COMPILE_BUDGET, 0);
    jit.budget = 1000;
    let mut mem = [0u8; 1];
    // pc 1 -> pc 0 charges 2 per iteration: 500 iterations, then the 501st charge fails.
    let o = run_with(&jit, "add %r0, 1\nja -2\nexit", &mut mem);
    assert_eq!(stop(&o).0, PJ_STOP_BUDGET);
    assert_eq!(stop(&o).1, 1);
    assert_eq!(o.env.budget, 0);
    // The failing charge is taken back: with one more, the stop leaves it.
    jit.budget = 1001;
    let o = run_with(&jit, "add %r0, 1\nja -2\nexit", &mut mem);
    assert_eq!((stop(&o).0, stop(&o).1), (PJ_STOP_BUDGET, 1));
    assert_eq!(o.env.budget, 1);
    jit.budget = 1000;
    // A bounded loop within budget returns normally with the rest of the budget left.
    let o = run_with(
        &jit,
        "mov %r0, 0\nl:\nadd %r0, 1\njlt %r0, 10, l\nexit",
        &mut mem,
    );
    assert_eq!(o.result(), Ok(10));
    assert_eq!(o.env.budget, 1000 - 9 * 2);
    // Calls charge 1 each.
    jit.budget = 2;
    let calls = "call local f\ncall local f\ncall local f\nexit\nf:\nexit";
    let o = run_with(&jit, calls, &mut mem);
    assert_eq!(stop(&o).0, PJ_STOP_BUDGET);
    assert_eq!(stop(&o).1, 2);
    assert_eq!(o.env.budget, 0);
}

#[test]
fn unknown_callx_stops_in_every_mode() {
    for flags in [0, SANDBOX, ALL] {
        let jit = Jit::new(flags, 0);
        let mut mem = [0u8; 1];
        let o = run_with(
            &jit,
            "mov %r1, 3\nmov %r6, 5\ncall %r6\nmov %r7, 77\ncall %r7\nexit",
            &mut mem,
        );
        let (kind, pc, addr, _) = stop(&o);
        assert_eq!(
            (kind, pc, addr),
            (PJ_STOP_UNKNOWN_CALLX, 4, 77),
            "flags {flags:#x}"
        );
        // And from inside a callee (the unwind skips its frame).
        let o = run_with(
            &jit,
            "mov %r6, 1\ncall local f\nexit\nf:\nmov %r7, 9\ncall %r7\nexit",
            &mut mem,
        );
        assert_eq!(stop(&o).0, PJ_STOP_UNKNOWN_CALLX);
        assert_eq!(stop(&o).1, 4);
    }
}

/// The 4-byte patterns of a program's distinctive 32-bit immediates (at least three non-zero
/// bytes, not all-ones: smaller patterns occur by chance in any code).
fn distinctive_imms(code: &[u8]) -> Vec<[u8; 4]> {
    code.chunks(8)
        .flat_map(|s| [[s[4], s[5], s[6], s[7]]])
        .filter(|b| b.iter().filter(|&&x| x != 0).count() >= 3 && *b != [0xff; 4])
        .collect()
}

#[test]
fn blinded_code_contains_no_program_immediate() {
    let src = "mov %r0, 0x12345678\nadd %r0, 0x2badcafe\nlddw %r2, 0x1337beef0badf00d\n\
               xor %r0, %r2\njeq %r0, 0x7eadbeef, +1\nstw [%r10-4], 0x41424344\n\
               mul32 %r0, 0x13572468\nexit";
    let code = asm(src);
    let imms = distinctive_imms(&code);
    assert!(imms.len() >= 7, "{imms:?}");
    let plain = Jit::new(SANDBOX, 0);
    let plain_bytes = plain.compile(&code).unwrap().bytes();
    let found = |bytes: &[u8], imm: &[u8; 4]| bytes.windows(4).any(|w| w == imm);
    assert!(
        imms.iter().all(|i| found(&plain_bytes, i)),
        "control: plain code has them"
    );
    let blind = Jit::new(SANDBOX | PJ_COMPILE_BLIND_CONSTANTS, 0);
    let c = blind.compile(&code).unwrap();
    let bytes = c.bytes();
    for i in &imms {
        assert!(
            !found(&bytes, i),
            "immediate {i:02x?} appears in blinded code"
        );
    }
    let mut mem = [0u8; 1];
    assert_eq!(
        c.run(&mut mem).result(),
        plain.compile(&code).unwrap().run(&mut mem).result()
    );
}

#[test]
fn blinded_suite_programs_hide_their_immediates() {
    let jit = Jit::new(ALL, SUPPORTED_FEATURES);
    let cases = load_suite(&suite_dir()).expect("suite");
    let mut scanned = 0;
    for c in &cases {
        let Ok(code) = &c.program else { continue };
        let Ok(compiled) = jit.compile(code) else {
            continue;
        };
        let bytes = compiled.bytes();
        for imm in distinctive_imms(code) {
            assert!(
                !bytes.windows(4).any(|w| w == imm),
                "{}: immediate {imm:02x?} appears in blinded code",
                c.name
            );
            scanned += 1;
        }
    }
    assert!(scanned > 100, "only {scanned} immediates scanned");
}

// ---- range analysis: proofs and check groups -------------------------------------------------

/// Proven accesses (a masked index into the frame) run unchecked, and a group of context
/// accesses off one base stops exactly where the reference does, with the stores before
/// the faulting access done, whichever member is the first out of bounds.
#[test]
fn grouped_and_proven_accesses_match_the_reference() {
    use packjit_testkit::reference::{EvalError, Reference, Stop};
    let seed = packjit_testkit::env_u64("PACKJIT_GROUP_SEED").unwrap_or(0x9e0u64);
    let count = packjit_testkit::env_u64("PACKJIT_GROUP_COUNT").unwrap_or(3000);
    eprintln!("group differential: seeds {seed:#x}..{:#x}", seed + count);
    let jits = [
        Jit::new(SANDBOX, 0),
        Jit::new(SANDBOX, SUPPORTED_FEATURES),
        Jit::new(ALL, SUPPORTED_FEATURES),
    ];
    let (mut grouped, mut grouped_stops, mut proven) = (0u32, 0u32, 0u32);
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
        let plan = packjit_frontend::ranges::plan_accesses(
            &packjit_frontend::decode(&code, &[]).unwrap(),
            true,
        );
        grouped += !plan.groups.is_empty() as u32;
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
        let init: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        let mut want_mem = init.clone();
        let want_base = want_mem.as_ptr() as u64;
        let want = Reference::new().run(&code, &mut want_mem);
        grouped_stops += (!plan.groups.is_empty() && want.is_err()) as u32;
        for jit in &jits {
            let mut m = init.clone();
            let base = m.as_ptr() as u64;
            let o = jit.compile(&code).expect("compiles").run(&mut m);
            let label = format!("seed {s:#x} flags {:#x}", jit.flags);
            match (&want, o.result()) {
                (Ok(w), Ok(r0)) => assert_eq!(w.r0, r0, "{label}"),
                (
                    Err(EvalError::Stop(Stop::OutOfBounds {
                        pc,
                        addr,
                        size,
                        write,
                    })),
                    Err((kind, jpc, jaddr, access)),
                ) => {
                    assert_eq!((kind, jpc), (PJ_STOP_OUT_OF_BOUNDS, *pc as u64), "{label}");
                    assert_eq!(
                        addr.wrapping_sub(want_base),
                        jaddr.wrapping_sub(base),
                        "{label}"
                    );
                    assert_eq!(
                        *size | if *write { PJ_ACCESS_WRITE } else { 0 },
                        access,
                        "{label}"
                    );
                }
                (w, o) => panic!("{label}: reference {w:?}, jit {o:?}"),
            }
            assert_eq!(m, want_mem, "context differs: {label}");
        }
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
            && grouped_stops > 100
            && proven > 100
    );
}

/// Regression (differential seed 0x5eed2cee, escapes): a fetch-or through r0 = r10 - 256 is
/// proven inside the frame, so it has no check and its address is r0 itself, which the
/// cmpxchg loop (rax = r0) must not lose.
#[test]
fn proven_fetch_or_through_r0_keeps_its_address() {
    let jit = Jit::new(SANDBOX, 0);
    let mut mem = [0u8; 8];
    let o = run_with(
        &jit,
        "mov %r0, %r10\nadd %r0, -256\nstdw [%r10-256], 5\nmov %r2, 2\n\
         lock fetch or [%r0+0], %r2\nldxdw %r0, [%r10-256]\nadd %r0, %r2\nexit",
        &mut mem,
    );
    assert_eq!(o.result(), Ok(7 + 5));
}

/// A group of context accesses whose span is past the `imm8` of x86-64's widened test is
/// checked member by member (`encodes_group`): the member past the end still stops at its
/// pc with its address, and the members inside pass.
#[test]
fn a_group_wider_than_a_byte_tests_its_whole_span() {
    let jit = Jit::new(SANDBOX, 0);
    for (span_off, len) in [(256i32, 64usize), (200, 64), (127, 128), (300, 400)] {
        let mut mem = vec![7u8; len];
        let base = mem.as_ptr() as u64;
        let src = format!(
            "mov %r6, %r2\nand %r6, 15\nadd %r6, %r1\nldxb %r0, [%r6+0]\nldxb %r3, [%r6+{span_off}]\nadd %r0, %r3\nexit"
        );
        let o = run_with(&jit, &src, &mut mem);
        if (span_off as usize) < len {
            assert_eq!(
                o.result(),
                Ok(14),
                "member at +{span_off}, {len}-byte context"
            );
        } else {
            assert_eq!(
                stop(&o),
                (PJ_STOP_OUT_OF_BOUNDS, 4, base + span_off as u64, 1),
                "member at +{span_off}, {len}-byte context"
            );
        }
    }
}
