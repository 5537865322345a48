// relay.cc: the TCP front of `sluice serve` (see relay.h). One thread, one
// epoll set, level-triggered, non-blocking sockets. Per connection: the
// client's socket (TLS over it when configured), our end of a socketpair
// whose other end gRPC serves as a plaintext HTTP/2 connection, and two
// bounded buffers (client to gRPC, gRPC to client). A full buffer stops
// the reading of its source: a client that does not read stops the relay
// reading gRPC's answers, and gRPC's writes block as they would on a TCP
// socket (the stall watchdog then closes the connection here).
//
// A client that does not read also stops being read: while the buffer
// towards it is full, nothing more of its bytes reaches gRPC (whose
// answers to PINGs and SETTINGS would otherwise queue without bound), and
// bytes it takes none of for peer_read_timeout_s close the connection.
//
// What is parsed: the 24-byte client preface, then every frame's 9-byte
// header (length, type, flags, stream id) in both directions; payloads are
// skipped (no HPACK: a HEADERS frame cannot be dropped, the compression
// state is shared, so a breach closes the whole connection). The relay
// writes one frame of its own: a GOAWAY (ENHANCE_YOUR_CALM for a flood,
// NO_ERROR for an idle connection), put between two of gRPC's frames, after
// which gRPC's end is closed and the connection is closed once the client
// has it (at most kGoawayFlushNs).
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
enum {
    F_DATA = 0, F_HEADERS = 1, F_PRIORITY = 2, F_RST = 3, F_SETTINGS = 4, F_PING = 6,
    F_GOAWAY = 7, F_WINDOW_UPDATE = 8, F_CONTINUATION = 9
};
constexpr uint8_t ACK = 1;
enum { H2_NO_ERROR = 0, H2_ENHANCE_YOUR_CALM = 0xb };
constexpr uint8_t END_STREAM = 1, END_HEADERS = 4;
constexpr uint64_t kListenTag = ~0ull, kWakeTag = ~0ull - 1;
constexpr uint32_t kMaxHeaderBlock = 16 << 10;  // HEADERS + CONTINUATION of one block
constexpr int64_t kLogIntervalNs = 10'000'000'000;  // one line per address per 10 s
// A connection being closed with a GOAWAY: its client has this long to
// take it (and what gRPC had sent before it), then the connection is reset.
constexpr int64_t kGoawayFlushNs = 1'000'000'000;
// A connection must have been idle this long to be closed for a newcomer
// when a cap is reached.
constexpr int64_t kEvictMinIdleNs = 1'000'000'000;
// WINDOW_UPDATEs the client may send free of the control-frame budget per
// DATA frame of the server's (one for the stream, one for the connection),
// and at most this many banked.
constexpr uint32_t kWindowUpdatesPerData = 2, kMaxWindowUpdateCredit = 4096;
// PING and SETTINGS ACKs the client may send free of the control-frame
// budget: one per PING or SETTINGS of the server's, at most this many banked.
constexpr uint32_t kMaxAckCredit = 64;
// TCP_NOTSENT_LOWAT of client sockets: bytes not yet sent that the kernel
// keeps for a client.
constexpr size_t kUnsentBytes = 128 << 10;

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

}  // namespace

std::string address_key(const std::string &peer)
{
    std::string addr = peer.substr(0, peer.rfind(':'));
    const std::string v6 = "ipv6:[";
    if (addr.compare(0, v6.size(), v6) != 0 || addr.back() != ']')
        return addr;
    std::string host = addr.substr(v6.size(), addr.size() - v6.size() - 1);
    struct in6_addr a;
    if (inet_pton(AF_INET6, host.c_str(), &a) != 1)
        return addr;
    memset(&a.s6_addr[8], 0, 8);
    char out[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a, out, sizeof out);
    return v6 + out + "]/64";
}

