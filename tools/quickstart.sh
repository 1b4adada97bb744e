#!/usr/bin/env bash
# The README's main job: install dependencies, build, fetch the King James Bible from the Debian
# package bible-kjv, make character-level shards, and train configs/kjv-char.yaml (a few minutes on
# a 2-core CPU). Extra arguments go to train, e.g. --set train.max_steps=200.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
if ! command -v bible >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bible-kjv >/dev/null
fi
# With a GPU: the whole build (build/). Without one, the CUDA kernels would only cost minutes of
# compiling: the CPU trainer alone goes into build-cpu/ and starts at once.
if nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  bin=build
  bash tools/build.sh
else
  bin=build-cpu
  echo "no GPU here (nvidia-smi finds none): building the CPU trainer only, into $bin/"
  BUILD_DIR=$bin BUILD_TARGETS="train prepare_data" bash tools/build.sh -DZGPT_CUDA=OFF
fi
mkdir -p data/shards
if [ ! -f data/shards/kjv_char/tokenizer.json ]; then
  bible -f "Gen1:1-Rev22:21" > data/shards/kjv.txt
  $bin/prepare_data --input data/shards/kjv.txt --out data/shards/kjv_char --tokenizer char
fi
exec $bin/train -c configs/kjv-char.yaml "$@"
