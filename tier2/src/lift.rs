//! One eBPF function lifted to one Cranelift function: one short method per instruction
//! class, as the baseline backends lower them.
//!
//! BPF registers r0–r9 are Cranelift variables (`cranelift-frontend` builds the SSA form);
//! r10 is the top of a 512-byte stack slot of the function's own; the stack slots
//! [`frame::plan`] picks are variables too. Semantics are the interpreter's:
//! division by zero gives 0, modulo by zero the dividend, `MIN / -1` does not trap, shift
//! counts are masked (Cranelift's shifts mask by definition), 32-bit results are
//! zero-extended.

use crate::bitset::{self, SetTest};
use crate::consts::{self, Known};
use crate::frame::{self, Slot};
use crate::fuse::{self, Action, ByteOrder, WideLoad};
use crate::select::{self, Arm};
use cranelift_codegen::ir::{
    self, condcodes::IntCC, types, AbiParam, AtomicRmwOp, Block, BlockArg, ExtFuncData,
    ExternalName, FuncRef, InstBuilder, MemFlagsData, SigRef, Signature, SourceLoc, StackSlotData,
    StackSlotKind, Type, UserExternalName, UserFuncName, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use packjit_frontend::analysis::{
    back_edge_charge, helper_lowering, is_frame_constant, live_in, stack_block_size, ArrayLookup,
    CodegenMode, HelperLowering, CALL_CHARGE,
};
use packjit_frontend::lower::MAX_TAIL_CALLING_DEPTH;
use packjit_frontend::ranges::{plan_accesses, AccessCheck, AccessPlan};
use packjit_frontend::{
    AluOp, AtomicOp, Cond, EndKind, Op, Operand, Program, Reg, Size, Width, R10, STACK_SIZE,
};
use packjit_plugin_api::{
    CompileError, ErrorKind, HelperEntry, PJ_ACCESS_WRITE, PJ_CALLEE_TAIL_FELL_THROUGH,
    PJ_CALLEE_TAIL_RETURNED, PJ_ENV_BUDGET, PJ_ENV_CALLEE_TAIL_R0, PJ_ENV_CTX_END,
    PJ_ENV_CTX_START, PJ_ENV_STACK_END, PJ_ENV_STACK_START, PJ_ENV_STOP_ADDR, PJ_ENV_STOP_KIND,
    PJ_ENV_STOP_PC, PJ_HELPER_CALLEE_TAIL_CALL, PJ_HELPER_LOOKUP_VALUES, PJ_HELPER_PERCPU_LOOKUP,
    PJ_HELPER_PERCPU_OFFSET, PJ_HELPER_STATIC_REGIONS, PJ_INLINE_ARRAY_LOOKUP, PJ_INLINE_NONE,
    PJ_INLINE_TAIL_CALL, PJ_STOP_BUDGET, PJ_STOP_UNKNOWN_CALLX,
};
use std::collections::HashMap;

const I64: Type = types::I64;
const I32: Type = types::I32;
const NO_ARGS: &[BlockArg] = &[];

/// What every function of one program shares while it is lifted.
pub(crate) struct Shared<'p> {
    pub prog: &'p Program,
    /// Helpers a `call` or `callx` can reach: `(id, address)`.
    pub helpers: Vec<(u32, u64)>,
    /// Array map lookups emitted inline (`PJ_INLINE_ARRAY_LOOKUP`), by helper id: only a
    /// `call imm` reaches them, as in the baseline (a `callx` of the id finds nothing).
    pub arrays: Vec<(u32, ArrayLookup)>,
    /// Ids of the tail-call entries (`PJ_INLINE_TAIL_CALL`, either form) and the runner they
    /// go through (`PJ_HELPER_CALLEE_TAIL_CALL`): see [`Lifter::tail_call`]. Neither is a
    /// `callx` target.
    pub tail_calls: Vec<u32>,
    pub tail_runner: Option<u64>,
    /// A callee may stop the run (an unknown `callx` id, a failed check, the budget):
    /// callers test the stop field after each local call and return at once when it is set.
    pub may_stop: bool,
    /// Sandboxed (memory checks) and/or budgeted, from the request's flags.
    pub mode: CodegenMode,
    /// Sandboxed: which accesses the front end proves safe (`AccessCheck::None`); every
    /// other one is checked. Empty for trusted code.
    pub access: AccessPlan,
    /// Sandboxed: bytes of the one stack block all frames live in
    /// ([`stack_block_size`]); the entry reserves it and passes each callee its r10.
    pub block: usize,
    /// Whether stack slots may become variables ([`frame::plan`]). Sandboxed code can reach
    /// another function's frame through its own r10 (`*(r10 + 8)` in a callee reads its
    /// caller's frame, allowed because the block is one region): promotion there is exact
    /// only when no function copies r10 or addresses outside its own frame through it.
    pub promote: bool,
    /// Whether byte assembly may become one wide load ([`crate::fuse`]): hosts where an
    /// unaligned load is an ordinary load.
    pub combine_loads: bool,
    pub call_conv: CallConv,
    pub frontend: TargetFrontendConfig,
}

impl<'p> Shared<'p> {
    /// Helpers callable from code: every entry of the table but the descriptive ones, the
    /// inlined array lookups, the tail calls and their runner. Any other inlined kind is
    /// refused (this tier announces only `PJ_INLINE_ARRAY_LOOKUP` and `PJ_INLINE_TAIL_CALL`,
    /// so a host never sends one).
    pub fn new(
        prog: &'p Program,
        table: &[HelperEntry],
        mode: CodegenMode,
        isa: &dyn cranelift_codegen::isa::TargetIsa,
    ) -> Result<Self, CompileError> {
        let mut helpers = Vec::new();
        let mut arrays = Vec::new();
        let (mut tail_calls, mut tail_runner) = (Vec::new(), None);
        for h in table {
            if h.id == PJ_HELPER_PERCPU_OFFSET
                || h.id == PJ_HELPER_STATIC_REGIONS
                || h.id == PJ_HELPER_LOOKUP_VALUES
            {
                continue;
            }
            if h.inline_kind == PJ_INLINE_ARRAY_LOOKUP {
                if h.addr == 0 {
                    return Err(CompileError::new(
                        ErrorKind::InvalidArgument,
                        format!("helper id {}: array lookup with no PjArrayMap", h.id),
                    ));
                }
                if let HelperLowering::ArrayLookup(a) = helper_lowering(h) {
                    arrays.push((h.id, a));
                }
                continue;
            }
            if h.inline_kind == PJ_INLINE_TAIL_CALL {
                tail_calls.push(h.id);
                continue;
            }
            if h.id == PJ_HELPER_CALLEE_TAIL_CALL {
                tail_runner = Some(h.addr);
                continue;
            }
            if h.inline_kind != PJ_INLINE_NONE {
                return Err(CompileError::new(
                    ErrorKind::Unsupported,
                    format!(
                        "optimized tier: helper id {} asks for inline kind {}, which this tier does not emit",
                        h.id, h.inline_kind
                    ),
                ));
            }
            helpers.push((h.id, h.addr));
        }
        let tail_calling = prog
            .insts
            .iter()
            .find(|i| matches!(i.op, Op::CallHelper { id } if tail_calls.contains(&id)));
        if let Some(call) = tail_calling {
            check_tail_calling(prog, call.pc as usize, tail_runner)?;
        }
        // A tail call's target may stop (an unknown `callx`, a sandboxed check, a budget of
        // its own), and the stop ends the whole run.
        let may_stop = mode.sandboxed()
            || mode.counts_budget()
            || tail_calling.is_some()
            || prog
                .insts
                .iter()
                .any(|i| matches!(i.op, Op::CallReg { .. }));
        let (access, block, promote) = if mode.sandboxed() {
            let promote = !prog.insts.iter().any(|i| {
                frame::frame_escapes(&i.op)
                    || match i.op {
                        Op::Load {
                            base, off, size, ..
                        }
                        | Op::Store {
                            base, off, size, ..
                        }
                        | Op::Atomic {
                            base, off, size, ..
                        } => base == R10 && !is_frame_constant(base, off, size),
                        _ => false,
                    }
            });
            (plan_accesses(prog, false), stack_block_size(prog), promote)
        } else {
            (AccessPlan::default(), 0, true)
        };
        Ok(Self {
            prog,
            helpers,
            arrays,
            tail_calls,
            tail_runner,
            may_stop,
            mode,
            access,
            block,
            promote,
            combine_loads: matches!(
                isa.triple().architecture,
                target_lexicon::Architecture::X86_64 | target_lexicon::Architecture::Aarch64(_)
            ),
            call_conv: isa.default_call_conv(),
            frontend: isa.frontend_config(),
        })
    }

