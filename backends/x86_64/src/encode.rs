//! x86-64 instruction forms: REX/ModRM/SIB assembly, immediates and branch fixups.
//!
//! Every encoder picks the shortest form for its operands: no REX unless a register needs it
//! (r8–r15, 64-bit operand, or `sil`/`dil` as a byte register), `disp8` whenever the
//! displacement fits, no displacement at all for 0 (except `rbp`/`r13` bases, whose
//! `mod = 00` encoding means RIP-relative / no base), `imm8` forms for small immediates.
//!
//! The bytes go into a `dynasmrt` [`VecAssembler`]: labels are its dynamic labels, and the
//! fixed-register instructions are written with the `dynasm!` macro, which records their
//! relocations and patches them in [`Assembler::finish`]. The label-relative branches of the
//! lowering (`jmp`, `jcc`, `call`: [`Assembler::jump`], [`Assembler::call_label`]) are written as bytes
//! and patched by [`Assembler::finish`] itself from the fixups the relaxation checks anyway: a
//! dynasm relocation per branch cost more compile time than the rest of the branch.
//!
//! The register-parameterised ModRM forms (`Assembler::rr`, `Assembler::rm`, `Assembler::op_plus_r`,
//! `Assembler::vex_0f38_rr`, private: the lowering writes the named instructions built on them,
//! `mov_rr`, `cmp_ri`, `cmov`, `lock_cmpxchg`, ...) stay table-driven on purpose. `dynasm!` can only take a register
//! chosen at run time as a dynamic register (`Rq(r)`), and for those dynasm-rs 5.1 gives up
//! the short forms this backend relies on (measured with the x64 assembler):
//! * a REX prefix is always emitted, since the register might be r8–r15: `mov Rd(0), Rd(1)`
//!   is `40 89 c8`, not `89 c8`; `push Rq(3)` is `40 53`, not `53`;
//! * a dynamic base always gets a SIB byte, and no displacement becomes `disp8 = 0`:
//!   `mov Rq(0), QWORD [Rq(3)]` is `48 8b 44 23 00`, not `48 8b 03`;
//! * a displacement computed at run time is always `disp32` unless the source commits to
//!   `BYTE` (an `i8`): `[Rq(3) + d]` with `d = 0` is `48 8b 84 23 00 00 00 00`;
//! * the rax short form of group-1 immediates (`48 05 imm32`) exists only for a static `rax`.
//!
//! Porting these forms would lengthen most instructions by one or two bytes (and change
//! every golden), and keeping the bytes would need a `match` over the 16 static registers
//! per operand per instruction. So dynasm owns the buffer, labels and the `dynasm!` text's
//! relocations, and this file keeps the few ModRM encoders, each choosing the shortest form.
//!
//! Code whose registers are fixed (the entry's env and stack-block setup, the sandbox
//! check's region arithmetic, the region-table scan, the stop stubs) is written in
//! `dynasm!` by its caller through [`Assembler::asm`]; `tests/bytes.rs` checks the result byte
//! for byte against the pre-dynasm encoder. Three static forms stay table-driven there too,
//! because dynasm-rs 5.1 chooses a different encoding:
//! * `cmp`, and group-1 ops on a memory operand, list the imm32 form (`81 /r`) before the
//!   imm8 one (`83 /r`), so even `cmp QWORD [r12 + 32], BYTE 1` comes out with an imm32
//!   (the budget charge keeps `arith_mi`);
//! * for a register pair `cmp r10, r9` is the RM form `4d 3b d1` where this backend emits
//!   the MR form `4d 39 ca` (same length; kept so the bytes do not move);
//! * there is no `endbr64` mnemonic.
//!
//! Branch relaxation: a branch starts as `rel8` (`EB`/`7x rel8`); after the pass,
//! [`Assembler::branch_checks`] computes every site's displacement from the label offsets dynasm
//! recorded and marks each `rel8` that does not reach as `rel32`, asking for another pass.
//! (dynasm would only report an out-of-range `rel8` as an error at `finalize`, without
//! saying which site.) Forms only grow, so the passes terminate (the kernel's x86 JIT
//! iterates the same way until the image size converges).

use dynasmrt::x64::X64Relocation;
use dynasmrt::{dynasm, DynamicLabel, DynasmApi, DynasmLabelApi, VecAssembler};
use packjit_frontend::relax::BranchCheck;
use packjit_frontend::reuse::{self, Reused};

/// A register number as the hardware encodes it (0 = rax … 15 = r15).
pub type Gpr = u8;

/// Condition codes (low nibble of `Jcc` / `CMOVcc` / `SETcc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Cc {
    /// Unsigned below (CF).
    B = 0x2,
    /// Unsigned above or equal.
    Ae = 0x3,
    /// Equal (ZF).
    E = 0x4,
    /// Not equal.
    Ne = 0x5,
    /// Unsigned below or equal.
    Be = 0x6,
    /// Unsigned above.
    A = 0x7,
    /// Signed less.
    L = 0xc,
    /// Signed greater or equal.
    Ge = 0xd,
    /// Signed less or equal.
    Le = 0xe,
    /// Signed greater.
    G = 0xf,
}

impl Cc {
    /// The opposite condition (flip of the low bit).
    pub fn invert(self) -> Cc {
        match self {
            Cc::B => Cc::Ae,
            Cc::Ae => Cc::B,
            Cc::E => Cc::Ne,
            Cc::Ne => Cc::E,
            Cc::Be => Cc::A,
            Cc::A => Cc::Be,
            Cc::L => Cc::Ge,
            Cc::Ge => Cc::L,
            Cc::Le => Cc::G,
            Cc::G => Cc::Le,
        }
    }
}

/// A branch target inside the code being emitted: a dynasm dynamic label.
pub type Label = DynamicLabel;

/// The assembler one pass writes into. Base address 0: every reference in the code is
/// PC-relative (helpers are called through absolute addresses in a register), so the
/// bytes run wherever the arena places them.
pub type Asm = VecAssembler<X64Relocation>;

/// A label-relative branch: its reach is checked after the pass and its displacement
/// written by [`Assembler::finish`].
#[derive(Clone, Copy, Debug)]
struct Fixup {
    /// Index of the branch site in emission order (key into the forms); [`NO_SHORT_FORM`] for
    /// calls and RIP-relative operands, which have no short form.
    site: u32,
    /// Byte offset just past the instruction: the displacement is relative to it. (32-bit
    /// fields: a program has at most 1 M instructions and its code is far below 4 GiB; a
    /// 1 M-instruction program has hundreds of thousands of fixups, 24 bytes each.)
    end: u32,
    /// Field width as emitted: 1 or 4.
    width: u8,
    /// A `jcc`'s condition code (`Cc as u8`); [`UNCONDITIONAL`] for `jmp` and calls. What
    /// [`Assembler::regrow`] rewrites a widened site to.
    cc: u8,
    label: Label,
}

/// [`Fixup::site`] of a call or a RIP-relative operand: `rel32` only.
const NO_SHORT_FORM: u32 = u32::MAX;

/// [`Fixup::cc`] of a `jmp` or call.
const UNCONDITIONAL: u8 = 0xff;

/// Whether `f` was emitted `rel8` and `forms` (the forms after [`Assembler::regrow`]) widen
/// it to `rel32`.
fn widened(forms: &[Form], f: &Fixup) -> bool {
    f.width == 1 && forms.get(f.site as usize) == Some(&Form::Rel32)
}

