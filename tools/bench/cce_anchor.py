#!/usr/bin/env python3
"""The Cut Cross-Entropy anchor: Apple's fused linear cross-entropy (the `cut-cross-entropy` wheel,
Triton kernels) timed at bench_ce's fused-head shapes, exact (filter_eps=None) and with its default
gradient filtering, against the 4-GEMM floor at the bf16 matmul rate measured in this process.
Run it in the same device call as build-gpu/bench_ce.

    python3 tools/bench/cce_anchor.py [--shapes 32768x128256,8192x50304] [--out cce.json]

The inputs are bench_ce's and ce_anchors.py's (h ~ 0.5 N(0,1), W ~ 0.02 N(0,1), C = 768, bf16, uniform
targets), plus a peaked set (W ~ 0.2 N(0,1)) where the softmax is far from uniform, as in a trained
model. CCE has no z-loss: it runs plain cross-entropy (our heads' z-loss costs one more FMA a row).
Each row also reports how far the last timed run's dh and dW are from the first exact run's
(relative Frobenius norm of the difference): for the exact mode that is its run-to-run spread (its
backward adds under locks, in arrival order), for the filtered mode what filtering changes beyond it.
"""
import argparse
import gc
import json

import torch

from torch_timing import bf16_matmul_flops, time_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="32768x128256,8192x50304", help="NxV, comma-separated (C = 768)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()

    from cut_cross_entropy import linear_cross_entropy

    tflops = bf16_matmul_flops() / 1e12
    dev = torch.cuda.get_device_name()
    print(json.dumps(dict(device=dev, bf16_tflops=round(tflops, 1),
                          cce=__import__("importlib.metadata").metadata.version("cut-cross-entropy"))), flush=True)
    rows = []
    C = 768
    for shape in args.shapes.split(","):
        N, V = (int(x) for x in shape.split("x"))
        floor4 = 4 * 2 * N * C * V / (tflops * 1e12) * 1e3
        gen = torch.Generator(device="cuda").manual_seed(0)
        y = torch.randint(0, V, (N,), device="cuda", generator=gen)
        h0 = torch.randn(N, C, device="cuda", generator=gen)
        w0 = torch.randn(V, C, device="cuda", generator=gen)
        for inputs, wscale in (("bench_ce", 0.02), ("peaked", 0.2)):
            h = (h0 * 0.5).to(torch.bfloat16).requires_grad_(True)
            w = (w0 * wscale).to(torch.bfloat16).requires_grad_(True)
            grads = {}
            for mode, eps in (("exact", None), ("filtered", "high")):
                def step():
                    h.grad = None
                    w.grad = None
                    loss = linear_cross_entropy(h, w, y, filter_eps=eps)
                    loss.backward()
                    return loss
                gc.collect()
                torch.cuda.empty_cache()
                loss = step()  # warm-up: Triton's autotuning runs here
                torch.cuda.synchronize()
                grads[mode] = (h.grad.float().clone(), w.grad.float().clone(), float(loss))
                h.grad = None
                w.grad = None
                gc.collect()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 1e9
                ms = time_ms(step, args.iters)
                r = dict(name=f"cce_{mode}", inputs=inputs, shape=f"N={N},C={C},V={V}", ms=round(ms, 3),
                         peak_extra_gb=round(peak, 3), loss=round(grads[mode][2], 5),
                         floor4_ms=round(floor4, 3), over_floor4=round(ms / floor4, 3))
                # the last timed run's gradients against the first exact run's: for the exact mode this is
                # run-to-run spread (CCE adds dh and dW under locks in whatever order the blocks arrive)
                for name, i, g in (("dh", 0, h.grad), ("dW", 1, w.grad)):
                    ex = grads["exact"][i]
                    r[f"{name}_rel_err"] = float(f"{((g.float() - ex).norm() / ex.norm()).item():.3g}")
                print(json.dumps(r), flush=True)
                rows.append(r)
            del h, w, grads
    print("\n%-14s %-9s %-26s %9s %9s %8s %8s %9s %9s" %
          ("mode", "inputs", "shape", "ms", "floor4", "x_floor", "GB", "dh_err", "dW_err"))
    for r in rows:
        print("%-14s %-9s %-26s %9.3f %9.3f %8.3f %8.3f %9s %9s" %
              (r["name"], r["inputs"], r["shape"], r["ms"], r["floor4_ms"], r["over_floor4"], r["peak_extra_gb"],
               r.get("dh_rel_err", "-"), r.get("dW_rel_err", "-")))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=dev, bf16_tflops=tflops, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
