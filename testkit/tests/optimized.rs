//! The optimizing tier (`Tier::Optimized`, `packjit-tier2`) on the machine the test runs on:
//! natively on x86-64, under qemu-user in the aarch64 and riscv64 cross runs.
//!
//! * The bpf_conformance suite, trusted (the tier takes trusted programs only): every case
//!   compiled by Cranelift and run, r0 compared; must-reject cases rejected.
//! * Differential: random in-bounds programs ([`packjit_testkit::gen::generate`]) run by the
//!   optimized code and by the interpreter (and rbpf's where it can): r0, context and dumped
//!   stack must match. `PACKJIT_DIFF_COUNT` programs (default 5000 natively on x86-64, 1000
//!   under qemu), seeds from `PACKJIT_DIFF_SEED` (default 0x7e1e0000); the range is printed.
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

/// Trusted loads through the optimized tier, as a conformance engine.
struct Optimized<'r>(&'r Runtime);

impl Engine for Optimized<'_> {
    fn label(&self) -> String {
        format!("{} optimized tier, trusted", Arch::host().unwrap())
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        // SAFETY: the suite's programs access only their context and their stack (the
        // reference runs every one of them in bounds: `whole_suite_passes_on_the_reference`).
        let p = unsafe { self.0.load_trusted(code, &optimized()) }.map_err(|e| e.to_string())?;
        Ok(Box::new(p))
    }
}

#[test]
fn conformance_suite_through_the_optimized_tier() {
    let rt = Runtime::new().unwrap();
    ensure_suite_helper(&rt).unwrap();
    let cases = load_suite(&suite_dir()).expect("conformance suite");
    let s = run_cases(&Optimized(&rt), &cases, &[]);
    packjit_testkit::report(&s.to_string());
    assert_eq!(s.failed, 0, "{}", s.report());
    assert_eq!(s.compile_only, 0, "every case must run natively");
    assert!(s.passed >= 350, "only {} passed: {}", s.passed, s.report());
}

#[test]
fn random_programs_match_the_interpreter() {
    let rt = Runtime::new().unwrap();
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    let emulated = !cfg!(target_arch = "x86_64");
    let count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(if emulated {
        1000
    } else {
        5000
    });
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x7e1e_0000);
    let target = JitTarget {
        rt: &rt,
        opts: optimized(),
    };
    let engine = target.engine(false);
    let (mut ran, mut with_rbpf) = (0u64, 0u64);
    for seed in base..base + count {
        match check_seed(&engine, seed) {
            Ok(Checked::Agree { rbpf }) => {
                ran += 1;
                with_rbpf += rbpf as u64;
            }
            Ok(Checked::CompiledOnly { .. }) => panic!("seed {seed:#x}: native code did not run"),
            Err(m) => panic!("optimized tier, trusted: {m}"),
        }
    }
    packjit_testkit::report(&format!(
        "optimized tier differential ({}): seeds {base:#x}..{:#x}: {ran} run and matched the interpreter, {with_rbpf} also rbpf",
        Arch::host().unwrap(),
        base + count
    ));
    assert_eq!(ran, count);
}

#[test]
fn what_the_tier_cannot_take_is_refused_by_name() {
    let rt = Runtime::new().unwrap();
    let exit0 = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let e = rt.load(&exit0, &optimized()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("sandboxed programs"), "{e}");
    let with = |o: LoadOptions| {
        // SAFETY: `mov r0, 0; exit` touches no memory.
        unsafe { rt.load_trusted(&exit0, &o) }.unwrap_err()
    };
    let e = with(LoadOptions {
        budget: Budget::Limit(100),
        ..optimized()
    });
    assert!(e.to_string().contains("instruction budget"), "{e}");
    let e = with(LoadOptions {
        blind_constants: true,
        ..optimized()
    });
    assert!(e.to_string().contains("constant blinding"), "{e}");
    // LD_ABS: r0 = *(u8 *)(ctx + 0).
    let ld_abs = [0x30, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: refused before it could run.
    let e = unsafe { rt.load_trusted(&ld_abs, &optimized()) }.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(
        e.to_string().contains("pc 0") && e.to_string().contains("LD_ABS"),
        "{e}"
    );
    // And the same program loads trusted on the tier and runs.
    // SAFETY: as above.
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
