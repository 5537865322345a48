#!/bin/bash
# The replica benchmark of `sluice serve` (docs/serve.md "Replicas"): 16
# client processes each stream a whole model once (StreamTensors, every
# tensor checked against the trusted manifest by the client), against one
# replica and against three (the client's replica list: round_robin, health
# checked); aggregate throughput and each client's time (p50, p90); then
# three with one killed (SIGKILL) 2 s in. Servers
# and clients on this machine, the servers warm (their pools filled and
# verified by an untimed pass each).
# usage: tools/serve/bench_replicas.sh [BUILD_DIR] [CLIENTS] [MODEL_MIB]
#   (defaults: build, 16, 256; a release build, not the ASan one)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
B=${1:-build}
N=${2:-16}
MIB=${3:-256}
work=build-bench-replicas
mkdir -p "$work"
m=$work/model.safetensors
bytes=$((MIB / 8 * 8388608))
if [ ! -f "$work/model.$bytes" ]; then
    rm -f "$work"/model.*
    specs=()
    for i in $(seq 0 $((MIB / 8 - 1))); do specs+=("w$i:8388608"); done
    /usr/bin/python3 tests/serve/mkmodel.py "$m" "${specs[@]}"
    "$B/sluice" manifest "$m" -q -o "$m.manifest.json"
    touch "$work/model.$bytes"
fi
echo "model: $((bytes >> 20)) MiB of 8 MiB U8 tensors; $N clients; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"

spids=()
trap 'for p in "${spids[@]}"; do kill -TERM "$p" 2>/dev/null; done
      for p in "${spids[@]}"; do wait "$p" 2>/dev/null; done' EXIT
start() { # start K: replica K (in this shell: its pid in spids); sets ADDR
    "$B/sluice-serve" "$m" --listen 127.0.0.1:0 --pool 1G --max-streams-per-client 64 \
        --max-connections-per-address 64 --max-streams 256 >"$work/s$1.out" 2>"$work/s$1.err" &
    spids+=($!)
    for _ in $(seq 300); do grep -q '^listening' "$work/s$1.out" && break; sleep 0.1; done
    ADDR=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$work/s$1.out")
}

run() { # run LABEL TARGET [PID]: N clients at once; aggregate MB/s, per-client
    # p50/p90; PID: a replica killed (SIGKILL) 2 s in
    local label=$1 target=$2 victim=${3:-} i pids=() t0 t1
    rm -f "$work"/t.*
    t0=$(date +%s%N)
    for i in $(seq "$N"); do
        (a=$(date +%s%N)
         "$B/serve_client" "$target" fetch model.safetensors --stream --manifest "$m.manifest.json" \
             -q 2>"$work/c$i.err"
         echo $((($(date +%s%N) - a) / 1000000)) >"$work/t.$i") &
        pids+=($!)
    done
    if [ -n "$victim" ]; then
        sleep 2
        { kill -KILL "$victim"; wait "$victim"; } 2>/dev/null || true
    fi
    for p in "${pids[@]}"; do wait "$p"; done
    t1=$(date +%s%N)
    if grep -L '0 mismatches' "$work"/c*.err | grep -q .; then
        echo "$label: a client failed:"; grep -h -v '0 mismatches' "$work"/c*.err | head; exit 1
    fi
    cat "$work"/t.* | sort -n | awk -v n="$N" -v b="$bytes" -v s="$(( (t1 - t0) / 1000000 ))" -v l="$label" '
        { t[NR] = $1 }
        END { p50 = t[int((NR - 1) * 0.5) + 1]; p90 = t[int((NR - 1) * 0.9) + 1];
              printf "%-12s %2d clients: %.2f GB in %.2f s: aggregate %.0f MB/s; per client p50 %.2f s, p90 %.2f s (%.0f MB/s at p50)\n",
                     l, n, n * b / 1e9, s / 1000, n * b / (s / 1000) / 1e6, p50 / 1000, p90 / 1000, b / (p50 / 1000) / 1e6 }'
}

start 1
a1=$ADDR
"$B/serve_client" "$a1" fetch model.safetensors --stream -q 2>/dev/null  # warm
run "1 replica" "$a1"
start 2
a2=$ADDR
start 3
a3=$ADDR
for a in "$a2" "$a3"; do "$B/serve_client" "$a" fetch model.safetensors --stream -q 2>/dev/null; done
run "3 replicas" "$a1,$a2,$a3"
run "1 replica" "$a1"
run "3 replicas" "$a1,$a2,$a3"
# The same with the third replica killed (SIGKILL) 2 s in: its calls resume
# on the other two.
run "3, 1 killed" "$a1,$a2,$a3" "${spids[2]}"
echo "   failovers in that run: $(cat "$work"/c*.err | grep -c '^failover')"
