//! x86-64 side by side, natively, in one process: packjit's x86-64 JIT (trusted and
//! sandboxed), rbpf's x86-64 JIT (`jit_compile` + `execute_program_jit`), rbpf's interpreter,
//! and the same work written in Rust (the floor), on a compute loop, byte-wise memory work
//! and helper calls. Prints run time per program run and compile time per eBPF instruction,
//! with ratios, and says where an engine's answer differs from native Rust.
//!
//! ```text
//! cargo run --release -p packjit-x86-64 --example x86_bench
//! ```

use packjit::{LoadOptions, Runtime};
use packjit_plugin_api::abi::{PjExecEnv, PJ_COMPILE_SANDBOX, PJ_STOP_NONE};
use packjit_plugin_api::{CodeArena, CompileRequest, HelperEntry, JitBackend, PjProgramEntry};
use packjit_x86_64::{emit_program, X86Backend};
use std::hint::black_box;
use std::time::{Duration, Instant};

const LOOP_N: i32 = 2_000_000;
const MEM_LEN: usize = 1 << 20;
const CALL_N: i32 = 500_000;

/// xorshift64 steps summed: a serial dependency chain (latency-bound in every engine).
fn compute_src() -> String {
    format!(
        "mov %r0, 0\nmov %r2, {LOOP_N}\nmov %r3, 0x12345\n\
         l:\nmov %r4, %r3\nlsh %r4, 13\nxor %r3, %r4\nmov %r4, %r3\nrsh %r4, 7\nxor %r3, %r4\n\
         mov %r4, %r3\nlsh %r4, 17\nxor %r3, %r4\nadd %r0, %r3\nsub %r2, 1\njne %r2, 0, l\nexit"
    )
}

fn compute_native(n: i32) -> u64 {
    let (mut r0, mut x) = (0u64, 0x12345u64);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r0 = r0.wrapping_add(x);
    }
    r0
}

/// Independent work per iteration (register shifts, 32-bit ALU, multiply by a constant):
/// throughput-bound, so the quality of each instruction's encoding shows.
fn mix_src() -> String {
    format!(
        "mov %r0, 0\nmov %r2, {LOOP_N}\nmov %r3, 0x12345\n\
         l:\nmov %r4, %r3\nand %r4, 31\nmov %r5, %r3\nlsh %r5, %r4\nxor %r0, %r5\n\
         mov32 %r7, %r3\nadd32 %r7, %r2\nmul %r7, 0x3779b1\nadd %r0, %r7\n\
         mov %r8, %r3\nrsh %r8, %r4\nsub %r0, %r8\n\
         add %r3, 0x2545\nsub %r2, 1\njne %r2, 0, l\nexit"
    )
}

fn mix_native(n: i32) -> u64 {
    let (mut r0, mut x) = (0u64, 0x12345u64);
    for i in (1..=n as u64).rev() {
        let s = x & 31;
        r0 ^= x << s;
        let r7 = (x as u32).wrapping_add(i as u32) as u64;
        r0 = r0.wrapping_add(r7.wrapping_mul(0x3779b1));
        r0 = r0.wrapping_sub(x >> s);
        x = x.wrapping_add(0x2545);
    }
    r0
}

/// FNV-1a over the context, one byte load per iteration.
fn memory_src() -> String {
    format!(
        "lddw %r0, 0xcbf29ce484222325\nlddw %r5, 0x100000001b3\nmov %r2, %r1\n\
         mov %r3, %r1\nadd %r3, {MEM_LEN}\n\
         l:\nldxb %r4, [%r2+0]\nxor %r0, %r4\nmul %r0, %r5\nadd %r2, 1\njne %r2, %r3, l\nexit"
    )
}

