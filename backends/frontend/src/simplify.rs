//! Rewrites of a verified program that every backend lowers to shorter code, applied once
//! here for all of them. The reference evaluator runs programs as [`decode`](crate::decode)
//! returns them, without these rewrites, so the differential tests check each one.

use crate::analysis::{constant_array_keys, helper_lowering, HelperLowering};
use crate::{
    op_kind, verify::decode_with, Branch, BranchKind, Compared, DecodeOptions, Op, Operand,
    Program, Width,
};
use packjit_plugin_api::{
    CompileError, CompileRequest, ErrorKind, HelperEntry, PjLookupValue, PjLookupValues,
    PjMemRegion, PjStaticRegions, PJ_COMPILE_SANDBOX, PJ_HELPER_LOOKUP_VALUES,
    PJ_HELPER_STATIC_REGIONS, PJ_REGION_WRITABLE, PJ_STATIC_REGIONS_MAX,
};

/// Decodes and verifies a request's code (with the encodings its flags opt into), then
/// applies the rewrites below: the program a backend lowers. A sandboxed request's static
/// regions come along ([`Program::static_regions`]).
pub fn decode_for_lowering(req: &CompileRequest<'_>) -> Result<Program, CompileError> {
    let mut prog = decode_with(req.code, req.helpers, DecodeOptions::from_flags(req.flags))?;
    fold_branches_over_jumps(&mut prog);
    if req.flags & PJ_COMPILE_SANDBOX != 0 {
        prog.static_regions = static_regions(req.helpers)?;
        prog.lookup_values = lookup_values(&prog, req.helpers)?;
    }
    prog.call_results = folded_lookups(&prog, req.helpers);
    decide_folded_result_tests(&mut prog);
    prog.expanded_calls = inlined_tail_calls(&prog, req.helpers);
    Ok(prog)
}

/// The inlined prog-array tail calls (`lower::prog_array_tail_call`, in any function) with
/// the registers their expansion reads: the index r3, or nothing when straight-line code
/// just set it to a constant (`lower::known_index`); the context and the array (r1, r2)
/// come from `env` and the compile-time array. (A tail call through a chooser reads r1-r3
/// as a call does.)
fn inlined_tail_calls(prog: &Program, helpers: &[HelperEntry]) -> Vec<(usize, u16)> {
    let inlined = |id: u32| {
        helpers.iter().any(|h| {
            h.id == id && matches!(helper_lowering(h), HelperLowering::ProgArrayTailCall(_))
        })
    };
    if !helpers.iter().any(|h| inlined(h.id)) {
        return Vec::new();
    }
    let mut calls = Vec::new();
    for (k, f) in prog.subprogs.iter().enumerate() {
        for at in f.start..f.end {
            if matches!(prog.insts[at].op, Op::CallHelper { id } if inlined(id)) {
                let index_known = crate::lower::known_index(prog, k, at).is_some();
                calls.push((at, if index_known { 0 } else { 1 << 3 }));
            }
        }
    }
    calls
}

/// The array lookups whose key the program stores as a constant (the driver folds them,
/// `lower::array_lookup`), with their results: per-CPU arrays excluded (the element
/// depends on the CPU).
fn folded_lookups(prog: &Program, helpers: &[HelperEntry]) -> Vec<(usize, u64)> {
    let lookup = |id: u32| {
        let h = helpers.iter().find(|h| h.id == id)?;
        match helper_lowering(h) {
            HelperLowering::ArrayLookup(a) if a.percpu_id.is_none() => Some(a),
            _ => None,
        }
    };
    if !helpers.iter().any(|h| lookup(h.id).is_some()) {
        return Vec::new();
    }
    constant_array_keys(prog, |id| lookup(id).is_some())
        .into_iter()
        .filter_map(|(at, key)| match prog.insts[at].op {
            Op::CallHelper { id } => Some((at, lookup(id)?.element(key))),
            _ => None,
        })
        .collect()
}

