#!/usr/bin/env python3
"""The attention anchor: PyTorch's scaled_dot_product_attention backends (FlashAttention-2,
cuDNN, memory-efficient) timed alone at the trainer's shape, forward and backward apart, against the
same FLOP floor bench_attention prints (the bf16 matmul rate of an 8192^3 product measured here).
Run it in the same device call as build-gpu/bench_attention.

    python3 tools/bench/attention_anchor.py [--shape 64,1024,768,12] [--iters 20] [--out anchor.json]
    python3 tools/bench/attention_anchor.py --sustain 4000 [--backend cudnn]

--sustain N times instead N forward calls back to back, then N backward calls on one graph
(CUDA events, ms a call, Python's dispatch included: at small shapes it can be most of it): long
enough for the board to settle at the clock its power allows, as in a training step at the power
cap, where a burst of --iters calls runs at the free clock.

q, k and v are strided views of one [B, T, 3C] tensor, as in our trainer and in llm.c's
train_gpt2.py; the gradients are taken with respect to those views (no concatenation timed). The
calls are timed queued behind a spin kernel (torch_timing.time_ms), so the times are the GPU's
alone, as bench_attention's are. Timed unqueued, as before, each call's Python dispatch counted
too, and cuDNN came out behind ours where the step's profile puts its kernels ahead
(docs/results/gpt2_sizes_h200.json, the attention entries). Both are reported (*_ms and
*_ms_with_dispatch); a queued time above the unqueued one would mean the call waits on the host
inside, which queued timing cannot measure: the script then stops.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import bf16_matmul_flops, queued_ms, time_ms


def sustained_ms(q, k, v, dy, n):
    """ms a call of n forward calls back to back, then of n backward calls on one graph."""
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.autograd.grad(y, (q, k, v), dy, retain_graph=True)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    ev[0].record()
    for _ in range(n):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ev[1].record()
    for _ in range(n):
        torch.autograd.grad(y, (q, k, v), dy, retain_graph=True)
    ev[2].record()
    torch.cuda.synchronize()
    return ev[0].elapsed_time(ev[1]) / n, ev[1].elapsed_time(ev[2]) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="64,1024,768,12", help="B,T,C,NH")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out")
    ap.add_argument("--sustain", type=int, default=0, help="N calls a direction, back to back")
    ap.add_argument("--backend", choices=["flash", "cudnn", "efficient"],
                    help="this backend only (default: each)")
    a = ap.parse_args()
    B, T, C, NH = (int(x) for x in a.shape.split(","))
    hd = C // NH
    dev = torch.device("cuda")
    rate = bf16_matmul_flops(a.iters)
    pairs = B * NH * T * (T + 1) / 2
    fwd_flops = 4 * hd * pairs
    bwd_flops = 2.5 * fwd_flops
    fwd_floor, bwd_floor = fwd_flops / rate * 1e3, bwd_flops / rate * 1e3
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; bf16 matmul 8192^3 {rate / 1e12:.1f} TFLOP/s; "
          f"floors: forward {fwd_floor:.3f} ms, backward {bwd_floor:.3f} ms")

    g = torch.Generator(device=dev).manual_seed(0)
    qkv = (torch.rand(B, T, 3 * C, device=dev, generator=g) * 4 - 2).to(torch.bfloat16)
    dy = (torch.rand(B, NH, T, hd, device=dev, generator=g) * 0.02 - 0.01).to(torch.bfloat16)
    views = [t.view(B, T, NH, hd).transpose(1, 2) for t in qkv.split(C, dim=2)]
    q, k, v = (t.detach().requires_grad_() for t in views)
    rows = []
    backends = [("flash (FlashAttention-2)", SDPBackend.FLASH_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if a.backend:
        backends = [b for b in backends if b[0].startswith(a.backend)]
    if a.sustain > 0:
        for name, be in backends:
            try:
                with sdpa_kernel([be]):
                    fwd_ms, bwd_ms = sustained_ms(q, k, v, dy, a.sustain)
            except RuntimeError as e:
                print(f"{name:26s} not available: {str(e).splitlines()[0][:120]}")
                continue
            rows.append({"backend": name, "sustain": a.sustain, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms})
            print(f"{name:26s} sustained, {a.sustain} calls a direction: forward {fwd_ms:7.3f} ms"
                  f"   backward {bwd_ms:7.3f} ms")
        backends = []
    for name, be in backends:
        try:
            with sdpa_kernel([be]):
                state = {}

                def fwd():
                    state["y"] = F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def bwd():
                    torch.autograd.grad(state["y"], (q, k, v), dy)

                fwd_host = time_ms(fwd, a.iters)
                bwd_host = time_ms(bwd, a.iters, fwd)
                fwd_ms = queued_ms(fwd, a.iters, fwd_host)
                bwd_ms = queued_ms(bwd, a.iters, bwd_host, fwd)
        except RuntimeError as e:
            print(f"{name:26s} not available: {str(e).splitlines()[0][:120]}")
            continue
        if fwd_ms is None or bwd_ms is None:
            raise SystemExit(f"{name}: timed queued, a call took longer than unqueued "
                             f"({fwd_host:.3f} / {bwd_host:.3f} ms): it waits on the host")
        row = {"backend": name, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
               "fwd_ms_with_dispatch": fwd_host, "bwd_ms_with_dispatch": bwd_host,
               "fwd_x_floor": fwd_ms / fwd_floor, "bwd_x_floor": bwd_ms / bwd_floor,
               "both_x_floor": (fwd_ms + bwd_ms) / (fwd_floor + bwd_floor)}
        rows.append(row)
        print(f"{name:26s} forward {fwd_ms:7.3f} ms {row['fwd_x_floor']:5.2f}x floor   "
              f"backward {bwd_ms:7.3f} ms {row['bwd_x_floor']:5.2f}x floor   "
              f"both {row['both_x_floor']:5.2f}x   (with each call's dispatch: {fwd_host:.3f} / "
              f"{bwd_host:.3f} ms)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "matmul_TFLOPs": rate / 1e12,
                       "shape": {"B": B, "T": T, "C": C, "NH": NH},
                       "fwd_floor_ms": fwd_floor, "bwd_floor_ms": bwd_floor, "rows": rows},
                      f, indent=2)


if __name__ == "__main__":
    main()
