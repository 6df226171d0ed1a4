//! x86-64 widens the branches a pass left out of reach in place (`Pass::regrow`) instead of
//! emitting the program again. The widened code must be exactly what the second pass would
//! have emitted: bytes, line table, landings and pass count, for every program of the
//! conformance suite, the sandbox bench programs, the inlined built-ins' cases and generated
//! programs (plain and escaping), in every mode. Programs that settle in one pass are
//! compared too (nothing may change for them).

use packjit_frontend::analysis::EmitOptions;
use packjit_plugin_api::abi::{PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX};
use packjit_plugin_api::{CompileRequest, HelperEntry};
use packjit_testkit::inline_cases;

/// Generated programs of each kind.
const SEEDS: u64 = 400;

fn corpus() -> Vec<(String, Vec<u8>, Vec<HelperEntry>)> {
    let mut corpus = packjit_testkit::corpus::fixed_programs();
    corpus.push((
        "callx table after a far branch".into(),
        callx_after_far_branch(),
        inline_cases::dense_callx_helpers(0x7f00_0000_0000),
    ));
    corpus.extend(packjit_testkit::corpus::generated_programs(SEEDS));
    corpus
}

/// `r0 = 0; if r1 == 0 goto L; r0 += 1 (40 times); L: callx r0; exit`: the jump spans
/// more than `rel8` reaches, and dense helper ids put a `callx` table after the code.
fn callx_after_far_branch() -> Vec<u8> {
    let ins = |op: u8, dst: u8, off: i16, imm: i32| {
        let mut b = vec![op, dst];
        b.extend(off.to_le_bytes());
        b.extend(imm.to_le_bytes());
        b
    };
    let mut code = [ins(0xb7, 0, 0, 0), ins(0x15, 1, 40, 0)].concat();
    for _ in 0..40 {
        code.extend(ins(0x07, 0, 0, 1));
    }
    code.extend(ins(0x8d, 0, 0, 0));
    code.extend(ins(0x95, 0, 0, 0));
    code
}

#[test]
fn widening_in_place_gives_the_code_of_a_second_pass() {
    let modes = [
        ("trusted", 0),
        ("sandbox", PJ_COMPILE_SANDBOX),
        ("sandbox+budget", PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET),
        ("blinded", PJ_COMPILE_BLIND_CONSTANTS),
    ];
    let passes_off = EmitOptions {
        regrow: false,
        ..EmitOptions::default()
    };
    let (mut compared, mut widened, mut anchored) = (0, 0, 0);
    for (name, code, helpers) in corpus() {
        for (mode, flags) in modes {
            for features in [0, packjit_x86_64::SUPPORTED_FEATURES] {
                let req = CompileRequest {
                    code: &code,
                    helpers: &helpers,
                    features,
                    flags,
                    blind_key: 0x5eed_1234_abcd_0042,
                };
                let regrown = packjit_x86_64::emit_request_with(&req, EmitOptions::default());
                let emitted = packjit_x86_64::emit_request_with(&req, passes_off);
                let what = format!("{name}, {mode}, features {features:#x}");
                let (regrown, emitted) = match (regrown, emitted) {
                    (Ok(r), Ok(e)) => (r, e),
                    (Err(r), Err(e)) => {
                        assert_eq!(r.to_string(), e.to_string(), "{what}");
                        continue;
                    }
                    (r, e) => panic!("{what}: {:?} against {:?}", r.err(), e.err()),
                };
                assert_eq!(regrown, emitted, "{what}");
                compared += 1;
                if regrown.passes > 1 {
                    widened += 1;
                    // A `callx` table (data) anchors the code: a second pass is emitted.
                    anchored += usize::from(!regrown.data.is_empty());
                }
            }
        }
    }
    println!(
        "{compared} compiles compared, {widened} of them over more than one pass, {anchored} \
         of those emitted twice (a callx table)"
    );
    // Both paths under test run: many checked programs need a second pass, and generated
    // programs with `callx` take the fallback.
    assert!(
        widened > compared / 10,
        "only {widened} of {compared} needed a second pass"
    );
    assert!(
        anchored > 0,
        "no program with a callx table needed a second pass"
    );
}
