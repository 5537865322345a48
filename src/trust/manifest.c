/* manifest.c: reads the manifest of a model (flat, version 1 or version
 * 2), checks a version 2 manifest's description of every tensor and header
 * against the index, and resolves the verification policy (see
 * "Manifests" in sluice.h).
 *
 * The text is read whole with read(), capped at SLUICE_MAX_MANIFEST_BYTES,
 * parsed with cJSON, then walked. cJSON keeps object keys as C strings, so
 * a name holding an escaped NUL would be cut short there; member keys are
 * therefore taken from the text itself by a small scanner that walks the
 * members in step with cJSON's child list (same order), which also gives
 * every key its byte position for the messages. Duplicate keys, which cJSON
 * keeps, are caught with one flag per tensor (and per file): the names are
 * found through the index's own hash table, so a manifest of n names costs
 * O(n).
 */
#include "trust/manifest.h"
#include "sources/remote.h"
#include "index/source.h"
#include "trust/signature.h"
#include "trust/hf.h"

#include "base/digest.h"
#include "base/location.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct sl_manifest {
    sluice_verify_policy policy; /* REQUIRE or IF_PRESENT */
    sluice_algorithm algorithm;
    int version;                 /* 0 flat, 1 or 2 */
    char *path;
    size_t ntensors;
    uint8_t (*tensor_digest)[32];
    uint8_t *tensor_has;
    size_t nfiles;
    uint8_t (*file_digest)[32];
    uint64_t *file_size;
    uint8_t *file_has;
    sl_chunk_digests *chunks;    /* per tensor; count 0: none */
    uint64_t *chunk_at;          /* per tensor: its first digest in chunk_store */
    uint8_t (*chunk_store)[32];  /* every chunk digest, tensor after tensor */
    size_t nstored, stored_cap;
    struct mf_parts **parts;     /* per tensor; NULL: no part digests */
    uint8_t (*part_store)[32];   /* every part digest */
    size_t nparts_stored, parts_cap;
};

/* ---------------------------------------------------------------- reading */

