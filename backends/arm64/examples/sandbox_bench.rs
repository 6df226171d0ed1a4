//! Sandboxed vs trusted arm64 code, side by side in one process (runs under qemu-aarch64):
//!
//! ```text
//! source scripts/env.sh
//! packjit_cross_cargo aarch64-unknown-linux-gnu run --release -p packjit-arm64 --example sandbox_bench
//! ```
//!
//! For each program it prints the time per run in each mode, the ratio to trusted, and the
//! arm64 instructions per eBPF instruction on the hot loop's path (static count of the
//! inline code). Under qemu-user the times are those of qemu's translated code: ratios are
//! indicative, not silicon figures.
//!
//! The "sandbox, no clamp" row is compiled with the measurement-only
//! `EmitOptions { spectre_clamp: false }` (Rust API of this crate only, not reachable from
//! the plugin ABI or the runtime): its difference to "sandbox" is what the Spectre-v1 clamp
//! costs; the rest of the difference to "trusted" is the checks themselves. "sandbox, no
//! groups" turns the check groups off (one check per access).

#[cfg(target_arch = "aarch64")]
mod bench {
    use packjit_arm64::{emit_request_with, EmitOptions};
    use packjit_plugin_api::abi::{
        PjExecEnv, PjProgramEntry, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX, PJ_STOP_NONE,
    };
    use packjit_plugin_api::CompileRequest;
    use std::time::Instant;

    extern "C" {
        fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
    }

    use packjit_frontend::encode_insn as ins;

