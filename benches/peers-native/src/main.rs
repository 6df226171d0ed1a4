//! Side by side in one process, natively: packjit (trusted and sandboxed) against rbpf 0.4's
//! JIT, ubpf's x86-64 JIT and llvmbpf (bpftime's LLVM JIT), on the clang-built C programs of
//! `tests/bpf/peers` (issue 45).
//!
//! `scripts/peers-native.sh UBPF_SRC LLVMBPF_SRC [--quick]` builds and runs it; see
//! docs/BENCHMARKS.md, "Side by side with ubpf and llvmbpf".
//!
//! Every engine gets the same bytecode, linked by `packjit::elf::link` (`.text` callees after
//! the entry, `.rodata` addresses patched into the `lddw`s as plain 64-bit immediates, the
//! extern `pj_mix` resolved to helper 77) and the same context: r1 = pointer, r2 = length.
//! ubpf and llvmbpf get the function pointer their `compile` returns, called directly; rbpf
//! gets `EbpfVmMbuff::execute_program_jit` with the context as the mbuff. packjit's programs
//! run through `Program::call`; the optimized code also through its raw entry
//! (`Program::entry`, with the environment a run would build), called directly as the C
//! engines' code is: the two columns apart show the code and what a safe run adds to it. Every engine's
//! result is compared with packjit sandboxed's before anything is timed; an engine that
//! computes a program wrong is not timed on it ("—" in the run table; its compile time is
//! still shown), one that refuses it gets "—" in both, and the bench insists on the known
//! wrong results and refusals (`peers::KNOWN`, with the reason for each) staying so, so a
//! fixed engine shows up.
//!
//! * run time: ns per run, the median over rounds of a batch of runs sized to ~2 ms; programs
//!   and engines rotate round by round.
//! * compile time: µs per program, the median of single compiles per round, median over
//!   rounds. packjit: `load_trusted` / `load` (verify, analyses, emit, install, commit).
//!   rbpf: `EbpfVmMbuff::new` + `register_helper` + `jit_compile`. ubpf: `ubpf_create` +
//!   `ubpf_register` + `ubpf_load` + `ubpf_compile`. llvmbpf: `llvmbpf_vm()` +
//!   `register_external_function` + `load_code` + `compile` (lifting, LLVM's O3 pipeline,
//!   ORC JIT). Freeing is not timed.
//!
//! `PEERS_NATIVE_DUMP=dir` writes ubpf's and llvmbpf's code of each program, from its entry
//! to the end of that page, as `dir/<engine>-<program>.bin`, to read beside packjit's
//! (`cargo run -p packjit-tier2 --example dump`, `packjit-demo dump`).

mod peers;

use packjit::elf::{link, ElfLoadOptions, Linked};
use packjit::{LoadOptions, PjProgramEntry, Program, Runtime, Tier};
use packjit_plugin_api::PjExecEnv;
use peers::{compile_object, input, pj_mix, rbpf_mix, Known, HELPER_ID};
use std::ffi::{c_char, c_void, CStr};
use std::hint::black_box;
use std::time::Instant;

type Helper = unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64;
type Jitted = unsafe extern "C" fn(*mut u8, usize) -> u64;

extern "C" {
    fn pn_ubpf_load(
        code: *const u8,
        len: usize,
        helper_id: u32,
        helper: Helper,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut c_void;
    fn pn_ubpf_compile(vm: *mut c_void, err: *mut c_char, err_len: usize) -> *mut c_void;
    fn pn_ubpf_free(vm: *mut c_void);
}

#[cfg(llvmbpf)]
extern "C" {
    fn pn_llvmbpf_load(
        code: *const u8,
        len: usize,
        helper_id: u32,
        helper: Helper,
        err: *mut c_char,
        err_len: usize,
    ) -> *mut c_void;
    fn pn_llvmbpf_compile(vm: *mut c_void, err: *mut c_char, err_len: usize) -> *mut c_void;
    fn pn_llvmbpf_free(vm: *mut c_void);
}

/// One of the C-ABI engines: its shim's entry points.
#[derive(Clone, Copy)]
struct Shim {
    load: unsafe extern "C" fn(*const u8, usize, u32, Helper, *mut c_char, usize) -> *mut c_void,
    compile: unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void),
}

