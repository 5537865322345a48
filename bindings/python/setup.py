"""Builds the sluice Python package: the extension sluice._sluice.

One build: the extension is built by the project's own CMake
configuration (the top-level CMakeLists.txt with -DSLUICE_PYTHON=ON, the
target sluice_python of bindings/python/CMakeLists.txt), linked against
the position-independent static library (libsluice.a, hidden symbols)
with every optional feature CMake finds: libcurl (remote models and
mirrors), SQLite (the persistent cache), BLAKE3, libmicrohttpd (the
metrics endpoint). A feature added to the library reaches Python without
editing this file. Why CMake and not a second list of sources here: the
feature detection (pkg-config, the BLAKE3 sources of librust-blake3-dev
and their per-file SIMD flags) lives once, in CMake, and Debian 12 ships
all it needs (cmake, pkg-config, the -dev packages); nothing is fetched.
The package then needs no libsluice.so at run time, only the system's
shared libraries (libcrypto, libcjson, liburing, and libcurl, libsqlite3,
libmicrohttpd when found). `sluice.features()` says what a build has.

Debian 12: apt-get install cmake pkg-config python3-dev python3-setuptools
python3-wheel (pip builds a wheel: without it, "invalid command bdist_wheel") libssl-dev
libcjson-dev liburing-dev, and for the features libcurl4-openssl-dev
libsqlite3-dev librust-blake3-dev libmicrohttpd-dev.

Environment:
  SLUICE_SOURCE_DIR   the repository root (default: two directories up)
  SLUICE_CMAKE_ARGS   more -D arguments for the configuration (for example
                      -DSLUICE_WITH_CURL=OFF; for this build only: each build
                      asks for every feature again before these)
  SLUICE_EXTRA_CFLAGS / SLUICE_EXTRA_LDFLAGS   added flags, for the library
                      and the extension alike (the ASan test builds with
                      -fsanitize=address through them)
  CMAKE               the cmake program (default: cmake on PATH)
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

here = os.path.dirname(os.path.abspath(__file__))
root = os.environ.get("SLUICE_SOURCE_DIR") or os.path.normpath(os.path.join(here, "..", ".."))
if not os.path.isfile(os.path.join(root, "include", "sluice.h")):
    raise SystemExit(f"sluice sources not found in {root}: set SLUICE_SOURCE_DIR")
PROTO = os.path.join(root, "proto", "sluice", "v1", "tensor_service.proto")


class CMakeBuild(build_ext):
    """Configures the top-level project in build_temp and builds the one
    target sluice_python, written straight where setuptools wants the
    module."""

    def build_extension(self, ext):
        cmake = os.environ.get("CMAKE") or shutil.which("cmake")
        if not cmake:
            raise SystemExit("cmake not found (apt-get install cmake pkg-config)")
        out = os.path.abspath(self.get_ext_fullpath(ext.name))
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build, exist_ok=True)
        cflags = os.environ.get("SLUICE_EXTRA_CFLAGS", "")
        ldflags = os.environ.get("SLUICE_EXTRA_LDFLAGS", "")
        args = [cmake, "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                "-DSLUICE_PYTHON=ON", "-DSLUICE_BUILD_TESTS=OFF", "-DSLUICE_BUILD_TOOLS=OFF",
                "-DSLUICE_WITH_GRPC=OFF", "-DSLUICE_MAN=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}",
                f"-DSLUICE_PYTHON_OUTPUT_DIR={os.path.dirname(out)}",
                f"-DSLUICE_PYTHON_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}",
                f"-DCMAKE_C_FLAGS={cflags}",
                f"-DCMAKE_MODULE_LINKER_FLAGS={ldflags}"]
        # Every feature asked for again on each configuration: CMake keeps an
        # option in its cache, so a -DSLUICE_WITH_CURL=OFF of an earlier
        # build (pip's in-tree build/) would otherwise stay off for good.
        # SLUICE_CMAKE_ARGS, after these, still turns any of them off.
        args += [f"-DSLUICE_WITH_{f}=ON" for f in ("CURL", "SQLITE", "BLAKE3", "MICROHTTPD")]
        args += shlex.split(os.environ.get("SLUICE_CMAKE_ARGS", ""))
        subprocess.run(args, check=True, stdout=None if self.verbose else subprocess.DEVNULL)
        # build_ext -j N, else 2 (the library is some 30 files)
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 1 else 2
        jobs = str(min(jobs, os.cpu_count() or 1))
        subprocess.run([cmake, "--build", build, "--target", "sluice_python", "-j", jobs],
                       check=True)
        if not os.path.isfile(out):
            raise SystemExit(f"CMake did not write {out}")


class BuildPy(build_py):
    """Ships the service's proto inside the package, for sluice.client, and
    when grpc_tools (python3-grpc-tools) is there, its gRPC modules
    generated from it (sluice/_pb): then python3-grpcio alone imports
    sluice.client. Without grpc_tools here they are generated on first
    use (which then needs it)."""

    def run(self):
        super().run()
        if not os.path.isfile(PROTO):
            return
        self.copy_file(PROTO, os.path.join(self.build_lib, "sluice", "tensor_service.proto"))
        try:
            from grpc_tools import protoc
        except ImportError:
            return
        out = os.path.join(self.build_lib, "sluice", "_pb")
        os.makedirs(out, exist_ok=True)
        rc = protoc.main(["protoc", "-I" + os.path.dirname(PROTO), "--python_out=" + out,
                          "--grpc_python_out=" + out, PROTO])
        if rc != 0:
            raise SystemExit(f"grpc_tools.protoc failed on {PROTO} ({rc})")


setup(
    name="sluice",
    version="0.1.0",
    description="Lazy, verified loading of .safetensors weights (Python binding of libsluice)",
    packages=["sluice"],
    # The sources are CMake's to compile; setuptools only names the module.
    ext_modules=[Extension("sluice._sluice", sources=[])],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
    python_requires=">=3.11",
)
