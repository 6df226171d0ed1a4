//! Code off the hot path shared by the whole program: the full access check and the
//! stop paths.

use super::*;
use packjit_plugin_api::abi::{PJ_ENV_ENTRY_SP, PJ_ENV_STOP_KIND, PJ_ENV_STOP_PC, PJ_STOP_BUDGET};

impl Codegen<'_> {
    /// The per-program check of an access whose inline test failed: the context, the stack
    /// block (when the program has one), then `env.regions`. In: x9 = address, C1 = the
    /// access in bits 32..41 (size in 32..40, write in bit 40), C2 = pc. Returns with x9
    /// clamped on success; on failure it stops (out of bounds, C1 gets its kind). Uses x6,
    /// x8, x10, x12, x14, x17: none holds a value across a checked access.
    ///
    /// Each region's test leaves `hs` exactly when `[x9, +size)` is inside
    /// (`len - (x9 - start) >= size`, the subtraction's borrow folded in by `ccmp`), and
    /// every way to `found` is a `b.hs` on those flags: a mispredicted one clamps to 0.
    pub(crate) fn region_scan(&mut self) {
        let (scan, stop) = (self.region_scan, self.stop);
        a64!(self.ops
            ; =>scan
            ; ubfx x10, X(C1), 32, 8
            ; sub x14, X(T0), X(CTX_LO)
            ; subs x17, X(CTX_LEN), x14
            ; ccmp x17, x10, 0, hs
            ; b.hs >found
        );
        if self.plan.block > 0 {
            // The block is at most a few KiB (movz's 16 bits).
            let block = self.plan.block;
            a64!(self.ops
                ; sub x14, X(T0), X(STACK_LO)
                ; movz x17, block
                ; subs x17, x17, x14
                ; ccmp x17, x10, 0, hs
                ; b.hs >found
            );
        }
        a64!(self.ops
            ; ldp x6, x8, [X(ENV), PJ_ENV_REGIONS]
            ; cbz x8, >fail
            ; next:
            ; ldp x14, x17, [x6]
            ; ldr x12, [x6, 16]
            ; add x6, x6, 24
            ; sub x14, X(T0), x14
            ; subs x17, x17, x14
            ; ccmp x17, x10, 0, hs
            ; b.lo >skip
            // A read fits any region; a write needs PJ_REGION_WRITABLE (bit 0).
            ; tbz X(C1), 40, >found
            ; tbnz x12, 0, >found
            ; skip:
            ; subs x8, x8, 1
            ; b.ne <next
            ; fail:
            // The caller's x30, kept in x5 across the `bl` (`call_region_scan`): a leaf
            // entry saves no frame record, so its epilogue returns through x30 as it is.
            ; mov x30, x5
            ; orr XSP(C1), X(C1), PJ_STOP_OUT_OF_BOUNDS as u64
            ; b =>stop
            ; found:
            // Flags are the deciding ccmp's: a mispredicted branch here clamps to 0.
            ; csel X(T0), X(T0), xzr, hs
            ; ret
        );
    }

    /// The shared stop paths, after all functions. `stop`: C1 = kind | access << 32,
    /// C2 = pc, x9 = address (or callx id); `stop_budget`: C2 = pc.
    pub(crate) fn stop_paths(&mut self) {
        if !self.plan.can_stop {
            return;
        }
        let (stop, stop_budget, restore) = (self.stop, self.stop_budget, self.restore);
        if self.d.mode.counts_budget() {
            a64!(self.ops
                ; =>stop_budget
                ; movz X(C1), PJ_STOP_BUDGET
                ; mov X(T0), xzr
            );
        }
        a64!(self.ops
            ; =>stop
            ; str X(C1), [X(ENV), PJ_ENV_STOP_KIND as u32]
            ; stp X(C2), X(T0), [X(ENV), PJ_ENV_STOP_PC]
            ; ldr X(C0), [X(ENV), PJ_ENV_ENTRY_SP as u32]
            ; mov sp, XSP(C0)
            ; b =>restore
        );
    }
}

impl<'a> StopHooks<'a> for Codegen<'a> {
    /// The charge is added back, so the budget a stop reports is what was left.
    fn budget_stop(
        &mut self,
        inst: usize,
        label: DynamicLabel,
        charge: u64,
    ) -> Result<(), CompileError> {
        a64!(self.ops; =>label);
        if let Some((imm, false)) = fits_imm12(charge as i64) {
            a64!(self.ops; add XSP(BUDGET), XSP(BUDGET), imm);
        } else {
            self.mov_imm(C0, charge, W64);
            a64!(self.ops; add X(BUDGET), X(BUDGET), X(C0));
        }
        let pc = self.d.prog.insts[inst].pc as u64;
        self.mov_imm(C2, pc, W64);
        self.b(self.stop_budget);
        Ok(())
    }

    /// The stop path's unwind, past its stores.
    fn stop_recorded(&mut self) {
        let restore = self.restore;
        a64!(self.ops
            ; ldr X(C0), [X(ENV), PJ_ENV_ENTRY_SP as u32]
            ; mov sp, XSP(C0)
            ; b =>restore
        );
    }

    fn isa_cold(&mut self, cold: Infallible) -> Result<(), CompileError> {
        match cold {}
    }

    fn program_end(&mut self) -> Result<(), CompileError> {
        if self.uses_region_scan {
            self.region_scan();
        }
        self.stop_paths();
        Ok(())
    }
}
