//! Loop-invariant checks: a check group that a loop's back-edge re-enters with its base
//! unchanged is checked once per loop entry (`packjit_frontend::ranges::reentries`). These
//! tests run the host's backend (natively, or under qemu-user for arm64 and RV64) on the
//! case that makes skipping subtle: the group's widened context check fails on the first
//! iteration, its checked copy finds the far member in a host region, and the later
//! iterations run the members unchecked. The answers must be the reference's: every
//! iteration's loads, and a stop at the first iteration for a write the region refuses.

mod host;

use packjit::{LoadOptions, MemRegion, RegionAccess, Runtime, Stop};
use packjit_frontend::encode_insn as ins;

fn runtime() -> Runtime {
    host::host_runtime()
}

/// `ITERS` times: r2 = *(u32 *)(r1 + 4) ; then `far` (an access at r1 + 24) ; r0 += r2 + r3.
fn loop_program(far: [u8; 8]) -> Vec<u8> {
    [
        ins(0xb7, 0, 0, 0, 0),     // 0: r0 = 0
        ins(0xb7, 6, 0, 0, ITERS), // 1: r6 = ITERS
        ins(0x61, 2, 1, 4, 0),     // 2: loop: r2 = *(u32 *)(r1 + 4)
        far,                       // 3
        ins(0x0f, 0, 2, 0, 0),     // 4: r0 += r2
        ins(0x0f, 0, 3, 0, 0),     // 5: r0 += r3
        ins(0x17, 6, 0, 0, 1),     // 6: r6 -= 1
        ins(0x55, 6, 0, -6, 0),    // 7: if r6 != 0 goto loop
        ins(0x95, 0, 0, 0, 0),     // 8: exit
    ]
    .concat()
}

const ITERS: i32 = 3;
const CTX_LEN: usize = 16;

/// A 64-byte buffer: the context is its first 16 bytes, the host region the other 48.
struct Buffer(*mut u8);

impl Buffer {
    fn new() -> Self {
        let b: Box<[u8; 64]> = Box::new(std::array::from_fn(|i| (i * 7 + 3) as u8));
        Buffer(Box::into_raw(b) as *mut u8)
    }

    fn region(&self, access: RegionAccess) -> MemRegion {
        // SAFETY: bytes 16..64 of the buffer, live until `drop`; the test keeps no reference
        // to them across a call (it reads them through the raw pointer afterwards).
        unsafe { MemRegion::new(self.0.add(CTX_LEN), 64 - CTX_LEN, access) }
    }

    fn ctx(&mut self) -> &mut [u8] {
        // SAFETY: bytes 0..16, disjoint from the region's bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0, CTX_LEN) }
    }

    fn byte(&self, i: usize) -> u8 {
        // SAFETY: i < 64, inside the live buffer.
        unsafe { *self.0.add(i) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw in `new`, dropped once.
        drop(unsafe { Box::from_raw(self.0 as *mut [u8; 64]) });
    }
}

fn load(rt: &Runtime, code: &[u8], region: MemRegion) -> packjit::Program {
    let opts = LoadOptions {
        regions: vec![region],
        ..Default::default()
    };
    rt.load(code, &opts).unwrap()
}

#[test]
fn the_analysis_finds_the_back_edge() {
    let code = loop_program(ins(0x71, 3, 1, 24, 0));
    let prog = packjit_frontend::decode(&code, &[]).unwrap();
    let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
    assert_eq!(plan.groups.len(), 1, "{plan:?}");
    assert_eq!(plan.groups[0].members, vec![2, 3]);
    // 24 + 1 > 16: the widened context check fails on every context of 16 bytes.
    assert_eq!(
        plan.groups[0].check,
        packjit_frontend::ranges::AccessCheck::CtxConst { end: 25 }
    );
    assert_eq!(plan.reentries, vec![(7, 0)]);
}

#[test]
fn reads_validated_through_a_host_region_repeat_correctly() {
    let rt = runtime();
    let mut buf = Buffer::new();
    let p = load(
        &rt,
        &loop_program(ins(0x71, 3, 1, 24, 0)), // r3 = *(u8 *)(r1 + 24)
        buf.region(RegionAccess::ReadOnly),
    );
    let word = u32::from_le_bytes([buf.byte(4), buf.byte(5), buf.byte(6), buf.byte(7)]);
    let want = ITERS as u64 * (word as u64 + buf.byte(24) as u64);
    for _ in 0..3 {
        assert_eq!(p.call(buf.ctx()).unwrap(), want);
    }
}

#[test]
fn a_refused_write_stops_on_the_first_iteration() {
    let rt = runtime();
    let mut buf = Buffer::new();
    let before = buf.byte(24);
    // *(u8 *)(r1 + 24) = 9 into a read-only region: the copy's check stops at pc 3.
    let p = load(
        &rt,
        &loop_program(ins(0x72, 1, 0, 24, 9)),
        buf.region(RegionAccess::ReadOnly),
    );
    let e = p.call(buf.ctx()).unwrap_err();
    assert_eq!(
        e.stop(),
        Some(Stop::OutOfBounds {
            pc: 3,
            addr: buf.0 as u64 + 24,
            size: 1,
            write: true
        }),
        "{e}"
    );
    assert_eq!(buf.byte(24), before, "a refused write must not land");
}

#[test]
fn an_allowed_write_lands_and_the_loop_goes_on() {
    let rt = runtime();
    let mut buf = Buffer::new();
    let p = load(
        &rt,
        &loop_program(ins(0x72, 1, 0, 24, 9)),
        buf.region(RegionAccess::ReadWrite),
    );
    let word = u32::from_le_bytes([buf.byte(4), buf.byte(5), buf.byte(6), buf.byte(7)]);
    // r3 stays 0: only r2 is summed.
    assert_eq!(p.call(buf.ctx()).unwrap(), ITERS as u64 * word as u64);
    assert_eq!(buf.byte(24), 9);
}

/// Regression (arm64 group differential, seed 0xae4): a group whose first member stores an
/// immediate. The widened check must come before the immediate is materialised, or the
/// re-entering jump, which lands right after the check, stores whatever the scratch register
/// last held (here: r10, from the stack store).
#[test]
fn a_reentered_group_starting_with_an_immediate_store_stores_it_every_time() {
    let rt = runtime();
    let code = [
        ins(0xb7, 6, 0, 0, 3),    // 0: r6 = 3
        ins(0x62, 1, 0, 0, 7),    // 1: loop: *(u32 *)(r1 + 0) = 7
        ins(0x61, 2, 1, 4, 0),    // 2: r2 = *(u32 *)(r1 + 4)
        ins(0x7b, 10, 10, -8, 0), // 3: *(u64 *)(r10 - 8) = r10
        ins(0x17, 6, 0, 0, 1),    // 4: r6 -= 1
        ins(0x55, 6, 0, -5, 0),   // 5: if r6 != 0 goto loop
        ins(0x61, 0, 1, 0, 0),    // 6: r0 = *(u32 *)(r1 + 0)
        ins(0x95, 0, 0, 0, 0),    // 7: exit
    ]
    .concat();
    let prog = packjit_frontend::decode(&code, &[]).unwrap();
    let plan = packjit_frontend::ranges::plan_accesses(&prog, true);
    assert_eq!(plan.reentries, vec![(5, 0)], "{plan:?}");
    assert_eq!(plan.groups[0].first, 1);
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    let mut ctx = [0xffu8; 16];
    assert_eq!(p.call(&mut ctx).unwrap(), 7);
    assert_eq!(&ctx[..8], &[7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
}
