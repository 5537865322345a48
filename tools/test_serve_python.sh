#!/bin/sh
# The Python client of `sluice serve` (bindings/serve-python/sluice_serve.py):
# generates its gRPC modules from proto/ with Debian's python3-grpc-tools and
# runs its pytest suite against the real server process of a build.
# usage: tools/test_serve_python.sh [BUILD_DIR]   (default build-asan; tools/test.sh runs it)
# Skipped (exit 0, said so) when BUILD_DIR has no sluice-serve (grpc++ not found).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${1:-build-asan}
if [ ! -x "$build/sluice-serve" ]; then
    echo "test_serve_python: $build/sluice-serve not built (grpc++ missing): skipped"
    exit 0
fi
sh tools/deps.sh python3-grpcio python3-grpc-tools python3-numpy python3-pytest python3-venv
# /usr/bin/python3 explicitly: the python3 first on PATH may be another
# interpreter that cannot see Debian's packages.
venv=build-serve-py/venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
gen=build-serve-py/gen
rm -rf "$gen"
SLUICE_SERVE_PROTO_OUT=$gen SLUICE_BUILD=$build \
SLUICE_REAL_DATA=$(cd .. && pwd)/shared/data/real PYTHONPATH=bindings/serve-python \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=build-serve-py/tmp bindings/serve-python/tests
