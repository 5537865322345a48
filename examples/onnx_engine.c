/* onnx_engine.c: an inference engine over ONNX Runtime's C API that runs
 * compiled ONNX blocks (one graph per block, every weight an initializer
 * whose data is external and absent: plan.json, format
 * "sluice-onnx-plan" version 1, docs/onnx.md) with weights that sluice
 * reads and verifies on demand.
 *
 * Before any block runs, the plan is checked: every block file against
 * its SHA-256; every initializer of the plan against the graph's own (read
 * from the file: the name exists, with the plan's dtype and shape and
 * external data) and every external initializer of the graph against the
 * plan (else ONNX Runtime would read it from the placeholder); every
 * initializer's tensor against the model's index (it exists, with the
 * plan's dtype and shape). ONNX Runtime checks none of these for an
 * initializer it is handed. Then, for each block in order:
 * the rest of the plan is hinted to the library (sluice_prefetch), so the
 * next block is read while this one runs, within the pool; each tensor of
 * the block is acquired (read, verified: a flipped weight fails here, the
 * library's message naming the tensor and both digests, and the block does
 * not run), its bytes wrapped in an OrtValue without a copy
 * (CreateTensorWithDataAsOrtValue) and handed to the session's options
 * (AddInitializer), with "session.disable_prepacking" = "1" (else ONNX
 * Runtime copies the weights into packed buffers); the session is created
 * from the block file, run, and freed, and the handles released (unless
 * --resident). Block k's outputs are block k+1's inputs, in order.
 *
 * Plan version 2 (docs/onnx.md): an initializer in "part"s is bound part
 * by part (sluice_acquire_part), its block run once per part and the
 * outputs joined along "join_axis" (a vocab head: the logits in vocab
 * order); a "gather" block (one Gather of a 2-D table, checked in the
 * graph) is not run: the engine reads each index's row (sluice_read_into,
 * verified), so neither the head nor the embedding needs its whole tensor
 * in the pool.
 *
 * The prompt (--tokens) runs through the blocks, then --steps greedy
 * decode steps (each appends the argmax token and runs the whole sequence
 * again: the blocks keep no cache). Per step it prints the token and the
 * SHA-256 of the logits (the last block's first output, float32, C
 * order); then peak RSS (getrusage) and the library's counters.
 *
 *   onnx_engine EXPORT_DIR WEIGHTS --tokens 1,2,3 --steps 3 --pool 256M
 *   onnx_engine --embedded EMBEDDED_DIR --tokens 1,2,3 --steps 3
 *
 * --embedded runs blocks that carry their weights inside (the same plan
 * format, no sluice at all), under the same session options: what the
 * on-demand run is compared with, bit for bit.
 *
 * The library stays free of ONNX Runtime: this program is built when CMake
 * finds it (examples/onnx.cmake, SLUICE_WITH_ORT; tools/ort.sh fetches it)
 * and uses sluice.h only. */
#define _POSIX_C_SOURCE 200809L
#include <sluice.h>

#include <cjson/cJSON.h>
#include <onnxruntime_c_api.h>
#include <openssl/evp.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_DIMS 16

struct init {
    const char *name;   /* the graph's initializer name */
    const char *tensor; /* the tensor's name in the weights */
    const char *dtype;  /* safetensors dtype name */
    int64_t shape[MAX_DIMS];
    size_t ndim;
    sluice_tensor *handle;
    OrtValue *value;
    uint32_t part_dim; /* plan version 2: "part": the graph's initializer is */
    uint64_t part_n;   /* part r of n of the tensor along part_dim (0: whole) */
};

struct block {
    const char *name, *file;
    char *path;
    const char **inputs, **outputs;
    size_t ninputs, noutputs;
    struct init *inits;
    size_t ninits;
    OrtSession *session; /* kept between steps under --resident only */
    unsigned char *graph; /* the block file's bytes, until its initializers are checked */
    size_t graph_len;
    uint64_t nparts; /* > 0: run once per part r of the parted initializers, */
    int join_axis;   /* the outputs joined along this axis, in part order */
    uint64_t part;   /* the part bound now */
    int gather;      /* >= 0: "gather": the block is Gather(inits[gather], inputs[0]) */
};

/* An activation: a block's output copied out of ONNX Runtime, or the
 * prompt; owned here so that it outlives the session that made it. */
struct act {
    ONNXTensorElementDataType type;
    int64_t shape[MAX_DIMS];
    size_t ndim;
    void *data;
    size_t bytes;
};

struct plan_input {
    const char *name, *dtype;
};

struct eng {
    const OrtApi *ort;
    OrtEnv *env;
    OrtMemoryInfo *mem;
    sluice_model *m;
    cJSON *json;
    const char *dir;
    struct block *blocks;
    size_t nblocks;
    struct plan_input *pinputs;
    size_t npinputs;
    const char **rest; /* every block's tensor names, in order, for the hints */
    size_t *rest_from; /* where block i's names start in rest */
    size_t nrest;
    int threads, resident, trace, embedded;
    int next_pass; /* another forward pass follows this one (a decode step) */
    const char *poke; /* --test-poke: the tensor to change after session creation */
    const char *dump; /* --dump-logits: each step's logits to DUMP-NNN.f32 */
    char err[4096];
};

static int fail(struct eng *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof e->err, fmt, ap);
    va_end(ap);
    return -1;
}

static int ort_check(struct eng *e, OrtStatus *st, const char *what, const char *block)
{
    if (!st)
        return 0;
    if (block)
        fail(e, "block '%s': %s: ONNX Runtime: %s", block, what, e->ort->GetErrorMessage(st));
    else
        fail(e, "%s: ONNX Runtime: %s", what, e->ort->GetErrorMessage(st));
    e->ort->ReleaseStatus(st);
    return -1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static long peak_rss_kb(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

static void shape_str(char *out, size_t n, const int64_t *shape, size_t ndim)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (size_t i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n)
        snprintf(out + k, n - k, "]");
}

static void hex(char *out, const unsigned char *d, unsigned n)
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = 0;
}

/* The SHA-256 of n bytes as 64 hex digits in out[65]. */
static int sha256_hex(const void *data, size_t n, char *out)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (!EVP_Digest(data, n, md, &len, EVP_sha256(), NULL) || len != 32)
        return -1;
    hex(out, md, len);
    return 0;
}

static int read_file(struct eng *e, const char *path, char **out, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(e, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            fclose(f);
            return fail(e, "%s: out of memory", path);
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        char *bigger = realloc(buf, 2 * cap + 1);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return fail(e, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    *n = len;
    return 0;
}

static char *join(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, file);
    return p;
}

static const char *str_member(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* An array of strings into a NULL-free array of borrowed pointers. */
static int str_array(struct eng *e, const cJSON *o, const char *key, const char *where,
                     const char ***out, size_t *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *v;
    if (!cJSON_IsArray(a))
        return fail(e, "%s: \"%s\" is missing or not an array", where, key);
    *n = (size_t)cJSON_GetArraySize(a);
    *out = calloc(*n ? *n : 1, sizeof **out);
    if (!*out)
        return fail(e, "out of memory");
    size_t i = 0;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsString(v))
            return fail(e, "%s: \"%s\" holds a non-string", where, key);
        (*out)[i++] = v->valuestring;
    }
    return 0;
}

static int shape_array(struct eng *e, const cJSON *o, const char *where, int64_t *shape, size_t *ndim)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "shape"), *d;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > MAX_DIMS)
        return fail(e, "%s: \"shape\" is missing, not an array or of more than %d dims", where,
                    MAX_DIMS);
    *ndim = 0;
    cJSON_ArrayForEach(d, a) {
        /* range first: casting a double past int64_t's is undefined */
        if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0 && d->valuedouble <= 9007199254740992.0) ||
            d->valuedouble != (double)(int64_t)d->valuedouble)
            return fail(e, "%s: a dimension of \"shape\" is not a count", where);
        shape[(*ndim)++] = (int64_t)d->valuedouble;
    }
    return 0;
}

