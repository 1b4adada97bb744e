#!/usr/bin/env python3
"""Loss parity with PyTorch: trains one of our configs twice from the same initial weights on the
same batches, once with our `train` and once with a small PyTorch GPT written here, and prints the
per-step loss of both and their difference, and the log Z statistics of both (the mean of lse and
of lse^2 over valid tokens, the largest logit), which a z-loss comparison reads.

The PyTorch side reads what `parity_inputs` dumps (the trainer's initial weights, parameter table
and loader batches, one rank) and follows our recipe: the same architecture (bias, tied
embeddings, qk_norm, tanh GELU, padded vocabulary masked out of the loss, and docs/llama.md's
options: RMSNorm, rotary positions, SwiGLU, grouped-query attention), cross-entropy with
label smoothing and z-loss (kernels/loss_head/cross_entropy.h), one normalisation by the step's valid
tokens over all micro-batches, global-norm clipping, AdamW with weight decay on the tensors our
table marks, and our LR schedule. fp32, or bf16 autocast (PyTorch keeps fp32 weights and a fp32
residual stream; ours is set by train.precision).

    python3 tools/dev/parity_torch.py -c configs/shakespeare-char-cpu.yaml --steps 20 \
        [--set k=v ...] [--bin build] [--device cpu|cuda] [--out parity.json] [--tolerance 1e-5]

With --tolerance, exits 1 when a step's losses differ by more than that, relatively.
"""
import argparse
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from spread_compare import settings_of, welch, window_means  # tools/dev, beside this file

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the test reports this as a skip (exit 77)
    print(f"skip: {e.name} is not installed for {sys.executable} (the tool needs numpy and torch)")
    sys.exit(77)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{r.stdout}")
    return r.stdout


def learning_rate(o, step, max_steps):  # train/lr_schedule.cpp; step is 0-based
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    if o["decay"] == "constant":
        return o["lr"]
    end = o["decay_steps"] if o["decay_steps"] > 0 else max_steps
    if step >= end:
        return o["min_lr"]
    progress = (step - o["warmup_steps"]) / max(1, end - o["warmup_steps"])
    shape = 1.0 - progress if o["decay"] == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return o["min_lr"] + shape * (o["lr"] - o["min_lr"])


