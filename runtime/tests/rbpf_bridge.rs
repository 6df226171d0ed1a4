//! rbpf hosts switching to packjit: the same program, helpers and memory give the same
//! result through rbpf's interpreter and through packjit's native code.

use packjit::rbpf_bridge::{c_thunk_for, JitVm};
use packjit::{Arch, Runtime};
use std::sync::Arc;

/// r0 = sqrti(ctx[0..8]) + ctx[8] (a byte), via helper 7 (rbpf's `sqrti`).
const PROG: [u8; 56] = [
    0xbf, 0x16, 0, 0, 0, 0, 0, 0, // mov r6, r1
    0x79, 0x11, 0, 0, 0, 0, 0, 0, // ldxdw r1, [r1]
    0x85, 0, 0, 0, 7, 0, 0, 0, // call 7
    0x71, 0x61, 8, 0, 0, 0, 0, 0, // ldxb r1, [r6+8]
    0x0f, 0x10, 0, 0, 0, 0, 0, 0, // add r0, r1
    0xb7, 0x02, 0, 0, 0, 0, 0, 0, // mov r2, 0
    0x95, 0, 0, 0, 0, 0, 0, 0, // exit
];

fn runtime() -> Arc<Runtime> {
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .unwrap();
    Arc::new(rt)
}

#[test]
fn interpreter_and_jit_agree_with_rbpf_helpers() {
    let rt = runtime();
    let mut vm = JitVm::new(rt.clone(), &PROG);
    vm.register_helper(7, rbpf::helpers::sqrti).unwrap();
    let mut mem = [0u8; 9];
    mem[..8].copy_from_slice(&144u64.to_le_bytes());
    mem[8] = 5;
    assert_eq!(
        vm.execute_program(&mut mem).unwrap(),
        17,
        "rbpf interpreter"
    );
    let native = matches!(
        Arch::host(),
        Some(Arch::Aarch64 | Arch::Riscv64 | Arch::X86_64)
    );
    match vm.jit_compile() {
        Ok(()) => {
            assert!(native);
            assert!(vm.is_jitted());
            assert_eq!(
                vm.execute_program(&mut mem).unwrap(),
                17,
                "packjit native code"
            );
        }
        Err(e) => {
            assert!(!native, "{e}");
            assert!(
                e.to_string().contains("no backend targets this host")
                    || e.to_string().contains("no backend loaded"),
                "{e}"
            );
        }
    }
    // A second VM on the same runtime shares the helper registration.
    let mut vm2 = JitVm::new(rt.clone(), &PROG);
    vm2.register_helper(7, rbpf::helpers::sqrti).unwrap();
    // A different function under the same id is refused.
    let e = vm2.register_helper(7, rbpf::helpers::strcmp).unwrap_err();
    assert!(
        e.message.contains("helper id 7 is already registered"),
        "{e}"
    );
}

#[test]
fn thunks_call_the_bound_function() {
    fn triple(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        a * 3
    }
    let t = c_thunk_for(triple).unwrap();
    // SAFETY: the thunk forwards plain integers to a safe Rust helper.
    assert_eq!(unsafe { t(14, 0, 0, 0, 0) }, 42);
    assert_eq!(
        c_thunk_for(triple).unwrap() as usize,
        t as usize,
        "one slot per function"
    );
}
