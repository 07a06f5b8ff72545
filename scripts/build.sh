#!/usr/bin/env bash
# Configures (CMake preset "default") and builds everything. Used by test.sh and tutorial.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake --preset default
cmake --build --preset default -j "$(nproc)"
