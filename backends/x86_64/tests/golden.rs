//! Golden disassembly of the emitted code (`objdump -D -b binary -mi386:x86-64 -M intel`),
//! and the compile error paths.
//!
//! Host run only: these checks start binutils, and a child process started from a test that
//! qemu-user emulates can hang for good (qemu 7.2 forking a multithreaded guest; it cost a CI
//! run). The emitted bytes do not depend on where the compiler runs, so the x86-64 host run
//! covers them; the emulated runs execute the code instead.
#![cfg(target_arch = "x86_64")]

mod common;

use common::asm;
use packjit_plugin_api::abi::*;
use packjit_plugin_api::{CodeArena, CompileRequest, ErrorKind, HelperEntry, JitBackend};
use packjit_x86_64::{emit_program, emit_request, X86Backend, FEATURE_BMI2, FEATURE_MOVBE};
use std::process::Command;

/// Disassembles `bytes`: one `mnemonic operands` line per instruction.
fn disasm(bytes: &[u8]) -> Vec<String> {
    let path = std::env::temp_dir().join(format!(
        "packjit-x86-golden-{}-{:x}.bin",
        std::process::id(),
        {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(bytes)
        }
    ));
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new("objdump")
        .args(["-D", "-b", "binary", "-mi386:x86-64", "-M", "intel"])
        .arg(&path)
        .output();
    std::fs::remove_file(&path).ok();
    let out = out.expect("objdump (binutils) must be installed for the golden tests");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            // "   4:\tb8 07 00 00 00       \tmov    eax,0x7" -> "mov eax,0x7"
            let mut parts = l.splitn(3, '\t');
            if !parts.next()?.trim_end().ends_with(':') {
                return None;
            }
            parts.next()?;
            let text = parts.next()?.trim();
            // Drop "<label+off>" and "# comment" annotations.
            let text = text.split(['<', '#']).next().unwrap().trim();
            Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

const HELPER_ADDR: u64 = 0x0000_7f12_3456_7890;

fn helpers() -> Vec<HelperEntry> {
    vec![HelperEntry {
        id: 1,
        inline_kind: 0,
        addr: HELPER_ADDR,
    }]
}

fn code(src: &str, flags: u32, features: u64) -> Vec<String> {
    let out = emit_request(&packjit_plugin_api::CompileRequest {
        code: &asm(src),
        helpers: &helpers(),
        features,
        flags,
        blind_key: 1,
    })
    .unwrap_or_else(|e| panic!("{src}: {e}"));
    let d = disasm(&out.bytes);
    assert_eq!(
        d.len(),
        out.native_insns,
        "instruction count:\n{}",
        d.join("\n")
    );
    d
}

fn check(name: &str, src: &str, features: u64, want: &[&str]) {
    let got = code(src, 0, features);
    assert_eq!(
        got,
        want,
        "{name}: emitted code changed:\n{}",
        got.join("\n")
    );
}

#[test]
fn minimal_program_has_no_frame() {
    check(
        "mov+exit",
        "mov %r0, 7\nexit",
        0,
        &["endbr64", "mov eax,0x7", "ret"],
    );
}

/// imm8 when it fits, the rax short form, xor for zero, mov r32 for values below 2^32, sign-extended mov for negative ones, movabs only beyond.
#[test]
fn alu_immediates_take_the_shortest_forms() {
    let got = code("add %r1, 1\nadd %r1, 1000\nadd %r0, 1000\nsub32 %r2, -1\nmov %r3, -1\nmov32 %r3, -1\nlddw %r4, 0x100000000\nlddw %r5, 0xffffffff\nmov %r0, 0\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "xor eax,eax",
        "add rdi,0x1",
        "add rdi,0x3e8",
        "add rax,0x3e8",
        "sub esi,0xffffffff",
        "mov rdx,0xffffffffffffffff",
        "mov edx,0xffffffff",
        "movabs rcx,0x100000000",
        "mov r8d,0xffffffff",
        "xor eax,eax",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "alu_immediates_take_the_shortest_forms: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// r6 (rbx) is the only callee-saved register pushed; one push keeps rsp aligned for the call; BPF r1-r5 are already the SysV argument registers.
#[test]
fn helper_call_saves_only_what_it_uses() {
    let got = code("mov %r6, %r1\ncall 1\nadd %r0, %r6\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "push rbx",
        "xor edx,edx",
        "xor ecx,ecx",
        "xor r8d,r8d",
        "mov rbx,rdi",
        "movabs r11,0x7f1234567890",
        "call r11",
        "add rax,rbx",
        "pop rbx",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "helper_call_saves_only_what_it_uses: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// a register divisor tests for zero with the fix-up out of line; constant 0 and -1 divisors need no division at all.
#[test]
fn division_guards_only_register_divisors() {
    let got = code(
        "div %r1, %r2\nmod32 %r1, 0\nsdiv %r1, -1\nmov %r0, %r1\nexit",
        0,
        0,
    );
    let want: &[&str] = &[
        "endbr64",
        "mov r11,rsi",
        "mov r10,rax",
        "mov r9,rdx",
        "mov rax,rdi",
        "test r11,r11",
        "je 0x2f",
        "xor edx,edx",
        "div r11",
        "mov r11,rax",
        "mov rax,r10",
        "mov rdx,r9",
        "mov rdi,r11",
        "mov edi,edi",
        "neg rdi",
        "mov rax,rdi",
        "ret",
        "xor r11d,r11d",
        "jmp 0x1d",
    ];
    assert_eq!(
        got,
        want,
        "division_guards_only_register_divisors: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// zero and -1 divisors go to cold code: idiv never sees them.
#[test]
fn signed_division_avoids_the_idiv_traps() {
    let got = code("smod32 %r1, %r0\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "xor eax,eax",
        "mov r11,rax",
        "mov r10,rax",
        "mov r9,rdx",
        "mov rax,rdi",
        "test r11d,r11d",
        "je 0x2e",
        "cmp r11d,0xffffffff",
        "je 0x33",
        "cdq",
        "idiv r11d",
        "mov r11d,edx",
        "mov rax,r10",
        "mov rdx,r9",
        "mov edi,r11d",
        "ret",
        "mov r11d,eax",
        "jmp 0x24",
        "xor r11d,r11d",
        "jmp 0x24",
    ];
    assert_eq!(
        got,
        want,
        "signed_division_avoids_the_idiv_traps: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// r4 is rcx: parked in r11 around the shift.
#[test]
fn shifts_without_bmi2_go_through_cl() {
    let got = code(
        "lsh %r1, %r2\nrsh32 %r4, %r1\narsh %r1, %r4\nmov %r0, %r1\nexit",
        0,
        0,
    );
    let want: &[&str] = &[
        "endbr64",
        "xor ecx,ecx",
        "mov r11,rcx",
        "mov rcx,rsi",
        "shl rdi,cl",
        "mov rcx,r11",
        "mov r11,rcx",
        "mov rcx,rdi",
        "shr r11d,cl",
        "mov ecx,r11d",
        "sar rdi,cl",
        "mov rax,rdi",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "shifts_without_bmi2_go_through_cl: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// shlx/shrx/sarx.
#[test]
fn shifts_with_bmi2_use_any_register() {
    let got = code(
        "lsh %r1, %r2\nrsh32 %r4, %r1\narsh %r1, %r4\nmov %r0, %r1\nexit",
        0,
        FEATURE_BMI2,
    );
    let want: &[&str] = &[
        "endbr64",
        "xor ecx,ecx",
        "shlx rdi,rdi,rsi",
        "shrx ecx,ecx,edi",
        "sarx rdi,rdi,rcx",
        "mov rax,rdi",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "shifts_with_bmi2_use_any_register: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// lock add, lock xadd, xchg (locked implicitly), lock cmpxchg (+ zero-extension of eax), a cmpxchg loop for fetch-and.
#[test]
fn atomics_are_lock_prefixed() {
    let got = code("lock add [%r1+0], %r2\nlock fetch add32 [%r1+4], %r2\nlock xchg [%r1+8], %r3\nlock cmpxchg32 [%r1+12], %r2\nlock fetch and [%r1+16], %r2\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "xor eax,eax",
        "xor edx,edx",
        "lock add QWORD PTR [rdi],rsi",
        "lock xadd DWORD PTR [rdi+0x4],esi",
        "xchg QWORD PTR [rdi+0x8],rdx",
        "lock cmpxchg DWORD PTR [rdi+0xc],esi",
        "mov eax,eax",
        "lea r11,[rdi+0x10]",
        "mov r10,rax",
        "mov rax,QWORD PTR [r11]",
        "mov r9,rax",
        "and r9,rsi",
        "lock cmpxchg QWORD PTR [r11],r9",
        "jne 0x26",
        "mov rsi,rax",
        "mov rax,r10",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "atomics_are_lock_prefixed: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// disp8/disp32/no displacement, r13 needs a disp8, sil needs REX, the stack frame is rbp-relative.
#[test]
fn memory_addressing_forms() {
    let got = code("stxdw [%r10-8], %r1\nldxb %r0, [%r10-512]\nldxh %r2, [%r1+200]\nmov %r7, %r1\nldxsw %r3, [%r7+0]\nstb [%r1+0], 5\nstxb [%r1+1], %r2\nsth [%r1+2], -2\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "push rbp",
        "push r13",
        "mov rbp,rsp",
        "sub rsp,0x200",
        "mov QWORD PTR [rbp-0x8],rdi",
        "movzx eax,BYTE PTR [rbp-0x200]",
        "movzx esi,WORD PTR [rdi+0xc8]",
        "mov r13,rdi",
        "movsxd rdx,DWORD PTR [r13+0x0]",
        "mov BYTE PTR [rdi],0x5",
        "mov BYTE PTR [rdi+0x1],sil",
        "mov WORD PTR [rdi+0x2],0xfffe",
        "mov rsp,rbp",
        "pop r13",
        "pop rbp",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "memory_addressing_forms: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// ldx + be of the same register.
#[test]
fn movbe_fuses_load_and_swap() {
    let got = code(
        "ldxw %r0, [%r1+0]\nbe32 %r0\nldxh %r2, [%r1+0]\nbe16 %r2\nexit",
        0,
        FEATURE_MOVBE,
    );
    let want: &[&str] = &[
        "endbr64",
        "movbe eax,DWORD PTR [rdi]",
        "movbe si,WORD PTR [rdi]",
        "movzx esi,si",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "movbe_fuses_load_and_swap: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// the env is kept in r12 and entry_sp saved; an unknown id stops with kind 3.
#[test]
fn callx_compares_ids_and_stops() {
    let got = code("mov %r0, 0\ncall %r0\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "push r12",
        "mov r12,rdx",
        "mov QWORD PTR [r12+0x50],rsp",
        "xor edx,edx",
        "xor ecx,ecx",
        "xor r8d,r8d",
        "xor eax,eax",
        "cmp rax,0x1",
        "jne 0x2d",
        "movabs r11,0x7f1234567890",
        "call r11",
        "pop r12",
        "ret",
        "mov QWORD PTR [r12+0x38],rax",
        "mov DWORD PTR [r12+0x28],0x3",
        "mov QWORD PTR [r12+0x30],0x1",
        "or rax,0xffffffffffffffff",
        "mov rsp,QWORD PTR [r12+0x50]",
        "jmp 0x2a",
    ];
    assert_eq!(
        got,
        want,
        "callx_compares_ids_and_stops: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// the entry reserves both frames; the callee needs no frame of its own.
#[test]
fn local_calls_move_r10_by_one_frame() {
    let got = code(
        "mov %r1, %r10\ncall local f\nexit\nf:\nstdw [%r1-8], 1\nexit",
        0,
        0,
    );
    let want: &[&str] = &[
        "endbr64",
        "push rbp",
        "mov rbp,rsp",
        "sub rsp,0x400",
        // The callee reads none of r3-r5 but returns an r0 it never wrote.
        "xor eax,eax",
        "mov rdi,rbp",
        "sub rbp,0x200",
        "call 0x2c",
        "add rbp,0x200",
        "mov rsp,rbp",
        "pop rbp",
        "ret",
        "mov QWORD PTR [rdi-0x8],0x1",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "local_calls_move_r10_by_one_frame: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// ctx then stack block then the region scan; cmova clamps; [r10-8] carries no check; the
/// block (one line: the program reaches r10 - 8 only) is zeroed with plain stores.
#[test]
fn sandbox_checks_clamp_and_skip_frame_constants() {
    let got = code(
        "ldxdw %r0, [%r2+8]\nstxdw [%r10-8], %r0\nexit",
        PJ_COMPILE_SANDBOX,
        0,
    );
    let want: &[&str] = &[
        "endbr64",
        "push rbp",
        "push r12",
        "mov r12,rdx",
        "mov QWORD PTR [r12+0x50],rsp",
        "mov rbp,rsp",
        "sub rsp,0x40",
        "mov QWORD PTR [r12+0x48],rbp",
        "mov QWORD PTR [r12+0x40],rsp",
        "xor eax,eax",
        "mov QWORD PTR [rsp],rax",
        "mov QWORD PTR [rsp+0x8],rax",
        "mov QWORD PTR [rsp+0x10],rax",
        "mov QWORD PTR [rsp+0x18],rax",
        "mov QWORD PTR [rsp+0x20],rax",
        "mov QWORD PTR [rsp+0x28],rax",
        "mov QWORD PTR [rsp+0x30],rax",
        "mov QWORD PTR [rsp+0x38],rax",
        "lea r11,[rsi+0x8]",
        "mov r10,r11",
        // Zeroed first: on Intel `sbb r9, r9` waits for r9's last writer.
        "xor r9d,r9d",
        "sub r10,QWORD PTR [r12+0x10]",
        "add r10,0x8",
        "sbb r9,r9",
        "or r10,r9",
        "cmp r10,QWORD PTR [r12+0x70]",
        // The context inline: the hot path falls through to the clamp.
        "ja 0x7b",
        "cmova r11,r12",
        "mov rax,QWORD PTR [r11]",
        "mov QWORD PTR [rbp-0x8],rax",
        "mov rsp,rbp",
        "pop r12",
        "pop rbp",
        "ret",
        // Out of line: the access (pc 0, 8-byte read) for the shared check, which returns
        // only when some region holds it; back to the clamp.
        "mov r10d,0x8",
        "call 0x88",
        "jmp 0x69",
        // The shared check: the context, then the stack block (one compare: its length is
        // constant), then the host regions.
        "push rax",
        "push rcx",
        "push rdx",
        "xor ecx,ecx",
        "movzx edx,r10b",
        "mov rax,r11",
        "sub rax,QWORD PTR [r12+0x10]",
        "add rax,rdx",
        "sbb rcx,rcx",
        "or rax,rcx",
        "mov rcx,QWORD PTR [r12+0x18]",
        "sub rcx,QWORD PTR [r12+0x10]",
        "cmp rax,rcx",
        "jbe 0xff",
        "mov rax,r11",
        "sub rax,QWORD PTR [r12+0x40]",
        "mov ecx,0x40",
        "sub rcx,rdx",
        "cmp rax,rcx",
        "jbe 0xff",
        "mov rcx,QWORD PTR [r12+0x8]",
        "mov rax,QWORD PTR [r12]",
        "test rcx,rcx",
        "je 0x107",
        "test r10d,0x100",
        "je 0xe3",
        "test BYTE PTR [rax+0x10],0x1",
        "je 0xf6",
        "mov r9,r11",
        "sub r9,QWORD PTR [rax]",
        "jb 0xf6",
        "add r9,rdx",
        "jb 0xf6",
        "cmp r9,QWORD PTR [rax+0x8]",
        "jbe 0xff",
        "add rax,0x18",
        "dec rcx",
        "jmp 0xcf",
        // Found (ahead of the stop, so every jump here is short): the clamp again (a
        // mispredicted `jbe` arrives with "above"), then back.
        "pop rdx",
        "pop rcx",
        "pop rax",
        "cmova r11,r12",
        "ret",
        // No region holds it: the stop (address, pc and access from r10d), then the unwind.
        "mov QWORD PTR [r12+0x38],r11",
        "mov r9d,r10d",
        "shr r9d,0x9",
        "mov QWORD PTR [r12+0x30],r9",
        "and r10d,0x1ff",
        "mov DWORD PTR [r12+0x2c],r10d",
        "mov DWORD PTR [r12+0x28],0x1",
        "or rax,0xffffffffffffffff",
        "mov rsp,QWORD PTR [r12+0x50]",
        "jmp 0x77",
    ];
    assert_eq!(
        got,
        want,
        "sandbox_checks_clamp_and_skip_frame_constants: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// A loop that leaves a register free counts the budget there while it runs
/// (`Driver::count_budget_in_loops`): loaded from env.budget at the head, on the way in
/// (the back-edge lands past the load), each charge a `sub` of the register and a store of
/// it back to env.budget, never a load; the borrow test is the jump back (`jae` to the
/// loop, else on to the stop), and the stop stub adds the charge back to both.
#[test]
fn budget_charges_back_edges() {
    let got = code(
        "l:\nadd %r0, 1\njne %r0, 100, l\nexit",
        PJ_COMPILE_BUDGET,
        0,
    );
    let want: &[&str] = &[
        "endbr64",
        "push r12",
        "mov r12,rdx",
        "mov QWORD PTR [r12+0x50],rsp",
        "xor eax,eax",
        "mov r8,QWORD PTR [r12+0x20]",
        "add rax,0x1",
        "cmp rax,0x64",
        "je 0x2c",
        "sub r8,0x2",
        "mov QWORD PTR [r12+0x20],r8",
        "jae 0x15",
        "jmp 0x2f",
        "pop r12",
        "ret",
        "add r8,0x2",
        "mov QWORD PTR [r12+0x20],r8",
        "mov eax,0x1",
        "mov DWORD PTR [r12+0x28],0x2",
        "mov QWORD PTR [r12+0x30],rax",
        "or rax,0xffffffffffffffff",
        "mov rsp,QWORD PTR [r12+0x50]",
        "jmp 0x2c",
    ];
    assert_eq!(
        got,
        want,
        "budget_charges_back_edges: emitted code changed:\n{}",
        got.join("\n")
    );
}

/// A loop with a helper call keeps the budget in env.budget: one read-modify-write per
/// charge, whose borrow test is the jump back; the stop stub adds the charge back there.
#[test]
fn budget_charges_in_env_in_loops_that_call() {
    let got = code("l:\ncall 1\njne %r0, 100, l\nexit", PJ_COMPILE_BUDGET, 0);
    for line in [
        "sub QWORD PTR [r12+0x20],0x2",
        "add QWORD PTR [r12+0x20],0x2",
    ] {
        assert!(
            got.iter().any(|l| l == line),
            "`{line}` missing:\n{}",
            got.join("\n")
        );
    }
    assert!(
        !got.iter()
            .any(|l| l.ends_with("[r12+0x20]") && l.starts_with("mov")),
        "the budget is loaded into a register:\n{}",
        got.join("\n")
    );
}

/// test r8, imm8 for jset with a small mask, test for == 0, rel8 jumps.
#[test]
fn branches_use_test_and_short_forms() {
    let got = code("jset %r1, 0x80, +1\njsgt32 %r1, -5, +0\njeq %r1, 0, +0\njlt %r1, %r2, +0\nmov %r0, 0\nexit", 0, 0);
    let want: &[&str] = &[
        "endbr64",
        "test dil,0x80",
        "jne 0xf",
        "cmp edi,0xfffffffb",
        "jg 0xf",
        "test rdi,rdi",
        "je 0x14",
        "cmp rdi,rsi",
        "jb 0x19",
        "xor eax,eax",
        "ret",
    ];
    assert_eq!(
        got,
        want,
        "branches_use_test_and_short_forms: emitted code changed:\n{}",
        got.join("\n")
    );
}

#[test]
fn far_branches_relax_to_rel32_and_near_ones_stay_rel8() {
    // 40 instructions of 7 bytes (add rdi, imm32) between the jump and its target: too far
    // for rel8; the back-edge over two instructions stays short.
    let mut src = String::from("jeq %r1, 0, far\nl:\nadd %r1, 1\njne %r1, 9, l\n");
    for _ in 0..40 {
        src.push_str("add %r1, 100000\n");
    }
    src.push_str("far:\nmov %r0, %r1\nexit");
    let out = emit_program(&asm(&src), &[], 0).unwrap();
    assert_eq!(
        out.passes, 2,
        "one pass to find the far branch, one to settle"
    );
    let d = disasm(&out.bytes);
    // test rdi,rdi ; je rel32
    let o = out.inst_offsets[0] as usize;
    assert_eq!(&out.bytes[o..o + 3], &[0x48, 0x85, 0xff]);
    assert_eq!(&out.bytes[o + 3..o + 5], &[0x0f, 0x84], "{}", d.join("\n"));
    let jne = d.iter().position(|l| l.starts_with("jne")).unwrap();
    let off = out.inst_offsets[2] as usize;
    assert_eq!(out.bytes[off + 4], 0x75, "short jne: {}", d[jne]);
}

#[test]
fn far_backward_jumps_are_rel32_in_the_first_pass() {
    // A loop over 40 instructions of 7 bytes: its back-edge is too far for rel8, which the
    // first pass already knows (the label is bound when the jump is emitted).
    let mut src = String::from("mov %r0, 0\nl:\n");
    for _ in 0..40 {
        src.push_str("add %r1, 100000\n");
    }
    src.push_str("add %r0, 1\njne %r0, 9, l\nexit");
    let out = emit_program(&asm(&src), &[], 0).unwrap();
    assert_eq!(out.passes, 1);
    let d = disasm(&out.bytes);
    let jne = d
        .iter()
        .find(|l| l.starts_with("jne"))
        .expect("the back-edge");
    let back = out.inst_offsets[42] as usize + 4; // after `cmp rax, 9` (4 bytes)
    assert_eq!(
        &out.bytes[back..back + 2],
        &[0x0f, 0x85],
        "jne rel32: {jne}"
    );
}

fn req<'a>(
    code: &'a [u8],
    helpers: &'a [HelperEntry],
    features: u64,
    flags: u32,
) -> CompileRequest<'a> {
    CompileRequest {
        code,
        helpers,
        features,
        flags,
        blind_key: 0,
    }
}

#[test]
fn backend_identity_and_features() {
    let be = X86Backend::new();
    assert_eq!(be.name(), "packjit-x86-64");
    assert_eq!(be.supported_features(), FEATURE_BMI2 | FEATURE_MOVBE);
    assert_eq!(be.detect_features() & !be.supported_features(), 0);
}

#[test]
fn bad_requests_are_errors_naming_pc_and_reason() {
    let code = asm("call 9\nexit");
    let e = emit_program(&code, &helpers(), 0).unwrap_err();
    assert_eq!(e.pc, Some(0));
    assert!(e.message.contains('9'), "{e}");
    let ok = asm("mov %r0, 1\nexit");
    let arena = packjit::Runtime::new().unwrap();
    let arena = arena.arena().unwrap();
    let e = X86Backend::new()
        .compile(&req(&ok, &[], 1 << 5, 0), arena)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_eq!(
        e.message,
        "unknown x86-64 feature bits 0x20 (supported: 0x3)"
    );
    let e = X86Backend::new()
        .compile(&req(&ok, &[], 0, 1 << 9), arena)
        .unwrap_err();
    assert!(e.message.starts_with("unknown compile flags 0x200"), "{e}");
    let e = emit_program(&ok[..8], &[], 0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "pc 0: falls through past the end of the program"
    );
}

#[test]
fn line_table_maps_every_slot_to_its_code() {
    let code = asm("mov %r0, 1\nlddw %r2, 0x1122334455667788\nadd %r0, %r2\nexit");
    let rt = packjit::Runtime::new().unwrap();
    let arena = rt.arena().unwrap();
    let c = X86Backend::new()
        .compile(&req(&code, &[], 0, 0), arena)
        .unwrap();
    let out = emit_program(&code, &[], 0).unwrap();
    // endbr64 (4 bytes), then one entry per slot; lddw's second slot has no code.
    assert_eq!(
        c.pc_offsets,
        vec![
            4,
            out.inst_offsets[1],
            packjit_plugin_api::NO_NATIVE_CODE,
            out.inst_offsets[2],
            out.inst_offsets[3],
        ]
    );
    assert!(out.inst_offsets.windows(2).all(|w| w[0] < w[1]));
    arena.free(&c.region);
}

/// The inlined built-ins (`packjit_testkit::inline_cases`, the same on every arch): the rseq
/// CPU id is one `fs`-relative load, the clock reads `rdtsc` and scales it with the 64.64
/// factor the host keeps at `addr`, the per-CPU lookup bounds-checks array id, index and CPU
/// before forming `base + cpu * slot + index * size`, and the per-CPU address instruction
/// adds `cpu * slot_size` (0 for an unknown array or CPU). Trusted code: the sequences and
/// the entry only.
#[test]
fn inlined_builtins_are_short_sequences() {
    let helpers = packjit_testkit::inline_cases::helpers();
    let entry = [
        "endbr64",
        "push rax",
        "xor edx,edx",
        "xor ecx,ecx",
        "xor r8d,r8d",
    ];
    let with_entry = |body: &[&str]| -> Vec<String> {
        entry
            .iter()
            .chain(body)
            .chain(&["pop rcx", "ret"])
            .map(|s| s.to_string())
            .collect()
    };
    let want = [
        with_entry(&["mov eax,DWORD PTR fs:0xffffffffffffffac"]),
        with_entry(&[
            "mov r10,rdx",
            "movabs r11,0x7f0012345000",
            "rdtsc",
            "shl rdx,0x20",
            "or rax,rdx",
            "mov r9,rax",
            "mul QWORD PTR [r11+0x8]",
            "imul r9,QWORD PTR [r11+0x0]",
            "add r9,rdx",
            "add r9,QWORD PTR [r11+0x10]",
            "mov rax,r9",
            "mov rdx,r10",
        ]),
        with_entry(&[
            "xor edi,edi",
            "mov esi,0x3",
            "movabs r11,0x7f0012346000",
            "cmp rdi,QWORD PTR [r11]",
            "jae 0x5e",
            "imul r9,rdi,0x28",
            "lea r9,[r11+r9*1+0x10]",
            "cmp rsi,QWORD PTR [r9+0x18]",
            "jae 0x5e",
            "mov r10,QWORD PTR [r11+0x8]",
            "mov eax,DWORD PTR fs:[r10]",
            "cmp rax,QWORD PTR [r9+0x20]",
            "jae 0x5e",
            "sbb r10,r10",
            "and rax,r10",
            "imul rax,QWORD PTR [r9+0x8]",
            "imul rsi,QWORD PTR [r9+0x10]",
            "add rax,rsi",
            "add rax,QWORD PTR [r9+0x0]",
            "jmp 0x60",
            "xor eax,eax",
        ]),
        [
            "endbr64",
            "push rax",
            "mov r10d,DWORD PTR fs:0xffffffffffffffac",
            "xor r9d,r9d",
            "movabs r11,0x7f0012346000",
            "cmp QWORD PTR [r11],r9",
            "jbe 0x3a",
            "imul r9,r9,0x28",
            "add r11,r9",
            "cmp r10,QWORD PTR [r11+0x30]",
            "jae 0x3a",
            "mov r9,r10",
            "imul r9,QWORD PTR [r11+0x18]",
            "jmp 0x3d",
            "xor r9d,r9d",
            "mov rax,rdi",
            "add rax,r9",
            "pop rcx",
            "ret",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for ((name, code, flags), want) in packjit_testkit::inline_cases::programs().iter().zip(want) {
        let out = emit_request(&packjit_plugin_api::CompileRequest {
            code,
            helpers: &helpers,
            features: 0,
            flags: *flags,
            blind_key: 1,
        })
        .unwrap();
        let got = disasm(&out.bytes);
        assert_eq!(got, want, "{name}:\n{}", got.join("\n"));
    }
}

/// The Spectre clamps that no functional test can see, on the bench's loops
/// (`packjit_testkit::bench`): the walked stack pointer's loop (back-edge lands on a `cmov`
/// of the pointer into a dead register on the loop's own flags, then the load through that
/// copy), the header-parse loop (back-edge lands past the group's check: no check per
/// iteration), and that loop's checked copy, which ends with `lfence` before the code the
/// skipping jump trusts.
#[test]
fn loops_clamp_what_they_no_longer_check() {
    let programs = packjit_testkit::bench::sandbox_programs();
    let hot_loop = |name: &str| -> (Vec<String>, Vec<String>) {
        let p = programs.iter().find(|p| p.name.starts_with(name)).unwrap();
        let out = emit_request(&packjit_plugin_api::CompileRequest {
            code: &p.code,
            helpers: &[],
            features: 0,
            flags: PJ_COMPILE_SANDBOX,
            blind_key: 1,
        })
        .unwrap();
        let from = packjit_testkit::bench::loop_landing(
            p.hot.start,
            out.inst_offsets[p.hot.start] as usize,
            &out.landings,
        );
        let to = out.inst_offsets[p.hot.end] as usize;
        (disasm(&out.bytes[from..to]), disasm(&out.bytes))
    };
    let want: [&[&str]; 2] = [
        &[
            // The clamp writes the pointer's copy (r1, dead in and after the loop), off
            // the pointer's own chain, which is `add rdx, 8` alone.
            "mov edi,0x0",
            "cmovb rdi,rdx",
            "mov rcx,QWORD PTR [rdi]",
            "add rax,rcx",
            "add rdx,0x8",
            "cmp rdx,rbp",
            "jne 0x0",
        ],
        &[
            "movzx esi,WORD PTR [rdi+0xc]",
            "movzx edx,BYTE PTR [rdi+0x17]",
            "mov ecx,DWORD PTR [rdi+0x1a]",
            "mov r8d,DWORD PTR [rdi+0x1e]",
            "movzx r13d,WORD PTR [rdi+0x22]",
            "add rax,rsi",
            "xor rax,rdx",
            "add rax,rcx",
            "xor rax,r8",
            "add rax,r13",
            "add rbx,0x1",
            "cmp rbx,0x1000",
            "jb 0x0",
        ],
    ];
    // The context walk: a guarded walk (bounds known at run time), no check in the loop,
    // the pointer's clamped copy in rdi (`bound > ptr`: cmova). The entry test ends with
    // `lfence`, once per loop entry.
    let (ctx_walk, all) = hot_loop("ctx hash");
    let want_ctx = [
        "mov edi,0x0",
        "cmova rdi,rdx",
        "mov rcx,QWORD PTR [rdi]",
        "xor rax,rcx",
        "imul rax,r8",
        "add rdx,0x8",
        "cmp rsi,rdx",
        "ja 0x0",
    ];
    assert_eq!(ctx_walk, want_ctx, "context walk:\n{}", ctx_walk.join("\n"));
    assert_eq!(
        all.iter().filter(|l| *l == "lfence").count(),
        1,
        "{}",
        all.join("\n")
    );
    let (walk, _) = hot_loop("stack table (checked");
    assert_eq!(walk, want[0], "walk:\n{}", walk.join("\n"));
    let (header, all) = hot_loop("header parse");
    assert_eq!(header, want[1], "header:\n{}", header.join("\n"));
    assert_eq!(
        all.iter().filter(|l| *l == "lfence").count(),
        1,
        "{}",
        all.join("\n")
    );
}

/// With dense helper ids a `callx` bounds the id, loads the address from a table placed
/// after all code (8-byte aligned data) and calls it; a hole (address 0) or an id past the
/// table stops like an unknown id.
#[test]
fn callx_dispatches_through_a_table_when_ids_are_dense() {
    let hs = packjit_testkit::inline_cases::dense_callx_helpers(HELPER_ADDR);
    let out = emit_program(&asm("mov %r0, 0\ncall %r0\nexit"), &hs, 0).unwrap();
    let table = out.bytes.len() - 64;
    assert_eq!(table % 8, 0, "aligned");
    assert_eq!(
        out.bytes[table..],
        packjit_testkit::inline_cases::dense_callx_table(HELPER_ADDR)
    );
    let d = disasm(&out.bytes[..table]);
    let at = d.iter().position(|l| l == "cmp rax,0x8").expect("bound");
    assert!(d[at + 1].starts_with("jae "), "{d:#?}");
    assert!(d[at + 2].starts_with("lea r11,[rip+"), "{d:#?}");
    assert_eq!(
        d[at + 3..at + 5],
        // (A dynamic base register gets a zero disp8: it might have been rbp or r13.)
        ["mov r11,QWORD PTR [r11+rax*8+0x0]", "test r11,r11"],
        "{d:#?}"
    );
    assert!(d[at + 5].starts_with("je "), "{d:#?}");
    assert_eq!(d[at + 6], "call r11");
}

/// Sandboxed code whose callee may rest its proofs on what its caller passes puts an `int3`
/// before the callee, where straight-line speculation past the caller's last `ret` or `jmp`
/// would otherwise run on into it; trusted code has none.
#[test]
fn sandboxed_callees_sit_behind_a_speculation_barrier() {
    let src = "mov %r1, %r10\nadd %r1, -8\nstxdw [%r10-8], %r1\ncall local f\nexit\nf:\nldxdw %r0, [%r1]\nexit";
    let disasm_of = |flags: u32| {
        let out = emit_request(&packjit_plugin_api::CompileRequest {
            code: &asm(src),
            helpers: &helpers(),
            features: 0,
            flags,
            blind_key: 1,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        // The callee's first instruction is the program's sixth.
        let callee = out.inst_offsets[5] as usize;
        let before = disasm(&out.bytes[..callee]);
        assert_eq!(disasm(&out.bytes).len(), out.native_insns);
        before
    };
    let sandboxed = disasm_of(PJ_COMPILE_SANDBOX);
    let barriers = sandboxed.iter().filter(|l| *l == "int3").count();
    assert_eq!(barriers, 1, "{sandboxed:#?}");
    let trusted = disasm_of(0);
    assert!(!trusted.iter().any(|l| l == "int3"), "{trusted:#?}");
}

/// A check group reaching below its base (clang's byte run off an advanced pointer,
/// `ranges::GROUP_BELOW`): one widened test of `[r5 - 3, r5 + 5)` against the context, then
/// the Spectre clamp sets the base to 3 (not 0) under a mispredicted test, so both members
/// stay in the never-mapped first page; the members load unchecked off the base.
#[test]
fn group_below_its_base_clamps_the_base_to_minus_lo() {
    let got = code(
        "mov %r5, %r2\nand %r5, 15\nadd %r5, %r1\nadd %r5, 3\n\
         ldxb %r6, [%r5-3]\nldxb %r7, [%r5+4]\nadd %r6, %r7\nmov %r0, %r6\nexit",
        PJ_COMPILE_SANDBOX,
        0,
    );
    let at = got.iter().position(|l| l == "add r8,0x3").unwrap();
    let window: Vec<&str> = got[at..at + 17].iter().map(|s| s.as_str()).collect();
    // The widened test's address goes straight to r10: the failing side is the group's
    // checked copy, which needs no address in r11. The length is the host's `env.ctx_len`.
    let want: &[&str] = &[
        "add r8,0x3",
        "lea r10,[r8-0x3]",
        "xor r9d,r9d",
        "sub r10,QWORD PTR [r12+0x10]",
        "add r10,0x8",
        "sbb r9,r9",
        "or r10,r9",
        "cmp r10,QWORD PTR [r12+0x70]",
        "ja COLD",
        "mov r9d,0x3",
        "cmova r8,r9",
        "movzx ebx,BYTE PTR [r8-0x3]",
        "movzx r13d,BYTE PTR [r8+0x4]",
        "add rbx,r13",
        "mov rax,rbx",
        "pop r12",
        "pop r13",
    ];
    let mut window = window;
    assert!(window[8].starts_with("ja "), "{}", got.join("\n"));
    window[8] = "ja COLD";
    assert_eq!(window, want, "emitted code changed:\n{}", got.join("\n"));
}

/// The clamp no functional test can see on an index-bounded context access
/// (`packjit_frontend::indexes`): `words`' loop, `r3 = *(u8 *)(r1 + r4)` with `r4 < r2` on
/// every path, re-tests the index against the length branch-free and selects a harmless
/// address before the load.
#[test]
fn index_bounded_access_clamps_its_address() {
    use packjit_frontend::encode_insn as ins;
    let code = [
        ins(0xb7, 0, 0, 0, 0),  // r0 = 0
        ins(0xb7, 4, 0, 0, 0),  // r4 = 0
        ins(0x15, 2, 0, 7, 0),  // if r2 == 0 goto out
        ins(0x05, 0, 0, 5, 0),  // goto test
        ins(0xbf, 5, 1, 0, 0),  // head: r5 = r1
        ins(0x0f, 5, 4, 0, 0),  // r5 += r4
        ins(0x71, 3, 5, 0, 0),  // r3 = *(u8 *)(r5 + 0)
        ins(0x0f, 0, 3, 0, 0),  // r0 += r3
        ins(0x07, 4, 0, 0, 1),  // r4 += 1
        ins(0xad, 4, 2, -6, 0), // test: if r4 < r2 goto head
        ins(0x95, 0, 0, 0, 0),  // out: exit
    ]
    .concat();
    let out = packjit_x86_64::emit_request(&packjit_plugin_api::CompileRequest {
        code: &code,
        helpers: &[],
        features: 0,
        flags: packjit_plugin_api::abi::PJ_COMPILE_SANDBOX,
        blind_key: 1,
    })
    .unwrap();
    let got = disasm(&out.bytes);
    let want: &[&str] = INDEX_CLAMP;
    assert!(
        got.windows(want.len()).any(|w| w == want),
        "no {want:?} in:\n{}",
        got.join("\n")
    );
}

/// `index_bounded_access_clamps_its_address`'s window: `r11 = r5`, `r4 < r2` re-tested, `env`
/// selected when it fails, the load through r11.
const INDEX_CLAMP: &[&str] = &[
    "mov r11,r8",
    "cmp rcx,rsi",
    "cmovae r11,r12",
    "movzx edx,BYTE PTR [r11]",
];

/// A one-byte access of unknown origin: the context test needs no end (`r11 - start <
/// len`, an address below the start wrapping past any length), so no carry to force; the
/// clamp is a `cmovae` on that compare, and the slow path returns past it (its routine
/// clamps on its own compare).
#[test]
fn byte_access_tests_the_context_start_and_length_only() {
    let got = code("ldxb %r0, [%r2+5]\nexit", PJ_COMPILE_SANDBOX, 0);
    let at = got.iter().position(|l| l == "lea r11,[rsi+0x5]").unwrap();
    let mut window: Vec<&str> = got[at..at + 7].iter().map(|s| s.as_str()).collect();
    let want: &[&str] = &[
        "lea r11,[rsi+0x5]",
        "mov r10,r11",
        "sub r10,QWORD PTR [r12+0x10]",
        "cmp r10,QWORD PTR [r12+0x70]",
        "jae COLD",
        "cmovae r11,r12",
        "movzx eax,BYTE PTR [r11]",
    ];
    assert!(window[4].starts_with("jae "), "{}", got.join("\n"));
    window[4] = "jae COLD";
    assert_eq!(window, want, "emitted code changed:\n{}", got.join("\n"));
}

/// A check group of one byte (clang reading `p[i]` three times, as `calls`' `absorb` does):
/// its widened test is the one-byte access's, `base + lo - start < len` with no end and no
/// carry to force, and the clamp moves the base on that compare's `jae` flags.
#[test]
fn one_byte_group_tests_the_context_start_and_length_only() {
    let got = code(
        "mov %r5, %r2\nand %r5, 15\nadd %r5, %r1\n\
         ldxb %r6, [%r5+2]\nadd %r0, %r6\nldxb %r7, [%r5+2]\nxor %r0, %r7\nexit",
        PJ_COMPILE_SANDBOX,
        0,
    );
    let at = got.iter().position(|l| l == "lea r10,[r8+0x2]").unwrap();
    let mut window: Vec<&str> = got[at..at + 9].iter().map(|s| s.as_str()).collect();
    let want: &[&str] = &[
        "lea r10,[r8+0x2]",
        "sub r10,QWORD PTR [r12+0x10]",
        "cmp r10,QWORD PTR [r12+0x70]",
        "jae COLD",
        "mov r9d,0x0",
        "cmovae r8,r9",
        "movzx ebx,BYTE PTR [r8+0x2]",
        "add rax,rbx",
        "movzx r13d,BYTE PTR [r8+0x2]",
    ];
    assert!(window[3].starts_with("jae "), "{}", got.join("\n"));
    window[3] = "jae COLD";
    assert_eq!(window, want, "emitted code changed:\n{}", got.join("\n"));
}

/// A check group on the stack (`sieve`'s `composite[j / 64] |= …`: a load and a store
/// through one pointer of unknown offset into the frame): one test of the offset from the
/// block's start against `block - span`, formed in r10 directly (the failing side is the
/// group's checked copy, which needs no address in r11), then the base clamped in place;
/// both members go through the base unchecked.
#[test]
fn stack_group_tests_the_offset_in_r10() {
    let got = code(
        "ldxdw %r3, [%r1+0]\nmov %r4, %r10\nadd %r4, -256\nadd %r4, %r3\n\
         ldxdw %r5, [%r4+0]\nor %r5, 1\nstxdw [%r4+0], %r5\nmov %r0, 0\nexit",
        PJ_COMPILE_SANDBOX,
        0,
    );
    let at = got.iter().position(|l| l == "add rcx,rdx").unwrap();
    let mut window: Vec<&str> = got[at..at + 10].iter().map(|s| s.as_str()).collect();
    assert!(window[4].starts_with("ja "), "{}", got.join("\n"));
    window[4] = "ja COLD";
    let want: &[&str] = &[
        "add rcx,rdx",
        "mov r10,rcx",
        "sub r10,QWORD PTR [r12+0x40]",
        "cmp r10,0x1f8",
        "ja COLD",
        "mov r9d,0x0",
        "cmova rcx,r9",
        "mov r8,QWORD PTR [rcx]",
        "or r8,0x1",
        "mov QWORD PTR [rcx],r8",
    ];
    assert_eq!(window, want, "emitted code changed:\n{}", got.join("\n"));
}

/// A counted walk (`packjit_frontend::walks`) with a budget: the back-edge's charge comes
/// before its `test`, so the clamp it lands on reads that test's flags (`cmovle`, the
/// counter at 0 or below) without making it again.
#[test]
fn counted_walk_clamp_reads_the_back_edge_flags_under_a_budget() {
    let got = code(
        "mov %r0, 0\nmov %r6, %r10\nadd %r6, -256\nmov %r7, 5\nl:\nldxw %r9, [%r6-4]\n\
         add %r7, -1\nstxw [%r6+0], %r9\nadd %r6, -4\njne %r7, 0, l\nexit",
        PJ_COMPILE_SANDBOX | PJ_COMPILE_BUDGET,
        0,
    );
    // The loop, from the clamp its back-edge lands on to the refund where it ends.
    let want: &[&str] = &[
        "mov r9d,0x8000",
        "cmovle rbx,r9",
        "mov r15d,DWORD PTR [rbx-0x4]",
        "add r13,0xffffffffffffffff",
        "mov DWORD PTR [rbx],r15d",
        "add rbx,0xfffffffffffffffc",
        "sub QWORD PTR [r12+0x20],0x5",
        "jb 0x13c",
        "test r13,r13",
        "jne 0x92",
        "add QWORD PTR [r12+0x20],0x5",
    ];
    assert!(
        got.windows(want.len()).any(|w| w == want),
        "emitted code changed:\n{}",
        got.join("\n")
    );
}
