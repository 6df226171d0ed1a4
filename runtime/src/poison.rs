//! Poisoned CO-RE relocations at load time.
//!
//! The ELF loader replaces an instruction whose CO-RE relocation nothing in the target
//! satisfies with `call 0xbad2310` ([`elf::POISON_HELPER`](crate::elf::POISON_HELPER)), as
//! libbpf does. Under the kernel such a program loads when its verifier proves the call
//! dead, which is what happens to accesses clang guards with `bpf_core_field_exists()`: the
//! guard relocates to a constant 0 and the branch around the access is decided. Here the
//! front end's constant reachability ([`packjit_frontend::analysis::reachable`]) decides the
//! same guards: a reachable poison is refused with its pc, a dead one is compiled as the
//! no-op `ja +0` (it never runs, and nothing else in the program changes).
//!
//! Only code that calls the poison id pays for any of this (one decode more at load).

use crate::elf::POISON_HELPER;
use crate::{Error, ErrorKind};
use packjit_plugin_api::HelperEntry;

/// The error's message (its pc is the poisoned slot); the ELF loader adds the
/// relocation's own reason.
pub(crate) const REACHABLE: &str = "a CO-RE relocation nothing in the target BTF satisfies \
    poisoned this instruction (call 0xbad2310, as libbpf does), and the code can reach it: \
    guard the access (bpf_core_field_exists()) or give a target BTF that has it";

/// `ja +0`.
const NOP: [u8; 8] = [0x05, 0, 0, 0, 0, 0, 0, 0];

/// Whether the 8-byte slot is libbpf's poison call.
fn is_poison(slot: &[u8]) -> bool {
    slot[0] == 0x85 && slot[1] >> 4 == 0 && slot[4..8] == POISON_HELPER.to_le_bytes()
}

/// `code` with its poisoned slots made no-ops, after checking that no path reaches one
/// (`helpers` and `percpu_insn` as the compile will decode it). An error names the first
/// reachable poisoned slot.
pub(crate) fn unpoison(
    code: &[u8],
    helpers: &[HelperEntry],
    percpu_insn: bool,
) -> Result<Vec<u8>, Error> {
    let mut out = code.to_vec();
    let mut poisoned = Vec::new();
    for (slot, insn) in out.chunks_exact_mut(8).enumerate() {
        if is_poison(insn) {
            insn.copy_from_slice(&NOP);
            poisoned.push(slot);
        }
    }
    let prog = packjit_frontend::decode_with(
        &out,
        helpers,
        packjit_frontend::DecodeOptions { percpu_insn },
    )?;
    let reachable = packjit_frontend::analysis::reachable(&prog);
    for &slot in &poisoned {
        // A poisoned `lddw` is two calls, each its own instruction here.
        let Some(i) = prog.insts.iter().position(|inst| inst.pc as usize == slot) else {
            continue;
        };
        if reachable[i] {
            return Err(Error::at(slot, ErrorKind::Verify, REACHABLE));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let o = off.to_le_bytes();
        let i = imm.to_le_bytes();
        [op, (src << 4) | dst, o[0], o[1], i[0], i[1], i[2], i[3]]
    }
    const POISON: [u8; 8] = insn(0x85, 0, 0, 0, POISON_HELPER as i32);
    const EXIT: [u8; 8] = insn(0x95, 0, 0, 0, 0);

    #[test]
    fn a_guarded_poison_becomes_a_no_op() {
        // r1 = 0 ; if r1 == 0 goto +1 ; <poison> ; r0 = 3 ; exit
        let code = [
            insn(0xb7, 1, 0, 0, 0),
            insn(0x15, 1, 0, 1, 0),
            POISON,
            insn(0xb7, 0, 0, 0, 3),
            EXIT,
        ]
        .concat();
        let out = unpoison(&code, &[], false).unwrap();
        assert_eq!(&out[16..24], &NOP);
        assert_eq!(&out[..16], &code[..16]);
        assert_eq!(&out[24..], &code[24..]);
    }

    #[test]
    fn a_reachable_poison_is_refused_with_its_pc() {
        // r1 = 1 ; if r1 == 0 goto +1 ; <poison> ; r0 = 3 ; exit
        let code = [
            insn(0xb7, 1, 0, 0, 1),
            insn(0x15, 1, 0, 1, 0),
            POISON,
            insn(0xb7, 0, 0, 0, 3),
            EXIT,
        ]
        .concat();
        let e = unpoison(&code, &[], false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Verify);
        assert_eq!((e.pc, e.message.as_str()), (Some(2), REACHABLE));
        // A poisoned lddw (both slots) behind an undecided branch: refused at its first slot.
        let code = [
            insn(0x61, 1, 1, 0, 0),
            insn(0x15, 1, 0, 2, 0),
            POISON,
            POISON,
            insn(0xb7, 0, 0, 0, 3),
            EXIT,
        ]
        .concat();
        let e = unpoison(&code, &[], false).unwrap_err();
        assert_eq!(e.pc, Some(2));
    }
}
