// relay.cc: the TCP front of `sluice serve` (see relay.h). One thread, one
// epoll set, level-triggered, non-blocking sockets. Per connection: the
// client's socket (TLS over it when configured), our end of a socketpair
// whose other end gRPC serves as a plaintext HTTP/2 connection, and two
// bounded buffers (client to gRPC, gRPC to client). A full buffer stops
// the reading of its source: a client that does not read stops the relay
// reading gRPC's answers, and gRPC's writes block as they would on a TCP
// socket (the stall watchdog then closes the connection here).
//
// What is parsed: the 24-byte client preface, then every frame's 9-byte
// header (length, type, flags, stream id) in both directions; payloads are
// skipped (no HPACK: a HEADERS frame cannot be dropped, the compression
// state is shared, so a breach closes the whole connection).
#include "relay.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace relay {
namespace {

const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceLen = 24;
enum { F_DATA = 0, F_HEADERS = 1, F_RST = 3, F_CONTINUATION = 9 };
constexpr uint8_t END_STREAM = 1, END_HEADERS = 4;
constexpr uint64_t kListenTag = ~0ull, kWakeTag = ~0ull - 1;
constexpr uint32_t kMaxHeaderBlock = 16 << 10;  // HEADERS + CONTINUATION of one block
constexpr int64_t kLogIntervalNs = 10'000'000'000;  // one line per address per 10 s

int64_t now_ns()
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// gRPC's spelling of a socket address: "ipv4:127.0.0.1:5555",
// "ipv6:[::1]:5555" (an IPv4-mapped IPv6 address as IPv4).
std::string peer_uri(const struct sockaddr_storage &ss)
{
    char host[INET6_ADDRSTRLEN] = "";
    if (ss.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const struct sockaddr_in6 *>(&ss);
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
            inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
            return std::string("ipv4:") + host + ":" + std::to_string(ntohs(a->sin6_port));
        }
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        return std::string("ipv6:[") + host + "]:" + std::to_string(ntohs(a->sin6_port));
    }
    if (ss.ss_family == AF_INET) {
        const auto *a = reinterpret_cast<const struct sockaddr_in *>(&ss);
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        return std::string("ipv4:") + host + ":" + std::to_string(ntohs(a->sin_port));
    }
    return "unknown";
}

// A byte buffer of fixed capacity: [beg, end) is the data. Not
// initialized: its pages become resident only as far as they are used.
struct Buf {
    std::unique_ptr<char[]> d;
    size_t cap = 0, beg = 0, end = 0;
    void init(size_t n)
    {
        d.reset(new char[n]);
        cap = n;
    }
    size_t len() const { return end - beg; }
    // Room at the tail, compacted first when the head has been consumed.
    size_t room()
    {
        if (beg == end)
            beg = end = 0;
        else if (end == cap && beg > 0) {
            memmove(d.get(), d.get() + beg, end - beg);
            end -= beg;
            beg = 0;
        }
        return cap - end;
    }
    char *tail() { return d.get() + end; }
    char *head() { return d.get() + beg; }
};

// The frame headers of one direction: nine header bytes gathered, then
// the payload skipped.
struct FrameReader {
    uint8_t hdr[9];
    unsigned have = 0;
    uint32_t skip = 0;
    // Calls on(type, flags, stream, length) for each header completed in [p, p+n);
    // stops (false) when on does.
    template <class F> bool feed(const char *p, size_t n, F &&on)
    {
        while (n) {
            if (skip) {
                size_t k = n < skip ? n : skip;
                skip -= (uint32_t)k;
                p += k;
                n -= k;
                continue;
            }
            hdr[have++] = (uint8_t)*p++;
            n--;
            if (have < 9)
                continue;
            have = 0;
            skip = ((uint32_t)hdr[0] << 16) | ((uint32_t)hdr[1] << 8) | hdr[2];
            uint32_t sid = (((uint32_t)hdr[5] << 24) | ((uint32_t)hdr[6] << 16) |
                            ((uint32_t)hdr[7] << 8) | hdr[8]) & 0x7fffffffu;
            if (!on(hdr[3], hdr[4], sid, skip))
                return false;
        }
        return true;
    }
};

