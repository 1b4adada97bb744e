#!/usr/bin/env bash
# On a machine with several GPUs: the distributed path measured (docs/parallel.md, "On several
# GPUs"). Builds build-gpu, then by part:
#   tests    ctest: test_multi_gpu (nccl across GPUs), test_parallel, test_launch
#   scaling  NCCL all-reduce bandwidth (tools/bench/nccl_bandwidth.cu); GPT-2 124M, B=64 per GPU, T=1024,
#            bf16 on 1, 2, 4, 8 GPUs (as many as there are), ZeRO-1 on the most
#   anchor   PyTorch DDP + torch.compile + flash (llm.c's train_gpt2.py,
#            ../shared/bench/e2e_anchor.sh) on the same counts (ANCHOR_COUNTS="4 1" to choose);
#            its compile takes minutes on several GPUs, so it is often a call of its own
#   overlap  the gradient all-reduce in buckets during the backward pass (parallel.grad_bucket_mb
#            = 25) against one all-reduce after it (0), on 2 and all GPUs; OVERLAP_COUNTS and
#            OVERLAP_MB choose, OVERLAP_CTAS="2 4" adds runs with NCCL_MAX_CTAS capped
#   vocab    V = 128256 and 256000 (VOCABS): one GPU (grad_accum = GPUs, the same global batch),
#            data parallel alone, and the head split over all GPUs; the same with fused_linear
#            for FUSED_VOCABS (default 128256 256000; empty for none)
#   zero1_1558m  GPT-2 1558M, B=16 a GPU, one micro-batch a step: one GPU, then ZeRO-1 on all
#            GPUs, then PyTorch DDP + compile with ZeRO-1 (train_gpt2.py --zero_stage 1) on as many
#            (ANCHOR=0 leaves it out): the multi-GPU row of docs/results/gpt2_sizes_h200.json;
#            a call of its own (the anchor's compile and steps take minutes)
# Writes logs and multi_gpu_<part>.json into the folder given. Needs .gpu-deps/llmc/train_gpt2.py
# and .gpu-deps/shared/bench/e2e_anchor.sh (tools/gpu/extra_deps.sh puts it there) for the anchor.
#   source .gpu-deps/env.sh && PARTS="tests scaling" bash tools/gpu/multi_check.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/gpu_multi_check}}
parts=${PARTS:-tests scaling anchor vocab}
steps=${STEPS:-40}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L | wc -l)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -2
  echo "commit ${ZGPT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null; [ $? = 1 ] && echo +modified)}"
  nvidia-smi topo -m
} > "$out/machine.txt" 2>&1
head -4 "$out/machine.txt"
if [ ! -x build-gpu/train ] || [ ! -x build-gpu/nccl_bandwidth ] || [ "${REBUILD:-0}" = 1 ]; then
  t0=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  targets=(); for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
  cmake --build build-gpu -j"$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1 ||
    { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi

# Random GPT-2 tokens in llm.c's shard layout, enough for every run's steps on 8 GPUs.
data=/tmp/zgpt_multi_data
if [ ! -f $data/train_000.bin ]; then
  mkdir -p $data
  python3 - "$data/train_000.bin" $(( (steps + 2) * 65536 * 8 + 1025 )) <<'EOF'
import sys, numpy as np
path, n = sys.argv[1], int(sys.argv[2])
hdr = np.zeros(256, dtype=np.int32); hdr[0] = 20240520; hdr[1] = 1; hdr[2] = n
with open(path, "wb") as f:
    f.write(hdr.tobytes()); f.write(np.random.default_rng(1).integers(0, 50257, n, dtype=np.uint16).tobytes())
EOF
fi
run_cfg=configs/gpt2-124m.yaml  # a part may train another size
common=(--set data.train=$data/train_*.bin --set data.val=
        --set train.max_steps=$steps --set train.eval_every=0 --set train.log_every=10
        --set train.checkpoint_every=0 --set optim.warmup_steps=10
        --set train.out_dir=/tmp/zgpt_multi_runs)
train_run() {  # name, ranks, then extra arguments
  local name=$1 n=$2; shift 2
  local np=(); [ "$n" -gt 1 ] && np=(--nproc "$n")
  echo "== $name ($n GPUs): train ${np[*]} $*"
  rm -rf /tmp/zgpt_multi_runs/$name
  timeout 300 build-gpu/train -c "$run_cfg" "${common[@]}" "${np[@]}" --set train.run_name=$name "$@" \
    > "$out/train_$name.log" 2>&1
  echo "exit $?"; grep -E "^done|error" "$out/train_$name.log" | tail -2
}
summarise() {  # part, then run names: one JSON of medians over steps 11.. per run
  python3 - "$out" "$@" <<'EOF'
import json, sys, statistics, os
out, part, names = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {"part": part, "machine": open(f"{out}/machine.txt").read().strip().splitlines()[:4], "runs": {}}
for n in names:
    p = f"/tmp/zgpt_multi_runs/{n}/metrics.jsonl"
    if not os.path.exists(p):
        res["runs"][n] = None; continue
    rows = [json.loads(l) for l in open(p)]
    rows = [r for r in rows if "loss" in r]
    timed = rows[10:] or rows
    med = lambda k: statistics.median(r[k] for r in timed) if all(k in r for r in timed) else None
    cfg = open(f"/tmp/zgpt_multi_runs/{n}/config.yaml").read()
    res["runs"][n] = {"steps": len(rows), "step_ms": med("step_ms"), "tok_per_s": med("tok_per_s"),
                      "mfu": med("mfu"), "grad_all_reduce_ms": med("grad_all_reduce_ms"),
                      "gpu_mem_in_use_gb": max(r.get("gpu_mem_in_use_gb", 0) for r in rows),
                      "model_mem_gb": rows[-1].get("peak_mem_gb"),
                      "losses": [r["loss"] for r in rows]}
json.dump(res, open(f"{out}/multi_gpu_{part}.json", "w"), indent=1)
for n, r in res["runs"].items():
    if r: print(f"{n:24s} {r['step_ms']:9.2f} ms {r['tok_per_s']:11.0f} tok/s  all-reduce "
                f"{r['grad_all_reduce_ms'] or 0:6.2f} ms  mem {r['gpu_mem_in_use_gb']:6.2f} GB  "
                f"loss {r['losses'][-1]:.4f}")
EOF
}
counts=(1); for n in 2 4 8; do [ "$n" -le "$gpus" ] && counts+=($n); done

for part in $parts; do
  case $part in
  tests)
    t0=$(date +%s)
    if [ -n "${TEST_BINARY:-}" ]; then  # one test binary, its output kept even when cut short
      ZGPT_TRAIN_BIN=$PWD/build-gpu/train timeout ${CTEST_TIMEOUT:-400} \
        build-gpu/tests/$TEST_BINARY --duration=true > "$out/ctest.log" 2>&1
    else
      timeout ${CTEST_TIMEOUT:-400} ctest --test-dir build-gpu --output-on-failure \
        -R "${CTEST_REGEX:-multi_gpu|parallel|launch}" > "$out/ctest.log" 2>&1
    fi
    echo "tests exit $? in $(( $(date +%s) - t0 )) s"
    grep -E "tests passed|tests failed|Passed|Failed|Skipped|largest differences|stopped in|test cases|ERROR" \
      "$out/ctest.log" | tail -30
    ;;
  scaling)
    build-gpu/nccl_bandwidth --out "$out/nccl_bandwidth.json" 2>&1 | tee "$out/nccl_bandwidth.log"
    names=()
    for n in "${counts[@]}"; do train_run dp$n $n; names+=(dp$n); done
    train_run zero1_$gpus $gpus --set parallel.zero1=true; names+=(zero1_$gpus)
    train_run dp1_again 1; names+=(dp1_again)
    summarise scaling "${names[@]}"
    ;;
  anchor)
    if [ -f .gpu-deps/llmc/train_gpt2.py ]; then
      for n in ${ANCHOR_COUNTS:-${counts[@]}}; do
        echo "== PyTorch DDP + compile + flash, $n GPUs"
        rm -f /tmp/e2e_anchor.log
        # A run that has printed no step after ANCHOR_DUMP_S seconds gets SIGABRT: with
        # PYTHONFAULTHANDLER each Python process (torchrun and its workers) then prints where
        # every thread stands, into the anchor's log.
        ( sleep ${ANCHOR_DUMP_S:-240}; grep -q "^step" /tmp/e2e_anchor.log 2>/dev/null ||
            { echo "no step after ${ANCHOR_DUMP_S:-240} s: SIGABRT for tracebacks"; nvidia-smi;
              pkill -ABRT -f train_gpt2.py; } ) > "$out/anchor_${n}_watch.log" 2>&1 &
        watch=$!
        PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN timeout ${ANCHOR_TIMEOUT:-300} \
          bash .gpu-deps/shared/bench/e2e_anchor.sh .gpu-deps/llmc $n > "$out/anchor_$n.log" 2>&1
        echo "exit $?"; tail -3 "$out/anchor_$n.log"
        kill $watch 2>/dev/null
        cp /tmp/e2e_anchor.log "$out/anchor_${n}_full.log" 2>/dev/null
      done
    fi
    ;;
  overlap)
    names=()
    [ -z "${OVERLAP_COUNTS:-}" ] && { train_run dp1 1; names+=(dp1); }
    for n in ${OVERLAP_COUNTS:-${counts[@]:1}}; do
      for mb in ${OVERLAP_MB:-0 25}; do
        train_run dp${n}_bucket$mb $n --set parallel.grad_bucket_mb=$mb; names+=(dp${n}_bucket$mb)
      done
    done
    # NCCL's CTAs per collective capped (NCCL_MAX_CTAS): fewer SMs taken from the backward pass
    for c in ${OVERLAP_CTAS:-}; do
      export NCCL_MAX_CTAS=$c
      train_run dp${gpus}_bucket25_ctas$c $gpus --set parallel.grad_bucket_mb=25
      names+=(dp${gpus}_bucket25_ctas$c)
      unset NCCL_MAX_CTAS
    done
    [ -z "${OVERLAP_COUNTS:-}" ] &&
      { train_run zero1_${gpus}_bucket25 $gpus --set parallel.zero1=true --set parallel.grad_bucket_mb=25
        names+=(zero1_${gpus}_bucket25); }
    summarise overlap "${names[@]}"
    ;;
  vocab)
    names=()
    for v in ${VOCABS:-128256 256000}; do
      train_run v${v}_one 1 --set model.vocab_size=$v --set train.grad_accum=$gpus
      train_run v${v}_dp $gpus --set model.vocab_size=$v
      train_run v${v}_vp $gpus --set model.vocab_size=$v --set parallel.vocab_parallel=$gpus
      names+=(v${v}_one v${v}_dp v${v}_vp)
    done
    for v in ${FUSED_VOCABS-128256 256000}; do
      train_run v${v}_vp_fl $gpus --set model.vocab_size=$v --set parallel.vocab_parallel=$gpus \
        --set kernels.cross_entropy=fused_linear
      train_run v${v}_dp_fl $gpus --set model.vocab_size=$v --set kernels.cross_entropy=fused_linear
      names+=(v${v}_vp_fl v${v}_dp_fl)
    done
    summarise vocab "${names[@]}"
    ;;
  zero1_1558m)
    run_cfg=configs/gpt2-1558m.yaml
    # (no checkpoint at the end: 1558M's with its AdamW moments is 25 GB, a minute and more)
    big=(--set train.batch_size=16 --set train.grad_accum=1 --set parallel.grad_bucket_mb=0
         --set train.checkpoint_at_end=false)
    train_run xl_one 1 "${big[@]}"
    train_run xl_zero1_$gpus $gpus "${big[@]}" --set parallel.zero1=true
    summarise zero1_1558m xl_one xl_zero1_$gpus
    run_cfg=configs/gpt2-124m.yaml
    if [ -f .gpu-deps/llmc/train_gpt2.py ] && [ "${ANCHOR:-1}" = 1 ]; then
      # the shared anchor with ZeroRedundancyOptimizer: its train_gpt2.py line takes --zero_stage 1
      anchor=.gpu-deps/shared/bench/e2e_anchor_zero1.sh
      sed 's/--write_tensors 0/--zero_stage 1 --write_tensors 0/' \
        .gpu-deps/shared/bench/e2e_anchor.sh > $anchor
      if grep -q -- "--zero_stage 1" $anchor; then
        echo "== PyTorch DDP + compile + flash + ZeRO-1, GPT-2 1558M, $gpus GPUs"
        MODEL=d48 B=16 STEPS=${ANCHOR_STEPS:-25} NCCL_DEBUG=WARN timeout ${ANCHOR_TIMEOUT:-420} \
          bash $anchor .gpu-deps/llmc $gpus > "$out/anchor_zero1_1558m.log" 2>&1
        echo "exit $?"; tail -3 "$out/anchor_zero1_1558m.log"
        cp /tmp/e2e_anchor.log "$out/anchor_zero1_1558m_full.log" 2>/dev/null
      else
        echo "anchor: e2e_anchor.sh has no --write_tensors 0 to put --zero_stage 1 beside"
      fi
    fi
    ;;
  esac
done
