//! Loading programs from clang's relocatable eBPF objects (`clang -O2 -target bpf -c`).
//!
//! [`link`] turns one program of an `ET_REL` / `EM_BPF` object into flat bytecode the
//! verifier and the backends take, plus the program's global data:
//!
//! * The **entry** is a section (`SEC("xdp")` → the whole section, entry at its start) or a
//!   function symbol (its `[st_value, st_value + st_size)` range).
//! * **Calls** (`call` with `src = 1`, `R_BPF_64_32`) are followed transitively: each callee's
//!   function (the `STT_FUNC` symbol covering the target, else its whole section) is appended
//!   once, and the call's immediate is rewritten pc-relative. The target slot is
//!   `sym.st_value / 8 + imm + 1` in the symbol's section, the rule libbpf uses: clang writes
//!   `imm = -1` against a function symbol and `imm = offset / 8 - 1` against a section symbol.
//!   A call without relocation is already pc-relative inside its own section.
//! * **Externs**: a call whose relocation names an undefined symbol becomes a helper call
//!   (`src = 0`, `imm` = the id the resolver gives for that name).
//! * **Global data**: every `.rodata*`, `.data*` and `.bss*` section is copied into memory
//!   owned by the returned [`GlobalData`] (8-byte aligned, `.bss` zeroed), and each `lddw`
//!   with `R_BPF_64_64` gets the absolute address `base(section) + st_value + imm` (the lddw's
//!   first immediate is the implicit addend of a REL relocation: the offset for a section
//!   symbol, usually 0 for a named one). `R_BPF_64_ABS64` / `ABS32` inside data sections (a
//!   pointer table in `.rodata`) are patched the same way.
//!
//! * **Maps**: [`elf_maps`] describes every map of the object ([`ElfMapDef`], in symbol
//!   order): libbpf's BTF-defined maps in `.maps` (each variable a struct whose members
//!   encode the attributes: `__uint(type, N)` is `int (*type)[N]`, `__type(key, T)` is
//!   `T *key`, `__array(values, ...)` a flexible array of pointers whose `R_BPF_64_ABS64`
//!   relocations statically initialise a PROG_ARRAY) and legacy `struct bpf_map_def`s in
//!   `maps` / `maps/*`. An `lddw` with `R_BPF_64_64` against a map symbol (or the `.maps`
//!   section symbol plus an addend landing exactly on a map's start) is rewritten as the
//!   kernel's loader expects: `src = BPF_PSEUDO_MAP_FD` (1), `imm` = the map's index in
//!   [`elf_maps`], second immediate 0; [`Linked::maps_used`] lists the indices. Creating the
//!   maps is the host's business; [`crate::Runtime::load_elf`] refuses programs that use any.
//!   BTF is read by our own small reader ([`btf`]) over `object`'s sections rather
//!   than through aya-obj, which pulls in a large dependency tree and its own object model:
//!   we need only type sizes, struct members, pointers / arrays / typedefs / modifiers and
//!   `DATASEC` / `VAR` for `.maps`.
//! * **CO-RE**: the `core_relo` records of `.BTF.ext` (accesses through
//!   `preserve_access_index` types, `__builtin_preserve_field_info` / `_type_info` /
//!   `_enum_value`) are resolved as libbpf resolves them (`core_relo.rs`) against
//!   [`ElfLoadOptions::target_btf`], by default the object's own `.BTF` (every relocation
//!   keeps its local value), and patched into each linked unit's instructions (records are
//!   per section, so they follow their instructions wherever the unit is placed);
//!   [`Linked::core_relocations`] lists them. One nothing in the target satisfies poisons its
//!   instruction as libbpf does ([`Linked::core_poisoned`]): the load refuses the program,
//!   naming section, instruction, kind, access and why, only if the code can reach it, so an
//!   access guarded by an existence check (which gives 0) loads and runs.
//!
//! Everything else is refused with an error naming the section, symbol, relocation type and
//! offset: unknown relocation types, malformed map definitions (naming the map and member),
//! map references from data or into the middle of a map, relocations in `.maps` other than
//! a PROG_ARRAY's `values`, unresolved externs, calls into sections that are not code,
//! and malformed objects. A malformed map definition fails only the programs that
//! reference a map (objects without map references link as before). An `lddw` of a
//! function's address (a callback for `bpf_loop`) links the function like a callee and
//! takes the kernel loader's form (`BPF_PSEUDO_FUNC`). Relocations in sections that are
//! neither linked code nor data (`.BTF`, `.BTF.ext`, DWARF) are ignored: they do not affect
//! execution.

use crate::{ErrorKind, MemRegion, Program, RegionAccess};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
use object::{
    Endianness, Object, ObjectSection, ObjectSymbol, Relocation, RelocationFlags, RelocationTarget,
    SectionIndex, SectionKind, SymbolIndex, SymbolSection,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::Error;

// The BTF reader lives with its only user (re-exported as `packjit::btf`).
#[path = "btf.rs"]
pub mod btf;
use btf::{Btf, BtfType};

// CO-RE relocations (`.BTF.ext` core_relo records), applied by `link`.
#[path = "core_relo.rs"]
mod core_relo;
pub use core_relo::POISON_HELPER;

/// `R_BPF_*` relocation types (LLVM's `BPF.def`).
pub const R_BPF_NONE: u32 = 0;
/// `lddw` of a symbol's address (64-bit immediate split over the two slots).
pub const R_BPF_64_64: u32 = 1;
/// 64-bit absolute address in data.
pub const R_BPF_64_ABS64: u32 = 2;
/// 32-bit absolute address in data.
pub const R_BPF_64_ABS32: u32 = 3;
/// 32-bit value in DWARF (not loaded).
pub const R_BPF_64_NODYLD32: u32 = 4;
/// `call` immediate (pc-relative in slots, after linking).
pub const R_BPF_64_32: u32 = 10;

/// `lddw` source register of a map reference: `imm` is the map's index in [`elf_maps`].
pub const BPF_PSEUDO_MAP_FD: u8 = 1;

/// `lddw` source register of a function's address (a callback): `imm` is the function's
/// slot relative to the next one.
pub const BPF_PSEUDO_FUNC: u8 = 4;

const INSN: usize = 8;
const OP_CALL: u8 = 0x85;
const OP_LDDW: u8 = 0x18;

/// Which program of the object to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElfProgramSelector {
    /// A code section by name (`SEC("xdp")`, `.text`); the entry is its first instruction.
    Section(String),
    /// A function symbol by name (global or static `STT_FUNC`).
    Function(String),
}

impl std::fmt::Display for ElfProgramSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElfProgramSelector::Section(s) => write!(f, "section `{s}`"),
            ElfProgramSelector::Function(s) => write!(f, "function `{s}`"),
        }
    }
}

/// What [`link`] and [`crate::Runtime::load_elf`] load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfLoadOptions {
    /// The program.
    pub program: ElfProgramSelector,
    /// The BTF CO-RE relocations resolve against: the raw contents of a `.BTF` section (e.g.
    /// from `clang -g -target bpf -c` of the host's context types) describing the layout the
    /// program will really see. `None`: the object's own `.BTF`, so every relocation keeps
    /// its local value (the program's context types are the host's).
    pub target_btf: Option<Vec<u8>>,
}

impl ElfLoadOptions {
    /// Selects the program by section name.
    pub fn section(name: &str) -> Self {
        Self {
            program: ElfProgramSelector::Section(name.into()),
            target_btf: None,
        }
    }

    /// Selects the program by function symbol.
    pub fn function(name: &str) -> Self {
        Self {
            program: ElfProgramSelector::Function(name.into()),
            target_btf: None,
        }
    }

    /// Resolves CO-RE relocations against `btf` (raw `.BTF` bytes) instead of the object's
    /// own BTF.
    pub fn with_target_btf(mut self, btf: Vec<u8>) -> Self {
        self.target_btf = Some(btf);
        self
    }
}

fn bad(kind: ErrorKind, msg: impl std::fmt::Display) -> Error {
    Error::new(kind, format!("ELF: {msg}"))
}

/// Name of a relocation type, for messages.
pub fn reloc_name(r_type: u32) -> String {
    match r_type {
        R_BPF_NONE => "R_BPF_NONE".into(),
        R_BPF_64_64 => "R_BPF_64_64".into(),
        R_BPF_64_ABS64 => "R_BPF_64_ABS64".into(),
        R_BPF_64_ABS32 => "R_BPF_64_ABS32".into(),
        R_BPF_64_NODYLD32 => "R_BPF_64_NODYLD32".into(),
        R_BPF_64_32 => "R_BPF_64_32".into(),
        t => format!("unknown relocation type {t}"),
    }
}

/// One section of global data, owned by the program.
pub struct DataSection {
    name: String,
    writable: bool,
    len: usize,
    // 8-byte aligned storage: programs use 64-bit loads on globals. Atomics because running
    // programs and the host may touch the same bytes from different threads; the host side
    // uses relaxed byte accesses, so a concurrent read is torn but defined.
    words: Box<[AtomicU64]>,
}

impl DataSection {
    fn new(name: &str, writable: bool, init: Option<&[u8]>, len: usize) -> Self {
        // At least one word so the base address is a real, unique allocation even for an
        // empty section (a zero-length box would hand out a dangling address).
        let words: Box<[AtomicU64]> = (0..len.div_ceil(8).max(1))
            .map(|_| AtomicU64::new(0))
            .collect();
        let s = Self {
            name: name.into(),
            writable,
            len,
            words,
        };
        if let Some(b) = init {
            s.write_at(0, b);
        }
        s
    }

