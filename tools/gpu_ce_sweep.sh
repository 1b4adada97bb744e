#!/usr/bin/env bash
# On a GPU machine, after tools/gpu_check.sh has built build-gpu, the loss head's experiments:
# 1. `fast` with ZGPT_CE_FAST_REFILL=barrier (the default) and =last_warp, and `fast_pingpong`
#    (kernels/cross_entropy.cu), alternating, two runs each, on the issue's two shapes and the
#    trainer's; then fast_pingpong on the large shape with 5- and 6-CTA clusters (4 stages
#    instead of 3, but fewer clusters fit a GPC);
# 2. fused_linear's schedules (kernels/linear_cross_entropy.cu) on the benchmark's two shapes, one
#    bench_ce run per setting:
#   ZGPT_CE_LINEAR_ROW_BLOCK  rows per tile (unset: all N, the default schedule)
#   ZGPT_CE_LINEAR_CHUNK_MB   bytes of bf16 logits per tile (unset: 96)
#   ZGPT_CE_LINEAR_ROWS_OUTER 1: row blocks outside the vocabulary chunks (fp32 dW only)
# with dW written as bf16 (the issue's benchmark) and added to an fp32 accumulator (the trainer's
# way). Writes one JSON per run and a summary table into the folder given (default $OUT).
#   bash tools/gpu_ce_sweep.sh "$OUT/sweep" [build-gpu]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/ce_sweep}}
build=${2:-build-gpu}
mkdir -p "$out"
shapes=32768x128256,8192x50304,65536x50257:50304
for rep in 1 2; do
  for mode in barrier last_warp pingpong; do
    variant=fast
    [ $mode = pingpong ] && variant=fast_pingpong
    ZGPT_CE_FAST_REFILL=$mode "$build/bench_ce" --variants $variant --shapes $shapes \
      --out "$out/fast_${mode}_$rep.json" > "$out/fast_${mode}_$rep.log" 2>&1 ||
      { echo "fast $mode failed"; tail -5 "$out/fast_${mode}_$rep.log"; }
    grep -E "^fast" "$out/fast_${mode}_$rep.log" | sed "s/^/$mode run $rep  /"
  done
done | tee "$out/fast_summary.txt"
for cluster in 5 6; do
  ZGPT_CE_FAST_CLUSTER=$cluster "$build/bench_ce" --variants fast_pingpong --shapes 32768x128256 \
    --out "$out/pingpong_c$cluster.json" > "$out/pingpong_c$cluster.log" 2>&1 ||
    { echo "pingpong cluster $cluster failed"; tail -5 "$out/pingpong_c$cluster.log"; }
  grep -E "^fast" "$out/pingpong_c$cluster.log" | sed "s/^/pingpong cluster $cluster  /"
done | tee -a "$out/fast_summary.txt"
# rows per tile : MB per tile (0: unset)
settings="0:0 0:48 0:192 16384:48 8192:24 8192:48 4096:12 4096:24 2048:12"
run() {  # name, then env assignments, then bench_ce flags after --
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$build/bench_ce" --variants fused_linear --iters 10 --out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1 || { echo "$name failed"; tail -5 "$out/$name.log"; return; }
  grep "^fused_linear" "$out/$name.log" | sed "s/^/$name  /"
}
for s in $settings; do
  rb=${s%%:*}
  mb=${s##*:}
  e=()
  [ "$rb" != 0 ] && e+=("ZGPT_CE_LINEAR_ROW_BLOCK=$rb")
  [ "$mb" != 0 ] && e+=("ZGPT_CE_LINEAR_CHUNK_MB=$mb")
  run "bf16_rb${rb}_mb${mb}" "${e[@]}" --
  run "acc_rb${rb}_mb${mb}" "${e[@]}" -- --dweight-acc
  [ "$rb" != 0 ] && run "acc_outer_rb${rb}_mb${mb}" "${e[@]}" ZGPT_CE_LINEAR_ROWS_OUTER=1 -- --dweight-acc
done | tee "$out/linear_summary.txt"
