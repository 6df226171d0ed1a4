//! Shared test harness: compile with explicit `PJ_COMPILE_*` flags straight through the
//! backend into the runtime's packed arena, and run with a host-built `PjExecEnv` (the
//! runtime's own sandbox API is added by the lead in parallel; this harness needs none of it).
#![allow(dead_code)]

use packjit::Runtime;
use packjit_plugin_api::abi::{PjExecEnv, PjMemRegion, PJ_ACCESS_WRITE, PJ_STOP_NONE};
use packjit_plugin_api::{CodeArena, CompileRequest, Compiled, HelperEntry, JitBackend};
use packjit_testkit::conformance::{Engine, Loaded, SUITE_HELPER_ID};
use packjit_x86_64::X86Backend;

pub fn asm(src: &str) -> Vec<u8> {
    packjit_testkit::asm::assemble(src).unwrap_or_else(|e| panic!("assembling {src:?}: {e}"))
}

pub fn suite_helpers() -> Vec<HelperEntry> {
    vec![HelperEntry {
        id: SUITE_HELPER_ID,
        inline_kind: 0,
        addr: packjit_testkit::reference::helper_identity as *const () as usize as u64,
    }]
}

/// Compiles and runs x86-64 code natively.
pub struct Jit {
    pub rt: Runtime,
    pub flags: u32,
    pub features: u64,
    pub blind_key: u64,
    pub helpers: Vec<HelperEntry>,
    /// Budget handed to every run.
    pub budget: u64,
    /// Host regions handed to every run.
    pub regions: Vec<PjMemRegion>,
}

/// What a run ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub r0: u64,
    pub env: PjExecEnv,
}

impl Outcome {
    /// `Ok(r0)` or `Err((kind, pc, addr, access))` for a stop.
    pub fn result(&self) -> Result<u64, (u32, u64, u64, u32)> {
        if self.env.stop_kind == PJ_STOP_NONE {
            Ok(self.r0)
        } else {
            Err((
                self.env.stop_kind,
                self.env.stop_pc,
                self.env.stop_addr,
                self.env.stop_access,
            ))
        }
    }
}

pub struct Code<'a> {
    jit: &'a Jit,
    pub compiled: Compiled,
}

impl Drop for Code<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.jit.rt.arena() {
            a.free_deferred(self.compiled.region);
        }
    }
}

impl Code<'_> {
    pub fn run(&self, mem: &mut [u8]) -> Outcome {
        let len = mem.len() as u64;
        self.run_with_ctx_len(mem, len)
    }

    /// [`Code::run`] with `env.ctx_len` as given (the host's copy of the length the
    /// checks compare against; `ctx_end` stays the slice's end).
    pub fn run_with_ctx_len(&self, mem: &mut [u8], ctx_len: u64) -> Outcome {
        let mut env = PjExecEnv {
            ctx_start: mem.as_ptr() as u64,
            ctx_end: mem.as_ptr() as u64 + mem.len() as u64,
            ctx_len,
            budget: self.jit.budget,
            regions: self.jit.regions.as_ptr() as u64,
            region_count: self.jit.regions.len() as u64,
            ..Default::default()
        };
        // SAFETY: committed x86-64 code with the PjProgramEntry signature, running on
        // x86-64; `mem`, `env` and the regions outlive the call.
        let r0 = unsafe {
            let f: packjit_plugin_api::PjProgramEntry =
                std::mem::transmute(self.compiled.entry as usize);
            f(mem.as_mut_ptr(), mem.len() as u64, &mut env)
        };
        Outcome { r0, env }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let a = self.jit.rt.arena().expect("x86-64 host has an arena");
        a.read_code(self.compiled.entry, self.compiled.code_size)
            .expect("code readable")
    }
}

impl Jit {
    pub fn new(flags: u32, features: u64) -> Self {
        Jit {
            rt: Runtime::new().expect("runtime"),
            flags,
            features,
            blind_key: 0x0123_4567_89ab_cdef,
            helpers: suite_helpers(),
            budget: u64::MAX,
            regions: Vec::new(),
        }
    }

    pub fn compile(&self, code: &[u8]) -> Result<Code<'_>, String> {
        let req = CompileRequest {
            code,
            helpers: &self.helpers,
            features: self.features,
            flags: self.flags,
            blind_key: self.blind_key,
        };
        let arena = self.rt.arena().expect("x86-64 host has an arena");
        let compiled = X86Backend::new()
            .compile(&req, arena as &dyn CodeArena)
            .map_err(|e| e.to_string())?;
        arena.commit();
        Ok(Code {
            jit: self,
            compiled,
        })
    }
}

impl Engine for Jit {
    fn label(&self) -> String {
        format!(
            "x86_64 (flags {:#x}, features {:#x}, packjit-x86-64 direct)",
            self.flags, self.features
        )
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        Ok(Box::new(self.compile(code)?))
    }
}

impl Loaded for Code<'_> {
    fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
        let o = Code::run(self, mem);
        Some(o.result().map_err(|(k, pc, addr, acc)| {
            format!("stop kind {k} at pc {pc} (addr {addr:#x}, access {acc:#x})")
        }))
    }
}

pub const WRITE: u32 = PJ_ACCESS_WRITE;
