#!/usr/bin/env bash
# rbpf's own tests and examples on packjit's bridge, with only the type path changed: copies
# rbpf 0.4.1's test files (misc.rs, ubpf_verifier.rs, ubpf_jit_x86_64.rs, ubpf_vm.rs,
# cranelift.rs and common.rs) and its examples that run a VM (allowed_memory, date, load_elf,
# rbpf_plugin) from cargo's registry into a scratch crate, replaces every `rbpf::EbpfVm` by
# `packjit::rbpf_bridge::EbpfVm` and nothing else, and runs them with rbpf's default features
# plus `cranelift` (which the bridge serves with packjit's sandboxed JIT). The backend is the
# one `packjit` links for the host: no plugin is involved.
#
# Prints each test file's counts and each example's result; the deviations that remain are
# listed in runtime/src/rbpf_bridge.rs. With `--check`, exits non-zero unless exactly the
# documented deviations fail.
#
#   scripts/rbpf-dropin.sh [--check] [--cross TRIPLE] [scratch dir, default target/rbpf-dropin]
#
# `--cross aarch64-unknown-linux-gnu` builds for arm64 with the cross toolchain of
# scripts/env.sh and runs everything under qemu-user (the JIT tests then run packjit's arm64
# backend).
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
check=0
cross=""
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check=1; shift ;;
        --cross) cross="$2"; shift 2 ;;
        *) break ;;
    esac
done
if [ -n "$cross" ]; then
    # shellcheck source=env.sh
    source "$top/scripts/env.sh"
fi
cargo_for_target() {
    if [ -n "$cross" ]; then
        packjit_cross_cargo "$cross" "$@"
    else
        cargo "$@"
    fi
}
dir="${1:-$top/target/rbpf-dropin${cross:+-$cross}}"
src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/rbpf-0.4.1 2>/dev/null | head -n1)"
if [ -z "$src" ]; then
    (cd "$top" && cargo fetch -q)
    src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/rbpf-0.4.1 | head -n1)"
fi
mkdir -p "$dir/src" "$dir/tests" "$dir/examples"
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
elf = "0.8.0"
hex = "0.4.3"
json = "0.12"
libc = "0.2"

[features]
# rbpf's own test configuration: its default features, and its Cranelift tests.
default = ["std"]
std = []
cranelift = ["packjit/cranelift"]
TOML
: > "$dir/src/lib.rs"
for f in misc ubpf_verifier ubpf_jit_x86_64 ubpf_vm cranelift common; do
    cp "$src/tests/$f.rs" "$dir/tests/"
done
examples=(allowed_memory date load_elf rbpf_plugin)
for e in "${examples[@]}"; do
    cp "$src/examples/$e.rs" "$dir/examples/"
done
cp "$src/examples/load_elf__block_a_port.o" "$dir/examples/"
sed -i 's/rbpf::EbpfVm/packjit::rbpf_bridge::EbpfVm/g' "$dir"/tests/*.rs "$dir"/examples/*.rs
cd "$dir"
# A fresh lock file each time, pinned to the workspace's versions where they overlap.
cp "$top/Cargo.lock" Cargo.lock

out="$(cargo_for_target test --features cranelift --no-fail-fast 2>&1 || true)"
echo "$out" | grep -E '^     Running tests/|^test result|^test .* FAILED' || true

fail=0
# The documented deviation (runtime/src/rbpf_bridge.rs): rbpf zero-extends a 64-bit jump's
# immediate where RFC 9669 sign-extends.
expected_failures="test_vm_jmp_unsigned_extend"
failed="$(echo "$out" | sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' | sed 's/ - should panic$//' |
    sort | tr '\n' ' ')"
want="$(echo "$expected_failures" | tr ' ' '\n' | sort | tr '\n' ' ')"
if [ "$failed" != "$want" ]; then
    echo "rbpf-dropin: failed tests [$failed], expected exactly [$want]"
    fail=1
fi
if ! echo "$out" | grep -q '^     Running tests/cranelift.rs'; then
    echo "rbpf-dropin: rbpf's Cranelift tests did not run"
    fail=1
fi

# rbpf's examples, each with what it must print (each also asserts its own results and
# fails on a wrong one). rbpf_plugin is the bpf_conformance plugin: the program (hex) on
# stdin, the memory (hex) as its argument; here `mov r0, 42; exit`.
run_example() {
    local name="$1" want="$2"
    shift 2
    local got
    if got="$(cargo_for_target run -q --features cranelift --example "$name" -- "$@" 2>&1)" &&
        echo "$got" | grep -q -- "$want"; then
        echo "example $name $*: ok"
    else
        echo "example $name $*: FAILED (wanted \"$want\"):"
        echo "$got" | tail -n 5
        fail=1
    fi
}
prog="b7000000 2a000000 95000000 00000000"
# allowed_memory reads examples/allowed-memory/allowed-memory.o, which the published crate
# does not ship: it is built, not run (tests/rbpf_bridge.rs runs the same calls).
if cargo_for_target build -q --features cranelift --example allowed_memory 2>&1; then
    echo "example allowed_memory: builds (its object file is not in rbpf's crate)"
else
    echo "example allowed_memory: FAILED to build"
    fail=1
fi
run_example date "Unix timestamp: " </dev/null
run_example load_elf "Packet #1, program returned: 4294967295 (0xffffffff)" </dev/null
for mode in "" --jit --cranelift; do
    # shellcheck disable=SC2086 # an empty mode is no argument
    run_example rbpf_plugin "^2a$" "" $mode <<<"$prog"
done
if [ "$check" = 1 ]; then
    exit "$fail"
fi
