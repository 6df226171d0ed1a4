//! Helpers that call back into the program: `bpf_loop` (181) and `bpf_for_each_map_elem`
//! (164), expanded into bytecode as the kernel's verifier inlines `bpf_loop`.
//!
//! A helper cannot call eBPF code: a callback is a bpf-to-bpf function, with eBPF's
//! registers and frames. So each call site becomes a `call` of a function appended to the
//! program, one per site, which runs the loop in eBPF and calls the callback as a
//! bpf-to-bpf function. Nothing before the end of the program moves (the call replaces
//! the helper call in its slot), so every pc the program had keeps its meaning; code of the
//! appended functions has pcs past the program's last.
//!
//! The callback must be known where the helper is called: `r2` loaded in the same basic
//! block with the function's address (`lddw` with `src = BPF_PSEUDO_FUNC`, as clang and
//! libbpf emit it); for `bpf_for_each_map_elem`, `r1` an array or hash map (HASH,
//! PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH) the same way. Anything else is refused at load
//! naming the pc. Loops are ordinary eBPF: budgets, call depth and
//! the sandbox's checks apply to them as to any other code.

use crate::{err, Error, ErrorKind};
use packjit_frontend::encode_insn;
use std::sync::Arc;

use crate::maps::{Map, MapType};

/// `BPF_PSEUDO_FUNC` in an `lddw`'s source field: `imm` is the function's offset from the
/// next slot.
pub(crate) const PSEUDO_FUNC: u8 = 4;
const PSEUDO_MAP_FD: u8 = 1;

const BPF_LOOP: i32 = 181;
const FOR_EACH_MAP_ELEM: i32 = 164;
/// The kernel's bound on `bpf_loop`'s `nr_loops` (`BPF_MAX_LOOPS`).
const MAX_LOOPS: i32 = 1 << 23;

/// What a register holds in the current basic block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holds {
    Nothing,
    /// The function starting at this slot.
    Function(usize),
    /// Map `k` of the load.
    Map(usize),
}

/// Expands every `bpf_loop` and `bpf_for_each_map_elem` call of `code` (see the module
/// doc), and turns the `BPF_PSEUDO_FUNC` `lddw`s into plain constants (the callback's
/// slot: a value no code may call through, like the kernel's). `code` without either helper
/// or function reference is left as it is.
pub(crate) fn expand(code: &mut Vec<u8>, maps: &[Arc<Map>]) -> Result<(), Error> {
    let slots = code.len() / 8;
    let targets = crate::maps::jump_targets(code);
    let mut holds = [Holds::Nothing; 11];
    let mut appended: Vec<u8> = Vec::new();
    let mut pc = 0;
    while pc < slots {
        let s: [u8; 8] = code[8 * pc..8 * pc + 8].try_into().expect("8-byte slot");
        let (op, dst, src) = (s[0], (s[1] & 0xf) as usize, s[1] >> 4);
        let imm = i32::from_le_bytes([s[4], s[5], s[6], s[7]]);
        if targets[pc] {
            holds = [Holds::Nothing; 11];
        }
        if op == 0x18 && pc + 1 < slots {
            holds[dst.min(10)] = match src {
                PSEUDO_FUNC => {
                    let target = pc as i64 + 1 + imm as i64;
                    let Some(t) = usize::try_from(target).ok().filter(|&t| t < slots) else {
                        return Err(err(
                            ErrorKind::Verify,
                            format!(
                                "pc {pc}: lddw of a function at slot {target}, outside the program"
                            ),
                        ));
                    };
                    // A constant from here on: the slot, which nothing can call through.
                    code[8 * pc + 1] = dst as u8;
                    code[8 * pc + 4..8 * pc + 8].copy_from_slice(&(t as u32).to_le_bytes());
                    Holds::Function(t)
                }
                PSEUDO_MAP_FD => usize::try_from(imm).map_or(Holds::Nothing, Holds::Map),
                _ => Holds::Nothing,
            };
            pc += 2;
            continue;
        }
        match op & 7 {
            5 | 6 => {
                if op == 0x85 && src == 0 && (imm == BPF_LOOP || imm == FOR_EACH_MAP_ELEM) {
                    let Holds::Function(callback) = holds[2] else {
                        return Err(err(
                            ErrorKind::Verify,
                            format!(
                                "pc {pc}: {}'s callback (r2) must be a function address loaded in the same basic block (lddw with src = BPF_PSEUDO_FUNC)",
                                name(imm)
                            ),
                        ));
                    };
                    let at = slots + appended.len() / 8;
                    let body = if imm == BPF_LOOP {
                        loop_function(at, callback)
                    } else {
                        for_each_function(pc, at, callback, holds[1], maps)?
                    };
                    appended.extend(body);
                    // call the appended function (pc-relative, bpf-to-bpf).
                    let rel = at as i64 - pc as i64 - 1;
                    code[8 * pc..8 * pc + 8]
                        .copy_from_slice(&encode_insn(0x85, 0, 1, 0, rel as i32));
                }
                holds = [Holds::Nothing; 11];
            }
            1 | 4 | 7 => holds[dst.min(10)] = Holds::Nothing,
            2 => {}
            _ => holds = [Holds::Nothing; 11],
        }
        pc += 1;
    }
    code.extend(appended);
    Ok(())
}

