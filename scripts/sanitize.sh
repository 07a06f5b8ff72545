#!/usr/bin/env bash
# Every test of the CPU backend under AddressSanitizer and UndefinedBehaviorSanitizer (the
# CMake preset "sanitize": a Debug build at -O1 in build-sanitize/, CUDA off). A memory
# error, a leak or undefined behaviour aborts the test that meets it, and the test fails.
# The PyTorch comparisons are left out (they run the same program as the plain build's).
#
# Usage: scripts/sanitize.sh [extra ctest arguments]     (about 7 minutes to build and 7
# to test on two cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset sanitize > /dev/null
cmake --build --preset sanitize -j "$(nproc)"
ctest --preset sanitize -j "$(nproc)" "$@"
