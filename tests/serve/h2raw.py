#!/usr/bin/python3
"""A raw HTTP/2 client for the serve tests (stdlib only: the frames are
written by hand, so that it can do what no gRPC library does).

  h2raw.py flood HOST:PORT N [--ack]
      one connection, N streams of GetTensor that send their headers and no
      request message; --ack: acknowledge the server's SETTINGS (a client
      that does not is the worst case: gRPC applies its stream limit only
      after the ACK). Prints "sent N" when every HEADERS frame is written,
      then "closed after S s" when the server closes the connection, or
      "open" if it still is 2 s after the last frame; exits 0 either way.
  h2raw.py stall HOST:PORT MODEL TENSOR TOKEN_FILE|- BYTES
      one GetTensor with the largest HTTP/2 windows; reads BYTES of the
      answer, prints "stalling after B bytes", then stops reading for good
      (sleeps until killed or the server closes... it never reads again).
      It watches its socket's TCP state meanwhile, unread: when the server
      resets the connection it prints "reset after S s" (S since it
      stopped reading). HOST may be an IPv6 address in brackets: [::1].
"""
import os
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 1, 4, 1


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def hpack_literal(name, value):
    # "Literal header field without indexing, new name" (RFC 7541 6.2.2),
    # no Huffman: short names and values only (7-bit lengths).
    name, value = name.encode(), value.encode()
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def request_headers(path, token=None):
    h = [(":method", "POST"), (":scheme", "http"), (":path", path),
         (":authority", "localhost"), ("content-type", "application/grpc"),
         ("te", "trailers")]
    if token:
        h.append(("authorization", "Bearer " + token))
    return b"".join(hpack_literal(n, v) for n, v in h)


def pb_string(field, s):
    b = s.encode()
    out = bytes([(field << 3) | 2])
    n = len(b)
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n]) + b


def connect(addr, rcvbuf=None):
    host, port = addr.rsplit(":", 1)
    v6 = host.startswith("[")
    host = host.strip("[]")
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect((host, int(port)))
    s.settimeout(None)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Reader(threading.Thread):
    """Parses the server's frames; ACKs its SETTINGS when asked to."""

    def __init__(self, sock, ack, limit=None):
        super().__init__(daemon=True)
        self.sock, self.ack, self.limit = sock, ack, limit
        self.closed_at = None
        self.data_bytes = 0
        self.enough = threading.Event()
        self.lock = threading.Lock()

    def run(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    kind, flags = buf[3], buf[4]
                    buf = buf[9 + n:]
                    if kind == SETTINGS and not flags & ACK and self.ack:
                        with self.lock:
                            self.sock.sendall(frame(SETTINGS, ACK, 0))
                    elif kind == DATA:
                        self.data_bytes += n
                if self.limit is not None and self.data_bytes >= self.limit:
                    self.enough.set()
                    return  # never reads again
        except OSError:
            pass
        self.closed_at = time.monotonic()
        self.enough.set()


def flood(addr, n, ack):
    s = connect(addr)
    r = Reader(s, ack)
    with r.lock:
        s.sendall(PREFACE + frame(SETTINGS, 0, 0))
    r.start()
    block = request_headers("/sluice.v1.TensorService/GetTensor")
    t0 = time.monotonic()
    sent = 0
    batch = []
    try:
        for i in range(n):
            batch.append(frame(HEADERS, END_HEADERS, 1 + 2 * i, block))
            if len(batch) == 1000 or i == n - 1:
                with r.lock:
                    s.sendall(b"".join(batch))
                sent += len(batch)
                batch = []
    except OSError:
        pass
    print("sent %d in %.2f s" % (sent, time.monotonic() - t0), flush=True)
    r.join(2)
    if r.closed_at is not None:
        print("closed after %.2f s" % (r.closed_at - t0), flush=True)
    else:
        print("open", flush=True)
    s.close()


def stall(addr, model, tensor, token_file, nbytes):
    token = None
    if token_file != "-":
        with open(token_file) as f:
            token = f.read().strip()
    # A small receive buffer: the server's send buffer fills soon after
    # this client stops reading.
    s = connect(addr, rcvbuf=1 << 16)
    r = Reader(s, True, limit=nbytes)
    big = (1 << 31) - 1
    settings = struct.pack(">HI", 4, big) + struct.pack(">HI", 5, (1 << 24) - 1)
    msg = pb_string(1, model) + pb_string(2, tensor)
    with r.lock:
        s.sendall(PREFACE + frame(SETTINGS, 0, 0, settings) +
                  frame(WINDOW, 0, 0, struct.pack(">I", big - 65535)) +
                  frame(HEADERS, END_HEADERS, 1,
                        request_headers("/sluice.v1.TensorService/GetTensor", token)) +
                  frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
    r.start()
    r.enough.wait(60)
    print("stalling after %d bytes" % r.data_bytes, flush=True)
    # Linux's tcp_info starts with the state; TCP_CLOSE (7) here, with
    # nothing read, is a reset from the server (its FIN would wait behind
    # the data this client does not read; the kernel's own timeout there,
    # TCP_USER_TIMEOUT, sends nothing).
    t0 = time.monotonic()
    while True:
        if s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == 7:
            print("reset after %.2f s" % (time.monotonic() - t0), flush=True)
            break
        time.sleep(0.05)
    while True:
        time.sleep(3600)


def main():
    cmd = sys.argv[1]
    if cmd == "flood":
        flood(sys.argv[2], int(sys.argv[3]), "--ack" in sys.argv[4:])
    elif cmd == "stall":
        stall(*sys.argv[2:6], int(sys.argv[6]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
