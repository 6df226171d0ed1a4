//! The sandbox contract (docs/ARCHITECTURE.md, "Sandbox contract") on RV64, run under
//! qemu-riscv64: every kind of escape stops with the right kind, pc, address and access;
//! in-bounds accesses work; the budget stops loops at the exact pc with the budget left as
//! the contract says; unknown `callx` ids stop in every mode; registers and the stack block
//! start at zero; and the bpf_conformance suite passes sandboxed, with the budget and with
//! blinded constants, on every feature set.
//!
//! Until the runtime compiles sandboxed code itself, a test-local backend wrapper forces the
//! compile flags, and a local executor calls the entry with its own `PjExecEnv` (third
//! argument) and reads the stop fields.
#![cfg(target_arch = "riscv64")]

mod common;
use common::*;
use packjit::{LoadOptions, Program, Runtime};
use packjit_plugin_api::abi::{
    PjExecEnv, PjMemRegion, PJ_ACCESS_WRITE, PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_BUDGET,
    PJ_COMPILE_SANDBOX, PJ_REGION_WRITABLE, PJ_STOP_BUDGET, PJ_STOP_NONE, PJ_STOP_OUT_OF_BOUNDS,
    PJ_STOP_UNKNOWN_CALLX,
};
use packjit_plugin_api::{
    Arch, CodeArena, CompileError, CompileRequest, Compiled, JitBackend, PjHelperFn,
};
use packjit_rv64::{Rv64Backend, FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};
use std::sync::{Arc, OnceLock};

const FEATURE_SETS: [u64; 4] = [
    0,
    FEATURE_C,
    FEATURE_ZBB | FEATURE_ZBA,
    FEATURE_C | FEATURE_ZBB | FEATURE_ZBA,
];
const SANDBOX: u32 = PJ_COMPILE_SANDBOX;
const ALL_MODES: u32 = PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET | PJ_COMPILE_BLIND_CONSTANTS;

/// The rv64 backend with the compile flags (and blinding key) forced.
struct Forced {
    flags: u32,
    key: u64,
}

impl JitBackend for Forced {
    fn arch(&self) -> Arch {
        Arch::Riscv64
    }
    fn name(&self) -> &str {
        "packjit-rv64 (forced flags)"
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn supported_features(&self) -> u64 {
        Rv64Backend::new().supported_features()
    }
    fn detect_features(&self) -> u64 {
        Rv64Backend::new().detect_features()
    }
    fn compile(
        &self,
        req: &CompileRequest<'_>,
        arena: &dyn CodeArena,
    ) -> Result<Compiled, CompileError> {
        let req = CompileRequest {
            flags: self.flags,
            blind_key: self.key,
            ..*req
        };
        Rv64Backend::new().compile(&req, arena)
    }
}

extern "C" fn identity(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}
/// Leaves junk in the argument registers it may clobber (a helper is free to).
extern "C" fn plus_one(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a.wrapping_add(1)
}
const HELPERS: [(u32, &str, PjHelperFn); 2] = [(5, "identity", identity), (6, "plus1", plus_one)];

/// One runtime per flag combination (flags 0..=7).
fn runtime(flags: u32) -> &'static Runtime {
    static RTS: [OnceLock<Runtime>; 8] = [const { OnceLock::new() }; 8];
    RTS[flags as usize].get_or_init(|| {
        let rt = Runtime::new().expect("runtime");
        rt.add_backend(Arc::new(Forced {
            flags,
            key: 0x0123_4567_89ab_cdef ^ flags as u64,
        }))
        .expect("backend");
        for (id, name, f) in HELPERS {
            rt.register_helper(id, name, f).expect("helper");
        }
        rt
    })
}

fn load(code: &[u8], flags: u32, features: u64) -> Program {
    let opts = LoadOptions {
        arch: Some(Arch::Riscv64),
        features: Some(features),
        ..LoadOptions::default()
    };
    runtime(flags)
        .load(code, &opts)
        .unwrap_or_else(|e| panic!("flags {flags:#x} features {features:#x}: {e}"))
}

/// What a run left behind.
#[derive(Debug)]
struct Run {
    r0: u64,
    env: PjExecEnv,
}

impl Run {
    /// Asserts a stop of `kind` at `pc`; returns (addr, access).
    fn stopped(&self, kind: u32, pc: u64) -> (u64, u32) {
        assert_eq!(
            (self.env.stop_kind, self.env.stop_pc),
            (kind, pc),
            "stop kind and pc: {self:x?}"
        );
        (self.env.stop_addr, self.env.stop_access)
    }

