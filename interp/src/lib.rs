//! # packjit-interp
//!
//! packjit's RFC 9669 (cpu v4) interpreter. It runs a verified [`packjit_frontend::Program`]
//! (so [`Interpreter::load`] is `packjit_frontend::decode`, the same verifier every backend
//! runs) under the JIT backends' sandbox contract (`docs/ARCHITECTURE.md`, "Sandbox
//! contract"):
//!
//! * **Memory.** A load, store or atomic of `size` bytes at `addr` is allowed when
//!   `[addr, addr + size)` lies inside one of: the context `[ctx, ctx + len)` (read-write),
//!   the program's stack block (read-write), or a host region ([`PjMemRegion`], read-only
//!   unless `PJ_REGION_WRITABLE`). Atomics count as writes. Anything else stops the program
//!   with [`Stop::OutOfBounds`] before any byte is touched. An interpreter has no reason to
//!   skip the check, so there is no unchecked mode: trusted callers get the same answers,
//!   and an access a trusted JIT would have made at a wild address is reported instead.
//! * **Stack block.** One host allocation, zeroed at entry; the entry's r10 is its end.
//!   Addresses are real host addresses, so pointer arithmetic, comparisons and round trips
//!   through memory behave as they do natively (only the absolute values differ from run to
//!   run). Its layout is the interpreter's [`FrameLayout`]:
//!   * [`FrameLayout::Separate`] (the default): `analysis::stack_block_size(prog)` bytes; a
//!     callee's r10 is its caller's minus 512, so frame `k` is `[end - 512 (k + 1), end -
//!     512 k)`, as in the emitted code.
//!   * [`FrameLayout::Packed`]: rbpf's interpreter's layout, [`STACK_SIZE`] bytes shared by
//!     every frame; a callee's r10 is its caller's minus the *caller's* stack usage, so
//!     frames that use little nest deeply and a chain that uses too much runs off the bottom
//!     of the block, where its accesses stop like any other out-of-bounds access.
//! * **Registers.** r1 = context address (0 for an empty context), r2 = its length,
//!   r10 = stack block end, r0 and r3–r9 zero.
//! * **Budget.** With a budget, a taken jump charges `analysis::back_edge_charge` and a
//!   bpf-to-bpf call charges `analysis::CALL_CHARGE` *before* it is taken; a charge larger than
//!   what is left stops at the jump's (or call's) pc with [`Stop::Budget`], the budget
//!   unchanged.
//! * **`callx`** to an id with no helper stops with [`Stop::UnknownCallx`] (pc and id).
//! * **Legacy packet loads** (`LD_ABS`/`LD_IND`, `packjit_frontend::packet`): r0 = the
//!   `size` bytes at `RawEnv::ctx_start` + the index register + the `u32` offset, in the
//!   host's byte order, zero-extended, checked like any load; r1-r5 are kept.
//!
//! [`Stop`] is `packjit_plugin_api::Stop`, re-exported: the type the runtime reports when JIT
//! code stops, so the two are compared directly.
//!
//! ```
//! use packjit_interp::{Interpreter, Stop};
//! // r0 = *(u32 *)(r1 + 0); exit
//! let code = [0x61, 0x10, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
//! let vm = Interpreter::new();
//! let prog = vm.load(&code).unwrap();
//! let mut ctx = 0x1234_5678u32.to_le_bytes();
//! assert_eq!(vm.run(&prog, &mut ctx, None).unwrap().r0, 0x1234_5678);
//! // Three context bytes are too few for a 4-byte load: a stop at pc 0, nothing read.
//! let stop = vm.run(&prog, &mut ctx[..3], None).unwrap_err();
//! assert!(matches!(stop, Stop::OutOfBounds { pc: 0, size: 4, write: false, .. }));
//! ```

use packjit_frontend::analysis::{
    back_edge_charge, helper_lowering, stack_block_size, HelperCode, HelperLowering, InlineHelper,
    CALL_CHARGE,
};
use packjit_frontend::{AluOp, AtomicOp, EndKind, Op, Operand, Program, Size, Width, STACK_SIZE};
use packjit_plugin_api::{
    CompileError, HelperEntry, PjClockScale, PjMemRegion, PjPerCpuArray, PjPerCpuTable,
    PJ_HELPER_GET_SMP_PROCESSOR_ID, PJ_HELPER_LOOKUP_VALUES, PJ_HELPER_PERCPU_OFFSET,
    PJ_HELPER_STATIC_REGIONS, PJ_PERCPU_ARRAYS, PJ_PERCPU_ARRAY_SIZE, PJ_REGION_WRITABLE,
};
pub use packjit_plugin_api::{Stop, StopKind};
use std::collections::BTreeMap;
use std::fmt;

