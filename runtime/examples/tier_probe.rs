//! Times one bytecode file (`PEERS_DUMP` output of the peers bench) on the baseline or the
//! optimizing tier, trusted, or on the baseline sandboxed, in its own loop, for `perf stat`
//! or callgrind: `cargo run --release -p packjit --features optimizer --example tier_probe
//! -- prog.bin baseline|optimized|sandboxed [ctx bytes] [runs] [rnd|ctx-file]` (a file's
//! bytes are the context, as they are, e.g. the bench's packet for `parse`).
use packjit::{LoadOptions, Runtime, Tier};
use std::time::Instant;

unsafe extern "C" fn pj_mix(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a.rotate_left(13) ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = std::fs::read(&args[1]).expect("bytecode file");
    let mode = args.get(2).map(String::as_str);
    let tier = match mode {
        Some("optimized") => Tier::Optimized,
        _ => Tier::Baseline,
    };
    let len: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(512);
    let runs: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let rt = Runtime::new().unwrap();
    rt.register_helper(77, "pj_mix", pj_mix).unwrap();
    let opts = LoadOptions {
        tier,
        ..LoadOptions::default()
    };
    let p = if mode == Some("sandboxed") {
        rt.load(&code, &opts).unwrap()
    } else {
        // SAFETY: a probe for the bench's programs, which stay in their context and stack.
        unsafe { rt.load_trusted(&code, &opts) }.unwrap()
    };
    let text = b"the quick brown fox jumps over the lazy dog\n\tand then  it naps\r\n";
    // `rnd` as the fifth argument: the bench's random context instead of text.
    let mut ctx: Vec<u8> = if let Some(file) = args.get(5).filter(|a| *a != "rnd") {
        std::fs::read(file).expect("context file")
    } else if args.get(5).is_some() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    } else {
        text.iter().copied().cycle().take(len).collect()
    };
    let t = Instant::now();
    let mut acc = 0u64;
    for _ in 0..runs {
        acc ^= p.call(&mut ctx).unwrap();
    }
    println!(
        "{}: {:.1} ns per run (r0 xor {acc:#x}), {} bytes of code at {:#x}",
        mode.unwrap_or("baseline"),
        t.elapsed().as_nanos() as f64 / runs as f64,
        p.code_size(),
        p.entry_addr()
    );
}
