//! Code density per instruction class, for the backends' benches: how many native
//! instructions each class of eBPF instruction became, summed over a corpus, so a change in
//! the lowering shows where it lands. The backend bench supplies, per program, where each
//! eBPF instruction's native code starts (in native instructions).

use packjit_frontend::{Op, Program, Width};
use std::collections::BTreeMap;

/// The class an instruction is counted under.
pub fn class_of(op: &Op) -> &'static str {
    match op {
        Op::Alu {
            width: Width::W64, ..
        }
        | Op::MovSx {
            width: Width::W64, ..
        }
        | Op::Neg {
            width: Width::W64, ..
        } => "alu64",
        Op::Alu { .. } | Op::MovSx { .. } | Op::Neg { .. } => "alu32",
        Op::End { .. } => "byte swap",
        Op::LdImm64 { .. } => "lddw",
        Op::Load { .. } => "load",
        Op::Store { .. } => "store",
        Op::Atomic { .. } => "atomic",
        Op::Ja { .. } | Op::Jcond { .. } => "jump",
        Op::CallHelper { .. } | Op::CallReg { .. } | Op::CallLocal { .. } => "call",
        Op::Exit => "exit",
        Op::MovPerCpu { .. } => "per-CPU mov",
        Op::PacketLoad { .. } => "packet load",
    }
}

/// eBPF slots and native instructions per class, over a corpus.
#[derive(Debug, Default)]
pub struct Density {
    classes: BTreeMap<&'static str, (usize, usize)>,
    /// Prologues, epilogues, each program's last instruction and out-of-line code.
    frame: usize,
    slots: usize,
    native: usize,
}

impl Density {
    /// Adds one program: `starts[i]` is the native instruction index where instruction
    /// `i`'s code starts, `total` the program's native instruction count. Each instruction
    /// but the last is charged up to the next one's start; the rest is the frame.
    pub fn add(&mut self, prog: &Program, starts: &[usize], total: usize) {
        assert_eq!(starts.len(), prog.insts.len(), "one start per instruction");
        let mut charged = 0;
        for (i, inst) in prog.insts.iter().enumerate().take(prog.insts.len() - 1) {
            let n = starts[i + 1].saturating_sub(starts[i]);
            let e = self.classes.entry(class_of(&inst.op)).or_default();
            e.0 += if matches!(inst.op, Op::LdImm64 { .. }) {
                2
            } else {
                1
            };
            e.1 += n;
            charged += n;
        }
        self.frame += total - charged;
        self.slots += prog.slots;
        self.native += total;
    }

    /// One line per class and the frame line, in the bench's words.
    pub fn report(&self, arch: &str) -> String {
        let mut out = String::new();
        for (class, (slots, native)) in &self.classes {
            out += &format!(
                "  {class:<10} {slots:>6} eBPF insns -> {native:>6} {arch} insns ({:.2} per eBPF insn)\n",
                *native as f64 / *slots as f64
            );
        }
        out += &format!(
            "  {:<10} {:>6} {arch} insns (prologues, epilogues, last instructions, out-of-line code: {:.2} per program-level eBPF insn)\n",
            "frame",
            self.frame,
            self.frame as f64 / self.slots.max(1) as f64
        );
        out
    }
}
