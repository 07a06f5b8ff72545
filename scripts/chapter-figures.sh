#!/usr/bin/env bash
# Regenerates the figures of chapters 03, 04 and 07: runs their demos with --write-data (the
# data goes to this machine's results folder, scripts/results-folder.sh), then executes the
# notebooks headless (scripts/plot-benchmarks.sh), which write docs/figures/. The loss curves
# of chapter 03 come from chapter03-loss-curves.json there, which
# scripts/fp16-loss-curves.sh writes (12 minutes of training: not rerun here).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
scripts/install-deps.sh
scripts/build.sh >/dev/null
results=$results_dir
mkdir -p "$results"
build/chapters/chapter_03_fp16_static_loss_scaling --write-data "$results/chapter03-fp16-dlogits.json"
build/chapters/chapter_04_dynamic_loss_scaling --write-data "$results/chapter04-scale-trajectory.json"
build/chapters/chapter_07_data_parallel --quick --write-data "$results/chapter07-cluster-model.json"
scripts/plot-benchmarks.sh
