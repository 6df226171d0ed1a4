//! `run` and `dump` for clang objects: `packjit-demo run PROG.o --section S` and
//! `packjit-demo dump PROG.o --section S --arch A`.
//!
//! The dump disassembles in-process with capstone and marks each eBPF instruction's native
//! range from the program's line table (`Program::pc_offsets`, reported by the backend
//! through the plugin ABI). A backend that reports no line table yet is emitted once more
//! through its statically linked emit function, which returns per-instruction offsets
//! (arm64, x86-64), and that code is listed instead; the RV64 backend's static API returns no
//! offsets, so without its line table the listing is unmarked.

use crate::maps_print;
use capstone::prelude::*;
use packjit::elf::ElfLoadOptions;
use packjit::{Arch, ElfObject, LoadOptions, Program, RunError, Runtime, Trust};
use packjit_frontend::RawInsn;
use packjit_plugin_api::{HelperEntry, NO_NATIVE_CODE};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Exit status of `run` when the program was stopped (sandbox fault, budget, unknown callx).
pub const EXIT_STOPPED: i32 = 3;

/// First id given to rbpf's unnumbered standard helpers (`gather_bytes`, `memfrob`, `sqrti`,
/// `strcmp`, `rand`); `bpf_trace_printf` keeps rbpf's id 6. C code reaches them by name.
const RBPF_EXTRA_IDS: u32 = 0x100;

/// Which program of the object: `--section` or `--function`.
#[derive(clap::Args, Clone, Debug)]
pub struct Select {
    /// Code section holding the program (`SEC("...")`).
    #[arg(long, requires = "object")]
    pub section: Option<String>,
    /// Function symbol of the program (instead of --section).
    #[arg(long, conflicts_with = "section", requires = "object")]
    pub function: Option<String>,
}

impl Select {
    fn options(&self) -> Result<ElfLoadOptions, String> {
        match (&self.section, &self.function) {
            (Some(s), None) => Ok(ElfLoadOptions::section(s)),
            (None, Some(f)) => Ok(ElfLoadOptions::function(f)),
            _ => Err("an ELF object needs --section S or --function F".into()),
        }
    }
}

/// rbpf's standard helpers under their rbpf names, so `extern` declarations resolve.
pub fn register_rbpf_helpers(rt: &Runtime) -> Result<(), String> {
    packjit::rbpf_bridge::register_rbpf_helpers(rt, RBPF_EXTRA_IDS).map_err(|e| e.to_string())
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ',')
        .collect();
    let digits = digits.strip_prefix("0x").unwrap_or(&digits).to_string();
    if digits.len() % 2 != 0 {
        return Err(format!(
            "--mem: odd number of hex digits ({})",
            digits.len()
        ));
    }
    (0..digits.len() / 2)
        .map(|i| {
            u8::from_str_radix(&digits[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("--mem: {:?} is not hex", &digits[2 * i..2 * i + 2]))
        })
        .collect()
}

/// How `run PROG.o` runs the program.
pub struct RunOptions {
    pub trust: Trust,
    pub budget: Option<u64>,
    /// Rounds over the packets (at least one); each packet's last result is printed.
    pub repeat: u64,
    /// Keep the perf map, printing its path.
    pub perf_map: bool,
    /// Register the code with gdb's JIT interface.
    pub gdb: bool,
    /// Print every map of the object after the runs.
    pub maps: bool,
}

/// The programs of one `run`: the selected one, then every program a prog array of the
/// object names statically (so its tail calls land), each once.
struct Loaded {
    entry: Arc<Program>,
    /// (name as the prog array gives it, program).
    targets: Vec<(String, Arc<Program>)>,
    /// (map name, slot, program name) of every statically filled prog-array slot.
    slots: Vec<(String, u32, String)>,
}

