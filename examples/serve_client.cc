// serve_client.cc: a C++ client of `sluice serve` (the gRPC tensor
// service, proto/sluice/v1/tensor_service.proto). It checks every tensor
// it receives end to end (the SHA-256 of the bytes received, computed
// here) against the digest of a manifest the caller trusts (--manifest
// FILE), or, without one, against the manifest digest GetModel gives.
// Only with --manifest is the server a cache, not a point of trust: then
// the manifest's tensors are what is owed (GetModel must list exactly
// them, with the dtype, shape and nbytes the manifest gives, else every
// difference is a mismatch, exit 1); without it the digests are the
// server's word, which catches corruption but not a server that lies.
// With --compare it also compares the bytes with a local copy of the
// model read through the library. A chunk past a tensor's nbytes (or the
// range asked for) ends the call: the client never buffers more. A
// StreamTensors call owes GetModel's tensors each once, in its order; a
// range (--ranges) must be the bytes of the whole tensor just verified;
// an answer where a refusal is owed (a tensor GetModel does not list, a
// range outside the tensor) is a mismatch.
//
//   serve_client 127.0.0.1:7070 fetch synth --manifest synth/sluice.manifest.json
//   serve_client 10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070 fetch synth --stream --manifest ...
//
// Replicas: ADDR is one server (HOST:PORT), or a replica set: a list of
// IP:PORT (or [IPV6]:PORT) entries, or a target with gRPC's resolver
// scheme (dns:///NAME:PORT: every address the name resolves to; ipv4:A,B;
// ipv6:A,B). Calls to a replica set are spread by gRPC's round_robin over
// the replicas that are up and whose grpc.health.v1 status is SERVING
// (one that drains, from its SIGTERM on, gets no new call), and a call
// whose replica dies or drains (UNAVAILABLE, or CANCELLED by the server)
// is resumed on another (--failovers N times in the run, 8 by default; 0
// for one server): a stream from the next tensor, the tensor in flight
// from its next chunk, every byte still checked against the manifest
// digest. A list is shuffled once per run (std::random_device), so each
// client begins on a replica of its own drawing; the order is said on
// stderr ("replicas: ipv4:A,B,C") unless --quiet.
//
// usage: serve_client ADDR COMMAND [ARGS] [OPTIONS]
//   list                       the models
//   info MODEL                 files and tensors with their digests
//   get MODEL NAME             one tensor (--offset/--length: a range; -o FILE)
//   latency MODEL NAME         GetTensor --repeat times; p50/p99 latency
//   fetch MODEL                every tensor, one GetTensor each (--stream: one
//                              StreamTensors call; --ranges: also three byte
//                              ranges of each tensor; --compare LOCAL_PATH)
// options: --manifest FILE (a sluice manifest, version 1 or 2, or a
// {name: sha256} object, that the caller trusts), --token FILE, --ca PEM
// (TLS), --cert PEM --key PEM (client certificate), --server-name NAME
// (TLS name to check), --chunk N, --repeat N (fetch N times), --quiet,
// --allow-unverified (accept tensors GetModel gives no manifest digest
// for: else a mismatch), --failovers N (0 to 1000); for tests of the server's flow
// control, with --stream: --stall S (stop reading for S seconds after the
// run's first chunk; with --stall-until FILE, until FILE exists, at most S
// seconds: a test ends the stall when its checks are done, not at a time
// guessed to outlast them), --cancel (cancel after the first chunk).
// Exit status: 0 all verified, 1 a digest or comparison mismatch, 2 usage,
// 100 + the gRPC status code of a failed call (105 NOT_FOUND, 103
// INVALID_ARGUMENT, 115 DATA_LOSS, 116 UNAUTHENTICATED, ...); the status
// is printed on stderr as "status CODE_NAME: message".
#include "tensor_service.grpc.pb.h"

#include <sluice.h>

#include <cjson/cJSON.h>
#include <grpcpp/grpcpp.h>
#include <arpa/inet.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace pb = sluice::v1;

