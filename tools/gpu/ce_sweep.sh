#!/usr/bin/env bash
# On a GPU machine, after tools/gpu/check.sh has built build-gpu, the loss head's experiments:
# 1. `fast`'s kernels (two or three warp groups per CTA, buffers copied whole or in parts),
#    alternating, two runs each, on the benchmark's two shapes and the trainer's, then each one traced
#    (bench_ce --trace: where a row's time goes); EXTRA_FAST_SETTINGS adds settings (each a
#    comma-separated list of the config's tuning keys, short for kernels.cross_entropy_tuning.*,
#    e.g. cluster=4,groups=3);
# 2. fused_linear's schedules (kernels/loss_head/linear_cross_entropy.cu) on the benchmark's two shapes, one
#    bench_ce run per setting of the config's keys (bench_ce --set):
#   kernels.linear_ce_row_block   rows per tile (0: 8192, the default)
#   kernels.linear_ce_chunk_mb    MB of bf16 logits per tile (0: 48)
#   kernels.linear_ce_rows_outer  true: row blocks outside the vocabulary chunks (fp32 dW only)
# with dW written as bf16 (the loss-head benchmark's) and added to an fp32 accumulator (the trainer's
# way; SKIP_LINEAR=1 leaves these out). Writes the summary tables into the folder given
# (default $OUT), and every run's JSON and log into its runs.tar.gz.
#   bash tools/gpu/ce_sweep.sh "$OUT/sweep" [build-gpu]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/ce_sweep}}
build=${2:-build-gpu}
mkdir -p "$out"
# the device returns few files from $OUT: each run's JSON and log go to $runs, packed into
# $out/runs.tar.gz when the script ends; the summaries go to $out
runs=$(mktemp -d)
trap 'tar czf "$out/runs.tar.gz" -C "$runs" . && rm -rf "$runs"' EXIT
shapes=32768x128256,8192x50304,65536x50257:50304
# fast's kernels (kernels.cross_entropy_tuning.*): the default (buffers in two copies; three
# 256-thread groups for rows over 128 KB, two of 512 below), two groups for every row, one copy
# per buffer (with two groups: the default until 7f3804e), four copies (kernels of 512-thread
# groups only); alternating, two runs each
fast_settings="default groups=2 parts=1 groups=2,parts=1 parts=4 ${EXTRA_FAST_SETTINGS:-}"
# "groups=2,parts=1" -> --set kernels.cross_entropy_tuning.groups=2 --set ...parts=1
tuning_flags() {
  flags=()
  [ "$1" = default ] && return
  local knobs
  IFS=, read -ra knobs <<< "$1"
  for k in "${knobs[@]}"; do flags+=(--set "kernels.cross_entropy_tuning.$k"); done
}
for rep in 1 2; do
  for setting in $fast_settings; do
    tuning_flags "$setting"
    name=fast_${setting//[=,]/_}_$rep
    "$build/bench_ce" --variants fast --shapes $shapes --out "$runs/$name.json" "${flags[@]}" \
      > "$runs/$name.log" 2>&1 || { echo "$setting failed"; tail -5 "$runs/$name.log"; }
    grep -E "^fast" "$runs/$name.log" | sed "s/^/run $rep $setting  /"
  done
done | tee "$out/fast_summary.txt"
# where a row's time goes (the traced kernel; its clock reads cost a little)
for setting in $fast_settings; do
  tuning_flags "$setting"
  for shape in 32768x128256 8192x50304; do
    "$build/bench_ce" --variants fast --iters 2 --shapes $shape --trace "${flags[@]}" \
      > "$runs/trace_${setting//[=,]/_}_$shape.log" 2>&1
    grep "fast trace" "$runs/trace_${setting//[=,]/_}_$shape.log" | tail -1 | sed "s/^/$setting $shape  /"
  done
done | tee -a "$out/fast_summary.txt"
[ "${SKIP_LINEAR:-0}" = 1 ] && exit 0
# rows per tile : MB per tile (0: unset, the default; all: every row)
settings="0:0 all:96 all:192 all:48 16384:48 8192:24 8192:96 4096:24 2048:12"
run() {  # name, then bench_ce flags
  local name=$1
  shift
  "$build/bench_ce" --variants fused_linear --iters 10 --out "$runs/$name.json" "$@" \
    > "$runs/$name.log" 2>&1 || { echo "$name failed"; tail -5 "$runs/$name.log"; return; }
  grep "^fused_linear" "$runs/$name.log" | sed "s/^/$name  /"
}
for s in $settings; do
  rb=${s%%:*}
  mb=${s##*:}
  e=()
  [ "$rb" = all ] && e+=(--set kernels.linear_ce_row_block=1073741824)
  [ "$rb" != 0 ] && [ "$rb" != all ] && e+=(--set "kernels.linear_ce_row_block=$rb")
  [ "$mb" != 0 ] && e+=(--set "kernels.linear_ce_chunk_mb=$mb")
  run "bf16_rb${rb}_mb${mb}" "${e[@]}"
  run "acc_rb${rb}_mb${mb}" "${e[@]}" --dweight-acc
  [ "$rb" != 0 ] && run "acc_outer_rb${rb}_mb${mb}" "${e[@]}" --set kernels.linear_ce_rows_outer=true --dweight-acc
done | tee "$out/linear_summary.txt"
