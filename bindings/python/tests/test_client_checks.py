"""The Python client's own checks against a server that lies or stops short:
a fake TensorService in this process (grpc's Python server on 127.0.0.1,
a free port, stopped at the end), so each check is shown to fail the call
whatever the real server does. Needs no build; the cases of the C++ client
(examples/serve_client.cc, the same checks) run the one in SLUICE_BUILD and
skip when it is not built."""
import hashlib
import json
import os
import subprocess
import threading

import pytest

grpc = pytest.importorskip("grpc", reason="python3-grpcio is not installed")
pytest.importorskip("grpc_tools", reason="python3-grpc-tools is not installed")

from conftest import serve_fake
from sluice.client import ChecksumError, Client, pb, pb_grpc

A = bytes(range(64))
B = bytes(range(100, 164))
C = bytes(range(200, 232))
REAL = {"a": A, "b": B, "c": C}


def sha(b):
    return hashlib.sha256(b).digest()


class Fake(pb_grpc.TensorServiceServicer):
    """Serves model "m" (tensors a, b, c); `data` is what it sends and
    `digests` what GetModel says; `listed` the tensors GetModel lists (and
    StreamTensors sends when asked for all); `stop_after` ends a stream
    (status OK) after that many chunks; `split` sends each tensor as two
    chunks; `short` cuts what GetTensor sends to that many bytes (the
    digest and, unless `total` says otherwise, total_bytes of what it
    sends); `flood` {name: bytes} sends that many bytes of 64 KiB chunks
    for the tensor, counted in `sent`, the handler's end in `done`;
    `streamed` what StreamTensors sends when asked for all (None: `listed`);
    `range_lie` answers every range with zeros and their own digest."""

    def __init__(self):
        self.data = dict(REAL)
        self.digests = {k: sha(v) for k, v in REAL.items()}
        self.listed = list(REAL)
        self.stop_after = None
        self.split = True
        self.meta = {}  # name: (dtype, shape) GetModel says instead
        self.nbytes = {}  # name: nbytes GetModel says instead
        self.short = None
        self.total = None
        self.flood = {}
        self.streamed = None
        self.range_lie = False
        self.sent = 0
        self.done = threading.Event()

    def GetModel(self, req, ctx):
        mi = pb.ModelInfo(name="m")
        for i, k in enumerate(self.listed):
            v = self.data[k]
            dtype, shape = self.meta.get(k, ("U8", [len(v)]))
            mi.tensors.add(name=k, dtype=dtype, shape=shape, nbytes=self.nbytes.get(k, len(v)),
                           index=i, sha256=self.digests.get(k, b""))
        return mi

    def _chunks(self, name, off, length):
        if name in self.flood:
            yield from self._flood(name, self.flood[name])
            return
        d = self.data[name][off:off + length]
        if self.short is not None:
            d = d[:self.short]
        parts = [d[:len(d) // 2], d[len(d) // 2:]] if self.split else [d]
        pos = off
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            yield pb.TensorChunk(name=name, offset=pos, data=p,
                                 total_bytes=len(d) if self.total is None else self.total,
                                 last=last, sha256=sha(d) if last else b"")
            pos += len(p)

    def _flood(self, name, n):
        step = 64 << 10
        try:
            for pos in range(0, n, step):
                self.sent += step
                yield pb.TensorChunk(name=name, offset=pos, data=bytes(step),
                                     total_bytes=self.total or n, last=pos + step >= n)
        finally:
            self.done.set()

    def _limited(self, gen):
        for n, c in enumerate(gen):
            if self.stop_after is not None and n >= self.stop_after:
                return
            yield c

    def GetTensor(self, req, ctx):
        n = len(self.data[req.name])
        off, length = (req.range.offset, req.range.length) if req.HasField("range") else (0, n)
        if self.range_lie and req.HasField("range"):
            d = bytes(length or n - off)
            yield pb.TensorChunk(name=req.name, offset=off, data=d, total_bytes=len(d), last=True,
                                 sha256=sha(d))
            return
        yield from self._limited(self._chunks(req.name, off, length or n - off))

    def StreamTensors(self, req, ctx):
        names = list(req.names) or list(self.streamed or self.listed)
        yield from self._limited(c for k in names for c in self._chunks(k, 0, len(self.data[k])))


@pytest.fixture
def fake():
    yield from serve_fake(Fake())


@pytest.fixture
def trusted(tmp_path):
    p = tmp_path / "trusted.json"
    p.write_text(json.dumps({k: sha(v).hex() for k, v in REAL.items()}))
    return str(p)


def test_honest_fake_passes(fake, trusted):
    for manifest in (None, trusted):
        with Client(fake.addr, manifest=manifest) as c:
            assert c.get_bytes("m", "a") == A
            assert c.get_bytes("m", "b", 10, 20) == B[10:30]
            assert dict(c.stream("m", raw=True)) == REAL
            assert dict(c.stream("m", ["b", "a"], raw=True)) == {"a": A, "b": B}


def test_wrong_bytes_with_matching_digests_caught_by_trusted_manifest(fake, trusted):
    # The server sends other bytes and vouches for them: only the trusted
    # manifest can tell.
    fake.data["a"] = B
    fake.digests["a"] = sha(B)
    with Client(fake.addr, manifest=trusted) as c:
        with pytest.raises(ChecksumError, match="a"):
            c.get_bytes("m", "a")
        with pytest.raises(ChecksumError, match="a"):
            list(c.stream("m", ["a"]))


def test_wrong_bytes_caught_by_getmodel_digest(fake):
    fake.data["a"] = B
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="a"):
            c.get_bytes("m", "a")
        with pytest.raises(ChecksumError, match="a"):
            list(c.stream("m", ["a"]))


def test_range_checked_against_trusted_manifest(fake, trusted):
    # A range's digest comes from the server: with a trusted manifest the
    # client must not take a range on the server's word.
    fake.data["a"] = B
    with Client(fake.addr, manifest=trusted) as c:
        with pytest.raises(ChecksumError, match="a"):
            c.get_bytes("m", "a", 8, 16)
        with pytest.raises(ValueError):
            c.get_bytes("m", "a", len(A) + 1, 0)


def test_missing_digest_raises(fake):
    del fake.digests["a"]
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="no manifest digest"):
            c.get_bytes("m", "a")
        with pytest.raises(ChecksumError, match="no manifest digest"):
            list(c.stream("m", ["a"]))


