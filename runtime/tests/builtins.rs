//! Built-in helpers: `bpf_get_smp_processor_id` (id 8) inlined as the rseq `cpu_id` load or
//! called (`sched_getcpu`), `bpf_ktime_get_ns` (id 5) inlined as the scaled CPU counter or
//! called (`clock_gettime`). Threads are pinned with `sched_setaffinity`, so the CPU id a
//! program reads must equal `sched_getcpu()`. No child processes (these run under qemu-user).
//!
//! Where glibc registered no rseq (qemu-user 7.2 has no rseq syscall), the inline path is
//! still executed: the test points the runtime at a thread-local `struct rseq` lookalike
//! whose `cpu_id` it keeps equal to `sched_getcpu()` itself.

mod host;

use packjit::builtins::{glibc_rseq_cpu_id_offset, measure_counter_hz};
use packjit::testing::RuntimeTestExt;
use packjit::{
    ClockImpl, CpuIdImpl, LoadOptions, MemRegion, PerCpuLookupImpl, Program, RegionAccess, Runtime,
};
use packjit_interp::hw;
use packjit_plugin_api::{HelperEntry, PJ_INLINE_RSEQ_CPU_ID};
use std::cell::UnsafeCell;
use std::sync::Arc;

fn runtime() -> Runtime {
    host::host_runtime()
}

