"""Verification v2 from Python: BLAKE3 and version 2 manifests, signed
manifests (trusted_keys), reads into caller memory (read_into), verified
ranges (get_range) and chunk-verified slices. Manifests are written here
from the format's description (stfile.write_manifest_v2), BLAKE3 digests
by the b3sum program and signatures by the openssl program: independent
of the library under test."""
import base64
import hashlib
import os
import shutil
import subprocess

import numpy as np
import pytest

import sluice
import stfile
from sluice import _errors as E
from sluice import safe_open, load_file

ROW = 256  # float32 per row of "big": 1 KiB rows
CHUNK = 4096  # the smallest chunk the library accepts: 4 rows a chunk


@pytest.fixture
def model(tmp_path):
    """One file: "big" (64 rows of 1 KiB: 16 chunks of 4 KiB), "w", "b"."""
    rng = np.random.default_rng(11)
    tensors = {
        "big": rng.standard_normal((64, ROW)).astype(np.float32),
        "w": rng.standard_normal((10, 4, 3)).astype(np.float32),
        "b": np.arange(7, dtype=np.int64),
    }
    path = str(tmp_path / "model.safetensors")
    stfile.write(path, tensors)
    return path, tensors


def need(program):
    if shutil.which(program) is None:
        pytest.skip(f"the {program} program is not installed (tools/test_python.sh installs it)")


# ------------------------------------------------------------------ BLAKE3

def test_blake3_manifest(model):
    need("b3sum")
    path, tensors = model
    stfile.write_manifest_v2(path + ".manifest.json", [path], algorithm="blake3")
    if not sluice.algorithm_supported("blake3"):
        with pytest.raises(sluice.UnsupportedError):
            sluice.open(path)
        pytest.skip("this build has no BLAKE3 (librust-blake3-dev absent at build time): "
                    "its manifest raised UnsupportedError")
    with sluice.open(path) as m:
        assert m.digest_algorithm == "blake3" and m.manifest_version == 2
        assert m.verify_mode == "require"
        for k, t in tensors.items():
            h = m.get_handle(k)
            assert h.digest().hex() == stfile.b3sum(t.tobytes())  # the library's = b3sum's
            np.testing.assert_array_equal(m.get_tensor(k), t)
            del h
        assert m.stats()["tensors_verified"] == len(tensors)
        assert m.verify()["tensors_ok"] == len(tensors)


def test_blake3_mismatch_caught(model):
    need("b3sum")
    if not sluice.algorithm_supported("blake3"):
        pytest.skip("this build has no BLAKE3")
    path, tensors = model
    stfile.write_manifest_v2(path + ".manifest.json", [path], algorithm="blake3")
    stfile.flip_byte(path, stfile.tensor_offset(path, "w") + 5)
    with sluice.open(path) as m:
        with pytest.raises(sluice.ChecksumError) as ei:
            m.get_tensor("w")
        assert ei.value.name == "w"
        np.testing.assert_array_equal(m.get_tensor("b"), tensors["b"])


def test_sha256_is_the_default_algorithm(model):
    path, _ = model
    stfile.write_manifest_v2(path + ".manifest.json", [path])
    with sluice.open(path) as m:
        assert m.digest_algorithm == "sha256" and m.manifest_version == 2
    assert sluice.algorithm_supported("sha256")
    with pytest.raises(ValueError):
        sluice.algorithm_supported("md5")


# ------------------------------------------------------- v2 header checks

def retype_in_header(path, name, old, new):
    """Rewrites tensor name's dtype in the header, same length and size."""
    with open(path, "rb") as f:
        data = f.read()
    pat = f'"{name}":{{"dtype":"{old}"'.encode()
    assert data.count(pat) == 1
    with open(path, "wb") as f:
        f.write(data.replace(pat, f'"{name}":{{"dtype":"{new}"'.encode()))


def test_v2_header_tampering_raises_mismatch(model):
    path, tensors = model
    stfile.write_manifest_v2(path + ".manifest.json", [path])
    retype_in_header(path, "w", "F32", "I32")  # same bytes, read otherwise
    with pytest.raises(sluice.ManifestMismatchError) as ei:
        sluice.open(path)
    e = ei.value
    assert e.code == E.E_MANIFEST_MISMATCH == -47
    assert isinstance(e, sluice.ManifestError)
    assert "'w'" in e.message or '"w"' in e.message, e.message
    with pytest.raises(sluice.ManifestMismatchError):
        safe_open(path)
    # a version 1 (flat) manifest covers the bytes only: the same rewrite opens
    stfile.write_manifest(path + ".manifest.json",
                          {k: stfile.sha256(t.tobytes()) for k, t in tensors.items()})
    with sluice.open(path) as m:
        assert m.manifest_version == 0 and m.info("w").dtype == "I32"


