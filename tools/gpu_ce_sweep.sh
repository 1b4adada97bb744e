#!/usr/bin/env bash
# On a GPU machine, after tools/gpu_check.sh has built build-gpu, the loss head's experiments:
# 1. `fast`'s kernels (two or three warp groups per CTA, buffers copied whole or in parts),
#    alternating, two runs each, on the benchmark's two shapes and the trainer's, then each one traced
#    (ZGPT_CE_FAST_TRACE: where a row's time goes); EXTRA_FAST_SETTINGS adds settings
#    (comma-separated knobs, e.g. ZGPT_CE_FAST_CLUSTER=4,ZGPT_CE_FAST_GROUPS=3);
# 2. fused_linear's schedules (kernels/linear_cross_entropy.cu) on the benchmark's two shapes, one
#    bench_ce run per setting:
#   ZGPT_CE_LINEAR_ROW_BLOCK  rows per tile (unset: 8192, the default)
#   ZGPT_CE_LINEAR_CHUNK_MB   bytes of bf16 logits per tile (unset: 48)
#   ZGPT_CE_LINEAR_ROWS_OUTER 1: row blocks outside the vocabulary chunks (fp32 dW only)
# with dW written as bf16 (the loss-head benchmark's) and added to an fp32 accumulator (the trainer's
# way; SKIP_LINEAR=1 leaves these out). Writes the summary tables into the folder given
# (default $OUT), and every run's JSON and log into its runs.tar.gz.
#   bash tools/gpu_ce_sweep.sh "$OUT/sweep" [build-gpu]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/ce_sweep}}
build=${2:-build-gpu}
mkdir -p "$out"
# the device returns few files from $OUT: each run's JSON and log go to $runs, packed into
# $out/runs.tar.gz when the script ends; the summaries go to $out
runs=$(mktemp -d)
trap 'tar czf "$out/runs.tar.gz" -C "$runs" . && rm -rf "$runs"' EXIT
shapes=32768x128256,8192x50304,65536x50257:50304
# fast's kernels (kernels/cross_entropy.cu's knobs): the default (buffers in two copies; three
# 256-thread groups for rows over 128 KB, two of 512 below), two groups for every row, one copy
# per buffer (with two groups: the default until 7f3804e), four copies (kernels of 512-thread
# groups only); alternating, two runs each
fast_settings="default ZGPT_CE_FAST_GROUPS=2 ZGPT_CE_FAST_PARTS=1
  ZGPT_CE_FAST_GROUPS=2,ZGPT_CE_FAST_PARTS=1 ZGPT_CE_FAST_PARTS=4 ${EXTRA_FAST_SETTINGS:-}"
for rep in 1 2; do
  for setting in $fast_settings; do
    envs=()
    [ "$setting" != default ] && IFS=, read -ra envs <<< "$setting"
    name=fast_${setting//[=,]/_}_$rep
    env "${envs[@]}" "$build/bench_ce" --variants fast --shapes $shapes --out "$runs/$name.json" \
      > "$runs/$name.log" 2>&1 || { echo "$setting failed"; tail -5 "$runs/$name.log"; }
    grep -E "^fast" "$runs/$name.log" | sed "s/^/run $rep $setting  /"
  done
done | tee "$out/fast_summary.txt"
# where a row's time goes (the traced kernel; its clock reads cost a little)
for setting in $fast_settings; do
  envs=(ZGPT_CE_FAST_TRACE=1)
  [ "$setting" != default ] && IFS=, read -ra more <<< "$setting" && envs+=("${more[@]}")
  for shape in 32768x128256 8192x50304; do
    env "${envs[@]}" "$build/bench_ce" --variants fast --iters 2 --shapes $shape \
      > "$runs/trace_${setting//[=,]/_}_$shape.log" 2>&1
    grep "fast trace" "$runs/trace_${setting//[=,]/_}_$shape.log" | tail -1 | sed "s/^/$setting $shape  /"
  done
done | tee -a "$out/fast_summary.txt"
[ "${SKIP_LINEAR:-0}" = 1 ] && exit 0
# rows per tile : MB per tile (0: unset, the default; all: every row)
settings="0:0 all:96 all:192 all:48 16384:48 8192:24 8192:96 4096:24 2048:12"
run() {  # name, then env assignments, then bench_ce flags after --
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$build/bench_ce" --variants fused_linear --iters 10 --out "$runs/$name.json" "$@" \
    > "$runs/$name.log" 2>&1 || { echo "$name failed"; tail -5 "$runs/$name.log"; return; }
  grep "^fused_linear" "$runs/$name.log" | sed "s/^/$name  /"
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
