//! The C API's compaction calls (`packjit_runtime_set_compaction`, `packjit_runtime_compact`)
//! with the host's real backend plugin: programs moved into holes keep their answers, a
//! program whose raw entry was taken stays where it is, and off means off. Runs natively and
//! under qemu-user (no child processes).

mod common;
#[path = "../src/lib.rs"]
#[allow(dead_code, unused_imports)]
mod packjit;
use common::{check, host_runtime, load, run, sized};
use packjit::*;
use std::ptr::{null, null_mut};

fn entry_addr(p: *mut PackjitProgram) -> u64 {
    let mut info = PackjitProgramInfo::default();
    // SAFETY: a live program; struct_size set.
    check(
        unsafe { packjit_program_info(p, &mut info) },
        "packjit_program_info",
    );
    info.entry_addr
}

fn compact(rt: *mut PackjitRuntime) -> u64 {
    let mut total = 0;
    for _ in 0..100 {
        let (mut moved, mut pending) = (0, 0);
        // SAFETY: live runtime; valid out pointers.
        check(
            unsafe { packjit_reclaim(rt, &mut pending) },
            "packjit_reclaim",
        );
        assert_eq!(pending, 0);
        // SAFETY: as above.
        check(
            unsafe { packjit_runtime_compact(rt, u64::MAX, &mut moved) },
            "packjit_runtime_compact",
        );
        if moved == 0 {
            break;
        }
        total += moved;
    }
    total
}

#[test]
fn compaction_through_the_c_api() {
    let rt = host_runtime();
    // Off while the holes are made, so that only the explicit calls below move code.
    // SAFETY: live runtime.
    check(
        unsafe { packjit_runtime_set_compaction(rt, 1000, 0) },
        "packjit_runtime_set_compaction",
    );
    let mut progs: Vec<(*mut PackjitProgram, u64)> = (0..40)
        .map(|i| {
            let p = load(rt, &sized(2 + (i * 53) % 500, i as i32 + 1));
            (p, i as u64 + 1)
        })
        .collect();
    for (i, (p, _)) in progs.iter().enumerate() {
        if i % 2 == 0 {
            // SAFETY: live, freed once (dropped from the list below).
            unsafe { packjit_program_free(*p) };
        }
    }
    let mut i = 0;
    progs.retain(|_| {
        i += 1;
        i % 2 == 0
    });
    assert_eq!(compact(rt), 0, "compaction is off");
    // A host that takes the raw entry keeps the code where it is.
    let mut entry: Option<PjProgramEntry> = None;
    // SAFETY: live program; valid out pointer.
    check(
        unsafe { packjit_program_entry(progs[0].0, (&mut entry as *mut Option<_>).cast()) },
        "packjit_program_entry",
    );
    let pinned = entry.unwrap() as usize as u64;
    let before: Vec<u64> = progs.iter().map(|&(p, _)| entry_addr(p)).collect();
    // SAFETY: live runtime.
    check(
        unsafe { packjit_runtime_set_compaction(rt, 0, 0) },
        "packjit_runtime_set_compaction",
    );
    let moved = compact(rt);
    assert!(moved > 0, "holes all over the pack: something moves");
    let after: Vec<u64> = progs.iter().map(|&(p, _)| entry_addr(p)).collect();
    assert_eq!(after[0], pinned, "the pinned program stays");
    let n = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert!(n > 0);
    for &(p, k) in &progs {
        assert_eq!(run(p), k);
    }
    println!("{n} of {} programs moved ({moved} bytes)", progs.len());
    assert_eq!(
        // SAFETY: a NULL runtime is refused with an error, not dereferenced.
        unsafe { packjit_runtime_compact(null(), 1, null_mut()) },
        PJ_ERR_INVALID_ARGUMENT
    );
    for (p, _) in progs {
        // SAFETY: live, freed once.
        unsafe { packjit_program_free(p) };
    }
    // SAFETY: live runtime, not used again.
    unsafe { packjit_runtime_destroy(rt) };
}