    /// Hashes the context 8 bytes at a time through a moving pointer (every load checked
    /// in the sandbox, hitting the context: the inline fast path).
    fn ctx_hash() -> Vec<u8> {
        [
            ins(0xbf, 3, 1, 0, 0),      // r3 = ctx
            ins(0x0f, 2, 1, 0, 0),      // r2 = ctx + len
            ins(0x18, 0, 0, 0, 0x1234), // r0 = 0x1234 (lddw)
            ins(0, 0, 0, 0, 0),
            ins(0x18, 5, 0, 0, 0x1b3), // r5 = FNV prime
            ins(0, 0, 0, 0, 0x100),
            // loop:
            ins(0x79, 4, 3, 0, 0),  // r4 = *(u64 *)r3
            ins(0xaf, 0, 4, 0, 0),  // r0 ^= r4
            ins(0x2f, 0, 5, 0, 0),  // r0 *= r5
            ins(0x07, 3, 0, 0, 8),  // r3 += 8
            ins(0x2d, 2, 3, -5, 0), // if r2 > r3 goto loop
            ins(0x95, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// Arithmetic only: an LCG mixed with shifts, no memory (measures budget charges).
    fn compute() -> Vec<u8> {
        [
            ins(0xb7, 0, 0, 0, 1),
            ins(0xb7, 6, 0, 0, 0), // r6 = i
            // loop:
            ins(0x27, 0, 0, 0, 0x41c6_4e6d), // r0 *= a
            ins(0x07, 0, 0, 0, 12345),       // r0 += c
            ins(0xbf, 7, 0, 0, 0),           // r7 = r0
            ins(0x77, 7, 0, 0, 17),          // r7 >>= 17
            ins(0xaf, 0, 7, 0, 0),           // r0 ^= r7
            ins(0x07, 6, 0, 0, 1),           // i++
            ins(0xa5, 6, 0, -7, 4096),       // if i < 4096 goto loop
            ins(0x95, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// A 64-slot table on the stack, filled at constant offsets (unchecked) and read back
    /// through a computed pointer (checked; the stack block is the out-of-line path).
    fn stack_table() -> Vec<u8> {
        let mut p = Vec::new();
        for k in 0..64i16 {
            p.push(ins(0x7a, 10, 0, -8 * (k + 1), k as i32 * 3 + 1)); // *(r10 - 8(k+1)) = 3k+1
        }
        p.extend([
            ins(0xb7, 0, 0, 0, 0),
            ins(0xb7, 6, 0, 0, 0), // round
            // outer:
            ins(0xbf, 3, 10, 0, 0), // r3 = r10 - 512
            ins(0x07, 3, 0, 0, -512),
            // inner:
            ins(0x79, 4, 3, 0, 0), // r4 = *(u64 *)r3
            ins(0x0f, 0, 4, 0, 0), // r0 += r4
            ins(0x07, 3, 0, 0, 8),
            ins(0x5d, 3, 10, -4, 0), // if r3 != r10 goto inner
            ins(0x07, 6, 0, 0, 1),
            ins(0xa5, 6, 0, -8, 64), // if round < 64 goto outer
            ins(0x95, 0, 0, 0, 0),
        ]);
        p.concat()
    }

    /// A 64-slot stack table read through a masked index: `r3 = r10 - 512 + ((i << 3) &
    /// 0x1f8)`. The range analysis proves every read inside the frame: no check, no clamp.
    fn stack_table_masked() -> Vec<u8> {
        let mut p = Vec::new();
        for k in 0..64i16 {
            p.push(ins(0x7a, 10, 0, -8 * (k + 1), k as i32 * 3 + 1));
        }
        p.extend([
            ins(0xb7, 0, 0, 0, 0),
            ins(0xb7, 6, 0, 0, 0), // i
            // loop:
            ins(0xbf, 4, 6, 0, 0),     // r4 = i
            ins(0x67, 4, 0, 0, 3),     // r4 <<= 3
            ins(0x57, 4, 0, 0, 0x1f8), // r4 &= 0x1f8
            ins(0xbf, 3, 10, 0, 0),    // r3 = r10
            ins(0x07, 3, 0, 0, -512),  // r3 -= 512
            ins(0x0f, 3, 4, 0, 0),     // r3 += r4
            ins(0x79, 5, 3, 0, 0),     // r5 = *(u64 *)r3
            ins(0x0f, 0, 5, 0, 0),     // r0 += r5
            ins(0x07, 6, 0, 0, 1),
            ins(0xa5, 6, 0, -10, 4096), // if i < 4096 goto loop
            ins(0x95, 0, 0, 0, 0),
        ]);
        p.concat()
    }

    /// Header parsing: five context loads at constant offsets from r1 per round (one check
    /// group: a single widened length test per round).
    fn header_parse() -> Vec<u8> {
        [
            ins(0xb7, 0, 0, 0, 0),
            ins(0xb7, 6, 0, 0, 0), // i
            // loop:
            ins(0x69, 2, 1, 12, 0), // r2 = *(u16 *)(r1 + 12)
            ins(0x71, 3, 1, 23, 0), // r3 = *(u8 *)(r1 + 23)
            ins(0x61, 4, 1, 26, 0), // r4 = *(u32 *)(r1 + 26)
            ins(0x61, 5, 1, 30, 0), // r5 = *(u32 *)(r1 + 30)
            ins(0x69, 7, 1, 34, 0), // r7 = *(u16 *)(r1 + 34)
            ins(0x0f, 0, 2, 0, 0),
            ins(0xaf, 0, 3, 0, 0),
            ins(0x0f, 0, 4, 0, 0),
            ins(0xaf, 0, 5, 0, 0),
            ins(0x0f, 0, 7, 0, 0),
            ins(0x07, 6, 0, 0, 1),
            ins(0xa5, 6, 0, -12, 4096), // if i < 4096 goto loop
            ins(0x95, 0, 0, 0, 0),
        ]
        .concat()
    }

    struct Code {
        map: *mut libc::c_void,
        len: usize,
        /// Byte offset of each eBPF instruction's inline code, and the end of the code.
        offsets: Vec<usize>,
    }

    impl Code {
        fn new(code: &[u8], flags: u32, opts: EmitOptions) -> Code {
            let out = emit_request_with(
                &CompileRequest {
                    code,
                    helpers: &[],
                    features: packjit_arm64::detect_cpu_features(),
                    flags,
                    blind_key: 0,
                },
                opts,
            )
            .expect("compile");
            let len = out.bytes.len().div_ceil(4096) * 4096;
            // SAFETY: a fresh private mapping, written while RW, then made RX and flushed.
            unsafe {
                let map = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(map, libc::MAP_FAILED);
                std::ptr::copy_nonoverlapping(out.bytes.as_ptr(), map as *mut u8, out.bytes.len());
                assert_eq!(
                    libc::mprotect(map, len, libc::PROT_READ | libc::PROT_EXEC),
                    0
                );
                __clear_cache(
                    map as *mut _,
                    (map as *mut libc::c_char).add(out.bytes.len()),
                );
                let mut offsets = out.inst_offsets.clone();
                offsets.push(out.bytes.len());
                Code { map, len, offsets }
            }
        }

        /// Inline arm64 instructions of eBPF instructions `range` (indices): what one pass
        /// over a loop body executes on its hot path.
        fn inline_insns(&self, range: std::ops::Range<usize>) -> usize {
            (self.offsets[range.end] - self.offsets[range.start]) / 4
        }

        fn run(&self, mem: &mut [u8]) -> u64 {
            let mut env = PjExecEnv {
                ctx_start: mem.as_ptr() as u64,
                ctx_end: mem.as_ptr() as u64 + mem.len() as u64,
                budget: u64::MAX,
                ..Default::default()
            };
            // SAFETY: code emitted for the PjProgramEntry ABI, env valid for the call.
            let r = unsafe {
                let f: PjProgramEntry = std::mem::transmute(self.map);
                f(mem.as_mut_ptr(), mem.len() as u64, &mut env)
            };
            assert_eq!(env.stop_kind, PJ_STOP_NONE, "{env:?}");
            r
        }
    }

    impl Drop for Code {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer used.
            unsafe { libc::munmap(self.map, self.len) };
        }
    }

    pub fn main() {
        let mut mem: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let on = EmitOptions::default();
        let no_clamp = EmitOptions {
            spectre_clamp: false,
            ..on
        };
        let no_groups = EmitOptions {
            group_checks: false,
            ..on
        };
        let modes = [
            ("trusted", 0, on),
            ("sandbox", PJ_COMPILE_SANDBOX, on),
            ("sandbox,noclamp", PJ_COMPILE_SANDBOX, no_clamp),
            ("sandbox,nogroup", PJ_COMPILE_SANDBOX, no_groups),
            ("sandbox+budget", PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET, on),
        ];
        // (name, program, hot loop as eBPF instruction indices, cold insns per iteration)
        for (name, code, hot, cold) in [
            ("ctx hash (4 KiB, checked loads)", ctx_hash(), 4..9, 0),
            ("compute (no memory)", compute(), 2..9, 0),
            // r3 walks the frame by a loop: its loads check the stack block inline.
            (
                "stack table (checked stack pointer)",
                stack_table(),
                68..72,
                0,
            ),
            (
                "stack table, masked index (proven)",
                stack_table_masked(),
                66..76,
                0,
            ),
            (
                "header parse (5 ctx loads, 1 group)",
                header_parse(),
                2..14,
                0,
            ),
        ] {
            println!("{name}: {} eBPF insns", code.len() / 8);
            let codes: Vec<(&str, u32, Code)> = modes
                .iter()
                .map(|&(m, f, o)| (m, f, Code::new(&code, f, o)))
                .collect();
            let want = codes[0].2.run(&mut mem);
            // Interleaved rounds, best of each: qemu's translation warm-up and host noise
            // would otherwise favour whichever mode runs last.
            let mut best = vec![f64::MAX; codes.len()];
            for _ in 0..11 {
                for (k, (_, _, c)) in codes.iter().enumerate() {
                    assert_eq!(c.run(&mut mem), want);
                    let runs = 300;
                    let t = Instant::now();
                    for _ in 0..runs {
                        std::hint::black_box(c.run(&mut mem));
                    }
                    best[k] = best[k].min(t.elapsed().as_secs_f64() / runs as f64);
                }
            }
            let n = hot.len();
            for (k, (mode, flags, c)) in codes.iter().enumerate() {
                let extra = if *flags & PJ_COMPILE_SANDBOX != 0 {
                    cold
                } else {
                    0
                };
                let per_iter = c.inline_insns(hot.clone()) + extra;
                println!(
                    "  {mode:<15} {:>9.2} us/run  {:>5.2}x trusted  hot loop: {per_iter:>3} arm64 insns for {n} eBPF insns ({:.2} per eBPF insn)",
                    best[k] * 1e6,
                    best[k] / best[0],
                    per_iter as f64 / n as f64
                );
            }
        }
    }
}

fn main() {
    #[cfg(target_arch = "aarch64")]
    bench::main();
    #[cfg(not(target_arch = "aarch64"))]
    eprintln!("sandbox_bench runs arm64 code: run it for aarch64-unknown-linux-gnu (qemu)");
}