/* safetensors dtype name -> ONNX element type and size (0: unsupported). */
static ONNXTensorElementDataType onnx_type(const char *dtype, size_t *size)
{
    static const struct {
        const char *name;
        ONNXTensorElementDataType type;
        size_t size;
    } map[] = {
        {"F32", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 4},   {"F16", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, 2},
        {"BF16", ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16, 2}, {"F64", ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, 8},
        {"I8", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, 1},     {"U8", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, 1},
        {"I16", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, 2},   {"U16", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, 2},
        {"I32", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, 4},   {"U32", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, 4},
        {"I64", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 8},   {"U64", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, 8},
        {"BOOL", ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, 1},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (dtype && strcmp(map[i].name, dtype) == 0) {
            *size = map[i].size;
            return map[i].type;
        }
    *size = 0;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

static const char *const dtype_names[] = {"F32", "F16", "BF16", "F64", "I8", "U8", "I16",
                                          "U16", "I32", "U32", "I64", "U64", "BOOL"};

static size_t onnx_size(ONNXTensorElementDataType t)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        size_t size;
        if (onnx_type(dtype_names[i], &size) == t)
            return size;
    }
    return 0;
}

/* An ONNX element type in safetensors' spelling, else its number. */
static const char *onnx_type_name(int t, char *buf, size_t n)
{
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        size_t size;
        if ((int)onnx_type(dtype_names[i], &size) == t)
            return dtype_names[i];
    }
    snprintf(buf, n, "ONNX type %d", t);
    return buf;
}

/* The graph's own initializers, read from the block file (ONNX's
 * protobuf: ModelProto.graph = 7, GraphProto.initializer = 5, TensorProto
 * dims = 1, data_type = 2, name = 8, data_location = 14), so that the plan
 * is checked against the graph before any block runs: ONNX Runtime takes
 * an initializer of any name, dtype or shape that AddInitializer gives it. */
struct pb {
    const unsigned char *p, *end;
};

static int pb_varint(struct pb *b, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; shift < 64 && b->p < b->end; shift += 7) {
        unsigned char c = *b->p++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return 0;
    }
    return -1;
}

/* The next field: its number, wire type, and for a length-delimited one
 * its bytes in *sub (skipped in b); for a varint its value in *v. */
static int pb_field(struct pb *b, uint64_t *field, unsigned *wt, uint64_t *v, struct pb *sub)
{
    uint64_t key, len;
    if (pb_varint(b, &key))
        return -1;
    *field = key >> 3;
    *wt = (unsigned)(key & 7);
    switch (*wt) {
    case 0:
        return pb_varint(b, v);
    case 1:
    case 5: {
        size_t n = *wt == 1 ? 8 : 4;
        if ((size_t)(b->end - b->p) < n)
            return -1;
        b->p += n;
        return 0;
    }
    case 2:
        if (pb_varint(b, &len) || len > (uint64_t)(b->end - b->p))
            return -1;
        sub->p = b->p;
        sub->end = b->p + len;
        b->p += len;
        return 0;
    default:
        return -1;
    }
}

struct ginit {
    const unsigned char *name;
    size_t name_len;
    int64_t dims[MAX_DIMS];
    size_t ndim;
    int dtype, external, used;
};

static int pb_tensor(struct pb t, struct ginit *g)
{
    memset(g, 0, sizeof *g);
    uint64_t field, v;
    unsigned wt;
    struct pb sub;
    while (t.p < t.end) {
        if (pb_field(&t, &field, &wt, &v, &sub))
            return -1;
        if (field == 1 && wt == 0) { /* dims, unpacked */
            if (g->ndim == MAX_DIMS)
                return -1;
            g->dims[g->ndim++] = (int64_t)v;
        } else if (field == 1 && wt == 2) { /* dims, packed */
            while (sub.p < sub.end) {
                if (pb_varint(&sub, &v) || g->ndim == MAX_DIMS)
                    return -1;
                g->dims[g->ndim++] = (int64_t)v;
            }
        } else if (field == 2 && wt == 0) {
            g->dtype = (int)v;
        } else if (field == 8 && wt == 2) {
            g->name = sub.p;
            g->name_len = (size_t)(sub.end - sub.p);
        } else if (field == 14 && wt == 0) {
            g->external = v == 1;
        }
    }
    return g->name ? 0 : -1;
}

static int check_graph(struct eng *e, struct block *b, const char *where)
{
    struct pb m = {b->graph, b->graph + b->graph_len}, g = {NULL, NULL}, sub;
    uint64_t field, v;
    unsigned wt;
    while (m.p < m.end) {
        if (pb_field(&m, &field, &wt, &v, &sub))
            return fail(e, "%s: %s is not an ONNX model", where, b->path);
        if (field == 7 && wt == 2)
            g = sub;
    }
    if (!g.p)
        return fail(e, "%s: %s has no graph", where, b->path);
    size_t n = 0, cap = 16;
    struct ginit *gi = malloc(cap * sizeof *gi);
    int rc = gi ? 0 : fail(e, "out of memory");
    while (rc == 0 && g.p < g.end) {
        if (pb_field(&g, &field, &wt, &v, &sub)) {
            rc = fail(e, "%s: %s is not an ONNX model", where, b->path);
        } else if (field == 5 && wt == 2) {
            if (n == cap) {
                struct ginit *more = realloc(gi, 2 * cap * sizeof *gi);
                if (!more) {
                    rc = fail(e, "out of memory");
                    break;
                }
                gi = more;
                cap *= 2;
            }
            if (pb_tensor(sub, &gi[n++]))
                rc = fail(e, "%s: %s holds an initializer it cannot read", where, b->path);
        }
    }
    for (size_t k = 0; rc == 0 && k < b->ninits; k++) {
        const struct init *in = &b->inits[k];
        struct ginit *found = NULL;
        for (size_t q = 0; q < n && !found; q++)
            if (gi[q].name_len == strlen(in->name) && !memcmp(gi[q].name, in->name, gi[q].name_len))
                found = &gi[q];
        size_t size;
        if (!found) {
            rc = fail(e, "%s: the plan's initializer '%s' (tensor '%s') is not an initializer of %s",
                      where, in->name, in->tensor, b->path);
            break;
        }
        found->used = 1;
        int same = found->ndim == in->ndim && (int)onnx_type(in->dtype, &size) == found->dtype;
        for (size_t d = 0; same && d < in->ndim; d++)
            same = found->dims[d] == in->shape[d];
        if (!same) {
            char s1[256], s2[256], t1[32];
            shape_str(s1, sizeof s1, found->dims, found->ndim);
            shape_str(s2, sizeof s2, in->shape, in->ndim);
            rc = fail(e, "%s: initializer '%s' is %s %s in %s, the plan says %s %s (tensor '%s')",
                      where, in->name, onnx_type_name(found->dtype, t1, sizeof t1), s1, b->path,
                      in->dtype, s2, in->tensor);
        } else if (!found->external) {
            rc = fail(e, "%s: initializer '%s' holds its data inside %s; the plan hands it over",
                      where, in->name, b->path);
        }
    }
    for (size_t q = 0; rc == 0 && q < n; q++)
        if (gi[q].external && !gi[q].used)
            rc = fail(e, "%s: %s's initializer '%.*s' has external data the plan does not hand "
                      "over (ONNX Runtime would read it from the placeholder)",
                      where, b->path, (int)gi[q].name_len, (const char *)gi[q].name);
    free(gi);
    return rc;
}

