//! Where a backend places a function's out-of-line ("cold") code: the failure sides of
//! sandbox checks and budget charges, and the checked copies of groups and loops.
//!
//! Cold code goes after its function, so a branch from the hot path to its cold side spans
//! the rest of one function, not the rest of the program. In a long function that is still
//! more than a conditional branch reaches (±1 MiB on arm64 and with RV64's `jal`, ±4 KiB
//! with RV64's B-type), and every such branch would take an extra relaxation pass and the
//! long form. So the queued cold code is also placed in *islands* between instructions
//! (jumped over on the hot path), once the hot code since the queue filled reaches a span
//! the backend picks below its reach: a hot-to-cold branch then spans at most about that
//! span plus the island, whatever the function's size.
//!
//! Cold code usually ends in a shared stub placed once, after all functions (a region scan,
//! the stop path). [`ColdPlacement::local_stubs_due`] says when that copy is expected to be
//! too far from the cold code being placed, so a backend whose cold-to-stub branches reach
//! only ±1 MiB places a copy of its stubs with that cold code instead.
//!
//! Placement depends on code offsets, yet every pass must place cold code exactly as the
//! first did: the relaxation numbers branch sites in emission order, and its pass bound
//! assumes code only grows. So the first pass decides and records; later passes replay.
//!
//! An island never goes between a jump of the program and the instruction it jumps ahead to,
//! up to [`ColdPlacement::HOLD_INSTS`] ahead ([`ColdPlacement::note_instruction`]): such a
//! jump is emitted in its short form before anyone knows an island will come, and jumping
//! over a whole island it would not reach. The island waits for the target instead.
//!
//! [`ColdPlacement::expected_distance`] estimates how far the cold side of a branch being
//! emitted will land, so a backend whose shortest conditional branch reaches only a few KiB
//! can start in the form that will reach it instead of finding out in a second pass. It is
//! an estimate (the function's code density so far): a wrong guess costs a pass (too short)
//! or a few bytes (too long), never correctness, since the relaxation checks every branch.
//!
//! arm64 uses islands only (its `B.cond` reaches far past a span), RV64 all three, and
//! x86-64, whose `jcc rel32` reaches ±2 GiB, the estimate only (a span of `usize::MAX`).

use crate::Op;

/// The island policy and the running state of one pass (see the module docs).
#[derive(Clone, Debug)]
pub struct ColdPlacement {
    span: usize,
    typical: usize,
    /// Code offset at the last instruction boundary with nothing queued (or of the last
    /// island): no queued cold code's branch starts before it.
    pending_since: usize,
    /// Code offset and instruction index where the current function's body starts.
    body_start: (usize, usize),
    /// The function's end (instruction index, exclusive).
    end: usize,
    /// The program's end (instruction index, exclusive).
    program_end: usize,
    /// The first pass's decisions: the instructions islands precede, and for each cold
    /// placement asked about, whether it had local stubs.
    islands: Vec<u32>,
    local_stubs: Vec<bool>,
    /// Replaying (a later pass): how many of each were used so far.
    replay: Option<(usize, usize)>,
    /// Cold and hot code bytes of the placements so far: how much cold code a byte of hot
    /// code queues, for the estimate.
    cold_bytes: usize,
    hot_bytes: usize,
    /// No island before this instruction (the farthest target of a branch ahead so far).
    hold_until: usize,
}

impl ColdPlacement {
    /// Instructions of a function measured before its own density replaces the typical one.
    pub const SAMPLE: usize = 16;

    /// The farthest jump ahead, in instructions, that holds islands back. Farther jumps
    /// start in a long form or need one whatever islands do (RV64's B-type spans some 500
    /// instructions, arm64's TBZ a few thousand), and a `goto out` across a long function
    /// must not keep all its cold code from islands.
    pub const HOLD_INSTS: usize = 4096;

    /// Islands every `span` bytes of hot code at most (`usize::MAX`: none, the cold code of
    /// a function all goes after it); `typical` is the backend's usual bytes of hot code per
    /// instruction in the code that has cold sides (sandboxed or budgeted).
    pub fn new(span: usize, typical: usize) -> Self {
        ColdPlacement {
            span,
            typical,
            pending_since: 0,
            body_start: (0, 0),
            end: 0,
            program_end: 0,
            islands: Vec::new(),
            local_stubs: Vec::new(),
            replay: None,
            cold_bytes: 0,
            hot_bytes: 0,
            hold_until: 0,
        }
    }

    /// Islands the first pass placed (every pass places the same).
    pub fn islands(&self) -> usize {
        self.islands.len()
    }

    /// Whether this is the first pass, the one that guesses first forms (later passes start
    /// from the forms the first one emitted: the relaxation's bound assumes nothing but its
    /// own growth changes them).
    pub fn guessing(&self) -> bool {
        self.replay.is_none()
    }

    /// Starts a pass: the first decides, later ones replay its decisions.
    pub fn begin_pass(&mut self, pass: usize) {
        self.replay = (pass > 1).then_some((0, 0));
        (self.cold_bytes, self.hot_bytes) = (0, 0);
        self.hold_until = 0;
    }

