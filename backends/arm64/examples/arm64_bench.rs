//! packjit-arm64 benchmark.
//!
//! ```text
//! cargo run --release -p packjit-arm64 --example arm64_bench            # host: compile figures
//! packjit_cross_cargo aarch64-unknown-linux-gnu run --release -p packjit-arm64 --example arm64_bench
//!                                                                       # + JIT vs rbpf under qemu
//! ```
//!
//! Prints compile throughput (eBPF instructions per second), arm64 instructions and bytes per
//! eBPF instruction (conformance corpus and a 1,000+ instruction program), and on arm64 the
//! run time of a compute-bound loop (≥ 10^8 eBPF instructions) JIT vs rbpf's interpreter.

use packjit_arm64::emit_program;
use packjit_arm64::{Arm64Backend, FEATURE_LSE};
use packjit_plugin_api::{
    CodeArena, CompileError, CompileRequest, HelperEntry, JitBackend, Region,
};
use std::cell::RefCell;
use std::time::Instant;

use packjit_frontend::encode_insn as ins;

/// A code arena over a Vec, reset per compile (what a host arena's write costs: a copy).
#[derive(Default)]
struct VecArena(RefCell<Vec<u8>>);

impl CodeArena for VecArena {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        let mut m = self.0.borrow_mut();
        m.clear();
        m.resize(size, 0);
        Ok(Region {
            exec_addr: 0x10_0000,
            size: size as u64,
            cookie: 0,
        })
    }
    fn write(&self, _: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        self.0.borrow_mut()[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn free(&self, _: &Region) {}
}

/// A packet-filter-like program of `blocks` x 40 instructions: header loads, masks and
/// shifts, compares with early exits, stack spills, a helper call, an atomic counter.
fn filter_program(blocks: usize) -> Vec<u8> {
    let mut p = vec![
        ins(0xbf, 6, 1, 0, 0), // r6 = ctx
        ins(0xb7, 7, 0, 0, 0), // r7 = 0 (accumulator)
        ins(0x7a, 10, 0, -8, 0),
    ];
    for b in 0..blocks as i32 {
        let blk = [
            ins(0x71, 2, 6, 12, 0),                    // r2 = byte ctx[12]
            ins(0x69, 3, 6, 14, 0),                    // r3 = half ctx[14]
            ins(0x61, 4, 6, 16, 0),                    // r4 = word ctx[16]
            ins(0x79, 5, 6, 24, 0),                    // r5 = dword ctx[24]
            ins(0x57, 2, 0, 0, 0xf0),                  // r2 &= 0xf0
            ins(0x77, 2, 0, 0, 4),                     // r2 >>= 4
            ins(0xdc, 3, 0, 0, 16),                    // be16 r3
            ins(0x55, 2, 0, 2, 4),                     // if r2 != 4 goto +2
            ins(0x07, 7, 0, 0, 1),                     // r7 += 1
            ins(0x05, 0, 0, 1, 0),                     // goto +1
            ins(0x07, 7, 0, 0, 2),                     // r7 += 2
            ins(0x2d, 3, 4, 1, 0),                     // if r3 > r4 goto +1
            ins(0xbf, 3, 4, 0, 0),                     // r3 = r4
            ins(0x0f, 7, 3, 0, 0),                     // r7 += r3
            ins(0x27, 5, 0, 0, 0x9e37_79b1u32 as i32), // r5 *= golden
            ins(0xaf, 7, 5, 0, 0),                     // r7 ^= r5
            ins(0x7b, 10, 7, -16, 0),                  // spill r7
            ins(0x65, 4, 0, 3, 1000 + b),              // if r4 s> imm goto +3
            ins(0x47, 7, 0, 0, 0x100),                 // r7 |= 0x100
            ins(0x15, 7, 0, 1, 0),                     // if r7 == 0 goto +1
            ins(0xc7, 7, 0, 0, 3),                     // r7 s>>= 3
            ins(0x79, 8, 10, -16, 0),                  // r8 = spill
            ins(0x1f, 8, 7, 0, 0),                     // r8 -= r7
            ins(0x4f, 7, 8, 0, 0),                     // r7 |= r8
            ins(0x97, 8, 0, 0, 1000),                  // r8 %= 1000
            ins(0x37, 8, 0, 0, 3),                     // r8 /= 3
            ins(0x0f, 7, 8, 0, 0),                     // r7 += r8
            ins(0xb7, 9, 0, 0, 1),                     // r9 = 1
            ins(0xdb, 10, 9, -8, 0),                   // lock *(u64 *)(r10 - 8) += r9
            ins(0xbf, 1, 7, 0, 0),                     // r1 = r7
            ins(0xb7, 2, 0, 0, 7),                     // r2 = 7
            ins(0x85, 0, 0, 0, 1),                     // call helper 1
            ins(0x0f, 7, 0, 0, 0),                     // r7 += r0
            ins(0x45, 7, 0, 1, 1),                     // if r7 & 1 goto +1
            ins(0x87, 7, 0, 0, 0),                     // r7 = -r7
            ins(0x67, 7, 0, 0, 1),                     // r7 <<= 1
            ins(0x63, 6, 7, 32, 0),                    // *(u32 *)(r6 + 32) = r7
            ins(0x62, 6, 0, 36, 0x1234_5678),          // *(u32 *)(r6 + 36) = imm
            ins(0xa5, 7, 0, 1, 77),                    // if r7 < 77 goto +1
            ins(0x04, 7, 0, 0, -1),                    // w7 += -1
        ];
        p.extend(blk);
    }
    p.extend([ins(0xbf, 0, 7, 0, 0), ins(0x95, 0, 0, 0, 0)]);
    p.concat()
}

fn helpers() -> Vec<HelperEntry> {
    (0..32)
        .map(|id| HelperEntry {
            id,
            inline_kind: 0,
            addr: 0x0000_ffff_1234_0000 + id as u64 * 16,
        })
        .collect()
}

fn compile_figures() {
    let be = Arm64Backend::new();
    let hs = helpers();
    let arena = VecArena::default();

    // Conformance corpus: every tests/*.data program.
    let dir = packjit_testkit::conformance::suite_dir().join("tests");
    let (mut slots, mut native, mut bytes, mut n) = (0usize, 0usize, 0usize, 0usize);
    let mut density = packjit_testkit::density::Density::default();
    for path in packjit_testkit::data::list_dir(&dir).expect("conformance suite") {
        let Ok(case) = packjit_testkit::data::TestCase::load(&path) else {
            continue;
        };
        let Ok(code) = case.program() else { continue };
        if case.expects_error() {
            continue;
        }
        if let Ok(out) = emit_program(&code, &hs, FEATURE_LSE) {
            let prog = packjit_frontend::decode(&code, &hs).expect("compiled, so it decodes");
            // Instruction indices: data (a `callx` table) before an offset is not counted.
            let starts: Vec<usize> = out
                .inst_offsets
                .iter()
                .map(|&o| {
                    let o = o as usize;
                    let data: usize = out
                        .data
                        .iter()
                        .filter(|r| r.end <= o)
                        .map(|r| r.len())
                        .sum();
                    (o - data) / 4
                })
                .collect();
            density.add(&prog, &starts, out.native_insns);
            slots += code.len() / 8;
            native += out.native_insns;
            bytes += out.bytes.len();
            n += 1;
        }
    }
    println!(
        "conformance corpus: {n} programs, {slots} eBPF insns -> {native} arm64 insns ({:.2} per eBPF insn, {:.1} bytes), prologue/epilogue included",
        native as f64 / slots as f64,
        bytes as f64 / slots as f64
    );
    print!("{}", density.report("arm64"));

    let code = filter_program(30);
    let slots = code.len() / 8;
    let out = emit_program(&code, &hs, FEATURE_LSE).unwrap();
    println!(
        "filter program: {slots} eBPF insns -> {} arm64 insns ({:.2} per eBPF insn, {:.1} bytes/insn, {} bytes)",
        out.native_insns,
        out.native_insns as f64 / slots as f64,
        out.bytes.len() as f64 / slots as f64,
        out.bytes.len()
    );
    let out0 = emit_program(&code, &hs, 0).unwrap();
    println!(
        "  without LSE (LL/SC atomics): {} arm64 insns",
        out0.native_insns
    );

    // Compile throughput through the JitBackend entry point (verify + emit + install).
    let req = CompileRequest {
        code: &code,
        helpers: &hs,
        features: FEATURE_LSE,
        flags: 0,
        blind_key: 0,
    };
    for _ in 0..20 {
        be.compile(&req, &arena).unwrap();
    }
    let iters = 400;
    let t = Instant::now();
    for _ in 0..iters {
        be.compile(&req, &arena).unwrap();
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "compile throughput: {:.2} M eBPF insns/s ({:.1} us per {slots}-insn program, {iters} compiles)",
        (slots * iters) as f64 / dt / 1e6,
        dt / iters as f64 * 1e6
    );
    let big = filter_program(2500);
    let t = Instant::now();
    let o = emit_program(&big, &hs, FEATURE_LSE).unwrap();
    let dt = t.elapsed().as_secs_f64();
    println!(
        "large program: {} eBPF insns in {:.1} ms ({:.2} M insns/s), {} KiB of code",
        big.len() / 8,
        dt * 1e3,
        (big.len() / 8) as f64 / dt / 1e6,
        o.bytes.len() / 1024
    );
}

/// r0 = 0; r2 = iters; r3 = 0x12345; loop (13 insns): mix r3 into r0 through ALU, stack and
/// ctx memory; r2 -= 1; if r2 != 0 goto loop; exit. Only pre-v4 instructions (rbpf runs it).
#[cfg(target_arch = "aarch64")]
fn compute_loop(iters: i32) -> Vec<u8> {
    [
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 2, 0, 0, iters),
        ins(0xb7, 3, 0, 0, 0x12345),
        // loop:
        ins(0xbf, 4, 3, 0, 0),
        ins(0x27, 4, 0, 0, 0x9e37_79b1u32 as i32),
        ins(0xaf, 4, 0, 0, 0),
        ins(0x77, 4, 0, 0, 7),
        ins(0x0f, 0, 4, 0, 0),
        ins(0x7b, 10, 0, -8, 0),
        ins(0x79, 5, 10, -8, 0),
        ins(0x57, 5, 0, 0, 0xff),
        ins(0x0f, 3, 5, 0, 0),
        ins(0x07, 3, 0, 0, 1),
        ins(0x63, 1, 3, 0, 0),
        ins(0x17, 2, 0, 0, 1),
        ins(0x55, 2, 0, -13, 0),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[cfg(target_arch = "aarch64")]
fn exec_figures() {
    use packjit::{LoadOptions, Runtime};
    use std::sync::Arc;
    let iters = 8_000_000;
    let code = compute_loop(iters);
    let insns = 3 + 13 * iters as u64 + 1;
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(Arm64Backend::new()))
        .expect("backend");
    let prog = rt.load(&code, &LoadOptions::default()).expect("load");
    let mut mem = [0u8; 64];
    let t = Instant::now();
    let r_jit = prog.call(&mut mem).expect("call");
    let t_jit = t.elapsed().as_secs_f64();
    let mut mem2 = [0u8; 64];
    let vm = rbpf::EbpfVmRaw::new(Some(&code)).expect("rbpf");
    let t = Instant::now();
    let r_int = vm.execute_program(&mut mem2).expect("rbpf run");
    let t_int = t.elapsed().as_secs_f64();
    assert_eq!(r_jit, r_int, "JIT and rbpf disagree");
    assert_eq!(mem, mem2);
    println!(
        "compute loop: {insns} eBPF insns; JIT {:.3} s ({:.0} M insns/s), rbpf interpreter {:.3} s ({:.1} M insns/s): JIT {:.1}x faster (same qemu-aarch64)",
        t_jit,
        insns as f64 / t_jit / 1e6,
        t_int,
        insns as f64 / t_int / 1e6,
        t_int / t_jit
    );
}

fn main() {
    compile_figures();
    #[cfg(target_arch = "aarch64")]
    exec_figures();
}
