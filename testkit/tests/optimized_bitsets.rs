//! The optimizing tier's membership tests (`packjit-tier2`'s `bitset`): a run of `jeq`s of one
//! register against small constants, clang's `jgt x, N; s = 1 << x; s &= MASK; jne s, 0`
//! range-and-bit test, and a final inverted `jne`, all to one place, become one branch on a
//! bit of a mask.
//!
//! * Random programs of such runs, each run over several values (context bytes, 64-bit words,
//!   values whose low 32 bits are small but the whole is not), with what must keep a run
//!   apart mixed in: 32- and 64-bit compares in one run, constants of 64 and more and
//!   negative ones, a bound too wide for the shift, a jump into the middle of the run, the
//!   scratch register read after it, the scratch register being the value. r0 and the
//!   context must match the interpreter, trusted and sandboxed. `PACKJIT_BITSET_COUNT`
//!   programs (default 2000, 500 under qemu) from `PACKJIT_BITSET_SEED` (default
//!   0xb175_0000); the range is printed.
//! * That it happens: six `jeq`s compile to less code than the same six in alternating widths.

use packjit::{Budget, LoadOptions, Runtime, Tier};
use packjit_testkit::asm::assemble;
use packjit_testkit::gen::{check_optimized_against_reference, run_reference, Rng};
use std::collections::HashMap;

const CTX_LEN: usize = 64;

fn optimized() -> LoadOptions {
    LoadOptions {
        tier: Tier::Optimized,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    }
}

/// Assembly with labels: jumps name a label, resolved to slot offsets at the end.
#[derive(Default)]
struct Code {
    items: Vec<Item>,
    next_label: usize,
}

enum Item {
    Ins(String),
    /// `"{head}, {offset}"`.
    Jump(String, usize),
    Label(usize),
}

impl Code {
    fn ins(&mut self, s: impl Into<String>) {
        self.items.push(Item::Ins(s.into()));
    }
    fn jump(&mut self, head: impl Into<String>, label: usize) {
        self.items.push(Item::Jump(head.into(), label));
    }
    fn label(&mut self) -> usize {
        self.next_label += 1;
        self.next_label
    }
    fn place(&mut self, label: usize) {
        self.items.push(Item::Label(label));
    }
    fn text(&self) -> String {
        let mut at = HashMap::new();
        let mut slot = 0usize;
        for item in &self.items {
            match item {
                Item::Label(l) => {
                    at.insert(*l, slot);
                }
                Item::Ins(s) => slot += slots(s),
                Item::Jump(..) => slot += 1,
            }
        }
        let mut out = String::new();
        let mut slot = 0i64;
        for item in &self.items {
            match item {
                Item::Label(_) => {}
                Item::Ins(s) => {
                    out += s;
                    out.push('\n');
                    slot += slots(s) as i64;
                }
                Item::Jump(head, l) => {
                    let off = at[l] as i64 - (slot + 1);
                    let sep = if head == "ja" { " " } else { ", " };
                    out += &format!("{head}{sep}{off:+}\n");
                    slot += 1;
                }
            }
        }
        out
    }
}

/// Instruction slots of assembly lines (`lddw` takes two).
fn slots(s: &str) -> usize {
    s.lines()
        .map(|l| if l.starts_with("lddw") { 2 } else { 1 })
        .sum()
}

/// A compare constant: mostly a possible member, sometimes one that keeps the run apart.
fn constant(rng: &mut Rng) -> i64 {
    match rng.below(12) {
        0 => 64 + rng.below(8) as i64,
        1 => -1 - rng.below(3) as i64,
        2 => 63,
        _ => rng.below(40) as i64,
    }
}

