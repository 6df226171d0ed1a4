//! Lowering of verified eBPF (`packjit_frontend::Program`) to RV64: one short function per
//! instruction class, over the encoders of [`crate::encode`]. Register map: [`crate::regs`];
//! frames: [`crate::frame`].
//!
//! ## Branches
//!
//! Every branch is a *site* with a form: compressed (`c.beqz`/`c.bnez` ±256 B, `c.j`
//! ±2 KiB), short (`b<cc>` ±4 KiB, `jal` ±1 MiB; see `B_RANGE` for what dynasm allows), near
//! (inverted `b<cc>` over `jal`) or far (inverted `b<cc>` over `auipc`+`jalr`, ±2 GiB). Code is
//! emitted with every site in its smallest form; after each pass each site's displacement is
//! checked against its form's range and failing sites grow to the next form. Forms only grow,
//! so the loop ends (after at most three growth steps per site; in practice one or two
//! passes); code is never emitted with a branch that does not reach.

use crate::encode::{fits_signed, reg::*, Amo, Br, Emitter, Mem, R3, RI};
use crate::frame::Frame;
use crate::regs::map;
use dynasmrt::DynamicLabel;
use packjit_frontend::{AluOp, AtomicOp, Cond, EndKind, Inst, Op, Operand, Program, Size, Width};
use packjit_plugin_api::{CompileError, ErrorKind, HelperEntry};
use Width::{W32, W64};

/// A branch site's encoding, smallest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Form {
    Compressed,
    Short,
    Near,
    Far,
}

/// A displacement to verify after a pass.
struct Check {
    site: usize,
    /// Offset of the instruction whose displacement field holds the distance.
    at: usize,
    target: DynamicLabel,
    /// Inclusive displacement range of the current form.
    lo: isize,
    hi: isize,
    /// The form to grow to if the check fails.
    grow: Form,
}

// Displacement ranges as dynasmrt 5.1 accepts them. The compressed ones match the ISA
// (c.beqz ±256 B, c.j ±2 KiB), but dynasmrt checks B- and J-type displacements against
// a 12/20-bit signed field without counting the implicit low zero bit, so it accepts only
// half of the ISA's reach (±2 KiB instead of ±4 KiB, ±512 KiB instead of ±1 MiB). Sizing
// against the same limits keeps every branch encodable; the cost is an occasional longer
// form for branches in the upper half of the range.
const CB_RANGE: (isize, isize) = (-256, 254);
const CJ_RANGE: (isize, isize) = (-2048, 2046);
const B_RANGE: (isize, isize) = (-2048, 2046);
const J_RANGE: (isize, isize) = (-(1 << 19), (1 << 19) - 2);
/// dynasm's `auipc`-pair relocation limits (see its RISC-V language reference).
const FAR_RANGE: (isize, isize) = (-0x8000_0000, 0x7FFF_F7FF);

pub struct Options {
    pub zbb: bool,
    pub zba: bool,
    pub c: bool,
}

pub struct Codegen<'a> {
    pub(crate) prog: &'a Program,
    helpers: &'a [HelperEntry],
    opts: Options,
    pub(crate) frames: Vec<Frame>,
    pub(crate) has_callx: bool,
    forms: Vec<Form>,
    // per-pass state
    pub(crate) e: Emitter,
    site: usize,
    checks: Vec<Check>,
    insn_labels: Vec<DynamicLabel>,
    entry_labels: Vec<DynamicLabel>,
    exit_labels: Vec<DynamicLabel>,
    dispatch: Option<DynamicLabel>,
}

/// Passes after which every still-failing site jumps straight to the far form, so the
/// number of passes stays bounded even for adversarial layouts.
const GENTLE_PASSES: usize = 4;
const MAX_PASSES: usize = 8;

