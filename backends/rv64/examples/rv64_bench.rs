//! RV64 backend figures.
//!
//! * Compile throughput (eBPF instructions per second) on whatever host runs this.
//! * Native RV64 instructions and bytes per eBPF instruction on a generated 1,000+
//!   instruction program and on the bpf_conformance corpus (read and assembled by the
//!   testkit), with and without the optional extensions, C (compressed) on and off.
//! * The same corpus compiled sandboxed (`PJ_COMPILE_SANDBOX`, and with the budget): native
//!   instructions per eBPF instruction against trusted code.
//! * On riscv64 (qemu-user or hardware): a compute-bound loop run by the JIT (through
//!   `packjit::Runtime`) and by rbpf's interpreter, as a speed ratio; and compute-and-memory
//!   loops run sandboxed and trusted side by side, as a time ratio.
//! * On riscv64: the sandbox benchmark programs (context hash loop, compute, stack table
//!   through a walked pointer and through a masked index, header parsing) in every mode side
//!   by side, with native instructions per eBPF instruction on the hot loop's path. The
//!   "no clamp" and "no groups" rows use the measurement-only `EmitOptions` of
//!   `packjit_rv64::emit_request_with` (not reachable from the plugin ABI or the runtime):
//!   the first shows what the Spectre-v1 mask costs, the second one check per access.
//!
//! ```text
//! cargo run --release -p packjit-rv64 --example rv64_bench -- [CONFORMANCE_SUITE_DIR]
//! packjit_cross_cargo riscv64gc-unknown-linux-gnu run --release -p packjit-rv64 --example rv64_bench
//! ```

