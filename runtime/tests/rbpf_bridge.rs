//! rbpf hosts switching to packjit: rbpf 0.4.1's four VM flavours, with rbpf's API, run
//! rbpf's example programs (from its API docs and `tests/misc.rs`, `tests/ubpf_vm.rs`) with
//! rbpf's answers, sandboxed by default: natively where a backend targets the host, in
//! packjit's interpreter elsewhere (the x86-64 development host).

use packjit::rbpf_bridge::{
    c_thunk_for, EbpfVmFixedMbuff, EbpfVmMbuff, EbpfVmNoData, EbpfVmRaw, MAX_METADATA_LEN,
};
use packjit::{AccessDirection, Arch, Runtime, Stop, StopKind};
use rbpf::assembler::assemble;
use std::sync::Arc;

fn runtime() -> Arc<Runtime> {
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .unwrap();
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .unwrap();
    Arc::new(rt)
}

/// Does a backend of [`runtime`] target this host?
fn native_host() -> bool {
    runtime()
        .backends()
        .iter()
        .any(|b| Some(b.arch) == Arch::host())
}

/// The packjit load error inside an rbpf-style `io::Error`.
fn packjit_error(e: &std::io::Error) -> &packjit::Error {
    let inner = e.get_ref();
    (inner.and_then(|i| i.downcast_ref::<packjit::Error>()))
        .or_else(|| {
            inner
                .and_then(|i| i.downcast_ref::<packjit::rbpf_bridge::RbpfError>())
                .and_then(|r| r.load_error())
        })
        .unwrap_or_else(|| panic!("not a packjit error: {e}"))
}

/// The stop inside an rbpf-style `io::Error` from a run.
fn packjit_stop(e: &std::io::Error) -> Stop {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<packjit::rbpf_bridge::RbpfError>())
        .and_then(|r| r.run_error())
        .and_then(|r| r.stop())
        .unwrap_or_else(|| panic!("not a packjit stop: {e}"))
}

#[test]
fn raw_flavour_runs_rbpfs_examples() {
    // rbpf's EbpfVmRaw doc example.
    let prog = [
        0x71, 0x11, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, // ldxb r1[0x04], r1
        0x07, 0x01, 0x00, 0x00, 0x00, 0x22, 0x00, 0x00, // add r1, 0x22
        0xbf, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // mov r0, r1
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let mut mem = [0xaa, 0xbb, 0x11, 0x22, 0xcc, 0x27];
    for vm in [
        EbpfVmRaw::new(Some(&prog)).unwrap(),
        EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap(),
    ] {
        assert_eq!(vm.execute_program(&mut mem).unwrap(), 0x22cc);
    }
    // ubpf_vm.rs test_vm_ldxh_same_reg and test_vm_stxdw.
    let prog = assemble("mov r0, r1\nsth [r0], 0x1234\nldxh r0, [r0]\nexit").unwrap();
    let vm = EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap();
    assert_eq!(vm.execute_program(&mut [0xff, 0xff]).unwrap(), 0x1234);
    let prog = assemble(
        "lddw r2, -2005440939\nlsh r2, 32\nlddw r3, 0x11223344\nor r2, r3\n\
         stxdw [r1+2], r2\nldxdw r0, [r1+2]\nexit",
    )
    .unwrap();
    let mut mem = [
        0xaa, 0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xcc, 0xdd,
    ];
    let vm = EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap();
    assert_eq!(vm.execute_program(&mut mem).unwrap(), 0x8877665511223344);
    // ubpf_vm.rs test_vm_subnet (a packet parser).
    let prog = assemble(
        "mov r2, 0xe\nldxh r3, [r1+12]\njne r3, 0x81, +2\nmov r2, 0x12\nldxh r3, [r1+16]\n\
         and r3, 0xffff\njne r3, 0x8, +5\nadd r1, r2\nmov r0, 0x1\nldxw r1, [r1+16]\n\
         and r1, 0xffffff\njeq r1, 0x1a8c0, +1\nmov r0, 0x0\nexit",
    )
    .unwrap();
    let mut mem = [
        0x00, 0x00, 0xc0, 0x9f, 0xa0, 0x97, 0x00, 0xa0, 0xcc, 0x3b, 0xbf, 0xfa, 0x08, 0x00, 0x45,
        0x10, 0x00, 0x3c, 0x46, 0x3c, 0x40, 0x00, 0x40, 0x06, 0x73, 0x1c, 0xc0, 0xa8, 0x01, 0x02,
        0xc0, 0xa8, 0x01, 0x01, 0x06, 0x0e, 0x00, 0x17, 0x99, 0xc5, 0xa0, 0xec, 0x00, 0x00, 0x00,
        0x00, 0xa0, 0x02, 0x7d, 0x78, 0xe0, 0xa3, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02,
        0x08, 0x0a, 0x00, 0x9c, 0x27, 0x24, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x00,
    ];
    let vm = EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap();
    assert_eq!(vm.execute_program(&mut mem).unwrap(), 0x1);
}

#[test]
// rbpf's own call shape passes `&mut mbuff` to a `&[u8]` parameter; it must keep compiling.
#[allow(clippy::unnecessary_mut_passed)]
fn mbuff_flavour_runs_rbpfs_example() {
    // rbpf's EbpfVmMbuff doc example: data and data_end at 8 and 24 of the metadata.
    let prog = [
        0x79, 0x11, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, // Load mem from mbuff into R1.
        0x69, 0x10, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, // ldhx r1[2], r0
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let mem = [0xaa, 0xbb, 0x11, 0x22, 0xcc, 0xdd];
    let mut mbuff = [0u8; 0x58];
    let start = mem.as_ptr() as u64;
    for (data, data_end) in [(8, 24), (0x40, 0x50)] {
        mbuff[data..data + 8].copy_from_slice(&start.to_le_bytes());
        mbuff[data_end..data_end + 8].copy_from_slice(&(start + mem.len() as u64).to_le_bytes());
    }
    for vm in [
        EbpfVmMbuff::new(Some(&prog)).unwrap(),
        EbpfVmMbuff::new_with_runtime(Some(&prog), runtime()).unwrap(),
    ] {
        // rbpf's call shape: `&mut mbuff` where the signature takes `&[u8]`.
        assert_eq!(vm.execute_program(&mem, &mut mbuff).unwrap(), 0x2211);
    }
    // The buffers are shared borrows: a store into `mem` is refused (out of bounds, a
    // write, at mem's address), the metadata r1 points to is a private copy.
    let prog = assemble("ldxdw r2, [r1+0x40]\nstb [r2], 1\nstb [r1], 7\nmov r0, 1\nexit").unwrap();
    let vm = EbpfVmMbuff::new_with_runtime(Some(&prog), runtime()).unwrap();
    let e = vm.execute_program(&mem, &mbuff).unwrap_err();
    let stop = packjit_stop(&e);
    assert_eq!(
        stop,
        Stop::OutOfBounds {
            pc: 1,
            addr: start,
            size: 1,
            write: true
        }
    );
    assert_eq!(stop.direction(), Some(AccessDirection::Write));
    assert_eq!(mem, [0xaa, 0xbb, 0x11, 0x22, 0xcc, 0xdd]);
    let prog = assemble("stb [r1], 7\nldxb r0, [r1]\nexit").unwrap();
    let vm = EbpfVmMbuff::new_with_runtime(Some(&prog), runtime()).unwrap();
    assert_eq!(vm.execute_program(&mem, &mbuff).unwrap(), 7);
    assert_eq!(mbuff[0], 0, "the caller's metadata is not written");
}

#[test]
fn fixed_mbuff_flavour_runs_rbpfs_examples() {
    // rbpf's EbpfVmFixedMbuff doc example.
    let prog = [
        0xb7, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // mov r0, 0
        0x79, 0x12, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, // load mem from r1[0x40] to r2
        0x07, 0x02, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, // add r2, 5
        0x79, 0x11, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00, // load mem_end from r1[0x50] to r1
        0x2d, 0x12, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // if r2 > r1 skip 1 instruction
        0x71, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // load r2 (= *(mem + 5)) into r0
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let mut mem = [0xaa, 0xbb, 0x11, 0x22, 0xcc, 0xdd];
    let mut vm = EbpfVmFixedMbuff::new(Some(&prog), 0x40, 0x50).unwrap();
    assert_eq!(vm.execute_program(&mut mem).unwrap(), 0xdd);
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), 0x40, 0x50, runtime()).unwrap();
    assert_eq!(vm.execute_program(&mut mem).unwrap(), 0xdd);
    // Too short: the bounds test in the program skips the load...
    assert_eq!(vm.execute_program(&mut mem[..4]).unwrap(), 0);
    // ...except that it is off by one (`data + 5 > data_end` lets a 5-byte packet through):
    // rbpf reads a byte past the packet; the sandbox stops the read at pc 5.
    let end = mem.as_ptr() as u64 + 5;
    let e = vm.execute_program(&mut mem[..5]).unwrap_err();
    assert_eq!(
        packjit_stop(&e),
        Stop::OutOfBounds {
            pc: 5,
            addr: end,
            size: 1,
            write: false
        },
        "{e}"
    );
    // misc.rs test_vm_mbuff-style program with a write through the data pointer: `mem` is
    // exclusively borrowed here, so it is a writable region.
    let prog = assemble("ldxdw r2, [r1+8]\nstb [r2+1], 0x42\nldxb r0, [r2+1]\nexit").unwrap();
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), 8, 16, runtime()).unwrap();
    assert_eq!(vm.execute_program(&mut mem).unwrap(), 0x42);
    assert_eq!(mem[1], 0x42);
    // ubpf_vm.rs test_vm_stdw_add_overflow segfaults rbpf's host (r2 = 0 there, so the store
    // goes to u64::MAX). Here r2 is the metadata's length and the store past it is stopped.
    let prog = assemble("stdw [r2-0x1], 0x44332211\nldxw r0, [r1+2]\nexit").unwrap();
    let mut mem = [
        0xaa, 0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xcc, 0xdd,
    ];
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), 0x00, 0x10, runtime()).unwrap();
    let e = vm.execute_program(&mut mem).unwrap_err();
    let Stop::OutOfBounds { pc: 0, addr, .. } = packjit_stop(&e) else {
        panic!("{e}");
    };
    assert_eq!(addr, 0x17);
}

