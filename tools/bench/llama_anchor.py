#!/usr/bin/env python3
"""The Llama speed anchor: Hugging Face's LlamaForCausalLM, built to the shape of one of our
Llama-style configs (configs/llama-124m.yaml), trained by a plain PyTorch loop the way
bench_train times ours. Run it in the same GPU call as `bench_train -c` the same config
(tools/gpu/llama_bench.sh).

    python3 tools/bench/llama_anchor.py -c configs/llama-124m.yaml [--set k=v ...] \
        [--steps 30] [--from 10] [--device cuda|cpu] [--no-compile] [--out anchor.json]

The model: n_layer, n_head, n_kv_head, n_embd, block_size, the MLP width (docs/llama.md's rule),
rope_theta, ln_eps, bias (attention_bias and mlp_bias), tie_embeddings, and the vocabulary padded
to a multiple of 128 rows as our trainer pads it; attn_implementation "sdpa", fp32 weights.
Only Llama's block maps: model.norm rmsnorm, position rope, mlp swiglu and no qk_norm, else it
stops naming the key. Hugging Face's own initialisation (the weights do not change the speed).

The loop, as bench_train's step: zero_grad; per micro-batch, forward + cross-entropy (+ z-loss when
loss.z_loss_weight is set) over the padded vocabulary + backward, with torch.compile over the model
and its loss together (as llm.c's train_gpt2.py, whose model returns the loss) and bf16 autocast
(train.precision bf16); global-norm clipping (optim.grad_clip); torch.optim.AdamW(fused=True) with
our optim settings, weight decay on the matrices only, at the constant optim.lr (bench_train has no
schedule either); then a device sync. The tokens are bench_train's own: train.seed's splitmix64
stream (kernels/core/rng.cpp), one row of B T + 1 tokens per micro-batch, uniform below
model.vocab_size, drawn before the clock starts and copied to the device inside the step.

Steps --from..--steps are timed, as bench_train's (1-based, both ends included). Prints each
step, then one line with the median tokens/s of those steps (the mean too: bench_train reports
the mean) and the peak memory; --out writes the same as JSON.
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
import yaml

# The defaults of the keys read here (model/gpt_config.h, train/config.h); a config file holds
# only overrides.
DEFAULTS = {
    "model": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=0,
                  tie_embeddings=True, bias=True, qk_norm=False, init_std=0.02, ln_eps=1e-5,
                  norm="layernorm", position="learned", rope_theta=10000.0, mlp="gelu",
                  mlp_hidden=0, mlp_multiple_of=256, n_kv_head=0),
    "train": dict(batch_size=8, seq_len=0, grad_accum=1, seed=1337, precision="bf16"),
    "optim": dict(lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0),
    "loss": dict(z_loss_weight=0.0),
}


def typed(section, key, value, where):
    """value as the type of the key's default (PyYAML reads 1e-4 as a string, yaml-cpp as a
    number); keys this tool does not read stay as they are."""
    default = DEFAULTS.get(section, {}).get(key)
    try:
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError
            return value
        if isinstance(default, int):
            f = float(value)
            if f != int(f):
                raise ValueError
            return int(f)
        if isinstance(default, float):
            return float(value)
    except (TypeError, ValueError):
        raise SystemExit(f"{where}: {section}.{key}: {value!r} is not a {type(default).__name__}")
    return value


def load_config(path, overrides):
    """The config's sections over DEFAULTS, then `section.key=value` overrides (values as YAML)."""
    cfg = {s: dict(d) for s, d in DEFAULTS.items()}
    with open(path) as f:
        for section, keys in (yaml.safe_load(f) or {}).items():
            for key, value in (keys or {}).items():
                cfg.setdefault(section, {})[key] = typed(section, key, value, path)
    for kv in overrides:
        key, sep, value = kv.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise SystemExit(f"--set {kv}: expected section.key=value")
        value = yaml.safe_load(value) if value else ""
        cfg.setdefault(section, {})[name] = typed(section, name, value, f"--set {kv}")
    return cfg


def mlp_hidden(m):  # model/parameters.cpp mlp_hidden_size
    if m["mlp_hidden"] > 0:
        return m["mlp_hidden"]
    h, k = 2 * 4 * m["n_embd"] // 3, m["mlp_multiple_of"]
    return (h + k - 1) // k * k


