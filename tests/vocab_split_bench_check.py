#!/usr/bin/env python3
"""tools/gpu/vocab_split_bench.py without a GPU: a stand-in nvidia-smi lists two GPUs and a
stand-in `train` writes a run's metrics (a step time that grows with each call, so that every run
differs), so that the script's own logic is checked: with --repeat, pairs that alternate which
run goes first, rows that are the pairs' means, each pair's ratio, and the target line; with
--tokens vocab, a shard of uint32 tokens below the model's vocabulary; a machine with fewer than
two GPUs and a --repeat below 1 refused."""
import array
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
tool = root / "tools/gpu/vocab_split_bench.py"
work = pathlib.Path(tempfile.mkdtemp(prefix="zgpt_vocab_split_bench_"))
fake = work / "bin"
fake.mkdir()
(fake / "nvidia-smi").write_text(
    '#!/bin/sh\n[ -n "$FAKE_NO_GPU" ] || printf "GPU 0: fake\\nGPU 1: fake\\n"\n')
build = work / "build"
build.mkdir()
# the stand-in trainer: step_ms 100 (data parallel) or 102 (split) plus the call's number
(build / "train").write_text(f"""#!{sys.executable}
import json, pathlib, sys
a = sys.argv[1:]
sets = dict(a[i + 1].split("=", 1) for i, x in enumerate(a) if x == "--set")
calls = pathlib.Path({str(work / "calls.txt")!r})
n = len(calls.read_text().splitlines()) if calls.exists() else 0
split = sets["parallel.vocab_parallel"] != "1"
with calls.open("a") as f:
    f.write(("vp" if split else "dp") + "\\n")
with open(calls.with_name("data.txt"), "a") as f:
    f.write(sets["data.train"] + "\\n")
step = (102.0 if split else 100.0) + n
run = pathlib.Path(sets["train.out_dir"]) / sets["train.run_name"]
run.mkdir(parents=True, exist_ok=True)
with open(run / "metrics.jsonl", "w") as f:
    for s in range(int(sets["train.max_steps"])):
        f.write(json.dumps({{"step": s, "loss": 10.0, "step_ms": step,
                            "tok_per_s": 131072 / (step / 1000),
                            "peak_mem_gb": 20.0 if split else 30.0,
                            "gpu_mem_in_use_gb": 21.0 if split else 31.0}}) + "\\n")
""")
for f in (fake / "nvidia-smi", build / "train"):
    f.chmod(0o755)
data = work / "work" / "data"
data.mkdir(parents=True)
(data / "train_000.bin").write_bytes(b"\0" * 1024)  # exists: the tool writes no shard
env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", ZGPT_COMMIT="test")
out = work / "out.json"


def tool_run(*extra, **env_extra):
    return subprocess.run([sys.executable, str(tool), "--bin", str(build), "--json", str(out),
                           "--work", str(work / "work"), "--models", "124m", "--vocabs",
                           "128256", "--zero1", "0", *extra], capture_output=True, text=True,
                          env=dict(env, **env_extra))


def fail(msg, p=None):
    sys.exit(f"vocab split bench: {msg}" + (f"\n{p.stdout}\n{p.stderr}" if p else ""))


p = tool_run("--repeat", "3")
if p.returncode != 0:
    fail("the run failed", p)
calls = (work / "calls.txt").read_text().split()
if calls != ["dp", "vp", "vp", "dp", "dp", "vp"]:
    fail(f"runs in the order {calls}, not alternating the first of each pair")
rec = json.loads(out.read_text())
rows = {r["mode"]: r for r in rec["rows"]}
if sorted(rows) != ["dp", "vp"] or len(rec["rows"]) != 2:
    fail(f"rows {[r['mode'] for r in rec['rows']]}, not one mean row a mode")
# data parallel ran as calls 0, 3 and 4 (steps 100, 103, 104), the split as 1, 2 and 5
if abs(rows["dp"]["step_ms"] - 307 / 3) > 1e-9 or abs(rows["vp"]["step_ms"] - 314 / 3) > 1e-9:
    fail(f"mean steps {rows['dp']['step_ms']} and {rows['vp']['step_ms']}, not 307/3 and 314/3")
if len(rows["dp"]["runs_tok_per_s"]) != 3:
    fail("the mean row does not list its runs")
ratios = [round(x["vp_over_dp"], 4) for x in rec["pairs"]]
if ratios != [round(103 / 100, 4), round(104 / 103, 4), round(107 / 104, 4)]:
    fail(f"pair ratios {ratios}")
line = rec["targets"][0]
want = f"split step {314 / 307:.3f}x data parallel's (pairs: 1.030x, 1.010x, 1.029x) (> 1.02)"
if want not in line:
    fail(f"target line {line!r} lacks {want!r}")
if "memory saved 10.00 GB" not in line:
    fail(f"target line {line!r}: the memory saved is not the means'")

# --tokens vocab: its own shard, version 2 (uint32), every token below V and some past uint16
(work / "data.txt").unlink()
p = tool_run("--tokens", "vocab")
if p.returncode != 0:
    fail("the --tokens vocab run failed", p)
shard = work / "work" / "data_v128256" / "train_000.bin"
used = set((work / "data.txt").read_text().split())
if used != {f"{shard.parent}/train_*.bin"}:
    fail(f"--tokens vocab trained on {used}, not {shard.parent}")


def read_shard(path, wide):
    """(magic, version, count, tokens) of a shard the tool wrote"""
    body = path.read_bytes()
    magic, version, count = struct.unpack("<3i", body[:12])
    tokens = array.array("I" if wide else "H")
    tokens.frombytes(body[1024:])
    if sys.byteorder != "little":
        tokens.byteswap()
    return magic, version, count, tokens


magic, version, count, tokens = read_shard(shard, True)
if (magic, version, count) != (20240520, 2, len(tokens)):
    fail(f"--tokens vocab's shard: magic {magic}, version {version}, {count} tokens of "
         f"{len(tokens)}")
if max(tokens) >= 128256 or max(tokens) < 65536:
    fail(f"--tokens vocab's tokens span {min(tokens)}..{max(tokens)}, not [0, 128256) past 65535")
# GPT-2's: version 1 (uint16), every token below 50257
sys.path.insert(0, str(root / "tools/gpu"))
from bench_runs import write_random_shard  # noqa: E402

small = write_random_shard(work / "gpt2.bin", 100000)
magic, version, count, tokens = read_shard(small, False)
if (magic, version, count) != (20240520, 1, 100000) or len(tokens) != count:
    fail(f"GPT-2's shard: magic {magic}, version {version}, {count} tokens of {len(tokens)}")
if max(tokens) >= 50257 or max(tokens) < 50000:
    fail(f"GPT-2's tokens span {min(tokens)}..{max(tokens)}, not below 50257")
if json.loads(out.read_text()).get("tokens") != "vocab":
    fail("the record does not say which tokens it ran on")

p = tool_run(FAKE_NO_GPU="1")
if p.returncode == 0 or "needs at least 2" not in p.stderr:
    fail("a machine without GPUs was not refused", p)
p = tool_run("--repeat", "0")
if p.returncode == 0 or "--repeat" not in p.stderr:
    fail("--repeat 0 was not refused", p)
print("vocab split bench: ok")