impl<'a> Codegen<'a> {
    pub fn new(
        prog: &'a Program,
        helpers: &'a [HelperEntry],
        opts: Options,
    ) -> Result<Self, CompileError> {
        let has_callx = prog
            .insts
            .iter()
            .any(|i| matches!(i.op, Op::CallReg { .. }));
        // The verifier already refuses unknown helper ids; resolving them here as well keeps
        // the lowering from ever emitting a call to a made-up address.
        for inst in &prog.insts {
            if let Op::CallHelper { id } = inst.op {
                if !helpers.iter().any(|h| h.id == id) {
                    return Err(CompileError::at(
                        inst.pc,
                        ErrorKind::UnknownHelper,
                        format!("call to unknown helper id {id}"),
                    ));
                }
            }
        }
        let frames = crate::frame::plan(prog, has_callx);
        Ok(Self {
            prog,
            helpers,
            frames,
            has_callx,
            forms: Vec::new(),
            e: Emitter::new(opts.zbb, opts.zba, opts.c, 0),
            opts,
            site: 0,
            checks: Vec::new(),
            insn_labels: Vec::new(),
            entry_labels: Vec::new(),
            exit_labels: Vec::new(),
            dispatch: None,
        })
    }

    /// Emits the program, re-emitting with grown branch forms until every branch reaches.
    pub fn run(mut self) -> Result<Vec<u8>, CompileError> {
        let mut capacity = self.prog.insts.len() * 8 + 64;
        for pass in 0..MAX_PASSES {
            self.pass(capacity);
            capacity = self.e.pos() + 64;
            let mut failed = false;
            for c in std::mem::take(&mut self.checks) {
                let target = self
                    .e
                    .asm
                    .labels()
                    .resolve_dynamic(c.target)
                    .map_err(|e| internal(format!("unbound label: {e}")))?;
                let d = target.0 as isize - c.at as isize;
                if d < c.lo || d > c.hi {
                    failed = true;
                    let cur = self.forms[c.site];
                    if cur == Form::Far {
                        return Err(CompileError::new(
                            ErrorKind::Encoding,
                            format!(
                                "program too large: a branch spans {d} bytes, beyond the ±2 GiB \
                                 reach of auipc+jalr"
                            ),
                        ));
                    }
                    self.forms[c.site] = if pass >= GENTLE_PASSES {
                        Form::Far
                    } else {
                        c.grow
                    };
                }
            }
            if !failed {
                let e = std::mem::replace(&mut self.e, Emitter::new(false, false, false, 0));
                return e.asm.finalize().map_err(|err| {
                    CompileError::new(
                        ErrorKind::Encoding,
                        format!("cannot encode the program: {err}"),
                    )
                });
            }
        }
        Err(internal("branch layout did not settle".to_string()))
    }

    fn pass(&mut self, capacity: usize) {
        self.e = Emitter::new(self.opts.zbb, self.opts.zba, self.opts.c, capacity);
        self.site = 0;
        self.checks.clear();
        let n = self.prog.insts.len();
        self.insn_labels = (0..n).map(|_| self.e.new_label()).collect();
        self.entry_labels = (0..self.prog.subprogs.len())
            .map(|_| self.e.new_label())
            .collect();
        self.exit_labels = (0..self.prog.subprogs.len())
            .map(|_| self.e.new_label())
            .collect();
        self.dispatch = if self.has_callx {
            Some(self.e.new_label())
        } else {
            None
        };

        for k in 0..self.prog.subprogs.len() {
            let sp = self.prog.subprogs[k].clone();
            let l = self.entry_labels[k];
            self.e.bind(l);
            self.prologue(k);
            for i in sp.start..sp.end {
                let l = self.insn_labels[i];
                self.e.bind(l);
                let inst = self.prog.insts[i];
                let last = i + 1 == sp.end;
                self.inst(k, i, &inst, last);
            }
            let l = self.exit_labels[k];
            self.e.bind(l);
            self.epilogue(k);
        }
        if let Some(d) = self.dispatch {
            self.e.bind(d);
            self.callx_dispatch();
        }
    }