# ------------------------------------------------------- signed manifests

def openssl(*args, **kw):
    return subprocess.run(["openssl", *args], check=True, capture_output=True, **kw).stdout


def keypair(d, name):
    """An Ed25519 key by openssl: (private PEM path, public PEM path, DER SPKI)."""
    priv, pub = os.path.join(d, name + ".key"), os.path.join(d, name + ".pub")
    openssl("genpkey", "-algorithm", "ed25519", "-out", priv)
    openssl("pkey", "-in", priv, "-pubout", "-out", pub)
    return priv, pub, openssl("pkey", "-in", priv, "-pubout", "-outform", "DER")


def sign(manifest, priv, der):
    """MANIFEST.sig in the format of sluice.h ("Signed manifests"), the
    signature made by openssl (pure Ed25519 over the manifest's bytes)."""
    sig = openssl("pkeyutl", "-sign", "-inkey", priv, "-rawin", "-in", manifest)
    assert len(sig) == 64
    with open(manifest, "rb") as f:
        body = f.read()
    with open(manifest + ".sig", "w") as f:
        f.write("sluice-signature 1\nalgorithm ed25519\n"
                f"key sha256:{hashlib.sha256(der).hexdigest()}\n"
                f"manifest-sha256 {hashlib.sha256(body).hexdigest()}\n"
                f"signature {base64.b64encode(sig).decode()}\n")


def test_signed_manifest(model, tmp_path):
    need("openssl")
    path, tensors = model
    mf = path + ".manifest.json"
    stfile.write_manifest_v2(mf, [path])
    priv, pub, der = keypair(str(tmp_path), "good")
    _, other, _ = keypair(str(tmp_path), "other")
    sign(mf, priv, der)

    with sluice.open(path, trusted_keys=[pub]) as m:  # good signature
        np.testing.assert_array_equal(m.get_tensor("w"), tensors["w"])
    with sluice.open(path, trusted_keys=[other, pub]) as m:  # one of them signed
        assert m.verify_mode == "require"
    with safe_open(path, trusted_keys=[pub]) as f:
        np.testing.assert_array_equal(f.get_tensor("b"), tensors["b"])
    assert sorted(load_file(path, trusted_keys=[pub])) == sorted(tensors)

    with pytest.raises(sluice.SignatureError) as ei:  # wrong key
        sluice.open(path, trusted_keys=[other])
    assert ei.value.code == E.E_SIGNATURE == -48
    assert not isinstance(ei.value, sluice.ManifestError)  # never caught as one
    with pytest.raises(sluice.SignatureError):
        safe_open(path, trusted_keys=[other])
    with pytest.raises(sluice.SignatureError):
        load_file(path, trusted_keys=[other])
    with pytest.raises(sluice.InvalidArgumentError):  # keys never mean "unverified"
        sluice.open(path, verify="off", trusted_keys=[pub])
    with pytest.raises(TypeError):
        sluice.open(path, trusted_keys=pub)  # one path, not a list
    with pytest.raises(TypeError):
        sluice.open(path, trusted_keys=[3])
    with pytest.raises(sluice.SignatureError):  # a key file that is no key
        sluice.open(path, trusted_keys=[mf])

    with open(mf, "rb") as f:  # the manifest changed by one byte after signing
        body = f.read()
    with open(mf, "wb") as f:
        f.write(body.replace(b'"version": 2', b'"version":  2'))
    with pytest.raises(sluice.SignatureError):
        sluice.open(path, trusted_keys=[pub])
    with open(mf, "wb") as f:
        f.write(body)
    os.remove(mf + ".sig")  # no signature
    with pytest.raises(sluice.SignatureError):
        sluice.open(path, trusted_keys=[pub])
    with sluice.open(path, trusted_keys=[]) as m:  # none asked
        assert m.verify_mode == "require"


# -------------------------------------------------------------- read_into

