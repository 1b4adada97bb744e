#!/usr/bin/env python3
"""The loss curves of a parity run (tools/dev/parity_torch.py --out X.json) in one figure: ours and
PyTorch's per-step losses (thin) and their means over the tool's windows (thick), and below them
the difference of the means; PyTorch's extra runs (--torch-variants), where there are any, as
their means and their differences from PyTorch's main run (dashed): its own spread; our extra
runs (--ours-variant) the same way (dotted).

    python3 tools/dev/plot_parity.py X.json OUT.png [--title TEXT]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json")
    p.add_argument("png")
    p.add_argument("--title", default="")
    a = p.parse_args()
    d = json.load(open(a.json))
    steps = range(1, len(d["ours"]) + 1)
    w = d["window"]
    centres = [w * i + w / 2 for i in range(len(d["means"]))]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot(steps, d["pytorch"], color="tab:orange", lw=0.5, alpha=0.5)
    top.plot(steps, d["ours"], color="tab:blue", lw=0.5, alpha=0.5)
    top.plot(centres, [m[1] for m in d["means"]], "o-", color="tab:orange", label="PyTorch")
    top.plot(centres, [m[0] for m in d["means"]], "o-", color="tab:blue", label="ours")
    top.set_ylabel("training loss")
    top.legend()
    top.set_title(a.title or f"{d['config']}, {d['precision']} on {d['device']}, {d['steps']} steps")
    bottom.axhline(0, color="gray", lw=0.5)
    for lim in (-0.01, 0.01):
        bottom.axhline(lim, color="gray", lw=0.5, ls="--")
    bottom.plot(centres, [m[0] - m[1] for m in d["means"]], "o-", color="black", label="ours")
    for (name, v), colour in zip(d.get("pytorch_variants", {}).items(), ["tab:green", "tab:red", "tab:purple"]):
        top.plot(centres, v["means"], "s--", color=colour, label=f"PyTorch {name}")
        bottom.plot(centres, [a - m[1] for a, m in zip(v["means"], d["means"])], "s--", color=colour,
                    label=f"PyTorch {name}")
    for (name, v), colour in zip(d.get("ours_variants", {}).items(), ["tab:cyan", "tab:olive", "tab:brown"]):
        top.plot(centres, v["means"], "^:", color=colour, label=f"ours, {name}")
        bottom.plot(centres, [a - m[1] for a, m in zip(v["means"], d["means"])], "^:", color=colour,
                    label=f"ours, {name}")
    if d.get("pytorch_variants") or d.get("ours_variants"):
        top.legend()
        bottom.legend(fontsize=7)
    bottom.set_ylabel(f"minus PyTorch\n({w}-step means)")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(a.png, dpi=100)


if __name__ == "__main__":
    main()
