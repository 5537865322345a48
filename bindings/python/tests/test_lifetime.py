"""Lifetimes: arrays outliving close(), the model collected with live
arrays, del in any order, in-process, under -X dev, and with the library
and extension built with AddressSanitizer."""
import os
import shutil
import subprocess
import sys

import pytest

import lifetime_script

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "lifetime_script.py")


def test_lifetimes_in_process(sharded):
    lifetime_script.main(sharded)


def test_lifetimes_dev_mode(sharded):
    r = subprocess.run([sys.executable, "-X", "dev", "-W", "error", SCRIPT, sharded],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lifetimes ok" in r.stdout


def asan_runtime():
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        return None
    p = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                       text=True).stdout.strip()
    return p if os.path.isabs(p) and os.path.exists(p) else None


@pytest.fixture(scope="session")
def asan_build(tmp_path_factory):
    """The package built with -fsanitize=address (library sources and
    extension alike), in a directory of its own."""
    rt = asan_runtime()
    if rt is None:
        pytest.skip("no gcc ASan runtime (gcc -print-file-name=libasan.so): cannot run the ASan test")
    out = tmp_path_factory.mktemp("asan")
    env = dict(os.environ,
               SLUICE_EXTRA_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -O1 -g",
               SLUICE_EXTRA_LDFLAGS="-fsanitize=address")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(out / "b"),
                        "egg_info", "--egg-base", str(out)],
                       cwd=PKG, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail("ASan build failed:\n" + r.stdout[-3000:] + r.stderr[-3000:])
    libs = [os.path.join(out, "b", d) for d in os.listdir(out / "b") if d.startswith("lib")]
    assert libs, "no build/lib* directory"
    return rt, libs[0]


def test_lifetimes_asan(sharded, asan_build):
    rt, lib = asan_build
    env = dict(os.environ, PYTHONPATH=lib, LD_PRELOAD=rt,
               # Python itself keeps memory at exit that LeakSanitizer would
               # report; leaks of handles and models are checked by the
               # script (every model ends closed in the library).
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0",
               PYTHONMALLOC="malloc")
    r = subprocess.run([sys.executable, "-X", "dev", SCRIPT, sharded], env=env,
                       capture_output=True, text=True, timeout=600, cwd=HERE)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    assert "lifetimes ok" in r.stdout
    # the extension really is the ASan one
    r = subprocess.run([sys.executable, "-c", "import sluice._sluice as s; print(s.__file__)"],
                       env=env, capture_output=True, text=True, cwd=HERE)
    assert r.stdout.startswith(lib), r.stdout + r.stderr
