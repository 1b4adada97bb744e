"""What the GPU benchmark scripts (two_nodes_gpu.py, vocab_split_bench.py) share: the shard of
random tokens they train on, the overrides every run takes, and the steps a run logged
with their medians."""
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys


def write_random_shard(path, n_tokens, seed=1, below=50257):
    """Writes `path` unless it exists: llm.c's layout (a 256-int header: magic 20240520, the
    version, the token count; then the tokens), tokens drawn uniformly below `below` (GPT-2's
    50257 by default) by Python's `random` (results before it came from numpy's generator, other
    tokens from the same seed): version 1 (uint16) when they fit, version 2 (uint32) when not."""
    path = pathlib.Path(path)
    if path.exists():
        return path
    import array
    import random
    path.parent.mkdir(parents=True, exist_ok=True)
    wide = below > 65536
    hdr = array.array("i", [20240520, 2 if wide else 1, n_tokens] + [0] * 253)
    tokens = array.array("I" if wide else "H",
                         random.Random(seed).choices(range(below), k=n_tokens))
    if sys.byteorder != "little":
        hdr.byteswap()
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(tokens.tobytes())
    return path


def benchmark_sets(data_dir, steps, out_dir, run_name):
    """The `--set`s of every benchmark run: the random shard, `steps` steps of one micro-batch, no
    evaluation, samples or checkpoints (GPT-2 1558M's last one alone is 20 GB, minutes of device
    time), and where the run goes."""
    return [f"data.train={data_dir}/train_*.bin", "data.val=", f"train.max_steps={steps}",
            "train.eval_every=0", "train.log_every=1000", "train.checkpoint_every=0",
            "train.checkpoint_at_end=false", "train.sample_every=0", "train.grad_accum=1",
            f"train.out_dir={out_dir}", f"train.run_name={run_name}"]


def source_commit(root):
    """The commit the tree was built from: ZGPT_COMMIT where the caller gives it, else git's HEAD,
    marked "+modified" where tracked files differ from it (a working copy with edits, or a copy
    of the tree on another machine whose .git is older than its files)."""
    if os.environ.get("ZGPT_COMMIT"):
        return os.environ["ZGPT_COMMIT"]
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True).stdout.strip()
    return head + "+modified" if head and changed else head


def clear_run(run_dir):
    """Removes what an earlier run of this name left, before the run starts: `train` refuses a
    directory that holds a run, and the old metrics would then stand for the new run's."""
    shutil.rmtree(run_dir, ignore_errors=True)


def logged_steps(run_dir):
    """The step lines (those with a loss) of the run's metrics.jsonl; [] where it has none yet."""
    f = pathlib.Path(run_dir) / "metrics.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
    return [r for r in rows if "loss" in r]


def timed_median(rows, key):
    """The median of `key` over the steps past the first third (the GEMM search and warm-up);
    None where there are no steps or one lacks the key."""
    timed = rows[len(rows) // 3:]
    return statistics.median(r[key] for r in timed) if timed and all(
        key in r for r in timed) else None