    fn bytes(&self) -> &[AtomicU8] {
        // SAFETY: AtomicU8 has the size and alignment of u8 and the words are at least
        // `len` bytes; every access through the view is atomic.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<AtomicU8>(), self.len) }
    }

    /// Section name (`.rodata`, `.data.counters`, `.bss`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the program may write it (`.data*`, `.bss*`).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the section is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address the program sees (the lddw relocations point here).
    pub fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }

    fn read_at(&self, off: usize, out: &mut [u8]) {
        for (o, b) in out.iter_mut().zip(&self.bytes()[off..]) {
            *o = b.load(Ordering::Relaxed);
        }
    }

    fn write_at(&self, off: usize, data: &[u8]) {
        for (b, &v) in self.bytes()[off..].iter().zip(data) {
            b.store(v, Ordering::Relaxed);
        }
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.read_at(0, &mut v);
        v
    }
}

impl std::fmt::Debug for DataSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataSection")
            .field("name", &self.name)
            .field("writable", &self.writable)
            .field("len", &self.len)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .finish()
    }
}

/// A data symbol: `len` bytes at `offset` in section `section`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataSymbol {
    /// Symbol name.
    pub name: String,
    /// Index into [`GlobalData::sections`].
    pub section: usize,
    /// Offset in the section.
    pub offset: usize,
    /// Size (`st_size`).
    pub len: usize,
}

/// A program's global data: its `.rodata*`, `.data*` and `.bss*` sections and the symbols
/// in them. The memory lives as long as this value (and so as long as its [`Program`]);
/// its addresses are baked into the program's code.
#[derive(Debug, Default)]
pub struct GlobalData {
    sections: Vec<DataSection>,
    symbols: Vec<DataSymbol>,
}

impl GlobalData {
    /// The sections, in object order.
    pub fn sections(&self) -> &[DataSection] {
        &self.sections
    }

    /// The named data symbols.
    pub fn symbols(&self) -> &[DataSymbol] {
        &self.symbols
    }

    /// Sandbox regions covering the data: `.rodata*` read-only, the rest read-write.
    pub fn regions(&self) -> Vec<MemRegion> {
        self.sections
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| {
                let access = if s.writable {
                    RegionAccess::ReadWrite
                } else {
                    RegionAccess::ReadOnly
                };
                // SAFETY: the memory is owned by this GlobalData, which the Program holds
                // for as long as its code can run; it is only ever accessed through atomics
                // (UnsafeCell), never through a Rust reference a run could invalidate.
                unsafe { MemRegion::new(s.addr() as *const u8, s.len, access) }
            })
            .collect()
    }

    /// `(section, offset, len)` of a section or symbol name; sections win over symbols.
    fn find(&self, name: &str) -> Result<(&DataSection, usize, usize), Error> {
        if let Some(s) = self.sections.iter().find(|s| s.name == name) {
            return Ok((s, 0, s.len));
        }
        if let Some(sym) = self.symbols.iter().find(|s| s.name == name) {
            return Ok((&self.sections[sym.section], sym.offset, sym.len));
        }
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("no global data section or symbol named `{name}`"),
        ))
    }

    /// Size of a section or symbol.
    pub fn size_of(&self, name: &str) -> Result<usize, Error> {
        self.find(name).map(|(_, _, len)| len)
    }

    /// Reads a whole section or symbol.
    pub fn read(&self, name: &str) -> Result<Vec<u8>, Error> {
        let (s, off, len) = self.find(name)?;
        let mut v = vec![0; len];
        s.read_at(off, &mut v);
        Ok(v)
    }

    /// Reads `out.len()` bytes at `offset` into a section or symbol.
    pub fn read_into(&self, name: &str, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let (s, off, len) = self.find(name)?;
        check_range(name, offset, out.len(), len)?;
        s.read_at(off + offset, out);
        Ok(())
    }

    /// Writes `data` at `offset` into a section or symbol. `.rodata` can be written too: it is
    /// read-only for the program, not for its host (e.g. a lookup table set before the first
    /// run).
    pub fn write(&self, name: &str, offset: usize, data: &[u8]) -> Result<(), Error> {
        let (s, off, len) = self.find(name)?;
        check_range(name, offset, data.len(), len)?;
        s.write_at(off + offset, data);
        Ok(())
    }

    /// Reads a little-endian integer of up to 8 bytes (the symbol's size) as u64.
    pub fn read_u64(&self, name: &str) -> Result<u64, Error> {
        let v = self.read(name)?;
        if v.len() > 8 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("`{name}` is {} bytes, more than a u64", v.len()),
            ));
        }
        let mut b = [0u8; 8];
        b[..v.len()].copy_from_slice(&v);
        Ok(u64::from_le_bytes(b))
    }
}

fn check_range(name: &str, offset: usize, n: usize, len: usize) -> Result<(), Error> {
    if offset.checked_add(n).is_none_or(|e| e > len) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{n} bytes at offset {offset} are outside `{name}` ({len} bytes)"),
        ));
    }
    Ok(())
}

/// The linked program: bytecode ready for the verifier, its data, and where each linked
/// function starts.
#[derive(Debug)]
pub struct Linked {
    /// Flat bytecode, entry first.
    pub code: Vec<u8>,
    /// Global data the code points into.
    pub data: GlobalData,
    /// `(name, first slot)` of each linked function or section, entry first.
    pub functions: Vec<(String, usize)>,
    /// Extern names resolved to helper ids.
    pub externs: Vec<(String, u32)>,
    /// Indices into [`elf_maps`] of the maps the code references (ascending, each once).
    /// Each reference is an `lddw dst, imm` with `src = BPF_PSEUDO_MAP_FD` and `imm` = the
    /// index (second slot's immediate 0): the host replaces it with its map's handle.
    pub maps_used: Vec<usize>,
    /// CO-RE relocations applied: `(slot, value the object was compiled with, value patched
    /// in)`, in slot order.
    pub core_relocations: Vec<(usize, u64, u64)>,
    /// CO-RE relocations nothing in the target satisfies, in slot order. Each instruction is
    /// now `call 0xbad2310` (libbpf's poison, [`POISON_HELPER`]): loading the code refuses
    /// it if a path can reach one, with this reason; a guarded access
    /// (`bpf_core_field_exists()` false after relocation) loads and runs.
    pub core_poisoned: Vec<PoisonedRelocation>,
}

/// A piece of code placed in the output: `[start, end)` bytes of section `sec` at slot `base`.
#[derive(Clone, Copy)]
struct Unit {
    sec: SectionIndex,
    start: usize,
    end: usize,
    base: usize,
}

type File<'d> = ElfFile64<'d, Endianness>;

struct Linker<'d, 'f> {
    file: &'f File<'d>,
    // Section index → index into `data.sections`.
    data_index: BTreeMap<usize, usize>,
    data: GlobalData,
    units: Vec<Unit>,
    // (section, start) → index into `units`, for the covering-unit lookup of each call.
    unit_at: BTreeMap<(usize, usize), usize>,
    // Section index → its `STT_FUNC` symbols `(start, end, name)` with a size, by start.
    // Built once: a call's target is looked up by binary search, so a crafted object with
    // many calls and symbols links in n log n, not n².
    funcs: BTreeMap<usize, Vec<(usize, usize, String)>>,
    // Section index → its relocations by offset, read once when its first unit is relocated:
    // each unit takes its own range by binary search, so a section of many called functions
    // and many relocations links in n log n, not units × relocations.
    relocs: BTreeMap<usize, Vec<(u64, Relocation)>>,
    code: Vec<u8>,
    functions: Vec<(String, usize)>,
    externs: Vec<(String, u32)>,
    // The object's maps, parsed at the first map reference (an object whose code references
    // none links whatever its map sections hold).
    maps: Option<Result<Vec<MapEntry>, Error>>,
    maps_used: Vec<usize>,
}

fn sec_name(file: &File<'_>, idx: SectionIndex) -> String {
    file.section_by_index(idx)
        .ok()
        .and_then(|s| s.name().ok().map(str::to_string))
        .unwrap_or_else(|| format!("#{}", idx.0))
}

fn sym_name(file: &File<'_>, idx: SymbolIndex) -> String {
    match file.symbol_by_index(idx) {
        Ok(s) => match s.name() {
            Ok(n) if !n.is_empty() => n.to_string(),
            // Section symbols have no name of their own.
            _ => match s.section() {
                SymbolSection::Section(i) => sec_name(file, i),
                _ => format!("#{}", idx.0),
            },
        },
        Err(_) => format!("#{}", idx.0),
    }
}

fn is_code(file: &File<'_>, idx: SectionIndex) -> bool {
    file.section_by_index(idx).is_ok_and(|s| {
        let flags = s.elf_section_header().sh_flags(file.endian());
        flags & u64::from(elf::SHF_EXECINSTR) != 0
    })
}

fn data_kind(name: &str) -> Option<bool> {
    let is = |p: &str| name == p || name.starts_with(&format!("{p}."));
    if is(".rodata") {
        Some(false)
    } else if is(".data") || is(".bss") {
        Some(true)
    } else {
        None
    }
}