pub mod hw;

/// A helper: the same `extern "C"` functions the JIT code calls.
pub type HelperFn = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;

/// The result of a run that reached its final `exit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Final r0.
    pub r0: u64,
    /// Instructions executed (an `lddw` counts once).
    pub insns: u64,
    /// Budget left, when the run had one.
    pub budget_left: Option<u64>,
}

/// Words left unowned on each side of a run's stack block. The block is a heap allocation,
/// so without them it could lie right after the context (or any buffer a host hands in),
/// and a program's access a few bytes past the context's end would land in its own stack
/// and pass, where the same program under the JIT, whose stack is the thread's, stops.
/// 32 KiB covers any 16-bit offset from a pointer at a buffer's edge. The gaps are never
/// initialised or touched, so they cost an allocation's address space, not its zeroing.
const STACK_GAP_WORDS: usize = (32 << 10) / 8;

/// Uninitialised words for a run's stack block and its gaps.
type StackBacking = Box<[std::mem::MaybeUninit<u64>]>;

thread_local! {
    /// The last run's stack backing on this thread, for the next run: the gapped block is
    /// too large for the allocator's fast per-thread cache, and allocating it for every run
    /// cost more than a short program's whole run. A nested run (from a helper) finds it
    /// taken and allocates its own.
    static SPARE_STACK: std::cell::Cell<Option<StackBacking>> = const { std::cell::Cell::new(None) };
}

/// A stack backing of at least `words`: this thread's spare when it is large enough.
fn take_stack_backing(words: usize) -> StackBacking {
    SPARE_STACK
        .try_with(|s| s.take())
        .ok()
        .flatten()
        .filter(|b| b.len() >= words)
        .unwrap_or_else(|| Box::new_uninit_slice(words))
}

/// Keeps `backing` for this thread's next run (what it held is zeroed again before use).
fn keep_stack_backing(backing: StackBacking) {
    let _ = SPARE_STACK.try_with(|s| s.set(Some(backing)));
}

/// The memory a run may touch besides its own stack block, and its budget.
///
/// All addresses are host addresses: the interpreter reads and writes them directly once the
/// access is inside one of them. Building one is safe; running with one is `unsafe`
/// ([`Interpreter::run_raw`]) because the interpreter cannot know the memory is live.
#[derive(Clone, Copy, Debug)]
pub struct RawEnv<'a> {
    /// r1 at entry.
    pub r1: u64,
    /// r2 at entry.
    pub r2: u64,
    /// The context region `[ctx_start, ctx_end)`, read-write (may be empty).
    pub ctx_start: u64,
    /// One past the context's last byte.
    pub ctx_end: u64,
    /// Host regions (read-only unless `PJ_REGION_WRITABLE`).
    pub regions: &'a [PjMemRegion],
    /// Instruction budget (`None`: unlimited).
    pub budget: Option<u64>,
}

/// How a run lays out the frames of bpf-to-bpf calls in its stack block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FrameLayout {
    /// Every frame has [`STACK_SIZE`] bytes of its own: a callee's r10 is its caller's minus
    /// [`STACK_SIZE`], and the block holds the deepest call chain
    /// (`analysis::stack_block_size`). The layout of the JIT backends' code, so an
    /// interpreted run and a native one agree.
    #[default]
    Separate,
    /// rbpf's interpreter's layout: one block of [`STACK_SIZE`] bytes for every frame. A
    /// callee's r10 is its caller's minus the stack usage of the function making the call,
    /// and goes back up when the callee exits. Nothing checks the usages at a call: a chain
    /// whose usages add up past [`STACK_SIZE`] gives its callee an r10 at or below the
    /// block's start, and the callee's stack accesses then stop out of bounds (unless they
    /// land in another region the run may touch, as in rbpf). A usage of zero gives the
    /// callee its caller's r10 (the frames overlap), and one that is not a multiple of 8
    /// leaves r10 unaligned (accesses may be unaligned): both run, as in rbpf.
    Packed {
        /// Bytes of stack the function whose first instruction is at slot `pc` (the key)
        /// uses. Keys that start no function are not read.
        usage: BTreeMap<usize, u32>,
        /// Bytes for a function `usage` does not name (rbpf's default is 256).
        default: u32,
    },
}

impl FrameLayout {
    /// How far below its caller's r10 a callee's r10 lies, for a call made from instruction
    /// index `at` of `prog`.
    fn call_step(&self, prog: &Program, at: usize) -> u64 {
        match self {
            FrameLayout::Separate => STACK_SIZE as u64,
            FrameLayout::Packed { usage, default } => {
                // The function containing the call: the last subprogram starting at or
                // before it (the verifier keeps every branch inside its subprogram, so this
                // is also the function whose entry the run last passed at this depth).
                let f = prog.subprogs.partition_point(|s| s.start <= at);
                let start = prog.subprogs[f.saturating_sub(1)].start;
                let pc = prog.insts[start].pc as usize;
                u64::from(usage.get(&pc).copied().unwrap_or(*default))
            }
        }
    }