static int read_text(const char *path, char **out, size_t *out_len, sl_err *err)
{
    *out = NULL;
    int fd = sl_open_read(path);
    if (fd < 0)
        return sl_fail_errno(err, SLUICE_E_MANIFEST, errno, "manifest %s: cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sl_fail_errno(err, SLUICE_E_MANIFEST, e, "manifest %s: cannot stat", path);
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return sl_fail_errno(err, SLUICE_E_MANIFEST, EISDIR, "manifest %s", path);
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > SLUICE_MAX_MANIFEST_BYTES) {
        close(fd);
        return sl_fail(err, SLUICE_E_MANIFEST,
                       "manifest %s: %llu bytes, over the limit of %llu", path,
                       (unsigned long long)st.st_size,
                       (unsigned long long)SLUICE_MAX_MANIFEST_BYTES);
    }
    /* Regular files are read in one go; pipes and the like grow the buffer. */
    size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 65536, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return sl_fail(err, SLUICE_E_NOMEM, "manifest %s: out of memory (%zu bytes)", path, cap);
    }
    for (;;) {
        if (len == cap) {
            if (cap >= SLUICE_MAX_MANIFEST_BYTES) {
                free(buf);
                close(fd);
                return sl_fail(err, SLUICE_E_MANIFEST, "manifest %s: over the limit of %llu bytes",
                               path, (unsigned long long)SLUICE_MAX_MANIFEST_BYTES);
            }
            size_t ncap = cap * 2 > SLUICE_MAX_MANIFEST_BYTES ? SLUICE_MAX_MANIFEST_BYTES + 1 : cap * 2;
            char *grown = realloc(buf, ncap + 1);
            if (!grown) {
                free(buf);
                close(fd);
                return sl_fail(err, SLUICE_E_NOMEM, "manifest %s: out of memory", path);
            }
            buf = grown;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return sl_fail_errno(err, SLUICE_E_MANIFEST, e, "manifest %s: read failed", path);
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (len > SLUICE_MAX_MANIFEST_BYTES) {
        free(buf);
        return sl_fail(err, SLUICE_E_MANIFEST, "manifest %s: over the limit of %llu bytes",
                       path, (unsigned long long)SLUICE_MAX_MANIFEST_BYTES);
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- walking */

/* What one walk over the members of an object sees. */
typedef struct mf_ctx {
    const sl_index *ix;
    sl_manifest *m;
    const char *path;
    const char *text;
    size_t len;
    sl_err *err;
    char *kbuf[5];      /* decoded keys, one buffer per nesting level */
    size_t kcap[5];
} mf_ctx;

typedef struct mf_member {
    const char *key;    /* decoded, NUL-terminated, key_len authoritative */
    size_t key_len;
    size_t at;          /* byte offset of the key's opening quote */
    const cJSON *value;
    size_t value_at;    /* byte offset of the value */
} mf_member;

typedef struct mf_walk {
    mf_ctx *c;
    int level;
    size_t pos;         /* scanner position in the text */
    const cJSON *child; /* cJSON's next member */
    int first;
} mf_walk;

/* "line L, byte B" for a byte offset, into buf. */
static const char *where(const mf_ctx *c, size_t pos, char *buf, size_t size)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < c->len; i++) {
        if (c->text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    snprintf(buf, size, "line %zu, column %zu, byte %zu", line, col, pos);
    return buf;
}

/* cJSON's notion of whitespace: every byte up to the space. */
static size_t skip_ws(const char *t, size_t len, size_t p)
{
    while (p < len && (unsigned char)t[p] <= 0x20)
        p++;
    return p;
}

static size_t skip_string(const char *t, size_t len, size_t p)
{
    for (p++; p < len && t[p] != '"'; p++)
        if (t[p] == '\\')
            p++;
    return p < len ? p + 1 : len;
}

/* Past one value of text that cJSON already accepted. */
static size_t skip_value(const char *t, size_t len, size_t p)
{
    if (p >= len)
        return len;
    if (t[p] == '"')
        return skip_string(t, len, p);
    if (t[p] == '{' || t[p] == '[') {
        size_t depth = 0;
        while (p < len) {
            char ch = t[p];
            if (ch == '"') {
                p = skip_string(t, len, p);
                continue;
            }
            if (ch == '{' || ch == '[')
                depth++;
            else if ((ch == '}' || ch == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return len;
    }
    while (p < len && t[p] != ',' && t[p] != '}' && t[p] != ']' && (unsigned char)t[p] > 0x20)
        p++;
    return p;
}

/* Where the first string value holding an escaped NUL ("\u0000") starts
 * in text that cJSON accepted, or len. cJSON's C string of such a value
 * ends at the NUL, so what follows would go unseen ("<64 hex>\u0000junk"
 * read as that digest, "BF16\u0000junk" as BF16). Names (keys, followed by
 * ':') may hold one; no value of a manifest may. */
static size_t value_with_nul(const char *t, size_t len)
{
    for (size_t p = 0; p < len;) {
        if (t[p] != '"') {
            p++;
            continue;
        }
        size_t start = p;
        int nul = 0;
        for (p++; p < len && t[p] != '"'; p++)
            if (t[p] == '\\') {
                nul |= len - p > 5 && t[p + 1] == 'u' && memcmp(t + p + 2, "0000", 4) == 0;
                p++;
            }
        p = p < len ? p + 1 : len;
        size_t q = skip_ws(t, len, p);
        if (nul && (q >= len || t[q] != ':'))
            return start;
    }
    return len;
}

static int read_u16(const char *s, const char *end, unsigned *out)
{
    if (end - s < 4)
        return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = sl_hex_value(s[i]);
        if (h < 0)
            return -1;
        v = v << 4 | (unsigned)h;
    }
    *out = v;
    return 0;
}

/* Decodes the JSON string body [s, end) into out (at least end - s + 1
 * bytes: no escape grows). Returns the length or -1. */
static long decode_string(const char *s, const char *end, char *out)
{
    char *o = out;
    while (s < end) {
        if (*s != '\\') {
            *o++ = *s++;
            continue;
        }
        if (++s >= end)
            return -1;
        char e = *s++;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (read_u16(s, end, &cp) < 0)
                return -1;
            s += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - s < 6 || s[0] != '\\' || s[1] != 'u' || read_u16(s + 2, end, &lo) < 0 ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp < 0x80) {
                *o++ = (char)cp;
            } else if (cp < 0x800) {
                *o++ = (char)(0xC0 | cp >> 6);
                *o++ = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *o++ = (char)(0xE0 | cp >> 12);
                *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
                *o++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (char)(0xF0 | cp >> 18);
                *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
                *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
                *o++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            return -1;
        }
    }
    *o = '\0';
    return (long)(o - out);
}

static int walk_inconsistent(mf_walk *w, size_t pos)
{
    char at[96];
    return sl_fail(w->c->err, SLUICE_E_MANIFEST, "manifest %s: cannot read the object at %s",
                   w->c->path, where(w->c, pos, at, sizeof at));
}

static int walk_begin(mf_ctx *c, mf_walk *w, int level, const cJSON *obj, size_t pos)
{
    w->c = c;
    w->level = level;
    w->child = obj->child;
    w->first = 1;
    w->pos = skip_ws(c->text, c->len, pos);
    if (w->pos >= c->len || c->text[w->pos] != '{')
        return walk_inconsistent(w, pos);
    w->pos++;
    return SLUICE_OK;
}

/* The next member: 1 with *mem filled, 0 at the end, < 0 on error. */
static int walk_next(mf_walk *w, mf_member *mem)
{
    mf_ctx *c = w->c;
    const char *t = c->text;
    size_t p = skip_ws(t, c->len, w->pos);
    if (!w->first && p < c->len && t[p] == ',')
        p = skip_ws(t, c->len, p + 1);
    if (p < c->len && t[p] == '}') {
        if (w->child)
            return walk_inconsistent(w, p);
        w->pos = p + 1;
        return 0;
    }
    if (p >= c->len || t[p] != '"' || !w->child || !w->child->string)
        return walk_inconsistent(w, p);
    size_t kb = p, ke = skip_string(t, c->len, p);
    if (ke - kb < 2)
        return walk_inconsistent(w, p);
    size_t need = ke - kb;
    if (need > c->kcap[w->level]) {
        char *grown = realloc(c->kbuf[w->level], need);
        if (!grown)
            return sl_fail(c->err, SLUICE_E_NOMEM, "manifest %s: out of memory", c->path);
        c->kbuf[w->level] = grown;
        c->kcap[w->level] = need;
    }
    char *key = c->kbuf[w->level];
    long klen = decode_string(t + kb + 1, t + ke - 1, key);
    /* cJSON's key must be ours, up to the first NUL. */
    size_t clen = strlen(w->child->string);
    if (klen < 0 || clen > (size_t)klen || memcmp(key, w->child->string, clen) != 0 ||
        (clen < (size_t)klen && key[clen] != '\0'))
        return walk_inconsistent(w, kb);
    p = skip_ws(t, c->len, ke);
    if (p >= c->len || t[p] != ':')
        return walk_inconsistent(w, p);
    p = skip_ws(t, c->len, p + 1);
    mem->key = key;
    mem->key_len = (size_t)klen;
    mem->at = kb;
    mem->value = w->child;
    mem->value_at = p;
    w->pos = skip_value(t, c->len, p);
    w->child = w->child->next;
    w->first = 0;
    return 1;
}

/* ---------------------------------------------------------------- entries */

/* A 64-character hex string into 32 bytes; otherwise a message in why. */
static int parse_digest(const cJSON *v, uint8_t out[32], char *why, size_t why_size)
{
    if (!cJSON_IsString(v) || !v->valuestring) {
        const char *kind = cJSON_IsNumber(v) ? "a number" : cJSON_IsObject(v) ? "an object"
                         : cJSON_IsArray(v) ? "an array" : cJSON_IsBool(v) ? "a boolean"
                         : cJSON_IsNull(v) ? "null" : "not a string";
        snprintf(why, why_size, "is %s, not a string of 64 hex characters", kind);
        return -1;
    }
    const char *s = v->valuestring;
    size_t n = strlen(s);
    if (n != 64) {
        snprintf(why, why_size, "has %zu characters, not 64", n);
        return -1;
    }
    for (size_t i = 0; i < 32; i++) {
        int hi = sl_hex_value(s[2 * i]), lo = sl_hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            size_t bad = hi < 0 ? 2 * i : 2 * i + 1;
            unsigned char ch = (unsigned char)s[bad];
            if (ch >= 0x20 && ch < 0x7f)
                snprintf(why, why_size, "has the non-hex character '%c' at position %zu", ch, bad);
            else
                snprintf(why, why_size, "has the non-hex byte 0x%02x at position %zu", ch, bad);
            return -1;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int digest_error(mf_ctx *c, const char *what, const mf_member *mem, const char *why)
{
    char q[SL_QUOTE_MAX], at[96];
    return sl_fail(c->err, SLUICE_E_MANIFEST_DIGEST, "manifest %s: digest of %s %s (%s) %s",
                   c->path, what, sl_quote(q, sizeof q, mem->key, mem->key_len),
                   where(c, mem->at, at, sizeof at), why);
}

/* Tensor entry: name and its digest value. */
static int add_tensor(mf_ctx *c, const mf_member *mem, const cJSON *digest)
{
    char q[SL_QUOTE_MAX], at[96], why[128];
    uint8_t d[32];
    if (parse_digest(digest, d, why, sizeof why) < 0)
        return digest_error(c, "tensor", mem, why);
    size_t i = sl_index_find(c->ix, mem->key, mem->key_len);
    if (i == SIZE_MAX)
        return sl_fail(c->err, SLUICE_E_MANIFEST_UNKNOWN,
                       "manifest %s: tensor %s (%s) is not in the model", c->path,
                       sl_quote(q, sizeof q, mem->key, mem->key_len), where(c, mem->at, at, sizeof at));
    if (c->m->tensor_has[i])
        return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE,
                       "manifest %s: tensor %s listed twice (again at %s)", c->path,
                       sl_quote(q, sizeof q, mem->key, mem->key_len), where(c, mem->at, at, sizeof at));
    c->m->tensor_has[i] = 1;
    memcpy(c->m->tensor_digest[i], d, 32);
    return SLUICE_OK;
}

static int format_error(mf_ctx *c, size_t pos, const char *what)
{
    char at[96];
    return sl_fail(c->err, SLUICE_E_MANIFEST_FORMAT, "manifest %s: %s (%s)", c->path, what,
                   where(c, pos, at, sizeof at));
}

static int key_is(const mf_member *mem, const char *s)
{
    return mem->key_len == strlen(s) && memcmp(mem->key, s, mem->key_len) == 0;
}

/* The members of one entry object ("tensor" or "file" `what`, named by
 * entry) into vals by key (keys[k] -> vals[k], at[k] its position); an
 * unknown key or one given twice is an error naming the allowed ones. */
static int collect_at(mf_ctx *c, int level, const mf_member *entry, const char *what,
                      const char *const *keys, size_t nkeys, const cJSON **vals, size_t *at)
{
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 256], list[160], w_at[96];
    sl_quote(q, sizeof q, entry->key, entry->key_len);
    size_t o = 0;
    for (size_t k = 0; k < nkeys; k++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s\"%s\"", k ? ", " : "", keys[k]);
    if (!cJSON_IsObject(entry->value)) {
        snprintf(msg, sizeof msg, "entry of %s %s is not an object (keys: %s)", what, q, list);
        return format_error(c, entry->at, msg);
    }
    mf_walk w;
    mf_member mem;
    int rc;
    SL_TRY(walk_begin(c, &w, level, entry->value, entry->value_at));
    while ((rc = walk_next(&w, &mem)) > 0) {
        size_t k = 0;
        while (k < nkeys && !key_is(&mem, keys[k]))
            k++;
        if (k == nkeys) {
            char kq[SL_QUOTE_MAX];
            snprintf(msg, sizeof msg, "entry of %s %s has the unknown key %s (version %d keys: %s)",
                     what, q, sl_quote(kq, sizeof kq, mem.key, mem.key_len), c->m->version, list);
            return format_error(c, mem.at, msg);
        }
        if (vals[k])
            return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE,
                           "manifest %s: entry of %s %s has \"%s\" twice (%s)", c->path, what, q,
                           keys[k], where(c, mem.at, w_at, sizeof w_at));
        vals[k] = mem.value;
        at[k] = mem.value_at;
    }
    return rc;
}

static int collect(mf_ctx *c, const mf_member *entry, const char *what, const char *const *keys,
                   size_t nkeys, const cJSON **vals, size_t *at)
{
    return collect_at(c, 2, entry, what, keys, nkeys, vals, at);
}

static int missing_key(mf_ctx *c, const mf_member *entry, const char *what, const char *key)
{
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 96];
    snprintf(msg, sizeof msg, "entry of %s %s has no \"%s\" (required in version %d)", what,
             sl_quote(q, sizeof q, entry->key, entry->key_len), key, c->m->version);
    return format_error(c, entry->at, msg);
}

/* A JSON integer in 0..2^53 (what a double holds exactly). */
static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || (double)(uint64_t)d != d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static int bad_field(mf_ctx *c, const mf_member *entry, const char *what, const char *field,
                     size_t pos, const char *expected)
{
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 160];
    snprintf(msg, sizeof msg, "\"%s\" of %s %s is not %s", field, what,
             sl_quote(q, sizeof q, entry->key, entry->key_len), expected);
    return format_error(c, pos, msg);
}

/* "BF16 [4, 8] (64 bytes)" into out. */
static void describe(char *out, size_t cap, sluice_dtype dtype, const uint64_t *shape,
                     size_t ndim, uint64_t nbytes)
{
    const char *name = sluice_dtype_name(dtype);
    int n = snprintf(out, cap, "%s [", name ? name : "?");
    for (size_t d = 0; d < ndim && n > 0 && (size_t)n < cap; d++)
        n += snprintf(out + n, cap - (size_t)n, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    if (n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, "] (%llu bytes)", (unsigned long long)nbytes);
}

#define MF_MAX_DIMS 64 /* more than any tensor library allows */
/* The smallest chunk_bytes: no manifest makes a digest per few bytes. */
#define SL_MIN_CHUNK_BYTES 4096

/* A version 2 entry's dtype, shape and nbytes, read strictly, must be
 * tensor i's in the header: the manifest covers what the caller trusts
 * besides the bytes. */
static int check_description(mf_ctx *c, const mf_member *entry, size_t i, const cJSON *dtype,
                             size_t dtype_at, const cJSON *shape, size_t shape_at,
                             const cJSON *nbytes, size_t nbytes_at)
{
    const char *dname = cJSON_GetStringValue(dtype);
    int dt = 0;
    while (dname && dt < SLUICE_DTYPE_COUNT_ && strcmp(sluice_dtype_name((sluice_dtype)dt), dname) != 0)
        dt++;
    if (!dname || dt == SLUICE_DTYPE_COUNT_)
        return bad_field(c, entry, "tensor", "dtype", dtype_at,
                         "a dtype name of the safetensors format (\"BF16\", \"F32\", ...)");
    uint64_t dims[MF_MAX_DIMS], bytes;
    size_t ndim = 0;
    if (!cJSON_IsArray(shape))
        return bad_field(c, entry, "tensor", "shape", shape_at, "an array of integers");
    for (const cJSON *d = shape->child; d; d = d->next) {
        if (ndim == MF_MAX_DIMS || json_u53(d, &dims[ndim]) < 0)
            return bad_field(c, entry, "tensor", "shape", shape_at,
                             "an array of at most 64 integers in 0..2^53");
        ndim++;
    }
    if (json_u53(nbytes, &bytes) < 0)
        return bad_field(c, entry, "tensor", "nbytes", nbytes_at, "an integer in 0..2^53");
    const struct sluice_tensor_info *t = &c->ix->tensors[i];
    int same = t->dtype == (sluice_dtype)dt && t->ndim == ndim && t->nbytes == bytes;
    for (size_t d = 0; same && d < ndim; d++)
        same = t->shape[d] == dims[d];
    if (same)
        return SLUICE_OK;
    char q[SL_QUOTE_MAX], have[256], want[256];
    describe(have, sizeof have, t->dtype, t->shape, t->ndim, t->nbytes);
    describe(want, sizeof want, (sluice_dtype)dt, dims, ndim, bytes);
    return sl_fail(c->err, SLUICE_E_MANIFEST_MISMATCH,
                   "manifest %s: tensor %s is %s in the header of %s, but %s in the manifest",
                   c->path, sl_quote(q, sizeof q, t->name, t->name_len), have,
                   c->ix->files[t->file_index].path, want);
}

/* Grows a store of digests (chunks', parts') to hold need of them. */
static int store_grow(mf_ctx *c, uint8_t (**store)[32], size_t *cap, uint64_t need)
{
    if (need <= *cap)
        return SLUICE_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    uint8_t (*grown)[32] = realloc(*store, n * sizeof *grown);
    if (!grown)
        return sl_fail(c->err, SLUICE_E_NOMEM, "manifest %s: out of memory", c->path);
    *store = grown;
    *cap = n;
    return SLUICE_OK;
}

/* Tensor i's chunk list: chunk_bytes (4096..2^53) and one digest per
 * chunk_bytes of its nbytes, the last chunk shorter. */
static int add_chunks(mf_ctx *c, const mf_member *entry, size_t i, const cJSON *bytes_v,
                      size_t bytes_at, const cJSON *list, size_t list_at)
{
    uint64_t bytes;
    if (json_u53(bytes_v, &bytes) < 0 || bytes < SL_MIN_CHUNK_BYTES)
        return bad_field(c, entry, "tensor", "chunk_bytes", bytes_at,
                         "an integer in 4096..2^53");
    if (!cJSON_IsArray(list))
        return bad_field(c, entry, "tensor", "chunks", list_at, "an array of digests");
    uint64_t nbytes = c->ix->tensors[i].nbytes, want = (nbytes + bytes - 1) / bytes;
    uint64_t have = 0;
    for (const cJSON *d = list->child; d; d = d->next)
        have++;
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 200], why[128];
    sl_quote(q, sizeof q, entry->key, entry->key_len);
    if (have != want) {
        snprintf(msg, sizeof msg, "tensor %s lists %llu chunk digests; its %llu bytes in chunks "
                 "of %llu make %llu", q, (unsigned long long)have, (unsigned long long)nbytes,
                 (unsigned long long)bytes, (unsigned long long)want);
        return format_error(c, list_at, msg);
    }
    sl_manifest *m = c->m;
    SL_TRY(store_grow(c, &m->chunk_store, &m->stored_cap, m->nstored + have));
    uint64_t k = 0;
    for (const cJSON *d = list->child; d; d = d->next, k++)
        if (parse_digest(d, m->chunk_store[m->nstored + k], why, sizeof why) < 0) {
            char at[96];
            return sl_fail(c->err, SLUICE_E_MANIFEST_DIGEST,
                           "manifest %s: digest of chunk %llu of tensor %s (%s) %s", c->path,
                           (unsigned long long)k, q, where(c, list_at, at, sizeof at), why);
        }
    m->chunks[i].bytes = bytes;
    m->chunks[i].count = (uint32_t)have;
    m->chunk_at[i] = m->nstored;
    m->nstored += have;
    return SLUICE_OK;
}

/* The most world sizes one tensor's "parts" may list. */
#define MF_PARTS_MAX 8

/* Part digests of one tensor (version 2 "parts"): for each world size
 * n[k], n[k] digests, the first at part_store[at[k]]. */
typedef struct mf_parts {
    uint32_t dim, count;
    uint64_t n[MF_PARTS_MAX];
    size_t at[MF_PARTS_MAX];
} mf_parts;

/* A world size as a key: a decimal integer in 2..65536, no sign, no
 * leading zero. */
static int world_key(const mf_member *mem, uint64_t *n)
{
    if (mem->key_len == 0 || mem->key_len > 5 || mem->key[0] == '0')
        return -1;
    uint64_t v = 0;
    for (size_t k = 0; k < mem->key_len; k++) {
        if (mem->key[k] < '0' || mem->key[k] > '9')
            return -1;
        v = v * 10 + (uint64_t)(mem->key[k] - '0');
    }
    if (v < 2 || v > 65536)
        return -1;
    *n = v;
    return 0;
}

/* One world size's list of part digests, into the store. */
static int add_world(mf_ctx *c, const mf_member *entry, size_t i, mf_parts *p, const mf_member *w)
{
    const struct sluice_tensor_info *t = &c->ix->tensors[i];
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 240], why[128];
    sl_quote(q, sizeof q, entry->key, entry->key_len);
    uint64_t n;
    if (world_key(w, &n) < 0) {
        snprintf(msg, sizeof msg, "\"digests\" of the parts of tensor %s has a key that is not "
                 "a world size (a decimal integer in 2..65536)", q);
        return format_error(c, w->at, msg);
    }
    for (uint32_t k = 0; k < p->count; k++)
        if (p->n[k] == n) {
            char at[96];
            return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE, "manifest %s: the parts of "
                           "tensor %s list world %llu twice (%s)", c->path, q,
                           (unsigned long long)n, where(c, w->at, at, sizeof at));
        }
    if (p->count == MF_PARTS_MAX) {
        snprintf(msg, sizeof msg, "the parts of tensor %s list more than %d world sizes", q,
                 MF_PARTS_MAX);
        return format_error(c, w->at, msg);
    }
    if (t->shape[p->dim] % n) {
        snprintf(msg, sizeof msg, "the parts of tensor %s: dim %u of size %llu does not split "
                 "into %llu equal parts", q, p->dim, (unsigned long long)t->shape[p->dim],
                 (unsigned long long)n);
        return format_error(c, w->at, msg);
    }
    uint64_t have = 0;
    if (cJSON_IsArray(w->value))
        for (const cJSON *d = w->value->child; d; d = d->next)
            have++;
    if (!cJSON_IsArray(w->value) || have != n) {
        snprintf(msg, sizeof msg, "the parts of tensor %s for world %llu are not an array of "
                 "%llu digests", q, (unsigned long long)n, (unsigned long long)n);
        return format_error(c, w->value_at, msg);
    }
    sl_manifest *m = c->m;
    SL_TRY(store_grow(c, &m->part_store, &m->parts_cap, m->nparts_stored + n));
    uint64_t k = 0;
    for (const cJSON *d = w->value->child; d; d = d->next, k++)
        if (parse_digest(d, m->part_store[m->nparts_stored + k], why, sizeof why) < 0) {
            char at[96];
            return sl_fail(c->err, SLUICE_E_MANIFEST_DIGEST,
                           "manifest %s: digest of part %llu of %llu of tensor %s (%s) %s",
                           c->path, (unsigned long long)k, (unsigned long long)n, q,
                           where(c, w->value_at, at, sizeof at), why);
        }
    p->n[p->count] = n;
    p->at[p->count++] = m->nparts_stored;
    m->nparts_stored += n;
    return SLUICE_OK;
}

