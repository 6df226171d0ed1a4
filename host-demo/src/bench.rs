//! JIT vs the rbpf interpreter on one compute-bound program, side by side in one run.

use packjit::{Arch, LoadOptions, Runtime};
use std::time::Instant;

/// A loop of ALU and stack-memory work: 10 eBPF instructions per iteration.
fn program(iterations: u64) -> String {
    format!(
        "
    lddw %r6, {iterations}
    mov %r0, 1
    mov %r7, 0
    stxdw [%r10-8], %r7
loop:
    ldxdw %r2, [%r10-8]
    add %r2, %r7
    xor %r2, %r0
    stxdw [%r10-8], %r2
    mul %r0, 1103515245
    add %r0, 12345
    rsh %r2, 3
    add %r7, 1
    jlt %r7, %r6, loop
    ldxdw %r1, [%r10-8]
    add %r0, %r1
    exit
"
    )
}

pub fn run(rt: &Runtime, iterations: u64) -> Result<(), String> {
    let Some(host) = Arch::host().filter(|a| rt.backends().iter().any(|b| b.arch == *a)) else {
        return Err(
            "no backend for this host: run the benchmark under qemu (scripts/bench.sh)".into(),
        );
    };
    let code = packjit_asm::asm::assemble(&program(iterations)).map_err(|e| e.to_string())?;
    let insns = iterations * 9 + 6;

    let opts = LoadOptions {
        arch: Some(host),
        ..Default::default()
    };
    // The first load also creates the arena's pack and warms the compiler's code paths (and,
    // under qemu, their translation); time the second.
    drop(rt.load(&code, &opts).map_err(|e| e.to_string())?);
    let t = Instant::now();
    let prog = rt.load(&code, &opts).map_err(|e| e.to_string())?;
    let compile = t.elapsed();
    let t = Instant::now();
    let jit = prog.call(&mut []).map_err(|e| e.to_string())?;
    let jit_time = t.elapsed();

    let vm = rbpf::EbpfVmNoData::new(Some(&code)).map_err(|e| format!("rbpf: {e}"))?;
    let t = Instant::now();
    let interp = vm.execute_program().map_err(|e| format!("rbpf: {e}"))?;
    let interp_time = t.elapsed();

    if jit != interp {
        return Err(format!(
            "results differ: JIT {jit:#x}, rbpf interpreter {interp:#x}"
        ));
    }
    let secs = |d: std::time::Duration| d.as_secs_f64().max(1e-9);
    println!("compute-bound loop on {host}: {iterations} iterations, {insns} eBPF instructions executed, result {jit:#x}");
    println!(
        "  verify+compile+commit: {:>6.3} ms ({} eBPF insns -> {} native insns, {} bytes)",
        compile.as_secs_f64() * 1e3,
        code.len() / 8,
        prog.native_insns(),
        prog.code_size()
    );
    println!(
        "  packjit JIT:      {:>10.3} ms  ({:.1} M eBPF insns/s)",
        jit_time.as_secs_f64() * 1e3,
        insns as f64 / secs(jit_time) / 1e6
    );
    println!(
        "  rbpf interpreter: {:>10.3} ms  ({:.1} M eBPF insns/s)",
        interp_time.as_secs_f64() * 1e3,
        insns as f64 / secs(interp_time) / 1e6
    );
    println!(
        "  speed-up JIT / interpreter: {:.1}x",
        secs(interp_time) / secs(jit_time)
    );
    Ok(())
}
