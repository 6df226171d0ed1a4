//! The bpf_conformance suite runner.
//!
//! Cases come from `<suite>/tests/*.data` (run and compare r0, or expect rejection when the
//! file has `-- error`) and `<suite>/negative/unused-*.data` (reserved fields set: must be
//! rejected at load time). The other `negative/` files exercise upstream's runner and
//! assembler (bad mnemonics, a wrong expected value); the assembler's unit tests cover those.
//!
//! Anything that can load and maybe run a program is an [`Engine`]: a `packjit::Runtime`
//! targeting one arch ([`RuntimeEngine`]), the reference evaluator ([`ReferenceEngine`]), or a
//! deliberately broken wrapper in the harness self-test. Where the engine cannot execute (a
//! foreign arch), a positive test passes when it compiles: "compile-only" mode.

use crate::data::{list_dir, TestCase};
use crate::reference::{helper_identity, Reference};
use packjit::{LoadOptions, Runtime};
use packjit_plugin_api::Arch;
use std::fmt;
use std::path::{Path, PathBuf};

/// The helper id the suite calls (`call 5`, `callx` with 5): returns its first argument.
pub const SUITE_HELPER_ID: u32 = 5;

/// Something that loads (compiles and verifies) programs.
pub trait Engine {
    /// For messages, e.g. `aarch64 (features 0x1)`.
    fn label(&self) -> String;
    /// Loads `code`; `Err` is a rejection with its message.
    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String>;
}

/// A loaded program.
pub trait Loaded {
    /// Runs with `mem` as the context. `None` when this engine cannot execute here
    /// (compiled for a foreign arch).
    fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>>;
}

/// How one case is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Load, run, compare r0 with `-- result`.
    Result(u64),
    /// Must be rejected at load time.
    Reject,
    /// Nothing to check (no result, no error section).
    Nothing,
}

/// One case of the suite.
#[derive(Clone, Debug)]
pub struct SuiteCase {
    /// `tests/add` or `negative/unused-call-dst`.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// The parsed file, or why it could not be parsed/assembled (a harness failure).
    pub program: Result<Vec<u8>, String>,
    /// Context memory.
    pub mem: Vec<u8>,
    /// What must happen.
    pub expect: Expect,
}

/// Per-engine results.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Engine label.
    pub label: String,
    /// Cases that behaved as expected.
    pub passed: usize,
    /// Cases that did not.
    pub failed: usize,
    /// Cases not judged (no expectation, or on the expected-to-fail list and failing).
    pub skipped: usize,
    /// How many passed cases only compiled (foreign arch).
    pub compile_only: usize,
    /// `(case, reason)` for every failure.
    pub failures: Vec<(String, String)>,
    /// `(case, reason)` for every skip.
    pub skips: Vec<(String, String)>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} passed, {} failed, {} skipped",
            self.label, self.passed, self.failed, self.skipped
        )?;
        if self.compile_only > 0 {
            write!(f, " ({} compile-only)", self.compile_only)?;
        }
        Ok(())
    }
}

impl Summary {
    /// A multi-line report: the summary line, then each failure.
    pub fn report(&self) -> String {
        let mut s = format!("{self}\n");
        for (n, r) in &self.failures {
            s.push_str(&format!("  FAIL {n}: {r}\n"));
        }
        s
    }
}

/// The suite directory: `$PACKJIT_CONFORMANCE_DIR`, else `shared/conformance` next to the
/// workspace (`<workspace>/../shared/conformance`).
pub fn suite_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PACKJIT_CONFORMANCE_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance")
}

/// Reads the suite: `tests/*.data` and `negative/unused-*.data`.
pub fn load_suite(dir: &Path) -> Result<Vec<SuiteCase>, String> {
    let tests = list_dir(&dir.join("tests"))
        .map_err(|e| format!("{}: {e}", dir.join("tests").display()))?;
    let negative = list_dir(&dir.join("negative")).unwrap_or_default();
    let mut out = Vec::new();
    for path in tests {
        out.push(case_from(&path, "tests", false));
    }
    for path in negative {
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("unused-"))
        {
            out.push(case_from(&path, "negative", true));
        }
    }
    if out.is_empty() {
        return Err(format!("{}: no .data files", dir.display()));
    }
    Ok(out)
}

fn case_from(path: &Path, group: &str, must_reject: bool) -> SuiteCase {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = format!("{group}/{stem}");
    match TestCase::load(path) {
        Ok(tc) => {
            let expect = if must_reject || tc.expects_error() {
                Expect::Reject
            } else {
                tc.result.map_or(Expect::Nothing, Expect::Result)
            };
            SuiteCase {
                name,
                path: path.to_path_buf(),
                program: tc.program(),
                mem: tc.mem,
                expect,
            }
        }
        Err(e) => SuiteCase {
            name,
            path: path.to_path_buf(),
            program: Err(format!("bad .data file: {e}")),
            mem: Vec::new(),
            expect: Expect::Nothing,
        },
    }
}

