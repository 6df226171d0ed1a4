//! Golden disassembly of emitted code (host side, cross objdump), so code quality and
//! encoding choices cannot regress silently.

mod common;
use common::*;
use packjit_plugin_api::HelperEntry;
use packjit_rv64::{FEATURE_C, FEATURE_ZBA, FEATURE_ZBB};

fn dis(slots: &[[u8; 8]], features: u64) -> Vec<String> {
    let helpers = [HelperEntry {
        id: 7,
        reserved: 0,
        addr: 0x0000_3fff_8000_1234,
    }];
    disasm(&compile(&prog(slots), &helpers, features).unwrap())
}

#[test]
fn scratch_print() {
    let p = [
        ins(0x07, 1, 0, 0, 100),     // add r1, 100
        ins(0x07, 1, 0, 0, 0x12345), // add r1, 0x12345
        ins(0x57, 1, 0, 0, 0xff),    // and r1, 0xff
        ins(0x04, 1, 0, 0, -1),      // add32 r1, -1
        lddw(2, 0x1234_5678_9abc_def0)[0],
        lddw(2, 0x1234_5678_9abc_def0)[1],
        ins(0x1d, 1, 2, 1, 0),      // jeq r1, r2, +1
        ins(0x3f, 1, 2, 0, 0),      // div r1, r2
        ins(0x3c, 1, 2, 0, 0),      // div32 r1, r2
        ins(0x85, 0, 0, 0, 7),      // call 7
        ins(0xdb, 10, 1, -8, 0x01), // lock fetch add [r10-8], r1
        ins(0xc3, 10, 1, -8, 0xf1), // cmpxchg32
        ins(0xdc, 3, 0, 0, 64),     // be64 r3
        ins(0x2e, 3, 4, 0, 0),      // jgt32 r3, r4, +0
        EXIT,
    ];
    for f in [0, FEATURE_C | FEATURE_ZBA | FEATURE_ZBB] {
        println!("--- features {f}");
        for l in dis(&p, f) {
            println!("{l}");
        }
    }
}