static int pb_is(struct pb x, const char *str)
{
    return (size_t)(x.end - x.p) == strlen(str) && !memcmp(x.p, str, strlen(str));
}

/* A "gather" block (plan version 2) is one node, Gather(initializer,
 * indices) on axis 0, giving the block's output: what the engine computes
 * itself by reading the rows (read from the file's bytes, checked). */
static int check_gather(struct eng *e, struct block *b, const char *where)
{
    struct pb m = {b->graph, b->graph + b->graph_len}, g = {NULL, NULL}, sub, node = {NULL, NULL};
    uint64_t field, v;
    unsigned wt;
    size_t nodes = 0;
    while (m.p < m.end) {
        if (pb_field(&m, &field, &wt, &v, &sub))
            return fail(e, "%s: %s is not an ONNX model", where, b->path);
        if (field == 7 && wt == 2)
            g = sub;
    }
    while (g.p && g.p < g.end) {
        if (pb_field(&g, &field, &wt, &v, &sub))
            return fail(e, "%s: %s is not an ONNX model", where, b->path);
        if (field == 1 && wt == 2) {
            nodes++;
            node = sub;
        }
    }
    int ok = nodes == 1, nin = 0, nout = 0, op = 0;
    while (ok && node.p < node.end) {
        if (pb_field(&node, &field, &wt, &v, &sub))
            return fail(e, "%s: %s is not an ONNX model", where, b->path);
        if (field == 1 && wt == 2)
            ok = (nin == 0 && pb_is(sub, b->inits[b->gather].name)) ||
                 (nin == 1 && pb_is(sub, b->inputs[0]));
        nin += field == 1;
        if (field == 2 && wt == 2)
            ok = nout++ == 0 && pb_is(sub, b->outputs[0]);
        if (field == 4 && wt == 2)
            op = pb_is(sub, "Gather");
        if (field == 5 && wt == 2) { /* an attribute: only axis = 0 */
            struct pb a = sub, s2;
            int axis = 0, zero = 1;
            while (ok && a.p < a.end) {
                if (pb_field(&a, &field, &wt, &v, &s2))
                    return fail(e, "%s: %s is not an ONNX model", where, b->path);
                if (field == 1 && wt == 2)
                    axis = pb_is(s2, "axis");
                if (field == 3 && wt == 0)
                    zero = v == 0;
            }
            ok = ok && axis && zero;
        }
    }
    if (!(ok && op && nin == 2 && nout == 1))
        return fail(e, "%s: the plan says \"gather\", and %s is not one Gather of the initializer "
                    "'%s' by '%s' on axis 0 giving '%s'", where, b->path, b->inits[b->gather].name,
                    b->inputs[0], b->outputs[0]);
    return 0;
}

/* Reads DIR/plan.json and checks every block file against its SHA-256. */
static int load_plan(struct eng *e)
{
    char *path = join(e->dir, "plan.json"), *text = NULL;
    size_t n;
    if (!path)
        return fail(e, "out of memory");
    int rc = read_file(e, path, &text, &n);
    if (rc == 0) {
        e->json = cJSON_ParseWithLength(text, n);
        free(text);
        if (!e->json)
            rc = fail(e, "%s: not JSON", path);
    }
    int version = 0;
    if (rc == 0) {
        const char *fmt = str_member(e->json, "format");
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(e->json, "version");
        if (!fmt || strcmp(fmt, "sluice-onnx-plan") || !cJSON_IsNumber(ver) ||
            (ver->valuedouble != 1 && ver->valuedouble != 2))
            rc = fail(e, "%s: not a sluice-onnx-plan of version 1 or 2", path);
        else
            version = (int)ver->valuedouble;
    }
    const cJSON *jin = rc ? NULL : cJSON_GetObjectItemCaseSensitive(e->json, "inputs");
    const cJSON *jb = rc ? NULL : cJSON_GetObjectItemCaseSensitive(e->json, "blocks");
    if (rc == 0 && (!cJSON_IsArray(jin) || !cJSON_IsArray(jb) || cJSON_GetArraySize(jb) == 0))
        rc = fail(e, "%s: \"inputs\" and \"blocks\" must be arrays, with at least one block", path);
    if (rc == 0) {
        e->npinputs = (size_t)cJSON_GetArraySize(jin);
        e->nblocks = (size_t)cJSON_GetArraySize(jb);
        e->pinputs = calloc(e->npinputs ? e->npinputs : 1, sizeof *e->pinputs);
        e->blocks = calloc(e->nblocks, sizeof *e->blocks);
        if (!e->pinputs || !e->blocks)
            rc = fail(e, "out of memory");
    }
    size_t i = 0;
    const cJSON *v;
    if (rc == 0)
        cJSON_ArrayForEach(v, jin) {
            e->pinputs[i].name = str_member(v, "name");
            e->pinputs[i].dtype = str_member(v, "dtype");
            if (!e->pinputs[i].name || !e->pinputs[i].dtype) {
                rc = fail(e, "%s: an input has no \"name\" or \"dtype\"", path);
                break;
            }
            i++;
        }
    i = 0;
    if (rc == 0)
        cJSON_ArrayForEach(v, jb) {
            struct block *b = &e->blocks[i++];
            char where[512];
            b->name = str_member(v, "name");
            b->file = str_member(v, "file");
            const char *sha = str_member(v, "sha256");
            snprintf(where, sizeof where, "%s: block '%s'", path, b->name ? b->name : "?");
            if (!b->name || !b->file || !sha) {
                rc = fail(e, "%s: \"name\", \"file\" or \"sha256\" is missing", where);
                break;
            }
            if (strchr(b->file, '/') || !strcmp(b->file, "..")) {
                rc = fail(e, "%s: file %s is not in the directory", where, b->file);
                break;
            }
            if ((rc = str_array(e, v, "inputs", where, &b->inputs, &b->ninputs)) ||
                (rc = str_array(e, v, "outputs", where, &b->outputs, &b->noutputs)))
                break;
            if (b->ninputs == 0 || b->noutputs == 0) {
                rc = fail(e, "%s: a block needs inputs and outputs", where);
                break;
            }
            if (!(b->path = join(e->dir, b->file))) {
                rc = fail(e, "out of memory");
                break;
            }
            char *code = NULL, got[65];
            size_t len = 0;
            if ((rc = read_file(e, b->path, &code, &len)))
                break;
            b->graph = (unsigned char *)code;
            b->graph_len = len;
            int bad = sha256_hex(code, len, got);
            if (bad) {
                rc = fail(e, "SHA-256 failed");
                break;
            }
            if (strcmp(got, sha)) {
                rc = fail(e, "%s: %s has SHA-256 %s, the plan says %s", where, b->path, got, sha);
                break;
            }
            /* ONNX Runtime opens the graph's external data file although it
             * reads none of it (every initializer is handed over). */
            const char *ext = str_member(v, "external_data");
            if (ext && !e->embedded) {
                struct stat st;
                char *xp = strchr(ext, '/') ? NULL : join(e->dir, ext);
                if (!xp || stat(xp, &st) != 0) {
                    free(xp);
                    rc = fail(e, "%s: its external data placeholder %s is not in %s", where, ext,
                              e->dir);
                    break;
                }
                free(xp);
            }
            const cJSON *ji = cJSON_GetObjectItemCaseSensitive(v, "initializers"), *p;
            if (!cJSON_IsArray(ji)) {
                rc = fail(e, "%s: \"initializers\" is missing or not an array", where);
                break;
            }
            b->ninits = (size_t)cJSON_GetArraySize(ji);
            if (e->embedded)
                b->ninits = 0; /* the weights are in the graph */
            b->inits = calloc(b->ninits ? b->ninits : 1, sizeof *b->inits);
            if (!b->inits) {
                rc = fail(e, "out of memory");
                break;
            }
            size_t k = 0;
            cJSON_ArrayForEach(p, ji) {
                if (k == b->ninits)
                    break;
                struct init *in = &b->inits[k++];
                size_t size;
                in->name = str_member(p, "name");
                in->tensor = str_member(p, "tensor");
                in->dtype = str_member(p, "dtype");
                if (!in->name || !in->tensor || !in->dtype) {
                    rc = fail(e, "%s: an initializer lacks \"name\", \"tensor\" or \"dtype\"", where);
                    break;
                }
                if ((rc = shape_array(e, p, where, in->shape, &in->ndim)))
                    break;
                if (onnx_type(in->dtype, &size) == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) {
                    rc = fail(e, "%s: initializer '%s': dtype %s has no ONNX type here", where,
                              in->name, in->dtype);
                    break;
                }
                const cJSON *jp = cJSON_GetObjectItemCaseSensitive(p, "part");
                if (jp && version < 2) {
                    rc = fail(e, "%s: initializer '%s': \"part\" needs plan version 2", where,
                              in->name);
                    break;
                }
                if (jp) {
                    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(jp, "dim");
                    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(jp, "n");
                    if (!cJSON_IsNumber(jd) || !cJSON_IsNumber(jn) || jd->valuedouble < 0 ||
                        jd->valuedouble >= (double)in->ndim || jn->valuedouble < 1 ||
                        jn->valuedouble > 1e9 || jn->valuedouble != (double)(uint64_t)jn->valuedouble ||
                        jd->valuedouble != (double)(uint32_t)jd->valuedouble) {
                        rc = fail(e, "%s: initializer '%s': \"part\" needs \"dim\" (a dim of "
                                  "its shape) and \"n\" (a count)", where, in->name);
                        break;
                    }
                    in->part_dim = (uint32_t)jd->valuedouble;
                    in->part_n = (uint64_t)jn->valuedouble;
                    if (b->nparts && b->nparts != in->part_n) {
                        rc = fail(e, "%s: its initializers are in %llu and %llu parts", where,
                                  (unsigned long long)b->nparts, (unsigned long long)in->part_n);
                        break;
                    }
                    b->nparts = in->part_n;
                }
            }
            b->gather = -1;
            const cJSON *jj = cJSON_GetObjectItemCaseSensitive(v, "join_axis");
            const cJSON *jg = cJSON_GetObjectItemCaseSensitive(v, "gather");
            if (rc == 0 && (jj || jg) && version < 2)
                rc = fail(e, "%s: \"join_axis\" and \"gather\" need plan version 2", where);
            if (rc == 0 && e->embedded && b->nparts)
                rc = fail(e, "%s: --embedded runs whole weights, not parts", where);
            if (rc == 0 && b->nparts) {
                if (!cJSON_IsNumber(jj) || jj->valuedouble < 0 || jj->valuedouble >= MAX_DIMS ||
                    jj->valuedouble != (double)(int)jj->valuedouble || b->noutputs != 1)
                    rc = fail(e, "%s: a block of parts needs \"join_axis\" (an axis of its one "
                              "output)", where);
                else
                    b->join_axis = (int)jj->valuedouble;
            }
            if (rc == 0 && jg && !e->embedded) {
                const char *gi = str_member(jg, "initializer"), *gx = str_member(jg, "indices");
                for (size_t q = 0; gi && q < b->ninits; q++)
                    if (!strcmp(b->inits[q].name, gi))
                        b->gather = (int)q;
                if (b->gather < 0 || !gx || b->ninputs != 1 || strcmp(b->inputs[0], gx) ||
                    b->noutputs != 1 || b->ninits != 1 || b->inits[0].ndim != 2 ||
                    b->inits[0].part_n)
                    rc = fail(e, "%s: \"gather\" needs \"initializer\" (the block's one, 2-D, "
                              "whole) and \"indices\" (its one input), and one output", where);
                else if ((rc = check_gather(e, b, where)))
                    b->gather = -1;
            }
            if (rc || (!e->embedded && (rc = check_graph(e, b, where))))
                break;
            free(b->graph);
            b->graph = NULL;
        }
    free(path);
    return rc;
}