namespace {

const char *const code_names[17] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"};

struct Opts {
    std::string token, ca, cert, key, server_name, out, compare, manifest;
    uint64_t offset = 0, length = 0;
    bool range = false, stream = false, ranges = false, quiet = false;
    bool allow_unverified = false;  // accept tensors GetModel gives no digest for
    uint32_t chunk = 0;
    int repeat = 1;
    double stall = 0;      // --stall S: sleep S seconds after the run's first chunk
    std::string stall_until;  // --stall-until FILE: the stall ends once FILE exists
    bool cancel = false;   // --cancel: cancel the call after the first chunk
    int failovers = -1;    // --failovers N; -1: 8 for a replica set, 0 for one address
};

// A replica set is a target of several servers: "H:P,H:P,..." (IP
// addresses, made the ipv4: or ipv6: list gRPC's resolver takes), or a
// target given with its resolver's scheme (dns:///NAME:PORT, every address
// the name has; ipv4:A,B; ipv6:A,B). One "H:P" is one server, as before.
struct Target {
    std::string uri;
    bool replicas = false;
    bool addresses = false;  // an ipv4:/ipv6: list: no host name for TLS to check
    std::string err;  // not empty: the list is not one the client takes
};

// A list of addresses in a random order, drawn for each client (each
// process: one channel) from std::random_device, the kernel's source (no
// generator state shared with anything). gRPC's round_robin (1.51) hands
// a channel's first calls to the replicas that turn ready first, which
// are the list's first, and draws its picker's starting index from the
// C library's rand(), which nothing seeds: every client given the list in
// one order began on the same replica (3 clients streaming: all on the
// first). Shuffled, each client begins on a replica of its own drawing,
// and round_robin goes on from there, call by call.
std::string shuffled(const std::string &scheme, std::vector<std::string> entries)
{
    std::random_device rd;
    std::shuffle(entries.begin(), entries.end(), rd);
    std::string uri = scheme;
    for (size_t k = 0; k < entries.size(); k++)
        uri += (k ? "," : "") + entries[k];
    return uri;
}

std::vector<std::string> split_list(const std::string &s)
{
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string e;
    while (std::getline(ss, e, ','))
        v.push_back(e);
    return v;
}

Target target_of(const std::string &addr)
{
    Target t;
    for (const char *scheme : {"dns:", "ipv4:", "ipv6:"})
        if (addr.rfind(scheme, 0) == 0) {
            t.uri = addr;
            t.replicas = true;
            t.addresses = scheme[0] == 'i';
            // ipv4:A,B,... is a list too: shuffled. A dns: target's
            // addresses come from the resolver, in its order.
            if (t.addresses)
                t.uri = shuffled(scheme, split_list(addr.substr(strlen(scheme))));
            return t;
        }
    if (addr.find(',') == std::string::npos) {
        t.uri = addr;
        return t;
    }
    // gRPC's ipv4:/ipv6: lists take addresses of one family, no names.
    std::string family;
    std::vector<std::string> entries = split_list(addr);
    for (const std::string &e : entries) {
        size_t colon = e.rfind(':');
        std::string host = colon == std::string::npos ? "" : e.substr(0, colon);
        std::string port = colon == std::string::npos ? "" : e.substr(colon + 1);
        bool v6 = host.size() > 2 && host.front() == '[' && host.back() == ']';
        unsigned char buf[16];
        bool ip = v6 ? inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1
                     : inet_pton(AF_INET, host.c_str(), buf) == 1;
        bool port_ok = !port.empty() && port.size() <= 5 &&
                       port.find_first_not_of("0123456789") == std::string::npos &&
                       atoi(port.c_str()) > 0 && atoi(port.c_str()) < 65536;
        if (!ip || !port_ok) {
            t.err = "\"" + e + "\": a list of servers takes IP:PORT or [IPV6]:PORT entries (a "
                    "name with several addresses: dns:///NAME:PORT)";
            return t;
        }
        std::string f = v6 ? "ipv6:" : "ipv4:";
        if (!family.empty() && f != family) {
            t.err = "a list of servers takes addresses of one family (IPv4 or IPv6)";
            return t;
        }
        family = f;
    }
    t.uri = shuffled(family, entries);
    t.replicas = t.addresses = true;
    return t;
}

// The channel of a replica set: gRPC's round_robin over every address,
// each health-checked through grpc.health.v1 Watch (a replica that says
// NOT_SERVING, as a server does from its SIGTERM on, gets no new call),
// and a call that fails UNAVAILABLE before any answer came is retried by
// gRPC itself (on another replica: each attempt is picked anew). A call
// that fails after answers came is resumed by the client (failover below).
// The largest reply taken: GetModel lists every tensor and carries the
// server's manifest, about 2 x the name + 190 bytes a tensor, past gRPC's
// default 4 MiB at some 11,000-15,000 tensors; 1 GiB covers 1,000,000
// tensors of names up to about 440 bytes (sluice.client's
// MAX_REPLY_BYTES; the server sends up to it). The
// chunk calls keep 4 MiB a message (the service config below): every chunk
// of the server fits, and a bigger one fails the call before it is held.
constexpr int kMaxReply = 1 << 30;
// A StreamTensors request names at most this many bytes of names (a tag
// and a length each too): a resume naming every tensor still owed is split
// into calls, one after another, to stay under the server's default
// --max-request-bytes (1 MiB). sluice.client's MAX_STREAM_REQUEST_BYTES.
constexpr size_t kMaxStreamRequest = 512 << 10;

#define SL_CHUNKED                                                                         \
    "{\"name\":[{\"service\":\"sluice.v1.TensorService\",\"method\":\"GetTensor\"},"       \
    "{\"service\":\"sluice.v1.TensorService\",\"method\":\"StreamTensors\"}],"             \
    "\"maxResponseMessageBytes\":\"4194304\""
#define SL_RETRY                                                                           \
    ",\"retryPolicy\":{\"maxAttempts\":4,\"initialBackoff\":\"0.1s\",\"maxBackoff\":\"1s\","  \
    "\"backoffMultiplier\":2,\"retryableStatusCodes\":[\"UNAVAILABLE\"]}"
// One server: the chunk calls' bound. A replica set: also round_robin,
// health checks and the retry policy; a method's own entry replaces the
// service's, so each carries the retry policy.
const char *const kServiceConfig = "{\"methodConfig\":[" SL_CHUNKED "}]}";
const char *const kReplicaServiceConfig =
    "{\"loadBalancingConfig\":[{\"round_robin\":{}}],"
    "\"healthCheckConfig\":{\"serviceName\":\"\"},"
    "\"methodConfig\":[" SL_CHUNKED SL_RETRY "},"
    "{\"name\":[{\"service\":\"sluice.v1.TensorService\"}]" SL_RETRY "}]}";
#undef SL_CHUNKED
#undef SL_RETRY

bool slurp(const std::string &path, std::string *out)
{
    std::ifstream f(path, std::ios::binary);
    if (!f)
        return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return true;
}

int fail_status(const grpc::Status &st)
{
    int c = (int)st.error_code();
    fprintf(stderr, "status %s: %s\n", c >= 0 && c < 17 ? code_names[c] : "?",
            st.error_message().c_str());
    return 100 + c;
}

std::string hex(const std::string &d)
{
    static const char h[] = "0123456789abcdef";
    std::string s;
    for (unsigned char ch : d) {
        s += h[ch >> 4];
        s += h[ch & 15];
    }
    return s;
}

std::string sha256(const void *p, size_t n)
{
    unsigned char d[32];
    unsigned len = 0;
    EVP_Digest(p, n, d, &len, EVP_sha256(), nullptr);
    return std::string(reinterpret_cast<char *>(d), 32);
}

class Client {
public:
    Client(const Target &target, const Opts &o) : o_(o)
    {
        std::shared_ptr<grpc::ChannelCredentials> creds;
        if (!o.ca.empty()) {
            grpc::SslCredentialsOptions so;
            slurp(o.ca, &so.pem_root_certs);
            if (!o.cert.empty()) {
                slurp(o.cert, &so.pem_cert_chain);
                slurp(o.key, &so.pem_private_key);
            }
            creds = grpc::SslCredentials(so);
        } else {
            creds = grpc::InsecureChannelCredentials();
        }
        grpc::ChannelArguments args;
        // kMaxReply for GetModel; 4 MiB for the chunk calls (service config).
        args.SetMaxReceiveMessageSize(kMaxReply);
        if (!o.server_name.empty())
            args.SetSslTargetNameOverride(o.server_name);
        args.SetServiceConfigJSON(target.replicas ? kReplicaServiceConfig : kServiceConfig);
        failovers_ = o.failovers >= 0 ? o.failovers : target.replicas ? 8 : 0;
        stub_ = pb::TensorService::NewStub(grpc::CreateCustomChannel(target.uri, creds, args));
        if (!o.token.empty()) {
            // The server's rule: ASCII whitespace off both ends.
            slurp(o.token, &token_);
            const char *ws = " \t\r\n\v\f";
            size_t b = token_.find_first_not_of(ws), e = token_.find_last_not_of(ws);
            token_ = b == std::string::npos ? "" : token_.substr(b, e - b + 1);
        }
    }