/* Tensor i's "parts": {"dim": D, "digests": {"N": [N digests], ...}},
 * D a dim of the tensor, each N a world size that divides shape[D]. */
static int add_parts(mf_ctx *c, const mf_member *entry, size_t i, const cJSON *v, size_t v_at)
{
    static const char *const keys[] = {"dim", "digests"};
    const cJSON *vals[2] = {0};
    size_t at[2] = {0};
    mf_member pe = *entry;
    pe.value = v;
    pe.value_at = v_at;
    SL_TRY(collect_at(c, 3, &pe, "the parts of tensor", keys, 2, vals, at));
    for (int k = 0; k < 2; k++)
        if (!vals[k])
            return missing_key(c, &pe, "the parts of tensor", keys[k]);
    const struct sluice_tensor_info *t = &c->ix->tensors[i];
    uint64_t dim;
    if (json_u53(vals[0], &dim) < 0 || dim >= t->ndim)
        return bad_field(c, &pe, "the parts of tensor", "dim", at[0], "a dim of the tensor");
    if (!cJSON_IsObject(vals[1]) || !vals[1]->child)
        return bad_field(c, &pe, "the parts of tensor", "digests", at[1],
                         "an object of world sizes to digests");
    mf_parts *p = calloc(1, sizeof *p);
    if (!p)
        return sl_fail(c->err, SLUICE_E_NOMEM, "manifest %s: out of memory", c->path);
    c->m->parts[i] = p;
    p->dim = (uint32_t)dim;
    mf_walk w;
    mf_member mem;
    int rc;
    SL_TRY(walk_begin(c, &w, 4, vals[1], at[1]));
    while ((rc = walk_next(&w, &mem)) > 0)
        SL_TRY(add_world(c, entry, i, p, &mem));
    return rc;
}

