#!/usr/bin/env python3
"""The anchors of `bench_ce --sweep`: Liger, torch.compile and (for the heads from hidden states)
Apple's Cut Cross-Entropy, timed at the sweep's points (N = 16384 rows, V = 1024 ... 256000,
bf16, z-loss 1e-4 where the anchor has it), forward alone and forward + backward. Run it in the
same device call as build-gpu/bench_ce --sweep; tools/bench/ce_sweep_table.py joins the two.

    python3 tools/bench/ce_sweep_anchors.py --out anchors.json [--heads logits,linear] [--hidden 768,2048]

Inputs: logits ~ 2 N(0,1) (bench_ce's spread is close: a triangular of std 1.39); hidden states
~ 0.5 N(0,1), weights ~ 0.02 N(0,1); uniform targets. Liger writes its gradient over the logits,
so every timed run starts from a fresh copy of them, copied outside the timed events (as
bench_ce does). Peak extra memory is what the run allocates beyond its inputs, the gradients
included. torch.compile compiles each shape on its own (dynamic=False, caches reset), so each point
gets the kernels it would get alone. Cut Cross-Entropy has no z-loss: it runs plain cross-entropy,
exact (filter_eps=None). The JSON is rewritten after every row, so a run cut short keeps its rows.
Each call is timed as its caller waits on it, its Python dispatch included (at small V that
dispatch is most of it); --queued also times it behind a spin kernel, the GPU's work alone
(torch_timing.time_ms), as a row's ms_queued.
"""
import argparse
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timing import bf16_matmul_flops, queued_ms, time_ms  # noqa: E402

Z = 1e-4
SWEEP_VOCAB = [1024, 2048, 4096, 8192, 16384, 32768, 50304, 128256, 256000]


def ce_z(x, y):
    xf = x.float()
    lse = torch.logsumexp(xf, -1)
    return F.cross_entropy(xf, y) + Z * (lse * lse).mean()


def linear_ce_z(h, w, y):
    return ce_z(h @ w.t(), y)


def anchors(head):
    """name -> fn(inputs..., y): the anchors of one head that import here."""
    out = {"torch_compile": torch.compile(ce_z if head == "logits" else linear_ce_z, dynamic=False)}
    try:
        if head == "logits":
            from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction as L
            out["liger"] = lambda x, y: L.apply(x, y, None, -100, Z, 0.0, "mean", None, False)[0]
        else:
            from liger_kernel.ops.fused_linear_cross_entropy import \
                LigerFusedLinearCrossEntropyFunction as L
            out["liger"] = lambda h, w, y: L.apply(h, w, y, None, None, -100, Z, 0.0, "mean", None,
                                                   False)[0]
    except Exception as e:  # say so and keep going
        print("liger unavailable:", repr(e), flush=True)
    if head == "linear":
        try:
            from cut_cross_entropy import linear_cross_entropy
            out["cce"] = lambda h, w, y: linear_cross_entropy(h, w, y, filter_eps=None)
        except Exception as e:
            print("cut_cross_entropy unavailable:", repr(e), flush=True)
    return out


def measure(fn, leaves, pristine, iters, queued=False):
    """(median ms, peak extra GB, loss, median ms queued or None) of fn() with gradients into
    `leaves` (none: forward alone); pristine: (tensor, copy) pairs restored before each run."""
    def restore():
        for t, p in pristine:
            t.data.copy_(p)

    def step():
        for t in leaves:
            t.grad = None
        if leaves:
            loss = fn()
            loss.backward()
        else:
            with torch.no_grad():
                loss = fn()
        return loss

    restore()
    loss = step()  # warm-up: compiles, autotunes
    torch.cuda.synchronize()
    for t in leaves:
        t.grad = None
    gc.collect()
    restore()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 1e9
    ms = time_ms(step, iters, before=restore)
    ms_queued = queued_ms(step, iters, ms, before=restore) if queued else None
    return ms, peak, float(loss), ms_queued


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--vocab", default=",".join(map(str, SWEEP_VOCAB)))
    ap.add_argument("--hidden", default="768,2048")
    ap.add_argument("--heads", default="logits,linear")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--queued", action="store_true",
                    help="also time each call queued behind a spin kernel (ms_queued)")
    args = ap.parse_args()
    torch.manual_seed(0)
    N = args.rows
    doc = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=[])
    import importlib.metadata as md
    for name, dist in (("liger", "liger-kernel"), ("cce", "cut-cross-entropy")):
        try:
            doc[name] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    doc["bf16_TFLOPs"] = round(bf16_matmul_flops() / 1e12, 1)

    def record(row):
        print(json.dumps(row), flush=True)
        doc["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    def run_point(head, name, fn, inputs, leaves, pristine, point):
        for mode in ("fwd", "fwd_bwd"):
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
            t0 = time.time()
            row = dict(anchor=name, head=head, mode=mode, N=N, **point)
            # forward alone: inputs that need no gradient (Liger computes its gradients in the
            # forward pass whenever the input requires them)
            xs = inputs if mode == "fwd_bwd" else tuple(t.detach() for t in inputs)
            try:
                ms, peak, loss, ms_q = measure(lambda: fn(*xs),
                                               leaves if mode == "fwd_bwd" else [], pristine,
                                               args.iters, args.queued)
                row.update(ms=round(ms, 4), extra_GB=round(peak, 6), loss=round(loss, 5))
                if args.queued:  # None: a call waits on the host inside (not measurable queued)
                    row.update(ms_queued=None if ms_q is None else round(ms_q, 4))
            except torch.OutOfMemoryError:
                row["note"] = "OOM"
            except Exception as e:
                row["note"] = repr(e)[:200]
            row["wall_s"] = round(time.time() - t0, 1)
            record(row)

    vocab = [int(v) for v in args.vocab.split(",")]
    heads = args.heads.split(",")
    if "logits" in heads:
        fns = anchors("logits")
        for V in vocab:
            y = torch.randint(0, V, (N,), device="cuda")
            pristine = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16)
            for name, fn in fns.items():
                x = pristine.clone().requires_grad_(True)
                run_point("logits", name, fn, (x, y), [x], [(x, pristine)], dict(V=V))
                del x
            del pristine, y
    if "linear" in heads:
        fns = anchors("linear")
        for C in (int(c) for c in args.hidden.split(",")):
            for V in vocab:
                y = torch.randint(0, V, (N,), device="cuda")
                h = (torch.randn(N, C, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_(True)
                w = (torch.randn(V, C, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_(True)
                for name, fn in fns.items():
                    run_point("linear", name, fn, (h, w, y), [h, w], [], dict(V=V, C=C))
                del h, w, y
    print(f"{len(doc['rows'])} rows in {args.out}", flush=True)


if __name__ == "__main__":
    main()
