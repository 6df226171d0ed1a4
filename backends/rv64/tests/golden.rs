//! Golden disassembly of emitted code (host side, cross objdump), so code quality and
//! encoding choices cannot regress silently. Registers: BPF r0 = x15 (a5), r1–r5 =
//! x10–x14, r6–r9 = x9, x18–x20, r10 = x21; t0–t2 = x5–x7. `c:` marks a 16-bit encoding.
//!
//! Host run only: these checks start binutils, and a child process started from a test that
//! qemu-user emulates can hang for good (qemu 7.2 forking a multithreaded guest; it cost a CI
//! run). The emitted bytes do not depend on where the compiler runs, so the x86-64 host run
//! covers them; the emulated runs execute the code instead.
#![cfg(target_arch = "x86_64")]

mod common;
use common::*;
use packjit_plugin_api::HelperEntry;
use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};

const ALL: u64 = FEATURE_C | FEATURE_ZBA | FEATURE_ZBB;

fn golden(slots: &[[u8; 8]], features: u64, want: &str) {
    let helpers = [HelperEntry {
        id: 7,
        inline_kind: 0,
        addr: 0x0000_3fff_8000_1234,
    }];
    let got = disasm(&compile(&prog(slots), &helpers, features).unwrap());
    let want: Vec<&str> = want
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if got != want {
        panic!(
            "disassembly differs.\n--- got:\n{}\n--- want:\n{}",
            got.join("\n"),
            want.join("\n")
        );
    }
}

#[test]
fn add_imm12_vs_large_immediate() {
    // 100 fits addi's 12 bits; 0x12345 needs lui+addiw into a scratch register.
    golden(
        &[
            ins(0x07, 1, 0, 0, 100),
            ins(0x07, 1, 0, 0, 0x12345),
            ins(0x17, 1, 0, 0, 2048),
            EXIT,
        ],
        0,
        "mv x15,x10
         li x10,0
         add x15,x15,100
         lui x6,0x12
         addw x6,x6,837
         add x15,x15,x6
         add x15,x15,-2048
         ret",
    );
}

#[test]
fn logical_immediates_and_alu32_zero_extension() {
    golden(
        &[
            ins(0x57, 1, 0, 0, 0xff),    // and: andi
            ins(0x47, 1, 0, 0, 0x10000), // or: lui + or
            ins(0xa4, 1, 0, 0, -1),      // xor32: xori; no zero-extension, as the
            ins(0x54, 1, 0, 0, 0x7f),    // and32 reads only the low half (andi with a
            EXIT,                        // non-negative mask clears bits 63:32 itself)
        ],
        0,
        "mv x15,x10
         li x10,0
         zext.b x15,x15
         lui x6,0x10
         or x15,x15,x6
         not x15,x15
         and x15,x15,127
         ret",
    );
}

#[test]
fn alu32_results_are_zero_extended_only_where_read_whole() {
    golden(
        &[
            ins(0xa4, 1, 0, 0, -1),  // xor32 r1, -1: r0 = r1 reads all 64 bits, so zext
            ins(0xbf, 0, 1, 0, 0),   // r0 = r1
            ins(0x04, 2, 0, 0, 1),   // add32 r2, 1: only a 4-byte store and a jmp32 read
            ins(0x63, 10, 2, -4, 0), // *(u32 *)(r10 - 4) = r2
            ins(0x16, 2, 0, 1, 7),   // if w2 == 7 goto +1
            ins(0xb4, 3, 0, 0, -1),  // mov32 r3, -1, never read whole: li -1
            EXIT,
        ],
        0,
        "add x2,x2,-80
         sd x21,0(x2)
         add x21,x2,80
         mv x15,x10
         not x15,x15
         sll x15,x15,0x20
         srl x15,x15,0x20
         mv x10,x15
         addw x11,x11,1
         sw x11,-4(x21)
         li x6,7
         sext.w x5,x11
         beq x5,x6,0x38
         li x12,-1
         ld x21,0(x2)
         add x2,x2,80
         ret",
    );
}