#[test]
fn fixed_mbuff_offsets_past_the_metadata_limit_are_refused() {
    let prog = assemble("ldxdw r0, [r1+8]\nexit").unwrap();
    for (data, end) in [(usize::MAX - 3, 0), (0, usize::MAX), (MAX_METADATA_LEN, 0)] {
        let Err(e) = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), data, end, runtime()) else {
            panic!("offsets {data:#x}, {end:#x} accepted");
        };
        assert!(e.to_string().contains("metadata"), "{e}");
    }
    // A refused change leaves the VM as it was: it still runs with its old program and
    // offsets (r0 = the packet's start address, stored at offset 8).
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), 8, 16, runtime()).unwrap();
    let other = assemble("mov r0, 1\nexit").unwrap();
    let e = vm
        .set_program_with_offsets(&other, usize::MAX - 3, 0)
        .unwrap_err();
    assert!(e.to_string().contains("metadata"), "{e}");
    let mut mem = [1u8, 2, 3];
    if native_host() {
        assert_eq!(vm.execute_program(&mut mem).unwrap(), mem.as_ptr() as u64);
    }
    // The largest allowed fields still work.
    let last = MAX_METADATA_LEN - 8;
    assert!(EbpfVmFixedMbuff::new_with_runtime(Some(&prog), last, 0, runtime()).is_ok());
}