fn memory_native(mem: &[u8]) -> u64 {
    mem.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A helper call per iteration (arguments set up, result accumulated).
fn calls_src() -> String {
    format!(
        "mov %r6, 0\nmov %r7, {CALL_N}\n\
         l:\nmov %r1, %r6\nmov %r2, %r7\ncall 1\nadd %r6, %r0\nsub %r7, 1\njne %r7, 0, l\n\
         mov %r0, %r6\nexit"
    )
}

extern "C" fn mix_c(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    (a ^ b).rotate_left(5).wrapping_add(1)
}

fn mix_rust(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    mix_c(a, b, c, d, e)
}

fn calls_native(n: i32) -> u64 {
    let f: extern "C" fn(u64, u64, u64, u64, u64) -> u64 = black_box(mix_c);
    let mut r6 = 0u64;
    for r7 in (1..=n as u64).rev() {
        r6 = r6.wrapping_add(f(r6, r7, 0, 0, 0));
    }
    r6
}

/// Fastest of `reps` timings of `f`, with its last result. The minimum, not the median: on a
/// shared machine the noise only ever adds time.
fn time<F: FnMut() -> u64>(reps: usize, mut f: F) -> (Duration, u64) {
    let mut best = Duration::MAX;
    let mut out = 0;
    for _ in 0..reps {
        let t = Instant::now();
        out = black_box(f());
        best = best.min(t.elapsed());
    }
    (best, out)
}

fn ms(d: Duration) -> String {
    format!("{:9.3} ms", d.as_secs_f64() * 1e3)
}

/// The same work in Rust, given the context.
type NativeFn = Box<dyn Fn(&mut [u8]) -> u64>;

struct Row {
    name: &'static str,
    code: Vec<u8>,
    native: NativeFn,
}

fn main() {
    let helpers = [HelperEntry {
        id: 1,
        inline_kind: 0,
        addr: mix_c as *const () as usize as u64,
    }];
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(std::sync::Arc::new(X86Backend::new()))
        .expect("x86-64 backend");
    rt.register_helper(1, "mix", mix_c).expect("helper");
    let asm = |s: &str| packjit_testkit::asm::assemble(s).expect("assembles");
    let rows = [
        Row {
            name: "compute loop",
            code: asm(&compute_src()),
            native: Box::new(|_| compute_native(black_box(LOOP_N))),
        },
        Row {
            name: "compute mix",
            code: asm(&mix_src()),
            native: Box::new(|_| mix_native(black_box(LOOP_N))),
        },
        Row {
            name: "byte-wise memory",
            code: asm(&memory_src()),
            native: Box::new(|m| memory_native(black_box(m))),
        },
        Row {
            name: "helper calls",
            code: asm(&calls_src()),
            native: Box::new(|_| calls_native(black_box(CALL_N))),
        },
    ];
    let mut mem: Vec<u8> = (0..MEM_LEN).map(|i| (i * 31 + 7) as u8).collect();
    println!(
        "x86-64, native, fastest of repeated runs; features detected: {:#x}\n",
        X86Backend::new().detect_features()
    );
    println!(
        "{:<17} {:>12} {:>12} {:>12} {:>12} {:>12} | {:>8} {:>8} {:>8} {:>8}",
        "program",
        "native",
        "packjit",
        "pj sandbox",
        "rbpf JIT",
        "rbpf interp",
        "pj/rbJIT",
        "pj/nat",
        "sbx/pj",
        "int/pj"
    );
    let mut wrong = Vec::new();
    for row in &rows {
        let (t_nat, want) = time(21, || (row.native)(&mut mem));
        // packjit, trusted, through the runtime.
        // SAFETY: these programs only touch their context (the sandboxed run below checks
        // every access and agrees).
        let prog =
            unsafe { rt.load_trusted(&row.code, &LoadOptions::default()) }.expect("packjit load");
        let (t_pj, got) = time(21, || prog.call(&mut mem).expect("packjit run"));
        if got != want {
            wrong.push(format!(
                "packjit on {}: {got:#x}, native {want:#x}",
                row.name
            ));
        }
        // packjit, sandboxed: compiled with PJ_COMPILE_SANDBOX into the same arena.
        let arena = rt.arena().expect("arena");
        let c = X86Backend::new()
            .compile(
                &CompileRequest {
                    code: &row.code,
                    helpers: &helpers,
                    features: X86Backend::new().detect_features(),
                    flags: PJ_COMPILE_SANDBOX,
                    blind_key: 0,
                },
                arena as &dyn CodeArena,
            )
            .expect("sandboxed compile");
        arena.commit();
        // SAFETY: committed code with the PjProgramEntry signature on this x86-64 host.
        let entry: PjProgramEntry = unsafe { std::mem::transmute(c.entry as usize) };
        let (t_sbx, got) = time(21, || {
            let mut env = PjExecEnv {
                ctx_start: mem.as_ptr() as u64,
                ctx_end: mem.as_ptr() as u64 + mem.len() as u64,
                ctx_len: mem.len() as u64,
                budget: u64::MAX,
                ..Default::default()
            };
            // SAFETY: mem and env outlive the call; sandboxed code checks every access.
            let r = unsafe { entry(mem.as_mut_ptr(), mem.len() as u64, &mut env) };
            assert_eq!(
                env.stop_kind, PJ_STOP_NONE,
                "sandboxed {} stopped",
                row.name
            );
            r
        });
        if got != want {
            wrong.push(format!(
                "packjit sandboxed on {}: {got:#x}, native {want:#x}",
                row.name
            ));
        }
        // rbpf JIT and interpreter.
        let mut vm = rbpf::EbpfVmRaw::new(Some(&row.code)).expect("rbpf accepts the program");
        vm.register_helper(1, mix_rust).expect("rbpf helper");
        vm.jit_compile().expect("rbpf jit_compile");
        let (ptr, len) = (mem.as_mut_ptr(), mem.len());
        let (t_rj, got) = time(21, || {
            // SAFETY: a fresh view of `mem` per run (rbpf ties the borrow to the VM's
            // lifetime); nothing else touches mem during the call.
            let m = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            // SAFETY: rbpf's JIT runs unchecked code; these programs stay inside `mem`.
            unsafe { vm.execute_program_jit(m) }.expect("rbpf jit run")
        });
        if got != want {
            wrong.push(format!(
                "rbpf JIT on {}: {got:#x}, native {want:#x}",
                row.name
            ));
        }
        let (t_ri, got) = time(3, || {
            // SAFETY: as above.
            let m = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            vm.execute_program(m).expect("rbpf interpreter run")
        });
        if got != want {
            wrong.push(format!(
                "rbpf interpreter on {}: {got:#x}, native {want:#x}",
                row.name
            ));
        }
        let r = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "{:<17} {} {} {} {} {} | {:7.2}x {:7.2}x {:7.2}x {:7.1}x",
            row.name,
            ms(t_nat),
            ms(t_pj),
            ms(t_sbx),
            ms(t_rj),
            ms(t_ri),
            r(t_pj, t_rj),
            r(t_pj, t_nat),
            r(t_sbx, t_pj),
            r(t_ri, t_pj),
        );
        arena.free_deferred(c.region);
    }
    println!("\ncompile time per eBPF instruction (verify + emit; rbpf: jit_compile after new):");
    println!(
        "{:<17} {:>10} {:>12} {:>12} {:>10}",
        "program", "insns", "packjit", "rbpf JIT", "pj/rbJIT"
    );
    // A larger program too, so fixed per-program costs do not dominate (440 instructions,
    // about what fits rbpf's fixed JIT buffer; `compile_cost` counts the same program).
    let big = Row {
        name: "straight-line",
        code: packjit_testkit::bench::straight_line_program(),
        native: Box::new(|_| 0),
    };
    for row in rows.iter().chain([&big]) {
        let n = row.code.len() / 8;
        let reps = (40_000 / n).max(20);
        let (t_pj, _) = time(5, || {
            for _ in 0..reps {
                black_box(emit_program(&row.code, &helpers, 0).unwrap());
            }
            0
        });
        let (t_rj, _) = time(5, || {
            for _ in 0..reps {
                let mut vm = rbpf::EbpfVmRaw::new(Some(&row.code)).unwrap();
                vm.register_helper(1, mix_rust).unwrap();
                vm.jit_compile().unwrap();
                black_box(&vm);
            }
            0
        });
        let per = |t: Duration| t.as_secs_f64() * 1e9 / (reps * n) as f64;
        println!(
            "{:<17} {:>10} {:>9.1} ns {:>9.1} ns {:>9.2}x",
            row.name,
            n,
            per(t_pj),
            per(t_rj),
            per(t_pj) / per(t_rj)
        );
    }
    if wrong.is_empty() {
        println!("\nall engines agree with native Rust on these programs");
    } else {
        println!("\nwrong answers:");
        for w in wrong {
            println!("  {w}");
        }
    }
}
