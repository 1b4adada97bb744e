#!/usr/bin/env python3
"""Each op of a bench_train --ops step against its floor: GEMMs and attention at a matmul rate,
the memory-bound ops at a copy rate (both measured on the GPU, given here). Reads bench_train's
JSON files (one per model size) and prints a Markdown table; --json adds the rows to a file.

  python3 tools/bench/op_floors.py ours_124m.json ours_1558m.json [--tflops 760] [--tbps 4.24]

Floors (per step, B x T tokens, L layers, C channels, padded vocabulary Vp, P parameters):
  matmul fwd (qkv)         2 x 3 BT C^2 L FLOPs      matmul fwd (fc + GELU)  2 x 4 BT C^2 L
  matmul fwd (proj, fcproj) 2 x 5 BT C^2 L            matmul bwd dinp, dW     2 x 12 BT C^2 L each
  head matmuls              2 BT C Vp each             attention fwd           2 B T (T + 1) C L
  attention bwd             2.5 x the forward          layernorm bwd           8 BT C bytes a call, 2L + 1 calls
  residual + layernorm fwd  4 BT C bytes a call (the residual is added in the GEMM epilogue:
                            one bf16 read, one write), 2L calls
  adamw                     30 P bytes (read weights, gradients, moments; write them and the bf16 copy)
  gradient norm             4 P bytes            cross-entropy  4 BT Vp bytes (read and write bf16 logits)
Ops not listed (encoder, bias sums) have no floor here.
"""
import argparse
import json
import re
import sys

SIZES = {  # config file -> (layers, channels)
    "gpt2-124m": (12, 768),
    "gpt2-350m": (24, 1024),
    "gpt2-774m": (36, 1280),
    "gpt2-1558m": (48, 1600),
}


def floors(L, C, B, T, Vp, P, tflops, tbps):
    BT = B * T
    mm = lambda flops: flops / (tflops * 1e12) * 1e3  # ms
    mem = lambda b: b / (tbps * 1e12) * 1e3
    att = 2 * B * T * (T + 1) * C * L
    return {
        "matmul fwd (qkv, qk_norm)": mm(2 * 3 * BT * C * C * L),
        "matmul fwd (fc + GELU)": mm(2 * 4 * BT * C * C * L),
        "matmul fwd": mm(2 * 5 * BT * C * C * L),
        "matmul bwd dinp": mm(2 * 12 * BT * C * C * L),
        "matmul bwd dW": mm(2 * 12 * BT * C * C * L),
        "head matmul fwd": mm(2 * BT * C * Vp),
        "head matmul bwd dinp": mm(2 * BT * C * Vp),
        "head matmul bwd dW": mm(2 * BT * C * Vp),
        "attention fwd": mm(att),
        "attention bwd": mm(2.5 * att),
        "layernorm bwd": mem(8 * BT * C * (2 * L + 1)),
        "residual + layernorm fwd": mem(4 * BT * C * 2 * L),
        "adamw": mem(30 * P),
        "gradient norm": mem(4 * P),
        "cross-entropy": mem(4 * BT * Vp),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--tflops", type=float, default=760, help="bf16 matmul rate (cuBLASLt 8192^3)")
    ap.add_argument("--tbps", type=float, default=4.24, help="device-to-device copy rate")
    ap.add_argument("--json", help="write the rows here as JSON")
    a = ap.parse_args()
    out = []
    for f in a.files:
        d = json.load(open(f))
        name = re.sub(r"\.yaml$", "", d["config"].split("/")[-1])
        if name not in SIZES:
            sys.exit(f"{f}: unknown model config {d['config']}")
        L, C = SIZES[name]
        B, T = d["batch"], d["seq_len"]
        Vp = (d["vocab_size"] + 127) // 128 * 128
        # parameters: 12 C^2 + 13 C a layer, wte (Vp x C, tied), wpe (T x C), ln_f
        P = L * (12 * C * C + 13 * C) + Vp * C + T * C + 2 * C
        fl = floors(L, C, B, T, Vp, P, a.tflops, a.tbps)
        rows = []
        for op in d["ops"]:
            f_ms = fl.get(op["op"])
            rows.append({"op": op["op"], "ms": round(op["ms"], 2),
                         "floor_ms": round(f_ms, 2) if f_ms else None,
                         "x_floor": round(op["ms"] / f_ms, 2) if f_ms else None})
        total_floor = sum(r["floor_ms"] or 0 for r in rows)
        total = sum(r["ms"] for r in rows)
        print(f"\n{name}, B={B}: {total:.1f} ms of ops, floors of the listed ops {total_floor:.1f} ms "
              f"(matmuls at {a.tflops:g} TFLOP/s, memory at {a.tbps:g} TB/s)\n")
        print("| op | ms | floor ms | x floor |\n| --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['op']} | {r['ms']} | {r['floor_ms'] if r['floor_ms'] is not None else '-'} | "
                  f"{r['x_floor'] if r['x_floor'] is not None else '-'} |")
        out.append({"model": name, "batch": B, "ops": rows, "ops_ms": round(total, 2),
                    "floors_ms": round(total_floor, 2)})
    if a.json:
        json.dump({"tflops": a.tflops, "tbps": a.tbps, "sizes": out}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
