//! Maps and tail calls from JIT-compiled programs, sandboxed and trusted, on the host's
//! backend (natively on x86-64): ns per operation, each case the median of `REPS` rounds in
//! which every case of its section runs once (in a rotating order), so the machine's drift
//! hits every side of a comparison alike.
//!
//! 1. Inlined array lookup + load of the value, against the same loop loading a stack value
//!    and against a hand-indexed load from the same memory; the lookup's native
//!    instructions (one-lookup program against one plain load); the same lookup when it is
//!    a helper call (a jump target between `lddw r1, map` and `call 1` stops the inlining).
//! 2. Per-CPU array increment (lookup + add) against the ARRAY one.
//! 3. Hash lookups, 4- and 8-byte keys, 1 Ki and 1 Mi entries, keys computed in the
//!    program, against the same loop over `std::collections::HashMap` with the maps' hash,
//!    in two orders: the keys' insertion order, and scattered (a permutation unrelated to
//!    it, as real lookups: elements allocated in insertion order are not visited in turn).
//!    `PACKJIT_BENCH_DISASM=1` adds the 1 Ki programs' code.
//! 4. update (existing key) and update+delete pairs for HASH, LRU_HASH, PERCPU_HASH and
//!    ARRAY; LPM_TRIE lookup (a /32 key in 1 Ki /24 routes), update (existing /24) and
//!    update+delete of a new /32; queue push+pop; ring buffer reserve+submit (drained by the
//!    host between rounds).
//! 5. A chain of 33 tail calls against 34 bpf-to-bpf calls doing the same work; the chain
//!    twice: past the target's saves (the uniform tail-call frame) and at its full entry;
//!    and the chain with its tail calls inside a bpf-to-bpf function, twice: the function
//!    called in tail position (`call f; exit`: each tail call jumps, as the entry's) and
//!    with its caller going on after the call (each target entered as a callee).
//!
//! `cargo bench -p packjit --bench maps`

#[path = "../tests/host/mod.rs"]
mod host;

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{LoadOptions, Program, Runtime};
use packjit_frontend::encode_insn;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

/// Rounds per section; figures are medians over them.
const REPS: usize = 9;
/// Iterations of the long loops (one program run each).
const LONG: i32 = 1 << 20;
/// Iterations per run of the helper-op loops: a hash update retires the element it
/// replaces until the run's epoch pin ends, so runs stay short, as real programs are.
const SHORT: i32 = 64;
/// Runs per sample of the helper-op loops.
const RUNS: usize = 2048;
/// The key multiplier of the hash cases (odd: a bijection on u32 and u64).
const KEY_MUL: i32 = 0x9E37_79B1_u32 as i32;

// ---- a small assembler with labels ---------------------------------------------------

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const R10: u8 = 10;

#[derive(Default)]
struct Asm {
    slots: Vec<[u8; 8]>,
    labels: Vec<(&'static str, usize)>,
    /// (pc, label, is a call): jumps get `off`, local calls `imm`.
    fixups: Vec<(usize, &'static str, bool)>,
}

impl Asm {
    fn op(&mut self, op: u8, dst: u8, src: u8, off: i16, imm: i32) -> &mut Self {
        self.slots.push(encode_insn(op, dst, src, off, imm));
        self
    }
    fn mov(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.op(0xb7, dst, 0, 0, imm)
    }
    fn movr(&mut self, dst: u8, src: u8) -> &mut Self {
        self.op(0xbf, dst, src, 0, 0)
    }
    fn add(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.op(0x07, dst, 0, 0, imm)
    }
    fn addr(&mut self, dst: u8, src: u8) -> &mut Self {
        self.op(0x0f, dst, src, 0, 0)
    }
    fn and(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.op(0x57, dst, 0, 0, imm)
    }
    fn lsh(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.op(0x67, dst, 0, 0, imm)
    }
    /// 64-bit `dst = src` + a stack offset: `dst = r10; dst += off`.
    fn stack_ptr(&mut self, dst: u8, off: i32) -> &mut Self {
        self.movr(dst, R10).add(dst, off)
    }
    fn ldx64(&mut self, dst: u8, src: u8, off: i16) -> &mut Self {
        self.op(0x79, dst, src, off, 0)
    }
    fn ldx32(&mut self, dst: u8, src: u8, off: i16) -> &mut Self {
        self.op(0x61, dst, src, off, 0)
    }
    fn stx64(&mut self, dst: u8, off: i16, src: u8) -> &mut Self {
        self.op(0x7b, dst, src, off, 0)
    }
    fn stx32(&mut self, dst: u8, off: i16, src: u8) -> &mut Self {
        self.op(0x63, dst, src, off, 0)
    }
    fn st64(&mut self, dst: u8, off: i16, imm: i32) -> &mut Self {
        self.op(0x7a, dst, 0, off, imm)
    }
    fn call(&mut self, id: i32) -> &mut Self {
        self.op(0x85, 0, 0, 0, id)
    }
    fn exit(&mut self) -> &mut Self {
        self.op(0x95, 0, 0, 0, 0)
    }
    /// `lddw dst, map k` (`BPF_PSEUDO_MAP_FD`).
    fn map(&mut self, dst: u8, k: i32) -> &mut Self {
        self.op(0x18, dst, 1, 0, k).op(0, 0, 0, 0, 0)
    }
    /// `lddw dst, &value of map k + off` (`BPF_PSEUDO_MAP_VALUE`).
    fn map_value(&mut self, dst: u8, k: i32, off: i32) -> &mut Self {
        self.op(0x18, dst, 2, 0, k).op(0, 0, 0, 0, off)
    }
    fn label(&mut self, name: &'static str) -> &mut Self {
        self.labels.push((name, self.slots.len()));
        self
    }
    /// A conditional (or `ja`, op 0x05) jump with an immediate operand to `label`.
    fn jump(&mut self, op: u8, dst: u8, imm: i32, label: &'static str) -> &mut Self {
        self.fixups.push((self.slots.len(), label, false));
        self.op(op, dst, 0, 0, imm)
    }
    /// A bpf-to-bpf call (`src = 1`, pc-relative `imm`).
    fn call_local(&mut self, label: &'static str) -> &mut Self {
        self.fixups.push((self.slots.len(), label, true));
        self.op(0x85, 0, 1, 0, 0)
    }
    fn finish(&mut self) -> Vec<u8> {
        for &(pc, name, call) in &self.fixups {
            let target = self.labels.iter().find(|l| l.0 == name).expect(name).1;
            let rel = target as i64 - pc as i64 - 1;
            let s = &mut self.slots[pc];
            if call {
                s[4..8].copy_from_slice(&(rel as i32).to_le_bytes());
            } else {
                s[2..4].copy_from_slice(&(rel as i16).to_le_bytes());
            }
        }
        self.slots.concat()
    }
}

const JEQ: u8 = 0x15;
const JNE: u8 = 0x55;

/// `prologue; r6 = n; r7 = 0; r8 = 0; loop: body; next: r8 += 1; r6 -= 1;
/// if r6 != 0 goto loop; r0 = r7; exit`. The body may jump to `next`; r7 is its result, r8
/// the iteration number, r9 free.
fn looped(n: i32, prologue: impl FnOnce(&mut Asm), body: impl FnOnce(&mut Asm)) -> Vec<u8> {
    let mut a = Asm::default();
    prologue(&mut a);
    a.mov(R6, n).mov(R7, 0).mov(R8, 0).label("loop");
    body(&mut a);
    a.label("next")
        .add(R8, 1)
        .add(R6, -1)
        .jump(JNE, R6, 0, "loop")
        .movr(R0, R7)
        .exit();
    a.finish()
}

/// Multiplier of the scattered lookup order (odd: `(j * SCATTER) & mask` visits every
/// index once per `mask + 1` iterations, far from the order the keys went in).
const SCATTER: i32 = 0x2545_F491;

/// The order a loop looks its keys up in.
#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// Index `j` at iteration `j`: the order the keys were inserted in, which elements
    /// allocated in insertion order follow.
    Insertion,
    /// Index `(j * SCATTER) & mask`: unrelated to the insertion order, as real lookups.
    Scattered,
}

impl Order {
    /// `r1 = r8`, scattered if asked.
    fn index(self, a: &mut Asm) {
        a.movr(R1, R8);
        if self == Order::Scattered {
            a.op(0x27, R1, 0, 0, SCATTER); // r1 *= SCATTER
        }
    }

