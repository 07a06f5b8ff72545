#!/usr/bin/env bash
# Times the README's first command on a fresh machine: a minimal Debian 12 made by
# debootstrap (nothing but its base packages), a clone of this repository's HEAD in it,
# and `scripts/tutorial.sh` run there by chroot, from the apt-get of its packages to the
# last chapter's report. The minutes a reader waits before the tutorial has run.
#
# Needs root (debootstrap and chroot) and Debian's mirror; installs debootstrap if missing.
# Writes, in this machine's results folder (scripts/results-folder.sh),
# fresh-machine-tutorial.txt (the time, the machine, the
# commit) and rewrites the README's sentence that quotes it. About 4 minutes on 2 cores
# (the debootstrap is the first of them).
#
# Usage: scripts/fresh-machine-tutorial.sh [WORK_DIR]   (default: a new folder in /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/results-folder.sh
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-tutorial.sh: needs root (debootstrap, chroot)" >&2; exit 2; }
scripts/install-deps.sh debootstrap
root=${1:-$(mktemp -d /tmp/bigbatch-fresh.XXXXXX)}
cleanup() {
  for mount in proc sys dev; do umount "$root/$mount" 2>/dev/null || true; done
}
trap cleanup EXIT

debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > "$root.debootstrap.log"
git clone -q . "$root/root/bigbatch"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount --bind /sys "$root/sys"
mount --bind /dev "$root/dev"
log=$root/tutorial.log
start=$(date +%s)
status=0
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  /bin/bash -c 'cd /root/bigbatch && scripts/tutorial.sh' > "$log" 2>&1 || status=$?
seconds=$(($(date +%s) - start))
[ "$status" -eq 0 ] || { tail -n 30 "$log"; echo "the tutorial failed ($status): $log" >&2; exit 1; }
passed=$(grep -c '^chapter [0-9][0-9]: PASSED' "$log")

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
out=$results_dir/fresh-machine-tutorial.txt
{
  echo "scripts/tutorial.sh on a fresh Debian 12 (debootstrap --variant=minbase bookworm)"
  echo "date: $(date -u +%Y-%m-%d)"
  echo "machine: $cpu, $(nproc) cores"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "chapters passed: $passed"
  echo "seconds: $seconds (the packages' apt-get, the build, every chapter's demo)"
} > "$out"
cat "$out"
python3 scripts/readme_numbers.py --write
