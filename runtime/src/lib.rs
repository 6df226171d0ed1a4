//! # packjit
//!
//! The host side of packjit: compile eBPF programs (RFC 9669, cpu v4) to native code for
//! x86-64, arm64 and RV64, pack them into one shared W^X code arena, run them sandboxed or
//! trusted, and free them safely while other threads may still be running them.
//!
//! ## Quickstart
//!
//! The backend for the host's architecture is linked in by default, so a runtime compiles
//! and runs code as soon as it exists:
//!
//! ```
//! use packjit::{LoadOptions, RunError, Runtime, Stop};
//!
//! let rt = Runtime::new()?;
//! // r0 = the context's first byte + 1 (eBPF bytecode; `ElfLoadOptions` loads clang objects).
//! let code = [
//!     0x71, 0x10, 0, 0, 0, 0, 0, 0, // ldxb r0, [r1 + 0]
//!     0x07, 0x00, 0, 0, 1, 0, 0, 0, // add r0, 1
//!     0x95, 0x00, 0, 0, 0, 0, 0, 0, // exit
//! ];
//! let prog = rt.load(&code, &LoadOptions::default())?; // sandboxed
//! # if packjit::linked_backend().is_some() {
//! assert_eq!(prog.call(&mut [41])?, 42);
//! // An empty context: the read is refused and the run stops, naming the pc.
//! let stop = prog.call(&mut []).unwrap_err();
//! assert!(matches!(stop, RunError::Stop(Stop::OutOfBounds { pc: 0, size: 1, .. })));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! More, each a short program: `cargo run -p packjit --example <name>` with `sandboxed_elf`
//! (a clang-built object), `rbpf_switch`, `hooks`, `percpu`, `maps`, `ringbuf`.
//!
//! ## The sandbox contract
//!
//! A program loaded with [`Runtime::load`] (or [`Runtime::load_elf`], [`HookBatch`], the
//! [`rbpf_bridge`] VMs' `execute_program`) is **sandboxed**:
//!
//! * It may read and write its context (`r1`, `r2` bytes; the slice given to
//!   [`Program::call`]), its own 512-byte stack frame per call level, and host regions
//!   ([`Runtime::add_region`], [`LoadOptions::regions`], an ELF object's globals, map
//!   values), each read-only or read-write. Every other load, store or atomic stops the
//!   program before the access: [`Program::call`] returns [`RunError::Stop`] with a
//!   [`Stop::OutOfBounds`] naming the pc, the address, the size and the direction. No
//!   signal reaches the host, and the checks are Spectre-safe (the failing side clamps the
//!   address).
//! * It runs at most its budget: [`DEFAULT_BUDGET`] instructions per call unless
//!   [`LoadOptions::budget`] says otherwise, then [`Stop::Budget`].
//! * It calls only helpers registered before it was loaded ([`Runtime::register_helper`],
//!   the built-in map and kernel helpers); an unknown `call` fails the load, an unknown
//!   `callx` stops the run ([`Stop::UnknownCallx`]). Helpers check pointer arguments with
//!   [`helper_access_ok`].
//! * Registers r0, r3–r9 and the stack start at zero, so nothing of the host leaks in.
//!
//! **Trusted** code ([`Runtime::load_trusted`], `unsafe`) has no checks: the host vouches
//! for it, as after the kernel's verifier. Both are verified structurally at load (valid
//! opcodes and registers, jumps and calls inside the program). Details:
//! `docs/ARCHITECTURE.md`, "Sandbox contract".
//!
//! ## What runs where
//!
//! | host | native code | backend in `Runtime::new()` | as a plugin |
//! |---|---|---|---|
//! | x86-64 | sandboxed and trusted | `packjit-x86-64` (feature `backend-x86_64`) | `libpackjit_x86_64.so` |
//! | arm64 (aarch64) | sandboxed and trusted | `packjit-arm64` (feature `backend-arm64`) | `libpackjit_arm64.so` |
//! | RV64 (riscv64gc) | sandboxed and trusted | `packjit-rv64` (feature `backend-rv64`) | `libpackjit_rv64.so` |
//! | other | none: the [`rbpf_bridge`] interprets (`packjit-interp`, same contract) | none | none |
//!
//! Any host can compile for every architecture it has a backend for
//! ([`LoadOptions::arch`]; add foreign ones with [`Runtime::add_backend`] or
//! [`Runtime::load_plugin`]); such code is for inspection and cannot be called. A backend
//! loaded for the host's architecture replaces the linked one; `default-features = false`
//! or [`RuntimeConfig::linked_backend`] `= false` starts without it. The C API
//! (`packjit-ffi`, `libpackjit.so`) always starts without a backend and loads plugins.
//!
//! ## Profilers and debuggers
//!
//! Programs carry names that profilers and debuggers see: [`Runtime::enable_perf_map`] keeps
//! the perf map current, and [`Runtime::enable_gdb_jit`] registers them with gdb (see
//! [`gdb_jit`]; under gdb, `hbreak <program name>` stops in one). perf reads the map for
//! anonymous memory only, and gdb plants software breakpoints only in private mappings:
//! with [`MapMode::Toggle`] ([`ArenaConfig::map_mode`]) both work; the default dual
//! mapping needs hardware breakpoints and shows perf samples as `memfd` offsets.

pub mod arena;
pub mod builtins;
mod callbacks;
pub mod elf;
mod exec;
mod fn_names;
pub mod gdb_jit;
mod heap_arena;
mod hook;
mod id_map;
mod loader;
pub mod maps;
mod perf_map;
mod poison;
mod program_box;
pub mod rbpf_bridge;
pub mod run_pin;
mod symbols;
pub mod testing;
mod tier;
mod tiering;
mod trace_printk;

pub use arena::{
    ArenaConfig, ArenaStats, ChunkState, Compaction, MapMode, Movable, MoveListener, MoveWatch,
    PackOccupancy, PackedArena, Placement, RemapPolicy,
};
pub use builtins::{BuiltinChoice, ClockImpl, CpuIdImpl, PerCpuLookupImpl};
pub use elf::{
    btf, elf_maps, ElfLoadOptions, ElfMapDef, ElfObject, ElfProgramSelector, GlobalData,
};
pub use exec::{helper_access_ok, MemRegion, RegionAccess, RunError};
pub use hook::{Hook, HookBatch};
pub use loader::{default_plugin_dirs, plugin_files};
pub use tier::Tier;
pub use tiering::{TierPolicy, TierStatus, TieringConfig, DEFAULT_TIER_UP_CALLS};
// The front end's decoder (structural verification included) and what it returns: the
// bytecode as typed instructions, the form every backend and the interpreter start from.
pub use packjit_frontend::{decode, Program as DecodedProgram};
// `Error` is what loading, compiling and configuring fail with; a run fails with a
// `RunError`, whose stops are `Stop`s.
pub use packjit_plugin_api::{
    AccessDirection, Arch, CodeArena, CompileError as Error, ErrorKind, JitBackend, PjHelperFn,
    PjProgramEntry, Stop, StopKind,
};
pub use symbols::{default_perf_map_path, SymbolInfo};
pub use trace_printk::{set_trace_sink, TraceSink};

use heap_arena::HeapArena;
use packjit_plugin_api::export::catch_panic;
use packjit_plugin_api::{abi, CompileRequest, Compiled, HelperEntry, Region};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use symbols::Symbols;

fn err(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, msg)
}

/// Runtime configuration.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Code arena settings.
    pub arena: ArenaConfig,
    /// Start with the backend linked into this build for the host's architecture (see
    /// [`linked_backend`]); `true` by default. `false` gives a runtime without backends, for
    /// hosts that choose theirs with [`Runtime::load_plugins`] or [`Runtime::add_backend`]
    /// and for tests of the interpreter fallback.
    pub linked_backend: bool,
    /// Adaptive programs' tier-up ([`Tier::Adaptive`]): the policy and the background
    /// compile threads.
    pub tiering: TieringConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            arena: ArenaConfig::default(),
            linked_backend: true,
            tiering: TieringConfig::default(),
        }
    }
}

/// The JIT backend for the host's architecture that this build links in (cargo features
/// `backend-x86_64`, `backend-arm64`, `backend-rv64`, all on by default; each only links on
/// a target of its arch), or `None` when the feature for the host is off or the host has no
/// packjit backend. [`Runtime::new`] starts with it.
pub fn linked_backend() -> Option<Arc<dyn JitBackend>> {
    #[cfg(all(feature = "backend-x86_64", target_arch = "x86_64"))]
    return Some(Arc::new(packjit_x86_64::X86Backend::new()));
    #[cfg(all(feature = "backend-arm64", target_arch = "aarch64"))]
    return Some(Arc::new(packjit_arm64::Arm64Backend::new()));
    #[cfg(all(feature = "backend-rv64", target_arch = "riscv64"))]
    return Some(Arc::new(packjit_rv64::Rv64Backend::new()));
    #[allow(unreachable_code)]
    None
}

/// Instructions a sandboxed call may execute unless its load says otherwise
/// ([`Budget::Default`]): about a second of work natively, so a program that loops forever
/// stops with a budget error naming its pc instead of holding its thread.
pub const DEFAULT_BUDGET: u64 = 1 << 30;

/// How many instructions each call of a program may execute (charged at back-edges and
/// calls; running out stops the program with [`Stop::Budget`] naming the pc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Budget {
    /// Sandboxed loads: [`DEFAULT_BUDGET`]; trusted loads: no counting.
    #[default]
    Default,
    /// Counting compiled in, this many instructions per call (see
    /// [`Program::call_with_budget`]).
    Limit(u64),
    /// No counting: a program may run for ever. The host opts out explicitly.
    Unlimited,
}

impl Budget {
    /// The instructions per call a load in `trust` mode gets, or `None` for no counting.
    pub fn per_call(self, trust: Trust) -> Option<u64> {
        match (self, trust) {
            (Budget::Limit(n), _) => Some(n),
            (Budget::Default, Trust::Sandboxed) => Some(DEFAULT_BUDGET),
            (Budget::Default, Trust::Trusted) | (Budget::Unlimited, _) => None,
        }
    }
}

