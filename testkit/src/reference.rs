//! Reference semantics: packjit's own RFC 9669 (cpu v4) interpreter ([`packjit_interp`],
//! the runtime's fallback and first tier) in the shape the test kit has always used, and an
//! adaptor over rbpf's interpreter as a second, independent reference.
//!
//! The interpreter implements the JIT backends' sandbox contract: real host addresses (the
//! context where it lies, a zeroed stack block it allocates), every access checked against
//! the context, the stack block and host regions, the budget charged at back-edges and calls,
//! unknown `callx` ids stopping the program. So the reference and sandboxed JIT code agree on
//! results *and* on stops (kind + pc + address).
//!
//! Absolute addresses differ between the two (different buffers), so a program whose result
//! depends on a pointer value (e.g. returns r1) cannot be compared; conformance tests never do
//! that, and the generator in [`crate::gen`] never lets pointers flow into data.

use packjit_frontend::{AluOp, EndKind, Op, Operand, Program, Width};
use packjit_plugin_api::HelperEntry;
use std::fmt;

pub use packjit_interp::{alu, HelperFn, Interpreter, Stop};

/// Default budget of [`Reference`] (charged as the JIT's `PJ_COMPILE_BUDGET` code charges it),
/// so a test program that never exits is reported instead of hanging the oracle.
pub const DEFAULT_BUDGET: u64 = 10_000_000;

/// Why evaluation stopped without a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvalError {
    /// The program did not pass `packjit_frontend::decode`.
    Verify(String),
    /// A sandbox stop: out of bounds, budget, unknown `callx`.
    Stop(Stop),
}

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalError::Verify(m) => write!(f, "rejected: {m}"),
            EvalError::Stop(s) => s.fmt(f),
        }
    }
}

impl std::error::Error for EvalError {}

impl From<Stop> for EvalError {
    fn from(s: Stop) -> Self {
        EvalError::Stop(s)
    }
}

/// The observable result of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Final r0.
    pub r0: u64,
    /// Instructions executed.
    pub steps: u64,
}

/// The reference machine: the interpreter's helpers and a budget.
#[derive(Clone, Debug)]
pub struct Reference {
    /// The interpreter (helpers).
    pub interp: Interpreter,
    /// Budget per run (`None`: unlimited); [`DEFAULT_BUDGET`] by default.
    pub budget: Option<u64>,
}

impl Default for Reference {
    fn default() -> Self {
        Self::new()
    }
}

impl Reference {
    /// A machine with no helpers.
    pub fn new() -> Self {
        Self {
            interp: Interpreter::new(),
            budget: Some(DEFAULT_BUDGET),
        }
    }

    /// Registers (or replaces) helper `id`.
    pub fn with_helper(mut self, id: u32, f: HelperFn) -> Self {
        self.interp.set_helper(id, f);
        self
    }

    /// The helper table in the form `packjit_frontend::decode` takes (addresses are the real
    /// function addresses, so the same table also suits a `CompileRequest`).
    pub fn helper_table(&self) -> Vec<HelperEntry> {
        self.interp.helper_table()
    }

    /// Verifies and runs `code` with `ctx` as the context (r1 = ctx, r2 = its length).
    pub fn run(&self, code: &[u8], ctx: &mut [u8]) -> Result<Outcome, EvalError> {
        let prog = self
            .interp
            .load(code)
            .map_err(|e| EvalError::Verify(e.to_string()))?;
        self.run_program(&prog, ctx)
    }

    /// Runs a decoded program.
    pub fn run_program(&self, prog: &Program, ctx: &mut [u8]) -> Result<Outcome, EvalError> {
        let o = self.interp.run(prog, ctx, self.budget)?;
        Ok(Outcome {
            r0: o.r0,
            steps: o.insns,
        })
    }
}

