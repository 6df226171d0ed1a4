//! Reference semantics: a small RFC 9669 (cpu v4) evaluator, and an adaptor over rbpf's
//! interpreter as a second, independent reference.
//!
//! The evaluator runs a verified [`packjit_frontend::Program`] over a *virtual* address space:
//! the context buffer lives at [`CTX_BASE`], and every call frame has its own 512-byte stack
//! at `STACK_BASE + depth * FRAME_STRIDE` (r10 = its top). Every access must fall entirely
//! inside the context or inside a live frame; anything else is an [`EvalError`] — this is a
//! test oracle, so a program the JIT would run off into the weeds is reported, not executed.
//!
//! Because addresses are virtual, a program whose *result* depends on a pointer value (e.g.
//! returns r1) gives different answers here and on the JIT; conformance tests never do that,
//! and the generator in [`crate::gen`] never lets pointers flow into data.

use packjit_frontend::{AluOp, AtomicOp, EndKind, Op, Operand, Program, Size, Width, STACK_SIZE};
use packjit_plugin_api::HelperEntry;
use std::fmt;

/// Virtual address of the context buffer.
pub const CTX_BASE: u64 = 0x0000_1000_0000_0000;
/// Virtual address of the entry frame's stack (lowest byte).
pub const STACK_BASE: u64 = 0x0000_2000_0000_0000;
/// Distance between frames, leaving unmapped gaps so an overflow is caught.
pub const FRAME_STRIDE: u64 = 0x1_0000;
/// Default instruction budget before the evaluator gives up (the suite's loops are short).
pub const DEFAULT_STEP_LIMIT: u64 = 10_000_000;
/// r0 after a `callx` whose register holds no registered helper id (see ARCHITECTURE.md).
pub const CALLX_UNKNOWN: u64 = u64::MAX;

/// A helper callable by the reference: the same `extern "C"` functions the JIT calls.
pub type HelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;

/// Why evaluation stopped without a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvalError {
    /// The program did not pass `packjit_frontend::decode`.
    Verify(String),
    /// A load, store or atomic outside the context and the live frames.
    OutOfBounds {
        pc: usize,
        addr: u64,
        size: u32,
        write: bool,
    },
    /// `call imm` to an id with no helper (cannot happen after verification with the same table).
    UnknownHelper { pc: usize, id: u32 },
    /// Call depth above `packjit_frontend::MAX_CALL_DEPTH` (the verifier prevents this).
    CallDepth { pc: usize },
    /// The step budget ran out.
    StepLimit { steps: u64 },
}

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalError::Verify(m) => write!(f, "rejected: {m}"),
            EvalError::OutOfBounds {
                pc,
                addr,
                size,
                write,
            } => write!(
                f,
                "pc {pc}: out-of-bounds {} of {size} bytes at {addr:#x}",
                if *write { "store" } else { "load" }
            ),
            EvalError::UnknownHelper { pc, id } => write!(f, "pc {pc}: unknown helper {id}"),
            EvalError::CallDepth { pc } => write!(f, "pc {pc}: call depth exceeded"),
            EvalError::StepLimit { steps } => write!(f, "no exit after {steps} instructions"),
        }
    }
}

impl std::error::Error for EvalError {}

/// The observable result of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Final r0.
    pub r0: u64,
    /// Instructions executed.
    pub steps: u64,
}

/// The reference machine: helpers by id and a step budget.
#[derive(Clone)]
pub struct Reference {
    helpers: Vec<(u32, HelperFn)>,
    /// Instruction budget.
    pub step_limit: u64,
}

impl Default for Reference {
    fn default() -> Self {
        Self::new()
    }
}

struct Frame {
    ret: usize,
    saved: [u64; 4],
    r10: u64,
}

impl Reference {
    /// A machine with no helpers.
    pub fn new() -> Self {
        Self {
            helpers: Vec::new(),
            step_limit: DEFAULT_STEP_LIMIT,
        }
    }

    /// Registers (or replaces) helper `id`.
    pub fn with_helper(mut self, id: u32, f: HelperFn) -> Self {
        self.helpers.retain(|(i, _)| *i != id);
        self.helpers.push((id, f));
        self
    }

    /// The helper table in the form `packjit_frontend::decode` takes (addresses are the real
    /// function addresses, so the same table also suits a `CompileRequest`).
    pub fn helper_table(&self) -> Vec<HelperEntry> {
        self.helpers
            .iter()
            .map(|&(id, f)| HelperEntry {
                id,
                reserved: 0,
                addr: f as usize as u64,
            })
            .collect()
    }

