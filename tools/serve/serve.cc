// serve.cc: `sluice serve` (the sluice-serve program): the gRPC tensor
// service of proto/sluice/v1/tensor_service.proto over the library's public
// API. C++17 with grpc++'s synchronous API: one thread per active call
// (bounded by --max-threads), flow control by blocking writes (a client
// that stops reading blocks its own call's thread only, and holds at most
// its handle, one message and the HTTP/2 window), memory by the library's
// pool (each model's --pool). One translation unit on purpose: grpc++'s
// headers are slow to compile.
#include "tensor_service.grpc.pb.h"
#include "relay.h"
#include "../cmd.h"

#include <sluice.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_posix.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifdef SLUICE_SERVE_HAVE_MHD
#include <microhttpd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

extern "C" int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

namespace {

using Clock = std::chrono::steady_clock;
using grpc::ServerContext;
using grpc::ServerWriter;
using grpc::Status;
using grpc::StatusCode;
namespace pb = sluice::v1;

// ------------------------------------------------------------ options
struct Config {
    std::string path;
    std::string listen = "127.0.0.1:7070";
    uint64_t pool_bytes = 1ull << 30;
    int metrics_port = -1;
    std::string tls_cert, tls_key, client_ca, token_file;
    unsigned max_streams_per_client = 16;
    unsigned max_streams = 256;
    unsigned max_threads = 300;
    unsigned max_streams_per_connection = 32;
    unsigned max_connections = 64;
    unsigned max_connections_per_address = 16;
    double request_timeout_s = 10;
    double idle_timeout_s = 60;
    unsigned max_resets = 100;           // per connection per 10 s
    unsigned max_control_frames = 1000;  // per connection per 10 s
    uint64_t max_request_bytes = 1 << 20;
    double stall_timeout_s = 30;
    double pool_wait_s = 10;
    double grace_s = 10;
    bool allow_unverified = false;
    bool force_root = false;
    bool quiet = false;
    // A remote model's (and any model's mirrors') options: sluice_options'
    // cache_dir, cache_bytes, http_proxy, proxy_kind, fallback.
    std::string cache_dir;             // "": $SLUICE_CACHE_DIR, else none
    uint64_t cache_bytes = 0;          // 0: the library's default
    bool proxy_set = false;            // unset: the environment's proxy
    std::string http_proxy;            // "" (set): no proxy at all
    uint32_t proxy_kind = SLUICE_PROXY_PLAIN;
    std::vector<std::string> fallback;
};

const char usage_text[] =
    "usage: sluice serve ROOT_OR_MODEL [--listen ADDR:PORT] [--pool SIZE]\n"
    "                    [--metrics-port N] [--tls-cert PEM --tls-key PEM]\n"
    "                    [--client-ca PEM] [--token-file FILE] [--cache-dir DIR]\n"
    "                    [--proxy URL] [--fallback LOC] [...]\n"
    "\n"
    "Serves the tensors of one model (a .safetensors file, a directory with a\n"
    "*.safetensors.index.json) or of every model under a root directory (each\n"
    "*.safetensors file and each subdirectory is a model, named by its entry;\n"
    "every file a model opens must resolve inside the root)\n"
    "over gRPC (proto/sluice/v1/tensor_service.proto) and grpc.health.v1.\n"
    "ROOT_OR_MODEL may also be one remote model: an http(s)://, s3:// or\n"
    "hf://ORG/NAME[@REVISION][/FILE] location (as 'sluice cat' takes it; the\n"
    "environment's tokens, AWS_* and proxies apply), named by the last part\n"
    "of its path (its query off; for hf://ORG/NAME[@REVISION], NAME).\n"
    "Every model needs a manifest (sluice manifest) unless --allow-unverified.\n"
    "\n"
    "  --listen ADDR:PORT     default 127.0.0.1:7070; port 0 picks a free one;\n"
    "                         the bound address is printed: 'listening on A:P'\n"
    "  --pool SIZE            each model's pool budget (K/M/G suffixes), capped\n"
    "                         at the model's size; default 1G (a model whose\n"
    "                         largest tensor is bigger is warned of at start)\n"
    "  --metrics-port N       /metrics over HTTP on 127.0.0.1:N (0: any free port);\n"
    "                         32 connections, 8 per client address, 5 s for a\n"
    "                         whole request (a slower one is cut)\n"
    "  --tls-cert F --tls-key F  TLS (the key must be the certificate's: checked\n"
    "                         at start); --client-ca F: require client\n"
    "                         certificates signed by that CA (mutual TLS)\n"
    "  --token-file F         every call needs 'authorization: Bearer TOKEN'; TOKEN\n"
    "                         is F's content with ASCII whitespace (space, tab,\n"
    "                         CR, LF, VT, FF) off both ends, visible ASCII or spaces,\n"
    "                         at most 4096 bytes\n"
    "  --max-streams-per-client N  concurrent calls per client address (16)\n"
    "  --max-streams N        concurrent calls in all (256)\n"
    "  --max-request-bytes N  largest request message (1 MiB)\n"
    "  --max-streams-per-connection N  HTTP/2 streams per connection advertised\n"
    "                         (32); a connection that opens 32 more than this\n"
    "                         at once is closed (before gRPC sees the stream)\n"
    "  --max-connections N    TCP connections in all (64); more are closed at once\n"
    "  --max-connections-per-address N  from one client address (16; an IPv6\n"
    "                         client's whole /64 is one address); at either cap,\n"
    "                         the connection idle longest (1 s or more) gets a\n"
    "                         GOAWAY and is closed for the newcomer\n"
    "  --idle-timeout S       a connection with no open stream for S seconds (60)\n"
    "                         gets a GOAWAY and is closed\n"
    "  --max-resets N         streams a connection may reset in 10 s before the\n"
    "                         server ended them (100); a reset stream counts as\n"
    "                         open until the server ends it or 10 s have passed\n"
    "  --max-control-frames N PING, SETTINGS, PRIORITY and WINDOW_UPDATE frames a\n"
    "                         connection may send in 10 s (1000; a WINDOW_UPDATE\n"
    "                         that answers the server's data is free, and so is\n"
    "                         an ACK of the server's PING or SETTINGS), frames\n"
    "                         that carry nothing (an empty DATA or CONTINUATION,\n"
    "                         an unsolicited ACK, a RST_STREAM of a stream not\n"
    "                         open, an unknown type) counted with them. Past\n"
    "                         either: GOAWAY ENHANCE_YOUR_CALM, closed\n"
    "  --request-timeout S    a connection's HTTP/2 preface, and each stream's\n"
    "                         request message, within S seconds (10), or the\n"
    "                         connection is closed; so is one whose open streams\n"
    "                         hold more than 2 x --max-request-bytes of request,\n"
    "                         or that sends a header block over 16 KiB. What any\n"
    "                         peer, token or not, can make the server hold beyond\n"
    "                         the pools: per connection 512 KiB of relay buffers,\n"
    "                         (--max-streams-per-connection + 32) streams of at\n"
    "                         most 64 KiB, 2 x --max-request-bytes; 7 MiB with the\n"
    "                         defaults, 448 MiB for 64 connections\n"
    "  --stall-timeout S      cancel a call whose client has not taken a chunk\n"
    "                         for S seconds (30); a write still blocked 1 s\n"
    "                         after the cancel has its connection closed, so the\n"
    "                         call's handle is released within S + 1.5 s; a\n"
    "                         client that takes nothing the server sends it\n"
    "                         (data, or answers to its PINGs) for S + 2 s is\n"
    "                         closed, and not read while it does not read\n"
    "  --pool-wait S          wait at most S seconds for pool room (10)\n"
    "  --grace S              on SIGTERM/SIGINT, let calls finish for S seconds (10);\n"
    "                         the connections left are then closed: the process\n"
    "                         ends within S + 2 s\n"
    "  --root                 ROOT_OR_MODEL is a root even if it looks like a model\n"
    "  --cache-dir DIR        a persistent cache ($SLUICE_CACHE_DIR is the default):\n"
    "                         a remote model's verified tensors are kept there and\n"
    "                         read from it at the next start (docs/cache.md)\n"
    "  --cache-bytes SIZE     the cache's budget (K/M/G suffixes; default 64G);\n"
    "                         --cache-max is the same\n"
    "  --proxy URL            the HTTP proxy of every remote request (default: the\n"
    "                         environment's http_proxy, https_proxy, all_proxy;\n"
    "                         '' for none; no_proxy applies); a request it fails,\n"
    "                         or bytes of it that fail to verify, go direct\n"
    "  --proxy-kind K         plain (default; https:// tunnelled) or dragonfly\n"
    "                         (dfdaemon: X-Dragonfly-* headers, https:// asked as\n"
    "                         http://, never tunnelled; see docs/remote.md)\n"
    "  --fallback LOC         a mirror of the model (directory, file, http(s)://,\n"
    "                         s3://) that serves a tensor whose bytes fail to\n"
    "                         verify or to read, verified against the model's\n"
    "                         manifest; repeatable (16), tried in order; one\n"
    "                         model only (not with a root)\n"
    "  --allow-unverified     serve models without a manifest (no digests)\n"
    "  -q                     no per-refusal log lines\n"
    "\n"
    CMD_EXIT_HELP
    "serve: 0 after SIGTERM or SIGINT; 2 also for a TLS or token file that\n"
    "cannot be used (checked at start); 3 when nothing could be served or\n"
    "listened on.\n";

bool parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno)
        return false;
    uint64_t mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end || v > UINT64_MAX / mul)
        return false;
    *out = v * mul;
    return true;
}

