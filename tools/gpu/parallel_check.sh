#!/usr/bin/env bash
# On a GPU machine: the distributed path on one GPU. Builds (build-gpu), runs the parallel, launch
# and GPU tests, then trains GPT-2 124M (configs/gpt2-124m.yaml, B=64 T=1024 bf16, random tokens)
# three ways side by side: the plain trainer, `train --nproc 1` (NCCL, world size 1), and two
# local ranks of B=32 sharing the GPU (data parallel through the local communicator). Writes logs
# and parallel_check.json into the folder given (default $OUT).
#   source .gpu-deps/env.sh && ZGPT_COMMIT=<hash> bash tools/gpu/parallel_check.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/gpu_parallel_check}}
steps=${STEPS:-40}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  echo "commit ${ZGPT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null; [ $? = 1 ] && echo +modified)}"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
if [ ! -x build-gpu/train ] || [ "${REBUILD:-1}" = 1 ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  cmake --build build-gpu -j16 > "$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
fi
echo "built"
if [ "${SKIP_CTEST:-0}" != 1 ]; then
  ctest --test-dir build-gpu --output-on-failure -R "${CTEST_REGEX:-parallel|launch|gpu}" \
    > "$out/ctest.log" 2>&1; echo "ctest exit $?"
  grep -E "tests passed|tests failed|Passed|Failed|Skipped" "$out/ctest.log" | tail -8
fi
[ "${SKIP_TRAIN:-0}" = 1 ] && exit 0
# Random GPT-2 tokens in llm.c's shard layout (enough for the steps of every run).
data=/tmp/zgpt_parallel_data
mkdir -p $data
python3 - "$data/train_000.bin" $(( (steps + 2) * 65536 + 1025 )) <<'EOF'
import sys, struct, random
path, n = sys.argv[1], int(sys.argv[2])
random.seed(1)
hdr = [20240520, 1, n] + [0] * 253
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
EOF
common=(-c configs/gpt2-124m.yaml --set data.train=$data/train_*.bin --set data.val=
        --set train.max_steps=$steps --set train.eval_every=0 --set train.log_every=10
        --set optim.warmup_steps=10 --set train.out_dir=/tmp/zgpt_parallel_runs)
run() {  # name, then extra arguments
  local name=$1; shift
  echo "== $name: train ${common[*]} --set train.run_name=$name $*"
  rm -rf /tmp/zgpt_parallel_runs/$name
  build-gpu/train "${common[@]}" --set train.run_name=$name "$@" > "$out/train_$name.log" 2>&1
  echo "exit $?"; grep -E "^done|error" "$out/train_$name.log" | tail -3
}
run plain
run nproc1 --nproc 1
run plain2
run nproc1b --nproc 1
run local2 --set parallel.local_ranks=2 --set train.batch_size=32
python3 - "$out" $steps <<'EOF'
import json, sys, statistics
out, steps = sys.argv[1], int(sys.argv[2])
def metrics(name):
    rows = [json.loads(l) for l in open(f"/tmp/zgpt_parallel_runs/{name}/metrics.jsonl")]
    return [r for r in rows if "loss" in r]
res = {"machine": open(f"{out}/machine.txt").read().strip().splitlines(), "steps": steps}
m = {n: metrics(n) for n in ["plain", "nproc1", "plain2", "nproc1b", "local2"]}
# timed steps: from step 11 (warm), median step time
med = {n: statistics.median(r["step_ms"] for r in m[n][10:]) for n in m}
res["median_step_ms"] = med
res["nproc1_equals_plain_bitwise"] = [r["loss"] for r in m["nproc1"]] == [r["loss"] for r in m["plain"]]
res["plain_repeatable_bitwise"] = [r["loss"] for r in m["plain2"]] == [r["loss"] for r in m["plain"]]
pl = (med["plain"] + med["plain2"]) / 2
nc = (med["nproc1"] + med["nproc1b"]) / 2
res["nproc1_overhead"] = nc / pl - 1
res["local2_max_rel_loss_diff"] = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(m["local2"], m["plain"]))
res["local2_losses_first_last"] = [m["local2"][0]["loss"], m["local2"][-1]["loss"]]
res["plain_losses_first_last"] = [m["plain"][0]["loss"], m["plain"][-1]["loss"]]
json.dump(res, open(f"{out}/parallel_check.json", "w"), indent=2)
print(json.dumps(res, indent=2))
EOF