const UBPF: Shim = Shim {
    load: pn_ubpf_load,
    compile: pn_ubpf_compile,
    free: pn_ubpf_free,
};

#[cfg(llvmbpf)]
const LLVMBPF: Shim = Shim {
    load: pn_llvmbpf_load,
    compile: pn_llvmbpf_compile,
    free: pn_llvmbpf_free,
};

/// A program compiled by a C-ABI engine; freed with it.
struct Native {
    shim: Shim,
    vm: *mut c_void,
    f: Jitted,
}

impl Native {
    /// Load and compile `code` (what the compile-time column times).
    fn new(shim: Shim, code: &[u8]) -> Result<Native, String> {
        let mut err = [0 as c_char; 512];
        let msg = |err: &[c_char; 512]| {
            // SAFETY: the shims write a NUL-terminated string into `err` (snprintf).
            unsafe { CStr::from_ptr(err.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        };
        // SAFETY: `code` is valid for its length (the shims copy it); `err` is writable for
        // its length; `pj_mix` has the helper ABI both engines call (five u64s, one u64).
        let vm = unsafe {
            (shim.load)(
                code.as_ptr(),
                code.len(),
                HELPER_ID,
                pj_mix,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if vm.is_null() {
            return Err(format!("load: {}", msg(&err)));
        }
        // SAFETY: `vm` came from this shim's load and is freed only by `Drop`.
        let f = unsafe { (shim.compile)(vm, err.as_mut_ptr(), err.len()) };
        if f.is_null() {
            // SAFETY: as above; not used after.
            unsafe { (shim.free)(vm) };
            return Err(format!("compile: {}", msg(&err)));
        }
        // SAFETY: both engines' compile returns `uint64_t (*)(void *mem, size_t mem_len)`.
        let f = unsafe { std::mem::transmute::<*mut c_void, Jitted>(f) };
        Ok(Native { shim, vm, f })
    }

    /// Writes the bytes from the entry to the end of its page (a JIT's code pages are
    /// readable; the function may be cut short by the page end or run on past its `ret`
    /// into the next one's), for `objdump -D -b binary -mi386:x86-64`.
    fn dump(&self, path: &std::path::Path) {
        let start = self.f as usize;
        let len = 4096 - start % 4096;
        // SAFETY: `start` is in a mapped, readable page of code this engine just wrote;
        // `len` stops at that page's end.
        let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
        std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    fn run(&self, ctx: &mut [u8]) -> u64 {
        // SAFETY: the code lives as long as `self.vm`; the programs stay inside the context,
        // their stack and `.rodata` (checked by packjit's sandboxed run, made first).
        unsafe { (self.f)(ctx.as_mut_ptr(), ctx.len()) }
    }
}

impl Drop for Native {
    fn drop(&mut self) {
        // SAFETY: `vm` came from this shim's load and is dropped once.
        unsafe { (self.shim.free)(self.vm) }
    }
}

/// One rbpf JIT run with `ctx` as the mbuff (r1 = pointer, r2 = length).
fn rbpf_run(vm: &rbpf::EbpfVmMbuff<'static>, ctx: &mut [u8]) -> u64 {
    // SAFETY: the VM's lifetime parameter is the bytecode's ('static, leaked); the mbuff only
    // has to outlive this call, which is all rbpf uses it for (it keeps no reference).
    unsafe {
        let mbuff: &'static mut [u8] = std::slice::from_raw_parts_mut(ctx.as_mut_ptr(), ctx.len());
        vm.execute_program_jit(&mut [], mbuff).unwrap()
    }
}

fn rbpf_compile(code: &'static [u8]) -> rbpf::EbpfVmMbuff<'static> {
    let mut vm = rbpf::EbpfVmMbuff::new(Some(code)).unwrap();
    vm.register_helper(HELPER_ID, rbpf_mix).unwrap();
    vm.jit_compile().unwrap();
    vm
}

/// The engines, in table order.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Engine {
    Trusted,
    Sandboxed,
    /// packjit's optimizing tier (trusted; `Tier::Optimized`).
    Optimized,
    /// The same code called through its raw entry (`Program::entry`) with a prebuilt
    /// environment, as ubpf's and llvmbpf's code is called: the code alone, without what
    /// `Program::call` adds (the run pin, the environment, the stop check).
    OptimizedRaw,
    Rbpf,
    Ubpf,
    #[cfg(llvmbpf)]
    Llvmbpf,
}

const ENGINES: &[Engine] = &[
    Engine::Trusted,
    Engine::Sandboxed,
    Engine::Optimized,
    Engine::OptimizedRaw,
    Engine::Rbpf,
    Engine::Ubpf,
    #[cfg(llvmbpf)]
    Engine::Llvmbpf,
];

impl Engine {
    fn title(self) -> &'static str {
        match self {
            Engine::Trusted => "packjit trusted",
            Engine::Sandboxed => "packjit sandboxed",
            Engine::Optimized => "packjit optimized",
            Engine::OptimizedRaw => "packjit optimized, raw entry",
            Engine::Rbpf => "rbpf JIT",
            Engine::Ubpf => "ubpf JIT",
            #[cfg(llvmbpf)]
            Engine::Llvmbpf => "llvmbpf",
        }
    }

    /// The engine's name in `PEERS_NATIVE_DUMP` file names.
    fn file_name(self) -> &'static str {
        match self {
            Engine::Ubpf => "ubpf",
            #[cfg(llvmbpf)]
            Engine::Llvmbpf => "llvmbpf",
            _ => "packjit",
        }
    }

    fn index(self) -> usize {
        ENGINES.iter().position(|&e| e == self).unwrap()
    }
}

/// A compiled program, for running.
enum Compiled {
    Packjit(Program),
    /// A trusted program's entry with the environment a run gives it; the program is kept
    /// only to keep the code.
    Raw(#[allow(dead_code)] Program, PjProgramEntry, PjExecEnv),
    Rbpf(rbpf::EbpfVmMbuff<'static>),
    Native(Native),
}

impl Compiled {
    fn run(&self, ctx: &mut [u8]) -> u64 {
        match self {
            Compiled::Packjit(p) => p.call(ctx).unwrap(),
            Compiled::Raw(_, entry, base) => {
                let mut env = PjExecEnv {
                    ctx_start: ctx.as_mut_ptr() as u64,
                    ctx_end: ctx.as_mut_ptr() as u64 + ctx.len() as u64,
                    ctx_len: ctx.len() as u64,
                    ..*base
                };
                // SAFETY: the program (which keeps the code) lives in `self`; a trusted
                // run's environment is what `Program::call` builds: its regions, no budget,
                // the context; the programs stay inside their context, stack and `.rodata`.
                unsafe { entry(ctx.as_mut_ptr(), ctx.len() as u64, &mut env) }
            }
            Compiled::Rbpf(vm) => rbpf_run(vm, ctx),
            Compiled::Native(n) => n.run(ctx),
        }
    }
}

struct Case {
    name: &'static str,
    linked: Linked,
    /// The bytecode, leaked: rbpf's VM borrows it.
    code: &'static [u8],
    opts: LoadOptions,
    ctx: Vec<u8>,
    /// Per engine: the compiled program, when it computes the right result.
    runs: Vec<Option<Compiled>>,
    /// Per engine: whether it compiles the program (timed even when its result is wrong).
    compiles: Vec<bool>,
    batch: usize,
    run_ns: Vec<Vec<f64>>,
    compile_us: Vec<Vec<f64>>,
}

/// Compiles `c` on `e` and drops it; the compile time in ns (freeing is not timed).
fn time_compile(rt: &Runtime, c: &Case, e: Engine) -> f64 {
    let t = Instant::now();
    match e {
        Engine::Trusted => {
            // SAFETY: compiled only, never run.
            let p = unsafe { rt.load_trusted(c.code, &c.opts) }.unwrap();
            let ns = t.elapsed().as_nanos() as f64;
            drop(p);
            ns
        }
        Engine::Sandboxed => {
            let p = rt.load(c.code, &c.opts).unwrap();
            let ns = t.elapsed().as_nanos() as f64;
            drop(p);
            ns
        }
        Engine::Optimized | Engine::OptimizedRaw => {
            // SAFETY: compiled only, never run.
            let p = unsafe { rt.load_trusted(c.code, &optimized(&c.opts)) }.unwrap();
            let ns = t.elapsed().as_nanos() as f64;
            drop(p);
            ns
        }
        Engine::Rbpf => {
            let vm = rbpf_compile(c.code);
            let ns = t.elapsed().as_nanos() as f64;
            drop(black_box(vm));
            ns
        }
        Engine::Ubpf => {
            let n = Native::new(UBPF, c.code).unwrap();
            let ns = t.elapsed().as_nanos() as f64;
            drop(n);
            ns
        }
        #[cfg(llvmbpf)]
        Engine::Llvmbpf => {
            let n = Native::new(LLVMBPF, c.code).unwrap();
            let ns = t.elapsed().as_nanos() as f64;
            drop(n);
            ns
        }
    }
}

/// ns per run of `f` over `n` runs.
fn time_runs(n: usize, mut f: impl FnMut() -> u64) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// A ratio with two decimals, or two significant digits below 0.1 (compile-time ratios
/// against llvmbpf are in the ten-thousandths).
fn ratio(x: f64) -> String {
    let decimals = (1 - x.log10().floor() as i32).max(2) as usize;
    format!("{x:.decimals$}")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

fn machine_note(quick: bool, rounds: usize, compiles: usize) {
    let sh = |cmd: &str| {
        std::process::Command::new("sh")
            .args(["-c", cmd])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    println!(
        "command: scripts/peers-native.sh UBPF_SRC LLVMBPF_SRC{}",
        if quick { " --quick" } else { "" }
    );
    println!(
        "machine: {} · {} · {} cores · load average {}",
        sh("uname -m"),
        sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        sh("nproc"),
        sh("cut -d' ' -f1-3 /proc/loadavg")
    );
    println!(
        "sources: ubpf {} · llvmbpf {} · LLVM {} · clang {}",
        env!("PN_UBPF_REV"),
        env!("PN_LLVMBPF_REV"),
        env!("PN_LLVM_VERSION"),
        sh(&format!("{} --version | head -1", peers::clang()))
    );
    println!(
        "rounds: {rounds} · compiles per program per round: {compiles} (llvmbpf: {})",
        (compiles / 10).max(5)
    );
}

/// packjit's columns in the ratio tables.
const OURS: [Engine; 4] = [
    Engine::Trusted,
    Engine::Sandboxed,
    Engine::Optimized,
    Engine::OptimizedRaw,
];

/// A trusted program run through its raw entry, with the environment `Program::call`
/// would build (its regions; trusted: no budget).
fn raw(p: Program) -> Compiled {
    let entry = p.entry().expect("native code");
    let env = PjExecEnv {
        regions: p.regions().as_ptr() as u64,
        region_count: p.regions().len() as u64,
        budget: u64::MAX,
        ..Default::default()
    };
    Compiled::Raw(p, entry, env)
}

/// `opts` asking for the optimizing tier.
fn optimized(opts: &LoadOptions) -> LoadOptions {
    LoadOptions {
        tier: Tier::Optimized,
        ..opts.clone()
    }
}

/// Compiles timed per program and round: llvmbpf takes milliseconds a compile, so it gets a
/// tenth as many.
fn compiles_for(e: Engine, compiles: usize) -> usize {
    match e {
        #[cfg(llvmbpf)]
        Engine::Llvmbpf => (compiles / 10).max(5),
        _ => compiles,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 1 } else { 7 };
    let compiles = if quick { 20 } else { 200 };
    const BATCH_NS: f64 = 2e6;
    machine_note(quick, rounds, compiles);

    let rt = Runtime::new().unwrap();
    rt.register_helper(HELPER_ID, "pj_mix", pj_mix).unwrap();
    let v3 = compile_object("peers", "-mcpu=v3");
    let v4 = compile_object("peers_v4", "-mcpu=v4");

    let mut cases: Vec<Case> = Vec::new();
    let mut differ: Vec<String> = Vec::new();
    let mut unexplained: Vec<String> = Vec::new();
    for &(name, obj) in peers::PROGRAMS {
        let bytes = if obj == "peers" { &v3 } else { &v4 };
        let linked = link(
            bytes,
            &ElfLoadOptions::section(&format!("peers/{name}")),
            &|n| (n == "pj_mix").then_some(HELPER_ID),
        )
        .unwrap_or_else(|e| panic!("link {name}: {e}"));
        let code: &'static [u8] = Box::leak(linked.code.clone().into_boxed_slice());
        let opts = LoadOptions {
            regions: linked.data.regions(),
            name: Some(name.into()),
            ..LoadOptions::default()
        };
        let mut ctx = input(name);
        let sandboxed = rt
            .load(code, &opts)
            .unwrap_or_else(|e| panic!("packjit sandboxed {name}: {e}"));
        let want = sandboxed.call(&mut ctx).unwrap();
        let mut runs = Vec::new();
        let mut compiles = Vec::new();
        for &e in ENGINES {
            let compiled: Result<Compiled, String> = match e {
                // SAFETY: the programs only touch their context, stack and `.rodata` (the
                // regions); the sandboxed copy, run above, would have stopped otherwise.
                Engine::Trusted => Ok(Compiled::Packjit(
                    unsafe { rt.load_trusted(code, &opts) }
                        .unwrap_or_else(|e| panic!("packjit trusted {name}: {e}")),
                )),
                Engine::Sandboxed => Ok(Compiled::Packjit(rt.load(code, &opts).unwrap())),
                // SAFETY: as for the trusted load.
                Engine::Optimized => Ok(Compiled::Packjit(
                    unsafe { rt.load_trusted(code, &optimized(&opts)) }
                        .unwrap_or_else(|e| panic!("packjit optimized {name}: {e}")),
                )),
                // SAFETY: as for the trusted load.
                Engine::OptimizedRaw => {
                    Ok(raw(unsafe { rt.load_trusted(code, &optimized(&opts)) }
                        .unwrap_or_else(|e| {
                            panic!("packjit optimized {name}: {e}")
                        })))
                }
                Engine::Rbpf => Ok(Compiled::Rbpf(rbpf_compile(code))),
                Engine::Ubpf => Native::new(UBPF, code).map(Compiled::Native),
                #[cfg(llvmbpf)]
                Engine::Llvmbpf => Native::new(LLVMBPF, code).map(Compiled::Native),
            };
            let known = peers::known(name, e.title());
            let compiled = match (compiled, known) {
                (Ok(c), Some(Known::Refuses(_))) => {
                    drop(c);
                    panic!("{} now compiles {name}: time it", e.title())
                }
                (Ok(c), _) => c,
                (Err(err), Some(Known::Refuses(why))) => {
                    differ.push(format!("{} refuses {name} ({err}): {why}", e.title()));
                    runs.push(None);
                    compiles.push(false);
                    continue;
                }
                (Err(err), _) => panic!("{} {name}: {err}", e.title()),
            };
            compiles.push(true);
            if let (Compiled::Native(n), Some(dir)) =
                (&compiled, std::env::var_os("PEERS_NATIVE_DUMP"))
            {
                n.dump(&std::path::Path::new(&dir).join(format!("{}-{name}.bin", e.file_name())));
            }
            let got = compiled.run(&mut ctx);
            match known {
                None if got == want => runs.push(Some(compiled)),
                Some(Known::Wrong(why)) if got != want => {
                    differ.push(format!("{} runs {name} wrong: {why}", e.title()));
                    runs.push(None);
                }
                Some(_) => panic!("{} now runs {name} right: time it", e.title()),
                None => {
                    unexplained.push(format!(
                        "{} on {name}: returned {got:#x}, packjit {want:#x}",
                        e.title()
                    ));
                    runs.push(None);
                }
            }
        }
        let per_run = time_runs(200, || sandboxed.call(&mut ctx).unwrap());
        let batch = ((BATCH_NS / per_run.max(1.0)) as usize).clamp(10, 1_000_000);
        cases.push(Case {
            name,
            linked,
            code,
            opts,
            ctx,
            runs,
            compiles,
            batch,
            run_ns: vec![Vec::new(); ENGINES.len()],
            compile_us: vec![Vec::new(); ENGINES.len()],
        });
    }
    assert!(
        unexplained.is_empty(),
        "results differ from packjit's, and peers.rs does not say why:\n  {}",
        unexplained.join("\n  ")
    );
    println!("results agree with packjit sandboxed, except (\"—\" in the tables):");
    for w in &differ {
        println!("  {w}");
    }

    let n_eng = ENGINES.len();
    for round in 0..rounds {
        for k in 0..cases.len() {
            let n = cases.len();
            let c = &mut cases[(k + round) % n];
            for j in 0..n_eng {
                let e = (j + round) % n_eng;
                let Some(compiled) = &c.runs[e] else { continue };
                let ctx = &mut c.ctx;
                let ns = time_runs(c.batch, || compiled.run(ctx));
                c.run_ns[e].push(ns);
            }
            for j in 0..n_eng {
                let e = ENGINES[(j + round) % n_eng];
                // The raw entry's compile is the optimized one's, timed there.
                if !c.compiles[e.index()] || e == Engine::OptimizedRaw {
                    continue;
                }
                let samples: Vec<f64> = (0..compiles_for(e, compiles))
                    .map(|_| time_compile(&rt, c, e))
                    .collect();
                c.compile_us[e.index()].push(median(samples) / 1e3);
            }
        }
    }

    let cols: Vec<String> = ENGINES.iter().map(|e| e.title().to_string()).collect();
    // Ratios: packjit trusted, sandboxed and optimized over each peer.
    let peers: Vec<Engine> = ENGINES
        .iter()
        .copied()
        .filter(|e| {
            !matches!(
                e,
                Engine::Trusted | Engine::Sandboxed | Engine::Optimized | Engine::OptimizedRaw
            )
        })
        .rev()
        .collect();
    let table = |title: &str, data: &dyn Fn(&Case, usize) -> Option<f64>, prec: usize| {
        println!("\n{title}\n");
        let mut head = format!("| program | insns | {} |", cols.join(" | "));
        let mut rule = "|---|---|".to_string() + &"---|".repeat(n_eng);
        for p in &peers {
            for who in ["tr", "sbx", "opt", "opt raw"] {
                head += &format!(" {who} ÷ {} |", p.title());
                rule += "---|";
            }
        }
        println!("{head}\n{rule}");
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); peers.len() * OURS.len()];
        for c in &cases {
            let v: Vec<Option<f64>> = (0..n_eng).map(|e| data(c, e)).collect();
            let mut row = format!("| {} | {} |", c.name, c.linked.code.len() / 8);
            for x in &v {
                row += &match x {
                    Some(x) => format!(" {x:.prec$} |"),
                    None => " — |".into(),
                };
            }
            for (i, p) in peers.iter().enumerate() {
                for (j, ours) in OURS.iter().enumerate() {
                    row += &match (v[ours.index()], v[p.index()]) {
                        (Some(a), Some(b)) => {
                            ratios[i * OURS.len() + j].push(a / b);
                            format!(" {} |", ratio(a / b))
                        }
                        _ => " — |".into(),
                    };
                }
            }
            println!("{row}");
        }
        let mut row = "| geometric mean | |".to_string() + &" |".repeat(n_eng);
        for r in &ratios {
            row += &if r.is_empty() {
                " — |".to_string()
            } else {
                format!(" {} |", ratio(geomean(r)))
            };
        }
        println!("{row}");
    };
    table(
        &format!("run time, ns per run (median of {rounds} rounds)"),
        &|c, e| (!c.run_ns[e].is_empty()).then(|| median(c.run_ns[e].clone())),
        1,
    );
    table(
        "compile time, µs per program (median of the compiles of a round, median over rounds)",
        &|c, e| (!c.compile_us[e].is_empty()).then(|| median(c.compile_us[e].clone())),
        2,
    );
}
