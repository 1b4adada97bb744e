#!/usr/bin/env bash
# On a GPU machine: the trainer at every GPT-2 size beside PyTorch (llm.c's train_gpt2.py with
# torch.compile + flash) in the same call. For each size: bench_train on random tokens (one
# micro-batch a step, as the anchor runs it), with the per-op table (--ops), then the anchor.
#   source .gpu-deps/env.sh && bash tools/gpu/scale_bench.sh OUT [BUILD] [SIZES]
# SIZES: a list of name:B pairs (default "124m:64 350m:32 774m:32 1558m:16"); LLMC: the folder
# holding train_gpt2.py (default .gpu-deps/llmc); SKIP_ANCHORS=1 runs ours alone; EXTRA: more
# bench_train arguments for every size; PROFILE=1 also profiles PyTorch's step by op family beside
# ours (tools/bench/torch_step_profile.py: OUT/torch_profile_NAME.json, the table in bench.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/bench_ours.sh
out=${1:-${OUT:-/tmp/gpu_scale_bench}}
bin=${2:-build-gpu}
sizes=${3:-"124m:64 350m:32 774m:32 1558m:16"}
llmc=${LLMC:-.gpu-deps/llmc}
anchor=${ANCHOR:-.gpu-deps/shared/bench/e2e_anchor.sh}
mkdir -p "$out"
declare -A layers=([124m]=12 [350m]=24 [774m]=36 [1558m]=48)
for s in $sizes; do
  name=${s%%:*} B=${s##*:}
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  bench_ours "$out" "$bin" configs/gpt2-$name.yaml "$name" "ours $name B=$B" \
    --set train.grad_accum=1 --set train.batch_size=$B --steps ${STEPS:-30} --from ${FROM:-10} \
    ${EXTRA:-}
  if [ "${SKIP_ANCHORS:-0}" != 1 ]; then
    echo "== torch.compile $name B=$B"
    MODEL=d${layers[$name]} B=$B STEPS=${ASTEPS:-30} bash "$anchor" "$llmc" > "$out/anchor.log" 2>&1
    { echo "== torch.compile $name B=$B"; tail -3 "$out/anchor.log"; } >> "$out/bench.log"
    tail -1 "$out/anchor.log"
  fi
  if [ "${PROFILE:-0}" = 1 ]; then
    echo "== PyTorch's step by op family $name B=$B"
    python3 tools/bench/torch_step_profile.py --llmc "$llmc/train_gpt2.py" \
      --model "d${layers[$name]}" --batch "$B" --ours "$out/ours_$name.json" \
      --out "$out/torch_profile_$name.json" > "$out/profile.log" 2>&1
    { echo "== PyTorch's step by op family $name B=$B"
      grep -E "^(\||PyTorch:)" "$out/profile.log"; } >> "$out/bench.log"
    grep -E "^(\||PyTorch:)" "$out/profile.log" || tail -5 "$out/profile.log"
  fi
done