fn load_one(
    object: &ElfObject,
    rt: &Runtime,
    sel: &ElfLoadOptions,
    trust: Trust,
    opts: &LoadOptions,
) -> Result<Program, packjit::Error> {
    match trust {
        Trust::Sandboxed => object.load(rt, sel, opts),
        // SAFETY: only with --trusted, whose help says the user vouches for the object
        // (as after the kernel's verifier); without it the object runs sandboxed. Tail
        // call targets are loaded with the same trust (a tail call only continues in a
        // program of the caller's trust).
        Trust::Trusted => unsafe { object.load_trusted(rt, sel, opts) },
    }
}

/// Loads the selected program and every program the object's prog arrays name, then fills
/// the prog arrays as libbpf does. Errors name the object, and for a tail call target the
/// prog array and slot that name it.
fn load_all(
    rt: &Runtime,
    obj: &Path,
    bytes: &[u8],
    object: &ElfObject,
    sel: &Select,
    trust: Trust,
    opts: &LoadOptions,
) -> Result<Loaded, String> {
    let elf = sel.options()?;
    let entry = Arc::new(
        load_one(object, rt, &elf, trust, opts).map_err(|e| format!("{}: {e}", obj.display()))?,
    );
    // `ElfObject::open` already parsed these; read again for the static prog-array slots.
    let defs = packjit::elf_maps(bytes).map_err(|e| format!("{}: {e}", obj.display()))?;
    let mut slots = Vec::new();
    let mut targets: Vec<(String, Arc<Program>)> = Vec::new();
    for d in &defs {
        for (slot, name) in &d.initial_programs {
            slots.push((d.name.clone(), *slot, name.clone()));
            if targets.iter().any(|(n, _)| n == name) {
                continue;
            }
            // The selected program itself (a program may tail call itself).
            let selected = sel.function.as_deref() == Some(name.as_str())
                || sel.section.as_deref() == Some(name.as_str())
                || entry.name() == name;
            let prog = if selected {
                entry.clone()
            } else {
                // The name is a function symbol's, or a section's when clang referred to
                // the section symbol (static functions).
                let by_function =
                    load_one(object, rt, &ElfLoadOptions::function(name), trust, opts);
                let prog = match by_function {
                    Err(e) if e.to_string().contains("no function symbol") => {
                        load_one(object, rt, &ElfLoadOptions::section(name), trust, opts)
                    }
                    r => r,
                };
                Arc::new(prog.map_err(|e| {
                    format!(
                        "{}: program `{name}` (tail call target in prog array `{}` slot {slot}): {e}",
                        obj.display(),
                        d.name
                    )
                })?)
            };
            targets.push((name.clone(), prog));
        }
    }
    let programs: Vec<(&str, Arc<Program>)> = targets
        .iter()
        .map(|(n, p)| (n.as_str(), p.clone()))
        .collect();
    object
        .init_prog_arrays(rt, &programs)
        .map_err(|e| format!("{}: {e}", obj.display()))?;
    Ok(Loaded {
        entry,
        targets,
        slots,
    })
}

/// Empties the prog-array slots `load_all` filled: a program in a slot keeps the maps it
/// names alive, its own prog array among them.
fn release_slots(rt: &Runtime, object: &ElfObject, loaded: &Loaded) {
    for (map, slot, _) in &loaded.slots {
        if let Some(m) = object.map(map) {
            let _ = rt.set_prog_array(m, *slot, None);
        }
    }
}

fn print_maps(object: &ElfObject, loaded: &Loaded) {
    let mut any = false;
    for (name, map) in object.maps() {
        let slot_name = |i: u32| {
            loaded
                .slots
                .iter()
                .find(|(m, s, _)| m == name && *s == i)
                .map(|(_, _, p)| p.clone())
        };
        print!("{}", maps_print::format_map(name, map, &slot_name));
        any = true;
    }
    if !any {
        println!("(the object has no maps)");
    }
}

