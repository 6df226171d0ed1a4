//! The fuzz entry shared by the cargo-fuzz target (`fuzz/fuzz_targets/compile.rs`) and the
//! stable test that runs it over random and mutated inputs (`tests/fuzz_stable.rs`).
//!
//! [`compile_both`] feeds arbitrary bytes to the verifier and to both backends, compiling
//! into a [`VecArena`] (plain heap memory: nothing is executed, so no mapping is needed).
//! The properties: no panic, no hang, every rejection is a clean [`CompileError`], and the
//! verifier and the backends agree on what is valid. [`run_sandboxed`] then executes the
//! accepted programs natively on x86-64 hosts, sandboxed and budgeted.

use packjit_plugin_api::{
    CodeArena, CompileError, CompileRequest, ErrorKind, HelperEntry, JitBackend, Region,
};
use std::cell::RefCell;

/// A code arena over heap buffers, for compiling without executing.
#[derive(Default)]
pub struct VecArena {
    regions: RefCell<Vec<Option<Vec<u8>>>>,
}

/// A fake, page-aligned address space so backends see plausible exec addresses.
const FAKE_BASE: u64 = 0x7f00_0000_0000;
/// 64 MiB apart: a sandboxed 1 M-instruction program takes some 21 MB.
const FAKE_STRIDE: u64 = 1 << 26;

impl VecArena {
    /// Bytes written to region `r`, if it is live.
    pub fn bytes(&self, r: &Region) -> Option<Vec<u8>> {
        self.regions
            .borrow()
            .get(r.cookie as usize)
            .and_then(|b| b.clone())
    }
}

impl CodeArena for VecArena {
    fn alloc(&self, size: usize) -> Result<Region, CompileError> {
        if size as u64 >= FAKE_STRIDE {
            return Err(CompileError::new(
                ErrorKind::Arena,
                format!("{size} bytes is too large for the test arena"),
            ));
        }
        let mut regs = self.regions.borrow_mut();
        let cookie = regs.len() as u64;
        regs.push(Some(vec![0; size]));
        Ok(Region {
            exec_addr: FAKE_BASE + cookie * FAKE_STRIDE,
            size: size as u64,
            cookie,
        })
    }

    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError> {
        let mut regs = self.regions.borrow_mut();
        let buf = regs
            .get_mut(region.cookie as usize)
            .and_then(|b| b.as_mut())
            .ok_or_else(|| {
                CompileError::new(ErrorKind::Arena, "write to a freed or unknown region")
            })?;
        let end = offset
            .checked_add(bytes.len())
            .filter(|&e| e <= buf.len())
            .ok_or_else(|| {
                CompileError::new(
                    ErrorKind::Arena,
                    format!(
                        "write of {} bytes at {offset} overflows the region",
                        bytes.len()
                    ),
                )
            })?;
        buf[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    fn free(&self, region: &Region) {
        if let Some(b) = self.regions.borrow_mut().get_mut(region.cookie as usize) {
            *b = None;
        }
    }
}

extern "C" fn fuzz_helper(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    a ^ b
}

/// The helper table fuzzed programs compile against: ids 1, 2 and 5.
pub fn fuzz_helpers() -> Vec<HelperEntry> {
    [1u32, 2, 5]
        .iter()
        .map(|&id| HelperEntry {
            id,
            inline_kind: 0,
            addr: fuzz_helper as crate::reference::HelperFn as usize as u64,
        })
        .collect()
}

/// Verifies `data` and compiles it with every backend (arm64, RV64, x86-64), each with no features and with all
/// of them. Panics (the fuzzing failure signal) when a backend panics (caught by the caller's
/// harness), accepts what the verifier rejects, rejects what it accepts for a reason other
/// than an encoding limit, or reports a malformed result.
pub fn compile_both(data: &[u8]) {
    let helpers = fuzz_helpers();
    let verdict = packjit_frontend::decode(data, &helpers);
    let backends: [(&dyn JitBackend, u64); 3] = [
        (
            &packjit_arm64::Arm64Backend::new(),
            packjit_arm64::FEATURE_LSE,
        ),
        (
            &packjit_rv64::Rv64Backend::new(),
            packjit_rv64::FEATURE_ZBB | packjit_rv64::FEATURE_ZBA | packjit_rv64::FEATURE_C,
        ),
        (
            &packjit_x86_64::X86Backend::new(),
            packjit_x86_64::SUPPORTED_FEATURES,
        ),
    ];
    for (b, all) in backends {
        for features in [0, all] {
            let arena = VecArena::default();
            let req = CompileRequest {
                code: data,
                helpers: &helpers,
                features,
                flags: 0,
                blind_key: 0,
            };
            match (b.compile(&req, &arena), &verdict) {
                (Ok(c), Ok(_)) => {
                    let bytes = arena.bytes(&c.region).expect("compiled region is live");
                    assert!(
                        c.code_size > 0 && c.code_size <= bytes.len(),
                        "{}: bad code size {}",
                        b.name(),
                        c.code_size
                    );
                    assert!(
                        c.entry >= c.region.exec_addr
                            && c.entry < c.region.exec_addr + c.region.size,
                        "{}: entry outside its region",
                        b.name()
                    );
                }
                (Ok(_), Err(e)) => {
                    panic!("{} accepted a program the verifier rejects ({e})", b.name())
                }
                (Err(e), Ok(_)) => {
                    // Valid bytecode may still exceed an encoding limit (e.g. a branch range);
                    // anything else is a backend bug.
                    assert!(
                        matches!(
                            e.kind,
                            ErrorKind::Encoding | ErrorKind::Arena | ErrorKind::Unsupported
                        ),
                        "{} rejected a verified program: {e}",
                        b.name()
                    );
                }
                (Err(e), Err(v)) => {
                    assert_ne!(
                        e.kind,
                        ErrorKind::Panic,
                        "{} panicked on invalid input ({v})",
                        b.name()
                    );
                }
            }
        }
    }
}

/// Mutates `input` in place with a few random byte/slot edits (for the stable fuzz test).
pub fn mutate(rng: &mut crate::gen::Rng, input: &mut Vec<u8>) {
    let n = 1 + rng.below(4);
    for _ in 0..n {
        match rng.below(6) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len() as u64) as usize;
                input[i] = rng.next_u64() as u8;
            }
            1 if !input.is_empty() => {
                let i = rng.below(input.len() as u64) as usize;
                input[i] ^= 1 << rng.below(8);
            }
            2 if input.len() >= 8 => {
                // Swap in a random opcode byte at a slot start: reaches every decoder arm.
                let s = rng.below(input.len() as u64 / 8) as usize;
                input[8 * s] = rng.next_u64() as u8;
            }
            3 if input.len() >= 16 => {
                let s = rng.below(input.len() as u64 / 8) as usize * 8;
                input.drain(s..s + 8);
            }
            4 => {
                let b = rng.next_u64().to_le_bytes();
                let s = rng.below(input.len() as u64 / 8 + 1) as usize * 8;
                input.splice(s.min(input.len())..s.min(input.len()), b);
            }
            _ => {
                // Off-by-one length: misaligned programs must be rejected cleanly.
                if rng.chance(1, 2) {
                    input.push(rng.next_u64() as u8);
                } else {
                    input.pop();
                }
            }
        }
    }
}

