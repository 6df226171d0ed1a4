//! x86-64 instruction forms: REX/ModRM/SIB assembly, immediates and branch fixups.
//!
//! Every encoder picks the shortest form for its operands: no REX unless a register needs it
//! (r8–r15, 64-bit operand, or `sil`/`dil` as a byte register), `disp8` whenever the
//! displacement fits, no displacement at all for 0 (except `rbp`/`r13` bases, whose
//! `mod = 00` encoding means RIP-relative / no base), `imm8` forms for small immediates.
//!
//! Branches are emitted against [`Label`]s and resolved after the pass. A branch starts as
//! `rel8`; [`Enc::resolve`] marks every `rel8` that does not reach as `rel32` and asks for
//! another pass. Forms only grow, so the passes terminate (the kernel's x86 JIT iterates the
//! same way until the image size converges).

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

/// A branch target inside the code being emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(pub u32);

/// A `rel8`/`rel32` field waiting for its label.
#[derive(Clone, Copy, Debug)]
struct Fixup {
    /// Index of the branch site in emission order (key into `long`).
    site: usize,
    /// Byte offset of the displacement field.
    at: usize,
    /// Field width: 1 or 4.
    width: u8,
    label: Label,
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

/// Code buffer with labels and branch fixups for one emission pass.
pub struct Enc {
    /// The bytes.
    pub buf: Vec<u8>,
    labels: Vec<Option<usize>>,
    fixups: Vec<Fixup>,
    /// Per branch site: use `rel32` (decided by earlier passes).
    long: Vec<bool>,
    sites: usize,
    /// Instructions emitted (for the compile result's native instruction count).
    pub insns: usize,
}

/// How a pass ended.
pub enum Resolved {
    /// All branches reach: the code is final.
    Done,
    /// Some `rel8` did not reach; re-emit with the returned per-site forms.
    Again(Vec<bool>),
}

impl Enc {
    /// A new buffer; `long` holds the branch forms chosen by earlier passes.
    pub fn new(long: Vec<bool>) -> Self {
        Enc {
            buf: Vec::with_capacity(1024),
            labels: Vec::new(),
            fixups: Vec::new(),
            long,
            sites: 0,
            insns: 0,
        }
    }

    /// Current offset.
    pub fn pos(&self) -> usize {
        self.buf.len()
    }

    /// A fresh, unbound label.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() as u32 - 1)
    }

    /// Binds `l` here.
    pub fn bind(&mut self, l: Label) {
        debug_assert!(self.labels[l.0 as usize].is_none(), "label bound twice");
        self.labels[l.0 as usize] = Some(self.buf.len());
    }

    /// Offset of a bound label.
    pub fn offset_of(&self, l: Label) -> Option<usize> {
        self.labels[l.0 as usize]
    }

    fn b(&mut self, x: u8) {
        self.buf.push(x);
    }

    fn bs(&mut self, x: &[u8]) {
        self.buf.extend_from_slice(x);
    }

    /// Raw bytes counted as one instruction.
    pub fn raw(&mut self, x: &[u8]) {
        self.insns += 1;
        self.bs(x);
    }

    fn imm(&mut self, v: i64, bytes: usize) {
        self.bs(&v.to_le_bytes()[..bytes]);
    }

    /// Prefixes (0x66 for 16-bit, then `pfx` such as lock/mandatory) and the REX byte.
    fn head(&mut self, pfx: &[u8], sz: Sz, reg: Gpr, index: Gpr, base: Gpr, byte_regs: bool) {
        if sz == Sz::B16 {
            self.b(0x66);
        }
        self.bs(pfx);
        let rex = 0x40
            | (u8::from(sz == Sz::B64) << 3)
            | ((reg >> 3) << 2)
            | ((index >> 3) << 1)
            | (base >> 3);
        // A byte operand in registers 4–7 means spl..dil only with a REX prefix (without
        // one it would be ah..bh).
        if rex != 0x40 || byte_regs {
            self.b(rex);
        }
    }

    /// `op reg, rm` with both operands registers (`mod = 11`).
    pub fn rr(&mut self, pfx: &[u8], sz: Sz, op: &[u8], reg: Gpr, rm: Gpr) {
        let byte_regs = sz == Sz::B8 && ((4..8).contains(&reg) || (4..8).contains(&rm));
        self.head(pfx, sz, reg, 0, rm, byte_regs);
        self.bs(op);
        self.b(0xc0 | ((reg & 7) << 3) | (rm & 7));
        self.insns += 1;
    }

    /// `op reg, [base + disp]`.
    pub fn rm(&mut self, pfx: &[u8], sz: Sz, op: &[u8], reg: Gpr, base: Gpr, disp: i32) {
        let byte_regs = sz == Sz::B8 && (4..8).contains(&reg);
        self.head(pfx, sz, reg, 0, base, byte_regs);
        self.bs(op);
        self.modrm_mem(reg, base, disp);
        self.insns += 1;
    }

