//! Bad input becomes a `CompileError` naming pc and reason — through the Rust trait and
//! through the exported plugin vtable — never a panic.

mod common;
use common::*;
use packjit_plugin_api::{
    host::LoadedBackend, Arch, CompileRequest, ErrorKind, HelperEntry, JitBackend, PjBackendVtable,
};
use packjit_rv64::{Rv64Backend, SUPPORTED_FEATURES};

fn err(
    code: &[u8],
    helpers: &[HelperEntry],
    features: u64,
    flags: u32,
) -> packjit_plugin_api::CompileError {
    let arena = VecArena::default();
    let req = CompileRequest {
        code,
        helpers,
        features,
        flags,
        blind_key: 0,
    };
    Rv64Backend::new().compile(&req, &arena).unwrap_err()
}

#[test]
fn unknown_helper_names_pc_and_id() {
    let e = err(
        &prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x85, 0, 0, 0, 42), EXIT]),
        &[],
        0,
        0,
    );
    assert_eq!(e.kind, ErrorKind::UnknownHelper);
    assert_eq!(e.pc, Some(1));
    assert_eq!(e.to_string(), "pc 1: call to unknown helper id 42");
}

#[test]
fn bad_flags_and_unknown_features_are_refused() {
    let code = prog(&[ins(0xb7, 0, 0, 0, 0), EXIT]);
    let e = err(&code, &[], 0, 1 << 7);
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_eq!(
        e.message, "unknown compile flags 0x80 (defined: 0xf)",
        "the front end's message"
    );
    let e = err(&code, &[], SUPPORTED_FEATURES | 1 << 9, 0);
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_eq!(
        e.message,
        "unknown riscv64 feature bits 0x200 (supported: 0x7)"
    );
}

#[test]
fn verifier_errors_carry_the_pc() {
    let e = err(
        &prog(&[ins(0xb7, 0, 0, 0, 0), ins(0xf7, 1, 0, 0, 0), EXIT]),
        &[],
        0,
        0,
    );
    assert_eq!((e.kind, e.pc), (ErrorKind::Verify, Some(1)));
    assert_eq!(e.to_string(), "pc 1: unknown opcode 0xf7");
    let e = err(&prog(&[ins(0xb7, 0, 0, 0, 0)]), &[], 0, 0);
    assert_eq!(
        e.to_string(),
        "pc 0: falls through past the end of the program"
    );
    let e = err(&prog(&[ins(0xbf, 10, 1, 0, 0), EXIT]), &[], 0, 0);
    assert_eq!(e.to_string(), "pc 0: r10 (the frame pointer) is read-only");
    let e = err(&[], &[], 0, 0);
    assert_eq!(e.kind, ErrorKind::Verify);
}

#[test]
fn a_failed_compile_allocates_nothing() {
    let arena = VecArena::default();
    let code = prog(&[ins(0x85, 0, 0, 0, 3), EXIT]);
    let req = CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: 0,
        blind_key: 0,
    };
    assert!(Rv64Backend::new().compile(&req, &arena).is_err());
    assert!(arena.bytes.borrow().is_empty());
}

#[test]
fn plugin_vtable_round_trip() {
    extern "C" {
        fn packjit_rv64_plugin_v1() -> *const PjBackendVtable;
    }
    // SAFETY: the symbol is this crate's exported entry; its vtable is 'static.
    let b = unsafe {
        LoadedBackend::from_vtable(
            packjit_rv64_plugin_v1(),
            "rv64 (static)",
            Some(Arch::Riscv64),
        )
    }
    .expect("vtable validates");
    assert_eq!(b.arch(), Arch::Riscv64);
    assert_eq!(b.name(), "packjit-rv64");
    assert_eq!(b.version(), env!("CARGO_PKG_VERSION"));
    assert_eq!(b.supported_features(), SUPPORTED_FEATURES);
    #[cfg(not(target_arch = "riscv64"))]
    assert_eq!(b.detect_features(), 0);
    // Errors cross the C boundary with kind, pc and message intact.
    let arena = VecArena::default();
    let code = prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x85, 0, 0, 0, 9), EXIT]);
    let e = b
        .compile(
            &CompileRequest {
                code: &code,
                helpers: &[],
                features: 0,
                flags: 0,
                blind_key: 0,
            },
            &arena,
        )
        .unwrap_err();
    assert_eq!((e.kind, e.pc), (ErrorKind::UnknownHelper, Some(1)));
    assert_eq!(e.message, "call to unknown helper id 9");
    // And a good program compiles through it to the same bytes as the rlib path.
    let code = prog(&[ins(0xb7, 0, 0, 0, 7), EXIT]);
    let c = b
        .compile(
            &CompileRequest {
                code: &code,
                helpers: &[],
                features: 0,
                flags: 0,
                blind_key: 0,
            },
            &arena,
        )
        .unwrap();
    assert_eq!(
        arena.bytes.borrow().as_slice(),
        compile(&code, &[], 0).unwrap().as_slice()
    );
    assert_eq!(c.native_insns, 2);
}

#[test]
fn cpuinfo_parsing() {
    use packjit_rv64::detect::parse_cpuinfo;
    use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
    let two_harts = "processor\t: 0\nisa\t\t: rv64imafdc_zicsr_zba_zbb\n\nprocessor\t: 1\nisa\t\t: rv64imafdc_zba\n";
    assert_eq!(parse_cpuinfo(two_harts), FEATURE_C | FEATURE_ZBA);
    assert_eq!(parse_cpuinfo("isa : rv64imafd_zbb\n"), FEATURE_ZBB);
    assert_eq!(parse_cpuinfo("model name : x86\n"), 0);
}
