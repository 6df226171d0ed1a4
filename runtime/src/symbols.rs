//! Program symbols: an ordered address → program index (the userspace twin of the kernel's
//! BPF kallsyms with its latched rbtree) and the perf map profilers read.
//!
//! Every executable program gets an entry when it is compiled and loses it when its code is
//! reclaimed (after the epoch grace period, just before its chunks are trap-filled and
//! reused), so a profiler sample taken while a retired program is still finishing resolves to
//! that program, and an address is never listed under two programs.
//!
//! The perf map (`/tmp/perf-<pid>.map`, one `START SIZE NAME` line per program, hex without
//! `0x`, the format `perf report` reads for JIT code) is written on request and then kept
//! current ([`crate::perf_map`]): a load writes its line at the end, a reclamation moves the
//! last line into the freed one's place, each in O(1) however many programs are live.
//!
//! With gdb registration on ([`crate::gdb_jit`]), every listed copy of a program is also
//! registered with gdb, at the same moments: listed = registered. Registrations still held
//! when the index itself goes (the runtime and all its programs are gone) are dropped with
//! it, which unregisters them.

use crate::id_map::IdMap;
use crate::perf_map::PerfMap;
use crate::{Error, ErrorKind};
use std::collections::{btree_map, BTreeMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

/// What lies at a native address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolInfo {
    /// Program id (unique for the life of the runtime, never reused).
    pub id: u64,
    /// Program name (from [`LoadOptions::name`](crate::LoadOptions::name), the ELF symbol,
    /// or `prog_<id>`).
    pub name: Arc<str>,
    /// Entry address of the program's code.
    pub start: u64,
    /// Bytes of machine code (what the perf map lists).
    pub size: u64,
    /// Offset of the queried address from `start` (0 in listings).
    pub offset: u64,
    /// eBPF pc of the instruction whose native code holds the address (from the backend's
    /// line table; `None` when the backend returned none, and in listings).
    pub pc: Option<usize>,
}

#[derive(Clone)]
struct Entry {
    size: u64,
    /// Shared with the program, so that listing it copies neither name nor line table, and a
    /// moved program's second entry (old and new copy, listed together until the old one is
    /// reclaimed) costs no copy either.
    symbol: Arc<ProgramSymbol>,
    /// Its line in the perf map, while the map is on.
    perf_slot: u32,
}

impl Entry {
    fn id(&self) -> u64 {
        self.symbol.id
    }
}

/// What a program and its symbol entries share, in one allocation: its id, its name and its
/// line table.
///
/// A name the host did not give (`prog_<id>`) is formatted on first use, not at load: most
/// programs are never named by anyone (no lookup, no perf map, no gdb). Formatting and
/// allocating it at every load and freeing it at every release (with the entries' own copy of
/// it) cost about a tenth of a load's instructions and of a batch release's.
///
/// The line table is kept as the backend returned it and inverted on the first lookup that
/// needs it rather than at load: every load lists its program, few programs are ever looked
/// up, and inverting (a filtered copy, a sort) cost a tenth of a small program's load.
pub(crate) struct ProgramSymbol {
    id: u64,
    name: OnceLock<Arc<str>>,
    /// pc → native offset, `NO_NATIVE_CODE` for slots without code (the program's own).
    by_pc: Vec<u32>,
    /// (native offset, pc) sorted by offset, so a lookup is two binary searches.
    by_offset: OnceLock<Box<[(u32, u32)]>>,
}

impl ProgramSymbol {
    /// Program `id`, named `name` (`None`: the default name), with its line table.
    pub(crate) fn new(id: u64, name: Option<&str>, pc_offsets: Vec<u32>) -> Self {
        ProgramSymbol {
            id,
            name: name.map(Arc::from).map(OnceLock::from).unwrap_or_default(),
            by_pc: pc_offsets,
            by_offset: OnceLock::new(),
        }
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        self.name.get_or_init(|| format!("prog_{}", self.id).into())
    }

    pub(crate) fn by_pc(&self) -> &[u32] {
        &self.by_pc
    }

    fn by_offset(&self) -> &[(u32, u32)] {
        self.by_offset.get_or_init(|| invert(&self.by_pc))
    }

    /// The pc whose code holds native offset `off`: the instruction with the greatest start
    /// at or below it (code after the last instruction, shared stubs, maps to the last).
    pub(crate) fn pc_at(&self, off: u64) -> Option<usize> {
        pc_at(self.by_offset(), off)
    }
}