    /// The signature of function `index`: the entry takes `(ctx, ctx_len, env)`, every other
    /// function `(r1, .., r5, env)`, sandboxed `(r1, .., r5, r10, env)`; all return r0.
    pub fn signature(&self, index: usize) -> Signature {
        let mut sig = Signature::new(self.call_conv);
        let params = match index {
            0 => 3,
            _ if self.mode.sandboxed() => 7,
            _ => 6,
        };
        sig.params.extend((0..params).map(|_| AbiParam::new(I64)));
        sig.returns.push(AbiParam::new(I64));
        sig
    }
}

/// Lifts function `index` of the program into `func`.
pub(crate) fn lift_function(
    shared: &Shared<'_>,
    index: usize,
    func: &mut ir::Function,
    fctx: &mut FunctionBuilderContext,
) -> Result<(), CompileError> {
    func.signature = shared.signature(index);
    func.name = UserFuncName::user(0, index as u32);
    let sub = &shared.prog.subprogs[index];
    let mut b = FunctionBuilder::new(func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);

    let regs: [Variable; 10] = std::array::from_fn(|_| b.declare_var(I64));
    let params = b.block_params(entry).to_vec();
    let zero = b.ins().iconst(I64, 0);
    for (r, &var) in regs.iter().enumerate() {
        // The entry gets r1 = ctx and r2 = ctx_len; a callee r1-r5. The rest start at zero
        // (the interpreter's value; trusted code must not read them anyway).
        let v = match (index, r) {
            (0, 1 | 2) => params[r - 1],
            (0, _) => zero,
            (_, 1..=5) => params[r - 1],
            _ => zero,
        };
        b.def_var(var, v);
    }
    let env = *params.last().expect("every signature ends with env");
    let insts = &shared.prog.insts[sub.start..sub.end];
    let plan = if shared.promote {
        frame::plan(insts)
    } else {
        frame::FramePlan {
            slots: Vec::new(),
            memory: true,
        }
    };
    let mut bounds = None;
    let r10 = if shared.mode.sandboxed() {
        let (r10, b) = sandbox_frame(&mut b, shared, index, &params, env);
        bounds = Some(b);
        r10
    } else if plan.memory {
        let frame = b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            STACK_SIZE as u32,
            4,
        ));
        b.ins().stack_addr(I64, frame, STACK_SIZE as i32)
    } else {
        // Every r10 access is a variable: no stack to reserve, and no use of r10's value
        // (the plan found none outside promoted accesses).
        zero
    };
    let mut slots = HashMap::new();
    for slot in plan.slots {
        let var = b.declare_var(I64);
        b.def_var(var, zero);
        slots.insert(slot, var);
    }

    let live_in = live_in(shared.prog, sub.start, sub.end);
    let is_target = &shared.prog.is_target[sub.start..sub.end];
    let set_tests = bitset::plan(&bitset::Function {
        insts,
        start: sub.start,
        is_target,
        live_in: &live_in,
    });
    let plan = shared.combine_loads.then(|| {
        let proven = |k: usize| {
            !shared.mode.sandboxed() || shared.access.check(sub.start + k) == AccessCheck::None
        };
        let function = fuse::Function {
            insts,
            start: sub.start,
            is_target,
            live_in: &live_in,
        };
        fuse::plan(&function, proven)
    });
    // Where control arrives other than by falling through: the jump targets, and the exits
    // of the membership tests, which can be the fall-through of a jump inside the run
    // (lifted as written, reached by nothing) but are entered from the test's first jump.
    let mut entered = is_target.to_vec();
    for t in set_tests.iter().flatten() {
        entered[t.taken - sub.start] = true;
        entered[t.other - sub.start] = true;
    }
    // A budgeted program keeps its jumps: a converted back-edge would not be charged.
    let arms = if shared.mode.counts_budget() {
        vec![None; insts.len()]
    } else {
        let lifted_as_is = |k: usize| {
            set_tests[k].is_none()
                && plan
                    .as_ref()
                    .is_none_or(|p| p.actions[k] == Action::Lift && !p.capture[k])
        };
        select::plan(insts, sub.start, &entered, lifted_as_is)
    };

    // A block where control arrives, or where a conditional jump falls through (unless into
    // an arm lifted as selects, which continues the jump's block).
    let mut blocks: Vec<Option<Block>> = vec![None; sub.end - sub.start];
    blocks[0] = Some(b.create_block());
    for k in 1..insts.len() {
        let after_jcond = matches!(insts[k - 1].op, Op::Jcond { .. }) && arms[k - 1].is_none();
        if entered[k] || after_jcond {
            blocks[k].get_or_insert_with(|| b.create_block());
        }
    }

    let mut l = Lifter {
        b,
        shared,
        regs,
        r10,
        env,
        bounds,
        slots,
        blocks,
        start: sub.start,
        helper_sig: None,
        locals: HashMap::new(),
        consts: consts::plan(insts, sub.start),
        at: 0,
        written_here: 0,
    };
    let first = l.blocks[0].expect("created above");
    l.b.ins().jump(first, NO_ARGS);
    // Base registers as the loads read them, for the wide loads after them (`fuse`).
    let mut bases: Vec<Option<Value>> = vec![None; insts.len()];
    let mut open = false;
    // Instructions before this one belong to an arm lifted with its jump.
    let mut resume = 0;
    for (k, inst) in insts.iter().enumerate() {
        if k < resume {
            continue;
        }
        match l.blocks[k] {
            Some(block) => {
                if open {
                    l.b.ins().jump(block, NO_ARGS);
                }
                l.b.switch_to_block(block);
            }
            // Code nothing reaches: still lifted (Cranelift drops it), in a block of its own.
            None if !open => {
                let block = l.b.create_block();
                l.b.switch_to_block(block);
            }
            None => {}
        }
        l.b.set_srcloc(SourceLoc::new(inst.pc));
        l.at = k;
        l.written_here = 0;
        let action = plan.as_ref().map_or(Action::Lift, |p| {
            if let (true, Op::Load { base, .. }) = (p.capture[k], inst.op) {
                bases[k] = Some(l.get(base));
            }
            p.actions[k]
        });
        match (action, inst.op) {
            (Action::Lift, Op::Jcond { .. }) if arms[k].is_some() => {
                let arm = arms[k].expect("tested");
                l.select_arm(k, arm)?;
                resume = arm.resume();
                open = !arm.closed_by_jump;
                continue;
            }
            (Action::Lift, _) if set_tests[k].is_some() => {
                l.set_test(set_tests[k].expect("tested"))
            }
            (Action::Lift, _) => l.inst(sub.start + k, inst.pc, &inst.op)?,
            (Action::Skip, _) => {}
            (Action::Wide(w), Op::Alu { dst, .. }) => {
                let base = bases[w.base_at].ok_or_else(|| {
                    CompileError::new(
                        ErrorKind::Internal,
                        format!(
                            "optimized tier: pc {}: a combined load without its base",
                            inst.pc
                        ),
                    )
                })?;
                l.wide_load(dst, base, w);
            }
            (Action::Wide(_), _) => {
                return Err(CompileError::new(
                    ErrorKind::Internal,
                    format!(
                        "optimized tier: pc {}: a combined load at an instruction that is no `or`",
                        inst.pc
                    ),
                ))
            }
        }
        open = !matches!(inst.op, Op::Ja { .. } | Op::Exit | Op::Jcond { .. });
    }
    if open {
        return Err(CompileError::new(
            ErrorKind::Internal,
            format!("optimized tier: function {index} falls off its end after verification"),
        ));
    }
    l.b.seal_all_blocks();
    l.b.finalize(shared.frontend);
    Ok(())
}

