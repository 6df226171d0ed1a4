//! # packjit-plugin-api
//!
//! The contract between the packjit host and its JIT backends.
//!
//! * [`JitBackend`] and [`CodeArena`] are the Rust traits both sides program against.
//! * [`abi`] holds their `#[repr(C)]` twins ([`PjBackendVtable`], [`PjArenaVtable`], the
//!   request/result structs). Only these cross a shared-object boundary.
//! * [`export_backend!`] turns a `JitBackend` into an exported plugin vtable, catching panics
//!   at the boundary; [`host::LoadedBackend`] wraps a vtable read from a plugin back into a
//!   `JitBackend` for the host.
//! * [`CompileError`] is what compiling can fail with; a run that ends early ends with a
//!   [`Stop`] (out of bounds, budget, unknown `callx`), a different type: stops are decoded
//!   from [`PjExecEnv`] after a run, never reported by a backend.
//!
//! A backend used statically (as an `rlib`) is just a `JitBackend`; the same code serves both
//! paths.
//!
//! ```
//! use packjit_plugin_api::{Arch, CompileError, ErrorKind};
//! assert_eq!(Arch::from_code(Arch::Aarch64.code()), Some(Arch::Aarch64));
//! let e = CompileError::at(3, ErrorKind::UnknownHelper, "unknown helper id 9");
//! assert_eq!(e.to_string(), "pc 3: unknown helper id 9");
//! ```

pub mod abi;
pub mod export;
pub mod host;
mod stop;

pub use abi::*;
pub use stop::{Stop, StopKind};

use std::fmt;

/// Architectures a backend can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86-64 (no packjit backend yet; the host arch of the development machines).
    X86_64,
    /// AArch64.
    Aarch64,
    /// RV64GC.
    Riscv64,
}

impl Arch {
    /// The `PJ_ARCH_*` code.
    pub const fn code(self) -> u32 {
        match self {
            Arch::X86_64 => PJ_ARCH_X86_64,
            Arch::Aarch64 => PJ_ARCH_AARCH64,
            Arch::Riscv64 => PJ_ARCH_RISCV64,
        }
    }

    /// Decodes a `PJ_ARCH_*` code.
    pub const fn from_code(code: u32) -> Option<Arch> {
        match code {
            PJ_ARCH_X86_64 => Some(Arch::X86_64),
            PJ_ARCH_AARCH64 => Some(Arch::Aarch64),
            PJ_ARCH_RISCV64 => Some(Arch::Riscv64),
            _ => None,
        }
    }

    /// The architecture this process runs on, if packjit knows it.
    pub const fn host() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else if cfg!(target_arch = "riscv64") {
            Some(Arch::Riscv64)
        } else {
            None
        }
    }

    /// Short name (`x86_64`, `aarch64`, `riscv64`).
    pub const fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
            Arch::Riscv64 => "riscv64",
        }
    }

    /// Parses `x86_64`, `aarch64`/`arm64`, `riscv64`/`rv64`.
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "x86_64" | "x86-64" | "amd64" => Some(Arch::X86_64),
            "aarch64" | "arm64" => Some(Arch::Aarch64),
            "riscv64" | "rv64" | "riscv64gc" => Some(Arch::Riscv64),
            _ => None,
        }
    }

    /// The instruction pattern free code memory is filled with, so a stray jump traps:
    /// x86 `int3`, arm64 `brk #0`, RV64 an all-zero 16-bit parcel (defined illegal).
    pub const fn trap_pattern(self) -> &'static [u8] {
        match self {
            Arch::X86_64 => &[0xcc],
            Arch::Aarch64 => &[0x00, 0x00, 0x20, 0xd4],
            Arch::Riscv64 => &[0x00, 0x00],
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong compiling or installing a program, mirroring the `PJ_ERR_*` codes a
/// backend or the host can report for that. (The C API's run-time statuses
/// `PJ_ERR_OUT_OF_BOUNDS`, `PJ_ERR_BUDGET` and `PJ_ERR_UNKNOWN_CALLX` are not compile errors:
/// they come from a [`Stop`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad argument.
    InvalidArgument,
    /// Bytecode rejected by the verifier.
    Verify,
    /// Unsupported instruction, option or feature.
    Unsupported,
    /// Helper id not registered.
    UnknownHelper,
    /// Cannot be encoded on the target.
    Encoding,
    /// Arena out of memory.
    Arena,
    /// ABI mismatch.
    Abi,
    /// Panic caught at the boundary.
    Panic,
    /// Plugin could not be loaded.
    Plugin,
    /// Program not runnable here.
    NotExecutable,
    /// Internal error.
    Internal,
}

