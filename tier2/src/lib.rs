//! # packjit-tier2
//!
//! packjit's optimizing tier: a verified eBPF program (the front end's decode and rewrites,
//! exactly what the baseline backends lower) lifted to Cranelift IR, optimised by
//! Cranelift (e-graph rewrites, register allocation, stack slots kept in registers) and
//! returned as machine code for packjit's own code arena, with the baseline's entry ABI
//! (`u64 entry(ctx, ctx_len, env)`), so `Program::call` and hooks run it unchanged. One
//! lifting serves x86-64, aarch64 and riscv64: the ISA is the host's (Cranelift's
//! `host-arch` feature; the tier compiles only for the machine it runs on).
//!
//! * [`OptimizingBackend`] implements [`JitBackend`]: the runtime hands it the same
//!   requests as a baseline backend.
//! * Trusted and sandboxed programs, with or without an instruction budget, under the
//!   baseline's contracts (ARCHITECTURE.md, "Sandbox contract"): every access the front
//!   end's access plan does not prove is checked against the context, the one stack block
//!   and the host regions, its address clamped by `select_spectre_guard`; back-edges and
//!   calls charge the budget; a stop writes the same record at the same pc. A request for
//!   constant blinding or the per-CPU instruction, an inlined helper kind other than the
//!   array lookup and the tail call, or a legacy packet load is refused with [`ErrorKind::Unsupported`] naming what.
//!
//! Files: `lift.rs` (one eBPF function to one Cranelift function, one method per
//! instruction class, with the sandbox's checks and the budget's charges), `frame.rs`
//! (which stack slots become SSA variables), `inline.rs` (which bpf-to-bpf calls Cranelift
//! inlines), `select.rs` (short arms of equality jumps lifted as selects), `bitset.rs`,
//! `fuse.rs` and `consts.rs` (membership tests, combined loads, known constants),
//! `link.rs` (the functions placed in one image, calls patched), `sandbox.rs` (the
//! functions sandboxed code calls on its rare paths).
//!
//! ```
//! # if let Some(be) = packjit_tier2::OptimizingBackend::host() {
//! // r0 = 6 * 7 ; exit
//! let code = [0xb7, 0, 0, 0, 6, 0, 0, 0, 0x27, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
//! let out = packjit_tier2::emit_program(&code, &[]).unwrap();
//! assert!(!out.bytes.is_empty());
//! assert_eq!(out.line_table.len(), 3);
//! # let _ = be;
//! # }
//! ```

mod bitset;
mod consts;
mod frame;
mod fuse;
mod inline;
mod lift;
mod link;
mod sandbox;
mod select;

use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{self, ExternalName};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::{Context, FinalizedRelocTarget};
use cranelift_frontend::FunctionBuilderContext;
use packjit_plugin_api::{
    install_code_with_line_table, pj_inline_bit, Arch, CodeArena, CompileError, CompileRequest,
    Compiled, ErrorKind, HelperEntry, JitBackend, PJ_COMPILE_BLIND_CONSTANTS,
    PJ_COMPILE_PERCPU_INSN, PJ_INLINE_ARRAY_LOOKUP, PJ_INLINE_TAIL_CALL,
};
use std::sync::OnceLock;

/// The backend name programs compiled by this tier report.
pub const NAME: &str = "packjit-tier2-cranelift";

/// Machine code for one program, not yet placed anywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// The image: the entry function at offset 0, its callees after it.
    pub bytes: Vec<u8>,
    /// Per bytecode slot, the offset of its first native instruction
    /// ([`packjit_plugin_api::NO_NATIVE_CODE`] where the optimiser left it none).
    pub line_table: Vec<u32>,
}

/// The optimizing tier as a [`JitBackend`] for the host's architecture.
#[derive(Clone, Copy, Debug)]
pub struct OptimizingBackend {
    arch: Arch,
}

impl OptimizingBackend {
    /// The tier for this machine, or `None` when Cranelift has no backend for it (or the
    /// host is not one of packjit's architectures).
    pub fn host() -> Option<Self> {
        let arch = Arch::host()?;
        host_isa().ok()?;
        Some(Self { arch })
    }
}