/// Inverts a line table (pc → native offset, `NO_NATIVE_CODE` for slots without code).
fn invert(pc_offsets: &[u32]) -> Box<[(u32, u32)]> {
    let mut v = Vec::with_capacity(pc_offsets.len());
    v.extend(
        pc_offsets
            .iter()
            .enumerate()
            .filter(|(_, &o)| o != packjit_plugin_api::NO_NATIVE_CODE)
            .map(|(pc, &o)| (o, pc as u32)),
    );
    // Equal offsets (an instruction that emitted nothing): the later pc owns the code.
    // (Backends emit in pc order; the sort finds a sorted table in one pass.)
    v.sort_unstable();
    v.into_boxed_slice()
}

fn pc_at(lines: &[(u32, u32)], off: u64) -> Option<usize> {
    let i = lines.partition_point(|&(o, _)| u64::from(o) <= off);
    i.checked_sub(1).map(|i| lines[i].1 as usize)
}

#[derive(Default)]
struct State {
    /// Entry address → program. Programs never overlap (each owns its arena chunks), so the
    /// greatest start ≤ addr is the only candidate: one O(log n) descent per lookup.
    by_addr: BTreeMap<u64, Entry>,
    /// Programs listed, each once however many copies it has.
    programs: usize,
    /// Entries beyond the first, per program id: only a moved program whose old copy waits
    /// for its grace period has any, so an unmoved program's load and release never touch
    /// this map.
    extra_copies: IdMap<u64, u32>,
    perf_map: Option<PerfMap>,
    /// gdb registrations by entry address, once enabled (see [`crate::gdb_jit`]).
    gdb: Option<std::collections::HashMap<u64, crate::gdb_jit::Registration>>,
}

/// The index. Lookups take the read lock; loads and reclamations the write lock.
#[derive(Default)]
pub(crate) struct Symbols {
    state: RwLock<State>,
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!("perf map {}: {e}", path.display()),
    )
}

/// Sets each entry's perf map slot to its rank by address: where [`perf_lines`] put it.
fn assign_slots(by_addr: &mut BTreeMap<u64, Entry>) {
    for (slot, e) in by_addr.values_mut().enumerate() {
        e.perf_slot = slot as u32;
    }
}

/// The perf map's lines for the index, by address.
fn perf_lines(by_addr: &BTreeMap<u64, Entry>) -> impl Iterator<Item = (u64, u64, &str)> + Clone {
    by_addr
        .iter()
        .map(|(&start, e)| (start, e.size, &**e.symbol.name()))
}

impl State {
    /// With the perf map on, lists the copy at `start` (already in `by_addr`) in it.
    fn perf_list(&mut self, start: u64) {
        // Off (the usual case): no lookup of the entry just inserted.
        if self.perf_map.is_none() {
            return;
        }
        let State {
            by_addr, perf_map, ..
        } = self;
        let (Some(map), Some(e)) = (perf_map.as_mut(), by_addr.get_mut(&start)) else {
            return;
        };
        if map.fits(e.size, e.symbol.name()) {
            e.perf_slot = map.push(start, e.size, e.symbol.name()) as u32;
        } else {
            // A name wider than every line so far: every line widens, in one rewrite.
            let _ = map.relist(perf_lines(by_addr));
            assign_slots(by_addr);
        }
    }

    /// With the perf map on, unlists the copy `e` at `start` (just taken out of `by_addr`);
    /// the file is brought up to date by [`PerfMap::sync`] once per batch.
    fn perf_unlist(&mut self, start: u64, e: &Entry) {
        let State {
            by_addr, perf_map, ..
        } = self;
        let Some(map) = perf_map.as_mut() else {
            return;
        };
        if map.start_at(e.perf_slot as usize) != Some(start) {
            // Every listed copy's slot is kept exact, so this is a bug: list from the index
            // again rather than take another program's line.
            debug_assert!(false, "perf map slot {} is not {start:#x}'s", e.perf_slot);
            let _ = map.relist(perf_lines(by_addr));
            assign_slots(by_addr);
            return;
        }
        if let Some(moved) = map.swap_remove(e.perf_slot as usize) {
            if let Some(m) = by_addr.get_mut(&moved) {
                m.perf_slot = e.perf_slot;
            }
        }
    }

    /// Registers the copy at `start` with gdb, when enabled.
    fn gdb_register(&mut self, start: u64, e: &Entry) {
        if let Some(g) = &mut self.gdb {
            g.insert(
                start,
                crate::gdb_jit::register(e.symbol.name(), start, e.size, e.symbol.by_offset()),
            );
        }
    }
}