bool parse_args(int argc, char **argv, Config *c)
{
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&](const char **v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice serve: %s needs a value\n", a.c_str());
                return false;
            }
            *v = argv[++i];
            return true;
        };
        const char *v = nullptr;
        uint64_t n = 0;
        if (a == "-h" || a == "--help") {
            fputs(usage_text, stdout);
            exit(0);
        } else if (a == "--listen") {
            if (!next(&v)) return false;
            c->listen = v;
        } else if (a == "--pool") {
            if (!next(&v) || !parse_size(v, &c->pool_bytes) || c->pool_bytes < 4096) {
                fprintf(stderr, "sluice serve: bad --pool\n");
                return false;
            }
        } else if (a == "--metrics-port") {
            if (!next(&v) || !parse_size(v, &n) || n > 65535) {
                fprintf(stderr, "sluice serve: bad --metrics-port\n");
                return false;
            }
            c->metrics_port = (int)n;
        } else if (a == "--tls-cert") {
            if (!next(&v)) return false;
            c->tls_cert = v;
        } else if (a == "--tls-key") {
            if (!next(&v)) return false;
            c->tls_key = v;
        } else if (a == "--client-ca") {
            if (!next(&v)) return false;
            c->client_ca = v;
        } else if (a == "--token-file") {
            if (!next(&v)) return false;
            c->token_file = v;
        } else if (a == "--max-streams-per-client" || a == "--max-streams" ||
                   a == "--max-threads" || a == "--max-request-bytes" ||
                   a == "--max-streams-per-connection" || a == "--max-connections" ||
                   a == "--max-connections-per-address" || a == "--max-resets" ||
                   a == "--max-control-frames") {
            if (!next(&v) || !parse_size(v, &n) || n == 0 || n > INT_MAX) {
                fprintf(stderr, "sluice serve: bad %s\n", a.c_str());
                return false;
            }
            if (a == "--max-streams-per-client") c->max_streams_per_client = (unsigned)n;
            else if (a == "--max-streams") c->max_streams = (unsigned)n;
            else if (a == "--max-threads") c->max_threads = (unsigned)n;
            else if (a == "--max-streams-per-connection") c->max_streams_per_connection = (unsigned)n;
            else if (a == "--max-connections") c->max_connections = (unsigned)n;
            else if (a == "--max-connections-per-address") c->max_connections_per_address = (unsigned)n;
            else if (a == "--max-resets") c->max_resets = (unsigned)n;
            else if (a == "--max-control-frames") c->max_control_frames = (unsigned)n;
            else c->max_request_bytes = n;
        } else if (a == "--stall-timeout" || a == "--pool-wait" || a == "--grace" ||
                   a == "--request-timeout" || a == "--idle-timeout") {
            if (!next(&v)) return false;
            char *end;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0) || d > 86400) {
                fprintf(stderr, "sluice serve: bad %s\n", a.c_str());
                return false;
            }
            if (a == "--stall-timeout") c->stall_timeout_s = d;
            else if (a == "--pool-wait") c->pool_wait_s = d;
            else if (a == "--request-timeout") c->request_timeout_s = d;
            else if (a == "--idle-timeout") c->idle_timeout_s = d;
            else c->grace_s = d;
        } else if (a == "--root") {
            c->force_root = true;
        } else if (a == "--cache-dir") {
            if (!next(&v)) return false;
            c->cache_dir = v;
        } else if (a == "--cache-bytes" || a == "--cache-max") {
            if (!next(&v) || !parse_size(v, &c->cache_bytes) || c->cache_bytes == 0) {
                fprintf(stderr, "sluice serve: bad %s\n", a.c_str());
                return false;
            }
        } else if (a == "--proxy") {
            if (!next(&v)) return false;
            c->proxy_set = true;
            c->http_proxy = v;
        } else if (a == "--proxy-kind") {
            if (!next(&v)) return false;
            if (strcmp(v, "plain") != 0 && strcmp(v, "dragonfly") != 0) {
                fprintf(stderr, "sluice serve: --proxy-kind: '%s' is not plain or dragonfly\n", v);
                return false;
            }
            c->proxy_kind = strcmp(v, "dragonfly") == 0 ? SLUICE_PROXY_DRAGONFLY : SLUICE_PROXY_PLAIN;
        } else if (a == "--fallback") {
            if (!next(&v)) return false;
            if (!*v || c->fallback.size() >= 16) {
                fprintf(stderr, "sluice serve: %s\n",
                        *v ? "at most 16 --fallback" : "--fallback needs a location");
                return false;
            }
            c->fallback.push_back(v);
        } else if (a == "--allow-unverified") {
            c->allow_unverified = true;
        } else if (a == "-q" || a == "--quiet") {
            c->quiet = true;
        } else if (!a.empty() && a[0] == '-') {
            fprintf(stderr, "sluice serve: unknown option %s\n", a.c_str());
            return false;
        } else if (c->path.empty()) {
            c->path = a;
        } else {
            fprintf(stderr, "sluice serve: one ROOT_OR_MODEL only\n");
            return false;
        }
    }
    if (c->path.empty()) {
        fputs(usage_text, stderr);
        return false;
    }
    if (c->tls_cert.empty() != c->tls_key.empty()) {
        fprintf(stderr, "sluice serve: --tls-cert and --tls-key go together\n");
        return false;
    }
    if (!c->client_ca.empty() && c->tls_cert.empty()) {
        fprintf(stderr, "sluice serve: --client-ca needs --tls-cert and --tls-key\n");
        return false;
    }
    return true;
}

// Whether loc is a remote location sluice_open reads over the network
// (sluice.h, sluice_open: http(s)://, s3://, hf://) rather than a path.
bool is_remote_location(const std::string &loc)
{
    for (const char *s : {"http://", "https://", "s3://", "hf://"})
        if (loc.compare(0, strlen(s), s) == 0)
            return true;
    return false;
}

// loc as the library's messages show a location (sluice.h, "Remote
// models and mirrors"): without its user:password@ and with "?..." for
// its query (a presigned URL's signature), so that no credential reaches
// the log. A local path as it is.
std::string shown_location(const std::string &loc)
{
    if (!is_remote_location(loc))
        return loc;
    size_t s = loc.find("://") + 3;
    size_t q = loc.find_first_of("?#", s);
    std::string out = loc.substr(0, q);
    size_t at = out.substr(s, out.find('/', s) - s).rfind('@');
    if (at != std::string::npos)
        out.erase(s, at + 1);
    return q == std::string::npos ? out : out + "?...";
}

// The name a remote model is served under, as the last entry of a local
// model's path names it: the last part of the location's path, its query
// and fragment off (a presigned URL's signature is no name), trailing
// '/' off; for hf://ORG/NAME[@REVISION] without a FILE, NAME.
std::string remote_model_name(const std::string &loc)
{
    size_t scheme = loc.find("://") + 3;
    std::string p = loc.substr(scheme, loc.find_first_of("?#", scheme) - scheme);
    while (p.size() > 1 && p.back() == '/')
        p.pop_back();
    if (loc.compare(0, 5, "hf://") == 0 && std::count(p.begin(), p.end(), '/') == 1)
        p = p.substr(0, p.find('@'));
    size_t slash = p.rfind('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
}

// The remote part of a model's options (both opens of open_model): the
// proxy, and for the serving open (probe false) the cache and the
// mirrors (their pointers in *mirrors, which must outlive the open). The
// probe reads headers only with verify off: without a manifest the
// library attaches no cache (it keeps verified tensors only) and refuses
// mirrors, so both are the serving open's alone.
void remote_options(const Config &cfg, bool probe, std::vector<const char *> *mirrors,
                    sluice_options *o)
{
    if (cfg.proxy_set)
        o->http_proxy = cfg.http_proxy.c_str();
    o->proxy_kind = cfg.proxy_kind;
    if (probe)
        return;
    if (!cfg.cache_dir.empty())
        o->cache_dir = cfg.cache_dir.c_str();
    if (cfg.cache_bytes)
        o->cache_bytes = cfg.cache_bytes;
    for (auto &f : cfg.fallback)
        mirrors->push_back(f.c_str());
    if (!mirrors->empty()) {
        o->fallback = mirrors->data();
        o->fallback_count = (uint32_t)mirrors->size();
    }
}

bool read_file(const std::string &path, std::string *out)
{
    std::ifstream f(path, std::ios::binary);
    if (!f)
        return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return !f.bad();
}

// The longest token: a call's metadata (its headers, the token's among
// them) is bounded by gRPC at 8 KiB (GRPC_ARG_MAX_METADATA_SIZE's
// default): a 7800-byte token already fails every call with
// RESOURCE_EXHAUSTED. Half of it leaves room for the other headers.
constexpr size_t kTokenMax = 4096;
constexpr size_t kTokenFileMax = 64u << 10;  // the file, whitespace included

// The token of --token-file: the file's bytes with ASCII whitespace (space,
// tab, CR, LF, VT, FF) taken off both ends; what is left must be one or
// more bytes of visible ASCII or spaces (what gRPC metadata carries). The
// bundled clients read their token files by the same rule (README). At
// most kTokenMax bytes.
bool read_token_file(const std::string &path, std::string *tok, std::string *why)
{
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        *why = strerror(errno);
        return false;
    }
    if (S_ISDIR(st.st_mode)) {
        *why = "is a directory, not a token file";
        return false;
    }
    // Read with a bound: a device or a huge file named by mistake
    // (/dev/zero) must not fill the memory before the length is checked.
    std::string t(kTokenFileMax + 1, '\0');
    std::ifstream f(path, std::ios::binary);
    f.read(&t[0], (std::streamsize)t.size());
    if (f.bad() || (!f && !f.eof())) {
        *why = "cannot be read";
        return false;
    }
    t.resize((size_t)f.gcount());
    if (t.size() > kTokenFileMax) {
        *why = "is larger than " + std::to_string(kTokenFileMax) + " bytes: not a token file";
        return false;
    }
    const char *ws = " \t\r\n\v\f";
    size_t b = t.find_first_not_of(ws), e = t.find_last_not_of(ws);
    if (b == std::string::npos) {
        *why = "is empty (or only whitespace)";
        return false;
    }
    t = t.substr(b, e - b + 1);
    for (size_t i = 0; i < t.size(); i++)
        if ((unsigned char)t[i] < 0x20 || (unsigned char)t[i] > 0x7e) {
            *why = "the token has a byte that is not visible ASCII or a space (at " +
                   std::to_string(b + i) + "): no client could send it";
            return false;
        }
    if (t.size() > kTokenMax) {
        *why = "the token is " + std::to_string(t.size()) + " bytes, more than " +
               std::to_string(kTokenMax) + ": gRPC's 8 KiB bound on a call's metadata would "
               "refuse every call that carries it";
        return false;
    }
    *tok = t;
    return true;
}

