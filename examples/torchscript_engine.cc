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
// A plan of version 2 (docs/torchscript.md "Version 2") may split a
// vocabulary-sized tensor, so that a pool smaller than it runs the model:
// a block whose parameters are parts ("part": {"dim", "n"}) runs n times,
// part r bound from sluice_acquire_part (verified against the part's
// digest when the manifest has one) for run r only, and its outputs are
// joined along "join_axis" in part order (a tied head: the logits in
// vocab order); a "gather" block (one 2-D parameter, code using its
// first input only as aten::embedding's indices and for its shape, and
// the parameter only as its weight, element by element) gets as its table the rows of the distinct indices,
// read by ranges with sluice_read_into (verified by the chunks they
// touch), and each index's position among them, so the table never
// enters the pool. Neither is hinted (a hint reads the whole tensor).
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
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
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
    uint32_t part_dim = 0;     // version 2: part r of part_n along part_dim
    uint64_t part_n = 0;       // 0: the whole tensor
};

struct Block {
    std::string name, file, sha256;
    torch::jit::Module module;
    std::vector<Param> params;
    bool bound = false;
    uint64_t parts = 0;        // version 2: run once per part (its params' n), 0: whole
    int64_t join_axis = -1;    // the parts' outputs joined along this axis
    bool gather = false;       // version 2: its one parameter read by the indices' rows
};

// Rows of a gathered table within this many bytes of each other are read
// as one range (each read verifies the chunks it touches).
constexpr uint64_t kGatherSpan = 4u << 20;

struct Fail : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A command line the engine cannot take: exit 2, as --help says.
struct Usage : std::runtime_error {
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
bool is_object(const cJSON *v) { return cJSON_IsObject(v); }

// An integer within int64_t (the cast of a double outside that range, or
// of NaN, would be undefined).
bool is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= -9223372036854775808.0 &&
           v->valuedouble < 9223372036854775808.0 && v->valuedouble == (double)(int64_t)v->valuedouble;
}

// The prim::If output that a use by one of its branches' returns gives,
// else nullptr.
torch::jit::Value *if_output(const torch::jit::Use &u)
{
    if (u.user->kind().toQualString() != std::string("prim::Return"))
        return nullptr;
    torch::jit::Node *owner = u.user->owningBlock()->owningNode();
    if (!owner || owner->kind().toQualString() != std::string("prim::If"))
        return nullptr;
    return owner->outputs()[u.offset];
}