    fn finished(&self) -> u64 {
        assert_eq!(
            self.env.stop_kind, PJ_STOP_NONE,
            "unexpected stop: {self:x?}"
        );
        self.r0
    }
}

/// Calls the entry with a fresh env: `mem` as the context, `regions`, `budget`.
fn exec(p: &Program, mem: &mut [u8], regions: &[PjMemRegion], budget: u64) -> Run {
    let f = p.entry().expect("native code");
    let ctx = mem.as_mut_ptr();
    let mut env = PjExecEnv {
        regions: regions.as_ptr() as u64,
        region_count: regions.len() as u64,
        ctx_start: ctx as u64,
        ctx_end: ctx as u64 + mem.len() as u64,
        ctx_len: mem.len() as u64,
        budget,
        ..PjExecEnv::default()
    };
    // SAFETY: `p` is alive (its code stays mapped), the entry has the PjProgramEntry
    // signature, the context and regions are live memory of the stated lengths, and the code
    // is sandboxed (or, for the trusted cases, touches only the context).
    let r0 = unsafe { f(ctx, mem.len() as u64, &mut env) };
    Run { r0, env }
}

/// Runs `code` with every feature set under `flags`, checking each run with `check`.
fn each(code: &[u8], flags: u32, mut check: impl FnMut(u64, &mut Vec<u8>, Run)) {
    each_mem(code, flags, &[0u8; 16], &[], u64::MAX, &mut check);
}

fn each_mem(
    code: &[u8],
    flags: u32,
    mem: &[u8],
    regions: &[PjMemRegion],
    budget: u64,
    check: &mut dyn FnMut(u64, &mut Vec<u8>, Run),
) {
    for flags in [flags, flags | PJ_COMPILE_BLIND_CONSTANTS] {
        for f in FEATURE_SETS {
            let p = load(code, flags, f);
            let mut m = mem.to_vec();
            let run = exec(&p, &mut m, regions, budget);
            check(f, &mut m, run);
        }
    }
}

// ---- context --------------------------------------------------------------------------------

#[test]
fn context_reads_and_writes_in_bounds() {
    // r0 = *(u64 *)(r1 + 8); *(u32 *)(r1 + 12) = 0x55; *(u8 *)(r1 + 15) = r0 (its low byte)
    let code = prog(&[
        ins(0x79, 0, 1, 8, 0),
        ins(0x62, 1, 0, 12, 0x55),
        ins(0x73, 1, 0, 15, 0),
        EXIT,
    ]);
    let mem: Vec<u8> = (0..16).collect();
    each_mem(&code, SANDBOX, &mem, &[], u64::MAX, &mut |f, m, run| {
        assert_eq!(run.finished(), 0x0f0e_0d0c_0b0a_0908, "features {f:#x}");
        assert_eq!(&m[8..16], &[8, 9, 10, 11, 0x55, 0, 0, 8]);
    });
}

#[test]
fn context_escapes_stop_with_pc_address_and_access() {
    // (code, pc, offset of the address from ctx, access)
    let cases: Vec<(Vec<u8>, u64, i64, u32)> = vec![
        // Read one byte past the end (8-byte load at 9 ends at 17).
        (prog(&[ins(0x79, 0, 1, 9, 0), EXIT]), 0, 9, 8),
        // Read before the start.
        (
            prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x71, 0, 1, -1, 0), EXIT]),
            1,
            -1,
            1,
        ),
        // A store just past the end.
        (
            prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x72, 1, 0, 16, 7), EXIT]),
            1,
            16,
            1 | PJ_ACCESS_WRITE,
        ),
        // A 2-byte store straddling the end.
        (
            prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x6b, 1, 0, 15, 0), EXIT]),
            1,
            15,
            2 | PJ_ACCESS_WRITE,
        ),
        // Pointer arithmetic is free; the access past the end is not.
        (
            prog(&[
                ins(0xbf, 3, 1, 0, 0),
                ins(0x07, 3, 0, 0, 4096),
                ins(0x07, 3, 0, 0, -4096 + 16),
                ins(0x61, 0, 3, 0, 0),
                EXIT,
            ]),
            3,
            16,
            4,
        ),
    ];
    for (code, pc, off, access) in cases {
        for flags in [SANDBOX, ALL_MODES] {
            for f in FEATURE_SETS {
                let p = load(&code, flags, f);
                let mut m = vec![0xabu8; 16];
                let run = exec(&p, &mut m, &[], u64::MAX);
                let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, pc);
                assert_eq!(
                    addr,
                    (m.as_ptr() as i64 + off) as u64,
                    "flags {flags:#x} features {f:#x}"
                );
                assert_eq!(acc, access);
                assert_eq!(m, vec![0xabu8; 16], "nothing written");
            }
        }
    }
}

