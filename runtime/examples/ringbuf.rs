//! A ring buffer: programs send events (here, each packet they see) and the host consumes
//! them in order, as with `BPF_MAP_TYPE_RINGBUF` in the kernel.
//!
//! `cargo run -p packjit --example ringbuf`

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{LoadOptions, Runtime};
use packjit_frontend::encode_insn as i;

/// `return bpf_ringbuf_output(&events, pkt, len, 0);`
fn program() -> Vec<u8> {
    [
        i(0xbf, 3, 2, 0, 0), // r3 = r2 (length)
        i(0xbf, 2, 1, 0, 0), // r2 = r1 (packet)
        i(0x18, 1, 1, 0, 0), // lddw r1, map 0 (the ring buffer)
        i(0, 0, 0, 0, 0),
        i(0xb7, 4, 0, 0, 0),   // r4 = 0 (flags)
        i(0x85, 0, 0, 0, 130), // call bpf_ringbuf_output: 0, or a negative errno
        i(0x95, 0, 0, 0, 0),   // exit
    ]
    .concat()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = Runtime::new()?;
    // 4 KiB of data area (a power-of-two number of pages, as in the kernel); keys and values
    // are unused for ring buffers.
    let events = Map::new(MapSpec {
        name: "events".into(),
        map_type: MapType::RingBuf,
        key_size: 0,
        value_size: 0,
        max_entries: 4096,
        flags: 0,
    })?;
    let prog = rt.load(
        &program(),
        &LoadOptions {
            maps: vec![events.clone()],
            ..Default::default()
        },
    )?;

    let packets: [&[u8]; 3] = [b"GET /", b"\x45\x00\x00\x54", b"hello, ring"];
    for p in packets {
        let r0 = prog.call(&mut p.to_vec())?;
        assert_eq!(r0, 0, "output succeeded");
    }

    // The helper checks its arguments against the sandbox too: data the program may not
    // read is refused with -EINVAL (-22), and nothing is sent.
    let oversized = [
        i(0xb7, 3, 0, 0, 1 << 20), // r3 = 1 MiB, far past the packet
        i(0xbf, 2, 1, 0, 0),
        i(0x18, 1, 1, 0, 0),
        i(0, 0, 0, 0, 0),
        i(0xb7, 4, 0, 0, 0),
        i(0x85, 0, 0, 0, 130),
        i(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let bad = rt.load(
        &oversized,
        &LoadOptions {
            maps: vec![events.clone()],
            ..Default::default()
        },
    )?;
    assert_eq!(bad.call(&mut [0u8; 16])? as i64, -22);

    // Consume: records in the order they were submitted.
    let mut got = Vec::new();
    let n = events.ringbuf_consume(&mut |record| got.push(record.to_vec()));
    for record in &got {
        println!("event: {:?}", String::from_utf8_lossy(record));
    }
    assert_eq!(n, packets.len());
    assert_eq!(got, packets.map(|p| p.to_vec()));
    Ok(())
}