bool one_of(const std::string &kind, const std::vector<std::string> &kinds)
{
    return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

// Whether a block's code (inlined, constants propagated: the dead branches
// of F.embedding's padding_idx and max_norm gone; nested blocks too) reads
// the table `leaf` by rows of its first input and by nothing else: the
// input (or what aten::contiguous and prim::If pass on of it) reaches
// aten::embedding as its indices (or aten::embedding_renorm_'s: it
// renormalizes those rows of the table it is given), and is otherwise used
// only for its shape; the table (what element-by-element ops and prim::If
// make of it) reaches aten::embedding as its weight, and nothing else. The
// positions among the distinct rows that a gather passes instead of the
// ids, and the distinct rows it binds instead of the table, are the same
// only there (a pad mask from the ids, ids + an offset, the table's size
// that F.embedding's padding_idx check reads: not).
bool reads_rows_by_input(torch::jit::Module &mod, const std::string &leaf)
{
    std::shared_ptr<torch::jit::Graph> g = mod.get_method("forward").graph()->copy();
    torch::jit::Inline(*g);
    torch::jit::ConstantPropagation(g);
    if (g->inputs().size() < 2)
        return false;
    static const std::vector<std::string> shape_only = {"aten::size", "aten::dim",    "aten::len",
                                                        "aten::numel", "prim::device", "prim::dtype",
                                                        "prim::layout"};
    static const std::vector<std::string> elementwise = {
        "aten::to",         "aten::type_as", "aten::contiguous", "aten::detach",    "aten::clone",
        "aten::nan_to_num", "aten::tanh",    "aten::sigmoid",    "aten::relu",      "aten::abs",
        "aten::neg",        "aten::exp",     "aten::sqrt",       "aten::rsqrt",     "aten::mul",
        "aten::div",        "aten::add",     "aten::sub",        "aten::clamp",     "aten::clamp_min",
        "aten::clamp_max"};
    std::vector<torch::jit::Value *> todo = {g->inputs()[1]};
    std::vector<torch::jit::Value *> seen;
    bool found = false;
    while (!todo.empty()) {
        torch::jit::Value *v = todo.back();
        todo.pop_back();
        if (std::find(seen.begin(), seen.end(), v) != seen.end())
            continue;
        seen.push_back(v);
        for (const torch::jit::Use &u : v->uses()) {
            const std::string kind = u.user->kind().toQualString();
            if ((kind == "aten::embedding" || kind == "aten::embedding_renorm_") && u.offset == 1)
                found = found || kind == "aten::embedding";
            else if (u.offset == 0 && one_of(kind, shape_only))
                continue;
            else if (kind == "aten::contiguous" && u.offset == 0)
                todo.push_back(u.user->output());
            else if (torch::jit::Value *o = if_output(u))
                todo.push_back(o);
            else
                return false;
        }
    }
    if (!found)
        return false;
    // The table: every prim::GetAttr of the slot's name (the block has
    // this one slot), and what element-by-element ops make of it.
    std::vector<torch::jit::Block *> blocks = {g->block()};
    while (!blocks.empty()) {
        torch::jit::Block *b = blocks.back();
        blocks.pop_back();
        for (torch::jit::Node *n : b->nodes()) {
            if (n->kind().toQualString() == std::string("prim::GetAttr") && n->s(c10::attr::name) == leaf &&
                n->output()->type()->kind() == c10::TypeKind::TensorType)
                todo.push_back(n->output());
            for (torch::jit::Block *sub : n->blocks())
                blocks.push_back(sub);
        }
    }
    seen.clear();
    found = false;
    while (!todo.empty()) {
        torch::jit::Value *v = todo.back();
        todo.pop_back();
        if (std::find(seen.begin(), seen.end(), v) != seen.end())
            continue;
        seen.push_back(v);
        for (const torch::jit::Use &u : v->uses()) {
            const std::string kind = u.user->kind().toQualString();
            if (kind == "aten::embedding" && u.offset == 0)
                found = true;
            else if (one_of(kind, elementwise))
                for (torch::jit::Value *o : u.user->outputs())
                    todo.push_back(o);
            else if (torch::jit::Value *o = if_output(u))
                todo.push_back(o);
            else
                return false;
        }
    }
    return found;
}

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
        !cJSON_IsNumber(ver) || (ver->valuedouble != 1 && ver->valuedouble != 2))
        throw Fail(path + ": not a sluice-torchscript-plan of version 1 or 2");
    const int version = (int)ver->valuedouble;
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
                if (!is_int(d) || d->valuedouble < 0)
                    throw Fail(where + ": parameter '" + prm.name + "': a shape is not counts");
                prm.shape.push_back(static_cast<int64_t>(d->valuedouble));
            }
            if (!kDtypes.count(prm.dtype))
                throw Fail(where + ": parameter '" + prm.name + "': unknown dtype " + prm.dtype);
            if (const cJSON *pt = cJSON_GetObjectItemCaseSensitive(p, "part")) {
                if (version < 2)
                    throw Fail(where + ": \"part\", \"join_axis\" and \"gather\" need plan version 2");
                const cJSON *pd = cJSON_GetObjectItemCaseSensitive(pt, "dim");
                const cJSON *pn = cJSON_GetObjectItemCaseSensitive(pt, "n");
                if (!is_object(pt) || !pd || !is_int(pd) || !pn || !is_int(pn) || pd->valuedouble < 0 ||
                    pd->valuedouble >= (double)prm.shape.size() || pn->valuedouble < 1)
                    throw Fail(where + ": parameter '" + prm.name + "': \"part\" is not {dim, n} with a "
                               "dim of its shape " + shape_str(prm.shape) + " and n >= 1");
                prm.part_dim = (uint32_t)pd->valuedouble;
                prm.part_n = (uint64_t)pn->valuedouble;
            }
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
        // Version 2: parts of one n on every parameter, with a join_axis;
        // a gather of the block's one parameter, 2-D, whole.
        const cJSON *jj = cJSON_GetObjectItemCaseSensitive(b, "join_axis");
        const cJSON *jg = cJSON_GetObjectItemCaseSensitive(b, "gather");
        if (version < 2 && (jj || jg))
            throw Fail(where + ": \"part\", \"join_axis\" and \"gather\" need plan version 2");
        size_t parted = 0;
        for (const Param &q : blk.params)
            if (q.part_n) {
                parted++;
                if (blk.parts && q.part_n != blk.parts)
                    blk.parts = UINT64_MAX;
                else if (!blk.parts)
                    blk.parts = q.part_n;
            }
        if (parted && (parted != blk.params.size() || blk.parts == UINT64_MAX))
            throw Fail(where + ": a block in parts has every parameter in parts of one n");
        if (parted && !(jj && is_int(jj)))
            throw Fail(where + ": a block in parts needs \"join_axis\" (an int)");
        if (!parted && jj)
            throw Fail(where + ": \"join_axis\" without parts");
        if (jj)
            blk.join_axis = (int64_t)jj->valuedouble;
        if (jg) {
            const cJSON *gp = cJSON_GetObjectItemCaseSensitive(jg, "param");
            if (!is_object(jg) || !cJSON_IsString(gp) || blk.params.size() != 1 || parted ||
                blk.params[0].name != gp->valuestring || blk.params[0].shape.size() != 2)
                throw Fail(where + ": \"gather\" needs {\"param\": NAME} of the block's one parameter, "
                           "2-D and whole");
            if (!reads_rows_by_input(blk.module, blk.params[0].leaf))
                throw Fail(where + ": the plan says \"gather\", and its code does not use its first input "
                           "only as aten::embedding's indices (and for its shape), and its table only "
                           "as its weight (through element-by-element ops)");
            blk.gather = true;
        }
        blocks.push_back(std::move(blk));
    }
    if (blocks.empty())
        throw Fail(path + ": no blocks");
    return blocks;
}