fn name(helper: i32) -> &'static str {
    if helper == BPF_LOOP {
        "bpf_loop"
    } else {
        "bpf_for_each_map_elem"
    }
}

/// A function's code with symbolic jump targets, placed at slot `at`.
struct Builder {
    at: usize,
    code: Vec<[u8; 8]>,
    /// (slot index in `code`, label) of jumps to patch.
    jumps: Vec<(usize, usize)>,
    labels: Vec<Option<usize>>,
}

impl Builder {
    fn new(at: usize) -> Self {
        Builder {
            at,
            code: Vec::new(),
            jumps: Vec::new(),
            labels: Vec::new(),
        }
    }
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn bind(&mut self, l: usize) {
        self.labels[l] = Some(self.code.len());
    }
    fn i(&mut self, op: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.code.push(encode_insn(op, dst, src, off, imm));
    }
    fn jump(&mut self, op: u8, dst: u8, src: u8, imm: i32, to: usize) {
        self.jumps.push((self.code.len(), to));
        self.i(op, dst, src, 0, imm);
    }
    /// `call` of the function at absolute slot `target`.
    fn call(&mut self, target: usize) {
        let here = self.at + self.code.len();
        let rel = target as i64 - here as i64 - 1;
        self.i(0x85, 0, 1, 0, rel as i32);
    }
    fn finish(mut self) -> Vec<u8> {
        for (slot, label) in std::mem::take(&mut self.jumps) {
            let to = self.labels[label].expect("bound label");
            let off = (to as i64 - slot as i64 - 1) as i16;
            self.code[slot][2..4].copy_from_slice(&off.to_le_bytes());
        }
        self.code.concat()
    }
}

const R0: u8 = 0;
const R10: u8 = 10;

/// Saves r6-r8 in the function's own frame (the callback and the loop use them).
fn save(b: &mut Builder) {
    for (k, r) in [6u8, 7, 8].into_iter().enumerate() {
        b.i(0x7b, R10, r, -8 * (k as i16 + 1), 0);
    }
}

fn restore_and_exit(b: &mut Builder) {
    for (k, r) in [6u8, 7, 8].into_iter().enumerate() {
        b.i(0x79, r, R10, -8 * (k as i16 + 1), 0);
    }
    b.i(0x95, 0, 0, 0, 0);
}

