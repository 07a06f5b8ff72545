#!/usr/bin/env bash
# The tutorial: installs what is missing, builds, and runs every chapter's demo in order.
# Each demo prints a self-checking report and exits non-zero if a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/build.sh

status=0
for demo in $(find build/chapters -maxdepth 2 -type f -name 'chapter_*' -perm -u+x | sort); do
  echo
  echo "================================================================================"
  echo "== $(basename "$demo")"
  echo "================================================================================"
  "$demo" || status=1
done
exit $status