#[test]
fn wild_and_null_pointers_stop() {
    let [a, b] = lddw(2, 0x1234_5678_9abc_def0);
    let wild = prog(&[ins(0xb7, 0, 0, 0, 0), a, b, ins(0x79, 0, 2, 0, 0), EXIT]);
    each(&wild, SANDBOX, |_, _, run| {
        let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, 3);
        assert_eq!((addr, acc), (0x1234_5678_9abc_def0, 8));
    });
    // The end of the address space: an 8-byte read at 2^64 - 4 wraps; it must not pass.
    let [a, b] = lddw(2, u64::MAX - 3);
    let wrap = prog(&[ins(0xb7, 0, 0, 0, 0), a, b, ins(0x79, 0, 2, 0, 0), EXIT]);
    each(&wrap, SANDBOX, |_, _, run| {
        assert_eq!(run.stopped(PJ_STOP_OUT_OF_BOUNDS, 3), (u64::MAX - 3, 8));
    });
    let null = prog(&[
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 2, 0, 0, 0),
        ins(0x7b, 2, 0, 0, 0),
        EXIT,
    ]);
    each(&null, SANDBOX, |_, _, run| {
        assert_eq!(
            run.stopped(PJ_STOP_OUT_OF_BOUNDS, 2),
            (0, 8 | PJ_ACCESS_WRITE)
        );
    });
}

// ---- host regions ---------------------------------------------------------------------------

#[test]
fn regions_read_only_and_writable() {
    let ro: Box<[u8; 32]> = Box::new(std::array::from_fn(|i| i as u8));
    let mut rw = vec![0u8; 24];
    let regions = [
        PjMemRegion {
            start: ro.as_ptr() as u64,
            len: 32,
            flags: 0,
        },
        PjMemRegion {
            start: rw.as_mut_ptr() as u64,
            len: 24,
            flags: PJ_REGION_WRITABLE,
        },
    ];
    let [ra, rb] = lddw(2, ro.as_ptr() as u64);
    let [wa, wb] = lddw(3, rw.as_ptr() as u64);
    let body = |tail: &[[u8; 8]]| {
        let mut v = vec![ins(0xb7, 0, 0, 0, 0), ra, rb, wa, wb];
        v.extend_from_slice(tail);
        v.push(EXIT);
        prog(&v)
    };
    // Reads of the read-only region's last 8 bytes and a write to the writable one work.
    let ok = body(&[ins(0x79, 0, 2, 24, 0), ins(0x7b, 3, 0, 16, 0)]);
    each_mem(
        &ok,
        SANDBOX,
        &[0; 16],
        &regions,
        u64::MAX,
        &mut |f, _, run| {
            assert_eq!(
                run.finished(),
                u64::from_le_bytes(std::array::from_fn(|i| 24 + i as u8)),
                "features {f:#x}"
            );
        },
    );
    assert_eq!(rw[16..24], 0x1f1e_1d1c_1b1a_1918u64.to_le_bytes());
    // Read one past the read-only region, write one past the writable one, write to the
    // read-only one: each stops at pc 5 with its address and access.
    let ro_base = ro.as_ptr() as u64;
    let rw_base = rw.as_ptr() as u64;
    let cases = [
        (body(&[ins(0x79, 0, 2, 25, 0)]), ro_base + 25, 8),
        (
            body(&[ins(0x73, 3, 0, 24, 0)]),
            rw_base + 24,
            1 | PJ_ACCESS_WRITE,
        ),
        (body(&[ins(0x62, 2, 0, 0, 1)]), ro_base, 4 | PJ_ACCESS_WRITE),
        // Atomics count as writes, even fetch-only-looking ones.
        (
            body(&[ins(0xdb, 2, 0, 8, 0x01)]),
            ro_base + 8,
            8 | PJ_ACCESS_WRITE,
        ),
    ];
    for (code, addr, access) in cases {
        each_mem(
            &code,
            SANDBOX,
            &[0; 16],
            &regions,
            u64::MAX,
            &mut |_, _, run| {
                assert_eq!(run.stopped(PJ_STOP_OUT_OF_BOUNDS, 5), (addr, access));
            },
        );
    }
    assert_eq!(ro[..], std::array::from_fn::<u8, 32, _>(|i| i as u8)[..]);
}

// ---- stack ----------------------------------------------------------------------------------

