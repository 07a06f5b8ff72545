#!/usr/bin/env bash
# Fuzzes the file loaders: builds the libFuzzer targets of fuzz/ (CMake preset "fuzz":
# clang, AddressSanitizer, UndefinedBehaviorSanitizer), replays fuzz/regressions/TARGET
# (inputs that once broke a loader), then runs each target for SECONDS (default 30) from
# the seeds in fuzz/corpus/TARGET. Prints each target's executions; fails on a crash, a
# sanitizer report, an exception other than the loaders' clear refusals, a timeout
# (10 s per input), a single allocation past 256 MiB (no input of a few KiB needs one)
# or 2 GiB in all. Installs clang and libFuzzer's runtime
# (Debian: clang, libclang-rt-14-dev) when they are missing.
#
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
targets=(fuzz_npy fuzz_safetensors fuzz_idx)

scripts/install-deps.sh clang libclang-rt-14-dev

cmake --preset fuzz > /dev/null
cmake --build --preset fuzz -j "$(nproc)" --target "${targets[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256)
for target in "${targets[@]}"; do
  program=build-fuzz/fuzz/$target
  log=$work/$target.log
  if [ -d "fuzz/regressions/$target" ]; then
    if ! "$program" "${limits[@]}" fuzz/regressions/"$target"/* > "$log" 2>&1; then
      tail -n 40 "$log"
      echo "$target: a regression input fails again" >&2
      exit 1
    fi
  fi
  mkdir -p "$work/$target"
  cp fuzz/corpus/"$target"/* "$work/$target/"
  if ! "$program" "${limits[@]}" -max_total_time="$seconds" -artifact_prefix="$work/" \
       "$work/$target" > "$log" 2>&1; then
    tail -n 60 "$log"
    echo "$target: failed; the input is in the log above (keep it in fuzz/regressions/$target/)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 executions in \2 s/p' "$log")
  echo "$target: $runs, no failure"
done
