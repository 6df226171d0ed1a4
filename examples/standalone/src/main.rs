//! A first packjit program in a crate of its own: load a clang-built eBPF object, run it
//! sandboxed, and watch the sandbox stop an out-of-bounds read.
//!
//! ```sh
//! clang-19 -O2 -g -target bpf -mcpu=v4 -c ../bpf/count.c -o count.o
//! cargo run -- count.o
//! ```

use packjit::{ElfLoadOptions, LoadOptions, RunError, Runtime, Stop};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: packjit-standalone <object.o> (built from examples/bpf/count.c)")?;
    let object = std::fs::read(&path)?;

    // `packjit`'s default features link the host's backend in: no plugin to find.
    let rt = Runtime::new()?;
    println!("backends: {:?}", rt.backends());

    // Loads are sandboxed unless asked otherwise: the program may touch only its packet,
    // its stack and its own globals.
    let count = rt.load_elf(
        &object,
        &ElfLoadOptions::section("pj/count"),
        &LoadOptions::default(),
    )?;
    let mut packet = *b"abcaxa";
    let n = count.call(&mut packet)?;
    println!("count({:?}) = {n}", std::str::from_utf8(&packet)?);
    assert_eq!(n, 2, "two bytes after the first equal it");
    assert!(count.is_executable(), "native code for this host");

    let past_end = rt.load_elf(
        &object,
        &ElfLoadOptions::section("pj/past_end"),
        &LoadOptions::default(),
    )?;
    match past_end.call(&mut packet) {
        Err(RunError::Stop(Stop::OutOfBounds { pc, addr, size, .. })) => {
            println!("past_end: stopped at pc {pc}: {size}-byte read at {addr:#x}, refused");
            assert_eq!(addr, packet.as_ptr() as u64 + packet.len() as u64);
        }
        other => return Err(format!("past_end was not stopped: {other:?}").into()),
    }
    Ok(())
}
