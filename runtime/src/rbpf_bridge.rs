//! The bridge to rbpf: rbpf 0.4's four VM flavours, served by packjit.
//!
//! [`EbpfVmRaw`], [`EbpfVmMbuff`], [`EbpfVmFixedMbuff`] and [`EbpfVmNoData`] have rbpf's
//! API — constructors taking `Option<&[u8]>` and returning `Result`, `set_program`,
//! `set_verifier`, per-VM `register_helper`, `execute_program`, `jit_compile`,
//! `unsafe execute_program_jit`, errors as `std::io::Error` — so an rbpf host switches by
//! changing the path of one type:
//!
//! ```
//! // use rbpf::EbpfVmRaw;
//! use packjit::rbpf_bridge::EbpfVmRaw;
//! let prog = &[
//!     0x71, 0x11, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, // ldxb r1, [r1+4]
//!     0x07, 0x01, 0x00, 0x00, 0x00, 0x22, 0x00, 0x00, // add r1, 0x2200
//!     0xbf, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // mov r0, r1
//!     0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
//! ];
//! let mem = &mut [0xaa, 0xbb, 0x11, 0x22, 0xcc, 0xdd];
//! let vm = EbpfVmRaw::new(Some(prog)).unwrap();
//! assert_eq!(vm.execute_program(mem).unwrap(), 0x22cc);
//! ```
//!
//! ## How programs run
//!
//! * `execute_program` is safe because it is **sandboxed**: native code compiled with
//!   `PJ_COMPILE_SANDBOX` (on first use) where the VM's runtime has a backend for the host,
//!   else packjit's own interpreter (`packjit-interp`, never rbpf's), which implements the
//!   same contract (and also serves rbpf's packed frames: see bpf-to-bpf frames below). A program may touch only the memory it was given and its stack; anything
//!   else stops it with an out-of-bounds error naming the pc, the address, the size and the
//!   direction (`io::Error` wrapping a [`packjit::RunError`](crate::RunError) whose
//!   [`Stop`](crate::Stop) has them: downcast `get_ref()`; a program refused at load wraps a
//!   [`packjit::Error`](crate::Error) instead).
//! * `jit_compile` compiles **trusted** code and `unsafe execute_program_jit` runs it, as in
//!   rbpf: the caller promises the program stays inside its memory.
//! * Registers: r1 = the memory (as rbpf chooses it per flavour; 0 when empty), r2 = its
//!   length (0 when empty), r0 and r3–r9 zero, r10 the top of a zeroed 512-byte frame.
//! * Helpers are per VM: two VMs can bind the same id to different functions. Each distinct
//!   rbpf helper function takes one of [`THUNK_SLOTS`] process-wide `extern "C"` thunks
//!   ([`c_thunk_for`]); code is compiled with the VM's own helper table (not the runtime's).
//!   Registering a helper drops code compiled before.
//! * The VMs are `Send + Sync`. `new` uses one process-wide runtime ([`default_runtime`]:
//!   the host's linked-in backend, or plugins from the default directories); `new_with_runtime`
//!   takes yours.
//!
//! ## Where rbpf 0.4.1 differs, and packjit follows RFC 9669
//!
//! A program run by rbpf's interpreter can change meaning when it moves to packjit (and,
//! with rbpf alone, when it moves between rbpf's interpreter and its x86-64 JIT):
//!
//! * **64-bit `jeq`/`jne`/`jgt`/`jge`/`jlt`/`jle` with an immediate**: rbpf compares against
//!   the *zero*-extended imm (`imm as u32 as u64`), RFC 9669 sign-extends it. `jeq r1, -1`
//!   is true for `r1 = 0xffff_ffff` in rbpf and for `r1 = u64::MAX` here. (`jset` and the
//!   signed conditions agree.)
//! * **`mod32` by zero**: rbpf leaves the whole destination unchanged; RFC 9669 keeps the
//!   dividend's low 32 bits and zero-extends.
//! * **`neg64` of `i64::MIN`**: rbpf computes `-(x as i64)`, which overflows (a panic in
//!   debug builds); here it wraps.
//! * **`sdiv`/`smod`** (cpu v4, `off = 1`): rbpf ignores the offset and divides unsigned.
//! * **cpu v4 instructions rbpf 0.4.1 rejects at run time**: `movsx`, sign-extending loads,
//!   `bswap`, `ja32` (`gotol`), every atomic (rbpf: "XADD instructions are not supported"),
//!   `callx`.
//! * **bpf-to-bpf frames** (`set_stack_usage_calculator`): rbpf lays them out differently on
//!   each of its paths, and packjit follows the path:
//!   * `execute_program` is rbpf's interpreter, whose frames share one zeroed 512-byte stack:
//!     a callee's r10 is its caller's minus the stack usage of the function making the call
//!     (the calculator's answer for the slot where that function starts), restored at its
//!     `exit`. With a calculator set, a program with a bpf-to-bpf call runs in packjit's
//!     interpreter with these packed frames (`packjit_interp::FrameLayout::Packed`): every
//!     function gets rbpf's r10, so a chain whose usages reach past 512 bytes stops when a
//!     callee touches the stack below it, with rbpf's words and instruction number (rbpf's
//!     `test_stack_overflow`: `Error: out of bounds memory store (insn #8)`). Usages are
//!     taken as rbpf takes them, unchecked: 0 (the callee's frame is its caller's), one not a
//!     multiple of 8 (r10 unaligned; unaligned accesses work) and one above 512 (r10 below
//!     the stack: the callee's stack accesses stop) all run as in rbpf. A program without a
//!     bpf-to-bpf call has one frame whatever the layout, and keeps native sandboxed code.
//!   * Without a calculator, rbpf's interpreter steps 256 bytes per call; here each frame has
//!     512 bytes of its own (the layout of packjit's code, which then stays native). The
//!     256 is rbpf's guess, not the program's need, and rbpf's own paths disagree on it
//!     (below): a program that rbpf's interpreter runs to its end, each function using at
//!     most 256 bytes below its own r10, gets the same answers here, while one whose caller
//!     uses more would have its frame overwritten by its callee in rbpf's interpreter and
//!     does not here, and a chain of three stack-using functions, whose third has no stack
//!     left in rbpf, runs. A host that wants rbpf's exact default sets a calculator
//!     answering 256 (`|_, _, _| 256`).
//!   * `execute_program_jit` and the Cranelift runs keep separate 512-byte frames and ignore
//!     the calculator, as rbpf's compiled paths ignore it: its x86-64 JIT gives every
//!     function the entry's r10 (its frames coincide) and its Cranelift code has no
//!     bpf-to-bpf calls (it compiles one as a call of the helper its `imm` names).
//!   * rbpf asks the calculator about the entry and about `slot + 1 + imm` of every `call`,
//!     helper calls included (a helper id read as an offset). packjit asks the same
//!     questions in the same order, and uses the answers for the slots where functions
//!     start; rbpf would also switch a frame's usage when its run passes another slot it
//!     asked about, which only a helper id pointing into the calling function does.
//!   * The calculator's `data` reaches it as rbpf hands it over: a `dyn Any` of the
//!     `Box<dyn Any>` holding the host's value (so `data.downcast_mut::<Box<dyn Any>>()`
//!     comes first, in rbpf and here). The value must be `Send + Sync` (the VMs are) and
//!     keep its type: a calculator that puts a value of another type in the box is refused
//!     with an error from the call that asked it.
//!   * Depth: rbpf allows 8 nested calls (9 frames) and stops a run that makes a ninth;
//!     packjit refuses at load a program whose call graph is deeper than 8 frames.
//! * **r2 at entry**: rbpf's interpreter sets only r1 (r2 = 0); here r2 is the length of the
//!   memory r1 points to (0 when empty, as before).
//! * **Unknown helpers**: rbpf fails when the `call` executes; here the program is refused
//!   before it runs, in rbpf's words (`Error: unknown helper function (id: 0x3f)`, with the
//!   packjit error, naming the pc, inside [`RbpfError`]). A `callx` to an unregistered id
//!   stops the program.
//! * **Verifier**: rbpf's own runs first by default ([`default_verifier`]), so a program rbpf
//!   refused is refused with rbpf's message; packjit's front end then refuses what it cannot
//!   run. Fields rbpf ignores and packjit refuses as reserved are cleared first: the
//!   immediate of register-mode `div`/`mod`, and those of the legacy packet loads below.
//! * **Legacy packet access** (`LD_ABS`/`LD_IND`, opcodes 0x20/0x28/0x30/0x38 and
//!   0x40/0x48/0x50/0x58; `packjit_frontend::packet`): as rbpf, `r0 = *(size *)(mem + imm)`
//!   or `(mem + src + imm)`, `imm` read as a `u32`, the host's byte order, r1-r5 kept, the
//!   8-byte forms included; the fields rbpf ignores (`dst`, `off`, `src` of `LD_ABS`) are
//!   cleared before packjit reads the program. `mem` is the memory r1 points to at entry,
//!   which is rbpf's `mem` in [`EbpfVmRaw`] and [`EbpfVmNoData`] (none: every such load is
//!   out of bounds) and in [`EbpfVmMbuff`] with an empty metadata buffer. In
//!   [`EbpfVmMbuff`] with a metadata buffer and in [`EbpfVmFixedMbuff`], r1 is the metadata
//!   buffer while rbpf's loads read `mem`; compiled code reads the memory r1 points to at
//!   entry, so those runs go to the interpreter (r1 = the buffer, the loads from `mem`,
//!   both reachable), under the sandbox's contract whichever `execute_*` was called.
//!   Bounds:
//!   `execute_program` checks the load's own size (rbpf's interpreter checks 8 bytes
//!   whatever the size, refusing e.g. `ldabsb` of the last byte); trusted code
//!   (`execute_program_jit`) reads unchecked, as rbpf's JIT (which reads `imm` as a signed
//!   displacement: the two agree for `imm < 2^31`).
//! * **Run-time failures** read as rbpf's ([`RbpfError`]: `Error: out of bounds memory store
//!   (insn #N), addr 0x..., size S`, rbpf numbering the instruction after the faulting one).
//! * **JIT memory**: `set_jit_exec_memory` is accepted and unused: code goes to packjit's
//!   packed W^X arena.
//! * **Cranelift** (feature `cranelift`, named as rbpf's): `cranelift_compile` and
//!   `execute_program_cranelift` exist on every flavour and run packjit's sandboxed code
//!   (rbpf's Cranelift code checks its accesses too), with rbpf's `[CRANELIFT] ` prefix on
//!   compile failures and its refusal of a run before `cranelift_compile`. No Cranelift is
//!   linked.
//! * **`register_allowed_memory`**: each range is a read-write region of every run, checked
//!   like the run's memory (in trusted code, reachable like any address). Like rbpf's, the
//!   method is safe and takes the host's word that the range stays valid.
//!
//! `scripts/rbpf-dropin.sh` runs rbpf 0.4.1's own test files (misc.rs, ubpf_verifier.rs,
//! ubpf_jit_x86_64.rs, ubpf_vm.rs, and cranelift.rs with the `cranelift` feature) and its
//! examples with only the type path changed, natively and (`--cross`) under qemu; what fails
//! there is what this list names: `test_vm_jmp_unsigned_extend` (the 64-bit jump immediate,
//! above). `test_stack_overflow` passes: packed frames, above.
//! * **Bounds**: rbpf's interpreter checks accesses against mbuff, mem, its stack and
//!   `register_allowed_memory` ranges (its JIT checks nothing); here the sandbox checks
//!   against the memory given and the runtime's regions. In [`EbpfVmMbuff`], whose
//!   `execute_program` takes both buffers as `&[u8]`, rbpf lets a program store into them
//!   (a write through a shared reference); here the metadata buffer r1 points to is a private
//!   copy the program may write, and `mem` is read-only: a store to it stops with an
//!   out-of-bounds error.
//! * **Instruction budget**: rbpf has none; here sandboxed and interpreted runs end after
//!   [`DEFAULT_BUDGET`](crate::DEFAULT_BUDGET) instructions with a budget error, and
//!   [`EbpfVmRaw::set_instruction_budget`] (the same on every flavour) sets another limit.
//! * **rbpf's own `memfrob` and `strcmp`** dereference their pointer arguments unchecked.
//!   A VM given one of them (`vm.register_helper(id, rbpf::helpers::memfrob)`, the line a
//!   host keeps when switching) binds the checked version instead, which asks
//!   [`helper_access_ok`](crate::helper_access_ok) first and returns `u64::MAX` for memory
//!   the program may not touch. They are recognised by their symbol (an address compare
//!   cannot tell: each crate may hold its own copy); in a binary without a symbol table the
//!   function registered is bound as it is. Any other helper is called as registered: one
//!   that dereferences a pointer argument must validate it with `helper_access_ok` for the
//!   sandbox to hold (`bpf_trace_printf`, `gather_bytes`, `sqrti` and `rand` take no
//!   pointers).
//!
//! rbpf helpers are Rust-ABI `fn(u64, u64, u64, u64, u64) -> u64`; JIT code calls
//! `extern "C"` functions. [`extern_c_helper!`](crate::extern_c_helper) wraps a helper known
//! at compile time; [`c_thunk_for`] binds one known only at run time to one of a fixed set of
//! `extern "C"` thunks; [`register_rbpf_helpers`] registers rbpf's standard set on a runtime.

