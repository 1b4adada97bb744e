#!/usr/bin/env python3
"""Two nodes on one GPU machine: two launchers, each given its own half of the GPUs and its own
NCCL host identity (NCCL_HOSTID), so NCCL treats them as two machines. Between them it takes its
network transport, sockets over loopback (NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo,
NCCL_IB_DISABLE), and every gradient byte that crosses the nodes crosses a TCP link; inside a
node it keeps NVLink, as on a real machine.

  1. Correctness (GPT-2 124M, kernels.matmul_search=1 so every run takes the same GEMMs): one node
     of all GPUs over NVLink, then two nodes started three ways: `train --nnodes 2` launchers,
     torchrun twice (--nnodes 2 --node_rank 0|1 --no-python) and the variables srun sets. Their
     per-step losses must equal the one-node run's bit for bit. With one GPU a node the sums of
     the all-reduce have two terms, a + b = b + a, so nothing but a wrong rank or a lost reduction
     can move them; with two a node NCCL's reduction order may differ between the layouts, and
     the bound is then the one tests/two_nodes.py argues (1e-6 relative over these few steps).
     NCCL's own log must show the nodes joined through NET/Socket.
  2. A node killed mid-run (SIGKILL to node 1's launcher and its ranks) stops node 0 within
     parallel.timeout_s, non-zero, with an error that names a rank of node 1.
  3. Speed: the gradient all-reduce in buckets during the backward pass (parallel.grad_bucket_mb)
     against one after it, on the socket link and on NVLink, for GPT-2 124M (B=64) and 1558M
     (B=16, no accumulation, so the all-reduce is as exposed as it gets); with two or more GPUs a
     node, NCCL's hierarchical tree against its ring across the nodes (NCCL_ALGO); and NCCL's
     bus bandwidth over both links (build-gpu/nccl_bandwidth: one process, so the socket link is
     forced there with NCCL_P2P_DISABLE and NCCL_SHM_DISABLE).

    python3 tools/gpu/two_nodes_gpu.py --bin build-gpu --json OUT.json [--deadline-s 420]

Parts run in the order above and stop starting new runs once --deadline-s has passed; the JSON is
rewritten after every run, so a cut-short call keeps what it measured.
"""
import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

from bench_runs import (benchmark_sets, clear_run, logged_steps, source_commit, timed_median,
                        write_random_shard)

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
# Between the nodes: NCCL's socket transport on loopback (each node also gets NCCL_HOSTID).
SOCKET_ENV = {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo",
              "NCCL_DEBUG": "INFO"}
