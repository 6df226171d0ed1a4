//! Arbitrary bytes → the ELF loader (`packjit::elf::link`), selecting a program by section
//! and by function name; whatever links goes through the verifier. A panic, a hang or an
//! error without the `ELF: ` prefix is a finding. Seeds: compile `tests/bpf/*.c` with
//! `clang -O2 -target bpf -mcpu=v4 -c` into the corpus directory. The same entry runs on
//! stable, over corrupted real objects, in `runtime/tests/elf_errors.rs`.
#![no_main]

use packjit::elf::{link, ElfLoadOptions};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for sel in [
        ElfLoadOptions::section("pj/globals"),
        ElfLoadOptions::section(".text"),
        ElfLoadOptions::function("prog_calls"),
    ] {
        match link(data, &sel, &|name| (name == "pj_mix").then_some(1)) {
            Ok(l) => {
                let _ = packjit::decode(&l.code, &[]);
            }
            Err(e) => assert!(e.message.starts_with("ELF: "), "{e}"),
        }
    }
});
