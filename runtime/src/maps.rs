//! Maps in programs: how a load's maps reach its code, the kernel's map helpers by id, and
//! tail calls.
//!
//! A program names its maps as the kernel's loader expects: `lddw rX, map` with
//! `src = BPF_PSEUDO_MAP_FD` (1) and `imm` = the map's index in
//! [`LoadOptions::maps`](crate::LoadOptions::maps), or `src = BPF_PSEUDO_MAP_VALUE` (2) with the second slot's
//! `imm` = an offset into an array map's first value (libbpf's global-data references).
//! The runtime rewrites those into plain `lddw`s before the backend sees the code:
//!
//! * a map reference becomes the map's **handle**, the address of its [`Map`]. Programs
//!   cannot read through it (it is in none of their regions); helpers take it back only
//!   after finding it among the maps of the program that is running, so
//!   a forged handle gets the helper's failure value, never a host access;
//! * a value reference becomes the address of the value;
//! * `call 1` (`bpf_map_lookup_elem`) whose `r1` is, within its basic block, an array or
//!   per-CPU array map becomes a call of a per-load id the backend inlines
//!   ([`PJ_INLINE_ARRAY_LOOKUP`]): a bounds test and `base + key * stride`, as the kernel's
//!   `map_gen_lookup`;
//! * `call 12` (`bpf_tail_call`) becomes a real tail call ([`PJ_INLINE_TAIL_CALL`]) when the
//!   backend has them.
//!
//! Every map's value memory is a region of the program (read-only with
//! `BPF_F_RDONLY_PROG`), so values are checked like any other memory in sandboxed code; a
//! lookup's NULL is in no region. Map bookkeeping (hash links, keys, free lists) is never
//! in a region: a program that overruns a value reaches at most another value of the same
//! map, never the map's structure or the host.

use crate::exec;
use crate::{err, Error, ErrorKind, Program, Trust};
use packjit_plugin_api::abi::{
    PjArrayMap, PjLookupValue, PjMemRegion, PjProgArray, PjTailTarget, PJ_ARRAY_NOT_PERCPU,
    PJ_CALLEE_TAIL_FELL_THROUGH, PJ_CALLEE_TAIL_RETURNED, PJ_CALLEE_TAIL_STOPPED,
    PJ_HELPER_CALLEE_TAIL_CALL, PJ_INLINE_ARRAY_LOOKUP, PJ_INLINE_NONE,
    PJ_INLINE_PROG_ARRAY_TAIL_CALL, PJ_INLINE_TAIL_CALL, PJ_MAX_TAIL_CALLS, PJ_REGION_WRITABLE,
    PJ_STOP_NONE,
};
use packjit_plugin_api::HelperEntry;
use packjit_plugin_api::{AccessDirection, PjProgramEntry};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use packjit_maps::KeyWord;
pub use packjit_maps::{
    ArrayLayout, Map, MapError, MapSpec, MapType, BPF_ANY, BPF_EXIST, BPF_F_LOCK,
    BPF_F_NO_PREALLOC, BPF_F_RDONLY_PROG, BPF_NOEXIST,
};

/// Kernel helper ids the runtime provides when the host registered nothing under them.
pub mod helper_ids {
    /// `void *bpf_map_lookup_elem(map, key)`.
    pub const MAP_LOOKUP_ELEM: u32 = 1;
    /// `long bpf_map_update_elem(map, key, value, flags)`.
    pub const MAP_UPDATE_ELEM: u32 = 2;
    /// `long bpf_map_delete_elem(map, key)`.
    pub const MAP_DELETE_ELEM: u32 = 3;
    /// `long bpf_trace_printk(fmt, fmt_size, ...)`.
    pub const TRACE_PRINTK: u32 = 6;
    /// `u32 bpf_get_prandom_u32(void)`.
    pub const GET_PRANDOM_U32: u32 = 7;
    /// `long bpf_tail_call(ctx, prog_array, index)`.
    pub const TAIL_CALL: u32 = 12;
    /// `long bpf_map_push_elem(map, value, flags)`.
    pub const MAP_PUSH_ELEM: u32 = 87;
    /// `long bpf_map_pop_elem(map, value)`.
    pub const MAP_POP_ELEM: u32 = 88;
    /// `long bpf_map_peek_elem(map, value)`.
    pub const MAP_PEEK_ELEM: u32 = 89;
    /// `long bpf_ringbuf_output(ringbuf, data, size, flags)`.
    pub const RINGBUF_OUTPUT: u32 = 130;
    /// `void *bpf_ringbuf_reserve(ringbuf, size, flags)`.
    pub const RINGBUF_RESERVE: u32 = 131;
    /// `void bpf_ringbuf_submit(data, flags)`.
    pub const RINGBUF_SUBMIT: u32 = 132;
    /// `void bpf_ringbuf_discard(data, flags)`.
    pub const RINGBUF_DISCARD: u32 = 133;
    /// `u64 bpf_ringbuf_query(ringbuf, flags)`.
    pub const RINGBUF_QUERY: u32 = 134;
    /// `void *bpf_map_lookup_percpu_elem(map, key, cpu)`.
    pub const MAP_LOOKUP_PERCPU_ELEM: u32 = 195;
}
use helper_ids::*;

/// The longest chain of tail calls one run may make, as in the kernel
/// (`MAX_TAIL_CALL_CNT`).
pub const MAX_TAIL_CALLS: u32 = PJ_MAX_TAIL_CALLS;

/// The first of the per-load ids of inlined array lookups (one per array map of the load).
const ARRAY_LOOKUP_IDS: u32 = 0x7043_1000;

/// The first of the per-load ids of inlined tail calls (one per prog array of the load).
const PROG_ARRAY_IDS: u32 = 0x7043_1800;

/// packjit's ids for lookup, update and delete (and the tail call) at call sites whose map
/// argument `bind` proved (the map loaded into the register in the same basic block, never
/// overwritten): direct calls of the map's operation, as the kernel's JITs call
/// `map->ops` directly, with no search for the map among the program's.
const KNOWN_MAP_IDS: [(u32, u32); 4] = [
    (MAP_LOOKUP_ELEM, 0x7043_2001),
    (MAP_UPDATE_ELEM, 0x7043_2002),
    (MAP_DELETE_ELEM, 0x7043_2003),
    (TAIL_CALL, 0x7043_2012),
];

/// packjit's ids for `bpf_map_lookup_elem` at call sites whose map `bind` proved to be a
/// HASH or LRU_HASH (values shared by all CPUs) with 4- or 8-byte keys: the map's own word
/// lookup ([`Map::lookup_hash_word`]), the key pointer checked for sandboxed loads only.
/// Indexed by [`hash_word_lookup_id`]'s `(trust, key width)`.
const HASH_WORD_LOOKUP_IDS: [(u32, Trust, u32); 4] = [
    (0x7043_2101, Trust::Sandboxed, 4),
    (0x7043_2102, Trust::Sandboxed, 8),
    (0x7043_2103, Trust::Trusted, 4),
    (0x7043_2104, Trust::Trusted, 8),
];

