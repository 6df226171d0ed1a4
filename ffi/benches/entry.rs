//! What a run costs over calling the program's native entry directly (issue 43, item 2), in
//! one process, side by side, for three short programs (`mov r0, 1; exit`, a 10-instruction
//! one, and a lookup of a constant key in an array map, which compiles to a load of the
//! element: a program that names a map), each loaded trusted and sandboxed (the default
//! budget counted):
//!
//! * `raw entry`: the entry called as a function pointer with the arguments the runtime
//!   passes (context pointer and length, a prebuilt `PjExecEnv` filled as a run fills it);
//! * `Program::call` from Rust;
//! * `Hook::run` from Rust (the same program attached to a hook);
//! * `packjit_program_run` and `packjit_hook_run` through the C API (this crate's source
//!   compiled in, called as a C host calls it).
//!
//! Each case runs `CALLS` times per sample; every case runs once per round in a rotating
//! order so that the machine's drift hits every case alike; figures are medians of
//! `ROUNDS` rounds, ns per call, and the difference over the raw entry of the same program.
//!
//! `cargo bench -p packjit-ffi --bench entry` (x86-64 hosts; elsewhere it says so).
//! `ENTRY_CASE=<part of a case's name>` and `ENTRY_WAY=<part of a way's name>` keep only
//! those (e.g. to count one way's instructions with `perf stat`).

// The C API compiled into this bench, called exactly as a C host would call it (the ffi
// crate builds no rlib; see tests/c_api.rs).
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("entry bench: x86-64 hosts only (the figures are the native backend's)");
}

