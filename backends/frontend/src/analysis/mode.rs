//! How a request asks the code to be generated ([`CodegenMode`]), and the checks of the
//! request and of its helper table that every backend shares, with the same messages.

use crate::{op_kind, Program};
use packjit_plugin_api::{
    pj_inline_bit, CompileError, CompileRequest, ErrorKind, HelperEntry, PJ_COMPILE_ALL_FLAGS,
    PJ_COMPILE_BLIND_CONSTANTS, PJ_COMPILE_BUDGET, PJ_COMPILE_PERCPU_INSN, PJ_COMPILE_SANDBOX,
    PJ_HELPER_PERCPU_OFFSET, PJ_INLINE_ARRAY_LOOKUP, PJ_INLINE_COUNTER_CLOCK, PJ_INLINE_NONE,
    PJ_INLINE_PERCPU_LOOKUP, PJ_INLINE_PROG_ARRAY_TAIL_CALL, PJ_INLINE_TAIL_CALL,
};

/// Whether the memory checks of the sandbox are emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryChecks {
    /// Trusted code: accesses go to whatever address the program computes.
    Unchecked,
    /// Sandboxed code: every access not proven safe is checked at run time.
    Checked,
}

/// Whether the instruction budget is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Budget {
    /// No counting.
    Unlimited,
    /// Back-edges and calls charge `PjExecEnv::budget` (see
    /// [`back_edge_charge`](super::back_edge_charge)).
    Counted,
}

/// How a request asks the code to be generated, validated once for every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodegenMode {
    /// Memory checks (sandbox) on or off.
    pub memory: MemoryChecks,
    /// Instruction budget on or off.
    pub budget: Budget,
    /// `Some(key)` when immediates are blinded with a key derived from `key`.
    pub blind_key: Option<u64>,
    /// Optional CPU features the backend may use.
    pub features: u64,
    /// The helper table has a tail call (`PJ_INLINE_TAIL_CALL`): the entry keeps `env`,
    /// whose context a tail call passes on.
    pub tail_calls: bool,
}

impl CodegenMode {
    /// Trusted code, no budget, no blinding, no optional features.
    pub const TRUSTED: CodegenMode = CodegenMode {
        memory: MemoryChecks::Unchecked,
        budget: Budget::Unlimited,
        blind_key: None,
        features: 0,
        tail_calls: false,
    };

    /// Is this sandboxed code?
    pub fn sandboxed(&self) -> bool {
        self.memory == MemoryChecks::Checked
    }

    /// Does the code count the budget?
    pub fn counts_budget(&self) -> bool {
        self.budget == Budget::Counted
    }

    /// Must the entry keep `env` for the whole run? When the code can stop (sandbox checks,
    /// the budget, a `callx` to an unknown id: the stop is written there and unwinds from
    /// there), tail calls (which pass the run's context on from it) or reads the context
    /// start from it (legacy packet loads, [`crate::packet`]). From the functions'
    /// summaries (`Subprog::ops`), not the instructions.
    pub fn keeps_env(&self, prog: &Program) -> bool {
        let ops = prog.subprogs.iter().fold(0u16, |m, s| m | s.ops);
        self.sandboxed()
            || self.counts_budget()
            || self.tail_calls
            || ops & (op_kind::CALL_REG | op_kind::PACKET_LOAD) != 0
    }
}

/// Validates the request's flags and feature bits against what `arch` (a backend name such as
/// "arm64") supports, with the same messages for every backend.
pub fn validate_request(
    req: &CompileRequest<'_>,
    arch: &str,
    supported_features: u64,
) -> Result<CodegenMode, CompileError> {
    if req.flags & !PJ_COMPILE_ALL_FLAGS != 0 {
        return Err(CompileError::new(
            ErrorKind::Unsupported,
            format!(
                "unknown compile flags 0x{:x} (defined: 0x{PJ_COMPILE_ALL_FLAGS:x})",
                req.flags & !PJ_COMPILE_ALL_FLAGS
            ),
        ));
    }
    if req.flags & PJ_COMPILE_PERCPU_INSN != 0
        && !req.helpers.iter().any(|h| h.id == PJ_HELPER_PERCPU_OFFSET)
    {
        return Err(CompileError::new(
            ErrorKind::InvalidArgument,
            format!("PJ_COMPILE_PERCPU_INSN without a per-CPU table entry (helper id {PJ_HELPER_PERCPU_OFFSET:#x})"),
        ));
    }
    if req.features & !supported_features != 0 {
        return Err(CompileError::new(
            ErrorKind::Unsupported,
            format!(
                "unknown {arch} feature bits 0x{:x} (supported: 0x{supported_features:x})",
                req.features & !supported_features
            ),
        ));
    }
    Ok(CodegenMode {
        memory: if req.flags & PJ_COMPILE_SANDBOX != 0 {
            MemoryChecks::Checked
        } else {
            MemoryChecks::Unchecked
        },
        budget: if req.flags & PJ_COMPILE_BUDGET != 0 {
            Budget::Counted
        } else {
            Budget::Unlimited
        },
        blind_key: (req.flags & PJ_COMPILE_BLIND_CONSTANTS != 0).then_some(req.blind_key),
        features: req.features,
        tail_calls: req.helpers.iter().any(|h| {
            [PJ_INLINE_TAIL_CALL, PJ_INLINE_PROG_ARRAY_TAIL_CALL].contains(&h.inline_kind)
        }),
    })
}