#[test]
fn sixty_four_bit_constant() {
    // A constant `li` would build in eight steps comes from the constant pool after the
    // code (auipc + ld); an equal one shares its slot; one `li` builds in three stays inline.
    let [a, b] = lddw(2, 0x1234_5678_9abc_def0);
    let [c, d] = lddw(4, 0x1234_5678_9abc_def0);
    let [e, f] = lddw(5, 0x1234_5678_0000_0000);
    let code = compile(
        &prog(&[a, b, ins(0xb7, 3, 0, 0, -1), c, d, e, f, EXIT]),
        &[],
        0,
    )
    .unwrap();
    assert_eq!(
        disasm(&code[..40]),
        [
            "li x10,0",
            "auipc x11,0x0",
            "ld x11,36(x11)",
            "li x12,-1",
            "auipc x13,0x0",
            "ld x13,24(x13)",
            "lui x14,0x2469",
            "addw x14,x14,-1329",
            "sll x14,x14,0x23",
            "ret",
        ]
    );
    // The pool: 8-byte aligned (no padding needed here), one slot for both equal constants.
    assert_eq!(code.len(), 48);
    assert_eq!(code[40..48], 0x1234_5678_9abc_def0u64.to_le_bytes());
}

#[test]
fn conditional_branches() {
    // jeq reg (64-bit), jgt32 imm (both sides sign-extended), jset imm.
    golden(
        &[
            ins(0x1d, 1, 2, 2, 0),
            ins(0x26, 3, 0, 1, 5),
            ins(0x45, 4, 0, 0, 8),
            ins(0xb7, 0, 0, 0, 1),
            EXIT,
        ],
        0,
        // Every path writes r0 before `exit` reads it, so only r3 and r4 start zeroed.
        "mv x15,x10
         li x12,0
         li x13,0
         beq x15,x11,0x24
         li x6,5
         sext.w x5,x12
         bltu x6,x5,0x24
         and x5,x13,8
         bnez x5,0x24
         li x10,1
         ret",
    );
}

#[test]
fn division_by_register_guards_zero() {
    // RISC-V gives all-ones for x/0; the mask (divisor == 0) - 1 turns that into 0.
    golden(
        &[
            ins(0x3f, 1, 2, 0, 0),
            ins(0x3c, 1, 2, 0, 0),
            ins(0x9f, 1, 2, 0, 0),
            EXIT,
        ],
        0,
        "mv x15,x10
         li x10,0
         seqz x6,x11
         divu x15,x15,x11
         add x6,x6,-1
         and x15,x15,x6
         sll x6,x11,0x20
         seqz x6,x6
         divuw x15,x15,x11
         add x6,x6,-1
         and x15,x15,x6
         sll x15,x15,0x20
         srl x15,x15,0x20
         remu x15,x15,x11
         ret",
    );
}

#[test]
fn helper_call() {
    // Arguments already in a0-a4; address materialised; result moved to r0 (a5).
    golden(
        &[
            ins(0xbf, 6, 1, 0, 0),
            ins(0x85, 0, 0, 0, 7),
            ins(0x0f, 0, 6, 0, 0),
            EXIT,
        ],
        0,
        "add x2,x2,-16
         sd x1,0(x2)
         sd x9,8(x2)
         li x12,0
         li x13,0
         li x14,0
         mv x9,x10
         lui x5,0x8
         addw x5,x5,-1
         sll x5,x5,0x13
         add x5,x5,1
         sll x5,x5,0xc
         add x5,x5,564
         jalr x5
         mv x15,x10
         add x15,x15,x9
         mv x10,x15
         ld x1,0(x2)
         ld x9,8(x2)
         add x2,x2,16
         ret",
    );
}

