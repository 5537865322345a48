#!/bin/bash
# Before/after timing of two sluice builds, rounds alternating (issue 37's
# "same run" benchmark). Each round runs, for each build (the order swaps
# every round so that neither always follows the other):
#   sluice bench MODEL --runs 3 --verify on --csv ...   (stream, sluice_verify,
#                                                      `sluice verify`, baseline (e))
#   `sluice verify MODEL`, VRUNS times, wall of each (bash's time)
#   sluice bench PARTS --world 4 --runs 3              (shard of rank 0, 4 ranks)
# with `uptime` before and after each, into OUTDIR/round-K-BUILD.*.
# Then tools/perf/before_after.py OUTDIR summarises (medians, ratios).
#
# usage: before_after.sh BEFORE_SLUICE AFTER_SLUICE MODEL PARTS_MODEL ROUNDS OUTDIR [VRUNS]
#   MODEL: a model with a manifest (sluice synth qwen2.5-0.5b DIR)
#   PARTS_MODEL: a model whose manifest has part digests
#     (sluice manifest DIR --parts builtin -q -o DIR/model.safetensors.manifest.json)
set -u
if [ $# -lt 6 ]; then sed -n 2,17p "$0"; exit 2; fi
before=$1 after=$2 model=$3 parts=$4 rounds=$5 out=$6 vruns=${7:-5}
mkdir -p "$out"
one() { # name binary round
  local name=$1 bin=$2 r=$3 p="$out/round-$3-$1"
  { date -u +%FT%TZ; uptime; } > "$p.uptime"
  "$bin" bench "$model" --runs 3 --verify on --csv "$p.stream.csv" > "$p.stream.txt" 2>&1 \
    || echo "bench rc=$?" >> "$p.stream.txt"
  uptime >> "$p.uptime"
  : > "$p.verify.txt"
  for i in $(seq "$vruns"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$bin" verify "$model" > /dev/null 2>&1 || echo "verify rc=$?" >> "$p.verify.txt"
    t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{printf "%.4f\n", $2 - $1}' >> "$p.verify.txt"
  done
  uptime >> "$p.uptime"
  "$bin" bench "$parts" --world 4 --runs 3 > "$p.parts.txt" 2>&1 \
    || echo "bench rc=$?" >> "$p.parts.txt"
  { uptime; date -u +%FT%TZ; } >> "$p.uptime"
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    one before "$before" "$r"; one after "$after" "$r"
  else
    one after "$after" "$r"; one before "$before" "$r"
  fi
  echo "round $r done $(date -u +%T)"
done
