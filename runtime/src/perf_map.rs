//! The perf map file (`/tmp/perf-<pid>.map`), kept in step with the symbol index at a cost
//! that does not grow with the number of live programs.
//!
//! perf reads one `START SIZE NAME` line per symbol, both numbers in hex without `0x`, and
//! takes the name as the rest of the line after exactly one separator. Leading zeros are
//! ordinary hex digits to it, so every line here is padded to one width: `START` to 16
//! digits, `SIZE` with as many leading zeros as the line needs. With equal widths the file is
//! an array of slots:
//!
//! * a new program's line is written at the end (one `pwrite`);
//! * a removed program's slot takes the last line, and the file is cut by one slot (one
//!   `pwrite`, one `ftruncate`), so the file never has holes and always has one line per
//!   listed copy. A batch of removals writes its changed slots in runs and cuts once.
//!
//! Rewriting the whole file for each release, as this did before, cost 0.5 ms per free at
//! 10,000 live programs.
//!
//! Width is a power of two between [`MIN_WIDTH`] and [`MAX_WIDTH`], so a line never straddles
//! a page. A name too long for the current width widens every line (one rewrite of the whole
//! file; widths only double, up to the cap); a name longer than [`MAX_WIDTH`] allows is cut.
//!
//! What a reader can see: between a removal's `pwrite` and its `ftruncate` the moved line is
//! listed twice, which perf folds into one symbol; a removed program's line is gone before
//! its code is reclaimed (the index removes it first), so no listed address ever belongs to
//! freed code. Whole rewrites (enabling, widening, a rewrite on request, recovery after a
//! failed write) go to a temporary file that is then renamed over the map.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Paths some runtime of this process keeps a map at. Two runtimes updating one file in
/// place would overwrite each other's slots, so a path has one keeper at a time.
static KEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A path in [`KEPT`], until dropped.
struct Keeper(PathBuf);

impl Keeper {
    fn claim(path: &Path) -> std::io::Result<Keeper> {
        // Spelled the same way whatever the working directory and `.` segments (the runtime
        // passes absolute paths; this keeps the rule true for any caller).
        let path = std::path::absolute(path)?;
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        if kept.contains(&path) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "another runtime of this process keeps a perf map there (give each runtime \
                 its own path)",
            ));
        }
        kept.push(path.clone());
        Ok(Keeper(path))
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|p| *p != self.0);
    }
}

/// Narrowest line: a 16-digit start, a size and a default `prog_<id>` name fit.
pub(crate) const MIN_WIDTH: usize = 64;
/// Widest line. One long name widens every line (the file is an array of equal slots), so
/// the width is capped where names stop being readable in a report anyway: longer names are
/// cut (the kernel itself lists BPF programs under 16-byte names).
pub(crate) const MAX_WIDTH: usize = 256;

/// Changed slots at most this many lines apart are written in one run (see
/// [`PerfMap::sync`]): a system call costs about as much as copying a few KiB.
const RUN_GAP: usize = 32;

/// Bytes of a line that are not the name: 16-digit start, space, at least the size's
/// digits, space, newline.
fn fixed_bytes(size: u64) -> usize {
    let size_digits = (64 - size.leading_zeros() as usize).div_ceil(4).max(1);
    16 + 1 + size_digits + 1 + 1
}

/// The width a line for (`size`, `name`) needs.
pub(crate) fn width_for(size: u64, name: &str) -> usize {
    (fixed_bytes(size) + name.len())
        .next_power_of_two()
        .clamp(MIN_WIDTH, MAX_WIDTH)
}

/// Appends the line for (`start`, `size`, `name`) padded to exactly `width` bytes (which must
/// be at least [`width_for`], or [`MAX_WIDTH`], in which case a longer name is cut at a
/// character boundary). Newlines in the name would split the line, so they become `_`.
pub(crate) fn push_line(out: &mut Vec<u8>, start: u64, size: u64, name: &str, width: usize) {
    let room = width - fixed_bytes(size);
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let name = &name[..cut];
    let size_digits = width - 16 - 1 - 1 - name.len() - 1;
    let at = out.len();
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{start:016x} {size:0size_digits$x} ");
    out.extend(
        name.bytes()
            .map(|b| if b == b'\n' || b == b'\r' { b'_' } else { b }),
    );
    out.push(b'\n');
    debug_assert_eq!(out.len() - at, width);
}

/// The map file and the image of its contents.
pub(crate) struct PerfMap {
    path: PathBuf,
    _keeper: Keeper,
    /// Open for writing while the file matches `image`; `None` after a failed write (the
    /// next change rewrites the whole file).
    file: Option<File>,
    /// Bytes per line.
    width: usize,
    /// The file's contents: one line per slot.
    image: Vec<u8>,
    /// Slot → start address of the copy listed there (the index's key).
    slots: Vec<u64>,
    /// Slots changed by a removal batch and not yet written ([`PerfMap::sync`]).
    dirty: Vec<usize>,
}

