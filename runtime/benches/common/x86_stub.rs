//! A stand-in x86-64 backend for host-native tests and benchmarks of the runtime's
//! program/hook/symbol machinery: it compiles in no time, so benchmarks measure the runtime,
//! not a JIT, and it returns no line table. It accepts only
//! `mov r0, imm ; ... ; exit` shapes: the code returns the first instruction's immediate
//! (sign-extended, like `mov64 r0, imm`), preceded by one 4-byte `nop` per further eBPF
//! instruction so code size follows program length. Not a JIT: never use it for semantics.

use packjit::{Arch, CodeArena, Error, ErrorKind, JitBackend};
use packjit_plugin_api::{install_code, CompileRequest, Compiled};

pub struct X86Stub;

impl JitBackend for X86Stub {
    fn arch(&self) -> Arch {
        Arch::X86_64
    }
    fn name(&self) -> &str {
        "x86-stub"
    }
    fn version(&self) -> &str {
        "0"
    }
    fn supported_features(&self) -> u64 {
        0
    }
    fn detect_features(&self) -> u64 {
        0
    }
    fn compile(&self, req: &CompileRequest<'_>, arena: &dyn CodeArena) -> Result<Compiled, Error> {
        let c = req.code;
        if c.len() < 16 || c.len() % 8 != 0 || c[0] != 0xb7 || c[1] & 0x0f != 0 {
            return Err(Error::new(
                ErrorKind::Verify,
                "x86 stub: program must start with mov r0, imm",
            ));
        }
        let n = c.len() / 8;
        let mut code = Vec::with_capacity(n * 4 + 8);
        for _ in 1..n {
            code.extend_from_slice(&[0x0f, 0x1f, 0x40, 0x00]); // nop dword [rax+0]
        }
        code.extend_from_slice(&[0x48, 0xc7, 0xc0]); // mov rax, simm32
        code.extend_from_slice(&c[4..8]);
        code.push(0xc3); // ret
        install_code(arena, &code, n + 1)
    }
}

/// `mov r0, value ; (len - 2) × mov r1, 0 ; exit`: `len` eBPF instructions.
#[allow(dead_code)]
pub fn ret_prog(value: i32, len: usize) -> Vec<u8> {
    let mut v = vec![0xb7, 0, 0, 0];
    v.extend_from_slice(&value.to_le_bytes());
    for _ in 2..len.max(2) {
        v.extend_from_slice(&[0xb7, 1, 0, 0, 0, 0, 0, 0]);
    }
    v.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    v
}
