#!/bin/sh
# metrics_promtool: every exposition test_metrics renders (one model,
# several with labels needing escapes; text format 0.0.4) must pass
# `promtool check metrics` (Debian package prometheus). Exit 77 (skip)
# only when promtool is not installed.
# usage: promtool.sh TEST_METRICS_BINARY
set -eu
command -v promtool >/dev/null 2>&1 || { echo "SKIP: promtool not installed (apt-get install -y prometheus)"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-promtool.XXXXXX")
trap 'rm -rf "$dir"' EXIT
SLUICE_METRICS_DUMP="$dir" "$1" >/dev/null
n=0
for f in "$dir"/*.prom; do
    echo "promtool check metrics < $(basename "$f")"
    promtool check metrics < "$f"
    n=$((n + 1))
done
[ "$n" -ge 2 ] || { echo "expected at least 2 expositions, got $n"; exit 1; }
# OpenMetrics: one # EOF, last line.
for f in "$dir"/*.om; do
    [ "$(tail -n 1 "$f")" = "# EOF" ] || { echo "$f: does not end with # EOF"; exit 1; }
    [ "$(grep -c '^# EOF$' "$f")" = 1 ] || { echo "$f: # EOF more than once"; exit 1; }
done
echo "metrics_promtool: $n expositions accepted"