/// At most 16 bytes of a packet, for its result line.
fn packet_text(p: &[u8]) -> String {
    let head = maps_print::hex(&p[..p.len().min(16)]);
    if p.len() > 16 {
        format!("{head} ... ({} bytes)", p.len())
    } else {
        head
    }
}

/// `run PROG.o`: opens the object (creating its maps), loads the program for the host with
/// every program its prog arrays name, runs it on each packet (`repeat` rounds; maps
/// accumulate), prints r0 (one line per packet when there are several), the program's
/// scalar globals and, with `--maps`, every map.
pub fn run(
    rt: &Runtime,
    obj: &Path,
    sel: &Select,
    mem: Vec<String>,
    mem_file: Option<PathBuf>,
    run: &RunOptions,
) -> Result<(), String> {
    let (trust, budget) = (run.trust, run.budget);
    // Both before the load, so the program is named from its first instruction on.
    if run.perf_map {
        let path = rt.enable_perf_map().map_err(|e| e.to_string())?;
        eprintln!("perf map: {}", path.display());
    }
    if run.gdb {
        rt.enable_gdb_jit().map_err(|e| e.to_string())?;
    }
    let bytes = read(obj)?;
    let elf = sel.options()?;
    let mut packets = match (mem.is_empty(), mem_file) {
        (false, None) => mem.iter().map(|h| parse_hex(h)).collect::<Result<_, _>>()?,
        (true, Some(f)) => vec![read(&f)?],
        (true, None) => vec![Vec::new()],
        (false, Some(_)) => return Err("give --mem or --mem-file, not both".into()),
    };
    let host = Arch::host().ok_or("unknown host architecture")?;
    let opts = LoadOptions {
        arch: Some(host),
        budget: budget.map_or(packjit::Budget::Default, packjit::Budget::Limit),
        ..Default::default()
    };
    // The maps are created here, once: every program of the object shares them.
    let object = ElfObject::open(&bytes, &[]).map_err(|e| format!("{}: {e}", obj.display()))?;
    let loaded = load_all(rt, obj, &bytes, &object, sel, trust, &opts)?;
    let prog = &loaded.entry;
    if !prog.is_executable() {
        return Err(format!(
            "no backend targets {host}; compiled but cannot run here"
        ));
    }
    let mode = match trust {
        Trust::Sandboxed => "sandboxed",
        Trust::Trusted => "trusted",
    };
    eprintln!(
        "{} ({}): {} bytes of {} code by {}, {mode}",
        obj.display(),
        elf.program,
        prog.code_size(),
        prog.arch(),
        prog.backend_name(),
    );
    for (name, p) in loaded.targets.iter().filter(|(_, p)| !Arc::ptr_eq(p, prog)) {
        eprintln!(
            "  tail call target {name}: {} bytes of {} code, {mode}",
            p.code_size(),
            p.arch()
        );
    }
    if run.perf_map || run.gdb {
        eprintln!("program name: {}", prog.name());
    }
    let several = packets.len() > 1;
    let mut results = vec![None; packets.len()];
    let mut stopped = None;
    'rounds: for _ in 0..run.repeat.max(1) {
        for (i, p) in packets.iter_mut().enumerate() {
            match prog.call(p) {
                Ok(r0) => results[i] = Some(r0),
                Err(e) => {
                    stopped = Some((i, e));
                    break 'rounds;
                }
            }
        }
    }
    let outcome = match stopped {
        None => {
            for (i, r0) in results.iter().enumerate() {
                let r0 = r0.expect("every packet ran");
                if several {
                    println!(
                        "packet {} ({}): r0 = {r0:#x}",
                        i + 1,
                        packet_text(&packets[i])
                    );
                } else {
                    println!("r0 = {r0:#x}");
                }
            }
            print_globals(prog);
            Ok(())
        }
        Some((i, e)) => {
            let which = if several {
                format!(" on packet {}", i + 1)
            } else {
                String::new()
            };
            match e {
                // The stop's text carries the pc and (for memory) the address and direction.
                RunError::Stop(stop) => {
                    eprintln!("packjit-demo: program stopped{which}: {stop}");
                    Err(None)
                }
                e => Err(Some(format!("run{which}: {e}"))),
            }
        }
    };
    if run.maps {
        // Also after a stop: the maps show how far the runs got.
        print_maps(&object, &loaded);
    }
    release_slots(rt, &object, &loaded);
    match outcome {
        Ok(()) => Ok(()),
        Err(None) => std::process::exit(EXIT_STOPPED),
        Err(Some(e)) => Err(e),
    }
}

