#!/usr/bin/env bash
# mutation-compile.sh: the compiler launcher of scripts/mutation-check.sh's copies, C++ and
# CUDA alike, in front of ccache (or of the compiler, without one):
# mutation-compile.sh [ccache] COMPILER ARGS...
#
# While a plant is being built, mutation-check.sh names its file in BIGBATCH_PLANTED (a path
# relative to the copy's root, BIGBATCH_COPY). Every compile that reads the plant misses the
# cache anyway; those run at a lower level (the flag is added last, so it wins over
# Release's -O3): -O1 for a source in kernels/, which compiles a kernel in about a third of
# the time (kernels/attention.cpp: 5.7 s against 16 s on an AMD EPYC, Zen 3) and keeps its
# hot loops fast enough for the tests, and -O0 for every other source (common/, collectives/, nn/,
# chapters/), whose code drives the kernels and does little of the work itself
# (chapters/06_planner/planner.cpp: 4.0 s at -O0, 5.4 s at -O1).
# The verdicts do not move: with -ffp-contract=off and no fast-math the level changes no bit
# of a result, and scripts/mutation-check.sh's list ran to the same verdicts.
# Which compiles read the plant: the planted file itself when it is a source (.cpp); every
# compile of the build when it is a header, since a header's plant rebuilds only the files
# that include it (mutation-check.sh builds the targets unplanted first, so that nothing else
# is left to compile). Everything else, the restored file included, compiles as it was
# configured and comes from the cache.
#
# A header's plant recompiles the CUDA sources that include it too (kernels/attention.cu:
# 18 s of nvcc). Where no GPU runs them (mutation-check.sh then sets
# BIGBATCH_CUDA_OBJECTS_KEPT=1), that object is kept as the unplanted build left it: no test
# here executes a line of it, so the verdict is the CPU tests' either way. Its depfile then
# names the source and the plant, so that the file's restoring rebuilds it from the cache.
set -euo pipefail

planted=${BIGBATCH_PLANTED:-}
if [ -n "$planted" ]; then
  # The compiler (after ccache, when it is there), the source (after -c), the object (-o)
  # and the depfile (-MF).
  compiler=$1
  [[ "${compiler##*/}" != ccache ]] || compiler=${2:-}
  source="" object="" depfile="" previous=""
  for argument in "$@"; do
    case "$previous" in
      -c) source=$argument ;;
      -o) object=$argument ;;
      -MF) depfile=$argument ;;
    esac
    previous=$argument
  done
  header=0
  case "$planted" in *.hpp|*.h|*.inc) header=1 ;; esac
  if [[ "${compiler##*/}" == nvcc ]]; then
    if ((header)) && [ "${BIGBATCH_CUDA_OBJECTS_KEPT:-0}" = 1 ] && [ -f "$object" ] &&
       [ -n "$depfile" ]; then
      printf '%s: %s %s\n' "$object" "$source" "${BIGBATCH_COPY:?}/$planted" > "$depfile"
      touch "$object"
      exit 0
    fi
    exec "$@"  # nvcc's level stays: a .cu plant is compiled as configured
  fi
  level=-O0
  [[ "$source" != */kernels/* ]] || level=-O1
  if ((header)) || [[ "$source" == */"$planted" ]]; then exec "$@" "$level"; fi
fi
exec "$@"
