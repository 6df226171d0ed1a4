//! CO-RE relocations: `tests/bpf/core_ctx.c` reads a `preserve_access_index` context struct;
//! loaded as compiled (target = the object's own BTF) it reads the local layout, loaded with
//! `tests/bpf/core_target.c`'s `.BTF` as the target it reads the target layout (fields
//! reordered and resized, one removed, an enum renumbered); what cannot be satisfied is
//! poisoned as libbpf poisons it (a named load error where the code reaches it, nothing where
//! an existence check guards it), and corrupted objects never panic.

mod elf_support;

use elf_support::*;
use packjit::elf::{link, ElfLoadOptions, Linked};
use packjit::{Error, ErrorKind, LoadOptions, Program, Runtime};

fn runtime() -> Runtime {
    let rt = Runtime::new().unwrap();
    rt.load_plugins(None)
        .expect("backend plugins next to the test binary");
    rt
}

/// Sandboxed, or trusted where the host's backend has no sandbox (the programs stay inside
/// their context).
fn load(rt: &Runtime, obj: &[u8], sel: &ElfLoadOptions) -> Program {
    match rt.load_elf(obj, sel, &LoadOptions::default()) {
        Ok(p) => p,
        Err(e) if e.kind == ErrorKind::Unsupported => {
            // SAFETY: the core_ctx programs only touch their context.
            unsafe { rt.load_elf_trusted(obj, sel, &LoadOptions::default()) }
                .unwrap_or_else(|e| panic!("{:?}: {e}", sel.program))
        }
        Err(e) => panic!("{:?}: {e}", sel.program),
    }
}

/// Runs `prog` over `ctx` where a backend targets this host (else only loading is checked).
fn run(prog: &Program, ctx: &mut [u8]) -> Option<u64> {
    if !prog.is_executable() {
        eprintln!("note: no backend runs here; linked and compiled only");
        return None;
    }
    Some(prog.call(ctx).unwrap())
}

fn target_btf() -> Vec<u8> {
    let obj = compile_bpf("core_target");
    let (off, size, _, _) = sections(&obj)
        .into_iter()
        .find(|s| s.2 == ".BTF")
        .expect("core_target.o has a .BTF");
    obj[off..off + size].to_vec()
}

fn link_sec(obj: &[u8], sec: &str, target: Option<&[u8]>) -> Result<Linked, Error> {
    let mut sel = ElfLoadOptions::section(sec);
    if let Some(t) = target {
        sel = sel.with_target_btf(t.to_vec());
    }
    link(obj, &sel, &|_| None)
}

fn assert_mentions(e: &Error, parts: &[&str]) {
    for p in parts {
        assert!(
            e.message.contains(p),
            "error {:?} does not mention {p:?}",
            e.message
        );
    }
}

const PID: u32 = 0x1234_5678;
const START: u64 = 0x0102_0304_0506_0708;
const FLAGS: u32 = 0x1_beef; // the target's u32 holds more than the local u16
const COMM: &[u8] = b"worker/3";
const PRIO: i32 = -20;

/// What `core_read` returns for these field values.
fn mix(pid: u64, start: u64, flags: u64, comm2: u8, prio: i32) -> u64 {
    let mut r = pid;
    r = r.wrapping_mul(31).wrapping_add(start);
    r = r.wrapping_mul(31).wrapping_add(flags);
    r = r.wrapping_mul(31).wrapping_add(u64::from(comm2));
    r.wrapping_mul(31).wrapping_add(i64::from(prio) as u64)
}

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

/// `core_info`'s packing: one byte per relocation result.
#[allow(clippy::too_many_arguments)]
fn info(
    legacy_exists: u64,
    comm_size: u64,
    prio_off: u64,
    prio_signed: u64,
    flags_signed: u64,
    task_size: u64,
    sleeping: u64,
    running_exists: u64,
    hi_lshift: u64,
) -> u64 {
    legacy_exists
        | comm_size << 8
        | prio_off << 16
        | prio_signed << 24
        | flags_signed << 25
        | task_size << 32
        | sleeping << 40
        | running_exists << 48
        | hi_lshift << 56
}