/// Per-load options.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Instruction budget (see [`Budget`]): by default sandboxed code ends on its own after
    /// [`DEFAULT_BUDGET`] instructions per call.
    pub budget: Budget,
    /// Blind the program's immediates with a fresh random key (attacker-chosen constants
    /// never appear verbatim in executable memory).
    pub blind_constants: bool,
    /// Host memory this program may touch besides its context and stack (in addition to the
    /// runtime-wide regions of [`Runtime::add_region`]).
    pub regions: Vec<MemRegion>,
    /// Program name for symbols and the perf map; `None` = `prog_<id>`. The ELF loader
    /// passes the program's symbol name.
    pub name: Option<String>,
    /// Target architecture; `None` = the host's. Programs for another architecture are
    /// compiled (for inspection) but cannot be called.
    pub arch: Option<Arch>,
    /// Exact optional-feature set to use; `None` = what the CPU offers (host arch) or none
    /// (foreign arch).
    pub features: Option<u64>,
    /// Features to leave out of the default set (e.g. force the LSE-less atomics path).
    pub disable_features: u64,
    /// Accept packjit's per-CPU address instruction (`PJ_COMPILE_PERCPU_INSN`:
    /// `BPF_ALU64 | BPF_MOV | BPF_X`, `off = -1`, `imm` = per-CPU array id of
    /// [`Runtime::add_percpu_array`]): `dst = src + cpu * slot_size`, or `dst = src` when the
    /// array is unknown to this load or the CPU is out of its range. Without it the encoding
    /// is refused (a reserved `off`).
    pub percpu_insn: bool,
    /// The maps the program names: `lddw` with `src = 1` (`BPF_PSEUDO_MAP_FD`) and
    /// `imm = k` is `maps[k]` (see [`maps`]). Shared: several programs and the host may
    /// use one map at once.
    pub maps: Vec<Arc<maps::Map>>,
    /// The compiler (see [`Tier`]): the baseline backend by default. With
    /// [`Tier::Optimized`] the optimizing tier compiles the program (host arch only, cargo
    /// feature `optimizer`), or the load fails with [`ErrorKind::Unsupported`] naming what
    /// it cannot take yet; `features` and `disable_features` are the baseline's (Cranelift
    /// detects the CPU itself), so only `Some(0)` or `None` is accepted there. With
    /// [`Tier::Adaptive`] the baseline compiles it and the optimizing tier takes over in the
    /// background when it runs hot ([`TierPolicy`]); the load never fails for want of the
    /// optimizing tier (see [`Program::tier_status`]).
    pub tier: Tier,
    /// When this load tiers up, with [`Tier::Adaptive`]; `None`: the runtime's policy
    /// ([`RuntimeConfig::tiering`], [`Runtime::set_tier_policy`]). Ignored by the other tiers.
    pub tier_policy: Option<TierPolicy>,
}

/// Options are equal when they ask for the same load: the same maps are the same map
/// objects (not maps with equal contents).
impl PartialEq for LoadOptions {
    fn eq(&self, other: &Self) -> bool {
        self.budget == other.budget
            && self.blind_constants == other.blind_constants
            && self.regions == other.regions
            && self.name == other.name
            && self.arch == other.arch
            && self.features == other.features
            && self.disable_features == other.disable_features
            && self.percpu_insn == other.percpu_insn
            && self.tier == other.tier
            && self.tier_policy == other.tier_policy
            && self.maps.len() == other.maps.len()
            && (self.maps.iter().zip(&other.maps)).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Eq for LoadOptions {}

/// What a loaded backend is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// Backend name.
    pub name: String,
    /// Backend version.
    pub version: String,
    /// Architecture it emits code for.
    pub arch: Arch,
    /// Feature bits it understands.
    pub supported_features: u64,
    /// Feature bits the running CPU offers (0 when `arch` is not the host's).
    pub detected_features: u64,
    /// Where it came from: the plugin's path, `"static"` ([`Runtime::add_backend`]) or
    /// `"linked"` ([`linked_backend`], which [`Runtime::new`] starts with).
    pub origin: String,
}

/// [`BackendInfo::origin`] of the backend a runtime starts with ([`linked_backend`]).
pub const LINKED_ORIGIN: &str = "linked";

struct BackendSlot {
    backend: Arc<dyn JitBackend>,
    /// The backend's name, shared by every program it compiles (a program may outlive the
    /// plugin's vtable, and a shared name costs no allocation per load).
    name: Arc<str>,
    origin: String,
    /// The runtime's starting backend ([`linked_backend`]): a backend loaded for its arch
    /// replaces it instead of being refused.
    linked: bool,
    // Declared after `backend` so the library outlives the vtable wrapper that points into it.
    _library: Option<libloading::Library>,
}

/// A registered helper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelperInfo {
    /// Id used by `call imm`.
    pub id: u32,
    /// Name, for diagnostics.
    pub name: String,
    /// Function address.
    pub addr: u64,
}

/// The packjit runtime: backends, helpers and the code arena.
///
/// Knobs for tests, benchmarks and emulators (forcing the built-in helpers' inline or call
/// paths) are not methods here: see [`testing::RuntimeTestExt`].
pub struct Runtime {
    arena: Option<PackedArena>,
    heap_arena: Arc<HeapArena>,
    backends: RwLock<Vec<BackendSlot>>,
    helpers: RwLock<BTreeMap<u32, HelperInfo>>,
    /// Runtime-wide regions, as programs take them: shared by every program loaded without
    /// regions of its own.
    regions: RwLock<Arc<[abi::PjMemRegion]>>,
    symbols: Arc<Symbols>,
    next_program_id: AtomicU64,
    builtin_overrides: RwLock<BuiltinOverrides>,
    /// Background compiles for adaptive programs (threads started at the first request).
    tiering: Arc<tiering::Pool>,
}

/// Test and emulator overrides of the built-in helpers' facts (see
/// [`testing::RuntimeTestExt`]).
#[derive(Clone, Copy, Debug)]
struct BuiltinOverrides {
    inline: bool,
    rseq: Option<Option<i64>>,
    clock: Option<Option<(&'static abi::PjClockScale, u64, &'static str)>>,
}

impl Default for BuiltinOverrides {
    fn default() -> Self {
        Self {
            inline: true,
            rseq: None,
            clock: None,
        }
    }
}

/// How the code of a program treats memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trust {
    /// Every access is checked in the emitted code (the default).
    Sandboxed,
    /// Accesses are unchecked; the loader promised the program is well behaved.
    Trusted,
}

impl Runtime {
    /// A runtime with the default configuration: the host's backend linked into this build
    /// (see [`linked_backend`]) is loaded, so programs compile and run natively without any
    /// plugin.
    ///
    /// A backend loaded later for the same architecture ([`Runtime::load_plugins`],
    /// [`Runtime::load_plugin`], [`Runtime::add_backend`]) replaces the linked one (programs
    /// already compiled keep their code), so a host that ships its own plugins gets them. A
    /// second backend for an arch whose backend was loaded explicitly is refused.
    pub fn new() -> Result<Self, Error> {
        Self::with_config(RuntimeConfig::default())
    }

    /// A runtime with `cfg` (no backend at all with
    /// [`linked_backend: false`](RuntimeConfig::linked_backend)).
    pub fn with_config(cfg: RuntimeConfig) -> Result<Self, Error> {
        // Before any run: runs hold map values under their run pin, not the epoch.
        run_pin::register_with_maps();
        // An unknown host arch has no executable arena; foreign-arch compilation still works.
        let arena = match Arch::host() {
            Some(_) => Some(PackedArena::new(cfg.arena)?),
            None => None,
        };
        let linked = cfg.linked_backend.then(linked_backend).flatten();
        let backends = linked
            .map(|backend| BackendSlot {
                name: backend.name().into(),
                backend,
                origin: LINKED_ORIGIN.into(),
                linked: true,
                _library: None,
            })
            .into_iter()
            .collect();
        Ok(Self {
            arena,
            heap_arena: Arc::new(HeapArena::default()),
            backends: RwLock::new(backends),
            helpers: RwLock::new(BTreeMap::new()),
            regions: RwLock::new(Arc::from([])),
            symbols: Arc::new(Symbols::default()),
            next_program_id: AtomicU64::new(1),
            builtin_overrides: RwLock::new(BuiltinOverrides::default()),
            tiering: tiering::Pool::new(cfg.tiering),
        })
    }

    fn add_slot(&self, slot: BackendSlot) -> Result<BackendInfo, Error> {
        let mut backends = self.backends.write().unwrap_or_else(|p| p.into_inner());
        let arch = slot.backend.arch();
        // The linked-in default gives way to a backend the host chose; it is linked code, so
        // programs it compiled stay valid after its slot is dropped.
        backends.retain(|b| !(b.linked && b.backend.arch() == arch));
        if let Some(existing) = backends.iter().find(|b| b.backend.arch() == arch) {
            return Err(err(
                ErrorKind::Plugin,
                format!(
                    "{}: a backend for {arch} is already loaded ({} from {})",
                    slot.origin,
                    existing.backend.name(),
                    existing.origin
                ),
            ));
        }
        let info = info_of(&slot);
        backends.push(slot);
        Ok(info)
    }

    /// Adds a statically linked backend.
    pub fn add_backend(&self, backend: Arc<dyn JitBackend>) -> Result<BackendInfo, Error> {
        self.add_slot(BackendSlot {
            name: backend.name().into(),
            backend,
            origin: "static".into(),
            linked: false,
            _library: None,
        })
    }

    /// Loads a plugin library. It stays loaded for the life of the runtime.
    pub fn load_plugin(&self, path: impl AsRef<Path>) -> Result<BackendInfo, Error> {
        self.load_plugin_for(path, None)
    }

    /// Loads a plugin library, refusing it unless it emits code for `arch`.
    pub fn load_plugin_for(
        &self,
        path: impl AsRef<Path>,
        arch: Option<Arch>,
    ) -> Result<BackendInfo, Error> {
        let plugin = loader::load(path.as_ref(), arch)?;
        self.add_slot(BackendSlot {
            name: plugin.backend.name().into(),
            backend: Arc::new(plugin.backend),
            origin: path.as_ref().display().to_string(),
            linked: false,
            _library: Some(plugin.library),
        })
    }

