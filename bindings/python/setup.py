"""Builds the sluice Python package: the extension sluice._sluice.

The extension is self-contained: the library's C sources (../../src/*.c,
or $SLUICE_SOURCE_DIR) are compiled into it, hidden, so the package needs
no libsluice.so at run time, only the system's libcrypto, libcjson and
liburing (Debian: libssl-dev, libcjson-dev, liburing-dev to build).

BLAKE3 digests, as in the CMake build: the upstream C sources that
Debian's librust-blake3-dev ships (/usr/share/cargo/registry/blake3-*/c,
the newest version; never copied into the tree) are compiled into the
extension too, with SLUICE_HAVE_BLAKE3, the x86-64 SIMD files each with
its own -m flags (BLAKE3 picks one at run time). Without those sources
the extension builds without BLAKE3 (a note on stderr) and a BLAKE3
manifest raises UnsupportedError.

The persistent cache (cache_dir=, trust_unchanged=), as in the CMake build:
with SQLite when pkg-config finds sqlite3 (Debian: libsqlite3-dev),
SLUICE_HAVE_SQLITE defined and -lsqlite3 linked; without it (a note on
stderr) a model's cache is turned off with a warning (Model.cache_warning)
and loads go on uncached.

Environment:
  SLUICE_SOURCE_DIR   the repository root (default: two directories up)
  SLUICE_STATIC_LIB   link this libsluice.a instead of compiling src/
                      (its objects must be position-independent, as the
                      CMake build makes them; BLAKE3 is then whatever
                      that library was built with)
  SLUICE_BLAKE3_DIR   another directory of the BLAKE3 C sources; "" or
                      "none": build without BLAKE3
  SLUICE_WITH_SQLITE  "0": build without SQLite even when it is installed
  SLUICE_EXTRA_CFLAGS / SLUICE_EXTRA_LDFLAGS   added flags (the ASan test
                      builds with -fsanitize=address through them)
"""
import glob
import os
import platform
import re
import shlex
import subprocess
import sys

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


def find_sqlite():
    """pkg-config's flags for sqlite3, or None when absent or turned off."""
    if os.environ.get("SLUICE_WITH_SQLITE", "1") == "0":
        return None
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "sqlite3"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


def natural_key(path):
    """Sorts blake3-1.10.0 after blake3-1.9.2 (CMake's NATURAL order)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def find_blake3():
    """The directory of the BLAKE3 C sources, or None."""
    want = os.environ.get("SLUICE_BLAKE3_DIR")
    if want is not None:
        return None if want in ("", "none") else want
    for d in sorted(glob.glob("/usr/share/cargo/registry/blake3-*/c"), key=natural_key,
                    reverse=True):
        if os.path.isfile(os.path.join(d, "blake3.h")) and \
                os.path.isfile(os.path.join(d, "blake3_dispatch.c")):
            return d
    return None


# The BLAKE3 files and their own flags, as in CMakeLists.txt: on x86-64
# every SIMD variant, each compiled for its instruction set (the
# dispatcher runs the one the CPU has); elsewhere the portable code only.
X86_64 = platform.machine().lower() in ("x86_64", "amd64")
B3_FILES = [("blake3.c", []), ("blake3_dispatch.c", []), ("blake3_portable.c", [])]
if X86_64:
    B3_FILES += [("blake3_sse2.c", ["-msse2"]), ("blake3_sse41.c", ["-msse4.1"]),
                 ("blake3_avx2.c", ["-mavx2"]), ("blake3_avx512.c", ["-mavx512f", "-mavx512vl"])]
    B3_DEFINES = []
else:
    B3_DEFINES = [("BLAKE3_NO_SSE2", None), ("BLAKE3_NO_SSE41", None), ("BLAKE3_NO_AVX2", None),
                  ("BLAKE3_NO_AVX512", None), ("BLAKE3_USE_NEON", "0")]


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
blake3_dir = None if static_lib else find_blake3()
if not static_lib and blake3_dir is None:
    why = ("SLUICE_BLAKE3_DIR says none" if os.environ.get("SLUICE_BLAKE3_DIR") is not None
           else "BLAKE3 sources not found (apt-get install librust-blake3-dev, or set "
           "SLUICE_BLAKE3_DIR)")
    print(f"sluice setup.py: {why}: building without BLAKE3; BLAKE3 manifests will raise "
          "UnsupportedError", file=sys.stderr)

# SQLite only for the library's own sources: a static library brings
# whatever it was built with (its -lsqlite3 then comes from SLUICE_EXTRA_LDFLAGS).
sqlite = None if static_lib else find_sqlite()
if not static_lib and sqlite is None:
    print("sluice setup.py: sqlite3 not found (apt-get install libsqlite3-dev) or "
          "SLUICE_WITH_SQLITE=0: building without the persistent cache; cache_dir and "
          "trust_unchanged will only set Model.cache_warning", file=sys.stderr)

cflags = ["-std=c11", "-fvisibility=hidden", "-Wno-unused-parameter"]
extra_cflags = shlex.split(os.environ.get("SLUICE_EXTRA_CFLAGS", ""))
cflags += extra_cflags
ldflags = ["-Wl,-z,nodelete"]  # the library's thread-key destructor stays mapped
ldflags += shlex.split(os.environ.get("SLUICE_EXTRA_LDFLAGS", ""))

ext = Extension(
    "sluice._sluice",
    sources=sources,
    include_dirs=[os.path.join(root, "include"), os.path.join(root, "src")]
    + ([blake3_dir] if blake3_dir else [])
    + [f[2:] for f in pkg_config("--cflags-only-I")]
    + [f[2:] for f in (sqlite or []) if f.startswith("-I")],
    define_macros=[("_GNU_SOURCE", None), ("SLUICE_STATIC", None)]
    + ([("SLUICE_HAVE_BLAKE3", None)] if blake3_dir else [])
    + ([("SLUICE_HAVE_SQLITE", None)] if sqlite is not None else []),
    extra_compile_args=cflags,
    extra_link_args=ldflags + pkg_config("--libs")
    + [f for f in (sqlite or []) if not f.startswith("-I")] + ["-lpthread"],
    extra_objects=extra_objects,
)


class BuildExt(build_ext):
    """Compiles on two processes by default (the library is some 20 files),
    and the BLAKE3 files first, each with its own flags (an Extension has
    one set of flags for all its sources), linked in as extra objects."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = min(2, os.cpu_count() or 1)

    def build_extension(self, ext):
        if blake3_dir:
            objects = []
            # gnu11 as CMake's C_EXTENSIONS; hidden like the library; the
            # sanitizer flags of SLUICE_EXTRA_CFLAGS apply here too.
            base = ["-std=gnu11", "-fvisibility=hidden"] + extra_cflags
            for name, simd in B3_FILES:
                objects += self.compiler.compile(
                    [os.path.join(blake3_dir, name)],
                    output_dir=os.path.join(self.build_temp, "blake3"), macros=B3_DEFINES,
                    include_dirs=[blake3_dir], debug=self.debug, extra_postargs=base + simd,
                    depends=[os.path.join(blake3_dir, "blake3_impl.h")])
            ext.extra_objects = list(ext.extra_objects or []) + objects
        super().build_extension(ext)


setup(
    name="sluice",
    version="0.1.0",
    description="Lazy, verified loading of .safetensors weights (Python binding of libsluice)",
    packages=["sluice"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    python_requires=">=3.11",
)