/// Offset `p` of the code as emitted, in the code after [`Assembler::regrow`]: moved by the
/// bytes its widened sites before `p` added (`grown`: each widened site's end as emitted and
/// the bytes added up to and including it, ascending). A site's end counts as after it: a
/// label bound there moves with the code that follows; one at its start does not.
fn moved(grown: &[(u32, u32)], p: usize) -> usize {
    match grown.partition_point(|&(end, _)| end as usize <= p) {
        0 => p,
        k => p + grown[k - 1].1 as usize,
    }
}

/// [`Assembler::moved`] for offsets asked in ascending order (fixup ends in emission order,
/// instruction offsets): a cursor through the widened sites instead of a search per offset.
pub struct Ascending<'g> {
    grown: &'g [(u32, u32)],
    k: usize,
}

impl Ascending<'_> {
    /// Offset `p` (not below the last one asked) in the code after the widening.
    #[inline]
    pub fn moved(&mut self, p: usize) -> usize {
        while self
            .grown
            .get(self.k)
            .is_some_and(|&(end, _)| end as usize <= p)
        {
            self.k += 1;
        }
        debug_assert_eq!(
            self.k,
            self.grown.partition_point(|&(end, _)| end as usize <= p)
        );
        match self.k {
            0 => p,
            k => p + self.grown[k - 1].1 as usize,
        }
    }
}

/// A fixup in the code as it stands (after any [`Assembler::regrow`]).
struct Placed {
    /// Offset just past the instruction.
    end: usize,
    /// Field width: 1 or 4.
    width: usize,
    /// Target minus `end`.
    disp: i64,
}

impl Placed {
    fn fits(&self) -> bool {
        match self.width {
            1 => i8::try_from(self.disp).is_ok(),
            _ => i32::try_from(self.disp).is_ok(),
        }
    }
}

/// Where `f` is, and its displacement to its bound label, in the code after the widening
/// that `forms` and `grown` describe.
#[inline(always)]
fn place(
    labels: &dynasmrt::components::LabelRegistry,
    forms: &[Form],
    grown: &[(u32, u32)],
    f: &Fixup,
    ends: &mut Ascending<'_>,
) -> Result<Placed, String> {
    let target = labels
        .resolve_dynamic(f.label)
        .map_err(|_| format!("internal: label {} never bound", f.label.get_id()))?
        .0;
    if grown.is_empty() {
        // The code as emitted (every pass's first check, and most programs' only one).
        return Ok(Placed {
            end: f.end as usize,
            width: usize::from(f.width),
            disp: target as i64 - i64::from(f.end),
        });
    }
    let end = ends.moved(f.end as usize);
    let width = if widened(forms, f) { 4 } else { f.width };
    Ok(Placed {
        end,
        width: usize::from(width),
        disp: moved(grown, target) as i64 - end as i64,
    })
}

/// Operand size of a general-purpose operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sz {
    /// 8-bit (byte registers need a REX prefix for `spl`…`dil`).
    B8,
    /// 16-bit (`0x66` prefix).
    B16,
    /// 32-bit (writes zero-extend to 64 bits).
    B32,
    /// 64-bit (`REX.W`).
    B64,
}

/// The bytes of one instruction (at most 15 on x86-64), assembled before they are appended.
struct Bytes {
    buf: [u8; 16],
    len: usize,
}

impl Bytes {
    #[inline(always)]
    fn new() -> Self {
        Bytes {
            buf: [0; 16],
            len: 0,
        }
    }

    #[inline(always)]
    fn push(&mut self, x: u8) {
        self.buf[self.len & 15] = x;
        self.len += 1;
    }

    #[inline(always)]
    fn extend(&mut self, xs: &[u8]) {
        for &x in xs {
            self.push(x);
        }
    }
}

/// Code buffer with labels and branch fixups for one emission pass.
pub struct Assembler {
    /// The bytes, labels and relocations.
    ops: Asm,
    fixups: Reused<Fixup>,
    /// Every fixup's displacement as the last [`Assembler::branches_fit`] found it (`None`
    /// after a [`Assembler::regrow`]), so that neither [`Assembler::branch_checks`] nor
    /// [`Assembler::finish`] resolves every label again.
    disps: Option<Reused<i32>>,
    /// Whether every one of `disps` reached in its form.
    disps_fit: bool,
    /// Per branch site, the form the relaxation driver chose in earlier passes (after a
    /// [`Assembler::regrow`], the forms it widened the code to).
    forms: Vec<Form>,
    sites: usize,
    /// Instructions emitted (for the compile result's native instruction count).
    pub insns: usize,
    /// The code holds bytes that depend on where they land other than through a fixup (a
    /// `dynasm!` label reference, whose displacement dynasm resolves from the offsets as
    /// emitted, or alignment padding): [`Assembler::regrow`] cannot move it.
    anchored: bool,
    /// The sites [`Assembler::regrow`] widened: each one's end as emitted and the bytes added
    /// up to and including it, ascending (empty until then).
    grown: Vec<(u32, u32)>,
}

/// Forms of a `jmp`/`jcc`, shortest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Form {
    /// 8-bit displacement (2 bytes).
    Rel8,
    /// 32-bit displacement (5 bytes for `jmp`, 6 for `jcc`).
    Rel32,
}

/// The most a branch grows from `rel8` to `rel32` (`jcc`: 2 → 6 bytes).
pub const REL32_GROWTH: isize = 4;
/// Hot code bytes per instruction in code with cold sides, a first guess for where its cold
/// code lands (see `ColdPlacement`): a checked access takes some 20 bytes, most other
/// instructions 3 to 7.
pub const TYPICAL_HOT_BYTES: usize = 8;

impl Assembler {
    /// A new buffer; `forms` holds the branch forms chosen by earlier passes (sites past
    /// its end start as `rel8`).
    pub fn new(forms: Vec<Form>) -> Self {
        Self::with_capacity(forms, 0, 16, 16)
    }

    /// An encoder sized up front for `code` bytes, `labels` labels and `fixups`
    /// label-relative branches and calls: regrowing a buffer copies it, into fresh pages
    /// when it is large.
    pub fn with_capacity(forms: Vec<Form>, code: usize, labels: usize, fixups: usize) -> Self {
        Assembler {
            // Branches are patched by `finish`, not by dynasm relocations: only the
            // `dynasm!` text's label references (a `callx` table's address) use that list,
            // so it starts empty (most programs have none: no allocation).
            ops: reuse::assembler(code, labels, 0),
            fixups: reuse::take(fixups),
            disps: None,
            disps_fit: false,
            forms,
            sites: 0,
            insns: 0,
            anchored: false,
            grown: Vec::new(),
        }
    }

    /// Branch sites emitted so far (calls excluded).
    pub fn sites(&self) -> usize {
        self.sites
    }

    /// Current offset.
    pub fn pos(&self) -> usize {
        self.ops.offset().0
    }

    /// A fresh, unbound label.
    pub fn label(&mut self) -> Label {
        self.ops.new_dynamic_label()
    }

    /// Binds `l` here (binding twice is reported by [`Assembler::finish`]).
    pub fn bind(&mut self, l: Label) {
        dynasm!(self.ops ; .arch x64 ; =>l);
    }