/// packjit's ids for the word lookup of a sandboxed load's call site whose key pointer
/// `bind` proved inside the current frame (`r2 = r10 + off`): no key check; by key width.
const FRAME_KEY_HASH_LOOKUP_IDS: [(u32, u32); 2] = [(0x7043_2105, 4), (0x7043_2106, 8)];

/// packjit's id for one step of `bpf_for_each_map_elem` over a hash map, called by the
/// function `callbacks.rs` appends: `(map, &cursor, key buffer) -> value or 0`.
pub(crate) const HASH_ITER_NEXT: u32 = 0x7043_2164;

/// `BPF_PSEUDO_MAP_FD` / `BPF_PSEUDO_MAP_VALUE` in an `lddw`'s source field.
const PSEUDO_MAP_FD: u8 = 1;
const PSEUDO_MAP_VALUE: u8 = 2;

/// The maps of a running program, for its helpers.
pub(crate) struct RunMaps {
    maps: Vec<Arc<Map>>,
}

impl RunMaps {
    fn find(&self, handle: u64) -> Option<&Map> {
        self.maps
            .iter()
            .find(|m| Arc::as_ptr(m) as u64 == handle)
            .map(|m| &**m)
    }
}

/// A load's maps bound to its code (see the module doc).
pub(crate) struct Bound {
    /// The code with its map references rewritten.
    pub code: Vec<u8>,
    /// Helper entries the rewritten code calls (array lookups, the tail call).
    pub helpers: Vec<HelperEntry>,
    /// The maps' value memory.
    pub regions: Vec<PjMemRegion>,
    /// The lookups whose map `bind` proved, with the value each non-NULL result points to
    /// (`PJ_HELPER_LOOKUP_VALUES`: sandboxed code proves accesses into it after the
    /// program's NULL test), ascending by pc.
    pub lookups: Vec<PjLookupValue>,
    /// The same for inlined per-CPU array lookups: to be added to `lookups` only when the
    /// load inlines the per-CPU lookup itself (`PerCpuLookupImpl::Inline`), whose CPU bound
    /// is masked; ascending by pc.
    pub percpu_lookups: Vec<PjLookupValue>,
    /// For the helpers while the program runs.
    pub run: Arc<RunMaps>,
    /// The array layouts the inlined lookups were compiled from (read while compiling).
    _arrays: Box<[PjArrayMap]>,
    /// The prog arrays the inlined tail calls were compiled from (read while compiling).
    _prog_arrays: Box<[PjProgArray]>,
}

/// The handle programs use for `map` (see the module doc).
pub fn handle_of(map: &Arc<Map>) -> u64 {
    Arc::as_ptr(map) as u64
}

/// What the backend of a load emits in place of helper calls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Inlining {
    /// Real tail calls ([`PJ_INLINE_TAIL_CALL`]).
    pub tail_calls: bool,
    /// Tail calls through a proven prog array emitted inline
    /// ([`PJ_INLINE_PROG_ARRAY_TAIL_CALL`]).
    pub prog_array_tail_calls: bool,
    /// Inlined array lookups ([`PJ_INLINE_ARRAY_LOOKUP`]).
    pub array_lookups: bool,
    /// The load's trust: a trusted load's proven hash lookups skip the key pointer check
    /// (its loader vouched for its pointers).
    pub trust: Trust,
}

