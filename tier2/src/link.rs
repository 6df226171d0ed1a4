//! Places a program's compiled functions in one position-independent image: the entry
//! first (the image's first byte is the entry point, as with the baseline), each callee
//! after it at a 16-byte boundary, calls between them patched PC-relative. Nothing else
//! may need relocating: helpers are called through addresses in registers and Cranelift
//! keeps its constants inside each function's own code.

use cranelift_codegen::binemit::Reloc;
use packjit_plugin_api::{Arch, CompileError, ErrorKind, NO_NATIVE_CODE};

/// One function's code, as Cranelift left it.
pub(crate) struct FuncCode {
    pub bytes: Vec<u8>,
    /// `(offset in the function, kind, callee function index, addend)`.
    pub calls: Vec<(u32, Reloc, usize, i64)>,
    /// `(start, end, eBPF slot)` of each run of code with a source location.
    pub srclocs: Vec<(u32, u32, u32)>,
    /// The slot of the function's first instruction: its prologue's line.
    pub first_slot: u32,
}

/// The image and its line table (one entry per bytecode slot).
pub(crate) struct Image {
    pub bytes: Vec<u8>,
    pub line_table: Vec<u32>,
}

pub(crate) fn link(arch: Arch, funcs: &[FuncCode], slots: usize) -> Result<Image, CompileError> {
    let trap = arch.trap_pattern();
    let mut bytes = Vec::new();
    let mut starts = Vec::with_capacity(funcs.len());
    for (k, f) in funcs.iter().enumerate() {
        if k > 0 {
            // Nothing falls into a callee, but a core may speculate straight on past the
            // code before it (a `ret`): a barrier there stops it, as the baseline's
            // sandboxed code has before each callee (the access plan's facts about a
            // callee hold only on its call paths).
            bytes.extend_from_slice(speculation_barrier(arch));
        }
        while bytes.len() % 16 != 0 {
            bytes.push(trap[bytes.len() % trap.len()]);
        }
        starts.push(bytes.len());
        bytes.extend_from_slice(&f.bytes);
    }
    for (f, &start) in funcs.iter().zip(&starts) {
        for &(off, kind, callee, addend) in &f.calls {
            let at = start + off as usize;
            let delta = starts[callee] as i64 + addend - at as i64;
            patch(&mut bytes, at, kind, delta)?;
        }
    }
    // The line table: where each slot's code starts (its lowest address; optimised code
    // interleaves instructions, so this is where a debugger's breakpoint on the line goes).
    // A function's prologue is its first instruction's, as in the baseline's table: an
    // address in it (a profiler's sample, a debugger's stop at the entry) maps to that pc.
    let mut line_table = vec![NO_NATIVE_CODE; slots];
    for (f, &start) in funcs.iter().zip(&starts) {
        if let Some(e) = line_table.get_mut(f.first_slot as usize) {
            *e = start as u32;
        }
        for &(lo, hi, slot) in &f.srclocs {
            if let Some(e) = line_table.get_mut(slot as usize) {
                if hi > lo {
                    *e = (*e).min((start + lo as usize) as u32);
                }
            }
        }
    }
    Ok(Image { bytes, line_table })
}

/// An instruction no core speculates past: `int3` on x86-64, `dsb nsh; isb` on arm64;
/// RV64 defines none (no core is known to speculate past `jal`/`jalr`), so an `ebreak`
/// only keeps the padding recognisable.
fn speculation_barrier(arch: Arch) -> &'static [u8] {
    match arch {
        Arch::X86_64 => &[0xcc],
        Arch::Aarch64 => &[0x9f, 0x37, 0x03, 0xd5, 0xdf, 0x3f, 0x03, 0xd5],
        Arch::Riscv64 => &[0x73, 0x00, 0x10, 0x00],
    }
}

/// Writes a PC-relative call displacement `delta` (target minus the relocated address).
fn patch(bytes: &mut [u8], at: usize, kind: Reloc, delta: i64) -> Result<(), CompileError> {
    let word = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let too_far = || {
        CompileError::new(
            ErrorKind::Encoding,
            format!("optimized tier: a call spans {delta} bytes, out of reach"),
        )
    };
    match kind {
        // x86-64 `call rel32`: the addend (-4) already makes it relative to the next
        // instruction.
        Reloc::X86CallPCRel4 => {
            let d = i32::try_from(delta).map_err(|_| too_far())?;
            bytes[at..at + 4].copy_from_slice(&d.to_le_bytes());
        }
        // arm64 `bl imm26`, in words.
        Reloc::Arm64Call => {
            let d = delta >> 2;
            if !(-(1 << 25)..(1 << 25)).contains(&d) {
                return Err(too_far());
            }
            let insn = word(bytes, at) | (d as u32 & 0x03ff_ffff);
            bytes[at..at + 4].copy_from_slice(&insn.to_le_bytes());
        }
        // RV64 `auipc ra, hi20; jalr ra, lo12(ra)`: lo12 is sign-extended, so hi20 rounds.
        Reloc::RiscvCallPlt => {
            let d = i32::try_from(delta).map_err(|_| too_far())?;
            let hi = (d.wrapping_add(0x800) as u32) & 0xffff_f000;
            let lo = (d.wrapping_sub(hi as i32) as u32) & 0xfff;
            let auipc = word(bytes, at) | hi;
            let jalr = word(bytes, at + 4) | (lo << 20);
            bytes[at..at + 4].copy_from_slice(&auipc.to_le_bytes());
            bytes[at + 4..at + 8].copy_from_slice(&jalr.to_le_bytes());
        }
        other => {
            return Err(CompileError::new(
                ErrorKind::Internal,
                format!("optimized tier: Cranelift asked for a {other:?} relocation, which the image cannot hold"),
            ))
        }
    }
    Ok(())
}
