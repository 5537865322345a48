#!/usr/bin/python3
"""OpenSSF model-signing fixtures for test_model_signing.c and
bindings/python/tests/test_model_signing.py, written with
python3-cryptography from the format's description (the Sigstore bundle
v0.3, DSSE, the in-toto statement of model_signing 1.x), never from the
reference's code.

  model_signing_fx.py keys DIR               EC keys (p256, p384, p521, other),
                                             a CA and its leaves (LEAVES: one
                                             for code signing, and each kind
                                             the leaf rule refuses), an
                                             untrusted CA and its leaves
  model_signing_fx.py sign MODEL DIR CASE    writes MODEL/model.sig for CASE
  model_signing_fx.py check MODEL SIG PUB    verifies a bundle sluice wrote, by
                                             the format's rules (exit 0 or 1)
  model_signing_fx.py statement MODEL CASE OUT  writes CASE's statement alone (the
                                             payload; fuzz_msign_statement's corpus)
"""
import base64
import datetime
import hashlib
import json
import os
import sys
import warnings

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (decode_dss_signature,
                                                             encode_dss_signature)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MEDIA = "application/vnd.dev.sigstore.bundle.v0.3+json"
PTYPE = "application/vnd.in-toto+json"
STYPE = "https://in-toto.io/Statement/v1"
PRED = "https://model_signing/signature/v1.0"
CURVES = {"p256": ec.SECP256R1(), "p384": ec.SECP384R1(), "p521": ec.SECP521R1()}
IGNORED = {"model.sig", ".git", ".gitattributes", ".github", ".gitignore"}
SHARD = 4096  # the shard size of case "shards"
ORDER = {  # the group orders n of P-256, P-384, P-521 (SEC 2)
    256: 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
    384: int("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973", 16),
    521: int("01FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFA51868783BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409", 16),
}


def md_of(pub):
    return {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}[pub.curve.key_size]


def pem_pub(pub):
    return pub.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def write_key(path, key):
    with open(path + ".key", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(path + ".pub", "wb") as f:
        f.write(pem_pub(key.public_key()))


def load_key(path):
    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), None)


def cert(subject, issuer, issuer_key, pub, ca, usage, eku=None, md=None):
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
         .public_key(pub).serial_number(x509.random_serial_number())
         .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    ku = dict(digital_signature=False, content_commitment=False, key_encipherment=False,
              data_encipherment=False, key_agreement=False, key_cert_sign=False,
              crl_sign=False, encipher_only=False, decipher_only=False)
    ku.update(usage)
    b = b.add_extension(x509.KeyUsage(**ku), critical=True)
    if eku:
        b = b.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    with warnings.catch_warnings():  # SHA-1 is deprecated: that is the point of "sha1"
        warnings.simplefilter("ignore")
        return b.sign(issuer_key, md or hashes.SHA256())


SIGN = {"digital_signature": True}
CODE = [ExtendedKeyUsageOID.CODE_SIGNING]
# The leaves of each CA (its leaf key's certificates), by file name: the
# ones sluice's leaf rule refuses, and the reference's own shape (a
# basicConstraints CA flag without keyCertSign: not a CA), which it takes.
LEAVES = {
    "leaf": (False, SIGN, CODE, None),
    "nosign": (False, {"key_agreement": True}, None, None),
    "sha1": (False, SIGN, CODE, hashes.SHA1()),                  # signed with SHA-1
    "is-ca": (True, dict(SIGN, key_cert_sign=True), CODE, None),  # may issue certificates
    "tls": (False, dict(SIGN, key_encipherment=True), [ExtendedKeyUsageOID.SERVER_AUTH], None),
    "no-eku": (False, SIGN, None, None),                         # the reference takes it
    "ca-flag": (True, SIGN, CODE, None),                         # the reference's own shape
}
# case -> leaf of "ca" it is signed with
CERT_CASES = {"cert": "leaf", "no-sign": "nosign", "cert-sha1": "sha1", "cert-is-ca": "is-ca",
              "cert-tls": "tls", "cert-no-eku": "no-eku", "cert-ca-flag": "ca-flag"}