#[test]
fn stack_block_bounds_and_pointer_walks() {
    // In bounds through a computed pointer: r2 = r10 - 16; *r2 = 7; r0 = [r10 - 16].
    let ok = prog(&[
        ins(0xbf, 2, 10, 0, 0),
        ins(0x07, 2, 0, 0, -16),
        ins(0x7a, 2, 0, 0, 7),
        ins(0x79, 0, 10, -16, 0),
        EXIT,
    ]);
    each(&ok, SANDBOX, |_, _, run| {
        assert_eq!(run.finished(), 7);
        // The program reaches r10 - 16 only: its block is one 64-byte line
        // (`analysis::frame_reach`).
        assert_eq!(run.env.stack_end - run.env.stack_start, 64);
    });
    // Walked below the block (one frame: 512 bytes).
    let below = prog(&[
        ins(0xb7, 0, 0, 0, 0),
        ins(0xbf, 2, 10, 0, 0),
        ins(0x07, 2, 0, 0, -520),
        ins(0x7a, 2, 0, 0, 1),
        EXIT,
    ]);
    each(&below, SANDBOX, |_, _, run| {
        let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, 3);
        assert_eq!(addr, run.env.stack_end - 520);
        assert_eq!(acc, 8 | PJ_ACCESS_WRITE);
    });
    // Above the block (into the host's frame): [r10 + 0] is not frame-constant, so checked.
    let above = prog(&[
        ins(0xb7, 0, 0, 0, 0),
        ins(0x7a, 10, 0, -8, 1),
        ins(0x79, 0, 10, -4, 0),
        EXIT,
    ]);
    each(&above, SANDBOX, |_, _, run| {
        let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, 2);
        assert_eq!((addr, acc), (run.env.stack_end - 4, 8));
    });
}

#[test]
fn stack_and_registers_start_at_zero() {
    // Dirty the native stack below the caller with a trusted program first, then read back
    // what a sandboxed one finds: zeros in the frame and in r0, r3-r9 (r3 would otherwise be
    // the env pointer).
    let dirty = prog(&[
        ins(0x7a, 10, 0, -8, -1),
        ins(0x7a, 10, 0, -256, -1),
        ins(0x7a, 10, 0, -512, -1),
        ins(0xb7, 0, 0, 0, 0),
        EXIT,
    ]);
    let read = prog(&[
        ins(0x79, 0, 10, -8, 0),
        ins(0x79, 1, 10, -256, 0),
        ins(0x4f, 0, 1, 0, 0),
        ins(0x79, 1, 10, -512, 0),
        ins(0x4f, 0, 1, 0, 0),
        ins(0x4f, 0, 3, 0, 0),
        ins(0x4f, 0, 4, 0, 0),
        ins(0x4f, 0, 5, 0, 0),
        ins(0x4f, 0, 6, 0, 0),
        ins(0x4f, 0, 7, 0, 0),
        ins(0x4f, 0, 8, 0, 0),
        ins(0x4f, 0, 9, 0, 0),
        EXIT,
    ]);
    for f in FEATURE_SETS {
        let d = load(&dirty, 0, f);
        let r = load(&read, SANDBOX, f);
        let mut m = [0u8; 16];
        exec(&d, &mut m, &[], 0).finished();
        assert_eq!(exec(&r, &mut m, &[], 0).finished(), 0, "features {f:#x}");
    }
    // r0, r3-r9 are zero in trusted code too.
    let regs = prog(&[
        ins(0xbf, 0, 3, 0, 0),
        ins(0x4f, 0, 4, 0, 0),
        ins(0x4f, 0, 5, 0, 0),
        ins(0x4f, 0, 6, 0, 0),
        ins(0x4f, 0, 9, 0, 0),
        EXIT,
    ]);
    each(&regs, 0, |f, _, run| {
        assert_eq!(run.r0, 0, "features {f:#x}")
    });
}

#[test]
fn stops_unwind_from_nested_calls() {
    // main -> f -> g; g reads ctx + 100 (ctx is 16 bytes). The stop leaves from depth 3 and
    // the host carries on (its callee-saved registers and sp are intact). f also keeps a
    // pointer into main's frame and writes through it: in bounds, main sees it.
    let code = prog(&[
        ins(0xb7, 6, 0, 0, 66),
        ins(0xbf, 2, 10, 0, 0),
        ins(0x07, 2, 0, 0, -8),
        ins(0x85, 0, 1, 0, 3), // call f (pc 7)
        ins(0x79, 0, 10, -8, 0),
        ins(0x0f, 0, 6, 0, 0),
        EXIT,
        ins(0x7a, 2, 0, 0, 5), // f: *r2 = 5 (main's frame)
        ins(0x55, 1, 0, 1, 0), // if r1 != 0 goto +1
        EXIT,
        ins(0x85, 0, 1, 0, 1), // call g (pc 12)
        EXIT,
        ins(0x79, 0, 1, 100, 0), // g: r0 = [r1 + 100]
        EXIT,
    ]);
    each(&code, SANDBOX | PJ_COMPILE_BUDGET, |f, _, run| {
        let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, 12);
        assert_eq!(acc, 8, "features {f:#x}");
        assert_eq!(addr, run.env.ctx_start + 100);
        assert_eq!(run.env.stack_end - run.env.stack_start, 3 * 512);
        // Two calls charged one each.
        assert_eq!(run.env.budget, u64::MAX - 2);
    });
    // With a null context pointer (r1 = 0) f returns early: r0 = 5 + 66.
    let mut no_ctx = code.clone();
    no_ctx.splice(0..0, prog(&[ins(0xb7, 1, 0, 0, 0)]));
    // (every call/jump offset is relative, so prepending an instruction is harmless)
    each(&no_ctx, SANDBOX, |_, _, run| assert_eq!(run.finished(), 71));
}

