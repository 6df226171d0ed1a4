//! gdb end to end (x86-64 hosts only): real gdb, in batch mode, breaks in a JIT-compiled
//! program by its name and shows it in the backtrace.
//!
//! One binary plays both parts (`harness = false`): run normally it starts gdb on itself;
//! with `PACKJIT_GDB_E2E_TARGET` set (by that gdb run) it is the debuggee, which enables gdb
//! registration, loads a named program and calls it. gdb is required: when it is missing the
//! test fails (scripts/env.sh installs it).
//!
//! It spawns a process, so it never runs under qemu-user: on other architectures it does
//! nothing but say so.

#[cfg(target_arch = "x86_64")]
mod x86 {
    use packjit::{ArenaConfig, LoadOptions, MapMode, Runtime, RuntimeConfig};
    use std::process::Command;
    use std::sync::Arc;

    pub const PROG: &str = "packjit_gdb_e2e_prog";
    const ENV: &str = "PACKJIT_GDB_E2E_TARGET";

    /// The debuggee: `r0 = ctx[0] * 7 + 5` through a loop, so the code has a body to stop in.
    pub fn target(map_mode: MapMode) {
        let rt = Runtime::with_config(RuntimeConfig {
            arena: ArenaConfig {
                map_mode,
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
            .unwrap();
        rt.enable_gdb_jit().unwrap();
        let insn = |op: u8, dst: u8, src: u8, off: i16, imm: i32| {
            let (o, i) = (off.to_le_bytes(), imm.to_le_bytes());
            [op, src << 4 | dst, o[0], o[1], i[0], i[1], i[2], i[3]]
        };
        let code: Vec<u8> = [
            insn(0x71, 2, 1, 0, 0),  // ldxb r2, [r1+0]
            insn(0xb7, 0, 0, 0, 5),  // mov r0, 5
            insn(0xb7, 3, 0, 0, 0),  // mov r3, 0
            insn(0x0f, 0, 2, 0, 0),  // add r0, r2
            insn(0x07, 3, 0, 0, 1),  // add r3, 1
            insn(0xa5, 3, 0, -3, 7), // jlt r3, 7, -3
            insn(0x95, 0, 0, 0, 0),  // exit
        ]
        .concat();
        let p = rt
            .load(
                &code,
                &LoadOptions {
                    name: Some(PROG.into()),
                    ..Default::default()
                },
            )
            .unwrap();
        let mut ctx = [6u8; 8];
        // For the driver to check gdb's line table against.
        println!("debuggee: pc offsets {:?}", p.pc_offsets());
        let r = p.call(&mut ctx).unwrap();
        assert_eq!(r, 47);
        println!("debuggee: {PROG} returned {r} at {:#x}", p.entry_addr());
    }

    /// Runs the debuggee (arena `mode`) under gdb in batch mode with `commands`; returns
    /// gdb's standard output after checking that the debuggee ran to its end.
    fn gdb(mode: &str, commands: &[&str]) -> String {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new("gdb");
        cmd.args(["-nx", "-batch"]);
        // The program's symbol only exists once it is loaded (registered), so breakpoints on
        // it start out pending.
        for c in [
            "set debuginfod enabled off",
            "set startup-with-shell off",
            "set breakpoint pending on",
        ]
        .iter()
        .chain(commands)
        {
            cmd.args(["-ex", c]);
        }
        let out = cmd
            .arg("--args")
            .arg(&exe)
            .env(ENV, mode)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run gdb ({e}): this test needs it; install it \
                     (Debian package gdb; scripts/env.sh does)"
                )
            });
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("--- gdb ({mode} arena) stdout\n{stdout}--- stderr\n{stderr}---");
        assert!(out.status.success(), "gdb failed: {}", out.status);
        assert!(
            stdout.contains(&format!("debuggee: {PROG} returned 47")),
            "the debuggee did not finish"
        );
        assert!(
            stdout.contains("exited normally"),
            "the debuggee did not exit"
        );
        stdout
    }

    fn has_line(out: &str, what: &str, f: impl Fn(&str) -> bool) {
        assert!(out.lines().any(f), "no line with {what}");
    }

