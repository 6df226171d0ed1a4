//! Running compiled code: the per-run [`PjExecEnv`], turning a stop into a [`RunError`], and
//! the pointer checks helpers use to honour the sandbox.
//!
//! The emitted code only ever sees the environment through its fixed `PJ_ENV_*` offsets; this
//! module is the one place the host fills it and reads it back.

use crate::{run_pin, Trust};
use packjit_plugin_api::abi::*;
use packjit_plugin_api::{AccessDirection, Arch, PjProgramEntry, Stop, StopKind};
use std::cell::Cell;
use std::fmt;

/// Why a run returned no result: what [`Program::call`](crate::Program::call) and the other
/// ways of running a program ([`Hook::run`](crate::Hook::run), the
/// [`rbpf_bridge`](crate::rbpf_bridge)'s `execute_program*`) fail with. Loading and compiling
/// fail with [`Error`](crate::Error) instead.
///
/// ```
/// use packjit::{RunError, Stop, StopKind};
/// let e = RunError::from(Stop::Budget { pc: 3 });
/// assert_eq!(e.stop().map(|s| s.kind()), Some(StopKind::Budget));
/// assert_eq!(e.to_string(), "pc 3: instruction budget exhausted");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunError {
    /// The program stopped: a refused memory access, an exhausted budget or a `callx` to an
    /// unregistered helper id, with the pc and the details.
    Stop(Stop),
    /// The program was compiled for another architecture: it cannot run on this host.
    NotExecutable {
        /// The architecture the code was compiled for.
        arch: Arch,
    },
    /// The code reported a stop kind the runtime does not know (a backend bug).
    UnknownStop {
        /// The `PJ_STOP_*` value the code wrote.
        kind: u32,
        /// The pc it named.
        pc: usize,
    },
}

impl RunError {
    /// The stop, when the program stopped.
    pub fn stop(&self) -> Option<Stop> {
        match self {
            RunError::Stop(s) => Some(*s),
            _ => None,
        }
    }

    /// The eBPF pc the run ended at, when it ended at one.
    pub fn pc(&self) -> Option<usize> {
        match self {
            RunError::Stop(s) => Some(s.pc()),
            RunError::UnknownStop { pc, .. } => Some(*pc),
            RunError::NotExecutable { .. } => None,
        }
    }
}

impl From<Stop> for RunError {
    fn from(s: Stop) -> Self {
        RunError::Stop(s)
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Stop(s) => s.fmt(f),
            RunError::NotExecutable { arch } => write!(
                f,
                "program was compiled for {arch}, this host is {}",
                Arch::host().map_or("unknown", |a| a.name())
            ),
            RunError::UnknownStop { kind, pc } => {
                write!(f, "pc {pc}: program stopped with unknown stop kind {kind}")
            }
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Stop(s) => Some(s),
            _ => None,
        }
    }
}

/// Who may write a host region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionAccess {
    /// Programs may read it only (ELF `.rodata`, lookup tables).
    ReadOnly,
    /// Programs may read and write it (ELF `.data` / `.bss`, shared counters).
    ReadWrite,
}

/// Host memory a sandboxed program may touch besides its context and stack.
///
/// Built only through the `unsafe` [`MemRegion::new`]: handing a region to a program is a
/// promise about memory the type system cannot see, so safe code cannot make one up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemRegion {
    start: u64,
    len: u64,
    access: RegionAccess,
}

impl MemRegion {
    /// A region of `len` bytes at `start`.
    ///
    /// # Safety
    /// The memory must stay valid for every program given the region, for as long as such a
    /// program can run; for [`RegionAccess::ReadWrite`] programs may write it at any time
    /// during a run, so no Rust reference to it may be live across a call (use raw pointers
    /// or `UnsafeCell`).
    pub unsafe fn new(start: *const u8, len: usize, access: RegionAccess) -> Self {
        Self {
            start: start as u64,
            len: len as u64,
            access,
        }
    }

    /// First byte.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Read-only or read-write.
    pub fn access(&self) -> RegionAccess {
        self.access
    }

    /// The ABI form emitted code scans.
    pub fn to_abi(self) -> PjMemRegion {
        PjMemRegion {
            start: self.start,
            len: self.len,
            flags: match self.access {
                RegionAccess::ReadOnly => 0,
                RegionAccess::ReadWrite => PJ_REGION_WRITABLE,
            },
        }
    }
}

