#!/usr/bin/env python3
"""Ours against PyTorch beyond chaos: pools the JSONs tools/dev/parity_torch.py wrote for one run
(same config, same weights and batches; several files when the runs were spread over processes or
GPUs) into two samples, and says per window whether the trainers differ by more than their runs
differ among themselves.

- ours: the plain run and each `--ours-variant` that only moves the start (`model.init_jitter`);
- PyTorch: each file's run from our weights (its kernels are not deterministic, so each is a
  sample) and each `jitterN` variant. A kernel variant's runs from moved starts (`fp32_attention+jitterN`)
  pool with its run from our weights.
Identical loss curves count once. With one run of ours, its spread is taken to be PyTorch's.
Other variants (ours with other settings, PyTorch's kernel
variants such as bf16_storage) are listed beside, by name (ours' by their settings, all
starts of one setting together). Per window: each sample's mean and
standard deviation, the difference of the means, that difference in standard errors and its
two-sided p (Welch's t, with Welch's degrees of freedom; the windows share their runs, so they are
not independent tests);
and each run's final loss (mean of the last window). Where the files carry the runs' log Z
statistics (parity_torch writes them), each run's final log^2 Z too (the mean of lse^2 over the
last window) and the same test on it.

With --pair A B the table tests sample A against sample B instead, by the names the final losses
are printed under (such as "ours train.fp32_residual=true" against "pytorch", or "ours" against
"pytorch bf16_storage"): whether a setting moves one trainer onto the other. The windows' ours_*
and pytorch_* fields are then A's and B's.

    python3 tools/dev/spread_compare.py RUN_a.json RUN_b.json ... [--window 100] [--out spread.json]
        [--pair A B]
"""
import argparse
import json
import math
import sys


def window_means(losses, w):
    return [sum(losses[i:i + w]) / w for i in range(0, len(losses) - w + 1, w)]


def two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom: 1 - the density's integral over
    [-|t|, |t|], by Simpson's rule (the density is smooth there; 2000 panels give 1e-9)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    f = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)
    n, a = 2000, abs(t)
    h = a / n
    s = f(0) + f(a) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return max(0.0, 1 - 2 * s * h / 3)


