#!/bin/bash
# The tests of `sluice serve` (tools/serve/serve.cc): the real server
# process on 127.0.0.1 (port 0: the server prints the port it bound), real
# gRPC clients (examples/serve_client.cc). Every wait is bounded; every
# server started is stopped at the end, also on failure.
# usage: serve_test.sh BUILD_DIR REAL_DATA_DIR CASE
#   CASE: fetch | errors | security | shutdown | load | transport | flood | replicas
#         | remote | balance | attack_reset | attack_control | attack_idle
#         | attack_halfclose (tests/serve/attack_cases.sh)
set -u
B=$1
REAL=$2
CASE=$3
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SERVE=$B/sluice-serve
CLIENT=$B/serve_client
SLUICE=$B/sluice
SERVE_CMD=("$SERVE")
T=$(mktemp -d "${TMPDIR:-/tmp}/sluice-serve-test.XXXXXX")
PIDS=()
FAILS=0
PASSES=0

PGIDS=()  # process groups (setsid) stopped whole: a script and its children

cleanup() {
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    for g in "${PGIDS[@]}"; do
        kill -KILL -- "-$g" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

ok() { PASSES=$((PASSES + 1)); echo "ok - $*"; }
bad() { FAILS=$((FAILS + 1)); echo "FAIL - $*"; }

# start_server NAME ARGS...: starts the server in the background, waits (at
# most 120 s, for a loaded machine) for its "listening on" line; sets SPID
# and ADDR.
start_server() {
    local name=$1
    shift
    "${SERVE_CMD[@]}" "$@" --listen "${LISTEN:-127.0.0.1:0}" >"$T/$name.out" 2>"$T/$name.err" &
    SPID=$!
    PIDS+=("$SPID")
    local i
    for i in $(seq 1200); do
        if grep -q '^listening on ' "$T/$name.out" 2>/dev/null; then
            ADDR=$(sed -n 's/^listening on \([^ ]*\).*/\1/p' "$T/$name.out")
            return 0
        fi
        if ! kill -0 "$SPID" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    echo "server $name did not start:"
    cat "$T/$name.out" "$T/$name.err"
    exit 1
}

# term_wait SECONDS: SIGTERM to the server, then waits at most SECONDS for
# it (killed past that, a failure); sets RC to its exit status.
term_wait() {
    local i
    kill -TERM "$SPID" 2>/dev/null
    for i in $(seq $(($1 * 10))); do
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$SPID" 2>/dev/null; then
        bad "server still running $1 s after SIGTERM"
        kill -KILL "$SPID"
    fi
    wait "$SPID"
    RC=$?
}

# stopped_secs NAME: the seconds from the signal to the server's stop, as
# the server itself measured them ("stopped (X s after the signal)"): what
# its --grace promises, apart from the exit that follows (an ASan build's
# leak check) and this script's polling, which a loaded machine stretches.
stopped_secs() {
    sed -n 's/.*stopped (\([0-9.]*\) s after the signal).*/\1/p' "$T/$1.err" | tail -1
}

# stop_server NAME: SIGTERM, then waits at most 30 s; the exit status must be 0.
stop_server() {
    local name=$1 rc
    term_wait 30
    rc=$RC
    if [ $rc -eq 0 ]; then ok "server $name exits 0 on SIGTERM"; else
        bad "server $name exited $rc"
        tail -30 "$T/$name.err"
    fi
}

# refused_start NAME PATTERN DESCRIPTION SERVER-ARGS...: the server must
# exit 2 at start (at most 60 s) with PATTERN (grep -E) on stderr.
refused_start() {
    local name=$1 pattern=$2 what=$3 rc
    shift 3
    timeout 60 "$SERVE" "$@" --listen 127.0.0.1:0 >"$T/$name.out" 2>"$T/$name.err"
    rc=$?
    if [ $rc -eq 2 ] && grep -qE -- "$pattern" "$T/$name.err"; then ok "$what (exit 2: $(head -c 160 "$T/$name.err"))"; else
        bad "$what: exit $rc, stderr: $(head -c 300 "$T/$name.err")"
    fi
}

# expect RC DESCRIPTION CLIENT-ARGS...: runs the client (at most 120 s).
expect() {
    local want=$1 what=$2
    shift 2
    timeout 120 "$CLIENT" "$@" >"$T/client.out" 2>"$T/client.err"
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$what (exit $rc)"; else
        bad "$what: exit $rc, want $want"
        tail -5 "$T/client.err"
    fi
}

# A root with every real file and the sharded set, their manifests, and a
# synthetic sharded model.
make_root() {
    local root=$1 f
    if [ ! -d "$REAL" ]; then
        echo "skipped: the real-world corpus $REAL is absent"
        exit 77
    fi
    mkdir -p "$root"
    cp "$REAL"/*.safetensors "$root"/
    cp -r "$REAL"/SafeTensors.jl__sharded "$root"/
    chmod -R u+w "$root"
    for f in "$root"/*.safetensors; do
        "$SLUICE" manifest "$f" -q -o "$f.manifest.json" || exit 1
    done
    "$SLUICE" manifest "$root/SafeTensors.jl__sharded" -q \
        -o "$root/SafeTensors.jl__sharded/sluice.manifest.json" || exit 1
    "$SLUICE" synth tiny "$root/synth-sharded" --shards 3 >/dev/null 2>&1 || exit 1
}

# A model of a few large U8 tensors (flow control needs more than the
# HTTP/2 windows), with its manifest.
make_big() {
    local dir=$1
    shift
    mkdir -p "$dir"
    /usr/bin/python3 "$SRC/tests/serve/mkmodel.py" "$dir/model.safetensors" "$@" || exit 1
    "$SLUICE" manifest "$dir/model.safetensors" -q -o "$dir/model.safetensors.manifest.json" || exit 1
    # Served as a directory of one file, its sidecar model.safetensors.manifest.json
    # is found (after sluice.manifest.json, which is not there): the server
    # requires a manifest, so each case that serves it checks that.
}

models_of() { ls "$1" | grep -v '\.manifest\.json$'; }

case_fetch() {
    make_root "$T/root"
    start_server fetch "$T/root"
    local n
    n=$(timeout 30 "$CLIENT" "$ADDR" list | wc -l)
    [ "$n" -eq "$(models_of "$T/root" | wc -l)" ] && ok "ListModels lists $n models" ||
        bad "ListModels lists $n models"
    for m in $(models_of "$T/root"); do
        expect 0 "$m: every tensor by GetTensor, three ranges each, equal to the local bytes and digests" \
            "$ADDR" fetch "$m" --ranges --compare "$T/root/$m" -q
        expect 0 "$m: every tensor by StreamTensors (64 KiB chunks) equal to the local bytes" \
            "$ADDR" fetch "$m" --stream --chunk 65536 --compare "$T/root/$m" -q
    done
    # One model served alone (ROOT_OR_MODEL a directory with an index),
    # through the sluice command's `serve`.
    stop_server fetch
    SERVE_CMD=("$SLUICE" serve)
    start_server one "$T/root/synth-sharded"
    SERVE_CMD=("$SERVE")
    expect 0 "one model served alone by 'sluice serve'" "$ADDR" fetch synth-sharded --compare "$T/root/synth-sharded" -q
    stop_server one
}

case_errors() {
    make_root "$T/root"
    # A symlink out of the root, and a model outside it.
    mkdir -p "$T/outside"
    cp "$REAL/mnist-tinygrad__model.safetensors" "$T/outside/secret.safetensors"
    "$SLUICE" manifest "$T/outside/secret.safetensors" -q -o "$T/outside/secret.safetensors.manifest.json"
    # Symlinked with a manifest that names the link (and a directory model
    # outside with its own): were the start-time check gone, both would be
    # served, not NOT_FOUND.
    cp "$REAL/mnist-tinygrad__model.safetensors" "$T/outside/escape.safetensors"
    "$SLUICE" manifest "$T/outside/escape.safetensors" -q -o "$T/outside/escape.safetensors.manifest.json"
    ln -s "$T/outside/escape.safetensors" "$T/root/escape.safetensors"
    ln -s "$T/outside/escape.safetensors.manifest.json" "$T/root/escape.safetensors.manifest.json"
    mkdir -p "$T/outside/dirmodel"
    cp "$REAL/mnist-tinygrad__model.safetensors" "$T/outside/dirmodel/model.safetensors"
    "$SLUICE" manifest "$T/outside/dirmodel" -q -o "$T/outside/dirmodel/sluice.manifest.json"
    ln -s "$T/outside/dirmodel" "$T/root/escape-dir"
    # Inside model directories of the root: a file symlinked out of the
    # root (its manifest, made through the link, inside), a manifest
    # symlinked out of the root (the file inside), and a file symlinked
    # to another file of the root (served).
    mkdir -p "$T/root/linked" "$T/root/linked-manifest" "$T/root/linked-inside"
    ln -s "$T/outside/escape.safetensors" "$T/root/linked/model.safetensors"
    "$SLUICE" manifest "$T/root/linked" -q -o "$T/root/linked/sluice.manifest.json"
    cp "$REAL/mnist-tinygrad__model.safetensors" "$T/root/linked-manifest/model.safetensors"
    "$SLUICE" manifest "$T/root/linked-manifest" -q -o "$T/outside/linked-manifest.json"
    ln -s "$T/outside/linked-manifest.json" "$T/root/linked-manifest/sluice.manifest.json"
    ln -s "$T/root/mnist-tinygrad__model.safetensors" "$T/root/linked-inside/model.safetensors"
    "$SLUICE" manifest "$T/root/linked-inside" -q -o "$T/root/linked-inside/sluice.manifest.json"
    # A tampered tensor on the server's disk (its manifest made before).
    make_big "$T/root/tampered" a:100000 b:200000 c:300000
    /usr/bin/python3 - "$T/root/tampered/model.safetensors" <<'EOF'
import struct, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    f.seek(8 + n + 100000 + 12345)   # inside tensor b
    x = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([x[0] ^ 0xFF]))
EOF
    start_server errors "$T/root" --metrics-port 0
    grep -q 'escape.safetensors: refused' "$T/errors.err" && ok "symlink out of the root refused at start" ||
        bad "symlink out of the root not refused"
    expect 105 "symlinked model out of the root: NOT_FOUND" "$ADDR" info escape.safetensors
    expect 105 "symlinked directory out of the root: NOT_FOUND" "$ADDR" info escape-dir
    grep -q "linked: refused, its file $T/outside/escape.safetensors resolves outside the root" "$T/errors.err" &&
        ok "a model directory's file symlinked out of the root: refused at start, named" ||
        bad "file symlinked out of a model directory not refused: $(grep linked "$T/errors.err")"
    expect 105 "a model directory's file symlinked out of the root: NOT_FOUND" "$ADDR" info linked
    grep -q "linked-manifest: refused, its manifest $T/outside/linked-manifest.json resolves outside" "$T/errors.err" &&
        ok "a model directory's manifest symlinked out of the root: refused at start" ||
        bad "manifest symlinked out of a model directory not refused"
    expect 105 "a model directory's manifest symlinked out of the root: NOT_FOUND" "$ADDR" info linked-manifest
    expect 0 "a model directory's file symlinked to a file inside the root: served" \
        "$ADDR" fetch linked-inside --compare "$T/root/linked-inside" -q
    for name in ../outside . .. /etc/passwd "synth-sharded/../synth-sharded" "a/b" ".hidden" \
        "../$(basename "$T")/outside/secret.safetensors"; do
        expect 103 "model name '$name': INVALID_ARGUMENT" "$ADDR" info "$name"
    done
    expect 105 "unknown model: NOT_FOUND" "$ADDR" info no-such-model
    expect 105 "unknown tensor: NOT_FOUND" "$ADDR" get synth-sharded no.such.tensor
    local m=synth-sharded t=model.embed_tokens.weight
    local nb
    nb=$("$CLIENT" "$ADDR" info $m | awk -F'\t' -v t=$t '$1 == t {print $4}')
    [ -n "$nb" ] || bad "no size for $t"
    expect 0 "range: whole by offset 0 length 0" "$ADDR" get $m $t --offset 0 --length 0 --compare "$T/root/$m"
    expect 0 "range: last byte" "$ADDR" get $m $t --offset $((nb - 1)) --length 1 --compare "$T/root/$m"
    expect 0 "range: empty at the end" "$ADDR" get $m $t --offset "$nb" --length 0
    expect 0 "range: odd middle, 4 KiB chunks" "$ADDR" get $m $t --offset 777 --length 29999 --chunk 4096 --compare "$T/root/$m"
    expect 103 "range: offset past the end: INVALID_ARGUMENT" "$ADDR" get $m $t --offset $((nb + 1)) --length 0
    expect 103 "range: length past the end: INVALID_ARGUMENT" "$ADDR" get $m $t --offset 1 --length "$nb"
    expect 103 "range: length overflowing: INVALID_ARGUMENT" "$ADDR" get $m $t --offset 8 --length 18446744073709551615
    # A manifest the caller trusts (--manifest): the model verified against
    # it, a range fetched whole, checked and sliced; a trusted manifest with
    # a tensor GetModel does not list (what a server leaves out would pass
    # without it), one lacking a tensor GetModel lists, one digest altered:
    # each a mismatch (exit 1) naming the tensor.
    local tm="$T/root/$m/sluice.manifest.json"
    expect 0 "trusted manifest: every tensor by GetTensor" "$ADDR" fetch $m --manifest "$tm" -q
    expect 0 "trusted manifest: StreamTensors" "$ADDR" fetch $m --stream --manifest "$tm" -q
    expect 0 "trusted manifest: a range, fetched whole and sliced" "$ADDR" get $m $t --offset 777 \
        --length 29999 --manifest "$tm" --compare "$T/root/$m"
    /usr/bin/python3 - "$tm" "$T" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
more = json.loads(json.dumps(doc))
more["tensors"]["model.extra.weight"] = more["tensors"]["model.norm.weight"]
json.dump(more, open(sys.argv[2] + "/more.json", "w"))
del doc["tensors"]["model.norm.weight"]
json.dump(doc, open(sys.argv[2] + "/fewer.json", "w"))
doc = json.load(open(sys.argv[1]))
doc["tensors"]["model.norm.weight"]["digest"] = "00" * 32
json.dump(doc, open(sys.argv[2] + "/altered.json", "w"))
EOF
    expect 1 "trusted manifest lists a tensor GetModel does not" "$ADDR" fetch $m --stream --manifest "$T/more.json" -q
    grep -q 'MISMATCH model.extra.weight: in the trusted manifest, not listed' "$T/client.err" &&
        ok "the tensor left out is named" || bad "mismatch message: $(cat "$T/client.err")"
    expect 1 "trusted manifest lacks a tensor GetModel lists" "$ADDR" fetch $m --manifest "$T/fewer.json" -q
    expect 1 "trusted manifest with an altered digest" "$ADDR" get $m model.norm.weight --manifest "$T/altered.json"
    expect 103 "chunk_bytes 100: INVALID_ARGUMENT" "$ADDR" get $m $t --chunk 100
    expect 103 "chunk_bytes 8 MiB: INVALID_ARGUMENT" "$ADDR" get $m $t --chunk 8388608
    expect 115 "tampered tensor on the server's disk: DATA_LOSS" "$ADDR" get tampered b
    grep -q 'DATA_LOSS: .*b' "$T/client.err" && ok "DATA_LOSS carries the library's message" ||
        bad "DATA_LOSS message: $(cat "$T/client.err")"
    expect 0 "untampered tensors of that model still served" "$ADDR" get tampered c
    expect 115 "StreamTensors over the tampered tensor: DATA_LOSS" "$ADDR" fetch tampered --stream
    # /metrics: the library's families of every model and the server's own.
    local mport
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/errors.out")
    if timeout 20 curl -sf "http://127.0.0.1:$mport/metrics" >"$T/metrics.txt"; then
        local want
        for want in 'sluice_serve_calls_total{method="GetTensor",code="NOT_FOUND"} [1-9]' \
            'sluice_serve_calls_total{method="GetTensor",code="DATA_LOSS"} [1-9]' \
            'sluice_serve_calls_total{method="GetModel",code="INVALID_ARGUMENT"} [1-9]' \
            'sluice_serve_call_duration_seconds_bucket{method="GetTensor",le="+Inf"} [1-9]' \
            'sluice_serve_bytes_sent_total [1-9]' 'sluice_serve_active_streams 0' \
            'sluice_serve_refused_total{reason="name"} [1-9]' \
            'sluice_checksum_failures_total{model="tampered"} [1-9]' \
            'sluice_bytes_delivered_total{model="synth-sharded"} [1-9]'; do
            grep -q "^$want" "$T/metrics.txt" && ok "/metrics: $want" || bad "/metrics lacks $want"
        done
        if command -v promtool >/dev/null; then
            promtool check metrics <"$T/metrics.txt" >"$T/promtool.out" 2>&1 &&
                ok "/metrics passes promtool check metrics" ||
                { bad "promtool: $(head -5 "$T/promtool.out")"; }
        fi
        # OpenMetrics when the scrape asks for it (Accept), by the library's
        # one rule (sluice_metrics_format_for_accept): the models' families
        # and the server's own, counters named without _total, one "# EOF"
        # and last. Before: the text format 0.0.4 whatever was asked.
        if timeout 20 curl -sf -D "$T/om.head" -H 'Accept: application/openmetrics-text; version=1.0.0' \
            "http://127.0.0.1:$mport/metrics" >"$T/om.txt"; then
            grep -qi '^content-type: application/openmetrics-text; version=1.0.0' "$T/om.head" &&
                ok "/metrics with Accept: application/openmetrics-text: OpenMetrics' content type" ||
                bad "/metrics OpenMetrics content type: $(grep -i '^content-type' "$T/om.head")"
            [ "$(tail -n 1 "$T/om.txt")" = "# EOF" ] && [ "$(grep -c '^# EOF$' "$T/om.txt")" = 1 ] &&
                ok "OpenMetrics: one # EOF, last" || bad "OpenMetrics: # EOF lines: $(grep -c '^# EOF' "$T/om.txt"), last: $(tail -n 1 "$T/om.txt")"
            grep -q '^# TYPE sluice_serve_calls counter$' "$T/om.txt" &&
                grep -q '^# TYPE sluice_checksum_failures counter$' "$T/om.txt" &&
                grep -q '^sluice_serve_calls_total{method="GetTensor",code="NOT_FOUND"} [1-9]' "$T/om.txt" &&
                ! grep -q '^# TYPE [a-z_]*_total counter' "$T/om.txt" &&
                ok "OpenMetrics: the server's and the models' counter families without _total" ||
                bad "OpenMetrics families: $(grep '^# TYPE .*counter' "$T/om.txt" | head -4)"
        else
            bad "/metrics (Accept: application/openmetrics-text) not served"
        fi
        # Its bounds against slow and wrong clients, those of the library's
        # endpoint (the same script as metrics_http_limits): POST with a
        # body 405 + Allow, slow clients cut by the 5 s whole-request
        # deadline, 8 per client address.
        if timeout 60 /usr/bin/python3 "$SRC/tests/metrics/http_limits.py" "$mport" >"$T/limits.out" 2>&1; then
            ok "/metrics bounds (tests/metrics/http_limits.py): $(grep -c '^ok' "$T/limits.out") checks"
        else
            bad "/metrics bounds: $(grep -v '^ok' "$T/limits.out" | head -8)"
        fi
    else
        bad "/metrics not served on port $mport"
    fi
    stop_server errors

    # ROOT_OR_MODEL the model directory itself: no root, its symlinks are
    # the operator's (a Hugging Face snapshot links into ../../blobs).
    start_server single "$T/root/linked"
    expect 0 "the same directory served as the model itself: its symlink is followed" \
        "$ADDR" fetch linked --compare "$T/root/linked" -q
    stop_server single

    # --pool smaller than the largest tensor: said at start, with the
    # model, the tensor and both sizes; that tensor RESOURCE_EXHAUSTED.
    make_big "$T/small-pool" big:8388608 little:4096
    start_server pool "$T/small-pool" --pool 4M
    grep -q "warning: small-pool: tensor big is 8388608 bytes, more than the model's pool (4194304 bytes" "$T/pool.err" &&
        ok "--pool under the largest tensor: warned at start" || bad "no --pool warning: $(cat "$T/pool.err")"
    expect 108 "the tensor larger than the pool: RESOURCE_EXHAUSTED" "$ADDR" get small-pool big
    expect 0 "the others served" "$ADDR" get small-pool little
    stop_server pool

    # A model served without a manifest (--allow-unverified): GetModel has
    # no digests, so the client cannot say "verified" (exit 1) unless told
    # to accept that (--allow-unverified).
    mkdir -p "$T/unverified"
    cp "$REAL/mnist-tinygrad__model.safetensors" "$T/unverified/plain.safetensors"
    start_server unverified "$T/unverified/plain.safetensors" --allow-unverified
    expect 1 "no manifest digest: fetch is not verified" "$ADDR" fetch plain.safetensors -q
    expect 1 "no manifest digest: fetch --stream is not verified" "$ADDR" fetch plain.safetensors --stream -q
    expect 0 "no manifest digest, --allow-unverified: fetched" "$ADDR" fetch plain.safetensors -q --allow-unverified
    stop_server unverified

    # The server-side fault hook: a sent chunk corrupted; the client's
    # end-to-end check must catch it.
    SLUICE_SERVE_TEST_CORRUPT_CHUNK=model.norm.weight start_server fault "$T/root/synth-sharded"
    expect 1 "corrupted chunk in flight: the client's digest check fails" "$ADDR" get synth-sharded model.norm.weight
    grep -q 'MISMATCH model.norm.weight: sha256' "$T/client.err" && ok "mismatch reported against the manifest digest" ||
        bad "mismatch message: $(cat "$T/client.err")"
    expect 1 "corrupted chunk in StreamTensors: the client's check fails" "$ADDR" fetch synth-sharded --stream -q
    stop_server fault
}

case_security() {
    make_root "$T/root"
    local m=synth-sharded
    # Token.
    printf 's3cret-token\n' >"$T/token"
    printf 'wrong-token\n' >"$T/wrong"
    start_server token "$T/root/$m" --token-file "$T/token"
    expect 116 "no token: UNAUTHENTICATED" "$ADDR" list
    expect 116 "wrong token: UNAUTHENTICATED" "$ADDR" list --token "$T/wrong"
    # Same length, one byte off; a prefix; the token and more: the bytes
    # are compared, not the length or a prefix.
    printf 's3cret-tokem\n' >"$T/samelen"
    printf 's3cret\n' >"$T/prefix"
    printf 's3cret-token-and-more\n' >"$T/longer"
    for w in samelen prefix longer; do
        expect 116 "token $w: UNAUTHENTICATED" "$ADDR" list --token "$T/$w"
    done
    expect 116 "GetTensor without the token: UNAUTHENTICATED" "$ADDR" get $m model.norm.weight --token "$T/wrong"
    expect 0 "with the token: served and verified" "$ADDR" fetch $m --token "$T/token" -q
    grep -q 'refused .*no valid token' "$T/token.err" && ok "refusal logged" || bad "refusal not logged"
    stop_server token
    # One rule for the token file (server and clients): ASCII whitespace,
    # a tab too, off both ends.
    printf ' \ts3cret-token\t\r\n' >"$T/token-ws"
    start_server token-ws "$T/root/$m" --token-file "$T/token-ws"
    expect 0 "token file with spaces and tabs around it: the bare token is served" "$ADDR" list --token "$T/token"
    expect 0 "the same file given to the client" "$ADDR" list --token "$T/token-ws"
    stop_server token-ws
    refused_start token-dir "--token-file $T: is a directory" "a directory as --token-file: said so" \
        "$T/root/$m" --token-file "$T"
    printf '\n \t\n' >"$T/token-blank"
    refused_start token-blank "is empty" "a token file of whitespace: empty" "$T/root/$m" --token-file "$T/token-blank"
    printf 'two\tparts\n' >"$T/token-tab"
    refused_start token-tab "not visible ASCII" "a tab inside the token: refused at start" \
        "$T/root/$m" --token-file "$T/token-tab"
    # gRPC bounds a call's metadata at 8 KiB: a token of 4096 bytes is
    # served, a longer one refused at start (before: a 12000-byte token
    # started, and every call failed RESOURCE_EXHAUSTED "received initial
    # metadata size exceeds limit"); /dev/zero is not read without end.
    head -c 4096 /dev/zero | tr '\0' k >"$T/token-4096"
    start_server token-4096 "$T/root/$m" --token-file "$T/token-4096"
    expect 0 "a 4096-byte token: served" "$ADDR" list --token "$T/token-4096"
    stop_server token-4096
    head -c 12000 /dev/zero | tr '\0' k >"$T/token-long"
    refused_start token-long "more than 4096" "a 12000-byte token: refused at start" \
        "$T/root/$m" --token-file "$T/token-long"
    refused_start token-zero "larger than 65536 bytes" "/dev/zero as --token-file: refused, read bounded" \
        "$T/root/$m" --token-file /dev/zero

    # Oversized request messages.
    start_server size "$T/root/$m" --max-request-bytes 4096
    expect 108 "request over --max-request-bytes: RESOURCE_EXHAUSTED" "$ADDR" get $m "$(head -c 8000 /dev/zero | tr '\0' x)"
    expect 0 "a request under it still served" "$ADDR" get $m model.norm.weight
    stop_server size

    # TLS and mutual TLS, with a CA made here.
    local d=$T/pki
    mkdir -p "$d"
    (
        cd "$d" || exit 1
        set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca 2>/dev/null
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=client 2>/dev/null
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout rogue.key -out rogue.csr -subj /CN=rogue 2>/dev/null
        openssl x509 -req -in rogue.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial -out rogue.pem -days 2 2>/dev/null
    ) || { bad "openssl could not make the test CA"; return; }
    refused_start tls-mismatch "--tls-key $d/rogue.key does not match the certificate in --tls-cert $d/server.pem" \
        "a key that is not the certificate's: said so" "$T/root/$m" --tls-cert "$d/server.pem" --tls-key "$d/rogue.key"
    grep -q 'cannot listen' "$T/tls-mismatch.err" && bad "key mismatch still says 'cannot listen'"
    refused_start tls-notkey "no PEM private key" "a certificate given as --tls-key: said so" \
        "$T/root/$m" --tls-cert "$d/server.pem" --tls-key "$d/server.pem"
    # An encrypted key, the server on a terminal (script(1) gives it one):
    # refused at once. Before: OpenSSL's default callback prompted "Enter
    # PEM pass phrase:" and waited there, SIGINT and SIGTERM blocked.
    if command -v script >/dev/null && openssl rsa -in "$d/server.key" -aes256 -passout pass:pw \
        -out "$d/enc.key" 2>/dev/null; then
        local rc=0
        timeout 60 script -qec "$(printf '%q ' "$SERVE" "$T/root/$m" --listen 127.0.0.1:0 \
            --tls-cert "$d/server.pem" --tls-key "$d/enc.key")" /dev/null </dev/null >"$T/tls-enc.out" 2>&1 ||
            rc=$?
        [ $rc -eq 2 ] && grep -q "no PEM private key" "$T/tls-enc.out" &&
            ok "an encrypted --tls-key on a terminal: refused at once, no prompt (exit 2)" ||
            bad "an encrypted --tls-key on a terminal: exit $rc: $(head -c 300 "$T/tls-enc.out")"
    else
        echo "# skipped the encrypted key on a terminal: no script(1) or openssl rsa"
    fi
    start_server tls "$T/root/$m" --tls-cert "$d/server.pem" --tls-key "$d/server.key"
    expect 0 "TLS: verified fetch" "$ADDR" fetch $m --ca "$d/ca.pem" --server-name localhost -q
    expect 114 "TLS server, plaintext client: UNAVAILABLE" "$ADDR" list
    # The relay's bounds hold under TLS too (it terminates TLS): a flood
    # of header-only streams over TLS is closed, and served meanwhile.
    local out
    out=$(timeout 60 /usr/bin/python3 "$SRC/tests/serve/h2raw.py" flood "$ADDR" 100000 --tls 2>&1 | tail -1)
    case $out in
    "closed after"*) ok "TLS: a flood of 100,000 header-only streams: connection $out" ;;
    *) bad "TLS flood: $out" ;;
    esac
    expect 114 "TLS: a server certificate from another CA is refused" "$ADDR" list --ca "$d/other-ca.pem" --server-name localhost
    stop_server tls
    start_server mtls "$T/root/$m" --tls-cert "$d/server.pem" --tls-key "$d/server.key" --client-ca "$d/ca.pem"
    expect 0 "mTLS: client certificate from the CA: served" "$ADDR" fetch $m --ca "$d/ca.pem" --server-name localhost \
        --cert "$d/client.pem" --key "$d/client.key" -q
    expect 114 "mTLS: no client certificate: refused" "$ADDR" list --ca "$d/ca.pem" --server-name localhost
    expect 114 "mTLS: client certificate from another CA: refused" "$ADDR" list --ca "$d/ca.pem" --server-name localhost \
        --cert "$d/rogue.pem" --key "$d/rogue.key"
    stop_server mtls
}

case_shutdown() {
    make_big "$T/big" w0:33554432 w1:33554432 w2:33554432 w3:33554432
    # Per-client limit: two streams held open by stalled readers, the third
    # refused. The readers stall until killed after the check, the server's
    # --stall-timeout far past that: no watchdog races the check.
    start_server limit "$T/big/model.safetensors" --max-streams-per-client 2 --stall-timeout 300 \
        --metrics-port 0
    local mport
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/limit.out")
    local p1 p2
    timeout 300 "$CLIENT" "$ADDR" fetch model.safetensors --stream --stall 240 -q >/dev/null 2>"$T/s1.err" &
    p1=$!
    timeout 300 "$CLIENT" "$ADDR" fetch model.safetensors --stream --stall 240 -q >/dev/null 2>"$T/s2.err" &
    p2=$!
    # Both streams open (each has its first chunk), at most 120 s.
    wait_line "$T/s1.err" stalling 1200 && wait_line "$T/s2.err" stalling 1200 ||
        bad "the two stalled readers did not start: $(cat "$T/s1.err" "$T/s2.err")"
    expect 108 "third concurrent call from one client: RESOURCE_EXHAUSTED" "$ADDR" get model.safetensors w0
    kill $p1 $p2 2>/dev/null
    wait $p1 $p2 2>/dev/null
    # Their calls ended on the server (the event, not a guess of when).
    active_zero "$mport" || bad "the killed readers' calls still open: active streams $A"
    expect 0 "after they end, calls are served again" "$ADDR" get model.safetensors w3
    stop_server limit

    # A reader stalled past --stall-timeout is cancelled by the server: it
    # stalls (until told, at most 240 s) once its first chunk is in; then
    # the server's log says so within 120 s (its promptness is measured by
    # serve_transport's stalled reader).
    start_server stall "$T/big/model.safetensors" --stall-timeout 3
    local t0 took
    timeout 300 "$CLIENT" "$ADDR" fetch model.safetensors --stream --stall 240 --stall-until "$T/go2" -q \
        >/dev/null 2>"$T/stalled.err" &
    p1=$!
    wait_line "$T/stalled.err" stalling 1200 || bad "the stalling reader did not start: $(cat "$T/stalled.err")"
    t0=$(date +%s%N)
    if wait_line "$T/stall.err" 'stalled' 1200; then
        took=$(secs_since "$t0")
        ok "stalled reader cancelled by the server after --stall-timeout 3 (${took} s after it stopped reading)"
    else
        bad "stalled reader not cancelled within 120 s: $(tail -3 "$T/stall.err")"
    fi
    touch "$T/go2"
    kill "$p1" 2>/dev/null
    wait "$p1" 2>/dev/null
    stop_server stall

    # SIGTERM during 8 active streams: each finishes or ends UNAVAILABLE; the
    # server stops within its grace.
    start_server term "$T/big/model.safetensors" --grace 3 --metrics-port 0
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/term.out")
    local pids=() i
    for i in 1 2 3 4 5 6 7 8; do
        timeout 300 "$CLIENT" "$ADDR" fetch model.safetensors --stream --repeat 50 -q >/dev/null 2>"$T/term$i.err" &
        pids+=($!)
    done
    # The signal once the 8 streams are open (at most 120 s for them to
    # start on a loaded machine; the streams of one client follow each
    # other, so a moment may show 7: at least one must be).
    local act=0
    for i in $(seq 1200); do
        act=$(metric "$mport" sluice_serve_active_streams)
        [ "${act:-0}" -ge 8 ] && break
        sleep 0.1
    done
    echo "# $act streams active at SIGTERM"
    [ "${act:-0}" -ge 1 ] || bad "no stream active before SIGTERM"
    term_wait 30
    local rc=$RC stopped
    stopped=$(stopped_secs term)
    [ $rc -eq 0 ] && ok "SIGTERM with $act active streams: exit 0" ||
        { bad "SIGTERM: exit $rc"; tail -20 "$T/term.err"; }
    # Within the grace (3 s), by the server's own clock from the signal to
    # its stop, with 2 s of slack for a loaded machine's scheduling; the
    # exit itself (an ASan build's leak check) bounded by term_wait's 30 s.
    [ -n "$stopped" ] && awk -v s="$stopped" 'BEGIN { exit !(s <= 5) }' &&
        ok "stopped ${stopped} s after SIGTERM (grace 3 s)" ||
        bad "stopped '${stopped}' s after SIGTERM, grace 3 s: $(tail -3 "$T/term.err")"
    local others=0
    for p in "${pids[@]}"; do
        wait "$p"
        rc=$?
        [ $rc -eq 0 ] || [ $rc -eq 114 ] || others=$((others + 1))
    done
    [ $others -eq 0 ] && ok "the 8 streams finished or ended UNAVAILABLE" ||
        { bad "$others streams ended otherwise"; cat "$T"/term*.err | sort | uniq -c | head; }
    expect 114 "after shutdown: UNAVAILABLE" "$ADDR" list
}

# metric PORT NAME: the value of an unlabelled family on the server's /metrics.
metric() {
    timeout 20 curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2}'
}

# secs_since T0: seconds (3 decimals) since T0 (date +%s%N).
secs_since() {
    local ms=$((($(date +%s%N) - $1) / 1000000))
    printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

# wait_line FILE REGEX TENTHS: waits at most TENTHS tenths of a second for
# a line of FILE matching REGEX; grep's status.
wait_line() {
    local i
    for i in $(seq "$3"); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    grep -q "$2" "$1" 2>/dev/null
}

# stall_client OUT: a raw HTTP/2 client of $ADDR that stops reading after
# 8 MiB of GetTensor of model.safetensors' w (h2raw.py stall), waited for
# at most 30 s; sets SP.
stall_client() {
    /usr/bin/python3 "$SRC/tests/serve/h2raw.py" stall "$ADDR" model.safetensors w "$T/token" 8388608 >"$1" 2>&1 &
    SP=$!
    PIDS+=("$SP")
    wait_line "$1" '^stalling' 300
}

# active_zero MPORT: waits at most 60 s for sluice_serve_active_streams 0
# on the metrics port MPORT; sets A to the last value read.
active_zero() {
    local i
    for i in $(seq 600); do
        A=$(metric "$1" sluice_serve_active_streams)
        [ "$A" = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

case_transport() {
    # A 256 MiB tensor (more than every buffer between the server and a
    # client that stops reading) and a 9 MiB one.
    make_big "$T/big" w:268435456 m:9437184
    local m=model.safetensors
    printf 'transport-token\n' >"$T/token"
    start_server transport "$T/big/$m" --token-file "$T/token" --metrics-port 0 \
        --stall-timeout 3 --grace 3
    local mport
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/transport.out")
    # chunk_bytes 4 MiB (the documented maximum) with a stock client, its
    # receive limit at gRPC's default 4 MiB: every message fits.
    if timeout 60 /usr/bin/python3 "$SRC/tests/serve/stock_client.py" "$ADDR" $m m 4194304 \
        "$T/big/$m" "$T/token" >"$T/stock.out" 2>&1; then
        ok "chunk_bytes 4 MiB, stock gRPC client with default limits: $(cat "$T/stock.out")"
    else
        bad "chunk_bytes 4 MiB, stock gRPC client: $(cat "$T/stock.out")"
    fi
    # A client with the largest HTTP/2 windows that stops reading after
    # 8 MiB of GetTensor: its call's handle must be released (active
    # streams back to 0) within --stall-timeout (3 s) + 1.5 s (the
    # cancel, then 1 s later its connection closed; the watchdog's 0.2 s
    # tick), asserted with 1 s more for a loaded machine. Before: about
    # 20 s, when the kernel's TCP_USER_TIMEOUT (gRPC's default, 20 s) fired.
    local t0 took
    stall_client "$T/stall.out"
    t0=$(date +%s%N)
    grep -q '^stalling' "$T/stall.out" || bad "the stalling client did not start: $(cat "$T/stall.out")"
    active_zero "$mport"
    took=$(secs_since "$t0")
    echo "# stalled reader: active streams 0 after ${took} s (--stall-timeout 3)"
    [ "$A" = 0 ] && [ "${took%.*}" -lt 6 ] &&
        ok "stalled reader's call ended, handle released, ${took} s after it stopped reading" ||
        bad "stalled reader: active streams $A after ${took} s"
    grep -q 'connection closed' "$T/transport.err" && ok "its connection was closed after the cancel" ||
        bad "no connection closed: $(tail -3 "$T/transport.err")"
    wait_line "$T/stall.out" '^reset' 30 &&
        ok "the stalled client saw its connection reset ($(grep '^reset' "$T/stall.out"))" ||
        bad "the stalled client saw no reset: $(cat "$T/stall.out")"
    expect 0 "served after the stalled reader" "$ADDR" get $m m --token "$T/token"
    kill "$SP" 2>/dev/null
    # SIGTERM with --grace 3 while another such client is stalled: the
    # server stops within the grace + 2 s by its own clock (stopped_secs;
    # the exit after it bounded by term_wait). Before: about 20 s.
    stall_client "$T/stall2.out"
    t0=$(date +%s%N)
    term_wait 30
    took=$(secs_since "$t0")
    local stopped
    stopped=$(stopped_secs transport)
    echo "# SIGTERM with a stalled reader: stopped after ${stopped} s, exit $RC after ${took} s (--grace 3)"
    [ "$RC" -eq 0 ] && [ -n "$stopped" ] && awk -v s="$stopped" 'BEGIN { exit !(s < 5) }' &&
        ok "SIGTERM with a stalled reader: stopped after ${stopped} s, exit 0" ||
        { bad "SIGTERM with a stalled reader: exit $RC, stopped after '${stopped}' s"; tail -5 "$T/transport.err"; }
    kill "$SP" 2>/dev/null
    # The same over IPv6, where gRPC's peer string is a URI with the
    # brackets escaped ("ipv6:%5B::1%5D:PORT"): the stalled reader's
    # connection must be found and reset by the watchdog, not left to the
    # kernel's TCP_USER_TIMEOUT a second later (which resets nothing: the
    # client would never see a reset). Skipped where ::1 cannot be bound.
    if ! /usr/bin/python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
        echo "# skipped the IPv6 stalled reader: ::1 cannot be bound here"
        return
    fi
    LISTEN="[::1]:0" start_server transport6 "$T/big/$m" --token-file "$T/token" --metrics-port 0 \
        --stall-timeout 3 --grace 3
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/transport6.out")
    stall_client "$T/stall6.out" || bad "the IPv6 stalling client did not start: $(cat "$T/stall6.out")"
    active_zero "$mport" || bad "IPv6 stalled reader: active streams $A after 60 s"
    wait_line "$T/stall6.out" '^reset' 30 &&
        ok "IPv6 stalled reader: its connection reset by the watchdog ($(grep '^reset' "$T/stall6.out"))" ||
        bad "IPv6 stalled reader: its connection was never reset (released by the kernel's timeout only): $(grep stalled "$T/transport6.err" | tail -2)"
    kill "$SP" 2>/dev/null
    stop_server transport6
}

# rss_kib PID: the resident size; hwm_kib PID: its peak (VmHWM).
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null; }
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null; }

case_load() {
    local nclients=${SLUICE_SERVE_LOAD_CLIENTS:-16}
    # 8 x 8 MiB tensors and a 1 MiB one: 65 MiB; the model's pool is capped
    # at its size (+1/16 + 1 MiB).
    make_big "$T/big" w0:8388608 w1:8388608 w2:8388608 w3:8388608 w4:8388608 \
        w5:8388608 w6:8388608 w7:8388608 small:1048576
    local model_bytes=$((8 * 8388608 + 1048576))
    local pool=$((model_bytes + model_bytes / 16 + 1048576))
    local limit_kib=$(((pool + 128 * 1048576) / 1024))
    # An AddressSanitizer build: its quarantine of freed blocks kept small,
    # its shadow and allocator add to the resident size: 128 MiB more.
    if nm -D "$SERVE" 2>/dev/null | grep -q __asan_init || ldd "$SERVE" | grep -q libasan; then
        export ASAN_OPTIONS="${ASAN_OPTIONS:-}:quarantine_size_mb=16"
        limit_kib=$((limit_kib + 131072))
        echo "# AddressSanitizer build: RSS limit raised by 128 MiB"
    fi
    start_server load "$T/big/model.safetensors" --stall-timeout 60 --max-streams-per-client 64 \
        --max-connections-per-address 64
    local m=model.safetensors
    # A stalled reader (until killed at the end, however long the load
    # takes on a loaded machine) and one that cancels, started first. The
    # clients killed with SIGKILL run without timeout(1), which would take
    # the signal in their place and leave them running (--stall bounds them).
    "$CLIENT" "$ADDR" fetch $m --stream --stall 540 -q >/dev/null 2>&1 &
    local stalled=$!
    PIDS+=("$stalled")
    timeout 60 "$CLIENT" "$ADDR" fetch $m --stream --cancel -q >/dev/null 2>"$T/cancel.err" &
    local canceller=$!
    # One killed mid-stream (SIGKILL, once its first chunk is in: not a
    # second guessed to be enough): its call must leave nothing behind.
    "$CLIENT" "$ADDR" fetch $m --stream --stall 540 -q >/dev/null 2>"$T/victim.err" &
    local victim=$!
    PIDS+=("$victim")
    wait_line "$T/victim.err" '^stalling' 1200 || bad "the client to kill did not start: $(cat "$T/victim.err")"
    kill -KILL "$victim" 2>/dev/null
    wait "$victim" 2>/dev/null
    local i pids=() t0=$SECONDS maxrss=0 r
    for i in $(seq "$nclients"); do
        timeout 240 "$CLIENT" "$ADDR" fetch $m --stream -q >/dev/null 2>"$T/load$i.err" &
        pids+=($!)
        PIDS+=($!)
    done
    # The server's resident size, sampled while they run.
    while :; do
        local running=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
        r=$(rss_kib "$SPID")
        [ -n "$r" ] && [ "$r" -gt "$maxrss" ] && maxrss=$r
        [ $running -eq 0 ] && break
        [ $((SECONDS - t0)) -gt 240 ] && break
        sleep 0.2
    done
    local failed=0
    for p in "${pids[@]}"; do
        wait "$p" || failed=$((failed + 1))
    done
    local took=$((SECONDS - t0))
    [ $failed -eq 0 ] && ok "$nclients concurrent clients streamed and verified the whole model in ${took} s, beside a stalled and a cancelling client" ||
        { bad "$failed of $nclients clients failed"; cat "$T"/load*.err | sort | uniq -c | head; }
    kill -0 "$stalled" 2>/dev/null && ok "the stalled client was still stalled meanwhile" ||
        bad "the stalled client ended early"
    wait "$canceller"
    [ $? -eq 101 ] && ok "the cancelling client ended CANCELLED" || bad "cancelling client: $(cat "$T/cancel.err")"
    local hwm
    hwm=$(hwm_kib "$SPID")
    echo "# server RSS: sampled max ${maxrss} KiB, peak (VmHWM) ${hwm} KiB; limit ${limit_kib} KiB (pool $((pool / 1024)) KiB + 128 MiB)"
    [ "$hwm" -le "$limit_kib" ] && ok "server peak RSS ${hwm} KiB <= pool + 128 MiB" ||
        bad "server peak RSS ${hwm} KiB > ${limit_kib} KiB"
    kill -KILL "$stalled" 2>/dev/null
    wait "$stalled" 2>/dev/null
    # Served still, and its exit (with the leak check of an ASan build) clean.
    expect 0 "served after the load" "$ADDR" get $m small
    stop_server load
}

# threads_of PID: its thread count.
threads_of() { awk '/^Threads:/ {print $2}' "/proc/$1/status" 2>/dev/null; }

case_flood() {
    make_big "$T/big" w:4194304 m:65536
    local m=model.safetensors
    printf 'flood-token\n' >"$T/token"
    start_server flood "$T/big/$m" --token-file "$T/token" --max-streams 4 --metrics-port 0 \
        --max-connections-per-address 4 --request-timeout 1 --max-request-bytes 4096
    local mport
    mport=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/flood.out")
    expect 0 "served before the flood" "$ADDR" get $m w --token "$T/token"
    local r0 th0 bound_kib slack_kib
    r0=$(rss_kib "$SPID")
    th0=$(threads_of "$SPID")
    # The documented bound: 4 MiB a connection; one flooding connection
    # at a time here, and 12 MiB for the allocator's slack (an
    # AddressSanitizer build: 64 MiB, its quarantine and shadow).
    slack_kib=12288
    if nm -D "$SERVE" 2>/dev/null | grep -q __asan_init || ldd "$SERVE" | grep -q libasan; then
        slack_kib=65536
    fi
    bound_kib=$((r0 + 4096 + slack_kib))
    # Floods of 100,000 streams of headers and no request message, one
    # connection each, one after another (with and without acknowledging
    # the server's SETTINGS), for as long as authenticated calls run
    # beside them. Before: 22 MB -> 1.2 GB, 314 threads, and the calls
    # failed RESOURCE_EXHAUSTED.
    (
        for i in $(seq 20); do
            /usr/bin/python3 "$SRC/tests/serve/h2raw.py" flood "$ADDR" 100000 $([ $((i % 2)) = 0 ] && echo --ack)
            [ -e "$T/stop-flood" ] && break
        done
    ) >"$T/floods.out" 2>&1 &
    local fp=$! maxr=0 maxt=0 r t i
    PIDS+=("$fp")
    local served=0
    for i in 1 2 3; do
        timeout 60 "$CLIENT" "$ADDR" list --token "$T/token" >/dev/null 2>>"$T/beside.err" &&
            timeout 60 "$CLIENT" "$ADDR" get $m w --token "$T/token" -o /dev/null -q >/dev/null 2>>"$T/beside.err" &&
            served=$((served + 1))
        r=$(rss_kib "$SPID"); t=$(threads_of "$SPID")
        [ "${r:-0}" -gt $maxr ] && maxr=$r
        [ "${t:-0}" -gt $maxt ] && maxt=$t
    done
    [ $served -eq 3 ] && ok "authenticated list and GetTensor served while the floods ran" ||
        bad "beside the floods: $served of 3 served: $(sort "$T/beside.err" | uniq -c | head -3)"
    touch "$T/stop-flood"
    for i in $(seq 600); do
        kill -0 $fp 2>/dev/null || break
        r=$(rss_kib "$SPID"); t=$(threads_of "$SPID")
        [ "${r:-0}" -gt $maxr ] && maxr=$r
        [ "${t:-0}" -gt $maxt ] && maxt=$t
        sleep 0.1
    done
    local nf nc
    nf=$(grep -c '^sent' "$T/floods.out")
    nc=$(grep -c '^closed after' "$T/floods.out")
    [ "$nf" -ge 1 ] && [ "$nc" -eq "$nf" ] && ok "each of the $nf flooding connections closed by the server ($(grep '^closed' "$T/floods.out" | sort -t' ' -k3 -n | tail -1 | sed 's/closed after/the slowest after/'))" ||
        bad "floods: $nf sent, $nc closed: $(sort "$T/floods.out" | uniq -c | head -5)"
    # The peak after it all too (a transport's streams cancelled at close).
    sleep 1
    r=$(rss_kib "$SPID"); t=$(threads_of "$SPID")
    [ "${r:-0}" -gt $maxr ] && maxr=$r
    [ "${t:-0}" -gt $maxt ] && maxt=$t
    echo "# flood: RSS ${r0} KiB before, ${maxr} KiB sampled peak, ${r} KiB after (bound ${bound_kib} KiB); threads ${th0} before, ${maxt} peak, ${t} after"
    [ "$maxr" -le "$bound_kib" ] && ok "RSS within the bound during and after the floods (${maxr} KiB <= ${bound_kib} KiB)" ||
        bad "RSS ${maxr} KiB > ${bound_kib} KiB"
    [ "$maxt" -le $((th0 + 16)) ] && ok "threads bounded (${maxt}, ${th0} before)" ||
        bad "threads ${maxt} (${th0} before)"
    local nr
    nr=$(timeout 5 curl -sf "http://127.0.0.1:$mport/metrics" |
        awk '$1 == "sluice_serve_connections_refused_total{reason=\"streams\"}" {print $2}')
    [ "${nr:-0}" -ge "$nf" ] && ok "counted: connections_refused_total{reason=streams} $nr" ||
        bad "connections_refused_total{reason=streams} '$nr', $nf floods"
    grep -q 'refused ipv4:127.0.0.1: HTTP/2: too many open streams' "$T/flood.err" &&
        ok "logged" || bad "not logged: $(tail -3 "$T/flood.err")"
    [ "$(grep -c 'too many open streams' "$T/flood.err")" -le 3 ] && ok "logged at most once per address per 10 s" ||
        bad "logged $(grep -c 'too many open streams' "$T/flood.err") times"

    # Streams holding request messages that never end: closed once they
    # hold more than 2 x --max-request-bytes (8 KiB here; 3 KiB a stream,
    # gRPC's flow control windows not exceeded). From 127.0.0.3: its own log line.
    out=$(timeout 30 /usr/bin/python3 "$SRC/tests/serve/h2raw.py" flood "$ADDR" 30 --data 3000 --ack --from 127.0.0.3 2>&1 | tail -1)
    case $out in
    "closed after"*) ok "streams holding 8 KiB of unfinished requests: connection $out" ;;
    *) bad "unfinished requests: $out" ;;
    esac
    grep -q 'refused ipv4:127.0.0.3: HTTP/2: more request bytes' "$T/flood.err" && ok "logged: request bytes" ||
        bad "request bytes not logged: $(tail -3 "$T/flood.err")"

    # A header block over 16 KiB (in HEADERS and CONTINUATION frames):
    # closed before gRPC parses it. From 127.0.0.4.
    out=$(timeout 30 /usr/bin/python3 "$SRC/tests/serve/h2raw.py" flood "$ADDR" 1 --header 20000 --from 127.0.0.4 2>&1 | tail -1)
    case $out in
    "closed after"*) ok "a header block of 20 KB: connection $out" ;;
    *) bad "a header block of 20 KB: $out" ;;
    esac
    grep -q 'refused ipv4:127.0.0.4: HTTP/2: a header block over 16 KiB' "$T/flood.err" && ok "logged: header block" ||
        bad "header block not logged: $(tail -3 "$T/flood.err")"

    # Connections per address: 4 served, the 5th and 6th closed at once,
    # while another address (127.0.0.2, the same port) is served.
    /usr/bin/python3 "$SRC/tests/serve/h2raw.py" hold "$ADDR" 6 >"$T/hold.out" 2>&1 &
    local hp=$!
    PIDS+=("$hp")
    for i in $(seq 300); do
        [ -s "$T/hold.out" ] && break
        sleep 0.1
    done
    [ "$(cat "$T/hold.out")" = "served 4 refused 2" ] && ok "--max-connections-per-address 4: 4 served, 2 refused" ||
        bad "per-address cap: $(cat "$T/hold.out")"
    local other
    other=$(timeout 30 /usr/bin/python3 "$SRC/tests/serve/h2raw.py" hold "$ADDR" 1 --from 127.0.0.2 --once 2>&1)
    [ "$other" = "served 1 refused 0" ] && ok "another address served meanwhile" || bad "127.0.0.2: $other"
    kill "$hp" 2>/dev/null
    wait "$hp" 2>/dev/null
    for i in $(seq 50); do
        other=$(timeout 30 /usr/bin/python3 "$SRC/tests/serve/h2raw.py" hold "$ADDR" 1 --once 2>&1)
        [ "$other" = "served 1 refused 0" ] && break
        sleep 0.1
    done
    [ "$other" = "served 1 refused 0" ] && ok "served again once they closed" || bad "after: $other"

    # A stream whose request never arrives: its connection closed after
    # --request-timeout (1 s; the sweep's 0.2 s, and 1 s for a loaded machine).
    # From 0.8 s: the client's clock starts after its connect returns, which
    # a loaded machine may delay past the server's accept (0.99 s was seen).
    local out
    out=$(timeout 30 /usr/bin/python3 "$SRC/tests/serve/h2raw.py" flood "$ADDR" 1 2>&1 | tail -1)
    local s=${out#closed after }
    s=${s% s}
    [ "$s" != "$out" ] && awk -v s="$s" 'BEGIN { exit !(s >= 0.8 && s < 3) }' &&
        ok "a stream without its request: connection closed after ${s} s (--request-timeout 1)" ||
        bad "a stream without its request: $out"
    # The same for a connection that sends nothing at all.
    out=$(timeout 30 /usr/bin/python3 -c '
import socket, sys, time
h, p = sys.argv[1].rsplit(":", 1)
t0 = time.monotonic()
s = socket.create_connection((h, int(p)))
s.settimeout(10)
try:
    s.recv(1)
except OSError:
    pass
print("closed after %.2f s" % (time.monotonic() - t0))' "$ADDR" 2>&1)
    s=${out#closed after }
    s=${s% s}
    [ "$s" != "$out" ] && awk -v s="$s" 'BEGIN { exit !(s >= 0.8 && s < 3) }' &&
        ok "a connection without the HTTP/2 preface: closed after ${s} s" ||
        bad "a connection without the preface: $out"
    expect 0 "served after it all" "$ADDR" get $m m --token "$T/token"
    stop_server flood
}

# start_replicas N MODEL ARGS...: N servers of MODEL (rep1..repN) with
# metrics; sets RPID, RPORT, RMPORT (arrays, 1-based) and RLIST, their
# addresses as one list "127.0.0.1:P1,127.0.0.1:P2,...".
start_replicas() {
    local n=$1 k
    shift
    RPID=() RPORT=() RMPORT=() RLIST=""
    for k in $(seq "$n"); do
        start_server "rep$k" "$@" --metrics-port 0
        RPID[k]=$SPID
        RPORT[k]=${ADDR##*:}
        RMPORT[k]=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/rep$k.out")
        RLIST+="${RLIST:+,}$ADDR"
    done
}

# calls MPORT METHOD: the server's sluice_serve_calls_total of METHOD with OK.
calls() { metric "$1" "sluice_serve_calls_total{method=\"$2\",code=\"OK\"}"; }

case_replicas() {
    # 8 x 8 MiB: a stream stalled after its first chunk holds its call on
    # the server (the windows and buffers between hold far less).
    make_big "$T/big" w0:8388608 w1:8388608 w2:8388608 w3:8388608 w4:8388608 \
        w5:8388608 w6:8388608 w7:8388608
    local m=model.safetensors man="$T/big/model.safetensors.manifest.json"
    # --stall-timeout 600: the clients below stall until told, which on a
    # loaded machine may be longer than the default 30 s.
    start_replicas 3 "$T/big/$m" --grace 5 --max-streams-per-client 64 \
        --max-connections-per-address 64 --stall-timeout 600
    # A list spreads calls over the replicas (round_robin): 6 GetTensor calls, 2 each.
    expect 0 "a list of 3 replicas: every tensor verified" "$RLIST" get $m w0 --repeat 1 \
        --manifest "$man" -q
    local k spread=0
    for k in 1 2 3; do
        timeout 30 "$CLIENT" "$RLIST" latency $m w1 --repeat 6 --manifest "$man" >/dev/null 2>&1
    done
    for k in 1 2 3; do
        [ "$(calls "${RMPORT[k]}" GetTensor)" -gt 0 ] && spread=$((spread + 1))
    done
    [ $spread -eq 3 ] && ok "GetTensor calls spread over the 3 replicas (round_robin)" ||
        bad "GetTensor calls on $spread of the 3 replicas"
    expect 2 "a list with a name is refused (dns:/// is for names)" \
        "localhost:${RPORT[1]},127.0.0.1:${RPORT[2]}" list
    expect 2 "a list over TLS without --server-name is refused (no name to check)" \
        "$RLIST" list --ca "$man"
    expect 0 "dns:///127.0.0.1:P: a replica set of what the name resolves to" \
        "dns:///127.0.0.1:${RPORT[1]}" get $m w2 --manifest "$man" -q
    # Health checking: a fourth replica draining (SIGTERM; a call stalled
    # on it holds the drain open) says NOT_SERVING, and a client of the
    # four sends it no call: its subchannel is never ready. Without the
    # health check a quarter of the calls would be refused there. The
    # stalled call holds the drain open until the checks below are done
    # ($T/hold-go; the grace and --stall-timeout far past them): a drain
    # that ended under them would take the metrics they read with it.
    start_server rep4 "$T/big/$m" --metrics-port 0 --grace 600 --stall-timeout 600
    local mp4 hold
    mp4=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/rep4.out")
    # (no timeout(1): the cleanup's SIGKILL must reach it; --stall bounds it)
    "$CLIENT" "$ADDR" fetch $m --stream --stall 540 --stall-until "$T/hold-go" -q \
        >/dev/null 2>"$T/hold.err" &
    hold=$!
    PIDS+=($hold)
    wait_line "$T/hold.err" '^stalling' 1200 || bad "the holding client did not start"
    kill -TERM "$SPID"
    wait_line "$T/rep4.err" 'draining' 600 || bad "rep4 did not begin draining"
    expect 0 "a client of 4 replicas, one draining: 8 calls verified" "$RLIST,$ADDR" latency $m w1 \
        --repeat 8 --manifest "$man"
    local refused got4
    refused=$(metric "$mp4" 'sluice_serve_refused_total{reason="shutdown"}')
    got4=$(calls "$mp4" GetTensor)
    [ "$refused" = 0 ] && [ "$got4" = 0 ] &&
        ok "the draining replica (NOT_SERVING) got none of them (health check)" ||
        bad "the draining replica got calls: $got4 served, ${refused:-?} refused (shutting down)"
    # The held call goes on to its end; then the drain ends.
    touch "$T/hold-go"
    term_wait 120
    wait "$hold" 2>/dev/null
    # 8 clients stream the model 3 times each (the list, or the ipv4:
    # target it stands for), each stalled after its first chunk until the
    # replicas are killed and stopped ($T/go): then every client has a call
    # open, on a replica its metrics name, however long the last took to
    # start on a loaded machine.
    local i pids=() target
    for i in 1 2 3 4 5 6 7 8; do
        target=$RLIST
        [ $((i % 2)) -eq 0 ] && target="ipv4:$RLIST"
        "$CLIENT" "$target" fetch $m --stream --repeat 3 --stall 540 --stall-until "$T/go" \
            --manifest "$man" -q >/dev/null 2>"$T/rc$i.err" &
        pids+=($!)
        PIDS+=($!)
    done
    for i in 1 2 3 4 5 6 7 8; do
        wait_line "$T/rc$i.err" '^stalling' 1200 || bad "client $i did not start: $(cat "$T/rc$i.err")"
    done
    # The replica with the most open calls is killed (SIGKILL), the next
    # is sent SIGTERM (NOT_SERVING, then drained), the third survives.
    local act=() order
    for k in 1 2 3; do act[k]=$(metric "${RMPORT[k]}" sluice_serve_active_streams); done
    order=$(for k in 1 2 3; do echo "${act[k]:-0} $k"; done | sort -rn | awk '{print $2}')
    local kill_k term_k live_k
    read -r kill_k term_k live_k <<<"$(echo $order)"
    echo "# open calls: ${act[1]} ${act[2]} ${act[3]}; SIGKILL rep$kill_k, SIGTERM rep$term_k, rep$live_k survives"
    [ "${act[kill_k]:-0}" -ge 1 ] || bad "no open call on any replica"
    local before
    before=$(calls "${RMPORT[live_k]}" StreamTensors)
    kill -KILL "${RPID[kill_k]}"
    wait "${RPID[kill_k]}" 2>/dev/null
    SPID=${RPID[term_k]}
    term_wait 30
    [ "$RC" -eq 0 ] && ok "the replica sent SIGTERM mid-stream exits 0" ||
        bad "the replica sent SIGTERM exited $RC: $(tail -3 "$T/rep$term_k.err")"
    # The stalled readers take up their streams again.
    touch "$T/go"
    local failed=0 resumed chunked
    for i in "${!pids[@]}"; do
        wait "${pids[i]}" || { failed=$((failed + 1)); tail -3 "$T/rc$((i + 1)).err"; }
    done
    grep -h '^failover\|^resum' "$T"/rc*.err | sed 's/[0-9][0-9]*/N/g' | sort | uniq -c | sed 's/^/# /'
    resumed=$(cat "$T"/rc*.err | grep -c '^resumed on ')
    chunked=$(cat "$T"/rc*.err | grep -c '^resuming w0 from byte [1-9]')
    [ $failed -eq 0 ] && ok "8 clients, a replica killed and another stopped mid-stream: every tensor verified (manifest), $resumed calls resumed" ||
        bad "$failed of 8 clients failed"
    local gone
    gone=$(cat "$T"/rc*.err | grep -c "^failover .* on ipv4:127.0.0.1:${RPORT[kill_k]}: UNAVAILABLE")
    # The stopped replica's calls, held by readers stalled past its grace
    # (5 s, until $T/go), are cut at the grace's end (CANCELLED, or their
    # connections closed) and fail over too.
    [ "$gone" -eq "${act[kill_k]}" ] && ok "each of the ${act[kill_k]} calls open on the killed replica failed over" ||
        bad "$gone failovers from the killed replica, ${act[kill_k]} calls were open on it"
    [ "$chunked" -ge 1 ] && ok "a tensor in flight resumed from its next chunk ($chunked)" ||
        bad "no tensor resumed from its next chunk: $(grep -h resum "$T"/rc*.err | head -3)"
    # The clients' later passes (2 x 8) all on the survivor.
    local after
    after=$(calls "${RMPORT[live_k]}" StreamTensors)
    [ $((after - before)) -ge 16 ] &&
        ok "the calls show on the surviving replica: $((after - before)) StreamTensors there since" ||
        bad "the surviving replica saw $((after - before)) StreamTensors calls"
    SPID=${RPID[live_k]}
    stop_server "rep$live_k"
}

# start_nginx DIR LOG: nginx (tools/serve_http.sh, its own process group)
# serving DIR on a free port, each request logged to LOG as "STATUS
# BODY_BYTES RANGE URI"; waits at most 60 s (a loaded machine) for it to
# answer; sets NPORT.
start_nginx() {
    NPORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    : >"$2"
    SLUICE_HTTP_ACCESS_LOG=$2 PATH=$PATH:/usr/sbin setsid sh "$SRC/tools/serve_http.sh" "$1" "$NPORT" \
        >"$T/nginx-$NPORT.log" 2>&1 &
    local pid=$! i
    PGIDS+=("$pid")
    for i in $(seq 600); do
        [ "$(timeout 2 curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$NPORT/")" != 000 ] &&
            return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        [ $? -eq 77 ] && { echo "skipped: nginx is not installed"; exit 77; }
    fi
    echo "nginx did not start: $(cat "$T/nginx-$NPORT.log")"
    exit 1
}

# tensor_ranges LOG FROM DATA: the bytes of the range requests for the data
# section (from byte DATA on) in LOG's lines FROM on, and how many.
tensor_ranges() {
    tail -n +"$2" "$1" | awk -v d="$3" '$3 ~ /^bytes=[0-9]+-[0-9]+$/ {
        split(substr($3, 7), r, "-"); if (r[2] + 0 >= d) { n++; b += $2 } }
        END { printf "%d %d\n", b, n }'
}