    /// Loads every `libpackjit_*.so` in `dir`, or in the default plugin directories (see
    /// [`default_plugin_dirs`]) when `dir` is `None`; the first directory holding plugins
    /// wins. Errors if none is found or one fails to load.
    pub fn load_plugins(&self, dir: Option<&Path>) -> Result<Vec<BackendInfo>, Error> {
        let dirs = match dir {
            Some(d) => vec![d.to_path_buf()],
            None => default_plugin_dirs(),
        };
        for d in &dirs {
            let files = plugin_files(d);
            if !files.is_empty() {
                return files.iter().map(|f| self.load_plugin(f)).collect();
            }
        }
        Err(err(
            ErrorKind::Plugin,
            format!(
                "no packjit plugins (libpackjit_*.so) in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }

    /// The loaded backends.
    pub fn backends(&self) -> Vec<BackendInfo> {
        self.backends
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(info_of)
            .collect()
    }

    /// The backend for `arch`, with its name.
    fn backend_for(&self, arch: Arch) -> Result<(Arc<dyn JitBackend>, Arc<str>), Error> {
        self.backends
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|b| b.backend.arch() == arch)
            .map(|b| (b.backend.clone(), b.name.clone()))
            .ok_or_else(|| err(ErrorKind::Plugin, format!("no backend loaded for {arch}")))
    }

    /// Registers helper `id`. Ids are unique; programs compiled later can call it.
    pub fn register_helper(&self, id: u32, name: &str, f: PjHelperFn) -> Result<(), Error> {
        if id == elf::POISON_HELPER {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "helper id {id:#x} is libbpf's poison for unsatisfiable CO-RE relocations: \
                     a call to it must never reach a helper"
                ),
            ));
        }
        let mut helpers = self.helpers.write().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = helpers.get(&id) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("helper id {id} is already registered (as {:?})", h.name),
            ));
        }
        helpers.insert(
            id,
            HelperInfo {
                id,
                name: name.to_string(),
                addr: f as usize as u64,
            },
        );
        Ok(())
    }

    /// The registered helpers, by id.
    pub fn helpers(&self) -> Vec<HelperInfo> {
        self.helpers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn helper_table(&self) -> Vec<HelperEntry> {
        self.helpers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|h| HelperEntry {
                id: h.id,
                inline_kind: 0,
                addr: h.addr,
            })
            .collect()
    }

    /// Registers host memory every program loaded from now on may access under the sandbox
    /// (programs loaded earlier keep the regions they were loaded with). Safe: building a
    /// [`MemRegion`] is where the promise about the memory is made.
    pub fn add_region(&self, region: MemRegion) {
        let mut regions = self.regions.write().unwrap_or_else(|p| p.into_inner());
        let grown: Vec<abi::PjMemRegion> =
            regions.iter().copied().chain([region.to_abi()]).collect();
        *regions = grown.into();
    }

    /// Verifies, compiles (sandboxed) and commits one program. Its [`Program::call`] is safe:
    /// the emitted code checks every access against the context, its stack and the regions
    /// it was given, and stops with [`Stop::OutOfBounds`] instead of touching anything
    /// else.
    pub fn load(&self, code: &[u8], opts: &LoadOptions) -> Result<Program, Error> {
        let prog = self.compile(code, opts, &self.helper_table(), Trust::Sandboxed)?;
        if let Some(a) = prog.packed_arena() {
            a.commit();
        }
        Ok(prog)
    }

    /// Verifies, compiles trusted (unchecked) code and commits it.
    ///
    /// # Safety
    /// The program's memory accesses are not checked. The caller promises that every address
    /// the program computes, for every context it will be called with, is memory the program
    /// may read or write (as after the kernel's verifier); a wrong promise is undefined
    /// behaviour in the host. Budget counting and `callx` checks still apply.
    pub unsafe fn load_trusted(&self, code: &[u8], opts: &LoadOptions) -> Result<Program, Error> {
        let prog = self.compile(code, opts, &self.helper_table(), Trust::Trusted)?;
        if let Some(a) = prog.packed_arena() {
            a.commit();
        }
        Ok(prog)
    }

    /// Compiles without committing: the caller commits the arena once for a whole batch
    /// (see [`HookBatch`]) before any of the code may run.
    pub(crate) fn load_uncommitted(
        &self,
        code: &[u8],
        opts: &LoadOptions,
        trust: Trust,
    ) -> Result<Program, Error> {
        self.compile(code, opts, &self.helper_table(), trust)
    }

    /// Compiles several programs (sandboxed) and commits them together: one protection/remap
    /// pass and one instruction-cache maintenance pass for the whole batch.
    pub fn load_batch(&self, codes: &[&[u8]], opts: &LoadOptions) -> Vec<Result<Program, Error>> {
        self.load_batch_as(codes, opts, Trust::Sandboxed)
    }

    /// [`Runtime::load_batch`] for trusted code.
    ///
    /// # Safety
    /// As [`Runtime::load_trusted`], for every program of the batch.
    pub unsafe fn load_batch_trusted(
        &self,
        codes: &[&[u8]],
        opts: &LoadOptions,
    ) -> Vec<Result<Program, Error>> {
        self.load_batch_as(codes, opts, Trust::Trusted)
    }

    fn load_batch_as(
        &self,
        codes: &[&[u8]],
        opts: &LoadOptions,
        trust: Trust,
    ) -> Vec<Result<Program, Error>> {
        let helpers = self.helper_table();
        let out: Vec<_> = codes
            .iter()
            .map(|c| self.compile(c, opts, &helpers, trust))
            .collect();
        if let Some(a) = &self.arena {
            if out.iter().any(|p| p.as_ref().is_ok_and(|p| p.executable)) {
                a.commit();
            }
        }
        out
    }

    /// The facts a load decides by. A built-in not `wanted` is not prepared for inlining: no
    /// counter clock (and its one-time calibration, up to 20 ms on x86 without CPUID 0x15),
    /// no per-CPU table (an allocation per program, freed with it). Code that cannot call it
    /// gets the call entry instead, which it never uses.
    fn builtin_facts(&self, wanted: builtins::Wanted) -> (builtins::Facts, bool) {
        let o = *self
            .builtin_overrides
            .read()
            .unwrap_or_else(|p| p.into_inner());
        builtin_facts(o, wanted)
    }

    /// What a load for the host architecture gets for the built-in helpers (ids 5 and 8)
    /// now: inline or call, and why (see [`builtins`]). `None` without a host backend.
    pub fn builtins(&self) -> Option<BuiltinChoice> {
        let (backend, _) = self.backend_for(Arch::host()?).ok()?;
        let (facts, inline) = self.builtin_facts(builtins::Wanted {
            clock: true,
            percpu_lookup: true,
        });
        let mut table = self.helper_table();
        Some(builtins::add_builtins(&mut table, facts, backend.inline_kinds(), inline).0)
    }

    /// Registers a per-CPU array: `cpus` slots of `slot_size` bytes from `base`, each
    /// holding `entries` values of `value_size` bytes; returns its id, which programs pass
    /// to the lookup helper ([`abi::PJ_HELPER_PERCPU_LOOKUP`]: r1 = id, r2 = index → this
    /// CPU's element or NULL). The memory also becomes a read-write region (see
    /// [`Runtime::add_region`]) for programs loaded from now on. Ids are process-wide and
    /// never reused; a program sees the arrays registered before it was loaded.
    ///
    /// # Safety
    /// As [`MemRegion::new`] with [`RegionAccess::ReadWrite`] for `cpus * slot_size` bytes
    /// from `base`, for as long as any program loaded afterwards can run.
    pub unsafe fn add_percpu_array(
        &self,
        base: *mut u8,
        slot_size: usize,
        value_size: usize,
        entries: usize,
        cpus: usize,
    ) -> Result<u32, Error> {
        let fits = value_size
            .checked_mul(entries)
            .is_some_and(|n| n <= slot_size && value_size > 0);
        let len = slot_size.checked_mul(cpus).filter(|&l| l > 0);
        let (true, Some(len)) = (fits, len) else {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "per-CPU array: {entries} x {value_size} bytes do not fit a {slot_size}-byte slot, or {cpus} slots are empty or overflow"
                ),
            ));
        };
        // SAFETY: forwarded from the caller's promise.
        self.add_region(unsafe { MemRegion::new(base, len, RegionAccess::ReadWrite) });
        Ok(builtins::register_percpu_array(abi::PjPerCpuArray {
            base: base as u64,
            slot_size: slot_size as u64,
            value_size: value_size as u64,
            entries: entries as u64,
            cpus: cpus as u64,
        }))
    }

    /// Puts `program` in slot `index` of prog array `map` (`None` empties it), atomically
    /// for running programs: a tail call sees the old or the new program, never a torn or
    /// freed one; the replaced program is released once no run can still be in it. A tail
    /// call only continues in a program of the caller's trust.
    ///
    /// A program in a slot keeps the maps it names alive, the prog array among them: empty
    /// the slots (or drop the programs' last other owners after emptying) to release them.
    pub fn set_prog_array(
        &self,
        map: &Arc<maps::Map>,
        index: u32,
        program: Option<Arc<Program>>,
    ) -> Result<(), Error> {
        maps::set_prog_array_slot(map, index, program, maps::TailEntry::AfterSaves)
    }

    /// [`Runtime::set_prog_array`], but tail calls into `program` leave the caller's whole
    /// frame and run the target's whole entry even when both have the uniform tail-call frame
    /// (`PjTailTarget::uniform_frame` cleared): for the maps benchmark, which times both ways
    /// side by side, and for tests of that path.
    #[doc(hidden)]
    pub fn set_prog_array_full_entry(
        &self,
        map: &Arc<maps::Map>,
        index: u32,
        program: Option<Arc<Program>>,
    ) -> Result<(), Error> {
        maps::set_prog_array_slot(map, index, program, maps::TailEntry::Full)
    }

    fn compile(
        &self,
        code: &[u8],
        opts: &LoadOptions,
        helpers: &[HelperEntry],
        trust: Trust,
    ) -> Result<Program, Error> {
        self.compile_with(code, opts, helpers, trust, true)
    }

    /// [`compile`](Self::compile) with exactly `helpers` (no built-ins: the rbpf bridge keeps
    /// rbpf's own helper set).
    pub(crate) fn compile_without_builtins(
        &self,
        code: &[u8],
        opts: &LoadOptions,
        helpers: &[HelperEntry],
        trust: Trust,
    ) -> Result<Program, Error> {
        self.compile_with(code, opts, helpers, trust, false)
    }

    fn compile_with(
        &self,
        code: &[u8],
        opts: &LoadOptions,
        helpers: &[HelperEntry],
        trust: Trust,
        with_builtins: bool,
    ) -> Result<Program, Error> {
        if let Some(a) = &self.arena {
            a.hasten_old_copies();
        }
        let host = Arch::host();
        let arch = opts.arch.or(host).ok_or_else(|| {
            err(
                ErrorKind::InvalidArgument,
                "unknown host architecture; pass an arch",
            )
        })?;
        let (backend, backend_name) = match opts.tier {
            Tier::Baseline | Tier::Adaptive => self.backend_for(arch)?,
            Tier::Optimized => tier::optimizer(arch)?,
        };
        let env = CompileEnv {
            arena: self.arena.as_ref(),
            heap_arena: &self.heap_arena,
            symbols: &self.symbols,
            regions: self
                .regions
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            overrides: *self
                .builtin_overrides
                .read()
                .unwrap_or_else(|p| p.into_inner()),
        };
        let id = self.next_program_id.fetch_add(1, Relaxed);
        let base = env.compile(
            code,
            opts,
            helpers,
            trust,
            with_builtins,
            (backend, backend_name),
            arch,
            id,
        )?;
        if opts.tier != Tier::Adaptive {
            return Ok(base);
        }
        Ok(tiering::adapt(
            base,
            &env,
            code,
            opts,
            helpers,
            trust,
            &self.tiering,
        ))
    }
}