    /// Offset of a bound label (in the code after any [`Assembler::regrow`]).
    pub fn offset_of(&self, l: Label) -> Option<usize> {
        let o = self.ops.labels().resolve_dynamic(l).ok()?.0;
        Some(self.moved(o))
    }

    /// Offset `p` of the code as emitted, in the code after any [`Assembler::regrow`].
    pub fn moved(&self, p: usize) -> usize {
        moved(&self.grown, p)
    }

    /// [`Assembler::moved`] for offsets asked in ascending order.
    pub fn ascending(&self) -> Ascending<'_> {
        Ascending {
            grown: &self.grown,
            k: 0,
        }
    }

    fn b(&mut self, x: u8) {
        self.ops.push(x);
    }

    fn bs(&mut self, x: &[u8]) {
        self.ops.extend(x);
    }

    /// Raw bytes counted as one instruction.
    fn raw(&mut self, x: &[u8]) {
        self.insns += 1;
        self.bs(x);
    }

    /// Fixed-register code written with `dynasm!` by the caller; `n` is its instruction
    /// count (for the compile result's statistics).
    pub fn asm(&mut self, n: usize, f: impl FnOnce(&mut Asm)) {
        f(&mut self.ops);
        self.insns += n;
    }

    /// `ret`.
    pub fn ret(&mut self) {
        dynasm!(self.ops ; .arch x64 ; ret);
        self.insns += 1;
    }

    /// `int3`: stops straight-line speculation (AMD CPUs may run on past a `ret` or `jmp`);
    /// placed where nothing falls through, so it never executes.
    pub fn int3(&mut self) {
        dynasm!(self.ops ; .arch x64 ; int3);
        self.insns += 1;
    }

    /// `dst = [rip + table + 8 * index]; test dst, dst`: a `callx` table entry (0 for no
    /// helper, so the flags answer "is there one").
    // dynasm expands each dynamic register `Rq(r)` to `r.into()`, an identity on `Gpr`.
    #[allow(clippy::useless_conversion)]
    pub fn load_table_entry(&mut self, dst: Gpr, table: Label, index: Gpr) {
        self.anchored = true;
        dynasm!(self.ops
            ; .arch x64
            ; lea Rq(dst), [=>table]
            ; mov Rq(dst), QWORD [Rq(dst) + Rq(index) * 8]
            ; test Rq(dst), Rq(dst)
        );
        self.insns += 3;
    }

    /// 8-byte aligned data at label `l` (`int3` padding: never executed); not instructions.
    pub fn data_u64(&mut self, l: Label, words: &[u64]) {
        self.anchored = true;
        self.ops.align(8, 0xcc);
        self.bind(l);
        for &w in words {
            self.ops.push_u64(w);
        }
    }

    /// `call r11`: helpers are reached through an absolute address in the scratch r11.
    pub fn call_r11(&mut self) {
        dynasm!(self.ops ; .arch x64 ; call r11);
        self.insns += 1;
    }

    /// `push rax`: the one-byte way to move rsp by 8 (the alignment pad; its value is
    /// never read).
    pub fn push_rax(&mut self) {
        dynasm!(self.ops ; .arch x64 ; push rax);
        self.insns += 1;
    }

    /// `pop rcx`: drops the alignment pad in one byte (the caller ensures rcx is dead).
    pub fn pop_rcx(&mut self) {
        dynasm!(self.ops ; .arch x64 ; pop rcx);
        self.insns += 1;
    }

    /// `rep stosq`: stores rax to `[rdi]` rcx times (zeroing the stack block).
    pub fn rep_stosq(&mut self) {
        dynasm!(self.ops ; .arch x64 ; rep stosq);
        self.insns += 1;
    }

    /// `cqo` (64-bit) or `cdq` (32-bit): sign-extends rax/eax into rdx/edx before `idiv`.
    pub fn sign_extend_rax(&mut self, sz: Sz) {
        if sz == Sz::B64 {
            dynasm!(self.ops ; .arch x64 ; cqo);
        } else {
            dynasm!(self.ops ; .arch x64 ; cdq);
        }
        self.insns += 1;
    }

    /// `endbr64`, written as bytes: dynasm's x64 tables have no CET mnemonics.
    pub fn endbr64(&mut self) {
        self.raw(&[0xf3, 0x0f, 0x1e, 0xfa]);
    }

    #[inline]
    fn imm(&mut self, v: i64, bytes: usize) {
        match bytes {
            1 => self.ops.push(v as u8),
            4 => self.ops.push_i32(v as i32),
            _ => self.ops.extend(&v.to_le_bytes()[..bytes]),
        }
    }

    /// Appends one instruction assembled in `b`: one call per instruction rather than one
    /// per byte or per opcode slice (this is the compile's innermost loop).
    #[inline]
    fn put(&mut self, b: &Bytes) {
        for &x in &b.buf[..b.len] {
            self.ops.push(x);
        }
    }

    /// Prefixes (0x66 for 16-bit, then `pfx` such as lock/mandatory) and the REX byte.
    #[inline(always)]
    fn head(b: &mut Bytes, pfx: &[u8], sz: Sz, reg: Gpr, index: Gpr, base: Gpr, byte_regs: bool) {
        if sz == Sz::B16 {
            b.push(0x66);
        }
        b.extend(pfx);
        let rex = 0x40
            | (u8::from(sz == Sz::B64) << 3)
            | ((reg >> 3) << 2)
            | ((index >> 3) << 1)
            | (base >> 3);
        // A byte operand in registers 4–7 means spl..dil only with a REX prefix (without
        // one it would be ah..bh).
        if rex != 0x40 || byte_regs {
            b.push(rex);
        }
    }

    /// `op reg, rm` with both operands registers (`mod = 11`).
    #[inline(always)]
    fn rr(&mut self, pfx: &[u8], sz: Sz, op: &[u8], reg: Gpr, rm: Gpr) {
        // Callers pass constant slices: after inlining this picks the common one-byte-opcode
        // form at compile time.
        match (pfx, op) {
            ([], &[op]) if sz != Sz::B16 => self.rr1(sz, op, reg, rm),
            _ => self.rr_any(pfx, sz, op, reg, rm),
        }
    }

    /// `Assembler::rr` without prefixes, with a one-byte opcode, 8/32/64-bit (inlined: most
    /// eBPF instructions are one of these).
    #[inline(always)]
    fn rr1(&mut self, sz: Sz, op: u8, reg: Gpr, rm: Gpr) {
        let rex = 0x40 | (u8::from(sz == Sz::B64) << 3) | ((reg >> 3) << 2) | (rm >> 3);
        // A byte operand in registers 4–7 means spl..dil only with a REX prefix.
        let byte_regs = sz == Sz::B8 && ((4..8).contains(&reg) || (4..8).contains(&rm));
        let modrm = 0xc0 | ((reg & 7) << 3) | (rm & 7);
        // Fixed-length appends: one capacity check and one store each.
        if rex != 0x40 || byte_regs {
            self.ops.extend(&[rex, op, modrm]);
        } else {
            self.ops.extend(&[op, modrm]);
        }
        self.insns += 1;
    }

    /// `Assembler::rr`, any prefixes and opcode length.
    fn rr_any(&mut self, pfx: &[u8], sz: Sz, op: &[u8], reg: Gpr, rm: Gpr) {
        let byte_regs = sz == Sz::B8 && ((4..8).contains(&reg) || (4..8).contains(&rm));
        let mut b = Bytes::new();
        Self::head(&mut b, pfx, sz, reg, 0, rm, byte_regs);
        b.extend(op);
        b.push(0xc0 | ((reg & 7) << 3) | (rm & 7));
        self.put(&b);
        self.insns += 1;
    }

    /// `op reg, [base + disp]`.
    fn rm(&mut self, pfx: &[u8], sz: Sz, op: &[u8], reg: Gpr, base: Gpr, disp: i32) {
        let byte_regs = sz == Sz::B8 && (4..8).contains(&reg);
        let mut b = Bytes::new();
        Self::head(&mut b, pfx, sz, reg, 0, base, byte_regs);
        b.extend(op);
        Self::modrm_mem(&mut b, reg, base, disp);
        self.put(&b);
        self.insns += 1;
    }

    /// ModRM (+ SIB, + displacement) for `[base + disp]`, shortest form.
    #[inline(always)]
    fn modrm_mem(b: &mut Bytes, reg: Gpr, base: Gpr, disp: i32) {
        // rbp/r13 as base with mod = 00 means RIP-relative: they always carry a disp8.
        let md = if disp == 0 && base & 7 != 5 {
            0x00
        } else if i8::try_from(disp).is_ok() {
            0x40
        } else {
            0x80
        };
        b.push(md | ((reg & 7) << 3) | (base & 7));
        // rsp/r12 as base need a SIB byte (index = none).
        if base & 7 == 4 {
            b.push(0x24);
        }
        match md {
            0x40 => b.push(disp as u8),
            0x80 => b.extend(&disp.to_le_bytes()),
            _ => {}
        }
    }

    /// `op reg` with the register in the opcode's low bits (`push`, `pop`, `bswap`,
    /// `mov r, imm`).
    fn op_plus_r(&mut self, sz: Sz, op: &[u8], r: Gpr) {
        let mut b = Bytes::new();
        Self::head(&mut b, &[], sz, 0, 0, r, false);
        let (last, rest) = op.split_last().expect("opcode");
        b.extend(rest);
        b.push(last + (r & 7));
        self.put(&b);
        self.insns += 1;
    }

    /// A VEX-encoded (3-byte `C4`) `op reg, rm, vvvv` over map `0F38` with register
    /// operands; `pp`: 1 = 66, 2 = F3, 3 = F2.
    fn vex_0f38_rr(&mut self, w: bool, pp: u8, op: u8, reg: Gpr, rm: Gpr, vvvv: Gpr) {
        self.b(0xc4);
        // R̄ X̄ B̄ and the map select 0b00010 (0F38).
        self.b((((reg >> 3) ^ 1) << 7) | (1 << 6) | (((rm >> 3) ^ 1) << 5) | 0b00010);
        self.b((u8::from(w) << 7) | ((!vvvv & 0xf) << 3) | pp);
        self.b(op);
        self.b(0xc0 | ((reg & 7) << 3) | (rm & 7));
        self.insns += 1;
    }

    /// `jmp label` (`cc = None`) or `jcc label`, `rel8` unless this site was found out of
    /// range by an earlier pass, or jumps back to a label already too far for `rel8` (a
    /// backward distance is known while emitting, so no pass is spent finding that out).
    pub fn jump(&mut self, cc: Option<Cc>, l: Label) {
        self.jump_at_least(cc, l, Form::Rel8);
    }

    /// [`Assembler::jump`] in `at_least` or a longer form.
    pub fn jump_at_least(&mut self, cc: Option<Cc>, l: Label, at_least: Form) {
        let site = self.sites;
        self.sites += 1;
        // Both rel8 forms are 2 bytes. (Growth between the label and the jump in a later
        // pass is still checked by the relaxation.)
        let far_back = self
            .offset_of(l)
            .is_some_and(|to| to as i64 - (self.pos() as i64 + 2) < i64::from(i8::MIN));
        let long =
            far_back || at_least == Form::Rel32 || self.forms.get(site) == Some(&Form::Rel32);
        if long {
            self.jump_rel32(cc, l);
        } else {
            self.jump_rel8(cc, l);
        }
        let end = self.pos() as u32;
        self.fixups.push(Fixup {
            site: site as u32,
            end,
            width: if long { 4 } else { 1 },
            cc: cc.map_or(UNCONDITIONAL, |cc| cc as u8),
            label: l,
        });
        self.insns += 1;
    }

    /// `jmp/jcc rel8` (`EB` / `70+cc`): 2 bytes, reach −128..127 from the next instruction.
    /// The displacement is written by [`Assembler::finish`] from the fixup.
    fn jump_rel8(&mut self, cc: Option<Cc>, _l: Label) {
        let op = match cc {
            None => 0xeb,
            Some(cc) => 0x70 | cc as u8,
        };
        self.ops.extend(&[op, 0]);
    }

    /// `jmp/jcc rel32` (`E9` / `0F 80+cc`, 5 / 6 bytes), patched like [`Assembler::jump_rel8`].
    fn jump_rel32(&mut self, cc: Option<Cc>, _l: Label) {
        match cc {
            None => self.ops.extend(&[0xe9, 0, 0, 0, 0]),
            Some(cc) => self.ops.extend(&[0x0f, 0x80 | cc as u8, 0, 0, 0, 0]),
        }
    }

    /// `call label` (`E8 rel32`: calls have no short form).
    pub fn call_label(&mut self, l: Label) {
        self.ops.extend(&[0xe8, 0, 0, 0, 0]);
        self.rel32_to(l);
    }

    /// The `rel32` field that ends the instruction just emitted, to label `l` (written by
    /// [`Assembler::finish`]); counts the instruction.
    fn rel32_to(&mut self, l: Label) {
        let end = self.pos() as u32;
        self.fixups.push(Fixup {
            site: NO_SHORT_FORM,
            end,
            width: 4,
            cc: UNCONDITIONAL,
            label: l,
        });
        self.insns += 1;
    }

    /// Each branch site's number and the form it was emitted in this pass.
    pub fn emitted_forms(&self) -> impl Iterator<Item = (usize, Form)> + '_ {
        self.fixups
            .iter()
            .filter(|f| f.site != NO_SHORT_FORM)
            .map(|f| {
                let form = if f.width == 1 && !widened(&self.forms, f) {
                    Form::Rel8
                } else {
                    Form::Rel32
                };
                (f.site as usize, form)
            })
    }

    /// After a pass: does every branch reach its label in the form it was emitted in? Then
    /// the pass is final (the relaxation driver would change nothing). Errors as
    /// [`Assembler::branch_checks`].
    pub fn branches_fit(&mut self) -> Result<bool, String> {
        let labels = self.ops.labels();
        let mut disps = reuse::take(self.fixups.len());
        let (mut fit, mut narrow) = (true, true);
        let mut ends = self.ascending();
        for f in self.fixups.iter() {
            let p = place(labels, &self.forms, &self.grown, f, &mut ends)?;
            fit &= p.fits();
            // (Code is far below 2 GiB: every displacement is an i32.)
            let disp = i32::try_from(p.disp);
            narrow &= disp.is_ok();
            disps.push(disp.unwrap_or(0));
        }
        self.disps = narrow.then_some(disps);
        self.disps_fit = fit;
        Ok(fit)
    }

    /// After a pass: every `jmp`/`jcc` site's displacement for the relaxation driver. Calls
    /// have only the `rel32` form; one beyond it is an error here.
    pub fn branch_checks(&self) -> Result<Vec<BranchCheck<Form>>, String> {
        let mut checks = Vec::with_capacity(self.sites);
        let labels = self.ops.labels();
        // After a `branches_fit` (the driver's usual order) its displacements stand.
        let kept = (self.disps.as_deref()).filter(|d| d.len() == self.fixups.len());
        let mut ends = self.ascending();
        for (k, f) in self.fixups.iter().enumerate() {
            let Placed { end, width, disp } = match kept {
                // As `place` has them.
                Some(disps) => Placed {
                    end: ends.moved(f.end as usize),
                    width: if !self.grown.is_empty() && widened(&self.forms, f) {
                        4
                    } else {
                        usize::from(f.width)
                    },
                    disp: i64::from(disps[k]),
                },
                None => place(labels, &self.forms, &self.grown, f, &mut ends)?,
            };
            if f.site == NO_SHORT_FORM {
                if i32::try_from(disp).is_err() {
                    return Err(format!("call displacement {disp} exceeds rel32"));
                }
                continue;
            }
            let (form, range) = if width == 1 {
                (Form::Rel8, (i8::MIN as isize, i8::MAX as isize))
            } else {
                (Form::Rel32, (i32::MIN as isize, i32::MAX as isize))
            };
            // A far backward jump is emitted rel32 whatever its recorded form.
            debug_assert!(
                self.forms
                    .get(f.site as usize)
                    .copied()
                    .unwrap_or(Form::Rel8)
                    <= form
            );
            checks.push(BranchCheck {
                site: f.site as usize,
                at: end,
                disp: disp as isize,
                range,
                grow: Form::Rel32,
            });
        }
        Ok(checks)
    }

    /// The final bytes: dynasm patches the relocations of the `dynasm!` text, this the
    /// displacement of every `jump`/`call_label` (all of which the relaxation found in
    /// range).
    pub fn finish(mut self) -> Result<Reused<u8>, String> {
        // Displacements first (the labels live in the assembler `finalize` consumes); 4 bytes
        // per fixup, paired with the fixups again below. A `branches_fit` that found them all
        // in reach kept them (nothing is emitted after it).
        let disps = match self.disps.take() {
            Some(kept) if self.disps_fit && kept.len() == self.fixups.len() => kept,
            _ => {
                let labels = self.ops.labels();
                let mut disps = reuse::take(self.fixups.len());
                let mut ends = self.ascending();
                for f in self.fixups.iter() {
                    let p = place(labels, &self.forms, &self.grown, f, &mut ends)?;
                    if !p.fits() {
                        return Err(format!(
                            "internal: branch at {} does not reach its label (displacement {})",
                            p.end, p.disp
                        ));
                    }
                    disps.push(p.disp as i32);
                }
                disps
            }
        };
        let emitted = reuse::assembled(self.ops)
            .map_err(|e| format!("internal: x86-64 assembly failed: {e}"))?;
        let mut bytes = match self.grown.last() {
            None => emitted,
            Some(&(_, added)) => widen(&emitted, &self.fixups, &self.forms, added as usize)?,
        };
        let mut ends = Ascending {
            grown: &self.grown,
            k: 0,
        };
        for (f, &disp) in self.fixups.iter().zip(disps.iter()) {
            let end = ends.moved(f.end as usize);
            let width = if widened(&self.forms, f) {
                4
            } else {
                usize::from(f.width)
            };
            bytes[end - width..end].copy_from_slice(&disp.to_le_bytes()[..width]);
        }
        Ok(bytes)
    }

    /// Turns this pass's code into the code the next pass would emit with `forms` (the
    /// relaxation's forms after it settled this pass), without emitting it again: every site
    /// emitted `rel8` whose form grew to `rel32` is widened in place (`jmp`: 3 more bytes,
    /// `jcc`: 4), and everything after it moves. Offsets asked for afterwards
    /// ([`Assembler::offset_of`], [`Assembler::moved`], the branch checks) and the bytes of
    /// [`Assembler::finish`] are those of the widened code.
    ///
    /// That is the next pass's code because a later pass repeats the first's code except for
    /// branch forms: the choices that depend on positions are the first pass's, replayed
    /// (`ColdPlacement`'s guesses, carried to later passes as forms), and a backward branch
    /// left `rel8` by the relaxation stays in reach, as its bound on the growth between
    /// guarantees. Returns false, changing nothing, when the code is anchored (it has a `callx`
    /// table: a `dynasm!` label reference and alignment padding); then only a new pass gets
    /// the next code right.
    pub fn regrow(&mut self, forms: &[Form]) -> bool {
        if self.anchored {
            return false;
        }
        self.forms.clear();
        self.forms.extend_from_slice(forms);
        self.grown.clear();
        // One entry per site widened: at most the sites asked for `rel32` (one allocation,
        // not regrown by doublings).
        self.grown
            .reserve(forms.iter().filter(|&&f| f == Form::Rel32).count());
        let mut added = 0;
        for f in self.fixups.iter().filter(|f| widened(&self.forms, f)) {
            added += if f.cc == UNCONDITIONAL { 3 } else { 4 };
            self.grown.push((f.end, added));
        }
        self.disps = None;
        true
    }
}