impl Symbols {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Poisoning can only interrupt a map insert/remove, which leaves the map consistent.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a program whose code starts at `start`.
    pub(crate) fn insert(&self, symbol: Arc<ProgramSymbol>, start: u64, size: u64) {
        let e = Entry {
            size,
            symbol,
            perf_slot: 0,
        };
        let mut st = self.write();
        st.gdb_register(start, &e);
        st.by_addr.insert(start, e);
        st.perf_list(start);
        st.programs += 1;
    }

    /// Removes program `id` at `start` (its code is about to be reclaimed).
    pub(crate) fn remove(&self, id: u64, start: u64) {
        self.remove_many(&[(id, start)]);
    }

    /// Removes each program `id` at `start` (their code is about to be reclaimed) under one
    /// lock, bringing the perf map up to date once.
    pub(crate) fn remove_many(&self, entries: &[(u64, u64)]) {
        let mut st = self.write();
        let mut removed = false;
        for &(id, start) in entries {
            // The id check keeps a stale removal from ever taking a newer program's entry.
            let e = match st.by_addr.entry(start) {
                btree_map::Entry::Occupied(e) if e.get().id() == id => e.remove(),
                _ => continue,
            };
            st.perf_unlist(start, &e);
            if let Some(g) = &mut st.gdb {
                // Dropping the registration unregisters it.
                g.remove(&start);
            }
            match st.extra_copies.get_mut(&id) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => drop(st.extra_copies.remove(&id)),
                None => st.programs -= 1,
            }
            removed = true;
        }
        if let Some(map) = st.perf_map.as_mut().filter(|_| removed) {
            map.sync();
        }
    }

    /// Program `id` at `old` now also runs at `new` (the arena moved it; the old copy stays
    /// listed until it is reclaimed, since threads may still be finishing there).
    pub(crate) fn relocate(&self, id: u64, old: u64, new: u64) {
        let mut st = self.write();
        let Some(e) = st.by_addr.get(&old).filter(|e| e.id() == id).cloned() else {
            return;
        };
        st.gdb_register(new, &e);
        st.by_addr.insert(new, e);
        st.perf_list(new);
        *st.extra_copies.entry(id).or_default() += 1;
    }

    /// Writes the perf map at `path` now and keeps it current from here on (instead of the
    /// one kept so far, if any).
    pub(crate) fn enable_perf_map(&self, path: PathBuf) -> Result<(), Error> {
        // Absolute, so that the host changing its working directory later does not move the
        // map, and the same file is recognised however it is spelled.
        let path = std::path::absolute(&path).map_err(|e| io_err(&path, e))?;
        let mut st = self.write();
        let State {
            by_addr, perf_map, ..
        } = &mut *st;
        let written = match perf_map {
            // The same path again: listed anew (slots by address), even if the write fails.
            Some(map) if map.path() == path => map.relist(perf_lines(by_addr)),
            _ => {
                // Another path: on failure the map kept so far stays as it is.
                let map = PerfMap::create(path.clone(), perf_lines(by_addr))
                    .map_err(|e| io_err(&path, e))?;
                *perf_map = Some(map);
                Ok(())
            }
        };
        assign_slots(by_addr);
        written.map_err(|e| io_err(&path, e))
    }

    /// Rewrites the perf map (at its enabled path) from the index.
    pub(crate) fn write_perf_map(&self) -> Result<Option<PathBuf>, Error> {
        let mut st = self.write();
        let State {
            by_addr, perf_map, ..
        } = &mut *st;
        let Some(map) = perf_map else {
            return Ok(None);
        };
        let written = map.relist(perf_lines(by_addr));
        assign_slots(by_addr);
        let path = map.path().to_owned();
        written.map_err(|e| io_err(&path, e))?;
        Ok(Some(path))
    }

    pub(crate) fn perf_map_path(&self) -> Option<PathBuf> {
        self.read().perf_map.as_ref().map(|m| m.path().to_owned())
    }

    /// Registers every listed program with gdb now, and every one listed from here on.
    /// Idempotent.
    pub(crate) fn enable_gdb_jit(&self) -> Result<(), Error> {
        if !crate::gdb_jit::supported() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "gdb JIT registration: no ELF machine for this host architecture",
            ));
        }
        let mut st = self.write();
        if st.gdb.is_none() {
            st.gdb = Some(Default::default());
            let entries: Vec<(u64, Entry)> =
                st.by_addr.iter().map(|(&a, e)| (a, e.clone())).collect();
            for (start, e) in entries {
                st.gdb_register(start, &e);
            }
        }
        Ok(())
    }

    /// The program whose code covers `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<SymbolInfo> {
        let st = self.read();
        let (&start, e) = st.by_addr.range(..=addr).next_back()?;
        (addr - start < e.size).then(|| SymbolInfo {
            id: e.id(),
            name: e.symbol.name().clone(),
            start,
            size: e.size,
            offset: addr - start,
            pc: e.symbol.pc_at(addr - start),
        })
    }

    /// Every live program, by address.
    pub(crate) fn list(&self) -> Vec<SymbolInfo> {
        self.read()
            .by_addr
            .iter()
            .map(|(&start, e)| SymbolInfo {
                id: e.id(),
                name: e.symbol.name().clone(),
                start,
                size: e.size,
                offset: 0,
                pc: None,
            })
            .collect()
    }

    /// Live programs (a moved program whose old copy is not reclaimed yet counts once).
    pub(crate) fn len(&self) -> usize {
        self.read().programs
    }
}

