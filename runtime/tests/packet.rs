//! Legacy packet access (`LD_ABS` / `LD_IND`, `packjit_frontend::packet`) on the backend of
//! the arch running the tests (natively, or under qemu-user for arm64 and RV64), trusted and
//! sandboxed, with and without constant blinding, against fixed expectations and against
//! the interpreter: every size, both modes, small, large and wrapping offsets, the index in
//! r0 and in r1-r5, registers kept, out-of-bounds loads stopped at their pc, and bad
//! encodings refused at load with a named error.

mod host;

use host::insn;
use packjit::{LoadOptions, Program, Runtime, Stop, StopKind};
use packjit_interp::Interpreter;

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

/// `LD_ABS` of `size` (0x20 w, 0x28 h, 0x30 b, 0x38 dw) and `LD_IND` (+ 0x20).
const ABS_W: u8 = 0x20;
const ABS_H: u8 = 0x28;
const ABS_B: u8 = 0x30;
const ABS_DW: u8 = 0x38;
const IND: u8 = 0x20;

fn packet() -> Vec<u8> {
    (0..64u8).map(|i| i.wrapping_mul(0x11) ^ 0x5a).collect()
}

fn le(p: &[u8], at: usize, n: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..n].copy_from_slice(&p[at..at + n]);
    u64::from_le_bytes(b)
}

fn prog(insns: &[[u8; 8]]) -> Vec<u8> {
    insns.concat()
}

/// Loads `code` in each mode this test covers: sandboxed, sandboxed and blinded, trusted,
/// trusted and blinded (all with a budget, so a runaway ends).
fn loads(rt: &Runtime, code: &[u8]) -> Vec<(&'static str, Program)> {
    let plain = LoadOptions::default();
    let blinded = LoadOptions {
        blind_constants: true,
        ..Default::default()
    };
    let mut v = vec![
        ("sandboxed", rt.load(code, &plain).unwrap()),
        ("sandboxed+blinded", rt.load(code, &blinded).unwrap()),
    ];
    // SAFETY: the programs of this test read only inside the packet they are given (the
    // out-of-bounds ones are run sandboxed only).
    unsafe {
        v.push(("trusted", rt.load_trusted(code, &plain).unwrap()));
        v.push(("trusted+blinded", rt.load_trusted(code, &blinded).unwrap()));
    }
    v
}

fn interpret(code: &[u8], ctx: &mut [u8]) -> Result<u64, Stop> {
    let p = packjit_frontend::decode(code, &[]).unwrap();
    Interpreter::new().run(&p, ctx, Some(1 << 20)).map(|o| o.r0)
}

/// Runs `code` in every mode and the interpreter on a fresh copy of the packet; all must
/// return `want`.
fn check(rt: &Runtime, what: &str, code: &[u8], want: u64) {
    let mut ctx = packet();
    assert_eq!(interpret(code, &mut ctx), Ok(want), "{what}: interpreter");
    for (mode, p) in loads(rt, code) {
        let mut ctx = packet();
        let got = p
            .call(&mut ctx)
            .unwrap_or_else(|e| panic!("{what} {mode}: {e}"));
        assert_eq!(got, want, "{what} {mode}: {got:#x} != {want:#x}");
    }
}

#[test]
fn every_size_and_mode_loads_little_endian_into_r0() {
    let rt = host::host_runtime();
    let p = packet();
    let sizes = [(ABS_B, 1), (ABS_H, 2), (ABS_W, 4), (ABS_DW, 8)];
    for (opc, n) in sizes {
        for at in [0usize, 3, 64 - n] {
            // r0 is overwritten whole (zero-extended), whatever it held.
            let abs = prog(&[insn(0xb7, 0, 0, 0, -1), insn(opc, 0, 0, 0, at as i32), EXIT]);
            check(&rt, &format!("ldabs {opc:#x} {at}"), &abs, le(&p, at, n));
            // LD_IND: index register + imm, the index in each of r0..r9 (r0 is read before
            // it is overwritten).
            for x in 0..=9u8 {
                let (base, imm) = (at as i32 / 2, at as i32 - at as i32 / 2);
                let ind = prog(&[
                    insn(0xb7, x, 0, 0, base),
                    insn(opc + IND, 0, x, 0, imm),
                    EXIT,
                ]);
                check(
                    &rt,
                    &format!("ldind {:#x} r{x} {at}", opc + IND),
                    &ind,
                    le(&p, at, n),
                );
            }
        }
    }
}

