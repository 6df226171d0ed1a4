use super::*;

#[test]
fn helpers_are_unique_and_listed() {
    unsafe extern "C" fn h(a: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        a
    }
    let rt = Runtime::new().unwrap();
    rt.register_helper(5, "id", h).unwrap();
    let e = rt.register_helper(5, "again", h).unwrap_err();
    assert_eq!(e.message, "helper id 5 is already registered (as \"id\")");
    assert_eq!(rt.helpers()[0].name, "id");
}

/// `Runtime::new()` compiles for the host with the backend this build links in; a backend
/// the host loads for that arch replaces it, and only then is a second one refused.
#[test]
fn the_linked_backend_serves_until_the_host_loads_its_own() {
    let Some(linked) = linked_backend() else {
        return; // the host's backend feature is off or the host has no backend
    };
    let host = Arch::host().unwrap();
    assert_eq!(linked.arch(), host);
    let rt = Runtime::new().unwrap();
    let info = rt.backends();
    assert_eq!(info.len(), 1);
    assert_eq!(
        (info[0].arch, info[0].origin.as_str()),
        (host, LINKED_ORIGIN)
    );
    // mov r0, 7 ; exit
    let code = [0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let p = rt.load(&code, &LoadOptions::default()).unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 7);

    rt.add_backend(linked_backend().unwrap()).unwrap();
    let info = rt.backends();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].origin, "static");
    // Compiled by the replaced backend, still runnable.
    assert_eq!(p.call(&mut []).unwrap(), 7);
    let e = rt.add_backend(linked_backend().unwrap()).unwrap_err();
    assert!(e.message.contains("is already loaded"), "{e}");

    let empty = Runtime::with_config(RuntimeConfig {
        linked_backend: false,
        ..Default::default()
    })
    .unwrap();
    assert!(empty.backends().is_empty());
    let e = empty.load(&code, &LoadOptions::default()).unwrap_err();
    assert_eq!(e.message, format!("no backend loaded for {host}"));
}

#[test]
fn loading_without_a_backend_names_the_arch() {
    // An arch other than the host's: `Runtime::new` links the host's backend.
    let other = if cfg!(target_arch = "riscv64") {
        Arch::Aarch64
    } else {
        Arch::Riscv64
    };
    let rt = Runtime::new().unwrap();
    let e = rt
        .load(
            &[0x95, 0, 0, 0, 0, 0, 0, 0],
            &LoadOptions {
                arch: Some(other),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Plugin);
    assert_eq!(e.message, format!("no backend loaded for {other}"));
}

#[test]
fn rbpf_helpers_register_under_rbpf_ids() {
    let rt = Runtime::new().unwrap();
    rbpf_bridge::register_rbpf_helpers(&rt, 100).unwrap();
    let hs = rt.helpers();
    assert!(hs
        .iter()
        .any(|h| h.id == rbpf::helpers::BPF_TRACE_PRINTK_IDX));
    assert!(hs.iter().any(|h| h.id == 102 && h.name == "sqrti"));
    // The trampoline really calls rbpf's helper.
    let sqrti = hs.iter().find(|h| h.name == "sqrti").unwrap();
    // SAFETY: the address of an `extern "C"` thunk with the helper signature.
    let f: PjHelperFn = unsafe { std::mem::transmute(sqrti.addr as usize) };
    // SAFETY: sqrti takes plain integers.
    assert_eq!(unsafe { f(81, 0, 0, 0, 0) }, 9);
}

/// `Tier::Adaptive` as this build has it: with the `optimizer` feature, a trusted program
/// tiers up when asked; without it, every adaptive load runs on the baseline for good,
/// refused by name. Either way a sandboxed one stays on the baseline, and the load never
/// fails for want of the optimizing tier.
#[test]
fn adaptive_loads_behave_as_documented_in_this_build() {
    if linked_backend().is_none() {
        return;
    }
    let rt = Runtime::with_config(RuntimeConfig {
        tiering: TieringConfig {
            policy: TierPolicy::Manual,
            ..TieringConfig::default()
        },
        ..RuntimeConfig::default()
    })
    .unwrap();
    assert_eq!(rt.tier_policy(), TierPolicy::Manual);
    let opts = LoadOptions {
        tier: Tier::Adaptive,
        budget: Budget::Unlimited,
        ..LoadOptions::default()
    };
    // mov r0, 7 ; exit
    let code = [0xb7, 0, 0, 0, 7, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    // SAFETY: touches no memory.
    let p = unsafe { rt.load_trusted(&code, &opts) }.unwrap();
    assert_eq!(p.call(&mut []).unwrap(), 7);
    if Tier::Optimized.is_built() {
        assert_eq!(p.tier_status(), TierStatus::Baseline);
        p.request_tier_up();
        assert_eq!(p.wait_tier_up(), TierStatus::Optimized);
        assert_eq!(p.tier(), Tier::Optimized);
    } else {
        match p.tier_status() {
            TierStatus::Refused(e) => {
                assert_eq!(e.kind, ErrorKind::Unsupported);
                assert!(e.message.contains("`optimizer` cargo feature"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.request_tier_up(), p.tier_status());
        assert_eq!(p.tier(), Tier::Baseline);
    }
    assert_eq!(p.call(&mut []).unwrap(), 7);
    let s = rt.load(&code, &opts).unwrap();
    assert!(matches!(s.tier_status(), TierStatus::Refused(_)));
    assert_eq!(s.call(&mut []).unwrap(), 7);
    let b = rt.load(&code, &LoadOptions::default()).unwrap();
    assert_eq!(b.tier_status(), TierStatus::Fixed(Tier::Baseline));
}

#[test]
fn tail_entry_skip_is_each_backends() {
    // The runtime's copy of each backend's `TAIL_ENTRY_SKIP` (the address a prog-array slot
    // stores for callers with the uniform frame).
    let skips = [
        ("packjit-x86-64", packjit_x86_64::frame::TAIL_ENTRY_SKIP),
        ("packjit-arm64", packjit_arm64::TAIL_ENTRY_SKIP),
        ("packjit-rv64", packjit_rv64::TAIL_ENTRY_SKIP),
    ];
    assert_eq!(TAIL_ENTRY_SKIPS, skips);
    for (name, _) in skips {
        assert!(UNIFORM_TAIL_FRAME_BACKENDS.contains(&name), "{name}");
    }
}
