//! Hooks: attach programs to many hooks in one batch, then swap new versions in while other
//! threads keep running them. No run waits for a swap and no swap waits for a run; each
//! replaced program is freed once no thread can still be inside it.
//!
//! `cargo run -p packjit --example hooks`

use packjit::{Hook, HookBatch, LoadOptions, Runtime};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const HOOKS: u64 = 16;
const VERSIONS: u64 = 50;

/// `mov r0, value ; exit`.
fn ret(value: u64) -> Vec<u8> {
    let mut code = vec![0xb7, 0, 0, 0];
    code.extend_from_slice(&(value as i32).to_le_bytes());
    code.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    code
}

/// Version `v` of hook `h`'s program returns `v * 1000 + h`.
fn program(v: u64, h: u64) -> Vec<u8> {
    ret(v * 1000 + h)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = Runtime::new()?;
    let hooks: Vec<Hook> = (0..HOOKS).map(|_| Hook::new()).collect();

    // Version 0 on every hook: the batch compiles each program, then commits the code with
    // one arena commit and attaches all of them.
    let mut batch = HookBatch::new();
    for (h, hook) in hooks.iter().enumerate() {
        batch.load_attach(&rt, hook, &program(0, h as u64), &LoadOptions::default())?;
    }
    batch.apply();

    let stop = AtomicBool::new(false);
    let runs = AtomicU64::new(0);
    std::thread::scope(|s| -> Result<(), packjit::Error> {
        // Two threads run every hook in turn, as event sources would.
        for _ in 0..2 {
            s.spawn(|| {
                let mut seen = [0u64; HOOKS as usize];
                while !stop.load(Ordering::Relaxed) {
                    for (h, hook) in hooks.iter().enumerate() {
                        let r0 = hook.run(&mut []).expect("attached").expect("runs");
                        // Always a whole program of this hook, never an older version than
                        // one this thread already ran.
                        assert_eq!(r0 % 1000, h as u64);
                        assert!(r0 / 1000 >= seen[h]);
                        seen[h] = r0 / 1000;
                        runs.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        // Meanwhile: each new version goes onto all hooks in one batch, one grace period for
        // all the programs it replaces.
        for v in 1..=VERSIONS {
            let mut batch = HookBatch::new();
            for (h, hook) in hooks.iter().enumerate() {
                batch.load_attach(&rt, hook, &program(v, h as u64), &LoadOptions::default())?;
            }
            let replaced = batch.apply();
            assert_eq!(replaced, HOOKS as usize);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        stop.store(true, Ordering::Relaxed);
        Ok(())
    })?;

    for (h, hook) in hooks.iter().enumerate() {
        assert_eq!(hook.run(&mut []).unwrap()?, VERSIONS * 1000 + h as u64);
    }
    println!(
        "{} runs on {HOOKS} hooks while {VERSIONS} batches swapped {} programs in",
        runs.load(Ordering::Relaxed),
        HOOKS * VERSIONS,
    );
    Ok(())
}
