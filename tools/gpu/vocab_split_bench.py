#!/usr/bin/env python3
"""When the vocabulary split pays: data parallel against `parallel.vocab_parallel` = all GPUs,
the same model, batch and steps, on every GPU of this machine, one `train --nproc G` run each.

For each model (GPT-2 124M at B=64, GPT-2 1558M's body at B=16), vocabulary and ZeRO-1 setting, it
runs data parallel (`dp`) and the split head (`vp`), and writes one row per run: `vocab`, `model`,
`gpus`, `mode`, `tokens`, `tok_per_s` (median past the first third of the steps), `peak_mem_gb`
(the model's own count on rank 0: its buffers, weights, gradients and AdamW moments) and
`gpu_mem_in_use_gb` (what the device reports in use, NCCL and cuBLAS included, largest over the
steps). Beside each pair it checks the two targets of the split: its step at <= 1.02x data
parallel's, and its peak memory lower by at least 75% of what the head's weights, gradients and
AdamW state (18 bytes a parameter) take under data parallel.

    python3 tools/gpu/vocab_split_bench.py --bin build-gpu --json OUT.json \
        [--models 124m,1558m] [--vocabs 128256,256000] [--zero1 0,1] [--deadline-s 500] \
        [--repeat N] [--tokens gpt2|vocab]

--repeat N runs N pairs a point, the first of each pair alternating (data parallel first, then
the split first), since a machine's speed drifts by a percent within a call: the rows are then
the pairs' means (with each run's `runs_tok_per_s`), `pairs` holds every pair's ratio, and the
target line gives the mean step ratio and each pair's. Runs stop being started once --deadline-s
has passed; the JSON is rewritten after every run.

--tokens: the random tokens' range. `gpt2` (the default) draws them below 50257, as GPT-2 data
has them; `vocab` draws them uniformly below the model's vocabulary, as a tokenizer of that size
spreads them. With the vocabulary's rows dealt out over the ranks (docs/parallel.md) both load
every rank alike; with the ranges the split used before, GPT-2's tokens all lay in the first
shard(s), whose ranks did all the per-token work (the embedding's rows and gradient, the
targets' corrections).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from bench_runs import (benchmark_sets, clear_run, logged_steps, source_commit, timed_median,
                        write_random_shard)

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
MODELS = {"124m": ("configs/gpt2-124m.yaml", 64, 30, 768),
          "1558m": ("configs/gpt2-1558m.yaml", 16, 12, 1600)}  # config, B, steps, C


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build-gpu")
    ap.add_argument("--json", required=True)
    ap.add_argument("--work", default="/tmp/zgpt_vocab_split")
    ap.add_argument("--models", default="124m,1558m")
    ap.add_argument("--vocabs", default="128256,256000")
    ap.add_argument("--zero1", default="0,1")
    ap.add_argument("--deadline-s", type=float, default=500)
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="a config override added to every run")
    ap.add_argument("--tokens", choices=["gpt2", "vocab"], default="gpt2",
                    help="random tokens below 50257, or below the model's vocabulary")
    ap.add_argument("--repeat", type=int, default=1,
                    help="pairs a point, alternating which run goes first")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    started = time.time()
    work = pathlib.Path(a.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              text=True).stdout.count("GPU ")
    except FileNotFoundError:
        gpus = 0
    if gpus < 2:
        sys.exit(f"vocab_split_bench: {gpus} GPU(s) here; the split needs at least 2")
    commit = source_commit(ROOT)
    record = {"what": __doc__.split("\n\n")[0].replace("\n", " "),
              "command": "python3 tools/gpu/vocab_split_bench.py --bin BUILD --json FILE "
                         f"--tokens {a.tokens}",
              "commit": commit, "gpus": gpus, "repeat": a.repeat, "tokens": a.tokens,
              "rows": [], "pairs": [], "targets": []}
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")

    def save():
        record["seconds"] = round(time.time() - started, 1)
        pathlib.Path(a.json).write_text(json.dumps(record, indent=1) + "\n")

    def data_for(vocab):
        data = work / ("data" if a.tokens == "gpt2" else f"data_v{vocab}")
        write_random_shard(data / "train_000.bin", 40 * 65536 * max(gpus, 1) + 1025,
                           below=50257 if a.tokens == "gpt2" else vocab)
        return data

    def run(model, vocab, zero1, mode):
        data = data_for(vocab)
        cfg, B, steps, _ = MODELS[model]
        name = f"{model}_v{vocab}_{mode}{'_zero1' if zero1 else ''}"
        sets = [*benchmark_sets(data, steps, work / "runs", name), "optim.warmup_steps=5",
                f"train.batch_size={B}", f"model.vocab_size={vocab}",
                f"parallel.zero1={'true' if zero1 else 'false'}",
                f"parallel.vocab_parallel={gpus if mode == 'vp' else 1}", *a.sets]
        cmd = [str(pathlib.Path(a.bin).resolve() / "train"), "-c", str(ROOT / cfg),
               "--nproc", str(gpus)]
        for s in sets:
            cmd += ["--set", s]
        clear_run(work / "runs" / name)
        with open(work / "logs" / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    timeout=max(60, a.deadline_s - (time.time() - started) + 120)
                                    ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        rows = logged_steps(work / "runs" / name)
        row = {"vocab": vocab, "model": model, "gpus": gpus, "tokens": a.tokens,
               "mode": mode + ("+zero1" if zero1 else ""), "exit": rc, "steps": len(rows),
               "tok_per_s": timed_median(rows, "tok_per_s"),
               "step_ms": timed_median(rows, "step_ms"),
               "peak_mem_gb": rows[-1].get("peak_mem_gb") if rows else None,
               "gpu_mem_in_use_gb": max((r.get("gpu_mem_in_use_gb", 0) for r in rows),
                                        default=None),
               "final_loss": rows[-1]["loss"] if rows else None}
        print(f"{name:32s} exit {rc}  {row['tok_per_s'] or 0:11.0f} tok/s  model "
              f"{row['peak_mem_gb'] or 0:7.2f} GB  in use {row['gpu_mem_in_use_gb'] or 0:7.2f} GB",
              flush=True)
        return row

    def mean_row(runs):
        """One run's row, or the runs' means (tok/s, step and memory) with each run's tok/s."""
        row = dict(runs[0])
        if len(runs) > 1:
            for k in ("tok_per_s", "step_ms", "peak_mem_gb", "gpu_mem_in_use_gb"):
                vals = [r[k] for r in runs]
                row[k] = None if None in vals else statistics.mean(vals)
            row["runs_tok_per_s"] = [r["tok_per_s"] for r in runs]
            row["exit"] = [r["exit"] for r in runs]
        return row

    for model in a.models.split(","):
        C = MODELS[model][3]
        for vocab in [int(v) for v in a.vocabs.split(",")]:
            for zero1 in [int(z) for z in a.zero1.split(",")]:
                if time.time() - started > a.deadline_s:
                    print(f"past the deadline: {model} V={vocab} zero1={zero1} not run")
                    continue
                dps, vps = [], []
                for i in range(a.repeat):
                    if i > 0 and time.time() - started > a.deadline_s:
                        print(f"past the deadline: {model} V={vocab} zero1={zero1} after {i} "
                              f"pair(s)")
                        break
                    if i % 2 == 0:
                        dps.append(run(model, vocab, zero1, "dp"))
                        vps.append(run(model, vocab, zero1, "vp"))
                    else:
                        vps.append(run(model, vocab, zero1, "vp"))
                        dps.append(run(model, vocab, zero1, "dp"))
                    d, v = dps[-1]["step_ms"], vps[-1]["step_ms"]
                    record["pairs"].append({"model": model, "vocab": vocab, "zero1": zero1,
                                            "first": "dp" if i % 2 == 0 else "vp",
                                            "dp_tok_per_s": dps[-1]["tok_per_s"],
                                            "vp_tok_per_s": vps[-1]["tok_per_s"],
                                            "vp_over_dp": v / d if d and v else None})
                    save()
                dp, vp = mean_row(dps), mean_row(vps)
                record["rows"] += [dp, vp]
                save()
                if not (dp["step_ms"] and vp["step_ms"] and dp["peak_mem_gb"] and
                        vp["peak_mem_gb"]):
                    continue
                head_gb = 18.0 * ((vocab + 127) // 128 * 128) * C / 1e9
                saved = {k: dp[k] - vp[k] for k in ("peak_mem_gb", "gpu_mem_in_use_gb")}
                each = ""
                if a.repeat > 1:
                    each = " (pairs: " + ", ".join(
                        f"{r['vp_over_dp']:.3f}x" if r["vp_over_dp"] else "-"
                        for r in record["pairs"][-len(dps):]) + ")"
                line = (f"{model} V={vocab}{' zero1' if zero1 else ''}: split step "
                        f"{vp['step_ms'] / dp['step_ms']:.3f}x data parallel's{each} "
                        f"({'<=' if vp['step_ms'] <= 1.02 * dp['step_ms'] else '>'} 1.02); "
                        f"memory saved {saved['peak_mem_gb']:.2f} GB (device: "
                        f"{saved['gpu_mem_in_use_gb']:.2f} GB) of the head's state "
                        f"{head_gb:.2f} GB: "
                        f"{saved['peak_mem_gb'] / head_gb:.0%} (target >= 75%)")
                record["targets"].append(line)
                print(line, flush=True)
                save()
    save()


if __name__ == "__main__":
    main()