// OpenSSL's passphrase callback: none. Its default one prompts on the
// terminal and waits there, with SIGINT and SIGTERM blocked (see main):
// an encrypted key is refused instead, saying so.
int no_passphrase(char *, int, int, void *)
{
    return 0;
}

// Whether --tls-key is the private key of --tls-cert's (first)
// certificate, checked here: grpc only says it cannot listen.
bool check_key_pair(const Config &c, const std::string &cert, const std::string &key)
{
    BIO *cb = BIO_new_mem_buf(cert.data(), (int)cert.size());
    BIO *kb = BIO_new_mem_buf(key.data(), (int)key.size());
    X509 *x = cb ? PEM_read_bio_X509(cb, nullptr, nullptr, nullptr) : nullptr;
    EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, nullptr, no_passphrase, nullptr) : nullptr;
    bool ok = false;
    if (!x)
        fprintf(stderr, "sluice serve: --tls-cert %s: no PEM certificate in it\n",
                c.tls_cert.c_str());
    else if (!k)
        fprintf(stderr, "sluice serve: --tls-key %s: no PEM private key in it (or one with "
                        "a passphrase)\n", c.tls_key.c_str());
    else if (X509_check_private_key(x, k) != 1)
        fprintf(stderr, "sluice serve: --tls-key %s does not match the certificate in "
                        "--tls-cert %s\n", c.tls_key.c_str(), c.tls_cert.c_str());
    else
        ok = true;
    ERR_clear_error();
    EVP_PKEY_free(k);
    X509_free(x);
    BIO_free(kb);
    BIO_free(cb);
    return ok;
}

// Streams a connection may open beyond --max-streams-per-connection before
// the relay closes it: a client may open streams before it has the
// server's SETTINGS.
constexpr unsigned kStreamMargin = 32;

// ALPN: "h2" when the client offers it (gRPC clients require it).
int alpn_select(SSL *, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                unsigned inlen, void *)
{
    static const unsigned char h2[] = {2, 'h', '2'};
    unsigned char *o = nullptr;
    if (SSL_select_next_proto(&o, outlen, h2, sizeof h2, in, inlen) != OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK;
    *out = o;
    return SSL_TLSEXT_ERR_OK;
}

// The relay's TLS context: --tls-cert (a chain) and --tls-key, TLS 1.2 or
// later, no renegotiation; --client-ca: a client certificate signed by it
// required and verified (gRPC's
// GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
SSL_CTX *make_tls(const Config &c)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    const char *what = nullptr;
    if (!ctx)
        what = "cannot make a TLS context";
    else if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION))
        what = "TLS 1.2 not available";
    else if (SSL_CTX_use_certificate_chain_file(ctx, c.tls_cert.c_str()) != 1)
        what = "--tls-cert: not a PEM certificate chain";
    else if (SSL_CTX_use_PrivateKey_file(ctx, c.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
             SSL_CTX_check_private_key(ctx) != 1)
        what = "--tls-key: not the certificate's private key";
    else if (!c.client_ca.empty()) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(c.client_ca.c_str());
        if (!names || SSL_CTX_load_verify_locations(ctx, c.client_ca.c_str(), nullptr) != 1) {
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            what = "--client-ca: no PEM certificate in it";
        } else {
            SSL_CTX_set_client_CA_list(ctx, names);
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
        }
    }
    if (what) {
        fprintf(stderr, "sluice serve: %s\n", what);
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return nullptr;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, nullptr);
    return ctx;
}

// ------------------------------------------------------------ metrics
// The server's own counters, rendered after the models' exposition on
// /metrics (see metrics_text below).
enum Rpc { RPC_LIST, RPC_MODEL, RPC_TENSOR, RPC_STREAM, RPC_COUNT_ };
const char *const rpc_names[RPC_COUNT_] = {"ListModels", "GetModel", "GetTensor", "StreamTensors"};
const double lat_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                              0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
constexpr size_t n_lat = sizeof lat_buckets / sizeof lat_buckets[0];

struct RpcStats {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> by_code[17] = {};
    std::atomic<uint64_t> bucket[n_lat + 1] = {};
    std::atomic<uint64_t> sum_us{0};
};

struct Stats {
    RpcStats rpc[RPC_COUNT_];
    std::atomic<uint64_t> bytes_sent{0};
    std::atomic<uint64_t> chunks_sent{0};
    std::atomic<int64_t> active_streams{0};
    std::atomic<uint64_t> refused_auth{0}, refused_limit{0}, refused_name{0},
        refused_shutdown{0}, stalled{0};
    relay::Counters conns;  // the relay's refusals and connections
};
Stats stats;

void observe(Rpc r, StatusCode code, Clock::time_point start)
{
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    RpcStats &st = stats.rpc[r];
    st.calls++;
    unsigned c = (unsigned)code;
    st.by_code[c < 17 ? c : 2]++;
    size_t b = 0;
    while (b < n_lat && s > lat_buckets[b])
        b++;
    st.bucket[b]++;
    st.sum_us += (uint64_t)(s * 1e6);
}

const char *const code_names[17] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"};

// In OpenMetrics (om) a counter family is named without its samples'
// _total, as the library writes its own (src/metrics/metrics.c): the HELP and TYPE
// lines of every "..._total counter" family lose the suffix.
std::string om_counter_names(const std::string &text)
{
    std::istringstream in(text);
    std::string line, out;
    while (std::getline(in, line)) {
        const bool help = line.rfind("# HELP ", 0) == 0, type = line.rfind("# TYPE ", 0) == 0;
        if (help || type) {
            size_t name_end = line.find(' ', 7);
            const std::string name = line.substr(7, name_end - 7);
            const bool counter_total =
                name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0 &&
                text.find("# TYPE " + name + " counter\n") != std::string::npos;
            if (counter_total)
                line.erase(7 + name.size() - 6, 6);
        }
        out += line;
        out += '\n';
    }
    return out;
}

std::string metrics_text(bool om)
{
    std::ostringstream o;
    o << "# HELP sluice_serve_calls_total gRPC calls ended, by method and status code.\n"
         "# TYPE sluice_serve_calls_total counter\n";
    for (int r = 0; r < RPC_COUNT_; r++)
        for (int c = 0; c < 17; c++) {
            uint64_t v = stats.rpc[r].by_code[c].load();
            if (v || c == 0)
                o << "sluice_serve_calls_total{method=\"" << rpc_names[r] << "\",code=\""
                  << code_names[c] << "\"} " << v << "\n";
        }
    o << "# HELP sluice_serve_call_duration_seconds gRPC call duration, by method.\n"
         "# TYPE sluice_serve_call_duration_seconds histogram\n";
    for (int r = 0; r < RPC_COUNT_; r++) {
        uint64_t cum = 0;
        for (size_t b = 0; b <= n_lat; b++) {
            cum += stats.rpc[r].bucket[b].load();
            o << "sluice_serve_call_duration_seconds_bucket{method=\"" << rpc_names[r]
              << "\",le=\"";
            if (b < n_lat)
                o << lat_buckets[b];
            else
                o << "+Inf";
            o << "\"} " << cum << "\n";
        }
        o << "sluice_serve_call_duration_seconds_sum{method=\"" << rpc_names[r] << "\"} "
          << stats.rpc[r].sum_us.load() / 1e6 << "\n";
        o << "sluice_serve_call_duration_seconds_count{method=\"" << rpc_names[r] << "\"} "
          << cum << "\n";
    }
    o << "# HELP sluice_serve_bytes_sent_total Tensor bytes of chunks the transport accepted "
         "(written to the connection's socket; what was still in the kernel's buffers when a "
         "connection dropped is counted, though its client never received it).\n"
         "# TYPE sluice_serve_bytes_sent_total counter\n"
         "sluice_serve_bytes_sent_total "
      << stats.bytes_sent.load()
      << "\n# HELP sluice_serve_chunks_sent_total Chunks sent.\n"
         "# TYPE sluice_serve_chunks_sent_total counter\n"
         "sluice_serve_chunks_sent_total "
      << stats.chunks_sent.load()
      << "\n# HELP sluice_serve_active_streams Calls in progress.\n"
         "# TYPE sluice_serve_active_streams gauge\n"
         "sluice_serve_active_streams "
      << stats.active_streams.load()
      << "\n# HELP sluice_serve_refused_total Calls refused, by reason.\n"
         "# TYPE sluice_serve_refused_total counter\n"
      << "sluice_serve_refused_total{reason=\"auth\"} " << stats.refused_auth.load() << "\n"
      << "sluice_serve_refused_total{reason=\"limit\"} " << stats.refused_limit.load() << "\n"
      << "sluice_serve_refused_total{reason=\"name\"} " << stats.refused_name.load() << "\n"
      << "sluice_serve_refused_total{reason=\"shutdown\"} " << stats.refused_shutdown.load()
      << "\n"
      << "sluice_serve_refused_total{reason=\"stalled\"} " << stats.stalled.load() << "\n"
      << "# HELP sluice_serve_connections_refused_total Connections closed by the server's "
         "bounds before gRPC saw their streams, by reason.\n"
         "# TYPE sluice_serve_connections_refused_total counter\n";
    const relay::Counters &rc = stats.conns;
    const std::pair<const char *, const std::atomic<uint64_t> *> conn_reasons[] = {
        {"connections", &rc.refused_connections}, {"streams", &rc.refused_streams},
        {"request_timeout", &rc.refused_timeout},  {"protocol", &rc.refused_protocol},
        {"tls", &rc.refused_tls},                  {"resets", &rc.refused_resets},
        {"control_frames", &rc.refused_control},   {"idle", &rc.refused_idle},
        {"not_reading", &rc.refused_not_reading},
    };
    for (const auto &r : conn_reasons)
        o << "sluice_serve_connections_refused_total{reason=\"" << r.first << "\"} "
          << r.second->load() << "\n";
    o << "# HELP sluice_serve_connections Client connections open.\n"
         "# TYPE sluice_serve_connections gauge\n"
         "sluice_serve_connections "
      << rc.connections.load() << "\n";
    return om ? om_counter_names(o.str()) : o.str();
}

