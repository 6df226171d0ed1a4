//! What lies at a native address, the perf map and gdb JIT registration.

use super::args::{c_path, check_size, fill_name};
use super::error::boundary;
use super::program::{program, PackjitProgram};
use super::runtime::{runtime, PackjitRuntime};
use super::PACKJIT_NAME_LEN;
use core::ffi::c_char;

/// What lies at a native address, filled by `packjit_symbolize` and `packjit_program_symbol`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitSymbol {
    /// `sizeof(PackjitSymbol)`, set by the caller.
    pub struct_size: u32,
    /// 1 when a live program covers the address (the other fields are then set), else 0.
    pub found: u32,
    /// Program id, unique within its runtime.
    pub id: u64,
    /// Entry address of the program's code.
    pub start: u64,
    /// Bytes of machine code.
    pub size: u64,
    /// Offset of the address from `start`.
    pub offset: u64,
    /// eBPF pc at the address (from the backend's line table), or -1 when unknown.
    pub pc: i64,
    /// NUL-terminated program name (`prog_<id>` unless named; truncated to fit).
    pub name: [c_char; PACKJIT_NAME_LEN],
}

impl Default for PackjitSymbol {
    /// Nothing found, with `struct_size` set: what `packjit_symbolize` and
    /// `packjit_program_symbol` expect to be handed, and what they report for no program.
    fn default() -> Self {
        PackjitSymbol {
            struct_size: size_of::<PackjitSymbol>() as u32,
            found: 0,
            id: 0,
            start: 0,
            size: 0,
            offset: 0,
            pc: -1,
            name: [0; PACKJIT_NAME_LEN],
        }
    }
}

fn write_symbol(out: &mut PackjitSymbol, s: Option<packjit_runtime::SymbolInfo>) {
    *out = PackjitSymbol::default();
    if let Some(s) = s {
        out.found = 1;
        out.id = s.id;
        out.start = s.start;
        out.size = s.size;
        out.offset = s.offset;
        out.pc = s.pc.map_or(-1, |p| p as i64);
        fill_name(&mut out.name, &s.name);
    }
}

/// Which program's native code covers `addr` (an O(log n) search of the runtime's address
/// index). `sym->found` is 0 when none does; that is not an error.
///
/// # Safety
/// `rt` NULL or live; `sym` NULL or a `PackjitSymbol` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_symbolize(
    rt: *const PackjitRuntime,
    addr: u64,
    sym: *mut PackjitSymbol,
) -> i32 {
    boundary("packjit_symbolize", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        unsafe { check_size(sym, "sym") }?;
        // SAFETY: checked.
        write_symbol(unsafe { &mut *sym }, h.rt.symbolize(addr));
        Ok(())
    })
}

/// A program's id, name, address and size (`found` is 0 for a program compiled for another
/// architecture: it has no executable address).
///
/// # Safety
/// `prog` NULL or live; `sym` NULL or a `PackjitSymbol` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_symbol(
    prog: *const PackjitProgram,
    sym: *mut PackjitSymbol,
) -> i32 {
    boundary("packjit_program_symbol", || {
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        // SAFETY: caller contract.
        unsafe { check_size(sym, "sym") }?;
        let s = p
            ._rt
            .symbolize(p.prog.entry_addr())
            .filter(|s| s.id == p.prog.id());
        // SAFETY: checked.
        let out = unsafe { &mut *sym };
        write_symbol(out, s);
        if out.found == 0 {
            out.id = p.prog.id();
            fill_name(&mut out.name, p.prog.name());
        }
        Ok(())
    })
}

/// Writes the perf map (`path`, or `/tmp/perf-<pid>.map` when NULL) and keeps it current as
/// programs are loaded and reclaimed, so `perf report` names JIT code. Lines are padded to
/// one width (leading zeros in the hex size) so that a release updates the file in place;
/// names longer than about 230 bytes are cut. One runtime keeps a given path: another
/// runtime of the process enabling it gets `PJ_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `rt` NULL or live; `path` NULL or a NUL-terminated string (copied).
#[no_mangle]
pub unsafe extern "C" fn packjit_perf_map_enable(
    rt: *const PackjitRuntime,
    path: *const c_char,
) -> i32 {
    boundary("packjit_perf_map_enable", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if path.is_null() {
            h.rt.enable_perf_map()?;
        } else {
            // SAFETY: caller contract.
            let p = unsafe { c_path(path, "path") }?;
            h.rt.enable_perf_map_at(&p)?;
        }
        Ok(())
    })
}

/// Registers the runtime's programs with gdb's JIT interface: those live now and every one
/// loaded (or moved by compaction) later, until its code is reclaimed. In gdb, `break
/// <program name>` then stops in the program (`hbreak` when the arena is dual mapped, the
/// default: gdb cannot write breakpoints into its read-only shared view) and `bt` names it.
/// Idempotent; PJ_ERR_UNSUPPORTED on an architecture gdb registration does not describe.
///
/// # Safety
/// `rt` NULL or live.
#[no_mangle]
pub unsafe extern "C" fn packjit_gdb_jit_enable(rt: *const PackjitRuntime) -> i32 {
    boundary("packjit_gdb_jit_enable", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        h.rt.enable_gdb_jit()
    })
}
