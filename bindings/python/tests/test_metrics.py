"""Model.metrics_text and sluice.serve_metrics (sluice_metrics_serve):
the exposition is promtool-clean, and the real prometheus scrapes the
server (servers.Prometheus)."""
import gc
import shutil
import subprocess
import time
import urllib.request

import pytest

import sluice
from servers import Prometheus

needs_http = pytest.mark.skipif(not sluice.features()["metrics_http"],
                                reason="this build has no libmicrohttpd (sluice.features())")


def promtool_check(text):
    exe = shutil.which("promtool")
    if not exe:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    r = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    # promtool check metrics exits 0 when clean; lint findings are printed
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), \
        r.stdout + r.stderr


def scrape(port, accept=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def test_metrics_text(sharded):
    with sluice.open(sharded) as m:
        for k in m.keys():
            m.get_tensor(k, raw=True)
        text = m.metrics_text()
        assert f'sluice_tensors_loaded_total{{model="{sharded}"}} ' in text
        loaded = [l for l in text.splitlines()
                  if l.startswith("sluice_tensors_loaded_total{")][0]
        assert int(loaded.split()[-1]) == sum(1 for k in m.keys() if m.info(k).nbytes)
        promtool_check(text)
        om = m.metrics_text(openmetrics=True)
        assert om.rstrip().endswith("# EOF")
    with pytest.raises(sluice.ClosedError):
        m.metrics_text()


@needs_http
def test_serve_metrics_add_remove_close(sharded, tmp_path):
    m1 = sluice.open(sharded)
    with sluice.serve_metrics(models=[m1]) as srv:
        assert srv.port > 0
        m1.get_tensor("a.f32")
        status, ctype, text = scrape(srv.port)
        assert status == 200 and ctype.startswith("text/plain")
        assert f'sluice_tensors_loaded_total{{model="{sharded}"}} 1' in text
        promtool_check(text)
        _, ctype, om = scrape(srv.port, "application/openmetrics-text; version=1.0.0")
        assert ctype.startswith("application/openmetrics-text") and om.rstrip().endswith("# EOF")
        # a model closed while served stays open in the library until removed
        m1.close()
        assert m1._m.open_in_library
        assert f'model="{sharded}"' in scrape(srv.port)[2]
        srv.remove(m1)
        assert not m1._m.open_in_library
        assert f'model="{sharded}"' not in scrape(srv.port)[2]
        with pytest.raises(sluice.NotFoundError):
            srv.remove(m1)
        with pytest.raises(sluice.ClosedError):
            srv.add(m1)
        m2 = sluice.open(sharded)
        srv.add(m2)
        srv.add(m2)  # served once
        port = srv.port
    assert srv.port == 0
    with pytest.raises(OSError):
        scrape(port)
    assert not m2.closed  # the server leaves its models alone
    m2.close()
    assert not m2._m.open_in_library
    with pytest.raises(ValueError):
        sluice.serve_metrics(port=70000)
    with pytest.raises(sluice.InvalidArgumentError):
        sluice.serve_metrics(host="not-an-address")


@needs_http
def test_a_server_dropped_unclosed_releases_its_models(sharded):
    m = sluice.open(sharded)
    srv = sluice.serve_metrics(models=[m])
    m.close()
    core = m._m
    assert core.open_in_library
    del srv
    gc.collect()
    assert not core.open_in_library


@needs_http
def test_prometheus_scrapes_serve_metrics(sharded, tmp_path):
    with sluice.open(sharded) as m, sluice.serve_metrics(models=[m]) as srv:
        for k in m.keys():
            m.get_tensor(k, raw=True)
        want = sum(1 for k in m.keys() if m.info(k).nbytes)
        prom = Prometheus(srv.port, str(tmp_path))
        try:
            deadline = time.monotonic() + 30
            value = None
            while time.monotonic() < deadline:
                r = prom.get("/api/v1/query?query=sluice_tensors_loaded_total")
                res = r["data"]["result"]
                if res:
                    value = res[0]
                    break
                time.sleep(0.2)
            assert value is not None, "prometheus never saw sluice_tensors_loaded_total"
            assert value["metric"]["model"] == sharded
            assert int(float(value["value"][1])) == want
            targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
            assert targets and targets[0]["health"] == "up", targets
            assert not targets[0]["lastError"], targets
        finally:
            prom.stop()


@needs_http
def test_remove_and_close_from_threads_drop_each_model_once(sharded):
    # remove() and close() of one server from several threads at once:
    # each served model is dropped exactly once (no IndexError left
    # pending, no use count off by one keeping the closed model open).
    import sys
    import threading
    m = sluice.open(sharded)
    raised = []
    old_hook, old_interval = threading.excepthook, sys.getswitchinterval()
    threading.excepthook = lambda args: raised.append(repr(args.exc_value))
    sys.setswitchinterval(1e-6)

    def churn(srv):
        for _ in range(20):
            try:
                srv.add(m)
                srv.remove(m)
            except sluice.NotFoundError:
                pass

    try:
        for _ in range(60):
            srv = sluice.serve_metrics(models=[m])
            ts = [threading.Thread(target=churn, args=(srv,)) for _ in range(3)]
            for t in ts:
                t.start()
            srv.close()
            for t in ts:
                t.join()
    finally:
        sys.setswitchinterval(old_interval)
        threading.excepthook = old_hook
    assert not [r for r in raised if "ClosedError" not in r and "closed" not in r], raised[:3]
    core = m._m
    m.close()
    assert not core.open_in_library


@needs_http
def test_a_second_model_of_one_label_is_refused_with_why(sharded):
    # two models of one location share its label: the second is refused
    # with a message that says so (not a detail left by an earlier call)
    with sluice.open(sharded) as m1, sluice.open(sharded) as m2, \
            sluice.serve_metrics(models=[m1]) as srv:
        with pytest.raises(sluice.NotFoundError):
            m2.get_tensor("no such tensor")
        with pytest.raises(sluice.InvalidArgumentError) as e:
            srv.add(m2)
        assert "label" in str(e.value), str(e.value)
        assert [x is m1._m for x in srv._s.models] == [True]