/// Binds `maps` to `code` (see the module doc).
/// `percpu_id(map)` registers a per-CPU array for the inlined per-CPU lookup and returns its
/// id (`None`: that array's lookups stay calls).
pub(crate) fn bind(
    code: &[u8],
    maps: &[Arc<Map>],
    inlining: Inlining,
    mut percpu_id: impl FnMut(&ArrayLayout) -> Option<u32>,
) -> Result<Bound, Error> {
    // Callback helpers first: the functions they append name maps and call helpers too.
    let mut expanded = code.to_vec();
    crate::callbacks::expand(&mut expanded, maps)?;
    let code = &expanded[..];
    let mut out = code.to_vec();
    let slots = out.len() / 8;
    let at = |pc: usize| 8 * pc;
    let targets = jump_targets(code);
    // Per map: the id of its inlined lookup, when it is an array.
    let mut arrays: Vec<PjArrayMap> = Vec::new();
    let mut lookup_ids: Vec<Option<u32>> = vec![None; maps.len()];
    // Per map: the id of its inlined tail call, when it is a prog array.
    let mut prog_arrays: Vec<PjProgArray> = Vec::new();
    let mut tail_ids: Vec<Option<u32>> = vec![None; maps.len()];
    // The direct-call ids the code now calls.
    let mut known_used: Vec<u32> = Vec::new();
    let mut lookups: Vec<PjLookupValue> = Vec::new();
    let mut percpu_lookups: Vec<PjLookupValue> = Vec::new();
    // Per register field (all 16 values of the 4 bits: the verifier refuses r11-r15 after
    // this scan, which must not fail on them first): the map whose handle it holds in the
    // current basic block.
    let mut holds: [Option<usize>; 16] = [None; 16];
    // Per register field, in the current basic block: `r10 + this` when straight-line code
    // set it so (`rX = r10`, then `rX += imm` / `rX -= imm`), as clang passes a key.
    let mut frame_at: [Option<i64>; 16] = [None; 16];
    let mut pc = 0;
    while pc < slots {
        let s = &code[at(pc)..at(pc) + 8];
        let (op, dst, src) = (s[0], s[1] & 0xf, s[1] >> 4);
        if targets.get(pc).copied().unwrap_or(false) {
            holds = [None; 16];
            frame_at = [None; 16];
        }
        let imm = i32::from_le_bytes([s[4], s[5], s[6], s[7]]);
        if op == 0x18 && pc + 1 < slots {
            let index = usize::try_from(imm).ok().filter(|&i| i < maps.len());
            let value = match src {
                PSEUDO_MAP_FD | PSEUDO_MAP_VALUE => {
                    let Some(k) = index else {
                        return Err(err(
                            ErrorKind::Verify,
                            format!(
                                "pc {pc}: lddw names map {imm}, but the load has {} maps",
                                maps.len()
                            ),
                        ));
                    };
                    Some((k, src))
                }
                _ => None,
            };
            holds[dst as usize] = None;
            frame_at[dst as usize] = None;
            if let Some((k, src)) = value {
                let addr = if src == PSEUDO_MAP_FD {
                    holds[dst as usize] = Some(k);
                    handle_of(&maps[k])
                } else {
                    value_address(pc, &maps[k], &code[at(pc + 1)..at(pc + 1) + 8])?
                };
                out[at(pc) + 1] = dst;
                out[at(pc) + 4..at(pc) + 8].copy_from_slice(&(addr as u32).to_le_bytes());
                out[at(pc + 1) + 4..at(pc + 1) + 8]
                    .copy_from_slice(&((addr >> 32) as u32).to_le_bytes());
            }
            pc += 2;
            continue;
        }
        match op & 7 {
            // A call clobbers r0-r5 and a jump ends the basic block: forget everything.
            5 | 6 => {
                if op == 0x85 && src == 0 {
                    check_map_argument(pc, imm as u32, &holds, maps)?;
                    if imm == TAIL_CALL as i32 && !inlining.tail_calls {
                        // A tail call that could only ever fail is a program that silently
                        // does something else: say so at load.
                        return Err(err(
                            ErrorKind::Unsupported,
                            format!("pc {pc}: bpf_tail_call: the backend emits no tail calls (inline kind {PJ_INLINE_TAIL_CALL}; a plugin built before them?)"),
                        ));
                    }
                }
                let helper = (op == 0x85 && src == 0).then_some(imm as u32);
                let lookup = inlining.array_lookups && helper == Some(MAP_LOOKUP_ELEM);
                let inlined = holds[1].filter(|_| lookup).and_then(|k| {
                    array_lookup_id(&maps[k], k, &mut arrays, &mut lookup_ids, &mut percpu_id)
                });
                let jump = inlining.prog_array_tail_calls && helper == Some(TAIL_CALL);
                let inlined = inlined.or_else(|| {
                    let k = holds[2].filter(|_| jump)?;
                    prog_array_id(&maps[k], k, &mut prog_arrays, &mut tail_ids)
                });
                // The map argument's register: r2 for a tail call, r1 for the others.
                let proven = |id: u32| if id == TAIL_CALL { holds[2] } else { holds[1] };
                let known = helper.and_then(|h| {
                    let (_, id) = KNOWN_MAP_IDS.iter().find(|(kernel, _)| *kernel == h)?;
                    let usable = h != TAIL_CALL || inlining.tail_calls;
                    (usable && proven(h).is_some()).then_some(*id)
                });
                // A proven hash lookup with word keys: the map's own word lookup. In a
                // sandboxed load too without the key pointer's check when the key is in
                // the current frame (`r2 = r10 + off`, all its bytes in `[r10 - 512, r10)`):
                // every function's frame lies inside the run's stack block, so those bytes
                // are the program's own memory on every path (data-derived: no branch).
                let known = match (helper, holds[1]) {
                    (Some(MAP_LOOKUP_ELEM), Some(k)) if known.is_some() => {
                        let width = if maps[k].is_hash_word::<u64>() { 8 } else { 4 };
                        let in_frame =
                            frame_at[2].is_some_and(|off| off >= -512 && off + width <= 0);
                        let id = match hash_word_lookup_id(&maps[k], inlining.trust) {
                            Some(_) if in_frame && inlining.trust == Trust::Sandboxed => {
                                FRAME_KEY_HASH_LOOKUP_IDS
                                    .iter()
                                    .find(|&&(_, w)| i64::from(w) == width)
                                    .map(|&(id, _)| id)
                            }
                            id => id,
                        };
                        id.or(known)
                    }
                    _ => known,
                };
                if let Some(id) = inlined.or(known) {
                    out[at(pc) + 4..at(pc) + 8].copy_from_slice(&id.to_le_bytes());
                    // A lookup of a proven map now calls the runtime's own code for it,
                    // whose result is NULL or one of the map's values (`value_size` bytes
                    // in the map's value memory, pinned for the run). Vouched for where
                    // that code keeps even a mispredicted path's address inside the value
                    // memory: the inlined (not per-CPU) array lookup masks its index after
                    // the bound, and the sandboxed ids' word lookup of a hash map addresses
                    // values by link past the slab's padding slot, or, on its rare path,
                    // clamps its element index into the pool (`lookup_hash_word_in_pool`: a
                    // `min`, `cmov` on x86-64, `csel` on arm64; RV64 without Zicond or Zbb
                    // may branch there, so not on RV64). The inlined per-CPU array lookup
                    // qualifies too (below). The LPM trie and the generic lookups branch
                    // around their bounds: their results stay checked.
                    let inlined_array = |per_cpu: bool| {
                        inlined.is_some()
                            && holds[1].is_some_and(|k| {
                                maps[k]
                                    .array_layout()
                                    .is_some_and(|a| (a.cpu_stride != 0) == per_cpu)
                            })
                    };
                    let masked = inlined_array(false);
                    // The inlined per-CPU array lookup: the driver masks its key and the
                    // inlined per-CPU lookup its CPU, but the fallback that calls
                    // `sched_getcpu` branches: vouched for only if the load inlines it
                    // (`Bound::percpu_lookups`).
                    let percpu = inlined_array(true);
                    let clamped = |id: u32| {
                        HASH_WORD_LOOKUP_IDS
                            .iter()
                            .any(|&(w, t, _)| t == Trust::Sandboxed && w == id)
                            || FRAME_KEY_HASH_LOOKUP_IDS.iter().any(|&(w, _)| w == id)
                    };
                    let word = cfg!(not(target_arch = "riscv64")) && known.is_some_and(clamped);
                    if let (Some(MAP_LOOKUP_ELEM), Some(k), true) =
                        (helper, holds[1], masked || word || percpu)
                    {
                        let spec = maps[k].spec();
                        let list = if percpu {
                            &mut percpu_lookups
                        } else {
                            &mut lookups
                        };
                        list.push(PjLookupValue {
                            pc: pc as u32,
                            value_size: spec.value_size,
                            flags: if spec.flags & BPF_F_RDONLY_PROG == 0 {
                                PJ_REGION_WRITABLE
                            } else {
                                0
                            },
                        });
                    }
                    // An inlined lookup or tail call is no direct call.
                    if known == Some(id) && !known_used.contains(&id) {
                        known_used.push(id);
                    }
                }
                holds = [None; 16];
                frame_at = [None; 16];
            }
            // Register loads and ALU operations write dst; `rX = r10` and a constant added
            // to or subtracted from it keep a frame address.
            1 | 4 | 7 => {
                holds[dst as usize] = None;
                let d = dst as usize;
                frame_at[d] = match op {
                    0xbf if src == 10 && s[2] == 0 && s[3] == 0 => Some(0),
                    0x07 => frame_at[d].map(|f| f + i64::from(imm)),
                    0x17 => frame_at[d].map(|f| f - i64::from(imm)),
                    _ => None,
                };
            }
            // Plain stores write no register.
            2 => {}
            // Atomics with fetch write src or r0; legacy packet loads write r0 and more.
            _ => {
                holds = [None; 16];
                frame_at = [None; 16];
            }
        }
        pc += 1;
    }
    let arrays = arrays.into_boxed_slice();
    let prog_arrays = prog_arrays.into_boxed_slice();
    let mut helpers: Vec<HelperEntry> = Vec::new();
    helpers.extend(per_map_entries(
        &lookup_ids,
        ARRAY_LOOKUP_IDS,
        PJ_INLINE_ARRAY_LOOKUP,
        &arrays,
    ));
    helpers.extend(per_map_entries(
        &tail_ids,
        PROG_ARRAY_IDS,
        PJ_INLINE_PROG_ARRAY_TAIL_CALL,
        &prog_arrays,
    ));
    if calls(&out, HASH_ITER_NEXT) {
        helpers.push(HelperEntry {
            id: HASH_ITER_NEXT,
            inline_kind: PJ_INLINE_NONE,
            addr: hash_iter_next as *const () as u64,
        });
    }
    if inlining.tail_calls && calls(code, TAIL_CALL) {
        // A tail call inside a bpf-to-bpf function, in whichever form, runs its target
        // through this (the front end asks for it only there).
        helpers.push(HelperEntry {
            id: PJ_HELPER_CALLEE_TAIL_CALL,
            inline_kind: PJ_INLINE_NONE,
            addr: callee_tail_call as *const () as u64,
        });
    }
    if inlining.tail_calls && calls(&out, TAIL_CALL) {
        helpers.push(HelperEntry {
            id: TAIL_CALL,
            inline_kind: PJ_INLINE_TAIL_CALL,
            addr: tail_call_chooser as *const () as u64,
        });
    }
    let f = |h: extern "C" fn(u64, u64, u64, u64, u64) -> u64| h as *const () as u64;
    for id in known_used {
        let (inline_kind, addr) = match id {
            0x7043_2001 => (PJ_INLINE_NONE, f(known_map_lookup_elem)),
            0x7043_2002 => (PJ_INLINE_NONE, f(known_map_update_elem)),
            0x7043_2003 => (PJ_INLINE_NONE, f(known_map_delete_elem)),
            0x7043_2101 => (PJ_INLINE_NONE, f(sandboxed_hash_lookup::<u32>)),
            0x7043_2102 => (PJ_INLINE_NONE, f(sandboxed_hash_lookup::<u64>)),
            0x7043_2103 => (PJ_INLINE_NONE, f(trusted_hash_lookup::<u32>)),
            0x7043_2104 => (PJ_INLINE_NONE, f(trusted_hash_lookup::<u64>)),
            0x7043_2105 => (PJ_INLINE_NONE, f(frame_key_hash_lookup::<u32>)),
            0x7043_2106 => (PJ_INLINE_NONE, f(frame_key_hash_lookup::<u64>)),
            _ => (PJ_INLINE_TAIL_CALL, f(known_tail_call_chooser)),
        };
        helpers.push(HelperEntry {
            id,
            inline_kind,
            addr,
        });
    }
    let regions = maps
        .iter()
        .flat_map(|m| m.value_regions())
        .map(|(start, len, writable)| PjMemRegion {
            start: start as u64,
            len: len as u64,
            flags: if writable { PJ_REGION_WRITABLE } else { 0 },
        })
        .collect();
    Ok(Bound {
        code: out,
        helpers,
        regions,
        lookups,
        percpu_lookups,
        run: Arc::new(RunMaps {
            maps: maps.to_vec(),
        }),
        _arrays: arrays,
        _prog_arrays: prog_arrays,
    })
}

