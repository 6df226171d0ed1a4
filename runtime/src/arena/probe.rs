//! Start-up self-probe: does this machine (or emulator) notice code rewritten through the
//! other view of a dual mapping after cache maintenance?
//!
//! Real CPUs do once the caches are maintained; qemu-user 7.2 does not (it keeps its
//! translation of the old bytes until the executable view is remapped or reprotected). The
//! probe writes `return 1`, runs it, rewrites it to `return 2` at the same address, performs
//! the same maintenance a commit does, and runs it again.

use super::sys;

/// `fn() -> u64 { return imm }` for the host architecture, or `None` if unknown.
pub(crate) fn return_imm(imm: u16) -> Option<Vec<u8>> {
    if cfg!(target_arch = "x86_64") {
        // mov eax, imm32 ; ret
        let i = (imm as u32).to_le_bytes();
        Some(vec![0xb8, i[0], i[1], i[2], i[3], 0xc3])
    } else if cfg!(target_arch = "aarch64") {
        // movz x0, #imm ; ret
        let movz = 0xd280_0000u32 | ((imm as u32) << 5);
        Some([movz.to_le_bytes(), 0xd65f_03c0u32.to_le_bytes()].concat())
    } else if cfg!(target_arch = "riscv64") {
        // lui a0, hi ; addiw a0, a0, lo ; jalr zero, 0(ra). The 12-bit immediate is signed,
        // so `hi` rounds up where `lo` is negative (imm ≥ 2048 alone would come out negative).
        let hi = (u32::from(imm) + 0x800) >> 12;
        let lo = u32::from(imm).wrapping_sub(hi << 12) & 0xfff;
        let lui = (hi << 12) | (10 << 7) | 0x37;
        let addiw = (lo << 20) | (10 << 15) | (10 << 7) | 0x1b;
        Some([lui, addiw, 0x0000_8067].map(u32::to_le_bytes).concat())
    } else {
        None
    }
}

/// Returns true when rewritten code is *not* seen after cache maintenance (so commits must
/// remap). Any failure to set up the probe answers "no" (nothing to work around).
pub(crate) fn stale_code_after_rewrite() -> bool {
    let (Some(one), Some(two)) = (return_imm(1), return_imm(2)) else {
        return false;
    };
    let page = sys::page_size();
    let Ok(fd) = sys::memfd(page) else {
        return false;
    };
    let rx = sys::map_shared(fd, 0, page, libc::PROT_READ | libc::PROT_EXEC, None).ok();
    let rw = sys::map_shared(fd, 0, page, libc::PROT_READ | libc::PROT_WRITE, None).ok();
    let stale = match (rx, rw) {
        (Some(rx), Some(rw)) => {
            let run = |code: &[u8]| -> u64 {
                // SAFETY: rw is a writable page; rx its executable alias; the code is a
                // complete leaf function returning a constant.
                unsafe {
                    std::ptr::copy_nonoverlapping(code.as_ptr(), rw, code.len());
                    sys::flush_icache(rx as usize, code.len());
                    let f: extern "C" fn() -> u64 = std::mem::transmute(rx);
                    f()
                }
            };
            let first = run(&one);
            let second = run(&two);
            first == 1 && second == 1
        }
        _ => false,
    };
    if let Some(p) = rx {
        sys::unmap(p, page);
    }
    if let Some(p) = rw {
        sys::unmap(p, page);
    }
    sys::close(fd);
    stale
}