#[test]
fn the_offset_is_a_u32_and_the_index_adds_in_64_bits() {
    let rt = host::host_runtime();
    let p = packet();
    // Index -0x10000 (64-bit) + imm 0x10007 = 7: the large offset takes the register form.
    let wrap = prog(&[
        insn(0xb7, 3, 0, 0, -0x10000),
        insn(ABS_W + IND, 0, 3, 0, 0x10007),
        EXIT,
    ]);
    check(&rt, "ldind wrap", &wrap, le(&p, 7, 4));
    // imm 0xffff_fffc is +4 GiB - 4 (a u32), not -4: index -(2^32) - ... brings it back
    // to 8 only when read as a u32.
    let u32_imm = prog(&[
        insn(0x18, 4, 0, 0, 12),
        insn(0, 0, 0, 0, -1), // r4 = 0xffff_ffff_0000_000c = 12 - 2^32
        insn(ABS_H + IND, 0, 4, 0, -4),
        EXIT,
    ]);
    check(&rt, "ldind u32 imm", &u32_imm, le(&p, 8, 2));
    // Offsets at the edge of the displacement form.
    let mut big = vec![0u8; 0x10010];
    big[0x7fff] = 0xab;
    big[0x8000] = 0xcd;
    big[0x1_0008] = 0xef;
    for (at, want) in [(0x7fff, 0xab), (0x8000, 0xcd), (0x1_0008, 0xef)] {
        let code = prog(&[insn(ABS_B, 0, 0, 0, at), EXIT]);
        for (mode, pr) in loads(&rt, &code) {
            let mut ctx = big.clone();
            assert_eq!(pr.call(&mut ctx).unwrap(), want, "{mode} at {at:#x}");
        }
        let mut ctx = big.clone();
        assert_eq!(interpret(&code, &mut ctx), Ok(want));
    }
}

#[test]
fn r1_to_r9_are_kept_and_the_context_is_r1_at_entry() {
    let rt = host::host_runtime();
    let p = packet();
    // r1 moved away before the load: the load still reads the context. Then r0 = the loaded
    // byte + r1..r9 (each set to a distinct value before the load).
    let value = |r: u64| if r == 9 { 3 } else { r << 12 };
    let mut code = vec![];
    for r in 1..=9u8 {
        code.push(insn(0xb7, r, 0, 0, value(r.into()) as i32));
    }
    code.push(insn(ABS_B + IND, 0, 9, 0, 2));
    for r in 1..=9u8 {
        code.push(insn(0x0f, 0, r, 0, 0));
    }
    code.push(EXIT);
    let want = u64::from(p[5]) + (1..=9u64).map(value).sum::<u64>();
    check(&rt, "registers kept", &prog(&code), want);
    // In a bpf-to-bpf callee too: the context is the entry's r1, not the callee's.
    let callee = prog(&[
        insn(0xb7, 1, 0, 0, 0),
        insn(0x85, 0, 1, 0, 1), // call +1
        EXIT,
        insn(ABS_W, 0, 0, 0, 9),
        EXIT,
    ]);
    check(&rt, "in a callee", &callee, le(&p, 9, 4));
    // A byte swap after the load sees the loaded value (no fusion across the rewrite).
    let swapped = prog(&[insn(ABS_H, 0, 0, 0, 2), insn(0xdc, 0, 0, 0, 16), EXIT]);
    check(
        &rt,
        "be16 after ldabsh",
        &swapped,
        u64::from(u16::from_be_bytes([p[2], p[3]])),
    );
    // In a loop: sum the 16 first bytes with LD_IND.
    let sum = prog(&[
        insn(0xb7, 6, 0, 0, 0),   // r6 = 0 (sum)
        insn(0xb7, 7, 0, 0, 0),   // r7 = 0 (index)
        insn(0x50, 0, 7, 0, 0),   // r0 = packet[r7]
        insn(0x0f, 6, 0, 0, 0),   // r6 += r0
        insn(0x07, 7, 0, 0, 1),   // r7 += 1
        insn(0xa5, 7, 0, -4, 16), // if r7 < 16 goto -4
        insn(0xbf, 0, 6, 0, 0),
        EXIT,
    ]);
    check(
        &rt,
        "loop",
        &sum,
        p[..16].iter().map(|&b| u64::from(b)).sum(),
    );
}

fn stop_of(p: &Program, ctx: &mut [u8]) -> Stop {
    let e = match p.call(ctx) {
        Ok(r0) => panic!("ran to the end: r0 = {r0:#x}"),
        Err(e) => e,
    };
    e.stop().unwrap_or_else(|| panic!("not a stop: {e}"))
}

