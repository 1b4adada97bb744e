#!/usr/bin/env python3
"""When the vocabulary split pays, as Markdown: docs/parallel.md's tables, made from the results
files (the memory count of every model x vocabulary x micro-batch x head x group size, and the
measured steps of the split against data parallel).

  python3 tools/bench/vocab_split_table.py [--memory vocab_split_memory_h200.json]
                                           [--speed vocab_split_h200x2.json] [--check FILE]

--check FILE (ctest docs_split_tables, with docs/parallel.md) exits 1 unless FILE holds both
tables as printed, so the docs' copy follows the results files.
"""
import argparse
import json
import os
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "results")


# vocab_split_bench --tokens: GPT-2's (below 50257) or uniform below the model's vocabulary
TOKENS = {"gpt2": "GPT-2's", "vocab": "all of V"}


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def memory_table(rows):
    """GB a split rank saves against data parallel, per model, V and micro-batch: the default head
    (`fast`) over 2 and 8 GPUs, and `fused_linear` (no logits to save) over 2 and 8."""
    key = {(r["config"], r["vocab"], r["batch"], r["head"], r["gpus"]): r for r in rows}
    models = sorted({(r["n_embd"], r["config"]) for r in rows})
    batches = sorted({r["batch"] for r in rows})
    out = ["| model (C) | V | head state | " + " | ".join(f"B={b}" for b in batches) + " |",
           "| --- | --- | --- |" + " --- |" * len(batches)]
    for c, cfg in models:
        name = os.path.basename(cfg).replace(".yaml", "")
        for v in sorted({r["vocab"] for r in rows}):
            cells = []
            for b in batches:
                f2, f8 = key[(cfg, v, b, "fast", 2)], key[(cfg, v, b, "fast", 8)]
                l2, l8 = key[(cfg, v, b, "fused_linear", 2)], key[(cfg, v, b, "fused_linear", 8)]
                cells.append(f"{f2['saved_gb']:.1f} / {f8['saved_gb']:.1f} ({l2['saved_gb']:+.1f} / "
                             f"{l8['saved_gb']:+.1f})")
            out.append(f"| {name} ({c}) | {v} | {f2['head_state_gb']:.2f} GB | " + " | ".join(cells) + " |")
    return "\n".join(out)


def speed_table(doc):
    rows = {(r["model"], r["vocab"], r.get("tokens", "gpt2"), r["mode"]): r for r in doc["rows"]}
    out = ["| model, B | V | tokens | ZeRO-1 | data parallel tok/s | split tok/s | "
           "split step / DP's | DP GB | split GB | commit |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = {"124m": 0, "1558m": 1}
    for (model, v, tokens, mode), dp in sorted(rows.items(),
                                               key=lambda kv: (order.get(kv[0][0], 9), kv[0][1:])):
        if not mode.startswith("dp"):
            continue
        z = mode.endswith("zero1")
        vp = rows.get((model, v, tokens, "vp+zero1" if z else "vp"))
        b = {"124m": 64, "1558m": 16}.get(model, "?")
        head = f"| {model}, {b} | {v} | {TOKENS.get(tokens, tokens)} | {'on' if z else 'off'} |"
        if vp is None:
            out.append(f"{head} {dp['tok_per_s']:,.0f} | not measured | | {dp['peak_mem_gb']:.2f} "
                       f"| | {dp.get('commit', '')} |")
            continue
        out.append(f"{head} {dp['tok_per_s']:,.0f} | {vp['tok_per_s']:,.0f} | "
                   f"{dp['tok_per_s'] / vp['tok_per_s']:.3f}x | {dp['peak_mem_gb']:.2f} | "
                   f"{vp['peak_mem_gb']:.2f} | {dp.get('commit', '')} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", default="vocab_split_memory_h200.json")
    ap.add_argument("--speed", default="vocab_split_h200x2.json")
    ap.add_argument("--check", help="a Markdown file that must hold both tables as printed")
    a = ap.parse_args()
    tables = [speed_table(load(a.speed)), memory_table(load(a.memory)["rows"])]
    if a.check:
        with open(a.check) as f:
            text = f.read()
        stale = [t.splitlines()[0] for t in tables if t not in text]
        if stale:
            sys.exit(f"{a.check}: a table differs from the results files (its header: "
                     f"{stale[0]}); paste python3 tools/bench/vocab_split_table.py's output")
        print("split tables: ok")
        return
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
