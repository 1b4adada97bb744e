#!/usr/bin/env python3
"""Ours against an independent PyTorch trainer across a z-loss study's LRs: reads the JSONs that
tools/dev/parity_torch.py wrote, one per (LR, z-loss weight) (tools/gpu/zloss_torch_compare.sh
runs them), and writes one row per trainer and run: the final loss (mean of the last `--last`
steps), the largest mean log^2 Z and the largest logit of any step, and whether the loss left the
finite numbers. Trainers: ours; PyTorch from the same weights and batches (at the LRs where the
runner trained it: tools/gpu/zloss_torch_compare.sh's SAME_START_LRS); PyTorch from its own draw
of the weights (`initN` variants) and from weights moved by 1e-6 (`jitterN`). With --plot, the
LR-sensitivity figure (final loss against LR, both z-loss arms, both trainers) and the largest
log^2 Z against LR.

    python3 tools/dev/zloss_compare.py OUT/*.json --csv rows.csv [--plot fig.png]
"""
import argparse
import csv
import json
import math
import sys


def summary(losses, stats, last):
    finite = all(math.isfinite(x) for x in losses)
    tail = losses[-last:]
    row = {"final_loss": sum(tail) / len(tail) if finite else float("nan"), "diverged": not finite}
    if stats:
        row["max_lse_sq"] = max(s["lse_sq_mean"] for s in stats)
        row["max_logit"] = max(s["max_logit"] for s in stats)
        row["final_lse_sq"] = sum(s["lse_sq_mean"] for s in stats[-last:]) / len(stats[-last:])
    return row


def rows_of(path, last):
    d = json.load(open(path))
    if "optim" not in d:
        sys.exit(f"error: {path} has no optim/loss settings (written by an older parity_torch.py)")
    base = {"lr": d["optim"]["lr"], "z_loss_weight": d["loss"]["z_loss_weight"],
            "model": f"{d['model']['n_layer']}x{d['model']['n_embd']}", "steps": d["steps"],
            "source": path}
    out = [dict(base, trainer="ours", **summary(d["ours"], d.get("ours_stats"), last))]
    if "pytorch" in d:  # absent where the run skipped PyTorch from our weights (--no-same-start)
        out.append(dict(base, trainer="pytorch", **summary(d["pytorch"], d.get("pytorch_stats"), last)))
    for v, c in d.get("pytorch_variants", {}).items():
        out.append(dict(base, trainer=f"pytorch_{v}", **summary(c["losses"], c.get("stats"), last)))
    return out


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    groups = {}
    for r in rows:
        kind = "ours" if r["trainer"] == "ours" else "pytorch" if r["trainer"] == "pytorch" \
            else "pytorch, own init" if r["trainer"].startswith("pytorch_init") else None
        if kind:
            groups.setdefault((kind, r["z_loss_weight"]), []).append(r)
    for (kind, z), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["lr"])
        style = "-" if kind == "ours" else "--" if kind == "pytorch" else ":"
        label = f"{kind}, z-loss {z:g}"
        axes[0].plot([r["lr"] for r in rs], [r["final_loss"] for r in rs], style, marker="o",
                     label=label)
        if "max_lse_sq" in rs[0]:
            axes[1].plot([r["lr"] for r in rs], [r["max_lse_sq"] for r in rs], style, marker="o",
                         label=label)
    for ax, y in zip(axes, ["final train loss", "largest mean log^2 Z"]):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(y)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--last", type=int, default=100, help="steps in the final loss's mean")
    ap.add_argument("--csv", help="write the rows here (default: stdout)")
    ap.add_argument("--plot", help="write the LR-sensitivity figure here")
    a = ap.parse_args()
    rows, seen = [], set()
    for p in a.json:
        for r in rows_of(p, a.last):
            # ours trains the same run in a point's own-init and same-start files: one row of it
            key = (r["trainer"], r["lr"], r["z_loss_weight"], r["model"], r["steps"])
            if r["trainer"] == "ours" and key in seen:
                continue
            seen.add(key)
            rows.append(r)
    rows.sort(key=lambda r: (r["z_loss_weight"], r["lr"], r["trainer"]))
    keys = ["lr", "z_loss_weight", "model", "trainer", "steps", "final_loss", "final_lse_sq",
            "max_lse_sq", "max_logit", "diverged", "source"]
    f = open(a.csv, "w", newline="") if a.csv else sys.stdout
    w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    if a.plot:
        plot(rows, a.plot)


if __name__ == "__main__":
    main()