def test_stream_ending_mid_tensor_raises(fake):
    fake.stop_after = 3  # a's two chunks, then b's first: status OK
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="b"):
            list(c.stream("m", raw=True))


def test_stream_missing_a_tensor_raises(fake):
    fake.stop_after = 2  # a whole, b never sent: status OK
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="b"):
            list(c.stream("m", ["a", "b"], raw=True))
        with pytest.raises(ChecksumError, match="b"):
            list(c.stream("m", raw=True))


def test_get_ending_early_raises(fake):
    fake.stop_after = 1
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError):
            c.get_bytes("m", "a")


def test_dtype_and_shape_checked_against_trusted_manifest(fake, tmp_path):
    # The right bytes under another dtype or shape are other values: a
    # trusted manifest that gives dtype and shape (version 2) is the word.
    doc = {"format": "sluice-manifest", "version": 2, "algorithm": "sha256",
           "tensors": {k: {"digest": sha(v).hex(), "dtype": "U8", "shape": [len(v)],
                           "nbytes": len(v)} for k, v in REAL.items()}}
    p = tmp_path / "trusted2.json"
    p.write_text(json.dumps(doc))
    fake.meta = {"a": ("I8", [64]), "b": ("U8", [8, 8])}
    with Client(fake.addr, manifest=str(p)) as c:
        with pytest.raises(ChecksumError, match="dtype"):
            c.get_tensor("m", "a")
        with pytest.raises(ChecksumError, match="shape"):
            c.get_tensor("m", "b")
        with pytest.raises(ChecksumError, match="dtype"):
            list(c.stream("m"))


def manifest_v2(tmp_path, tensors=REAL):
    doc = {"format": "sluice-manifest", "version": 2, "algorithm": "sha256",
           "tensors": {k: {"digest": sha(v).hex(), "dtype": "U8", "shape": [len(v)],
                           "nbytes": len(v)} for k, v in tensors.items()}}
    p = tmp_path / "trusted2.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_trusted_manifest_owes_its_tensors(fake, trusted, tmp_path):
    # Issue 25 item 6: the manifest lists a, b, c; a server that leaves b
    # out of GetModel and of the stream must not pass for the whole model.
    fake.listed = ["a", "c"]
    for manifest in (trusted, manifest_v2(tmp_path)):
        with Client(fake.addr, manifest=manifest) as c:
            with pytest.raises(ChecksumError, match="b"):
                list(c.stream("m", raw=True))
            with pytest.raises(ChecksumError, match="b"):
                c.model("m")
            with pytest.raises(ChecksumError, match="b"):
                c.get_bytes("m", "a")
    # Without a trusted manifest the server's listing is the word.
    with Client(fake.addr) as c:
        assert dict(c.stream("m", raw=True)) == {"a": A, "c": C}