/* Structured tensor entry: version 1 {"sha256": "..."}; version 2
 * {"digest": "...", "dtype": "BF16", "shape": [4, 8], "nbytes": 64}. */
static int structured_tensor(mf_ctx *c, const mf_member *entry)
{
    static const char *const v1[] = {"sha256"};
    static const char *const v2[] = {"digest", "dtype", "shape", "nbytes", "chunk_bytes", "chunks",
                                     "parts"};
    enum { T_DIGEST, T_DTYPE, T_SHAPE, T_NBYTES, T_REQUIRED, T_CHUNK_BYTES = T_REQUIRED, T_CHUNKS,
           T_PARTS, T_COUNT };
    const cJSON *v[T_COUNT] = {0};
    size_t at[T_COUNT] = {0};
    if (c->m->version == 1)
        SL_TRY(collect(c, entry, "tensor", v1, 1, v, at));
    else
        SL_TRY(collect(c, entry, "tensor", v2, T_COUNT, v, at));
    size_t nkeys = c->m->version == 1 ? 1 : T_REQUIRED;
    const char *const *names = c->m->version == 1 ? v1 : v2;
    for (size_t k = 0; k < nkeys; k++)
        if (!v[k])
            return missing_key(c, entry, "tensor", names[k]);
    SL_TRY(add_tensor(c, entry, v[T_DIGEST]));
    if (c->m->version == 1)
        return SLUICE_OK;
    size_t i = sl_index_find(c->ix, entry->key, entry->key_len); /* found by add_tensor */
    SL_TRY(check_description(c, entry, i, v[T_DTYPE], at[T_DTYPE], v[T_SHAPE], at[T_SHAPE],
                             v[T_NBYTES], at[T_NBYTES]));
    if (!v[T_CHUNK_BYTES] != !v[T_CHUNKS])
        return missing_key(c, entry, "tensor", v[T_CHUNKS] ? "chunk_bytes" : "chunks");
    if (v[T_CHUNKS])
        SL_TRY(add_chunks(c, entry, i, v[T_CHUNK_BYTES], at[T_CHUNK_BYTES], v[T_CHUNKS],
                          at[T_CHUNKS]));
    return v[T_PARTS] ? add_parts(c, entry, i, v[T_PARTS], at[T_PARTS]) : SLUICE_OK;
}

/* The file of the model whose base name is the entry's key, or SIZE_MAX. */
static size_t find_file(const mf_ctx *c, const mf_member *entry)
{
    for (size_t i = 0; i < c->ix->nfiles; i++) {
        const char *name = c->ix->files[i].name;
        if (name && strlen(name) == entry->key_len && memcmp(name, entry->key, entry->key_len) == 0)
            return i;
    }
    return SIZE_MAX;
}

