#!/usr/bin/env bash
# Beside ../shared/gpu/fetch-deps.sh (yaml-cpp, doctest, the anchors): the other Debian packages the
# build needs that the GPU machine lacks (nlohmann-json, CLI11, PCRE2), put into .gpu-deps/ so that
# `source .gpu-deps/env.sh` unpacks them there too; the Cut Cross-Entropy wheel that
# tools/bench/cce_anchor.py times (gpu_check.sh installs it there); in shared/ the team's bench
# scripts and test data (../shared/bench, the GPT-2 vocabulary, the oracles), which the GPU machine
# does not get beside the tree (scale_bench.sh and multi_check.sh start the end-to-end anchor from
# .gpu-deps/shared/bench, check.sh finds the oracles there); and with HF=1, in hf/ the Python 3.12
# wheels of transformers 4.57.1 and its dependencies for tools/bench/llama_anchor.py (install them
# with `python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-deps/site .gpu-deps/hf/*.whl`;
# about 60 MB, more than a device call carries beside the z-loss texts). llm.c's train_gpt2.py, the
# anchor's trainer, goes into .gpu-deps/llmc by hand (shared/bench/e2e_anchor.sh says how).
# Run from the project root, after fetch-deps.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)/.gpu-deps"
for p in nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0; do
  ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls cut_cross_entropy-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps cut-cross-entropy==25.1.1 -d .
ls -1
shared=../../shared
mkdir -p shared/data
cp -r "$shared/bench" shared/
for d in gpt2 oracles; do
  if [ -d "$shared/data/$d" ]; then cp -r "$shared/data/$d" shared/data/; fi
done
[ "${HF:-0}" = 1 ] || exit 0
# numpy, filelock, fsspec and typing-extensions are left out: the GPU image's PyTorch has them, and a
# second copy ahead of them on PYTHONPATH could differ from the one PyTorch was built against
if ! ls hf/transformers-4.57.1-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d hf transformers==4.57.1
  rm -f hf/numpy-*.whl hf/filelock-*.whl hf/fsspec-*.whl hf/typing_extensions-*.whl
fi
ls -1 hf