/// Runs `cases` on `engine`. `xfail` lists `(case name, reason)` expected to fail: such a
/// failure is a skip; such a case *passing* is a failure (so the list only shrinks).
pub fn run_cases(engine: &dyn Engine, cases: &[SuiteCase], xfail: &[(&str, &str)]) -> Summary {
    let mut s = Summary {
        label: engine.label(),
        ..Summary::default()
    };
    for case in cases {
        let verdict = judge(engine, case);
        let xf = xfail.iter().find(|(n, _)| *n == case.name);
        match (verdict, xf) {
            (Verdict::Pass { compile_only }, None) => {
                s.passed += 1;
                s.compile_only += compile_only as usize;
            }
            (Verdict::Pass { .. }, Some((_, why))) => {
                s.failed += 1;
                s.failures.push((
                    case.name.clone(),
                    format!("passes but is on the expected-to-fail list ({why}): remove it"),
                ));
            }
            (Verdict::Fail(r), None) => {
                s.failed += 1;
                s.failures.push((case.name.clone(), r));
            }
            (Verdict::Fail(r), Some((_, why))) => {
                s.skipped += 1;
                s.skips
                    .push((case.name.clone(), format!("expected to fail ({why}): {r}")));
            }
            (Verdict::Skip(r), _) => {
                s.skipped += 1;
                s.skips.push((case.name.clone(), r));
            }
        }
    }
    s
}

enum Verdict {
    Pass { compile_only: bool },
    Fail(String),
    Skip(String),
}

fn judge(engine: &dyn Engine, case: &SuiteCase) -> Verdict {
    let code = match &case.program {
        Ok(c) => c,
        Err(e) => return Verdict::Fail(format!("harness could not read the test: {e}")),
    };
    match case.expect {
        Expect::Nothing => Verdict::Skip("no -- result or -- error section".into()),
        Expect::Reject => match engine.load(code) {
            Err(_) => Verdict::Pass {
                compile_only: false,
            },
            Ok(_) => Verdict::Fail("loaded a program that must be rejected at load time".into()),
        },
        Expect::Result(want) => {
            let mut loaded = match engine.load(code) {
                Ok(l) => l,
                Err(e) => return Verdict::Fail(format!("rejected: {e}")),
            };
            let mut mem = case.mem.clone();
            match loaded.run(&mut mem) {
                None => Verdict::Pass { compile_only: true },
                Some(Ok(got)) if got == want => Verdict::Pass {
                    compile_only: false,
                },
                Some(Ok(got)) => Verdict::Fail(format!("r0 = {got:#x}, expected {want:#x}")),
                Some(Err(e)) => Verdict::Fail(format!("run failed: {e}")),
            }
        }
    }
}

/// A `packjit::Runtime` compiling for one arch with one feature set.
pub struct RuntimeEngine<'r> {
    /// The runtime (its backends and helpers).
    pub rt: &'r Runtime,
    /// Load options (arch and features).
    pub opts: LoadOptions,
}

impl RuntimeEngine<'_> {
    fn arch(&self) -> Arch {
        self.opts.arch.or_else(Arch::host).unwrap_or(Arch::X86_64)
    }
}

impl Engine for RuntimeEngine<'_> {
    fn label(&self) -> String {
        let arch = self.arch();
        let backend = self
            .rt
            .backends()
            .into_iter()
            .find(|b| b.arch == arch)
            .map_or_else(|| "no backend".to_string(), |b| b.name);
        match self.opts.features {
            Some(f) => format!("{arch} (features {f:#x}, {backend})"),
            None => format!("{arch} (detected features, {backend})"),
        }
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        let p = self.rt.load(code, &self.opts).map_err(|e| e.to_string())?;
        Ok(Box::new(p))
    }
}

impl Loaded for packjit::Program {
    fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
        if !self.is_executable() {
            return None;
        }
        Some(self.call(mem).map_err(|e| e.to_string()))
    }
}

/// Registers the suite's helper 5 on `rt` unless an id 5 helper is already there.
pub fn ensure_suite_helper(rt: &Runtime) -> Result<(), String> {
    if rt.helpers().iter().any(|h| h.id == SUITE_HELPER_ID) {
        return Ok(());
    }
    rt.register_helper(SUITE_HELPER_ID, "identity", helper_identity)
        .map_err(|e| e.to_string())
}

/// Runs the whole suite in `dir` on `rt` for `arch`, with exactly `features` (or the
/// backend's default), and prints the summary line. Helper 5 is registered if missing.
/// Cases that cannot run here (foreign arch) are compile-only.
pub fn run_suite(rt: &Runtime, arch: Arch, features: Option<u64>, dir: &Path) -> Summary {
    run_suite_xfail(rt, arch, features, dir, &[])
}

