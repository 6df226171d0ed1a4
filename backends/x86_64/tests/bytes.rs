//! Byte-exact goldens: the objdump goldens compare instruction text, which cannot see an
//! equivalent re-encoding (`cmp r10, r9` as `4d 39 ca` or `4d 3b d1`) and so cannot tell
//! whether the encoder still picks the forms it chose before. These programs cover every
//! code path with fixed bytes (prologue with env and stack block, checks, the region scan,
//! stop stubs, budget charges, cold division paths, callx, local calls), in every mode and
//! feature combination. `PACKJIT_BLESS=1 cargo test -p packjit-x86-64 --test bytes`
//! rewrites `bytes.golden`; review its diff like any other golden change.

mod common;

use common::asm;
use packjit_plugin_api::abi::*;
use packjit_plugin_api::CompileRequest;
use packjit_plugin_api::HelperEntry;
use packjit_x86_64::{emit_request, FEATURE_BMI2, FEATURE_MOVBE};

const PROGRAMS: &[&str] = &[
    "ldxdw %r0, [%r1+8]\nstxdw [%r10-8], %r0\nexit",
    "ldxb %r0, [%r1+300]\nstxw [%r2+0], %r0\nexit",
    "mov %r0, 0\ncall %r0\nexit",
    "l:\nadd %r0, 1\njne %r0, 100, l\nexit",
    "mov %r1, %r10\ncall local f\nexit\nf:\nstdw [%r1-8], 1\nexit",
    "div %r0, %r1\nmod32 %r0, %r2\nsdiv %r0, %r3\nlsh %r0, %r4\nexit",
    "mov %r6, %r1\ncall 1\nadd %r0, %r6\nexit",
];

const FLAGS: &[u32] = &[
    0,
    PJ_COMPILE_SANDBOX,
    PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET,
    PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS,
];

fn render() -> String {
    let helpers = [
        HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1234_5678_9abc,
        },
        HelperEntry {
            id: 7,
            inline_kind: 0,
            addr: 0x42,
        },
    ];
    let mut out = String::new();
    for (i, src) in PROGRAMS.iter().enumerate() {
        for &flags in FLAGS {
            for features in [0, FEATURE_BMI2 | FEATURE_MOVBE] {
                let code = emit_request(&CompileRequest {
                    code: &asm(src),
                    helpers: &helpers,
                    features,
                    flags,
                    blind_key: 1,
                })
                .unwrap_or_else(|e| panic!("program {i} flags {flags:#x}: {e}"));
                let hex: String = code.bytes.iter().map(|b| format!("{b:02x}")).collect();
                out += &format!(
                    "p{i} flags={flags:#x} features={features:#x} insns={} {hex}\n",
                    code.native_insns
                );
            }
        }
    }
    out
}

#[test]
fn emitted_bytes_match_the_byte_golden() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bytes.golden");
    let got = render();
    if std::env::var_os("PACKJIT_BLESS").is_some() {
        std::fs::write(path, &got).expect("write bytes.golden");
        return;
    }
    let want = std::fs::read_to_string(path).expect("read bytes.golden");
    for (g, w) in got.lines().zip(want.lines()) {
        assert_eq!(g, w, "emitted bytes changed (first differing line shown)");
    }
    assert_eq!(got.lines().count(), want.lines().count(), "line count");
}
