#!/usr/bin/env python3
"""No include cycle: reads every `#include "..."` of the C++ and CUDA sources and fails when
- two modules include each other, directly or through others (a module is a file name without its
  extension: kernels/ops/gelu.{h,cuh,cpp,cu} are one module, so a .cpp that includes a header
  whose .cpp includes the first one's header is a cycle; a private X_impl.h, the definition of
  X's hidden implementation, belongs to module X), or
- two folders of one parent do, counting every file under each (kernels/gemm/ and
  kernels/attention/; train/dist/ and train/backends/; kernels/ and model/).

    python3 tests/include_cycles.py [ROOT]     # prints "include cycles: none" or each cycle
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(__file__, "..", ".."))
FOLDERS = ["kernels", "model", "data", "train", "tools", "tests"]
SOURCE = (".h", ".cuh", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources():
    for top in FOLDERS:
        for d, _, names in os.walk(os.path.join(ROOT, top)):
            for n in names:
                if n.endswith(SOURCE):
                    yield os.path.relpath(os.path.join(d, n), ROOT)


def edges():
    """(file, included file) for every include of a file in the tree, by its path from ROOT."""
    for f in sources():
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            for inc in INCLUDE.findall(fh.read()):
                for target in (inc, os.path.join(os.path.dirname(f), inc)):
                    if os.path.isfile(os.path.join(ROOT, target)):
                        yield f, os.path.normpath(target)
                        break


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    component.append(n)
                    if n == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def module(path):
    stem = os.path.splitext(path)[0]
    return stem[: -len("_impl")] if stem.endswith("_impl") else stem


def folder_pairs(a, b):
    """The two sibling folders that separate files a and b (None when one folder holds both, or
    when one file sits directly in the other's parent folder: train/trainer.cpp may use
    train/dist/)."""
    pa, pb = a.split("/")[:-1], b.split("/")[:-1]
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    if k == len(pa) or k == len(pb):
        return None
    return "/".join(pa[: k + 1]), "/".join(pb[: k + 1])


def main():
    modules, folders = {}, {}
    for a, b in edges():
        if module(a) != module(b):
            modules.setdefault(module(a), set()).add(module(b))
        pair = folder_pairs(a, b)
        if pair:
            folders.setdefault(pair[0], set()).add(pair[1])
    found = [("modules", c) for c in cycles(modules)] + [("folders", c) for c in cycles(folders)]
    for kind, c in found:
        print(f"include cycle between {kind}: " + ", ".join(c))
    if found:
        return 1
    print(f"include cycles: none ({len(modules)} modules, {len(folders)} folders with includes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