#[test]
fn atomics() {
    // fetch-add: amoadd with aq+rl; cmpxchg32: LR/SC loop with sign-extended expectation.
    golden(
        &[
            ins(0xdb, 10, 1, -8, 0x01),
            ins(0xc3, 10, 2, -16, 0xf1),
            ins(0xc3, 1, 2, 0, 0x40),
            EXIT,
        ],
        0,
        "add x2,x2,-80
         sd x21,0(x2)
         add x21,x2,80
         mv x15,x10
         li x10,0
         add x5,x21,-8
         amoadd.d.aqrl x15,x15,(x5)
         add x5,x21,-16
         sext.w x7,x10
         lr.w.aqrl x6,(x5)
         bne x6,x7,0x34
         sc.w.rl x28,x11,(x5)
         bnez x28,0x24
         fence rw,rw
         sll x10,x6,0x20
         srl x10,x10,0x20
         amoor.w x0,x11,(x15)
         ld x21,0(x2)
         add x2,x2,80
         ret",
    );
}

#[test]
fn extensions_zbb_zba_and_compressed() {
    // bswap64 → rev8; be16 → rev8 + srli; mov32 → zext.w (add.uw); movsx8 → sext.b;
    // small immediates and two-address ops use 16-bit encodings.
    golden(
        &[
            ins(0xd7, 1, 0, 0, 64),
            ins(0xdc, 2, 0, 0, 16),
            ins(0xbc, 3, 1, 0, 0),
            ins(0xbf, 4, 2, 8, 0),
            ins(0x07, 0, 0, 0, 3),
            ins(0x0f, 0, 1, 0, 0),
            ins(0x0f, 0, 3, 0, 0), // reads all of r3: mov32 must zero-extend
            EXIT,
        ],
        ALL,
        "c:mv x15,x10
         c:li x10,0
         rev8 x15,x15
         rev8 x11,x11
         c:srl x11,x11,0x30
         zext.w x12,x15
         sext.b x13,x11
         c:add x10,x10,3
         c:add x10,x10,x15
         c:add x10,x10,x12
         c:ret",
    );
    // The same without extensions: byte-by-byte swap and shift pairs.
    golden(
        &[
            ins(0xdc, 2, 0, 0, 16),
            ins(0xbc, 3, 1, 0, 0),
            ins(0x0f, 0, 3, 0, 0),
            EXIT,
        ],
        0,
        "mv x15,x10
         li x10,0
         zext.b x6,x11
         sll x6,x6,0x8
         srl x5,x11,0x8
         zext.b x5,x5
         or x6,x6,x5
         mv x11,x6
         sll x12,x15,0x20
         srl x12,x12,0x20
         add x10,x10,x12
         ret",
    );
}

#[test]
fn local_call_and_callx_dispatch() {
    // call +1; exit; f: callx r1; exit. The entry keeps env (a2) in x22 and stores its sp in
    // env.entry_sp. The dispatch compares the id against the helper table and tail-jumps to
    // the helper, or stops: PJ_STOP_UNKNOWN_CALLX, the callx's pc (x17) and the id written to
    // env, sp reloaded from env.entry_sp, out through the entry epilogue.
    golden(
        &[ins(0x85, 0, 1, 0, 1), EXIT, ins(0x8d, 1, 0, 0, 0), EXIT],
        0,
        "add x2,x2,-16
         sd x1,0(x2)
         sd x22,8(x2)
         mv x22,x12
         sd x2,80(x22)
         li x12,0
         li x13,0
         li x14,0
         jal 0x38
         mv x10,x15
         ld x1,0(x2)
         ld x22,8(x2)
         add x2,x2,16
         ret
         add x2,x2,-16
         sd x1,0(x2)
         mv x7,x10
         li x17,2
         jal 0x5c
         mv x15,x10
         ld x1,0(x2)
         add x2,x2,16
         ret
         li x6,7
         beq x7,x6,0x78
         mv x5,x7
         li x15,-1
         li x16,3
         li x6,0
         j 0x94
         lui x5,0x8
         addw x5,x5,-1
         sll x5,x5,0x13
         add x5,x5,1
         sll x5,x5,0xc
         add x5,x5,564
         jr x5
         sw x16,40(x22)
         sw x6,44(x22)
         sd x17,48(x22)
         sd x5,56(x22)
         ld x2,80(x22)
         j 0x24",
    );
}

