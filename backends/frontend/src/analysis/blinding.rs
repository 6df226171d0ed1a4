//! Constant blinding: the per-instruction mask an immediate is blinded with.

/// The per-constant blinding key for the instruction at `pc`: a SplitMix64 step over the
/// program key and the pc, so equal immediates at different pcs get different masks.
pub fn blinding_mask(program_key: u64, pc: usize) -> u64 {
    let mut z = program_key ^ (pc as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