/// Without a target BTF every relocation keeps the compiled (local) layout.
#[test]
fn core_reads_use_the_local_layout_by_default() {
    let rt = runtime();
    let obj = compile_bpf("core_ctx");
    // Local layout: pid@0 u32, start@8, flags@16 u16, legacy@20, comm@24 [8], prio@32,
    // bitfields@36; 40 bytes.
    let mut ctx = vec![0u8; 40];
    put(&mut ctx, 0, &PID.to_le_bytes());
    put(&mut ctx, 8, &START.to_le_bytes());
    put(&mut ctx, 16, &(FLAGS as u16).to_le_bytes());
    put(&mut ctx, 20, &0xdead_u32.to_le_bytes());
    put(&mut ctx, 24, COMM);
    put(&mut ctx, 32, &PRIO.to_le_bytes());
    let l = link_sec(&obj, "pj/core_read", None).unwrap();
    assert!(!l.core_relocations.is_empty());
    // Field offsets and sizes as compiled: nothing changes.
    assert!(
        l.core_relocations.iter().all(|&(_, a, b)| a == b),
        "{:?}",
        l.core_relocations
    );
    let p = load(&rt, &obj, &ElfLoadOptions::section("pj/core_read"));
    if let Some(r0) = run(&p, &mut ctx) {
        assert_eq!(
            r0,
            mix(
                u64::from(PID),
                START,
                u64::from(FLAGS as u16),
                COMM[2],
                PRIO
            )
        );
        assert_eq!(&ctx[0..4], &7u32.to_le_bytes(), "`t->pid = 7` at offset 0");
    }
    let p = load(&rt, &obj, &ElfLoadOptions::section("pj/core_info"));
    if let Some(r0) = run(&p, &mut ctx) {
        // The bitfield's left shift is libbpf's (a 4-byte load at 36: 64 - 16), not clang's
        // (an 8-byte load at 32): bitfield values are not checked against the compiled ones.
        assert_eq!(r0, info(1, 8, 32, 1, 0, 40, 2, 1, 48), "{r0:#x}");
    }
    let p = load(&rt, &obj, &ElfLoadOptions::section("pj/core_legacy"));
    if let Some(r0) = run(&p, &mut ctx) {
        assert_eq!(r0, 0xdead);
    }
}

/// With the target's BTF the program reads the target layout: offsets moved, `flags` read
/// as 4 bytes (an unsigned field that grew), `legacy` reported missing.
#[test]
fn core_reads_follow_the_target_btf() {
    let rt = runtime();
    let obj = compile_bpf("core_ctx");
    let btf = target_btf();
    // Target layout: start@0, comm@8 [16], prio@24, flags@28 u32, pid@32, bitfields@36,
    // extra@40; 48 bytes.
    let mut ctx = vec![0u8; 48];
    put(&mut ctx, 0, &START.to_le_bytes());
    put(&mut ctx, 8, b"target-comm-name");
    put(&mut ctx, 24, &PRIO.to_le_bytes());
    put(&mut ctx, 28, &FLAGS.to_le_bytes());
    put(&mut ctx, 32, &PID.to_le_bytes());
    let sel = |s: &str| ElfLoadOptions::section(s).with_target_btf(btf.clone());
    let p = load(&rt, &obj, &sel("pj/core_read"));
    let l = p.elf_linked().unwrap();
    assert!(
        l.core_relocations.iter().any(|&(_, a, b)| a != b),
        "{:?}",
        l.core_relocations
    );
    if let Some(r0) = run(&p, &mut ctx) {
        assert_eq!(
            r0,
            mix(u64::from(PID), START, u64::from(FLAGS), b'r', PRIO),
            "{r0:#x}"
        );
        assert_eq!(
            &ctx[32..36],
            &7u32.to_le_bytes(),
            "`t->pid = 7` at offset 32"
        );
        assert_eq!(&ctx[0..8], &START.to_le_bytes(), "nothing else written");
    }
    let p = load(&rt, &obj, &sel("pj/core_info"));
    if let Some(r0) = run(&p, &mut ctx) {
        assert_eq!(r0, info(0, 16, 24, 1, 0, 48, 5, 1, 40), "{r0:#x}");
    }
}

