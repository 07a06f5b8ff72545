#!/usr/bin/env bash
# On a machine with a GPU: configure with CUDA, build, run every test (CUDA included) and
# every benchmark, and write logs and JSON under OUTDIR.
#
# Usage: scripts/gpu-check.sh OUTDIR
#   BIGBATCH_DEPS_PREFIX  a folder made by scripts/stage-gpu-deps.sh, for a machine that
#                         cannot install GoogleTest, Google Benchmark or zlib itself
#   BIGBATCH_BENCH_FILTER a --benchmark_filter regex (default: all benchmarks)
#
# Writes: OUTDIR/configure.log, build.log, ctest.log, ctest-junit.xml, nvidia-smi.txt,
#         bench_kernels.json and bench_training.json (Google Benchmark JSON: the kernels,
#         and whole training steps in fp32 and fp16) with their logs, and
#         bench_training_gpu.json (the GPU step grid, with the GEMMs' share of the step).
# OUTDIR holds the logs too, so it is a scratch folder, not the repository's: the committed
# copies of the three JSON files go to bench/results/h200/ under the same names (one folder
# per machine; notebooks/kernel_benchmarks.ipynb reads bench/results/h200/bench_kernels.json).
# Exits non-zero when the build fails, a test fails, or a CUDA test was skipped (on a GPU
# machine a skip means the GPU was not usable, which this script exists to catch; the
# PyTorch comparison may skip where torch is not installed).
set -uo pipefail
out="${1:?usage: scripts/gpu-check.sh OUTDIR}"
cd "$(dirname "$0")/.."
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build=build-gpu
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$out/nvidia-smi.txt"

configure=(cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBIGBATCH_CUDA=ON)
if [ -n "${BIGBATCH_DEPS_PREFIX:-}" ]; then
  deps="$(cd "$BIGBATCH_DEPS_PREFIX" && pwd)"
  configure+=(-DCMAKE_PREFIX_PATH="$deps" -DZLIB_ROOT="$deps"
              -DZLIB_LIBRARY="$deps/lib/x86_64-linux-gnu/libz.a" -DZLIB_INCLUDE_DIR="$deps/include")
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
command -v ninja >/dev/null && configure+=(-G Ninja)

echo "== configure"
"${configure[@]}" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -A16 'bigbatch .* configuration' "$out/configure.log"

echo "== build"
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }

echo "== test"
(cd "$build" && ctest --output-on-failure -j 4 --output-junit "$out/ctest-junit.xml") \
  > "$out/ctest.log" 2>&1
test_status=$?
tail -5 "$out/ctest.log"
skipped=$(grep '\*\*\*Skipped' "$out/ctest.log" | grep -vc 'compare_with_pytorch\|compare_with_keras' || true)
if [ "$skipped" -gt 0 ]; then
  echo "!! $skipped tests were skipped on a GPU machine:"
  grep '\*\*\*Skipped' "$out/ctest.log" | grep -v 'compare_with_pytorch\|compare_with_keras' | head -20
  grep -m1 -o 'CUDA test skipped: .*' "$build/Testing/Temporary/LastTest.log" || true
  test_status=1
fi

echo "== benchmarks"
"$build/bench/bench_kernels" --benchmark_filter="${BIGBATCH_BENCH_FILTER:-.}" \
  --benchmark_out="$out/bench_kernels.json" --benchmark_out_format=json \
  --benchmark_min_time=0.2 > "$out/bench_kernels.log" 2>&1
bench_status=$?
grep -E 'cuda|CUDA' "$out/bench_kernels.log" | head -40
# BM_Accumulation/cpu, the CPU's micro-batch sweep, and BM_GptStep/cpu, seconds a step
# (scripts/run-benchmarks.sh runs both), are left out; BM_GptStep/cuda is GPT-2 small's shape.
"$build/bench/bench_training" --benchmark_filter='BM_TrainingStep|BM_GptStep/cuda' \
  --benchmark_out="$out/bench_training.json" \
  --benchmark_out_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true > "$out/bench_training.log" 2>&1 || bench_status=1
grep -E 'median' "$out/bench_training.log"
# The GPU step grid on its own (depth 4/16, H 1024/4096, B 1024, fp32/fp16, accumulation,
# fused epilogues) with gemm_ms, gemm_share and driver_allocations as counters.
"$build/bench/bench_training" --benchmark_filter='BM_TrainingStep/cuda' \
  --benchmark_out="$out/bench_training_gpu.json" --benchmark_out_format=json \
  > "$out/bench_training_gpu.log" 2>&1 || bench_status=1
grep -E 'cuda' "$out/bench_training_gpu.log" | head -30

echo "== summary: tests exit $test_status, benchmarks exit $bench_status"
echo "to commit the JSON: mkdir -p bench/results/h200 && cp $out/bench_kernels.json" \
  "$out/bench_training.json $out/bench_training_gpu.json bench/results/h200/"
[ "$test_status" -eq 0 ] && [ "$bench_status" -eq 0 ]
