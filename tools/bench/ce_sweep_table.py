#!/usr/bin/env python3
"""Joins `bench_ce --sweep` with the anchors of tools/bench/ce_sweep_anchors.py into one results
file (a row per head, mode, V and C with the anchors' times and memory beside ours), draws its
figure, and prints each point against the loss head's targets:
- the default head (`fast`) forward + backward faster than Liger and torch.compile at every V, with
  no more extra memory than Liger (also against the anchors' GPU work alone, their rows' ms_queued
  from ce_sweep_anchors.py --queued, where measured);
- at V >= 32768, within 1.15x of its copy floor;
- the exact fused linear head (fused_linear_rows) faster than torch.compile at every V and C, with
  at most a tenth of its extra memory; where a tenth is below what any head must hold (the
  gradients it returns) or what a head computing the logits once must hold (least_extra_gb), the
  line says so.

    python3 tools/bench/ce_sweep_table.py --bench bench_ce_sweep.json \\
        --anchors anchors_logits.json anchors_linear.json --out docs/results/ce_vocab_sweep_h200.json \\
        [--figure docs/results/ce_vocab_sweep_h200.png] [--meta key=value ...]
"""
import argparse
import json

ANCHORS = ("liger", "torch_compile", "cce")


def key(head, mode, N, V, C):
    return (head, mode, int(N), int(V), int(C) if C else None)


def join(bench, anchor_docs):
    anchors = {}
    for doc in anchor_docs:
        for r in doc["rows"]:
            anchors.setdefault(key(r["head"], r["mode"], r["N"], r["V"], r.get("C")),
                               {})[r["anchor"]] = r
    rows = []
    for r in bench["results"]:
        if "ms" not in r:
            continue
        head = "linear" if "C" in r else "logits"
        row = dict(head=head, mode=r.get("mode", "fwd_bwd"), V=r["V"], N=r["N"], C=r.get("C"),
                   variant=r["variant"], ms=round(r["ms"], 4), extra_gb=round(r["extra_GB"], 6),
                   floor_ms=round(r["floor_ms"], 4), latency_floor_ms=round(r["latency_floor_ms"], 4),
                   launches=r["launches"], x_floor=round(r["x_floor"], 3),
                   x_max_floor=round(r["x_max_floor"], 3), loss=round(r["loss"], 5))
        for name, a in anchors.get(key(head, row["mode"], r["N"], r["V"], r.get("C")), {}).items():
            row[f"{name}_ms"] = a.get("ms")
            if "ms_queued" in a:  # the GPU's work alone; None: the call waits on the host inside
                row[f"{name}_ms_queued"] = a["ms_queued"]
            row[f"{name}_extra_gb"] = a.get("extra_GB")
        rows.append(row)
    return rows


GEMM_WORKSPACE_BYTES = 32 << 20  # cuBLASLt's workspace, which bench_ce counts (kernels/gemm/matmul.cu)


def least_extra_gb(N, C, V):
    """What a linear head must hold beyond its inputs, in GB: (any head) the gradients it returns,
    dh [N, C] and dW [V, C] in bf16; (a head that computes the logits once, fused_linear_rows'
    three GEMMs) those, plus either an fp32 dW accumulator and a tile of 16 rows or one tile of all
    N rows, plus its GEMMs' workspace."""
    grads = 2 * C * (N + V)
    once = grads + min(4 * V * C + 2 * 16 * V, 2 * N * V) + GEMM_WORKSPACE_BYTES
    return grads / 1e9, once / 1e9


