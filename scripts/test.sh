#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with CTest.
# CUDA tests run when a GPU is present and are reported as skipped, with the reason, when not.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/build.sh
ctest --preset default --output-on-failure -j "$(nproc)" "$@"
