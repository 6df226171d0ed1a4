//! Host memory regions programs may access under the sandbox.

use super::args::arg;
use super::error::{boundary, invalid};
use super::runtime::{runtime, PackjitRuntime};
use super::{PjMemRegion, PJ_REGION_WRITABLE};
use packjit_runtime::{Error, MemRegion, RegionAccess};

/// Registers host memory every program loaded from now on may access under the sandbox
/// (read-only, or read-write with `PJ_REGION_WRITABLE`). Programs loaded earlier keep the
/// regions they were loaded with.
///
/// # Safety
/// `rt` NULL or live; `region` NULL or readable. The memory the region describes must stay
/// valid (and writable, for a writable region) while any program loaded after this call can
/// run.
#[no_mangle]
pub unsafe extern "C" fn packjit_runtime_add_region(
    rt: *const PackjitRuntime,
    region: *const PjMemRegion,
) -> i32 {
    boundary("packjit_runtime_add_region", || {
        // SAFETY: caller contract.
        let h = unsafe { runtime(rt) }?;
        // SAFETY: caller contract.
        let r = unsafe { arg(region, "region") }?;
        h.rt.add_region(region_from_c(r, "region")?);
        Ok(())
    })
}

/// A C region description as a runtime region.
///
/// The C caller's promise about the memory (documented on `PjMemRegion` users) is what makes
/// building the `MemRegion` sound.
pub(super) fn region_from_c(r: &PjMemRegion, what: &str) -> Result<MemRegion, Error> {
    if r.flags & !PJ_REGION_WRITABLE != 0 {
        return Err(invalid(format!(
            "{what}.flags {:#x}: unknown bits {:#x}",
            r.flags,
            r.flags & !PJ_REGION_WRITABLE
        )));
    }
    if r.start.checked_add(r.len).is_none() {
        return Err(invalid(format!(
            "{what}: start {:#x} + len {:#x} wraps around",
            r.start, r.len
        )));
    }
    let access = if r.flags & PJ_REGION_WRITABLE != 0 {
        RegionAccess::ReadWrite
    } else {
        RegionAccess::ReadOnly
    };
    // SAFETY: the C API's contract (packjit_runtime_add_region, PackjitLoadOptions::regions):
    // the caller keeps the memory valid while programs given it can run.
    Ok(unsafe { MemRegion::new(r.start as *const u8, r.len as usize, access) })
}
