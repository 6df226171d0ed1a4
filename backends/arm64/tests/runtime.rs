//! End to end through the packjit runtime on arm64 (qemu-aarch64 in the cross runs): the
//! backend as a static rlib and as the dlopen'ed cdylib plugin, code in the shared packed
//! arena, helpers registered by id, features forced on and off.
#![cfg(target_arch = "aarch64")]

mod common;

use common::*;
use packjit::{LoadOptions, Runtime};
use packjit_arm64::{Arm64Backend, FEATURE_LSE};
use packjit_plugin_api::{Arch, ErrorKind};
use std::sync::Arc;

unsafe extern "C" fn add5(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a + b + c + d + e
}

fn runtime() -> Runtime {
    let rt = Runtime::new().expect("runtime");
    rt.add_backend(Arc::new(Arm64Backend::new()))
        .expect("backend");
    rt.register_helper(7, "add5", add5).expect("helper");
    rt
}

/// mem[0..8] += 1 atomically (old value fetched), r0 = add5(1..5) + old + callx 7 (10..50).
fn program() -> Vec<u8> {
    let mut p = vec![
        ins(0xbf, 6, 1, 0, 0),    // r6 = ctx
        ins(0xb7, 2, 0, 0, 1),    // r2 = 1
        ins(0xdb, 6, 2, 0, 0x01), // r2 = fetch_add(*(u64 *)r6, r2)
        ins(0xbf, 7, 2, 0, 0),    // r7 = old
    ];
    p.extend((1..=5).map(|r| ins(0xb7, r, 0, 0, r as i32)));
    p.extend([
        ins(0x85, 0, 0, 0, 7), // r0 = add5(1, 2, 3, 4, 5) = 15
        ins(0x0f, 0, 7, 0, 0), // r0 += old
        ins(0xbf, 8, 0, 0, 0), // r8 = r0 (survives the next call)
        ins(0xb7, 9, 0, 0, 7), // r9 = helper id 7
    ]);
    p.extend((1..=5).map(|r| ins(0xb7, r, 0, 0, 10 * r as i32)));
    p.extend([
        ins(0x8d, 9, 0, 0, 0), // callx r9 -> add5(10..50) = 150
        ins(0x0f, 0, 8, 0, 0), // r0 += r8
        EXIT,
    ]);
    prog(&p)
}

#[test]
fn runs_through_the_runtime_with_both_atomics_paths() {
    let rt = runtime();
    for features in [0, FEATURE_LSE] {
        let opts = LoadOptions {
            arch: Some(Arch::Aarch64),
            features: Some(features),
            ..Default::default()
        };
        let p = rt.load(&program(), &opts).expect("load");
        assert_eq!(p.features(), features);
        assert_eq!(p.native_insns() * 4, p.code_size());
        for round in 0..3u64 {
            let mut mem = (41 + round).to_le_bytes();
            let r = p.call(&mut mem).expect("call");
            assert_eq!(u64::from_le_bytes(mem), 42 + round, "features {features}");
            assert_eq!(r, 15 + 41 + round + 150, "features {features}");
        }
    }
}

