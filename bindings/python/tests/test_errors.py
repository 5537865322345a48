"""Every error family raised with its code and the library's message; wrong
argument types give TypeError/ValueError, never a crash."""
import ctypes
import json
import os
import shutil

import numpy as np
import pytest

import sluice
import stfile
from sluice import _errors as E


def flip_byte(path, tensor):
    entries, _ = stfile.read(path)
    with open(path, "rb") as f:
        (n,) = np.frombuffer(f.read(8), dtype="<u8")
    hdr = json.loads(open(path, "rb").read()[8:8 + int(n)])
    off = 8 + int(n) + hdr[tensor]["data_offsets"][0] + 1
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))


def test_checksum_names_tensor_others_load_stream_raises(sharded):
    shard = os.path.join(sharded, "model-00001-of-00003.safetensors")
    flip_byte(shard, "a.f32")
    with sluice.open(sharded) as m:
        with pytest.raises(sluice.ChecksumError) as ei:
            m.get_tensor("a.f32")
        e = ei.value
        assert e.code == E.E_CHECKSUM == -46
        assert "a.f32" in e.message and e.name == "a.f32"
        assert isinstance(e, sluice.Error)
        for k in m.keys():
            if k != "a.f32":
                m.get_tensor(k, raw=True)
        got = []
        with pytest.raises(sluice.ChecksumError) as ei:
            for name, a in m.stream(raw=True):
                got.append(name)
        assert sorted(got) == sorted(k for k in m.keys() if k != "a.f32")
        assert [f.name for f in ei.value.failures] == ["a.f32"]
        assert all(isinstance(f, sluice.ChecksumError) for f in ei.value.failures)
        assert m.stats()["checksum_failures"] >= 2


def expect(code, cls, fn):
    with pytest.raises(cls) as ei:
        fn()
    assert ei.value.code == code, (ei.value.code, ei.value.message)
    assert isinstance(ei.value, sluice.Error)
    assert ei.value.message and str(ei.value) == ei.value.message
    return ei.value


def test_header_errors(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x02")
    expect(E.E_HEADER_SHORT, sluice.HeaderError, lambda: sluice.open(str(p)))
    p = tmp_path / "json.safetensors"
    p.write_bytes((8).to_bytes(8, "little") + b"{bad    ")
    expect(E.E_HEADER_JSON, sluice.HeaderError, lambda: sluice.open(str(p)))
    p = tmp_path / "dtype.safetensors"
    stfile.write(str(p), {"x": ("F33", [1], b"\0\0\0\0")})
    e = expect(E.E_DTYPE, sluice.HeaderError, lambda: sluice.open(str(p)))
    assert "F33" in e.message


def test_index_and_nofiles(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    e = expect(E.E_NO_FILES, sluice.NoFilesError, lambda: sluice.open(str(d)))
    assert isinstance(e, FileNotFoundError)
    d = tmp_path / "idx"
    d.mkdir()
    (d / "model.safetensors.index.json").write_text("not json")
    expect(E.E_INDEX, sluice.ShardIndexError, lambda: sluice.open(str(d)))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "missing.safetensors"}}))
    expect(E.E_INDEX_SHARD, sluice.ShardIndexError, lambda: sluice.open(str(d)))


def test_manifest_errors(tmp_path):
    p = str(tmp_path / "m.safetensors")
    stfile.write(p, {"x": np.ones(4, np.float32)})
    expect(E.E_MANIFEST, sluice.ManifestError, lambda: sluice.open(p, verify="require"))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    expect(E.E_MANIFEST, sluice.ManifestError, lambda: sluice.open(p, manifest=str(bad)))
    bad.write_text(json.dumps({"x": "abc"}))
    expect(E.E_MANIFEST_DIGEST, sluice.ManifestError, lambda: sluice.open(p, manifest=bad))
    bad.write_text(json.dumps({"y": "0" * 64}))
    expect(E.E_MANIFEST_UNKNOWN, sluice.ManifestError, lambda: sluice.open(p, manifest=bad))


