#!/usr/bin/env python3
"""How much of a training step the GPU sits idle, from an Nsight Systems trace.

    nsys profile -t cuda -o step build/bench_train -c configs/gpt2-124m.yaml --steps 8 --from 3
    nsys stats -r cuda_gpu_trace -f csv -o trace step.nsys-rep
    python3 tools/probes/gpu_idle.py trace_cuda_gpu_trace.csv

Steps are cut at the AdamW kernels (one launch run per step). For each step: its span, the time
some kernel or copy runs (union over streams), the idle time and its largest gaps, and the
launches. Idle time is what one CUDA graph per step could at most recover.
"""
import csv
import sys


def main(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            try:
                start = int(r["Start (ns)"])
                dur = int(r["Duration (ns)"])
            except (KeyError, ValueError):
                continue
            rows.append((start, start + dur, r.get("Name", "")))
    rows.sort()
    if not rows:
        sys.exit("no GPU activity in " + path)
    # the first AdamW kernel of each run of them ends a step
    ends, prev_adam = [], False
    for s, e, name in rows:
        adam = "adamw" in name.lower()
        if adam and not prev_adam:
            ends.append(s)
        prev_adam = adam
    print(f"{len(rows)} GPU activities, {len(ends)} steps cut at AdamW")
    for a, b in zip(ends, ends[1:]):
        acts = [(s, e, n) for s, e, n in rows if a <= s < b]
        busy, gaps, cur_s, cur_e = 0, [], None, None
        for s, e, n in acts:
            if cur_e is None:
                cur_s, cur_e = s, e
            elif s > cur_e:
                busy += cur_e - cur_s
                gaps.append((s - cur_e, n))
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            busy += cur_e - cur_s
        span = b - a
        gaps.sort(reverse=True)
        big = ", ".join(f"{g / 1e3:.1f} us before {n[:40]}" for g, n in gaps[:4])
        print(f"step {span / 1e6:8.3f} ms: busy {busy / 1e6:8.3f} ms, idle {(span - busy) / 1e6:6.3f} ms "
              f"({100 * (span - busy) / span:4.1f}%) in {len(gaps)} gaps; {len(acts)} activities; "
              f"largest: {big}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
