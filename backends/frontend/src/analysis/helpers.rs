//! Helper calls: how a backend lowers each helper-table entry (a call, or inline code), and
//! how a `callx` site finds the helper its register names (compares, or a table by id).

use packjit_plugin_api::{
    ErrorKind, HelperEntry, PjArrayMap, PjProgArray, PJ_ARRAY_NOT_PERCPU,
    PJ_HELPER_CALLEE_TAIL_CALL, PJ_HELPER_GET_SMP_PROCESSOR_ID, PJ_HELPER_LOOKUP_VALUES,
    PJ_HELPER_PERCPU_OFFSET, PJ_HELPER_STATIC_REGIONS, PJ_INLINE_ARRAY_LOOKUP,
    PJ_INLINE_COUNTER_CLOCK, PJ_INLINE_PERCPU_LOOKUP, PJ_INLINE_PROG_ARRAY_TAIL_CALL,
    PJ_INLINE_RSEQ_CPU_ID, PJ_INLINE_TAIL_CALL,
};

/// What `call imm` to one helper-table entry becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelperLowering {
    /// Code the backend emits in place (`CallHooks::call_helper`; also a `callx` match).
    Code(HelperCode),
    /// A tail call (`PJ_INLINE_TAIL_CALL`): call the chooser at `chooser`, then leave the
    /// frame and jump to the entry it returned, if any. The driver lowers it
    /// ([`crate::lower`]) with the backend's `call_helper` and `tail_jump`.
    TailCall {
        /// The host's `fn(ctx, prog_array, index) -> entry or 0`.
        chooser: u64,
    },
    /// An array map lookup (`PJ_INLINE_ARRAY_LOOKUP`), expanded by the driver into
    /// ordinary operations ([`crate::lower`]): no backend code of its own.
    ArrayLookup(ArrayLookup),
    /// A tail call through a prog array known at compile time
    /// (`PJ_INLINE_PROG_ARRAY_TAIL_CALL`): the driver expands the kernel's sequence into
    /// ordinary operations ([`crate::lower`]), then the backend's `tail_jump`.
    ProgArrayTailCall(ProgArray),
}

/// A prog array's slots, as an inlined tail call indexes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgArray {
    /// Slot 0: `max_entries` words, each 0 or a `PjTailTarget`'s address.
    pub slots: u64,
    /// Slots.
    pub max_entries: u32,
    /// `PjProgArray::index_slots`: 0, or a power of two of readable slots.
    pub index_slots: u32,
}

/// The code a backend emits for a helper-table entry at a `call imm` or a `callx` match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelperCode {
    /// `call` the `extern "C"` function at this address.
    Call(u64),
    /// The helper's body, inline; r1-r5 stay intact.
    Inline(InlineHelper),
}

/// The helpers a backend emits inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InlineHelper {
    /// r0 = the `u32` at `thread pointer + offset` (this thread's rseq `cpu_id`), zero-extended.
    RseqCpuId {
        /// Signed byte offset from the thread pointer.
        offset: i64,
    },
    /// r0 = monotonic nanoseconds from the CPU counter, scaled by the `PjClockScale` the code
    /// reads at `scale` when it runs.
    CounterClock {
        /// Address of the host's `PjClockScale`.
        scale: u64,
    },
    /// r0 = this CPU's element `r2` of per-CPU array `r1`, or 0 (see
    /// `PJ_INLINE_PERCPU_LOOKUP`); the code reads the table at `table` when it runs.
    PerCpuLookup {
        /// Address of the host's `PjPerCpuTable` (arrays follow it).
        table: u64,
    },
}

/// An array map's layout, as the inlined lookup uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayLookup {
    /// Element 0.
    pub base: u64,
    /// Bytes from one element to the next.
    pub value_stride: u64,
    /// Elements.
    pub max_entries: u32,
    /// Per-CPU arrays: the id in the per-CPU lookup table.
    pub percpu_id: Option<u32>,
}

impl ArrayLookup {
    /// What a lookup of `key` answers: element `key`'s address, or 0 (NULL) past the end.
    /// Not for per-CPU arrays, whose element depends on the CPU.
    pub fn element(&self, key: u32) -> u64 {
        if key < self.max_entries {
            self.base.wrapping_add(u64::from(key) * self.value_stride)
        } else {
            0
        }
    }
}