    fn helper(&self, id: u64) -> Option<HelperFn> {
        let id = u32::try_from(id).ok()?;
        self.helpers.iter().find(|(i, _)| *i == id).map(|&(_, f)| f)
    }

    /// Verifies and runs `code` with `ctx` as the context (r1 = ctx, r2 = its length).
    pub fn run(&self, code: &[u8], ctx: &mut [u8]) -> Result<Outcome, EvalError> {
        let prog = packjit_frontend::decode(code, &self.helper_table())
            .map_err(|e| EvalError::Verify(e.to_string()))?;
        self.run_program(&prog, ctx)
    }

    /// Runs a decoded program. Stack contents are discarded; use [`Reference::run_with_stack`]
    /// to observe the entry frame.
    pub fn run_program(&self, prog: &Program, ctx: &mut [u8]) -> Result<Outcome, EvalError> {
        let mut stack = vec![0u8; STACK_SIZE];
        self.run_with_stack(prog, ctx, &mut stack)
    }

    /// Runs a decoded program; `entry_stack` (512 bytes) is the entry frame, so its final
    /// contents can be compared. Deeper frames start zeroed.
    pub fn run_with_stack(
        &self,
        prog: &Program,
        ctx: &mut [u8],
        entry_stack: &mut [u8],
    ) -> Result<Outcome, EvalError> {
        assert_eq!(
            entry_stack.len(),
            STACK_SIZE,
            "entry stack must be STACK_SIZE bytes"
        );
        let mut frames: Vec<Frame> = Vec::new();
        let mut stacks: Vec<Vec<u8>> = Vec::new(); // frames 1.. (entry frame is entry_stack)
        let mut reg = [0u64; 11];
        reg[1] = CTX_BASE;
        reg[2] = ctx.len() as u64;
        reg[10] = STACK_BASE + STACK_SIZE as u64;
        let mut i = 0usize; // instruction index
        let mut steps = 0u64;
        loop {
            if steps >= self.step_limit {
                return Err(EvalError::StepLimit { steps });
            }
            steps += 1;
            let inst = prog.insts[i];
            let pc = inst.pc;
            let mut next = i + 1;
            match inst.op {
                Op::Alu {
                    width,
                    op,
                    dst,
                    src,
                } => {
                    let s = match src {
                        Operand::Reg(r) => reg[r as usize],
                        Operand::Imm(v) => v as i64 as u64,
                    };
                    reg[dst as usize] = alu(width, op, reg[dst as usize], s);
                }
                Op::MovSx {
                    width,
                    dst,
                    src,
                    bits,
                } => {
                    let v = sign_extend(reg[src as usize], bits);
                    reg[dst as usize] = match width {
                        Width::W64 => v,
                        Width::W32 => v as u32 as u64,
                    };
                }
                Op::Neg { width, dst } => {
                    let d = reg[dst as usize];
                    reg[dst as usize] = match width {
                        Width::W64 => d.wrapping_neg(),
                        Width::W32 => (d as u32).wrapping_neg() as u64,
                    };
                }
                Op::End { kind, bits, dst } => {
                    let d = reg[dst as usize];
                    reg[dst as usize] = match (kind, bits) {
                        (EndKind::ToLe, 16) => d as u16 as u64,
                        (EndKind::ToLe, 32) => d as u32 as u64,
                        (EndKind::ToLe, _) => d,
                        (_, 16) => (d as u16).swap_bytes() as u64,
                        (_, 32) => (d as u32).swap_bytes() as u64,
                        (_, _) => d.swap_bytes(),
                    };
                }
                Op::LdImm64 { dst, imm } => reg[dst as usize] = imm,
                Op::Load {
                    size,
                    sign_extend: sx,
                    dst,
                    base,
                    off,
                } => {
                    let addr = reg[base as usize].wrapping_add(off as i64 as u64);
                    let mut mem = Mem {
                        ctx,
                        entry: entry_stack,
                        stacks: &mut stacks,
                    };
                    let v = mem.read(addr, size, pc)?;
                    reg[dst as usize] = if sx {
                        sign_extend(v, (size.bytes() * 8) as u8)
                    } else {
                        v
                    };
                }
                Op::Store {
                    size,
                    base,
                    off,
                    src,
                } => {
                    let addr = reg[base as usize].wrapping_add(off as i64 as u64);
                    let v = match src {
                        Operand::Reg(r) => reg[r as usize],
                        Operand::Imm(v) => v as i64 as u64,
                    };
                    Mem {
                        ctx,
                        entry: entry_stack,
                        stacks: &mut stacks,
                    }
                    .write(addr, size, v, pc)?;
                }
                Op::Atomic {
                    size,
                    op,
                    fetch,
                    base,
                    off,
                    src,
                } => {
                    let addr = reg[base as usize].wrapping_add(off as i64 as u64);
                    let mut mem = Mem {
                        ctx,
                        entry: entry_stack,
                        stacks: &mut stacks,
                    };
                    let old = mem.read(addr, size, pc)?;
                    let mask = if size == Size::W {
                        u32::MAX as u64
                    } else {
                        u64::MAX
                    };
                    let s = reg[src as usize] & mask;
                    match op {
                        AtomicOp::Cmpxchg => {
                            // r0 gets the old value (zero-extended for W); store only on match.
                            if old == reg[0] & mask {
                                mem.write(addr, size, s, pc)?;
                            }
                            reg[0] = old;
                        }
                        _ => {
                            let new = match op {
                                AtomicOp::Add => old.wrapping_add(s),
                                AtomicOp::Or => old | s,
                                AtomicOp::And => old & s,
                                AtomicOp::Xor => old ^ s,
                                _ => s, // Xchg
                            };
                            mem.write(addr, size, new & mask, pc)?;
                            if fetch {
                                reg[src as usize] = old;
                            }
                        }
                    }
                }
                Op::Ja { target } => next = target,
                Op::Jcond {
                    width,
                    cond,
                    dst,
                    src,
                    target,
                } => {
                    let a = reg[dst as usize];
                    let b = match src {
                        Operand::Reg(r) => reg[r as usize],
                        Operand::Imm(v) => v as i64 as u64,
                    };
                    let (a, b) = match width {
                        Width::W64 => (a, b),
                        Width::W32 => (a as u32 as u64, b as u32 as u64),
                    };
                    if cond.eval(width, a, b) {
                        next = target;
                    }
                }
                Op::CallHelper { id } => {
                    let f = self
                        .helper(id.into())
                        .ok_or(EvalError::UnknownHelper { pc, id })?;
                    // SAFETY: test helpers are plain value functions (they never dereference).
                    reg[0] = unsafe { f(reg[1], reg[2], reg[3], reg[4], reg[5]) };
                }
                Op::CallReg { reg: r } => match self.helper(reg[r as usize]) {
                    // SAFETY: as above.
                    Some(f) => reg[0] = unsafe { f(reg[1], reg[2], reg[3], reg[4], reg[5]) },
                    None => {
                        return Ok(Outcome {
                            r0: CALLX_UNKNOWN,
                            steps,
                        })
                    }
                },
                Op::CallLocal { target } => {
                    if frames.len() + 1 >= packjit_frontend::MAX_CALL_DEPTH {
                        return Err(EvalError::CallDepth { pc });
                    }
                    frames.push(Frame {
                        ret: next,
                        saved: [reg[6], reg[7], reg[8], reg[9]],
                        r10: reg[10],
                    });
                    stacks.push(vec![0u8; STACK_SIZE]);
                    reg[10] = frame_base(frames.len()) + STACK_SIZE as u64;
                    next = target;
                }
                Op::Exit => match frames.pop() {
                    None => return Ok(Outcome { r0: reg[0], steps }),
                    Some(f) => {
                        stacks.pop();
                        reg[6..10].copy_from_slice(&f.saved);
                        reg[10] = f.r10;
                        next = f.ret;
                    }
                },
            }
            i = next;
        }
    }
}

