"""The one build: setup.py builds the extension through the project's
CMake, so what CMake leaves out the package lacks too, and says so.
A copy built with every optional feature turned off
(SLUICE_CMAKE_ARGS=-DSLUICE_WITH_CURL=OFF ...) reports them all False in
sluice.features(), and each use raises UnsupportedError naming the Debian
package to install; the installed build reports what CMake found here."""
import os
import shutil
import subprocess
import sys
import textwrap

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


CMAKE_CONFIGURE_ONLY = r"""#!/bin/sh
# cmake for setup.py, configuring only: a build just writes the module's
# file where setup.py looks for it (the real build is bare_build's).
if [ "$1" = --build ]; then
    dir=$(sed -n 's/^SLUICE_PYTHON_OUTPUT_DIR:[A-Z]*=//p' "$2/CMakeCache.txt")
    suffix=$(sed -n 's/^SLUICE_PYTHON_SUFFIX:[A-Z]*=//p' "$2/CMakeCache.txt")
    mkdir -p "$dir" && : > "$dir/_sluice$suffix"
    exit
fi
exec cmake "$@"
"""


def test_a_rebuild_does_not_keep_the_last_builds_options(tmp_path):
    # A build with SLUICE_CMAKE_ARGS=-DSLUICE_WITH_CURL=OFF, then one
    # without, in the same build directory (pip's in-tree build/): the
    # second has libcurl again, as its own arguments say; CMake's cache
    # must not carry the first one's choice over.
    import shutil as _shutil
    if not _shutil.which("cmake"):
        pytest.skip("cmake is not installed")
    fake = tmp_path / "cmake"
    fake.write_text(CMAKE_CONFIGURE_ONLY)
    fake.chmod(0o755)
    base = tmp_path / "b"

    def configure(cmake_args):
        env = dict(os.environ, CMAKE=str(fake), SLUICE_CMAKE_ARGS=cmake_args)
        r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-temp",
                            str(base / "temp"), "--build-lib", str(base / "lib")],
                           cwd=PKG, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        cache = (base / "temp" / "cmake" / "CMakeCache.txt").read_text()
        return {line.split("=", 1)[0].split(":")[0]: line.split("=", 1)[1]
                for line in cache.splitlines() if line.startswith("SLUICE_WITH_")}

    assert configure("-DSLUICE_WITH_CURL=OFF")["SLUICE_WITH_CURL"] == "OFF"
    assert configure("")["SLUICE_WITH_CURL"] == "ON"


def _client_probe(pythonpath, tmpdir, block_grpc_tools):
    probe = textwrap.dedent("""
        import sys
        if %r:
            class Block:
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] == "grpc_tools":
                        raise ModuleNotFoundError("No module named 'grpc_tools' (blocked)")
            sys.meta_path.insert(0, Block())
        import sluice.client
        print(sluice.client.pb.__name__, sluice.client.pb_grpc.__name__)
    """ % block_grpc_tools)
    env = dict(os.environ, PYTHONPATH=pythonpath, TMPDIR=str(tmpdir))
    env.pop("SLUICE_SERVE_PROTO_OUT", None)
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=120, cwd=str(tmpdir))


def test_importing_the_client_leaves_no_temporary_directory(tmp_path):
    # without modules generated at build time, each import generated them
    # into a new mkdtemp() that stayed behind: one directory per process
    pytest.importorskip("grpc")
    pytest.importorskip("grpc_tools")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(sluice.__file__)))
    lib = tmp_path / "lib"
    shutil.copytree(os.path.join(pkg, "sluice"), lib / "sluice", symlinks=False,
                    ignore=shutil.ignore_patterns("_pb", "__pycache__"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for _ in range(2):
        r = _client_probe(str(lib), tmp, block_grpc_tools=False)
        assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp)) == [], os.listdir(tmp)


def test_the_client_imports_without_grpc_tools_once_installed(tmp_path):
    # setup.py's build_py generates the gRPC modules into the package when
    # grpc_tools is there at build time: at run time python3-grpcio is enough
    pytest.importorskip("grpc")
    pytest.importorskip("grpc_tools")
    lib = tmp_path / "lib"
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)],
                       cwd=PKG, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert os.path.isfile(lib / "sluice" / "_pb" / "tensor_service_pb2_grpc.py")
    ext = [f for f in os.listdir(os.path.dirname(sluice.__file__)) if f.startswith("_sluice.")]
    for f in ext:
        shutil.copy(os.path.join(os.path.dirname(sluice.__file__), f), lib / "sluice" / f)
    r = _client_probe(str(lib), tmp_path, block_grpc_tools=True)
    assert r.returncode == 0, r.stderr
    assert "tensor_service_pb2" in r.stdout
