#!/usr/bin/env bash
# On a GPU machine (after tools/gpu/parallel_check.sh built build-gpu, or with REBUILD=1): the
# vocab-parallel head through the trainer on one GPU. GPT-2 124M, random tokens, 30 steps: one
# rank of B=64 against 2 local ranks of B=32 in one vocab-parallel group, with the fast and the
# fused_linear heads; the metrics (loss, rank 0's peak memory) go to the folder given.
#   source .gpu-deps/env.sh && bash tools/gpu/vocab_parallel_check.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/gpu_vp_check}}
steps=${STEPS:-30}
mkdir -p "$out"
if [ "${REBUILD:-0}" = 1 ] || [ ! -x build-gpu/train ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build build-gpu -j16 > "$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
fi
data=/tmp/zgpt_vp_data
mkdir -p $data
python3 - "$data/train_000.bin" $(( (steps + 2) * 65536 + 1025 )) <<'PY'
import sys, struct, random
path, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
runs=/tmp/zgpt_vp_runs
rm -rf $runs
common=(-c configs/gpt2-124m.yaml --set "data.train=$data/train_*.bin" --set data.val=
        --set train.max_steps=$steps --set train.eval_every=0 --set optim.warmup_steps=10
        --set train.out_dir=$runs)
run() {
  local name=$1; shift
  echo "== $name: train ${common[*]} --set train.run_name=$name $*"
  build-gpu/train "${common[@]}" --set train.run_name=$name "$@" > "$out/$name.log" 2>&1
  echo "exit $?"; grep -E "^done|error" "$out/$name.log" | tail -2
  cp $runs/$name/metrics.jsonl "$out/$name.metrics.jsonl" 2>/dev/null
}
run fast_1rank
run fast_vp2 --set parallel.local_ranks=2 --set parallel.vocab_parallel=2 --set train.batch_size=32
run fused_1rank --set kernels.cross_entropy=fused_linear
run fused_vp2 --set kernels.cross_entropy=fused_linear --set parallel.local_ranks=2 \
  --set parallel.vocab_parallel=2 --set train.batch_size=32
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def rows(n):
    return [json.loads(l) for l in open(f"{out}/{n}.metrics.jsonl") if '"loss"' in l]
res = {}
for head in ["fast", "fused"]:
    a, b = rows(f"{head}_1rank"), rows(f"{head}_vp2")
    res[head] = {
        "max_rel_loss_diff": max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)),
        "loss_first_last_1rank": [a[0]["loss"], a[-1]["loss"]],
        "loss_first_last_vp2": [b[0]["loss"], b[-1]["loss"]],
        "peak_mem_gb_1rank_b64": a[-1].get("peak_mem_gb"),
        "peak_mem_gb_vp2_rank0_b32": b[-1].get("peak_mem_gb"),
    }
json.dump(res, open(f"{out}/vp_check.json", "w"), indent=2)
print(json.dumps(res, indent=2))
PY
