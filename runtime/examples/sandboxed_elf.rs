//! A clang-built eBPF object, run sandboxed: a result, a read past the packet stopped, and a
//! loop stopped by its instruction budget.
//!
//! ```sh
//! clang-19 -O2 -g -target bpf -mcpu=v4 -c examples/bpf/count.c -o /tmp/count.o
//! cargo run -p packjit --example sandboxed_elf -- /tmp/count.o
//! ```

use packjit::{Budget, ElfLoadOptions, LoadOptions, RunError, Runtime, Stop};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: sandboxed_elf <object.o> (built from examples/bpf/count.c)")?;
    let object = std::fs::read(path)?;

    // The host's backend is linked in (cargo feature `backend-<arch>`, on by default).
    let rt = Runtime::new()?;

    // Sandboxed is the default: every load and store is checked against the packet, the
    // stack and the object's globals.
    let count = rt.load_elf(
        &object,
        &ElfLoadOptions::section("pj/count"),
        &LoadOptions::default(),
    )?;
    let mut packet = *b"abcaxa";
    let n = count.call(&mut packet)?;
    println!("count(\"abcaxa\") = {n}");
    assert_eq!(n, 2);

    // A stop is an error value naming the pc and the access; the host carries on.
    let past_end = rt.load_elf(
        &object,
        &ElfLoadOptions::section("pj/past_end"),
        &LoadOptions::default(),
    )?;
    match past_end.call(&mut packet) {
        Err(RunError::Stop(stop @ Stop::OutOfBounds { .. })) => println!("past_end: {stop}"),
        other => return Err(format!("expected an out-of-bounds stop, got {other:?}").into()),
    }

    // The budget: instructions per call, charged at back-edges and calls. The loop over a
    // 4 KiB packet needs more than 1000.
    let bounded = rt.load_elf(
        &object,
        &ElfLoadOptions::section("pj/count"),
        &LoadOptions {
            budget: Budget::Limit(1000),
            ..Default::default()
        },
    )?;
    let mut big = vec![7u8; 4096];
    match bounded.call(&mut big) {
        Err(RunError::Stop(stop @ Stop::Budget { .. })) => println!("count(4 KiB): {stop}"),
        other => return Err(format!("expected a budget stop, got {other:?}").into()),
    }
    // The same program with a small packet stays within budget.
    assert_eq!(bounded.call(&mut packet)?, 2);
    Ok(())
}