struct Conn {
    uint64_t id;
    int cfd = -1;     // the client's socket
    int gfd = -1;     // our end of the socketpair (-1 until handed off)
    std::string gpeer;  // gRPC's peer string of the other end: "fd:N"
    std::string peer, addr;  // "ipv4:A:P", "ipv4:A"
    SSL *ssl = nullptr;
    bool hs_done = false;
    bool ssl_read_wants_out = false, ssl_write_wants_in = false;
    Buf up, down;  // client -> gRPC, gRPC -> client
    size_t preface_have = 0;
    FrameReader cr, sr;
    // An open stream: waiting for its request since (0: arrived), the
    // request bytes (DATA) it holds at gRPC until the server ends it.
    struct Stream {
        int64_t since;
        uint64_t bytes;
    };
    std::unordered_map<uint32_t, Stream> open;
    uint64_t held = 0;         // the open streams' request bytes
    uint32_t header_block = 0; // the bytes of the header block in progress
    bool in_block = false;
    uint32_t last_stream = 0;
    int64_t accepted_ns = 0, grpc_eof_ns = 0;
    bool client_eof = false, grpc_eof = false;
    // gRPC closed its end: epoll reports a hang-up whatever the mask, so
    // its fd left the set; what it sent last is read on the client's events
    bool grpc_hup = false;
    uint32_t cmask = 0, gmask = 0;
};

}  // namespace

struct Relay::Impl {
    Limits lim;
    Counters *ct;
    SSL_CTX *tls;
    std::function<void(int)> hand_off;
    int lfd = -1, ep = -1, wake = -1;
    std::thread th;
    std::atomic<bool> stopping{false};
    uint64_t next_id = 1;
    std::unordered_map<uint64_t, Conn *> conns;
    std::map<std::string, unsigned> per_addr;
    std::map<std::string, std::pair<int64_t, uint64_t>> logged;  // addr -> last line, suppressed since
    bool accept_paused = false;
    int64_t accept_resume_ns = 0;

    std::atomic<bool> no_new{false};  // refuse_new() called
    std::mutex hand_mu;               // held around hand_off: refuse_new waits for it
    std::mutex mu;  // guards by_gpeer and cmds (read and written from other threads)
    std::unordered_map<std::string, std::pair<std::string, uint64_t>> by_gpeer;  // -> peer, id
    std::vector<std::string> cmds;  // gpeers to close; "*": all

    void log(const std::string &addr, const char *why)
    {
        if (lim.quiet)
            return;
        int64_t now = now_ns();
        if (logged.size() > 4096)
            logged.clear();
        auto &e = logged[addr];
        if (e.first && now - e.first < kLogIntervalNs) {
            e.second++;
            return;
        }
        if (e.second)
            fprintf(stderr, "sluice serve: refused %s: %s (and %llu more in the last 10 s)\n",
                    addr.c_str(), why, (unsigned long long)e.second);
        else
            fprintf(stderr, "sluice serve: refused %s: %s\n", addr.c_str(), why);
        e.first = now;
        e.second = 0;
    }

    void set_mask(int fd, uint64_t tag, uint32_t *cur, uint32_t want)
    {
        if (fd < 0 || *cur == want)
            return;
        struct epoll_event ev = {};
        ev.events = want;
        ev.data.u64 = tag;
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
        *cur = want;
    }

