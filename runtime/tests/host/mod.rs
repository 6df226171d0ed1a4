//! Shared by the runtime tests that run on whatever machine runs them (natively, or under
//! qemu-user for arm64 and RV64). Each test file compiles this module on its own and uses
//! part of it, hence the `dead_code` allowances.

use packjit::{Runtime, RuntimeConfig};
use std::sync::Arc;

/// A runtime with the backend of the arch these tests run on, linked statically.
#[allow(dead_code)]
pub fn host_runtime() -> Runtime {
    host_runtime_with(RuntimeConfig::default())
}

/// [`host_runtime`] with `config`.
#[allow(dead_code)]
pub fn host_runtime_with(config: RuntimeConfig) -> Runtime {
    let rt = Runtime::with_config(config).unwrap();
    match packjit::Arch::host().unwrap() {
        packjit::Arch::X86_64 => rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new())),
        packjit::Arch::Aarch64 => rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new())),
        packjit::Arch::Riscv64 => rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new())),
    }
    .unwrap();
    rt
}

/// Drops every other item (the first, third, …), keeping the rest in order: freeing every
/// other program leaves holes all over a pack.
#[allow(dead_code)]
pub fn drop_every_other<T>(items: &mut Vec<T>) {
    let mut i = 0;
    items.retain(|_| {
        i += 1;
        i % 2 == 0
    });
}
