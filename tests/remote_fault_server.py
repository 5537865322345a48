#!/usr/bin/env python3
"""The remote tests' fault-injecting HTTP server (test_remote_faults.c).

usage: remote_fault_server.py PORT ROOT

Serves the files under ROOT on 127.0.0.1:PORT with single byte ranges
(206 + Content-Range), HTTP/1.1 keep-alive, one thread per connection.
A test arms a fault with a control request:

    GET /ctl?mode=MODE&count=N&arg=X    the next N GETs of files misbehave
    GET /ctl/stats                      "requests=R faults=F" so far
    GET /ctl/headers                    the last file request's headers
    GET /ctl/log                        every file request's, a blank line
                                        after each ("GET PATH" first)
    GET /ctl/clear                      forgets them
    GET /ctl/etag?value=V               every file reply from now on carries
                                        "ETag: V" (V as given, control bytes
                                        and all: a proxy that rewrites ETags,
                                        a server that answers a bare CR);
                                        no value: none again (the default)

It also answers as an HTTP proxy: a request for an absolute URI
(GET http://HOST:PORT/PATH) is served from ROOT/PATH whatever the host;
CONNECT is refused (501), as a proxy that never tunnels, and logged.

MODE is one of:
    status     answer HTTP arg (503, 429, 404, ...) with no body
    redirect   answer 302 with Location: arg
    status_ra  the same with "Retry-After: 1"
    norange    200 with the whole file (Range ignored)
    short      206 headers for the whole range, half the body, then close
    stall      206 headers, half the body, then sleep arg seconds
    hang       read the request, answer nothing for arg seconds
    reset      close the connection at once with a TCP reset
    flip       a correct 206 with one byte of the body flipped
    flipat     arg OFFSET: any reply (200 or 206) whose body holds the
               file's byte at OFFSET has it flipped; only such replies
               count down N
    statusat   arg OFFSET: any request whose range (or whole file) holds
               the byte at OFFSET is answered 404 ("fault"); only such
               requests count down N, the others are served as asked
    grow       Content-Range naming a size one byte larger
    shift      206 for the range one byte earlier (Content-Range says so)
    widen      206 naming one byte past the range, and sending it
    nocr       a correct 206 body without a Content-Range
    long       a correct Content-Range, one byte more body than it names
    half       206 for the first half of the range only (Content-Range
               says so), keep-alive: a legal partial answer
    slow       a correct 206, its body paced at arg bytes a second
               (default 2000000: 2 MB/s a request), keep-alive
    trickle    206 headers, then one byte of the body every arg seconds
               (default 0.1), then close
    late       arg "T,R": nothing for T seconds, then as slow at R bytes a
               second (a slow first byte, then a slow link)
A request for several ranges (Range: bytes=a-b,c-d,...) is answered 206
multipart/byteranges, one part a range in the order asked; the modes that
answer it otherwise (norange, the status and connection ones apply too):
    mpone      206 for the first range alone (a server without multi-range)
    mp416      416, as a server that refuses multi-range
    mpcr       the middle part's Content-Range (and bytes) one byte later
    mpsize     every part's Content-Range naming a size one byte larger
    mpnocr     the second part without a Content-Range
    mplong     the first part one byte longer than its Content-Range
    mpextra    one part more than the ranges asked
    mpcut      the body cut in half (Content-Length says so)
    mptail     bytes after the closing boundary
    mpboundary the second part's boundary line another boundary
    mpnoboundary  Content-Type multipart/byteranges without a boundary
A fault served counts down N; at 0 the server behaves again.
"""
import os
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

STATE = {"mode": "ok", "count": 0, "arg": "", "requests": 0, "faults": 0, "headers": "",
         "log": [], "etag": ""}
LOCK = threading.Lock()
ROOT = "."