def test_engine_errors(tmp_path):
    p = str(tmp_path / "m.safetensors")
    stfile.write(p, {f"t{i}": np.full(3 << 18, i, np.float32) for i in range(4)})  # 3 MiB each
    with sluice.open(p, pool="2M") as m:
        e = expect(E.E_TOO_LARGE, sluice.TooLargeError, lambda: m.get_tensor("t0"))
        assert e.name == "t0" and isinstance(e, sluice.PoolError)
    with sluice.open(p, pool="7M") as m:
        a, b = m.get_tensor("t0"), m.get_tensor("t1")
        expect(E.E_POOL_EXHAUSTED, sluice.PoolExhaustedError, lambda: m.get_tensor("t2"))
        del a
        assert (m.get_tensor("t2") == 2).all()
        del b
    e = expect(E.E_NOT_FOUND, sluice.NotFoundError, lambda: sluice.open(p)["nope"])
    assert isinstance(e, KeyError)
    expect(E.E_INVAL, sluice.InvalidArgumentError, lambda: sluice.open(p, queue_depth=5000))
    m = sluice.open(p)
    m.close()
    e = expect(E.E_INVAL, sluice.ClosedError, lambda: m.keys())
    assert isinstance(e, ValueError)
    expect(E.E_INVAL, sluice.ClosedError, lambda: m.get_tensor("t0"))
    m.close()  # twice is fine


def test_file_changed(tmp_path):
    p = str(tmp_path / "m.safetensors")
    stfile.write(p, {"a": np.ones(1024, np.float32), "b": np.ones(1024, np.float32)})
    with sluice.open(p) as m:
        os.truncate(p, os.path.getsize(p) - 100)
        e = expect(E.E_FILE_CHANGED, sluice.FileChangedError, lambda: m.get_tensor("b"))
        assert isinstance(e, sluice.ReadError) and isinstance(e, OSError)


def test_error_classes():
    for code in list(range(-55, 0)) + [-60, -61]:
        cls = sluice.error_class(code)
        assert issubclass(cls, sluice.Error)
    assert sluice.error_class(-46) is sluice.ChecksumError
    assert sluice.error_class(E.E_MANIFEST_MISMATCH) is sluice.ManifestMismatchError
    assert issubclass(sluice.ManifestMismatchError, sluice.ManifestError)
    assert sluice.error_class(E.E_SIGNATURE) is sluice.SignatureError
    assert not issubclass(sluice.SignatureError, sluice.ManifestError)
    assert sluice.error_class(E.E_REMOTE) is sluice.RemoteError
    assert issubclass(sluice.RemoteError, sluice.ReadError)
    for code in (-47, -48, -55, -60, -61):  # the library knows them (the build compiled src/ of today)
        assert sluice._sluice.strerror(code) != sluice._sluice.strerror(-999)
    assert sluice.error_class(E.E_BUFFER) is sluice.BufferTooSmallError
    assert issubclass(sluice.BufferTooSmallError, ValueError)
    assert sluice.error_class(E.E_UNSUPPORTED) is sluice.UnsupportedError
    assert issubclass(sluice.UnsupportedError, NotImplementedError)
    assert sluice.error_class(-999) is sluice.Error
    assert sluice.error_class(E.E_IO) is sluice.ReadError


def test_wrong_types(sharded):
    bad_open = [
        ((123,), {}, TypeError), ((None,), {}, TypeError), (("a\0b",), {}, ValueError),
        ((sharded,), {"pool": [1]}, TypeError), ((sharded,), {"pool": "lots"}, ValueError),
        ((sharded,), {"pool": -5}, ValueError), ((sharded,), {"pool": True}, TypeError),
        ((sharded,), {"verify": 1}, TypeError), ((sharded,), {"verify": "maybe"}, ValueError),
        ((sharded,), {"queue_depth": "3"}, TypeError), ((sharded,), {"queue_depth": 0}, ValueError),
        ((sharded,), {"direct": 1}, TypeError), ((sharded,), {"manifest": 5}, TypeError),
        ((sharded,), {"hash_threads": 1.5}, TypeError), ((sharded,), {"chunk": object()}, TypeError),
        ((sharded,), {"nope": 1}, TypeError),
    ]
    for args, kw, exc in bad_open:
        with pytest.raises(exc):
            sluice.open(*args, **kw)
    with sluice.open(sharded) as m:
        for call, exc in [
            (lambda: m.get_tensor(5), TypeError), (lambda: m.get_tensor(b"a.f32"), TypeError),
            (lambda: m.get_tensor("a.f32", framework="tf"), ValueError),
            (lambda: m.get_tensor("a.f32", framework=None), TypeError),
            (lambda: m.info(None), TypeError), (lambda: m.prefetch("a.f32"), TypeError),
            (lambda: m.prefetch(5), TypeError), (lambda: m.prefetch([1]), TypeError),
            (lambda: m.stream(5), TypeError), (lambda: m.metadata(1.5), TypeError),
            (lambda: m._m.info("x"), TypeError), (lambda: m._m.acquire(-1), IndexError),
            (lambda: m._m.acquire(2**70), OverflowError), (lambda: m._m.find(3), TypeError),
            (lambda: m._m.stream(5), TypeError), (lambda: m._m.prefetch([None]), TypeError),
            (lambda: m._m.file_info(99), IndexError),
            (lambda: m._m.manifest_entry(-3), IndexError),
        ]:
            with pytest.raises(exc):
                call()
        assert m._m.find("\udcff") == -1
        a = m.get_tensor("a.f32")
        with pytest.raises(ValueError):
            a.setflags(write=True)
        with pytest.raises(ValueError):
            a[0, 0] = 1
        h = sluice.handle_of(a)
        assert memoryview(h).readonly
        with pytest.raises(TypeError):  # a writable buffer is refused
            ctypes.c_char.from_buffer(h)
        del a, h
    with pytest.raises(TypeError):
        sluice._sluice.open(sharded, verify="x")
    with pytest.raises(sluice.InvalidArgumentError):
        sluice._sluice.open(sharded, verify=99)