fn print_globals(prog: &Program) {
    let Some(g) = prog.globals() else { return };
    for s in g.symbols() {
        let sec = &g.sections()[s.section];
        if !sec.writable() || s.len == 0 || s.len > 8 {
            continue;
        }
        if let Ok(v) = g.read_u64(&s.name) {
            println!("{} ({}) = {v:#x}", s.name, sec.name());
        }
    }
}

fn capstone_for(arch: Arch) -> Result<Capstone, String> {
    match arch {
        Arch::Aarch64 => Capstone::new()
            .arm64()
            .mode(arch::arm64::ArchMode::Arm)
            .build(),
        Arch::Riscv64 => Capstone::new()
            .riscv()
            .mode(arch::riscv::ArchMode::RiscV64)
            .extra_mode([arch::riscv::ArchExtraMode::RiscVC].into_iter())
            .build(),
        Arch::X86_64 => Capstone::new()
            .x86()
            .mode(arch::x86::ArchMode::Mode64)
            .build(),
    }
    .map_err(|e| format!("capstone: {e}"))
}

fn ebpf_text(code: &[u8], pc: usize) -> String {
    let slot = |i: usize| {
        code.get(i * 8..i * 8 + 8)
            .map(|b| RawInsn::from_bytes(b.try_into().unwrap()))
    };
    let Some(i) = slot(pc) else {
        return "?".into();
    };
    packjit_asm::disasm::insn_text(&i, slot(pc + 1).as_ref())
        .map(|(t, _)| t)
        .unwrap_or_else(|| format!(".raw {:#018x}", u64::from_le_bytes(i.to_bytes())))
}

