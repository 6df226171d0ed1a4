//! Moving an rbpf host to packjit: change the path of the VM type, keep the rest.
//!
//! `cargo run -p packjit --example rbpf_switch`
//!
//! packjit's VMs take rbpf 0.4's constructors, helpers and errors (`std::io::Error`);
//! `execute_program` runs sandboxed native code (the host's linked-in backend) where rbpf
//! interprets. See `packjit::rbpf_bridge` for where the two differ.

// use rbpf::EbpfVmRaw;
use packjit::rbpf_bridge::EbpfVmRaw;

fn main() -> Result<(), std::io::Error> {
    let prog = &[
        0x71, 0x11, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, // ldxb r1, [r1+4]
        0x07, 0x01, 0x00, 0x00, 0x00, 0x22, 0x00, 0x00, // add r1, 0x2200
        0xbf, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // mov r0, r1
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let mem = &mut [0xaa, 0xbb, 0x11, 0x22, 0xcc, 0xdd];

    // Unchanged rbpf code from here on.
    let vm = EbpfVmRaw::new(Some(prog))?;
    let r0 = vm.execute_program(mem)?;
    println!("execute_program: {r0:#x}");
    assert_eq!(r0, 0x22cc);

    // rbpf's helper functions register as they are (here its `sqrti`, under id 1).
    let with_helper = &[
        0xb7, 0x01, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, // mov r1, 9
        0x85, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // call 1 (sqrti below)
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let mut vm = EbpfVmRaw::new(Some(with_helper))?;
    vm.register_helper(1, rbpf::helpers::sqrti)?;
    assert_eq!(vm.execute_program(&mut [])?, 3);

    // A program that reads past its memory: rbpf's message, from a sandbox stop.
    let oob = &[
        0x79, 0x10, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // ldxdw r0, [r1+256]
        0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // exit
    ];
    let vm = EbpfVmRaw::new(Some(oob))?;
    let e = vm.execute_program(mem).unwrap_err();
    println!("out of bounds: {e}");

    // rbpf's JIT path: trusted code, the caller vouches for the program's accesses.
    let mut vm = EbpfVmRaw::new(Some(prog))?;
    vm.jit_compile()?;
    // SAFETY: the program reads byte 4 of `mem`, which has 6.
    let r0 = unsafe { vm.execute_program_jit(mem)? };
    assert_eq!(r0, 0x22cc);
    println!("execute_program_jit: {r0:#x}");
    Ok(())
}
