#!/usr/bin/env bash
# Executes the benchmark notebooks headless; they write the figures in docs/figures/.
# Installs matplotlib and Jupyter's nbconvert when they are missing: Debian's packages for
# the system Python, pip for any other Python first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
# (Debian's python3-nbconvert holds the module; the `jupyter nbconvert` command that runs it
# is the package jupyter-nbconvert.)
if ! python3 -c 'import matplotlib, nbconvert, nbclient, ipykernel' 2>/dev/null ||
   ! python3 -m jupyter nbconvert --version >/dev/null 2>&1; then
  if [ "$(command -v python3)" = /usr/bin/python3 ] && command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib \
      python3-nbconvert jupyter-nbconvert python3-nbclient python3-ipykernel
  else
    python3 -m pip install --quiet matplotlib nbconvert nbclient ipykernel
  fi
fi
mkdir -p build/notebooks
# One notebook per core at a time: each runs its own kernel, on one core, and writes figures
# of its own (xargs exits non-zero when one of them fails).
printf '%s\0' notebooks/*.ipynb |
  xargs -0 -n 1 -P "$(nproc)" python3 -m jupyter nbconvert --to notebook --execute \
        --output-dir build/notebooks
ls docs/figures