impl JitBackend for OptimizingBackend {
    fn arch(&self) -> Arch {
        self.arch
    }

    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    /// Array map lookups are emitted inline (a load of the key, a bound and a scaled add);
    /// tail calls go through the runtime's runner (`PJ_HELPER_CALLEE_TAIL_CALL`, see
    /// `lift.rs`); every other helper is called.
    fn inline_kinds(&self) -> u32 {
        pj_inline_bit(PJ_INLINE_ARRAY_LOOKUP) | pj_inline_bit(PJ_INLINE_TAIL_CALL)
    }

    /// Cranelift detects the CPU's features itself (`cranelift-native`).
    fn supported_features(&self) -> u64 {
        0
    }

    fn detect_features(&self) -> u64 {
        0
    }

    fn compile(
        &self,
        req: &CompileRequest<'_>,
        arena: &dyn CodeArena,
    ) -> Result<Compiled, CompileError> {
        let out = emit_request(req)?;
        // Cranelift does not count instructions; 0 says "not counted".
        install_code_with_line_table(arena, &out.bytes, 0, out.line_table)
    }
}

/// The host's Cranelift ISA with its native features, built once per process.
fn host_isa() -> Result<&'static OwnedTargetIsa, CompileError> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        let set = |f: &mut settings::Builder, k: &str, v: &str| {
            f.set(k, v)
                .map_err(|e| format!("Cranelift setting {k}={v}: {e}"))
        };
        set(&mut flags, "opt_level", "speed")?;
        // The IR comes from verified bytecode through one small lifter; the verifier costs
        // a fifth of a compile. Debug builds (the tests) keep it.
        let verify = if cfg!(debug_assertions) {
            "true"
        } else {
            "false"
        };
        set(&mut flags, "enable_verifier", verify)?;
        // perf and gdb walk frame pointers through JIT code, as with the baseline.
        set(&mut flags, "preserve_frame_pointers", "true")?;
        set(&mut flags, "unwind_info", "false")?;
        let isa = cranelift_native::builder()
            .map_err(|e| format!("no Cranelift backend for this host: {e}"))?;
        isa.finish(settings::Flags::new(flags))
            .map_err(|e| format!("Cranelift ISA: {e}"))
    })
    .as_ref()
    .map_err(|e| CompileError::new(ErrorKind::Unsupported, format!("optimized tier: {e}")))
}

/// Verifies `code` against `helpers` and emits trusted code, without placing it.
pub fn emit_program(code: &[u8], helpers: &[HelperEntry]) -> Result<Emitted, CompileError> {
    emit_request(&CompileRequest {
        code,
        helpers,
        features: 0,
        flags: 0,
        blind_key: 0,
    })
}

/// Checks the request is one this tier takes, decodes it as the baseline's front end does,
/// and compiles every function.
pub fn emit_request(req: &CompileRequest<'_>) -> Result<Emitted, CompileError> {
    refuse_flags(req.flags)?;
    if req.features != 0 {
        return Err(CompileError::new(
            ErrorKind::InvalidArgument,
            format!(
                "optimized tier: feature bits {:#x} requested; Cranelift picks the CPU's features itself",
                req.features
            ),
        ));
    }
    let isa = host_isa()?;
    let mode = packjit_frontend::analysis::validate_request(req, NAME, 0)?;
    let prog = packjit_frontend::decode_for_lowering(req)?;
    let shared = lift::Shared::new(&prog, req.helpers, mode, &**isa)?;
    let funcs = compile_functions(&shared, &**isa)?;
    let arch = Arch::host().expect("host_isa succeeded");
    let image = link::link(arch, &funcs, prog.slots)?;
    Ok(Emitted {
        bytes: image.bytes,
        line_table: image.line_table,
    })
}

