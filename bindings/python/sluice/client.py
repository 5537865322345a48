"""sluice.client: the Python client of `sluice serve`, the gRPC tensor
service (proto/sluice/v1/tensor_service.proto). Part of the sluice
package (it was bindings/serve-python/sluice_serve.py); importable when
python3-grpcio is installed (and python3-grpc-tools, which generates its
gRPC modules from the proto the package ships, on first use).

    from sluice.client import Client, ChecksumError
    # The manifest is a copy the caller trusts (sluice manifest MODEL on a
    # machine that holds the model, or shipped with the job): its digests,
    # not the server's, are what each tensor is checked against.
    with Client("127.0.0.1:7070", manifest="synth/sluice.manifest.json") as c:
        info = c.model("synth")              # files, tensors, digests
        w = c.get_tensor("synth", "model.norm.weight")   # NumPy array, verified
        for name, arr in c.stream("synth"):  # every tensor, verified
            ...

Trust: the service is a cache, not a point of trust, only when the caller
passes a manifest it trusts (Client(..., manifest=PATH)). Then what is
owed is that manifest's tensors: GetModel must list exactly them, each
once, with the dtype, shape and nbytes the manifest gives (a tensor
missing, extra or described otherwise raises ChecksumError, before any
byte is read), and each tensor's bytes must have the manifest's SHA-256.
Without one, the digests come from the server itself (GetModel), so the
check catches corruption on the way and on the server's disk (its library
verified the tensor against its manifest) but not a server, or anyone who
can answer in its place, that lies about the model: use that only with a
server and a channel (TLS) you trust.

Every tensor is checked end to end: the SHA-256 of the bytes received must
equal the trusted manifest's digest (or, without one, the manifest digest
GetModel gave); a mismatch raises ChecksumError, as the library's binding
does. Byte ranges (get_bytes with offset and length) have no manifest
digest: with a trusted manifest the client fetches the whole tensor,
checks it and slices it; without one, a range is checked against the
digest the server sends, which guards the transfer only. Lengths are
checked as chunks arrive: every chunk's total_bytes must be what is owed
(the tensor's nbytes, or the range asked for), and a server that sends
more bytes than that is stopped at the first chunk past it (the client
never buffers more than what is owed plus one message). A stream that ends
early, even with status OK, raises ChecksumError. ChecksumError is the
client's one integrity error: whatever the server sent that does not
match what is owed.

Replicas: addr may name several servers of the same models, a replica
set: a list ["10.0.0.1:7070", "10.0.0.2:7070"] or the string
"10.0.0.1:7070,10.0.0.2:7070" (IP addresses of one family, made the
ipv4:/ipv6: target gRPC's resolver takes), or a target with a resolver
scheme ("dns:///NAME:PORT": every address the name resolves to;
"ipv4:A,B"). Calls to a replica set are spread by gRPC's round_robin over
the replicas that are up and whose grpc.health.v1 status is SERVING (a
server says NOT_SERVING from its SIGTERM on, while it drains), and a call
whose replica dies or drains (UNAVAILABLE, or CANCELLED by the server)
is made again on another
(failovers, 8 per call by default): a stream from the next tensor owed, a
tensor in flight from its next chunk (the rest of it as a range), every
byte still checked against the manifest digest, so what is owed is the
same whichever replicas sent it. Each failover is logged (logger
"sluice_serve", WARNING) and counted in Client.failovers_used.

The gRPC modules are generated from the proto with Debian's
python3-grpc-tools: into the directory SLUICE_SERVE_PROTO_OUT names (the
tests set it); else setup.py's, generated into the package (sluice/_pb)
when python3-grpc-tools was there at build time, so that python3-grpcio
alone then imports this module; else on first import into a temporary
directory, removed once they are imported. The proto is the one installed
in the package (setup.py copies it), else the repository's.

Dtypes: as sluice.Model.get_tensor gives them (one rule, the package's):
NumPy's where it has one (BOOL, U8..U64, I8..I64, F16, F32, F64, C64 as
complex64); BF16 and the 8-bit floats as ml_dtypes' types when it is
installed, else get_tensor and stream raise NotImplementedError naming
the tensor and dtype (before any byte is fetched) unless raw=True:
get_tensor then gives their bits (uint16, uint8, shape kept) and stream
the bytes; the packed F4/F6 dtypes as a flat uint8 array of the raw
bytes.
"""
import hashlib
import json
import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import time

