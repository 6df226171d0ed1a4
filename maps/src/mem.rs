//! Zeroed memory blocks (8-byte aligned, cache-line aligned, or huge-page backed) and the
//! small spin lock the maps share.

use std::alloc::{self, Layout};
use std::hint;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// An allocation that failed, with the bytes it asked for.
#[derive(Debug)]
pub(crate) struct AllocError {
    pub bytes: u64,
}

/// A zeroed block of `len` bytes, 8-byte aligned (or more: [`Slab::zeroed_aligned`]), owned
/// by a map. Programs reach it through raw pointers, so it is never borrowed as a Rust slice
/// while the map is shared.
pub(crate) struct Slab {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Where a slab's memory comes from, for its release.
enum Backing {
    /// The global allocator, with this alignment.
    Heap { align: usize },
    /// An anonymous mapping of this many bytes (a multiple of [`HUGE_PAGE`]) at `ptr`.
    Mapped { bytes: usize },
}

/// The huge page size [`Slab::zeroed_huge`] aligns to (x86-64's and arm64's with 4 KiB
/// pages, RV64's Sv39 megapage).
const HUGE_PAGE: usize = 2 << 20;

// SAFETY: a Slab is plain memory; every concurrent access to it goes through raw pointers
// whose synchronisation the map code documents (publication by Release/Acquire links, epoch
// grace periods, the bucket locks).
unsafe impl Send for Slab {}
// SAFETY: as for Send: &Slab hands out only the base pointer.
unsafe impl Sync for Slab {}

impl Slab {
    /// `len` zero bytes (a dangling, never dereferenced pointer for `len == 0`).
    pub fn zeroed(len: usize) -> Result<Slab, AllocError> {
        Slab::zeroed_aligned(len, 8)
    }

    /// `len` zero bytes aligned to `align` (a power of two, at least 8): a cache line, for
    /// blocks read a line at a time.
    pub fn zeroed_aligned(len: usize, align: usize) -> Result<Slab, AllocError> {
        debug_assert!(align.is_power_of_two() && align >= 8);
        if len == 0 {
            return Ok(Slab {
                ptr: NonNull::<u64>::dangling().cast(),
                len,
                backing: Backing::Heap { align },
            });
        }
        let layout =
            Layout::from_size_align(len, align).map_err(|_| AllocError { bytes: len as u64 })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(p)
            .map(|ptr| Slab {
                ptr,
                len,
                backing: Backing::Heap { align },
            })
            .ok_or(AllocError { bytes: len as u64 })
    }

    /// As [`Slab::zeroed_aligned`], but a block of at least [`HUGE_PAGE`] bytes is mapped on
    /// its own, aligned to a huge page and advised to be backed by huge pages
    /// (`MADV_HUGEPAGE`, which transparent huge pages honour in their default `madvise`
    /// mode): a table read at random positions (hash buckets, nodes and values) then costs
    /// one TLB entry per 2 MiB instead of per 4 KiB page, so a lookup in a table of
    /// millions of elements misses the cache without also missing the TLB. The kernel
    /// zeroes the pages as they are first touched.
    pub fn zeroed_huge(len: usize, align: usize) -> Result<Slab, AllocError> {
        if len < HUGE_PAGE {
            return Slab::zeroed_aligned(len, align);
        }
        let fail = AllocError { bytes: len as u64 };
        let bytes = len
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or(AllocError { bytes: len as u64 })?;
        let over = bytes
            .checked_add(HUGE_PAGE)
            .ok_or(AllocError { bytes: len as u64 })?;
        // SAFETY: an anonymous private mapping at an address the kernel picks; no memory
        // of ours is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(fail);
        }
        let start = p as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let head = aligned - start;
        let tail = over - head - bytes;
        // SAFETY: [start, start + over) is the mapping just made; the head and tail cut off
        // are inside it and page-aligned (mmap's start and HUGE_PAGE multiples), and nothing
        // refers to them. A failed unmap only leaves address space mapped.
        unsafe {
            if head != 0 {
                libc::munmap(p, head);
            }
            if tail != 0 {
                libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
            }
            // Advice only: without transparent huge pages the block stays in small pages.
            libc::madvise(aligned as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
        }
        NonNull::new(aligned as *mut u8)
            .map(|ptr| Slab {
                ptr,
                len,
                backing: Backing::Mapped { bytes },
            })
            .ok_or(fail)
    }

    #[inline]
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        match self.backing {
            Backing::Heap { .. } if self.len == 0 => {}
            // SAFETY: allocated in `zeroed_aligned` with exactly this layout.
            Backing::Heap { align } => unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, align),
                )
            },
            // SAFETY: the mapping `zeroed_huge` kept, exactly these bytes; the map owning
            // the slab is gone, so nothing refers to it.
            Backing::Mapped { bytes } => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), bytes);
            },
        }
    }
}

/// `a * b` bytes, or the allocation error that a product above `usize` would be.
pub(crate) fn bytes(a: usize, b: usize) -> Result<usize, AllocError> {
    a.checked_mul(b)
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or(AllocError { bytes: u64::MAX })
}

/// `n` atomics initialised to `init`, failing instead of aborting when memory is short.
pub(crate) fn atomic_u32s(n: usize, init: u32) -> Result<Box<[AtomicU32]>, AllocError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| AllocError {
        bytes: (n as u64).saturating_mul(4),
    })?;
    v.resize_with(n, || AtomicU32::new(init));
    Ok(v.into_boxed_slice())
}

/// Rounds `n` up to a multiple of 8 (the kernel's `round_up(value_size, 8)`).
#[inline]
pub(crate) const fn round8(n: usize) -> usize {
    (n + 7) & !7
}

/// A test-and-test-and-set spin lock, as the kernel's bucket and ring-buffer locks: the
/// critical sections are a few loads and stores, shorter than a futex round trip. After a
/// while it yields, so a holder preempted on a busy machine (or under qemu) gets to run.
pub(crate) struct SpinLock(AtomicBool);

pub(crate) struct SpinGuard<'a>(&'a SpinLock);

impl SpinLock {
    pub const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }

    #[inline]
    pub fn lock(&self) -> SpinGuard<'_> {
        let mut spins = 0u32;
        // Acquire pairs with the Release of the previous holder's unlock, so its writes to
        // the data the lock guards are visible here.
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.0.load(Ordering::Relaxed) {
                if spins < 128 {
                    hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        }
        SpinGuard(self)
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0 .0.store(false, Ordering::Release);
    }
}

/// The system page size (sysconf), cached.
pub(crate) fn page_size() -> usize {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}
