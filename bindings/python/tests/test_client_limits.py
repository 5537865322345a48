"""The Python client's message limits against a model with many tensors: a
fake TensorService in this process (grpc's Python server on 127.0.0.1, a
free port, stopped at the end) whose GetModel lists 30,000 tensors with
100-byte names (a reply of some 4.5 MB, over gRPC's default 4 MiB receive
limit) and that takes requests of at most 1 MiB, as `sluice serve`'s
default --max-request-bytes. Needs no build."""
import hashlib
import os
import subprocess

import pytest

grpc = pytest.importorskip("grpc", reason="python3-grpcio is not installed")
pytest.importorskip("grpc_tools", reason="python3-grpc-tools is not installed")

from conftest import serve_fake
from sluice.client import Client, pb, pb_grpc

COUNT = 30000


def tname(i):
    return ("layers.%06d." % i).ljust(100, "w")


def tdata(i):
    return i.to_bytes(4, "little")


class Many(pb_grpc.TensorServiceServicer):
    """Model "m": COUNT tensors of 4 bytes. `drop_after`: a StreamTensors
    call asked for every tensor ends UNAVAILABLE after that many; `calls`
    the number of names of each StreamTensors request; `big` a GetTensor
    of tensor 0 sends one 5 MiB chunk."""

    def __init__(self):
        self.drop_after = None
        self.calls = []
        self.big = False

    def GetModel(self, req, ctx):
        mi = pb.ModelInfo(name="m")
        for i in range(COUNT):
            d = tdata(i)
            mi.tensors.add(name=tname(i), dtype="U8", shape=[4], nbytes=4, index=i,
                           sha256=hashlib.sha256(d).digest())
        return mi

    def _chunk(self, i):
        d = tdata(i)
        return pb.TensorChunk(name=tname(i), index=i, offset=0, data=d, total_bytes=4,
                              last=True, sha256=hashlib.sha256(d).digest())

    def GetTensor(self, req, ctx):
        if self.big:
            yield pb.TensorChunk(name=req.name, offset=0, data=bytes(5 << 20),
                                 total_bytes=4, last=True)
            return
        yield self._chunk(int(req.name[7:13]))

    def StreamTensors(self, req, ctx):
        self.calls.append(len(req.names))
        if req.names:
            for n in req.names:
                yield self._chunk(int(n[7:13]))
            return
        for i in range(COUNT):
            if self.drop_after is not None and i == self.drop_after:
                ctx.abort(grpc.StatusCode.UNAVAILABLE, "the fake drops the stream")
            yield self._chunk(i)


@pytest.fixture
def many():
    yield from serve_fake(Many(), [("grpc.max_receive_message_length", 1 << 20)])


def test_getmodel_of_30000_tensors_lists(many):
    with Client(many.addr) as c:
        mi = c.model("m")
        assert len(mi.tensors) == COUNT and mi.ByteSize() > 4 << 20
        assert c.get_bytes("m", tname(29999)) == tdata(29999)
        got = [(n, bytes(a)) for n, a in c.stream("m", [tname(i) for i in (0, 7, 29999)],
                                                   raw=True)]
        assert got == [(tname(i), tdata(i)) for i in (0, 7, 29999)]


def test_names_past_max_request_bytes_split(many):
    # 12,000 names of 100 bytes: 1.3 MB, over the server's 1 MiB; the
    # client asks in calls of at most 512 KiB of names, in order.
    want = list(range(0, 24000, 2))
    with Client(many.addr) as c:
        got = [n for n, _ in c.stream("m", [tname(i) for i in want], raw=True)]
    assert got == [tname(i) for i in want]
    assert len(many.calls) == 3 and sum(many.calls) == len(want)


def test_resume_of_30000_tensors_splits(many):
    # The stream of every tensor drops after 2: the resume names the
    # 29,998 still owed (3.2 MB), in several calls; the caller reads a few.
    many.drop_after = 2
    with Client(many.addr, failovers=1) as c:
        it = c.stream("m", raw=True)
        got = [next(it) for _ in range(5)]
        it.close()
        assert c.failovers_used == 1
    assert got == [(tname(i), tdata(i)) for i in range(5)]
    assert many.calls[0] == 0 and 0 < many.calls[1] < 29998


def test_chunk_messages_stay_bounded(many):
    # The larger receive limit is GetModel's: a chunk call still refuses a
    # message over 4 MiB before the client buffers it.
    many.big = True
    with Client(many.addr) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.get_bytes("m", tname(0))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


SERVE_CLIENT = os.path.join(os.environ.get("SLUICE_BUILD", "build"), "serve_client")


def serve_client(*args):
    if not os.access(SERVE_CLIENT, os.X_OK):
        pytest.skip("%s is not built (grpc++ missing or another build directory)" % SERVE_CLIENT)
    return subprocess.run([SERVE_CLIENT, *args], timeout=120, capture_output=True, text=True)


def test_cpp_client_lists_and_resumes_30000_tensors(many):
    # The C++ client (examples/serve_client.cc): GetModel's 5 MB reply
    # lists; a stream of every tensor dropped after 2 resumes with the
    # 29,998 names still owed in several calls, each under 1 MiB.
    r = serve_client(many.addr, "info", "m")
    assert r.returncode == 0 and tname(29999) in r.stdout, r.stderr
    r = serve_client(many.addr, "get", "m", tname(12345))
    assert r.returncode == 0, r.stderr
    many.drop_after = 2
    r = serve_client(many.addr, "fetch", "m", "--stream", "-q", "--failovers", "1")
    assert r.returncode == 0, r.stderr
    assert many.calls[0] == 0 and len(many.calls) > 2 and sum(many.calls) == COUNT - 2
    many.big = True  # a chunk call still refuses a message over 4 MiB
    r = serve_client(many.addr, "get", "m", tname(0))
    assert r.returncode == 100 + grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], r.stderr