use crate::fn_names::RbpfHelper;
use crate::{
    arena, exec, Error, ErrorKind, LoadOptions, PjHelperFn, Program, RunError, Runtime, Trust,
};
use packjit_interp::{FrameLayout, Interpreter, RawEnv};
use packjit_plugin_api::{HelperEntry, PjMemRegion, PJ_REGION_WRITABLE};
use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// rbpf's helper type.
pub type Helper = rbpf::ebpf::Helper;

/// Wraps a Rust-ABI helper `fn(u64, u64, u64, u64, u64) -> u64` into an
/// `unsafe extern "C" fn` suitable for [`Runtime::register_helper`]. A panic in the helper
/// aborts the process rather than unwinding through JIT frames.
#[macro_export]
macro_rules! extern_c_helper {
    ($f:path) => {{
        unsafe extern "C" fn trampoline(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
            match ::std::panic::catch_unwind(|| $f(a, b, c, d, e)) {
                Ok(v) => v,
                Err(_) => ::std::process::abort(),
            }
        }
        trampoline as $crate::PjHelperFn
    }};
}

/// rbpf's helper ids, as its `helpers` module numbers them.
pub mod ids {
    /// `bpf_trace_printk`-like printing.
    pub const TRACE_PRINTK: u32 = rbpf::helpers::BPF_TRACE_PRINTK_IDX;
}

/// Registers rbpf's `bpf_trace_printf` under rbpf's id, plus rbpf's other standard helpers
/// (which rbpf leaves unnumbered) under the ids given: `gather_bytes`, `memfrob`, `sqrti`,
/// `strcmp`, `rand`.
///
/// `memfrob` and `strcmp` dereference the pointers the program passes them, which rbpf's
/// versions do unchecked; here they first ask [`crate::helper_access_ok`], so a sandboxed
/// program cannot reach through them memory it could not reach itself. A refused pointer
/// makes them return `u64::MAX` without touching memory (as rbpf's `strcmp` does for NULL).
pub fn register_rbpf_helpers(rt: &Runtime, first_extra_id: u32) -> Result<(), Error> {
    rt.register_helper(
        ids::TRACE_PRINTK,
        "bpf_trace_printf",
        extern_c_helper!(rbpf::helpers::bpf_trace_printf),
    )?;
    let extra: [(&str, crate::PjHelperFn); 5] = [
        (
            "gather_bytes",
            extern_c_helper!(rbpf::helpers::gather_bytes),
        ),
        ("memfrob", memfrob_checked),
        ("sqrti", extern_c_helper!(rbpf::helpers::sqrti)),
        ("strcmp", strcmp_checked),
        ("rand", extern_c_helper!(rbpf::helpers::rand)),
    ];
    for (i, (name, f)) in extra.into_iter().enumerate() {
        rt.register_helper(first_extra_id + i as u32, name, f)?;
    }
    Ok(())
}

/// May the running program touch `[addr, addr + len)`? Trusted code (`execute_program_jit`)
/// vouches for its own pointers, as with rbpf; sandboxed and interpreted runs ask the
/// sandbox.
fn may_touch(addr: u64, len: u64, direction: crate::AccessDirection) -> bool {
    crate::exec::trusted_run() || crate::helper_access_ok(addr, len, direction)
}

/// rbpf's `memfrob` (xor each byte with 42) behind the sandbox's write check.
extern "C" fn memfrob_checked(ptr: u64, len: u64, _: u64, _: u64, _: u64) -> u64 {
    if !may_touch(ptr, len, crate::AccessDirection::Write) {
        return u64::MAX;
    }
    for i in 0..len {
        // SAFETY: `[ptr, ptr + len)` is memory the running program may write (checked above:
        // its context, its stack or a writable region the host vouched for).
        unsafe { *((ptr + i) as *mut u8) ^= 0b10_1010 };
    }
    0
}

/// rbpf's `strcmp` (absolute difference of the first differing bytes, 0 when equal),
/// checking each byte is readable before reading it: the strings' lengths are not known up
/// front, so the check walks with the comparison.
extern "C" fn strcmp_checked(a: u64, b: u64, _: u64, _: u64, _: u64) -> u64 {
    if a == 0 || b == 0 {
        return u64::MAX;
    }
    let readable = |addr: u64| may_touch(addr, 1, crate::AccessDirection::Read);
    let mut i = 0u64;
    loop {
        let (pa, pb) = (a.wrapping_add(i), b.wrapping_add(i));
        if !readable(pa) || !readable(pb) {
            return u64::MAX;
        }
        // SAFETY: both bytes were just checked readable for the running program.
        let (x, y) = unsafe { (*(pa as *const u8), *(pb as *const u8)) };
        if x != y || x == 0 {
            return u64::from(x.abs_diff(y));
        }
        i += 1;
    }
}

