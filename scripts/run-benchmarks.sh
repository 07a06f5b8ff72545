#!/usr/bin/env bash
# Runs the CPU benchmarks and writes Google Benchmark JSON to this machine's results folder
# (scripts/results-folder.sh: bench/results/cpu-2core-avx512/ for the 2-core AVX-512 CPU that
# made the committed results, cpu-2core-avx2/ where the kernels run AVX2, as on a CPU
# without AVX-512 or under BIGBATCH_MAX_ISA=avx2; the GEMM and accumulation figures draw
# every folder present, the other figures the AVX-512 one, bench/README.md's tables both): the kernels to cpu-kernels.json (the attention kernels against T to
# cpu-attention-kernels.json), the whole-step benchmarks (fp32
# and fp16) to cpu-training.json and their PyTorch peer (bench/pytorch_step.py) to
# pytorch-training.json, chapter 08's GPT step to cpu-gpt.json and its PyTorch peer to
# pytorch-gpt.json, attention's memory against T to cpu-attention-memory.json, the
# accumulation sweep (batch 1024 as micro-batches of 1 to 1024,
# naive and memory-free; 3 repetitions, the longest part) to cpu-accumulation.json, then
# chapter 05's checkpoint policies over depths 4 to 64 to cpu-checkpointing.json and
# chapter 06's planned steps across device budgets to cpu-planner.json; last, the README
# text written from them (scripts/readme_numbers.py --write: the tables, chapter 05's costs).
#
# Usage: scripts/run-benchmarks.sh [extra Google Benchmark flags]
#
# The OpenBLAS peer is measured at its best: Debian's OpenBLAS picks its kernel from the
# CPU model name, which on virtual machines is often generic, so this script names the
# best kernel of the instruction set ours uses in OPENBLAS_CORETYPE for this run only
# (never in tests).
# The benchmark's context records which kernel OpenBLAS actually used. Repetitions of
# different benchmarks are interleaved in random order, so that a drift in machine speed
# affects ours and the peer alike.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
scripts/install-deps.sh
scripts/build.sh >/dev/null

# The peers use the instruction set ours may (the folder's): OpenBLAS's kernel of that set,
# and PyTorch's ATen kernels capped at it (ATEN_CPU_CAPABILITY).
case "$results_dir" in
  *-avx512) coretype=SKYLAKEX capability=avx512 ;;
  *-avx2) coretype=HASWELL capability=avx2 ;;
  *) coretype=PRESCOTT capability=default ;;
esac
# Set here whatever the environment says: a machine-wide OPENBLAS_CORETYPE of another set
# would make the peer's numbers another instruction set's.
for setting in "OPENBLAS_CORETYPE=$coretype" "ATEN_CPU_CAPABILITY=$capability"; do
  name=${setting%%=*}
  if [ -n "${!name:-}" ] && [ "${!name}" != "${setting#*=}" ]; then
    echo "run-benchmarks.sh: $name=${!name} in the environment; this run uses ${setting#*=}" >&2
  fi
  export "$setting"
done
results=$results_dir
build/bench/bench_kernels --benchmark_out="$results/cpu-kernels.json" \
  --benchmark_out_format=json --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=-BM_Attention "$@"
echo "wrote $results/cpu-kernels.json"
# The attention kernels against T (seconds a call at T = 4096): a file of their own.
build/bench/bench_kernels --benchmark_out="$results/cpu-attention-kernels.json" \
  --benchmark_out_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=BM_Attention/cpu/ "$@"
echo "wrote $results/cpu-attention-kernels.json"
build/bench/bench_training --benchmark_out="$results/cpu-training.json" \
  --benchmark_out_format=json --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=BM_TrainingStep/cpu/ "$@"
echo "wrote $results/cpu-training.json"
# The PyTorch peer of the fp32 steps (Debian's python3-torch, as many threads as OpenMP
# gives ours; the same OPENBLAS_CORETYPE), right after them.
scripts/install-deps.sh python3-torch python3-numpy
/usr/bin/python3 bench/pytorch_step.py --out "$results/pytorch-training.json" \
  --threads "${OMP_NUM_THREADS:-$(nproc)}"
# Chapter 08's GPT (nanoGPT's shakespeare-char shape), then its PyTorch peer: a step takes
# seconds, so one step a repetition.
build/bench/bench_training --benchmark_out="$results/cpu-gpt.json" \
  --benchmark_out_format=json --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=BM_GptStep/cpu/ "$@"
echo "wrote $results/cpu-gpt.json"
/usr/bin/python3 bench/pytorch_step.py --model gpt --out "$results/pytorch-gpt.json" \
  --threads "${OMP_NUM_THREADS:-$(nproc)}" --steps 1 --repetitions 5
# Attention's memory against T (256, 1024, 4096) under none, every:1, attention and
# efficient (memory-efficient attention).
build/bench/bench_training --benchmark_out="$results/cpu-attention-memory.json" \
  --benchmark_out_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=BM_GptAttentionMemory "$@"
echo "wrote $results/cpu-attention-memory.json"
build/bench/bench_training --benchmark_out="$results/cpu-accumulation.json" \
  --benchmark_out_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=BM_Accumulation/cpu/ "$@"
echo "wrote $results/cpu-accumulation.json"
build/bench/bench_checkpointing --benchmark_out="$results/cpu-checkpointing.json" \
  --benchmark_out_format=json --benchmark_repetitions=7 \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_filter=BM_CheckpointedStep "$@"
echo "wrote $results/cpu-checkpointing.json"
build/bench/bench_checkpointing --benchmark_out="$results/cpu-planner.json" \
  --benchmark_out_format=json --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_filter=BM_PlannedStep "$@"
echo "wrote $results/cpu-planner.json"
python3 scripts/readme_numbers.py --write