    /// A function's body (instructions `first..end` of a program of `program_end`) starts
    /// at code offset `pos`.
    pub fn begin_function(&mut self, pos: usize, first: usize, end: usize, program_end: usize) {
        self.pending_since = pos;
        self.body_start = (pos, first);
        self.end = end;
        self.program_end = program_end;
    }

    /// At the boundary before instruction `inst`, at code offset `pos`: whether the queued
    /// cold code (if `queued`) is due in an island here. After emitting it, call
    /// [`Self::cold_placed`].
    #[inline]
    pub fn island_due(&mut self, pos: usize, inst: usize, queued: bool) -> bool {
        if !queued {
            self.pending_since = pos;
            return false;
        }
        if let Some((islands, _)) = &mut self.replay {
            let due = self.islands.get(*islands) == Some(&(inst as u32));
            *islands += usize::from(due);
            return due;
        }
        let due = pos - self.pending_since >= self.span && inst > self.hold_until;
        if due {
            self.islands.push(inst as u32);
        }
        due
    }

    /// Instruction `inst` (`op`) is being lowered: if it jumps ahead by at most
    /// [`Self::HOLD_INSTS`], no island goes before its target (one would go between the
    /// jump and where it lands).
    #[inline]
    pub fn note_instruction(&mut self, inst: usize, op: &Op) {
        if let Op::Ja { target } | Op::Jcond { target, .. } = *op {
            let target = target as usize;
            if target > inst && target - inst <= Self::HOLD_INSTS {
                self.hold_until = self.hold_until.max(target);
            }
        }
    }

    /// The queued cold code was placed at code offsets `start..end` (in an island or after
    /// its function).
    pub fn cold_placed(&mut self, start: usize, end: usize) {
        self.cold_bytes += end - start;
        self.hot_bytes += start.saturating_sub(self.pending_since);
        self.pending_since = end;
    }

    /// Expected bytes from code offset `pos`, inside instruction `inst` of the function, to
    /// where the cold code queued now will be placed: the hot code up to the next island or
    /// the function's end, whichever comes first, at the function's density so far, then
    /// the cold code queued before it, at the cold-to-hot ratio of the placements so far
    /// (one to one before the first).
    pub fn expected_distance(&self, pos: usize, inst: usize) -> usize {
        let rest_of_function = self.expected_bytes(pos, inst + 1, self.end);
        let to_island = (self.pending_since.saturating_add(self.span)).saturating_sub(pos);
        let queued_hot = pos - self.pending_since;
        let queued_cold = match self.hot_bytes {
            0 => queued_hot,
            hot => (queued_hot as u128 * self.cold_bytes as u128 / hot as u128) as usize,
        };
        rest_of_function.min(to_island) + queued_cold
    }

    /// Whether the cold code placed at code offset `pos`, before instruction `next` (the
    /// function's end after its last), should have its own copy of the shared stubs: the
    /// hot code from here to the program's end, where their one copy is, is expected to
    /// exceed a span.
    pub fn local_stubs_due(&mut self, pos: usize, next: usize) -> bool {
        if let Some((_, asked)) = &mut self.replay {
            let due = self.local_stubs.get(*asked).copied().unwrap_or(false);
            *asked += 1;
            return due;
        }
        let due = self.expected_bytes(pos, next, self.program_end) >= self.span;
        self.local_stubs.push(due);
        due
    }

