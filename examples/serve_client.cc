// serve_client.cc: a C++ client of `sluice serve` (the gRPC tensor
// service, proto/sluice/v1/tensor_service.proto). It checks every tensor
// it receives end to end against the manifest digest that GetModel gives
// (the SHA-256 of the bytes received, computed here), so the server is a
// cache, not a point of trust; with --compare it also compares the bytes
// with a local copy of the model read through the library.
//
// usage: serve_client ADDR COMMAND [ARGS] [OPTIONS]
//   list                       the models
//   info MODEL                 files and tensors with their digests
//   get MODEL NAME             one tensor (--offset/--length: a range; -o FILE)
//   latency MODEL NAME         GetTensor --repeat times; p50/p99 latency
//   fetch MODEL                every tensor, one GetTensor each (--stream: one
//                              StreamTensors call; --ranges: also three byte
//                              ranges of each tensor; --compare LOCAL_PATH)
// options: --token FILE, --ca PEM (TLS), --cert PEM --key PEM (client
// certificate), --server-name NAME (TLS name to check), --chunk N,
// --repeat N (fetch N times), --quiet, --allow-unverified (accept tensors
// GetModel gives no manifest digest for: else a mismatch); for tests of the server's flow
// control, with --stream: --stall S (stop reading for S seconds after the
// first chunk), --cancel (cancel after the first chunk).
// Exit status: 0 all verified, 1 a digest or comparison mismatch, 2 usage,
// 100 + the gRPC status code of a failed call (105 NOT_FOUND, 103
// INVALID_ARGUMENT, 115 DATA_LOSS, 116 UNAUTHENTICATED, ...); the status
// is printed on stderr as "status CODE_NAME: message".
#include "tensor_service.grpc.pb.h"

#include <sluice.h>

#include <grpcpp/grpcpp.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
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
    std::string token, ca, cert, key, server_name, out, compare;
    uint64_t offset = 0, length = 0;
    bool range = false, stream = false, ranges = false, quiet = false;
    bool allow_unverified = false;  // accept tensors GetModel gives no digest for
    uint32_t chunk = 0;
    int repeat = 1;
    double stall = 0;      // --stall S: sleep S seconds after the first chunk
    bool cancel = false;   // --cancel: cancel the call after the first chunk
};

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
    Client(const std::string &addr, const Opts &o) : o_(o)
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
        // gRPC's default receive limit (4 MiB): every message of the
        // server fits in it, also at chunk_bytes = 4 MiB.
        if (!o.server_name.empty())
            args.SetSslTargetNameOverride(o.server_name);
        stub_ = pb::TensorService::NewStub(grpc::CreateCustomChannel(addr, creds, args));
        if (!o.token.empty()) {
            slurp(o.token, &token_);
            while (!token_.empty() && (token_.back() == '\n' || token_.back() == '\r'))
                token_.pop_back();
        }
    }

    void prepare(grpc::ClientContext *ctx, int seconds = 120)
    {
        if (!token_.empty())
            ctx->AddMetadata("authorization", "Bearer " + token_);
        ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    }

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
    grpc::Status tensor(const std::string &model, const std::string &name, bool range,
                        uint64_t off, uint64_t len, std::string *out, std::string *sent_digest)
    {
        grpc::ClientContext ctx;
        prepare(&ctx);
        pb::GetTensorRequest q;
        q.set_model(model);
        q.set_name(name);
        q.set_chunk_bytes(o_.chunk);
        if (range) {
            q.mutable_range()->set_offset(off);
            q.mutable_range()->set_length(len);
        }
        auto reader = stub_->GetTensor(&ctx, q);
        pb::TensorChunk c;
        out->clear();
        bool last = false;
        uint64_t base = range ? off : 0;
        while (reader->Read(&c)) {
            if (c.offset() != base + out->size() || last) {
                ctx.TryCancel();
                reader->Finish();
                return grpc::Status(grpc::StatusCode::DATA_LOSS, "chunks out of order");
            }
            if (out->empty() && c.total_bytes())
                out->reserve(c.total_bytes());
            out->append(c.data());
            if (c.last()) {
                last = true;
                *sent_digest = c.sha256();
            }
        }
        grpc::Status st = reader->Finish();
        if (st.ok() && !last)
            return grpc::Status(grpc::StatusCode::DATA_LOSS, "stream ended without its last chunk");
        return st;
    }

    std::unique_ptr<grpc::ClientReader<pb::TensorChunk>> stream(grpc::ClientContext *ctx,
                                                               const std::string &model)
    {
        prepare(ctx, 600);
        pb::StreamTensorsRequest q;
        q.set_model(model);
        q.set_chunk_bytes(o_.chunk);
        return stub_->StreamTensors(ctx, q);
    }