/// Helper id 5 in the conformance suite: returns its first argument.
pub extern "C" fn helper_identity(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

// ---------------------------------------------------------------------------------------
// rbpf adaptor

/// Why rbpf cannot serve as a reference for a program: the first instruction it does not
/// implement with RFC 9669 semantics.
pub fn rbpf_unsupported(prog: &Program) -> Option<String> {
    for inst in &prog.insts {
        let why = match inst.op {
            Op::MovSx { .. } => "movsx (cpu v4)",
            Op::MovPerCpu { .. } => "packjit's per-CPU mov (internal encoding)",
            Op::Load {
                sign_extend: true, ..
            } => "sign-extending load (cpu v4)",
            Op::Alu {
                op: AluOp::Sdiv | AluOp::Smod,
                ..
            } => "sdiv/smod (rbpf ignores the offset and divides unsigned)",
            // rbpf leaves the upper half of dst alone for mod32 by zero; RFC 9669 zero-extends.
            Op::Alu {
                width: Width::W32,
                op: AluOp::Mod,
                ..
            } => "mod32 (rbpf keeps the upper half on x % 0)",
            Op::End {
                kind: EndKind::Swap,
                ..
            } => "bswap (cpu v4)",
            Op::Atomic { .. } => "atomics",
            Op::CallReg { .. } => "callx",
            // rbpf computes neg64 as `-(x as i64)`, which overflows (a panic in debug builds)
            // on i64::MIN.
            Op::Neg {
                width: Width::W64, ..
            } => "neg64 (rbpf overflows on i64::MIN)",
            // rbpf shares one 512-byte stack between frames; packjit gives each frame its own.
            Op::CallLocal { .. } => "local calls (different frame layout)",
            // rbpf compares 64-bit jumps against the *zero*-extended imm for the unsigned and
            // equality conditions; RFC 9669 sign-extends. Only non-negative imms agree.
            Op::Jcond {
                width: Width::W64,
                src: Operand::Imm(v),
                cond,
                ..
            } if v < 0
                && !matches!(
                    cond,
                    packjit_frontend::Cond::Set
                        | packjit_frontend::Cond::Sgt
                        | packjit_frontend::Cond::Sge
                        | packjit_frontend::Cond::Slt
                        | packjit_frontend::Cond::Sle
                ) =>
            {
                "64-bit unsigned/equality jump with a negative imm (rbpf zero-extends it)"
            }
            _ => continue,
        };
        return Some(format!("pc {}: {why}", inst.pc));
    }
    // ja32 decodes to the same Op as ja; look at the raw opcode.
    None
}

/// A helper as rbpf registers it.
pub type RbpfHelper = fn(u64, u64, u64, u64, u64) -> u64;

fn rbpf_no_verify(_prog: &[u8]) -> Result<(), std::io::Error> {
    Ok(())
}

/// Runs `code` in rbpf's interpreter with `ctx` as its memory (r1 = ctx). `helpers` are rbpf
/// helpers by id. Returns `None` when rbpf does not implement the program's instructions with
/// RFC 9669 semantics (see [`rbpf_unsupported`]), else rbpf's result.
///
/// rbpf does not set r2 (the context length): programs must not read r2 before writing it.
pub fn run_rbpf(
    code: &[u8],
    ctx: &mut [u8],
    helpers: &[(u32, RbpfHelper)],
) -> Option<Result<u64, String>> {
    let table: Vec<HelperEntry> = helpers
        .iter()
        .map(|&(id, _)| HelperEntry {
            id,
            inline_kind: 0,
            addr: 1,
        })
        .collect();
    let prog = packjit_frontend::decode(code, &table).ok()?;
    if rbpf_unsupported(&prog).is_some() || code.chunks(8).any(|c| c[0] == 0x06) {
        return None;
    }
    let mut vm = match rbpf::EbpfVmRaw::new(None) {
        Ok(vm) => vm,
        Err(e) => return Some(Err(e.to_string())),
    };
    // packjit_frontend already verified it; rbpf's own verifier rejects valid things (e.g. `ja -1`
    // idioms) that are irrelevant here.
    if let Err(e) = vm.set_verifier(rbpf_no_verify) {
        return Some(Err(e.to_string()));
    }
    if let Err(e) = vm.set_program(code) {
        return Some(Err(e.to_string()));
    }
    for &(id, f) in helpers {
        if let Err(e) = vm.register_helper(id, f) {
            return Some(Err(e.to_string()));
        }
    }
    // A panic inside rbpf is reported as its failure, not propagated.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| vm.execute_program(ctx)));
    Some(match r {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("rbpf panicked".to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asm::assemble;

    fn run(src: &str, ctx: &mut [u8]) -> Result<u64, EvalError> {
        let code = assemble(src).unwrap();
        Reference::new()
            .with_helper(5, helper_identity)
            .run(&code, ctx)
            .map(|o| o.r0)
    }

    #[test]
    fn edge_semantics() {
        let cases: &[(&str, u64)] = &[
            ("mov %r0, 7\ndiv %r0, 0\nexit", 0),
            ("mov %r0, 7\nmod %r0, 0\nexit", 7),
            ("lddw %r0, 0x1ffffffff\nmod32 %r0, 0\nexit", 0xffff_ffff),
            (
                "lddw %r0, 0x8000000000000000\nsdiv %r0, -1\nexit",
                0x8000_0000_0000_0000,
            ),
            ("lddw %r0, 0x8000000000000000\nsmod %r0, -1\nexit", 0),
            ("mov32 %r0, 0x80000000\nsdiv32 %r0, -1\nexit", 0x8000_0000),
            ("mov %r0, -7\nsmod %r0, 2\nexit", (-1i64) as u64),
            ("mov %r0, 1\nlsh %r0, 65\nexit", 2),
            ("mov %r0, 1\nlsh32 %r0, 33\nexit", 2),
            ("mov %r0, -1\nrsh32 %r0, 0\nexit", 0xffff_ffff),
            ("mov32 %r0, -8\narsh32 %r0, 1\nexit", 0xffff_fffc),
            ("mov %r0, -1\nadd32 %r0, 1\nexit", 0),
            ("mov %r0, 1\nneg32 %r0\nexit", 0xffff_ffff),
            ("mov %r1, 0x80\nmovsx832 %r0, %r1\nexit", 0xffff_ff80),
            ("mov %r1, 0x80\nmovsx864 %r0, %r1\nexit", u64::MAX - 0x7f),
            ("lddw %r0, 0x1122334455667788\nbe16 %r0\nexit", 0x8877),
            ("lddw %r0, 0x1122334455667788\nle32 %r0\nexit", 0x55667788),
            (
                "lddw %r0, 0x1122334455667788\nbswap64 %r0\nexit",
                0x8877665544332211,
            ),
            ("mov %r0, -1\njeq %r0, -1, +1\nexit\nmov %r0, 2\nexit", 2),
            (
                "mov32 %r0, -1\njeq %r0, -1, +1\nexit\nmov %r0, 2\nexit",
                0xffff_ffff,
            ),
            (
                "mov32 %r0, -1\njeq32 %r0, -1, +1\nexit\nmov %r0, 2\nexit",
                2,
            ),
            ("mov %r1, 9\ncall 5\nexit", 9),
            ("mov %r1, 9\nmov %r2, 5\ncall %r2\nexit", 9),
        ];
        for (src, want) in cases {
            assert_eq!(run(src, &mut []).unwrap(), *want, "{src}");
        }
        // An unregistered callx id stops the program (kind, pc, id), as the JIT code does.
        assert_eq!(
            run("mov %r2, 77\ncall %r2\nmov %r0, 1\nexit", &mut []).unwrap_err(),
            EvalError::Stop(Stop::UnknownCallx { pc: 1, id: 77 })
        );
    }

    #[test]
    fn atomics_and_frames() {
        let src = "stdw [%r10-8], 10\nmov %r1, 3\nlock fetch add [%r10-8], %r1\nldxdw %r0, [%r10-8]\nlsh %r0, 8\nor %r0, %r1\nexit";
        assert_eq!(run(src, &mut []).unwrap(), (13 << 8) | 10);
        let src = "stw [%r10-4], -1\nmov %r0, -1\nmov %r1, 5\nlock cmpxchg32 [%r10-4], %r1\nldxw %r1, [%r10-4]\nlsh %r0, 8\nor %r0, %r1\nexit";
        assert_eq!(run(src, &mut []).unwrap(), (0xffff_ffff << 8) | 5);
        // Each local call gets a fresh frame, and the caller's frame is reachable by pointer.
        let src = "stdw [%r10-8], 1\nmov %r1, %r10\ncall local f\nldxdw %r0, [%r10-8]\nexit\n\
                   f:\nstdw [%r10-8], 2\nstdw [%r1-8], 3\nexit";
        assert_eq!(run(src, &mut []).unwrap(), 3);
        let mut ctx = [0u8; 4];
        assert!(matches!(
            run("ldxw %r0, [%r1+1]\nexit", &mut ctx),
            Err(EvalError::Stop(Stop::OutOfBounds { pc: 0, size: 4, .. }))
        ));
        assert!(matches!(
            run("ldxb %r0, [%r10]\nexit", &mut ctx),
            Err(EvalError::Stop(Stop::OutOfBounds { pc: 0, .. }))
        ));
        assert!(matches!(
            run("stb [%r10-513], 1\nexit", &mut ctx),
            Err(EvalError::Stop(Stop::OutOfBounds {
                pc: 0,
                write: true,
                ..
            }))
        ));
        assert_eq!(run("mov %r0, %r2\nexit", &mut ctx).unwrap(), 4);
        let r = Reference {
            budget: Some(100),
            ..Reference::new()
        };
        assert_eq!(
            r.run(&assemble("ja -1\nexit").unwrap(), &mut [])
                .unwrap_err(),
            EvalError::Stop(Stop::Budget { pc: 0 })
        );
    }

    #[test]
    fn rbpf_adaptor_agrees_on_basics_and_declines_v4() {
        fn id(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
            a
        }
        let code = assemble("mov %r1, 9\ncall 5\nadd %r0, 1\nexit").unwrap();
        assert_eq!(run_rbpf(&code, &mut [], &[(5, id)]), Some(Ok(10)));
        let code = assemble("mov %r0, 1\nsdiv %r0, 1\nexit").unwrap();
        assert_eq!(run_rbpf(&code, &mut [], &[]), None);
        let code = assemble("mov %r0, 1\nja32 +0\nexit").unwrap();
        assert_eq!(run_rbpf(&code, &mut [], &[]), None);
    }
}
