"""safe_open / load_file / get_slice against files written by stfile."""
import os

import numpy as np
import pytest

import sluice
import stfile
from sluice import safe_open, load_file

try:
    import torch
except ImportError:
    torch = None


@pytest.fixture
def single(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {
        "w": rng.standard_normal((10, 4, 3)).astype(np.float32),
        "b": np.arange(7, dtype=np.int64),
        "s": np.array(2.0),
        "e": np.zeros((0, 3), np.float16),
        "h": ("BF16", [6, 2], rng.integers(0, 65535, 12, dtype=np.uint16).tobytes()),
    }
    path = str(tmp_path / "model.safetensors")
    digests = stfile.write(path, tensors, metadata={"format": "np"})
    return path, tensors, digests


def expected(tensors, name):
    t = tensors[name]
    if isinstance(t, tuple):  # BF16: the raw uint16 view (no ml_dtypes here)
        return stfile.expected_array(t[0], tuple(t[1]), t[2])
    return t


def test_safe_open_np(single):
    path, tensors, _ = single
    with safe_open(path, framework="np", raw=True) as f:
        assert f.keys() == sorted(tensors)
        assert f.metadata() == {"format": "np"}
        for k in tensors:
            a = f.get_tensor(k)
            np.testing.assert_array_equal(a, expected(tensors, k))
    d = load_file(path, raw=True)
    assert sorted(d) == sorted(tensors)
    for k in tensors:
        np.testing.assert_array_equal(d[k], expected(tensors, k))


INDICES = [0, -1, 3, slice(None), slice(2, 5), slice(1, 9, 3), slice(8, 1, -2), slice(5, 5),
           (slice(2, 4), 1), (1, slice(None), 2), Ellipsis, (Ellipsis, 0), (slice(None, 3), ...),
           (-2, -1, -1)]


@pytest.mark.parametrize("verified", [False, True])
def test_get_slice(single, verified):
    path, tensors, digests = single
    if verified:
        stfile.write_manifest(path + ".manifest.json", digests)
    w = tensors["w"]
    with safe_open(path, raw=True) as f:
        sl = f.get_slice("w")
        assert sl.get_shape() == [10, 4, 3] and sl.get_dtype() == "F32"
        assert sl.verified is verified
        st0 = f.model.stats()
        for idx in INDICES:
            got = sl[idx]
            np.testing.assert_array_equal(got, w[idx], err_msg=str(idx))
            assert got.flags.writeable  # a copy, like the reference's
        st = f.model.stats()
        if verified:
            assert st["tensors_verified"] >= 1  # the whole tensor, checked
        else:
            assert st["tensors_loaded"] == st0["tensors_loaded"]  # read_into: not the pool
        with pytest.raises(IndexError):
            sl[10]
        assert f.get_slice("s")[()] == 2.0
        np.testing.assert_array_equal(f.get_slice("b")[2:4], [2, 3])
        assert f.get_slice("e")[:].shape == (0, 3)
        h = f.get_slice("h")
        np.testing.assert_array_equal(h[1:3], expected(tensors, "h")[1:3])


def test_slice_reads_only_rows(single):
    """Rows of an unverified tensor are read through the library
    (sluice_read_into: local and remote files alike), only their bytes."""
    path, tensors, _ = single
    with safe_open(path) as f:
        st0 = f.model.stats()
        f.get_slice("w")[2:4]
        st = f.model.stats()
    assert st["bytes_read"] - st0["bytes_read"] == 2 * 4 * 3 * 4  # two rows of 48 bytes


def test_checksum_through_safe_open(single):
    path, tensors, digests = single
    digests["w"] = "0" * 64
    stfile.write_manifest(path + ".manifest.json", digests)
    with safe_open(path) as f:
        with pytest.raises(sluice.ChecksumError):
            f.get_tensor("w")
        with pytest.raises(sluice.ChecksumError):
            f.get_slice("w")[0]
        np.testing.assert_array_equal(f.get_tensor("b"), tensors["b"])


def test_paths_dir_and_index(sharded):
    exp = stfile.read_model(sharded)
    for p in (sharded, os.path.join(sharded, "model.safetensors.index.json")):
        d = load_file(p, raw=True)
        assert {k: v.tobytes() for k, v in d.items()} == {k: v[2] for k, v in exp.items()}


def test_bad_framework(single):
    path, _, _ = single
    with pytest.raises(NotImplementedError, match="framework='tf'"):
        safe_open(path, framework="tf")  # the reference's, not converted to
    with pytest.raises(ValueError):
        safe_open(path, framework="bogus")
    with pytest.raises(ValueError):
        safe_open(path, framework="np", device="cuda")
    with pytest.raises(TypeError):
        safe_open(path, framework=3)


@pytest.mark.skipif(torch is None, reason="torch is not installed (python3-torch)")
def test_safe_open_pt(single):
    path, tensors, _ = single
    with safe_open(path, framework="pt") as f:
        w = f.get_tensor("w")
        assert isinstance(w, torch.Tensor) and w.dtype == torch.float32
        assert torch.equal(w, torch.from_numpy(tensors["w"]))
        h = f.get_tensor("h")
        assert h.dtype == torch.bfloat16 and h.shape == (6, 2)
        raw = np.frombuffer(tensors["h"][2], np.int16).reshape(6, 2)
        assert torch.equal(h.view(torch.int16), torch.from_numpy(raw.copy()))
        assert torch.equal(f.get_slice("h")[1:3].view(torch.int16),
                           torch.from_numpy(raw[1:3].copy()))
        assert f.get_tensor("s").shape == ()
        assert f.get_tensor("e").shape == (0, 3)
    d = load_file(path, framework="pt")
    assert d["b"].dtype == torch.int64 and d["b"].tolist() == list(range(7))


def _own_memory_cgroup():
    """This process's memory cgroup directory (v2 with the memory
    controller delegated, else v1's) and its limit file, or None."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, ctl, path = line.split(":", 2)
        if hid == "0" and not ctl:
            d = "/sys/fs/cgroup" + path
            try:
                if "memory" in open(os.path.join(d, "cgroup.subtree_control")).read():
                    return d, "memory.max"
            except OSError:
                pass
        elif "memory" in ctl.split(","):
            return "/sys/fs/cgroup/memory" + path, "memory.limit_in_bytes"
    return None


def test_load_file_pool_under_a_cgroup_limit(tmp_path):
    """Under a 256 MiB cgroup memory limit the library's default pool is
    64 MiB (1/4), no longer 4 GiB; load_file and safe_open must still
    size the pool for every tensor at once (72 MiB of tensors here). They
    compared with a fixed 4G, kept the default pool, and holding the
    tensors failed."""
    own = _own_memory_cgroup()
    if own is None:
        pytest.skip("no memory controller in /proc/self/cgroup")
    cg = os.path.join(own[0], f"sluice-pytest-{os.getpid()}")
    try:
        os.mkdir(cg)
    except OSError as e:
        pytest.skip(f"no memory cgroup can be made here ({own[0]}: {e})")
    try:
        try:
            with open(os.path.join(cg, own[1]), "w") as f:
                f.write(str(256 << 20))
        except OSError as e:
            pytest.skip(f"cannot set {own[1]} in {cg}: {e}")
        rng = np.random.default_rng(11)
        tensors = {f"t{i}": rng.integers(0, 255, size=(24 << 20,), dtype=np.uint8)
                   for i in range(3)}
        path = str(tmp_path / "big.safetensors")
        digests = stfile.write(path, tensors)
        stfile.write_manifest(path + ".manifest.json", digests)
        script = (
            "import sys, numpy as np, sluice\n"
            "p = sys.argv[1]\n"
            "with sluice.open(p) as m:\n"
            "    print('default', m.stats()['pool_bytes'])\n"
            "d = sluice.load_file(p)\n"
            "names, total = sorted(d), sum(int(a.sum()) for a in d.values())\n"
            "del d\n"
            "with sluice.safe_open(p) as f:\n"
            "    kept = [f.get_tensor(k) for k in f.keys()]\n"
            "print('ok', names, total, sum(int(a.sum()) for a in kept))\n")
        procs = os.path.join(cg, "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        import subprocess
        import sys
        r = subprocess.run([sys.executable, "-c", script, path], preexec_fn=enter,
                           capture_output=True, text=True, timeout=120)
        want = sum(int(a.sum()) for a in tensors.values())
        assert r.returncode == 0, r.stderr
        assert f"default {64 << 20}" in r.stdout, r.stdout
        assert f"ok ['t0', 't1', 't2'] {want} {want}" in r.stdout, r.stdout
    finally:
        os.rmdir(cg)
