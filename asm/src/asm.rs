//! Assembler for the bpf_conformance assembly dialect.
//!
//! Syntax (one instruction per line, `#` comments, `label:` lines):
//!
//! | form | encoding |
//! |---|---|
//! | `add %r1, %r2` / `add32 %r1, -3` / `add64 …` | ALU64 (no suffix or `64`) or ALU (`32`), reg or imm source |
//! | `neg %r1`, `neg32 %r1` | NEG, no source |
//! | `sdiv`/`smod`(`32`) | DIV/MOD with `offset = 1` |
//! | `movsx{8,16,32}{32,64} %rd, %rs` | MOV reg with `offset` = 8/16/32 (movsx3232 does not exist) |
//! | `be16/32/64`, `le16/32/64` | ALU class END (`0xdc`/`0xd4`), width in `imm` |
//! | `swap16/32/64`, `bswap16/32/64` | ALU64 class END (`0xd7`) |
//! | `lddw %rd, imm64` | two slots, `0x18` |
//! | `ldx{b,h,w,dw} %rd, [%rs+off]`, `ldxs{b,h,w}` | LDX MEM / MEMSX |
//! | `st{b,h,w,dw} [%rd+off], imm`, `stx{b,h,w,dw} [%rd+off], %rs` | ST / STX MEM |
//! | `lock [fetch] {add,and,or,xor}[32] [%rd+off], %rs` | STX ATOMIC, op in `imm` (+`0x01` fetch) |
//! | `lock xchg[32] …`, `lock cmpxchg[32] …` | `imm` 0xe1 / 0xf1 (always fetch) |
//! | `ja L`, `ja +n` | JMP JA, target in `offset` |
//! | `ja32 L` | JMP32 JA ("gotol"), target in `imm` |
//! | `jeq[32] %rd, %rs/imm, L` … | JMP / JMP32 conditional |
//! | `call N`, `call helper N` | `0x85`, `src = 0`, `imm = N` |
//! | `call %rN`, `call helper %rN` | callx `0x8d`, register in `dst`, `imm = 0` (the Linux/upstream encoding) |
//! | `call local L` | `0x85`, `src = 1`, `imm` = slot offset from the next instruction |
//! | `call runtime N` | `0x85`, `src = 2` (assembled; packjit's verifier rejects it) |
//! | `exit` | `0x95` |
//!
//! Jump targets are labels or signed slot offsets (`+3`, `-2`). As upstream, the first `exit`
//! also defines a label `exit` (unless the source defines one itself). Immediates: decimal in
//! the `i32` range, or hex up to `0xffffffff` (taken as the bit pattern); `lddw` takes any
//! 64-bit value. Offsets: decimal in the `i16` range or hex up to `0xffff`. Registers are
//! `%r0`–`%r10`; `%r11`–`%r15` are accepted (the field has 4 bits) so negative tests can
//! encode them.

use packjit_frontend::RawInsn;
use std::collections::HashMap;
use std::fmt;

/// An assembler error, naming the 1-based source line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmError {
    /// 1-based line number in the source passed to [`assemble`].
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for AsmError {}

type R<T> = Result<T, String>;

/// Encoded slots and, for a jump to a label, the label and the field to patch.
type Encoded = (Vec<RawInsn>, Option<(String, Field)>);

