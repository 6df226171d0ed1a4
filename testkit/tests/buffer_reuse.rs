//! Buffers a compile reuses from the one before on its thread (`packjit_frontend::reuse`)
//! must not change what it emits: a large program compiled with fresh buffers, then after a
//! different large program has used and returned them, gives the same code and offsets, on
//! every backend, trusted and sandboxed.

use packjit_plugin_api::abi::PJ_COMPILE_SANDBOX;
use packjit_plugin_api::{CompileRequest, JitBackend};
use packjit_testkit::gen::sized_program;

/// (code, per-instruction offsets or line table) of one compile.
type Output = (Vec<u8>, Vec<u32>);

fn emit(arch: &str, code: &[u8], flags: u32) -> Output {
    match arch {
        "x86-64" => {
            let e = packjit_x86_64::emit_request(&CompileRequest {
                code,
                helpers: &[],
                features: packjit_x86_64::X86Backend::new().supported_features(),
                flags,
                blind_key: 0,
            })
            .unwrap();
            (e.bytes.to_vec(), e.inst_offsets.to_vec())
        }
        "arm64" => {
            let e = packjit_arm64::emit_request(&CompileRequest {
                code,
                helpers: &[],
                features: packjit_arm64::Arm64Backend::new().supported_features(),
                flags,
                blind_key: 0,
            })
            .unwrap();
            (e.bytes.to_vec(), e.inst_offsets.to_vec())
        }
        "riscv64" => {
            let e = packjit_rv64::emit_request(&CompileRequest {
                code,
                helpers: &[],
                features: packjit_rv64::Rv64Backend::new().supported_features(),
                flags,
                blind_key: 0,
            })
            .unwrap();
            (e.bytes.to_vec(), e.inst_offsets.to_vec())
        }
        _ => unreachable!(),
    }
}

#[test]
fn reused_buffers_emit_the_same_code_as_fresh_ones() {
    // Large enough that every per-instruction buffer and the code are kept for reuse
    // (256 KiB and up), and of different sizes, so the second program takes buffers larger
    // than it needs and leaves the third with ones it grows.
    let first = sized_program(70_000, 4);
    let other = sized_program(50_000, 8);
    for arch in ["x86-64", "arm64", "riscv64"] {
        for flags in [0, PJ_COMPILE_SANDBOX] {
            // Each case on a thread of its own: its first compile starts with no spares.
            let (fresh, again, between) = std::thread::spawn({
                let (first, other) = (first.clone(), other.clone());
                move || {
                    let fresh = emit(arch, &first, flags);
                    let between = emit(arch, &other, flags);
                    let again = emit(arch, &first, flags);
                    (fresh, again, between)
                }
            })
            .join()
            .unwrap();
            assert!(
                fresh.0.len() > 256 << 10,
                "{arch}: the code is large enough to be kept"
            );
            assert_ne!(
                fresh.0, between.0,
                "{arch} {flags:#x}: two different programs"
            );
            assert!(
                fresh == again,
                "{arch} flags {flags:#x}: code from reused buffers differs from the fresh compile"
            );
        }
    }
}
