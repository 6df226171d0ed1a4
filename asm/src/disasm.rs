//! Disassembler into the dialect [`crate::asm`] reads, so a printed program (e.g. a minimised
//! differential failure) can be pasted back into a `.data` file. Jump targets are printed as
//! slot offsets (`+3`), which the assembler accepts. Slots that are not a valid instruction
//! print as `.raw 0x…` comments so nothing is hidden.

use packjit_frontend::RawInsn;

fn reg(r: u8) -> String {
    format!("%r{r}")
}

fn mem(base: u8, off: i16) -> String {
    if off < 0 {
        format!("[%r{base}{off}]")
    } else {
        format!("[%r{base}+{off}]")
    }
}

fn rel(v: i64) -> String {
    if v < 0 {
        v.to_string()
    } else {
        format!("+{v}")
    }
}

/// Disassembles one slot; `next` is the following slot (for `lddw`). Returns the text and
/// how many slots it covered. `None` for encodings the dialect cannot express.
pub fn insn_text(i: &RawInsn, next: Option<&RawInsn>) -> Option<(String, usize)> {
    let cls = i.opc & 7;
    let size = |opc: u8| match opc & 0x18 {
        0x00 => "w",
        0x08 => "h",
        0x10 => "b",
        _ => "dw",
    };
    let t = match cls {
        0x00 => {
            let n = next?;
            if i.opc != 0x18
                || i.src != 0
                || i.off != 0
                || n.opc != 0
                || n.dst != 0
                || n.src != 0
                || n.off != 0
            {
                return None;
            }
            let v = (i.imm as u32 as u64) | ((n.imm as u32 as u64) << 32);
            return Some((format!("lddw {}, {v:#x}", reg(i.dst)), 2));
        }
        0x01 => {
            if i.imm != 0 {
                return None;
            }
            match i.opc & 0xe0 {
                0x60 => format!("ldx{} {}, {}", size(i.opc), reg(i.dst), mem(i.src, i.off)),
                0x80 if i.opc & 0x18 != 0x18 => {
                    format!("ldxs{} {}, {}", size(i.opc), reg(i.dst), mem(i.src, i.off))
                }
                _ => return None,
            }
        }
        0x02 => {
            if i.opc & 0xe0 != 0x60 || i.src != 0 {
                return None;
            }
            format!("st{} {}, {}", size(i.opc), mem(i.dst, i.off), i.imm)
        }
        0x03 => match i.opc & 0xe0 {
            0x60 if i.imm == 0 => {
                format!("stx{} {}, {}", size(i.opc), mem(i.dst, i.off), reg(i.src))
            }
            0xc0 if matches!(i.opc & 0x18, 0x00 | 0x18) => {
                let w = if i.opc & 0x18 == 0 { "32" } else { "" };
                let (fetch, op) = match i.imm {
                    0x00 => ("", "add"),
                    0x01 => ("fetch ", "add"),
                    0x40 => ("", "or"),
                    0x41 => ("fetch ", "or"),
                    0x50 => ("", "and"),
                    0x51 => ("fetch ", "and"),
                    0xa0 => ("", "xor"),
                    0xa1 => ("fetch ", "xor"),
                    0xe1 => ("", "xchg"),
                    0xf1 => ("", "cmpxchg"),
                    _ => return None,
                };
                format!("lock {fetch}{op}{w} {}, {}", mem(i.dst, i.off), reg(i.src))
            }
            _ => return None,
        },
        0x04 | 0x07 => {
            let w = if cls == 0x04 { "32" } else { "" };
            let x = i.opc & 0x08 != 0;
            let code = i.opc & 0xf0;
            if code == 0xd0 {
                let name = match (cls, x) {
                    (0x04, false) => "le",
                    (0x04, true) => "be",
                    (_, false) => "bswap",
                    _ => return None,
                };
                if i.src != 0 || i.off != 0 {
                    return None;
                }
                return Some((format!("{name}{} {}", i.imm, reg(i.dst)), 1));
            }
            if code == 0x80 {
                if x || i.src != 0 || i.off != 0 || i.imm != 0 {
                    return None;
                }
                return Some((format!("neg{w} {}", reg(i.dst)), 1));
            }
            let name = match (code, i.off) {
                (0x00, 0) => "add",
                (0x10, 0) => "sub",
                (0x20, 0) => "mul",
                (0x30, 0) => "div",
                (0x30, 1) => "sdiv",
                (0x40, 0) => "or",
                (0x50, 0) => "and",
                (0x60, 0) => "lsh",
                (0x70, 0) => "rsh",
                (0x90, 0) => "mod",
                (0x90, 1) => "smod",
                (0xa0, 0) => "xor",
                (0xb0, 0) => "mov",
                (0xb0, 8 | 16 | 32) if x && i.imm == 0 => {
                    let ww = if cls == 0x04 { "32" } else { "64" };
                    return Some((
                        format!("movsx{}{ww} {}, {}", i.off, reg(i.dst), reg(i.src)),
                        1,
                    ));
                }
                (0xc0, 0) => "arsh",
                _ => return None,
            };
            if x {
                if i.imm != 0 {
                    return None;
                }
                format!("{name}{w} {}, {}", reg(i.dst), reg(i.src))
            } else {
                if i.src != 0 {
                    return None;
                }
                format!("{name}{w} {}, {}", reg(i.dst), i.imm)
            }
        }
        _ => {
            // JMP / JMP32
            let w = if cls == 0x06 { "32" } else { "" };
            let x = i.opc & 0x08 != 0;
            match (i.opc & 0xf0, cls) {
                (0x00, 0x05) if !x && i.dst == 0 && i.src == 0 && i.imm == 0 => {
                    format!("ja {}", rel(i.off.into()))
                }
                (0x00, 0x06) if !x && i.dst == 0 && i.src == 0 && i.off == 0 => {
                    format!("ja32 {}", rel(i.imm.into()))
                }
                (0x80, 0x05) if !x && i.dst == 0 && i.off == 0 => match i.src {
                    0 => format!("call {}", i.imm),
                    1 => format!("call local {}", rel(i.imm.into())),
                    2 => format!("call runtime {}", i.imm),
                    _ => return None,
                },
                (0x80, 0x05) if x && i.src == 0 && i.off == 0 && i.imm == 0 => {
                    format!("call {}", reg(i.dst))
                }
                (0x90, 0x05) if !x && i.dst == 0 && i.src == 0 && i.off == 0 && i.imm == 0 => {
                    "exit".to_string()
                }
                (code, _) => {
                    let name = match code {
                        0x10 => "jeq",
                        0x20 => "jgt",
                        0x30 => "jge",
                        0x40 => "jset",
                        0x50 => "jne",
                        0x60 => "jsgt",
                        0x70 => "jsge",
                        0xa0 => "jlt",
                        0xb0 => "jle",
                        0xc0 => "jslt",
                        0xd0 => "jsle",
                        _ => return None,
                    };
                    if x {
                        if i.imm != 0 {
                            return None;
                        }
                        format!(
                            "{name}{w} {}, {}, {}",
                            reg(i.dst),
                            reg(i.src),
                            rel(i.off.into())
                        )
                    } else {
                        if i.src != 0 {
                            return None;
                        }
                        format!("{name}{w} {}, {}, {}", reg(i.dst), i.imm, rel(i.off.into()))
                    }
                }
            }
        }
    };
    Some((t, 1))
}

