#!/usr/bin/env python3
"""Turns a finished run directory into a results record for docs/results/.

    tools/record_run.py RUN_DIR OUT.json --command "the command that made the run"

The record holds the summary, the validation curve, the resolved config and the provenance
(commit, host, CPU, device), so every number in the docs points at the run that produced it.
"""
import argparse
import datetime
import json
import pathlib


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=pathlib.Path)
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--command", required=True, help="the command line that produced the run")
    ap.add_argument("--wall-seconds", type=float, help="wall time of the whole command, if measured")
    args = ap.parse_args()
    metrics = [json.loads(l) for l in (args.run_dir / "metrics.jsonl").read_text().splitlines() if l]
    record = {
        "date": datetime.date.today().isoformat(),
        "command": args.command,
        "provenance": json.loads((args.run_dir / "provenance.json").read_text()),
        "summary": json.loads((args.run_dir / "summary.json").read_text()),
        "config_yaml": (args.run_dir / "config.yaml").read_text(),
        "val_curve": [
            {"step": m["step"], "val_loss": m["val_loss"], "val_ce": m.get("val_ce")}
            for m in metrics if "val_loss" in m
        ],
        "train_tok_per_s_median": sorted(m["tok_per_s"] for m in metrics if "tok_per_s" in m)[
            len([m for m in metrics if "tok_per_s" in m]) // 2],
    }
    if args.wall_seconds is not None:
        record["wall_seconds"] = args.wall_seconds
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
