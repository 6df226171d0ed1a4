//! Ring buffer: record layout, space accounting, wraparound, order, and a two-thread
//! producer/consumer stress.

mod common;

use common::map;
use packjit_maps::*;
use std::sync::Arc;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Reserve as a program does; the record pointer as an address.
fn reserve(m: &Map, size: u64) -> Option<usize> {
    // SAFETY: every record reserved here is submitted or discarded by the tests.
    let p = unsafe { m.ringbuf_reserve_raw(size, 0) };
    (!p.is_null()).then_some(p as usize)
}

fn fill(rec: usize, bytes: &[u8]) {
    // SAFETY: rec came from reserve of at least bytes.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), rec as *mut u8, bytes.len()) };
}

fn submit(m: &Map, rec: usize) {
    // SAFETY: rec was reserved from m and not yet submitted.
    unsafe { m.ringbuf_submit_raw(rec as *mut u8, 0) };
}

fn discard(m: &Map, rec: usize) {
    // SAFETY: as submit.
    unsafe { m.ringbuf_discard_raw(rec as *mut u8, BPF_RB_NO_WAKEUP) };
}

fn header(rec: usize) -> (u32, u32) {
    // SAFETY: a record's 8-byte header precedes its data inside the data area.
    unsafe {
        (
            ((rec - 8) as *const u32).read(),
            ((rec - 4) as *const u32).read(),
        )
    }
}

fn output(m: &Map, bytes: &[u8], flags: u64) -> i64 {
    // SAFETY: bytes is readable for its length.
    unsafe { m.ringbuf_output_raw(bytes.as_ptr(), bytes.len() as u64, flags) }
}

fn drain(m: &Map) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    m.ringbuf_consume(&mut |r| out.push(r.to_vec()));
    out
}

#[test]
fn record_layout_and_space_accounting() {
    let size = page();
    let m = map("rb", MapType::RingBuf, 0, 0, size as u32);
    let regions = m.value_regions();
    assert_eq!(regions.len(), 1);
    let (base, len, writable) = regions[0];
    assert_eq!((len, writable), (2 * size, true));
    let base = base as usize;
    assert_eq!(m.ringbuf_query(BPF_RB_RING_SIZE), size as u64);
    assert_eq!(m.ringbuf_query(99), 0);
    // SAFETY: flags must be 0.
    assert!(unsafe { m.ringbuf_reserve_raw(8, 1) }.is_null());

    // Header {len | BUSY, pg_off}, data 8 bytes after it, rounded to 8.
    let a = reserve(&m, 5).unwrap();
    assert_eq!(a, base + 8);
    assert_eq!(header(a), (5 | BPF_RINGBUF_BUSY_BIT, 0));
    assert_eq!(m.ringbuf_query(BPF_RB_PROD_POS), 16);
    let b = reserve(&m, 16).unwrap();
    assert_eq!(b, base + 16 + 8);
    // Nothing is delivered while the first record is busy, even with the second submitted.
    fill(b, &[2; 16]);
    submit(&m, b);
    assert_eq!(header(b), (16, 0));
    assert!(drain(&m).is_empty());
    fill(a, b"hello");
    submit(&m, a);
    assert_eq!(drain(&m), vec![b"hello".to_vec(), vec![2; 16]]);
    assert_eq!(m.ringbuf_query(BPF_RB_CONS_POS), 40);
    assert_eq!(m.ringbuf_query(BPF_RB_AVAIL_DATA), 0);

    // Space: the producer may run at most size - 1 bytes ahead (kernel rule), so with the
    // consumer at 40, records up to size - 8 in total fit.
    let big = (size - 8 - 8) as u64; // one record of size - 8 bytes with its header
    let c = reserve(&m, big).unwrap();
    assert!(
        reserve(&m, 0).is_none(),
        "full: producer - consumer would reach size"
    );
    assert_eq!(output(&m, b"x", 0), -11, "output reports EAGAIN when full");
    assert_eq!(output(&m, b"x", 4), -22, "unknown output flags");
    // The record wraps past the end of the data area and is contiguous (second view).
    assert!(c + big as usize > base + size);
    let pattern: Vec<u8> = (0..big).map(|i| i as u8).collect();
    fill(c, &pattern);
    // Its header's pg_off counts pages from the data area's start.
    assert_eq!(header(c).1 as usize, (c - 8 - base) / page());
    // Discarded: holds space until the consumer passes it, delivers nothing.
    discard(&m, c);
    assert_eq!(header(c).0, big as u32 | BPF_RINGBUF_DISCARD_BIT);
    assert!(
        reserve(&m, 0).is_none(),
        "a discarded record still holds its space"
    );
    assert!(drain(&m).is_empty());
    assert_eq!(m.ringbuf_query(BPF_RB_AVAIL_DATA), 0);
    // Now the space is back; a wrapped record's bytes read back contiguously.
    let d = reserve(&m, big).unwrap();
    fill(d, &pattern);
    submit(&m, d);
    let got = drain(&m);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0], pattern);
    // Too large for the ring at all.
    assert!(reserve(&m, size as u64).is_none());
    // Output round trip, in order.
    for i in 0..10u8 {
        assert_eq!(output(&m, &[i; 3], BPF_RB_FORCE_WAKEUP), 0);
    }
    assert_eq!(drain(&m), (0..10u8).map(|i| vec![i; 3]).collect::<Vec<_>>());
}

