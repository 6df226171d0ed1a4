//! Arbitrary bytes → the ELF loader (`packjit::elf::link`), selecting a program by section
//! and by function name; whatever links goes through the verifier. The object's maps too:
//! `.maps` (BTF) and `maps` definitions through `elf_maps`, and the maps they describe
//! created as an `ElfObject` would. A panic, a hang or an
//! error without the `ELF: ` prefix is a finding. Seeds: compile `tests/bpf/*.c` with
//! `clang -O2 -target bpf -mcpu=v4 -c` into the corpus directory. The same entry runs on
//! stable, over corrupted real objects, in `runtime/tests/elf_errors.rs`.
#![no_main]

use packjit::elf::{create_maps, elf_maps, link, ElfLoadOptions};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    match elf_maps(data) {
        // Sizes the maps crate accepts are allocated: keep what a fuzz input may ask for
        // small, so the run measures parsing rather than allocation.
        Ok(defs) if defs.iter().all(|d| d.max_entries <= 4096 && d.value_size <= 4096) => {
            if let Err(e) = create_maps(&defs) {
                assert!(e.message.starts_with("ELF: "), "{e}");
            }
        }
        Ok(_) => {}
        Err(e) => assert!(e.message.starts_with("ELF: "), "{e}"),
    }
    for sel in [
        ElfLoadOptions::section("pj/globals"),
        ElfLoadOptions::section(".text"),
        ElfLoadOptions::function("prog_calls"),
        ElfLoadOptions::section("pj/count"),
        ElfLoadOptions::section("pj/a"),
    ] {
        match link(data, &sel, &|name| (name == "pj_mix").then_some(1)) {
            Ok(l) => {
                let _ = packjit::decode(&l.code, &[]);
            }
            Err(e) => assert!(e.message.starts_with("ELF: "), "{e}"),
        }
    }
});
