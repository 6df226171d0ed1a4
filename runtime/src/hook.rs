//! Attach points: a slot holding the program a host event runs, swappable while other
//! threads are running through it, alone or in batches.

use crate::{
    program_box, run_pin, Error, ErrorKind, LoadOptions, PackedArena, Program, RunError, Runtime,
};
use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned, Shared};
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

fn check_attachable(prog: &Program) -> Result<(), Error> {
    if prog.is_executable() {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::NotExecutable,
            format!(
                "cannot attach {} (compiled for {})",
                prog.name(),
                prog.arch()
            ),
        ))
    }
}

/// Retires replaced programs with ONE deferred function for all of them: a single grace
/// period, after which they go to their arena's next call to be released together (no
/// second grace period; see [`PackedArena::after_grace`] for why not in the callback).
/// Returns their arenas, each once, for the compaction step (see [`settle`]).
fn retire(old: Vec<Shared<'_, Program>>, guard: &Guard) -> Vec<PackedArena> {
    // Their arenas, each once: see the end.
    let mut arenas: Vec<PackedArena> = Vec::new();
    let old: Vec<usize> = old
        .into_iter()
        .filter(|s| !s.is_null())
        .map(|s| {
            // SAFETY: non-null and not yet destroyed: destruction is what we schedule below.
            let prog = unsafe { s.deref() };
            prog.note_retiring();
            if let Some(a) = prog.packed_arena() {
                if !arenas.iter().any(|k| k.is_same(a)) {
                    arenas.push(a.clone());
                }
            }
            s.as_raw() as usize
        })
        .collect();
    if old.is_empty() {
        return arenas;
    }
    // SAFETY: every pointer came out of a hook slot by a swap, so it is unreachable from the
    // slots now, and only this closure owns it. The closure runs after every thread pinned
    // before the swap has unpinned, i.e. when no `run` can still hold the program.
    // `Owned::from_raw` takes back the Box that `Owned::from` leaked into the slot.
    unsafe {
        guard.defer_unchecked(move || {
            let progs = old
                .into_iter()
                .map(|raw| Owned::from_raw(raw as *mut Program).into_box())
                .collect();
            Program::drop_many_after_grace(progs);
        });
    }
    // Hand the deferred function to the global queue now, so reclamation does not wait for
    // this thread's local bag to fill.
    guard.flush();
    arenas
}

