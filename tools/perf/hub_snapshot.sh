#!/bin/bash
# The first and second verified load of a Hugging Face Hub cache snapshot of
# the qwen2.5-0.5b synth preset (docs/manifests.md), against an unverified
# load of the same bytes (a hard link outside the snapshot), in one run.
# usage: tools/perf/hub_snapshot.sh [SLUICE] [WORKDIR]   (a Release build:
#   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release && cmake --build build-rel)
set -eu
S=${1:-build-rel/sluice}
W=${2:-/tmp/sluice-hub-bench}
rm -rf "$W"; mkdir -p "$W"
"$S" synth qwen2.5-0.5b "$W/syn" --no-manifest >/dev/null
f="$W/syn/model.safetensors"
hex=$(sha256sum "$f" | cut -c1-64)
R="$W/hub/models--Qwen--Qwen2.5-0.5B"
mkdir -p "$R/blobs" "$R/snapshots/rev0" "$R/refs"
echo rev0 > "$R/refs/main"
mv "$f" "$R/blobs/$hex"
ln -s "../../blobs/$hex" "$R/snapshots/rev0/model.safetensors"
mkdir -p "$W/plain"; ln "$R/blobs/$hex" "$W/plain/model.safetensors"   # same inode: unverified
ls -l "$R/blobs/$hex" | awk '{print "file bytes", $5}'
TIMEFORMAT='%R %U %S'
t() { { time "$@" >/dev/null 2>"$W/err"; } 2>&1 | awk '{printf "%.2fs wall %.2fs cpu", $1, $2+$3}'; }
cat "$R/blobs/$hex" >/dev/null   # page cache warm for every run
for round in 1 2 3; do
  u=$(t "$S" stats "$W/plain")
  rm -rf "$W/cache"
  a=$(t env SLUICE_CACHE_DIR="$W/cache" "$S" stats "$R/snapshots/rev0")
  b=$(t env SLUICE_CACHE_DIR="$W/cache" "$S" stats "$R/snapshots/rev0")
  echo "round $round: unverified [$u]  first verified, derives [$a]  second verified [$b]"
done
env SLUICE_CACHE_DIR="$W/cache" "$S" stats "$R/snapshots/rev0" 2>&1 >/dev/null | head -2
ls -l "$W/cache/derived/sha256/"