/* Every initializer's tensor exists in the weights with the plan's dtype
 * and shape: checked before any block runs. Also builds the hint lists. */
static int check_weights(struct eng *e, const char *weights, uint64_t *total)
{
    *total = 0;
    e->nrest = 0;
    for (size_t i = 0; i < e->nblocks; i++)
        e->nrest += e->blocks[i].ninits;
    e->rest = calloc(e->nrest ? e->nrest : 1, sizeof *e->rest);
    e->rest_from = calloc(e->nblocks + 1, sizeof *e->rest_from);
    if (!e->rest || !e->rest_from)
        return fail(e, "out of memory");
    size_t r = 0;
    for (size_t i = 0; i < e->nblocks; i++) {
        const struct block *b = &e->blocks[i];
        e->rest_from[i] = r;
        for (size_t k = 0; k < b->ninits; k++) {
            const struct init *in = &b->inits[k];
            struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
            if (sluice_find(e->m, in->tensor, &ti) != SLUICE_OK)
                return fail(e, "block '%s': initializer '%s' binds to tensor '%s', which is not in %s",
                            b->name, in->name, in->tensor, weights);
            int64_t have[MAX_DIMS];
            int same = ti.ndim == in->ndim && ti.ndim <= MAX_DIMS;
            for (uint32_t d = 0; d < ti.ndim && d < MAX_DIMS; d++) {
                have[d] = (int64_t)ti.shape[d];
                /* a part: the plan's shape is the part's (the tensor's / n) */
                int64_t n = in->part_n && d == in->part_dim ? (int64_t)in->part_n : 1;
                /* divided, not multiplied: the plan's numbers may be huge */
                same = same && have[d] % n == 0 && have[d] / n == in->shape[d];
            }
            const char *dt = sluice_dtype_name(ti.dtype);
            if (!dt || strcmp(dt, in->dtype) || !same) {
                char s1[256], s2[256];
                shape_str(s1, sizeof s1, have, ti.ndim < MAX_DIMS ? ti.ndim : MAX_DIMS);
                shape_str(s2, sizeof s2, in->shape, in->ndim);
                return fail(e, "block '%s': tensor '%s' is %s %s in the weights, the initializer "
                            "'%s' it binds to is %s %s in the plan",
                            b->name, in->tensor, dt ? dt : "?", s1, in->name, in->dtype, s2);
            }
            int first = 1;
            for (size_t q = 0; q < r; q++)
                first = first && strcmp(e->rest[q], in->tensor);
            for (size_t j = 0; j < i && first; j++) /* parted or gathered before */
                for (size_t q = 0; q < e->blocks[j].ninits; q++)
                    first = first && strcmp(e->blocks[j].inits[q].tensor, in->tensor);
            for (size_t q = 0; q < k && first; q++)
                first = strcmp(b->inits[q].tensor, in->tensor) != 0;
            if (first)
                *total += ti.nbytes;
            /* Parts and gathered rows are read as they are needed: a hint
             * would bring the whole tensor into the pool. */
            if (!in->part_n && b->gather != (int)k)
                e->rest[r++] = in->tensor;
        }
    }
    e->rest_from[e->nblocks] = r;
    e->nrest = r; /* parts and gathered tables left out */
    return 0;
}

/* The block's handles and values go back (the session first: the values
 * must outlive it). */
