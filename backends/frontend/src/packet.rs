//! Legacy packet access (`LD_ABS` / `LD_IND`), once for every backend: the driver rewrites
//! each [`Op::PacketLoad`](crate::Op::PacketLoad) into ordinary operations the backends
//! already lower (`lower_packet_load`), so a backend only maps the pseudo-register [`ENV`]
//! (and keeps `env` in it for programs with such loads: `CodegenMode::keeps_env`).
//!
//! ## Semantics (rbpf 0.4.1's)
//!
//! `ldabs{b,h,w,dw} imm` and `ldind{b,h,w,dw} src, imm` (opcodes 0x30/0x28/0x20/0x38 and
//! 0x50/0x48/0x40/0x58) load `r0 = *(size *)(ctx + imm)` and `r0 = *(size *)(ctx + src +
//! imm)`:
//!
//! * `ctx` is the context start, r1's value at the program's entry (`PjExecEnv::ctx_start`;
//!   0 for an empty context), whatever r1 holds by then. rbpf's `mem` is this pointer for
//!   `EbpfVmRaw` and `EbpfVmNoData`, the flavours rbpf's tests use.
//! * `imm` is read as a `u32` (zero-extended), as rbpf's interpreter does (rbpf's x86-64 JIT
//!   uses it as a signed displacement; the two agree for `imm < 2^31`). `src + imm` is a
//!   64-bit sum (wrapping).
//! * The value is read in the host's byte order (little-endian on every packjit target), no
//!   swap, and zero-extended into r0; the 8-byte forms exist (rbpf has them).
//! * r1-r5 are preserved (rbpf's interpreter and JIT touch only r0).
//! * Sandboxed code checks the access like any load: outside the context, the stack block
//!   and the host regions it stops with `Stop::OutOfBounds` naming the pc, the address and
//!   the size (rbpf's interpreter fails the run; it checks 8 bytes whatever the size, a
//!   bug this does not copy). Trusted code reads unchecked, like rbpf's JIT.
//!
//! ## Where the kernel differs
//!
//! The kernel (classic BPF's semantics) reads the packet of the `sk_buff` in r6 in network
//! byte order (`ntohs`/`ntohl`), has no 8-byte form, treats negative offsets as ancillary
//! data (`SKF_LL_OFF`, `SKF_NET_OFF`), clobbers r1-r5 (it calls a helper), and ends the
//! program with r0 = 0 when the access is out of range. packjit follows rbpf because the
//! programs that reach it with these opcodes are rbpf's (its bridge and test files); a
//! kernel-style program that never reads r1-r5 after the load (the kernel's verifier
//! refuses those reads) and stays in bounds gets the same values after a byte swap, and an
//! out-of-range load stops it rather than returning 0.
//!
//! ## The rewrite
//!
//! ```text
//! ax = src                      (LD_IND; read first: src may be r0)
//! r0 = *(u64 *)(env + ctx_start)   unchecked: the run's own environment
//! r0 += ax                      (LD_IND)
//! r0 = *(size *)(r0 + imm)      imm < 2^15 and constants not blinded; else first
//!                               ax = imm (blinded: imm ^ m, then ^= m; imm >= 2^31:
//!                               then <<= 32, >>= 32), r0 += ax, and the offset is 0
//! ```
//!
//! The last load is an ordinary checked load in sandboxed code, whose inline test tries the
//! context first (for `LD_ABS`, `CtxConst`: its address is the context start plus a
//! constant, so the whole test is `end <= ctx_len`). Every operation is 64-bit (no 32-bit
//! result whose upper half a backend might leave unextended), only r0 and [`AX`] are
//! written, and the driver marks them as an expansion (`Driver::expansion`), so no backend
//! fuses the load with the next instruction.

use crate::analysis::blinding_mask;
use crate::blind::AX;
use crate::lower::Isa;
use crate::ranges::AccessCheck;
use crate::{AluOp, Operand, Reg, Size, Width};
use packjit_plugin_api::abi::PJ_ENV_CTX_START;

/// The run's `PjExecEnv *`: a pseudo eBPF register after [`AX`] that only this rewrite
/// names, as the base of one unchecked load. Every backend maps it to the register that
/// holds `env` for the run.
pub const ENV: Reg = 12;

/// The inline test a packet load's access tries: the context, and for `LD_ABS` the
/// constant-offset form when the end fits.
pub(crate) fn packet_check(size: Size, index: Option<Reg>, off: u32) -> AccessCheck {
    match (index, off.checked_add(size.bytes())) {
        (None, Some(end)) => AccessCheck::CtxConst { end },
        _ => AccessCheck::Ctx,
    }
}