#[test]
fn nodata_flavour_runs_rbpfs_examples() {
    // rbpf's EbpfVmNoData doc example (and ubpf_vm.rs test_vm_alu64_arith, test_vm_mul_loop).
    let prog = [
        0xb7, 0x00, 0x00, 0x00, 0x11, 0x22, 0x00, 0x00, // mov r0, 0x2211
        0xdc, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, // be16 r0
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let vm = EbpfVmNoData::new(Some(&prog)).unwrap();
    assert_eq!(vm.execute_program().unwrap(), 0x1122);
    let cases = [
        (
            "mov r0, 0\nmov r1, 1\nmov r2, 2\nmov r3, 3\nmov r4, 4\nmov r5, 5\nmov r6, 6\n\
             mov r7, 7\nmov r8, 8\nmov r9, 9\nadd r0, 23\nadd r0, r7\nsub r0, 13\nsub r0, r1\n\
             mul r0, 7\nmul r0, r3\ndiv r0, 2\ndiv r0, r4\nexit",
            0x2a,
        ),
        // Empty memory is r1 = 0, so the loop runs 10 times (rbpf's answer).
        (
            "mov r0, 0x7\nadd r1, 0xa\nlsh r1, 0x20\nrsh r1, 0x20\njeq r1, 0x0, +4\n\
             mov r0, 0x7\nmul r0, 0x7\nadd r1, -1\njne r1, 0x0, -3\nexit",
            0x75db9c97,
        ),
        (
            "mov32 r0, 0\nmov32 r1, 2\nadd32 r0, 1\nadd32 r0, r1\nexit",
            0x3,
        ),
        ("mov r0, 1\nmov r1, 0\nmod r0, r1\nexit", 0x1),
    ];
    let rt = runtime();
    for (src, want) in cases {
        let prog = assemble(src).unwrap();
        let vm = EbpfVmNoData::new_with_runtime(Some(&prog), rt.clone()).unwrap();
        assert_eq!(vm.execute_program().unwrap(), want, "{src}");
        // And the empty Raw memory is the same r1 = r2 = 0.
        let vm = EbpfVmRaw::new_with_runtime(Some(&prog), rt.clone()).unwrap();
        assert_eq!(vm.execute_program(&mut []).unwrap(), want, "{src}");
    }
}

#[test]
fn registers_start_at_zero_so_mod_by_zero_reg_long_is_deterministic() {
    // ubpf_vm.rs test_vm_mod_by_zero_reg_long: r0 is never written; x % 0 keeps x. Its answer
    // is whatever r0 held at entry: rbpf says 0, and packjit's JIT code used to return host
    // garbage. Run many times, interleaved with other programs that leave values behind.
    let prog = assemble("lddw r1, 0x100000000\nmod32 r0, r1\nexit").unwrap();
    let noise = assemble(
        "lddw r0, 0x1234567890\nlddw r3, -1\nmov r4, r3\nmov r5, r3\nmov r6, r3\nmov r7, r3\n\
         mov r8, r3\nmov r9, r3\nstdw [r10-8], -1\nexit",
    )
    .unwrap();
    // Every register r0, r3-r9 and the stack: their sum is 0 at entry.
    let sum = assemble(
        "add r0, r3\nadd r0, r4\nadd r0, r5\nadd r0, r6\nadd r0, r7\nadd r0, r8\nadd r0, r9\n\
         ldxdw r1, [r10-8]\nadd r0, r1\nexit",
    )
    .unwrap();
    let rt = runtime();
    let vm = EbpfVmNoData::new_with_runtime(Some(&prog), rt.clone()).unwrap();
    let vm_noise = EbpfVmNoData::new_with_runtime(Some(&noise), rt.clone()).unwrap();
    let vm_sum = EbpfVmNoData::new_with_runtime(Some(&sum), rt.clone()).unwrap();
    for _ in 0..50 {
        vm_noise.execute_program().unwrap();
        assert_eq!(vm.execute_program().unwrap(), 0);
        vm_noise.execute_program().unwrap();
        assert_eq!(vm_sum.execute_program().unwrap(), 0);
    }
    // Native sandboxed code where the host's backend has the sandbox; the interpreter (same
    // answers) where it has not or there is none.
    let mov0 = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let sandbox_backend = native_host() && rt.load(&mov0, &Default::default()).is_ok();
    assert_eq!(vm.is_native(), sandbox_backend);
}

#[test]
fn err_stack_out_of_bound_stops_under_the_sandbox() {
    // ubpf_vm.rs test_vm_err_stack_out_of_bound (a should_panic test in rbpf; its JIT writes
    // the host's stack): one byte above the 512-byte frame.
    let prog = assemble("stb [r10], 0\nexit").unwrap();
    let vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    let e = vm.execute_program().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Other);
    let Stop::OutOfBounds {
        pc: 0, size, write, ..
    } = packjit_stop(&e)
    else {
        panic!("{e}");
    };
    assert_eq!((size, write), (1, true));
    assert!(e.to_string().contains("out of bounds"), "{e}");
    // And below the frame, through a walked pointer, reading.
    let prog = assemble("mov r1, r10\nadd r1, -520\nldxdw r0, [r1]\nexit").unwrap();
    let vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    let stop = packjit_stop(&vm.execute_program().unwrap_err());
    assert_eq!((stop.kind(), stop.pc()), (StopKind::OutOfBounds, 2));
    assert_eq!(stop.direction(), Some(AccessDirection::Read));
}

fn double(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a * 2
}
fn square(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a * a
}

#[test]
fn helpers_are_per_vm() {
    let prog = assemble("mov r1, 9\ncall 1\nexit").unwrap();
    let rt = runtime();
    let mut a = EbpfVmNoData::new_with_runtime(Some(&prog), rt.clone()).unwrap();
    let mut b = EbpfVmNoData::new_with_runtime(Some(&prog), rt.clone()).unwrap();
    a.register_helper(1, double).unwrap();
    b.register_helper(1, square).unwrap();
    assert_eq!(a.execute_program().unwrap(), 18);
    assert_eq!(b.execute_program().unwrap(), 81);
    // Re-binding drops the code compiled for the old table.
    a.register_helper(1, square).unwrap();
    assert_eq!(a.execute_program().unwrap(), 81);
    // rbpf's sqrti through the rbpf helper id space (ubpf_vm.rs test_vm_call_sqrti-like).
    let prog = assemble("mov r1, 144\ncall 2\nexit").unwrap();
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), rt).unwrap();
    vm.register_helper(2, rbpf::helpers::sqrti).unwrap();
    assert_eq!(vm.execute_program().unwrap(), 12);
    // An unregistered helper is refused before the program runs, naming the pc and id.
    let prog = assemble("mov r0, 1\ncall 63\nexit").unwrap();
    let vm = EbpfVmNoData::new(Some(&prog)).unwrap();
    let e = vm.execute_program().unwrap_err();
    let pe = packjit_error(&e);
    assert_eq!(pe.pc, Some(1), "{e}");
    // In rbpf's words, as rbpf's interpreter reports it when the call runs.
    assert_eq!(e.to_string(), "Error: unknown helper function (id: 0x3f)");
}