static void unbind(struct eng *e, struct block *b)
{
    if (b->session) {
        e->ort->ReleaseSession(b->session);
        b->session = NULL;
    }
    for (size_t k = 0; k < b->ninits; k++) {
        if (b->inits[k].value)
            e->ort->ReleaseValue(b->inits[k].value);
        b->inits[k].value = NULL;
        if (b->inits[k].handle)
            sluice_release(b->inits[k].handle);
        b->inits[k].handle = NULL;
    }
}

/* The session of block i, its weights acquired and handed over in place. */
static int bind(struct eng *e, size_t i, double *bind_ms)
{
    struct block *b = &e->blocks[i];
    const OrtApi *ort = e->ort;
    double t0 = now_ms();
    /* The hint (docs/onnx.md "Hints"), once per block (a block in parts:
     * before its first part; hinted again, the library's read-ahead would
     * fill the room each part gives back, for the next part to evict it):
     * from here on, in order, the library reads ahead what this block's
     * acquires do not wait for, within the pool. Nothing hintable left (a
     * last block in parts): the plan from its start, the next pass's
     * blocks, when a next pass comes (n = 0 would mean the model's order,
     * which reads the parted and gathered tensors whole). */
    if (!e->embedded && b->ninits && e->nrest && (!b->nparts || b->part == 0)) {
        int left = e->rest_from[i] < e->nrest; /* tensors bound whole from block i on */
        size_t from = left ? e->rest_from[i] : 0;
        if ((left || e->next_pass) && sluice_prefetch(e->m, e->rest + from, e->nrest - from) != SLUICE_OK)
            return fail(e, "block '%s': prefetch: %s", b->name, sluice_errmsg(e->m));
    }
    OrtSessionOptions *so = NULL;
    int rc = ort_check(e, ort->CreateSessionOptions(&so), "session options", b->name);
    if (rc == 0)
        rc = ort_check(e, ort->AddSessionConfigEntry(so, "session.disable_prepacking", "1"),
                       "session.disable_prepacking", b->name);
    if (rc == 0) /* the process's thread pools, made once (start_ort) */
        rc = ort_check(e, ort->DisablePerSessionThreads(so), "threads", b->name);
    for (size_t k = 0; rc == 0 && k < b->ninits; k++) {
        struct init *in = &b->inits[k];
        if ((in->part_n ? sluice_acquire_part(e->m, in->tensor, in->part_dim, b->part, in->part_n,
                                              &in->handle)
                        : sluice_acquire(e->m, in->tensor, &in->handle)) != SLUICE_OK) {
            rc = fail(e, "block '%s': %s", b->name, sluice_errmsg(e->m));
            break;
        }
        size_t size;
        ONNXTensorElementDataType t = onnx_type(in->dtype, &size);
        /* ONNX Runtime wants a mutable pointer; it only reads an
         * initializer (prepacking, which would write packed copies, is
         * off), and the handle's bytes stay put until its release. */
        void *data = (void *)(uintptr_t)sluice_tensor_data(in->handle);
        rc = ort_check(e, ort->CreateTensorWithDataAsOrtValue(e->mem, data,
                                                              (size_t)sluice_tensor_size(in->handle),
                                                              in->shape, in->ndim, t, &in->value),
                       in->tensor, b->name);
        if (rc == 0)
            rc = ort_check(e, ort->AddInitializer(so, in->name, in->value), in->name, b->name);
    }
    if (rc == 0)
        rc = ort_check(e, ort->CreateSession(e->env, b->path, so, &b->session), b->path, b->name);
    if (so)
        ort->ReleaseSessionOptions(so);
    if (rc)
        unbind(e, b);
    *bind_ms = now_ms() - t0;
    return rc;
}

static void act_free(struct act *a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(a[i].data);
        a[i].data = NULL;
    }
}

/* Runs block i on in[b->ninputs]; its outputs, copied, into out[b->noutputs]. */
static int run_block(struct eng *e, size_t i, const struct act *in, struct act *out)
{
    struct block *b = &e->blocks[i];
    const OrtApi *ort = e->ort;
    OrtValue *vin[64] = {0}, *vout[64] = {0};
    if (b->ninputs > 64 || b->noutputs > 64)
        return fail(e, "block '%s': more than 64 inputs or outputs", b->name);
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < b->ninputs; k++)
        rc = ort_check(e, ort->CreateTensorWithDataAsOrtValue(e->mem, in[k].data, in[k].bytes,
                                                              in[k].shape, in[k].ndim, in[k].type,
                                                              &vin[k]),
                       b->inputs[k], b->name);
    if (rc == 0)
        rc = ort_check(e, ort->Run(b->session, NULL, b->inputs, (const OrtValue *const *)vin,
                                   b->ninputs, b->outputs, b->noutputs, vout),
                       "run", b->name);
    for (size_t k = 0; rc == 0 && k < b->noutputs; k++) {
        OrtTensorTypeAndShapeInfo *ti = NULL;
        size_t count = 0;
        void *data = NULL;
        rc = ort_check(e, ort->GetTensorTypeAndShape(vout[k], &ti), b->outputs[k], b->name);
        if (rc == 0)
            rc = ort_check(e, ort->GetTensorElementType(ti, &out[k].type), b->outputs[k], b->name);
        if (rc == 0)
            rc = ort_check(e, ort->GetDimensionsCount(ti, &out[k].ndim), b->outputs[k], b->name);
        if (rc == 0 && out[k].ndim > MAX_DIMS)
            rc = fail(e, "block '%s': output '%s' has more than %d dims", b->name, b->outputs[k],
                      MAX_DIMS);
        if (rc == 0)
            rc = ort_check(e, ort->GetDimensions(ti, out[k].shape, out[k].ndim), b->outputs[k], b->name);
        if (rc == 0)
            rc = ort_check(e, ort->GetTensorShapeElementCount(ti, &count), b->outputs[k], b->name);
        if (rc == 0)
            rc = ort_check(e, ort->GetTensorMutableData(vout[k], &data), b->outputs[k], b->name);
        if (ti)
            ort->ReleaseTensorTypeAndShapeInfo(ti);
        size_t size = onnx_size(out[k].type);
        if (rc == 0 && size == 0)
            rc = fail(e, "block '%s': output '%s' has an element type (%d) not handled here",
                      b->name, b->outputs[k], (int)out[k].type);
        if (rc == 0) {
            out[k].bytes = count * size;
            out[k].data = malloc(out[k].bytes ? out[k].bytes : 1);
            if (!out[k].data)
                rc = fail(e, "out of memory");
            else if (out[k].bytes)
                memcpy(out[k].data, data, out[k].bytes);
        }
    }
    for (size_t k = 0; k < 64; k++) {
        if (vin[k])
            ort->ReleaseValue(vin[k]);
        if (vout[k])
            ort->ReleaseValue(vout[k]);
    }
    if (rc)
        act_free(out, b->noutputs);
    return rc;
}

/* --test-poke: a test hook showing that ONNX Runtime reads the handle's
 * memory in place. After the session of the block holding TENSOR is
 * created, one byte of the handle's (verified) bytes is changed; it is
 * changed back after the block ran, so that the pool's copy stays as
 * verified. Returns the byte's address (NULL: not in this block). */
