//! `BPF_MAP_TYPE_ARRAY` and `BPF_MAP_TYPE_PERCPU_ARRAY`: preallocated, zeroed values at a
//! fixed stride, indexed by a `u32` key. Elements always exist, so they cannot be deleted.

use crate::error::errno::{E2BIG, EEXIST, EINVAL};
use crate::mem::{bytes, round8, AllocError, Slab};
use crate::{BPF_EXIST, BPF_F_LOCK, BPF_NOEXIST};

pub(crate) struct ArrayMap {
    values: Slab,
    value_size: usize,
    /// `round_up(value_size, 8)`, the kernel's `elem_size`, so every value is 8-byte aligned.
    stride: usize,
    max_entries: u32,
    /// Copies of the whole array (one per possible CPU for PERCPU_ARRAY, else 1).
    cpus: usize,
    percpu: bool,
}

impl ArrayMap {
    pub fn new(
        value_size: u32,
        max_entries: u32,
        percpu: bool,
        cpus: usize,
    ) -> Result<ArrayMap, AllocError> {
        let stride = round8(value_size as usize);
        let cpus = if percpu { cpus } else { 1 };
        let len = bytes(bytes(stride, max_entries as usize)?, cpus)?;
        Ok(ArrayMap {
            values: Slab::zeroed(len)?,
            value_size: value_size as usize,
            stride,
            max_entries,
            cpus,
            percpu,
        })
    }

    pub fn base(&self) -> *mut u8 {
        self.values.ptr()
    }
    pub fn bytes(&self) -> usize {
        self.values.len()
    }
    pub fn stride(&self) -> usize {
        self.stride
    }
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }
    pub fn cpus(&self) -> usize {
        self.cpus
    }
    pub fn cpu_stride(&self) -> usize {
        if self.percpu {
            self.stride * self.max_entries as usize
        } else {
            0
        }
    }

    /// Value `index` of CPU `cpu` (`cpu < cpus`, `index < max_entries`).
    #[inline]
    pub fn slot(&self, index: u32, cpu: usize) -> *mut u8 {
        debug_assert!(index < self.max_entries && cpu < self.cpus);
        // SAFETY: in bounds of the slab by the caller's checks (debug-asserted above).
        unsafe {
            self.values
                .ptr()
                .add((cpu * self.max_entries as usize + index as usize) * self.stride)
        }
    }

    /// # Safety
    /// `key` points to 4 readable bytes.
    #[inline]
    pub unsafe fn lookup(&self, key: *const u8, cpu: usize) -> *mut u8 {
        // SAFETY: the caller guarantees 4 readable bytes.
        let index = unsafe { key.cast::<u32>().read_unaligned() };
        if index >= self.max_entries {
            return std::ptr::null_mut();
        }
        self.slot(index, if self.percpu { cpu } else { 0 })
    }

    /// Kernel `array_map_update_elem` / `bpf_percpu_array_update`, in the kernel's order of
    /// checks. `cpu: Some(c)` writes only CPU c's copy (program side); `None` writes every
    /// CPU's copy from `cpus` values at `stride` (syscall side).
    ///
    /// # Safety
    /// `key` points to 4 readable bytes, `value` to `value_size` (or, with `None` on a
    /// per-CPU array, `cpus * stride`) readable bytes.
    pub unsafe fn update(
        &self,
        key: *const u8,
        value: *const u8,
        flags: u64,
        cpu: Option<usize>,
    ) -> i64 {
        // Per-CPU arrays have no BPF_F_LOCK: any flag above BPF_EXIST is invalid there.
        let bad = if self.percpu {
            flags > BPF_EXIST
        } else {
            flags & !BPF_F_LOCK > BPF_EXIST
        };
        if bad {
            return -(EINVAL as i64);
        }
        // SAFETY: the caller guarantees 4 readable bytes.
        let index = unsafe { key.cast::<u32>().read_unaligned() };
        if index >= self.max_entries {
            return -(E2BIG as i64);
        }
        if flags & BPF_NOEXIST != 0 {
            // Every element of an array always exists.
            return -(EEXIST as i64);
        }
        if flags & BPF_F_LOCK != 0 {
            // Values carry no bpf_spin_lock (no BTF), as the kernel refuses then.
            return -(EINVAL as i64);
        }
        match cpu {
            Some(c) => {
                let c = if self.percpu { c } else { 0 };
                // SAFETY: value has value_size readable bytes; the slot has stride >= value_size.
                unsafe { std::ptr::copy(value, self.slot(index, c), self.value_size) };
            }
            None => {
                for c in 0..self.cpus {
                    // SAFETY: the caller passes cpus values at `stride`; the slot is in bounds.
                    unsafe {
                        std::ptr::copy(
                            value.add(c * self.stride),
                            self.slot(index, c),
                            self.value_size,
                        )
                    };
                }
            }
        }
        0
    }

    /// Kernel `array_map_get_next_key`: no key or one out of range -> 0; the last -> none.
    pub fn next_key(&self, key: Option<u32>) -> Option<u32> {
        match key {
            Some(i) if i < self.max_entries => {
                if i == self.max_entries - 1 {
                    None
                } else {
                    Some(i + 1)
                }
            }
            _ => Some(0),
        }
    }

    /// Copies index `i`'s value(s) out: one value, or for a per-CPU array every CPU's value at
    /// `stride` (padding zeroed), as the syscall API does.
    pub fn read(&self, index: u32) -> Vec<u8> {
        let mut out = vec![
            0u8;
            if self.percpu {
                self.cpus * self.stride
            } else {
                self.value_size
            }
        ];
        for c in 0..self.cpus {
            // SAFETY: slot is in bounds with value_size bytes; out has room at c * stride.
            unsafe {
                std::ptr::copy(
                    self.slot(index, c),
                    out.as_mut_ptr().add(c * self.stride),
                    self.value_size,
                )
            };
        }
        out
    }

    /// `bpf_for_each_map_elem` over every index, counting the element that stopped it.
    pub fn for_each(&self, cpu: usize, f: &mut dyn FnMut(*const u8, *mut u8) -> bool) -> u64 {
        let cpu = if self.percpu { cpu } else { 0 };
        let mut n = 0;
        for i in 0..self.max_entries {
            n += 1;
            let key = i;
            if !f((&key as *const u32).cast(), self.slot(i, cpu)) {
                break;
            }
        }
        n
    }
}
