//! The kernel helpers the runtime provides by id besides the map ones: `bpf_trace_printk`
//! (6) to the host's sink and `bpf_get_prandom_u32` (7), on the host's backend in both
//! modes.

mod host;

use packjit::{set_trace_sink, LoadOptions};
use packjit_frontend::encode_insn;
use std::sync::{Arc, Mutex};

fn i(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> Vec<u8> {
    encode_insn(op, dst, src, off, imm).to_vec()
}

/// Writes "v=%d %s\n\0" at r10-16 and "hi\0" at r10-24, then
/// `trace_printk(fmt, 16, -7, "hi")`; returns the helper's result.
fn printk_program() -> Vec<u8> {
    let word = |s: &[u8]| i64::from_le_bytes(s.try_into().unwrap());
    let fmt = b"v=%d %s\n\0\0\0\0\0\0\0\0";
    let mut code = Vec::new();
    for (k, chunk) in fmt.chunks(8).enumerate() {
        let w = word(chunk);
        code.extend(i(0x18, 1, 0, 0, w as u32 as i32));
        code.extend(i(0, 0, 0, 0, (w >> 32) as u32 as i32));
        code.extend(i(0x7b, 10, 1, -16 + 8 * k as i16, 0));
    }
    code.extend(i(0x62, 10, 0, -24, i32::from_le_bytes(*b"hi\0\0")));
    code.extend(i(0xbf, 1, 10, 0, 0));
    code.extend(i(0x07, 1, 0, 0, -16));
    code.extend(i(0xb7, 2, 0, 0, 16));
    code.extend(i(0xb7, 3, 0, 0, -7));
    code.extend(i(0xbf, 4, 10, 0, 0));
    code.extend(i(0x07, 4, 0, 0, -24));
    code.extend(i(0x85, 0, 0, 0, 6));
    code.extend(i(0x95, 0, 0, 0, 0));
    code
}

#[test]
fn trace_printk_formats_to_the_hosts_sink_and_checks_its_pointers() {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = lines.clone();
    set_trace_sink(Some(Arc::new(move |l: &str| {
        seen.lock().unwrap().push(l.to_string())
    })));
    let rt = host::host_runtime();
    let opts = LoadOptions::default();
    let sandboxed = rt.load(&printk_program(), &opts).unwrap();
    // SAFETY: the program reads only its own stack.
    let trusted = unsafe { rt.load_trusted(&printk_program(), &opts) }.unwrap();
    for p in [&sandboxed, &trusted] {
        assert_eq!(p.call(&mut []).unwrap(), "v=-7 hi\n".len() as u64);
    }
    assert_eq!(*lines.lock().unwrap(), vec!["v=-7 hi\n"; 2]);
    // Sandboxed: a format outside the program's memory fails the call and prints nothing.
    let wild = [
        i(0xb7, 1, 0, 0, 0x1000),
        i(0xb7, 2, 0, 0, 8),
        i(0x85, 0, 0, 0, 6),
        i(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let r0 = rt.load(&wild, &opts).unwrap().call(&mut []).unwrap();
    assert_eq!(r0 as i64, -22);
    assert_eq!(lines.lock().unwrap().len(), 2);
    set_trace_sink(None);
}

#[test]
fn prandom_gives_32_bit_values_that_vary() {
    let rt = host::host_runtime();
    let code = [i(0x85, 0, 0, 0, 7), i(0x95, 0, 0, 0, 0)].concat();
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let values: std::collections::BTreeSet<u64> =
        (0..64).map(|_| p.call(&mut []).unwrap()).collect();
    assert!(values.iter().all(|&v| v <= u32::MAX as u64));
    assert!(values.len() > 60, "{} distinct of 64", values.len());
}

/// `r0 = bpf_loop(mem[0] as nr_loops, sum, ctx = &mem[8..16] accumulator, flags = mem[1])`;
/// the callback adds its index to the u64 at ctx and stops (returns 1) at index mem[2].
fn loop_program() -> Vec<u8> {
    [
        i(0xbf, 6, 1, 0, 0), // r6 = mem
        i(0x71, 1, 6, 0, 0), // r1 = nr_loops
        i(0x18, 2, 4, 0, 5), // r2 = the callback (pc 2 + 1 + 5 = 8)
        i(0, 0, 0, 0, 0),
        i(0xbf, 3, 6, 0, 0),   // r3 = ctx = mem
        i(0x71, 4, 6, 1, 0),   // r4 = flags
        i(0x85, 0, 0, 0, 181), // bpf_loop
        i(0x95, 0, 0, 0, 0),
        // pc 8, the callback: r1 = index, r2 = ctx.
        i(0x79, 3, 2, 8, 0), // r3 = *(u64 *)(ctx + 8)
        i(0x0f, 3, 1, 0, 0), // r3 += index
        i(0x7b, 2, 3, 8, 0),
        i(0x71, 4, 2, 2, 0), // r4 = stop index
        i(0xb7, 0, 0, 0, 0),
        i(0x5d, 1, 4, 1, 0), // if index != stop skip
        i(0xb7, 0, 0, 0, 1), // stop
        i(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn bpf_loop_calls_back_as_the_kernel_does() {
    let rt = host::host_runtime();
    let opts = LoadOptions::default();
    let sandboxed = rt.load(&loop_program(), &opts).unwrap();
    // SAFETY: the program touches only its context and stack.
    let trusted = unsafe { rt.load_trusted(&loop_program(), &opts) }.unwrap();
    for p in [&sandboxed, &trusted] {
        // (nr_loops, flags, stop) → (r0, sum)
        for (n, flags, stop, r0, sum) in [
            (10u8, 0u8, 255u8, 10i64, 45u64),
            (10, 0, 3, 4, 6),
            (0, 0, 0, 0, 0),
            (5, 1, 255, -22, 0),
        ] {
            let mut mem = [0u8; 16];
            mem[..3].copy_from_slice(&[n, flags, stop]);
            let got = p.call(&mut mem).unwrap() as i64;
            assert_eq!(got, r0, "n {n} flags {flags} stop {stop}");
            assert_eq!(u64::from_le_bytes(mem[8..].try_into().unwrap()), sum);
        }
    }
    // A callback that is not a function address in the block is refused naming the pc.
    let mut bad = loop_program();
    bad[16..32].copy_from_slice(&[i(0xb7, 2, 0, 0, 10), i(0x05, 0, 0, 0, 0)].concat());
    let e = rt.load(&bad, &opts).unwrap_err().to_string();
    assert!(e.contains("pc 6") && e.contains("bpf_loop"), "{e}");
}