/// Disassembles a whole program, one line per instruction, each prefixed by its pc in a
/// comment-free form the assembler reads back (`pcs` adds `# pc N` comments).
pub fn disassemble(code: &[u8], pcs: bool) -> String {
    let slots: Vec<RawInsn> = code
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            RawInsn::from_bytes(&b)
        })
        .collect();
    let mut out = String::new();
    let mut pc = 0;
    while pc < slots.len() {
        let (text, n) = insn_text(&slots[pc], slots.get(pc + 1)).unwrap_or_else(|| {
            let b = slots[pc].to_bytes();
            (
                format!("# .raw {:#018x} (not expressible)", u64::from_le_bytes(b)),
                1,
            )
        });
        if pcs {
            out.push_str(&format!("{text:<40} # pc {pc}\n"));
        } else {
            out.push_str(&text);
            out.push('\n');
        }
        pc += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asm::assemble;

    #[test]
    fn round_trips_every_form() {
        let src = "add %r1, %r2\nadd32 %r1, -3\nsdiv %r1, %r2\nsmod32 %r1, 7\nneg32 %r2\n\
                   movsx1664 %r8, %r7\nbe16 %r0\nle64 %r1\nbswap32 %r2\nlddw %r3, 0x1122334455667788\n\
                   ldxh %r0, [%r1+2]\nldxsw %r0, [%r10-8]\nstb [%r1+2], 17\nstxdw [%r10-8], %r3\n\
                   lock fetch add32 [%r10-4], %r1\nlock cmpxchg [%r10-8], %r1\nlock xchg [%r1+0], %r2\n\
                   ja +1\nja32 -2\njsle32 %r1, %r2, +0\njset %r1, -1, +3\ncall 5\ncall %r3\n\
                   call local +1\nexit\n";
        let code = assemble(src).unwrap();
        let text = disassemble(&code, false);
        assert_eq!(assemble(&text).unwrap(), code, "{text}");
        assert!(text.contains("lddw %r3, 0x1122334455667788"));
        assert!(text.contains("lock fetch add32 [%r10-4], %r1"));
    }

    #[test]
    fn unknown_encodings_are_visible() {
        let text = disassemble(&[0xff, 0, 0, 0, 0, 0, 0, 0], true);
        assert!(text.contains(".raw 0x00000000000000ff"), "{text}");
    }
}
