#!/usr/bin/env python3
"""Our attention kernels' rounding error beside PyTorch's, on the same inputs (one GPU).

For each score scale (the standard deviation of q.k / sqrt(hs) over random Gaussian q and k; large
scales give peaked rows, as attention without qk_norm reaches at high learning rates) this writes
one bf16 input (qkv and an upstream gradient), runs our variants on it (`bench_attention --io`),
then PyTorch's scaled_dot_product_attention with each backend forced, and compares every output
(out, dq, dk, dv) with one float64 reference:
  rel   relative error in the Frobenius norm, |got - ref| / |ref|
  bias  <got, ref> / <ref, ref> - 1: how much the result shrinks (< 0) or grows along the truth
  rows  for dq: the share of query rows whose error exceeds half of their true row's norm, among
        the rows whose true norm is at least a hundredth of the rows' root mean square
A kernel that trains worse than another with the same roundings should show it here, or the cause
lies outside the kernel's per-call error.

  python3 tools/dev/attention_accuracy.py --bin build-gpu [--shape 2,512,256,4]
      [--scales 1,4,16,32,64] [--out accuracy.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

# PyTorch's backends, by their SDPBackend names; fp32_math: the math backend on fp32 copies
TORCH_BACKENDS = ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "fp32_math"]
OURS = ["flash", "flash_mma", "naive"]


def make_inputs(B, T, C, NH, scale, seed):
    """qkv [B, T, 3C] and dout [B, T, C] in bf16: q and k of sd sqrt(scale), so that the scores
    q.k / sqrt(hs) have sd `scale`; v and dout standard normal."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 3 * C, generator=g, dtype=torch.float64)
    qkv[..., : 2 * C] *= scale**0.5
    dout = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    return qkv.to(torch.bfloat16), dout.to(torch.bfloat16)


def heads(x, NH):
    """[B, T, C] -> [B, NH, T, hs]"""
    B, T, C = x.shape
    return x.view(B, T, NH, C // NH).transpose(1, 2)


def sdpa_grads(qkv, dout, NH, dtype, backend):
    """out [B, T, C] and dqkv [B, T, 3C] (float64) of causal SDPA in `dtype`, or None where the
    backend refuses the inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    C = dout.shape[-1]
    x = qkv.to(dtype).detach().requires_grad_(True)
    q, k, v = (heads(t, NH) for t in x.split(C, dim=-1))
    try:
        if backend is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            with sdpa_kernel([getattr(SDPBackend, backend)]):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = y.transpose(1, 2).reshape(dout.shape)
        out.backward(dout.to(dtype))
    except RuntimeError as e:
        print(f"  {backend}: refused ({str(e).splitlines()[0][:80]})", file=sys.stderr)
        return None
    return out.detach().double(), x.grad.double()


def compare(got, ref, C, NH):
    """The measures of the module docstring, per output."""
    out_g, dqkv_g = got
    out_r, dqkv_r = ref
    parts = {"out": (out_g, out_r)}
    for i, name in enumerate(["dq", "dk", "dv"]):
        parts[name] = (dqkv_g[..., i * C : (i + 1) * C], dqkv_r[..., i * C : (i + 1) * C])
    res = {}
    for name, (g, r) in parts.items():
        err = (g - r).norm().item()
        res[name] = {
            "rel": err / r.norm().item(),
            "bias": ((g * r).sum() / (r * r).sum()).item() - 1.0,
        }
    g, r = heads(parts["dq"][0], NH), heads(parts["dq"][1], NH)
    norm = r.norm(dim=-1)
    live = norm > 0.01 * norm.pow(2).mean().sqrt()  # rows whose gradient counts at all
    bad = (g - r).norm(dim=-1)[live] > 0.5 * norm[live]
    res["dq"]["rows"] = bad.double().mean().item()
    return res


def read_bf16(path, shape):
    return torch.from_file(path, size=int(torch.tensor(shape).prod()), dtype=torch.bfloat16).view(
        shape
    )


def ours_outputs(bin_dir, work, shape_arg, qkv, dout, sets):
    """{variant: (out, dqkv)} from bench_attention --io on these inputs."""
    qkv.contiguous().view(torch.int16).numpy().tofile(os.path.join(work, "qkv.bin"))
    dout.contiguous().view(torch.int16).numpy().tofile(os.path.join(work, "dout.bin"))
    cmd = [os.path.join(bin_dir, "bench_attention"), "--io", work, "--shape", shape_arg]
    cmd += ["--variants", ",".join(OURS)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return {
        v: (
            read_bf16(os.path.join(work, f"{v}.out.bin"), dout.shape).double(),
            read_bf16(os.path.join(work, f"{v}.dqkv.bin"), qkv.shape).double(),
        )
        for v in OURS
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build-gpu", help="folder with bench_attention")
    ap.add_argument("--shape", default="2,512,256,4", help="B,T,C,NH (zloss-16m's heads)")
    ap.add_argument("--scales", default="1,4,16,32,64", help="score standard deviations")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        help="kernels.attention_tuning.key=value for ours, a second row set per --set",
    )
    ap.add_argument("--out", help="write the table here as JSON")
    a = ap.parse_args()
    B, T, C, NH = (int(x) for x in a.shape.split(","))
    dev = torch.device("cuda")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for scale in (float(s) for s in a.scales.split(",")):
            qkv, dout = make_inputs(B, T, C, NH, scale, a.seed)
            ref = sdpa_grads(qkv.to(dev), dout.to(dev), NH, torch.float64, "MATH")
            ref = tuple(t.cpu() for t in ref)
            found = {}
            for sets in [[]] + [[s] for s in a.set]:
                tag = "" if not sets else " " + sets[0].split(".")[-1]
                for v, got in ours_outputs(a.bin, work, a.shape, qkv, dout, sets).items():
                    found["ours " + v + tag] = got
            for b in TORCH_BACKENDS:
                dtype = torch.float32 if b == "fp32_math" else torch.bfloat16
                got = sdpa_grads(qkv.to(dev), dout.to(dev), NH, dtype, "MATH" if b == "fp32_math" else b)
                if got is not None:
                    found["torch " + b.lower()] = tuple(t.cpu() for t in got)
            for name, got in found.items():
                m = compare(got, ref, C, NH)
                rows.append({"scale": scale, "kernel": name, **m})
                print(
                    f"sd {scale:5g}  {name:34s}"
                    + "".join(f"  {k} {m[k]['rel']:.2e} ({m[k]['bias']:+.1e})" for k in m)
                    + f"  dq rows {m['dq']['rows']:.3f}"
                )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {
                    "shape": {"B": B, "T": T, "C": C, "NH": NH},
                    "seed": a.seed,
                    "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(),
                    "measures": "rel: |got - ref| / |ref| (Frobenius); bias: <got, ref> / <ref, ref> - 1; "
                    "dq rows: share of query rows with |dq error| > |dq| / 2; ref: float64 math SDPA",
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
