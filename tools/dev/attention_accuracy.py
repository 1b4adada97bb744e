#!/usr/bin/env python3
"""Our attention kernels' rounding error beside PyTorch's, on the same inputs.

Each case is one bf16 input of causal attention (qkv and an upstream gradient). Our variants run on
it through `bench_attention --io`, then PyTorch's scaled_dot_product_attention with each backend
forced, and every output (out, dq, dk, dv) is compared with one float64 reference:
  rel   relative error in the Frobenius norm, |got - ref| / |ref|
  bias  <got, ref> / <ref, ref> - 1: how much the result shrinks (< 0) or grows along the truth
  rows  for dq: the share of query rows whose error exceeds half of their true row's norm, among
        all rows with a nonzero true dq (rows_all, the measure of attention_rounding.py) and among
        those whose true norm is at least a hundredth of the rows' root mean square (rows_live:
        with peaked rows most swamped rows carry almost no gradient, and this leaves them out)
The cases are either random (--scales: q and k Gaussian so that the scores q.k / sqrt(hs) have
that standard deviation; large ones give peaked rows, as attention without qk_norm reaches at high
learning rates) or real (--weights and --inputs: every layer's attention inputs and upstream
gradient in one bf16 training step from a trained model's weights, as PyTorch's autocast computes
them). Each case also reports its scores' spread and how peaked its rows are (the mean over rows
of the largest probability). A kernel that trains worse than another with the same roundings
shows it here, or the cause lies outside the kernel's per-call error.

  python3 tools/dev/attention_accuracy.py --bin build-gpu [--shape 2,512,256,4]
      [--scales 1,4,16,32,64] [--set kernels.attention_tuning.K=V] [--out accuracy.json]
  python3 tools/dev/attention_accuracy.py --bin build-gpu --inputs WORK/inputs
      --weights WORK/ours/ckpt_2000.bin [--step 0] [--rows 2] [--out real.json]
WORK is a tools/dev/parity_torch.py work folder: its inputs/ (parity_inputs: the run and its
batches), ours' checkpoints, and with --save-final PyTorch's final weights (final_pytorch_*.f32).
--torch-only leaves ours out (a machine without our CUDA build; on the CPU only PyTorch's math
backend runs).
"""
import argparse
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_torch  # noqa: E402  (the PyTorch GPT over our weight arena)

