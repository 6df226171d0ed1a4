//! `packjit-demo stats`: batch-load programs, free some, print the arena statistics, and
//! optionally keep the perf map (`--perf-map`) and draw each pack's occupancy (`--map`).

use crate::{print_stats, sample};
use packjit::{Arch, ChunkState, LoadOptions, Program, Runtime};

/// Options of the `stats` subcommand.
pub struct StatsOpts {
    pub count: usize,
    pub perf_map: bool,
    pub map: bool,
}

pub fn run(rt: &Runtime, o: &StatsOpts) -> Result<(), String> {
    let Some(host) = Arch::host().filter(|a| rt.backends().iter().any(|b| b.arch == *a)) else {
        println!("no backend for this host: the arena only holds native code; run under qemu (scripts/demo.sh)");
        return Ok(());
    };
    if o.perf_map {
        let path = rt.enable_perf_map().map_err(|e| e.to_string())?;
        println!("perf map: {}", path.display());
    }
    let sources: Vec<Vec<u8>> = (0..o.count).map(sample::sized_program).collect();
    let refs: Vec<&[u8]> = sources.iter().map(|s| s.as_slice()).collect();
    let progs: Vec<Program> = rt
        .load_batch(
            &refs,
            &LoadOptions {
                arch: Some(host),
                ..Default::default()
            },
        )
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    println!("loaded {} programs in one batch:", progs.len());
    step(rt, o)?;
    let kept: Vec<Program> = progs
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, p)| p)
        .collect();
    rt.reclaim();
    println!(
        "freed every third program (deferred, then reclaimed); {} remain:",
        kept.len()
    );
    step(rt, o)?;
    drop(kept);
    rt.reclaim();
    println!("freed the rest:");
    step(rt, o)
}

fn step(rt: &Runtime, o: &StatsOpts) -> Result<(), String> {
    print_stats(rt);
    if o.perf_map {
        let path = rt.perf_map_path().ok_or("perf map not enabled")?;
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("perf map: {} entries", text.lines().count());
    }
    if o.map {
        draw(rt);
    }
    Ok(())
}

/// One cell per page: `#` every chunk holds code, `+` code and free chunks, `.` trap-filled
/// and free, `_` untouched (not resident). 64 cells per row.
fn draw(rt: &Runtime) {
    let Some(arena) = rt.arena() else { return };
    let packs = arena.occupancy();
    if packs.is_empty() {
        println!("  (no packs)");
        return;
    }
    println!("  map, one cell per page: # code  + code and free chunks  . trap-filled, free  _ untouched");
    for p in packs {
        println!(
            "  pack at {:#x} ({} KiB):",
            p.base,
            p.chunks.len() * 64 / 1024
        );
        let cells: String = p
            .chunks
            .chunks(p.page_chunks)
            .map(|page| {
                let code = page.iter().filter(|&&c| c == ChunkState::Code).count();
                if code == page.len() {
                    '#'
                } else if code > 0 {
                    '+'
                } else if page[0] == ChunkState::TrapFilled {
                    '.'
                } else {
                    '_'
                }
            })
            .collect();
        for (i, row) in cells.as_bytes().chunks(64).enumerate() {
            println!(
                "    {:>6x} {}",
                i * 64 * p.page_chunks * 64,
                std::str::from_utf8(row).unwrap_or("")
            );
        }
    }
}
