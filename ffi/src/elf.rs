//! Programs from relocatable eBPF objects (clang), and their global data.

use super::args::{bytes, c_name, out_arg};
use super::error::{boundary, invalid};
use super::options::{load_options, PackjitLoadOptions};
use super::program::{new_program, program, PackjitProgram};
use super::runtime::{runtime, PackjitRuntime};
use core::ffi::c_char;
use packjit_runtime::{ElfLoadOptions, Error, GlobalData, Trust};

/// Loads one program from a relocatable eBPF object (`clang -O2 -target bpf -c`, `obj_len`
/// bytes, read during the call only). Select the program with exactly one of `section` (a
/// code section name, e.g. `"xdp"`; the entry is its first instruction) or `function` (a
/// function symbol); the other must be NULL. Functions it calls are linked in, `extern`
/// functions resolve to the helpers registered under their names, and the object's
/// `.rodata*` / `.data*` / `.bss*` are copied into memory the program owns (read-only /
/// read-write regions under the sandbox); read and write them with
/// `packjit_program_global_*`. `opts` as for `packjit_program_load`. Errors name the
/// section, symbol, relocation type and offset (e.g. `PJ_ERR_UNKNOWN_HELPER` for an
/// unresolved extern, `PJ_ERR_UNSUPPORTED` for maps or unknown relocations,
/// `PJ_ERR_INVALID_ARGUMENT` for malformed objects).
///
/// # Safety
/// `rt` NULL or live; `obj` NULL or readable for `obj_len` bytes; `section` and `function`
/// NULL or NUL-terminated; `opts` NULL or a `PackjitLoadOptions` with `struct_size` set;
/// `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_load_elf(
    rt: *const PackjitRuntime,
    obj: *const u8,
    obj_len: usize,
    section: *const c_char,
    function: *const c_char,
    opts: *const PackjitLoadOptions,
    out: *mut *mut PackjitProgram,
) -> i32 {
    boundary("packjit_program_load_elf", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let (opts, trust) = unsafe { load_options(opts) }?;
        // SAFETY: caller contract.
        let obj = unsafe { bytes(obj, obj_len, "obj") }?;
        // SAFETY: caller contract.
        let sel = match unsafe { (c_name(section, "section")?, c_name(function, "function")?) } {
            (Some(s), None) => ElfLoadOptions::section(&s),
            (None, Some(f)) => ElfLoadOptions::function(&f),
            _ => {
                return Err(invalid(
                    "give exactly one of section and function (the other NULL)",
                ))
            }
        };
        let prog = match trust {
            Trust::Sandboxed => h.rt.load_elf(obj, &sel, &opts)?,
            // SAFETY: PACKJIT_LOAD_TRUSTED is the C caller's promise that the program only
            // touches memory it may (see the flag's documentation).
            Trust::Trusted => unsafe { h.rt.load_elf_trusted(obj, &sel, &opts) }?,
        };
        *out = new_program(&h.rt, prog);
        Ok(())
    })
}

/// # Safety
/// `prog` NULL or live; `name` NULL or NUL-terminated.
unsafe fn globals_of<'a>(
    prog: *const PackjitProgram,
    name: *const c_char,
) -> Result<(&'a GlobalData, String), Error> {
    // SAFETY: caller contract.
    let p = &unsafe { program(prog) }?.prog;
    // SAFETY: caller contract.
    let name = unsafe { c_name(name, "name") }?.ok_or_else(|| invalid("name is NULL"))?;
    let g = p
        .globals()
        .ok_or_else(|| invalid("program was not loaded from an ELF object: it has no globals"))?;
    Ok((g, name))
}

/// Size in bytes of a program's global data `name`: a section (`".data"`, `".bss"`,
/// `".rodata"`, ...) or a data symbol (a global or static variable). Sections win when a
/// symbol has the same name.
///
/// # Safety
/// `prog` NULL or live; `name` NULL (refused) or NUL-terminated; `size` NULL (refused) or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_global_size(
    prog: *const PackjitProgram,
    name: *const c_char,
    size: *mut usize,
) -> i32 {
    boundary("packjit_program_global_size", || {
        // SAFETY: caller contract.
        let size = unsafe { out_arg(size, "size") }?;
        // SAFETY: caller contract.
        let (g, name) = unsafe { globals_of(prog, name) }?;
        *size = g.size_of(&name)?;
        Ok(())
    })
}

/// Copies `len` bytes at `offset` of global data `name` (section or symbol, as for
/// `packjit_program_global_size`) into `buf`. The range must lie inside it. Safe while other
/// threads run the program (bytes are copied one by one with relaxed atomics: a value the
/// program is writing at the same time may be torn).
///
/// # Safety
/// `prog` NULL or live; `name` NULL (refused) or NUL-terminated; `buf` NULL (only with `len`
/// 0) or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_global_read(
    prog: *const PackjitProgram,
    name: *const c_char,
    offset: usize,
    buf: *mut u8,
    len: usize,
) -> i32 {
    boundary("packjit_program_global_read", || {
        // SAFETY: caller contract.
        let (g, name) = unsafe { globals_of(prog, name) }?;
        if buf.is_null() && len != 0 {
            return Err(invalid(format!("buf is NULL but len is {len}")));
        }
        let mut tmp = vec![0u8; len];
        g.read_into(&name, offset, &mut tmp)?;
        if len != 0 {
            // SAFETY: caller contract: `buf` writable for `len` bytes.
            unsafe { core::ptr::copy_nonoverlapping(tmp.as_ptr(), buf, len) };
        }
        Ok(())
    })
}

/// Writes `len` bytes from `data` at `offset` of global data `name` (section or symbol). The
/// host may write `.rodata` too (it is read-only for the program only), e.g. to set a table
/// before the first run.
///
/// # Safety
/// `prog` NULL or live; `name` NULL (refused) or NUL-terminated; `data` NULL (only with
/// `len` 0) or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_global_write(
    prog: *const PackjitProgram,
    name: *const c_char,
    offset: usize,
    data: *const u8,
    len: usize,
) -> i32 {
    boundary("packjit_program_global_write", || {
        // SAFETY: caller contract.
        let (g, name) = unsafe { globals_of(prog, name) }?;
        // SAFETY: caller contract.
        let data = unsafe { bytes(data, len, "data") }?;
        g.write(&name, offset, data)
    })
}