/// Splits an operand list on commas and whitespace, keeping `[...]` together (so both
/// `[%r1+8]` and `[%r1 + 8]` work).
fn tokenize(s: &str) -> R<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0;
    for c in s.chars() {
        match c {
            '[' => {
                depth += 1;
                cur.push(c);
            }
            ']' => {
                if depth == 0 {
                    return Err("unbalanced `]`".into());
                }
                depth -= 1;
                cur.push(c);
            }
            c if depth > 0 && c.is_whitespace() => {}
            c if c == ',' || c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if depth != 0 {
        return Err("unbalanced `[`".into());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

fn parse_reg(s: &str) -> R<u8> {
    let n = s.strip_prefix("%r").or_else(|| s.strip_prefix('r'));
    match n.and_then(|n| n.parse::<u8>().ok()) {
        Some(n) if n <= 15 && !s.ends_with('+') => Ok(n),
        _ => Err(format!("invalid register `{s}`")),
    }
}

/// Splits a signed literal into (negative, magnitude, is_hex).
fn parse_lit(s: &str) -> R<(bool, u128, bool)> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (hex, digits) = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(h) => (true, h),
        None => (false, body),
    };
    let v = if hex {
        u128::from_str_radix(digits, 16)
    } else {
        digits.parse::<u128>()
    };
    match v {
        Ok(v) if !digits.is_empty() && !digits.starts_with(['+', '-']) => Ok((neg, v, hex)),
        _ => Err(format!("`{s}` is not a number")),
    }
}

/// A 32-bit immediate: decimal within `i32`, hex up to `0xffffffff` (bit pattern).
fn parse_imm32(s: &str) -> R<i32> {
    let (neg, mag, hex) = parse_lit(s)?;
    let err = || format!("immediate `{s}` is out of 32-bit range");
    if hex && !neg {
        return u32::try_from(mag).map(|v| v as i32).map_err(|_| err());
    }
    let v = if neg {
        -(i128::try_from(mag).map_err(|_| err())?)
    } else {
        mag as i128
    };
    i32::try_from(v).map_err(|_| err())
}

/// A 64-bit immediate: any value that fits `u64` or `i64`.
fn parse_imm64(s: &str) -> R<u64> {
    let (neg, mag, _) = parse_lit(s)?;
    let err = || format!("immediate `{s}` is out of 64-bit range");
    if neg {
        let v = -(i128::try_from(mag).map_err(|_| err())?);
        i64::try_from(v).map(|v| v as u64).map_err(|_| err())
    } else {
        u64::try_from(mag).map_err(|_| err())
    }
}

/// A 16-bit offset: decimal within `i16`, hex up to `0xffff` (bit pattern).
fn parse_off(s: &str) -> R<i16> {
    let (neg, mag, hex) = parse_lit(s)?;
    let err = || format!("offset `{s}` is out of 16-bit range");
    if hex && !neg {
        return u16::try_from(mag).map(|v| v as i16).map_err(|_| err());
    }
    let v = if neg {
        -(i128::try_from(mag).map_err(|_| err())?)
    } else {
        mag as i128
    };
    i16::try_from(v).map_err(|_| err())
}

/// `[%rN]`, `[%rN+off]`, `[%rN-off]`.
fn parse_mem(s: &str) -> R<(u8, i16)> {
    let inner = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| format!("expected a memory operand `[%rN+off]`, got `{s}`"))?;
    match inner.find(['+', '-']) {
        Some(i) => Ok((parse_reg(&inner[..i])?, parse_off(&inner[i..])?)),
        None => Ok((parse_reg(inner)?, 0)),
    }
}

/// Jump target: a signed offset (`+n`/`-n`) or a label resolved later.
enum Target {
    Off(i64),
    Label(String),
}

fn parse_target(s: &str) -> R<Target> {
    if s.starts_with(['+', '-']) {
        let (neg, mag, _) = parse_lit(s)?;
        let v = i64::try_from(mag).map_err(|_| format!("offset `{s}` is out of range"))?;
        Ok(Target::Off(if neg { -v } else { v }))
    } else if s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !s.is_empty()
    {
        Ok(Target::Label(s.to_string()))
    } else {
        Err(format!("invalid jump target `{s}`"))
    }
}

/// Where a resolved jump target goes in the instruction.
#[derive(Clone, Copy)]
enum Field {
    Off,
    Imm,
}

struct Fixup {
    slot: usize,
    line: usize,
    label: String,
    field: Field,
}