/// One run on r8 (r9 its scratch, r7 another context byte), then `r0 = r0 * 3 + 1` on one
/// exit and `r0 = r0 * 5 + 2` on the other.
fn run(rng: &mut Rng, code: &mut Code) {
    let w32 = rng.chance(1, 2);
    let sfx = |rng: &mut Rng, w32: bool| {
        // Now and then one compare of the other width.
        if rng.chance(1, 16) != w32 {
            "32"
        } else {
            ""
        }
    };
    // The value: a byte, a byte with bit 32 set (small low half), a whole word, or a
    // byte moved down (below zero wraps to huge).
    let off = rng.below(CTX_LEN as u64 - 8);
    match rng.below(6) {
        0 => code.ins(format!("ldxdw %r8, [%r1+{off}]")),
        1 => code.ins(format!("ldxb %r8, [%r1+{off}]\nor %r8, %r6")),
        2 => code.ins(format!("ldxb %r8, [%r1+{off}]\nsub %r8, 20")),
        _ => code.ins(format!("ldxb %r8, [%r1+{off}]")),
    }
    code.ins(format!("ldxb %r7, [%r1+{}]", rng.below(CTX_LEN as u64)));
    let (taken, other, join) = (code.label(), code.label(), code.label());
    let eqs = rng.below(5) as usize;
    let group = rng.chance(2, 3);
    let ne_last = rng.chance(1, 4);
    let atoms = eqs + group as usize + ne_last as usize;
    let atom_labels: Vec<usize> = (0..atoms).map(|_| code.label()).collect();
    if atoms > 1 && rng.chance(1, 6) {
        // An entry into the middle of the run.
        let into = atom_labels[1 + rng.below(atoms as u64 - 1) as usize];
        code.jump(format!("jeq %r7, {}", rng.below(40)), into);
    }
    let mut atom = 0;
    for _ in 0..eqs {
        code.place(atom_labels[atom]);
        atom += 1;
        let s = sfx(rng, w32);
        code.jump(format!("jeq{s} %r8, {}", constant(rng)), taken);
    }
    // Where the `jgt` lands: the run's fall-through end, or with a final `jne` that `jne`.
    let after_group = code.label();
    if group {
        code.place(atom_labels[atom]);
        atom += 1;
        let s = sfx(rng, w32);
        let bound = match rng.below(8) {
            0 => 32 + rng.below(40),
            1 => 31,
            _ => rng.below(20),
        };
        let scratch = if rng.chance(1, 20) { 8 } else { 9 };
        let mask = match rng.below(4) {
            0 => "-1".to_string(),
            1 => format!("{:#x}", rng.next_u64() as u32),
            _ => format!("{:#x}", rng.next_u64() as u32 & 0x7fff_ffff),
        };
        code.jump(format!("jgt{s} %r8, {bound}"), after_group);
        // A third of the shift tests take each width at random: which bits survive then
        // depends on all four.
        let mixed = rng.chance(1, 3);
        let width = |rng: &mut Rng| {
            if mixed {
                if rng.chance(1, 2) {
                    "32"
                } else {
                    ""
                }
            } else {
                sfx(rng, w32)
            }
        };
        let (m, l, a, t) = (width(rng), width(rng), width(rng), width(rng));
        code.ins(format!("mov{m} %r{scratch}, 1"));
        code.ins(format!("lsh{l} %r{scratch}, %r8"));
        code.ins(format!("and{a} %r{scratch}, {mask}"));
        code.jump(format!("jne{t} %r{scratch}, 0"), taken);
    }
    code.place(after_group);
    // The exit blocks: the fall-through end first, unless a final `jne` makes `taken` the
    // fall-through.
    let read_scratch = if rng.chance(1, 8) {
        "add %r0, %r9\n"
    } else {
        ""
    };
    let (first, first_body, second, second_body) = if ne_last {
        code.place(atom_labels[atom]);
        let s = sfx(rng, w32);
        code.jump(format!("jne{s} %r8, {}", constant(rng)), other);
        (
            taken,
            "mul %r0, 5\nadd %r0, 2",
            other,
            "mul %r0, 3\nadd %r0, 1",
        )
    } else {
        (
            other,
            "mul %r0, 3\nadd %r0, 1",
            taken,
            "mul %r0, 5\nadd %r0, 2",
        )
    };
    code.place(first);
    code.ins(format!("{read_scratch}{first_body}"));
    code.jump("ja", join);
    code.place(second);
    code.ins(second_body);
    code.place(join);
    // r9 is the next run's scratch; one nonzero value makes a read of a stale one visible.
    code.ins("mov %r9, 7");
}