/// The test of a folded lookup's result that follows it (`if r0 == 0 goto out`, on r0 or
/// a copy of it), decided at compile time: the driver emits the element's address or 0 as
/// a constant ([`Program::call_results`]), so the comparison's outcome is known. A test
/// that cannot be taken becomes a jump to the next instruction (no code), one that is
/// always taken a `goto`; clang's `u32 key = 0; v = lookup(&map, &key); if (!v) return 0;`
/// then costs what a load of a global costs, as the kernel's verifier makes it for array
/// lookups with a constant key in bounds.
///
/// Only in the straight-line code right after the call (no jump lands in between, so the
/// register holds the constant on every path), and only forward jumps: no back-edge
/// changes, so the budget's charges stay where they were.
fn decide_folded_result_tests(prog: &mut Program) {
    let mut decided = false;
    for k in 0..prog.call_results.len() {
        let (at, value) = prog.call_results[k];
        let end = prog.subprogs[prog.subprog_of(at)].end;
        // The registers holding the call's result (bit n = rn).
        let mut holding: u16 = 1;
        let mut i = at + 1;
        while i < end && !prog.is_target[i] && holding != 0 {
            match prog.insts[i].op {
                Op::Jcond {
                    width,
                    cond,
                    dst,
                    src: Operand::Imm(imm),
                    target,
                } if holding & (1 << dst) != 0 && target as usize > i => {
                    let (a, b) = match width {
                        Width::W64 => (value, imm as i64 as u64),
                        Width::W32 => (value as u32 as u64, imm as u32 as u64),
                    };
                    let to = if cond.eval(width, a, b) {
                        target
                    } else {
                        i as u32 + 1
                    };
                    prog.insts[i].op = Op::Ja { target: to };
                    let b = prog
                        .branches
                        .binary_search_by_key(&(i as u32), |b| b.at)
                        .expect("every conditional jump is listed");
                    prog.branches[b] = Branch {
                        at: i as u32,
                        target: to,
                        kind: BranchKind::Ja,
                        compared: Compared::Nothing,
                    };
                    let f = prog.subprog_of(i);
                    prog.subprogs[f].ops |= op_kind::JA;
                    decided = true;
                    break;
                }
                _ if prog.kind(i) & op_kind::STRAIGHT_LINE_END != 0 => break,
                _ => holding = prog.copies_after(i, holding),
            }
            i += 1;
        }
    }
    if decided {
        let branches = std::mem::take(&mut prog.branches);
        recompute_targets(prog, &branches);
        prog.branches = branches;
    }
}

/// The regions of the request's [`PJ_HELPER_STATIC_REGIONS`] entry, if it has one.
fn static_regions(helpers: &[HelperEntry]) -> Result<Vec<PjMemRegion>, CompileError> {
    let Some(entry) = helpers.iter().find(|h| h.id == PJ_HELPER_STATIC_REGIONS) else {
        return Ok(Vec::new());
    };
    let bad = |what: String| {
        CompileError::new(
            ErrorKind::InvalidArgument,
            format!("static-region table (helper id {PJ_HELPER_STATIC_REGIONS:#x}): {what}"),
        )
    };
    if entry.addr == 0 || entry.addr % 8 != 0 {
        return Err(bad(format!("address {:#x} is not a table", entry.addr)));
    }
    // SAFETY: the entry's contract (`PJ_HELPER_STATIC_REGIONS`): `addr` points to a live
    // `PjStaticRegions` header followed by `count` regions, unchanged while this compiles;
    // the address was checked for NULL and alignment above.
    let count = unsafe { (entry.addr as *const PjStaticRegions).read() }.count;
    if count > PJ_STATIC_REGIONS_MAX {
        return Err(bad(format!(
            "{count} regions, more than {PJ_STATIC_REGIONS_MAX}"
        )));
    }
    let first =
        (entry.addr as usize + std::mem::size_of::<PjStaticRegions>()) as *const PjMemRegion;
    // SAFETY: as above: `count` regions follow the header, and `count` is bounded.
    let regions = unsafe { std::slice::from_raw_parts(first, count as usize) }.to_vec();
    for (k, r) in regions.iter().enumerate() {
        if r.start.checked_add(r.len).is_none() {
            return Err(bad(format!(
                "region {k} ({:#x}, {} bytes) wraps the address space",
                r.start, r.len
            )));
        }
    }
    Ok(regions)
}

