//! Per-load options (`PackjitLoadOptions`), as read by every load function.

use super::args::{check_size, out_arg};
use super::error::{boundary, invalid};
use super::maps::{map_handle, PackjitMap};
use super::regions::region_from_c;
use super::{
    PjMemRegion, PACKJIT_LOAD_ADAPTIVE, PACKJIT_LOAD_BLIND_CONSTANTS, PACKJIT_LOAD_BUDGET,
    PACKJIT_LOAD_FEATURES_EXACT, PACKJIT_LOAD_NO_BUDGET, PACKJIT_LOAD_OPTIMIZE,
    PACKJIT_LOAD_PERCPU_INSN, PACKJIT_LOAD_TIER_POLICY, PACKJIT_LOAD_TRUSTED, PACKJIT_TIER_MANUAL,
};
use packjit_runtime::{Arch, Budget, Error, ErrorKind, LoadOptions, Tier, TierPolicy, Trust};

const PACKJIT_LOAD_ALL_FLAGS: u32 = PACKJIT_LOAD_FEATURES_EXACT
    | PACKJIT_LOAD_TRUSTED
    | PACKJIT_LOAD_BUDGET
    | PACKJIT_LOAD_NO_BUDGET
    | PACKJIT_LOAD_BLIND_CONSTANTS
    | PACKJIT_LOAD_PERCPU_INSN
    | PACKJIT_LOAD_OPTIMIZE
    | PACKJIT_LOAD_ADAPTIVE
    | PACKJIT_LOAD_TIER_POLICY;

/// Per-load options, read by `packjit_program_load` and `packjit_program_load_batch`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackjitLoadOptions {
    /// `sizeof(PackjitLoadOptions)`.
    pub struct_size: u32,
    /// Target architecture, a `PJ_ARCH_*` code; 0 = the host's. Programs for another
    /// architecture are compiled (for inspection and dumping) but cannot be run.
    pub arch: u32,
    /// `PACKJIT_LOAD_*` flags.
    pub flags: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// With `PACKJIT_LOAD_FEATURES_EXACT`: the exact optional-feature bits to use. Otherwise
    /// ignored (the CPU's features are used on the host arch, none for a foreign arch).
    pub features: u64,
    /// Feature bits to leave out (e.g. arm64 bit 0 forces the LSE-less atomics).
    pub disabled_features: u64,
    /// With `PACKJIT_LOAD_BUDGET`: instructions each run may execute.
    pub budget: u64,
    /// Host regions this program may access besides its context and stack (in addition to
    /// those of `packjit_runtime_add_region`), `region_count` entries; NULL when 0. Copied
    /// during the load; the memory they describe must stay valid while the program can run.
    pub regions: *const PjMemRegion,
    /// Number of entries in `regions`.
    pub region_count: u64,
    /// The maps the bytecode names, `map_count` handles; NULL when 0. Map `k` is
    /// `maps[k]`: `lddw rX, map` with `src = 1` (`BPF_PSEUDO_MAP_FD`) and `imm = k`, as the
    /// kernel's loader expects (`src = 2`, `BPF_PSEUDO_MAP_VALUE`: a value of array map
    /// `k`). The program takes its own reference to each map during the load: the handles
    /// stay the caller's. Refused by `packjit_object_load` (an object's programs use the
    /// object's maps).
    pub maps: *const *const PackjitMap,
    /// Number of entries in `maps`.
    pub map_count: u64,
    /// With `PACKJIT_LOAD_TIER_POLICY` (and `PACKJIT_LOAD_ADAPTIVE`): runs before this
    /// program's tier-up (0: ask at load), or `PACKJIT_TIER_MANUAL`. Added after the first
    /// release of this struct: a host built against the older, shorter struct (its
    /// `struct_size` ends at `map_count`) still loads, with the runtime's policy.
    pub tier_up_calls: u64,
}

/// `struct_size` of the struct before `tier_up_calls` was appended: still accepted.
const LOAD_OPTIONS_V1_SIZE: usize = std::mem::offset_of!(PackjitLoadOptions, tier_up_calls);