fn insn(opc: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [opc, regs, 0, 0, 0, 0, 0, 0];
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

fn prog(insns: &[[u8; 8]]) -> Vec<u8> {
    insns.concat()
}

const CALL: u8 = 0x85;
const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

/// `call 8 ; exit`.
fn cpu_id_prog() -> Vec<u8> {
    prog(&[insn(CALL, 0, 0, 8), EXIT])
}

/// The CPUs this process may run on (at most `max`).
fn allowed_cpus(max: usize) -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = this thread, set sized correctly.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(r, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: index below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .take(max)
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 = this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(r, 0, "sched_setaffinity({cpu})");
}

fn sched_getcpu() -> u64 {
    // SAFETY: no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    assert!(c >= 0, "sched_getcpu failed");
    c as u64
}

/// A thread-local lookalike of glibc's `struct rseq` (32 bytes, aligned 32): static TLS of
/// the test executable, so it sits at the same offset from the thread pointer in every
/// thread, as glibc's rseq area does.
#[repr(C, align(32))]
struct FakeRseq {
    cpu_id_start: UnsafeCell<u32>,
    cpu_id: UnsafeCell<u32>,
    rest: [u64; 3],
}

thread_local! {
    static FAKE: FakeRseq = const {
        FakeRseq { cpu_id_start: UnsafeCell::new(0), cpu_id: UnsafeCell::new(u32::MAX), rest: [0; 3] }
    };
}

/// This thread's offset of `FAKE.cpu_id` from the thread pointer, after storing `value`.
fn fake_cpu_id(value: u32) -> i64 {
    FAKE.with(|f| {
        // SAFETY: only this thread touches its own FAKE; programs read it during calls.
        unsafe { *f.cpu_id_start.get() = value };
        // SAFETY: as above.
        unsafe { *f.cpu_id.get() = value };
        let _ = f.rest;
        f.cpu_id.get() as i64 - hw::thread_pointer() as i64
    })
}

/// Runs `p` pinned on each allowed CPU (up to 8) in its own thread; returns per CPU the
/// program's results and `sched_getcpu()` around them.
fn pinned_runs(p: &Arc<Program>, before_run: impl Fn(u64) + Send + Sync + Copy) -> usize {
    let cpus = allowed_cpus(8);
    std::thread::scope(|s| {
        for &cpu in &cpus {
            let p = p.clone();
            s.spawn(move || {
                pin(cpu);
                for _ in 0..200 {
                    let here = sched_getcpu();
                    assert_eq!(here, cpu as u64, "pinned thread moved");
                    before_run(here);
                    let got = p.call(&mut []).unwrap();
                    assert_eq!(got, here, "program's CPU id on CPU {cpu}");
                }
            });
        }
    });
    cpus.len()
}

#[test]
fn the_runtime_reports_its_choice_and_glibc_rseq_decides_it() {
    let rt = runtime();
    let choice = rt.builtins().unwrap();
    let rseq = glibc_rseq_cpu_id_offset();
    println!(
        "{}: glibc rseq cpu_id offset {rseq:?}; builtins: {choice}",
        std::env::consts::ARCH
    );
    match rseq {
        Some(offset) => assert_eq!(choice.cpu_id, CpuIdImpl::InlineRseq { offset }),
        None => assert_eq!(choice.cpu_id, CpuIdImpl::CallSchedGetcpu),
    }
    let p = rt.load(&cpu_id_prog(), &LoadOptions::default()).unwrap();
    assert_eq!(p.builtins().unwrap().cpu_id, choice.cpu_id);
    // Code that cannot call helper 5 skips the clock (and its calibration): call entry.
    assert_eq!(p.builtins().unwrap().clock, ClockImpl::CallClockGettime);
    let clock = prog(&[insn(CALL, 0, 0, 5), EXIT]);
    let c = rt.load(&clock, &LoadOptions::default()).unwrap();
    let got = c.builtins().unwrap();
    assert_eq!((got.cpu_id, got.clock), (choice.cpu_id, choice.clock));
    // Neither can call the per-CPU lookup: no table is built for them, call entry.
    for q in [&p, &c] {
        let lookup = q.builtins().unwrap().percpu_lookup;
        assert_eq!(lookup, PerCpuLookupImpl::CallSchedGetcpu);
    }
    rt.set_inline_builtins(false);
    let q = rt.load(&cpu_id_prog(), &LoadOptions::default()).unwrap();
    assert_eq!(q.builtins().unwrap().cpu_id, CpuIdImpl::CallSchedGetcpu);
    assert_eq!(q.builtins().unwrap().clock, ClockImpl::CallClockGettime);
    if let (Some(offset), "x86_64") = (rseq, std::env::consts::ARCH) {
        // `mov eax, fs:[disp32]`: the whole inlined helper is one instruction.
        let mut want = vec![0x64, 0x8b, 0x04, 0x25];
        want.extend_from_slice(&(offset as i32).to_le_bytes());
        assert!(
            p.code().windows(8).any(|w| w == want),
            "no fs load in the code"
        );
    }
    if rseq.is_some() {
        assert!(
            p.native_insns() < q.native_insns(),
            "inline {} vs call {} instructions",
            p.native_insns(),
            q.native_insns()
        );
    }
}

#[test]
fn a_host_helper_under_id_8_is_kept() {
    unsafe extern "C" fn seven(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        7
    }
    let rt = runtime();
    rt.register_helper(8, "mine", seven).unwrap();
    let p = rt.load(&cpu_id_prog(), &LoadOptions::default()).unwrap();
    assert_eq!(p.builtins().unwrap().cpu_id, CpuIdImpl::Host);
    assert_eq!(p.call(&mut []).unwrap(), 7);
}

#[test]
fn cpu_id_equals_sched_getcpu_on_pinned_threads_whatever_the_runtime_chose() {
    let rt = runtime();
    for inline in [true, false] {
        rt.set_inline_builtins(inline);
        let p = Arc::new(rt.load(&cpu_id_prog(), &LoadOptions::default()).unwrap());
        let n = pinned_runs(&p, |_| {});
        println!(
            "{} (inline allowed: {inline}): {n} CPUs",
            p.builtins().unwrap()
        );
    }
}

#[test]
fn inline_rseq_path_runs_through_a_test_rseq_area_and_agrees_with_the_interpreter() {
    let rt = runtime();
    let offset = fake_cpu_id(0);
    // SAFETY: FAKE is static TLS of this executable: the same offset in every thread, and
    // it lives as long as the thread (the program runs only on threads that filled it).
    unsafe { rt.set_rseq_cpu_id_offset(Some(offset)) };
    let p = Arc::new(rt.load(&cpu_id_prog(), &LoadOptions::default()).unwrap());
    assert_eq!(
        p.builtins().unwrap().cpu_id,
        CpuIdImpl::InlineRseq { offset }
    );
    // The load reads the test's area: a value no CPU has comes back.
    assert_eq!(fake_cpu_id(4242), offset);
    assert_eq!(p.call(&mut []).unwrap(), 4242);
    // `callx` reaching id 8 runs the same inline body (x86-64 and arm64 at the site, RV64
    // in the shared dispatch); another id is still refused at run time.
    let callx = prog(&[insn(0xb7, 0x01, 0, 8), insn(0x8d, 0x01, 0, 0), EXIT]);
    let px = rt.load(&callx, &LoadOptions::default()).unwrap();
    assert_eq!(px.call(&mut []).unwrap(), 4242);
    let callx_bad = prog(&[insn(0xb7, 0x01, 0, 77), insn(0x8d, 0x01, 0, 0), EXIT]);
    let pb = rt.load(&callx_bad, &LoadOptions::default()).unwrap();
    assert_eq!(
        pb.call(&mut []).unwrap_err().stop(),
        Some(packjit::Stop::UnknownCallx { pc: 1, id: 77 })
    );
    // The interpreter evaluates the same inline entry the same way.
    let table = [HelperEntry {
        id: 8,
        inline_kind: PJ_INLINE_RSEQ_CPU_ID,
        addr: offset as u64,
    }];
    // SAFETY: the entry's offset names FAKE.cpu_id, filled in this thread.
    let interp = unsafe { packjit_interp::Interpreter::from_helper_table(&table) };
    let ip = interp.load(&cpu_id_prog()).unwrap();
    assert_eq!(interp.run(&ip, &mut [], None).unwrap().r0, 4242);
    let ipx = interp.load(&callx).unwrap();
    assert_eq!(interp.run(&ipx, &mut [], None).unwrap().r0, 4242);
    // Pinned threads, each keeping its own area current: the inlined id is sched_getcpu().
    let n = pinned_runs(&p, |cpu| {
        assert_eq!(fake_cpu_id(cpu as u32), offset, "static TLS offset differs");
    });
    println!("inline rseq (test area at thread pointer {offset}) on {n} pinned CPUs");
}

/// Per-CPU counters from many threads: the program reads the CPU id and adds 1 to that
/// CPU's 8-byte slot of a sandbox region with an atomic add; the sum over the slots is the
/// number of runs, whatever the threads' migrations.
#[test]
fn per_cpu_counters_sum_to_the_number_of_runs() {
    let rt = runtime();
    let ncpu = libc::CPU_SETSIZE as usize;
    let slots: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..ncpu).map(|_| Default::default()).collect());
    // SAFETY: the slots outlive the program (the Arc is held until the end of the test) and
    // are only touched through atomics.
    let region = unsafe {
        MemRegion::new(
            slots.as_ptr() as *const u8,
            ncpu * 8,
            RegionAccess::ReadWrite,
        )
    };
    let base = slots.as_ptr() as u64;
    let code = prog(&[
        insn(CALL, 0, 0, 8),                // r0 = cpu
        insn(0x67, 0x00, 0, 3),             // r0 <<= 3
        insn(0x18, 0x01, 0, base as i32),   // lddw r1, base
        insn(0, 0, 0, (base >> 32) as i32), //
        insn(0x0f, 0x01, 0, 0),             // r1 += r0
        insn(0xb7, 0x02, 0, 1),             // r2 = 1
        insn(0xdb, 0x21, 0, 0),             // lock *(u64 *)(r1 + 0) += r2
        insn(0xb7, 0x00, 0, 0),             // r0 = 0
        EXIT,
    ]);
    let opts = LoadOptions {
        regions: vec![region],
        ..Default::default()
    };
    let threads = 4;
    let runs = 2_000;
    for inline in [true, false] {
        rt.set_inline_builtins(inline);
        for s in slots.iter() {
            s.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let p = Arc::new(rt.load(&code, &opts).unwrap());
        std::thread::scope(|s| {
            for t in 0..threads {
                let p = p.clone();
                let cpus = allowed_cpus(64);
                s.spawn(move || {
                    pin(cpus[t % cpus.len()]);
                    for _ in 0..runs {
                        p.call(&mut []).unwrap();
                    }
                });
            }
        });
        let total: u64 = slots
            .iter()
            .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        assert_eq!(total, (threads * runs) as u64, "{}", p.builtins().unwrap());
    }
}