/// The regions a sandboxed function tests inline: the context and the stack block.
#[derive(Clone, Copy)]
struct Bounds {
    ctx: Limits,
    stack: Limits,
}

/// One region as values defined in the function's entry block: its start, and per access
/// size `k` (1, 2, 4, 8) the number of offsets an access of `k` bytes may start at,
/// `len - k + 1` or 0 when the region is shorter than `k`. An access is then inside iff
/// `addr - start < limit[k]` (unsigned, one compare: an address below the start wraps to a
/// huge offset), and the limits are loop invariant, computed once per call.
#[derive(Clone, Copy)]
struct Limits {
    start: Value,
    limit: [Value; 4],
}

impl Limits {
    fn new(b: &mut FunctionBuilder<'_>, start: Value, len: Value) -> Self {
        let limit = [1i64, 2, 4, 8].map(|k| {
            if k == 1 {
                return len;
            }
            let short = b.ins().icmp_imm_s(IntCC::UnsignedLessThan, len, k);
            let count = b.ins().iadd_imm_s(len, 1 - k);
            let zero = b.ins().iconst(I64, 0);
            b.ins().select(short, zero, count)
        });
        Self { start, limit }
    }

    fn limit(&self, bytes: i64) -> Value {
        self.limit[bytes.trailing_zeros() as usize]
    }
}

/// Sandboxed frames: the entry reserves the whole stack block as one Cranelift slot (no
/// spill or saved register lands inside it: Cranelift's own slots are separate), zeroes
/// it, publishes it in `env.stack_start` / `env.stack_end` (helpers check pointers against
/// them) and starts with r10 at its end; a callee gets its r10 as a parameter (the caller's
/// minus 512). Returns r10 and the inline regions.
fn sandbox_frame(
    b: &mut FunctionBuilder<'_>,
    shared: &Shared<'_>,
    index: usize,
    params: &[Value],
    env: Value,
) -> (Value, Bounds) {
    let f = MemFlagsData::new().with_notrap();
    // Fields the run never changes once the entry wrote them: free to reuse or drop.
    let fixed = f.with_readonly();
    let ctx_start = b.ins().load(I64, fixed, env, PJ_ENV_CTX_START);
    let ctx_end = b.ins().load(I64, fixed, env, PJ_ENV_CTX_END);
    let ctx_len = b.ins().isub(ctx_end, ctx_start);
    if index == 0 {
        let block = shared.block as i64;
        let start = if block > 0 {
            let slot = b.create_sized_stack_slot(StackSlotData::new(
                StackSlotKind::ExplicitSlot,
                shared.block as u32,
                4,
            ));
            let start = b.ins().stack_addr(I64, slot, 0);
            let len = b.ins().iconst(I64, block);
            let mut sig = Signature::new(shared.call_conv);
            sig.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
            let sig = b.import_signature(sig);
            let zero = b
                .ins()
                .iconst(I64, crate::sandbox::zero_block as *const () as usize as i64);
            b.ins().call_indirect(sig, zero, &[start, len]);
            start
        } else {
            // No function reads r10: an empty block no access lies in.
            b.ins().iconst(I64, 0)
        };
        let end = b.ins().iadd_imm_s(start, block);
        b.ins().store(f, start, env, PJ_ENV_STACK_START);
        b.ins().store(f, end, env, PJ_ENV_STACK_END);
        let len = b.ins().iconst(I64, block);
        let bounds = Bounds {
            ctx: Limits::new(b, ctx_start, ctx_len),
            stack: Limits::new(b, start, len),
        };
        (end, bounds)
    } else {
        let start = b.ins().load(I64, fixed, env, PJ_ENV_STACK_START);
        let end = b.ins().load(I64, fixed, env, PJ_ENV_STACK_END);
        let len = b.ins().isub(end, start);
        let bounds = Bounds {
            ctx: Limits::new(b, ctx_start, ctx_len),
            stack: Limits::new(b, start, len),
        };
        (params[5], bounds)
    }
}

struct Lifter<'a, 'f> {
    b: FunctionBuilder<'f>,
    shared: &'a Shared<'a>,
    regs: [Variable; 10],
    /// The frame's top (`stack_addr` of the function's slot + 512): defined in the entry
    /// block, so it dominates every use.
    r10: Value,
    env: Value,
    /// Sandboxed code: the regions the inline test covers.
    bounds: Option<Bounds>,
    slots: HashMap<Slot, Variable>,
    /// Per instruction of the function (index from `start`).
    blocks: Vec<Option<Block>>,
    start: usize,
    helper_sig: Option<SigRef>,
    locals: HashMap<usize, FuncRef>,
    /// Per instruction of the function, the registers known to hold a constant on entry.
    consts: Vec<Known>,
    /// The instruction being lifted (index from `start`).
    at: usize,
    /// The registers the lift of the current instruction has written so far (a call's
    /// arguments set up for an inlined helper): their `consts` no longer hold.
    written_here: u16,
}

impl Lifter<'_, '_> {
    fn get(&mut self, r: Reg) -> Value {
        if r == R10 {
            return self.r10;
        }
        if self.written_here & 1 << r == 0 {
            if let Some(c) = self.consts[self.at].get(r) {
                return self.b.ins().iconst(I64, c as i64);
            }
        }
        self.b.use_var(self.regs[r as usize])
    }

    fn set(&mut self, r: Reg, v: Value) {
        self.written_here |= 1 << r;
        self.b.def_var(self.regs[r as usize], v);
    }

    /// `src` at `width`: a 32-bit operand is the low half, an immediate its constant.
    fn operand(&mut self, src: Operand, width: Width) -> Value {
        match (src, width) {
            (Operand::Reg(r), Width::W64) => self.get(r),
            (Operand::Reg(r), Width::W32) => {
                let v = self.get(r);
                self.b.ins().ireduce(I32, v)
            }
            (Operand::Imm(i), Width::W64) => self.b.ins().iconst(I64, i as i64),
            (Operand::Imm(i), Width::W32) => self.b.ins().iconst(I32, i as u32 as i64),
        }
    }

    /// Register `r` at `width`.
    fn reg_at(&mut self, r: Reg, width: Width) -> Value {
        self.operand(Operand::Reg(r), width)
    }

    /// Writes a result computed at `width` (a 32-bit one zero-extended).
    fn set_at(&mut self, r: Reg, v: Value, width: Width) {
        let v = match width {
            Width::W64 => v,
            Width::W32 => self.b.ins().uextend(I64, v),
        };
        self.set(r, v);
    }

    /// A block of its own for a jump to an `exit` that pays nothing on the way
    /// (`charge`) while r0 is a known constant, where that verdict is returned: clang sets
    /// a verdict in r0 before each test and jumps to one shared `exit`, whose r0 became a
    /// block parameter, and every verdict was then moved into the return register before
    /// its test, on the path that goes on (ten moves in `parse`'s hot path). Returned from
    /// its own block, a verdict is set only where its jump lands. Cold: an `exit` runs
    /// once per call.
    fn exit_stub(&mut self, target: usize, charge: Option<u64>) -> Option<Block> {
        let is_exit = matches!(self.shared.prog.insts[target].op, Op::Exit);
        let verdict = self.consts[self.at].get(0).is_some();
        (is_exit && verdict && charge.is_none()).then(|| {
            let stub = self.b.create_block();
            self.b.set_cold_block(stub);
            stub
        })
    }

