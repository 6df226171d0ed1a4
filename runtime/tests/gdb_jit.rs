//! gdb JIT registration: the list gdb walks (`__jit_debug_descriptor`) holds exactly the
//! executable copies of the programs, each as a valid ELF object naming the program at its
//! address, as programs are loaded, moved by compaction and reclaimed.
//!
//! Runs on whatever machine runs it, with that arch's backend (natively on x86-64, under
//! qemu-user for arm64 and RV64). No gdb here and no child process (`gdb_e2e.rs` runs the
//! real debugger, on x86-64).

mod host;

use object::read::elf::ElfFile64;
use object::{Object, ObjectSection, ObjectSymbol};
use packjit::{ArenaConfig, Compaction, LoadOptions, Program, Runtime, RuntimeConfig};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The list is process-global: tests that assert something is absent from it run one at a
/// time, so that no other test's arena can have been mapped where theirs was.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn runtime(compaction: Option<Compaction>) -> Runtime {
    host::host_runtime_with(RuntimeConfig {
        arena: ArenaConfig {
            compaction,
            ..ArenaConfig::default()
        },
        ..Default::default()
    })
}

/// `mov r0, k - (n - 2) ; (n - 2) x add r0, 1 ; exit`: returns k, n instructions long.
fn sized(n: usize, k: i32) -> Vec<u8> {
    let insn = |op: u8, imm: i32| {
        let i = imm.to_le_bytes();
        [op, 0, 0, 0, i[0], i[1], i[2], i[3]]
    };
    let mut v = insn(0xb7, k - (n as i32 - 2).max(0)).to_vec();
    for _ in 2..n {
        v.extend_from_slice(&insn(0x07, 1));
    }
    v.extend_from_slice(&insn(0x95, 0));
    v
}

fn load(rt: &Runtime, name: &str, n: usize, k: i32) -> Program {
    rt.load(
        &sized(n, k),
        &LoadOptions {
            name: Some(name.into()),
            ..Default::default()
        },
    )
    .unwrap()
}

fn host_arch() -> object::Architecture {
    match packjit::Arch::host().unwrap() {
        packjit::Arch::X86_64 => object::Architecture::X86_64,
        packjit::Arch::Aarch64 => object::Architecture::Aarch64,
        packjit::Arch::Riscv64 => object::Architecture::Riscv64,
    }
}

/// What one registered object file says of a program.
#[derive(Debug, PartialEq)]
struct Listed {
    size: u64,
    name: String,
    /// It carries DWARF (a line table).
    dwarf: bool,
    /// Object files at this address.
    count: usize,
}

/// Every registered object file, parsed, by `.text` address. Checks what gdb needs of each
/// file on the way.
fn registered() -> BTreeMap<u64, Listed> {
    let mut out = BTreeMap::new();
    for bytes in packjit::gdb_jit::registered_symfiles() {
        let f = ElfFile64::<object::NativeEndian>::parse(&*bytes).expect("a valid ELF64");
        assert_eq!(f.architecture(), host_arch());
        assert_eq!(f.kind(), object::ObjectKind::Relocatable);
        let text = f.section_by_name(".text").expect(".text");
        let syms: Vec<_> = f.symbols().collect();
        assert_eq!(syms.len(), 1, "one symbol per object");
        let s = &syms[0];
        assert_eq!(s.kind(), object::SymbolKind::Text);
        assert!(s.is_global() && s.is_definition());
        assert_eq!(s.section_index(), Some(text.index()));
        // ET_REL: the symbol is section-relative and covers the whole section.
        assert_eq!((s.address(), s.size()), (0, text.size()));
        let dwarf = [".debug_abbrev", ".debug_info", ".debug_line"]
            .map(|n| f.section_by_name(n).is_some_and(|s| s.size() > 0));
        assert!(dwarf.iter().all(|&d| d == dwarf[0]), "all or no DWARF");
        let e = out.entry(text.address()).or_insert(Listed {
            size: text.size(),
            name: s.name().unwrap().to_string(),
            dwarf: dwarf[0],
            count: 0,
        });
        assert_eq!((e.size, &*e.name), (text.size(), s.name().unwrap()));
        e.count += 1;
    }
    out
}

/// Asserts that each program is registered exactly once at its current code.
fn assert_listed(progs: &[Program]) {
    let reg = registered();
    for p in progs {
        assert_eq!(
            reg.get(&p.entry_addr()),
            Some(&Listed {
                size: p.code_size() as u64,
                name: p.name().to_string(),
                // DWARF exactly when the backend returned a line table.
                dwarf: !p.pc_offsets().is_empty(),
                count: 1
            }),
            "{} at {:#x}",
            p.name(),
            p.entry_addr()
        );
    }
}

