//! Thin wrappers over the system calls the arena needs that `region` does not cover:
//! memfd dual mappings, `MAP_FIXED` remaps, `membarrier`, and instruction-cache maintenance.

use std::io;
use std::ptr;

pub(crate) fn page_size() -> usize {
    region::page::size()
}

fn check_map(p: *mut libc::c_void, what: &str) -> io::Result<*mut u8> {
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(p as *mut u8)
}

/// Reserves `size` bytes of address space aligned to `align` (a power of two) and returns the
/// aligned start. The reservation is `PROT_NONE`; callers map over it with `MAP_FIXED`.
pub(crate) fn reserve_aligned(size: usize, align: usize) -> io::Result<*mut u8> {
    let span = size + align;
    // SAFETY: anonymous PROT_NONE mapping; no memory is touched.
    let base = check_map(
        unsafe {
            libc::mmap(
                ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        },
        "reserving code address space",
    )?;
    let start = (base as usize + align - 1) & !(align - 1);
    let head = start - base as usize;
    let tail = span - head - size;
    // SAFETY: trimming our own reservation to the aligned window.
    unsafe {
        if head > 0 {
            libc::munmap(base as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail);
        }
    }
    Ok(start as *mut u8)
}

/// A memfd of `size` bytes, close-on-exec.
pub(crate) fn memfd(size: usize) -> io::Result<libc::c_int> {
    // SAFETY: static NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"packjit-code".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is ours.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing our fd.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// Maps `len` bytes of `fd` at `offset` with `prot`, at `fixed` if given.
pub(crate) fn map_shared(
    fd: libc::c_int,
    offset: usize,
    len: usize,
    prot: libc::c_int,
    fixed: Option<*mut u8>,
) -> io::Result<*mut u8> {
    let (addr, flags) = match fixed {
        Some(a) => (a as *mut libc::c_void, libc::MAP_SHARED | libc::MAP_FIXED),
        None => (ptr::null_mut(), libc::MAP_SHARED),
    };
    // SAFETY: mapping a memfd we own; with MAP_FIXED the caller guarantees the range is ours.
    check_map(
        unsafe { libc::mmap(addr, len, prot, flags, fd, offset as libc::off_t) },
        "mapping code memory",
    )
}

/// An anonymous RW mapping at `fixed` (toggle mode).
pub(crate) fn map_anon_rw(fixed: *mut u8, len: usize) -> io::Result<*mut u8> {
    // SAFETY: the caller owns the reserved range.
    check_map(
        unsafe {
            libc::mmap(
                fixed as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        },
        "mapping code memory",
    )
}

pub(crate) fn unmap(p: *mut u8, len: usize) {
    // SAFETY: the caller owns the mapping.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

pub(crate) fn close(fd: libc::c_int) {
    // SAFETY: the caller owns the fd.
    unsafe { libc::close(fd) };
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 6;

/// Whether other threads must be made to serialise their instruction stream after a commit
/// (`membarrier(PRIVATE_EXPEDITED_SYNC_CORE)`), on the host's arch.
///
/// arm64 needs it: another core may hold stale instructions for a reused address until it
/// executes an ISB, which only the kernel can make it do (wasmtime's icache-coherence crate
/// issues the same call there). RV64 keeps it too, on top of `riscv_flush_icache`'s
/// all-harts flush. x86-64 does not: its instruction fetch is coherent with stores from any
/// core (snooped by physical address, so the RW alias of a dual mapping is covered), and a
/// commit only writes chunks no thread can be executing (fresh, or freed after their grace
/// period), reached only through pointers published after the commit. That is how Linux
/// installs x86 BPF programs (`bpf_prog_pack` + `text_poke_copy`, no cross-CPU sync: the
/// sync is for patching live instructions, which packjit never does). The syscall cost a
/// load 0.6 µs there, a third of a small program's compile (issue 45).
pub(crate) const CORES_NEED_SYNC: bool = !cfg!(target_arch = "x86_64");

/// Registers for `membarrier(PRIVATE_EXPEDITED_SYNC_CORE)`; false where unavailable.
pub(crate) fn membarrier_register() -> bool {
    // SAFETY: plain syscall without pointers.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
            0,
            0,
        ) == 0
    }
}

/// Makes every thread of the process execute a core-serialising instruction, so none keeps
/// running stale prefetched instructions after a commit.
pub(crate) fn membarrier_sync_core() {
    // SAFETY: plain syscall without pointers.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE,
            0,
            0,
        );
    }
}

/// Instruction-cache maintenance for `[start, start+len)` (executable addresses), as required
/// after writing code there through another mapping.
#[allow(unused_variables)]
pub(crate) fn flush_icache(start: usize, len: usize) {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: cache maintenance by VA on mapped, readable memory is harmless.
    unsafe {
        let ctr: u64;
        core::arch::asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack));
        let end = start + len;
        // CTR_EL0.IDC (bit 28): no data-cache clean needed for I/D coherence.
        if ctr & (1 << 28) == 0 {
            let line = 4usize << ((ctr >> 16) & 0xf);
            let mut a = start & !(line - 1);
            while a < end {
                core::arch::asm!("dc cvau, {}", in(reg) a, options(nostack));
                a += line;
            }
        }
        core::arch::asm!("dsb ish", options(nostack));
        // CTR_EL0.DIC (bit 29): no instruction-cache invalidation needed.
        if ctr & (1 << 29) == 0 {
            let line = 4usize << (ctr & 0xf);
            let mut a = start & !(line - 1);
            while a < end {
                core::arch::asm!("ic ivau, {}", in(reg) a, options(nostack));
                a += line;
            }
            core::arch::asm!("dsb ish", options(nostack));
        }
        core::arch::asm!("isb", options(nostack));
    }
    #[cfg(target_arch = "riscv64")]
    // SAFETY: riscv_flush_icache(start, end, flags = 0: all threads) takes no pointers it
    // dereferences.
    unsafe {
        const SYS_RISCV_FLUSH_ICACHE: libc::c_long = 259;
        libc::syscall(SYS_RISCV_FLUSH_ICACHE, start, start + len, 0);
    }
    // x86-64 keeps instruction fetch coherent with stores; nothing to do.
}

/// Gives the pages of `[off, off + len)` of a pack back to the kernel; they read as zeroes
/// afterwards, exactly like pages never touched. Dual mapping: punch a hole in the memfd (a
/// `MADV_DONTNEED` on a shared view would only drop the view's page-table entries, not the
/// memory). Toggle mode: `MADV_DONTNEED` on the private anonymous RW mapping. Returns false
/// when the kernel refused (the pages then simply stay resident).
pub(crate) fn release_pages(fd: Option<libc::c_int>, rw: *mut u8, off: usize, len: usize) -> bool {
    match fd {
        // SAFETY: our memfd; the range is inside it.
        Some(fd) => unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            ) == 0
        },
        // SAFETY: our private anonymous mapping; nothing in the range is in use.
        None => unsafe {
            libc::madvise(rw.add(off) as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0
        },
    }
}
