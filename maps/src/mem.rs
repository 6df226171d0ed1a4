//! Zeroed, 8-byte aligned memory blocks and the small spin lock the maps share.

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
    align: usize,
}

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
                align,
            });
        }
        let layout =
            Layout::from_size_align(len, align).map_err(|_| AllocError { bytes: len as u64 })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(p)
            .map(|ptr| Slab { ptr, len, align })
            .ok_or(AllocError { bytes: len as u64 })
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
        if self.len != 0 {
            // SAFETY: allocated in `zeroed_aligned` with exactly this layout.
            unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, self.align),
                )
            };
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