fn is_maps(name: &str) -> bool {
    name == ".maps" || name == "maps" || name.starts_with("maps/")
}

/// Links the program `opts` selects. `resolve` maps an extern function name to a helper id.
pub fn link(
    bytes: &[u8],
    opts: &ElfLoadOptions,
    resolve: &dyn Fn(&str) -> Option<u32>,
) -> Result<Linked, Error> {
    let file = parse(bytes)?;
    let mut l = Linker {
        file: &file,
        data_index: BTreeMap::new(),
        data: GlobalData::default(),
        units: Vec::new(),
        unit_at: BTreeMap::new(),
        funcs: BTreeMap::new(),
        relocs: BTreeMap::new(),
        code: Vec::new(),
        functions: Vec::new(),
        externs: Vec::new(),
        maps: None,
        maps_used: Vec::new(),
    };
    l.layout_data()?;
    for sym in file.symbols() {
        if sym.kind() != object::SymbolKind::Text || sym.size() == 0 {
            continue;
        }
        let SymbolSection::Section(si) = sym.section() else {
            continue;
        };
        let start = sym.address() as usize;
        let end = start.saturating_add(sym.size() as usize);
        let name = sym.name().unwrap_or("").to_string();
        l.funcs.entry(si.0).or_default().push((start, end, name));
    }
    l.settle_funcs()?;
    let entry = l.entry_unit(&opts.program)?;
    l.place(entry.0, entry.1, entry.2, entry.3)?;
    // Units are appended while relocating earlier ones: iterate by index.
    let mut i = 0;
    while i < l.units.len() {
        l.relocate_unit(i, resolve)?;
        i += 1;
    }
    l.relocate_data()?;
    let core = l.relocate_core(opts.target_btf.as_deref())?;
    l.maps_used.sort_unstable();
    l.maps_used.dedup();
    Ok(Linked {
        code: l.code,
        data: l.data,
        functions: l.functions,
        externs: l.externs,
        maps_used: l.maps_used,
        core_relocations: core.applied,
        core_poisoned: core.poisoned,
    })
}

/// What [`Linker::relocate_core`] did.
#[derive(Default)]
struct CoreOutcome {
    applied: Vec<(usize, u64, u64)>,
    poisoned: Vec<PoisonedRelocation>,
}

/// A CO-RE relocation nothing in the target satisfies: its instruction is poisoned (see
/// [`Linked::core_poisoned`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoisonedRelocation {
    /// The instruction's slot in [`Linked::code`].
    pub slot: usize,
    /// Section, instruction, CO-RE record, kind, access, and why nothing satisfies it.
    pub why: String,
}

fn parse(bytes: &[u8]) -> Result<File<'_>, Error> {
    // Check the header ourselves first: clearer messages than the generic parser's.
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        return Err(bad(
            ErrorKind::InvalidArgument,
            "not an ELF object (bad magic)",
        ));
    }
    if bytes.len() < 64 {
        return Err(bad(
            ErrorKind::InvalidArgument,
            format!("truncated: {} bytes, an ELF64 header is 64", bytes.len()),
        ));
    }
    if bytes[4] != elf::ELFCLASS64 {
        return Err(bad(ErrorKind::InvalidArgument, "not a 64-bit ELF object"));
    }
    if bytes[5] != elf::ELFDATA2LSB {
        return Err(bad(
            ErrorKind::Unsupported,
            "big-endian eBPF object (bpfeb); compile with -target bpfel or bpf on a little-endian host",
        ));
    }
    let file = File::parse(bytes)
        .map_err(|e| bad(ErrorKind::InvalidArgument, format!("malformed object: {e}")))?;
    let hdr = file.elf_header();
    let e = file.endian();
    if hdr.e_machine(e) != elf::EM_BPF {
        return Err(bad(
            ErrorKind::InvalidArgument,
            format!("e_machine {} is not EM_BPF (247)", hdr.e_machine(e)),
        ));
    }
    if hdr.e_type(e) != elf::ET_REL {
        return Err(bad(
            ErrorKind::InvalidArgument,
            format!(
                "e_type {} is not ET_REL (a relocatable object from `clang -c`)",
                hdr.e_type(e)
            ),
        ));
    }
    // Touch every section's data and relocations now so a truncated file fails here, with
    // the section named, rather than half-way through linking.
    for s in file.sections() {
        let name = s.name().unwrap_or("?").to_string();
        if s.kind() != SectionKind::UninitializedData {
            s.data().map_err(|e| {
                bad(
                    ErrorKind::InvalidArgument,
                    format!("section `{name}`: contents outside the file ({e})"),
                )
            })?;
        }
    }
    Ok(file)
}

