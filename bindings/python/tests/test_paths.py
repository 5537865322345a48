"""Paths that are not UTF-8, and the library's messages that quote them:
file paths come back as os.fsdecode gives them (os.fsencode gives the
bytes back), messages are decoded with U+FFFD for what is not UTF-8, and
no call fails with UnicodeDecodeError."""
import os

import numpy as np
import pytest

import sluice
import stfile
from sluice import _errors as E
from test_errors import expect, flip_byte


def write_checked(path, tensors):
    """A model file with its sidecar manifest; path is bytes."""
    stfile.write_manifest(path + b".manifest.json", stfile.write(path, tensors))


def test_non_utf8_file_name(tmp_path):
    p = os.fsencode(tmp_path) + b"/m\xff.safetensors"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_checked(p, {"x": x, "y": np.ones(3, np.int16)})
    with sluice.open(p) as m:
        assert m.verify_mode == "require"
        assert os.fsencode(m.path) == p
        assert [os.fsencode(f) for f in m.files] == [p]
        info = m.info("x")
        assert os.fsencode(info.file) == p and info.file == os.fsdecode(p)
        assert (m.get_tensor("x") == x).all()
        assert os.fsencode(m.manifest_path) == p + b".manifest.json"
        assert m.metadata(p) is None and m.metadata(m.files[0]) is None
        assert sorted(n for n, _ in m.stream()) == ["x", "y"]
        r = m.verify(files=True)
        assert (r["tensors_ok"], r["tensors_failed"]) == (2, 0)
        # the flat manifest lists no file digest: the file fails, named by its path
        [e] = r["failures"]
        assert e.kind == "file" and os.fsencode(e.name) == p
        assert isinstance(e.message, str) and "\ufffd" in e.message
    # the str form of the same path (surrogateescape) opens it too
    with sluice.open(os.fsdecode(p)) as m:
        assert os.fsencode(m.info("y").file) == p


def test_non_utf8_missing_path(tmp_path):
    for p in [os.fsencode(tmp_path) + b"/nope\xff",
              os.fsencode(tmp_path) + b"/nope\xff.safetensors",
              os.fsdecode(os.fsencode(tmp_path) + b"/nope\xfe")]:
        e = expect(E.E_NO_FILES, sluice.NoFilesError, lambda: sluice.open(p))
        assert isinstance(e, FileNotFoundError)
        assert "\ufffd" in e.message and "nope" in e.message


def test_failures_on_long_non_ascii_path(tmp_path):
    """A tensor that fails its digest, in a file whose path (over 1 KiB)
    is not UTF-8: verify returns its report, get_tensor and stream raise
    ChecksumError, each with the library's message."""
    comp = ("\u20ac" * 40).encode() + b"\xff"  # 121 bytes, then a stray byte
    d = os.fsencode(tmp_path) + b"/" + b"/".join([comp] * 9)
    os.makedirs(d)
    p = d + b"/m.safetensors"
    assert len(p) > 1024
    write_checked(p, {"x": np.ones(64, np.float32), "y": np.zeros(8, np.float32)})
    flip_byte(p, "x")
    with sluice.open(p) as m:
        r = m.verify(files=True)
        assert (r["tensors_ok"], r["tensors_failed"], r["files_failed"]) == (1, 1, 1)
        by_kind = {e.kind: e for e in r["failures"]}
        t, f = by_kind["tensor"], by_kind["file"]
        assert isinstance(t, sluice.ChecksumError) and t.name == "x"
        assert 'tensor "x"' in t.message and "\ufffd" in t.message
        assert isinstance(f, sluice.ManifestError) and os.fsencode(f.name) == p
        e = expect(E.E_CHECKSUM, sluice.ChecksumError, lambda: m.get_tensor("x"))
        assert e.name == "x" and "\u20ac" in e.message
        got = []
        with pytest.raises(sluice.ChecksumError) as ei:
            for n, _ in m.stream():
                got.append(n)
        assert got == ["y"]
        assert [f.name for f in ei.value.failures] == ["x"]
        assert "\ufffd" in ei.value.failures[0].message
