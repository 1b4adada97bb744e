#!/usr/bin/env python3
"""tools/gpu/spread_runs.sh without a GPU: a stand-in nvidia-smi lists two GPUs and a stand-in
python3 answers for tools/dev/parity_torch.py (it writes a small parity file and records the GPU it
was given), so that the script's own logic is checked: jobs dealt round the GPUs, GPUS choosing
them, a finished job skipped when the script runs again, the jobs pooled into spread.json,
TORCH_EXTRA on the first TORCH_EXTRA_JOBS jobs, OURS_ONLY jobs with several OURS_SETS pooled with
earlier jobs' PyTorch runs (each setting from our weights in the first job only), and a machine
without a GPU refused."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
script = root / "tools/gpu/spread_runs.sh"
work = pathlib.Path(tempfile.mkdtemp(prefix="zgpt_spread_runs_"))
fake = work / "bin"
fake.mkdir()
(fake / "nvidia-smi").write_text('#!/bin/sh\n[ -n "$FAKE_NO_GPU" ] || printf "0\\n1\\n"\n')
# parity_torch.py's stand-in: the job's number k from --work .../spread_jobK, curves that differ
# by job, and the GPU in a log beside the output
(fake / "python3").write_text(f"""#!/bin/sh
case "$1" in
  *parity_torch.py) exec {sys.executable} - "$@" <<'PY'
import json, os, re, sys
a = sys.argv[2:]
out, work = a[a.index("--out") + 1], a[a.index("--work") + 1]
k = int(re.search(r"(\\d+)$", work).group(1))
c = lambda x: [3.0 + x + 0.001 * i for i in range(200)]
ov = [a[i + 1] for i, x in enumerate(a) if x == "--ours-variant"]
run = {{"config": "c.yaml", "overrides": ["optim.lr=0.1"], "steps": 200, "ours": c(0),
        "ours_variants": {{v: {{"losses": c(0.003 * k + 0.0001 * i)}} for i, v in enumerate(ov)}}}}
if "--ours-only" in a:
    run["ours_only"] = True
else:
    tv = a[a.index("--torch-variants") + 1].split(",")
    run["pytorch"] = c(0.01 * k)
    run["pytorch_variants"] = {{v: {{"losses": c(0.1 + 0.02 * k)}} for v in tv}}
json.dump(run, open(out, "w"))
with open(os.path.join(os.path.dirname(out), "gpus.log"), "a") as f:
    f.write(f"{{k}} {{os.environ['CUDA_VISIBLE_DEVICES']}}\\n")
PY
  ;;
esac
exec {sys.executable} "$@"
""")
for f in fake.iterdir():
    f.chmod(0o755)

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def spread(out, extra_env=None, jobs=3):
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", JOBS=str(jobs), **(extra_env or {}))
    r = subprocess.run(["bash", str(script), str(out), "build-gpu", "configs/zloss-16m.yaml", "200"],
                       env=env, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def gpus(out):
    log = out / "gpus.log"
    return sorted(tuple(map(int, l.split())) for l in log.read_text().split("\n") if l) if log.exists() else []


# the GPUs nvidia-smi lists, jobs dealt round them
out = work / "all"
rc, text = spread(out)
check(rc == 0, f"spread_runs.sh on two GPUs exits 0 ({rc}): {text[-400:]}")
check(gpus(out) == [(1, 0), (2, 1), (3, 0)], f"jobs 1-3 on GPUs 0, 1, 0: {gpus(out)}")
s = json.loads((out / "spread.json").read_text()) if (out / "spread.json").exists() else {}
fl = s.get("final_losses", {})
check(len(fl.get("ours", [])) == 4 and len(fl.get("pytorch", [])) == 6,
      f"spread.json pools ours' plain run once and three jitters, PyTorch's six runs: {fl}")

# GPUS picks the GPU; a job whose JSON is there is not run again
out = work / "one"
out.mkdir()
shutil.copy(work / "all/job2.json", out / "job2.json")
rc, text = spread(out, {"GPUS": "1"})
check(rc == 0, f"GPUS=1 exits 0 ({rc}): {text[-400:]}")
check(gpus(out) == [(1, 1), (3, 1)], f"GPUS=1: jobs 1 and 3 on GPU 1, job 2 kept: {gpus(out)}")
check((out / "spread.json").exists(), "GPUS=1: spread.json written")

# TORCH_EXTRA on the first TORCH_EXTRA_JOBS jobs: a PyTorch variant with a sample of its own
out = work / "extra"
rc, text = spread(out, {"TORCH_EXTRA": "bf16_storage", "TORCH_EXTRA_JOBS": "2"})
fl = json.loads((out / "spread.json").read_text()).get("final_losses", {}) if rc == 0 else {}
check(len(fl.get("pytorch bf16_storage", [])) == 2, f"TORCH_EXTRA_JOBS=2: two bf16_storage runs: {fl} {text[-300:]}")

# OURS_ONLY with two settings: jobs 4 and 5 train ours alone, and their samples pool with the
# PyTorch runs of jobs 1-3
out = work / "ablation"
out.mkdir()
for k in (1, 2, 3):
    shutil.copy(work / f"all/job{k}.json", out / f"job{k}.json")
rc, text = spread(out, {"OURS_ONLY": "1", "OURS_SETS": "kernels.attention=naive;train.precision=fp32"},
                  jobs=5)
fl = json.loads((out / "spread.json").read_text()).get("final_losses", {}) if rc == 0 else {}
check(gpus(out) == [(4, 1), (5, 0)], f"OURS_ONLY: jobs 4 and 5 ran, 1-3 kept: {gpus(out)} {text[-300:]}")
check(len(fl.get("ours kernels.attention=naive", [])) == 3 and
      len(fl.get("ours train.precision=fp32", [])) == 3 and len(fl.get("pytorch", [])) == 6 and
      len(fl.get("ours", [])) == 6,
      f"OURS_ONLY: two settings of three runs each, ours' six and jobs 1-3's PyTorch runs: {fl}")
# each setting from our weights in the call's first job only (ours is deterministic)
variants = {k: set(json.loads((out / f"job{k}.json").read_text())["ours_variants"]) for k in (4, 5)}
check("kernels.attention=naive" in variants[4] and "kernels.attention=naive" not in variants[5],
      f"OURS_ONLY: the settings from our weights in job 4 only: {variants}")
r = subprocess.run([sys.executable, str(root / "tools/dev/spread_compare.py"), *map(str, sorted(out.glob("job*.json"))),
                    "--pair", "ours kernels.attention=naive", "pytorch"], capture_output=True, text=True)
check(r.returncode == 0 and "3 runs of ours kernels.attention=naive, 6 of pytorch" in r.stdout,
      f"OURS_ONLY: --pair against PyTorch ({r.returncode}): {r.stdout[-300:]} {r.stderr[-300:]}")

# no GPU listed: refused by name
out = work / "none"
rc, text = spread(out, {"FAKE_NO_GPU": "1"})
check(rc != 0 and "no GPU" in text, f"no GPU: refused ({rc}): {text[-300:]}")
check(gpus(out) == [], "no GPU: no job ran")

shutil.rmtree(work, ignore_errors=True)
if failures:
    sys.exit(1)
print("spread runs: ok")