impl Linker<'_, '_> {
    fn layout_data(&mut self) -> Result<(), Error> {
        let file = self.file;
        for s in file.sections() {
            let Ok(name) = s.name() else { continue };
            let Some(writable) = data_kind(name) else {
                continue;
            };
            let len = usize::try_from(s.size()).map_err(|_| {
                bad(
                    ErrorKind::InvalidArgument,
                    format!("section `{name}`: size too large"),
                )
            })?;
            // No real program has gigabytes of globals; a corrupt size must not become an
            // allocation of that size.
            if len > 64 << 20 {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    format!("section `{name}`: {len} bytes of global data (limit 64 MiB)"),
                ));
            }
            let init = if s.kind() == SectionKind::UninitializedData {
                None
            } else {
                Some(s.data().map_err(|e| {
                    bad(ErrorKind::InvalidArgument, format!("section `{name}`: {e}"))
                })?)
            };
            if init.is_some_and(|b| b.len() != len) {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    format!("section `{name}`: contents shorter than its size"),
                ));
            }
            self.data_index
                .insert(s.index().0, self.data.sections.len());
            self.data
                .sections
                .push(DataSection::new(name, writable, init, len));
        }
        for sym in file.symbols() {
            let SymbolSection::Section(si) = sym.section() else {
                continue;
            };
            let Some(&di) = self.data_index.get(&si.0) else {
                continue;
            };
            let Ok(name) = sym.name() else { continue };
            if name.is_empty() || sym.kind() == object::SymbolKind::Section {
                continue;
            }
            let sec = &self.data.sections[di];
            let (off, len) = (sym.address(), sym.size());
            if off.checked_add(len).is_none_or(|e| e > sec.len as u64) {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    format!(
                        "symbol `{name}`: [{off:#x}, +{len:#x}) is outside section `{}` ({:#x} bytes)",
                        sec.name, sec.len
                    ),
                ));
            }
            self.data.symbols.push(DataSymbol {
                name: name.into(),
                section: di,
                offset: off as usize,
                len: len as usize,
            });
        }
        Ok(())
    }

    /// `(section, start, end, name)` of the selected entry.
    fn entry_unit(
        &self,
        sel: &ElfProgramSelector,
    ) -> Result<(SectionIndex, usize, usize, String), Error> {
        let file = self.file;
        match sel {
            ElfProgramSelector::Section(name) => {
                let s = file.section_by_name(name).ok_or_else(|| {
                    let code: Vec<String> = file
                        .sections()
                        .filter(|s| is_code(file, s.index()) && s.size() > 0)
                        .filter_map(|s| s.name().ok().map(|n| format!("`{n}`")))
                        .collect();
                    bad(
                        ErrorKind::InvalidArgument,
                        format!(
                            "no section `{name}` (code sections: {})",
                            if code.is_empty() {
                                "none".into()
                            } else {
                                code.join(", ")
                            }
                        ),
                    )
                })?;
                if !is_code(file, s.index()) {
                    return Err(bad(
                        ErrorKind::InvalidArgument,
                        format!("section `{name}` is not code (no SHF_EXECINSTR)"),
                    ));
                }
                let len = s.size() as usize;
                if len == 0 {
                    return Err(bad(
                        ErrorKind::InvalidArgument,
                        format!("section `{name}` is empty"),
                    ));
                }
                Ok((s.index(), 0, len, name.clone()))
            }
            ElfProgramSelector::Function(name) => {
                let sym = file
                    .symbols()
                    .find(|s| s.name() == Ok(name.as_str()) && s.kind() == object::SymbolKind::Text)
                    .ok_or_else(|| {
                        bad(
                            ErrorKind::InvalidArgument,
                            format!("no function symbol `{name}`"),
                        )
                    })?;
                let SymbolSection::Section(si) = sym.section() else {
                    return Err(bad(
                        ErrorKind::InvalidArgument,
                        format!("function `{name}` is not defined in this object"),
                    ));
                };
                let (start, end) = self.func_range(si, sym.address() as usize)?;
                Ok((si, start, end, name.clone()))
            }
        }
    }

    /// Sorts each section's functions and makes their ranges disjoint, the invariant
    /// `slot_of` relies on: a byte of a section belongs to at most one placed unit, so each
    /// is placed (and its code copied) once. Ranges are clamped to their section, as
    /// `func_range` reads them; aliases (two symbols, one range) become one function; ranges
    /// that overlap otherwise are refused, naming both. (A crafted object with overlapping
    /// symbols used to place the same bytes again on every lookup, without bound.)
    fn settle_funcs(&mut self) -> Result<(), Error> {
        let file = self.file;
        for (&si, v) in self.funcs.iter_mut() {
            let sec_len = file
                .section_by_index(SectionIndex(si))
                .map_or(0, |s| s.size() as usize);
            for f in v.iter_mut() {
                f.1 = f.1.min(sec_len);
            }
            v.retain(|f| f.0 < f.1);
            v.sort();
            v.dedup_by(|later, first| (later.0, later.1) == (first.0, first.1));
            if let Some(w) = v.windows(2).find(|w| w[1].0 < w[0].1) {
                let (a, b) = (&w[0], &w[1]);
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    format!(
                        "section `{}`: functions `{}` [{:#x}, {:#x}) and `{}` [{:#x}, {:#x}) overlap",
                        sec_name(file, SectionIndex(si)),
                        a.2,
                        a.0,
                        a.1,
                        b.2,
                        b.0,
                        b.1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The `[start, end)` of the function covering byte `off` of code section `si`: the
    /// `STT_FUNC` symbol whose range holds it, else the stretch between the functions around
    /// it (the whole section when it has none), so that no two units share a byte.
    fn func_range(&self, si: SectionIndex, off: usize) -> Result<(usize, usize), Error> {
        let file = self.file;
        let sec = file
            .section_by_index(si)
            .map_err(|e| bad(ErrorKind::InvalidArgument, e))?;
        let sec_len = sec.size() as usize;
        if off >= sec_len || off % INSN != 0 {
            return Err(bad(
                ErrorKind::InvalidArgument,
                format!(
                    "section `{}`: offset {off:#x} is not an instruction of the section ({sec_len:#x} bytes)",
                    sec_name(file, si)
                ),
            ));
        }
        // The function whose range covers `off`: the last one starting at or before it
        // (ranges are disjoint and clamped to the section: see `settle_funcs`).
        let Some(v) = self.funcs.get(&si.0) else {
            return Ok((0, sec_len));
        };
        let i = v.partition_point(|f| f.0 <= off);
        if i > 0 && off < v[i - 1].1 {
            return Ok((v[i - 1].0, v[i - 1].1));
        }
        // From the first instruction after the previous function (`off` is one, so it lies
        // at or after it even when that function's size is not a multiple of 8).
        let start = i
            .checked_sub(1)
            .map_or(0, |p| v[p].1.next_multiple_of(INSN));
        let end = v.get(i).map_or(sec_len, |f| f.0);
        Ok((start, end))
    }

    fn place(
        &mut self,
        sec: SectionIndex,
        start: usize,
        end: usize,
        name: String,
    ) -> Result<usize, Error> {
        let base = self.code.len() / INSN;
        let bytes = self
            .file
            .section_by_index(sec)
            .ok()
            .and_then(|s| s.data().ok())
            .and_then(|d| d.get(start..end))
            .ok_or_else(|| {
                // A code section without contents (SHT_NOBITS) or shorter than its symbols.
                bad(
                    ErrorKind::InvalidArgument,
                    format!(
                        "section `{}`: no contents for [{start:#x}, {end:#x})",
                        sec_name(self.file, sec)
                    ),
                )
            })?;
        // Units of a section are disjoint (see `settle_funcs`), so the output is at most the
        // sum of the code sections' sizes (which, for sections that overlap in the file, can
        // exceed the file); past what the verifier accepts, stop here rather than copy more.
        if (self.code.len() + bytes.len()).div_ceil(INSN) > packjit_frontend::MAX_INSNS {
            return Err(bad(
                ErrorKind::InvalidArgument,
                format!(
                    "the linked program exceeds {} instructions (at section `{}`)",
                    packjit_frontend::MAX_INSNS,
                    sec_name(self.file, sec)
                ),
            ));
        }
        self.code.extend_from_slice(bytes);
        // Sizes that are not a multiple of 8 would shift every later slot; pad the tail so the
        // verifier reports the broken instruction instead.
        while self.code.len() % INSN != 0 {
            self.code.push(0);
        }
        self.unit_at.insert((sec.0, start), self.units.len());
        self.units.push(Unit {
            sec,
            start,
            end,
            base,
        });
        self.functions.push((name, base));
        Ok(base)
    }

    /// Output slot of byte `off` of section `sec`, placing its function if needed.
    fn slot_of(&mut self, sec: SectionIndex, off: usize) -> Result<usize, Error> {
        // The unit starting last at or before `off` in this section, if it covers `off`.
        if let Some((_, &ui)) = self.unit_at.range((sec.0, 0)..=(sec.0, off)).next_back() {
            let u = self.units[ui];
            if off < u.end {
                return Ok(u.base + (off - u.start) / INSN);
            }
        }
        let (start, end) = self.func_range(sec, off)?;
        let name = self
            .funcs
            .get(&sec.0)
            .and_then(|v| v.iter().find(|f| f.0 == start && !f.2.is_empty()))
            .map(|f| f.2.clone())
            .unwrap_or_else(|| format!("{}+{start:#x}", sec_name(self.file, sec)));
        let base = self.place(sec, start, end, name)?;
        Ok(base + (off - start) / INSN)
    }

    fn relocate_unit(
        &mut self,
        ui: usize,
        resolve: &dyn Fn(&str) -> Option<u32>,
    ) -> Result<(), Error> {
        let file = self.file;
        let u = self.units[ui];
        let sec = file
            .section_by_index(u.sec)
            .map_err(|e| bad(ErrorKind::InvalidArgument, e))?;
        let sname = sec_name(file, u.sec);
        let mut relocated = vec![false; (u.end - u.start) / INSN];
        // Taken out while this unit is relocated (placing callees needs `&mut self`) and put
        // back after: nothing else relocates this section meanwhile. (After an error the link
        // is over, so it need not go back.)
        let relocs = match self.relocs.remove(&u.sec.0) {
            Some(r) => r,
            None => {
                let mut r: Vec<(u64, Relocation)> = sec.relocations().collect();
                // Stable: relocations at one offset keep their order in the file.
                r.sort_by_key(|&(off, _)| off);
                r
            }
        };
        let first = relocs.partition_point(|&(off, _)| (off as usize) < u.start);
        let last = relocs.partition_point(|&(off, _)| (off as usize) < u.end);
        for (off, rel) in &relocs[first..last] {
            let off = *off as usize;
            let RelocationFlags::Elf { r_type } = rel.flags() else {
                continue;
            };
            let RelocationTarget::Symbol(si) = rel.target() else {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    format!(
                        "section `{sname}`, offset {off:#x}: {} without a symbol",
                        reloc_name(r_type)
                    ),
                ));
            };
            let at = |what: &str| {
                format!(
                    "section `{sname}`, offset {off:#x}: {} against symbol `{}`: {what}",
                    reloc_name(r_type),
                    sym_name(file, si)
                )
            };
            if off % INSN != 0 {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    at("not at an instruction boundary"),
                ));
            }
            if off + INSN > u.end {
                // A function whose size is not a multiple of 8 ends in a partial slot.
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    at("the instruction runs past the end of its function"),
                ));
            }
            let slot = u.base + (off - u.start) / INSN;
            let p = slot * INSN;
            let opcode = self.code[p];
            let sym = file
                .symbol_by_index(si)
                .map_err(|e| bad(ErrorKind::InvalidArgument, at(&e.to_string())))?;
            relocated[(off - u.start) / INSN] = true;
            match r_type {
                R_BPF_64_32 => {
                    if opcode != OP_CALL {
                        return Err(bad(
                            ErrorKind::InvalidArgument,
                            at(&format!("instruction {opcode:#04x} is not a call")),
                        ));
                    }
                    let imm = i32::from_le_bytes(self.code[p + 4..p + 8].try_into().unwrap());
                    match sym.section() {
                        SymbolSection::Undefined => {
                            let name = sym_name(file, si);
                            let id = resolve(&name).ok_or_else(|| {
                                bad(
                                    ErrorKind::UnknownHelper,
                                    at(&format!("unresolved extern function `{name}`: no helper registered under that name")),
                                )
                            })?;
                            // Helper call: src = 0, imm = id.
                            self.code[p + 1] &= 0x0f;
                            self.code[p + 4..p + 8].copy_from_slice(&id.to_le_bytes());
                            if !self.externs.iter().any(|(n, _)| *n == name) {
                                self.externs.push((name, id));
                            }
                        }
                        SymbolSection::Section(ts) => {
                            if !is_code(file, ts) {
                                return Err(bad(
                                    ErrorKind::InvalidArgument,
                                    at(&format!(
                                        "call into section `{}`, which is not code",
                                        sec_name(file, ts)
                                    )),
                                ));
                            }
                            // libbpf's rule: target slot = st_value / 8 + imm + 1.
                            let target = (sym.address() as i64 / INSN as i64)
                                .checked_add(i64::from(imm) + 1)
                                .filter(|&t| t >= 0)
                                .ok_or_else(|| {
                                    bad(
                                        ErrorKind::InvalidArgument,
                                        at("call target before the section"),
                                    )
                                })?;
                            let tslot = self
                                .slot_of(ts, target as usize * INSN)
                                .map_err(|e| bad(ErrorKind::InvalidArgument, at(&e.message)))?;
                            self.set_call(p, slot, tslot, &at)?;
                        }
                        _ => {
                            return Err(bad(
                                ErrorKind::Unsupported,
                                at("symbol is neither defined nor extern"),
                            ));
                        }
                    }
                }
                R_BPF_64_64 => {
                    if opcode != OP_LDDW || p + 2 * INSN > self.code.len() {
                        return Err(bad(
                            ErrorKind::InvalidArgument,
                            at(&format!("instruction {opcode:#04x} is not an lddw")),
                        ));
                    }
                    let addend = i64::from(i32::from_le_bytes(
                        self.code[p + 4..p + 8].try_into().unwrap(),
                    ));
                    if let SymbolSection::Section(ts) = sym.section() {
                        if is_maps(&sec_name(file, ts)) {
                            let idx = self.map_ref(ts, sym.address(), addend, &at)?;
                            // The kernel loader's form: src = BPF_PSEUDO_MAP_FD, imm = map
                            // index (libbpf: the map's fd), second immediate 0.
                            self.code[p + 1] = (self.code[p + 1] & 0x0f) | (BPF_PSEUDO_MAP_FD << 4);
                            self.code[p + 4..p + 8].copy_from_slice(&(idx as u32).to_le_bytes());
                            self.code[p + 12..p + 16].copy_from_slice(&0u32.to_le_bytes());
                            self.maps_used.push(idx);
                            continue;
                        }
                        if is_code(file, ts) {
                            // A function's address (a callback for bpf_loop and friends):
                            // the function is linked like a callee, and the lddw takes the
                            // kernel loader's form, src = BPF_PSEUDO_FUNC with imm = the
                            // function's slot relative to the next one.
                            let byte = (sym.address() as i64).checked_add(addend);
                            let byte = byte
                                .filter(|&b| b >= 0 && b % INSN as i64 == 0)
                                .ok_or_else(|| {
                                    bad(
                                        ErrorKind::InvalidArgument,
                                        at("function address not on an instruction"),
                                    )
                                })?;
                            let tslot = self
                                .slot_of(ts, byte as usize)
                                .map_err(|e| bad(ErrorKind::InvalidArgument, at(&e.message)))?;
                            let rel =
                                i32::try_from(tslot as i64 - slot as i64 - 1).map_err(|_| {
                                    bad(
                                        ErrorKind::InvalidArgument,
                                        at("function distance out of range"),
                                    )
                                })?;
                            self.code[p + 1] = (self.code[p + 1] & 0x0f) | (BPF_PSEUDO_FUNC << 4);
                            self.code[p + 4..p + 8].copy_from_slice(&rel.to_le_bytes());
                            self.code[p + 12..p + 16].copy_from_slice(&0u32.to_le_bytes());
                            continue;
                        }
                    }
                    let addr = self.symbol_addr(&sym, &at)?;
                    let v = addr.wrapping_add(addend as u64);
                    self.code[p + 4..p + 8].copy_from_slice(&(v as u32).to_le_bytes());
                    self.code[p + 12..p + 16].copy_from_slice(&((v >> 32) as u32).to_le_bytes());
                    // src = 0: a plain 64-bit immediate once patched (clang leaves 0, libbpf
                    // would set a pseudo source; we resolve it here instead).
                    self.code[p + 1] &= 0x0f;
                }
                R_BPF_NONE => {}
                _ => {
                    return Err(bad(
                        ErrorKind::Unsupported,
                        at("relocation type not supported in code"),
                    ));
                }
            }
        }
        self.relocs.insert(u.sec.0, relocs);
        // Calls with src = 1 and no relocation were resolved by the assembler: pc-relative
        // inside their own section. Follow them too (the callee may be another function).
        for (k, _) in relocated.iter().enumerate().filter(|(_, &r)| !r) {
            let slot = u.base + k;
            let p = slot * INSN;
            if self.code[p] != OP_CALL || self.code[p + 1] >> 4 != 1 {
                continue;
            }
            let imm = i64::from(i32::from_le_bytes(
                self.code[p + 4..p + 8].try_into().unwrap(),
            ));
            let off = (u.start / INSN + k) as i64 + imm + 1;
            let at = |what: &str| {
                format!(
                    "section `{sname}`, offset {:#x}: call: {what}",
                    u.start + k * INSN
                )
            };
            if off < 0 {
                return Err(bad(
                    ErrorKind::InvalidArgument,
                    at("target before the section"),
                ));
            }
            let tslot = self
                .slot_of(u.sec, off as usize * INSN)
                .map_err(|e| bad(ErrorKind::InvalidArgument, at(&e.message)))?;
            self.set_call(p, slot, tslot, &at)?;
        }
        Ok(())
    }

    fn set_call(
        &mut self,
        p: usize,
        slot: usize,
        tslot: usize,
        at: &dyn Fn(&str) -> String,
    ) -> Result<(), Error> {
        let rel = i32::try_from(tslot as i64 - slot as i64 - 1)
            .map_err(|_| bad(ErrorKind::InvalidArgument, at("call distance out of range")))?;
        self.code[p + 1] = (self.code[p + 1] & 0x0f) | 0x10;
        self.code[p + 4..p + 8].copy_from_slice(&rel.to_le_bytes());
        Ok(())
    }

    /// Address of a data symbol (before the implicit addend).
    fn symbol_addr(
        &self,
        sym: &object::read::elf::ElfSymbol64<'_, '_, Endianness>,
        at: &dyn Fn(&str) -> String,
    ) -> Result<u64, Error> {
        match sym.section() {
            SymbolSection::Section(ts) => {
                let tname = sec_name(self.file, ts);
                if is_maps(&tname) {
                    // Code's references are rewritten before this; what reaches here is a
                    // pointer stored in data.
                    return Err(bad(
                        ErrorKind::Unsupported,
                        at(&format!("a pointer to a map (section `{tname}`) in data is not supported: only code references maps (lddw)")),
                    ));
                }
                if is_code(self.file, ts) {
                    return Err(bad(
                        ErrorKind::Unsupported,
                        at(&format!("address of code in section `{tname}` (function pointers / callbacks) is not supported")),
                    ));
                }
                let di = self.data_index.get(&ts.0).ok_or_else(|| {
                    bad(
                        ErrorKind::Unsupported,
                        at(&format!(
                            "section `{tname}` is not .rodata*, .data* or .bss*"
                        )),
                    )
                })?;
                Ok(self.data.sections[*di].addr().wrapping_add(sym.address()))
            }
            SymbolSection::Undefined => Err(bad(
                ErrorKind::UnknownHelper,
                at("unresolved extern variable (only extern functions resolve, to helpers)"),
            )),
            _ => Err(bad(
                ErrorKind::Unsupported,
                at("symbol is neither in a section nor extern"),
            )),
        }
    }

    /// Index of the map an `lddw` in code refers to: symbol value + addend must be a map's
    /// first byte.
    fn map_ref(
        &mut self,
        sec: SectionIndex,
        sym_value: u64,
        addend: i64,
        at: &dyn Fn(&str) -> String,
    ) -> Result<usize, Error> {
        let file = self.file;
        let maps = self
            .maps
            .get_or_insert_with(|| parse_maps(file))
            .as_ref()
            .map_err(|e| {
                let m = e.message.strip_prefix("ELF: ").unwrap_or(&e.message);
                bad(e.kind, at(m))
            })?;
        let tname = sec_name(file, sec);
        let off = (sym_value as i64).checked_add(addend).filter(|&o| o >= 0);
        let Some(off) = off.map(|o| o as u64) else {
            return Err(bad(
                ErrorKind::InvalidArgument,
                at(&format!(
                    "offset {sym_value:#x}{addend:+#x} is before section `{tname}`"
                )),
            ));
        };
        if let Some(i) = maps.iter().position(|m| m.sec == sec && m.start == off) {
            return Ok(i);
        }
        let inside = maps
            .iter()
            .find(|m| m.sec == sec && off > m.start && off - m.start < m.size.max(1));
        Err(bad(
            ErrorKind::InvalidArgument,
            at(&match inside {
                Some(m) => format!(
                    "offset {off:#x} of section `{tname}` is {:#x} bytes into map `{}`: a map reference must point at a map's start",
                    off - m.start,
                    m.def.name
                ),
                None => format!("no map starts at offset {off:#x} of section `{tname}`"),
            }),
        ))
    }

    /// CO-RE relocations (`.BTF.ext` core_relo records) of every placed unit, resolved
    /// against `target` (raw `.BTF`; `None`: the object's own). Records are per ELF section
    /// with section-relative instruction offsets, mapped to the linked slots as calls are.
    /// Those nothing in the target satisfies poison their instruction (see `core_relo`) and
    /// are listed with why, in slot order.
    fn relocate_core(&mut self, target: Option<&[u8]>) -> Result<CoreOutcome, Error> {
        let file = self.file;
        let inval = |m: String| bad(ErrorKind::InvalidArgument, m);
        let Some(ext) = file.section_by_name(".BTF.ext") else {
            return Ok(CoreOutcome::default());
        };
        let data = ext
            .data()
            .map_err(|e| inval(format!("section `.BTF.ext`: {e}")))?;
        let secs = core_relo::parse_btf_ext(data)
            .map_err(|e| inval(format!("section `.BTF.ext`: {e}")))?;
        if secs.is_empty() {
            return Ok(CoreOutcome::default());
        }
        let local = load_btf(file, "CO-RE relocations in `.BTF.ext`")?;
        let target = target
            .map(|b| Btf::parse(b, "target BTF"))
            .transpose()
            .map_err(|e| bad(e.kind, e.message))?;
        // Units by section name: records name their section.
        let mut units: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
        for u in &self.units {
            units.entry(sec_name(file, u.sec)).or_default().push(*u);
        }
        let mut out = CoreOutcome::default();
        for (si, s) in secs.iter().enumerate() {
            let name = local
                .str_at(
                    s.name_off,
                    &format!("`.BTF.ext` core_relo info #{si} field `sec_name_off`"),
                )
                .map_err(|e| bad(e.kind, e.message))?;
            for r in &s.relos {
                core_relo::check_record(r).map_err(|(field, why)| {
                    inval(format!(
                        "section `.BTF.ext`: CO-RE relocations of section `{name}`, record {} field `{field}`: {why}",
                        r.index
                    ))
                })?;
            }
            let Some(us) = units.get(&name) else { continue };
            let mut relos = s.relos.clone();
            relos.sort_by_key(|r| r.insn_off);
            for u in us {
                // The unit's bytes in the output (`place` pads only a partial last slot).
                let lo = u.base * INSN;
                let hi = (lo + (u.end - u.start)).min(self.code.len());
                let first = relos.partition_point(|r| (r.insn_off as usize) < u.start);
                let last = relos.partition_point(|r| (r.insn_off as usize) < u.end);
                for r in &relos[first..last] {
                    let off = r.insn_off as usize;
                    let p = lo + (off - u.start);
                    let at = |e: String| {
                        format!(
                            "section `{name}` insn {} (CO-RE record {}): {e}",
                            off / INSN,
                            r.index
                        )
                    };
                    match core_relo::apply(&local, target.as_ref(), r, &mut self.code[p..hi])
                        .map_err(|e| inval(at(e)))?
                    {
                        core_relo::Applied::Patched { local, target } => {
                            out.applied.push((p / INSN, local, target))
                        }
                        core_relo::Applied::Poisoned(why) => {
                            out.poisoned.push(PoisonedRelocation {
                                slot: p / INSN,
                                why: at(why),
                            })
                        }
                    }
                }
            }
        }
        out.applied.sort_unstable();
        out.poisoned.sort_by_key(|p| p.slot);
        Ok(out)
    }

    /// Pointers stored in data (`const char *names[] = {...}` in `.rodata`).
    fn relocate_data(&mut self) -> Result<(), Error> {
        let file = self.file;
        let targets: Vec<(SectionIndex, usize)> = self
            .data_index
            .iter()
            .map(|(&k, &v)| (SectionIndex(k), v))
            .collect();
        for (si, di) in targets {
            let sec = file
                .section_by_index(si)
                .map_err(|e| bad(ErrorKind::InvalidArgument, e))?;
            let sname = sec_name(file, si);
            for (off, rel) in sec.relocations() {
                let RelocationFlags::Elf { r_type } = rel.flags() else {
                    continue;
                };
                let RelocationTarget::Symbol(tsi) = rel.target() else {
                    continue;
                };
                let off = off as usize;
                let at = |what: &str| {
                    format!(
                        "section `{sname}`, offset {off:#x}: {} against symbol `{}`: {what}",
                        reloc_name(r_type),
                        sym_name(file, tsi)
                    )
                };
                let width = match r_type {
                    R_BPF_64_ABS64 => 8,
                    R_BPF_64_ABS32 => 4,
                    R_BPF_NONE => continue,
                    _ => {
                        return Err(bad(
                            ErrorKind::Unsupported,
                            at("relocation type not supported in data"),
                        ))
                    }
                };
                let d = &self.data.sections[di];
                if off.checked_add(width).is_none_or(|e| e > d.len) {
                    return Err(bad(ErrorKind::InvalidArgument, at("outside the section")));
                }
                let sym = file
                    .symbol_by_index(tsi)
                    .map_err(|e| bad(ErrorKind::InvalidArgument, at(&e.to_string())))?;
                let addr = self.symbol_addr(&sym, &at)?;
                let d = &self.data.sections[di];
                let mut cur = [0u8; 8];
                d.read_at(off, &mut cur[..width]);
                let v = addr.wrapping_add(u64::from_le_bytes(cur));
                if width == 4 && v > u64::from(u32::MAX) {
                    return Err(bad(
                        ErrorKind::Unsupported,
                        at(&format!("address {v:#x} does not fit 32 bits")),
                    ));
                }
                d.write_at(off, &v.to_le_bytes()[..width]);
            }
        }
        Ok(())
    }
}