impl Default for PackjitLoadOptions {
    fn default() -> Self {
        Self {
            struct_size: 0,
            arch: 0,
            flags: 0,
            reserved: 0,
            features: 0,
            disabled_features: 0,
            budget: 0,
            regions: core::ptr::null(),
            region_count: 0,
            maps: core::ptr::null(),
            map_count: 0,
            tier_up_calls: 0,
        }
    }
}

/// Fills `*opts` with the defaults (host arch, CPU features) and sets `struct_size`.
///
/// # Safety
/// `opts` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn packjit_load_options_init(opts: *mut PackjitLoadOptions) -> i32 {
    boundary("packjit_load_options_init", || {
        // SAFETY: caller contract.
        let o = unsafe { out_arg(opts, "opts") }?;
        *o = PackjitLoadOptions {
            struct_size: size_of::<PackjitLoadOptions>() as u32,
            ..Default::default()
        };
        Ok(())
    })
}

/// # Safety
/// `opts` NULL or a `PackjitLoadOptions`.
pub(super) unsafe fn load_options(
    opts: *const PackjitLoadOptions,
) -> Result<(LoadOptions, Trust), Error> {
    if opts.is_null() {
        return Ok((LoadOptions::default(), Trust::Sandboxed));
    }
    // SAFETY: caller contract.
    let o = unsafe { versioned_load_options(opts) }?;
    let o = &o;
    if o.flags & !PACKJIT_LOAD_ALL_FLAGS != 0 {
        return Err(invalid(format!(
            "opts->flags {:#x}: unknown bits {:#x}",
            o.flags,
            o.flags & !PACKJIT_LOAD_ALL_FLAGS
        )));
    }
    if o.regions.is_null() && o.region_count != 0 {
        return Err(invalid(format!(
            "opts->regions is NULL but opts->region_count is {}",
            o.region_count
        )));
    }
    let regions = if o.region_count == 0 {
        Vec::new()
    } else {
        // SAFETY: caller contract: `region_count` readable entries.
        let raw = unsafe { std::slice::from_raw_parts(o.regions, o.region_count as usize) };
        raw.iter()
            .enumerate()
            .map(|(i, r)| region_from_c(r, &format!("opts->regions[{i}]")))
            .collect::<Result<_, _>>()?
    };
    let both = PACKJIT_LOAD_BUDGET | PACKJIT_LOAD_NO_BUDGET;
    if o.flags & both == both {
        return Err(invalid(
            "opts->flags: PACKJIT_LOAD_BUDGET and PACKJIT_LOAD_NO_BUDGET together".to_string(),
        ));
    }
    if o.maps.is_null() && o.map_count != 0 {
        return Err(invalid(format!(
            "opts->maps is NULL but opts->map_count is {}",
            o.map_count
        )));
    }
    let maps = if o.map_count == 0 {
        Vec::new()
    } else {
        // SAFETY: caller contract: `map_count` readable entries.
        let raw = unsafe { std::slice::from_raw_parts(o.maps, o.map_count as usize) };
        raw.iter()
            .enumerate()
            .map(|(i, &m)| {
                // SAFETY: caller contract: each entry NULL or a live map handle.
                unsafe { map_handle(m, &format!("opts->maps[{i}]")) }.map(|m| m.map.clone())
            })
            .collect::<Result<_, _>>()?
    };
    Ok((
        LoadOptions {
            arch: arch_from_code(o.arch, "opts->arch")?,
            features: (o.flags & PACKJIT_LOAD_FEATURES_EXACT != 0).then_some(o.features),
            disable_features: o.disabled_features,
            budget: if o.flags & PACKJIT_LOAD_BUDGET != 0 {
                Budget::Limit(o.budget)
            } else if o.flags & PACKJIT_LOAD_NO_BUDGET != 0 {
                Budget::Unlimited
            } else {
                Budget::Default
            },
            blind_constants: o.flags & PACKJIT_LOAD_BLIND_CONSTANTS != 0,
            percpu_insn: o.flags & PACKJIT_LOAD_PERCPU_INSN != 0,
            tier: match (
                o.flags & PACKJIT_LOAD_OPTIMIZE != 0,
                o.flags & PACKJIT_LOAD_ADAPTIVE != 0,
            ) {
                (true, true) => {
                    return Err(invalid(
                        "opts->flags: PACKJIT_LOAD_OPTIMIZE and PACKJIT_LOAD_ADAPTIVE together"
                            .to_string(),
                    ))
                }
                (true, false) => Tier::Optimized,
                (false, true) => Tier::Adaptive,
                (false, false) => Tier::Baseline,
            },
            tier_policy: tier_policy(o)?,
            regions,
            maps,
            ..Default::default()
        },
        if o.flags & PACKJIT_LOAD_TRUSTED != 0 {
            Trust::Trusted
        } else {
            Trust::Sandboxed
        },
    ))
}

