#!/usr/bin/env python3
"""tools/dev/spread_compare.py on made-up parity files: the samples it pools (an identical curve
counted once, start jitters with ours, kernel variants and other settings apart), the Welch
difference against a hand computation, one run of ours, and the refusals (files of two runs, too
few PyTorch runs)."""
import json
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile

tool = pathlib.Path(__file__).resolve().parent.parent / "tools/dev/spread_compare.py"
sys.path.insert(0, str(tool.parent))
from spread_compare import two_sided_p  # noqa: E402  (the tool's folder, added above)

work = pathlib.Path(tempfile.mkdtemp(prefix="zgpt_spread_"))


def curve(level, steps=4):
    return [level + 0.5 * (steps - i) for i in range(steps)]  # windows of 2: level + 1.75, level + 0.75


def write(name, ours, pytorch, ours_variants, pytorch_variants, overrides=("optim.lr=0.1",)):
    p = work / name
    p.write_text(json.dumps({"config": "c.yaml", "overrides": list(overrides), "steps": 4, "ours": ours,
                             "pytorch": pytorch, "ours_variants": ours_variants,
                             "pytorch_variants": {k: {"losses": v} for k, v in pytorch_variants.items()}}))
    return str(p)


def run(*files):
    r = subprocess.run([sys.executable, str(tool), *files, "--window", "2", "--out", str(work / "s.json")],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


# Student's t: the tables' two-sided 5% points
for t, dof in ((12.706, 1), (2.228, 10), (1.960, 1e6)):
    check(abs(two_sided_p(t, dof) - 0.05) < 2e-4, f"p({t}, {dof}) = {two_sided_p(t, dof)}, not 0.05")
check(two_sided_p(0.0, 5) == 1.0, "p(0) is not 1")

a = write("a.json", curve(1.0), curve(2.0),
          {"model.init_jitter=1e-6,model.init_jitter_seed=1": {"losses": curve(1.2)},
           "train.fp32_residual=true": {"losses": curve(1.5)}},
          {"jitter": curve(2.2), "bf16_storage": curve(2.5)})
b = write("b.json", curve(1.0), curve(2.4),  # ours again (deterministic), PyTorch's own again
          {"model.init_jitter=1e-6,model.init_jitter_seed=2": {"losses": curve(0.8)},
           "train.fp32_residual=true,model.init_jitter=1e-6,model.init_jitter_seed=3": {"losses": curve(1.7)}},
          {"jitter2": curve(2.2),  # the same curve as a.json's jitter: counted once
           "bf16_storage+jitter3": curve(2.7)})  # a kernel variant from a moved start: its sample
rc, out = run(a, b)
check(rc == 0, f"two files: exit {rc}\n{out}")
s = json.loads((work / "s.json").read_text())
o, t = [1.0, 1.2, 0.8], [2.0, 2.2, 2.4]
mo, mt = sum(o) / 3, sum(t) / 3
se = math.sqrt(sum((x - mo) ** 2 for x in o) / 2 / 3 + sum((x - mt) ** 2 for x in t) / 2 / 3)
last = s["windows"][-1]
check(last["ours_runs"] == 3 and last["pytorch_runs"] == 3, f"runs pooled: {last}")
check(abs(last["difference"] - (mo - mt)) < 1e-12, f"difference {last['difference']} against {mo - mt}")
check(abs(last["standard_errors"] - (mo - mt) / se) < 1e-9, f"SE {last['standard_errors']} against {(mo - mt) / se}")
check(abs(last["dof"] - 4.0) < 1e-9, f"Welch's dof {last['dof']}, not 4 (equal variances, 3 runs a side)")
check(s["final_losses"]["ours train.fp32_residual=true"] == [2.25, 2.45], f"other settings: {s['final_losses']}")
check(s["final_losses"]["pytorch bf16_storage"] == [3.25, 3.45], f"kernel variant, two starts: {s['final_losses']}")

# --pair: another setting's sample against PyTorch's; the default pair is listed beside
r = subprocess.run([sys.executable, str(tool), a, b, "--window", "2", "--out", str(work / "p.json"),
                    "--pair", "ours train.fp32_residual=true", "pytorch"], capture_output=True, text=True)
p = json.loads((work / "p.json").read_text()) if r.returncode == 0 else {}
lw = p.get("windows", [{}])[-1]
check(lw.get("ours_runs") == 2 and abs(lw.get("difference", 0) - (2.35 - 2.95)) < 1e-12
      and "ours" in lw.get("others", {}), f"--pair: {lw}\n{r.stdout}{r.stderr}")
r = subprocess.run([sys.executable, str(tool), a, "--pair", "ours fp32", "pytorch"], capture_output=True, text=True)
check(r.returncode != 0 and "no sample named 'ours fp32'" in r.stderr, f"--pair with no such sample: {r.stderr}")

one = write("one.json", curve(1.0), curve(2.0), {}, {"jitter": curve(2.2), "jitter2": curve(2.4)})
rc, out = run(one)
s = json.loads((work / "s.json").read_text())
sd = math.sqrt(sum((x - 2.2) ** 2 for x in t) / 2)
want = (1.0 - 2.2) / (sd * math.sqrt(1 + 1 / 3))  # one run of ours spreads as PyTorch's
check(rc == 0 and abs(s["windows"][-1]["standard_errors"] - want) < 1e-9, f"one run of ours: {out}")
# (p from the tool's own SE, which may differ from `want` in the last bits)
check(s["windows"][-1]["dof"] == 2 and abs(s["windows"][-1]["p"] - two_sided_p(want, 2)) < 1e-12, f"one run's p: {out}")

# PyTorch's two runs part in the first window only: the last has no spread on either side
flat = write("flat.json", curve(1.0), curve(2.0), {}, {"jitter": [9.0] + curve(2.0)[1:]})
rc, out = run(flat)
s = json.loads((work / "s.json").read_text())
check(rc == 0 and s["windows"][-1]["standard_errors"] is None, f"no spread weighed as a difference: {out}")

other = write("other.json", curve(1.0), curve(2.0), {}, {"jitter": curve(2.2)}, overrides=("optim.lr=0.3",))
rc, out = run(a, other)
check(rc != 0 and "another run" in out, f"files of two runs accepted: {out}")
few = write("few.json", curve(1.0), curve(2.0), {}, {})
rc, out = run(few)
check(rc != 0 and "spread needs two" in out, f"one PyTorch run accepted: {out}")

# log^2 Z at the end: each run's mean lse^2 over the last window, tested as the losses are; a sample
# with a run written without statistics has none
st = lambda level: [{"lse_sq_mean": level + i} for i in range(4)]  # last window of 2: level + 2.5
z = write("z.json", curve(1.0), curve(2.0), {"model.init_jitter=1e-6,model.init_jitter_seed=1": {"losses": curve(1.2), "stats": st(20)}},
          {"jitter": curve(2.2), "bf16_storage": curve(2.5)})
d = json.loads(pathlib.Path(z).read_text())
d.update(ours_stats=st(10), pytorch_stats=st(30))
d["pytorch_variants"]["jitter"]["stats"] = st(40)
pathlib.Path(z).write_text(json.dumps(d))
rc, out = run(z)
s = json.loads((work / "s.json").read_text())
fz = s.get("final_log2z", {})
check(rc == 0 and fz.get("ours") == [12.5, 22.5] and fz.get("pytorch") == [32.5, 42.5], f"final log^2 Z: {fz}\n{out}")
check("pytorch bf16_storage" not in fz, f"a run without statistics gets no log^2 Z: {fz}")
check(s["final_log2z_test"]["difference"] == -20.0 and abs(s["final_log2z_test"]["dof"] - 2.0) < 1e-9,
      f"log^2 Z tested: {s['final_log2z_test']}")
check(s.get("final_grad_norm") == {}, f"files without gradient norms report none: {s.get('final_grad_norm')}")
# the gradient norm before clipping, where the statistics carry it: each run's mean over the last window
for k, sts in (("ours_stats", d["ours_stats"]), ("pytorch_stats", d["pytorch_stats"])):
    for i, x in enumerate(sts):
        x["grad_norm"] = (1.0 if k == "ours_stats" else 3.0) + i
d["ours_variants"]["model.init_jitter=1e-6,model.init_jitter_seed=1"]["stats"] = [
    dict(x, grad_norm=2.0 + i) for i, x in enumerate(st(20))]
d["pytorch_variants"]["jitter"]["stats"] = [dict(x, grad_norm=5.0 + i) for i, x in enumerate(st(40))]
pathlib.Path(z).write_text(json.dumps(d))
rc, out = run(z)
fn = json.loads((work / "s.json").read_text()).get("final_grad_norm", {})
check(rc == 0 and fn.get("ours") == [3.5, 4.5] and fn.get("pytorch") == [5.5, 7.5], f"final gradient norm: {fn}\n{out}")

shutil.rmtree(work)
print("\n".join(failures) if failures else "spread compare: ok")
sys.exit(1 if failures else 0)