/// `BPF_MAP_TYPE_PROG_ARRAY`, the only map type whose `values` the loader initialises.
const BPF_MAP_TYPE_PROG_ARRAY: u32 = 3;
/// `struct bpf_map_def` of legacy `maps` sections: five u32s.
const LEGACY_MAP_DEF: usize = 20;

/// A map defined by an eBPF object, as [`elf_maps`] reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElfMapDef {
    /// The map's symbol name.
    pub name: String,
    /// `BPF_MAP_TYPE_*` as written (not validated here).
    pub map_type: u32,
    /// Key size in bytes (0 without a key, e.g. QUEUE, RINGBUF).
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// `max_entries`.
    pub max_entries: u32,
    /// `map_flags`.
    pub flags: u32,
    /// PROG_ARRAY static initialisation: (slot index, program name: the function symbol's
    /// name, or the section name when the symbol is a section).
    pub initial_programs: Vec<(u32, String)>,
}

/// A map and where it lives in the object.
#[derive(Clone, Debug)]
struct MapEntry {
    def: ElfMapDef,
    sec: SectionIndex,
    start: u64,
    size: u64,
    /// Byte offset of a BTF map's `values` member.
    values: Option<u64>,
}

/// Every map the object defines, in symbol order: BTF-defined maps in `.maps` and legacy
/// `struct bpf_map_def`s in `maps` / `maps/*`. The index of a map in this list is the `imm`
/// of the `lddw`s [`link`] rewrites to reference it.
pub fn elf_maps(obj: &[u8]) -> Result<Vec<ElfMapDef>, Error> {
    let file = parse(obj)?;
    Ok(parse_maps(&file)?.into_iter().map(|m| m.def).collect())
}

