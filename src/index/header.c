/* header.c: one .safetensors header, checked rule by rule as the reference
 * implementation (huggingface/safetensors) does, plus its duplicate check.
 *
 * Layout: 8 bytes little-endian N, N bytes of JSON, then the data. Every
 * byte is hostile: lengths are capped, arithmetic is overflow-checked, and
 * the offsets must tile the data section exactly.
 */
#include "index/header.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    unsigned bits;
} dtypes[SLUICE_DTYPE_COUNT_] = {
    [SLUICE_DTYPE_BOOL] = {"BOOL", 8},          [SLUICE_DTYPE_U8] = {"U8", 8},
    [SLUICE_DTYPE_I8] = {"I8", 8},              [SLUICE_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [SLUICE_DTYPE_F8_E4M3] = {"F8_E4M3", 8},    [SLUICE_DTYPE_F8_E8M0] = {"F8_E8M0", 8},
    [SLUICE_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [SLUICE_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [SLUICE_DTYPE_I16] = {"I16", 16},           [SLUICE_DTYPE_U16] = {"U16", 16},
    [SLUICE_DTYPE_F16] = {"F16", 16},           [SLUICE_DTYPE_BF16] = {"BF16", 16},
    [SLUICE_DTYPE_I32] = {"I32", 32},           [SLUICE_DTYPE_U32] = {"U32", 32},
    [SLUICE_DTYPE_F32] = {"F32", 32},           [SLUICE_DTYPE_I64] = {"I64", 64},
    [SLUICE_DTYPE_U64] = {"U64", 64},           [SLUICE_DTYPE_F64] = {"F64", 64},
    [SLUICE_DTYPE_C64] = {"C64", 64},           [SLUICE_DTYPE_F4] = {"F4", 4},
    [SLUICE_DTYPE_F6_E2M3] = {"F6_E2M3", 6},    [SLUICE_DTYPE_F6_E3M2] = {"F6_E3M2", 6},
};

const char *sl_dtype_name(sluice_dtype dtype)
{
    return (unsigned)dtype < SLUICE_DTYPE_COUNT_ ? dtypes[dtype].name : NULL;
}

unsigned sl_dtype_bits(sluice_dtype dtype)
{
    return (unsigned)dtype < SLUICE_DTYPE_COUNT_ ? dtypes[dtype].bits : 0;
}

/* The public names (sluice.h) sit with the table: the index and the
 * manifest below the API call them. */
SLUICE_API const char *sluice_dtype_name(sluice_dtype dtype)
{
    return sl_dtype_name(dtype);
}

SLUICE_API unsigned sluice_dtype_bits(sluice_dtype dtype)
{
    return sl_dtype_bits(dtype);
}

static int dtype_from(const char *s, size_t len, sluice_dtype *out)
{
    for (int i = 0; i < SLUICE_DTYPE_COUNT_; i++)
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, s, len) == 0) {
            *out = (sluice_dtype)i;
            return 0;
        }
    return -1;
}

int sl_header_length(const char *label, const unsigned char *first8, uint64_t file_size,
                     uint64_t *n, sl_err *err)
{
    if (file_size < 8)
        return sl_fail(err, SLUICE_E_HEADER_SHORT,
                       "%s: file is %llu bytes, shorter than the 8-byte header length",
                       label, (unsigned long long)file_size);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | first8[i];
    if (v > SLUICE_MAX_HEADER_BYTES)
        return sl_fail(err, SLUICE_E_HEADER_TOO_LARGE,
                       "%s: header length %llu is over the limit of %u bytes",
                       label, (unsigned long long)v, SLUICE_MAX_HEADER_BYTES);
    if (v > file_size - 8)
        return sl_fail(err, SLUICE_E_HEADER_SHORT,
                       "%s: header length %llu runs past the end of the %llu-byte file",
                       label, (unsigned long long)v, (unsigned long long)file_size);
    *n = v;
    return SLUICE_OK;
}

void sl_header_dims(const sl_header *h, const sl_header_tensor *t, uint64_t *dims)
{
    uint32_t k = 0;
    for (uint32_t c = h->doc.nodes[t->shape_node].first_child; c != SJ_NONE; c = h->doc.nodes[c].next)
        /* validated in check_entry, from the same private copy of the
         * header (index.c reads it once), so this cannot fail */
        if (sj_u64(&h->doc.nodes[c], &dims[k++]) < 0)
            dims[k - 1] = 0;
}

/* A context for messages: the file and the tensor's raw name, quoted only
 * when a message needs it (most entries are valid: no formatting then). */
typedef struct where {
    const char *label;
    const char *raw;
    size_t raw_len;
    char quoted[SL_QUOTE_MAX];
} where;

static const char *qname(where *w)
{
    if (!w->quoted[0])
        sl_quote(w->quoted, sizeof w->quoted, w->raw, w->raw_len);
    return w->quoted;
}

static int number_error(sl_err *err, where *w, const char *field, const sj_node *n, int rc)
{
    return sl_fail(err, SLUICE_E_INTEGER, "%s: tensor %s: %s holds %.*s, %s", w->label, qname(w),
                   field, (int)sl_utf8_prefix(n->str, n->len, 40), n->str,
                   rc == -2 ? "which is over 2^64-1" : "which is not a non-negative integer literal");
}

static int check_shape(const sj_doc *d, const sj_node *shape, where *w, sl_err *err)
{
    if (shape->type != SJ_ARRAY)
        return sl_fail(err, SLUICE_E_SHAPE, "%s: tensor %s: shape is not an array", w->label, qname(w));
    for (uint32_t c = shape->first_child; c != SJ_NONE; c = d->nodes[c].next) {
        const sj_node *dim = &d->nodes[c];
        uint64_t v;
        if (dim->type != SJ_NUMBER)
            return sl_fail(err, SLUICE_E_SHAPE, "%s: tensor %s: shape holds a non-number",
                           w->label, qname(w));
        int rc = sj_u64(dim, &v);
        if (rc < 0)
            return number_error(err, w, "shape", dim, rc);
    }
    return SLUICE_OK;
}

static int check_offsets(const sj_doc *d, const sj_node *off, where *w,
                         uint64_t *begin, uint64_t *end, sl_err *err)
{
    if (off->type != SJ_ARRAY || off->count != 2)
        return sl_fail(err, SLUICE_E_OFFSETS, "%s: tensor %s: data_offsets is not an array of two integers",
                       w->label, qname(w));
    uint64_t v[2];
    uint32_t c = off->first_child;
    for (int i = 0; i < 2; i++, c = d->nodes[c].next) {
        const sj_node *n = &d->nodes[c];
        if (n->type != SJ_NUMBER)
            return sl_fail(err, SLUICE_E_OFFSETS, "%s: tensor %s: data_offsets holds a non-number",
                           w->label, qname(w));
        int rc = sj_u64(n, &v[i]);
        if (rc < 0)
            return number_error(err, w, "data_offsets", n, rc);
    }
    if (v[0] > v[1])
        return sl_fail(err, SLUICE_E_OFFSETS, "%s: tensor %s: data_offsets [%llu, %llu] end before they begin",
                       w->label, qname(w), (unsigned long long)v[0], (unsigned long long)v[1]);
    *begin = v[0];
    *end = v[1];
    return SLUICE_OK;
}

/* Formats the shape for a message: "[5, 3]". */
static void shape_text(const sj_doc *d, const sj_node *shape, char *out, size_t size)
{
    size_t o = 0;
    o += (size_t)snprintf(out, size, "[");
    for (uint32_t c = shape->first_child; c != SJ_NONE && o < size; c = d->nodes[c].next)
        o += (size_t)snprintf(out + o, size - o, "%s%.*s", c == shape->first_child ? "" : ", ",
                              (int)d->nodes[c].len, d->nodes[c].str);
    if (o < size)
        snprintf(out + o, size - o, "]");
}

/* Element count x bits must not overflow and must equal 8 x (end - begin). */
static int check_size(const sj_doc *d, const sj_node *shape, sluice_dtype dt, uint64_t begin,
                      uint64_t end, where *w, sl_err *err)
{
    uint64_t count = 1, bits;
    char text[256];
    for (uint32_t c = shape->first_child; c != SJ_NONE; c = d->nodes[c].next) {
        uint64_t dim = 0;
        sj_u64(&d->nodes[c], &dim);
        if (__builtin_mul_overflow(count, dim, &count)) {
            shape_text(d, shape, text, sizeof text);
            return sl_fail(err, SLUICE_E_OVERFLOW, "%s: tensor %s: shape %s has more than 2^64 elements",
                           w->label, qname(w), text);
        }
    }
    if (__builtin_mul_overflow(count, (uint64_t)dtypes[dt].bits, &bits)) {
        shape_text(d, shape, text, sizeof text);
        return sl_fail(err, SLUICE_E_OVERFLOW, "%s: tensor %s: shape %s of %s overflows 64 bits of size",
                       w->label, qname(w), text, dtypes[dt].name);
    }
    if (bits % 8 || bits / 8 != end - begin)
        shape_text(d, shape, text, sizeof text);
    if (bits % 8)
        return sl_fail(err, SLUICE_E_SIZE_MISMATCH,
                       "%s: tensor %s: shape %s of %s is %llu bits, not a whole number of bytes",
                       w->label, qname(w), text, dtypes[dt].name, (unsigned long long)bits);
    if (bits / 8 != end - begin)
        return sl_fail(err, SLUICE_E_SIZE_MISMATCH,
                       "%s: tensor %s: shape %s of %s needs %llu bytes, data_offsets give %llu",
                       w->label, qname(w), text, dtypes[dt].name, (unsigned long long)(bits / 8),
                       (unsigned long long)(end - begin));
    return SLUICE_OK;
}

static int check_entry(const sj_doc *d, const sj_node *entry, sl_header_tensor *t,
                       where *w, sl_err *err)
{
    if (entry->type != SJ_OBJECT)
        return sl_fail(err, SLUICE_E_ENTRY, "%s: tensor %s: entry is not an object", w->label, qname(w));
    const sj_node *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (uint32_t c = entry->first_child; c != SJ_NONE; c = d->nodes[c].next) {
        const sj_node *m = &d->nodes[c];
        const sj_node **slot = NULL;
        if (m->key_len == 5 && !memcmp(m->key, "dtype", 5))
            slot = &dtype;
        else if (m->key_len == 5 && !memcmp(m->key, "shape", 5))
            slot = &shape;
        else if (m->key_len == 12 && !memcmp(m->key, "data_offsets", 12))
            slot = &offsets;
        else
            continue; /* the reference ignores unknown fields */
        if (*slot)
            return sl_fail(err, SLUICE_E_ENTRY, "%s: tensor %s: key \"%s\" is repeated",
                           w->label, qname(w), m->key);
        *slot = m;
    }
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offsets ? "data_offsets" : NULL;
    if (missing)
        return sl_fail(err, SLUICE_E_ENTRY, "%s: tensor %s: key \"%s\" is missing", w->label, qname(w), missing);
    if (dtype->type != SJ_STRING)
        return sl_fail(err, SLUICE_E_DTYPE, "%s: tensor %s: dtype is not a string", w->label, qname(w));
    if (dtype_from(dtype->str, dtype->len, &t->dtype) < 0) {
        char q[SL_QUOTE_MAX];
        return sl_fail(err, SLUICE_E_DTYPE, "%s: tensor %s: unknown dtype %s", w->label, qname(w),
                       sl_quote(q, sizeof q, dtype->str, dtype->len));
    }
    SL_TRY(check_shape(d, shape, w, err));
    SL_TRY(check_offsets(d, offsets, w, &t->begin, &t->end, err));
    SL_TRY(check_size(d, shape, t->dtype, t->begin, t->end, w, err));
    t->ndim = shape->count;
    t->shape_node = (uint32_t)(shape - d->nodes);
    return SLUICE_OK;
}

static int by_key(const void *a, const void *b)
{
    const sj_node *x = *(const sj_node *const *)a, *y = *(const sj_node *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static int check_metadata(const sj_doc *d, const sj_node *m, sl_header *h, const char *label, sl_err *err)
{
    if (h->metadata_kind != SLUICE_METADATA_ABSENT)
        return sl_fail(err, SLUICE_E_METADATA, "%s: __metadata__ is repeated", label);
    if (m->type == SJ_NULL) {
        h->metadata_kind = SLUICE_METADATA_NULL;
        return SLUICE_OK;
    }
    if (m->type != SJ_OBJECT)
        return sl_fail(err, SLUICE_E_METADATA, "%s: __metadata__ is neither null nor an object", label);
    for (uint32_t c = m->first_child; c != SJ_NONE; c = d->nodes[c].next) {
        const sj_node *v = &d->nodes[c];
        char q[SL_QUOTE_MAX];
        if (v->type != SJ_STRING)
            return sl_fail(err, SLUICE_E_METADATA, "%s: __metadata__ value of %s is not a string",
                           label, sl_quote(q, sizeof q, v->key, v->key_len));
    }
    /* repeated keys: sort the members by key and compare neighbours */
    const sj_node **sorted = malloc((m->count ? m->count : 1) * sizeof *sorted);
    if (!sorted)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", label);
    size_t n = 0;
    for (uint32_t c = m->first_child; c != SJ_NONE; c = d->nodes[c].next)
        sorted[n++] = &d->nodes[c];
    qsort(sorted, n, sizeof *sorted, by_key);
    for (size_t i = 1; i < n; i++)
        if (by_key(&sorted[i - 1], &sorted[i]) == 0) {
            char q[SL_QUOTE_MAX];
            sl_quote(q, sizeof q, sorted[i]->key, sorted[i]->key_len);
            free(sorted);
            return sl_fail(err, SLUICE_E_METADATA, "%s: __metadata__ key %s is repeated", label, q);
        }
    free(sorted);
    h->metadata_kind = SLUICE_METADATA_OBJECT;
    h->metadata_node = (uint32_t)(m - d->nodes);
    return SLUICE_OK;
}

static int by_offsets(const void *a, const void *b)
{
    const sl_header_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Sorted by (begin, end), the tensors must tile [0, data_len) exactly. */
static int check_layout(const sl_header *h, uint64_t data_len, const char *label, sl_err *err)
{
    uint64_t expect = 0;
    char q[SL_QUOTE_MAX];
    for (size_t i = 0; i < h->ntensors; i++) {
        const sl_header_tensor *t = &h->tensors[i];
        if (t->begin != expect)
            return sl_fail(err, SLUICE_E_LAYOUT,
                           "%s: tensor %s: data_offsets begin at %llu, where %s at %llu",
                           label, sl_quote(q, sizeof q, t->name, t->name_len),
                           (unsigned long long)t->begin,
                           t->begin > expect ? "a hole starts" : "it overlaps the tensor that ends",
                           (unsigned long long)expect);
        expect = t->end;
    }
    if (expect != data_len)
        return sl_fail(err, SLUICE_E_LAYOUT,
                       "%s: tensor data ends at %llu but the file holds %llu bytes of data",
                       label, (unsigned long long)expect, (unsigned long long)data_len);
    return SLUICE_OK;
}

int sl_header_parse(const char *label, const unsigned char *bytes, size_t bytes_len,
                    uint64_t file_size, sl_header *h, sl_err *err)
{
    memset(h, 0, sizeof *h);
    uint64_t n;
    if (bytes_len < 8)
        return sl_fail(err, SLUICE_E_HEADER_SHORT, "%s: file is %zu bytes, shorter than 8", label, bytes_len);
    SL_TRY(sl_header_length(label, bytes, file_size, &n, err));
    if (n > bytes_len - 8)
        return sl_fail(err, SLUICE_E_HEADER_SHORT, "%s: header runs past the bytes given", label);
    const unsigned char *json = bytes + 8;
    size_t bad;
    if (!sl_utf8_valid(json, (size_t)n, &bad))
        return sl_fail(err, SLUICE_E_HEADER_UTF8, "%s: header byte %zu (file offset %zu) is not valid UTF-8",
                       label, bad, bad + 8);
    int rc = sj_parse(&h->doc, (const char *)json, (size_t)n);
    if (rc == -2)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory parsing the header", label);
    if (rc < 0)
        return sl_fail(err, SLUICE_E_HEADER_JSON, "%s: header is not valid JSON: %s at header byte %zu",
                       label, h->doc.error, h->doc.error_pos);
    const sj_doc *d = &h->doc;
    const sj_node *root = &d->nodes[0];
    if (root->type != SJ_OBJECT)
        return sl_fail(err, SLUICE_E_HEADER_NOT_OBJECT, "%s: header is JSON but not an object", label);
    h->tensors = calloc(root->count ? root->count : 1, sizeof *h->tensors);
    if (!h->tensors)
        return sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", label);
    for (uint32_t c = root->first_child; c != SJ_NONE; c = d->nodes[c].next) {
        const sj_node *m = &d->nodes[c];
        if (m->key_len == 12 && !memcmp(m->key, "__metadata__", 12)) {
            SL_TRY(check_metadata(d, m, h, label, err));
            continue;
        }
        where w = {.label = label, .raw = m->key, .raw_len = m->key_len};
        sl_header_tensor *t = &h->tensors[h->ntensors];
        t->name = m->key;
        t->name_len = m->key_len;
        SL_TRY(check_entry(d, m, t, &w, err));
        h->ntensors++;
    }
    qsort(h->tensors, h->ntensors, sizeof *h->tensors, by_offsets);
    return check_layout(h, file_size - 8 - n, label, err);
}

void sl_header_free(sl_header *h)
{
    sj_free(&h->doc);
    free(h->tensors);
    memset(h, 0, sizeof *h);
}
