#!/usr/bin/env bash
# The tutorial: installs what is missing, builds what the chapters need and runs every
# chapter's demo in order, each right after its build, so that chapter 00 reports while the
# later ones are still to be compiled (chapter 07's as 2 ranks under mpirun). Each demo prints a self-checking report and exits
# non-zero if a check fails; the script goes on to the next chapter and fails at the end.
# Last it builds the program build/chapters/cli/bigbatch, which the chapters' READMEs run.
#
# It builds into build/ (CMake preset "tutorial"): the chapters and the program only, no
# tests and no benchmarks, and the CUDA backend only where a GPU is present (nvidia-smi
# lists one), since the demos run on the CPU otherwise. scripts/test.sh configures the
# same folder with everything on, and builds and checks all of it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh --tutorial

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cuda=AUTO
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  cuda=OFF
  echo "no GPU found (nvidia-smi lists none): building the CPU backend alone;" \
       "scripts/test.sh builds the CUDA code and runs its tests where a GPU is present"
fi
cmake --preset tutorial -DBIGBATCH_CUDA="$cuda"

# Chapter 07's demo runs as 2 ranks of an MPI job (on fewer cores: --oversubscribe; as
# root Open MPI asks for the two variables below).
launch_chapter_07=(mpirun --oversubscribe -np 2)
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

status=0
for dir in $(find chapters -mindepth 1 -maxdepth 1 -type d -name '[0-9][0-9]_*' | sort); do
  demo=chapter_$(basename "$dir")
  [ -f "$dir/demo.cpp" ] || continue
  echo
  echo "================================================================================"
  echo "== $demo"
  echo "================================================================================"
  cmake --build --preset tutorial -j "$(nproc)" --target "$demo"
  launch=()
  [ "$demo" != chapter_07_data_parallel ] || launch=("${launch_chapter_07[@]}")
  "${launch[@]}" "build/chapters/$demo" || status=1
done

echo
echo "building the program build/chapters/cli/bigbatch (the chapters' READMEs run it)"
cmake --build --preset tutorial -j "$(nproc)" --target bigbatch
exit $status