import grpc
import numpy as np

from . import _errors, _check_dtype, _np_dtype_checked, _NP_DTYPES, _PACKED

__all__ = ["Client", "ChecksumError", "generate"]

_log = logging.getLogger("sluice_serve")
_HERE = os.path.dirname(os.path.abspath(__file__))

# The largest reply the client takes: GetModel's ModelInfo lists every
# tensor and carries the server's manifest byte for byte, about 2 x the
# name + 190 bytes a tensor (measured: 389 with 100-byte names, 590 with
# 200, a version 2 manifest), so gRPC's default 4 MiB stops at some
# 11,000-15,000 tensors; 1 GiB covers 1,000,000 tensors of names up to
# about 440 bytes. The server sends up to the same bound.
MAX_REPLY_BYTES = 1 << 30
# The chunk calls (GetTensor, StreamTensors) keep gRPC's 4 MiB per
# message: every chunk of the server fits (it cuts the data to fit), and
# a server that sends a bigger one fails the call RESOURCE_EXHAUSTED before
# the client buffers it.
MAX_CHUNK_MESSAGE_BYTES = 4 << 20
# The largest StreamTensors request the client sends: a call naming more
# tensors than fit (a resumed stream names every tensor still owed) is
# split into calls of at most this many bytes of names each, half the
# server's default --max-request-bytes (1 MiB).
MAX_STREAM_REQUEST_BYTES = 512 << 10
_RETRY = {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
          "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}


def service_config(replicas):
    """The channel's service config: the chunk calls' message bound, and for
    a replica set gRPC's round_robin over every address, each health-checked
    through grpc.health.v1 Watch (a replica that says NOT_SERVING gets no
    new call), and a call that fails UNAVAILABLE before any answer came
    retried by gRPC itself, each attempt picked anew. A call that fails
    after answers came is resumed by the client (failover). A method's own
    entry replaces the service's, so each carries the retry policy."""
    svc = "sluice.v1.TensorService"
    chunked = {"name": [{"service": svc, "method": "GetTensor"},
                        {"service": svc, "method": "StreamTensors"}],
               "maxResponseMessageBytes": str(MAX_CHUNK_MESSAGE_BYTES)}
    rest = {"name": [{"service": svc}]}
    conf = {"methodConfig": [chunked, rest] if replicas else [chunked]}
    if replicas:
        chunked["retryPolicy"] = rest["retryPolicy"] = _RETRY
        conf["loadBalancingConfig"] = [{"round_robin": {}}]
        conf["healthCheckConfig"] = {"serviceName": ""}
    return json.dumps(conf)


REPLICA_SERVICE_CONFIG = service_config(True)


def _first_batch(names, budget=MAX_STREAM_REQUEST_BYTES):
    """The longest prefix of names whose encoding (a tag, a length and the
    UTF-8 bytes each) stays within budget; at least one name (a name
    longer than budget goes alone: the server takes or refuses it)."""
    size = 0
    for k, n in enumerate(names):
        size += len(n.encode("utf-8")) + 6
        if k and size > budget:
            return names[:k]
    return names


def target_of(addr):
    """(gRPC target, whether it is a replica set) for addr: "HOST:PORT" (one
    server), a list or comma-separated string of IP:PORT / [IPV6]:PORT
    entries (made an ipv4:/ipv6: target), or a target with a resolver
    scheme (dns:, ipv4:, ipv6:), taken as it is. ValueError for a list
    with a name or of mixed families (a name: dns:///NAME:PORT)."""
    if isinstance(addr, str):
        if addr.startswith(("dns:", "ipv4:", "ipv6:")):
            return addr, True
        if "," not in addr:
            return addr, False
        addr = addr.split(",")
    family = None
    for e in addr:
        host, _, port = e.rpartition(":")
        v6 = len(host) > 2 and host[0] == "[" and host[-1] == "]"
        try:
            socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, host[1:-1] if v6 else host)
            ok = port.isdigit() and 0 < int(port) < 65536
        except OSError:
            ok = False
        if not ok:
            raise ValueError("%r: a list of servers takes IP:PORT or [IPV6]:PORT entries (a name "
                             "with several addresses: dns:///NAME:PORT)" % e)
        f = "ipv6:" if v6 else "ipv4:"
        if family not in (None, f):
            raise ValueError("a list of servers takes addresses of one family (IPv4 or IPv6)")
        family = f
    if family is None:
        raise ValueError("an empty list of servers")
    return family + ",".join(addr), True


