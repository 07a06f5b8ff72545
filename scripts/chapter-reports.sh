#!/usr/bin/env bash
# Runs every chapter's demo in full (not --quick) and keeps what it prints: the report each
# chapter's README quotes. scripts/readme_numbers.py reads the numbers the chapters' text
# cites from these reports, and checks (CTest readme_numbers_current) or, with --write,
# rewrites them, so a change to a demo that moves a number fails until the text says it.
#
# Writes, in this machine's results folder (scripts/results-folder.sh),
# chapter-reports/chapter_NN_name.txt, one per demo, each
# headed by the CPU, its instruction sets and the date, then rewrites the READMEs' numbers.
# Under a minute on an idle 2-core machine once built (chapter 01's two epochs and chapter
# 04's three 120-step runs take the most). Step times in a report are one run's on this
# machine: compare them with each other, not with another machine's.
#
# Chapter 07's demo runs as 2 MPI ranks (its section f), as in the tutorial.
#
# Usage: scripts/chapter-reports.sh [chapter_NN_name ...]   (default: every demo)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
scripts/install-deps.sh
scripts/build.sh > /dev/null
out=$results_dir/chapter-reports
mkdir -p "$out"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
isa=$(grep -m 1 -o -w -E 'avx512f|avx512bw|avx2|fma|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
demos=("$@")
((${#demos[@]})) || demos=($(cd build/chapters && ls -d chapter_[0-9][0-9]_*))
for name in "${demos[@]}"; do
  demo=build/chapters/$name
  [ -f "$demo" ] && [ -x "$demo" ] || { echo "no demo $demo" >&2; exit 2; }
  echo "== $name"
  launch=()
  [ "$name" != chapter_07_data_parallel ] || launch=(mpirun --oversubscribe -np 2)
  {
    echo "# $name, the full run, on $cpu (${isa% }), $(date -u +%Y-%m-%d) (scripts/chapter-reports.sh)"
    "${launch[@]}" "$demo"
  } > "$out/$name.txt.new"
  mv "$out/$name.txt.new" "$out/$name.txt"
done
python3 scripts/readme_numbers.py --write
