#!/usr/bin/env bash
# Makes build-keras-venv: TensorFlow's CPU build with Keras 3 in a virtual environment in
# the checkout, where tests/CMakeLists.txt looks for it (the CTest test compare_with_keras)
# and scripts/keras-recipes.sh runs it. The versions the comparisons were measured with;
# about 270 MB from PyPI, 1.6 GB installed, half a minute. Nothing to do when it is there.
# Usage: scripts/keras-venv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if build-keras-venv/bin/python -c "import tensorflow, keras, numpy" 2> /dev/null; then
  exit 0
fi
python3 -m venv build-keras-venv
build-keras-venv/bin/pip install --quiet --disable-pip-version-check \
  tensorflow-cpu==2.21.0 keras==3.15.1 numpy==2.4.6