def shuffled(target, rng=None):
    """target with its addresses in a random order when it is a list
    (ipv4:A,B,... or ipv6:A,B,...; any other target as it is), drawn by
    rng.shuffle (default: random.SystemRandom(), the OS's source, no
    generator state shared with anything). gRPC's round_robin (1.51)
    hands a channel's first calls to the replicas that turn ready first,
    the list's first, and draws its picker's starting index from the C
    library's rand(), which nothing seeds: every client given the list in
    one order began on the same replica. Each Client shuffles its own
    list, so each begins on a replica of its own drawing and round_robin
    goes on from there, call by call. A dns: target's addresses come from
    the resolver, in its order."""
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            entries = target[len(scheme):].split(",")
            (rng or random.SystemRandom()).shuffle(entries)
            return scheme + ",".join(entries)
    return target


# installed: the copy setup.py puts in the package; from the sources: the repository's
_PROTO = os.path.join(_HERE, "tensor_service.proto")
if not os.path.isfile(_PROTO):
    _PROTO = os.path.join(_HERE, "..", "..", "..", "proto", "sluice", "v1",
                          "tensor_service.proto")


class ChecksumError(_errors.ChecksumError):
    """The client's integrity error: what the server sent does not match
    what is owed. A tensor's bytes (their SHA-256 against the manifest
    digest, their count against nbytes or the range asked for, chunks out
    of order, a stream ending early) or, with a trusted manifest, the
    model's listing (a tensor of the manifest missing from GetModel, one
    it does not list, one listed twice, or another dtype, shape or nbytes
    than the manifest gives)."""

    def __init__(self, message, name=None):
        # a sluice.ChecksumError too (code SLUICE_E_CHECKSUM), so that one
        # handler catches the library's and the client's
        super().__init__(_errors.E_CHECKSUM, message, name)


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
    # SLUICE_SERVE_PROTO_OUT (the tests), else the modules setup.py
    # generated into the package, else generated now into a temporary
    # directory, removed once they are imported (one per process stayed).
    out = os.environ.get("SLUICE_SERVE_PROTO_OUT")
    built = os.path.join(_HERE, "_pb")
    if not out and os.path.isfile(os.path.join(built, "tensor_service_pb2_grpc.py")):
        out = built
    scratch = None
    if not out or not os.path.exists(os.path.join(out, "tensor_service_pb2.py")):
        if not out:
            out = scratch = tempfile.mkdtemp(prefix="sluice-serve-pb-")
        try:
            generate(out)
        except BaseException:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
    added = out not in sys.path
    if added:
        sys.path.insert(0, out)
    try:
        import tensor_service_pb2
        import tensor_service_pb2_grpc
    finally:
        if scratch:
            if added:
                sys.path.remove(scratch)
            shutil.rmtree(scratch, ignore_errors=True)

    return tensor_service_pb2, tensor_service_pb2_grpc


pb, pb_grpc = _load()

def to_array(data, dtype, shape, name=None, raw=False):
    """The bytes of a tensor as a read-only NumPy array (little-endian), of
    the dtype sluice.Model.get_tensor gives (the package's one rule): BF16
    and F8_* without ml_dtypes raise NotImplementedError naming the tensor
    (name) and dtype, unless raw=True (their bits: uint16, uint8)."""
    npd = _np_dtype_checked(dtype, name, raw)
    if dtype in _PACKED:  # packed F4 / F6: the flat bytes
        return np.frombuffer(data, dtype=np.uint8)
    if dtype in _NP_DTYPES:
        npd = npd.newbyteorder("<")
    return np.frombuffer(data, dtype=npd).reshape(tuple(shape))