// ------------------------------------------------------------ models
struct Model {
    std::string name;       // the entry name clients use
    std::string path;
    sluice_model *m = nullptr;
    pb::ModelInfo info;     // GetModel's answer, built once
    pb::ModelSummary summary;
};

StatusCode code_of(int rc)
{
    switch (rc) {
    case SLUICE_E_NOT_FOUND: return StatusCode::NOT_FOUND;
    case SLUICE_E_CHECKSUM:
    case SLUICE_E_FILE_CHANGED: return StatusCode::DATA_LOSS;
    case SLUICE_E_POOL_EXHAUSTED:
    case SLUICE_E_TOO_LARGE:
    case SLUICE_E_NOMEM: return StatusCode::RESOURCE_EXHAUSTED;
    case SLUICE_E_INVAL: return StatusCode::INVALID_ARGUMENT;
    case SLUICE_E_CANCELLED: return StatusCode::CANCELLED;
    default: return StatusCode::INTERNAL;
    }
}

bool ends_with(const std::string &s, const char *suf)
{
    size_t n = strlen(suf);
    return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// Whether a directory is one model (holds an index or safetensors files and
// no subdirectory that is a model of its own): the rule is simply "holds a
// *.safetensors.index.json, or holds *.safetensors files and no directory".
bool dir_is_model(const std::string &dir)
{
    DIR *d = opendir(dir.c_str());
    if (!d)
        return false;
    bool index = false, files = false, subdirs = false;
    while (struct dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n == "." || n == "..")
            continue;
        if (ends_with(n, ".safetensors.index.json"))
            index = true;
        else if (ends_with(n, ".safetensors"))
            files = true;
        struct stat st;
        if (stat((dir + "/" + n).c_str(), &st) == 0 && S_ISDIR(st.st_mode))
            subdirs = true;
    }
    closedir(d);
    return index || (files && !subdirs);
}

// The model names a request may give: a plain entry of the root. Anything
// with a '/', a NUL, "." or "..", a leading '.', or empty is refused before
// any lookup (and the lookup is in the set found at start, so a name never
// reaches the file system).
bool valid_model_name(const std::string &n)
{
    if (n.empty() || n.size() > 4096 || n[0] == '.')
        return false;
    for (char ch : n)
        if (ch == '/' || ch == '\0' || ch == '\\')
            return false;
    return true;
}

// A name the client sent, for a status message: at most 256 bytes of it.
// The message travels in the trailers, and a name near --max-request-bytes
// echoed whole passes the clients' metadata limit (16 KiB in grpc), which
// turns NOT_FOUND into RESOURCE_EXHAUSTED on their side.
std::string echo_name(const std::string &n)
{
    const size_t max = 256;
    if (n.size() <= max)
        return n;
    return n.substr(0, max) + "... (" + std::to_string(n.size()) + " bytes)";
}

std::string base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

// Whether path (a real path) is inside the directory root (a real path).
bool inside(const std::string &root, const std::string &path)
{
    return root == "/" ? path[0] == '/' : path.compare(0, root.size() + 1, root + "/") == 0;
}

// The regular files this process holds open, fd -> the path the kernel
// gives for it (/proc/self/fd: the file actually opened, whatever a
// symlink on the way pointed to then or points to now).
std::map<int, std::string> open_files()
{
    std::map<int, std::string> out;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return out;
    while (struct dirent *e = readdir(d)) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end || fd == dirfd(d))
            continue;
        char buf[PATH_MAX];
        ssize_t n = readlinkat(dirfd(d), e->d_name, buf, sizeof buf - 1);
        struct stat st;
        if (n <= 0 || buf[0] != '/' || fstatat(dirfd(d), e->d_name, &st, 0) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        out[(int)fd] = std::string(buf, (size_t)n);
    }
    closedir(d);
    return out;
}

// Root mode: every file a model has open, and the manifest GetModel sends,
// must be inside the root. Checked on the files the library opened (the
// descriptors it holds, see open_files), not on the paths: a symlink
// swapped after the check cannot smuggle another file in. Returns the
// first file outside, or "" when none.
std::string file_outside(const std::string &root, const std::map<int, std::string> &before,
                         sluice_model *m)
{
    for (auto &fp : open_files()) {
        auto it = before.find(fp.first);
        if ((it == before.end() || it->second != fp.second) && !inside(root, fp.second))
            return fp.second;
    }
    for (size_t f = 0; f < sluice_file_count(m); f++) {  // also where /proc is not mounted
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, f, &fi);
        char *r = realpath(fi.path, nullptr);
        std::string rp = r ? r : fi.path;
        free(r);
        if (!inside(root, rp))
            return rp;
    }
    return "";
}

// Reads path into *out, unless (root non-empty) the file opened is outside
// root: then *outside gets its real path.
bool read_inside(const char *path, const std::string &root, std::string *out,
                 std::string *outside)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    if (!root.empty()) {
        char buf[PATH_MAX], link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, buf, sizeof buf - 1);
        char *r = n > 0 ? nullptr : realpath(path, nullptr);
        std::string rp = n > 0 ? std::string(buf, (size_t)n) : r ? r : path;
        free(r);
        if (!inside(root, rp)) {
            *outside = rp;
            close(fd);
            return false;
        }
    }
    out->clear();
    char b[65536];
    ssize_t n;
    while ((n = read(fd, b, sizeof b)) > 0)
        out->append(b, (size_t)n);
    close(fd);
    return n == 0;
}

// Opens one model; root: the root's real path in root mode (its files must
// be inside it), "" when ROOT_OR_MODEL is the model itself.
int open_model(const Config &cfg, const std::string &name, const std::string &path,
               const std::string &root, Model *out)
{
    std::string shown = shown_location(path);
    // First a header-only open to size the pool: no bigger than the model.
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    o.pool_bytes = 1 << 20;
    std::vector<const char *> mirrors;
    remote_options(cfg, true, &mirrors, &o);
    sluice_model *probe = nullptr;
    int rc = sluice_open(path.c_str(), &o, &probe);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice serve: %s: %s\n", shown.c_str(), sluice_errmsg(probe));
        sluice_close(probe);
        return rc;
    }
    uint64_t total = 0, largest = 0;
    std::string largest_name;
    for (size_t i = 0; i < sluice_count(probe); i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(probe, i, &ti);
        total += ti.nbytes;
        if (ti.nbytes > largest) {
            largest = ti.nbytes;
            largest_name.assign(ti.name, ti.name_len);
        }
    }
    sluice_close(probe);

    sluice_options_init(&o);
    o.flags = SLUICE_F_HASH_ALL;
    uint64_t want = total + (total >> 4) + (1 << 20);
    o.pool_bytes = std::min(cfg.pool_bytes, want);
    o.pool_bytes = std::max<uint64_t>(o.pool_bytes, 1 << 20);
    o.verify = cfg.allow_unverified ? SLUICE_VERIFY_DEFAULT : SLUICE_VERIFY_REQUIRE;
    o.metrics_label = name.c_str();
    remote_options(cfg, false, &mirrors, &o);
    sluice_model *m = nullptr;
    std::map<int, std::string> before;
    if (!root.empty())
        before = open_files();
    rc = sluice_open(path.c_str(), &o, &m);
    if (rc != SLUICE_OK) {
        fprintf(stderr, "sluice serve: %s: %s\n", shown.c_str(), sluice_errmsg(m));
        sluice_close(m);
        return rc;
    }
    if (const char *w = sluice_cache_warning(m))
        fprintf(stderr, "sluice serve: warning: %s: %s\n", name.c_str(), w);
    std::string outside = root.empty() ? "" : file_outside(root, before, m);
    if (!outside.empty()) {
        fprintf(stderr, "sluice serve: %s: refused, its file %s resolves outside the root\n",
                shown.c_str(), outside.c_str());
        sluice_close(m);
        return SLUICE_E_INVAL;
    }
    // A tensor larger than the pool can never be served (SLUICE_E_TOO_LARGE,
    // RESOURCE_EXHAUSTED to every client): said once, at start.
    if (largest > o.pool_bytes)
        fprintf(stderr,
                "sluice serve: warning: %s: tensor %s is %llu bytes, more than the model's pool "
                "(%llu bytes, --pool): every GetTensor and StreamTensors of it will fail with "
                "RESOURCE_EXHAUSTED\n",
                name.c_str(), echo_name(largest_name).c_str(), (unsigned long long)largest,
                (unsigned long long)o.pool_bytes);
    // The protocol's digests are SHA-256 (its fields say so, and the
    // clients check with SHA-256): a model whose manifest is BLAKE3 is not
    // served rather than sent with digests no client could check.
    if (sluice_digest_algorithm(m) != SLUICE_ALG_SHA256) {
        fprintf(stderr, "sluice serve: %s: its manifest is %s; the service's digests are SHA-256 "
                        "(write a SHA-256 manifest with 'sluice manifest')\n", shown.c_str(),
                sluice_algorithm_name(sluice_digest_algorithm(m)));
        sluice_close(m);
        return SLUICE_E_UNSUPPORTED;
    }
    out->name = name;
    out->path = path;
    out->m = m;
    pb::ModelInfo &mi = out->info;
    mi.set_name(name);
    sluice_verify_policy pol = sluice_verify_mode(m);
    mi.set_verify_policy(pol == SLUICE_VERIFY_REQUIRE     ? "require"
                         : pol == SLUICE_VERIFY_IF_PRESENT ? "if_present"
                                                           : "off");
    // A remote model's manifest is read by the library from the origin
    // (never through the proxy) and its bytes are not kept: GetModel's
    // manifest is then empty, the digests of every tensor still listed.
    bool remote = is_remote_location(path);
    if (const char *mp = remote ? nullptr : sluice_manifest_path(m)) {
        std::string text;
        if (read_inside(mp, root, &text, &outside)) {
            mi.set_manifest(text);
        } else if (!outside.empty()) {
            fprintf(stderr, "sluice serve: %s: refused, its manifest %s resolves outside the "
                            "root\n", shown.c_str(), outside.c_str());
            sluice_close(m);
            return SLUICE_E_INVAL;
        }
    }
    for (size_t f = 0; f < sluice_file_count(m); f++) {
        struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
        sluice_file_info(m, f, &fi);
        pb::FileInfo *pf = mi.add_files();
        pf->set_name(remote ? remote_model_name(fi.path) : base_name(fi.path));
        pf->set_size(fi.file_size);
        pf->set_header_bytes(fi.header_bytes);
        pf->set_tensor_count(fi.tensor_count);
        pf->set_metadata_null(fi.metadata_kind == SLUICE_METADATA_NULL);
        for (size_t k = 0; k < fi.metadata_count; k++)
            (*pf->mutable_metadata())[std::string(fi.metadata[k].key, fi.metadata[k].key_len)] =
                std::string(fi.metadata[k].value, fi.metadata[k].value_len);
        uint8_t d[32];
        if (sluice_manifest_file(m, f, d, nullptr) == SLUICE_OK)
            pf->set_sha256(d, 32);
    }
    bool all = true;
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &ti);
        pb::TensorInfo *pt = mi.add_tensors();
        pt->set_name(std::string(ti.name, ti.name_len));
        pt->set_dtype(sluice_dtype_name(ti.dtype));
        for (uint32_t k = 0; k < ti.ndim; k++)
            pt->add_shape(ti.shape[k]);
        pt->set_nbytes(ti.nbytes);
        pt->set_file_index((uint32_t)ti.file_index);
        pt->set_index(i);
        uint8_t d[32];
        if (sluice_manifest_tensor(m, i, d) == SLUICE_OK)
            pt->set_sha256(d, 32);
        else
            all = false;
    }
    mi.set_total_bytes(total);
    out->summary.set_name(name);
    out->summary.set_tensor_count(sluice_count(m));
    out->summary.set_total_bytes(total);
    out->summary.set_verified(all && pol != SLUICE_VERIFY_OFF);
    return SLUICE_OK;
}