#[test]
fn long_branches_grow_to_jal_and_auipc_jalr() {
    // jeq over 600 four-byte instructions (2.4 KiB: beyond the 2 KiB dynasmrt would
    // accept for b<cc>, inside the ISA's 4 KiB) stays one branch; over 1,100 (4.4 KiB) it
    // becomes an inverted branch around jal. The code stays correct for every form (see
    // tests/exec.rs).
    let over = |n: usize| {
        let mut slots = vec![ins(0x15, 1, 0, n as i16, 0)];
        slots.extend(std::iter::repeat_n(ins(0x07, 0, 0, 0, 1000), n));
        slots.push(EXIT);
        disasm(&compile(&prog(&slots), &[], 0).unwrap())
    };
    let d = over(600);
    // The program calls nothing: r1 moves to a5 (it is read first), and r0, in a0, is
    // read (r0 += 1000) before any write, so the entry zeroes it.
    assert_eq!(d[..2], ["mv x15,x10", "li x10,0"]);
    assert_eq!(d[2], "beqz x15,0x96c");
    let d = over(1100);
    assert_eq!(d[2], "bnez x15,0x10");
    assert!(d[3].starts_with("j "), "{}", d[3]);
    // c.beqz reaches ±256 B: a short hop stays a single 16-bit branch.
    let code = compile(
        &prog(&[ins(0x15, 1, 0, 1, 0), ins(0x07, 0, 0, 0, 1000), EXIT]),
        &[],
        ALL,
    )
    .unwrap();
    assert!(
        disasm(&code)[2].starts_with("c:beqz x15,"),
        "{:?}",
        disasm(&code)
    );
}

#[test]
fn line_table_maps_each_slot_to_its_code() {
    use packjit_plugin_api::{CodeArena, CompileRequest, JitBackend, NO_NATIVE_CODE};
    // pc 0: mov r0, 7 (li: 4 bytes); pc 1-2: lddw r1 (two slots, one instruction);
    // pc 3: add r0, r1; pc 4: exit.
    let [a, b] = lddw(1, 0x1234_5678_9abc_def0);
    let code = prog(&[ins(0xb7, 0, 0, 0, 7), a, b, ins(0x0f, 0, 1, 0, 0), EXIT]);
    let arena = VecArena::default();
    let req = CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: 0,
        blind_key: 0,
    };
    let c = packjit_rv64::Rv64Backend::new()
        .compile(&req, &arena as &dyn CodeArena)
        .unwrap();
    let t = &c.pc_offsets;
    assert_eq!(t.len(), 5);
    assert_eq!((t[0], t[1], t[2]), (0, 4, NO_NATIVE_CODE));
    // lddw's 64-bit constant takes several instructions; add then exit follow.
    let bytes = arena.bytes.borrow().clone();
    let d = disasm(&bytes);
    assert_eq!(d[0], "li x10,7");
    assert!(t[3] > 8 && t[4] == t[3] + 4, "{t:?}");
    assert_eq!(disasm(&bytes[t[3] as usize..])[0], "add x10,x10,x15");
}