    /// Lifts the `exit` of [`Lifter::exit_stub`] into `stub`, once the jump to it has
    /// ended the current block; r0 is read as it is at the jump.
    fn fill_exit_stub(&mut self, stub: Block) {
        self.b.switch_to_block(stub);
        let r0 = self.get(0);
        self.b.ins().return_(&[r0]);
    }

    fn block_at(&self, i: usize) -> Block {
        self.blocks[i - self.start].expect("every branch target and fall-through has a block")
    }

    fn inst(&mut self, i: usize, pc: u32, op: &Op) -> Result<(), CompileError> {
        match *op {
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => self.alu(width, op, dst, src),
            Op::MovSx {
                width,
                dst,
                src,
                bits,
            } => self.movsx(width, dst, src, bits),
            Op::Neg { width, dst } => {
                let v = self.reg_at(dst, width);
                let n = self.b.ins().ineg(v);
                self.set_at(dst, n, width);
            }
            Op::End { kind, bits, dst } => self.end(kind, bits, dst),
            Op::LdImm64 { dst, imm } => {
                let v = self.b.ins().iconst(I64, imm.get() as i64);
                self.set(dst, v);
            }
            Op::Load {
                size,
                sign_extend,
                dst,
                base,
                off,
            } => self.load(i, pc, size, sign_extend, dst, base, off),
            Op::Store {
                size,
                base,
                off,
                src,
            } => self.store(i, pc, size, base, off, src),
            Op::Atomic {
                size,
                op,
                fetch,
                base,
                off,
                src,
            } => self.atomic(i, pc, size, op, fetch, base, off, src),
            Op::Ja { target } => {
                let charge = self.back_edge(i, target as usize);
                if let Some(charge) = charge {
                    self.charge(pc, charge);
                }
                match self.exit_stub(target as usize, charge) {
                    Some(stub) => {
                        self.b.ins().jump(stub, NO_ARGS);
                        self.fill_exit_stub(stub);
                    }
                    None => {
                        let t = self.block_at(target as usize);
                        self.b.ins().jump(t, NO_ARGS);
                    }
                }
            }
            Op::Jcond {
                width,
                cond,
                dst,
                src,
                target,
            } => self.jcond(i, pc, width, cond, dst, src, target as usize),
            Op::CallHelper { id } => self.call_helper(pc, id)?,
            Op::CallReg { reg } => self.call_reg(pc, reg),
            Op::CallLocal { target } => {
                if self.shared.mode.counts_budget() {
                    self.charge(pc, CALL_CHARGE);
                }
                self.call_local(target as usize)
            }
            Op::Exit => {
                let r0 = self.get(0);
                self.b.ins().return_(&[r0]);
            }
            Op::MovPerCpu { .. } => return Err(unsupported(pc, "the per-CPU address instruction")),
            Op::PacketLoad { .. } => {
                return Err(unsupported(pc, "legacy packet loads (LD_ABS / LD_IND)"))
            }
        }
        Ok(())
    }

    fn alu(&mut self, width: Width, op: AluOp, dst: Reg, src: Operand) {
        let b = self.operand(src, width);
        let r = if op == AluOp::Mov {
            b
        } else {
            let a = self.reg_at(dst, width);
            self.binop(op, a, b)
        };
        self.set_at(dst, r, width);
    }

    /// `a op b` on values of one type (i32 or i64).
    fn binop(&mut self, op: AluOp, a: Value, b: Value) -> Value {
        let fb = &mut self.b;
        match op {
            AluOp::Add => fb.ins().iadd(a, b),
            AluOp::Sub => fb.ins().isub(a, b),
            AluOp::Mul => fb.ins().imul(a, b),
            AluOp::Or => fb.ins().bor(a, b),
            AluOp::And => match scaled_index(fb, a, b) {
                Some(v) => v,
                None => fb.ins().band(a, b),
            },
            AluOp::Xor => fb.ins().bxor(a, b),
            AluOp::Lsh => {
                let b = unmasked_shift_amount(fb, b);
                fb.ins().ishl(a, b)
            }
            AluOp::Rsh => {
                let b = unmasked_shift_amount(fb, b);
                fb.ins().ushr(a, b)
            }
            AluOp::Arsh => {
                let b = unmasked_shift_amount(fb, b);
                fb.ins().sshr(a, b)
            }
            AluOp::Mov => b,
            AluOp::Div | AluOp::Mod | AluOp::Sdiv | AluOp::Smod => divide(fb, op, a, b),
        }
    }

    fn movsx(&mut self, width: Width, dst: Reg, src: Reg, bits: u8) {
        let v = self.get(src);
        let narrow = match bits {
            8 => types::I8,
            16 => types::I16,
            _ => I32,
        };
        let n = self.b.ins().ireduce(narrow, v);
        let r = match width {
            Width::W64 => self.b.ins().sextend(I64, n),
            Width::W32 if narrow == I32 => n,
            Width::W32 => self.b.ins().sextend(I32, n),
        };
        self.set_at(dst, r, width);
    }

    fn end(&mut self, kind: EndKind, bits: u8, dst: Reg) {
        let v = self.get(dst);
        let ty = match bits {
            16 => types::I16,
            32 => I32,
            _ => I64,
        };
        let n = if ty == I64 {
            v
        } else {
            self.b.ins().ireduce(ty, v)
        };
        // Every packjit target is little-endian: `le` only truncates.
        let n = match kind {
            EndKind::ToLe => n,
            EndKind::ToBe | EndKind::Swap => self.b.ins().bswap(n),
        };
        let r = if ty == I64 {
            n
        } else {
            self.b.ins().uextend(I64, n)
        };
        self.set(dst, r);
    }

    /// Where an access of `size` at `base + off` (instruction `i`, at `pc`) goes: the base
    /// register and the offset when the access needs no check (trusted code, a constant
    /// offset inside the current frame, or what the front end's access plan proves), else
    /// the checked address with offset 0.
    ///
    /// The check: `[addr, addr + size)` inside the context or the stack block, tested inline;
    /// otherwise [`crate::sandbox::region_check`] tries those and the host regions and, when none
    /// allows it, records the stop, and the function returns (its callers follow, see
    /// `call_local`). Nothing of the instruction has run then. On both paths the address is
    /// then clamped to 0 unless the verdict allowed it, by a `select_spectre_guard` on a
    /// value (never a branch), so a mispredicted check cannot reach memory: 0 plus an
    /// access of at most 8 bytes is in the never-mapped first page.
    fn address(
        &mut self,
        i: usize,
        pc: u32,
        base: Reg,
        off: i16,
        size: Size,
        access: Access,
    ) -> (Value, i32) {
        let check = self.shared.access.check(i);
        self.address_checked_as(check, pc, base, off, size, access)
    }

