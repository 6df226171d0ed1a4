//! Sandboxed vs trusted arm64 code, side by side in one process (runs under qemu-aarch64):
//!
//! ```text
//! source scripts/env.sh
//! packjit_cross_cargo aarch64-unknown-linux-gnu run --release -p packjit-arm64 --example arm64_sandbox_bench
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
    use packjit_plugin_api::CompileRequest;
    use std::time::Instant;

    extern "C" {
        fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
    }

    struct Code {
        map: *mut libc::c_void,
        len: usize,
        /// Byte offset of each eBPF instruction's inline code, and the end of the code.
        offsets: Vec<usize>,
        /// Where back-edges land when not at their target's code (see `Emitted::landings`).
        landings: Vec<(usize, usize)>,
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
                let mut offsets: Vec<usize> =
                    out.inst_offsets.iter().map(|&o| o as usize).collect();
                offsets.push(out.bytes.len());
                Code {
                    map,
                    len,
                    offsets,
                    landings: out.landings,
                }
            }
        }

        /// Inline arm64 instructions of eBPF instructions `range` (indices): what one pass
        /// over a loop body executes on its hot path.
        fn inline_insns(&self, range: std::ops::Range<usize>) -> usize {
            let from = packjit_testkit::bench::loop_landing(
                range.start,
                self.offsets[range.start],
                &self.landings,
            );
            (self.offsets[range.end] - from) / 4
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

    pub fn main() {
        let mut mem: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let modes = packjit_testkit::bench::sandbox_modes();
        for packjit_testkit::bench::SandboxProgram { name, code, hot } in
            packjit_testkit::bench::sandbox_programs()
        {
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
            for (k, (mode, _, c)) in codes.iter().enumerate() {
                let per_iter = c.inline_insns(hot.clone());
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
    eprintln!("arm64_sandbox_bench runs arm64 code: run it for aarch64-unknown-linux-gnu (qemu)");
}