static unsigned char *poke(struct eng *e, struct block *b)
{
    for (size_t k = 0; e->poke && k < b->ninits; k++)
        if (!strcmp(b->inits[k].tensor, e->poke) && sluice_tensor_size(b->inits[k].handle) >= 4) {
            /* the high byte of the first element (little-endian float32:
             * sign and exponent), so the change is never lost in rounding */
            size_t size;
            onnx_type(b->inits[k].dtype, &size);
            unsigned char *p = (unsigned char *)(uintptr_t)sluice_tensor_data(b->inits[k].handle) +
                               (size ? size - 1 : 0);
            *p ^= 0x40;
            return p;
        }
    return NULL;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* A "gather" block without its table: the indices' rows read from the
 * weights (sluice_read_into, verified: by the chunks that hold it with
 * chunk digests, else the whole tensor is hashed) into out. */
static int gather_rows(struct eng *e, struct block *b, const struct act *ids, struct act *out)
{
    const struct init *in = &b->inits[b->gather];
    size_t size;
    ONNXTensorElementDataType t = onnx_type(in->dtype, &size);
    if (ids->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || ids->ndim + 1 > MAX_DIMS)
        return fail(e, "block '%s': its indices '%s' are not int64", b->name, b->inputs[0]);
    size_t n = ids->bytes / sizeof(int64_t), row = (size_t)in->shape[1] * size;
    *out = (struct act){.type = t, .ndim = ids->ndim + 1, .bytes = n * row};
    memcpy(out->shape, ids->shape, ids->ndim * sizeof *ids->shape);
    out->shape[ids->ndim] = in->shape[1];
    out->data = malloc(out->bytes ? out->bytes : 1);
    if (!out->data)
        return fail(e, "out of memory");
    const int64_t *id = ids->data;
    for (size_t k = 0; k < n; k++)
        if (id[k] < 0 || id[k] >= in->shape[0]) {
            act_free(out, 1);
            return fail(e, "block '%s': index %lld is not a row of '%s' [%lld, %lld]", b->name,
                        (long long)id[k], in->tensor, (long long)in->shape[0],
                        (long long)in->shape[1]);
        }
    /* Rows close together are read as one range (each read verifies the
     * chunks it touches: one read per neighbourhood, not per token). */
    int64_t *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) {
        act_free(out, 1);
        return fail(e, "out of memory");
    }
    memcpy(sorted, id, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_i64);
    const uint64_t span_max = 4u << 20;
    int rc = 0;
    for (size_t g = 0; rc == 0 && g < n;) {
        size_t h = g + 1;
        while (h < n && (uint64_t)(sorted[h] - sorted[g] + 1) * row <= span_max)
            h++;
        uint64_t rows = (uint64_t)(sorted[h - 1] - sorted[g] + 1);
        char *buf = malloc(rows * row);
        if (!buf) {
            rc = fail(e, "out of memory");
        } else if (sluice_read_into(e->m, in->tensor, (uint64_t)sorted[g] * row, buf, rows * row) !=
                   SLUICE_OK) {
            rc = fail(e, "block '%s': %s", b->name, sluice_errmsg(e->m));
        } else {
            for (size_t k = 0; k < n; k++)
                if (id[k] >= sorted[g] && id[k] <= sorted[h - 1])
                    memcpy((char *)out->data + k * row, buf + (uint64_t)(id[k] - sorted[g]) * row,
                           row);
        }
        free(buf);
        g = h;
    }
    free(sorted);
    if (rc)
        act_free(out, 1);
    return rc;
}

/* pieces[n] (one output of each part's run) joined along axis into out;
 * the pieces are freed. */
static int join_parts(struct eng *e, struct block *b, struct act *pieces, uint64_t n, struct act *out)
{
    int axis = b->join_axis;
    *out = pieces[0];
    out->data = NULL;
    if ((size_t)axis >= pieces[0].ndim)
        return fail(e, "block '%s': join_axis %d, its output has %zu dims", b->name, axis,
                    pieces[0].ndim);
    size_t outer = 1, size = onnx_size(pieces[0].type), total = 0;
    for (int d = 0; d < axis; d++)
        outer *= (size_t)pieces[0].shape[d];
    /* A part's output, along join_axis, has the part's length (its first
     * initializer's along its part dim): another axis would join the
     * pieces into logits of the wrong shape, silently. */
    const struct init *in = b->inits;
    while (!in->part_n) /* the block has one at least: it is in parts */
        in++;
    int64_t rows = in->shape[in->part_dim];
    out->shape[axis] = 0;
    for (uint64_t r = 0; r < n; r++) {
        if (pieces[r].ndim > (size_t)axis && pieces[r].shape[axis] != rows)
            return fail(e, "block '%s': part %llu's output has %lld along join_axis %d, where "
                        "a part has %lld rows", b->name, (unsigned long long)r,
                        (long long)pieces[r].shape[axis], axis, (long long)rows);
        int same = pieces[r].ndim == pieces[0].ndim && pieces[r].type == pieces[0].type;
        for (size_t d = 0; same && d < pieces[0].ndim; d++)
            same = (int)d == axis || pieces[r].shape[d] == pieces[0].shape[d];
        if (!same)
            return fail(e, "block '%s': its parts' outputs differ beyond axis %d", b->name, axis);
        out->shape[axis] += pieces[r].shape[axis];
        total += pieces[r].bytes;
    }
    out->bytes = total;
    out->data = malloc(total ? total : 1);
    if (!out->data)
        return fail(e, "out of memory");
    (void)size;
    char *dst = out->data;
    for (size_t o = 0; o < outer; o++)
        for (uint64_t r = 0; r < n; r++) {
            size_t chunk = outer ? pieces[r].bytes / outer : 0;
            memcpy(dst, (const char *)pieces[r].data + o * chunk, chunk);
            dst += chunk;
        }
    return 0;
}

/* One forward pass over every block: the prompt's activations in, the
 * last block's outputs (logits first) out. */
static int forward(struct eng *e, struct act *x, size_t *nx, double *bind_total, double *run_total)
{
    for (size_t i = 0; i < e->nblocks; i++) {
        struct block *b = &e->blocks[i];
        if (*nx != b->ninputs)
            return fail(e, "block '%s' takes %zu inputs, the previous block gives %zu", b->name,
                        b->ninputs, *nx);
        double bind_ms = 0, run_ms = 0, t0;
        struct act out[64];
        memset(out, 0, sizeof out);
        int rc = b->noutputs > 64 ? fail(e, "block '%s': more than 64 outputs", b->name) : 0;
        if (rc == 0 && b->gather >= 0) {
            t0 = now_ms();
            rc = gather_rows(e, b, &x[0], &out[0]);
            run_ms = now_ms() - t0;
        } else if (rc == 0 && b->nparts) {
            struct act *pieces = calloc(b->nparts, sizeof *pieces);
            if (!pieces)
                return fail(e, "out of memory");
            for (uint64_t r = 0; rc == 0 && r < b->nparts; r++) {
                double part_ms = 0;
                b->part = r;
                if ((rc = bind(e, i, &part_ms)))
                    break;
                unsigned char *poked = poke(e, b);
                t0 = now_ms();
                rc = run_block(e, i, x, &pieces[r]);
                double ms = now_ms() - t0;
                if (poked)
                    *poked ^= 0x40;
                unbind(e, b); /* a part is bound for its run only, --resident too */
                bind_ms += part_ms;
                run_ms += ms;
                if (e->trace && rc == 0)
                    printf("part %s %llu/%llu session_ms %.2f run_ms %.2f\n", b->name,
                           (unsigned long long)r, (unsigned long long)b->nparts, part_ms, ms);
            }
            if (rc == 0)
                rc = join_parts(e, b, pieces, b->nparts, &out[0]);
            for (uint64_t r = 0; r < b->nparts; r++)
                act_free(&pieces[r], 1);
            free(pieces);
        } else if (rc == 0) {
            if (!b->session && bind(e, i, &bind_ms))
                return -1;
            unsigned char *poked = poke(e, b);
            t0 = now_ms();
            rc = run_block(e, i, x, out);
            run_ms = now_ms() - t0;
            if (poked)
                *poked ^= 0x40;
            if (!e->resident)
                unbind(e, b);
        }
        if (rc)
            return -1;
        act_free(x, *nx);
        memcpy(x, out, b->noutputs * sizeof *out);
        *nx = b->noutputs;
        *bind_total += bind_ms;
        *run_total += run_ms;
        if (e->trace)
            printf("ran %s session_ms %.2f run_ms %.2f\n", b->name, bind_ms, run_ms);
    }
    return 0;
}