def take_fault():
    with LOCK:
        STATE["requests"] += 1
        if STATE["count"] > 0:
            STATE["count"] -= 1
            STATE["faults"] += 1
            return STATE["mode"], STATE["arg"]
        return "ok", ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def end_headers(self):
        # a file's reply carries the ETag /ctl/etag set, written raw
        if getattr(self, "etag_out", ""):
            self._headers_buffer.append(("ETag: %s\r\n" % self.etag_out).encode("latin-1"))
            self.etag_out = ""
        super().end_headers()

    def small(self, code, body=b"", extra=()):
        self.send_response(code)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        u = urlparse(self.path)
        self.etag_out = ""
        if u.path == "/ctl/etag":
            with LOCK:
                STATE["etag"] = parse_qs(u.query).get("value", [""])[0]
            return self.small(200, b"ok")
        if u.path == "/ctl":
            q = parse_qs(u.query)
            with LOCK:
                STATE["mode"] = q.get("mode", ["ok"])[0]
                STATE["count"] = int(q.get("count", ["0"])[0])
                STATE["arg"] = q.get("arg", [""])[0]
            return self.small(200, b"ok")
        if u.path == "/ctl/stats":
            with LOCK:
                body = "requests=%d faults=%d" % (STATE["requests"], STATE["faults"])
            return self.small(200, body.encode())
        if u.path == "/ctl/headers":
            with LOCK:
                body = STATE["headers"]
            return self.small(200, body.encode())
        if u.path == "/ctl/log":
            with LOCK:
                body = "".join(STATE["log"])
            return self.small(200, body.encode())
        if u.path == "/ctl/clear":
            with LOCK:
                STATE["log"] = []
            return self.small(200, b"ok")
        with LOCK:
            STATE["headers"] = "GET %s\n%s" % (self.path, str(self.headers))
            STATE["log"].append(STATE["headers"] + "\n")
        path = os.path.join(ROOT, u.path.lstrip("/"))
        if not os.path.isfile(path):
            take_fault()
            return self.small(404, b"not found")
        with LOCK:
            self.etag_out = STATE["etag"]
        if STATE["mode"] == "flipat":
            return self.flipat(path)
        if STATE["mode"] == "statusat":
            return self.statusat(path)
        mode, arg = take_fault()
        with open(path, "rb") as f:
            data = f.read()
        size = len(data)
        rng = self.headers.get("Range")
        a, b = 0, size - 1
        ranged = False
        multi = None
        if rng and rng.startswith("bytes=") and "," in rng:
            multi = [tuple(int(v) for v in r.split("-")) for r in rng[6:].split(",")]
        elif rng and rng.startswith("bytes="):
            s, _, e = rng[6:].partition("-")
            a = int(s)
            b = min(int(e), size - 1) if e else size - 1
            ranged = True
        if mode == "status":
            return self.small(int(arg or 503), b"fault")
        if mode == "redirect":
            return self.small(302, b"", [("Location", arg)])
        if mode == "status_ra":
            return self.small(int(arg or 503), b"fault", [("Retry-After", "1")])
        if mode == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if mode == "hang":
            time.sleep(float(arg or 30))
            self.close_connection = True
            return
        if mode == "late":
            delay, _, arg = arg.partition(",")
            time.sleep(float(delay or 1))
            mode = "slow"
        if multi is not None:
            return self.multi(mode, multi, data)
        if mode == "norange" or not ranged:
            return self.small(200, data)
        if a >= size:
            return self.small(416, b"", [("Content-Range", "bytes */%d" % size)])
        if mode == "shift" and a > 0:
            a, b = a - 1, b - 1
        body = bytearray(data[a:b + 1])
        total = size + 1 if mode == "grow" else size
        if mode in ("widen", "long"):
            body.append(0)
        if mode == "widen":
            b += 1
        if mode == "half" and b > a:
            b = a + (b - a + 1) // 2 - 1
            body = body[: b - a + 1]
        if mode == "flip" and body:
            body[len(body) // 2] ^= 0xFF
        self.send_response(206)
        if mode != "nocr":
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, total))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "short":
            self.wfile.write(bytes(body[: len(body) // 2]))
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "slow":
            rate = float(arg or 2000000)
            piece = max(1024, min(16384, int(rate / 50)))
            t0 = time.monotonic()
            for k in range(0, len(body), piece):
                self.wfile.write(bytes(body[k:k + piece]))
                self.wfile.flush()
                ahead = t0 + (k + piece) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            return
        if mode == "trickle":
            gap = float(arg or 0.1)
            try:
                for k in range(len(body)):
                    self.wfile.write(bytes(body[k:k + 1]))
                    self.wfile.flush()
                    time.sleep(gap)
            except OSError:
                pass    # the client gave up: what the test asks for
            self.close_connection = True
            return
        if mode == "stall":
            self.wfile.write(bytes(body[: len(body) // 2]))
            self.wfile.flush()
            time.sleep(float(arg or 30))
            self.close_connection = True
            return
        self.wfile.write(bytes(body))

    def multi(self, mode, ranges, data):
        size = len(data)
        if mode == "norange":
            return self.small(200, data)
        if mode == "mpone":
            a, b = ranges[0]
            return self.small(206, data[a:b + 1],
                              [("Content-Range", "bytes %d-%d/%d" % (a, b, size))])
        if mode == "mp416":
            return self.small(416, b"", [("Content-Range", "bytes */%d" % size)])
        bnd = b"SLUICE0123456789"
        out = bytearray()
        for k, (a, b) in enumerate(ranges):
            total = size + 1 if mode == "mpsize" else size
            if mode == "mpcr" and k == len(ranges) // 2:
                a, b = a + 1, b + 1
            out += b"\r\n--" + (b"OTHER" if mode == "mpboundary" and k == 1 else bnd) + b"\r\n"
            out += b"Content-Type: application/octet-stream\r\n"
            if not (mode == "mpnocr" and k == 1):
                out += b"Content-Range: bytes %d-%d/%d\r\n" % (a, b, total)
            out += b"\r\n" + data[a:b + 1]
            if mode == "mplong" and k == 0:
                out += b"x"
        if mode == "mpextra":
            out += b"\r\n--" + bnd + b"\r\nContent-Range: bytes 0-0/%d\r\n\r\n" % size + data[0:1]
        out += b"\r\n--" + bnd + b"--\r\n"
        if mode == "mptail":
            out += b"junk"
        if mode == "mpcut":
            out = out[: len(out) // 2]
        ctype = "multipart/byteranges"
        if mode != "mpnoboundary":
            ctype += "; boundary=" + bnd.decode()
        return self.small(206, bytes(out), [("Content-Type", ctype)])

    def at_offset(self, path):
        """The file at path (a bytearray), the range asked (a, b; the whole
        file when none), the Range header, and whether the armed OFFSET is
        in that range (counted down, and counted as a fault, when it is)."""
        with open(path, "rb") as f:
            data = bytearray(f.read())
        size = len(data)
        rng = self.headers.get("Range")
        a, b = 0, size - 1
        if rng and rng.startswith("bytes="):
            s, _, e = rng[6:].partition("-")
            a = int(s)
            b = min(int(e), size - 1) if e else size - 1
        with LOCK:
            STATE["requests"] += 1
            at = int(STATE["arg"] or 0)
            hit = STATE["count"] > 0 and a <= at <= b
            if hit:
                STATE["count"] -= 1
                STATE["faults"] += 1
        return data, a, b, rng, hit, at

    def statusat(self, path):
        data, a, b, rng, hit, _ = self.at_offset(path)
        size = len(data)
        if hit:
            return self.small(404, b"fault")
        if not rng:
            return self.small(200, bytes(data))
        return self.small(206, bytes(data[a:b + 1]),
                          [("Content-Range", "bytes %d-%d/%d" % (a, b, size))])

    def flipat(self, path):
        data, a, b, rng, hit, at = self.at_offset(path)
        size = len(data)
        if hit:
            data[at] ^= 0xFF
        if not rng:
            return self.small(200, bytes(data))
        if a >= size:
            return self.small(416, b"", [("Content-Range", "bytes */%d" % size)])
        return self.small(206, bytes(data[a:b + 1]),
                          [("Content-Range", "bytes %d-%d/%d" % (a, b, size))])

    def do_CONNECT(self):
        with LOCK:
            STATE["log"].append("CONNECT %s\n%s\n" % (self.path, str(self.headers)))
        self.small(501, b"no tunnels here")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        pass    # resets and closed connections are what the tests ask for


def main():
    global ROOT
    port, ROOT = int(sys.argv[1]), sys.argv[2]
    srv = Server(("127.0.0.1", port), Handler)
    try:
        srv.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
