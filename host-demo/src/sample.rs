//! The demo's built-in programs and helpers.

use packjit::Runtime;
use packjit_frontend::{op, RawInsn};

/// Sum of squares below `n` (n read from the context), mixed through helper 1 and written
/// back to the context; uses the stack, a loop, a helper call and 64-bit memory accesses.
pub const SAMPLE_ASM: &str = "
    mov %r6, %r1
    ldxdw %r7, [%r6]
    mov %r0, 0
    mov %r8, 0
loop:
    jge %r8, %r7, done
    mov %r1, %r8
    mul %r1, %r8
    add %r0, %r1
    add %r8, 1
    ja loop
done:
    stxdw [%r10-8], %r0
    mov %r1, %r0
    mov %r2, 3
    call 1
    ldxdw %r1, [%r10-8]
    stxdw [%r6+8], %r1
    exit
";

/// Helper 1: `a * 31 + b`.
pub unsafe extern "C" fn mix(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_mul(31).wrapping_add(b)
}

/// The sample's helper id: the sample's bytecode calls it by number.
pub const MIX_ID: u32 = 1;

/// Where clang objects find `mix` (they call it by name): kernel helper 1 is
/// `bpf_map_lookup_elem`, which a helper registered under id 1 would replace.
pub const MIX_ID_FOR_OBJECTS: u32 = 0x200;

/// Registers `mix` under `id` ([`MIX_ID`] for the built-in sample, [`MIX_ID_FOR_OBJECTS`]
/// when running clang objects, whose map helpers must stay the runtime's).
pub fn register_helpers(rt: &Runtime, id: u32) -> Result<(), String> {
    rt.register_helper(id, "mix", mix)
        .map_err(|e| e.to_string())
}

/// The sample's context: n, then a slot the program writes.
pub fn context(n: u64) -> Vec<u8> {
    let mut ctx = n.to_le_bytes().to_vec();
    ctx.extend_from_slice(&[0; 8]);
    ctx
}

/// What the sample returns for `n`.
pub fn expected(n: u64) -> u64 {
    let sum: u64 = (0..n).fold(0u64, |acc, i| acc.wrapping_add(i.wrapping_mul(i)));
    sum.wrapping_mul(31).wrapping_add(3)
}

/// Program `i` of a mixed-size population: a run of ALU instructions whose length cycles
/// through roughly 64 B to 4 KiB of native code.
pub fn sized_program(i: usize) -> Vec<u8> {
    let n = 8 + (i * 97) % 900;
    let mut code = Vec::with_capacity((n + 2) * 8);
    let ins = |opc, dst, imm| {
        RawInsn {
            opc,
            dst,
            src: 0,
            off: 0,
            imm,
        }
        .to_bytes()
    };
    code.extend_from_slice(&ins(op::CLASS_ALU64 | op::ALU_MOV, 0, i as i32));
    for k in 0..n {
        code.extend_from_slice(&ins(op::CLASS_ALU64 | op::ALU_ADD, 0, k as i32 + 1));
    }
    code.extend_from_slice(&ins(op::CLASS_JMP | op::JMP_EXIT, 0, 0));
    code
}
