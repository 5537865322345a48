// torchscript_engine.cc: a C++ inference engine that runs compiled
// TorchScript blocks (exported without their weights by
// sluice.torch.export_blocks: one module per block and plan.json) with
// weights that sluice reads and verifies on demand.
//
// For each block in the plan's order: the rest of the plan is hinted to
// the library (sluice_prefetch), so the next block is read while this one
// runs; each tensor of the block is acquired (read, verified) and bound to
// its parameter as a torch::from_blob view of the handle's bytes, no copy,
// whose deleter releases the handle; the block runs; its parameters get
// their placeholders back, which drops the views and so releases the
// handles (unless --resident, or every weight fits in the pool: then they
// stay bound). A tensor that fails verification stops the run before its
// block runs (exit 1, the library's message: tensor, both digests). The
// plan is checked before anything runs: every block file against its
// SHA-256, every parameter against the plan, every tensor against the
// weights (missing, or another dtype or shape: exit 1, naming both).
//
// The prompt (--tokens) runs through the blocks, then --steps greedy
// decode steps (each appends the argmax token and runs the whole sequence
// again: the blocks keep no cache). It prints, per step, the token and
// the SHA-256 of the logits (float32, C order), then the top tokens, the
// resident memory and the library's counters.
//
//   torchscript_engine EXPORT_DIR WEIGHTS --tokens 1,2,3 --steps 2 --pool 256M
//
// --baseline runs the same blocks with every weight a zero tensor that
// holds no memory (a stride-0 view of one element, no sluice at all): its
// peak RSS is libtorch's own resident size (code, threads, the compute's
// working memory) with no weight loaded, what a run's peak RSS is
// compared with (within the pool above it).
//
// The library stays C: this program (C++17, libtorch's CMake package) is
// built when CMake finds Torch (SLUICE_WITH_TORCH) and uses sluice.h only.
#include <sluice.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <torch/script.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Param {
    std::string name;    // dotted path in the block module
    std::string tensor;  // name in the .safetensors files
    std::string dtype;   // safetensors dtype name
    std::vector<int64_t> shape;
    torch::jit::Module owner;  // the submodule holding the slot
    std::string leaf;          // the slot's name in owner
    at::Tensor placeholder;    // the meta tensor saved in the block
};

struct Block {
    std::string name, file, sha256;
    torch::jit::Module module;
    std::vector<Param> params;
    bool bound = false;
};

struct Fail : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const std::map<std::string, at::ScalarType> kDtypes = {
    {"BOOL", at::kBool}, {"U8", at::kByte},   {"I8", at::kChar},     {"I16", at::kShort},
    {"I32", at::kInt},   {"I64", at::kLong},  {"F16", at::kHalf},    {"BF16", at::kBFloat16},
    {"F32", at::kFloat}, {"F64", at::kDouble},
};

std::string dtype_name(at::ScalarType t)
{
    for (const auto &kv : kDtypes)
        if (kv.second == t)
            return kv.first;
    return c10::toString(t);
}

std::string shape_str(const std::vector<int64_t> &s)
{
    std::string out = "[";
    for (size_t i = 0; i < s.size(); i++)
        out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

std::string read_file(const std::string &path)
{
    std::ifstream f(path, std::ios::binary);
    if (!f)
        throw Fail(path + ": cannot be read");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string hex(const unsigned char *d, unsigned n)
{
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (unsigned i = 0; i < n; i++) {
        s += digits[d[i] >> 4];
        s += digits[d[i] & 15];
    }
    return s;
}

std::string sha256(const void *data, size_t n)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (!EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr))
        throw Fail("SHA-256 failed");
    return hex(md, len);
}

const cJSON *member(const cJSON *o, const char *key, bool (*is)(const cJSON *), const std::string &where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || !is(v))
        throw Fail(where + ": \"" + key + "\" is missing or of the wrong type");
    return v;
}
bool is_string(const cJSON *v) { return cJSON_IsString(v); }
bool is_array(const cJSON *v) { return cJSON_IsArray(v); }
bool is_number(const cJSON *v) { return cJSON_IsNumber(v); }

