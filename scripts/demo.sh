#!/usr/bin/env bash
# Runs the packjit demo: on the x86-64 host (compile for both arches, explain why the code
# can't run here), then natively under qemu-aarch64 and qemu-riscv64 with the backends
# loaded as real plugins (dlopen) and the code running from the shared packed arena.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PACKJIT_ROOT"
packjit_install

echo "== host ($(uname -m)): build and run"
cargo build -q -p packjit-demo -p packjit-arm64 -p packjit-rv64 -p packjit-x86-64
target/debug/packjit-demo run

for triple in aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu; do
    echo
    echo "== $triple: cross-build, then run under qemu-user"
    packjit_cross_cargo "$triple" build -q -p packjit-demo -p packjit-arm64 -p packjit-rv64
    dir="$PACKJIT_CROSS_TARGET_DIR/$triple/debug"
    case "$triple" in
        aarch64-*) runner=($CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER) ;;
        *) runner=($CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_RUNNER) ;;
    esac
    "${runner[@]}" "$dir/packjit-demo" run
    echo "-- arena statistics for a batch of programs"
    "${runner[@]}" "$dir/packjit-demo" stats --count 300
done
