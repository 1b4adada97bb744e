#!/usr/bin/env python3
"""The robustness corpus: generates bad inputs of every kind the tools read (configs, `--set`
overrides, token shards, checkpoints, tokenizer files, safetensors, sweep files, prepare_data's
options), runs the tool that reads each, and checks that it is refused cleanly:

- an exit status from 1 to 127 (no signal, no abort), within a time limit (no hang);
- a message with "error" that names the file (and the key, where there is one);
- no AddressSanitizer or UndefinedBehaviorSanitizer report (under tools/test_sanitizers.sh);
- every file that existed before the run unchanged (the good inputs, a finished run).

The corpus is generated here, from a small good run made first (its shards, tokenizer.json,
checkpoint and safetensors export), and mutated one defect at a time.

    python3 tools/dev/bad_inputs.py --bin build [--work DIR] [--kind config,shard,...] [-v]

Prints the counts by kind; exits 1 when any input is not refused cleanly.
"""
import argparse
import hashlib
import json
import os
import pathlib
import random
import shutil
import struct
import subprocess
import sys
import tempfile

SHARD_MAGIC = 20240520
SAME = object()


def shard_bytes(tokens, magic=SHARD_MAGIC, version=1, count=None):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    body = struct.pack(f"<{len(tokens)}{'H' if version == 1 else 'I'}", *tokens)
    return struct.pack("<256i", *hdr) + body


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class Checkpoint:
    """train/checkpoint.h's layout: magic, u32 version, u32 0, u64 header length, JSON header,
    params / m / v as fp32, u64 FNV-1a of everything before it."""

    def __init__(self, raw):
        self.magic, self.version, self.zero, hlen = struct.unpack_from("<8sIIQ", raw, 0)
        self.header = json.loads(raw[24:24 + hlen])
        self.data = bytearray(raw[24 + hlen:-8])

    def bytes(self, header=SAME, data=None):
        h = json.dumps(self.header if header is SAME else header).encode()
        body = struct.pack("<8sIIQ", self.magic, self.version, self.zero, len(h)) + h + \
            bytes(self.data if data is None else data)
        return body + struct.pack("<Q", fnv1a64(body))


