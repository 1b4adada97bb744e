#!/usr/bin/env bash
# On a GPU machine, after tools/gpu_check.sh has built build-gpu, the loss head's experiments:
# 1. `fast` (two warp groups per CTA) against `fast_lockstep` (one), alternating, two runs each, on
#    the issue's two shapes and the trainer's; then `fast` with other cluster sizes and with two
#    256-thread groups on the short rows (kernels/cross_entropy.cu's knobs);
# 2. fused_linear's schedules (kernels/linear_cross_entropy.cu) on the benchmark's two shapes, one
#    bench_ce run per setting:
#   ZGPT_CE_LINEAR_ROW_BLOCK  rows per tile (unset: 8192, the default)
#   ZGPT_CE_LINEAR_CHUNK_MB   bytes of bf16 logits per tile (unset: 48)
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
  for variant in fast fast_lockstep; do
    "$build/bench_ce" --variants $variant --shapes $shapes --out "$out/${variant}_$rep.json" \
      > "$out/${variant}_$rep.log" 2>&1 || { echo "$variant failed"; tail -5 "$out/${variant}_$rep.log"; }
    grep -E "^fast" "$out/${variant}_$rep.log" | sed "s/^/run $rep  /"
  done
done | tee "$out/fast_summary.txt"
for knob in ZGPT_CE_FAST_CLUSTER=4 ZGPT_CE_FAST_THREADS=512; do
  env $knob "$build/bench_ce" --variants fast --shapes $shapes --out "$out/fast_$knob.json" \
    > "$out/fast_$knob.log" 2>&1 || { echo "fast $knob failed"; tail -5 "$out/fast_$knob.log"; }
  grep -E "^fast" "$out/fast_$knob.log" | sed "s/^/$knob  /"
done | tee -a "$out/fast_summary.txt"
# rows per tile : MB per tile (0: unset, the default; all: every row)
settings="0:0 all:96 all:192 all:48 16384:48 8192:24 8192:96 4096:24 2048:12"
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
  [ "$rb" = all ] && e+=("ZGPT_CE_LINEAR_ROW_BLOCK=1073741824")
  [ "$rb" != 0 ] && [ "$rb" != all ] && e+=("ZGPT_CE_LINEAR_ROW_BLOCK=$rb")
  [ "$mb" != 0 ] && e+=("ZGPT_CE_LINEAR_CHUNK_MB=$mb")
  run "bf16_rb${rb}_mb${mb}" "${e[@]}" --
  run "acc_rb${rb}_mb${mb}" "${e[@]}" -- --dweight-acc
  [ "$rb" != 0 ] && run "acc_outer_rb${rb}_mb${mb}" "${e[@]}" ZGPT_CE_LINEAR_ROWS_OUTER=1 -- --dweight-acc
done | tee "$out/linear_summary.txt"
