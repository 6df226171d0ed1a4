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

/// User-space instructions retired while running `f`, from a perf counter (x86-64 natively;
/// `None` where perf is unavailable, e.g. under qemu-user where it would count qemu).
fn instructions(f: impl FnOnce()) -> Option<u64> {
    if !cfg!(target_arch = "x86_64") {
        f();
        return None;
    }
    #[repr(C)]
    #[derive(Default)]
    struct Attr {
        type_: u32,
        size: u32,
        config: u64,
        sample: u64,
        sample_type: u64,
        read_format: u64,
        flags: u64,
        rest: [u64; 10],
    }
    let attr = Attr {
        type_: 0, // PERF_TYPE_HARDWARE
        size: 112,
        config: 1, // PERF_COUNT_HW_INSTRUCTIONS
        // disabled | exclude_kernel | exclude_hv
        flags: 1 | (1 << 5) | (1 << 6),
        ..Default::default()
    };
    // SAFETY: perf_event_open with a valid attribute block (this thread, any CPU).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            0,
            -1,
            -1,
            0,
        )
    } as i32;
    if fd < 0 {
        f();
        return None;
    }
    // SAFETY: ioctls on our own perf fd: RESET, ENABLE, DISABLE.
    unsafe {
        libc::ioctl(fd, 0x2403, 0);
        libc::ioctl(fd, 0x2400, 0);
    }
    f();
    let mut v = 0u64;
    // SAFETY: as above; read 8 bytes into `v`, then close our fd.
    unsafe {
        libc::ioctl(fd, 0x2401, 0);
        libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8);
        libc::close(fd);
    }
    Some(v)
}

fn time_per(p: &Program, n: u64) -> f64 {
    p.call(&mut []).unwrap(); // warm
    let t = Instant::now();
    p.call(&mut []).unwrap();
    t.elapsed().as_nanos() as f64 / n as f64
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
    let empty = load(&empty_loop(iters), true);
    let base_ns = time_per(&empty, iters as u64);
    let base_insns = instructions(|| {
        empty.call(&mut []).unwrap();
    });

    println!("\nCPU id (helper 8), {iters} reads in a loop (loop overhead subtracted):");
    println!(
        "  {:<10} {:>10} {:>14} {:>18}",
        "", "ns/read", "insns/read", "site insns"
    );
    let one_site = |inline| {
        let with = load(&[insn(0x85, 0, 0, 8), EXIT].concat(), inline);
        with.native_insns() - load(&EXIT, inline).native_insns()
    };
    let mut per_read = vec![];
    for inline in [true, false] {
        let p = load(&loop_prog(8, iters), inline);
        let ns = time_per(&p, iters as u64) - base_ns;
        let insns = instructions(|| {
            p.call(&mut []).unwrap();
        })
        .zip(base_insns)
        .map(|(a, b)| (a.saturating_sub(b)) as f64 / iters as f64);
        per_read.push((ns, insns));
        println!(
            "  {:<10} {:>10.2} {:>14} {:>18}",
            if inline { "inline" } else { "call" },
            ns,
            insns.map_or("n/a".into(), |i| format!("{i:.1}")),
            one_site(inline),
        );
    }
    let (ni, nc) = (per_read[0], per_read[1]);
    println!(
        "  call/inline: {:.1}x time{}",
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

    // Per-CPU counter: CPU id → slot (8 bytes each) → lock add 1, sandboxed; N threads.
    let ncpu = 1024usize;
    let slots: Arc<Vec<AtomicU64>> = Arc::new((0..ncpu).map(|_| AtomicU64::new(0)).collect());
    // SAFETY: the slots outlive every program (held until main returns), atomics only.
    let region =
        unsafe { MemRegion::new(slots.as_ptr() as *const u8, ncpu * 8, RegionAccess::ReadWrite) };
    let base = slots.as_ptr() as u64;
    let counter = [
        insn(0x85, 0, 0, 8),
        insn(0x67, 0x00, 0, 3),
        insn(0x18, 0x01, 0, base as i32),
        insn(0, 0, 0, (base >> 32) as i32),
        insn(0x0f, 0x01, 0, 0),
        insn(0xb7, 0x02, 0, 1),
        insn(0xdb, 0x21, 0, 0),
        insn(0xb7, 0x00, 0, 0),
        EXIT,
    ]
    .concat();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let runs = (iters as u64 / 10).max(1000);
    println!("\nPer-CPU counter, sandboxed, {threads} threads x {runs} runs:");
    for inline in [true, false] {
        rt.set_inline_builtins(inline);
        let p = Arc::new(
            rt.load(
                &counter,
                &LoadOptions {
                    regions: vec![region],
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        for s in slots.iter() {
            s.store(0, Relaxed);
        }
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                let p = p.clone();
                s.spawn(move || {
                    if fake {
                        refresh_fake();
                    }
                    for _ in 0..runs {
                        p.call(&mut []).unwrap();
                    }
                });
            }
        });
        let ns = t.elapsed().as_nanos() as f64 / (runs * threads as u64) as f64;
        let sum: u64 = slots.iter().map(|s| s.load(Relaxed)).sum();
        let used = slots.iter().filter(|s| s.load(Relaxed) != 0).count();
        println!(
            "  {:<10} {:>8.1} ns/run (wall / runs), sum {sum} == {} runs: {}, {used} CPU slot(s) used",
            if inline { "inline" } else { "call" },
            ns,
            runs * threads as u64,
            sum == runs * threads as u64
        );
        assert_eq!(sum, runs * threads as u64);
    }
}