    /// Bytes of the stack block a run of `prog` gets.
    fn block_size(&self, prog: &Program) -> usize {
        match self {
            FrameLayout::Separate => stack_block_size(prog),
            FrameLayout::Packed { .. } => STACK_SIZE,
        }
    }
}

/// The interpreter: a helper table and a [`FrameLayout`]. Cheap to clone, `Send + Sync`.
#[derive(Clone, Default)]
pub struct Interpreter {
    /// Entries as a compile request carries them: plain calls and inlined helpers alike.
    helpers: BTreeMap<u32, HelperEntry>,
    /// How calls lay out their frames.
    frames: FrameLayout,
}

impl fmt::Debug for Interpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interpreter")
            .field("helpers", &self.helpers.keys().collect::<Vec<_>>())
            .field("frames", &self.frames)
            .finish()
    }
}

struct Frame {
    ret: usize,
    saved: [u64; 4],
    r10: u64,
}

impl Interpreter {
    /// An interpreter with no helpers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) helper `id`.
    pub fn with_helper(mut self, id: u32, f: HelperFn) -> Self {
        self.set_helper(id, f);
        self
    }

    /// This interpreter with frames laid out as `frames` (the default is
    /// [`FrameLayout::Separate`]).
    pub fn with_frame_layout(mut self, frames: FrameLayout) -> Self {
        self.frames = frames;
        self
    }

    /// The frame layout runs use.
    pub fn frame_layout(&self) -> &FrameLayout {
        &self.frames
    }

    /// Registers (or replaces) helper `id` in place.
    pub fn set_helper(&mut self, id: u32, f: HelperFn) {
        self.helpers.insert(
            id,
            HelperEntry {
                id,
                inline_kind: 0,
                addr: f as usize as u64,
            },
        );
    }

    /// Builds an interpreter from a runtime-style helper table: addresses of
    /// `extern "C" fn(u64, u64, u64, u64, u64) -> u64`, or inlined helpers (`PJ_INLINE_*`),
    /// which the interpreter evaluates the way the backends' code does (see [`hw`]). The
    /// first entry for an id wins, as in a compile request.
    ///
    /// # Safety
    /// Every plain `addr` must be such a function, callable for as long as the interpreter
    /// is used; an inline entry's parameter must be what its kind promises (a thread-pointer
    /// offset of a live `struct rseq` `cpu_id` in every thread that runs programs, a
    /// `PjClockScale` that outlives the interpreter).
    pub unsafe fn from_helper_table(table: &[HelperEntry]) -> Self {
        let mut helpers = BTreeMap::new();
        for h in table {
            helpers.entry(h.id).or_insert(*h);
        }
        Self {
            helpers,
            frames: FrameLayout::Separate,
        }
    }

    /// The helper table in the form `packjit_frontend::decode` and a compile request take
    /// (real function addresses, and inline entries as given).
    pub fn helper_table(&self) -> Vec<HelperEntry> {
        self.helpers.values().copied().collect()
    }

    /// Calls (or evaluates, when inlined) helper `id`; `None` when none is registered.
    fn call_helper(&self, id: u64, args: [u64; 5]) -> Option<u64> {
        // The per-CPU table entry describes the per-CPU mov; it is not callable.
        if id == u64::from(PJ_HELPER_PERCPU_OFFSET)
            || id == u64::from(PJ_HELPER_STATIC_REGIONS)
            || id == u64::from(PJ_HELPER_LOOKUP_VALUES)
        {
            return None;
        }
        let h = self.helpers.get(&u32::try_from(id).ok()?)?;
        let code = match helper_lowering(h) {
            HelperLowering::Code(code) => code,
            // Array lookups read their key as a program load (`run_inner`); `load` refused
            // tail calls.
            HelperLowering::ArrayLookup(_)
            | HelperLowering::TailCall { .. }
            | HelperLowering::ProgArrayTailCall(_) => return None,
        };
        Some(match code {
            HelperCode::Call(addr) => {
                // SAFETY: `set_helper` stores real functions; `from_helper_table`'s caller
                // promised every plain address is one. What they do with their arguments is
                // the host's business, as in the JIT.
                let f = unsafe { std::mem::transmute::<usize, HelperFn>(addr as usize) };
                // SAFETY: as above.
                unsafe { f(args[0], args[1], args[2], args[3], args[4]) }
            }
            HelperCode::Inline(InlineHelper::RseqCpuId { offset }) => {
                // SAFETY: `from_helper_table`'s caller promised the offset names a live rseq
                // area.
                u64::from(unsafe { hw::rseq_cpu_id(offset) })
            }
            HelperCode::Inline(InlineHelper::PerCpuLookup { table }) => {
                // SAFETY: promised by `from_helper_table`'s caller: a live table whose
                // `count` arrays follow the header, and a live rseq area at its offset.
                unsafe {
                    let hdr = &*(table as *const PjPerCpuTable);
                    if args[0] >= hdr.count {
                        0
                    } else {
                        let at = table as usize
                            + PJ_PERCPU_ARRAYS as usize
                            + args[0] as usize * PJ_PERCPU_ARRAY_SIZE as usize;
                        let arr = &*(at as *const PjPerCpuArray);
                        arr.lookup(u64::from(hw::rseq_cpu_id(hdr.cpu_id_offset)), args[1])
                    }
                }
            }
            HelperCode::Inline(InlineHelper::CounterClock { scale }) => {
                // SAFETY: promised by `from_helper_table`'s caller: a live PjClockScale.
                let scale = unsafe { &*(scale as *const PjClockScale) };
                scale.apply(hw::read_counter())
            }
        })
    }