/// The inlined built-ins (`packjit_testkit::inline_cases`, the same on every arch): the rseq
/// CPU id is one `tp`-relative load, the clock reads `rdtime` and scales it with the 64.64
/// factor the host keeps at `addr`, the per-CPU lookup bounds-checks array id, index and CPU
/// before forming `base + cpu * slot + index * size`, and the per-CPU address instruction
/// adds `cpu * slot_size` (0 for an unknown array or CPU). Trusted code, base ISA: the
/// sequences and the entry only.
#[test]
fn inlined_builtins_are_short_sequences() {
    let helpers = packjit_testkit::inline_cases::helpers();
    let want: [&[&str]; 4] = [
        &[
            "add x2,x2,-16",
            "sd x1,0(x2)",
            "li x12,0",
            "li x13,0",
            "li x14,0",
            "lwu x15,-84(x4)",
            "mv x10,x15",
            "ld x1,0(x2)",
            "add x2,x2,16",
            "ret",
        ],
        &[
            "add x2,x2,-16",
            "sd x1,0(x2)",
            "li x12,0",
            "li x13,0",
            "li x14,0",
            "rdtime x5",
            "lui x6,0x3f8",
            "addw x6,x6,9",
            "sll x6,x6,0xd",
            "add x6,x6,837",
            "sll x6,x6,0xc",
            "ld x7,8(x6)",
            "mulhu x7,x5,x7",
            "ld x28,0(x6)",
            "mul x5,x5,x28",
            "add x5,x5,x7",
            "ld x28,16(x6)",
            "add x15,x5,x28",
            "mv x10,x15",
            "ld x1,0(x2)",
            "add x2,x2,16",
            "ret",
        ],
        &[
            "add x2,x2,-16",
            "sd x1,0(x2)",
            "li x12,0",
            "li x13,0",
            "li x14,0",
            "li x10,0",
            "li x11,3",
            "lui x6,0x3f8",
            "addw x6,x6,9",
            "sll x6,x6,0xc",
            "add x6,x6,419",
            "sll x6,x6,0xd",
            "ld x5,0(x6)",
            "bgeu x10,x5,0x8c",
            "li x7,40",
            "mul x7,x10,x7",
            "add x7,x7,x6",
            "ld x5,40(x7)",
            "bgeu x11,x5,0x8c",
            "ld x5,8(x6)",
            "add x5,x5,x4",
            "lwu x28,0(x5)",
            "ld x5,48(x7)",
            "bgeu x28,x5,0x8c",
            "sltu x5,x28,x5",
            "neg x5,x5",
            "and x28,x28,x5",
            "ld x5,24(x7)",
            "mul x28,x28,x5",
            "ld x5,16(x7)",
            "add x28,x28,x5",
            "ld x5,32(x7)",
            "mul x5,x11,x5",
            "add x15,x28,x5",
            "j 0x90",
            "li x15,0",
            "mv x10,x15",
            "ld x1,0(x2)",
            "add x2,x2,16",
            "ret",
        ],
        &[
            "add x2,x2,-16",
            "sd x1,0(x2)",
            "lwu x28,-84(x4)",
            "li x7,0",
            "li x29,0",
            "lui x6,0x3f8",
            "addw x6,x6,9",
            "sll x6,x6,0xc",
            "add x6,x6,419",
            "sll x6,x6,0xd",
            "ld x5,0(x6)",
            "bgeu x7,x5,0x4c",
            "li x5,40",
            "mul x7,x7,x5",
            "add x6,x6,x7",
            "ld x5,48(x6)",
            "bgeu x28,x5,0x4c",
            "ld x5,24(x6)",
            "mul x29,x28,x5",
            "add x15,x10,x29",
            "mv x10,x15",
            "ld x1,0(x2)",
            "add x2,x2,16",
            "ret",
        ],
    ];
    for ((name, code, flags), want) in packjit_testkit::inline_cases::programs().iter().zip(want) {
        let got = disasm(&compile_with(code, &helpers, 0, *flags, 0).unwrap());
        assert_eq!(got, want, "{name}:\n{}", got.join("\n"));
    }
}