use packjit_plugin_api::HelperEntry;
use packjit_rv64::{emit_program, native_insn_count, FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
use std::time::Instant;

use packjit_frontend::encode_insn as ins;

/// A deterministic program of `n` instructions with the instruction mix of typical
/// filters/compute kernels: ALU64/ALU32 with registers and immediates, stack loads and
/// stores, forward branches, a helper call now and then.
fn generated_program(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut s = Vec::new();
    for r in 0..10u8 {
        s.push(ins(0xb7, r, 0, 0, r as i32 * 7));
    }
    while s.len() < n {
        let r = next();
        let dst = (r % 10) as u8;
        let src = ((r >> 8) % 10) as u8;
        let imm = ((r >> 16) as i32) % 5000;
        let left = n - s.len();
        match (r >> 40) % 10 {
            0..=3 => {
                let ops = [0x00u8, 0x10, 0x20, 0x40, 0x50, 0xa0, 0x60, 0x70, 0xb0];
                let op = ops[((r >> 44) % ops.len() as u64) as usize];
                let class = if (r >> 50) & 1 == 0 { 0x07 } else { 0x04 };
                let imm = if matches!(op, 0x60 | 0x70) {
                    imm & 31
                } else {
                    imm
                };
                if (r >> 51) & 1 == 0 {
                    s.push(ins(class | op | 8, dst, src, 0, 0));
                } else {
                    s.push(ins(class | op, dst, 0, 0, imm));
                }
            }
            4 => s.push(ins(
                0x7b,
                10,
                src,
                -8 * (1 + (r >> 20) as i16 % 32).abs(),
                0,
            )),
            5 => s.push(ins(
                0x79,
                dst,
                10,
                -8 * (1 + (r >> 20) as i16 % 32).abs(),
                0,
            )),
            6 | 7 if left > 4 => {
                let conds = [0x15u8, 0x1d, 0x25, 0x2d, 0x55, 0x5d, 0x65, 0xa5, 0x16, 0x2e];
                let c = conds[((r >> 44) % conds.len() as u64) as usize];
                let off = (1 + (r >> 52) % 8).min(left as u64 - 2) as i16;
                if c & 8 == 0 {
                    s.push(ins(c, dst, 0, off, imm));
                } else {
                    s.push(ins(c, dst, src, off, 0));
                }
            }
            8 => s.push(ins(0x85, 0, 0, 0, 1)),
            _ => s.push(ins(0x3f, dst, src, 0, 0)),
        }
    }
    s.push(ins(0x95, 0, 0, 0, 0));
    s.concat()
}

extern "C" fn helper(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a ^ b
}

struct Stats {
    ebpf: usize,
    native: usize,
    bytes: usize,
}

fn stats(code: &[u8], helpers: &[HelperEntry], features: u64) -> Option<Stats> {
    stats_flags(code, helpers, features, 0)
}

fn stats_flags(code: &[u8], helpers: &[HelperEntry], features: u64, flags: u32) -> Option<Stats> {
    let m = packjit_rv64::emit_request(&packjit_plugin_api::CompileRequest {
        code,
        helpers,
        features,
        flags,
        blind_key: 0,
    })
    .ok()?;
    let ebpf = packjit_frontend::decode(code, helpers).ok()?.insts.len();
    // Instructions only: a `callx` table is data (its bytes count in `bytes`).
    Some(Stats {
        ebpf,
        native: m.native_insns,
        bytes: m.bytes.len(),
    })
}

const CONFIGS: [(&str, u64); 4] = [
    ("baseline RV64IMA", 0),
    ("+C", FEATURE_C),
    ("+Zbb+Zba", FEATURE_ZBB | FEATURE_ZBA),
    ("+C+Zbb+Zba", FEATURE_C | FEATURE_ZBB | FEATURE_ZBA),
];

fn main() {
    let helpers = [HelperEntry {
        id: 1,
        inline_kind: 0,
        addr: helper as extern "C" fn(u64, u64, u64, u64, u64) -> u64 as usize as u64,
    }];
    let prog = generated_program(1200);
    let n = packjit_frontend::decode(&prog, &helpers)
        .expect("valid")
        .insts
        .len();
    println!("generated program: {n} eBPF instructions");
    for (name, f) in CONFIGS {
        // Warm up, then time enough compiles for a stable figure.
        emit_program(&prog, &helpers, f).unwrap();
        let iters = 300;
        let t = Instant::now();
        let mut bytes = 0;
        for _ in 0..iters {
            bytes = emit_program(&prog, &helpers, f).unwrap().bytes.len();
        }
        let secs = t.elapsed().as_secs_f64();
        let s = stats(&prog, &helpers, f).unwrap();
        println!(
            "  {name:<18} compile {:>6.2} M eBPF insns/s ({:>6.1} µs/program); {:.2} RV64 insns and {:.2} bytes per eBPF insn ({bytes} bytes)",
            (n * iters) as f64 / secs / 1e6,
            secs / iters as f64 * 1e6,
            s.native as f64 / s.ebpf as f64,
            s.bytes as f64 / s.ebpf as f64,
        );
    }

    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(packjit_testkit::conformance::suite_dir);
    corpus(&dir);

    #[cfg(target_arch = "riscv64")]
    jit_vs_interpreter();
    #[cfg(target_arch = "riscv64")]
    sandbox_vs_trusted();
    #[cfg(target_arch = "riscv64")]
    sandbox_programs();
}

/// Native size over the bpf_conformance programs (`tests/*.data` that are expected to
/// load), per configuration.
fn corpus(dir: &std::path::Path) {
    use packjit_testkit::data::{list_dir, TestCase};
    let helpers: Vec<HelperEntry> = (0..32)
        .map(|id| HelperEntry {
            id,
            inline_kind: 0,
            addr: 0x1000 + id as u64 * 16,
        })
        .collect();
    let tests = dir.join("tests");
    let Ok(files) = list_dir(&tests) else {
        println!("no conformance corpus at {}", tests.display());
        return;
    };
    let progs: Vec<Vec<u8>> = files
        .iter()
        .filter_map(|p| TestCase::load(p).ok())
        .filter(|c| !c.expects_error())
        .filter_map(|c| c.program().ok())
        .collect();
    let dir = dir.display();
    println!("corpus {dir}: {} programs", progs.len());
    for (name, f) in CONFIGS {
        let (mut e, mut nat, mut b) = (0, 0, 0);
        for p in &progs {
            if let Some(s) = stats(p, &helpers, f) {
                e += s.ebpf;
                nat += s.native;
                b += s.bytes;
            }
        }
        println!(
            "  {name:<18} {e} eBPF insns -> {nat} RV64 insns, {b} bytes: {:.2} insns and {:.2} bytes per eBPF insn",
            nat as f64 / e.max(1) as f64,
            b as f64 / e.max(1) as f64
        );
    }
    // Where the instructions go, per eBPF instruction class (all extensions, trusted).
    let mut density = packjit_testkit::density::Density::default();
    for p in &progs {
        let req = packjit_plugin_api::CompileRequest {
            code: p,
            helpers: &helpers,
            features: CONFIGS[3].1,
            flags: 0,
            blind_key: 0,
        };
        let Ok(m) = packjit_rv64::emit_request(&req) else {
            continue;
        };
        let prog = packjit_frontend::decode(p, &helpers).expect("compiled, so it decodes");
        let (bytes, table) = (m.bytes, prog.line_table(m.inst_offsets));
        let starts: Vec<usize> = prog
            .insts
            .iter()
            .map(|i| native_insn_count(&bytes[..table[i.pc as usize] as usize]))
            .collect();
        density.add(&prog, &starts, m.native_insns);
    }
    println!("  per class, {}:", CONFIGS[3].0.trim());
    print!("{}", density.report("RV64"));
    // The sandbox's static cost: the same corpus, checked (and counted), against trusted.
    use packjit_plugin_api::abi::{PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX};
    for (name, f) in [CONFIGS[0], CONFIGS[3]] {
        let mut line = format!("  {name:<18} native insns per eBPF insn:");
        for (mode, flags) in [
            ("trusted", 0),
            ("sandboxed", PJ_COMPILE_SANDBOX),
            ("sandboxed+budget", PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET),
        ] {
            let (mut e, mut nat) = (0, 0);
            for p in &progs {
                if let Some(s) = stats_flags(p, &helpers, f, flags) {
                    e += s.ebpf;
                    nat += s.native;
                }
            }
            line += &format!(" {mode} {:.2}", nat as f64 / e.max(1) as f64);
        }
        println!("{line}");
    }
}

/// Compute-and-memory loops, sandboxed (with and without the budget) against trusted, in one
/// process: best of 5 runs each, as time ratios.
#[cfg(target_arch = "riscv64")]
fn sandbox_vs_trusted() {
    use packjit::{LoadOptions, Runtime};
    use packjit_plugin_api::JitBackend;
    use std::sync::Arc;
    let features = match packjit_rv64::Rv64Backend::new().detect_features() {
        0 => FEATURE_C | FEATURE_ZBB | FEATURE_ZBA,
        f => f,
    };
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .expect("rv64 backend");
    // 2048 passes over a 4 KiB context: r0 += *(u64 *)p; *(u64 *)p ^= r0 (checked context
    // accesses through a walking pointer).
    let ctx_loop = [
        ins(0xb7, 0, 0, 0, 0),    // r0 = 0
        ins(0xb7, 6, 0, 0, 2048), // r6 = passes
        ins(0xbf, 3, 1, 0, 0),    // pass: r3 = ctx
        ins(0xbf, 4, 1, 0, 0),
        ins(0x0f, 4, 2, 0, 0),  // r4 = ctx end
        ins(0x79, 5, 3, 0, 0),  // word: r5 = *r3
        ins(0x0f, 0, 5, 0, 0),  // r0 += r5
        ins(0xaf, 5, 0, 0, 0),  // r5 ^= r0
        ins(0x7b, 3, 5, 0, 0),  // *r3 = r5
        ins(0x07, 3, 0, 0, 8),  // r3 += 8
        ins(0xad, 3, 4, -6, 0), // if r3 < r4 goto word
        ins(0x17, 6, 0, 0, 1),
        ins(0x55, 6, 0, -11, 0), // if --r6 != 0 goto pass
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // A stack-constant kernel: 2,000,000 rounds mixing four stack slots (no run-time checks).
    let stack_loop = [
        ins(0x7a, 10, 0, -8, 1),
        ins(0x7a, 10, 0, -16, 2),
        ins(0xb7, 6, 0, 0, 2_000_000),
        ins(0x79, 1, 10, -8, 0), // loop
        ins(0x79, 2, 10, -16, 0),
        ins(0x0f, 1, 2, 0, 0),
        ins(0x27, 2, 0, 0, 3),
        ins(0x7b, 10, 1, -16, 0),
        ins(0x7b, 10, 2, -8, 0),
        ins(0x17, 6, 0, 0, 1),
        ins(0x55, 6, 0, -8, 0),
        ins(0x79, 0, 10, -8, 0),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let best = |p: &packjit::Program, mem: &mut [u8]| {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                p.call(mem).expect("call");
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    for (name, code) in [("context loop", &ctx_loop), ("stack loop", &stack_loop)] {
        let opts = LoadOptions {
            features: Some(features),
            ..LoadOptions::default()
        };
        // SAFETY: both programs touch only their context and their stack frame.
        let trusted = unsafe { rt.load_trusted(code, &opts) }.expect("load");
        let sandboxed = rt.load(code, &opts).expect("load");
        let budget = rt
            .load(
                code,
                &LoadOptions {
                    budget: packjit::Budget::Limit(u64::MAX / 2),
                    ..opts.clone()
                },
            )
            .expect("load");
        // The three agree on r0 and on the memory they leave.
        let outs: Vec<(u64, Vec<u8>)> = [&trusted, &sandboxed, &budget]
            .iter()
            .map(|p| {
                let mut m = vec![1u8; 4096];
                (p.call(&mut m).expect("call"), m)
            })
            .collect();
        assert!(
            outs.iter().all(|o| *o == outs[0]),
            "{name}: sandboxed and trusted disagree"
        );
        let mut mem = vec![1u8; 4096];
        let tt = best(&trusted, &mut mem);
        let ts = best(&sandboxed, &mut mem);
        let tb = best(&budget, &mut mem);
        let per = |p: &packjit::Program| p.native_insns() as f64;
        println!(
            "{name} (features {features:#x}, r0 {:#x}): trusted {:.2} ms; sandboxed {:.2} ms ({:.2}x); sandboxed+budget {:.2} ms ({:.2}x); code {} / {} / {} native insns",
            outs[0].0,
            tt * 1e3,
            ts * 1e3,
            ts / tt,
            tb * 1e3,
            tb / tt,
            per(&trusted),
            per(&sandboxed),
            per(&budget),
        );
    }
}

/// A compute-bound loop: 200,000 rounds of a multiply/xor/shift hash with a data-dependent
/// branch, in the cpu v1 subset rbpf's interpreter supports.
#[cfg(target_arch = "riscv64")]
fn jit_vs_interpreter() {
    use packjit::{LoadOptions, Runtime};
    use packjit_plugin_api::JitBackend;
    use std::sync::Arc;
    let rounds = 200_000;
    let p = [
        ins(0xb7, 0, 0, 0, 0),      // r0 = 0 (hash)
        ins(0xb7, 1, 0, 0, rounds), // r1 = rounds
        ins(0x18, 2, 0, 0, 0x7f4a_7c15u32 as i32),
        ins(0, 0, 0, 0, 0x9e37_79b9u32 as i32), // r2 = golden ratio
        // loop:
        ins(0x0f, 0, 1, 0, 0), // r0 += r1
        ins(0x2f, 0, 2, 0, 0), // r0 *= r2
        ins(0xbf, 3, 0, 0, 0),
        ins(0x77, 3, 0, 0, 29),
        ins(0xaf, 0, 3, 0, 0), // r0 ^= r0 >> 29
        ins(0xbf, 4, 0, 0, 0),
        ins(0x57, 4, 0, 0, 1),
        ins(0x15, 4, 0, 1, 0), // if (r0 & 1) == 0 skip
        ins(0x07, 0, 0, 0, 12345),
        ins(0x17, 1, 0, 0, 1),   // r1 -= 1
        ins(0x55, 1, 0, -11, 0), // if r1 != 0 goto loop
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // qemu-user 7.2 offers neither hwprobe nor a RISC-V /proc/cpuinfo but executes
    // Zbb/Zba/C: use them all when detection finds nothing.
    let features = match packjit_rv64::Rv64Backend::new().detect_features() {
        0 => FEATURE_C | FEATURE_ZBB | FEATURE_ZBA,
        f => f,
    };
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .expect("rv64 backend");
    let opts = LoadOptions {
        features: Some(features),
        ..LoadOptions::default()
    };
    let prog = rt.load(&p, &opts).expect("load");
    let t = Instant::now();
    let jit = prog.call(&mut []).expect("call");
    let jit_t = t.elapsed().as_secs_f64();
    let vm = rbpf::EbpfVmNoData::new(Some(&p)).expect("rbpf accepts the program");
    let t = Instant::now();
    let interp = vm.execute_program().expect("rbpf runs");
    let int_t = t.elapsed().as_secs_f64();
    assert_eq!(jit, interp, "JIT and rbpf disagree");
    println!(
        "compute loop ({rounds} rounds, features {features:#x}): JIT {:.2} ms, rbpf interpreter {:.2} ms: {:.1}x",
        jit_t * 1e3,
        int_t * 1e3,
        int_t / jit_t
    );
}

/// The sandbox benchmark programs (the same as arm64's `arm64_sandbox_bench`), in every mode side by
/// side: time per run (best of interleaved rounds) as a ratio to trusted, and RV64
/// instructions per eBPF instruction on the hot loop's inline path.
#[cfg(target_arch = "riscv64")]
fn sandbox_programs() {
    use packjit_plugin_api::{CompileRequest, JitBackend};
    use packjit_rv64::EmitOptions;

    struct Code {
        map: *mut libc::c_void,
        len: usize,
        bytes: Vec<u8>,
        /// Native offset of each bytecode slot.
        table: Vec<u32>,
        /// Where back-edges land when not at their target's code (see `Emitted::landings`).
        landings: Vec<(usize, usize)>,
    }
    impl Code {
        fn new(code: &[u8], flags: u32, features: u64, opts: EmitOptions) -> Code {
            let req = CompileRequest {
                code,
                helpers: &[],
                features,
                flags,
                blind_key: 0,
            };
            let packjit_rv64::Emitted {
                bytes,
                inst_offsets,
                landings,
                ..
            } = packjit_rv64::emit_request_with(&req, opts).expect("compile");
            let prog =
                packjit_frontend::decode_for_lowering(&req).expect("compiled, so it decodes");
            let table = prog.line_table(inst_offsets);
            let len = bytes.len().div_ceil(4096) * 4096;
            // SAFETY: a fresh private mapping, written while RW, then made RX and the
            // instruction cache flushed (riscv_flush_icache, all threads).
            let map = unsafe {
                let map = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(map, libc::MAP_FAILED);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), map as *mut u8, bytes.len());
                assert_eq!(
                    libc::mprotect(map, len, libc::PROT_READ | libc::PROT_EXEC),
                    0
                );
                const SYS_RISCV_FLUSH_ICACHE: libc::c_long = 259;
                libc::syscall(SYS_RISCV_FLUSH_ICACHE, map, map as usize + len, 0);
                map
            };
            Code {
                map,
                len,
                bytes: bytes.into_vec(),
                table,
                landings,
            }
        }
        /// Native instructions of one pass over the loop at bytecode slots `slots` whose head
        /// is instruction `head`: from where its back-edge lands to the end of its code.
        fn inline_insns(&self, head: usize, slots: std::ops::Range<usize>) -> usize {
            let a = packjit_testkit::bench::loop_landing(
                head,
                self.table[slots.start] as usize,
                &self.landings,
            );
            let b = self.table[slots.end] as usize;
            native_insn_count(&self.bytes[a..b])
        }
        fn run(&self, mem: &mut [u8]) -> u64 {
            // SAFETY: `map` holds code emitted for the PjProgramEntry ABI, mapped RX until drop.
            unsafe { packjit_testkit::bench::call_entry(self.map as *const u8, mem) }
        }
    }
    impl Drop for Code {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer used.
            unsafe { libc::munmap(self.map, self.len) };
        }
    }

    let features = match packjit_rv64::Rv64Backend::new().detect_features() {
        0 => FEATURE_C | FEATURE_ZBB | FEATURE_ZBA,
        f => f,
    };
    let modes = packjit_testkit::bench::sandbox_modes();
    let mut mem: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    println!("sandbox programs (features {features:#x}):");
    // (name, program, hot loop as bytecode slots)
    for p in packjit_testkit::bench::sandbox_programs() {
        let (name, hot, head) = (p.name, p.hot_slots(), p.hot.start);
        let code = p.code;
        let codes: Vec<(&str, Code)> = modes
            .iter()
            .map(|&(m, f, o)| (m, Code::new(&code, f, features, o)))
            .collect();
        let want = codes[0].1.run(&mut mem);
        let mut best = vec![f64::MAX; codes.len()];
        for _ in 0..11 {
            for (k, (_, c)) in codes.iter().enumerate() {
                assert_eq!(c.run(&mut mem), want, "{name}");
                let runs = 100;
                let t = Instant::now();
                for _ in 0..runs {
                    std::hint::black_box(c.run(&mut mem));
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64() / runs as f64);
            }
        }
        println!("  {name}:");
        let n = hot.len();
        for (k, (mode, c)) in codes.iter().enumerate() {
            let per_iter = c.inline_insns(head, hot.clone());
            println!(
                "    {mode:<15} {:>9.2} us/run  {:>5.2}x trusted  hot loop: {per_iter:>3} RV64 insns for {n} eBPF insns ({:.2} per eBPF insn)",
                best[k] * 1e6,
                best[k] / best[0],
                per_iter as f64 / n as f64
            );
        }
    }
}
