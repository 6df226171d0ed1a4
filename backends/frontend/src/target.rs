//! The entry points every backend crate offers, written once: a backend describes itself
//! ([`Target`]: its name, feature bits, inlined helper kinds and lowering function) and gets
//! request validation, decoding, emission and installation into the arena from here, so
//! the production path, the benches' measurement path and the plugin's `compile` are one
//! path with one set of checks.
//!
//! A backend crate's `lib.rs` declares its `TARGET` and one line, [`backend_crate!`](crate::backend_crate), which
//! gives it the public entry points every backend crate has (`emit_program`,
//! `emit_request`, `emit_request_with`) and its `JitBackend` impl:
//!
//! ```ignore
//! pub const TARGET: Target = Target { arch: Arch::Aarch64, isa: "arm64", name: "packjit-arm64", .. };
//! packjit_frontend::backend_crate!(Arm64Backend, TARGET);
//! ```

use packjit_plugin_api::{
    install_code_with_line_table, pj_inline_bit, Arch, CodeArena, CompileError, CompileRequest,
    Compiled, HelperEntry, PJ_INLINE_ARRAY_LOOKUP, PJ_INLINE_COUNTER_CLOCK,
    PJ_INLINE_PERCPU_LOOKUP, PJ_INLINE_PROG_ARRAY_TAIL_CALL, PJ_INLINE_RSEQ_CPU_ID,
    PJ_INLINE_TAIL_CALL,
};

use crate::analysis::{validate_inline_kinds, validate_request, CodegenMode, EmitOptions};
use crate::lower::Emitted;
use crate::Program;

/// Every inlined helper kind the lowering contract emits: the rseq CPU id, the cycle
/// counter (`CallHooks::call_helper`), the per-CPU array lookup (`CallHooks::mov_percpu`), tail calls
/// (`FrameHooks::tail_jump`, after the host's chooser or the driver's prog-array expansion)
/// and array map lookups (the driver's eBPF expansion). A backend
/// that implements the contract emits them all, so each announces this set; the bits stay
/// per backend in the plugin ABI because a plugin built outside this tree may not.
pub const EVERY_INLINE_KIND: u32 = pj_inline_bit(PJ_INLINE_RSEQ_CPU_ID)
    | pj_inline_bit(PJ_INLINE_COUNTER_CLOCK)
    | pj_inline_bit(PJ_INLINE_PERCPU_LOOKUP)
    | pj_inline_bit(PJ_INLINE_TAIL_CALL)
    | pj_inline_bit(PJ_INLINE_ARRAY_LOOKUP)
    | pj_inline_bit(PJ_INLINE_PROG_ARRAY_TAIL_CALL);

/// A backend's lowering of a decoded program: the same signature in every backend crate
/// (`emit_decoded_with`).
pub type LowerFn =
    fn(&Program, &[HelperEntry], &CodegenMode, EmitOptions) -> Result<Emitted, CompileError>;

/// What the front end needs to know of a backend to serve its entry points.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub arch: Arch,
    /// The ISA's name in error messages (`"arm64"`, `"riscv64"`, `"x86-64"`).
    pub isa: &'static str,
    /// The backend's name as `JitBackend::name` reports it (`"packjit-arm64"`).
    pub name: &'static str,
    /// The optional features the running CPU has (0 on another ISA).
    pub detect_features: fn() -> u64,
    /// Every `features` bit the backend understands; a request with others is refused.
    pub supported_features: u64,
    /// The inlined helper kinds the backend emits (a bit per `PJ_INLINE_*`).
    pub inline_kinds: u32,
    /// The backend's lowering.
    pub lower: LowerFn,
}

impl Target {
    /// The request validated (flags, feature bits, inline helper kinds) and its code
    /// verified and decoded for lowering.
    pub fn decode(&self, req: &CompileRequest<'_>) -> Result<(Program, CodegenMode), CompileError> {
        let mode = validate_request(req, self.isa, self.supported_features)?;
        validate_inline_kinds(req.helpers, self.isa, self.inline_kinds)?;
        let prog = crate::decode_for_lowering(req)?;
        // The sandbox contract: no host address a call left in r1-r5 reaches the program.
        if mode.sandboxed() {
            crate::analysis::refuse_reads_after_calls(&prog)?;
        }
        Ok((prog, mode))
    }

    /// Validates, decodes and emits a request.
    pub fn emit_request(&self, req: &CompileRequest<'_>) -> Result<Emitted, CompileError> {
        self.emit_request_with(req, EmitOptions::default())
    }