/// Lowers `r0 = *(size *)(ctx + index + off)` through the backend's hooks (see the module
/// docs), at the current instruction.
pub(crate) fn lower_packet_load<'a, L: Isa<'a>>(
    l: &mut L,
    size: Size,
    index: Option<Reg>,
    off: u32,
) {
    use AluOp::*;
    use Width::W64;
    let d = l.driver();
    let blind_key = d.mode.blind_key;
    let pc = d.pc();
    d.expansion = crate::lower::Expansion::ProgramMemory;
    if let Some(x) = index {
        l.alu(W64, Mov, AX, Operand::Reg(x));
    }
    l.load(Size::DW, false, 0, ENV, PJ_ENV_CTX_START as i16);
    if index.is_some() {
        l.alu(W64, Add, 0, Operand::Reg(AX));
    }
    let disp = match i16::try_from(off) {
        Ok(disp) if blind_key.is_none() || off == 0 => disp,
        _ => {
            let imm = off as i32;
            match blind_key {
                Some(key) => {
                    // As `blind::blind` masks an immediate (top bit of the mask set).
                    let m = (blinding_mask(key, pc) | 0x8000_0000) as u32 as i32;
                    l.alu(W64, Mov, AX, Operand::Imm(imm ^ m));
                    l.alu(W64, Xor, AX, Operand::Imm(m));
                }
                None => l.alu(W64, Mov, AX, Operand::Imm(imm)),
            }
            if imm < 0 {
                // The 64-bit mov sign-extended it: keep the u32.
                l.alu(W64, Lsh, AX, Operand::Imm(32));
                l.alu(W64, Rsh, AX, Operand::Imm(32));
            }
            l.alu(W64, Add, 0, Operand::Reg(AX));
            0
        }
    };
    l.load(size, false, 0, 0, disp);
    l.driver().expansion = crate::lower::Expansion::None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::CodegenMode;
    use crate::{decode, encode_insn as ins, op_kind, Op};

    const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

    #[test]
    fn every_packet_opcode_decodes_with_its_size_index_and_u32_offset() {
        for (opc, size) in [
            (0x30, Size::B),
            (0x28, Size::H),
            (0x20, Size::W),
            (0x38, Size::DW),
        ] {
            let code = [ins(opc, 0, 0, 0, -2), ins(opc + 0x20, 0, 7, 0, 9), EXIT].concat();
            let p = decode(&code, &[]).unwrap();
            assert_eq!(
                p.insts[0].op,
                Op::PacketLoad {
                    size,
                    index: None,
                    off: 0xffff_fffe
                }
            );
            assert_eq!(
                p.insts[1].op,
                Op::PacketLoad {
                    size,
                    index: Some(7),
                    off: 9
                }
            );
            // The summaries: r0 written, the index read, the kind recorded.
            assert_eq!(p.writes(1), 1);
            assert_eq!(p.reads(1), 1 << 7);
            assert_eq!(p.reads(0), 0);
            assert_ne!(p.subprogs[0].ops & op_kind::PACKET_LOAD, 0);
            // Trusted code keeps env for them, and only for them.
            assert!(CodegenMode::TRUSTED.keeps_env(&p));
            let plain = decode(&[ins(0xb7, 0, 0, 0, 1), EXIT].concat(), &[]).unwrap();
            assert!(!CodegenMode::TRUSTED.keeps_env(&plain));
        }
    }

    #[test]
    fn reserved_fields_and_other_ld_modes_are_named() {
        let bad = |i: [u8; 8]| decode(&[i, EXIT].concat(), &[]).unwrap_err().to_string();
        assert_eq!(
            bad(ins(0x38, 2, 0, 0, 0)),
            "pc 0: ldabsdw (opcode 0x38): reserved field dst must be 0, is 2"
        );
        assert_eq!(
            bad(ins(0x50, 0, 1, -1, 0)),
            "pc 0: ldindb (opcode 0x50): reserved field offset must be 0, is -1"
        );
        assert_eq!(
            bad(ins(0x28, 0, 3, 0, 0)),
            "pc 0: ldabsh (opcode 0x28): reserved field src must be 0, is 3"
        );
        assert_eq!(
            bad(ins(0x40, 0, 12, 0, 0)),
            "pc 0: invalid index (source) register r12"
        );
        for opc in [0x00, 0x08, 0x10, 0x60, 0x80, 0xa0, 0xc0, 0xe0] {
            assert_eq!(
                bad(ins(opc, 0, 0, 0, 0)),
                format!("pc 0: unknown opcode 0x{opc:02x}")
            );
        }
    }

    #[test]
    fn the_access_check_tries_the_context() {
        assert_eq!(
            packet_check(Size::W, None, 60),
            AccessCheck::CtxConst { end: 64 }
        );
        assert_eq!(packet_check(Size::DW, None, u32::MAX - 3), AccessCheck::Ctx);
        assert_eq!(packet_check(Size::B, Some(1), 0), AccessCheck::Ctx);
    }
}
