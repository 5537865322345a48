#!/usr/bin/python3
"""A raw HTTP/2 client for the serve tests (stdlib only: the frames are
written by hand, so that it can do what no gRPC library does).

  h2raw.py flood HOST:PORT N [--ack] [--data B] [--header B] [--from IP] [--tls]
      one connection, N streams of GetTensor that send their headers and no
      request message; --ack: acknowledge the server's SETTINGS (a client
      that does not is the worst case: gRPC applies its stream limit only
      after the ACK); --data B: each stream also sends B bytes of a request
      message that never ends; --header B: each stream's headers carry
      B bytes more (one header, in 16 KiB frames); --from: the source address;
      --tls: over TLS (ALPN h2, the server's certificate not checked). Prints "sent N" when every HEADERS frame is written,
      then "closed after S s" when the server closes the connection, or
      "open" if it still is 2 s after the last frame; exits 0 either way.
  h2raw.py hold HOST:PORT N [--from IP] [--once]
      N connections (from source address IP), each sends the preface and
      SETTINGS and a PING; prints "served K refused R" (served: the server
      answered with its SETTINGS and the PING's ACK within 5 s; refused:
      closed first), then holds them open until killed (--once: exits).
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
import ssl
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, ACK = 1, 4, 1


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def hpack_int(v):
    # An HPACK integer with a 7-bit prefix (RFC 7541 5.1), no Huffman flag.
    if v < 127:
        return bytes([v])
    out, v = [127], v - 127
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    return bytes(out + [v])


def hpack_literal(name, value):
    # "Literal header field without indexing, new name" (RFC 7541 6.2.2),
    # no Huffman.
    name, value = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(name)) + name + hpack_int(len(value)) + value


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


def connect(addr, rcvbuf=None, source=None, tls=False):
    host, port = addr.rsplit(":", 1)
    v6 = host.startswith("[")
    host = host.strip("[]")
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
    if source:
        s.bind((source, 0))
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect((host, int(port)))
    s.settimeout(None)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        s = ctx.wrap_socket(s)
    return s


def frames_with_payload(sock):
    """The server's frames as they arrive: (type, flags, payload), until EOF."""
    buf = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return
        buf += chunk
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
            buf = buf[9 + n:]
            yield kind, flags, payload


def frames(sock):
    """The server's frames as they arrive: (type, flags, length), until EOF."""
    for kind, flags, payload in frames_with_payload(sock):
        yield kind, flags, len(payload)


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
        try:
            for kind, flags, n in frames(self.sock):
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


def header_frames(stream, block):
    """A header block as HEADERS and CONTINUATION frames of 16 KiB at most."""
    parts = [block[k:k + 16384] for k in range(0, len(block), 16384)]
    return b"".join(frame(HEADERS if k == 0 else CONTINUATION,
                          END_HEADERS if k == len(parts) - 1 else 0, stream, p)
                    for k, p in enumerate(parts))


def flood(addr, n, ack, data=0, source=None, header=0, tls=False):
    s = connect(addr, source=source, tls=tls)
    r = Reader(s, ack)
    with r.lock:
        s.sendall(PREFACE + frame(SETTINGS, 0, 0))
    if not tls:  # one SSL object is not read and written by two threads at once
        r.start()
    block = request_headers("/sluice.v1.TensorService/GetTensor")
    if header:
        block += hpack_literal("x-pad", "p" * header)
    t0 = time.monotonic()
    sent = 0
    batch = []
    try:
        for i in range(n):
            batch.append(header_frames(1 + 2 * i, block))
            if data:
                # The message's prefix claims 1000 bytes more than are sent.
                batch.append(frame(DATA, 0, 1 + 2 * i, b"\x00" +
                                   struct.pack(">I", data + 1000) + b"x" * data))
            if len(batch) == 1000 or i == n - 1:
                with r.lock:
                    s.sendall(b"".join(batch))
                sent += len(batch)
                batch = []
    except OSError:
        pass
    print("sent %d in %.2f s" % (sent, time.monotonic() - t0), flush=True)
    if tls:
        r.start()
    r.join(2)
    if r.closed_at is not None:
        print("closed after %.2f s" % (r.closed_at - t0), flush=True)
    else:
        print("open", flush=True)
    s.close()


def served(s):
    """Whether the server answers a PING (after its SETTINGS) within 5 s."""
    s.settimeout(5)
    settings = False
    try:
        s.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"sluice!!"))
        for kind, flags, _ in frames(s):
            if kind == SETTINGS and not flags & ACK:
                settings = True
                s.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and flags & ACK and settings:
                return True
    except OSError:
        pass
    return False


def connect_or_none(addr, source):
    # A connection over the cap is reset as soon as it is accepted; on a
    # loaded machine the reset can land before connect() returns, which
    # then fails: that is a refusal too.
    try:
        return connect(addr, source=source)
    except ConnectionResetError:
        return None


def hold(addr, n, source, once):
    socks = [connect_or_none(addr, source) for _ in range(n)]
    ok = sum(1 for s in socks if s is not None and served(s))
    print("served %d refused %d" % (ok, n - ok), flush=True)
    if once:
        return
    while True:
        time.sleep(3600)


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
    rest = sys.argv[4:]
    source = rest[rest.index("--from") + 1] if "--from" in rest else None
    if cmd == "flood":
        data = int(rest[rest.index("--data") + 1]) if "--data" in rest else 0
        header = int(rest[rest.index("--header") + 1]) if "--header" in rest else 0
        flood(sys.argv[2], int(sys.argv[3]), "--ack" in rest, data, source, header,
              "--tls" in rest)
    elif cmd == "hold":
        hold(sys.argv[2], int(sys.argv[3]), source, "--once" in rest)
    elif cmd == "stall":
        stall(*sys.argv[2:6], int(sys.argv[6]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
