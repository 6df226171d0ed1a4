//! Attach points: a slot holding the program a host event runs, swappable while other
//! threads are running through it.

use crate::{Error, ErrorKind, Program};
use crossbeam_epoch::{self as epoch, Atomic, Owned};
use std::sync::atomic::Ordering::{AcqRel, Acquire};

/// A hook: `run` executes whatever program is attached at that moment. `attach` and
/// `detach` never wait for running threads; the replaced program is freed once every thread
/// that could still be inside it has left (epoch-based reclamation, like the kernel's RCU
/// free of BPF programs).
pub struct Hook {
    slot: Atomic<Program>,
}

impl Default for Hook {
    fn default() -> Self {
        Self::new()
    }
}

impl Hook {
    /// An empty hook.
    pub fn new() -> Self {
        Self {
            slot: Atomic::null(),
        }
    }

    /// Attaches `prog` (which must be executable), replacing and retiring any previous one.
    pub fn attach(&self, prog: Program) -> Result<(), Error> {
        if !prog.is_executable() {
            return Err(Error::new(
                ErrorKind::NotExecutable,
                format!("cannot attach a program compiled for {}", prog.arch()),
            ));
        }
        self.swap(Some(prog));
        Ok(())
    }

    /// Detaches the current program, if any.
    pub fn detach(&self) {
        self.swap(None);
    }

    fn swap(&self, new: Option<Program>) {
        let guard = epoch::pin();
        let new = match new {
            Some(p) => Owned::new(p).into_shared(&guard),
            None => epoch::Shared::null(),
        };
        let old = self.slot.swap(new, AcqRel, &guard);
        if !old.is_null() {
            // SAFETY: `old` is unreachable from the slot now; threads still holding it are
            // pinned, so destruction waits for them.
            unsafe { guard.defer_destroy(old) };
        }
    }

    /// Whether a program is attached.
    pub fn is_attached(&self) -> bool {
        let guard = epoch::pin();
        !self.slot.load(Acquire, &guard).is_null()
    }

    /// Runs the attached program on `mem`; `None` when nothing is attached.
    pub fn run(&self, mem: &mut [u8]) -> Option<u64> {
        let guard = epoch::pin();
        let shared = self.slot.load(Acquire, &guard);
        // SAFETY: non-null pointers in the slot are live Programs protected by our pin.
        let prog = unsafe { shared.as_ref() }?;
        prog.call(mem).ok()
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.detach();
    }
}