    /// `callx` dispatch, shared by all `callx` sites: the helper id arrives in t2; a match
    /// tail-jumps to the helper (which returns straight to the call site); no match leaves
    /// the whole program with r0 = u64::MAX through the entry epilogue.
    fn callx_dispatch(&mut self) {
        let helpers = self.helpers;
        let cases: Vec<DynamicLabel> = helpers.iter().map(|_| self.e.new_label()).collect();
        for (h, &l) in helpers.iter().zip(&cases) {
            // Ids are u32; a register value with upper bits set matches no helper.
            self.e.li(T1, h.id as i64);
            self.branch(Br::Eq, T2, T1, l);
        }
        self.e.mv(SP, S6);
        self.e.li(A5, -1);
        let exit = self.exit_labels[0];
        self.jump(exit);
        for (h, &l) in helpers.iter().zip(&cases) {
            self.e.bind(l);
            self.e.li(T0, h.addr as i64);
            self.e.jump_reg(T0);
        }
    }

    // ---- branch sites ---------------------------------------------------------------------------

    fn next_site(&mut self, smallest: Form) -> (usize, Form) {
        let s = self.site;
        self.site += 1;
        if s == self.forms.len() {
            self.forms.push(smallest);
        }
        let f = self.forms[s].max(smallest);
        (s, f)
    }

    fn check(
        &mut self,
        site: usize,
        at: usize,
        target: DynamicLabel,
        range: (isize, isize),
        grow: Form,
    ) {
        self.checks.push(Check {
            site,
            at,
            target,
            lo: range.0,
            hi: range.1,
            grow,
        });
    }

    /// `if a <k> b goto target`, in the smallest form that reaches.
    fn branch(&mut self, k: Br, a: u8, b: u8, target: DynamicLabel) {
        let compressible =
            self.opts.c && b == ZERO && matches!(k, Br::Eq | Br::Ne) && (8..16).contains(&a);
        let smallest = if compressible {
            Form::Compressed
        } else {
            Form::Short
        };
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        match form {
            Form::Compressed => {
                self.e.cb_label(k == Br::Eq, a, target);
                self.check(site, at, target, CB_RANGE, Form::Short);
            }
            Form::Short => {
                self.e.b_label(k, a, b, target);
                self.check(site, at, target, B_RANGE, Form::Near);
            }
            Form::Near => {
                // Skip the 4-byte jal when the condition is false.
                self.e.b_off(k.invert(), a, b, 8);
                let at = self.e.pos();
                self.e.jal_label(ZERO, target);
                self.check(site, at, target, J_RANGE, Form::Far);
            }
            Form::Far => {
                self.e.b_off(k.invert(), a, b, 12);
                let at = self.e.pos();
                self.e.far_jump(T6, target);
                self.check(site, at, target, FAR_RANGE, Form::Far);
            }
        }
    }

    /// `goto target`.
    fn jump(&mut self, target: DynamicLabel) {
        let smallest = if self.opts.c {
            Form::Compressed
        } else {
            Form::Short
        };
        let (site, form) = self.next_site(smallest);
        let at = self.e.pos();
        match form {
            Form::Compressed => {
                self.e.cj_label(target);
                self.check(site, at, target, CJ_RANGE, Form::Short);
            }
            Form::Short | Form::Near => {
                self.e.jal_label(ZERO, target);
                self.check(site, at, target, J_RANGE, Form::Far);
            }
            Form::Far => {
                self.e.far_jump(T6, target);
                self.check(site, at, target, FAR_RANGE, Form::Far);
            }
        }
    }

    /// `call target` (link in ra).
    fn call(&mut self, target: DynamicLabel) {
        let (site, form) = self.next_site(Form::Short);
        let at = self.e.pos();
        if form == Form::Far {
            self.e.far_call(target);
            self.check(site, at, target, FAR_RANGE, Form::Far);
        } else {
            self.e.jal_label(RA, target);
            self.check(site, at, target, J_RANGE, Form::Far);
        }
    }

    // ---- instructions ----------------------------------------------------------------------------