/// `long bpf_loop(u32 nr_loops, callback, ctx, u64 flags)`: `callback(i, ctx)` for `i` in
/// `0..nr_loops` until it returns non-zero; the number of calls made, `-EINVAL` for
/// non-zero flags, `-E2BIG` above the kernel's bound.
fn loop_function(at: usize, callback: usize) -> Vec<u8> {
    let mut b = Builder::new(at);
    let (einval, e2big, top, done) = (b.label(), b.label(), b.label(), b.label());
    b.jump(0x55, 4, 0, 0, einval); // if r4 != 0
    b.i(0xbc, 1, 1, 0, 0); // w1 = w1: nr_loops is a u32
    b.jump(0x25, 1, 0, MAX_LOOPS, e2big); // if r1 > MAX_LOOPS
    save(&mut b);
    b.i(0xbf, 6, 1, 0, 0); // r6 = nr_loops
    b.i(0xb7, 7, 0, 0, 0); // r7 = i = 0
    b.i(0xbf, 8, 3, 0, 0); // r8 = ctx
    b.bind(top);
    b.jump(0x3d, 7, 6, 0, done); // if i >= nr_loops
    b.i(0xbf, 1, 7, 0, 0);
    b.i(0xbf, 2, 8, 0, 0);
    b.call(callback);
    b.i(0x07, 7, 0, 0, 1);
    b.jump(0x15, R0, 0, 0, top); // continue while the callback returns 0
    b.bind(done);
    b.i(0xbf, R0, 7, 0, 0);
    restore_and_exit(&mut b);
    b.bind(einval);
    b.i(0xb7, R0, 0, 0, -22);
    b.i(0x95, 0, 0, 0, 0);
    b.bind(e2big);
    b.i(0xb7, R0, 0, 0, -7);
    b.i(0x95, 0, 0, 0, 0);
    b.finish()
}

/// `long bpf_for_each_map_elem(map, callback, ctx, u64 flags)` over an array map:
/// `callback(map, &key, value, ctx)` for each index until it returns non-zero; the number
/// of elements visited, `-EINVAL` for non-zero flags. The key lives in this function's
/// frame; the value is the array's element (this CPU's copy for a per-CPU array).
fn for_each_function(
    pc: usize,
    at: usize,
    callback: usize,
    map: Holds,
    maps: &[Arc<Map>],
) -> Result<Vec<u8>, Error> {
    let Holds::Map(k) = map else {
        return Err(err(
            ErrorKind::Verify,
            format!("pc {pc}: bpf_for_each_map_elem's map (r1) must be a map loaded in the same basic block"),
        ));
    };
    let Some(m) = maps.get(k) else {
        return Err(err(
            ErrorKind::Verify,
            format!(
                "pc {pc}: lddw names map {k}, but the load has {} maps",
                maps.len()
            ),
        ));
    };
    let spec = m.spec();
    let hash = matches!(
        spec.map_type,
        MapType::Hash | MapType::PercpuHash | MapType::LruHash | MapType::LruPercpuHash
    );
    if !hash && !matches!(spec.map_type, MapType::Array | MapType::PercpuArray) {
        return Err(err(
            ErrorKind::Unsupported,
            format!(
                "pc {pc}: bpf_for_each_map_elem over map `{}` of type {}: only array and hash maps are iterated in programs (the kernel's {} has no for_each callback)",
                spec.name,
                spec.map_type.name(),
                spec.map_type.name()
            ),
        ));
    }
    if hash {
        return hash_for_each_function(pc, at, callback, k, m);
    }
    let (mut b, l) = EachLoop::start(at, k);
    b.i(0x18, 6, 0, 0, spec.max_entries as i32); // r6 = entries (as u32 bits)
    b.i(0, 0, 0, 0, 0);
    b.i(0xb7, 7, 0, 0, 0); // r7 = index
    b.i(0xbf, 8, 3, 0, 0); // r8 = ctx
    b.bind(l.top);
    b.jump(0x3d, 7, 6, 0, l.done);
    b.i(0x63, R10, 7, -32, 0); // key = index
    l.map_ref(&mut b, 1);
    b.i(0xbf, 2, R10, 0, 0);
    b.i(0x07, 2, 0, 0, -32);
    b.i(0x85, 0, 0, 0, 1); // the element (inlined for arrays)
    b.i(0xbf, 3, R0, 0, 0);
    Ok(call_and_finish(b, &l, -32, callback))
}

/// The labels and the map of a `bpf_for_each_map_elem` loop function.
struct EachLoop {
    /// Map `k` of the load.
    k: usize,
    einval: usize,
    top: usize,
    done: usize,
}

