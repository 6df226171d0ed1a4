//! The optimizing tier's load combining (`packjit-tier2`'s `fuse`): bytes assembled with
//! loads, shifts and ors become one wide load on x86-64 and aarch64.
//!
//! * Random programs of such chains, as clang writes them and in every other order, little-
//!   and big-endian, 32- and 64-bit, with stores into the bytes, a base overwritten by its
//!   own load, a base moved within a chain, block boundaries and partial values used later: r0 and the context must match
//!   the interpreter, trusted and sandboxed. `PACKJIT_FUSION_COUNT` programs (default 2000,
//!   1000 under qemu) from `PACKJIT_FUSION_SEED` (default 0xf05e0000); the range is printed.
//! * That combining happens: an 8-byte little-endian chain compiles to far less code than
//!   the same chain with a store in the middle (which must keep the bytes apart).

use packjit::{Budget, LoadOptions, Runtime, Tier};
use packjit_testkit::asm::assemble;
use packjit_testkit::gen::{check_optimized_against_reference, Rng};

const CTX_LEN: usize = 64;

fn optimized() -> LoadOptions {
    LoadOptions {
        tier: Tier::Optimized,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    }
}

/// Registers a chain may use for its value and its pieces (r0 is the result, r1 the
/// context, r6 a second base).
const FREE: [u8; 6] = [2, 3, 4, 5, 7, 8];

/// One chain of byte loads assembled into a register, folded into r0.
fn chain(rng: &mut Rng, src: &mut String, r6_off: u64) {
    let n = rng.pick(&[2usize, 2, 3, 4, 4, 8, 8, 8]);
    let w32 = n <= 4 && rng.chance(1, 3);
    let sfx = if w32 { "32" } else { "" };
    let (base, base_off) = if rng.chance(1, 2) {
        (1u8, 0)
    } else {
        (6u8, r6_off as usize)
    };
    let off = rng.below((CTX_LEN - base_off - n + 1) as u64) as usize;
    // pos[j]: the byte of the value that memory byte off + j lands in.
    let mut pos: Vec<usize> = (0..n).collect();
    match rng.below(3) {
        0 => {}
        1 => pos.reverse(),
        _ => shuffle(rng, &mut pos),
    }
    let mut order: Vec<usize> = (0..n).collect();
    if rng.chance(1, 2) {
        shuffle(rng, &mut order);
    }
    let mut regs = FREE;
    shuffle(rng, &mut regs);
    let (mut acc, mut tmp) = (regs[0], regs[1]);
    // How far r6 has been moved within this chain: the pieces after a move address the same
    // bytes at offsets that much lower.
    let mut moved = 0i64;
    for (i, &j) in order.iter().enumerate() {
        let last = i + 1 == n;
        // The last piece may overwrite the base with its own load.
        let dst = if i == 0 {
            acc
        } else if last && base == 6 && rng.chance(1, 4) {
            6
        } else {
            tmp
        };
        let at = (off + j) as i64 - if base == 6 { moved } else { 0 };
        src.push_str(&format!("ldxb %r{dst}, [%r{base}{at:+}]\n"));
        if pos[j] > 0 {
            src.push_str(&format!("lsh{sfx} %r{dst}, {}\n", 8 * pos[j]));
        }
        if i > 0 {
            if rng.chance(1, 2) {
                src.push_str(&format!("or{sfx} %r{acc}, %r{dst}\n"));
            } else {
                src.push_str(&format!("or{sfx} %r{dst}, %r{acc}\n"));
                if dst != 6 {
                    std::mem::swap(&mut acc, &mut tmp);
                } else {
                    src.push_str(&format!("mov %r{acc}, %r6\n"));
                }
            }
        }
        if !last && rng.chance(1, 12) {
            // A store into the chain's bytes: what is loaded after it differs.
            let at = off + rng.below(n as u64) as usize;
            src.push_str(&format!(
                "stb [%r1+{}], {}\n",
                at + if base == 6 { base_off } else { 0 },
                rng.below(256)
            ));
        }
        if !last && rng.chance(1, 16) {
            src.push_str("jeq %r0, 0x12345, +0\n");
        }
        if !last && base == 6 && dst != 6 && rng.chance(1, 8) {
            // The base moves: the same bytes, another base value.
            src.push_str("add %r6, 1\n");
            moved += 1;
        }
    }
    if rng.chance(1, 8) {
        src.push_str(&format!("rsh %r{acc}, 8\n"));
    }
    src.push_str(&format!("mul %r0, 31\nxor %r0, %r{acc}\n"));
    if n > 1 && rng.chance(1, 4) {
        // The last piece register, a partial value, read later.
        src.push_str(&format!("add %r0, %r{tmp}\n"));
    }
    // Restore the second base for the next chain.
    src.push_str(&format!("mov %r6, %r1\nadd %r6, {r6_off}\n"));
}