/// The lowering of `h` (its kind already checked by
/// [`validate_inline_kinds`](super::validate_inline_kinds)).
pub fn helper_lowering(h: &HelperEntry) -> HelperLowering {
    match h.inline_kind {
        PJ_INLINE_RSEQ_CPU_ID => inline(InlineHelper::RseqCpuId {
            offset: h.addr as i64,
        }),
        PJ_INLINE_COUNTER_CLOCK => inline(InlineHelper::CounterClock { scale: h.addr }),
        PJ_INLINE_PERCPU_LOOKUP => inline(InlineHelper::PerCpuLookup { table: h.addr }),
        PJ_INLINE_TAIL_CALL => HelperLowering::TailCall { chooser: h.addr },
        PJ_INLINE_PROG_ARRAY_TAIL_CALL => {
            // SAFETY: the kind's contract: `addr` points to a `PjProgArray` the host keeps
            // alive and unchanged while it compiles (`validate_inline_kinds` refused NULL).
            let array = unsafe { std::ptr::read_unaligned(h.addr as *const PjProgArray) };
            // A padding the mask could not use (not a power of two covering the slots, or
            // too wide for an immediate) counts as none.
            let padded = array.index_slots.is_power_of_two()
                && array.index_slots >= array.max_entries
                && array.index_slots <= 1 << 30;
            HelperLowering::ProgArrayTailCall(ProgArray {
                slots: array.slots,
                max_entries: array.max_entries,
                index_slots: if padded { array.index_slots } else { 0 },
            })
        }
        PJ_INLINE_ARRAY_LOOKUP => {
            // SAFETY: the kind's contract (`PJ_INLINE_ARRAY_LOOKUP`): `addr` points to a
            // `PjArrayMap` the host keeps alive and unchanged while it compiles, and
            // `validate_inline_kinds` refused a NULL one.
            let map = unsafe { std::ptr::read_unaligned(h.addr as *const PjArrayMap) };
            HelperLowering::ArrayLookup(ArrayLookup {
                base: map.base,
                value_stride: map.value_stride,
                max_entries: map.max_entries,
                percpu_id: (map.percpu_id != PJ_ARRAY_NOT_PERCPU).then_some(map.percpu_id),
            })
        }
        _ => HelperLowering::Code(HelperCode::Call(h.addr)),
    }
}

fn inline(helper: InlineHelper) -> HelperLowering {
    HelperLowering::Code(HelperCode::Inline(helper))
}

/// The code for an entry the driver hands a backend (`CallHooks::call_helper`, a `callx`
/// match): never a tail call or an array lookup, which the driver expands itself and
/// [`callx_reachable`] keeps out of `callx` plans.
pub fn helper_code(h: &HelperEntry) -> HelperCode {
    match helper_lowering(h) {
        HelperLowering::Code(code) => code,
        expansion => {
            unreachable!("{expansion:?} is the driver's expansion, never emitted by a backend")
        }
    }
}

/// Does `h` run in place of a call at a `callx` match (an inline body a backend emits, or
/// a call)? Tail calls and array lookups are driver expansions tied to `call imm` (their
/// arguments are the program's map references): a `callx` never reaches them.
pub fn callx_reachable(h: &HelperEntry) -> bool {
    matches!(helper_lowering(h), HelperLowering::Code(_))
}

/// How a `callx` site finds the helper its register names (by id, as `call imm` does).
/// Where a per-CPU address instruction (`Op::MovPerCpu`) finds its table and the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerCpuPlan {
    /// Address of the host's `PjPerCpuTable` (the `PJ_HELPER_PERCPU_OFFSET` entry's).
    pub table: u64,
    /// How the CPU id is had (helper 8's entry).
    pub cpu: CpuId,
}

/// Where a per-CPU address instruction gets the CPU id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuId {
    /// Called: the helper at this address (the caller-saved eBPF registers kept around it).
    Call(u64),
    /// Loaded: the `u32` at `thread pointer + offset`, the rseq area's `cpu_id`.
    Rseq { offset: i64 },
}

