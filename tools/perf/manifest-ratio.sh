#!/bin/bash
# Times `sluice manifest` on MODEL against the single-core SHA-256 rate
# (bench baseline (c)), measured in the same rounds: each round runs one
# bench round (baselines + a verified stream), then the manifest.
#   tools/perf/manifest-ratio.sh SLUICE MODEL [ROUNDS] [--flat]
set -euo pipefail
sluice=$1 model=$2 rounds=${3:-5} flat=${4:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ncpu=$(nproc)
for r in $(seq "$rounds"); do
    "$sluice" bench "$model" --runs 1 --verify on --csv "$tmp/b$r.csv" >/dev/null
    start=$(date +%s.%N)
    "$sluice" manifest "$model" -o "$tmp/m.json" $flat
    end=$(date +%s.%N)
    awk -v a="$start" -v b="$end" 'BEGIN{printf "%.6f\n", b - a}' >>"$tmp/manifest_s"
    awk -F, 'NR==1{for(i=1;i<=NF;i++)h[$i]=i} $h["config"]=="sha256-mem"{print $h["gbps"]}' \
        "$tmp/b$r.csv" >>"$tmp/sha_gbps"
done
# bytes hashed: every tensor, and unless --flat every whole file
tensor_bytes=$(awk -F, 'NR==1{for(i=1;i<=NF;i++)h[$i]=i} $h["config"]=="sha256-mem"{next} NR>1{print $h["bytes_needed"]; exit}' "$tmp/b1.csv")
file_bytes=$(du -cb "$model"/*.safetensors 2>/dev/null | tail -1 | cut -f1)
[ -f "$model" ] && file_bytes=$(stat -c %s "$model")
hashed=$tensor_bytes
[ -z "$flat" ] && hashed=$((tensor_bytes + file_bytes))
med() { sort -g "$1" | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
m=$(med "$tmp/manifest_s") c=$(med "$tmp/sha_gbps")
printf 'manifest%s: median %.3f s over %d rounds [%s]\n' "${flat:+ $flat}" "$m" "$rounds" "$(sort -g "$tmp/manifest_s" | tr '\n' ' ' | sed 's/ $//')"
printf 'bytes hashed: %d (tensors %d%s)\n' "$hashed" "$tensor_bytes" "${flat:+}$([ -z "$flat" ] && echo " + files $file_bytes")"
awk -v h="$hashed" -v m="$m" -v c="$c" -v n="$ncpu" 'BEGIN{printf "%.2f GB/s hashed; (c) %.2f GB/s per core x %d = %.2f; ratio %.2f\n", h/m/1e9, c, n, c*n, h/m/1e9/(c*n)}'