/* Structured file entry: version 1 {"sha256": "...", "size": N} (size
 * optional); version 2 {"digest": "...", "size": N, "header": "..."}, all
 * three required, size and header checked against the file at open. */
static int structured_file(mf_ctx *c, const mf_member *entry)
{
    static const char *const v1[] = {"sha256", "size"};
    static const char *const v2[] = {"digest", "size", "header"};
    enum { F_DIGEST, F_SIZE, F_HEADER, F_COUNT };
    const cJSON *v[F_COUNT] = {0};
    size_t at[F_COUNT] = {0};
    char q[SL_QUOTE_MAX], why[128], w_at[96];
    sl_quote(q, sizeof q, entry->key, entry->key_len);
    size_t nkeys = c->m->version == 1 ? 2 : F_COUNT;
    const char *const *names = c->m->version == 1 ? v1 : v2;
    SL_TRY(collect(c, entry, "file", names, nkeys, v, at));
    for (size_t k = 0; k < nkeys; k++)
        if (!v[k] && !(c->m->version == 1 && k == F_SIZE))
            return missing_key(c, entry, "file", names[k]);
    uint8_t d[32], header[32];
    if (parse_digest(v[F_DIGEST], d, why, sizeof why) < 0)
        return digest_error(c, "file", entry, why);
    uint64_t bytes = SLUICE_SIZE_UNKNOWN;
    if (v[F_SIZE] && json_u53(v[F_SIZE], &bytes) < 0)
        return bad_field(c, entry, "file", "size", at[F_SIZE], "an integer in 0..2^53");
    if (v[F_HEADER] && parse_digest(v[F_HEADER], header, why, sizeof why) < 0)
        return digest_error(c, "the header of file", entry, why);
    size_t fi = find_file(c, entry);
    if (fi == SIZE_MAX)
        return sl_fail(c->err, SLUICE_E_MANIFEST_UNKNOWN,
                       "manifest %s: file %s (%s) is not a file of the model", c->path, q,
                       where(c, entry->at, w_at, sizeof w_at));
    if (c->m->file_has[fi])
        return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE, "manifest %s: file %s listed twice (again at %s)",
                       c->path, q, where(c, entry->at, w_at, sizeof w_at));
    const sl_file *f = &c->ix->files[fi];
    if (c->m->version == 2 && bytes != f->size)
        return sl_fail(c->err, SLUICE_E_MANIFEST_MISMATCH,
                       "manifest %s: file %s is %llu bytes, the manifest says %llu", c->path,
                       f->path, (unsigned long long)f->size, (unsigned long long)bytes);
    if (v[F_HEADER]) {
        const uint8_t *have = sl_index_header_digest(f, c->m->algorithm);
        if (!have)
            return sl_fail(c->err, SLUICE_E_NOMEM, "manifest %s: no header digest of %s", c->path,
                           f->path);
        if (memcmp(have, header, 32) != 0) {
            char hx[65], wx[65];
            return sl_fail(c->err, SLUICE_E_MANIFEST_MISMATCH,
                           "manifest %s: the header of %s (its first %llu bytes) has the %s digest "
                           "%s, the manifest says %s: the header changed since the manifest was "
                           "written (a dtype, shape, offset or __metadata__ entry)",
                           c->path, f->path, (unsigned long long)f->data_start,
                           sluice_algorithm_name(c->m->algorithm), sl_hex_digest(hx, have),
                           sl_hex_digest(wx, header));
        }
    }
    c->m->file_has[fi] = 1;
    memcpy(c->m->file_digest[fi], d, 32);
    c->m->file_size[fi] = bytes;
    return SLUICE_OK;
}

/* Every member of obj (at pos) through fn. */
static int each_entry(mf_ctx *c, const cJSON *obj, size_t pos, const char *what,
                      int (*fn)(mf_ctx *, const mf_member *))
{
    if (!cJSON_IsObject(obj)) {
        char msg[64];
        snprintf(msg, sizeof msg, "\"%s\" is not an object", what);
        return format_error(c, pos, msg);
    }
    mf_walk w;
    mf_member mem;
    int rc;
    SL_TRY(walk_begin(c, &w, 1, obj, pos));
    while ((rc = walk_next(&w, &mem)) > 0)
        SL_TRY(fn(c, &mem));
    return rc;
}

static int flat_tensor(mf_ctx *c, const mf_member *mem)
{
    return add_tensor(c, mem, mem->value);
}

/* The flat form names tensors at the top; the structured form has a
 * "format" key whose value is not a digest. */
static int is_structured(const cJSON *root)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    uint8_t d[32];
    char why[128];
    return f && parse_digest(f, d, why, sizeof why) < 0;
}

static int structured(mf_ctx *c, const cJSON *root, size_t pos)
{
    static const char *const keys[] = {"format", "version", "algorithm", "tensors", "files"};
    enum { K_FORMAT, K_VERSION, K_ALGORITHM, K_TENSORS, K_FILES, K_COUNT };
    const cJSON *v[K_COUNT] = {0};
    size_t at[K_COUNT] = {0};
    char msg[SL_QUOTE_MAX + 96], q[SL_QUOTE_MAX], w_at[96];
    mf_walk w;
    mf_member mem;
    int rc;
    SL_TRY(walk_begin(c, &w, 0, root, pos));
    while ((rc = walk_next(&w, &mem)) > 0) {
        int k = 0;
        while (k < K_COUNT && !key_is(&mem, keys[k]))
            k++;
        if (k == K_COUNT) {
            snprintf(msg, sizeof msg, "unknown key %s (keys: format, version, algorithm, tensors, files)",
                     sl_quote(q, sizeof q, mem.key, mem.key_len));
            return format_error(c, mem.at, msg);
        }
        if (v[k])
            return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE, "manifest %s: key \"%s\" appears twice (%s)",
                           c->path, keys[k], where(c, mem.at, w_at, sizeof w_at));
        v[k] = mem.value;
        at[k] = mem.value_at;
    }
    if (rc < 0)
        return rc;
    const char *fmt = cJSON_GetStringValue(v[K_FORMAT]);
    if (!fmt || strcmp(fmt, "sluice-manifest") != 0) {
        snprintf(msg, sizeof msg, "unknown format (expected \"format\": \"sluice-manifest\")");
        return format_error(c, at[K_FORMAT], msg);
    }
    if (!v[K_VERSION])
        return format_error(c, pos, "no \"version\" (expected 1 or 2)");
    double version = cJSON_IsNumber(v[K_VERSION]) ? v[K_VERSION]->valuedouble : 0;
    if (version != 1.0 && version != 2.0)
        return format_error(c, at[K_VERSION], "unsupported version (this library reads 1 and 2)");
    c->m->version = (int)version;
    if (!v[K_ALGORITHM])
        return format_error(c, pos, "no \"algorithm\" (expected \"sha256\" or \"blake3\")");
    const char *alg = cJSON_GetStringValue(v[K_ALGORITHM]);
    if (alg && strcmp(alg, "sha256") == 0) {
        c->m->algorithm = SLUICE_ALG_SHA256;
    } else if (alg && c->m->version == 2 && strcmp(alg, "blake3") == 0) {
        c->m->algorithm = SLUICE_ALG_BLAKE3;
        if (!sl_md_supported(SLUICE_ALG_BLAKE3))
            return sl_fail(c->err, SLUICE_E_UNSUPPORTED,
                           "manifest %s: algorithm \"blake3\": this build of the library has no "
                           "BLAKE3 (built without the sources of librust-blake3-dev)", c->path);
    } else {
        snprintf(msg, sizeof msg, "unsupported algorithm %s (version 1: \"sha256\"; version 2: "
                 "\"sha256\" or \"blake3\")",
                 alg ? sl_quote(q, sizeof q, alg, strlen(alg)) : "(not a string)");
        return format_error(c, at[K_ALGORITHM], msg);
    }
    if (v[K_TENSORS])
        SL_TRY(each_entry(c, v[K_TENSORS], at[K_TENSORS], "tensors", structured_tensor));
    if (v[K_FILES])
        SL_TRY(each_entry(c, v[K_FILES], at[K_FILES], "files", structured_file));
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- policy */