/// Refuses helper entries whose `inline_kind` the backend (`arch`, supporting the
/// `pj_inline_bit` set `supported`) does not emit, or whose parameter cannot be right (a
/// NULL clock scale), with the same messages for every backend.
pub fn validate_inline_kinds(
    helpers: &[HelperEntry],
    arch: &str,
    supported: u32,
) -> Result<(), CompileError> {
    for h in helpers {
        let k = h.inline_kind;
        if h.id == PJ_HELPER_PERCPU_OFFSET && (k != PJ_INLINE_NONE || h.addr == 0) {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "helper id {:#x} (per-CPU table): inline kind must be 0 and the table non-NULL, is kind {k}, table {:#x}",
                    h.id, h.addr
                ),
            ));
        }
        if k == PJ_INLINE_NONE {
            continue;
        }
        if k >= 32 || supported & pj_inline_bit(k) == 0 {
            return Err(CompileError::new(
                ErrorKind::Unsupported,
                format!(
                    "helper id {}: inline kind {k} is not supported by the {arch} backend (supported bits: 0x{supported:x})",
                    h.id
                ),
            ));
        }
        let with_block = [
            PJ_INLINE_COUNTER_CLOCK,
            PJ_INLINE_PERCPU_LOOKUP,
            PJ_INLINE_TAIL_CALL,
            PJ_INLINE_ARRAY_LOOKUP,
            PJ_INLINE_PROG_ARRAY_TAIL_CALL,
        ];
        if with_block.contains(&k) && h.addr == 0 {
            return Err(CompileError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "helper id {}: inline kind {k} with a NULL parameter block",
                    h.id
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{helper_code, HelperCode, InlineHelper};
    use packjit_plugin_api::PJ_INLINE_RSEQ_CPU_ID;

    #[test]
    fn inline_kinds_are_checked_against_the_backend_and_decoded_once() {
        let cpu = HelperEntry {
            id: 8,
            inline_kind: PJ_INLINE_RSEQ_CPU_ID,
            addr: (-0x70i64) as u64,
        };
        let clock = HelperEntry {
            id: 5,
            inline_kind: PJ_INLINE_COUNTER_CLOCK,
            addr: 0x1000,
        };
        let call = HelperEntry {
            id: 1,
            inline_kind: PJ_INLINE_NONE,
            addr: 0x2000,
        };
        let both = pj_inline_bit(PJ_INLINE_RSEQ_CPU_ID) | pj_inline_bit(PJ_INLINE_COUNTER_CLOCK);
        assert!(validate_inline_kinds(&[cpu, clock, call], "x", both).is_ok());
        // A backend that does not announce a kind refuses it, naming the helper.
        let e = validate_inline_kinds(&[call, clock], "arm64", pj_inline_bit(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(
            e.message
                .starts_with("helper id 5: inline kind 2 is not supported by the arm64 backend"),
            "{e}"
        );
        let odd = HelperEntry {
            inline_kind: 40,
            ..call
        };
        assert!(validate_inline_kinds(&[odd], "x", u32::MAX).is_err());
        let null_clock = HelperEntry { addr: 0, ..clock };
        assert_eq!(
            validate_inline_kinds(&[null_clock], "x", both)
                .unwrap_err()
                .kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            helper_code(&cpu),
            HelperCode::Inline(InlineHelper::RseqCpuId { offset: -0x70 })
        );
        assert_eq!(
            helper_code(&clock),
            HelperCode::Inline(InlineHelper::CounterClock { scale: 0x1000 })
        );
        assert_eq!(helper_code(&call), HelperCode::Call(0x2000));
    }

    #[test]
    fn request_validation_names_the_bits() {
        let req = CompileRequest {
            code: &[],
            helpers: &[],
            features: 0b100,
            flags: 0,
            blind_key: 0,
        };
        let e = validate_request(&req, "arm64", 1).unwrap_err();
        assert_eq!(e.message, "unknown arm64 feature bits 0x4 (supported: 0x1)");
        let e = validate_request(
            &CompileRequest {
                features: 0,
                flags: 1 << 7,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap_err();
        assert!(e.message.starts_with("unknown compile flags 0x80"), "{e}");
        let m = validate_request(
            &CompileRequest {
                features: 1,
                flags: PJ_COMPILE_SANDBOX | PJ_COMPILE_BLIND_CONSTANTS,
                blind_key: 9,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap();
        assert!(m.sandboxed() && !m.counts_budget());
        assert_eq!(m.blind_key, Some(9));
        // The per-CPU mov opt-in needs the table entry it reads.
        let e = validate_request(
            &CompileRequest {
                flags: PJ_COMPILE_PERCPU_INSN,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("PJ_COMPILE_PERCPU_INSN"), "{e}");
        let table = [HelperEntry {
            id: PJ_HELPER_PERCPU_OFFSET,
            inline_kind: 0,
            addr: 0x1000,
        }];
        validate_request(
            &CompileRequest {
                flags: PJ_COMPILE_PERCPU_INSN,
                features: 0,
                helpers: &table,
                ..req
            },
            "arm64",
            1,
        )
        .unwrap();
        // A table entry claiming an inline kind, or NULL, is refused.
        for bad in [
            HelperEntry {
                inline_kind: PJ_INLINE_PERCPU_LOOKUP,
                ..table[0]
            },
            HelperEntry {
                addr: 0,
                ..table[0]
            },
        ] {
            assert!(validate_inline_kinds(&[bad], "arm64", u32::MAX).is_err());
        }
    }
}
