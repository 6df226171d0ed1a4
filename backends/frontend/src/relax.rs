//! Branch relaxation, shared by every backend: which encoding ("form") each branch site
//! gets, so that every branch reaches its target and short forms are used where they do.
//!
//! A backend numbers its branch sites in emission order (the numbering must be the same in
//! every pass), asks [`Relaxation::form`] for each site's form while emitting, and after the
//! pass reports every site's displacement and the range of the form it used
//! ([`BranchCheck`]). [`Relaxation::settle`] then says whether the code is final or which
//! sites grow before the next pass. Forms are ordered shortest first; a site only grows.
//!
//! # Why the number of passes is bounded
//!
//! Code only grows between passes (forms only grow, and nothing else depends on addresses),
//! and one site growing adds at most `growth_bound` bytes, inside its own code. A branch's
//! displacement therefore changes only by the growth of the sites that lie between the
//! branch and its target, and by at most `growth_bound` for each. `settle` grows every
//! failing site, then, as a fixed point, every site whose displacement the growing sites
//! between it and its target could push out of range. The next pass can then only fail at
//! a site whose *new* form is still too short for its distance: after `gentle_passes`
//! passes, growing sites go straight to the longest form, which reaches every distance the
//! program can have (or the program is refused). Hence at most `gentle_passes + 2` passes
//! are emitted; [`Relaxation::MAX_PASSES`] bounds what any backend may configure.
//!
//! Counting only the sites in between (not all that grow) keeps branches that merely sit
//! near their limit in their short form.

use packjit_plugin_api::{CompileError, ErrorKind};

/// One branch site as emitted in a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchCheck<F> {
    /// The site's number (emission order, the same in every pass).
    pub site: usize,
    /// The position the displacement counts from (a byte offset inside the site's code).
    pub at: usize,
    /// Target minus `at`, in bytes.
    pub disp: isize,
    /// Inclusive displacement range of the form the site used in this pass.
    pub range: (isize, isize),
    /// The next longer form to try when this one does not reach (the longest form for a
    /// site already in it; then a failure means the program is too large).
    pub grow: F,
}

/// What [`Relaxation::settle`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Every branch reaches: the pass's code is final.
    Done,
    /// Some sites grew: emit again.
    Again,
}

/// The forms of a program's branch sites across passes.
#[derive(Clone, Debug)]
pub struct Relaxation<F> {
    forms: Vec<F>,
    longest: F,
    growth_bound: isize,
    gentle_passes: usize,
    passes: usize,
}

impl<F: Copy + Ord + std::fmt::Debug> Relaxation<F> {
    /// The most passes a backend may be configured to need (`gentle_passes + 2`).
    pub const MAX_PASSES: usize = 8;

    /// `longest` reaches any distance the backend supports; `growth_bound` is the most bytes
    /// one site adds when it grows (from any form to any longer one); after `gentle_passes`
    /// passes, growing sites jump to `longest`.
    pub fn new(longest: F, growth_bound: isize, gentle_passes: usize) -> Self {
        assert!(
            gentle_passes + 2 <= Self::MAX_PASSES,
            "relaxation configured for more than {} passes",
            Self::MAX_PASSES
        );
        Relaxation {
            forms: Vec::new(),
            longest,
            growth_bound,
            gentle_passes,
            passes: 0,
        }
    }

    /// Starts a pass (call before emitting).
    pub fn begin_pass(&mut self) {
        self.passes += 1;
    }

    /// Passes begun so far.
    pub fn passes(&self) -> usize {
        self.passes
    }

    /// Room for `sites` sites' forms, so that recording them ([`Relaxation::form`], in site
    /// order) does not regrow the list one doubling at a time.
    pub fn reserve(&mut self, sites: usize) {
        self.forms.reserve(sites.saturating_sub(self.forms.len()));
    }

