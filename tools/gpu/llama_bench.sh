#!/usr/bin/env bash
# On a GPU machine: the trainer on a Llama-style config beside Hugging Face's LlamaForCausalLM of
# the same shape (tools/bench/llama_anchor.py: torch.compile, sdpa, bf16 autocast, fused AdamW) in
# the same call. Both take bench_train's random tokens, one micro-batch a step, as
# tools/gpu/scale_bench.sh runs GPT-2; ours adds its per-op table (--ops). Both summaries go to
# OUT/bench.log (appended), the JSONs beside it.
#   source .gpu-deps/env.sh && bash tools/gpu/llama_bench.sh OUT [BUILD]
# CONFIG (default configs/llama-124m.yaml), B (64), STEPS (30), FROM (10: steps FROM..STEPS are
# timed, by both); SETS: more --set arguments for both (e.g. "--set train.seq_len=2048"); EXTRA:
# more bench_train arguments; SKIP_OURS=1 or SKIP_ANCHOR=1 runs one side alone. The anchor needs
# transformers: the wheels of .gpu-deps/hf (tools/gpu/extra_deps.sh) are installed into
# /tmp/gpu-deps/site when python3 cannot import it.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/bench_ours.sh
out=${1:-${OUT:-/tmp/gpu_llama_bench}}
bin=${2:-build-gpu}
cfg=${CONFIG:-configs/llama-124m.yaml}
B=${B:-64} steps=${STEPS:-30} from=${FROM:-10}
name=$(basename "$cfg" .yaml)
mkdir -p "$out"
# shellcheck disable=SC2086  # SETS and EXTRA are lists of arguments
sets=(--set train.grad_accum=1 --set train.batch_size=$B ${SETS:-})

if [ "${SKIP_OURS:-0}" != 1 ]; then
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  bench_ours "$out" "$bin" "$cfg" "$name" "ours $name B=$B" "${sets[@]}" --steps "$steps" \
    --from "$from" ${EXTRA:-}
fi

if [ "${SKIP_ANCHOR:-0}" != 1 ]; then
  if ! python3 -c "import transformers" 2>/dev/null && ls .gpu-deps/hf/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-deps/site .gpu-deps/hf/*.whl
    export PYTHONPATH=/tmp/gpu-deps/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  echo "== HF Llama torch.compile $name B=$B"
  t0=$SECONDS
  python3 tools/bench/llama_anchor.py -c "$cfg" "${sets[@]}" --steps "$steps" --from "$from" \
    --out "$out/anchor_$name.json" > "$out/anchor_$name.log" 2>&1
  echo "wall $((SECONDS - t0)) s (start-up and compilation included)"
  { echo "== HF Llama torch.compile $name B=$B"; grep -v "^step " "$out/anchor_$name.log" | tail -4; } \
    >> "$out/bench.log"
  tail -2 "$out/anchor_$name.log"
  rm "$out/anchor_$name.log"
fi
