#!/usr/bin/env python3
"""Kernel ablation: train one config once per kernel variant and tabulate speed, memory and loss.

    ablate.py -c configs/gpt2-124m.yaml --steps 50 --out runs/ablate-124m
    ablate.py -c CFG --family attention --family cross_entropy        # only these families
    ablate.py -c CFG --combo attention=naive,layernorm=separate         # listed combinations
    ablate.py -c CFG --combo attention_tuning.wgmma_fwd_pipeline=true   # a tuning key
    ablate.py -c CFG --dry-run                                          # print the runs

The reference is the config's own `kernels:` choice. By default every other registered variant of
every family (read from `train --list-kernels`) is tried one at a time, the rest left at the reference;
`--combo` lists combinations instead: of variants, of kernel tuning keys (any key of the config's
`kernels:` section, such as `attention_tuning.wgmma_dkdv_wgs=1` or `cross_entropy_tuning.groups=3`,
with or without the `kernels.` prefix, validated by `train` itself) and of
`train.recompute_gelu=true`. Each variant
trains N steps on the config's data (same seed, same batches) with build/train, then
build/bench_train times one more step op by op. The table (ablation.md, .csv, .json in --out):
tokens/s and step time (median of the steps after the first 20%), the board's power and the energy
of a step (median power of those steps, times the step time: at the GPU's power limit a variant is
faster only if it takes less energy), peak GPU memory, the final train loss and its difference
from the reference, and the per-op times. Variants exist only on the GPU:
on a CPU-only machine the tool stops after the reference run says so.
"""
import argparse
import csv
import json
import pathlib
import statistics
import shutil
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from plot_runs import flat_config  # noqa: E402  (the same flat reader of a resolved config)