/// `call 5 ; r6 = r0 ; call 5 ; r0 -= r6 ; exit` and a plain `call 5`.
#[test]
fn the_clock_is_monotonic_nanoseconds_on_clock_monotonic_time_line() {
    let rt = runtime();
    let choice = rt.builtins().unwrap();
    println!("{}: clock {}", std::env::consts::ARCH, choice.clock);
    let mut variants = vec![("as detected", None)];
    if !matches!(choice.clock, ClockImpl::InlineCounter { .. }) {
        // No known frequency here (RV64 under qemu): force the inline path with a measured one.
        variants.push(("measured frequency", Some(measure_counter_hz())));
    }
    for (what, hz) in variants {
        if let Some(hz) = hz {
            rt.set_counter_clock_hz(Some(hz));
        }
        let now = rt
            .load(&prog(&[insn(CALL, 0, 0, 5), EXIT]), &LoadOptions::default())
            .unwrap();
        let delta = rt
            .load(
                &prog(&[
                    insn(CALL, 0, 0, 5),
                    insn(0xbf, 0x06, 0, 0),
                    insn(CALL, 0, 0, 5),
                    insn(0x1f, 0x60, 0, 0),
                    EXIT,
                ]),
                &LoadOptions::default(),
            )
            .unwrap();
        println!("{what}: {}", now.builtins().unwrap().clock);
        for _ in 0..100 {
            let d = delta.call(&mut []).unwrap() as i64;
            assert!((0..50_000_000).contains(&d), "{what}: delta {d} ns");
        }
        let mono = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: valid out-pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            ts.tv_sec * 1_000_000_000 + ts.tv_nsec
        };
        for _ in 0..100 {
            let a = mono();
            let t = now.call(&mut []).unwrap() as i64;
            let b = mono();
            // 2 ms of slack: the counter's rate is exact or measured to a few ppm, and
            // CLOCK_MONOTONIC may be slewed by NTP since calibration.
            assert!(
                t >= a - 2_000_000 && t <= b + 2_000_000,
                "{what}: {t} not within [{a}, {b}] ± 2 ms"
            );
        }
    }
}