class Client:
    """A connection to a sluice serve server.

    addr: "host:port", or a replica set (a list of "IP:PORT", the same
    comma-separated, "dns:///NAME:PORT"; see the module's doc). failovers:
    how many times one call (get_bytes, get_tensor, stream) may be made
    again on another replica after UNAVAILABLE or a server's CANCELLED (None: 8 for a replica set,
    0 for one server). token: the shared token (or token_file). TLS:
    root_certificates (PEM bytes or a path) for the server's CA, and
    certificate_chain + private_key for a client certificate (mutual TLS);
    server_name overrides the name checked in the server's certificate.
    manifest: a manifest file the caller trusts for the model it reads (a
    sluice manifest, version 1 or 2, or a {name: sha256} object). Pass
    one: only then is the server a cache, not a point of trust. Its
    tensors are what is owed (GetModel must list exactly them, with its
    dtype, shape and nbytes where it gives them) and its digests replace
    GetModel's; without one, the server's own digests are the check, which
    catches corruption but not a server that lies. Every mismatch raises
    ChecksumError. chunk_bytes: 0 for the server's default (1 MiB).
    target: the gRPC target of the channel (a list of addresses in this
    client's own random order, see shuffled).
    """

    def __init__(self, addr, token=None, token_file=None, root_certificates=None,
                 certificate_chain=None, private_key=None, server_name=None,
                 manifest=None, chunk_bytes=0, timeout=300.0, failovers=None):
        def pem(x):
            if x is None or isinstance(x, bytes):
                return x
            with open(x, "rb") as f:
                return f.read()

        if token_file:  # the server's rule: ASCII whitespace off both ends
            with open(token_file, "rb") as f:
                token = f.read().strip(b" \t\r\n\v\f").decode("ascii")
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        addr, replicas = target_of(addr)
        addr = shuffled(addr)  # a list: this client's own order (see shuffled)
        self.target = addr
        # GetModel's reply grows with the model's tensor count: up to
        # MAX_REPLY_BYTES; the chunk calls keep 4 MiB (service_config).
        options = [("grpc.max_receive_message_length", MAX_REPLY_BYTES),
                   ("grpc.service_config", service_config(replicas))]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if root_certificates is not None and not server_name and addr.startswith(("ipv4:", "ipv6:")):
            # TLS checks the target's name, and a list of addresses has
            # none (gRPC would check the whole list as one name).
            raise ValueError("a list of servers over TLS needs server_name (the name in the "
                             "replicas' certificates)")
        self.failovers = failovers if failovers is not None else 8 if replicas else 0
        self.failovers_used = 0
        self._closed = False
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
            # "shape", "nbytes"}: those, when given, are checked too (the
            # right bytes under another dtype or shape are other values).
            return {k: (bytes.fromhex(v["digest"] if "digest" in v else v["sha256"]),
                        v.get("dtype"), v.get("shape"), v.get("nbytes"))
                    for k, v in doc.get("tensors", {}).items()}
        return {k: (bytes.fromhex(v), None, None, None) for k, v in doc.items()}

    def close(self):
        # A call that close() ends (CANCELLED, "Channel closed!") is the
        # caller's own cancel: never failed over (see _failover).
        self._closed = True
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
        """GetModel's answer (a ModelInfo message), cached per model. With a
        trusted manifest it must list exactly the manifest's tensors, each
        once, described as the manifest describes them: else ChecksumError
        (naming each difference), for this and every call that reads the
        model."""
        if model not in self._models:
            mi = self._stub.GetModel(pb.GetModelRequest(model=model), timeout=self._timeout,
                                     metadata=self._metadata)
            if self._trusted is not None:
                self._check_listing(model, mi)
            self._models[model] = mi
        return self._models[model]

    def _check_listing(self, model, mi):
        # What is owed is the trusted manifest's tensors, not the server's
        # list: a tensor left out of GetModel (and of the stream) would
        # otherwise pass unnoticed.
        problems, seen = [], set()
        for t in mi.tensors:
            if t.name in seen:
                problems.append("%s: listed twice" % t.name)
                continue
            seen.add(t.name)
            try:
                self._expected(t)
            except ChecksumError as e:
                problems.append(str(e))
        problems += ["%s: in the trusted manifest, not listed by GetModel" % k
                     for k in self._trusted if k not in seen]
        if problems:
            more = " and %d more" % (len(problems) - 8) if len(problems) > 8 else ""
            raise ChecksumError("model %s: GetModel does not match the trusted manifest (%d "
                                "tensors): %s%s" % (model, len(self._trusted),
                                                    "; ".join(problems[:8]), more))

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
            d, dtype, shape, nbytes = e
            if dtype is not None and t.dtype != dtype:
                raise ChecksumError("%s: dtype %s, trusted manifest %s" % (t.name, t.dtype, dtype))
            if shape is not None and list(t.shape) != list(shape):
                raise ChecksumError("%s: shape %s, trusted manifest %s"
                                    % (t.name, list(t.shape), list(shape)))
            if nbytes is not None and t.nbytes != nbytes:
                raise ChecksumError("%s: nbytes %d, trusted manifest %d"
                                    % (t.name, t.nbytes, nbytes))
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

    def _failover(self, err, what, used):
        """Whether a call that raised err may be made again on another
        replica: UNAVAILABLE (the server died, its connection broke, or its
        drain ended the call) or CANCELLED (by the server: its drain's
        grace ended, or --stall-timeout, e.g. a consumer slow between
        tensors; a CANCELLED after close(), the caller's own, is not
        retried). Anything else would be the same elsewhere, or says
        something is wrong.
        used: [failovers of this call so far], counted here; waits a
        backoff first (50 ms, doubling, at most 1 s)."""
        code = err.code() if callable(getattr(err, "code", None)) else None
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or \
                used[0] >= self.failovers or self._closed:
            return False
        time.sleep(min(1.0, 0.05 * 2 ** used[0]))
        if self._closed:  # closed during the backoff: its error is the result
            return False
        used[0] += 1
        self.failovers_used += 1
        _log.warning("failover %d/%d: %s: %s (%s); resuming on another replica", used[0],
                     self.failovers, what, code.name,
                     err.details() if hasattr(err, "details") else "")
        return True

    def _resumable(self, t):
        # A whole tensor whose digest will check every byte, whichever
        # replica sent it: resumed from its next chunk; anything else from
        # its start.
        if self._trusted is not None:
            return t.name in self._trusted
        return bool(t.sha256)

    def get_bytes(self, model, name, offset=None, length=None):
        """The raw bytes of a tensor, or of length bytes from offset (length
        0 or None: to the end). A whole tensor is checked against the
        manifest digest. A range has no manifest digest: with a trusted
        manifest the whole tensor is fetched, checked and sliced (a range
        is never taken on the server's word); without one, the range is
        checked against the server's digest of it (the transfer only) and
        its length against what was asked (nbytes - offset for length 0).
        The tensor must be listed by GetModel: its nbytes bounds what is
        read. On a replica set, a call that fails UNAVAILABLE (or CANCELLED
        by the server) is made again on another replica: a whole tensor from its next chunk, a range
        from its start."""
        ranged = offset is not None or length is not None
        t = self._tensor_info(model, name)
        if ranged and self._trusted is not None:
            if t is None:
                raise ChecksumError("%s: not listed by GetModel" % name)
            off, n = offset or 0, length or 0
            if off > t.nbytes or n > t.nbytes - off:
                raise ValueError("range [%d, +%d) is outside %s's %d bytes"
                                 % (off, n, name, t.nbytes))
            data = self.get_bytes(model, name)
            return data[off:off + n] if n else data[off:]
        if not ranged:
            return self._whole(model, name, t, b"", [0])
        off = offset or 0
        owed = t.nbytes if t is not None else None
        # A range outside the tensor is the server's INVALID_ARGUMENT;
        # chunks for one are owed nothing.
        if owed is not None:
            owed = (length if off + length <= owed else None) if length else \
                (owed - off if off <= owed else None)
        used = [0]
        while True:
            try:
                rx = self._get_call(model, name, t, off, length or 0, owed)
                break
            except grpc.RpcError as e:
                if not self._failover(e, "GetTensor %s (range)" % name, used):
                    raise
        data = bytes(rx.buf)
        if hashlib.sha256(data).digest() != rx.sent:
            raise ChecksumError("%s: range does not match the server's digest" % name)
        return data

    def _whole(self, model, name, t, have, used):
        """A whole tensor, verified; have: its first bytes, already received
        (a stream's, see stream()); a failover resumes after what came."""
        resumable = t is not None and self._resumable(t)
        while True:
            if have and len(have) == t.nbytes:  # every byte came, the last chunk did not
                self._check(t, have)
                return have
            part = []
            try:
                if have:
                    rx = self._get_call(model, name, t, len(have), t.nbytes - len(have),
                                        t.nbytes - len(have), part)
                else:
                    rx = self._get_call(model, name, t, None, None,
                                        t.nbytes if t is not None else None, part)
            except grpc.RpcError as e:
                if not self._failover(e, "GetTensor %s" % name, used):
                    raise
                have = have + b"".join(part) if resumable else b""
                continue
            piece = bytes(rx.buf)
            if have and hashlib.sha256(piece).digest() != rx.sent:
                raise ChecksumError("%s: the server's digest of the piece resumed at byte %d "
                                    "differs" % (name, len(have)))
            data = have + piece
            self._check(t, data)
            return data

    def _get_call(self, model, name, t, off, length, owed, part=None):
        """One GetTensor call (a range when off is not None); its _Receiver,
        complete. When it raises grpc.RpcError, the bytes received are
        appended to the list part (a failover resumes after them)."""
        req = pb.GetTensorRequest(model=model, name=name, chunk_bytes=self._chunk)
        if off is not None:
            req.range.offset = off
            req.range.length = length
        it = self._stub.GetTensor(req, timeout=self._timeout, metadata=self._metadata)
        rx = None
        try:
            # Read to the call's end: a chunk after the last one is an error,
            # and so is a stream that ends before it.
            for c in it:
                if rx is None:
                    if t is None:
                        raise ChecksumError("%s: not listed by GetModel" % name)
                    if owed is None:
                        raise ChecksumError("%s: chunks for a range outside its %d bytes"
                                            % (name, t.nbytes))
                    rx = _Receiver(name, off or 0, owed)
                elif rx.sent is not None:
                    raise ChecksumError("%s: a chunk after the last one" % name)
                rx.add(c)
        except grpc.RpcError:
            if part is not None and rx is not None:
                part.append(bytes(rx.buf))
            raise
        finally:
            it.cancel()  # stops the server at once when a check raised; else a no-op
        if rx is None or rx.sent is None:
            raise ChecksumError("%s: the stream ended without its last chunk" % name)
        return rx

    def get_tensor(self, model, name, raw=False):
        """One tensor as a NumPy array, verified against the manifest digest.
        BF16/F8_* without ml_dtypes raise NotImplementedError before it is
        fetched, unless raw=True (its bits; see the module's "Dtypes")."""
        t = self._tensor_info(model, name)
        _check_dtype(t.dtype, t.name, "np", raw)
        data = self.get_bytes(model, name)
        return to_array(data, t.dtype, t.shape, t.name, raw)

    def stream(self, model, names=None, raw=False):
        """Yields (name, array) (or (name, bytes) with raw=True) for the
        listed tensors (None: all), each verified, in delivery order. Without
        raw, a BF16/F8_* tensor NumPy cannot represent (no ml_dtypes) raises
        NotImplementedError naming it before the stream starts. On a
        replica set, a call that fails UNAVAILABLE (or CANCELLED by the
        server) is resumed on another replica: the tensor in flight from its next chunk, then one
        StreamTensors call for the tensors still owed (several, one after
        another, when their names take more than MAX_STREAM_REQUEST_BYTES;
        so are the names given)."""
        tensors = self.model(model).tensors
        info = {t.name: t for t in tensors}
        names = list(names or [])
        # What the server owes, in order (the proto: the names as given, or
        # every tensor in the model's order): a stream that ends early with
        # status OK, or skips or swaps a tensor, raises.
        # With a trusted manifest, model() has checked that the server lists
        # exactly the manifest's tensors, so "every tensor" is the manifest's.
        owed = names or [t.name for t in tensors]
        if not raw:  # a dtype NumPy cannot represent: refused before any byte moves
            for n in owed:
                if n in info:
                    _check_dtype(info[n].dtype, n, "np", False)
        # Names asked for (the caller's, or after a failover the tensors
        # still owed) go in requests of at most MAX_STREAM_REQUEST_BYTES
        # each, one call after another: a resume of a model with many
        # tensors would else exceed the server's --max-request-bytes.
        # [] asks for every tensor (one call).
        ask, done, used = names, 0, [0]
        while True:
            batch = _first_batch(ask)
            end = done + len(batch) if batch else len(owed)  # this call owes owed[done:end]
            req = pb.StreamTensorsRequest(model=model, names=batch, chunk_bytes=self._chunk)
            it = self._stub.StreamTensors(req, timeout=self._timeout, metadata=self._metadata)
            rx, failed = None, None
            try:
                for c in it:
                    if rx is None:
                        if done >= end or c.name != owed[done]:
                            raise ChecksumError("%s: not the tensor expected next (%s)"
                                                % (c.name, owed[done] if done < end
                                                   else "none"))
                        t = info.get(c.name)
                        if t is None:
                            raise ChecksumError("%s: not listed by GetModel" % c.name)
                        rx = _Receiver(c.name, 0, t.nbytes)
                    elif c.name != rx.name:
                        raise ChecksumError("%s: next tensor before the last chunk" % rx.name)
                    if rx.add(c):
                        data = bytes(rx.buf)
                        rx = None
                        self._check(t, data)
                        yield t.name, (data if raw else to_array(data, t.dtype, t.shape, t.name))
                        done += 1
            except grpc.RpcError as e:
                if not self._failover(e, "StreamTensors of %s" % model, used):
                    raise
                failed = e
            finally:
                # The caller stopped early, or a check raised: end the call.
                it.cancel()
            if failed is None:
                if rx is not None or done < end or end == len(owed):
                    break
                ask = owed[done:]  # the next batch
                continue
            if rx is not None:  # the tensor in flight: the rest of it
                data = self._whole(model, rx.name, t,
                                   bytes(rx.buf) if self._resumable(t) else b"", used)
                rx = None
                yield t.name, (data if raw else to_array(data, t.dtype, t.shape, t.name))
                done += 1
            ask = owed[done:]
            if not ask:
                return
        if rx is not None:
            raise ChecksumError("%s: the stream ended before its last chunk" % rx.name)
        if done < len(owed):
            raise ChecksumError("%s: the stream ended before it (%d of %d tensors)"
                                % (owed[done], done, len(owed)))


