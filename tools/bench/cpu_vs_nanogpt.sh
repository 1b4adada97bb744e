#!/usr/bin/env bash
# The CPU trainer against nanoGPT on nanoGPT's README CPU recipe for Tiny Shakespeare (4 layers,
# 4 heads, 128 channels, context 64, batch 12), alternated on the same cores, with the same thread
# count: tokens/s of each (medians of the timed steps) and ratio_vs_nanogpt = ours / nanoGPT's.
#   bash tools/bench/cpu_vs_nanogpt.sh NANOGPT_DIR [OUT_JSON] [PYTHON]
# NANOGPT_DIR holds nanoGPT's train.py, model.py, configurator.py and
# config/train_shakespeare_char.py (the search tool's fetch of karpathy/nanoGPT, then
# `git --git-dir=... archive HEAD ... | tar -x -C NANOGPT_DIR`). PYTHON must have torch and numpy.
# STEPS (default 200), ROUNDS (default 2), THREADS (default 2) and BUILD_DIR (default build) may
# be set. The quickstart's model
# (configs/kjv-char.yaml: the same shape without biases, on the King James Bible):
#   TEXT=data/shards/kjv.txt CONFIG=configs/kjv-char.yaml NANO_EXTRA=--bias=False bash tools/bench/cpu_vs_nanogpt.sh ...
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
nano=$(cd "$1" && pwd)
out=${2:-$here/cpu_vs_nanogpt.json}
py=${3:-python3}
steps=${STEPS:-200} rounds=${ROUNDS:-2} threads=${THREADS:-2}
bin=$(cd "$here/${BUILD_DIR:-build}" && pwd)
text=$(realpath "${TEXT:-$here/../shared/data/tinyshakespeare/input.txt}")
config=$(realpath "${CONFIG:-$here/configs/shakespeare-char-cpu.yaml}")
nano_extra=${NANO_EXTRA:-}
work=$(mktemp -d /tmp/zgpt_cpu_vs_nanogpt.XXXX)
# nanoGPT's char-level data (its prepare.py downloads; this writes the same files from the text)
mkdir -p "$nano/data/shakespeare_char"
"$py" - "$text" "$nano/data/shakespeare_char" <<'EOF'
import sys, pickle, numpy as np
text, d = open(sys.argv[1]).read(), sys.argv[2]
chars = sorted(set(text)); stoi = {c: i for i, c in enumerate(chars)}
ids = np.array([stoi[c] for c in text], dtype=np.uint16); n = int(0.9 * len(ids))
ids[:n].tofile(f"{d}/train.bin"); ids[n:].tofile(f"{d}/val.bin")
pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, open(f"{d}/meta.pkl", "wb"))
EOF
"$bin/prepare_data" --input "$text" --out "$work/shards" > /dev/null
for r in $(seq 1 "$rounds"); do
  (cd "$nano" && OMP_NUM_THREADS=$threads "$py" train.py config/train_shakespeare_char.py --device=cpu \
     --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 \
     --n_head=4 --n_embd=128 --max_iters=$steps --lr_decay_iters=2000 --dropout=0.0 \
     --eval_interval=100000 --out_dir="$work/nano_out" $nano_extra) > "$work/nano_$r.log" 2>&1
  OMP_NUM_THREADS=$threads "$bin/train" -c "$config" \
    --set data.train="$work/shards/train_*.bin" --set data.val= --set train.max_steps=$steps \
    --set train.threads=$threads --set train.out_dir="$work/runs" --set train.run_name=ours_$r \
    > "$work/ours_$r.log" 2>&1
done
"$py" - "$work" "$rounds" "$steps" "$threads" "$out" "$(git -C "$here" rev-parse --short HEAD)" \
  "$(basename "$text") with $(basename "$config")${nano_extra:+ (nanoGPT $nano_extra)}" <<'EOF'
import json, re, statistics, sys, platform, datetime
work, rounds, steps, threads, out, commit, recipe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
T = 12 * 64
nano, ours = [], []
for r in range(1, rounds + 1):
    ms = []
    for line in open(f"{work}/nano_{r}.log"):  # "iter N: loss ..., time X ms": steps 20 on
        m = re.search(r"^iter (\d+): .*time ([0-9.]+)ms", line)
        if m and int(m.group(1)) >= 20:
            ms.append(float(m.group(2)))
    nano.append(statistics.median(ms))
    rows = [json.loads(l) for l in open(f"{work}/runs/ours_{r}/metrics.jsonl") if '"step_ms"' in l]
    ours.append(statistics.median(x["step_ms"] for x in rows if x["step"] >= 20))
res = {"what": "nanoGPT's CPU recipe shape (4 layers, 4 heads, 128 channels, context 64, batch 12), nanoGPT against our trainer, alternated: " + recipe,
       "date": datetime.date.today().isoformat(), "commit": commit, "machine": platform.processor() or platform.machine(),
       "threads": threads, "steps": steps, "rounds": rounds,
       "command": f"bash tools/bench/cpu_vs_nanogpt.sh NANOGPT_DIR OUT PYTHON (STEPS={steps} ROUNDS={rounds} THREADS={threads})",
       "nanogpt_ms_per_step": nano, "ours_ms_per_step": ours,
       "nanogpt_tok_per_s": T / (statistics.median(nano) / 1e3), "ours_tok_per_s": T / (statistics.median(ours) / 1e3)}
res["ratio_vs_nanogpt"] = res["ours_tok_per_s"] / res["nanogpt_tok_per_s"]
prov = json.load(open(f"{work}/runs/ours_1/provenance.json"))  # the CPU and the BLAS kernel in use
res.update(cpu=prov["cpu"].strip(), cpu_isa=prov.get("cpu_isa"), blas=prov.get("blas"))
json.dump(res, open(out, "w"), indent=1)
print(f"nanoGPT {res['nanogpt_tok_per_s']:.0f} tok/s ({nano} ms), ours {res['ours_tok_per_s']:.0f} tok/s ({ours} ms): "
      f"ratio {res['ratio_vs_nanogpt']:.3f}")
EOF