def test_read_into(model):
    path, tensors = model
    stfile.write_manifest_v2(path + ".manifest.json", [path], chunk_bytes=CHUNK)
    big, w = tensors["big"], tensors["w"]
    with sluice.open(path) as m:
        out = np.empty_like(w)
        assert m.read_into("w", out) == w.nbytes  # whole-tensor digest
        np.testing.assert_array_equal(out, w)
        raw = w.tobytes()
        ba = bytearray(len(raw) + 3)  # an unaligned memoryview slice
        assert m.read_into("w", memoryview(ba)[3:3 + 40], 8) == 40
        assert bytes(ba[3:43]) == raw[8:48] and ba[:3] == b"\0\0\0" and ba[43:] == bytes(len(raw) - 40)
        assert m.read_into("w", bytearray(10), len(raw) - 4) == 4  # up to the end
        assert m.read_into("w", bytearray(10), len(raw)) == 0
        # chunked: the chunks covering the range only, no pool
        st0 = m.stats()
        mv = memoryview(bytearray(5001))[1:]
        assert m.read_into("big", mv, 3 * CHUNK + 100) == 5000
        assert mv.tobytes() == big.tobytes()[3 * CHUNK + 100:3 * CHUNK + 5100]
        st = m.stats()
        assert st["chunks_verified"] - st0["chunks_verified"] == 2
        assert st["bytes_read"] - st0["bytes_read"] == 2 * CHUNK
        assert st["pool_in_use"] == st0["pool_in_use"]
        with pytest.raises(ValueError):
            m.read_into("w", bytearray(4), len(raw) + 1)
        with pytest.raises((TypeError, BufferError)):
            m.read_into("w", bytes(48))  # read-only
        with pytest.raises((BufferError, ValueError)):  # NumPy says ValueError
            m.read_into("w", np.empty((8, 8), np.float32)[:, ::2])  # not contiguous
        with pytest.raises(sluice.NotFoundError):
            m.read_into("nope", bytearray(4))
        with pytest.raises(TypeError):
            m.read_into("w", bytearray(4), None)
    with pytest.raises(sluice.ClosedError):
        m.read_into("w", bytearray(4))


def test_read_into_checks(model):
    path, tensors = model
    stfile.write_manifest_v2(path + ".manifest.json", [path], chunk_bytes=CHUNK)
    stfile.flip_byte(path, stfile.tensor_offset(path, "w") + 47)
    with sluice.open(path) as m:
        with pytest.raises(sluice.ChecksumError) as ei:  # the whole tensor is checked
            m.read_into("w", bytearray(4))
        assert ei.value.name == "w"
        out = np.empty_like(tensors["b"])
        m.read_into("b", out)
        np.testing.assert_array_equal(out, tensors["b"])


def test_read_into_larger_than_pool(model):
    path, tensors = model
    stfile.write_manifest_v2(path + ".manifest.json", [path])  # no chunks: whole tensor
    big = tensors["big"]
    with sluice.open(path, pool=16 << 10) as m:  # 16 KiB pool, 64 KiB tensor
        with pytest.raises(sluice.TooLargeError):
            m.get_tensor("big")
        out = np.zeros_like(big)
        assert m.read_into("big", out) == big.nbytes
        np.testing.assert_array_equal(out, big)
        assert m.stats()["pool_high_water"] <= 16 << 10


# ------------------------------------------------------ get_range, slices

def corrupt_chunk(path, k):
    """Flips a byte inside chunk k of "big" (rows 4k..4k+3)."""
    stfile.flip_byte(path, stfile.tensor_offset(path, "big") + k * CHUNK + 1000)


def test_chunked_slice(model):
    path, tensors = model
    big = tensors["big"]
    stfile.write_manifest_v2(path + ".manifest.json", [path], chunk_bytes=CHUNK)
    corrupt_chunk(path, 5)  # rows 20..23
    with safe_open(path) as f:
        s = f.get_slice("big")
        assert s.verified and s.chunked
        assert f.model.manifest_chunks("big") == (CHUNK, 16)
        assert f.model.manifest_chunks("w") is None
        st0 = f.model.stats()
        np.testing.assert_array_equal(s[0:8], big[0:8])
        st = f.model.stats()
        assert st["chunks_verified"] - st0["chunks_verified"] == 2  # chunks 0 and 1 only
        assert st["bytes_read"] - st0["bytes_read"] == 2 * CHUNK
        assert st["tensors_loaded"] == st0["tensors_loaded"]  # not through the pool
        np.testing.assert_array_equal(s[24:64:3, 5:9], big[24:64:3, 5:9])
        np.testing.assert_array_equal(s[-1], big[-1])
        np.testing.assert_array_equal(s[19:15:-1], big[19:15:-1])
        assert s[0:8].flags.writeable
        for idx in (slice(18, 22), 20, 23, slice(16, 30, 5), Ellipsis):
            with pytest.raises(sluice.ChecksumError):
                s[idx]
        with pytest.raises(sluice.ChecksumError):
            f.get_tensor("big")  # the whole tensor covers chunk 5
        np.testing.assert_array_equal(s[24:25], big[24:25])  # still fine after


