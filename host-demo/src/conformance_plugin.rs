//! The bpf_conformance plugin protocol, so upstream's `bpf_conformance_runner` can drive
//! packjit (`packjit-demo conformance-plugin`, run under qemu-user for a foreign target).
//!
//! Protocol (as upstream's runner and reference plugins implement it):
//! * the program arrives on stdin as one line of hex bytes separated by whitespace (or as
//!   `--program <hex>`);
//! * the context memory is the first argument that does not start with `--`, hex bytes
//!   separated by whitespace; absent when the test has no memory;
//! * on success the plugin prints r0 in hex (`0x2a`; the runner parses it with
//!   `stoull(s, nullptr, 16)`, which accepts the prefix) and exits 0;
//! * on any failure (bad input, rejected program, cannot run) it prints one line to stderr
//!   and exits 1. The runner counts a non-zero exit as "the program was rejected".
//!
//! Options, before or after MEM: `--arch aarch64|riscv64|x86_64` (default: the host arch),
//! `--features N` (exact feature bits, decimal or 0x-hex), `--no-lse` (arm64: leave LSE out
//! of the detected set), `--no-bmi2` / `--no-movbe` (x86-64: likewise), `--debug` (print the
//! disassembly to stderr). `--elf` is refused:
//! only raw bytecode is supported. Helper 5 returns its first argument, as the suite expects.

use packjit::{LoadOptions, Runtime};
use packjit_plugin_api::Arch;
use std::io::{BufRead, Write};
use std::sync::Arc;

/// The helper id the suite's `call` tests use.
const SUITE_HELPER_ID: u32 = 5;

/// The suite's helper 5: returns its first argument.
extern "C" fn helper_identity(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    a
}

/// Parsed command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// Context memory.
    pub mem: Vec<u8>,
    /// Program given with `--program` instead of on stdin.
    pub program: Option<Vec<u8>>,
    /// Load options (arch, features).
    pub opts: LoadOptions,
    /// `--debug`.
    pub debug: bool,
}

fn parse_hex_bytes(what: &str, s: &str) -> Result<Vec<u8>, String> {
    s.split_whitespace()
        .map(|t| {
            let t = t.strip_prefix("0x").unwrap_or(t);
            if t.len() > 2 {
                return Err(format!("{what}: `{t}` is not a hex byte"));
            }
            u8::from_str_radix(t, 16).map_err(|_| format!("{what}: `{t}` is not a hex byte"))
        })
        .collect()
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses the arguments after the program name (a leading `conformance-plugin` is skipped).
pub fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut out = Args::default();
    let mut it = args.iter().map(String::as_str).peekable();
    if it.peek() == Some(&"conformance-plugin") {
        it.next();
    }
    let mut have_mem = false;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a {
            "--arch" => {
                let v = value("--arch")?;
                out.opts.arch = Some(
                    Arch::parse(v).ok_or_else(|| format!("--arch: unknown architecture `{v}`"))?,
                );
            }
            "--features" => {
                let v = value("--features")?;
                out.opts.features =
                    Some(parse_num(v).ok_or_else(|| format!("--features: `{v}` is not a number"))?);
            }
            "--no-lse" => out.opts.disable_features |= packjit_arm64::FEATURE_LSE,
            "--no-bmi2" => out.opts.disable_features |= packjit_x86_64::FEATURE_BMI2,
            "--no-movbe" => out.opts.disable_features |= packjit_x86_64::FEATURE_MOVBE,
            "--program" => out.program = Some(parse_hex_bytes("--program", value("--program")?)?),
            "--debug" => out.debug = true,
            "--elf" => return Err("--elf: ELF input is not supported (raw bytecode only)".into()),
            opt if opt.starts_with("--") => return Err(format!("unknown option `{opt}`")),
            mem if !have_mem => {
                out.mem = parse_hex_bytes("memory", mem)?;
                have_mem = true;
            }
            other => {
                return Err(format!(
                    "unexpected argument `{other}` (memory was already given)"
                ))
            }
        }
    }
    Ok(out)
}