namespace {

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
    // Bytes to the end of the frame in progress (of its header first,
    // when that is incomplete); 0: at a frame boundary.
    uint32_t to_boundary() const { return have ? 9 - have : skip; }
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
    // request bytes (DATA) it holds at gRPC until the server ends it, when
    // the client reset it (0: not; it stays open until the server ends it
    // or a window has passed: gRPC may still hold its call).
    struct Stream {
        int64_t since;
        uint64_t bytes;
        int64_t reset_ns;
    };
    std::unordered_map<uint32_t, Stream> open;
    unsigned open_reset = 0;   // of them, reset by the client
    uint64_t held = 0;         // the open streams' request bytes
    int64_t idle_since_ns = 0; // open has been empty since (when it is)
    // The window of the flood bounds: its start, the client's resets and
    // control frames in it, and WINDOW_UPDATEs earned by the server's DATA.
    int64_t window_start_ns = 0;
    unsigned resets = 0, control_frames = 0;
    uint32_t window_update_credit = 0;
    uint32_t ack_credit = 0;  // ACKs earned by the server's PINGs and SETTINGS
    int64_t down_progress_ns = 0;  // the last time bytes went to the client
    // Being closed with a GOAWAY: the frame is
    // still to be written (after gRPC's frame in progress), the client's
    // end shut for writing, the deadline of it all.
    bool closing = false, goaway_pending = false, fin_sent = false, slot_held = true;
    uint32_t goaway_code = 0;
    int64_t close_deadline_ns = 0;
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
    size_t slots = 0;  // connections counted by the caps (all but those closed for a newcomer)
    std::map<std::string, unsigned> per_addr;
    std::map<std::string, std::pair<int64_t, uint64_t>> logged;  // addr -> last line, suppressed since
    bool accept_paused = false;
    int64_t accept_resume_ns = 0;