def test_trusted_manifest_refuses_extra_or_redescribed_tensors(fake, trusted, tmp_path):
    fake.data["d"] = bytes(8)
    fake.digests["d"] = sha(bytes(8))
    fake.listed = ["a", "b", "c", "d"]
    with Client(fake.addr, manifest=trusted) as c:
        with pytest.raises(ChecksumError, match="d"):
            list(c.stream("m", raw=True))
    fake.listed = ["a", "b", "c", "c"]
    with Client(fake.addr, manifest=trusted) as c:
        with pytest.raises(ChecksumError, match="twice"):
            list(c.stream("m", raw=True))
    fake.listed = list(REAL)
    fake.nbytes = {"c": 16}
    with Client(fake.addr, manifest=manifest_v2(tmp_path)) as c:
        with pytest.raises(ChecksumError, match="nbytes"):
            list(c.stream("m", raw=True))
    fake.nbytes = {}
    fake.meta = {"c": ("U8", [4, 8])}
    with Client(fake.addr, manifest=manifest_v2(tmp_path)) as c:
        with pytest.raises(ChecksumError, match="shape"):
            c.get_tensor("m", "a")


def test_short_range_raises(fake):
    # Issue 25 item 7: 40 bytes asked, 5 sent with the digest of those 5.
    fake.short = 5
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="a"):
            c.get_bytes("m", "a", 8, 40)
        with pytest.raises(ChecksumError, match="a"):
            c.get_bytes("m", "a", 8, 0)  # to the end: 56 owed
    # The chunks say 40 (what was asked) and bring 5.
    fake.total = 40
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="a"):
            c.get_bytes("m", "a", 8, 40)
    # total_bytes that disagree with the range asked, bytes in full.
    fake.short, fake.total = None, 41
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="total_bytes"):
            c.get_bytes("m", "a", 8, 40)


FLOOD = 300 << 20


@pytest.mark.parametrize("call", ["get", "stream"])
@pytest.mark.parametrize("total", [None, 64])
def test_flood_stops_at_nbytes(fake, call, total):
    # Issue 25 item 8: 300 MiB of chunks for a 64-byte tensor (total_bytes
    # saying 300 MiB, or 64 like GetModel's nbytes). The client must stop
    # at the first chunk past what is owed, not buffer the flood: the fake
    # counts what it handed to gRPC before the client cancelled; what can
    # be in flight is the HTTP/2 windows, a few MiB.
    fake.flood = {"a": FLOOD}
    fake.total = total
    with Client(fake.addr) as c:
        with pytest.raises(ChecksumError, match="a"):
            if call == "get":
                c.get_bytes("m", "a")
            else:
                list(c.stream("m", raw=True))
    assert fake.done.wait(30), "the fake's handler did not end"
    assert fake.sent < 32 << 20, "the fake sent %d bytes before the client stopped" % fake.sent


SERVE_CLIENT = os.path.join(os.environ.get("SLUICE_BUILD", "build"), "serve_client")


def serve_client(*args):
    if not os.access(SERVE_CLIENT, os.X_OK):
        pytest.skip("%s is not built (grpc++ missing or another build directory)" % SERVE_CLIENT)
    return subprocess.run([SERVE_CLIENT, *args], timeout=120, capture_output=True, text=True)


def test_cpp_client_owes_the_manifest_and_the_range(fake, trusted):
    # The C++ client with --manifest: b left out of GetModel and the stream
    # is a mismatch (exit 1), named; a range cut short is DATA_LOSS (115).
    fake.listed = ["a", "c"]
    for how in ([], ["--stream"]):
        r = serve_client(fake.addr, "fetch", "m", "--manifest", trusted, "-q", *how)
        assert r.returncode == 1, r.stderr
        assert "MISMATCH b: in the trusted manifest, not listed by GetModel" in r.stderr
    r = serve_client(fake.addr, "fetch", "m", "-q")
    assert r.returncode == 0, r.stderr  # no manifest: the server's list is the word
    fake.listed = list(REAL)
    assert serve_client(fake.addr, "fetch", "m", "--manifest", trusted, "-q").returncode == 0
    fake.short = 5
    r = serve_client(fake.addr, "get", "m", "a", "--offset", "8", "--length", "40")
    assert r.returncode == 115 and "total_bytes" in r.stderr, r.stderr
    fake.total = 40  # the chunks say what was asked and bring 5
    r = serve_client(fake.addr, "get", "m", "a", "--offset", "8", "--length", "40")
    assert r.returncode == 115 and "fewer bytes than owed" in r.stderr, r.stderr