#[test]
fn pending_records_bound_the_producer() {
    // A busy record behind the consumer position also bounds the producer (kernel
    // pending_pos): everything after it must fit within size - 1 of it.
    let size = page();
    let m = map("rbp", MapType::RingBuf, 0, 0, size as u32);
    let a = reserve(&m, 8).unwrap();
    let mut n = 0;
    while let Some(r) = reserve(&m, 64) {
        submit(&m, r);
        n += 1;
    }
    assert_eq!(n, (size - 16 - 1) / 72);
    assert!(
        drain(&m).is_empty(),
        "the busy first record blocks the consumer"
    );
    submit(&m, a);
    assert_eq!(drain(&m).len(), n + 1);
}

#[test]
fn producer_consumer_stress() {
    let size = page() * 2;
    let m = map("rbs", MapType::RingBuf, 0, 0, size as u32);
    const PER: u64 = 20_000;
    let producers: Vec<_> = (0..2u64)
        .map(|t| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                let mut i = 0;
                while i < PER {
                    // Variable sizes so records wrap at every offset.
                    let len = 8 + (i % 29) as usize;
                    let mut rec = vec![(i % 251) as u8; len];
                    rec[..8].copy_from_slice(&(t << 60 | i).to_le_bytes());
                    if i % 7 == 3 {
                        match reserve(&m, len as u64) {
                            Some(r) => {
                                fill(r, &rec);
                                discard(&m, r);
                            }
                            None => {
                                std::thread::yield_now();
                                continue;
                            }
                        }
                    } else if output(&m, &rec, 0) != 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let mut next = [0u64; 2];
    let mut got = 0u64;
    let expected = 2 * (PER - (0..PER).filter(|i| i % 7 == 3).count() as u64);
    let start = std::time::Instant::now();
    while got < expected {
        let n = m.ringbuf_consume(&mut |r| {
            let tag = u64::from_le_bytes(r[..8].try_into().unwrap());
            let (t, i) = ((tag >> 60) as usize, tag & ((1 << 60) - 1));
            // Per producer, records arrive in order, discarded ones skipped.
            while next[t] % 7 == 3 {
                next[t] += 1;
            }
            assert_eq!(i, next[t], "producer {t}");
            assert_eq!(r.len(), 8 + (i % 29) as usize);
            assert!(r[8..].iter().all(|&b| b == (i % 251) as u8));
            next[t] += 1;
        });
        got += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
        assert!(
            start.elapsed().as_secs() < 60,
            "stalled at {got}/{expected}"
        );
    }
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(got, expected);
    assert_eq!(m.ringbuf_consume(&mut |_| panic!("nothing left")), 0);
    assert_eq!(m.ringbuf_query(BPF_RB_AVAIL_DATA), 0);
}
