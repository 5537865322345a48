#!/bin/sh
# The main job, from a fresh Debian 12 machine: installs what is missing,
# builds, writes a small sample model with its SHA-256 manifest, streams it
# through the verified pipeline, then shows what one corrupted byte looks
# like to a caller.
# usage: tools/demo.sh [OUTDIR]     (default: /tmp/sluice-demo)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sh tools/deps.sh
out=${1:-/tmp/sluice-demo}
jobs=$(nproc 2>/dev/null || echo 2)
echo "== building (Release)"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j "$jobs" >/dev/null
sluice=build-release/sluice

rm -rf "$out" "$out-corrupt"
echo "== writing the sample model (tiny preset, 2 shards) and its manifest to $out"
$sluice synth tiny "$out"

echo "== its index (headers only)"
$sluice inspect "$out" | tail -n 4

echo "== loading it: every tensor read ahead by the engine and checked against the manifest"
build-release/load_model "$out"

echo "== the same model with one byte flipped inside model.layers.0.mlp.up_proj.weight"
cp -r "$out" "$out-corrupt"
line=$($sluice inspect "$out-corrupt" | grep ' model.layers.0.mlp.up_proj.weight ')
file_index=$(echo "$line" | awk '{print $(NF-1)}')
offset=$(echo "$line" | awk '{print $NF + 1000}')
shard=$($sluice inspect "$out-corrupt" | sed -n "s/^file $file_index: \([^ ]*\) .*/\1/p")
byte=$(od -An -tu1 -j "$offset" -N1 "$shard" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 255)))" | dd of="$shard" bs=1 seek="$offset" conv=notrunc status=none
build-release/load_model "$out-corrupt" || echo "(load_model exited $?: one tensor failed, the 38 others were delivered)"
