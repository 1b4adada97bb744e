#!/usr/bin/env bash
# Beside ../shared/gpu/fetch-deps.sh (yaml-cpp, doctest, the anchors): the other Debian packages the
# build needs that the GPU machine lacks (nlohmann-json, CLI11, PCRE2), put into .gpu-deps/ so that
# `source .gpu-deps/env.sh` unpacks them there too, and the Cut Cross-Entropy wheel that
# tools/bench/cce_anchor.py times (gpu_check.sh installs it there). Run from the project root, after
# fetch-deps.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)/.gpu-deps"
for p in nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0; do
  ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls cut_cross_entropy-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps cut-cross-entropy==25.1.1 -d .
ls -1
