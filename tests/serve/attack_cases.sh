# HTTP/2 attacks on `sluice serve` (issue 36): rapid reset, control-frame
# floods, idle connections holding every slot, a client that half-closes.
# Cases of tests/serve/serve_test.sh (sourced by it: its start_server,
# stop_server, ok, bad, rss_kib), run as
#   serve_test.sh BUILD_DIR REAL_DATA_DIR attack_reset|attack_control|attack_idle|attack_halfclose
# The attacks of tests/serve/h2attack.py at sizes a loaded 2-core machine
# runs in seconds (tools/serve/bench_attacks.sh runs them at full size),
# an authenticated C++ client beside them.
ATTACK=(/usr/bin/python3 "$SRC/tests/serve/h2attack.py")

# attack_server ARGS...: a server of the attack model (made on first use)
# with a token and metrics; sets SPID, ADDR, MPORT.
attack_server() {
    if [ ! -f "$T/m/model.safetensors.manifest.json" ]; then
        mkdir -p "$T/m"
        /usr/bin/python3 "$SRC/tests/serve/mkmodel.py" "$T/m/model.safetensors" w:1048576 m:4096 || exit 1
        "$SLUICE" manifest "$T/m/model.safetensors" -q -o "$T/m/model.safetensors.manifest.json" || exit 1
        printf 'attack-token\n' >"$T/attack-token"
    fi
    start_server attack "$T/m/model.safetensors" --token-file "$T/attack-token" --metrics-port 0 "$@"
    MPORT=$(sed -n 's/^metrics on 127.0.0.1:\([0-9]*\)$/\1/p' "$T/attack.out")
}

# refused REASON: the server's sluice_serve_connections_refused_total{reason=REASON}.
refused() {
    timeout 10 curl -sf "http://127.0.0.1:$MPORT/metrics" |
        awk -v k="sluice_serve_connections_refused_total{reason=\"$1\"}" '$1 == k {print $2}'
}

# served WHAT: an authenticated GetTensor of the whole tensor w within
# 10 s (the issue's 2 s, with room for a loaded machine and an ASan build).
served() {
    if timeout 10 "$CLIENT" "$ADDR" get model.safetensors w --token "$T/attack-token" -o /dev/null -q \
        >/dev/null 2>"$T/client.err"; then
        ok "authenticated GetTensor served $1"
    else
        bad "authenticated GetTensor not served $1: $(tail -2 "$T/client.err")"
    fi
}

# The bound an attack may add to the server's RSS here: a few connections'
# documented bound, and the allocator's slack (an AddressSanitizer build:
# its quarantine and shadow).
rss_slack_kib() {
    if nm -D "$SERVE" 2>/dev/null | grep -q __asan_init || ldd "$SERVE" | grep -q libasan; then
        echo 65536
    else
        echo 16384
    fi
}

# Rapid reset (CVE-2023-44487): HEADERS + DATA(END_STREAM) + RST_STREAM of
# StreamTensors, 5,000 times on one connection without a token. A reset
# stream stays open until the server ends it (gRPC 1.51 still holds its
# call): the connection gets GOAWAY ENHANCE_YOUR_CALM (11) once its
# streams reset before the server ended them pass the bound, and is
# closed. Before: never closed, every call queued at gRPC (300,000:
# 4 GB of RSS).
case_attack_reset() {
    attack_server
    served "before the attack"
    local r0 out
    r0=$(rss_kib "$SPID")
    out=$(timeout 120 "${ATTACK[@]}" reset "$ADDR" 5000 2>&1 | tail -1)
    case $out in
    *"goaway 11 after"*) ok "5,000 resets on one connection: $out" ;;
    *) bad "5,000 resets on one connection: $out" ;;
    esac
    local n
    n=$(refused resets)
    [ "${n:-0}" -ge 1 ] && ok "counted: connections_refused_total{reason=resets} $n" ||
        bad "connections_refused_total{reason=resets} '$n'"
    grep -q 'refused ipv4:127.0.0.1: HTTP/2: too many streams reset' "$T/attack.err" &&
        ok "logged" || bad "not logged: $(tail -3 "$T/attack.err")"
    served "after the attack"
    local r
    r=$(rss_kib "$SPID")
    [ "$r" -le $((r0 + $(rss_slack_kib))) ] && ok "RSS ${r0} -> ${r} KiB" || bad "RSS ${r0} -> ${r} KiB"
    # --max-resets: the streams a connection may reset in 10 s, counted
    # whether or not they are still open (here 20: the 21st is refused).
    stop_server attack
    attack_server --max-resets 20
    out=$(timeout 120 "${ATTACK[@]}" reset "$ADDR" 30 2>&1 | tail -1)
    case $out in
    *"goaway 11 after"*) ok "--max-resets 20, 30 resets: $out" ;;
    *) bad "--max-resets 20, 30 resets: $out" ;;
    esac
    grep -q 'more streams reset than --max-resets' "$T/attack.err" && ok "logged: --max-resets" ||
        bad "--max-resets not logged: $(tail -3 "$T/attack.err")"
    stop_server attack
}

