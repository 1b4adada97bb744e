#!/usr/bin/env python3
"""PyTorch's side of the per-op table: training steps of llm.c's train_gpt2.py model, run as that
script runs them (torch.compile with coordinate-descent tuning, flash attention, bf16 autocast, fused
AdamW, the gradient clipped to norm 1) on random tokens, profiled back to back in one profiler
session, their GPU kernels grouped into op families that bench_train --ops' ops sum into too.
A marker kernel (torch.cuda._sleep) queued before each phase (forward + loss, backward, gradient
norm, AdamW) splits the stream's kernels into phases without a synchronisation between them, so
the board runs as in training (a host wait between phases would idle it and change its clock under
the power cap). Kernel names decide the family (classify() below); each phase also lists its
kernels with the most time, so that a name the rules miss shows.

  python3 tools/bench/torch_step_profile.py --llmc PATH/train_gpt2.py --model d48 --batch 16 \\
      [--seq 1024] [--steps 3] [--warmup 8] [--out torch_profile.json] [--ours bench_train.json]

--ours: a bench_train --ops JSON of the same shape; its ops are summed into the same families and
printed beside PyTorch's. Some families cannot line up: Inductor fuses the embedding's forward into
the first LayerNorm's kernel, and its GELU forward and autocast's bf16 copies of the weights land in
"other fwd", where our GELU is inside the fc GEMM's epilogue. Inductor's kernels are named after
the ops they fuse (triton.unique_kernel_names). Needs a CUDA GPU and PyTorch; classify(),
split_phases() and the sums of our ops need neither (tests/torch_profile_check.py).
"""
import argparse
import importlib.util
import json
import re
import statistics
import sys

SIZES = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}
PHASES = ("forward", "backward", "gradient norm", "adamw")

MATMUL = re.compile(r"gemm|gemv|cutlass|nvjet|xmma|cublas|sm90_|sm80_|ampere_|hopper_", re.I)
# cuDNN's attention runs two helpers beside its kernels: the backward's dot(dO, O) and dQ's cast
ATTENTION = re.compile(r"flash|fmha|attention|sdpa|cudnn::fusion", re.I)
# in the name of torch.cuda._sleep's kernel (the profiler gives it qualified, with its
# arguments), queued before each phase
MARKER = "spin_kernel"


def classify(phase, name):
    """The op family of one GPU kernel of `phase` (see PHASES) by its name."""
    if phase in ("gradient norm", "adamw"):
        return phase
    if ATTENTION.search(name):
        return "attention fwd" if phase == "forward" else "attention bwd"
    # Inductor names its fused kernels triton_{poi,per,red}_fused_<ops>; triton_tem_ are its GEMM
    # templates (max-autotune)
    if name.startswith("triton_tem_") or (MATMUL.search(name) and not name.startswith("triton_")):
        return "matmul fwd" if phase == "forward" else "matmul bwd"
    if re.search(r"log_softmax|nll_loss|cross_entropy", name):
        return "cross-entropy"
    if "layer_norm" in name:
        return "layernorm fwd (+ residual)" if phase == "forward" else "layernorm bwd"
    if re.search(r"embedding", name):
        return "encoder"
    return "other fwd" if phase == "forward" else "other bwd"


# bench_train --ops' op names summed into classify()'s families
OURS = {
    "matmul fwd": ("matmul fwd", "matmul fwd (fc + GELU)", "matmul fwd (qkv, qk_norm)",
                   "head matmul fwd"),
    "matmul bwd": ("matmul bwd dinp", "matmul bwd dW", "matmul bwd", "head matmul bwd dinp",
                   "head matmul bwd dW", "head matmul bwd"),
    "attention fwd": ("attention fwd",),
    "attention bwd": ("attention bwd",),
    "layernorm fwd (+ residual)": ("residual + layernorm fwd", "layernorm fwd", "residual fwd"),
    "layernorm bwd": ("layernorm bwd",),
    "cross-entropy": ("cross-entropy",),
    "encoder": ("encoder fwd", "encoder bwd"),
    "other fwd": ("gelu fwd",),
    "other bwd": ("bias bwd", "GELU bwd", "gelu bwd", "GELU recompute", "residual gradient cast"),
    "gradient norm": ("gradient norm",),
    "adamw": ("adamw",),
}


def ours_by_family(path):
    with open(path) as f:
        ops = {o["op"]: o["ms"] for o in json.load(f)["ops"]}
    out, used = {}, set()
    for fam, names in OURS.items():
        out[fam] = sum(ops.get(n, 0.0) for n in names)
        used.update(names)
    out["other (not grouped)"] = sum(v for k, v in ops.items() if k not in used)
    return out