thread_local! {
    /// The environment of the program this thread is running (innermost, if a helper runs
    /// another program), for [`helper_access_ok`], with [`TRUSTED_BIT`] set when that
    /// program is trusted (its helpers then take its pointers as they are). One word, so a
    /// run saves, sets and restores one thread-local instead of two (issue 43).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Set in [`CURRENT`] for a trusted run; free because a `PjExecEnv` is 8-byte aligned.
const TRUSTED_BIT: usize = 1;
/// [`CURRENT`] while an interpreter runs inside a run's helper: no JIT environment is
/// current, but a run is in progress, so a JIT run started inside it builds its own
/// environment rather than take the thread's ([`run_outermost`]).
const NO_JIT_ENV: usize = 2;
const _: () = assert!(std::mem::align_of::<PjExecEnv>() > (TRUSTED_BIT | NO_JIT_ENV));

/// Restores the previous current environment when a run ends, even by unwinding.
struct CurrentEnvGuard(usize);

impl Drop for CurrentEnvGuard {
    #[inline]
    fn drop(&mut self) {
        CURRENT.set(self.0);
    }
}

/// Runs `f` with no JIT environment current on this thread: for interpreter runs, so that
/// [`helper_access_ok`] answers about the innermost run (the interpreter's) even when a
/// JIT-compiled program's helper started it.
pub(crate) fn without_jit_env<T>(f: impl FnOnce() -> T) -> T {
    let _restore = CurrentEnvGuard(CURRENT.replace(NO_JIT_ENV));
    f()
}

/// Runs `entry` (code loaded as `trust`) on `(ctx, len)` with `regions`, `budget` and
/// `maps` (the program's `RunMaps`, or 0; see `PjExecEnv::maps`), and turns a stop into a
/// [`RunError`].
///
/// # Safety
/// `entry` must be committed code with the [`PjProgramEntry`] signature that stays mapped
/// for the call; `ctx`/`len` and every region must be memory the program may access (for
/// sandboxed code the checks enforce exactly that; trusted code relies on it).
pub(crate) unsafe fn run(
    entry: u64,
    ctx: *mut u8,
    len: usize,
    regions: &[PjMemRegion],
    budget: u64,
    trust: Trust,
    maps: u64,
) -> Result<u64, RunError> {
    // rbpf passes r1 = r2 = 0 for an empty context; a dangling slice pointer (0x1) would
    // otherwise reach the program as r1.
    let ctx = if len == 0 { std::ptr::null_mut() } else { ctx };
    let mut env = PjExecEnv {
        regions: regions.as_ptr() as u64,
        region_count: regions.len() as u64,
        ctx_start: ctx as u64,
        ctx_end: (ctx as u64).wrapping_add(len as u64),
        ctx_len: len as u64,
        budget,
        maps,
        ..Default::default()
    };
    // One pointer for the code and for the helpers it calls (a tail call writes the
    // regions, the maps and its count through it while the code runs).
    let env_ptr: *mut PjExecEnv = &mut env;
    let current = env_ptr as usize
        | if trust == Trust::Trusted {
            TRUSTED_BIT
        } else {
            0
        };
    let _restore = CurrentEnvGuard(CURRENT.replace(current));
    // SAFETY: the caller guarantees `entry` is live code with this signature.
    let f: PjProgramEntry = unsafe { std::mem::transmute(entry as usize) };
    // SAFETY: as above; `env` outlives the call.
    let r0 = unsafe { f(ctx, len as u64, env_ptr) };
    // SAFETY: the call is over; `env_ptr` is `env`, no longer shared.
    stop_to_result(unsafe { &*env_ptr }, r0)
}

/// [`run`] as the thread's only run in progress, under the caller's run pin: it writes its
/// inputs into the environment the thread's slot keeps ([`run_pin::RunPin::thread_env`])
/// instead of building a whole one on the stack. A run costs its stores over the raw
/// entry, and this one makes seven where `run` makes thirteen (issue 43). A run inside
/// another on this thread (a helper running a program, or an interpreter's run inside a
/// helper) takes [`run_nested`] instead.
///
/// # Safety
/// As [`run`], and no run is in progress on this thread ([`run_in_progress`] is false).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_outermost(
    entry: u64,
    ctx: *mut u8,
    len: usize,
    regions: &[PjMemRegion],
    budget: u64,
    trust: Trust,
    maps: u64,
    pin: &run_pin::RunPin,
) -> Result<u64, RunError> {
    let ctx = if len == 0 { std::ptr::null_mut() } else { ctx };
    let env_ptr = pin.thread_env();
    // SAFETY: the pin's slot is this thread's, and no run is in progress on this thread (the
    // caller's promise), so nothing else reads or writes its environment.
    let env = unsafe { &mut *env_ptr };
    // What a run leaves set (a stop, the tail-call count, a sandboxed run's stack bounds)
    // was cleared when the last run here ended (`OutermostRunEnd`): a run never reads it
    // before it starts.
    env.regions = regions.as_ptr() as u64;
    env.region_count = regions.len() as u64;
    env.ctx_start = ctx as u64;
    env.ctx_end = (ctx as u64).wrapping_add(len as u64);
    env.ctx_len = len as u64;
    env.budget = budget;
    env.maps = maps;
    let current = env_ptr as usize
        | if trust == Trust::Trusted {
            TRUSTED_BIT
        } else {
            0
        };
    CURRENT.set(current);
    let _end = OutermostRunEnd(env_ptr);
    // SAFETY: the caller guarantees `entry` is live code with this signature.
    let f: PjProgramEntry = unsafe { std::mem::transmute(entry as usize) };
    // SAFETY: as above; the slot's environment outlives the call.
    let r0 = unsafe { f(ctx, len as u64, env_ptr) };
    // SAFETY: the call is over; nothing else holds the environment. The stop is read
    // before `_end` clears it.
    stop_to_result(unsafe { &*env_ptr }, r0)
}

