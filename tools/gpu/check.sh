#!/usr/bin/env bash
# On a GPU machine: build for Hopper, run every test (the GPU ones included), the loss-head
# benchmark and the PyTorch/Liger anchors, writing logs and JSON into the folder given (default
# $OUT). Prepare .gpu-deps once on the development machine:
#   ../shared/gpu/fetch-deps.sh && bash tools/gpu/extra_deps.sh
# then carry .gpu-deps to the GPU machine and start it there:
#   source .gpu-deps/env.sh && ZGPT_COMMIT=<hash> bash tools/gpu/check.sh "$OUT"
# (the device copy of the tree has no .git, so the commit is passed in). Set SKIP_BENCH=1 or
# SKIP_ANCHORS=1 to leave out the benchmarks, SKIP_CTEST=1 the tests (a device call is limited to
# 10 minutes: the tests can then run in a second call, `ctest --test-dir build-gpu`).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  echo "commit ${ZGPT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null; [ $? = 1 ] && echo +modified)}"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
# the oracle files and the GPT-2 vocabulary: ../shared beside the checkout, or the copy that
# tools/gpu/extra_deps.sh put in .gpu-deps/shared (never committed)
if [ ! -d ../shared/data ] && [ -d .gpu-deps/shared/data ]; then
  export ZGPT_ORACLES=${ZGPT_ORACLES:-$PWD/.gpu-deps/shared/data/oracles}
  export ZGPT_GPT2_DIR=${ZGPT_GPT2_DIR:-$PWD/.gpu-deps/shared/data/gpt2}
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j16 > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "built"
if [ "${SKIP_CTEST:-0}" != 1 ]; then
  ctest --test-dir build-gpu --output-on-failure -j4 > "$out/ctest.log" 2>&1; echo "ctest exit $?"
  grep -E "tests passed|tests failed|Passed|Failed|Skipped" "$out/ctest.log" | tail -14
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  build-gpu/bench_ce --out "$out/bench_ce.json" 2>&1 | tee "$out/bench_ce.log"
  if [ "${SKIP_ANCHORS:-0}" != 1 ]; then
    OUT="$out" python3 tools/bench/ce_anchors.py > "$out/anchors.log" 2>&1
    tail -12 "$out/anchors.log"
  fi
  # Apple's Cut Cross-Entropy, where tools/gpu/extra_deps.sh put its wheel
  if ls .gpu-deps/cut_cross_entropy-*.whl > /dev/null 2>&1 && [ "${SKIP_ANCHORS:-0}" != 1 ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-deps/site .gpu-deps/cut_cross_entropy-*.whl
    PYTHONPATH=/tmp/gpu-deps/site${PYTHONPATH:+:$PYTHONPATH} python3 tools/bench/cce_anchor.py \
      --out "$out/cce_anchor.json" > "$out/cce_anchor.log" 2>&1
    tail -9 "$out/cce_anchor.log"
  fi
fi
