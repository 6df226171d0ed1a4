//! # packjit-asm
//!
//! Text ⇄ eBPF bytecode in the bpf_conformance assembly dialect (RFC 9669, cpu v4): the
//! tool a user reaches for to write a program by hand, read one back, or feed packjit's
//! tests. It depends only on the front end's instruction encoding.
//!
//! ```
//! let code = packjit_asm::asm::assemble("mov %r0, 7\nexit").unwrap();
//! assert_eq!(code.len(), 16);
//! assert!(packjit_asm::disasm::disassemble(&code, false).contains("mov %r0, 7"));
//! ```

pub mod asm;
pub mod disasm;