/// How many distinct run-time helpers [`c_thunk_for`] can bind per process.
pub const THUNK_SLOTS: usize = 32;

static BOUND: [AtomicUsize; THUNK_SLOTS] = [const { AtomicUsize::new(0) }; THUNK_SLOTS];

macro_rules! thunk_table {
    ($($n:literal)*) => {
        [$({
            unsafe extern "C" fn thunk(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
                let raw = BOUND[$n].load(Ordering::Acquire);
                // SAFETY: a slot's thunk is only handed out after the slot holds a Helper.
                let f: Helper = unsafe { std::mem::transmute::<usize, Helper>(raw) };
                match std::panic::catch_unwind(|| f(a, b, c, d, e)) {
                    Ok(v) => v,
                    // Unwinding through JIT frames is undefined: stop here.
                    Err(_) => std::process::abort(),
                }
            }
            thunk as PjHelperFn
        }),*]
    };
}

static THUNKS: [PjHelperFn; THUNK_SLOTS] = thunk_table!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
);

/// An `extern "C"` function that calls `f`. The same `f` always gets the same thunk; slots are
/// never released (helpers are plain functions that live for the whole process).
pub fn c_thunk_for(f: Helper) -> Result<PjHelperFn, Error> {
    let want = f as usize;
    for (slot, thunk) in BOUND.iter().zip(THUNKS.iter()) {
        match slot.compare_exchange(0, want, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(*thunk),
            Err(current) if current == want => return Ok(*thunk),
            Err(_) => {}
        }
    }
    Err(Error::new(
        ErrorKind::InvalidArgument,
        format!("all {THUNK_SLOTS} run-time helper thunks are in use"),
    ))
}

// ---------------------------------------------------------------------------------------
// The VMs

/// rbpf's verifier type: checks a program before it is accepted.
pub type Verifier = fn(prog: &[u8]) -> Result<(), io::Error>;

/// The default verifier: rbpf's own ([`rbpf_verifier`]: the same refusals in the same
/// words as before the switch), then packjit's front end ([`packjit_verifier`]), which every
/// backend and the interpreter run too.
pub fn default_verifier(prog: &[u8]) -> Result<(), io::Error> {
    rbpf_verifier(prog)?;
    packjit_verifier(prog)
}

/// rbpf 0.4.1's verifier itself (its constructor runs it): what rbpf refused, refused with
/// rbpf's message (`[Verifier] Error: ...`).
pub fn rbpf_verifier(prog: &[u8]) -> Result<(), io::Error> {
    rbpf::EbpfVmRaw::new(Some(prog)).map(|_| ())
}

/// packjit's front end (`packjit_frontend::decode`), which every backend and the interpreter
/// run too, and rbpf's own refusal of a jump to itself (an infinite loop), with rbpf's
/// words; it accepts the cpu v4 instructions rbpf's verifier lets through but its
/// interpreter refuses. Helper ids are checked later, against the helpers registered when
/// the program first runs or is compiled (rbpf registers them after `set_program` as well).
pub fn packjit_verifier(prog: &[u8]) -> Result<(), io::Error> {
    refuse_self_jumps(prog)?;
    let prog = &*rbpf_ignored_fields(prog);
    // Accept every id a `call imm` names, for now.
    let helpers: Vec<HelperEntry> = prog
        .chunks_exact(8)
        .filter(|c| c[0] == 0x85 && c[1] >> 4 == 0)
        .map(|c| HelperEntry {
            id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            inline_kind: 0,
            addr: 1,
        })
        .collect();
    packjit_frontend::decode(prog, &helpers)
        .map(|_| ())
        .map_err(to_io)
}

/// The program as packjit reads it: fields rbpf ignores cleared, which packjit's front end
/// refuses as reserved (as the kernel does, and as the bpf_conformance suite's negative
/// tests want; those never pass through here):
///
/// * legacy packet loads (`LD_ABS`, `LD_IND`): rbpf reads only the opcode, the immediate
///   and (`LD_IND`) the source register, so `dst`, `off` and `src` of `LD_ABS` are cleared
///   (rbpf's own `test_vm_err_ldindb_oob` has `ldabsdw` with `src = 1`);
/// * register-mode `div` and `mod` (32 and 64 bits): rbpf ignores the immediate (its tests
///   `test_jit_div_reg_with_nonzero_imm` / `..._mod_...`), so it is cleared.
///
/// Borrowed unchanged when there is nothing to clear.
fn rbpf_ignored_fields(prog: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let mut out = std::borrow::Cow::Borrowed(prog);
    let mut slot = 0;
    while let Some(insn) = prog.get(slot * 8..slot * 8 + 8) {
        let opc = insn[0];
        // Class LD (0), mode ABS (0x20) or IND (0x40).
        let (abs, ind) = (opc & 0xe7 == 0x20, opc & 0xe7 == 0x40);
        let keep = if ind { 0xf0 } else { 0x00 };
        if (abs || ind) && (insn[1] & !keep != 0 || insn[2] != 0 || insn[3] != 0) {
            let bytes = out.to_mut();
            bytes[slot * 8 + 1] &= keep;
            bytes[slot * 8 + 2] = 0;
            bytes[slot * 8 + 3] = 0;
        }
        // ALU or ALU64, register source (0x08), div (0x30) or mod (0x90).
        let div_mod_reg = matches!(opc & 0x07, 0x04 | 0x07)
            && opc & 0x08 != 0
            && matches!(opc & 0xf0, 0x30 | 0x90);
        if div_mod_reg && insn[4..8] != [0; 4] {
            out.to_mut()[slot * 8 + 4..slot * 8 + 8].fill(0);
        }
        slot += if opc == 0x18 { 2 } else { 1 };
    }
    out
}

/// rbpf's verifier refuses every jump whose offset is -1 (it lands on itself: a loop that
/// never ends), naming the slot; so does the bridge, so an rbpf host does not trade that
/// refusal for a run that never returns.
fn refuse_self_jumps(prog: &[u8]) -> Result<(), io::Error> {
    let mut slot = 0;
    while let Some(insn) = prog.get(slot * 8..slot * 8 + 8) {
        let (opc, off) = (insn[0], i16::from_le_bytes([insn[2], insn[3]]));
        let class = opc & 0x07;
        let op = opc & 0xf0;
        // JMP and JMP32, but not `call` (0x80) and `exit` (0x90).
        let jump = (class == 0x05 || class == 0x06) && op != 0x80 && op != 0x90;
        if jump && off == -1 {
            return Err(io::Error::other(format!(
                "[Verifier] Error: infinite loop (insn #{slot})"
            )));
        }
        // `lddw` takes two slots.
        slot += if opc == 0x18 { 2 } else { 1 };
    }
    Ok(())
}

/// rbpf's stack usage calculator: the bytes of stack the function starting at slot `pc`
/// uses (rbpf's `StackUsageCalculator`). `data` is, as in rbpf, the `Box<dyn Any>` holding
/// the value given to `set_stack_usage_calculator`.
pub type StackUsageCalculator = fn(prog: &[u8], pc: usize, data: &mut dyn Any) -> u16;

/// rbpf's stack usage for a function the calculator was not asked about
/// (`ebpf::LOCAL_FUNCTION_STACK_SIZE`; never read here: every function is asked about).
const RBPF_DEFAULT_USAGE: u32 = 256;

/// A stack usage calculator's data, handed to the calculator as rbpf hands it: rbpf keeps
/// a `Box<dyn Any>` and passes `&mut` that box, which becomes a `dyn Any` *of the box*, so a
/// calculator written for rbpf reaches its value through `downcast_mut::<Box<dyn Any>>()`
/// first. Kept here as such a box too, so the same calculator finds it.
struct CalculatorData {
    value: Box<dyn Any>,
    /// The type of the value in `value`: one that is `Send + Sync`, since
    /// `set_stack_usage_calculator` took it as a `Box<dyn Any + Send + Sync>`.
    ty: TypeId,
}

// SAFETY: `value` always holds a value of type `ty`, which is `Send` (see `ty`). The
// calculator, given `&mut` the box, is the only code that could put another value there;
// `CalculatorData::ask` checks the type after every call and drops a value of another type on
// the thread that made it, before anything can move it elsewhere.
unsafe impl Send for CalculatorData {}
// SAFETY: as for `Send` (`ty` is `Sync`); besides, nothing reads `value` through a shared
// reference.
unsafe impl Sync for CalculatorData {}

impl CalculatorData {
    fn new(value: Box<dyn Any + Send + Sync>) -> Self {
        // `(*value)`: the type of the value inside, not of the box.
        let ty = (*value).type_id();
        Self { value, ty }
    }