// ------------------------------------------------------------ connections
// Every connection goes through the relay (tools/serve/relay.cc): gRPC
// serves its end of a socketpair, and knows the connection as "fd:N"
// (Relay::client_of gives the client's address and the relay's own id of
// the connection: gRPC reuses "fd:N", the id is never reused). A call stuck in a write
// to a client that does not drain outlives its cancel: TryCancel (and
// Server::Shutdown) cannot take back a message the transport has handed
// to a full socket buffer (tests/serve/h2raw.py stall). So the watchdog
// closes such a call's connection at the relay kStallAbortAfterCancelS
// after the cancel, and the grace's end closes every connection still
// open: gRPC's write fails and the transport is freed.
constexpr double kStallAbortAfterCancelS = 1.0;

// ------------------------------------------------------------ call tracking
// Every call in progress: its context (for the stall watchdog and for
// shutdown), when its current write began (0: not writing) and when the
// watchdog cancelled it.
struct Track {
    ServerContext *ctx;
    uint64_t conn = 0;   // the connection's id at the relay (0: unknown)
    std::string peer;    // the client's address and port
    std::string client;  // the peer's address without its port
    std::atomic<int64_t> write_since_ns{0};
    std::atomic<int64_t> cancelled_ns{0};
    std::atomic<bool> aborted{false};
};

// gRPC's default limit on a received message: every chunk the server
// sends fits in it (max_chunk_data).
constexpr uint64_t kMaxMessage = 4u << 20;
// The largest message sent: GetModel's reply lists every tensor and
// carries the manifest, about 2 x the name + 190 bytes a tensor: 1 GiB
// for 1,000,000 tensors of names up to about 440 bytes (8 MiB, before,
// refused a model of some 20,000). The clients (sluice.client,
// serve_client) take up to it for GetModel and 4 MiB a chunk.
constexpr int kMaxReply = 1 << 30;

class Server final : public pb::TensorService::Service {
public:
    Server(const Config &cfg, std::map<std::string, std::unique_ptr<Model>> &models)
        : cfg_(cfg), models_(models) {}

    std::atomic<bool> draining{false};
    std::atomic<int64_t> drain_deadline_ns{0};
    std::string token;  // empty: none required
    std::string fault_corrupt;  // test hook: tensor whose first sent chunk is corrupted
    relay::Relay *front = nullptr;  // the connections, once listening

    // Every 0.2 s: a call whose write has not ended for --stall-timeout is
    // cancelled; if that write still has not ended 1 s later, its
    // connection is closed (see "connections").
    void watchdog_loop(std::atomic<bool> *stop)
    {
        while (!stop->load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            int64_t now = now_ns();
            int64_t stall = (int64_t)(cfg_.stall_timeout_s * 1e9);
            std::vector<std::pair<uint64_t, std::string>> to_abort;  // connection, client
            {
                std::lock_guard<std::mutex> g(mu_);
                for (Track *t : tracks_) {
                    int64_t ws = t->write_since_ns.load();
                    if (!ws)
                        continue;
                    int64_t cn = t->cancelled_ns.load();
                    if (!cn && now - ws > stall) {
                        t->cancelled_ns = now;
                        stats.stalled++;
                        log_refusal(t->peer, "stalled: no chunk taken for --stall-timeout, cancelled");
                        t->ctx->TryCancel();
                    } else if (cn && now - cn > (int64_t)(kStallAbortAfterCancelS * 1e9) &&
                               !t->aborted.exchange(true)) {
                        to_abort.emplace_back(t->conn, t->peer);
                    }
                }
            }
            for (const auto &a : to_abort) {
                log_refusal(a.second, "still blocked in a write after its cancel: connection closed");
                front->close_connection(a.first);
            }
        }
    }

    void cancel_all()
    {
        std::lock_guard<std::mutex> g(mu_);
        for (Track *t : tracks_)
            t->ctx->TryCancel();
    }

    // Every connection of the gRPC port closed (the grace's end).
    void abort_all() { front->close_all(); }

    Status ListModels(ServerContext *ctx, const pb::ListModelsRequest *,
                      pb::ListModelsResponse *resp) override
    {
        auto start = Clock::now();
        Admit a(this, ctx);
        Status st = a.status;
        if (st.ok())
            for (auto &kv : models_)
                *resp->add_models() = kv.second->summary;
        observe(RPC_LIST, st.error_code(), start);
        return st;
    }

    Status GetModel(ServerContext *ctx, const pb::GetModelRequest *req,
                    pb::ModelInfo *resp) override
    {
        auto start = Clock::now();
        Admit a(this, ctx);
        Status st = a.status;
        Model *m = nullptr;
        if (st.ok())
            st = find_model(ctx, req->model(), &m);
        if (st.ok())
            *resp = m->info;
        observe(RPC_MODEL, st.error_code(), start);
        return st;
    }

    Status GetTensor(ServerContext *ctx, const pb::GetTensorRequest *req,
                     ServerWriter<pb::TensorChunk> *w) override
    {
        auto start = Clock::now();
        Status st = get_tensor(ctx, req, w);
        observe(RPC_TENSOR, st.error_code(), start);
        return st;
    }

    Status StreamTensors(ServerContext *ctx, const pb::StreamTensorsRequest *req,
                         ServerWriter<pb::TensorChunk> *w) override
    {
        auto start = Clock::now();
        Status st = stream_tensors(ctx, req, w);
        observe(RPC_STREAM, st.error_code(), start);
        return st;
    }

private:
    const Config &cfg_;
    std::map<std::string, std::unique_ptr<Model>> &models_;
    std::mutex mu_;
    std::list<Track *> tracks_;
    std::map<std::string, unsigned> per_client_;
    unsigned active_ = 0;