/// What a compile reads of its runtime: borrowed by a load, owned (see
/// [`tiering::OwnedEnv`]) by a background tier-up that outlives the load.
pub(crate) struct CompileEnv<'a> {
    arena: Option<&'a PackedArena>,
    heap_arena: &'a Arc<HeapArena>,
    symbols: &'a Arc<Symbols>,
    /// The runtime-wide regions when the load started.
    regions: Arc<[abi::PjMemRegion]>,
    overrides: BuiltinOverrides,
}

impl CompileEnv<'_> {
    /// The facts a load decides by. A built-in not `wanted` is not prepared for inlining: no
    /// counter clock (and its one-time calibration, up to 20 ms on x86 without CPUID 0x15),
    /// no per-CPU table (an allocation per program, freed with it). Code that cannot call it
    /// gets the call entry instead, which it never uses.
    fn builtin_facts(&self, wanted: builtins::Wanted) -> (builtins::Facts, bool) {
        builtin_facts(self.overrides, wanted)
    }

    /// Compiles `code` for `arch` with `backend` into a program numbered `id`.
    #[allow(clippy::too_many_arguments)]
    fn compile(
        &self,
        code: &[u8],
        opts: &LoadOptions,
        helpers: &[HelperEntry],
        trust: Trust,
        with_builtins: bool,
        (backend, backend_name): (Arc<dyn JitBackend>, Arc<str>),
        arch: Arch,
        id: u64,
    ) -> Result<Program, Error> {
        let host = Arch::host();
        let native = Some(arch) == host;
        let supported = backend.supported_features();
        let features = match opts.features {
            Some(f) => f,
            None if native => backend.detect_features() & supported,
            None => 0,
        } & !opts.disable_features;
        if features & !supported != 0 {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "feature bits {:#x} are not supported by {} (supported: {supported:#x})",
                    features & !supported,
                    backend.name()
                ),
            ));
        }
        let mut flags = 0;
        if trust == Trust::Sandboxed {
            flags |= abi::PJ_COMPILE_SANDBOX;
        }
        let budget = opts.budget.per_call(trust);
        if budget.is_some() {
            flags |= abi::PJ_COMPILE_BUDGET;
        }
        if opts.blind_constants {
            flags |= abi::PJ_COMPILE_BLIND_CONSTANTS;
        }
        // Room for what a load adds to the host's helpers (bound maps' lookups, kernel
        // helpers the code calls, the built-ins, the per-CPU and static-region tables):
        // growing from an exact copy reallocated it on most loads.
        let mut table = Vec::with_capacity(helpers.len() + 8);
        table.extend_from_slice(helpers);
        // Maps: references rewritten to handles and value addresses, array lookups inlined,
        // tail calls made real jumps (see `maps`).
        let mut inlined_percpu_arrays = false;
        let scan = CallScan::of(code);
        if opts.tier == Tier::Optimized {
            tier::refuse_unsupported(opts)?;
        }
        let bound = if opts.maps.is_empty() && !scan.needs_binding(code) {
            None
        } else {
            // Code for another architecture gets them too (it is never run: the host
            // addresses in it are only for inspection).
            let tail_calls =
                backend.inline_kinds() & abi::pj_inline_bit(abi::PJ_INLINE_TAIL_CALL) != 0;
            let inline_arrays =
                backend.inline_kinds() & abi::pj_inline_bit(abi::PJ_INLINE_ARRAY_LOOKUP) != 0;
            let prog_array_tail_calls = backend.inline_kinds()
                & abi::pj_inline_bit(abi::PJ_INLINE_PROG_ARRAY_TAIL_CALL)
                != 0;
            let inlining = maps::Inlining {
                tail_calls,
                prog_array_tail_calls,
                array_lookups: inline_arrays,
                trust,
            };
            let b = maps::bind(code, &opts.maps, inlining, |a| {
                // The per-CPU lookup is a built-in: without built-ins it is not there.
                if !with_builtins {
                    return None;
                }
                let id = builtins::register_percpu_array(abi::PjPerCpuArray {
                    base: a.base as u64,
                    slot_size: a.cpu_stride,
                    value_size: a.value_stride,
                    entries: a.max_entries.into(),
                    cpus: a.cpus.into(),
                });
                inlined_percpu_arrays = true;
                Some(id)
            })?;
            table.extend_from_slice(&b.helpers);
            Some(b)
        };
        let (code, scan) = match &bound {
            // Binding rewrites map references and tail calls: what is called is asked of the
            // code compiled.
            Some(b) => (&b.code[..], CallScan::of(&b.code)),
            None => (code, scan),
        };
        if with_builtins {
            maps::add_kernel_helpers(&mut table, |id| scan.calls(code, id));
        }
        // The per-CPU mov reads a snapshot of the arrays registered so far (owned by the
        // program, like the lookup's); its CPU comes from helper 8's entry, so the table's
        // rseq offset is unused (0).
        let percpu_insn_table = opts.percpu_insn.then(|| {
            flags |= abi::PJ_COMPILE_PERCPU_INSN;
            let t = builtins::percpu_table(0);
            table.push(HelperEntry {
                id: abi::PJ_HELPER_PERCPU_OFFSET,
                inline_kind: abi::PJ_INLINE_NONE,
                addr: t.as_ptr() as u64,
            });
            t
        });
        // Inline only native code: the facts (rseq offset, counter scale) are this
        // process's, meaningless in code compiled for another architecture.
        let builtins = with_builtins.then(|| {
            let (facts, inline) = self.builtin_facts(builtins::Wanted {
                clock: native && scan.may_call(code, abi::PJ_HELPER_KTIME_GET_NS),
                percpu_lookup: native
                    && (inlined_percpu_arrays || scan.may_call(code, abi::PJ_HELPER_PERCPU_LOOKUP)),
            });
            builtins::add_builtins(&mut table, facts, backend.inline_kinds(), inline && native)
        });
        let (builtins, percpu_table) = match builtins {
            Some((b, t)) => (Some(b), t),
            None => (None, None),
        };
        let shared_regions = self.regions.clone();
        let map_regions = bound.as_ref().map_or(&[][..], |b| &b.regions[..]);
        let regions: Arc<[abi::PjMemRegion]> = if opts.regions.is_empty() && map_regions.is_empty()
        {
            shared_regions
        } else {
            let own = opts.regions.iter().map(|r| r.to_abi());
            (shared_regions.iter().copied().chain(own))
                .chain(map_regions.iter().copied())
                .collect()
        };
        // Sandboxed code may skip the test of an access proven inside one of its regions:
        // each is memory the host promised valid for as long as the program can run
        // (`MemRegion::new`), and the list is the program's for its whole life. The table
        // (a `PjStaticRegions` header, then `PjMemRegion`s as three `u64`s each) lives until
        // the compile is done, at the end of this function.
        let _static_region_table = (trust == Trust::Sandboxed && !regions.is_empty()).then(|| {
            let mut t: Vec<u64> = Vec::with_capacity(1 + 3 * regions.len());
            t.push(regions.len() as u64);
            for r in regions.iter() {
                t.extend([r.start, r.len, r.flags]);
            }
            table.push(HelperEntry {
                id: abi::PJ_HELPER_STATIC_REGIONS,
                inline_kind: abi::PJ_INLINE_NONE,
                addr: t.as_ptr() as u64,
            });
            t
        });
        // Sandboxed code may also skip the test of an access proven inside the value a
        // tested lookup result points to: `bind` names each lookup whose map it proved and
        // that now calls the runtime's own lookup (a `PjLookupValues` header, then
        // `PjLookupValue`s as two `u64`s each), alive until the compile is done.
        let mut lookups = bound.as_ref().map_or(&[][..], |b| &b.lookups[..]);
        let percpu_inline = builtins
            .as_ref()
            .is_some_and(|b| b.percpu_lookup == PerCpuLookupImpl::Inline);
        let merged: Vec<abi::PjLookupValue>;
        if let (Some(b), true) = (&bound, percpu_inline) {
            if !b.percpu_lookups.is_empty() {
                merged = {
                    let mut all = [&b.lookups[..], &b.percpu_lookups[..]].concat();
                    all.sort_unstable_by_key(|l| l.pc);
                    all
                };
                lookups = &merged[..];
            }
        }
        let _lookup_value_table = (trust == Trust::Sandboxed && !lookups.is_empty()).then(|| {
            let mut t: Vec<u64> = Vec::with_capacity(1 + 2 * lookups.len());
            t.push(lookups.len() as u64);
            for l in lookups {
                // `pc` and `value_size` share the first word, in memory order.
                let mut first = [0u8; 8];
                first[..4].copy_from_slice(&l.pc.to_ne_bytes());
                first[4..].copy_from_slice(&l.value_size.to_ne_bytes());
                t.extend([u64::from_ne_bytes(first), l.flags]);
            }
            table.push(HelperEntry {
                id: abi::PJ_HELPER_LOOKUP_VALUES,
                inline_kind: abi::PJ_INLINE_NONE,
                addr: t.as_ptr() as u64,
            });
            t
        });
        // Poisoned CO-RE relocations (libbpf's `call 0xbad2310`): refused where the code can
        // reach one, no-ops where it cannot (`poison`).
        let unpoisoned = scan
            .calls(code, elf::POISON_HELPER)
            .then(|| poison::unpoison(code, &table, opts.percpu_insn))
            .transpose()?;
        let code = unpoisoned.as_deref().unwrap_or(code);
        // packjit's own backends give every program whose table has a tail call the
        // uniform tail-call frame, which other such programs' tail calls jump into past its
        // saves (`PjTailTarget::uniform_frame`).
        let uniform_tail_frame = UNIFORM_TAIL_FRAME_BACKENDS.contains(&backend.name())
            && table.iter().any(|h| {
                [
                    abi::PJ_INLINE_TAIL_CALL,
                    abi::PJ_INLINE_PROG_ARRAY_TAIL_CALL,
                ]
                .contains(&h.inline_kind)
            });
        let req = CompileRequest {
            code,
            helpers: &table,
            features,
            flags,
            blind_key: if opts.blind_constants {
                exec::random_key()
            } else {
                0
            },
        };
        let (mut compiled, owner) = match (self.arena, native) {
            // A statically linked backend gets the same panic policy as a plugin: a panic
            // while compiling becomes an `ErrorKind::Panic` error, never an unwind into
            // the caller of `load`.
            (Some(a), true) => (
                catch_panic(|| backend.compile(&req, a))?,
                ArenaRef::Packed(a.clone()),
            ),
            _ => (
                catch_panic(|| backend.compile(&req, &**self.heap_arena))?,
                ArenaRef::Heap(self.heap_arena.clone()),
            ),
        };
        let executable = matches!(owner, ArenaRef::Packed(_));
        let symbol = Arc::new(symbols::ProgramSymbol::new(
            id,
            opts.name.as_deref(),
            std::mem::take(&mut compiled.pc_offsets),
        ));
        // Only code in the executable arena has addresses a profiler can sample.
        let symbols = executable.then(|| {
            self.symbols
                .insert(symbol.clone(), compiled.entry, compiled.code_size as u64);
            self.symbols.clone()
        });
        // Arena code may be moved by compaction (images are position-independent); its
        // symbol follows it. (A region the arena does not know, from a backend that broke
        // the arena contract, just stays where it is.)
        let movable = match (&owner, &symbols) {
            (ArenaRef::Packed(a), Some(syms)) => {
                let watch = arena::MoveWatch {
                    listener: syms.clone(),
                    key: id,
                };
                a.make_movable(&compiled.region, compiled.entry, Some(watch))
                    .ok()
            }
            _ => None,
        };
        let run_maps = bound.map(|b| b.run);
        Ok(Program {
            movable,
            compiled,
            symbol,
            arch,
            features,
            executable,
            owner,
            backend: backend_name,
            trust,
            budget,
            regions,
            id,
            symbols,
            code_release: CodeRelease::AfterOwnGrace,
            elf: None,
            builtins,
            _percpu_tables: (percpu_table.is_some() || percpu_insn_table.is_some()).then(|| {
                Box::new(PerCpuTables {
                    _lookup: percpu_table,
                    _percpu_insn: percpu_insn_table,
                })
            }),
            run: RunPlan::new(
                if executable {
                    RunPath::OwnCode
                } else {
                    RunPath::NotExecutable
                },
                budget,
                run_maps.as_ref(),
            ),
            maps: run_maps,
            tiering: match opts.tier {
                Tier::Optimized => Tiered::Fixed(Tier::Optimized),
                _ => Tiered::Fixed(Tier::Baseline),
            },
            uniform_tail_frame,
        })
    }
}

