//! Sandbox-contract tests on hand-encoded programs (the assembler lives in the testkit, which
//! depends on this crate; its tests cover the instruction semantics in the assembly dialect).

use super::*;

use packjit_frontend::encode_insn as ins;

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

fn code(v: &[[u8; 8]]) -> Vec<u8> {
    v.concat()
}

fn run(v: &[[u8; 8]], ctx: &mut [u8], budget: Option<u64>) -> Result<Outcome, Stop> {
    let vm = Interpreter::new().with_helper(5, ident);
    let p = vm.load(&code(v)).expect("verifies");
    vm.run(&p, ctx, budget)
}

extern "C" fn ident(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

#[test]
fn registers_start_zeroed_and_r1_r2_describe_the_context() {
    // r0 = r0 | r3 | ... | r9 — all zero at entry, whatever ran before on this thread.
    let mut v = vec![ins(0xb7, 0, 0, 0, 0)];
    for r in 3..=9 {
        v.push(ins(0x4f, 0, r, 0, 0));
    }
    v.push(EXIT);
    assert_eq!(run(&v, &mut [1, 2, 3], None).unwrap().r0, 0);
    let mut ctx = [0u8; 3];
    let addr = ctx.as_ptr() as u64;
    assert_eq!(
        run(&[ins(0xbf, 0, 1, 0, 0), EXIT], &mut ctx, None)
            .unwrap()
            .r0,
        addr
    );
    assert_eq!(
        run(&[ins(0xbf, 0, 2, 0, 0), EXIT], &mut ctx, None)
            .unwrap()
            .r0,
        3
    );
    // Empty memory: r1 = 0 and r2 = 0, as in rbpf.
    assert_eq!(
        run(
            &[ins(0xbf, 0, 1, 0, 0), ins(0x4f, 0, 2, 0, 0), EXIT],
            &mut [],
            None
        )
        .unwrap()
        .r0,
        0
    );
}

#[test]
fn stack_block_is_zeroed_real_memory_with_one_frame_per_call_level() {
    // Entry: r6 = r10; call f; r0 = *(u64 *)(r10 - 8) (written by f through r1); exit.
    // f: r0 = r6 - r10 (caller's r10 - callee's r10 = 512); *(u64 *)(r1 - 8) = 7; exit.
    let v = [
        ins(0xbf, 6, 10, 0, 0),  // mov r6, r10
        ins(0xbf, 1, 10, 0, 0),  // mov r1, r10
        ins(0x85, 0, 1, 0, 3),   // call local +3
        ins(0x79, 7, 10, -8, 0), // ldxdw r7, [r10-8]
        ins(0x0f, 0, 7, 0, 0),   // add r0, r7
        EXIT,
        ins(0xbf, 0, 6, 0, 0), // f: mov r0, r6 (the caller's r10: r6 is not saved by f)
        ins(0x1f, 0, 10, 0, 0), // sub r0, r10
        ins(0x7a, 1, 0, -8, 7), // stdw [r1-8], 7
        EXIT,
    ];
    assert_eq!(run(&v, &mut [], None).unwrap().r0, 512 + 7);
    // A fresh run sees a zeroed block (no bytes of the previous run leak in).
    let v = [
        ins(0x79, 0, 10, -8, 0), // ldxdw r0, [r10-8]
        ins(0x7a, 10, 0, -8, 99),
        EXIT,
    ];
    assert_eq!(run(&v, &mut [], None).unwrap().r0, 0);
    assert_eq!(run(&v, &mut [], None).unwrap().r0, 0);
}

#[test]
fn out_of_bounds_stops_with_pc_address_size_and_direction() {
    let mut ctx = [0u8; 8];
    let base = ctx.as_ptr() as u64;
    // Read one past the end.
    let e = run(&[ins(0x71, 0, 1, 8, 0), EXIT], &mut ctx, None).unwrap_err();
    assert_eq!(
        e,
        Stop::OutOfBounds {
            pc: 0,
            addr: base + 8,
            size: 1,
            write: false
        }
    );
    // Straddling the end is refused as a whole, and nothing is written.
    let e = run(&[ins(0x62, 1, 0, 6, -1), EXIT], &mut ctx, None).unwrap_err();
    assert!(matches!(
        e,
        Stop::OutOfBounds {
            pc: 0,
            size: 4,
            write: true,
            ..
        }
    ));
    assert_eq!(ctx, [0; 8]);
    // Null, and a wild pointer.
    let e = run(
        &[ins(0xb7, 2, 0, 0, 0), ins(0x79, 0, 2, 0, 0), EXIT],
        &mut ctx,
        None,
    )
    .unwrap_err();
    assert_eq!(
        e,
        Stop::OutOfBounds {
            pc: 1,
            addr: 0,
            size: 8,
            write: false
        }
    );
    // One byte above the entry frame (rbpf's test_vm_err_stack_out_of_bound).
    let e = run(&[ins(0x72, 10, 0, 0, 0), EXIT], &mut ctx, None).unwrap_err();
    assert!(
        matches!(
            e,
            Stop::OutOfBounds {
                pc: 0,
                write: true,
                ..
            }
        ),
        "{e}"
    );
    // The same stop type the runtime reports for JIT runs: kind, pc and direction.
    assert_eq!((e.kind(), e.pc()), (StopKind::OutOfBounds, 0));
    assert_eq!(
        e.direction(),
        Some(packjit_plugin_api::AccessDirection::Write)
    );
    // A wrapped address range is never inside anything.
    let v = [
        ins(0x18, 2, 0, 0, -1),
        ins(0, 0, 0, 0, -1),
        ins(0x79, 0, 2, 0, 0),
        EXIT,
    ];
    assert!(matches!(
        run(&v, &mut ctx, None).unwrap_err(),
        Stop::OutOfBounds {
            pc: 2,
            addr: u64::MAX,
            ..
        }
    ));
}

#[test]
fn host_regions_are_read_only_unless_writable() {
    let vm = Interpreter::new();
    let mut ro = [5u8, 6, 7, 8];
    let mut rw = [0u8; 8];
    let regions = [
        PjMemRegion {
            start: ro.as_mut_ptr() as u64,
            len: 4,
            flags: 0,
        },
        PjMemRegion {
            start: rw.as_mut_ptr() as u64,
            len: 8,
            flags: PJ_REGION_WRITABLE,
        },
    ];
    // r1 = ro, r2 = rw passed in the context: r0 = *(u32 *)ro; *(u32 *)rw = r0; exit.
    let mut ctx = [0u8; 16];
    ctx[..8].copy_from_slice(&regions[0].start.to_le_bytes());
    ctx[8..].copy_from_slice(&regions[1].start.to_le_bytes());
    let ok = code(&[
        ins(0x79, 2, 1, 0, 0),
        ins(0x79, 3, 1, 8, 0),
        ins(0x61, 0, 2, 0, 0),
        ins(0x63, 3, 0, 0, 0),
        EXIT,
    ]);
    let p = vm.load(&ok).unwrap();
    // SAFETY: both regions are live locals not otherwise borrowed during the run.
    let o = unsafe { vm.run_with_regions(&p, &mut ctx, &regions, None) }.unwrap();
    assert_eq!(o.r0, 0x0807_0605);
    assert_eq!(rw[..4], [5, 6, 7, 8]);
    let bad = code(&[ins(0x79, 2, 1, 0, 0), ins(0x72, 2, 0, 0, 1), EXIT]);
    let p = vm.load(&bad).unwrap();
    // SAFETY: as above.
    let e = unsafe { vm.run_with_regions(&p, &mut ctx, &regions, None) }.unwrap_err();
    assert_eq!(
        e,
        Stop::OutOfBounds {
            pc: 1,
            addr: regions[0].start,
            size: 1,
            write: true
        }
    );
    assert_eq!(ro, [5, 6, 7, 8]);
}

#[test]
fn budget_is_charged_at_back_edges_and_calls_exactly() {
    // r0 = 3; loop: r0 -= 1; jne r0, 0, loop (pc 2 -> pc 1 charges 2); exit.
    let v = [
        ins(0xb7, 0, 0, 0, 3),
        ins(0x07, 0, 0, 0, -1),
        ins(0x55, 0, 0, -2, 0),
        EXIT,
    ];
    // Two taken back-edges: 4 units.
    let o = run(&v, &mut [], Some(4)).unwrap();
    assert_eq!((o.r0, o.budget_left), (0, Some(0)));
    assert_eq!(run(&v, &mut [], Some(5)).unwrap().budget_left, Some(1));
    // One unit short: stops at the jump's pc (2), not at the target.
    assert_eq!(
        run(&v, &mut [], Some(3)).unwrap_err(),
        Stop::Budget { pc: 2 }
    );
    // An infinite loop stops; `ja -1` charges 1 per turn.
    assert_eq!(
        run(&[ins(0x05, 0, 0, -1, 0), EXIT], &mut [], Some(100)).unwrap_err(),
        Stop::Budget { pc: 0 }
    );
    // A call charges CALL_CHARGE; forward jumps are free.
    let v = [
        ins(0x05, 0, 0, 0, 0), // ja +0
        ins(0x85, 0, 1, 0, 1), // call local +1
        EXIT,
        ins(0xb7, 0, 0, 0, 9),
        EXIT,
    ];
    assert_eq!(run(&v, &mut [], Some(CALL_CHARGE)).unwrap().r0, 9);
    assert_eq!(
        run(&v, &mut [], Some(0)).unwrap_err(),
        Stop::Budget { pc: 1 }
    );
    // No budget: unlimited.
    assert_eq!(run(&v, &mut [], None).unwrap().budget_left, None);
}

#[test]
fn unknown_callx_stops_with_pc_and_id() {
    let v = [
        ins(0xb7, 1, 0, 0, 9),
        ins(0xb7, 2, 0, 0, 5),
        ins(0x8d, 2, 0, 0, 0), // callx r2 (helper 5: identity)
        ins(0xb7, 3, 0, 0, 77),
        ins(0x8d, 3, 0, 0, 0), // callx r3 (unknown)
        EXIT,
    ];
    assert_eq!(
        run(&v, &mut [], None).unwrap_err(),
        Stop::UnknownCallx { pc: 4, id: 77 }
    );
    let e = Stop::UnknownCallx { pc: 4, id: 77 };
    assert_eq!((e.kind(), e.pc()), (StopKind::UnknownCallx, 4));
    assert!(e.to_string().contains("77"), "{e}");
    assert_eq!(run(&[v[0], v[1], v[2], EXIT], &mut [], None).unwrap().r0, 9);
}

#[test]
fn interpreter_is_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<Interpreter>();
    both::<Stop>();
}