    void prepare(grpc::ClientContext *ctx, int seconds = 120)
    {
        if (!token_.empty())
            ctx->AddMetadata("authorization", "Bearer " + token_);
        ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    }

    // Failover: whether a call that ended with st may be made again on
    // another replica: UNAVAILABLE (the server died, its connection broke,
    // or its drain ended the call) or CANCELLED (by the server: the end of
    // its drain's grace, --stall-timeout; the client's own cancels never
    // come here). Nothing else is retried: the server's NOT_FOUND,
    // DATA_LOSS, ... would be the same elsewhere, or say something is
    // wrong. Counts the attempt; waits a backoff (50 ms, doubling, at most
    // 1 s) first, and says so on stderr.
    bool failover(const grpc::Status &st, const std::string &what, const std::string &peer)
    {
        auto code = st.error_code();
        if ((code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::CANCELLED) ||
            used_ >= failovers_)
            return false;
        double wait = std::min(1.0, 0.05 * (double)(1u << std::min(used_, 5)));
        used_++;
        fprintf(stderr, "failover %d/%d: %s on %s: %s (%s); resuming on another replica\n",
                used_, failovers_, what.c_str(), peer.empty() ? "?" : peer.c_str(),
                code_names[(int)code], st.error_message().c_str());
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        return true;
    }

    // The replica that served a call made again, after its failover line.
    void resumed_on(const std::string &peer) { fprintf(stderr, "resumed on %s\n", peer.c_str()); }

    grpc::Status list(pb::ListModelsResponse *r)
    {
        grpc::ClientContext ctx;
        prepare(&ctx);
        return stub_->ListModels(&ctx, pb::ListModelsRequest(), r);
    }

    grpc::Status model(const std::string &name, pb::ModelInfo *r)
    {
        grpc::ClientContext ctx;
        prepare(&ctx);
        pb::GetModelRequest q;
        q.set_model(name);
        return stub_->GetModel(&ctx, q, r);
    }

    // One tensor (or range) into *out; *sent_digest: the server's digest.
    // owed: the bytes it must add up to (the tensor's nbytes, the range's
    // length); a chunk that brings more, or says another total_bytes, ends
    // the call as DATA_LOSS, so a server cannot make the client buffer more.
    // A call that fails UNAVAILABLE (or CANCELLED by the server) is made
    // again on another replica (failover): a whole tensor that has a
    // manifest digest (resumable:
    // the digest then checks every byte, end to end, whichever replica
    // sent it) from the next chunk, as a range of what is left; a range, or
    // a tensor nothing would check, from its start. *out may hold the
    // first bytes of a resumable tensor already (a stream's, see
    // fetch_stream); *sent_digest is then the digest of what the client
    // holds, the last piece having been checked against the server's.
    grpc::Status tensor(const std::string &model, const std::string &name, bool range,
                        uint64_t off, uint64_t len, uint64_t owed, std::string *out,
                        std::string *sent_digest, bool resumable = false)
    {
        if (!resumable || range)
            out->clear();
        for (bool again = resumable && !range && !out->empty();; again = true) {
            size_t have = out->size();
            std::string peer;
            grpc::Status st;
            if (have == owed && have > 0) {  // every byte came, the last chunk did not
                *sent_digest = sha256(out->data(), out->size());
                return grpc::Status::OK;
            }
            if (have > 0) {
                st = piece(model, name, true, have, owed - have, out, sent_digest, &peer);
                if (st.ok() && *sent_digest != sha256(out->data() + have, out->size() - have))
                    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                                        name + ": the server's digest of the piece resumed "
                                        "differs");
                if (st.ok())
                    *sent_digest = sha256(out->data(), out->size());
            } else {
                st = piece(model, name, range, off, range ? len : 0, out, sent_digest, &peer,
                           owed);
            }
            if (st.ok() && again)
                resumed_on(peer);
            if (st.ok() || !failover(st, "GetTensor " + name, peer))
                return st;
            if (!resumable || range)
                out->clear();
        }
    }

