//! `BPF_MAP_TYPE_RINGBUF` with the kernel's layout and protocol (`kernel/bpf/ringbuf.c`,
//! consumer as libbpf's `ringbuf_process_ring`).
//!
//! The data area (`max_entries` bytes, a power of two and a multiple of the page size) is a
//! memfd mapped twice back to back, so a record that wraps past the end is still contiguous
//! in memory. Each record is an 8-byte header `{ u32 len | BUSY | DISCARD, u32 pg_off }`
//! followed by the data, the whole rounded up to 8. The producer, consumer and pending
//! positions live outside the data area: they are bookkeeping a program must not reach.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

use crate::error::errno::{EAGAIN, EINVAL};
use crate::mem::SpinLock;
use crate::{BPF_RB_AVAIL_DATA, BPF_RB_CONS_POS, BPF_RB_PROD_POS, BPF_RB_RING_SIZE};

/// Set in a record's `len` while it is reserved and not yet submitted or discarded.
pub const BPF_RINGBUF_BUSY_BIT: u32 = 1 << 31;
/// Set in a record's `len` when it was discarded: the consumer skips it.
pub const BPF_RINGBUF_DISCARD_BIT: u32 = 1 << 30;
/// Size of a record header.
pub const BPF_RINGBUF_HDR_SZ: u32 = 8;
/// Largest record the kernel reserves (`RINGBUF_MAX_RECORD_SZ`).
const MAX_RECORD: u64 = (u32::MAX / 4) as u64;

/// A position on its own cache line(s), so producers and the consumer do not false-share.
#[repr(align(128))]
struct Pos(AtomicU64);

pub(crate) struct RingBuf {
    base: *mut u8,
    size: usize,
    page_shift: u32,
    /// Serialises producers, as the kernel's `rb->spinlock`.
    lock: SpinLock,
    producer: Pos,
    consumer: Pos,
    /// Oldest record not yet submitted or discarded (kernel `pending_pos`); under `lock`.
    pending: AtomicU64,
    /// One consumer at a time, as libbpf's ring buffer manager assumes.
    consuming: Mutex<()>,
}

// SAFETY: the data area is shared memory the map owns until Drop; the positions are
// atomics; the headers are accessed atomically (see reserve/submit/consume).
unsafe impl Send for RingBuf {}
// SAFETY: as for Send.
unsafe impl Sync for RingBuf {}

