"""Failover of the Python client over a replica set, against fake replicas
in this process (grpc's Python server on 127.0.0.1, free ports, stopped at
the end): a replica that fails a call UNAVAILABLE after some chunks (a
death the test places exactly), one that lies in the piece it resumes.
The real servers, killed and stopped mid-stream, are in test_replicas.py."""
import hashlib
import os
import subprocess
import threading
import time
from concurrent import futures

import grpc
import pytest

from sluice_serve import ChecksumError, Client, pb, pb_grpc, target_of

TENSORS = {"a": bytes(range(64)), "b": bytes(range(100, 164)), "c": bytes(range(200, 232))}
STEP = 16  # bytes a chunk


def sha(b):
    return hashlib.sha256(b).digest()


class Plan:
    """Shared by the replicas: the call that sends the kill_after-th chunk
    (counted over every call of every replica) fails UNAVAILABLE right
    after it, once (every time with again); lie: a range from a non-zero
    offset (a resumed piece) is answered with flipped bytes and their own
    digest; calls: what each replica was asked, in order."""

    def __init__(self, kill_after=None, again=False, lie=False):
        self.kill_after, self.again, self.lie = kill_after, again, lie
        self.code = grpc.StatusCode.UNAVAILABLE  # what the dying call ends with
        self.sent = 0
        self.calls = []


class Replica(pb_grpc.TensorServiceServicer):
    def __init__(self, plan, tag):
        self.plan, self.tag = plan, tag

    def GetModel(self, req, ctx):
        mi = pb.ModelInfo(name="m")
        for i, (k, v) in enumerate(TENSORS.items()):
            mi.tensors.add(name=k, dtype="U8", shape=[len(v)], nbytes=len(v), index=i,
                           sha256=sha(v))
        return mi

    def _chunks(self, ctx, name, off, n, ranged):
        d = TENSORS[name][off:off + n]
        if self.plan.lie and ranged and off > 0:
            d = bytes(x ^ 0xFF for x in d)
        for pos in range(0, len(d), STEP):
            yield pb.TensorChunk(name=name, offset=off + pos, data=d[pos:pos + STEP],
                                 total_bytes=len(d), last=pos + STEP >= len(d),
                                 sha256=sha(d) if pos + STEP >= len(d) else b"")
            p = self.plan
            p.sent += 1
            if p.kill_after is not None and p.sent >= p.kill_after:
                if not p.again:
                    p.kill_after = None
                else:
                    p.sent = 0
                ctx.abort(p.code, "replica %s going away" % self.tag)

    def GetTensor(self, req, ctx):
        n = len(TENSORS[req.name])
        ranged = req.HasField("range")
        off, length = (req.range.offset, req.range.length) if ranged else (0, n)
        self.plan.calls.append((self.tag, "GetTensor", req.name, off, length if ranged else None))
        yield from self._chunks(ctx, req.name, off, length or n - off, ranged)

    def StreamTensors(self, req, ctx):
        self.plan.calls.append((self.tag, "StreamTensors", list(req.names)))
        for k in list(req.names) or list(TENSORS):
            yield from self._chunks(ctx, k, 0, len(TENSORS[k]), False)


@pytest.fixture
def replicas():
    """Two fake replicas of model "m"; yields (plan, [addr, addr])."""
    plan = Plan()
    servers, addrs = [], []
    for tag in "AB":
        s = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_TensorServiceServicer_to_server(Replica(plan, tag), s)
        addrs.append("127.0.0.1:%d" % s.add_insecure_port("127.0.0.1:0"))
        s.start()
        servers.append(s)
    yield plan, addrs
    for s in servers:
        s.stop(grace=None)