/// Ends an outermost run ([`run_outermost`]), also by unwinding: no run current on the
/// thread, and the slot's environment cleared of what the run may have left for the next
/// one to find (a stop, already read; the tail-call count; a sandboxed run's stack bounds,
/// which a trusted run's helpers would otherwise take for its own). Tested and cleared
/// only when set, after the run rather than before the next: a short run's cost over its
/// raw entry is bound by its stores, and the loads and the test are cheaper here than
/// ahead of the call (issue 43; BENCHMARKS.md, "What a run leaves, cleared when it ends").
struct OutermostRunEnd(*mut PjExecEnv);

impl Drop for OutermostRunEnd {
    #[inline(always)]
    fn drop(&mut self) {
        CURRENT.set(0);
        // SAFETY: the thread's slot environment, which only this thread's runs use, and
        // the run is over.
        let env = unsafe { &mut *self.0 };
        if env.stop_kind as u64 | env.tail_calls | env.stack_start | env.stack_end != 0 {
            env.stop_kind = PJ_STOP_NONE;
            env.tail_calls = 0;
            env.stack_start = 0;
            env.stack_end = 0;
        }
    }
}

/// Whether a run is in progress on this thread (a helper of it, or an interpreter's run
/// inside one, is asking).
#[inline(always)]
pub(crate) fn run_in_progress() -> bool {
    CURRENT.get() != 0
}

/// [`run`] for a run inside another on this thread, out of line: the outermost run's path
/// stays short.
///
/// # Safety
/// As [`run`].
#[cold]
#[inline(never)]
pub(crate) unsafe fn run_nested(
    entry: u64,
    ctx: *mut u8,
    len: usize,
    regions: &[PjMemRegion],
    budget: u64,
    trust: Trust,
    maps: u64,
) -> Result<u64, RunError> {
    // SAFETY: forwarded.
    unsafe { run(entry, ctx, len, regions, budget, trust, maps) }
}

/// Marks the branch that calls it unlikely, without moving the branch's own work out of
/// line.
///
/// The runs' error paths are built in place (a `RunError` made by an out-of-line function
/// comes back through memory, and the `Result` then stayed in memory on the success path
/// too: a `Hook::run` read it back wider than it was written, a failed store-forward per
/// run), but they must not shape the success path: inlined unmarked, the stop kinds became
/// a jump table every run went through (perf, issue 43).
#[cold]
#[inline(never)]
pub(crate) fn cold_path() {}

/// `Ok(r0)` for a normal return, the stop recorded in `env` otherwise.
#[inline]
pub(crate) fn stop_to_result(env: &PjExecEnv, r0: u64) -> Result<u64, RunError> {
    if env.stop_kind == PJ_STOP_NONE {
        return Ok(r0);
    }
    cold_path();
    let pc = env.stop_pc as usize;
    let stop = match StopKind::from_code(env.stop_kind) {
        Some(StopKind::OutOfBounds) => Stop::OutOfBounds {
            pc,
            addr: env.stop_addr,
            size: env.stop_access & 0xff,
            write: env.stop_access & PJ_ACCESS_WRITE != 0,
        },
        Some(StopKind::Budget) => Stop::Budget { pc },
        Some(StopKind::UnknownCallx) => Stop::UnknownCallx {
            pc,
            id: env.stop_addr,
        },
        None => {
            return Err(RunError::UnknownStop {
                kind: env.stop_kind,
                pc,
            })
        }
    };
    Err(RunError::Stop(stop))
}

