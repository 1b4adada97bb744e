#!/usr/bin/env bash
# On a GPU machine: the z-loss study (configs/zloss-16m.yaml) trained by ours and by the parity
# tool's PyTorch trainer (tools/dev/parity_torch.py), one JSON per (LR, z-loss weight): PyTorch
# from the same weights and batches, from its own draw of the weights (`init`), and at the LRs of
# SAME_START_LRS also from weights moved by 1e-6 (`jitter`, PyTorch's own spread). Then
# tools/dev/zloss_compare.py OUT/*.json makes the table and the LR-sensitivity figure.
#   source .gpu-deps/env.sh && bash tools/zloss_data.sh && \
#     bash tools/gpu/zloss_torch_compare.sh OUT [BUILD]
# LRS (default: the study's six), ZS ("0 1.0e-4"), STEPS (2000), CONFIG, SAME_START_LRS
# ("1.0e-1 3.0e-1"); SETS: more --set arguments; JOBS (1): points trained at once (a 16M model
# leaves most of an H200 idle, so several points share it). A point whose JSON exists is
# skipped, so a run cut short by a call's time limit resumes where it stopped.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/zloss_torch}}
bin=${2:-build-gpu}
cfg=${CONFIG:-configs/zloss-16m.yaml}
lrs=${LRS:-1.0e-3 3.0e-3 1.0e-2 3.0e-2 1.0e-1 3.0e-1}
zs=${ZS:-0 1.0e-4}
steps=${STEPS:-2000}
same=${SAME_START_LRS:-1.0e-1 3.0e-1}
jobs=${JOBS:-1}
mkdir -p "$out"
point() { # lr z: one point's three (or four) runs, its JSON written only when all finished
  local lr=$1 z=$2 f="$out/lr$1_z$2.json" variants=init t0=$SECONDS
  case " $same " in *" $lr "*) variants=init,jitter ;; esac
  echo "== lr $lr z-loss $z: ours, PyTorch ($variants)"
  # shellcheck disable=SC2086  # SETS is a list of arguments
  python3 tools/dev/parity_torch.py -c "$cfg" --steps "$steps" --device cuda \
    --set "optim.lr=$lr" --set "loss.z_loss_weight=$z" --set data.val= ${SETS:-} \
    --torch-variants "$variants" --bin "$bin" --out "$f.tmp" > "$out/lr${lr}_z${z}.log" 2>&1 \
    && mv "$f.tmp" "$f"
  echo "   lr $lr z-loss $z: $((SECONDS - t0)) s; $(grep -E 'largest relative|differ' "$out/lr${lr}_z${z}.log" | tail -1)"
}
for z in $zs; do
  for lr in $lrs; do
    [ -s "$out/lr${lr}_z${z}.json" ] && continue
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    point "$lr" "$z" &
  done
done
wait
python3 tools/dev/zloss_compare.py "$out"/*.json --csv "$out/rows.csv" && cat "$out/rows.csv"
