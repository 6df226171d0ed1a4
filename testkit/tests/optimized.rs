//! The optimizing tier (`Tier::Optimized`, `packjit-tier2`) on the machine the test runs on:
//! natively on x86-64, under qemu-user in the aarch64 and riscv64 cross runs.
//!
//! * The bpf_conformance suite, trusted and sandboxed: every case compiled by Cranelift and
//!   run, r0 compared; must-reject cases rejected.
//! * Differential: random in-bounds programs ([`packjit_testkit::gen::generate`]) run by the
//!   optimized code, trusted and sandboxed, and by the interpreter (and rbpf's where it
//!   can): r0, context and dumped stack must match. `PACKJIT_DIFF_COUNT` programs (default
//!   5000 natively on x86-64; under qemu 1000 trusted, 300 sandboxed), seeds from
//!   `PACKJIT_DIFF_SEED` (default 0x7e1e0000); the range is printed.
//! * Host regions behave as on the baseline, sandboxed (the escape programs are in
//!   `optimized_escapes.rs`, a binary of their own: under qemu each test binary has its own
//!   time limit).
//! * What the tier does not take yet is refused by name, never compiled differently.

use packjit::{Budget, ErrorKind, LoadOptions, Runtime, Tier};
use packjit_plugin_api::Arch;
use packjit_testkit::conformance::{
    ensure_suite_helper, load_suite, run_cases, suite_dir, Engine, Loaded,
};
use packjit_testkit::gen::{check_seed, helpers, Checked, JitTarget};

fn optimized() -> LoadOptions {
    LoadOptions {
        tier: Tier::Optimized,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    }
}

/// How a test loads: `Runtime::load_trusted` or `Runtime::load`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Trusted,
    Sandboxed,
}

/// Loads through the optimized tier, as a conformance engine.
struct Optimized<'r>(&'r Runtime, Mode);

impl Engine for Optimized<'_> {
    fn label(&self) -> String {
        format!("{} optimized tier, {:?}", Arch::host().unwrap(), self.1)
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        let p = match self.1 {
            // SAFETY: the suite's programs access only their context and their stack (the
            // reference runs every one of them in bounds: `whole_suite_passes_on_the_reference`).
            Mode::Trusted => unsafe { self.0.load_trusted(code, &optimized()) },
            Mode::Sandboxed => self.0.load(code, &optimized()),
        }
        .map_err(|e| e.to_string())?;
        Ok(Box::new(p))
    }
}

fn conformance(mode: Mode) {
    let rt = Runtime::new().unwrap();
    ensure_suite_helper(&rt).unwrap();
    let cases = load_suite(&suite_dir()).expect("conformance suite");
    let s = run_cases(&Optimized(&rt, mode), &cases, &[]);
    packjit_testkit::report(&s.to_string());
    assert_eq!(s.failed, 0, "{}", s.report());
    assert_eq!(s.compile_only, 0, "every case must run natively");
    assert!(s.passed >= 350, "only {} passed: {}", s.passed, s.report());
}

#[test]
fn conformance_suite_through_the_optimized_tier() {
    conformance(Mode::Trusted);
}

#[test]
fn conformance_suite_sandboxed_through_the_optimized_tier() {
    conformance(Mode::Sandboxed);
}

#[test]
fn random_programs_match_the_interpreter() {
    random_programs(Mode::Trusted);
}

#[test]
fn random_programs_sandboxed_match_the_interpreter() {
    random_programs(Mode::Sandboxed);
}

fn random_programs(mode: Mode) {
    let rt = Runtime::new().unwrap();
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    let emulated = !cfg!(target_arch = "x86_64");
    // Under qemu the sandboxed run costs more (every access checked): fewer of those, so
    // the binary stays inside the emulated run's time limit.
    let emulated_count = match mode {
        Mode::Trusted => 1000,
        Mode::Sandboxed => 300,
    };
    let count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(if emulated {
        emulated_count
    } else {
        5000
    });
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x7e1e_0000);
    let target = JitTarget {
        rt: &rt,
        opts: optimized(),
    };
    let engine = target.engine(mode == Mode::Sandboxed);
    let (mut ran, mut with_rbpf) = (0u64, 0u64);
    for seed in base..base + count {
        match check_seed(&engine, seed) {
            Ok(Checked::Agree { rbpf }) => {
                ran += 1;
                with_rbpf += rbpf as u64;
            }
            Ok(Checked::CompiledOnly { .. }) => panic!("seed {seed:#x}: native code did not run"),
            Err(m) => panic!("optimized tier, {mode:?}: {m}"),
        }
    }
    packjit_testkit::report(&format!(
        "optimized tier differential ({}, {mode:?}): seeds {base:#x}..{:#x}: {ran} run and matched the interpreter, {with_rbpf} also rbpf",
        Arch::host().unwrap(),
        base + count
    ));
    assert_eq!(ran, count);
}