fn insn(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> RawInsn {
    RawInsn {
        opc,
        dst,
        src,
        off,
        imm,
    }
}

fn expect_ops(mn: &str, ops: &[String], n: usize) -> R<()> {
    if ops.len() != n {
        return Err(format!(
            "invalid number of operands for `{mn}`: expected {n}, got {}",
            ops.len()
        ));
    }
    Ok(())
}

const ALU_OPS: &[(&str, u8)] = &[
    ("add", 0x00),
    ("sub", 0x10),
    ("mul", 0x20),
    ("div", 0x30),
    ("sdiv", 0x30),
    ("or", 0x40),
    ("and", 0x50),
    ("lsh", 0x60),
    ("rsh", 0x70),
    ("neg", 0x80),
    ("mod", 0x90),
    ("smod", 0x90),
    ("xor", 0xa0),
    ("mov", 0xb0),
    ("arsh", 0xc0),
];

const JMP_OPS: &[(&str, u8)] = &[
    ("jeq", 0x10),
    ("jgt", 0x20),
    ("jge", 0x30),
    ("jset", 0x40),
    ("jne", 0x50),
    ("jsgt", 0x60),
    ("jsge", 0x70),
    ("jlt", 0xa0),
    ("jle", 0xb0),
    ("jslt", 0xc0),
    ("jsle", 0xd0),
];

/// Splits an optional `32`/`64` width suffix: (base, is_32).
fn split_width(mn: &str) -> (&str, bool) {
    if let Some(b) = mn.strip_suffix("32") {
        (b, true)
    } else if let Some(b) = mn.strip_suffix("64") {
        (b, false)
    } else {
        (mn, false)
    }
}

/// Encodes one instruction line (mnemonic + operands). Returns the slots and, for jumps to
/// labels, the label and the field to patch.
fn encode(mn: &str, ops: &[String]) -> R<Encoded> {
    let one = |i: RawInsn| Ok((vec![i], None));
    // Byte swaps: the width is part of the mnemonic.
    for (prefix, opc) in [
        ("bswap", 0xd7u8),
        ("swap", 0xd7),
        ("be", 0xdc),
        ("le", 0xd4),
    ] {
        if let Some(bits) = mn.strip_prefix(prefix) {
            if let Ok(bits @ (16 | 32 | 64)) = bits.parse::<i32>() {
                expect_ops(mn, ops, 1)?;
                return one(insn(opc, parse_reg(&ops[0])?, 0, 0, bits));
            }
        }
    }
    // movsx{8,16,32}{32,64}: the source width goes in `offset`.
    if let Some(rest) = mn.strip_prefix("movsx") {
        let (bits, cls) = match rest {
            "832" => (8, 0x04),
            "864" => (8, 0x07),
            "1632" => (16, 0x04),
            "1664" => (16, 0x07),
            "3264" => (32, 0x07),
            _ => return Err(format!("unknown mnemonic `{mn}`")),
        };
        expect_ops(mn, ops, 2)?;
        return one(insn(
            cls | 0x08 | 0xb0,
            parse_reg(&ops[0])?,
            parse_reg(&ops[1])?,
            bits,
            0,
        ));
    }
    match mn {
        "exit" => {
            expect_ops(mn, ops, 0)?;
            return one(insn(0x95, 0, 0, 0, 0));
        }
        "lddw" => {
            expect_ops(mn, ops, 2)?;
            let v = parse_imm64(&ops[1])?;
            let lo = insn(0x18, parse_reg(&ops[0])?, 0, 0, v as u32 as i32);
            let hi = insn(0, 0, 0, 0, (v >> 32) as u32 as i32);
            return Ok((vec![lo, hi], None));
        }
        "ja" | "ja32" => {
            expect_ops(mn, ops, 1)?;
            let (opc, field) = if mn == "ja" {
                (0x05, Field::Off)
            } else {
                (0x06, Field::Imm)
            };
            return jump(insn(opc, 0, 0, 0, 0), &ops[0], field);
        }
        "call" => {
            // `call N` / `call %rN` default to the helper form.
            let (mode, target) = match ops.len() {
                1 => ("helper", &ops[0]),
                2 => (ops[0].as_str(), &ops[1]),
                n => {
                    return Err(format!(
                        "invalid number of operands for `call`: expected 1 or 2, got {n}"
                    ))
                }
            };
            return match mode {
                "helper" if target.starts_with('%') => one(insn(0x8d, parse_reg(target)?, 0, 0, 0)),
                "helper" => one(insn(0x85, 0, 0, 0, parse_imm32(target)?)),
                "local" => jump(insn(0x85, 0, 1, 0, 0), target, Field::Imm),
                "runtime" => one(insn(0x85, 0, 2, 0, parse_imm32(target)?)),
                other => Err(format!(
                    "invalid call mode `{other}` (helper, local or runtime)"
                )),
            };
        }
        "lock" => return encode_lock(ops),
        _ => {}
    }
    // Loads and stores.
    let size_of = |s: &str| match s {
        "b" => Some(0x10u8),
        "h" => Some(0x08),
        "w" => Some(0x00),
        "dw" => Some(0x18),
        _ => None,
    };
    if let Some(sz) = mn
        .strip_prefix("ldxs")
        .and_then(size_of)
        .filter(|&s| s != 0x18)
    {
        expect_ops(mn, ops, 2)?;
        let (src, off) = parse_mem(&ops[1])?;
        return one(insn(0x81 | sz, parse_reg(&ops[0])?, src, off, 0));
    }
    if let Some(sz) = mn.strip_prefix("ldx").and_then(size_of) {
        expect_ops(mn, ops, 2)?;
        let (src, off) = parse_mem(&ops[1])?;
        return one(insn(0x61 | sz, parse_reg(&ops[0])?, src, off, 0));
    }
    if let Some(sz) = mn.strip_prefix("stx").and_then(size_of) {
        expect_ops(mn, ops, 2)?;
        let (dst, off) = parse_mem(&ops[0])?;
        return one(insn(0x63 | sz, dst, parse_reg(&ops[1])?, off, 0));
    }
    if let Some(sz) = mn.strip_prefix("st").and_then(size_of) {
        expect_ops(mn, ops, 2)?;
        let (dst, off) = parse_mem(&ops[0])?;
        return one(insn(0x62 | sz, dst, 0, off, parse_imm32(&ops[1])?));
    }
    // Conditional jumps.
    let (base, is32) = split_width(mn);
    if let Some(&(_, code)) = JMP_OPS.iter().find(|(n, _)| *n == base) {
        if mn.ends_with("64") {
            return Err(format!(
                "unknown mnemonic `{mn}` (64-bit jumps have no suffix)"
            ));
        }
        expect_ops(mn, ops, 3)?;
        let cls = if is32 { 0x06 } else { 0x05 };
        let dst = parse_reg(&ops[0])?;
        let i = if ops[1].starts_with('%') {
            insn(cls | 0x08 | code, dst, parse_reg(&ops[1])?, 0, 0)
        } else {
            insn(cls | code, dst, 0, 0, parse_imm32(&ops[1])?)
        };
        return jump(i, &ops[2], Field::Off);
    }
    // ALU.
    if let Some(&(_, code)) = ALU_OPS.iter().find(|(n, _)| *n == base) {
        let cls = if is32 { 0x04 } else { 0x07 };
        let off = if base == "sdiv" || base == "smod" {
            1
        } else {
            0
        };
        if base == "neg" {
            expect_ops(mn, ops, 1)?;
            return one(insn(cls | code, parse_reg(&ops[0])?, 0, 0, 0));
        }
        expect_ops(mn, ops, 2)?;
        let dst = parse_reg(&ops[0])?;
        return if ops[1].starts_with('%') {
            one(insn(cls | 0x08 | code, dst, parse_reg(&ops[1])?, off, 0))
        } else {
            one(insn(cls | code, dst, 0, off, parse_imm32(&ops[1])?))
        };
    }
    Err(format!("unknown mnemonic `{mn}`"))
}

fn jump(mut i: RawInsn, target: &str, field: Field) -> R<Encoded> {
    match parse_target(target)? {
        Target::Off(v) => {
            match field {
                Field::Off => {
                    i.off = i16::try_from(v)
                        .map_err(|_| format!("jump offset {v} is out of 16-bit range"))?
                }
                Field::Imm => {
                    i.imm = i32::try_from(v)
                        .map_err(|_| format!("jump offset {v} is out of 32-bit range"))?
                }
            }
            Ok((vec![i], None))
        }
        Target::Label(l) => Ok((vec![i], Some((l, field)))),
    }
}

/// `lock [fetch] op[32] [%rd+off], %rs`.
fn encode_lock(ops: &[String]) -> R<Encoded> {
    let bad = || {
        "invalid number of operands for `lock`: expected `lock [fetch] OP [%rN+off], %rM`"
            .to_string()
    };
    let (fetch, rest) = match ops.first().map(String::as_str) {
        Some("fetch") => (true, &ops[1..]),
        Some(_) => (false, ops),
        None => return Err(bad()),
    };
    if rest.len() != 3 {
        return Err(bad());
    }
    let (op, is32) = split_width(&rest[0]);
    let opc = if is32 { 0xc3 } else { 0xdb };
    let imm = match op {
        "add" => 0x00,
        "or" => 0x40,
        "and" => 0x50,
        "xor" => 0xa0,
        // xchg and cmpxchg always fetch; `fetch` is accepted and redundant.
        "xchg" => 0xe1,
        "cmpxchg" => 0xf1,
        other => return Err(format!("unknown atomic operation `{other}`")),
    } | if fetch { 0x01 } else { 0 };
    let (dst, off) = parse_mem(&rest[1])?;
    Ok((vec![insn(opc, dst, parse_reg(&rest[2])?, off, imm)], None))
}

/// Assembles `src` into eBPF bytecode.
pub fn assemble(src: &str) -> Result<Vec<u8>, AsmError> {
    let mut slots: Vec<RawInsn> = Vec::new();
    let mut labels: HashMap<String, (usize, usize)> = HashMap::new();
    let mut implicit_exit: Option<usize> = None;
    let mut fixups: Vec<Fixup> = Vec::new();
    for (idx, raw_line) in src.lines().enumerate() {
        let line = idx + 1;
        let err = |message: String| AsmError { line, message };
        let text = raw_line.split('#').next().unwrap_or("").trim();
        if text.is_empty() {
            continue;
        }
        let (first, rest) = match text.find(char::is_whitespace) {
            Some(i) => (&text[..i], text[i..].trim()),
            None => (text, ""),
        };
        let (mn, rest) = if let Some(label) = first.strip_suffix(':') {
            if label.is_empty() || parse_target(label).is_err() || label.starts_with(['+', '-']) {
                return Err(err(format!("invalid label `{label}`")));
            }
            if let Some((_, prev)) = labels.insert(label.to_string(), (slots.len(), line)) {
                return Err(err(format!(
                    "duplicate label `{label}` (first defined on line {prev})"
                )));
            }
            // A label may share its line with an instruction.
            match rest.find(char::is_whitespace) {
                _ if rest.is_empty() => continue,
                Some(i) => (&rest[..i], rest[i..].trim()),
                None => (rest, ""),
            }
        } else {
            (first, rest)
        };
        let mn = mn.to_ascii_lowercase();
        let ops = tokenize(rest).map_err(err)?;
        if mn == "exit" && implicit_exit.is_none() {
            implicit_exit = Some(slots.len());
        }
        let (insns, fix) = encode(&mn, &ops).map_err(err)?;
        if let Some((label, field)) = fix {
            fixups.push(Fixup {
                slot: slots.len(),
                line,
                label,
                field,
            });
        }
        slots.extend(insns);
    }
    for f in fixups {
        let target = match labels.get(&f.label) {
            Some(&(t, _)) => t,
            None if f.label == "exit" && implicit_exit.is_some() => implicit_exit.unwrap_or(0),
            None => {
                return Err(AsmError {
                    line: f.line,
                    message: format!("undefined label `{}`", f.label),
                })
            }
        };
        let rel = target as i64 - f.slot as i64 - 1;
        let slot = &mut slots[f.slot];
        match f.field {
            Field::Off => {
                slot.off = i16::try_from(rel).map_err(|_| AsmError {
                    line: f.line,
                    message: format!("jump to `{}` ({rel} slots) is out of 16-bit range", f.label),
                })?
            }
            Field::Imm => {
                slot.imm = i32::try_from(rel).map_err(|_| AsmError {
                    line: f.line,
                    message: format!("jump to `{}` is out of 32-bit range", f.label),
                })?
            }
        }
    }
    Ok(slots.iter().flat_map(|s| s.to_bytes()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(src: &str) -> [u8; 8] {
        let b = assemble(src).unwrap_or_else(|e| panic!("{src}: {e}"));
        assert_eq!(b.len(), 8, "{src}");
        b.try_into().unwrap()
    }

    fn raw(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        insn(opc, dst, src, off, imm).to_bytes()
    }

    fn err(src: &str) -> String {
        assemble(src).unwrap_err().to_string()
    }

    #[test]
    fn alu_forms() {
        assert_eq!(one("add %r1, %r2"), raw(0x0f, 1, 2, 0, 0));
        assert_eq!(one("add64 %r1, 7"), raw(0x07, 1, 0, 0, 7));
        assert_eq!(one("add32 %r0, -3"), raw(0x04, 0, 0, 0, -3));
        assert_eq!(one("mov32 %r0, 0xffffffff"), raw(0xb4, 0, 0, 0, -1));
        assert_eq!(one("neg %r3"), raw(0x87, 3, 0, 0, 0));
        assert_eq!(one("neg32 %r3"), raw(0x84, 3, 0, 0, 0));
        assert_eq!(one("arsh32 %r1, %r9"), raw(0xcc, 1, 9, 0, 0));
        assert_eq!(one("sdiv %r1, %r2"), raw(0x3f, 1, 2, 1, 0));
        assert_eq!(one("sdiv32 %r1, -2"), raw(0x34, 1, 0, 1, -2));
        assert_eq!(one("smod %r1, 3"), raw(0x97, 1, 0, 1, 3));
        assert_eq!(one("smod32 %r1, %r2"), raw(0x9c, 1, 2, 1, 0));
        assert_eq!(one("div %r1, %r2"), raw(0x3f, 1, 2, 0, 0));
        assert_eq!(one("mod32 %r1, 5"), raw(0x94, 1, 0, 0, 5));
    }

    #[test]
    fn movsx_and_byteswaps() {
        assert_eq!(one("movsx832 %r2, %r1"), raw(0xbc, 2, 1, 8, 0));
        assert_eq!(one("movsx864 %r6, %r5"), raw(0xbf, 6, 5, 8, 0));
        assert_eq!(one("movsx1632 %r4, %r3"), raw(0xbc, 4, 3, 16, 0));
        assert_eq!(one("movsx1664 %r8, %r7"), raw(0xbf, 8, 7, 16, 0));
        assert_eq!(one("movsx3264 %r0, %r9"), raw(0xbf, 0, 9, 32, 0));
        assert!(err("movsx3232 %r0, %r1").contains("unknown mnemonic"));
        assert_eq!(one("be16 %r0"), raw(0xdc, 0, 0, 0, 16));
        assert_eq!(one("be64 %r0"), raw(0xdc, 0, 0, 0, 64));
        assert_eq!(one("le32 %r1"), raw(0xd4, 1, 0, 0, 32));
        assert_eq!(one("swap16 %r1"), raw(0xd7, 1, 0, 0, 16));
        assert_eq!(one("bswap64 %r1"), raw(0xd7, 1, 0, 0, 64));
    }

    #[test]
    fn memory_forms() {
        assert_eq!(one("ldxb %r0, [%r1]"), raw(0x71, 0, 1, 0, 0));
        assert_eq!(one("ldxh %r0, [%r1+2]"), raw(0x69, 0, 1, 2, 0));
        assert_eq!(one("ldxw %r0, [%r1 + 0x10]"), raw(0x61, 0, 1, 16, 0));
        assert_eq!(one("ldxdw %r0, [%r10-8]"), raw(0x79, 0, 10, -8, 0));
        assert_eq!(one("ldxsb %r0, [%r1+1]"), raw(0x91, 0, 1, 1, 0));
        assert_eq!(one("ldxsh %r0, [%r1+1]"), raw(0x89, 0, 1, 1, 0));
        assert_eq!(one("ldxsw %r0, [%r1+1]"), raw(0x81, 0, 1, 1, 0));
        assert_eq!(one("stb [%r1+2], 0x11"), raw(0x72, 1, 0, 2, 0x11));
        assert_eq!(one("sth [%r1+2], -1"), raw(0x6a, 1, 0, 2, -1));
        assert_eq!(one("stw [%r10-4], 7"), raw(0x62, 10, 0, -4, 7));
        assert_eq!(one("stdw [%r1], 1"), raw(0x7a, 1, 0, 0, 1));
        assert_eq!(one("stxb [%r1+2], %r3"), raw(0x73, 1, 3, 2, 0));
        assert_eq!(one("stxh [%r1+2], %r3"), raw(0x6b, 1, 3, 2, 0));
        assert_eq!(one("stxw [%r1+2], %r3"), raw(0x63, 1, 3, 2, 0));
        assert_eq!(one("stxdw [%r10-8], %r3"), raw(0x7b, 10, 3, -8, 0));
        assert_eq!(one("ldxw %r0, [%r1+0xffff]"), raw(0x61, 0, 1, -1, 0));
    }

    #[test]
    fn atomics() {
        assert_eq!(one("lock add [%r10-8], %r1"), raw(0xdb, 10, 1, -8, 0x00));
        assert_eq!(one("lock add32 [%r10-4], %r1"), raw(0xc3, 10, 1, -4, 0x00));
        assert_eq!(
            one("lock fetch add [%r10-8], %r1"),
            raw(0xdb, 10, 1, -8, 0x01)
        );
        assert_eq!(one("lock or [%r1], %r2"), raw(0xdb, 1, 2, 0, 0x40));
        assert_eq!(one("lock fetch and32 [%r1], %r2"), raw(0xc3, 1, 2, 0, 0x51));
        assert_eq!(one("lock fetch xor [%r1], %r2"), raw(0xdb, 1, 2, 0, 0xa1));
        assert_eq!(one("lock xchg [%r10-8], %r1"), raw(0xdb, 10, 1, -8, 0xe1));
        assert_eq!(one("lock xchg32 [%r10-8], %r1"), raw(0xc3, 10, 1, -8, 0xe1));
        assert_eq!(
            one("lock cmpxchg [%r10-8], %r1 # comment"),
            raw(0xdb, 10, 1, -8, 0xf1)
        );
        assert_eq!(
            one("lock cmpxchg32 [%r10-8], %r1"),
            raw(0xc3, 10, 1, -8, 0xf1)
        );
        assert!(err("lock").contains("invalid number of operands for `lock`"));
        assert!(err("lock or [%r10-8]").contains("invalid number of operands for `lock`"));
        assert!(err("lock nand [%r1], %r2").contains("unknown atomic operation `nand`"));
    }

    #[test]
    fn jumps_calls_and_labels() {
        let b = assemble("ja L\nL:\nexit").unwrap();
        assert_eq!(&b[..8], &raw(0x05, 0, 0, 0, 0));
        let b = assemble("mov %r0, 0\nja32 end\nexit\nend: exit").unwrap();
        assert_eq!(&b[8..16], &raw(0x06, 0, 0, 0, 1));
        let b = assemble("back:\nmov %r0, 1\njne32 %r0, 0x10, back\njsgt %r0, %r2, +1\nexit\nexit")
            .unwrap();
        assert_eq!(&b[8..16], &raw(0x56, 0, 0, -2, 0x10));
        assert_eq!(&b[16..24], &raw(0x6d, 0, 2, 1, 0));
        assert_eq!(one("call 5"), raw(0x85, 0, 0, 0, 5));
        assert_eq!(one("call helper 5"), raw(0x85, 0, 0, 0, 5));
        assert_eq!(one("call %r2"), raw(0x8d, 2, 0, 0, 0));
        let b = assemble("call local f\nexit\nf:\nexit").unwrap();
        assert_eq!(&b[..8], &raw(0x85, 0, 1, 0, 1));
        assert_eq!(one("call runtime 3"), raw(0x85, 0, 2, 0, 3));
        // `exit` names the first exit unless defined explicitly.
        let b = assemble("jeq %r1, 0, exit\nmov %r0, 1\nexit\nexit").unwrap();
        assert_eq!(&b[..8], &raw(0x15, 1, 0, 1, 0));
        let b = assemble("lddw %r0, 0x1122334455667788\nexit").unwrap();
        assert_eq!(
            &b[..16],
            &[0x18, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0, 0, 0, 0, 0x44, 0x33, 0x22, 0x11]
        );
        let b = assemble("lddw %r1, -2\nexit").unwrap();
        assert_eq!(&b[4..8], &[0xfe, 0xff, 0xff, 0xff]);
        assert_eq!(&b[12..16], &[0xff, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            err("mov %r0, 1\nldxq %r0, %r1\nexit"),
            "line 2: unknown mnemonic `ldxq`"
        );
        assert_eq!(err("or %r0, %r50"), "line 1: invalid register `%r50`");
        assert_eq!(
            err("\n\nmov32 %r0, 2147483648"),
            "line 3: immediate `2147483648` is out of 32-bit range"
        );
        assert_eq!(
            err("mov32 %r0, 0x100000000"),
            "line 1: immediate `0x100000000` is out of 32-bit range"
        );
        assert_eq!(
            err("ldxb %r0, [%r1+0x10000]"),
            "line 1: offset `+0x10000` is out of 16-bit range"
        );
        assert_eq!(
            err("ldxb %r0, %r1"),
            "line 1: expected a memory operand `[%rN+off]`, got `%r1`"
        );
        assert_eq!(
            err("lddw %r0"),
            "line 1: invalid number of operands for `lddw`: expected 2, got 1"
        );
        assert_eq!(
            err("ja NOT_A_LABEL\nexit"),
            "line 1: undefined label `NOT_A_LABEL`"
        );
        assert_eq!(
            err("a:\na:\nexit"),
            "line 2: duplicate label `a` (first defined on line 1)"
        );
        assert_eq!(err("mov %r0, 1x"), "line 1: `1x` is not a number");
        assert_eq!(err("call local"), "line 1: `local` is not a number");
        assert!(err("call foo 1").contains("invalid call mode `foo`"));
        assert!(err("jeq64 %r0, 1, +1").contains("unknown mnemonic"));
    }

    #[test]
    fn suite_negative_assembler_cases_fail() {
        // negative/invalid_*.data: every one of these must fail to assemble.
        for src in [
            "mov32 %r0, 2147483648\nexit",
            "mov32 %r0, 0x100000000\nexit",
            "ja NOT_A_LABEL\nexit",
            "lock or [%r10-8]\nexit",
            "lock\nexit",
            "ldxq %r0, %r1\nexit",
            "ldxb %r0, %r1\nexit",
            "ldxb %r0, [%r1+0x10000]\nexit",
            "lddw %r0\nexit",
            "or %r0, %r50\nexit",
        ] {
            assert!(assemble(src).is_err(), "{src}");
        }
    }
}
