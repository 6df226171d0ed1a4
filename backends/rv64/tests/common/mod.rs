//! Shared test support: a bytecode builder, a Vec-backed code arena (host-side compiles at a
//! fixed address, so golden disassembly is reproducible) and objdump golden disassembly.
//! Native runs go through `packjit::Runtime` and expected values come from
//! `packjit_testkit::reference` (see exec.rs).
#![allow(dead_code)]

use packjit_plugin_api::{CodeArena, CompileError, ErrorKind, HelperEntry, JitBackend, Region};
use std::cell::RefCell;

/// One raw instruction slot.
pub use packjit_frontend::encode_insn as ins;

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
    compile_with(code, helpers, features, 0, 0)
}

/// [`compile`] with `PJ_COMPILE_*` flags and a blinding key.
pub fn compile_with(
    code: &[u8],
    helpers: &[HelperEntry],
    features: u64,
    flags: u32,
    blind_key: u64,
) -> Result<Vec<u8>, CompileError> {
    let arena = VecArena::default();
    let b = packjit_rv64::Rv64Backend::new();
    let req = packjit_plugin_api::CompileRequest {
        code,
        helpers,
        features,
        flags,
        blind_key,
    };
    let c = b.compile(&req, &arena)?;
    let bytes = arena.bytes.borrow().clone();
    assert_eq!(c.code_size, bytes.len());
    // Instructions only: data in the code (a `callx` table) is not counted.
    let m = packjit_rv64::emit_request(&req)?;
    assert_eq!((c.native_insns, &m.bytes[..]), (m.native_insns, &bytes[..]));
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
    let ok = |c: &mut Command| {
        let out = packjit_testkit::host_tool::output(c).expect("binutils-riscv64-linux-gnu");
        assert!(out.status.success(), "{c:?}");
    };
    ok(Command::new("riscv64-linux-gnu-as")
        .arg(&src)
        .arg("-o")
        .arg(&obj));
    ok(Command::new("riscv64-linux-gnu-objcopy")
        .arg("--strip-all")
        .arg(&obj));
    let out = packjit_testkit::host_tool::output(
        Command::new("riscv64-linux-gnu-objdump")
            .args(["-d", "-M", "numeric"])
            .arg(&obj),
    )
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
