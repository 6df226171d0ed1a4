//! Per-CPU data: a `BPF_MAP_TYPE_PERCPU_ARRAY` whose lookup gives each CPU its own slot, so
//! threads counting events on different CPUs never share a cache line. The host reads every
//! CPU's value at once.
//!
//! `cargo run -p packjit --example percpu`

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{LoadOptions, Runtime};
use packjit_frontend::encode_insn as i;

const THREADS: u64 = 4;
const CALLS: u64 = 20_000;

/// `counter[0] += 1` on this CPU's slot of map 0.
fn program() -> Vec<u8> {
    [
        i(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0: the key
        i(0x18, 1, 1, 0, 0),   // lddw r1, map 0 (BPF_PSEUDO_MAP_FD, LoadOptions::maps[0])
        i(0, 0, 0, 0, 0),
        i(0xbf, 2, 10, 0, 0), // r2 = r10
        i(0x07, 2, 0, 0, -4), // r2 += -4
        i(0x85, 0, 0, 0, 1),  // call bpf_map_lookup_elem: this CPU's value
        i(0x15, 0, 0, 2, 0),  // if r0 == 0 goto +2
        i(0xb7, 1, 0, 0, 1),  // r1 = 1
        // Atomic although the slot is this CPU's: unlike the kernel, a user thread can be
        // preempted (and another run on this CPU) between a load and its store. Nobody else
        // writes the line, so the atomic costs little.
        i(0xdb, 0, 1, 0, 0), // lock *(u64 *)(r0 + 0) += r1
        i(0xb7, 0, 0, 0, 0), // r0 = 0
        i(0x95, 0, 0, 0, 0), // exit
    ]
    .concat()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = Runtime::new()?;
    let counter = Map::new(MapSpec {
        name: "counter".into(),
        map_type: MapType::PercpuArray,
        key_size: 4,
        value_size: 8,
        max_entries: 1,
        flags: 0,
    })?;
    let prog = rt.load(
        &program(),
        &LoadOptions {
            maps: vec![counter.clone()],
            ..Default::default()
        },
    )?;

    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..CALLS {
                    prog.call(&mut []).expect("runs");
                }
            });
        }
    });

    // The host's view of a per-CPU value: one 8-byte-aligned value per possible CPU.
    let all = counter.lookup(&0u32.to_le_bytes())?;
    let per_cpu: Vec<u64> = all
        .chunks(8)
        .map(|v| u64::from_le_bytes(v.try_into().expect("8 bytes")))
        .collect();
    for (cpu, n) in per_cpu.iter().enumerate().filter(|(_, n)| **n > 0) {
        println!("cpu {cpu:>3}: {n} calls");
    }
    let total: u64 = per_cpu.iter().sum();
    println!(
        "total: {total} calls on {} possible CPUs",
        Map::possible_cpus()
    );
    assert_eq!(total, THREADS * CALLS, "every call counted once");
    Ok(())
}
