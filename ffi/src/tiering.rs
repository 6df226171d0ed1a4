//! Adaptive tiering (`PACKJIT_LOAD_ADAPTIVE`): the runtime's policy, and where a program
//! stands.

use super::args::out_arg;
use super::error::boundary;
use super::program::program;
use super::runtime::runtime;
use super::{
    PACKJIT_TIER_BASELINE, PACKJIT_TIER_MANUAL, PACKJIT_TIER_OPTIMIZED,
    PACKJIT_TIER_STATUS_BASELINE, PACKJIT_TIER_STATUS_FIXED, PACKJIT_TIER_STATUS_OPTIMIZED,
    PACKJIT_TIER_STATUS_PENDING, PACKJIT_TIER_STATUS_REFUSED, PACKJIT_TIER_STATUS_SETTLED,
};
use packjit_runtime::{Tier, TierPolicy, TierStatus};

/// Sets when adaptive programs loaded from now on tier up: after `calls` runs (0: at load,
/// in the background), or never on their own with `PACKJIT_TIER_MANUAL`. The default is
/// `PACKJIT_DEFAULT_TIER_UP_CALLS`. Runs are counted without atomic read-modify-writes, so
/// concurrent runs may miss a few.
///
/// # Safety
/// `rt` must be NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_set_tier_policy(
    rt: *const super::PackjitRuntime,
    calls: u64,
) -> i32 {
    boundary("packjit_runtime_set_tier_policy", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        h.rt.set_tier_policy(match calls {
            PACKJIT_TIER_MANUAL => TierPolicy::Manual,
            n => TierPolicy::Calls(n),
        });
        Ok(())
    })
}

/// Runs an adaptive program makes by default before its tier-up.
pub const PACKJIT_DEFAULT_TIER_UP_CALLS: u64 = packjit_runtime::DEFAULT_TIER_UP_CALLS;

/// `*tier` receives which code new runs of `prog` take: `PACKJIT_TIER_BASELINE` or
/// `PACKJIT_TIER_OPTIMIZED`.
///
/// # Safety
/// `prog` NULL or live; `tier` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_tier(
    prog: *const super::PackjitProgram,
    tier: *mut u32,
) -> i32 {
    boundary("packjit_program_tier", || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(tier, "tier") }?;
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        *out = match p.prog.tier() {
            Tier::Optimized => PACKJIT_TIER_OPTIMIZED,
            Tier::Baseline | Tier::Adaptive => PACKJIT_TIER_BASELINE,
        };
        Ok(())
    })
}

fn status_code(s: &TierStatus) -> u32 {
    match s {
        TierStatus::Fixed(_) => PACKJIT_TIER_STATUS_FIXED,
        TierStatus::Baseline => PACKJIT_TIER_STATUS_BASELINE,
        TierStatus::Pending => PACKJIT_TIER_STATUS_PENDING,
        TierStatus::Optimized => PACKJIT_TIER_STATUS_OPTIMIZED,
        TierStatus::Refused(_) => PACKJIT_TIER_STATUS_REFUSED,
        TierStatus::Settled => PACKJIT_TIER_STATUS_SETTLED,
    }
}

/// The three status calls: `what` of the program, its status code to `*status`.
///
/// # Safety
/// As for each of them.
unsafe fn with_status(
    name: &'static str,
    prog: *const super::PackjitProgram,
    status: *mut u32,
    what: impl FnOnce(&packjit_runtime::Program) -> TierStatus,
) -> i32 {
    boundary(name, || {
        // SAFETY: caller contract.
        let out = unsafe { out_arg(status, "status") }?;
        // SAFETY: caller contract.
        let p = unsafe { program(prog) }?;
        *out = status_code(&what(&p.prog));
        Ok(())
    })
}

/// `*status` receives where `prog` stands with tiering, a `PACKJIT_TIER_STATUS_*` code.
///
/// # Safety
/// `prog` NULL or live; `status` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_tier_status(
    prog: *const super::PackjitProgram,
    status: *mut u32,
) -> i32 {
    // SAFETY: forwarded.
    unsafe {
        with_status("packjit_program_tier_status", prog, status, |p| {
            p.tier_status()
        })
    }
}

/// Asks for an adaptive program's tier-up now, whatever its run count (how a program tiers
/// up under `PACKJIT_TIER_MANUAL`); `*status` receives the status after the request
/// (`PACKJIT_TIER_STATUS_PENDING` when queued). Nothing happens for other programs.
///
/// # Safety
/// `prog` NULL or live; `status` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_request_tier_up(
    prog: *const super::PackjitProgram,
    status: *mut u32,
) -> i32 {
    // SAFETY: forwarded.
    unsafe {
        with_status("packjit_program_request_tier_up", prog, status, |p| {
            p.request_tier_up()
        })
    }
}

/// Waits while `prog`'s tier-up is queued or compiling, then stores its status in
/// `*status`. Returns at once when nothing is pending.
///
/// # Safety
/// `prog` NULL or live; `status` NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_program_wait_tier_up(
    prog: *const super::PackjitProgram,
    status: *mut u32,
) -> i32 {
    // SAFETY: forwarded.
    unsafe {
        with_status("packjit_program_wait_tier_up", prog, status, |p| {
            p.wait_tier_up()
        })
    }
}
