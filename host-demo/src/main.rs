//! `packjit-demo`: compile and run eBPF programs with packjit's backends.
//!
//! ```text
//! packjit-demo [run]            load the plugins, compile the sample for every arch, run it natively
//! packjit-demo run PROG.o --section S [--mem HEX | --mem-file F] [--trusted] [--budget N]
//!                   [--repeat N] [--perf-map] [--gdb] [--maps]
//!                               run a program from a clang object, sandboxed unless
//!                               --trusted: prints `r0 = 0x…`; a stop prints the error and
//!                               exits with status 3; --perf-map and --gdb name the program
//!                               for `perf report` and gdb, --repeat N runs it N times;
//!                               maps are created, programs named by prog arrays loaded
//!                               for tail calls; --mem several times: one run per packet;
//!                               --maps prints every map after the runs
//! packjit-demo dump --arch A    show a program's native code (hex, and objdump if installed)
//! packjit-demo dump PROG.o --section S --arch A [--sandboxed [--no-budget]]
//!                               capstone disassembly, each eBPF instruction's range marked
//! packjit-demo stats            batch-load programs, free some, print the arena statistics
//!                               (--perf-map: keep /tmp/perf-<pid>.map; --map: draw the packs)
//! packjit-demo bench            JIT vs the rbpf interpreter on a compute-bound program
//! packjit-demo conformance-plugin [MEM] [--arch A] [--no-lse] ...   bpf_conformance plugin
//! ```

mod bench;
mod conformance_plugin;
mod elf_cmd;
mod maps_print;
mod sample;
mod stats;