/// Runs one program: returns the line to print on success (r0 in hex) or the error line.
pub fn run(args: &[String], stdin: &mut dyn BufRead) -> Result<String, String> {
    let mut a = parse_args(args)?;
    let code = match a.program.take() {
        Some(p) => p,
        None => {
            let mut line = String::new();
            stdin
                .read_line(&mut line)
                .map_err(|e| format!("reading the program from stdin: {e}"))?;
            parse_hex_bytes("program", &line)?
        }
    };
    if code.is_empty() {
        return Err("no program: expected one line of hex bytes on stdin".into());
    }
    if a.debug {
        eprint!("{}", packjit_asm::disasm::disassemble(&code, true));
    }
    let rt = Runtime::new().map_err(|e| format!("runtime: {e}"))?;
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .map_err(|e| e.to_string())?;
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .map_err(|e| e.to_string())?;
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .map_err(|e| e.to_string())?;
    rt.register_helper(SUITE_HELPER_ID, "identity", helper_identity)
        .map_err(|e| e.to_string())?;
    let prog = rt
        .load(&code, &a.opts)
        .map_err(|e| format!("load failed: {e}"))?;
    let r0 = prog
        .call(&mut a.mem)
        .map_err(|e| format!("run failed: {e}"))?;
    Ok(format!("{r0:#x}"))
}

/// The plugin's `main`: reads stdin, prints the result or one error line; returns the exit
/// code (0 success, 1 failure).
pub fn main(args: &[String]) -> i32 {
    let stdin = std::io::stdin();
    match run(args, &mut stdin.lock()) {
        Ok(line) => {
            println!("{line}");
            let _ = std::io::stdout().flush();
            0
        }
        Err(e) => {
            // One line, whatever the message contains.
            eprintln!("{}", e.replace('\n', " "));
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_options_in_any_order() {
        let a = parse_args(&s(&[
            "conformance-plugin",
            "--arch",
            "riscv64",
            "aa  bb ",
            "--features",
            "0x3",
        ]))
        .unwrap();
        assert_eq!(a.mem, vec![0xaa, 0xbb]);
        assert_eq!(a.opts.arch, Some(Arch::Riscv64));
        assert_eq!(a.opts.features, Some(3));
        let a = parse_args(&s(&["01 02", "--no-lse", "--arch", "arm64"])).unwrap();
        assert_eq!(a.mem, vec![1, 2]);
        assert_eq!(a.opts.disable_features, packjit_arm64::FEATURE_LSE);
        assert_eq!(a.opts.arch, Some(Arch::Aarch64));
        assert_eq!(parse_args(&[]).unwrap(), Args::default());
    }

    #[test]
    fn bad_input_is_one_clean_error() {
        assert_eq!(
            parse_args(&s(&["--arch", "mips"])).unwrap_err(),
            "--arch: unknown architecture `mips`"
        );
        assert_eq!(
            parse_args(&s(&["--arch"])).unwrap_err(),
            "--arch needs a value"
        );
        assert_eq!(
            parse_args(&s(&["--bogus"])).unwrap_err(),
            "unknown option `--bogus`"
        );
        assert!(parse_args(&s(&["--elf"])).unwrap_err().contains("ELF"));
        assert!(parse_args(&s(&["00", "11"]))
            .unwrap_err()
            .contains("unexpected argument `11`"));
        assert_eq!(
            parse_args(&s(&["zz"])).unwrap_err(),
            "memory: `zz` is not a hex byte"
        );
        let mut empty: &[u8] = b"";
        assert!(run(&[], &mut empty).unwrap_err().contains("no program"));
        let mut bad: &[u8] = b"95 00 00\n";
        // 3 bytes: rejected by the verifier, naming the problem.
        let e = run(&s(&["--arch", "aarch64"]), &mut bad).unwrap_err();
        assert!(
            e.starts_with("load failed: ") && e.contains("multiple of 8"),
            "{e}"
        );
        let mut reserved: &[u8] = b"95 01 00 00 00 00 00 00\n";
        let e = run(&s(&["--arch", "riscv64"]), &mut reserved).unwrap_err();
        assert!(e.contains("pc 0"), "{e}");
    }

    #[test]
    fn runs_or_refuses_by_arch() {
        // mov r0, r2 ; exit  — returns the memory length.
        let prog = "bf 20 00 00 00 00 00 00 95 00 00 00 00 00 00 00\n";
        for arch in [Arch::Aarch64, Arch::Riscv64] {
            let r = run(
                &s(&["--arch", arch.name(), "00 00 00 01 00 00 00 02"]),
                &mut prog.as_bytes(),
            );
            if Arch::host() == Some(arch) {
                assert_eq!(r.unwrap(), "0x8");
            } else {
                assert!(r.unwrap_err().starts_with("run failed: "), "{arch}");
            }
        }
        // --program instead of stdin, and helper 5: mov r1, 42; call 5; exit
        let p = "b7 01 00 00 2a 00 00 00 85 00 00 00 05 00 00 00 95 00 00 00 00 00 00 00";
        if let Some(arch) = Arch::host().filter(|a| *a != Arch::X86_64) {
            assert_eq!(
                run(&s(&["--program", p, "--arch", arch.name()]), &mut &b""[..]).unwrap(),
                "0x2a"
            );
        }
    }
}