/// The per-CPU array lookup: `r1 = id, r2 = index; call lookup` gives this CPU's element
/// (checked against `sched_getcpu()` on pinned threads) or 0 out of bounds; a counter
/// incremented through it from several threads sums to the number of runs, sandboxed (the
/// array is an ordinary region), inlined and called, and the interpreter agrees.
#[test]
fn per_cpu_array_lookup_inlined_and_called() {
    use packjit_plugin_api::PJ_HELPER_PERCPU_LOOKUP;
    let rt = runtime();
    const SLOT: usize = 64;
    const ENTRIES: usize = 4;
    let cpus = libc::CPU_SETSIZE as usize;
    let mem: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..cpus * SLOT / 8).map(|_| Default::default()).collect());
    let base = mem.as_ptr() as u64;
    // SAFETY: `mem` outlives the programs (held to the end), touched through atomics only.
    let id = unsafe { rt.add_percpu_array(base as *mut u8, SLOT, 8, ENTRIES, cpus) }.unwrap();
    let lookup = |index: i32| {
        prog(&[
            insn(0xb7, 0x01, 0, id as i32),
            insn(0xb7, 0x02, 0, index),
            insn(CALL, 0, 0, PJ_HELPER_PERCPU_LOOKUP as i32),
            EXIT,
        ])
    };
    // r0 = lookup(id, 2); if r0 == 0 goto out; lock *(u64 *)r0 += 1; r0 = 1; out: exit
    let counter = prog(&[
        insn(0xb7, 0x01, 0, id as i32),
        insn(0xb7, 0x02, 0, 2),
        insn(CALL, 0, 0, PJ_HELPER_PERCPU_LOOKUP as i32),
        insn(0x15, 0x00, 3, 0),
        insn(0xb7, 0x01, 0, 1),
        insn(0xdb, 0x10, 0, 0),
        insn(0xb7, 0x00, 0, 1),
        EXIT,
    ]);
    let native_rseq = glibc_rseq_cpu_id_offset().is_some();
    let offset = fake_cpu_id(0);
    for mode in ["as detected", "test rseq area", "call"] {
        rt.set_inline_builtins(mode != "call");
        if mode == "test rseq area" {
            // SAFETY: as in the test above: static TLS, filled by every running thread.
            unsafe { rt.set_rseq_cpu_id_offset(Some(offset)) };
        }
        let fake = mode == "test rseq area";
        let p2 = Arc::new(rt.load(&lookup(2), &LoadOptions::default()).unwrap());
        let choice = p2.builtins().unwrap().percpu_lookup;
        match mode {
            "call" => assert_eq!(choice, PerCpuLookupImpl::CallSchedGetcpu),
            "test rseq area" => assert_eq!(choice, PerCpuLookupImpl::Inline),
            _ => assert_eq!(
                choice,
                if native_rseq {
                    PerCpuLookupImpl::Inline
                } else {
                    PerCpuLookupImpl::CallSchedGetcpu
                }
            ),
        }
        let oob = rt
            .load(&lookup(ENTRIES as i32), &LoadOptions::default())
            .unwrap();
        let bad_id = rt
            .load(
                &prog(&[
                    insn(0xb7, 0x01, 0, 1000),
                    insn(0xb7, 0x02, 0, 0),
                    insn(CALL, 0, 0, PJ_HELPER_PERCPU_LOOKUP as i32),
                    EXIT,
                ]),
                &LoadOptions::default(),
            )
            .unwrap();
        let c = Arc::new(rt.load(&counter, &LoadOptions::default()).unwrap());
        for s in mem.iter() {
            s.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let runs = 500;
        let cpu_list = allowed_cpus(8);
        std::thread::scope(|s| {
            for &cpu in &cpu_list {
                let (p2, c) = (p2.clone(), c.clone());
                s.spawn(move || {
                    pin(cpu);
                    let here = sched_getcpu();
                    if fake {
                        fake_cpu_id(here as u32);
                    }
                    let want = base + here * SLOT as u64 + 2 * 8;
                    assert_eq!(p2.call(&mut []).unwrap(), want, "{mode} on CPU {cpu}");
                    for _ in 0..runs {
                        assert_eq!(c.call(&mut []).unwrap(), 1);
                    }
                });
            }
        });
        if fake {
            fake_cpu_id(sched_getcpu() as u32);
        }
        assert_eq!(oob.call(&mut []).unwrap(), 0, "{mode}: index out of bounds");
        assert_eq!(bad_id.call(&mut []).unwrap(), 0, "{mode}: unknown array id");
        let total: u64 = mem
            .iter()
            .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        assert_eq!(total, (runs * cpu_list.len()) as u64, "{mode}");
        println!("per-CPU lookup {mode}: {choice}, {} CPUs", cpu_list.len());
    }
    // The interpreter, given the inline entry, computes the same element.
    let table = [
        2u64,
        offset as u64,
        0,
        0,
        0,
        0,
        0,
        base,
        SLOT as u64,
        8,
        ENTRIES as u64,
        cpus as u64,
    ];
    let entry = [HelperEntry {
        id: PJ_HELPER_PERCPU_LOOKUP,
        inline_kind: packjit_plugin_api::PJ_INLINE_PERCPU_LOOKUP,
        addr: table.as_ptr() as u64,
    }];
    // SAFETY: the table lives to the end of the test; FAKE is filled in this thread.
    let interp = unsafe { packjit_interp::Interpreter::from_helper_table(&entry) };
    let code = prog(&[
        insn(0xb7, 0x01, 0, 1),
        insn(0xb7, 0x02, 0, 3),
        insn(CALL, 0, 0, PJ_HELPER_PERCPU_LOOKUP as i32),
        EXIT,
    ]);
    let ip = interp.load(&code).unwrap();
    assert_eq!(fake_cpu_id(5), offset);
    assert_eq!(
        interp.run(&ip, &mut [], None).unwrap().r0,
        base + 5 * SLOT as u64 + 3 * 8
    );
}