#[test]
fn api_shape_matches_rbpf() {
    // Constructors take Option and verify; set_program / set_verifier as in rbpf.
    let mut vm = EbpfVmRaw::new(None).unwrap();
    let e = vm.execute_program(&mut []).unwrap_err();
    assert!(e.to_string().contains("No program set"), "{e}");
    assert!(EbpfVmRaw::new(Some(&[0x95, 0, 0, 0, 0, 0, 0])).is_err());
    let bad = [0xff, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    assert!(vm.set_program(&bad).is_err());
    fn reject_all(_: &[u8]) -> Result<(), std::io::Error> {
        Err(std::io::Error::other("no"))
    }
    let prog = assemble("mov r0, 5\nexit").unwrap();
    vm.set_program(&prog).unwrap();
    assert!(
        vm.set_verifier(reject_all).is_err(),
        "the loaded program must pass"
    );
    assert_eq!(vm.execute_program(&mut []).unwrap(), 5);
    // Budget extension: a spin stops (one rbpf's verifier accepts: it refuses `ja -1`).
    let spin = assemble("add r0, 1\nja -2\nexit").unwrap();
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&spin), runtime()).unwrap();
    vm.set_instruction_budget(Some(1000));
    let e = vm.execute_program().unwrap_err();
    assert_eq!(packjit_stop(&e).kind(), StopKind::Budget);
    // With no budget set, the spin ends too: the default budget of sandboxed runs.
    let vm = EbpfVmNoData::new_with_runtime(Some(&spin), runtime()).unwrap();
    let e = vm.execute_program().unwrap_err();
    assert_eq!(packjit_stop(&e).kind(), StopKind::Budget, "{e}");
    // Send + Sync, for every flavour.
    fn both<T: Send + Sync>() {}
    both::<EbpfVmRaw<'static>>();
    both::<EbpfVmMbuff<'static>>();
    both::<EbpfVmFixedMbuff<'static>>();
    both::<EbpfVmNoData<'static>>();
}

#[test]
fn jit_compile_gives_trusted_code_where_a_backend_targets_the_host() {
    let prog = assemble("ldxb r0, [r1+1]\nadd r0, r2\nexit").unwrap();
    let mut vm = EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap();
    // SAFETY: nothing compiled yet: an error, nothing runs.
    let e = unsafe { vm.execute_program_jit(&mut [1, 2]) }.unwrap_err();
    assert!(e.to_string().contains("not been JIT-compiled"), "{e}");
    match vm.jit_compile() {
        Ok(()) => {
            assert!(native_host());
            // SAFETY: the program reads byte 1 of a 2-byte memory.
            assert_eq!(unsafe { vm.execute_program_jit(&mut [1, 2]) }.unwrap(), 4);
        }
        Err(e) => {
            assert!(!native_host(), "{e}");
            assert!(e.to_string().contains("no backend"), "{e}");
        }
    }
    assert_eq!(vm.execute_program(&mut [1, 2]).unwrap(), 4);
}

#[test]
fn thunks_call_the_bound_function() {
    fn triple(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        a * 3
    }
    let t = c_thunk_for(triple).unwrap();
    // SAFETY: the thunk forwards plain integers to a safe Rust helper.
    assert_eq!(unsafe { t(14, 0, 0, 0, 0) }, 42);
    assert_eq!(
        c_thunk_for(triple).unwrap() as usize,
        t as usize,
        "one slot per function"
    );
}