fn frame_base(depth: usize) -> u64 {
    STACK_BASE + depth as u64 * FRAME_STRIDE
}

fn sign_extend(v: u64, bits: u8) -> u64 {
    let sh = 64 - bits as u32;
    (((v << sh) as i64) >> sh) as u64
}

/// One ALU operation at `width` (`s` is the second operand, an imm already sign-extended).
pub fn alu(width: Width, op: AluOp, d: u64, s: u64) -> u64 {
    match width {
        Width::W64 => match op {
            AluOp::Add => d.wrapping_add(s),
            AluOp::Sub => d.wrapping_sub(s),
            AluOp::Mul => d.wrapping_mul(s),
            AluOp::Div => d.checked_div(s).unwrap_or(0),
            AluOp::Sdiv => match s as i64 {
                0 => 0,
                sv => (d as i64).wrapping_div(sv) as u64,
            },
            AluOp::Mod => d.checked_rem(s).unwrap_or(d),
            AluOp::Smod => match s as i64 {
                0 => d,
                sv => (d as i64).wrapping_rem(sv) as u64,
            },
            AluOp::Or => d | s,
            AluOp::And => d & s,
            AluOp::Xor => d ^ s,
            AluOp::Lsh => d << (s & 63),
            AluOp::Rsh => d >> (s & 63),
            AluOp::Arsh => ((d as i64) >> (s & 63)) as u64,
            AluOp::Mov => s,
        },
        Width::W32 => {
            let (d, s) = (d as u32, s as u32);
            let r = match op {
                AluOp::Add => d.wrapping_add(s),
                AluOp::Sub => d.wrapping_sub(s),
                AluOp::Mul => d.wrapping_mul(s),
                AluOp::Div => d.checked_div(s).unwrap_or(0),
                AluOp::Sdiv => match s as i32 {
                    0 => 0,
                    sv => (d as i32).wrapping_div(sv) as u32,
                },
                AluOp::Mod => d.checked_rem(s).unwrap_or(d),
                AluOp::Smod => match s as i32 {
                    0 => d,
                    sv => (d as i32).wrapping_rem(sv) as u32,
                },
                AluOp::Or => d | s,
                AluOp::And => d & s,
                AluOp::Xor => d ^ s,
                AluOp::Lsh => d << (s & 31),
                AluOp::Rsh => d >> (s & 31),
                AluOp::Arsh => ((d as i32) >> (s & 31)) as u32,
                AluOp::Mov => s,
            };
            r as u64
        }
    }
}