// ---- atomics --------------------------------------------------------------------------------

#[test]
fn atomics_in_and_out_of_bounds() {
    let add = |off| {
        prog(&[
            ins(0xb7, 0, 0, 0, 0),
            ins(0xb7, 2, 0, 0, 3),
            ins(0xdb, 1, 2, off, 0x01), // r2 = fetch_add((u64 *)(r1 + off), r2)
            ins(0xbf, 0, 2, 0, 0),
            EXIT,
        ])
    };
    let mut mem = [0u8; 16];
    mem[8] = 40;
    each_mem(&add(8), SANDBOX, &mem, &[], u64::MAX, &mut |_, m, run| {
        assert_eq!(run.finished(), 40);
        assert_eq!(m[8], 43);
    });
    each(&add(12), SANDBOX, |_, m, run| {
        let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, 2);
        assert_eq!((addr - run.env.ctx_start, acc), (12, 8 | PJ_ACCESS_WRITE));
        assert_eq!(m, &vec![0u8; 16]);
    });
    // 32-bit cmpxchg just past the end.
    let cmpxchg = prog(&[
        ins(0xb7, 0, 0, 0, 0),
        ins(0xb7, 2, 0, 0, 1),
        ins(0xc3, 1, 2, 14, 0xf1),
        EXIT,
    ]);
    each(&cmpxchg, SANDBOX, |_, _, run| {
        let (addr, acc) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, 2);
        assert_eq!((addr - run.env.ctx_start, acc), (14, 4 | PJ_ACCESS_WRITE));
    });
}

// ---- budget ---------------------------------------------------------------------------------

#[test]
fn budget_stops_loops_at_the_jump() {
    // pc0 r0 = 0; pc1 r0 += 1; pc2 if r0 < 10 goto pc1 (charge 2 per taken back-edge);
    // pc3 exit. Nine taken back-edges cost 18.
    let code = prog(&[
        ins(0xb7, 0, 0, 0, 0),
        ins(0x07, 0, 0, 0, 1),
        ins(0xa5, 0, 0, -2, 10),
        EXIT,
    ]);
    for flags in [PJ_COMPILE_BUDGET, SANDBOX | PJ_COMPILE_BUDGET] {
        each_mem(&code, flags, &[0; 16], &[], 18, &mut |_, _, run| {
            assert_eq!(run.finished(), 10);
            assert_eq!(run.env.budget, 0);
        });
        // 17: eight back-edges paid (16), the ninth cannot be: stop at pc 2, 1 left.
        each_mem(&code, flags, &[0; 16], &[], 17, &mut |_, _, run| {
            run.stopped(PJ_STOP_BUDGET, 2);
            assert_eq!(run.env.budget, 1);
        });
    }
    // An infinite loop: `ja -1` charges 1 per turn.
    let forever = prog(&[ins(0xb7, 0, 0, 0, 0), ins(0x05, 0, 0, -1, 0), EXIT]);
    each_mem(
        &forever,
        PJ_COMPILE_BUDGET,
        &[0; 16],
        &[],
        1000,
        &mut |_, _, run| {
            run.stopped(PJ_STOP_BUDGET, 1);
            assert_eq!(run.env.budget, 0);
        },
    );
    // A local call charges 1: with budget 0 it stops at the call.
    let call = prog(&[
        ins(0xb7, 0, 0, 0, 0),
        ins(0x85, 0, 1, 0, 1),
        EXIT,
        ins(0xb7, 0, 0, 0, 9),
        EXIT,
    ]);
    each_mem(
        &call,
        PJ_COMPILE_BUDGET,
        &[0; 16],
        &[],
        0,
        &mut |_, _, run| {
            run.stopped(PJ_STOP_BUDGET, 1);
        },
    );
    each_mem(
        &call,
        PJ_COMPILE_BUDGET,
        &[0; 16],
        &[],
        1,
        &mut |_, _, run| {
            assert_eq!(run.finished(), 9);
            assert_eq!(run.env.budget, 0);
        },
    );
}