/// `code` (as emitted) with each site `forms` widen rewritten from its `rel8` form to its
/// `rel32` one (`EB` → `E9`, `70+cc` → `0F 80+cc`; the displacement is written by
/// [`Assembler::finish`]), `added` bytes longer.
fn widen(
    code: &[u8],
    fixups: &[Fixup],
    forms: &[Form],
    added: usize,
) -> Result<Reused<u8>, String> {
    let mut out = reuse::take(code.len() + added);
    let mut from = 0;
    for f in fixups.iter().filter(|f| widened(forms, f)) {
        let start = f.end as usize - 2;
        let (was, long): (u8, &[u8]) = match f.cc {
            UNCONDITIONAL => (0xeb, &[0xe9, 0, 0, 0, 0]),
            cc => (0x70 | cc, &[0x0f, 0x80 | cc, 0, 0, 0, 0]),
        };
        if code[start] != was {
            return Err(format!(
                "internal: no rel8 jump at code offset {start} to widen (found {:#04x})",
                code[start]
            ));
        }
        out.extend_from_slice(&code[from..start]);
        out.extend_from_slice(long);
        from = f.end as usize;
    }
    out.extend_from_slice(&code[from..]);
    Ok(out)
}

/// Group-1 arithmetic (`add`, `or`, `and`, `sub`, `xor`, `cmp`): the ModRM `reg` digit of
/// its immediate forms, and `digit << 3 | 1` its register form's opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Arith {
    Add = 0,
    Or = 1,
    And = 4,
    Sub = 5,
    Xor = 6,
    Cmp = 7,
}

