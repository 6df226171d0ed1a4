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
    corpus.push(array_lookup_before_a_far_branch());
    corpus.extend(packjit_testkit::corpus::generated_programs(SEEDS));
    corpus
}

/// An inlined array lookup of a key from the context, then a branch over 40 instructions:
/// sandboxed, x86-64 selects NULL with a `cmovae` from a zero word after the code, whose
/// RIP-relative displacement must move with the widened branch between them.
fn array_lookup_before_a_far_branch() -> (String, Vec<u8>, Vec<HelperEntry>) {
    use packjit_plugin_api::abi::{PjArrayMap, PJ_ARRAY_NOT_PERCPU, PJ_INLINE_ARRAY_LOOKUP};
    const LOOKUP: i32 = 0x100;
    // The backend reads the layout while it compiles; the test's programs never run.
    let map: &'static PjArrayMap = Box::leak(Box::new(PjArrayMap {
        base: 0x7f00_0000_1000,
        value_stride: 8,
        max_entries: 1000,
        percpu_id: PJ_ARRAY_NOT_PERCPU,
    }));
    let ins = |op: u8, regs: u8, off: i16, imm: i32| {
        let mut b = vec![op, regs];
        b.extend(off.to_le_bytes());
        b.extend(imm.to_le_bytes());
        b
    };
    let mut code = [
        ins(0x61, 0x11, 0, 0),      // r1 = *(u32 *)(r1 + 0)
        ins(0x63, 0x1a, -4, 0),     // *(u32 *)(r10 - 4) = r1
        ins(0xbf, 0xa2, 0, 0),      // r2 = r10
        ins(0x07, 0x02, 0, -4),     // r2 += -4
        ins(0x85, 0x00, 0, LOOKUP), // call LOOKUP
        ins(0x15, 0x00, 41, 0),     // if r0 == 0 goto exit
        ins(0x79, 0x00, 0, 0),      // r0 = *(u64 *)(r0 + 0)
    ]
    .concat();
    for _ in 0..40 {
        code.extend(ins(0x07, 0, 0, 1));
    }
    code.extend(ins(0x95, 0, 0, 0));
    let helpers = vec![HelperEntry {
        id: LOOKUP as u32,
        addr: map as *const PjArrayMap as u64,
        inline_kind: PJ_INLINE_ARRAY_LOOKUP,
    }];
    ("array lookup before a far branch".into(), code, helpers)
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
    let (mut compared, mut widened, mut anchored, mut zero_word_moved) = (0, 0, 0, 0);
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
                if name.starts_with("array lookup") && flags & PJ_COMPILE_SANDBOX != 0 {
                    // The case exists for the select's zero word, widened past.
                    assert!(regrown.passes > 1 && !regrown.data.is_empty(), "{what}");
                    zero_word_moved += 1;
                }
                if regrown.passes > 1 {
                    widened += 1;
                    // A `callx` table (data) anchors the code: a second pass is emitted.
                    // (The array lookup's zero word is data too, but moves with the code.)
                    let callx_table = !regrown.data.is_empty() && !name.starts_with("array lookup");
                    anchored += usize::from(callx_table);
                }
            }
        }
    }
    println!(
        "{compared} compiles compared, {widened} of them over more than one pass, {anchored} \
         of those emitted twice (a callx table), {zero_word_moved} widened past a zero word"
    );
    assert!(
        zero_word_moved > 0,
        "the array lookup case was not compiled sandboxed"
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
