//! Which compiler a load uses: the baseline backend (one pass, microseconds) or the
//! optimizing tier (`packjit-tier2`: Cranelift, for hot programs, trusted or sandboxed; cargo feature
//! `optimizer`).

use crate::{err, Error, ErrorKind, LoadOptions};
use packjit_plugin_api::{Arch, JitBackend};
use std::sync::Arc;

/// The compiler a load asks for ([`LoadOptions::tier`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The one-pass baseline backend of the target arch (the default).
    #[default]
    Baseline,
    /// The optimizing tier (Cranelift; cargo feature `optimizer`), native code only.
    /// Compiles 10-100x slower than the baseline and runs faster where a one-pass JIT
    /// cannot: stack slots kept in registers, constants folded, redundant extensions
    /// dropped. Takes trusted and sandboxed programs, with or without a budget, with maps
    /// and tail calls (each tail call nests its target through the runtime's runner, ~6 ns,
    /// where the baseline jumps), without blinding, legacy packet loads or the per-CPU
    /// instruction for now:
    /// anything else is refused with [`ErrorKind::Unsupported`] naming what, never
    /// compiled differently.
    Optimized,
    /// Loads on the baseline and moves to the optimizing tier in the background once it
    /// runs hot, as the runtime's [`crate::TierPolicy`] says (see [`crate::TierStatus`],
    /// `docs/ARCHITECTURE.md`, "Adaptive tiering"). A program the optimizing tier cannot
    /// take (a tail call, blinding, ..., or a build without the `optimizer` feature)
    /// loads the same and stays on the baseline, [`crate::TierStatus::Refused`] saying why:
    /// never an error at load.
    Adaptive,
}

impl Tier {
    /// Whether this build of packjit has the tier: the optimizing tier needs the cargo
    /// feature `optimizer`, which any crate of the build may turn on (cargo unifies
    /// features), so a host asks here rather than testing its own feature.
    pub const fn is_built(self) -> bool {
        match self {
            Tier::Baseline | Tier::Adaptive => true,
            Tier::Optimized => cfg!(feature = "optimizer"),
        }
    }
}

/// The optimizing tier's backend for `arch`, or why there is none.
pub(crate) fn optimizer(arch: Arch) -> Result<(Arc<dyn JitBackend>, Arc<str>), Error> {
    if Arch::host() != Some(arch) {
        return Err(err(
            ErrorKind::Unsupported,
            format!("optimized tier: compiles for the host only, not for {arch}"),
        ));
    }
    optimizer_for_host()
}

#[cfg(feature = "optimizer")]
fn optimizer_for_host() -> Result<(Arc<dyn JitBackend>, Arc<str>), Error> {
    use std::sync::OnceLock;
    static BACKEND: OnceLock<Option<Arc<dyn JitBackend>>> = OnceLock::new();
    let be = BACKEND.get_or_init(|| {
        packjit_tier2::OptimizingBackend::host().map(|b| Arc::new(b) as Arc<dyn JitBackend>)
    });
    match be {
        Some(b) => Ok((b.clone(), packjit_tier2::NAME.into())),
        None => Err(err(
            ErrorKind::Unsupported,
            "optimized tier: Cranelift has no backend for this host",
        )),
    }
}

#[cfg(not(feature = "optimizer"))]
fn optimizer_for_host() -> Result<(Arc<dyn JitBackend>, Arc<str>), Error> {
    Err(err(
        ErrorKind::Unsupported,
        "optimized tier: packjit was built without its `optimizer` cargo feature",
    ))
}

/// Refuses, by name, a load the optimizing tier cannot compile faithfully yet.
/// Sandboxed loads, instruction budgets, maps (array lookups inlined, the other helpers as
/// calls, callbacks expanded into bpf-to-bpf calls by the binding) and tail calls (through
/// the runner, the target nested) the tier compiles under the baseline's contracts.
pub(crate) fn refuse_unsupported(opts: &LoadOptions) -> Result<(), Error> {
    let what = if opts.blind_constants {
        "constant blinding"
    } else if opts.percpu_insn {
        "the per-CPU address instruction"
    } else {
        return Ok(());
    };
    Err(err(
        ErrorKind::Unsupported,
        format!("optimized tier: {what} not supported yet"),
    ))
}
