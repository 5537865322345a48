#!/bin/bash
# Measures a fleet loading through a caching proxy (docs/remote.md,
# "Proxies"): an nginx origin and a squid caching proxy, both unprivileged
# foreground processes on 127.0.0.1 with their configs in a temp dir
# (stopped on exit), then NODES processes (`sluice stats URL`: every
# tensor loaded and verified, no cache shared) at once straight to the
# origin, then NODES at once through a cold squid. Prints, for each: the
# bytes the origin sent, the aggregate throughput (NODES x the model over
# the wall time of the whole run) and each process's p50/p90 time.
# usage: tools/bench_proxy.sh [SLUICE_BINARY] [MIB] [NODES]
#   SLUICE_BINARY: default build-release/sluice; MIB: the generated model's
#   size (16 tensors, random bytes; default 256); NODES: default 8
set -eu
sluice=$(realpath "${1:-build-release/sluice}")
mib=${2:-256}
nodes=${3:-8}
nginx=$(command -v nginx || echo /usr/sbin/nginx)
squid=$(command -v squid || echo /usr/sbin/squid)
[ -x "$nginx" ] || { echo "bench_proxy.sh: nginx is not installed" >&2; exit 2; }
[ -x "$squid" ] || { echo "bench_proxy.sh: squid is not installed (apt-get install -y squid)" >&2; exit 2; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
freeport() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# the model: 16 tensors of MIB/16 MiB of random bytes, and its manifest
mkdir "$tmp/www"
/usr/bin/python3 - "$tmp/www/model.safetensors" "$mib" <<'EOF'
import json, os, struct, sys
path, mib = sys.argv[1], int(sys.argv[2])
n, each = 16, int(sys.argv[2]) * (1 << 20) // 16
hdr, off = {}, 0
for i in range(n):
    hdr["layer.%d.weight" % i] = {"dtype": "U8", "shape": [each], "data_offsets": [off, off + each]}
    off += each
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i in range(n):
        f.write(os.urandom(each))
EOF
"$sluice" manifest "$tmp/www/model.safetensors" -q -o "$tmp/www/model.safetensors.manifest.json"
model_bytes=$(( $(stat -c %s "$tmp/www/model.safetensors") + $(stat -c %s "$tmp/www/model.safetensors.manifest.json") ))

oport=$(freeport)
user=""; [ "$(id -u)" -eq 0 ] && user="user root;"
cat > "$tmp/nginx.conf" <<EOF
$user
worker_processes 2;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log warn;
events { worker_connections 1024; }
http {
  log_format sent '\$body_bytes_sent';
  access_log $tmp/bytes.log sent;
  client_body_temp_path $tmp/cb; proxy_temp_path $tmp/px;
  fastcgi_temp_path $tmp/fc; uwsgi_temp_path $tmp/uw; scgi_temp_path $tmp/sc;
  sendfile on; tcp_nopush on; keepalive_requests 1000000;
  server { listen 127.0.0.1:$oport; location / { root $tmp/www; } }
}
EOF
"$nginx" -e stderr -p "$tmp" -c "$tmp/nginx.conf" -g "daemon off;" 2>"$tmp/nginx.err" &
pids="$pids $!"

# squid: the settings test_remote_proxy uses (docs/remote.md says why)
sport=$(freeport)
mkdir "$tmp/sq"
owner=""
if [ "$(id -u)" -eq 0 ]; then owner="cache_effective_user proxy"; chown proxy "$tmp/sq"; fi
cat > "$tmp/sq/squid.conf" <<EOF
http_port 127.0.0.1:$sport
$owner
pid_filename $tmp/sq/squid.pid
cache_dir ufs $tmp/sq/cache $((mib * 2 + 64)) 16 64
cache_mem 256 MB
maximum_object_size 64 GB
maximum_object_size_in_memory 512 MB
range_offset_limit -1
quick_abort_min -1 KB
collapsed_forwarding on
refresh_pattern . 1440 100% 10080
access_log stdio:$tmp/sq/access.log
cache_log $tmp/sq/cache.log
cache_store_log none
coredump_dir $tmp/sq
netdb_filename none
shutdown_lifetime 0 seconds
http_access allow all
EOF
"$squid" -N -z -f "$tmp/sq/squid.conf" >/dev/null 2>&1
"$squid" -N -f "$tmp/sq/squid.conf" >/dev/null 2>&1 &
pids="$pids $!"
for _ in $(seq 500); do
    (exec 3<>/dev/tcp/127.0.0.1/$oport) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/$sport) 2>/dev/null && break
    sleep 0.02
done
(exec 3<>/dev/tcp/127.0.0.1/$oport) 2>/dev/null || { echo "bench_proxy.sh: nginx did not start: $(cat "$tmp/nginx.err")" >&2; exit 2; }
(exec 3<>/dev/tcp/127.0.0.1/$sport) 2>/dev/null || { echo "bench_proxy.sh: squid did not start: $(tail -3 "$tmp/sq/cache.log")" >&2; exit 2; }

url="http://127.0.0.1:$oport/model.safetensors"
sent() { awk '{s += $1} END {printf "%.0f\n", s}' "$tmp/bytes.log" 2>/dev/null || echo 0; }

# run LABEL [--proxy URL]: NODES processes at once, each timed
run() {
    label=$1; shift
    before=$(sent)
    t0=$(date +%s.%N)
    np=""
    for k in $(seq "$nodes"); do
        ( s=$(date +%s.%N)
          "$sluice" stats "$url" --pool 1G "$@" > "$tmp/out.$k" 2> "$tmp/err.$k" || echo "node $k failed: $(cat "$tmp/err.$k")" >&2
          e=$(date +%s.%N); echo "$s $e" | awk '{print $2 - $1}' > "$tmp/time.$k" ) &
        np="$np $!"
    done
    for p in $np; do wait "$p" || true; done
    t1=$(date +%s.%N)
    after=$(sent)
    for k in $(seq "$nodes"); do
        grep -q '^sluice_tensors_verified_total{[^}]*} 16$' "$tmp/out.$k" || echo "node $k: not every tensor verified" >&2
    done
    fails=$(cat "$tmp"/out.* | awk '/^sluice_proxy_failures_total/ {s += $2} END {print s + 0}')
    cat "$tmp"/time.* | sort -n > "$tmp/times"
    p50=$(awk -v n="$nodes" 'NR == int((n + 1) * 0.5) || (NR == 1 && n == 1) {print; exit}' "$tmp/times")
    p90=$(awk -v n="$nodes" '{a[NR] = $1} END {i = int(n * 0.9 + 0.999); if (i > n) i = n; print a[i]}' "$tmp/times")
    echo "$label $((after - before)) $t0 $t1 $p50 $p90 $fails" | awk -v mb="$model_bytes" -v n="$nodes" '{
        wall = $4 - $3
        printf "| %s | %.0f | %.2f x | %.0f MB/s | %.2f s | %.2f s | %.2f s | %.0f |\n",
               $1, $2, $2 / mb, n * mb / wall / 1e6, wall, $5, $6, $7 }'
    rm -f "$tmp"/out.* "$tmp"/err.* "$tmp"/time.*
}

echo "model: $model_bytes bytes (16 tensors and the manifest), $nodes processes at once, $(nproc) CPUs"
echo "| run | origin bytes | x model | aggregate | wall | p50 per process | p90 per process | proxy failures |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
run direct
run squid-cold --proxy "http://127.0.0.1:$sport"
run squid-warm --proxy "http://127.0.0.1:$sport"