impl Arith {
    /// The `op r/m, reg` opcode (`01`, `09`, `21`, `29`, `31`, `39`).
    #[inline(always)]
    const fn mr(self) -> u8 {
        (self as u8) << 3 | 1
    }
}

/// Group-2 rotates and shifts: the ModRM `reg` digit of `C1`/`D1`/`D3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Shift {
    Rol = 0,
    Shl = 4,
    Shr = 5,
    Sar = 7,
}

/// The named instructions the lowering writes, each in its shortest form (the generic forms
/// above choose REX, ModRM, SIB and displacement). Operands are in assembly order,
/// destination first. The short ones are `#[inline(always)]`: inlined, a constant opcode
/// selects its form at compile time, as at the generic forms' call sites they replace.
impl Assembler {
    /// `mov dst, src` (`89 /r`), emitted even when `dst == src` (a 32-bit one zero-extends).
    #[inline(always)]
    pub fn mov_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        self.rr(&[], sz, &[0x89], src, dst);
    }

    /// `mov r32, imm32` (`B8+r`): zero-extends, and leaves the flags alone.
    #[inline(always)]
    pub fn mov_r32_imm(&mut self, r: Gpr, imm: u32) {
        self.op_plus_r(Sz::B32, &[0xb8], r);
        self.imm(imm.into(), 4);
    }

    /// `mov r64, simm32` (`REX.W C7 /0`).
    #[inline(always)]
    pub fn mov_r64_simm32(&mut self, r: Gpr, imm: i32) {
        self.rr(&[], Sz::B64, &[0xc7], 0, r);
        self.imm(imm.into(), 4);
    }

    /// `movabs r64, imm64` (`REX.W B8+r`).
    #[inline(always)]
    pub fn movabs(&mut self, r: Gpr, imm: i64) {
        self.op_plus_r(Sz::B64, &[0xb8], r);
        self.imm(imm, 8);
    }

    /// Group-1 `op dst, src` in the MR form (`dst` in ModRM's `rm`).
    #[inline(always)]
    pub fn arith_rr(&mut self, op: Arith, sz: Sz, dst: Gpr, src: Gpr) {
        self.rr(&[], sz, &[op.mr()], src, dst);
    }

    /// `xor dst, src`.
    #[inline(always)]
    pub fn xor_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        self.arith_rr(Arith::Xor, sz, dst, src);
    }

    /// `add dst, src`.
    #[inline(always)]
    pub fn add_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        self.arith_rr(Arith::Add, sz, dst, src);
    }

    /// `sub dst, src`.
    #[inline(always)]
    pub fn sub_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        self.arith_rr(Arith::Sub, sz, dst, src);
    }

    /// `cmp a, b` in the MR form (`39 /r`), flags of `a - b`.
    #[inline(always)]
    pub fn cmp_rr(&mut self, sz: Sz, a: Gpr, b: Gpr) {
        self.arith_rr(Arith::Cmp, sz, a, b);
    }

    /// Group-1 `op r, imm`: `imm8` when it fits, the one-byte-shorter rax form (`05+8·digit`)
    /// for other `imm32`s.
    pub fn arith_ri(&mut self, op: Arith, sz: Sz, r: Gpr, imm: i64) {
        let digit = op as u8;
        if i8::try_from(imm).is_ok() {
            self.rr(&[], sz, &[0x83], digit, r);
            self.imm(imm, 1);
        } else if r == 0 {
            let op = 0x05 | (digit << 3);
            if sz == Sz::B64 {
                self.raw(&[0x48, op]);
            } else {
                self.raw(&[op]);
            }
            self.imm(imm, 4);
        } else {
            self.rr(&[], sz, &[0x81], digit, r);
            self.imm(imm, 4);
        }
    }

    /// `add r, imm`.
    #[inline(always)]
    pub fn add_ri(&mut self, sz: Sz, r: Gpr, imm: i64) {
        self.arith_ri(Arith::Add, sz, r, imm);
    }

    /// `sub r, imm`.
    #[inline(always)]
    pub fn sub_ri(&mut self, sz: Sz, r: Gpr, imm: i64) {
        self.arith_ri(Arith::Sub, sz, r, imm);
    }

    /// `cmp r, imm`.
    #[inline(always)]
    pub fn cmp_ri(&mut self, sz: Sz, r: Gpr, imm: i64) {
        self.arith_ri(Arith::Cmp, sz, r, imm);
    }

    /// `xor r64, simm32`, always with the `imm32` (a blinding mask is a full 32-bit pattern).
    #[inline(always)]
    pub fn xor_r64_imm32(&mut self, r: Gpr, imm: i32) {
        self.rr(&[], Sz::B64, &[0x81], Arith::Xor as u8, r);
        self.imm(imm.into(), 4);
    }

    /// Group-1 `op qword [base + disp], imm`, `imm8` when it fits.
    pub fn arith_mi(&mut self, op: Arith, base: Gpr, disp: i32, imm: i64) {
        if i8::try_from(imm).is_ok() {
            self.rm(&[], Sz::B64, &[0x83], op as u8, base, disp);
            self.imm(imm, 1);
        } else {
            self.rm(&[], Sz::B64, &[0x81], op as u8, base, disp);
            self.imm(imm, 4);
        }
    }

    /// `test a, b` (`85 /r`), flags of `a & b`.
    #[inline(always)]
    pub fn test_rr(&mut self, sz: Sz, a: Gpr, b: Gpr) {
        self.rr(&[], sz, &[0x85], b, a);
    }

    /// `test r, imm`: `test r8, imm8` (`F6 /0`) for `Sz::B8`, else `test r, imm32` (`F7 /0`).
    #[inline(always)]
    pub fn test_ri(&mut self, sz: Sz, r: Gpr, imm: i64) {
        if sz == Sz::B8 {
            self.rr(&[], sz, &[0xf6], 0, r);
            self.imm(imm, 1);
        } else {
            self.rr(&[], sz, &[0xf7], 0, r);
            self.imm(imm, 4);
        }
    }

    /// `neg r` (`F7 /3`).
    #[inline(always)]
    pub fn neg(&mut self, sz: Sz, r: Gpr) {
        self.rr(&[], sz, &[0xf7], 3, r);
    }

    /// `div r` (`F7 /6`): rdx:rax / r, unsigned.
    #[inline(always)]
    pub fn div(&mut self, sz: Sz, r: Gpr) {
        self.rr(&[], sz, &[0xf7], 6, r);
    }

    /// `idiv r` (`F7 /7`): rdx:rax / r, signed.
    #[inline(always)]
    pub fn idiv(&mut self, sz: Sz, r: Gpr) {
        self.rr(&[], sz, &[0xf7], 7, r);
    }

    /// `imul dst, src` (`0F AF /r`).
    #[inline(always)]
    pub fn imul_rr(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        self.rr(&[], sz, &[0x0f, 0xaf], dst, src);
    }

    /// `imul dst, src, imm`: `6B ib` when the immediate fits a byte, else `69 id`.
    #[inline(always)]
    pub fn imul_rri(&mut self, sz: Sz, dst: Gpr, src: Gpr, imm: i32) {
        if i8::try_from(imm).is_ok() {
            self.rr(&[], sz, &[0x6b], dst, src);
            self.imm(imm.into(), 1);
        } else {
            self.rr(&[], sz, &[0x69], dst, src);
            self.imm(imm.into(), 4);
        }
    }

    /// `op r, n` (a rotate or shift by a constant): `D1` for 1, else `C1 ib`.
    #[inline(always)]
    pub fn shift_ri(&mut self, op: Shift, sz: Sz, r: Gpr, n: u8) {
        if n == 1 {
            self.rr(&[], sz, &[0xd1], op as u8, r);
        } else {
            self.rr(&[], sz, &[0xc1], op as u8, r);
            self.imm(n.into(), 1);
        }
    }

    /// `op r, cl` (`D3`).
    #[inline(always)]
    pub fn shift_cl(&mut self, op: Shift, sz: Sz, r: Gpr) {
        self.rr(&[], sz, &[0xd3], op as u8, r);
    }

    /// BMI2 `shlx`/`shrx`/`sarx dst, src, count` (VEX `F7`, the shift picked by the
    /// mandatory prefix): any count register, flags untouched.
    pub fn shiftx(&mut self, op: Shift, sz: Sz, dst: Gpr, src: Gpr, count: Gpr) {
        let pp = match op {
            Shift::Shl => 1,
            Shift::Shr => 3,
            Shift::Sar => 2,
            Shift::Rol => unreachable!("BMI2 has no rotate by a register"),
        };
        self.vex_0f38_rr(sz == Sz::B64, pp, 0xf7, dst, src, count);
    }

    /// `cmov<cc> dst, src` (`0F 40+cc`), 64-bit.
    #[inline(always)]
    pub fn cmov(&mut self, cc: Cc, dst: Gpr, src: Gpr) {
        self.rr(&[], Sz::B64, &[0x0f, 0x40 | cc as u8], dst, src);
    }

    /// `cmov<cc> dst, [rip + l]` (`0F 40+cc`, 64-bit): a data word at label `l` in this
    /// code. Its displacement is a fixup like a call's (the operand's `disp32` ends the
    /// instruction), so [`Assembler::regrow`] moves it with the code.
    pub fn cmov_rip(&mut self, cc: Cc, dst: Gpr, l: Label) {
        let rex = 0x48 | ((dst >> 3) << 2);
        let modrm = ((dst & 7) << 3) | 0b101;
        self.ops
            .extend(&[rex, 0x0f, 0x40 | cc as u8, modrm, 0, 0, 0, 0]);
        self.rel32_to(l);
    }

    /// 8 zero bytes at label `l`, after all code: the source of a [`Assembler::cmov_rip`]
    /// that selects 0. Not aligned (alignment padding would change when `regrow` moves
    /// the code; an unaligned load costs extra only across a cache line), so the code
    /// stays regrowable, unlike [`Assembler::data_u64`]'s.
    pub fn data_zero_u64(&mut self, l: Label) {
        self.bind(l);
        self.ops.push_u64(0);
    }

    /// `movzx dst32, src16` (`0F B7`).
    #[inline(always)]
    pub fn movzx16(&mut self, dst: Gpr, src: Gpr) {
        self.rr(&[], Sz::B32, &[0x0f, 0xb7], dst, src);
    }

    /// `movsx dst, src8` (`0F BE`). A byte source in 4–7 is `spl`…`dil` only with a REX
    /// prefix, which a 32-bit form between low registers would otherwise lack.
    #[inline(always)]
    pub fn movsx8(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        if (4..8).contains(&src) && sz != Sz::B64 && dst < 8 {
            self.raw(&[0x40, 0x0f, 0xbe, 0xc0 | ((dst & 7) << 3) | (src & 7)]);
        } else {
            self.rr(&[], sz, &[0x0f, 0xbe], dst, src);
        }
    }

    /// `movsx dst, src16` (`0F BF`).
    #[inline(always)]
    pub fn movsx16(&mut self, sz: Sz, dst: Gpr, src: Gpr) {
        self.rr(&[], sz, &[0x0f, 0xbf], dst, src);
    }

    /// `movsxd dst64, src32` (`REX.W 63`).
    #[inline(always)]
    pub fn movsxd(&mut self, dst: Gpr, src: Gpr) {
        self.rr(&[], Sz::B64, &[0x63], dst, src);
    }

    /// `bswap r` (`0F C8+r`), 32- or 64-bit.
    #[inline(always)]
    pub fn bswap(&mut self, sz: Sz, r: Gpr) {
        self.op_plus_r(sz, &[0x0f, 0xc8], r);
    }

    /// `push r64` (`50+r`).
    #[inline(always)]
    pub fn push(&mut self, r: Gpr) {
        self.op_plus_r(Sz::B32, &[0x50], r);
    }

    /// `pop r64` (`58+r`).
    #[inline(always)]
    pub fn pop(&mut self, r: Gpr) {
        self.op_plus_r(Sz::B32, &[0x58], r);
    }

    /// `lea dst, [base + disp]` (`8D`).
    #[inline(always)]
    pub fn lea(&mut self, dst: Gpr, base: Gpr, disp: i32) {
        self.rm(&[], Sz::B64, &[0x8d], dst, base, disp);
    }

    /// `lea dst, [base + index * 2^scale]` (`8D` with a SIB byte), 64-bit; `scale` ≤ 3 and
    /// `index` never rsp (its SIB encoding means no index).
    #[inline(always)]
    pub fn lea_index(&mut self, dst: Gpr, base: Gpr, index: Gpr, scale: u8) {
        debug_assert!(scale <= 3 && index != 4, "lea scale {scale}, index {index}");
        let mut b = Bytes::new();
        Self::head(&mut b, &[], Sz::B64, dst, index, base, false);
        b.push(0x8d);
        // rbp/r13 as base with mod = 00 means no base: they take a zero disp8.
        let md = if base & 7 == 5 { 0x40 } else { 0x00 };
        b.push(md | ((dst & 7) << 3) | 0b100);
        b.push((scale << 6) | ((index & 7) << 3) | (base & 7));
        if md == 0x40 {
            b.push(0);
        }
        self.put(&b);
        self.insns += 1;
    }

    /// `mov dst, [base + disp]` (`8B`), 32- or 64-bit.
    #[inline(always)]
    pub fn load(&mut self, sz: Sz, dst: Gpr, base: Gpr, disp: i32) {
        self.rm(&[], sz, &[0x8b], dst, base, disp);
    }

    /// `movzx dst32, byte/word [base + disp]` (`0F B6` / `0F B7`; `from` is the memory
    /// operand's size).
    #[inline(always)]
    pub fn load_zx(&mut self, from: Sz, dst: Gpr, base: Gpr, disp: i32) {
        let op = if from == Sz::B8 { 0xb6 } else { 0xb7 };
        self.rm(&[], Sz::B32, &[0x0f, op], dst, base, disp);
    }

    /// `movsx dst64, byte/word/dword [base + disp]` (`0F BE` / `0F BF` / `63`).
    #[inline(always)]
    pub fn load_sx(&mut self, from: Sz, dst: Gpr, base: Gpr, disp: i32) {
        let op: &[u8] = match from {
            Sz::B8 => &[0x0f, 0xbe],
            Sz::B16 => &[0x0f, 0xbf],
            _ => &[0x63],
        };
        self.rm(&[], Sz::B64, op, dst, base, disp);
    }

    /// `movbe dst, [base + disp]` (`0F 38 F0`): a load that swaps its bytes.
    #[inline(always)]
    pub fn movbe_load(&mut self, sz: Sz, dst: Gpr, base: Gpr, disp: i32) {
        self.rm(&[], sz, &[0x0f, 0x38, 0xf0], dst, base, disp);
    }

    /// `mov [base + disp], src` (`88` for a byte, else `89`).
    #[inline(always)]
    pub fn store(&mut self, sz: Sz, base: Gpr, disp: i32, src: Gpr) {
        let op = if sz == Sz::B8 { 0x88 } else { 0x89 };
        self.rm(&[], sz, &[op], src, base, disp);
    }

    /// `mov [base + disp], imm` (`C6 ib` for a byte, else `C7` with an `imm16`/`imm32`).
    #[inline(always)]
    pub fn store_imm(&mut self, sz: Sz, base: Gpr, disp: i32, imm: i32) {
        let (op, n) = match sz {
            Sz::B8 => (0xc6, 1),
            Sz::B16 => (0xc7, 2),
            _ => (0xc7, 4),
        };
        self.rm(&[], sz, &[op], 0, base, disp);
        self.imm(imm.into(), n);
    }

    /// `lock add/or/and/xor [base + disp], src`.
    #[inline(always)]
    pub fn lock_arith(&mut self, op: Arith, sz: Sz, base: Gpr, disp: i32, src: Gpr) {
        self.rm(&[LOCK], sz, &[op.mr()], src, base, disp);
    }

    /// `lock xadd [base + disp], src` (`0F C1`): src = the old value.
    #[inline(always)]
    pub fn lock_xadd(&mut self, sz: Sz, base: Gpr, disp: i32, src: Gpr) {
        self.rm(&[LOCK], sz, &[0x0f, 0xc1], src, base, disp);
    }

    /// `xchg [base + disp], src` (`87`, locked implicitly).
    #[inline(always)]
    pub fn xchg(&mut self, sz: Sz, base: Gpr, disp: i32, src: Gpr) {
        self.rm(&[], sz, &[0x87], src, base, disp);
    }

    /// `lock cmpxchg [base + disp], src` (`0F B1`): compares with rax, which gets the old
    /// value on a mismatch.
    #[inline(always)]
    pub fn lock_cmpxchg(&mut self, sz: Sz, base: Gpr, disp: i32, src: Gpr) {
        self.rm(&[LOCK], sz, &[0x0f, 0xb1], src, base, disp);
    }

    /// `mov dst32, fs:[base + disp]` (`64 8B`): a load relative to the thread pointer.
    #[inline(always)]
    pub fn fs_load32(&mut self, dst: Gpr, base: Gpr, disp: i32) {
        self.rm(&[FS], Sz::B32, &[0x8b], dst, base, disp);
    }

    /// `mov dst32, fs:[disp32]` (`64 8B`, SIB with no base and no index): a field at a fixed
    /// offset from the thread pointer.
    pub fn fs_load32_abs(&mut self, dst: Gpr, disp: i32) {
        let mut b = Bytes::new();
        Self::head(&mut b, &[FS], Sz::B32, dst, 0, 0, false);
        b.extend(&[0x8b, 0x04 | ((dst & 7) << 3), 0x25]);
        b.extend(&disp.to_le_bytes());
        self.put(&b);
        self.insns += 1;
    }
}

