//! The runtime: configuration, create / destroy, arena statistics, reclaim, compaction.

use super::args::{arg, c_path, check_size, out_arg};
use super::error::{boundary, invalid};
use super::{
    DEAD_MAGIC, PACKJIT_MAP_AUTO, PACKJIT_MAP_DUAL, PACKJIT_MAP_TOGGLE, PACKJIT_REMAP_ALWAYS,
    PACKJIT_REMAP_AUTO, PACKJIT_REMAP_NEVER,
};
use core::ffi::c_char;
use packjit_runtime::{
    ArenaConfig, ArenaStats, Error, MapMode, RemapPolicy, Runtime, RuntimeConfig,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

const RUNTIME_MAGIC: u64 = 0x706a_5f72_756e_7431; // "pj_runt1"

/// Runtime configuration, read by `packjit_runtime_create`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitConfig {
    /// `sizeof(PackjitConfig)`.
    pub struct_size: u32,
    /// One of the `PACKJIT_MAP_*` values.
    pub map_mode: u32,
    /// One of the `PACKJIT_REMAP_*` values.
    pub remap_policy: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Size of one code pack in bytes; 0 = the default (2 MiB). Rounded up to whole pages.
    pub pack_size: u64,
    /// Directory searched by `packjit_load_plugins` / `packjit_load_host_plugin` when they
    /// are given NULL; NULL = the defaults (`$PACKJIT_PLUGIN_DIR`, else the executable's
    /// directory and its parent). Borrowed: copied during `packjit_runtime_create`, so the
    /// caller may free it as soon as that call returns.
    pub plugin_dir: *const c_char,
}

/// Code arena statistics, filled by `packjit_runtime_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PackjitArenaStats {
    /// `sizeof(PackjitArenaStats)`, set by the caller.
    pub struct_size: u32,
    /// 1 when packs are dual-mapped (memfd RW + RX views), 0 when toggled.
    pub dual_mapped: u32,
    /// 1 when commits remap the touched executable pages (stale-code workaround).
    pub remap_on_commit: u32,
    /// Free space not in the largest free run of its pack, per mille of all free space.
    pub fragmentation_permille: u32,
    /// Packs currently mapped.
    pub packs: u64,
    /// Bytes of address space held by packs.
    pub bytes_reserved: u64,
    /// Bytes handed out to programs (64-byte granularity).
    pub bytes_used: u64,
    /// Bytes of machine code written into live regions.
    pub bytes_code: u64,
    /// Live allocations (programs).
    pub allocations: u64,
    /// Commits performed (one per load, one per batch).
    pub commits: u64,
    /// Instruction-cache maintenance passes.
    pub icache_flushes: u64,
    /// Page ranges remapped for stale-code invalidation.
    pub remaps: u64,
    /// Freed regions still waiting for running threads to leave.
    pub pending_frees: u64,
    /// Bytes of pack memory made resident (pages trap-filled because code was placed in
    /// them); the rest of each pack is untouched demand-zero memory.
    pub bytes_resident: u64,
}

/// An opaque runtime: backends, helpers and the packed code arena. Thread-safe: every
/// function taking a `PackjitRuntime *` may be called from several threads at once.
pub struct PackjitRuntime {
    pub(super) magic: AtomicU64,
    pub(super) rt: Arc<Runtime>,
    pub(super) plugin_dir: Option<PathBuf>,
}

/// # Safety
/// `p` must be NULL, or a pointer to a live (or recently freed, not yet reclaimed) runtime.
pub(super) unsafe fn runtime<'a>(p: *const PackjitRuntime) -> Result<&'a PackjitRuntime, Error> {
    // SAFETY: forwarded.
    let rt = unsafe { arg(p, "runtime") }?;
    match rt.magic.load(Ordering::Acquire) {
        RUNTIME_MAGIC => Ok(rt),
        DEAD_MAGIC => Err(invalid("runtime was already destroyed")),
        _ => Err(invalid("runtime is not a PackjitRuntime handle")),
    }
}

/// Fills `*cfg` with the defaults (auto map mode, auto remap, 2 MiB packs, default plugin
/// directories) and sets `struct_size`.
///
/// # Safety
/// `cfg` must be NULL or point to writable memory for a `PackjitConfig` (borrowed for the
/// call only).
#[no_mangle]
pub unsafe extern "C" fn packjit_config_init(cfg: *mut PackjitConfig) -> i32 {
    boundary("packjit_config_init", || {
        // SAFETY: caller contract.
        let cfg = unsafe { out_arg(cfg, "cfg") }?;
        *cfg = PackjitConfig {
            struct_size: size_of::<PackjitConfig>() as u32,
            map_mode: PACKJIT_MAP_AUTO,
            remap_policy: PACKJIT_REMAP_AUTO,
            reserved: 0,
            pack_size: 0,
            plugin_dir: core::ptr::null(),
        };
        Ok(())
    })
}

