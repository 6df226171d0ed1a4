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
