#!/usr/bin/env bash
# Side by side in one process: packjit (trusted, sandboxed) against rbpf's JIT, ubpf's JIT and
# llvmbpf (bpftime's LLVM JIT) on the clang-built programs of tests/bpf/peers (issue 45).
#
#   scripts/peers-native.sh UBPF_SRC LLVMBPF_SRC [--quick]
#
# UBPF_SRC: a checkout of https://github.com/iovisor/ubpf; LLVMBPF_SRC: a checkout of
# https://github.com/eunomia-bpf/llvmbpf (neither is vendored here; their commits are printed
# with the figures). LLVMBPF_SRC may be "-" for a run without llvmbpf. --quick: one round.
# Not part of scripts/test.sh: it needs LLVM 19 and a C++ compiler, which CI does not.
# Installs llvm-19-dev and libspdlog-dev (llvmbpf's logging) with apt-get when missing.
set -euo pipefail
source "$(dirname "$0")/env.sh"

if [ $# -lt 2 ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
ubpf=$(cd "$1" && pwd)
llvmbpf=$2
shift 2
[ -f "$ubpf/vm/inc/ubpf.h" ] || { echo "$ubpf: not a ubpf checkout" >&2; exit 2; }
if [ "$llvmbpf" != - ]; then
    llvmbpf=$(cd "$llvmbpf" && pwd)
    [ -f "$llvmbpf/include/llvmbpf.hpp" ] || { echo "$llvmbpf: not an llvmbpf checkout" >&2; exit 2; }
fi

missing=()
command -v clang-19 >/dev/null || missing+=(clang-19)
command -v c++ >/dev/null || missing+=(g++)
if [ "$llvmbpf" != - ]; then
    command -v llvm-config-19 >/dev/null || missing+=(llvm-19-dev)
    [ -f /usr/include/spdlog/spdlog.h ] || missing+=(libspdlog-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cd "$PACKJIT_ROOT"
# The workspace's lock file, so packjit's dependencies and rbpf are the versions it tests.
cp Cargo.lock benches/peers-native/Cargo.lock
export UBPF_SRC=$ubpf
if [ "$llvmbpf" != - ]; then
    export LLVMBPF_SRC=$llvmbpf LLVM_CONFIG=${LLVM_CONFIG:-llvm-config-19}
else
    unset LLVMBPF_SRC
fi
exec cargo bench --manifest-path benches/peers-native/Cargo.toml --target-dir target/peers-native \
    --bench peers-native -- "$@"
