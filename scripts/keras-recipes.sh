#!/usr/bin/env bash
# The Keras recipes this project answers, each run beside the large batch with its faults
# measured (scripts/keras_recipes.py), and the corrected loop beside `bigbatch train
# --micro-batch`. About a minute on 2 cores (TensorFlow on one thread). Writes
# keras-recipes.json in this machine's results folder (scripts/results-folder.sh), which
# chapters 02, 04 and 05 quote.
# Usage: scripts/keras-recipes.sh
# BIGBATCH=path/to/bigbatch uses that program instead of installing and building.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bigbatch-program.sh
scripts/keras-venv.sh
build-keras-venv/bin/python scripts/keras_recipes.py --bigbatch "$BIGBATCH" \
  --out "$results_dir/keras-recipes.json"
python3 scripts/readme_numbers.py --write
