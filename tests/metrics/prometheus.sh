#!/bin/sh
# metrics_prometheus: a real Prometheus server (Debian package prometheus,
# run in the foreground, never a system service) scrapes test_metrics
# --serve, which loaded a model with one tampered tensor; then the test
# asks Prometheus's HTTP API for sluice_checksum_failures_total (must be
# 1) and the acquire-wait histogram (must have observations). 127.0.0.1
# only, temp config and storage, every wait bounded, both processes
# killed on every exit. Exit 77 (skip) only when prometheus or curl is
# not installed.
# usage: prometheus.sh TEST_METRICS_BINARY
set -u
bin=$1
for tool in prometheus curl; do
    command -v $tool >/dev/null 2>&1 || { echo "SKIP: $tool not installed (apt-get install -y prometheus curl)"; exit 77; }
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-prometheus.XXXXXX")
served="" prom=""
cleanup() {
    [ -n "$prom" ] && kill "$prom" 2>/dev/null
    [ -n "$served" ] && kill "$served" 2>/dev/null
    [ -n "$prom" ] && wait "$prom" 2>/dev/null
    [ -n "$served" ] && wait "$served" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() { echo "FAIL: $*"; echo "--- prometheus log"; tail -n 30 "$dir/prom.log" 2>/dev/null; exit 1; }

TMPDIR="$dir" "$bin" --serve "$dir/port" 90 &  # its model lives in $dir too
served=$!
i=0
while [ ! -s "$dir/port" ]; do
    i=$((i + 1)); [ $i -le 200 ] || fail "test_metrics --serve wrote no port in 20 s"
    if ! kill -0 "$served" 2>/dev/null; then
        wait "$served"; st=$?; served=""
        [ "$st" -eq 77 ] && { echo "SKIP: the library has no metrics endpoint (built without libmicrohttpd)"; exit 77; }
        fail "test_metrics --serve exited ($st)"
    fi
    sleep 0.1
done
port=$(cat "$dir/port")
pport=$("$bin" --free-port) || fail "no free port"
cat > "$dir/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: sluice
    static_configs:
      - targets: ['127.0.0.1:$port']
YML
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$dir/prom.log" 2>&1 &
prom=$!
api="http://127.0.0.1:$pport/api/v1/query"
query() { curl -s -m 2 -G "$api" --data-urlencode "query=$1"; }
i=0
while :; do
    i=$((i + 1)); [ $i -le 60 ] || fail "Prometheus did not report sluice_checksum_failures_total = 1 in 60 s; last answer: $(query sluice_checksum_failures_total)"
    kill -0 "$prom" 2>/dev/null || fail "prometheus exited"
    out=$(query 'sluice_checksum_failures_total{model="tampered"}')
    case "$out" in *'"value":['*',"1"]'*) break ;; esac
    sleep 1
done
echo "checksum failures: $out"
out=$(query 'sluice_acquire_wait_seconds_count{model="tampered"}')
case "$out" in *'"value":['*',"0"]'*|*'"result":[]'*) fail "acquire histogram empty: $out" ;; *'"value":['*) ;; *) fail "no acquire histogram: $out" ;; esac
echo "acquire wait count: $out"
out=$(query 'count(sluice_acquire_wait_seconds_bucket{model="tampered"})')
case "$out" in *'"value":['*',"20"]'*) ;; *) fail "acquire histogram buckets: $out (want 20 series)" ;; esac
out=$(query 'up{job="sluice"}')
case "$out" in *'"value":['*',"1"]'*) ;; *) fail "target not up: $out" ;; esac
echo "metrics_prometheus: Prometheus scraped the endpoint and saw the tampered tensor"