/// The id of the word lookup for `map` in a load of this trust (see
/// [`HASH_WORD_LOOKUP_IDS`]), if the map is a HASH or LRU_HASH with 4- or 8-byte keys.
fn hash_word_lookup_id(map: &Map, trust: Trust) -> Option<u32> {
    let width = if map.is_hash_word::<u32>() {
        4
    } else if map.is_hash_word::<u64>() {
        8
    } else {
        return None;
    };
    HASH_WORD_LOOKUP_IDS
        .iter()
        .find(|&&(_, t, w)| t == trust && w == width)
        .map(|&(id, _, _)| id)
}

/// Refuses a helper call whose map argument (a map the register holds at the call, as far
/// as the basic block shows) is of a type the helper does not take, as the kernel's
/// verifier does: a lookup in a ring buffer, a tail call through a hash map, ...
fn check_map_argument(
    pc: usize,
    helper: u32,
    holds: &[Option<usize>; 16],
    maps: &[Arc<Map>],
) -> Result<(), Error> {
    use MapType::*;
    let (reg, takes): (usize, &[MapType]) = match helper {
        MAP_LOOKUP_ELEM | MAP_UPDATE_ELEM | MAP_DELETE_ELEM => (
            1,
            &[
                Array,
                PercpuArray,
                Hash,
                PercpuHash,
                LruHash,
                LruPercpuHash,
                LpmTrie,
            ],
        ),
        MAP_LOOKUP_PERCPU_ELEM => (1, &[PercpuArray, PercpuHash, LruPercpuHash]),
        MAP_PUSH_ELEM | MAP_POP_ELEM | MAP_PEEK_ELEM => (1, &[Queue, Stack]),
        RINGBUF_OUTPUT | RINGBUF_RESERVE | RINGBUF_QUERY => (1, &[RingBuf]),
        TAIL_CALL => (2, &[ProgArray]),
        _ => return Ok(()),
    };
    let Some(k) = holds[reg] else {
        return Ok(());
    };
    let spec = maps[k].spec();
    if takes.contains(&spec.map_type) {
        return Ok(());
    }
    let name = kernel_helpers()
        .iter()
        .find(|(id, _, _)| *id == helper)
        .map_or("helper", |(_, name, _)| *name);
    Err(err(
        ErrorKind::Verify,
        format!(
            "pc {pc}: {name} ({helper}) cannot take map `{}` (r{reg}) of type {}",
            spec.name,
            spec.map_type.name()
        ),
    ))
}

/// The address a `BPF_PSEUDO_MAP_VALUE` reference names: `off` bytes into the first value
/// of an array map (the only maps with a fixed value address).
fn value_address(pc: usize, map: &Map, second: &[u8]) -> Result<u64, Error> {
    let off = u32::from_le_bytes([second[4], second[5], second[6], second[7]]);
    let spec = map.spec();
    match map.array_layout() {
        Some(a) if a.cpu_stride == 0 && off < spec.value_size => Ok(a.base as u64 + off as u64),
        _ => Err(err(
            ErrorKind::Verify,
            format!(
                "pc {pc}: lddw of a value of map `{}` at offset {off}: only array maps have value addresses, inside their value ({} bytes)",
                spec.name, spec.value_size
            ),
        )),
    }
}

/// The id of `map`'s inlined lookup (`k`: its index in the load), registering it on first
/// use; `None` when the map is not an array or its per-CPU copy cannot be inlined.
fn array_lookup_id(
    map: &Map,
    k: usize,
    arrays: &mut Vec<PjArrayMap>,
    ids: &mut [Option<u32>],
    percpu_id: &mut impl FnMut(&ArrayLayout) -> Option<u32>,
) -> Option<u32> {
    if let Some(id) = ids[k] {
        return Some(id);
    }
    let layout = map.array_layout()?;
    let percpu = if layout.cpu_stride == 0 {
        PJ_ARRAY_NOT_PERCPU
    } else {
        percpu_id(&layout)?
    };
    let id = ARRAY_LOOKUP_IDS + arrays.len() as u32;
    arrays.push(PjArrayMap {
        base: layout.base as u64,
        value_stride: layout.value_stride,
        max_entries: layout.max_entries,
        percpu_id: percpu,
    });
    ids[k] = Some(id);
    Some(id)
}

/// The helper entries of per-map inline kinds: for each id made (`first + k`), its `kind`
/// with `tables[k]` as the parameter block (kept alive by the caller while it compiles).
fn per_map_entries<'a, T>(
    ids: &'a [Option<u32>],
    first: u32,
    kind: u32,
    tables: &'a [T],
) -> impl Iterator<Item = HelperEntry> + 'a {
    ids.iter().flatten().map(move |&id| HelperEntry {
        id,
        inline_kind: kind,
        addr: &tables[(id - first) as usize] as *const T as u64,
    })
}

