#!/bin/sh
# Installs the Debian packages sluice needs that are missing.
# usage: tools/deps.sh [extra packages...]
# Run as root (or with sudo available) on Debian 12.
set -eu
need="build-essential cmake pkg-config libssl-dev libcjson-dev liburing-dev libcmocka-dev $*"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
