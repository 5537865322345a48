// relay.h: the TCP front of `sluice serve` (tools/serve/relay.cc). It owns
// the listening socket, accepts connections itself (caps in all and per
// client address), terminates TLS when configured, and relays each
// connection's bytes to gRPC through a socketpair, reading the HTTP/2
// frame headers (never their payload) in both directions so that a client
// cannot make gRPC hold more streams than the bounds below: gRPC 1.51
// holds every stream whose headers arrived, before any handler sees it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;

namespace relay {

struct Limits {
    unsigned max_connections = 128;
    unsigned max_connections_per_address = 32;
    unsigned max_open_streams = 64;  // per connection: streams opened and not yet closed
    double request_timeout_s = 10;   // a stream's request (client END_STREAM) within this
    uint64_t max_request_bytes_held = 2 << 20;  // per connection: DATA of streams not yet ended
    unsigned user_timeout_ms = 0;    // TCP_USER_TIMEOUT of client sockets (0: the kernel's)
    size_t buffer_bytes = 256 << 10; // each way, per connection
    // A connection with no open stream for this long gets a GOAWAY and is
    // closed; when a connection cap is reached, the connection idle longest
    // (at least 1 s) is closed the same way for the newcomer.
    double idle_timeout_s = 60;
    // Per connection, per window_s: RST_STREAMs from the client of streams
    // the server had not ended (a reset stream stays counted as open until
    // the server ends it or a window has passed: gRPC still holds its
    // call), and PING, SETTINGS, PRIORITY and WINDOW_UPDATE frames (a
    // WINDOW_UPDATE answering the server's DATA is free, and an ACK of the
    // server's PING or SETTINGS) with the frames that carry nothing (an
    // empty DATA, HEADERS or CONTINUATION that ends nothing, an ACK of
    // nothing, a RST_STREAM of a stream not open, a GOAWAY, an unknown
    // type). Past either: a GOAWAY ENHANCE_YOUR_CALM and the connection
    // closed.
    unsigned max_resets = 100;
    unsigned max_control_frames = 1000;
    double window_s = 10;
    // Bytes waiting for a client that takes none of them for this long:
    // the connection is closed (and while the buffer towards the client is
    // full, nothing more is read from it).
    double peer_read_timeout_s = 32;
    bool quiet = false;
};

// The key of a client address for the per-address caps: the address
// without its port ("ipv4:127.0.0.1"), an IPv6 one as its /64
// ("ipv6:[2001:db8:1:2::]/64"): one host holds a whole /64.
std::string address_key(const std::string &peer_uri);

// Refusals and the connections open, for /metrics.
struct Counters {
    std::atomic<uint64_t> refused_connections{0};  // over a connection cap
    std::atomic<uint64_t> refused_streams{0};      // over max_open_streams
    std::atomic<uint64_t> refused_timeout{0};      // preface or request past the timeout
    std::atomic<uint64_t> refused_protocol{0};     // not HTTP/2, a bad stream id
    std::atomic<uint64_t> refused_tls{0};          // TLS handshake failed
    std::atomic<uint64_t> refused_resets{0};       // over max_resets in a window
    std::atomic<uint64_t> refused_control{0};      // over max_control_frames in a window
    std::atomic<uint64_t> refused_idle{0};         // idle_timeout, or idle and evicted
    std::atomic<uint64_t> refused_not_reading{0};  // peer_read_timeout
    std::atomic<int64_t> connections{0};
};

class Relay {
public:
    // tls: nullptr for plaintext; owned by the caller, alive until stop().
    // hand_off(fd) gives gRPC its end of a connection's socketpair (it owns
    // fd then); called on the relay's thread.
    Relay(const Limits &lim, Counters *counters, SSL_CTX *tls, std::function<void(int)> hand_off);
    ~Relay();
    // Binds and listens on HOST:PORT ("[::]:0" for IPv6); *port: the bound port.
    bool listen(const std::string &addr, unsigned *port, std::string *err);
    void start();
    // From now on no connection is handed to gRPC (new ones are closed):
    // called before gRPC's Server::Shutdown. When it returns, no hand_off
    // is running.
    void refuse_new();
    // Stops the thread and closes every connection and the listening socket.
    void stop();
    // The client's address ("ipv4:127.0.0.1:5555") of the connection gRPC
    // calls grpc_peer ("fd:N") now; grpc_peer itself if unknown. *id (when
    // given): the relay's own identity of that connection, never reused
    // (gRPC reuses "fd:N" once a connection is gone); 0 if unknown.
    std::string client_of(const std::string &grpc_peer, uint64_t *id = nullptr);
    // Closes (RST) the connection of that id (if it is still open) / every
    // connection: gRPC's writes and reads on it fail at once.
    void close_connection(uint64_t id);
    void close_all();

private:
    struct Impl;
    std::unique_ptr<Impl> p_;
};

}  // namespace relay
