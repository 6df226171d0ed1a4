//! Bad objects: each gets an error naming what is wrong (section, symbol, relocation type,
//! offset), never a panic. Objects are compiled from `tests/bpf/` at test time and, for the
//! cases clang cannot produce, patched byte-wise.

mod elf_support;

use elf_support::*;
use packjit::elf::{link, ElfLoadOptions, Linked};
use packjit::{Error, ErrorKind};

fn link_with_helper(obj: &[u8], sel: &ElfLoadOptions) -> Result<Linked, Error> {
    link(obj, sel, &|n| (n == "pj_mix").then_some(PJ_MIX_ID))
}

fn globals_sel() -> ElfLoadOptions {
    ElfLoadOptions::section("pj/globals")
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

/// `counters` has plain `int` members, not libbpf's encoding (`int (*type)[N]`): a map
/// definition packjit cannot read is refused at its reference, naming section, relocation
/// and map.
#[test]
fn a_map_definition_not_in_libbpfs_encoding_is_refused_naming_the_map() {
    let obj = compile_bpf("bad_maps");
    let e = link_with_helper(&obj, &ElfLoadOptions::section("pj/maps")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_mentions(
        &e,
        &[
            "section `pj/maps`",
            "offset 0x",
            "R_BPF_64_64",
            "`counters`",
            ".maps",
        ],
    );
}

#[test]
fn unresolved_extern_names_the_function_and_the_call_site() {
    let obj = compile_bpf("globals");
    let e = link(&obj, &globals_sel(), &|_| None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnknownHelper);
    assert_mentions(
        &e,
        &[
            "section `pj/globals`",
            "offset 0x178",
            "R_BPF_64_32",
            "`pj_mix`",
            "unresolved extern",
        ],
    );
    // Through the runtime: no helper registered under the name.
    let rt = packjit::Runtime::new().unwrap();
    let e = rt
        .load_elf(&obj, &globals_sel(), &Default::default())
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnknownHelper, "{e}");
}

#[test]
fn unknown_relocation_type_is_named_with_its_number() {
    let mut obj = compile_bpf("globals");
    // The lddw of `runs` at pj/globals+0x50: change its type to 77.
    let e = rel_entry(&obj, ".relpj/globals", 0x50);
    obj[e + 8] = 77;
    let err = link_with_helper(&obj, &globals_sel()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported);
    assert_mentions(
        &err,
        &[
            "section `pj/globals`",
            "offset 0x50",
            "unknown relocation type 77",
            "`runs`",
        ],
    );
}

#[test]
fn call_into_a_data_section_is_refused() {
    let mut obj = compile_bpf("globals");
    // The call to hash_str at pj/globals+0x88: point it at the data symbol `runs`.
    let e = rel_entry(&obj, ".relpj/globals", 0x88);
    let runs = symbol_index(&obj, "runs");
    obj[e + 12..e + 16].copy_from_slice(&runs.to_le_bytes());
    let err = link_with_helper(&obj, &globals_sel()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_mentions(
        &err,
        &[
            "section `pj/globals`",
            "offset 0x88",
            "R_BPF_64_32",
            "`runs`",
            "call into section `.data`",
            "not code",
        ],
    );
}

#[test]
fn lddw_relocation_on_a_non_lddw_instruction_is_refused() {
    let mut obj = compile_bpf("globals");
    // Move the `runs` relocation to the load right after it (pj/globals+0x60).
    let e = rel_entry(&obj, ".relpj/globals", 0x50);
    obj[e..e + 8].copy_from_slice(&0x60u64.to_le_bytes());
    let err = link_with_helper(&obj, &globals_sel()).unwrap_err();
    assert_mentions(&err, &["offset 0x60", "R_BPF_64_64", "not an lddw"]);
}

#[test]
fn truncated_objects_are_errors_at_every_length() {
    let obj = compile_bpf("globals");
    let e = link_with_helper(&obj[..40], &globals_sel()).unwrap_err();
    assert_mentions(&e, &["truncated"]);
    let e = link_with_helper(&obj[..3], &globals_sel()).unwrap_err();
    assert_mentions(&e, &["not an ELF object"]);
    let mut checked = 0;
    for n in (0..obj.len()).step_by(7) {
        let r = link_with_helper(&obj[..n], &globals_sel());
        let e = r.expect_err("a truncated object linked");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{n}: {e}");
        assert!(e.message.starts_with("ELF: "), "{n}: {e}");
        checked += 1;
    }
    assert!(checked > 100);
}

#[test]
fn malformed_headers_are_named() {
    let obj = compile_bpf("globals");
    let mut m = obj.clone();
    m[0x12] = 62; // e_machine = EM_X86_64
    let e = link_with_helper(&m, &globals_sel()).unwrap_err();
    assert_mentions(&e, &["e_machine 62", "EM_BPF"]);
    let mut m = obj.clone();
    m[0x10] = 2; // e_type = ET_EXEC
    let e = link_with_helper(&m, &globals_sel()).unwrap_err();
    assert_mentions(&e, &["ET_REL"]);
    let mut m = obj.clone();
    m[5] = 2; // big-endian
    let e = link_with_helper(&m, &globals_sel()).unwrap_err();
    assert_mentions(&e, &["big-endian"]);
    // A section whose contents run past the end of the file.
    let mut m = obj.clone();
    let secs = sections(&m);
    let i = secs.iter().position(|s| s.2 == "pj/globals").unwrap();
    let shoff = rd(&m, 0x28, 8) as usize;
    m[shoff + i * 64 + 0x20..shoff + i * 64 + 0x28].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = link_with_helper(&m, &globals_sel()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.starts_with("ELF: "), "{e}");
}

#[test]
fn missing_program_lists_what_there_is() {
    let obj = compile_bpf("globals");
    let e = link_with_helper(&obj, &ElfLoadOptions::section("xdp")).unwrap_err();
    assert_mentions(&e, &["no section `xdp`", "`pj/globals`", "`.text`"]);
    let e = link_with_helper(&obj, &ElfLoadOptions::section(".rodata")).unwrap_err();
    assert_mentions(&e, &["`.rodata` is not code"]);
    let e = link_with_helper(&obj, &ElfLoadOptions::function("runs")).unwrap_err();
    assert_mentions(&e, &["no function symbol `runs`"]);
    let e = link_with_helper(&obj, &ElfLoadOptions::function("pj_mix")).unwrap_err();
    assert_mentions(&e, &["no function symbol `pj_mix`"]);
}

/// Random corruption of real objects (bit flips, byte stores, truncation): link must return,
/// never panic. The same entry is the `elf` cargo-fuzz target.
#[test]
fn corrupted_objects_never_panic() {
    let seed = std::env::var("PACKJIT_ELF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xe1f_f022u64);
    eprintln!("PACKJIT_ELF_SEED={seed}");
    let objs = [
        compile_bpf("globals"),
        compile_bpf("calls"),
        compile_bpf("bad_maps"),
    ];
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut m = objs[(next() % 3) as usize].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % m.len();
            match next() % 3 {
                0 => m[at] ^= 1 << (next() % 8),
                1 => m[at] = next() as u8,
                _ => m.truncate(at.max(1)),
            }
        }
        for sel in [
            ElfLoadOptions::section("pj/globals"),
            ElfLoadOptions::function("prog_calls"),
            ElfLoadOptions::section(".text"),
        ] {
            match packjit_fuzz_entry(&m, &sel) {
                true => ok += 1,
                false => err += 1,
            }
        }
    }
    eprintln!("corrupted objects: {ok} linked, {err} refused");
    assert!(err > 0);
}

fn packjit_fuzz_entry(m: &[u8], sel: &ElfLoadOptions) -> bool {
    match link_with_helper(m, sel) {
        Ok(l) => {
            // Whatever links must still be well-formed bytecode or a verifier error.
            let _ = packjit::decode(&l.code, &[]);
            true
        }
        Err(e) => {
            assert!(e.message.starts_with("ELF: "), "{e}");
            false
        }
    }
}

/// File offset of section `name`'s `sh_size` (ELF64 section header, `e_shoff` at 0x28).
fn sh_size_at(obj: &[u8], name: &str) -> usize {
    let i = sections(obj).iter().position(|s| s.2 == name).unwrap();
    rd(obj, 0x28, 8) as usize + i * 64 + 0x20
}

/// File offset of symbol `name`'s `st_size` (ELF64 symbol entry of 24 bytes).
fn st_size_at(obj: &[u8], name: &str) -> usize {
    let (symtab, ..) = sections(obj)
        .into_iter()
        .find(|s| s.2 == ".symtab")
        .unwrap();
    symtab + symbol_index(obj, name) as usize * 24 + 16
}

#[test]
fn a_relocated_instruction_cut_by_its_function_end_is_refused() {
    // Found by the `elf` fuzz target (seed 20261202): a function whose size is not a multiple
    // of 8 ends in a partial slot, and a relocation there indexed past the function. Shrink
    // the `pj/globals` section so it ends 4 bytes into the relocated `lddw` at +0x50.
    let mut obj = compile_bpf("globals");
    let sh_size = sh_size_at(&obj, "pj/globals");
    obj[sh_size..sh_size + 8].copy_from_slice(&0x54u64.to_le_bytes());
    let err = link_with_helper(&obj, &globals_sel()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    assert_mentions(
        &err,
        &["offset 0x50", "`runs`", "runs past the end of its function"],
    );
}

#[test]
fn overlapping_function_symbols_are_refused_naming_both() {
    // Found by the `elf` fuzz target (2026-12-03): `mix_byte`'s size grown to cover
    // `hash_str`, and `.text` grown past both. A call from the tail of `.text` fell in no
    // placed unit, and the linker placed the whole section again on every lookup, until it
    // ran out of memory (3.4 GB from a 2.4 KB object).
    let mut obj = compile_bpf("globals");
    let st_size = st_size_at(&obj, "mix_byte");
    obj[st_size..st_size + 8].copy_from_slice(&0x4100_0000_0000_0070u64.to_le_bytes());
    let sh_size = sh_size_at(&obj, ".text");
    let grown = rd(&obj, sh_size, 8) + 0x200;
    obj[sh_size..sh_size + 8].copy_from_slice(&grown.to_le_bytes());
    let err = link_with_helper(&obj, &globals_sel()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
    assert_mentions(
        &err,
        &["section `.text`", "`mix_byte`", "`hash_str`", "overlap"],
    );
}

#[test]
fn a_call_target_without_a_symbol_is_the_stretch_between_functions() {
    // `mix_byte`'s symbol sized 0 (so it is not a function range): a call to it lands in no
    // function, and the unit placed for it must be the bytes between the functions around
    // it, not the whole section, which would copy `hash_str` a second time.
    let obj = compile_bpf("globals");
    let whole = link_with_helper(&obj, &globals_sel()).unwrap();
    let mut patched = obj.clone();
    let st_size = st_size_at(&obj, "mix_byte");
    patched[st_size..st_size + 8].copy_from_slice(&0u64.to_le_bytes());
    let linked = link_with_helper(&patched, &globals_sel()).unwrap();
    // Each link has its own global data: compare the code without `lddw` immediates.
    let no_addresses = |code: &[u8]| -> Vec<u8> {
        let mut c = code.to_vec();
        let mut i = 0;
        while i + 16 <= c.len() {
            if c[i] == 0x18 {
                c[i + 4..i + 8].fill(0);
                c[i + 12..i + 16].fill(0);
                i += 8;
            }
            i += 8;
        }
        c
    };
    assert_eq!(
        no_addresses(&linked.code),
        no_addresses(&whole.code),
        "the same code, nothing copied twice"
    );
    let names = |l: &Linked| -> Vec<String> { l.functions.iter().map(|f| f.0.clone()).collect() };
    assert!(
        names(&whole).contains(&"mix_byte".to_string()),
        "{:?}",
        names(&whole)
    );
    assert!(
        names(&linked).contains(&".text+0x0".to_string()),
        "the unnamed stretch is named by section and offset: {:?}",
        names(&linked)
    );
}