    std::unique_ptr<grpc::ClientReader<pb::TensorChunk>> stream(
        grpc::ClientContext *ctx, const std::string &model,
        const std::vector<std::string> &names = {})
    {
        prepare(ctx, 600);
        pb::StreamTensorsRequest q;
        q.set_model(model);
        for (const auto &n : names)
            q.add_names(n);
        q.set_chunk_bytes(o_.chunk);
        return stub_->StreamTensors(ctx, q);
    }

private:
    // One GetTensor call, its chunks appended to *out: [off, off + len) of
    // the tensor when ranged (len 0: to its end), owed bytes in all
    // (owed 0 with ranged: len).
    grpc::Status piece(const std::string &model, const std::string &name, bool ranged,
                       uint64_t off, uint64_t len, std::string *out, std::string *sent_digest,
                       std::string *peer, uint64_t owed = 0)
    {
        if (!owed)
            owed = len;
        grpc::ClientContext ctx;
        prepare(&ctx);
        pb::GetTensorRequest q;
        q.set_model(model);
        q.set_name(name);
        q.set_chunk_bytes(o_.chunk);
        if (ranged) {
            q.mutable_range()->set_offset(off);
            q.mutable_range()->set_length(len);
        }
        auto reader = stub_->GetTensor(&ctx, q);
        pb::TensorChunk c;
        const size_t start = out->size();
        bool last = false;
        uint64_t base = ranged ? off : 0;
        while (reader->Read(&c)) {
            uint64_t got = out->size() - start;
            const char *bad = nullptr;
            if (c.offset() != base + got || last)
                bad = "chunks out of order";
            else if (c.total_bytes() != owed)
                bad = "a chunk's total_bytes is not what is owed";
            else if (c.data().size() > owed - got)
                bad = "more bytes than owed";
            if (bad) {
                ctx.TryCancel();
                reader->Finish();
                return grpc::Status(grpc::StatusCode::DATA_LOSS, name + ": " + bad);
            }
            if (!got)  // owed is the server's word without a manifest: capped
                out->reserve(start + std::min<uint64_t>(owed, 64u << 20));
            out->append(c.data());
            if (c.last()) {
                last = true;
                *sent_digest = c.sha256();
            }
        }
        grpc::Status st = reader->Finish();
        *peer = ctx.peer();
        if (st.ok() && !last)
            return grpc::Status(grpc::StatusCode::DATA_LOSS, "stream ended without its last chunk");
        if (st.ok() && out->size() - start != owed)
            return grpc::Status(grpc::StatusCode::DATA_LOSS, name + ": fewer bytes than owed");
        return st;
    }

    const Opts &o_;
    std::unique_ptr<pb::TensorService::Stub> stub_;
    std::string token_;
    int failovers_ = 0;  // failovers allowed in the run
    int used_ = 0;       // failovers used
};

// The local copy: the model opened through the library (no manifest).
struct Local {
    sluice_model *m = nullptr;
    ~Local() { sluice_close(m); }
    bool open(const std::string &path)
    {
        sluice_options o;
        sluice_options_init(&o);
        o.verify = SLUICE_VERIFY_OFF;
        o.pool_bytes = 1ull << 30;
        if (sluice_open(path.c_str(), &o, &m) != SLUICE_OK) {
            fprintf(stderr, "%s: %s\n", path.c_str(), sluice_errmsg(m));
            return false;
        }
        return true;
    }
    // Whether bytes equal [off, off+len) of the local tensor.
    bool same(const std::string &name, uint64_t off, const std::string &bytes)
    {
        sluice_tensor *t = nullptr;
        if (sluice_acquire(m, name.c_str(), &t) != SLUICE_OK) {
            fprintf(stderr, "local %s: %s\n", name.c_str(), sluice_errmsg(m));
            return false;
        }
        bool eq = off + bytes.size() <= sluice_tensor_size(t) &&
                  (bytes.empty() ||
                   memcmp(static_cast<const char *>(sluice_tensor_data(t)) + off, bytes.data(),
                          bytes.size()) == 0);
        sluice_release(t);
        return eq;
    }
};

// A manifest the caller trusts (--manifest): per tensor its digest and,
// when it gives them (version 2), dtype, shape and nbytes.
struct Trusted {
    std::string digest;  // 32 bytes
    std::string dtype;   // empty: not given
    std::vector<uint64_t> shape;
    bool has_shape = false;
    bool has_nbytes = false;
    uint64_t nbytes = 0;
};

bool unhex(const char *h, std::string *out)
{
    out->clear();
    if (!h || strlen(h) != 64)
        return false;
    for (int i = 0; i < 64; i += 2) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char ch = h[i + k];
            int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                  : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
            if (d < 0)
                return false;
            v = v * 16 + d;
        }
        out->push_back((char)v);
    }
    return true;
}

bool u53(const cJSON *n, uint64_t *out)
{
    if (!cJSON_IsNumber(n) || n->valuedouble < 0 || n->valuedouble > 9007199254740992.0 ||
        n->valuedouble != (double)(uint64_t)n->valuedouble)
        return false;
    *out = (uint64_t)n->valuedouble;
    return true;
}

