/* manifest.c: reads the SHA-256 manifest of a model and resolves the
 * verification policy (see "Manifests" in sluice.h).
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
#include "manifest.h"


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
    char *path;
    size_t ntensors;
    uint8_t (*tensor_digest)[32];
    uint8_t *tensor_has;
    size_t nfiles;
    uint8_t (*file_digest)[32];
    uint64_t *file_size;
    uint8_t *file_has;
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
    char *kbuf[3];      /* decoded keys, one buffer per nesting level */
    size_t kcap[3];
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

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static int read_u16(const char *s, const char *end, unsigned *out)
{
    if (end - s < 4)
        return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(s[i]);
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
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
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

/* Structured tensor entry: {"sha256": "..."}. */
static int structured_tensor(mf_ctx *c, const mf_member *entry)
{
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 96];
    sl_quote(q, sizeof q, entry->key, entry->key_len);
    if (!cJSON_IsObject(entry->value)) {
        snprintf(msg, sizeof msg, "entry of tensor %s is not an object {\"sha256\": ...}", q);
        return format_error(c, entry->at, msg);
    }
    mf_walk w;
    mf_member mem;
    const cJSON *digest = NULL;
    int rc;
    SL_TRY(walk_begin(c, &w, 2, entry->value, entry->value_at));
    while ((rc = walk_next(&w, &mem)) > 0) {
        if (!key_is(&mem, "sha256")) {
            snprintf(msg, sizeof msg, "entry of tensor %s has an unknown key (only \"sha256\")", q);
            return format_error(c, mem.at, msg);
        }
        if (digest) {
            snprintf(msg, sizeof msg, "entry of tensor %s has \"sha256\" twice", q);
            return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE, "manifest %s: %s", c->path, msg);
        }
        digest = mem.value;
    }
    if (rc < 0)
        return rc;
    if (!digest) {
        snprintf(msg, sizeof msg, "entry of tensor %s has no \"sha256\"", q);
        return format_error(c, entry->at, msg);
    }
    return add_tensor(c, entry, digest);
}