/// A field the target does not have, read unconditionally: the link poisons the read as
/// libbpf does (`call 0xbad2310`, listed with why), and the load refuses the program because
/// the code reaches it, naming pc, section, instruction, kind, access and why.
#[test]
fn unsatisfiable_field_offset_is_a_named_error() {
    let obj = compile_bpf("core_ctx");
    let btf = target_btf();
    let l = link_sec(&obj, "pj/core_legacy", Some(&btf)).unwrap();
    assert_eq!(l.core_poisoned.len(), 1, "{:?}", l.core_poisoned);
    let poisoned = &l.core_poisoned[0];
    assert_eq!(poisoned.slot, 0);
    let call = [0x85, 0, 0, 0, 0x10, 0x23, 0xad, 0x0b];
    assert_eq!(l.code[..8], call, "libbpf's poison call");
    for part in [
        "section `pj/core_legacy` insn 0",
        "CO-RE relocation kind FIELD_BYTE_OFFSET (0)",
        "`struct pj_task.legacy` (access 0:3)",
        "cannot be satisfied: no member `legacy` in target struct pj_task",
    ] {
        assert!(poisoned.why.contains(part), "{poisoned:?} lacks {part:?}");
    }
    let rt = runtime();
    let e = rt
        .load_elf(
            &obj,
            &ElfLoadOptions::section("pj/core_legacy").with_target_btf(btf.clone()),
            &LoadOptions::default(),
        )
        .unwrap_err();
    assert_eq!((e.kind, e.pc), (ErrorKind::Verify, Some(0)));
    assert_mentions(
        &e,
        &[
            "poisoned this instruction",
            "the code can reach it",
            "section `pj/core_legacy` insn 0",
            "no member `legacy`",
        ],
    );
    // The linked code alone, through `load`, names the poisoned pc too.
    let e = rt.load(&l.code, &LoadOptions::default()).unwrap_err();
    assert_eq!((e.kind, e.pc), (ErrorKind::Verify, Some(0)));
    assert_mentions(&e, &["poisoned this instruction"]);
    // A host cannot make the poison a helper.
    extern "C" fn any(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        0
    }
    let e = rt
        .register_helper(packjit::elf::POISON_HELPER, "bad_relo", any)
        .unwrap_err();
    assert_mentions(&e, &["poison"]);
    // A target without the struct at all.
    let empty = {
        let mut v = btf.clone();
        // Type section length 0: no types at all.
        v[12..16].copy_from_slice(&0u32.to_le_bytes());
        v
    };
    let l = link_sec(&obj, "pj/core_legacy", Some(&empty)).unwrap();
    assert!(
        l.core_poisoned[0]
            .why
            .contains("no struct pj_task in the target BTF"),
        "{:?}",
        l.core_poisoned
    );
    // The existence checks resolve to 0 there instead.
    link_sec(&obj, "pj/core_info", Some(&btf)).unwrap();
    let e = link_sec(&obj, "pj/core_info", Some(&[1, 2, 3])).unwrap_err();
    assert_mentions(&e, &["target BTF"]);
}

/// A read guarded by `bpf_core_field_exists()`: against a target without the field the read
/// is poisoned and dead (the guard relocates to 0), so the program loads and takes the
/// other branch, as under libbpf; with the local layout it reads the field.
#[test]
fn a_guarded_poisoned_read_loads_and_is_never_taken() {
    let rt = runtime();
    let obj = compile_bpf("core_ctx");
    let btf = target_btf();
    let sel = ElfLoadOptions::section("pj/core_guarded").with_target_btf(btf);
    let l = link(&obj, &sel, &|_| None).unwrap();
    assert_eq!(l.core_poisoned.len(), 1, "{:?}", l.core_poisoned);
    let mut ctx = vec![0xeeu8; 48];
    let p = load(&rt, &obj, &sel);
    if let Some(r0) = run(&p, &mut ctx) {
        assert_eq!(r0, 7);
    }
    // SAFETY: the program reads only its 48-byte context.
    let trusted = unsafe { rt.load_elf_trusted(&obj, &sel, &LoadOptions::default()) };
    if let Ok(t) = trusted {
        if let Some(r0) = run(&t, &mut ctx) {
            assert_eq!(r0, 7);
        }
    }
    // The local layout has the field: the guard holds and the read runs.
    let l = link_sec(&obj, "pj/core_guarded", None).unwrap();
    assert!(l.core_poisoned.is_empty());
    let mut ctx = vec![0u8; 40];
    put(&mut ctx, 20, &0xdead_u32.to_le_bytes());
    let p = load(&rt, &obj, &ElfLoadOptions::section("pj/core_guarded"));
    if let Some(r0) = run(&p, &mut ctx) {
        assert_eq!(r0, 0xdead);
    }
}

/// File offset of the first core_relo record of the object.
fn first_record(obj: &[u8]) -> usize {
    let (off, _, _, _) = sections(obj)
        .into_iter()
        .find(|s| s.2 == ".BTF.ext")
        .unwrap();
    let hdr_len = rd(obj, off + 4, 4) as usize;
    let core_off = rd(obj, off + 24, 4) as usize;
    off + hdr_len + core_off + 4 + 8
}