/// `dst = src + cpu * slot_size` of per-CPU array `id` (packjit's internal per-CPU mov:
/// `BPF_ALU64 | BPF_MOV | BPF_X`, `off = -1`, `imm` = array id).
fn percpu_mov(dst: u8, src: u8, id: i32) -> [u8; 8] {
    insn(0xbf, src << 4 | dst, -1, id)
}

/// `lddw dst, v`.
fn lddw(dst: u8, v: u64) -> [[u8; 8]; 2] {
    [
        insn(0x18, dst, 0, v as u32 as i32),
        insn(0, 0, 0, (v >> 32) as u32 as i32),
    ]
}

/// The per-CPU mov, on pinned threads, under the three ways of getting the CPU (as
/// detected, the test's rseq area inline, the `sched_getcpu` call): each thread's program
/// addresses and increments its own CPU's slot; the registers other than `dst` survive the
/// (possibly called) CPU read; an unknown array id or a CPU past the array's `cpus` leaves
/// `dst = src`; the encoding is refused without the opt-in; the interpreter agrees.
#[test]
fn per_cpu_mov_addresses_this_cpus_slot() {
    use packjit_plugin_api::{PJ_COMPILE_PERCPU_INSN, PJ_HELPER_PERCPU_OFFSET};
    let rt = runtime();
    const SLOT: usize = 64;
    let cpus = libc::CPU_SETSIZE as usize;
    let mem: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..cpus * SLOT / 8).map(|_| Default::default()).collect());
    let base = mem.as_ptr() as u64;
    // SAFETY: `mem` outlives the programs (held to the end), touched through atomics only.
    let id = unsafe { rt.add_percpu_array(base as *mut u8, SLOT, 8, SLOT / 8, cpus) }.unwrap();
    // A one-CPU array: every CPU but 0 is out of its range, so the mov leaves dst = src.
    let one: Vec<std::sync::atomic::AtomicU64> =
        (0..SLOT / 8).map(|_| Default::default()).collect();
    let one_base = one.as_ptr() as u64;
    // SAFETY: as above.
    let one_id = unsafe { rt.add_percpu_array(one_base as *mut u8, SLOT, 8, SLOT / 8, 1) }.unwrap();
    let opt_in = LoadOptions {
        percpu_insn: true,
        ..LoadOptions::default()
    };
    // r1 = &slot0[2]; r2 = percpu(r1); r3 = 1; lock *(u64 *)(r2 + 0) += r3; r0 = r2; exit
    let counter = |array: u32, slot0: u64| {
        [
            &lddw(1, slot0 + 16)[..],
            &[
                percpu_mov(2, 1, array as i32),
                insn(0xb7, 0x03, 0, 1),
                insn(0xdb, 0x32, 0, 0),
                insn(0xbf, 0x20, 0, 0),
                EXIT,
            ],
        ]
        .concat()
        .concat()
    };
    // r0..r5 = 1, base, 3, 5, 7, 11; r6 = percpu(r1); r6 -= r1; r0 += r2 + r3 + r4 + r5 + r6
    // = 27 + cpu * SLOT when every register but r6 survived.
    let survivors = [
        &[insn(0xb7, 0x00, 0, 1)][..],
        &lddw(1, base)[..],
        &[
            insn(0xb7, 0x02, 0, 3),
            insn(0xb7, 0x03, 0, 5),
            insn(0xb7, 0x04, 0, 7),
            insn(0xb7, 0x05, 0, 11),
            percpu_mov(6, 1, id as i32),
            insn(0x1f, 0x16, 0, 0),
            insn(0x0f, 0x20, 0, 0),
            insn(0x0f, 0x30, 0, 0),
            insn(0x0f, 0x40, 0, 0),
            insn(0x0f, 0x50, 0, 0),
            insn(0x0f, 0x60, 0, 0),
            EXIT,
        ],
    ]
    .concat()
    .concat();

    // Without the opt-in the encoding is a reserved `off`, refused at its pc.
    let e = rt
        .load(&counter(id, base), &LoadOptions::default())
        .unwrap_err();
    assert_eq!(e.pc, Some(2), "{e}");
    assert!(e.message.contains("offset"), "{e}");
    // Opted in, `call` of the table's id is still refused.
    let call_table = prog(&[insn(CALL, 0, 0, PJ_HELPER_PERCPU_OFFSET as i32), EXIT]);
    let e = rt.load(&call_table, &opt_in).unwrap_err();
    assert_eq!(e.pc, Some(0), "{e}");

    let offset = fake_cpu_id(0);
    for mode in ["as detected", "test rseq area", "call"] {
        rt.set_inline_builtins(mode != "call");
        if mode == "test rseq area" {
            // SAFETY: as in the tests above: static TLS, filled by every running thread.
            unsafe { rt.set_rseq_cpu_id_offset(Some(offset)) };
        }
        let fake = mode == "test rseq area";
        let c = Arc::new(rt.load(&counter(id, base), &opt_in).unwrap());
        let s = Arc::new(rt.load(&survivors, &opt_in).unwrap());
        // Blinded: the array id is materialised masked; same result.
        let sb = Arc::new(
            rt.load(
                &survivors,
                &LoadOptions {
                    blind_constants: true,
                    ..opt_in.clone()
                },
            )
            .unwrap(),
        );
        let bad = Arc::new(rt.load(&counter(1_000_000, base), &opt_in).unwrap());
        let narrow = Arc::new(rt.load(&counter(one_id, one_base), &opt_in).unwrap());
        let choice = c.builtins().unwrap().cpu_id;
        for w in mem.iter() {
            w.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let runs = 200u64;
        let cpu_list = allowed_cpus(8);
        std::thread::scope(|sc| {
            for &cpu in &cpu_list {
                let (c, s, sb, bad) = (c.clone(), s.clone(), sb.clone(), bad.clone());
                sc.spawn(move || {
                    pin(cpu);
                    let here = sched_getcpu();
                    if fake {
                        fake_cpu_id(here as u32);
                    }
                    let want = base + here * SLOT as u64 + 16;
                    for _ in 0..runs {
                        assert_eq!(c.call(&mut []).unwrap(), want, "{mode} on CPU {cpu}");
                    }
                    assert_eq!(
                        s.call(&mut []).unwrap(),
                        27 + here * SLOT as u64,
                        "{mode}: registers around the per-CPU mov on CPU {cpu}"
                    );
                    assert_eq!(
                        sb.call(&mut []).unwrap(),
                        27 + here * SLOT as u64,
                        "{mode}: blinded, on CPU {cpu}"
                    );
                    assert_eq!(bad.call(&mut []).unwrap(), base + 16, "{mode}: unknown id");
                });
            }
        });
        if fake {
            fake_cpu_id(sched_getcpu() as u32);
        }
        // Each pinned thread changed exactly its own CPU's slot.
        for (k, w) in mem.iter().enumerate() {
            let cpu = (k * 8 / SLOT) as u64;
            let want = if k * 8 % SLOT == 16 && cpu_list.contains(&(cpu as usize)) {
                // `bad` added its runs to CPU 0's slot (dst = src).
                runs + if cpu == 0 { cpu_list.len() as u64 } else { 0 }
            } else if k * 8 == 16 {
                cpu_list.len() as u64
            } else {
                0
            };
            assert_eq!(
                w.load(std::sync::atomic::Ordering::Relaxed),
                want,
                "{mode}: word {k}"
            );
        }
        // The one-CPU array: CPU 0 gets slot 0, every other CPU is out of range → dst = src.
        assert_eq!(narrow.call(&mut []).unwrap(), one_base + 16, "{mode}");
        println!(
            "per-CPU mov {mode}: cpu id {choice}, {} pinned CPUs",
            cpu_list.len()
        );
    }

    // The moved pointer is an ordinary pointer for the sandbox: from an address outside
    // every region (16 + cpu * SLOT), the write stops at its pc instead of landing.
    let stray = rt.load(&counter(id, 0), &opt_in).unwrap();
    let e = stray.call(&mut []).unwrap_err();
    assert_eq!(
        e.stop().map(|s| (s.kind(), s.pc())),
        Some((packjit::StopKind::OutOfBounds, 4)),
        "{e}"
    );

    // The interpreter, with the same inline CPU id and a table of its own, agrees with the
    // JIT on this thread.
    rt.set_inline_builtins(true);
    // SAFETY: as above.
    unsafe { rt.set_rseq_cpu_id_offset(Some(offset)) };
    let s = rt.load(&survivors, &opt_in).unwrap();
    let table = [
        1u64,
        0,
        base,
        SLOT as u64,
        8,
        (SLOT / 8) as u64,
        cpus as u64,
    ];
    let entries = [
        HelperEntry {
            id: 8,
            inline_kind: PJ_INLINE_RSEQ_CPU_ID,
            addr: offset as u64,
        },
        HelperEntry {
            id: PJ_HELPER_PERCPU_OFFSET,
            inline_kind: 0,
            addr: table.as_ptr() as u64,
        },
    ];
    // SAFETY: the table lives to the end of the test; FAKE is filled in this thread.
    let interp = unsafe { packjit_interp::Interpreter::from_helper_table(&entries) };
    let code = [
        &[insn(0xb7, 0x00, 0, 1)][..],
        &lddw(1, base)[..],
        &[
            insn(0xb7, 0x02, 0, 3),
            insn(0xb7, 0x03, 0, 5),
            insn(0xb7, 0x04, 0, 7),
            insn(0xb7, 0x05, 0, 11),
            // The interpreter's table has one array: id 0.
            percpu_mov(6, 1, 0),
            insn(0x1f, 0x16, 0, 0),
            insn(0x0f, 0x20, 0, 0),
            insn(0x0f, 0x30, 0, 0),
            insn(0x0f, 0x40, 0, 0),
            insn(0x0f, 0x50, 0, 0),
            insn(0x0f, 0x60, 0, 0),
            EXIT,
        ],
    ]
    .concat()
    .concat();
    let e = interp.load(&code).unwrap_err();
    assert_eq!(e.pc, Some(7), "{e}");
    let ip = interp
        .load_with_flags(&code, PJ_COMPILE_PERCPU_INSN)
        .unwrap();
    for cpu in [0u32, 3, 9, cpus as u32, u32::MAX] {
        assert_eq!(fake_cpu_id(cpu), offset);
        let want = if (cpu as usize) < cpus {
            27 + cpu as u64 * SLOT as u64
        } else {
            27
        };
        assert_eq!(
            interp.run(&ip, &mut [], None).unwrap().r0,
            want,
            "cpu {cpu}"
        );
        assert_eq!(s.call(&mut []).unwrap(), want, "JIT, cpu {cpu}");
    }
    fake_cpu_id(sched_getcpu() as u32);
    drop(one);
}
