#!/usr/bin/env bash
# Installs the Debian packages bigbatch builds, tests and benchmarks with, if missing.
# The CUDA toolkit is not installed here: the build uses it when nvcc is on PATH (or in
# /usr/local/cuda/bin) and builds the CPU backend alone otherwise.
set -euo pipefail

packages=(build-essential cmake googletest libgtest-dev libbenchmark-dev zlib1g-dev
          libopenblas-dev dataset-fashion-mnist doxygen libcli11-dev)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
