//! Reader for bpf_conformance `.data` test files.
//!
//! A file is a sequence of sections introduced by a line starting with `--`:
//!
//! * `-- asm`: assembler source (see [`crate::asm`]);
//! * `-- raw`: the program as bytes. Two spellings occur in the suite: eight hex bytes per line
//!   (`85 01 00 00 00 00 00 00`, the `negative/unused-*` files) and one `0x`-prefixed 64-bit
//!   little-endian word per instruction (`0x5566778800000018`, `lddw.data`). When both `asm`
//!   and `raw` are present, `raw` is the program (as upstream does);
//! * `-- mem`: the context memory, hex bytes separated by whitespace;
//! * `-- result`: the expected r0, hex with `0x` or decimal (last non-empty line wins);
//! * `-- error`: the program must be rejected; the (possibly empty) text is the upstream
//!   runtime's error string, which we do not compare (our messages are our own).
//!
//! Every other section (`-- c`, `-- no register offset`, unknown directives) is ignored.
//! `#` starts a comment anywhere on a line; `\r` line ends are accepted.

use std::fmt;
use std::path::{Path, PathBuf};

/// One conformance test.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestCase {
    /// File stem, e.g. `add64`.
    pub name: String,
    /// The `-- asm` section verbatim (comments included), if any.
    pub asm: Option<String>,
    /// 1-based file line of the first `-- asm` body line (so assembler errors can name the
    /// file line: `asm_first_line + err.line - 1`).
    pub asm_first_line: usize,
    /// The `-- raw` section decoded to bytes, if any.
    pub raw: Option<Vec<u8>>,
    /// Context memory (empty when the file has no `-- mem`).
    pub mem: Vec<u8>,
    /// Expected r0.
    pub result: Option<u64>,
    /// `Some(text)` when the test expects the program to be rejected.
    pub error: Option<String>,
}

/// A malformed `.data` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataError {
    /// 1-based line in the file.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for DataError {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    None,
    Asm,
    Raw,
    Mem,
    Result,
    Error,
    Ignored,
}

fn section_of(title: &str) -> Section {
    match title.trim().to_ascii_lowercase().as_str() {
        "asm" => Section::Asm,
        "raw" => Section::Raw,
        "mem" => Section::Mem,
        "result" => Section::Result,
        "error" => Section::Error,
        _ => Section::Ignored,
    }
}

fn parse_u64(tok: &str) -> Option<u64> {
    if let Some(h) = tok.strip_prefix("0x").or_else(|| tok.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        tok.parse().ok()
    }
}

impl TestCase {
    /// Parses the text of a `.data` file.
    pub fn parse(name: &str, text: &str) -> Result<TestCase, DataError> {
        let mut tc = TestCase {
            name: name.to_string(),
            ..TestCase::default()
        };
        let mut section = Section::None;
        let mut asm = String::new();
        let mut raw: Vec<u8> = Vec::new();
        let mut have_raw = false;
        let mut error_lines: Vec<String> = Vec::new();
        for (idx, full) in text.lines().enumerate() {
            let lineno = idx + 1;
            let full = full.strip_suffix('\r').unwrap_or(full);
            if let Some(title) = full.trim_start().strip_prefix("--") {
                section = section_of(title.split('#').next().unwrap_or(""));
                match section {
                    Section::Asm if tc.asm.is_none() => {
                        tc.asm = Some(String::new());
                        tc.asm_first_line = lineno + 1;
                    }
                    Section::Raw => have_raw = true,
                    Section::Error => tc.error = Some(String::new()),
                    _ => {}
                }
                continue;
            }
            // The asm section keeps its text verbatim (the assembler strips comments itself
            // and reports lines relative to the section).
            if section == Section::Asm {
                asm.push_str(full);
                asm.push('\n');
                continue;
            }
            let line = full.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let err = |message: String| DataError {
                line: lineno,
                message,
            };
            match section {
                Section::Raw => {
                    for tok in line.split_whitespace() {
                        if tok.starts_with("0x") || tok.starts_with("0X") {
                            let w = parse_u64(tok)
                                .ok_or_else(|| err(format!("raw: bad 64-bit word `{tok}`")))?;
                            raw.extend_from_slice(&w.to_le_bytes());
                        } else {
                            if tok.len() > 2 {
                                return Err(err(format!("raw: `{tok}` is not a hex byte")));
                            }
                            let b = u8::from_str_radix(tok, 16)
                                .map_err(|_| err(format!("raw: `{tok}` is not a hex byte")))?;
                            raw.push(b);
                        }
                    }
                }
                Section::Mem => {
                    for tok in line.split_whitespace() {
                        let tok = tok.strip_prefix("0x").unwrap_or(tok);
                        if tok.len() > 2 {
                            return Err(err(format!("mem: `{tok}` is not a hex byte")));
                        }
                        let b = u8::from_str_radix(tok, 16)
                            .map_err(|_| err(format!("mem: `{tok}` is not a hex byte")))?;
                        tc.mem.push(b);
                    }
                }
                Section::Result => {
                    let v = parse_u64(line)
                        .ok_or_else(|| err(format!("result: `{line}` is not a number")))?;
                    tc.result = Some(v);
                }
                Section::Error => error_lines.push(line.to_string()),
                Section::None => {
                    return Err(err(format!(
                        "`{line}` appears before any `-- section` line"
                    )))
                }
                Section::Asm | Section::Ignored => {}
            }
        }
        if let Some(a) = tc.asm.as_mut() {
            *a = asm;
        }
        if have_raw {
            if raw.len() % 8 != 0 {
                return Err(DataError {
                    line: 0,
                    message: format!(
                        "raw: {} bytes is not a whole number of instructions",
                        raw.len()
                    ),
                });
            }
            tc.raw = Some(raw);
        }
        if let Some(e) = tc.error.as_mut() {
            *e = error_lines.join("\n");
        }
        Ok(tc)
    }