/// `code` on `ctx` through the tier, trusted and sandboxed, each against the interpreter;
/// gives the number of runs checked (2).
///
/// # Safety
/// `code` touches nothing but its context (the trusted load runs it unchecked).
unsafe fn check_trusted_and_sandboxed(rt: &Runtime, code: &[u8], ctx: &[u8], what: &str) -> usize {
    for sandboxed in [false, true] {
        // SAFETY: the caller's contract.
        unsafe {
            packjit_testkit::gen::check_optimized_against_reference(rt, code, ctx, sandboxed, what)
        };
    }
    2
}

/// A shift whose amount was masked first (`x << (y & 63)`, clang's `1ULL << (j % 64)`):
/// the tier drops a mask that keeps every bit the shift reads (its amount is taken modulo
/// the width anyway) and must keep every other. Every kind of shift at both widths, masks
/// that keep all of the residue's bits, some of them, or more, amounts below, at and above
/// the width, against the interpreter, trusted and sandboxed.
#[test]
fn masked_shift_amounts_match_the_interpreter() {
    let rt = Runtime::new().unwrap();
    let masks: [i64; 10] = [63, 31, 127, 0xff, 0x13f, 62, 0x1f, 30, -1, 0];
    let amounts: [u64; 12] = [
        0,
        1,
        5,
        31,
        32,
        33,
        63,
        64,
        65,
        200,
        0xffff_ffff,
        1 << 32 | 3,
    ];
    let values: [u64; 2] = [0x8000_0000_0000_0001, 0x1234_5678_9abc_def0];
    let mut cases = 0;
    for suffix in ["", "32"] {
        for op in ["lsh", "rsh", "arsh"] {
            for mask in masks {
                let text = format!(
                    "ldxdw %r3, [%r1+0]\nldxdw %r4, [%r1+8]\nand{suffix} %r4, {mask}\n\
                     {op}{suffix} %r3, %r4\nmov %r0, %r3\nexit\n"
                );
                let code =
                    packjit_testkit::asm::assemble(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                for x in values {
                    for y in amounts {
                        let mut ctx = x.to_le_bytes().to_vec();
                        ctx.extend_from_slice(&y.to_le_bytes());
                        let what = format!("{op}{suffix} by (y & {mask}), x {x:#x}, y {y:#x}");
                        // SAFETY: the program reads its 16-byte context only.
                        cases += unsafe { check_trusted_and_sandboxed(&rt, &code, &ctx, &what) };
                    }
                }
            }
        }
    }
    assert_eq!(cases, 2 * 3 * 10 * 2 * 12 * 2);
}

/// A right shift then an `and` with a constant loaded by `lddw` (clang's byte offset of
/// `words[j / 64]`: `(j >> 3) & 0x1ffffffffffffff8`): the tier turns `(x >> k) & mask` into
/// `(x >> (k + s)) << s` when the mask keeps every bit the shift left but the low `s` (1 to
/// 3), and must leave every other mask alone. Shifts from 1 to 63, masks clearing 0 to 4 low
/// bits, masks one bit off either way, against the interpreter, trusted and sandboxed.
#[test]
fn shifted_and_masked_indexes_match_the_interpreter() {
    let rt = Runtime::new().unwrap();
    let values: [u64; 3] = [u64::MAX, 0x8000_0000_0000_0001, 0x1234_5678_9abc_def0];
    let mut cases = 0;
    for k in [1u32, 2, 3, 5, 8, 31, 32, 58, 59, 60, 61, 62, 63] {
        let kept = u64::MAX >> k;
        let mut masks: Vec<u64> = (0..=4).map(|s| kept & !((1u64 << s) - 1)).collect();
        masks.extend([
            (u64::MAX >> (k - 1)) & !7,
            kept & !7 & !(1 << 40),
            kept & !7 | 1,
            !7,
        ]);
        for mask in masks {
            let text = format!(
                "ldxdw %r3, [%r1+0]\nlddw %r4, {mask:#x}\nrsh %r3, {k}\nand %r3, %r4\n\
                 mov %r0, %r3\nexit\n"
            );
            let code =
                packjit_testkit::asm::assemble(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            for x in values {
                let what = format!("(x >> {k}) & {mask:#x}, x {x:#x}");
                // SAFETY: the program reads its 8-byte context only.
                cases +=
                    unsafe { check_trusted_and_sandboxed(&rt, &code, &x.to_le_bytes(), &what) };
            }
        }
    }
    assert_eq!(cases, 13 * 9 * 3 * 2);
}

/// Divisions and remainders with the divisors whose result eBPF fixes (0 for all four, -1
/// for the signed ones: `x / -1 = -x` wrapping, `x % -1 = 0`) and their neighbours, by a
/// register and by an immediate (the tier selects the fixed result after dividing by 1,
/// and folds it for a constant), at both widths (a 64-bit divisor whose low half is 0 or
/// -1 divides a 32-bit operation by 0 or -1), against the interpreter, trusted and
/// sandboxed.
#[test]
fn divisions_by_zero_and_minus_one_match_the_interpreter() {
    let rt = Runtime::new().unwrap();
    let divisors: [i64; 12] = [
        0,
        -1,
        1,
        -2,
        2,
        7,
        -7,
        i64::MIN,
        i64::MAX,
        0xffff_ffff,
        1 << 32,
        (1 << 32) | 3,
    ];
    let dividends: [i64; 6] = [0, 100, -100, i64::MIN, i64::MAX, 0x8000_0000];
    let mut cases = 0;
    for suffix in ["", "32"] {
        for op in ["div", "mod", "sdiv", "smod"] {
            for divisor in divisors {
                // An immediate is 32 bits, sign-extended: only those that fit.
                let immediate = i32::try_from(divisor).ok();
                let forms = [
                    Some(format!("ldxdw %r4, [%r1+8]\n{op}{suffix} %r3, %r4")),
                    immediate.map(|imm| format!("{op}{suffix} %r3, {imm}")),
                ];
                for form in forms.into_iter().flatten() {
                    let text = format!("ldxdw %r3, [%r1+0]\n{form}\nmov %r0, %r3\nexit\n");
                    let code = packjit_testkit::asm::assemble(&text)
                        .unwrap_or_else(|e| panic!("{text}: {e}"));
                    for x in dividends {
                        let mut ctx = x.to_le_bytes().to_vec();
                        ctx.extend_from_slice(&divisor.to_le_bytes());
                        let what = format!("{form}, x {x:#x}, divisor {divisor:#x}");
                        // SAFETY: the program reads its 16-byte context only.
                        cases += unsafe { check_trusted_and_sandboxed(&rt, &code, &ctx, &what) };
                    }
                }
            }
        }
    }
    // The first seven divisors fit an immediate.
    assert_eq!(cases, 2 * 4 * (12 + 7) * 6 * 2);
}

extern "C" fn plus_one(r1: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    r1.wrapping_add(1)
}

/// The budget counted across bpf-to-bpf calls and helper calls: every budget from 0 to past
/// what the program needs, on a program whose loop charges its back-edge, calls a function
/// that loops and charges its own back-edges, and calls a helper. Each run must end as the
/// baseline's does (the same r0, or a budget stop at the same pc), sandboxed and trusted with
/// a budget. A callee's charges lost on the way back or a charge applied twice would move
/// the pc or the result.
#[test]
fn budgets_across_calls_and_helpers_stop_where_the_baseline_stops() {
    const HELPER: u32 = 0x7001;
    let rt = Runtime::new().unwrap();
    rt.register_helper(HELPER, "plus_one", plus_one).unwrap();
    let text = format!(
        "mov %r6, 0\nmov %r7, 4\n\
         outer:\nmov %r1, %r7\ncall local f\nadd %r6, %r0\nmov %r1, %r6\n\
         call {HELPER}\nmov %r6, %r0\nsub %r7, 1\njne %r7, 0, outer\n\
         mov %r0, %r6\nexit\n\
         f:\nmov %r0, 0\nmov %r2, %r1\nfloop:\nadd %r0, %r2\nsub %r2, 1\n\
         jne %r2, 0, floop\nexit\n"
    );
    let code = packjit_testkit::asm::assemble(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    stops_as_on_the_baseline(&rt, &code, 160);
}

/// `code`, which touches no memory but its registers, loaded with each budget below
/// `budgets` on both tiers, trusted and sandboxed: the optimized tier stops where the
/// baseline stops, or returns what it returns. The range must cross the program's need
/// (some runs stop, some finish).
fn stops_as_on_the_baseline(rt: &Runtime, code: &[u8], budgets: u64) {
    let load = |tier: Tier, sandboxed: bool, budget: u64| {
        let opts = LoadOptions {
            tier,
            budget: Budget::Limit(budget),
            ..LoadOptions::default()
        };
        if sandboxed {
            rt.load(code, &opts).unwrap()
        } else {
            // SAFETY: the program touches no memory but its registers.
            unsafe { rt.load_trusted(code, &opts) }.unwrap()
        }
    };
    let mut outcomes = Outcomes::default();
    for sandboxed in [false, true] {
        for budget in 0..budgets {
            let want = load(Tier::Baseline, sandboxed, budget).call(&mut []);
            let got = load(Tier::Optimized, sandboxed, budget).call(&mut []);
            assert_eq!(got, want, "budget {budget}, sandboxed {sandboxed}");
            outcomes.count(&want, "budget");
        }
    }
    outcomes.assert_both();
}

/// The baseline's results of a test that must see both a finished run and a stop.
#[derive(Default)]
struct Outcomes {
    finished: u32,
    stopped: u32,
}

impl Outcomes {
    /// Counts `result`; a stop must name `stop` (its kind or pc).
    fn count(&mut self, result: &Result<u64, packjit::RunError>, stop: &str) {
        match result {
            Ok(_) => self.finished += 1,
            Err(e) => {
                assert!(e.to_string().contains(stop), "{e}");
                self.stopped += 1;
            }
        }
    }

    fn assert_both(&self) {
        assert!(
            self.finished > 0 && self.stopped > 0,
            "{} finished, {} stopped",
            self.finished,
            self.stopped
        );
    }
}

/// A small leaf function is inlined into its caller by the tier (`tier2/src/inline.rs`): its
/// own stack frame stays apart from the caller's, its writes to r6 and r9 do not reach
/// the caller's, and an access it makes out of the context stops the run at the callee's pc,
/// as on the baseline, where the callee is an ordinary call.
#[test]
fn inlined_leaf_functions_keep_their_frame_registers_and_stops() {
    let rt = Runtime::new().unwrap();
    let text = "mov %r6, %r1\nmov %r7, 0\nmov %r8, 0\nmov %r9, 1000\n\
         loop:\nstxdw [%r10-8], %r7\nmov %r1, %r6\nmov %r2, %r8\ncall local f\n\
         ldxdw %r7, [%r10-8]\nadd %r7, %r0\nadd %r8, 1\njne %r8, 4, loop\n\
         mov %r0, %r7\nadd %r0, %r9\nexit\n\
         f:\nmov %r6, %r2\nlsh %r6, 8\nstxdw [%r10-8], %r6\nadd %r1, %r2\n\
         ldxb %r0, [%r1+0]\nldxdw %r3, [%r10-8]\nadd %r0, %r3\nmov %r9, 99\nexit\n";
    let code = packjit_testkit::asm::assemble(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let load = |tier: Tier, sandboxed: bool| {
        let opts = LoadOptions {
            tier,
            budget: Budget::Unlimited,
            ..LoadOptions::default()
        };
        if sandboxed {
            rt.load(&code, &opts).unwrap()
        } else {
            // SAFETY: run below only on contexts of at least 4 bytes, all the callee reads.
            unsafe { rt.load_trusted(&code, &opts) }.unwrap()
        }
    };
    let mut outcomes = Outcomes::default();
    for sandboxed in [false, true] {
        let (baseline, optimized) = (
            load(Tier::Baseline, sandboxed),
            load(Tier::Optimized, sandboxed),
        );
        for len in if sandboxed { 0..8 } else { 4..8 } {
            let mut ctx: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
            // One buffer for both (the program only reads it), so a stop names the same address.
            let want = baseline.call(&mut ctx);
            let got = optimized.call(&mut ctx);
            assert_eq!(got, want, "context of {len} bytes, sandboxed {sandboxed}");
            outcomes.count(&want, "pc 19");
        }
    }
    outcomes.assert_both();
}

#[test]
fn what_the_tier_cannot_take_is_refused_by_name() {
    let rt = Runtime::new().unwrap();
    let exit0 = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    // Sandboxed and budgeted loads are the tier's now.
    let p = rt
        .load(
            &exit0,
            &LoadOptions {
                budget: Budget::Limit(100),
                ..optimized()
            },
        )
        .unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 0);
    let e = rt
        .load(
            &exit0,
            &LoadOptions {
                blind_constants: true,
                ..optimized()
            },
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("constant blinding"), "{e}");
    // LD_ABS: r0 = *(u8 *)(ctx + 0).
    let ld_abs = [0x30, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    for e in [
        // SAFETY: refused before it could run.
        unsafe { rt.load_trusted(&ld_abs, &optimized()) }.unwrap_err(),
        rt.load(&ld_abs, &optimized()).unwrap_err(),
    ] {
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(
            e.to_string().contains("pc 0") && e.to_string().contains("LD_ABS"),
            "{e}"
        );
    }
    // And the same program loads trusted on the tier and runs.
    // SAFETY: `mov r0, 0; exit` touches no memory.
    let p = unsafe { rt.load_trusted(&exit0, &optimized()) }.unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 0);
}

#[test]
fn an_unknown_callx_id_in_a_callee_stops_the_whole_run() {
    use packjit_frontend::encode_insn as i;
    let rt = Runtime::new().unwrap();
    let code: Vec<u8> = [
        i(0xb7, 0, 0, 0, 1),   // 0: r0 = 1
        i(0x85, 0, 1, 0, 2),   // 1: call pc 4
        i(0xb7, 0, 0, 0, 2),   // 2: r0 = 2 (never reached: the callee stopped the run)
        i(0x95, 0, 0, 0, 0),   // 3: exit
        i(0xb7, 1, 0, 0, 999), // 4: r1 = 999, no such helper
        i(0x8d, 1, 0, 0, 0),   // 5: callx r1
        i(0x95, 0, 0, 0, 0),   // 6: exit
    ]
    .concat();
    // SAFETY: the program touches no memory.
    let p = unsafe { rt.load_trusted(&code, &optimized()) }.unwrap();
    let e = p.call(&mut []).unwrap_err();
    match e.stop() {
        Some(packjit::Stop::UnknownCallx { pc, id }) => assert_eq!((pc, id), (5, 999), "{e}"),
        other => panic!("expected an unknown-callx stop, got {other:?} ({e})"),
    }
}

#[test]
fn optimized_code_runs_behind_a_hook_and_has_symbols() {
    use packjit_frontend::encode_insn as i;
    let rt = Runtime::new().unwrap();
    // r0 = ctx_len * 3 + 1, with the product spilled to the stack and read back.
    let code: Vec<u8> = [
        i(0xbf, 0, 2, 0, 0),   // 0: r0 = r2
        i(0x27, 0, 0, 0, 3),   // 1: r0 *= 3
        i(0x7b, 10, 0, -8, 0), // 2: *(u64 *)(r10 - 8) = r0
        i(0x79, 0, 10, -8, 0), // 3: r0 = *(u64 *)(r10 - 8)
        i(0x07, 0, 0, 0, 1),   // 4: r0 += 1
        i(0x95, 0, 0, 0, 0),   // 5: exit
    ]
    .concat();
    let opts = LoadOptions {
        name: Some("tier2_hooked".into()),
        ..optimized()
    };
    // SAFETY: the program touches only its own stack.
    let p = unsafe { rt.load_trusted(&code, &opts) }.unwrap();
    // The symbol index knows the code by name, and the line table maps its entry to pc 0.
    let entry = p.entry_addr();
    let sym = rt
        .symbolize(entry)
        .expect("optimized code is in the symbol index");
    assert_eq!(&*sym.name, "tier2_hooked");
    assert_eq!(p.pc_at(entry), Some(0));
    assert_eq!(p.pc_offsets().len(), 6);
    let hook = packjit::Hook::new();
    hook.attach(p).unwrap();
    let mut ctx = [0u8; 5];
    assert_eq!(hook.run(&mut ctx).unwrap().unwrap(), 16);
    hook.detach();
    assert!(hook.run(&mut ctx).is_none());
}

/// `r0 = *(u64 *)(addr + off)` (or, with `store`, `*(u64 *)(addr + off) = 7; r0 = 0`); exit.
fn access_at(addr: u64, off: i16, store: bool) -> Vec<u8> {
    use packjit_frontend::encode_insn as i;
    [
        i(0x18, 1, 0, 0, addr as i32),
        i(0, 0, 0, 0, (addr >> 32) as i32),
        if store {
            i(0x7a, 1, 0, off, 7) // *(u64 *)(r1 + off) = 7
        } else {
            i(0x79, 0, 1, off, 0)
        },
        if store {
            i(0xb7, 0, 0, 0, 0)
        } else {
            i(0x05, 0, 0, 0, 0) // ja +0
        },
        i(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

/// Host regions (the checks' out-of-line scan): reads and writes inside them run, one byte
/// out or a write to a read-only one stops with the baseline's record; an access the
/// front end proves inside a static region runs unchecked and right.
#[test]
fn host_regions_allow_and_stop_as_on_the_baseline() {
    use packjit::{MemRegion, RegionAccess};
    let rt = Runtime::new().unwrap();
    let table: Box<[u64; 16]> = Box::new(std::array::from_fn(|k| 100 + k as u64));
    let cells: Box<[std::cell::UnsafeCell<u64>; 4]> = Box::default();
    let (t, c) = (table.as_ptr() as u64, cells.as_ptr() as u64);
    // SAFETY: both boxes outlive every program given the regions (declared before them);
    // the cells are only written by programs, through raw pointers (`UnsafeCell`).
    let (ro, rw) = unsafe {
        (
            MemRegion::new(t as *const u8, 16 * 8, RegionAccess::ReadOnly),
            MemRegion::new(c as *const u8, 4 * 8, RegionAccess::ReadWrite),
        )
    };
    // Runtime-wide regions reach the run's env only (not the static regions of the load):
    // every access to them goes through the out-of-line scan.
    rt.add_region(ro);
    rt.add_region(rw);
    let cases = [
        (t, 15 * 8, false, "last table entry"),
        (t, 15 * 8 + 1, false, "one byte past the table"),
        (t, -8, false, "before the table"),
        (c, 8, true, "a writable cell"),
        (c, 25, true, "past the cells"),
        (t, 0, true, "a write to the read-only table"),
    ];
    for (addr, off, store, what) in cases {
        // The load's own regions (static: proven accesses run unchecked) and none but the
        // runtime's.
        for regions in [vec![ro, rw], vec![]] {
            let code = access_at(addr, off, store);
            let run = |tier| {
                let opts = LoadOptions {
                    regions: regions.clone(),
                    tier,
                    ..LoadOptions::default()
                };
                let p = rt.load(&code, &opts).unwrap();
                let cell = cells[1].get();
                // SAFETY: no program runs while the test reads or writes the cell.
                unsafe { *cell = 0 };
                let r = p.call(&mut []).map_err(|e| e.stop().expect("a stop"));
                // SAFETY: as above.
                (r, unsafe { *cell })
            };
            let (want, got) = (run(Tier::Baseline), run(Tier::Optimized));
            assert_eq!(got, want, "{what}");
        }
    }
    assert_eq!(table[0], 100, "the read-only table is unchanged");
}

/// Conditional jumps over one or two ALU instructions, which the tier lifts as selects
/// (`packjit-tier2`'s `select`): every equality test (`jeq`, `jne`, `jset`, both widths, by
/// an immediate and by a register) over arms of one and two instructions writing one or two
/// registers, with values that take the jump and values that do not; and a loop whose arm
/// is closed by a jump back to its head (the `words` peer's shape), against the
/// interpreter, trusted and sandboxed.
#[test]
fn short_arms_lifted_as_selects_match_the_interpreter() {
    let rt = Runtime::new().unwrap();
    let arms: [&[&str]; 6] = [
        &["add %r5, 1"],
        &["mov32 %r5, -1"],
        &["neg %r5", "lsh %r4, %r3"],
        &["mov %r4, %r3", "add32 %r4, 9"],
        &["be16 %r5", "arsh %r4, 3"],
        &["lddw %r5, 0x123456789", "xor %r4, %r5"],
    ];
    let values: [u64; 4] = [0, 1, 0x1_0000_0001, 0xffff_ffff_0000_0000];
    let mut cases = 0;
    for jump in ["jeq", "jne", "jset", "jeq32", "jne32", "jset32"] {
        for operand in ["1", "%r4"] {
            for arm in arms {
                // The arm's length in slots (`lddw` takes two).
                let slots: usize = arm
                    .iter()
                    .map(|i| if i.starts_with("lddw") { 2 } else { 1 })
                    .sum();
                let text = format!(
                    "ldxdw %r3, [%r1+0]\nldxdw %r4, [%r1+8]\nmov %r5, 7\n\
                     {jump} %r3, {operand}, +{slots}\n{}\nmov %r0, %r5\nlsh %r0, 7\n\
                     xor %r0, %r4\nexit\n",
                    arm.join("\n")
                );
                let code =
                    packjit_testkit::asm::assemble(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                for x in values {
                    for y in [1u64, 0x1_0000_0001] {
                        let mut ctx = x.to_le_bytes().to_vec();
                        ctx.extend_from_slice(&y.to_le_bytes());
                        let what = format!("{jump} by {operand} over {arm:?}, x {x:#x}, y {y:#x}");
                        // SAFETY: the program reads its 16-byte context only.
                        cases += unsafe { check_trusted_and_sandboxed(&rt, &code, &ctx, &what) };
                    }
                }
            }
        }
    }
    assert_eq!(cases, 6 * 2 * 6 * 4 * 2 * 2);
    // r0 collects one bit per round: r6 = 1, then 0 unless bit `round` of x is set; the
    // arm (`mov %r6, 0`) is closed by `ja` back to the head, as the jump is.
    let text = "ldxdw %r3, [%r1+0]\nmov %r0, 0\nmov %r2, 0\nmov %r6, 0\n\
                lsh %r0, 1\nadd %r0, %r6\nadd %r2, 1\njgt %r2, 40, +6\nmov %r6, 1\n\
                mov %r7, %r3\nrsh %r3, 1\njset %r7, 1, -8\nmov %r6, 0\nja -10\nexit\n";
    let code = packjit_testkit::asm::assemble(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    for x in [0u64, 0xa5a5_5a5a_0f0f_f0f0, u64::MAX] {
        let what = format!("the closed arm's loop, x {x:#x}");
        // SAFETY: the program reads its 8-byte context only.
        cases += unsafe { check_trusted_and_sandboxed(&rt, &code, &x.to_le_bytes(), &what) };
    }
    assert_eq!(cases, 6 * 2 * 6 * 4 * 2 * 2 + 3 * 2);
}

/// Short arms in a budgeted program, one forward (`jset` over an `add`) and one closed by
/// `ja` back to the loop's head (a charged back-edge): the tier keeps them jumps (a
/// back-edge lifted as a select would charge nothing); at every budget across the loop's
/// need the optimized code stops at the pc where the baseline stops, or returns what it
/// returns, trusted and sandboxed.
#[test]
fn budgets_stop_where_the_baseline_stops_around_short_arms() {
    let rt = Runtime::new().unwrap();
    let text = "mov %r3, 0x5a5a\nmov %r0, 0\nmov %r4, 0\nmov %r6, 0\n\
                head:\nlsh %r0, 1\nadd %r0, %r6\nadd %r4, 1\njgt %r4, 12, out\n\
                mov %r6, 1\nmov %r7, %r3\nrsh %r3, 1\njset %r7, 2, skip\nadd %r0, 3\n\
                skip:\njset %r7, 1, head\nmov %r6, 0\nja head\n\
                out:\nexit\n";
    let code = packjit_testkit::asm::assemble(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    stops_as_on_the_baseline(&rt, &code, 200);
}