class RoundBF16(torch.autograd.Function):
    """x rounded to bf16 and kept in fp32, and so its gradient: the residual stream as our trainer
    stores it without train.fp32_residual (the `bf16_residual` variant)."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


def rms_norm(x, w, eps):  # kernels/norms/rmsnorm.cpp: (x / sqrt(mean(x^2) + eps)) w, in fp32
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Rotary embedding of x [B, T, heads, hs] as kernels/ops/rope.cpp: channel i pairs with
    i + hs/2 (Hugging Face's rotate_half), angle t theta^(-2i/hs), cos/sin and the rotation in
    double, rounded once to x's dtype."""
    T, hs = x.shape[1], x.shape[3]
    half = hs // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    t = torch.arange(T, dtype=torch.float64, device=x.device)
    a = t[:, None] * theta ** (-2.0 * i / hs)
    c, s = a.cos()[None, :, None, :], a.sin()[None, :, None, :]
    xd = x.double()
    x1, x2 = xd[..., :half], xd[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def param_names(m, llama):
    """Where each tensor lives in our table (model/parameters.cpp): GPT-2's names, or Hugging Face
    Llama's when any Llama-style option is on. qkv and fc list the matrices that lie one after
    another in our arena and act as one (q, k, v; SwiGLU's gate and up)."""
    if not llama:
        def layer(l):
            p = f"transformer.h.{l}."
            return dict(ln1=p + "ln_1", qkv=[p + "attn.c_attn"], q_norm=p + "attn.q_norm",
                        k_norm=p + "attn.k_norm", proj=p + "attn.c_proj", ln2=p + "ln_2",
                        fc=[p + "mlp.c_fc"], fcproj=p + "mlp.c_proj")
        return dict(wte="transformer.wte.weight", wpe="transformer.wpe.weight", lnf="transformer.ln_f",
                    lm_head="lm_head.weight", layer=layer)

    def layer(l):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        fc = [p + "mlp.gate_proj", p + "mlp.up_proj"] if m["mlp"] == "swiglu" else [p + "mlp.up_proj"]
        return dict(ln1=p + "input_layernorm", qkv=[a + "q_proj", a + "k_proj", a + "v_proj"],
                    q_norm=a + "q_norm", k_norm=a + "k_norm", proj=a + "o_proj",
                    ln2=p + "post_attention_layernorm", fc=fc, fcproj=p + "mlp.down_proj")
    return dict(wte="model.embed_tokens.weight", wpe="model.embed_positions.weight", lnf="model.norm",
                lm_head="lm_head.weight", layer=layer)


class TorchGPT:
    """Our GPT over named tensors cut from our weight arena (matrices are [out, in], as F.linear),
    with the Llama-style options of docs/llama.md: RMSNorm, rotary positions, SwiGLU and
    grouped-query attention."""

    def __init__(self, run, arena, device, round_residual=False, attention="sdpa",
                 round_norm_weights=False):
        self.round_residual = round_residual
        self.round_norm_weights = round_norm_weights
        self.attention = attention
        self.capture = None  # a list: each layer's q, k, v and then dy are appended to it
        self.m = run["model"]
        self.P = {}
        for p in run["params"]:
            n = int(np.prod(p["shape"]))
            t = torch.from_numpy(arena[p["offset"]: p["offset"] + n].reshape(p["shape"]).copy())
            self.P[p["name"]] = t.to(device).requires_grad_(True)
        self.decay = {p["name"]: p["decay"] for p in run["params"]}
        self.names = param_names(self.m, "model.embed_tokens.weight" in self.P)

    def get(self, name):
        return self.P.get(name)

    def joined(self, names, suffix):
        """The tensors that our arena holds as one matrix (or bias), as one tensor; None if absent."""
        ts = [self.P[n + suffix] for n in names if n + suffix in self.P]
        return None if not ts else ts[0] if len(ts) == 1 else torch.cat(ts)

    def norm(self, x, name, n):
        m, w, b = self.m, self.P[name + ".weight"], self.get(name + ".bias")
        if self.round_norm_weights:  # read as bf16, as our kernels read them; the gradient passes
            w = w + (w.to(torch.bfloat16).to(w.dtype) - w).detach()
            b = None if b is None else b + (b.to(torch.bfloat16).to(b.dtype) - b).detach()
        if m["norm"] == "rmsnorm":
            return rms_norm(x, w, m["ln_eps"])
        return F.layer_norm(x, (n,), w, b, m["ln_eps"])

    def forward(self, idx):
        m, P, N = self.m, self.P, self.names
        B, T = idx.shape
        C, H = m["n_embd"], m["n_head"]
        KV = m["n_kv_head"] or H
        hs = C // H
        rotary = m["position"] == "rope"
        r = RoundBF16.apply if self.round_residual else (lambda z: z)
        x = P[N["wte"]][idx]
        if not rotary:
            x = x + P[N["wpe"]][:T]
        x = r(x)
        for l in range(m["n_layer"]):
            L = N["layer"](l)
            h = self.norm(x, L["ln1"], C)
            qkv = F.linear(h, self.joined(L["qkv"], ".weight"), self.joined(L["qkv"], ".bias"))
            q, k, v = qkv.split([C, KV * hs, KV * hs], dim=2)
            q, k, v = q.view(B, T, H, hs), k.view(B, T, KV, hs), v.view(B, T, KV, hs)
            if m["qk_norm"]:
                q, k = self.norm(q, L["q_norm"], hs), self.norm(k, L["k_norm"], hs)
            if rotary:  # after qk_norm (Qwen3, OLMo 2)
                q, k = rope(q, m["rope_theta"]), rope(k, m["rope_theta"])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if KV != H:  # query head h reads key/value head h / (H / KV)
                k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
            if self.attention in SDPA_BACKENDS:  # one backend forced instead of SDPA's choice
                backend = getattr(torch.nn.attention.SDPBackend, SDPA_BACKENDS[self.attention])
                with torch.nn.attention.sdpa_kernel(backend):
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif self.attention == "fp32":  # nothing rounded inside attention (as ours' naive kernel)
                with torch.autocast(device_type=q.device.type, enabled=False):
                    y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
                y = y.to(q.dtype)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if self.capture is not None:  # tools/dev/attention_accuracy.py: attention's real inputs
                rec = {"q": q.detach(), "k": k.detach(), "v": v.detach()}
                self.capture.append(rec)
                y.register_hook(lambda g, rec=rec: rec.update(dy=g.detach()))
            y = y.transpose(1, 2).reshape(B, T, C)
            x = r(x + F.linear(y, P[L["proj"] + ".weight"], self.get(L["proj"] + ".bias")))
            h = self.norm(x, L["ln2"], C)
            h = F.linear(h, self.joined(L["fc"], ".weight"), self.joined(L["fc"], ".bias"))
            if m["mlp"] == "swiglu":  # gate and up: one [2H, C] matrix
                gate, up = h.chunk(2, dim=-1)
                h = F.silu(gate) * up
            else:
                h = F.gelu(h, approximate="tanh")
            x = r(x + F.linear(h, P[L["fcproj"] + ".weight"], self.get(L["fcproj"] + ".bias")))
        x = self.norm(x, N["lnf"], C)
        head = P[N["wte"]] if m["tie_embeddings"] else P[N["lm_head"]]
        return F.linear(x, head)[..., : m["vocab_size"]]  # padded rows never enter the softmax


def loss_sum(logits, y, lossc, stats):
    """Sum over valid rows of (1 - eps)(lse - x_y) + eps(lse - mean x) + z lse^2, in fp32. Adds
    the sums of lse and lse^2 over valid rows and the largest logit of any row to `stats`, as our
    loss head reports them (metrics.jsonl's lse_mean, lse_sq_mean, max_logit). The statistics stay
    on the device (float64 tensors), so the step reads them back in one transfer."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    valid = y != lossc["ignore_index"]
    with torch.no_grad():
        zero = torch.zeros_like(lse, dtype=torch.float64)
        stats["lse"] += torch.where(valid, lse.double(), zero).sum()
        stats["lse_sq"] += torch.where(valid, lse.double() ** 2, zero).sum()
        stats["max_logit"] = torch.maximum(stats["max_logit"], x.max().double())
    xy = x.gather(-1, torch.where(valid, y, 0).unsqueeze(-1)).squeeze(-1)
    eps = lossc["label_smoothing"]
    ce = (1 - eps) * (lse - xy) + eps * (lse - x.mean(dim=-1))
    per_row = ce + lossc["z_loss_weight"] * lse * lse
    return torch.where(valid, per_row, torch.zeros_like(per_row)).sum()


def own_init(run, seed):
    """The weights as PyTorch would draw them: model/gpt.cpp's scheme (normal with init_std, the
    residual projections' scaled by 1 / sqrt(2 n_layer), ones and zeros, padded vocabulary rows at
    zero) from PyTorch's generator with `seed`, in our arena's layout."""
    m = run["model"]
    g = torch.Generator().manual_seed(seed)
    arena = np.zeros(run["num_parameters"], dtype=np.float32)
    residual_std = m["init_std"] / math.sqrt(2.0 * m["n_layer"])
    for p in run["params"]:
        n = int(np.prod(p["shape"]))
        if p["init"] in ("zeros", "ones"):
            arena[p["offset"]: p["offset"] + n] = 1.0 if p["init"] == "ones" else 0.0
            continue
        std = m["init_std"] if p["init"] == "normal" else residual_std
        w = torch.randn(p["shape"], generator=g, dtype=torch.float32) * std
        if p["name"].endswith(("wte.weight", "embed_tokens.weight", "lm_head.weight")):
            w[m["vocab_size"]:] = 0  # padded rows never see a token
        arena[p["offset"]: p["offset"] + n] = w.reshape(-1).numpy()
    return arena


# SDPA's backends by the names of the attention variants. With CUDA 13 and cuDNN above 9.15 on
# Hopper, PyTorch 2.11 tries cuDNN's kernel first (sdp_utils.cpp, check_prefer_cudnn_attention).
SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION"}

# The variants that change how PyTorch computes (--torch-variants): the residual stream rounded,
# the norms' weights rounded, the attention kernel (sdpa: the one SDPA picks; math, flash, cudnn,
# efficient: that backend forced; fp32: SDPA on fp32 copies of q, k and v, the output rounded
# back), and the precision they run in (None: the run's).
KERNEL_VARIANTS = {
    "bf16_residual": (True, False, "sdpa", "bf16"),
    "bf16_norm_weights": (False, True, "sdpa", "bf16"),
    "bf16_storage": (True, True, "sdpa", "bf16"),
    "math_attention": (False, False, "math", None),
    "fp32_attention": (False, False, "fp32", None),
    "flash_attention": (False, False, "flash", None),
    "cudnn_attention": (False, False, "cudnn", None),
    "efficient_attention": (False, False, "efficient", None),
}


def variant_error(name):
    """Why a --torch-variants name is not one (None when it is): a precision, jitterK, initK or a
    kernel variant, the latter two precisions or a kernel variant optionally +jitterK."""
    base, plus, moved = name.partition("+")
    movable = base in KERNEL_VARIANTS or base in ("fp32", "bf16")
    if plus:
        if not movable or not re.fullmatch(r"jitter\d*", moved):
            return f"'{name}': only a precision or a kernel variant takes +jitterK"
        return None
    if movable or re.fullmatch(r"(jitter|init)\d*", base):
        return None
    return f"'{name}' is none of fp32, bf16, jitterK, initK, " + ", ".join(KERNEL_VARIANTS)


def save_arena(run, model, path):
    """The model's weights in our arena's layout (float32, the table's offsets), as init.f32."""
    arena = np.zeros(run["num_parameters"], dtype=np.float32)
    for p in run["params"]:
        t = model.P[p["name"]].detach().float().cpu().numpy().reshape(-1)
        arena[p["offset"]: p["offset"] + t.size] = t
    arena.tofile(path)


def train_torch(run, arena, batches, device, dtype, steps, save_to=None):
    """PyTorch's run `dtype` (a precision or a variant name): its losses and log Z statistics;
    with save_to, its final weights are written there (save_arena)."""
    name, t0 = dtype, time.time()
    dtype, _, moved = dtype.partition("+")  # "fp32_attention+jitter2": a kernel variant, moved
    init = re.fullmatch(r"init(\d*)", dtype)
    if init:  # PyTorch from its own draw of the weights (seed 1, 2, ...), in the run's precision
        arena = own_init(run, int(init.group(1) or 1))
        dtype = run["train"]["precision"]
    residual, norm_weights, attention, precision = KERNEL_VARIANTS.get(
        dtype, (False, False, "sdpa", dtype))
    model = TorchGPT(run, arena, device, round_residual=residual, attention=attention,
                     round_norm_weights=norm_weights)
    dtype = precision or run["train"]["precision"]
    jitter = re.fullmatch(r"jitter(\d*)", moved or dtype)
    if jitter:  # from weights moved by 1e-6 relative (in the run's precision): an equally valid start
        with torch.no_grad():  # jitter, jitter2, jitter3, ...: seeds 1, 2, 3, ...
            g = torch.Generator(device=device).manual_seed(int(jitter.group(1) or 1))
            for p in model.P.values():
                p.mul_(1 + 1e-6 * torch.randn(p.shape, generator=g, device=device))
        if not moved:
            dtype = run["train"]["precision"]
    o, lossc, tr = run["optim"], run["loss"], run["train"]
    names = list(model.P)
    state = {n: (torch.zeros_like(model.P[n]), torch.zeros_like(model.P[n])) for n in names}
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")
    losses, stats = [], []
    # The host waits on the device once a step (the losses, statistics and gradient norm in one
    # transfer); AdamW runs as foreach kernels over all tensors. Without these, launches and
    # per-tensor reads, not the GPU, set the pace of a small model.
    params = [model.P[n] for n in names]
    ms, vs = [state[n][0] for n in names], [state[n][1] for n in names]
    decayed = [model.P[n] for n in names if model.decay[n]]
    zero = torch.zeros((), dtype=torch.float64, device=device)
    for s in range(steps):
        micro = batches[s]
        n_valid = int((micro[:, 1] != lossc["ignore_index"]).sum())
        for p in params:
            p.grad = None
        total = zero.clone()
        st = {"lse": zero.clone(), "lse_sq": zero.clone(), "max_logit": zero - math.inf}
        for a in range(micro.shape[0]):
            x = torch.from_numpy(micro[a, 0].astype(np.int64)).to(device)
            y = torch.from_numpy(micro[a, 1].astype(np.int64)).to(device)
            with autocast:
                logits = model.forward(x)
            ls = loss_sum(logits, y, lossc, st)
            (ls / max(n_valid, 1)).backward()
            total += ls.detach().double()
        with torch.no_grad():
            grads = [p.grad for p in params]
            sq = torch.stack([(g.double() ** 2).sum() for g in grads]).sum()
            tot, lse, lse_sq, max_logit, sq = torch.stack(
                [total, st["lse"], st["lse_sq"], st["max_logit"], sq]).tolist()
        losses.append(tot / max(n_valid, 1))
        if (s + 1) % max(1, steps // 10) == 0:  # a progress line on long runs
            print(f"  PyTorch {name}: step {s + 1}/{steps}, loss {losses[-1]:.4f}, "
                  f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        norm = math.sqrt(sq)  # before clipping, as ours' metrics.jsonl reports it
        stats.append({"lse_mean": lse / max(n_valid, 1), "lse_sq_mean": lse_sq / max(n_valid, 1),
                      "max_logit": max_logit, "grad_norm": norm})
        with torch.no_grad():
            scale = min(1.0, o["grad_clip"] / (norm + 1e-6)) if o["grad_clip"] > 0 else 1.0
            lr = learning_rate(o, s, tr["max_steps"])
            b1, b2, t = o["beta1"], o["beta2"], s + 1
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            # AdamW as kernels/ops/adamw.cpp (decoupled decay, bias-corrected), element by element
            # the same operations as one tensor at a time
            gs = torch._foreach_mul(grads, scale)
            torch._foreach_mul_(ms, b1)
            torch._foreach_add_(ms, gs, alpha=1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
            if decayed and o["weight_decay"]:
                torch._foreach_mul_(decayed, 1 - lr * o["weight_decay"])
            denom = torch._foreach_div(vs, bc2)
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, o["eps"])
            step = torch._foreach_div(ms, bc1)
            torch._foreach_mul_(step, lr)
            torch._foreach_div_(step, denom)
            torch._foreach_sub_(params, step)
    if save_to:
        save_arena(run, model, save_to)
    return losses, stats


def final_weights(a, name):
    """Where --save-final puts a PyTorch run's final weights (None without it)."""
    return str(pathlib.Path(a.work) / f"final_pytorch_{name}.f32") if a.save_final else None


def torch_variants(a, runj, arena, batches):
    """Each --torch-variants run: {name: (losses, log Z statistics)}."""
    out = {}
    for v in filter(None, a.torch_variants.split(",")):
        torch.manual_seed(0)
        out[v] = train_torch(runj, arena, batches, a.device, v, a.steps, final_weights(a, v))
    return out


def run_record(a, runj):
    """What every JSON the tool writes says about the run."""
    return {"config": a.config, "overrides": a.set, "model": runj["model"], "optim": runj["optim"],
            "loss": runj["loss"], "device": a.device, "precision": runj["train"]["precision"],
            "steps": a.steps, "torch_version": torch.__version__}


def own_starts(a, runj, arena, batches, ours, ours_stats):
    """--no-same-start: PyTorch's variants only (each from its own start), beside ours."""
    variants = {}
    for v, (c, c_stats) in torch_variants(a, runj, arena, batches).items():
        variants[v] = {"losses": c, "stats": c_stats}
        print(f"PyTorch {v}: last loss {c[-1]:.4f}; ours {ours[-1]:.4f}")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(dict(
            run_record(a, runj), ours=ours, ours_stats=ours_stats, pytorch_variants=variants),
            indent=1))


def ours_alone(a, runj, ours, ours_stats, ours_variants):
    """--ours-only: ours and the variants trained so far, in the layout of a full run's JSON less
    PyTorch. Written after each variant, so that a run cut short keeps the samples it finished."""
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(dict(
            run_record(a, runj), ours_only=True, ours=ours, ours_stats=ours_stats,
            ours_variants={v: {"losses": c, "stats": s} for v, (c, s) in ours_variants.items()}),
            indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--set", action="append", default=[], help="config override, as for train")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bin", default="build", help="folder with train and parity_inputs")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--work", help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", help="write the per-step losses and the gaps as JSON here")
    ap.add_argument("--tolerance", type=float, help="fail when a step's relative difference exceeds it")
    ap.add_argument("--torch-variants", default="",
                    help="comma-separated extra PyTorch runs that show its own spread: fp32, bf16, "
                         "jitter (from weights moved by 1e-6 relative, in the run's precision; jitter2, ...: "
                         "other random moves), init (from PyTorch's own draw of the weights, the "
                         "same scheme; init2, init3, ...: other seeds), bf16_residual (bf16 "
                         "autocast with the residual stream and its gradient rounded to bf16, as "
                         "our trainer stores them without train.fp32_residual), "
                         "bf16_norm_weights (the norms' weights read as bf16, as our norms' "
                         "backward reads them without train.fp32_residual; our forward reads fp32), "
                         "bf16_storage (both), math_attention "
                         "(attention by PyTorch's math kernel instead of its flash kernel: another "
                         "valid implementation of the same run), flash_attention, cudnn_attention, "
                         "efficient_attention (that SDPA backend forced), fp32_attention (attention "
                         "on fp32 copies of q, k and v, nothing rounded inside it, as ours' naive "
                         "kernel); a kernel variant with +jitterK (fp32_attention+jitter2) starts "
                         "from jitterK's weights")
    ap.add_argument("--save-final", action="store_true",
                    help="write each PyTorch run's final weights into the work folder, in our "
                         "arena's layout (final_pytorch_<run>.f32; ours' are its checkpoints, "
                         "WORK/ours/ckpt_*.bin): tools/dev/attention_accuracy.py --weights reads both")
    ap.add_argument("--ours-variant", action="append", default=[], metavar="K=V[,K=V]",
                    help="train ours once more with these overrides (same weights and batches); "
                         "repeatable")
    ap.add_argument("--ours-only", action="store_true",
                    help="train ours and the --ours-variant runs only, no PyTorch (their samples "
                         "pool with other jobs' PyTorch runs in tools/dev/spread_compare.py)")
    ap.add_argument("--no-same-start", action="store_true",
                    help="skip PyTorch from our weights: train ours and the --torch-variants only "
                         "(a study's LRs where only each trainer's own start is compared)")
    a = ap.parse_args()
    if a.no_same_start and not a.torch_variants:
        ap.error("--no-same-start needs --torch-variants (else PyTorch would not run)")
    if a.ours_only and (a.no_same_start or a.torch_variants):
        ap.error("--ours-only trains no PyTorch: drop --no-same-start and --torch-variants")
    if a.no_same_start and a.ours_variant:
        ap.error("--no-same-start compares PyTorch's own starts with ours only: drop --ours-variant")
    if a.device == "cuda" and not torch.cuda.is_available() and not a.ours_only:
        print("skip: no CUDA device for PyTorch here")
        sys.exit(77)
    for v in filter(None, a.torch_variants.split(",")):
        if variant_error(v):
            ap.error(f"--torch-variants: {variant_error(v)}")
    if a.save_final and not a.work:
        ap.error("--save-final writes into the work folder: give --work")
    work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="zgpt_parity_"))
    work.mkdir(parents=True, exist_ok=True)
    sets = []
    for kv in a.set + [f"train.max_steps={a.steps}", f"train.device={a.device}"]:
        sets += ["--set", kv]
    run([f"{a.bin}/parity_inputs", "-c", a.config, *sets, "--steps", str(a.steps), "-o", str(work / "inputs")])
    runj = json.loads((work / "inputs/run.json").read_text())
    tr = runj["train"]
    arena = np.fromfile(work / "inputs/init.f32", dtype=np.float32)
    assert arena.size == runj["num_parameters"], "init.f32 does not match the parameter table"
    batches = np.fromfile(work / "inputs/batches.i32", dtype=np.int32).reshape(
        a.steps, tr["grad_accum"], 2, tr["batch_size"], tr["seq_len"])

    # Ours: the same config and overrides, no evaluation or sampling in between.
    ours_sets = sets + ["--set", "train.eval_every=0", "--set", "train.sample_every=0", "--set", "data.val=",
                        "--set", f"train.out_dir={work}"]

    # the statistics compared step by step; the gradient norm (before clipping) is recorded beside
    # them, for how hard each trainer's clipping bites, but not held to the tolerance
    stat_keys = ("lse_mean", "lse_sq_mean", "max_logit")
    recorded = stat_keys + ("grad_norm",)

    def train_ours(name, extra):
        shutil.rmtree(work / name, ignore_errors=True)  # a run directory is appended to, never reset
        run([f"{a.bin}/train", "-c", a.config, *ours_sets, "--set", f"train.run_name={name}", *extra])
        recs = [json.loads(l) for l in open(work / name / "metrics.jsonl") if '"loss"' in l]
        return [r["loss"] for r in recs], [{k: r[k] for k in recorded} for r in recs]

    ours, ours_stats = train_ours("ours", [])
    ours_variants = {}
    for v in a.ours_variant:  # the same weights and batches, other settings of ours
        extra = [x for kv in filter(None, v.split(",")) for x in ("--set", kv)]
        ours_variants[v] = train_ours(f"ours_{len(ours_variants) + 1}", extra)
        if a.ours_only:
            print(f"ours with {v}: last loss {ours_variants[v][0][-1]:.4f}; ours {ours[-1]:.4f}", flush=True)
            ours_alone(a, runj, ours, ours_stats, ours_variants)

    if a.ours_only:
        ours_alone(a, runj, ours, ours_stats, ours_variants)
        return
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if a.no_same_start:
        own_starts(a, runj, arena, batches, ours, ours_stats)
        return
    torch.manual_seed(0)
    theirs, theirs_stats = train_torch(runj, arena, batches, a.device, tr["precision"], a.steps,
                                       final_weights(a, "plain"))
    assert len(ours) == len(theirs) == a.steps, (len(ours), len(theirs))

    rel = [abs(x - y) / abs(y) for x, y in zip(ours, theirs)]
    w = min(100, a.steps)
    window = lambda c: window_means(c, w)
    means = list(zip(window(ours), window(theirs)))
    max_gap = max(abs(x - y) for x, y in means)
    gap = lambda c, d: max(abs(x - y) for x, y in zip(window(c), window(d)))
    variants = {}
    for v, (c, c_stats) in torch_variants(a, runj, arena, batches).items():
        variants[v] = {"losses": c, "means": window(c), "max_gap_vs_pytorch": gap(c, theirs),
                       "max_gap_vs_ours": gap(c, ours), "stats": c_stats}
        print(f"PyTorch {v}: {w}-step means differ from PyTorch {tr['precision']} by at most "
              f"{gap(c, theirs):.4f}, from ours by at most {gap(c, ours):.4f}")
    # PyTorch's own spread in each window: how far its jittered runs move from it; ours is inside
    # where it is no farther from PyTorch than the farthest of them
    jit = [c["means"] for v, c in variants.items() if v.startswith("jitter")]
    spread = []
    if jit:
        for i, (o, p) in enumerate(means):
            sp = max(abs(j[i] - p) for j in jit)
            spread.append({"pytorch_spread": sp, "ours_gap": abs(o - p), "inside": abs(o - p) <= sp})
        print(f"{len(jit)} jittered PyTorch runs; per {w}-step window, |ours - PyTorch| against "
              "PyTorch's own spread: " + ", ".join(
                  f"{x['ours_gap']:.4f}/{x['pytorch_spread']:.4f}{'' if x['inside'] else ' (outside)'}"
                  for x in spread))
    for v, (c, c_stats) in ours_variants.items():
        ours_variants[v] = {"losses": c, "stats": c_stats, "means": window(c),
                            "max_gap_vs_pytorch": gap(c, theirs), "max_gap_vs_ours": gap(c, ours)}
        print(f"ours with {v}: {w}-step means differ from PyTorch {tr['precision']} by at most "
              f"{gap(c, theirs):.4f}, from ours by at most {gap(c, ours):.4f}")
    # Both trainers from jittered starts (ours: --ours-variant model.init_jitter=1e-6,
    # model.init_jitter_seed=K; PyTorch: jitterK): the two samples' means per window, and their
    # difference in standard errors (Welch), which says whether the trainers differ beyond chaos
    ours_j = [window(ours)]
    for v, c in ours_variants.items():  # a start that repeats another's curve counts once
        if not settings_of(v) and c["means"] not in ours_j:
            ours_j.append(c["means"])
    torch_j = [window(theirs)] + jit
    two_sample = []
    if len(ours_j) >= 3 and len(torch_j) >= 3:
        for i in range(len(means)):
            two_sample.append(welch([x[i] for x in ours_j], [x[i] for x in torch_j]))
        print(f"{len(ours_j)} runs of ours and {len(torch_j)} of PyTorch from jittered starts; per "
              f"{w}-step window, mean difference (standard errors): " + ", ".join(
                  f"{x['difference']:+.4f} ({x['standard_errors']:+.1f})" for x in two_sample))
    print(f"{'step':>6} {'ours':>12} {'pytorch':>12} {'rel diff':>10}")
    for i, (x, y, r) in enumerate(zip(ours, theirs, rel)):
        if a.steps <= 40 or i % max(1, a.steps // 40) == 0 or i == a.steps - 1:
            print(f"{i + 1:6d} {x:12.6f} {y:12.6f} {r:10.2e}")
    print(f"{a.steps} steps, {tr['precision']} on {a.device}: largest relative difference {max(rel):.2e}; "
          f"{w}-step means differ by at most {max_gap:.4f}")
    # the log Z statistics and the largest logit, step by step (what a z-loss comparison reads)
    stat_rel = {k: max(abs(x[k] - y[k]) / max(abs(y[k]), 1e-30) for x, y in zip(ours_stats, theirs_stats))
                for k in stat_keys}
    stat_means = {k: list(zip(window([x[k] for x in ours_stats]), window([y[k] for y in theirs_stats])))
                  for k in stat_keys}
    print("largest relative differences: " + ", ".join(f"{k} {v:.2e}" for k, v in stat_rel.items()))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(dict(run_record(a, runj), **{
            "window": w, "max_gap": max_gap, "max_rel_diff": max(rel),
            "means": means, "ours": ours, "pytorch": theirs, "pytorch_variants": variants,
            "ours_variants": ours_variants, "spread": spread, "two_sample": two_sample,
            "ours_stats": ours_stats, "pytorch_stats": theirs_stats,
            "stats_max_rel_diff": stat_rel, "stats_means": stat_means}), indent=1))
    if a.tolerance is not None and max(rel) > a.tolerance:
        print(f"FAIL: a step differs by {max(rel):.2e} > {a.tolerance:g}")
        sys.exit(1)
    # lse's mean and square within the same bound; the largest logit too where it is not rounded to
    # bf16 on our side
    checked = stat_keys if tr["precision"] == "fp32" else ()
    if a.tolerance is not None and any(stat_rel[k] > a.tolerance for k in checked):
        print(f"FAIL: a step's log Z statistics differ by more than {a.tolerance:g}: {stat_rel}")
        sys.exit(1)


if __name__ == "__main__":
    main()