// ---- callx ----------------------------------------------------------------------------------

#[test]
fn unknown_callx_stops_in_every_mode() {
    // A known id works; an unknown one (from a nested call) stops with the id as address.
    let code = prog(&[
        ins(0xb7, 1, 0, 0, 41),
        ins(0xb7, 2, 0, 0, 6),
        ins(0x8d, 2, 0, 0, 0), // callx r2 (id 6: plus1) -> 42
        ins(0xbf, 6, 0, 0, 0),
        ins(0x85, 0, 1, 0, 2), // call f
        ins(0x0f, 0, 6, 0, 0),
        EXIT,
        ins(0xb7, 3, 0, 0, 99), // f: callx 99
        ins(0x8d, 3, 0, 0, 0),
        EXIT,
    ]);
    for flags in [0, SANDBOX, ALL_MODES] {
        each(&code, flags, |f, _, run| {
            let (id, _) = run.stopped(PJ_STOP_UNKNOWN_CALLX, 8);
            assert_eq!(id, 99, "flags {flags:#x} features {f:#x}");
        });
    }
    let known = prog(&[
        ins(0xb7, 1, 0, 0, 41),
        ins(0xb7, 2, 0, 0, 6),
        ins(0x8d, 2, 0, 0, 0),
        EXIT,
    ]);
    each(&known, SANDBOX, |_, _, run| assert_eq!(run.finished(), 42));
}

#[test]
fn helpers_leave_no_host_values_in_r1_to_r5() {
    // After a helper call r1-r5 are undefined in eBPF: sandboxed code may not read them
    // (refused at load) ...
    let reads = prog(&[
        ins(0xb7, 1, 0, 0, 7),
        ins(0x85, 0, 0, 0, 6),
        ins(0xbf, 0, 1, 0, 0),
        EXIT,
    ]);
    let opts = LoadOptions {
        arch: Some(Arch::Riscv64),
        ..LoadOptions::default()
    };
    let e = runtime(SANDBOX).load(&reads, &opts).unwrap_err();
    assert_eq!(e.pc, Some(2), "{e}");
    assert!(e.message.contains("r1 is read after a call"), "{e}");
    // ... and a helper called next gets zeros, not what the first one left: plus1 leaves 8
    // in a0 (r1), identity returns its r1.
    let code = prog(&[
        ins(0xb7, 1, 0, 0, 7),
        ins(0x85, 0, 0, 0, 6),
        ins(0x85, 0, 0, 0, 5),
        EXIT,
    ]);
    each(&code, SANDBOX, |_, _, run| assert_eq!(run.finished(), 0));
}

// ---- the conformance suite, sandboxed ---------------------------------------------------------

mod suite {
    use super::*;
    use packjit_testkit::conformance::{load_suite, run_cases, suite_dir, Engine, Loaded};

    struct Sandboxed {
        flags: u32,
        features: u64,
    }

    struct Prog(Program);

    impl Loaded for Prog {
        fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
            let run = exec(&self.0, mem, &[], 1 << 40);
            Some(match run.env.stop_kind {
                PJ_STOP_NONE => Ok(run.r0),
                // The suite's convention for an unknown callx id.
                PJ_STOP_UNKNOWN_CALLX => Ok(u64::MAX),
                k => Err(format!("stopped: kind {k} at pc {}", run.env.stop_pc)),
            })
        }
    }

    impl Engine for Sandboxed {
        fn label(&self) -> String {
            format!(
                "riscv64 sandboxed (flags {:#x}, features {:#x})",
                self.flags, self.features
            )
        }
        fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
            let opts = LoadOptions {
                arch: Some(Arch::Riscv64),
                features: Some(self.features),
                ..LoadOptions::default()
            };
            let p = runtime(self.flags)
                .load(code, &opts)
                .map_err(|e| e.to_string())?;
            Ok(Box::new(Prog(p)))
        }
    }

    fn suite(flags: u32) {
        let cases = load_suite(&suite_dir()).expect("conformance suite");
        for features in FEATURE_SETS {
            let s = run_cases(&Sandboxed { flags, features }, &cases, &[]);
            packjit_testkit::report(&s.to_string());
            assert_eq!(s.failed, 0, "{}", s.report());
            assert!(s.passed >= 350, "{}", s.report());
        }
    }

    #[test]
    fn conformance_sandboxed() {
        suite(SANDBOX);
    }

    #[test]
    fn conformance_sandboxed_budget_blinded() {
        suite(ALL_MODES);
    }
}