def welch(a, b):
    """Means, standard deviations, the difference of two samples in standard errors, Welch's
    degrees of freedom and the two-sided p. One run of ours is taken to spread as PyTorch's runs
    do (the error of a new draw from PyTorch's sample)."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) if len(a) > 1 else vb
    ea, eb = va / len(a), vb / len(b)
    se = math.sqrt(ea + eb)
    out = {"ours_mean": ma, "ours_sd": math.sqrt(va), "ours_runs": len(a), "pytorch_mean": mb,
           "pytorch_sd": math.sqrt(vb), "pytorch_runs": len(b), "difference": ma - mb,
           "standard_errors": None, "dof": None, "p": None}
    if se > 0:  # no spread on either side: a difference cannot be weighed (None), not called zero
        t = (ma - mb) / se
        if len(a) > 1:
            dof = (ea + eb) ** 2 / (ea ** 2 / (len(a) - 1) + eb ** 2 / (len(b) - 1))
        else:  # one new draw against PyTorch's sample: its variance is all the estimate has
            dof = len(b) - 1
        out.update(standard_errors=t, dof=dof, p=two_sided_p(t, dof))
    elif ma == mb:
        out.update(standard_errors=0.0, p=1.0)
    return out


JITTER_KEYS = ("model.init_jitter", "model.init_jitter_seed")


def settings_of(variant):
    """An --ours-variant's settings other than the start's jitter ("" where it only moves the start)."""
    return ",".join(kv for kv in variant.split(",") if kv and kv.split("=")[0] not in JITTER_KEYS)


def pool(files):
    """The runs by sample name ("ours", "pytorch", then the others' names), each a list of loss
    curves; the settings; and each sample's runs' log Z statistics by the same names, in the order
    of its curves (None for a run written without them)."""
    samples, stats = {"ours": [], "pytorch": []}, {}

    def add(name, losses, run_stats):
        sample = samples.setdefault(name, [])
        if losses not in sample:
            sample.append(losses)
            stats.setdefault(name, []).append(run_stats)

    settings = None
    for path in files:
        d = json.load(open(path))
        if "pytorch" not in d and not d.get("ours_only"):
            sys.exit(f"error: {path} has no PyTorch run from our weights (written with --no-same-start)")
        key = (d["config"], sorted(o for o in d["overrides"]), d["steps"])
        if settings is None:
            settings = key
        elif key != settings:
            sys.exit(f"error: {path} is another run ({key}) than the first file's ({settings})")
        add("ours", d["ours"], d.get("ours_stats"))
        if "pytorch" in d:  # a job of ours alone (parity_torch.py --ours-only) has none
            add("pytorch", d["pytorch"], d.get("pytorch_stats"))
        for v, c in d.get("ours_variants", {}).items():
            losses, st = (c["losses"], c.get("stats")) if isinstance(c, dict) else (c, None)
            # the same settings from other starts pool into one sample
            add(f"ours {settings_of(v)}" if settings_of(v) else "ours", losses, st)
        for v, c in d.get("pytorch_variants", {}).items():
            kernels = v.split("+")[0]  # "fp32_attention+jitter2": fp32_attention from a moved start
            add("pytorch" if v.startswith("jitter") else f"pytorch {kernels}", c["losses"], c.get("stats"))
    return samples, settings, stats


def final_stat(stats, key, w, digits):
    """Each sample's runs' means of statistic `key` over the last w steps, sorted and rounded, for
    the samples whose runs all carry it."""
    return {n: sorted(round(sum(x[key] for x in st[-w:]) / w, digits) for st in sts)
            for n, sts in stats.items() if all(st and len(st) >= w and key in st[-1] for st in sts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--window", type=int, default=100, help="steps per window")
    ap.add_argument("--out", help="write the windows and the runs' final losses here as JSON")
    ap.add_argument("--pair", nargs=2, metavar=("A", "B"), default=["ours", "pytorch"],
                    help="the two samples to test, by name (default: ours pytorch)")
    a = ap.parse_args()
    samples, (config, overrides, steps), stats = pool(a.json)
    for name in a.pair:
        if name not in samples:
            sys.exit(f"error: no sample named {name!r} (there are: {', '.join(map(repr, samples))})")
    first, second = a.pair
    # the table's two sides; the remaining samples are listed beside
    ours, theirs = samples[first], samples[second]
    other = {n: cs for n, cs in samples.items() if n not in a.pair}
    if len(theirs) < 2:
        sys.exit(f"error: {len(theirs)} run of {second}: its spread needs two at least (--torch-variants jitter)")
    w = min(a.window, steps)
    o = [window_means(c, w) for c in ours]
    t = [window_means(c, w) for c in theirs]
    others = {name: [window_means(c, w) for c in cs] for name, cs in other.items()}
    windows = []
    print(f"{config} {' '.join(overrides)}, {steps} steps: {len(ours)} runs of {first}, {len(theirs)} of {second}")
    print(f"{'steps':>11} {first[:16]:>16} {second[:16]:>16} {'difference':>11} {'SE':>6} {'dof':>5} {'p':>6}")
    for i in range(len(o[0])):
        r = dict(first_step=i * w + 1, last_step=(i + 1) * w, **welch([x[i] for x in o], [x[i] for x in t]))
        if len(o) == 1:
            r["ours_sd"] = None  # one run: no spread of its own measured
        r["others"] = {name: [x[i] for x in ws] for name, ws in others.items()}
        windows.append(r)
        sd = f"±{r['ours_sd']:.4f}" if r["ours_sd"] is not None else " " * 7
        print(f"{r['first_step']:5d}-{r['last_step']:<5d} {r['ours_mean']:9.4f}{sd} "
              f"{r['pytorch_mean']:9.4f}±{r['pytorch_sd']:.4f} {r['difference']:+11.4f} "
              + (f"{r['standard_errors']:+6.1f} {r['dof']:5.1f} {r['p']:6.3f}" if r["dof"] else "     -     -      -"))
    final = lambda cs: sorted(round(sum(c[-w:]) / w, 4) for c in cs)
    finals = {n: final(cs) for n, cs in samples.items()}
    for name, f in finals.items():
        print(f"final loss (last {w} steps), {name}: {', '.join(f'{x:.4f}' for x in f)}")
    # log^2 Z at the end, for each sample whose runs all carry their statistics
    final_log2z = final_stat(stats, "lse_sq_mean", w, 2)
    for name, f in final_log2z.items():
        print(f"final log^2 Z (last {w} steps), {name}: {', '.join(f'{x:.1f}' for x in f)}")
    log2z_test = None
    if first in final_log2z and second in final_log2z:
        log2z_test = welch(final_log2z[first], final_log2z[second])
        if log2z_test["dof"]:
            print(f"final log^2 Z, {first} - {second}: {log2z_test['difference']:+.1f} "
                  f"({log2z_test['standard_errors']:+.1f} standard errors, p {log2z_test['p']:.3f})")
    # the gradient norm before clipping over the last window (files from parity_torch.py that
    # record it): how hard each sample's clipping bites at the end
    final_norm = final_stat(stats, "grad_norm", w, 4)
    for name, f in final_norm.items():
        print(f"final gradient norm (last {w} steps), {name}: {', '.join(f'{x:.3f}' for x in f)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": config, "overrides": overrides, "steps": steps, "window": w,
                       "sources": a.json, "pair": a.pair, "windows": windows, "final_losses": finals,
                       "final_log2z": final_log2z, "final_log2z_test": log2z_test,
                       "final_grad_norm": final_norm}, f, indent=1)


if __name__ == "__main__":
    main()