# One process driving every GPU (nccl_bandwidth) has one host identity: the socket link is forced.
ONE_PROCESS_SOCKET_ENV = dict(SOCKET_ENV, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
BOUND = 1e-6  # relative, for more than one GPU a node (see the docstring)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build-gpu")
    ap.add_argument("--json", required=True)
    ap.add_argument("--work", default="/tmp/zgpt_two_nodes_gpu")
    ap.add_argument("--deadline-s", type=float, default=420)
    ap.add_argument("--parts", default="correct,kill,speed")
    ap.add_argument("--models", default="124m,1558m")
    ap.add_argument("--set", action="append", default=[], dest="sets",
                    help="a config override added to every run (a smoke test of this script "
                         "on the CPU: --set train.device=cpu with a small model)")
    a = ap.parse_args()
    started = time.time()
    binp = pathlib.Path(a.bin).resolve()
    work = pathlib.Path(a.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    gpus = int(subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              text=True).stdout.count("GPU "))
    if gpus < 2 or gpus % 2:
        sys.exit(f"two_nodes_gpu: needs an even number of GPUs, 2 or more (found {gpus})")
    per_node = gpus // 2
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "NCCL_", "TORCHELASTIC_")) and k not in
                ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "CUDA_VISIBLE_DEVICES")}
    base_env["NCCL_NVLS_ENABLE"] = "0"
    commit = source_commit(ROOT)
    record = {"what": "tools/gpu/two_nodes_gpu.py: two launchers as two nodes of one machine, "
                      "NCCL over loopback sockets between them",
              "command": "python3 tools/gpu/two_nodes_gpu.py --bin BUILD --json FILE",
              "commit": commit, "gpus": gpus, "gpus_per_node": per_node,
              "socket_env": SOCKET_ENV, "runs": {}, "checks": [], "rows": []}
    failures = []

    def save():
        record["failures"] = failures
        record["seconds"] = round(time.time() - started, 1)
        pathlib.Path(a.json).write_text(json.dumps(record, indent=1) + "\n")

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        record["checks"].append({"ok": bool(ok), "what": what})
        if not ok:
            failures.append(what)
        save()

    def time_left():
        return a.deadline_s - (time.time() - started)

    # random GPT-2 tokens in llm.c's shard layout
    data = work / "data"
    write_random_shard(data / "train_000.bin", 70 * 65536 * gpus + 1025)

    def sets(model, run, steps, extra):
        cfg = {"124m": "configs/gpt2-124m.yaml", "1558m": "configs/gpt2-1558m.yaml"}[model]
        out = ["-c", str(ROOT / cfg)]
        for s in [*benchmark_sets(data, steps, work / "runs", run), "optim.warmup_steps=10",
                  *extra, *a.sets]:
            out += ["--set", s]
        return out

    def start(cmd, env, log):
        with open(log, "w") as f:
            return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    cwd=ROOT, start_new_session=True)

    def wait_all(procs, limit):
        end = time.time() + limit
        for p in procs:
            try:
                p.wait(timeout=max(1, end - time.time()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    try:
                        os.killpg(q.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    q.wait()
        return [p.returncode for p in procs]

    def metrics(run):
        return logged_steps(work / "runs" / run)

    def node_gpus(node):
        return ",".join(str(node * per_node + i) for i in range(per_node))

    def one_node(run, model, steps, extra, limit=240):
        clear_run(work / "runs" / run)
        cmd = [str(binp / "train"), *sets(model, run, steps, extra), "--nproc", str(gpus)]
        rc = wait_all([start(cmd, base_env, work / "logs" / f"{run}.log")], limit)
        return rc

    def two_nodes(run, model, steps, extra, how="launchers", limit=240, timeout_s=120,
                  env_extra=None):
        """Starts the two nodes; returns the processes (launchers, torchrun agents or ranks)."""
        port = free_port()
        clear_run(work / "runs" / run)
        extra = [f"parallel.timeout_s={timeout_s}", *extra]
        procs = []
        for node in (0, 1):
            env = dict(base_env, **SOCKET_ENV, CUDA_VISIBLE_DEVICES=node_gpus(node),
                       NCCL_HOSTID=f"zgpt-two-nodes-{node}", **(env_extra or {}))
            log = work / "logs" / f"{run}_node{node}.log"
            train = [str(binp / "train"), *sets(model, run, steps, extra)]
            if how == "launchers":
                cmd = train + ["--nproc", str(per_node), "--nnodes", "2", "--node-rank",
                               str(node), "--master-addr", "127.0.0.1", "--master-port",
                               str(port)]
                procs.append(start(cmd, env, log))
            elif how == "torchrun":
                cmd = [sys.executable, "-m", "torch.distributed.run", "--no-python", "--nnodes", "2", "--node_rank", str(node),
                       "--nproc_per_node", str(per_node), "--master_addr", "127.0.0.1",
                       "--master_port", str(port), *train]
                procs.append(start(cmd, env, log))
            else:  # srun's variables, one process a rank
                for local in range(per_node):
                    r = node * per_node + local
                    env_r = dict(env, SLURM_PROCID=str(r), SLURM_NTASKS=str(gpus),
                                 SLURM_LOCALID=str(local), SLURM_NODEID=str(node),
                                 SLURM_NNODES="2", SLURM_NTASKS_PER_NODE=str(per_node),
                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                    procs.append(start(train, env_r, work / "logs" / f"{run}_rank{r}.log"))
        return procs

    def socket_evidence(run):
        """NCCL's own words that the two nodes' ranks talk through its socket transport."""
        text = "".join(p.read_text(errors="replace")
                       for p in (work / "logs").glob(f"{run}_*.log"))
        return {"net_socket_lines": text.count("NET/Socket"),
                "via_net_lines": text.count("via NET/Socket"),
                "via_p2p_or_shm_lines": text.count("via P2P") + text.count("via SHM")}

    def summary(run):
        rows = metrics(run)
        return {"steps": len(rows), "step_ms": timed_median(rows, "step_ms"),
                "tok_per_s": timed_median(rows, "tok_per_s"),
                "grad_all_reduce_ms": timed_median(rows, "grad_all_reduce_ms"),
                "compute_ms": timed_median(rows, "compute_ms"),
                "losses": [r["loss"] for r in rows]}

    parts = a.parts.split(",")
    steps_c = 10
    # ---- 1. correctness ----
    if "correct" in parts:
        fixed = ["kernels.matmul_search=1", "train.batch_size=16"]
        rc = one_node("ref", "124m", steps_c, fixed)
        ref = [r["loss"] for r in metrics("ref")]
        record["runs"]["ref"] = {"link": "nvlink", "nodes": 1, "rc": rc, "losses": ref}
        check(rc == [0] and len(ref) == steps_c,
              f"one node of {gpus} GPUs: {len(ref)} of {steps_c} steps (exit {rc})")
        for how in ("launchers", "torchrun", "srun"):
            if time_left() < 60:
                break
            run = f"two_{how}"
            procs = two_nodes(run, "124m", steps_c, fixed, how)
            rc = wait_all(procs, 240)
            got = [r["loss"] for r in metrics(run)]
            ev = socket_evidence(run)
            worst = max((abs(x - y) / abs(y) for x, y in zip(got, ref)), default=float("inf"))
            record["runs"][run] = {"link": "socket", "nodes": 2, "rc": rc, "losses": got,
                                   "largest_rel_diff": worst, "nccl": ev}
            check(all(r == 0 for r in rc) and len(got) == steps_c,
                  f"{run}: {len(got)} of {steps_c} steps, exits {rc}")
            # one GPU a node: every connection crosses the nodes, so none may be P2P or SHM
            check(ev["via_net_lines"] > 0 and (per_node > 1 or ev["via_p2p_or_shm_lines"] == 0),
                  f"{run}: NCCL connects the nodes through its socket transport ({ev})")
            # the link-chosen default: buckets across nodes (rank 0 says so)
            text = "".join(q.read_text(errors="replace")
                           for q in (work / "logs").glob(f"{run}_*.log"))
            check("parallel.grad_bucket_mb: 25 (the ranks span 2 nodes" in text,
                  f"{run}: the gradient all-reduce in buckets by default across the nodes")
            if per_node == 1:
                check(got == ref, f"{run}: losses equal one node's bit for bit" +
                      ("" if got == ref else f" (largest difference {worst:.3g} relative)"))
            else:
                check(len(got) == steps_c and worst <= BOUND,
                      f"{run}: losses equal one node's within {BOUND:g} (largest {worst:.3g})")
    # ---- 2. a node killed mid-run ----
    if "kill" in parts and time_left() > 60:
        run, timeout_s = "kill_node1", 20
        procs = two_nodes(run, "124m", 100000, ["kernels.matmul_search=1", "train.batch_size=16"],
                          timeout_s=timeout_s)
        deadline = time.time() + 120
        while time.time() < deadline and len(metrics(run)) < 3 and \
                all(p.poll() is None for p in procs):
            time.sleep(0.05)
        logged = len(metrics(run))
        os.killpg(procs[1].pid, signal.SIGKILL)  # node 1's launcher and its ranks
        killed = time.time()
        try:
            procs[0].wait(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait()
        took = time.time() - killed
        procs[1].wait()
        log = (work / "logs" / f"{run}_node0.log").read_text(errors="replace")
        dead = [str(per_node + i) for i in range(per_node)]
        named = [x for x in log.splitlines() if x.startswith("error: ") and
                 any(f"rank {r} " in x for r in dead)]
        record["stop"] = {"steps_logged_before": logged, "timeout_s": timeout_s,
                          "stopped_after_s": round(took, 2), "exit": procs[0].returncode,
                          "error": named[0] if named else log[-800:]}
        check(logged >= 3, f"{run}: node 1 killed mid-run ({logged} steps logged)")
        check(procs[0].returncode not in (0, None) and took <= timeout_s,
              f"{run}: node 0 stopped in {took:.2f} s (parallel.timeout_s {timeout_s}), "
              f"exit {procs[0].returncode}")
        check(bool(named), f"{run}: node 0 names a rank of node 1: "
              f"{named[0] if named else log[-300:]!r}")
    # ---- 3. speed: buckets against one all-reduce, socket and NVLink ----
    if "speed" in parts:
        for link, env in (("socket", ONE_PROCESS_SOCKET_ENV), ("nvlink", {})):
            if time_left() < 30 or not (binp / "nccl_bandwidth").exists():
                break
            r = subprocess.run([str(binp / "nccl_bandwidth"), "--gpus", str(gpus), "--out",
                                str(work / f"nccl_{link}.json")], env=dict(base_env, **env),
                               capture_output=True, text=True, timeout=120)
            (work / "logs" / f"nccl_{link}.log").write_text(r.stdout + r.stderr)
            if r.returncode == 0:
                record[f"nccl_bandwidth_{link}"] = json.loads(
                    (work / f"nccl_{link}.json").read_text())
            save()
        plans = {"124m": (30, ["train.batch_size=64"], (0, 25)),
                 "1558m": (8, ["train.batch_size=16"], (0, 25))}
        for model in a.models.split(","):
            steps, extra, buckets = plans[model]
            for link in ("nvlink", "socket"):
                for mb in buckets:
                    if time_left() < (90 if model == "1558m" else 40):
                        print(f"skipped {model} {link} bucket {mb}: past the deadline")
                        continue
                    run = f"{model}_{link}_bucket{mb}"
                    x = extra + [f"parallel.grad_bucket_mb={mb}"]
                    if link == "nvlink":
                        rc = one_node(run, model, steps, x, limit=time_left() + 90)
                    else:
                        rc = wait_all(two_nodes(run, model, steps, x), time_left() + 90)
                    s = summary(run)
                    row = {"model": model, "nodes": 2 if link == "socket" else 1, "gpus": gpus,
                           "link": link, "bucket_mb": mb, "tok_per_s": s["tok_per_s"],
                           "step_ms": s["step_ms"], "grad_all_reduce_ms": s["grad_all_reduce_ms"],
                           "compute_ms": s["compute_ms"], "steps": s["steps"], "exit": rc}
                    record["rows"].append(row)
                    record["runs"][run] = s
                    print(f"{run:28s} {s['tok_per_s'] or 0:11.0f} tok/s  step "
                          f"{s['step_ms'] or 0:8.1f} ms  all-reduce "
                          f"{s['grad_all_reduce_ms'] or 0:8.1f} ms  passes "
                          f"{s['compute_ms'] or 0:8.1f} ms  exit {rc}", flush=True)
                    save()
            # Hierarchical or not, across the nodes: NCCL's tree reduces inside each node over
            # NVLink and crosses the link once per node; its ring crosses it on every hop that
            # leaves a node. Both, where a node has more than one GPU.
            for algo in (("Ring", "Tree") if per_node > 1 else ()):
                if time_left() < (90 if model == "1558m" else 40):
                    continue
                run = f"{model}_socket_{algo.lower()}"
                rc = wait_all(two_nodes(run, model, steps, extra + ["parallel.grad_bucket_mb=0"],
                                        env_extra={"NCCL_ALGO": algo}), time_left() + 90)
                s = summary(run)
                record["rows"].append({"model": model, "nodes": 2, "gpus": gpus, "link": "socket",
                                       "bucket_mb": 0, "nccl_algo": algo,
                                       "tok_per_s": s["tok_per_s"], "step_ms": s["step_ms"],
                                       "grad_all_reduce_ms": s["grad_all_reduce_ms"],
                                       "steps": s["steps"], "exit": rc})
                record["runs"][run] = s
                print(f"{run:28s} {s['tok_per_s'] or 0:11.0f} tok/s  all-reduce "
                      f"{s['grad_all_reduce_ms'] or 0:8.1f} ms  exit {rc}", flush=True)
                save()
    save()
    print(f"two nodes on GPUs: {'ok' if not failures else f'{len(failures)} failed'} "
          f"({time.time() - started:.0f} s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