    /// Expected hot code bytes of instructions `from..to`, at the density of the current
    /// function's instructions before `from` (whose code ends at `pos`); at least the
    /// backend's typical density while fewer than [`Self::SAMPLE`] are behind (a
    /// function's first instructions, often its cheapest, say little).
    fn expected_bytes(&self, pos: usize, from: usize, to: usize) -> usize {
        let (start_pos, first) = self.body_start;
        let done = from.saturating_sub(first).max(1);
        let mut density = (pos - start_pos) / done;
        if done < Self::SAMPLE {
            density = density.max(self.typical);
        }
        density * to.saturating_sub(from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_island_is_due_a_span_after_the_queue_filled() {
        let mut c = ColdPlacement::new(100, 0);
        c.begin_pass(1);
        c.begin_function(1000, 0, 50, 50);
        assert!(!c.island_due(1010, 1, false));
        // Queued from the boundary at 1010 on: due once 100 bytes of hot code follow it.
        assert!(!c.island_due(1040, 2, true));
        assert!(!c.island_due(1109, 3, true));
        assert!(c.island_due(1110, 4, true));
        c.cold_placed(1114, 1300);
        assert!(!c.island_due(1399, 5, true));
        assert!(c.island_due(1400, 6, true));
    }

    #[test]
    fn no_island_goes_between_a_jump_ahead_and_its_target() {
        let mut c = ColdPlacement::new(100, 0);
        c.begin_pass(1);
        c.begin_function(1000, 0, 50, 50);
        assert!(!c.island_due(1000, 0, false));
        c.note_instruction(0, &Op::Ja { target: 7 });
        // A jump back, a jump too far ahead, or a plain instruction, holds nothing.
        c.note_instruction(3, &Op::Ja { target: 1 });
        let far = 4 + ColdPlacement::HOLD_INSTS as u32 + 1;
        c.note_instruction(4, &Op::Ja { target: far });
        c.note_instruction(4, &Op::Exit);
        // Due by the span from instruction 5 on, but not before 7 (the jump's target)...
        assert!(!c.island_due(1100, 5, true));
        assert!(!c.island_due(1110, 7, true));
        // ...then at once.
        assert!(c.island_due(1120, 8, true));
        c.cold_placed(1124, 1200);
        // A new pass starts with nothing held.
        c.begin_pass(1);
        c.begin_function(1000, 0, 50, 50);
        assert!(!c.island_due(1000, 0, false));
        assert!(c.island_due(1100, 5, true));
    }

    #[test]
    fn later_passes_place_islands_and_stubs_where_the_first_did() {
        let mut c = ColdPlacement::new(100, 0);
        c.begin_pass(1);
        c.begin_function(0, 0, 50, 500);
        assert!(!c.island_due(0, 0, false));
        assert!(c.island_due(100, 5, true));
        assert!(c.local_stubs_due(100, 5));
        c.cold_placed(104, 150);
        // The second pass's code is longer (grown branches): the decisions stay.
        c.begin_pass(2);
        c.begin_function(0, 0, 50, 500);
        assert!(!c.island_due(0, 0, false));
        assert!(
            !c.island_due(130, 4, true),
            "not where the first pass had none"
        );
        assert!(c.island_due(104, 5, true));
        assert!(c.local_stubs_due(0, 5), "as the first pass decided");
    }

    #[test]
    fn without_islands_nothing_is_due() {
        let mut c = ColdPlacement::new(usize::MAX, 0);
        c.begin_pass(1);
        c.begin_function(0, 0, 10, 10);
        assert!(!c.island_due(0, 0, false));
        assert!(!c.island_due(1 << 40, 1, true));
    }

    #[test]
    fn the_expected_distance_is_the_nearer_of_island_and_function_end() {
        let mut c = ColdPlacement::new(10_000, 0);
        c.begin_pass(1);
        c.begin_function(0, 10, 1010, 5000);
        // 100 instructions in 2,000 bytes: 20 bytes each, 900 left after instruction 109.
        // Queued since offset 0: the island is 8,000 bytes on, after the cold code of those
        // 2,000 bytes (as many bytes, before any placement measured the ratio).
        assert_eq!(c.expected_distance(2000, 109), 8000 + 2000);
        c.island_due(2000, 109, false);
        assert_eq!(c.expected_distance(2000, 109), 10_000);
        // Near the end of the function the rest of it is nearer than the island.
        c.island_due(19_820, 1000, false);
        assert_eq!(c.expected_distance(19_820, 1000), 20 * 9);
        // The last instruction, nothing queued before it: its cold side follows it.
        c.island_due(20_000, 1009, false);
        assert_eq!(c.expected_distance(20_000, 1009), 0);
    }

    #[test]
    fn a_functions_first_instructions_are_at_least_typical() {
        let mut c = ColdPlacement::new(1 << 20, 12);
        c.begin_pass(1);
        c.begin_function(0, 0, 1000, 1000);
        c.island_due(20, 5, false);
        // Four bytes per instruction so far, but only five behind: 12 each for the 994 left.
        assert_eq!(c.expected_distance(20, 5), 12 * 994);
        c.island_due(400, 19, false);
        // Twenty behind: their own 20 bytes each.
        assert_eq!(c.expected_distance(400, 19), 20 * 980);
    }

    #[test]
    fn queued_cold_code_counts_at_the_measured_ratio() {
        let mut c = ColdPlacement::new(10_000, 0);
        c.begin_pass(1);
        c.begin_function(0, 0, 300, 300);
        c.island_due(0, 0, false);
        // An island of 500 bytes of cold code for 1,000 bytes of hot code.
        c.cold_placed(1000, 1500);
        // 17 bytes per instruction since the function began (200 in 3,400 bytes), 100
        // left: 1,700 bytes of hot code to the function's end, then the cold code of the
        // 1,900 bytes queued since the island, at half their size.
        assert_eq!(c.expected_distance(3400, 199), 1700 + 950);
    }

    #[test]
    fn local_stubs_are_due_when_the_program_end_is_a_span_away() {
        let mut c = ColdPlacement::new(10_000, 0);
        c.begin_pass(1);
        // Function 10..110 of a program of 700 instructions, 20 bytes each so far.
        c.begin_function(0, 10, 110, 700);
        // After the function: 590 instructions (11,800 bytes) to the program's end.
        assert!(c.local_stubs_due(2000, 110));
        // An island before instruction 60: 640 to go.
        assert!(c.local_stubs_due(1000, 60));
        c = ColdPlacement::new(10_000, 0);
        c.begin_pass(1);
        c.begin_function(0, 10, 110, 500);
        // 390 instructions, 7,800 bytes: the program's stubs are near enough.
        assert!(!c.local_stubs_due(2000, 110));
    }
}