/* Structured file entry: {"sha256": "...", "size": N}, size optional. */
static int structured_file(mf_ctx *c, const mf_member *entry)
{
    char q[SL_QUOTE_MAX], msg[SL_QUOTE_MAX + 96], why[128], at[96];
    sl_quote(q, sizeof q, entry->key, entry->key_len);
    size_t fi = SIZE_MAX;
    for (size_t i = 0; i < c->ix->nfiles; i++) {
        const char *name = c->ix->files[i].name;
        if (name && strlen(name) == entry->key_len && memcmp(name, entry->key, entry->key_len) == 0) {
            fi = i;
            break;
        }
    }
    if (!cJSON_IsObject(entry->value)) {
        snprintf(msg, sizeof msg, "entry of file %s is not an object {\"sha256\": ..., \"size\": N}", q);
        return format_error(c, entry->at, msg);
    }
    mf_walk w;
    mf_member mem;
    const cJSON *digest = NULL, *size = NULL;
    int rc;
    SL_TRY(walk_begin(c, &w, 2, entry->value, entry->value_at));
    while ((rc = walk_next(&w, &mem)) > 0) {
        const cJSON **slot = key_is(&mem, "sha256") ? &digest : key_is(&mem, "size") ? &size : NULL;
        if (!slot) {
            snprintf(msg, sizeof msg, "entry of file %s has an unknown key (only \"sha256\", \"size\")", q);
            return format_error(c, mem.at, msg);
        }
        if (*slot)
            return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE, "manifest %s: entry of file %s has \"%s\" twice (%s)",
                           c->path, q, mem.key, where(c, mem.at, at, sizeof at));
        *slot = mem.value;
    }
    if (rc < 0)
        return rc;
    if (!digest) {
        snprintf(msg, sizeof msg, "entry of file %s has no \"sha256\"", q);
        return format_error(c, entry->at, msg);
    }
    uint8_t d[32];
    if (parse_digest(digest, d, why, sizeof why) < 0)
        return digest_error(c, "file", entry, why);
    uint64_t bytes = SLUICE_SIZE_UNKNOWN;
    if (size) {
        double v = size->valuedouble;
        if (!cJSON_IsNumber(size) || !(v >= 0 && v <= 9007199254740992.0) || (double)(uint64_t)v != v) {
            snprintf(msg, sizeof msg, "size of file %s is not an integer in 0..2^53", q);
            return format_error(c, entry->at, msg);
        }
        bytes = (uint64_t)v;
    }
    if (fi == SIZE_MAX)
        return sl_fail(c->err, SLUICE_E_MANIFEST_UNKNOWN,
                       "manifest %s: file %s (%s) is not a file of the model", c->path, q,
                       where(c, entry->at, at, sizeof at));
    if (c->m->file_has[fi])
        return sl_fail(c->err, SLUICE_E_MANIFEST_DUPLICATE, "manifest %s: file %s listed twice (again at %s)",
                       c->path, q, where(c, entry->at, at, sizeof at));
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
        return format_error(c, pos, "no \"version\" (expected 1)");
    if (!cJSON_IsNumber(v[K_VERSION]) || v[K_VERSION]->valuedouble != 1.0)
        return format_error(c, at[K_VERSION], "unsupported version (this library reads version 1)");
    if (!v[K_ALGORITHM])
        return format_error(c, pos, "no \"algorithm\" (expected \"sha256\")");
    const char *alg = cJSON_GetStringValue(v[K_ALGORITHM]);
    if (!alg || strcmp(alg, "sha256") != 0) {
        snprintf(msg, sizeof msg, "unsupported algorithm %s (only \"sha256\")",
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

char *sl_manifest_sidecar(const char *model_path)
{
    size_t n = strlen(model_path);
    struct stat st;
    int dir = stat(model_path, &st) == 0 && S_ISDIR(st.st_mode);
    if (!dir && !(n >= 5 && strcmp(model_path + n - 5, ".json") == 0)) {
        char *p = malloc(n + sizeof ".manifest.json");
        if (p)
            snprintf(p, n + sizeof ".manifest.json", "%s.manifest.json", model_path);
        return p;
    }
    size_t d = n;
    if (!dir) /* a *.index.json: its directory */
        while (d > 0 && model_path[d - 1] != '/')
            d--;
    while (d > 1 && model_path[d - 1] == '/')
        d--;
    size_t size = d + 1 + sizeof "sluice.manifest.json";
    char *p = malloc(size);
    if (!p)
        return NULL;
    if (d == 0)
        snprintf(p, size, "sluice.manifest.json");
    else if (d == 1 && model_path[0] == '/')
        snprintf(p, size, "/sluice.manifest.json");
    else
        snprintf(p, size, "%.*s/sluice.manifest.json", (int)d, model_path);
    return p;
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
    if (!m->tensor_digest || !m->tensor_has || !m->file_digest || !m->file_size || !m->file_has) {
        sl_manifest_free(m);
        return NULL;
    }
    return m;
}

int sl_manifest_load(const sl_index *ix, const sluice_options *opts,
                     const char *model_path, sl_manifest **out, sl_err *err)
{
    *out = NULL;
    if (opts->verify == SLUICE_VERIFY_OFF)
        return SLUICE_OK; /* OFF reads nothing, not even an explicit manifest_path */

    char *path = NULL;
    if (opts->manifest_path) {
        if (!(path = strdup(opts->manifest_path)))
            return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
    } else {
        if (!(path = sl_manifest_sidecar(model_path)))
            return sl_fail(err, SLUICE_E_NOMEM, "manifest: out of memory");
        struct stat st;
        if (stat(path, &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
            int rc = SLUICE_OK;
            if (opts->verify == SLUICE_VERIFY_REQUIRE)
                rc = sl_fail(err, SLUICE_E_MANIFEST,
                             "manifest: policy REQUIRE and no manifest: no sidecar %s "
                             "(set manifest_path or write one with 'sluice manifest')", path);
            free(path);
            return rc; /* DEFAULT and IF_PRESENT: nothing to check */
        }
    }

    char *text = NULL;
    size_t len = 0;
    int rc = read_text(path, &text, &len, err);
    if (rc < 0) {
        free(path);
        return rc;
    }
    return sl_manifest_from_text(ix, opts, path, text, len, out, err);
}

int sl_manifest_from_text(const sl_index *ix, const sluice_options *opts, char *path,
                          char *text, size_t len, sl_manifest **out, sl_err *err)
{
    *out = NULL;
    cJSON *root = NULL;
    mf_ctx c = {.ix = ix, .path = path, .err = err};
    int rc = SLUICE_OK;
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
    if (is_structured(root))
        rc = structured(&c, root, start);
    else
        rc = each_entry(&c, root, start, "manifest", flat_tensor);
    if (rc < 0)
        goto done;
    c.m->policy = opts->verify == SLUICE_VERIFY_IF_PRESENT ? SLUICE_VERIFY_IF_PRESENT
                                                           : SLUICE_VERIFY_REQUIRE;
    if (c.m->policy == SLUICE_VERIFY_REQUIRE && (rc = require_all(&c)) < 0)
        goto done;
    c.m->path = path;
    path = NULL;
    *out = c.m;
    c.m = NULL;
done:
    for (int i = 0; i < 3; i++)
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
    free(m);
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