/// The id of the inlined tail call through prog array `map` (map `k` of the load), made on
/// its first use; `None` for other map types.
fn prog_array_id(
    map: &Map,
    k: usize,
    prog_arrays: &mut Vec<PjProgArray>,
    ids: &mut [Option<u32>],
) -> Option<u32> {
    if let Some(id) = ids[k] {
        return Some(id);
    }
    let (slots, max_entries) = map.prog_slots()?;
    let id = PROG_ARRAY_IDS + prog_arrays.len() as u32;
    prog_arrays.push(PjProgArray {
        slots: slots as u64,
        max_entries,
        index_slots: map.prog_index_slots(),
    });
    ids[k] = Some(id);
    Some(id)
}

/// Which slots are jump targets (a basic block starts there): the scan above forgets what
/// registers hold at each.
pub(crate) fn jump_targets(code: &[u8]) -> Vec<bool> {
    let slots = code.len() / 8;
    let mut t = vec![false; slots + 1];
    for pc in 0..slots {
        let s = &code[8 * pc..8 * pc + 8];
        let class = s[0] & 7;
        let off = i16::from_le_bytes([s[2], s[3]]) as i64;
        let imm = i32::from_le_bytes([s[4], s[5], s[6], s[7]]) as i64;
        let target = match (class, s[0] >> 4) {
            // ja32 (gotol) takes its offset from imm.
            (6, 0) => Some(pc as i64 + 1 + imm),
            (5 | 6, 0x8 | 0x9) => None, // call, exit
            (5 | 6, _) => Some(pc as i64 + 1 + off),
            _ => None,
        };
        if let Some(t2) = target.and_then(|t2| usize::try_from(t2).ok()) {
            if t2 < t.len() {
                t[t2] = true;
            }
        }
    }
    t
}

/// The maps of the program this thread runs (innermost JIT run), for its helpers: its
/// `env`'s (`PjExecEnv::maps`, set by the run and switched by tail calls).
fn current_run_maps<'a>() -> Option<&'a RunMaps> {
    let env = exec::current_env();
    if env.is_null() {
        return None;
    }
    // SAFETY: the running program's env (see `current_env`); the code does not touch it
    // while its helper runs.
    let maps = unsafe { (*env).maps } as *const RunMaps;
    // SAFETY: 0 or an `Arc<RunMaps>` the running program (or the tail call target now
    // running, kept alive by its slot's deferred release) holds for the run.
    (!maps.is_null()).then(|| unsafe { &*maps })
}

/// The running program's map with this handle, if it has one.
fn current_map<'a>(handle: u64) -> Option<&'a Map> {
    current_run_maps()?.find(handle)
}

/// May the running program read (or write) `len` bytes at `addr`? Trusted programs vouch
/// for their own pointers (their loader promised they stay in bounds).
fn run_may_access(addr: u64, len: u64, direction: AccessDirection) -> bool {
    exec::trusted_run() || exec::helper_access_ok(addr, len, direction)
}

/// The CPU this thread runs on, for per-CPU maps (a hint, as in the kernel): the rseq
/// `cpu_id` glibc registers (one load), else `sched_getcpu`.
fn this_cpu() -> u32 {
    match crate::builtins::glibc_rseq_cpu_id_offset() {
        // SAFETY: the offset glibc registered for every thread's rseq area.
        Some(offset) => unsafe { packjit_interp::hw::rseq_cpu_id(offset) },
        None => {
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() };
            u32::try_from(cpu).unwrap_or(0)
        }
    }
}

/// The CPU a map operation on `m` needs: this one for per-CPU maps, and none (0) for the
/// others, which spares them the lookup.
fn cpu_for(m: &Map) -> u32 {
    if m.spec().map_type.is_per_cpu() {
        this_cpu()
    } else {
        0
    }
}

const ENOENT: u64 = (-2i64) as u64;
const EINVAL: u64 = (-22i64) as u64;

/// The map at `handle` where `bind` proved the call site's `r1` is map `k` of the load (see
/// `KNOWN_MAP_IDS`): the program holds it for as long as it can run.
///
/// # Safety
/// `handle` must be such a proven handle.
unsafe fn known_map<'a>(handle: u64) -> &'a Map {
    // SAFETY: promised by the caller: `Arc::as_ptr` of a map the running program's
    // `RunMaps` keeps alive.
    unsafe { &*(handle as *const Map) }
}

// The map operations, each once; the helpers below find the map (among the running
// program's, or proven by `bind` at the call site) and call them.

fn lookup(m: &Map, key: u64) -> u64 {
    if !run_may_access(key, m.spec().key_size.into(), AccessDirection::Read) {
        return 0;
    }
    // SAFETY: `key_size` readable bytes at `key` (checked above, or vouched for).
    unsafe { m.lookup_raw(key as *const u8, cpu_for(m)) as u64 }
}

fn update(m: &Map, key: u64, value: u64, flags: u64) -> u64 {
    let spec = m.spec();
    if !run_may_access(key, spec.key_size.into(), AccessDirection::Read)
        || !run_may_access(value, spec.value_size.into(), AccessDirection::Read)
    {
        return EINVAL;
    }
    // SAFETY: key and value bytes readable (checked above, or vouched for).
    unsafe { m.update_raw(key as *const u8, value as *const u8, flags, cpu_for(m)) as u64 }
}

fn delete(m: &Map, key: u64) -> u64 {
    if !run_may_access(key, m.spec().key_size.into(), AccessDirection::Read) {
        return EINVAL;
    }
    // SAFETY: `key_size` readable bytes at `key`.
    unsafe { m.delete_raw(key as *const u8) as u64 }
}

extern "C" fn map_lookup_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    current_map(map).map_or(0, |m| lookup(m, key))
}

extern "C" fn map_update_elem(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    current_map(map).map_or(EINVAL, |m| update(m, key, value, flags))
}

extern "C" fn map_delete_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    current_map(map).map_or(EINVAL, |m| delete(m, key))
}

/// `bpf_map_lookup_elem` where the map is proven: a direct call, no search for the map.
extern "C" fn known_map_lookup_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: this id is only given to call sites whose r1 `bind` proved.
    lookup(unsafe { known_map(map) }, key)
}

/// `bpf_map_update_elem` where the map is proven.
extern "C" fn known_map_update_elem(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    // SAFETY: as in `known_map_lookup_elem`.
    update(unsafe { known_map(map) }, key, value, flags)
}

/// `bpf_map_delete_elem` where the map is proven.
extern "C" fn known_map_delete_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as in `known_map_lookup_elem`.
    delete(unsafe { known_map(map) }, key)
}

/// `bpf_map_lookup_elem` at a call site of a trusted load whose map `bind` proved to be a
/// word-keyed HASH or LRU_HASH ([`HASH_WORD_LOOKUP_IDS`]): the map's word lookup and
/// nothing else, as the kernel's JITs call the map's lookup directly.
extern "C" fn trusted_hash_lookup<W: KeyWord>(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: `bind` gives this id only to call sites whose r1 it proved to be a map that
    // `is_hash_word::<W>()`, in trusted loads, whose loader vouched for their pointers (the
    // key has size_of::<W>() readable bytes); the run is pinned.
    unsafe { known_map(map).lookup_hash_word::<W>(key as *const u8) as u64 }
}