    fn inst(&mut self, k: usize, i: usize, inst: &Inst, last: bool) {
        match inst.op {
            Op::Alu {
                width,
                op,
                dst,
                src,
            } => self.alu(width, op, map(dst), src),
            Op::MovSx {
                width,
                dst,
                src,
                bits,
            } => {
                let (d, s) = (map(dst), map(src));
                self.e.sext(d, s, bits);
                if width == W32 {
                    self.e.zext32(d, d);
                }
            }
            Op::Neg { width, dst } => {
                let d = map(dst);
                self.e.neg(width, d, d);
                if width == W32 {
                    self.e.zext32(d, d);
                }
            }
            Op::End { kind, bits, dst } => self.end(kind, bits, map(dst)),
            Op::LdImm64 { dst, imm } => self.e.li(map(dst), imm as i64),
            Op::Load {
                size,
                sign_extend,
                dst,
                base,
                off,
            } => {
                let m = match (size, sign_extend) {
                    (Size::B, false) => Mem::Bu,
                    (Size::B, true) => Mem::B,
                    (Size::H, false) => Mem::Hu,
                    (Size::H, true) => Mem::H,
                    (Size::W, false) => Mem::Wu,
                    (Size::W, true) => Mem::W,
                    (Size::DW, _) => Mem::D,
                };
                let (b, o) = self.address(map(base), off, T0);
                self.e.load(m, map(dst), b, o);
            }
            Op::Store {
                size,
                base,
                off,
                src,
            } => {
                let v = match src {
                    Operand::Reg(r) => map(r),
                    Operand::Imm(0) => ZERO,
                    Operand::Imm(imm) => {
                        self.e.li(T1, imm as i64);
                        T1
                    }
                };
                let (b, o) = self.address(map(base), off, T0);
                let m = match size {
                    Size::B => Mem::B,
                    Size::H => Mem::H,
                    Size::W => Mem::W,
                    Size::DW => Mem::D,
                };
                self.e.store(m, v, b, o);
            }
            Op::Atomic {
                size,
                op,
                fetch,
                base,
                off,
                src,
            } => {
                // The verifier allows only W and DW atomics.
                let width = if size == Size::DW { W64 } else { W32 };
                self.atomic(width, op, fetch, map(base), off, map(src))
            }
            Op::Ja { target } => {
                // A jump to the next instruction is a no-op.
                if target != i + 1 {
                    let l = self.insn_labels[target];
                    self.jump(l);
                }
            }
            Op::Jcond {
                width,
                cond,
                dst,
                src,
                target,
            } => {
                let l = self.insn_labels[target];
                self.jcond(width, cond, map(dst), src, l);
            }
            Op::CallHelper { id } => {
                let addr = self
                    .helpers
                    .iter()
                    .find(|h| h.id == id)
                    .map_or(0, |h| h.addr);
                self.e.li(T0, addr as i64);
                self.e.call_reg(T0);
                self.e.mv(A5, A0);
            }
            Op::CallReg { reg } => {
                self.e.mv(T2, map(reg));
                let d = self.dispatch.expect("dispatch exists when callx does");
                self.call(d);
                self.e.mv(A5, A0);
            }
            Op::CallLocal { target } => {
                // r1-r5 are already in a0-a4 and r0 comes back in a5: nothing to marshal.
                let sub = self.prog.subprog_of(target);
                let l = self.entry_labels[sub];
                self.call(l);
            }
            Op::Exit => {
                if !last {
                    let l = self.exit_labels[k];
                    self.jump(l);
                }
            }
        }
    }

    /// `base + off` as a (register, 12-bit offset) pair, using `tmp` when `off` is too wide.
    fn address(&mut self, base: u8, off: i16, tmp: u8) -> (u8, i32) {
        if fits_signed(off as i64, 12) {
            (base, off as i32)
        } else {
            self.e.li(tmp, off as i64);
            self.e.rrr(R3::Add, tmp, base, tmp);
            (tmp, 0)
        }
    }

