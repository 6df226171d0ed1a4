//! The inlined built-ins every backend's golden test disassembles (issue #13): one helper
//! table and four programs, so the three arches show the same sequences side by side.

use packjit_frontend::encode_insn as ins;
use packjit_plugin_api::abi::*;
use packjit_plugin_api::HelperEntry;

/// glibc-like rseq `cpu_id` offset from the thread pointer (`__rseq_offset + 4`).
pub const CPU_ID_OFFSET: i64 = -0x58 + 4;
/// Where the clock's scale would live (only disassembled, never run).
pub const CLOCK_SCALE: u64 = 0x7f00_1234_5000;
/// Where the per-CPU table would live (only disassembled, never run).
pub const PERCPU_TABLE: u64 = 0x7f00_1234_6000;

/// The helper table: CPU id (rseq), clock (counter), per-CPU lookup, and the per-CPU
/// address instruction's table entry.
pub fn helpers() -> Vec<HelperEntry> {
    vec![
        HelperEntry {
            id: PJ_HELPER_GET_SMP_PROCESSOR_ID,
            inline_kind: PJ_INLINE_RSEQ_CPU_ID,
            addr: CPU_ID_OFFSET as u64,
        },
        HelperEntry {
            id: PJ_HELPER_KTIME_GET_NS,
            inline_kind: PJ_INLINE_COUNTER_CLOCK,
            addr: CLOCK_SCALE,
        },
        HelperEntry {
            id: PJ_HELPER_PERCPU_LOOKUP,
            inline_kind: PJ_INLINE_PERCPU_LOOKUP,
            addr: PERCPU_TABLE,
        },
        HelperEntry {
            id: PJ_HELPER_PERCPU_OFFSET,
            inline_kind: PJ_INLINE_NONE,
            addr: PERCPU_TABLE,
        },
    ]
}

/// `(name, bytecode, PJ_COMPILE_* flags)`: `r0 = cpu id`, `r0 = clock`, `r0 = lookup(0, 3)`
/// and `r0 = r1 + this CPU's slot offset of array 0` (the per-CPU address instruction).
pub fn programs() -> Vec<(&'static str, Vec<u8>, u32)> {
    let exit = ins(0x95, 0, 0, 0, 0);
    vec![
        ("cpu id", [ins(0x85, 0, 0, 0, 8), exit].concat(), 0),
        ("clock", [ins(0x85, 0, 0, 0, 5), exit].concat(), 0),
        (
            "per-CPU lookup",
            [
                ins(0xb7, 1, 0, 0, 0),
                ins(0xb7, 2, 0, 0, 3),
                ins(0x85, 0, 0, 0, PJ_HELPER_PERCPU_LOOKUP as i32),
                exit,
            ]
            .concat(),
            0,
        ),
        (
            "per-CPU mov",
            [ins(0xbf, 0, 1, PJ_MOV_OFF_PERCPU, 0), exit].concat(),
            PJ_COMPILE_PERCPU_INSN,
        ),
    ]
}

/// The `callx` table case every backend's golden test checks: six called helpers at ids 1–7
/// without 4 (a hole), at `base + 16 × id`.
pub fn dense_callx_helpers(base: u64) -> Vec<HelperEntry> {
    [1u32, 2, 3, 5, 6, 7]
        .iter()
        .map(|&id| HelperEntry {
            id,
            inline_kind: 0,
            addr: base + u64::from(id) * 16,
        })
        .collect()
}

/// The table [`dense_callx_helpers`] compiles to: ids 0–7, 0 where there is no helper, as
/// the little-endian bytes in the code image.
pub fn dense_callx_table(base: u64) -> Vec<u8> {
    (0..8u64)
        .flat_map(|id| {
            let addr = if id == 0 || id == 4 {
                0
            } else {
                base + id * 16
            };
            addr.to_le_bytes()
        })
        .collect()
}