/// Every function of the program lifted and compiled (small leaves also inlined into their
/// callers), each with its calls still to patch.
fn compile_functions(
    shared: &lift::Shared<'_>,
    isa: &dyn cranelift_codegen::isa::TargetIsa,
) -> Result<Vec<link::FuncCode>, CompileError> {
    let prog = shared.prog;
    let mut ctx = Context::new();
    let mut fctx = FunctionBuilderContext::new();
    let count = prog.subprogs.len();
    // Every function lifted before any is compiled: a small leaf is also the body inlined
    // at its call sites (`inline.rs`).
    let mut lifted = Vec::with_capacity(count);
    for index in 0..count {
        let mut func = ir::Function::new();
        lift::lift_function(shared, index, &mut func, &mut fctx)?;
        lifted.push(func);
    }
    let inlinable = inline::inlinable(prog, &shared.tail_calls);
    let mut funcs = Vec::with_capacity(count);
    for index in 0..count {
        ctx.clear();
        // A leaf's lifting is also the body inlined into callers compiled later; any other
        // function's is needed only here.
        ctx.func = if inlinable[index] {
            lifted[index].clone()
        } else {
            std::mem::replace(&mut lifted[index], ir::Function::new())
        };
        if inline::calls_inlinable(prog, index, &inlinable) {
            let inliner = inline::Inliner {
                lifted: &lifted,
                inlinable: &inlinable,
                frames: 0,
            };
            ctx.inline(inliner).map_err(|e| {
                CompileError::new(
                    ErrorKind::Internal,
                    format!("optimized tier: inlining into function {index} failed: {e:?}"),
                )
            })?;
        }
        let (bytes, relocs, srclocs) = {
            let code = ctx
                .compile(isa, &mut ControlPlane::default())
                .map_err(|e| {
                    CompileError::new(
                        ErrorKind::Internal,
                        format!(
                            "optimized tier: Cranelift failed on function {index}: {:?}",
                            e.inner
                        ),
                    )
                })?;
            let srclocs: Vec<(u32, u32, u32)> = code
                .buffer
                .get_srclocs_sorted()
                .iter()
                .filter(|s| !s.loc.is_default())
                .map(|s| (s.start, s.end, s.loc.bits()))
                .collect();
            (
                code.code_buffer().to_vec(),
                code.buffer.relocs().to_vec(),
                srclocs,
            )
        };
        let mut calls = Vec::with_capacity(relocs.len());
        for r in relocs {
            let callee = match &r.target {
                FinalizedRelocTarget::ExternalName(ExternalName::User(name)) => {
                    ctx.func.params.user_named_funcs()[*name].index as usize
                }
                other => {
                    return Err(CompileError::new(
                        ErrorKind::Internal,
                        format!("optimized tier: function {index} relocates against {other:?}"),
                    ))
                }
            };
            calls.push((r.offset, r.kind, callee, r.addend));
        }
        funcs.push(link::FuncCode {
            bytes,
            calls,
            srclocs,
            first_slot: prog.insts[prog.subprogs[index].start].pc,
        });
    }
    Ok(funcs)
}