def keys(d):
    os.makedirs(d, exist_ok=True)
    for name, curve in CURVES.items():
        write_key(os.path.join(d, name), ec.generate_private_key(curve))
    write_key(os.path.join(d, "other"), ec.generate_private_key(ec.SECP256R1()))
    for ca_name in ("ca", "evil-ca"):
        ca_key = ec.generate_private_key(ec.SECP384R1())
        ca_cert = cert(ca_name, ca_name, ca_key, ca_key.public_key(), True,
                       {"key_cert_sign": True, "crl_sign": True})
        with open(os.path.join(d, ca_name + ".pem"), "wb") as f:
            f.write(ca_cert.public_bytes(serialization.Encoding.PEM))
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        write_key(os.path.join(d, ca_name + "-leaf"), leaf_key)
        for leaf, (is_ca, usage, eku, md) in LEAVES.items():
            c = cert(ca_name + "-" + leaf, ca_name, ca_key, leaf_key.public_key(), is_ca, usage,
                     eku, md)
            with open(os.path.join(d, "%s-%s.crt" % (ca_name, leaf)), "wb") as f:
                f.write(c.public_bytes(serialization.Encoding.PEM))


def listing(model):
    out = []
    for root, dirs, files in os.walk(model):
        rel_root = os.path.relpath(root, model)
        dirs[:] = [x for x in dirs if x not in IGNORED]
        for name in files:
            rel = name if rel_root == "." else rel_root + "/" + name
            if rel in IGNORED:
                continue
            with open(os.path.join(root, name), "rb") as f:
                out.append((rel, hashlib.sha256(f.read()).hexdigest()))
    out.sort(key=lambda r: r[0].split("/"))
    return out


def pae(payload):
    return b"DSSEv1 %d %s %d " % (len(PTYPE), PTYPE.encode(), len(payload)) + payload


def statement(model, case):
    res = [{"name": n, "algorithm": "sha256", "digest": d} for n, d in listing(model)]
    if case == "manifest-not-listed":
        res = [r for r in res if r["name"] != "sluice.manifest.json"]
    if case == "manifest-digest":
        for r in res:
            if r["name"] == "sluice.manifest.json":
                r["digest"] = hashlib.sha256(b"another manifest").hexdigest()
    if case == "file-not-listed":  # the first .safetensors file
        first = next(r for r in res if r["name"].endswith(".safetensors"))
        res = [r for r in res if r is not first]
    if case.startswith("omit-"):  # the Nth file listed (from 0, in the listing's order)
        del res[int(case[5:])]
    if case == "duplicate":
        res.append(dict(res[0]))
    method = "shards" if case == "shards" else "files"
    if case == "shards":  # each file in shards of SHARD bytes
        res = []
        for n, _ in listing(model):
            with open(os.path.join(model, n), "rb") as f:
                data = f.read()
            for s in range(0, len(data), SHARD):
                e = min(s + SHARD, len(data))
                res.append({"name": "%s:%d:%d" % (n, s, e), "algorithm": "sha256",
                            "digest": hashlib.sha256(data[s:e]).hexdigest()})
    if case in ("compat", "compat-duplicate"):  # the 0.2 form (-duplicate: the manifest
        subs = [{"name": r["name"], "digest": {"sha256": r["digest"]}} for r in res]
        if case == "compat-duplicate":  # listed again with another digest)
            subs.append({"name": "sluice.manifest.json",
                         "digest": {"sha256": hashlib.sha256(b"another manifest").hexdigest()}})
        return json.dumps({"_type": STYPE, "subject": subs,
                           "predicateType": "https://model_signing/Digests/v0.1",
                           "predicate": {}}, indent=2).encode()
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in res)).hexdigest()
    if case == "subject":
        root = hashlib.sha256(b"not the digests").hexdigest()
    if case.startswith("subject-byte-"):  # right but for one bit of byte N (0-31)
        raw = bytearray.fromhex(root)
        raw[int(case[13:])] ^= 0x01
        root = raw.hex()
    st = {"_type": "https://in-toto.io/Statement/v0.1" if case == "statement-type" else STYPE,
          "subject": [{"name": os.path.basename(os.path.abspath(model)), "digest": {"sha256": root}}],
          "predicateType": "https://example.com/other/v1" if case == "predicate-type" else PRED,
          "predicate": {"serialization": {"method": method, "hash_type": "sha256",
                                          "allow_symlinks": False,
                                          "ignore_paths": sorted(IGNORED),
                                          **({"shard_size": SHARD} if method == "shards" else {})},
                        "resources": res}}
    return json.dumps(st, indent=2).encode()


