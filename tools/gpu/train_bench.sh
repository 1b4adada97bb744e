#!/usr/bin/env bash
# On a GPU machine: the CUDA trainer's benchmark for docs/results (GPT-2 124M, B=64, T=1024, bf16,
# random tokens): the default kernels with the per-op table, the loss head in one piece
# (--set kernels.head_chunks=1, against the default pipelined one), the fused_linear head, vocabulary
# 128256 with both heads, the naive attention and recompute_gelu. One JSON per run in the folder.
# With DATA set to a GPT-2 token shard (prepare_data --tokenizer gpt2), the default kernels also
# run on its text (real text repeats tokens, which random tokens do not).
#   source .gpu-deps/env.sh && [DATA=shard.bin] bash tools/gpu/train_bench.sh "$OUT" [build-gpu]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/gpu_train_bench}}
bin=${2:-build-gpu}
mkdir -p "$out"
cfg=configs/gpt2-124m.yaml
run() {  # name, steps, first timed step, then bench_train arguments
  local name=$1 steps=$2 from=$3; shift 3
  echo "== $name: bench_train -c $cfg --steps $steps --from $from $*"
  "$bin/bench_train" -c $cfg --steps "$steps" --from "$from" --out "$out/train_$name.json" "$@" 2>&1 \
    | grep -v "^step " | tee "$out/train_$name.log"
}
run fast 40 10 --ops
if [ -n "${DATA:-}" ]; then run real_text 40 10 --data "$DATA" --ops; fi
run head_chunks1 40 10 --set kernels.head_chunks=1
run fused_linear 40 10 --set kernels.cross_entropy=fused_linear --ops
run v128k_fast 40 10 --set model.vocab_size=128256
run v128k_fused_linear 40 10 --set model.vocab_size=128256 --set kernels.cross_entropy=fused_linear
run recompute_gelu 40 10 --set train.recompute_gelu=true
run naive_attention 15 5 --set kernels.attention=naive