    fn host(self, j: u64) -> u64 {
        match self {
            Order::Insertion => j,
            Order::Scattered => j.wrapping_mul(SCATTER as u64),
        }
    }
}

/// `*(u32 *)(r10 - 4) = (r8 & mask) * mul` (32-bit multiply; mul = 1 leaves it out).
fn key4(a: &mut Asm, mask: i32, mul: i32) {
    key4_in(a, Order::Insertion, mask, mul);
}

/// `key4` with the index in `order`.
fn key4_in(a: &mut Asm, order: Order, mask: i32, mul: i32) {
    order.index(a);
    a.and(R1, mask);
    if mul != 1 {
        a.op(0x24, R1, 0, 0, mul); // w1 *= mul
    }
    a.stx32(R10, -4, R1);
}

/// `*(u64 *)(r10 - 8) = (index & mask) * mul` (64-bit multiply, mul sign-extended), the
/// index in `order`.
fn key8_in(a: &mut Asm, order: Order, mask: i32, mul: i32) {
    order.index(a);
    a.and(R1, mask).op(0x27, R1, 0, 0, mul);
    a.stx64(R10, -8, R1);
}

fn host_key4(j: u64, mul: i32) -> u32 {
    (j as u32).wrapping_mul(mul as u32)
}

fn host_key8(j: u64, mul: i32) -> u64 {
    j.wrapping_mul(mul as i64 as u64)
}

// ---- measuring --------------------------------------------------------------------------

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each case returns ns per operation for one sample; runs `REPS` rounds, each case once
/// per round (starting one case later each round), and returns the medians.
fn side_by_side(cases: &mut [Box<dyn FnMut() -> f64 + '_>]) -> Vec<f64> {
    let n = cases.len();
    let mut samples = vec![Vec::with_capacity(REPS); n];
    for c in cases.iter_mut() {
        c(); // warm-up
    }
    for round in 0..REPS {
        for k in 0..n {
            let c = (round + k) % n;
            samples[c].push(cases[c]());
        }
    }
    samples.into_iter().map(median).collect()
}

/// One run of `p` taking `ops` operations: ns per operation; `check` sees r0.
fn per_op(p: &Program, ctx: &mut [u8], ops: f64, check: impl Fn(u64)) -> f64 {
    let t = Instant::now();
    let r0 = p.call(ctx).unwrap();
    let ns = t.elapsed().as_nanos() as f64;
    check(r0);
    ns / ops
}

/// `RUNS` runs of `p` of `per_run` operations each: ns per operation; r0 must be 0 (the
/// programs count failed operations in it).
fn runs_per_op(p: &Program, per_run: i32) -> f64 {
    let mut ctx = [0u8; 16];
    let mut failed = 0;
    let t = Instant::now();
    for _ in 0..RUNS {
        failed |= p.call(&mut ctx).unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64;
    assert_eq!(failed, 0, "{}: an operation failed", p.name());
    ns / (RUNS as f64 * per_run as f64)
}

// ---- setup --------------------------------------------------------------------------------

fn spec(name: &str, map_type: MapType, key: u32, value: u32, entries: u32) -> Arc<Map> {
    Map::new(MapSpec {
        name: name.into(),
        map_type,
        key_size: key,
        value_size: value,
        max_entries: entries,
        flags: 0,
    })
    .unwrap()
}

fn opts(maps: &[&Arc<Map>]) -> LoadOptions {
    LoadOptions {
        maps: maps.iter().map(|m| (*m).clone()).collect(),
        ..Default::default()
    }
}

/// The sandboxed load and the trusted one, named `name`.
fn both(rt: &Runtime, name: &str, code: &[u8], o: &LoadOptions) -> [Program; 2] {
    let o = LoadOptions {
        name: Some(name.into()),
        ..o.clone()
    };
    let s = rt.load(code, &o).expect(name);
    // SAFETY: the bench's programs touch only their context, their stack and map values
    // through the pointers the helpers hand out, within the values' sizes.
    let t = unsafe { rt.load_trusted(code, &o) }.expect(name);
    [s, t]
}

/// A row: label, then per trust mode (sandboxed, trusted) a figure.
fn row(label: &str, s: f64, t: f64, note: &str) {
    println!("| {label} | {s:.2} | {t:.2} | {note} |");
}

fn header(title: &str) {
    println!();
    println!("**{title}**");
    println!();
    println!("| case | sandboxed | trusted | note |");
    println!("|---|---|---|---|");
}

/// The maps' hash (`maps/src/hash.rs`): `mix(key ^ seed)`, one multiply and a fold.
#[derive(Clone, Copy)]
struct MixState(u64);

struct Mix {
    seed: u64,
    x: u64,
}

impl BuildHasher for MixState {
    type Hasher = Mix;
    fn build_hasher(&self) -> Mix {
        Mix { seed: self.0, x: 0 }
    }
}

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        let h = (self.x ^ self.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("integer keys only")
    }
    fn write_u32(&mut self, n: u32) {
        self.x = n as u64;
    }
    fn write_u64(&mut self, n: u64) {
        self.x = n;
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("uarch"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!("{} CPUs (nproc), {model}, {}", cpus, std::env::consts::ARCH)
}

/// Native code between two eBPF pcs of `p` as objdump sees it (x86-64 with objdump on the
/// PATH), or `None`.
fn disassemble(p: &Program) -> Option<String> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    disassemble_as(p, packjit::Arch::X86_64)
}

/// `p`'s code (compiled for `arch`) through binutils' objdump for that arch, if installed.
fn disassemble_as(p: &Program, arch: packjit::Arch) -> Option<String> {
    let (objdump, machine, options): (_, _, &[&str]) = match arch {
        packjit::Arch::X86_64 => ("objdump", "i386:x86-64", &["-M", "intel"]),
        packjit::Arch::Aarch64 => ("aarch64-linux-gnu-objdump", "aarch64", &[]),
        packjit::Arch::Riscv64 => ("riscv64-linux-gnu-objdump", "riscv:rv64", &[]),
    };
    let path = std::env::temp_dir().join(format!("packjit-maps-bench-{}.bin", std::process::id()));
    std::fs::write(&path, p.code()).ok()?;
    let out = std::process::Command::new(objdump)
        .args(["-D", "-b", "binary", "-m", machine])
        .args(options)
        .arg(&path)
        .output()
        .ok();
    let _ = std::fs::remove_file(&path);
    let out = out?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn main() {
    let rt = host::host_runtime();
    println!("# packjit maps and tail calls");
    println!();
    println!("command: `cargo bench -p packjit --bench maps`");
    println!("machine: {}", machine());
    println!(
        "figures: ns per operation, median of {REPS} rounds, every case of a section once per round"
    );
    // `PACKJIT_MAPS_BENCH=array,hash,ops,tail` picks sections (all by default).
    let only = std::env::var("PACKJIT_MAPS_BENCH").ok();
    let wanted = |s: &str| only.as_deref().is_none_or(|o| o.split(',').any(|w| w == s));
    type Section = fn(&Runtime);
    let sections: [(&str, Section); 4] = [
        ("array", array_lookups),
        ("hash", hash_lookups),
        ("ops", helper_ops),
        ("tail", tail_calls),
    ];
    for (name, f) in sections {
        if wanted(name) {
            f(&rt);
        }
    }
    while rt.reclaim() != 0 {}
}

// ---- 1 and 2: inlined array lookups -------------------------------------------------

fn array_lookups(rt: &Runtime) {
    let array = spec("array", MapType::Array, 4, 8, 1024);
    let percpu = spec("percpu", MapType::PercpuArray, 4, 8, 1024);
    let counts = spec("counts", MapType::Array, 4, 8, 1024);
    for k in 0..1024u32 {
        array
            .update(&k.to_le_bytes(), &1u64.to_le_bytes(), 0)
            .unwrap();
    }
    let o = opts(&[&array]);

    // lookup(array, &(i & 1023)); r7 += *value.
    let lookup_body = |stop_inlining: bool| {
        move |a: &mut Asm| {
            key4(a, 1023, 1);
            a.map(R1, 0);
            if stop_inlining {
                // `ja +0` makes the call a jump target: r1 is no longer known there.
                a.op(0x05, 0, 0, 0, 0);
            }
            a.stack_ptr(R2, -4).call(1).jump(JEQ, R0, 0, "next");
            a.ldx64(R1, R0, 0).addr(R7, R1);
        }
    };
    let init_stack = |a: &mut Asm| {
        a.st64(R10, -16, 1);
    };
    let inlined = both(
        rt,
        "array_lookup",
        &looped(LONG, init_stack, lookup_body(false)),
        &o,
    );
    let called = both(
        rt,
        "array_lookup_call",
        &looped(LONG, init_stack, lookup_body(true)),
        &o,
    );
    // The same key store, then a plain load of a stack value.
    let stack = both(
        rt,
        "stack_load",
        &looped(LONG, init_stack, |a| {
            key4(a, 1023, 1);
            a.ldx64(R1, R10, -16).addr(R7, R1);
        }),
        &o,
    );
    // The array's memory indexed by hand: r9 = &value 0; r7 += r9[i & 1023].
    let indexed = both(
        rt,
        "indexed_load",
        &looped(
            LONG,
            |a| {
                a.map_value(R9, 0, 0);
            },
            |a| {
                a.movr(R1, R8).and(R1, 1023).lsh(R1, 3).addr(R1, R9);
                a.ldx64(R1, R1, 0).addr(R7, R1);
            },
        ),
        &o,
    );

    // Per-CPU against ARRAY: lookup, then *value += 1.
    let inc_body = |a: &mut Asm| {
        key4(a, 1023, 1);
        a.map(R1, 0)
            .stack_ptr(R2, -4)
            .call(1)
            .jump(JEQ, R0, 0, "next");
        a.ldx64(R1, R0, 0).add(R1, 1).stx64(R0, 0, R1);
    };
    let inc_array = both(
        rt,
        "array_inc",
        &looped(LONG, |_| {}, inc_body),
        &opts(&[&counts]),
    );
    let inc_percpu = both(
        rt,
        "percpu_inc",
        &looped(LONG, |_| {}, inc_body),
        &opts(&[&percpu]),
    );

    let long = LONG as f64;
    let sum_is_n = |r0: u64| assert_eq!(r0, LONG as u64);
    let anything = |_: u64| {};
    let mut cases: Vec<Box<dyn FnMut() -> f64>> = Vec::new();
    for set in [&inlined, &called, &stack] {
        for p in set {
            cases.push(Box::new(move || per_op(p, &mut [0; 8], long, sum_is_n)));
        }
    }
    for p in &indexed {
        cases.push(Box::new(move || per_op(p, &mut [0; 8], long, sum_is_n)));
    }
    for set in [&inc_array, &inc_percpu] {
        for p in set {
            cases.push(Box::new(move || per_op(p, &mut [0; 8], long, anything)));
        }
    }
    let m = side_by_side(&mut cases);
    drop(cases);

    header("Array lookups, ns per loop iteration (1 Mi iterations per run)");
    row("inlined lookup + load", m[0], m[1], "");
    row(
        "helper-called lookup + load",
        m[2],
        m[3],
        "a jump target between `lddw r1` and `call 1`",
    );
    row("stack load (same key store)", m[4], m[5], "");
    row("hand-indexed load of the array", m[6], m[7], "");
    row(
        "inlined lookup − stack load",
        m[0] - m[4],
        m[1] - m[5],
        "the lookup's cost per iteration",
    );
    row(
        "inlined lookup − hand-indexed load",
        m[0] - m[6],
        m[1] - m[7],
        "",
    );
    row("ARRAY increment (lookup + add)", m[8], m[9], "");
    row(
        "PERCPU_ARRAY increment (lookup + add)",
        m[10],
        m[11],
        &format!(
            "per-CPU lookup: {}; ratio to ARRAY {:.2} / {:.2}",
            inc_percpu[0]
                .builtins()
                .map_or("-".into(), |b| b.percpu_lookup.to_string()),
            m[10] / m[8],
            m[11] / m[9]
        ),
    );

    // The increments are exact: every run added LONG, spread over keys (and CPUs).
    let total = |m: &Map| -> u64 {
        (0..1024u32)
            .map(|k| {
                let v = m.lookup(&k.to_le_bytes()).unwrap();
                v.chunks(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .sum::<u64>()
            })
            .sum()
    };
    let runs = (2 * (REPS + 1)) as u64;
    assert_eq!(
        total(&percpu),
        runs * LONG as u64,
        "per-CPU increments exact"
    );
    assert_eq!(total(&counts), runs * LONG as u64, "array increments exact");

    // Native instructions per use, the frame left out: a program doing it twice minus one
    // doing it once. A use is what C writes: store the key, look up, test for NULL, load
    // the value (and add it up); against it, a load of a global at a fixed address.
    #[derive(Clone, Copy, PartialEq)]
    enum Use {
        ConstantKey,
        KeyFromContext,
        Global,
    }
    let program = |how: Use, uses: usize| {
        const SKIP: [&str; 2] = ["skip0", "skip1"];
        let mut a = Asm::default();
        a.mov(R7, 0).movr(R8, R1);
        for (u, skip) in SKIP.iter().enumerate().take(uses) {
            let key = 3 + u as i32;
            match how {
                Use::Global => {
                    a.map_value(R1, 0, 0).ldx64(R1, R1, 0).addr(R7, R1);
                    continue;
                }
                Use::ConstantKey => a.mov(R6, key),
                Use::KeyFromContext => a.ldx32(R6, R8, 4 * u as i16),
            };
            a.stx32(R10, -4, R6).map(R1, 0).stack_ptr(R2, -4).call(1);
            a.jump(JEQ, R0, 0, skip)
                .ldx64(R1, R0, 0)
                .addr(R7, R1)
                .label(skip);
        }
        a.movr(R0, R7).exit();
        a.finish()
    };
    let mut ctx = [0u8; 8];
    ctx[..4].copy_from_slice(&3u32.to_le_bytes());
    ctx[4..].copy_from_slice(&4u32.to_le_bytes());
    let mut per_use = Vec::new();
    let mut shown = Vec::new();
    for how in [Use::ConstantKey, Use::KeyFromContext, Use::Global] {
        let once = both(rt, "once", &program(how, 1), &o);
        let twice = both(rt, "twice", &program(how, 2), &o);
        for p in &twice {
            assert_eq!(p.call(&mut ctx).unwrap(), 2, "every element holds 1");
        }
        per_use
            .push([0, 1].map(|k| twice[k].native_insns() as i64 - once[k].native_insns() as i64));
        if how != Use::Global {
            shown.push(twice);
        }
    }
    let without = both(rt, "global_twice", &program(Use::Global, 2), &o);
    println!();
    println!("**Native instructions per use (twice − once), sandboxed / trusted**");
    println!();
    println!("| use | sandboxed | trusted | over the global load |");
    println!("|---|---|---|---|");
    for (name, n) in [
        ("constant key: store, lookup, NULL test, load", per_use[0]),
        ("key from the context: the same", per_use[1]),
        ("load of a global (`lddw` + load)", per_use[2]),
    ] {
        println!(
            "| {name} | {} | {} | {} / {} |",
            n[0],
            n[1],
            n[0] - per_use[2][0],
            n[1] - per_use[2][1]
        );
    }
    if std::env::var_os("PACKJIT_BENCH_DISASM").is_some() {
        for p in shown.iter().flatten().chain(&without) {
            if let Some(d) = disassemble(p) {
                println!("\n{} ({:?}):\n{d}", p.name(), p.trust());
            }
        }
    }
}

// ---- 3: hash lookups against std's HashMap ------------------------------------------------

fn hash_lookups(rt: &Runtime) {
    println!();
    println!("**Hash lookups, ns per loop iteration (lookup + load of the value; 1 Mi per run)**");
    println!();
    println!(
        "| case | sandboxed | trusted | `Map::lookup_raw` from Rust | std HashMap, same hash | \
         program ÷ std, sandboxed / trusted |"
    );
    println!("|---|---|---|---|---|---|");
    for entries in [1u32 << 10, 1 << 20] {
        for key_size in [4u32, 8] {
            let map = spec("h", MapType::Hash, key_size, 8, entries);
            let seed = 0x5eed_u64;
            let mut std4: HashMap<u32, u64, MixState> = HashMap::with_hasher(MixState(seed));
            let mut std8: HashMap<u64, u64, MixState> = HashMap::with_hasher(MixState(seed));
            for j in 0..entries as u64 {
                if key_size == 4 {
                    let k = host_key4(j, KEY_MUL);
                    map.update(&k.to_le_bytes(), &1u64.to_le_bytes(), 0)
                        .unwrap();
                    std4.insert(k, 1);
                } else {
                    let k = host_key8(j, KEY_MUL);
                    map.update(&k.to_le_bytes(), &1u64.to_le_bytes(), 0)
                        .unwrap();
                    std8.insert(k, 1);
                }
            }
            for order in [Order::Insertion, Order::Scattered] {
                hash_lookup_row(rt, &map, &std4, &std8, key_size, entries, order);
            }
        }
    }
}

/// One row of the hash lookups: the program (sandboxed, trusted), the map's lookup from
/// Rust and std's HashMap, each looking up every key of `map` in `order`.
fn hash_lookup_row(
    rt: &Runtime,
    map: &Arc<Map>,
    std4: &HashMap<u32, u64, MixState>,
    std8: &HashMap<u64, u64, MixState>,
    key_size: u32,
    entries: u32,
    order: Order,
) {
    let mask = entries as i32 - 1;
    let koff = if key_size == 4 { -4 } else { -8 };
    let code = looped(
        LONG,
        |_| {},
        |a| {
            if key_size == 4 {
                key4_in(a, order, mask, KEY_MUL);
            } else {
                key8_in(a, order, mask, KEY_MUL);
            }
            a.map(R1, 0)
                .stack_ptr(R2, koff)
                .call(1)
                .jump(JEQ, R0, 0, "next");
            a.ldx64(R1, R0, 0).addr(R7, R1);
        },
    );
    let progs = both(rt, "hash_lookup", &code, &opts(&[map]));
    let long = LONG as f64;
    let sum_is_n = |r0: u64| assert_eq!(r0, LONG as u64, "every key hits");
    let mut cases: Vec<Box<dyn FnMut() -> f64 + '_>> = Vec::new();
    for p in &progs {
        cases.push(Box::new(move || per_op(p, &mut [0; 8], long, sum_is_n)));
    }
    cases.push(Box::new(move || {
        let t = Instant::now();
        let mut sum = 0u64;
        for j in 0..LONG as u64 {
            let j = order.host(j) & mask as u64;
            sum += if key_size == 4 {
                std4.get(&black_box(host_key4(j, KEY_MUL))).copied()
            } else {
                std8.get(&black_box(host_key8(j, KEY_MUL))).copied()
            }
            .unwrap_or(0);
        }
        let ns = t.elapsed().as_nanos() as f64;
        assert_eq!(sum, LONG as u64);
        ns / long
    }));
    // The map's own lookup, called from Rust under one pin (no helper, no program).
    cases.push(Box::new(move || {
        let _pin = packjit::arena::epoch_pin();
        let t = Instant::now();
        let mut sum = 0u64;
        for j in 0..LONG as u64 {
            let j = order.host(j) & mask as u64;
            let (k4, k8) = (host_key4(j, KEY_MUL), host_key8(j, KEY_MUL));
            let key: *const u8 = if key_size == 4 {
                black_box(&k4 as *const u32).cast()
            } else {
                black_box(&k8 as *const u64).cast()
            };
            // SAFETY: key_size bytes at `key`; pinned while the value is read.
            let p = unsafe { map.lookup_raw(key, 0) };
            if !p.is_null() {
                // SAFETY: a value has 8 bytes (8-aligned in the value slab).
                sum += unsafe { p.cast::<u64>().read() };
            }
        }
        let ns = t.elapsed().as_nanos() as f64;
        assert_eq!(sum, LONG as u64);
        ns / long
    }));
    let m = side_by_side(&mut cases);
    println!(
        "| {key_size}-byte keys, {} entries, {} order | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}× / {:.2}× |",
        if entries == 1 << 10 { "1 Ki" } else { "1 Mi" },
        match order {
            Order::Insertion => "insertion",
            Order::Scattered => "scattered",
        },
        m[0],
        m[1],
        m[3],
        m[2],
        m[0] / m[2],
        m[1] / m[2]
    );
    if std::env::var_os("PACKJIT_BENCH_DISASM").is_some() && entries == 1 << 10 {
        for p in &progs {
            if let Some(d) = disassemble(p) {
                println!(
                    "\n{} ({:?}, {key_size}-byte keys):\n{d}",
                    p.name(),
                    p.trust()
                );
            }
        }
    }
}

// ---- 4: updates, deletes, queue, ring buffer ----------------------------------------------

fn helper_ops(rt: &Runtime) {
    // Programs count failed operations in r7 (r0 at exit).
    let fail_if_nonzero = |a: &mut Asm, label: &'static str| {
        a.jump(JEQ, R0, 0, label).add(R7, 1).label(label);
    };
    // update(map, &key, &value, BPF_ANY) of keys (i & 1023) * KEY_MUL, all present.
    let update_body = |a: &mut Asm, mul: i32| {
        key4(a, 1023, mul);
        a.stx64(R10, -16, R8);
        a.map(R1, 0)
            .stack_ptr(R2, -4)
            .stack_ptr(R3, -16)
            .mov(R4, 0)
            .call(2);
        fail_if_nonzero(a, "u");
    };
    // Keys (1024 + (i & 255)) * KEY_MUL, never present: inserted, then deleted.
    let pair_body = |a: &mut Asm| {
        a.movr(R1, R8)
            .and(R1, 255)
            .add(R1, 1024)
            .op(0x24, R1, 0, 0, KEY_MUL);
        a.stx32(R10, -4, R1).stx64(R10, -16, R8);
        a.map(R1, 0)
            .stack_ptr(R2, -4)
            .stack_ptr(R3, -16)
            .mov(R4, 0)
            .call(2);
        fail_if_nonzero(a, "u");
        a.map(R1, 0).stack_ptr(R2, -4).call(3);
        fail_if_nonzero(a, "d");
    };
    let baseline = looped(
        SHORT,
        |_| {},
        |a| {
            key4(a, 1023, KEY_MUL);
            a.stx64(R10, -16, R8);
        },
    );

    let mut rows: Vec<(String, [Program; 2], String)> = Vec::new();
    let mut keep = Vec::new();
    for (name, t) in [
        ("HASH", MapType::Hash),
        ("LRU_HASH", MapType::LruHash),
        ("PERCPU_HASH", MapType::PercpuHash),
        ("ARRAY", MapType::Array),
    ] {
        let map = spec(name, t, 4, 8, 2048);
        let mul = if t == MapType::Array { 1 } else { KEY_MUL };
        for j in 0..1024u64 {
            let k = host_key4(j, mul);
            let v = vec![0u8; map.host_value_size()];
            map.update(&k.to_le_bytes(), &v, 0).unwrap();
        }
        let o = opts(&[&map]);
        let up = looped(SHORT, |_| {}, |a| update_body(a, mul));
        rows.push((
            format!("{name} update (existing key)"),
            both(rt, &format!("{name}_update"), &up, &o),
            String::new(),
        ));
        if t != MapType::Array {
            let pair = looped(SHORT, |_| {}, pair_body);
            rows.push((
                format!("{name} update + delete (new key)"),
                both(rt, &format!("{name}_pair"), &pair, &o),
                "per pair".into(),
            ));
        }
        keep.push(map);
    }
    // LPM_TRIE: 1024 /24 routes (the first three bytes of (j * KEY_MUL) in memory order)
    // under a /0, as a router's table; keys are `{ u32 prefixlen; u8 addr[4]; }` at r10 - 8.
    let lpm = Map::new(MapSpec {
        name: "LPM_TRIE".into(),
        map_type: MapType::LpmTrie,
        key_size: 8,
        value_size: 8,
        max_entries: 2048,
        flags: packjit::maps::BPF_F_NO_PREALLOC,
    })
    .unwrap();
    let lpm_key = |plen: u32, a: u32| [plen.to_ne_bytes(), a.to_le_bytes()].concat();
    lpm.update(&lpm_key(0, 0), &[0; 8], 0).unwrap();
    for j in 0..1024u64 {
        lpm.update(&lpm_key(24, host_key4(j, KEY_MUL)), &[0; 8], 0)
            .unwrap();
    }
    // *(u32 *)(r10 - 8) = plen; *(u32 *)(r10 - 4) = address.
    let lpm_key_body = |a: &mut Asm, plen: i32, mask: i32, base: i32| {
        a.movr(R1, R8)
            .and(R1, mask)
            .add(R1, base)
            .op(0x24, R1, 0, 0, KEY_MUL);
        a.stx32(R10, -4, R1).op(0x62, R10, 0, -8, plen);
    };
    let lpm_lookup = looped(
        SHORT,
        |_| {},
        |a| {
            lpm_key_body(a, 32, 1023, 0);
            a.map(R1, 0).stack_ptr(R2, -8).call(1);
            a.jump(JNE, R0, 0, "found").add(R7, 1).label("found");
        },
    );
    let lpm_update = looped(
        SHORT,
        |_| {},
        |a| {
            lpm_key_body(a, 24, 1023, 0);
            a.stx64(R10, -16, R8);
            a.map(R1, 0)
                .stack_ptr(R2, -8)
                .stack_ptr(R3, -16)
                .mov(R4, 0)
                .call(2);
            fail_if_nonzero(a, "u");
        },
    );
    let lpm_pair = looped(
        SHORT,
        |_| {},
        |a| {
            lpm_key_body(a, 32, 255, 1024);
            a.stx64(R10, -16, R8);
            a.map(R1, 0)
                .stack_ptr(R2, -8)
                .stack_ptr(R3, -16)
                .mov(R4, 0)
                .call(2);
            fail_if_nonzero(a, "u");
            a.map(R1, 0).stack_ptr(R2, -8).call(3);
            fail_if_nonzero(a, "d");
        },
    );
    let o = opts(&[&lpm]);
    rows.push((
        "LPM_TRIE lookup (/32 key, 1 Ki /24 routes)".into(),
        both(rt, "lpm_lookup", &lpm_lookup, &o),
        "longest match: a /24".into(),
    ));
    rows.push((
        "LPM_TRIE update (existing /24)".into(),
        both(rt, "lpm_update", &lpm_update, &o),
        String::new(),
    ));
    rows.push((
        "LPM_TRIE update + delete (new /32)".into(),
        both(rt, "lpm_pair", &lpm_pair, &o),
        "per pair".into(),
    ));
    keep.push(lpm);
    let queue = spec("queue", MapType::Queue, 0, 8, 1024);
    let push_pop = looped(
        SHORT,
        |_| {},
        |a| {
            a.stx64(R10, -8, R8);
            a.map(R1, 0).stack_ptr(R2, -8).mov(R3, 0).call(87);
            fail_if_nonzero(a, "push");
            a.map(R1, 0).stack_ptr(R2, -16).call(88);
            fail_if_nonzero(a, "pop");
            // The popped value is the pushed one.
            a.ldx64(R1, R10, -16).op(0x1d, R1, R8, 1, 0).add(R7, 1);
        },
    );
    rows.push((
        "QUEUE push + pop".into(),
        both(rt, "queue", &push_pop, &opts(&[&queue])),
        "per pair".into(),
    ));
    // 8 MiB: a sample's records (16 bytes each) take a quarter of it.
    let ring = spec("ring", MapType::RingBuf, 0, 0, 8 << 20);
    let reserve_submit = looped(
        SHORT,
        |_| {},
        |a| {
            a.map(R1, 0).mov(R2, 8).mov(R3, 0).call(131);
            a.jump(JNE, R0, 0, "ok")
                .add(R7, 1)
                .jump(0x05, 0, 0, "next")
                .label("ok");
            a.stx64(R0, 0, R8).movr(R1, R0).mov(R2, 0).call(132);
        },
    );
    rows.push((
        "RINGBUF reserve + submit (8 bytes)".into(),
        both(rt, "ringbuf", &reserve_submit, &opts(&[&ring])),
        "per pair; drained between rounds".into(),
    ));
    let base = both(rt, "baseline", &baseline, &LoadOptions::default());

    let mut cases: Vec<Box<dyn FnMut() -> f64 + '_>> = Vec::new();
    for (_, progs, _) in &rows {
        for p in progs {
            let ring = &ring;
            cases.push(Box::new(move || {
                let ns = runs_per_op(p, SHORT);
                if p.name() == "ringbuf" {
                    let mut records = 0;
                    ring.ringbuf_consume(&mut |_| records += 1);
                    assert_eq!(records, RUNS * SHORT as usize, "every record delivered");
                }
                ns
            }));
        }
    }
    for p in &base {
        cases.push(Box::new(move || runs_per_op(p, SHORT)));
    }
    let m = side_by_side(&mut cases);
    drop(cases);
    header(&format!(
        "Helper operations, ns per operation ({SHORT} per run, {RUNS} runs per sample)"
    ));
    let nb = m.len() - 2;
    for (k, (label, _, note)) in rows.iter().enumerate() {
        row(label, m[2 * k], m[2 * k + 1], note);
    }
    row(
        "run + loop overhead (same loop, no call)",
        m[nb],
        m[nb + 1],
        "included in every row above",
    );
    drop(keep);
}

// ---- 5: tail calls against bpf-to-bpf calls -----------------------------------------------

fn tail_calls(rt: &Runtime) {
    // Each link: ctx[0] += 1, then tail call slot 0 (itself): the entry and 33 tail calls
    // run the link 34 times; the 34th tail call fails and the run returns.
    let link = {
        let mut a = Asm::default();
        a.movr(R6, R1).ldx32(R2, R6, 0).add(R2, 1).stx32(R6, 0, R2);
        a.map(R2, 0).movr(R1, R6).mov(R3, 0).call(12);
        a.ldx32(R0, R6, 0).exit();
        a.finish()
    };
    // The same link with an index the compiler does not know (0 again, from an add): the
    // bound and, sandboxed, the index mask are run.
    let link_var = {
        let mut a = Asm::default();
        a.movr(R6, R1).ldx32(R2, R6, 0).add(R2, 1).stx32(R6, 0, R2);
        a.map(R2, 0).movr(R1, R6).mov(R3, 0).add(R3, 0).call(12);
        a.ldx32(R0, R6, 0).exit();
        a.finish()
    };
    // The same link, its tail call made inside a bpf-to-bpf function called in tail
    // position (`call f; exit`): each tail call leaves both frames and jumps, as from the
    // entry.
    let link_callee = {
        let mut a = Asm::default();
        a.movr(R6, R1).ldx32(R2, R6, 0).add(R2, 1).stx32(R6, 0, R2);
        a.movr(R1, R6).call_local("f").exit();
        a.label("f").movr(R6, R1);
        a.map(R2, 0).mov(R3, 0).call(12);
        a.ldx32(R0, R6, 0).exit();
        a.finish()
    };
    // The same, but the caller goes on after its call (`r0 += 0`): the function is not
    // reached in tail position, and each target is entered as a callee (its whole entry
    // called, what it overwrites in `env` saved around it), 33 deep.
    let link_callee_on = {
        let mut a = Asm::default();
        a.movr(R6, R1).ldx32(R2, R6, 0).add(R2, 1).stx32(R6, 0, R2);
        a.movr(R1, R6).call_local("f").add(R0, 0).exit();
        a.label("f").movr(R6, R1);
        a.map(R2, 0).mov(R3, 0).call(12);
        a.ldx32(R0, R6, 0).exit();
        a.finish()
    };
    // One tail call inside a function per run, into a leaf that does the other 33 links'
    // work: the typical use (a dispatcher function), no nesting.
    let leaf = {
        let mut a = Asm::default();
        a.ldx32(R2, R1, 0)
            .add(R2, 33)
            .stx32(R1, 0, R2)
            .movr(R0, R2)
            .exit();
        a.finish()
    };
    // Its baseline: the dispatcher's function does the leaf's work itself.
    let local_leaf = {
        let mut a = Asm::default();
        a.movr(R6, R1).ldx32(R2, R6, 0).add(R2, 1).stx32(R6, 0, R2);
        a.movr(R1, R6).call_local("f").exit();
        a.label("f").movr(R6, R1);
        a.ldx32(R2, R6, 0)
            .add(R2, 33)
            .stx32(R6, 0, R2)
            .movr(R0, R2)
            .exit();
        a.finish()
    };
    // 34 bpf-to-bpf calls of a function doing the link's work.
    let local = {
        let mut a = Asm::default();
        a.movr(R6, R1).mov(R8, 34).label("loop");
        a.movr(R1, R6)
            .call_local("f")
            .add(R8, -1)
            .jump(JNE, R8, 0, "loop");
        a.exit();
        a.label("f")
            .ldx32(R2, R1, 0)
            .add(R2, 1)
            .stx32(R1, 0, R2)
            .movr(R0, R2)
            .exit();
        a.finish()
    };
    // The same work inline.
    let inline = {
        let mut a = Asm::default();
        a.movr(R6, R1).mov(R8, 34).label("loop");
        a.ldx32(R2, R6, 0).add(R2, 1).stx32(R6, 0, R2);
        a.add(R8, -1).jump(JNE, R8, 0, "loop").movr(R0, R2).exit();
        a.finish()
    };
    // Sandboxed and trusted, then the same two entered at their full entry (the caller's
    // whole frame left, the target's whole prologue run: how every tail call went before
    // the uniform frame).
    let jumps = [
        spec("jumps_s", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t", MapType::ProgArray, 4, 4, 1),
        spec("jumps_s_full", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t_full", MapType::ProgArray, 4, 4, 1),
        spec("jumps_s_var", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t_var", MapType::ProgArray, 4, 4, 1),
        spec("jumps_s_callee", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t_callee", MapType::ProgArray, 4, 4, 1),
        spec("jumps_s_leaf", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t_leaf", MapType::ProgArray, 4, 4, 1),
        spec("jumps_s_callee_on", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t_callee_on", MapType::ProgArray, 4, 4, 1),
        spec("jumps_s_leaf_on", MapType::ProgArray, 4, 4, 1),
        spec("jumps_t_leaf_on", MapType::ProgArray, 4, 4, 1),
    ];
    let chain: Vec<Arc<Program>> = (0..14)
        .map(|k| {
            let o = LoadOptions {
                name: Some("tail_link".into()),
                ..opts(&[&jumps[k]])
            };
            let code = match k {
                0..4 => &link,
                4..6 => &link_var,
                6..10 => &link_callee,
                _ => &link_callee_on,
            };
            Arc::new(if k % 2 == 0 {
                rt.load(code, &o).unwrap()
            } else {
                // SAFETY: the link touches only its 4-byte context.
                unsafe { rt.load_trusted(code, &o) }.unwrap()
            })
        })
        .collect();
    // The leaves, in arrays 8, 9, 12 and 13: the links of those read them.
    let leaves: Vec<Arc<Program>> = [8, 9, 12, 13]
        .into_iter()
        .map(|k| {
            let o = LoadOptions {
                name: Some("tail_leaf".into()),
                ..opts(&[&jumps[k]])
            };
            Arc::new(if k % 2 == 0 {
                rt.load(&leaf, &o).unwrap()
            } else {
                // SAFETY: the leaf touches only its 4-byte context.
                unsafe { rt.load_trusted(&leaf, &o) }.unwrap()
            })
        })
        .collect();
    for k in 0..14 {
        let p = Some(match k {
            8 | 9 => leaves[k - 8].clone(),
            12 | 13 => leaves[k - 10].clone(),
            _ => chain[k].clone(),
        });
        if !(2..4).contains(&k) {
            rt.set_prog_array(&jumps[k], 0, p).unwrap();
        } else {
            rt.set_prog_array_full_entry(&jumps[k], 0, p).unwrap();
        }
    }
    if std::env::var_os("PACKJIT_BENCH_DISASM").is_some() {
        let links = [
            "",
            "",
            "",
            "",
            " with an unknown index",
            " with an unknown index",
            ", its tail call inside a function called in tail position",
            ", its tail call inside a function called in tail position",
            "",
            "",
            ", its tail call inside a function whose caller goes on",
            ", its tail call inside a function whose caller goes on",
        ];
        for k in [0, 1, 4, 5, 6, 7, 10, 11] {
            let trust = ["sandboxed", "trusted"][k % 2];
            if let Some(d) = disassemble(&chain[k]) {
                println!("\n```text\n# the tail link{}, {trust}\n{d}```\n", links[k]);
            }
        }
        // The other backends' code for the same link (compiled, not run).
        let foreign = Runtime::with_config(Default::default()).unwrap();
        foreign
            .add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
            .unwrap();
        foreign
            .add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
            .unwrap();
        for arch in [packjit::Arch::Aarch64, packjit::Arch::Riscv64] {
            for sandboxed in [true, false] {
                let o = LoadOptions {
                    arch: Some(arch),
                    ..opts(&[&jumps[0]])
                };
                let p = if sandboxed {
                    foreign.load(&link, &o)
                } else {
                    // SAFETY: compiled for another arch, never run here.
                    unsafe { foreign.load_trusted(&link, &o) }
                };
                let trust = if sandboxed { "sandboxed" } else { "trusted" };
                let p = p.map_err(|e| eprintln!("{arch:?} {trust}: {e}")).ok();
                if let Some(d) = p.and_then(|p| disassemble_as(&p, arch)) {
                    println!("\n```text\n# the tail link, {arch:?}, {trust}\n{d}```\n");
                }
            }
        }
    }
    let local = both(rt, "bpf_to_bpf", &local, &LoadOptions::default());
    let inline = both(rt, "inline", &inline, &LoadOptions::default());
    let local_leaf = both(rt, "local_leaf", &local_leaf, &LoadOptions::default());
    const RUNS_T: usize = 20_000;
    let time = |p: &Program| {
        let mut ctx = [0u8; 4];
        let t = Instant::now();
        for _ in 0..RUNS_T {
            ctx = [0; 4];
            p.call(&mut ctx).unwrap();
        }
        let ns = t.elapsed().as_nanos() as f64 / RUNS_T as f64;
        assert_eq!(u32::from_le_bytes(ctx), 34, "{}: 34 links ran", p.name());
        ns
    };
    let mut cases: Vec<Box<dyn FnMut() -> f64 + '_>> = Vec::new();
    for p in chain[..6].iter().map(|p| &**p).chain(&local).chain(&inline) {
        cases.push(Box::new(move || time(p)));
    }
    for p in chain[6..10].iter().map(|p| &**p).chain(&local_leaf) {
        cases.push(Box::new(move || time(p)));
    }
    for p in chain[10..].iter().map(|p| &**p) {
        cases.push(Box::new(move || time(p)));
    }
    let m = side_by_side(&mut cases);
    drop(cases);
    header("Tail calls against bpf-to-bpf calls, ns (34 links of `ctx[0] += 1` per run)");
    // m: the chains (uniform entry, full entry, index not known), bpf-to-bpf calls, inline,
    // the chain from functions in tail position, its leaf and the leaf's baseline, then
    // the same two from functions whose callers go on.
    let m = [
        m[0], m[1], m[2], m[3], m[6], m[7], m[8], m[9], m[4], m[5], m[10], m[11], m[12], m[13],
        m[14], m[15], m[16], m[17], m[18], m[19],
    ];
    row("run: entry + 33 tail calls", m[0], m[1], "");
    row(
        "run: the same, full entry",
        m[2],
        m[3],
        "the caller's frame left, the target's prologue run",
    );
    row("run: 34 bpf-to-bpf calls", m[4], m[5], "");
    row("run: the 34 links inline", m[6], m[7], "");
    row(
        "run: the same, index not known",
        m[8],
        m[9],
        "bound (and sandboxed, mask) run",
    );
    let tail = [(m[0] - m[6]) / 33.0, (m[1] - m[7]) / 33.0];
    let full = [(m[2] - m[6]) / 33.0, (m[3] - m[7]) / 33.0];
    let call = [(m[4] - m[6]) / 34.0, (m[5] - m[7]) / 34.0];
    let var = [(m[8] - m[6]) / 33.0, (m[9] - m[7]) / 33.0];
    let callee = [(m[10] - m[6]) / 33.0, (m[11] - m[7]) / 33.0];
    let callee_on = [(m[16] - m[6]) / 33.0, (m[17] - m[7]) / 33.0];
    row(
        "run: the same, tail calls inside a function called in tail position",
        m[10],
        m[11],
        "each leaves both frames and jumps",
    );
    row(
        "run: the same, tail calls inside a function whose caller goes on",
        m[16],
        m[17],
        "each target entered as a callee, 33 deep",
    );
    row("per tail call (minus inline, ÷ 33)", tail[0], tail[1], "");
    row(
        "per tail call, index not known (minus inline, ÷ 33)",
        var[0],
        var[1],
        "",
    );
    row(
        "per tail call, full entry (minus inline, ÷ 33)",
        full[0],
        full[1],
        "",
    );
    row(
        "per bpf-to-bpf call (minus inline, ÷ 34)",
        call[0],
        call[1],
        "",
    );
    row(
        "tail call ÷ bpf-to-bpf call",
        tail[0] / call[0],
        tail[1] / call[1],
        "goal ≤ 1",
    );
    row(
        "tail call, full entry ÷ bpf-to-bpf call",
        full[0] / call[0],
        full[1] / call[1],
        "",
    );
    row(
        "tail call, index not known ÷ bpf-to-bpf call",
        var[0] / call[0],
        var[1] / call[1],
        "",
    );
    row(
        "per tail call inside a function in tail position (minus inline, ÷ 33)",
        callee[0],
        callee[1],
        "the link's own bpf-to-bpf call included",
    );
    row(
        "tail call inside a function in tail position ÷ bpf-to-bpf call",
        callee[0] / call[0],
        callee[1] / call[1],
        "",
    );
    row(
        "per tail call inside a function whose caller goes on (minus inline, ÷ 33)",
        callee_on[0],
        callee_on[1],
        "the link's own bpf-to-bpf call included",
    );
    row(
        "tail call inside a function whose caller goes on ÷ bpf-to-bpf call",
        callee_on[0] / call[0],
        callee_on[1] / call[1],
        "",
    );
    row(
        "run: one tail call inside a function in tail position, into a leaf",
        m[12],
        m[13],
        "the leaf does 33 links' work",
    );
    row(
        "run: the same, the function's caller going on",
        m[18],
        m[19],
        "",
    );
    row(
        "run: the same work in the function, no tail call",
        m[14],
        m[15],
        "",
    );
    row(
        "one tail call inside a function in tail position, into a leaf (difference)",
        m[12] - m[14],
        m[13] - m[15],
        "the call and the jump",
    );
    row(
        "the same, the function's caller going on (difference)",
        m[18] - m[14],
        m[19] - m[15],
        "the call, the leaf's whole entry and the caller's `r0 += 0`",
    );
    for j in &jumps {
        rt.set_prog_array(j, 0, None).unwrap();
    }
}
