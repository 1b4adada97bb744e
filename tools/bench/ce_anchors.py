#!/usr/bin/env python3
"""The loss-head benchmark's anchors: cross-entropy + z-loss 1e-4 in PyTorch eager, torch.compile
and Liger, on bf16 logits and from hidden states (C = 768), at bench_ce's two shapes (BT = 32768,
V = 128256 and BT = 8192, V = 50304), on one GPU. Timed with device events (triton's do_bench,
median); peak memory beyond the inputs, gradient buffers included; each against its floor (the
logits read once and the gradient written once at the copy rate measured here, or three GEMMs at
the measured bf16 matmul rate). Writes ce_anchors.json into $OUT (or /tmp) and prints a table.
tools/gpu/check.sh runs it beside bench_ce; tools/bench/cce_anchor.py adds Cut Cross-Entropy.

    OUT=DIR python3 tools/bench/ce_anchors.py
"""
import gc
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ce_sweep_anchors import Z, ce_z, linear_ce_z  # noqa: E402  (the same loss as the sweep's anchors)
from triton.testing import do_bench

dev = "cuda"
torch.manual_seed(0)
results = []

try:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    HAVE_LIGER = True
except Exception as e:  # report, keep going
    print("liger import failed:", repr(e))
    HAVE_LIGER = False


ce_z_c = torch.compile(ce_z)
lin_ce_z_c = torch.compile(linear_ce_z)


def measure(name, shape, fn, floor_ms, leaves=()):
    gc.collect(); torch.cuda.empty_cache()
    try:
        loss = fn()  # warm-up (and compile)
        torch.cuda.synchronize()
        for t in leaves:  # the gradient buffers count as extra memory
            t.grad = None
        gc.collect()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn(); torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        r = dict(name=name, shape=shape, ms=round(ms, 3), peak_extra_gb=round(peak / 1e9, 3),
                 loss=float(loss), floor_ms=round(floor_ms, 3), floor_ratio=round(ms / floor_ms, 2))
    except torch.OutOfMemoryError:
        r = dict(name=name, shape=shape, ms=None, note="OOM")
    except Exception as e:
        r = dict(name=name, shape=shape, ms=None, note=repr(e)[:200])
    print(json.dumps(r), flush=True)
    results.append(r)


# measured ceilings for floors
a = torch.empty(4 * 1024**3 // 2, dtype=torch.bfloat16, device=dev); b = torch.empty_like(a)
bw_ms = do_bench(lambda: b.copy_(a), return_mode="median")
BW = 2 * a.numel() * 2 / (bw_ms * 1e-3)  # bytes/s read+write
del a, b
m = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
mm_ms = do_bench(lambda: m @ m, return_mode="median")
FLOPS = 2 * 8192**3 / (mm_ms * 1e-3)
del m
print(json.dumps(dict(device=torch.cuda.get_device_name(), copy_TBps=round(BW / 1e12, 2), bf16_TFLOPs=round(FLOPS / 1e12, 1))), flush=True)

for (BT, D, V) in [(32768, 768, 128256), (8192, 768, 50304)]:
    shape = f"BT={BT},D={D},V={V}"
    y = torch.randint(0, V, (BT,), device=dev)
    # CE on materialized bf16 logits: floor = read logits once + write bf16 grad once
    logits = (torch.randn(BT, V, device=dev) * 2).to(torch.bfloat16)
    ce_floor = 2 * BT * V * 2 / BW * 1e3
    x = logits.clone().requires_grad_(True)

    def eager():
        x.grad = None; l = ce_z(x, y); l.backward(); return l

    def comp():
        x.grad = None; l = ce_z_c(x, y); l.backward(); return l

    measure("ce_torch_eager", shape, eager, ce_floor, [x])
    measure("ce_torch_compile", shape, comp, ce_floor, [x])
    if HAVE_LIGER:
        xl = logits.clone().requires_grad_(True)

        def lig():
            xl.grad = None
            l = LigerCrossEntropyFunction.apply(xl, y, None, -100, Z, 0.0, "mean", None, False)[0]
            l.backward(); return l
        measure("ce_liger", shape, lig, ce_floor, [xl])
        del xl
    del x, logits
    # fused linear + CE from hidden states: floor = 3 GEMMs of 2*BT*D*V at the measured matmul rate
    h = (torch.randn(BT, D, device=dev) * 0.5).to(torch.bfloat16).requires_grad_(True)
    w = (torch.randn(V, D, device=dev) * 0.02).to(torch.bfloat16).requires_grad_(True)
    lin_floor = 3 * 2 * BT * D * V / FLOPS * 1e3

    def leager():
        h.grad = None; w.grad = None; l = linear_ce_z(h, w, y); l.backward(); return l

    def lcomp():
        h.grad = None; w.grad = None; l = lin_ce_z_c(h, w, y); l.backward(); return l

    measure("linear_ce_torch_eager", shape, leager, lin_floor, [h, w])
    measure("linear_ce_torch_compile", shape, lcomp, lin_floor, [h, w])
    if HAVE_LIGER:
        def llig():
            h.grad = None; w.grad = None
            l = LigerFusedLinearCrossEntropyFunction.apply(h, w, y, None, None, -100, Z, 0.0, "mean", None, False)[0]
            l.backward(); return l
        measure("linear_ce_liger", shape, llig, lin_floor, [h, w])
    del h, w

out = os.environ.get("OUT", "/tmp")
with open(os.path.join(out, "ce_anchors.json"), "w") as f:
    json.dump(results, f, indent=1)
print("\n%-26s %-26s %9s %9s %8s %9s" % ("variant", "shape", "ms", "floor_ms", "x_floor", "peak_GB"))
for r in results:
    print("%-26s %-26s %9s %9s %8s %9s" % (r["name"], r["shape"], r.get("ms"), r.get("floor_ms"), r.get("floor_ratio"), r.get("peak_extra_gb", r.get("note"))))