impl Runtime {
    /// Statistics of the executable arena (zeroes when the host has none).
    pub fn stats(&self) -> ArenaStats {
        self.arena.as_ref().map(|a| a.stats()).unwrap_or_default()
    }

    /// The executable arena, if the host architecture has one.
    pub fn arena(&self) -> Option<&PackedArena> {
        self.arena.as_ref()
    }

    /// The program whose native code covers `addr`, with the offset into it (O(log n)).
    pub fn symbolize(&self, addr: u64) -> Option<SymbolInfo> {
        self.symbols.lookup(addr)
    }

    /// Every live executable program, by address (what the perf map lists).
    pub fn symbols(&self) -> Vec<SymbolInfo> {
        self.symbols.list()
    }

    /// Live executable programs (their code not reclaimed yet).
    pub fn live_programs(&self) -> usize {
        self.symbols.len()
    }

    /// Writes the perf map at [`default_perf_map_path`] (`/tmp/perf-<pid>.map`) and keeps it
    /// current as programs are loaded and reclaimed, at a cost per load and per release that
    /// does not grow with the number of live programs. Returns the path.
    ///
    /// Lines are `START SIZE NAME` in hex, padded with leading zeros to one width so that a
    /// release can move the last line into its place; names longer than the widest line
    /// holds (about 230 bytes) are cut.
    pub fn enable_perf_map(&self) -> Result<std::path::PathBuf, Error> {
        let path = default_perf_map_path();
        self.enable_perf_map_at(&path)?;
        Ok(path)
    }

    /// As [`enable_perf_map`](Self::enable_perf_map), at `path` (tests, several runtimes in
    /// one process). A path has one keeper: enabling a path another runtime of this process
    /// keeps a map at is an error (both would rewrite the same lines); the same runtime may
    /// enable it again (the map is rewritten) or move to another path (the old one is freed
    /// for others).
    pub fn enable_perf_map_at(&self, path: &Path) -> Result<(), Error> {
        self.symbols.enable_perf_map(path.to_path_buf())
    }

    /// Rewrites the perf map from the index now; `None` when it was never enabled.
    pub fn write_perf_map(&self) -> Result<Option<std::path::PathBuf>, Error> {
        self.symbols.write_perf_map()
    }

    /// Where the perf map is kept, once enabled (made absolute when it was enabled).
    pub fn perf_map_path(&self) -> Option<std::path::PathBuf> {
        self.symbols.perf_map_path()
    }

    /// Registers this runtime's executable programs with gdb's JIT interface (see
    /// [`gdb_jit`]): those live now, and from here on every load and every copy compaction
    /// makes, until their code is reclaimed. Then, in gdb, `hbreak <program name>` (`break`
    /// in a toggle-mode arena) stops in a program and `bt` names it. `Unsupported` on a host
    /// architecture with no ELF description. Idempotent.
    pub fn enable_gdb_jit(&self) -> Result<(), Error> {
        self.symbols.enable_gdb_jit()
    }

    /// A compaction step the host can schedule (e.g. when idle): moves up to `max_bytes` of
    /// program code into holes while fragmentation is above the configured threshold, in one
    /// commit. Returns the bytes moved (0 with compaction off). Frees and hook swaps that
    /// find chunks released already move up to [`Compaction::step_bytes`] each.
    pub fn compact(&self, max_bytes: usize) -> usize {
        self.arena.as_ref().map_or(0, |a| a.compact(max_bytes))
    }

    /// When adaptive programs loaded from now on tier up ([`Tier::Adaptive`]; programs
    /// loaded earlier keep the policy they were loaded with).
    pub fn set_tier_policy(&self, policy: TierPolicy) {
        self.tiering.set_policy(policy);
    }

    /// The policy adaptive programs loaded now get.
    pub fn tier_policy(&self) -> TierPolicy {
        self.tiering.policy()
    }

    /// Runs deferred frees whose epoch has ended; returns how many are still pending.
    pub fn reclaim(&self) -> usize {
        self.arena.as_ref().map_or(0, |a| a.reclaim())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // No compile may place code after the arena is orphaned: the threads are joined
        // first (a compile under way finishes; queued requests are abandoned).
        self.tiering.shut_down();
        // Programs may outlive the runtime (each holds the arena), but nothing calls the
        // arena for them any more: retired programs queued for that call are dropped now,
        // and later ones at once.
        if let Some(a) = &self.arena {
            a.orphan();
        }
    }
}

/// The facts a load decides by, under the overrides `o`.
fn builtin_facts(o: BuiltinOverrides, wanted: builtins::Wanted) -> (builtins::Facts, bool) {
    let facts = builtins::Facts {
        rseq_offset: o.rseq.unwrap_or_else(builtins::glibc_rseq_cpu_id_offset),
        clock: if wanted.clock {
            o.clock.unwrap_or_else(builtins::counter_clock)
        } else {
            None
        },
        percpu_lookup: wanted.percpu_lookup,
    };
    (facts, o.inline)
}

/// The helpers a program's bytecode calls, from one pass over it. A load asks about the
/// fifteen kernel helpers, two built-ins and the map binding: one pass each before, about 3%
/// of a small program's load.
struct CallScan {
    /// `call imm` ids below 256, one bit each.
    low: [u64; 4],
    /// Whether some `call imm` names an id of 256 or more (searched for when asked).
    high: bool,
    /// Whether there is a `callx` (whose id is only known at run time).
    callx: bool,
    /// Whether an `lddw` names a map or a function (`src` 1, 2 or 4).
    names_map_or_function: bool,
}

impl CallScan {
    fn of(code: &[u8]) -> Self {
        let mut s = CallScan {
            low: [0; 4],
            high: false,
            callx: false,
            names_map_or_function: false,
        };
        for c in code.chunks_exact(8) {
            match c[0] {
                0x85 if c[1] >> 4 == 0 => {
                    let id = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
                    if id < 256 {
                        s.low[id as usize / 64] |= 1 << (id % 64);
                    } else {
                        s.high = true;
                    }
                }
                0x8d => s.callx = true,
                0x18 if matches!(c[1] >> 4, 1 | 2 | 4) => s.names_map_or_function = true,
                _ => {}
            }
        }
        s
    }

