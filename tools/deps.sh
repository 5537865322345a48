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
# Packages such as prometheus and nginx start a system service when
# installed; the tests start their own servers and want none. A
# policy-rc.d that answers 101 ("action not allowed") stops invoke-rc.d
# and deb-systemd-invoke from starting them, for this install only.
policy=/usr/sbin/policy-rc.d
own_policy=""
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    own_policy=1
    trap '$sudo rm -f "$policy"' INT TERM
fi
status=0
$sudo apt-get update -qq || status=$?
# shellcheck disable=SC2086
[ "$status" -ne 0 ] || $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null || status=$?
[ -z "$own_policy" ] || $sudo rm -f "$policy"
exit "$status"