/// The per-CPU plan of a helper table, or why it has none: a missing entry
/// (`UnknownHelper`) or a CPU id that is neither called nor the rseq load (`Unsupported`).
pub fn percpu_plan(helpers: &[HelperEntry]) -> Result<PerCpuPlan, (ErrorKind, String)> {
    let entry = |id: u32| {
        helpers.iter().find(|h| h.id == id).ok_or_else(|| {
            (
                ErrorKind::UnknownHelper,
                format!("per-CPU mov needs helper id {id:#x} in the helper table"),
            )
        })
    };
    let table = entry(PJ_HELPER_PERCPU_OFFSET)?.addr;
    match helper_lowering(entry(PJ_HELPER_GET_SMP_PROCESSOR_ID)?) {
        HelperLowering::Code(HelperCode::Call(addr)) => Ok(PerCpuPlan {
            table,
            cpu: CpuId::Call(addr),
        }),
        HelperLowering::Code(HelperCode::Inline(InlineHelper::RseqCpuId { offset })) => {
            Ok(PerCpuPlan {
                table,
                cpu: CpuId::Rseq { offset },
            })
        }
        _ => Err((
            ErrorKind::Unsupported,
            "per-CPU mov: helper 8 must be a call or the inline rseq load".into(),
        )),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallxPlan {
    /// Helpers compared for one by one, first, in this order: the inlined ones, then the
    /// called ones `table` does not hold (all of them when there is no table).
    pub compared: Vec<HelperEntry>,
    /// `table[id]`: the address of called helper `id`, or 0 where there is none. Present
    /// when enough called ids are small and dense (see [`callx_plan`]): the site then
    /// bounds-checks the id, loads the address and tests it for 0, a constant number of
    /// instructions instead of a compare and an address per helper. A backend places the
    /// table in the code image (it is data: never executed, and not counted as
    /// instructions).
    pub table: Option<Vec<u64>>,
}

/// Below this many tabled helpers a `callx` site compares ids; from here on a table is
/// shorter and constant-time.
pub const CALLX_TABLE_MIN: usize = 4;

/// The largest `callx` table: 512 entries (4 KiB of code image per program). Ids from here
/// up (packjit's own built-ins, say) are compared for.
pub const CALLX_TABLE_MAX: usize = 512;

/// The helpers a `callx` can reach, and which go in a table: the first entry for an id wins
/// (as in `CompileRequest::helper`), and the per-CPU table entry is not callable. Called
/// helpers with ids under [`CALLX_TABLE_MAX`] form a table when there are at least
/// [`CALLX_TABLE_MIN`] of them and the largest id is under 4 × their count (holes stay a
/// minority of the table's bytes); a helper at address 0 counts as none.
pub fn callx_plan(helpers: &[HelperEntry]) -> CallxPlan {
    let mut seen = std::collections::HashSet::new();
    let (mut inlined, mut called) = (Vec::new(), Vec::new());
    for h in helpers {
        if h.id == PJ_HELPER_PERCPU_OFFSET
            || h.id == PJ_HELPER_STATIC_REGIONS
            || h.id == PJ_HELPER_LOOKUP_VALUES
            || h.id == PJ_HELPER_CALLEE_TAIL_CALL
            || !seen.insert(h.id)
            || !callx_reachable(h)
        {
            continue;
        }
        match helper_code(h) {
            HelperCode::Call(_) => called.push(*h),
            HelperCode::Inline(_) => inlined.push(*h),
        }
    }
    let small: Vec<&HelperEntry> = called
        .iter()
        .filter(|h| (h.id as usize) < CALLX_TABLE_MAX)
        .collect();
    let max_id = small.iter().map(|h| h.id as usize).max().unwrap_or(0);
    let table = (small.len() >= CALLX_TABLE_MIN && max_id < 4 * small.len()).then(|| {
        let mut t = vec![0u64; max_id + 1];
        for h in &small {
            t[h.id as usize] = h.addr;
        }
        t
    });
    let tabled = |h: &HelperEntry| table.is_some() && (h.id as usize) < CALLX_TABLE_MAX;
    let mut compared = inlined;
    compared.extend(called.iter().filter(|h| !tabled(h)));
    CallxPlan { compared, table }
}

#[cfg(test)]
mod tests {
    use super::*;
    use packjit_plugin_api::PJ_INLINE_NONE;

    #[test]
    fn callx_tables_need_enough_dense_called_helpers() {
        let h = |id, inline_kind, addr| HelperEntry {
            id,
            inline_kind,
            addr,
        };
        let called = |ids: &[u32]| -> Vec<HelperEntry> {
            ids.iter()
                .map(|&id| h(id, PJ_INLINE_NONE, 0x1000 + id as u64))
                .collect()
        };
        // Dense: a table with 0 in the holes; an inlined helper, the per-CPU entry and a
        // large id stay out of it; the first entry for an id wins.
        let mut hs = called(&[1, 2, 3, 5]);
        hs.push(h(8, PJ_INLINE_RSEQ_CPU_ID, 0x70));
        hs.push(h(PJ_HELPER_PERCPU_OFFSET, PJ_INLINE_NONE, 0x9999));
        hs.push(h(2, PJ_INLINE_NONE, 0x7777));
        hs.push(h(0x7043_0001, PJ_INLINE_NONE, 0x8888));
        let plan = callx_plan(&hs);
        assert_eq!(plan.table, Some(vec![0, 0x1001, 0x1002, 0x1003, 0, 0x1005]));
        // Compared for: the inlined one, then the id too large for any table.
        let compared: Vec<u32> = plan.compared.iter().map(|h| h.id).collect();
        assert_eq!(compared, [8, 0x7043_0001]);
        // Too few, too sparse (largest id ≥ 4 × count), or past the size limit: compares.
        let few = callx_plan(&called(&[1, 2, 3]));
        assert_eq!((few.table, few.compared.len()), (None, 3));
        assert_eq!(callx_plan(&called(&[1, 2, 3, 16])).table, None);
        assert!(callx_plan(&called(&[1, 2, 3, 15])).table.is_some());
        let many: Vec<u32> = (400..600).collect();
        assert_eq!(callx_plan(&called(&many)).table, None);
    }
}
