#!/usr/bin/env bash
# Installs the build dependencies from Debian/Ubuntu packages (needs root or sudo).
# CUDA is optional: with nvcc on PATH the CUDA backend is built too.
set -euo pipefail
pkgs=(build-essential cmake libyaml-cpp-dev doctest-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
      libomp-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