impl ErrorKind {
    /// The `PJ_ERR_*` code.
    pub const fn code(self) -> i32 {
        match self {
            ErrorKind::InvalidArgument => PJ_ERR_INVALID_ARGUMENT,
            ErrorKind::Verify => PJ_ERR_VERIFY,
            ErrorKind::Unsupported => PJ_ERR_UNSUPPORTED,
            ErrorKind::UnknownHelper => PJ_ERR_UNKNOWN_HELPER,
            ErrorKind::Encoding => PJ_ERR_ENCODING,
            ErrorKind::Arena => PJ_ERR_ARENA,
            ErrorKind::Abi => PJ_ERR_ABI,
            ErrorKind::Panic => PJ_ERR_PANIC,
            ErrorKind::Plugin => PJ_ERR_PLUGIN,
            ErrorKind::NotExecutable => PJ_ERR_NOT_EXECUTABLE,
            ErrorKind::Internal => PJ_ERR_INTERNAL,
        }
    }

    /// Decodes a `PJ_ERR_*` code; unknown codes (and the run-time statuses, which no compile
    /// reports) map to `Internal`.
    pub const fn from_code(code: i32) -> ErrorKind {
        match code {
            PJ_ERR_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
            PJ_ERR_VERIFY => ErrorKind::Verify,
            PJ_ERR_UNSUPPORTED => ErrorKind::Unsupported,
            PJ_ERR_UNKNOWN_HELPER => ErrorKind::UnknownHelper,
            PJ_ERR_ENCODING => ErrorKind::Encoding,
            PJ_ERR_ARENA => ErrorKind::Arena,
            PJ_ERR_ABI => ErrorKind::Abi,
            PJ_ERR_PANIC => ErrorKind::Panic,
            PJ_ERR_PLUGIN => ErrorKind::Plugin,
            PJ_ERR_NOT_EXECUTABLE => ErrorKind::NotExecutable,
            _ => ErrorKind::Internal,
        }
    }

    /// A short description of the code.
    pub const fn describe(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Verify => "bytecode rejected by the verifier",
            ErrorKind::Unsupported => "unsupported by the backend",
            ErrorKind::UnknownHelper => "unknown helper",
            ErrorKind::Encoding => "cannot be encoded for the target",
            ErrorKind::Arena => "code arena exhausted",
            ErrorKind::Abi => "plugin ABI mismatch",
            ErrorKind::Panic => "panic caught at the boundary",
            ErrorKind::Plugin => "plugin could not be loaded",
            ErrorKind::NotExecutable => "program cannot run here",
            ErrorKind::Internal => "internal error",
        }
    }
}

/// An error from compiling or installing a program: what, and at which eBPF pc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError {
    /// The category.
    pub kind: ErrorKind,
    /// The eBPF instruction index, when the error concerns one.
    pub pc: Option<usize>,
    /// Human-readable detail.
    pub message: String,
}

/// Whether an access reads or writes memory (atomics count as writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessDirection {
    /// A load.
    Read,
    /// A store or an atomic read-modify-write.
    Write,
}

impl fmt::Display for AccessDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessDirection::Read => "read",
            AccessDirection::Write => "write",
        })
    }
}

