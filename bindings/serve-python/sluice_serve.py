"""Python client of `sluice serve`, the gRPC tensor service
(proto/sluice/v1/tensor_service.proto).

    from sluice_serve import Client, ChecksumError
    with Client("127.0.0.1:7070") as c:
        info = c.model("synth")              # files, tensors, digests
        w = c.get_tensor("synth", "model.norm.weight")   # NumPy array, verified
        for name, arr in c.stream("synth"):  # every tensor, verified
            ...

Every tensor is checked end to end: the SHA-256 of the bytes received must
equal the manifest digest GetModel gave (or the digests of a manifest the
caller trusts: Client(..., manifest="path/sluice.manifest.json")); a
mismatch raises ChecksumError, as the library's binding does. The service
is then a cache, not a point of trust. Byte ranges (get_bytes with offset
and length) have no manifest digest: with a trusted manifest the client
fetches the whole tensor, checks it and slices it; without one, a range is
checked against the digest the server sends, which guards the transfer only.
A stream that ends early, even with status OK, raises ChecksumError.

The gRPC modules are generated from the proto with Debian's
python3-grpc-tools, at test time by tools/test_serve_python.sh (into a
directory named by SLUICE_SERVE_PROTO_OUT) or, failing that, on first
import into a temporary directory.

Dtypes: NumPy's where it has one (BOOL, U8..U64, I8..I64, F16, F32, F64,
C64 as complex64); BF16 comes as uint16 and the 8-bit floats as uint8 (the
raw bits, shape kept); the packed F4/F6 dtypes as a flat uint8 array of
the raw bytes.
"""
import hashlib
import json
import os
import sys
import tempfile

import grpc
import numpy as np

__all__ = ["Client", "ChecksumError", "generate"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROTO = os.path.join(_HERE, "..", "..", "proto", "sluice", "v1", "tensor_service.proto")


class ChecksumError(Exception):
    """The bytes received do not match the manifest digest."""


def generate(out_dir, proto=_PROTO):
    """Generates tensor_service_pb2(_grpc).py into out_dir with grpc_tools."""
    from grpc_tools import protoc

    os.makedirs(out_dir, exist_ok=True)
    proto = os.path.abspath(proto)
    rc = protoc.main(["protoc", "-I" + os.path.dirname(proto), "--python_out=" + out_dir,
                      "--grpc_python_out=" + out_dir, proto])
    if rc != 0:
        raise RuntimeError("protoc failed on %s (%d)" % (proto, rc))
    return out_dir


def _load():
    out = os.environ.get("SLUICE_SERVE_PROTO_OUT")
    if not out or not os.path.exists(os.path.join(out, "tensor_service_pb2.py")):
        out = generate(out or tempfile.mkdtemp(prefix="sluice-serve-pb-"))
    if out not in sys.path:
        sys.path.insert(0, out)
    import tensor_service_pb2
    import tensor_service_pb2_grpc

    return tensor_service_pb2, tensor_service_pb2_grpc


pb, pb_grpc = _load()

_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U32": np.uint32,
    "F32": np.float32, "I64": np.int64, "U64": np.uint64, "F64": np.float64,
    "C64": np.complex64, "F8_E5M2": np.uint8, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
    "F8_E4M3FNUZ": np.uint8, "F8_E5M2FNUZ": np.uint8,
}


