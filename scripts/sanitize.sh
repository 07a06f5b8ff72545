#!/usr/bin/env bash
# Every test of the CPU backend under AddressSanitizer and UndefinedBehaviorSanitizer (the
# CMake preset "sanitize": a Debug build in build-sanitize/, CUDA off; the libraries and
# the chapter demos at -O1, the kernels' hot loops at -O2, and the code that only checks and
# drives them, tests/ and the program, at -O0, which halves their compile time (tests/
# test_io.cpp: 17.6 s at -O1, 9.1 s at -O0); their own code does little of the work). A memory
# error, a leak or undefined behaviour aborts the test that meets it, and the test fails.
# The PyTorch comparisons are left out (they run the same program as the plain build's).
#
# Usage: scripts/sanitize.sh [extra ctest arguments]     (about 4 minutes to build and 5
# to test on two cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset sanitize > /dev/null
cmake --build --preset sanitize -j "$(nproc)"
ctest --preset sanitize -j "$(nproc)" "$@"