    void drop(Conn *c, bool reset)
    {
        if (reset) {
            struct linger lg = {1, 0};
            setsockopt(c->cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        if (c->ssl)
            SSL_free(c->ssl);
        close(c->cfd);
        if (c->gfd >= 0)
            close(c->gfd);
        {
            std::lock_guard<std::mutex> g(mu);
            auto it = by_gpeer.find(c->gpeer);
            if (it != by_gpeer.end() && it->second.second == c->id)
                by_gpeer.erase(it);
        }
        auto pa = per_addr.find(c->addr);
        if (pa != per_addr.end() && --pa->second == 0)
            per_addr.erase(pa);
        conns.erase(c->id);
        ct->connections--;
        delete c;
    }

    void refuse(Conn *c, std::atomic<uint64_t> *counter, const char *why)
    {
        (*counter)++;
        log(c->addr, why);
        drop(c, true);
    }

    void on_accept()
    {
        for (;;) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            int fd = accept4(lfd, reinterpret_cast<struct sockaddr *>(&ss), &sl,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    // Out of descriptors: stop accepting for 100 ms (level-triggered, the
                    // listening socket would wake us in a loop).
                    struct epoll_event ev = {};
                    ev.data.u64 = kListenTag;
                    epoll_ctl(ep, EPOLL_CTL_MOD, lfd, &ev);
                    accept_paused = true;
                    accept_resume_ns = now_ns() + 100'000'000;
                }
                return;
            }
            if (no_new.load()) {  // shutting down
                close(fd);
                continue;
            }
            std::string peer = peer_uri(ss);
            std::string addr = peer.substr(0, peer.rfind(':'));
            unsigned &n = per_addr[addr];
            if (conns.size() >= lim.max_connections || n >= lim.max_connections_per_address) {
                bool all = conns.size() >= lim.max_connections;
                if (n == 0)
                    per_addr.erase(addr);
                ct->refused_connections++;
                log(addr, all ? "too many connections (--max-connections): closed"
                              : "too many connections from this address "
                                "(--max-connections-per-address): closed");
                struct linger lg = {1, 0};
                setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
                close(fd);
                continue;
            }
            n++;
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (lim.user_timeout_ms)
                setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &lim.user_timeout_ms,
                           sizeof lim.user_timeout_ms);
            Conn *c = new Conn;
            c->id = next_id++;
            c->cfd = fd;
            c->peer = peer;
            c->addr = addr;
            c->accepted_ns = now_ns();
            c->up.init(lim.buffer_bytes);
            c->down.init(lim.buffer_bytes);
            conns[c->id] = c;
            ct->connections++;
            if (tls) {
                c->ssl = SSL_new(tls);
                if (!c->ssl) {
                    ERR_clear_error();
                    refuse(c, &ct->refused_tls, "TLS: out of memory");
                    continue;
                }
                SSL_set_fd(c->ssl, fd);
                SSL_set_accept_state(c->ssl);
                SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE |
                                         SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
            } else {
                c->hs_done = true;
            }
            struct epoll_event ev = {};
            ev.events = EPOLLIN;
            ev.data.u64 = c->id * 2;
            c->cmask = EPOLLIN;
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
            pump(c);
        }
    }

    // The socketpair, its other end given to gRPC (once the preface is in).
    bool connect_grpc(Conn *c)
    {
        std::lock_guard<std::mutex> hg(hand_mu);
        if (no_new.load())
            return false;
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
            return false;
        c->gfd = sv[0];
        c->gpeer = "fd:" + std::to_string(sv[1]);
        {
            std::lock_guard<std::mutex> g(mu);
            by_gpeer[c->gpeer] = {c->peer, c->id};
        }
        struct epoll_event ev = {};
        ev.events = EPOLLIN;
        ev.data.u64 = c->id * 2 + 1;
        c->gmask = EPOLLIN;
        epoll_ctl(ep, EPOLL_CTL_ADD, c->gfd, &ev);
        hand_off(sv[1]);
        return true;
    }

    // The client's frames, as they arrive (before gRPC sees them).
    // Returns the refusal's reason, or nullptr.
    const char *client_frames(Conn *c, const char *p, size_t n, std::atomic<uint64_t> **counter)
    {
        if (c->preface_have < kPrefaceLen) {
            size_t k = std::min(n, kPrefaceLen - c->preface_have);
            if (memcmp(p, kPreface + c->preface_have, k) != 0) {
                *counter = &ct->refused_protocol;
                return "not an HTTP/2 client preface: closed";
            }
            c->preface_have += k;
            p += k;
            n -= k;
        }
        const char *why = nullptr;
        int64_t now = now_ns();
        c->cr.feed(p, n, [&](uint8_t type, uint8_t flags, uint32_t sid, uint32_t len) {
            if (type == F_HEADERS || (type == F_CONTINUATION && c->in_block)) {
                c->header_block = (type == F_HEADERS ? 0 : c->header_block) + len;
                c->in_block = !(flags & END_HEADERS);
                if (c->header_block > kMaxHeaderBlock) {
                    *counter = &ct->refused_protocol;
                    why = "HTTP/2: a header block over 16 KiB: closed";
                    return false;
                }
            }
            if (type == F_DATA) {
                auto it = c->open.find(sid);
                if (it != c->open.end()) {
                    it->second.bytes += len;
                    c->held += len;
                    if (c->held > lim.max_request_bytes_held) {
                        *counter = &ct->refused_streams;
                        why = "HTTP/2: more request bytes in open streams than the bound: closed";
                        return false;
                    }
                }
            }
            if (type == F_HEADERS && sid > c->last_stream) {
                if (sid % 2 == 0) {
                    *counter = &ct->refused_protocol;
                    why = "HTTP/2: an even stream id from the client: closed";
                    return false;
                }
                c->last_stream = sid;
                if (c->open.size() >= lim.max_open_streams) {
                    *counter = &ct->refused_streams;
                    why = "HTTP/2: too many open streams on one connection: closed";
                    return false;
                }
                c->open[sid] = Conn::Stream{(flags & END_STREAM) ? 0 : now, 0};
            } else if ((type == F_HEADERS || type == F_DATA) && (flags & END_STREAM)) {
                auto it = c->open.find(sid);
                if (it != c->open.end())
                    it->second.since = 0;
            } else if (type == F_RST) {
                close_stream(c, sid);
            }
            return true;
        });
        return why;
    }

    static void close_stream(Conn *c, uint32_t sid)
    {
        auto it = c->open.find(sid);
        if (it == c->open.end())
            return;
        c->held -= it->second.bytes;
        c->open.erase(it);
    }

    void server_frames(Conn *c, const char *p, size_t n)
    {
        c->sr.feed(p, n, [&](uint8_t type, uint8_t flags, uint32_t sid, uint32_t) {
            if (type == F_RST || ((type == F_HEADERS || type == F_DATA) && (flags & END_STREAM)))
                close_stream(c, sid);
            return true;
        });
    }

    // Moves what can move without blocking, in all four directions; then
    // the epoll interests. false: the connection is gone.
    bool pump(Conn *c)
    {
        if (c->ssl && !c->hs_done) {
            int r = SSL_do_handshake(c->ssl);
            if (r != 1) {
                int e = SSL_get_error(c->ssl, r);
                ERR_clear_error();
                if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                    set_mask(c->cfd, c->id * 2, &c->cmask,
                             e == SSL_ERROR_WANT_READ ? EPOLLIN : EPOLLOUT);
                    return true;
                }
                refuse(c, &ct->refused_tls, "TLS handshake failed: closed");
                return false;
            }
            c->hs_done = true;
        }
        for (bool moved = true; moved;) {
            moved = false;
            // client -> up
            if (!c->client_eof && c->up.room()) {
                size_t room = c->up.room();
                ssize_t r;
                bool eof = false, err = false;
                if (c->ssl) {
                    c->ssl_read_wants_out = false;
                    r = SSL_read(c->ssl, c->up.tail(), (int)room);
                    if (r <= 0) {
                        int e = SSL_get_error(c->ssl, (int)r);
                        if (e == SSL_ERROR_WANT_WRITE)
                            c->ssl_read_wants_out = true;
                        else if (e == SSL_ERROR_ZERO_RETURN)
                            eof = true;
                        else if (e != SSL_ERROR_WANT_READ)
                            err = true;
                        ERR_clear_error();
                    }
                } else {
                    r = recv(c->cfd, c->up.tail(), room, 0);
                    if (r == 0)
                        eof = true;
                    else if (r < 0 && errno != EAGAIN && errno != EINTR)
                        err = true;
                }
                if (err) {
                    drop(c, false);
                    return false;
                }
                if (eof)
                    c->client_eof = true;
                if (r > 0) {
                    std::atomic<uint64_t> *counter = nullptr;
                    if (const char *why = client_frames(c, c->up.tail(), (size_t)r, &counter)) {
                        refuse(c, counter, why);
                        return false;
                    }
                    c->up.end += (size_t)r;
                    moved = true;
                    if (c->gfd < 0 && c->preface_have == kPrefaceLen && !connect_grpc(c)) {
                        drop(c, true);
                        return false;
                    }
                }
            }
            // up -> gRPC
            if (c->gfd >= 0 && c->up.len()) {
                ssize_t w = send(c->gfd, c->up.head(), c->up.len(), MSG_NOSIGNAL);
                if (w > 0) {
                    c->up.beg += (size_t)w;
                    moved = true;
                } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                    drop(c, true);
                    return false;
                }
            }
            // gRPC -> down
            if (c->gfd >= 0 && !c->grpc_eof && c->down.room()) {
                ssize_t r = recv(c->gfd, c->down.tail(), c->down.room(), 0);
                if (r > 0) {
                    server_frames(c, c->down.tail(), (size_t)r);
                    c->down.end += (size_t)r;
                    moved = true;
                } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                    c->grpc_eof = true;
                    c->grpc_eof_ns = now_ns();
                }
            }
            // down -> client
            if (c->down.len()) {
                ssize_t w;
                bool err = false;
                if (c->ssl) {
                    c->ssl_write_wants_in = false;
                    w = SSL_write(c->ssl, c->down.head(), (int)c->down.len());
                    if (w <= 0) {
                        int e = SSL_get_error(c->ssl, (int)w);
                        if (e == SSL_ERROR_WANT_READ)
                            c->ssl_write_wants_in = true;
                        else if (e != SSL_ERROR_WANT_WRITE)
                            err = true;
                        ERR_clear_error();
                    }
                } else {
                    w = send(c->cfd, c->down.head(), c->down.len(), MSG_NOSIGNAL);
                    if (w < 0 && errno != EAGAIN && errno != EINTR)
                        err = true;
                }
                if (err) {
                    drop(c, true);
                    return false;
                }
                if (w > 0) {
                    c->down.beg += (size_t)w;
                    moved = true;
                }
            }
        }
        // A side that ended: what is buffered for the other goes first.
        if ((c->client_eof && c->up.len() == 0) || (c->grpc_eof && c->down.len() == 0)) {
            drop(c, false);
            return false;
        }
        uint32_t cm = 0, gm = 0;
        if ((!c->client_eof && c->up.room()) || c->ssl_write_wants_in)
            cm |= EPOLLIN;
        if (c->down.len() || c->ssl_read_wants_out)
            cm |= EPOLLOUT;
        if (!c->grpc_eof && c->down.room())
            gm |= EPOLLIN;
        if (c->up.len())
            gm |= EPOLLOUT;
        set_mask(c->cfd, c->id * 2, &c->cmask, cm);
        if (!c->grpc_hup)
            set_mask(c->gfd, c->id * 2 + 1, &c->gmask, gm);
        return true;
    }

    // Every 0.2 s: the preface and each stream's request within
    // --request-timeout; a gRPC side that ended within it too.
    void sweep()
    {
        int64_t now = now_ns(), to = (int64_t)(lim.request_timeout_s * 1e9);
        if (accept_paused && now >= accept_resume_ns) {
            struct epoll_event ev = {};
            ev.events = EPOLLIN;
            ev.data.u64 = kListenTag;
            epoll_ctl(ep, EPOLL_CTL_MOD, lfd, &ev);
            accept_paused = false;
        }
        std::vector<Conn *> late, flushed;
        for (auto &kv : conns) {
            Conn *c = kv.second;
            if (c->preface_have < kPrefaceLen) {
                if (now - c->accepted_ns > to)
                    late.push_back(c);
                continue;
            }
            if ((c->grpc_eof || c->grpc_hup) && now - c->grpc_eof_ns > to) {
                flushed.push_back(c);
                continue;
            }
            for (auto &s : c->open)
                if (s.second.since && now - s.second.since > to) {
                    late.push_back(c);
                    break;
                }
        }
        for (Conn *c : late)
            refuse(c, &ct->refused_timeout,
                   c->preface_have < kPrefaceLen
                       ? "no HTTP/2 preface within --request-timeout: closed"
                       : "HTTP/2: a stream's request did not arrive within --request-timeout: closed");
        for (Conn *c : flushed)
            drop(c, true);
    }

    void commands()
    {
        uint64_t v;
        if (read(wake, &v, sizeof v) < 0) {
            // nothing to take: a spurious wake-up
        }
        std::vector<std::string> todo;
        {
            std::lock_guard<std::mutex> g(mu);
            todo.swap(cmds);
        }
        for (const std::string &gp : todo) {
            if (gp == "*") {
                std::vector<Conn *> all;
                for (auto &kv : conns)
                    all.push_back(kv.second);
                for (Conn *c : all)
                    drop(c, true);
                continue;
            }
            uint64_t id = 0;
            {
                std::lock_guard<std::mutex> g(mu);
                auto it = by_gpeer.find(gp);
                if (it != by_gpeer.end())
                    id = it->second.second;
            }
            auto it = conns.find(id);
            if (it != conns.end())
                drop(it->second, true);
        }
    }

    void loop()
    {
        struct epoll_event evs[64];
        int64_t next_sweep = now_ns();
        while (!stopping.load()) {
            int n = epoll_wait(ep, evs, 64, 200);
            for (int i = 0; i < n; i++) {
                uint64_t tag = evs[i].data.u64;
                if (tag == kListenTag) {
                    on_accept();
                } else if (tag == kWakeTag) {
                    commands();
                } else {
                    auto it = conns.find(tag / 2);
                    if (it == conns.end())
                        continue;  // closed earlier in this batch
                    Conn *c = it->second;
                    if ((evs[i].events & (EPOLLERR | EPOLLHUP)) && !(evs[i].events & EPOLLIN)) {
                        if (tag % 2 == 0) {
                            drop(c, true);
                            continue;
                        }
                        // gRPC's end: its last bytes (statuses, GOAWAY) are
                        // still to reach the client; the sweep bounds how long
                        if (!c->grpc_hup) {
                            epoll_ctl(ep, EPOLL_CTL_DEL, c->gfd, nullptr);
                            c->grpc_hup = true;
                            c->gmask = 0;
                            c->grpc_eof_ns = now_ns();
                        }
                    }
                    pump(c);
                }
            }
            if (now_ns() >= next_sweep) {
                sweep();
                next_sweep = now_ns() + 200'000'000;
            }
        }
    }

    void wake_up(const std::string &cmd)
    {
        {
            std::lock_guard<std::mutex> g(mu);
            cmds.push_back(cmd);
        }
        uint64_t one = 1;
        if (write(wake, &one, sizeof one) < 0) {
            // the counter is full: a wake-up is pending anyway
        }
    }
};