/// The lookup sites of the request's [`PJ_HELPER_LOOKUP_VALUES`] entry, if it has one, by
/// instruction index. A record must name a helper call: anything else is a host error.
fn lookup_values(
    prog: &Program,
    helpers: &[HelperEntry],
) -> Result<Vec<crate::ranges::LookupValue>, CompileError> {
    let Some(entry) = helpers.iter().find(|h| h.id == PJ_HELPER_LOOKUP_VALUES) else {
        return Ok(Vec::new());
    };
    let bad = |what: String| {
        CompileError::new(
            ErrorKind::InvalidArgument,
            format!("lookup-value table (helper id {PJ_HELPER_LOOKUP_VALUES:#x}): {what}"),
        )
    };
    if entry.addr == 0 || entry.addr % 8 != 0 {
        return Err(bad(format!("address {:#x} is not a table", entry.addr)));
    }
    // SAFETY: the entry's contract (`PJ_HELPER_LOOKUP_VALUES`): `addr` points to a live
    // `PjLookupValues` header followed by `count` records, unchanged while this compiles;
    // the address was checked for NULL and alignment above.
    let count = unsafe { (entry.addr as *const PjLookupValues).read() }.count;
    if count > prog.insts.len() as u64 {
        return Err(bad(format!(
            "{count} records, more than the program's {} instructions",
            prog.insts.len()
        )));
    }
    let first =
        (entry.addr as usize + std::mem::size_of::<PjLookupValues>()) as *const PjLookupValue;
    // SAFETY: as above: `count` records follow the header, and `count` is bounded.
    let records = unsafe { std::slice::from_raw_parts(first, count as usize) };
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let at = prog
            .insts
            .binary_search_by_key(&(r.pc as usize), |inst| inst.pc as usize)
            .ok()
            .filter(|&i| matches!(prog.insts[i].op, Op::CallHelper { .. }))
            .ok_or_else(|| bad(format!("pc {} is not a helper call", r.pc)))?;
        out.push(crate::ranges::LookupValue {
            at: at as u32,
            value_size: r.value_size,
            writable: r.flags & PJ_REGION_WRITABLE != 0,
        });
    }
    out.sort_unstable_by_key(|v| v.at);
    out.dedup_by_key(|v| v.at);
    Ok(out)
}

/// `if c goto L; goto T; L:` becomes `if !c goto T; goto L`, and a jump to the next
/// instruction lowers to nothing: one branch where there were two. Compilers emit the pair
/// for an `if` whose body is far away; so do hand-written tests. `if c goto L; exit; L:` is
/// the same pair with `T` the function's last instruction, when that is an `exit`: any
/// `exit` of a function returns the same r0, so first every forward jump to an `exit` goes
/// straight to the last one (which also saves a hop where an early `exit` is itself a
/// jump to the epilogue).
///
/// Only where it cannot change what anything else sees:
/// * the `goto` (or `exit`) is not a jump target (nothing else reaches it);
/// * every jump that moves still jumps forward, so no back-edge moves and the budget
///   charges (at back-edges, by pc distance) stay as they are;
/// * `c` has a negation (`jset` has none).
pub fn fold_branches_over_jumps(prog: &mut Program) {
    // Only the branch list is read (see `Branch`); instructions are written where they
    // change.
    let mut branches = std::mem::take(&mut prog.branches);
    let is_exit = |prog: &Program, i: usize| prog.exits.binary_search(&(i as u32)).is_ok();
    let last_exit_of = |prog: &Program, i: usize| {
        let end = prog.subprogs[prog.subprog_of(i)].end;
        is_exit(prog, end - 1).then_some(end - 1)
    };
    let mut moved = false;
    for b in branches.iter_mut() {
        let (i, target) = (b.at as usize, b.target as usize);
        if b.kind == BranchKind::CallLocal || target <= i || !is_exit(prog, target) {
            continue;
        }
        if let Some(last) = last_exit_of(prog, i).filter(|&last| target < last) {
            if let Op::Ja { target } | Op::Jcond { target, .. } = &mut prog.insts[i].op {
                *target = last as u32;
            }
            b.target = last as u32;
            moved = true;
        }
    }
    if moved {
        recompute_targets(prog, &branches);
    }
    // The list stays complete: an `exit` that becomes a `goto` joins it (sorted in after).
    // The exits list is brought up to date after the loop: an exit it converts is at an
    // index the loop asks about no more (it only looks ahead by one, and never converts a
    // function's last exit).
    let mut new_gotos = Vec::new();
    for k in 0..branches.len() {
        let b = branches[k];
        let i = b.at as usize;
        if b.kind != BranchKind::Jcond || b.target as usize != i + 2 || prog.is_target[i + 1] {
            continue;
        }
        // A `goto` at i + 1 is the next branch listed; an `exit` is in the exits list.
        let (far, was_exit) = match branches.get(k + 1).filter(|n| n.at as usize == i + 1) {
            Some(next) if next.kind == BranchKind::Ja => (next.target as usize, false),
            Some(_) => continue,
            None if is_exit(prog, i + 1) => match last_exit_of(prog, i) {
                Some(e) => (e, true),
                None => continue,
            },
            None => continue,
        };
        let Op::Jcond { cond, .. } = prog.insts[i].op else {
            unreachable!("listed as a conditional jump")
        };
        let Some(negated) = cond.negated() else {
            continue;
        };
        if far <= i + 2 {
            continue;
        }
        if let Op::Jcond { cond, target, .. } = &mut prog.insts[i].op {
            *cond = negated;
            *target = far as u32;
        }
        branches[k].target = far as u32;
        prog.insts[i + 1].op = Op::Ja { target: b.at + 2 };
        let goto = Branch {
            at: b.at + 1,
            target: b.at + 2,
            kind: BranchKind::Ja,
            compared: Compared::Nothing,
        };
        if was_exit {
            new_gotos.push(goto);
            let k = prog.subprog_of(i);
            prog.subprogs[k].ops |= op_kind::JA;
        } else {
            branches[k + 1] = goto;
        }
        // `L` stays a target (of the new `goto`); `T` was one, or is a last `exit`.
        prog.is_target[far] = true;
    }
    if !new_gotos.is_empty() {
        prog.exits
            .retain(|&e| new_gotos.binary_search_by_key(&e, |g| g.at).is_err());
        branches.extend(new_gotos);
        branches.sort_unstable_by_key(|b| b.at);
    }
    prog.branches = branches;
}