// Every tensor the plan names exists in the weights with its parameter's
// dtype and shape: checked before any block runs.
// A part's shape is the tensor's with the part's dim divided by n. Returns
// the bytes of the tensors named (each once); *held: what a resident run
// holds at once (the tensors bound whole, and the largest block's parts).
uint64_t check_weights(sluice_model *m, const std::vector<Block> &blocks, const char *weights,
                       uint64_t *held)
{
    uint64_t total = 0, whole = 0, part = 0;
    std::map<std::string, bool> seen, seen_whole;
    for (const Block &b : blocks) {
        uint64_t parts = 0;
        for (const Param &p : b.params) {
            struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
            if (sluice_find(m, p.tensor.c_str(), &ti) != SLUICE_OK)
                throw Fail("block '" + b.name + "': parameter '" + p.name + "' binds to tensor '" +
                           p.tensor + "', which is not in " + weights);
            std::vector<int64_t> have(ti.shape, ti.shape + ti.ndim);
            // A part: the plan's shape is the part's, the tensor's divided
            // by n (divided, not multiplied: the plan's n may be huge, and a
            // product that wraps could equal the tensor's).
            bool same = ti.ndim == p.shape.size();
            for (size_t d = 0; same && d < p.shape.size(); d++) {
                const uint64_t n = p.part_n && d == p.part_dim ? p.part_n : 1;
                same = ti.shape[d] % n == 0 && ti.shape[d] / n == (uint64_t)p.shape[d];
            }
            std::string what;
            if (p.part_n) {
                std::vector<int64_t> want = p.shape;
                int64_t whole = 0;
                std::string would;
                if (p.part_n <= (uint64_t)INT64_MAX &&
                    !__builtin_mul_overflow(want[p.part_dim], (int64_t)p.part_n, &whole)) {
                    want[p.part_dim] = whole;
                    would = shape_str(want);
                } else {
                    would = "of " + std::to_string(want[p.part_dim]) + " x " +
                            std::to_string(p.part_n) + " along dim " + std::to_string(p.part_dim);
                }
                what = " part of " + std::to_string(p.part_n) + " along dim " +
                       std::to_string(p.part_dim) + " (the tensor would be " + p.dtype + " " +
                       would + ")";
            }
            const std::string dt = sluice_dtype_name(ti.dtype);
            if (dt != p.dtype || !same)
                throw Fail("block '" + b.name + "': tensor '" + p.tensor + "' is " + dt + " " +
                           shape_str(have) + " in the weights, the parameter '" + p.name +
                           "' it binds to is " + p.dtype + " " + shape_str(p.shape) + what);
            if (!seen[p.tensor]) {
                seen[p.tensor] = true;
                total += ti.nbytes;
            }
            if (p.part_n)
                parts += ti.nbytes / p.part_n;
            else if (!b.gather && !seen_whole[p.tensor]) {
                seen_whole[p.tensor] = true;
                whole += ti.nbytes;
            }
        }
        part = std::max(part, parts);
    }
    *held = whole + part;
    return total;
}

