//! `bpf_trace_printk` (kernel helper 6): a program's debug line, formatted as the kernel
//! formats it, to a sink the host chooses (standard error unless it sets one).
//!
//! The kernel accepts at most three arguments and a restricted set of conversions: `%d %i
//! %u %x %X %c %p %s %%` with the length modifiers `h hh l ll z`, an optional `-`, `0`,
//! `+`, ` ` or `#` flag and a width. Anything else makes the call fail with `-EINVAL` and
//! prints nothing, as there. `%s` reads a NUL-terminated string from memory the program
//! may read (checked like every helper's pointer in sandboxed runs).

use crate::exec;
use packjit_plugin_api::AccessDirection;
use std::sync::{Arc, RwLock};

/// Where `bpf_trace_printk` lines go.
pub type TraceSink = Arc<dyn Fn(&str) + Send + Sync>;

static SINK: RwLock<Option<TraceSink>> = RwLock::new(None);

/// Sends every later `bpf_trace_printk` line of this process to `sink` (`None`: back to
/// standard error). Lines carry no trailing newline unless the program wrote one.
pub fn set_trace_sink(sink: Option<TraceSink>) {
    *SINK.write().unwrap_or_else(|p| p.into_inner()) = sink;
}

const EINVAL: u64 = (-22i64) as u64;
/// The longest `%s` the kernel copies (`MAX_BPRINTF_STR_LEN`).
const MAX_STR: usize = 64;

/// The helper: `long bpf_trace_printk(const char *fmt, u32 fmt_size, a1, a2, a3)`.
pub(crate) extern "C" fn trace_printk(fmt: u64, size: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    let Ok(len) = usize::try_from(size) else {
        return EINVAL;
    };
    if len == 0 || !readable(fmt, len) {
        return EINVAL;
    }
    // SAFETY: `len` bytes at `fmt` are readable by the running program (checked above).
    let bytes = unsafe { std::slice::from_raw_parts(fmt as *const u8, len) };
    // The format ends at its NUL, which must be inside `fmt_size`.
    let Some(end) = bytes.iter().position(|&b| b == 0) else {
        return EINVAL;
    };
    let Some(line) = format(&bytes[..end], [a1, a2, a3]) else {
        return EINVAL;
    };
    let sink = SINK.read().unwrap_or_else(|p| p.into_inner()).clone();
    match sink {
        Some(f) => f(&line),
        None => eprint!("{line}"),
    }
    line.len() as u64
}

/// Readable by the running program? (Outside a sandboxed run, helpers trust their caller,
/// as every other kernel helper of the runtime does for trusted code.)
fn readable(addr: u64, len: usize) -> bool {
    exec::trusted_run() || exec::helper_access_ok(addr, len as u64, AccessDirection::Read)
}

/// The kernel's restricted printf: `None` for a conversion it refuses or a fourth one.
pub(crate) fn format(fmt: &[u8], args: [u64; 3]) -> Option<String> {
    let mut out = String::new();
    let mut next = args.iter();
    let mut i = 0;
    while i < fmt.len() {
        let c = fmt[i];
        i += 1;
        if c != b'%' {
            out.push(c as char);
            continue;
        }
        if fmt.get(i) == Some(&b'%') {
            out.push('%');
            i += 1;
            continue;
        }
        let mut left = false;
        let mut zero = false;
        while let Some(&f) = fmt.get(i) {
            match f {
                b'-' => left = true,
                b'0' => zero = true,
                b'+' | b' ' | b'#' => {}
                _ => break,
            }
            i += 1;
        }
        let mut width = 0usize;
        while let Some(d) = fmt.get(i).filter(|d| d.is_ascii_digit()) {
            width = (width * 10 + (d - b'0') as usize).min(64);
            i += 1;
        }
        // Length: h, hh, l, ll, z. `bits` is the argument's width.
        let mut bits = 32;
        match fmt.get(i) {
            Some(b'h') => {
                bits = 16;
                i += 1;
                if fmt.get(i) == Some(&b'h') {
                    bits = 8;
                    i += 1;
                }
            }
            Some(b'l') | Some(b'z') => {
                bits = 64;
                let z = fmt[i] == b'z';
                i += 1;
                if !z && fmt.get(i) == Some(&b'l') {
                    i += 1;
                }
            }
            _ => {}
        }
        let conv = *fmt.get(i)?;
        i += 1;
        let arg = *next.next()?;
        let masked = if bits == 64 {
            arg
        } else {
            arg & ((1u64 << bits) - 1)
        };
        let text = match conv {
            b'd' | b'i' => {
                let shift = 64 - bits;
                (((masked << shift) as i64) >> shift).to_string()
            }
            b'u' => masked.to_string(),
            b'x' => format!("{masked:x}"),
            b'X' => format!("{masked:X}"),
            b'c' => ((arg as u8) as char).to_string(),
            b'p' => format!("0x{arg:x}"),
            b's' => read_str(arg)?,
            _ => return None,
        };
        pad(
            &mut out,
            &text,
            width,
            left,
            zero && !left && conv != b's' && conv != b'c',
        );
    }
    Some(out)
}

fn pad(out: &mut String, text: &str, width: usize, left: bool, zero: bool) {
    let fill = width.saturating_sub(text.chars().count());
    if left {
        out.push_str(text);
        out.extend(std::iter::repeat_n(' ', fill));
    } else if zero && text.starts_with('-') {
        out.push('-');
        out.extend(std::iter::repeat_n('0', fill));
        out.push_str(&text[1..]);
    } else {
        out.extend(std::iter::repeat_n(if zero { '0' } else { ' ' }, fill));
        out.push_str(text);
    }
}

/// A `%s` argument: up to its NUL or [`MAX_STR`] bytes, each readable by the program.
fn read_str(addr: u64) -> Option<String> {
    let mut s = Vec::new();
    for k in 0..MAX_STR as u64 {
        let at = addr.checked_add(k)?;
        if !readable(at, 1) {
            // The kernel prints what it could not read as an error marker.
            return Some(String::from_utf8_lossy(&s).into_owned() + "(fault)");
        }
        // SAFETY: one byte the program may read (checked just above).
        let b = unsafe { *(at as *const u8) };
        if b == 0 {
            break;
        }
        s.push(b);
    }
    Some(String::from_utf8_lossy(&s).into_owned())
}

#[cfg(test)]
mod tests {
    use super::format;

    #[test]
    fn formats_as_the_kernels_restricted_printf() {
        let f = |s: &str, a: [u64; 3]| format(s.as_bytes(), a);
        assert_eq!(f("n=%d x=%x", [-5i64 as u64, 255, 0]).unwrap(), "n=-5 x=ff");
        assert_eq!(
            f("%lld %llu", [-1i64 as u64, u64::MAX, 0]).unwrap(),
            "-1 18446744073709551615"
        );
        assert_eq!(f("%u", [u64::MAX, 0, 0]).unwrap(), "4294967295");
        assert_eq!(
            f("[%5d|%-4x|%04u]", [42, 10, 7]).unwrap(),
            "[   42|a   |0007]"
        );
        assert_eq!(f("%hhd %c%%", [0x1ff, b'z' as u64, 0]).unwrap(), "-1 z%");
        // A fourth argument, or a conversion the kernel refuses, fails the call.
        assert_eq!(f("%d %d %d %d", [1, 2, 3]), None);
        assert_eq!(f("%f", [1, 0, 0]), None);
        assert_eq!(f("%", [1, 0, 0]), None);
    }
}
