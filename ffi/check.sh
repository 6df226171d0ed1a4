#!/usr/bin/env bash
# The C API checks cargo cannot run (exit status non-zero on any failure, one summary line at
# the end). The header-drift / C99 / C++ checks (ffi/tests/header.rs) and the C API tests with
# the C test backend (ffi/tests/c_api.rs) are cargo tests, run by `cargo test` on every arch.
#   1. valgrind: ffi/tests/valgrind/smoke.c (create, load plugins, compile, stats, errors,
#      free; no JIT code runs) and ffi/tests/valgrind/run.c (x86-64 JIT code runs: sandboxed,
#      trusted, stops, regions, a checking helper, maps, a ring buffer, a tail call through a
#      prog-array slot set from C) under memcheck --leak-check=full
#      --error-exitcode=1
#   2. c-host: examples/c-host natively on x86-64 and under qemu-user for aarch64 / riscv64
#      (examples/c-host/run.sh)
#
#   ffi/check.sh                 all steps
#   PACKJIT_CHECK_SKIP=c-host    skip steps by name (space-separated: valgrind c-host)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
packjit_install

skip=" ${PACKJIT_CHECK_SKIP:-} "
results=()
failed=0
out=target/ffi-check
mkdir -p "$out"

step() {
    local name=$1
    shift
    if [[ "$skip" == *" $name "* ]]; then
        results+=("$name:skipped")
        return
    fi
    echo "==== ffi/check.sh: $name"
    if "$@"; then
        results+=("$name:ok")
    else
        results+=("$name:FAIL")
        failed=1
    fi
}

valgrind_smoke() {
    cargo build -q -p packjit-ffi -p packjit-arm64 -p packjit-rv64 || return 1
    local t=target/debug
    cc -std=c99 -Wall -Wextra -Werror -pedantic -g -I include ffi/tests/valgrind/smoke.c \
        -L "$t" -lpackjit -o "$out/smoke" || return 1
    cc -std=c99 -Wall -Wextra -Werror -pedantic -shared -fPIC -I include \
        ffi/tests/c-backend/c_backend.c -o "$out/libpackjit_cbackend.so" || return 1
    LD_LIBRARY_PATH="$t" valgrind -q --leak-check=full --error-exitcode=1 \
        --errors-for-leak-kinds=definite,possible --keep-debuginfo=yes \
        "$out/smoke" "$t/libpackjit_arm64.so" "$t/libpackjit_rv64.so" \
        "$out/libpackjit_cbackend.so"
}

# JIT code really runs under memcheck: the x86-64 plugin's sandboxed and trusted programs,
# their stops, a region and a helper that checks the pointer it is given.
valgrind_run() {
    cargo build -q -p packjit-ffi -p packjit-x86-64 || return 1
    local t=target/debug
    cc -std=c99 -Wall -Wextra -Werror -pedantic -g -I include ffi/tests/valgrind/run.c \
        -L "$t" -lpackjit -o "$out/run" || return 1
    LD_LIBRARY_PATH="$t" valgrind -q --leak-check=full --error-exitcode=1 \
        --errors-for-leak-kinds=definite,possible --smc-check=all --keep-debuginfo=yes \
        "$out/run" "$t/libpackjit_x86_64.so"
}

# The header-drift, C99/C++ and C API tests are cargo tests (ffi/tests/header.rs, c_api.rs):
# the workspace run covers them on every arch. This script adds what cargo cannot run.
step valgrind valgrind_smoke
step valgrind-run valgrind_run
if [[ "$skip" == *" c-host "* ]]; then
    results+=("c-host:skipped")
else
    step c-host-x86_64 examples/c-host/run.sh x86_64
    step c-host-aarch64 examples/c-host/run.sh aarch64
    step c-host-riscv64 examples/c-host/run.sh riscv64
fi

if [ $failed -eq 0 ]; then
    echo "ffi/check.sh: PASS (${results[*]})"
else
    echo "ffi/check.sh: FAIL (${results[*]})"
fi
exit $failed