// Reads the trusted manifest at path into *out; false with a message.
bool read_trusted(const std::string &path, std::map<std::string, Trusted> *out)
{
    std::string text;
    if (!slurp(path, &text)) {
        fprintf(stderr, "%s: cannot read\n", path.c_str());
        return false;
    }
    std::unique_ptr<cJSON, void (*)(cJSON *)> doc(cJSON_ParseWithLength(text.data(), text.size()),
                                                  cJSON_Delete);
    if (!cJSON_IsObject(doc.get())) {
        fprintf(stderr, "%s: not a JSON object\n", path.c_str());
        return false;
    }
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(doc.get(), "format");
    bool structured = cJSON_IsString(format) && strcmp(format->valuestring, "sluice-manifest") == 0;
    const cJSON *tensors = doc.get();
    if (structured) {
        const cJSON *alg = cJSON_GetObjectItemCaseSensitive(doc.get(), "algorithm");
        if (!cJSON_IsString(alg) || strcmp(alg->valuestring, "sha256") != 0) {
            fprintf(stderr, "%s: not a sha256 manifest; the service's digests are SHA-256\n",
                    path.c_str());
            return false;
        }
        tensors = cJSON_GetObjectItemCaseSensitive(doc.get(), "tensors");
        if (!cJSON_IsObject(tensors)) {
            fprintf(stderr, "%s: no \"tensors\" object\n", path.c_str());
            return false;
        }
    }
    for (const cJSON *e = tensors->child; e; e = e->next) {
        Trusted t;
        const cJSON *d = structured ? cJSON_GetObjectItemCaseSensitive(e, "digest") : e;
        if (structured && !d)
            d = cJSON_GetObjectItemCaseSensitive(e, "sha256");
        bool ok = cJSON_IsString(d) && unhex(d->valuestring, &t.digest);
        if (ok && structured) {
            const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
            const cJSON *nb = cJSON_GetObjectItemCaseSensitive(e, "nbytes");
            if (dt)
                ok = cJSON_IsString(dt) && (t.dtype = dt->valuestring, true);
            if (ok && sh) {
                ok = cJSON_IsArray(sh);
                t.has_shape = true;
                for (const cJSON *k = ok ? sh->child : nullptr; k && ok; k = k->next) {
                    uint64_t v = 0;
                    ok = u53(k, &v);
                    t.shape.push_back(v);
                }
            }
            if (ok && nb)
                ok = (t.has_nbytes = u53(nb, &t.nbytes));
        }
        if (!ok) {
            fprintf(stderr, "%s: tensor %s: a bad entry\n", path.c_str(), e->string);
            return false;
        }
        (*out)[e->string] = t;
    }
    return true;
}

std::string dims(const std::vector<uint64_t> &shape)
{
    std::string s = "[";
    for (size_t k = 0; k < shape.size(); k++)
        s += (k ? "," : "") + std::to_string(shape[k]);
    return s + "]";
}

// Checks GetModel's listing against the trusted manifest (what is owed is
// the manifest's tensors: none missing, none extra, none listed twice, each
// described as the manifest says), prints each difference, and puts the
// manifest's digests in place of GetModel's. Returns the differences.
int apply_trusted(pb::ModelInfo *mi, const std::map<std::string, Trusted> &trusted)
{
    int bad = 0;
    std::map<std::string, int> seen;
    for (auto &t : *mi->mutable_tensors()) {
        const char *name = t.name().c_str();
        auto it = trusted.find(t.name());
        if (seen[t.name()]++) {
            fprintf(stderr, "MISMATCH %s: listed twice by GetModel\n", name);
            bad++;
            continue;
        }
        if (it == trusted.end()) {
            fprintf(stderr, "MISMATCH %s: listed by GetModel, not in the trusted manifest\n", name);
            bad++;
            continue;
        }
        const Trusted &w = it->second;
        std::vector<uint64_t> shape(t.shape().begin(), t.shape().end());
        if (!w.dtype.empty() && t.dtype() != w.dtype) {
            fprintf(stderr, "MISMATCH %s: dtype %s, trusted manifest %s\n", name,
                    t.dtype().c_str(), w.dtype.c_str());
            bad++;
        } else if (w.has_shape && shape != w.shape) {
            fprintf(stderr, "MISMATCH %s: shape %s, trusted manifest %s\n", name,
                    dims(shape).c_str(), dims(w.shape).c_str());
            bad++;
        } else if (w.has_nbytes && t.nbytes() != w.nbytes) {
            fprintf(stderr, "MISMATCH %s: nbytes %llu, trusted manifest %llu\n", name,
                    (unsigned long long)t.nbytes(), (unsigned long long)w.nbytes);
            bad++;
        }
        t.set_sha256(w.digest);
    }
    for (const auto &kv : trusted)
        if (!seen.count(kv.first)) {
            fprintf(stderr, "MISMATCH %s: in the trusted manifest, not listed by GetModel\n",
                    kv.first.c_str());
            bad++;
        }
    return bad;
}

int usage()
{
    fprintf(stderr,
            "usage: serve_client ADDR list | info MODEL | get MODEL NAME | fetch MODEL\n"
            "  [--offset N --length N] [-o FILE] [--stream] [--ranges] [--compare PATH]\n"
            "  [--manifest FILE] [--token FILE] [--ca PEM [--cert PEM --key PEM] [--server-name N]]\n"
            "  [--chunk N] [--repeat N] [--quiet] [--allow-unverified] [--failovers N]\n"
            "ADDR: HOST:PORT, or replicas: IP:PORT,IP:PORT,... | dns:///NAME:PORT | ipv4:A,B\n");
    return 2;
}

int check_tensor(const pb::TensorInfo &ti, const std::string &bytes, const std::string &sent,
                 Local *local, const Opts &o)
{
    std::string d = sha256(bytes.data(), bytes.size());
    if (bytes.size() != ti.nbytes()) {
        fprintf(stderr, "MISMATCH %s: %zu bytes, want %llu\n", ti.name().c_str(), bytes.size(),
                (unsigned long long)ti.nbytes());
        return 1;
    }
    // No manifest digest (a model served --allow-unverified, or a server
    // that omits it): only the server's own digest would be left, which
    // guards the transfer only, so this is not "verified" unless asked.
    if (ti.sha256().empty() && !o.allow_unverified) {
        fprintf(stderr, "MISMATCH %s: GetModel gives no manifest digest (--allow-unverified "
                        "to accept)\n", ti.name().c_str());
        return 1;
    }
    if (!ti.sha256().empty() && d != ti.sha256()) {
        fprintf(stderr, "MISMATCH %s: sha256 %s, manifest %s\n", ti.name().c_str(),
                hex(d).c_str(), hex(ti.sha256()).c_str());
        return 1;
    }
    if (d != sent) {
        fprintf(stderr, "MISMATCH %s: the server's digest differs\n", ti.name().c_str());
        return 1;
    }
    if (local && !local->same(ti.name(), 0, bytes)) {
        fprintf(stderr, "MISMATCH %s: differs from the local copy\n", ti.name().c_str());
        return 1;
    }
    if (!o.quiet)
        printf("ok %s %llu %s\n", ti.name().c_str(), (unsigned long long)ti.nbytes(),
               hex(d).c_str());
    return 0;
}