    static int64_t now_ns()
    {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   Clock::now().time_since_epoch())
            .count();
    }

    void log_refusal(const std::string &client, const std::string &why)
    {
        if (!cfg_.quiet)
            fprintf(stderr, "sluice serve: refused %s: %s\n", client.c_str(), why.c_str());
    }

    // The client's address without its port: "ipv4:127.0.0.1:5555" ->
    // "ipv4:127.0.0.1"; an IPv6 address's /64 (as the relay's caps).
    static std::string client_key(const std::string &peer)
    {
        size_t colon = peer.rfind(':');
        size_t first = peer.find(':');
        if (colon != std::string::npos && colon != first)
            return relay::address_key(peer);
        return peer;
    }

    bool token_ok(ServerContext *ctx)
    {
        if (token.empty())
            return true;
        const auto &md = ctx->client_metadata();
        auto it = md.find("authorization");
        if (it == md.end())
            return false;
        std::string got(it->second.data(), it->second.size());
        std::string want = "Bearer " + token;
        return got.size() == want.size() && CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0;
    }

    // Admission of one call: token, shutdown, limits; tracked until its end.
    struct Admit {
        Server *s;
        Track track;
        bool counted = false;
        Status status;
        Admit(Server *srv, ServerContext *ctx) : s(srv)
        {
            track.ctx = ctx;
            track.peer = s->front->client_of(ctx->peer(), &track.conn);
            track.client = client_key(track.peer);
            if (!s->token_ok(ctx)) {
                stats.refused_auth++;
                s->log_refusal(track.client, "no valid token");
                status = Status(StatusCode::UNAUTHENTICATED, "a valid token is required");
                return;
            }
            if (s->draining.load()) {
                stats.refused_shutdown++;
                status = Status(StatusCode::UNAVAILABLE, "server shutting down");
                return;
            }
            std::lock_guard<std::mutex> g(s->mu_);
            unsigned &n = s->per_client_[track.client];
            if (n >= s->cfg_.max_streams_per_client || s->active_ >= s->cfg_.max_streams) {
                if (n == 0)
                    s->per_client_.erase(track.client);
                stats.refused_limit++;
                s->log_refusal(track.client, "too many concurrent calls");
                status = Status(StatusCode::RESOURCE_EXHAUSTED,
                                n >= s->cfg_.max_streams_per_client
                                    ? "too many concurrent calls from this client"
                                    : "too many concurrent calls");
                return;
            }
            n++;
            s->active_++;
            counted = true;
            s->tracks_.push_back(&track);
            stats.active_streams++;
        }
        ~Admit()
        {
            if (!counted)
                return;
            std::lock_guard<std::mutex> g(s->mu_);
            s->tracks_.remove(&track);
            auto it = s->per_client_.find(track.client);
            if (it != s->per_client_.end() && --it->second == 0)
                s->per_client_.erase(it);
            s->active_--;
            stats.active_streams--;
        }
    };

    Status find_model(ServerContext *ctx, const std::string &name, Model **out)
    {
        if (!valid_model_name(name)) {
            stats.refused_name++;
            log_refusal(client_key(front->client_of(ctx->peer())), "bad model name");
            return Status(StatusCode::INVALID_ARGUMENT,
                          "bad model name: a plain entry of the server's root is expected");
        }
        auto it = models_.find(name);
        if (it == models_.end())
            return Status(StatusCode::NOT_FOUND, "no such model: " + echo_name(name));
        *out = it->second.get();
        return Status::OK;
    }

    // The largest data a TensorChunk may carry for a tensor name of
    // name_len bytes so that the serialized message is at most
    // kMaxMessage: each field at its largest encoding (a tag byte, a
    // varint of at most 10 bytes, the 32 bytes of sha256, 1 of last).
    static uint64_t max_chunk_data(size_t name_len)
    {
        const uint64_t overhead = (1 + 10 + name_len) + 3 * (1 + 10) + (1 + 1) +
                                  (1 + 1 + 32) + (1 + 10);
        return overhead + 4096 < kMaxMessage ? kMaxMessage - overhead : 4096;
    }

    Status chunk_size(uint32_t asked, uint32_t *out)
    {
        if (asked == 0) {
            *out = 1 << 20;
            return Status::OK;
        }
        if (asked < 4096 || asked > (4u << 20))
            return Status(StatusCode::INVALID_ARGUMENT, "chunk_bytes must be 0 or 4 KiB .. 4 MiB");
        *out = asked;
        return Status::OK;
    }

    // The common start of the streaming calls: admitted, a model, a chunk size.
    Status begin_stream(ServerContext *ctx, const Admit &a, const std::string &model,
                        uint32_t chunk_bytes, Model **m, uint32_t *chunk)
    {
        if (!a.status.ok())
            return a.status;
        Status st = find_model(ctx, model, m);
        if (!st.ok())
            return st;
        return chunk_size(chunk_bytes, chunk);
    }

    bool past_drain() const
    {
        return draining.load() && now_ns() > drain_deadline_ns.load();
    }

    // Acquires a verified handle, waiting up to --pool-wait for pool room.
    Status acquire(ServerContext *ctx, Model *m, size_t index, sluice_tensor **t)
    {
        auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(cfg_.pool_wait_s));
        unsigned sleep_ms = 1;
        for (;;) {
            int rc = sluice_acquire_index(m->m, index, t);
            if (rc == SLUICE_OK)
                return Status::OK;
            std::string msg = sluice_errmsg(m->m);
            if (rc != SLUICE_E_POOL_EXHAUSTED || Clock::now() > give_up || ctx->IsCancelled())
                return Status(code_of(rc), msg);
            if (past_drain())
                return Status(StatusCode::UNAVAILABLE, "server shutting down");
            std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
            sleep_ms = std::min(sleep_ms * 2, 50u);
        }
    }

    // Sends [off, off+len) of handle t as chunks; the last carries the digest.
    Status send(ServerContext *ctx, ServerWriter<pb::TensorChunk> *w, Track *track,
                sluice_tensor *t, size_t index, uint64_t off, uint64_t len, bool whole,
                uint32_t chunk)
    {
        const struct sluice_tensor_info *ti = sluice_tensor_info(t);
        const uint8_t *data = static_cast<const uint8_t *>(sluice_tensor_data(t));
        std::string name(ti->name, ti->name_len);
        uint8_t digest[32];
        EVP_MD_CTX *md = nullptr;
        if (whole) {
            if (sluice_tensor_digest(t, digest) != SLUICE_OK)
                return Status(StatusCode::INTERNAL, "no digest for " + name);
        } else {
            md = EVP_MD_CTX_new();
            if (!md || EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1) {
                EVP_MD_CTX_free(md);
                return Status(StatusCode::RESOURCE_EXHAUSTED, "out of memory");
            }
        }
        bool corrupt = !fault_corrupt.empty() && fault_corrupt == name;
        uint64_t pos = off, end = off + len;
        Status st = Status::OK;
        pb::TensorChunk c;
        // A whole message fits in gRPC's default receive limit (4 MiB), so
        // a stock client works at chunk_bytes = 4 MiB: the data is cut by
        // what the chunk's other fields take (their largest encoding).
        uint64_t data_max = std::min<uint64_t>(chunk, max_chunk_data(name.size()));
        do {
            uint64_t n = std::min<uint64_t>(data_max, end - pos);
            c.Clear();
            c.set_name(name);
            c.set_index(index);
            c.set_offset(pos);
            c.set_total_bytes(len);
            c.set_data(n ? reinterpret_cast<const char *>(data + pos) : "", n);
            if (md)
                EVP_DigestUpdate(md, data + pos, n);
            if (corrupt && n) {
                (*c.mutable_data())[0] ^= 0x01;
                corrupt = false;
            }
            pos += n;
            if (pos == end) {
                c.set_last(true);
                if (md) {
                    EVP_DigestFinal_ex(md, digest, nullptr);
                }
                c.set_sha256(digest, 32);
            }
            if (past_drain()) {
                st = Status(StatusCode::UNAVAILABLE, "server shutting down");
                break;
            }
            track->write_since_ns = now_ns();
            bool ok = w->Write(c);
            track->write_since_ns = 0;
            if (!ok) {
                st = Status(StatusCode::CANCELLED, "the client went away or was cancelled");
                break;
            }
            stats.bytes_sent += n;
            stats.chunks_sent++;
        } while (pos < end);
        (void)ctx;
        EVP_MD_CTX_free(md);
        return st;
    }

    Status get_tensor(ServerContext *ctx, const pb::GetTensorRequest *req,
                      ServerWriter<pb::TensorChunk> *w)
    {
        Admit a(this, ctx);
        Model *m = nullptr;
        uint32_t chunk = 0;
        Status st = begin_stream(ctx, a, req->model(), req->chunk_bytes(), &m, &chunk);
        if (!st.ok())
            return st;
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        int rc = sluice_find_n(m->m, req->name().data(), req->name().size(), &ti);
        if (rc != SLUICE_OK)
            return Status(rc == SLUICE_E_NOT_FOUND ? StatusCode::NOT_FOUND : code_of(rc),
                          rc == SLUICE_E_NOT_FOUND ? "no such tensor: " + echo_name(req->name())
                                                   : std::string(sluice_errmsg(m->m)));
        uint64_t off = 0, len = ti.nbytes;
        bool whole = true;
        if (req->has_range()) {
            off = req->range().offset();
            len = req->range().length();
            if (off > ti.nbytes || len > ti.nbytes - off)
                return Status(StatusCode::INVALID_ARGUMENT,
                              "range [" + std::to_string(off) + ", +" + std::to_string(len) +
                                  ") is outside the tensor's " + std::to_string(ti.nbytes) +
                                  " bytes");
            if (len == 0)
                len = ti.nbytes - off;
            whole = off == 0 && len == ti.nbytes;
        }
        sluice_tensor *t = nullptr;
        if (!(st = acquire(ctx, m, ti.index, &t)).ok())
            return st;
        st = send(ctx, w, &a.track, t, ti.index, off, len, whole, chunk);
        sluice_release(t);
        return st;
    }

    Status stream_tensors(ServerContext *ctx, const pb::StreamTensorsRequest *req,
                          ServerWriter<pb::TensorChunk> *w)
    {
        Admit a(this, ctx);
        Model *m = nullptr;
        uint32_t chunk = 0;
        Status st = begin_stream(ctx, a, req->model(), req->chunk_bytes(), &m, &chunk);
        if (!st.ok())
            return st;
        std::vector<size_t> order;
        if (req->names_size() == 0) {
            for (size_t i = 0; i < sluice_count(m->m); i++)
                order.push_back(i);
        } else {
            for (const std::string &n : req->names()) {
                struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
                if (sluice_find_n(m->m, n.data(), n.size(), &ti) != SLUICE_OK)
                    return Status(StatusCode::NOT_FOUND, "no such tensor: " + echo_name(n));
                order.push_back(ti.index);
            }
        }
        // One handle at a time: the library reads ahead along the model's
        // order while acquires follow it.
        for (size_t i : order) {
            if (past_drain())
                return Status(StatusCode::UNAVAILABLE, "server shutting down");
            if (ctx->IsCancelled())
                return Status(StatusCode::CANCELLED, "cancelled");
            sluice_tensor *t = nullptr;
            if (!(st = acquire(ctx, m, i, &t)).ok())
                return st;
            st = send(ctx, w, &a.track, t, i, 0, sluice_tensor_size(t), true, chunk);
            sluice_release(t);
            if (!st.ok())
                return st;
        }
        return Status::OK;
    }
};