/// As [`trusted_hash_lookup`] for sandboxed loads: the key pointer is checked first, and
/// the result's address stays in the value memory under misspeculation
/// ([`Map::lookup_hash_word_in_pool`]).
extern "C" fn sandboxed_hash_lookup<W: KeyWord>(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    let width = std::mem::size_of::<W>() as u64;
    if !exec::helper_access_ok(key, width, AccessDirection::Read) {
        return 0;
    }
    // SAFETY: as in `trusted_hash_lookup`, the key's bytes checked above.
    unsafe { known_map(map).lookup_hash_word_in_pool::<W>(key as *const u8) as u64 }
}

/// As [`sandboxed_hash_lookup`] at a call site whose key pointer `bind` proved inside the
/// current frame ([`FRAME_KEY_HASH_LOOKUP_IDS`]): no key check.
extern "C" fn frame_key_hash_lookup<W: KeyWord>(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as in `trusted_hash_lookup`, with the key's bytes at `r10 + off` inside the
    // current frame, which lies in the run's stack block (`bind` proved it from the code:
    // `r2 = r10; r2 += off` in the call's basic block).
    unsafe { known_map(map).lookup_hash_word_in_pool::<W>(key as *const u8) as u64 }
}

/// One step of `bpf_for_each_map_elem` over a hash map ([`HASH_ITER_NEXT`]): the element
/// after the cursor at `cursor` (a `u64` in the calling function's frame, 0 to start), its
/// key copied to `key` (`key_size` bytes in that frame), the cursor advanced; the value
/// (this CPU's) or 0 at the end. The run is pinned from before the first step to its end,
/// so the walk and the values stay valid (see [`Map::iter_next_raw`]).
extern "C" fn hash_iter_next(map: u64, cursor: u64, key: u64, _: u64, _: u64) -> u64 {
    let Some(m) = current_map(map) else {
        return 0;
    };
    if !run_may_access(cursor, 8, AccessDirection::Write)
        || !run_may_access(key, m.spec().key_size.into(), AccessDirection::Write)
    {
        return 0;
    }
    // SAFETY: 8 writable bytes at `cursor` (checked above, or vouched for by a trusted run).
    let at = unsafe { (cursor as *const u64).read_unaligned() };
    // SAFETY: `key_size` writable bytes at `key`; the run is pinned.
    let (value, next) = unsafe { m.iter_next_raw(at, key as *mut u8, cpu_for(m)) };
    // SAFETY: as the read above.
    unsafe { (cursor as *mut u64).write_unaligned(next) };
    value as u64
}

extern "C" fn map_lookup_percpu_elem(map: u64, key: u64, cpu: u64, _: u64, _: u64) -> u64 {
    let (Some(m), Ok(cpu)) = (current_map(map), u32::try_from(cpu)) else {
        return 0;
    };
    if !run_may_access(key, m.spec().key_size.into(), AccessDirection::Read) {
        return 0;
    }
    // SAFETY: `key_size` readable bytes at `key`.
    unsafe { m.lookup_percpu_raw(key as *const u8, cpu) as u64 }
}

extern "C" fn map_push_elem(map: u64, value: u64, flags: u64, _: u64, _: u64) -> u64 {
    let Some(m) = current_map(map) else {
        return EINVAL;
    };
    if !run_may_access(value, m.spec().value_size.into(), AccessDirection::Read) {
        return EINVAL;
    }
    // SAFETY: `value_size` readable bytes at `value`.
    unsafe { m.push_raw(value as *const u8, flags) as u64 }
}

/// `pop` and `peek`: write the element to `value`.
fn take_elem(map: u64, value: u64, pop: bool) -> u64 {
    let Some(m) = current_map(map) else {
        return EINVAL;
    };
    if !run_may_access(value, m.spec().value_size.into(), AccessDirection::Write) {
        return EINVAL;
    }
    // SAFETY: `value_size` writable bytes at `value`.
    unsafe {
        if pop {
            m.pop_raw(value as *mut u8) as u64
        } else {
            m.peek_raw(value as *mut u8) as u64
        }
    }
}

extern "C" fn map_pop_elem(map: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    take_elem(map, value, true)
}

extern "C" fn map_peek_elem(map: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    take_elem(map, value, false)
}

extern "C" fn ringbuf_output(map: u64, data: u64, size: u64, flags: u64, _: u64) -> u64 {
    let Some(m) = current_map(map) else {
        return EINVAL;
    };
    if !run_may_access(data, size, AccessDirection::Read) {
        return EINVAL;
    }
    // SAFETY: `size` readable bytes at `data`.
    unsafe { m.ringbuf_output_raw(data as *const u8, size, flags) as u64 }
}

extern "C" fn ringbuf_reserve(map: u64, size: u64, flags: u64, _: u64, _: u64) -> u64 {
    let Some(m) = current_map(map) else {
        return 0;
    };
    // SAFETY: the map checks size and flags; the record is its own memory.
    unsafe { m.ringbuf_reserve_raw(size, flags) as u64 }
}

/// The ring buffer holding the record at `data`: one of the running program's.
fn ringbuf_of<'a>(data: u64) -> Option<&'a Map> {
    let run = current_run_maps()?;
    run.maps
        .iter()
        .find(|m| {
            m.spec().map_type == MapType::RingBuf
                && m.value_regions().iter().any(|&(start, len, _)| {
                    (start as u64..start as u64 + len as u64).contains(&data)
                })
        })
        .map(|m| &**m)
}

extern "C" fn ringbuf_submit(data: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    if let Some(m) = ringbuf_of(data) {
        // SAFETY: `data` is inside this ring buffer; the map validates it is a reservation.
        unsafe { m.ringbuf_submit_raw(data as *mut u8, flags) };
    }
    0
}

extern "C" fn ringbuf_discard(data: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    if let Some(m) = ringbuf_of(data) {
        // SAFETY: as in `ringbuf_submit`.
        unsafe { m.ringbuf_discard_raw(data as *mut u8, flags) };
    }
    0
}

extern "C" fn ringbuf_query(map: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    current_map(map).map_or(0, |m| m.ringbuf_query(flags))
}

extern "C" fn get_prandom_u32(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    thread_local! {
        static STATE: std::cell::Cell<u64> = std::cell::Cell::new(exec::random_key() | 1);
    }
    // xorshift64*: not cryptographic, as the kernel's prandom is not.
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32
    })
}

/// Called by the code of a tail call ([`PJ_INLINE_TAIL_CALL`]): the entry of the program
/// in slot `index` of prog array `map`, with the run switched over to it (its regions in
/// `env`, its maps for the helpers), or 0: a map that is not the program's prog array, an
/// empty slot or one out of range, a program of another trust, or the 34th tail call.
extern "C" fn tail_call_chooser(_ctx: u64, map: u64, index: u64, _: u64, _: u64) -> u64 {
    match current_map(map) {
        Some(m) if m.spec().map_type == MapType::ProgArray => choose(m, index),
        _ => 0,
    }
}

/// [`tail_call_chooser`] where `bind` proved the prog array (see `KNOWN_MAP_IDS`).
extern "C" fn known_tail_call_chooser(_ctx: u64, map: u64, index: u64, _: u64, _: u64) -> u64 {
    // SAFETY: this id is only given to call sites whose r2 `bind` proved, and
    // `check_map_argument` made sure it is a prog array.
    choose(unsafe { known_map(map) }, index)
}