def load_llmc(path):
    spec = importlib.util.spec_from_file_location("train_gpt2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def split_phases(kernels, phases, steps):
    """kernels: (name, start_us, end_us) of the profiled steps in stream order, a MARKER before
    each phase and one after the last. Returns one {phase: {"busy_ms", "span_ms", "kernels":
    {name: ms}}} a step: busy is the phase's kernel time, span the time from its marker's end to
    the next marker's start (idle gaps included)."""
    marks = [i for i, k in enumerate(kernels) if MARKER in k[0]]
    if len(marks) != steps * len(phases) + 1:
        like = sorted({k[0] for k in kernels if re.search(r"spin|sleep", k[0], re.I)})[:5]
        sys.exit(f"expected {steps * len(phases) + 1} phase markers, found {len(marks)}"
                 f" (kernels named like one: {like})")
    out = []
    for s in range(steps):
        step = {}
        for p, phase in enumerate(phases):
            a, b = marks[s * len(phases) + p], marks[s * len(phases) + p + 1]
            names = {}
            for name, t0, t1 in kernels[a + 1:b]:
                names[name] = names.get(name, 0.0) + (t1 - t0) / 1e3
            step[phase] = {"busy_ms": sum(names.values()),
                           "span_ms": (kernels[b][1] - kernels[a][2]) / 1e3, "kernels": names}
        out.append(step)
    return out


def profile_steps(torch, phases, steps):
    """Runs `steps` training steps, each phase of `phases` ((name, fn) pairs) after a marker kernel,
    under one profiler with no host wait until the end; returns split_phases()'s steps."""
    from torch.autograd import DeviceType
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            for _, fn in phases:
                torch.cuda._sleep(1000)
                fn()
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
    kernels = []
    for ev in prof.events():
        # work on the device only: not the runtime calls (no device time), not annotations
        # or synchronisation spans, which would count their whole duration
        if ev.device_type != DeviceType.CUDA or getattr(ev, "is_user_annotation", False):
            continue
        if ev.name == "Context Sync":
            continue
        if ev.name == "triton_":
            sys.exit("Inductor's kernels have no names (triton.unique_kernel_names is off)")
        kernels.append((ev.name, ev.time_range.start, ev.time_range.end))
    kernels.sort(key=lambda k: k[1])
    return split_phases(kernels, [name for name, _ in phases], steps)


def summarise(runs):
    """split_phases()'s steps -> (median ms a family, median busy and span ms a phase, the last
    step's top kernels a phase)."""
    families, phase_ms, top = {}, {}, {}
    for phase in PHASES:
        sums = []
        for run in runs:
            s = {}
            for name, ms in run[phase]["kernels"].items():
                fam = classify(phase, name)
                s[fam] = s.get(fam, 0.0) + ms
            sums.append(s)
        for fam in {f for s in sums for f in s}:
            median = statistics.median(s.get(fam, 0.0) for s in sums)
            families[fam] = families.get(fam, 0.0) + median
        phase_ms[phase] = {k: round(statistics.median(r[phase][k] for r in runs), 3)
                           for k in ("busy_ms", "span_ms")}
        last = sorted(runs[-1][phase]["kernels"].items(), key=lambda k: -k[1])[:15]
        top[phase] = [{"kernel": k, "ms": round(ms, 3), "family": classify(phase, k)}
                      for k, ms in last]
    return families, phase_ms, top


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llmc", required=True, help="llm.c's train_gpt2.py")
    ap.add_argument("--model", default="d48", choices=sorted(SIZES))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=8,
                    help="steps before the profiled ones (torch.compile's)")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (median per family)")
    ap.add_argument("--out")
    ap.add_argument("--ours", help="bench_train --ops JSON of the same shape")
    args = ap.parse_args()

    import torch
    llmc = load_llmc(args.llmc)
    llmc.FLASH = 1
    L, H, C = SIZES[args.model]
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    model = llmc.GPT(llmc.GPTConfig(block_size=1024, vocab_size=50257, n_layer=L, n_head=H,
                                    n_embd=C)).cuda().train()
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "coordinate_descent_tuning"):
        inductor_config.coordinate_descent_tuning = True
    # kernels named after the ops they fuse (the default from PyTorch 2.6; names and the cache's
    # keys only, not the kernels)
    inductor_config.triton.unique_kernel_names = True
    model = torch.compile(model)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, betas=(0.9, 0.95),
                                     device_type="cuda", zero_stage=0)
    x = torch.randint(0, 50257, (args.batch, args.seq), device="cuda")
    y = torch.randint(0, 50257, (args.batch, args.seq), device="cuda")
    state = {}

    def forward():
        with torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16):
            _, state["loss"] = model(x, y, return_logits=False)

    def backward():
        state["loss"].backward()

    def norm():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    phases = list(zip(PHASES, (forward, backward, norm, step)))
    for i in range(args.warmup):
        for _, fn in phases:
            fn()
        print(f"warm-up step {i + 1} of {args.warmup}", file=sys.stderr)
    runs = profile_steps(torch, phases, args.steps)
    families, phase_ms, top = summarise(runs)
    span = sum(p["span_ms"] for p in phase_ms.values())
    doc = {"model": args.model, "batch": args.batch, "seq_len": args.seq,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "families_ms": {k: round(v, 3) for k, v in sorted(families.items())},
           "total_ms": round(sum(families.values()), 3), "phases_ms": phase_ms,
           "step_span_ms": round(span, 3),
           "tok_per_s_profiled": round(args.batch * args.seq / span * 1e3),
           "top_kernels": top}
    ours = ours_by_family(args.ours) if args.ours else None
    if ours:
        doc["ours_families_ms"] = {k: round(v, 3) for k, v in ours.items()}
    print(f"| family | PyTorch ms | {'ours ms |' if ours else ''}")
    print(f"| --- | --- | {'--- |' if ours else ''}")
    for fam in sorted(set(families) | set(ours or {})):
        cell = f" {ours.get(fam, 0.0):.2f} |" if ours else ""
        print(f"| {fam} | {families.get(fam, 0.0):.2f} |{cell}")
    print(f"PyTorch: {sum(families.values()):.2f} ms of kernels in a {span:.2f} ms step "
          f"({args.batch * args.seq / span * 1e3:,.0f} tok/s while profiled)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
