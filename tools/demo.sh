#!/bin/sh
# The main job, from a fresh Debian 12 machine: installs what is missing,
# builds, writes a small sample model with its manifest, and loads it with
# the example program.
# usage: tools/demo.sh [OUTDIR]     (default: /tmp/sluice-demo)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sh tools/deps.sh
out=${1:-/tmp/sluice-demo}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j "$jobs" >/dev/null
rm -rf "$out"
echo "== writing the sample model (tiny preset, 2 shards, with its manifest) to $out"
build-release/sluice synth tiny "$out"
echo "== its index"
build-release/sluice inspect "$out" | tail -n 3
echo "== loading it"
build-release/load_model "$out"