    /// The layout of helper `id` when it is an inlined array lookup.
    fn array_lookup(&self, id: u32) -> Option<packjit_frontend::analysis::ArrayLookup> {
        match helper_lowering(self.helpers.get(&id)?) {
            HelperLowering::ArrayLookup(a) => Some(a),
            _ => None,
        }
    }

    /// Refuses what the interpreter cannot run: a tail call continues in another program's
    /// JIT code, which an interpreted run does not have.
    fn refuse_tail_calls(&self, prog: Program) -> Result<Program, CompileError> {
        for inst in &prog.insts {
            if let Op::CallHelper { id } = inst.op {
                let lowering = self.helpers.get(&id).map(helper_lowering);
                if let Some(
                    HelperLowering::TailCall { .. } | HelperLowering::ProgArrayTailCall(_),
                ) = lowering
                {
                    return Err(CompileError::new(
                        packjit_plugin_api::ErrorKind::Unsupported,
                        format!(
                            "pc {}: tail call (helper {id}): the interpreter runs no tail calls (they continue in JIT code)",
                            inst.pc
                        ),
                    ));
                }
            }
        }
        Ok(prog)
    }

    /// Verifies `code` against this helper table (`packjit_frontend::decode`): the same
    /// rejections, with the same messages, as every JIT backend.
    pub fn load(&self, code: &[u8]) -> Result<Program, CompileError> {
        self.refuse_tail_calls(packjit_frontend::decode(code, &self.helper_table())?)
    }

    /// [`load`](Self::load) with the encodings a request's `PJ_COMPILE_*` `flags` opt into
    /// (`PJ_COMPILE_PERCPU_INSN`: the per-CPU mov).
    pub fn load_with_flags(&self, code: &[u8], flags: u32) -> Result<Program, CompileError> {
        self.refuse_tail_calls(packjit_frontend::decode_with(
            code,
            &self.helper_table(),
            packjit_frontend::DecodeOptions::from_flags(flags),
        )?)
    }

    /// `src + cpu * slot_size` of per-CPU array `array`, or `src` (see `Op::MovPerCpu`); the
    /// CPU comes from helper 8 as the backends' code gets it (an unset helper 8 counts as an
    /// out-of-range CPU).
    fn percpu_address(&self, src: u64, array: u64) -> u64 {
        let Some(t) = self.helpers.get(&PJ_HELPER_PERCPU_OFFSET) else {
            return src;
        };
        let cpu = self
            .call_helper(PJ_HELPER_GET_SMP_PROCESSOR_ID.into(), [0; 5])
            .unwrap_or(u64::MAX);
        // SAFETY: promised by `from_helper_table`'s caller: the entry's table is live, a
        // `PjPerCpuTable` followed by `count` arrays; `array < count` is checked first.
        unsafe {
            let hdr = &*(t.addr as *const PjPerCpuTable);
            if array >= hdr.count {
                return src;
            }
            let at = t.addr as usize
                + PJ_PERCPU_ARRAYS as usize
                + array as usize * PJ_PERCPU_ARRAY_SIZE as usize;
            let arr = &*(at as *const PjPerCpuArray);
            if cpu >= arr.cpus {
                return src;
            }
            src.wrapping_add(cpu.wrapping_mul(arr.slot_size))
        }
    }

    /// Runs `prog` with `ctx` as its context (r1 = its address, or 0 when empty; r2 = its
    /// length) and no host regions.
    pub fn run(
        &self,
        prog: &Program,
        ctx: &mut [u8],
        budget: Option<u64>,
    ) -> Result<Outcome, Stop> {
        self.run_with_stack(prog, ctx, budget, None)
    }