    /// ModRM (+ SIB, + displacement) for `[base + disp]`, shortest form.
    fn modrm_mem(&mut self, reg: Gpr, base: Gpr, disp: i32) {
        // rbp/r13 as base with mod = 00 means RIP-relative: they always carry a disp8.
        let md = if disp == 0 && base & 7 != 5 {
            0x00
        } else if i8::try_from(disp).is_ok() {
            0x40
        } else {
            0x80
        };
        self.b(md | ((reg & 7) << 3) | (base & 7));
        // rsp/r12 as base need a SIB byte (index = none).
        if base & 7 == 4 {
            self.b(0x24);
        }
        match md {
            0x40 => self.imm(disp as i64, 1),
            0x80 => self.imm(disp as i64, 4),
            _ => {}
        }
    }

    /// Appends an immediate of `bytes` bytes (after an `rr`/`rm` that takes one).
    pub fn imm_bytes(&mut self, v: i64, bytes: usize) {
        self.imm(v, bytes);
    }

    /// `op reg` with the register in the opcode's low bits (`push`, `pop`, `bswap`,
    /// `mov r, imm`).
    pub fn op_plus_r(&mut self, sz: Sz, op: &[u8], r: Gpr) {
        self.head(&[], sz, 0, 0, r, false);
        let (last, rest) = op.split_last().expect("opcode");
        self.bs(rest);
        self.b(last + (r & 7));
        self.insns += 1;
    }

    /// A VEX-encoded (3-byte `C4`) `op reg, rm, vvvv` over map `0F38` with register
    /// operands; `pp`: 1 = 66, 2 = F3, 3 = F2.
    pub fn vex_0f38_rr(&mut self, w: bool, pp: u8, op: u8, reg: Gpr, rm: Gpr, vvvv: Gpr) {
        self.b(0xc4);
        // R̄ X̄ B̄ and the map select 0b00010 (0F38).
        self.b((((reg >> 3) ^ 1) << 7) | (1 << 6) | (((rm >> 3) ^ 1) << 5) | 0b00010);
        self.b((u8::from(w) << 7) | ((!vvvv & 0xf) << 3) | pp);
        self.b(op);
        self.b(0xc0 | ((reg & 7) << 3) | (rm & 7));
        self.insns += 1;
    }

    /// `jmp label` (`cc = None`) or `jcc label`, `rel8` unless this site was found out of
    /// range by an earlier pass.
    pub fn jump(&mut self, cc: Option<Cc>, l: Label) {
        let site = self.sites;
        self.sites += 1;
        let long = self.long.get(site).copied().unwrap_or(false);
        match (cc, long) {
            (None, false) => self.b(0xeb),
            (Some(c), false) => self.b(0x70 | c as u8),
            (None, true) => self.b(0xe9),
            (Some(c), true) => self.bs(&[0x0f, 0x80 | c as u8]),
        }
        let width = if long { 4 } else { 1 };
        self.fixups.push(Fixup {
            site,
            at: self.buf.len(),
            width,
            label: l,
        });
        self.imm(0, width as usize);
        self.insns += 1;
    }

    /// `call label` (always `rel32`: calls have no short form).
    pub fn call_label(&mut self, l: Label) {
        self.b(0xe8);
        self.fixups.push(Fixup {
            site: usize::MAX,
            at: self.buf.len(),
            width: 4,
            label: l,
        });
        self.imm(0, 4);
        self.insns += 1;
    }

    /// Patches every branch, or reports which `rel8` sites must grow.
    pub fn resolve(&mut self) -> Result<Resolved, String> {
        let mut long = self.long.clone();
        long.resize(self.sites, false);
        let mut grew = false;
        for f in &self.fixups {
            let target = self.labels[f.label.0 as usize]
                .ok_or_else(|| format!("internal: label {} never bound", f.label.0))?;
            let disp = target as i64 - (f.at + f.width as usize) as i64;
            if f.width == 1 && i8::try_from(disp).is_err() {
                long[f.site] = true;
                grew = true;
            } else if i32::try_from(disp).is_err() {
                return Err(format!("branch displacement {disp} exceeds rel32"));
            }
        }
        if grew {
            return Ok(Resolved::Again(long));
        }
        for f in self.fixups.clone() {
            let target = self.labels[f.label.0 as usize].expect("checked above");
            let disp = target as i64 - (f.at + f.width as usize) as i64;
            let bytes = disp.to_le_bytes();
            self.buf[f.at..f.at + f.width as usize].copy_from_slice(&bytes[..f.width as usize]);
        }
        Ok(Resolved::Done)
    }
}
