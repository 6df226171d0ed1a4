//! A map value a program holds stays its own until the run ends, although runs take no
//! epoch pin (only their run pin): the element of a key deleted by the host during the run
//! is not reused under it, however much the host churns the map meanwhile. Natively, and
//! under qemu-user in the cross runs; sandboxed and trusted.

mod host;

use packjit::maps::{Map, MapError, MapSpec, MapType};
use packjit::{LoadOptions, Trust};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The helper the program calls while it holds the value: it tells the host, then waits
/// for the host's churn to finish.
const HOLD: u32 = 0x7001;
/// 0: idle; 1: the program holds the value; 2: the host is done.
static PHASE: AtomicU32 = AtomicU32::new(0);

extern "C" fn hold(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    PHASE.store(1, Ordering::SeqCst);
    let start = Instant::now();
    while PHASE.load(Ordering::SeqCst) != 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the host never finished"
        );
        std::thread::yield_now();
    }
    0
}

const OLD: u64 = 0x1111_2222_3333_4444;
const NEW: u64 = 0xbad0_bad0_bad0_bad0;
const MISSED: u64 = 99;

/// key 1 on the stack; v = lookup(map, &key); if !v return MISSED; hold(); return *v.
fn holder() -> Vec<u8> {
    let i = host::insn;
    [
        i(0x62, 10, 0, -4, 1), // *(u32 *)(r10 - 4) = 1
        i(0x18, 1, 1, 0, 0),   // r1 = map 0
        i(0, 0, 0, 0, 0),
        i(0xbf, 2, 10, 0, 0), // r2 = r10 - 4
        i(0x07, 2, 0, 0, -4),
        i(0x85, 0, 0, 0, 1), // r0 = lookup
        i(0x55, 0, 0, 2, 0), // if r0 != 0 goto +2
        i(0xb7, 0, 0, 0, MISSED as i32),
        i(0x95, 0, 0, 0, 0),
        i(0xbf, 6, 0, 0, 0), // r6 = value pointer
        i(0x85, 0, 0, 0, HOLD as i32),
        i(0x79, 0, 6, 0, 0), // r0 = *(u64 *)(r6 + 0)
        i(0x95, 0, 0, 0, 0),
    ]
    .concat()
}

#[test]
fn a_value_held_by_a_run_is_not_reused_while_the_host_deletes_and_churns() {
    let rt = host::host_runtime();
    rt.register_helper(HOLD, "hold", hold).unwrap();
    // Each mode twice: in a fresh process the epoch may not have advanced far enough during
    // the first round for an unprotected element to come back, so that round alone could
    // miss a lost protection.
    for trust in [Trust::Trusted, Trust::Sandboxed].repeat(2) {
        // Two keys and the few spare elements every hash map has: churn reuses a retired
        // element within a few rounds once its grace period has passed.
        let map = Map::new(MapSpec {
            name: "held".into(),
            map_type: MapType::Hash,
            key_size: 4,
            value_size: 8,
            max_entries: 2,
            flags: 0,
        })
        .unwrap();
        map.update(&1u32.to_le_bytes(), &OLD.to_le_bytes(), 0)
            .unwrap();
        let opts = LoadOptions {
            maps: vec![map.clone()],
            ..Default::default()
        };
        let prog = match trust {
            Trust::Sandboxed => rt.load(&holder(), &opts).unwrap(),
            // SAFETY: the program reads its stack and the value the lookup hands it.
            Trust::Trusted => unsafe { rt.load_trusted(&holder(), &opts) }.unwrap(),
        };
        PHASE.store(0, Ordering::SeqCst);
        let got = std::thread::scope(|s| {
            let run = s.spawn(|| prog.call(&mut []).unwrap());
            let start = Instant::now();
            while PHASE.load(Ordering::SeqCst) != 1 {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the run never held"
                );
                std::thread::yield_now();
            }
            map.delete(&1u32.to_le_bytes()).unwrap();
            // Insert and delete new keys: each insert takes a free element, and the deleted
            // key's element would be one as soon as its grace period ended (freed elements
            // are taken before never-used ones). With the run still holding it, the never
            // used spares serve instead: 200 rounds stay below the smallest pool (256
            // spares), so no insert waits for a grace period that cannot end.
            let mut churned = 0;
            for k in 100u32..300 {
                match map.update(&k.to_le_bytes(), &NEW.to_le_bytes(), 0) {
                    Ok(()) => churned += 1,
                    Err(MapError::Full { .. }) => break,
                    Err(e) => panic!("update {k}: {e}"),
                }
                map.delete(&k.to_le_bytes()).unwrap();
            }
            PHASE.store(2, Ordering::SeqCst);
            println!(
                "{trust:?}: {churned} inserts and deletes while the run held its value ({:?})",
                start.elapsed()
            );
            run.join().unwrap()
        });
        assert_eq!(
            got, OLD,
            "{trust:?}: the value a run held was reused under it ({got:#x})"
        );
        // Once the run is over, the elements come back: the map takes both keys again.
        let start = Instant::now();
        map.update(&1u32.to_le_bytes(), &OLD.to_le_bytes(), 0)
            .unwrap();
        map.update(&2u32.to_le_bytes(), &OLD.to_le_bytes(), 0)
            .unwrap();
        println!("{trust:?}: reinserted in {:?}", start.elapsed());
    }
}
