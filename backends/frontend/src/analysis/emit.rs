//! Per-program setup of the emission: a label for each instruction something jumps to, how
//! much the lowering's buffers should hold, and the code-generation switches of the benches.

use super::CodegenMode;
use crate::ranges::AccessPlan;
use crate::Program;

/// One label per instruction for the lowering to jump to, made by `new_label`: a label of
/// its own for each instruction `access` says may be jumped to (the branch and call targets,
/// and where sandboxed code's checked copies rejoin, see [`AccessPlan::jumped_to`]), and for
/// the others `unbound`, a label the lowering never binds (a jump to it fails the final
/// patching loudly).
///
/// Labelling only those matters at scale: an assembler label is a table slot, a bind and a
/// lookup, and most instructions are jumped to by nothing.
pub fn instruction_labels<L: Copy + 'static>(
    prog: &Program,
    access: &AccessPlan,
    unbound: L,
    mut new_label: impl FnMut() -> L,
) -> crate::reuse::Reused<L> {
    // Filled first, then overwritten at the few targets: cheaper than a push per
    // instruction.
    let mut labels = crate::reuse::take(prog.insts.len());
    labels.resize(prog.insts.len(), unbound);
    for (i, label) in labels.iter_mut().enumerate() {
        if access.jumped_to(prog, i) {
            *label = new_label();
        }
    }
    labels
}

/// How much a lowering's buffers should hold for one program, so that each is allocated
/// once: regrowing a buffer copies it, into fresh pages when it is large (page faults were
/// a third of a 1 M-instruction compile). Generous for large programs, whose untouched
/// capacity costs nothing, and small enough for a small program's buffers to come from the
/// allocator's fast per-thread cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmitCapacity {
    /// Code bytes.
    pub code: usize,
    /// Assembler labels: the instructions jumped to (branch and call targets, and when
    /// sandboxed where checked copies rejoin, see [`instruction_labels`]), two per function,
    /// and the sandbox's and the budget's (at most two per instruction).
    pub labels: usize,
    /// Label-relative branch and call sites: the program's branches (some lower to two),
    /// the calls and epilogue jumps per function, and the checks' branches.
    pub branch_sites: usize,
}

impl EmitCapacity {
    /// For `prog` in `mode`, by a backend that emits up to `code_per_insn.0` bytes per
    /// instruction in trusted code and `code_per_insn.1` with checks (sandbox or budget).
    pub fn for_program(prog: &Program, mode: &CodegenMode, code_per_insn: (usize, usize)) -> Self {
        let n = prog.insts.len();
        let functions = prog.subprogs.len();
        let branches = prog.branches.len();
        let checked = mode.sandboxed() || mode.counts_budget();
        let (per_insn, checked_labels, checked_sites) = if checked {
            (code_per_insn.1, 3 * n, 2 * n)
        } else {
            (code_per_insn.0, 0, 0)
        };
        EmitCapacity {
            code: 128 + n * per_insn,
            labels: branches + 2 * functions + checked_labels + 16,
            branch_sites: 2 * branches + 4 * functions + checked_sites + 8,
        }
    }
}

/// Code-generation switches that exist **only for measurement** (the sandbox benches). Each
/// backend takes them through a hidden Rust-only entry point, never from the plugin ABI or
/// the runtime, which always emit with [`EmitOptions::default`]. Turning `spectre_clamp` off
/// makes sandboxed code unsafe under speculation.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmitOptions {
    /// Emit the Spectre-v1 clamp (conditional select/move or mask) after each inline check.
    pub spectre_clamp: bool,
    /// Share one widened check among grouped accesses (`ranges::group_accesses`).
    pub group_checks: bool,
    /// Widen a pass's out-of-reach branches in place where the backend can
    /// (`lower::Pass::regrow`) instead of emitting the code again. Off only to check that
    /// both give the same code.
    pub regrow: bool,
}

impl Default for EmitOptions {
    fn default() -> Self {
        EmitOptions {
            spectre_clamp: true,
            group_checks: true,
            regrow: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::program;

    #[test]
    fn labels_go_on_targets_and_where_checked_copies_rejoin() {
        use crate::encode_insn as i;
        let prog = program(&[
            i(0xb7, 0, 0, 0, 0), // 0: r0 = 0
            i(0x61, 2, 1, 0, 0), // 1: r2 = *(u32 *)(r1 + 0)  } a check group
            i(0x61, 3, 1, 4, 0), // 2: r3 = *(u32 *)(r1 + 4)  }
            i(0x15, 2, 0, 1, 0), // 3: if r2 == 0 goto 5
            i(0x07, 0, 0, 0, 1), // 4: r0 += 1
            i(0x95, 0, 0, 0, 0), // 5: exit
        ]);
        let mut next = 0;
        let mut new_label = || {
            next += 1;
            next
        };
        // Trusted code (no access plan): only the jump target.
        let trusted = AccessPlan::default();
        let labels = instruction_labels(&prog, &trusted, 0, &mut new_label);
        assert_eq!(*labels, [0, 0, 0, 0, 0, 1]);
        // Sandboxed: the group's checked copy rejoins at 3, after its last member.
        let sandboxed = crate::ranges::plan_accesses(&prog, true);
        assert_eq!(
            sandboxed
                .groups
                .iter()
                .map(|g| (g.first, g.last))
                .collect::<Vec<_>>(),
            [(1, 2)]
        );
        let labels = instruction_labels(&prog, &sandboxed, 0, &mut new_label);
        assert_eq!(*labels, [0, 0, 0, 2, 0, 3]);
        let jumped_to: Vec<bool> = (0..6).map(|k| sandboxed.jumped_to(&prog, k)).collect();
        assert_eq!(jumped_to, [false, false, false, true, false, true]);
    }
}