def test_cpp_client_owes_each_tensor_once_in_order(fake, trusted):
    # GetModel lists a, b, c; the stream sends a, a, c: as many tensors as
    # owed, each verified, and b never came. Counting them is not enough.
    fake.streamed = ["a", "a", "c"]
    for manifest in ([], ["--manifest", trusted]):
        r = serve_client(fake.addr, "fetch", "m", "--stream", "-q", *manifest)
        assert r.returncode == 1, r.stderr
        assert "MISMATCH a: not the tensor expected next (b)" in r.stderr, r.stderr
    fake.streamed = ["a", "b", "c", "a"]  # all owed, then one more
    r = serve_client(fake.addr, "fetch", "m", "--stream", "-q", "--manifest", trusted)
    assert r.returncode == 1 and "not the tensor expected next" in r.stderr, r.stderr
    fake.streamed = ["b", "a", "c"]  # another order than the model's
    r = serve_client(fake.addr, "fetch", "m", "--stream", "-q", "--manifest", trusted)
    assert r.returncode == 1 and "MISMATCH b: not the tensor expected next (a)" in r.stderr, r.stderr
    fake.streamed = None
    assert serve_client(fake.addr, "fetch", "m", "--stream", "-q", "--manifest", trusted).returncode == 0


def test_cpp_client_ranges_are_the_verified_bytes(fake, trusted):
    # fetch --ranges: each range must be the bytes of the whole tensor just
    # verified, not whatever the server sends with a digest of its own.
    fake.range_lie = True
    for manifest in ([], ["--manifest", trusted]):
        r = serve_client(fake.addr, "fetch", "m", "--ranges", "-q", *manifest)
        assert r.returncode == 1, r.stderr
        assert "MISMATCH a: range 0+32" in r.stderr, r.stderr
    fake.range_lie = False
    assert serve_client(fake.addr, "fetch", "m", "--ranges", "-q", "--manifest", trusted).returncode == 0


def test_cpp_client_answer_owed_a_refusal_is_a_mismatch(fake, trusted):
    # A tensor GetModel does not list (and the manifest has not), or a range
    # outside the tensor: the server owes NOT_FOUND / INVALID_ARGUMENT; an
    # empty answer with status OK has nothing to be verified against.
    fake.data["zz"] = b""
    for manifest in ([], ["--manifest", trusted]):
        r = serve_client(fake.addr, "get", "m", "zz", *manifest)
        assert r.returncode == 1 and "MISMATCH zz: not listed by GetModel" in r.stderr, r.stderr
    r = serve_client(fake.addr, "get", "m", "a", "--offset", "100", "--length", "0")
    assert r.returncode == 1 and "the range is outside the tensor" in r.stderr, r.stderr
    r = serve_client(fake.addr, "get", "m", "a", "--offset", "64", "--length", "0")
    assert r.returncode == 0, r.stderr  # the empty range at the end is in bounds


@pytest.mark.parametrize("call", ["get", "stream"])
def test_cpp_client_flood_stops_at_nbytes(fake, call):
    fake.flood = {"a": FLOOD}
    fake.total = 64
    args = ["get", "m", "a"] if call == "get" else ["fetch", "m", "--stream"]
    r = serve_client(fake.addr, *args)
    assert r.returncode == (115 if call == "get" else 1), r.stderr
    assert "more bytes than" in r.stderr, r.stderr
    assert fake.done.wait(30), "the fake's handler did not end"
    assert fake.sent < 32 << 20, "the fake sent %d bytes before the client stopped" % fake.sent


def test_bf16_f8_raise_unless_raw(fake, monkeypatch):
    """BF16/F8 without ml_dtypes: the client gives them as the package does
    (sluice._np_dtype_checked, one rule): NotImplementedError naming the
    tensor and dtype before any byte is fetched, unless raw=True (issue
    38, item 4)."""
    import numpy as np
    import sluice
    from sluice.client import to_array
    monkeypatch.setattr(sluice, "_ml_dtypes", None)  # as on Debian
    fake.meta = {"a": ("BF16", [32]), "b": ("F8_E4M3", [8, 8])}
    with Client(fake.addr) as c:
        with pytest.raises(NotImplementedError, match="'a' is BF16"):
            c.get_tensor("m", "a")
        with pytest.raises(NotImplementedError, match="'b' is F8_E4M3"):
            c.get_tensor("m", "b")
        a = c.get_tensor("m", "a", raw=True)
        assert a.dtype == np.uint16 and a.shape == (32,) and a.tobytes() == A
        b = c.get_tensor("m", "b", raw=True)
        assert b.dtype == np.uint8 and b.shape == (8, 8) and b.tobytes() == B
        with pytest.raises(NotImplementedError, match="'a' is BF16"):
            list(c.stream("m"))
        assert dict(c.stream("m", raw=True)) == REAL  # raw: the bytes
        assert c.get_tensor("m", "c").dtype == np.uint8  # U8 as ever
    with pytest.raises(NotImplementedError, match="'w' is F8_E5M2"):
        to_array(bytes(4), "F8_E5M2", [4], "w")
    assert to_array(bytes(4), "BF16", [2], "w", raw=True).dtype == np.uint16