impl CompileError {
    /// An error not tied to an instruction.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            pc: None,
            message: message.into(),
        }
    }

    /// An error at instruction `pc`.
    pub fn at(pc: usize, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            pc: Some(pc),
            message: message.into(),
        }
    }

    /// Converts into the inline C form, truncating the message on a UTF-8 boundary.
    pub fn to_c(&self) -> PjError {
        let mut out = PjError {
            code: self.kind.code(),
            pc: self.pc.map_or(-1, |pc| pc as i64),
            ..PjError::default()
        };
        write_c_message(&mut out.message, &self.message);
        out
    }

    /// Reads the inline C form. A missing NUL or invalid UTF-8 is tolerated.
    pub fn from_c(err: &PjError) -> Self {
        let bytes: Vec<u8> = err
            .message
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        let mut message = String::from_utf8_lossy(&bytes).into_owned();
        if message.is_empty() {
            message = ErrorKind::from_code(err.code).describe().to_string();
        }
        Self {
            kind: ErrorKind::from_code(err.code),
            pc: usize::try_from(err.pc).ok(),
            message,
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pc {
            Some(pc) => write!(f, "pc {pc}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for CompileError {}

/// Copies `msg` into a fixed C buffer, NUL-terminated, cut on a character boundary.
pub fn write_c_message(buf: &mut [core::ffi::c_char], msg: &str) {
    if buf.is_empty() {
        return;
    }
    let mut end = msg.len().min(buf.len() - 1);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    for (dst, &b) in buf.iter_mut().zip(&msg.as_bytes()[..end]) {
        *dst = b as core::ffi::c_char;
    }
    buf[end] = 0;
}

/// A region of code memory (see [`PjRegion`]).
pub type Region = PjRegion;

/// A helper table entry (see [`PjHelper`]).
pub type HelperEntry = PjHelper;

/// Code memory owned by the host. Backends write through it; they never map or protect.
pub trait CodeArena {
    /// Reserves `size` bytes; the region's `exec_addr` is where the code will run.
    fn alloc(&self, size: usize) -> Result<Region, CompileError>;
    /// Writes `bytes` at `offset` inside `region`.
    fn write(&self, region: &Region, offset: usize, bytes: &[u8]) -> Result<(), CompileError>;
    /// Returns a region that will never be committed (compilation failed).
    fn free(&self, region: &Region);
}

/// A compile request in Rust form.
#[derive(Clone, Copy, Debug)]
pub struct CompileRequest<'a> {
    /// eBPF bytecode (multiple of 8 bytes).
    pub code: &'a [u8],
    /// Helper table.
    pub helpers: &'a [HelperEntry],
    /// Optional CPU features the backend may use.
    pub features: u64,
    /// `PJ_COMPILE_*` flags.
    pub flags: u32,
    /// Key for constant blinding (used with `PJ_COMPILE_BLIND_CONSTANTS`).
    pub blind_key: u64,
}

impl CompileRequest<'_> {
    /// Looks up a helper address by id.
    pub fn helper(&self, id: u32) -> Option<u64> {
        self.helpers.iter().find(|h| h.id == id).map(|h| h.addr)
    }
}

/// A successfully compiled program, written into its arena region (not yet committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// Where the code lives; the host owns it now.
    pub region: Region,
    /// Entry address (see [`PjProgramEntry`]).
    pub entry: u64,
    /// Bytes of machine code.
    pub code_size: usize,
    /// Native instructions emitted.
    pub native_insns: usize,
    /// The line table: for each 8-byte bytecode slot, the byte offset (from the entry) where
    /// its native code starts, [`NO_NATIVE_CODE`] for the second slot of `lddw`. Empty when
    /// the backend does not report one.
    pub pc_offsets: Vec<u32>,
}

/// [`Compiled::pc_offsets`] entry of a slot with no code of its own (the second half of
/// `lddw`).
pub const NO_NATIVE_CODE: u32 = u32::MAX;

/// A JIT backend: turns verified-or-not eBPF bytecode into native code in a host arena.
///
/// Implementations must verify what they compile (a C host can call a plugin directly) and
/// report bad input as a [`CompileError`] with the pc, never panic on it.
pub trait JitBackend: Send + Sync {
    /// The architecture the emitted code runs on.
    fn arch(&self) -> Arch;
    /// Backend name.
    fn name(&self) -> &str;
    /// Backend version.
    fn version(&self) -> &str;
    /// Optional-feature bits this backend understands.
    fn supported_features(&self) -> u64;
    /// Optional features offered by the CPU this process runs on (0 on a foreign host).
    fn detect_features(&self) -> u64;
    /// The `PJ_INLINE_*` kinds this backend emits inline, as `pj_inline_bit` bits (see
    /// [`PjHelper::inline_kind`]). None by default: a host then sends plain calls only.
    fn inline_kinds(&self) -> u32 {
        0
    }
    /// Compiles a program into `arena`.
    fn compile(
        &self,
        req: &CompileRequest<'_>,
        arena: &dyn CodeArena,
    ) -> Result<Compiled, CompileError>;
}

/// Places finished machine code in the arena: alloc, write, and give the region back if the
/// write fails. Backends emit position-independent code (all internal branches PC-relative,
/// helpers through absolute addresses in registers), so the bytes are valid at whatever
/// `exec_addr` the arena picks.
pub fn install_code(
    arena: &dyn CodeArena,
    code: &[u8],
    native_insns: usize,
) -> Result<Compiled, CompileError> {
    install_code_with_line_table(arena, code, native_insns, Vec::new())
}

/// [`install_code`] with the line table (see [`Compiled::pc_offsets`]).
pub fn install_code_with_line_table(
    arena: &dyn CodeArena,
    code: &[u8],
    native_insns: usize,
    pc_offsets: Vec<u32>,
) -> Result<Compiled, CompileError> {
    let region = arena.alloc(code.len())?;
    if let Err(e) = arena.write(&region, 0, code) {
        arena.free(&region);
        return Err(e);
    }
    Ok(Compiled {
        region,
        entry: region.exec_addr,
        code_size: code.len(),
        native_insns,
        pc_offsets,
    })
}