class _Receiver:
    """One tensor's (or range's) chunks, checked as each arrives: in order,
    every total_bytes equal to what is owed, never a byte past it. A
    server that sends more is stopped at that chunk, so the client buffers
    at most what is owed plus one message (4 MiB at most: the chunk calls'
    receive limit, MAX_CHUNK_MESSAGE_BYTES)."""

    def __init__(self, name, base, owed):
        self.name, self.base, self.owed = name, base, owed
        self.buf = bytearray()
        self.sent = None  # the server's digest, from the last chunk

    def add(self, c):
        """Takes chunk c; True when it was the last one."""
        if c.name != self.name:
            raise ChecksumError("%s: a chunk of %s among its chunks" % (self.name, c.name))
        if c.offset != self.base + len(self.buf):
            raise ChecksumError("%s: chunk out of order (offset %d, %d expected)"
                                % (self.name, c.offset, self.base + len(self.buf)))
        if c.total_bytes != self.owed:
            raise ChecksumError("%s: a chunk gives total_bytes %d, %d owed"
                                % (self.name, c.total_bytes, self.owed))
        if len(c.data) > self.owed - len(self.buf):
            raise ChecksumError("%s: more than the %d bytes owed (%d received, %d more sent)"
                                % (self.name, self.owed, len(self.buf), len(c.data)))
        self.buf += c.data
        if not c.last:
            return False
        if len(self.buf) != self.owed:
            raise ChecksumError("%s: %d bytes received, %d owed"
                                % (self.name, len(self.buf), self.owed))
        self.sent = bytes(c.sha256)
        return True