fn parse_maps(file: &File<'_>) -> Result<Vec<MapEntry>, Error> {
    let map_secs: Vec<SectionIndex> = file
        .sections()
        .filter(|s| s.name().is_ok_and(is_maps))
        .map(|s| s.index())
        .collect();
    if map_secs.is_empty() {
        return Ok(Vec::new());
    }
    let mut btf: Option<Btf> = None;
    let mut out = Vec::new();
    for sym in file.symbols() {
        let SymbolSection::Section(si) = sym.section() else {
            continue;
        };
        if !map_secs.contains(&si) || sym.kind() == object::SymbolKind::Section {
            continue;
        }
        let name = match sym.name() {
            Ok(n) if !n.is_empty() => n.to_string(),
            _ => continue,
        };
        let sname = sec_name(file, si);
        let sec = file
            .section_by_index(si)
            .map_err(|e| bad(ErrorKind::InvalidArgument, e))?;
        let (start, size) = (sym.address(), sym.size());
        if start.checked_add(size).is_none_or(|e| e > sec.size()) {
            return Err(bad(
                ErrorKind::InvalidArgument,
                format!(
                    "map `{name}`: [{start:#x}, +{size:#x}) is outside section `{sname}` ({:#x} bytes)",
                    sec.size()
                ),
            ));
        }
        let entry = if sname == ".maps" {
            if btf.is_none() {
                btf = Some(load_btf(file, "section `.maps` (BTF-defined maps)")?);
            }
            let btf = btf.as_ref().unwrap();
            let (def, values) = btf_map(btf, &name)?;
            MapEntry {
                def,
                sec: si,
                start,
                size,
                values,
            }
        } else {
            let def = legacy_map(&sec, &sname, &name, start, size)?;
            MapEntry {
                def,
                sec: si,
                start,
                size,
                values: None,
            }
        };
        out.push(entry);
    }
    for &si in &map_secs {
        map_relocations(file, si, &mut out)?;
    }
    Ok(out)
}

fn load_btf(file: &File<'_>, user: &str) -> Result<Btf, Error> {
    let s = file.section_by_name(".BTF").ok_or_else(|| {
        bad(
            ErrorKind::InvalidArgument,
            format!("{user} without a `.BTF` section (compile with -g)"),
        )
    })?;
    let data = s
        .data()
        .map_err(|e| bad(ErrorKind::InvalidArgument, format!("section `.BTF`: {e}")))?;
    Btf::parse(data, ".BTF").map_err(|e| bad(e.kind, e.message))
}

