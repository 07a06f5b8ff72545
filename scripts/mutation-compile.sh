#!/usr/bin/env bash
# mutation-compile.sh: the C++ compiler launcher of scripts/mutation-check.sh's copies, in
# front of ccache (or of the compiler, without one): mutation-compile.sh [ccache] c++ ARGS...
#
# While a plant is being built, mutation-check.sh names its file in BIGBATCH_PLANTED (a path
# relative to the copy's root). Every compile that reads the plant misses the cache anyway;
# those run at -O1 (the flag is added last, so it wins over Release's -O3), which compiles a
# kernel in about a third of the time (kernels/attention.cpp: 5.7 s against 16 s on an AMD
# EPYC, Zen 3). The verdicts do not move: with -ffp-contract=off and no fast-math the level
# changes no bit of a result, and scripts/mutation-check.sh's list ran to the same verdicts.
# Which compiles read the plant: the planted file itself when it is a source (.cpp); every
# compile of the build when it is a header, since a header's plant rebuilds only the files
# that include it (mutation-check.sh builds the targets unplanted first, so that nothing else
# is left to compile). Everything else, the restored file included, compiles as it was
# configured and comes from the cache.
set -euo pipefail

planted=${BIGBATCH_PLANTED:-}
if [ -n "$planted" ]; then
  quick=0
  case "$planted" in
    *.cpp)
      # The source of this compile: the argument after -c.
      source="" previous=""
      for argument in "$@"; do
        [ "$previous" != "-c" ] || source=$argument
        previous=$argument
      done
      [[ "$source" != */"$planted" ]] || quick=1
      ;;
    *.hpp|*.h|*.inc) quick=1 ;;
    # A .cu file is nvcc's to compile, not this launcher's; a script compiles nothing.
  esac
  if ((quick)); then exec "$@" -O1; fi
fi
exec "$@"