def test_verify_without_loading(sharded):
    with sluice.open(sharded) as m:
        r = m.verify()
        assert (r["tensors_ok"], r["tensors_failed"], r["failures"]) == (len(m), 0, [])
        assert r["bytes_hashed"] == sum(m.info(k).nbytes for k in m.keys())
        assert r["threads"] >= 1 and r["elapsed_ns"] > 0
        assert m.stats()["bytes_read"] == 0  # nothing was loaded
    flip_byte(os.path.join(sharded, "model-00001-of-00003.safetensors"), "a.f32")
    with sluice.open(sharded) as m:
        r = m.verify(["a.f32", "a.f64"], threads=2)
        assert (r["tensors_ok"], r["tensors_failed"]) == (1, 1)
        [e] = r["failures"]
        assert isinstance(e, sluice.ChecksumError) and e.code == E.E_CHECKSUM
        assert (e.name, e.kind) == ("a.f32", "tensor") and "a.f32" in e.message
        # the flat manifest lists no file digests: each file fails, alone
        r = m.verify(files=True)
        assert (r["tensors_failed"], r["files_ok"], r["files_failed"]) == (1, 0, 3)
        fails = [f for f in r["failures"] if f.kind == "file"]
        assert sorted(f.name for f in fails) == sorted(m.files)
        assert all(isinstance(f, sluice.ManifestError) for f in fails)
        r = m.verify([])
        assert r["tensors_ok"] + r["tensors_failed"] + r["bytes_hashed"] == 0
        expect(E.E_NOT_FOUND, sluice.NotFoundError, lambda: m.verify(["nope"]))
        for bad in [lambda: m.verify(files=1), lambda: m.verify("a.f32"),
                    lambda: m.verify(threads="2"), lambda: m.verify([3])]:
            with pytest.raises(TypeError):
                bad()
        with pytest.raises(ValueError):
            m.verify(threads=-1)
    with sluice.open(sharded, verify="off") as m:  # no manifest read
        expect(E.E_MANIFEST, sluice.ManifestError, lambda: m.verify())
    expect(E.E_INVAL, sluice.ClosedError, lambda: m.verify())


def test_integer_overflow_refused(sharded):
    """Sizes and counts the C types cannot hold are refused, never wrapped
    (2**64 + 4096 as 4096) nor taken for the default (2**64 as 0)."""
    assert sluice.parse_size(2**64 - 1) == 2**64 - 1
    assert sluice.parse_size("16777215T") == 16777215 << 40
    for v in [2**64, 2**64 + 4096, "16777216T", "18446744073709551616", 2**200]:
        with pytest.raises(ValueError, match="too large"):
            sluice.parse_size(v, "pool")
        for kw in ("pool", "chunk"):
            with pytest.raises(ValueError, match="too large"):
                sluice.open(sharded, **{kw: v})
    with pytest.raises(ValueError):
        sluice.open(sharded, queue_depth=2**32)
    core_open = sluice._sluice.open
    for kw, v in [("pool", 2**64 + 4096), ("pool", 2**64), ("pool", -1), ("chunk", 2**64),
                  ("queue_depth", 2**32), ("queue_depth", -1)]:
        with pytest.raises(OverflowError):
            core_open(sharded, **{kw: v})
    with pytest.raises(TypeError):
        core_open(sharded, pool=1.5)
    core = core_open(sharded, pool=(64 << 20) + 4096)
    assert core.stats()["pool_bytes"] == (64 << 20) + 4096
    core.close()
    with sluice.open(sharded) as m:
        for bad in [2**32, 2**32 + 1, 2**64]:
            with pytest.raises(ValueError):
                m.verify(threads=bad)
            with pytest.raises(OverflowError):
                m._m.verify(None, False, bad)
        with pytest.raises(OverflowError):
            m._m.verify(None, False, -1)
        assert m.verify(threads=2**32 - 1)["threads"] >= 1  # the library caps it
