//! The bridge to rbpf: use rbpf's helper functions from packjit programs.
//!
//! rbpf helpers are Rust-ABI `fn(u64, u64, u64, u64, u64) -> u64`; JIT code calls
//! `extern "C"` functions. [`extern_c_helper!`](crate::extern_c_helper) wraps one into an
//! `extern "C"` trampoline, and [`register_rbpf_helpers`] registers rbpf's standard set under
//! rbpf's own ids, so bytecode written for rbpf runs unchanged.

use crate::{Error, Runtime};

/// Wraps a Rust-ABI helper `fn(u64, u64, u64, u64, u64) -> u64` into an
/// `unsafe extern "C" fn` suitable for [`Runtime::register_helper`]. A panic in the helper
/// aborts the process rather than unwinding through JIT frames.
#[macro_export]
macro_rules! extern_c_helper {
    ($f:path) => {{
        unsafe extern "C" fn trampoline(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
            match ::std::panic::catch_unwind(|| $f(a, b, c, d, e)) {
                Ok(v) => v,
                Err(_) => ::std::process::abort(),
            }
        }
        trampoline as $crate::PjHelperFn
    }};
}

/// rbpf's helper ids, as its `helpers` module numbers them.
pub mod ids {
    /// `bpf_trace_printk`-like printing.
    pub const TRACE_PRINTK: u32 = rbpf::helpers::BPF_TRACE_PRINTK_IDX;
}

/// Registers rbpf's `bpf_trace_printf` under rbpf's id, plus rbpf's other standard helpers
/// (which rbpf leaves unnumbered) under the ids given: `gather_bytes`, `memfrob`, `sqrti`,
/// `strcmp`, `rand`.
pub fn register_rbpf_helpers(rt: &Runtime, first_extra_id: u32) -> Result<(), Error> {
    rt.register_helper(
        ids::TRACE_PRINTK,
        "bpf_trace_printf",
        extern_c_helper!(rbpf::helpers::bpf_trace_printf),
    )?;
    let extra: [(&str, crate::PjHelperFn); 5] = [
        (
            "gather_bytes",
            extern_c_helper!(rbpf::helpers::gather_bytes),
        ),
        ("memfrob", extern_c_helper!(rbpf::helpers::memfrob)),
        ("sqrti", extern_c_helper!(rbpf::helpers::sqrti)),
        ("strcmp", extern_c_helper!(rbpf::helpers::strcmp)),
        ("rand", extern_c_helper!(rbpf::helpers::rand)),
    ];
    for (i, (name, f)) in extra.into_iter().enumerate() {
        rt.register_helper(first_extra_id + i as u32, name, f)?;
    }
    Ok(())
}
