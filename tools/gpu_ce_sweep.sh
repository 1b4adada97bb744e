#!/usr/bin/env bash
# On a GPU machine, after tools/gpu_check.sh has built build-gpu, the loss head's experiments:
# 1. `fast` (two warp groups per CTA) and `fast_lockstep` (one) with its refill modes
#    (kernels/cross_entropy.cu), alternating, two runs each, on the issue's two shapes and the
#    trainer's; then `fast` with 4-CTA clusters (the large shape's 3 stages) and with two 512-thread groups;
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
  for mode in two_groups barrier last_warp; do
    variant=fast_lockstep
    [ $mode = two_groups ] && variant=fast
    ZGPT_CE_FAST_REFILL=$mode "$build/bench_ce" --variants $variant --shapes $shapes \
      --out "$out/fast_${mode}_$rep.json" > "$out/fast_${mode}_$rep.log" 2>&1 ||
      { echo "fast $mode failed"; tail -5 "$out/fast_${mode}_$rep.log"; }
    grep -E "^fast" "$out/fast_${mode}_$rep.log" | sed "s/^/$mode run $rep  /"
  done
done | tee "$out/fast_summary.txt"
for knob in ZGPT_CE_FAST_CLUSTER=4 ZGPT_CE_FAST_THREADS=1024; do
  env $knob "$build/bench_ce" --variants fast --shapes $shapes --out "$out/fast_$knob.json" \
    > "$out/fast_$knob.log" 2>&1 || { echo "fast $knob failed"; tail -5 "$out/fast_$knob.log"; }
  grep -E "^fast" "$out/fast_$knob.log" | sed "s/^/$knob  /"
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