/// `is_target` from the jumps and calls, as the verifier first computes it.
fn recompute_targets(prog: &mut Program, branches: &[Branch]) {
    prog.is_target.fill(false);
    for b in branches {
        prog.is_target[b.target as usize] = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_insn as i, Cond};

    fn folded(insns: &[[u8; 8]]) -> Program {
        let mut prog = crate::decode(&insns.concat(), &[]).expect("valid program");
        fold_branches_over_jumps(&mut prog);
        prog
    }

    fn jcond(prog: &Program, k: usize) -> (Cond, u32) {
        match prog.insts[k].op {
            Op::Jcond { cond, target, .. } => (cond, target),
            ref op => panic!("instruction {k} is {op:?}"),
        }
    }

    #[test]
    fn a_branch_over_a_forward_jump_becomes_one_negated_branch() {
        let exit = i(0x95, 0, 0, 0, 0);
        let p = folded(&[
            i(0xb7, 0, 0, 0, 0), // 0: r0 = 0
            i(0x2d, 1, 2, 1, 0), // 1: if r1 > r2 goto 3
            i(0x05, 0, 0, 2, 0), // 2: goto 5
            i(0xb7, 0, 0, 0, 1), // 3: r0 = 1
            i(0x55, 1, 0, 1, 7), // 4: if r1 != 7 goto 6
            exit,                // 5: exit (a target: goes to the last exit first)
            i(0xb7, 0, 0, 0, 2), // 6: r0 = 2
            exit,                // 7
        ]);
        // The jump's target, an exit, became the last exit first.
        assert_eq!(jcond(&p, 1), (Cond::Le, 7), "negated, to the jump's target");
        assert_eq!(
            p.insts[2].op,
            Op::Ja { target: 3 },
            "the jump now goes nowhere"
        );
        assert_eq!(
            jcond(&p, 4),
            (Cond::Eq, 7),
            "over an exit: to the last exit"
        );
        assert_eq!(p.insts[5].op, Op::Ja { target: 6 });
        assert!(!p.is_target[2] && p.is_target[3] && p.is_target[6] && p.is_target[7]);
        assert!(!p.is_target[5], "nothing jumps to the early exit any more");
        let at: Vec<u32> = p.branches.iter().map(|b| b.at).collect();
        assert_eq!(at, [1, 2, 4, 5], "the new goto is listed");
        assert_eq!(p.exits, [7], "the early exit became a goto");
    }

    #[test]
    fn what_would_change_budgets_or_other_paths_stays() {
        let exit = i(0x95, 0, 0, 0, 0);
        let code = [
            i(0xb7, 0, 0, 0, 0),  // 0: r0 = 0
            i(0x45, 1, 0, 1, 1),  // 1: if r1 & 1 goto 3   (jset: no negation)
            i(0x05, 0, 0, 3, 0),  // 2: goto 6
            i(0x15, 1, 0, 1, 0),  // 3: if r1 == 0 goto 5
            i(0x05, 0, 0, -5, 0), // 4: goto 0            (backward: a budget back-edge)
            i(0x15, 1, 0, 1, 2),  // 5: if r1 == 2 goto 7
            i(0x05, 0, 0, 1, 0),  // 6: goto 8            (a target of 2)
            i(0xb7, 0, 0, 0, 1),  // 7: r0 = 1
            exit,                 // 8
        ];
        let p = folded(&code);
        let plain = crate::decode(&code.concat(), &[]).unwrap();
        assert_eq!(p, plain);
    }
}
