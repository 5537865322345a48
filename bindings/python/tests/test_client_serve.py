"""End-to-end tests of the Python client (sluice.client) against the real
server process (tools/test_python.sh runs them with the ASan build's
server). Environment: SLUICE_BUILD (the build directory with sluice and
sluice-serve; default: the first build*/ of the repository that has
sluice-serve), SLUICE_REAL_DATA (the real corpus, shared/data/real).
Skipped when no sluice-serve is built (grpc++ missing)."""
import glob
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

import sluice

grpc = pytest.importorskip("grpc", reason="python3-grpcio is not installed")
pytest.importorskip("grpc_tools", reason="python3-grpc-tools is not installed")

from sluice.client import ChecksumError, Client

def _build():
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
    for d in [os.environ.get("SLUICE_BUILD")] + sorted(glob.glob(os.path.join(repo, "build*"))):
        if d and os.access(os.path.join(d, "sluice-serve"), os.X_OK):
            return d
    return None


BUILD = _build()
if BUILD is None:
    pytest.skip("no sluice-serve built (SLUICE_BUILD, build*/; grpc++ missing?)",
                allow_module_level=True)
REAL = os.environ.get("SLUICE_REAL_DATA",
                      os.path.join(os.path.dirname(__file__), "..", "..", "..", "..",
                                   "shared", "data", "real"))
SERVE = os.path.join(BUILD, "sluice-serve")
SLUICE = os.path.join(BUILD, "sluice")


def run(*args):
    subprocess.run(args, check=True, timeout=120, stdout=subprocess.DEVNULL)


