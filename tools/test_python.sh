#!/bin/sh
# The Python binding's stage of the test suite: installs what is missing,
# builds the package (bindings/python: setup.py drives the project's CMake
# configuration, every feature found) into a virtual environment that sees
# Debian's NumPy and torch, and runs its pytest suite, which starts its own
# real servers (nginx, the fault server, s3rver, prometheus, sluice serve)
# and builds an AddressSanitizer copy of the extension for the lifetime test.
# usage: tools/test_python.sh [BUILD_DIR]   (tools/test.sh runs it; BUILD_DIR,
#   default build-asan: its sluice and sluice-serve are the ones the tests
#   run, sluice.client's tests skip without sluice-serve)
# SLUICE_PY_NO_TORCH=1 skips installing python3-torch (its tests then skip).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${1:-build-asan}
torch=python3-torch
[ "${SLUICE_PY_NO_TORCH:-0}" = 1 ] && torch=""
# cmake, pkg-config and the -dev packages: the one CMake build of the
# extension with every feature (libcurl: remote models; SQLite: the cache;
# librust-blake3-dev: BLAKE3's C sources; libmicrohttpd: serve_metrics);
# b3sum and openssl: the independent BLAKE3 digests and Ed25519 signatures
# the tests write manifests with; nginx, prometheus: the
# servers of test_remote.py and test_metrics.py (s3rver comes from npm
# when node and npm are there, as for the C tests; else its test skips);
# python3-grpcio and
# python3-grpc-tools: sluice.client; python3-cryptography: the model-signing fixtures;
# nodejs and npm: s3rver (test_remote.py), only where no node and npm are
# on PATH (NodeSource's nodejs carries its own npm, and conflicts with Debian's).
node=""
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || node="nodejs npm"
# shellcheck disable=SC2086
sh tools/deps.sh cmake pkg-config python3-dev python3-numpy python3-pytest python3-venv \
    python3-setuptools python3-wheel libssl-dev libcjson-dev liburing-dev libcurl4-openssl-dev \
    libsqlite3-dev librust-blake3-dev libmicrohttpd-dev b3sum openssl nginx prometheus \
    python3-grpcio python3-grpc-tools python3-cryptography $torch $node

# /usr/bin/python3 explicitly: the python3 first on PATH may be another
# interpreter that cannot see Debian's packages.
venv=build-py/venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
# No network: setuptools is Debian's (no build isolation), no dependency
# is fetched (NumPy and torch come from the system site).
"$venv/bin/pip" install -q --no-build-isolation --no-deps --no-index --force-reinstall ./bindings/python
# From the repository root, so that bindings/python/sluice (sources
# without the built extension) does not shadow the installed package.
gen=build-py/grpc-gen
rm -rf "$gen"
SLUICE_BUILD=$build SLUICE_SERVE_PROTO_OUT=$gen SLUICE_S3RVER_DIR=$build/s3rver-npm \
SLUICE_REAL_DATA=$(cd .. && pwd)/shared/data/real \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=build-py/tmp bindings/python/tests
# Tests of the client left in bindings/serve-python/tests (from before it
# moved into the package): they import it by its old names, which that
# folder's sluice_serve.py and conftest.py give; a run of their own (two
# conftest.py of one name cannot share a pytest session).
if ls bindings/serve-python/tests/test_*.py >/dev/null 2>&1; then
    SLUICE_BUILD=$build SLUICE_SERVE_PROTO_OUT=$gen \
    SLUICE_REAL_DATA=$(cd .. && pwd)/shared/data/real \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=build-py/tmp-serve \
        bindings/serve-python/tests
fi
# The README's Python and torch blocks (ctest readme_examples skipped them
# when it ran before this venv existed), when the ASan build is there.
if [ -f build-asan/CTestTestfile.cmake ]; then
    ctest --test-dir build-asan -R '^readme_examples$' --output-on-failure
fi
