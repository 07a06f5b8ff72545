#!/usr/bin/env bash
# Chapter 08's GPT on Debian's fortunes, trained by bigbatch and by PyTorch from the same
# initial parameters on the same batches (scripts/gpt_fortunes_vs_pytorch.py): their
# validation losses after 300 steps, and what bigbatch's model writes. About 3 minutes on
# 2 cores. Writes gpt-fortunes-vs-pytorch.json in this machine's results folder
# (scripts/results-folder.sh).
# Usage: scripts/gpt-vs-pytorch.sh
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bigbatch-program.sh
scripts/install-deps.sh python3-torch python3-numpy fortunes
/usr/bin/python3 scripts/gpt_fortunes_vs_pytorch.py --bigbatch "$BIGBATCH" \
  --out "$results_dir/gpt-fortunes-vs-pytorch.json" --threads "${OMP_NUM_THREADS:-$(nproc)}"