class Server:
    """The server process on 127.0.0.1, port 0; stopped by stop() or at the end."""

    def __init__(self, path, *args, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([SERVE, path, "--listen", "127.0.0.1:0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                                     text=True)
        deadline = time.monotonic() + 30
        self.addr = self.metrics_port = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("metrics on "):  # --metrics-port: printed before listening
                self.metrics_port = int(line.split()[2].rsplit(":", 1)[1])
            if line.startswith("listening on "):
                self.addr = line.split()[2]
                break
        if not self.addr:
            self.proc.kill()
            raise RuntimeError("server did not start: " + self.proc.stderr.read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return rc


def local_tensors(path):
    """{name: bytes} of a .safetensors file or of every one in a directory."""
    files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "*.safetensors")))
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            data = fh.read()
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            out[name] = data[b:end]
    return out


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    if not os.path.isdir(REAL):
        pytest.skip("the real-world corpus %s is absent" % REAL)
    r = tmp_path_factory.mktemp("root")
    for f in glob.glob(os.path.join(REAL, "*.safetensors")):
        dst = r / os.path.basename(f)
        shutil.copyfile(f, dst)
        run(SLUICE, "manifest", str(dst), "-q", "-o", str(dst) + ".manifest.json")
    sharded = r / "SafeTensors.jl__sharded"
    shutil.copytree(os.path.join(REAL, "SafeTensors.jl__sharded"), sharded)
    os.chmod(sharded, 0o755)
    run(SLUICE, "manifest", str(sharded), "-q", "-o", str(sharded / "sluice.manifest.json"))
    run(SLUICE, "synth", "tiny", str(r / "synth"), "--shards", "3")
    return r


@pytest.fixture(scope="session")
def server(root):
    s = Server(str(root))
    yield s
    assert s.stop() == 0


def models_of(root):
    return sorted(p for p in os.listdir(root) if not p.endswith(".manifest.json"))


def test_list_models(server, root):
    with Client(server.addr) as c:
        names = [m["name"] for m in c.list_models()]
    assert names == models_of(root)


def test_every_tensor_equals_local_bytes(server, root):
    with Client(server.addr) as c:
        for m in models_of(root):
            local = local_tensors(str(root / m))
            info = c.model(m)
            assert sorted(t.name for t in info.tensors) == sorted(local)
            for t in info.tensors:
                arr = c.get_tensor(m, t.name, raw=True)  # BF16/F8 as bits without ml_dtypes
                assert isinstance(arr, np.ndarray)
                assert arr.tobytes() == local[t.name], (m, t.name)
                if t.dtype not in ("F4", "F6_E2M3", "F6_E3M2"):
                    assert list(arr.shape) == list(t.shape)


def test_stream_every_model(server, root):
    with Client(server.addr, chunk_bytes=65536) as c:
        for m in models_of(root):
            local = local_tensors(str(root / m))
            got = {name: data for name, data in c.stream(m, raw=True)}
            assert got == local, m


def test_stream_names_and_numpy_values(server, root):
    with Client(server.addr) as c:
        names = ["model.norm.weight", "lm_head.weight"]
        local = local_tensors(str(root / "synth"))
        if not sluice.HAVE_ML_DTYPES:  # BF16: NumPy has no dtype for it, so raw=True
            with pytest.raises(NotImplementedError, match="'model.norm.weight' is BF16"):
                dict(c.stream("synth", names))
            w = c.get_tensor("synth", "model.norm.weight", raw=True)
            assert w.dtype == np.uint16 and w.tobytes() == local["model.norm.weight"]
        else:
            got = dict(c.stream("synth", names))
            assert sorted(got) == sorted(names)
            assert got["model.norm.weight"].tobytes() == local["model.norm.weight"]
        f32 = c.get_tensor("mnist-tinygrad__model.safetensors", "l1.weight")
        assert f32.dtype == np.float32 and f32.shape == (128, 784)


def test_ranges(server, root):
    local = local_tensors(str(root / "synth"))
    name = "model.embed_tokens.weight"
    with Client(server.addr, chunk_bytes=4096) as c:
        n = len(local[name])
        for off, length in [(0, 1), (0, n), (n - 1, 1), (777, 12345), (1000, 0), (n, 0)]:
            want = local[name][off:off + length] if length else local[name][off:]
            assert c.get_bytes("synth", name, off, length) == want
        with pytest.raises(grpc.RpcError) as e:
            c.get_bytes("synth", name, n + 1, 0)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_errors(server):
    with Client(server.addr) as c:
        for model, code in [("no-such", grpc.StatusCode.NOT_FOUND),
                            ("../etc", grpc.StatusCode.INVALID_ARGUMENT),
                            ("/etc/passwd", grpc.StatusCode.INVALID_ARGUMENT),
                            ("..", grpc.StatusCode.INVALID_ARGUMENT)]:
            with pytest.raises(grpc.RpcError) as e:
                c.model(model)
            assert e.value.code() == code, model
        with pytest.raises(grpc.RpcError) as e:
            c.get_bytes("synth", "no.such.tensor")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # A long unknown name: still NOT_FOUND (the status message does not
        # echo it whole past the client's metadata limit).
        long = "x" * 20000
        with pytest.raises(grpc.RpcError) as e:
            c.get_bytes("synth", long)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            list(c.stream("synth", [long]))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()


def test_trusted_manifest(server, root, tmp_path):
    # A manifest the caller trusts, one digest altered: that tensor raises.
    with open(root / "synth" / "sluice.manifest.json") as f:
        doc = json.load(f)
    doc["tensors"]["model.norm.weight"]["digest"] = "00" * 32  # version 2
    p = tmp_path / "trusted.json"
    p.write_text(json.dumps(doc))
    with Client(server.addr, manifest=str(p)) as c:
        c.get_tensor("synth", "lm_head.weight", raw=True)
        with pytest.raises(ChecksumError):
            c.get_tensor("synth", "model.norm.weight", raw=True)


def test_trusted_manifest_whole_model(server, root, tmp_path):
    # The README's use: a copy of the model's manifest the caller trusts.
    # The whole model streams verified; a manifest that lacks a tensor the
    # server lists, or lists one it does not, is a ChecksumError before any
    # tensor is read.
    src = root / "synth" / "sluice.manifest.json"
    local = local_tensors(str(root / "synth"))
    with Client(server.addr, manifest=str(src)) as c:
        assert dict(c.stream("synth", raw=True)) == local
        assert c.get_bytes("synth", "lm_head.weight", 3, 5) == local["lm_head.weight"][3:8]
    doc = json.loads(src.read_text())
    dropped = doc["tensors"].pop("model.norm.weight")
    p = tmp_path / "fewer.json"
    p.write_text(json.dumps(doc))
    with Client(server.addr, manifest=str(p)) as c:
        with pytest.raises(ChecksumError, match="model.norm.weight"):
            list(c.stream("synth"))
    doc["tensors"]["model.norm.weight"] = dropped
    doc["tensors"]["model.extra.weight"] = dropped
    p.write_text(json.dumps(doc))
    with Client(server.addr, manifest=str(p)) as c:
        with pytest.raises(ChecksumError, match="model.extra.weight"):
            list(c.stream("synth"))


def test_corrupted_chunk_raises(root):
    # The server's fault hook corrupts the first chunk it sends of one
    # tensor: the client's end-to-end check must raise.
    s = Server(str(root / "synth"), env={"SLUICE_SERVE_TEST_CORRUPT_CHUNK": "model.norm.weight"})
    try:
        with Client(s.addr) as c:
            c.get_tensor("synth", "lm_head.weight", raw=True)
            with pytest.raises(ChecksumError, match="model.norm.weight"):
                c.get_tensor("synth", "model.norm.weight", raw=True)
            with pytest.raises(ChecksumError, match="model.norm.weight"):
                for _ in c.stream("synth", raw=True):
                    pass
    finally:
        assert s.stop() == 0


def test_token(root, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("python-secret\n")
    s = Server(str(root / "synth"), "--token-file", str(tok))
    try:
        with Client(s.addr) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.list_models()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # One byte off (same length), a prefix, the token and more.
        for wrong in ["python-secreT", "python", "python-secret2"]:
            with Client(s.addr, token=wrong) as c:
                with pytest.raises(grpc.RpcError) as e:
                    c.list_models()
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, wrong
        with Client(s.addr, token_file=str(tok)) as c:
            assert c.list_models()[0]["name"] == "synth"
            c.get_tensor("synth", "model.norm.weight", raw=True)
    finally:
        assert s.stop() == 0


def test_token_file_whitespace(root, tmp_path):
    # One rule for the server and the client: ASCII whitespace (a tab
    # too) off both ends of the token file. The server used to keep a
    # trailing tab that the client's .strip() took off: never authenticated.
    tok = tmp_path / "token"
    tok.write_bytes(b"\t python-secret\t\r\n")
    s = Server(str(root / "synth"), "--token-file", str(tok))
    try:
        with Client(s.addr, token_file=str(tok)) as c:
            assert c.list_models()[0]["name"] == "synth"
        with Client(s.addr, token="python-secret") as c:
            assert c.list_models()[0]["name"] == "synth"
    finally:
        assert s.stop() == 0


def test_health(server):
    # grpc.health.v1.Health/Check by hand (Debian has no grpc_health
    # module): an empty HealthCheckRequest; the answer {status: SERVING}
    # is the two bytes 08 01.
    with grpc.insecure_channel(server.addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
        assert check(b"", timeout=10) == b"\x08\x01"


def test_many_tensors_list_and_stream(tmp_path):
    # 40,000 tensors with 200-byte names and a flat manifest: GetModel's
    # reply (the tensors and the manifest) is some 21 MB, over gRPC's
    # default 4 MiB the clients took and the 8 MiB the server sent. (A
    # request over --max-request-bytes, split by the client, is
    # test_client_limits.py's: streaming the 5,000 names it takes costs
    # some 3 ms a tensor from this ASan server.)
    import stfile

    n = 40000
    path = str(tmp_path / "many.safetensors")
    ts = {("layers.%06d." % i).ljust(200, "w"): np.full(4, i % 251, dtype=np.uint8)
          for i in range(n)}
    stfile.write_manifest(path + ".manifest.json", stfile.write(path, ts))
    names = list(ts)
    s = Server(path)
    try:
        with Client(s.addr) as c:
            mi = c.model("many.safetensors")
            assert len(mi.tensors) == n and mi.ByteSize() > 8 << 20
            assert c.get_bytes("many.safetensors", names[-1]) == ts[names[-1]].tobytes()
            ask = names[::2000]
            got = [(k, bytes(v)) for k, v in c.stream("many.safetensors", ask, raw=True)]
            assert got == [(k, ts[k].tobytes()) for k in ask]
    finally:
        assert s.stop() == 0