impl RingBuf {
    /// Maps `size` bytes twice, back to back. Errors: the failing call and its errno.
    pub fn new(size: usize) -> Result<RingBuf, (&'static str, i32)> {
        let errno = || {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL)
        };
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe { libc::memfd_create(c"packjit-ringbuf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(("memfd_create", errno()));
        }
        let close = |e: (&'static str, i32)| {
            // SAFETY: fd is ours and open.
            unsafe { libc::close(fd) };
            Err(e)
        };
        // SAFETY: fd is a valid memfd.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            return close(("ftruncate", errno()));
        }
        // Reserve 2 * size of address space first, so the two views are adjacent and no
        // other mapping can land between them.
        // SAFETY: a fresh anonymous reservation with no access.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return close(("mmap", errno()));
        }
        for half in 0..2 {
            // SAFETY: MAP_FIXED over our own reservation only.
            let p = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(half * size).cast(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                let e = errno();
                // SAFETY: the reservation is ours.
                unsafe { libc::munmap(base, 2 * size) };
                return close(("mmap", e));
            }
        }
        // SAFETY: the mappings keep the memfd's pages alive; the fd is no longer needed.
        unsafe { libc::close(fd) };
        Ok(RingBuf {
            base: base.cast(),
            size,
            page_shift: crate::mem::page_size().trailing_zeros(),
            lock: SpinLock::new(),
            producer: Pos(AtomicU64::new(0)),
            consumer: Pos(AtomicU64::new(0)),
            pending: AtomicU64::new(0),
            consuming: Mutex::new(()),
        })
    }

    /// Both views: `(start, 2 * size)`.
    pub fn region(&self) -> (*mut u8, usize) {
        (self.base, 2 * self.size)
    }

    #[inline]
    fn mask(&self) -> u64 {
        self.size as u64 - 1
    }

    /// The header word at ring position `pos` (in the first view).
    fn len_word(&self, pos: u64) -> &AtomicU32 {
        // SAFETY: (pos & mask) < size and is 8-aligned (records are multiples of 8); the
        // mapping lives as long as self. Programs may write these bytes too (they are in the
        // region), which can garble this map's records but nothing else.
        unsafe { AtomicU32::from_ptr(self.base.add((pos & self.mask()) as usize).cast()) }
    }

    fn record_len(word: u32) -> u64 {
        ((word & !(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT)) as u64
            + BPF_RINGBUF_HDR_SZ as u64
            + 7)
            & !7
    }

    /// Kernel `__bpf_ringbuf_reserve`; null when flags != 0, the record is too large or
    /// there is no room. As in the kernel, the producer may run at most `size - 1` bytes ahead
    /// of the consumer (and of the oldest pending record), so a ring is never completely full.
    pub fn reserve(&self, size: u64, flags: u64) -> *mut u8 {
        if flags != 0 || size > MAX_RECORD {
            return std::ptr::null_mut();
        }
        let len = (size + BPF_RINGBUF_HDR_SZ as u64 + 7) & !7;
        if len > self.size as u64 {
            return std::ptr::null_mut();
        }
        // Acquire pairs with the consumer's Release: it has finished reading the space it
        // gave back before we overwrite it.
        let cons = self.consumer.0.load(Acquire);
        let _g = self.lock.lock();
        let prod = self.producer.0.load(Relaxed);
        let mut pend = self.pending.load(Relaxed);
        while pend < prod {
            let word = self.len_word(pend).load(Acquire);
            if word & BPF_RINGBUF_BUSY_BIT != 0 {
                break;
            }
            // min: a header a program garbled cannot move pending past the producer.
            pend = (pend + Self::record_len(word)).min(prod);
        }
        self.pending.store(pend, Relaxed);
        let new_prod = prod + len;
        if new_prod - cons > self.mask() || new_prod - pend > self.mask() {
            return std::ptr::null_mut();
        }
        let off = (prod & self.mask()) as usize;
        let pg_off = (off >> self.page_shift) as u32;
        self.len_word(prod)
            .store(size as u32 | BPF_RINGBUF_BUSY_BIT, Relaxed);
        // SAFETY: the pg_off word is the header's second half, inside the first view.
        unsafe { AtomicU32::from_ptr(self.base.add(off + 4).cast()) }.store(pg_off, Relaxed);
        // Release: the consumer that sees the new producer position sees the BUSY header.
        self.producer.0.store(new_prod, Release);
        // SAFETY: data follows the header; the record (even if it wraps) is inside the
        // double mapping.
        unsafe { self.base.add(off + BPF_RINGBUF_HDR_SZ as usize) }
    }

    /// Kernel `bpf_ringbuf_commit`: clears BUSY (and sets DISCARD) with one atomic swap.
    /// A pointer that is not a record's data start in the first view, or a record not busy,
    /// is ignored (the kernel's verifier rules both out).
    pub fn commit(&self, data: *mut u8, discard: bool) {
        let off = (data as usize)
            .wrapping_sub(self.base as usize)
            .wrapping_sub(BPF_RINGBUF_HDR_SZ as usize);
        if off >= self.size || off % 8 != 0 {
            return;
        }
        let word = self.len_word(off as u64);
        let old = word.load(Relaxed);
        if old & BPF_RINGBUF_BUSY_BIT == 0 {
            return;
        }
        let new = (old & !BPF_RINGBUF_BUSY_BIT) | if discard { BPF_RINGBUF_DISCARD_BIT } else { 0 };
        // Release: the record's data, written before, is visible to the consumer's Acquire
        // load of this word.
        word.swap(new, Release);
    }

    /// `bpf_ringbuf_output`: reserve, copy, submit; -EAGAIN when there is no room.
    ///
    /// # Safety
    /// `data` points to `size` readable bytes.
    pub unsafe fn output(&self, data: *const u8, size: u64, flags: u64) -> i64 {
        if flags & !(crate::BPF_RB_NO_WAKEUP | crate::BPF_RB_FORCE_WAKEUP) != 0 {
            return -(EINVAL as i64);
        }
        let rec = self.reserve(size, 0);
        if rec.is_null() {
            return -(EAGAIN as i64);
        }
        // SAFETY: the caller's size bytes into the reserved record of that size.
        unsafe { std::ptr::copy(data, rec, size as usize) };
        self.commit(rec, false);
        0
    }

    pub fn query(&self, flags: u64) -> u64 {
        let cons = self.consumer.0.load(Acquire);
        let prod = self.producer.0.load(Acquire);
        match flags {
            BPF_RB_AVAIL_DATA => prod - cons,
            BPF_RB_RING_SIZE => self.size as u64,
            BPF_RB_CONS_POS => cons,
            BPF_RB_PROD_POS => prod,
            _ => 0,
        }
    }

    /// libbpf's `ringbuf_process_ring`: delivers submitted records in order, skips discarded
    /// ones, stops at the first busy one.
    pub fn consume(&self, f: &mut dyn FnMut(&[u8])) -> usize {
        let _one = self.consuming.lock().unwrap_or_else(|e| e.into_inner());
        let mut cons = self.consumer.0.load(Relaxed);
        let mut n = 0;
        loop {
            // Acquire pairs with reserve's Release: headers up to prod are written.
            let prod = self.producer.0.load(Acquire);
            if cons >= prod {
                return n;
            }
            while cons < prod {
                // Acquire pairs with commit's Release swap: the record's data is written.
                let word = self.len_word(cons).load(Acquire);
                let rec = Self::record_len(word);
                // A header a program garbled (length past the producer) is treated as busy.
                if word & BPF_RINGBUF_BUSY_BIT != 0 || rec > prod - cons {
                    return n;
                }
                if word & BPF_RINGBUF_DISCARD_BIT == 0 {
                    let len = (word & !BPF_RINGBUF_DISCARD_BIT) as usize;
                    let off = (cons & self.mask()) as usize + BPF_RINGBUF_HDR_SZ as usize;
                    // SAFETY: the record lies inside the double mapping (off < size and
                    // len <= size - 8), owned by us until the consumer position passes it.
                    f(unsafe { std::slice::from_raw_parts(self.base.add(off), len) });
                    n += 1;
                }
                cons += rec;
                // Release: producers that see this position see our reads of the record done.
                self.consumer.0.store(cons, Release);
            }
        }
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // SAFETY: both views were mapped by `new` inside this reservation.
        unsafe { libc::munmap(self.base.cast(), 2 * self.size) };
    }
}
