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
//! emitted, so from inside a program's body gdb unwinds by its prologue heuristics).
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

/// Registers a program whose `size` bytes of code start at `addr`.
pub(crate) fn register(name: &str, addr: u64, size: u64) -> Registration {
    let symfile = Box::into_raw(symfile(name, addr, size).into_boxed_slice());
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

/// Section indices of the object file (0 null, 1 `.text`, 2 `.symtab`, 3, 4).
const SEC_TEXT: u16 = 1;
const SEC_STRTAB: u32 = 3;
const SEC_SHSTRTAB: u16 = 4;
const SECTIONS: u16 = 5;

/// Builds the object file describing one program: a relocatable ELF whose `.text` sits at
/// the program's absolute address (gdb takes section addresses of JIT objects as absolute)
/// and whose only symbol is the program, section-relative at offset 0 as in any `ET_REL`.
pub(crate) fn symfile(name: &str, addr: u64, size: u64) -> Vec<u8> {
    type E = NativeEndian;
    let e = NativeEndian;
    let (machine, flags) = host_machine();

    // A NUL would end the name early in the string table.
    let name = name.replace('\0', "_");
    let shstrtab = b"\0.text\0.symtab\0.strtab\0.shstrtab\0";
    let (sh_text, sh_symtab, sh_strtab, sh_shstrtab) = (1, 7, 15, 23);
    let mut strtab = vec![0u8];
    strtab.extend_from_slice(name.as_bytes());
    strtab.push(0);

    let null_sym = elf::Sym64::<E> {
        st_name: U32::new(e, 0),
        st_info: 0,
        st_other: 0,
        st_shndx: U16::new(e, 0),
        st_value: U64::new(e, 0),
        st_size: U64::new(e, 0),
    };
    let func = elf::Sym64::<E> {
        st_name: U32::new(e, 1),
        st_info: (elf::STB_GLOBAL << 4) | elf::STT_FUNC,
        st_other: elf::STV_DEFAULT,
        st_shndx: U16::new(e, SEC_TEXT),
        st_value: U64::new(e, 0),
        st_size: U64::new(e, size),
    };

    // Layout: header, string tables, symbol table (8-aligned), section headers (8-aligned).
    let ehsize = size_of::<elf::FileHeader64<E>>();
    let shstrtab_off = ehsize;
    let strtab_off = shstrtab_off + shstrtab.len();
    let symtab_off = (strtab_off + strtab.len()).next_multiple_of(8);
    let sym_size = size_of::<elf::Sym64<E>>();
    let shoff = (symtab_off + 2 * sym_size).next_multiple_of(8);

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
        e_shnum: U16::new(e, SECTIONS),
        e_shstrndx: U16::new(e, SEC_SHSTRTAB),
    };
    #[allow(clippy::too_many_arguments)]
    fn section(
        name: u32,
        kind: u32,
        flags: u64,
        addr: u64,
        offset: usize,
        size: u64,
        link: u32,
        info: u32,
        align: u64,
        entsize: u64,
    ) -> elf::SectionHeader64<E> {
        let e = NativeEndian;
        elf::SectionHeader64 {
            sh_name: U32::new(e, name),
            sh_type: U32::new(e, kind),
            sh_flags: U64::new(e, flags),
            sh_addr: U64::new(e, addr),
            sh_offset: U64::new(e, offset as u64),
            sh_size: U64::new(e, size),
            sh_link: U32::new(e, link),
            sh_info: U32::new(e, info),
            sh_addralign: U64::new(e, align),
            sh_entsize: U64::new(e, entsize),
        }
    }
    let sections = [
        section(0, elf::SHT_NULL, 0, 0, 0, 0, 0, 0, 0, 0),
        // NOBITS: the code is in the process already; its file offset is unused.
        section(
            sh_text,
            elf::SHT_NOBITS,
            u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR),
            addr,
            shstrtab_off,
            size,
            0,
            0,
            1,
            0,
        ),
        // sh_info: index of the first non-local symbol (the program's).
        section(
            sh_symtab,
            elf::SHT_SYMTAB,
            0,
            0,
            symtab_off,
            2 * sym_size as u64,
            SEC_STRTAB,
            1,
            8,
            sym_size as u64,
        ),
        section(
            sh_strtab,
            elf::SHT_STRTAB,
            0,
            0,
            strtab_off,
            strtab.len() as u64,
            0,
            0,
            1,
            0,
        ),
        section(
            sh_shstrtab,
            elf::SHT_STRTAB,
            0,
            0,
            shstrtab_off,
            shstrtab.len() as u64,
            0,
            0,
            1,
            0,
        ),
    ];

    let mut out = Vec::with_capacity(shoff + sections.len() * size_of_val(&sections[0]));
    out.extend_from_slice(bytes_of(&header));
    out.extend_from_slice(shstrtab);
    out.extend_from_slice(&strtab);
    out.resize(symtab_off, 0);
    out.extend_from_slice(bytes_of(&null_sym));
    out.extend_from_slice(bytes_of(&func));
    out.resize(shoff, 0);
    for s in &sections {
        out.extend_from_slice(bytes_of(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};

    #[test]
    fn the_object_file_names_the_program_at_its_address() {
        let bytes = symfile("my\0prog", 0x7f00_1234_5000, 0x1a4);
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
        let a = register("a", 0xdead_0000, 16);
        let b = register("b", 0xdead_0100, 16);
        let c = register("c", 0xdead_0200, 16);
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