/// A BTF-defined map: the `VAR` named `name` in the `.maps` DATASEC, a struct whose members
/// encode the attributes. Returns the definition and the byte offset of `values`.
fn btf_map(btf: &Btf, name: &str) -> Result<(ElfMapDef, Option<u64>), Error> {
    let ctx = |msg: String| format!("map `{name}` (section `.maps`): {msg}");
    let invalid = |msg: String| bad(ErrorKind::InvalidArgument, ctx(msg));
    let unsupported = |msg: String| bad(ErrorKind::Unsupported, ctx(msg));
    let wrap = |e: Error| bad(e.kind, ctx(e.message));
    let var_type = btf
        .types()
        .iter()
        .find_map(|t| match t {
            BtfType::Datasec { name: n, vars, .. } if n == ".maps" => Some(vars),
            _ => None,
        })
        .ok_or_else(|| invalid("`.BTF` has no DATASEC `.maps`".into()))?
        .iter()
        .find_map(|v| match btf.get(v.type_id) {
            Ok(BtfType::Var {
                name: n, type_id, ..
            }) if n == name => Some(*type_id),
            _ => None,
        })
        .ok_or_else(|| invalid("no VAR of that name in the `.maps` DATASEC".into()))?;
    let members = btf.members(var_type).map_err(wrap)?;
    let mut def = ElfMapDef {
        name: name.into(),
        ..ElfMapDef::default()
    };
    let (mut key_size, mut value_size) = (None::<u32>, None::<u32>);
    let mut key_type_size = None::<u32>;
    let mut value_type_size = None::<u32>;
    let mut values = None;
    let kind_of = |id: u32| -> Result<&BtfType, Error> {
        btf.get(btf.resolve(id).map_err(wrap)?).map_err(wrap)
    };
    for m in members {
        let mname = m.name.as_str();
        // `int (*name)[N]`: the value is N.
        let uint = || -> Result<u32, Error> {
            let BtfType::Ptr { type_id } = kind_of(m.type_id)? else {
                return Err(unsupported(format!(
                    "member `{mname}` is {}, not libbpf's `__uint` encoding `int (*{mname})[N]`",
                    kind_of(m.type_id)?.kind_name()
                )));
            };
            match kind_of(*type_id)? {
                BtfType::Array { nelems, .. } => Ok(*nelems),
                other => Err(unsupported(format!(
                    "member `{mname}` points to {}, not to an array (`int (*{mname})[N]`)",
                    other.kind_name()
                ))),
            }
        };
        // `T *name`: the size of T.
        let pointee_size = || -> Result<u32, Error> {
            let BtfType::Ptr { type_id } = kind_of(m.type_id)? else {
                return Err(unsupported(format!(
                    "member `{mname}` is {}, not libbpf's `__type` encoding `T *{mname}`",
                    kind_of(m.type_id)?.kind_name()
                )));
            };
            let sz = btf.size_of(*type_id).map_err(wrap)?;
            u32::try_from(sz)
                .map_err(|_| invalid(format!("member `{mname}`: type size {sz} exceeds u32")))
        };
        match mname {
            "type" => def.map_type = uint()?,
            "max_entries" => def.max_entries = uint()?,
            "map_flags" => def.flags = uint()?,
            "key_size" => key_size = Some(uint()?),
            "value_size" => value_size = Some(uint()?),
            "key" => key_type_size = Some(pointee_size()?),
            "value" => value_type_size = Some(pointee_size()?),
            "pinning" => {
                let v = uint()?;
                if v != 0 {
                    return Err(unsupported(format!(
                        "member `pinning` = {v}: only LIBBPF_PIN_NONE (0) is supported (packjit has no bpffs to pin to)"
                    )));
                }
            }
            "values" => {
                let BtfType::Array { elem, .. } = kind_of(m.type_id)? else {
                    return Err(unsupported(format!(
                        "member `values` is {}, not libbpf's `__array(values, ...)` (an array of pointers)",
                        kind_of(m.type_id)?.kind_name()
                    )));
                };
                let BtfType::Ptr { type_id } = kind_of(*elem)? else {
                    return Err(unsupported(format!(
                        "member `values`: elements are {}, not pointers",
                        kind_of(*elem)?.kind_name()
                    )));
                };
                match kind_of(*type_id)? {
                    BtfType::FuncProto { .. } => {}
                    BtfType::Struct { .. } => {
                        return Err(unsupported(
                            "member `values` holds map definitions (map-in-map), which are not supported".into(),
                        ))
                    }
                    other => {
                        return Err(unsupported(format!(
                            "member `values`: elements point to {}, not to a function (PROG_ARRAY) ",
                            other.kind_name()
                        )))
                    }
                }
                if m.bit_offset % 8 != 0 || m.bitfield_size != 0 {
                    return Err(invalid(format!(
                        "member `values` at bit offset {} is not byte aligned",
                        m.bit_offset
                    )));
                }
                values = Some(u64::from(m.bit_offset / 8));
            }
            other => {
                return Err(unsupported(format!(
                    "unknown attribute member `{other}` (known: type, max_entries, map_flags, key_size, value_size, key, value, pinning, values)"
                )))
            }
        }
    }
    for (what, explicit, typed) in [
        ("key", key_size, key_type_size),
        ("value", value_size, value_type_size),
    ] {
        if let (Some(a), Some(b)) = (explicit, typed) {
            if a != b {
                return Err(invalid(format!(
                    "`{what}_size` = {a} but `{what}` has a type of {b} bytes"
                )));
            }
        }
    }
    def.key_size = key_size.or(key_type_size).unwrap_or(0);
    def.value_size = value_size.or(value_type_size).unwrap_or(0);
    Ok((def, values))
}

/// A legacy `struct bpf_map_def { u32 type, key_size, value_size, max_entries, map_flags }`
/// of `st_size` bytes (at least 20; bytes past the five fields must be zero).
fn legacy_map(
    sec: &object::read::elf::ElfSection64<'_, '_, Endianness>,
    sname: &str,
    name: &str,
    start: u64,
    size: u64,
) -> Result<ElfMapDef, Error> {
    let ctx = |msg: String| {
        bad(
            ErrorKind::InvalidArgument,
            format!("legacy map `{name}` (section `{sname}`, offset {start:#x}): {msg}"),
        )
    };
    if size < LEGACY_MAP_DEF as u64 {
        return Err(ctx(format!(
            "{size} bytes, a struct bpf_map_def (type, key_size, value_size, max_entries, map_flags) is at least {LEGACY_MAP_DEF}"
        )));
    }
    let data = sec
        .data()
        .ok()
        .and_then(|d| d.get(start as usize..(start + size) as usize))
        .ok_or_else(|| ctx("no contents (SHT_NOBITS or truncated)".into()))?;
    if let Some(i) = data[LEGACY_MAP_DEF..].iter().position(|&b| b != 0) {
        return Err(ctx(format!(
            "byte {} is not zero: fields past map_flags (inner_map_idx, numa_node, ...) are not supported",
            LEGACY_MAP_DEF + i
        )));
    }
    let f = |i: usize| u32::from_le_bytes(data[4 * i..4 * i + 4].try_into().unwrap());
    Ok(ElfMapDef {
        name: name.into(),
        map_type: f(0),
        key_size: f(1),
        value_size: f(2),
        max_entries: f(3),
        flags: f(4),
        initial_programs: Vec::new(),
    })
}

