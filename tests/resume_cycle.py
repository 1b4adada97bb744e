#!/usr/bin/env python3
"""A CPU run's whole life through the binaries: train, SIGKILL mid-run, train --resume to the end,
then sample and export_hf from the run folder. Then newer checkpoints that cannot be used (a
directory, a FIFO, a link to /dev/null, a checksum-valid header without its tensor table, a data
position past the end of an epoch) are put beside the good ones: train --resume, sample --run and
export_hf --run must each take the newest checkpoint that loads for them and name every refused
newer one in one line. Under tools/test_sanitizers.sh this is the resume path under ASan + UBSan.

    python3 tests/resume_cycle.py --bin build [--work DIR]
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools" / "dev"))
from bad_inputs import Checkpoint  # noqa: E402  (the checkpoint layout, read and rewritten)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build")
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed after)")
    a = ap.parse_args()
    binp = pathlib.Path(a.bin).resolve()
    work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="zgpt_resume_cycle_")).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def tool(*args, expect=0):
        r = subprocess.run([str(binp / args[0]), *map(str, args[1:])], capture_output=True,
                           text=True, errors="replace", env=env, timeout=300)
        if r.returncode != expect:
            sys.exit(f"FAIL {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    # a character-level text, its shards; the CPU recipe's config made tiny
    words = ["the", "king", "said", "unto", "them", "and", "lo", "a", "voice", "of", "many"]
    text = "".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(10)) + ".\n"
                   for i in range(300))
    (work / "text.txt").write_text(text)
    tool("prepare_data", "--input", work / "text.txt", "--out", work / "shards")
    run = work / "runs" / "cycle"
    sets = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
            "model.vocab_size=0", "model.bias=true", "train.batch_size=2", "train.max_steps=100000", "train.eval_every=0",
            "train.log_every=1000", "train.checkpoint_every=5", "train.keep_checkpoints=3",
            "train.threads=1", "train.device=cpu", f"train.out_dir={run.parent}", "train.run_name=cycle",
            "optim.warmup_steps=2", f"data.train={work}/shards/train_*.bin", f"data.val={work}/shards/val_*.bin",
            "train.eval_batches=1"]
    argv = [str(binp / "train"), "-c", str(ROOT / "configs/shakespeare-char-cpu.yaml")]
    for s in sets:
        argv += ["--set", s]

    # 1. train, killed with SIGKILL once it has two checkpoints
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and \
            len(list((run / "checkpoints").glob("ckpt_*.bin"))) < 2:
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    check(p.returncode == -signal.SIGKILL, f"train killed by SIGKILL (exit {p.returncode})")
    steps = sorted(int(f.stem[5:]) for f in (run / "checkpoints").glob("ckpt_*.bin"))
    check(len(steps) >= 2 and not (run / "summary.json").exists(),
          f"the killed run left checkpoints {steps} and no summary")
    last = steps[-1]
    end = last + 7

    # 2. resume to the end: it continues from the newest checkpoint and finishes
    r = tool("train", "--resume", run, "--set", f"train.max_steps={end}")
    check(f"ckpt_{last}.bin at step {last}" in r.stdout, f"resumed from step {last}")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    got = [x["step"] for x in lines if "loss" in x]
    check(got == list(range(1, end + 1)),
          f"metrics.jsonl has each step once, 1..{end} (got {got[:3]}..{got[-3:]}, {len(got)} lines)")
    summary = json.loads((run / "summary.json").read_text())
    check(summary.get("steps") == end, f"summary.json says the run ended at step {end}")

    # 3. sample and export from the finished run
    r = tool("sample", "--run", run, "-n", "16", "-s", "1")
    check(f"ckpt_{end}.bin (step {end})" in r.stderr and len(r.stdout.strip()) > 0,
          f"sample --run uses ckpt_{end}.bin")
    r = tool("export_hf", "--run", run, "-o", work / "hf")
    check((work / "hf/model.safetensors").exists() and f"ckpt_{end}.bin" in r.stdout,
          f"export_hf --run exports ckpt_{end}.bin")

    # 4. newer checkpoints none of the readers can use, and one only train refuses
    ck = run / "checkpoints"
    good = Checkpoint((ck / f"ckpt_{end}.bin").read_bytes())
    (ck / f"ckpt_{end + 500}.bin").mkdir()
    os.mkfifo(ck / f"ckpt_{end + 400}.bin")
    (ck / f"ckpt_{end + 300}.bin").symlink_to("/dev/null")
    (ck / f"ckpt_{end + 200}.bin").write_bytes(
        good.bytes(header={k: v for k, v in good.header.items() if k != "tensors"}))
    past = dict(good.header, step=end + 100, loader=dict(good.header["loader"], batch=10 ** 6))
    (ck / f"ckpt_{end + 100}.bin").write_bytes(good.bytes(header=past))
    unusable = [end + 500, end + 400, end + 300, end + 200]

    def refusals(stderr, steps_refused):
        for s in steps_refused:
            named = [x for x in stderr.splitlines() if f"ckpt_{s}.bin refused" in x]
            if len(named) != 1:
                return f"ckpt_{s}.bin named {len(named)} times"
        return ""

    r = tool("train", "--resume", run, "--set", f"train.max_steps={end + 3}")
    why = refusals(r.stderr, unusable + [end + 100])
    check(not why and f"ckpt_{end}.bin at step {end}" in r.stdout,
          f"train --resume falls back past 5 newer unusable checkpoints to step {end} {why}")
    check("past the end of an epoch" in r.stderr, "train names the data position past the epoch")
    check((ck / f"ckpt_{end + 3}.bin").exists() and (ck / f"ckpt_{end}.bin").exists(),
          "the resumed run's checkpoints are kept (the refused newer names do not push them out)")
    r = tool("sample", "--run", run, "-n", "8")
    why = refusals(r.stderr, unusable)
    check(not why and f"ckpt_{end + 100}.bin (step {end + 100})" in r.stderr,
          f"sample --run falls back to the newest that loads for it {why}")
    r = tool("export_hf", "--run", run, "-o", work / "hf2")
    why = refusals(r.stderr, unusable)
    check(not why and f"ckpt_{end + 100}.bin" in r.stdout and (work / "hf2/model.safetensors").exists(),
          f"export_hf --run falls back to the newest that loads for it {why}")

    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"resume cycle: {'ok' if not failures else f'{len(failures)} failed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
