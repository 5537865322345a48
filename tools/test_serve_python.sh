#!/bin/sh
# The tests of sluice.client (the Python client of `sluice serve`, part of
# the package since it moved from bindings/serve-python) alone, against the
# real server of a build: for work on the client. tools/test_python.sh runs
# them with the rest of the package's tests.
# usage: tools/test_serve_python.sh [BUILD_DIR]   (default build-asan)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${1:-build-asan}
sh tools/deps.sh python3-grpcio python3-grpc-tools python3-numpy python3-pytest python3-venv
venv=build-py/venv
if ! "$venv/bin/python" -c "import sluice" 2>/dev/null; then
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q --no-build-isolation --no-deps --no-index --force-reinstall ./bindings/python
fi
gen=build-py/grpc-gen
rm -rf "$gen"
SLUICE_SERVE_PROTO_OUT=$gen SLUICE_BUILD=$build \
SLUICE_REAL_DATA=$(cd .. && pwd)/shared/data/real \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=build-py/tmp-client \
    bindings/python/tests/test_client_serve.py bindings/python/tests/test_client_checks.py
# and those left in bindings/serve-python/tests (the old names, by its shims)
if ls bindings/serve-python/tests/test_*.py >/dev/null 2>&1; then
    SLUICE_SERVE_PROTO_OUT=$gen SLUICE_BUILD=$build \
    SLUICE_REAL_DATA=$(cd .. && pwd)/shared/data/real \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=build-py/tmp-serve \
        bindings/serve-python/tests
fi