#[test]
fn detected_features_are_used_by_default() {
    let rt = runtime();
    let be = Arm64Backend::new();
    use packjit_plugin_api::JitBackend;
    let detected = be.detect_features();
    // qemu-aarch64's default CPU implements ARMv8.1 atomics.
    assert_eq!(detected & !FEATURE_LSE, 0);
    let p = rt
        .load(
            &prog(&[ins(0xb7, 0, 0, 0, 3), EXIT]),
            &LoadOptions::default(),
        )
        .unwrap();
    assert_eq!(p.features(), detected);
    assert_eq!(p.call(&mut []).unwrap(), 3);
    let p = rt
        .load(
            &prog(&[ins(0xb7, 0, 0, 0, 3), EXIT]),
            &LoadOptions {
                disable_features: FEATURE_LSE,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(p.features(), 0);
}

#[test]
fn batch_load_and_errors() {
    let rt = runtime();
    let good = prog(&[ins(0xb7, 0, 0, 0, 9), EXIT]);
    let unknown = prog(&[ins(0x85, 0, 0, 0, 99), EXIT]);
    let res = rt.load_batch(
        &[&good[..], &unknown[..], &good[..]],
        &LoadOptions::default(),
    );
    assert_eq!(res.len(), 3);
    assert_eq!(res[0].as_ref().unwrap().call(&mut []).unwrap(), 9);
    let e = res[1].as_ref().unwrap_err();
    assert_eq!((e.kind, e.pc), (ErrorKind::UnknownHelper, Some(0)));
    assert_eq!(res[2].as_ref().unwrap().call(&mut []).unwrap(), 9);
}

#[test]
fn the_cdylib_plugin_loads_and_runs() {
    // Cargo puts the cdylib in deps/ next to this test binary (and, when it is a root of the
    // build, also one level up): look where the runtime's plugin search looks.
    let so = packjit::default_plugin_dirs()
        .into_iter()
        .map(|d| d.join("libpackjit_arm64.so"))
        .find(|p| p.exists())
        .expect("cargo builds the cdylib next to the tests");
    let rt = Runtime::new().unwrap();
    let info = rt.load_plugin(&so).expect("plugin");
    assert_eq!(info.arch, Arch::Aarch64);
    rt.register_helper(7, "add5", add5).unwrap();
    let p = rt
        .load(
            &prog(&[
                ins(0xb7, 1, 0, 0, 20),
                ins(0xb7, 2, 0, 0, 22),
                ins(0xb7, 3, 0, 0, 0),
                ins(0xb7, 4, 0, 0, 0),
                ins(0xb7, 5, 0, 0, 0),
                ins(0x85, 0, 0, 0, 7),
                EXIT,
            ]),
            &LoadOptions::default(),
        )
        .unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 42);
}

/// The runtime's sandboxed default on arm64: a safe `call` whose escapes come back as stops
/// with kind, pc and access, the budget per load and per call, regions per program.
#[test]
fn sandboxed_load_reports_stops_through_the_runtime() {
    use packjit::{MemRegion, RegionAccess, Stop};
    let rt = runtime();
    // r0 = *(u64 *)(r1 + 8): in bounds for 16 bytes, one past for 12.
    let read8 = prog(&[ins(0x79, 0, 1, 8, 0), EXIT]);
    let p = rt.load(&read8, &LoadOptions::default()).expect("load");
    let mut mem = [0u8; 16];
    mem[8] = 0x2a;
    assert_eq!(p.call(&mut mem).unwrap(), 0x2a);
    let mut short = [0u8; 12];
    let e = p.call(&mut short).unwrap_err();
    assert_eq!(
        e.stop(),
        Some(Stop::OutOfBounds {
            pc: 0,
            addr: short.as_ptr() as u64 + 8,
            size: 8,
            write: false
        }),
        "{e}"
    );
    // A read-only per-program region: readable, not writable.
    let table = Box::new([9u8; 64]);
    // SAFETY: `table` outlives every program loaded with the region (dropped at the end).
    let region = unsafe { MemRegion::new(table.as_ptr(), table.len(), RegionAccess::ReadOnly) };
    let mut code = lddw(2, table.as_ptr() as u64);
    code.extend([ins(0x71, 0, 2, 63, 0), EXIT]);
    let opts = LoadOptions {
        regions: vec![region],
        ..LoadOptions::default()
    };
    assert_eq!(
        rt.load(&prog(&code), &opts)
            .unwrap()
            .call(&mut mem)
            .unwrap(),
        9
    );
    let mut code = lddw(2, table.as_ptr() as u64);
    code.extend([ins(0x72, 2, 0, 0, 1), ins(0xb7, 0, 0, 0, 0), EXIT]);
    let e = rt
        .load(&prog(&code), &opts)
        .unwrap()
        .call(&mut mem)
        .unwrap_err();
    assert!(
        matches!(
            e.stop(),
            Some(Stop::OutOfBounds {
                pc: 2,
                write: true,
                ..
            })
        ),
        "{e}"
    );
    // An infinite loop under a budget; an unknown callx id.
    let spin = prog(&[ins(0x05, 0, 0, -1, 0), EXIT]);
    let opts = LoadOptions {
        budget: packjit::Budget::Limit(1000),
        ..LoadOptions::default()
    };
    let p = rt.load(&spin, &opts).unwrap();
    assert_eq!(
        p.call(&mut mem).unwrap_err().stop(),
        Some(Stop::Budget { pc: 0 })
    );
    assert_eq!(
        p.call_with_budget(&mut mem, 5).unwrap_err().stop(),
        Some(Stop::Budget { pc: 0 }),
        "stops at the jump"
    );
    let callx = prog(&[ins(0xb7, 1, 0, 0, 99), ins(0x8d, 1, 0, 0, 0), EXIT]);
    let e = rt
        .load(&callx, &LoadOptions::default())
        .unwrap()
        .call(&mut mem)
        .unwrap_err();
    assert_eq!(e.stop(), Some(Stop::UnknownCallx { pc: 1, id: 99 }));
    drop(table);
}
