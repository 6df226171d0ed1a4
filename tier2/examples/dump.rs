//! Writes the optimized image of a bytecode file (raw little-endian slots) to stdout, for
//! `objdump -D -b binary -m <arch>`: `cargo run -p packjit-tier2 --example dump -- prog.bin`.
//! `DUMP_SANDBOX=1` compiles it sandboxed with a budget (`PJ_COMPILE_SANDBOX |
//! PJ_COMPILE_BUDGET`), as `Runtime::load` does by default.
use std::io::Write;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: dump <bytecode file>");
    let code = std::fs::read(&path).expect("read the bytecode");
    let helpers: Vec<packjit_plugin_api::HelperEntry> = (0..256)
        .map(|id| packjit_plugin_api::HelperEntry {
            id,
            inline_kind: 0,
            addr: 0x1000 + id as u64 * 16,
        })
        .collect();
    let flags = if std::env::var_os("DUMP_SANDBOX").is_some() {
        packjit_plugin_api::PJ_COMPILE_SANDBOX | packjit_plugin_api::PJ_COMPILE_BUDGET
    } else {
        0
    };
    let out = packjit_tier2::emit_request(&packjit_plugin_api::CompileRequest {
        code: &code,
        helpers: &helpers,
        features: 0,
        flags,
        blind_key: 0,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    std::io::stdout().write_all(&out.bytes).unwrap();
}