/// The `lock` prefix.
const LOCK: u8 = 0xf0;
/// The `fs` segment override.
const FS: u8 = 0x64;

#[cfg(test)]
mod tests {
    use super::*;

    /// How a pass ended, for these tests: final, or the forms the next pass needs.
    enum Resolved {
        Done,
        Again(Vec<Form>),
    }

    /// Emits `jmp l` (or `jcc`) over `gap` filler bytes (forward) or back over them, with
    /// the given site forms, and returns the pass outcome and the encoder.
    fn pass(forms: Vec<Form>, cc: Option<Cc>, gap: usize, forward: bool) -> (Resolved, Assembler) {
        let mut e = Assembler::new(forms);
        let l = e.label();
        if forward {
            e.jump(cc, l);
            e.raw(&vec![0x90; gap]);
            e.bind(l);
        } else {
            e.bind(l);
            e.raw(&vec![0x90; gap]);
            e.jump(cc, l);
        }
        let checks = e.branch_checks().expect("labels bound");
        let r = if checks
            .iter()
            .all(|c| (c.range.0..=c.range.1).contains(&c.disp))
        {
            Resolved::Done
        } else {
            Resolved::Again(checks.iter().map(|_| Form::Rel32).collect())
        };
        (r, e)
    }

    #[test]
    fn rel8_reaches_exactly_its_range_and_grows_beyond() {
        // Forward: the displacement counts from the end of the 2-byte jump, so 127 filler
        // bytes is the last reach of rel8.
        let (r, e) = pass(vec![], None, 127, true);
        assert!(matches!(r, Resolved::Done));
        let b = e.finish().unwrap();
        assert_eq!(&b[..2], &[0xeb, 0x7f]);
        let (r, _) = pass(vec![], None, 128, true);
        let Resolved::Again(long) = r else {
            panic!("128 bytes forward must not fit rel8")
        };
        assert_eq!(long, vec![Form::Rel32]);
        let (r, e) = pass(long, None, 128, true);
        assert!(matches!(r, Resolved::Done));
        assert_eq!(&e.finish().unwrap()[..5], &[0xe9, 0x80, 0, 0, 0]);

        // Backward: -128 (126 filler bytes + the jump itself) still fits, -129 does not.
        let (r, e) = pass(vec![], Some(Cc::Ne), 126, false);
        assert!(matches!(r, Resolved::Done));
        assert_eq!(&e.finish().unwrap()[126..], &[0x75, 0x80]);
        // -129 does not fit, and the first pass already knows it: rel32 at once.
        let (r, e) = pass(vec![], Some(Cc::Ne), 127, false);
        assert!(
            matches!(r, Resolved::Done),
            "a far backward jump takes one pass"
        );
        // jne rel32 is 6 bytes: -(127 + 6) = -133.
        assert_eq!(
            &e.finish().unwrap()[127..],
            &[0x0f, 0x85, 0x7b, 0xff, 0xff, 0xff]
        );
    }

