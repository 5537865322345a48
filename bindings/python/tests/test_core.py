"""Core API: every tensor equals the bytes read independently, zero copy,
the index calls, threads."""
import os
import threading
import time

import numpy as np
import pytest

import sluice
import stfile
from conftest import default_pool, real_models
from test_errors import flip_byte


def check_model(path, **kw):
    expected = stfile.read_model(path)
    with sluice.open(path, **kw) as m:
        assert sorted(m.keys()) == sorted(expected)
        assert len(m) == len(expected)
        for name, (dtype, shape, raw) in expected.items():
            assert name in m
            info = m.info(name)
            assert (info.dtype, info.shape, info.nbytes) == (dtype, shape, len(raw))
            a = m.get_tensor(name, raw=True)
            want = stfile.expected_array(dtype, shape, raw)
            assert a.dtype == want.dtype, name
            assert a.shape == want.shape, name
            assert a.tobytes() == raw, name
            assert not a.flags.writeable
            # zero copy: the array's memory is the handle's buffer
            h = sluice.handle_of(a)
            assert h is not None and h.nbytes == len(raw)
            if len(raw):
                assert a.__array_interface__["data"][0] == h.address
            del a, h
    return expected


@pytest.mark.parametrize("path", real_models() or ["<absent>"],
                         ids=lambda p: os.path.basename(p))
def test_every_real_tensor(real_dir, path):
    check_model(path)


def test_sharded_generated(sharded):
    exp = check_model(sharded)
    assert len(exp) == 18
    # the same model through its index.json and with the manifest checked
    check_model(os.path.join(sharded, "model.safetensors.index.json"))
    with sluice.open(sharded) as m:
        assert m.verify_mode == "require"
        for k in m.keys():
            m.get_tensor(k, raw=True)
        st = m.stats()
        nonempty = sum(1 for k in m.keys() if m.info(k).nbytes)
        assert st["tensors_verified"] == nonempty  # empty tensors need no read
        assert st["checksum_failures"] == 0


def test_scalar_and_empty(sharded):
    with sluice.open(sharded) as m:
        s = m.get_tensor("a.scalar")
        assert s.shape == () and s[()] == np.float32(3.5)
        e = m.get_tensor("a.empty")
        assert e.shape == (0, 4) and e.dtype == np.float32
        z = m.get_tensor("c.zero_scalar_dim")
        assert z.shape == (3, 0)


def test_index_calls(sharded):
    with sluice.open(sharded) as m:
        assert len(m.files) == 3 and all(os.path.isfile(f) for f in m.files)
        assert m.metadata() == {"format": "np", "who": "test"}
        assert m.metadata(0) == {"format": "np", "who": "test"}
        assert m.metadata(os.path.basename(m.files[2])) == {"format": "np", "who": "test"}
        with pytest.raises(IndexError):
            m.metadata(5)
        info = m.info("a.f32")
        assert info.file == m.files[0] and info.shape == (17, 5) and info.dtype == "F32"
        assert "nope" not in m and 3 not in m
        assert list(m) == m.keys()
        st = m.stats()
        for field in ("backend", "backend_errno", "bytes_read", "bytes_delivered", "bytes_hashed",
                      "reads", "retries", "tensors_loaded", "tensors_verified", "cache_hits",
                      "failures", "checksum_failures", "direct_fallbacks", "pool_bytes",
                      "pool_in_use", "pool_high_water", "evictions", "acquire_wait_ns",
                      "acquire_count"):
            assert field in st
        assert st["pool_bytes"] == default_pool()   # 4 GiB, unless a cgroup limit says less
        m.prefetch(["c.i64", "a.f32"])
        m.prefetch([])
        assert m.trim() >= 0
        assert m["a.i8"].dtype == np.int8


def test_stream_all_and_subset(sharded):
    exp = stfile.read_model(sharded)
    with sluice.open(sharded, pool="64M") as m:
        got = {}
        for name, a in m.stream(raw=True):
            got[name] = a.tobytes()
        del a  # the loop variable holds the last array
        assert got == {k: v[2] for k, v in exp.items()}
        names = ["b.f16", "a.f32", "b.f16"]
        seen = [n for n, _ in m.stream(names)]
        assert sorted(seen) == sorted(names)
        assert list(m.stream([])) == []
        # abandoning a stream midway stops it; the model closes afterwards
        it = m.stream(raw=True)
        next(it)
        del it
    assert not m._m.open_in_library


