//! Per-thread reuse of a compile's buffers (all but the small ones).
//!
//! A compile allocates a handful of buffers with one entry per instruction (decoded
//! instructions, labels, code offsets, branch sites) and drops them when it returns. For a
//! large program each is megabytes: the allocator maps fresh pages for it and gives them back
//! to the kernel when it is dropped, so the next large compile faults every page in again.
//! At 1 M instructions those page faults took a third of the compile. Here a dropped buffer
//! of at least [`REUSE_MIN_BYTES`] stays with its thread, and the next compile on the thread
//! that needs a buffer of that element type takes it instead of fresh memory.
//!
//! Medium buffers are kept too: from about 1 KB, past the largest size glibc's per-thread
//! cache serves, each `malloc` goes to the shared bins and first consolidates every freed
//! small chunk, and each `free` sorts the chunk back; for a program of a hundred
//! instructions, whose handful of buffers are a few KB each, that was a few percent of
//! its load. Smaller buffers are left to the allocator, whose per-thread cache serves them
//! cheaply. A thread keeps at most [`SPARES_PER_TYPE`] buffers per element type (a compile
//! holds a few of one type at once), each no larger than its largest compile needed; for the
//! largest program ([`crate::MAX_INSNS`]) that is about 100 MB over all types.
//! [`release_thread_spares`] gives them back, e.g. when a thread is done compiling, and a
//! thread's spares go when it exits. Each copy of this crate keeps its own: a backend
//! loaded as a plugin library has its own copy, apart from the host's.
//!
//! ```
//! use packjit_frontend::reuse;
//! let mut offsets = reuse::take::<u64>(1 << 20);
//! offsets.extend(0..1 << 20);
//! let first = offsets.as_ptr();
//! drop(offsets);
//! // The next buffer of that type on this thread is the same memory.
//! let next = reuse::take::<u64>(1 << 17);
//! assert_eq!(next.as_ptr(), first);
//! reuse::release_thread_spares();
//! ```

use dynasmrt::relocations::Relocation;
use dynasmrt::{DynasmApi, DynasmError, VecAssembler};
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers at least this large are kept for reuse; smaller ones come from the allocator.
pub const REUSE_MIN_BYTES: usize = 1 << 10;

/// Spare buffers a thread keeps per element type.
pub const SPARES_PER_TYPE: usize = 4;

thread_local! {
    /// This thread's spares: per element type, a `Vec<Vec<T>>` (boxed as `Any`). Looked up
    /// by a scan: a handful of types, and only for large buffers.
    static SPARES: RefCell<Vec<(TypeId, Box<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

#[inline]
fn is_large<T>(elements: usize) -> bool {
    elements.saturating_mul(std::mem::size_of::<T>()) >= REUSE_MIN_BYTES
}

/// An empty vector with room for `n` elements: for a large `n`, one this thread kept (the
/// smallest that holds `n`, else the largest, grown). Return it with [`give_back`] (or use
/// [`take`], which does that on drop).
// Inlined with the small case, which is every compile of an ordinary program: a plain
// `with_capacity`, no thread-local access.
#[inline]
pub fn take_vec<T: 'static>(n: usize) -> Vec<T> {
    if is_large::<T>(n) {
        take_kept_vec(n)
    } else {
        Vec::with_capacity(n)
    }
}

#[cold]
#[inline(never)]
fn take_kept_vec<T: 'static>(n: usize) -> Vec<T> {
    // `try_with`: nothing during thread teardown; `try_borrow_mut`: never re-entered (an
    // element's destructor does not compile), but a fresh vector is the safe answer.
    let kept = SPARES
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let (_, list) = s.iter_mut().find(|(t, _)| *t == TypeId::of::<T>())?;
            let list = list.downcast_mut::<Vec<Vec<T>>>()?;
            let fits = list
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= n)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            let i = fits.or_else(|| list.len().checked_sub(1))?;
            Some(list.swap_remove(i))
        })
        .ok()
        .flatten();
    match kept {
        Some(mut v) => {
            v.reserve(n);
            v
        }
        None => Vec::with_capacity(n),
    }
}

/// A vector of `n` copies of `value`: a kept buffer filled when `n` is large, else fresh
/// (where the allocator hands out zeroed pages for a zero `value` without touching them).
#[inline]
pub fn filled<T: Clone + 'static>(n: usize, value: T) -> Vec<T> {
    if is_large::<T>(n) {
        let mut v = take_vec(n);
        v.resize(n, value);
        v
    } else {
        vec![value; n]
    }
}

