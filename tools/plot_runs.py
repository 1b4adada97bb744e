#!/usr/bin/env python3
"""Plots and tables from runs' metrics.jsonl.

    plot_runs.py --sweep runs/zloss-sweep --out docs/experiments/zloss     # a sweep's runs
    plot_runs.py runs/a runs/b --out figs                                   # any runs
    plot_runs.py --sweep runs/zloss-sweep --format csv                      # a table on stdout
    plot_runs.py --sweep runs/zloss-sweep --format json                     # results rows

Figures (PNG and SVG): curves.* overlays train loss, validation loss, CE, z-loss, mean lse, mean
lse^2, max logit, grad norm and LR against the step (or --x tokens), one line per run, labelled by what differs between the
runs. When the runs differ in optim.lr, lr_sensitivity.* plots the final validation CE against the
LR, one line per z-loss weight, with the LR-sensitivity of Wortsman et al. (2023): the mean over
LRs of min(loss(lr), loss at init) - best loss; a run that diverged (summary.json) counts as
its loss at init. plots.json records each figure's curves.
"""
import argparse
import csv
import json
import math
import pathlib
import sys

PANELS = [("loss", "train loss"), ("val_loss", "validation loss"), ("ce", "train CE"),
          ("z_loss", "z-loss"), ("lse_mean", "mean lse"), ("lse_sq_mean", "mean lse^2 (log^2 Z)"),
          ("max_logit", "max logit"), ("grad_norm", "grad norm"), ("lr", "learning rate")]


def flat_config(text):
    """A resolved config (config.yaml, or `train --print-config`) as {'section.key': value-string};
    nested maps give dotted keys ('kernels.attention_tuning.wgmma_fwd': 'true')."""
    flat, path = {}, []  # path: (indent, key) of the maps that enclose the current line
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        while path and path[-1][0] >= indent:
            path.pop()
        key, _, value = line.strip().partition(":")
        if not value.strip():  # a map's header: its keys follow, indented
            path.append((indent, key))
            continue
        flat[".".join([k for _, k in path] + [key])] = value.strip().strip('"')
    return flat


def read_config(run):
    return flat_config((run / "config.yaml").read_text())


def load_runs(args):
    dirs = [(pathlib.Path(d), None) for d in args.runs]
    for sweep in map(pathlib.Path, args.sweep):
        manifest = json.loads((sweep / "sweep.json").read_text())
        dirs += [(sweep / r["name"], str(sweep)) for r in manifest["runs"]]
    runs = []
    for d, sweep in dirs:
        metrics = d / "metrics.jsonl"
        if not metrics.exists():
            print(f"skipping {d}: no metrics.jsonl", file=sys.stderr)
            continue
        rows = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
        summary = d / "summary.json"
        diverged = summary.exists() and json.loads(summary.read_text()).get("diverged", False)
        runs.append({"dir": d, "sweep": sweep, "config": read_config(d), "rows": rows,
                     "diverged": diverged})
    if not runs:
        sys.exit("no runs with metrics.jsonl")
    # label each run by the config keys whose values differ between the runs
    keys = sorted({k for r in runs for k in r["config"]})
    differing = [k for k in keys if len({r["config"].get(k) for r in runs}) > 1
                 and k not in ("train.run_name", "train.out_dir", "train.resume")]
    for r in runs:
        r["label"] = ", ".join(f"{k.split('.')[-1]}={r['config'].get(k)}" for k in differing) or r["dir"].name
    return runs, differing


def assign_styles(runs, differing, cm):
    """Colour by the key with the most values, line style by the rest, so a grid stays readable."""
    main_key = max(differing, key=lambda k: len({r["config"].get(k) for r in runs}), default=None)
    colours, styles = {}, {}
    for r in runs:
        c = r["config"].get(main_key) if main_key else r["label"]
        rest = tuple(r["config"].get(k) for k in differing if k != main_key)
        r["colour"] = colours.setdefault(c, len(colours))
        r["style"] = ["-", "--", ":", "-."][styles.setdefault(rest, len(styles)) % 4]
    n_colours = len(colours)
    for r in runs:
        r["colour"] = f"C{r['colour']}" if n_colours <= 10 else cm.viridis(r["colour"] / (n_colours - 1))


