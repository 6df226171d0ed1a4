//! The run-time side of sandboxed code: the functions its rare paths call by address.
//!
//! The inline test of a checked access covers the context and the stack block, which are
//! where nearly every access lands; a miss calls [`region_check`], which scans the host
//! regions of `env` and, when none allows the access either, writes the stop record the
//! baseline writes. The entry zeroes the stack block through [`zero_block`]. Both are
//! `extern "C"` so Cranelift calls them with the host's default calling convention.

use packjit_plugin_api::{
    PjExecEnv, PjMemRegion, PJ_ACCESS_WRITE, PJ_REGION_WRITABLE, PJ_STOP_OUT_OF_BOUNDS,
};

/// Is `[addr, addr + (access & 0xff))` inside the context, the stack block or one of
/// `env`'s host regions (writable ones only when `access` has [`PJ_ACCESS_WRITE`])? Returns
/// 1 when it is; otherwise records the out-of-bounds stop (`stop_kind`, `stop_pc` = `pc`,
/// `stop_addr`, `stop_access`) and returns 0, and the code unwinds. The inline test tried
/// one or both of the first two already; trying them again keeps this verdict exact
/// whatever the inline test covered.
///
/// # Safety
/// `env` is the environment the running program was entered with: `regions` points at
/// `region_count` readable entries (or is 0).
pub(crate) unsafe extern "C" fn region_check(
    env: *mut PjExecEnv,
    addr: u64,
    access: u64,
    pc: u64,
) -> u64 {
    // SAFETY: the caller passes the run's env, valid for the whole run (see above).
    let env = unsafe { &mut *env };
    let size = access & 0xff;
    let write = access & u64::from(PJ_ACCESS_WRITE) != 0;
    if let Some(end) = addr.checked_add(size) {
        let regions: &[PjMemRegion] = if env.regions == 0 || env.region_count == 0 {
            &[]
        } else {
            // SAFETY: `regions` / `region_count` describe the host's slice, alive for the run.
            unsafe {
                std::slice::from_raw_parts(
                    env.regions as *const PjMemRegion,
                    env.region_count as usize,
                )
            }
        };
        let inside = |start: u64, stop: u64| start <= addr && end <= stop;
        let allowed = inside(env.ctx_start, env.ctx_end)
            || inside(env.stack_start, env.stack_end)
            || regions.iter().any(|r| {
                inside(r.start, r.start.saturating_add(r.len))
                    && (!write || r.flags & PJ_REGION_WRITABLE != 0)
            });
        if allowed {
            return 1;
        }
    }
    env.stop_kind = PJ_STOP_OUT_OF_BOUNDS;
    env.stop_access = access as u32;
    env.stop_pc = pc;
    env.stop_addr = addr;
    0
}

/// Zeroes the stack block `[start, start + len)` at entry, so no host data is visible in it.
///
/// # Safety
/// `[start, start + len)` is the entry function's own stack slot.
pub(crate) unsafe extern "C" fn zero_block(start: *mut u8, len: u64) {
    // SAFETY: the block is the calling entry function's live stack slot of `len` bytes.
    unsafe { std::ptr::write_bytes(start, 0, len as usize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_allow_by_direction_and_misses_record_the_stop() {
        let regions = [
            PjMemRegion {
                start: 0x1000,
                len: 0x10,
                flags: 0,
            },
            PjMemRegion {
                start: 0x2000,
                len: 0x10,
                flags: PJ_REGION_WRITABLE,
            },
        ];
        let mut env = PjExecEnv {
            regions: regions.as_ptr() as u64,
            region_count: 2,
            ..PjExecEnv::default()
        };
        let write = u64::from(PJ_ACCESS_WRITE);
        // SAFETY: `env` describes `regions`, alive for these calls.
        unsafe {
            assert_eq!(region_check(&mut env, 0x1008, 8, 3), 1);
            assert_eq!(region_check(&mut env, 0x2008, 8 | write, 3), 1);
            assert_eq!(env.stop_kind, 0);
            // One byte past the end of the read-only region.
            assert_eq!(region_check(&mut env, 0x1009, 8, 7), 0);
            assert_eq!(
                (env.stop_kind, env.stop_pc, env.stop_addr, env.stop_access),
                (PJ_STOP_OUT_OF_BOUNDS, 7, 0x1009, 8)
            );
            // A write into the read-only region.
            assert_eq!(region_check(&mut env, 0x1000, 4 | write, 9), 0);
            assert_eq!(env.stop_access, 4 | PJ_ACCESS_WRITE);
            // An access whose end wraps.
            assert_eq!(region_check(&mut env, u64::MAX - 2, 4, 1), 0);
            // The context and the stack block, whichever the inline test tried.
            env.ctx_start = 0x3000;
            env.ctx_end = 0x3010;
            env.stack_start = 0x4000;
            env.stack_end = 0x4200;
            assert_eq!(region_check(&mut env, 0x300c, 4 | write, 2), 1);
            assert_eq!(region_check(&mut env, 0x41f8, 8 | write, 2), 1);
            assert_eq!(region_check(&mut env, 0x41f9, 8, 5), 0);
            assert_eq!((env.stop_pc, env.stop_addr), (5, 0x41f9));
        }
    }
}
