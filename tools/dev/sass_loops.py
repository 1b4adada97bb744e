#!/usr/bin/env python3
"""Static view of CUDA kernels without a GPU: registers and spills (ptxas -v), and each kernel's
hottest loop (the largest loop that holds a tensor-core instruction, else the largest loop) with
its instruction count and opcode mix, read from the machine code (nvdisasm).

    tools/dev/sass_loops.py kernels/attention/wgmma.cu                 # compiled for sm_90a
    tools/dev/sass_loops.py kernels/attention/wgmma.cu --kernel dkdv   # kernels whose name matches
    tools/dev/sass_loops.py some.cubin                                 # an existing cubin
    tools/dev/sass_loops.py kernels/loss_head/cross_entropy/fast.cu --inner 4   # per-element loops

Counts are static (each instruction once, every branch of the loop body included): a way to see
what a change does to the work per tile before a GPU is at hand (docs/cuda_trainer.md, "Attention
tile staging", used it), not a timing. It also prints ptxas's C75xx notes, such as wgmma
instructions serialized by the compiler.

nvdisasm comes with the CUDA toolkit; where the toolkit lacks it, the NVDISASM environment
variable or --nvdisasm names one (PyPI's nvidia-cuda-nvdisasm wheel holds it: pip download
nvidia-cuda-nvdisasm, unzip, nvidia/cu13/bin/nvdisasm). Exits 77 when there is no nvcc or
nvdisasm.
"""
import argparse
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TENSOR_OPS = ("HGMMA", "HMMA", "IMMA", "QGMMA")


def find_tool(name, given):
    for cand in (given, os.environ.get(name.upper())):
        if cand:
            return cand
    found = shutil.which(name)
    if found:
        return found
    cuda = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name
    return str(cuda) if cuda.is_file() else None


def compile_cubin(source, arch, nvcc, out):
    """The build's device flags for the sm_90a attention library (CMakeLists.txt)."""
    cmd = [nvcc, "-O3", "-DNDEBUG", f"-arch={arch}", "-cubin", "--expt-relaxed-constexpr",
           "-std=c++17", f"-I{ROOT}", "-Xptxas", "-v", "-o", str(out), str(source)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_loops: nvcc failed:\n{r.stderr}")
    return r.stderr


def ptxas_info(text):
    """{mangled kernel: (registers, spill stores, spill loads)} and the C75xx notes."""
    info, notes, current = {}, [], None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            info.setdefault(current, [0, 0, 0])[1:] = [int(m.group(1)), int(m.group(2))]
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            info.setdefault(current, [0, 0, 0])[0] = int(m.group(1))
        if re.search(r"\(C75\d\d\)", line):
            notes.append(line.split("ptxas info    : ")[-1].strip())
    return info, notes


def kernels(sass):
    """{mangled name: [instruction lines]} of a disassembled cubin."""
    parts = re.split(r"\n\s*\.text\.(\S+):", sass)
    return {parts[i]: parts[i + 1].split("\n") for i in range(1, len(parts), 2)}


OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def loop_spans(lines):
    """(first line, last line) of every backward-branch loop: a BRA to a label above it."""
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
    spans = []
    for j, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            spans.append((labels[m.group(1)], j))
    return spans


def opcodes(lines):
    return [o.group(1) for o in map(OPCODE.search, lines) if o]


def hottest_loop(lines):
    """The instructions of the largest backward-branch loop holding a tensor-core op, else of the
    largest loop; None when the kernel has no loop."""
    best, best_tc = None, False
    for lo, hi in loop_spans(lines):
        ops = opcodes(lines[lo:hi + 1])
        tc = any(op in TENSOR_OPS for op in ops)
        if (tc, len(ops)) > (best_tc, len(best or [])):
            best, best_tc = ops, tc
    return best


def innermost_loops(lines):
    """The instructions of every backward-branch loop that holds no other loop, largest first."""
    spans = loop_spans(lines)
    inner = [a for a in spans if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in spans)]
    return sorted((opcodes(lines[lo:hi + 1]) for lo, hi in inner), key=len, reverse=True)


def demangle(names):
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return r.stdout.split("\n") if r.returncode == 0 else names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", help="a .cu file (compiled here) or a .cubin")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--kernel", default="", help="only kernels whose name matches this regex")
    ap.add_argument("--top", type=int, default=12, help="opcodes listed per loop")
    ap.add_argument("--inner", type=int, default=0,
                    help="also list this many innermost loops (loops holding no other loop), "
                    "largest first: the per-element loops of a kernel")
    ap.add_argument("--nvdisasm")
    ap.add_argument("--nvcc")
    args = ap.parse_args()
    nvdisasm = find_tool("nvdisasm", args.nvdisasm)
    if not nvdisasm:
        print("sass_loops: SKIPPED: no nvdisasm (set NVDISASM or --nvdisasm; see --help)")
        sys.exit(77)
    src = pathlib.Path(args.input)
    info, notes = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        cubin = src
        if src.suffix != ".cubin":
            nvcc = find_tool("nvcc", args.nvcc)
            if not nvcc:
                print("sass_loops: SKIPPED: no nvcc")
                sys.exit(77)
            cubin = pathlib.Path(tmp) / "k.cubin"
            info, notes = ptxas_info(compile_cubin(src, args.arch, nvcc, cubin))
        r = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"sass_loops: nvdisasm failed: {r.stderr.strip()}")
    ks = kernels(r.stdout)
    names = sorted(ks)
    pretty = dict(zip(names, demangle(names)))
    shown = 0
    for name in names:
        if args.kernel and not re.search(args.kernel, pretty[name]):
            continue
        shown += 1
        ops = opcodes(ks[name])
        regs = info.get(name)
        head = f"{pretty[name][:110]}\n  {len(ops)} instructions"
        if regs:
            head += f", {regs[0]} registers, spills {regs[1]} B stored / {regs[2]} B loaded"
        print(head)
        loop = hottest_loop(ks[name])
        if loop:
            mix = collections.Counter(loop).most_common(args.top)
            print(f"  hottest loop: {len(loop)} instructions; "
                  + ", ".join(f"{op} {n}" for op, n in mix))
        else:
            print("  no loop")
        for k, body in enumerate(innermost_loops(ks[name])[:args.inner]):
            mix = collections.Counter(body).most_common(args.top)
            print(f"  innermost loop {k + 1}: {len(body)} instructions; "
                  + ", ".join(f"{op} {n}" for op, n in mix))
    if not shown:
        sys.exit(f"sass_loops: no kernel matches '{args.kernel}'")
    for n in notes:
        print("ptxas:", n)


if __name__ == "__main__":
    main()