// GetModel's tensors from k on, as many as fit in one StreamTensors request
// of kMaxStreamRequest bytes of names (at least one; none past the last).
std::vector<std::string> next_names(const pb::ModelInfo &mi, size_t k)
{
    std::vector<std::string> names;
    size_t size = 0;
    for (; k < (size_t)mi.tensors_size(); k++) {
        const std::string &n = mi.tensors((int)k).name();
        size += n.size() + 6;
        if (!names.empty() && size > kMaxStreamRequest)
            break;
        names.push_back(n);
    }
    return names;
}

// One pass of `fetch --stream`: GetModel's tensors (with --manifest,
// checked to be the manifest's), each once, in its order, by
// StreamTensors. A call that fails UNAVAILABLE (or CANCELLED by the
// server) is resumed on another
// replica (failover): the tensor it was in from its next chunk (a range of
// what is left, by GetTensor: the manifest digest checks the whole), then
// one StreamTensors call for the tensors still owed, named in the model's
// order. Returns -1 at the pass's end (mismatches added to *bad), else
// the exit status. *stall: the run's --stall still to come.
// The names go in calls of at most kMaxStreamRequest bytes of names each,
// one after another (next_names).
int fetch_stream(Client &c, const std::string &model, const pb::ModelInfo &mi,
                 const std::map<std::string, const pb::TensorInfo *> &by_name, Local *lp,
                 const Opts &o, bool *stall, uint64_t *total, int *bad)
{
    size_t done = 0;
    std::vector<std::string> names;  // empty: every tensor (the first call)
    for (bool resumed = false;;) {
        // This call owes GetModel's tensors [done, end).
        const size_t end = names.empty() ? (size_t)mi.tensors_size() : done + names.size();
        grpc::ClientContext ctx;
        auto reader = c.stream(&ctx, model, names);
        pb::TensorChunk ch;
        std::string cur, bytes;
        bool first = true, in_tensor = false;
        while (reader->Read(&ch)) {
            if (*stall && o.stall > 0) {
                fprintf(stderr, "stalling after the first chunk\n");
                auto end = std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(o.stall));
                if (o.stall_until.empty())
                    std::this_thread::sleep_until(end);
                while (!o.stall_until.empty() && std::chrono::steady_clock::now() < end &&
                       access(o.stall_until.c_str(), F_OK) != 0)
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            *stall = false;
            if (first && o.cancel) {
                ctx.TryCancel();
                grpc::Status st = reader->Finish();
                fprintf(stderr, "cancelled after the first chunk\n");
                return fail_status(st);
            }
            if (first && resumed)
                c.resumed_on(ctx.peer());
            resumed = false;
            first = false;
            if (!in_tensor || ch.name() != cur) {
                if (!bytes.empty()) {
                    fprintf(stderr, "MISMATCH %s: next tensor before the last chunk\n",
                            cur.c_str());
                    (*bad)++;
                }
                cur = ch.name();
                bytes.clear();
                in_tensor = true;
                // What is owed, in order: GetModel's tensors, each once.
                // Counting alone would take a tensor sent twice for one
                // never sent.
                const int want = (int)done;
                if (done >= end || cur != mi.tensors(want).name()) {
                    fprintf(stderr, "MISMATCH %s: not the tensor expected next (%s)\n",
                            cur.c_str(),
                            done < end ? mi.tensors(want).name().c_str()
                                       : "none: every tensor asked for was sent");
                    ctx.TryCancel();
                    reader->Finish();
                    return 1;
                }
            }
            if (ch.offset() != bytes.size()) {
                fprintf(stderr, "MISMATCH %s: chunk out of order\n", cur.c_str());
                (*bad)++;
            }
            // Never a byte past the tensor's nbytes: a server that sends
            // more ends the call here instead of filling the client.
            auto it = by_name.find(cur);
            if (it == by_name.end() || ch.data().size() > it->second->nbytes() - bytes.size()) {
                fprintf(stderr, "MISMATCH %s: %s\n", cur.c_str(),
                        it == by_name.end() ? "not in GetModel" : "more bytes than its nbytes");
                ctx.TryCancel();
                reader->Finish();
                return 1;
            }
            bytes.append(ch.data());
            if (ch.last()) {
                *bad += check_tensor(*it->second, bytes, ch.sha256(), lp, o);
                *total += bytes.size();
                done++;
                bytes.clear();
                in_tensor = false;
            }
        }
        grpc::Status st = reader->Finish();
        if (st.ok()) {
            if (!in_tensor && done == end && end < (size_t)mi.tensors_size()) {
                names = next_names(mi, done);  // the next call's
                continue;
            }
            if (done != (size_t)mi.tensors_size()) {
                fprintf(stderr, "MISMATCH: %zu tensors streamed, the model has %d\n", done,
                        mi.tensors_size());
                (*bad)++;
            }
            return -1;
        }
        if (!c.failover(st, "StreamTensors of " + model, ctx.peer()))
            return fail_status(st);
        if (in_tensor) {
            // The tensor the call was in: the rest of it (all of it when no
            // manifest digest would check the bytes already here).
            const pb::TensorInfo &t = *by_name.at(cur);
            std::string sent;
            fprintf(stderr, "resuming %s from byte %zu\n", cur.c_str(),
                    t.sha256().empty() ? (size_t)0 : bytes.size());
            if (!(st = c.tensor(model, cur, false, 0, 0, t.nbytes(), &bytes, &sent,
                                !t.sha256().empty())).ok())
                return fail_status(st);
            *bad += check_tensor(t, bytes, sent, lp, o);
            *total += bytes.size();
            done++;
        }
        names = next_names(mi, done);
        if (names.empty())
            return -1;
        resumed = true;
    }
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc < 3)
        return usage();
    std::string addr = argv[1], cmd = argv[2];
    std::vector<std::string> pos;
    Opts o;
    for (int i = 3; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--token") o.token = val();
        else if (a == "--manifest") o.manifest = val();
        else if (a == "--ca") o.ca = val();
        else if (a == "--cert") o.cert = val();
        else if (a == "--key") o.key = val();
        else if (a == "--server-name") o.server_name = val();
        else if (a == "-o") o.out = val();
        else if (a == "--compare") o.compare = val();
        else if (a == "--offset") { o.offset = strtoull(val().c_str(), nullptr, 10); o.range = true; }
        else if (a == "--length") { o.length = strtoull(val().c_str(), nullptr, 10); o.range = true; }
        else if (a == "--chunk") o.chunk = (uint32_t)strtoul(val().c_str(), nullptr, 10);
        else if (a == "--repeat") o.repeat = atoi(val().c_str());
        else if (a == "--failovers") {
            // A count: anything else (a sign, a letter, past 1000) is usage.
            std::string v = val();
            if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos ||
                atoi(v.c_str()) > 1000)
                return usage();
            o.failovers = atoi(v.c_str());
        }
        else if (a == "--stall") o.stall = atof(val().c_str());
        else if (a == "--stall-until") o.stall_until = val();
        else if (a == "--cancel") o.cancel = true;
        else if (a == "--stream") o.stream = true;
        else if (a == "--ranges") o.ranges = true;
        else if (a == "--quiet" || a == "-q") o.quiet = true;
        else if (a == "--allow-unverified") o.allow_unverified = true;
        else if (!a.empty() && a[0] == '-') return usage();
        else pos.push_back(a);
    }
    Target target = target_of(addr);
    // TLS checks the target's name, and a list of addresses has none (gRPC
    // would check the whole list as one name, and every handshake fail).
    if (target.err.empty() && target.addresses && !o.ca.empty() && o.server_name.empty())
        target.err = "a list of servers over TLS needs --server-name NAME (the name in the "
                     "replicas' certificates)";
    if (!target.err.empty()) {
        fprintf(stderr, "serve_client: %s\n", target.err.c_str());
        return 2;
    }
    // A replica set: the order this client drew (its rotation's start), said.
    if (target.replicas && !o.quiet)
        fprintf(stderr, "replicas: %s\n", target.uri.c_str());
    Client c(target, o);
    grpc::Status st;

    if (cmd == "list") {
        pb::ListModelsResponse r;
        if (!(st = c.list(&r)).ok())
            return fail_status(st);
        for (const auto &m : r.models())
            printf("%s\t%llu tensors\t%llu bytes\t%s\n", m.name().c_str(),
                   (unsigned long long)m.tensor_count(), (unsigned long long)m.total_bytes(),
                   m.verified() ? "verified" : "unverified");
        return 0;
    }
    if (pos.empty())
        return usage();
    pb::ModelInfo mi;
    if (!(st = c.model(pos[0], &mi)).ok())
        return fail_status(st);
    if (!o.manifest.empty()) {
        std::map<std::string, Trusted> trusted;
        if (!read_trusted(o.manifest, &trusted))
            return 2;
        if (apply_trusted(&mi, trusted))
            return 1;
    }
    std::map<std::string, const pb::TensorInfo *> by_name;
    for (const auto &t : mi.tensors())
        by_name[t.name()] = &t;

    if (cmd == "info") {
        printf("model %s: %d files, %d tensors, %llu bytes, verify %s\n", mi.name().c_str(),
               mi.files_size(), mi.tensors_size(), (unsigned long long)mi.total_bytes(),
               mi.verify_policy().c_str());
        for (const auto &t : mi.tensors()) {
            printf("%s\t%s\t[", t.name().c_str(), t.dtype().c_str());
            for (int k = 0; k < t.shape_size(); k++)
                printf("%s%llu", k ? "," : "", (unsigned long long)t.shape(k));
            printf("]\t%llu\t%s\n", (unsigned long long)t.nbytes(), hex(t.sha256()).c_str());
        }
        return 0;
    }

    Local local;
    if (!o.compare.empty() && !local.open(o.compare))
        return 2;
    Local *lp = o.compare.empty() ? nullptr : &local;

    if (cmd == "get") {
        if (pos.size() < 2)
            return usage();
        auto it = by_name.find(pos[1]);
        // What is owed: the tensor's nbytes, or the range's length (to the
        // end for --length 0). A tensor GetModel does not list, or a range
        // outside it, is owed nothing: the server's NOT_FOUND or
        // INVALID_ARGUMENT comes first, and any byte it sends is a mismatch.
        uint64_t n = it != by_name.end() ? it->second->nbytes() : 0;
        uint64_t owed = n;
        if (o.range)
            owed = o.offset > n ? 0 : o.length ? (o.length <= n - o.offset ? o.length : 0)
                                               : n - o.offset;
        // With a trusted manifest a range is never taken on the server's
        // word: the whole tensor is fetched, checked against the manifest
        // and sliced.
        bool slice = o.range && !o.manifest.empty();
        if (slice && (it == by_name.end() || o.offset > n || o.length > n - o.offset)) {
            fprintf(stderr, "%s: range %llu+%llu is outside its %llu bytes\n", pos[1].c_str(),
                    (unsigned long long)o.offset, (unsigned long long)o.length,
                    (unsigned long long)n);
            return 2;
        }
        std::string bytes, sent;
        bool whole = it != by_name.end() && !it->second->sha256().empty() && (!o.range || slice);
        if (!(st = c.tensor(pos[0], pos[1], o.range && !slice, o.offset, o.length,
                            slice ? n : owed, &bytes, &sent, whole)).ok())
            return fail_status(st);
        // An answer where the server owes a refusal (a tensor GetModel does
        // not list, a range outside the tensor): nothing to check it
        // against, so not verified, whatever digest came with it.
        if (it == by_name.end() || (o.range && (o.offset > n || o.length > n - o.offset))) {
            fprintf(stderr, "MISMATCH %s: %s, yet the server answered with %zu bytes\n",
                    pos[1].c_str(), it == by_name.end() ? "not listed by GetModel"
                                                        : "the range is outside the tensor",
                    bytes.size());
            return 1;
        }
        int rc = -1;
        if (!o.range && it != by_name.end())
            rc = check_tensor(*it->second, bytes, sent, lp, o);
        if (slice) {
            Opts quiet = o;
            quiet.quiet = true;
            if (check_tensor(*it->second, bytes, sent, nullptr, quiet))
                return 1;
            bytes = bytes.substr(o.offset, o.length ? o.length : n - o.offset);
            sent = sha256(bytes.data(), bytes.size());
        }
        if (!o.out.empty()) {
            std::ofstream f(o.out, std::ios::binary);
            f.write(bytes.data(), (std::streamsize)bytes.size());
        }
        if (rc >= 0)
            return rc;
        // A range has no manifest digest: without a trusted manifest it is
        // checked against the server's (the transfer only).
        if (sha256(bytes.data(), bytes.size()) != sent) {
            fprintf(stderr, "MISMATCH %s: the server's digest differs\n", pos[1].c_str());
            return 1;
        }
        if (lp && it != by_name.end() && !lp->same(pos[1], o.offset, bytes)) {
            fprintf(stderr, "MISMATCH %s: range differs from the local copy\n", pos[1].c_str());
            return 1;
        }
        if (!o.quiet)
            printf("ok %s range %llu+%zu %s\n", pos[1].c_str(), (unsigned long long)o.offset,
                   bytes.size(), hex(sent).c_str());
        return 0;
    }

    if (cmd == "latency") {
        // GetTensor of one tensor --repeat times, each verified; prints the
        // latency quantiles (for the benchmark).
        if (pos.size() < 2)
            return usage();
        auto it = by_name.find(pos[1]);
        if (it == by_name.end())
            return usage();
        std::vector<double> ms;
        for (int r = 0; r < o.repeat; r++) {
            std::string bytes, sent;
            auto a = std::chrono::steady_clock::now();
            if (!(st = c.tensor(pos[0], pos[1], false, 0, 0, it->second->nbytes(), &bytes,
                                &sent, !it->second->sha256().empty())).ok())
                return fail_status(st);
            ms.push_back(std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - a)
                              .count());
            Opts quiet = o;
            quiet.quiet = true;
            if (check_tensor(*it->second, bytes, sent, nullptr, quiet))
                return 1;
        }
        std::sort(ms.begin(), ms.end());
        auto q = [&](double p) { return ms[std::min(ms.size() - 1, (size_t)(p * ms.size()))]; };
        printf("latency %s %zu calls: p50 %.3f ms p99 %.3f ms max %.3f ms\n", pos[1].c_str(),
               ms.size(), q(0.50), q(0.99), ms.back());
        return 0;
    }
    if (cmd != "fetch")
        return usage();
    int bad = 0;
    uint64_t total = 0;
    auto t0 = std::chrono::steady_clock::now();
    bool stall = o.stall > 0;
    for (int rep = 0; rep < o.repeat; rep++) {
        if (o.stream) {
            int rc = fetch_stream(c, pos[0], mi, by_name, lp, o, &stall, &total, &bad);
            if (rc >= 0)
                return rc;
            continue;
        }
        for (const auto &t : mi.tensors()) {
            std::string whole, bytes, sent;
            if (!(st = c.tensor(pos[0], t.name(), false, 0, 0, t.nbytes(), &whole, &sent,
                                !t.sha256().empty())).ok())
                return fail_status(st);
            bad += check_tensor(t, whole, sent, lp, o);
            total += whole.size();
            if (!o.ranges)
                continue;
            // Three ranges: the first half, an odd piece of the middle, the last byte.
            uint64_t n = t.nbytes();
            uint64_t rs[3][2] = {{0, n / 2}, {n / 3, n / 5 + 1}, {n ? n - 1 : 0, n ? 1u : 0u}};
            for (auto &r : rs) {
                if (r[0] + r[1] > n || r[1] == 0)
                    continue;
                if (!(st = c.tensor(pos[0], t.name(), true, r[0], r[1], r[1], &bytes, &sent)).ok())
                    return fail_status(st);
                // A range has no manifest digest: it must be the bytes of
                // the whole tensor just checked (the server's digest of
                // it guards the transfer only).
                bool ok = bytes.size() == r[1] && sha256(bytes.data(), bytes.size()) == sent &&
                          whole.size() == n && bytes == whole.substr(r[0], r[1]);
                if (ok && lp)
                    ok = lp->same(t.name(), r[0], bytes);
                if (!ok) {
                    fprintf(stderr, "MISMATCH %s: range %llu+%llu\n", t.name().c_str(),
                            (unsigned long long)r[0], (unsigned long long)r[1]);
                    bad++;
                }
            }
        }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fprintf(stderr, "%s: %d tensors x %d, %llu bytes in %.3f s (%.1f MB/s), %d mismatch%s\n",
            mi.name().c_str(), mi.tensors_size(), o.repeat, (unsigned long long)total, s,
            total / s / 1e6, bad, bad == 1 ? "" : "es");
    return bad ? 1 : 0;
}
