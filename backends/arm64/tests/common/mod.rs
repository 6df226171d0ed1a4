//! Shared helpers for the arm64 backend tests: a tiny eBPF assembler and a Vec-backed arena.
#![allow(dead_code)]

#[cfg(target_arch = "aarch64")]
pub mod exec;

use packjit_plugin_api::{CodeArena, CompileError, ErrorKind, HelperEntry, Region};
use std::cell::RefCell;

/// One raw instruction slot.
pub use packjit_frontend::encode_insn as ins;

/// `lddw dst, imm` (two slots).
pub fn lddw(dst: u8, imm: u64) -> Vec<[u8; 8]> {
    vec![
        ins(0x18, dst, 0, 0, imm as u32 as i32),
        ins(0, 0, 0, 0, (imm >> 32) as u32 as i32),
    ]
}

pub const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

/// Concatenates slots into bytecode.
pub fn prog(insns: &[[u8; 8]]) -> Vec<u8> {
    insns.concat()
}

pub fn helper(id: u32, addr: u64) -> HelperEntry {
    HelperEntry {
        id,
        inline_kind: 0,
        addr,
    }
}

/// A code arena backed by a Vec: regions are handed out at a fake executable address.
/// Enough to exercise the `JitBackend::compile` path on a foreign host.
#[derive(Default)]
pub struct VecArena {
    pub mem: RefCell<Vec<u8>>,
    pub freed: RefCell<usize>,
    pub fail_alloc: bool,
}

pub const VEC_ARENA_BASE: u64 = 0x7000_0000;

impl CodeArena for VecArena {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        if self.fail_alloc {
            return Err(CompileError::new(ErrorKind::Arena, "test arena is full"));
        }
        let mut mem = self.mem.borrow_mut();
        let start = mem.len();
        mem.resize(start + size.div_ceil(64) * 64, 0);
        Ok(Region {
            exec_addr: VEC_ARENA_BASE + start as u64,
            size: size as u64,
            cookie: start as u64,
        })
    }

    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        let start = region.cookie as usize + offset;
        self.mem.borrow_mut()[start..start + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn free(&self, _region: &Region) {
        *self.freed.borrow_mut() += 1;
    }
}