    fn alu(&mut self, width: Width, op: AluOp, d: u8, src: Operand) {
        match op {
            AluOp::Mov => {
                match (src, width) {
                    (Operand::Reg(s), W64) => self.e.mv(d, map(s)),
                    (Operand::Reg(s), W32) => self.e.zext32(d, map(s)),
                    (Operand::Imm(imm), W64) => self.e.li(d, imm as i64),
                    (Operand::Imm(imm), W32) => self.e.li(d, imm as u32 as i64),
                }
                return;
            }
            AluOp::Div | AluOp::Sdiv | AluOp::Mod | AluOp::Smod => {
                self.divmod(width, op, d, src);
                return;
            }
            _ => {}
        }
        // Immediate fast paths that avoid materialising the constant.
        if let Operand::Imm(imm) = src {
            let imm64 = imm as i64;
            let (ri, val) = match op {
                AluOp::Add => (Some(if width == W32 { RI::Addiw } else { RI::Addi }), imm64),
                AluOp::Sub => (
                    Some(if width == W32 { RI::Addiw } else { RI::Addi }),
                    -imm64,
                ),
                AluOp::And => (Some(RI::Andi), imm64),
                AluOp::Or => (Some(RI::Ori), imm64),
                AluOp::Xor => (Some(RI::Xori), imm64),
                AluOp::Lsh => (Some(if width == W32 { RI::Slliw } else { RI::Slli }), imm64),
                AluOp::Rsh => (Some(if width == W32 { RI::Srliw } else { RI::Srli }), imm64),
                AluOp::Arsh => (Some(if width == W32 { RI::Sraiw } else { RI::Srai }), imm64),
                _ => (None, 0),
            };
            if let Some(ri) = ri {
                let is_shift = matches!(op, AluOp::Lsh | AluOp::Rsh | AluOp::Arsh);
                if is_shift {
                    // Shift counts are masked to the operand width (RFC 9669).
                    let sh = (imm as u32 & if width == W32 { 31 } else { 63 }) as i32;
                    self.e.ri(ri, d, d, sh);
                    // srliw by a non-zero amount already leaves bits 63:32 clear.
                    if width == W32 && !(op == AluOp::Rsh && sh != 0) {
                        self.e.zext32(d, d);
                    }
                    return;
                }
                if fits_signed(val, 12) {
                    self.e.ri(ri, d, d, val as i32);
                    // andi with a non-negative mask already clears bits 63:32.
                    if width == W32 && !(op == AluOp::And && val >= 0) {
                        self.e.zext32(d, d);
                    }
                    return;
                }
            }
        }
        let s = match src {
            Operand::Reg(r) => map(r),
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
        };
        let r3 = match (op, width) {
            (AluOp::Add, W64) => R3::Add,
            (AluOp::Add, W32) => R3::Addw,
            (AluOp::Sub, W64) => R3::Sub,
            (AluOp::Sub, W32) => R3::Subw,
            (AluOp::Mul, W64) => R3::Mul,
            (AluOp::Mul, W32) => R3::Mulw,
            (AluOp::And, _) => R3::And,
            (AluOp::Or, _) => R3::Or,
            (AluOp::Xor, _) => R3::Xor,
            // The hardware uses the low 6 (5 for *w) bits of the count: exactly BPF's mask.
            (AluOp::Lsh, W64) => R3::Sll,
            (AluOp::Lsh, W32) => R3::Sllw,
            (AluOp::Rsh, W64) => R3::Srl,
            (AluOp::Rsh, W32) => R3::Srlw,
            (AluOp::Arsh, W64) => R3::Sra,
            (AluOp::Arsh, W32) => R3::Sraw,
            _ => unreachable!("mov and div/mod handled above"),
        };
        self.e.rrr(r3, d, d, s);
        if width == W32 {
            self.e.zext32(d, d);
        }
    }

