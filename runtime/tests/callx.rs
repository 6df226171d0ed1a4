//! `callx` on the host's backend (natively on x86-64, under qemu-user in the cross runs):
//! with enough helpers of dense ids the site dispatches through a table in the code image
//! (`packjit_frontend::analysis::callx_plan`), with holes, ids past the table and ids with
//! upper bits set all stopping as unknown; the built-in CPU id (id 8) stays inlined.

mod host;

use packjit::{LoadOptions, Stop};
use packjit_frontend::encode_insn as insn;

macro_rules! helpers {
    ($($name:ident = $id:literal),* $(,)?) => {
        $(
            unsafe extern "C" fn $name(r1: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
                $id * 1000 + r1
            }
        )*
        const HELPERS: &[(u32, packjit_plugin_api::PjHelperFn)] = &[$(($id, $name)),*];
    };
}

// Ids 20..=31 with holes at 23 and 27: ten called helpers, dense enough for a table.
helpers!(
    h20 = 20,
    h21 = 21,
    h22 = 22,
    h24 = 24,
    h25 = 25,
    h26 = 26,
    h28 = 28,
    h29 = 29,
    h30 = 30,
    h31 = 31
);

/// r1 = 7; r6 = id (64-bit); callx r6 (at pc 4); exit.
fn callx_program(id: u64) -> Vec<u8> {
    [
        insn(0xb7, 1, 0, 0, 7),
        insn(0x18, 6, 0, 0, id as u32 as i32),
        insn(0, 0, 0, 0, (id >> 32) as u32 as i32),
        insn(0xb7, 0, 0, 0, 0),
        insn(0x8d, 6, 0, 0, 0),
        insn(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn callx_through_a_dense_table_calls_each_helper_and_stops_on_every_other_id() {
    let rt = host::host_runtime();
    for &(id, f) in HELPERS {
        rt.register_helper(id, &format!("h{id}"), f).unwrap();
    }
    let opts = LoadOptions::default();
    for &(id, _) in HELPERS {
        let p = rt.load(&callx_program(id as u64), &opts).unwrap();
        assert_eq!(
            p.call(&mut []).unwrap(),
            id as u64 * 1000 + 7,
            "helper {id}"
        );
    }
    // The built-in CPU id, inlined, is matched before the table.
    let p = rt.load(&callx_program(8), &opts).unwrap();
    assert!(p.call(&mut []).unwrap() < 4096, "a CPU id");
    for id in [23u64, 27, 32, 19, 0, 1000, u64::MAX, 0x1_0000_0014] {
        let p = rt.load(&callx_program(id), &opts).unwrap();
        let e = p.call(&mut []).unwrap_err();
        assert_eq!(
            e.stop(),
            Some(Stop::UnknownCallx { pc: 4, id }),
            "id {id:#x}: {e}"
        );
    }
    // The table makes the site shorter than a compare and an address per helper, which is
    // what the same helpers get at sparse ids (too sparse for a table).
    let sparse = host::host_runtime();
    for &(id, f) in HELPERS {
        sparse
            .register_helper(id * 100, &format!("h{id}"), f)
            .unwrap();
    }
    let q = sparse.load(&callx_program(2000), &opts).unwrap();
    assert_eq!(q.call(&mut []).unwrap(), 20 * 1000 + 7);
    let p = rt.load(&callx_program(20), &opts).unwrap();
    assert!(
        p.native_insns() + 2 * HELPERS.len() < q.native_insns(),
        "table {} vs compares {} native instructions",
        p.native_insns(),
        q.native_insns()
    );
}

/// r1-r5 = distinct non-zero values; a call (helper 20, or `callx` of it); r0 = r1 | r2 |
/// r3 | r4 | r5: what the program sees of the argument registers after the call.
fn or_of_arguments_after(call: [u8; 8]) -> Vec<u8> {
    let mut code: Vec<[u8; 8]> = (1..=5u8).map(|r| insn(0xb7, r, 0, 0, 0x100 << r)).collect();
    code.push(insn(0xb7, 6, 0, 0, 20));
    code.push(call);
    code.push(insn(0xbf, 0, 1, 0, 0));
    for r in 2..=5 {
        code.push(insn(0x4f, 0, r, 0, 0));
    }
    code.push(insn(0x95, 0, 0, 0, 0));
    code.concat()
}

#[test]
fn sandboxed_code_reading_an_argument_register_after_a_call_is_refused_naming_pc_and_register() {
    let rt = host::host_runtime();
    rt.register_helper(20, "h20", h20).unwrap();
    // call 20 (pc 6), then callx r6 (= 20); pc 7 reads r1.
    for call in [insn(0x85, 0, 0, 0, 20), insn(0x8d, 6, 0, 0, 0)] {
        let code = or_of_arguments_after(call);
        let e = rt.load(&code, &LoadOptions::default()).unwrap_err();
        assert_eq!(e.pc, Some(7), "{e}");
        assert!(e.to_string().contains("r1 is read after a call"), "{e}");
        // Trusted code is left as the helper left the registers (RFC 9669: undefined); it
        // loads and runs.
        // SAFETY: the program touches no memory.
        let trusted = unsafe { rt.load_trusted(&code, &LoadOptions::default()) }.unwrap();
        if trusted.is_executable() {
            trusted.call(&mut []).unwrap();
        }
    }
}

/// r1-r5 = distinct non-zero values; helper 20 twice: the second gets whatever the first
/// left in r1 (no program read in between, so the load is accepted).
fn helper_after_helper() -> Vec<u8> {
    let mut code: Vec<[u8; 8]> = (1..=5u8).map(|r| insn(0xb7, r, 0, 0, 0x100 << r)).collect();
    code.push(insn(0x85, 0, 0, 0, 20));
    code.push(insn(0x85, 0, 0, 0, 20));
    code.push(insn(0x95, 0, 0, 0, 0));
    code.concat()
}

#[test]
fn a_helper_after_a_helper_sees_no_argument_register_the_first_left_in_sandboxed_code() {
    let rt = host::host_runtime();
    rt.register_helper(20, "h20", h20).unwrap();
    let sandboxed = rt
        .load(&helper_after_helper(), &LoadOptions::default())
        .unwrap();
    if sandboxed.is_executable() {
        // h20 returns 20000 + r1: the first call's r1 was cleared before the second.
        assert_eq!(sandboxed.call(&mut []).unwrap(), 20_000);
    }
}
