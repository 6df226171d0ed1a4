//! Which host regions a sandboxed program may reach: the runtime-wide regions registered
//! before its load (later ones are not its business), plus its own from `LoadOptions`.
//! Programs loaded without regions of their own share the runtime's list, so these tests
//! pin down that sharing never leaks a region into a program that was not given it.

mod host;

use packjit::{LoadOptions, MemRegion, Program, RegionAccess, StopKind};
use packjit_frontend::encode_insn as ins;

/// `r0 = *(u64 *)addr; exit`.
fn read_at(addr: *const u64) -> Vec<u8> {
    let addr = addr as u64;
    [
        ins(0x18, 1, 0, 0, addr as i32),
        ins(0, 0, 0, 0, (addr >> 32) as i32),
        ins(0x79, 0, 1, 0, 0),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

fn region(word: &u64) -> MemRegion {
    // SAFETY: the word is a live `Box` of the test, read-only to programs, and outlives
    // every program given the region (declared after the boxes, they are dropped first).
    unsafe { MemRegion::new(word as *const u64 as *const u8, 8, RegionAccess::ReadOnly) }
}

fn own(regions: Vec<MemRegion>) -> LoadOptions {
    LoadOptions {
        regions,
        ..Default::default()
    }
}

fn reads(p: &Program) -> Result<u64, StopKind> {
    p.call(&mut [])
        .map_err(|e| e.stop().unwrap_or_else(|| panic!("not a stop: {e}")).kind())
}

#[test]
fn programs_keep_the_runtime_regions_of_their_load_and_add_their_own() {
    let rt = host::host_runtime();
    let (a, b) = (Box::new(0x1111_u64), Box::new(0x2222_u64));
    let (pa, pb): (*const u64, *const u64) = (&*a, &*b);

    let before = rt.load(&read_at(pa), &LoadOptions::default()).unwrap();
    rt.add_region(region(&a));
    let after = rt.load(&read_at(pa), &LoadOptions::default()).unwrap();
    let own_b_reads_b = rt.load(&read_at(pb), &own(vec![region(&b)])).unwrap();
    let own_b_reads_a = rt.load(&read_at(pa), &own(vec![region(&b)])).unwrap();
    let after_reads_b = rt.load(&read_at(pb), &LoadOptions::default()).unwrap();
    // Registered after all of the above: none of them may reach it.
    rt.add_region(region(&b));
    let last_reads_b = rt.load(&read_at(pb), &LoadOptions::default()).unwrap();

    assert_eq!(reads(&before), Err(StopKind::OutOfBounds));
    assert_eq!(reads(&after), Ok(0x1111));
    assert_eq!(reads(&own_b_reads_b), Ok(0x2222));
    assert_eq!(
        reads(&own_b_reads_a),
        Ok(0x1111),
        "the runtime's regions too"
    );
    assert_eq!(reads(&after_reads_b), Err(StopKind::OutOfBounds));
    assert_eq!(reads(&last_reads_b), Ok(0x2222));
    let counts: Vec<usize> = [
        &before,
        &after,
        &own_b_reads_b,
        &after_reads_b,
        &last_reads_b,
    ]
    .iter()
    .map(|p| p.regions().len())
    .collect();
    assert_eq!(counts, [0, 1, 2, 1, 2]);
}

/// `r0 = *(u64 *)(addr + off)` (or, with `store`, `*(u64 *)(addr + off) = 7; r0 = 0`); exit.
fn access_at(addr: u64, off: i16, store: bool) -> Vec<u8> {
    [
        ins(0x18, 1, 0, 0, addr as i32),
        ins(0, 0, 0, 0, (addr >> 32) as i32),
        if store {
            ins(0x7a, 1, 0, off, 7) // *(u64 *)(r1 + off) = 7
        } else {
            ins(0x79, 0, 1, off, 0)
        },
        if store {
            ins(0xb7, 0, 0, 0, 0)
        } else {
            ins(0x05, 0, 0, 0, 0) // ja +0
        },
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

/// `r0 = table[ctx[0] & mask]`, 8-byte entries: an index only known at run time, bounded by
/// its mask.
fn masked_index(addr: u64, mask: i32) -> Vec<u8> {
    [
        ins(0x71, 2, 1, 0, 0),    // r2 = *(u8 *)(r1 + 0)
        ins(0x57, 2, 0, 0, mask), // r2 &= mask
        ins(0x67, 2, 0, 0, 3),    // r2 <<= 3
        ins(0x18, 3, 0, 0, addr as i32),
        ins(0, 0, 0, 0, (addr >> 32) as i32),
        ins(0x0f, 3, 2, 0, 0), // r3 += r2
        ins(0x79, 0, 3, 0, 0),
        ins(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn accesses_proven_inside_a_region_run_unchecked_and_the_rest_stay_checked() {
    let rt = host::host_runtime();
    let table: Box<[u64; 16]> = Box::new(std::array::from_fn(|k| 100 + k as u64));
    let cells: Box<[std::cell::UnsafeCell<u64>; 4]> = Box::default();
    let (t, c) = (table.as_ptr() as u64, cells.as_ptr() as u64);
    // SAFETY: both boxes outlive every program given the regions (declared before them);
    // the cells are only written by programs, through raw pointers (`UnsafeCell`).
    let (ro, rw) = unsafe {
        (
            MemRegion::new(t as *const u8, 16 * 8, RegionAccess::ReadOnly),
            MemRegion::new(c as *const u8, 4 * 8, RegionAccess::ReadWrite),
        )
    };
    let with = own(vec![ro, rw]);
    let load = |code: &[u8], opts: &LoadOptions| rt.load(code, opts).unwrap();

    // In bounds at a constant offset: right, and shorter than the same access checked.
    let proven = load(&access_at(t, 15 * 8, false), &with);
    assert_eq!(reads(&proven), Ok(115));
    let checked = load(&access_at(t, 15 * 8, false), &LoadOptions::default());
    assert_eq!(reads(&checked), Err(StopKind::OutOfBounds));
    assert!(
        proven.native_insns() < checked.native_insns(),
        "proven {} vs checked {}",
        proven.native_insns(),
        checked.native_insns()
    );
    // One byte past the end, and before the start: still checked, so they stop.
    assert_eq!(
        reads(&load(&access_at(t, 15 * 8 + 1, false), &with)),
        Err(StopKind::OutOfBounds)
    );
    assert_eq!(
        reads(&load(&access_at(t, -8, false), &with)),
        Err(StopKind::OutOfBounds)
    );
    // A write: proven in the writable region, still checked (and refused) in the read-only
    // one.
    let store = load(&access_at(c, 8, true), &with);
    assert_eq!(reads(&store), Ok(0));
    // SAFETY: no program runs now; the cell is plain memory.
    assert_eq!(unsafe { *cells[1].get() }, 7);
    let read_only = load(&access_at(t, 0, true), &with);
    assert_eq!(reads(&read_only), Err(StopKind::OutOfBounds));
    assert_eq!(table[0], 100, "the read-only table is unchanged");
    assert!(
        store.native_insns() < read_only.native_insns(),
        "a proven store is shorter than a checked one"
    );

    // A masked run-time index: proven when every index fits, checked when the mask reaches
    // past the table (index 16..31 of a 16-entry table stops).
    let fits = load(&masked_index(t, 15), &with);
    let reaches_past = load(&masked_index(t, 31), &with);
    for k in 0..16u8 {
        assert_eq!(fits.call(&mut [k]).unwrap(), 100 + k as u64);
        assert_eq!(reaches_past.call(&mut [k]).unwrap(), 100 + k as u64);
    }
    assert_eq!(
        reaches_past
            .call(&mut [16])
            .map_err(|e| e.stop().map(|s| s.kind())),
        Err(Some(StopKind::OutOfBounds))
    );
    assert!(fits.native_insns() < reaches_past.native_insns());
}