/* The prompt as the plan's inputs: input_ids the tokens, attention_mask
 * ones, position_ids 0..n-1 (each int64 [1, n]). */
static int prompt(struct eng *e, const int64_t *tokens, size_t n, struct act *x, size_t *nx)
{
    const struct block *b0 = &e->blocks[0];
    if (b0->ninputs != e->npinputs || e->npinputs > 64)
        return fail(e, "the plan has %zu inputs, its first block takes %zu", e->npinputs,
                    b0->ninputs);
    for (size_t k = 0; k < e->npinputs; k++) {
        const char *name = e->pinputs[k].name;
        int ids = !strcmp(name, "input_ids"), mask = !strcmp(name, "attention_mask"),
            pos = !strcmp(name, "position_ids");
        if (strcmp(e->pinputs[k].dtype, "I64") || !(ids || mask || pos)) {
            act_free(x, k);
            return fail(e, "the plan's input '%s' (%s) is not one this engine fills "
                        "(input_ids, attention_mask, position_ids: I64)", name, e->pinputs[k].dtype);
        }
        int64_t *v = malloc(n * sizeof *v);
        if (!v) {
            act_free(x, k);
            return fail(e, "out of memory");
        }
        for (size_t t = 0; t < n; t++)
            v[t] = ids ? tokens[t] : mask ? 1 : (int64_t)t;
        x[k] = (struct act){.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, .shape = {1, (int64_t)n},
                            .ndim = 2, .data = v, .bytes = n * sizeof *v};
    }
    *nx = e->npinputs;
    return 0;
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (!isdigit((unsigned char)*s) || end == s || errno) /* strtoull takes " -1" */
        return -1;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    default: break;
    }
    if (*end || v > (ULLONG_MAX >> shift)) /* 99999999999G would wrap to a small pool */
        return -1;
    *out = v << shift;
    return 0;
}

static const char usage[] =
    "usage: onnx_engine EXPORT_DIR WEIGHTS [--tokens 1,2,3] [--steps N] [--pool SIZE]\n"
    "                   [--manifest PATH] [--threads N] [--resident] [--trace] [--dump-logits P]\n"
    "       onnx_engine --embedded DIR [--tokens ...] [--steps N] [--threads N] [--trace]\n"
    "Runs the ONNX blocks of EXPORT_DIR (plan.json, format sluice-onnx-plan version 1 or 2,\n"
    "and one graph per block whose weights are external and absent) with ONNX Runtime, the\n"
    "weights read from WEIGHTS and verified by sluice on demand, one block ahead, handed to\n"
    "ONNX Runtime in place (AddInitializer, session.disable_prepacking = 1). The plan is\n"
    "checked first: each block file's SHA-256, each tensor's presence, dtype and shape.\n"
    "Prints per step the greedy token and the SHA-256 of the logits (float32), then the\n"
    "peak RSS and the library's counters.\n"
    "  --tokens LIST   the prompt's token ids (default 0,1,...,11)\n"
    "  --steps N       greedy decode steps after the prompt (default 0)\n"
    "  --pool SIZE     the library's pool (K, M, G suffixes; default: the library's)\n"
    "  --manifest P    the manifest (default: the sidecar)\n"
    "  --threads N     ONNX Runtime's compute threads, one pool for every block's session\n"
    "                  (default: ONNX Runtime's, one a physical core)\n"
    "  --resident      keep every block's session and weights after its first run\n"
    "  --trace         print each block as it completes, with its session and run times\n"
    "                  (and each part's run of a block in vocab parts: plan version 2)\n"
    "  --embedded DIR  run DIR's blocks, whose weights are inside the graphs (same plan\n"
    "                  format, no WEIGHTS, no sluice), under the same session options\n"
    "  --dump-logits P write each step's logits (float32, C order) to P-000.f32, P-001.f32, ...\n"
    "  --test-poke T   test hook: after the session of the block holding tensor T is\n"
    "                  created, change one byte of T's handle (restored after the block):\n"
    "                  the logits change only if ONNX Runtime reads the handle in place\n"
    "exit: 0 done, 1 a failure (its message on stderr), 2 usage\n";

struct args {
    const char *pos[2];
    size_t npos;
    int64_t *tokens;
    size_t ntokens;
    long steps;
    uint64_t pool;
    const char *manifest, *embedded;
};

static int parse_args(int argc, char **argv, struct args *a, struct eng *e)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(s, "--tokens") || !strcmp(s, "--steps") || !strcmp(s, "--pool") ||
                    !strcmp(s, "--manifest") || !strcmp(s, "--threads") ||
                    !strcmp(s, "--embedded") || !strcmp(s, "--test-poke") ||
                    !strcmp(s, "--dump-logits");
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            fputs(usage, stdout);
            return 1;
        }
        if (takes && !val) {
            fprintf(stderr, "onnx_engine: %s needs a value\n%s", s, usage);
            return 2;
        }
        char *end = NULL;
        if (!strcmp(s, "--tokens")) {
            free(a->tokens);
            a->ntokens = 0;
            a->tokens = malloc((strlen(val) / 2 + 1) * sizeof *a->tokens);
            if (!a->tokens)
                return 2;
            for (const char *p = val; *p;) {
                errno = 0;
                /* an id is digits: strtoll would take " 3", "+3" and -1 (which
                 * ONNX's Gather reads as the last row) */
                long long t = isdigit((unsigned char)*p) ? strtoll(p, &end, 10) : -1;
                if (t < 0 || errno || (*end && *end != ',')) {
                    fprintf(stderr, "onnx_engine: --tokens %s: not a list of ids\n", val);
                    return 2;
                }
                a->tokens[a->ntokens++] = t;
                p = *end ? end + 1 : end;
            }
            if (!a->ntokens) {
                fprintf(stderr, "onnx_engine: --tokens: the prompt needs at least one id\n");
                return 2;
            }
        } else if (!strcmp(s, "--steps") || !strcmp(s, "--threads")) {
            long v = strtol(val, &end, 10);
            if (end == val || *end || v < 0 || v > INT_MAX) {
                fprintf(stderr, "onnx_engine: %s %s: not a count\n", s, val);
                return 2;
            }
            if (s[2] == 's')
                a->steps = v;
            else
                e->threads = (int)v;
        } else if (!strcmp(s, "--pool")) {
            if (parse_size(val, &a->pool)) {
                fprintf(stderr, "onnx_engine: --pool %s: not a size (bytes, or with K, M, G)\n", val);
                return 2;
            }
        } else if (!strcmp(s, "--manifest")) {
            a->manifest = val;
        } else if (!strcmp(s, "--embedded")) {
            a->embedded = val;
        } else if (!strcmp(s, "--test-poke")) {
            e->poke = val;
        } else if (!strcmp(s, "--dump-logits")) {
            e->dump = val;
        } else if (!strcmp(s, "--resident")) {
            e->resident = 1;
        } else if (!strcmp(s, "--trace")) {
            e->trace = 1;
        } else if (s[0] == '-') {
            fprintf(stderr, "onnx_engine: unknown option %s\n%s", s, usage);
            return 2;
        } else if (a->npos < 2) {
            a->pos[a->npos++] = s;
        } else {
            fputs(usage, stderr);
            return 2;
        }
        i += takes;
    }
    if (a->embedded ? a->npos != 0 : a->npos != 2) {
        fputs(usage, stderr);
        return 2;
    }
    return 0;
}