    #[test]
    fn every_condition_encodes_its_nibble_in_both_forms() {
        let all = [
            Cc::B,
            Cc::Ae,
            Cc::E,
            Cc::Ne,
            Cc::Be,
            Cc::A,
            Cc::L,
            Cc::Ge,
            Cc::Le,
            Cc::G,
        ];
        for cc in all {
            let (_, e) = pass(vec![Form::Rel8], Some(cc), 0, true);
            assert_eq!(e.finish().unwrap(), vec![0x70 | cc as u8, 0], "{cc:?} rel8");
            let (_, e) = pass(vec![Form::Rel32], Some(cc), 0, true);
            assert_eq!(
                e.finish().unwrap(),
                vec![0x0f, 0x80 | cc as u8, 0, 0, 0, 0],
                "{cc:?} rel32"
            );
            assert_eq!(cc.invert().invert(), cc);
            assert_eq!(cc.invert() as u8, cc as u8 ^ 1);
        }
    }

    #[test]
    fn calls_are_rel32_and_labels_must_be_bound_once() {
        let mut e = Assembler::new(vec![]);
        let f = e.label();
        e.call_label(f);
        e.ret();
        e.bind(f);
        e.ret();
        // A call is not a relaxable site: nothing to report, and it is in range.
        assert_eq!(e.branch_checks(), Ok(vec![]));
        assert_eq!(e.insns, 3);
        assert_eq!(e.finish().unwrap(), vec![0xe8, 1, 0, 0, 0, 0xc3, 0xc3]);

        let mut e = Assembler::new(vec![]);
        let l = e.label();
        e.jump(None, l);
        let err = e.branch_checks().expect_err("unbound label");
        assert!(err.contains("never bound"), "{err}");

        let mut e = Assembler::new(vec![]);
        let l = e.label();
        e.bind(l);
        e.ret();
        e.bind(l);
        assert!(e.finish().is_err(), "a label bound twice is an error");
    }
}
