#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test with CTest and
# builds the documentation site.
# CUDA tests run when a GPU is present and are reported as skipped, with the reason, when not.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/build.sh

# The CPU paths this run takes (BIGBATCH_MAX_ISA=avx2 or baseline hides the sets above).
echo "CPU: $(build/tests/cpu_features --describe)"
status=0
ctest --preset default --output-on-failure -j "$(nproc)" "$@" || status=$?

# CTest lists skipped tests without their reason; the reason is in the full log.
log=build/Testing/Temporary/LastTest.log
if [ -f "$log" ]; then
  reason=$(grep -m1 -o 'CUDA test skipped: .*' "$log" || true)
  count=$(grep -c 'CUDA test skipped: ' "$log" || true)
  if [ "$count" -gt 0 ]; then
    echo "Skipped: $count CUDA test(s). Reason: ${reason#CUDA test skipped: }"
  fi
fi

# The documentation site: any Doxygen warning (an undocumented public declaration of
# common/, kernels/ or nn/, a broken link) fails the build.
echo "building the documentation site (build/docs/html)"
cmake --build --preset default --target docs || status=1
exit $status