#[test]
fn malformed_core_records_are_named_errors() {
    let obj = compile_bpf("core_ctx");
    let r = first_record(&obj);
    let mut m = obj.clone();
    m[r + 12..r + 16].copy_from_slice(&99u32.to_le_bytes());
    let e = link_sec(&m, "pj/core_read", None).unwrap_err();
    assert_mentions(
        &e,
        &["`.BTF.ext`", "record 0", "field `kind`", "unknown kind 99"],
    );
    let mut m = obj.clone();
    m[r + 8..r + 12].copy_from_slice(&0x00ff_ffffu32.to_le_bytes());
    let e = link_sec(&m, "pj/core_read", None);
    // The first record belongs to whichever section clang wrote first.
    if let Err(e) = e {
        assert_mentions(&e, &["CO-RE record 0", "access_str_off", "outside"]);
    }
    let mut m = obj.clone();
    m[r..r + 4].copy_from_slice(&3u32.to_le_bytes());
    let e = link_sec(&m, "pj/core_read", None).unwrap_err();
    assert_mentions(&e, &["record 0", "field `insn_off`"]);
}

/// Random corruption of a CO-RE object and of the target BTF: link returns, never panics,
/// and its errors say where they come from.
#[test]
fn corrupted_core_objects_never_panic() {
    let seed = std::env::var("PACKJIT_ELF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xc0_4e5eu64);
    eprintln!("PACKJIT_ELF_SEED={seed}");
    let obj = compile_bpf("core_ctx");
    let btf = target_btf();
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (ext_off, ext_len, _, _) = sections(&obj)
        .into_iter()
        .find(|s| s.2 == ".BTF.ext")
        .unwrap();
    let (mut ok, mut err) = (0, 0);
    for i in 0..2000 {
        let (mut m, mut t) = (obj.clone(), btf.clone());
        for _ in 0..1 + next() % 4 {
            // Half the time aim at `.BTF.ext`, where the records are.
            let (buf, lo, len) = match (i % 4, next() % 2) {
                (0, _) => (&mut t, 0, btf.len()),
                (_, 0) => (&mut m, ext_off, ext_len),
                _ => (&mut m, 0, obj.len()),
            };
            // An earlier truncation may have cut the range short.
            let len = len.min(buf.len().saturating_sub(lo));
            if len == 0 {
                continue;
            }
            let at = lo + (next() as usize) % len;
            match next() % 5 {
                0 => buf[at] ^= 1 << (next() % 8),
                1 | 2 => buf[at] = next() as u8,
                3 => buf[at] = 0,
                _ if lo == 0 => buf.truncate(at.max(1)),
                _ => buf[at] = 0xff,
            }
        }
        for sec in ["pj/core_read", "pj/core_info", "pj/core_legacy"] {
            let target = (i % 2 == 0).then_some(t.as_slice());
            match link_sec(&m, sec, target) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.message.starts_with("ELF: "), "{e}");
                    err += 1;
                }
            }
        }
    }
    eprintln!("corrupted CO-RE objects: {ok} linked, {err} refused");
    assert!(ok > 0 && err > 0);
}

/// A flavoured target (`struct pj_task___v9` matches `pj_task`) whose fields do not fit:
/// a signed field that grew cannot have its load widened, a member of another kind does
/// not match; both are named errors. What does fit still links.
#[test]
fn incompatible_target_fields_are_named_errors() {
    let obj = compile_bpf("core_ctx");
    let bad = compile_bpf("core_target_bad");
    let (off, size, _, _) = sections(&bad).into_iter().find(|s| s.2 == ".BTF").unwrap();
    let btf = &bad[off..off + size];
    let e = link_sec(&obj, "pj/core_read", Some(btf)).unwrap_err();
    assert_mentions(
        &e,
        &[
            "section `pj/core_read`",
            "FIELD_BYTE_OFFSET (0) for `struct pj_task.prio`",
            "8 bytes in the target, 4 locally",
        ],
    );
    let l = link_sec(&obj, "pj/core_legacy", Some(btf)).unwrap();
    let why = &l.core_poisoned[0].why;
    for part in [
        "`struct pj_task.legacy`",
        "cannot be satisfied: member `legacy` of target struct pj_task___v9 is struct pj_legacy",
    ] {
        assert!(why.contains(part), "{why:?} lacks {part:?}");
    }
    // The flavours matched: `PJ_SLEEPING` is 3 in `enum pj_state___v9`.
    let l = link_sec(&obj, "pj/core_info", Some(btf)).unwrap();
    assert!(
        l.core_relocations.iter().any(|&(_, a, b)| (a, b) == (2, 3)),
        "{:?}",
        l.core_relocations
    );
}
