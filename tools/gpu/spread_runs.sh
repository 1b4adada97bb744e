#!/usr/bin/env bash
# On a GPU machine: one run trained by ours and by the parity tool's PyTorch (tools/dev/parity_torch.py)
# from the same weights and batches, and again from starts moved by 1e-6, as jobs spread over the
# GPUs, so that each trainer's spread is measured and the two can be told apart beyond chaos. Job k
# trains ours (deterministic: pooled once), ours from jittered start k, PyTorch from our weights
# (not deterministic: each is a run) and PyTorch from jittered start k; with OURS_SETS (settings
# such as train.fp32_residual=true; several settings separated by ";"), ours with each from start
# k, and from our weights in the first job a call runs (ours is deterministic: once is enough).
# With OURS_ONLY=1 a job trains ours alone (no PyTorch): a kernel ablation whose samples pool with
# the PyTorch runs of earlier jobs in OUT (start the job numbers past them, as the jobs already
# there are skipped). Then tools/dev/spread_compare.py pools the jobs into OUT/spread.json.
#   source .gpu-deps/env.sh && bash tools/gpu/spread_runs.sh OUT BUILD CONFIG STEPS [--set K=V ...]
# JOBS (4): jobs; PER_GPU (1): jobs at once on one GPU (two jobs with PyTorch runs on one H200 ran
# each of its trainings at half speed: no gain); GPUS (all): the GPUs to use, such as "1"
# to leave GPU 0 to a benchmark; TORCH_EXTRA: more --torch-variants (e.g. bf16_storage) of jobs 1
# to TORCH_EXTRA_JOBS (1; each such run is a sample of its own); TIMEOUT (0: none): seconds a job
# may run, so that a device call's limit leaves time to collect what finished. Each job writes
# OUT/job<k>.json and its log; a job whose JSON is there already is skipped, so a run cut short by
# a call's limit resumes (clear OUT to start over). Other pairs of samples (ours with OURS_SETS
# against PyTorch, ...): spread_compare.py --pair on the jobs' files.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=$1 bin=$2 cfg=$3 steps=$4
shift 4
jobs=${JOBS:-4} per_gpu=${PER_GPU:-1}
read -ra gpu_list <<<"${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ')}"
gpus=${#gpu_list[@]}
[ "$gpus" -ge 1 ] || { echo "spread_runs.sh: no GPU (nvidia-smi lists none)" >&2; exit 1; }
mkdir -p "$out"
job() {  # k gpu, then parity_torch's arguments
  local k=$1 g=$2 tv="jitter$1" ov=(--ours-variant "model.init_jitter=1e-6,model.init_jitter_seed=$1")
  shift 2
  [ "$k" -le "${TORCH_EXTRA_JOBS:-1}" ] && [ -n "${TORCH_EXTRA:-}" ] && tv="$tv,$TORCH_EXTRA"
  local sets theirs=(--torch-variants "$tv")
  IFS=';' read -ra sets <<<"${OURS_SETS:-}"
  for s in "${sets[@]}"; do  # from our weights once (ours is deterministic), from start k in each
    [ "$k" = "$first" ] && ov+=(--ours-variant "$s")
    ov+=(--ours-variant "$s,model.init_jitter=1e-6,model.init_jitter_seed=$k")
  done
  [ "${OURS_ONLY:-0}" = 1 ] && theirs=(--ours-only)
  CUDA_VISIBLE_DEVICES=$g timeout "${TIMEOUT:-0}" python3 tools/dev/parity_torch.py -c "$cfg" --steps "$steps" \
    --device cuda "$@" "${theirs[@]}" "${ov[@]}" --bin "$bin" --work "/tmp/spread_job$k" \
    --out "$out/job$k.json.tmp" > "$out/job$k.log" 2>&1 && mv "$out/job$k.json.tmp" "$out/job$k.json"
  echo "job $k on GPU $g: exit $?"
}
first=0  # the first job this call runs: it trains each of OURS_SETS from our weights too
for k in $(seq 1 "$jobs"); do
  [ -s "$out/job$k.json" ] || { first=$k; break; }
done
for k in $(seq 1 "$jobs"); do
  [ -s "$out/job$k.json" ] && continue
  while [ "$(jobs -rp | wc -l)" -ge $((gpus * per_gpu)) ]; do wait -n; done
  job "$k" "${gpu_list[$(((k - 1) % gpus))]}" "$@" &
done
wait
python3 tools/dev/spread_compare.py "$out"/job*.json --out "$out/spread.json"