def safetensors_bytes(header, data):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def gpt2_byte_chars():
    """OpenAI's bytes_to_unicode: the printable character that stands for each byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def read_safetensors(raw):
    (n,) = struct.unpack_from("<Q", raw, 0)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


class Case:
    def __init__(self, kind, name, argv, files=None, names=(), mkfifo=None, mkdir=None, absent=(),
                 symlink=None):
        self.kind, self.name, self.argv = kind, name, argv
        self.files = files or {}  # path -> bytes, written before the run
        self.names = names  # strings the message must contain (the file, the key)
        self.absent = absent  # strings it must not contain (a misleading reason)
        self.mkfifo, self.mkdir = mkfifo, mkdir
        self.symlink = symlink  # (link, target), made before the run


def snapshot(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_fifo():
            out[p] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build", help="folder with train, sample, sweep, ...")
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed after)")
    ap.add_argument("--kind", default="", help="comma-separated kinds to run (default: all)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per input")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every input's message")
    a = ap.parse_args()
    binp = pathlib.Path(a.bin).resolve()
    work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="zgpt_bad_inputs_")).resolve()
    shutil.rmtree(work, ignore_errors=True)
    good, bad = work / "good", work / "bad"
    good.mkdir(parents=True)
    bad.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def tool(name, *args, check=True):
        r = subprocess.run([str(binp / name), *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=300, errors="replace")
        if check and r.returncode != 0:
            sys.exit(f"the good run failed: {name} {' '.join(map(str, args))}\n{r.stdout}{r.stderr}")
        return r

    # --- the good inputs: a char-level text, its shards, a 2-step run, its export ---
    rng = random.Random(7)
    words = ["the", "king", "said", "unto", "them", "and", "lo", "a", "voice", "of", "many", "waters"]
    text = "".join(" ".join(rng.choice(words) for _ in range(12)) + ".\n" for _ in range(400))
    (good / "text.txt").write_text(text)
    tool("prepare_data", "--input", good / "text.txt", "--out", good / "shards")
    vocab = json.loads((good / "shards/tokenizer.json").read_text())["vocab_size"]
    runs = work / "runs"
    base = (f"model: {{n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, vocab_size: {vocab}}}\n"
            f"data: {{train: {good}/shards/train_*.bin, val: ''}}\n"
            f"train: {{batch_size: 2, max_steps: 2, eval_every: 0, checkpoint_every: 2, threads: 1, "
            f"device: cpu, out_dir: {runs}, run_name: good}}\n")
    (good / "base.yaml").write_text(base)
    tool("train", "-c", good / "base.yaml")
    ckpt = runs / "good/checkpoints/ckpt_2.bin"
    tool("export_hf", "--checkpoint", ckpt, "-o", good / "hf")
    st_header, st_data = read_safetensors((good / "hf/model.safetensors").read_bytes())
    ck = Checkpoint(ckpt.read_bytes())
    tok = json.loads((good / "shards/tokenizer.json").read_text())

    cases = []

    # --- configs: each file a defect of its own; train must name the file (and the key) ---
    def config(name, body, *names, run_name=True):
        p = bad / "config" / f"{name}.yaml"
        argv = ["train", "-c", p] + (["--set", f"train.run_name=c_{name}"] if run_name else [])
        cases.append(Case("config", name, argv, {p: body if isinstance(body, bytes) else body.encode()},
                          (p.name, *names)))
    lines = base.splitlines(keepends=True)
    config("unclosed_flow_map", "model: {n_layer: 1\n")
    config("tab_indent", "model:\n\tn_layer: 1\n")
    config("second_document", base + "---\nmodel: {n_layer: 2}\n")
    config("duplicate_section", base + "model: {n_layer: 2}\n", "model")
    config("duplicate_key", base.replace("n_layer: 1,", "n_layer: 1, n_layer: 2,"), "n_layer")
    config("non_scalar_key", base + "optim: {[lr]: 1}\n")
    config("deep_nesting", base + "optim: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n")
    config("invalid_utf8", base.encode() + b"loss: {ignore_index: 3}\ntrain: {}\n".replace(
        b"train: {}", b"data: {val: \"\xff\xfe\"}"), "val")
    config("unknown_section", base + "modle: {n_layer: 2}\n", "modle")
    config("unknown_key", base + "optim: {learning_rate: 1}\n", "learning_rate")
    config("string_for_int", base.replace("n_layer: 1", "n_layer: two"), "n_layer")
    config("float_for_int", base.replace("n_layer: 1", "n_layer: 1.5"), "n_layer")
    config("list_for_scalar", base.replace("n_layer: 1", "n_layer: [1]"), "n_layer")
    config("map_for_scalar", base + "optim: {lr: {a: 1}}\n", "lr")
    config("int_above_2_63", base.replace("max_steps: 2", "max_steps: 99999999999999999999"), "max_steps")
    config("int_above_2_31", base.replace("n_layer: 1", "n_layer: 4294967296"), "n_layer")
    config("negative_batch", base.replace("batch_size: 2", "batch_size: -1"), "batch_size")
    config("nan_lr", base + "optim: {lr: .nan}\n", "lr")
    config("inf_lr", base + "optim: {lr: .inf}\n", "lr")
    config("zero_channels", base.replace("n_embd: 16", "n_embd: 0"), "n_embd")
    config("heads_not_dividing", base.replace("n_head: 2", "n_head: 3"), "n_head")
    config("run_name_dotdot", "".join(lines[:2]) + lines[2].replace("run_name: good", "run_name: '..'"),
           "run_name", run_name=False)
    config("run_name_slash", "".join(lines[:2]) + lines[2].replace("run_name: good", "run_name: a/b"),
           "run_name", run_name=False)
    config("unknown_kernel", base + "kernels: {attention: bogus}\n", "bogus")
    config("glob_matches_nothing", base.replace("train_*.bin", "nothing_*.bin"), "nothing_*.bin",
           "data.train")
    config("glob_matches_nothing_auto_vocab",
           base.replace("train_*.bin", "nothing_*.bin").replace(f"vocab_size: {vocab}", "vocab_size: 0"),
           "nothing_*.bin", "data.train")
    config("top_level_list", "- model\n- data\n")
    config("section_scalar", base + "optim: 3\n", "optim")
    config("binary_garbage", bytes(rng.randrange(256) for _ in range(4000)))
    config("bool_for_int", base.replace("n_layer: 1", "n_layer: true"), "n_layer")
    config("string_for_bool", base.replace("vocab_size:", "tie_embeddings: maybe, vocab_size:"),
           "tie_embeddings")
    for name, how in [("fifo", "fifo"), ("dev_zero_link", "/dev/zero")]:  # no hang, no endless read
        p = bad / "config" / f"{name}.yaml"
        cases.append(Case("config", name, ["train", "-c", p], names=(p.name,),
                          mkfifo=p if how == "fifo" else None,
                          symlink=None if how == "fifo" else (p, pathlib.Path(how))))
    # --set overrides: name the key
    for name, kv, key in [("set_no_equals", "model.n_layer", "model.n_layer"),
                          ("set_unknown_key", "model.n_layers=2", "n_layers"),
                          ("set_bad_value", "optim.lr=fast", "optim.lr"),
                          ("set_no_section", "lr=1", "lr"),
                          ("set_out_of_range", "optim.beta1=1.5", "beta1")]:
        cases.append(Case("set", name, ["train", "-c", good / "base.yaml", "--set", kv,
                                        "--set", f"train.run_name=s_{name}"], names=(key,)))

    # --- token shards: data.train names one bad file ---
    toks = [rng.randrange(vocab) for _ in range(3000)]

    def shard(name, body=None, fifo=False, directory=False):
        p = bad / "shard" / name / "train_000.bin"
        c = Case("shard", name, ["train", "-c", good / "base.yaml", "--set", f"data.train={p}",
                                 "--set", f"train.run_name=d_{name}"],
                 {p: body} if body is not None else {}, (p.name,),
                 mkfifo=p if fifo else None, mkdir=p if directory else None)
        cases.append(c)
    shard("bad_magic", shard_bytes(toks, magic=12345))
    shard("bad_version", shard_bytes(toks, version=1)[:4] + struct.pack("<i", 7) + shard_bytes(toks)[8:])
    shard("truncated_header", shard_bytes(toks)[:100])
    shard("count_beyond_file", shard_bytes(toks, count=10 ** 6))
    shard("negative_count", shard_bytes(toks, count=-5))
    shard("token_beyond_vocab", shard_bytes(toks[:-1] + [vocab + 100]))
    shard("empty_file", b"")
    shard("odd_trailing_byte", shard_bytes(toks) + b"\x01")
    shard("too_few_tokens", shard_bytes(toks[:5]))
    shard("directory", directory=True)
    shard("fifo", fifo=True)

    # --- checkpoints: sample and export_hf name the file ---
    raw = ckpt.read_bytes()
    n_params = len(ck.data) // 12  # params, m, v

    def checkpoint(name, body=None, fifo=False, directory=False, link=None):
        p = bad / "checkpoint" / name / "ckpt_2.bin"
        for t, args in [("sample", ["--checkpoint", p, "-n", "4"]),
                        ("export_hf", ["--checkpoint", p, "-o", bad / "checkpoint" / name / "hf"])]:
            cases.append(Case("checkpoint", f"{name} ({t})", [t, *args],
                              {p: body} if body is not None else {}, (p.name,),
                              mkfifo=p if fifo else None, mkdir=p if directory else None,
                              symlink=(p, pathlib.Path(link)) if link else None))
    checkpoint("empty", b"")
    checkpoint("random_bytes", bytes(rng.randrange(256) for _ in range(len(raw))))
    checkpoint("truncated_half", raw[:len(raw) // 2])
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x10
    checkpoint("bit_flip", bytes(flipped))
    checkpoint("junk_appended", raw + b"junk")
    checkpoint("header_length_huge", raw[:16] + struct.pack("<Q", 1 << 60) + raw[24:])
    checkpoint("other_version", raw[:8] + struct.pack("<I", 99) + raw[12:])
    nan_data = bytearray(ck.data)
    nan_data[0:4] = struct.pack("<f", float("nan"))
    checkpoint("nan_weight", ck.bytes(data=nan_data))
    inf_data = bytearray(ck.data)
    inf_data[4 * (n_params - 1):4 * n_params] = struct.pack("<f", float("inf"))
    checkpoint("inf_weight", ck.bytes(data=inf_data))
    for field, value in [("step", -1), ("step", "two"), ("tokens", 1e300), ("config", 3)]:
        h = dict(ck.header)
        if field in h:
            h[field] = value
            checkpoint(f"header_{field}_{value}", ck.bytes(header=h))
    h = dict(ck.header)
    h.pop("step", None)
    checkpoint("header_missing_step", ck.bytes(header=h))
    checkpoint("short_data", ck.bytes(data=ck.data[:-400]))
    checkpoint("directory", directory=True)
    checkpoint("fifo", fifo=True)
    checkpoint("dev_zero_link", link="/dev/zero")
    # checksum-valid headers of the wrong shape, and integers written as floats
    checkpoint("header_array", ck.bytes(header=[1, 2]))
    checkpoint("header_null", ck.bytes(header=None))
    checkpoint("header_no_tensors", ck.bytes(header={k: v for k, v in ck.header.items() if k != "tensors"}))
    checkpoint("header_tensors_not_list", ck.bytes(header=dict(ck.header, tensors=7)))
    checkpoint("header_step_float", ck.bytes(header=dict(ck.header, step=ck.header["step"] + 0.5)))
    checkpoint("header_loader_batch_float", ck.bytes(header=dict(
        ck.header, loader=dict(ck.header["loader"], batch=ck.header["loader"]["batch"] + 0.5))))

    # --- tokenizer files: sample --tokenizer names the file ---
    def tokenizer(name, body):
        p = bad / "tokenizer" / name / "tokenizer.json"
        cases.append(Case("tokenizer", name, ["sample", "--checkpoint", ckpt, "--tokenizer", p, "-n", "4"],
                          {p: body if isinstance(body, bytes) else json.dumps(body).encode()}, (p.name,)))
    tokenizer("not_json", b"{chars: [a, b")
    tokenizer("array", [1, 2, 3])
    tokenizer("missing_type", {k: v for k, v in tok.items() if k != "type"})
    tokenizer("unknown_type", dict(tok, type="wordpiece"))
    tokenizer("chars_not_list", dict(tok, chars="abc"))
    tokenizer("chars_numbers", dict(tok, chars=list(range(len(tok["chars"])))))
    tokenizer("chars_two_letters", dict(tok, chars=["ab"] + tok["chars"][1:]))
    tokenizer("chars_duplicate", dict(tok, chars=sorted(tok["chars"][:-1] + [tok["chars"][0]])))
    tokenizer("chars_unsorted", dict(tok, chars=list(reversed(tok["chars"]))))
    tokenizer("chars_missing", {k: v for k, v in tok.items() if k != "chars"})
    tokenizer("vocab_smaller_than_model", dict(tok, chars=tok["chars"][:3], vocab_size=3))
    tokenizer("empty_file", b"")
    tokenizer("invalid_utf8", b'{"type": "char", "chars": ["\xff"]}')
    p = bad / "tokenizer" / "fifo" / "tokenizer.json"
    cases.append(Case("tokenizer", "fifo", ["sample", "--checkpoint", ckpt, "--tokenizer", p, "-n", "4"],
                      names=(p.name,), mkfifo=p))
    # train with model.vocab_size 0 reads tokenizer.json beside the shards
    p = bad / "tokenizer" / "fifo_beside_shards" / "tokenizer.json"
    cases.append(Case("tokenizer", "fifo_beside_shards (train)",
                      ["train", "-c", good / "base.yaml", "--set", "model.vocab_size=0", "--set",
                       f"data.train={p.parent}/train_*.bin", "--set", "train.run_name=t_fifo"],
                      {p.parent / "train_000000.bin": (good / "shards/train_000000.bin").read_bytes()},
                      (p.name,), mkfifo=p))

    # --- safetensors: model.init_from names the file ---
    def safetensors(name, body=None, fifo=False, directory=False, path=None, absent=()):
        p = path or bad / "safetensors" / name / "model.safetensors"
        # the message names the file, the key and the config that set it
        cases.append(Case("safetensors", name, ["train", "-c", good / "base.yaml", "--set",
                                                f"model.init_from={p}", "--set", f"train.run_name=h_{name}"],
                          {p: body} if body is not None else {}, (p.name, "model.init_from", "base.yaml"),
                          mkfifo=p if fifo else None, mkdir=p if directory else None, absent=absent))
    names = [k for k in st_header if k != "__metadata__"]
    first = names[0]

    def with_entry(name, **kw):
        h = json.loads(json.dumps(st_header))
        h[first].update(kw)
        return safetensors_bytes(h, st_data)
    raw_st = (good / "hf/model.safetensors").read_bytes()
    safetensors("empty", b"")
    safetensors("header_length_beyond_file", struct.pack("<Q", 1 << 40) + raw_st[8:])
    safetensors("header_not_json", struct.pack("<Q", 10) + b"not json!!" + st_data)
    safetensors("header_array", safetensors_bytes([1, 2], st_data))
    safetensors("huge_shape", with_entry("", shape=[2 ** 62, 2 ** 62]))
    safetensors("negative_shape", with_entry("", shape=[-1, 16]))
    safetensors("shape_of_strings", with_entry("", shape=["a"]))
    safetensors("float_offsets", with_entry("", data_offsets=[0.5, 64.5]))
    safetensors("negative_offsets", with_entry("", data_offsets=[-64, 0]))
    safetensors("offsets_beyond_data", with_entry("", data_offsets=[0, len(st_data) + 64]))
    e0 = st_header[names[1]]["data_offsets"]
    safetensors("overlapping_tensors", with_entry("", data_offsets=[e0[0], e0[0] + (
        st_header[first]["data_offsets"][1] - st_header[first]["data_offsets"][0])]))
    safetensors("wrong_dtype", with_entry("", dtype="F64"))
    safetensors("dtype_not_string", with_entry("", dtype=32))
    safetensors("missing_tensor", safetensors_bytes({k: v for k, v in st_header.items() if k != first},
                                                     st_data))
    safetensors("offsets_mismatch_shape", with_entry("", shape=[1]))
    nan_st = bytearray(st_data)
    o = st_header[first]["data_offsets"][0]
    nan_st[o:o + 4] = struct.pack("<f", float("nan"))
    safetensors("nan_weight", safetensors_bytes(st_header, bytes(nan_st)))
    safetensors("truncated_data", raw_st[:len(raw_st) - 100])
    # floats that truncate to the right shape and offsets
    shape0, off0 = st_header[first]["shape"], st_header[first]["data_offsets"]
    safetensors("float_shape_exact", with_entry("", shape=[shape0[0] + 0.5] + shape0[1:]))
    safetensors("float_offsets_exact", with_entry("", data_offsets=[off0[0] + 0.5, off0[1] + 0.5]))
    safetensors("fifo", fifo=True)
    safetensors("directory", directory=True, absent=("truncated",))
    safetensors("dev_zero", path=pathlib.Path("/dev/zero"))

    # --- sweep files: sweep --dry-run names the file ---
    def sweep(name, body, *extra):
        p = bad / "sweep" / f"{name}.yaml"
        cases.append(Case("sweep", name, ["sweep", "--dry-run", p], {p: body.encode()}, (p.name, *extra)))
    so = f"base: {good}/base.yaml\nout_dir: {work}/sweeps\n"
    sweep("not_a_map", "- a\n- b\n")
    sweep("missing_base", f"out_dir: {work}/sweeps\ngrid: {{optim.lr: [1]}}\n", "base")
    sweep("base_missing_file", f"base: {bad}/none.yaml\nout_dir: {work}/sweeps\n", "none.yaml")
    sweep("grid_not_a_map", so + "grid: [1, 2]\n", "grid")
    sweep("grid_value_not_list", so + "grid: {optim.lr: 3}\n", "optim.lr")
    sweep("grid_unknown_key", so + "grid: {optim.learning_rate: [1, 2]}\n", "learning_rate")
    sweep("grid_empty_list", so + "grid: {optim.lr: []}\n", "optim.lr")
    sweep("set_is_string", so + "set: optim.lr=1\n", "set")
    sweep("set_unknown_key", so + "set: [model.layers=3]\n", "layers")
    sweep("unknown_top_key", so + "grids: {}\n", "grids")
    sweep("bad_yaml", so + "grid: {optim.lr: [1, 2}\n")
    sweep("grid_value_nested_list", so + "grid: {data.val: [[a], b]}\n", "data.val")
    sweep("grid_value_map", so + "grid: {optim.lr: [{a: 1}]}\n", "optim.lr")
    p = bad / "sweep" / "fifo.yaml"
    cases.append(Case("sweep", "fifo", ["sweep", "--dry-run", p], names=(p.name,), mkfifo=p))
    p = bad / "sweep" / "gpus_huge.yaml"
    cases.append(Case("sweep", "gpus_huge", ["sweep", "--dry-run", "--gpus", "99999999999999999999", p],
                      {p: (so + "grid: {optim.lr: [1.0e-3]}\n").encode()}, ("--gpus", "99999999999999999999")))
    sweep("out_dir_is_file", f"base: {good}/base.yaml\nout_dir: {good}/base.yaml\ngrid: {{optim.lr: [1]}}\n",
          "base.yaml")

    # --- prepare_data's inputs and options ---
    def prepare(name, args, names=(), files=None, mkdir=None, fifo=None):
        cases.append(Case("prepare_data", name, ["prepare_data", *args], files, names, mkdir=mkdir,
                          mkfifo=fifo))
    pd = bad / "prepare_data"
    prepare("val_fraction_nan", ["--input", good / "text.txt", "--out", pd / "o1", "--val-fraction", "nan"],
            ("val-fraction",))
    prepare("input_directory", ["--input", pd / "dir.txt", "--out", pd / "o2"], ("dir.txt",), mkdir=pd / "dir.txt")
    prepare("input_missing", ["--input", pd / "none.txt", "--out", pd / "o3"], ("none.txt",))
    prepare("out_is_a_file", ["--input", good / "text.txt", "--out", good / "text.txt"], ("text.txt",))
    prepare("empty_input", ["--input", pd / "empty.txt", "--out", pd / "o4"], ("empty.txt",),
            files={pd / "empty.txt": b""})
    prepare("invalid_utf8_char", ["--input", pd / "bad.txt", "--out", pd / "o5"], ("bad.txt",),
            files={pd / "bad.txt": b"abc\xff\xfedef\n" * 50})
    prepare("gpt2_without_dir", ["--input", good / "text.txt", "--out", pd / "o6", "--tokenizer", "gpt2",
                                 "--gpt2-dir", pd / "nogpt2"], ("nogpt2",))
    cases.append(Case("prepare_data", "shard_tokens_zero",
                      ["prepare_data", "--input", good / "text.txt", "--out", pd / "o7", "--shard-tokens", "0"],
                      names=("shard-tokens",), absent=("e308", "0.000000")))
    prepare("shard_tokens_huge", ["--input", good / "text.txt", "--out", pd / "o8", "--shard-tokens", "1e20"],
            ("shard-tokens",))
    # GPT-2 tokenizer files (OpenAI's encoder.json and vocab.bpe), a small valid pair mutated
    u = gpt2_byte_chars()
    enc = {u[b]: b for b in range(256)}
    enc.update({"th": 256, "<|endoftext|>": 257})
    merges = b"#version: 0.2\nt h\n"

    def gpt2_files(name, encoder=None, vocab_bpe=merges, fifo=None):
        d = pd / "gpt2" / name
        files = {d / "vocab.bpe": vocab_bpe} if fifo != "vocab.bpe" else {}
        if fifo != "encoder.json":
            files[d / "encoder.json"] = json.dumps(encoder).encode()
        prepare(f"gpt2_{name}", ["--input", good / "text.txt", "--out", d / "out", "--tokenizer", "gpt2",
                                 "--gpt2-dir", d], (fifo or "encoder.json",), files=files,
                fifo=d / fifo if fifo else None)
    gpt2_files("duplicate_id", dict(enc, th=5))
    gpt2_files("id_above_2_32", dict(enc, th=2 ** 40 + 256))
    gpt2_files("id_float", dict(enc, th=256.5))
    gpt2_files("encoder_fifo", fifo="encoder.json")
    gpt2_files("vocab_bpe_fifo", enc, fifo="vocab.bpe")

    # --- the other tools' arguments: runs, outputs, prompts, BPE training ---
    def other(name, argv, names=(), files=None, mkdir=None):
        cases.append(Case("other_tools", name, argv, files, names, mkdir=mkdir))
    ot = bad / "other_tools"
    other("export_out_is_a_file", ["export_hf", "--checkpoint", ckpt, "-o", good / "text.txt"], ("text.txt",))
    other("sample_run_without_checkpoints", ["sample", "--run", ot / "empty_run", "-n", "4"], ("empty_run",),
          mkdir=ot / "empty_run")
    other("sample_run_missing", ["sample", "--run", ot / "no_run", "-n", "4"], ("no_run",))
    other("sample_prompt_outside_vocab", ["sample", "--checkpoint", ckpt, "-p", "QZX#", "-n", "4"], ("Q",))
    other("sample_prompt_outside_vocab_cjk", ["sample", "--checkpoint", ckpt, "-p", "\u4e2d", "-n", "4"],
          ("U+4E2D",))
    other("sample_logits_out_unwritable", ["sample", "--checkpoint", ckpt, "-n", "4", "--logits-out",
                                           ot / "no_dir" / "logits.json"], ("logits.json",))
    other("resume_without_config", ["train", "--resume", ot / "not_a_run"], ("not_a_run",), mkdir=ot / "not_a_run")
    other("resume_a_file", ["train", "--resume", good / "text.txt"], ("text.txt",))
    other("bpe_empty_input", ["train_bpe", "-i", ot / "empty.txt", "-o", ot / "bpe1", "-v", "300"], ("empty.txt",),
          files={ot / "empty.txt": b""})
    other("bpe_input_directory", ["train_bpe", "-i", ot / "dir_in", "-o", ot / "bpe2"], ("dir_in",),
          mkdir=ot / "dir_in")
    other("bpe_out_is_a_file", ["train_bpe", "-i", good / "text.txt", "-o", good / "text.txt", "-v", "300"],
          ("text.txt",))
    other("bpe_vocab_below_bytes", ["train_bpe", "-i", good / "text.txt", "-o", ot / "bpe3", "-v", "100"],
          ("vocab-size",))

    kinds = set(filter(None, a.kind.split(",")))
    cases = [c for c in cases if not kinds or c.kind in kinds]
    before = snapshot(good) | snapshot(runs)
    counts, failures = {}, []
    for c in cases:
        for p, body in c.files.items():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(body)
        if c.mkdir:
            c.mkdir.mkdir(parents=True, exist_ok=True)
        if c.symlink and not c.symlink[0].is_symlink():
            c.symlink[0].parent.mkdir(parents=True, exist_ok=True)
            c.symlink[0].symlink_to(c.symlink[1])
        if c.mkfifo:
            c.mkfifo.parent.mkdir(parents=True, exist_ok=True)
            if not c.mkfifo.exists():
                os.mkfifo(c.mkfifo)
        try:
            r = subprocess.run([str(binp / c.argv[0]), *map(str, c.argv[1:])], capture_output=True,
                               text=True, errors="replace", env=env, timeout=a.timeout)
            code, out = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            code, out = None, f"no answer within {a.timeout:g} s"
        why = []
        if code is None:
            why.append("hung")
        elif code == 0:
            why.append("accepted (exit 0)")
        elif code < 0 or code >= 128:
            why.append(f"crashed (exit {code})")
        if "AddressSanitizer" in out or "runtime error:" in out or "LeakSanitizer" in out:
            why.append("sanitizer report")
        if code is not None and "error" not in out.lower():
            why.append("no error message")
        missing = [n for n in c.names if n not in out]
        if code is not None and missing:
            why.append("the message does not name " + ", ".join(repr(n) for n in missing))
        misleading = [n for n in c.absent if n in out]
        if code is not None and misleading:
            why.append("the message says " + ", ".join(repr(n) for n in misleading))
        changed = [str(p) for p, h in before.items()
                   if not p.exists() or hashlib.sha256(p.read_bytes()).hexdigest() != h]
        if changed:
            why.append("changed " + ", ".join(changed))
            before = snapshot(good) | snapshot(runs)
        ok = not why
        counts.setdefault(c.kind, [0, 0])
        counts[c.kind][0] += 1
        counts[c.kind][1] += ok
        last = out.strip().splitlines()[-1] if out.strip() else ""
        if not ok:
            failures.append(f"{c.kind}/{c.name}: {'; '.join(why)}\n    {' '.join(map(str, c.argv))}\n    {last}")
        if a.verbose:
            print(f"{'ok  ' if ok else 'FAIL'} {c.kind}/{c.name}: {last[:200]}")
    print(f"{'kind':14s} {'inputs':>6s} {'clean':>6s}")
    for k, (n, good_n) in counts.items():
        print(f"{k:14s} {n:6d} {good_n:6d}")
    total = sum(n for n, _ in counts.values())
    print(f"{'all':14s} {total:6d} {total - len(failures):6d}")
    for f in failures:
        print("FAIL " + f)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