/// What a free does after its flush, for the arenas a swap retired code from: release what is
/// past its grace period (earlier retirements, often ended by the swap's flush) and take the
/// compaction step for the holes, so that a host retiring code only through hooks compacts
/// too (loads do not step for releases).
fn settle(arenas: Vec<PackedArena>) {
    for a in arenas {
        a.release_due();
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
        check_attachable(&prog)?;
        let guard = epoch::pin();
        let old = self.swap(Some(Owned::from(program_box::boxed(prog))), &guard);
        let arenas = retire(vec![old], &guard);
        drop(guard);
        settle(arenas);
        Ok(())
    }

    /// Detaches the current program, if any.
    pub fn detach(&self) {
        let guard = epoch::pin();
        let old = self.swap(None, &guard);
        let arenas = retire(vec![old], &guard);
        drop(guard);
        settle(arenas);
    }

    fn swap<'g>(&self, new: Option<Owned<Program>>, guard: &'g Guard) -> Shared<'g, Program> {
        let new = match new {
            Some(p) => p.into_shared(guard),
            None => Shared::null(),
        };
        self.slot.swap(new, AcqRel, guard)
    }

    /// Whether a program is attached.
    pub fn is_attached(&self) -> bool {
        let guard = epoch::pin();
        !self.slot.load(Acquire, &guard).is_null()
    }

    /// Runs the attached program on `mem`: `None` when nothing is attached, otherwise what
    /// the program returned (r0) or why it stopped.
    // Inline: out of line, its `Option<Result<..>>` went back through memory in pieces that
    // the caller read back as one wider block, a failed store-forward per run (+6 ns, perf).
    #[inline]
    pub fn run(&self, mem: &mut [u8]) -> Option<Result<u64, RunError>> {
        self.run_pinned(mem, &run_pin::enter())
    }

    /// [`run`](Self::run) for a caller that already holds a run pin (the C API, which takes
    /// it before reading its hook handle).
    #[inline]
    pub fn run_pinned(
        &self,
        mem: &mut [u8],
        pin: &run_pin::RunPin,
    ) -> Option<Result<u64, RunError>> {
        // A run pin, not the epoch: a retired program is dropped at its arena's first call
        // after the epoch's grace period AND the end of the runs in progress then (see
        // `retire` and `run_pin`), so the program this load returns outlives the run.
        // Not through `attached_pinned`: that shape made the optimiser copy the `Result`
        // into the `Option` in pieces a wider load read back (a failed store-forward per
        // run, perf).
        // SAFETY: `unprotected` only lends the load a guard; what keeps the program alive is
        // the run pin taken before the load (see above), not the guard.
        let shared = self.slot.load(Acquire, unsafe { epoch::unprotected() });
        // SAFETY: non-null pointers in the slot are live Programs (see above).
        let prog = unsafe { shared.as_ref() }?;
        // The common case apart from the others, whose results would otherwise share its
        // memory (see `Program::call_raw_outermost`).
        // SAFETY: `mem` is memory the program may read and write (a safe borrow).
        if let Some(r) = unsafe { prog.call_raw_outermost(mem.as_mut_ptr(), mem.len(), pin) } {
            return Some(r);
        }
        let budget = prog.run_budget();
        // SAFETY: as above.
        Some(unsafe { prog.run_pinned(mem.as_mut_ptr(), mem.len(), budget, pin) })
    }

    /// The attached program, for a run under `pin`: valid while both the hook and the pin
    /// live. For a caller that wants the program's own `Result` rather than
    /// [`run_pinned`](Self::run_pinned)'s `Option` of it (the C API: that `Option` was
    /// written in 8-byte pieces and read back as one 16-byte block, a failed store-forward
    /// on every `packjit_hook_run`; perf, issue 43).
    #[inline]
    pub fn attached_pinned<'a>(&'a self, _pin: &'a run_pin::RunPin) -> Option<&'a Program> {
        // A run pin, not the epoch: a retired program is dropped at its arena's first call
        // after the epoch's grace period AND the end of the runs in progress then (see
        // `retire` and `run_pin`), so the program this load returns outlives the pin.
        // SAFETY: `unprotected` only lends the load a guard; what keeps the program alive is
        // the run pin taken before the load (see above), not the guard.
        let shared = self.slot.load(Acquire, unsafe { epoch::unprotected() });
        // SAFETY: non-null pointers in the slot are live Programs (see above), for as long
        // as the pin is held.
        unsafe { shared.as_ref() }
    }

    /// Id and name of the attached program.
    pub fn attached(&self) -> Option<(u64, String)> {
        let guard = epoch::pin();
        let shared = self.slot.load(Acquire, &guard);
        // SAFETY: as in `run`.
        unsafe { shared.as_ref() }.map(|p| (p.id(), p.name().to_string()))
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Attaches and detaches many programs on many hooks in one step: one arena commit for the
/// code loaded into the batch and one grace period for everything the batch replaces (the
/// userspace analogue of the kernel's batched attach with delayed free).
///
/// Each hook switches atomically; the batch as a whole does not (a thread running two hooks
/// while the batch applies may see one old and one new program). If a hook appears twice, the
/// later operation wins and the program from the earlier one is retired with the rest.
///
/// ```no_run
/// # use packjit::{Hook, HookBatch, LoadOptions, Runtime};
/// # let rt = Runtime::new()?;
/// let hooks: Vec<Hook> = (0..100).map(|_| Hook::new()).collect();
/// let mut batch = HookBatch::new();
/// for h in &hooks {
///     batch.load_attach(&rt, h, &[0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0],
///                       &LoadOptions::default())?;
/// }
/// let replaced = batch.apply(); // one commit, 100 swaps, one deferred free
/// # Ok::<(), packjit::Error>(())
/// ```
#[derive(Default)]
pub struct HookBatch<'h> {
    /// Programs are boxed as they are queued: the box is what the hook's slot holds.
    ops: Vec<(&'h Hook, Option<Owned<Program>>)>,
    /// Set when the batch holds code that still needs its commit.
    uncommitted: Option<PackedArena>,
}

impl<'h> HookBatch<'h> {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues attaching `prog` (already loaded) to `hook`. Fails at once, queuing nothing, if
    /// `prog` cannot run here.
    pub fn attach(&mut self, hook: &'h Hook, prog: Program) -> Result<&mut Self, Error> {
        check_attachable(&prog)?;
        self.ops
            .push((hook, Some(Owned::from(program_box::boxed(prog)))));
        Ok(self)
    }

    /// Compiles `code` (sandboxed, as [`Runtime::load`]) WITHOUT committing it and queues
    /// attaching it to `hook`; [`apply`] commits every such program with one arena commit
    /// before the first swap.
    ///
    /// [`apply`]: Self::apply
    pub fn load_attach(
        &mut self,
        rt: &Runtime,
        hook: &'h Hook,
        code: &[u8],
        opts: &LoadOptions,
    ) -> Result<&mut Self, Error> {
        self.load_attach_as(rt, hook, code, opts, crate::Trust::Sandboxed)
    }

    /// [`load_attach`](Self::load_attach) for trusted (unchecked) code.
    ///
    /// # Safety
    /// As [`Runtime::load_trusted`]: the program must only touch memory it may.
    pub unsafe fn load_attach_trusted(
        &mut self,
        rt: &Runtime,
        hook: &'h Hook,
        code: &[u8],
        opts: &LoadOptions,
    ) -> Result<&mut Self, Error> {
        self.load_attach_as(rt, hook, code, opts, crate::Trust::Trusted)
    }

    fn load_attach_as(
        &mut self,
        rt: &Runtime,
        hook: &'h Hook,
        code: &[u8],
        opts: &LoadOptions,
        trust: crate::Trust,
    ) -> Result<&mut Self, Error> {
        let prog = rt.load_uncommitted(code, opts, trust)?;
        check_attachable(&prog)?;
        if let Some(a) = prog.packed_arena() {
            self.uncommitted = Some(a.clone());
        }
        self.ops
            .push((hook, Some(Owned::from(program_box::boxed(prog)))));
        Ok(self)
    }

    /// Queues detaching whatever `hook` holds when the batch applies.
    pub fn detach(&mut self, hook: &'h Hook) -> &mut Self {
        self.ops.push((hook, None));
        self
    }

    /// Queued operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commits the batch's code once, performs every swap, and retires all replaced
    /// programs with one deferred free. Returns how many programs were replaced or detached.
    pub fn apply(mut self) -> usize {
        let committed = self.uncommitted.take();
        if let Some(a) = &committed {
            // Before any swap: no thread may reach code that is not yet executable/coherent.
            // The compaction step for what earlier swaps released shares this commit.
            a.commit_settling_releases();
        }
        let guard = epoch::pin();
        let old: Vec<_> = std::mem::take(&mut self.ops)
            .into_iter()
            .map(|(hook, prog)| hook.swap(prog, &guard))
            .filter(|s| !s.is_null())
            .collect();
        let n = old.len();
        let mut arenas = retire(old, &guard);
        drop(guard);
        // The arena this batch committed in steps at the next batch's commit (or free), so
        // that each batch commits once; any other steps now, as after a single swap.
        arenas.retain(|a| !committed.as_ref().is_some_and(|c| c.is_same(a)));
        settle(arenas);
        n
    }
}

impl Runtime {
    /// Attaches each program to its hook as one batch (see [`HookBatch`]): one grace period
    /// for everything replaced. Nothing is attached if any program cannot run here.
    pub fn attach_batch<'h>(
        &self,
        items: impl IntoIterator<Item = (&'h Hook, Program)>,
    ) -> Result<usize, Error> {
        let items = items.into_iter();
        let mut batch = HookBatch::new();
        batch.ops.reserve(items.size_hint().0);
        for (hook, prog) in items {
            batch.attach(hook, prog)?;
        }
        Ok(batch.apply())
    }

    /// Detaches every hook in `hooks` with one grace period for all of them.
    pub fn detach_batch<'h>(&self, hooks: impl IntoIterator<Item = &'h Hook>) -> usize {
        let mut batch = HookBatch::new();
        for h in hooks {
            batch.detach(h);
        }
        batch.apply()
    }
}
