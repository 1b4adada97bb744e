#!/usr/bin/env python3
"""Trains the configs/shakespeare-char-cpu.yaml recipe in PyTorch (fp32), as a cross-check of the
C++ trainer's result against an independent implementation of the same recipe.

The recipe is nanoGPT's CPU example: 4 layers, 4 heads, 128 channels, context 64, batch 12, 2000
steps, AdamW (0.9, 0.99), lr 1e-3 with 100 warmup steps and cosine decay to 1e-4, weight decay 0.1
on matrices, clip 1.0, no biases, tied embeddings, tanh GELU; windows drawn at random offsets with
replacement; validation = mean of 20 random batches. Reads the shards that tools/prepare_data wrote.

    python3 tools/dev/torch_recipe_check.py data/shards/shakespeare_char --seeds 0 1 2 --device cuda
"""
import argparse
import json
import math
import pathlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_shard(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520 and header[1] == 1, f"{path}: not a version-1 shard"
    return np.fromfile(path, dtype=np.uint16, offset=1024)[: header[2]].astype(np.int64)


class Block(nn.Module):
    def __init__(self, c, heads, bias, gelu):
        super().__init__()
        self.heads, self.gelu = heads, gelu
        self.ln1 = nn.LayerNorm(c, bias=bias)
        self.qkv = nn.Linear(c, 3 * c, bias=bias)
        self.proj = nn.Linear(c, c, bias=bias)
        self.ln2 = nn.LayerNorm(c, bias=bias)
        self.fc = nn.Linear(c, 4 * c, bias=bias)
        self.fc_proj = nn.Linear(4 * c, c, bias=bias)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate=self.gelu))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, layers, heads, c, bias=False, gelu="tanh"):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(ctx, c)
        self.blocks = nn.ModuleList(Block(c, heads, bias, gelu) for _ in range(layers))
        self.lnf = nn.LayerNorm(c, bias=bias)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # residual projections (attention and MLP outputs) get GPT-2's scaled init
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.lnf(x) @ self.wte.weight.t()  # tied LM head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shards", type=pathlib.Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--gelu", choices=["tanh", "none"], default="tanh", help="none: exact (erf) GELU")
    ap.add_argument("--bias", action="store_true", help="biases in linear layers and LayerNorms")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    train = torch.from_numpy(read_shard(args.shards / "train_000000.bin"))
    val = torch.from_numpy(read_shard(args.shards / "val_000000.bin"))
    vocab = json.loads((args.shards / "tokenizer.json").read_text())["vocab_size"]
    B, T, steps, warmup, lr, min_lr = 12, 64, 2000, 100, 1e-3, 1e-4
    results = []
    for seed in args.seeds:
        torch.manual_seed(seed)
        model = GPT(vocab, T, 4, 4, 128, args.bias, args.gelu).to(args.device)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        other = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.99))
        gen = torch.Generator().manual_seed(seed)

        def batch(data):
            ix = torch.randint(len(data) - T, (B,), generator=gen)
            x = torch.stack([data[i:i + T] for i in ix]).to(args.device)
            y = torch.stack([data[i + 1:i + 1 + T] for i in ix]).to(args.device)
            return x, y

        @torch.no_grad()
        def val_loss():
            model.eval()
            losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                      for x, y in (batch(val) for _ in range(20))]
            model.train()
            return sum(losses) / len(losses)

        curve = []
        for step in range(steps + 1):
            if step % 250 == 0:
                curve.append((step, val_loss()))
            if step == steps:
                break
            if step < warmup:
                cur = lr * (step + 1) / (warmup + 1)
            else:
                ratio = (step - warmup) / (steps - warmup)
                cur = min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)
            for g in opt.param_groups:
                g["lr"] = cur
            x, y = batch(train)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        results.append({"seed": seed, "val_curve": curve, "final_val": curve[-1][1]})
        print(f"seed {seed}: val loss at step {steps}: {curve[-1][1]:.4f}  curve {[round(v, 3) for _, v in curve]}",
              flush=True)
    finals = [r["final_val"] for r in results]
    print(f"mean final val over {len(finals)} seeds: {sum(finals) / len(finals):.4f} "
          f"(min {min(finals):.4f}, max {max(finals):.4f})")
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "device": args.device,
                                        "gelu": args.gelu, "bias": args.bias, "runs": results},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
