//! Registration of JIT code with gdb ("JIT Compilation Interface" in the gdb manual).
//!
//! gdb looks for two symbols in every object it loads: the descriptor
//! `__jit_debug_descriptor` and the function `__jit_debug_register_code`, on which it sets
//! an internal breakpoint. Each time that function is called, gdb reads the descriptor's
//! `action_flag` and `relevant_entry` and loads (or drops) the in-memory object file the
//! entry points to, as if it were a shared library. When gdb attaches to a running
//! process it walks the whole `first_entry` list instead.
//!
//! Each registered program gets a small relocatable ELF object for the host architecture:
//! one allocated, executable `.text` section of type `SHT_NOBITS` (gdb reads the code itself
//! from the process) whose `sh_addr` is the program's absolute address, and one global
//! `STT_FUNC` symbol with the program's name covering the code. So `break <name>`,
//! `info symbol $pc` and `bt` name the program (exactly at its entry; no unwind information is
//! emitted, so from inside a program's body gdb unwinds by its prologue heuristics). With the
//! backend's line table, a small DWARF unit maps native addresses to eBPF pcs as lines of
//! the pseudo file `<name>.bpf` (line N = pc N - 1), so gdb shows `<name>.bpf:N` and `next`
//! steps one eBPF instruction.
//!
//! Breakpoints: gdb plants a software breakpoint by writing to the code through ptrace. In
//! the default dual-mapped arena the executable view is a shared read-only mapping, where the
//! kernel refuses such writes, so use a hardware breakpoint (`hbreak <name>`); plain `break`
//! works in toggle mode ([`MapMode::Toggle`](crate::MapMode::Toggle)), whose pages are private.
//!
//! The descriptor is process-global while several runtimes may exist in one process, so
//! every change to the list, and the notification that follows it, happens under one global
//! mutex. An entry (and its object file) is freed only after it was unlinked and gdb was
//! told, so gdb never reads freed memory.

use object::elf;
use object::endian::{NativeEndian, U16, U32, U64};
use object::pod::bytes_of;
use std::ptr::{self, null_mut};
use std::sync::Mutex;

/// `jit_actions_t` of the gdb interface.
const JIT_NOACTION: u32 = 0;
const JIT_REGISTER_FN: u32 = 1;
const JIT_UNREGISTER_FN: u32 = 2;

/// `struct jit_code_entry`: one registered object file, in a doubly linked list.
#[repr(C)]
struct JitCodeEntry {
    next_entry: *mut JitCodeEntry,
    prev_entry: *mut JitCodeEntry,
    symfile_addr: *const u8,
    symfile_size: u64,
}

/// `struct jit_descriptor`.
#[repr(C)]
pub struct JitDescriptor {
    version: u32,
    action_flag: u32,
    relevant_entry: *mut JitCodeEntry,
    first_entry: *mut JitCodeEntry,
}

/// The descriptor gdb reads. Its name and layout are fixed by gdb; `version` must be 1
/// from process start, so it is statically initialized. Only touched under `LOCK`.
#[no_mangle]
#[used]
pub static mut __jit_debug_descriptor: JitDescriptor = JitDescriptor {
    version: 1,
    action_flag: JIT_NOACTION,
    relevant_entry: null_mut(),
    first_entry: null_mut(),
};

/// gdb keeps a breakpoint here; calling it reports a change of the descriptor.
///
/// The body takes the descriptor's address through an opaque barrier. That keeps the
/// function from being merged with any other empty function (gdb would stop at every call
/// of that one too), and it means the compiler must assume the call reads the descriptor,
/// so the stores made before it are neither dropped nor moved past it.
#[no_mangle]
#[inline(never)]
pub extern "C" fn __jit_debug_register_code() {
    std::hint::black_box(&raw const __jit_debug_descriptor);
}

/// Serializes every access to [`__jit_debug_descriptor`] and its list in this process.
static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    // The guarded state is the descriptor, which no code path leaves half-linked on panic
    // (nothing in the critical sections can panic), so a poisoned lock is still consistent.
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// One program's entry in gdb's list. Dropping it unregisters it, then frees it.
pub(crate) struct Registration {
    entry: *mut JitCodeEntry,
    symfile: *mut [u8],
}

