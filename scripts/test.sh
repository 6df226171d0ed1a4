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
        echo "-- $name: ok in $((SECONDS - start)) s"
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

# Every published crate packages without a warning (metadata complete, path dependencies
# versioned); the test kit is not published. --no-verify: the builds below cover the code.
package_check() {
    local out
    out=$(cargo package --workspace --exclude packjit-testkit --no-verify --allow-dirty 2>&1) || {
        echo "$out"
        return 1
    }
    grep -c '^ *Packaged' <<<"$out" | sed 's/$/ crates packaged/'
    if grep -i 'warning' <<<"$out"; then
        return 1
    fi
}

# The runtime's examples, as a user runs them (each asserts what it prints).
objs="$PACKJIT_ROOT/target/examples-objs"
examples_run() {
    mkdir -p "$objs" &&
        clang-19 -O2 -g -target bpf -mcpu=v4 -c examples/bpf/count.c -o "$objs/count.o" &&
        cargo build -q -p packjit --examples || return 1
    local ex
    for ex in sandboxed_elf rbpf_switch hooks percpu maps ringbuf; do
        echo "-- cargo run -p packjit --example $ex"
        case $ex in
            sandboxed_elf) cargo run -q -p packjit --example "$ex" -- "$objs/count.o" ;;
            *) cargo run -q -p packjit --example "$ex" ;;
        esac || return 1
    done
}

# A crate outside the workspace depending on `packjit` by path, default features, no plugin
# directory: the first thing a new user tries. The workspace's lock file pins the same
# dependency versions (cargo trims what the crate does not use).
standalone_run() {
    mkdir -p "$objs" && cp Cargo.lock examples/standalone/Cargo.lock &&
        clang-19 -O2 -g -target bpf -mcpu=v4 -c examples/bpf/count.c -o "$objs/count.o" &&
        env -u PACKJIT_PLUGIN_DIR cargo run -q --manifest-path examples/standalone/Cargo.toml \
            --target-dir target/standalone -- "$objs/count.o"
}

step "format check" cargo fmt --all -- --check
step "clippy (host, -D warnings)" cargo clippy --workspace --all-targets -q -- -D warnings
step "rustdoc (-D warnings)" rustdoc_check
step "cargo package (no warnings)" package_check
step "host tests (x86-64)" cargo test --workspace
step "examples (cargo run -p packjit --example ...)" examples_run
step "a new crate on packjit's defaults (examples/standalone)" standalone_run
step "rbpf 0.4.1's own tests and examples on the bridge (type path changed only)" \
    scripts/rbpf-dropin.sh --check
# Each cross target in two steps, so the build time and the emulated run time show apart.
step "aarch64: cross-build the tests" \
    packjit_cross_cargo aarch64-unknown-linux-gnu test --workspace --lib --bins --tests --no-run
step "aarch64 tests under qemu-aarch64" \
    packjit_cross_cargo aarch64-unknown-linux-gnu test --workspace --lib --bins --tests
step "aarch64: rbpf 0.4.1's own tests and examples on the bridge, under qemu-aarch64" \
    scripts/rbpf-dropin.sh --check --cross aarch64-unknown-linux-gnu
step "riscv64: cross-build the tests (std built from source)" \
    packjit_cross_cargo riscv64gc-unknown-linux-gnu test --workspace --lib --bins --tests --no-run
step "riscv64 tests under qemu-riscv64" \
    packjit_cross_cargo riscv64gc-unknown-linux-gnu test --workspace --lib --bins --tests
if [ -x ffi/check.sh ]; then
    step "C API checks (header, C99/C++, valgrind, C host under qemu)" ffi/check.sh
fi

echo
printf '%s\n' "${summary[@]}"
echo "packjit tests: all steps passed"