static int require_all(mf_ctx *c)
{
    const sl_manifest *m = c->m;
    /* Version 2 covers the headers through the files' entries: under
     * REQUIRE a file left out would leave its header unchecked. */
    for (size_t f = 0; m->version == 2 && f < m->nfiles; f++)
        if (!m->file_has[f])
            return sl_fail(c->err, SLUICE_E_MANIFEST_MISSING,
                           "manifest %s: file %s has no entry (version 2, policy REQUIRE: every "
                           "file's header is checked)", c->path, c->ix->files[f].path);
    size_t missing = 0;
    for (size_t i = 0; i < m->ntensors; i++)
        missing += !m->tensor_has[i];
    if (!missing)
        return SLUICE_OK;
    char list[SL_ERRMSG_MAX / 2], q[SL_QUOTE_MAX];
    size_t o = 0, shown = 0;
    list[0] = '\0';
    for (size_t i = 0; i < m->ntensors && shown < 10; i++) {
        if (m->tensor_has[i])
            continue;
        const struct sluice_tensor_info *t = &c->ix->tensors[i];
        sl_quote(q, sizeof q, t->name, t->name_len);
        size_t need = strlen(q) + 2;
        if (o + need + 8 >= sizeof list)
            break;
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", shown ? ", " : "", q);
        shown++;
    }
    return sl_fail(c->err, SLUICE_E_MANIFEST_MISSING,
                   "manifest %s: %zu of %zu tensors have no digest (policy REQUIRE): %s%s",
                   c->path, missing, m->ntensors, list, shown < missing ? ", ..." : "");
}

/* path[0, n) followed by suffix, malloc'd. */
static char *joined(const char *path, size_t n, const char *suffix)
{
    size_t size = n + strlen(suffix) + 1;
    char *p = malloc(size);
    if (p)
        snprintf(p, size, "%.*s%s", (int)n, path, suffix);
    return p;
}

/* The directory's sidecar: DIR/sluice.manifest.json, DIR being path[0, d)
 * without its trailing slashes. */
static char *directory_sidecar(const char *path, size_t d)
{
    while (d > 1 && path[d - 1] == '/')
        d--;
    if (d == 0)
        return joined("", 0, "sluice.manifest.json");
    if (d == 1 && path[0] == '/')
        return joined("/", 1, "sluice.manifest.json");
    return joined(path, d, "/sluice.manifest.json");
}

/* The sidecars of the model at model, the second (a one-file model's
 * F.manifest.json) made from one[0, one_len) when one is not NULL. */
static int sidecars_of(const sl_location *model, const char *one, size_t one_len, char *out[2])
{
    out[0] = out[1] = NULL;
    const char *model_path = model->given;
    /* A remote location's query (a presigned URL's signature) is its
     * object's alone: the sidecar is another object, named from the path. */
    size_t n = model->name_len;
    /* a location without a descriptor cannot be stat'ed: its name says
     * what it is */
    int by_name = !(sl_source_of(model)->caps & SL_SRC_DESCRIPTOR), dir = 0;
    if (!by_name) {
        struct stat st;
        dir = stat(model_path, &st) == 0 && S_ISDIR(st.st_mode);
    }
    int json = n >= 5 && !memcmp(model_path + n - 5, ".json", 5);
    int file = by_name ? n >= 12 && !memcmp(model_path + n - 12, ".safetensors", 12)
                       : !dir && !json;
    if (file)
        return (out[0] = joined(model_path, n, ".manifest.json")) ? 1 : -1;
    size_t d = n;
    if (json) /* a *.index.json: its directory */
        while (d > 0 && model_path[d - 1] != '/')
            d--;
    if (!(out[0] = directory_sidecar(model_path, d)))
        return -1;
    if (!one)
        return 1;
    /* The model is one file F: F.manifest.json is its sidecar too, looked
     * for second (what `sluice synth` writes, and the Hub's usual layout). */
    if (!(out[1] = joined(one, one_len, ".manifest.json"))) {
        free(out[0]);
        out[0] = NULL;
        return -1;
    }
    return 2;
}

int sl_manifest_sidecars(const sl_index *ix, const sl_location *model, char *out[2])
{
    if (!ix || ix->nfiles != 1)
        return sidecars_of(model, NULL, 0, out);
    const sl_file *f = &ix->files[0];
    return sidecars_of(model, f->loc->given, f->loc->name_len, out);
}

int sl_manifest_find_local(const char *model_path, const char *one_name, char **path,
                           sl_err *err)
{
    *path = NULL;
    /* F: the directory of model_path (itself, or an index.json's) and
     * one_name's base name */
    char *one = NULL;
    size_t n = strlen(model_path);
    struct stat st;
    int dir = stat(model_path, &st) == 0 && S_ISDIR(st.st_mode);
    int json = n >= 5 && !memcmp(model_path + n - 5, ".json", 5);
    if (one_name && (dir || json)) {
        const char *slash = strrchr(one_name, '/');
        const char *base = slash ? slash + 1 : one_name;
        size_t d = n;
        if (json)
            while (d > 0 && model_path[d - 1] != '/')
                d--;
        else
            while (d > 1 && model_path[d - 1] == '/')
                d--;
        size_t cap = d + strlen(base) + 2;
        if (!(one = malloc(cap)))
            return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
        snprintf(one, cap, "%.*s%s%s", (int)d, model_path,
                 d == 0 || model_path[d - 1] == '/' ? "" : "/", base);
    }
    char *cand[2];
    /* a location given to this call alone: parsed here */
    sl_location *model = sl_location_new(model_path);
    int nc = model ? sidecars_of(model, one, one ? strlen(one) : 0, cand) : -1;
    sl_location_free(model);
    free(one);
    if (nc < 0)
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    int found = -1;
    for (int k = 0; k < nc && found < 0; k++)
        if (stat(cand[k], &st) == 0 || (errno != ENOENT && errno != ENOTDIR))
            found = k;
    int rc = SLUICE_OK;
    if (found < 0) {
        char list[2 * SL_ERRMSG_MAX / 3];
        rc = sl_fail(err, SLUICE_E_MANIFEST, "manifest: no sidecar %s",
                     sl_manifest_sidecars_list(cand, nc, list, sizeof list));
    }
    for (int k = 0; k < nc; k++)
        if (k != found)
            free(cand[k]);
    if (found >= 0)
        *path = cand[found];
    return rc;
}

const char *sl_manifest_sidecars_list(char *const cand[], int n, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s%s", n > 0 ? cand[0] : "", n > 1 ? " nor " : "", n > 1 ? cand[1] : "");
    return buf;
}

static sl_manifest *manifest_new(const sl_index *ix)
{
    sl_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->ntensors = ix->ntensors;
    m->nfiles = ix->nfiles;
    m->tensor_digest = malloc((ix->ntensors ? ix->ntensors : 1) * sizeof *m->tensor_digest);
    m->tensor_has = calloc(ix->ntensors ? ix->ntensors : 1, 1);
    m->file_digest = malloc((ix->nfiles ? ix->nfiles : 1) * sizeof *m->file_digest);
    m->file_size = malloc((ix->nfiles ? ix->nfiles : 1) * sizeof *m->file_size);
    m->file_has = calloc(ix->nfiles ? ix->nfiles : 1, 1);
    m->chunks = calloc(ix->ntensors ? ix->ntensors : 1, sizeof *m->chunks);
    m->chunk_at = calloc(ix->ntensors ? ix->ntensors : 1, sizeof *m->chunk_at);
    m->parts = calloc(ix->ntensors ? ix->ntensors : 1, sizeof *m->parts);
    if (!m->tensor_digest || !m->tensor_has || !m->file_digest || !m->file_size || !m->file_has ||
        !m->chunks || !m->chunk_at || !m->parts) {
        sl_manifest_free(m);
        return NULL;
    }
    return m;
}