/// An interpreter with rbpf's packed frames: `usage` per function's first pc, else `default`.
fn packed(usage: &[(usize, u32)], default: u32) -> Interpreter {
    Interpreter::new().with_frame_layout(FrameLayout::Packed {
        usage: usage.iter().copied().collect(),
        default,
    })
}

/// Each function stores its r10 into the context, then calls the next; the entry stores its
/// r10 again after the call returns. Functions at pcs 0, 4 and 7.
fn r10_chain() -> Vec<u8> {
    code(&[
        ins(0x7b, 1, 10, 0, 0),  // 0: stxdw [r1+0], r10
        ins(0x85, 0, 1, 0, 2),   // 1: call local +2 (pc 4)
        ins(0x7b, 1, 10, 24, 0), // 2: stxdw [r1+24], r10
        EXIT,                    // 3
        ins(0x7b, 1, 10, 8, 0),  // 4: f: stxdw [r1+8], r10
        ins(0x85, 0, 1, 0, 1),   // 5: call local +1 (pc 7)
        EXIT,                    // 6
        ins(0x7b, 1, 10, 16, 0), // 7: g: stxdw [r1+16], r10
        EXIT,                    // 8
    ])
}

fn words(ctx: &[u8]) -> Vec<u64> {
    ctx.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn packed_frames_lower_r10_by_the_callers_usage_in_one_512_byte_block() {
    // The entry (pc 0) uses 64 bytes and f (pc 4) 136, so f's r10 is 64 below the entry's
    // and g's 136 below f's; g's own usage (8) is never used (g calls nothing). The block is
    // 512 bytes whatever the depth, and r10 comes back when a callee exits.
    let vm = packed(&[(0, 64), (4, 136), (7, 8)], 256);
    let prog = vm.load(&r10_chain()).unwrap();
    let mut ctx = [0u8; 32];
    let (r, span) = vm.run_traced(&prog, &mut ctx, None);
    r.unwrap();
    assert_eq!(span.end - span.start, 512);
    let top = span.end;
    assert_eq!(words(&ctx), [top, top - 64, top - 64 - 136, top]);
    // A function the map does not name takes the default: here f.
    let vm = packed(&[(0, 16)], 40);
    let prog = vm.load(&r10_chain()).unwrap();
    let (r, span) = vm.run_traced(&prog, &mut ctx, None);
    r.unwrap();
    assert_eq!(
        words(&ctx),
        [span.end, span.end - 16, span.end - 56, span.end]
    );
    // Separate frames (the default layout): 512 bytes each, whatever a calculator said.
    let vm = Interpreter::new();
    let prog = vm.load(&r10_chain()).unwrap();
    let (r, span) = vm.run_traced(&prog, &mut ctx, None);
    r.unwrap();
    assert_eq!(span.end - span.start, 3 * 512);
    assert_eq!(
        words(&ctx),
        [span.end, span.end - 512, span.end - 1024, span.end]
    );
}

/// The entry calls f (pc 2), which stores 8 bytes at `[r10 + off]`.
fn callee_store(off: i16) -> Vec<u8> {
    code(&[
        ins(0x85, 0, 1, 0, 1),       // 0: call local +1 (pc 2)
        EXIT,                        // 1
        ins(0x7a, 10, 0, off, 0xcd), // 2: stdw [r10+off], 0xcd
        EXIT,                        // 3
    ])
}

#[test]
fn a_packed_callee_may_touch_the_block_and_nothing_below_it() {
    // The entry uses 504 bytes: f's r10 is 8 bytes above the block's start, so its frame
    // holds exactly one u64.
    let vm = packed(&[(0, 504)], 256);
    let prog = vm.load(&callee_store(-8)).unwrap();
    let mut stack = Vec::new();
    vm.run_with_stack(&prog, &mut [], None, Some(&mut stack))
        .unwrap();
    assert_eq!(stack.len(), 512);
    assert_eq!(stack[..8], 0xcdu64.to_le_bytes());
    // Eight bytes lower is below the block: a stop at f's store, with the address, nothing
    // written.
    let prog = vm.load(&callee_store(-16)).unwrap();
    let (r, span2) = vm.run_traced(&prog, &mut [], None);
    assert_eq!(
        r.unwrap_err(),
        Stop::OutOfBounds {
            pc: 2,
            addr: span2.start - 8,
            size: 8,
            write: true
        }
    );
    // rbpf's test_stack_overflow: an entry using the whole stack leaves its callee none.
    let vm = packed(&[(0, 512)], 256);
    let prog = vm.load(&callee_store(-8)).unwrap();
    let (r, span3) = vm.run_traced(&prog, &mut [], None);
    assert_eq!(
        r.unwrap_err(),
        Stop::OutOfBounds {
            pc: 2,
            addr: span3.start - 8,
            size: 8,
            write: true
        }
    );
    // The same program with separate frames runs.
    let vm = Interpreter::new();
    let prog = vm.load(&callee_store(-16)).unwrap();
    vm.run(&prog, &mut [], None).unwrap();
}

#[test]
fn packed_usages_of_zero_unaligned_or_past_the_block_run_as_in_rbpf() {
    // The entry stores 5 at [r10-8], f stores at [r10-8] too, the entry reads its slot back.
    let v = code(&[
        ins(0x7a, 10, 0, -8, 5),                   // 0: stdw [r10-8], 5
        ins(0x85, 0, 1, 0, 2),                     // 1: call local +2 (pc 4)
        ins(0x79, 0, 10, -8, 0),                   // 2: ldxdw r0, [r10-8]
        EXIT,                                      // 3
        ins(0x18, 1, 0, 0, 0x5566_7788u32 as i32), // 4: lddw r1, 0x11223344_55667788
        ins(0, 0, 0, 0, 0x1122_3344),
        ins(0x7b, 10, 1, -8, 0), // 6: stxdw [r10-8], r1
        EXIT,                    // 7
    ]);
    // Zero: f's frame is the entry's, so f overwrites the entry's slot.
    let vm = packed(&[(0, 0)], 256);
    let prog = vm.load(&v).unwrap();
    assert_eq!(
        vm.run(&prog, &mut [], None).unwrap().r0,
        0x1122_3344_5566_7788
    );
    // 4 (not a multiple of 8): f's r10 is unaligned and its slot straddles the entry's. The
    // entry's u64 reads back f's value's high half (its bytes 4..8, at top-8..top-4) under
    // the zero high bytes of its own 5 (top-4..top).
    let vm = packed(&[(0, 4)], 256);
    let prog = vm.load(&v).unwrap();
    assert_eq!(vm.run(&prog, &mut [], None).unwrap().r0, 0x1122_3344);
    // Far past the block: f's r10 lies below it and f's store stops; a callee that touches
    // no stack runs, and the entry's r10 comes back whole.
    let vm = packed(&[(0, 40_000)], 256);
    let prog = vm.load(&v).unwrap();
    let (r, span) = vm.run_traced(&prog, &mut [], None);
    assert_eq!(
        r.unwrap_err(),
        Stop::OutOfBounds {
            pc: 6,
            addr: span.end - 40_000 - 8,
            size: 8,
            write: true
        }
    );
    let v = code(&[
        ins(0x7a, 10, 0, -8, 5), // stdw [r10-8], 5
        ins(0x85, 0, 1, 0, 2),   // call local +2
        ins(0x79, 0, 10, -8, 0), // ldxdw r0, [r10-8]
        EXIT,
        ins(0xb7, 0, 0, 0, 1), // f: mov r0, 1
        EXIT,
    ]);
    let prog = vm.load(&v).unwrap();
    assert_eq!(vm.run(&prog, &mut [], None).unwrap().r0, 5);
}

#[test]
fn packed_usage_keys_that_start_no_function_are_not_read() {
    // pc 1 (the call itself) and pc 9 (past the end) are keys, but the entry starts at pc 0
    // and f at pc 4: both take the default.
    let vm = packed(&[(1, 8), (9, 8)], 32);
    let prog = vm.load(&r10_chain()).unwrap();
    let mut ctx = [0u8; 32];
    let (r, span) = vm.run_traced(&prog, &mut ctx, None);
    r.unwrap();
    assert_eq!(
        words(&ctx),
        [span.end, span.end - 32, span.end - 64, span.end]
    );
}