/// The Spectre clamps that no functional test can see, on the bench's loops
/// (`packjit_testkit::bench`), base ISA and with Zbb: the walked stack pointer's loop
/// (back-edge lands on the clamp of the pointer into a dead register, a `p - r10` sign mask or one
/// `minu`, then the load through that copy), the header-parse loop (back-edge lands past the group's check: no check
/// per iteration), and that loop's checked copy, which masks the base with each member's
/// verdict.
#[test]
fn loops_clamp_what_they_no_longer_check() {
    let programs = packjit_testkit::bench::sandbox_programs();
    let hot_loop = |name: &str, features: u64| -> (Vec<String>, Vec<String>) {
        let p = programs.iter().find(|p| p.name.starts_with(name)).unwrap();
        let req = packjit_plugin_api::CompileRequest {
            code: &p.code,
            helpers: &[],
            features,
            flags: packjit_plugin_api::PJ_COMPILE_SANDBOX,
            blind_key: 0,
        };
        let m = packjit_rv64::emit_request(&req).unwrap();
        let prog = packjit_frontend::decode_for_lowering(&req).unwrap();
        let line_table = prog.line_table(m.inst_offsets);
        let slots = p.hot_slots();
        let from = packjit_testkit::bench::loop_landing(
            p.hot.start,
            line_table[slots.start] as usize,
            &m.landings,
        );
        let to = line_table[slots.end] as usize;
        (disasm(&m.bytes[from..to]), disasm(&m.bytes))
    };
    let want: [&[&str]; 2] = [
        &[
            // The clamp writes the pointer's copy (r1, dead in and after the loop; a5 as the
            // program calls nothing), off the pointer's own chain (`add x12, x12, 8` alone).
            "sub x28,x12,x21",
            "sra x28,x28,0x3f",
            "and x15,x12,x28",
            "ld x13,0(x15)",
            "add x10,x10,x13",
            "add x12,x12,8",
            "bne x12,x21,0x0",
        ],
        &[
            "lhu x11,12(x15)",
            "lbu x12,23(x15)",
            "lwu x13,26(x15)",
            "lwu x14,30(x15)",
            "lhu x18,34(x15)",
            "add x10,x10,x11",
            "xor x10,x10,x12",
            "add x10,x10,x13",
            "xor x10,x10,x14",
            "add x10,x10,x18",
            "add x9,x9,1",
            "lui x6,0x1",
            "bltu x9,x6,0x0",
        ],
    ];
    // The context walk: a guarded walk (bounds known at run time), no check in the loop,
    // the pointer's masked copy in r1 (a5, as the program calls nothing, which also puts r0
    // in a0). The entry verdict (t2 = 0: inside) masks the pointer.
    let (ctx_walk, all) = hot_loop("ctx hash", 0);
    let want_ctx = [
        "sub x28,x12,x11",
        "sra x28,x28,0x3f",
        "and x15,x12,x28",
        "ld x13,0(x15)",
        "xor x10,x10,x13",
        "mul x10,x10,x14",
        "add x12,x12,8",
        "bltu x12,x11,0x0",
    ];
    assert_eq!(ctx_walk, want_ctx, "context walk:\n{}", ctx_walk.join("\n"));
    let verdict = ["add x7,x7,-1", "and x12,x12,x7"];
    assert!(all.windows(2).any(|w| w == verdict), "{}", all.join("\n"));
    let (walk, _) = hot_loop("stack table (checked", 0);
    assert_eq!(walk, want[0], "walk:\n{}", walk.join("\n"));
    // With Zbb: one `minu` into the copy, against r10 + last kept in a second dead
    // register (r2 = a1), set once before the loop.
    let (walk_zbb, all_zbb) = hot_loop("stack table (checked", FEATURE_ZBB);
    assert_eq!(
        &walk_zbb[..2],
        ["minu x15,x12,x11", "ld x13,0(x15)"],
        "{walk_zbb:#?}"
    );
    let entry = ["mv x15,x12", "add x11,x21,-8"];
    assert!(
        all_zbb.windows(2).any(|w| w == entry),
        "{}",
        all_zbb.join("\n")
    );
    let (header, all) = hot_loop("header parse", 0);
    assert_eq!(header, want[1], "header:\n{}", header.join("\n"));
    // The base (a5 = r1) masked with the verdict (t3): once after the widened check, and in
    // the checked copy after each of the five members' checks.
    let masks = all.iter().filter(|l| *l == "and x15,x15,x28").count();
    assert_eq!(masks, 1 + 5, "{}", all.join("\n"));
}

