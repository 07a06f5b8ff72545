#!/usr/bin/env bash
# Regenerates every committed result and figure, in order, on this machine (the results go
# to its own folder, scripts/results-folder.sh: bench/results/cpu-2core-avx512/ on the 2-core
# AVX-512 CPU that made the committed ones, which the READMEs quote):
#   scripts/run-benchmarks.sh             cpu-{kernels,attention-kernels,training,gpt,attention-memory,
#                                         accumulation,checkpointing,planner}.json
#                                         and the PyTorch peers' pytorch-{training,gpt}.json
#   scripts/fashion-mnist-equivalence.sh  fashion-mnist-equivalence.txt
#   scripts/large-batch-learning-rate.sh  fashion-mnist-large-batch-16-epochs.json
#   scripts/techniques-table.sh           fashion-mnist-techniques.md, gpt-techniques.md
#   scripts/gpt-vs-pytorch.sh             gpt-fortunes-vs-pytorch.json (chapter 08 beside PyTorch)
#   scripts/keras-recipes.sh              keras-recipes.json (the Keras recipes' faults, measured)
#   scripts/fp16-loss-curves.sh           chapter03-loss-curves.json
#   scripts/fashion-mnist-curves.sh       fashion-mnist-curves.json
#   scripts/planner-frontier.sh           planner-frontier.json
#   scripts/data-parallel-bench.sh        data-parallel.json (chapter 07: 1 process, 2 ranks)
#   scripts/chapter-openings.sh           chapter-openings.json (the runs the chapters open on)
#   scripts/chapter-reports.sh            chapter-reports/ (every demo's full report)
#   scripts/chapter-figures.sh            chapters 03, 04 and 07's data, then every notebook, headless,
#                                         which writes docs/figures/
# Each step installs what it needs and builds first, and its own header says how long it
# runs (the Fashion-MNIST runs and the fp16 loss curves take the most); the results' own
# files say when and where they were made.
# A GPU's results come from scripts/gpu-check.sh instead (it needs the device; its JSON is
# committed in bench/results/h200/).
#
# Usage: scripts/reproduce.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for step in run-benchmarks.sh fashion-mnist-equivalence.sh large-batch-learning-rate.sh \
            techniques-table.sh gpt-vs-pytorch.sh keras-recipes.sh fp16-loss-curves.sh fashion-mnist-curves.sh planner-frontier.sh \
            data-parallel-bench.sh chapter-openings.sh chapter-reports.sh chapter-figures.sh; do
  echo "== scripts/$step"
  "scripts/$step"
done
# The README text written from the results (each script above rewrites its own; this
# catches any left).
python3 scripts/readme_numbers.py --write
echo "every result is regenerated: git status shows what changed"