/// rbpf's pointer-taking helpers, as packjit registers them, honour the sandbox: `memfrob` on
/// the program's own context works, on memory the program was not given it is refused
/// (`u64::MAX`) and nothing is written; `strcmp` reads only what the program may read.
#[test]
fn rbpf_pointer_helpers_are_checked() {
    let rt = runtime();
    packjit::rbpf_bridge::register_rbpf_helpers(&rt, 0x100).unwrap();
    let id = |name: &str| rt.helpers().iter().find(|h| h.name == name).unwrap().id;
    let (memfrob, strcmp) = (id("memfrob"), id("strcmp"));
    let mut secret = [0x11u8; 8];
    let secret_addr = secret.as_mut_ptr() as u64;
    // r1 = r1 + r3 (offset), r2 = len, call memfrob, exit
    let frob = |offset: i64, len: i32| {
        let mut code = Vec::new();
        code.extend_from_slice(&[0x18, 0x03, 0, 0]);
        code.extend_from_slice(&(offset as u64 as u32).to_le_bytes());
        code.extend_from_slice(&[0, 0, 0, 0]);
        code.extend_from_slice(&((offset as u64 >> 32) as u32).to_le_bytes());
        code.extend_from_slice(&packjit_frontend::encode_insn(0x0f, 1, 3, 0, 0));
        code.extend_from_slice(&packjit_frontend::encode_insn(0xb7, 2, 0, 0, len));
        code.extend_from_slice(&packjit_frontend::encode_insn(
            0x85,
            0,
            0,
            0,
            memfrob as i32,
        ));
        code.extend_from_slice(&packjit_frontend::encode_insn(0x95, 0, 0, 0, 0));
        code
    };
    let mut ctx = [0u8; 16];
    let ctx_addr = ctx.as_ptr() as u64;
    let Ok(p) = rt.load(&frob(0, 16), &Default::default()) else {
        return; // no backend for this host: nothing native to check
    };
    if !p.is_executable() {
        return;
    }
    assert_eq!(p.call(&mut ctx), Ok(0));
    assert_eq!(ctx, [42u8; 16], "frobbed in place");
    let p = rt
        .load(
            &frob(secret_addr.wrapping_sub(ctx_addr) as i64, 8),
            &Default::default(),
        )
        .unwrap();
    assert_eq!(p.call(&mut ctx), Ok(u64::MAX), "refused");
    assert_eq!(secret, [0x11u8; 8], "host memory untouched");
    let p = rt.load(&frob(8, 9), &Default::default()).unwrap();
    assert_eq!(p.call(&mut ctx), Ok(u64::MAX), "one byte past the context");

    // strcmp(ctx, ctx + 8): equal strings inside the context compare 0; a string running
    // off the end of the context is refused rather than read past it.
    let cmp = [
        packjit_frontend::encode_insn(0xbf, 2, 1, 0, 0),
        packjit_frontend::encode_insn(0x07, 2, 0, 0, 8),
        packjit_frontend::encode_insn(0x85, 0, 0, 0, strcmp as i32),
        packjit_frontend::encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat();
    let p = rt.load(&cmp, &Default::default()).unwrap();
    let mut strings = *b"abc\0\0\0\0\0abc\0\0\0\0\0";
    assert_eq!(p.call(&mut strings), Ok(0));
    let mut unterminated = [b'x'; 16];
    assert_eq!(p.call(&mut unterminated), Ok(u64::MAX));

    // Trusted code vouches for its own pointers (as with rbpf): memfrob on its stack, which
    // trusted code does not publish to the sandbox, works.
    let on_stack = [
        packjit_frontend::encode_insn(0x7a, 10, 0, -8, 0), // *(u64 *)(r10 - 8) = 0
        packjit_frontend::encode_insn(0xbf, 1, 10, 0, 0),
        packjit_frontend::encode_insn(0x07, 1, 0, 0, -8),
        packjit_frontend::encode_insn(0xb7, 2, 0, 0, 2),
        packjit_frontend::encode_insn(0x85, 0, 0, 0, memfrob as i32),
        packjit_frontend::encode_insn(0x79, 0, 10, -8, 0), // r0 = the frobbed word
        packjit_frontend::encode_insn(0x95, 0, 0, 0, 0),
    ]
    .concat();
    // SAFETY: the program touches only its own stack, through memfrob.
    let t = unsafe { rt.load_trusted(&on_stack, &Default::default()) }.unwrap();
    assert_eq!(t.call(&mut []), Ok(0x2a2a));
}

/// A VM helper that dereferences a pointer argument the way a careful host writes one: it
/// asks packjit first, then xors `len` bytes with 42.
fn frob_if_allowed(ptr: u64, len: u64, _: u64, _: u64, _: u64) -> u64 {
    if !packjit::helper_access_ok(ptr, len, AccessDirection::Write) {
        return u64::MAX;
    }
    for i in 0..len {
        // SAFETY: packjit just said the running program may write `[ptr, ptr + len)`.
        unsafe { *((ptr + i) as *mut u8) ^= 42 };
    }
    0
}

/// Without a backend for the host the bridge interprets; a helper's pointer check is then
/// answered by the interpreter's run (not a JIT environment).
#[test]
fn interpreted_runs_answer_helper_pointer_checks() {
    // Not the linked-in host backend either.
    let rt = Runtime::with_config(packjit::RuntimeConfig {
        linked_backend: false,
        ..Default::default()
    })
    .unwrap();
    // Every backend but the host's: programs still compile for them, and run interpreted.
    for b in [
        Arc::new(packjit_arm64::Arm64Backend::new()) as Arc<dyn packjit::JitBackend>,
        Arc::new(packjit_rv64::Rv64Backend::new()),
        Arc::new(packjit_x86_64::X86Backend::new()),
    ] {
        if Some(b.arch()) != Arch::host() {
            rt.add_backend(b).unwrap();
        }
    }
    let rt = Arc::new(rt);
    // helper 7 (r1 + off, len), then exit with its result.
    let frob = |off: i32, len: i32| {
        [
            packjit_frontend::encode_insn(0x07, 1, 0, 0, off),
            packjit_frontend::encode_insn(0xb7, 2, 0, 0, len),
            packjit_frontend::encode_insn(0x85, 0, 0, 0, 7),
            packjit_frontend::encode_insn(0x95, 0, 0, 0, 0),
        ]
        .concat()
    };
    let inside = frob(0, 16);
    let mut vm = EbpfVmRaw::new_with_runtime(Some(&inside), rt.clone()).unwrap();
    vm.register_helper(7, frob_if_allowed).unwrap();
    assert!(!vm.is_native(), "no backend targets the host here");
    let mut ctx = [0u8; 16];
    assert_eq!(vm.execute_program(&mut ctx).unwrap(), 0);
    assert_eq!(
        ctx, [42u8; 16],
        "frobbed in place by the interpreted program's helper"
    );
    let past = frob(8, 9);
    let mut vm = EbpfVmRaw::new_with_runtime(Some(&past), rt).unwrap();
    vm.register_helper(7, frob_if_allowed).unwrap();
    let mut ctx = [0u8; 16];
    assert_eq!(
        vm.execute_program(&mut ctx).unwrap(),
        u64::MAX,
        "one byte past"
    );
    assert_eq!(ctx, [0u8; 16], "nothing touched");
    // Outside any run there is no program to ask about.
    assert!(!packjit::helper_access_ok(
        ctx.as_ptr() as u64,
        1,
        AccessDirection::Read
    ));
}

#[test]
fn a_jump_to_itself_is_refused_with_rbpfs_words() {
    // rbpf's ubpf_verifier.rs test_verifier_err_infinite_loop.
    let prog = assemble("ja -1\nexit").unwrap();
    let Err(e) = EbpfVmNoData::new(Some(&prog)) else {
        panic!("ja -1 accepted: its run would never return");
    };
    assert_eq!(e.to_string(), "[Verifier] Error: infinite loop (insn #0)");
    // A conditional one too, after an `lddw` (two slots), and through set_program.
    let prog = assemble("lddw r1, 0x100000000\njeq r1, 0, -1\nmov r0, 0\nexit").unwrap();
    let first = assemble("mov r0, 1\nexit").unwrap();
    let mut vm = EbpfVmNoData::new(Some(&first)).unwrap();
    let e = vm.set_program(&prog).unwrap_err();
    assert_eq!(e.to_string(), "[Verifier] Error: infinite loop (insn #2)");
    // A loop that ends is not refused.
    let ok = assemble("mov r1, 3\nsub r1, 1\njne r1, 0, -2\nmov r0, r1\nexit").unwrap();
    let vm = EbpfVmNoData::new(Some(&ok)).unwrap();
    assert_eq!(vm.execute_program().unwrap(), 0);
}

#[test]
fn legacy_packet_loads_follow_rbpf() {
    // rbpf's misc.rs test_vm_jit_ldabs*/ldind*: the 16-byte packet, no byte swap.
    let mem = || {
        [
            0x00u8, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ]
    };
    let exit = [0x95, 0, 0, 0, 0, 0, 0, 0];
    let cases: [(&[u8], u64); 8] = [
        (&[0x30, 0, 0, 0, 3, 0, 0, 0], 0x33),
        (&[0x28, 0, 0, 0, 3, 0, 0, 0], 0x4433),
        (&[0x20, 0, 0, 0, 3, 0, 0, 0], 0x66554433),
        (&[0x38, 0, 0, 0, 3, 0, 0, 0], 0xaa99887766554433),
        // r1 = 5 first: LD_IND adds the index; r1 itself is no longer the memory.
        (
            &[0xb7, 1, 0, 0, 5, 0, 0, 0, 0x50, 0x10, 0, 0, 3, 0, 0, 0],
            0x88,
        ),
        (
            &[0xb7, 1, 0, 0, 5, 0, 0, 0, 0x48, 0x10, 0, 0, 3, 0, 0, 0],
            0x9988,
        ),
        (
            &[0xb7, 1, 0, 0, 4, 0, 0, 0, 0x40, 0x10, 0, 0, 1, 0, 0, 0],
            0x88776655,
        ),
        (
            &[0xb7, 1, 0, 0, 2, 0, 0, 0, 0x58, 0x10, 0, 0, 3, 0, 0, 0],
            0xccbbaa9988776655,
        ),
    ];
    for (body, want) in cases {
        let prog = [body, &exit].concat();
        let mut vm = EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap();
        assert_eq!(vm.execute_program(&mut mem()).unwrap(), want, "{body:02x?}");
        if native_host() {
            vm.jit_compile().unwrap();
            // SAFETY: the loads stay inside the 16 bytes.
            assert_eq!(unsafe { vm.execute_program_jit(&mut mem()) }.unwrap(), want);
        }
        // EbpfVmMbuff with no metadata: r1 is mem, as in rbpf.
        let vm = EbpfVmMbuff::new_with_runtime(Some(&prog), runtime()).unwrap();
        assert_eq!(vm.execute_program(&mem(), &[]).unwrap(), want);
        // With a metadata buffer r1 is not mem, and the loads still read mem, as rbpf's do
        // (the bridge interprets such runs: r1 = the buffer, packet loads from mem).
        let mut meta = [0xeeu8; 16];
        assert_eq!(vm.execute_program(&mem(), &meta).unwrap(), want);
        // SAFETY: the loads stay inside the 16 bytes of mem.
        let jit = unsafe { vm.execute_program_jit(&mut mem(), &mut meta) };
        assert_eq!(jit.unwrap(), want);
        let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), 0, 8, runtime()).unwrap();
        assert_eq!(vm.execute_program(&mut mem()).unwrap(), want);
        // SAFETY: as above.
        assert_eq!(unsafe { vm.execute_program_jit(&mut mem()) }.unwrap(), want);
    }
    // The metadata buffer is reachable too in such a run (the program reads the packet's
    // start rbpf stored at offset 0 and loads through it), and a packet load past mem stops.
    let prog = [
        &[0x79, 0x12, 0, 0, 0, 0, 0, 0][..], // r2 = *(u64 *)(r1 + 0): data
        &[0x71, 0x23, 1, 0, 0, 0, 0, 0],     // r3 = *(u8 *)(r2 + 1)
        &[0x30, 0, 0, 0, 2, 0, 0, 0],        // r0 = ldabsb 2
        &[0x0f, 0x30, 0, 0, 0, 0, 0, 0],     // r0 += r3
        &exit,
    ]
    .concat();
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&prog), 0, 8, runtime()).unwrap();
    assert_eq!(vm.execute_program(&mut mem()).unwrap(), 0x22 + 0x11);
    let past = [&[0x30u8, 0, 0, 0, 16, 0, 0, 0][..], &exit].concat();
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&past), 0, 8, runtime()).unwrap();
    let e = vm.execute_program(&mut mem()).unwrap_err();
    assert!(e.to_string().contains("out of bounds memory load"), "{e}");
    // rbpf's test_vm_err_ldindb_oob: `ldabsdw 0x33` with src = 1 (rbpf ignores it), pc 1,
    // out of bounds: rbpf's words and numbering, packjit's stop inside.
    let prog = [
        &[0xb7, 1, 0, 0, 5, 0, 0, 0][..],
        &[0x38, 0x10, 0, 0, 0x33, 0, 0, 0],
        &exit,
    ]
    .concat();
    let vm = EbpfVmRaw::new_with_runtime(Some(&prog), runtime()).unwrap();
    let mut m = mem();
    let e = vm.execute_program(&mut m).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("Error: out of bounds memory load (insn #2),"),
        "{e}"
    );
    assert_eq!(
        packjit_stop(&e),
        Stop::OutOfBounds {
            pc: 1,
            addr: m.as_ptr() as u64 + 0x33,
            size: 8,
            write: false
        }
    );
    // No memory at all (EbpfVmNoData): address = imm, stopped.
    let vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    let e = vm.execute_program().unwrap_err();
    assert_eq!(packjit_stop(&e).kind(), StopKind::OutOfBounds);
    // packjit's own verifier, without the bridge's clearing, names the reserved field.
    let e = packjit::rbpf_bridge::packjit_verifier(&[
        0x30, 0x01, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0,
    ]);
    assert!(
        e.is_ok(),
        "the bridge clears dst of LD_ABS as rbpf ignores it: {e:?}"
    );
    let e = packjit_frontend::decode(
        &[0x30, 0x01, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0],
        &[],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "pc 0: ldabsb (opcode 0x30): reserved field dst must be 0, is 1"
    );
}

