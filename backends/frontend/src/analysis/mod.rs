//! Target-independent facts the backends lower from: which instructions touch the frame,
//! how big a sandboxed program's stack block is, what an access must be checked against,
//! what a back-edge charges the instruction budget, and how constants are blinded.
//!
//! Every rule here is also what the reference evaluator implements, so a rule lives in one
//! place and the differential tests compare like with like.
//!
//! One file per topic, each with its tests; every item is re-exported here, and
//! `analysis::X` is its path:
//!
//! * `liveness.rs`: the registers an instruction reads, what is live where, what the entry
//!   must zero, and whose upper halves some path may read ([`regs_read`], [`live_in`],
//!   [`entry_zeroing`], [`upper_halves_live`]).
//! * `mode.rs`: the validated request ([`CodegenMode`], [`validate_request`]) and the
//!   helper table's inline kinds ([`validate_inline_kinds`]).
//! * `memory.rs`: the sandbox's stack block and which accesses are checked
//!   ([`stack_block_size`], [`is_frame_constant`], [`checked_access`]).
//! * `budget.rs`: what back-edges and calls charge ([`back_edge_charge`], [`CALL_CHARGE`]).
//! * `helpers.rs`: how helpers are lowered and `callx` finds them ([`helper_lowering`],
//!   [`callx_plan`]).
//! * `keys.rs`: array map keys known at compile time ([`constant_array_keys`]) or found in
//!   the frame ([`array_keys`]), and the argument setup an inlined lookup that knows its
//!   key's place no longer needs ([`dead_key_arguments`]).
//! * `emit.rs`: per-program emission setup ([`instruction_labels`], [`EmitCapacity`],
//!   `EmitOptions`).
//! * `blinding.rs`: the constant-blinding mask ([`blinding_mask`]).
//! * `reach.rs`: which instructions can run given the constants the code computes
//!   ([`reachable`]; the runtime's test for poisoned CO-RE relocations).
//! * `tail_position.rs`: the functions reached only through calls in tail position, whose
//!   tail calls the entry makes for them ([`tail_reached`], [`returns_after`]).

mod blinding;
mod budget;
mod emit;
mod helpers;
mod keys;
mod liveness;
mod memory;
mod mode;
mod reach;
mod tail_position;

pub use blinding::blinding_mask;
pub use budget::{back_edge_charge, budget_loops, BudgetLoop, CALL_CHARGE};
pub use emit::{instruction_labels, EmitCapacity, EmitOptions};
pub use helpers::{
    callx_plan, callx_reachable, helper_code, helper_lowering, percpu_plan, ArrayLookup, CallxPlan,
    CpuId, HelperCode, HelperLowering, InlineHelper, PerCpuPlan, ProgArray, CALLX_TABLE_MAX,
    CALLX_TABLE_MIN,
};
pub use keys::{
    array_keys, constant_array_keys, dead_arguments, dead_key_arguments, forwarded_key, ArrayKey,
};
pub use liveness::{
    entry_zeroing, live_in, refuse_reads_after_calls, regs_read, upper_halves_live, LoweringReads,
    ARG_REGS, EXACT_ZEROING_MAX, FRESH_REGS,
};
pub use memory::{checked_access, frame_reach, is_frame_constant, stack_block_size, FRAME_LINE};
pub use mode::{validate_inline_kinds, validate_request, Budget, CodegenMode, MemoryChecks};
pub use reach::reachable;
pub use tail_position::{returns_after, tail_reached};

/// `insns` decoded and verified with helper 1 in the table: the test programs of the
/// submodules.
#[cfg(test)]
fn program(insns: &[[u8; 8]]) -> crate::Program {
    crate::decode(
        &insns.concat(),
        &[packjit_plugin_api::HelperEntry {
            id: 1,
            inline_kind: 0,
            addr: 0x1000,
        }],
    )
    .expect("valid program")
}
