//! What the passes after decoding read instead of the instructions must say exactly what the
//! instructions say: the branch and exit lists (`Program::branches`, `Program::exits`) and
//! each function's summary (`Subprog`: calls, registers written, stack use, instruction
//! kinds), after decoding and after the rewrites for lowering (which retarget jumps and turn
//! exits into gotos). Checked over the conformance corpus and the generators' programs (the
//! failing program is named).

use packjit_frontend::{op_kind, Branch, BranchKind, Compared, Op, Operand, Program, R10};
use packjit_plugin_api::CompileRequest;
use packjit_testkit::gen;

/// The lists as a scan of the instructions gives them.
fn scanned(prog: &Program) -> (Vec<Branch>, Vec<u32>) {
    let mut branches = Vec::new();
    let mut exits = Vec::new();
    for (i, inst) in prog.insts.iter().enumerate() {
        let at = i as u32;
        match inst.op {
            Op::Ja { target } => branches.push(Branch {
                at,
                target,
                kind: BranchKind::Ja,
                compared: Compared::of(&inst.op),
            }),
            Op::Jcond { target, .. } => branches.push(Branch {
                at,
                target,
                kind: BranchKind::Jcond,
                compared: Compared::of(&inst.op),
            }),
            Op::CallLocal { target } => branches.push(Branch {
                at,
                target,
                kind: BranchKind::CallLocal,
                compared: Compared::of(&inst.op),
            }),
            Op::Exit => exits.push(at),
            _ => {}
        }
    }
    (branches, exits)
}

/// Checks the lists of `code` when it decodes (with the helpers generated programs call);
/// returns whether it did.
/// Whether `op` reads r10, from its operands (the test's own reading, not the front end's).
fn reads_r10(op: &Op) -> bool {
    let reg = |o: Operand| o == Operand::Reg(R10);
    match *op {
        Op::Alu { src, .. } => reg(src),
        Op::MovSx { src, .. } | Op::MovPerCpu { src, .. } => src == R10,
        Op::Load { base, .. } => base == R10,
        Op::Store { base, src, .. } => base == R10 || reg(src),
        Op::Atomic { base, src, .. } => base == R10 || src == R10,
        Op::Jcond { dst, src, .. } => dst == R10 || reg(src),
        Op::CallReg { reg } => reg == R10,
        _ => false,
    }
}

/// Each function's summary against a scan of its instructions.
fn check_summaries(name: &str, prog: &Program) {
    for (k, sp) in prog.subprogs.iter().enumerate() {
        let insts = &prog.insts[sp.start..sp.end];
        let ops = insts.iter().fold(0, |a, i| a | i.op.kind_bit());
        assert_eq!(sp.ops, ops, "{name}: function {k}: instruction kinds");
        let calls = ops & (op_kind::CALLS | op_kind::MOV_PERCPU) != 0;
        assert_eq!(sp.calls, calls, "{name}: function {k}: calls");
        let mut writes = insts
            .iter()
            .filter_map(|i| i.op.written_reg())
            .fold(0u16, |a, r| a | 1 << r);
        if ops & op_kind::CALLS != 0 {
            writes |= 0b11_1111;
        }
        assert_eq!(sp.writes, writes, "{name}: function {k}: registers written");
        let stack = insts.iter().any(|i| reads_r10(&i.op));
        assert_eq!(sp.uses_stack, stack, "{name}: function {k}: stack use");
    }
}

fn check(name: &str, code: &[u8]) -> bool {
    let helpers = packjit_testkit::fuzz::fuzz_helpers();
    let Ok(plain) = packjit_frontend::decode(code, &helpers) else {
        return false;
    };
    let (branches, exits) = scanned(&plain);
    assert_eq!(plain.branches, branches, "{name}: branches after decoding");
    assert_eq!(plain.exits, exits, "{name}: exits after decoding");
    check_summaries(name, &plain);
    let req = CompileRequest {
        code,
        helpers: &helpers,
        features: 0,
        flags: 0,
        blind_key: 0,
    };
    let lowered = packjit_frontend::decode_for_lowering(&req).expect("decoded once already");
    let (branches, exits) = scanned(&lowered);
    assert_eq!(
        lowered.branches, branches,
        "{name}: branches after the rewrites"
    );
    assert_eq!(lowered.exits, exits, "{name}: exits after the rewrites");
    check_summaries(name, &lowered);
    // Every branch target is flagged, and nothing else is.
    let mut targets = vec![false; lowered.insts.len()];
    for b in &lowered.branches {
        targets[b.target as usize] = true;
    }
    assert_eq!(
        lowered.is_target, targets,
        "{name}: jump targets after the rewrites"
    );
    true
}

#[test]
fn branch_and_exit_lists_match_the_instructions() {
    let dir = packjit_testkit::conformance::suite_dir();
    let mut checked = 0;
    for case in packjit_testkit::conformance::load_suite(&dir).expect("conformance suite") {
        if let Ok(code) = &case.program {
            checked += usize::from(check(&case.name, code));
        }
    }
    assert!(checked > 300, "only {checked} conformance programs decoded");
    for seed in 0..400u64 {
        assert!(check(
            &format!("generate({seed})"),
            &gen::generate(seed).encode()
        ));
        assert!(check(
            &format!("generate_escapes({seed})"),
            &gen::generate_escapes(seed).encode()
        ));
        assert!(check(
            &format!("group_program({seed})"),
            &gen::group_program(seed).0
        ));
        assert!(check(
            &format!("walk_program({seed})"),
            &gen::walk_program(seed)
        ));
        assert!(check(
            &format!("ctx_walk_program({seed})"),
            &gen::ctx_walk_program(seed).0
        ));
    }
    for seed in 0..4u64 {
        assert!(check(
            &format!("long_function_program({seed})"),
            &gen::long_function_program(seed)
        ));
    }
    assert!(check(
        "sized_program(100000, 8)",
        &gen::sized_program(100_000, 8)
    ));
}