/// Context bytes a fuzzed program runs on in [`run_sandboxed`], and the canary bytes on each
/// side of it that must survive the run.
const RUN_CTX: usize = 64;
const CANARY: usize = 64;

/// On an x86-64 host, also *executes* the input: compiled sandboxed and budgeted by the
/// x86-64 backend into a real executable arena, run natively on a 64-byte context with
/// 100,000 instructions of budget. The properties: the run returns (no signal, no hang), a
/// stop names a kind the ABI defines and a pc inside the program, and the canary bytes around
/// the context are untouched (no write escaped the sandbox). Returns the run's stop kind
/// (`PJ_STOP_NONE` for a normal return), or `None` when nothing ran (rejected input, or a
/// host other than x86-64).
pub fn run_sandboxed(data: &[u8]) -> Option<u32> {
    if !cfg!(target_arch = "x86_64") {
        return None; // the code could not run here
    }
    {
        use packjit_plugin_api::abi::{
            PjExecEnv, PJ_COMPILE_BUDGET, PJ_COMPILE_SANDBOX, PJ_STOP_UNKNOWN_CALLX,
        };
        use packjit_plugin_api::PjProgramEntry;
        thread_local! {
            static RT: packjit::Runtime = packjit::Runtime::new().expect("runtime");
        }
        let be = packjit_x86_64::X86Backend::new();
        let helpers = fuzz_helpers();
        RT.with(|rt| {
            let arena = rt.arena().expect("x86-64 hosts have an executable arena");
            let req = CompileRequest {
                code: data,
                helpers: &helpers,
                features: be.detect_features(),
                flags: PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET,
                blind_key: 0,
            };
            let Ok(c) = be.compile(&req, arena) else {
                return None; // compile_both judges rejections
            };
            arena.commit();
            let mut buf = [0xa5u8; CANARY + RUN_CTX + CANARY];
            let ctx = buf[CANARY..].as_mut_ptr();
            let mut env = PjExecEnv {
                ctx_start: ctx as u64,
                ctx_end: ctx as u64 + RUN_CTX as u64,
                ctx_len: RUN_CTX as u64,
                budget: 100_000,
                ..PjExecEnv::default()
            };
            // SAFETY: committed x86-64 code of the PjProgramEntry signature on an x86-64
            // host; it was compiled sandboxed and budgeted, so it touches only the context,
            // its own stack block and nothing else, and ends within the budget. `buf` and
            // `env` outlive the call.
            unsafe {
                let entry: PjProgramEntry = std::mem::transmute(c.entry as usize);
                entry(ctx, RUN_CTX as u64, &mut env);
            }
            arena.free_deferred(c.region);
            assert!(
                env.stop_kind <= PJ_STOP_UNKNOWN_CALLX,
                "x86-64: unknown stop kind {}",
                env.stop_kind
            );
            if env.stop_kind != 0 {
                assert!(
                    (env.stop_pc as usize) < data.len() / 8,
                    "x86-64: stop at pc {} outside the program",
                    env.stop_pc
                );
            }
            assert!(
                buf[..CANARY]
                    .iter()
                    .chain(&buf[CANARY + RUN_CTX..])
                    .all(|&b| b == 0xa5),
                "x86-64: a write escaped the context"
            );
            Some(env.stop_kind)
        })
    }
}