// ---- through the runtime's public API ---------------------------------------------------------

/// `Runtime::load` compiles RV64 code sandboxed; stops come back as `RunError::Stop`s with
/// kind, pc and access; `LoadOptions::regions` and `budget` reach the code.
#[test]
fn runtime_api_reports_stops() {
    use packjit::{MemRegion, RegionAccess, Stop, StopKind};
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(Rv64Backend::new())).unwrap();
    let table: Box<[u8; 8]> = Box::new(*b"packjit!");
    // SAFETY: `table` outlives every program given the region and is never written.
    let region = unsafe { MemRegion::new(table.as_ptr(), 8, RegionAccess::ReadOnly) };
    let [a, b] = lddw(2, table.as_ptr() as u64);
    // r0 = table[0..8]; *(u8 *)(r1 + off) = 1 (ctx is 4 bytes); loop with the budget.
    let read_then_store =
        |off: i16| prog(&[a, b, ins(0x79, 0, 2, 0, 0), ins(0x72, 1, 0, off, 1), EXIT]);
    for f in FEATURE_SETS {
        for blind_constants in [false, true] {
            let opts = LoadOptions {
                arch: Some(Arch::Riscv64),
                features: Some(f),
                regions: vec![region.clone()],
                blind_constants,
                budget: packjit::Budget::Limit(100),
                ..LoadOptions::default()
            };
            let p = rt.load(&read_then_store(3), &opts).unwrap();
            let mut ctx = [0u8; 4];
            assert_eq!(p.call(&mut ctx).unwrap(), u64::from_le_bytes(*b"packjit!"));
            assert_eq!(ctx, [0, 0, 0, 1]);
            let p = rt.load(&read_then_store(4), &opts).unwrap();
            let e = p.call(&mut ctx).unwrap_err();
            assert_eq!(
                e.stop(),
                Some(Stop::OutOfBounds {
                    pc: 3,
                    addr: ctx.as_ptr() as u64 + 4,
                    size: 1,
                    write: true
                }),
                "{e}"
            );
            // Without the region the read itself stops.
            let no_region = LoadOptions {
                regions: vec![],
                ..opts.clone()
            };
            let e = rt
                .load(&read_then_store(3), &no_region)
                .unwrap()
                .call(&mut ctx)
                .unwrap_err();
            assert_eq!(
                e.stop().map(|s| (s.kind(), s.pc())),
                Some((StopKind::OutOfBounds, 2)),
                "{e}"
            );
            // `ja -1` forever: the per-load budget, then a per-call one.
            let spin = rt
                .load(&prog(&[ins(0x05, 0, 0, -1, 0), EXIT]), &opts)
                .unwrap();
            let e = spin.call(&mut ctx).unwrap_err();
            assert_eq!(e.stop(), Some(Stop::Budget { pc: 0 }), "{e}");
            let e = spin.call_with_budget(&mut ctx, 5).unwrap_err();
            assert_eq!(e.stop().map(|s| s.kind()), Some(StopKind::Budget), "{e}");
        }
    }
}

// ---- range analysis: proofs and check groups -------------------------------------------------