    /// Whether `code` (the code scanned) has a `call imm` of helper `id`.
    fn calls(&self, code: &[u8], id: u32) -> bool {
        if id < 256 {
            self.low[id as usize / 64] >> (id % 64) & 1 != 0
        } else {
            self.high
                && code.chunks_exact(8).any(|c| {
                    c[0] == 0x85
                        && c[1] >> 4 == 0
                        && u32::from_le_bytes([c[4], c[5], c[6], c[7]]) == id
                })
        }
    }

    /// Whether `code` may call helper `id`: a `call imm` naming it, or any `callx`.
    fn may_call(&self, code: &[u8], id: u32) -> bool {
        self.callx || self.calls(code, id)
    }

    /// Whether `code` needs `maps::bind`: does it name a map or a function (`lddw` with a
    /// map or function source), or call a helper that calls back into it (`bpf_loop`,
    /// `bpf_for_each_map_elem`)?
    fn needs_binding(&self, code: &[u8]) -> bool {
        self.names_map_or_function || self.calls(code, 164) || self.calls(code, 181)
    }
}

fn info_of(slot: &BackendSlot) -> BackendInfo {
    let b = &slot.backend;
    let native = Arch::host() == Some(b.arch());
    BackendInfo {
        name: b.name().to_string(),
        version: b.version().to_string(),
        arch: b.arch(),
        supported_features: b.supported_features(),
        detected_features: if native { b.detect_features() } else { 0 },
        origin: slot.origin.clone(),
    }
}

enum ArenaRef {
    Packed(PackedArena),
    Heap(Arc<HeapArena>),
}

/// The per-CPU tables a program's code reads (each a `PjPerCpuTable` + arrays, in `u64`
/// words): they live exactly as long as the code.
struct PerCpuTables {
    /// The inlined per-CPU lookup's.
    _lookup: Option<Box<[u64]>>,
    /// The per-CPU mov's ([`LoadOptions::percpu_insn`]).
    _percpu_insn: Option<Box<[u64]>>,
}

/// A compiled program. Dropping it frees its code once no thread can be running it.
pub struct Program {
    /// What the backend returned, less its line table (in `symbol`).
    compiled: Compiled,
    /// Name and line table, shared with the symbol index rather than copied into it.
    symbol: Arc<symbols::ProgramSymbol>,
    arch: Arch,
    features: u64,
    executable: bool,
    owner: ArenaRef,
    backend: Arc<str>,
    trust: Trust,
    budget: Option<u64>,
    regions: Arc<[abi::PjMemRegion]>,
    id: u64,
    /// Where the code is now, for arena code (compaction may move it; see
    /// [`PackedArena::make_movable`]). `compiled.entry`/`region` are where it was placed.
    movable: Option<Arc<arena::Movable>>,
    /// The index holding this program's symbol (executable programs only).
    symbols: Option<Arc<Symbols>>,
    /// What dropping it does with its code.
    code_release: CodeRelease,
    // ELF programs own their .rodata/.data/.bss; the code holds their addresses, so the data
    // lives exactly as long as the code can run (see elf.rs).
    elf: Option<Box<elf::Linked>>,
    /// What the built-in helpers became in this program (`None`: loaded without them).
    /// Inline: boxing it cost an allocation per load and a free per release.
    builtins: Option<BuiltinChoice>,
    /// Boxed: only programs that can call the per-CPU lookup, or use the per-CPU mov, have
    /// any.
    _percpu_tables: Option<Box<PerCpuTables>>,
    /// The maps the program names, for its helpers while it runs (`None`: no maps).
    maps: Option<Arc<maps::RunMaps>>,
    /// Its tier; for an adaptive program, the code it forwards to (see [`tiering`]).
    tiering: Tiered,
    /// Its entry has the uniform tail-call frame (see `PjTailTarget::uniform_frame`). For
    /// the program's life: compaction moves its bytes unchanged, and only the baseline
    /// backends emit it (the optimizing tier's frames are its own).
    pub(crate) uniform_tail_frame: bool,
    /// What a run needs, decided at load so that a run tests one byte and loads plain words
    /// (issue 43: everything a run reads before its entry is on every run's path).
    run: RunPlan,
}

/// The part of a [`Program`] a run reads, in the form it passes it on.
#[derive(Clone, Copy)]
struct RunPlan {
    path: RunPath,
    /// `Program::budget` as the environment takes it (`u64::MAX`: none counted).
    budget: u64,
    /// `PjExecEnv::maps`: the address of the program's `RunMaps`, or 0.
    maps: u64,
}

impl RunPlan {
    fn new(path: RunPath, budget: Option<u64>, maps: Option<&Arc<maps::RunMaps>>) -> RunPlan {
        RunPlan {
            path,
            budget: budget.unwrap_or(u64::MAX),
            maps: maps.map_or(0, |m| Arc::as_ptr(m) as u64),
        }
    }
}

/// Which code a run enters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RunPath {
    /// The program's own code, at `own_entry_now`.
    OwnCode,
    /// The code an adaptive program forwards to now (see [`tiering`]).
    Adaptive,
    /// None: the code is for another architecture.
    NotExecutable,
}

/// A program's tier (see [`Program::tier_status`]).
enum Tiered {
    /// Loaded with this tier, for good.
    Fixed(Tier),
    /// Loaded adaptive, on the baseline for good: the optimizing tier cannot take it.
    Refused(Box<Error>),
    /// Adaptive: owns no code; every run and code accessor goes to the program current in
    /// the [`tiering::Tiering`] (the baseline, then the optimized one).
    Adaptive(Arc<tiering::Tiering>),
}

/// The backends whose programs with tail calls have the uniform tail-call frame (the
/// lowering contract's `FrameHooks::tail_entry_skip`): packjit's own.
const UNIFORM_TAIL_FRAME_BACKENDS: [&str; 3] = ["packjit-x86-64", "packjit-arm64", "packjit-rv64"];

/// Per backend of [`UNIFORM_TAIL_FRAME_BACKENDS`]: bytes from the entry of a program with the
/// uniform tail-call frame to its tail entry (the backend's `FrameHooks::tail_entry_skip`,
/// its `TAIL_ENTRY_SKIP`; the `tail_entry_skip` unit test holds them equal).
pub(crate) const TAIL_ENTRY_SKIPS: [(&str, u32); 3] = [
    ("packjit-x86-64", 23),
    ("packjit-arm64", 40),
    ("packjit-rv64", 60),
];

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("id", &self.id)
            .field("name", &self.name())
            .field("arch", &self.arch)
            .field("backend", &self.backend)
            .field("entry", &format_args!("{:#x}", self.entry_now()))
            .field("code_size", &self.compiled.code_size)
            .field("executable", &self.executable)
            .finish()
    }
}