/// The compile flags naming a contract this tier does not implement yet are refused by
/// name; the sandbox and the budget it implements.
fn refuse_flags(flags: u32) -> Result<(), CompileError> {
    for (bit, what) in [
        (
            PJ_COMPILE_BLIND_CONSTANTS,
            "constant blinding (PJ_COMPILE_BLIND_CONSTANTS)",
        ),
        (
            PJ_COMPILE_PERCPU_INSN,
            "the per-CPU address instruction (PJ_COMPILE_PERCPU_INSN)",
        ),
    ] {
        if flags & bit != 0 {
            return Err(CompileError::new(
                ErrorKind::Unsupported,
                format!("optimized tier: {what} is not supported yet"),
            ));
        }
    }
    if flags & !packjit_plugin_api::PJ_COMPILE_ALL_FLAGS != 0 {
        return Err(CompileError::new(
            ErrorKind::InvalidArgument,
            format!("unknown compile flags {flags:#x}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One eBPF instruction: opcode, registers, offset, immediate.
    fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let mut b = [op, src << 4 | dst, 0, 0, 0, 0, 0, 0];
        b[2..4].copy_from_slice(&off.to_le_bytes());
        b[4..].copy_from_slice(&imm.to_le_bytes());
        b
    }

    /// The calls the entry keeps after inlining, for an entry calling the leaf function
    /// `callee` from `sites` call sites.
    fn entry_calls(callee: &[[u8; 8]], sites: usize) -> usize {
        let mut code = Vec::new();
        for k in 0..sites {
            // call local: the callee starts after the remaining calls and the exit.
            code.extend(insn(0x85, 0, 1, 0, (sites - k) as i32));
        }
        code.extend(insn(0x95, 0, 0, 0, 0)); // exit
        for i in callee {
            code.extend(i);
        }
        with_shared(&code, |shared, isa| {
            compile_functions(shared, isa).unwrap()[0].calls.len()
        })
    }

    /// The entry function of `code` as lifted, before Cranelift optimizes it.
    fn lifted_entry(code: &[[u8; 8]]) -> ir::Function {
        with_shared(&code.concat(), |shared, _| {
            let mut func = ir::Function::new();
            let mut fctx = FunctionBuilderContext::new();
            lift::lift_function(shared, 0, &mut func, &mut fctx).unwrap();
            func
        })
    }

    /// `f` on the lifting context of trusted `code` for the host's ISA.
    fn with_shared<T>(
        code: &[u8],
        f: impl FnOnce(&lift::Shared<'_>, &dyn cranelift_codegen::isa::TargetIsa) -> T,
    ) -> T {
        let req = CompileRequest {
            code,
            helpers: &[],
            features: 0,
            flags: 0,
            blind_key: 0,
        };
        let isa = host_isa().unwrap();
        let mode = packjit_frontend::analysis::validate_request(&req, NAME, 0).unwrap();
        let prog = packjit_frontend::decode_for_lowering(&req).unwrap();
        let shared = lift::Shared::new(&prog, req.helpers, mode, &**isa).unwrap();
        f(&shared, &**isa)
    }

    #[test]
    fn jumps_to_an_exit_return_their_own_verdict_from_a_cold_block() {
        // r0 = 1; if r2 == 0 goto out; r0 = 2; if r2 == 1 goto out; goto out; r0 = 3;
        // out: exit — clang's shape: a verdict set before each test, one shared exit.
        let f = lifted_entry(&[
            insn(0xb7, 0, 0, 0, 1),
            insn(0x15, 2, 0, 4, 0),
            insn(0xb7, 0, 0, 0, 2),
            insn(0x15, 2, 0, 2, 1),
            insn(0x05, 0, 0, 1, 0),
            insn(0xb7, 0, 0, 0, 3),
            insn(0x95, 0, 0, 0, 0),
        ]);
        let returns: Vec<_> = f
            .layout
            .blocks()
            .filter(|&b| {
                let last = f.layout.last_inst(b).unwrap();
                f.dfg.insts[last].opcode() == ir::Opcode::Return
            })
            .collect();
        // Each jump's own return (cold), and the shared exit's (reached by nothing now,
        // removed later by Cranelift).
        assert_eq!(returns.len(), 4, "{}", f.display());
        assert_eq!(returns.iter().filter(|&&b| f.layout.is_cold(b)).count(), 3);
        // No verdict waits in a block parameter for the shared exit.
        let entry = f.layout.entry_block().unwrap();
        for b in f.layout.blocks().filter(|&b| b != entry) {
            assert!(f.dfg.block_params(b).is_empty(), "{}", f.display());
        }
    }

    /// A leaf of `len` instructions: `r0 = r1 + 3 * (len - 2)`.
    fn adder(len: usize) -> Vec<[u8; 8]> {
        let mut f = vec![insn(0xbf, 0, 1, 0, 0)]; // mov r0, r1
        f.extend((2..len).map(|_| insn(0x07, 0, 0, 0, 3))); // add r0, 3
        f.push(insn(0x95, 0, 0, 0, 0)); // exit
        f
    }

    #[test]
    fn small_leaf_functions_are_inlined_and_large_ones_called() {
        assert_eq!(entry_calls(&adder(2), 1), 0);
        assert_eq!(entry_calls(&adder(inline::MAX_INLINED_INSNS), 1), 0);
        assert_eq!(entry_calls(&adder(inline::MAX_INLINED_INSNS + 1), 1), 1);
    }

    #[test]
    fn inlined_copies_with_a_frame_are_bounded_per_caller() {
        // r2 = r10 - 8; *(u64 *)r2 = r1; r0 = *(u64 *)(r10 - 8): the copy of r10 keeps the
        // frame in memory, a 512-byte slot in each inlined copy.
        let framed = [
            insn(0xbf, 2, 10, 0, 0),
            insn(0x07, 2, 0, 0, -8),
            insn(0x7b, 2, 1, 0, 0),
            insn(0x79, 0, 10, -8, 0),
            insn(0x95, 0, 0, 0, 0),
        ];
        let sites = inline::MAX_INLINED_FRAMES + 2;
        assert_eq!(entry_calls(&framed, sites), 2);
        // Without a frame in memory, every site is inlined.
        assert_eq!(entry_calls(&adder(3), sites), 0);
    }
}