def test_get_range(model):
    path, tensors = model
    big = tensors["big"]
    stfile.write_manifest_v2(path + ".manifest.json", [path], chunk_bytes=CHUNK)
    corrupt_chunk(path, 9)
    m = sluice.open(path)
    w = m.get_tensor("w")
    r = m.get_range("big", CHUNK + 4, 3 * CHUNK)
    assert r.dtype == np.uint8 and r.shape == (2 * CHUNK - 4,) and not r.flags.writeable
    h = sluice.handle_of(r)
    assert isinstance(h, sluice._sluice.Handle) and h.address == r.ctypes.data  # zero copy
    assert h.digest() is None  # a range has no digest of its own
    del h
    assert r.tobytes() == big.tobytes()[CHUNK + 4:3 * CHUNK]
    rows = m.get_range("big", 8 * 1024, 10 * 1024).view(np.float32).reshape(2, ROW)
    with pytest.raises(sluice.ChecksumError) as ei:
        m.get_range("big", 9 * CHUNK, 9 * CHUNK + 1)
    assert ei.value.name == "big"
    assert m.get_range("b", 8, 8).shape == (0,)
    with pytest.raises(ValueError):
        m.get_range("b", 0, 57)
    with pytest.raises(ValueError):
        m.get_range("b", 9, 8)
    # the other arrays and the model released: the range keeps its handle
    del w
    m.close()
    assert m._m.open_in_library and m._m.live_handles == 2  # r and rows
    with pytest.raises(sluice.ClosedError):
        m.get_range("big", 0, 4)
    assert r.tobytes() == big.tobytes()[CHUNK + 4:3 * CHUNK]
    np.testing.assert_array_equal(rows, big[8:10])
    del rows
    assert m._m.open_in_library
    del r  # the last: the library's model is closed now
    assert m._m.live_handles == 0 and not m._m.open_in_library


# ------------------------------------------- the project's own CLI, interop

def test_cli_written_blake3_chunked_signed(model, tmp_path):
    """A manifest written by `sluice manifest --algorithm blake3 --chunk 4K`
    and signed with `sluice keygen`/`sluice sign` (the build's command,
    built by tools/test.sh before this stage) is read from Python: signed,
    BLAKE3 (digests equal b3sum's), chunk-verified slices."""
    from conftest import sluice_cli
    cli = sluice_cli()
    if cli is None:
        pytest.skip("the sluice command is not built (tools/test.sh builds build-asan/sluice)")
    need("b3sum")
    if not sluice.algorithm_supported("blake3"):
        pytest.skip("this build of the binding has no BLAKE3")
    path, tensors = model
    big = tensors["big"]
    mf = path + ".manifest.json"
    prefix = str(tmp_path / "signer")

    def run(*args):
        r = subprocess.run([cli, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)

    run("manifest", path, "--algorithm", "blake3", "--chunk", "4K", "-q", "-o", mf)
    run("keygen", "--out", prefix)
    run("sign", mf, "--key", prefix + ".key")
    corrupt_chunk(path, 2)  # rows 8..11, after the manifest was written
    with safe_open(path, trusted_keys=[prefix + ".pub"]) as f:
        m = f.model
        assert m.digest_algorithm == "blake3" and m.manifest_version == 2
        assert m.manifest_chunks("big") == (CHUNK, 16)
        h = m.get_handle("w")
        assert h.digest().hex() == stfile.b3sum(tensors["w"].tobytes())
        del h
        s = f.get_slice("big")
        assert s.chunked
        np.testing.assert_array_equal(s[12:40], big[12:40])
        with pytest.raises(sluice.ChecksumError):
            s[10]
    with pytest.raises(sluice.SignatureError):
        sluice.open(path, trusted_keys=[str(tmp_path / "other.pub")])  # unreadable key
