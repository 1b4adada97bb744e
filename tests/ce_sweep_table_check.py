#!/usr/bin/env python3
"""tools/bench/ce_sweep_table.py without a GPU: made-up bench_ce --sweep rows and anchor rows are
joined and judged against the loss head's targets. Checks that each anchor's time with dispatch
(ms) and its GPU work alone (ms_queued) reach the row, that a queued time the tool could not take
(None) stays None and is left out of the GPU-alone verdict, that an anchor faster on the GPU alone
than fast shows as NOT faster there even where fast beats its time with dispatch, the copy-floor
verdict from V = 32768, and the exact linear head's memory verdict."""
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root / "tools/bench"))
import ce_sweep_table as T  # noqa: E402


def bench_row(variant, V, ms, x_floor=1.1, C=None, extra=1.3e-4):
    r = dict(variant=variant, mode="fwd_bwd", V=V, N=16384, ms=ms, extra_GB=extra,
             floor_ms=ms / x_floor, latency_floor_ms=0.01, launches=3, x_floor=x_floor,
             x_max_floor=x_floor, loss=1.0)
    if C:
        r["C"] = C
    return r


def anchor_row(name, V, ms, queued="absent", extra=1.8e-4, C=None):
    r = dict(anchor=name, head="linear" if C else "logits", mode="fwd_bwd", N=16384, V=V, ms=ms,
             extra_GB=extra, loss=1.0)
    if C:
        r["C"] = C
    if queued != "absent":
        r["ms_queued"] = queued
    return r


bench = dict(device="test GPU", copy_TBps=4.2, results=[
    bench_row("fast", 1024, 0.05),
    bench_row("fast", 8192, 0.30),
    bench_row("fast", 32768, 0.60, x_floor=1.2),
    bench_row("fast", 65536, 1.10, x_floor=1.1),
    bench_row("fused_linear_rows", 32768, 4.0, C=768, extra=0.3),
    bench_row("fused_linear_rows", 1024, 0.2, C=768, extra=0.08),
    bench_row("fused_linear_rows", 256000, 40.0, C=768, extra=1.6),
    bench_row("fused_linear_rows", 32768, 9.9, C=2048, extra=1.0),
])
anchors = dict(torch="2.x", liger="0.8.5", rows=[
    anchor_row("torch_compile", 1024, 0.70, queued=0.064),
    anchor_row("liger", 1024, 0.87, queued=None),  # waits on the host inside
    anchor_row("torch_compile", 8192, 0.70, queued=0.25),  # faster than fast on the GPU alone
    anchor_row("liger", 8192, 0.80, queued=0.79),
    anchor_row("torch_compile", 32768, 1.78),  # timed without --queued
    anchor_row("liger", 32768, 1.38),
    anchor_row("torch_compile", 65536, 3.0, queued=2.9),
    anchor_row("liger", 65536, 2.5, queued=2.4, extra=1.0e-4),  # less memory than fast
    anchor_row("torch_compile", 32768, 5.5, extra=2.15, C=768),
    anchor_row("torch_compile", 1024, 1.1, extra=0.0673, C=768),
    anchor_row("torch_compile", 256000, 43.0, extra=16.78, C=768),
    anchor_row("torch_compile", 32768, 11.4, extra=2.15, C=2048),
])

rows = T.join(bench, [anchors])
by = {(r["variant"], r["V"]): r for r in rows}
fails = []


def expect(cond, what):
    if not cond:
        fails.append(what)


r = by[("fast", 1024)]
expect(r["torch_compile_ms"] == 0.70 and r["torch_compile_ms_queued"] == 0.064,
       "both anchor times reach the row")
expect("liger_ms_queued" in r and r["liger_ms_queued"] is None,
       "an unmeasurable queued time stays None")
expect("torch_compile_ms_queued" not in by[("fast", 32768)], "no queued column without --queued")

lines = {int(t.split("V=")[1].split(":")[0]): t
         for t in T.check_targets(rows) if t.startswith("fast")}
expect("GPU alone: torch_compile 0.064 faster" in lines[1024] and "liger" not in lines[1024].split(
    "GPU alone:")[1], "V=1024: compile judged on its GPU work, Liger's None left out")
expect(": faster;" in lines[8192] and "torch_compile 0.25 NOT faster" in lines[8192],
       "V=8192: faster with dispatch, NOT faster against the GPU work alone")
expect("GPU alone" not in lines[32768] and "1.20x copy floor (> 1.15)" in lines[32768],
       "V=32768: no GPU-alone verdict, the copy floor over the target")
expect("1.10x copy floor (<= 1.15)" in lines[65536] and "more" in lines[65536],
       "V=65536: the copy floor met, more memory than Liger")
expect("copy floor" not in lines[8192], "no copy-floor verdict below V = 32768")
lin = {(int(t.split("C=")[1].split()[0]), int(t.split("V=")[1].split(":")[0])): t
       for t in T.check_targets(rows) if t.startswith("fused_linear_rows")}
expect(len(lin) == 4 and "faster" in lin[768, 32768] and "more than a tenth" in lin[768, 32768],
       "the exact linear head: faster, more than a tenth of torch.compile's memory")
# at V = 1024 a tenth (6.7 MB) is below dh and dW alone (2 x 768 x (16384 + 1024) bytes)
expect("out of reach for any head: its gradients alone are 0.027 GB" in lin[768, 1024],
       "V=1024: the tenth below the gradients any head returns")
# C = 768, V = 32768: the least a head computing the logits once holds (0.211 GB: the gradients,
# the fp32 dW, 16 rows of tile and the GEMMs' workspace) still fits a tenth (0.215 GB)
expect("out of reach" not in lin[768, 32768], "C=768, V=32768: a tenth within reach")
# C = 2048: the gradients (0.201 GB) fit a tenth, the fp32 dW beside them does not
expect("out of reach with the logits computed once: at least 0.504 GB" in lin[2048, 32768],
       "C=2048, V=32768: out of reach for a head computing the logits once")
expect("<= a tenth" in lin[768, 256000] and "out of reach" not in lin[768, 256000],
       "V=256000: within a tenth, no reach note")

# the command line: the file it writes holds the rows and the target lines
work = pathlib.Path(tempfile.mkdtemp(prefix="zgpt_ce_sweep_table_"))
(work / "bench.json").write_text(json.dumps(bench))
(work / "anchors.json").write_text(json.dumps(anchors))
out = work / "out.json"
p = subprocess.run([sys.executable, str(root / "tools/bench/ce_sweep_table.py"),
                    "--bench", str(work / "bench.json"), "--anchors", str(work / "anchors.json"),
                    "--out", str(out), "--meta", "commit=abc"], capture_output=True, text=True)
expect(p.returncode == 0, f"the tool runs: {p.stderr}")
if p.returncode == 0:
    doc = json.loads(out.read_text())
    expect(doc["commit"] == "abc" and len(doc["rows"]) == 8
           and doc["targets"] == T.check_targets(rows),
           "the file holds the meta, the rows and the target lines")
shutil.rmtree(work)

if fails:
    print("ce sweep table: FAILED\n  " + "\n  ".join(fails))
    sys.exit(1)
print("ce sweep table: ok")
