//! `packjit-demo run PROG.o` / `dump PROG.o` end to end, with the statically linked backends
//! (so the host always has one): objects compiled from `tests/bpf/` with clang at test time.

#[path = "../../runtime/tests/elf_support/mod.rs"]
mod elf_support;

use std::process::{Command, Output};

fn obj(name: &str) -> std::path::PathBuf {
    let bytes = elf_support::compile_bpf(name);
    let p = elf_support::scratch_path(&format!("demo-{name}.o"));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The demo binary as a command. Under qemu-user (the cross test runs) this test is itself
/// emulated and the kernel cannot exec a foreign binary directly, so the demo is started
/// through the same runner cargo used for the test (`CARGO_TARGET_<TRIPLE>_RUNNER`, which the
/// test environment inherits); host binaries such as the runner itself exec natively.
fn demo_command() -> Command {
    let exe = env!("CARGO_BIN_EXE_packjit-demo");
    let runner_var = if cfg!(target_arch = "aarch64") {
        Some("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER")
    } else if cfg!(target_arch = "riscv64") {
        Some("CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_RUNNER")
    } else {
        None
    };
    match runner_var.and_then(|v| std::env::var(v).ok()) {
        Some(runner) => {
            let mut words = runner.split_whitespace();
            let mut cmd = Command::new(words.next().expect("runner is not empty"));
            cmd.args(words).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}

fn demo(args: &[&str]) -> Output {
    demo_command()
        .arg("--static-backends")
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the demo, expecting success: (stdout, stderr).
fn run_ok(args: &[&str]) -> (String, String) {
    let out = demo(args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}: {stderr}");
    (stdout, stderr)
}

#[test]
fn run_prints_r0_and_globals() {
    let o = obj("demo");
    let p = o.to_str().unwrap();
    let by_section = ["run", p, "--section", "demo", "--mem", "05 06 07"];
    // An object runs sandboxed unless --trusted; either way the answer is the same.
    for (extra, mode) in [(None, ", sandboxed"), (Some("--trusted"), ", trusted")] {
        let args: Vec<&str> = by_section.iter().copied().chain(extra).collect();
        let (stdout, stderr) = run_ok(&args);
        // len 3: sqrti(40 * 100) = 63, + mem[0] 5 + strlen("packjit") 7 = 75.
        assert!(stdout.starts_with("r0 = 0x4b\n"), "{args:?}: {stdout}");
        assert!(stdout.contains("calls (.bss) = 0x1"), "{stdout}");
        assert!(
            stderr.contains(mode),
            "{args:?}: `{mode}` missing from: {stderr}"
        );
    }
    // Same by function name, memory from a file, sandboxed.
    let mem = elf_support::scratch_path("demo-mem");
    std::fs::write(&mem, [1u8]).unwrap();
    let mem = mem.to_str().unwrap();
    let by_function = [
        "run",
        p,
        "--function",
        "prog_demo",
        "--mem-file",
        mem,
        "--sandbox",
    ];
    let (stdout, _) = run_ok(&by_function);
    // len 1: sqrti(2000) = 44, + 1 + 7 = 52.
    assert!(stdout.starts_with("r0 = 0x34\n"), "{stdout}");
}

/// Runs the demo, expecting exit status `code` and an error naming everything in `needles`.
fn expect_exit(args: &[&str], code: i32, needles: &[&str]) {
    let out = demo(args);
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {e}");
    for n in needles {
        assert!(e.contains(n), "{args:?}: `{n}` missing from: {e}");
    }
}

#[test]
fn run_names_the_program_for_perf_and_gdb() {
    let o = obj("demo");
    let p = o.to_str().unwrap();
    let mut args = vec![
        "run",
        p,
        "--section",
        "demo",
        "--mem",
        "05 06 07",
        "--perf-map",
        "--repeat",
        "3",
    ];
    // gdb's JIT interface describes x86-64 and arm64 code (the RV64 run is emulated anyway).
    if !cfg!(target_arch = "riscv64") {
        args.push("--gdb");
    }
    let (stdout, stderr) = run_ok(&args);
    // Three runs over the same memory: the answer does not depend on the count.
    assert!(stdout.starts_with("r0 = 0x4b\n"), "{args:?}: {stdout}");
    let path = stderr
        .lines()
        .find_map(|l| l.strip_prefix("perf map: "))
        .unwrap_or_else(|| panic!("no perf map path in: {stderr}"));
    let name = stderr
        .lines()
        .find_map(|l| l.strip_prefix("program name: "))
        .unwrap_or_else(|| panic!("no program name in: {stderr}"));
    assert!(name.contains("demo"), "{name}");
    let map = std::fs::read_to_string(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    assert!(
        map.lines().any(|l| l.ends_with(name)),
        "{name} missing from the perf map {path}:\n{map}"
    );
}

#[test]
fn sandbox_stops_exit_with_status_3_naming_pc_and_address() {
    let o = obj("sandbox");
    let p = o.to_str().unwrap();
    let oob = [
        "run",
        p,
        "--section",
        "pj/oob_read",
        "--mem",
        "0102",
        "--sandbox",
    ];
    expect_exit(&oob, 3, &["out of bounds", "pc 1", "read at 0x"]);
    let spin = [
        "run",
        p,
        "--section",
        "pj/spin",
        "--sandbox",
        "--budget",
        "1000",
    ];
    expect_exit(&spin, 3, &["budget"]);
    // Sandboxed is the default: no flag needed for the stop.
    expect_exit(
        &["run", p, "--section", "pj/rodata_write"],
        3,
        &["write at 0x"],
    );
    // Asking for both is a usage error, not a silent choice.
    let both = [
        "run",
        p,
        "--section",
        "pj/oob_read",
        "--sandbox",
        "--trusted",
    ];
    expect_exit(&both, 2, &["cannot be used with"]);
    // Options for an object without one are a usage error, not silently dropped.
    expect_exit(&["run", "--trusted"], 2, &["<OBJECT>"]);
    expect_exit(&["run", p, "--asm", p], 2, &["cannot be used with"]);
    // A load error is not a stop: status 1, the error names the section.
    expect_exit(&["run", p, "--section", "nope"], 1, &["no section `nope`"]);
}

#[test]
fn dump_disassembles_with_each_ebpf_instruction_marked() {
    let o = obj("demo");
    for (arch, native) in [("aarch64", "stp"), ("x86_64", "push")] {
        let out = demo(&[
            "dump",
            o.to_str().unwrap(),
            "--section",
            "demo",
            "--arch",
            arch,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s = text(&out.stdout);
        assert!(s.contains("extern sqrti -> helper"), "{s}");
        assert!(s.contains("<demo>:") && s.contains("<scan>:"), "{s}");
        assert!(s.contains("; pc 0: ") && s.contains("native [0x"), "{s}");
        assert!(s.contains(native), "{arch}: {s}");
    }
    let out = demo(&[
        "dump",
        o.to_str().unwrap(),
        "--section",
        "demo",
        "--arch",
        "riscv64",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("addi sp, sp"),
        "{}",
        text(&out.stdout)
    );
}

/// `dump --sandboxed` shows the budget's charges (x86-64 counts in `env.budget`, at
/// `[r12 + 0x20]`); `--no-budget` compiles the same checks without them, and is refused
/// without `--sandboxed`.
#[test]
fn dump_tells_the_budget_from_the_checks() {
    let o = obj("demo");
    let p = o.to_str().unwrap();
    let base = [
        "dump",
        p,
        "--section",
        "demo",
        "--arch",
        "x86_64",
        "--sandboxed",
    ];
    let (with_budget, _) = run_ok(&base);
    let no_budget: Vec<&str> = base.iter().copied().chain(["--no-budget"]).collect();
    let (without, _) = run_ok(&no_budget);
    let charges = |s: &str| s.lines().filter(|l| l.contains("[r12 + 0x20]")).count();
    assert!(charges(&with_budget) > 0, "{with_budget}");
    assert_eq!(charges(&without), 0, "{without}");
    // The memory checks are the same: each dump names the context bound at [r12 + 0x70].
    let ctx_checks = |s: &str| s.lines().filter(|l| l.contains("[r12 + 0x70]")).count();
    assert!(ctx_checks(&without) > 0, "{without}");
    assert_eq!(ctx_checks(&with_budget), ctx_checks(&without));
    let out = demo(&[
        "dump",
        p,
        "--section",
        "demo",
        "--arch",
        "x86_64",
        "--no-budget",
    ]);
    assert!(
        !out.status.success(),
        "--no-budget without --sandboxed was accepted"
    );
}

#[test]
fn run_with_maps_counts_packets_fills_the_ring_buffer_and_tail_calls() {
    let o = obj("demo_maps");
    let p = o.to_str().unwrap();
    // TCP, UDP, ICMP (8 bytes: tail call into `icmp`, which adds the length), TCP again.
    let packets = [
        "06 00 00 00",
        "11 00 00 00 00 00",
        "01 00 00 00 00 00 00 00",
        "06 00",
    ];
    let mut args = vec!["run", p, "--section", "pj/count"];
    for m in &packets {
        args.extend(["--mem", m]);
    }
    args.push("--maps");
    for trusted in [false, true] {
        let mut args = args.clone();
        if trusted {
            args.push("--trusted");
        }
        let (stdout, stderr) = run_ok(&args);
        assert!(stderr.contains("tail call target icmp"), "{stderr}");
        for want in [
            "packet 1 (06 00 00 00): r0 = 0x1\n",
            "packet 2 (11 00 00 00 00 00): r0 = 0x1\n",
            // The ICMP packet's result is the tail-called stage's.
            "packet 3 (01 00 00 00 00 00 00 00): r0 = 0x2\n",
            "packet 4 (06 00): r0 = 0x1\n",
            "map packets: BPF_MAP_TYPE_HASH, key 4 B, value 8 B, max_entries 256: 3 entries\n\
             \x20 01 00 00 00 (1) -> 01 00 00 00 00 00 00 00 (1)\n\
             \x20 06 00 00 00 (6) -> 02 00 00 00 00 00 00 00 (2)\n\
             \x20 11 00 00 00 (17) -> 01 00 00 00 00 00 00 00 (1)\n",
            "map icmp_bytes: BPF_MAP_TYPE_ARRAY, key 4 B, value 8 B, max_entries 1\n\
             \x20 [0] -> 08 00 00 00 00 00 00 00 (8)\n",
            // (proto, len, count so far) per packet, in order.
            "map events: BPF_MAP_TYPE_RINGBUF, 4096 B: 4 record(s) consumed\n\
             \x20 #0: 06 00 00 00 04 00 00 00 01 00 00 00 00 00 00 00\n\
             \x20 #1: 11 00 00 00 06 00 00 00 01 00 00 00 00 00 00 00\n\
             \x20 #2: 01 00 00 00 08 00 00 00 01 00 00 00 00 00 00 00\n\
             \x20 #3: 06 00 00 00 02 00 00 00 02 00 00 00 00 00 00 00\n",
            "map next: BPF_MAP_TYPE_PROG_ARRAY, max_entries 2\n  [0] -> (empty)\n  [1] -> icmp\n",
        ] {
            assert!(
                stdout.contains(want),
                "trusted {trusted}: `{want}` missing from:\n{stdout}"
            );
        }
    }
    // --repeat: every run counts, the maps accumulate; one packet keeps the `r0 =` line.
    let (stdout, _) = run_ok(&[
        "run",
        p,
        "--section",
        "pj/count",
        "--mem",
        "01 02 03",
        "--repeat",
        "3",
        "--maps",
    ]);
    assert!(stdout.starts_with("r0 = 0x2\n"), "{stdout}");
    assert!(
        stdout.contains("  01 00 00 00 (1) -> 03 00 00 00 00 00 00 00 (3)\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[0] -> 09 00 00 00 00 00 00 00 (9)\n"),
        "{stdout}"
    );
    assert!(stdout.contains("3 record(s) consumed"), "{stdout}");
    assert!(
        stdout.contains("  #2: 01 00 00 00 03 00 00 00 03 00 00 00 00 00 00 00\n"),
        "{stdout}"
    );
    // The tail call target alone, by function name, runs too (its prog array is filled all
    // the same: it is the program the slot names).
    let (stdout, _) = run_ok(&["run", p, "--function", "icmp", "--mem", "01 02", "--maps"]);
    assert!(stdout.starts_with("r0 = 0x2\n"), "{stdout}");
    assert!(stdout.contains("[1] -> icmp\n"), "{stdout}");
}

#[test]
fn a_malformed_map_definition_fails_naming_the_map_and_the_cause() {
    // A BTF map with a member libbpf does not define: refused when the object is opened,
    // before anything runs; status 1, the error names the object, map and member.
    let o = obj("maps_bad_member");
    let p = o.to_str().unwrap();
    expect_exit(
        &["run", p, "--section", "pj/m", "--mem", "00", "--maps"],
        1,
        &[p, "map `painted`", "unknown attribute member `colour`"],
    );
    // A legacy definition shorter than struct bpf_map_def.
    let o = obj("maps_bad_legacy");
    let p = o.to_str().unwrap();
    expect_exit(
        &["run", p, "--section", "pj/m"],
        1,
        &["legacy map `stubby`", "16 bytes", "at least 20"],
    );
}
