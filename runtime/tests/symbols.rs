//! Symbols: the address → program index and the perf map, checked against the programs'
//! real addresses and sizes as programs come and go (native x86-64 host, stub backend).
#![cfg(target_arch = "x86_64")]

use packjit::{LoadOptions, Runtime};
use std::sync::Arc;

#[path = "../benches/common/x86_stub.rs"]
mod x86_stub;

fn runtime() -> Runtime {
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(x86_stub::X86Stub)).unwrap();
    rt
}

#[test]
fn symbolize_names_the_ebpf_pc_from_the_line_table() {
    let rt = Runtime::new().unwrap();
    rt.add_backend(Arc::new(packjit_x86_64::X86Backend::new()))
        .unwrap();
    // mov r0, 1 ; lddw r2, big ; add r0, r2 ; mul r0, 3 ; exit
    let code = [
        0xb7, 0, 0, 0, 1, 0, 0, 0, //
        0x18, 2, 0, 0, 0x44, 0x33, 0x22, 0x11, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, //
        0x0f, 0x20, 0, 0, 0, 0, 0, 0, //
        0x27, 0, 0, 0, 3, 0, 0, 0, //
        0x95, 0, 0, 0, 0, 0, 0, 0,
    ];
    let p = rt
        .load(
            &code,
            &LoadOptions {
                name: Some("with_lines".into()),
                ..Default::default()
            },
        )
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for off in 0..p.code_size() as u64 {
        let addr = p.entry_addr() + off;
        let s = rt.symbolize(addr).unwrap();
        assert_eq!(&*s.name, "with_lines");
        assert_eq!(s.pc, p.pc_at(addr), "offset {off}");
        seen.extend(s.pc);
    }
    // With a line table every instruction with code of its own is named somewhere (pc 2 is
    // lddw's 2nd slot); backends that return none leave the pc unknown everywhere.
    // (The entry's prologue precedes pc 0's code, so "has a line table" is asked of the
    // table itself, not of the entry address.)
    if p.pc_offsets().is_empty() {
        assert!(seen.is_empty());
    } else {
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 1, 3, 4, 5]);
    }
}

fn drain(rt: &Runtime) {
    for _ in 0..2000 {
        packjit::arena::epoch_pin().flush();
        if rt.reclaim() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// (start, size, name) of each program, as the perf map should list them, sorted.
fn expect(progs: &[packjit::Program]) -> Vec<(u64, u64, String)> {
    let mut v: Vec<_> = progs
        .iter()
        .map(|p| (p.entry_addr(), p.code_size() as u64, p.name().to_string()))
        .collect();
    v.sort();
    v
}

/// (start, size, name) per perf-map line, read as perf reads them (hex, one separator, the
/// rest of the line is the name), sorted: the map's line order means nothing.
fn perf_map(path: &std::path::Path) -> Vec<(u64, u64, String)> {
    let mut lines: Vec<_> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let s = u64::from_str_radix(it.next().unwrap(), 16).unwrap();
            let n = u64::from_str_radix(it.next().unwrap(), 16).unwrap();
            (s, n, it.next().unwrap().to_string())
        })
        .collect();
    lines.sort();
    lines
}

