//! Shared test support: a bytecode builder, a Vec-backed code arena, objdump golden
//! disassembly, a reference interpreter (RFC 9669 semantics, written independently of the
//! backend) and, on riscv64, a tiny executable mapping to run the emitted code.
#![allow(dead_code)]

use packjit_plugin_api::{CodeArena, CompileError, ErrorKind, HelperEntry, JitBackend, Region};
use std::cell::RefCell;

pub use packjit_lower::RawInsn;

/// One raw instruction slot.
pub fn ins(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    RawInsn {
        opc,
        dst,
        src,
        off,
        imm,
    }
    .to_bytes()
}

/// `lddw dst, imm` (two slots).
pub fn lddw(dst: u8, imm: u64) -> [[u8; 8]; 2] {
    [
        ins(0x18, dst, 0, 0, imm as u32 as i32),
        ins(0, 0, 0, 0, (imm >> 32) as u32 as i32),
    ]
}

pub const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

/// Concatenates slots.
pub fn prog(slots: &[[u8; 8]]) -> Vec<u8> {
    slots.concat()
}

/// A code arena over a `Vec`: what a host would do, minus the mapping.
#[derive(Default)]
pub struct VecArena {
    pub bytes: RefCell<Vec<u8>>,
    pub freed: RefCell<usize>,
}