/// The tail call through prog array `m`: the entry to continue in, with the run switched
/// over to its program, or 0. The same steps, in the same order, as the inlined tail call
/// (`PJ_INLINE_PROG_ARRAY_TAIL_CALL`), so both count against one limit.
fn choose(m: &Map, index: u64) -> u64 {
    let env = exec::current_env();
    if env.is_null() {
        return 0;
    }
    // SAFETY: the running program's env (see `current_env`), not touched by its code while
    // this helper runs.
    let env = unsafe { &mut *env };
    // The kernel's index is a u32: the upper half is ignored, as the inlined code does.
    let token = m.prog_slot(index as u32);
    if token == 0 || env.tail_calls >= u64::from(MAX_TAIL_CALLS) {
        return 0;
    }
    // SAFETY: a non-zero slot holds a `TailTarget` made by `set_prog_array_slot`, released
    // only after the runs in progress at its retirement (this one among them) have ended.
    // Its fields are read in place: compaction writes `tail_entry` while runs read.
    let target = token as *const PjTailTarget;
    let mode = usize::from(!exec::trusted_run());
    // SAFETY: the word is the target program's code base (alive with the `TailTarget`) or
    // the static zero; the base is read as `Movable::entry` reads it.
    let base =
        unsafe { (*((*target).code_base[mode] as *const AtomicU64)).load(Ordering::Acquire) };
    if base == 0 {
        return 0;
    }
    env.tail_calls += 1;
    // SAFETY: as above; these fields are never written after the slot was published.
    unsafe {
        env.regions = (*target).regions;
        env.region_count = (*target).region_count;
        env.maps = (*target).maps;
        base + (*target).entry_offset
    }
}

/// What the code of a tail call inside a bpf-to-bpf function calls
/// ([`PJ_HELPER_CALLEE_TAIL_CALL`], with the program's r1-r3): the tests of [`choose`], on
/// the same count, then the target's whole entry, called here on the run's `env` as the
/// host calls a program. The entry overwrites what `env` holds for the caller (`entry_sp`,
/// the stack block's bounds, the regions, the maps): saved before, restored after, so the
/// caller goes on with its own stack block and regions. The count is not restored (the
/// chain is one run's), nor a stop, which the caller's code then propagates. The target's
/// result goes to `env.callee_tail_r0`.
///
/// The nesting is bounded: each entry here counts one tail call, so at most
/// `MAX_TAIL_CALLS` deep, and the front end refuses such tail calls in programs whose
/// stack block could make that deep a chain overflow the native stack
/// (`packjit_frontend::lower::MAX_TAIL_CALLING_DEPTH`).
extern "C" fn callee_tail_call(_ctx: u64, map: u64, index: u64, _: u64, _: u64) -> u64 {
    let env = exec::current_env();
    if env.is_null() {
        return PJ_CALLEE_TAIL_FELL_THROUGH;
    }
    let Some(m) = current_map(map).filter(|m| m.spec().map_type == MapType::ProgArray) else {
        return PJ_CALLEE_TAIL_FELL_THROUGH;
    };
    let token = m.prog_slot(index as u32);
    // The reads and writes of `*env` here: the running program's env, which its code does
    // not touch while this helper runs; no reference to it is held across the target's
    // run, which reads and writes it too.
    // SAFETY: as just said.
    let count = unsafe { (*env).tail_calls };
    if token == 0 || count >= u64::from(MAX_TAIL_CALLS) {
        return PJ_CALLEE_TAIL_FELL_THROUGH;
    }
    let target = token as *const PjTailTarget;
    let mode = usize::from(!exec::trusted_run());
    // SAFETY: as in `choose`: the slot's `TailTarget` (and the code it names) outlives this
    // run, and its base word is read as `Movable::entry` reads it.
    let base =
        unsafe { (*((*target).code_base[mode] as *const AtomicU64)).load(Ordering::Acquire) };
    if base == 0 {
        return PJ_CALLEE_TAIL_FELL_THROUGH;
    }
    // SAFETY: as above; these fields are never written after the slot was published.
    let (entry, regions, region_count, maps) = unsafe {
        (
            base + (*target).entry_offset,
            (*target).regions,
            (*target).region_count,
            (*target).maps,
        )
    };
    // SAFETY: `*env` as said above.
    let caller = unsafe { *env };
    // SAFETY: `*env` as said above.
    unsafe {
        (*env).tail_calls += 1;
        (*env).regions = regions;
        (*env).region_count = region_count;
        (*env).maps = maps;
    }
    // SAFETY: `entry` is the target's committed code of this run's trust (the other
    // trust's `code_base` word is 0), with the program entry's signature, alive with its
    // `TailTarget`; the context is the run's, as the host passed it.
    let r0 = unsafe {
        let f: PjProgramEntry = std::mem::transmute(entry as usize);
        let ctx = caller.ctx_start as *mut u8;
        f(ctx, caller.ctx_end.wrapping_sub(caller.ctx_start), env)
    };
    // SAFETY: `*env` as said above; the target's run is over.
    unsafe {
        (*env).entry_sp = caller.entry_sp;
        (*env).stack_start = caller.stack_start;
        (*env).stack_end = caller.stack_end;
        (*env).regions = caller.regions;
        (*env).region_count = caller.region_count;
        (*env).maps = caller.maps;
        (*env).ctx_start = caller.ctx_start;
        (*env).ctx_end = caller.ctx_end;
        if (*env).stop_kind != PJ_STOP_NONE {
            return PJ_CALLEE_TAIL_STOPPED;
        }
        (*env).callee_tail_r0 = r0;
    }
    PJ_CALLEE_TAIL_RETURNED
}

/// What a prog-array slot points to: the description an inlined tail call reads (first, so
/// the slot's token is its address), and the program it keeps alive.
#[repr(C)]
pub(crate) struct TailTarget {
    abi: PjTailTarget,
    /// The base word of code that never moves (its entry; `abi.entry_offset` is then 0).
    fixed_base: u64,
    program: Arc<Program>,
    /// `abi.tail_entry[mode]` moves with the code (`Movable::track_tail_entry`).
    tracked: Option<usize>,
}

/// The code base a tail call from code of the other mode finds: none.
static NO_CODE: AtomicU64 = AtomicU64::new(0);

/// Where a tail call enters a target whose entry has the uniform tail-call frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TailEntry {
    /// Past its saves, the caller's serving it (`PjTailTarget::uniform_frame`).
    AfterSaves,
    /// At its entry, after the caller left its whole frame (as for any other target).
    Full,
}

