//! Inlined vs called built-in helpers, side by side in one run:
//!
//! * CPU id (`bpf_get_smp_processor_id`, id 8): ns per read and instructions per read;
//! * a per-CPU counter program (CPU id → its slot → atomic add) run from N threads, with the
//!   sum over CPUs checked against the number of runs;
//! * the monotonic clock (`bpf_ktime_get_ns`, id 5): ns per read.
//!
//! `cargo run --release -p packjit --example builtins_bench [-- ITERS]`; under qemu with
//! `packjit_cross_cargo <triple> run --release -p packjit --example builtins_bench`.
//! Where glibc registered no rseq (qemu-user), the inline CPU id reads a thread-local
//! lookalike of `struct rseq` the bench keeps current itself (the same code path; see
//! `runtime/tests/builtins.rs`); the output says so.

use packjit::testing::RuntimeTestExt;
use packjit::{LoadOptions, MemRegion, Program, RegionAccess, Runtime};
use packjit_interp::hw;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

fn insn(opc: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [opc, regs, 0, 0, 0, 0, 0, 0];
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

/// `r6 = n; r7 = 0; loop: call id; r7 += r0; r6 -= 1; if r6 != 0 goto loop; r0 = r7; exit`.
fn loop_prog(id: i32, n: i32) -> Vec<u8> {
    [
        insn(0xb7, 0x06, 0, n),
        insn(0xb7, 0x07, 0, 0),
        insn(0x85, 0, 0, id),
        insn(0x0f, 0x07, 0, 0),
        insn(0x07, 0x06, 0, -1),
        insn(0x55, 0x06, -4, 0),
        insn(0xbf, 0x70, 0, 0),
        EXIT,
    ]
    .concat()
}

/// The loop without the call (its overhead).
fn empty_loop(n: i32) -> Vec<u8> {
    [
        insn(0xb7, 0x06, 0, n),
        insn(0xb7, 0x07, 0, 0),
        insn(0x0f, 0x07, 0, 0),
        insn(0x07, 0x06, 0, -1),
        insn(0x55, 0x06, -3, 0),
        insn(0xbf, 0x70, 0, 0),
        EXIT,
    ]
    .concat()
}

#[repr(C, align(32))]
struct FakeRseq {
    cpu_id_start: UnsafeCell<u32>,
    cpu_id: UnsafeCell<u32>,
    rest: [u64; 3],
}

thread_local! {
    static FAKE: FakeRseq = const {
        FakeRseq { cpu_id_start: UnsafeCell::new(0), cpu_id: UnsafeCell::new(0), rest: [0; 3] }
    };
}

/// Refreshes this thread's lookalike rseq area; returns its `cpu_id` offset from the
/// thread pointer (the same in every thread: static TLS of this executable).
fn refresh_fake() -> i64 {
    // SAFETY: no preconditions.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as u32;
    FAKE.with(|f| {
        // SAFETY: only this thread writes its own area.
        unsafe { *f.cpu_id.get() = cpu };
        let _ = (&f.cpu_id_start, f.rest);
        f.cpu_id.get() as i64 - hw::thread_pointer() as i64
    })
}

/// Instructions executed while running `f`, counted by single-stepping (x86-64 only: the
/// trap flag raises SIGTRAP after every user instruction; each is counted by the handler).
/// `None` elsewhere (arm64/RV64 have no user-mode single step; qemu-user neither).
fn instructions(f: impl FnOnce()) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::atomic::AtomicU64;
        static COUNT: AtomicU64 = AtomicU64::new(0);
        extern "C" fn on_trap(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
            COUNT.fetch_add(1, Relaxed);
        }
        // SAFETY: installing a handler that only bumps an atomic; zeroed sigaction is valid.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_trap as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut());
        }
        COUNT.store(0, Relaxed);
        // SAFETY: sets EFLAGS.TF; the kernel delivers SIGTRAP after each instruction, which
        // the handler above absorbs. Cleared right after `f`.
        unsafe { std::arch::asm!("pushfq", "or qword ptr [rsp], 0x100", "popfq") };
        f();
        // SAFETY: clears EFLAGS.TF.
        unsafe { std::arch::asm!("pushfq", "and qword ptr [rsp], ~0x100", "popfq") };
        Some(COUNT.load(Relaxed))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        f();
        None
    }
}

