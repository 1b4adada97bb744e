#!/usr/bin/env python3
"""Checks that Hugging Face transformers loads a tools/export_hf directory and computes what zgpt
computes: the next-token logits after a prompt (from `sample --logits-out`) and the greedy
continuation (from `sample -k 1`). GPT-2 exports load as GPT2LMHeadModel, Llama-style ones as
LlamaForCausalLM (AutoModelForCausalLM reads config.json's model_type).

    python3 tools/dev/hf_check.py EXPORT_DIR --logits ours_logits.json --greedy ours.txt --tokenizer tokenizer.json
"""
import argparse
import json

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--logits", required=True)
    ap.add_argument("--greedy", required=True, help="text that `sample -k 1` printed")
    ap.add_argument("--tokenizer", required=True, help="the char tokenizer.json of the run")
    args = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.export_dir, torch_dtype=torch.float32).eval()
    ours = json.load(open(args.logits))
    ids = torch.tensor([ours["prompt_ids"]])
    with torch.no_grad():
        hf = model(ids).logits[0, -1].double()
    ref = torch.tensor(ours["logits"], dtype=torch.float64)
    err = (hf - ref).abs().max().item() / ref.abs().max().item()
    print(f"next-token logits: max |HF - zgpt| / max |zgpt| = {err:.2e}")
    chars = json.load(open(args.tokenizer))["chars"]
    text = open(args.greedy, encoding="utf-8").read().rstrip("\n")
    n_prompt = len(ours["prompt_ids"])
    # within the context length (our sampler slides its window past it; HF's models do not)
    context = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
    n_new = min(len(text) - sum(len(chars[i]) for i in ours["prompt_ids"]), context - n_prompt)
    text = text[: sum(len(chars[i]) for i in ours["prompt_ids"]) + n_new]  # char vocab: 1 char each
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n_new, do_sample=False, pad_token_id=0)[0].tolist()
    hf_text = "".join(chars[i] for i in out)
    same = hf_text == text
    print(f"greedy continuation of {n_new} tokens identical: {same}")
    if not same:
        print("zgpt:", repr(text))
        print("HF:  ", repr(hf_text))
    ok = err < 1e-4 and same
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