// ------------------------------------------------------------ metrics HTTP
// GET /metrics: the models' families, rendered by the library in one
// exposition (sluice_metrics_write_models, Prometheus text 0.0.4), then the
// server's own (metrics_text). libmicrohttpd directly, with the bounds and
// answers of the library's endpoint (sluice.h, sluice_metrics_serve, which
// serves models only: the server's families could not be added to it
// without a library change): 32 connections, 8 per client address, 16 KiB
// of request, 5 s idle, and 5 s for a whole request from the connection's
// accept or its previous answer. libmicrohttpd's timeout is of idleness
// only (a client sending a header line every 2 s keeps its slot), so the
// deadline is a watchdog thread of ours: it shuts down the socket of a
// connection past it, and libmicrohttpd, seeing the stream end, closes it.
// The "closed" notifier runs before libmicrohttpd closes the socket, and
// the watchdog touches a socket only while its slot is in use under the
// lock: never a reused descriptor.
#ifdef SLUICE_SERVE_HAVE_MHD
constexpr unsigned metrics_connections = 32, metrics_per_address = 8;
constexpr unsigned metrics_idle_s = 5, metrics_deadline_s = 5;

struct MetricsConn {
    bool used = false, cut = false;
    int fd = -1;
    Clock::time_point since;  // accepted, or its last answer sent
};

struct MetricsHttp {
    std::vector<sluice_model *> models;
    struct MHD_Daemon *d = nullptr;
    unsigned port = 0;
    std::mutex mu;  // conns, stopping
    std::condition_variable wake;
    MetricsConn conns[metrics_connections];  // one per connection libmicrohttpd admits
    bool stopping = false;
    std::thread watchdog;
};

void metrics_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode code)
{
    auto *mh = static_cast<MetricsHttp *>(cls);
    std::lock_guard<std::mutex> g(mh->mu);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (auto *k = static_cast<MetricsConn *>(*socket_context))
            *k = MetricsConn();
        *socket_context = nullptr;
        return;
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return;
    for (MetricsConn &k : mh->conns)
        if (!k.used) {
            k.used = true;
            k.fd = ci->connect_fd;
            k.since = Clock::now();
            *socket_context = &k;
            return;
        }
    shutdown(ci->connect_fd, SHUT_RDWR);  // no slot (cannot be): not bounded, so refused
}

void metrics_on_completed(void *cls, struct MHD_Connection *conn, void **,
                          enum MHD_RequestTerminationCode)
{
    auto *mh = static_cast<MetricsHttp *>(cls);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    std::lock_guard<std::mutex> g(mh->mu);
    if (ci && ci->socket_context)
        static_cast<MetricsConn *>(ci->socket_context)->since = Clock::now();
}

void metrics_watchdog(MetricsHttp *mh)
{
    std::unique_lock<std::mutex> g(mh->mu);
    while (!mh->stopping) {
        mh->wake.wait_for(g, std::chrono::milliseconds(200));
        auto limit = Clock::now() - std::chrono::seconds(metrics_deadline_s);
        for (MetricsConn &k : mh->conns)
            if (k.used && !k.cut && k.since < limit) {
                shutdown(k.fd, SHUT_RDWR);
                k.cut = true;
            }
    }
}

MHD_Result metrics_reply(struct MHD_Connection *conn, unsigned code, const std::string &body,
                         sluice_metrics_format format = SLUICE_METRICS_PROMETHEUS)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        body.size(), const_cast<char *>(body.data()), MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type",
                            code != MHD_HTTP_OK ? "text/plain; charset=utf-8"
                            : format == SLUICE_METRICS_OPENMETRICS
                                ? "application/openmetrics-text; version=1.0.0; charset=utf-8"
                                : "text/plain; version=0.0.4; charset=utf-8");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, "Allow", "GET, HEAD");
    MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

MHD_Result metrics_handle(void *cls, struct MHD_Connection *conn, const char *url,
                          const char *method, const char *, const char *, size_t *upload_size,
                          void **con_cls)
{
    auto *mh = static_cast<MetricsHttp *>(cls);
    // The refusals on the first call, with the headers: answered at once,
    // a body never read (libmicrohttpd then closes the connection). An
    // answer queued while a body is still arriving is never sent.
    if (*con_cls == nullptr) {
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
            return metrics_reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET /metrics\n");
        if (strcmp(url, "/metrics") != 0)
            return metrics_reply(conn, MHD_HTTP_NOT_FOUND, "not found: only /metrics is served\n");
        const char *length =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if ((length && strcmp(length, "0") != 0) ||
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
            return metrics_reply(conn, MHD_HTTP_BAD_REQUEST, "bad request: GET /metrics has no body\n");
        *con_cls = mh;  // then answered once the request is read
        return MHD_YES;
    }
    if (*upload_size) {  // cannot be (no length, no chunks): dropped
        *upload_size = 0;
        return MHD_YES;
    }
    // The format the scrape asked for, by the library's one rule; the
    // models' families and the server's own both in it.
    const sluice_metrics_format format = sluice_metrics_format_for_accept(
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT));
    std::string body;
    size_t need = 0;
    sluice_metrics_write_models(mh->models.data(), mh->models.size(), nullptr, 0, &need,
                                format);
    for (int tries = 0; tries < 4; tries++) {
        body.assign(need + 4096, '\0');
        int rc = sluice_metrics_write_models(mh->models.data(), mh->models.size(), &body[0],
                                             body.size(), &need, format);
        if (rc == SLUICE_OK) {
            body.resize(strlen(body.c_str()));
            break;
        }
        if (rc != SLUICE_E_BUFFER) {
            body.clear();
            break;
        }
    }
    const bool om = format == SLUICE_METRICS_OPENMETRICS;
    static const char eof[] = "# EOF\n";  // OpenMetrics' last line, once: after ours
    if (om && body.size() >= sizeof eof - 1 &&
        body.compare(body.size() - (sizeof eof - 1), sizeof eof - 1, eof) == 0)
        body.resize(body.size() - (sizeof eof - 1));
    body += metrics_text(om);
    if (om)
        body += eof;
    return metrics_reply(conn, MHD_HTTP_OK, body, format);
}

bool metrics_start(MetricsHttp *mh, unsigned port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    mh->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, nullptr, nullptr,
        metrics_handle, mh, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_CONNECTION_LIMIT, metrics_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        metrics_per_address, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384,
        MHD_OPTION_CONNECTION_TIMEOUT, metrics_idle_s, MHD_OPTION_NOTIFY_CONNECTION,
        metrics_on_connection, mh, MHD_OPTION_NOTIFY_COMPLETED, metrics_on_completed, mh,
        MHD_OPTION_END);
    if (!mh->d)
        return false;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(mh->d, MHD_DAEMON_INFO_BIND_PORT);
    mh->port = info ? info->port : port;
    try {
        mh->watchdog = std::thread(metrics_watchdog, mh);
    } catch (const std::system_error &) {
        MHD_stop_daemon(mh->d);
        mh->d = nullptr;
        return false;
    }
    return true;
}

void metrics_stop(MetricsHttp *mh)
{
    if (mh->watchdog.joinable()) {
        {
            std::lock_guard<std::mutex> g(mh->mu);
            mh->stopping = true;
        }
        mh->wake.notify_one();
        mh->watchdog.join();
    }
    if (mh->d)
        MHD_stop_daemon(mh->d);  // its notifiers take mu
    mh->d = nullptr;
}
#endif
}  // namespace