def test_target_of():
    assert target_of("127.0.0.1:7070") == ("127.0.0.1:7070", False)
    assert target_of("h.example:7070") == ("h.example:7070", False)
    assert target_of("127.0.0.1:1,127.0.0.2:2") == ("ipv4:127.0.0.1:1,127.0.0.2:2", True)
    assert target_of(["127.0.0.1:1"]) == ("ipv4:127.0.0.1:1", True)
    assert target_of(["[::1]:1", "[::1]:2"]) == ("ipv6:[::1]:1,[::1]:2", True)
    assert target_of("dns:///svc.example:7070") == ("dns:///svc.example:7070", True)
    for bad in ("localhost:1,127.0.0.1:2", "127.0.0.1:1,[::1]:2", "127.0.0.1,127.0.0.2:2",
                "127.0.0.1:0,127.0.0.1:2", []):
        with pytest.raises(ValueError):
            target_of(bad)


def test_replica_list_shuffled_per_client():
    # Issue 36 item 10: each client begins its rotation on a replica of
    # its own drawing. shuffled() with a seeded generator is a
    # permutation; a dns: target and one server are left as they are.
    import random

    from sluice_serve import shuffled
    addrs = ["127.0.0.1:%d" % p for p in range(1, 7)]
    got = shuffled("ipv4:" + ",".join(addrs), random.Random(7))
    assert got.startswith("ipv4:") and sorted(got[5:].split(",")) == sorted(addrs)
    assert shuffled("dns:///svc.example:7070") == "dns:///svc.example:7070"
    assert shuffled("127.0.0.1:1") == "127.0.0.1:1"
    # Clients draw from the system's source: 30 clients of 3 replicas
    # all starting on the same one (before: all did, the list's order)
    # has probability 3 x (1/3)^30 < 1e-13 with the fix.
    firsts = set()
    for _ in range(30):
        c = Client("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        assert sorted(c.target[5:].split(",")) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        firsts.add(c.target[5:].split(",")[0])
        c.close()
    assert len(firsts) > 1


def test_list_over_tls_needs_server_name():
    # TLS checks the target's name; a list of addresses has none.
    with pytest.raises(ValueError):
        Client("127.0.0.1:1,127.0.0.1:2", root_certificates=b"PEM")
    Client("127.0.0.1:1,127.0.0.1:2", root_certificates=b"PEM", server_name="replica").close()


@pytest.mark.parametrize("trust", [False, True])
def test_stream_resumes_from_the_next_chunk(replicas, trust, tmp_path):
    plan, addrs = replicas
    manifest = None
    if trust:
        manifest = tmp_path / "m.json"
        manifest.write_text("{%s}" % ",".join('"%s": "%s"' % (k, sha(v).hex())
                                             for k, v in TENSORS.items()))
    plan.kill_after = 5  # a: 4 chunks; b's first one, then the replica dies
    with Client(addrs, manifest=manifest and str(manifest)) as c:
        got = dict(c.stream("m", raw=True))
        assert got == TENSORS
        assert c.failovers_used == 1
    asks = [k[1:] for k in plan.calls]
    # The rest of b from byte 16 (as a range), then a stream of c alone.
    assert asks == [("StreamTensors", []), ("GetTensor", "b", 16, 48), ("StreamTensors", ["c"])]


def test_stream_resumes_from_the_next_tensor(replicas):
    plan, addrs = replicas
    plan.kill_after = 8  # a and b whole (4 + 4 chunks), then the replica dies
    with Client(",".join(addrs)) as c:
        assert dict(c.stream("m", raw=True)) == TENSORS
    assert [k[1:] for k in plan.calls] == [("StreamTensors", []), ("StreamTensors", ["c"])]


# CANCELLED by the server: what a drain's grace ends a call blocked on a
# slow reader with (a consumer busy between tensors), or --stall-timeout.
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
def test_get_resumes_from_the_next_chunk(replicas, code):
    plan, addrs = replicas
    plan.kill_after, plan.code = 2, code
    with Client(addrs) as c:
        assert c.get_bytes("m", "a") == TENSORS["a"]
        assert (c.get_tensor("m", "b").tobytes()) == TENSORS["b"]
    assert [k[1:] for k in plan.calls] == [("GetTensor", "a", 0, None), ("GetTensor", "a", 32, 32),
                                           ("GetTensor", "b", 0, None)]


def test_range_restarts_from_its_start(replicas):
    # A range has no manifest digest: none of it is taken from a call that failed.
    plan, addrs = replicas
    plan.kill_after = 1
    with Client(addrs) as c:
        assert c.get_bytes("m", "a", 8, 40) == TENSORS["a"][8:48]
    assert [k[1:] for k in plan.calls] == [("GetTensor", "a", 8, 40)] * 2


@pytest.mark.parametrize("call", ["get", "stream"])
def test_resumed_piece_that_lies_raises(replicas, call):
    # The replica that answers the rest flips it (with its own digest of
    # the flipped bytes): the manifest digest of the whole catches it.
    plan, addrs = replicas
    plan.kill_after, plan.lie = 2, True
    with Client(addrs) as c, pytest.raises(ChecksumError):
        if call == "get":
            c.get_bytes("m", "a")
        else:
            list(c.stream("m"))


def test_other_codes_do_not_fail_over(replicas):
    plan, addrs = replicas
    plan.kill_after, plan.code = 2, grpc.StatusCode.DATA_LOSS
    with Client(addrs) as c, pytest.raises(grpc.RpcError) as e:
        c.get_bytes("m", "a")
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    assert c.failovers_used == 0


def test_one_server_does_not_fail_over(replicas):
    plan, addrs = replicas
    plan.kill_after = 2
    with Client(addrs[0]) as c, pytest.raises(grpc.RpcError) as e:
        c.get_bytes("m", "a")
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert c.failovers_used == 0


def test_failovers_are_bounded(replicas):
    plan, addrs = replicas
    plan.kill_after, plan.again = 1, True  # every call dies after its first chunk
    with Client(addrs, failovers=2) as c, pytest.raises(grpc.RpcError) as e:
        list(c.stream("m"))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert c.failovers_used == 2


class Held(Replica):
    """A replica whose stream sends a's first chunk, then holds the call
    open (until it is cancelled) without sending more."""

    def StreamTensors(self, req, ctx):
        self.plan.calls.append((self.tag, "StreamTensors", list(req.names)))
        yield pb.TensorChunk(name="a", offset=0, data=TENSORS["a"][:STEP],
                             total_bytes=len(TENSORS["a"]))
        while ctx.is_active():
            time.sleep(0.02)


def test_close_is_not_failed_over():
    # The caller's own cancel: close() from another thread while a stream
    # reads. Its CANCELLED ("Channel closed!") is the result, not a
    # failover (which would then raise ValueError on the closed channel).
    plan = Plan()
    servers, addrs = [], []
    for tag in "AB":
        s = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_TensorServiceServicer_to_server(Held(plan, tag), s)
        addrs.append("127.0.0.1:%d" % s.add_insecure_port("127.0.0.1:0"))
        s.start()
        servers.append(s)
    try:
        c = Client(addrs)
        c.model("m")
        threading.Timer(0.5, c.close).start()
        with pytest.raises(grpc.RpcError) as e:
            list(c.stream("m"))
        assert e.value.code() == grpc.StatusCode.CANCELLED
        assert c.failovers_used == 0
        assert len(plan.calls) == 1
    finally:
        for s in servers:
            s.stop(grace=None)


def test_cpp_client_failovers_must_be_a_count():
    # --failovers N takes a count: "-1" was taken as the default (8) and
    # "x" as 0, silently. Refused before any call (exit 2, usage).
    exe = os.path.join(os.environ.get("SLUICE_BUILD", "build"), "serve_client")
    if not os.access(exe, os.X_OK):
        pytest.skip("%s is not built" % exe)
    for bad in ("-1", "x", "", "3x", "99999999999"):
        r = subprocess.run([exe, "127.0.0.1:1,127.0.0.1:2", "list", "--failovers", bad],
                           timeout=60, capture_output=True, text=True)
        assert r.returncode == 2, (bad, r.returncode, r.stderr)