impl EachLoop {
    /// The function's start: `-EINVAL` for non-zero flags (r4), r6-r8 saved.
    fn start(at: usize, k: usize) -> (Builder, EachLoop) {
        let mut b = Builder::new(at);
        let l = EachLoop {
            k,
            einval: b.label(),
            top: b.label(),
            done: b.label(),
        };
        b.jump(0x55, 4, 0, 0, l.einval); // if flags != 0
        save(&mut b);
        (b, l)
    }

    /// `lddw dst, map k`.
    fn map_ref(&self, b: &mut Builder, dst: u8) {
        b.i(0x18, dst, PSEUDO_MAP_FD, 0, self.k as i32);
        b.i(0, 0, 0, 0, 0);
    }
}

/// The end of a for_each loop, with r3 = the element's value and its key at `r10 + key_at`:
/// `callback(map, &key, value, ctx = r8)`, counted in r7, back to the top while it returns
/// 0; then the count, or `-EINVAL`.
fn call_and_finish(mut b: Builder, l: &EachLoop, key_at: i32, callback: usize) -> Vec<u8> {
    l.map_ref(&mut b, 1);
    b.i(0xbf, 2, R10, 0, 0);
    b.i(0x07, 2, 0, 0, key_at);
    b.i(0xbf, 4, 8, 0, 0);
    b.call(callback);
    b.i(0x07, 7, 0, 0, 1);
    b.jump(0x15, R0, 0, 0, l.top);
    b.bind(l.done);
    b.i(0xbf, R0, 7, 0, 0);
    restore_and_exit(&mut b);
    b.bind(l.einval);
    b.i(0xb7, R0, 0, 0, -22);
    b.i(0x95, 0, 0, 0, 0);
    b.finish()
}

/// Where [`hash_for_each_function`] keeps the walk's cursor: below the saved r6-r8.
const CURSOR: i16 = -32;

/// `bpf_for_each_map_elem` over a hash map: `callback(map, &key, value, ctx)` for each
/// element until it returns non-zero; the number visited, `-EINVAL` for non-zero flags.
/// Each step is a call of the runtime's [`HASH_ITER_NEXT`](crate::maps::HASH_ITER_NEXT),
/// which copies the element's key into this function's frame (keys live with the map's
/// bookkeeping, which programs never reach) and returns this CPU's value.
fn hash_for_each_function(
    pc: usize,
    at: usize,
    callback: usize,
    k: usize,
    m: &Map,
) -> Result<Vec<u8>, Error> {
    let spec = m.spec();
    // The key buffer sits below the cursor in this function's 512-byte frame.
    let key_bytes = (spec.key_size as i32 + 7) & !7;
    let key_at = CURSOR as i32 - key_bytes;
    if key_at < -512 {
        return Err(err(
            ErrorKind::Unsupported,
            format!(
                "pc {pc}: bpf_for_each_map_elem over map `{}`: its {}-byte keys do not fit the iterating function's frame (at most {} bytes)",
                spec.name,
                spec.key_size,
                512 + CURSOR as i32
            ),
        ));
    }
    let (mut b, l) = EachLoop::start(at, k);
    b.i(0xb7, 7, 0, 0, 0); // r7 = visited
    b.i(0xbf, 8, 3, 0, 0); // r8 = ctx
    b.i(0x7a, R10, 0, CURSOR, 0); // cursor = 0
    b.bind(l.top);
    l.map_ref(&mut b, 1);
    b.i(0xbf, 2, R10, 0, 0);
    b.i(0x07, 2, 0, 0, CURSOR as i32);
    b.i(0xbf, 3, R10, 0, 0);
    b.i(0x07, 3, 0, 0, key_at);
    b.i(0x85, 0, 0, 0, crate::maps::HASH_ITER_NEXT as i32);
    b.jump(0x15, R0, 0, 0, l.done); // no element left
    b.i(0xbf, 3, R0, 0, 0);
    Ok(call_and_finish(b, &l, key_at, callback))
}