#[test]
fn callx_dispatches_through_a_table_when_ids_are_dense() {
    // Six helpers, ids 1..=7 without 4: the shared dispatch bounds the id (t2), loads the
    // address from a table after the routine and tests it for a hole.
    const BASE: u64 = 0x0000_3fff_8000_1234;
    let hs = packjit_testkit::inline_cases::dense_callx_helpers(BASE);
    let code = compile(&prog(&[ins(0x8d, 3, 0, 0, 0), EXIT]), &hs, 0).unwrap();
    let d = disasm(&code);
    let at = d.iter().position(|l| l == "li x6,8").expect("bound");
    assert!(d[at + 1].starts_with("bgeu x7,x6,"), "{d:#?}");
    assert_eq!(d[at + 2], "auipc x5,0x0");
    assert!(d[at + 3].starts_with("add x5,x5,"), "{d:#?}");
    assert_eq!(
        d[at + 4..at + 7],
        ["sll x6,x7,0x3", "add x5,x5,x6", "ld x5,0(x5)"],
        "{d:#?}"
    );
    // A hole goes where an id past the table goes: the stop.
    assert_eq!(d[at + 7], d[at + 1].replace("bgeu x7,x6,", "beqz x5,"));
    assert_eq!(d[at + 8], "jr x5");
    let table = packjit_testkit::inline_cases::dense_callx_table(BASE);
    let pos = code
        .windows(64)
        .position(|w| w == table.as_slice())
        .expect("the table is in the code");
    assert_eq!(pos % 8, 0, "aligned");
}

/// A check group reaching below its base (clang's byte run off an advanced pointer,
/// `ranges::GROUP_BELOW`): one widened test of `[r5 - 3, r5 + 5)` against the context, then
/// the verdict mask goes on `r5 - 3`, so a mispredicted test leaves the base at 3 (not 0)
/// and both members in the never-mapped first page; the members load unchecked.
#[test]
fn group_below_its_base_clamps_the_base_to_minus_lo() {
    let code = prog(&[
        ins(0xbf, 5, 2, 0, 0),
        ins(0x57, 5, 0, 0, 15),
        ins(0x0f, 5, 1, 0, 0),
        ins(0x07, 5, 0, 0, 3),
        ins(0x71, 6, 5, -3, 0),
        ins(0x71, 7, 5, 4, 0),
        ins(0x0f, 6, 7, 0, 0),
        ins(0xbf, 0, 6, 0, 0),
        EXIT,
    ]);
    let d =
        disasm(&compile_with(&code, &[], 0, packjit_plugin_api::PJ_COMPILE_SANDBOX, 0).unwrap());
    let at = d.iter().position(|l| l.starts_with("sub x7,x14,")).unwrap();
    let mut got: Vec<&str> = d[at..at + 12].iter().map(|s| s.as_str()).collect();
    assert!(got[5].starts_with("bnez x28,"), "{d:#?}");
    got[5] = "bnez x28,cold";
    assert_eq!(
        got,
        [
            "sub x7,x14,x23",
            "add x7,x7,5",
            "sltiu x28,x7,8",
            "sltu x29,x24,x7",
            "or x28,x28,x29",
            "bnez x28,cold",
            "add x28,x28,-1",
            "add x14,x14,-3",
            "and x14,x14,x28",
            "add x14,x14,3",
            "lbu x9,-3(x14)",
            "lbu x18,4(x14)",
        ],
        "{d:#?}"
    );
}

