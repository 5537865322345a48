"""A Hugging Face Hub cache snapshot is verified with no setup: each file
against the SHA-256 its blob is named by (Model.verify_state
'publisher_digest', no UnverifiedWarning), a flipped byte refused at the
first open, and the manifest derived from the verified bytes kept in the
cache directory for the next open; an hf:// model that publishes no
manifest, the same against the LFS SHA-256 the Hub lists (tests/hf_hub_server.py)."""
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


# ---------------------------------------------------------------- hf://

HF_SERVER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "hf_hub_server.py")
COMMIT = "1111111111111111111111111111111111111111"


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """The C tests' stand-in for the Hub (tests/hf_hub_server.py) serving
    org/name at COMMIT (main), one model.safetensors with no sluice
    manifest: (base URL, the file's bytes)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    if not sluice.features().get("remote"):
        pytest.skip("the binding is built without libcurl")
    root = tmp_path / "hubroot"
    os.makedirs(root / "org" / "name" / "refs")
    os.makedirs(root / "org" / "name" / COMMIT)
    (root / "org" / "name" / "refs" / "main").write_text(COMMIT)
    path = str(root / "org" / "name" / COMMIT / "model.safetensors")
    stfile.write(path, {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                        "b": np.ones(4, dtype=np.float32)})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, HF_SERVER, str(port), str(root)])
    base = "http://127.0.0.1:%d" % port
    deadline = time.monotonic() + 20
    while True:  # bounded: until the server answers (or has died)
        try:
            urllib.request.urlopen(base + "/ctl/storage", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.skip("the stand-in Hub did not start")
            time.sleep(0.05)
    monkeypatch.setenv("HF_ENDPOINT", base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with open(path, "rb") as f:
        data = f.read()
    yield base, data
    proc.kill()
    proc.wait()


def test_hf_model_verified_by_the_hubs_lfs_digest(fake_hub, tmp_path):
    _, data = fake_hub
    digest = hashlib.sha256(data).hexdigest()
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):  # derived at the first open, then read back
            with sluice.open("hf://org/name", cache_dir=str(cache)) as m:
                assert m.verify_state == "publisher_digest"
                assert m.verify_mode == "require"
                assert "LFS SHA-256" in m.manifest_path
                np.testing.assert_array_equal(m.get_tensor("b"), np.ones(4, dtype=np.float32))
    assert not [w for w in record if issubclass(w.category, sluice.UnverifiedWarning)]
    assert (cache / "derived" / "sha256" / (digest + ".manifest.json")).is_file()


def test_hf_flipped_byte_refused_naming_both_digests(fake_hub, tmp_path):
    import urllib.request
    base, data = fake_hub
    at = len(data) - 1
    flipped = bytearray(data)
    flipped[at] ^= 1
    urllib.request.urlopen(base + "/ctl/flip?at=%d" % at, timeout=10).read()
    with pytest.raises(sluice.ChecksumError) as e:
        sluice.open("hf://org/name", cache_dir=str(tmp_path / "cache"))
    msg = str(e.value)
    assert hashlib.sha256(data).hexdigest() in msg
    assert hashlib.sha256(bytes(flipped)).hexdigest() in msg
    assert "model.safetensors" in msg
