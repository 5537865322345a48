import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import stfile  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
REAL = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "real"))


def sluice_cli():
    """The `sluice` command: $SLUICE_CLI, else a build*/sluice of the
    repository (tools/test.sh builds build-asan before the Python stage);
    None when none is built."""
    import glob
    cands = [os.environ.get("SLUICE_CLI", "")] + sorted(glob.glob(os.path.join(REPO, "build*", "sluice")))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


@pytest.fixture(scope="session")
def real_dir():
    if not os.path.isdir(REAL):
        pytest.skip(f"{REAL} is absent: the real .safetensors corpus is not on this machine")
    return REAL


def real_models():
    """Every model path of the real corpus: each file, and the sharded set."""
    if not os.path.isdir(REAL):
        return []
    out = sorted(os.path.join(REAL, p) for p in os.listdir(REAL) if p.endswith(".safetensors"))
    out += [os.path.join(REAL, "SafeTensors.jl__sharded")]
    return out


@pytest.fixture
def sharded(tmp_path):
    """A 3-shard model with a manifest, every NumPy dtype, a scalar and
    zero-size tensors, BF16 and F8 given raw."""
    rng = np.random.default_rng(7)
    s1 = {
        "a.f32": rng.standard_normal((17, 5)).astype(np.float32),
        "a.f64": rng.standard_normal((3, 4, 2)),
        "a.scalar": np.array(3.5, dtype=np.float32),
        "a.empty": np.zeros((0, 4), dtype=np.float32),
        "a.i8": rng.integers(-128, 127, size=(9,), dtype=np.int8),
    }
    s2 = {
        "b.f16": rng.standard_normal((6, 6)).astype(np.float16),
        "b.bf16": ("BF16", [4, 3], rng.integers(0, 65535, size=12, dtype=np.uint16).tobytes()),
        "b.f8": ("F8_E4M3", [5], bytes(range(5))),
        "b.bool": rng.integers(0, 2, size=(7,)).astype(np.bool_),
        "b.u16": rng.integers(0, 65535, size=(3,), dtype=np.uint16),
    }
    s3 = {
        "c.i64": rng.integers(-10**12, 10**12, size=(2, 3), dtype=np.int64),
        "c.u32": rng.integers(0, 2**32 - 1, size=(4,), dtype=np.uint32),
        "c.u64": rng.integers(0, 2**63, size=(4,), dtype=np.uint64),
        "c.c64": (rng.standard_normal(3) + 1j).astype(np.complex64),
        "c.i16": rng.integers(-1000, 1000, size=(8,), dtype=np.int16),
        "c.i32": rng.integers(-1000, 1000, size=(2, 2), dtype=np.int32),
        "c.u8": rng.integers(0, 255, size=(10,), dtype=np.uint8),
        "c.zero_scalar_dim": np.zeros((3, 0), dtype=np.int32),
    }
    d = tmp_path / "sharded"
    stfile.write_sharded(str(d), [s1, s2, s3], metadata={"format": "np", "who": "test"})
    return str(d)


def default_pool():
    """The library's default pool_bytes for this process, by the rule of
    sluice.h ("Sizing the pool"): 4 GiB, or 1/4 of the lowest cgroup
    memory limit on the way up from this process's cgroup when that is
    less (whole MiB, at least 1 MiB). A container's limit changes it, so
    a test must not expect a fixed 4 GiB."""
    def limit_in(d, name):
        try:
            v = open(os.path.join(d, name)).read().strip()
        except OSError:
            return None
        return int(v) if v.isdigit() and int(v) < (1 << 62) else None

    def walk(base, rel, name):
        d = base + rel.rstrip("/")
        if not os.path.isdir(d):
            d = base
        found = []
        while True:
            v = limit_in(d, name)
            if v is not None:
                found.append(v)
            if len(d) <= len(base):
                return found
            d = d[:d.rindex("/")]

    limits = []
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hid, ctl, path = line.split(":", 2)
        if not path.startswith("/"):
            continue
        if hid == "0" and not ctl:
            limits += walk("/sys/fs/cgroup", path, "memory.max")
        elif "memory" in ctl.split(","):
            limits += walk("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes")
    mib, full = 1 << 20, 4 << 30
    if not limits or min(limits) // 4 >= full:
        return full
    return max(min(limits) // 4 // mib * mib, mib)


def serve_fake(servicer, options=()):
    """A fake TensorService (a pb_grpc.TensorServiceServicer) served in this
    process by grpc's Python server on 127.0.0.1, a free port: a generator
    for a fixture, yielding the servicer with .addr set, stopped after."""
    from concurrent import futures

    import grpc
    from sluice.client import pb_grpc

    s = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=list(options))
    pb_grpc.add_TensorServiceServicer_to_server(servicer, s)
    port = s.add_insecure_port("127.0.0.1:0")
    s.start()
    servicer.addr = "127.0.0.1:%d" % port
    try:
        yield servicer
    finally:
        s.stop(grace=None)
