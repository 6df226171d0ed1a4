#!/usr/bin/env bash
# rbpf's own test files on packjit's bridge, with only the type path changed: copies rbpf
# 0.4.1's tests (misc.rs, ubpf_verifier.rs, ubpf_jit_x86_64.rs, ubpf_vm.rs and common.rs) from
# cargo's registry into a scratch crate, replaces every `rbpf::EbpfVm` by
# `packjit::rbpf_bridge::EbpfVm` and nothing else, and runs them with rbpf's default features.
# Prints each file's counts; the deviations that remain are listed in runtime/src/rbpf_bridge.rs.
#
#   scripts/rbpf-dropin.sh [scratch dir, default target/rbpf-dropin]
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$top/target/rbpf-dropin}"
src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/rbpf-0.4.1 2>/dev/null | head -n1)"
if [ -z "$src" ]; then
    (cd "$top" && cargo fetch -q)
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/rbpf-0.4.1 | head -n1)"
fi
mkdir -p "$dir/src" "$dir/tests"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "rbpf-dropin"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
packjit = { path = "$top/runtime" }
rbpf = "=0.4.1"

[dev-dependencies]
# Built next to the test binaries, where the bridge's default runtime finds its plugin.
packjit-x86-64 = { path = "$top/backends/x86_64" }
elf = "0.8.0"
hex = "*"
json = "0.12"
libc = "0.2"

[features]
# rbpf's own test configuration: its default features.
default = ["std"]
std = []
TOML
: > "$dir/src/lib.rs"
for f in misc ubpf_verifier ubpf_jit_x86_64 ubpf_vm common; do
    cp "$src/tests/$f.rs" "$dir/tests/"
done
sed -i 's/rbpf::EbpfVm/packjit::rbpf_bridge::EbpfVm/g' "$dir"/tests/*.rs
cd "$dir"
cargo test --no-fail-fast 2>&1 | grep -E '^     Running tests/|^test result|^test .* FAILED' || true