# PING and SETTINGS floods from clients that never read: closed once past
# --max-control-frames (1000 in 10 s), GOAWAY ENHANCE_YOUR_CALM (which they
# do not read). Before: every PING answered, the answers queued at gRPC
# (16 x 3,000,000: 3 GB of RSS).
case_attack_control() {
    attack_server
    local r0 out n
    r0=$(rss_kib "$SPID")
    out=$(timeout 120 "${ATTACK[@]}" ping "$ADDR" 20000 --conns 4 2>&1 | tail -1)
    case $out in
    "conns 4 closed 4 open 0"*) ok "4 x 20,000 PINGs, never read: $out" ;;
    *) bad "4 x 20,000 PINGs: $out" ;;
    esac
    out=$(timeout 120 "${ATTACK[@]}" ping "$ADDR" 20000 --conns 2 --settings 2>&1 | tail -1)
    case $out in
    "conns 2 closed 2 open 0"*) ok "2 x 20,000 SETTINGS, never read: $out" ;;
    *) bad "2 x 20,000 SETTINGS: $out" ;;
    esac
    # Frames that carry nothing (CVE-2019-9518) count as control frames:
    # 20,000 of a kind on one connection, the preface and the first 1,000
    # in one write, get GOAWAY ENHANCE_YOUR_CALM. Before: every kind but
    # continuation (which gRPC closes itself) was taken for good, each a
    # parse at gRPC (4 such connections slowed a GetTensor from 0.5 to
    # 6.6 s); and a flood read with the preface, before gRPC saw the
    # connection, was reset without a GOAWAY (the reset flood's too).
    local kind
    for kind in data continuation pingack settingsack rst unknown; do
        out=$(timeout 60 "${ATTACK[@]}" empty "$ADDR" 20000 $kind 2>&1 | tail -1)
        case $out in
        *"goaway 11 after"*) ok "20,000 empty frames ($kind): $out" ;;
        *) bad "20,000 empty frames ($kind): $out" ;;
        esac
    done
    n=$(refused control_frames)
    [ "${n:-0}" -ge 12 ] && ok "counted: connections_refused_total{reason=control_frames} $n" ||
        bad "connections_refused_total{reason=control_frames} '$n', 12 floods"
    served "after the floods"
    local r
    r=$(rss_kib "$SPID")
    [ "$r" -le $((r0 + $(rss_slack_kib))) ] && ok "RSS ${r0} -> ${r} KiB" || bad "RSS ${r0} -> ${r} KiB"
    stop_server attack
}

# Idle connections: --idle-timeout (1 s here) sends them a GOAWAY (NO_ERROR)
# and closes them; at the connection cap, the one idle longest makes room
# for a newcomer. Before: 64 idle connections held every slot for good.
case_attack_idle() {
    attack_server --idle-timeout 1
    local out n
    out=$(timeout 60 "${ATTACK[@]}" idle "$ADDR" 4 2>&1 | tail -1)
    case $out in
    "goaway 4 closed 0 open 0"*) ok "--idle-timeout 1: 4 idle connections: $out" ;;
    *) bad "--idle-timeout 1: $out" ;;
    esac
    n=$(refused idle)
    [ "${n:-0}" -ge 4 ] && ok "counted: connections_refused_total{reason=idle} $n" ||
        bad "connections_refused_total{reason=idle} '$n'"
    stop_server attack
    # Every slot held by idle connections (8, 4 from each of two addresses):
    # a client from a third address is served, one idle connection closed
    # for it (each has been idle the 1 s that makes it a candidate 1.1 s
    # after "connected", printed once the server's SETTINGS came on each).
    attack_server --max-connections 8 --max-connections-per-address 4
    "${ATTACK[@]}" idle "$ADDR" 4 --from 127.0.0.2 >"$T/idle2.out" 2>&1 &
    PIDS+=($!)
    "${ATTACK[@]}" idle "$ADDR" 4 --from 127.0.0.3 >"$T/idle3.out" 2>&1 &
    PIDS+=($!)
    local i
    for i in $(seq 600); do
        grep -q '^connected 4 of 4' "$T/idle2.out" && grep -q '^connected 4 of 4' "$T/idle3.out" && break
        sleep 0.1
    done
    grep -q '^connected 4 of 4' "$T/idle2.out" && grep -q '^connected 4 of 4' "$T/idle3.out" &&
        ok "8 idle connections hold every slot" || bad "idle connections: $(cat "$T"/idle?.out)"
    sleep 1.1
    served "with every slot held by idle connections"
    n=$(refused idle)
    [ "${n:-0}" -ge 1 ] && ok "an idle connection closed for it, counted: reason=idle $n" ||
        bad "connections_refused_total{reason=idle} '$n'"
    stop_server attack
}

# A client that half-closes (shutdown(SHUT_WR)) after its request is
# answered, over TLS too. Before: the connection was closed at its end of
# stream.
case_attack_halfclose() {
    attack_server
    local out
    out=$(timeout 60 "${ATTACK[@]}" halfclose "$ADDR" "$T/attack-token" 2>&1 | tail -1)
    case $out in
    "answered DATA "*" trailers 1") ok "ListModels then SHUT_WR: $out" ;;
    *) bad "ListModels then SHUT_WR: $out" ;;
    esac
    stop_server attack
    # Over TLS, the TCP connection half-closed without a close_notify,
    # right after a GetTensor whose 1 MiB answer needs no WINDOW_UPDATE:
    # answered whole. Before: OpenSSL 3 took the end of stream for a fatal
    # error (a decode_error alert to the client), every later write failed
    # and the connection was reset: "no answer".
    local d="$T/attack-tls"
    mkdir -p "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/key.pem" -out "$d/cert.pem" -days 2 \
        -subj /CN=localhost 2>/dev/null || { bad "openssl could not make a certificate"; return; }
    attack_server --tls-cert "$d/cert.pem" --tls-key "$d/key.pem"
    out=$(timeout 60 "${ATTACK[@]}" halfclose "$ADDR" "$T/attack-token" --get model.safetensors w --tls 2>&1 |
        tail -1)
    case $out in
    "answered DATA 10486"*" trailers 1") ok "TLS: GetTensor then SHUT_WR, no close_notify: $out" ;;
    *) bad "TLS: GetTensor then SHUT_WR, no close_notify: $out" ;;
    esac
    stop_server attack
}

