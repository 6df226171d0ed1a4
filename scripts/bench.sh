#!/usr/bin/env bash
# Benchmarks, printed as figures: the arena (host and under qemu), and JIT vs the rbpf
# interpreter on a compute-bound program under qemu-aarch64 and qemu-riscv64 (both sides
# under the same emulator, side by side in one run). Release builds.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PACKJIT_ROOT"
packjit_install
iterations=${PACKJIT_BENCH_ITERATIONS:-10000000}

echo "== arena, host ($(uname -m))"
cargo bench -q -p packjit --bench arena 2>/dev/null | grep -v '^$'

for triple in aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu; do
    case "$triple" in
        aarch64-*) runner=($CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER) ;;
        *) runner=($CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_RUNNER) ;;
    esac
    echo
    echo "== $triple under qemu-user (release build)"
    packjit_cross_cargo "$triple" build -q --release -p packjit-demo -p packjit-arm64 -p packjit-rv64
    packjit_cross_cargo "$triple" build -q --release -p packjit --benches
    dir="$PACKJIT_CROSS_TARGET_DIR/$triple/release"
    bench=$(ls -t "$dir"/deps/arena-* | grep -v '\.d$' | head -n 1)
    "${runner[@]}" "$bench"
    "${runner[@]}" "$dir/packjit-demo" --plugin-dir "$dir" bench --iterations "$iterations"
done