def sign(model, d, case):
    certified = case in CERT_CASES or case == "untrusted-chain"
    if certified:
        ca = "evil-ca" if case == "untrusted-chain" else "ca"
        key = load_key(os.path.join(d, ca + "-leaf.key"))
        with open(os.path.join(d, "%s-%s.crt" % (ca, CERT_CASES.get(case, "leaf"))), "rb") as f:
            leaf = x509.load_pem_x509_certificate(f.read())
        vm = {"x509CertificateChain": {"certificates": [
            {"rawBytes": base64.b64encode(leaf.public_bytes(serialization.Encoding.DER)).decode()}]}}
    else:
        curve = case if case in CURVES else "p256"
        key = load_key(os.path.join(d, curve + ".key"))
        hinted = load_key(os.path.join(d, "other.key")) if case == "hint" else key
        vm = {"publicKey": {"hint": hashlib.sha256(pem_pub(hinted.public_key())).hexdigest()}}
    if case == "keyless":
        vm = {"certificate": {"rawBytes": "AAAA"}, "tlogEntries": [{"logIndex": "1"}]}
    else:
        vm["tlogEntries"] = []
    payload = statement(model, case)
    signed = payload + b" " if case == "bad-signature" else payload
    sig = key.sign(pae(signed), ec.ECDSA(md_of(key.public_key())))
    if case == "malleated":  # (r, s) rewritten to (r, n - s): the same signature's twin
        r, s = decode_dss_signature(sig)
        sig = encode_dss_signature(r, ORDER[key.curve.key_size] - s)
    bundle = {"mediaType": "application/vnd.dev.sigstore.bundle+json;version=0.1"
              if case == "media-type" else MEDIA,
              "verificationMaterial": vm,
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(),
                               "payloadType": "application/json" if case == "payload-type" else PTYPE,
                               "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}
    with open(os.path.join(model, "model.sig"), "w") as f:
        json.dump(bundle, f)


def check(model, sig_path, pub_path):
    """The format's rules, applied to a bundle sluice wrote."""
    with open(sig_path) as f:
        b = json.load(f)
    with open(pub_path, "rb") as f:
        pub = serialization.load_pem_public_key(f.read())
    assert b["mediaType"] == MEDIA, b["mediaType"]
    assert b["verificationMaterial"]["publicKey"]["hint"] == hashlib.sha256(pem_pub(pub)).hexdigest()
    env = b["dsseEnvelope"]
    payload = base64.b64decode(env["payload"])
    pub.verify(base64.b64decode(env["signatures"][0]["sig"]), pae(payload), ec.ECDSA(md_of(pub)))
    assert env["payloadType"] == PTYPE
    st = json.loads(payload)
    assert st["_type"] == STYPE and st["predicateType"] == PRED and len(st["subject"]) == 1
    res = st["predicate"]["resources"]
    assert st["predicate"]["serialization"]["method"] == "files"
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in res)).hexdigest()
    assert st["subject"][0]["digest"]["sha256"] == root
    got = [(r["name"], r["digest"]) for r in res]
    assert got == listing(model), (got, listing(model))
    print("ok: %d resources" % len(res))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "keys":
        keys(sys.argv[2])
    elif cmd == "sign":
        sign(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "statement":
        with open(sys.argv[4], "wb") as f:
            f.write(statement(sys.argv[2], sys.argv[3]))
    else:
        sys.exit("unknown command " + cmd)
