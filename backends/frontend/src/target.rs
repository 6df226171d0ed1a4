//! The entry points every backend crate offers, written once: a backend describes itself
//! ([`Target`]: its name, feature bits, inlined helper kinds and lowering function) and gets
//! request validation, decoding, emission and installation into the arena from here, so
//! the production path, the benches' measurement path and the plugin's `compile` are one
//! path with one set of checks.
//!
//! ```ignore
//! pub const TARGET: Target = Target { name: "arm64", supported_features: .., inline_kinds: .., lower: lower::emit_decoded_with };
//! pub fn emit_request(req: &CompileRequest<'_>) -> Result<Emitted, CompileError> { TARGET.emit_request(req) }
//! ```

use packjit_plugin_api::{
    install_code_with_line_table, CodeArena, CompileError, CompileRequest, Compiled, HelperEntry,
};

use crate::analysis::{validate_inline_kinds, validate_request, CodegenMode, EmitOptions};
use crate::lower::Emitted;
use crate::Program;

/// A backend's lowering of a decoded program: the same signature in every backend crate
/// (`emit_decoded_with`).
pub type LowerFn =
    fn(&Program, &[HelperEntry], &CodegenMode, EmitOptions) -> Result<Emitted, CompileError>;

/// What the front end needs to know of a backend to serve its entry points.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The ISA's name in error messages (`"arm64"`, `"riscv64"`, `"x86-64"`).
    pub name: &'static str,
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
        let mode = validate_request(req, self.name, self.supported_features)?;
        validate_inline_kinds(req.helpers, self.name, self.inline_kinds)?;
        let prog = crate::decode_for_lowering(req)?;
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
