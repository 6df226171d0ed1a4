//! `BPF_MAP_TYPE_QUEUE` (FIFO) and `BPF_MAP_TYPE_STACK` (LIFO): a preallocated ring of
//! `max_entries` values under a mutex (the kernel uses a spin lock the same way). Values
//! are copied in and out, so programs never hold pointers into it.

use std::sync::Mutex;

use crate::error::errno::{E2BIG, EINVAL, ENOENT};
use crate::mem::AllocError;
use crate::{BPF_EXIST, BPF_NOEXIST};

struct Ring {
    buf: Vec<u8>,
    /// Index of the oldest value.
    head: usize,
    len: usize,
}

pub(crate) struct QueueMap {
    ring: Mutex<Ring>,
    value_size: usize,
    cap: usize,
    lifo: bool,
}

impl QueueMap {
    pub fn new(value_size: u32, max_entries: u32, lifo: bool) -> Result<QueueMap, AllocError> {
        let n = crate::mem::bytes(value_size as usize, max_entries as usize)?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(n)
            .map_err(|_| AllocError { bytes: n as u64 })?;
        buf.resize(n, 0);
        Ok(QueueMap {
            ring: Mutex::new(Ring {
                buf,
                head: 0,
                len: 0,
            }),
            value_size: value_size as usize,
            cap: max_entries as usize,
            lifo,
        })
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.ring().len
    }

    /// Kernel `queue_stack_map_push_elem`: BPF_EXIST on a full map overwrites the oldest
    /// value (for a stack too: the bottom one); otherwise full -> -E2BIG.
    ///
    /// # Safety
    /// `value` points to value_size readable bytes.
    pub unsafe fn push(&self, value: *const u8, flags: u64) -> i64 {
        if flags & BPF_NOEXIST != 0 || flags > BPF_EXIST {
            return -(EINVAL as i64);
        }
        let mut r = self.ring();
        if r.len == self.cap {
            if flags & BPF_EXIST == 0 {
                return -(E2BIG as i64);
            }
            r.head = (r.head + 1) % self.cap;
            r.len -= 1;
        }
        let slot = (r.head + r.len) % self.cap;
        let vs = self.value_size;
        // SAFETY: value has value_size readable bytes; the slot is inside buf.
        unsafe { std::ptr::copy(value, r.buf.as_mut_ptr().add(slot * vs), vs) };
        r.len += 1;
        0
    }

    /// Pop (remove) or peek: FIFO takes the oldest, LIFO the newest; empty -> -ENOENT.
    ///
    /// # Safety
    /// `value` points to value_size writable bytes.
    pub unsafe fn take(&self, value: *mut u8, remove: bool) -> i64 {
        let mut r = self.ring();
        if r.len == 0 {
            return -(ENOENT as i64);
        }
        let slot = if self.lifo {
            (r.head + r.len - 1) % self.cap
        } else {
            r.head
        };
        let vs = self.value_size;
        // SAFETY: value has value_size writable bytes; the slot is inside buf.
        unsafe { std::ptr::copy(r.buf.as_ptr().add(slot * vs), value, vs) };
        if remove {
            if !self.lifo {
                r.head = (r.head + 1) % self.cap;
            }
            r.len -= 1;
        }
        0
    }
}