def registered_variants(train_bin):
    """{family: [variants]} from `train --list-kernels` (JSON)."""
    r = subprocess.run([train_bin, "--list-kernels"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ablate: `{train_bin} --list-kernels` failed: {r.stderr.strip()}")
    fams = {k: v["variants"] for k, v in json.loads(r.stdout).items()}
    if not fams:
        sys.exit(f"ablate: `{train_bin} --list-kernels` lists no kernel family")
    return fams


def resolved_kernels(train_bin, config, sets):
    cmd = [train_bin, "-c", config, "--print-config"] + [a for s in sets for a in ("--set", s)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ablate: {' '.join(cmd)} failed:\n{out.stderr}")
    return {k.split(".", 1)[1]: v for k, v in flat_config(out.stdout).items()
            if k.startswith("kernels.")}


def parse_combo(text, families, tunables):
    """{key: value} of one --combo: a family's name (its variant checked against the registry),
    train.recompute_gelu, train.recompute_block, or a kernel tuning key (stored as
    kernels.<key>)."""
    combo = {}
    for part in filter(None, text.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            sys.exit(f"ablate: --combo '{text}': expected key=value[,key=value] (a family=variant "
                     "or a kernels tuning key=value)")
        short = key[len("kernels."):] if key.startswith("kernels.") else key
        if short in families:
            if value not in families[short]:
                sys.exit(f"ablate: --combo '{text}': {short} has no variant '{value}' (registered: "
                         f"{'|'.join(families[short])})")
            combo[short] = value
        elif key in ("train.recompute_gelu", "train.recompute_block"):
            combo[key] = value
        elif short in tunables:
            combo["kernels." + short] = value
        else:
            sys.exit(f"ablate: --combo '{text}': unknown key '{key}' (known: the families "
                     f"{', '.join(families)}; train.recompute_gelu, train.recompute_block; the "
                     "kernels tuning keys "
                     f"{', '.join(sorted(tunables))})")
    return combo


def combo_name(combo):
    return "reference" if not combo else "_".join(f"{k.split('.')[-1]}={v}" for k, v in combo.items())


def combo_sets(combo):
    return [(k if "." in k else f"kernels.{k}") + f"={v}" for k, v in combo.items()]


def summarise(run_dir, warm_fraction=0.2):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "step_ms" in r]
    if not steps:
        raise RuntimeError(f"{run_dir}: no training steps in metrics.jsonl")
    timed = steps[int(len(steps) * warm_fraction):] or steps
    ms = statistics.median(r["step_ms"] for r in timed)
    tokens_per_step = steps[-1]["tokens"] / steps[-1]["step"]
    last = steps[-1]
    val = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    powered = [r for r in timed if r.get("power_w") is not None]  # GPU steps NVML sampled
    power = statistics.median(r["power_w"] for r in powered) if powered else None
    clock = statistics.median(r["sm_clock_mhz"] for r in powered) if powered else None
    prov = json.loads((run_dir / "provenance.json").read_text())
    return {"device": prov.get("device"), "gpu": prov.get("gpu"),
            "steps": last["step"], "step_ms": ms, "tok_per_s": tokens_per_step / (ms / 1e3),
            "mfu": statistics.median(r["mfu"] for r in timed) if last.get("mfu") is not None else None,
            "power_w": power, "sm_clock_mhz": clock,
            "energy_j": power * ms / 1e3 if power is not None else None,
            "peak_mem_gb": last.get("peak_mem_gb"), "final_loss": last.get("loss"),
            "final_val_loss": val[-1] if val else None, "kernels": last.get("kernels")}


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--set", action="append", default=[], help="section.key=value for every run")
    ap.add_argument("--steps", type=int, default=50, help="training steps per variant")
    ap.add_argument("--family", action="append", default=[], help="only these families")
    ap.add_argument("--combo", action="append", default=[],
                    help="family=variant or kernels tuning key=value[,...] (repeatable)")
    ap.add_argument("--out", default="runs/ablate", help="directory for the runs and the table")
    ap.add_argument("--bin", default="build", help="directory of train and bench_train")
    ap.add_argument("--nproc", type=int, default=0,
                    help="ranks per training run (train --nproc N); the per-op timing stays on one GPU")
    ap.add_argument("--no-ops", action="store_true", help="skip the per-op timing step")
    ap.add_argument("--dry-run", action="store_true", help="print the runs and exit")
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("ablate: --steps must be at least 2")
    train_bin, bench_bin = str(pathlib.Path(args.bin) / "train"), str(pathlib.Path(args.bin) / "bench_train")
    for b in (train_bin, bench_bin):
        if not pathlib.Path(b).is_file():
            sys.exit(f"ablate: {b} not found; build first (bash tools/build.sh) or pass --bin DIR")
    families = registered_variants(train_bin)
    for f in args.family:
        if f not in families:
            sys.exit(f"ablate: unknown family '{f}' (known: {', '.join(families)})")
    reference = resolved_kernels(train_bin, args.config, args.set)
    combos = [{}]
    if args.combo:
        tunables = {k for k in reference if k not in families}
        combos += [parse_combo(c, families, tunables) for c in args.combo]
        for c in combos[1:]:  # train's own validation of the values (ranges, choices, variants)
            resolved_kernels(train_bin, args.config, args.set + combo_sets(c))
    else:
        for fam in args.family or families:
            combos += [{fam: v} for v in families[fam] if v != reference.get(fam)]
    out = pathlib.Path(args.out)
    # an ablation keeps its numbers, not its weights
    common = args.set + [f"train.max_steps={args.steps}", "train.eval_every=0",
                         "train.checkpoint_every=0", "train.checkpoint_at_end=false",
                         "train.log_every=10"]
    plan = []
    for c in combos:
        name = combo_name(c)
        sets = common + combo_sets(c) + [f"train.out_dir={out}", f"train.run_name={name}"]
        train_cmd = [train_bin, "-c", args.config] + [a for s in sets for a in ("--set", s)]
        if args.nproc > 0:
            train_cmd += ["--nproc", str(args.nproc)]
        bench_cmd = [bench_bin, "-c", args.config, "--steps", "3", "--from", "1", "--ops",
                     "--out", str(out / name / "bench_ops.json")] + \
                    [a for s in args.set + combo_sets(c) for a in ("--set", s)]
        plan.append((name, c, train_cmd, bench_cmd))
    ref_variants = {k: v for k, v in reference.items() if k in families}
    print(f"reference kernels: {ref_variants}; {len(plan)} runs of {args.steps} steps into {out}")
    for i, (name, c, tc, bc) in enumerate(plan):
        print(f"[{i + 1}/{len(plan)}] {name}: {' '.join(tc)}")
        if not args.no_ops:
            print(f"    ops: {' '.join(bc)}")
    if args.dry_run:
        return
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, (name, c, tc, bc) in enumerate(plan):
        print(f"[{i + 1}/{len(plan)}] {name}: training {args.steps} steps", flush=True)
        if (out / name).exists():  # this tool's own run of an earlier ablation: replaced
            print(f"    replacing {out / name}")
            shutil.rmtree(out / name)
        log = out / f"{name}.log"
        with open(log, "w") as f:
            rc = subprocess.run(tc, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            print(f"  failed (exit {rc}); see {log}")
            results.append({"name": name, "combo": c, "failed": rc})
            continue
        r = summarise(out / name)
        if r["device"] != "cuda":
            sys.exit(f"ablate: the run trained on '{r['device']}': kernel variants exist only on "
                     "the GPU (no CUDA device here), so there is nothing to compare")
        r.update({"name": name, "combo": c})
        if not args.no_ops:
            with open(out / f"{name}.ops.log", "w") as f:
                if subprocess.run(bc, stdout=f, stderr=subprocess.STDOUT).returncode == 0:
                    r["ops"] = json.loads((out / name / "bench_ops.json").read_text())["ops"]
        results.append(r)
        print(f"  {r['step_ms']:.2f} ms/step, {r['tok_per_s']:.0f} tok/s, peak "
              f"{fmt(r['peak_mem_gb'], '.2f')} GB, final loss {r['final_loss']:.4f}", flush=True)
    ref = next((r for r in results if r["name"] == "reference" and "failed" not in r), None)
    for r in results:
        if ref and "failed" not in r:
            r["loss_diff"] = r["final_loss"] - ref["final_loss"]
            r["speedup"] = ref["step_ms"] / r["step_ms"]
    write_tables(out, results, args)


def write_tables(out, results, args):
    ok = [r for r in results if "failed" not in r]
    op_names = []
    for r in ok:
        for o in r.get("ops", []):
            if o["op"] not in op_names:
                op_names.append(o["op"])
    head = ["variant", "tok/s", "step ms", "vs reference", "board W", "J/step", "peak GB",
            "final loss", "loss - ref"]
    lines = [f"Kernel ablation of `{args.config}` ({args.steps} steps each; "
             f"set: {' '.join(args.set) or 'none'}; GPU: {ok[0]['gpu'] if ok else '?'})", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['name']} | failed (exit {r['failed']}) |" + " |" * (len(head) - 2))
            continue
        lines.append(f"| {r['name']} | {r['tok_per_s']:.0f} | {r['step_ms']:.2f} | "
                     f"{fmt(r.get('speedup'), '.3f')}x | {fmt(r.get('power_w'), '.0f')} | "
                     f"{fmt(r.get('energy_j'), '.1f')} | {fmt(r['peak_mem_gb'], '.2f')} | "
                     f"{r['final_loss']:.4f} | {fmt(r.get('loss_diff'), '+.4f')} |")
    if op_names:
        lines += ["", "Per-op GPU time in one step (ms, bench_train --ops):", "",
                  "| op | " + " | ".join(r["name"] for r in ok) + " |", "|" + " --- |" * (len(ok) + 1)]
        for op in op_names:
            cells = []
            for r in ok:
                v = next((o["ms"] for o in r.get("ops", []) if o["op"] == op), None)
                cells.append(fmt(v, ".2f"))
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    (out / "ablation.md").write_text("\n".join(lines) + "\n")
    (out / "ablation.json").write_text(json.dumps(results, indent=1) + "\n")
    with open(out / "ablation.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "tok_per_s", "step_ms", "speedup", "power_w", "sm_clock_mhz",
                    "energy_j", "peak_mem_gb", "final_loss", "loss_diff"] + op_names)
        for r in ok:
            ops = {o["op"]: o["ms"] for o in r.get("ops", [])}
            w.writerow([r["name"], r["tok_per_s"], r["step_ms"], r.get("speedup"), r.get("power_w"),
                        r.get("sm_clock_mhz"), r.get("energy_j"), r["peak_mem_gb"],
                        r["final_loss"], r.get("loss_diff")] + [ops.get(o) for o in op_names])
    print("\n".join(lines))
    print(f"wrote {out / 'ablation.md'}, ablation.csv, ablation.json")


if __name__ == "__main__":
    main()