def check_targets(rows):
    """Lines saying where each target holds and where it does not."""
    out = []
    fast = [r for r in rows if r["variant"] == "fast" and r["mode"] == "fwd_bwd"]
    for r in fast:
        beats = all(r.get(f"{a}_ms") is not None and r["ms"] < r[f"{a}_ms"]
                    for a in ("liger", "torch_compile"))
        # against the anchors' GPU work alone (ms_queued) where it was measured: at small V their
        # calls' Python dispatch is most of ms
        queued = [a for a in ("liger", "torch_compile") if r.get(f"{a}_ms_queued") is not None]
        gpu = "" if not queued else "; GPU alone: " + ", ".join(
            f"{a} {r[f'{a}_ms_queued']}" + (" faster" if r["ms"] < r[f"{a}_ms_queued"]
                                             else " NOT faster") for a in queued)
        mem = r.get("liger_extra_gb") is not None and r["extra_gb"] <= r["liger_extra_gb"]
        floor = "" if r["V"] < 32768 else f", {r['x_floor']:.2f}x copy floor" + \
            (" (<= 1.15)" if r["x_floor"] <= 1.15 else " (> 1.15)")
        out.append(f"fast V={r['V']}: {r['ms']:.3f} ms vs liger {r.get('liger_ms')} compile "
                   f"{r.get('torch_compile_ms')}: {'faster' if beats else 'NOT faster'}; extra "
                   f"{r['extra_gb'] * 1e3:.2f} MB vs liger {(r.get('liger_extra_gb') or 0) * 1e3:.2f} MB: "
                   f"{'ok' if mem else 'more'}{floor}{gpu}")
    exact = [r for r in rows if r["variant"] == "fused_linear_rows" and r["mode"] == "fwd_bwd"]
    for r in exact:
        c = r.get("torch_compile_ms")
        cm = r.get("torch_compile_extra_gb")
        reach = ""
        if cm:  # where a tenth is below what the head must hold, say so: the target cannot be met
            grads, once = least_extra_gb(r["N"], r["C"], r["V"])
            if grads > cm / 10:
                reach = f" (out of reach for any head: its gradients alone are {grads:.3f} GB)"
            elif once > cm / 10:
                reach = f" (out of reach with the logits computed once: at least {once:.3f} GB)"
        out.append(f"fused_linear_rows C={r['C']} V={r['V']}: {r['ms']:.3f} ms vs compile {c}: "
                   f"{'faster' if c and r['ms'] < c else 'NOT faster'}; extra {r['extra_gb']:.3f} GB "
                   f"vs compile {cm}: {'<= a tenth' if cm and r['extra_gb'] <= cm / 10 else 'more than a tenth'}"
                   f"{reach}")
    return out


def figure(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("logits", None), ("linear", 768), ("linear", 2048)]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (head, C) in zip(axes, panels):
        sel = [r for r in rows if r["head"] == head and r["mode"] == "fwd_bwd" and r["C"] == C]
        ours = ["fast", "online"] if head == "logits" else ["fused_linear_rows", "fused_linear"]
        for v in ours:
            pts = sorted((r["V"], r["ms"]) for r in sel if r["variant"] == v)
            ax.plot(*zip(*pts), "o-", label=f"zgpt {v}")
        ref = [r for r in sel if r["variant"] == ours[0]]
        for a in ANCHORS:
            pts = sorted((r["V"], r[f"{a}_ms"]) for r in ref if r.get(f"{a}_ms"))
            if pts:
                ax.plot(*zip(*pts), "s--", label=a.replace("_", "."))
            pts = sorted((r["V"], r[f"{a}_ms_queued"]) for r in ref if r.get(f"{a}_ms_queued"))
            if pts:
                ax.plot(*zip(*pts), "x:", label=a.replace("_", ".") + ", GPU alone")
        pts = sorted((r["V"], max(r["floor_ms"], r["latency_floor_ms"])) for r in ref)
        ax.plot(*zip(*pts), "k:", label="floor (copy or GEMMs; latency)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("vocabulary V")
        ax.set_ylabel("ms, forward + backward")
        ax.set_title("logits head, N = 16384" if head == "logits" else f"from hidden states, C = {C}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--anchors", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--figure")
    ap.add_argument("--meta", nargs="*", default=[], help="key=value pairs recorded in the file")
    args = ap.parse_args()
    bench = json.load(open(args.bench))
    anchor_docs = [json.load(open(p)) for p in args.anchors]
    rows = join(bench, anchor_docs)
    targets = check_targets(rows)
    versions = {k: next((d[k] for d in anchor_docs if d.get(k)), None)
                for k in ("torch", "liger", "cce")}
    doc = dict(device=bench["device"], copy_TBps=round(bench["copy_TBps"], 3), anchors=versions)
    for m in args.meta:
        k, v = m.split("=", 1)
        if k in ("rows", "targets", "device", "copy_TBps", "anchors"):
            ap.error(f"--meta {k}: that key is the tool's own")
        doc[k] = v
    doc.update(targets=targets, rows=rows)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("\n".join(targets))
    if args.figure:
        figure(rows, args.figure)


if __name__ == "__main__":
    main()
