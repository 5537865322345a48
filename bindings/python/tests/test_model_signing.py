"""OpenSSF model signing from Python (issue 30): sluice.open(...,
trusted_keys=[EC.pub]) and trusted_cas=[CA.pem] verify model.sig at
open, with the manifest link; each fault raises SignatureError with its
message. Bundles are written by tests/model_signing_fx.py
(python3-cryptography) and by `sluice sign --format model-signing`."""
import os
import subprocess
import sys

import numpy as np
import pytest

import sluice
from conftest import REPO, sluice_cli

import stfile

FX = os.path.join(REPO, "tests", "model_signing_fx.py")

pytest.importorskip("cryptography")


@pytest.fixture
def signed(tmp_path):
    cli = sluice_cli()
    if cli is None:
        pytest.skip("the sluice command is not built (build-asan/sluice)")
    model = tmp_path / "m"
    model.mkdir()
    stfile.write(str(model / "model.safetensors"),
                 {"a": np.arange(64, dtype=np.float32), "b": np.ones((4, 4), np.float32)})
    subprocess.run([cli, "manifest", str(model), "-q", "-o", str(model / "sluice.manifest.json")],
                   check=True, capture_output=True)
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, FX, "keys", str(keys)], check=True)
    return cli, model, keys


def fx_sign(model, keys, case):
    subprocess.run([sys.executable, FX, "sign", str(model), str(keys), case], check=True)


def test_trusted_keys_and_cas(signed):
    cli, model, keys = signed
    fx_sign(model, keys, "p384")
    with sluice.open(model, trusted_keys=[keys / "p384.pub"]) as m:
        assert np.array_equal(m["a"], np.arange(64, dtype=np.float32))
    fx_sign(model, keys, "cert")
    with sluice.open(model, trusted_cas=[keys / "ca.pem"]) as m:
        assert len(m) == 2
    # signature_path: the bundle elsewhere
    os.rename(model / "model.sig", model.parent / "elsewhere.sig")
    with sluice.open(model, trusted_cas=[str(keys / "ca.pem")],
                     signature_path=model.parent / "elsewhere.sig") as m:
        assert len(m) == 2
    # sluice's own signer
    subprocess.run([cli, "sign", str(model), "--format", "model-signing", "--key",
                    str(keys / "p256.key")], check=True, capture_output=True)
    with sluice.open(model, trusted_keys=[keys / "p256.pub"]) as m:
        assert len(m) == 2


@pytest.mark.parametrize("case,ca,words", [
    ("hint", False, "key hint mismatch"),
    ("untrusted-chain", True, "not trusted"),
    ("bad-signature", False, "does not verify"),
    ("predicate-type", False, "wrong predicate type"),
    ("manifest-digest", False, "differs from the one signed"),
    ("keyless", False, "keyless (Sigstore)"),
])
def test_failures(signed, case, ca, words):
    cli, model, keys = signed
    fx_sign(model, keys, case)
    kw = {"trusted_cas": [keys / "ca.pem"]} if ca else {"trusted_keys": [keys / "p256.pub"]}
    with pytest.raises(sluice.SignatureError, match=words.replace("(", r"\(").replace(")", r"\)")):
        sluice.open(model, **kw)


def test_arguments(signed):
    cli, model, keys = signed
    with pytest.raises(TypeError, match="trusted_cas must be a list"):
        sluice.open(model, trusted_cas=str(keys / "ca.pem"))
    with pytest.raises(sluice.InvalidArgumentError, match="signature_path"):
        sluice.open(model, signature_path=model / "model.sig")