    /// `calculator`'s answer for the function at slot `pc` of `prog`.
    fn ask(
        &mut self,
        calculator: StackUsageCalculator,
        prog: &[u8],
        pc: usize,
    ) -> Result<u16, io::Error> {
        // The box itself as the `dyn Any`, as rbpf passes it (see the type's docs).
        let data: &mut dyn Any = &mut self.value;
        let usage = calculator(prog, pc, data);
        if (*self.value).type_id() != self.ty {
            self.value = Box::new(());
            self.ty = TypeId::of::<()>();
            return Err(io::Error::other(format!(
                "Error: the stack usage calculator put data of another type in place of its \
                 own (asked about insn #{pc}): packjit's VMs are Send + Sync, and so must the \
                 data stay"
            )));
        }
        Ok(usage)
    }
}

/// Asks `calculator` what rbpf's `StackVerifier` asks it, in the same order: the entry (slot
/// 0), then `slot + 1 + imm` for every `call` opcode (0x85) in slot order, helper calls
/// included (rbpf does not tell them apart, so a helper call's id is asked about as if it
/// were an offset; a negative target is asked about as rbpf's `as usize` wraps it). The
/// answers become the frames of `execute_program` when `prog` has a bpf-to-bpf call (see
/// the module docs): a later answer for the same slot replaces an earlier one, as in rbpf's
/// map, and an answer for a slot that starts no function is never read.
fn stack_usage(
    prog: &[u8],
    calculator: StackUsageCalculator,
    data: &mut CalculatorData,
) -> Result<FrameLayout, io::Error> {
    let mut usage = BTreeMap::new();
    usage.insert(0, u32::from(data.ask(calculator, prog, 0)?));
    for (slot, c) in prog.chunks_exact(8).enumerate() {
        if c[0] == 0x85 {
            let imm = i32::from_le_bytes([c[4], c[5], c[6], c[7]]) as isize;
            let target = (slot as isize).wrapping_add(1).wrapping_add(imm) as usize;
            usage.insert(target, u32::from(data.ask(calculator, prog, target)?));
        }
    }
    Ok(FrameLayout::Packed {
        usage,
        default: RBPF_DEFAULT_USAGE,
    })
}

/// Does `prog` have a bpf-to-bpf call (`call` with `src = 1`)? Only then can the frame
/// layout change what a run does.
fn has_local_calls(prog: &[u8]) -> bool {
    prog.chunks_exact(8).any(|c| c[0] == 0x85 && c[1] >> 4 == 1)
}

/// The frames `execute_program` gives `prog` once a calculator is set: the calculator is
/// asked (as rbpf asks it when a program or a calculator is set), and its answers pack the
/// frames when `prog` has a bpf-to-bpf call; without one, every layout is the same single
/// 512-byte frame, and separate frames keep the program's native code.
fn frames_of(
    prog: &[u8],
    calculator: StackUsageCalculator,
    data: &mut CalculatorData,
) -> Result<FrameLayout, io::Error> {
    let frames = stack_usage(prog, calculator, data)?;
    Ok(if has_local_calls(prog) {
        frames
    } else {
        FrameLayout::Separate
    })
}

/// Which of rbpf's ways to run a program a run stands for: only rbpf's interpreter
/// (`execute_program`) reads the stack usage calculator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RbpfPath {
    /// `execute_program`: rbpf's interpreter, frames packed by the calculator's answers.
    Interpreter,
    /// `execute_program_jit` and `execute_program_cranelift`: compiled code, whose frames
    /// rbpf lays out without the calculator (packjit: separate frames).
    Compiled,
}

/// A packjit error as rbpf reports errors: `io::Error` of kind `Other`, with the packjit
/// error inside: `e.get_ref()` → `downcast_ref::<packjit::Error>()` for a program refused at
/// load (kind, pc), `downcast_ref::<packjit::RunError>()` for a run that stopped (its
/// [`Stop`](crate::Stop): kind, pc, address, size, direction).
pub fn to_io<E: std::error::Error + Send + Sync + 'static>(e: E) -> io::Error {
    io::Error::other(e)
}

/// A failure in rbpf's words (its `Display`), with packjit's account inside
/// ([`RbpfError::run_error`] for a run that stopped, [`RbpfError::load_error`] for a program
/// refused when it was compiled; also `source()`). An out-of-bounds stop reads as rbpf's
/// "Error: out of bounds memory store (insn #N), addr 0x..., size S" (rbpf numbers the
/// instruction after the faulting one) and keeps the packjit pc, address, size and
/// direction; a call of an unregistered helper reads as rbpf's "Error: unknown helper
/// function (id: 0x3f)" (and `[JIT] Error: ...` from `jit_compile`).
#[derive(Debug)]
pub struct RbpfError {
    message: String,
    cause: Cause,
}

#[derive(Debug)]
enum Cause {
    Run(RunError),
    Load(Error),
}

impl RbpfError {
    /// packjit's account of a run that stopped (kind, pc, address, size, direction).
    pub fn run_error(&self) -> Option<&RunError> {
        match &self.cause {
            Cause::Run(e) => Some(e),
            Cause::Load(_) => None,
        }
    }

    /// packjit's account of a program refused when it was compiled (kind, pc).
    pub fn load_error(&self) -> Option<&Error> {
        match &self.cause {
            Cause::Load(e) => Some(e),
            Cause::Run(_) => None,
        }
    }
}

impl std::fmt::Display for RbpfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RbpfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            Cause::Run(e) => Some(e),
            Cause::Load(e) => Some(e),
        }
    }
}

/// A run's failure as rbpf reports it (see [`RbpfError`]).
fn run_to_io(error: RunError) -> io::Error {
    let message = match error.stop() {
        Some(crate::Stop::OutOfBounds {
            pc,
            addr,
            size,
            write,
        }) => format!(
            "Error: out of bounds memory {} (insn #{}), addr {addr:#x}, size {size}",
            if write { "store" } else { "load" },
            pc + 1
        ),
        _ => format!("Error: {error}"),
    };
    io::Error::other(RbpfError {
        message,
        cause: Cause::Run(error),
    })
}

/// A program refused when it was compiled for a run, in rbpf's words where rbpf refuses the
/// same program (`prefix`: "" where rbpf's interpreter refuses it when the call runs,
/// "[JIT] " for `jit_compile`, where rbpf's JIT refuses it while compiling).
fn compile_to_io(
    error: &Error,
    code: &[u8],
    helpers: &BTreeMap<u32, (Helper, PjHelperFn)>,
    prefix: &str,
) -> io::Error {
    let mut message = format!("{prefix}Error: {error}");
    for (pc, c) in code.chunks_exact(8).enumerate() {
        let imm = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        if c[0] != 0x85 {
            continue;
        }
        match c[1] >> 4 {
            0 if !helpers.contains_key(&imm) => {
                message = format!("{prefix}Error: unknown helper function (id: {imm:#x})");
                break;
            }
            0 | 1 => {}
            src => {
                let what = if prefix.is_empty() {
                    "unsupported"
                } else {
                    "unexpected"
                };
                message = format!("{prefix}Error: {what} call type #{src} (insn #{pc})");
                break;
            }
        }
    }
    io::Error::other(RbpfError {
        message,
        cause: Cause::Load(error.clone()),
    })
}

/// The runtime [`EbpfVmRaw::new`] and the other `new` constructors use: created on first use,
/// with the backend linked into this build for the host ([`crate::linked_backend`]) and the
/// plugins of the default directories (`PACKJIT_PLUGIN_DIR`, or next to the executable) when
/// there are any (a plugin for the host replaces the linked backend). Without a backend for
/// the host, programs are interpreted.
pub fn default_runtime() -> Arc<Runtime> {
    static RT: OnceLock<Option<Arc<Runtime>>> = OnceLock::new();
    RT.get_or_init(|| {
        let rt = Runtime::new().ok()?;
        // No plugins is not an error here: the interpreter serves.
        let _ = rt.load_plugins(None);
        Some(Arc::new(rt))
    })
    .clone()
    .unwrap_or_else(|| {
        // Runtime::new only fails when the code arena cannot be mapped; a runtime without one
        // still interprets. Build a fresh one each time rather than caching the failure.
        Arc::new(Runtime::new().expect("packjit runtime"))
    })
}

/// Native code compiled for the host, or the reason there is none.
enum Native {
    Code(Box<Program>),
    /// No backend for the host, or the backend refused the mode: interpret.
    Interpret,
}