impl CodeArena for VecArena {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        if size > 1 << 30 {
            return Err(CompileError::new(ErrorKind::Arena, "too big"));
        }
        self.bytes.borrow_mut().resize(size, 0);
        Ok(Region {
            exec_addr: 0x10_0000,
            size: size as u64,
            cookie: 1,
        })
    }
    fn write(&self, _region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        self.bytes.borrow_mut()[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn free(&self, _region: &Region) {
        *self.freed.borrow_mut() += 1;
    }
}

/// Compiles through the `JitBackend` trait into a `VecArena`; returns the bytes.
pub fn compile(
    code: &[u8],
    helpers: &[HelperEntry],
    features: u64,
) -> Result<Vec<u8>, CompileError> {
    let arena = VecArena::default();
    let b = packjit_rv64::Rv64Backend::new();
    let req = packjit_plugin_api::CompileRequest {
        code,
        helpers,
        features,
        flags: 0,
    };
    let c = b.compile(&req, &arena)?;
    let bytes = arena.bytes.borrow().clone();
    assert_eq!(c.code_size, bytes.len());
    assert_eq!(c.native_insns, packjit_rv64::native_insn_count(&bytes));
    Ok(bytes)
}

/// Disassembles with the cross objdump: one `mnemonic operands` line per instruction,
/// 16-bit (compressed) instructions prefixed with `c:`.
pub fn disasm(code: &[u8]) -> Vec<String> {
    use std::process::Command;
    // objdump 2.40 decodes Zba/Zbb only when an ELF's arch attribute names them, so the
    // bytes are wrapped in an object (as + .incbin) whose mapping symbols are stripped
    // (otherwise .incbin counts as data).
    let dir = std::env::temp_dir().join(format!(
        "packjit-rv64-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("code.bin");
    let src = dir.join("code.s");
    let obj = dir.join("code.o");
    std::fs::write(&bin, code).unwrap();
    std::fs::write(
        &src,
        format!(
            ".attribute arch, \"rv64imac_zba_zbb\"\n.text\n.incbin \"{}\"\n",
            bin.display()
        ),
    )
    .unwrap();
    let ok = |c: &mut Command| assert!(c.status().expect("binutils-riscv64-linux-gnu").success());
    ok(Command::new("riscv64-linux-gnu-as")
        .arg(&src)
        .arg("-o")
        .arg(&obj));
    ok(Command::new("riscv64-linux-gnu-objcopy")
        .arg("--strip-all")
        .arg(&obj));
    let out = Command::new("riscv64-linux-gnu-objdump")
        .args(["-d", "-M", "numeric"])
        .arg(&obj)
        .output()
        .expect("riscv64-linux-gnu-objdump is installed");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = Vec::new();
    for l in text.lines() {
        // "   4:\t00078513          \tmv\tx10,x15"
        let parts: Vec<&str> = l.split('\t').collect();
        if parts.len() < 3 || !parts[0].trim_end().ends_with(':') {
            continue;
        }
        let Ok(addr) = usize::from_str_radix(parts[0].trim().trim_end_matches(':'), 16) else {
            continue;
        };
        if addr >= code.len() {
            break;
        }
        let hex = parts[1].trim();
        let mut s = parts[2..].join(" ").trim().to_string();
        if let Some(i) = s.find('#') {
            s.truncate(i);
        }
        let s = s.trim().to_string();
        lines.push(if hex.len() == 4 { format!("c:{s}") } else { s });
    }
    lines
}

// ---- reference interpreter ---------------------------------------------------------------

/// Helpers the reference interpreter and the native tests both know.
pub type Helper = fn(u64, u64, u64, u64, u64) -> u64;

/// Interprets `code` (already accepted by the verifier) with RFC 9669 semantics.
/// `mem` is the context; r1 = its address, r2 = its length. Returns r0, or None on a
/// callx to an unknown helper (the program then ends with u64::MAX).
pub fn interpret(code: &[u8], mem: &mut [u8], helpers: &[(u32, Helper)]) -> u64 {
    let insns: Vec<RawInsn> = code
        .chunks_exact(8)
        .map(|c| RawInsn::from_bytes(c.try_into().unwrap()))
        .collect();
    let mut stack = vec![0u8; 512 * 9];
    let mut frames: Vec<(usize, [u64; 4], u64)> = Vec::new();
    let mut r = [0u64; 11];
    r[1] = mem.as_mut_ptr() as u64;
    r[2] = mem.len() as u64;
    r[10] = stack.as_mut_ptr() as u64 + 512;
    let mut pc = 0usize;
    loop {
        let i = insns[pc];
        pc += 1;
        let class = i.opc & 7;
        let (d, s) = (i.dst as usize, i.src as usize);
        match class {
            4 | 7 => {
                let w64 = class == 7;
                let code = i.opc & 0xf0;
                let x = i.opc & 8 != 0;
                let src = if x { r[s] } else { i.imm as i64 as u64 };
                let a = r[d];
                let v: u64 = if w64 {
                    match code {
                        0x00 => a.wrapping_add(src),
                        0x10 => a.wrapping_sub(src),
                        0x20 => a.wrapping_mul(src),
                        0x30 if i.off == 1 => {
                            if src == 0 {
                                0
                            } else {
                                (a as i64).wrapping_div(src as i64) as u64
                            }
                        }
                        0x30 => a.checked_div(src).unwrap_or(0),
                        0x40 => a | src,
                        0x50 => a & src,
                        0x60 => a << (src & 63),
                        0x70 => a >> (src & 63),
                        0x80 => (a as i64).wrapping_neg() as u64,
                        0x90 if i.off == 1 => {
                            if src == 0 {
                                a
                            } else {
                                (a as i64).wrapping_rem(src as i64) as u64
                            }
                        }
                        0x90 => {
                            if src == 0 {
                                a
                            } else {
                                a % src
                            }
                        }
                        0xa0 => a ^ src,
                        0xb0 if x && i.off != 0 => match i.off {
                            8 => src as i8 as i64 as u64,
                            16 => src as i16 as i64 as u64,
                            _ => src as i32 as i64 as u64,
                        },
                        0xb0 => src,
                        0xc0 => ((a as i64) >> (src & 63)) as u64,
                        0xd0 => match i.imm {
                            16 => (a as u16).swap_bytes() as u64,
                            32 => (a as u32).swap_bytes() as u64,
                            _ => a.swap_bytes(),
                        },
                        _ => unreachable!(),
                    }
                } else {
                    let a = a as u32;
                    let b = src as u32;
                    (match code {
                        0x00 => a.wrapping_add(b),
                        0x10 => a.wrapping_sub(b),
                        0x20 => a.wrapping_mul(b),
                        0x30 if i.off == 1 => {
                            if b == 0 {
                                0
                            } else {
                                (a as i32).wrapping_div(b as i32) as u32
                            }
                        }
                        0x30 => a.checked_div(b).unwrap_or(0),
                        0x40 => a | b,
                        0x50 => a & b,
                        0x60 => a << (b & 31),
                        0x70 => a >> (b & 31),
                        0x80 => (a as i32).wrapping_neg() as u32,
                        0x90 if i.off == 1 => {
                            if b == 0 {
                                a
                            } else {
                                (a as i32).wrapping_rem(b as i32) as u32
                            }
                        }
                        0x90 => {
                            if b == 0 {
                                a
                            } else {
                                a % b
                            }
                        }
                        0xa0 => a ^ b,
                        0xb0 if x && i.off != 0 => match i.off {
                            8 => b as i8 as i32 as u32,
                            _ => b as i16 as i32 as u32,
                        },
                        0xb0 => b,
                        0xc0 => ((a as i32) >> (b & 31)) as u32,
                        0xd0 => {
                            let full = r[d];
                            let v = if x {
                                match i.imm {
                                    16 => (full as u16).swap_bytes() as u64,
                                    32 => (full as u32).swap_bytes() as u64,
                                    _ => full.swap_bytes(),
                                }
                            } else {
                                match i.imm {
                                    16 => full as u16 as u64,
                                    32 => full as u32 as u64,
                                    _ => full,
                                }
                            };
                            r[d] = v;
                            continue;
                        }
                        _ => unreachable!(),
                    }) as u64
                };
                r[d] = v;
            }
            5 | 6 => {
                let code = i.opc & 0xf0;
                let w64 = class == 5;
                match code {
                    0x00 => {
                        let off = if w64 { i.off as i64 } else { i.imm as i64 };
                        pc = (pc as i64 + off) as usize;
                    }
                    0x80 => {
                        if i.opc & 8 != 0 || i.src == 0 {
                            let id = if i.opc & 8 != 0 {
                                r[d]
                            } else {
                                i.imm as u32 as u64
                            };
                            match helpers.iter().find(|h| h.0 as u64 == id) {
                                Some(h) => r[0] = (h.1)(r[1], r[2], r[3], r[4], r[5]),
                                None => return u64::MAX,
                            }
                        } else {
                            frames.push((pc, [r[6], r[7], r[8], r[9]], r[10]));
                            r[10] += 512;
                            pc = (pc as i64 + i.imm as i64) as usize;
                        }
                    }
                    0x90 => match frames.pop() {
                        None => return r[0],
                        Some((ret, saved, fp)) => {
                            pc = ret;
                            r[6..10].copy_from_slice(&saved);
                            r[10] = fp;
                        }
                    },
                    _ => {
                        let (a, b) = if i.opc & 8 != 0 {
                            (r[d], r[s])
                        } else {
                            (r[d], i.imm as i64 as u64)
                        };
                        let (a, b) = if w64 {
                            (a, b)
                        } else {
                            (a as u32 as u64, b as u32 as u64)
                        };
                        let (sa, sb) = if w64 {
                            (a as i64, b as i64)
                        } else {
                            (a as u32 as i32 as i64, b as u32 as i32 as i64)
                        };
                        let t = match code {
                            0x10 => a == b,
                            0x20 => a > b,
                            0x30 => a >= b,
                            0x40 => a & b != 0,
                            0x50 => a != b,
                            0x60 => sa > sb,
                            0x70 => sa >= sb,
                            0xa0 => a < b,
                            0xb0 => a <= b,
                            0xc0 => sa < sb,
                            0xd0 => sa <= sb,
                            _ => unreachable!(),
                        };
                        if t {
                            pc = (pc as i64 + i.off as i64) as usize;
                        }
                    }
                }
            }
            0 => {
                let hi = insns[pc].imm as u32 as u64;
                r[d] = (i.imm as u32 as u64) | (hi << 32);
                pc += 1;
            }
            1 => {
                let addr = r[s].wrapping_add(i.off as i64 as u64);
                let sx = i.opc & 0xe0 == 0x80;
                // SAFETY: test programs only address the context or their stack.
                let v = unsafe {
                    match (i.opc & 0x18, sx) {
                        (0x10, false) => *(addr as *const u8) as u64,
                        (0x10, true) => *(addr as *const i8) as i64 as u64,
                        (0x08, false) => (addr as *const u16).read_unaligned() as u64,
                        (0x08, true) => (addr as *const i16).read_unaligned() as i64 as u64,
                        (0x00, false) => (addr as *const u32).read_unaligned() as u64,
                        (0x00, true) => (addr as *const i32).read_unaligned() as i64 as u64,
                        _ => (addr as *const u64).read_unaligned(),
                    }
                };
                r[d] = v;
            }
            2 | 3 => {
                let addr = r[d].wrapping_add(i.off as i64 as u64);
                let size = i.opc & 0x18;
                if class == 3 && i.opc & 0xe0 == 0xc0 {
                    // SAFETY: as above; single-threaded, so plain read-modify-write.
                    unsafe {
                        let dw = size == 0x18;
                        let old = if dw {
                            *(addr as *const u64)
                        } else {
                            *(addr as *const u32) as u64
                        };
                        let sv = r[s];
                        let (new, fetch_into): (u64, Option<usize>) = match i.imm {
                            0x00 | 0x01 => (old.wrapping_add(sv), (i.imm == 1).then_some(s)),
                            0x40 | 0x41 => (old | sv, (i.imm == 0x41).then_some(s)),
                            0x50 | 0x51 => (old & sv, (i.imm == 0x51).then_some(s)),
                            0xa0 | 0xa1 => (old ^ sv, (i.imm == 0xa1).then_some(s)),
                            0xe1 => (sv, Some(s)),
                            0xf1 => {
                                let eq = if dw {
                                    old == r[0]
                                } else {
                                    old as u32 == r[0] as u32
                                };
                                (if eq { sv } else { old }, Some(0))
                            }
                            _ => unreachable!(),
                        };
                        if dw {
                            *(addr as *mut u64) = new;
                        } else {
                            *(addr as *mut u32) = new as u32;
                        }
                        if let Some(t) = fetch_into {
                            r[t] = old;
                        }
                    }
                    continue;
                }
                let v = if class == 3 {
                    r[s]
                } else {
                    i.imm as i64 as u64
                };
                // SAFETY: as above.
                unsafe {
                    match size {
                        0x10 => *(addr as *mut u8) = v as u8,
                        0x08 => (addr as *mut u16).write_unaligned(v as u16),
                        0x00 => (addr as *mut u32).write_unaligned(v as u32),
                        _ => (addr as *mut u64).write_unaligned(v),
                    }
                }
            }
            _ => unreachable!(),
        }
    }
}

// ---- running native code (riscv64 only) ------------------------------------------------------

/// Maps `code` executable (RW, copy, then RX: never both), runs it with `mem` as the
/// context, and unmaps it.
#[cfg(target_arch = "riscv64")]
pub fn run_native(code: &[u8], mem: &mut [u8]) -> u64 {
    unsafe {
        let len = (code.len() + 4095) & !4095;
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, code.len());
        assert_eq!(libc::mprotect(p, len, libc::PROT_READ | libc::PROT_EXEC), 0);
        // riscv_flush_icache(start, end, 0): required on hardware, harmless under qemu.
        libc::syscall(259, p as usize, p as usize + len, 0usize);
        let f: extern "C" fn(*mut u8, u64) -> u64 = std::mem::transmute(p);
        let r = f(mem.as_mut_ptr(), mem.len() as u64);
        libc::munmap(p, len);
        r
    }
}