use clap::{Parser, Subcommand};
use packjit::{Arch, ArenaConfig, LoadOptions, MapMode, Program, Runtime, RuntimeConfig, Trust};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "packjit-demo",
    version,
    about = "packjit: eBPF JIT backends for x86-64, arm64 and RV64 in one packed code arena"
)]
struct Cli {
    /// Directory holding libpackjit_*.so plugins (default: PACKJIT_PLUGIN_DIR, then next to the
    /// executable, and the backends linked into this binary when neither holds any).
    #[arg(long, global = true)]
    plugin_dir: Option<PathBuf>,
    /// Link the backends statically instead of loading plugins.
    #[arg(long, global = true)]
    static_backends: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile the sample program for every backend and run it where the host can; or run
    /// one program of a clang object (PROG.o) on the host and print r0.
    Run {
        /// Relocatable eBPF object (`clang -O2 -target bpf -c`); needs --section or --function.
        object: Option<PathBuf>,
        #[command(flatten)]
        select: elf_cmd::Select,
        /// Context memory as hex bytes (ELF programs). Give it several times for several
        /// packets: one run each, in order, sharing the object's maps; a line of r0 per packet.
        #[arg(long, conflicts_with = "mem_file", requires = "object")]
        mem: Vec<String>,
        /// Context memory from a file (ELF programs).
        #[arg(long, requires = "object")]
        mem_file: Option<PathBuf>,
        /// Run sandboxed, the default: every memory access is checked, and a stop (access
        /// out of bounds, budget, unknown callx) exits with status 3 (ELF programs).
        #[arg(long, requires = "object")]
        sandbox: bool,
        /// Run as trusted code, without memory checks: only for an object you vouch for, as
        /// after the kernel's verifier (ELF programs).
        #[arg(long, conflicts_with = "sandbox", requires = "object")]
        trusted: bool,
        /// Instruction budget per run (ELF programs).
        #[arg(long, requires = "object")]
        budget: Option<u64>,
        /// Run the program N times, each on the memory as the run before left it, and print
        /// the last result: long enough for `perf record` to sample it (ELF programs). With
        /// several --mem, N rounds over the packets. Maps accumulate over all runs.
        #[arg(long, default_value_t = 1, requires = "object")]
        repeat: u64,
        /// Keep the perf map (/tmp/perf-PID.map), so `perf report` names the program
        /// (ELF programs).
        #[arg(long, requires = "object")]
        perf_map: bool,
        /// Register the program with gdb's JIT interface before it runs, so under gdb
        /// `hbreak <program name>` stops in it (ELF programs).
        #[arg(long, requires = "object")]
        gdb: bool,
        /// After the runs, print every map of the object: hash and array entries (key ->
        /// value in hex, per-CPU maps one value per CPU), the ring buffers' records (consumed),
        /// queue/stack values, and each prog-array slot's program (ELF programs).
        #[arg(long, requires = "object")]
        maps: bool,
        /// Program as bpf_conformance assembly (default: the built-in sample).
        #[arg(long, conflicts_with = "object")]
        asm: Option<PathBuf>,
        /// Context value n for the sample (sum of squares below n).
        #[arg(long, default_value_t = 10, conflicts_with = "object")]
        n: u64,
    },
    /// Print a program's native code for one architecture.
    Dump {
        /// Relocatable eBPF object; needs --section or --function. Disassembled with capstone.
        object: Option<PathBuf>,
        #[command(flatten)]
        select: elf_cmd::Select,
        /// Target architecture (aarch64 | riscv64 | x86_64).
        #[arg(long)]
        arch: String,
        /// Program as bpf_conformance assembly (default: the built-in sample).
        #[arg(long, conflicts_with = "object")]
        asm: Option<PathBuf>,
        /// Optional-feature bits to compile with (default: none on a foreign host).
        #[arg(long)]
        features: Option<u64>,
        /// Compile the object sandboxed (default budget), to see what its checks cost; the
        /// default dump is trusted, the program's own logic alone.
        #[arg(long, requires = "object")]
        sandboxed: bool,
        /// With --sandboxed: compile without the instruction budget (the host's explicit
        /// opt-out), to tell the budget's charges from the memory checks.
        #[arg(long, requires = "sandboxed")]
        no_budget: bool,
    },
    /// Batch-load programs, free a third of them, and print the arena statistics.
    Stats {
        /// Number of programs.
        #[arg(long, default_value_t = 200)]
        count: usize,
        /// Write the perf map (/tmp/perf-PID.map) and report its entries after each step.
        #[arg(long)]
        perf_map: bool,
        /// Draw each pack's occupancy after each step.
        #[arg(long)]
        map: bool,
    },
    /// JIT vs the rbpf interpreter on a compute-bound program (native arch only).
    Bench {
        /// Loop iterations of the benchmark program.
        #[arg(long, default_value_t = 5_000_000)]
        iterations: u64,
    },
    /// Speak the bpf_conformance plugin protocol (program on stdin, memory as argv hex).
    ConformancePlugin {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cmd = cli.cmd.unwrap_or(Cmd::Run {
        object: None,
        select: elf_cmd::Select {
            section: None,
            function: None,
        },
        mem: Vec::new(),
        mem_file: None,
        sandbox: false,
        trusted: false,
        budget: None,
        repeat: 1,
        perf_map: false,
        gdb: false,
        maps: false,
        asm: None,
        n: 10,
    });
    if let Cmd::ConformancePlugin { args } = &cmd {
        return ExitCode::from(conformance_plugin::main(args).clamp(0, 255) as u8);
    }
    match dispatch(cmd, cli.plugin_dir, cli.static_backends) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("packjit-demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd, plugin_dir: Option<PathBuf>, static_backends: bool) -> Result<(), String> {
    // For gdb and perf the arena is toggle-mapped (anonymous private pages). gdb can then
    // write a software breakpoint into a program (`break <name>`): the default dual
    // mapping's executable view is shared and read-only, leaving only hardware breakpoints,
    // which not every machine (a VM, qemu-user) offers. And perf reads /tmp/perf-PID.map
    // only for anonymous memory: samples in the dual mapping's memfd are attributed to the
    // file (`memfd:...` + offset), never to the program's name.
    let config = RuntimeConfig {
        arena: ArenaConfig {
            map_mode: if matches!(
                cmd,
                Cmd::Run { gdb: true, .. } | Cmd::Run { perf_map: true, .. }
            ) {
                MapMode::Toggle
            } else {
                MapMode::Auto
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let rt = Runtime::with_config(config).map_err(|e| e.to_string())?;
    // The ELF modes print only their result on stdout.
    let quiet = matches!(
        cmd,
        Cmd::Run {
            object: Some(_),
            ..
        } | Cmd::Dump {
            object: Some(_),
            ..
        }
    );
    if static_backends {
        add_static_backends(&rt)?;
        if !quiet {
            println!("backends: linked statically");
        }
    } else {
        match rt.load_plugins(plugin_dir.as_deref()) {
            Ok(infos) => {
                for b in infos.into_iter().filter(|_| !quiet) {
                    println!(
                        "backend {} {} for {} loaded from {} (features supported {:#x}, detected {:#x})",
                        b.name, b.version, b.arch, b.origin, b.supported_features, b.detected_features
                    );
                }
            }
            // No plugin directory asked for and none found (an installed `packjit-demo` has
            // no plugins beside it): the backends this binary links serve instead.
            Err(e) if plugin_dir.is_none() => {
                add_static_backends(&rt)?;
                if !quiet {
                    println!("backends: linked statically ({e})");
                }
            }
            Err(e) => {
                return Err(format!("{e}\n  (build them with `cargo build`, point --plugin-dir at them, or pass --static-backends)"));
            }
        }
    }
    // An object's `call 1` is bpf_map_lookup_elem: the sample's helper 1 moves out of the way.
    let mix_id = if quiet {
        sample::MIX_ID_FOR_OBJECTS
    } else {
        sample::MIX_ID
    };
    sample::register_helpers(&rt, mix_id)?;
    elf_cmd::register_rbpf_helpers(&rt)?;
    match cmd {
        Cmd::Run {
            object: Some(obj),
            select,
            mem,
            mem_file,
            trusted,
            budget,
            repeat,
            perf_map,
            gdb,
            maps,
            ..
        } => {
            let trust = if trusted {
                Trust::Trusted
            } else {
                Trust::Sandboxed
            };
            let run = elf_cmd::RunOptions {
                trust,
                budget,
                repeat,
                perf_map,
                gdb,
                maps,
            };
            elf_cmd::run(&rt, &obj, &select, mem, mem_file, &run)
        }
        Cmd::Run { asm, n, .. } => run(&rt, asm, n),
        Cmd::Dump {
            object: Some(obj),
            select,
            arch,
            features,
            sandboxed,
            no_budget,
            ..
        } => {
            let arch = Arch::parse(&arch)
                .ok_or_else(|| format!("unknown arch {arch:?} (aarch64 | riscv64 | x86_64)"))?;
            let budget = if no_budget {
                packjit::Budget::Unlimited
            } else {
                packjit::Budget::Default
            };
            elf_cmd::dump(&rt, &obj, &select, arch, features, sandboxed, budget)
        }
        Cmd::Dump {
            arch,
            asm,
            features,
            ..
        } => dump(&rt, &arch, asm, features),
        Cmd::Stats {
            count,
            perf_map,
            map,
        } => stats::run(
            &rt,
            &stats::StatsOpts {
                count,
                perf_map,
                map,
            },
        ),
        Cmd::Bench { iterations } => bench::run(&rt, iterations),
        Cmd::ConformancePlugin { .. } => unreachable!("handled before the runtime is built"),
    }
}

fn add_static_backends(rt: &Runtime) -> Result<(), String> {
    rt.add_backend(Arc::new(packjit_arm64::Arm64Backend::new()))
        .map_err(|e| e.to_string())?;
    rt.add_backend(Arc::new(packjit_rv64::Rv64Backend::new()))
        .map_err(|e| e.to_string())?;
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn program_source(asm: Option<PathBuf>) -> Result<(String, Vec<u8>), String> {
    let (name, text) = match asm {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?,
        ),
        None => (
            "built-in sample".to_string(),
            sample::SAMPLE_ASM.to_string(),
        ),
    };
    let code = packjit_asm::asm::assemble(&text).map_err(|e| format!("{name}: {e}"))?;
    Ok((name, code))
}

fn qemu_hint(arch: Arch) -> &'static str {
    match arch {
        Arch::Aarch64 => "scripts/demo.sh runs this demo under qemu-aarch64",
        Arch::Riscv64 => "scripts/demo.sh runs this demo under qemu-riscv64",
        Arch::X86_64 => "packjit has no x86-64 backend (rbpf's own JIT covers x86-64)",
    }
}

fn run(rt: &Runtime, asm: Option<PathBuf>, n: u64) -> Result<(), String> {
    let (name, code) = program_source(asm)?;
    let host = Arch::host();
    println!("program: {name}, {} eBPF instructions", code.len() / 8);
    println!("host: {}", host.map_or("unknown", |a| a.name()));
    let mut ran = false;
    // Keep the programs alive until the statistics are printed.
    let mut loaded = Vec::new();
    for b in rt.backends() {
        let prog = rt
            .load(
                &code,
                &LoadOptions {
                    arch: Some(b.arch),
                    ..Default::default()
                },
            )
            .map_err(|e| format!("{} backend: {e}", b.arch))?;
        print_code_summary(&prog);
        if prog.is_executable() {
            let mut ctx = sample::context(n);
            let r0 = prog.call(&mut ctx).map_err(|e| e.to_string())?;
            println!(
                "  ran natively from the arena at {:#x}: r0 = {r0}",
                prog.entry_addr()
            );
            if let Some(b) = prog.builtins() {
                // Decided at load time: rseq registered → inline CPU id, else a call.
                println!("  built-in helpers: {b}");
            }
            if name == "built-in sample" {
                let expect = sample::expected(n);
                println!(
                    "  expected r0 = {expect} ({})",
                    if r0 == expect { "ok" } else { "MISMATCH" }
                );
                if r0 != expect {
                    return Err(format!("{} JIT returned {r0}, expected {expect}", b.arch));
                }
            }
            ran = true;
        } else {
            println!(
                "  not run: this is {} code and the host is {}; {}",
                b.arch,
                host.map_or("unknown", |a| a.name()),
                qemu_hint(b.arch)
            );
        }
        loaded.push(prog);
    }
    if !ran {
        println!("no backend targets this host; the code above was compiled but not executed");
    }
    print_stats(rt);
    Ok(())
}

fn print_code_summary(prog: &Program) {
    let code = prog.code();
    let head: Vec<String> = code.iter().take(32).map(|b| format!("{b:02x}")).collect();
    println!(
        "{}: {} bytes, {} native instructions (features {:#x}), by {}",
        prog.arch(),
        prog.code_size(),
        prog.native_insns(),
        prog.features(),
        prog.backend_name()
    );
    println!(
        "  code: {}{}",
        head.join(" "),
        if code.len() > 32 { " ..." } else { "" }
    );
}

fn print_stats(rt: &Runtime) {
    let s = rt.stats();
    println!(
        "arena: {} pack(s), {} KiB reserved ({} KiB resident), {} B used by {} program(s) ({} B of code), fragmentation {}.{}%, {} commit(s), {} cache flush(es), {} remap(s), {} pending free(s), {}{}",
        s.packs,
        s.bytes_reserved / 1024,
        s.bytes_resident / 1024,
        s.bytes_used,
        s.allocations,
        s.bytes_code,
        s.fragmentation_permille / 10,
        s.fragmentation_permille % 10,
        s.commits,
        s.icache_flushes,
        s.remaps,
        s.pending_frees,
        if s.dual_mapped { "memfd dual mapping" } else { "RW/RX toggling" },
        if s.remap_on_commit { ", stale-code remap on (emulator detected)" } else { "" },
    );
}

fn dump(
    rt: &Runtime,
    arch: &str,
    asm: Option<PathBuf>,
    features: Option<u64>,
) -> Result<(), String> {
    let arch =
        Arch::parse(arch).ok_or_else(|| format!("unknown arch {arch:?} (aarch64 | riscv64)"))?;
    let (_, code) = program_source(asm)?;
    let prog = rt
        .load(
            &code,
            &LoadOptions {
                arch: Some(arch),
                features,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
    print_code_summary(&prog);
    let bytes = prog.code();
    for (i, line) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        println!("  {:06x}: {}", i * 16, hex.join(" "));
    }
    let (objdump, machine) = match arch {
        Arch::Aarch64 => ("aarch64-linux-gnu-objdump", "aarch64"),
        Arch::Riscv64 => ("riscv64-linux-gnu-objdump", "riscv:rv64"),
        Arch::X86_64 => ("objdump", "i386:x86-64"),
    };
    let tmp = std::env::temp_dir().join(format!("packjit-dump-{}.bin", std::process::id()));
    std::fs::write(&tmp, &bytes).map_err(|e| e.to_string())?;
    match std::process::Command::new(objdump)
        .args(["-D", "-b", "binary", "-m", machine])
        .arg(&tmp)
        .output()
    {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            for l in text.lines().skip_while(|l| !l.contains("<.data>:")).skip(1) {
                println!("{l}");
            }
        }
        _ => println!("({objdump} not found: install binutils for {arch} for a disassembly)"),
    }
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}