    /// Reads and parses a file; the test is named after the file stem.
    pub fn load(path: &Path) -> Result<TestCase, DataError> {
        let text = std::fs::read_to_string(path).map_err(|e| DataError {
            line: 0,
            message: format!("{}: {e}", path.display()),
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        TestCase::parse(&name, &text)
    }

    /// The program bytes: `raw` when present, else the assembled `asm`.
    pub fn program(&self) -> Result<Vec<u8>, String> {
        if let Some(raw) = &self.raw {
            return Ok(raw.clone());
        }
        let Some(src) = &self.asm else {
            return Err("test has neither an asm nor a raw section".to_string());
        };
        crate::asm::assemble(src).map_err(|e| {
            format!(
                "assembler: file line {}: {}",
                self.asm_first_line + e.line - 1,
                e.message
            )
        })
    }

    /// `true` when the test expects the program to be rejected at load time.
    pub fn expects_error(&self) -> bool {
        self.error.is_some()
    }
}

/// All `*.data` files in `dir`, sorted by name.
pub fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "data"))
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_sections() {
        let text = "# Copyright\n-- asm\nmov %r0, 1 # one\nexit\n-- mem\naa bb\n 0x01 02\n-- result\n0x2a\n-- c\nint x; # ignored\n";
        let tc = TestCase::parse("t", text).unwrap();
        assert_eq!(tc.asm.as_deref(), Some("mov %r0, 1 # one\nexit\n"));
        assert_eq!(tc.asm_first_line, 3);
        assert_eq!(tc.mem, vec![0xaa, 0xbb, 0x01, 0x02]);
        assert_eq!(tc.result, Some(42));
        assert_eq!(tc.error, None);
        assert_eq!(tc.program().unwrap().len(), 16);
    }

    #[test]
    fn raw_in_both_spellings() {
        let bytes = TestCase::parse(
            "t",
            "-- raw\n85 01 00 00 00 00 00 00\r\n95 00 00 00 00 00 00 00\n-- error\n",
        )
        .unwrap();
        assert_eq!(bytes.raw.as_ref().unwrap()[..2], [0x85, 0x01]);
        assert_eq!(bytes.error.as_deref(), Some(""));
        assert!(bytes.expects_error());
        let words = TestCase::parse(
            "t",
            "-- asm\nexit\n-- raw\n0x5566778800000018\n0x1122334400000000\n0x95\n-- result\n1",
        )
        .unwrap();
        let raw = words.raw.clone().unwrap();
        assert_eq!(&raw[..8], &[0x18, 0, 0, 0, 0x88, 0x77, 0x66, 0x55]);
        assert_eq!(raw.len(), 24);
        // raw wins over asm
        assert_eq!(words.program().unwrap(), raw);
    }

    #[test]
    fn errors_name_the_line() {
        let e = TestCase::parse("t", "-- mem\n00 zz\n").unwrap_err();
        assert_eq!(e.to_string(), "line 2: mem: `zz` is not a hex byte");
        let e = TestCase::parse("t", "-- result\n0xq\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = TestCase::parse("t", "-- raw\n01 02 03\n").unwrap_err();
        assert!(e.message.contains("3 bytes"));
        let tc = TestCase::parse("t", "-- asm\nmov %r0, 1\nbogus %r1\nexit\n").unwrap();
        assert_eq!(
            tc.program().unwrap_err(),
            "assembler: file line 3: unknown mnemonic `bogus`"
        );
    }

    #[test]
    fn ignored_sections_and_decimal_results() {
        let tc = TestCase::parse(
            "t",
            "-- asm\nexit\n-- no register offset\ncall instruction\n-- result\n17\n",
        )
        .unwrap();
        assert_eq!(tc.asm.as_deref(), Some("exit\n"));
        assert_eq!(tc.result, Some(17));
    }
}