def test_threads_concurrent(tmp_path):
    """get_tensor from many threads at once, and the GIL is released while
    the library reads and hashes."""
    big = np.arange(24 << 20, dtype=np.uint8)  # 24 MiB per tensor
    tensors = {f"t{i}": np.roll(big, i) for i in range(4)}
    path = str(tmp_path / "m.safetensors")
    digests = stfile.write(path, tensors)
    stfile.write_manifest(path + ".manifest.json", digests)
    with sluice.open(path, hash_threads=1) as m:
        errors, results = [], {}

        def worker(k):
            try:
                for _ in range(3):
                    a = m.get_tensor(k)
                    results[k] = a[:1000].copy()
                    del a
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(f"t{i % 4}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for k, v in results.items():
            assert (v == tensors[k][:1000]).all()
        # While one thread waits in get_tensor (a fresh read, hashed on one
        # thread: tens of ms), a pure-Python thread keeps running. It stamps
        # the clock as it goes; a stamp in the first half of the call shows
        # it ran while the call waited. (A count read after the call would
        # not: handing the GIL back on return lets the other thread run
        # inside the measured window even when the call held the GIL.)
        m.trim()
        stop = False
        stamps = []

        def spin():
            while not stop:
                stamps.append(time.perf_counter())
        sp = threading.Thread(target=spin)
        sp.start()
        time.sleep(0.01)
        m2 = sluice.open(path, hash_threads=1)
        t0 = time.perf_counter()
        a = m2.get_tensor("t3")
        t1 = time.perf_counter()
        stop = True
        sp.join()
        del a
        m2.close()
        assert t1 > t0
        half = t0 + (t1 - t0) / 2
        assert any(t0 < s < half for s in stamps), \
            "no Python ran while get_tensor waited: the GIL was held"


def test_close_during_stream(sharded):
    """close() affects new calls only: a stream running goes on to its
    end, and the library's model closes once it is done."""
    exp = stfile.read_model(sharded)
    m = sluice.open(sharded, pool="64M")
    got = {}
    for name, a in m.stream(raw=True):
        m.close()
        assert m.closed and m._m.open_in_library
        got[name] = a.tobytes()
    assert got == {k: v[2] for k, v in exp.items()}
    assert m._m.open_in_library  # the loop variable holds the last array
    del a
    assert not m._m.open_in_library
    with pytest.raises(sluice.ClosedError):
        m.stream()
    # a stream that fails a tensor: its failure is named all the same
    flip_byte(os.path.join(sharded, "model-00001-of-00003.safetensors"), "a.f32")
    m = sluice.open(sharded, pool="64M")
    seen = []
    with pytest.raises(sluice.ChecksumError) as ei:
        for name, a in m.stream(raw=True):
            m.close()
            seen.append(name)
    del a
    assert [f.name for f in ei.value.failures] == ["a.f32"]
    assert sorted(seen) == sorted(k for k in exp if k != "a.f32")
    assert not m._m.open_in_library


def test_close_during_verify(tmp_path):
    """close() from another thread while verify runs: the verify returns
    its report (failures named), then the library's model closes."""
    big = np.arange(32 << 20, dtype=np.uint8)  # 32 MiB per tensor
    path = str(tmp_path / "m.safetensors")
    digests = stfile.write(path, {f"t{i}": np.roll(big, i) for i in range(4)})
    digests["t2"] = "0" * 64  # t2 fails its digest
    stfile.write_manifest(path + ".manifest.json", digests)
    m = sluice.open(path)
    started, out = threading.Event(), {}

    def run():
        started.set()
        try:
            out["report"] = m.verify(files=True, threads=1)
        except Exception as e:  # noqa: BLE001
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    started.wait()
    time.sleep(0.02)
    m.close()
    during = t.is_alive()
    still_open = m._m.open_in_library
    t.join()
    assert "error" not in out, out["error"]
    assert during, "the verify ended within 20 ms: the close did not land during it"
    assert still_open  # the close waited for the verify
    r = out["report"]
    assert (r["tensors_ok"], r["tensors_failed"], r["files_failed"]) == (3, 1, 1)
    names = sorted((f.kind, f.name) for f in r["failures"])
    assert names == [("file", path), ("tensor", "t2")]
    assert not m._m.open_in_library
    with pytest.raises(sluice.ClosedError):
        m.verify()
