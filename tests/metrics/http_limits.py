#!/usr/bin/python3
"""The bounds of a metrics endpoint against slow and wrong clients, for
both endpoints: the library's (sluice_metrics_serve, through test_metrics
--serve) and sluice serve's own (--metrics-port).

usage: http_limits.py PORT                  an endpoint already listening
       http_limits.py --library TEST_METRICS   starts test_metrics --serve

Checks, on 127.0.0.1 only, every wait bounded:
  1. POST (and PUT) with a body, to /metrics and elsewhere: 405 with
     "Allow: GET, HEAD", not an empty reply.
  2. 40 slow clients from 127.0.0.2 (a header line a second, so the idle
     timeout never fires): a scrape from 127.0.0.1 succeeds at once (the
     per-address cap keeps them to a few of the slots).
  3. 40 slow clients from 127.0.0.1, the scraper's own address: every one
     is cut within the deadline (5 s) plus a margin, and a scraper that
     retries gets its answer within that bound too.
Prints "ok - ..." or "FAIL - ..." per check; exit 0 when all passed, 1
otherwise, 77 when the library was built without libmicrohttpd.
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

DEADLINE = 5.0       # the endpoints' whole-request deadline
MARGIN = 2.5         # the watchdog's tick, a loaded machine
SLOW = 40            # more than the endpoints' 32 connections
PER_ADDRESS = 8      # the endpoints' cap of connections from one address
failures = 0


def report(good, what):
    global failures
    print(("ok - " if good else "FAIL - ") + what, flush=True)
    if not good:
        failures += 1


def request(port, raw, timeout=2.0, source=None):
    """Sends raw, reads until the server closes or timeout; returns the
    answer's bytes (b"" for none)."""
    s = socket.socket()
    s.settimeout(timeout)
    try:
        if source:
            s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(raw)
        got = b""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            got += b
        return got
    except OSError:
        return b""
    finally:
        s.close()


def scrape(port, timeout=2.0):
    a = request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout)
    return a.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in a


class Slow:
    """n connections from source, each sending a request's first line and
    then one header line a second, never ending the request."""

    def __init__(self, port, source, n):
        self.socks, self.opened, self.closed = [], [], {}
        for _ in range(n):
            s = socket.socket()
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)
            self.socks.append(s)
            self.opened.append(time.monotonic())
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        k = 0
        while not self.stop.wait(0.05):
            k += 1
            for i, s in enumerate(self.socks):
                if i in self.closed:
                    continue
                try:
                    b = s.recv(4096)
                    ended = not b  # an answer or the end: not a slow client any more
                except BlockingIOError:
                    ended = False
                except OSError:
                    ended = True
                if not ended and k % 20 == 0:
                    try:
                        s.send(b"X-Slow: %d\r\n" % k)
                    except BlockingIOError:
                        pass
                    except OSError:
                        ended = True
                if ended:
                    self.closed[i] = time.monotonic() - self.opened[i]

    def close(self):
        self.stop.set()
        self.t.join()
        for s in self.socks:
            s.close()


def check_methods(port):
    for method in (b"POST", b"PUT"):
        for path in (b"/metrics", b"/elsewhere"):
            a = request(port, method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world")
            head = a.split(b"\r\n\r\n", 1)[0].lower()
            report(a.startswith(b"HTTP/1.1 405") and b"\r\nallow: get, head" in head,
                   "%s %s with a body: 405 with Allow: GET, HEAD (got %r)"
                   % (method.decode(), path.decode(), a[:60]))


def check_other_address(port):
    try:
        slow = Slow(port, "127.0.0.2", SLOW)
    except OSError as e:
        print("# skipped the other-address check: cannot connect from 127.0.0.2: %s" % e)
        return
    try:
        t0 = time.monotonic()
        good = scrape(port, 2.0)
        report(good, "%d slow clients from 127.0.0.2: a scrape from 127.0.0.1 answered in %.2f s"
               % (SLOW, time.monotonic() - t0))
    finally:
        slow.close()


def check_same_address(port):
    slow = Slow(port, "127.0.0.1", SLOW)
    bound = DEADLINE + MARGIN
    try:
        t0 = time.monotonic()
        scraped = None
        while time.monotonic() - t0 < bound + 1.5:
            if scrape(port, 1.0):
                scraped = time.monotonic() - t0
                break
            time.sleep(0.25)
        while len(slow.closed) < SLOW and time.monotonic() - t0 < bound + 1.5:
            time.sleep(0.1)
        held = [d for d in slow.closed.values() if d > 1.0]
        report(len(slow.closed) == SLOW and max(slow.closed.values()) <= bound,
               "%d slow clients from 127.0.0.1: all cut within %.1f s (%d cut, the last at %s s)"
               % (SLOW, bound, len(slow.closed),
                  "%.2f" % max(slow.closed.values()) if slow.closed else "-"))
        report(held and min(held) >= DEADLINE - 1.0,
               "the slow clients that got a slot were cut by the deadline (%s s), not before"
               % ", ".join("%.1f" % d for d in sorted(held)[:3]))
        report(0 < len(held) <= PER_ADDRESS,
               "%d of them got a slot (the per-address cap)" % len(held))
        report(scraped is not None and scraped <= bound,
               "a retrying scrape from the same address answered within %.1f s (%s)"
               % (bound, "%.2f s" % scraped if scraped is not None else "never"))
    finally:
        slow.close()


def run_checks(port):
    report(scrape(port), "a plain scrape")
    check_methods(port)
    check_other_address(port)
    # the slow clients of 2 gone from the server's slots first (bounded)
    t0 = time.monotonic()
    while not scrape(port, 1.0) and time.monotonic() - t0 < DEADLINE + MARGIN:
        time.sleep(0.1)
    check_same_address(port)
    report(scrape(port), "a plain scrape after them")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--library":
        with tempfile.TemporaryDirectory() as d:
            portfile = os.path.join(d, "port")
            env = dict(os.environ, TMPDIR=d)
            p = subprocess.Popen([sys.argv[2], "--serve", portfile, "90"], env=env)
            try:
                t0 = time.monotonic()
                while not os.path.exists(portfile):
                    if p.poll() is not None:
                        if p.returncode == 77:
                            print("SKIP: built without libmicrohttpd: no endpoint")
                            return 77
                        print("FAIL - test_metrics --serve exited %d" % p.returncode)
                        return 1
                    if time.monotonic() - t0 > 30:
                        print("FAIL - test_metrics --serve wrote no port in 30 s")
                        return 1
                    time.sleep(0.1)
                run_checks(int(open(portfile).read()))
            finally:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    elif len(sys.argv) == 2:
        run_checks(int(sys.argv[1]))
    else:
        print(__doc__)
        return 2
    print("%s" % ("all passed" if failures == 0 else "%d failed" % failures))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
