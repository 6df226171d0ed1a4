#!/usr/bin/env bash
# Regenerates include/packjit.h from ffi/src (lib.rs and its modules, + the plugin ABI types of
# packjit-plugin-api) with cbindgen, as a library call inside the header test, so no cbindgen
# CLI is needed. Commit the result; ffi/tests/header.rs fails when it drifts.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKJIT_BLESS=1 cargo test -q -p packjit-ffi --test header checked_in_header_matches_a_fresh_generation
echo "include/packjit.h regenerated"
