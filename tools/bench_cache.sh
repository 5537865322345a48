#!/bin/sh
# Measures the persistent cache: serves a model directory with nginx (an
# unprivileged foreground process on 127.0.0.1, a free port, its config
# in a temp dir, stopped on exit), counts the requests the server sees
# for a cold and a warm cached load, then runs `sluice bench-cache`.
# usage: tools/bench_cache.sh MODEL [SLUICE_BINARY] [bench-cache options...]
#   MODEL: a .safetensors file or a model directory (with its manifest)
#   e.g. tools/bench_cache.sh /tmp/sluice-llama1b/model.safetensors build-release/sluice --runs 5
set -eu
if [ -d "$1" ]; then
    model=$(cd "$1" && pwd)
    served=$model
    name=""
else
    served=$(cd "$(dirname "$1")" && pwd)
    name=$(basename "$1")
    model=$served/$name
fi
sluice=${2:-build-release/sluice}
[ $# -ge 2 ] && shift 2 || shift $#
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || { echo "bench_cache.sh: nginx is not installed (apt-get install -y nginx)" >&2; exit 2; }
tmp=$(mktemp -d)
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
user=""
[ "$(id -u)" -eq 0 ] && user="user root;"
cat > "$tmp/nginx.conf" <<CONF
$user
worker_processes 2;
pid $tmp/nginx.pid;
error_log $tmp/error.log warn;
events { worker_connections 512; }
http {
  log_format req '\$status \$http_range \$body_bytes_sent \$uri';
  access_log $tmp/access.log req;
  client_body_temp_path $tmp/cb; proxy_temp_path $tmp/px;
  fastcgi_temp_path $tmp/fc; uwsgi_temp_path $tmp/uw; scgi_temp_path $tmp/sc;
  default_type application/octet-stream;
  sendfile on; tcp_nopush on; keepalive_requests 1000000;
  server { listen 127.0.0.1:$port; location / { root $served; } }
}
CONF
"$nginx" -e stderr -p "$tmp" -c "$tmp/nginx.conf" -g 'daemon off;' 2>"$tmp/nginx.err" &
pid=$!
i=0
until /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "bench_cache.sh: nginx did not start" >&2; cat "$tmp/nginx.err" >&2; exit 2; }
    sleep 0.1
done
url="http://127.0.0.1:$port/$name"
cache="$tmp/cache"
count() { # requests logged since the last count: all, and those for tensor bytes
    n=$(wc -l < "$tmp/access.log")
    echo "$1: $((n - seen)) requests to the server"
    seen=$n
}
seen=0
: > "$tmp/access.log"
"$sluice" cache --cache-dir "$cache" clear >/dev/null 2>&1 || true
"$sluice" stats "$url" --cache-dir "$cache" >/dev/null
first_cold=$(( $(wc -l < "$tmp/access.log") - seen ))
count "cold cached load (open + every tensor)"
"$sluice" stats "$url" --cache-dir "$cache" >/dev/null
count "warm cached load (open + every tensor)"
"$sluice" inspect "$url" >/dev/null
count "an open alone (headers and manifest; sluice inspect)"
# Four processes at once on an empty cache: each may fetch what the
# others have not stored yet when it starts a tensor.
"$sluice" cache --cache-dir "$cache" clear >/dev/null
loaders=""
for k in 1 2 3 4; do
    "$sluice" stats "$url" --cache-dir "$cache" >/dev/null &
    loaders="$loaders $!"
done
for l in $loaders; do wait "$l"; done
n=$(wc -l < "$tmp/access.log")
echo "four processes at once, cold: $((n - seen)) requests to the server (one cold load alone: $((first_cold)))"
seen=$n
"$sluice" bench-cache "$model" --url "$url" --cache-dir "$cache" "$@"
