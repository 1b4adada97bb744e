#!/usr/bin/env python3
"""Shows that moving CUDA code between files changed no kernel: compares each kernel (PTX .entry /
.func, and module-level variables) of one set of PTX files with the same kernel in another set,
by name, and, given cubins, each kernel's machine code (its .text section) too.

    tools/dev/ptx_compare.py --before old/*.ptx old/*.cubin --after new/*.ptx new/*.cubin

Make the files with the build's own nvcc flags plus `--keep --keep-dir DIR` (DIR/<name>.ptx and
DIR/<name>.sm_XX.cubin), before and after the move. Names are compared after normalising what
depends on the file rather than the code: the anonymous namespace's per-file name
(_GLOBAL__N__<hash>_<len>_<file>_<hash>, and nvcc's _INTERNAL_<hash>_... for static locals),
block labels numbered by the function's place in the module ($L__BB12_3), local depots and
comments. Everything else must be the same text (PTX) or the same bytes (cubin).

Prints one line per item (identical / differs / missing / added) and a summary; exits 1 on any
difference, missing or added item. (A cubin's .nv.shared section sizes are compared too, but a
change there is only a note: see cubin_items.) Items found in several files of one set (a
header's kernel compiled into several translation units) are noted, and each copy is compared.
"""
import argparse
import difflib
import re
import shutil
import struct
import subprocess
import sys
from collections import defaultdict

# <length><identifier> where the identifier is a per-file anonymous-namespace name
ANON_START = re.compile(r"(\d+)(_GLOBAL__N__|_INTERNAL_)")
ANON_IDENT = re.compile(r"(?:_GLOBAL__N__|_INTERNAL_)[0-9a-f]+_(\d+)_(.+)_[0-9a-f]+")
CANONICAL = {"_GLOBAL__N__": "12_GLOBAL__N_1", "_INTERNAL_": "10_INTERNAL_"}


def normalise_names(text):
    """Replaces each length-prefixed per-file anonymous namespace name with a fixed one (a valid
    mangled name, so c++filt still reads it: "(anonymous namespace)")."""
    out, pos = [], 0
    while True:
        m = ANON_START.search(text, pos)
        if not m:
            out.append(text[pos:])
            return "".join(out)
        digits, start = m.group(1), m.start(2)
        for k in range(1, len(digits) + 1):  # the length is a suffix of the digit run
            n = int(digits[-k:])
            ident = ANON_IDENT.fullmatch(text[start : start + n])
            if ident and len(ident.group(2)) == int(ident.group(1)):
                out.append(text[pos : m.start(1)] + digits[:-k] + CANONICAL[m.group(2)])
                pos = start + n
                break
        else:  # not an anonymous-namespace name after all
            out.append(text[pos : m.end()])
            pos = m.end()


def normalise_body(text):
    text = normalise_names(text)
    text = re.sub(r"\$L__BB\d+_(\d+)", r"$L__BB_\1", text)
    text = re.sub(r"__local_depot\d+", "__local_depot", text)
    lines = []
    for line in text.splitlines():
        line = line.split("//", 1)[0].rstrip()
        if line:
            lines.append(line)
    return lines


FUNC_START = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(entry|func)\b")
FUNC_NAME = re.compile(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$.%]*)")
VAR_DECL = re.compile(
    r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(?:global|shared|const)\b.*?([A-Za-z_$%][\w$.%]*)"
    r"\s*(?:\[[^\]]*\])*\s*(?:=.*)?;\s*$"
)


def ptx_items(path):
    """{(kind, name): [body lines]} of one PTX file: 'entry' / 'func' bodies (prototypes are
    skipped), 'var' module-level declarations, and its 'header' (.version, .target,
    .address_size)."""
    items = {}
    header = []
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        code = line.split("//", 1)[0]
        m = FUNC_START.match(code)
        if m:
            kind = m.group(1)
            # the declaration runs to its '{' (a definition) or a ';' outside parentheses (a
            # prototype); then the body to the matching '}' (inline asm nests braces)
            j, text, depth, paren = i, [], 0, 0
            is_def = False
            while j < len(lines):
                c = lines[j].split("//", 1)[0]
                text.append(lines[j])
                for ch in c:
                    if ch == "(":
                        paren += 1
                    elif ch == ")":
                        paren -= 1
                    elif ch == "{":
                        depth += 1
                        is_def = True
                    elif ch == "}":
                        depth -= 1
                j += 1
                if is_def and depth == 0:
                    break
                if not is_def and paren == 0 and c.rstrip().endswith(";"):
                    break
            i = j
            if not is_def:
                continue
            name = FUNC_NAME.search(normalise_names(" ".join(t.strip() for t in text)))
            if not name:
                sys.exit(f"{path}: cannot read the name of the {kind} at line {i}")
            items[(kind, name.group(1))] = normalise_body("\n".join(text))
            continue
        if re.match(r"^\s*\.(version|target|address_size)\b", code):
            header.append(code.strip())
        else:
            v = VAR_DECL.match(code)
            if v:
                decl = normalise_body(code)
                items[("var", normalise_names(v.group(1)))] = decl
        i += 1
    items[("header", "module")] = header
    return items


