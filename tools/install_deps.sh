#!/usr/bin/env bash
# Installs the build dependencies from Debian/Ubuntu packages (needs root or sudo).
# CUDA is optional: with nvcc on PATH the CUDA backend is built too.
set -euo pipefail
pkgs=(build-essential cmake libyaml-cpp-dev doctest-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
      libomp-dev libopenblas-openmp-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# matplotlib for tools/plot_runs.py (optional: its test says so and skips when it is missing):
# Debian's package for Debian's python3, pip for another python3 on PATH.
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  if [ "$(command -v python3)" = /usr/bin/python3 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-matplotlib >/dev/null || true
  else
    python3 -m pip install -q matplotlib >/dev/null 2>&1 || true
  fi
fi