/// Best of 5 runs, ns per loop iteration.
fn time_per(p: &Program, n: u64) -> f64 {
    p.call(&mut []).unwrap(); // warm
    (0..5)
        .map(|_| {
            let t = Instant::now();
            p.call(&mut []).unwrap();
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let iters: i32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rt = Runtime::new().unwrap();
    match packjit::Arch::host().expect("a packjit host arch") {
        packjit::Arch::X86_64 => rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new())),
        packjit::Arch::Aarch64 => rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new())),
        packjit::Arch::Riscv64 => rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new())),
    }
    .unwrap();
    let detected = rt.builtins().unwrap();
    println!("arch {}: detected {detected}", std::env::consts::ARCH);
    let fake = !matches!(detected.cpu_id, packjit::CpuIdImpl::InlineRseq { .. });
    if fake {
        let off = refresh_fake();
        // SAFETY: FAKE is static TLS of this executable, alive in every thread that runs
        // the programs (each refreshes its own before running).
        unsafe { rt.set_rseq_cpu_id_offset(Some(off)) };
        println!("  (no glibc rseq here: inline CPU id reads the bench's own rseq lookalike)");
    }
    if !matches!(detected.clock, packjit::ClockImpl::InlineCounter { .. }) {
        let hz = packjit::builtins::measure_counter_hz();
        rt.set_counter_clock_hz(Some(hz));
        println!("  (counter frequency unknown here: inline clock uses a measured {hz} Hz)");
    }
    let opts = LoadOptions::default();
    let load = |code: &[u8], inline: bool| {
        rt.set_inline_builtins(inline);
        rt.load(code, &opts).unwrap()
    };
    // Instruction counts single-step a short loop (a trap per instruction is slow).
    let count_iters = 2_000;
    let empty = load(&empty_loop(iters), true);
    let base_ns = time_per(&empty, iters as u64);
    let empty_short = load(&empty_loop(count_iters), true);
    let base_insns = instructions(|| {
        empty_short.call(&mut []).unwrap();
    });

    println!("\nCPU id (helper 8), {iters} reads in a loop:");
    println!(
        "  {:<8} {:>14} {:>16} {:>16} {:>14}",
        "", "ns/iteration", "ns/read (-loop)", "insns/read", "site insns"
    );
    // Instructions one call site adds: two sites minus one.
    let one_site = |inline| {
        let two = load(
            &[insn(0x85, 0, 0, 8), insn(0x85, 0, 0, 8), EXIT].concat(),
            inline,
        );
        let one = load(&[insn(0x85, 0, 0, 8), EXIT].concat(), inline);
        two.native_insns() - one.native_insns()
    };
    let mut per_read = vec![];
    for inline in [true, false] {
        let p = load(&loop_prog(8, iters), inline);
        let per_iter = time_per(&p, iters as u64);
        let ns = (per_iter - base_ns).max(0.0);
        let short = load(&loop_prog(8, count_iters), inline);
        let insns = instructions(|| {
            short.call(&mut []).unwrap();
        })
        .zip(base_insns)
        .map(|(a, b)| a.saturating_sub(b) as f64 / count_iters as f64);
        per_read.push((per_iter, insns));
        println!(
            "  {:<8} {:>14.2} {:>16.2} {:>16} {:>14}",
            if inline { "inline" } else { "call" },
            per_iter,
            ns,
            insns.map_or("n/a".into(), |i| format!("{i:.1}")),
            one_site(inline),
        );
    }
    let (ni, nc) = (per_read[0], per_read[1]);
    println!(
        "  call/inline: {:.1}x time per loop iteration{}",
        nc.0 / ni.0.max(0.01),
        match (ni.1, nc.1) {
            (Some(a), Some(b)) => format!(", {:.1}x instructions", b / a.max(0.01)),
            _ => String::new(),
        }
    );

    println!("\nClock (helper 5), {iters} reads:");
    for inline in [true, false] {
        let p = load(&loop_prog(5, iters), inline);
        let ns = time_per(&p, iters as u64) - base_ns;
        println!(
            "  {:<10} {:>10.2} ns/read   ({})",
            if inline { "inline" } else { "call" },
            ns,
            p.builtins().unwrap().clock
        );
    }

    // Per-CPU counter: CPU id → its slot (64 bytes apart: no false sharing between CPUs)
    // → lock add 1, sandboxed; one thread per allowed CPU, pinned; sum checked.
    const STRIDE: usize = 64;
    let ncpu = 1024usize;
    let words = ncpu * STRIDE / 8;
    let slots: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
    // SAFETY: the slots outlive every program (held until main returns), atomics only.
    let region = unsafe {
        MemRegion::new(
            slots.as_ptr() as *const u8,
            words * 8,
            RegionAccess::ReadWrite,
        )
    };
    let base = slots.as_ptr() as u64;
    let counter = [
        insn(0x85, 0, 0, 8),
        insn(0x67, 0x00, 0, STRIDE.trailing_zeros() as i32),
        insn(0x18, 0x01, 0, base as i32),
        insn(0, 0, 0, (base >> 32) as i32),
        insn(0x0f, 0x01, 0, 0),
        insn(0xb7, 0x02, 0, 1),
        insn(0xdb, 0x21, 0, 0),
        insn(0xb7, 0x00, 0, 0),
        EXIT,
    ]
    .concat();
    // The same increment 1000 times inside one run (r6 counts): the per-increment cost
    // without the host's per-call overhead.
    const INNER: i32 = 1000;
    let counter_loop = [
        insn(0xb7, 0x06, 0, INNER),
        insn(0x85, 0, 0, 8),
        insn(0x67, 0x00, 0, STRIDE.trailing_zeros() as i32),
        insn(0x18, 0x01, 0, base as i32),
        insn(0, 0, 0, (base >> 32) as i32),
        insn(0x0f, 0x01, 0, 0),
        insn(0xb7, 0x02, 0, 1),
        insn(0xdb, 0x21, 0, 0),
        insn(0x07, 0x06, 0, -1),
        insn(0x55, 0x06, -9, 0),
        insn(0xb7, 0x00, 0, 0),
        EXIT,
    ]
    .concat();
    // The same counter through the per-CPU array lookup helper: r0 = lookup(id, 0), then
    // lock add — the kernel's per-CPU array map pattern.
    let lookup_mem: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
    let array =
        // SAFETY: `lookup_mem` outlives every program (held until main returns), atomics only.
        unsafe { rt.add_percpu_array(lookup_mem.as_ptr() as *mut u8, STRIDE, 8, 1, ncpu) }.unwrap();
    let lookup_loop = [
        insn(0xb7, 0x06, 0, INNER),
        insn(0xb7, 0x01, 0, array as i32),
        insn(0xb7, 0x02, 0, 0),
        insn(
            0x85,
            0,
            0,
            packjit_plugin_api::PJ_HELPER_PERCPU_LOOKUP as i32,
        ),
        insn(0xb7, 0x01, 0, 1),
        insn(0xdb, 0x10, 0, 0),
        insn(0x07, 0x06, 0, -1),
        insn(0x55, 0x06, -7, 0),
        insn(0xb7, 0x00, 0, 0),
        EXIT,
    ]
    .concat();
    let cpus = allowed_cpus();
    let threads = cpus.len().clamp(1, 8);
    let runs = (iters as u64 / 10).max(1000);
    let runs_of = |per_run: u64| (runs / per_run).max(10);
    println!(
        "\nPer-CPU counter, sandboxed, {threads} threads pinned to distinct CPUs, {runs} increments \
         each (ns/increment: the fastest thread's own loop; best of 3 rounds):"
    );
    for (inline, code, per_run) in [
        (true, &counter, 1),
        (false, &counter, 1),
        (true, &counter_loop, INNER as u64),
        (false, &counter_loop, INNER as u64),
        (true, &lookup_loop, INNER as u64),
        (false, &lookup_loop, INNER as u64),
    ] {
        let lookup = std::ptr::eq(code, &lookup_loop);
        let slots = if lookup { &lookup_mem } else { &slots };
        let runs = runs_of(per_run);
        rt.set_inline_builtins(inline);
        let p = Arc::new(
            rt.load(
                code,
                &LoadOptions {
                    regions: vec![region],
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let mut best = f64::MAX;
        let mut summary = String::new();
        for _round in 0..3 {
            for s in slots.iter() {
                s.store(0, Relaxed);
            }
            let per_thread: Vec<f64> = std::thread::scope(|s| {
                let hs: Vec<_> = cpus
                    .iter()
                    .take(threads)
                    .map(|&cpu| {
                        let p = p.clone();
                        s.spawn(move || {
                            pin(cpu);
                            if fake {
                                refresh_fake();
                            }
                            let t = Instant::now();
                            for _ in 0..runs {
                                p.call(&mut []).unwrap();
                            }
                            t.elapsed().as_nanos() as f64 / (runs * per_run) as f64
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let sum: u64 = slots.iter().map(|s| s.load(Relaxed)).sum();
            let used = slots.iter().filter(|s| s.load(Relaxed) != 0).count();
            assert_eq!(sum, runs * per_run * threads as u64, "per-CPU counter sum");
            best = best.min(per_thread.iter().copied().fold(f64::MAX, f64::min));
            summary = format!(
                "sum {sum} == {} increments, {used} CPU slot(s) used",
                runs * per_run * threads as u64
            );
        }
        println!(
            "  {:<8} {:>8.1} ns/increment ({})   {summary}   ({})",
            if inline { "inline" } else { "call" },
            best,
            match (lookup, per_run) {
                (true, _) => "lookup helper, 1000 per run",
                (false, 1) => "CPU id, one per run",
                _ => "CPU id, 1000 per run",
            },
            if lookup {
                p.builtins().unwrap().percpu_lookup.to_string()
            } else {
                p.builtins().unwrap().cpu_id.to_string()
            }
        );
    }
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = this thread, set sized correctly.
    unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: index below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 = this thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
}