/// Creates a runtime. `cfg` may be NULL for the defaults. On success `*out` receives a new
/// runtime (ownership passes to the caller, who releases it with
/// `packjit_runtime_destroy`); on failure `*out` is set to NULL.
///
/// The runtime starts without a backend (unlike the Rust `Runtime::new`, which links the
/// host's in): load one with `packjit_load_host_plugin` or `packjit_load_plugins` before
/// `packjit_program_load`.
///
/// # Safety
/// `cfg` must be NULL or point to a `PackjitConfig` (borrowed for the call; `plugin_dir` is
/// copied). `out` must be NULL or point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_create(
    cfg: *const PackjitConfig,
    out: *mut *mut PackjitRuntime,
) -> i32 {
    boundary("packjit_runtime_create", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(out, "out") }?;
        *out = core::ptr::null_mut();
        let mut arena = ArenaConfig::default();
        let mut plugin_dir = None;
        if !cfg.is_null() {
            // SAFETY: caller contract.
            unsafe { check_size(cfg, "cfg") }?;
            // SAFETY: size checked.
            let c = unsafe { &*cfg };
            arena.map_mode = match c.map_mode {
                PACKJIT_MAP_AUTO => MapMode::Auto,
                PACKJIT_MAP_DUAL => MapMode::DualMapping,
                PACKJIT_MAP_TOGGLE => MapMode::Toggle,
                m => {
                    return Err(invalid(format!(
                        "cfg->map_mode {m} is not a PACKJIT_MAP_* value"
                    )))
                }
            };
            arena.remap = match c.remap_policy {
                PACKJIT_REMAP_AUTO => RemapPolicy::Auto,
                PACKJIT_REMAP_ALWAYS => RemapPolicy::Always,
                PACKJIT_REMAP_NEVER => RemapPolicy::Never,
                m => {
                    return Err(invalid(format!(
                        "cfg->remap_policy {m} is not a PACKJIT_REMAP_* value"
                    )))
                }
            };
            if c.pack_size != 0 {
                // 1 GiB is far beyond any sensible pack; a larger value is almost
                // certainly a unit mistake, and would reserve that much address space.
                if c.pack_size > 1 << 30 {
                    return Err(invalid(format!(
                        "cfg->pack_size {} exceeds the 1 GiB limit",
                        c.pack_size
                    )));
                }
                arena.pack_size = c.pack_size as usize;
            }
            if !c.plugin_dir.is_null() {
                // SAFETY: NUL-terminated per the contract.
                plugin_dir = Some(unsafe { c_path(c.plugin_dir, "cfg->plugin_dir") }?);
            }
        }
        // A C host chooses its backends (packjit_load_host_plugin, packjit_load_plugins): the
        // library starts without one whatever cargo features built it, so the same calls
        // behave the same with every libpackjit.so.
        let rt = Runtime::with_config(RuntimeConfig {
            arena,
            linked_backend: false,
            ..RuntimeConfig::default()
        })?;
        *out = Box::into_raw(Box::new(PackjitRuntime {
            magic: AtomicU64::new(RUNTIME_MAGIC),
            rt: Arc::new(rt),
            plugin_dir,
        }));
        Ok(())
    })
}

/// Number of freed program handles whose deferred drop has not run yet.
pub(super) static PENDING_HANDLES: AtomicUsize = AtomicUsize::new(0);

/// Drives deferred frees (program handles and code regions) until none is pending or about
/// a second has passed (another thread may be pinned); returns how many arena frees remain.
fn drain(rt: &Runtime) -> usize {
    packjit_runtime::arena::flush_epoch_until(|| PENDING_HANDLES.load(Ordering::Acquire) == 0);
    rt.reclaim()
}

