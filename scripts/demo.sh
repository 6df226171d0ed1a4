#!/usr/bin/env bash
# Runs the packjit demo: on the x86-64 host (compile for every arch, run the x86-64 code
# natively), then natively under qemu-aarch64 and qemu-riscv64 with the backends
# loaded as real plugins (dlopen) and the code running from the shared packed arena.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PACKJIT_ROOT"
packjit_install

echo "== host ($(uname -m)): build and run"
packjit_timed "building the demo and the plugins" \
    cargo build -q -p packjit-demo -p packjit-arm64 -p packjit-rv64 -p packjit-x86-64
packjit_timed "running the sample natively" target/debug/packjit-demo run

# C compiled by clang into a relocatable eBPF object, loaded as it is: .rodata table, .bss
# counter, string literal, a local call and rbpf's `sqrti` helper resolved by name.
objs="$PACKJIT_ROOT/target/demo-objs"
mkdir -p "$objs"
compile_objects() {
    local src
    for src in demo sandbox demo_maps; do
        clang-19 -O2 -g -target bpf -mcpu=v4 -c "tests/bpf/$src.c" -o "$objs/$src.o"
    done
}
packjit_timed "compiling tests/bpf/{demo,sandbox,demo_maps}.c with clang-19" compile_objects
echo
echo "== clang-built ELF object, sandboxed with a budget: tests/bpf/demo.c"
target/debug/packjit-demo run "$objs/demo.o" --section demo --mem "07 00 00" --sandbox --budget 100000
echo "-- its native code, disassembled in-process (capstone), eBPF ranges marked"
target/debug/packjit-demo dump "$objs/demo.o" --section demo --arch x86_64 >"$objs/demo.dump"
head -n 40 "$objs/demo.dump"
echo "   ... ($(wc -l <"$objs/demo.dump") lines in all: $objs/demo.dump)"
echo
echo "== the sandbox stops an out-of-bounds read: tests/bpf/sandbox.c"
# The error names the pc and the address, and the demo exits with status 3.
set +e
target/debug/packjit-demo run "$objs/sandbox.o" --section pj/oob_read --mem "01 02" --sandbox
rc=$?
set -e
if [ $rc -ne 3 ]; then
    echo "expected the sandbox to stop the program (exit 3), got $rc" >&2
    exit 1
fi
echo "-- stopped by the sandbox (exit 3), as it should be"

echo
echo "== maps and a tail call: tests/bpf/demo_maps.c, four packets (TCP, UDP, ICMP, TCP)"
# A hash map of packets per protocol, a ring buffer of (protocol, length, count) events and
# a prog array through which ICMP packets tail call the `icmp` stage (its result, 2, is the
# run's). The maps live across the runs; --maps prints each one afterwards.
maps_run=(run "$objs/demo_maps.o" --section pj/count --mem "06 00 00 00" --mem "11 00 00 00 00 00"
    --mem "01 00 00 00 00 00 00 00" --mem "06 00" --maps)
target/debug/packjit-demo "${maps_run[@]}"

for triple in aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu; do
    echo
    echo "== $triple: cross-build, then run under qemu-user"
    packjit_timed "cross-building the demo and the plugins for $triple" \
        packjit_cross_cargo "$triple" build -q -p packjit-demo -p packjit-arm64 -p packjit-rv64
    dir="$PACKJIT_CROSS_TARGET_DIR/$triple/debug"
    case "$triple" in
        aarch64-*) runner=($CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER) ;;
        *) runner=($CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_RUNNER) ;;
    esac
    emulated_start=$SECONDS
    echo "   (running the demo under ${runner[*]##*/} ...)" >&2
    "${runner[@]}" "$dir/packjit-demo" run
    echo "-- the clang-built object, sandboxed, native $triple code"
    "${runner[@]}" "$dir/packjit-demo" run "$objs/demo.o" --section demo --mem "07 00 00" \
        --sandbox --budget 100000
    echo "-- maps and a tail call (tests/bpf/demo_maps.c), native $triple code"
    "${runner[@]}" "$dir/packjit-demo" "${maps_run[@]}"
    echo "-- arena statistics for a batch of programs"
    "${runner[@]}" "$dir/packjit-demo" stats --count 300
    echo "   (the $triple runs under qemu-user: $((SECONDS - emulated_start)) s)" >&2
done
echo
echo "packjit demo: done in $SECONDS s"