/// What every flavour shares: the program, the verifier, the helpers and compiled code.
struct Core<'a> {
    rt: Arc<Runtime>,
    prog: Option<&'a [u8]>,
    /// `prog` with the fields rbpf ignores cleared ([`rbpf_ignored_fields`]), when that
    /// changed it: what packjit compiles and interprets.
    cleared: Option<Vec<u8>>,
    verifier: Verifier,
    helpers: BTreeMap<u32, (Helper, PjHelperFn)>,
    budget: Option<u64>,
    /// rbpf's stack usage calculator and its data (see `set_stack_usage_calculator`).
    stack_usage: Option<(StackUsageCalculator, CalculatorData)>,
    /// The frames `execute_program` gives the program: packed by the calculator's answers
    /// when a calculator is set and the program has a bpf-to-bpf call, else separate.
    frames: FrameLayout,
    /// Sandboxed code (compiled on the first `execute_program`).
    sandboxed: OnceLock<Result<Native, Error>>,
    /// The decoded program for the interpreter (on first use).
    decoded: OnceLock<Result<packjit_frontend::Program, Error>>,
    /// Trusted code from `jit_compile`.
    trusted: Option<Program>,
    /// `register_allowed_memory` ranges: read-write regions of every run.
    allowed: Vec<PjMemRegion>,
    /// `cranelift_compile` was called (kept across program changes: from then on the VM's
    /// Cranelift runs are packjit's sandboxed code for whatever program it holds).
    #[cfg(feature = "cranelift")]
    cranelift: bool,
}

/// Does `prog` have a legacy packet load (`LD_ABS`/`LD_IND`)?
fn has_packet_loads(prog: &[u8]) -> bool {
    let mut slot = 0;
    while let Some(insn) = prog.get(slot * 8..slot * 8 + 8) {
        let opc = insn[0];
        if matches!(opc & 0xe7, 0x20 | 0x40) {
            return true;
        }
        slot += if opc == 0x18 { 2 } else { 1 };
    }
    false
}

/// An owned copy of `prog` when [`rbpf_ignored_fields`] changes it.
fn cleared(prog: &[u8]) -> Option<Vec<u8>> {
    match rbpf_ignored_fields(prog) {
        std::borrow::Cow::Owned(v) => Some(v),
        std::borrow::Cow::Borrowed(_) => None,
    }
}

fn no_program() -> io::Error {
    // rbpf 0.4.1's words (naming its old `prog_set`).
    io::Error::other("Error: No program set, call prog_set() to load one")
}

impl<'a> Core<'a> {
    fn new(prog: Option<&'a [u8]>, rt: Arc<Runtime>) -> Result<Self, io::Error> {
        if let Some(p) = prog {
            default_verifier(p)?;
        }
        Ok(Self {
            rt,
            prog,
            cleared: prog.and_then(cleared),
            verifier: default_verifier,
            helpers: BTreeMap::new(),
            budget: None,
            stack_usage: None,
            frames: FrameLayout::Separate,
            sandboxed: OnceLock::new(),
            decoded: OnceLock::new(),
            trusted: None,
            allowed: Vec::new(),
            #[cfg(feature = "cranelift")]
            cranelift: false,
        })
    }

    /// Drops everything compiled or decoded for an earlier program, helper set or budget.
    fn invalidate(&mut self) {
        self.sandboxed = OnceLock::new();
        self.decoded = OnceLock::new();
        self.trusted = None;
    }

    fn set_program(&mut self, prog: &'a [u8]) -> Result<(), io::Error> {
        (self.verifier)(prog)?;
        // As rbpf: the calculator is asked before the program is taken, and a failure leaves
        // the VM as it was.
        let frames = match self.stack_usage.as_mut() {
            Some((calculator, data)) => frames_of(prog, *calculator, data)?,
            None => FrameLayout::Separate,
        };
        self.prog = Some(prog);
        self.cleared = cleared(prog);
        self.frames = frames;
        self.invalidate();
        Ok(())
    }

    /// The frames a run on `path` gives the program.
    fn frames_for(&self, path: RbpfPath) -> &FrameLayout {
        match path {
            RbpfPath::Interpreter => &self.frames,
            RbpfPath::Compiled => &FrameLayout::Separate,
        }
    }

    fn set_verifier(&mut self, verifier: Verifier) -> Result<(), io::Error> {
        // As rbpf: the program already loaded must pass the new verifier.
        if let Some(p) = self.prog {
            verifier(p)?;
        }
        self.verifier = verifier;
        Ok(())
    }

    fn set_stack_usage_calculator(
        &mut self,
        calculator: StackUsageCalculator,
        data: Box<dyn Any + Send + Sync>,
    ) -> Result<(), io::Error> {
        let mut data = CalculatorData::new(data);
        // As rbpf: asked now about the program held; a failure keeps the old calculator.
        let frames = match self.prog {
            Some(prog) => frames_of(prog, calculator, &mut data)?,
            None => FrameLayout::Separate,
        };
        self.stack_usage = Some((calculator, data));
        self.frames = frames;
        Ok(())
    }

    fn register_helper(&mut self, key: u32, f: Helper) -> Result<(), io::Error> {
        // rbpf's own memfrob and strcmp dereference what the program passes them: bound in
        // their place, the checked versions keep a sandboxed program inside its memory (and
        // behave the same in trusted runs).
        let thunk = match crate::fn_names::rbpf_helper_at(f as usize) {
            Some(RbpfHelper::Memfrob) => memfrob_checked as PjHelperFn,
            Some(RbpfHelper::Strcmp) => strcmp_checked as PjHelperFn,
            None => c_thunk_for(f).map_err(to_io)?,
        };
        self.helpers.insert(key, (f, thunk));
        self.invalidate();
        Ok(())
    }

    fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
        self.invalidate();
    }

    fn helper_table(&self) -> Vec<HelperEntry> {
        self.helpers
            .iter()
            .map(|(&id, &(_, thunk))| HelperEntry {
                id,
                inline_kind: 0,
                addr: thunk as usize as u64,
            })
            .collect()
    }

    /// The program packjit runs (see `cleared`).
    fn code(&self) -> Result<&[u8], io::Error> {
        let prog = self.prog.ok_or_else(no_program)?;
        Ok(self.cleared.as_deref().unwrap_or(prog))
    }

    fn load_opts(&self) -> LoadOptions {
        LoadOptions {
            budget: self
                .budget
                .map_or(crate::Budget::Default, crate::Budget::Limit),
            ..LoadOptions::default()
        }
    }

    /// Compiles with this VM's helper table (not the runtime's) and commits.
    fn compile(&self, trust: Trust) -> Result<Program, Error> {
        let code = self
            .code()
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
        let prog = self.rt.compile_without_builtins(
            code,
            &self.load_opts(),
            &self.helper_table(),
            trust,
        )?;
        if let Some(a) = prog.packed_arena() {
            a.commit();
        }
        Ok(prog)
    }

    fn sandboxed(&self) -> Result<&Native, io::Error> {
        self.sandboxed_reported_as("")
    }

    /// [`Core::sandboxed`], a failure in rbpf's words for the entry point that compiled
    /// (`prefix`: `""` for the interpreter's, `"[CRANELIFT] "` for `cranelift_compile`).
    fn sandboxed_reported_as(&self, prefix: &str) -> Result<&Native, io::Error> {
        self.code()?;
        let r = self
            .sandboxed
            .get_or_init(|| match self.compile(Trust::Sandboxed) {
                Ok(p) if p.is_executable() => Ok(Native::Code(Box::new(p))),
                Ok(_) => Ok(Native::Interpret),
                // No backend for the host, or one without the sandbox: the interpreter runs the
                // program under the same contract. Anything else (bad bytecode, unknown helper)
                // is the program's fault and is reported.
                Err(e)
                    if matches!(
                        e.kind,
                        ErrorKind::Plugin | ErrorKind::Unsupported | ErrorKind::NotExecutable
                    ) =>
                {
                    Ok(Native::Interpret)
                }
                Err(e) => Err(e),
            });
        r.as_ref()
            .map_err(|e| compile_to_io(e, self.prog.unwrap_or_default(), &self.helpers, prefix))
    }

    fn decoded(&self) -> Result<&packjit_frontend::Program, io::Error> {
        let code = self.code()?;
        self.decoded
            .get_or_init(|| packjit_frontend::decode(code, &self.helper_table()))
            .as_ref()
            .map_err(|e| compile_to_io(e, code, &self.helpers, ""))
    }

    fn interpreter(&self, frames: &FrameLayout) -> Interpreter {
        let mut i = Interpreter::new().with_frame_layout(frames.clone());
        for (&id, &(_, thunk)) in &self.helpers {
            i.set_helper(id, thunk);
        }
        i
    }

    /// Does `execute_program` run native code? Not with packed frames (only the
    /// interpreter packs them), nor where there is no sandboxed code for the host.
    fn is_native(&self) -> bool {
        self.frames == FrameLayout::Separate && matches!(self.sandboxed(), Ok(Native::Code(_)))
    }

    /// Runs sandboxed: r1/r2 = `ctx` (read-write, the program's own), plus `extra` regions,
    /// with the frames of `path` (packed ones only in the interpreter).
    ///
    /// # Safety
    /// `ctx`/`len` is memory the program may read and write and `extra` regions are live
    /// (read-only ones are never written: the sandbox enforces it) for the call, with no Rust
    /// reference to any of it used meanwhile.
    unsafe fn run_sandboxed(
        &self,
        ctx: *mut u8,
        len: usize,
        extra: &[PjMemRegion],
        path: RbpfPath,
    ) -> Result<u64, io::Error> {
        let with_allowed;
        let extra = if self.allowed.is_empty() {
            extra
        } else {
            with_allowed = [extra, &self.allowed].concat();
            &with_allowed[..]
        };
        let (start, ctx_len) = if len == 0 {
            (0, 0)
        } else {
            (ctx as u64, len as u64)
        };
        let frames = self.frames_for(path);
        if *frames != FrameLayout::Separate {
            // SAFETY: forwarded from the caller.
            return unsafe { self.interpret(start, ctx_len, (start, ctx_len), extra, frames) };
        }
        match self.sandboxed()? {
            // SAFETY: forwarded from the caller; the code is sandboxed.
            Native::Code(p) => unsafe { p.call_with_regions(ctx, len, extra, self.budget) },
            Native::Interpret => {
                // SAFETY: forwarded from the caller.
                unsafe { self.interpret(start, ctx_len, (start, ctx_len), extra, frames) }
            }
        }
    }

    /// An interpreted run under the sandbox's contract: r1, r2 and the context (`(start,
    /// len)`, what packet loads read) given apart, the runtime's regions and `extra`, with
    /// `frames`.
    ///
    /// # Safety
    /// The context and `extra` must be valid memory for the call.
    unsafe fn interpret(
        &self,
        r1: u64,
        r2: u64,
        (ctx_start, ctx_len): (u64, u64),
        extra: &[PjMemRegion],
        frames: &FrameLayout,
    ) -> Result<u64, io::Error> {
        let prog = self.decoded()?;
        let mut regions: Vec<PjMemRegion> = self
            .rt
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .to_vec();
        regions.extend_from_slice(extra);
        let env = RawEnv {
            r1,
            r2,
            ctx_start,
            ctx_end: ctx_start + ctx_len,
            regions: &regions,
            // Interpreted runs check like sandboxed code, and end like it too.
            budget: Some(self.budget.unwrap_or(crate::DEFAULT_BUDGET)),
        };
        let interpreter = self.interpreter(frames);
        // SAFETY: the caller vouches for the context and `extra`; runtime regions were
        // registered under `MemRegion::new`'s promise.
        crate::exec::without_jit_env(|| unsafe { interpreter.run_raw(prog, &env, None) })
            .map(|o| o.r0)
            .map_err(|s| run_to_io(RunError::Stop(s)))
    }

    /// Does a metadata-buffer flavour's run (r1 = the buffer, not `mem`) have to be
    /// interpreted? With legacy packet loads it does: rbpf reads them from `mem`, packjit's
    /// compiled code from the memory r1 points to at entry, and only the interpreter takes
    /// the two apart ([`Core::run_split`]).
    fn split_run(&self, r1_is_mem: bool) -> bool {
        !r1_is_mem && self.prog.is_some_and(has_packet_loads)
    }

    /// A run of a metadata-buffer flavour with packet loads (see [`Core::split_run`]):
    /// interpreted, r1 = `buf`, packet loads from `mem`; `extra` must make both reachable;
    /// the frames of `path`.
    ///
    /// # Safety
    /// Both buffers and `extra` must be valid memory for the call.
    unsafe fn run_split(
        &self,
        (buf, buf_len): (*mut u8, usize),
        (mem, mem_len): (*const u8, usize),
        extra: &[PjMemRegion],
        path: RbpfPath,
    ) -> Result<u64, io::Error> {
        self.code()?;
        let with_allowed = [extra, &self.allowed].concat();
        let mem = if mem_len == 0 { 0 } else { mem as u64 };
        // SAFETY: forwarded from the caller.
        unsafe {
            self.interpret(
                buf as u64,
                buf_len as u64,
                (mem, mem_len as u64),
                &with_allowed,
                self.frames_for(path),
            )
        }
    }

    /// rbpf's `cranelift_compile`: the sandboxed code, compiled now (rbpf's Cranelift code
    /// checks every access, as packjit's sandboxed code does).
    #[cfg(feature = "cranelift")]
    fn cranelift_compile(&mut self) -> Result<(), io::Error> {
        self.sandboxed_reported_as("[CRANELIFT] ")?;
        self.cranelift = true;
        Ok(())
    }

    /// rbpf's refusal of a Cranelift run before `cranelift_compile`.
    #[cfg(feature = "cranelift")]
    fn cranelift_compiled(&self) -> Result<(), io::Error> {
        if self.cranelift {
            Ok(())
        } else {
            Err(io::Error::other(
                "Error: program has not been compiled with cranelift",
            ))
        }
    }

    fn jit_compile(&mut self) -> Result<(), io::Error> {
        let code = self.code()?;
        let p = (self.compile(Trust::Trusted))
            .map_err(|e| compile_to_io(&e, code, &self.helpers, "[JIT] "))?;
        if !p.is_executable() {
            return Err(io::Error::other(format!(
                "Error: no packjit backend targets this host (code compiled for {})",
                p.arch()
            )));
        }
        self.trusted = Some(p);
        Ok(())
    }

    /// # Safety
    /// As [`Core::run_sandboxed`], and the program stays inside that memory (trusted code is
    /// not checked).
    unsafe fn run_trusted(
        &self,
        ctx: *mut u8,
        len: usize,
        extra: &[PjMemRegion],
    ) -> Result<u64, io::Error> {
        let p = self
            .trusted
            .as_ref()
            .ok_or_else(|| io::Error::other("Error: program has not been JIT-compiled"))?;
        let with_allowed = [extra, &self.allowed].concat();
        // SAFETY: forwarded from the caller; the allowed ranges were vouched for when
        // registered (`register_allowed_memory`).
        unsafe { p.call_with_regions(ctx, len, &with_allowed, self.budget) }
    }

    fn register_allowed_memory(&mut self, range: std::ops::Range<u64>) {
        // An empty or reversed range allows nothing (rbpf's check would never match it).
        if range.end > range.start {
            self.allowed.push(region(
                range.start as *const u8,
                (range.end - range.start) as usize,
                true,
            ));
        }
    }
}

impl Program {
    /// Runs the program with `(ctx, len)` as r1/r2 and context region, and `extra` regions
    /// besides the program's own, with `budget` (if the code counts one).
    ///
    /// # Safety
    /// As [`Program::call_raw`], for `extra` too.
    unsafe fn call_with_regions(
        &self,
        ctx: *mut u8,
        len: usize,
        extra: &[PjMemRegion],
        budget: Option<u64>,
    ) -> Result<u64, io::Error> {
        self.check_executable().map_err(run_to_io)?;
        let _guard = arena::epoch_pin();
        let regions: Vec<PjMemRegion> = if extra.is_empty() {
            self.regions.to_vec()
        } else {
            self.regions.iter().chain(extra).copied().collect()
        };
        // SAFETY: committed code kept alive by `self` and the epoch pin; the caller vouches
        // for the memory.
        unsafe {
            exec::run(
                self.entry_now(),
                ctx,
                len,
                &regions,
                budget.or(self.budget).unwrap_or(u64::MAX),
                self.trust(),
                0,
            )
        }
        .map_err(run_to_io)
    }
}

/// What r1 points to in [`EbpfVmMbuff`]'s runs, as in rbpf: the metadata buffer, or `mem`
/// when the buffer is empty.
fn r1_buffer(mem: &mut [u8], mbuff: &mut [u8]) -> (*mut u8, usize) {
    if mbuff.is_empty() {
        (mem.as_mut_ptr(), mem.len())
    } else {
        (mbuff.as_mut_ptr(), mbuff.len())
    }
}

fn region(p: *const u8, len: usize, writable: bool) -> PjMemRegion {
    PjMemRegion {
        start: p as u64,
        len: len as u64,
        flags: if writable { PJ_REGION_WRITABLE } else { 0 },
    }
}

