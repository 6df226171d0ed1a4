//! Front-end throughput at three program sizes: decode + verify + the shared analyses, in
//! eBPF instructions per second. Compile time must stay linear in program size, so the
//! 1 M figure is printed next to the 1 k one with their ratio.
//!
//! `cargo run --release -p packjit-frontend --example frontend_bench`

use packjit_frontend::{analysis, decode, RawInsn};
use std::time::Instant;

/// A program of about `n` slots in `functions` subprograms: ALU work, loads and stores on the
/// stack, forward and backward conditional jumps, and a local call from each function to the
/// next — the shapes whose analyses could go quadratic.
fn program(n: usize, functions: usize) -> Vec<u8> {
    let per = (n / functions).max(8);
    let mut out = Vec::with_capacity(n * 8);
    let mut push = |opc: u8, dst: u8, src: u8, off: i16, imm: i32| {
        out.extend_from_slice(
            &RawInsn {
                opc,
                dst,
                src,
                off,
                imm,
            }
            .to_bytes(),
        );
    };
    for f in 0..functions {
        let last = f + 1 == functions;
        let body = per - 4;
        for k in 0..body {
            match k % 6 {
                0 => push(0x07, 1, 0, 0, k as i32),       // add r1, k
                1 => push(0x7b, 10, 1, -8, 0),            // stxdw [r10-8], r1
                2 => push(0x79, 2, 10, -8, 0),            // ldxdw r2, [r10-8]
                3 => push(0x0f, 0, 2, 0, 0),              // add r0, r2
                4 => push(0x55, 0, 0, 1, 7),              // jne r0, 7, +1
                _ => push(0xa5, 1, 0, -2, 1_000_000_000), // jlt r1, 1e9, -2 (back-edge)
            }
        }
        if last {
            push(0xb7, 0, 0, 0, 0);
            push(0xb7, 0, 0, 0, 1);
        } else {
            push(0xb7, 1, 0, 0, 1);
            push(0x85, 0, 1, 0, 2); // call the next function (it starts after our exit)
        }
        push(0xb7, 0, 0, 0, 0);
        push(0x95, 0, 0, 0, 0);
    }
    out
}

fn rate(code: &[u8], rounds: usize) -> f64 {
    let slots = code.len() / 8;
    let start = Instant::now();
    for _ in 0..rounds {
        let p = decode(code, &[]).expect("valid program");
        std::hint::black_box(analysis::stack_block_size(&p));
    }
    (slots * rounds) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    println!("front end (decode + verify + analyses), eBPF insns per second:");
    let mut first = None;
    for (n, functions, rounds) in [(1_000, 4, 2_000), (100_000, 8, 20), (1_000_000, 8, 3)] {
        let code = program(n, functions);
        rate(&code, 1); // warm up
        let r = rate(&code, rounds);
        let base = *first.get_or_insert(r);
        println!(
            "  {:>9} insns: {:>7.1} M insns/s ({:.2} of the 1 k figure)",
            code.len() / 8,
            r / 1e6,
            r / base
        );
    }
}
