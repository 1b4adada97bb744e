#!/usr/bin/env bash
# On a GPU machine: the z-loss study (configs/zloss-16m.yaml) trained by ours and by the parity
# tool's PyTorch trainer (tools/dev/parity_torch.py), one JSON per (LR, z-loss weight): PyTorch
# from its own draw of the weights (`init`) at every LR, and at the LRs of SAME_START_LRS also
# from our weights and batches and from them moved by 1e-6 (`jitter`, PyTorch's own spread). Then
# tools/dev/zloss_compare.py OUT/*.json makes the table and the LR-sensitivity figure.
#   source .gpu-deps/env.sh && bash tools/zloss_data.sh && \
#     bash tools/gpu/zloss_torch_compare.sh OUT [BUILD]
# LRS (default: the study's six), ZS ("0 1.0e-4"), STEPS (2000), CONFIG, SAME_START_LRS
# ("1.0e-1 3.0e-1"); SETS: more --set arguments; JOBS (1): points trained at once (each
# process holds about 22 GB of an H200 at the study's shape, and the PyTorch runs' 50304-wide
# head keeps the GPU busy, so more than 2 or 3 gain little). A point whose JSON exists is
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
point() { # lr z: one point's two (or four) runs, its JSON written only when all finished
  local lr=$1 z=$2 f="$out/lr$1_z$2.json" variants=init only=--no-same-start t0=$SECONDS
  case " $same " in *" $lr "*) variants=init,jitter only= ;; esac
  echo "== lr $lr z-loss $z: ours, PyTorch ($variants)"
  # shellcheck disable=SC2086  # SETS is a list of arguments
  python3 tools/dev/parity_torch.py -c "$cfg" --steps "$steps" --device cuda \
    --set "optim.lr=$lr" --set "loss.z_loss_weight=$z" --set data.val= ${SETS:-} \
    --torch-variants "$variants" $only --bin "$bin" --out "$f.tmp" > "$out/lr${lr}_z${z}.log" 2>&1 \
    && mv "$f.tmp" "$f"
  echo "   lr $lr z-loss $z: $((SECONDS - t0)) s; $(grep -E 'largest relative|differ|last loss' "$out/lr${lr}_z${z}.log" | tail -1)"
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