macro_rules! common_methods {
    () => {
        /// Loads (and verifies) a new program; code compiled for the previous one is dropped.
        pub fn set_program(&mut self, prog: &'a [u8]) -> Result<(), io::Error> {
            self.core.set_program(prog)
        }

        /// Replaces the verifier; the program already loaded must pass it.
        pub fn set_verifier(&mut self, verifier: Verifier) -> Result<(), io::Error> {
            self.core.set_verifier(verifier)
        }

        /// rbpf's stack usage calculator, asked now if a program is set (and for each program
        /// set later) what rbpf asks it. From then on `execute_program` gives a program with
        /// bpf-to-bpf calls rbpf's packed frames: one 512-byte stack, a callee's r10 its
        /// caller's minus the calling function's usage (see the module docs; the JIT and
        /// Cranelift runs keep separate frames, as rbpf's do not read the calculator).
        pub fn set_stack_usage_calculator(
            &mut self,
            calculator: StackUsageCalculator,
            data: Box<dyn Any + Send + Sync>,
        ) -> Result<(), io::Error> {
            self.core.set_stack_usage_calculator(calculator, data)
        }

        /// rbpf's custom executable memory for its JIT (for `no_std` hosts): accepted and not
        /// used. packjit places code in its own packed W^X arena, never in memory the host
        /// hands over writable.
        pub fn set_jit_exec_memory(&mut self, memory: &'a mut [u8]) -> Result<(), io::Error> {
            let _ = memory;
            Ok(())
        }

        /// Registers helper `key` for this VM only (another VM may bind the same id to another
        /// function). Code compiled earlier is dropped (it was linked to the old table).
        pub fn register_helper(&mut self, key: u32, function: Helper) -> Result<(), io::Error> {
            self.core.register_helper(key, function)
        }

        /// rbpf's `register_allowed_memory`: the program may also load from and store to
        /// `addrs_range` (each call adds one), in packjit's terms a read-write region of
        /// every run, checked like the memory the run is given. As in rbpf this safe method
        /// takes the host's word: the range must be valid memory whenever the VM runs a
        /// program (packjit's own API asks for that promise through the `unsafe`
        /// `MemRegion::new`).
        pub fn register_allowed_memory(&mut self, addrs_range: std::ops::Range<u64>) {
            self.core.register_allowed_memory(addrs_range)
        }

        /// packjit extension: an instruction budget for every run, charged at back-edges and
        /// calls; running out stops the program with a budget error. `None` (the default):
        /// [`DEFAULT_BUDGET`](crate::DEFAULT_BUDGET) for sandboxed and interpreted runs, no
        /// counting in trusted JIT code; `Some(u64::MAX)` is as good as no limit.
        pub fn set_instruction_budget(&mut self, budget: Option<u64>) {
            self.core.set_budget(budget)
        }

        /// Compiles trusted native code for [`execute_program_jit`](Self::execute_program_jit)
        /// (`execute_program` compiles sandboxed code by itself). Fails when no backend
        /// targets the host.
        pub fn jit_compile(&mut self) -> Result<(), io::Error> {
            self.core.jit_compile()
        }

        /// rbpf's Cranelift compile (feature `cranelift`, as in rbpf): compiles the sandboxed
        /// code `execute_program_cranelift` (and `execute_program`) runs. packjit has no
        /// Cranelift inside; its JIT checks every access the way rbpf's Cranelift code does,
        /// so the Cranelift runs stay safe functions.
        #[cfg(feature = "cranelift")]
        pub fn cranelift_compile(&mut self) -> Result<(), io::Error> {
            self.core.cranelift_compile()
        }

        /// Whether `execute_program` runs native (sandboxed) code rather than the interpreter
        /// (which it needs for rbpf's packed frames: a stack usage calculator and a
        /// bpf-to-bpf call).
        pub fn is_native(&self) -> bool {
            self.core.is_native()
        }
    };
}

/// rbpf's `EbpfVmRaw`: r1 = the memory, r2 = its length.
pub struct EbpfVmRaw<'a> {
    core: Core<'a>,
}

impl<'a> EbpfVmRaw<'a> {
    /// A VM on [`default_runtime`], with `prog` verified if given.
    pub fn new(prog: Option<&'a [u8]>) -> Result<Self, io::Error> {
        Self::new_with_runtime(prog, default_runtime())
    }

    /// A VM on `rt` (its backends; its arena packs the code of every VM using it).
    pub fn new_with_runtime(prog: Option<&'a [u8]>, rt: Arc<Runtime>) -> Result<Self, io::Error> {
        Ok(Self {
            core: Core::new(prog, rt)?,
        })
    }

    common_methods!();

    /// Runs the program sandboxed on `mem` (rbpf's interpreter run: packed frames when a
    /// stack usage calculator is set).
    pub fn execute_program(&self, mem: &mut [u8]) -> Result<u64, io::Error> {
        self.run(mem, RbpfPath::Interpreter)
    }

    fn run(&self, mem: &mut [u8], path: RbpfPath) -> Result<u64, io::Error> {
        // SAFETY: `mem` is exclusively borrowed for the call.
        unsafe { (self.core).run_sandboxed(mem.as_mut_ptr(), mem.len(), &[], path) }
    }

    /// Runs the trusted code of [`jit_compile`](Self::jit_compile) on `mem`.
    ///
    /// # Safety
    /// The program's accesses are not checked: every address it computes must be in `mem`,
    /// its stack or a region the runtime registered.
    pub unsafe fn execute_program_jit(&self, mem: &mut [u8]) -> Result<u64, io::Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.core.run_trusted(mem.as_mut_ptr(), mem.len(), &[]) }
    }

    /// rbpf's Cranelift run (feature `cranelift`): the sandboxed code, after
    /// `cranelift_compile` (separate frames: rbpf's Cranelift code reads no calculator).
    #[cfg(feature = "cranelift")]
    pub fn execute_program_cranelift(&self, mem: &mut [u8]) -> Result<u64, io::Error> {
        self.core.cranelift_compiled()?;
        self.run(mem, RbpfPath::Compiled)
    }
}

/// rbpf's `EbpfVmMbuff`: r1 = the metadata buffer (or `mem` when the buffer is empty), which
/// may hold pointers into `mem`.
pub struct EbpfVmMbuff<'a> {
    core: Core<'a>,
}

impl<'a> EbpfVmMbuff<'a> {
    /// A VM on [`default_runtime`], with `prog` verified if given.
    pub fn new(prog: Option<&'a [u8]>) -> Result<Self, io::Error> {
        Self::new_with_runtime(prog, default_runtime())
    }

    /// A VM on `rt`.
    pub fn new_with_runtime(prog: Option<&'a [u8]>, rt: Arc<Runtime>) -> Result<Self, io::Error> {
        Ok(Self {
            core: Core::new(prog, rt)?,
        })
    }

    common_methods!();

    /// Runs the program sandboxed. Both buffers are shared borrows, so neither is written:
    /// r1 points to a private copy of the metadata buffer (the program may write the copy),
    /// and `mem` (and `mbuff`) are read-only regions, so pointers stored in the metadata
    /// reach them; a store into `mem` stops with an out-of-bounds error.
    pub fn execute_program(&self, mem: &[u8], mbuff: &[u8]) -> Result<u64, io::Error> {
        let r1_buf = if mbuff.is_empty() { mem } else { mbuff };
        let mut copy = r1_buf.to_vec();
        let mut extra = vec![
            region(mem.as_ptr(), mem.len(), false),
            region(mbuff.as_ptr(), mbuff.len(), false),
        ];
        if self.core.split_run(mbuff.is_empty()) {
            extra.push(region(copy.as_ptr(), copy.len(), true));
            // SAFETY: `copy` is ours for the call; `mem` and `mbuff` are live shared borrows
            // the interpreter never writes (read-only regions).
            return unsafe {
                (self.core).run_split(
                    (copy.as_mut_ptr(), copy.len()),
                    (mem.as_ptr(), mem.len()),
                    &extra,
                    RbpfPath::Interpreter,
                )
            };
        }
        // SAFETY: `copy` is ours for the call; `mem` and `mbuff` are live shared borrows that
        // the sandbox never writes (read-only regions).
        unsafe {
            (self.core).run_sandboxed(copy.as_mut_ptr(), copy.len(), &extra, RbpfPath::Interpreter)
        }
    }

    /// Runs the trusted code of [`jit_compile`](Self::jit_compile): r1 = `mbuff` (or `mem`
    /// when `mbuff` is empty).
    ///
    /// # Safety
    /// The program's accesses are not checked: it must only touch `mem`, `mbuff` and its
    /// stack.
    pub unsafe fn execute_program_jit(
        &self,
        mem: &mut [u8],
        mbuff: &mut [u8],
    ) -> Result<u64, io::Error> {
        if self.core.split_run(mbuff.is_empty()) {
            let extra = [
                region(mem.as_ptr(), mem.len(), true),
                region(mbuff.as_ptr(), mbuff.len(), true),
            ];
            let r1 = (mbuff.as_mut_ptr(), mbuff.len());
            // SAFETY: both buffers are exclusively borrowed for the call.
            return unsafe {
                (self.core).run_split(r1, (mem.as_ptr(), mem.len()), &extra, RbpfPath::Compiled)
            };
        }
        let (p, len) = r1_buffer(mem, mbuff);
        // SAFETY: forwarded from the caller.
        unsafe { self.core.run_trusted(p, len, &[]) }
    }