/// Keeps `v`'s memory for the next [`take_vec`] of its type on this thread, if it is large
/// (its elements are dropped now). When the thread already keeps [`SPARES_PER_TYPE`] of
/// them, the smallest goes.
#[inline]
pub fn give_back<T: 'static>(v: Vec<T>) {
    if is_large::<T>(v.capacity()) {
        keep_vec(v);
    }
}

#[cold]
#[inline(never)]
fn keep_vec<T: 'static>(mut v: Vec<T>) {
    v.clear();
    let _ = SPARES.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        let list = match s.iter_mut().position(|(t, _)| *t == TypeId::of::<T>()) {
            Some(i) => &mut s[i].1,
            None => {
                s.push((TypeId::of::<T>(), Box::new(Vec::<Vec<T>>::new())));
                &mut s.last_mut().expect("just pushed").1
            }
        };
        let Some(list) = list.downcast_mut::<Vec<Vec<T>>>() else {
            return;
        };
        list.push(v);
        if list.len() > SPARES_PER_TYPE {
            let smallest = (0..list.len())
                .min_by_key(|&i| list[i].capacity())
                .expect("not empty");
            list.swap_remove(smallest);
        }
    });
}

/// `kept` emptied with room for `n` elements, for a caller that keeps its own small buffers
/// per thread (a typed slot, no lookup: see `verify::DecodeBuffers`); a large `n` goes
/// through [`take_vec`] as usual.
#[inline]
pub(crate) fn take_from<T: 'static>(kept: &mut Vec<T>, n: usize) -> Vec<T> {
    if is_large::<T>(n) {
        return take_vec(n);
    }
    let mut v = std::mem::take(kept);
    v.clear();
    v.reserve(n);
    v
}

/// Gives `v` back after [`take_from`]: a large one to this thread's spares ([`give_back`]),
/// a small one into `kept` unless that already holds more.
#[inline]
pub(crate) fn give_back_to<T: 'static>(kept: &mut Vec<T>, mut v: Vec<T>) {
    if is_large::<T>(v.capacity()) {
        keep_vec(v);
    } else if v.capacity() > kept.capacity() {
        v.clear();
        *kept = v;
    }
}

/// Frees every buffer this thread keeps for reuse.
pub fn release_thread_spares() {
    let _ = SPARES.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.clear();
        }
    });
}

/// Keeps `value` (one per type) for the next [`take_kept`] of its type on this thread,
/// replacing any kept before.
#[cold]
fn keep<T: 'static>(value: T) {
    let _ = SPARES.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        let key = TypeId::of::<Kept<T>>();
        match s.iter_mut().find(|(t, _)| *t == key) {
            Some((_, slot)) => *slot = Box::new(Kept(Some(value))),
            None => s.push((key, Box::new(Kept(Some(value))))),
        }
    });
}

/// The value of type `T` this thread kept with [`keep`], if any.
#[cold]
fn take_kept<T: 'static>() -> Option<T> {
    SPARES
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            let (_, slot) = s.iter_mut().find(|(t, _)| *t == TypeId::of::<Kept<T>>())?;
            slot.downcast_mut::<Kept<T>>()?.0.take()
        })
        .ok()
        .flatten()
}

/// A kept value (its own type key, apart from vectors of `T`).
struct Kept<T>(Option<T>);

/// A dynasm assembler with room for `code` bytes, `labels` dynamic labels and `relocations`
/// label references: for large code, the one this thread kept from its last large compile
/// (see [`assembled`]), whose code, label and relocation buffers are already faulted in.
#[inline]
pub fn assembler<R: Relocation + 'static>(
    code: usize,
    labels: usize,
    relocations: usize,
) -> VecAssembler<R> {
    if code >= REUSE_MIN_BYTES {
        if let Some(mut asm) = take_kept::<VecAssembler<R>>() {
            asm.reserve_ops(code);
            return asm;
        }
    }
    VecAssembler::new_with_capacity(0, code, 0, 0, labels, 0, relocations)
}

/// The finished code of `asm` (relocations resolved). Large code is copied into a reused
/// buffer and the emptied assembler is kept for the next [`assembler`] on this thread.
#[inline]
pub fn assembled<R: Relocation + 'static>(asm: VecAssembler<R>) -> Result<Reused<u8>, DynasmError> {
    if asm.offset().0 < REUSE_MIN_BYTES {
        return Ok(Reused(asm.finalize()?));
    }
    assembled_large(asm)
}