// The plan: block files checked against their digests and loaded, each
// parameter found in its module with the plan's dtype and shape.
std::vector<Block> load_plan(const std::string &dir)
{
    const std::string path = dir + "/plan.json";
    const std::string text = read_file(path);
    std::unique_ptr<cJSON, void (*)(cJSON *)> root(cJSON_Parse(text.c_str()), cJSON_Delete);
    if (!root)
        throw Fail(path + ": not JSON");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root.get(), "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root.get(), "version");
    if (!cJSON_IsString(fmt) || std::strcmp(fmt->valuestring, "sluice-torchscript-plan") ||
        !cJSON_IsNumber(ver) || ver->valuedouble != 1)
        throw Fail(path + ": not a sluice-torchscript-plan of version 1");
    std::vector<Block> blocks;
    const cJSON *jb = member(root.get(), "blocks", is_array, path);
    const cJSON *b;
    cJSON_ArrayForEach(b, jb) {
        Block blk;
        blk.name = member(b, "name", is_string, path)->valuestring;
        const std::string where = path + ": block '" + blk.name + "'";
        blk.file = member(b, "file", is_string, where)->valuestring;
        if (blk.file.find('/') != std::string::npos)
            throw Fail(where + ": file " + blk.file + " is not in the directory");
        const std::string bpath = dir + "/" + blk.file;
        const std::string code = read_file(bpath);
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(b, "sha256");
        if (cJSON_IsString(sh)) {
            std::string got = sha256(code.data(), code.size());
            if (got != sh->valuestring)
                throw Fail(where + ": " + bpath + " has SHA-256 " + got + ", the plan says " +
                           sh->valuestring);
        }
        std::istringstream in(code);
        blk.module = torch::jit::load(in);
        blk.module.eval();
        const cJSON *p;
        cJSON_ArrayForEach(p, member(b, "params", is_array, where)) {
            Param prm;
            prm.name = member(p, "name", is_string, where)->valuestring;
            prm.tensor = member(p, "tensor", is_string, where)->valuestring;
            prm.dtype = member(p, "dtype", is_string, where)->valuestring;
            const cJSON *d;
            cJSON_ArrayForEach(d, member(p, "shape", is_array, where)) {
                if (!is_number(d))
                    throw Fail(where + ": parameter '" + prm.name + "': a shape is not numbers");
                prm.shape.push_back(static_cast<int64_t>(d->valuedouble));
            }
            if (!kDtypes.count(prm.dtype))
                throw Fail(where + ": parameter '" + prm.name + "': unknown dtype " + prm.dtype);
            // Walk to the slot's owner: "self_attn.q_proj.weight".
            prm.owner = blk.module;
            std::string rest = prm.name;
            for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
                std::string part = rest.substr(0, dot);
                if (!prm.owner.hasattr(part) || !prm.owner.attr(part).isModule())
                    throw Fail(where + ": the plan binds '" + prm.name + "' (tensor '" + prm.tensor +
                               "'), which the module does not have");
                prm.owner = prm.owner.attr(part).toModule();
            }
            prm.leaf = rest;
            if (!prm.owner.hasattr(prm.leaf) || !prm.owner.attr(prm.leaf).isTensor())
                throw Fail(where + ": the plan binds '" + prm.name + "' (tensor '" + prm.tensor +
                           "'), which the module does not have");
            prm.placeholder = prm.owner.attr(prm.leaf).toTensor();
            std::vector<int64_t> have(prm.placeholder.sizes().begin(), prm.placeholder.sizes().end());
            if (dtype_name(prm.placeholder.scalar_type()) != prm.dtype || have != prm.shape)
                throw Fail(where + ": parameter '" + prm.name + "' is " +
                           dtype_name(prm.placeholder.scalar_type()) + " " + shape_str(have) +
                           ", the plan says " + prm.dtype + " " + shape_str(prm.shape));
            blk.params.push_back(std::move(prm));
        }
        blocks.push_back(std::move(blk));
    }
    if (blocks.empty())
        throw Fail(path + ": no blocks");
    return blocks;
}

// Every tensor the plan names exists in the weights with its parameter's
// dtype and shape: checked before any block runs.
uint64_t check_weights(sluice_model *m, const std::vector<Block> &blocks, const char *weights)
{
    uint64_t total = 0;
    std::map<std::string, bool> seen;
    for (const Block &b : blocks)
        for (const Param &p : b.params) {
            struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
            if (sluice_find(m, p.tensor.c_str(), &ti) != SLUICE_OK)
                throw Fail("block '" + b.name + "': parameter '" + p.name + "' binds to tensor '" +
                           p.tensor + "', which is not in " + weights);
            std::vector<int64_t> have(ti.shape, ti.shape + ti.ndim);
            const std::string dt = sluice_dtype_name(ti.dtype);
            if (dt != p.dtype || have != p.shape)
                throw Fail("block '" + b.name + "': tensor '" + p.tensor + "' is " + dt + " " +
                           shape_str(have) + " in the weights, the parameter '" + p.name +
                           "' it binds to is " + p.dtype + " " + shape_str(p.shape));
            if (!seen[p.tensor]) {
                seen[p.tensor] = true;
                total += ti.nbytes;
            }
        }
    return total;
}

