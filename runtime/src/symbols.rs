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
//! current: a load appends a line, a reclamation rewrites the file (write to a temporary file
//! in the same directory, then `rename`, so a reader never sees a half-written map).
//!
//! With gdb registration on ([`crate::gdb_jit`]), every listed copy of a program is also
//! registered with gdb, at the same moments: listed = registered. Registrations still held
//! when the index itself goes (the runtime and all its programs are gone) are dropped with
//! it, which unregisters them.

use crate::id_map::IdMap;
use crate::{Error, ErrorKind};
use std::collections::{btree_map, BTreeMap};
use std::io::Write;
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
    /// Its perf map line, while the map is on: formatted once, since every release rewrites
    /// the whole map (formatting was 80% of a rewrite's cost).
    perf_line: Option<Box<str>>,
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
    perf_map: Option<PathBuf>,
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

fn perf_line(start: u64, e: &Entry) -> String {
    // perf splits on the first two spaces only; names with spaces or newlines would still
    // corrupt the line structure, so replace the latter.
    let name: String = e
        .symbol
        .name()
        .chars()
        .map(|c| if c == '\n' || c == '\r' { '_' } else { c })
        .collect();
    format!("{start:x} {:x} {name}\n", e.size)
}

impl State {
    /// With the perf map on: formats the line of `e` at `start` into it and appends it to the
    /// map. A failed append is not a load failure: the next rewrite repairs the file.
    fn append_perf_line(&self, start: u64, e: &mut Entry) {
        let Some(path) = &self.perf_map else {
            e.perf_line = None;
            return;
        };
        let line = perf_line(start, e);
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
        e.perf_line = Some(line.into());
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
        let mut e = Entry {
            size,
            symbol,
            perf_line: None,
        };
        let mut st = self.write();
        // Appending keeps a load O(1); perf takes the last line for an address anyway.
        st.append_perf_line(start, &mut e);
        st.gdb_register(start, &e);
        st.by_addr.insert(start, e);
        st.programs += 1;
    }

    /// Removes program `id` at `start` (its code is about to be reclaimed).
    pub(crate) fn remove(&self, id: u64, start: u64) {
        self.remove_many(&[(id, start)]);
    }

    /// Removes each program `id` at `start` (their code is about to be reclaimed) under one
    /// lock, rewriting the perf map once.
    pub(crate) fn remove_many(&self, entries: &[(u64, u64)]) {
        let mut st = self.write();
        let mut removed = false;
        for &(id, start) in entries {
            // The id check keeps a stale removal from ever taking a newer program's entry.
            match st.by_addr.entry(start) {
                btree_map::Entry::Occupied(e) if e.get().id() == id => drop(e.remove()),
                _ => continue,
            }
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
        if removed {
            if let Some(path) = st.perf_map.clone() {
                let _ = Self::rewrite(&st, &path);
            }
        }
    }

    /// Program `id` at `old` now also runs at `new` (the arena moved it; the old copy stays
    /// listed until it is reclaimed, since threads may still be finishing there).
    pub(crate) fn relocate(&self, id: u64, old: u64, new: u64) {
        let mut st = self.write();
        let Some(mut e) = st.by_addr.get(&old).filter(|e| e.id() == id).cloned() else {
            return;
        };
        st.append_perf_line(new, &mut e);
        st.gdb_register(new, &e);
        st.by_addr.insert(new, e);
        *st.extra_copies.entry(id).or_default() += 1;
    }

    fn rewrite(st: &State, path: &Path) -> Result<(), Error> {
        let mut text = String::with_capacity(st.by_addr.len() * 40);
        for (&start, e) in &st.by_addr {
            match &e.perf_line {
                Some(line) => text.push_str(line),
                None => text.push_str(&perf_line(start, e)),
            }
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text).map_err(|e| io_err(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
    }

    /// Writes the perf map at `path` now and keeps it current from here on.
    pub(crate) fn enable_perf_map(&self, path: PathBuf) -> Result<(), Error> {
        let mut st = self.write();
        Self::rewrite(&st, &path)?;
        for (&start, e) in st.by_addr.iter_mut() {
            e.perf_line = Some(perf_line(start, e).into());
        }
        st.perf_map = Some(path);
        Ok(())
    }

    /// Rewrites the perf map (at its enabled path) from the index.
    pub(crate) fn write_perf_map(&self) -> Result<Option<PathBuf>, Error> {
        let st = self.write();
        match &st.perf_map {
            Some(p) => Self::rewrite(&st, p).map(|()| Some(p.clone())),
            None => Ok(None),
        }
    }

    pub(crate) fn perf_map_path(&self) -> Option<PathBuf> {
        self.read().perf_map.clone()
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
