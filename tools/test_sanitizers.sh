#!/usr/bin/env bash
# The CPU-only build (-DZGPT_CUDA=OFF, the one a machine without nvcc gets) with AddressSanitizer
# and UndefinedBehaviorSanitizer, running CPU tests through ctest. Any sanitizer report fails the
# test that caused it (UBSan does not recover). Extra arguments go to ctest; BUILD_TARGETS builds
# only those. -O0 with line tables and a unity build keep the compile short on 2 cores (-O1 took
# 1.8x as long to compile, 9.4 of CI's 21 minutes at 015adaa); CI runs
# the subset in .ci/run. Everything:
#   bash tools/test_sanitizers.sh
# The tools against the bad-input corpus only:
#   BUILD_TARGETS="train sample export_hf sweep prepare_data train_bpe" bash tools/test_sanitizers.sh -R bad_inputs
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SANITIZER_BUILD_DIR:-build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B $dir -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O0 -g1" \
  -DCMAKE_UNITY_BUILD=ON -DZGPT_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" > /dev/null
targets=(); for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build $dir -j"$(nproc)" "${targets[@]}"
# OpenMP's and OpenBLAS's thread pools live until exit: not our leaks.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir $dir --output-on-failure "$@"
