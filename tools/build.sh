#!/usr/bin/env bash
# Configures and builds (Release) into $BUILD_DIR (default build/); $BUILD_TARGETS, when set, names
# the targets to build (default: all). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=(); for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" -j"$(nproc)" "${targets[@]}"
