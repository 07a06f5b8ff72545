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
# fuzz_target TARGET: replays its regressions, then fuzzes it; writes its report to
# $work/TARGET.report and fails as the stage must.
fuzz_target() {
  local target=$1 program=build-fuzz/fuzz/$1 log=$work/$1.log report=$work/$1.report
  if [ -d "fuzz/regressions/$target" ]; then
    if ! "$program" "${limits[@]}" fuzz/regressions/"$target"/* > "$log" 2>&1; then
      { tail -n 40 "$log"; echo "$target: a regression input fails again"; } > "$report"
      return 1
    fi
  fi
  mkdir -p "$work/$target"
  cp fuzz/corpus/"$target"/* "$work/$target/"
  if ! "$program" "${limits[@]}" -max_total_time="$seconds" -artifact_prefix="$work/$target-" \
       "$work/$target" > "$log" 2>&1; then
    { tail -n 60 "$log"
      echo "$target: failed; the input is in the log above (keep it in fuzz/regressions/$target/)"
    } > "$report"
    return 1
  fi
  echo "$target: $(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 executions in \2 s/p' "$log"), no failure" > "$report"
}
# A libFuzzer target runs on one core: as many at a time as there are cores, each for the
# full SECONDS on a core of its own, so that a target executes as many inputs as alone.
status=0
pending=("${targets[@]}")
while ((${#pending[@]})); do
  batch=("${pending[@]:0:$(nproc)}")
  pending=("${pending[@]:${#batch[@]}}")
  pids=()
  for target in "${batch[@]}"; do fuzz_target "$target" & pids+=($!); done
  for i in "${!batch[@]}"; do
    wait "${pids[$i]}" || status=1
    cat "$work/${batch[$i]}.report" 2> /dev/null || echo "${batch[$i]}: failed before its report"
  done
done
exit $status