/// Proven accesses (a masked index into the frame) run unchecked, and a group of context
/// accesses off one base stops exactly where the reference does, with the stores before
/// the faulting access done, whichever member is the first out of bounds.
#[test]
fn grouped_and_proven_accesses_match_the_reference() {
    use packjit_testkit::reference::{EvalError, Reference, Stop};
    let seed = packjit_testkit::env_u64("PACKJIT_GROUP_SEED").unwrap_or(0x9e0u64);
    let count = packjit_testkit::env_u64("PACKJIT_GROUP_COUNT").unwrap_or(300);
    eprintln!("group differential: seeds {seed:#x}..{:#x}", seed + count);
    let (mut grouped, mut grouped_stops, mut proven) = (0u32, 0u32, 0u32);
    // Programs whose loop re-enters a group past its check.
    let mut reentered = 0u32;
    // Programs with a group reaching below its base (`ranges::GROUP_BELOW`).
    let mut below = 0u32;
    // Programs with a group a jump may leave early (`ranges::exits_early`).
    let mut early = 0u32;
    // Programs with a group left open across a proven access off another base, and
    // across one checked on its own (`ranges::keeps_group_open`).
    let (mut spanning, mut spanning_checked) = (0u32, 0u32);
    for s in seed..seed + count {
        let (code, len) = packjit_testkit::gen::group_program(s);
        let plan = packjit_frontend::ranges::plan_accesses(
            &packjit_frontend::decode(&code, &[]).unwrap(),
            true,
        );
        grouped += !plan.groups.is_empty() as u32;
        proven += plan
            .checks
            .contains(&packjit_frontend::ranges::AccessCheck::None) as u32;
        reentered += !plan.reentries.is_empty() as u32;
        below += plan.groups.iter().any(|g| g.lo < 0) as u32;
        let decoded = packjit_frontend::decode(&code, &[]).unwrap();
        early +=
            (plan.groups.iter()).any(|g| packjit_frontend::ranges::exits_early(&decoded, g)) as u32;
        let (across_proven, across_checked) = packjit_testkit::gen::group_spans(&plan);
        spanning += across_proven as u32;
        spanning_checked += across_checked as u32;
        let init: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        let mut want_mem = init.clone();
        let want_base = want_mem.as_ptr() as u64;
        let want = Reference::new().run(&code, &mut want_mem);
        grouped_stops += (!plan.groups.is_empty() && want.is_err()) as u32;
        each_mem(&code, SANDBOX, &init, &[], u64::MAX, &mut |f, m, run| {
            let base = m.as_ptr() as u64;
            match &want {
                Ok(w) => assert_eq!(run.finished(), w.r0, "seed {s:#x} features {f:#x}"),
                Err(EvalError::Stop(Stop::OutOfBounds {
                    pc,
                    addr,
                    size,
                    write,
                })) => {
                    let (jaddr, access) = run.stopped(PJ_STOP_OUT_OF_BOUNDS, *pc as u64);
                    assert_eq!(
                        addr.wrapping_sub(want_base),
                        jaddr.wrapping_sub(base),
                        "seed {s:#x} features {f:#x}"
                    );
                    assert_eq!(
                        *size | if *write { PJ_ACCESS_WRITE } else { 0 },
                        access,
                        "seed {s:#x}"
                    );
                }
                Err(e) => panic!("seed {s:#x}: reference {e}"),
            }
            assert_eq!(m, &want_mem, "context differs: seed {s:#x} features {f:#x}");
        });
    }
    eprintln!("  {grouped} programs with check groups ({grouped_stops} of them stop, {reentered} re-enter one in a loop, {below} reach below their base, {early} may be left early, {spanning} stay open across a proven access, {spanning_checked} across a checked one), {proven} with proven accesses");
    // The generator must exercise what it is for.
    assert!(
        grouped > count as u32 / 3
            && reentered > count as u32 / 10
            && below > count as u32 / 20
            && early > count as u32 / 20
            && spanning > count as u32 / 20
            && spanning_checked > count as u32 / 20
            && grouped_stops > 10
            && proven > 10
    );
}

/// A check group far into the context (its end beyond SLTIU's 12-bit immediate): in bounds it
/// runs; cut short, it stops at the first faulting member, with the store before it done.
#[test]
fn far_check_groups_stop_exactly() {
    // r6 = r1 + 2040 ; *(u8 *)(r6 + 0) = 7 ; r0 = *(u64 *)(r6 + 8) ; r2 = *(u8 *)(r6 + 40) ;
    // r0 += r2 ; exit
    let code = prog(&[
        ins(0xbf, 6, 1, 0, 0),
        ins(0x07, 6, 0, 0, 2040),
        ins(0x72, 6, 0, 0, 7),
        ins(0x79, 0, 6, 8, 0),
        ins(0x71, 2, 6, 40, 0),
        ins(0x0f, 0, 2, 0, 0),
        EXIT,
    ]);
    each_mem(
        &code,
        SANDBOX,
        &[1u8; 2081],
        &[],
        u64::MAX,
        &mut |f, m, run| {
            assert_eq!(run.finished(), 0x0101_0101_0101_0101 + 1, "features {f:#x}");
            assert_eq!(m[2040], 7);
        },
    );
    each_mem(
        &code,
        SANDBOX,
        &[1u8; 2080],
        &[],
        u64::MAX,
        &mut |f, m, run| {
            let base = m.as_ptr() as u64;
            assert_eq!(
                run.stopped(PJ_STOP_OUT_OF_BOUNDS, 4),
                (base + 2080, 1),
                "features {f:#x}"
            );
            assert_eq!(m[2040], 7, "the store before the faulting load ran");
        },
    );
    each_mem(
        &code,
        SANDBOX,
        &[1u8; 2050],
        &[],
        u64::MAX,
        &mut |f, m, run| {
            let base = m.as_ptr() as u64;
            assert_eq!(
                run.stopped(PJ_STOP_OUT_OF_BOUNDS, 3),
                (base + 2048, 8),
                "features {f:#x}"
            );
        },
    );
}
