"""The Python client over three real `sluice serve` replicas (127.0.0.1,
free ports, stopped at the end): 8 client processes stream a model, each
stalled after its first tensor so that every one has a call open; the
replica with the most open calls is killed (SIGKILL), the next is sent
SIGTERM (it says NOT_SERVING and drains): every client finishes with
every tensor verified against the trusted manifest, and the calls show on
the survivor's metrics."""
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from sluice_serve import Client

from test_sluice_serve import SERVE, SLUICE, Server, run

MKMODEL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "serve", "mkmodel.py")


def metric(port, name):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        for line in r.read().decode().splitlines():
            k, _, v = line.partition(" ")
            if k == name:
                return float(v)
    return None


def stream_calls(port):
    return metric(port, 'sluice_serve_calls_total{method="StreamTensors",code="OK"}')


@pytest.fixture
def model(tmp_path):
    if not os.access(SERVE, os.X_OK):
        pytest.skip("%s is not built" % SERVE)
    path = tmp_path / "model.safetensors"
    # 8 x 8 MiB: a stream stalled after its first tensor holds its call.
    run(sys.executable, MKMODEL, str(path), *("w%d:8388608" % i for i in range(8)))
    run(SLUICE, "manifest", str(path), "-q", "-o", str(path) + ".manifest.json")
    return path


def test_kill_and_stop_replicas_mid_stream(model, tmp_path):
    # The clients stall until the replicas are killed and stopped (go): on
    # a loaded machine that may be past the default --stall-timeout 30 s.
    go = tmp_path / "go"
    reps = [Server(str(model), "--metrics-port", "0", "--grace", "5",
                   "--max-streams-per-client", "64", "--max-connections-per-address", "64",
                   "--stall-timeout", "600")
            for _ in range(3)]
    clients = []
    try:
        addrs = ",".join(r.addr for r in reps)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(__file__)] + sys.path))
        for _ in range(8):
            clients.append(subprocess.Popen(
                [sys.executable, os.path.join(os.path.dirname(__file__), "replica_client.py"),
                 addrs, model.name, str(model) + ".manifest.json", "2", "540", str(go)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        deadline = time.monotonic() + 120
        for p in clients:  # each has a call open, stalled (at most 120 s to start)
            ready, _, _ = select.select([p.stdout], [], [], max(0, deadline - time.monotonic()))
            assert ready and p.stdout.readline().strip() == "stalling", "a client did not start"
        act = [metric(r.metrics_port, "sluice_serve_active_streams") for r in reps]
        order = sorted(range(3), key=lambda k: -act[k])
        killed, stopped, live = (reps[k] for k in order)
        assert act[order[0]] >= 1
        before = stream_calls(live.metrics_port)
        killed.proc.kill()
        killed.proc.wait()
        assert stopped.stop() == 0  # SIGTERM: NOT_SERVING, drained, exit 0
        go.touch()  # the stalled readers take up their streams again
        failovers = 0
        for p in clients:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            ok, n, used = out.split()
            assert (ok, n) == ("ok", "16"), out + err  # 2 x 8 tensors, each verified
            failovers += int(used)
        # Each call open on the killed replica failed over; so did the
        # stopped one's, cut at its grace's end (5 s, the readers stalled
        # until after it: CANCELLED, or their connections closed).
        assert failovers >= act[order[0]]
        # The clients' second passes (8 calls) all on the survivor.
        assert stream_calls(live.metrics_port) - before >= 8
        assert live.stop() == 0
    finally:
        for p in clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        for r in reps:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


def test_draining_replica_gets_no_call(model):
    # grpc.health.v1 from the client: a replica that drains (SIGTERM; a
    # call held open on it keeps the drain going) says NOT_SERVING, and a
    # new client of the set sends it nothing. Without the health check a
    # third of the calls would be refused there ("server shutting down").
    # The held call keeps the drain open until the checks are done (its
    # close below): the grace and --stall-timeout are far past them, so a
    # loaded machine cannot end the drain, and its metrics, under them.
    reps = [Server(str(model), "--metrics-port", "0", "--grace", "600", "--stall-timeout", "600")
            for _ in range(3)]
    try:
        drain = reps[2]
        hold = Client(drain.addr)
        held = hold.stream(model.name, raw=True)
        next(held)  # its first tensor; the call stays open, unread
        drain.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([drain.proc.stderr], [], [], deadline - time.monotonic())
            if ready and "draining" in drain.proc.stderr.readline():
                break
        else:
            pytest.fail("the replica sent SIGTERM did not begin draining")
        with Client([r.addr for r in reps], manifest=str(model) + ".manifest.json") as c:
            for _ in range(9):
                assert c.get_bytes(model.name, "w1") is not None  # verified
        assert metric(drain.metrics_port, 'sluice_serve_refused_total{reason="shutdown"}') == 0
        assert metric(drain.metrics_port,
                      'sluice_serve_calls_total{method="GetTensor",code="OK"}') == 0
        held.close()
        hold.close()
        assert drain.stop() == 0
        for r in reps[:2]:
            assert r.stop() == 0
    finally:
        for r in reps:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