/// The caller's options, as this library's struct: a host built against the first version
/// (no `tier_up_calls`) gets that field's default.
///
/// # Safety
/// `opts` non-NULL and readable for the `struct_size` it declares.
unsafe fn versioned_load_options(
    opts: *const PackjitLoadOptions,
) -> Result<PackjitLoadOptions, Error> {
    if !opts.is_aligned() {
        // SAFETY: forwarded; check_size names the misalignment.
        unsafe { check_size(opts, "opts") }?;
    }
    // SAFETY: every versioned struct starts with a u32 struct_size.
    let size = unsafe { opts.cast::<u32>().read() } as usize;
    if size != LOAD_OPTIONS_V1_SIZE {
        // SAFETY: forwarded.
        unsafe { check_size(opts, "opts") }?;
        // SAFETY: checked: a whole struct of this version.
        return Ok(unsafe { opts.read() });
    }
    let mut o = PackjitLoadOptions::default();
    // SAFETY: the caller's struct is readable for its `struct_size` bytes, the prefix this
    // version shares with the older one (`#[repr(C)]`, fields only appended).
    unsafe {
        std::ptr::copy_nonoverlapping(
            opts.cast::<u8>(),
            (&mut o as *mut PackjitLoadOptions).cast::<u8>(),
            LOAD_OPTIONS_V1_SIZE,
        )
    };
    if o.flags & PACKJIT_LOAD_TIER_POLICY != 0 {
        return Err(Error::new(
            ErrorKind::Abi,
            format!(
                "opts->flags: PACKJIT_LOAD_TIER_POLICY needs opts->tier_up_calls, which a struct_size of {size} does not reach (this library's is {})",
                size_of::<PackjitLoadOptions>()
            ),
        ));
    }
    Ok(o)
}

/// The per-load tier-up policy `PACKJIT_LOAD_TIER_POLICY` asks for.
fn tier_policy(o: &PackjitLoadOptions) -> Result<Option<TierPolicy>, Error> {
    if o.flags & PACKJIT_LOAD_TIER_POLICY == 0 {
        return Ok(None);
    }
    if o.flags & PACKJIT_LOAD_ADAPTIVE == 0 {
        return Err(invalid(
            "opts->flags: PACKJIT_LOAD_TIER_POLICY without PACKJIT_LOAD_ADAPTIVE (only adaptive programs tier up)"
                .to_string(),
        ));
    }
    Ok(Some(match o.tier_up_calls {
        PACKJIT_TIER_MANUAL => TierPolicy::Manual,
        n => TierPolicy::Calls(n),
    }))
}

fn arch_from_code(code: u32, what: &str) -> Result<Option<Arch>, Error> {
    if code == 0 {
        return Ok(None);
    }
    Arch::from_code(code).map(Some).ok_or_else(|| {
        invalid(format!(
            "{what} {code} is not a PJ_ARCH_* code (1 = x86_64, 2 = aarch64, 3 = riscv64)"
        ))
    })
}
