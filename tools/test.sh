#!/usr/bin/env bash
# The README's test command: install dependencies, build, run every test through ctest.
# GPU tests and oracle tests report "Skipped" with their reason where no GPU / no oracle files exist.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
ctest --test-dir build --output-on-failure "$@"
