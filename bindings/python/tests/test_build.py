"""The one build: setup.py builds the extension through the project's
CMake, so what CMake leaves out the package lacks too, and says so.
A copy built with every optional feature turned off
(SLUICE_CMAKE_ARGS=-DSLUICE_WITH_CURL=OFF ...) reports them all False in
sluice.features(), and each use raises UnsupportedError naming the Debian
package to install; the installed build reports what CMake found here."""
import os
import subprocess
import sys

import pytest

import sluice

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, ".."))

PROBE = r"""
import json, sluice
out = {"features": sluice.features(), "errors": {}}
def attempt(key, fn):
    try:
        fn()
        out["errors"][key] = None
    except sluice.UnsupportedError as e:
        out["errors"][key] = str(e)
attempt("remote", lambda: sluice.open("http://127.0.0.1:9/m/"))
attempt("s3", lambda: sluice.open("s3://bucket/m/"))
attempt("cache", lambda: sluice.Cache("/nonexistent-never-made"))
attempt("metrics_http", lambda: sluice.serve_metrics())
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def bare_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("bare")
    env = dict(os.environ, SLUICE_CMAKE_ARGS="-DSLUICE_WITH_CURL=OFF -DSLUICE_WITH_SQLITE=OFF "
               "-DSLUICE_WITH_MICROHTTPD=OFF -DSLUICE_WITH_BLAKE3=OFF")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(out / "b"),
                        "egg_info", "--egg-base", str(out)],
                       cwd=PKG, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail("bare build failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    libs = [os.path.join(out, "b", d) for d in os.listdir(out / "b") if d.startswith("lib")]
    return libs[0]


def test_features_follow_cmake(bare_build):
    import json
    r = subprocess.run([sys.executable, "-c", PROBE], env=dict(os.environ, PYTHONPATH=bare_build),
                       capture_output=True, text=True, timeout=120, cwd=HERE)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["features"] == {"remote": False, "s3": False, "cache": False, "blake3": False,
                               "metrics_http": False}
    for key, pkg in (("remote", "libcurl4-openssl-dev"), ("s3", "libcurl4-openssl-dev"),
                     ("cache", "libsqlite3-dev"), ("metrics_http", "libmicrohttpd-dev")):
        msg = got["errors"][key]
        assert msg and f"apt-get install {pkg}" in msg, (key, msg)


def test_the_installed_build_has_what_cmake_found():
    # tools/test_python.sh installs every feature's -dev package first
    f = sluice.features()
    for key in ("remote", "s3", "cache", "metrics_http"):
        assert f[key], f"the installed build lacks {key}: {f}"
