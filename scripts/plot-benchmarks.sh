#!/usr/bin/env bash
# Executes the benchmark notebooks headless; they write the figures in docs/figures/.
# Installs matplotlib and Jupyter's nbconvert with pip when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import matplotlib, nbconvert, nbclient, ipykernel' 2>/dev/null ||
  python3 -m pip install --quiet matplotlib nbconvert nbclient ipykernel
mkdir -p build/notebooks
for notebook in notebooks/*.ipynb; do
  python3 -m jupyter nbconvert --to notebook --execute --output-dir build/notebooks "$notebook"
done
ls docs/figures
