#!/usr/bin/env python3
"""Writes the Llama-style whole-model oracles, llama_tiny*.safetensors, for tests/test_llama_oracle.

Tiny LlamaForCausalLM models from Hugging Face transformers in float64 on the CPU: RMSNorm, rotary
positions (rotate_half), SwiGLU, grouped-query attention. llama_tiny: 4 heads, 2 key/value heads,
no biases, untied LM head; llama_tiny_bias: one key/value head, biases, tied LM head. Each file
holds the parameters (`param.<Hugging Face name>`, drawn in float32 so
our float model loads them exactly), a batch (`input_ids`, `targets` with ignored tokens), and the
answers in float64: `logits`, `loss` = CE mean + z * mean lse^2 over the valid tokens, `ce` (the
CE mean), `z_loss` (z * mean lse^2), and the gradient of every parameter (`grad.<name>`). The header's metadata `config`
gives the shape and options.

transformers computes some steps in float32 whatever the model's dtype: RMSNorm casts its input to
float32, and the rotary embedding takes cos and sin in float32. Both are replaced here by the same
formulas in float64 (the float32 versions would be a 1e-7 noise floor under a 1e-6 comparison).
Attention runs through "sdpa", which keeps float64 (the "eager" path takes its softmax in float32).

Needs torch and transformers (PyPI), e.g. in a venv outside the repository:
    python3 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip install torch transformers
    /tmp/llama-venv/bin/python tools/dev/llama_oracle.py --out /tmp/oracles
    ZGPT_ORACLES=/tmp/oracles build/test_llama_oracle
The generated file is not committed.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

# llama_tiny: Llama's own choices; llama_tiny_bias: the other branches of the importer and the
# model (biases on every projection, the LM head tied to the embedding, one key/value head).
CASES = {
    "llama_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=32, vocab_size=97,
                       mlp_hidden=176, tie_embeddings=False, bias=False, rms_norm_eps=1e-5,
                       rope_theta=10000.0, z_loss_weight=1e-4, ignore_index=-100),
    "llama_tiny_bias": dict(n_layer=2, n_head=4, n_kv_head=1, n_embd=64, block_size=32,
                            vocab_size=97, mlp_hidden=96, tie_embeddings=True, bias=True,
                            rms_norm_eps=1e-6, rope_theta=500000.0, z_loss_weight=1e-3,
                            ignore_index=-100),
}
CFG = CASES["llama_tiny"]  # the case being made (rotary_f64 reads its head size and theta)


def rmsnorm_f64(self, x):
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


def rotary_f64(self, x, position_ids):
    hd = CFG["n_embd"] // CFG["n_head"]
    inv = 1.0 / (CFG["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = position_ids[:, :, None].to(torch.float64) * inv[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def main():
    global CFG
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the llama_tiny*.safetensors files")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    modeling_llama.LlamaRMSNorm.forward = rmsnorm_f64
    modeling_llama.LlamaRotaryEmbedding.forward = rotary_f64
    for i, (name, c) in enumerate(CASES.items()):
        CFG = c
        make(name, c, a.out, a.seed + i)


def make(name, c, out_dir, seed):
    torch.manual_seed(seed)
    hc = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["n_embd"],
                     intermediate_size=c["mlp_hidden"], num_hidden_layers=c["n_layer"],
                     num_attention_heads=c["n_head"], num_key_value_heads=c["n_kv_head"],
                     max_position_embeddings=c["block_size"], rms_norm_eps=c["rms_norm_eps"],
                     rope_theta=c["rope_theta"], tie_word_embeddings=c["tie_embeddings"],
                     attention_bias=c["bias"], mlp_bias=c["bias"], hidden_act="silu",
                     attn_implementation="sdpa")
    model = LlamaForCausalLM(hc)
    with torch.no_grad():  # float32 values (exact in float), larger than the default 0.02
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            else:
                p.copy_(0.15 * torch.randn(p.shape))
    model = model.to(torch.float64)
    model.train()  # no dropout in Llama; train() only for the autograd path
    B, T, V = 3, 17, c["vocab_size"]
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[0, 3] = targets[1, 0] = targets[2, 16] = targets[2, 5] = c["ignore_index"]
    logits = model(input_ids=ids).logits  # [B, T, V] float64
    flat, tgt = logits.reshape(-1, V), targets.reshape(-1)
    valid = tgt != c["ignore_index"]
    lse = torch.logsumexp(flat, dim=-1)
    picked = flat.gather(1, tgt.clamp(min=0)[:, None])[:, 0]
    n = valid.sum()
    ce = ((lse - picked) * valid).sum() / n
    zl = ((lse * lse) * valid).sum() / n
    loss = ce + c["z_loss_weight"] * zl
    loss.backward()
    out = {"input_ids": ids.to(torch.int64), "targets": targets.to(torch.int64),
           "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1),
           "ce": ce.detach().reshape(1), "z_loss": (c["z_loss_weight"] * zl).detach().reshape(1)}
    for pname, p in model.named_parameters():
        out["param." + pname] = p.detach().to(torch.float32).contiguous()
        out["grad." + pname] = p.grad.detach().contiguous()
    if c["tie_embeddings"]:  # named_parameters() lists the shared tensor once
        assert "param.lm_head.weight" not in out
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".safetensors")
    save_file(out, path, metadata={"config": json.dumps(c)})
    print(f"wrote {path}: loss {loss.item():.12f}, {sum(1 for _ in model.parameters())} tensors")


if __name__ == "__main__":
    main()
