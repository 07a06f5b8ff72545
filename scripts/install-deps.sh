#!/usr/bin/env bash
# Installs the Debian packages bigbatch builds, tests and benchmarks with, if missing
# (ccache and Ninja let scripts/mutation-check.sh build its copies from a build's objects).
#   scripts/install-deps.sh             everything scripts/test.sh and the benchmarks use
#   scripts/install-deps.sh --tutorial  what the chapters and the program need, no more
#                                       (scripts/tutorial.sh: no test or benchmark
#                                       frameworks, no OpenBLAS, no Doxygen)
#   scripts/install-deps.sh PACKAGE...  those packages (scripts/fuzz.sh: clang and libFuzzer)
# The CUDA toolkit is not installed here: the build uses it when nvcc is on PATH (or in
# /usr/local/cuda/bin) and builds the CPU backend alone otherwise.
# Optional, and not installed here for its size (about 640 MB installed, 150 MB to
# download, on Debian 12): python3-torch and python3-numpy, which the CTest test
# compare_with_pytorch needs; without them that test is reported as skipped.
set -euo pipefail

tutorial=(build-essential cmake zlib1g-dev dataset-fashion-mnist fortunes libcli11-dev
          nlohmann-json3-dev openmpi-bin libopenmpi-dev)
packages=("${tutorial[@]}" googletest libgtest-dev libbenchmark-dev libopenblas-dev doxygen ccache
          ninja-build)
if [ "${1:-}" = "--tutorial" ]; then
  packages=("${tutorial[@]}")
elif (($#)); then
  packages=("$@")
fi
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
