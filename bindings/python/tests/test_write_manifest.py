"""sluice.write_manifest and python -m sluice (issue 38, item 2): the
package writes manifests with the C library's one writer (the bytes
`sluice manifest` writes), and its command line covers manifest, verify,
ls and cat with the command's exit statuses, so a Python-only user never
needs the C build's command."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import sluice
import stfile
from conftest import sluice_cli


def _model(tmp_path, name="m.safetensors"):
    path = str(tmp_path / name)
    stfile.write(path, {"w": np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024),
                        "b": np.ones(4, dtype=np.float32)})
    return path


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True,
                          env=env, timeout=120)


def test_sidecar_written_and_verified(tmp_path):
    path = _model(tmp_path)
    where = sluice.write_manifest(path, chunk="64K", parts="w 0\n", worlds=(2, 4))
    assert where == path + ".manifest.json"
    doc = json.load(open(where))
    assert doc["version"] == 2 and doc["algorithm"] == "sha256"
    w = doc["tensors"]["w"]
    assert w["chunk_bytes"] == 65536 and len(w["chunks"]) == 4
    assert sorted(w["parts"]["digests"]) == ["2", "4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", sluice.UnverifiedWarning)  # found, so no warning
        with sluice.open(path) as m:
            assert m.verify_state == "verified" and m.manifest_version == 2
            assert m.verify(files=True)["failures"] == []


def test_versions_and_descriptor(tmp_path):
    path = _model(tmp_path)
    for version, field in ((1, "sha256"), ("flat", None)):
        out = str(tmp_path / f"{version}.json")
        assert sluice.write_manifest(path, out, version=version) == out
        doc = json.load(open(out))
        if field:
            assert doc["version"] == 1 and field in doc["tensors"]["b"]
        else:
            assert set(doc) == {"w", "b"}
        with sluice.open(path, manifest=out, verify="require") as m:
            assert m.verify()["failures"] == []
    fd_out = tmp_path / "fd.json"
    with open(fd_out, "wb") as f:
        assert sluice.write_manifest(path, f.fileno()) == f.fileno()
    assert json.load(open(fd_out))["version"] == 2


def test_same_bytes_as_the_command(tmp_path):
    cli = sluice_cli()
    if not cli:
        pytest.skip("no sluice command built")
    path = _model(tmp_path)
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    sluice.write_manifest(path, a)
    subprocess.run([cli, "manifest", path, "-q", "-o", b], check=True, capture_output=True)
    assert open(a, "rb").read() == open(b, "rb").read()


def test_bad_arguments_and_unreadable(tmp_path):
    path = _model(tmp_path)
    with pytest.raises(ValueError):
        sluice.write_manifest(path, version=3)
    with pytest.raises(ValueError):
        sluice.write_manifest(path, version=1, parts="builtin")
    with pytest.raises(sluice.InvalidArgumentError):
        sluice.write_manifest(path, str(tmp_path / "x.json"), chunk=100)
    with pytest.raises(ValueError):
        sluice.write_manifest(path, parts="w x\n")
    with pytest.raises(sluice.NoFilesError):
        sluice.write_manifest(str(tmp_path / "none"))
    assert not os.path.exists(str(tmp_path / "x.json"))


def test_python_m_sluice(tmp_path):
    path = _model(tmp_path)
    r = _run("verify", path)
    assert r.returncode == 3, r.stderr  # no manifest: cannot open
    r = _run("manifest", path, "-o", path + ".manifest.json")
    assert r.returncode == 0, r.stderr
    r = _run("verify", path, "--files")
    assert r.returncode == 0, r.stderr
    assert b"2 tensors verified, 0 failed, 1 files verified, 0 failed" in r.stdout
    r = _run("ls", path, "--json")
    assert r.returncode == 0 and [t["name"] for t in json.loads(r.stdout)["tensors"]] == ["b", "w"] \
        or sorted(t["name"] for t in json.loads(r.stdout)["tensors"]) == ["b", "w"]
    r = _run("cat", path, "b")
    assert r.returncode == 0 and r.stdout == np.ones(4, dtype=np.float32).tobytes()
    r = _run("cat", path, "nope")
    assert r.returncode == 2 and r.stdout == b""
    r = _run("manifest")
    assert r.returncode == 2
    r = _run("manifest", path)  # to stdout
    assert r.returncode == 0 and json.loads(r.stdout)["version"] == 2
    # a changed byte: integrity (1), cat writes nothing
    with sluice.open(path, verify="off") as m:
        at = m.info("b").offset
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    r = _run("verify", path)
    assert r.returncode == 1 and b"FAILED tensor \"b\"" in r.stdout, r.stdout + r.stderr
    r = _run("cat", path, "b")
    assert r.returncode == 1 and r.stdout == b"", r.stderr
    # a trusted key that signed nothing: signature refused (4)
    pub = tmp_path / "k.pub"
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    pub.write_bytes(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    r = _run("verify", path, "--key", str(pub))
    assert r.returncode == 4, r.stderr


def test_python_m_sluice_inspect(tmp_path):
    """inspect says what a load's bytes are checked against, as `sluice
    inspect` does: no manifest, the manifest, and a refused open (FAILED,
    the listing from the headers, the refusal's exit status)."""
    path = _model(tmp_path)
    r = _run("inspect", path)
    assert r.returncode == 0, r.stderr
    assert b"verification: not verified: no manifest found" in r.stdout
    assert b"total: 2 tensors" in r.stdout
    sluice.write_manifest(path)
    r = _run("inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verification"]["state"] == "verified"
    assert doc["verification"]["manifest"] == path + ".manifest.json"
    assert sorted(t["name"] for t in doc["tensors"]) == ["b", "w"]
    _, pub = _keys(tmp_path)  # a trusted key that signed nothing: refused (4)
    r = _run("inspect", path, "--key", pub)
    assert r.returncode == 4, r.stderr
    assert b"verification: FAILED: " in r.stdout and b"total: 2 tensors" in r.stdout
    assert b"python -m sluice inspect: " in r.stderr
    r = _run("ls", path)  # the headers alone, nothing said of verification
    assert r.returncode == 0 and b"verification" not in r.stdout


# ------------------------------------------------ signing (issue 38, item 2)

def _keys(tmp_path, name="k"):
    """An Ed25519 key pair as `sluice keygen` writes them (PKCS#8, SPKI PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    k = ed25519.Ed25519PrivateKey.generate()
    priv, pub = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
    priv.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(priv), str(pub)


def test_sign_key_signs_as_the_command_does(tmp_path):
    path = _model(tmp_path)
    priv, pub = _keys(tmp_path)
    where = sluice.write_manifest(path, sign_key=priv)
    sig = where + ".sig"
    text = open(sig, "rb").read()
    assert text.startswith(b"sluice-signature 1\nalgorithm ed25519\n") and len(text) == 293
    with sluice.open(path, trusted_keys=[pub], verify="require") as m:
        assert m.verify_state == "verified" and m.verify()["failures"] == []
    cli = sluice_cli()
    if cli:  # the command's signature of the same bytes is the same file (Ed25519 is deterministic)
        other = str(tmp_path / "cmd.sig")
        subprocess.run([cli, "sign", where, "--key", priv, "-o", other], check=True,
                       capture_output=True)
        assert open(other, "rb").read() == text
    # another signer's key is refused; a manifest changed after signing too
    _, pub2 = _keys(tmp_path, "other")
    with pytest.raises(sluice.SignatureError):
        sluice.open(path, trusted_keys=[pub2], verify="require")
    with open(where, "ab") as f:
        f.write(b" ")
    with pytest.raises(sluice.SignatureError):
        sluice.open(path, trusted_keys=[pub], verify="require")


def test_sign_key_elsewhere_and_refusals(tmp_path):
    path = _model(tmp_path)
    priv, pub = _keys(tmp_path)
    out = str(tmp_path / "M.json")
    sig = str(tmp_path / "elsewhere.sig")
    assert sluice.write_manifest(path, out, sign_key=priv, signature=sig) == out
    assert not os.path.exists(out + ".sig") and os.path.getsize(sig) == 293
    os.rename(sig, out + ".sig")
    with sluice.open(path, manifest=out, trusted_keys=[pub], verify="require") as m:
        assert m.verify()["failures"] == []
    with pytest.raises(sluice.SignatureError, match="private"):  # a public key cannot sign
        sluice.write_manifest(path, out, sign_key=pub)
    with pytest.raises(ValueError, match="descriptor"):
        sluice.write_manifest(path, 1, sign_key=priv)
    with pytest.raises(ValueError):
        sluice.write_manifest(path, out, signature=sig)


def test_python_m_sluice_manifest_sign_key(tmp_path):
    path = _model(tmp_path)
    priv, pub = _keys(tmp_path)
    out = str(tmp_path / "M.json")
    r = _run("manifest", path, "-o", out, "--sign-key", priv)
    assert r.returncode == 0, r.stderr
    r = _run("verify", path, "--manifest", out, "--key", pub)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("manifest", path, "--sign-key", priv)  # no file to sign
    assert r.returncode == 2 and b"-o FILE" in r.stderr
    r = _run("manifest", path, "-o", out, "--sign-key", pub)  # not a private key: as the command
    assert r.returncode == 3 and b"private" in r.stderr, r.stderr