/// [`run_suite`] with an expected-to-fail list (see [`run_cases`]).
pub fn run_suite_xfail(
    rt: &Runtime,
    arch: Arch,
    features: Option<u64>,
    dir: &Path,
    xfail: &[(&str, &str)],
) -> Summary {
    let engine = RuntimeEngine {
        rt,
        opts: LoadOptions {
            arch: Some(arch),
            features,
            ..LoadOptions::default()
        },
    };
    let mut summary = match (ensure_suite_helper(rt), load_suite(dir)) {
        (Ok(()), Ok(cases)) => run_cases(&engine, &cases, xfail),
        (Err(e), _) | (_, Err(e)) => Summary {
            label: engine.label(),
            failed: 1,
            failures: vec![("<suite>".into(), e)],
            ..Summary::default()
        },
    };
    summary.label = engine.label();
    crate::report(&summary.to_string());
    summary
}

/// The reference evaluator as an engine (helper 5 registered): the suite must pass on it,
/// which checks the assembler and the reference together.
pub struct ReferenceEngine(pub Reference);

impl Default for ReferenceEngine {
    fn default() -> Self {
        Self(Reference::new().with_helper(SUITE_HELPER_ID, helper_identity))
    }
}

struct RefLoaded<'a> {
    r: &'a Reference,
    prog: packjit_frontend::Program,
}

impl Engine for ReferenceEngine {
    fn label(&self) -> String {
        "reference".into()
    }

    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        let prog =
            packjit_frontend::decode(code, &self.0.helper_table()).map_err(|e| e.to_string())?;
        Ok(Box::new(RefLoaded { r: &self.0, prog }))
    }
}

impl Loaded for RefLoaded<'_> {
    fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
        Some(
            self.r
                .run_program(&self.prog, mem)
                .map(|o| o.r0)
                .map_err(|e| e.to_string()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite() -> Vec<SuiteCase> {
        load_suite(&suite_dir()).expect("conformance suite present")
    }

    #[test]
    fn whole_suite_passes_on_the_reference() {
        let cases = suite();
        assert!(cases.len() > 300, "only {} cases", cases.len());
        let s = run_cases(&ReferenceEngine::default(), &cases, &[]);
        println!("{}", s.report());
        assert_eq!(s.failed, 0, "{}", s.report());
        assert_eq!(s.skipped, 0, "{:?}", s.skips);
        assert!(cases.iter().filter(|c| c.expect == Expect::Reject).count() >= 45);
    }

    #[test]
    fn every_suite_program_disassembles_and_reassembles() {
        for c in suite() {
            let code = c.program.unwrap();
            let text = crate::disasm::disassemble(&code, false);
            if text.contains(".raw") {
                continue; // reserved-field negative cases are not expressible in the dialect
            }
            assert_eq!(
                crate::asm::assemble(&text).unwrap(),
                code,
                "{}\n{text}",
                c.name
            );
        }
    }

    /// An engine that flips r0's low bit for one named program: the runner must report it.
    struct OffByOne;
    impl Engine for OffByOne {
        fn label(&self) -> String {
            "off-by-one".into()
        }
        fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
            Ok(Box::new(OffByOneLoaded(
                ReferenceEngine::default(),
                code.to_vec(),
            )))
        }
    }
    struct OffByOneLoaded(ReferenceEngine, Vec<u8>);
    impl Loaded for OffByOneLoaded {
        fn run(&mut self, mem: &mut [u8]) -> Option<Result<u64, String>> {
            let r = self
                .0
                 .0
                .run(&self.1, mem)
                .map(|o| o.r0 ^ 1)
                .map_err(|e| e.to_string());
            Some(r)
        }
    }

    #[test]
    fn runner_reports_wrong_results_and_wrong_acceptance() {
        let cases = suite();
        let s = run_cases(&OffByOne, &cases, &[("tests/add", "demo")]);
        // Every positive case is wrong; every must-reject case is wrongly accepted.
        assert_eq!(s.passed, 0, "{}", s.report());
        assert_eq!(s.skipped, 1);
        assert!(s
            .failures
            .iter()
            .any(|(n, r)| n == "negative/unused-call-dst" && r.contains("must be rejected")));
        assert!(
            s.failures
                .iter()
                .any(|(n, r)| n == "tests/add64" && r.contains("expected 0x")),
            "{}",
            s.report()
        );
        // And an xfail entry that passes is itself a failure.
        let s = run_cases(
            &ReferenceEngine::default(),
            &cases,
            &[("tests/add", "stale")],
        );
        assert_eq!(s.failed, 1);
        assert!(s.failures[0].1.contains("remove it"));
        assert!(s.to_string().starts_with("reference: "));
    }
}