# One remote model: `sluice serve http://...` (the origin nginx) with a
# persistent cache, then again with the cache warm, then through a proxy.
case_remote() {
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] ||
        { echo "skipped: nginx is not installed (apt-get install nginx)"; exit 77; }
    unset http_proxy https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY SLUICE_CACHE_DIR
    "$SLUICE" synth tiny "$T/origin" --shards 1 >/dev/null 2>&1 || { bad "sluice synth"; return; }
    local f="$T/origin/model.safetensors" man="$T/origin/model.safetensors.manifest.json"
    local data size
    data=$(/usr/bin/python3 -c 'import struct, sys; print(8 + struct.unpack("<Q", open(sys.argv[1], "rb").read(8))[0])' "$f")
    size=$(stat -c %s "$f")
    start_nginx "$T/origin" "$T/origin.log"
    local url="http://127.0.0.1:$NPORT/model.safetensors" m=model.safetensors
    # Cold: every tensor from the origin, verified, stored in the cache.
    start_server remote1 "$url" --cache-dir "$T/cache" --cache-bytes 64M
    expect 0 "remote model: ListModels names it model.safetensors" "$ADDR" info $m
    expect 0 "remote model: every tensor by GetTensor, verified against the trusted manifest, equal to the origin's bytes" \
        "$ADDR" fetch $m --manifest "$man" --compare "$f" -q
    expect 0 "remote model: every tensor by StreamTensors, verified" "$ADDR" fetch $m --stream --manifest "$man" -q
    stop_server remote1
    local got blobs
    read -r got _ <<<"$(tensor_ranges "$T/origin.log" 1 "$data")"
    [ "$got" -ge $((size - data)) ] && ok "cold start: the tensors' $((size - data)) bytes read from the origin ($got bytes of ranges)" ||
        bad "cold start: $got bytes of tensor ranges at the origin, the tensors are $((size - data))"
    blobs=$(find "$T/cache/blobs" -type f 2>/dev/null | wc -l)
    [ "$blobs" -gt 0 ] && ok "--cache-dir: $blobs blobs stored" || bad "--cache-dir: no blob in $T/cache"
    # Warm: a restarted server reads the headers and the manifest from the
    # origin again, every tensor from the cache.
    local from=$(($(wc -l <"$T/origin.log") + 1)) n
    start_server remote2 "$url" --cache-dir "$T/cache"
    expect 0 "restarted: every tensor verified, equal to the origin's bytes" \
        "$ADDR" fetch $m --manifest "$man" --compare "$f" -q
    stop_server remote2
    read -r got n <<<"$(tensor_ranges "$T/origin.log" "$from" "$data")"
    [ "$(tail -n +"$from" "$T/origin.log" | grep -c 'manifest.json')" -ge 1 ] && [ "$n" -eq 0 ] &&
        ok "restarted: the tensors from the cache (the origin's log: the manifest and headers, no tensor range)" ||
        bad "restarted: $n tensor ranges ($got bytes) at the origin: $(tail -n +"$from" "$T/origin.log" | head -5)"
    # Through a proxy (a second nginx, which answers absolute-URI requests
    # from its own copy): both opens, the header-only probe included, ask
    # it; the origin sees the manifest only (read directly, by rule). The
    # location has a query (as a presigned URL): the name leaves it off.
    mkdir -p "$T/proxied"
    cp "$f" "$man" "$T/proxied/"
    local oport=$NPORT
    start_nginx "$T/proxied" "$T/proxy.log"
    from=$(($(wc -l <"$T/origin.log") + 1))
    start_server remote3 "$url?X-Amz-Signature=0123" --proxy "http://127.0.0.1:$NPORT" --proxy-kind plain
    expect 0 "through --proxy: every tensor verified; a location with a query named model.safetensors" \
        "$ADDR" fetch $m --manifest "$man" -q
    stop_server remote3
    local direct
    direct=$(tail -n +"$from" "$T/origin.log" | grep -vc 'manifest.json$')
    read -r got n <<<"$(tensor_ranges "$T/proxy.log" 1 "$data")"
    [ "$direct" -eq 0 ] && [ "$(grep -c ' bytes=8-' "$T/proxy.log")" -eq 2 ] && [ "$got" -ge $((size - data)) ] &&
        ok "--proxy: the probe's and the open's headers and the tensors through the proxy, the origin the manifest only" ||
        bad "--proxy: $direct requests other than the manifest at the origin ($(tail -n +"$from" "$T/origin.log" | head -3)), proxy: $(grep -c ' bytes=8-' "$T/proxy.log") header reads, $got bytes of tensors"
    refused_start badkind "--proxy-kind: 'p2p' is not plain or dragonfly" "a bad --proxy-kind exits 2" \
        "$url" --proxy-kind p2p
    refused_start rootfb "--fallback names mirrors of one model" "--fallback with a root exits 2" \
        "$T/origin" --root --fallback "$url"
    refused_start rootremote "--root: .* is remote" "--root with a remote location exits 2" "$url" --root
}