Relay::Relay(const Limits &lim, Counters *counters, SSL_CTX *tls, std::function<void(int)> hand_off)
    : p_(new Impl)
{
    p_->lim = lim;
    p_->ct = counters;
    p_->tls = tls;
    p_->hand_off = std::move(hand_off);
}

Relay::~Relay()
{
    stop();
}

bool Relay::listen(const std::string &addr, unsigned *port, std::string *err)
{
    size_t colon = addr.rfind(':');
    if (colon == std::string::npos) {
        *err = "no :PORT";
        return false;
    }
    std::string host = addr.substr(0, colon), svc = addr.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host.empty() ? nullptr : host.c_str(), svc.c_str(), &hints, &res);
    if (g != 0) {
        *err = gai_strerror(g);
        return false;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0)
            break;
        *err = strerror(errno);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return false;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, reinterpret_cast<struct sockaddr *>(&ss), &sl);
    *port = ss.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<struct sockaddr_in6 *>(&ss)->sin6_port)
                : ntohs(reinterpret_cast<struct sockaddr_in *>(&ss)->sin_port);
    p_->lfd = fd;
    return true;
}

void Relay::start()
{
    Impl *p = p_.get();
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    p->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenTag;
    epoll_ctl(p->ep, EPOLL_CTL_ADD, p->lfd, &ev);
    ev.data.u64 = kWakeTag;
    epoll_ctl(p->ep, EPOLL_CTL_ADD, p->wake, &ev);
    p->th = std::thread([p] { p->loop(); });
}

void Relay::refuse_new()
{
    p_->no_new = true;
    std::lock_guard<std::mutex> g(p_->hand_mu);
}

void Relay::stop()
{
    Impl *p = p_.get();
    if (p->th.joinable()) {
        p->stopping = true;
        p->wake_up("*");
        p->th.join();
    }
    std::vector<Conn *> all;
    for (auto &kv : p->conns)
        all.push_back(kv.second);
    for (Conn *c : all)
        p->drop(c, true);
    for (int *fd : {&p->lfd, &p->ep, &p->wake})
        if (*fd >= 0) {
            close(*fd);
            *fd = -1;
        }
}

std::string Relay::client_of(const std::string &grpc_peer)
{
    std::lock_guard<std::mutex> g(p_->mu);
    auto it = p_->by_gpeer.find(grpc_peer);
    return it == p_->by_gpeer.end() ? grpc_peer : it->second.first;
}

void Relay::close_connection(const std::string &grpc_peer)
{
    p_->wake_up(grpc_peer);
}

void Relay::close_all()
{
    p_->wake_up("*");
}

}  // namespace relay