# PyTorch's backends, by their SDPBackend names; fp32_math: the math backend on fp32 copies
TORCH_BACKENDS = ["FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "fp32_math"]
OURS = ["flash", "flash_mma", "naive"]  # the two hybrids' outputs are one of these


def random_case(B, T, C, scale, seed):
    """qkv [B, T, 3C] and dout [B, T, C] in bf16: q and k of sd sqrt(scale), so that the scores
    q.k / sqrt(hs) have sd `scale`; v and dout standard normal."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 3 * C, generator=g, dtype=torch.float64)
    qkv[..., : 2 * C] *= scale**0.5
    dout = torch.randn(B, T, C, generator=g, dtype=torch.float64)
    return qkv.to(torch.bfloat16), dout.to(torch.bfloat16)


def load_weights(path, run):
    """Our weight arena (float32, the parameter table's layout) from a checkpoint of `train`
    (train/checkpoint.h: magic, version, header, then the params) or a raw .f32 arena."""
    n = run["num_parameters"]
    with open(path, "rb") as f:
        head = f.read(8)
        if head == b"ZGPTCKPT":
            _version, _zero, header_len = struct.unpack("<IIQ", f.read(16))
            f.seek(header_len, 1)
            arena = np.frombuffer(f.read(4 * n), dtype=np.float32)
        else:
            f.seek(0)
            arena = np.fromfile(f, dtype=np.float32)
    if arena.size != n:
        sys.exit(f"error: {path} holds {arena.size} weights; the run's table has {n}")
    return arena.copy()


def real_cases(a, device):
    """[(label, qkv, dout, NH)]: each layer's attention inputs and upstream gradient in one bf16
    autocast step of the PyTorch GPT on --weights, over the first --rows sequences of --step's
    first micro-batch."""
    inputs = pathlib.Path(a.inputs)
    run = json.loads((inputs / "run.json").read_text())
    tr, m = run["train"], run["model"]
    batches = np.fromfile(inputs / "batches.i32", dtype=np.int32).reshape(
        -1, tr["grad_accum"], 2, tr["batch_size"], tr["seq_len"])
    if not 0 <= a.step < batches.shape[0]:
        sys.exit(f"error: --step {a.step}: {inputs} holds batches for {batches.shape[0]} steps")
    if (m["n_kv_head"] or m["n_head"]) != m["n_head"]:
        sys.exit("error: grouped-query attention is not supported here")
    model = parity_torch.TorchGPT(run, load_weights(a.weights, run), device)
    model.capture = []
    micro = batches[a.step, 0, :, : a.rows]
    x = torch.from_numpy(micro[0].astype(np.int64)).to(device)
    y = torch.from_numpy(micro[1].astype(np.int64)).to(device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        logits = model.forward(x)
    stats = {"lse": 0, "lse_sq": 0,
             "max_logit": torch.tensor(-float("inf"), dtype=torch.float64, device=device)}
    parity_torch.loss_sum(logits, y, run["loss"], stats).backward()
    cases = []
    for l, rec in enumerate(model.capture):
        B, H, T, hs = rec["q"].shape
        flat = [t.transpose(1, 2).reshape(B, T, H * hs) for t in (rec["q"], rec["k"], rec["v"])]
        dout = rec["dy"].transpose(1, 2).reshape(B, T, H * hs)
        cases.append((f"layer {l}", torch.cat(flat, dim=-1).cpu().to(torch.bfloat16),
                      dout.cpu().to(torch.bfloat16), H))
    return cases


def heads(x, NH):
    """[B, T, C] -> [B, NH, T, hs]"""
    B, T, C = x.shape
    return x.view(B, T, NH, C // NH).transpose(1, 2)


def score_stats(qkv, NH):
    """The case's scores' standard deviation (causal entries) and mean largest probability a row."""
    C = qkv.shape[-1] // 3
    q, k = (heads(t.double(), NH) for t in qkv.split(C, dim=-1)[:2])
    s = q @ k.transpose(-1, -2) / (C // NH) ** 0.5
    T = s.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=s.device).tril()
    p = s.masked_fill(~causal, -float("inf")).softmax(dim=-1)
    return s[..., causal].std().item(), p.max(dim=-1).values.mean().item()


def sdpa_grads(qkv, dout, NH, dtype, backend):
    """out [B, T, C] and dqkv [B, T, 3C] (float64) of causal SDPA in `dtype`, or None where the
    backend refuses the inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    C = dout.shape[-1]
    x = qkv.to(dtype).detach().requires_grad_(True)
    q, k, v = (heads(t, NH) for t in x.split(C, dim=-1))
    try:
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
        res[name] = {
            "rel": (g - r).norm().item() / r.norm().item(),
            "bias": ((g * r).sum() / (r * r).sum()).item() - 1.0,
        }
    g, r = heads(parts["dq"][0], NH), heads(parts["dq"][1], NH)
    norm, err = r.norm(dim=-1), (g - r).norm(dim=-1)
    for key, rows in (("rows_all", norm > 0), ("rows_live", norm > 0.01 * norm.pow(2).mean().sqrt())):
        res["dq"][key] = (err[rows] > 0.5 * norm[rows]).double().mean().item() if rows.any() else None
    return res


def read_bf16(path, shape):
    count = int(np.prod(shape))
    return torch.from_file(path, size=count, dtype=torch.bfloat16).view(shape)


def ours_outputs(bin_dir, work, qkv, dout, NH, sets):
    """{variant: (out, dqkv)} from bench_attention --io on these inputs."""
    qkv.contiguous().view(torch.int16).numpy().tofile(os.path.join(work, "qkv.bin"))
    dout.contiguous().view(torch.int16).numpy().tofile(os.path.join(work, "dout.bin"))
    B, T, C = dout.shape
    for v in OURS:  # a variant that fails must not leave the last case's files to be read
        for part in ("out", "dqkv"):
            pathlib.Path(work, f"{v}.{part}.bin").unlink(missing_ok=True)
    cmd = [os.path.join(bin_dir, "bench_attention"), "--io", work, "--shape", f"{B},{T},{C},{NH}"]
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
    ap.add_argument("--shape", default="2,512,256,4", help="random cases: B,T,C,NH")
    ap.add_argument("--scales", default="1,4,16,32,64", help="random cases: score deviations")
    ap.add_argument("--seed", type=int, default=1, help="random cases: the generator's seed")
    ap.add_argument("--inputs", help="real cases: a parity_inputs folder (run.json, batches.i32)")
    ap.add_argument("--weights", help="real cases: a checkpoint of train, or a .f32 weight arena")
    ap.add_argument("--step", type=int, default=0, help="real cases: the step whose batch runs")
    ap.add_argument("--rows", type=int, default=2, help="real cases: sequences of the batch")
    ap.add_argument("--set", action="append", default=[],
                    help="kernels.attention_tuning.key=value for ours, a second row set per --set")
    ap.add_argument("--torch-only", action="store_true", help="leave ours out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the table here as JSON")
    a = ap.parse_args()
    if bool(a.inputs) != bool(a.weights):
        ap.error("real cases need both --inputs and --weights")
    if a.device == "cpu" and not a.torch_only:
        ap.error("ours needs a GPU: give --torch-only on the CPU")
    dev = torch.device(a.device)
    if a.inputs:
        cases = real_cases(a, a.device)
    else:
        B, T, C, NH = (int(x) for x in a.shape.split(","))
        cases = [(f"sd {float(s):g}", *random_case(B, T, C, float(s), a.seed), NH)
                 for s in a.scales.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for label, qkv, dout, NH in cases:
            C = dout.shape[-1]
            sd, peak = score_stats(qkv.to(dev), NH)
            print(f"{label}: scores' sd {sd:.2f}, mean largest probability {peak:.3f}")
            ref = tuple(t.cpu() for t in sdpa_grads(qkv.to(dev), dout.to(dev), NH, torch.float64, "MATH"))
            found = {}
            if not a.torch_only:
                for sets in [[]] + [[s] for s in a.set]:
                    tag = "" if not sets else " " + sets[0].split(".")[-1]
                    for v, got in ours_outputs(a.bin, work, qkv, dout, NH, sets).items():
                        found["ours " + v + tag] = got
            for b in TORCH_BACKENDS:
                fp32 = b == "fp32_math"
                got = sdpa_grads(qkv.to(dev), dout.to(dev), NH,
                                 torch.float32 if fp32 else torch.bfloat16, "MATH" if fp32 else b)
                if got is not None:
                    found["torch " + b.lower()] = tuple(t.cpu() for t in got)
            for name, got in found.items():
                m = compare(got, ref, C, NH)
                rows.append({"case": label, "score_sd": sd, "mean_top_probability": peak,
                             "kernel": name, **m})
                shares = "/".join("-" if m["dq"][k] is None else f"{m['dq'][k]:.3f}"
                                  for k in ("rows_all", "rows_live"))
                print(f"  {name:34s}" + "".join(f"  {k} {m[k]['rel']:.2e} ({m[k]['bias']:+.1e})" for k in m)
                      + f"  dq rows (all/live) {shares}")
    if a.out:
        source = ({"inputs": a.inputs, "weights": a.weights, "step": a.step, "rows": a.rows}
                  if a.inputs else {"shape": a.shape, "seed": a.seed, "scales": a.scales})
        source["ours_sets"] = [] if a.torch_only else [""] + a.set
        with open(a.out, "w") as f:
            json.dump({"cases": source, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                       "measures": "rel: |got - ref| / |ref| (Frobenius); bias: <got, ref> / <ref, ref> - 1; "
                       "dq rows_all: share of query rows with a nonzero true dq whose |dq error| > |dq| / 2; "
                       "rows_live: the same among rows with |dq| >= 0.01 x the rows' RMS; "
                       "ref: float64 math SDPA",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