    std::atomic<bool> no_new{false};  // refuse_new() called
    std::mutex hand_mu;               // held around hand_off: refuse_new waits for it
    std::mutex mu;  // guards by_gpeer and cmds (read and written from other threads)
    std::unordered_map<std::string, std::pair<std::string, uint64_t>> by_gpeer;  // -> peer, id
    std::vector<uint64_t> cmds;  // connection ids to close; kCloseAll: all
    static constexpr uint64_t kCloseAll = 0;

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
        release_slot(c);
        conns.erase(c->id);
        ct->connections--;
        delete c;
    }

    // The connection no longer counts against the caps (closed, or being).
    void release_slot(Conn *c)
    {
        if (!c->slot_held)
            return;
        c->slot_held = false;
        slots--;
        auto pa = per_addr.find(c->addr);
        if (pa != per_addr.end() && --pa->second == 0)
            per_addr.erase(pa);
    }

    void close_grpc(Conn *c)
    {
        if (c->gfd < 0)
            return;
        if (!c->grpc_hup)
            epoll_ctl(ep, EPOLL_CTL_DEL, c->gfd, nullptr);
        close(c->gfd);
        c->gfd = -1;
        c->grpc_eof = c->grpc_hup = true;
        c->gmask = 0;
    }

    // Closes the connection with a GOAWAY (code): nothing more reaches
    // gRPC, whose end is closed once its frame in progress is relayed and
    // the GOAWAY follows it; the client has kGoawayFlushNs to take them.
    // A connection whose preface has not all come is reset at once; one
    // whose preface came in the same read as the frames refused (gRPC has
    // not seen it) gets the relay's own server preface (an empty SETTINGS)
    // and the GOAWAY. free_slot: its slot goes to a newcomer now (else
    // when it is gone, so that closing connections too are bounded by the
    // caps).
    void goaway(Conn *c, uint32_t code, std::atomic<uint64_t> *counter, const char *why,
                bool free_slot = false)
    {
        (*counter)++;
        log(c->addr, why);
        c->goaway_code = code;
        if (c->gfd < 0) {
            c->down.beg = c->down.end = 0;
            if (c->preface_have < kPrefaceLen || c->down.room() < 9 + 17) {
                drop(c, true);
                return;
            }
            c->last_stream = 0;  // none of its streams reached gRPC
            const uint8_t settings[9] = {0, 0, 0, F_SETTINGS, 0, 0, 0, 0, 0};
            memcpy(c->down.tail(), settings, sizeof settings);
            c->down.end += sizeof settings;
            put_goaway(c);
            c->closing = true;
        } else {
            c->closing = c->goaway_pending = true;
        }
        c->close_deadline_ns = now_ns() + kGoawayFlushNs;
        c->up.beg = c->up.end = 0;
        if (free_slot)
            release_slot(c);
        pump(c);
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
            std::string addr = address_key(peer);
            // At a cap, the connection idle longest (of that address, for
            // its cap) makes room for this one.
            bool over_address = per_addr.count(addr) &&
                                per_addr[addr] >= lim.max_connections_per_address;
            if (over_address || slots >= lim.max_connections)
                evict_idle(over_address ? &addr : nullptr);
            unsigned &n = per_addr[addr];
            if (slots >= lim.max_connections || n >= lim.max_connections_per_address) {
                bool all = slots >= lim.max_connections;
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
            slots++;
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            // What waits in the kernel for a client that does not read is
            // bounded (what is in flight is not: a long fat link keeps its
            // speed); past it the relay's buffer fills, and the client is
            // no longer read.
            int lowat = (int)kUnsentBytes;
            setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
            if (lim.user_timeout_ms)
                setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &lim.user_timeout_ms,
                           sizeof lim.user_timeout_ms);
            Conn *c = new Conn;
            c->id = next_id++;
            c->cfd = fd;
            c->peer = peer;
            c->addr = addr;
            c->accepted_ns = c->idle_since_ns = c->window_start_ns = now_ns();
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
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
                // A client's end of stream without its close_notify is a
                // half-close like one with it (read_client): without this
                // OpenSSL 3 takes it for a fatal error (it sends a
                // decode_error alert) and every later SSL_write fails, so
                // the answer to the request before it never went out.
                // HTTP/2's frames show a truncation on their own.
                SSL_set_options(c->ssl, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
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

    // Closes, for a newcomer, the connection with no open stream idle
    // longest (at least kEvictMinIdleNs), of the address *addr if given.
    void evict_idle(const std::string *addr)
    {
        int64_t now = now_ns();
        Conn *victim = nullptr;
        for (auto &kv : conns) {
            Conn *c = kv.second;
            if (c->closing || !c->open.empty() || now - c->idle_since_ns < kEvictMinIdleNs ||
                (addr && c->addr != *addr))
                continue;
            if (!victim || c->idle_since_ns < victim->idle_since_ns)
                victim = c;
        }
        if (victim)
            goaway(victim, H2_NO_ERROR, &ct->refused_idle,
                   "idle while the connections are at their cap: closed for a new one", true);
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
        if (now - c->window_start_ns > (int64_t)(lim.window_s * 1e9)) {
            c->window_start_ns = now;
            c->resets = c->control_frames = 0;
        }
        c->cr.feed(p, n, [&](uint8_t type, uint8_t flags, uint32_t sid, uint32_t len) {
            bool control = type == F_PRIORITY || ((type == F_PING || type == F_SETTINGS) && !(flags & ACK));
            if (type == F_WINDOW_UPDATE) {
                if (c->window_update_credit)
                    c->window_update_credit--;
                else
                    control = true;
            }
            if ((type == F_PING || type == F_SETTINGS) && (flags & ACK)) {
                if (c->ack_credit)
                    c->ack_credit--;
                else
                    control = true;  // an ACK of nothing the server sent
            }
            // Frames that carry nothing: each costs the server a parse and
            // the client 9 bytes (CVE-2019-9518): an empty DATA that does
            // not end an open stream, an empty HEADERS or CONTINUATION that
            // does not end its block, a RST_STREAM of a stream not open (or
            // reset already), and a frame of a type HTTP/2 does not define
            // (or a GOAWAY or PUSH_PROMISE: at most one in earnest).
            if ((type == F_DATA && len == 0 &&
                 (!(flags & END_STREAM) || !c->open.count(sid))) ||
                ((type == F_HEADERS || type == F_CONTINUATION) && len == 0 &&
                 !(flags & END_HEADERS)) ||
                (type == F_RST && (!c->open.count(sid) || c->open[sid].reset_ns)) ||
                type == F_GOAWAY || type == 5 || type > F_CONTINUATION)
                control = true;
            if (control && ++c->control_frames > lim.max_control_frames) {
                *counter = &ct->refused_control;
                why = "HTTP/2: more PING, SETTINGS, PRIORITY, WINDOW_UPDATE and empty frames "
                      "than --max-control-frames in 10 s: GOAWAY, closed";
                return false;
            }
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
                    if (c->open_reset) {  // held by streams it reset
                        *counter = &ct->refused_resets;
                        why = "HTTP/2: too many streams reset before the server ended them: "
                              "GOAWAY, closed";
                    } else {
                        *counter = &ct->refused_streams;
                        why = "HTTP/2: too many open streams on one connection: closed";
                    }
                    return false;
                }
                if (c->open.empty())
                    c->idle_since_ns = 0;
                c->open[sid] = Conn::Stream{(flags & END_STREAM) ? 0 : now, 0, 0};
            } else if ((type == F_HEADERS || type == F_DATA) && (flags & END_STREAM)) {
                auto it = c->open.find(sid);
                if (it != c->open.end())
                    it->second.since = 0;
            } else if (type == F_RST) {
                // Open until the server ends it too: gRPC 1.51 keeps the
                // call of a reset stream queued (CVE-2023-44487).
                auto it = c->open.find(sid);
                if (it != c->open.end() && !it->second.reset_ns) {
                    it->second.reset_ns = now;
                    it->second.since = 0;
                    c->open_reset++;
                    if (++c->resets > lim.max_resets) {
                        *counter = &ct->refused_resets;
                        why = "HTTP/2: more streams reset than --max-resets in 10 s: GOAWAY, closed";
                        return false;
                    }
                }
            }
            return true;
        });
        return why;
    }

    static void erase_stream(Conn *c, std::unordered_map<uint32_t, Conn::Stream>::iterator it,
                             int64_t now)
    {
        c->held -= it->second.bytes;
        if (it->second.reset_ns)
            c->open_reset--;
        c->open.erase(it);
        if (c->open.empty())
            c->idle_since_ns = now;
    }

    void server_frames(Conn *c, const char *p, size_t n)
    {
        c->sr.feed(p, n, [&](uint8_t type, uint8_t flags, uint32_t sid, uint32_t) {
            if (type == F_DATA && c->window_update_credit < kMaxWindowUpdateCredit)
                c->window_update_credit += kWindowUpdatesPerData;
            if ((type == F_PING || type == F_SETTINGS) && !(flags & ACK) &&
                c->ack_credit < kMaxAckCredit)
                c->ack_credit++;
            if (type == F_RST || ((type == F_HEADERS || type == F_DATA) && (flags & END_STREAM))) {
                auto it = c->open.find(sid);
                if (it != c->open.end())
                    erase_stream(c, it, now_ns());
            }
            return true;
        });
    }

    // Reads the client's bytes into up (TLS or not). -1: error, else the
    // bytes read (0: none now; *eof set at the client's end of stream).
    ssize_t read_client(Conn *c, char *into, size_t room, bool *eof)
    {
        if (!c->ssl) {
            ssize_t r = recv(c->cfd, into, room, 0);
            if (r == 0)
                *eof = true;
            else if (r < 0)
                return errno == EAGAIN || errno == EINTR ? 0 : -1;
            return r;
        }
        c->ssl_read_wants_out = false;
        int r = SSL_read(c->ssl, into, (int)room);
        if (r > 0)
            return r;
        int e = SSL_get_error(c->ssl, r);
        // A client's end of stream with or without its close_notify: a
        // half-close (HTTP/2 allows it), answered as one.
        bool unexpected_eof = (e == SSL_ERROR_SYSCALL && errno == 0) ||
                              (e == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_error()) ==
                                                          SSL_R_UNEXPECTED_EOF_WHILE_READING);
        ERR_clear_error();
        if (e == SSL_ERROR_WANT_WRITE)
            c->ssl_read_wants_out = true;
        else if (e == SSL_ERROR_ZERO_RETURN || unexpected_eof)
            *eof = true;
        else if (e != SSL_ERROR_WANT_READ)
            return -1;
        return 0;
    }

    // Writes what down holds to the client. -1: error, else the bytes written.
    ssize_t write_client(Conn *c)
    {
        ssize_t w;
        if (c->ssl) {
            c->ssl_write_wants_in = false;
            w = SSL_write(c->ssl, c->down.head(), (int)c->down.len());
            if (w <= 0) {
                int e = SSL_get_error(c->ssl, (int)w);
                ERR_clear_error();
                if (e == SSL_ERROR_WANT_READ)
                    c->ssl_write_wants_in = true;
                else if (e != SSL_ERROR_WANT_WRITE)
                    return -1;
                return 0;
            }
        } else {
            w = send(c->cfd, c->down.head(), c->down.len(), MSG_NOSIGNAL);
            if (w < 0)
                return errno == EAGAIN || errno == EINTR ? 0 : -1;
        }
        c->down.beg += (size_t)w;
        if (w > 0)
            c->down_progress_ns = now_ns();
        return w;
    }

    // Reads gRPC's bytes into down, at most max. -1: gRPC's end ended.
    ssize_t read_grpc(Conn *c, size_t max)
    {
        bool was_empty = c->down.len() == 0;
        ssize_t r = recv(c->gfd, c->down.tail(), std::min(max, c->down.room()), 0);
        if (r > 0) {
            server_frames(c, c->down.tail(), (size_t)r);
            c->down.end += (size_t)r;
            if (was_empty)
                c->down_progress_ns = now_ns();  // the client's time to read starts now
            return r;
        }
        if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
            c->grpc_eof = true;
            c->grpc_eof_ns = now_ns();
            return -1;
        }
        return 0;
    }

    // Appends the GOAWAY (goaway_code) to down (room for its 17 bytes).
    static void put_goaway(Conn *c)
    {
        uint8_t f[17] = {0, 0, 8, F_GOAWAY, 0, 0, 0, 0, 0};
        uint32_t v[2] = {htonl(c->last_stream), htonl(c->goaway_code)};
        memcpy(f + 9, v, 8);
        memcpy(c->down.tail(), f, sizeof f);
        c->down.end += sizeof f;
    }

    // A connection being closed with its GOAWAY: gRPC's frame in progress,
    // then the GOAWAY, to the client; gRPC's end closed; the client's input
    // read and dropped (so that the close is not a reset that could
    // discard the GOAWAY at the client) until its end, or the deadline.
    bool pump_closing(Conn *c)
    {
        if (c->goaway_pending) {
            while (c->gfd >= 0 && !c->grpc_eof && c->sr.to_boundary() && c->down.room())
                if (read_grpc(c, c->sr.to_boundary()) <= 0)
                    break;
            if (!c->sr.to_boundary() && c->down.room() >= 17) {
                put_goaway(c);
                c->goaway_pending = false;
                close_grpc(c);
            } else if (c->grpc_eof) {  // its frame will never end: no GOAWAY
                drop(c, true);
                return false;
            }
        }
        if (c->down.len() && write_client(c) < 0) {
            drop(c, true);
            return false;
        }
        if (!c->client_eof) {
            char sink[4096];
            for (int k = 0; k < 16; k++) {
                bool eof = false;
                ssize_t r = read_client(c, sink, sizeof sink, &eof);
                if (r < 0) {
                    drop(c, true);
                    return false;
                }
                c->client_eof = eof;
                if (r == 0)
                    break;
            }
        }
        if (!c->goaway_pending && !c->down.len() && !c->fin_sent) {
            if (c->ssl)
                SSL_shutdown(c->ssl);
            ERR_clear_error();
            shutdown(c->cfd, SHUT_WR);
            c->fin_sent = true;
        }
        if (c->fin_sent && c->client_eof) {
            drop(c, false);
            return false;
        }
        uint32_t cm = 0, gm = 0;
        if (!c->client_eof)
            cm |= EPOLLIN;
        if (c->down.len() || c->ssl_read_wants_out)
            cm |= EPOLLOUT;
        if (c->goaway_pending && c->down.room())
            gm |= EPOLLIN;
        set_mask(c->cfd, c->id * 2, &c->cmask, cm);
        if (c->gfd >= 0 && !c->grpc_hup)
            set_mask(c->gfd, c->id * 2 + 1, &c->gmask, gm);
        return true;
    }

    // Moves what can move without blocking, in all four directions; then
    // the epoll interests. false: the connection is gone.
    bool pump(Conn *c)
    {
        if (c->closing)
            return pump_closing(c);
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
            // client -> up, while the client takes what is sent to it:
            // else gRPC's answers to what it sends queue up at gRPC
            bool down_full = c->down.len() >= c->down.cap;
            if (!c->client_eof && !down_full && c->up.room()) {
                bool eof = false;
                ssize_t r = read_client(c, c->up.tail(), c->up.room(), &eof);
                if (r < 0) {
                    drop(c, false);
                    return false;
                }
                if (eof)
                    c->client_eof = true;
                if (r > 0) {
                    std::atomic<uint64_t> *counter = nullptr;
                    if (const char *why = client_frames(c, c->up.tail(), (size_t)r, &counter)) {
                        if (counter == &ct->refused_resets || counter == &ct->refused_control)
                            goaway(c, H2_ENHANCE_YOUR_CALM, counter, why);
                        else
                            refuse(c, counter, why);
                        return false;
                    }
                    c->up.end += (size_t)r;
                    moved = true;
                    if (c->gfd < 0 && c->preface_have == kPrefaceLen) {
                        if (!connect_grpc(c)) {
                            drop(c, true);
                            return false;
                        }
                        c->idle_since_ns = now_ns();
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
            if (c->gfd >= 0 && !c->grpc_eof && c->down.room() && read_grpc(c, c->down.room()) > 0)
                moved = true;
            // down -> client
            if (c->down.len()) {
                ssize_t w = write_client(c);
                if (w < 0) {
                    drop(c, true);
                    return false;
                }
                if (w > 0)
                    moved = true;
            }
        }
        // A side that ended: what is buffered for the other goes first. A
        // client that half-closed is answered: its streams stay until the
        // server ends them (gRPC never sees the client's end: it would
        // take it for the connection's).
        if ((c->client_eof && !c->up.len() && c->open.empty() && !c->down.len()) ||
            (c->grpc_eof && !c->down.len())) {
            drop(c, false);
            return false;
        }
        uint32_t cm = 0, gm = 0;
        if ((!c->client_eof && c->up.room() && c->down.len() < c->down.cap) ||
            c->ssl_write_wants_in)
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
    // --request-timeout; a gRPC side that ended within it too; the idle
    // timeout, a client that takes nothing sent to it, the streams reset a
    // window ago, a GOAWAY's deadline.
    void sweep()
    {
        int64_t now = now_ns(), to = (int64_t)(lim.request_timeout_s * 1e9);
        int64_t idle = (int64_t)(lim.idle_timeout_s * 1e9),
                not_reading = (int64_t)(lim.peer_read_timeout_s * 1e9),
                window = (int64_t)(lim.window_s * 1e9);
        if (accept_paused && now >= accept_resume_ns) {
            struct epoll_event ev = {};
            ev.events = EPOLLIN;
            ev.data.u64 = kListenTag;
            epoll_ctl(ep, EPOLL_CTL_MOD, lfd, &ev);
            accept_paused = false;
        }
        std::vector<Conn *> late, flushed, idled, stuck;
        for (auto &kv : conns) {
            Conn *c = kv.second;
            if (c->closing) {
                if (now > c->close_deadline_ns)
                    flushed.push_back(c);
                continue;
            }
            if (c->preface_have < kPrefaceLen) {
                if (now - c->accepted_ns > to)
                    late.push_back(c);
                continue;
            }
            if ((c->grpc_eof || c->grpc_hup) && now - c->grpc_eof_ns > to) {
                flushed.push_back(c);
                continue;
            }
            if (c->down.len() && now - c->down_progress_ns > not_reading) {
                stuck.push_back(c);
                continue;
            }
            for (auto it = c->open.begin(); it != c->open.end();) {
                auto next = std::next(it);
                if (it->second.reset_ns && now - it->second.reset_ns > window)
                    erase_stream(c, it, now);
                it = next;
            }
            if (c->open.empty() && now - c->idle_since_ns > idle) {
                idled.push_back(c);
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
        for (Conn *c : stuck)
            refuse(c, &ct->refused_not_reading,
                   "took nothing sent to it for --stall-timeout + 2 s: closed");
        for (Conn *c : idled)
            goaway(c, H2_NO_ERROR, &ct->refused_idle, "no open stream for --idle-timeout: GOAWAY, closed");
    }

    void commands()
    {
        uint64_t v;
        if (read(wake, &v, sizeof v) < 0) {
            // nothing to take: a spurious wake-up
        }
        std::vector<uint64_t> todo;
        {
            std::lock_guard<std::mutex> g(mu);
            todo.swap(cmds);
        }
        for (uint64_t id : todo) {
            if (id == kCloseAll) {
                std::vector<Conn *> all;
                for (auto &kv : conns)
                    all.push_back(kv.second);
                for (Conn *c : all)
                    drop(c, true);
                continue;
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

    void wake_up(uint64_t cmd)
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
        p->wake_up(Impl::kCloseAll);
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

std::string Relay::client_of(const std::string &grpc_peer, uint64_t *id)
{
    std::lock_guard<std::mutex> g(p_->mu);
    auto it = p_->by_gpeer.find(grpc_peer);
    if (id)
        *id = it == p_->by_gpeer.end() ? 0 : it->second.second;
    return it == p_->by_gpeer.end() ? grpc_peer : it->second.first;
}

void Relay::close_connection(uint64_t id)
{
    if (id)
        p_->wake_up(id);
}

void Relay::close_all()
{
    p_->wake_up(Impl::kCloseAll);
}

}  // namespace relay