    fn divmod(&mut self, width: Width, op: AluOp, d: u8, src: Operand) {
        let is_div = matches!(op, AluOp::Div | AluOp::Sdiv);
        let r3 = match (op, width) {
            (AluOp::Div, W64) => R3::Divu,
            (AluOp::Div, W32) => R3::Divuw,
            (AluOp::Sdiv, W64) => R3::Div,
            (AluOp::Sdiv, W32) => R3::Divw,
            (AluOp::Mod, W64) => R3::Remu,
            (AluOp::Mod, W32) => R3::Remuw,
            (AluOp::Smod, W64) => R3::Rem,
            _ => R3::Remw,
        };
        match src {
            Operand::Imm(0) => {
                // x / 0 = 0; x % 0 = x (truncated to 32 bits for ALU32).
                if is_div {
                    self.e.li(d, 0);
                } else if width == W32 {
                    self.e.zext32(d, d);
                }
            }
            Operand::Imm(imm) => {
                // Unsigned ops see the immediate sign-extended to 64 bits (ALU64) or as
                // a u32 (ALU32); powers of two become shifts and masks.
                let unsigned = matches!(op, AluOp::Div | AluOp::Mod);
                let divisor: u64 = if width == W32 {
                    imm as u32 as u64
                } else {
                    imm as i64 as u64
                };
                if unsigned && divisor.is_power_of_two() {
                    let k = divisor.trailing_zeros() as i32;
                    if is_div {
                        if k == 0 {
                            if width == W32 {
                                self.e.zext32(d, d);
                            }
                        } else if width == W32 {
                            // srliw by k > 0 zero-fills bits 63:32.
                            self.e.ri(RI::Srliw, d, d, k);
                        } else {
                            self.e.ri(RI::Srli, d, d, k);
                        }
                    } else if k == 0 {
                        self.e.li(d, 0);
                    } else if k < 11 {
                        self.e.ri(RI::Andi, d, d, (1 << k) - 1);
                    } else {
                        // Keep the low k bits (k ≤ 31 for ALU32, so bits 63:32 end clear).
                        self.e.ri(RI::Slli, d, d, 64 - k);
                        self.e.ri(RI::Srli, d, d, 64 - k);
                    }
                    return;
                }
                // A non-zero divisor: no guard needed; MIN / -1 does not trap on RISC-V.
                self.e.li(T1, imm as i64);
                self.e.rrr(r3, d, d, T1);
                if width == W32 {
                    self.e.zext32(d, d);
                }
            }
            Operand::Reg(s) => {
                let s = map(s);
                if is_div {
                    // RISC-V returns all-ones for x / 0; BPF wants 0. Branch-free:
                    // mask = (divisor == 0) - 1, computed before d (which may be s) changes.
                    if width == W32 {
                        self.e.ri(RI::Slli, T1, s, 32);
                        self.e.seqz(T1, T1);
                    } else {
                        self.e.seqz(T1, s);
                    }
                    self.e.rrr(r3, d, d, s);
                    self.e.ri(RI::Addi, T1, T1, -1);
                    self.e.rrr(R3::And, d, d, T1);
                } else {
                    // rem/remu already return the dividend for a zero divisor, and 0 for
                    // MIN % -1: exactly BPF's semantics.
                    self.e.rrr(r3, d, d, s);
                }
                if width == W32 {
                    self.e.zext32(d, d);
                }
            }
        }
    }

    fn end(&mut self, kind: EndKind, bits: u8, d: u8) {
        if kind == EndKind::ToLe {
            // Little-endian target: truncate to `bits`, zero-extended.
            match bits {
                16 => self.e.zext16(d, d),
                32 => self.e.zext32(d, d),
                _ => {}
            }
            return;
        }
        if self.opts.zbb {
            self.e.rev8(d, d);
            if bits < 64 {
                self.e.ri(RI::Srli, d, d, 64 - bits as i32);
            }
            return;
        }
        // Baseline: assemble the swapped value byte by byte in t1:
        // byte i of d goes to byte (n-1-i) of the result. Only the low n bytes of d are
        // read, so the result is already zero-extended.
        let n = bits as i32 / 8;
        for i in 0..n {
            let src = if i == 0 {
                d
            } else {
                self.e.ri(RI::Srli, T0, d, 8 * i);
                T0
            };
            let top_of_64 = i == 7; // srli by 56 leaves exactly one byte
            let dst = if i == 0 { T1 } else { T0 };
            if !top_of_64 {
                self.e.ri(RI::Andi, dst, src, 0xff);
            }
            let sh = 8 * (n - 1 - i);
            if sh != 0 {
                self.e.ri(RI::Slli, dst, dst, sh);
            }
            if i != 0 {
                self.e.rrr(R3::Or, T1, T1, T0);
            }
        }
        self.e.mv(d, T1);
    }