/// One byte at an unknown offset into the context is inside exactly when `addr - start <
/// len` (below the start wraps past any length): `sub; sltu` against the length register,
/// the cold branch on "not inside", the verdict flipped to the usual t3 = 0 = inside for
/// the mask; and a one-byte check group (clang reading `p[i]` twice) tests the same way,
/// its mask the negated verdict, with no end to form either.
#[test]
fn one_byte_context_tests_need_no_end() {
    // r2 &= 15; r2 += r1; r0 = *(u8 *)(r2 + 2)
    let single = prog(&[
        ins(0x57, 2, 0, 0, 15),
        ins(0x0f, 2, 1, 0, 0),
        ins(0x71, 0, 2, 2, 0),
        EXIT,
    ]);
    let d =
        disasm(&compile_with(&single, &[], 0, packjit_plugin_api::PJ_COMPILE_SANDBOX, 0).unwrap());
    let at = d.iter().position(|l| l.starts_with("sub x7,x11,")).unwrap();
    let mut got: Vec<&str> = d[at..at + 8].iter().map(|s| s.as_str()).collect();
    assert!(got[3].starts_with("beqz x28,"), "{d:#?}");
    got[3] = "beqz x28,cold";
    assert_eq!(
        got,
        [
            "sub x7,x11,x23",
            "add x7,x7,2",
            "sltu x28,x7,x24",
            "beqz x28,cold",
            "xor x28,x28,1",
            "add x28,x28,-1",
            "and x5,x11,x28",
            "lbu x10,2(x5)",
        ],
        "{d:#?}"
    );
    // r5 = (r2 & 15) + r1; r6 = *(u8 *)(r5 + 2); r7 = *(u8 *)(r5 + 2); r0 = r6 ^ r7
    let group = prog(&[
        ins(0xbf, 5, 2, 0, 0),
        ins(0x57, 5, 0, 0, 15),
        ins(0x0f, 5, 1, 0, 0),
        ins(0x71, 6, 5, 2, 0),
        ins(0x71, 7, 5, 2, 0),
        ins(0xaf, 6, 7, 0, 0),
        ins(0xbf, 0, 6, 0, 0),
        EXIT,
    ]);
    let d =
        disasm(&compile_with(&group, &[], 0, packjit_plugin_api::PJ_COMPILE_SANDBOX, 0).unwrap());
    let at = d.iter().position(|l| l.starts_with("sub x7,x14,")).unwrap();
    let mut got: Vec<&str> = d[at..at + 8].iter().map(|s| s.as_str()).collect();
    assert!(got[3].starts_with("beqz x28,"), "{d:#?}");
    got[3] = "beqz x28,cold";
    assert_eq!(
        got,
        [
            "sub x7,x14,x23",
            "add x7,x7,2",
            "sltu x28,x7,x24",
            "beqz x28,cold",
            "neg x28,x28",
            "and x14,x14,x28",
            "lbu x9,2(x14)",
            "lbu x18,2(x14)",
        ],
        "{d:#?}"
    );
}

/// The clamp no functional test can see on an index-bounded context access
/// (`packjit_frontend::indexes`): `words`' loop, `r3 = *(u8 *)(r1 + r4)` with `r4 < r2` on
/// every path, re-tests the index against the length branch-free and selects a harmless
/// address before the load.
#[test]
fn index_bounded_access_clamps_its_address() {
    use packjit_frontend::encode_insn as ins;
    let code = [
        ins(0xb7, 0, 0, 0, 0),  // r0 = 0
        ins(0xb7, 4, 0, 0, 0),  // r4 = 0
        ins(0x15, 2, 0, 7, 0),  // if r2 == 0 goto out
        ins(0x05, 0, 0, 5, 0),  // goto test
        ins(0xbf, 5, 1, 0, 0),  // head: r5 = r1
        ins(0x0f, 5, 4, 0, 0),  // r5 += r4
        ins(0x71, 3, 5, 0, 0),  // r3 = *(u8 *)(r5 + 0)
        ins(0x0f, 0, 3, 0, 0),  // r0 += r3
        ins(0x07, 4, 0, 0, 1),  // r4 += 1
        ins(0xad, 4, 2, -6, 0), // test: if r4 < r2 goto head
        ins(0x95, 0, 0, 0, 0),  // out: exit
    ]
    .concat();
    let out = packjit_rv64::emit_request(&packjit_plugin_api::CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: packjit_plugin_api::abi::PJ_COMPILE_SANDBOX,
        blind_key: 1,
    })
    .unwrap();
    let got = disasm(&out.bytes);
    let want: &[&str] = INDEX_CLAMP;
    assert!(
        got.windows(want.len()).any(|w| w == want),
        "no {want:?} in:\n{}",
        got.join("\n")
    );
}

/// `index_bounded_access_clamps_its_address`'s window: `r4 < len` (s8) re-tested, the base
/// masked to 0 when it fails, the load through t0.
const INDEX_CLAMP: &[&str] = &[
    "sltu x28,x13,x24", // t3 = r4 < len (s8)
    "neg x28,x28",
    "and x5,x14,x28", // t0 = r5 & t3
    "lbu x12,0(x5)",
];
