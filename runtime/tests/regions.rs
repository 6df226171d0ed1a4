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
