//! Random bytecode that names maps, functions and the map and callback helpers, through the
//! runtime's map binding and the verifier, then run sandboxed under a budget: every load is
//! a value or a named error, never a panic, and every run ends (a value or a stop). The seed
//! is printed; `PACKJIT_MAPS_RANDOM_SEED` repeats a run.

mod host;

use packjit::maps::{Map, MapSpec, MapType};
use packjit::{Budget, LoadOptions};
use packjit_frontend::encode_insn;

fn spec(name: &str, map_type: MapType, key: u32, value: u32, entries: u32) -> MapSpec {
    MapSpec {
        name: name.into(),
        map_type,
        key_size: key,
        value_size: value,
        max_entries: entries,
        flags: 0,
    }
}

#[test]
fn random_programs_with_maps_load_or_fail_cleanly_and_runs_end() {
    let seed = std::env::var("PACKJIT_MAPS_RANDOM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6d61_7073_u64);
    println!("seed {seed:#x}");
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let rt = host::host_runtime();
    let maps = vec![
        Map::new(spec("a", MapType::Array, 4, 8, 4)).unwrap(),
        Map::new(spec("h", MapType::Hash, 4, 8, 4)).unwrap(),
        Map::new(spec("p", MapType::ProgArray, 4, 4, 2)).unwrap(),
        Map::new(spec("q", MapType::Queue, 0, 8, 4)).unwrap(),
        Map::new(spec("r", MapType::RingBuf, 0, 0, 4096)).unwrap(),
    ];
    let opts = LoadOptions {
        maps: maps.clone(),
        budget: Budget::Limit(10_000),
        ..Default::default()
    };
    let helpers = [1, 2, 3, 12, 87, 88, 131, 132, 164, 181, 195];
    let (mut loaded, mut refused) = (0, 0);
    for round in 0..1500 {
        let n = 3 + next() % 24;
        let mut code = Vec::new();
        let mut slots = 0;
        while slots < n {
            let r = next();
            let reg = (r >> 8) as u8 % 12;
            let insn = match r % 9 {
                // lddw of a map (sometimes a bad index or a value reference) or a function.
                0 | 1 => {
                    let src = [1u8, 1, 2, 4][(r >> 16) as usize % 4];
                    let imm = (r >> 24) as i32 % 7 - 1;
                    code.extend(encode_insn(0x18, reg, src, 0, imm));
                    code.extend(encode_insn(0, 0, 0, 0, (r >> 40) as i32 % 3));
                    slots += 2;
                    continue;
                }
                2 | 3 => encode_insn(0x85, 0, 0, 0, helpers[(r >> 16) as usize % helpers.len()]),
                4 => encode_insn(0xbf, reg, 10, 0, 0),
                5 => encode_insn(0x07, reg, 0, 0, -((r >> 20) as i32 % 16)),
                6 => encode_insn(0x62, 10, 0, -8, (r >> 20) as i32 % 5),
                7 => encode_insn(0x15, reg, 0, ((r >> 20) % 5) as i16 - 2, 0),
                _ => encode_insn(0xb7, reg, 0, 0, (r >> 20) as i32 % 4),
            };
            code.extend(insn);
            slots += 1;
        }
        code.extend(encode_insn(0xb7, 0, 0, 0, 0));
        code.extend(encode_insn(0x95, 0, 0, 0, 0));
        match rt.load(&code, &opts) {
            Ok(p) => {
                loaded += 1;
                // A value or a stop: both end the run.
                let _ = p.call(&mut [round as u8; 16]);
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    println!("{loaded} loaded and ran, {refused} refused");
    assert!(
        loaded > 50 && refused > 50,
        "{loaded} loaded, {refused} refused"
    );
    for m in &maps {
        if m.spec().map_type == MapType::ProgArray {
            continue;
        }
        let _ = m.keys();
    }
}