. "$SRC/tests/serve/attack_cases.sh"

# Issue 36 item 10: 30 client processes of 3 replicas, one call each,
# one after another
# (`list`: one ListModels). Before, every one began on the list's first
# replica (gRPC 1.51's round_robin: the first ready replica, the start
# index from an unseeded rand()); each client now shuffles its list from
# the system's random source, so more than one replica gets calls. With
# the fix all 30 on one replica has probability 3 x (1/3)^30 < 1e-13.
case_balance() {
    make_big "$T/small" a:4096
    local m=model.safetensors i k hit=0 got=""
    start_replicas 3 "$T/small/$m" --max-connections-per-address 64
    # one after another: concurrent starts race each other's connections,
    # which spreads the calls by chance even without the shuffle
    for i in $(seq 30); do
        timeout 60 "$CLIENT" "$RLIST" list >/dev/null 2>>"$T/balance.err"
    done
    # The mechanism: the order each client drew, which it says on stderr
    # ("replicas: ipv4:A,B,C"): its first address is not always the same.
    local firsts
    firsts=$(sed -n 's/^replicas: ipv4:\([^,]*\),.*/\1/p' "$T/balance.err" | sort | uniq -c |
        awk '{printf "%s%s", (NR > 1 ? "/" : ""), $1}')
    [ "$(sed -n 's/^replicas: ipv4:\([^,]*\),.*/\1/p' "$T/balance.err" | sort -u | wc -l)" -gt 1 ] &&
        ok "30 clients drew their own orders (first replicas: $firsts)" ||
        bad "30 clients all began their lists on one replica (${firsts:-no \"replicas:\" line})"
    for k in 1 2 3; do
        local n
        n=$(metric "${RMPORT[k]}" 'sluice_serve_calls_total{method="ListModels",code="OK"}')
        got+="${got:+/}${n:-?}"
        [ "${n:-0}" -gt 0 ] && hit=$((hit + 1))
    done
    [ $hit -gt 1 ] && ok "30 one-call clients of 3 replicas: $got calls (more than one replica)" ||
        bad "30 one-call clients of 3 replicas all on one: $got"
    for k in 3 2 1; do
        SPID=${RPID[k]}
        stop_server "rep$k"
    done
}

"case_$CASE"
echo "$PASSES passed, $FAILS failed"
[ $FAILS -eq 0 ]