    /// Default arena: code is dual mapped, and the kernel refuses ptrace writes to a shared
    /// read-only mapping, so gdb cannot plant a software breakpoint there; a hardware one
    /// needs no write.
    fn hardware_breakpoint_on_the_name() {
        let out = gdb(
            "auto",
            &[
                &format!("hbreak {PROG}"),
                "run",
                "bt 3",
                "info symbol $pc",
                "continue",
            ],
        );
        // Stopped at the program's entry, named, at line 1 of its pseudo source (pc 0).
        let at_line_1 = format!("{PROG} () at {PROG}.bpf:1");
        has_line(&out, "the stop in the program", |l| {
            l == format!("Breakpoint 1, {at_line_1}")
        });
        // The backtrace starts in the program and goes on into the runtime that called it.
        has_line(&out, "frame #0 in the program", |l| {
            l == format!("#0  {at_line_1}")
        });
        // (Whichever runtime function the call is inlined into names the frame: `exec`'s
        // with full debug info, the `Program` method the run path inlines it into with
        // line tables only.)
        has_line(&out, "frame #1 in the runtime", |l| {
            l.starts_with("#1 ")
                && (l.contains(" in packjit::") || l.contains(" in run"))
                && l.contains(" at runtime/src/")
        });
        has_line(&out, "info symbol naming the program", |l| {
            l.starts_with(&format!("{PROG} in section .text of <in-memory@"))
        });
    }

    /// (line, offset from the program's entry) of each `info line` answer: `Line 3 of
    /// "p.bpf" starts at address 0x... <p+51> and ends at ...`.
    fn info_lines(out: &str) -> Vec<(usize, u64)> {
        let head = format!("of \"{PROG}.bpf\" starts at address ");
        out.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("Line ")?;
                let (line, rest) = rest.split_once(' ')?;
                let rest = rest.strip_prefix(&head)?;
                let sym = rest.split_once('<')?.1.split_once('>')?.0;
                let off = match sym.strip_prefix(PROG)? {
                    "" => 0,
                    o => o.strip_prefix('+')?.parse().ok()?,
                };
                Some((line.parse().ok()?, off))
            })
            .collect()
    }

    /// Toggle-mode arena (private mappings): a plain `break` works, and `next` steps by
    /// eBPF instruction along the line table.
    fn software_breakpoint_and_stepping() {
        let out = gdb(
            "toggle",
            &[
                &format!("break {PROG}"),
                "run",
                "next",
                "info line *$pc",
                "next",
                "info line *$pc",
                "bt 1",
                "info symbol $pc",
                "continue",
            ],
        );
        has_line(&out, "the stop in the program", |l| {
            l == format!("Breakpoint 1, {PROG} () at {PROG}.bpf:1")
        });
        // Line N is eBPF pc N - 1, at the native offset the backend reported for it.
        let offsets: Vec<u64> = out
            .lines()
            .find_map(|l| l.strip_prefix("debuggee: pc offsets ["))
            .expect("the debuggee's line table")
            .trim_end_matches(']')
            .split(", ")
            .map(|o| o.parse().unwrap())
            .collect();
        let seen = info_lines(&out);
        assert_eq!(
            seen,
            [(2, offsets[1]), (3, offsets[2])],
            "pc offsets {offsets:?}"
        );
        has_line(&out, "frame #0 at line 3", |l| {
            l.starts_with("#0 ") && l.ends_with(&format!(" {PROG} () at {PROG}.bpf:3"))
        });
        let inside = format!("{PROG} + {} in section .text of <in-memory@", offsets[2]);
        has_line(&out, "info symbol inside the program", |l| {
            l.starts_with(&inside)
        });
    }

    pub fn drive() {
        hardware_breakpoint_on_the_name();
        software_breakpoint_and_stepping();
    }

    pub fn main() {
        if let Some(mode) = std::env::var_os(ENV) {
            target(if mode == "toggle" {
                MapMode::Toggle
            } else {
                MapMode::Auto
            });
        } else {
            drive();
            println!("gdb_e2e: ok");
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    x86::main();
    #[cfg(not(target_arch = "x86_64"))]
    println!("gdb_e2e: x86-64 hosts only (it starts gdb, which qemu-user runs must not)");
}