/// Destroys a runtime. NULL is ignored. Programs still alive keep what they need (the
/// arena, backends and helpers) and remain runnable until each is freed; the plugin
/// libraries stay loaded until then. Waits briefly for deferred frees to finish so that a
/// clean shutdown leaves nothing behind. Destroying twice is detected while the memory is
/// still mapped (recorded as an error, otherwise ignored), but is a caller bug.
///
/// # Safety
/// `rt` must be NULL or a handle from `packjit_runtime_create`; it must not be used again.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_destroy(rt: *mut PackjitRuntime) {
    if rt.is_null() {
        return;
    }
    boundary("packjit_runtime_destroy", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if h.magic.swap(DEAD_MAGIC, Ordering::AcqRel) != RUNTIME_MAGIC {
            return Err(invalid("runtime was destroyed concurrently"));
        }
        // SAFETY: created by Box::into_raw in packjit_runtime_create; the magic swap makes
        // this the only destroy.
        let h = unsafe { Box::from_raw(rt) };
        drain(&h.rt);
        drop(h);
        Ok(())
    });
}

/// Statistics of the runtime's executable code arena (zeroes on a host architecture
/// without one).
///
/// # Safety
/// `rt` must be NULL or a live runtime; `out` must be NULL or point to a
/// `PackjitArenaStats` whose `struct_size` the caller has set.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_stats(
    rt: *const PackjitRuntime,
    out: *mut PackjitArenaStats,
) -> i32 {
    boundary("packjit_runtime_stats", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        unsafe { check_size(out, "out") }?;
        let s: ArenaStats = h.rt.stats();
        // SAFETY: checked above.
        unsafe {
            *out = PackjitArenaStats {
                struct_size: size_of::<PackjitArenaStats>() as u32,
                dual_mapped: s.dual_mapped as u32,
                remap_on_commit: s.remap_on_commit as u32,
                fragmentation_permille: s.fragmentation_permille,
                packs: s.packs as u64,
                bytes_reserved: s.bytes_reserved as u64,
                bytes_used: s.bytes_used as u64,
                bytes_code: s.bytes_code as u64,
                allocations: s.allocations as u64,
                commits: s.commits,
                icache_flushes: s.icache_flushes,
                remaps: s.remaps,
                pending_frees: s.pending_frees as u64,
                bytes_resident: s.bytes_resident as u64,
            }
        };
        Ok(())
    })
}

/// Runs deferred frees whose grace period has ended (waiting up to about a second for
/// threads still running freed code). `pending` (may be NULL) receives the number of code
/// regions still waiting.
///
/// # Safety
/// `rt` must be NULL or a live runtime; `pending` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_reclaim(rt: *const PackjitRuntime, pending: *mut u64) -> i32 {
    boundary("packjit_reclaim", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        let left = drain(&h.rt);
        if !pending.is_null() {
            // SAFETY: caller contract.
            *unsafe { out_arg(pending, "pending") }? = left as u64;
        }
        Ok(())
    })
}

/// Sets the code arena's compaction (moving live programs into holes so free space stays
/// in one run per pack; on by default): code moves while fragmentation is above
/// `threshold_permille`: at most `step_bytes` per free or hook swap that finds chunks
/// released (loads leave that step to them), and up to the limit given to
/// `packjit_runtime_compact`. `step_bytes` 0 = frees and swaps move nothing, only
/// `packjit_runtime_compact` does;
/// `threshold_permille` 1000 or more turns compaction off.
/// Programs whose raw entry was taken (`packjit_program_entry`) never move. No effect when
/// the arena is not dual-mapped.
///
/// # Safety
/// `rt` must be NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_set_compaction(
    rt: *const PackjitRuntime,
    threshold_permille: u32,
    step_bytes: u64,
) -> i32 {
    boundary("packjit_runtime_set_compaction", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        if let Some(a) = h.rt.arena() {
            a.set_compaction(
                (threshold_permille < 1000).then(|| packjit_runtime::Compaction {
                    threshold_permille,
                    step_bytes: usize::try_from(step_bytes).unwrap_or(usize::MAX),
                }),
            );
        }
        Ok(())
    })
}

/// A compaction step the host can schedule (e.g. when idle): moves up to `max_bytes` of
/// program code while fragmentation is above the threshold, in one commit. `moved` (may be
/// NULL) receives the bytes moved.
///
/// # Safety
/// `rt` must be NULL or a live runtime; `moved` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_compact(
    rt: *const PackjitRuntime,
    max_bytes: u64,
    moved: *mut u64,
) -> i32 {
    boundary("packjit_runtime_compact", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        let n =
            h.rt.compact(usize::try_from(max_bytes).unwrap_or(usize::MAX));
        if !moved.is_null() {
            // SAFETY: caller contract.
            *unsafe { out_arg(moved, "moved") }? = n as u64;
        }
        Ok(())
    })
}
