#!/usr/bin/env python3
"""Two nodes on one machine, on the CPU: two `train --nproc 2 --nnodes 2 --node-rank 0|1` launchers
(torchrun's layout), four processes started with the variables srun sets (SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID), two `train --nproc 2` launchers as srun starts
them with one task a node, and torchrun itself started twice (where it is installed), each a run
of 4 ranks over the tcp communicator.

  1. Their per-step losses equal, bit for bit, 4 thread ranks of one process (parallel.local_ranks),
     which add in the same rank order; and one rank with the same global batch within 1e-6
     relative (the bound argued at BOUND below).
  2. A node killed mid-run (SIGKILL to its launcher and its ranks) stops the other node's launcher
     and ranks within parallel.timeout_s, non-zero, with an error naming a dead rank and why;
     for node 1 (a worker node) and for node 0 (the master's node). A frozen node 1 (SIGSTOP: it
     sends nothing, as a host whose power or network is gone) likewise, by the heartbeats.

    python3 tests/two_nodes.py --bin build [--work DIR] [--offset-node1] [--json FILE]
        [--torch-python PYTHON]

--json writes what was measured (the losses, the largest difference from one rank, each stopped
node's time and message) with the commit and machine, as in docs/results/two_nodes_cpu.json.

--offset-node1 shows that part 1 can fail: node 1's ranks read the same text shifted by one
character, so their batches are offset; the script must then report failures.
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIMEOUT_S = 10  # parallel.timeout_s of the kill runs: a node's death must be noticed within it

# BOUND: the one-rank run adds each gradient element over its 8 sequences in one pass; 4 ranks add
# 4 partial sums of 2 sequences in rank order. The runs differ only in that fp32 summation order:
# each gradient element by a few ulps of the sum of its terms' magnitudes (~1e-7 relative), and
# the loss, a smooth function of the weights, follows at that order over these few steps. 1e-6
# relative is the bound tests/test_parallel.cpp argues for the same comparison in one process.
BOUND = 1e-6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build")
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed after)")
    ap.add_argument("--offset-node1", action="store_true",
                    help="node 1 reads the text shifted by one character (part 1 must then fail)")
    ap.add_argument("--json", help="write the measurements to this file")
    ap.add_argument("--torch-python", help="a Python with PyTorch: its torchrun runs part 1d")
    a = ap.parse_args()
    binp = pathlib.Path(a.bin).resolve()
    work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="zgpt_two_nodes_")).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # No rank variables from whoever runs the test; one thread a rank (2 cores, 4 ranks).
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith("SLURM_") and k not in
                ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    base_env["OMP_NUM_THREADS"] = "1"
    failures = []
    started = time.time()
    record = {"runs": {}, "stops": []}

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    # a character-level text and its shards; the same text shifted by one character
    words = ["the", "king", "said", "unto", "them", "and", "lo", "a", "voice", "of", "many"]
    text = "".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(10)) + ".\n"
                   for i in range(300))
    for name, t in (("text", text), ("shifted", text[1:] + text[0])):
        (work / f"{name}.txt").write_text(t)
        r = subprocess.run([str(binp / "prepare_data"), "--input", str(work / f"{name}.txt"),
                            "--out", str(work / name)], capture_output=True, text=True,
                           env=base_env, timeout=120)
        if r.returncode != 0:
            sys.exit(f"FAIL prepare_data: {r.stdout}{r.stderr}")

    def argv(run, steps, extra=(), data="text"):
        sets = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
                "model.vocab_size=0", "model.bias=true", f"train.max_steps={steps}",
                "train.eval_every=4", "train.eval_batches=2", "train.log_every=1000",
                "train.checkpoint_every=0", "train.threads=1", "train.device=cpu",
                f"train.out_dir={work / 'runs'}", f"train.run_name={run}", "optim.warmup_steps=2",
                f"data.train={work}/{data}/train_*.bin", f"data.val={work}/{data}/val_*.bin",
                *extra]
        out = [str(binp / "train"), "-c", str(ROOT / "configs/shakespeare-char-cpu.yaml")]
        for s in sets:
            out += ["--set", s]
        return out

    def losses(run):
        f = work / "runs" / run / "metrics.jsonl"
        if not f.exists():
            return [], []
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        return ([x["loss"] for x in lines if "loss" in x],
                [x["val_loss"] for x in lines if "val_loss" in x])

    def wait_all(procs, what, limit=120):
        outs = []
        for p, log in procs:
            try:
                p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                for q, _ in procs:
                    q.kill()
                sys.exit(f"FAIL {what}: still running after {limit} s")
            outs.append(log.read_text(errors="replace"))
        return outs

    def start(cmd, env, log):
        f = open(log, "w")
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        f.close()
        return p, log

    def launchers(run, steps, extra=(), offset=False, timeout_s=60):
        port = free_port()
        procs = []
        for node in (0, 1):
            cmd = argv(run, steps, [f"parallel.timeout_s={timeout_s}", *extra],
                       data="shifted" if offset and node == 1 else "text")
            cmd += ["--nproc", "2", "--nnodes", "2", "--node-rank", str(node),
                    "--master-addr", "127.0.0.1", "--master-port", str(port)]
            procs.append(start(cmd, base_env, work / f"{run}_node{node}.log"))
        return procs

    steps = 8
    # reference runs: one rank of global batch 8, and 4 thread ranks of batch 2 in one process
    one = start(argv("one", steps, ["train.batch_size=8"]), base_env, work / "one.log")
    wait_all([one], "one rank")
    thr = start(argv("threads", steps, ["train.batch_size=2", "parallel.local_ranks=4"]),
                base_env, work / "threads.log")
    wait_all([thr], "4 thread ranks")
    ref1, ref_val1 = losses("one")
    ref4, ref_val4 = losses("threads")
    if len(ref1) != steps or len(ref4) != steps:
        sys.exit(f"FAIL reference runs: {len(ref1)} and {len(ref4)} of {steps} steps logged")

    def compare(run):
        got, got_val = losses(run)
        check(len(got) == steps, f"{run}: {len(got)} of {steps} steps logged")
        same = got == ref4 and got_val == ref_val4
        check(same, f"{run}: losses and val losses equal 4 thread ranks bit for bit" +
              ("" if same else f" (got {got}, want {ref4})"))
        worst = max((abs(g - w) / abs(w) for g, w in zip(got + got_val, ref1 + ref_val1)),
                    default=float("inf"))
        check(len(got) == steps and worst <= BOUND,
              f"{run}: losses equal one rank of batch 8 within {BOUND:g} relative "
              f"(largest {worst:.3g})")
        record["runs"][run] = {"loss": got, "val_loss": got_val, "same_as_4_thread_ranks": same,
                               "largest_rel_diff_from_one_rank": worst}

    # 1a. two launchers, torchrun's layout
    outs = wait_all(launchers("torchrun", steps, ["train.batch_size=2"], a.offset_node1),
                    "two launchers")
    check("launch: node 1 of 2 starts ranks 2..3 of 4; they meet at 127.0.0.1:" in outs[1],
          "node 1's launcher says which ranks it starts and where they meet")
    compare("torchrun")
    # the link-chosen bucket default applies to GPU ranks only: the CPU's sum stays after the pass
    check("parallel.grad_bucket_mb: " not in outs[0] and
          "grad_bucket_mb: 0\n" in (work / "runs" / "torchrun" / "config.yaml").read_text(),
          "CPU ranks across nodes keep one all-reduce after the pass (parallel.grad_bucket_mb 0)")

    # 1b. four processes as srun starts them: 2 nodes x 2 tasks
    port = free_port()
    procs = []
    for r in range(4):
        env = dict(base_env, SLURM_PROCID=str(r), SLURM_NTASKS="4", SLURM_LOCALID=str(r % 2),
                   SLURM_NODEID=str(r // 2), SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        data = "shifted" if a.offset_node1 and r >= 2 else "text"
        procs.append(start(argv("slurm", steps, ["train.batch_size=2"], data), env,
                           work / f"slurm_rank{r}.log"))
    wait_all(procs, "srun-style ranks")
    check(all(p.returncode == 0 for p, _ in procs),
          f"srun-style ranks exit 0 ({[p.returncode for p, _ in procs]})")
    compare("slurm")

    # 1c. srun starting one launcher a node (one task a node): `train --nproc 2`, the node count
    # and this node's number from SLURM_NTASKS / SLURM_NNODES and SLURM_NODEID
    port = free_port()
    procs = []
    for n in (0, 1):
        env = dict(base_env, SLURM_PROCID=str(n), SLURM_NTASKS="2", SLURM_LOCALID="0",
                   SLURM_NODEID=str(n), SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        data = "shifted" if a.offset_node1 and n == 1 else "text"
        procs.append(start(argv("srun_launchers", steps, ["train.batch_size=2"], data) +
                           ["--nproc", "2"], env, work / f"srun_launcher{n}.log"))
    outs = wait_all(procs, "srun-started launchers")
    check(all(p.returncode == 0 for p, _ in procs),
          f"srun-started launchers exit 0 ({[p.returncode for p, _ in procs]})")
    check("launch: node 1 of 2 starts ranks 2..3 of 4" in outs[1],
          "an srun task with --nproc is its node's launcher, numbered by SLURM_NODEID")
    compare("srun_launchers")

    # 1d. torchrun itself, started twice as on two machines (`--no-python`: train is no script);
    # its agent on node 0 holds MASTER_PORT, so the ranks meet on the port above it
    pythons = [p for p in (a.torch_python, sys.executable) if p]
    torchrun = shutil.which("torchrun", path=os.pathsep.join(
        [str(pathlib.Path(p).parent) for p in pythons] + [os.environ.get("PATH", "")]))
    if torchrun is None:
        print("skip torchrun twice: no torchrun beside --torch-python or this Python, or on PATH "
              "(PyTorch installs it)", flush=True)
        record["runs"]["torchrun_itself"] = "skipped: no torchrun"
    else:
        port = free_port()
        procs = []
        for node in (0, 1):
            data = "shifted" if a.offset_node1 and node == 1 else "text"
            cmd = [torchrun, "--no-python", "--nnodes", "2", "--node_rank", str(node),
                   "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                   str(port)] + argv("torchrun_itself", steps, ["train.batch_size=2"], data)
            procs.append(start(cmd, base_env, work / f"torchrun_itself_node{node}.log"))
        wait_all(procs, "torchrun twice")
        check(all(p.returncode == 0 for p, _ in procs),
              f"torchrun twice exits 0 ({[p.returncode for p, _ in procs]})")
        compare("torchrun_itself")

    # 2. a node killed mid-run: the other stops within parallel.timeout_s, naming a dead rank
    def children(pid):
        try:
            return [int(x) for x in
                    pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def alive(pid):
        try:  # a zombie is dead: only its parent's wait is missing
            return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    # SIGKILL closes the dead node's sockets at once; SIGSTOP freezes node 1 the way a host that
    # lost power or its network looks: nothing arrives, not even an end-of-file, so only the
    # heartbeats' silence can show it. That is noticed after timeout_s of silence plus at most one
    # heartbeat interval (timeout_s / 4) on each side, hence the bound 1.5 timeout_s for it.
    for dead, sig in ((1, signal.SIGKILL), (0, signal.SIGKILL), (1, signal.SIGSTOP)):
        run = f"{'kill' if sig == signal.SIGKILL else 'freeze'}_node{dead}"
        timeout_s = TIMEOUT_S if sig == signal.SIGKILL else 4
        limit = timeout_s if sig == signal.SIGKILL else 1.5 * timeout_s
        procs = launchers(run, 100000, ["train.batch_size=2", "train.log_every=1"],
                          timeout_s=timeout_s)
        deadline = time.time() + 60
        # mid-run: rank 0 has logged 3 steps, so all 4 ranks are in the training loop
        while time.time() < deadline and len(losses(run)[0]) < 3 and \
                all(p.poll() is None for p, _ in procs):
            time.sleep(0.01)
        victim, other = procs[dead][0], procs[1 - dead][0]
        ranks = {n: children(procs[n][0].pid) for n in (0, 1)}
        check(len(losses(run)[0]) >= 3 and len(ranks[0]) == 2 and len(ranks[1]) == 2,
              f"{run}: both launchers run 2 ranks mid-run ({len(losses(run)[0])} steps logged)")
        for pid in ranks[dead] + [victim.pid]:
            os.kill(pid, sig)
        killed_at = time.time()
        try:
            other.wait(timeout=limit + 30)
        except subprocess.TimeoutExpired:
            other.kill()
        took = time.time() - killed_at
        for pid in ranks[dead] + [victim.pid]:  # a frozen node is ended now
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        victim.wait()
        log = procs[1 - dead][1].read_text(errors="replace")
        dead_ranks = [2 * dead, 2 * dead + 1]
        named = [x for x in log.splitlines() if x.startswith("error: ") and
                 any(f"rank {r} " in x for r in dead_ranks)]
        why = ("exited", "closed its connection") if sig == signal.SIGKILL else \
            ("sent nothing for", "did not answer", "timed out")
        check(other.returncode not in (0, None) and took <= limit,
              f"{run}: node {1 - dead} stopped in {took:.2f} s (limit {limit:g} s, "
              f"parallel.timeout_s {timeout_s}), exit {other.returncode}")
        check(bool(named) and any(w in named[0] for w in why),
              f"{run}: node {1 - dead} names a rank of node {dead} and why: "
              f"{named[0] if named else log[-600:]!r}")
        # SIGKILL to a stopped process takes a moment; a rank still running after 5 s is left over
        left_by = time.time() + 5
        while time.time() < left_by and any(alive(pid) for pid in ranks[0] + ranks[1]):
            time.sleep(0.05)
        left = [pid for pid in ranks[0] + ranks[1] if alive(pid)]
        check(not left, f"{run}: no rank process is left ({left})")
        record["stops"].append({"run": run, "signal": signal.Signals(sig).name,
                                "node": dead, "timeout_s": timeout_s, "stopped_after_s": took,
                                "exit": other.returncode, "error": named[0] if named else None})

    if a.json:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        record = {"what": "tests/two_nodes.py: 2 launchers x 2 CPU ranks over tcp on one machine",
                  "command": "python3 tests/two_nodes.py --bin BUILD --json FILE",
                  "commit": commit, "cpus": os.cpu_count(), "steps": steps,
                  "global_batch": 8, "bound_vs_one_rank": BOUND,
                  "one_rank": {"loss": ref1, "val_loss": ref_val1},
                  "four_thread_ranks": {"loss": ref4, "val_loss": ref_val4}, **record,
                  "failures": failures, "seconds": round(time.time() - started, 1)}
        pathlib.Path(a.json).write_text(json.dumps(record, indent=1) + "\n")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"two nodes: {'ok' if not failures else f'{len(failures)} failed'} "
          f"({time.time() - started:.1f} s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