    /// [`Interpreter::run`], also returning where the stack block was (`start..end`; the
    /// entry's r10 was `end`), so a caller can tell stack-relative fault addresses apart.
    pub fn run_traced(
        &self,
        prog: &Program,
        ctx: &mut [u8],
        budget: Option<u64>,
    ) -> (Result<Outcome, Stop>, std::ops::Range<u64>) {
        let (start, len) = ctx_span(ctx);
        let env = RawEnv {
            r1: start,
            r2: len,
            ctx_start: start,
            ctx_end: start + len,
            regions: &[],
            budget,
        };
        let mut span = 0..0;
        // SAFETY: as in `run_with_stack`.
        let r = unsafe { self.run_inner(prog, &env, None, Some(&mut span)) };
        (r, span)
    }

    /// [`Interpreter::run`], and copies the final stack block into `stack_out` (resized to
    /// the block's size: `analysis::stack_block_size(prog)` with [`FrameLayout::Separate`],
    /// [`STACK_SIZE`] with [`FrameLayout::Packed`]; the entry frame is at its end).
    pub fn run_with_stack(
        &self,
        prog: &Program,
        ctx: &mut [u8],
        budget: Option<u64>,
        stack_out: Option<&mut Vec<u8>>,
    ) -> Result<Outcome, Stop> {
        let (start, len) = ctx_span(ctx);
        let env = RawEnv {
            r1: start,
            r2: len,
            ctx_start: start,
            ctx_end: start + len,
            regions: &[],
            budget,
        };
        // SAFETY: the context is a live, exclusively borrowed slice and there are no host
        // regions; the stack block is the interpreter's own.
        unsafe { self.run_raw(prog, &env, stack_out) }
    }

    /// Runs `prog` with `ctx` and host `regions` (read-only unless `PJ_REGION_WRITABLE`).
    ///
    /// # Safety
    /// Every region must be memory that may be read (and, when writable, written) for the
    /// whole run, not aliased by `ctx` or by any Rust reference used during the run (helpers
    /// included).
    pub unsafe fn run_with_regions(
        &self,
        prog: &Program,
        ctx: &mut [u8],
        regions: &[PjMemRegion],
        budget: Option<u64>,
    ) -> Result<Outcome, Stop> {
        let (start, len) = ctx_span(ctx);
        let env = RawEnv {
            r1: start,
            r2: len,
            ctx_start: start,
            ctx_end: start + len,
            regions,
            budget,
        };
        // SAFETY: the caller vouches for the regions; the context is a live slice.
        unsafe { self.run_raw(prog, &env, None) }
    }