// The weights of blocks[i] bound: each a view of a verified handle, which
// the view's deleter releases when the last tensor using it goes.
void bind(sluice_model *m, Block &b)
{
    std::vector<at::Tensor> views;
    for (const Param &p : b.params) {
        sluice_tensor *h = nullptr;
        int rc = sluice_acquire(m, p.tensor.c_str(), &h);
        if (rc != SLUICE_OK)
            throw Fail("block '" + b.name + "': " + sluice_errmsg(m));  // views drop: handles go
        // from_blob wants a mutable pointer; the bytes are read-only and
        // nothing here writes a weight (the blocks run under NoGradGuard
        // and never write their parameters).
        void *data = const_cast<void *>(sluice_tensor_data(h));
        views.push_back(torch::from_blob(data, p.shape, [h](void *) { sluice_release(h); },
                                         torch::TensorOptions().dtype(kDtypes.at(p.dtype))));
    }
    for (size_t k = 0; k < b.params.size(); k++)
        b.params[k].owner.setattr(b.params[k].leaf, views[k]);
    b.bound = true;
}

void unbind(Block &b)
{
    for (Param &p : b.params)
        p.owner.setattr(p.leaf, p.placeholder);
    b.bound = false;
}

// Zero weights that hold no memory, for --baseline.
void bind_zeros(Block &b)
{
    for (Param &p : b.params)
        p.owner.setattr(p.leaf, torch::zeros({}, torch::TensorOptions().dtype(kDtypes.at(p.dtype)))
                                    .expand(p.shape));
    b.bound = true;
}

long status_kb(const char *field)
{
    std::ifstream f("/proc/self/status");
    std::string line;
    const size_t n = std::strlen(field);
    while (std::getline(f, line))
        if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
            return std::atol(line.c_str() + n + 1);
    return -1;
}

uint64_t parse_size(const char *s)
{
    char *end = nullptr;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s)
        throw Fail(std::string("--pool ") + s + ": not a size");
    switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    default: break;
    }
    if (*end)
        throw Fail(std::string("--pool ") + s + ": not a size (bytes, or with K, M, G)");
    return v;
}

const char kUsage[] =
    "usage: torchscript_engine EXPORT_DIR WEIGHTS [--tokens 1,2,3] [--steps N] [--pool SIZE]\n"
    "                          [--manifest PATH] [--top K] [--resident] [--trace] [--baseline]\n"
    "Runs the TorchScript blocks of EXPORT_DIR (sluice.torch.export_blocks: plan.json and one\n"
    "module per block) with weights from WEIGHTS read and verified by sluice on demand, one\n"
    "block ahead, bound zero-copy. Prints per step the greedy token and the SHA-256 of the\n"
    "logits (float32), the top K tokens, peak RSS and the library's counters.\n"
    "  --tokens LIST  the prompt's token ids (default 0,1,...,11)\n"
    "  --steps N      greedy decode steps after the prompt (default 0)\n"
    "  --pool SIZE    the library's pool (default: the library's)\n"
    "  --manifest P   the manifest (default: the sidecar)\n"
    "  --resident     keep every block's weights bound after its first use\n"
    "  --trace        print each block's name as it completes\n"
    "  --baseline     weights as zero tensors holding no memory, no sluice: libtorch's own RSS\n"
    "exit: 0 done, 1 a failure (its message on stderr), 2 usage\n";

