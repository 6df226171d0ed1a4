//! Untrusted code ends on its own: a sandboxed load gets `DEFAULT_BUDGET` instructions per
//! call unless the host opts out (`Budget::Unlimited`) or sets its own, on the host's backend
//! (natively on x86-64, under qemu-user in the cross runs).

mod host;

use packjit::{Budget, LoadOptions, Stop};
use packjit_frontend::encode_insn;

/// `r0 += 1; goto -2` for ever (pc 1 jumps back to pc 0).
fn spin() -> Vec<u8> {
    [
        encode_insn(0x07, 0, 0, 0, 1),
        encode_insn(0x05, 0, 0, -2, 0),
        encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

/// A loop of `n` iterations, then r0 = n.
fn count_to(n: i32) -> Vec<u8> {
    [
        encode_insn(0x07, 0, 0, 0, 1),
        encode_insn(0xa5, 0, 0, -2, n), // if r0 < n goto pc 0
        encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn a_sandboxed_spin_stops_with_the_default_budget_naming_its_pc() {
    let rt = host::host_runtime();
    let p = rt.load(&spin(), &LoadOptions::default()).unwrap();
    match p.call(&mut []) {
        Err(e) => assert_eq!(e.stop(), Some(Stop::Budget { pc: 1 }), "{e}"),
        Ok(r0) => panic!("a spin returned {r0}"),
    }
    // The default is large enough for real work.
    assert!(
        p.call(&mut []).is_err(),
        "every call gets its own budget and uses it up"
    );
    let q = rt
        .load(&count_to(1_000_000), &LoadOptions::default())
        .unwrap();
    assert_eq!(q.call(&mut []).unwrap(), 1_000_000);
}

#[test]
fn the_host_sets_its_own_budget_or_opts_out() {
    let rt = host::host_runtime();
    let limited = LoadOptions {
        budget: Budget::Limit(100),
        ..Default::default()
    };
    let p = rt.load(&count_to(1000), &limited).unwrap();
    assert!(matches!(
        p.call(&mut []).unwrap_err().stop(),
        Some(Stop::Budget { .. })
    ));
    // Opted out: no counting compiled in, the same loop runs to its end.
    let unlimited = LoadOptions {
        budget: Budget::Unlimited,
        ..Default::default()
    };
    let p = rt.load(&count_to(1000), &unlimited).unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 1000);
    let counted = rt.load(&count_to(1000), &LoadOptions::default()).unwrap();
    assert!(
        p.code_size() < counted.code_size(),
        "no budget code when opted out: {} vs {}",
        p.code_size(),
        counted.code_size()
    );
    // Trusted code counts nothing by default (its loader vouched for it).
    // SAFETY: the loop touches no memory.
    let t = unsafe { rt.load_trusted(&count_to(1000), &LoadOptions::default()) }.unwrap();
    assert_eq!(t.call(&mut []).unwrap(), 1000);
}

/// A loop whose back-edge spans `body` instructions (`r0 += 1`, `body - 2` fillers, the
/// back-edge at pc `body - 1`) and runs `n` times: a conditional back-edge charging `body`,
/// or (`goto`) an exit test then an unconditional back-edge charging `body + 1`.
fn wide_loop(body: usize, n: i32, goto: bool) -> Vec<u8> {
    let mut code = vec![encode_insn(0x07, 0, 0, 0, 1)];
    code.extend((0..body - 2).map(|_| encode_insn(0x07, 2, 0, 0, 1)));
    if goto {
        code.push(encode_insn(0x35, 0, 0, 1, n)); // if r0 >= n goto exit
        code.push(encode_insn(0x05, 0, 0, -(body as i16) - 1, 0));
    } else {
        code.push(encode_insn(0xa5, 0, 0, -(body as i16), n)); // if r0 < n goto pc 0
    }
    code.push(encode_insn(0x95, 0, 0, 0, 0));
    code.concat()
}

/// Back-edges pay their charge on every arch whatever its size: one charge below the
/// backends' short immediates (RV64's 12-bit `sltiu`, arm64's imm12) and ones above them
/// (3000 instructions), conditional and `goto`, each with exactly enough budget (the run
/// ends) and one unit less (the last back-edge stops, at its own pc).
#[test]
fn back_edges_of_every_size_charge_exactly() {
    let rt = host::host_runtime();
    for body in [4usize, 3000] {
        for goto in [false, true] {
            let n = 3;
            let charge = if goto { body + 1 } else { body } as u64;
            let back_edge = if goto { body } else { body - 1 };
            let code = wide_loop(body, n, goto);
            let load = |budget: u64| {
                let opts = LoadOptions {
                    budget: Budget::Limit(budget),
                    ..Default::default()
                };
                rt.load(&code, &opts).unwrap()
            };
            let exact = 2 * charge;
            assert_eq!(
                load(exact).call(&mut []),
                Ok(n as u64),
                "body {body}, goto {goto}"
            );
            let short = load(exact - 1).call(&mut []).unwrap_err();
            assert_eq!(
                short.stop(),
                Some(Stop::Budget { pc: back_edge }),
                "body {body}, goto {goto}: {short}"
            );
        }
    }
}

extern "C" fn plus_one(r1: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    r1.wrapping_add(1)
}

/// A loop of four rounds, each calling a function that loops `r7` times and a helper; with
/// `stack`, the function also stores to its frame (a program with and without a stack
/// block: backends lay out their frames, and may keep the count, differently for each).
fn calls_and_loops(helper: u32, stack: bool) -> Vec<u8> {
    let i = encode_insn;
    let mut code = vec![
        i(0xb7, 6, 0, 0, 0),             // 0: r6 = 0
        i(0xb7, 7, 0, 0, 4),             // 1: r7 = 4
        i(0xbf, 1, 7, 0, 0),             // 2: r1 = r7
        i(0x85, 0, 1, 0, 8),             // 3: call f (pc 12)
        i(0x0f, 6, 0, 0, 0),             // 4: r6 += r0
        i(0xbf, 1, 6, 0, 0),             // 5: r1 = r6
        i(0x85, 0, 0, 0, helper as i32), // 6: r0 = plus_one(r1)
        i(0xbf, 6, 0, 0, 0),             // 7: r6 = r0
        i(0x07, 7, 0, 0, -1),            // 8: r7 -= 1
        i(0x55, 7, 0, -8, 0),            // 9: if r7 != 0 goto 2
        i(0xbf, 0, 6, 0, 0),             // 10: r0 = r6
        i(0x95, 0, 0, 0, 0),             // 11: exit
        i(0xb7, 0, 0, 0, 0),             // 12: f: r0 = 0
        i(0xbf, 2, 1, 0, 0),             // 13: r2 = r1
        i(0x0f, 0, 2, 0, 0),             // 14: r0 += r2
        i(0x07, 2, 0, 0, -1),            // 15: r2 -= 1
        i(0x55, 2, 0, -3, 0),            // 16: if r2 != 0 goto 14
    ];
    if stack {
        code.push(i(0x7b, 10, 0, -8, 0)); // *(u64 *)(r10 - 8) = r0
    }
    code.push(i(0x95, 0, 0, 0, 0));
    code.concat()
}

/// Every budget from 0 to past what the program needs, with and without a stack block,
/// sandboxed and trusted: each run ends as the interpreter's (the same r0, or a budget stop
/// at the same pc). A charge lost across a call or a helper, or a budget read from the
/// wrong place at entry, would move the pc or the result.
#[test]
fn budgets_across_calls_and_helpers_stop_where_the_interpreter_stops() {
    const HELPER: u32 = 0x7001;
    let rt = host::host_runtime();
    rt.register_helper(HELPER, "plus_one", plus_one).unwrap();
    let interp = packjit_interp::Interpreter::new().with_helper(HELPER, plus_one);
    for stack in [false, true] {
        let code = calls_and_loops(HELPER, stack);
        budgets_stop_where_the_interpreter_stops(
            &rt,
            &interp,
            &code,
            90,
            &format!("stack {stack}"),
        );
    }
}

/// Runs `code` sandboxed and trusted with every budget below `budgets` and checks each result
/// (r0, or the stop with its pc) against the interpreter's. The range must cross what the
/// program needs: both outcomes occur.
fn budgets_stop_where_the_interpreter_stops(
    rt: &packjit::Runtime,
    interp: &packjit_interp::Interpreter,
    code: &[u8],
    budgets: u64,
    name: &str,
) {
    let reference = interp.load(code).unwrap();
    let (mut finished, mut stopped) = (0, 0);
    for budget in 0..budgets {
        let want = interp
            .run(&reference, &mut [], Some(budget))
            .map(|o| o.r0)
            .map_err(packjit::RunError::from);
        let opts = LoadOptions {
            budget: Budget::Limit(budget),
            ..Default::default()
        };
        let sandboxed = rt.load(code, &opts).unwrap();
        // SAFETY: the programs touch only their own stack.
        let trusted = unsafe { rt.load_trusted(code, &opts) }.unwrap();
        for (trust, p) in [("sandboxed", &sandboxed), ("trusted", &trusted)] {
            assert_eq!(p.call(&mut []), want, "{name}, budget {budget}, {trust}");
        }
        match want {
            Ok(_) => finished += 1,
            Err(_) => stopped += 1,
        }
    }
    assert!(
        finished > 0 && stopped > 0,
        "{name}: {finished} finished, {stopped} stopped"
    );
}

/// Walks' back-edges (`packjit_frontend::walks`) charge before their test on x86-64 and
/// take the charge back where the loop ends; a borrow is settled by the test out of line.
/// Every budget across a counted walk (`while (j != 0) { a[j] = a[j - 1]; j--; }`) or a
/// walk to r10, each followed by a loop that spends what the walk left, stops where the
/// interpreter stops, or finishes with its result.
#[test]
fn budgets_across_walks_stop_where_the_interpreter_stops() {
    let counted = [
        encode_insn(0xb7, 0, 0, 0, 0),
        encode_insn(0xbf, 6, 10, 0, 0),
        encode_insn(0x07, 6, 0, 0, -64),
        encode_insn(0xb7, 7, 0, 0, 6),
        encode_insn(0x61, 9, 6, -4, 0), // head: r9 = *(u32 *)(r6 - 4)
        encode_insn(0x07, 7, 0, 0, -1),
        encode_insn(0x63, 6, 9, 0, 0),
        encode_insn(0x07, 0, 0, 0, 3),
        encode_insn(0x07, 6, 0, 0, -4),
        encode_insn(0x55, 7, 0, -6, 0), // if r7 != 0 goto head
    ]
    .concat();
    let to_r10 = [
        encode_insn(0xb7, 0, 0, 0, 0),
        encode_insn(0xbf, 3, 10, 0, 0),
        encode_insn(0x07, 3, 0, 0, -64),
        encode_insn(0x7a, 3, 0, 0, 5), // head: *(u64 *)(r3 + 0) = 5
        encode_insn(0x79, 4, 3, 0, 0),
        encode_insn(0x0f, 0, 4, 0, 0),
        encode_insn(0x07, 3, 0, 0, 8),
        encode_insn(0x5d, 3, 10, -5, 0), // if r3 != r10 goto head
    ]
    .concat();
    // After the walk, a loop of its own: what the walk left of the budget decides where it
    // stops.
    let tail = [
        encode_insn(0xb7, 1, 0, 0, 0),
        encode_insn(0x07, 1, 0, 0, 1), // r1 += 1
        encode_insn(0x07, 0, 0, 0, 1),
        encode_insn(0xa5, 1, 0, -3, 4), // if r1 < 4 goto r1 += 1
        encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let rt = host::host_runtime();
    let interp = packjit_interp::Interpreter::new();
    for (name, walk) in [("counted", counted), ("to r10", to_r10)] {
        let code = [walk, tail.clone()].concat();
        let prog = packjit_frontend::decode(&code, &[]).unwrap();
        let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
        assert_eq!(plan.walks.len(), 1, "{name}: the loop is a walk");
        budgets_stop_where_the_interpreter_stops(&rt, &interp, &code, 80, name);
    }
}
