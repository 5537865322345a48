"""A Hugging Face Hub cache snapshot is verified with no setup: each file
against the SHA-256 its blob is named by (Model.verify_state
'publisher_digest', no UnverifiedWarning), a flipped byte refused at the
first open, and the manifest derived from the verified bytes kept in the
cache directory for the next open."""
import hashlib
import os
import warnings

import numpy as np
import pytest

import sluice
import stfile

REV = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(tmp_path, flip=False):
    repo = tmp_path / "hub" / "models--org--name"
    for d in ("blobs", "snapshots/" + REV, "refs"):
        os.makedirs(repo / d, exist_ok=True)
    (repo / "refs" / "main").write_text(REV)
    tmp = str(tmp_path / "download.tmp")
    stfile.write(tmp, {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                       "b": np.ones(4, dtype=np.float32)})
    with open(tmp, "rb") as f:
        data = bytearray(f.read())
    digest = hashlib.sha256(data).hexdigest()
    if flip:
        data[-1] ^= 1
    blob = repo / "blobs" / digest
    blob.write_bytes(bytes(data))
    os.remove(tmp)
    snap = repo / "snapshots" / REV
    os.symlink("../../blobs/" + digest, snap / "model.safetensors")
    return str(snap), digest, hashlib.sha256(data).hexdigest()


def test_snapshot_verified_against_the_blob_digest(tmp_path):
    snap, digest, _ = _snapshot(tmp_path)
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):  # derived, then read back from the cache
            with sluice.open(snap, cache_dir=str(cache)) as m:
                assert m.verify_state == "publisher_digest"
                assert m.verify_mode == "require"
                assert digest in m.manifest_path
                np.testing.assert_array_equal(m.get_tensor("b"), np.ones(4, dtype=np.float32))
    assert not [w for w in record if issubclass(w.category, sluice.UnverifiedWarning)]
    assert (cache / "derived" / "sha256" / (digest + ".manifest.json")).is_file()


def test_flipped_byte_refused_naming_both_digests(tmp_path):
    snap, digest, got = _snapshot(tmp_path, flip=True)
    with pytest.raises(sluice.ChecksumError) as e:
        sluice.open(snap, cache_dir=str(tmp_path / "cache"))
    assert digest in str(e.value) and got in str(e.value)
    assert "model.safetensors" in str(e.value)