/// For helpers: may the program running on this thread access `[addr, addr + len)` in
/// `direction`? The same regions as the emitted checks: the context, the program's stack
/// block, and the host regions it was given. `false` when no program is running.
///
/// A helper that dereferences a pointer argument calls this first, so a sandboxed program
/// cannot use the helper to reach memory it could not reach itself.
pub fn helper_access_ok(addr: u64, len: u64, direction: AccessDirection) -> bool {
    let env = current_env();
    if env.is_null() {
        // No JIT run on this thread (an interpreted one clears the JIT's env for its
        // duration): ask the interpreter about its run, if one called us.
        return packjit_interp::helper_access_ok(addr, len, direction == AccessDirection::Write)
            .unwrap_or(false);
    }
    // SAFETY: set by `run` for the duration of the call that (transitively) invoked the
    // helper on this thread, and reset before `run` returns.
    let env = unsafe { &*env };
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let inside = |start: u64, stop: u64| start <= addr && end <= stop;
    if inside(env.ctx_start, env.ctx_end) || inside(env.stack_start, env.stack_end) {
        return true;
    }
    if env.regions == 0 {
        return false;
    }
    // SAFETY: `regions`/`region_count` describe the slice `run` was given, alive for the call.
    let regions = unsafe {
        std::slice::from_raw_parts(env.regions as *const PjMemRegion, env.region_count as usize)
    };
    regions.iter().any(|r| {
        inside(r.start, r.start.saturating_add(r.len))
            && (direction == AccessDirection::Read || r.flags & PJ_REGION_WRITABLE != 0)
    })
}

/// The environment of the program this thread runs (innermost JIT run), or null outside
/// runs. Valid until that run returns; the code reads and writes it too, but only while no
/// helper it called runs.
pub(crate) fn current_env() -> *mut PjExecEnv {
    (CURRENT.get() & !(TRUSTED_BIT | NO_JIT_ENV)) as *mut PjExecEnv
}

/// Is the program this thread runs (innermost JIT run) trusted? `false` outside runs.
pub(crate) fn trusted_run() -> bool {
    CURRENT.get() & TRUSTED_BIT != 0
}