def padded_vocab(v):  # model/parameters.cpp padded_vocab_size: the rows our tables hold
    return (v + 127) // 128 * 128


def llama_config(m):
    """transformers.LlamaConfig of our model section; stops on an option Llama does not have."""
    from transformers import LlamaConfig

    for key, want in (("norm", "rmsnorm"), ("position", "rope"), ("mlp", "swiglu"), ("qk_norm", False)):
        if m[key] != want:
            raise SystemExit(f"model.{key}: {m[key]}: LlamaForCausalLM has only {want} there")
    if m["vocab_size"] <= 0:
        raise SystemExit("model.vocab_size must be set (the anchor reads no tokenizer.json)")
    return LlamaConfig(
        vocab_size=padded_vocab(m["vocab_size"]), hidden_size=m["n_embd"],
        intermediate_size=mlp_hidden(m), num_hidden_layers=m["n_layer"],
        num_attention_heads=m["n_head"], num_key_value_heads=m["n_kv_head"] or m["n_head"],
        head_dim=m["n_embd"] // m["n_head"], max_position_embeddings=m["block_size"],
        rms_norm_eps=m["ln_eps"], rope_theta=float(m["rope_theta"]), attention_bias=m["bias"],
        mlp_bias=m["bias"], tie_word_embeddings=m["tie_embeddings"], hidden_act="silu",
        initializer_range=m["init_std"], attention_dropout=0.0, use_cache=False,
        attn_implementation="sdpa")  # a config keyword in transformers 4.x and 5.x alike


def our_parameter_count(m):
    """Our table's size for the same model (model/parameters.cpp's Llama layout)."""
    C, L, hs = m["n_embd"], m["n_layer"], m["n_embd"] // m["n_head"]
    KVC, H, b = (m["n_kv_head"] or m["n_head"]) * hs, mlp_hidden(m), int(m["bias"])
    layer = 2 * C + (C + 2 * KVC) * (C + b) + C * (C + b) + 2 * H * (C + b) + C * (H + b)
    embed = padded_vocab(m["vocab_size"]) * C
    return embed * (1 if m["tie_embeddings"] else 2) + L * layer + C


def check_model(model, m):
    """The built model is the shape we asked for, in the version of transformers at hand: our
    parameter count, tied or untied head, sdpa attention, rope_theta in its rotary frequencies."""
    n = sum(p.numel() for p in model.parameters())
    assert n == our_parameter_count(m), f"{n} parameters, ours {our_parameter_count(m)}"
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == m["tie_embeddings"], f"lm_head tied: {tied}"
    attn = model.config._attn_implementation
    assert attn == "sdpa", f"attention implementation {attn}"
    hs = m["n_embd"] // m["n_head"]
    inv = model.model.rotary_emb.inv_freq.double().cpu()
    want = float(m["rope_theta"]) ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    assert torch.allclose(inv, want, rtol=1e-6), "rotary frequencies are not rope_theta's"
    return n