impl PerfMap {
    /// A map at `path` listing `lines` (start, size, name), written now; slot `i` holds
    /// `lines[i]`. Fails if another map of this process is kept at `path`.
    pub(crate) fn create<'a>(
        path: PathBuf,
        lines: impl Iterator<Item = (u64, u64, &'a str)> + Clone,
    ) -> std::io::Result<PerfMap> {
        let mut map = PerfMap {
            _keeper: Keeper::claim(&path)?,
            path,
            file: None,
            width: MIN_WIDTH,
            image: Vec::new(),
            slots: Vec::new(),
            dirty: Vec::new(),
        };
        map.relist(lines)?;
        Ok(map)
    }

    /// Lists exactly `lines`, slot `i` holding `lines[i]`, at the narrowest width they all
    /// fit, and rewrites the file. A failed write is also retried by the next change.
    pub(crate) fn relist<'a>(
        &mut self,
        lines: impl Iterator<Item = (u64, u64, &'a str)> + Clone,
    ) -> std::io::Result<()> {
        self.width = lines
            .clone()
            .map(|(_, size, name)| width_for(size, name))
            .max()
            .unwrap_or(MIN_WIDTH);
        self.image.clear();
        self.slots.clear();
        self.dirty.clear();
        for (start, size, name) in lines {
            push_line(&mut self.image, start, size, name, self.width);
            self.slots.push(start);
        }
        self.write_whole()
    }

