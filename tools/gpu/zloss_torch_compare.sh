#!/usr/bin/env bash
# On a GPU machine: the z-loss study (configs/zloss-16m.yaml) trained by ours and by the parity
# tool's PyTorch trainer (tools/dev/parity_torch.py), as separate jobs so that they run side by
# side: at every (LR, z-loss weight), PyTorch from its own draw of the weights (`init`,
# OUT/lr<LR>_z<Z>.json); at the LRs of SAME_START_LRS and the weights of SAME_START_ZS also from
# our weights and batches and from them moved by 1e-6 (`jitter`, PyTorch's own spread;
# OUT/lr<LR>_z<Z>_same.json). Then tools/dev/zloss_compare.py OUT/*.json makes the table and the
# LR-sensitivity figure.
#   source .gpu-deps/env.sh && bash tools/zloss_data.sh && \
#     bash tools/gpu/zloss_torch_compare.sh OUT [BUILD]
# LRS (default: the study's six), ZS ("0 1.0e-4"), STEPS (2000), CONFIG, SAME_START_LRS
# ("1.0e-1 3.0e-1"; set empty for none), SAME_START_ZS ("0"); SETS: more --set arguments; JOBS (1):
# jobs at once, dealt round the GPUs (each holds up to about 22 GB of an H200 at the study's
# shape). A job whose JSON exists is skipped, so a run cut short by a call's time limit resumes
# where it stopped.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/zloss_torch}}
bin=${2:-build-gpu}
cfg=${CONFIG:-configs/zloss-16m.yaml}
lrs=${LRS:-1.0e-3 3.0e-3 1.0e-2 3.0e-2 1.0e-1 3.0e-1}
zs=${ZS:-0 1.0e-4}
steps=${STEPS:-2000}
same=${SAME_START_LRS-1.0e-1 3.0e-1}
same_zs=${SAME_START_ZS:-0}
jobs=${JOBS:-1}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
[ "$gpus" -ge 1 ] || gpus=1  # PyTorch's runs then report that CUDA is missing
mkdir -p "$out"
name_of() { # lr z kind: the job's file name, without .json
  if [ "$3" = same ]; then echo "lr$1_z$2_same"; else echo "lr$1_z$2"; fi
}
job() { # lr z kind gpu: kind "init" (PyTorch from its own weights) or "same" (from ours, and jittered)
  local lr=$1 z=$2 kind=$3 name t0=$SECONDS args
  name=$(name_of "$1" "$2" "$3")
  if [ "$kind" = same ]; then args=(--torch-variants jitter); else args=(--torch-variants init --no-same-start); fi
  echo "== lr $lr z-loss $z: ours, PyTorch ($kind)"
  # shellcheck disable=SC2086  # SETS is a list of arguments
  CUDA_VISIBLE_DEVICES=$4 python3 tools/dev/parity_torch.py -c "$cfg" --steps "$steps" --device cuda \
    --set "optim.lr=$lr" --set "loss.z_loss_weight=$z" --set data.val= ${SETS:-} \
    "${args[@]}" --bin "$bin" --out "$out/$name.json.tmp" > "$out/$name.log" 2>&1 \
    && mv "$out/$name.json.tmp" "$out/$name.json"
  echo "   $name: $((SECONDS - t0)) s; $(grep -E 'largest relative|differ|last loss' "$out/$name.log" | tail -1)"
}
# the same-start jobs first: they train PyTorch twice, so they take longest
todo=()
for z in $same_zs; do for lr in $same; do todo+=("$lr $z same"); done; done
for z in $zs; do for lr in $lrs; do todo+=("$lr $z init"); done; done
k=0
for t in "${todo[@]}"; do
  set -- $t
  [ -s "$out/$(name_of "$1" "$2" "$3").json" ] && continue
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  g=$((k % gpus)) k=$((k + 1))  # here, not in the job's words: those expand in the background shell
  job "$1" "$2" "$3" "$g" &
done
wait
python3 tools/dev/zloss_compare.py "$out"/*.json --csv "$out/rows.csv" && cat "$out/rows.csv"