#[cold]
#[inline(never)]
fn assembled_large<R: Relocation + 'static>(
    mut asm: VecAssembler<R>,
) -> Result<Reused<u8>, DynasmError> {
    let len = asm.offset().0;
    let mut code = take(len);
    code.extend(asm.drain()?);
    keep(asm);
    Ok(code)
}

/// A vector from [`take_vec`] that goes back to this thread's spares when dropped.
#[derive(Debug)]
pub struct Reused<T: 'static>(Vec<T>);

/// [`take_vec`] as a [`Reused`]: given back when dropped.
#[inline]
pub fn take<T: 'static>(n: usize) -> Reused<T> {
    Reused(take_vec(n))
}

impl<T: 'static> Reused<T> {
    /// The vector, no longer given back on drop.
    pub fn into_vec(mut self) -> Vec<T> {
        std::mem::take(&mut self.0)
    }
}

impl<T: 'static> Drop for Reused<T> {
    #[inline]
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

impl<T: 'static> Deref for Reused<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T: 'static> DerefMut for Reused<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T: 'static> AsRef<[T]> for Reused<T> {
    fn as_ref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Clone + 'static> Clone for Reused<T> {
    fn clone(&self) -> Self {
        Reused(self.0.clone())
    }
}

impl<T: PartialEq + 'static> PartialEq for Reused<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T: Eq + 'static> Eq for Reused<T> {}

impl<T: PartialEq + 'static> PartialEq<Vec<T>> for Reused<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.0 == *other
    }
}

impl<T: PartialEq + 'static, const N: usize> PartialEq<[T; N]> for Reused<T> {
    fn eq(&self, other: &[T; N]) -> bool {
        self.0 == other
    }
}

impl<'a, T: 'static> IntoIterator for &'a Reused<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T: 'static> Default for Reused<T> {
    fn default() -> Self {
        Reused(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LARGE: usize = REUSE_MIN_BYTES / 8;

    #[test]
    fn large_buffers_come_back_and_small_ones_do_not() {
        release_thread_spares();
        let big = take::<u64>(LARGE);
        let big_ptr = big.as_ptr();
        drop(big);
        let small = take::<u64>(10);
        assert_ne!(
            small.as_ptr(),
            big_ptr,
            "small requests go to the allocator"
        );
        let again = take::<u64>(LARGE);
        assert_eq!(
            again.as_ptr(),
            big_ptr,
            "a large request takes the kept buffer"
        );
        drop(again);
        // Another element type does not see it.
        let other = take_vec::<u32>(LARGE * 2);
        assert_ne!(other.as_ptr() as usize, big_ptr as usize);
        drop(other);
        // Small buffers are not kept.
        release_thread_spares();
        let small = take_vec::<u64>(16);
        give_back(small);
        SPARES.with(|s| assert!(s.borrow().is_empty()));
    }

    #[test]
    fn the_smallest_buffer_that_fits_is_taken_and_at_most_four_are_kept() {
        release_thread_spares();
        let sizes = [LARGE, 2 * LARGE, 3 * LARGE, 4 * LARGE, 5 * LARGE];
        let bufs: Vec<Vec<u64>> = sizes.iter().map(|&n| take_vec(n)).collect();
        for b in bufs {
            give_back(b);
        }
        SPARES.with(|s| {
            let s = s.borrow();
            let list = s[0].1.downcast_ref::<Vec<Vec<u64>>>().unwrap();
            assert_eq!(list.len(), SPARES_PER_TYPE, "the smallest was dropped");
            assert!(list.iter().all(|v| v.capacity() >= 2 * LARGE));
        });
        let v = take_vec::<u64>(3 * LARGE - 5);
        assert!(v.capacity() >= 3 * LARGE && v.capacity() < 4 * LARGE);
        assert!(v.is_empty());
        // Larger than every spare: the largest is taken and grown.
        let w = take_vec::<u64>(6 * LARGE);
        assert!(w.capacity() >= 6 * LARGE);
        SPARES.with(|s| {
            let s = s.borrow();
            let list = s[0].1.downcast_ref::<Vec<Vec<u64>>>().unwrap();
            assert_eq!(list.len(), 2);
        });
        release_thread_spares();
    }

    #[test]
    fn elements_are_dropped_when_a_buffer_is_given_back() {
        release_thread_spares();
        let counter = std::rc::Rc::new(());
        let mut v = take_vec::<(std::rc::Rc<()>, [u8; 4096])>(LARGE / 512);
        v.push((counter.clone(), [0; 4096]));
        assert_eq!(std::rc::Rc::strong_count(&counter), 2);
        give_back(v);
        assert_eq!(std::rc::Rc::strong_count(&counter), 1);
        release_thread_spares();
    }
}