    fn atomic(&mut self, width: Width, op: AtomicOp, fetch: bool, base: u8, off: i16, s: u8) {
        // AMOs take a bare register address.
        let addr = if off == 0 {
            base
        } else if fits_signed(off as i64, 12) {
            self.e.ri(RI::Addi, T0, base, off as i32);
            T0
        } else {
            self.e.li(T0, off as i64);
            self.e.rrr(R3::Add, T0, base, T0);
            T0
        };
        let amo = match op {
            AtomicOp::Add => Amo::Add,
            AtomicOp::And => Amo::And,
            AtomicOp::Or => Amo::Or,
            AtomicOp::Xor => Amo::Xor,
            AtomicOp::Xchg => Amo::Swap,
            AtomicOp::Cmpxchg => {
                // r0 = cmpxchg(addr, r0, s). lr.w sign-extends, so compare against the
                // sign-extended low half of r0.
                let expect = if width == W64 {
                    A5
                } else {
                    self.e.ri(RI::Addiw, T2, A5, 0);
                    T2
                };
                self.e.cmpxchg_loop(width, addr, expect, s);
                if width == W64 {
                    self.e.mv(A5, T1);
                } else {
                    self.e.zext32(A5, T1);
                }
                return;
            }
        };
        if !fetch {
            self.e.amo_relaxed(amo, width, ZERO, s, addr);
            return;
        }
        self.e.amo_aqrl(amo, width, s, s, addr);
        if width == W32 {
            // amo*.w sign-extends the old value; BPF's 32-bit fetch zero-extends it.
            self.e.zext32(s, s);
        }
    }

    fn jcond(&mut self, width: Width, cond: Cond, a: u8, src: Operand, target: DynamicLabel) {
        if cond == Cond::Set {
            match src {
                Operand::Imm(imm) if fits_signed(imm as i64, 12) => self.e.ri(RI::Andi, T0, a, imm),
                Operand::Imm(imm) => {
                    self.e.li(T1, imm as i64);
                    self.e.rrr(R3::And, T0, a, T1);
                }
                Operand::Reg(r) => self.e.rrr(R3::And, T0, a, map(r)),
            }
            if width == W32 {
                // Only the low halves count.
                self.e.ri(RI::Addiw, T0, T0, 0);
            }
            self.branch(Br::Ne, T0, ZERO, target);
            return;
        }
        // JMP32 compares the low halves. Sign-extending *both* operands serves every
        // condition: it is the signed reading, and as a map from u32 to u64 it is monotonic,
        // so unsigned order and equality are preserved too. An immediate is already the
        // sign-extended value of its low 32 bits.
        let mut a = a;
        let b = match src {
            Operand::Imm(0) => ZERO,
            Operand::Imm(imm) => {
                self.e.li(T1, imm as i64);
                T1
            }
            Operand::Reg(r) => {
                let r = map(r);
                if width == W32 {
                    self.e.ri(RI::Addiw, T1, r, 0);
                    T1
                } else {
                    r
                }
            }
        };
        if width == W32 {
            self.e.ri(RI::Addiw, T0, a, 0);
            a = T0;
        }
        let (k, x, y) = match cond {
            Cond::Eq => (Br::Eq, a, b),
            Cond::Ne => (Br::Ne, a, b),
            Cond::Gt => (Br::Ltu, b, a),
            Cond::Ge => (Br::Geu, a, b),
            Cond::Lt => (Br::Ltu, a, b),
            Cond::Le => (Br::Geu, b, a),
            Cond::Sgt => (Br::Lt, b, a),
            Cond::Sge => (Br::Ge, a, b),
            Cond::Slt => (Br::Lt, a, b),
            Cond::Sle => (Br::Ge, b, a),
            Cond::Set => unreachable!("handled above"),
        };
        self.branch(k, x, y, target);
    }
}

fn internal(msg: String) -> CompileError {
    CompileError::new(ErrorKind::Internal, msg)
}