fn program(seed: u64) -> (String, Vec<u8>) {
    let mut rng = Rng::new(seed);
    let mut code = Code::default();
    code.ins("mov %r0, 0\nmov %r9, 7\nlddw %r6, 0x100000000");
    for _ in 0..1 + rng.below(3) {
        run(&mut rng, &mut code);
    }
    code.ins("exit");
    // Mostly small bytes, so that members and near misses come up.
    let ctx = (0..CTX_LEN)
        .map(|_| {
            if rng.chance(3, 4) {
                rng.below(70) as u8
            } else {
                rng.next_u64() as u8
            }
        })
        .collect();
    (code.text(), ctx)
}

fn random_runs(sandboxed: bool) {
    let rt = Runtime::new().unwrap();
    let emulated = !cfg!(target_arch = "x86_64");
    let count = packjit_testkit::env_u64("PACKJIT_BITSET_COUNT").unwrap_or(if emulated {
        500
    } else {
        2000
    });
    let base = packjit_testkit::env_u64("PACKJIT_BITSET_SEED").unwrap_or(0xb175_0000);
    for seed in base..base + count {
        let (src, ctx) = program(seed);
        let code = assemble(&src).unwrap_or_else(|e| panic!("seed {seed:#x}: {e}\n{src}"));
        // Each program runs on several contexts: the first, and rotations of it.
        for turn in 0..4 {
            let mut ctx = ctx.clone();
            ctx.rotate_left(turn * 7);
            let what = format!("seed {seed:#x}, turn {turn}\n{src}");
            // SAFETY: every access is a constant offset inside the 64-byte context.
            unsafe { check_optimized_against_reference(&rt, &code, &ctx, sandboxed, &what) };
        }
    }
    packjit_testkit::report(&format!(
        "membership tests ({}, sandboxed: {sandboxed}): seeds {base:#x}..{:#x}: {count} programs × 4 contexts matched the interpreter",
        std::env::consts::ARCH,
        base + count
    ));
}

#[test]
fn membership_runs_keep_their_value_trusted() {
    random_runs(false);
}

#[test]
fn membership_runs_keep_their_value_sandboxed() {
    random_runs(true);
}

/// Six `jeq`s of r2 to one place; `apart` alternates 32- and 64-bit compares, which keeps
/// each apart from its neighbours.
fn six_compares(apart: bool) -> Vec<u8> {
    let mut src = String::from("ldxb %r2, [%r1+0]\nmov %r0, 1\n");
    for (i, c) in [9, 10, 13, 32, 44, 59].iter().enumerate() {
        // Alternate widths: no two neighbours compare the same value.
        let w = if apart && i % 2 == 1 { "32" } else { "" };
        src += &format!("jeq{w} %r2, {c}, +{}\n", 6 - i);
    }
    src += "mov %r0, 2\nexit\n";
    assemble(&src).unwrap()
}

#[test]
fn six_compares_are_one_test() {
    let rt = Runtime::new().unwrap();
    let mut sizes = Vec::new();
    for apart in [false, true] {
        let code = six_compares(apart);
        // SAFETY: the program reads byte 0 of the context.
        let p = unsafe { rt.load_trusted(&code, &optimized()) }.unwrap();
        for byte in 0..=255u8 {
            let want = run_reference(&code, &[byte]).unwrap().r0;
            assert_eq!(
                p.call(&mut [byte]).unwrap(),
                want,
                "byte {byte}, apart {apart}"
            );
        }
        sizes.push(p.code_size());
    }
    let (one, apart) = (sizes[0], sizes[1]);
    packjit_testkit::report(&format!(
        "membership tests ({}): six compares {one} bytes of code, kept apart {apart}",
        std::env::consts::ARCH
    ));
    assert!(
        one < apart,
        "the run was not made one test: {one} bytes against {apart} kept apart"
    );
}
