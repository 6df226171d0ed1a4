//! The harness must fail when a backend is wrong. A wrapper backend that miscompiles one
//! instruction (it rewrites the bytecode it is given before handing it to the real backend,
//! exactly as a wrong emitter for that instruction would behave) must be caught by both the
//! conformance runner and the differential tester, with a report naming the case / seed.
//!
//! On a host that cannot run the backend's code (x86-64), the same corruption is applied in
//! front of the reference evaluator instead, so the runner's judging logic is still proven.

use packjit::Runtime;
use packjit_plugin_api::{Arch, CodeArena, CompileError, CompileRequest, Compiled, JitBackend};
use packjit_testkit::conformance::{
    load_suite, run_cases, run_suite, suite_dir, Engine, Loaded, ReferenceEngine, RuntimeEngine,
};
use packjit_testkit::gen::{check_seed, helpers};
use std::sync::Arc;

/// How the broken backend miscompiles: `(opcode, replacement)`.
#[derive(Clone, Copy)]
struct Corruption {
    from: u8,
    to: u8,
    what: &'static str,
}

/// `add64 dst, imm` compiled as `sub64 dst, imm`.
const ADD_AS_SUB: Corruption = Corruption {
    from: 0x07,
    to: 0x17,
    what: "add64 imm emitted as sub",
};
/// `xor64 dst, src` compiled as `or`. (Not `add64 imm` for the differential run: the
/// generator's loops count down with `add rC, -1`, and a native loop that never ends cannot be
/// interrupted; the suite's programs all still terminate under ADD_AS_SUB.)
const XOR_AS_OR: Corruption = Corruption {
    from: 0xaf,
    to: 0x4f,
    what: "xor64 reg emitted as or",
};
/// `jsgt dst, src` compiled as `jsge`: an off-by-one condition, the subtle kind.
const JSGT_AS_JSGE: Corruption = Corruption {
    from: 0x6d,
    to: 0x7d,
    what: "jsgt reg emitted as jsge",
};

fn corrupt(code: &[u8], c: Corruption) -> Vec<u8> {
    let mut out = code.to_vec();
    let mut pc = 0;
    while pc + 8 <= out.len() {
        let opc = out[pc];
        if opc == c.from {
            out[pc] = c.to;
        }
        // Skip the second slot of lddw: its bytes are data.
        pc += if opc == 0x18 { 16 } else { 8 };
    }
    out
}

struct BrokenBackend {
    inner: Arc<dyn JitBackend>,
    c: Corruption,
}

impl JitBackend for BrokenBackend {
    fn arch(&self) -> Arch {
        self.inner.arch()
    }
    fn name(&self) -> &str {
        "deliberately broken backend (harness self-test)"
    }
    fn version(&self) -> &str {
        "0"
    }
    fn supported_features(&self) -> u64 {
        self.inner.supported_features()
    }
    fn detect_features(&self) -> u64 {
        self.inner.detect_features()
    }
    fn compile(
        &self,
        req: &CompileRequest<'_>,
        arena: &dyn CodeArena,
    ) -> Result<Compiled, CompileError> {
        let code = corrupt(req.code, self.c);
        self.inner.compile(
            &CompileRequest {
                code: &code,
                ..*req
            },
            arena,
        )
    }
}

/// The corruption in front of the reference (for hosts that cannot run JIT code).
struct BrokenReference(ReferenceEngine, Corruption);

impl Engine for BrokenReference {
    fn label(&self) -> String {
        format!("reference with {}", self.1.what)
    }
    fn load<'a>(&'a self, code: &[u8]) -> Result<Box<dyn Loaded + 'a>, String> {
        self.0.load(&corrupt(code, self.1))
    }
}

fn native_backend() -> Option<Arc<dyn JitBackend>> {
    match Arch::host() {
        Some(Arch::Aarch64) => Some(Arc::new(packjit_arm64::Arm64Backend::new())),
        Some(Arch::Riscv64) => Some(Arc::new(packjit_rv64::Rv64Backend::new())),
        _ => None,
    }
}

fn broken_runtime(c: Corruption) -> Option<Runtime> {
    let inner = native_backend()?;
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(BrokenBackend { inner, c }))
        .unwrap();
    for (id, f, _) in helpers() {
        rt.register_helper(id, "gen", f).unwrap();
    }
    Some(rt)
}

#[test]
fn conformance_catches_a_miscompiled_instruction() {
    for c in [ADD_AS_SUB, JSGT_AS_JSGE] {
        let s = match broken_runtime(c) {
            Some(rt) => run_suite(&rt, Arch::host().unwrap(), None, &suite_dir()),
            None => run_cases(
                &BrokenReference(ReferenceEngine::default(), c),
                &load_suite(&suite_dir()).unwrap(),
                &[],
            ),
        };
        println!("{} -> {}", c.what, s.report());
        assert!(s.failed > 0, "{}: the suite did not notice", c.what);
        // Every failure is a wrong result (nothing else was broken), and names the case.
        assert!(
            s.failures.iter().all(|(_, r)| r.contains("expected 0x")),
            "{}",
            s.report()
        );
        if c.from == ADD_AS_SUB.from {
            assert!(
                s.failures.iter().any(|(n, _)| n == "tests/add64"),
                "{}",
                s.report()
            );
        }
    }
}

#[test]
fn differential_catches_and_minimises_a_miscompiled_instruction() {
    for c in [XOR_AS_OR, JSGT_AS_JSGE] {
        let rt_holder = broken_runtime(c);
        let reference_engine =
            BrokenReference(ReferenceEngine(packjit_testkit::gen::reference()), c);
        let rt_engine;
        let engine: &dyn Engine = match &rt_holder {
            Some(rt) => {
                rt_engine = RuntimeEngine {
                    rt,
                    opts: Default::default(),
                };
                &rt_engine
            }
            None => &reference_engine,
        };
        let m = (0x5eed_0000..0x5eed_0000 + 500u64)
            .find_map(|seed| check_seed(engine, seed).err())
            .unwrap_or_else(|| panic!("{}: 500 programs and no mismatch", c.what));
        let report = m.to_string();
        println!("{} ->\n{report}", c.what);
        assert!(report.contains(&format!("seed {:#x}", m.seed)));
        // The minimised program still shows the problem and keeps the broken instruction
        // (it is the only thing that can make the two sides differ).
        let code = m.minimised.encode();
        assert!(code.chunks(8).any(|s| s[0] == c.from), "{report}");
        assert!(m.minimised.size() <= 3, "poorly minimised:\n{report}");
    }
}