/// Frees `progs`, waits for their reclamation and checks that the map at `path` lists
/// nothing any more; removes the file.
fn free_all_and_check_empty(rt: &Runtime, progs: Vec<packjit::Program>, path: &std::path::Path) {
    drop(progs);
    drain(rt);
    assert_eq!(perf_map(path), vec![], "every program freed, none listed");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn names_lookup_and_perf_map_follow_loads_and_frees() {
    let rt = runtime();
    let path = std::env::temp_dir().join(format!("packjit-test-perf-{}.map", std::process::id()));
    rt.enable_perf_map_at(&path).unwrap();
    assert_eq!(perf_map(&path), vec![], "empty runtime, empty map");

    let mut progs: Vec<_> = (0..40)
        .map(|i| {
            let name = (i % 2 == 0).then(|| format!("named_{i}"));
            rt.load(
                &x86_stub::ret_prog(i, 2 + i as usize * 7),
                &LoadOptions {
                    name,
                    ..Default::default()
                },
            )
            .unwrap()
        })
        .collect();
    for (i, p) in progs.iter().enumerate() {
        let want = if i % 2 == 0 {
            format!("named_{i}")
        } else {
            format!("prog_{}", p.id())
        };
        assert_eq!(p.name(), want);
        // Every byte of the code resolves to its program; the byte after it does not (the
        // rest of its last chunk is trap padding, no program's code).
        for off in [0, p.code_size() as u64 / 2, p.code_size() as u64 - 1] {
            let s = rt
                .symbolize(p.entry_addr() + off)
                .expect("inside a program");
            assert_eq!((s.id, s.start, s.offset), (p.id(), p.entry_addr(), off));
            assert_eq!(&*s.name, p.name());
            assert_eq!(s.pc, None, "the stub backend returns no line table");
        }
        if p.code_size() as u64 % 64 != 0 {
            assert_eq!(rt.symbolize(p.entry_addr() + p.code_size() as u64), None);
        }
    }
    assert_eq!(rt.symbolize(0), None);

    assert_eq!(perf_map(&path), expect(&progs), "every load is listed");

    // Free every third program: after reclamation the map lists none of them.
    let mut i = 0;
    progs.retain(|_| {
        i += 1;
        i % 3 != 0
    });
    drain(&rt);
    assert_eq!(perf_map(&path), expect(&progs), "freed programs are gone");
    assert_eq!(rt.live_programs(), progs.len());
    assert_eq!(rt.symbols().len(), progs.len());

    // Loads after frees may reuse the freed addresses: still one line per live program.
    progs.extend((0..10).map(|i| {
        rt.load(&x86_stub::ret_prog(i, 3), &LoadOptions::default())
            .unwrap()
    }));
    assert_eq!(perf_map(&path), expect(&progs));
    assert_eq!(rt.write_perf_map().unwrap(), Some(path.clone()));
    free_all_and_check_empty(&rt, progs, &path);
}

#[test]
fn a_perf_map_enabled_after_loads_lists_them_and_follows_frees() {
    let rt = runtime();
    let mut progs: Vec<_> = (0..12)
        .map(|i| {
            rt.load(
                &x86_stub::ret_prog(i, 2 + i as usize),
                &LoadOptions::default(),
            )
            .unwrap()
        })
        .collect();
    let path = std::env::temp_dir().join(format!("packjit-test-late-{}.map", std::process::id()));
    rt.enable_perf_map_at(&path).unwrap();
    assert_eq!(
        perf_map(&path),
        expect(&progs),
        "programs loaded before are listed"
    );
    // Frees after loads after enabling: lines listed at enabling and at loads both move.
    progs.truncate(5);
    progs.push(
        rt.load(&x86_stub::ret_prog(99, 7), &LoadOptions::default())
            .unwrap(),
    );
    drain(&rt);
    progs.remove(0);
    drain(&rt);
    assert_eq!(perf_map(&path), expect(&progs));
    free_all_and_check_empty(&rt, progs, &path);
}

#[test]
fn the_perf_map_follows_long_names_and_large_batches() {
    let rt = runtime();
    let path = std::env::temp_dir().join(format!("packjit-test-batch-{}.map", std::process::id()));
    rt.enable_perf_map_at(&path).unwrap();
    let load = |i: usize, name: Option<String>| {
        rt.load(
            &x86_stub::ret_prog(i as i32, 2 + i % 9),
            &LoadOptions {
                name,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let mut progs: Vec<_> = (0..400).map(|i| load(i, None)).collect();
    // Names too long for the lines so far, then one longer than a line can hold (cut to fit,
    // as perf sees it, so the listing is compared by prefix below).
    progs.push(load(400, Some("n".repeat(100))));
    progs.push(load(401, Some(format!("π{}", "x".repeat(5000)))));
    progs.push(load(402, None));
    let cut_to_listing = |mut v: Vec<(u64, u64, String)>| {
        for (_, _, name) in &mut v {
            if name.len() > 1000 {
                // A 2-byte character, then as many bytes as the widest line (256) leaves.
                name.truncate(256 - (16 + 1 + 2 + 1 + 1));
            }
        }
        v
    };
    assert_eq!(perf_map(&path), cut_to_listing(expect(&progs)));

    // A batch that frees most programs (one rewrite), then single frees (in place).
    let mut i = 0;
    progs.retain(|_| {
        i += 1;
        i % 4 == 0 || i > 400
    });
    drain(&rt);
    assert_eq!(perf_map(&path), cut_to_listing(expect(&progs)));
    for k in [0, 50, 7, 90] {
        progs.remove(k);
        drain(&rt);
        assert_eq!(
            perf_map(&path),
            cut_to_listing(expect(&progs)),
            "after free {k}"
        );
    }
    // Rewriting on request narrows the lines again once the long names are gone.
    progs.retain(|p| p.name().len() < 50);
    drain(&rt);
    rt.write_perf_map().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().all(|l| l.len() + 1 == 64), "64-byte lines");
    assert_eq!(perf_map(&path), expect(&progs));
    free_all_and_check_empty(&rt, progs, &path);
}

#[test]
fn a_perf_map_path_has_one_keeper_in_the_process() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("packjit-test-keeper-{}.map", std::process::id()));
    let other = dir.join(format!("packjit-test-keeper2-{}.map", std::process::id()));
    let (a, b) = (runtime(), runtime());
    let pa = a
        .load(&x86_stub::ret_prog(1, 3), &LoadOptions::default())
        .unwrap();
    a.enable_perf_map_at(&path).unwrap();
    a.enable_perf_map_at(&path).unwrap(); // the same runtime again: rewritten
    let e = b.enable_perf_map_at(&path).unwrap_err();
    assert_eq!(e.kind, packjit::ErrorKind::InvalidArgument);
    assert!(
        e.message.contains(&*path.to_string_lossy()) && e.message.contains("another runtime"),
        "{e}"
    );
    // Spelled differently, still the same file.
    let dotted = dir.join(".").join(path.file_name().unwrap());
    assert!(b.enable_perf_map_at(&dotted).is_err());
    assert_eq!(perf_map(&path), expect(std::slice::from_ref(&pa)));
    // `a` moves to another path: the first is free for `b`, which lists its own programs.
    a.enable_perf_map_at(&other).unwrap();
    b.enable_perf_map_at(&path).unwrap();
    let pb = b
        .load(&x86_stub::ret_prog(2, 4), &LoadOptions::default())
        .unwrap();
    assert_eq!(perf_map(&path), expect(std::slice::from_ref(&pb)));
    assert_eq!(perf_map(&other), expect(std::slice::from_ref(&pa)));
    free_all_and_check_empty(&a, vec![pa], &other);
    free_all_and_check_empty(&b, vec![pb], &path);
}

#[test]
fn the_perf_map_stays_exact_under_threads_loading_and_freeing() {
    let rt = Arc::new(runtime());
    let path =
        std::env::temp_dir().join(format!("packjit-test-threads-{}.map", std::process::id()));
    rt.enable_perf_map_at(&path).unwrap();
    // Each thread loads, keeps some, frees others (single frees and its own reclaims), with
    // names of several widths so that lines widen while others move.
    let kept: Vec<Vec<packjit::Program>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let rt = rt.clone();
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..300usize {
                        let name = (i % 50 == 7).then(|| format!("t{t}_{}", "w".repeat(i / 3)));
                        let p = rt
                            .load(
                                &x86_stub::ret_prog(i as i32, 2 + i % 5),
                                &LoadOptions {
                                    name,
                                    ..Default::default()
                                },
                            )
                            .unwrap();
                        mine.push(p);
                        if i % 3 == 2 {
                            mine.swap_remove((i * 7) % mine.len());
                        }
                        if i % 40 == 0 {
                            rt.reclaim();
                        }
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    drain(&rt);
    let live: Vec<packjit::Program> = kept.into_iter().flatten().collect();
    assert_eq!(live.len(), 4 * 200);
    assert_eq!(perf_map(&path), expect(&live));
    free_all_and_check_empty(&rt, live, &path);
}