impl Program {
    /// For code that reads this program's entry itself (an inlined tail call): the word
    /// holding its code's base and the entry's offset from it, when compaction may move the
    /// code; `None` when it never moves (its entry is [`Self::entry_now`] for good).
    pub(crate) fn moving_entry(&self) -> Option<(*const u64, u64)> {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.settle().moving_entry();
        }
        let (word, offset) = self.movable.as_ref()?.entry_parts();
        Some((word.cast(), offset))
    }

    /// The code's position when compaction may move it (an adaptive program's settled
    /// code's; see [`Self::settled_code`]).
    pub(crate) fn movable(&self) -> Option<&arena::Movable> {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.settle().movable();
        }
        self.movable.as_deref()
    }

    /// Bytes from the entry to the tail entry past the saves, when the entry has the uniform
    /// tail-call frame (`PjTailTarget::tail_entry`).
    pub(crate) fn tail_entry_skip(&self) -> Option<u32> {
        if !self.uniform_tail_frame {
            return None;
        }
        let skip = TAIL_ENTRY_SKIPS.iter().find(|(b, _)| **b == *self.backend);
        skip.map(|&(_, s)| s)
    }

    /// The entry point now. Callers that run it load it AFTER pinning the epoch.
    pub(crate) fn entry_now(&self) -> u64 {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::own_entry_now);
        }
        self.own_entry_now()
    }

    /// [`Self::entry_now`] of a program that owns its code (not adaptive). Inlined into the
    /// run path: an out-of-line call here cost a run about as much as the rest of
    /// `packjit_program_run` (perf, issue 43).
    #[inline(always)]
    fn own_entry_now(&self) -> u64 {
        self.movable
            .as_ref()
            .map_or(self.compiled.entry, |m| m.entry())
    }

    /// The packed arena holding the code (`None` for foreign-arch code in the heap arena).
    pub(crate) fn packed_arena(&self) -> Option<&PackedArena> {
        match &self.owner {
            ArenaRef::Packed(a) => Some(a),
            ArenaRef::Heap(_) => None,
        }
    }

    /// Runs the program with `mem` as its context (r1 = pointer, r2 = length; both 0 for an
    /// empty slice); returns r0, or why there is none: [`RunError::Stop`] with the
    /// [`Stop`] (out of bounds, budget, unknown `callx`) naming the pc, or
    /// [`RunError::NotExecutable`] for code compiled for another architecture.
    #[inline]
    pub fn call(&self, mem: &mut [u8]) -> Result<u64, RunError> {
        self.call_with_budget(mem, self.run.budget)
    }

    /// [`Program::call`] with an instruction budget for this call (meaningful when the program
    /// was loaded with [`LoadOptions::budget`]; otherwise no counting is compiled in).
    #[inline]
    pub fn call_with_budget(&self, mem: &mut [u8], budget: u64) -> Result<u64, RunError> {
        let pin = run_pin::enter();
        // SAFETY: `mem` is memory the program may read and write. For sandboxed code the
        // emitted checks confine it to `mem`, its stack and its regions; for trusted code the
        // caller of `load_trusted` promised it stays within memory it may touch.
        unsafe { self.run_pinned(mem.as_mut_ptr(), mem.len(), budget, &pin) }
    }

    /// Runs the program on a raw context.
    ///
    /// # Safety
    /// `ctx`/`len` must describe memory the program may read and write (for sandboxed code
    /// the checks then keep it inside; trusted code dereferences whatever it computes).
    #[inline]
    pub unsafe fn call_raw(&self, ctx: *mut u8, len: usize) -> Result<u64, RunError> {
        let pin = run_pin::enter();
        // SAFETY: the caller vouches for ctx/len.
        unsafe { self.call_raw_pinned(ctx, len, &pin) }
    }

    /// [`call_raw`](Self::call_raw) for a caller that already holds a run pin (taken before
    /// it reached `self`, e.g. through a handle another thread may retire): no second pin.
    ///
    /// # Safety
    /// As [`call_raw`](Self::call_raw).
    #[inline]
    pub unsafe fn call_raw_pinned(
        &self,
        ctx: *mut u8,
        len: usize,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        // SAFETY: forwarded.
        unsafe { self.run_pinned(ctx, len, self.run.budget, pin) }
    }

    /// [`call_raw_pinned`](Self::call_raw_pinned)'s common case alone, for a run path that
    /// inlines it whole (the C API's): `None`, having run nothing, unless the program runs
    /// its own code as the thread's only run in progress; the caller then takes
    /// `call_raw_pinned`. Kept apart so that the common case's result never shares memory
    /// with the other paths' (a result merged with an out-of-line path's stays in memory,
    /// stores a run pays for; issue 43).
    ///
    /// # Safety
    /// As [`call_raw`](Self::call_raw).
    #[inline(always)]
    pub unsafe fn call_raw_outermost(
        &self,
        ctx: *mut u8,
        len: usize,
        pin: &run_pin::RunPin,
    ) -> Option<Result<u64, RunError>> {
        if self.run.path != RunPath::OwnCode || exec::run_in_progress() {
            return None;
        }
        // SAFETY: forwarded; own, executable code, and no run in progress on this thread.
        Some(unsafe { self.enter_outermost(ctx, len, self.run.budget, pin) })
    }

    /// A run under the caller's run pin (which `&RunPin`, neither `Send` nor `Sync`, proves
    /// is held on this thread, taken before the caller loaded `self` or its entry).
    ///
    /// Inlined into its callers (a hook, the C API): a `Result` returned through memory and
    /// copied on as one 16-byte block failed to forward from the callee's narrower stores,
    /// ~5 ns per run (perf, issue 43).
    ///
    /// A run holds only its run pin ([`run_pin`]), no epoch pin, also for programs that name
    /// maps. What it may use is released only after the runs in progress at its retirement
    /// have ended: code, hook slots' programs and C handles; map elements a lookup handed
    /// out, which a concurrent update or delete retires (the maps wait for the epoch, then
    /// for the runs: [`packjit_maps::set_run_grace`]); and the prog-array targets a tail
    /// call continues in, whose slots are released the same way.
    ///
    /// # Safety
    /// `ctx`/`len` as for [`call_raw`](Self::call_raw).
    // Always: with a plain hint, whole-program optimisation outlined it (four callers).
    #[inline(always)]
    pub(crate) unsafe fn run_pinned(
        &self,
        ctx: *mut u8,
        len: usize,
        budget: u64,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        // Both tests before anything is loaded for the run: what is loaded before a call
        // stays in saved registers across it, and the run pays for saving them.
        if self.run.path != RunPath::OwnCode || exec::run_in_progress() {
            // SAFETY: forwarded.
            return unsafe { self.run_elsewhere(ctx, len, budget, pin) };
        }
        // SAFETY: forwarded; own, executable code, and no run in progress on this thread.
        unsafe { self.enter_outermost(ctx, len, budget, pin) }
    }

    /// [`run_pinned`](Self::run_pinned) off its common path: an adaptive program's current
    /// code, a run inside another run on this thread, or no code to run.
    ///
    /// # Safety
    /// As [`run_pinned`](Self::run_pinned).
    #[inline(always)]
    unsafe fn run_elsewhere(
        &self,
        ctx: *mut u8,
        len: usize,
        budget: u64,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        exec::cold_path();
        match (&self.tiering, self.run.path) {
            // SAFETY: forwarded.
            (Tiered::Adaptive(t), _) => unsafe { t.run_pinned(ctx, len, budget, pin) },
            // SAFETY: forwarded; executable, inside another run on this thread.
            (_, RunPath::OwnCode) => unsafe { self.enter_nested(ctx, len, budget) },
            _ => Err(RunError::NotExecutable { arch: self.arch }),
        }
    }

    /// [`run_pinned`](Self::run_pinned) of a program that owns its code (not adaptive: an
    /// adaptive program's current code is one).
    ///
    /// # Safety
    /// As [`run_pinned`](Self::run_pinned).
    #[inline(always)]
    pub(crate) unsafe fn run_own_code(
        &self,
        ctx: *mut u8,
        len: usize,
        budget: u64,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        self.check_executable()?;
        // SAFETY: forwarded; executable.
        unsafe { self.enter_own_code(ctx, len, budget, pin) }
    }

    /// Enters the program's own code, known executable, under a run pin the caller holds.
    ///
    /// # Safety
    /// As [`run_pinned`](Self::run_pinned), and the code is executable here.
    #[inline(always)]
    unsafe fn enter_own_code(
        &self,
        ctx: *mut u8,
        len: usize,
        budget: u64,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        if exec::run_in_progress() {
            // SAFETY: forwarded.
            return unsafe { self.enter_nested(ctx, len, budget) };
        }
        // SAFETY: forwarded; no run in progress on this thread.
        unsafe { self.enter_outermost(ctx, len, budget, pin) }
    }

    /// [`enter_own_code`](Self::enter_own_code) inside another run on this thread: an
    /// environment of its own (`exec::run_nested`).
    ///
    /// # Safety
    /// As [`enter_own_code`](Self::enter_own_code).
    #[inline(always)]
    unsafe fn enter_nested(&self, ctx: *mut u8, len: usize, budget: u64) -> Result<u64, RunError> {
        // SAFETY: forwarded.
        unsafe {
            exec::run_nested(
                self.own_entry_now(),
                ctx,
                len,
                &self.regions,
                budget,
                self.trust,
                self.run.maps,
            )
        }
    }

    /// [`enter_own_code`](Self::enter_own_code) as the thread's only run in progress.
    ///
    /// # Safety
    /// As [`enter_own_code`](Self::enter_own_code), and no run is in progress on this thread
    /// ([`exec::run_in_progress`]).
    #[inline(always)]
    unsafe fn enter_outermost(
        &self,
        ctx: *mut u8,
        len: usize,
        budget: u64,
        pin: &run_pin::RunPin,
    ) -> Result<u64, RunError> {
        // SAFETY: committed code, kept alive by `self` and the run pin (its entry loaded
        // after the pin: compaction releases an old copy only after the runs in progress at
        // the move have ended); the caller vouches for ctx/len and for no run in progress.
        unsafe {
            exec::run_outermost(
                self.own_entry_now(),
                ctx,
                len,
                &self.regions,
                budget,
                self.trust,
                self.run.maps,
                pin,
            )
        }
    }

    /// The budget a run passes when the caller names none (`u64::MAX`: none counted).
    #[inline(always)]
    pub(crate) fn run_budget(&self) -> u64 {
        self.run.budget
    }

    #[inline]
    fn check_executable(&self) -> Result<(), RunError> {
        if self.executable {
            return Ok(());
        }
        exec::cold_path();
        Err(RunError::NotExecutable { arch: self.arch })
    }

    /// The line table: for each bytecode slot, the byte offset of its native code from the
    /// entry (`NO_NATIVE_CODE` for the second slot of `lddw`); empty when the backend keeps
    /// none.
    pub fn pc_offsets(&self) -> &[u32] {
        self.current_symbol().by_pc()
    }

    /// The eBPF pc whose native code contains `addr` (an address inside this program's code),
    /// from the line table: the slot with the greatest start at or below `addr`. Code after
    /// the last instruction (shared stubs) maps to the last instruction.
    pub fn pc_at(&self, addr: u64) -> Option<usize> {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(|p| p.pc_at(addr));
        }
        let off = addr.checked_sub(self.entry_now())?;
        if off >= self.compiled.code_size as u64 {
            return None;
        }
        self.symbol.pc_at(off)
    }

    /// Sandboxed or trusted code.
    pub fn trust(&self) -> Trust {
        self.trust
    }

    /// The regions (runtime-wide and per-program) the program may access.
    pub fn regions(&self) -> &[abi::PjMemRegion] {
        &self.regions
    }

    /// The entry point, for callers that dispatch themselves (valid while `self` lives).
    /// Pins the code: compaction never moves it again, since the caller may keep the address.
    pub fn entry(&self) -> Option<PjProgramEntry> {
        if let Tiered::Adaptive(t) = &self.tiering {
            // Fixed from here on: the host may keep the address as long as `self` lives.
            return t.settle().entry();
        }
        if !self.executable {
            return None;
        }
        let entry = match (&self.movable, self.packed_arena()) {
            (Some(m), Some(a)) => a.pin_movable(m),
            _ => self.compiled.entry,
        };
        // SAFETY: as in call_raw.
        Some(unsafe { std::mem::transmute::<usize, PjProgramEntry>(entry as usize) })
    }

    /// A copy of the native code.
    pub fn code(&self) -> Vec<u8> {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::code);
        }
        let c = &self.compiled;
        match &self.owner {
            ArenaRef::Packed(a) => match &self.movable {
                Some(m) => a.read_movable(m, c.code_size),
                None => a.read_code(c.entry, c.code_size),
            }
            .unwrap_or_default(),
            ArenaRef::Heap(s) => s.read(&c.region, c.code_size),
        }
    }

    /// Bytes of native code.
    pub fn code_size(&self) -> usize {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::code_size);
        }
        self.compiled.code_size
    }

    /// Native instructions emitted.
    pub fn native_insns(&self) -> usize {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::native_insns);
        }
        self.compiled.native_insns
    }

    /// Address of the entry point now (in the arena for native programs). Compaction may
    /// move the code later (a program whose [`entry`](Self::entry) was taken stays put); the
    /// symbol index ([`Runtime::symbolize`]) follows it.
    pub fn entry_addr(&self) -> u64 {
        self.entry_now()
    }

    /// The arena region holding the code now.
    pub fn region(&self) -> Region {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::region);
        }
        self.movable
            .as_ref()
            .map_or(self.compiled.region, |m| m.region())
    }

    /// Whether compaction may still move the code (arena code whose raw entry was never
    /// handed out).
    pub fn is_movable(&self) -> bool {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::is_movable);
        }
        self.movable.as_ref().is_some_and(|m| !m.is_pinned())
    }

    /// Target architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// Optional features the code uses.
    pub fn features(&self) -> u64 {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::features);
        }
        self.features
    }

    /// Whether `call` can run it here.
    pub fn is_executable(&self) -> bool {
        self.executable
    }

    /// Unique id within its runtime.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Name (for symbols and the perf map).
    pub fn name(&self) -> &str {
        self.symbol.name()
    }

    /// Counts the program as a pending free from the moment a hook retires it (so
    /// [`Runtime::reclaim`] waits for it), before its grace period starts.
    pub(crate) fn note_retiring(&self) {
        if let ArenaRef::Packed(a) = &self.owner {
            a.expect_release();
        }
    }

    /// Drops a program no thread can be running any more (retired by a hook, after its grace
    /// period, [`note_retiring`](Self::note_retiring) called): the code is released at once
    /// instead of waiting a second grace period.
    pub(crate) fn drop_after_grace(mut self) {
        self.code_release = CodeRelease::Now;
    }

    /// [`drop_after_grace`](Self::drop_after_grace) for many programs at once (a hook batch
    /// retiring them after its one grace period), at their arena's next call (see
    /// [`PackedArena::after_grace`]: this runs in an epoch callback).
    // Boxed: these are the hook slots' own allocations, dropped where they are rather than
    // each program copied out first.
    #[allow(clippy::vec_box)]
    pub(crate) fn drop_many_after_grace(progs: Vec<Box<Program>>) {
        let mut by_arena: Vec<(PackedArena, Vec<Box<Program>>)> = Vec::new();
        for p in progs {
            let Some(a) = p.packed_arena().cloned() else {
                p.drop_after_grace();
                continue;
            };
            match by_arena.iter_mut().find(|(k, _)| k.is_same(&a)) {
                Some((_, group)) => group.push(p),
                None => by_arena.push((a, vec![p])),
            }
        }
        for (arena, group) in by_arena {
            let queue = arena.clone();
            queue.after_grace(Box::new(move || Program::drop_group(&arena, group)));
        }
    }

    /// Drops programs of one arena whose grace period has passed: one lock to stop
    /// compaction moving them, one to unlist their symbols (one perf map rewrite) and one to
    /// release their code, instead of one of each per program.
    #[allow(clippy::vec_box)]
    fn drop_group(arena: &PackedArena, group: Vec<Box<Program>>) {
        /// (program id, entry address) pairs to unlist, per symbol index.
        type Unlisting = Vec<(Arc<Symbols>, Vec<(u64, u64)>)>;
        // Adaptive programs own no code: each hands its current code on (see `Drop`).
        let (adaptive, mut group): (Vec<_>, Vec<_>) =
            group.into_iter().partition(|p| p.is_adaptive());
        for p in adaptive {
            (*p).drop_after_grace();
        }
        let movables: Vec<&arena::Movable> =
            group.iter().filter_map(|p| p.movable.as_deref()).collect();
        let mut moved = arena.detach_movables(&movables).into_iter();
        let regions: Vec<Region> = group
            .iter()
            .map(|p| match &p.movable {
                Some(_) => moved.next().expect("one region per movable"),
                None => p.compiled.region,
            })
            .collect();
        // As in `drop`: the symbols go right before the chunks are released.
        let mut unlist: Unlisting = Vec::new();
        for (p, r) in group.iter_mut().zip(&regions) {
            let Some(syms) = p.symbols.take() else {
                continue;
            };
            let entry = (p.id, p.entry_in(r));
            match unlist.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &syms)) {
                Some((_, entries)) => entries.push(entry),
                None => unlist.push((syms, vec![entry])),
            }
        }
        for (syms, entries) in unlist {
            syms.remove_many(&entries);
        }
        arena.release_after_grace(regions);
        for p in &mut group {
            p.code_release = CodeRelease::Released;
        }
        program_box::drop_keeping_boxes(group);
    }

    /// The entry point of the code when it occupies `region`.
    fn entry_in(&self, region: &Region) -> u64 {
        region.exec_addr + (self.compiled.entry - self.compiled.region.exec_addr)
    }

    /// Drops a program whose grace period the caller has already waited out, for hosts that
    /// defer dropping their own handles through the epoch (the C API does): the program goes
    /// to the arena's next call ([`PackedArena::release_due`], [`Runtime::reclaim`], or any
    /// load or free), which drops it and releases its code, instead of waiting a second grace
    /// period behind one more flush. Not dropped here: an epoch-deferred function runs in
    /// whichever thread's pin ends the grace period, perhaps one running a hook, which must
    /// not pay for unlisting the program or rewriting the perf map.
    ///
    /// # Safety
    /// No thread may be executing the program's code or go on to: every thread that could
    /// reach it did so pinned ([`arena::epoch_pin`]), and this runs in an epoch-deferred
    /// function queued after the last such thread obtained the program.
    pub unsafe fn drop_after_own_grace(self) {
        self.note_retiring();
        match self.packed_arena().cloned() {
            Some(arena) => arena.after_grace(Box::new(move || self.drop_after_grace())),
            None => self.drop_after_grace(),
        }
    }

    /// How the built-in helpers (`bpf_get_smp_processor_id`, `bpf_ktime_get_ns`) are carried
    /// out in this program: inlined or called (see [`builtins`]). `None` for programs loaded
    /// without them (the rbpf bridge). Code that cannot call helper 5 (no `call 5`, no
    /// `callx`) reports the clock as a call: the counter is not calibrated for it. Likewise
    /// the per-CPU lookup, whose table is not built for code that cannot call it.
    pub fn builtins(&self) -> Option<BuiltinChoice> {
        if let Tiered::Adaptive(t) = &self.tiering {
            return t.with_current(Program::builtins);
        }
        self.builtins
    }

    /// Name of the backend that compiled the code new calls run (for an adaptive program,
    /// the optimizing tier's once it has tiered up).
    pub fn backend_name(&self) -> &str {
        match &self.tiering {
            Tiered::Adaptive(t) if self.tier() == Tier::Optimized => {
                t.optimized().map_or(&self.backend, |(_, b)| b)
            }
            _ => &self.backend,
        }
    }

    /// The line table of the code new calls run.
    fn current_symbol(&self) -> &symbols::ProgramSymbol {
        match &self.tiering {
            Tiered::Adaptive(t) if self.tier() == Tier::Optimized => {
                t.optimized().map_or(&self.symbol, |(s, _)| s)
            }
            _ => &self.symbol,
        }
    }

    /// The tier whose code new calls run: the one it was loaded with, or for an adaptive
    /// program ([`Tier::Adaptive`]) the baseline until its tier-up, the optimized after.
    pub fn tier(&self) -> Tier {
        match &self.tiering {
            Tiered::Fixed(t) => *t,
            Tiered::Refused(_) => Tier::Baseline,
            Tiered::Adaptive(t) => match t.status() {
                TierStatus::Optimized => Tier::Optimized,
                _ => Tier::Baseline,
            },
        }
    }

    /// Where the program stands with tiering (see [`TierStatus`]).
    pub fn tier_status(&self) -> TierStatus {
        match &self.tiering {
            Tiered::Fixed(t) => TierStatus::Fixed(*t),
            Tiered::Refused(e) => TierStatus::Refused((**e).clone()),
            Tiered::Adaptive(t) => t.status(),
        }
    }

    /// Asks for an adaptive program's tier-up now, whatever its call count (the way to
    /// tier up under [`TierPolicy::Manual`]); returns the status after the request
    /// ([`TierStatus::Pending`] when queued). Nothing for other programs.
    pub fn request_tier_up(&self) -> TierStatus {
        match &self.tiering {
            Tiered::Adaptive(t) => t.request(),
            _ => self.tier_status(),
        }
    }

    /// Waits while an adaptive program's tier-up is queued or compiling
    /// ([`TierStatus::Pending`]) and returns the status then; returns at once otherwise.
    /// For tests and hosts that want the optimized code before going on.
    pub fn wait_tier_up(&self) -> TierStatus {
        match &self.tiering {
            Tiered::Adaptive(t) => t.wait(),
            _ => self.tier_status(),
        }
    }

    /// The program whose code runs, fixed for good (for code that keeps its address: a prog
    /// array slot): `self`, or an adaptive program's current code, settled.
    pub(crate) fn settled_code(&self) -> &Program {
        match &self.tiering {
            Tiered::Adaptive(t) => t.settle(),
            _ => self,
        }
    }

    fn is_adaptive(&self) -> bool {
        matches!(self.tiering, Tiered::Adaptive(_))
    }
}

