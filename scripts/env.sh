# Shared set-up for packjit's scripts: installs what is missing, then exports the cross
# toolchain settings. Source it; do not run it.
#
# Cross builds use Debian's rustc-web (/usr/bin/rustc, /usr/bin/cargo): it ships the aarch64
# std and the std sources riscv64 needs for -Zbuild-std. Host builds use whatever `cargo` is
# first on PATH (rustup's on the dev machines).

PACKJIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PACKJIT_ROOT

packjit_need_install() {
    local missing=0
    for bin in qemu-aarch64 qemu-riscv64 aarch64-linux-gnu-gcc riscv64-linux-gnu-gcc \
               aarch64-linux-gnu-objdump riscv64-linux-gnu-objdump /usr/bin/rustc /usr/bin/cargo; do
        command -v "$bin" >/dev/null 2>&1 || missing=1
    done
    [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || missing=1
    [ -d /usr/lib/rustlib/src/rust/library ] || missing=1
    [ -e /usr/riscv64-linux-gnu/lib/libc.so.6 ] || missing=1
    command -v cc >/dev/null 2>&1 || missing=1
    command -v valgrind >/dev/null 2>&1 || missing=1
    # runtime/tests/gdb_e2e.rs drives the real gdb (x86-64 hosts).
    command -v gdb >/dev/null 2>&1 || missing=1
    # The ELF tests compile tests/bpf/*.c at test time with clang -target bpf -mcpu=v4
    # (cpu v4 needs LLVM 18+: Debian 12's default clang is 14, so clang-19).
    command -v clang-19 >/dev/null 2>&1 || missing=1
    return $((1 - missing))
}

packjit_install() {
    if ! packjit_need_install; then
        return 0
    fi
    local start=$SECONDS
    echo "== installing cross toolchains and qemu-user (Debian packages, a few minutes)" >&2
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo dpkg --add-architecture arm64
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
        qemu-user gcc-aarch64-linux-gnu gcc-riscv64-linux-gnu libc6-dev-riscv64-cross \
        libc6-dev-arm64-cross binutils-aarch64-linux-gnu binutils-riscv64-linux-gnu \
        rustc-web cargo-web libstd-rust-web-dev:arm64 rust-web-src gcc g++ valgrind clang-19 gdb
    echo "-- packages installed in $((SECONDS - start)) s" >&2
}

# Runs a long step of the README's commands, saying what it does before and how long it took
# after (a cross build can take minutes and prints nothing meanwhile):
# packjit_timed <what> <command...>
packjit_timed() {
    local what=$1
    shift
    local start=$SECONDS
    echo "   ($what ...)" >&2
    "$@"
    echo "   ($what: $((SECONDS - start)) s)" >&2
}

# Cross settings (exported for the cargo invocations below).
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Emulated programs run through scripts/qemu-run: the qemu-user command line for each arch and
# a watchdog against qemu's fork hang (see the script).
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$PACKJIT_ROOT/scripts/qemu-run aarch64"
export CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_LINKER=riscv64-linux-gnu-gcc
export CARGO_TARGET_RISCV64GC_UNKNOWN_LINUX_GNU_RUNNER="$PACKJIT_ROOT/scripts/qemu-run riscv64"
export PACKJIT_CROSS_TARGET_DIR="${PACKJIT_CROSS_TARGET_DIR:-$PACKJIT_ROOT/target-cross}"

# Runs Debian's cargo for a cross target: packjit_cross_cargo <triple> <cargo args...>
packjit_cross_cargo() {
    local triple=$1
    shift
    local sub=$1
    shift
    case "$triple" in
        aarch64-*)
            RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc /usr/bin/cargo "$sub" \
                --target "$triple" --target-dir "$PACKJIT_CROSS_TARGET_DIR" "$@"
            ;;
        riscv64*)
            # No prebuilt std for riscv64 in Debian: build it from rust-web-src.
            RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc /usr/bin/cargo "$sub" \
                -Zbuild-std=std,panic_unwind --target "$triple" \
                --target-dir "$PACKJIT_CROSS_TARGET_DIR" "$@"
            ;;
        *)
            echo "unknown cross triple $triple" >&2
            return 2
            ;;
    esac
}