#[test]
fn register_div_and_mod_ignore_the_immediate_as_in_rbpf() {
    // rbpf's ubpf_jit_x86_64.rs test_jit_{div,mod}_reg_with_nonzero_imm, 32 and 64 bits.
    for (opc, want) in [(0x3f, 20), (0x9f, 2), (0x3c, 20), (0x9c, 2)] {
        let prog = [
            0xb7, 0, 0, 0, 102, 0, 0, 0, // mov r0, 102
            0xb7, 1, 0, 0, 5, 0, 0, 0, // mov r1, 5
            opc, 0x10, 0, 0, 0x99, 0x99, 0x99, 0x99, // div/mod r0, r1 (imm 0x99999999)
            0x95, 0, 0, 0, 0, 0, 0, 0,
        ];
        let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
        assert_eq!(vm.execute_program().unwrap(), want, "{opc:#x}");
        if native_host() {
            vm.jit_compile().unwrap();
            // SAFETY: no memory access.
            assert_eq!(unsafe { vm.execute_program_jit() }.unwrap(), want);
        }
    }
    // The front end itself still refuses the reserved field (bpf_conformance's negative
    // tests).
    let e = packjit_frontend::decode(
        &[0x3f, 0x10, 0, 0, 1, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0],
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("imm"), "{e}");
}

