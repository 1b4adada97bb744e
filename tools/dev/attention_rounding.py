"""Which rounding inside bf16 flash attention costs the gradient most, by logit scale.

Emulates in float64 the roundings a bf16 flash-attention kernel makes (P to bf16 for P V in the
forward; D = rowsum(dO O) from the bf16 output; dS to bf16 for dQ and dK; P to bf16 for dV), one at a
time and all together, on causal attention with bf16 inputs whose scores have standard deviation
`scale`, and measures each against the exact gradients: the relative error of dq, dk, dv (Frobenius
norm), and the share of query rows whose dq error exceeds half of that row's true dq.

Two more rows add the kernels' fp32 softmax exponent to all of those: the scores as fp32, the
row's max kept as m = fl32(max s x sl2) (sl2 = scale log2 e), lse stored as fl32((m + log2 l) ln 2)
and read back as fl32(lse log2 e), and each probability 2^(s sl2 - m) (2^(s sl2 - L) in the
backward) either fused (one rounding of s sl2 - m, as one FMA gives) or unfused (s sl2 rounded on
its own first, as kernels/attention/tc.cuh's scaled_score does). Fused, the largest score's
probability is 2^(m's rounding error), which grows with the scores' magnitude.

    python3 tools/dev/attention_rounding.py [--scales 1,4,16,32,64] [--out FILE.json]
"""
import argparse
import json
import math

import torch

B, H, T, D = 2, 4, 512, 64
ROUNDINGS = {
    "P to bf16 in the forward": dict(p_fwd=True),
    "D from the bf16 output": dict(o_for_d=True),
    "dS to bf16": dict(ds=True),
    "P to bf16 in the backward": dict(p_bwd=True),
    "all (a bf16 flash kernel)": dict(p_fwd=True, o_for_d=True, ds=True, p_bwd=True),
    "all but D (unrounded_dsum)": dict(p_fwd=True, ds=True, p_bwd=True),
    "all, fp32 exponent fused": dict(p_fwd=True, o_for_d=True, ds=True, p_bwd=True,
                                     exponent="fused"),
    "all, fp32 exponent unfused": dict(p_fwd=True, o_for_d=True, ds=True, p_bwd=True,
                                       exponent="unfused"),
}
LOG2E, LN2 = torch.tensor(math.log2(math.e), dtype=torch.float32), torch.tensor(
    math.log(2), dtype=torch.float32)


def bf(x):
    return x.to(torch.bfloat16).to(torch.float64)


def f32(x):
    return x.to(torch.float32)


def exponent(s32, sl2, m, mask, fused):
    """fp32 exponent arguments 2^(s sl2 - m): fused, s sl2 - m rounded once (the product exact, as
    inside an FMA); unfused, s sl2 rounded to fp32 first, then the difference rounded."""
    prod = s32.double() * float(sl2) if fused else f32(s32 * sl2).double()
    return f32(prod - m.double()).double().masked_fill(~mask, -math.inf)


def grads(q, k, v, do, p_fwd=False, o_for_d=False, ds=False, p_bwd=False, exponent_mode=None):
    scale = 1 / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if exponent_mode is None:
        s = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, -math.inf)
        e = torch.exp(s - s.amax(-1, keepdim=True))
        l = e.sum(-1, keepdim=True)
        p = e / l
    else:  # the kernels' fp32 arithmetic: raw scores in fp32, log2 units, lse stored in fp32
        fused = exponent_mode == "fused"
        s32 = f32(q @ k.transpose(-1, -2)).masked_fill(~mask, -math.inf)
        sl2 = f32(torch.tensor(scale)) * LOG2E
        m = f32(s32.amax(-1, keepdim=True) * sl2)
        e = torch.exp2(exponent(s32, sl2, m, mask, fused))
        l = e.sum(-1, keepdim=True)
        lse = f32(f32(m + f32(torch.log2(l))) * LN2)
        p = torch.exp2(exponent(s32, sl2, f32(lse * LOG2E), mask, fused))  # the backward's P
    o = ((bf(e) if p_fwd else e) @ v) / l
    dsum = (do * (bf(o) if o_for_d else o)).sum(-1, keepdim=True)
    dS = p * (do @ v.transpose(-1, -2) - dsum)
    dS = bf(dS) if ds else dS
    dq, dk = dS @ k * scale, dS.transpose(-1, -2) @ q * scale
    dv = (bf(p) if p_bwd else p).transpose(-1, -2) @ do
    return dq, dk, dv, o


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="1,4,16,32,64", help="the scores' standard deviations")
    ap.add_argument("--out", help="write the table here as JSON")
    a = ap.parse_args()
    rows = []
    for score_sd in (float(x) for x in a.scales.split(",")):
        torch.manual_seed(0)
        q, k = (bf(torch.randn(B, H, T, D, dtype=torch.float64) * math.sqrt(score_sd)) for _ in "qk")
        v, do = bf(torch.randn(B, H, T, D, dtype=torch.float64)), bf(torch.randn(B, H, T, D, dtype=torch.float64))
        exact = grads(q, k, v, do)
        row_norm = exact[0].norm(dim=-1)
        for name, kw in ROUNDINGS.items():
            kw = dict(kw)
            got = grads(q, k, v, do, exponent_mode=kw.pop("exponent", None), **kw)
            err = [float((g - x).norm() / x.norm()) for g, x in zip(got, exact)]
            row_err = (got[0] - exact[0]).norm(dim=-1)
            live = row_norm > 0
            share = float((row_err[live] > 0.5 * row_norm[live]).double().mean())
            rows.append({"score_sd": score_sd, "rounding": name, "dq": err[0], "dk": err[1],
                         "dv": err[2], "out": err[3], "rows_dq_error_over_half": share})
            print(f"scores sd {score_sd:7g}  {name:28s} out {err[3]:.2e}  dq {err[0]:.2e}  "
                  f"dk {err[1]:.2e}  dv {err[2]:.2e}  rows with dq error > half of dq: {share:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"shape": {"B": B, "H": H, "T": T, "head_size": D}, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