#[test]
fn out_of_bounds_loads_stop_at_their_pc_in_sandboxed_code() {
    let rt = host::host_runtime();
    let blinded = LoadOptions {
        blind_constants: true,
        ..Default::default()
    };
    let cases: Vec<(Vec<u8>, usize, u64, u32)> = vec![
        // The last byte is in, the 2-byte load there is not.
        (prog(&[insn(ABS_H, 0, 0, 0, 63), EXIT]), 0, 63, 2),
        (prog(&[insn(ABS_DW, 0, 0, 0, 0x39), EXIT]), 0, 0x39, 8),
        (
            prog(&[insn(ABS_B, 0, 0, 0, 0x4000_0000), EXIT]),
            0,
            0x4000_0000,
            1,
        ),
        (prog(&[insn(ABS_W, 0, 0, 0, -1), EXIT]), 0, 0xffff_ffff, 4),
        (
            prog(&[
                insn(0xb7, 1, 0, 0, 5),
                insn(ABS_DW + IND, 0, 1, 0, 0x34),
                EXIT,
            ]),
            1,
            0x39,
            8,
        ),
        // A negative index reads before the context.
        (
            prog(&[insn(0xb7, 2, 0, 0, -8), insn(ABS_B + IND, 0, 2, 0, 4), EXIT]),
            1,
            (-4i64) as u64,
            1,
        ),
    ];
    for (code, pc, off, size) in cases {
        let mut ctx = packet();
        let base = ctx.as_ptr() as u64;
        let want = |s: Stop| match s {
            Stop::OutOfBounds {
                pc: spc,
                addr,
                size: ssize,
                write,
            } => {
                assert_eq!((spc, ssize, write), (pc, size, false), "{s:?}");
                assert_eq!(addr, base.wrapping_add(off), "{s:?}");
            }
            s => panic!("{s:?}"),
        };
        for opts in [LoadOptions::default(), blinded.clone()] {
            let p = rt.load(&code, &opts).unwrap();
            want(stop_of(&p, &mut ctx));
        }
        let pr = packjit_frontend::decode(&code, &[]).unwrap();
        want(Interpreter::new().run(&pr, &mut ctx, None).unwrap_err());
    }
    // No context at all (rbpf's `EbpfVmNoData`): address imm, stopped.
    let p = rt
        .load(
            &prog(&[insn(ABS_DW, 0, 0, 0, 3), EXIT]),
            &LoadOptions::default(),
        )
        .unwrap();
    let s = stop_of(&p, &mut []);
    assert_eq!(s.kind(), StopKind::OutOfBounds);
    assert!(
        matches!(
            s,
            Stop::OutOfBounds {
                pc: 0,
                addr: 3,
                size: 8,
                write: false
            }
        ),
        "{s:?}"
    );
}

#[test]
fn bad_encodings_are_refused_at_load_naming_pc_and_opcode() {
    let rt = host::host_runtime();
    for (code, msg) in [
        (
            prog(&[insn(0xb7, 0, 0, 0, 0), insn(ABS_W, 1, 0, 0, 0), EXIT]),
            "pc 1: ldabsw (opcode 0x20): reserved field dst must be 0, is 1",
        ),
        (
            prog(&[insn(ABS_B, 0, 2, 0, 0), EXIT]),
            "pc 0: ldabsb (opcode 0x30): reserved field src must be 0, is 2",
        ),
        (
            prog(&[insn(ABS_H + IND, 0, 1, 4, 0), EXIT]),
            "pc 0: ldindh (opcode 0x48): reserved field offset must be 0, is 4",
        ),
        (
            prog(&[insn(ABS_DW + IND, 0, 11, 0, 0), EXIT]),
            "pc 0: invalid index (source) register r11",
        ),
        // Other modes of class LD stay unknown.
        (
            prog(&[insn(0x60, 0, 0, 0, 0), EXIT]),
            "pc 0: unknown opcode 0x60",
        ),
        (
            prog(&[insn(0x00, 0, 0, 0, 0), EXIT]),
            "pc 0: unknown opcode 0x00",
        ),
    ] {
        let e = rt.load(&code, &LoadOptions::default()).unwrap_err();
        assert!(e.to_string().contains(msg), "{e} (want {msg})");
        // SAFETY: refused before anything runs.
        let e = unsafe { rt.load_trusted(&code, &LoadOptions::default()) }.unwrap_err();
        assert!(e.to_string().contains(msg), "{e} (want {msg})");
    }
}