def to_array(data, dtype, shape):
    """The bytes of a tensor as a NumPy array (little-endian, read-only copy)."""
    np_dtype = _DTYPES.get(dtype)
    if np_dtype is None:  # packed F4 / F6: raw bytes
        return np.frombuffer(data, dtype=np.uint8)
    return np.frombuffer(data, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(tuple(shape))


class Client:
    """A connection to a sluice serve server.

    addr: "host:port". token: the shared token (or token_file). TLS:
    root_certificates (PEM bytes or a path) for the server's CA, and
    certificate_chain + private_key for a client certificate (mutual TLS);
    server_name overrides the name checked in the server's certificate.
    manifest: a manifest file the caller trusts (its digests replace
    GetModel's). chunk_bytes: 0 for the server's default (1 MiB).
    """

    def __init__(self, addr, token=None, token_file=None, root_certificates=None,
                 certificate_chain=None, private_key=None, server_name=None,
                 manifest=None, chunk_bytes=0, timeout=300.0):
        def pem(x):
            if x is None or isinstance(x, bytes):
                return x
            with open(x, "rb") as f:
                return f.read()

        if token_file:
            with open(token_file) as f:
                token = f.read().strip()
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        options = []  # gRPC's default 4 MiB receive limit: every message of the server fits
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(pem(root_certificates), pem(private_key),
                                                 pem(certificate_chain))
            self._channel = grpc.secure_channel(addr, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(addr, options=options)
        self._stub = pb_grpc.TensorServiceStub(self._channel)
        self._timeout = timeout
        self._chunk = chunk_bytes
        self._models = {}
        self._trusted = None
        if manifest:
            self._trusted = self._read_manifest(manifest)

    @staticmethod
    def _read_manifest(path):
        with open(path) as f:
            doc = json.load(f)
        if isinstance(doc, dict) and doc.get("format") == "sluice-manifest":
            if doc.get("algorithm") != "sha256":
                raise ValueError("%s: a %s manifest; the service's digests are SHA-256"
                                 % (path, doc.get("algorithm")))
            # version 1: {"sha256": ...}; version 2: {"digest": ..., "dtype",
            # "shape"}: those, when given, are checked too (the right bytes
            # under another dtype or shape are other values).
            return {k: (bytes.fromhex(v["digest"] if "digest" in v else v["sha256"]),
                        v.get("dtype"), v.get("shape"))
                    for k, v in doc.get("tensors", {}).items()}
        return {k: (bytes.fromhex(v), None, None) for k, v in doc.items()}

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def list_models(self):
        r = self._stub.ListModels(pb.ListModelsRequest(), timeout=self._timeout,
                                  metadata=self._metadata)
        return [{"name": m.name, "tensor_count": m.tensor_count, "total_bytes": m.total_bytes,
                 "verified": m.verified} for m in r.models]

    def model(self, model):
        """GetModel's answer (a ModelInfo message), cached per model."""
        if model not in self._models:
            self._models[model] = self._stub.GetModel(
                pb.GetModelRequest(model=model), timeout=self._timeout, metadata=self._metadata)
        return self._models[model]

    def _tensor_info(self, model, name):
        for t in self.model(model).tensors:
            if t.name == name:
                return t
        return None

    def _expected(self, t):
        if self._trusted is not None:
            e = self._trusted.get(t.name)
            if e is None:
                raise ChecksumError("%s: not in the trusted manifest" % t.name)
            d, dtype, shape = e
            if dtype is not None and t.dtype != dtype:
                raise ChecksumError("%s: dtype %s, trusted manifest %s" % (t.name, t.dtype, dtype))
            if shape is not None and list(t.shape) != list(shape):
                raise ChecksumError("%s: shape %s, trusted manifest %s"
                                    % (t.name, list(t.shape), list(shape)))
            return d
        return bytes(t.sha256)

    def _check(self, t, data):
        want = self._expected(t)
        if len(data) != t.nbytes:
            raise ChecksumError("%s: %d bytes received, %d expected" % (t.name, len(data), t.nbytes))
        if not want:
            raise ChecksumError("%s: the server gives no manifest digest (unverified model)" % t.name)
        got = hashlib.sha256(data).digest()
        if got != want:
            raise ChecksumError("%s: sha256 %s, manifest %s" % (t.name, got.hex(), want.hex()))

    def _read_chunks(self, chunks, base=0):
        buf = bytearray()
        sent = None
        for c in chunks:
            if c.offset != base + len(buf) or sent is not None:
                raise ChecksumError("%s: chunk out of order" % c.name)
            buf += c.data
            if c.last:
                sent = bytes(c.sha256)
        if sent is None:
            raise ChecksumError("the stream ended without its last chunk")
        return bytes(buf), sent

    def get_bytes(self, model, name, offset=None, length=None):
        """The raw bytes of a tensor, or of length bytes from offset (length
        0 or None: to the end). A whole tensor is checked against the
        manifest digest. A range has no manifest digest: with a trusted
        manifest the whole tensor is fetched, checked and sliced (a range
        is never taken on the server's word); without one, the range is
        checked against the server's digest of it (the transfer only)."""
        ranged = offset is not None or length is not None
        if ranged and self._trusted is not None:
            t = self._tensor_info(model, name)
            if t is None:
                raise ChecksumError("%s: not listed by GetModel" % name)
            off, n = offset or 0, length or 0
            if off > t.nbytes or n > t.nbytes - off:
                raise ValueError("range [%d, +%d) is outside %s's %d bytes"
                                 % (off, n, name, t.nbytes))
            data = self.get_bytes(model, name)
            return data[off:off + n] if n else data[off:]
        req = pb.GetTensorRequest(model=model, name=name, chunk_bytes=self._chunk)
        if ranged:
            req.range.offset = offset or 0
            req.range.length = length or 0
        t = self._tensor_info(model, name)
        data, sent = self._read_chunks(
            self._stub.GetTensor(req, timeout=self._timeout, metadata=self._metadata),
            base=(offset or 0) if ranged else 0)
        if ranged:
            if hashlib.sha256(data).digest() != sent:
                raise ChecksumError("%s: range does not match the server's digest" % name)
            return data
        if t is None:
            raise ChecksumError("%s: not listed by GetModel" % name)
        self._check(t, data)
        return data

    def get_tensor(self, model, name):
        """One tensor as a NumPy array, verified against the manifest digest."""
        t = self._tensor_info(model, name)
        data = self.get_bytes(model, name)
        return to_array(data, t.dtype, t.shape)

    def stream(self, model, names=None, raw=False):
        """Yields (name, array) (or (name, bytes) with raw=True) for the
        listed tensors (None: all), each verified, in delivery order."""
        tensors = self.model(model).tensors
        info = {t.name: t for t in tensors}
        names = list(names or [])
        # What the server owes, in order (the proto: the names as given, or
        # every tensor in the model's order): a stream that ends early with
        # status OK, or skips or swaps a tensor, raises.
        owed = names or [t.name for t in tensors]
        req = pb.StreamTensorsRequest(model=model, names=names, chunk_bytes=self._chunk)
        it = self._stub.StreamTensors(req, timeout=self._timeout, metadata=self._metadata)
        cur, buf, done = None, bytearray(), 0
        for c in it:
            if c.name != cur:
                if cur is not None:
                    raise ChecksumError("%s: next tensor before the last chunk" % cur)
                if done >= len(owed) or c.name != owed[done]:
                    raise ChecksumError("%s: not the tensor expected next (%s)"
                                        % (c.name, owed[done] if done < len(owed) else "none"))
                cur = c.name
            if c.offset != len(buf):
                raise ChecksumError("%s: chunk out of order" % c.name)
            buf += c.data
            if c.last:
                t = info.get(cur)
                if t is None:
                    raise ChecksumError("%s: not listed by GetModel" % cur)
                data = bytes(buf)
                self._check(t, data)
                yield cur, (data if raw else to_array(data, t.dtype, t.shape))
                cur, buf, done = None, bytearray(), done + 1
        if cur is not None:
            raise ChecksumError("%s: the stream ended before its last chunk" % cur)
        if done < len(owed):
            raise ChecksumError("%s: the stream ended before it (%d of %d tensors)"
                                % (owed[done], done, len(owed)))