    /// [`address`](Self::address) with the check `check` (what the access plan says of the
    /// instruction, or `AccessCheck::Unknown` for an access the plan does not describe).
    fn address_checked_as(
        &mut self,
        check: AccessCheck,
        pc: u32,
        base: Reg,
        off: i16,
        size: Size,
        access: Access,
    ) -> (Value, i32) {
        let unchecked = match self.bounds {
            None => true,
            Some(_) => is_frame_constant(base, off, size) || check == AccessCheck::None,
        };
        let p = self.get(base);
        let Some(bounds) = self.bounds.filter(|_| !unchecked) else {
            return (p, off as i32);
        };
        let addr = self.b.ins().iadd_imm_s(p, off as i64);
        let bytes = size.bytes() as i64;
        // The inline test covers the region the access plan expects (both for an unknown
        // base); the out-of-line scan tries every region, so the verdict is exact either way.
        let ok = match check {
            AccessCheck::Stack => self.inside(addr, bounds.stack, bytes),
            AccessCheck::Ctx | AccessCheck::CtxConst { .. } | AccessCheck::CtxIndex { .. } => {
                self.inside(addr, bounds.ctx, bytes)
            }
            _ => {
                let in_ctx = self.inside(addr, bounds.ctx, bytes);
                let in_stack = self.inside(addr, bounds.stack, bytes);
                self.b.ins().bor(in_ctx, in_stack)
            }
        };
        let (slow, stop, cont) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        let verdict = self.b.append_block_param(cont, types::I8);
        self.b
            .ins()
            .brif(ok, cont, &[BlockArg::Value(ok)], slow, NO_ARGS);
        // The slow path: a call, out of the hot code.
        self.b.set_cold_block(slow);
        self.b.switch_to_block(slow);
        let mut sig = Signature::new(self.shared.call_conv);
        sig.params.extend((0..4).map(|_| AbiParam::new(I64)));
        sig.returns.push(AbiParam::new(I64));
        let sig = self.b.import_signature(sig);
        let scan = self.b.ins().iconst(
            I64,
            crate::sandbox::region_check as *const () as usize as i64,
        );
        let write = match access {
            Access::Read => 0,
            Access::Write => PJ_ACCESS_WRITE as i64,
        };
        let desc = self.b.ins().iconst(I64, bytes | write);
        let pcv = self.b.ins().iconst(I64, pc as i64);
        let call = self
            .b
            .ins()
            .call_indirect(sig, scan, &[self.env, addr, desc, pcv]);
        let allowed = self.b.inst_results(call)[0];
        let allowed = self.b.ins().icmp_imm_s(IntCC::NotEqual, allowed, 0);
        self.b
            .ins()
            .brif(allowed, cont, &[BlockArg::Value(allowed)], stop, NO_ARGS);
        self.b.set_cold_block(stop);
        self.b.switch_to_block(stop);
        let z = self.b.ins().iconst(I64, 0);
        self.b.ins().return_(&[z]);
        self.b.switch_to_block(cont);
        let zero = self.b.ins().iconst(I64, 0);
        let safe = self.b.ins().select_spectre_guard(verdict, addr, zero);
        (safe, 0)
    }

    /// `[addr, addr + bytes)` inside the region of `limits`, as an `i8` truth value (see
    /// [`Limits`]).
    fn inside(&mut self, addr: Value, limits: Limits, bytes: i64) -> Value {
        let off = self.b.ins().isub(addr, limits.start);
        self.b
            .ins()
            .icmp(IntCC::UnsignedLessThan, off, limits.limit(bytes))
    }

