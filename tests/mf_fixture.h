/* mf_fixture.h: small models and manifests written on the spot, for the
 * manifest and verification tests (test_manifest*.c, test_verify.c,
 * test_chunks.c, test_parts.c, test_sign_tools.c, test_model_signing.c,
 * test_manifest_tools.c, test_remote_proxy.c). Header-only so the shared test library stays as
 * it is. */
#ifndef SLUICE_TEST_MF_FIXTURE_H
#define SLUICE_TEST_MF_FIXTURE_H

#include "util.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* SHA-256 of n bytes at p, as hex. */
static inline void mf_hex_of(const void *p, size_t n, char hex[65])
{
    uint8_t d[32];
    mf_sha256(p, n, d);
    mf_hex(d, hex);
}

/* n bytes of the tests' hashed pattern (byte k is k * 2654435761 >> 13,
 * as unsigned), malloc'd: data that no two chunks share. */
static inline unsigned char *mf_hashed_pattern(uint64_t n)
{
    unsigned char *bytes = malloc(n ? (size_t)n : 1);
    if (!bytes)
        abort();
    for (uint64_t k = 0; k < n; k++)
        bytes[k] = (unsigned char)(k * 2654435761u >> 13);
    return bytes;
}

/* Writes path: header, then n bytes of mf_hashed_pattern; returns those
 * bytes (malloc'd) and sets *data_start (where they begin in the file). */
static inline unsigned char *mf_write_hashed_model(const char *path, const char *header, uint64_t n,
                                                   uint64_t *data_start)
{
    unsigned char *bytes = mf_hashed_pattern(n);
    tu_write_safetensors(path, header, bytes, (size_t)n);
    *data_start = 8 + strlen(header);
    return bytes;
}

/* Writes path: one U8 tensor `name` of shape [rows] (cols 0) or [rows,
 * cols] holding mf_hashed_pattern; returns its bytes (malloc'd) and, when
 * data_start is not NULL, sets it (where they begin in the file). */
static inline unsigned char *mf_write_u8_model(const char *path, const char *name, size_t rows,
                                               size_t cols, uint64_t *data_start)
{
    char header[256];
    size_t n = cols ? rows * cols : rows;
    if (cols)
        snprintf(header, sizeof header, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[%zu,%zu],"
                 "\"data_offsets\":[0,%zu]}}", name, rows, cols, n);
    else
        snprintf(header, sizeof header, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[%zu],"
                 "\"data_offsets\":[0,%zu]}}", name, rows, n);
    uint64_t start;
    unsigned char *bytes = mf_write_hashed_model(path, header, n, &start);
    if (data_start)
        *data_start = start;
    return bytes;
}

/* The opening of a version 2 manifest, up to its first tensor's entry. */
#define MF_V2_HEAD \
    "{\"format\": \"sluice-manifest\", \"version\": 2, \"algorithm\": \"sha256\",\n \"tensors\": {\n"

/* Ends a version 2 manifest (its tensors closed already) with the "files"
 * entry of the model file at path, listed as name: the whole file's
 * digest, its size, and its header's (data_start bytes). */
static inline void mf_v2_files(mf_buf *m, const char *path, const char *name, uint64_t data_start)
{
    size_t len = 0;
    unsigned char *file = tu_read_file(path, &len);
    if (!file)
        abort();
    char whole[65], header[65];
    mf_hex_of(file, len, whole);
    mf_hex_of(file, (size_t)data_start, header);
    free(file);
    mf_addf(m, " \"files\": {\"%s\": {\"digest\": \"%s\", \"size\": %zu, \"header\": \"%s\"}}}\n",
            name, whole, len, header);
}

/* A scratch folder (tu_tmpdir, returned) with the paths *model =
 * dir/model_name and, manifest_name not NULL, *manifest =
 * dir/manifest_name (all malloc'd; free with mf_scratch_free). */
static inline char *mf_scratch(char **model, const char *model_name, char **manifest,
                               const char *manifest_name)
{
    char *dir = tu_tmpdir();
    *model = tu_join(dir, model_name);
    if (manifest_name)
        *manifest = tu_join(dir, manifest_name);
    return dir;
}

/* Removes the scratch folder dir and frees it and its paths (NULL ones
 * are skipped). */
static inline void mf_scratch_free(char *dir, char *model, char *manifest)
{
    tu_rmtree(dir);
    free(dir);
    free(model);
    free(manifest);
}

/* Makes the folder dir/name holding two shards, model-00001-of-00002 and
 * model-00002-of-00002 (.safetensors), written by mf_write_model from
 * (n1, keys1, sizes1) and (n2, keys2, sizes2); returns its path. */
static inline char *mf_write_two_shards(const char *dir, const char *name, size_t n1,
                                        const char *const *keys1, const uint64_t *sizes1,
                                        size_t n2, const char *const *keys2,
                                        const uint64_t *sizes2)
{
    char *model = tu_join(dir, name);
    if (mkdir(model, 0755) != 0)
        abort();
    char *s1 = tu_join(model, "model-00001-of-00002.safetensors");
    char *s2 = tu_join(model, "model-00002-of-00002.safetensors");
    mf_write_model(s1, n1, keys1, sizes1);
    mf_write_model(s2, n2, keys2, sizes2);
    free(s1);
    free(s2);
    return model;
}

#endif