fn shuffle<T>(rng: &mut Rng, xs: &mut [T]) {
    for i in (1..xs.len()).rev() {
        xs.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

fn program(seed: u64) -> (String, Vec<u8>) {
    let mut rng = Rng::new(seed);
    let r6_off = rng.below(8);
    let mut src = format!("mov %r0, 0\nmov %r6, %r1\nadd %r6, {r6_off}\n");
    for reg in FREE {
        src.push_str(&format!("mov %r{reg}, 0\n"));
    }
    for _ in 0..1 + rng.below(4) {
        chain(&mut rng, &mut src, r6_off);
    }
    src.push_str("exit\n");
    let ctx = (0..CTX_LEN).map(|_| rng.next_u64() as u8).collect();
    (src, ctx)
}

fn random_chains(sandboxed: bool) {
    let rt = Runtime::new().unwrap();
    let emulated = !cfg!(target_arch = "x86_64");
    let count = packjit_testkit::env_u64("PACKJIT_FUSION_COUNT").unwrap_or(if emulated {
        1000
    } else {
        2000
    });
    let base = packjit_testkit::env_u64("PACKJIT_FUSION_SEED").unwrap_or(0xf05e_0000);
    for seed in base..base + count {
        let (src, ctx) = program(seed);
        let code = assemble(&src).unwrap_or_else(|e| panic!("seed {seed:#x}: {e}\n{src}"));
        let what = format!("seed {seed:#x}\n{src}");
        // SAFETY: every access is at a constant offset inside the 64-byte context (`chain`
        // keeps base + offset + size within it), as the reference run shows.
        unsafe { check_optimized_against_reference(&rt, &code, &ctx, sandboxed, &what) };
    }
    packjit_testkit::report(&format!(
        "load combining ({}, sandboxed: {sandboxed}): seeds {base:#x}..{:#x}: {count} programs matched the interpreter",
        std::env::consts::ARCH,
        base + count
    ));
}

#[test]
fn assembled_bytes_keep_their_value_trusted() {
    random_chains(false);
}

#[test]
fn assembled_bytes_keep_their_value_sandboxed() {
    random_chains(true);
}

/// An 8-byte little-endian word from the context, as clang assembles an unaligned one;
/// `interrupt` puts a stack store in the middle, which keeps the bytes apart.
fn le_word(interrupt: bool) -> Vec<u8> {
    let mut src = String::from("ldxb %r0, [%r1+0]\n");
    for j in 1..8 {
        src.push_str(&format!(
            "ldxb %r2, [%r1+{j}]\nlsh %r2, {}\nor %r0, %r2\n",
            8 * j
        ));
        if interrupt && j == 4 {
            src.push_str("stxdw [%r10-8], %r0\n");
        }
    }
    src.push_str("exit\n");
    assemble(&src).unwrap()
}

#[test]
fn an_assembled_word_is_one_load() {
    let rt = Runtime::new().unwrap();
    let ctx: Vec<u8> = (1..=16).collect();
    let mut sizes = Vec::new();
    for interrupt in [false, true] {
        let code = le_word(interrupt);
        // SAFETY: the program reads bytes 0..8 of the 16-byte context and its stack.
        let p = unsafe { rt.load_trusted(&code, &optimized()) }.unwrap();
        let mut c = ctx.clone();
        assert_eq!(p.call(&mut c).unwrap(), 0x0807_0605_0403_0201);
        sizes.push(p.code_size());
    }
    let (fused, apart) = (sizes[0], sizes[1]);
    packjit_testkit::report(&format!(
        "load combining ({}): 8-byte chain {fused} bytes of code, with a store in it {apart}",
        std::env::consts::ARCH
    ));
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        // Eight loads, seven shifts and seven ors take at least 22 instructions; one load
        // and the frame take a handful.
        assert!(
            fused * 2 < apart,
            "the chain was not combined: {fused} bytes against {apart} with the store"
        );
    } else {
        // RISC-V keeps the bytes (an unaligned load may trap to the kernel there).
        assert!(fused * 2 >= apart, "{fused} vs {apart}");
    }
}
