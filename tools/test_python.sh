#!/bin/sh
# The Python binding's stage of the test suite: installs what is missing,
# builds the package (bindings/python) into a virtual environment that sees
# Debian's NumPy and torch, and runs its pytest suite (which also builds an
# AddressSanitizer copy of the extension for the lifetime test).
# usage: tools/test_python.sh        (tools/test.sh runs it)
# SLUICE_PY_NO_TORCH=1 skips installing python3-torch (its tests then skip).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
torch=python3-torch
[ "${SLUICE_PY_NO_TORCH:-0}" = 1 ] && torch=""
# librust-blake3-dev: the BLAKE3 C sources setup.py compiles in; b3sum and
# openssl: the independent BLAKE3 digests and Ed25519 signatures the tests
# write manifests with; libsqlite3-dev: the persistent cache (test_cache.py).
sh tools/deps.sh python3-dev python3-numpy python3-pytest python3-venv python3-setuptools \
    librust-blake3-dev b3sum openssl libsqlite3-dev python3-cryptography $torch

# /usr/bin/python3 explicitly: the python3 first on PATH may be another
# interpreter that cannot see Debian's packages.
venv=build-py/venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
# No network: setuptools is Debian's (no build isolation), no dependency
# is fetched (NumPy and torch come from the system site).
"$venv/bin/pip" install -q --no-build-isolation --no-deps --no-index --force-reinstall ./bindings/python
# From the repository root, so that bindings/python/sluice (sources
# without the built extension) does not shadow the installed package.
"$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp=build-py/tmp bindings/python/tests
# The README's Python and torch blocks (ctest readme_examples skipped them
# when it ran before this venv existed), when the ASan build is there.
if [ -f build-asan/CTestTestfile.cmake ]; then
    ctest --test-dir build-asan -R '^readme_examples$' --output-on-failure
fi
