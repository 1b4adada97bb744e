#!/usr/bin/env bash
# The README's test command: install dependencies, build, run every test through ctest.
# Tests that cannot run here (no GPU, no oracle files) are listed first with the reason, and ctest
# reports them as "Skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
for t in build/tests/test_*; do [ -x "$t" ] && "$t" --why-skip; done
ctest --test-dir build --output-on-failure "$@"
