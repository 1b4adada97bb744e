"""Which rounding inside bf16 flash attention costs the gradient most, by logit scale.

Emulates in float64 the roundings a bf16 flash-attention kernel makes (P to bf16 for P V in the
forward; D = rowsum(dO O) from the bf16 output; dS to bf16 for dQ and dK; P to bf16 for dV), one at a
time and all together, on causal attention with bf16 inputs whose scores have standard deviation
`scale`, and measures each against the exact gradients: the relative error of dq, dk, dv (Frobenius
norm), and the share of query rows whose dq error exceeds half of that row's true dq.

    python3 tools/dev/attention_rounding.py [--out FILE.json]
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
}


def bf(x):
    return x.to(torch.bfloat16).to(torch.float64)


def grads(q, k, v, do, p_fwd=False, o_for_d=False, ds=False, p_bwd=False):
    scale = 1 / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, -math.inf)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    l = e.sum(-1, keepdim=True)
    p = e / l
    o = ((bf(e) if p_fwd else e) @ v) / l
    dsum = (do * (bf(o) if o_for_d else o)).sum(-1, keepdim=True)
    dS = p * (do @ v.transpose(-1, -2) - dsum)
    dS = bf(dS) if ds else dS
    dq, dk = dS @ k * scale, dS.transpose(-1, -2) @ q * scale
    dv = (bf(p) if p_bwd else p).transpose(-1, -2) @ do
    return dq, dk, dv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the table here as JSON")
    a = ap.parse_args()
    rows = []
    for score_sd in (1, 4, 16, 32, 64):
        torch.manual_seed(0)
        q, k = (bf(torch.randn(B, H, T, D, dtype=torch.float64) * math.sqrt(score_sd)) for _ in "qk")
        v, do = bf(torch.randn(B, H, T, D, dtype=torch.float64)), bf(torch.randn(B, H, T, D, dtype=torch.float64))
        exact = grads(q, k, v, do)
        row_norm = exact[0].norm(dim=-1)
        for name, kw in ROUNDINGS.items():
            got = grads(q, k, v, do, **kw)
            err = [float((g - x).norm() / x.norm()) for g, x in zip(got, exact)]
            row_err = (got[0] - exact[0]).norm(dim=-1)
            live = row_norm > 0
            share = float((row_err[live] > 0.5 * row_norm[live]).double().mean())
            rows.append({"score_sd": score_sd, "rounding": name, "dq": err[0], "dk": err[1],
                         "dv": err[2], "rows_dq_error_over_half": share})
            print(f"scores sd {score_sd:3d}  {name:28s} dq {err[0]:.2e}  dk {err[1]:.2e}  "
                  f"dv {err[2]:.2e}  rows with dq error > half of dq: {share:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"shape": {"B": B, "H": H, "T": T, "head_size": D}, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
