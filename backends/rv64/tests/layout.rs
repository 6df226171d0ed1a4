//! Host-side compile sweep: the testkit's generated programs (ordinary and escaping ones)
//! compile in every mode and on every feature set. Sandboxed code puts each access's
//! out-of-line path after all functions, so many hot-path branches sit just under the
//! B-type limit; the branch relaxation must still settle (seed 0x5eed005a once did not).

mod common;
use common::*;
use packjit_plugin_api::abi::{PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX};
use packjit_plugin_api::HelperEntry;
use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};

#[test]
fn generated_programs_compile_in_every_mode() {
    let helpers: Vec<HelperEntry> = packjit_testkit::gen::helpers()
        .iter()
        .map(|(id, f, _)| HelperEntry {
            id: *id,
            inline_kind: 0,
            addr: *f as usize as u64,
        })
        .collect();
    let base = packjit_testkit::env_u64("PACKJIT_DIFF_SEED").unwrap_or(0x5eed_0000);
    let count = packjit_testkit::env_u64("PACKJIT_DIFF_COUNT").unwrap_or(300);
    let modes = [
        0,
        PJ_COMPILE_SANDBOX,
        PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS,
    ];
    let features = [0, FEATURE_C, FEATURE_ZBB | FEATURE_ZBA | FEATURE_C];
    let mut compiled = 0;
    for seed in (base..base + count).chain([0x5eed_005a]) {
        for code in [
            packjit_testkit::gen::generate(seed).encode(),
            packjit_testkit::gen::generate_escapes(seed).encode(),
        ] {
            for flags in modes {
                for f in features {
                    compile_with(&code, &helpers, f, flags, seed).unwrap_or_else(|e| {
                        panic!("seed {seed:#x} flags {flags:#x} features {f:#x}: {e}")
                    });
                    compiled += 1;
                }
            }
        }
    }
    packjit_testkit::report(&format!(
        "rv64 compile sweep: seeds {base:#x}..{:#x} (+0x5eed005a): {compiled} compiles",
        base + count
    ));
}

/// A branch back to a label already bound starts in the form that reaches it: a loop longer
/// than a B-type branch reaches, and the sandbox's stop paths (after all code) jumping back
/// to the entry's epilogue, cost no extra relaxation pass.
#[test]
fn far_backward_branches_take_one_pass() {
    use packjit_plugin_api::CompileRequest;
    use packjit_rv64::EmitOptions;
    let encode = |opc: u8, dst: u8, imm: i32, off: i16| {
        packjit_frontend::RawInsn {
            opc,
            dst,
            src: 0,
            off,
            imm,
        }
        .to_bytes()
    };
    // r0 = 0; r1 = 3; loop: 2,500 × (r0 += 1); r1 -= 1; if r1 != 0 goto loop; exit.
    // (Over 4 KiB even when each add is a 2-byte `c.addi`.)
    let body = 2_500;
    let mut code = Vec::new();
    code.extend(encode(0xb7, 0, 0, 0));
    code.extend(encode(0xb7, 1, 3, 0));
    for _ in 0..body {
        code.extend(encode(0x07, 0, 1, 0));
    }
    code.extend(encode(0x17, 1, 1, 0));
    code.extend(encode(0x55, 1, 0, -(body as i16) - 2));
    code.extend(encode(0x95, 0, 0, 0));
    for flags in [0, PJ_COMPILE_SANDBOX] {
        for features in [0, FEATURE_C] {
            let m = packjit_rv64::emit_request_with(
                &CompileRequest {
                    code: &code,
                    helpers: &[],
                    features,
                    flags,
                    blind_key: 0,
                },
                EmitOptions::default(),
            )
            .expect("compiles");
            assert!(m.bytes.len() > 4096, "the loop is out of B-type reach");
            assert_eq!(m.passes, 1, "flags {flags:#x} features {features:#x}");
        }
    }
}