    /// The start address listed in `slot`.
    pub(crate) fn start_at(&self, slot: usize) -> Option<u64> {
        self.slots.get(slot).copied()
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a line for (`size`, `name`) fits the current width (if not, the caller
    /// [relists](PerfMap::relist) every line, wider; see the module doc).
    pub(crate) fn fits(&self, size: u64, name: &str) -> bool {
        width_for(size, name) <= self.width
    }

    /// Lists a copy at `start` (its line must [fit](PerfMap::fits)); returns its slot. Write
    /// failures are not load failures: the image stays right and the next change rewrites
    /// the file from it.
    pub(crate) fn push(&mut self, start: u64, size: u64, name: &str) -> usize {
        let slot = self.slots.len();
        push_line(&mut self.image, start, size, name, self.width);
        self.slots.push(start);
        if self.file.is_some() {
            self.write_slots(slot..slot + 1);
        } else {
            // An earlier write failed: the file may lack any line since, so write it all.
            let _ = self.write_whole();
        }
        slot
    }

    /// Unlists the copy in `slot` by moving the last line into it. Returns the start address
    /// of the copy that moved into `slot`, if another did (its owner records the new slot).
    /// The file is updated by [`PerfMap::sync`], once per batch.
    pub(crate) fn swap_remove(&mut self, slot: usize) -> Option<u64> {
        let last = self.slots.len().checked_sub(1).filter(|&l| slot <= l)?;
        self.slots.swap_remove(slot);
        let w = self.width;
        if slot != last {
            self.image.copy_within(last * w..(last + 1) * w, slot * w);
            self.dirty.push(slot);
        }
        self.image.truncate(last * w);
        (slot != last).then(|| self.slots[slot])
    }

    /// Brings the file up to date after removals: the changed slots, in runs, then one cut.
    /// Slots closer than [`RUN_GAP`] lines are written as one run, the lines between them
    /// rewritten unchanged, so a batch that freed most programs costs a few large writes
    /// rather than one per line. (Replacing the file instead, by `rename`, cost more than
    /// all of that on ext4 mounted with `discard`: the replaced file's blocks are freed.)
    pub(crate) fn sync(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        let live = self.slots.len();
        dirty.retain(|&s| s < live);
        dirty.sort_unstable();
        dirty.dedup();
        if self.file.is_some() {
            let mut runs = dirty.iter().peekable();
            while let Some(&first) = runs.next() {
                let mut last = first;
                while let Some(&&next) = runs.peek() {
                    if next - last > RUN_GAP {
                        break;
                    }
                    last = next;
                    runs.next();
                }
                self.write_slots(first..last + 1);
            }
            // Cut last: until then a moved line is listed twice, never a removed one missing
            // from the middle.
            let cut = self
                .file
                .as_ref()
                .map(|f| f.set_len(self.image.len() as u64));
            if !matches!(cut, Some(Ok(()))) {
                self.file = None;
            }
        }
        if self.file.is_none() {
            // A write failed, now or before: the file may still list removed programs, so
            // try the whole file at once (again at the next change if this fails too).
            let _ = self.write_whole();
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Rewrites the whole file from the image (temporary file, then `rename`, so a reader
    /// sees the old map or the new one) and reopens it for in-place updates.
    fn write_whole(&mut self) -> std::io::Result<()> {
        self.file = None;
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, &self.image)?;
        std::fs::rename(&tmp, &self.path)?;
        self.file = Some(std::fs::OpenOptions::new().write(true).open(&self.path)?);
        Ok(())
    }

    fn write_slots(&mut self, slots: std::ops::Range<usize>) {
        let w = self.width;
        let Some(file) = &self.file else {
            return;
        };
        let lines = &self.image[slots.start * w..slots.end * w];
        if file.write_all_at(lines, (slots.start * w) as u64).is_err() {
            self.file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perf's reading of a line: hex start, one separator, hex size, one separator, the rest.
    fn perf_reads(line: &str) -> (u64, u64, &str) {
        let (start, rest) = line.split_once(' ').unwrap();
        let (size, name) = rest.split_once(' ').unwrap();
        (
            u64::from_str_radix(start, 16).unwrap(),
            u64::from_str_radix(size, 16).unwrap(),
            name,
        )
    }

    #[test]
    fn lines_are_padded_to_the_width_and_read_back_as_written() {
        for (size, name) in [
            (1u64, "p"),
            (0x123456, "prog_18446744073709551615"),
            (u64::MAX, "a_longer_name_that_needs_a_wider_line_than_64"),
            (0, ""),
        ] {
            let width = width_for(size, name);
            assert!(width.is_power_of_two() && width >= MIN_WIDTH);
            let mut out = Vec::new();
            push_line(&mut out, 0x7f00_dead_0000, size, name, width);
            assert_eq!(out.len(), width);
            let text = std::str::from_utf8(&out).unwrap();
            assert_eq!(
                perf_reads(text.trim_end_matches('\n')),
                (0x7f00_dead_0000, size, name)
            );
        }
        // A newline cannot split the line; an over-long name is cut to the widest line.
        let mut out = Vec::new();
        push_line(&mut out, 1, 2, "a\nb", MIN_WIDTH);
        assert_eq!(
            perf_reads(std::str::from_utf8(&out).unwrap().trim_end()).2,
            "a_b"
        );
        let long = "é".repeat(MAX_WIDTH);
        assert_eq!(width_for(2, &long), MAX_WIDTH);
        let mut out = Vec::new();
        push_line(&mut out, 1, 2, &long, MAX_WIDTH);
        assert_eq!(out.len(), MAX_WIDTH);
        let (_, _, name) = perf_reads(std::str::from_utf8(&out).unwrap().trim_end());
        assert!(long.starts_with(name) && name.len() >= MAX_WIDTH - 32);
    }

    #[test]
    fn removals_move_the_last_line_into_the_hole_and_cut_the_file() {
        let path =
            std::env::temp_dir().join(format!("packjit-perfmap-unit-{}", std::process::id()));
        let lines: Vec<(u64, u64, String)> = (0..6u64)
            .map(|i| (0x1000 * (i + 1), 0x40 + i, format!("p{i}")))
            .collect();
        let mut map = PerfMap::create(
            path.clone(),
            lines.iter().map(|(s, n, name)| (*s, *n, name.as_str())),
        )
        .unwrap();
        let read = || -> Vec<(u64, u64, String)> {
            std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .map(|l| {
                    let (s, n, name) = perf_reads(l);
                    (s, n, name.to_string())
                })
                .collect()
        };
        assert_eq!(read(), lines);
        // Remove slot 1: slot 5's line moves there.
        assert_eq!(map.swap_remove(1), Some(0x6000));
        map.sync();
        let want = |order: &[usize]| -> Vec<(u64, u64, String)> {
            order.iter().map(|&i| lines[i].clone()).collect()
        };
        assert_eq!(read(), want(&[0, 5, 2, 3, 4]));
        // The last slot: nothing moves.
        assert_eq!(map.swap_remove(4), None);
        assert_eq!(map.push(0x9000, 0x10, "new"), 4);
        map.sync();
        let mut expect = want(&[0, 5, 2, 3]);
        expect.push((0x9000, 0x10, "new".into()));
        assert_eq!(read(), expect);
        // A batch: several holes, one sync.
        assert_eq!(map.swap_remove(0), Some(0x9000));
        assert_eq!(map.swap_remove(1), Some(0x4000));
        map.sync();
        assert_eq!(
            read(),
            vec![
                (0x9000, 0x10, "new".into()),
                lines[3].clone(),
                lines[2].clone()
            ]
        );
        // After a failed write the next change writes the whole file from the image.
        map.file = None;
        assert_eq!(map.push(0xa000, 0x20, "after"), 3);
        map.file = None;
        assert_eq!(map.swap_remove(0), Some(0xa000));
        map.sync();
        assert_eq!(
            read(),
            vec![
                (0xa000, 0x20, "after".into()),
                lines[3].clone(),
                lines[2].clone()
            ]
        );
        assert!(map.file.is_some(), "reopened after the rewrite");
        std::fs::remove_file(&path).unwrap();
    }
}