int run(int argc, char **argv)
{
    std::vector<const char *> pos;
    std::vector<int64_t> tokens;
    long steps = 0, top = 5;
    uint64_t pool = 0;
    const char *manifest = nullptr;
    bool resident = false, trace = false, baseline = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc)
                throw Fail(a + " needs a value");
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--tokens") {
            std::stringstream ss(value());
            for (std::string t; std::getline(ss, t, ',');)
                tokens.push_back(std::stoll(t));
        } else if (a == "--steps") {
            steps = std::stol(value());
        } else if (a == "--top") {
            top = std::stol(value());
        } else if (a == "--pool") {
            pool = parse_size(value());
        } else if (a == "--manifest") {
            manifest = value();
        } else if (a == "--resident") {
            resident = true;
        } else if (a == "--trace") {
            trace = true;
        } else if (a == "--baseline") {
            baseline = true;
        } else if (!a.empty() && a[0] == '-') {
            std::fprintf(stderr, "torchscript_engine: unknown option %s\n%s", a.c_str(), kUsage);
            return 2;
        } else {
            pos.push_back(argv[i]);
        }
    }
    if (pos.size() != 2 || steps < 0 || top < 1) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    if (tokens.empty())
        for (int64_t t = 0; t < 12; t++)
            tokens.push_back(t);

    torch::NoGradGuard no_grad;
    // The model is declared first so that it is closed last: the blocks'
    // views hold handles, which must go back before sluice_close.
    sluice_model *m = nullptr;
    std::unique_ptr<sluice_model, int (*)(sluice_model *)> model(nullptr, sluice_close);
    std::vector<Block> blocks = load_plan(pos[0]);
    auto t0 = std::chrono::steady_clock::now();

    uint64_t total = 0;
    if (!baseline) {
        sluice_options opts;
        sluice_options_init(&opts);
        if (pool)
            opts.pool_bytes = pool;
        opts.manifest_path = manifest;
        int rc = sluice_open(pos[1], &opts, &m);
        if (rc != SLUICE_OK) {
            std::string msg = m ? sluice_errmsg(m) : sluice_strerror(rc);
            sluice_close(m);
            throw Fail(std::string("open ") + pos[1] + ": " + msg);
        }
        model.reset(m);
        total = check_weights(m, blocks, pos[1]);
        struct sluice_stats st;
        std::memset(&st, 0, sizeof st);
        st.size = sizeof st;
        if (sluice_stats(m, &st) == SLUICE_OK) {
            pool = st.pool_bytes;
            if (total <= pool)
                resident = true;  // everything fits: keep it bound
        }
    }
    size_t ntensors = 0;
    for (const Block &b : blocks)
        ntensors += b.params.size();
    std::printf("blocks %zu params %zu weights_bytes %llu pool_bytes %llu resident %d\n",
                blocks.size(), ntensors, (unsigned long long)total, (unsigned long long)pool,
                resident ? 1 : 0);
    std::printf("rss_before_weights_kb %ld\n", status_kb("VmRSS"));
    std::fflush(stdout);

    // The plan's names from block i on, as C strings for sluice_prefetch.
    std::vector<std::vector<const char *>> rest(blocks.size());
    for (size_t i = blocks.size(); i-- > 0;) {
        for (const Param &p : blocks[i].params)
            rest[i].push_back(p.tensor.c_str());
        if (i + 1 < blocks.size())
            rest[i].insert(rest[i].end(), rest[i + 1].begin(), rest[i + 1].end());
    }

    std::vector<int64_t> seq = tokens;
    at::Tensor logits;
    for (long step = 0; step <= steps; step++) {
        at::Tensor ids = torch::tensor(seq, torch::TensorOptions().dtype(at::kLong)).view({1, -1});
        torch::jit::IValue x = ids;
        for (size_t i = 0; i < blocks.size(); i++) {
            Block &b = blocks[i];
            if (!b.bound) {
                if (baseline) {
                    bind_zeros(b);
                } else {
                    // From here on, in order: the library reads ahead what
                    // this block's acquires do not wait for, within the pool.
                    int rc = sluice_prefetch(m, rest[i].data(), rest[i].size());
                    if (rc != SLUICE_OK)
                        throw Fail("prefetch: " + std::string(sluice_errmsg(m)));
                    bind(m, b);
                }
            }
            try {
                x = b.module.forward({x});
            } catch (...) {
                unbind(b);
                throw;
            }
            if (!resident && !baseline)
                unbind(b);
            if (trace)
                std::printf("ran %s\n", b.name.c_str());
        }
        logits = x.toTensor().to(at::kFloat).contiguous();
        int64_t next = logits[0][-1].argmax().item<int64_t>();
        if (step == 0) {
            double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            std::printf("first_token_ms %.1f\n", ms);
        }
        std::printf("step %ld token %lld logits_sha256 %s\n", step, (long long)next,
                    sha256(logits.data_ptr(), logits.numel() * sizeof(float)).c_str());
        std::fflush(stdout);
        seq.push_back(next);
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("total_ms %.1f\n", ms);
    at::Tensor last = logits[0][-1];
    auto tk = last.topk(std::min<int64_t>(top, last.numel()));
    at::Tensor vals = std::get<0>(tk), idx = std::get<1>(tk);
    std::printf("top");
    for (int64_t k = 0; k < idx.numel(); k++)
        std::printf(" %lld:%.6g", (long long)idx[k].item<int64_t>(), vals[k].item<float>());
    std::printf("\n");
    for (Block &b : blocks)
        if (b.bound)
            unbind(b);
    std::printf("peak_rss_kb %ld\n", status_kb("VmHWM"));
    if (m) {
        struct sluice_stats st;
        std::memset(&st, 0, sizeof st);
        st.size = sizeof st;
        if (sluice_stats(m, &st) == SLUICE_OK)
            std::printf("pool_high_water %llu tensors_verified %llu bytes_read %llu\n",
                        (unsigned long long)st.pool_high_water,
                        (unsigned long long)st.tensors_verified, (unsigned long long)st.bytes_read);
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv)
{
    try {
        return run(argc, argv);
    } catch (const Fail &e) {
        std::fprintf(stderr, "torchscript_engine: %s\n", e.what());
    } catch (const c10::Error &e) {
        std::fprintf(stderr, "torchscript_engine: torch: %s\n", e.what_without_backtrace());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "torchscript_engine: %s\n", e.what());
    }
    return 1;
}