/// Relocations in a map section: only a PROG_ARRAY's `values` (`R_BPF_64_ABS64` against a
/// function or code section, one per 8-byte slot) are accepted.
fn map_relocations(file: &File<'_>, si: SectionIndex, maps: &mut [MapEntry]) -> Result<(), Error> {
    let sec = file
        .section_by_index(si)
        .map_err(|e| bad(ErrorKind::InvalidArgument, e))?;
    let sname = sec_name(file, si);
    let data = sec.data().unwrap_or(&[]);
    for (off, rel) in sec.relocations() {
        let RelocationFlags::Elf { r_type } = rel.flags() else {
            continue;
        };
        if r_type == R_BPF_NONE {
            continue;
        }
        let target = match rel.target() {
            RelocationTarget::Symbol(t) => sym_name(file, t),
            _ => "?".into(),
        };
        let Some(m) = maps
            .iter_mut()
            .find(|m| m.sec == si && off >= m.start && off < m.start + m.size)
        else {
            return Err(bad(
                ErrorKind::Unsupported,
                format!(
                    "section `{sname}`, offset {off:#x}: {} against `{target}` outside every map",
                    reloc_name(r_type)
                ),
            ));
        };
        let rel_off = off - m.start;
        let name = m.def.name.clone();
        let refuse = |what: &str| {
            bad(
                ErrorKind::Unsupported,
                format!(
                    "map `{name}` (section `{sname}`), offset {rel_off:#x}: {} against `{target}`: {what}",
                    reloc_name(r_type)
                ),
            )
        };
        let Some(vo) = m.values.filter(|&vo| rel_off >= vo) else {
            return Err(refuse(
                "only a PROG_ARRAY's `values` may be relocated in a map definition",
            ));
        };
        if r_type != R_BPF_64_ABS64 || (rel_off - vo) % 8 != 0 {
            return Err(refuse("not an 8-byte R_BPF_64_ABS64 slot of `values`"));
        }
        if m.def.map_type != BPF_MAP_TYPE_PROG_ARRAY {
            return Err(refuse(&format!(
                "`values` initialises programs, but the map type is {}, not PROG_ARRAY ({BPF_MAP_TYPE_PROG_ARRAY})",
                m.def.map_type
            )));
        }
        let RelocationTarget::Symbol(tsi) = rel.target() else {
            return Err(refuse("no symbol"));
        };
        let sym = file
            .symbol_by_index(tsi)
            .map_err(|e| refuse(&e.to_string()))?;
        let SymbolSection::Section(ts) = sym.section() else {
            return Err(refuse("the program is not defined in this object"));
        };
        if !is_code(file, ts) {
            return Err(refuse(&format!(
                "section `{}` is not code",
                sec_name(file, ts)
            )));
        }
        // The implicit addend (REL): the 8 bytes at the slot; a program is a function's or a
        // section's start.
        let addend = data
            .get(off as usize..off as usize + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        if addend != 0 {
            return Err(refuse(&format!(
                "addend {addend:#x}: a program slot must name a function or section start"
            )));
        }
        let prog = match sym.kind() {
            object::SymbolKind::Section => sec_name(file, ts),
            _ => sym_name(file, tsi),
        };
        let slot = u32::try_from((rel_off - vo) / 8).map_err(|_| refuse("slot out of range"))?;
        m.def.initial_programs.push((slot, prog));
    }
    for m in maps.iter_mut() {
        m.def.initial_programs.sort();
    }
    Ok(())
}

impl crate::Runtime {
    /// Loads one program from a relocatable eBPF object (`clang -O2 -target bpf -c`): links
    /// it (see [`crate::elf`]), resolves extern functions to the helpers registered under
    /// their names, and compiles it sandboxed with its `.rodata*` as read-only and `.data*` /
    /// `.bss*` as read-write regions (added to `opts.regions`). The program owns its global
    /// data ([`Program::globals`]).
    pub fn load_elf(
        &self,
        bytes: &[u8],
        elf_opts: &ElfLoadOptions,
        opts: &crate::LoadOptions,
    ) -> Result<Program, Error> {
        self.load_elf_as(bytes, elf_opts, opts, crate::Trust::Sandboxed)
    }

    /// [`Runtime::load_elf`](crate::Runtime::load_elf) compiled trusted (unchecked).
    ///
    /// # Safety
    /// As for [`Runtime::load_trusted`](crate::Runtime::load_trusted): every address the
    /// program computes must be memory it may use (its globals, context and stack).
    pub unsafe fn load_elf_trusted(
        &self,
        bytes: &[u8],
        elf_opts: &ElfLoadOptions,
        opts: &crate::LoadOptions,
    ) -> Result<Program, Error> {
        self.load_elf_as(bytes, elf_opts, opts, crate::Trust::Trusted)
    }

    fn load_elf_as(
        &self,
        bytes: &[u8],
        elf_opts: &ElfLoadOptions,
        opts: &crate::LoadOptions,
        trust: crate::Trust,
    ) -> Result<Program, Error> {
        let helpers = self.helpers();
        let linked = link(bytes, elf_opts, &|name| {
            helpers.iter().find(|h| h.name == name).map(|h| h.id)
        })?;
        let mut o = opts.clone();
        if !linked.maps_used.is_empty() && o.maps.is_empty() {
            // A program of its own: the object's maps, made for this load alone (programs
            // that share maps load through an `ElfObject`).
            o.maps = create_maps(&elf_maps(bytes)?)?;
        }
        o.regions.extend(linked.data.regions());
        // Named after its entry (function or section) for the perf map, gdb and symbols,
        // unless the host named it.
        if o.name.is_none() {
            o.name = linked.functions.first().map(|(name, _)| name.clone());
        }
        let mut prog = self
            .compile(&linked.code, &o, &self.helper_table(), trust)
            .map_err(|mut e| {
                // A reachable poisoned relocation: say which one and why it is poisoned.
                let poisoned = (e.message == crate::poison::REACHABLE)
                    .then(|| linked.core_poisoned.iter().find(|p| Some(p.slot) == e.pc))
                    .flatten();
                if let Some(p) = poisoned {
                    e.message = format!("{}; {}", e.message, p.why);
                }
                e.message = format!("{} (program linked from {:?})", e.message, elf_opts.program);
                e
            })?;
        if let Some(a) = prog.packed_arena() {
            a.commit();
        }
        prog.elf = Some(Box::new(linked));
        Ok(prog)
    }
}

impl Program {
    /// The program's global data, for programs loaded from ELF.
    pub fn globals(&self) -> Option<&GlobalData> {
        self.elf.as_deref().map(|l| &l.data)
    }

    /// What the ELF loader linked (bytecode as compiled, functions, externs, data), for
    /// programs loaded from ELF.
    pub fn elf_linked(&self) -> Option<&Linked> {
        self.elf.as_deref()
    }
}

/// The maps `defs` describe, created (see [`crate::maps`]); a type packjit does not have, or
/// a definition the kernel would refuse, is an error naming the map.
pub fn create_maps(defs: &[ElfMapDef]) -> Result<Vec<std::sync::Arc<crate::maps::Map>>, Error> {
    use crate::maps::{Map, MapSpec, MapType};
    defs.iter()
        .map(|d| {
            let map_type = MapType::from_raw(d.map_type).ok_or_else(|| {
                bad(
                    ErrorKind::Unsupported,
                    format!("map `{}`: map type {} is not supported", d.name, d.map_type),
                )
            })?;
            // libbpf's convention: a prog array declared with `__array(values, ...)` has no
            // value type; its values are 4-byte program fds.
            let value_size = match (map_type, d.value_size) {
                (MapType::ProgArray, 0) => 4,
                (_, v) => v,
            };
            Map::new(MapSpec {
                name: d.name.clone(),
                map_type,
                key_size: d.key_size,
                value_size,
                max_entries: d.max_entries,
                flags: d.flags,
            })
            .map_err(|e| bad(ErrorKind::InvalidArgument, e))
        })
        .collect()
}

/// A clang object opened with its maps: the programs loaded from it share them (as the
/// programs of one libbpf object do), and the host reads and writes them by name.
pub struct ElfObject {
    bytes: Vec<u8>,
    defs: Vec<ElfMapDef>,
    maps: Vec<std::sync::Arc<crate::maps::Map>>,
}

impl ElfObject {
    /// Opens `bytes`: parses its maps and creates them, except those `host_maps` gives by
    /// name (a host map must have the object's type and sizes).
    pub fn open(
        bytes: &[u8],
        host_maps: &[(&str, std::sync::Arc<crate::maps::Map>)],
    ) -> Result<ElfObject, Error> {
        let defs = elf_maps(bytes)?;
        let mut maps = Vec::with_capacity(defs.len());
        for d in &defs {
            match host_maps.iter().find(|(name, _)| *name == d.name) {
                Some((_, m)) => {
                    let s = m.spec();
                    let same = s.map_type as u32 == d.map_type
                        && s.key_size == d.key_size
                        && s.value_size == d.value_size;
                    if !same {
                        return Err(bad(
                            ErrorKind::InvalidArgument,
                            format!(
                                "map `{}`: the host's map is {} key {} value {}, the object's type {} key {} value {}",
                                d.name, s.map_type.name(), s.key_size, s.value_size, d.map_type, d.key_size, d.value_size
                            ),
                        ));
                    }
                    maps.push(m.clone());
                }
                None => maps.extend(create_maps(std::slice::from_ref(d))?),
            }
        }
        Ok(ElfObject {
            bytes: bytes.to_vec(),
            defs,
            maps,
        })
    }

    /// The object's maps with their names, in the object's order.
    pub fn maps(&self) -> impl Iterator<Item = (&str, &std::sync::Arc<crate::maps::Map>)> {
        self.defs.iter().map(|d| d.name.as_str()).zip(&self.maps)
    }

    /// The map named `name`.
    pub fn map(&self, name: &str) -> Option<&std::sync::Arc<crate::maps::Map>> {
        self.maps().find(|(n, _)| *n == name).map(|(_, m)| m)
    }

    /// Loads one program, sandboxed, with the object's maps.
    pub fn load(
        &self,
        rt: &crate::Runtime,
        elf_opts: &ElfLoadOptions,
        opts: &crate::LoadOptions,
    ) -> Result<Program, Error> {
        rt.load_elf(&self.bytes, elf_opts, &self.with_maps(opts))
    }

    /// `opts` with the object's maps.
    fn with_maps(&self, opts: &crate::LoadOptions) -> crate::LoadOptions {
        crate::LoadOptions {
            maps: self.maps.clone(),
            ..opts.clone()
        }
    }

    /// [`ElfObject::load`], trusted.
    ///
    /// # Safety
    /// As [`crate::Runtime::load_trusted`].
    pub unsafe fn load_trusted(
        &self,
        rt: &crate::Runtime,
        elf_opts: &ElfLoadOptions,
        opts: &crate::LoadOptions,
    ) -> Result<Program, Error> {
        // SAFETY: forwarded from the caller.
        unsafe { rt.load_elf_trusted(&self.bytes, elf_opts, &self.with_maps(opts)) }
    }

    /// Fills the prog arrays the object initialises statically (`.values = { [i] = &prog }`)
    /// with `programs` (by function or section name), as libbpf does after loading. A slot
    /// naming a program not in `programs` is an error naming map, slot and program, and
    /// then no slot is filled.
    pub fn init_prog_arrays(
        &self,
        rt: &crate::Runtime,
        programs: &[(&str, std::sync::Arc<Program>)],
    ) -> Result<(), Error> {
        let mut fills = Vec::new();
        for (d, m) in self.defs.iter().zip(&self.maps) {
            for (slot, name) in &d.initial_programs {
                let p = programs.iter().find(|(n, _)| n == name).ok_or_else(|| {
                    bad(
                        ErrorKind::InvalidArgument,
                        format!(
                            "prog array `{}` slot {slot} names program `{name}`, which was not loaded",
                            d.name
                        ),
                    )
                })?;
                fills.push((m, *slot, p.1.clone()));
            }
        }
        for (m, slot, p) in fills {
            rt.set_prog_array(m, slot, Some(p))?;
        }
        Ok(())
    }
}