    /// The general entry: registers and regions exactly as `env` says.
    ///
    /// # Safety
    /// `[ctx_start, ctx_end)` must be readable and writable memory, and every region readable
    /// (writable when flagged), for the whole run, with no Rust reference to any of it used
    /// meanwhile (helpers included).
    pub unsafe fn run_raw(
        &self,
        prog: &Program,
        env: &RawEnv<'_>,
        stack_out: Option<&mut Vec<u8>>,
    ) -> Result<Outcome, Stop> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_inner(prog, env, stack_out, None) }
    }

    /// # Safety
    /// As [`Interpreter::run_raw`].
    unsafe fn run_inner(
        &self,
        prog: &Program,
        env: &RawEnv<'_>,
        stack_out: Option<&mut Vec<u8>>,
        span_out: Option<&mut std::ops::Range<u64>>,
    ) -> Result<Outcome, Stop> {
        // Zeroed at entry: nothing of the host leaks in. Allocated as u64s so the block is
        // 8-byte aligned like the native stack (atomics on it are then aligned too). It sits
        // between two gaps nothing owns (see `STACK_GAP_WORDS`), left uninitialised: only
        // the block is ever read.
        let size = self.frames.block_size(prog);
        let words = size / 8;
        let mut backing = take_stack_backing(words + 2 * STACK_GAP_WORDS);
        let block = &mut backing[STACK_GAP_WORDS..STACK_GAP_WORDS + words];
        block.fill(std::mem::MaybeUninit::new(0));
        let stack_start = block.as_mut_ptr() as u64;
        let mut mem = Mem {
            ctx: (env.ctx_start, env.ctx_end),
            stack: (stack_start, stack_start + size as u64),
            regions: env.regions,
        };
        // Helpers called by this run see its regions through `helper_access_ok`.
        let view = RunView {
            ctx: mem.ctx,
            stack: mem.stack,
            regions: env.regions.as_ptr(),
            region_count: env.regions.len(),
        };
        let previous = CURRENT_RUN.with(|c| c.replace(&view));
        let _restore = CurrentRunGuard(previous);
        let r = self.exec(prog, env, &mut mem);
        if let Some(span) = span_out {
            *span = mem.stack.0..mem.stack.1;
        }
        if let Some(out) = stack_out {
            out.clear();
            let block = &backing[STACK_GAP_WORDS..STACK_GAP_WORDS + words];
            // SAFETY: the block's words were all written (zeroed) before the run, and the
            // run only stores initialised bytes into it.
            out.extend(
                block
                    .iter()
                    .flat_map(|w| unsafe { w.assume_init() }.to_le_bytes()),
            );
        }
        keep_stack_backing(backing);
        r
    }

    fn exec(&self, prog: &Program, env: &RawEnv<'_>, mem: &mut Mem<'_>) -> Result<Outcome, Stop> {
        let mut frames: Vec<Frame> = Vec::new();
        let mut reg = [0u64; 11];
        reg[1] = env.r1;
        reg[2] = env.r2;
        reg[10] = mem.stack.1;
        let mut budget = env.budget;
        let mut i = 0usize;
        let mut insns = 0u64;
        loop {
            insns += 1;
            let inst = &prog.insts[i];
            let pc = inst.pc as usize;
            let mut next = i + 1;
            match inst.op {
                Op::Alu {
                    width,
                    op,
                    dst,
                    src,
                } => {
                    let s = operand(&reg, src);
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
                Op::MovPerCpu { dst, src, array } => {
                    let array = match array {
                        Operand::Imm(id) => u64::from(id as u32),
                        Operand::Reg(r) => reg[r as usize],
                    };
                    reg[dst as usize] = self.percpu_address(reg[src as usize], array);
                }
                Op::Neg { width, dst } => {
                    let d = reg[dst as usize];
                    reg[dst as usize] = match width {
                        Width::W64 => d.wrapping_neg(),
                        Width::W32 => (d as u32).wrapping_neg() as u64,
                    };
                }
                Op::End { kind, bits, dst } => {
                    reg[dst as usize] = byte_order(kind, bits, reg[dst as usize]);
                }
                Op::LdImm64 { dst, imm } => reg[dst as usize] = imm.get(),
                Op::Load {
                    size,
                    sign_extend: sx,
                    dst,
                    base,
                    off,
                } => {
                    let addr = reg[base as usize].wrapping_add(off as i64 as u64);
                    let p = mem.check(addr, size, false, pc)?;
                    // SAFETY: `check` proved [addr, addr + size) inside an allowed region.
                    let v = unsafe { read(p, size) };
                    reg[dst as usize] = if sx {
                        sign_extend(v, (size.bytes() * 8) as u8)
                    } else {
                        v
                    };
                }
                Op::PacketLoad { size, index, off } => {
                    // Legacy LD_ABS / LD_IND (`packjit_frontend::packet`): the context start
                    // (r1 at entry), plus the index register, plus the u32 offset; checked
                    // like any load, never byte-swapped.
                    let x = index.map_or(0, |r| reg[r as usize]);
                    let addr = env.ctx_start.wrapping_add(x).wrapping_add(u64::from(off));
                    let p = mem.check(addr, size, false, pc)?;
                    // SAFETY: `check` proved [addr, addr + size) inside an allowed region.
                    reg[0] = unsafe { read(p, size) };
                }
                Op::Store {
                    size,
                    base,
                    off,
                    src,
                } => {
                    let addr = reg[base as usize].wrapping_add(off as i64 as u64);
                    let v = operand(&reg, src);
                    let p = mem.check(addr, size, true, pc)?;
                    // SAFETY: as above, and the region is writable.
                    unsafe { write(p, size, v) };
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
                    // Atomics count as writes: checked as one even for cmpxchg that fails.
                    let p = mem.check(addr, size, true, pc)?;
                    // SAFETY: as above. The interpreter runs the program on one thread, so a
                    // plain read-modify-write is the atomic's effect as the program sees it.
                    let old = unsafe { read(p, size) };
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
                                // SAFETY: as above.
                                unsafe { write(p, size, s) };
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
                            // SAFETY: as above.
                            unsafe { write(p, size, new & mask) };
                            if fetch {
                                reg[src as usize] = old;
                            }
                        }
                    }
                }
                Op::Ja { target } => {
                    let target = target as usize;
                    if let Some(c) = back_edge_charge(prog, i, target) {
                        charge(&mut budget, pc, c)?;
                    }
                    next = target;
                }
                Op::Jcond {
                    width,
                    cond,
                    dst,
                    src,
                    target,
                } => {
                    let a = reg[dst as usize];
                    let b = operand(&reg, src);
                    let (a, b) = match width {
                        Width::W64 => (a, b),
                        Width::W32 => (a as u32 as u64, b as u32 as u64),
                    };
                    if cond.eval(width, a, b) {
                        let target = target as usize;
                        if let Some(c) = back_edge_charge(prog, i, target) {
                            charge(&mut budget, pc, c)?;
                        }
                        next = target;
                    }
                }
                Op::CallHelper { id } => {
                    if let Some(array) = self.array_lookup(id) {
                        // The backends' expansion: the key is a checked program load.
                        let p = mem.check(reg[2], Size::W, false, pc)?;
                        // SAFETY: `check` proved the 4 key bytes inside an allowed region.
                        let key = unsafe { read(p, Size::W) };
                        if let Some(id) = array.percpu_id {
                            let lookup = packjit_plugin_api::PJ_HELPER_PERCPU_LOOKUP.into();
                            reg[0] = self
                                .call_helper(lookup, [id.into(), key, 0, 0, 0])
                                .ok_or(Stop::UnknownCallx { pc, id: lookup })?;
                            continue;
                        }
                        reg[0] = if key < u64::from(array.max_entries) {
                            array
                                .base
                                .wrapping_add(key.wrapping_mul(array.value_stride))
                        } else {
                            0
                        };
                        continue;
                    }
                    // The verifier checked `id` against the same table `load` used; a program
                    // decoded against another table gets a clear stop instead of a panic.
                    let args = [reg[1], reg[2], reg[3], reg[4], reg[5]];
                    reg[0] = self
                        .call_helper(id.into(), args)
                        .ok_or(Stop::UnknownCallx { pc, id: id.into() })?;
                }
                Op::CallReg { reg: r } => {
                    let id = reg[r as usize];
                    let args = [reg[1], reg[2], reg[3], reg[4], reg[5]];
                    reg[0] = self
                        .call_helper(id, args)
                        .ok_or(Stop::UnknownCallx { pc, id })?;
                }
                Op::CallLocal { target } => {
                    charge(&mut budget, pc, CALL_CHARGE)?;
                    frames.push(Frame {
                        ret: next,
                        saved: [reg[6], reg[7], reg[8], reg[9]],
                        r10: reg[10],
                    });
                    // Separate frames: the verifier bounds the depth by `prog.call_depth`,
                    // so the callee's frame is inside the block. Packed frames: it may not
                    // be, and its accesses are checked like any. No re-zeroing either way
                    // (the block is zeroed once, as rbpf's stack is).
                    reg[10] = reg[10].wrapping_sub(self.frames.call_step(prog, i));
                    next = target as usize;
                }
                Op::Exit => match frames.pop() {
                    None => {
                        return Ok(Outcome {
                            r0: reg[0],
                            insns,
                            budget_left: budget,
                        })
                    }
                    Some(f) => {
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

/// Charges a taken back-edge or call at `pc`; refuses it (budget untouched) when it costs
/// more than what is left.
fn charge(budget: &mut Option<u64>, pc: usize, cost: u64) -> Result<(), Stop> {
    if let Some(b) = budget.as_mut() {
        if cost > *b {
            return Err(Stop::Budget { pc });
        }
        *b -= cost;
    }
    Ok(())
}

fn ctx_span(ctx: &mut [u8]) -> (u64, u64) {
    // An empty context is r1 = 0, r2 = 0 (as in rbpf), not a dangling pointer value.
    if ctx.is_empty() {
        (0, 0)
    } else {
        (ctx.as_mut_ptr() as u64, ctx.len() as u64)
    }
}

fn operand(reg: &[u64; 11], o: Operand) -> u64 {
    match o {
        Operand::Reg(r) => reg[r as usize],
        Operand::Imm(v) => v as i64 as u64,
    }
}

/// Sign-extends the low `bits` of `v` to 64 bits.
pub fn sign_extend(v: u64, bits: u8) -> u64 {
    let sh = 64 - bits as u32;
    (((v << sh) as i64) >> sh) as u64
}

/// Byte-order conversion as on a little-endian target (`le` truncates, `be`/`bswap` swap),
/// zero-extended.
pub fn byte_order(kind: EndKind, bits: u8, d: u64) -> u64 {
    match (kind, bits) {
        (EndKind::ToLe, 16) => d as u16 as u64,
        (EndKind::ToLe, 32) => d as u32 as u64,
        (EndKind::ToLe, _) => d,
        (_, 16) => (d as u16).swap_bytes() as u64,
        (_, 32) => (d as u32).swap_bytes() as u64,
        (_, _) => d.swap_bytes(),
    }
}

/// One ALU operation at `width` (`s` is the second operand, an imm already sign-extended).
/// RFC 9669: `x / 0 = 0`, `x % 0 = x`, signed `MIN / -1 = MIN`, `MIN % -1 = 0`, shift counts
/// masked, 32-bit results zero-extended.
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

/// What a helper may ask about the interpreter run that called it (see
/// [`helper_access_ok`]): the run's regions, alive for the run.
struct RunView {
    ctx: (u64, u64),
    stack: (u64, u64),
    regions: *const PjMemRegion,
    region_count: usize,
}

thread_local! {
    /// The innermost interpreter run on this thread, if any.
    static CURRENT_RUN: std::cell::Cell<*const RunView> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

/// Restores the previous run's view when a run ends, even by unwinding.
struct CurrentRunGuard(*const RunView);

impl Drop for CurrentRunGuard {
    fn drop(&mut self) {
        CURRENT_RUN.with(|c| c.set(self.0));
    }
}

/// For a helper called by an interpreter run on this thread: may the program touch
/// `[addr, addr + len)` (writing, if `write`)? The same regions as the run's own accesses:
/// its context, its stack block and the host regions it was given. `None` when no
/// interpreter run is active on this thread (the caller then has no program to ask about).
pub fn helper_access_ok(addr: u64, len: u64, write: bool) -> Option<bool> {
    let view = CURRENT_RUN.with(|c| c.get());
    if view.is_null() {
        return None;
    }
    // SAFETY: set by `run_inner` for the duration of the run that (transitively) called the
    // helper on this thread, and reset before `run_inner` returns.
    let view = unsafe { &*view };
    let Some(end) = addr.checked_add(len) else {
        return Some(false);
    };
    let inside = |start: u64, stop: u64| start <= addr && end <= stop;
    if inside(view.ctx.0, view.ctx.1) || inside(view.stack.0, view.stack.1) {
        return Some(true);
    }
    if view.region_count == 0 {
        return Some(false);
    }
    // SAFETY: `regions`/`region_count` describe the `RawEnv::regions` slice of the run,
    // borrowed for its whole duration.
    let regions = unsafe { std::slice::from_raw_parts(view.regions, view.region_count) };
    Some(regions.iter().any(|r| {
        inside(r.start, r.start.saturating_add(r.len))
            && (!write || r.flags & PJ_REGION_WRITABLE != 0)
    }))
}

/// The allowed regions of one run, as host address ranges `[start, end)`.
struct Mem<'a> {
    ctx: (u64, u64),
    stack: (u64, u64),
    regions: &'a [PjMemRegion],
}

impl Mem<'_> {
    /// The host pointer for `[addr, addr + size)` when it lies inside one allowed region
    /// (writable for a write), else the stop. Checked in the JIT's order: context, stack
    /// block, host regions; the first region that contains the whole access decides.
    fn check(&self, addr: u64, size: Size, write: bool, pc: usize) -> Result<*mut u8, Stop> {
        let n = size.bytes() as u64;
        let oob = Stop::OutOfBounds {
            pc,
            addr,
            size: size.bytes(),
            write,
        };
        // An access that wraps around the address space is inside nothing.
        let end = addr.checked_add(n).ok_or(oob)?;
        let inside = |start: u64, stop: u64| addr >= start && end <= stop;
        if inside(self.ctx.0, self.ctx.1) || inside(self.stack.0, self.stack.1) {
            return Ok(addr as usize as *mut u8);
        }
        for r in self.regions {
            let stop = r.start.saturating_add(r.len);
            if inside(r.start, stop) && (!write || r.flags & PJ_REGION_WRITABLE != 0) {
                return Ok(addr as usize as *mut u8);
            }
        }
        Err(oob)
    }
}

/// Reads `size` bytes little-endian at `p`.
///
/// # Safety
/// `[p, p + size)` is readable.
unsafe fn read(p: *mut u8, size: Size) -> u64 {
    // SAFETY: the caller checked the range; unaligned reads are allowed by eBPF.
    unsafe {
        match size {
            Size::B => p.read() as u64,
            Size::H => u16::from_le((p as *const u16).read_unaligned()) as u64,
            Size::W => u32::from_le((p as *const u32).read_unaligned()) as u64,
            Size::DW => u64::from_le((p as *const u64).read_unaligned()),
        }
    }
}

/// Writes the low `size` bytes of `v` little-endian at `p`.
///
/// # Safety
/// `[p, p + size)` is writable.
unsafe fn write(p: *mut u8, size: Size, v: u64) {
    // SAFETY: the caller checked the range.
    unsafe {
        match size {
            Size::B => p.write(v as u8),
            Size::H => (p as *mut u16).write_unaligned((v as u16).to_le()),
            Size::W => (p as *mut u32).write_unaligned((v as u32).to_le()),
            Size::DW => (p as *mut u64).write_unaligned(v.to_le()),
        }
    }
}

#[cfg(test)]
mod tests;