/// `dump PROG.o --arch A`: the native code with each eBPF instruction's range marked.
pub fn dump(
    rt: &Runtime,
    obj: &Path,
    sel: &Select,
    arch: Arch,
    features: Option<u64>,
    sandboxed: bool,
    budget: packjit::Budget,
) -> Result<(), String> {
    let bytes = read(obj)?;
    let elf = sel.options()?;
    let opts = LoadOptions {
        arch: Some(arch),
        features,
        budget,
        ..Default::default()
    };
    // Compiled trusted unless asked otherwise: the dump shows the program's own logic,
    // without the sandbox's checks. Nothing is run.
    let prog = if sandboxed {
        rt.load_elf(&bytes, &elf, &opts)
    } else {
        // SAFETY: the program is never called.
        unsafe { rt.load_elf_trusted(&bytes, &elf, &opts) }
    }
    .map_err(|e| format!("{}: {e}", obj.display()))?;
    let helpers = rt.helpers();
    let linked = prog
        .elf_linked()
        .ok_or("program has no ELF link information")?;
    println!(
        "{} ({}): {} eBPF slots -> {} bytes of {arch} code, {} native instructions, by {}",
        obj.display(),
        elf.program,
        linked.code.len() / 8,
        prog.code_size(),
        prog.native_insns(),
        prog.backend_name()
    );
    for (name, slot) in &linked.functions {
        println!("  function {name} at pc {slot}");
    }
    for (name, id) in &linked.externs {
        println!("  extern {name} -> helper {id}");
    }
    if let Some(g) = prog.globals() {
        for s in g.sections() {
            println!(
                "  data {} {} bytes at {:#x} ({})",
                s.name(),
                s.len(),
                s.addr(),
                if s.writable() { "rw" } else { "ro" }
            );
        }
    }
    let mut code = prog.code();
    let cs = capstone_for(arch)?;
    let mut offsets = prog.pc_offsets().to_vec();
    if offsets.is_empty() {
        let table: Vec<HelperEntry> = helpers
            .iter()
            .map(|h| HelperEntry {
                id: h.id,
                inline_kind: 0,
                addr: h.addr,
            })
            .collect();
        let (bytes, lines) = static_emit(arch, &linked.code, &table, prog.features())?;
        println!(
            "(no line table from the backend: listing the statically linked backend's emission, {} bytes)",
            bytes.len()
        );
        code = bytes;
        offsets = lines;
    }
    // (native start, pc) of every slot with code, in native order.
    let mut starts: Vec<(u32, usize)> = offsets
        .iter()
        .enumerate()
        .filter(|(_, &o)| o != NO_NATIVE_CODE)
        .map(|(pc, &o)| (o, pc))
        .collect();
    starts.sort();
    if starts.is_empty() {
        println!("(the backend reported no line table: plain listing)");
        return print_native(&cs, &code, 0, code.len());
    }
    if starts[0].0 > 0 {
        println!("; prologue [0x0, {:#x})", starts[0].0);
        print_native(&cs, &code, 0, starts[0].0 as usize)?;
    }
    for (k, &(start, pc)) in starts.iter().enumerate() {
        let end = starts
            .get(k + 1)
            .map_or(code.len(), |&(o, _)| o as usize)
            .min(code.len());
        let funcs: Vec<&str> = linked
            .functions
            .iter()
            .filter(|(_, s)| *s == pc)
            .map(|(n, _)| n.as_str())
            .collect();
        if !funcs.is_empty() {
            println!("<{}>:", funcs.join(", "));
        }
        println!(
            "; pc {pc}: {}    native [{start:#x}, {end:#x})",
            ebpf_text(&linked.code, pc)
        );
        print_native(&cs, &code, start as usize, end)?;
    }
    Ok(())
}

/// Native code and its per-slot line table.
type Listing = (Vec<u8>, Vec<u32>);

/// Code and line table from the statically linked backend of `arch` (every backend crate
/// reports per-instruction offsets through the same entry points).
fn static_emit(
    arch: Arch,
    code: &[u8],
    helpers: &[HelperEntry],
    features: u64,
) -> Result<Listing, String> {
    let target = match arch {
        Arch::Aarch64 => packjit_arm64::TARGET,
        Arch::X86_64 => packjit_x86_64::TARGET,
        Arch::Riscv64 => packjit_rv64::TARGET,
    };
    let e = target
        .emit_program(code, helpers, features)
        .map_err(|e| e.to_string())?;
    let prog = packjit_frontend::decode(code, helpers).map_err(|e| e.to_string())?;
    Ok((e.bytes.into_vec(), prog.line_table(e.inst_offsets)))
}

fn print_native(cs: &Capstone, code: &[u8], start: usize, end: usize) -> Result<(), String> {
    if start >= end {
        return Ok(());
    }
    let insns = cs
        .disasm_all(&code[start..end], start as u64)
        .map_err(|e| format!("capstone: {e}"))?;
    let mut covered = start;
    for i in insns.iter() {
        let hex: Vec<String> = i.bytes().iter().map(|b| format!("{b:02x}")).collect();
        println!(
            "    {:6x}  {:<24} {} {}",
            i.address(),
            hex.join(" "),
            i.mnemonic().unwrap_or("?"),
            i.op_str().unwrap_or("")
        );
        covered = i.address() as usize + i.bytes().len();
    }
    if covered < end {
        // Bytes capstone cannot decode (trap fill, data): show them rather than hide them.
        let hex: Vec<String> = code[covered..end]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!("    {covered:6x}  .byte {}", hex.join(" "));
    }
    Ok(())
}
