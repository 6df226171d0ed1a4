//! The bridge to rbpf.
//!
//! * [`JitVm`] mirrors rbpf's `EbpfVmRaw` (`register_helper`, `jit_compile`,
//!   `execute_program`) so an rbpf host can switch by changing one type: programs run as
//!   packjit native code where a backend targets the host, and through rbpf's interpreter
//!   (same helpers, same semantics for what rbpf supports) everywhere else.
//! * rbpf helpers are Rust-ABI `fn(u64, u64, u64, u64, u64) -> u64`; JIT code calls
//!   `extern "C"` functions. [`extern_c_helper!`](crate::extern_c_helper) wraps a helper known
//!   at compile time; [`c_thunk_for`] binds one known only at run time to one of a fixed set of
//!   `extern "C"` thunks; [`register_rbpf_helpers`] registers rbpf's standard set.

use crate::{Error, ErrorKind, LoadOptions, PjHelperFn, Program, Runtime};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
        ("memfrob", extern_c_helper!(rbpf::helpers::memfrob)),
        ("sqrti", extern_c_helper!(rbpf::helpers::sqrti)),
        ("strcmp", extern_c_helper!(rbpf::helpers::strcmp)),
        ("rand", extern_c_helper!(rbpf::helpers::rand)),
    ];
    for (i, (name, f)) in extra.into_iter().enumerate() {
        rt.register_helper(first_extra_id + i as u32, name, f)?;
    }
    Ok(())
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

/// rbpf's `EbpfVmRaw`, served by packjit: native code where the runtime has a backend for
/// the host, rbpf's interpreter otherwise.
pub struct JitVm<'a> {
    rt: Arc<Runtime>,
    code: &'a [u8],
    helpers: BTreeMap<u32, Helper>,
    jitted: Option<Program>,
}

impl<'a> JitVm<'a> {
    /// A VM for `code` on runtime `rt` (which may be shared by many VMs: their code is packed
    /// into its one arena).
    pub fn new(rt: Arc<Runtime>, code: &'a [u8]) -> Self {
        Self {
            rt,
            code,
            helpers: BTreeMap::new(),
            jitted: None,
        }
    }

    /// Registers helper `key` for this program. It is also registered with the runtime
    /// (through a thunk), where ids are shared by every program: registering the same
    /// function again under the same id is fine, a different one is an error.
    pub fn register_helper(&mut self, key: u32, f: Helper) -> Result<(), Error> {
        let thunk = c_thunk_for(f)?;
        match self.rt.helpers().iter().find(|h| h.id == key) {
            Some(h) if h.addr == thunk as usize as u64 => {}
            Some(h) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "helper id {key} is already registered in the runtime as {:?}",
                        h.name
                    ),
                ))
            }
            None => self
                .rt
                .register_helper(key, &format!("rbpf helper {key}"), thunk)?,
        }
        self.helpers.insert(key, f);
        Ok(())
    }

    /// Compiles the program to native code for the host. Fails (naming the arch) when no
    /// backend targets the host; `execute_program` then interprets.
    pub fn jit_compile(&mut self) -> Result<(), Error> {
        let prog = self.rt.load(self.code, &LoadOptions::default())?;
        if !prog.is_executable() {
            return Err(Error::new(
                ErrorKind::NotExecutable,
                "no backend targets this host",
            ));
        }
        self.jitted = Some(prog);
        Ok(())
    }

    /// Whether `execute_program` runs native code.
    pub fn is_jitted(&self) -> bool {
        self.jitted.is_some()
    }

    /// Runs the program on `mem`: natively once compiled, in rbpf's interpreter before.
    pub fn execute_program(&self, mem: &mut [u8]) -> Result<u64, Error> {
        if let Some(p) = &self.jitted {
            return p.call(mem);
        }
        let rbpf_err = |e: std::io::Error| Error::new(ErrorKind::Verify, format!("rbpf: {e}"));
        let mut vm = rbpf::EbpfVmRaw::new(Some(self.code)).map_err(rbpf_err)?;
        for (&k, &f) in &self.helpers {
            vm.register_helper(k, f).map_err(rbpf_err)?;
        }
        vm.execute_program(mem)
            .map_err(|e| Error::new(ErrorKind::Internal, format!("rbpf: {e}")))
    }
}
