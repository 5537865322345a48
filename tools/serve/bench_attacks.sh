#!/bin/bash
# The attacks of issue 36 on `sluice serve`, at full size, against one or
# two builds (before/after a change, same run): for each attack a fresh
# server with the default limits and a token; the attack; an authenticated
# GetTensor (1 MiB) every 0.5 s beside it and one after it; the server's
# peak RSS (VmHWM), its RSS after, the refusals counted.
#   reset 300000 / 2000000   one connection without a token: HEADERS +
#                            DATA(END_STREAM) + RST_STREAM of StreamTensors
#   ping 16 x 3000000        16 connections from one address, PINGs, never read
#   settings 16 x 1000000    the same with empty SETTINGS frames
#   idle 64                  16 connections from each of 127.0.0.2-5, the
#                            preface, then nothing (held 20 s)
# An attack is stopped when the server's RSS passes BENCH_RSS_CAP_MIB
# (default 3072: the machine is shared), and the row says so.
# usage: tools/serve/bench_attacks.sh BUILD_DIR [BUILD_DIR_BEFORE]
#   BENCH_ATTACKS="idle 64;reset 300000": only these rows
#   (Release builds with sluice-serve, serve_client and sluice in them)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
ATTACK=("$PY" "$root/tests/serve/h2attack.py")
cap_kib=$((${BENCH_RSS_CAP_MIB:-3072} * 1024))
work=$(mktemp -d /tmp/sluice-bench-attacks.XXXXXX)
spid=""
apids=()
trap 'kill -KILL $spid "${apids[@]}" 2>/dev/null; rm -rf "$work"' EXIT

"$PY" "$root/tests/serve/mkmodel.py" "$work/model.safetensors" w:1048576 m:4096 || exit 1
"$1/sluice" manifest "$work/model.safetensors" -q -o "$work/model.safetensors.manifest.json" || exit 1
printf 'bench-token\n' >"$work/token"

kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null; }

# probe BUILD: one authenticated GetTensor of w; prints its seconds, or
# "failed".
probe() {
    local t0 t1
    t0=$(date +%s.%N)
    if timeout 30 "$1/serve_client" "$addr" get model.safetensors w --token "$work/token" \
        -o /dev/null -q >/dev/null 2>&1; then
        t1=$(date +%s.%N)
        echo "$t1 - $t0" | bc | awk '{printf "%.2f", $1}'
    else
        echo failed
    fi
}

# run LABEL BUILD ATTACK ARGS...: one row.
run() {
    local label=$1 b=$2 what=$3
    shift 3
    "$b/sluice-serve" "$work/model.safetensors" --token-file "$work/token" --metrics-port 0 \
        --listen 127.0.0.1:0 -q >"$work/serve.out" 2>"$work/serve.err" &
    spid=$!
    local i
    for i in $(seq 300); do grep -q '^listening' "$work/serve.out" && break; sleep 0.1; done
    addr=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$work/serve.out")
    local mport r0
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$work/serve.out")
    r0=$(kib $spid VmRSS)
    local t0
    t0=$(date +%s.%N)
    apids=()
    if [ "$what" = idle ]; then
        for i in 2 3 4 5; do
            "${ATTACK[@]}" idle "$addr" 16 --from 127.0.0.$i --hold 20 >"$work/attack.$i" 2>&1 &
            apids+=($!)
        done
        # The probes begin once every slot is held (an attacker connection
        # refused for an early probe would leave one free).
        for i in $(seq 300); do
            [ "$(cat "$work"/attack.* 2>/dev/null | grep -c '^connected')" -eq 4 ] && break
            sleep 0.1
        done
    else
        "${ATTACK[@]}" "$what" "$addr" "$@" >"$work/attack.out" 2>&1 &
        apids+=($!)
    fi
    alive() { local a; for a in "${apids[@]}"; do kill -0 "$a" 2>/dev/null && return 0; done; return 1; }
    local worst=0 fails=0 n=0 p capped="" a
    while alive; do
        p=$(probe "$b")
        n=$((n + 1))
        if [ "$p" = failed ]; then fails=$((fails + 1)); else
            worst=$(echo "$p $worst" | awk '{print ($1 > $2) ? $1 : $2}')
        fi
        if [ "$(kib $spid VmRSS)" -gt $cap_kib ]; then
            capped=" (stopped at the RSS cap)"
            for a in "${apids[@]}"; do kill -KILL "$a" 2>/dev/null; done
            break
        fi
        sleep 0.5
    done
    for a in "${apids[@]}"; do wait "$a" 2>/dev/null; done
    local secs
    secs=$(echo "$(date +%s.%N) - $t0" | bc | awk '{printf "%.1f", $1}')
    local after hwm rss refused
    after=$(probe "$b")
    hwm=$(kib $spid VmHWM)
    rss=$(kib $spid VmRSS)
    refused=$(timeout 10 curl -sf "http://127.0.0.1:$mport/metrics" |
        awk '/^sluice_serve_connections_refused_total/ && $2 != 0 {sub(/.*reason="/, "", $1); sub(/"}/, "", $1); printf "%s%s=%s", s, $1, $2; s=" "}')
    local result
    result=$(cat "$work"/attack.* 2>/dev/null | tail -4 | tr '\n' ' ')
    printf '| %s | %s %s | %d -> %d MiB%s | %d MiB | %s s, %d of %d failed | %s | %s | %s | %s s |\n' \
        "$label" "$what" "$*" $((r0 / 1024)) $((hwm / 1024)) "$capped" $((rss / 1024)) "$worst" \
        "$fails" "$n" "$after" "${refused:-none}" "$result" "$secs"
    rm -f "$work"/attack.*
    kill -KILL $spid 2>/dev/null
    wait $spid 2>/dev/null
}

echo "| build | attack | RSS before -> peak | RSS after | probe during: worst, failed | probe after | refused | attack's result | time |"
echo "|---|---|---|---|---|---|---|---|---|"
: "${BENCH_ATTACKS:=reset 300000;reset 2000000;ping 3000000 --conns 16;ping 1000000 --conns 16 --settings;idle 64}"
IFS=';' read -ra specs <<<"$BENCH_ATTACKS"
for spec in "${specs[@]}"; do
    [ $# -ge 2 ] && run before "$2" $spec
    run after "$1" $spec
done
exit 0