/* A local manifest: manifest_path, else the first sidecar that is there
 * (or cannot be told absent). *path NULL: none, and none needed. */
static int find_local(const sl_index *ix, const sl_trust_plan *p, const sl_location *model,
                      char **path, sl_err *err)
{
    *path = NULL;
    if (p->from == SL_MF_PATH)
        return (*path = strdup(p->manifest_path)) ? SLUICE_OK
                                                  : sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    char *cand[2];
    int nc = sl_manifest_sidecars(ix, model, cand);
    if (nc < 0)
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    int found = -1;
    for (int k = 0; k < nc && found < 0; k++) {
        struct stat st;
        if (stat(cand[k], &st) == 0 || (errno != ENOENT && errno != ENOTDIR))
            found = k;
    }
    int rc = SLUICE_OK;
    if (found < 0 && p->require) {
        char list[2 * SL_ERRMSG_MAX / 3];
        rc = sl_fail(err, SLUICE_E_MANIFEST,
                     "manifest: policy REQUIRE and no manifest: no sidecar %s "
                     "(set manifest_path or write one with 'sluice manifest')",
                     sl_manifest_sidecars_list(cand, nc, list, sizeof list));
    }
    for (int k = 0; k < nc; k++)
        if (k != found)
            free(cand[k]);
    if (found >= 0)
        *path = cand[found];
    return rc; /* DEFAULT and IF_PRESENT without one: nothing to check */
}

/* The remote manifest's text into *text (NULL when there is none):
 * manifest_path when the plan reads it (a 404 is SLUICE_E_MANIFEST), else
 * the first sidecar at the remote model's place that the server has (a
 * 404 is absence, and the next is asked). *loc (malloc'd) gets the
 * location read, or when none was there the sidecars looked for ("A" or
 * "A nor B", for the message). */
static int fetch_remote(const sl_index *ix, const sl_trust_plan *p, const sl_location *model,
                        char **loc, char **text, size_t *len, sl_err *err)
{
    if (p->from == SL_MF_PATH_REMOTE) {
        if (!(*loc = strdup(p->manifest_path)))
            return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
        return sl_remote_get_anchor(ix->remote, *loc, SLUICE_MAX_MANIFEST_BYTES, text, len,
                                    SLUICE_E_MANIFEST, err);
    }
    char *cand[2], list[2 * SL_ERRMSG_MAX / 3];
    int nc = sl_manifest_sidecars(ix, model, cand), rc = SLUICE_OK, k;
    if (nc < 0)
        return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    for (k = 0; k < nc && rc == SLUICE_OK && !*text; k++)
        rc = sl_remote_get_anchor(ix->remote, cand[k], SLUICE_MAX_MANIFEST_BYTES, text, len, 0,
                                  err);
    if (rc < 0 || *text) {
        *loc = cand[k - 1];
        cand[k - 1] = NULL;
    } else {
        /* for a message: without credentials */
        sl_manifest_sidecars_list(cand, nc, list, sizeof list);
        for (k = 0; k < nc; k++)
            sl_remote_scrub(list, sizeof list, cand[k]);
        if (!(*loc = strdup(list)))
            rc = sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    }
    for (k = 0; k < nc; k++)
        free(cand[k]);
    return rc;
}

/* A Hub repository that publishes no manifest (none of the sidecars at
 * looked): the Hub's LFS SHA-256 of its files stand in (hf.h), which
 * cover whole files, not tensors. sluice_open derives tensor digests from
 * them when they cover every file (api/hub.c); when a file has none (no
 * LFS object), nothing is derived and policy REQUIRE cannot be met. */
static int hub_manifest(const sl_hf_repo *hub, const sl_index *ix, const sl_trust_plan *p,
                        const char *looked, char **text, size_t *len, char **named, sl_err *err)
{
    int all = 0;
    SL_TRY(sl_hf_manifest(hub, ix, text, len, named, &all, err));
    if (*text && p->require && !all) {
        free(*text);
        free(*named);
        *text = *named = NULL;
        return sl_fail(err, SLUICE_E_MANIFEST, "manifest: policy REQUIRE, and %s publishes no "
                       "manifest (no %s) and the Hub lists no LFS SHA-256 for some of its files "
                       "(the rest cover whole files, not tensors: check them with 'sluice verify "
                       "--files', or publish a manifest written by 'sluice manifest')",
                       sl_hf_pinned(hub), looked);
    }
    return SLUICE_OK;
}

/* The manifest of a model whose manifest is remote: manifest_path when
 * it is a URL, else a sidecar at the remote model's place, else (an
 * hf:// model) the Hub's stand-in. */
static int load_remote(const sl_index *ix, const sl_trust_plan *p, const sl_hf_repo *hub,
                       const sl_location *model, sl_manifest **out, int *hub_files_only,
                       sl_err *err)
{
    char *loc = NULL, *text = NULL;
    size_t len = 0;
    int rc = fetch_remote(ix, p, model, &loc, &text, &len, err);
    char *hub_named = NULL;
    if (rc == SLUICE_OK && !text && hub && p->hub_digest == SL_HUB_LFS)
        rc = hub_manifest(hub, ix, p, loc, &text, &len, &hub_named, err);
    if (rc == SLUICE_OK && !text) {
        if (p->require)
            rc = sl_fail(err, SLUICE_E_MANIFEST, "manifest: policy REQUIRE and no manifest: no "
                         "sidecar %s (set manifest_path or write one with 'sluice manifest')", loc);
    } else if (rc < 0) {
        if (rc != SLUICE_E_NOMEM && rc != SLUICE_E_UNSUPPORTED)
            err->code = rc = SLUICE_E_MANIFEST;
    } else {
        /* the manifest's path is shown (sluice_manifest_path, messages):
         * the location without credentials or query */
        char shown[1100];
        char *named = hub_named ? hub_named : strdup(sl_location_shown_of(loc, shown, sizeof shown));
        if (!named) {
            free(text);
            rc = sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
        } else {
            /* the Hub's digests are read as the plan says (trust_plan.c:
             * IF_PRESENT, failing closed when a signature is asked) */
            sl_trust_plan hub_p = *p;
            if (hub_named)
                sl_trust_plan_read(p, SL_READ_HUB_LFS, &hub_p);
            /* a signature lies beside the manifest read */
            hub_p.manifest_at = loc;
            rc = sl_manifest_from_text(ix, &hub_p, named, text, len, out, err);
            if (hub_files_only)
                *hub_files_only = hub_named != NULL;
        }
    }
    if (rc < 0) {
        /* messages name locations without their credentials */
        if (loc)
            sl_remote_scrub(err->msg, sizeof err->msg, loc);
        sl_location_scrub(err->msg, p->manifest_loc);
        sl_location_scrub(err->msg, model);
    }
    free(loc);
    return rc;
}

int sl_manifest_load(const sl_index *ix, const sl_trust_plan *plan, const sl_hf_repo *hub,
                     const sl_location *model, sl_manifest **out, int *hub_files_only, sl_err *err)
{
    *out = NULL;
    if (hub_files_only)
        *hub_files_only = 0;
    if (plan->from == SL_MF_NONE)
        return SLUICE_OK; /* OFF reads nothing, not even an explicit manifest_path */
    if (plan->from == SL_MF_PATH_REMOTE || plan->from == SL_MF_SIDECAR_REMOTE)
        return load_remote(ix, plan, hub, model, out, hub_files_only, err);
    char *path = NULL;
    SL_TRY(find_local(ix, plan, model, &path, err));
    if (!path)
        return SLUICE_OK;
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(path, &text, &len, err);
    if (rc < 0) {
        free(path);
        return rc;
    }
    return sl_manifest_from_text(ix, plan, path, text, len, out, err);
}

/* The sluice signature of the manifest read from path: M.sig beside it,
 * fetched beside a remote one (trust_plan.c). */
