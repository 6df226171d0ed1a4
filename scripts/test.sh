#!/usr/bin/env bash
# The whole packjit test suite: host tests, then the arm64 and riscv64 test runs under
# qemu-user (backends loaded as real shared objects, code executed), then the C API checks.
# Installs what is missing first (Debian packages; see scripts/env.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PACKJIT_ROOT"
packjit_install

# The build directories of the host and both cross targets need several GB; a full disk
# shows up much later as an unrelated-looking link or archive error, so say it up front.
free_kib=$(df -Pk "$PACKJIT_ROOT" | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((8 * 1024 * 1024)) ]; then
    echo "packjit tests: warning: only $((free_kib / 1024)) MiB free under $PACKJIT_ROOT;" \
        "the suite's build directories need about 8 GiB" >&2
fi

summary=()
step() {
    local name=$1
    shift
    echo
    echo "== $name"
    local start=$SECONDS
    if "$@"; then
        summary+=("ok      $name ($((SECONDS - start)) s)")
    else
        summary+=("FAILED  $name ($((SECONDS - start)) s)")
        printf '%s\n' "${summary[@]}"
        echo "packjit tests: FAILED at: $name"
        exit 1
    fi
}

# Broken intra-doc links and stray HTML in doc comments fail like lints do. The C API's crate
# is also named `packjit` (for libpackjit.so), so it is documented on its own.
rustdoc_check() {
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --exclude packjit-ffi --no-deps -q &&
        RUSTDOCFLAGS="-D warnings" cargo doc -p packjit-ffi --no-deps -q
}

step "format check" cargo fmt --all -- --check
step "clippy (host, -D warnings)" cargo clippy --workspace --all-targets -q -- -D warnings
step "rustdoc (-D warnings)" rustdoc_check
step "host tests (x86-64)" cargo test --workspace
step "aarch64 tests under qemu-aarch64" \
    packjit_cross_cargo aarch64-unknown-linux-gnu test --workspace --lib --bins --tests
step "riscv64 tests under qemu-riscv64" \
    packjit_cross_cargo riscv64gc-unknown-linux-gnu test --workspace --lib --bins --tests
if [ -x ffi/check.sh ]; then
    step "C API checks (header, C99/C++, valgrind, C host under qemu)" ffi/check.sh
fi

echo
printf '%s\n' "${summary[@]}"
echo "packjit tests: all steps passed"
