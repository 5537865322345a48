#!/bin/sh
# Serves a directory over HTTP on 127.0.0.1 with nginx, in the foreground
# (Ctrl-C or SIGTERM stops it), to try remote models locally: nginx answers
# range requests and sends strong ETags, which is all sluice asks of a
# server. Configuration and logs live in a temporary directory, removed on
# exit; nothing system-wide is touched.
# usage: tools/serve_http.sh DIR PORT     (exit 77 when nginx is not installed)
# SLUICE_HTTP_ACCESS_LOG=FILE logs each request to FILE as
# "STATUS BODY_BYTES RANGE URI" (the Python tests count tensor bytes so).
set -eu
[ $# -eq 2 ] || { echo "usage: tools/serve_http.sh DIR PORT" >&2; exit 2; }
dir=$(cd "$1" && pwd)
port=$2
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || { echo "serve_http.sh: nginx is not installed (apt-get install nginx)" >&2; exit 77; }
t=$(mktemp -d /tmp/sluice-http.XXXXXX)
log="access_log off;"
[ -z "${SLUICE_HTTP_ACCESS_LOG:-}" ] || log="log_format req '\$status \$body_bytes_sent \$http_range \$request_uri'; access_log $SLUICE_HTTP_ACCESS_LOG req;"
user=""
[ "$(id -u)" -ne 0 ] || user="user root;"
cat >"$t/nginx.conf" <<CONF
$user
worker_processes 1;
pid $t/nginx.pid;
error_log $t/error.log warn;
events { worker_connections 256; }
http {
  $log
  client_body_temp_path $t/cb; proxy_temp_path $t/px;
  fastcgi_temp_path $t/fc; uwsgi_temp_path $t/uw; scgi_temp_path $t/sc;
  default_type application/octet-stream;
  server { listen 127.0.0.1:$port; location / { root $dir; } }
}
CONF
"$nginx" -e stderr -p "$t" -c "$t/nginx.conf" -g 'daemon off;' &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$t"; exit 0' INT TERM
echo "serving $dir on http://127.0.0.1:$port/"
status=0
wait $pid || status=$?
rm -rf "$t"
exit $status