private:
    const Opts &o_;
    std::unique_ptr<pb::TensorService::Stub> stub_;
    std::string token_;
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

int usage()
{
    fprintf(stderr,
            "usage: serve_client ADDR list | info MODEL | get MODEL NAME | fetch MODEL\n"
            "  [--offset N --length N] [-o FILE] [--stream] [--ranges] [--compare PATH]\n"
            "  [--token FILE] [--ca PEM [--cert PEM --key PEM] [--server-name N]]\n"
            "  [--chunk N] [--repeat N] [--quiet] [--allow-unverified]\n");
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
        else if (a == "--stall") o.stall = atof(val().c_str());
        else if (a == "--cancel") o.cancel = true;
        else if (a == "--stream") o.stream = true;
        else if (a == "--ranges") o.ranges = true;
        else if (a == "--quiet" || a == "-q") o.quiet = true;
        else if (a == "--allow-unverified") o.allow_unverified = true;
        else if (!a.empty() && a[0] == '-') return usage();
        else pos.push_back(a);
    }
    Client c(addr, o);
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
        std::string bytes, sent;
        if (!(st = c.tensor(pos[0], pos[1], o.range, o.offset, o.length, &bytes, &sent)).ok())
            return fail_status(st);
        if (!o.out.empty()) {
            std::ofstream f(o.out, std::ios::binary);
            f.write(bytes.data(), (std::streamsize)bytes.size());
        }
        auto it = by_name.find(pos[1]);
        if (!o.range && it != by_name.end())
            return check_tensor(*it->second, bytes, sent, lp, o);
        // A range has no manifest digest: checked against the server's.
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
            if (!(st = c.tensor(pos[0], pos[1], false, 0, 0, &bytes, &sent)).ok())
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
    for (int rep = 0; rep < o.repeat; rep++) {
        if (o.stream) {
            grpc::ClientContext ctx;
            auto reader = c.stream(&ctx, pos[0]);
            pb::TensorChunk ch;
            std::string cur, bytes;
            size_t done = 0;
            bool first = true;
            while (reader->Read(&ch)) {
                if (first && o.stall > 0) {
                    fprintf(stderr, "stalling after the first chunk\n");
                    std::this_thread::sleep_for(std::chrono::duration<double>(o.stall));
                }
                if (first && o.cancel) {
                    ctx.TryCancel();
                    st = reader->Finish();
                    fprintf(stderr, "cancelled after the first chunk\n");
                    return fail_status(st);
                }
                first = false;
                if (ch.name() != cur) {
                    if (!bytes.empty()) {
                        fprintf(stderr, "MISMATCH %s: next tensor before the last chunk\n",
                                cur.c_str());
                        bad++;
                    }
                    cur = ch.name();
                    bytes.clear();
                }
                if (ch.offset() != bytes.size()) {
                    fprintf(stderr, "MISMATCH %s: chunk out of order\n", cur.c_str());
                    bad++;
                }
                bytes.append(ch.data());
                if (ch.last()) {
                    auto it = by_name.find(cur);
                    if (it == by_name.end()) {
                        fprintf(stderr, "MISMATCH %s: not in GetModel\n", cur.c_str());
                        bad++;
                    } else {
                        bad += check_tensor(*it->second, bytes, ch.sha256(), lp, o);
                    }
                    total += bytes.size();
                    done++;
                    bytes.clear();
                    cur.clear();
                }
            }
            if (!(st = reader->Finish()).ok())
                return fail_status(st);
            if (done != (size_t)mi.tensors_size()) {
                fprintf(stderr, "MISMATCH: %zu tensors streamed, the model has %d\n", done,
                        mi.tensors_size());
                bad++;
            }
            continue;
        }
        for (const auto &t : mi.tensors()) {
            std::string bytes, sent;
            if (!(st = c.tensor(pos[0], t.name(), false, 0, 0, &bytes, &sent)).ok())
                return fail_status(st);
            bad += check_tensor(t, bytes, sent, lp, o);
            total += bytes.size();
            if (!o.ranges)
                continue;
            // Three ranges: the first half, an odd piece of the middle, the last byte.
            uint64_t n = t.nbytes();
            uint64_t rs[3][2] = {{0, n / 2}, {n / 3, n / 5 + 1}, {n ? n - 1 : 0, n ? 1u : 0u}};
            for (auto &r : rs) {
                if (r[0] + r[1] > n || r[1] == 0)
                    continue;
                if (!(st = c.tensor(pos[0], t.name(), true, r[0], r[1], &bytes, &sent)).ok())
                    return fail_status(st);
                bool ok = bytes.size() == r[1] && sha256(bytes.data(), bytes.size()) == sent;
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