// The weights of blocks[i] bound: each a view of a verified handle, which
// the view's deleter releases when the last tensor using it goes.
// part >= 0 (a block in parts): part `part` of each parameter's n.
void bind(sluice_model *m, Block &b, int64_t part = -1)
{
    std::vector<at::Tensor> views;
    for (const Param &p : b.params) {
        sluice_tensor *h = nullptr;
        int rc = part < 0 ? sluice_acquire(m, p.tensor.c_str(), &h)
                          : sluice_acquire_part(m, p.tensor.c_str(), p.part_dim, (uint64_t)part,
                                                p.part_n, &h);
        if (rc != SLUICE_OK)  // views drop: handles go
            throw Fail("block '" + b.name + "'" +
                       (part < 0 ? std::string() : " part " + std::to_string(part) + "/" +
                                                       std::to_string(p.part_n)) +
                       ": " + sluice_errmsg(m));
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

// A part's output, along join_axis, has the part's length (its first
// parameter's along its part dim): another axis would join the pieces
// into logits of the wrong shape, silently.
void check_piece(const Block &b, uint64_t r, const at::Tensor &piece)
{
    const Param &p = b.params[0];
    int64_t rows = p.shape[p.part_dim], nd = piece.dim(), axis = b.join_axis;
    if (axis < -nd || axis >= nd || piece.size(axis) != rows)
        throw Fail("block '" + b.name + "': part " + std::to_string(r) + "'s output is " +
                   shape_str(piece.sizes().vec()) + ": along join_axis " +
                   std::to_string(axis) + " it does not have the part's " +
                   std::to_string(rows) + " rows");
}

// Zero weights that hold no memory, for --baseline.
void bind_zeros(Block &b)
{
    for (Param &p : b.params)
        p.owner.setattr(p.leaf, torch::zeros({}, torch::TensorOptions().dtype(kDtypes.at(p.dtype)))
                                    .expand(p.shape));
    b.bound = true;
}

// A "gather" block's table for ids: the rows of the distinct indices,
// ascending, read and verified by ranges (sluice_read_into; --baseline: a
// zero table holding no memory), and the positions of ids among them.
std::pair<at::Tensor, at::Tensor> gather_rows(sluice_model *m, const Block &b, const at::Tensor &ids)
{
    const Param &p = b.params[0];
    const int64_t rows = p.shape[0], width = p.shape[1];
    if (ids.scalar_type() != at::kLong)
        throw Fail("block '" + b.name + "': its indices are not an int64 tensor");
    at::Tensor c = ids.contiguous();
    const int64_t *id = c.data_ptr<int64_t>();
    const int64_t n = c.numel();
    for (int64_t k = 0; k < n; k++)
        if (id[k] < 0 || id[k] >= rows)
            throw Fail("block '" + b.name + "': index " + std::to_string(id[k]) + " is not a row of '" +
                       p.tensor + "' " + shape_str(p.shape));
    std::vector<int64_t> u(id, id + n);
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    std::vector<int64_t> pos(n);
    for (int64_t k = 0; k < n; k++)
        pos[k] = std::lower_bound(u.begin(), u.end(), id[k]) - u.begin();
    at::Tensor where = torch::tensor(pos, torch::TensorOptions().dtype(at::kLong)).view(ids.sizes());
    const auto opts = torch::TensorOptions().dtype(kDtypes.at(p.dtype));
    if (!m)
        return {torch::zeros({}, opts).expand({(int64_t)u.size(), width}), where};
    const uint64_t row = (uint64_t)width * c10::elementSize(kDtypes.at(p.dtype));
    at::Tensor table = torch::empty({(int64_t)u.size(), width}, opts);
    char *dst = static_cast<char *>(table.data_ptr());
    std::vector<char> buf;
    for (size_t g = 0; g < u.size();) {
        size_t h = g + 1;
        while (h < u.size() && (uint64_t)(u[h] - u[g] + 1) * row <= kGatherSpan)
            h++;
        const uint64_t span = (uint64_t)(u[h - 1] - u[g] + 1) * row;
        buf.resize(span);
        if (sluice_read_into(m, p.tensor.c_str(), (uint64_t)u[g] * row, buf.data(), span) != SLUICE_OK)
            throw Fail("block '" + b.name + "': " + sluice_errmsg(m));
        for (size_t k = g; k < h; k++)
            std::memcpy(dst + k * row, buf.data() + (uint64_t)(u[k] - u[g]) * row, row);
        g = h;
    }
    return {table, where};
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

// A whole decimal number in [lo, hi], else a usage error naming the option.
long long parse_int(const std::string &opt, const std::string &s, long long lo, long long hi)
{
    char *end = nullptr;
    errno = 0;
    // digits only (every caller's range is >= 0): strtoll would take " 3", "+3"
    long long v = !s.empty() && std::isdigit((unsigned char)s[0]) ? std::strtoll(s.c_str(), &end, 10) : -1;
    if (v < 0 || *end || errno || v < lo || v > hi)
        throw Usage(opt + " " + s + ": not a whole number from " + std::to_string(lo) + " to " +
                    std::to_string(hi));
    return v;
}

uint64_t parse_size(const char *s)
{
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s, &end, 10);
    int shift = 0;
    if (end != s && !errno && std::isdigit((unsigned char)*s)) {  // strtoull takes " -1"
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        default: break;
        }
        if (!*end && v <= (~0ULL >> shift))
            return v << shift;
    }
    throw Usage(std::string("--pool ") + s + ": not a size (bytes, or with K, M, G, below 2^64)");
}

const char kUsage[] =
    "usage: torchscript_engine EXPORT_DIR WEIGHTS [--tokens 1,2,3] [--steps N] [--pool SIZE]\n"
    "                          [--manifest PATH] [--top K] [--resident] [--trace] [--baseline]\n"
    "Runs the TorchScript blocks of EXPORT_DIR (sluice.torch.export_blocks: plan.json and one\n"
    "module per block) with weights from WEIGHTS read and verified by sluice on demand, one\n"
    "block ahead, bound zero-copy. Prints per step the greedy token and the SHA-256 of the\n"
    "logits (float32), the top K tokens, peak RSS and the library's counters. A plan of\n"
    "version 2 (export --vocab-parts N) runs a block in parts once per part, each bound alone\n"
    "(sluice_acquire_part), and reads a gather block's rows (sluice_read_into).\n"
    "  --tokens LIST  the prompt's token ids (default 0,1,...,11)\n"
    "  --steps N      greedy decode steps after the prompt (default 0)\n"
    "  --pool SIZE    the library's pool (default: the library's)\n"
    "  --manifest P   the manifest (default: the sidecar)\n"
    "  --resident     keep every block's weights bound after its first use (parts and rows:\n"
    "                 bound for their run only)\n"
    "  --trace        print each block's name as it completes, and each part's, and per\n"
    "                 block 'time NAME bind_ms B run_ms R': binding (acquires and the wait\n"
    "                 for their reads and hashes; a gather's row reads) and the forward\n"
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
                throw Usage(a + " needs a value");
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--tokens") {
            std::stringstream ss(value());
            for (std::string t; std::getline(ss, t, ',');)
                tokens.push_back(parse_int("--tokens", t, 0, INT64_MAX));  // ids are rows
            if (tokens.empty()) // else the default prompt would run in its place
                throw Usage("--tokens: give at least one id");
        } else if (a == "--steps") {
            steps = (long)parse_int("--steps", value(), 0, 1000000);
        } else if (a == "--top") {
            top = (long)parse_int("--top", value(), 1, 1000000);
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
    if (pos.size() != 2) {
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
        uint64_t held = 0;
        total = check_weights(m, blocks, pos[1], &held);
        struct sluice_stats st;
        std::memset(&st, 0, sizeof st);
        st.size = sizeof st;
        if (sluice_stats(m, &st) == SLUICE_OK) {
            pool = st.pool_bytes;
            if (held <= pool)
                resident = true;  // everything bound whole fits: keep it bound
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

    // The hint (docs/torchscript.md "Hints"), once per block: the plan's
    // names bound whole from block i on, as C strings for sluice_prefetch
    // (parts and gathered rows are read as they are needed: a hint would
    // bring the whole tensor into the pool). None left (a last block in
    // parts): the plan's from the start, the next step's, when a next step
    // comes; none at all: no hint (an empty one means the model's order).
    std::vector<std::vector<const char *>> rest(blocks.size());
    for (size_t i = blocks.size(); i-- > 0;) {
        if (!blocks[i].parts && !blocks[i].gather)
            for (const Param &p : blocks[i].params)
                rest[i].push_back(p.tensor.c_str());
        if (i + 1 < blocks.size())
            rest[i].insert(rest[i].end(), rest[i + 1].begin(), rest[i + 1].end());
    }
    auto hint = [&](size_t i, bool next_pass) {
        if (rest[i].empty() && !next_pass)
            return;  // the last pass: no next one to read ahead
        bool all_bound = true;
        for (const Block &b : blocks)
            all_bound = all_bound && (b.parts || b.gather || b.bound);
        if (all_bound || baseline)
            return;
        const std::vector<const char *> &names = rest[i].empty() ? rest[0] : rest[i];
        if (!names.empty() && sluice_prefetch(m, names.data(), names.size()) != SLUICE_OK)
            throw Fail("prefetch: " + std::string(sluice_errmsg(m)));
    };

    std::vector<int64_t> seq = tokens;
    at::Tensor logits;
    for (long step = 0; step <= steps; step++) {
        at::Tensor ids = torch::tensor(seq, torch::TensorOptions().dtype(at::kLong)).view({1, -1});
        torch::jit::IValue x = ids;
        for (size_t i = 0; i < blocks.size(); i++) {
            Block &b = blocks[i];
            // --trace's times: binding (acquires, the wait for their reads
            // and hashes, or the rows' reads) and the forward itself
            double bind_ms = 0, run_ms = 0;
            auto tb = std::chrono::steady_clock::now();
            auto lap = [&tb](double &into) {
                auto now = std::chrono::steady_clock::now();
                into += std::chrono::duration<double, std::milli>(now - tb).count();
                tb = now;
            };
            if (b.parts) {
                // Once per part, each bound for its run only (--resident
                // too), the outputs joined in part order.
                hint(i, step < steps);
                std::vector<at::Tensor> pieces;
                for (uint64_t r = 0; r < b.parts; r++) {
                    if (baseline)
                        bind_zeros(b);
                    else
                        bind(m, b, (int64_t)r);
                    lap(bind_ms);
                    try {
                        pieces.push_back(b.module.forward({x}).toTensor());
                    } catch (...) {
                        unbind(b);
                        throw;
                    }
                    lap(run_ms);
                    unbind(b);
                    check_piece(b, r, pieces.back());
                    if (trace)
                        std::printf("part %s %llu/%llu\n", b.name.c_str(), (unsigned long long)r,
                                    (unsigned long long)b.parts);
                }
                x = torch::cat(pieces, b.join_axis);
            } else if (b.gather) {
                hint(i, step < steps);  // the next blocks read while the rows are
                auto tw = gather_rows(m, b, x.toTensor());
                Param &p = b.params[0];
                p.owner.setattr(p.leaf, tw.first);
                lap(bind_ms);
                try {
                    x = b.module.forward({tw.second});
                } catch (...) {
                    p.owner.setattr(p.leaf, p.placeholder);
                    throw;
                }
                p.owner.setattr(p.leaf, p.placeholder);
            } else {
                if (!b.bound) {
                    if (baseline) {
                        bind_zeros(b);
                    } else {
                        // From here on, in order: the library reads ahead what
                        // this block's acquires do not wait for, within the pool.
                        hint(i, step < steps);
                        bind(m, b);
                    }
                }
                lap(bind_ms);
                try {
                    x = b.module.forward({x});
                } catch (...) {
                    unbind(b);
                    throw;
                }
                lap(run_ms);
                if (!resident && !baseline)
                    unbind(b);
            }
            if (b.gather)
                lap(run_ms);
            if (trace)
                std::printf("ran %s\ntime %s bind_ms %.2f run_ms %.2f\n", b.name.c_str(),
                            b.name.c_str(), bind_ms, run_ms);
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
            std::printf("pool_high_water %llu tensors_verified %llu bytes_read %llu evictions %llu "
                        "part_fallback_bytes %llu\n",
                        (unsigned long long)st.pool_high_water,
                        (unsigned long long)st.tensors_verified, (unsigned long long)st.bytes_read,
                        (unsigned long long)st.evictions, (unsigned long long)st.part_fallback_bytes);
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv)
{
    try {
        return run(argc, argv);
    } catch (const Usage &e) {
        std::fprintf(stderr, "torchscript_engine: %s\n%s", e.what(), kUsage);
        return 2;
    } catch (const Fail &e) {
        std::fprintf(stderr, "torchscript_engine: %s\n", e.what());
    } catch (const c10::Error &e) {
        std::fprintf(stderr, "torchscript_engine: torch: %s\n", e.what_without_backtrace());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "torchscript_engine: %s\n", e.what());
    }
    return 1;
}
