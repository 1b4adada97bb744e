#!/usr/bin/env python3
"""Wortsman et al.'s LR-sensitivity figure for several model sizes: the final validation CE
against the LR, one panel per z-loss weight, one line per model size. Each size is read from one
or more CSV tables that `tools/plot_runs.py --sweep DIR --format csv` wrote (columns optim.lr,
loss.z_loss_weight, diverged, final_val_ce), so a size's LR grid may span several sweeps.

    python3 tools/dev/lr_sensitivity_sizes.py --size "6x256=a.csv,b.csv" --size "12x768=c.csv" \
        --out fig.png [--json rows.json]

LR sensitivity (printed and in the legend): the mean over the LRs of min(loss, loss at init) minus
the best loss, where a diverged run counts as the loss at init (--init-loss, by default ln 50257,
the CE of a uniform prediction over GPT-2's vocabulary; tools/plot_runs.py takes the run's own
step-0 validation CE, a few hundredths away). The legend gives it over the LRs that every size
ran, so that sizes with longer grids compare fairly; the printout also over each size's whole
grid. Diverged runs count in the measure and are left out of the curves.
"""
import argparse
import csv
import json
import math
import sys


def read_points(paths):
    """{z weight: {lr: (final val CE, diverged)}} from plot_runs.py CSV tables."""
    out = {}
    for p in paths:
        with open(p) as f:
            for row in csv.DictReader(line for line in f if not line.startswith("#")):
                if "loss.z_loss_weight" not in row:  # plot_runs.py leaves out keys that do not vary
                    sys.exit(f"error: {p} has no loss.z_loss_weight column (its runs share one "
                             "weight); join it with a sweep that varies it")
                z = float(row["loss.z_loss_weight"] or 0)
                lr = float(row["optim.lr"])
                diverged = row["diverged"] == "True"
                out.setdefault(z, {})[lr] = (float(row["final_val_ce"]), diverged)
    return out


def sensitivity(points, at_init, lrs=None):
    losses = [at_init if d or not math.isfinite(v) else min(v, at_init)
              for lr, (v, d) in points.items() if lrs is None or lr in lrs]
    return sum(losses) / len(losses) - min(losses)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", action="append", required=True,
                    help="LABEL=a.csv[,b.csv...]: one model size and its sweeps' tables")
    ap.add_argument("--out", required=True, help="the figure (PNG or SVG by its suffix)")
    ap.add_argument("--json", help="also write the points and sensitivities here")
    ap.add_argument("--init-loss", type=float, default=math.log(50257))
    args = ap.parse_args()

    sizes = []
    for spec in args.size:
        label, _, files = spec.partition("=")
        if not files:
            ap.error(f"--size {spec!r}: expected LABEL=file.csv[,file.csv]")
        sizes.append((label, read_points(files.split(","))))
    zs = sorted({z for _, pts in sizes for z in pts})

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(zs), figsize=(6 * len(zs), 4.5), sharey=True, squeeze=False)
    record = {"init_loss": args.init_loss, "sizes": []}
    for ax, z in zip(axes[0], zs):
        common = set.intersection(*(set(pts[z]) for _, pts in sizes if z in pts))
        for i, (label, pts) in enumerate(sizes):
            if z not in pts:
                continue
            lrs = sorted(pts[z])
            s = sensitivity(pts[z], args.init_loss, common or None)
            whole = sensitivity(pts[z], args.init_loss)
            shown = [lr for lr in lrs if not pts[z][lr][1]]  # diverged runs: in the measure only
            ax.plot(shown, [pts[z][lr][0] for lr in shown], marker="o", color=f"C{i}",
                    label=f"{label}: LR sensitivity {s:.3f}")
            print(f"{label} z={z:g}: LR sensitivity {s:.4f} over the {len(common)} shared LRs, "
                  f"{whole:.4f} over its {len(lrs)}")
            record["sizes"].append({"model": label, "z_loss_weight": z, "lr_sensitivity": s,
                                    "shared_lrs": sorted(common), "lr_sensitivity_whole": whole,
                                    "points": [{"lr": lr, "final_val_ce": pts[z][lr][0],
                                                "diverged": pts[z][lr][1]} for lr in lrs]})
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_title("without z-loss" if z == 0 else f"z-loss {z:g}")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("final validation CE")
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
