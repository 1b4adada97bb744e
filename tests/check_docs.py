#!/usr/bin/env python3
"""Checks that generated and indexed documentation is current (ctest, no GPU).

  check_docs.py results-index           every file in docs/results is a row of its README's index,
                                        and every row names a file that is there
  check_docs.py config-reference TRAIN  docs/config.md equals `TRAIN --config-reference`
"""
import difflib
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")


def indexed_files(readme):
    """The files a row of the index names: the backquoted names of its first cell; a name that
    starts with '.' is the previous name with that extension (`a.json`, `.png`)."""
    names = []
    for line in readme.splitlines():
        if not line.startswith("| `"):
            continue
        prev = None
        for tok in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if tok.startswith(".") and prev:
                tok = os.path.splitext(prev)[0] + tok
            names.append(tok)
            prev = tok
    return names


def results_index():
    with open(os.path.join(RESULTS, "README.md")) as f:
        names = indexed_files(f.read())
    present = {n for n in os.listdir(RESULTS) if n != "README.md"}
    problems = [f"docs/results/{n} is not in docs/results/README.md's index"
                for n in sorted(present - set(names))]
    problems += [f"docs/results/README.md names {n}, which is not in docs/results"
                 for n in sorted(set(names) - present)]
    problems += [f"docs/results/README.md names {n} twice"
                 for n in sorted({n for n in names if names.count(n) > 1})]
    for p in problems:
        print("error:", p)
    if not problems:
        print(f"results index: ok ({len(present)} files)")
    return 1 if problems else 0


def config_reference(train):
    want = subprocess.run([train, "--config-reference"], check=True, capture_output=True,
                          text=True).stdout
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        have = f.read()
    if have == want:
        print("config reference: ok")
        return 0
    print("error: docs/config.md differs from `train --config-reference` "
          "(build/train --config-reference > docs/config.md):")
    for line in difflib.unified_diff(have.splitlines(), want.splitlines(), "docs/config.md",
                                     "train --config-reference", lineterm=""):
        print(line)
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "results-index":
        sys.exit(results_index())
    if len(sys.argv) == 3 and sys.argv[1] == "config-reference":
        sys.exit(config_reference(sys.argv[2]))
    sys.exit(__doc__)