/// A fresh key for constant blinding, from the kernel's random source.
pub(crate) fn random_key() -> u64 {
    let mut key = 0u64;
    // SAFETY: writes at most 8 bytes into `key`.
    let n = unsafe { libc::getrandom((&mut key as *mut u64).cast(), 8, 0) };
    if n != 8 {
        // getrandom cannot fail for 8 bytes once the pool is initialised; if it somehow does,
        // fall back to address-space and time entropy rather than a constant key.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        key = t ^ (&key as *const u64 as u64).rotate_left(29);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_become_run_errors_with_pc_and_access() {
        let env = PjExecEnv {
            stop_kind: PJ_STOP_OUT_OF_BOUNDS,
            stop_pc: 7,
            stop_addr: 0x1000,
            stop_access: 8 | PJ_ACCESS_WRITE,
            ..Default::default()
        };
        let e = stop_to_result(&env, 0).unwrap_err();
        assert_eq!(
            e,
            RunError::Stop(Stop::OutOfBounds {
                pc: 7,
                addr: 0x1000,
                size: 8,
                write: true
            })
        );
        assert_eq!(e.pc(), Some(7));
        assert!(e
            .to_string()
            .starts_with("pc 7: out of bounds: 8-byte write at 0x1000"));

        let env = PjExecEnv {
            stop_kind: PJ_STOP_BUDGET,
            stop_pc: 3,
            ..Default::default()
        };
        let e = stop_to_result(&env, 0).unwrap_err();
        assert_eq!(e.stop(), Some(Stop::Budget { pc: 3 }));

        let env = PjExecEnv {
            stop_kind: PJ_STOP_UNKNOWN_CALLX,
            stop_pc: 2,
            stop_addr: 99,
            ..Default::default()
        };
        let e = stop_to_result(&env, 0).unwrap_err();
        assert_eq!(e.stop().map(|s| s.kind()), Some(StopKind::UnknownCallx));
        assert_eq!(
            e.to_string(),
            "pc 2: callx to helper id 99 (no helper registered)"
        );

        let env = PjExecEnv {
            stop_kind: 42,
            stop_pc: 5,
            ..Default::default()
        };
        let e = stop_to_result(&env, 0).unwrap_err();
        assert_eq!(e, RunError::UnknownStop { kind: 42, pc: 5 });
        assert_eq!(
            e.to_string(),
            "pc 5: program stopped with unknown stop kind 42"
        );
        assert_eq!(stop_to_result(&PjExecEnv::default(), 42), Ok(42));
    }

    /// What the fake entries below saw of their environment.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Seen {
        env: usize,
        stop_kind: u32,
        tail_calls: u64,
        stack: (u64, u64),
        ctx: (u64, u64, u64),
        budget: u64,
        maps: u64,
        regions: (u64, u64),
        current_env: usize,
        trusted: bool,
    }

    thread_local! {
        static SEEN: Cell<Seen> = const { Cell::new(Seen {
            env: 0, stop_kind: 0, tail_calls: 0, stack: (0, 0), ctx: (0, 0, 0), budget: 0,
            maps: 0, regions: (0, 0), current_env: 0, trusted: false,
        }) };
        static NESTED: Cell<Seen> = const { Cell::new(Seen {
            env: 0, stop_kind: 0, tail_calls: 0, stack: (0, 0), ctx: (0, 0, 0), budget: 0,
            maps: 0, regions: (0, 0), current_env: 0, trusted: false,
        }) };
    }

    fn seen(env: *mut PjExecEnv) -> Seen {
        // SAFETY: the environment the run passed.
        let e = unsafe { &*env };
        Seen {
            env: env as usize,
            stop_kind: e.stop_kind,
            tail_calls: e.tail_calls,
            stack: (e.stack_start, e.stack_end),
            ctx: (e.ctx_start, e.ctx_end, e.ctx_len),
            budget: e.budget,
            maps: e.maps,
            regions: (e.regions, e.region_count),
            current_env: current_env() as usize,
            trusted: trusted_run(),
        }
    }

    /// Records what it sees, then leaves behind everything a run may leave set: a stop, a
    /// tail-call count, a sandboxed run's stack bounds.
    extern "C" fn records_then_stops(_ctx: *mut u8, _len: u64, env: *mut PjExecEnv) -> u64 {
        SEEN.set(seen(env));
        // SAFETY: the run's environment.
        let e = unsafe { &mut *env };
        e.stop_kind = PJ_STOP_BUDGET;
        e.stop_pc = 9;
        e.tail_calls = 3;
        e.stack_start = 0x7000;
        e.stack_end = 0x7200;
        0
    }

    extern "C" fn records(_ctx: *mut u8, _len: u64, env: *mut PjExecEnv) -> u64 {
        SEEN.set(seen(env));
        7
    }

    extern "C" fn records_nested(_ctx: *mut u8, _len: u64, env: *mut PjExecEnv) -> u64 {
        NESTED.set(seen(env));
        8
    }

    /// Records, then (as a helper would) runs another program inside this run.
    extern "C" fn runs_another(_ctx: *mut u8, _len: u64, env: *mut PjExecEnv) -> u64 {
        SEEN.set(seen(env));
        assert!(run_in_progress());
        let mut inner = [0u8; 4];
        // SAFETY: a live function with the entry's signature; `inner` is the context.
        let r = unsafe {
            run_nested(
                records_nested as *const () as u64,
                inner.as_mut_ptr(),
                inner.len(),
                &[],
                77,
                Trust::Sandboxed,
                0,
            )
        };
        assert_eq!(r, Ok(8));
        assert_eq!(
            current_env() as usize,
            env as usize,
            "the outer run's environment is current again"
        );
        9
    }

    #[test]
    fn a_threads_outermost_runs_share_an_environment_that_starts_clear() {
        let pin = run_pin::enter();
        let mut ctx = [0u8; 16];
        let ctx_at = ctx.as_mut_ptr() as u64;
        let regions = [PjMemRegion {
            start: 0x10_000,
            len: 0x100,
            flags: 0,
        }];
        assert!(!run_in_progress());
        // SAFETY: live functions with the entry's signature; `ctx` is the context.
        let first = unsafe {
            run_outermost(
                records_then_stops as *const () as u64,
                ctx.as_mut_ptr(),
                ctx.len(),
                &regions,
                500,
                Trust::Sandboxed,
                0xabc0,
                &pin,
            )
        };
        assert_eq!(first, Err(RunError::Stop(Stop::Budget { pc: 9 })));
        let first = SEEN.get();
        assert_eq!(
            first.env,
            pin.thread_env() as usize,
            "the slot's environment"
        );
        assert_eq!(first.current_env, first.env);
        assert!(!first.trusted);
        assert_eq!(first.ctx, (ctx_at, ctx_at + 16, 16));
        assert_eq!((first.budget, first.maps), (500, 0xabc0));
        assert_eq!(first.regions, (regions.as_ptr() as u64, 1));
        assert!(!run_in_progress(), "the run is over");
        assert!(current_env().is_null());
        // SAFETY: the slot's environment, with no run in progress on this thread.
        let left = unsafe { &*pin.thread_env() };
        assert_eq!(
            (
                left.stop_kind,
                left.tail_calls,
                left.stack_start,
                left.stack_end
            ),
            (PJ_STOP_NONE, 0, 0, 0),
            "a run clears what it leaves when it ends, its stop read first"
        );

        // The next run on this thread finds none of what the stopped one left, and its own
        // inputs (an empty context: r1 = 0).
        // SAFETY: as above.
        let second = unsafe {
            run_outermost(
                records as *const () as u64,
                ctx.as_mut_ptr(),
                0,
                &[],
                u64::MAX,
                Trust::Trusted,
                0,
                &pin,
            )
        };
        assert_eq!(second, Ok(7));
        let second = SEEN.get();
        assert_eq!(
            (second.stop_kind, second.tail_calls, second.stack),
            (PJ_STOP_NONE, 0, (0, 0)),
            "left over from the stopped run"
        );
        assert_eq!(second.env, first.env);
        assert!(second.trusted);
        assert_eq!(second.ctx, (0, 0, 0));
        assert_eq!(
            (second.budget, second.maps, second.regions.1),
            (u64::MAX, 0, 0)
        );

        // A run inside a run builds its own environment and leaves the outer one current.
        // SAFETY: as above.
        let outer = unsafe {
            run_outermost(
                runs_another as *const () as u64,
                ctx.as_mut_ptr(),
                ctx.len(),
                &regions,
                600,
                Trust::Trusted,
                0,
                &pin,
            )
        };
        assert_eq!(outer, Ok(9));
        let (outer, inner) = (SEEN.get(), NESTED.get());
        assert_eq!(outer.env, first.env);
        assert_ne!(
            inner.env, outer.env,
            "a nested run has an environment of its own"
        );
        assert_eq!(inner.current_env, inner.env);
        assert!(!inner.trusted, "the nested run's trust, not the outer's");
        assert_eq!((inner.budget, inner.ctx.2, inner.stop_kind), (77, 4, 0));
        assert!(!run_in_progress());
    }

    #[test]
    fn helper_checks_follow_the_running_programs_regions() {
        assert!(
            !helper_access_ok(0x1000, 1, AccessDirection::Read),
            "no program running"
        );
        let regions = [
            PjMemRegion {
                start: 0x10_000,
                len: 0x100,
                flags: 0,
            },
            PjMemRegion {
                start: 0x20_000,
                len: 0x100,
                flags: PJ_REGION_WRITABLE,
            },
        ];
        let env = PjExecEnv {
            regions: regions.as_ptr() as u64,
            region_count: 2,
            ctx_start: 0x1000,
            ctx_end: 0x1010,
            stack_start: 0x8000,
            stack_end: 0x8200,
            ..Default::default()
        };
        let _restore = CurrentEnvGuard(CURRENT.replace(&env as *const PjExecEnv as usize));
        let ok = |a, l, d| helper_access_ok(a, l, d);
        use AccessDirection::{Read, Write};
        assert!(ok(0x1000, 16, Write));
        assert!(!ok(0x1001, 16, Read), "one byte past the context");
        assert!(ok(0x81f8, 8, Write));
        assert!(!ok(0x81f9, 8, Write), "past the stack block");
        assert!(ok(0x10_0ff, 1, Read));
        assert!(!ok(0x10_000, 1, Write), "read-only region");
        assert!(ok(0x20_000, 0x100, Write));
        assert!(!ok(0x20_001, 0x100, Write));
        assert!(!ok(u64::MAX, 2, Read), "wrapping range");
    }
}
