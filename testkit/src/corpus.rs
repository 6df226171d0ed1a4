//! A fixed corpus of programs for comparing two ways of compiling the same code: the
//! conformance suite, the sandbox bench programs, the inline-helper cases and generated
//! programs (plain and with escapes). Used by `examples/emit_digest.rs` (emitted-code identity
//! across changes) and `tests/regrow.rs` (in-place widening against a second pass).

use crate::{bench, conformance, gen, inline_cases};
use packjit_plugin_api::HelperEntry;

/// `(name, bytecode, helpers)`.
pub type Entry = (String, Vec<u8>, Vec<HelperEntry>);

/// The generated programs' helpers at fixed addresses: the code embeds them, and two builds
/// would place the real helpers apart.
pub fn fixed_gen_helpers() -> Vec<HelperEntry> {
    gen::helpers()
        .into_iter()
        .map(|(id, _, _)| HelperEntry {
            id,
            inline_kind: 0,
            addr: 0x7f00_0000_1000 + 16 * id as u64,
        })
        .collect()
}

/// The conformance suite, the sandbox bench programs and the inline-helper cases.
pub fn fixed_programs() -> Vec<Entry> {
    let helpers = fixed_gen_helpers();
    let mut corpus = Vec::new();
    let suite = conformance::load_suite(&conformance::suite_dir()).expect("conformance suite");
    for case in suite {
        if let Ok(code) = case.program {
            corpus.push((case.name, code, helpers.clone()));
        }
    }
    for p in bench::sandbox_programs() {
        corpus.push((p.name.to_string(), p.code, helpers.clone()));
    }
    for (name, code, _) in inline_cases::programs() {
        corpus.push((name.to_string(), code, inline_cases::helpers()));
    }
    corpus
}

/// Generated programs for seeds `0..seeds`, plain and with escapes (`gen N`, `escape N`).
pub fn generated_programs(seeds: u64) -> Vec<Entry> {
    let helpers = fixed_gen_helpers();
    let mut corpus = Vec::new();
    for seed in 0..seeds {
        let p = gen::generate(seed);
        corpus.push((format!("gen {seed}"), p.encode(), helpers.clone()));
        let p = gen::generate_escapes(seed);
        corpus.push((format!("escape {seed}"), p.encode(), helpers.clone()));
    }
    corpus
}