int main(int argc, char **argv)
{
    Config cfg;
    if (!parse_args(argc, argv, &cfg))
        return 2;

    // SIGTERM and SIGINT are taken by sigwait on the main thread: blocked
    // before any thread starts, so every thread inherits the mask.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGPIPE, SIG_IGN);

    // The models.
    std::map<std::string, std::unique_ptr<Model>> models;
    std::vector<std::pair<std::string, std::string>> todo;  // name, path
    std::string root;  // root mode: its real path
    std::string path = cfg.path;
    struct stat st;
    // A remote location is one model (nothing remote is listed), given to
    // the library as written (a trailing '/' makes it a prefix).
    bool remote = is_remote_location(path);
    if (remote && cfg.force_root) {
        fprintf(stderr, "sluice serve: --root: %s is remote, one model (nothing remote is "
                        "listed)\n", shown_location(path).c_str());
        return 2;
    }
    if (remote) {
        std::string name = remote_model_name(path);
        if (!valid_model_name(name)) {
            fprintf(stderr, "sluice serve: %s: no name to serve it under ('%s': a plain name "
                            "is needed, not empty nor starting with '.')\n",
                    shown_location(path).c_str(), echo_name(name).c_str());
            return 2;
        }
    } else if (stat(path.c_str(), &st) != 0) {
        fprintf(stderr, "sluice serve: %s: %s\n", path.c_str(), strerror(errno));
        return CMD_EXIT_OPEN;
    }
    while (!remote && path.size() > 1 && path.back() == '/')
        path.pop_back();
    if (remote) {
        todo.emplace_back(remote_model_name(path), path);
    } else if (S_ISREG(st.st_mode) || (!cfg.force_root && dir_is_model(path))) {
        todo.emplace_back(base_name(path.c_str()), path);
    } else {
        char *rroot = realpath(path.c_str(), nullptr);
        if (!rroot) {
            fprintf(stderr, "sluice serve: %s: %s\n", path.c_str(), strerror(errno));
            return CMD_EXIT_OPEN;
        }
        root = rroot;
        free(rroot);
        if (!cfg.fallback.empty()) {
            fprintf(stderr, "sluice serve: --fallback names mirrors of one model, and %s is a "
                            "root of many\n", path.c_str());
            return 2;
        }
        DIR *d = opendir(path.c_str());
        if (!d) {
            fprintf(stderr, "sluice serve: %s: %s\n", path.c_str(), strerror(errno));
            return CMD_EXIT_OPEN;
        }
        while (struct dirent *e = readdir(d)) {
            std::string n = e->d_name;
            if (!valid_model_name(n))
                continue;
            std::string p = path + "/" + n;
            char *real = realpath(p.c_str(), nullptr);
            if (!real)
                continue;
            std::string r = real;
            free(real);
            // Symlinks out of the root are refused: the real path must be
            // inside the root's real path.
            if (!inside(root, r)) {
                fprintf(stderr, "sluice serve: %s: refused, it resolves outside the root\n",
                        p.c_str());
                continue;
            }
            struct stat es;
            if (stat(p.c_str(), &es) != 0)
                continue;
            if (S_ISREG(es.st_mode) && ends_with(n, ".safetensors"))
                todo.emplace_back(n, p);
            else if (S_ISDIR(es.st_mode) && dir_is_model(p))
                todo.emplace_back(n, p);
        }
        closedir(d);
    }
    int failed = 0, why = 0;  // why: the exit status of the failures (cmd.h)
    for (auto &np : todo) {
        auto m = std::make_unique<Model>();
        int rc = open_model(cfg, np.first, np.second, root, m.get());
        if (rc != SLUICE_OK) {
            failed++;
            why = cmd_exit_worse(why, cmd_exit_status(rc));
            continue;
        }
        models[np.first] = std::move(m);
    }
    if (models.empty()) {
        fprintf(stderr, "sluice serve: no model to serve under %s\n",
                shown_location(cfg.path).c_str());
        return why ? why : CMD_EXIT_OPEN;
    }
    if (failed)
        fprintf(stderr, "sluice serve: %d model(s) not served (see above)\n", failed);

    Server service(cfg, models);
    if (const char *f = getenv("SLUICE_SERVE_TEST_CORRUPT_CHUNK")) {
        service.fault_corrupt = f;
        fprintf(stderr, "sluice serve: TEST FAULT: corrupting the first chunk sent of '%s'\n", f);
    }
    if (!cfg.token_file.empty()) {
        std::string tok, why;
        if (!read_token_file(cfg.token_file, &tok, &why)) {
            fprintf(stderr, "sluice serve: --token-file %s: %s\n", cfg.token_file.c_str(),
                    why.c_str());
            for (auto &kv : models)
                sluice_close(kv.second->m);
            return CMD_EXIT_USAGE;
        }
        service.token = tok;
    }

    // TLS is the relay's (OpenSSL, the same certificate, key and client
    // CA rule as gRPC's SslServerCredentials): gRPC sees plaintext.
    SSL_CTX *tls = nullptr;
    if (!cfg.tls_cert.empty()) {
        std::string cert, key;
        if (!read_file(cfg.tls_key, &key) || !read_file(cfg.tls_cert, &cert)) {
            fprintf(stderr, "sluice serve: cannot read --tls-cert/--tls-key\n");
            return CMD_EXIT_USAGE;
        }
        if (!check_key_pair(cfg, cert, key)) {
            for (auto &kv : models)
                sluice_close(kv.second->m);
            return CMD_EXIT_USAGE;
        }
        if (!(tls = make_tls(cfg))) {
            for (auto &kv : models)
                sluice_close(kv.second->m);
            return CMD_EXIT_USAGE;
        }
    }

    relay::Limits lim;
    lim.max_connections = cfg.max_connections;
    lim.max_connections_per_address = cfg.max_connections_per_address;
    lim.max_open_streams = cfg.max_streams_per_connection + kStreamMargin;
    lim.request_timeout_s = cfg.request_timeout_s;
    lim.max_request_bytes_held = 2 * cfg.max_request_bytes;
    lim.user_timeout_ms = (unsigned)std::min((cfg.stall_timeout_s + 2) * 1000, 8.64e7);
    lim.idle_timeout_s = cfg.idle_timeout_s;
    lim.max_resets = cfg.max_resets;
    lim.max_control_frames = cfg.max_control_frames;
    lim.peer_read_timeout_s = cfg.stall_timeout_s + 2;
    lim.quiet = cfg.quiet;
    std::unique_ptr<grpc::Server> server;
    relay::Relay front(lim, &stats.conns, tls, [&server](int fd) {
        grpc::AddInsecureChannelFromFd(server.get(), fd);
    });
    unsigned port = 0;
    std::string lerr;
    if (!front.listen(cfg.listen, &port, &lerr)) {
        fprintf(stderr, "sluice serve: cannot listen on %s: %s\n", cfg.listen.c_str(),
                lerr.c_str());
        for (auto &kv : models)
            sluice_close(kv.second->m);
        return CMD_EXIT_OPEN;
    }
    service.front = &front;

    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder b;
    b.RegisterService(&service);
    b.SetMaxReceiveMessageSize((int)cfg.max_request_bytes);
    b.SetMaxSendMessageSize(kMaxReply);
    grpc::ResourceQuota quota("sluice-serve");
    quota.SetMaxThreads((int)cfg.max_threads);
    b.SetResourceQuota(quota);
    // HTTP/2 streams per connection advertised (gRPC 1.51 enforces it only
    // once the client has acknowledged the server's SETTINGS; the relay
    // bounds the others), and keepalive pings: a connection whose pings
    // are not answered within --stall-timeout + 2 s is dropped.
    b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, (int)cfg.max_streams_per_connection);
    // A stream's headers: at most 16 KiB (the relay's bound on a header
    // block too; part of the per-stream bound).
    b.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
    b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                         (int)std::min((cfg.stall_timeout_s + 2) * 1000, 8.64e7));
    // The sync server's pollers wake up this often; at exit the server
    // waits for each (the default, 10 s, delays the exit after SIGTERM).
    b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 200);
    server = b.BuildAndStart();
    if (!server) {
        fprintf(stderr, "sluice serve: the gRPC server did not start\n");
        for (auto &kv : models)
            sluice_close(kv.second->m);
        return 1;
    }
    front.start();
    std::string host = cfg.listen.substr(0, cfg.listen.rfind(':'));

#ifdef SLUICE_SERVE_HAVE_MHD
    MetricsHttp mh;
    for (auto &kv : models)
        mh.models.push_back(kv.second->m);
    if (cfg.metrics_port >= 0) {
        if (!metrics_start(&mh, (unsigned)cfg.metrics_port)) {
            fprintf(stderr, "sluice serve: cannot serve metrics on 127.0.0.1:%d\n",
                    cfg.metrics_port);
            front.refuse_new();
            server->Shutdown();
            front.stop();
            SSL_CTX_free(tls);
            for (auto &kv : models)
                sluice_close(kv.second->m);
            return 1;
        }
        printf("metrics on 127.0.0.1:%u\n", mh.port);
    }
#else
    if (cfg.metrics_port >= 0)
        fprintf(stderr, "sluice serve: built without libmicrohttpd: no --metrics-port\n");
#endif
    printf("listening on %s:%u (%zu model%s)\n", host.c_str(), port, models.size(),
           models.size() == 1 ? "" : "s");
    fflush(stdout);

    std::atomic<bool> stop_watchdog{false};
    std::thread watchdog([&] { service.watchdog_loop(&stop_watchdog); });

    int sig = 0;
    sigwait(&sigs, &sig);
    auto sig_at = Clock::now();
    auto since = [](Clock::time_point t) {
        return std::chrono::duration<double>(Clock::now() - t).count();
    };
    // New calls are refused (UNAVAILABLE, by the service while the port
    // stays open); calls in progress may finish until the grace ends minus
    // a margin, then end with UNAVAILABLE at their next chunk; a call still
    // blocked on a client that does not read is cancelled at the grace's
    // end. Then grpc shuts down with no call left.
    double margin = std::min(2.0, cfg.grace_s / 3);
    auto to_ns = [](Clock::time_point t) {
        return (int64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch())
            .count();
    };
    auto secs = [](double s) {
        return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    service.drain_deadline_ns = to_ns(sig_at + secs(cfg.grace_s - margin));
    service.draining = true;
    server->GetHealthCheckService()->SetServingStatus(false);
    // Said once it is so: new calls refused, the health service NOT_SERVING
    // (a test starts a client on this line).
    fprintf(stderr, "sluice serve: %s: draining for %.1f s\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
            cfg.grace_s);
    auto grace_end = sig_at + secs(cfg.grace_s);
    while (stats.active_streams.load() > 0 && Clock::now() < grace_end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // A call whose handler returned may still have chunks and its status
    // in the transport's buffers, on their way to a slow reader: a moment
    // for them before the transports close.
    auto flush_end = std::min(Clock::now() + secs(0.5), grace_end - secs(0.25));
    if (Clock::now() < flush_end)
        std::this_thread::sleep_for(flush_end - Clock::now());
    long left = (long)stats.active_streams.load();
    if (left > 0) {
        fprintf(stderr, "sluice serve: cancelling %ld call(s) at the grace's end\n", left);
        service.cancel_all();
        // A call blocked in a write to a socket that does not drain is not
        // ended by its cancel: after a moment, every connection is closed.
        auto abort_at = Clock::now() + secs(0.3);
        while (stats.active_streams.load() > 0 && Clock::now() < abort_at)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if ((left = (long)stats.active_streams.load()) > 0) {
            fprintf(stderr, "sluice serve: closing the connections of %ld call(s) still blocked\n",
                    left);
            service.abort_all();
        }
    }
    // No connection reaches gRPC once its shutdown begins.
    front.refuse_new();
    // Room for the last statuses to reach slow readers, then cancelled.
    auto sd_end = std::max(grace_end, Clock::now() + std::chrono::milliseconds(500));
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         sd_end - Clock::now()));
    fprintf(stderr, "sluice serve: calls ended (%.2f s)\n", since(sig_at));
    server->Wait();
    stop_watchdog = true;
    watchdog.join();
    front.stop();
    SSL_CTX_free(tls);
#ifdef SLUICE_SERVE_HAVE_MHD
    metrics_stop(&mh);
#endif
    fprintf(stderr, "sluice serve: server down (%.2f s)\n", since(sig_at));
    int bad = 0;
    for (auto &kv : models)
        if (sluice_close(kv.second->m) != SLUICE_OK)
            bad++;
    fprintf(stderr, "sluice serve: stopped (%.2f s after the signal)\n", since(sig_at));
    fflush(stdout);
    fflush(stderr);
    // Out without grpc's own teardown: grpc_shutdown joins an executor
    // thread that may sleep in a poll for up to 10 s (grpc 1.51), which
    // would hold the exit past the grace. Everything of ours is closed;
    // an AddressSanitizer build checks for leaks first.
    if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "sluice serve: leaks found\n");
        _exit(1);
    }
    _exit(bad ? 1 : 0);
}
