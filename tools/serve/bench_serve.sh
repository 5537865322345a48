#!/bin/bash
# The benchmark of `sluice serve` (README "sluice serve"): on the
# llama-3.2-1b synthetic preset, warm, server and clients on this machine.
#  - the library's local verified stream (sluice bench --verify on), the reference;
#  - one client streaming the whole model through the service (StreamTensors,
#    every tensor checked against its manifest digest by the client);
#  - 1, 4 and 16 concurrent client processes: aggregate throughput;
#  - GetTensor latency (p50/p99) of a 1 MiB tensor while 16 clients stream;
#  - the server's peak RSS and CPU time per byte sent.
# usage: tools/serve/bench_serve.sh [BUILD_DIR]   (default build; a release
# build: RelWithDebInfo, not the ASan one). Needs ~3 GB of disk in build-bench/.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
B=${1:-build}
work=build-bench
mkdir -p "$work/root"
if [ ! -f "$work/root/llama/sluice.manifest.json" ]; then
    "$B/sluice" synth llama-3.2-1b "$work/root/llama" --shards 2 >/dev/null
fi
if [ ! -f "$work/root/probe/model.safetensors" ]; then
    mkdir -p "$work/root/probe"
    /usr/bin/python3 tests/serve/mkmodel.py "$work/root/probe/model.safetensors" mib:1048576
    "$B/sluice" manifest "$work/root/probe/model.safetensors" -q -o "$work/root/probe/sluice.manifest.json"
fi
bytes=$(du -cb "$work"/root/llama/*.safetensors | tail -1 | cut -f1)
echo "model: llama-3.2-1b synthetic, $bytes bytes in 2 shards"

echo "== the library's local verified stream (sluice bench --verify on, warm)"
"$B/sluice" bench "$work/root/llama" --verify on --baselines none --whole-process off \
    --runs 3 2>/dev/null | sed -n '1,40p' | grep -Ei 'verify|MB/s|GB/s|stream' | head -8

"$B/sluice-serve" "$work/root" --listen 127.0.0.1:0 --pool 4G --stall-timeout 600 \
    --max-streams-per-client 64 >"$work/server.out" 2>"$work/server.err" &
spid=$!
trap 'kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null' EXIT
for _ in $(seq 300); do grep -q '^listening' "$work/server.out" && break; sleep 0.1; done
addr=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$work/server.out")
cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/$spid/stat"; }

echo "== warm-up: one untimed pass loads and verifies the model into the server's pool"
"$B/serve_client" "$addr" fetch llama --stream -q

run_clients() { # N: N concurrent clients stream the whole model once
    local n=$1 i pids=() c0 t0 t1 c1
    c0=$(cpu_s)
    t0=$(date +%s.%N)
    for i in $(seq "$n"); do
        "$B/serve_client" "$addr" fetch llama --stream -q 2>"$work/c$n.$i.err" &
        pids+=($!)
    done
    if [ "$n" -ge 4 ]; then
        sleep 1
        "$B/serve_client" "$addr" latency probe mib --repeat 200 >"$work/lat$n.txt" || true
    fi
    for p in "${pids[@]}"; do wait "$p"; done
    t1=$(date +%s.%N)
    c1=$(cpu_s)
    awk -v n="$n" -v b="$bytes" -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" 'BEGIN {
        s = t1 - t0; tot = n * b;
        printf "%2d client(s): %.2f GB in %.2f s: aggregate %.0f MB/s (%.0f MB/s per client); server CPU %.2f s = %.2f ns/byte\n",
            n, tot / 1e9, s, tot / s / 1e6, tot / s / 1e6 / n, c1 - c0, (c1 - c0) * 1e9 / tot }'
    [ "$n" -ge 4 ] && sed "s/^/   while $n stream: /" "$work/lat$n.txt"
    return 0
}
echo "== through the service (StreamTensors, 1 MiB chunks, each tensor checked by the client)"
for n in 1 4 16; do run_clients "$n"; done
echo "== GetTensor 1 MiB with no other load"
"$B/serve_client" "$addr" latency probe mib --repeat 200
echo "server peak RSS (VmHWM): $(awk '/^VmHWM/ {print $2, $3}' "/proc/$spid/status")"