def series(run, field, x="step"):
    pts = [(r[x], r[field]) for r in run["rows"] if field in r and r[field] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def final(run, field):
    xs, ys = series(run, field)
    return ys[-1] if ys else float("nan")


def last_step(run):
    xs = series(run, "loss")[0]
    return xs[-1] if xs else 0


def largest(run, field):  # of any logged step (NaN where the field was never logged)
    return max(series(run, field)[1], default=float("nan"))


def tail_mean(run, field, steps=100):
    """The mean of a logged field over the run's last `steps` steps (a smoother end-of-run figure
    than its last value)."""
    xs, ys = series(run, field)
    if not xs:
        return float("nan")
    tail = [y for x, y in zip(xs, ys) if x > xs[-1] - steps]
    return sum(tail) / len(tail)


def lr_sensitivity(runs):
    """{z weight: (LR-sensitivity, [(lr, final val CE)])} when the runs span several LRs."""
    groups = {}
    for r in runs:
        lr = float(r["config"].get("optim.lr", "nan"))
        z = r["config"].get("loss.z_loss_weight", "0")
        at_init = next((row["val_ce"] for row in r["rows"] if row.get("step") == 0 and "val_ce" in row), None)
        last = float("inf") if r["diverged"] else final(r, "val_ce")
        groups.setdefault(z, []).append((lr, last, at_init))
    out = {}
    for z, pts in groups.items():
        pts.sort()
        if len(pts) < 2:
            continue
        finite = [v for _, v, _ in pts if math.isfinite(v)]
        best = min(finite) if finite else float("nan")
        init = max((i for _, _, i in pts if i is not None), default=float("inf"))
        terms = [min(v if math.isfinite(v) else init, init) - best for _, v, _ in pts]
        out[z] = (sum(terms) / len(terms), [(lr, v) for lr, v, _ in pts])
    return out


def none_if_nan(x):  # JSON has no NaN: a missing value is null
    return None if isinstance(x, float) and math.isnan(x) else x


def slope_per_1000(xs, ys):
    """The least-squares slope of ys against xs, per 1000 steps (None with fewer than 2 points)."""
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def summary_row(run):
    """One run as a z-loss study's results row: its LR and z-loss weight, its model's shape, the
    last validation loss, the largest mean log^2 Z of any logged step and its mean over the last
    100 steps, the slope of mean log^2 Z over the run's second half (per 1000 steps: still growing
    at the end, or settled), and whether it diverged."""
    c = run["config"]
    num = lambda k: float(c[k]) if k in c else None
    steps, lse_sq = series(run, "lse_sq_mean")
    half = [(x, y) for x, y in zip(steps, lse_sq) if steps and x > steps[-1] / 2]
    return {"run": run["dir"].name, "sweep": run["sweep"], "lr": num("optim.lr"),
            "z_loss_weight": num("loss.z_loss_weight"),
            "model": f"{c.get('model.n_layer')}x{c.get('model.n_embd')}",
            "steps": last_step(run),
            "final_val_loss": none_if_nan(final(run, "val_loss")),
            "max_lse_sq": none_if_nan(largest(run, "lse_sq_mean")),
            "final_lse_sq": none_if_nan(tail_mean(run, "lse_sq_mean")),
            "lse_sq_slope_late": slope_per_1000([x for x, _ in half], [y for _, y in half]),
            "max_logit": none_if_nan(largest(run, "max_logit")),
            "diverged": run["diverged"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="run directories")
    ap.add_argument("--sweep", action="append", default=[],
                    help="a sweep's out_dir (its sweep.json lists the runs); repeatable")
    ap.add_argument("--out", help="directory for the figures")
    ap.add_argument("--format", default="png,svg",
                    help="png,svg (figures), csv (a table on stdout) or json (one summary row per "
                         "run on stdout: lr, z_loss_weight, model, final_val_loss, max_lse_sq, "
                         "diverged, ...)")
    ap.add_argument("--x", default="step", choices=["step", "tokens"], help="the curves' x axis")
    args = ap.parse_args()
    runs, differing = load_runs(args)
    sens = lr_sensitivity(runs) if "optim.lr" in differing else {}

    if args.format == "json":
        json.dump({"runs": [summary_row(r) for r in runs]}, sys.stdout, indent=1)
        print()
        return
    if args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(["run"] + differing + ["steps", "diverged", "final_loss", "final_val_loss",
                                          "final_val_ce", "min_val_ce", "final_lse_mean",
                                          "final_lse_sq_mean", "final_max_logit",
                                          "last100_lse_mean", "last100_lse_sq_mean",
                                          "max_logit_any_step"])
        for r in runs:
            val_ce = series(r, "val_ce")[1]
            w.writerow([r["dir"].name] + [r["config"].get(k) for k in differing] +
                       [last_step(r), r["diverged"],
                        final(r, "loss"), final(r, "val_loss"), final(r, "val_ce"),
                        min(val_ce) if val_ce else "", final(r, "lse_mean"),
                        final(r, "lse_sq_mean"), final(r, "max_logit"),
                        tail_mean(r, "lse_mean"), tail_mean(r, "lse_sq_mean"),
                        largest(r, "max_logit")])
        for z, (s, _) in sens.items():
            print(f"# LR sensitivity (z_loss_weight={z}): {s:.4f}")
        return

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    assign_styles(runs, differing, matplotlib.cm)

    out = pathlib.Path(args.out or ".")
    out.mkdir(parents=True, exist_ok=True)
    formats = [f for f in args.format.split(",") if f]
    manifest = {}
    fig, axes = plt.subplots(3, 3, figsize=(16, 12))
    for ax, (field, title) in zip(axes.flat, PANELS):
        n = 0
        for r in runs:
            xs, ys = series(r, field, args.x)
            if xs:
                ax.plot(xs, ys, label=r["label"], color=r["colour"], linestyle=r["style"],
                        marker="o" if field == "val_loss" else None, ms=3, lw=1)
                n += 1
        ax.set_title(title)
        ax.set_xlabel(args.x)
        if field in ("z_loss", "lse_sq_mean", "max_logit", "lr", "grad_norm") and n:
            ax.set_yscale("log")
        manifest[f"curves.{field}"] = n
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    for f in formats:
        fig.savefig(out / f"curves.{f}")
    plt.close(fig)
    if sens:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for z, (s, pts) in sorted(sens.items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"z={z}: LR sensitivity {s:.3f}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("final validation CE")
        ax.legend()
        fig.tight_layout()
        for f in formats:
            fig.savefig(out / f"lr_sensitivity.{f}")
        plt.close(fig)
        manifest["lr_sensitivity"] = len(sens)
        manifest["lr_sensitivity_values"] = {z: s for z, (s, _) in sens.items()}
    (out / "plots.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {', '.join(sorted({str(p.name) for p in out.iterdir()}))} to {out}")


if __name__ == "__main__":
    main()