// SAFETY: the pointers are owned by this value (from `Box::into_raw`); the list links they
// take part in are only read or written under `LOCK`, from whichever thread.
unsafe impl Send for Registration {}
// SAFETY: `Registration` has no `&self` methods that touch the pointers.
unsafe impl Sync for Registration {}

/// Registers a program whose `size` bytes of code start at `addr`, with its line table
/// (native offset, eBPF pc) sorted by offset (may be empty).
pub(crate) fn register(name: &str, addr: u64, size: u64, lines: &[(u32, u32)]) -> Registration {
    let symfile = Box::into_raw(symfile(name, addr, size, lines).into_boxed_slice());
    let entry = Box::into_raw(Box::new(JitCodeEntry {
        next_entry: null_mut(),
        prev_entry: null_mut(),
        symfile_addr: symfile as *const u8,
        symfile_size: symfile.len() as u64,
    }));
    let _g = lock();
    // SAFETY: `LOCK` is held, so this thread alone touches the descriptor and the list;
    // every entry in the list is a live `Box` (freed only after unlinking, below), and
    // `entry` is fresh. Insertion at the head, as the gdb manual does it.
    unsafe {
        let d = &raw mut __jit_debug_descriptor;
        let first = (*d).first_entry;
        (*entry).next_entry = first;
        if !first.is_null() {
            (*first).prev_entry = entry;
        }
        (*d).first_entry = entry;
        notify(d, entry, JIT_REGISTER_FN);
    }
    Registration { entry, symfile }
}