fn assert_absent(addrs: &[u64]) {
    let reg = registered();
    for a in addrs {
        assert!(
            !reg.contains_key(a),
            "{a:#x} still registered: {:?}",
            reg[a]
        );
    }
}

#[test]
fn loads_and_reclamations_register_and_unregister() {
    let _s = serial();
    let rt = runtime(None);
    // Loaded before gdb registration is enabled: registered by enabling it.
    let mut progs: Vec<Program> = (0..5)
        .map(|i| load(&rt, &format!("early_{i}"), 2 + i * 30, i as i32))
        .collect();
    let early: Vec<u64> = progs.iter().map(Program::entry_addr).collect();
    assert_absent(&early);
    rt.enable_gdb_jit().unwrap();
    rt.enable_gdb_jit().unwrap(); // idempotent: still one entry each
    assert_listed(&progs);
    progs.extend((0..20).map(|i| load(&rt, &format!("late_{i}"), 3 + i * 17, i as i32)));
    assert_listed(&progs);
    for p in &progs {
        assert_eq!(p.call(&mut []).unwrap(), p_k(p));
    }

    // Dropped programs stay registered until their code is reclaimed.
    let gone: Vec<Program> = (0..progs.len())
        .rev()
        .step_by(3)
        .map(|i| progs.remove(i))
        .collect();
    let gone_addrs: Vec<u64> = gone.iter().map(Program::entry_addr).collect();
    drop(gone);
    assert_eq!(rt.reclaim(), 0);
    assert_absent(&gone_addrs);
    assert_listed(&progs);

    let all: Vec<u64> = progs.iter().map(Program::entry_addr).collect();
    drop(progs);
    assert_eq!(rt.reclaim(), 0);
    assert_absent(&all);
}

/// What `sized(_, k)` returns: recovered from the program's name suffix.
fn p_k(p: &Program) -> u64 {
    p.name().rsplit('_').next().unwrap().parse().unwrap()
}

#[test]
fn a_moved_program_is_registered_at_its_new_address() {
    let _s = serial();
    let rt = runtime(None);
    rt.enable_gdb_jit().unwrap();
    let mut progs: Vec<Program> = (0..40)
        .map(|i| load(&rt, &format!("mover_{i}"), 2 + (i * 37) % 300, i as i32))
        .collect();
    // Holes all over the pack for compaction to fill.
    host::drop_every_other(&mut progs);
    assert_eq!(rt.reclaim(), 0);
    let was: Vec<u64> = progs.iter().map(Program::entry_addr).collect();
    rt.arena().unwrap().set_compaction(Some(Compaction {
        threshold_permille: 0,
        step_bytes: 1 << 20,
    }));
    assert!(rt.compact(usize::MAX) > 0, "nothing moved");
    let now: Vec<u64> = progs.iter().map(Program::entry_addr).collect();
    let moved: Vec<u64> = was
        .iter()
        .zip(&now)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| *a)
        .collect();
    assert!(!moved.is_empty());
    // The new copies are registered; the old ones too until reclaimed (threads may still be
    // running there, and gdb should name them).
    assert_listed(&progs);
    let reg = registered();
    for (p, old) in progs.iter().zip(&was) {
        assert_eq!(reg[old].name, p.name(), "old copy {old:#x} still listed");
    }
    assert_eq!(rt.reclaim(), 0);
    let old_only: Vec<u64> = moved.iter().filter(|a| !now.contains(a)).copied().collect();
    assert_absent(&old_only);
    assert_listed(&progs);
    for p in &progs {
        assert_eq!(p.call(&mut []).unwrap(), p_k(p));
    }
    drop(progs);
    assert_eq!(rt.reclaim(), 0);
    assert_absent(&now);
}

#[test]
fn programs_outliving_their_runtime_stay_registered_until_freed() {
    let _s = serial();
    let rt = runtime(None);
    rt.enable_gdb_jit().unwrap();
    let progs: Vec<Program> = (0..4)
        .map(|i| load(&rt, &format!("orphan_{i}"), 5 + i, i as i32))
        .collect();
    let arena = rt.arena().unwrap().clone();
    drop(rt);
    // Their code is still mapped and callable, so gdb must still know it.
    assert_listed(&progs);
    for p in &progs {
        assert_eq!(p.call(&mut []).unwrap(), p_k(p));
    }
    let addrs: Vec<u64> = progs.iter().map(Program::entry_addr).collect();
    drop(progs);
    assert_eq!(arena.reclaim(), 0);
    assert_absent(&addrs);
}

#[test]
fn a_runtime_without_gdb_registration_registers_nothing() {
    let _s = serial();
    let rt = runtime(None);
    let progs: Vec<Program> = (0..3)
        .map(|i| load(&rt, &format!("quiet_{i}"), 4, i))
        .collect();
    let addrs: Vec<u64> = progs.iter().map(Program::entry_addr).collect();
    assert_absent(&addrs);
}