/// Keeps a program's symbol at its code when the arena moves it (the key is the program id).
impl crate::arena::MoveListener for Symbols {
    fn moved(&self, id: u64, old: u64, new: u64) {
        self.relocate(id, old, new);
    }

    fn released(&self, id: u64, old: u64) {
        self.remove(id, old);
    }
}

/// The default perf map path for this process.
pub fn default_perf_map_path() -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{}.map", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use packjit_plugin_api::NO_NATIVE_CODE;

    fn symbol(id: u64, name: Option<&str>, lines: Vec<u32>) -> Arc<ProgramSymbol> {
        Arc::new(ProgramSymbol::new(id, name, lines))
    }

    #[test]
    fn lookups_find_program_offset_and_pc() {
        let syms = Symbols::default();
        // pc 0 at 0, pc 1 (lddw) at 4, pc 2 its second slot, pc 3 emitted nothing (same
        // offset as pc 4), pc 4 at 20, code 32 bytes.
        let lines = vec![0, 4, NO_NATIVE_CODE, 20, 20];
        syms.insert(symbol(7, Some("p"), lines), 0x1000, 32);
        syms.insert(symbol(8, None, Vec::new()), 0x1040, 16);
        let pc = |a| syms.lookup(a).map(|s| (s.id, s.offset, s.pc));
        assert_eq!(pc(0xfff), None);
        assert_eq!(pc(0x1000), Some((7, 0, Some(0))));
        assert_eq!(pc(0x1003), Some((7, 3, Some(0))));
        assert_eq!(pc(0x1004), Some((7, 4, Some(1))));
        assert_eq!(pc(0x1013), Some((7, 0x13, Some(1))));
        assert_eq!(
            pc(0x1014),
            Some((7, 0x14, Some(4))),
            "the later of equal offsets"
        );
        assert_eq!(pc(0x101f), Some((7, 0x1f, Some(4))));
        assert_eq!(pc(0x1020), None, "padding after the code");
        assert_eq!(pc(0x1040), Some((8, 0, None)), "no line table");
        let name = |a| syms.lookup(a).map(|s| s.name.to_string());
        assert_eq!(name(0x1000).as_deref(), Some("p"), "the name given");
        assert_eq!(name(0x1040).as_deref(), Some("prog_8"), "the default name");
        syms.remove(7, 0x1000);
        assert_eq!(pc(0x1000), None);
        syms.remove(7, 0x1040);
        assert_eq!(pc(0x1040), Some((8, 0, None)), "a stale id removes nothing");
        assert_eq!(syms.len(), 1);
    }

    #[test]
    fn a_moved_program_is_listed_at_both_copies_until_the_old_one_goes() {
        let syms = Symbols::default();
        syms.insert(symbol(3, Some("p"), vec![0, 8]), 0x2000, 64);
        syms.relocate(3, 0x2000, 0x9000);
        syms.relocate(4, 0x9000, 0x5000); // wrong id: ignored
        assert_eq!(syms.len(), 1, "one program");
        assert_eq!(syms.list().len(), 2, "two copies");
        let at = |a| syms.lookup(a).map(|s| (s.id, s.start, s.pc));
        assert_eq!(at(0x2009), Some((3, 0x2000, Some(1))));
        assert_eq!(at(0x9009), Some((3, 0x9000, Some(1))));
        assert_eq!(at(0x5000), None);
        syms.remove(3, 0x2000);
        assert_eq!((syms.len(), syms.list().len(), at(0x2009)), (1, 1, None));
        syms.remove(3, 0x9000);
        assert_eq!(syms.len(), 0);
    }
}