/// What dropping a [`Program`] does with its code.
enum CodeRelease {
    /// Free it after a grace period of its own: a handle the host drops may still be
    /// running on other threads.
    AfterOwnGrace,
    /// Release it at once: a hook retired it and its grace period has passed.
    Now,
    /// Nothing: released already, with its batch (see
    /// [`Program::drop_many_after_grace`]).
    Released,
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Tiered::Adaptive(t) = &self.tiering {
            t.release(match self.code_release {
                CodeRelease::Now => tiering::Release::GracePassed,
                CodeRelease::AfterOwnGrace | CodeRelease::Released => {
                    tiering::Release::AfterOwnGrace
                }
            });
            return;
        }
        if matches!(self.code_release, CodeRelease::Released) {
            return;
        }
        // Stop compaction from moving the code and learn where it is now.
        let region = match (&self.movable, &self.owner) {
            (Some(m), ArenaRef::Packed(a)) => a.detach_movable(m),
            _ => self.compiled.region,
        };
        let entry = self.entry_in(&region);
        let id = self.id;
        let syms = self.symbols.take();
        // The symbol goes right before the chunks are released, never earlier: a profiler
        // sample inside a retired program that is still finishing must still resolve.
        let unlist = move || {
            if let Some(s) = syms {
                s.remove(id, entry);
            }
        };
        match &self.owner {
            ArenaRef::Packed(a) if matches!(self.code_release, CodeRelease::Now) => {
                unlist();
                a.release_after_grace(vec![region]);
            }
            ArenaRef::Packed(a) => a.free_deferred_then(region, unlist),
            ArenaRef::Heap(s) => s.free(&self.compiled.region),
        }
    }
}

#[cfg(test)]
mod tests;

/// The Rust example of the repository's README ("Using it from Rust"), compiled as a doctest
/// so that it keeps up with the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