/// Tells gdb (if attached) about `entry`.
///
/// # Safety
/// `LOCK` held; `d` is the descriptor and `entry` a live entry.
unsafe fn notify(d: *mut JitDescriptor, entry: *mut JitCodeEntry, action: u32) {
    // SAFETY: caller contract.
    unsafe {
        (*d).relevant_entry = entry;
        (*d).action_flag = action;
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    __jit_debug_register_code();
}

impl Drop for Registration {
    fn drop(&mut self) {
        let entry = self.entry;
        {
            let _g = lock();
            // SAFETY: `LOCK` held; `entry` is linked (registered, not yet unregistered) and
            // so are its neighbours.
            unsafe {
                let d = &raw mut __jit_debug_descriptor;
                let (prev, next) = ((*entry).prev_entry, (*entry).next_entry);
                if prev.is_null() {
                    (*d).first_entry = next;
                } else {
                    (*prev).next_entry = next;
                }
                if !next.is_null() {
                    (*next).prev_entry = prev;
                }
                // gdb reads the entry (to find its object) while handling the notification,
                // so it is freed only afterwards.
                notify(d, entry, JIT_UNREGISTER_FN);
                (*d).relevant_entry = null_mut();
                (*d).action_flag = JIT_NOACTION;
            }
        }
        // SAFETY: both came from `Box::into_raw` in `register`, are unlinked, and gdb has
        // been told; nothing else refers to them.
        unsafe {
            drop(Box::from_raw(entry));
            drop(Box::from_raw(self.symfile));
        }
    }
}

/// The object files registered in this process, walked from `first_entry` exactly as gdb
/// walks them when it attaches (every runtime's programs, newest first).
///
/// # Panics
/// If the list's back links are inconsistent (a bug in this module).
pub fn registered_symfiles() -> Vec<Vec<u8>> {
    let _g = lock();
    let mut out = Vec::new();
    // SAFETY: `LOCK` held; the listed entries and their object files are live until
    // unlinked, which needs `LOCK`.
    unsafe {
        let d = &raw const __jit_debug_descriptor;
        assert_eq!((*d).version, 1);
        let mut prev: *mut JitCodeEntry = null_mut();
        let mut e = (*d).first_entry;
        while !e.is_null() {
            assert_eq!((*e).prev_entry, prev, "gdb JIT list: broken back link");
            let bytes = ptr::slice_from_raw_parts((*e).symfile_addr, (*e).symfile_size as usize);
            out.push((*bytes).to_vec());
            prev = e;
            e = (*e).next_entry;
        }
    }
    out
}

/// The programs registered in this process, as gdb will see them: (code address, code
/// size, name) of each object file, in list order. Object files this module cannot parse
/// back (there are none unless it has a bug) are listed with size 0 and name `?`.
pub fn registered_programs() -> Vec<(u64, u64, String)> {
    use object::{Object, ObjectSection, ObjectSymbol};
    registered_symfiles()
        .iter()
        .map(|bytes| {
            let parsed = object::read::elf::ElfFile64::<NativeEndian>::parse(&**bytes)
                .ok()
                .and_then(|f| {
                    let text = f.section_by_name(".text")?;
                    let name = f.symbols().next()?.name().ok()?.to_string();
                    Some((text.address(), text.size(), name))
                });
            parsed.unwrap_or((0, 0, "?".into()))
        })
        .collect()
}

/// The ELF machine of the host, as gdb must see it to pick the right architecture.
fn host_machine() -> (u16, u32) {
    if cfg!(target_arch = "x86_64") {
        (elf::EM_X86_64, 0)
    } else if cfg!(target_arch = "aarch64") {
        (elf::EM_AARCH64, 0)
    } else if cfg!(target_arch = "riscv64") {
        // The flags of the lp64d ABI with compressed instructions, as the host's own
        // objects carry them (gdb takes the ABI from them).
        (
            elf::EM_RISCV,
            elf::EF_RISCV_RVC | elf::EF_RISCV_FLOAT_ABI_DOUBLE,
        )
    } else {
        (elf::EM_NONE, 0)
    }
}

/// Whether this host architecture can be described to gdb.
pub(crate) fn supported() -> bool {
    host_machine().0 != elf::EM_NONE
}

/// One section of the object file being built.
struct Section {
    name: &'static str,
    kind: u32,
    flags: u32,
    addr: u64,
    /// Contents (empty for `SHT_NOBITS`, whose size is `nobits_size`).
    data: Vec<u8>,
    nobits_size: u64,
    link: u32,
    info: u32,
    align: usize,
    entsize: u64,
}

impl Section {
    fn data(name: &'static str, kind: u32, data: Vec<u8>) -> Self {
        Section {
            name,
            kind,
            flags: 0,
            addr: 0,
            data,
            nobits_size: 0,
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
        }
    }
}

/// Section indices: 0 null, then in this order (the DWARF ones only with a line table).
const SEC_TEXT: u16 = 1;
const SEC_SYMTAB: usize = 2;
const SEC_STRTAB: u32 = 3;
const SEC_SHSTRTAB: usize = 4;

/// Builds the object file describing one program: a relocatable ELF whose `.text` sits at
/// the program's absolute address (gdb takes section addresses of JIT objects as absolute)
/// and whose only symbol is the program, section-relative at offset 0 as in any `ET_REL`.
///
/// `lines` is the program's line table as (native offset, eBPF pc), sorted by offset; when
/// not empty it is also described in DWARF (see [`dwarf`]).
pub(crate) fn symfile(name: &str, addr: u64, size: u64, lines: &[(u32, u32)]) -> Vec<u8> {
    type E = NativeEndian;
    let e = NativeEndian;
    let (machine, flags) = host_machine();

    // A NUL would end the name early in the string tables.
    let name = name.replace('\0', "_");
    let mut strtab = vec![0u8];
    strtab.extend_from_slice(name.as_bytes());
    strtab.push(0);
    let mut symtab = bytes_of(&elf::Sym64::<E>::default()).to_vec();
    symtab.extend_from_slice(bytes_of(&elf::Sym64::<E> {
        st_name: U32::new(e, 1),
        st_info: (elf::STB_GLOBAL << 4) | elf::STT_FUNC,
        st_other: elf::STV_DEFAULT,
        st_shndx: U16::new(e, SEC_TEXT),
        st_value: U64::new(e, 0),
        st_size: U64::new(e, size),
    }));

    let mut sections = vec![
        Section {
            // NOBITS: the code is in the process already.
            flags: elf::SHF_ALLOC | elf::SHF_EXECINSTR,
            addr,
            nobits_size: size,
            ..Section::data(".text", elf::SHT_NOBITS, Vec::new())
        },
        Section {
            link: SEC_STRTAB,
            // Index of the first non-local symbol (the program's).
            info: 1,
            align: 8,
            entsize: size_of::<elf::Sym64<E>>() as u64,
            ..Section::data(".symtab", elf::SHT_SYMTAB, symtab)
        },
        Section::data(".strtab", elf::SHT_STRTAB, strtab),
        Section::data(".shstrtab", elf::SHT_STRTAB, Vec::new()),
    ];
    if !lines.is_empty() {
        let (abbrev, info, line) = dwarf::unit(&name, addr, size, lines);
        for (n, d) in [
            (".debug_abbrev", abbrev),
            (".debug_info", info),
            (".debug_line", line),
        ] {
            sections.push(Section::data(n, elf::SHT_PROGBITS, d));
        }
    }
    let mut shstrtab = vec![0u8];
    let mut name_offsets = Vec::new();
    for s in &sections {
        name_offsets.push(shstrtab.len() as u32);
        shstrtab.extend_from_slice(s.name.as_bytes());
        shstrtab.push(0);
    }
    debug_assert_eq!(sections[SEC_SYMTAB - 1].name, ".symtab");
    sections[SEC_SHSTRTAB - 1].data = shstrtab;

    // Layout: header, each section's contents (aligned), section headers (8-aligned).
    let ehsize = size_of::<elf::FileHeader64<E>>();
    let mut out = vec![0u8; ehsize];
    let mut offsets = Vec::new();
    for s in &sections {
        out.resize(out.len().next_multiple_of(s.align), 0);
        offsets.push(out.len());
        out.extend_from_slice(&s.data);
    }
    out.resize(out.len().next_multiple_of(8), 0);
    let shoff = out.len();

    let header = elf::FileHeader64::<E> {
        e_ident: elf::Ident {
            magic: elf::ELFMAG,
            class: elf::ELFCLASS64,
            data: if cfg!(target_endian = "little") {
                elf::ELFDATA2LSB
            } else {
                elf::ELFDATA2MSB
            },
            version: elf::EV_CURRENT,
            os_abi: elf::ELFOSABI_NONE,
            abi_version: 0,
            padding: [0; 7],
        },
        e_type: U16::new(e, elf::ET_REL),
        e_machine: U16::new(e, machine),
        e_version: U32::new(e, elf::EV_CURRENT.into()),
        e_entry: U64::new(e, 0),
        e_phoff: U64::new(e, 0),
        e_shoff: U64::new(e, shoff as u64),
        e_flags: U32::new(e, flags),
        e_ehsize: U16::new(e, ehsize as u16),
        e_phentsize: U16::new(e, 0),
        e_phnum: U16::new(e, 0),
        e_shentsize: U16::new(e, size_of::<elf::SectionHeader64<E>>() as u16),
        e_shnum: U16::new(e, sections.len() as u16 + 1),
        e_shstrndx: U16::new(e, SEC_SHSTRTAB as u16),
    };
    out[..ehsize].copy_from_slice(bytes_of(&header));
    // The null section header.
    out.resize(out.len() + size_of::<elf::SectionHeader64<E>>(), 0);
    for ((s, &off), &name) in sections.iter().zip(&offsets).zip(&name_offsets) {
        let size = if s.kind == elf::SHT_NOBITS {
            s.nobits_size
        } else {
            s.data.len() as u64
        };
        out.extend_from_slice(bytes_of(&elf::SectionHeader64::<E> {
            sh_name: U32::new(e, name),
            sh_type: U32::new(e, s.kind),
            sh_flags: U64::new(e, s.flags.into()),
            sh_addr: U64::new(e, s.addr),
            sh_offset: U64::new(e, off as u64),
            sh_size: U64::new(e, size),
            sh_link: U32::new(e, s.link),
            sh_info: U32::new(e, s.info),
            sh_addralign: U64::new(e, s.align as u64),
            sh_entsize: U64::new(e, s.entsize),
        }));
    }
    out
}

/// A minimal DWARF 4 description of one program, so that gdb shows and steps by eBPF
/// instruction: a compile unit for the pseudo source file `<name>.bpf`, whose line N is
/// eBPF slot N - 1 (pc 0 is line 1: a listing with one instruction per line), one
/// subprogram for the program, and a line program mapping each native address to the pc
/// whose code holds it.
mod dwarf {
    // DWARF constants used below (DWARF 4, section 7).
    const DW_TAG_COMPILE_UNIT: u8 = 0x11;
    const DW_TAG_SUBPROGRAM: u8 = 0x2e;
    const DW_AT_NAME: u8 = 0x03;
    const DW_AT_STMT_LIST: u8 = 0x10;
    const DW_AT_LOW_PC: u8 = 0x11;
    const DW_AT_HIGH_PC: u8 = 0x12;
    const DW_AT_LANGUAGE: u8 = 0x13;
    const DW_AT_PRODUCER: u8 = 0x25;
    const DW_AT_EXTERNAL: u8 = 0x3f;
    const DW_FORM_ADDR: u8 = 0x01;
    const DW_FORM_DATA2: u8 = 0x05;
    const DW_FORM_DATA8: u8 = 0x07;
    const DW_FORM_STRING: u8 = 0x08;
    const DW_FORM_SEC_OFFSET: u8 = 0x17;
    const DW_FORM_FLAG_PRESENT: u8 = 0x19;
    /// What GNU as records for assembly sources: gdb shows such frames as assembly.
    const DW_LANG_MIPS_ASSEMBLER: u16 = 0x8001;
    const DW_LNS_COPY: u8 = 0x01;
    const DW_LNS_ADVANCE_PC: u8 = 0x02;
    const DW_LNS_ADVANCE_LINE: u8 = 0x03;
    const DW_LNE_END_SEQUENCE: u8 = 0x01;
    const DW_LNE_SET_ADDRESS: u8 = 0x02;
    /// Opcode base 13: the 12 standard opcodes of DWARF 4, with their operand counts.
    const STANDARD_OPCODE_LENGTHS: [u8; 12] = [0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1];

    fn uleb(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn sleb(out: &mut Vec<u8>, mut v: i64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if (v == 0 && b & 0x40 == 0) || (v == -1 && b & 0x40 != 0) {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn cstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    /// Patches the 4-byte length at `at` to cover everything after it (32-bit DWARF).
    fn close_length(out: &mut [u8], at: usize) {
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// The rows of the line program: (native offset, line), one per distinct offset in
    /// increasing order. Of equal offsets (an instruction that emitted no code) the later
    /// pc owns the address, as in `Program::pc_at`. Code before pc 0's (the entry's set-up)
    /// is given line 1 too, so every address of the program has a line; gdb's usual reading
    /// of a first line listed twice puts the end of the prologue at the second row.
    pub(super) fn rows(lines: &[(u32, u32)]) -> Vec<(u32, u64)> {
        let mut rows: Vec<(u32, u64)> = Vec::with_capacity(lines.len() + 1);
        if lines.first().is_some_and(|&(o, _)| o != 0) {
            rows.push((0, 1));
        }
        for &(off, pc) in lines {
            let line = u64::from(pc) + 1;
            match rows.last_mut() {
                Some(last) if last.0 == off => last.1 = line,
                _ => rows.push((off, line)),
            }
        }
        rows
    }

    /// (.debug_abbrev, .debug_info, .debug_line) for program `name` of `size` bytes at
    /// `addr`, with its `lines` (native offset, pc) sorted by offset.
    pub(super) fn unit(
        name: &str,
        addr: u64,
        size: u64,
        lines: &[(u32, u32)],
    ) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let file = format!("{name}.bpf");

        let mut abbrev = Vec::new();
        // 1: the compile unit, with children.
        abbrev.extend_from_slice(&[1, DW_TAG_COMPILE_UNIT, 1]);
        for (at, form) in [
            (DW_AT_PRODUCER, DW_FORM_STRING),
            (DW_AT_LANGUAGE, DW_FORM_DATA2),
            (DW_AT_NAME, DW_FORM_STRING),
            (DW_AT_STMT_LIST, DW_FORM_SEC_OFFSET),
            (DW_AT_LOW_PC, DW_FORM_ADDR),
            // DWARF 4: a constant high_pc is the length.
            (DW_AT_HIGH_PC, DW_FORM_DATA8),
        ] {
            abbrev.extend_from_slice(&[at, form]);
        }
        abbrev.extend_from_slice(&[0, 0]);
        // 2: the program, no children.
        abbrev.extend_from_slice(&[2, DW_TAG_SUBPROGRAM, 0]);
        for (at, form) in [
            (DW_AT_NAME, DW_FORM_STRING),
            (DW_AT_EXTERNAL, DW_FORM_FLAG_PRESENT),
            (DW_AT_LOW_PC, DW_FORM_ADDR),
            (DW_AT_HIGH_PC, DW_FORM_DATA8),
        ] {
            abbrev.extend_from_slice(&[at, form]);
        }
        abbrev.extend_from_slice(&[0, 0, 0]);

        let mut info = vec![0; 4];
        info.extend_from_slice(&4u16.to_ne_bytes()); // version
        info.extend_from_slice(&0u32.to_ne_bytes()); // .debug_abbrev offset
        info.push(8); // address size
        uleb(&mut info, 1);
        cstr(&mut info, concat!("packjit ", env!("CARGO_PKG_VERSION")));
        info.extend_from_slice(&DW_LANG_MIPS_ASSEMBLER.to_ne_bytes());
        cstr(&mut info, &file);
        info.extend_from_slice(&0u32.to_ne_bytes()); // .debug_line offset
        info.extend_from_slice(&addr.to_ne_bytes());
        info.extend_from_slice(&size.to_ne_bytes());
        uleb(&mut info, 2);
        cstr(&mut info, name);
        info.extend_from_slice(&addr.to_ne_bytes());
        info.extend_from_slice(&size.to_ne_bytes());
        info.push(0); // end of the unit's children
        close_length(&mut info, 0);

        let mut line = vec![0; 4];
        line.extend_from_slice(&4u16.to_ne_bytes()); // version
        let header_length_at = line.len();
        line.extend_from_slice(&[0; 4]);
        // Minimum instruction length 1, 1 operation per instruction, is_stmt by default,
        // line_base -5, line_range 14 (unused: only standard opcodes follow), opcode_base.
        line.extend_from_slice(&[1, 1, 1, -5i8 as u8, 14, 13]);
        line.extend_from_slice(&STANDARD_OPCODE_LENGTHS);
        line.push(0); // no include directories
        cstr(&mut line, &file);
        line.extend_from_slice(&[0, 0, 0]); // directory 0 (the unit's), no time, no size
        line.push(0); // end of the file names
        close_length(&mut line, header_length_at);
        line.extend_from_slice(&[0, 9, DW_LNE_SET_ADDRESS]);
        line.extend_from_slice(&addr.to_ne_bytes());
        let (mut at, mut ln) = (0u64, 1u64);
        for (off, l) in rows(lines) {
            let off = u64::from(off).min(size);
            if off != at {
                line.push(DW_LNS_ADVANCE_PC);
                uleb(&mut line, off - at);
            }
            if l != ln {
                line.push(DW_LNS_ADVANCE_LINE);
                sleb(&mut line, l as i64 - ln as i64);
            }
            line.push(DW_LNS_COPY);
            (at, ln) = (off, l);
        }
        if size > at {
            line.push(DW_LNS_ADVANCE_PC);
            uleb(&mut line, size - at);
        }
        line.extend_from_slice(&[0, 1, DW_LNE_END_SEQUENCE]);
        close_length(&mut line, 0);
        (abbrev, info, line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};

    #[test]
    fn the_object_file_names_the_program_at_its_address() {
        let bytes = symfile("my\0prog", 0x7f00_1234_5000, 0x1a4, &[]);
        let f = object::read::elf::ElfFile64::<NativeEndian>::parse(&*bytes).unwrap();
        assert_eq!(f.kind(), object::ObjectKind::Relocatable);
        let text = f.section_by_name(".text").unwrap();
        assert_eq!((text.address(), text.size()), (0x7f00_1234_5000, 0x1a4));
        assert_eq!(text.kind(), object::SectionKind::UninitializedData);
        let syms: Vec<_> = f.symbols().collect();
        assert_eq!(syms.len(), 1);
        let s = &syms[0];
        assert_eq!(s.name().unwrap(), "my_prog");
        assert_eq!(s.kind(), object::SymbolKind::Text);
        assert!(s.is_global());
        assert_eq!((s.address(), s.size()), (0, 0x1a4));
        assert_eq!(s.section_index(), Some(text.index()));
    }

    #[test]
    fn line_rows_cover_the_prologue_and_give_shared_offsets_to_the_later_pc() {
        // pc 0 at 8 (after 8 bytes of set-up), pc 1 at 12, pc 2 emitted nothing (same
        // offset as pc 3), pc 3 at 20.
        let lines = [(8, 0), (12, 1), (20, 2), (20, 3)];
        assert_eq!(dwarf::rows(&lines), [(0, 1), (8, 1), (12, 2), (20, 4)]);
        assert_eq!(dwarf::rows(&[(0, 0), (4, 1)]), [(0, 1), (4, 2)]);
    }

    #[test]
    fn a_line_table_adds_the_dwarf_sections() {
        let plain = symfile("p", 0x1000, 32, &[]);
        let with = symfile("p", 0x1000, 32, &[(0, 0), (4, 1)]);
        let names = |b: &[u8]| {
            let f = object::read::elf::ElfFile64::<NativeEndian>::parse(b).unwrap();
            f.sections()
                .map(|s| s.name().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let base = [".text", ".symtab", ".strtab", ".shstrtab"];
        assert_eq!(names(&plain), base);
        let mut all = base.to_vec();
        all.extend([".debug_abbrev", ".debug_info", ".debug_line"]);
        assert_eq!(names(&with), all);
        // The line program: after the header, set the address, one row (line 1 at 0), one
        // row 4 bytes and 1 line on, then 28 bytes to the end of the code and the end.
        let f = object::read::elf::ElfFile64::<NativeEndian>::parse(&*with).unwrap();
        let line = f.section_by_name(".debug_line").unwrap();
        let data = line.data().unwrap();
        let tail: &[u8] = &[
            0, 9, 2, 0, 0x10, 0, 0, 0, 0, 0, 0, // DW_LNE_set_address 0x1000
            1, // copy: (0x1000, line 1)
            2, 4, 3, 1, 1, // advance pc 4, line 1, copy
            2, 28, // advance pc to the end
            0, 1, 1, // DW_LNE_end_sequence
        ];
        assert!(data.ends_with(tail), "{data:x?}");
    }

    #[test]
    fn entries_are_linked_and_unlinked() {
        let ours = |files: &[Vec<u8>]| {
            files
                .iter()
                .filter_map(|b| {
                    let f = object::read::elf::ElfFile64::<NativeEndian>::parse(&**b).ok()?;
                    let a = f.section_by_name(".text")?.address();
                    (0xdead_0000..0xdead_1000).contains(&a).then_some(a)
                })
                .collect::<Vec<_>>()
        };
        let a = register("a", 0xdead_0000, 16, &[]);
        let b = register("b", 0xdead_0100, 16, &[]);
        let c = register("c", 0xdead_0200, 16, &[]);
        // Newest first (head insertion).
        assert_eq!(
            ours(&registered_symfiles()),
            [0xdead_0200, 0xdead_0100, 0xdead_0000]
        );
        drop(b); // middle
        assert_eq!(ours(&registered_symfiles()), [0xdead_0200, 0xdead_0000]);
        drop(c); // head
        assert_eq!(ours(&registered_symfiles()), [0xdead_0000]);
        drop(a);
        assert_eq!(ours(&registered_symfiles()), [0u64; 0]);
    }
}
