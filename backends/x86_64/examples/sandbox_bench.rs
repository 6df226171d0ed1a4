//! Sandboxed vs trusted x86-64 code, side by side in one process (natively):
//!
//! ```text
//! cargo run --release -p packjit-x86-64 --example sandbox_bench
//! ```
//!
//! The same programs as arm64's and rv64's sandbox benches (context hash loop, compute, stack
//! table through a walked pointer and through a masked index, header parsing). For each mode
//! it prints the time per run (best of interleaved rounds), the ratio to trusted, and the
//! x86-64 instructions per eBPF instruction on the hot loop's inline path (counted with
//! `objdump` when it is installed).
//!
//! "sandbox,noclamp" and "sandbox,nogroup" are compiled with the measurement-only
//! `EmitOptions` of `emit_request_with` (this crate's Rust API only, not reachable
//! from the plugin ABI or the runtime): the first leaves out the Spectre-v1 CMOV (its cost),
//! the second checks every access on its own.

use packjit_plugin_api::CompileRequest;
use packjit_x86_64::{emit_request_with, EmitOptions};
use std::time::Instant;

struct Code {
    map: *mut libc::c_void,
    len: usize,
    bytes: Vec<u8>,
    /// Byte offset of each eBPF instruction (index into `Program::insts`).
    offsets: Vec<usize>,
    /// Where back-edges land when not at their target's code (see `Emitted::landings`).
    landings: Vec<(usize, usize)>,
}

impl Code {
    fn new(code: &[u8], flags: u32, opts: EmitOptions) -> Code {
        let req = CompileRequest {
            code,
            helpers: &[],
            features: packjit_x86_64::detect_cpu_features(),
            flags,
            blind_key: 0,
        };
        let out = emit_request_with(&req, opts).expect("compile");
        let len = out.bytes.len().div_ceil(4096) * 4096;
        // SAFETY: a fresh private mapping, written while RW, then made RX (x86 keeps
        // instruction fetch coherent with the stores).
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
            std::ptr::copy_nonoverlapping(out.bytes.as_ptr(), map as *mut u8, out.bytes.len());
            assert_eq!(
                libc::mprotect(map, len, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
            map
        };
        let mut offsets: Vec<usize> = out.inst_offsets.iter().map(|&o| o as usize).collect();
        offsets.push(out.bytes.len());
        Code {
            map,
            len,
            bytes: out.bytes.into_vec(),
            offsets,
            landings: out.landings,
        }
    }

    /// x86-64 instructions inline between eBPF instructions `range` (indices), by objdump.
    fn inline_insns(&self, range: std::ops::Range<usize>) -> Option<usize> {
        let a = packjit_testkit::bench::loop_landing(
            range.start,
            self.offsets[range.start],
            &self.landings,
        );
        let b = self.offsets[range.end];
        let path = std::env::temp_dir().join(format!("pj-sbx-bench-{}.bin", std::process::id()));
        std::fs::write(&path, &self.bytes).ok()?;
        let out = std::process::Command::new("objdump")
            .args([
                "-D",
                "-b",
                "binary",
                "-mi386:x86-64",
                &format!("--start-address={a}"),
                &format!("--stop-address={b}"),
            ])
            .arg(&path)
            .output()
            .ok()?;
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8_lossy(&out.stdout);
        // Instruction lines look like "  1f:\t48 89 c7 \tmov ..."; objdump continues long
        // encodings on lines without a mnemonic.
        Some(
            text.lines()
                .filter(|l| l.split('\t').nth(2).is_some_and(|m| !m.trim().is_empty()))
                .count(),
        )
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

fn main() {
    let modes = packjit_testkit::bench::sandbox_modes();
    let mut mem: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    for packjit_testkit::bench::SandboxProgram { name, code, hot } in
        packjit_testkit::bench::sandbox_programs()
    {
        println!("{name}: {} eBPF slots", code.len() / 8);
        let codes: Vec<(&str, Code)> = modes
            .iter()
            .map(|&(m, f, o)| (m, Code::new(&code, f, o)))
            .collect();
        let want = codes[0].1.run(&mut mem);
        // Interleaved rounds, best of each: warm-up and host noise would otherwise favour
        // whichever mode runs last.
        let mut best = vec![f64::MAX; codes.len()];
        for _ in 0..21 {
            for (k, (_, c)) in codes.iter().enumerate() {
                assert_eq!(c.run(&mut mem), want, "{name}");
                let runs = 1000;
                let t = Instant::now();
                for _ in 0..runs {
                    std::hint::black_box(c.run(&mut mem));
                }
                best[k] = best[k].min(t.elapsed().as_secs_f64() / runs as f64);
            }
        }
        let n = hot.len();
        for (k, (mode, c)) in codes.iter().enumerate() {
            let per = match c.inline_insns(hot.clone()) {
                Some(i) => format!(
                    "{i:>3} x86-64 insns for {n} eBPF insns ({:.2} per eBPF insn)",
                    i as f64 / n as f64
                ),
                None => "(no objdump: instruction count unavailable)".to_string(),
            };
            println!(
                "  {mode:<15} {:>9.3} us/run  {:>5.2}x trusted  hot loop: {per}",
                best[k] * 1e6,
                best[k] / best[0],
            );
        }
    }
}