#[test]
fn allowed_memory_is_reachable_and_nothing_else() {
    // rbpf's allowed_memory example, by hand: a value outside the program's memory, reached
    // only once the host allows its range.
    static VALUE: u64 = 0x1234_5678;
    let addr = std::ptr::addr_of!(VALUE) as u64;
    let prog = [
        &[0x18, 1, 0, 0][..],
        &(addr as u32).to_le_bytes(),
        &[0, 0, 0, 0],
        &((addr >> 32) as u32).to_le_bytes(),
        &[0x79, 0x10, 0, 0, 0, 0, 0, 0], // r0 = *(u64 *)(r1 + 0)
        &[0x95, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    let e = vm.execute_program().unwrap_err();
    assert!(e.to_string().contains("out of bounds memory load"), "{e}");
    // One byte short of the value still stops; the whole value is read.
    vm.register_allowed_memory(addr..addr + 7);
    assert!(vm.execute_program().is_err());
    vm.register_allowed_memory(addr..addr + 8);
    assert_eq!(vm.execute_program().unwrap(), 0x1234_5678);
    // An empty or reversed range allows nothing more.
    vm.register_allowed_memory(addr + 8..addr);
    if native_host() {
        vm.jit_compile().unwrap();
        // SAFETY: the program reads only the allowed value.
        assert_eq!(unsafe { vm.execute_program_jit() }.unwrap(), 0x1234_5678);
    }
}

/// The line a host keeps when switching from rbpf, `vm.register_helper(id,
/// rbpf::helpers::memfrob)`, binds the checked memfrob: a sandboxed program aiming it at host
/// memory is refused (`u64::MAX`) and the memory stays as it was; on the program's own memory
/// it frobs as rbpf's does. The same for `strcmp`.
#[test]
fn registering_rbpfs_own_pointer_helpers_binds_their_checked_versions() {
    let secret = Box::new([0x11u8; 8]);
    let target = secret.as_ptr() as u64;
    // r1 = target (lddw), r2 = 8, call 1 (memfrob), exit
    let at = |addr: u64| {
        [
            &[0x18, 1, 0, 0][..],
            &(addr as u32).to_le_bytes(),
            &[0, 0, 0, 0],
            &((addr >> 32) as u32).to_le_bytes(),
            &[0xb7, 2, 0, 0, 8, 0, 0, 0],
            &[0x85, 0, 0, 0, 1, 0, 0, 0],
            &[0x95, 0, 0, 0, 0, 0, 0, 0],
        ]
        .concat()
    };
    let prog = at(target);
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    vm.register_helper(1, rbpf::helpers::memfrob).unwrap();
    assert_eq!(vm.execute_program().unwrap(), u64::MAX, "refused");
    assert_eq!(*secret, [0x11u8; 8], "host memory untouched");
    // Its own memory: frobbed as rbpf frobs (xor 42), through r1 = mem.
    let own = [
        &[0xb7, 2, 0, 0, 4, 0, 0, 0][..],
        &[0x85, 0, 0, 0, 1, 0, 0, 0],
        &[0x95, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    let mut vm = EbpfVmRaw::new_with_runtime(Some(&own), runtime()).unwrap();
    vm.register_helper(1, rbpf::helpers::memfrob).unwrap();
    let mut mem = [0u8, 1, 2, 3, 4];
    assert_eq!(vm.execute_program(&mut mem).unwrap(), 0);
    assert_eq!(mem, [42, 43, 40, 41, 4]);
    // strcmp of a host string is refused too.
    let cmp = [
        &at(target)[..16],
        &[0xbf, 0x12, 0, 0, 0, 0, 0, 0], // r2 = r1
        &[0x85, 0, 0, 0, 2, 0, 0, 0],
        &[0x95, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&cmp), runtime()).unwrap();
    vm.register_helper(2, rbpf::helpers::strcmp).unwrap();
    assert_eq!(vm.execute_program().unwrap(), u64::MAX, "refused");
}

/// rbpf's `tests/misc.rs` `test_stack_overflow` program: two bpf-to-bpf calls, the first
/// callee storing at `[r10-8]`; 0x10 when its store succeeds.
const STACK_OVERFLOW: &str = "mov64 r1, 0x10\nmov64 r2, 0x1\ncallx 0x4\nmov64 r1, 0x1\n\
    mov64 r2, r0\ncallx 0x5\nexit\nstdw [r10-8], 0xcd\nmov64 r0, r1\nsub64 r0, r2\nexit\n\
    mov64 r0, r2\nadd64 r0, r1\nexit";

/// Checks `e` is an out-of-bounds 8-byte store stopped at `pc`, in rbpf's words (rbpf
/// numbers the instruction after the faulting one).
fn assert_stack_store_stopped(e: &std::io::Error, pc: usize) {
    let want = format!("Error: out of bounds memory store (insn #{})", pc + 1);
    assert!(e.to_string().starts_with(&want), "{e}");
    let Stop::OutOfBounds {
        pc: at,
        size,
        write,
        ..
    } = packjit_stop(e)
    else {
        panic!("{e}");
    };
    assert_eq!((at, size, write), (pc, 8, true), "{e}");
}

#[test]
fn a_stack_usage_calculator_packs_execute_programs_frames_as_rbpf() {
    let prog = assemble(STACK_OVERFLOW).unwrap();
    let rt = runtime();
    // Without a calculator: separate frames, the store succeeds, native code where the host
    // has the sandbox.
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), rt.clone()).unwrap();
    assert_eq!(vm.execute_program().unwrap(), 0x10);
    let native = vm.is_native();
    // rbpf's test: the entry uses the whole 512-byte stack, so its callee's r10 is the
    // stack's start and the callee's `stdw [r10-8]` (insn 7) stops, in rbpf's words.
    vm.set_stack_usage_calculator(|_, _, _| 512, Box::new(()))
        .unwrap();
    assert!(!vm.is_native(), "packed frames are the interpreter's");
    assert_stack_store_stopped(&vm.execute_program().unwrap_err(), 7);
    // rbpf's JIT reads no calculator; packjit's trusted code keeps separate frames.
    if vm.jit_compile().is_ok() {
        // SAFETY: the program touches only its stack, inside its frames.
        assert_eq!(unsafe { vm.execute_program_jit() }.unwrap(), 0x10);
    }
    // A calculator set before the program applies to it (rbpf asks it at `set_program`).
    let mut vm = EbpfVmNoData::new_with_runtime(None, rt.clone()).unwrap();
    vm.set_stack_usage_calculator(|_, _, _| 512, Box::new(()))
        .unwrap();
    vm.set_program(&prog).unwrap();
    assert_stack_store_stopped(&vm.execute_program().unwrap_err(), 7);
    // A program without bpf-to-bpf calls has one frame whatever the layout: it keeps its
    // native code.
    let plain = assemble("stdw [r10-8], 7\nldxdw r0, [r10-8]\nexit").unwrap();
    vm.set_program(&plain).unwrap();
    assert_eq!(vm.execute_program().unwrap(), 7);
    assert_eq!(vm.is_native(), native);
}

#[test]
fn a_packed_callee_reaches_the_stacks_first_byte_and_stops_below_it() {
    // The entry uses 504 bytes, so its callee's r10 is 8 bytes above the stack's start: the
    // callee's `stdw [r10-8]` lands on the stack's first 8 bytes, which the entry reads back
    // at `[r10-512]`; `[r10-16]` is below the stack and stops at the callee's store (insn 3).
    let inside = assemble(
        "callx 0x2\nldxdw r0, [r10-512]\nexit\n\
         stdw [r10-8], 0xcd\nexit",
    )
    .unwrap();
    let outside = assemble(
        "callx 0x2\nldxdw r0, [r10-512]\nexit\n\
         stdw [r10-16], 0xcd\nexit",
    )
    .unwrap();
    let usage = |_: &[u8], pc: usize, _: &mut dyn std::any::Any| -> u16 {
        if pc == 0 {
            504
        } else {
            256
        }
    };
    let rt = runtime();
    let mut vm = EbpfVmRaw::new_with_runtime(Some(&inside), rt.clone()).unwrap();
    vm.set_stack_usage_calculator(usage, Box::new(())).unwrap();
    assert_eq!(vm.execute_program(&mut [0; 4]).unwrap(), 0xcd);
    vm.set_program(&outside).unwrap();
    assert_stack_store_stopped(&vm.execute_program(&mut [0; 4]).unwrap_err(), 3);
    // The other flavours' `execute_program` pack the same way.
    let mut vm = EbpfVmMbuff::new_with_runtime(Some(&outside), rt.clone()).unwrap();
    vm.set_stack_usage_calculator(usage, Box::new(())).unwrap();
    assert_stack_store_stopped(&vm.execute_program(&[0; 4], &[0; 8]).unwrap_err(), 3);
    let mut vm = EbpfVmFixedMbuff::new_with_runtime(Some(&outside), 0, 8, rt.clone()).unwrap();
    vm.set_stack_usage_calculator(usage, Box::new(())).unwrap();
    assert_stack_store_stopped(&vm.execute_program(&mut [0; 4]).unwrap_err(), 3);
    // Separate frames (no calculator): the callee's slot is in its own frame, and the
    // entry's `[r10-512]` is its own zeroed bottom slot.
    let vm = EbpfVmRaw::new_with_runtime(Some(&outside), rt).unwrap();
    assert_eq!(vm.execute_program(&mut [0; 4]).unwrap(), 0);
}

/// The pcs a calculator was asked about, in order, through its data.
type Asked = std::sync::Arc<std::sync::Mutex<Vec<usize>>>;

fn recording_usage(_: &[u8], pc: usize, data: &mut dyn std::any::Any) -> u16 {
    // As in rbpf, `data` is the box holding the host's value.
    let boxed = data.downcast_mut::<Box<dyn std::any::Any>>().unwrap();
    boxed
        .downcast_mut::<Asked>()
        .unwrap()
        .lock()
        .unwrap()
        .push(pc);
    match pc {
        0 => 64,
        3 => 128,
        _ => 8,
    }
}

#[test]
fn each_call_lowers_r10_by_the_calling_functions_own_usage() {
    // entry (pc 0, 64 bytes) calls f (pc 3, 128 bytes), which calls g (pc 5, 8 bytes). g's
    // slot at its [r10-8] is the entry's [r10-200] only if each call steps down by its
    // caller's usage (64 + 128 + 8); stepping by the callee's usage would put it elsewhere.
    let prog = assemble(
        "callx 0x2\nldxdw r0, [r10-200]\nexit\n\
         callx 0x1\nexit\n\
         stdw [r10-8], 0x77\nexit",
    )
    .unwrap();
    let asked = Asked::default();
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    vm.set_stack_usage_calculator(recording_usage, Box::new(asked.clone()))
        .unwrap();
    assert_eq!(vm.execute_program().unwrap(), 0x77);
    // Asked as rbpf asks: the entry, then each call's target in slot order.
    assert_eq!(*asked.lock().unwrap(), [0, 3, 5]);
    // Asked again for each program set, helper calls' `slot + 1 + imm` included (rbpf reads
    // every `call` opcode so); a program without bpf-to-bpf calls is unaffected.
    asked.lock().unwrap().clear();
    let helper_call = assemble("mov r1, 9\ncall 1\nexit").unwrap();
    vm.register_helper(1, double).unwrap();
    vm.set_program(&helper_call).unwrap();
    assert_eq!(*asked.lock().unwrap(), [0, 3]);
    assert_eq!(vm.execute_program().unwrap(), 18);
}

#[test]
fn packed_usages_of_zero_or_past_the_stack_run_as_in_rbpf() {
    // The entry stores 5 in its slot, its callee 7 in its own, the entry reads its slot.
    let overlap = assemble(
        "stdw [r10-8], 5\ncallx 0x2\nldxdw r0, [r10-8]\nexit\n\
         stdw [r10-8], 7\nexit",
    )
    .unwrap();
    let rt = runtime();
    // Usage 0: the callee's frame is its caller's, so it overwrites the entry's slot.
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&overlap), rt.clone()).unwrap();
    vm.set_stack_usage_calculator(|_, _, _| 0, Box::new(()))
        .unwrap();
    assert_eq!(vm.execute_program().unwrap(), 7);
    // Past the stack (600 > 512): the callee's r10 is below it, so its store stops (insn 4)
    // ...
    vm.set_stack_usage_calculator(|_, _, _| 600, Box::new(()))
        .unwrap();
    assert_stack_store_stopped(&vm.execute_program().unwrap_err(), 4);
    // ... while a callee that touches no stack runs, and the entry's r10 comes back whole.
    let no_stack = assemble(
        "stdw [r10-8], 5\ncallx 0x2\nldxdw r0, [r10-8]\nexit\n\
         mov r0, 1\nexit",
    )
    .unwrap();
    vm.set_program(&no_stack).unwrap();
    assert_eq!(vm.execute_program().unwrap(), 5);
}