    /// rbpf's Cranelift run (feature `cranelift`), after `cranelift_compile`: sandboxed, r1 =
    /// `mbuff` (or `mem` when `mbuff` is empty); both buffers are exclusively borrowed here,
    /// so both are read-write regions (pointers stored in the metadata reach `mem`).
    #[cfg(feature = "cranelift")]
    pub fn execute_program_cranelift(
        &self,
        mem: &mut [u8],
        mbuff: &mut [u8],
    ) -> Result<u64, io::Error> {
        self.core.cranelift_compiled()?;
        let extra = [
            region(mem.as_ptr(), mem.len(), true),
            region(mbuff.as_ptr(), mbuff.len(), true),
        ];
        if self.core.split_run(mbuff.is_empty()) {
            let r1 = (mbuff.as_mut_ptr(), mbuff.len());
            // SAFETY: both buffers are exclusively borrowed for the call.
            return unsafe {
                (self.core).run_split(r1, (mem.as_ptr(), mem.len()), &extra, RbpfPath::Compiled)
            };
        }
        let (p, len) = r1_buffer(mem, mbuff);
        // SAFETY: both buffers are exclusively borrowed for the call; the code is sandboxed.
        unsafe { (self.core).run_sandboxed(p, len, &extra, RbpfPath::Compiled) }
    }
}

/// rbpf's `EbpfVmFixedMbuff`: the VM owns a metadata buffer and writes the memory's start
/// and end addresses into it at `data_offset` and `data_end_offset` before each run; r1 =
/// the buffer.
pub struct EbpfVmFixedMbuff<'a> {
    core: Core<'a>,
    mbuff: Vec<u8>,
    data_offset: usize,
    data_end_offset: usize,
}

/// The metadata buffer a fixed-mbuff VM allocates: as rbpf, just large enough for both
/// 8-byte fields. Offsets whose fields would end past [`MAX_METADATA_LEN`] are refused: the
/// buffer is allocated whole, and an offset near `usize::MAX` would overflow or exhaust
/// memory instead of failing.
fn metadata_len(data_offset: usize, data_end_offset: usize) -> Result<usize, io::Error> {
    data_offset
        .max(data_end_offset)
        .checked_add(8)
        .filter(|&len| len <= MAX_METADATA_LEN)
        .ok_or_else(|| {
            io::Error::other(format!(
                "Error: data offsets {data_offset:#x} and {data_end_offset:#x} put the metadata \
                 fields past the {MAX_METADATA_LEN}-byte limit of the metadata buffer"
            ))
        })
}

/// The largest metadata buffer a fixed-mbuff VM allocates (1 MiB).
pub const MAX_METADATA_LEN: usize = 1 << 20;

impl<'a> EbpfVmFixedMbuff<'a> {
    /// A VM on [`default_runtime`] whose metadata buffer holds the memory's start at
    /// `data_offset` and end at `data_end_offset` (both u64).
    pub fn new(
        prog: Option<&'a [u8]>,
        data_offset: usize,
        data_end_offset: usize,
    ) -> Result<Self, io::Error> {
        Self::new_with_runtime(prog, data_offset, data_end_offset, default_runtime())
    }

    /// A VM on `rt`.
    pub fn new_with_runtime(
        prog: Option<&'a [u8]>,
        data_offset: usize,
        data_end_offset: usize,
        rt: Arc<Runtime>,
    ) -> Result<Self, io::Error> {
        let len = metadata_len(data_offset, data_end_offset)?;
        Ok(Self {
            core: Core::new(prog, rt)?,
            mbuff: vec![0; len],
            data_offset,
            data_end_offset,
        })
    }

    common_methods!();

    /// Loads a new program with new offsets (rbpf's signature).
    pub fn set_program_with_offsets(
        &mut self,
        prog: &'a [u8],
        data_offset: usize,
        data_end_offset: usize,
    ) -> Result<(), io::Error> {
        // Checked before anything changes: a refused call leaves the VM as it was.
        let len = metadata_len(data_offset, data_end_offset)?;
        self.core.set_program(prog)?;
        self.data_offset = data_offset;
        self.data_end_offset = data_end_offset;
        self.mbuff = vec![0; len];
        Ok(())
    }

    fn fill(&mut self, mem: &[u8]) {
        let (start, end) = if mem.is_empty() {
            (0, 0)
        } else {
            (mem.as_ptr() as u64, mem.as_ptr() as u64 + mem.len() as u64)
        };
        self.mbuff[self.data_offset..self.data_offset + 8].copy_from_slice(&start.to_le_bytes());
        self.mbuff[self.data_end_offset..self.data_end_offset + 8]
            .copy_from_slice(&end.to_le_bytes());
    }

    /// Runs the program sandboxed: r1 = the metadata buffer (read-write), `mem` a read-write
    /// region reached through the addresses stored in it (rbpf's interpreter run: packed
    /// frames when a stack usage calculator is set).
    pub fn execute_program(&mut self, mem: &mut [u8]) -> Result<u64, io::Error> {
        self.run(mem, RbpfPath::Interpreter)
    }

    fn run(&mut self, mem: &mut [u8], path: RbpfPath) -> Result<u64, io::Error> {
        self.fill(mem);
        let (p, len) = (self.mbuff.as_mut_ptr(), self.mbuff.len());
        let mem_span = (mem.as_ptr(), mem.len());
        if self.core.split_run(false) {
            let extra = [region(mem.as_ptr(), mem.len(), true), region(p, len, true)];
            // SAFETY: the buffer and `mem` are exclusively borrowed for the call.
            return unsafe { (self.core).run_split((p, len), mem_span, &extra, path) };
        }
        let extra = [region(mem.as_ptr(), mem.len(), true)];
        // SAFETY: the buffer and `mem` are exclusively borrowed for the call.
        unsafe { (self.core).run_sandboxed(p, len, &extra, path) }
    }

    /// Runs the trusted code of [`jit_compile`](Self::jit_compile).
    ///
    /// # Safety
    /// The program's accesses are not checked: it must only touch `mem`, the metadata buffer
    /// and its stack.
    pub unsafe fn execute_program_jit(&mut self, mem: &mut [u8]) -> Result<u64, io::Error> {
        self.fill(mem);
        let (p, len) = (self.mbuff.as_mut_ptr(), self.mbuff.len());
        if self.core.split_run(false) {
            let extra = [region(mem.as_ptr(), mem.len(), true), region(p, len, true)];
            let mem_span = (mem.as_ptr(), mem.len());
            // SAFETY: the buffer and `mem` are exclusively borrowed for the call.
            return unsafe {
                (self.core).run_split((p, len), mem_span, &extra, RbpfPath::Compiled)
            };
        }
        let extra = [region(mem.as_ptr(), mem.len(), true)];
        // SAFETY: forwarded from the caller.
        unsafe { self.core.run_trusted(p, len, &extra) }
    }

    /// rbpf's Cranelift run (feature `cranelift`): [`execute_program`](Self::execute_program)
    /// after `cranelift_compile`, with separate frames (rbpf's Cranelift code reads no
    /// calculator).
    #[cfg(feature = "cranelift")]
    pub fn execute_program_cranelift(&mut self, mem: &mut [u8]) -> Result<u64, io::Error> {
        self.core.cranelift_compiled()?;
        self.run(mem, RbpfPath::Compiled)
    }
}

/// rbpf's `EbpfVmNoData`: no memory; r1 = r2 = 0.
pub struct EbpfVmNoData<'a> {
    core: Core<'a>,
}

impl<'a> EbpfVmNoData<'a> {
    /// A VM on [`default_runtime`], with `prog` verified if given.
    pub fn new(prog: Option<&'a [u8]>) -> Result<Self, io::Error> {
        Self::new_with_runtime(prog, default_runtime())
    }

    /// A VM on `rt`.
    pub fn new_with_runtime(prog: Option<&'a [u8]>, rt: Arc<Runtime>) -> Result<Self, io::Error> {
        Ok(Self {
            core: Core::new(prog, rt)?,
        })
    }

    common_methods!();

    /// Runs the program sandboxed, without memory (rbpf's interpreter run: packed frames
    /// when a stack usage calculator is set).
    pub fn execute_program(&self) -> Result<u64, io::Error> {
        self.run(RbpfPath::Interpreter)
    }

    fn run(&self, path: RbpfPath) -> Result<u64, io::Error> {
        // SAFETY: an empty context: nothing but the stack is reachable.
        unsafe { (self.core).run_sandboxed(std::ptr::null_mut(), 0, &[], path) }
    }

    /// Runs the trusted code of [`jit_compile`](Self::jit_compile).
    ///
    /// # Safety
    /// The program's accesses are not checked: it must only touch its stack.
    pub unsafe fn execute_program_jit(&self) -> Result<u64, io::Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.core.run_trusted(std::ptr::null_mut(), 0, &[]) }
    }

    /// rbpf's Cranelift run (feature `cranelift`): [`execute_program`](Self::execute_program)
    /// after `cranelift_compile`, with separate frames (rbpf's Cranelift code reads no
    /// calculator).
    #[cfg(feature = "cranelift")]
    pub fn execute_program_cranelift(&self) -> Result<u64, io::Error> {
        self.core.cranelift_compiled()?;
        self.run(RbpfPath::Compiled)
    }
}