impl TailTarget {
    /// Boxed first: `abi.code_base` may point into the box.
    fn new(program: Arc<Program>, entry: TailEntry) -> Box<Self> {
        // An adaptive program's code stops tiering here: the slot keeps its address.
        let fixed_base = program.settled_code().entry_now();
        let mut t = Box::new(TailTarget {
            abi: PjTailTarget {
                regions: program.regions.as_ptr() as u64,
                region_count: program.regions.len() as u64,
                maps: (program.maps.as_ref()).map_or(0, |m| Arc::as_ptr(m) as u64),
                uniform_frame: u64::from(
                    program.settled_code().uniform_tail_frame && entry == TailEntry::AfterSaves,
                ),
                ..PjTailTarget::default()
            },
            fixed_base,
            program,
            tracked: None,
        });
        let (word, offset) =
            (t.program.settled_code().moving_entry()).unwrap_or((&t.fixed_base, 0));
        let mode = usize::from(t.program.trust() == Trust::Sandboxed);
        t.abi.code_base = [NO_CODE.as_ptr() as u64; 2];
        t.abi.code_base[mode] = word as u64;
        t.abi.entry_offset = offset;
        // The tail entry past the saves, for callers with the uniform frame: the frame
        // decision taken here, once, so their tail call jumps after one load.
        let skip = (t.abi.uniform_frame != 0)
            .then(|| t.program.settled_code().tail_entry_skip())
            .flatten();
        if let Some(skip) = skip {
            let word = std::ptr::addr_of_mut!(t.abi.tail_entry[mode]).cast::<AtomicU64>();
            match t.program.settled_code().movable() {
                Some(m) => {
                    let (_, entry_off) = m.entry_parts();
                    // SAFETY: the word lives in the box, untracked by its `Drop`.
                    unsafe { m.track_tail_entry(word, entry_off + u64::from(skip)) };
                    t.tracked = Some(mode);
                }
                None => t.abi.tail_entry[mode] = t.fixed_base + u64::from(skip),
            }
        }
        t
    }
}

impl Drop for TailTarget {
    fn drop(&mut self) {
        if let Some(mode) = self.tracked {
            if let Some(m) = self.program.settled_code().movable() {
                m.untrack_tail_entry(std::ptr::addr_of!(self.abi.tail_entry[mode]).cast());
            }
        }
    }
}

/// Puts `program` (or nothing) in slot `index` of prog array `map`; the program it
/// replaces is released once no run can still be in it.
pub(crate) fn set_prog_array_slot(
    map: &Map,
    index: u32,
    program: Option<Arc<Program>>,
    entry: TailEntry,
) -> Result<(), Error> {
    if map.spec().map_type != MapType::ProgArray {
        return Err(err(
            ErrorKind::InvalidArgument,
            format!("map `{}` is not a prog array", map.spec().name),
        ));
    }
    if let Some(p) = program.as_ref().filter(|p| !p.is_executable()) {
        return Err(err(
            ErrorKind::InvalidArgument,
            format!(
                "program `{}` cannot go in prog array `{}`: its code is not executable here ({:?})",
                p.name(),
                map.spec().name,
                p.arch()
            ),
        ));
    }
    let token = program.map_or(0, |program| {
        Box::into_raw(TailTarget::new(program, entry)) as u64
    });
    let old = match map.set_prog_slot(index, token) {
        Ok(old) => old,
        Err(e) => {
            if token != 0 {
                // SAFETY: made by `Box::into_raw` just above and never published.
                drop(unsafe { Box::from_raw(token as *mut TailTarget) });
            }
            return Err(map_error(e));
        }
    };
    if old != 0 {
        release_tail_target(old as usize);
    }
    Ok(())
}

/// Frees a prog-array target its slot no longer names, once no run can be using it: after
/// the epoch's grace period (the tail-call chooser's readers may be epoch-pinned), then after
/// the runs in progress then (runs hold a run pin only).
fn release_tail_target(old: usize) {
    struct Target(usize);
    // SAFETY: a `TailTarget` is Send (its program is); the address only carries it to
    // whichever thread performs the release.
    unsafe impl Send for Target {}
    let target = Target(old);
    let guard = crate::arena::epoch_pin();
    guard.defer(move || {
        let target = target;
        crate::run_pin::defer(Box::new(move || {
            let target = target;
            // SAFETY: `target.0` came from `Box::into_raw` in `set_prog_array_slot`; its
            // slot no longer names it, and every run that could have read the slot before
            // has ended (both waits).
            drop(unsafe { Box::from_raw(target.0 as *mut TailTarget) });
        }));
    });
    guard.flush();
    drop(guard);
    crate::run_pin::collect();
}

/// A map error as a runtime error.
pub(crate) fn map_error(e: MapError) -> Error {
    err(ErrorKind::InvalidArgument, e.to_string())
}

/// The kernel helpers the runtime provides: (id, name, function).
pub(crate) fn kernel_helpers() -> [(u32, &'static str, u64); 15] {
    let f = |h: extern "C" fn(u64, u64, u64, u64, u64) -> u64| h as *const () as u64;
    [
        (MAP_LOOKUP_ELEM, "bpf_map_lookup_elem", f(map_lookup_elem)),
        (MAP_UPDATE_ELEM, "bpf_map_update_elem", f(map_update_elem)),
        (MAP_DELETE_ELEM, "bpf_map_delete_elem", f(map_delete_elem)),
        (GET_PRANDOM_U32, "bpf_get_prandom_u32", f(get_prandom_u32)),
        (
            TRACE_PRINTK,
            "bpf_trace_printk",
            f(crate::trace_printk::trace_printk),
        ),
        (MAP_PUSH_ELEM, "bpf_map_push_elem", f(map_push_elem)),
        (MAP_POP_ELEM, "bpf_map_pop_elem", f(map_pop_elem)),
        (MAP_PEEK_ELEM, "bpf_map_peek_elem", f(map_peek_elem)),
        (RINGBUF_OUTPUT, "bpf_ringbuf_output", f(ringbuf_output)),
        (RINGBUF_RESERVE, "bpf_ringbuf_reserve", f(ringbuf_reserve)),
        (RINGBUF_SUBMIT, "bpf_ringbuf_submit", f(ringbuf_submit)),
        (RINGBUF_DISCARD, "bpf_ringbuf_discard", f(ringbuf_discard)),
        (RINGBUF_QUERY, "bpf_ringbuf_query", f(ringbuf_query)),
        (
            MAP_LOOKUP_PERCPU_ELEM,
            "bpf_map_lookup_percpu_elem",
            f(map_lookup_percpu_elem),
        ),
        // A tail call the backend cannot emit as a jump fails, as an empty slot does.
        (TAIL_CALL, "bpf_tail_call", f(no_tail_call)),
    ]
}

extern "C" fn no_tail_call(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    ENOENT
}

/// The entries of `kernel_helpers` that the code calls by id (`calls(id)`: a `call imm` of
/// `id`) and `table` has no entry for. A `callx` does not reach them: their arguments are the
/// program's map references, which a `call` site names; and a table that grew with every
/// `callx` program would change how each `callx` site dispatches.
pub(crate) fn add_kernel_helpers(table: &mut Vec<HelperEntry>, calls: impl Fn(u32) -> bool) {
    for (id, _, addr) in kernel_helpers() {
        // The call scan's bit first: most programs call none of these, and then the table
        // is not searched at all.
        if calls(id) && !table.iter().any(|h| h.id == id) {
            table.push(HelperEntry {
                id,
                inline_kind: PJ_INLINE_NONE,
                addr,
            });
        }
    }
}

/// Does `code` have a `call imm` of helper `id`?
fn calls(code: &[u8], id: u32) -> bool {
    code.chunks_exact(8).any(|c| {
        c[0] == 0x85 && c[1] >> 4 == 0 && u32::from_le_bytes([c[4], c[5], c[6], c[7]]) == id
    })
}
