#!/bin/bash
# Rank R's shard loaded by two builds alternately, N times each, each a fresh
# `sluice shard --json` process: the load's wall (its "wall_s") and the
# process's CPU time (perf stat task-clock, every thread), medians and
# after/before. CPU time moves far less than wall time when other work
# shares the cores, so it is the steadier of the two on a loaded machine.
#   tools/perf/shard_alternate.sh BEFORE_SLUICE AFTER_SLUICE MODEL N [WORLD] [RANK]
set -u
[ $# -ge 4 ] || { sed -n 2,7p "$0"; exit 2; }
before=$1 after=$2 model=$3 n=$4 world=${5:-4} rank=${6:-0}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$before" shard "$model" --rank "$rank" --world "$world" >/dev/null 2>&1   # warm the page cache
echo "load before: $(uptime)"
for i in $(seq "$n"); do
    for b in before after; do
        bin=$before; [ $b = after ] && bin=$after
        perf stat -x, -e task-clock -o "$tmp/perf" "$bin" shard "$model" --rank "$rank" \
            --world "$world" --json > "$tmp/out" 2>>"$tmp/$b.err" || echo "$b run $i failed" >&2
        wall=$(sed -n 's/.*"wall_s": \([0-9.]*\).*/\1/p' "$tmp/out")
        cpu=$(awk -F, '/task-clock/ {print $1 / 1000}' "$tmp/perf")
        echo "$wall $cpu" >> "$tmp/$b"
    done
done
echo "load after: $(uptime)"
/usr/bin/python3 - "$tmp" <<'PY'
import statistics, sys
d = sys.argv[1]
def load(b):
    rows = [l.split() for l in open(f"{d}/{b}") if len(l.split()) == 2]
    return [float(r[0]) for r in rows], [float(r[1]) for r in rows]
bw, bc = load("before"); aw, ac = load("after")
m = statistics.median
print(f"runs: {len(bw)} before, {len(aw)} after (alternating)")
print(f"load wall_s median: before {m(bw):.4f}, after {m(aw):.4f}, after/before {m(aw)/m(bw):.3f}; "
      f"min: before {min(bw):.4f}, after {min(aw):.4f}, after/before {min(aw)/min(bw):.3f}")
print(f"CPU s (task-clock) median: before {m(bc):.4f}, after {m(ac):.4f}, after/before {m(ac)/m(bc):.3f}")
PY
