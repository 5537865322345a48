"""Builds the sluice Python package: the extension sluice._sluice.

The extension is self-contained: the library's C sources (../../src/*.c,
or $SLUICE_SOURCE_DIR) are compiled into it, hidden, so the package needs
no libsluice.so at run time, only the system's libcrypto, libcjson and
liburing (Debian: libssl-dev, libcjson-dev, liburing-dev to build).

Environment:
  SLUICE_SOURCE_DIR   the repository root (default: two directories up)
  SLUICE_STATIC_LIB   link this libsluice.a instead of compiling src/
                      (its objects must be position-independent, as the
                      CMake build makes them)
  SLUICE_EXTRA_CFLAGS / SLUICE_EXTRA_LDFLAGS   added flags (the ASan test
                      builds with -fsanitize=address through them)
"""
import glob
import os
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

here = os.path.dirname(os.path.abspath(__file__))
root = os.environ.get("SLUICE_SOURCE_DIR") or os.path.normpath(os.path.join(here, "..", ".."))
if not os.path.isfile(os.path.join(root, "include", "sluice.h")):
    raise SystemExit(f"sluice sources not found in {root}: set SLUICE_SOURCE_DIR")


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "libcrypto", "libcjson", "liburing"],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("pkg-config cannot find libcrypto, libcjson, liburing "
                         f"(apt-get install libssl-dev libcjson-dev liburing-dev): {e}")
    return shlex.split(out)


static_lib = os.environ.get("SLUICE_STATIC_LIB")
sources = ["src/_sluice.c"]
extra_objects = []
if static_lib:
    extra_objects.append(static_lib)
else:
    # Relative paths: setuptools wants them relative to setup.py. Every
    # file of src/ builds here as in CMake; metrics_http.c without
    # SLUICE_HAVE_MICROHTTPD (not defined here, libmicrohttpd not linked)
    # is its stub: sluice_metrics_serve says SLUICE_E_UNSUPPORTED, which
    # the binding does not call.
    sources += sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(root, "src", "*.c")))

cflags = ["-std=c11", "-fvisibility=hidden", "-Wno-unused-parameter"]
cflags += shlex.split(os.environ.get("SLUICE_EXTRA_CFLAGS", ""))
ldflags = ["-Wl,-z,nodelete"]  # the library's thread-key destructor stays mapped
ldflags += shlex.split(os.environ.get("SLUICE_EXTRA_LDFLAGS", ""))

ext = Extension(
    "sluice._sluice",
    sources=sources,
    include_dirs=[os.path.join(root, "include"), os.path.join(root, "src")]
    + [f[2:] for f in pkg_config("--cflags-only-I")],
    define_macros=[("_GNU_SOURCE", None), ("SLUICE_STATIC", None)],
    extra_compile_args=cflags,
    extra_link_args=ldflags + pkg_config("--libs") + ["-lpthread"],
    extra_objects=extra_objects,
)


class BuildExt(build_ext):
    """Compiles on two processes by default (the library is some 20 files)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = min(2, os.cpu_count() or 1)


setup(
    name="sluice",
    version="0.1.0",
    description="Lazy, verified loading of .safetensors weights (Python binding of libsluice)",
    packages=["sluice"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    python_requires=">=3.11",
)