class Tokens:
    """bench_train's random tokens: zgpt::Rng(train.seed).below(vocab) (splitmix64), vectorised."""

    GAMMA = np.uint64(0x9E3779B97F4A7C15)
    M1, M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)

    def __init__(self, seed, vocab):
        self.state, self.vocab = np.uint64(seed), np.uint64(vocab)

    def draw(self, n):
        with np.errstate(over="ignore"):  # the arithmetic is mod 2^64, as in C++
            z = self.state + np.arange(1, n + 1, dtype=np.uint64) * self.GAMMA
            self.state = z[-1]
            z = (z ^ (z >> np.uint64(30))) * self.M1
            z = (z ^ (z >> np.uint64(27))) * self.M2
            z ^= z >> np.uint64(31)
        return (z % self.vocab).astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", required=True, help="run config (YAML)")
    ap.add_argument("--set", action="append", default=[], help="section.key=value overrides")
    ap.add_argument("--steps", type=int, default=30, help="steps to run")
    ap.add_argument("--from", dest="first", type=int, default=10,
                    help="first step that is timed (earlier ones warm up and compile)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--no-compile", action="store_true", help="eager (a CPU smoke test)")
    ap.add_argument("--out", help="write the result as JSON here")
    a = ap.parse_args()
    if not 1 <= a.first <= a.steps:
        raise SystemExit("--from must be in [1, --steps]")
    import transformers
    from transformers import LlamaForCausalLM

    cfg = load_config(a.config, a.set)
    m, tr, o, z = cfg["model"], cfg["train"], cfg["optim"], cfg["loss"]["z_loss_weight"]
    B, A = tr["batch_size"], tr["grad_accum"]
    T = tr["seq_len"] or m["block_size"]
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    bf16 = tr["precision"] == "bf16"
    torch.set_float32_matmul_precision("high" if bf16 else "highest")  # fp32 runs: no TF32
    torch.manual_seed(tr["seed"])
    started = time.perf_counter()
    with dev:  # initialised on the device
        model = LlamaForCausalLM(llama_config(m))
    model.to(dtype=torch.float32).train()  # fp32 master weights, whatever the library's default
    n_params = check_model(model, m)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            fused=True)

    def loss_of(x, y):  # mean over the micro-batch's tokens; the padded rows stay in the softmax
        logits = model(input_ids=x, use_cache=False).logits.float()
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        if z > 0:
            loss = loss + z * torch.logsumexp(logits, dim=-1).square().mean()
        return loss

    fwd_loss = loss_of if a.no_compile else torch.compile(loss_of)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tokens = Tokens(tr["seed"], m["vocab_size"])
    step_ms, loss_val, first_step_s = [], float("nan"), 0.0
    for step in range(1, a.steps + 1):
        rows = [torch.from_numpy(tokens.draw(B * T + 1)) for _ in range(A)]
        if cuda:
            rows = [r.pin_memory() for r in rows]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for r in rows:
            r = r.to(dev, non_blocking=True)
            x, y = r[:-1].view(B, T), r[1:].view(B, T)
            with autocast:
                loss = fwd_loss(x, y)
            (loss / A).backward()
            total = total + loss.detach()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        loss_val = float(total) / A
        if step == 1:
            first_step_s = ms / 1e3
            print(f"start-up: {time.perf_counter() - started:.1f} s to the end of the first step "
                  f"(first step, compilation included, {first_step_s:.1f} s)", flush=True)
        if step >= a.first:
            step_ms.append(ms)
        print(f"step {step}: {ms:.2f} ms, loss {loss_val:.4f}", flush=True)

    tok = B * T * A
    median_tok_s = statistics.median(tok / (ms / 1e3) for ms in step_ms)
    mean_tok_s = tok / (statistics.mean(step_ms) / 1e3)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if cuda else None
    reserved_gb = torch.cuda.max_memory_reserved() / 1e9 if cuda else None
    name = torch.cuda.get_device_name() if cuda else "cpu"
    memory = (f"peak memory {peak_gb:.2f} GB (reserved {reserved_gb:.2f} GB)" if cuda
              else "peak memory n/a (cpu)")
    print(f"{name} | LlamaForCausalLM {n_params / 1e6:.1f}M | B={B} T={T} V={m['vocab_size']} "
          f"(padded {padded_vocab(m['vocab_size'])}) | transformers {transformers.__version__}, "
          f"torch {torch.__version__}")
    print(f"HF Llama {'torch.compile' if not a.no_compile else 'eager'} anchor tokens/s (median of steps "
          f"{a.first}-{a.steps}): {median_tok_s:.0f} | mean {mean_tok_s:.0f} | {memory}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({
                "device": name, "config": a.config, "overrides": a.set, "data": "random tokens",
                "batch": B, "seq_len": T, "grad_accum": A, "vocab_size": m["vocab_size"],
                "padded_vocab": padded_vocab(m["vocab_size"]), "precision": tr["precision"],
                "parameters": n_params, "mlp_hidden": mlp_hidden(m), "compile": not a.no_compile,
                "attn_implementation": model.config._attn_implementation,
                "steps": a.steps, "from": a.first, "step_ms": step_ms,
                "tok_per_s_median": median_tok_s, "tok_per_s_mean": mean_tok_s,
                "peak_memory_allocated_gb": peak_gb, "peak_memory_reserved_gb": reserved_gb,
                "first_step_s": first_step_s, "final_loss": loss_val,
                "torch": torch.__version__, "transformers": transformers.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
