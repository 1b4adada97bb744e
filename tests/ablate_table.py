#!/usr/bin/env python3
"""tools/ablate.py's summary and tables, on two made-up GPU runs (no GPU needed): the median step
time of the steps after the first 20%, the board's median power over the same steps and the energy
of a step (power x step time), their columns in ablation.md and .csv, and a run without power
samples (NVML missing) left blank rather than zero. Prints "ablate table: ok" on success."""
import csv
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import ablate  # noqa: E402


def make_run(root, name, step_ms, power_w, loss):
    d = root / name
    d.mkdir()
    rows = [{"step": 0, "tokens": 0, "val_loss": 11.0}]
    for i in range(1, 11):
        r = {"step": i, "tokens": 1000 * i, "loss": loss + (10 - i) * 0.1, "step_ms": step_ms[i - 1],
             "mfu": 0.5, "peak_mem_gb": 30.0, "kernels": {"attention": name}}
        if power_w is not None:
            r["power_w"], r["sm_clock_mhz"] = power_w[i - 1], 1500.0 + i
        rows.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "provenance.json").write_text(json.dumps({"device": "cuda", "gpu": "test GPU"}))
    return ablate.summarise(d)


def check(cond, what):
    if not cond:
        sys.exit(f"ablate table: {what}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        # steps 1-2 warm up (the first 20%): their time and power must not count
        ref = make_run(root, "reference", [500, 400] + [100, 102, 98, 100, 101, 99, 100, 100],
                       [300, 350] + [690, 700, 680, 690, 695, 685, 690, 690], 3.0)
        check(ref["step_ms"] == 100, f"median step time {ref['step_ms']}, not 100")
        check(ref["power_w"] == 690, f"median power {ref['power_w']}, not 690")
        check(abs(ref["energy_j"] - 69.0) < 1e-9, f"energy {ref['energy_j']}, not 69 J")
        check(ref["sm_clock_mhz"] == 1506.5, f"median clock {ref['sm_clock_mhz']}")
        cpu = make_run(root, "no_nvml", [110] * 10, None, 3.1)
        check(cpu["power_w"] is None and cpu["energy_j"] is None, "power invented without samples")
        ref.update({"name": "reference", "combo": {}, "speedup": 1.0, "loss_diff": 0.0})
        cpu.update({"name": "no_nvml", "combo": {}, "speedup": 100 / 110, "loss_diff": 0.1})

        class Args:
            config, steps, set = "cfg.yaml", 10, []

        ablate.write_tables(root, [ref, cpu], Args)
        md = (root / "ablation.md").read_text().splitlines()
        check("| variant | tok/s | step ms | vs reference | board W | J/step | peak GB |" in md[2],
              f"header {md[2]!r}")
        check(md[4].startswith("| reference | 10000 | 100.00 | 1.000x | 690 | 69.0 | 30.00 |"),
              f"reference row {md[4]!r}")
        check(md[5].startswith("| no_nvml | 9091 | 110.00 | 0.909x |  |  | 30.00 |"),
              f"row without power {md[5]!r}")
        rows = list(csv.DictReader(open(root / "ablation.csv")))
        check(float(rows[0]["energy_j"]) == 69.0 and rows[1]["power_w"] == "", f"csv {rows}")
    print("ablate table: ok")


if __name__ == "__main__":
    main()