#[cfg(target_arch = "x86_64")]
fn main() {
    x86::main()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::packjit::*;
    use packjit_runtime::maps::{Map, MapSpec, MapType};
    use packjit_runtime::{Hook, LoadOptions, Program, Runtime, DEFAULT_BUDGET};
    use std::ffi::CStr;
    use std::hint::black_box;
    use std::ptr::{null, null_mut};
    use std::sync::Arc;
    use std::time::Instant;

    /// Calls per sample.
    const CALLS: usize = 2_000_000;
    /// Rounds; figures are medians over them.
    const ROUNDS: usize = 15;
    /// Bytes of context every run gets.
    const CTX_LEN: usize = 16;

    fn last_error() -> String {
        // SAFETY: never NULL, NUL-terminated.
        unsafe { CStr::from_ptr(packjit_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(st: i32, what: &str) {
        assert_eq!(st, PJ_OK, "{what}: {}", last_error());
    }

    fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
        let o = off.to_le_bytes();
        let i = imm.to_le_bytes();
        [op, src << 4 | dst, o[0], o[1], i[0], i[1], i[2], i[3]]
    }

    /// `mov r0, 1; exit`.
    fn tiny() -> Vec<u8> {
        [insn(0xb7, 0, 0, 0, 1), insn(0x95, 0, 0, 0, 0)].concat()
    }

    /// Ten instructions that read the context (sandboxed: checked loads) and compute:
    /// `r2 = *(u32 *)(r1 + 0); r3 = *(u32 *)(r1 + 4); r0 = r2; r0 += r3; r0 *= 3;
    /// r0 ^= 5; r0 += 7; r0 &= 0xff; r0 -= 1; exit`. With a zeroed context it returns
    /// ((0 * 3) ^ 5) + 7 & 0xff - 1 = 11.
    fn ten() -> Vec<u8> {
        [
            insn(0x61, 2, 1, 0, 0),
            insn(0x61, 3, 1, 4, 0),
            insn(0xbf, 0, 2, 0, 0),
            insn(0x0f, 0, 3, 0, 0),
            insn(0x27, 0, 0, 0, 3),
            insn(0xa7, 0, 0, 0, 5),
            insn(0x07, 0, 0, 0, 7),
            insn(0x57, 0, 0, 0, 0xff),
            insn(0x17, 0, 0, 0, 1),
            insn(0x95, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// `v = lookup(map 0, &0); return v ? *v : 0` over a one-element array of u64 holding
    /// `ARRAY_VALUE`: the constant key folds to the element's address, so the code needs no
    /// helper and no env, and the raw entry can run it too.
    fn array_lookup() -> Vec<u8> {
        [
            insn(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0
            insn(0x18, 1, 1, 0, 0),   // r1 = map 0
            insn(0, 0, 0, 0, 0),
            insn(0xbf, 2, 10, 0, 0),
            insn(0x07, 2, 0, 0, -4),
            insn(0x85, 0, 0, 0, 1), // r0 = bpf_map_lookup_elem(r1, r2)
            insn(0x15, 0, 0, 1, 0), // if r0 == 0 goto exit
            insn(0x79, 0, 0, 0, 0), // r0 = *(u64 *)(r0 + 0)
            insn(0x95, 0, 0, 0, 0),
        ]
        .concat()
    }

    const ARRAY_VALUE: u64 = 5;

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    /// One program, loaded four ways: Rust (for the raw entry, `Program::call`, a hook) and
    /// C (for `packjit_program_run`, a C hook), trusted or sandboxed.
    struct Case {
        name: &'static str,
        want: u64,
        prog: Program,
        hook: Hook,
        raw: PjProgramEntry,
        env: PjExecEnv,
        cprog: *mut PackjitProgram,
        chook: *mut PackjitHook,
    }

    fn load_rust(rt: &Runtime, code: &[u8], trusted: bool, maps: &[Arc<Map>]) -> Program {
        let opts = LoadOptions {
            maps: maps.to_vec(),
            ..Default::default()
        };
        if trusted {
            // SAFETY: the programs only read their 16-byte context.
            unsafe { rt.load_trusted(code, &opts) }.unwrap()
        } else {
            rt.load(code, &opts).unwrap()
        }
    }

    /// C load options: trusted or not, with the maps `cmaps` (live handles).
    fn c_opts(trusted: bool, cmaps: &[*const PackjitMap]) -> PackjitLoadOptions {
        let mut opts = PackjitLoadOptions::default();
        // SAFETY: valid out pointer.
        check(unsafe { packjit_load_options_init(&mut opts) }, "options");
        if trusted {
            opts.flags = PACKJIT_LOAD_TRUSTED;
        }
        if !cmaps.is_empty() {
            opts.maps = cmaps.as_ptr();
            opts.map_count = cmaps.len() as u64;
        }
        opts
    }

    fn load_c(
        crt: *mut PackjitRuntime,
        code: &[u8],
        trusted: bool,
        cmaps: &[*const PackjitMap],
    ) -> *mut PackjitProgram {
        let opts = c_opts(trusted, cmaps);
        let mut p = null_mut();
        // SAFETY: live runtime, borrowed code and options, valid out pointer.
        check(
            unsafe { packjit_program_load(crt, code.as_ptr(), code.len(), &opts, &mut p) },
            "packjit_program_load",
        );
        p
    }

    /// ns per call of `f`, run `CALLS` times. Out of line, one copy per way: each way's loop
    /// is compiled on its own, as a host's caller would be, instead of sharing `main`'s
    /// registers and stack slots with the others (which moved the figures by ±0.7 ns
    /// from one build to the next with the run path unchanged).
    #[inline(never)]
    fn time(mut f: impl FnMut()) -> f64 {
        let t = Instant::now();
        for _ in 0..CALLS {
            f();
        }
        t.elapsed().as_nanos() as f64 / CALLS as f64
    }

    pub fn main() {
        let rt = Runtime::new().unwrap();
        rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
            .unwrap();
        let mut crt = null_mut();
        // SAFETY: NULL config; valid out pointer.
        check(
            unsafe { packjit_runtime_create(null(), &mut crt) },
            "packjit_runtime_create",
        );
        // The host plugin's cdylib sits in deps/ next to this bench binary (a dev-dependency).
        let exe = std::env::current_exe().unwrap();
        let dir =
            std::ffi::CString::new(exe.parent().unwrap().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: live runtime; NUL-terminated path; NULL info.
        check(
            unsafe { packjit_load_host_plugin(crt, dir.as_ptr(), null_mut()) },
            "packjit_load_host_plugin",
        );

        // The array map, once for Rust and once through the C API.
        let key = 0u32.to_le_bytes();
        let value = ARRAY_VALUE.to_le_bytes();
        let map = Map::new(MapSpec {
            name: "one".into(),
            map_type: MapType::Array,
            key_size: 4,
            value_size: 8,
            max_entries: 1,
            flags: 0,
        })
        .unwrap();
        map.update(&key, &value, 0).unwrap();
        let mut cmap = null_mut();
        // SAFETY: NUL-terminated name; valid out pointer; then a live map, key and value of
        // their sizes.
        unsafe {
            check(
                packjit_map_create(
                    PACKJIT_MAP_TYPE_ARRAY,
                    4,
                    8,
                    1,
                    0,
                    c"one".as_ptr(),
                    &mut cmap,
                ),
                "packjit_map_create",
            );
            let st = packjit_map_update(cmap, key.as_ptr().cast(), 4, value.as_ptr().cast(), 8, 0);
            assert_eq!(st, 0, "packjit_map_update: {}", last_error());
        }
        let cmaps = [cmap.cast_const()];

        let progs: [(&str, Vec<u8>, u64, bool); 3] = [
            ("mov r0, 1; exit", tiny(), 1, false),
            ("10 insns", ten(), 11, false),
            ("array lookup", array_lookup(), ARRAY_VALUE, true),
        ];
        let mut cases = Vec::new();
        for (name, code, want, with_map) in &progs {
            let (maps, cmaps): (&[Arc<Map>], &[*const PackjitMap]) = if *with_map {
                (std::slice::from_ref(&map), &cmaps)
            } else {
                (&[], &[])
            };
            for trusted in [true, false] {
                let prog = load_rust(&rt, code, trusted, maps);
                let raw = prog.entry().unwrap();
                let env = PjExecEnv {
                    regions: prog.regions().as_ptr() as u64,
                    region_count: prog.regions().len() as u64,
                    budget: if trusted { u64::MAX } else { DEFAULT_BUDGET },
                    ..Default::default()
                };
                let hook = Hook::new();
                hook.attach(load_rust(&rt, code, trusted, maps)).unwrap();
                let cprog = load_c(crt, code, trusted, cmaps);
                let mut chook = null_mut();
                // SAFETY: live runtime; valid out pointer.
                check(
                    unsafe { packjit_hook_create(crt, &mut chook) },
                    "packjit_hook_create",
                );
                let mut batch = null_mut();
                // SAFETY: valid out pointer; live batch, hook; code borrowed; options as
                // for the load above.
                unsafe {
                    check(packjit_hook_batch_create(&mut batch), "batch");
                    let opts = c_opts(trusted, cmaps);
                    check(
                        packjit_hook_batch_load_attach(
                            batch,
                            chook,
                            code.as_ptr(),
                            code.len(),
                            &opts,
                        ),
                        "batch load_attach",
                    );
                    check(packjit_hook_batch_apply(batch, null_mut()), "batch apply");
                }
                cases.push(Case {
                    name: if trusted {
                        leak(format!("{name}, trusted"))
                    } else {
                        leak(format!("{name}, sandboxed"))
                    },
                    want: *want,
                    prog,
                    hook,
                    raw,
                    env,
                    cprog,
                    chook,
                });
            }
        }

        const WAYS: [&str; 5] = [
            "raw entry",
            "Program::call",
            "Hook::run",
            "packjit_program_run",
            "packjit_hook_run",
        ];
        // For counting with `perf stat`: `ENTRY_CASE` / `ENTRY_WAY` keep only the cases and
        // ways whose names contain them (each way still reports its own figure).
        let only = |var: &str, name: &str| std::env::var(var).map_or(true, |s| name.contains(&s));
        let mut ctx = [0u8; CTX_LEN];
        for c in cases.iter_mut().filter(|c| only("ENTRY_CASE", c.name)) {
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); WAYS.len()];
            for round in 0..ROUNDS {
                for k in 0..WAYS.len() {
                    let way = (k + round) % WAYS.len();
                    if !only("ENTRY_WAY", WAYS[way]) {
                        samples[way].push(f64::NAN);
                        continue;
                    }
                    let ns = run_way(c, way, &mut ctx);
                    samples[way].push(ns);
                }
            }
            let med: Vec<f64> = samples.into_iter().map(median).collect();
            println!("{} (median of {ROUNDS} rounds of {CALLS} calls):", c.name);
            println!("  {:<22} {:>8} {:>10}", "way", "ns/call", "over raw");
            for (k, w) in WAYS.iter().enumerate() {
                println!("  {:<22} {:>8.2} {:>+10.2}", w, med[k], med[k] - med[0]);
            }
        }
        for c in cases {
            // SAFETY: live handles, not used after this.
            unsafe {
                packjit_hook_destroy(c.chook);
                packjit_program_free(c.cprog);
            }
        }
        // SAFETY: live map and runtime, not used after this.
        unsafe {
            packjit_map_free(cmap);
            packjit_runtime_destroy(crt)
        };
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    fn run_way(c: &mut Case, way: usize, ctx: &mut [u8; CTX_LEN]) -> f64 {
        let want = c.want;
        let p = ctx.as_mut_ptr();
        match way {
            0 => {
                let f = c.raw;
                c.env.ctx_start = p as u64;
                c.env.ctx_end = p as u64 + CTX_LEN as u64;
                c.env.ctx_len = CTX_LEN as u64;
                let env: *mut PjExecEnv = &mut c.env;
                time(|| {
                    // SAFETY: live code (the program is alive and its entry pinned); the
                    // context is CTX_LEN writable bytes; `env` is filled as a run fills it.
                    let r = unsafe { black_box(f)(black_box(p), CTX_LEN as u64, black_box(env)) };
                    assert_eq!(r, want);
                })
            }
            1 => time(|| {
                assert_eq!(c.prog.call(black_box(&mut ctx[..])), Ok(want));
            }),
            2 => time(|| {
                assert_eq!(c.hook.run(black_box(&mut ctx[..])), Some(Ok(want)));
            }),
            3 => {
                let prog = c.cprog;
                time(|| {
                    let mut r0 = 0;
                    // SAFETY: live program; ctx is CTX_LEN writable bytes.
                    let st =
                        unsafe { packjit_program_run(black_box(prog), p.cast(), CTX_LEN, &mut r0) };
                    assert!(st == PJ_OK && r0 == want);
                })
            }
            _ => {
                let hook = c.chook;
                time(|| {
                    let mut r0 = 0;
                    // SAFETY: live hook; ctx is CTX_LEN writable bytes.
                    let st =
                        unsafe { packjit_hook_run(black_box(hook), p.cast(), CTX_LEN, &mut r0) };
                    assert!(st == PJ_OK && r0 == want);
                })
            }
        }
    }
}
