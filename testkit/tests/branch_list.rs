//! The front end's branch and exit lists (`Program::branches`, `Program::exits`) are what
//! the passes after decoding read instead of the instructions, so they must say exactly what
//! the instructions say: after decoding, and after the rewrites for lowering (which retarget
//! jumps and turn exits into gotos). Checked over the conformance corpus and the generators'
//! programs (seeds printed on failure).

use packjit_frontend::{Branch, BranchKind, Op, Program};
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
            }),
            Op::Jcond { target, .. } => branches.push(Branch {
                at,
                target,
                kind: BranchKind::Jcond,
            }),
            Op::CallLocal { target } => branches.push(Branch {
                at,
                target,
                kind: BranchKind::CallLocal,
            }),
            Op::Exit => exits.push(at),
            _ => {}
        }
    }
    (branches, exits)
}

/// Checks the lists of `code` when it decodes (with the helpers generated programs call);
/// returns whether it did.
fn check(name: &str, code: &[u8]) -> bool {
    let helpers = packjit_testkit::fuzz::fuzz_helpers();
    let Ok(plain) = packjit_frontend::decode(code, &helpers) else {
        return false;
    };
    let (branches, exits) = scanned(&plain);
    assert_eq!(plain.branches, branches, "{name}: branches after decoding");
    assert_eq!(plain.exits, exits, "{name}: exits after decoding");
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