/* ONNX Runtime's environment, with one pool of compute threads for the
 * whole process: every block's session uses it (DisablePerSessionThreads),
 * so that creating a session starts no threads. */
static int start_ort(struct eng *e)
{
    e->ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    if (!e->ort)
        return fail(e, "this ONNX Runtime (%s) does not give API version %d",
                    OrtGetApiBase()->GetVersionString(), ORT_API_VERSION);
    const OrtApi *ort = e->ort;
    OrtThreadingOptions *to = NULL;
    int rc = ort_check(e, ort->CreateThreadingOptions(&to), "threading options", NULL);
    if (rc == 0 && e->threads > 0)
        rc = ort_check(e, ort->SetGlobalIntraOpNumThreads(to, e->threads), "threads", NULL);
    if (rc == 0)
        rc = ort_check(e, ort->SetGlobalInterOpNumThreads(to, 1), "threads", NULL);
    if (rc == 0)
        rc = ort_check(e, ort->CreateEnvWithGlobalThreadPools(ORT_LOGGING_LEVEL_WARNING, "onnx_engine",
                                                             to, &e->env),
                       "environment", NULL);
    if (to)
        ort->ReleaseThreadingOptions(to);
    if (rc == 0)
        rc = ort_check(e, ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &e->mem),
                       "memory info", NULL);
    return rc;
}

/* --dump-logits: the step's logits, raw float32 in C order, to
 * PREFIX-NNN.f32 (for a comparison within a tolerance, e.g. with eager
 * torch). */
static int dump_logits(struct eng *e, long step, const struct act *lg)
{
    size_t n = strlen(e->dump) + 32;
    char *path = malloc(n);
    if (!path)
        return fail(e, "out of memory");
    snprintf(path, n, "%s-%03ld.f32", e->dump, step);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(lg->data, 1, lg->bytes, f) == lg->bytes;
    ok = (f && fclose(f) == 0) && ok;
    int rc = ok ? 0 : fail(e, "--dump-logits: cannot write %s", path);
    free(path);
    return rc;
}

/* The whole run: plan, checks, the prompt and the decode steps. */
static int run(struct eng *e, struct args *a)
{
    e->dir = a->embedded ? a->embedded : a->pos[0];
    e->embedded = a->embedded != NULL;
    double t0 = now_ms();
    if (load_plan(e))
        return -1;
    uint64_t total = 0, pool = 0;
    if (!e->embedded) {
        sluice_options opts;
        sluice_options_init(&opts);
        if (a->pool)
            opts.pool_bytes = a->pool;
        opts.manifest_path = a->manifest;
        int rc = sluice_open(a->pos[1], &opts, &e->m);
        if (rc != SLUICE_OK)
            return fail(e, "open %s: %s", a->pos[1], e->m ? sluice_errmsg(e->m) : sluice_strerror(rc));
        if (check_weights(e, a->pos[1], &total))
            return -1;
        struct sluice_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        if (sluice_stats(e->m, &st) == SLUICE_OK)
            pool = st.pool_bytes;
    }
    if (start_ort(e))
        return -1;
    size_t ninits = 0;
    for (size_t i = 0; i < e->nblocks; i++)
        ninits += e->blocks[i].ninits;
    printf("onnxruntime %s blocks %zu initializers %zu weights_bytes %llu pool_bytes %llu "
           "embedded %d resident %d\n",
           OrtGetApiBase()->GetVersionString(), e->nblocks, ninits, (unsigned long long)total,
           (unsigned long long)pool, e->embedded, e->resident);
    fflush(stdout);

    int64_t dflt[12];
    if (!a->tokens) {
        for (int t = 0; t < 12; t++)
            dflt[t] = t;
    }
    size_t n = a->tokens ? a->ntokens : 12;
    int64_t *seq = malloc((n + (size_t)a->steps + 1) * sizeof *seq);
    if (!seq)
        return fail(e, "out of memory");
    memcpy(seq, a->tokens ? a->tokens : dflt, n * sizeof *seq);
    struct act x[64];
    memset(x, 0, sizeof x);
    size_t nx = 0;
    int rc = 0;
    double bind_total = 0, run_total = 0;
    for (long step = 0; rc == 0 && step <= a->steps; step++) {
        e->next_pass = step < a->steps;
        if ((rc = prompt(e, seq, n, x, &nx)) || (rc = forward(e, x, &nx, &bind_total, &run_total)))
            break;
        const struct act *lg = &x[0];
        int64_t vocab = lg->ndim ? lg->shape[lg->ndim - 1] : 0;
        if (lg->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || vocab <= 0 ||
            lg->bytes / 4 < (size_t)vocab) { /* [1, 0, V] holds no row */
            rc = fail(e, "the last block's first output is not float32 logits [..., vocab]");
            break;
        }
        const float *row = (const float *)lg->data + (lg->bytes / 4 - (size_t)vocab);
        int64_t best = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (row[v] > row[best])
                best = v;
        char digest[65];
        if (sha256_hex(lg->data, lg->bytes, digest)) {
            rc = fail(e, "SHA-256 failed");
            break;
        }
        if (e->dump && (rc = dump_logits(e, step, lg)))
            break;
        if (step == 0)
            printf("first_token_ms %.1f\n", now_ms() - t0);
        printf("step %ld token %lld logits_sha256 %s\n", step, (long long)best, digest);
        fflush(stdout);
        act_free(x, nx);
        nx = 0;
        seq[n++] = best;
    }
    act_free(x, nx);
    free(seq);
    for (size_t i = 0; i < e->nblocks; i++)
        unbind(e, &e->blocks[i]);
    if (rc)
        return rc;
    printf("total_ms %.1f session_ms %.1f run_ms %.1f\n", now_ms() - t0, bind_total, run_total);
    printf("peak_rss_kb %ld\n", peak_rss_kb());
    if (e->m) {
        struct sluice_stats st;
        memset(&st, 0, sizeof st);
        st.size = sizeof st;
        if (sluice_stats(e->m, &st) == SLUICE_OK)
            printf("pool_high_water %llu tensors_verified %llu bytes_read %llu evictions %llu "
                   "part_fallback_bytes %llu\n",
                   (unsigned long long)st.pool_high_water,
                   (unsigned long long)st.tensors_verified, (unsigned long long)st.bytes_read,
                   (unsigned long long)st.evictions, (unsigned long long)st.part_fallback_bytes);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct eng e;
    struct args a;
    memset(&e, 0, sizeof e);
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, &a, &e);
    if (rc) {
        free(a.tokens);
        return rc == 1 ? 0 : 2;
    }
    rc = run(&e, &a) ? 1 : 0;
    if (rc)
        fprintf(stderr, "onnx_engine: %s\n", e.err);
    for (size_t i = 0; i < e.nblocks; i++) {
        if (e.ort)
            unbind(&e, &e.blocks[i]);
        free(e.blocks[i].path);
        free(e.blocks[i].inputs);
        free(e.blocks[i].outputs);
        free(e.blocks[i].inits);
        free(e.blocks[i].graph);
    }
    free(e.blocks);
    free(e.pinputs);
    free(e.rest);
    free(e.rest_from);
    if (e.mem)
        e.ort->ReleaseMemoryInfo(e.mem);
    if (e.env)
        e.ort->ReleaseEnv(e.env);
    sluice_close(e.m);
    cJSON_Delete(e.json);
    free(a.tokens);
    return rc;
}