    /// [`Self::emit_request`] with measurement switches (benches only; see
    /// [`EmitOptions`]): the same validation and decoding as production.
    pub fn emit_request_with(
        &self,
        req: &CompileRequest<'_>,
        opts: EmitOptions,
    ) -> Result<Emitted, CompileError> {
        let (prog, mode) = self.decode(req)?;
        (self.lower)(&prog, req.helpers, &mode, opts)
    }

    /// Trusted code (no compile flags) for `code`, with the optional `features`.
    pub fn emit_program(
        &self,
        code: &[u8],
        helpers: &[HelperEntry],
        features: u64,
    ) -> Result<Emitted, CompileError> {
        self.emit_request(&CompileRequest {
            code,
            helpers,
            features,
            flags: 0,
            blind_key: 0,
        })
    }

    /// `JitBackend::compile`: emits the request and installs the code, with its line
    /// table, through `arena`.
    pub fn compile(
        &self,
        req: &CompileRequest<'_>,
        arena: &dyn CodeArena,
    ) -> Result<Compiled, CompileError> {
        let (prog, mode) = self.decode(req)?;
        let out = (self.lower)(&prog, req.helpers, &mode, EmitOptions::default())?;
        let line_table = prog.line_table(out.inst_offsets);
        install_code_with_line_table(arena, &out.bytes, out.native_insns, line_table)
    }
}

/// What [`backend_crate!`](crate::backend_crate) expands to refers to through here, so a backend crate needs no
/// extra imports for it.
#[doc(hidden)]
pub mod __private {
    pub use crate::analysis::EmitOptions;
    pub use crate::lower::Emitted;
    pub use packjit_plugin_api::{
        Arch, CodeArena, CompileError, CompileRequest, Compiled, HelperEntry, JitBackend,
    };
}

/// The entry points every backend crate has, and its `JitBackend` impl, from the unit
/// struct `$backend` and the crate's `$target` ([`Target`]): one definition for every
/// backend, so the crates cannot drift apart.
#[macro_export]
macro_rules! backend_crate {
    ($backend:ident, $target:ident) => {
        pub use $crate::lower::Emitted;
        #[doc(hidden)]
        pub use $crate::analysis::EmitOptions;

        /// Emits an already decoded program (`packjit_frontend::decode_for_lowering`) for
        /// `mode` (`packjit_frontend::analysis::validate_request`).
        pub fn emit_decoded(
            prog: &$crate::Program,
            helpers: &[$crate::target::__private::HelperEntry],
            mode: &$crate::analysis::CodegenMode,
        ) -> Result<$crate::target::__private::Emitted, $crate::target::__private::CompileError>
        {
            ($target.lower)(prog, helpers, mode, $crate::analysis::EmitOptions::default())
        }

        /// Verifies `code` against `helpers` and emits trusted code (no compile flags) with
        /// the optional `features`, without placing it anywhere (tools, tests).
        pub fn emit_program(
            code: &[u8],
            helpers: &[$crate::target::__private::HelperEntry],
            features: u64,
        ) -> Result<$crate::target::__private::Emitted, $crate::target::__private::CompileError>
        {
            $target.emit_program(code, helpers, features)
        }

        /// Validates the request's flags and features, verifies the code and emits it.
        pub fn emit_request(
            req: &$crate::target::__private::CompileRequest<'_>,
        ) -> Result<$crate::target::__private::Emitted, $crate::target::__private::CompileError>
        {
            $target.emit_request(req)
        }

        /// [`emit_request`] with measurement-only switches (see `EmitOptions`): for the
        /// benches, never used by the plugin or the runtime; the same validation as
        /// production.
        #[doc(hidden)]
        pub fn emit_request_with(
            req: &$crate::target::__private::CompileRequest<'_>,
            opts: $crate::target::__private::EmitOptions,
        ) -> Result<$crate::target::__private::Emitted, $crate::target::__private::CompileError>
        {
            $target.emit_request_with(req, opts)
        }

        impl $crate::target::__private::JitBackend for $backend {
            fn arch(&self) -> $crate::target::__private::Arch {
                $target.arch
            }

            fn name(&self) -> &str {
                $target.name
            }

            fn version(&self) -> &str {
                env!("CARGO_PKG_VERSION")
            }

            fn supported_features(&self) -> u64 {
                $target.supported_features
            }

            fn detect_features(&self) -> u64 {
                ($target.detect_features)()
            }

            fn inline_kinds(&self) -> u32 {
                $target.inline_kinds
            }

            fn compile(
                &self,
                req: &$crate::target::__private::CompileRequest<'_>,
                arena: &dyn $crate::target::__private::CodeArena,
            ) -> Result<
                $crate::target::__private::Compiled,
                $crate::target::__private::CompileError,
            > {
                $target.compile(req, arena)
            }
        }
    };
}
