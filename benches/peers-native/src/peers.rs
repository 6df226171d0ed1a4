//! The programs and what each peer is known to do wrong with them. Their sources, contexts
//! and helper are `runtime/benches/common/peers_inputs.rs`, shared with
//! `runtime/benches/peers.rs`.

use std::path::Path;

#[path = "../../../runtime/benches/common/peers_inputs.rs"]
mod inputs;
pub use inputs::{clang, input, pj_mix, rbpf_mix, HELPER_ID};

/// `tests/bpf/peers/<name>.c` compiled with `-O2 -g -target bpf <cpu>`.
pub fn compile_object(name: &str, cpu: &str) -> Vec<u8> {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/bpf/peers");
    inputs::compile_object(&sources, name, cpu)
}

/// Programs: (section `peers/<name>`, object). `signed` needs cpu v4 (`sdiv`, `smod`,
/// `movsx`); the others are built for cpu v3 so rbpf runs the same bytecode.
pub const PROGRAMS: &[(&str, &str)] = &[
    ("fnv", "peers"),
    ("xxh", "peers"),
    ("crc32", "peers"),
    ("sort", "peers"),
    ("sieve", "peers"),
    ("parse", "peers"),
    ("signed", "peers_v4"),
    ("calls", "peers"),
    ("helper", "peers"),
    ("words", "peers"),
    ("kv", "peers"),
];

/// What a peer engine is known to do wrong with a program.
#[derive(Clone, Copy)]
pub enum Known {
    /// Compiles it but computes a wrong result: its compile time is shown, its run time not.
    Wrong(&'static str),
    /// Refuses to load or compile it.
    Refuses(&'static str),
}

/// (engine title, program, what it does and why). The bench fails if one of these changes,
/// or if an engine not listed disagrees with packjit.
const KNOWN: &[(&str, &str, Known)] = &[
    (
        "rbpf JIT",
        "calls",
        Known::Wrong(
            "rbpf's JIT gives a bpf-to-bpf callee no stack frame of its own (r10 stays the \
             caller's), so the callee's spills overwrite the caller's locals",
        ),
    ),
    (
        "rbpf JIT",
        "signed",
        Known::Wrong(
            "rbpf 0.4 predates cpu v4: it reads sdiv/smod (off = 1) as div/mod and movsx as mov",
        ),
    ),
    (
        "llvmbpf",
        "signed",
        Known::Wrong(
            "llvmbpf (658ba89) ignores the ALU offset field cpu v4 added: sdiv/smod lift to \
             udiv/urem, movsx to a plain mov",
        ),
    ),
    (
        "ubpf JIT",
        "calls",
        Known::Refuses(
            "ubpf's loader wants each sub-program to end in exit or an unconditional jump, but \
             tests the second-to-last instruction for the jump (insts[end_index - 2] in \
             ubpf_vm.c), so the entry function, which clang ends with `goto`, is refused",
        ),
    ),
];

pub fn known(program: &str, engine: &str) -> Option<Known> {
    KNOWN
        .iter()
        .find(|(e, p, _)| *e == engine && *p == program)
        .map(|(_, _, k)| *k)
}