struct Mem<'a> {
    ctx: &'a mut [u8],
    entry: &'a mut [u8],
    stacks: &'a mut Vec<Vec<u8>>,
}

impl Mem<'_> {
    /// The byte slice `[addr, addr + size)` if it lies inside one region.
    fn slice(
        &mut self,
        addr: u64,
        size: u32,
        pc: usize,
        write: bool,
    ) -> Result<&mut [u8], EvalError> {
        let oob = EvalError::OutOfBounds {
            pc,
            addr,
            size,
            write,
        };
        let end = addr.checked_add(size as u64).ok_or(oob.clone())?;
        let within = |base: u64, len: usize| addr >= base && end <= base + len as u64;
        if within(CTX_BASE, self.ctx.len()) {
            let o = (addr - CTX_BASE) as usize;
            return Ok(&mut self.ctx[o..o + size as usize]);
        }
        if within(frame_base(0), STACK_SIZE) {
            let o = (addr - frame_base(0)) as usize;
            return Ok(&mut self.entry[o..o + size as usize]);
        }
        for (k, s) in self.stacks.iter_mut().enumerate() {
            let base = frame_base(k + 1);
            if addr >= base && end <= base + STACK_SIZE as u64 {
                let o = (addr - base) as usize;
                return Ok(&mut s[o..o + size as usize]);
            }
        }
        Err(oob)
    }

    fn read(&mut self, addr: u64, size: Size, pc: usize) -> Result<u64, EvalError> {
        let s = self.slice(addr, size.bytes(), pc, false)?;
        let mut b = [0u8; 8];
        b[..s.len()].copy_from_slice(s);
        Ok(u64::from_le_bytes(b))
    }

    fn write(&mut self, addr: u64, size: Size, v: u64, pc: usize) -> Result<(), EvalError> {
        let s = self.slice(addr, size.bytes(), pc, true)?;
        let n = s.len();
        s.copy_from_slice(&v.to_le_bytes()[..n]);
        Ok(())
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
            reserved: 0,
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
            ("mov %r2, 77\ncall %r2\nmov %r0, 1\nexit", CALLX_UNKNOWN),
        ];
        for (src, want) in cases {
            assert_eq!(run(src, &mut []).unwrap(), *want, "{src}");
        }
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
            Err(EvalError::OutOfBounds { pc: 0, size: 4, .. })
        ));
        assert!(matches!(
            run("ldxb %r0, [%r10]\nexit", &mut ctx),
            Err(EvalError::OutOfBounds { .. })
        ));
        assert!(matches!(
            run("stb [%r10-513], 1\nexit", &mut ctx),
            Err(EvalError::OutOfBounds { write: true, .. })
        ));
        assert_eq!(run("mov %r0, %r2\nexit", &mut ctx).unwrap(), 4);
        let r = Reference {
            step_limit: 100,
            ..Reference::new()
        };
        assert_eq!(
            r.run(&assemble("ja -1\nexit").unwrap(), &mut [])
                .unwrap_err(),
            EvalError::StepLimit { steps: 100 }
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