#[test]
fn a_calculator_that_swaps_its_data_for_another_type_is_refused() {
    // The data reaches the calculator as rbpf hands it (`&mut Box<dyn Any>`), so it could
    // put a value of any type there, one that is not Send among them; the VM is Send + Sync,
    // so that is refused, and the VM keeps what it had.
    fn swapping(_: &[u8], _: usize, data: &mut dyn std::any::Any) -> u16 {
        let boxed = data.downcast_mut::<Box<dyn std::any::Any>>().unwrap();
        *boxed = Box::new(std::rc::Rc::new(1u8));
        512
    }
    let prog = assemble(STACK_OVERFLOW).unwrap();
    let mut vm = EbpfVmNoData::new_with_runtime(Some(&prog), runtime()).unwrap();
    let e = vm
        .set_stack_usage_calculator(swapping, Box::new(0u32))
        .unwrap_err();
    assert!(e.to_string().contains("data of another type"), "{e}");
    assert!(e.to_string().contains("insn #0"), "{e}");
    assert_eq!(vm.execute_program().unwrap(), 0x10, "no calculator was set");
    // Set before the program, it is asked (and refused) when the program is set; the VM
    // keeps no program.
    let mut vm = EbpfVmNoData::new_with_runtime(None, runtime()).unwrap();
    vm.set_stack_usage_calculator(swapping, Box::new(0u32))
        .unwrap();
    assert!(vm.set_program(&prog).is_err());
    assert!(vm
        .execute_program()
        .unwrap_err()
        .to_string()
        .contains("No program set"));
}