    /// The form of `site`, at least `smallest` (the shortest form the site's kind has).
    pub fn form(&mut self, site: usize, smallest: F) -> F {
        if site >= self.forms.len() {
            self.forms.resize(site + 1, smallest);
        }
        self.forms[site] = self.forms[site].max(smallest);
        self.forms[site]
    }

    /// The current form of every site (for backends that key forms by instruction).
    pub fn forms(&self) -> &[F] {
        &self.forms
    }

    /// Decides after a pass; `too_far` names the site whose longest form still does not
    /// reach (the backend turns it into an error naming the pc).
    pub fn settle(
        &mut self,
        checks: &[BranchCheck<F>],
        too_far: impl Fn(&BranchCheck<F>) -> CompileError,
    ) -> Result<Settled, CompileError> {
        let outside = |c: &BranchCheck<F>, disp: isize| disp < c.range.0 || disp > c.range.1;
        // Grow the failing sites, then every site the growth between it and its target
        // could push out of range, until no more join.
        let mut grows: Vec<bool> = checks.iter().map(|c| outside(c, c.disp)).collect();
        loop {
            let mut growing: Vec<usize> = checks
                .iter()
                .zip(&grows)
                .filter(|(_, &g)| g)
                .map(|(c, _)| c.at)
                .collect();
            growing.sort_unstable();
            let between = |lo: usize, hi: usize| {
                (growing.partition_point(|&p| p < hi) - growing.partition_point(|&p| p < lo))
                    as isize
            };
            let mut joined = false;
            for (c, g) in checks.iter().zip(grows.iter_mut()).filter(|(_, g)| !**g) {
                let target = c.at as isize + c.disp;
                let (lo, hi) = if c.disp >= 0 {
                    (c.at, target as usize)
                } else {
                    (target as usize, c.at)
                };
                let push = between(lo, hi) * self.growth_bound;
                let worst = if c.disp >= 0 {
                    c.disp + push
                } else {
                    c.disp - push
                };
                if outside(c, worst) {
                    *g = true;
                    joined = true;
                }
            }
            if !joined {
                break;
            }
        }
        let mut again = false;
        for (c, _) in checks.iter().zip(&grows).filter(|(_, &g)| g) {
            let cur = self.forms[c.site];
            if cur == self.longest {
                if outside(c, c.disp) {
                    return Err(too_far(c));
                }
                continue;
            }
            again = true;
            self.forms[c.site] = if self.passes > self.gentle_passes {
                self.longest
            } else {
                c.grow.max(cur)
            };
        }
        if again && self.passes >= Self::MAX_PASSES {
            // Unreachable by the argument in the module docs; kept as an error, not a loop.
            return Err(CompileError::new(
                ErrorKind::Internal,
                format!("branch forms did not settle in {} passes", self.passes),
            ));
        }
        Ok(if again { Settled::Again } else { Settled::Done })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Form {
        Short,
        Mid,
        Long,
    }

    fn size(f: Form) -> isize {
        match f {
            Form::Short => 2,
            Form::Mid => 4,
            Form::Long => 8,
        }
    }

    fn range(f: Form) -> (isize, isize) {
        match f {
            Form::Short => (-128, 127),
            Form::Mid => (-32768, 32767),
            Form::Long => (isize::MIN / 2, isize::MAX / 2),
        }
    }

    /// A toy backend: `n` branches, branch `k` at the start of block `k`, each block
    /// `filler` bytes of straight code, branch `k` targeting block `targets[k]`.
    fn run(filler: &[isize], targets: &[usize], gentle: usize) -> (Vec<Form>, usize) {
        let n = filler.len();
        let mut r = Relaxation::new(Form::Long, size(Form::Long) - size(Form::Short), gentle);
        loop {
            r.begin_pass();
            let forms: Vec<Form> = (0..n).map(|k| r.form(k, Form::Short)).collect();
            let mut starts = vec![0isize; n + 1];
            for k in 0..n {
                starts[k + 1] = starts[k] + size(forms[k]) + filler[k];
            }
            let checks: Vec<BranchCheck<Form>> = (0..n)
                .map(|k| {
                    let grow = match forms[k] {
                        Form::Short => Form::Mid,
                        _ => Form::Long,
                    };
                    BranchCheck {
                        site: k,
                        at: (starts[k] + size(forms[k])) as usize,
                        disp: starts[targets[k]] - (starts[k] + size(forms[k])),
                        range: range(forms[k]),
                        grow,
                    }
                })
                .collect();
            match r
                .settle(&checks, |c| {
                    CompileError::new(ErrorKind::Encoding, format!("{c:?}"))
                })
                .unwrap()
            {
                Settled::Done => {
                    // Every branch reaches in the final layout.
                    for c in &checks {
                        assert!(c.disp >= c.range.0 && c.disp <= c.range.1, "{c:?}");
                    }
                    return (forms, r.passes());
                }
                Settled::Again => assert!(r.passes() < Relaxation::<Form>::MAX_PASSES),
            }
        }
    }

    #[test]
    fn short_branches_stay_short() {
        let (forms, passes) = run(&[10, 10, 10, 10], &[2, 3, 0, 1], 4);
        assert_eq!(forms, vec![Form::Short; 4]);
        assert_eq!(passes, 1);
    }

    #[test]
    fn far_branches_grow_to_the_form_that_reaches() {
        let (forms, _) = run(&[100, 200, 40_000, 10], &[3, 2, 0, 0], 4);
        assert_eq!(forms[0], Form::Long); // spans the 40 KB block
        assert_eq!(forms[1], Form::Mid); // 200 bytes: beyond Short
        assert_eq!(forms[2], Form::Mid); // back over blocks 0 and 1 (its own filler follows it)
        assert_eq!(forms[3], Form::Long); // back across 40 KB
    }

    #[test]
    fn only_growth_between_a_branch_and_its_target_counts() {
        // Branch 0 jumps over a 40 KB block (grows); branch 2 sits 4 bytes inside its short
        // range, but nothing between it and its target grows: it stays short, and the
        // layout settles in two passes.
        let (forms, passes) = run(&[40_000, 0, 123, 10], &[1, 0, 3, 0], 0);
        assert_eq!(forms[0], Form::Long);
        assert_eq!(forms[2], Form::Short);
        assert_eq!(passes, 2);
    }

    #[test]
    fn cascades_settle_within_the_bound() {
        // A row of backward branches each just inside the short range: the growth of one
        // pushes the next out, the classic cascade. Pseudo-random layouts too.
        let n: usize = 64;
        let filler: Vec<isize> = (0..n).map(|k| 120 - (k % 3) as isize).collect();
        let targets: Vec<usize> = (0..n).map(|k| k.saturating_sub(1)).collect();
        let (_, passes) = run(&filler, &targets, 4);
        assert!(passes <= 6, "{passes} passes");
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for seed in 0..200u64 {
            s ^= seed;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            };
            let n = 2 + (next() % 60) as usize;
            let filler: Vec<isize> = (0..n).map(|_| (next() % 300) as isize).collect();
            let targets: Vec<usize> = (0..n).map(|_| (next() % n as u64) as usize).collect();
            for gentle in [0, 2, 4] {
                let (_, passes) = run(&filler, &targets, gentle);
                assert!(
                    passes <= gentle + 2,
                    "seed {seed}: {passes} passes, gentle {gentle}"
                );
            }
        }
    }

    #[test]
    fn a_longest_form_that_does_not_reach_is_an_error() {
        let mut r = Relaxation::new(Form::Mid, 2, 4);
        r.begin_pass();
        assert_eq!(r.form(0, Form::Mid), Form::Mid);
        let c = BranchCheck {
            site: 0,
            at: 0,
            disp: 1 << 20,
            range: range(Form::Mid),
            grow: Form::Mid,
        };
        let e = r
            .settle(&[c], |c| {
                CompileError::new(ErrorKind::Encoding, format!("site {} too far", c.site))
            })
            .unwrap_err();
        assert!(e.message.contains("site 0 too far"));
    }
}
