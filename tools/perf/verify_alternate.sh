#!/bin/bash
# The local verify gate of issue 37 ("no slower than 0.97 x"): two sluice
# builds, rounds alternating (the order swaps every round). Each round,
# each build: sluice bench MODEL --runs 3 --verify on --csv (stream,
# sluice_verify, `sluice verify`*, baseline (e)), then `sluice verify MODEL`
# x5 and `sluice verify MODEL --files` x3 (wall of each), into OUTDIR.
# usage: verify_alternate.sh BEFORE_SLUICE AFTER_SLUICE MODEL ROUNDS OUTDIR
set -u
before=$1 after=$2 model=$3 rounds=$4 out=$5
mkdir -p "$out"
one() {
  local name=$1 bin=$2 r=$3 p="$out/round-$3-$1"
  { date -u +%FT%TZ; uptime; } > "$p.uptime"
  "$bin" bench "$model" --runs 3 --verify on --csv "$p.stream.csv" > "$p.stream.txt" 2>&1 || echo "bench rc=$?" >> "$p.stream.txt"
  : > "$p.verify.txt"; : > "$p.files.txt"
  for i in 1 2 3 4 5; do
    t0=$(date +%s.%N); "$bin" verify "$model" > /dev/null 2>&1 || echo "verify rc=$?" >> "$p.verify.txt"; t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{printf "%.4f\n", $2 - $1}' >> "$p.verify.txt"
  done
  for i in 1 2 3; do
    t0=$(date +%s.%N); "$bin" verify "$model" --files > /dev/null 2>&1 || echo "verify rc=$?" >> "$p.files.txt"; t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{printf "%.4f\n", $2 - $1}' >> "$p.files.txt"
  done
  uptime >> "$p.uptime"
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then one before "$before" "$r"; one after "$after" "$r"
  else one after "$after" "$r"; one before "$before" "$r"; fi
  echo "round $r done $(date -u +%T)"
done
