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
//! `EmitOptions` of `emit_program_for_measurement` (this crate's Rust API only, not reachable
//! from the plugin ABI or the runtime): the first leaves out the Spectre-v1 CMOV (its cost),
//! the second checks every access on its own.

use packjit_frontend::encode_insn as ins;
use packjit_plugin_api::abi::{
    PjExecEnv, PjProgramEntry, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX, PJ_STOP_NONE,
};
use packjit_x86_64::{emit_program_for_measurement, EmitOptions, Options};
use std::time::Instant;

struct Code {
    map: *mut libc::c_void,
    len: usize,
    bytes: Vec<u8>,
    /// Byte offset of each eBPF instruction (index into `Program::insts`).
    offsets: Vec<usize>,
}

impl Code {
    fn new(code: &[u8], flags: u32, opts: EmitOptions) -> Code {
        let out = emit_program_for_measurement(
            code,
            &[],
            &Options {
                flags,
                features: packjit_x86_64::detect_cpu_features(),
                blind_key: 0,
            },
            opts,
        )
        .expect("compile");
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
        let mut offsets = out.inst_offsets.clone();
        offsets.push(out.bytes.len());
        Code {
            map,
            len,
            bytes: out.bytes,
            offsets,
        }
    }

    /// x86-64 instructions inline between eBPF instructions `range` (indices), by objdump.
    fn inline_insns(&self, range: std::ops::Range<usize>) -> Option<usize> {
        let (a, b) = (self.offsets[range.start], self.offsets[range.end]);
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

/// (name, bytecode, hot loop as eBPF instruction indices)
fn programs() -> Vec<(&'static str, Vec<u8>, std::ops::Range<usize>)> {
    let ctx_hash = [
        ins(0xbf, 3, 1, 0, 0),      // r3 = ctx
        ins(0x0f, 2, 1, 0, 0),      // r2 = ctx + len
        ins(0x18, 0, 0, 0, 0x1234), // r0 = 0x1234 (lddw)
        ins(0, 0, 0, 0, 0),
        ins(0x18, 5, 0, 0, 0x1b3), // r5 = FNV prime
        ins(0, 0, 0, 0, 0x100),
        ins(0x79, 4, 3, 0, 0),  // loop: r4 = *(u64 *)r3
        ins(0xaf, 0, 4, 0, 0),  // r0 ^= r4
        ins(0x2f, 0, 5, 0, 0),  // r0 *= r5
        ins(0x07, 3, 0, 0, 8),  // r3 += 8
        ins(0x2d, 2, 3, -5, 0), // if r2 > r3 goto loop
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let compute = [
        ins(0xb7, 0, 0, 0, 1),
        ins(0xb7, 6, 0, 0, 0),
        ins(0x27, 0, 0, 0, 0x41c6_4e6d), // loop: r0 *= a
        ins(0x07, 0, 0, 0, 12345),
        ins(0xbf, 7, 0, 0, 0),
        ins(0x77, 7, 0, 0, 17),
        ins(0xaf, 0, 7, 0, 0),
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -7, 4096),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let fill: Vec<[u8; 8]> = (0..64i16)
        .map(|k| ins(0x7a, 10, 0, -8 * (k + 1), k as i32 * 3 + 1))
        .collect();
    let mut stack_table = fill.clone();
    stack_table.extend([
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 6, 0, 0, 0),
        ins(0xbf, 3, 10, 0, 0), // outer: r3 = r10 - 512
        ins(0x07, 3, 0, 0, -512),
        ins(0x79, 4, 3, 0, 0), // inner: r4 = *(u64 *)r3
        ins(0x0f, 0, 4, 0, 0),
        ins(0x07, 3, 0, 0, 8),
        ins(0x5d, 3, 10, -4, 0), // if r3 != r10 goto inner
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -8, 64),
        ins(0x95, 0, 0, 0, 0),
    ]);
    let mut masked = fill;
    masked.extend([
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 6, 0, 0, 0),
        ins(0xbf, 4, 6, 0, 0), // loop: r4 = ((i << 3) & 0x1f8)
        ins(0x67, 4, 0, 0, 3),
        ins(0x57, 4, 0, 0, 0x1f8),
        ins(0xbf, 3, 10, 0, 0), // r3 = r10 - 512 + r4
        ins(0x07, 3, 0, 0, -512),
        ins(0x0f, 3, 4, 0, 0),
        ins(0x79, 5, 3, 0, 0),
        ins(0x0f, 0, 5, 0, 0),
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -10, 4096),
        ins(0x95, 0, 0, 0, 0),
    ]);
    let header = [
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 6, 0, 0, 0),
        ins(0x69, 2, 1, 12, 0), // loop: five loads at constant offsets from r1
        ins(0x71, 3, 1, 23, 0),
        ins(0x61, 4, 1, 26, 0),
        ins(0x61, 5, 1, 30, 0),
        ins(0x69, 7, 1, 34, 0),
        ins(0x0f, 0, 2, 0, 0),
        ins(0xaf, 0, 3, 0, 0),
        ins(0x0f, 0, 4, 0, 0),
        ins(0xaf, 0, 5, 0, 0),
        ins(0x0f, 0, 7, 0, 0),
        ins(0x07, 6, 0, 0, 1),
        ins(0xa5, 6, 0, -12, 4096),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat();
    vec![
        ("ctx hash (4 KiB, checked loads)", ctx_hash, 4..9),
        ("compute (no memory)", compute, 2..9),
        (
            "stack table (checked stack pointer)",
            stack_table.concat(),
            66..70,
        ),
        (
            "stack table, masked index (proven)",
            masked.concat(),
            66..76,
        ),
        ("header parse (5 ctx loads, 1 group)", header, 2..14),
    ]
}

fn main() {
    let on = EmitOptions::default();
    let modes = [
        ("trusted", 0, on),
        ("sandbox", PJ_COMPILE_SANDBOX, on),
        (
            "sandbox,noclamp",
            PJ_COMPILE_SANDBOX,
            EmitOptions {
                spectre_clamp: false,
                ..on
            },
        ),
        (
            "sandbox,nogroup",
            PJ_COMPILE_SANDBOX,
            EmitOptions {
                group_checks: false,
                ..on
            },
        ),
        ("sandbox+budget", PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET, on),
    ];
    let mut mem: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    for (name, code, hot) in programs() {
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
