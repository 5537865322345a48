/* mf_fixture.h: small models and manifests written on the spot, for the
 * manifest and verification tests (test_manifest.c, test_verify.c,
 * test_manifest_tools.c). Header-only so the shared test library stays as
 * it is. */
#ifndef SLUICE_TEST_MF_FIXTURE_H
#define SLUICE_TEST_MF_FIXTURE_H

#include "util.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growable string. */
typedef struct mf_buf {
    char *p;
    size_t len, cap;
} mf_buf;

static inline void mf_addf(mf_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void mf_addf(mf_buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            abort();
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 256) + (size_t)n + 1;
        char *grown = realloc(b->p, cap);
        if (!grown)
            abort();
        b->p = grown;
        b->cap = cap;
    }
}

static inline void mf_buf_free(mf_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Writes a .safetensors file of n U8 tensors: keys[i] is the key as JSON
 * source (escapes allowed, no quotes), sizes[i] its byte count; data are
 * tu_write_safetensors' pattern bytes. */
static inline void mf_write_model(const char *path, size_t n, const char *const *keys,
                                  const uint64_t *sizes)
{
    mf_buf h = {0};
    uint64_t off = 0;
    mf_addf(&h, "{");
    for (size_t i = 0; i < n; i++) {
        mf_addf(&h, "%s\"%s\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[%llu,%llu]}",
                i ? "," : "", keys[i], (unsigned long long)sizes[i], (unsigned long long)off,
                (unsigned long long)(off + sizes[i]));
        off += sizes[i];
    }
    mf_addf(&h, "}");
    tu_write_safetensors(path, h.p, NULL, (size_t)off);
    mf_buf_free(&h);
}

/* Writes a file of n tensors named "t.0", "t.1", ... of sizes 1 + i * step. */
static inline void mf_write_simple(const char *path, size_t n, uint64_t step)
{
    char **keys = calloc(n ? n : 1, sizeof *keys);
    uint64_t *sizes = calloc(n ? n : 1, sizeof *sizes);
    if (!keys || !sizes)
        abort();
    for (size_t i = 0; i < n; i++) {
        keys[i] = malloc(32);
        if (!keys[i])
            abort();
        snprintf(keys[i], 32, "t.%zu", i);
        sizes[i] = 1 + i * step;
    }
    mf_write_model(path, n, (const char *const *)keys, sizes);
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    free(sizes);
}

static inline void mf_sha256(const void *data, size_t len, uint8_t out[32])
{
    unsigned int n = 0;
    if (!EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) || n != 32)
        abort();
}

static inline char *mf_hex(const uint8_t d[32], char out[65])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[64] = '\0';
    return out;
}

/* A digest that is just a pattern: byte j is seed + j. */
static inline void mf_fake_digest(unsigned seed, char out[65])
{
    uint8_t d[32];
    for (int j = 0; j < 32; j++)
        d[j] = (uint8_t)(seed + (unsigned)j);
    mf_hex(d, out);
}

/* Writes text (strlen) to path. */
static inline void mf_write_text(const char *path, const char *text)
{
    tu_write_file(path, text, strlen(text));
}

/* Flips one byte of path at offset (xor 0xff). */
static inline void mf_flip_byte(const char *path, uint64_t offset)
{
    size_t len = 0;
    unsigned char *data = tu_read_file(path, &len);
    if (!data || offset >= len)
        abort();
    data[offset] ^= 0xff;
    tu_write_file(path, data, len);
    free(data);
}

#endif
