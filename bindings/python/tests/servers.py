"""Real servers for the Python tests, started by the tests themselves on
127.0.0.1 and a free port, as the C tests start theirs
(tests/remote_fixture.h): each is a foreground process in its own process
group, its configuration and logs in a temporary directory, every wait
bounded, stopped (the whole group) even when the test fails. They reuse
the project's scripts rather than new servers:
  - nginx through tools/serve_http.sh (its access log on request);
  - the C tests' fault server, tests/remote_fault_server.py;
  - s3rver 3.7 (npm), installed as test_remote_s3 installs it;
  - prometheus (Debian's package) scraping a metrics endpoint.
A server that cannot run here skips the test, saying why."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_connect(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Process:
    """A server process in a group of its own; stop() ends the group."""

    def __init__(self, argv, port, env=None, cwd=None, log=None, ready_s=20):
        self.port = port
        out = open(log, "wb") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if log:
            out.close()
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if can_connect(port):
                return
            time.sleep(0.02)
        rc = self.proc.poll()
        self.stop()
        text = open(log, errors="replace").read()[-2000:] if log else ""
        if rc == 77:
            pytest.skip(f"{argv[0]}: {text.strip() or 'not installed'}")
        raise RuntimeError(f"{argv} did not start (exit {rc}): {text}")

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left of the group
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class Nginx(Process):
    """tools/serve_http.sh ROOT PORT, logging each request to access_log as
    "STATUS BODY_BYTES RANGE URI"."""

    def __init__(self, root, tmp):
        if not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)):
            pytest.skip("nginx is not installed (apt-get install nginx)")
        self.access_log = os.path.join(tmp, "access.log")
        open(self.access_log, "w").close()
        port = free_port()
        env = dict(os.environ, SLUICE_HTTP_ACCESS_LOG=self.access_log,
                   PATH=os.environ.get("PATH", "") + ":/usr/sbin")
        super().__init__(["sh", os.path.join(REPO, "tools", "serve_http.sh"), root, str(port)],
                         port, env=env, log=os.path.join(tmp, "serve_http.log"))
        self.base = f"http://127.0.0.1:{port}"

    def requests(self):
        """[(status, body_bytes, (first, last) or None, uri)] logged so far."""
        out = []
        for line in open(self.access_log):
            parts = line.split()
            if len(parts) != 4:
                continue
            status, nbytes, rng, uri = parts
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng)
            out.append((int(status), int(nbytes), (int(m[1]), int(m[2])) if m else None, uri))
        return out


class FaultServer(Process):
    """tests/remote_fault_server.py PORT ROOT (its /ctl arms faults)."""

    def __init__(self, root, tmp):
        port = free_port()
        super().__init__([sys.executable, os.path.join(REPO, "tests", "remote_fault_server.py"),
                          str(port), root], port, log=os.path.join(tmp, "fault_server.log"))
        self.base = f"http://127.0.0.1:{port}"

    def ctl(self, query):
        with urllib.request.urlopen(f"{self.base}/ctl{query}", timeout=10) as r:
            return r.read().decode()


def s3rver_bin():
    """s3rver 3.7 from npm, installed as tests/test_remote_s3.c installs it
    (into a build folder: SLUICE_S3RVER_DIR, else build-py/s3rver-npm),
    or None with the reason."""
    for d in (os.environ.get("SLUICE_S3RVER_DIR"), os.path.join(REPO, "build-asan", "s3rver-npm"),
              os.path.join(REPO, "build-py", "s3rver-npm")):
        if d and os.access(os.path.join(d, "node_modules", ".bin", "s3rver"), os.X_OK):
            return os.path.join(d, "node_modules", ".bin", "s3rver"), None
    if not (shutil.which("npm") and shutil.which("node")):
        return None, "npm or node is not installed (s3rver comes from npm)"
    d = os.path.join(REPO, "build-py", "s3rver-npm")
    os.makedirs(d, exist_ok=True)
    r = subprocess.run("timeout 400 npm install --no-audit --no-fund --silent s3rver@3.7 "
                       ">npm.log 2>&1", shell=True, cwd=d)
    b = os.path.join(d, "node_modules", ".bin", "s3rver")
    if r.returncode != 0 or not os.access(b, os.X_OK):
        return None, f"npm install s3rver@3.7 failed (see {d}/npm.log)"
    return b, None


class S3rver(Process):
    """s3rver on 127.0.0.1 with a bucket "models"; put() uploads a file
    (s3rver takes unsigned PUTs and checks no signature)."""

    def __init__(self, tmp):
        b, why = s3rver_bin()
        if b is None:
            pytest.skip(why)
        port = free_port()
        data = os.path.join(tmp, "s3data")
        os.makedirs(data, exist_ok=True)
        super().__init__([b, "-d", data, "-a", "127.0.0.1", "-p", str(port), "-s",
                          "--service-endpoint", "localhost", "--configure-bucket", "models"],
                         port, log=os.path.join(tmp, "s3rver.log"), ready_s=30)
        self.endpoint = f"http://127.0.0.1:{port}"

    def put(self, key, path):
        with open(path, "rb") as f:
            body = f.read()
        req = urllib.request.Request(f"{self.endpoint}/models/{key}", data=body, method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200, r.status


class Prometheus(Process):
    """prometheus scraping 127.0.0.1:target every 0.5 s; query() asks its
    HTTP API."""

    def __init__(self, target, tmp):
        exe = shutil.which("prometheus")
        if not exe:
            pytest.skip("prometheus is not installed (apt-get install prometheus)")
        port = free_port()
        conf = os.path.join(tmp, "prometheus.yml")
        with open(conf, "w") as f:
            f.write("global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
                    "scrape_configs:\n  - job_name: sluice\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{target}']\n")
        super().__init__([exe, f"--config.file={conf}", f"--storage.tsdb.path={tmp}/tsdb",
                          f"--web.listen-address=127.0.0.1:{port}"], port,
                         log=os.path.join(tmp, "prometheus.log"), ready_s=60)
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60  # its TSDB opens after the port does
        while True:
            try:
                with urllib.request.urlopen(self.base + "/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("prometheus did not become ready in 60 s")
            time.sleep(0.1)

    def get(self, path):
        import json
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return json.load(r)