    /// Charges `charge` to the budget before a back-edge or a call at `pc`: when it exceeds
    /// what is left, the run stops there with `PJ_STOP_BUDGET` and the budget untouched,
    /// as the baseline does. The budget is counted in `env.budget`, so callees and the host
    /// see one count.
    fn charge(&mut self, pc: u32, charge: u64) {
        let f = Self::flags();
        let left = self.b.ins().load(I64, f, self.env, PJ_ENV_BUDGET);
        let short = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, left, charge as i64);
        let (stop, cont) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(short, stop, NO_ARGS, cont, NO_ARGS);
        self.b.set_cold_block(stop);
        self.b.switch_to_block(stop);
        let kind = self.b.ins().iconst(I32, PJ_STOP_BUDGET as i64);
        self.b.ins().store(f, kind, self.env, PJ_ENV_STOP_KIND);
        let pcv = self.b.ins().iconst(I64, pc as i64);
        self.b.ins().store(f, pcv, self.env, PJ_ENV_STOP_PC);
        let z = self.b.ins().iconst(I64, 0);
        self.b.ins().return_(&[z]);
        self.b.switch_to_block(cont);
        let rest = self.b.ins().iadd_imm_s(left, -(charge as i64));
        self.b.ins().store(f, rest, self.env, PJ_ENV_BUDGET);
    }

    /// The budget charge of a taken jump from instruction `from` to `to`, when counted.
    fn back_edge(&self, from: usize, to: usize) -> Option<u64> {
        if !self.shared.mode.counts_budget() {
            return None;
        }
        back_edge_charge(self.shared.prog, from, to)
    }

    /// `dst` = the bytes an `or` assembled, as one load (byte-swapped when they were
    /// assembled in network order), zero-extended as the `or`'s result is.
    fn wide_load(&mut self, dst: Reg, base: Value, w: WideLoad) {
        let f = Self::flags();
        let off = i32::from(w.off);
        let ins = self.b.ins();
        let v = match (w.size, w.order) {
            (Size::DW, ByteOrder::Little) => ins.load(I64, f, base, off),
            (Size::DW, ByteOrder::Big) => {
                let v = ins.load(I64, f, base, off);
                self.b.ins().bswap(v)
            }
            (Size::W, ByteOrder::Little) => ins.uload32(f, base, off),
            (Size::H, ByteOrder::Little) => ins.uload16(I64, f, base, off),
            (size @ (Size::W | Size::H), ByteOrder::Big) => {
                let v = ins.load(narrow(size), f, base, off);
                let v = self.b.ins().bswap(v);
                self.b.ins().uextend(I64, v)
            }
            // One byte has no order (an assembly is at least two; this keeps the match whole).
            (Size::B, _) => ins.uload8(I64, f, base, off),
        };
        self.set(dst, v);
    }

    fn flags() -> MemFlagsData {
        // Trusted code: the host vouches for every address, so no trap metadata; no
        // alignment is promised (eBPF allows unaligned accesses).
        MemFlagsData::new().with_notrap()
    }

    /// The variable of a promoted stack slot, if `base + off` with `size` is one.
    fn slot(&self, base: Reg, off: i16, size: Size) -> Option<Variable> {
        (base == R10).then(|| self.slots.get(&(off, size)).copied())?
    }

    #[allow(clippy::too_many_arguments)]
    fn load(
        &mut self,
        i: usize,
        pc: u32,
        size: Size,
        sign_extend: bool,
        dst: Reg,
        base: Reg,
        off: i16,
    ) {
        let v = match self.slot(base, off, size) {
            // A promoted slot holds its value zero-extended (as `store` leaves it).
            Some(var) => {
                let v = self.b.use_var(var);
                if sign_extend && size != Size::DW {
                    let n = self.b.ins().ireduce(narrow(size), v);
                    self.b.ins().sextend(I64, n)
                } else {
                    v
                }
            }
            None => {
                let (p, o) = self.address(i, pc, base, off, size, Access::Read);
                let f = Self::flags();
                let ins = self.b.ins();
                match (size, sign_extend) {
                    (Size::B, false) => ins.uload8(I64, f, p, o),
                    (Size::B, true) => ins.sload8(I64, f, p, o),
                    (Size::H, false) => ins.uload16(I64, f, p, o),
                    (Size::H, true) => ins.sload16(I64, f, p, o),
                    (Size::W, false) => ins.uload32(f, p, o),
                    (Size::W, true) => ins.sload32(f, p, o),
                    (Size::DW, _) => ins.load(I64, f, p, o),
                }
            }
        };
        self.set(dst, v);
    }

    fn store(&mut self, i: usize, pc: u32, size: Size, base: Reg, off: i16, src: Operand) {
        let v = self.operand(src, Width::W64);
        match self.slot(base, off, size) {
            Some(var) => {
                let v = if size == Size::DW {
                    v
                } else {
                    let n = self.b.ins().ireduce(narrow(size), v);
                    self.b.ins().uextend(I64, n)
                };
                self.b.def_var(var, v);
            }
            None => {
                let (p, o) = self.address(i, pc, base, off, size, Access::Write);
                let f = Self::flags();
                let ins = self.b.ins();
                match size {
                    Size::B => ins.istore8(f, v, p, o),
                    Size::H => ins.istore16(f, v, p, o),
                    Size::W => ins.istore32(f, v, p, o),
                    Size::DW => ins.store(f, v, p, o),
                };
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &mut self,
        i: usize,
        pc: u32,
        size: Size,
        op: AtomicOp,
        fetch: bool,
        base: Reg,
        off: i16,
        src: Reg,
    ) {
        let ty = if size == Size::W { I32 } else { I64 };
        let width = if size == Size::W {
            Width::W32
        } else {
            Width::W64
        };
        // Atomics count as writes.
        let (p, o) = self.address(i, pc, base, off, size, Access::Write);
        let p = self.b.ins().iadd_imm_s(p, o as i64);
        let x = self.reg_at(src, width);
        let f = MemFlagsData::new();
        if op == AtomicOp::Cmpxchg {
            let expected = self.reg_at(0, width);
            let old = self.b.ins().atomic_cas(f, p, expected, x);
            self.set_at(0, old, width);
            return;
        }
        let rmw = match op {
            AtomicOp::Add => AtomicRmwOp::Add,
            AtomicOp::Or => AtomicRmwOp::Or,
            AtomicOp::And => AtomicRmwOp::And,
            AtomicOp::Xor => AtomicRmwOp::Xor,
            AtomicOp::Xchg | AtomicOp::Cmpxchg => AtomicRmwOp::Xchg,
        };
        let old = self.b.ins().atomic_rmw(ty, f, rmw, p, x);
        if fetch || op == AtomicOp::Xchg {
            self.set_at(src, old, width);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn jcond(
        &mut self,
        i: usize,
        pc: u32,
        width: Width,
        cond: Cond,
        dst: Reg,
        src: Operand,
        target: usize,
    ) {
        let c = self.condition(width, cond, dst, src);
        let (t, f) = (self.block_at(target), self.block_at(i + 1));
        let charge = self.back_edge(i, target);
        if let Some(stub) = self.exit_stub(target, charge) {
            self.b.ins().brif(c, stub, NO_ARGS, f, NO_ARGS);
            self.fill_exit_stub(stub);
            return;
        }
        match charge {
            None => {
                self.b.ins().brif(c, t, NO_ARGS, f, NO_ARGS);
            }
            // Taken, the back-edge pays first.
            Some(charge) => {
                let pay = self.b.create_block();
                self.b.ins().brif(c, pay, NO_ARGS, f, NO_ARGS);
                self.b.switch_to_block(pay);
                self.charge(pc, charge);
                self.b.ins().jump(t, NO_ARGS);
            }
        }
    }

    /// Whether a conditional jump `dst cond src` at `width` is taken, as an `i8` truth value.
    fn condition(&mut self, width: Width, cond: Cond, dst: Reg, src: Operand) -> Value {
        let a = self.reg_at(dst, width);
        let b = self.operand(src, width);
        match cond {
            Cond::Set => {
                let m = self.b.ins().band(a, b);
                self.b.ins().icmp_imm_s(IntCC::NotEqual, m, 0)
            }
            _ => self.b.ins().icmp(int_cc(cond), a, b),
        }
    }

    /// The conditional jump at `k` (from the function's start) and its fall-through arm as
    /// selects ([`select`]): the arm runs unconditionally, then each register it wrote
    /// takes its value from before the arm when the jump is taken. Ends by jumping to the
    /// target when a `ja` closes the arm; otherwise the block falls into the target.
    fn select_arm(&mut self, k: usize, arm: Arm) -> Result<(), CompileError> {
        let insts = &self.shared.prog.insts[self.start..];
        let Op::Jcond {
            width,
            cond,
            dst,
            src,
            target,
        } = insts[k].op
        else {
            return Err(CompileError::new(
                ErrorKind::Internal,
                format!(
                    "optimized tier: pc {}: an arm planned after an instruction that is no \
                     conditional jump",
                    insts[k].pc
                ),
            ));
        };
        let taken = self.condition(width, cond, dst, src);
        let mut before = [None; select::MAX_ARM];
        for (slot, &r) in before.iter_mut().zip(arm.regs()) {
            *slot = Some(self.get(r));
        }
        for (j, &inst) in insts.iter().enumerate().take(arm.end).skip(k + 1) {
            self.b.set_srcloc(SourceLoc::new(inst.pc));
            self.at = j;
            self.written_here = 0;
            self.inst(self.start + j, inst.pc, &inst.op)?;
        }
        for (old, &r) in before.iter().zip(arm.regs()) {
            let old = old.expect("read above");
            let new = self.get(r);
            let v = self.b.ins().select(taken, old, new);
            self.set(r, v);
        }
        if arm.closed_by_jump {
            self.b.set_srcloc(SourceLoc::new(insts[arm.end].pc));
            let t = self.block_at(target as usize);
            self.b.ins().jump(t, NO_ARGS);
        }
        Ok(())
    }

    /// A run of compares lifted as one membership test ([`bitset`]): to `taken` when the
    /// value is below 64 and its bit of the members is set. The range test branches first,
    /// as LLVM's bit tests do: the values a scan meets most (letters, in `words`) lie past
    /// every member and leave after one compare, where a branch-free range test costs the
    /// mask, the shift and a select on every value.
    fn set_test(&mut self, t: SetTest) {
        let x = self.reg_at(t.reg, t.width);
        let (taken, other) = (self.block_at(t.taken), self.block_at(t.other));
        let in_range = self.b.ins().icmp_imm_s(IntCC::UnsignedLessThan, x, 64);
        let test = self.b.create_block();
        self.b.ins().brif(in_range, test, NO_ARGS, other, NO_ARGS);
        self.b.switch_to_block(test);
        let members = self.b.ins().iconst(I64, t.members as i64);
        let shifted = self.b.ins().ushr(members, x);
        let bit = self.b.ins().band_imm_u(shifted, 1);
        self.b.ins().brif(bit, taken, NO_ARGS, other, NO_ARGS);
    }

    fn helper_sig(&mut self) -> SigRef {
        if let Some(s) = self.helper_sig {
            return s;
        }
        let mut sig = Signature::new(self.shared.call_conv);
        sig.params.extend((0..5).map(|_| AbiParam::new(I64)));
        sig.returns.push(AbiParam::new(I64));
        let s = self.b.import_signature(sig);
        self.helper_sig = Some(s);
        s
    }

    /// r0 = the helper at `addr`(r1, .., r5). r1–r5 keep their values (the interpreter's
    /// choice; the ABI says they are clobbered, so programs do not read them).
    fn call_at(&mut self, addr: Value) {
        let sig = self.helper_sig();
        let args: Vec<Value> = (1..=5).map(|r| self.get(r)).collect();
        let call = self.b.ins().call_indirect(sig, addr, &args);
        let r0 = self.b.inst_results(call)[0];
        self.set(0, r0);
        if self.shared.mode.sandboxed() {
            // As the baseline: a helper may leave host addresses in r1-r5, and eBPF leaves
            // them undefined, so sandboxed code sees zeroes.
            let z = self.b.ins().iconst(I64, 0);
            for r in 1..=5 {
                self.set(r, z);
            }
        }
    }

    fn call_helper(&mut self, pc: u32, id: u32) -> Result<(), CompileError> {
        if let Some(&(_, array)) = self.shared.arrays.iter().find(|a| a.0 == id) {
            return self.array_lookup(pc, array);
        }
        if let (true, Some(runner)) = (
            self.shared.tail_calls.contains(&id),
            self.shared.tail_runner,
        ) {
            self.tail_call(runner);
            return Ok(());
        }
        let Some(&(_, addr)) = self.shared.helpers.iter().find(|h| h.0 == id) else {
            return Err(CompileError::at(
                pc as usize,
                ErrorKind::UnknownHelper,
                format!("unknown helper id {id}"),
            ));
        };
        let addr = self.b.ins().iconst(I64, addr as i64);
        self.call_at(addr);
        Ok(())
    }

    /// A tail call (either form), through the runtime's runner, as the baseline's tail calls
    /// inside bpf-to-bpf functions: Cranelift's frames are not the baseline's uniform one a
    /// tail jump continues past, so the target's whole entry runs nested, on the run's `env`
    /// (the runner saves and restores what the entry overwrites, and counts the chain). Its
    /// answer: fell through (r0 = 0, on with the next instruction, as the kernel's failed
    /// tail call), returned (the target's r0 is this function's result: return it, as the
    /// target's `exit` returns to this function's caller), or stopped (return; the stop in
    /// `env` ends the run, as every stop does: callers test it after each local call).
    fn tail_call(&mut self, runner: u64) {
        let addr = self.b.ins().iconst(I64, runner as i64);
        self.call_at(addr);
        let answer = self.get(0);
        let (not_through, returned, stopped, on) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        let through =
            self.b
                .ins()
                .icmp_imm_s(IntCC::Equal, answer, PJ_CALLEE_TAIL_FELL_THROUGH as i64);
        self.b
            .ins()
            .brif(through, on, NO_ARGS, not_through, NO_ARGS);
        self.b.switch_to_block(not_through);
        let ret = self
            .b
            .ins()
            .icmp_imm_s(IntCC::Equal, answer, PJ_CALLEE_TAIL_RETURNED as i64);
        self.b.ins().brif(ret, returned, NO_ARGS, stopped, NO_ARGS);
        self.b.switch_to_block(returned);
        let r0 = self
            .b
            .ins()
            .load(I64, Self::flags(), self.env, PJ_ENV_CALLEE_TAIL_R0);
        self.b.ins().return_(&[r0]);
        self.b.set_cold_block(stopped);
        self.b.switch_to_block(stopped);
        let z = self.b.ins().iconst(I64, 0);
        self.b.ins().return_(&[z]);
        self.b.switch_to_block(on);
        // Fell through: r0 = 0, which the answer is.
        let z = self.b.ins().iconst(I64, 0);
        self.set(0, z);
    }

    /// An array map lookup inlined, as the kernel's `map_gen_lookup` (and the baseline):
    /// r0 = `base + key * stride` for the `u32` key at r2, or NULL when `key >= max_entries`.
    /// The NULL comes from a select, not a branch, so no mispredicted bound indexes past the
    /// array (sandboxed, Cranelift's `select_spectre_guard` keeps it a conditional move). The
    /// key is read like a program load: checked in sandboxed code, where no access plan
    /// describes it. A per-CPU array calls the per-CPU lookup with r1 = its id, r2 = the key.
    fn array_lookup(&mut self, pc: u32, array: ArrayLookup) -> Result<(), CompileError> {
        let (p, o) = self.address_checked_as(AccessCheck::Unknown, pc, 2, 0, Size::W, Access::Read);
        let key = self.b.ins().uload32(Self::flags(), p, o);
        if let Some(id) = array.percpu_id {
            let Some(&(_, addr)) = self
                .shared
                .helpers
                .iter()
                .find(|h| h.0 == PJ_HELPER_PERCPU_LOOKUP)
            else {
                return Err(CompileError::at(
                    pc as usize,
                    ErrorKind::UnknownHelper,
                    format!(
                        "per-CPU array lookup needs helper id {PJ_HELPER_PERCPU_LOOKUP:#x} in the helper table"
                    ),
                ));
            };
            let id = self.b.ins().iconst(I64, i64::from(id));
            self.set(1, id);
            self.set(2, key);
            let addr = self.b.ins().iconst(I64, addr as i64);
            self.call_at(addr);
            return Ok(());
        }
        // The key is zero-extended and the bound below 2^32: a sign-extended immediate is
        // the same compare.
        let found =
            self.b
                .ins()
                .icmp_imm_s(IntCC::UnsignedLessThan, key, i64::from(array.max_entries));
        let offset = self.b.ins().imul_imm_s(key, array.value_stride as i64);
        let element = self.b.ins().iadd_imm_s(offset, array.base as i64);
        let zero = self.b.ins().iconst(I64, 0);
        let r0 = if self.shared.mode.sandboxed() {
            self.b.ins().select_spectre_guard(found, element, zero)
        } else {
            self.b.ins().select(found, element, zero)
        };
        self.set(0, r0);
        // r1-r5 as after a call: undefined to the program; sandboxed code sees zeroes, as
        // after every call, so no host address lingers in them.
        if self.shared.mode.sandboxed() {
            for r in 1..=5 {
                self.set(r, zero);
            }
        }
        Ok(())
    }

    /// `callx`: the address chosen among the registered helpers by a chain of selects (one
    /// call site); an id none has stops the run with `PJ_STOP_UNKNOWN_CALLX`, as the
    /// baseline does: the stop fields are written and every frame returns.
    fn call_reg(&mut self, pc: u32, reg: Reg) {
        let id = self.get(reg);
        let mut addr = self.b.ins().iconst(I64, 0);
        for k in 0..self.shared.helpers.len() {
            let (hid, haddr) = self.shared.helpers[k];
            let hit = self.b.ins().icmp_imm_s(IntCC::Equal, id, hid as i64);
            let a = self.b.ins().iconst(I64, haddr as i64);
            addr = self.b.ins().select(hit, a, addr);
        }
        let (call, stop) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(addr, call, NO_ARGS, stop, NO_ARGS);
        self.b.switch_to_block(stop);
        let f = Self::flags();
        let kind = self.b.ins().iconst(I32, PJ_STOP_UNKNOWN_CALLX as i64);
        self.b.ins().store(f, kind, self.env, PJ_ENV_STOP_KIND);
        let pcv = self.b.ins().iconst(I64, pc as i64);
        self.b.ins().store(f, pcv, self.env, PJ_ENV_STOP_PC);
        self.b.ins().store(f, id, self.env, PJ_ENV_STOP_ADDR);
        let z = self.b.ins().iconst(I64, 0);
        self.b.ins().return_(&[z]);
        self.b.switch_to_block(call);
        self.call_at(addr);
    }

    /// A bpf-to-bpf call: a direct call of the callee's own Cranelift function (its own
    /// frame); r6–r9 are the caller's variables, so they survive by construction.
    fn call_local(&mut self, target: usize) {
        let callee = self.shared.prog.subprog_of(target);
        let func = match self.locals.get(&callee) {
            Some(&f) => f,
            None => {
                let sig = self.shared.signature(callee);
                let sig = self.b.import_signature(sig);
                let name = self
                    .b
                    .func
                    .declare_imported_user_function(UserExternalName::new(0, callee as u32));
                let f = self.b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature: sig,
                    colocated: true,
                    patchable: false,
                });
                self.locals.insert(callee, f);
                f
            }
        };
        let mut args: Vec<Value> = (1..=5).map(|r| self.get(r)).collect();
        if self.shared.mode.sandboxed() {
            // The callee's frame is the next one down the block.
            let r10 = self.b.ins().iadd_imm_s(self.r10, -(STACK_SIZE as i64));
            args.push(r10);
        }
        args.push(self.env);
        let call = self.b.ins().call(func, &args);
        let r0 = self.b.inst_results(call)[0];
        self.set(0, r0);
        if self.shared.may_stop {
            // The callee stopped the run: leave this frame too.
            let kind = self
                .b
                .ins()
                .uload32(Self::flags(), self.env, PJ_ENV_STOP_KIND);
            let (ret, cont) = (self.b.create_block(), self.b.create_block());
            self.b.ins().brif(kind, ret, NO_ARGS, cont, NO_ARGS);
            self.b.switch_to_block(ret);
            let z = self.b.ins().iconst(I64, 0);
            self.b.ins().return_(&[z]);
            self.b.switch_to_block(cont);
        }
    }
}

/// The direction of a checked access (an atomic is a write).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// The shift amount `amount` with a mask the shift makes anyway taken off: for `x << (y &
/// 63)` (clang's `1ULL << (j % 64)`), `y`. Cranelift's shifts take their amount modulo the
/// width, as eBPF's do, so a mask keeping every bit of that residue changes nothing; left
/// in, it is a copy and an `and` in the loop, which Cranelift's own rules do not remove.
fn unmasked_shift_amount(fb: &mut FunctionBuilder<'_>, amount: Value) -> Value {
    let dfg = &fb.func.dfg;
    let width_mask = i64::from(dfg.value_type(amount).bits()) - 1;
    let ir::ValueDef::Result(and, _) = dfg.value_def(amount) else {
        return amount;
    };
    let ir::InstructionData::Binary {
        opcode: ir::Opcode::Band,
        args: [y, mask],
    } = dfg.insts[and]
    else {
        return amount;
    };
    match constant_of(fb, mask) {
        Some(m) if m & width_mask == width_mask => y,
        _ => amount,
    }
}

/// `a op b` for a division or remainder, with eBPF's fixed results made explicit: `x / 0 =
/// 0`, `x % 0 = x`, and for the signed ones `x / -1 = -x` (wrapping) and `x % -1 = 0`.
/// Cranelift's divisions trap on those divisors, so they divide by 1 instead and the fixed
/// result is selected after. The signed ones find both divisors with one unsigned compare
/// (`b + 1 <u 2`): the test sits before every division in a loop, and two compares and an
/// `or` there kept the optimized `signed` peer well behind the baseline's two predicted
/// branches. (A branch to a cold block in place of the divisor's select measured slower:
/// Cranelift then spilled the loop's sums.) With a constant divisor the selects fold away
/// and the division is Cranelift's multiply-by-reciprocal.
fn divide(fb: &mut FunctionBuilder<'_>, op: AluOp, a: Value, b: Value) -> Value {
    let ty = fb.func.dfg.value_type(a);
    let signed = matches!(op, AluOp::Sdiv | AluOp::Smod);
    let fixed = if signed {
        // b is 0 or -1 exactly when b + 1 (wrapping) is 1 or 0.
        let next = fb.ins().iadd_imm_s(b, 1);
        fb.ins().icmp_imm_u(IntCC::UnsignedLessThan, next, 2)
    } else {
        fb.ins().icmp_imm_s(IntCC::Equal, b, 0)
    };
    let one = fb.ins().iconst(ty, 1);
    let divisor = fb.ins().select(fixed, one, b);
    let zero = fb.ins().iconst(ty, 0);
    let (q, fixed_result) = match op {
        AluOp::Div => (fb.ins().udiv(a, divisor), zero),
        AluOp::Mod => (fb.ins().urem(a, divisor), a),
        _ => {
            let by_zero = fb.ins().icmp_imm_s(IntCC::Equal, b, 0);
            if op == AluOp::Sdiv {
                let neg = fb.ins().ineg(a);
                let fixed_result = fb.ins().select(by_zero, zero, neg);
                (fb.ins().sdiv(a, divisor), fixed_result)
            } else {
                let fixed_result = fb.ins().select(by_zero, a, zero);
                (fb.ins().srem(a, divisor), fixed_result)
            }
        }
    };
    fb.ins().select(fixed, fixed_result, q)
}

/// The constant of an `iconst`, if `v` is one.
fn constant_of(fb: &FunctionBuilder<'_>, v: Value) -> Option<i64> {
    let ir::ValueDef::Result(inst, _) = fb.func.dfg.value_def(v) else {
        return None;
    };
    match fb.func.dfg.insts[inst] {
        ir::InstructionData::UnaryImm {
            opcode: ir::Opcode::Iconst,
            imm,
        } => Some(imm.bits()),
        _ => None,
    }
}

/// `(x >> k) & mask` where the mask keeps every bit the shift left but the low `s` (1 to
/// 3), as `(x >> (k + s)) << s`. clang's byte offset of `words[j / 64]` is `(j >> 3) &
/// 0x1ffffffffffffff8`; in this form the address takes the `<< 3` as its scale, as in
/// LLVM's code, instead of an `and` with a 64-bit mask from the constant pool.
fn scaled_index(fb: &mut FunctionBuilder<'_>, a: Value, b: Value) -> Option<Value> {
    if fb.func.dfg.value_type(a) != I64 {
        return None;
    }
    let mask = constant_of(fb, b)? as u64;
    let ir::ValueDef::Result(shift, _) = fb.func.dfg.value_def(a) else {
        return None;
    };
    let ir::InstructionData::Binary {
        opcode: ir::Opcode::Ushr,
        args: [x, amount],
    } = fb.func.dfg.insts[shift]
    else {
        return None;
    };
    let k = constant_of(fb, amount)?;
    if !(1..61).contains(&k) {
        return None;
    }
    let s = (1..=3).find(|&s| mask == (u64::MAX >> k) & !((1u64 << s) - 1))?;
    let index = fb.ins().ushr_imm_u(x, k + s);
    Some(fb.ins().ishl_imm_u(index, s))
}

fn narrow(size: Size) -> Type {
    match size {
        Size::B => types::I8,
        Size::H => types::I16,
        Size::W => I32,
        Size::DW => I64,
    }
}

fn int_cc(cond: Cond) -> IntCC {
    match cond {
        Cond::Eq => IntCC::Equal,
        Cond::Ne => IntCC::NotEqual,
        Cond::Gt => IntCC::UnsignedGreaterThan,
        Cond::Ge => IntCC::UnsignedGreaterThanOrEqual,
        Cond::Lt => IntCC::UnsignedLessThan,
        Cond::Le => IntCC::UnsignedLessThanOrEqual,
        Cond::Sgt => IntCC::SignedGreaterThan,
        Cond::Sge => IntCC::SignedGreaterThanOrEqual,
        Cond::Slt => IntCC::SignedLessThan,
        Cond::Sle => IntCC::SignedLessThanOrEqual,
        Cond::Set => unreachable!("jset is a band and a test"),
    }
}

/// Refuses a tail call the runner cannot take: without a runner in the table, or in a
/// program whose call chains are deeper than the baseline allows a nested target
/// ([`MAX_TAIL_CALLING_DEPTH`]): here every tail call nests its target on the native stack,
/// the entry's too, so the bound holds for all of them.
fn check_tail_calling(prog: &Program, pc: usize, runner: Option<u64>) -> Result<(), CompileError> {
    if runner.is_none() {
        return Err(CompileError::at(
            pc,
            ErrorKind::Unsupported,
            format!(
                "optimized tier: tail call without a runner in the helper table (helper id {PJ_HELPER_CALLEE_TAIL_CALL:#x})"
            ),
        ));
    }
    if prog.call_depth > MAX_TAIL_CALLING_DEPTH {
        return Err(CompileError::at(
            pc,
            ErrorKind::Unsupported,
            format!(
                "optimized tier: tail call in a program whose call chains are {} frames deep: at most {MAX_TAIL_CALLING_DEPTH} (each target runs on top of its callers' frames)",
                prog.call_depth
            ),
        ));
    }
    Ok(())
}

fn unsupported(pc: u32, what: &str) -> CompileError {
    CompileError::at(
        pc as usize,
        ErrorKind::Unsupported,
        format!("optimized tier: {what} not supported yet"),
    )
}