static int ed25519_check(const sl_index *ix, const sl_trust_plan *plan, const char *path,
                         const char *text, size_t len, sl_err *err)
{
    if (!plan->manifest_at) /* set for a remote manifest only */
        return sl_signature_check(path, text, len, plan->keys, plan->nkeys, err);
    char *sig = sl_trust_sig_beside(plan->manifest_at, 0, ".sig"), *sig_text = NULL, shown[1100];
    size_t sig_len = 0;
    if (!sig)
        return sl_fail(err, SLUICE_E_NOMEM, "manifest %s: out of memory", path);
    int rc = sl_trust_sig_fetch(ix->remote, sig, SL_SIG_MAX_BYTES, &sig_text, &sig_len, err);
    if (rc == SLUICE_OK)
        rc = sl_signature_check_text(path, sl_location_shown_of(sig, shown, sizeof shown),
                                     sig_text, sig_len, text, len, plan->keys, plan->nkeys, err);
    free(sig_text);
    free(sig);
    return rc;
}

int sl_manifest_from_text(const sl_index *ix, const sl_trust_plan *plan, char *path,
                          char *text, size_t len, sl_manifest **out, sl_err *err)
{
    *out = NULL;
    cJSON *root = NULL;
    mf_ctx c = {.ix = ix, .path = path, .err = err};
    int rc = SLUICE_OK;
    uint8_t (*signed_digest)[32] = NULL, *signed_has = NULL;
    /* Signed manifests: the very bytes parsed below, checked before
     * parsing, by the format the plan names */
    unsigned format = sl_trust_plan_format(plan, ix, path);
    if (format && plan->fail_closed) {
        rc = sl_trust_plan_refuse(plan, path, err);
        goto done;
    }
    if (format == SL_SIG_OPENSSF) {
        signed_digest = malloc((ix->nfiles + 1) * sizeof *signed_digest);
        signed_has = calloc(ix->nfiles + 1, 1);
        if (!signed_digest || !signed_has) {
            rc = sl_fail(err, SLUICE_E_NOMEM, "manifest %s: out of memory", path);
            goto done;
        }
        if ((rc = sl_ms_check_open(ix, plan, path, text, len, signed_digest, signed_has, err)) < 0)
            goto done;
    } else if (format == SL_SIG_ED25519 && (rc = ed25519_check(ix, plan, path, text, len, err)) < 0)
        goto done;
    c.text = text;
    c.len = len;
    /* A raw NUL would end cJSON's reading early and hide what follows. */
    const char *nul = memchr(text, '\0', len);
    const char *end = NULL;
    if (!nul)
        root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (!root) {
        char at[96];
        size_t pos = nul ? (size_t)(nul - text) : end ? (size_t)(end - text) : 0;
        rc = sl_fail(err, SLUICE_E_MANIFEST, "manifest %s: not JSON%s at %s", path,
                     nul ? " (a NUL byte)" : len == 0 ? " (empty file)" : "",
                     where(&c, pos, at, sizeof at));
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        rc = format_error(&c, 0, "the top-level value is not an object");
        goto done;
    }
    if (!(c.m = manifest_new(ix))) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "manifest %s: out of memory", path);
        goto done;
    }
    size_t start = skip_ws(text, len, 0);
    if (len - start >= 3 && memcmp(text + start, "\xEF\xBB\xBF", 3) == 0)
        start += 3;
    size_t nul_at = value_with_nul(text, len);
    if (nul_at < len) {
        rc = format_error(&c, nul_at, "a string value holds an escaped NUL (\\u0000), which "
                          "would cut it short; only names may hold one");
        goto done;
    }
    if (is_structured(root))
        rc = structured(&c, root, start);
    else
        rc = each_entry(&c, root, start, "manifest", flat_tensor);
    if (rc < 0)
        goto done;
    /* The store grew while it was read: its pointers are taken now. */
    for (size_t i = 0; i < c.m->ntensors; i++)
        if (c.m->chunks[i].count)
            c.m->chunks[i].digest = (const uint8_t (*)[32])c.m->chunk_store[c.m->chunk_at[i]];
    c.m->policy = plan->verify == SLUICE_VERIFY_IF_PRESENT ? SLUICE_VERIFY_IF_PRESENT
                                                           : SLUICE_VERIFY_REQUIRE;
    if (c.m->policy == SLUICE_VERIFY_REQUIRE && (rc = require_all(&c)) < 0)
        goto done;
    /* An OpenSSF model signature's whole-file SHA-256: the manifest's own
     * must be the same, and where it has none (a flat manifest) the
     * signed one is the file's digest (sluice verify --files). */
    for (size_t f = 0; signed_has && c.m->algorithm == SLUICE_ALG_SHA256 && f < ix->nfiles; f++) {
        if (!signed_has[f])
            continue;
        if (c.m->file_has[f] && memcmp(c.m->file_digest[f], signed_digest[f], 32) != 0) {
            char hx[65], wx[65];
            rc = sl_fail(err, SLUICE_E_SIGNATURE, "manifest %s: file %s: the manifest's SHA-256 "
                         "%s is not the one the OpenSSF model signature lists, %s (the model "
                         "was re-signed without 'sluice manifest', or the manifest is another "
                         "model's)", path, ix->files[f].path, sl_hex_digest(hx, c.m->file_digest[f]),
                         sl_hex_digest(wx, signed_digest[f]));
            goto done;
        }
        if (!c.m->file_has[f]) {
            c.m->file_has[f] = 1;
            memcpy(c.m->file_digest[f], signed_digest[f], 32);
            c.m->file_size[f] = SLUICE_SIZE_UNKNOWN;
        }
    }
    c.m->path = path;
    path = NULL;
    *out = c.m;
    c.m = NULL;
done:
    free(signed_digest);
    free(signed_has);
    for (int i = 0; i < 5; i++)
        free(c.kbuf[i]);
    sl_manifest_free(c.m);
    cJSON_Delete(root);
    free(text);
    free(path);
    return rc;
}

void sl_manifest_free(sl_manifest *m)
{
    if (!m)
        return;
    free(m->path);
    free(m->tensor_digest);
    free(m->tensor_has);
    free(m->file_digest);
    free(m->file_size);
    free(m->file_has);
    free(m->chunks);
    free(m->chunk_at);
    free(m->chunk_store);
    for (size_t i = 0; m->parts && i < m->ntensors; i++)
        free(m->parts[i]);
    free(m->parts);
    free(m->part_store);
    free(m);
}

const uint8_t *sl_manifest_part_digest(const sl_manifest *m, size_t i, uint32_t dim, uint64_t n,
                                       uint64_t rank)
{
    const mf_parts *p = m && i < m->ntensors ? m->parts[i] : NULL;
    if (!p || p->dim != dim || rank >= n)
        return NULL;
    for (uint32_t k = 0; k < p->count; k++)
        if (p->n[k] == n)
            return m->part_store[p->at[k] + rank];
    return NULL;
}

const sl_chunk_digests *sl_manifest_chunks(const sl_manifest *m)
{
    return m ? m->chunks : NULL;
}

const uint8_t *sl_manifest_tensor_digest(const sl_manifest *m, size_t i)
{
    if (!m || i >= m->ntensors || !m->tensor_has[i])
        return NULL;
    return m->tensor_digest[i];
}

const uint8_t *sl_manifest_file_digest(const sl_manifest *m, size_t i, uint64_t *size)
{
    if (!m || i >= m->nfiles || !m->file_has[i])
        return NULL;
    if (size)
        *size = m->file_size[i];
    return m->file_digest[i];
}

sluice_verify_policy sl_manifest_policy(const sl_manifest *m)
{
    return m ? m->policy : SLUICE_VERIFY_OFF;
}

const char *sl_manifest_path(const sl_manifest *m)
{
    return m ? m->path : NULL;
}

sluice_algorithm sl_manifest_algorithm(const sl_manifest *m)
{
    return m ? m->algorithm : SLUICE_ALG_SHA256;
}

int sl_manifest_version(const sl_manifest *m)
{
    return m ? m->version : 0;
}
