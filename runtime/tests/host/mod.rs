//! Shared by the runtime tests that run on whatever machine runs them (natively, or under
//! qemu-user for arm64 and RV64). Each test file compiles this module on its own and uses
//! part of it, hence the `dead_code` allowances.

use packjit::{Compaction, Program, Runtime, RuntimeConfig};
use std::path::Path;
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

/// One eBPF instruction, encoded.
#[allow(dead_code)]
pub fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let o = off.to_le_bytes();
    let i = imm.to_le_bytes();
    [op, src << 4 | dst, o[0], o[1], i[0], i[1], i[2], i[3]]
}

/// `mov r0, k - (n - 2) ; (n - 2) x add r0, 1 ; exit`: returns k, n instructions long (an
/// `add r0, 0` could be compiled to nothing).
#[allow(dead_code)]
pub fn sized(n: usize, k: i32) -> Vec<u8> {
    let mut v = insn(0xb7, 0, 0, 0, k - (n as i32 - 2).max(0)).to_vec();
    for _ in 2..n {
        v.extend_from_slice(&insn(0x07, 0, 0, 0, 1));
    }
    v.extend_from_slice(&insn(0x95, 0, 0, 0, 0));
    v
}

/// Compaction at any fragmentation, in every free or swap that releases chunks, with room to
/// move all.
#[allow(dead_code)]
pub fn eager() -> Option<Compaction> {
    Some(Compaction {
        threshold_permille: 0,
        step_bytes: 1 << 20,
    })
}

/// Every program of `live` is in the symbol index and the perf map at `map` exactly once, at
/// its current address, and nothing else is.
#[allow(dead_code)]
pub fn assert_listed_once<'a>(rt: &Runtime, live: impl Iterator<Item = &'a Program>, map: &Path) {
    let live: Vec<&Program> = live.collect();
    let listed: Vec<(u64, u64)> = rt.symbols().iter().map(|s| (s.id, s.start)).collect();
    let mut want: Vec<(u64, u64)> = live.iter().map(|p| (p.id(), p.entry_addr())).collect();
    want.sort_by_key(|&(_, a)| a);
    assert_eq!(listed, want);
    // Read as perf reads a line: hex start, one separator, hex size, one separator, the name.
    let text = std::fs::read_to_string(map).unwrap();
    let mut lines: Vec<(u64, u64, String)> = text
        .lines()
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let hex = |f: Option<&str>| u64::from_str_radix(f.unwrap(), 16).unwrap();
            (
                hex(it.next()),
                hex(it.next()),
                it.next().unwrap().to_string(),
            )
        })
        .collect();
    lines.sort();
    let mut expect: Vec<(u64, u64, String)> = live
        .iter()
        .map(|p| (p.entry_addr(), p.code_size() as u64, p.name().to_string()))
        .collect();
    expect.sort();
    assert_eq!(lines, expect);
}
