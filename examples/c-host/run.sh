#!/usr/bin/env bash
# Builds examples/c-host/main.c (plain C, include/packjit.h) against the ffi library and runs
# it: natively on x86-64, and cross-built for aarch64 and riscv64 under qemu-user; twice per
# arch: with the
# backend plugin path on the command line, and with PACKJIT_PLUGIN_DIR so the host's plugin
# is picked by packjit_load_host_plugin. The deterministic lines of the output (those not
# starting with two spaces) must equal expected.txt.
#
#   examples/c-host/run.sh [x86_64] [aarch64] [riscv64]     (default: all three)
#   PACKJIT_SKIP_BUILD=1 ...                        (reuse the existing cross builds)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
packjit_install

arches=("$@")
[ ${#arches[@]} -eq 0 ] && arches=(x86_64 aarch64 riscv64)
out_dir="$PACKJIT_CROSS_TARGET_DIR/c-host"
mkdir -p "$out_dir"
expected=examples/c-host/expected.txt
fail=0

for arch in "${arches[@]}"; do
    case "$arch" in
        x86_64)
            triple="" gnu="" backend=x86_64 ld_path_prefix= ;;
        aarch64)
            triple=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu backend=arm64
            ld_path_prefix=/usr/aarch64-linux-gnu/lib: ;;
        riscv64)
            triple=riscv64gc-unknown-linux-gnu gnu=riscv64-linux-gnu backend=rv64
            ld_path_prefix= ;;
        *) echo "run.sh: unknown arch $arch" >&2; exit 2 ;;
    esac
    if [ "$arch" = x86_64 ]; then
        # Native: the host build of the library and the x86-64 plugin, no emulator.
        lib_dir="$PACKJIT_ROOT/target/debug" cc=cc runner=()
        if [ -z "${PACKJIT_SKIP_BUILD:-}" ]; then
            echo "== $arch: building packjit-ffi and packjit-x86-64"
            cargo build -q -p packjit-ffi -p packjit-x86-64
        fi
    else
        lib_dir="$PACKJIT_CROSS_TARGET_DIR/$triple/debug" cc="$gnu-gcc"
        runner=("qemu-$arch" -L "/usr/$gnu")
        if [ -z "${PACKJIT_SKIP_BUILD:-}" ]; then
            echo "== $arch: cross-building packjit-ffi and packjit-$backend"
            packjit_cross_cargo "$triple" build -q -p packjit-ffi -p "packjit-$backend"
        fi
    fi
    exe="$out_dir/c-host-$arch"
    echo "== $arch: $cc main.c -lpackjit"
    "$cc" -std=c99 -Wall -Wextra -Werror -pedantic -O1 -I include \
        examples/c-host/main.c -L "$lib_dir" -lpackjit -o "$exe"
    for mode in path dir; do
        log="$out_dir/c-host-$arch-$mode.log"
        set +e
        if [ "$arch" = x86_64 ] && [ "$mode" = path ]; then
            LD_LIBRARY_PATH="$lib_dir" timeout 300 "$exe" "$lib_dir/libpackjit_$backend.so" \
                >"$log" 2>&1
        elif [ "$arch" = x86_64 ]; then
            LD_LIBRARY_PATH="$lib_dir" PACKJIT_PLUGIN_DIR="$lib_dir" timeout 300 "$exe" \
                >"$log" 2>&1
        elif [ "$mode" = path ]; then
            timeout 300 "${runner[@]}" -E "LD_LIBRARY_PATH=$ld_path_prefix$lib_dir" \
                "$exe" "$lib_dir/libpackjit_$backend.so" >"$log" 2>&1
        else
            timeout 300 "${runner[@]}" -E "LD_LIBRARY_PATH=$ld_path_prefix$lib_dir" \
                -E "PACKJIT_PLUGIN_DIR=$lib_dir" "$exe" >"$log" 2>&1
        fi
        rc=$?
        set -e
        cat "$log"
        if [ $rc -ne 0 ]; then
            echo "FAIL: c-host $arch ($mode) exited with $rc"
            fail=1
        elif ! grep -v '^  ' "$log" | diff -u "$expected" - ; then
            echo "FAIL: c-host $arch ($mode) output differs from $expected"
            fail=1
        else
            echo "ok: c-host $arch ($mode)"
        fi
    done
done
exit $fail