def cubin_items(path):
    """{('sass', name): code bytes} of one cubin (ELF): each kernel's .text.<name> section, and
    ('shared', name): the size of its .nv.shared.<name> section. That size is not the kernel's
    alone: it includes the reserved area (1 KB on sm_90), and a kernel without static shared
    memory gets the section only when its module declares `extern __shared__` (so moving kernels
    between files can add or drop it); main() reports a change there as a note, not a failure."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"{path}: not a 64-bit ELF cubin")
    e_shoff = struct.unpack_from("<Q", data, 0x28)[0]
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for k in range(e_shnum):
        off = e_shoff + k * e_shentsize
        name, type_, _, _, offset, size = struct.unpack_from("<IIQQQQ", data, off)
        sections.append((name, type_, offset, size))
    strtab_off = sections[e_shstrndx][2]

    def sname(idx):
        end = data.index(b"\0", strtab_off + idx)
        return data[strtab_off + idx : end].decode()

    items = {}
    for name_idx, type_, offset, size in sections:
        name = sname(name_idx)
        if name.startswith(".text."):
            items[("sass", normalise_names(name[6:]))] = data[offset : offset + size]
        elif name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            items[("shared", normalise_names(name[11:]))] = [f"{size} bytes"]
    return items


def read_set(paths):
    """{(kind, name): [(path, body)]} over a set of PTX / cubin files."""
    found = defaultdict(list)
    for path in paths:
        with open(path, "rb") as f:
            elf = f.read(4) == b"\x7fELF"
        for key, body in (cubin_items(path) if elf else ptx_items(path)).items():
            found[key].append((path, body))
    return found


def demangler():
    cxxfilt = shutil.which("c++filt")
    cache = {}

    def demangle(name):
        if not cxxfilt or not name.startswith("_Z"):
            return name
        if name not in cache:
            r = subprocess.run([cxxfilt], input=name, capture_output=True, text=True)
            cache[name] = r.stdout.strip() or name
        return cache[name]

    return demangle


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", nargs="+", required=True, help="PTX / cubin files before the move")
    p.add_argument("--after", nargs="+", required=True, help="PTX / cubin files after the move")
    p.add_argument("--diff", type=int, default=40, help="lines of diff shown per differing item")
    p.add_argument("--mangled", action="store_true", help="print mangled (normalised) names")
    p.add_argument("--quiet", action="store_true", help="print only problems and the summary")
    args = p.parse_args()

    before, after = read_set(args.before), read_set(args.after)
    demangle = (lambda n: n) if args.mangled else demangler()
    counts = defaultdict(lambda: defaultdict(int))  # kind -> status -> count
    bad = False
    for key in sorted(set(before) | set(after)):
        kind, name = key
        label = f"{kind:6} {demangle(name)}"
        if kind == "shared":  # an absent section: 0 bytes
            sizes = [[b for _, b in found.get(key, [])] or [["0 bytes"]] for found in (before, after)]
            same = all(b == sizes[0][0] for b in sizes[0] + sizes[1])
            status = "identical" if same else "note"
            counts[kind][status] += 1
            if not same:
                print(f"note      {label}: section {sizes[0][0][0]} -> {sizes[1][0][0]}")
            elif not args.quiet:
                print(f"identical {label}")
            continue
        if key not in after:
            status = "missing"
        elif key not in before:
            status = "added"
        else:
            ref = before[key][0][1]
            others = [b for _, b in before[key][1:] if b != ref]
            changed = [(path, b) for path, b in after[key] if b != ref]
            status = "differs" if changed or others else "identical"
        counts[kind][status] += 1
        where = ""
        if key in after and len(after[key]) > 1:
            where = f"  (after: in {len(after[key])} files)"
        if status != "identical":
            bad = True
        if status != "identical" or not args.quiet:
            print(f"{status:9} {label}{where}")
        if status == "differs" and args.diff > 0:
            for path, b in changed or [(before[key][0][0], others[0])]:
                if isinstance(b, bytes):
                    print(f"    {path}: {len(b)} bytes against {len(ref)}")
                    continue
                diff = list(difflib.unified_diff(ref, b, "before", path, lineterm="", n=1))
                for line in diff[: args.diff]:
                    print("    " + line)
    print()
    for kind in sorted(counts):
        total = sum(counts[kind].values())
        parts = ", ".join(f"{n} {s}" for s, n in sorted(counts[kind].items()))
        print(f"{kind}: {total} ({parts})")
    print("DIFFERENT" if bad else "ALL IDENTICAL")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
