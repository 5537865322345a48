/* engine_fixture.h: what the engine tests share: generated models with
 * random bytes (so a tensor read from the wrong offset never passes), and
 * checks of handles against an independent pread of the file. Static
 * functions: each test program includes it once. */
#ifndef SLUICE_ENGINE_FIXTURE_H
#define SLUICE_ENGINE_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "api/engine_hooks.h"
#include "sluice.h"
#include "util.h"

static __attribute__((unused)) uint64_t ef_rng(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Writes one shard at path holding tensors named prefix000.. of the given
 * byte sizes (dtype U8, so shape = size), random bytes from *seed. The
 * header is padded to `pad` extra spaces, which moves every data offset
 * (pad odd: no offset is aligned). */
static __attribute__((unused)) void ef_write_shard(const char *path, const char *prefix, const uint64_t *sizes,
                           size_t n, unsigned pad, uint64_t *seed)
{
    size_t cap = 64 + n * 96 + pad, len = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    uint64_t off = 0;
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"%s%03zu\":{\"dtype\":\"U8\",\"shape\":[%llu],"
                                "\"data_offsets\":[%llu,%llu]}",
                                i ? "," : "", prefix, i, (unsigned long long)sizes[i],
                                (unsigned long long)off, (unsigned long long)(off + sizes[i]));
        off += sizes[i];
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    for (unsigned k = 0; k < pad; k++)
        h[len++] = ' ';
    h[len] = '\0';
    unsigned char *data = malloc(off ? off : 1);
    assert_non_null(data);
    for (uint64_t b = 0; b < off; b += 8) {
        uint64_t r = ef_rng(seed);
        memcpy(data + b, &r, off - b < 8 ? off - b : 8);
    }
    tu_write_safetensors(path, h, data, off);
    free(data);
    free(h);
}

/* A sharded model in a fresh directory (on a disk where there is one:
 * O_DIRECT taken, not refused as tmpfs may): `shards` shards, each with the
 * sizes given (the same list for each shard), odd padding. */
static __attribute__((unused)) char *ef_model(unsigned shards, const uint64_t *sizes, size_t n, uint64_t seed)
{
    char *dir = tu_disk_or_tmpdir();
    for (unsigned s = 0; s < shards; s++) {
        char name[64], prefix[32];
        snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", s + 1, shards);
        snprintf(prefix, sizeof prefix, "s%u.t", s);
        char *p = tu_join(dir, name);
        ef_write_shard(p, prefix, sizes, n, 1 + 2 * s, &seed);
        free(p);
    }
    return dir;
}

/* The mixed sizes of the generated model: empty, tiny, odd, around the
 * test chunk (64 KiB), several chunks. */
static const uint64_t ef_sizes[] = {
    0, 1, 7, 64, 100, 4096, 4095, 65536, 65537, 200000, 3, 0, 12345, 300000, 1000, 131072, 77,
};
#define EF_NSIZES (sizeof ef_sizes / sizeof ef_sizes[0])

static __attribute__((unused)) sluice_options ef_opts(uint64_t pool, uint64_t chunk, uint32_t flags)
{
    sluice_options o;
    sluice_options_init(&o);
    o.pool_bytes = pool;
    o.chunk_bytes = chunk;
    o.flags = flags;
    o.hash_threads = 2;
    o.io_threads = 3;
    return o;
}

static __attribute__((unused)) sluice_model *ef_open(const char *path, const sluice_options *o)
{
    sluice_model *m = NULL;
    int rc = sluice_open(path, o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s: %s", path, sluice_strerror(rc), sluice_errmsg(m));
    return m;
}

/* Compares a live handle with the file's bytes, and its alignment. */
static __attribute__((unused)) void ef_check_handle(const sluice_tensor *t)
{
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    assert_non_null(info);
    assert_int_equal(sluice_tensor_size(t), info->nbytes);
    const unsigned char *d = sluice_tensor_data(t);
    if (info->nbytes == 0)
        return;
    assert_non_null(d);
    assert_int_equal((uintptr_t)d % 64, 0);
    unsigned char *want = tu_pread_range(info->file, info->offset, (size_t)info->nbytes);
    if (memcmp(d, want, (size_t)info->nbytes) != 0)
        fail_msg("tensor %s: bytes differ from the file", info->name);
    free(want);
}

static __attribute__((unused)) void ef_acquire_check(sluice_model *m, size_t i)
{
    sluice_tensor *t = NULL;
    int rc = sluice_acquire_index(m, i, &t);
    if (rc != SLUICE_OK)
        fail_msg("acquire %zu: %s: %s", i, sluice_strerror(rc), sluice_errmsg(m));
    assert_int_equal(sluice_tensor_info(t)->index, i);
    ef_check_handle(t);
    assert_int_equal(sluice_release(t), SLUICE_OK);
}

/* Every tensor in model order, reverse, and a random order. */
static __attribute__((unused)) void ef_check_orders(sluice_model *m, uint64_t seed)
{
    size_t n = sluice_count(m);
    for (size_t i = 0; i < n; i++)
        ef_acquire_check(m, i);
    for (size_t i = n; i-- > 0;)
        ef_acquire_check(m, i);
    size_t *perm = malloc((n ? n : 1) * sizeof *perm);
    assert_non_null(perm);
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(ef_rng(&seed) % i), tmp = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = tmp;
    }
    for (size_t i = 0; i < n; i++)
        ef_acquire_check(m, perm[i]);
    free(perm);
}

typedef struct ef_stream_seen {
    size_t n;
    unsigned char *seen;
    size_t delivered, failed;
    int keep;                 /* keep handles instead of releasing them */
    sluice_tensor **kept;
    size_t nkept;
} ef_stream_seen;

static __attribute__((unused)) int ef_stream_cb(void *user, sluice_tensor *t, int status,
                        const struct sluice_tensor_info *info, const char *message)
{
    ef_stream_seen *s = user;
    assert_non_null(info);
    assert_true(info->index < s->n);
    assert_int_equal(s->seen[info->index], 0);
    s->seen[info->index] = 1;
    if (status != SLUICE_OK) {
        assert_null(t);
        assert_non_null(message);
        if (getenv("EF_VERBOSE"))
            fprintf(stderr, "stream failure: %s\n", message);
        s->failed++;
        return 0;
    }
    assert_non_null(t);
    assert_ptr_equal(sluice_tensor_info(t), info);
    ef_check_handle(t);
    s->delivered++;
    if (s->keep)
        s->kept[s->nkept++] = t;
    else
        assert_int_equal(sluice_release(t), SLUICE_OK);
    return 0;
}

/* Streams every tensor; each must come exactly once, with the right bytes. */
static __attribute__((unused)) void ef_check_stream(sluice_model *m)
{
    ef_stream_seen s = {0};
    s.n = sluice_count(m);
    s.seen = calloc(s.n ? s.n : 1, 1);
    assert_non_null(s.seen);
    int rc = sluice_stream(m, NULL, 0, ef_stream_cb, &s);
    if (rc != SLUICE_OK)
        fail_msg("stream: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    assert_int_equal(s.delivered, s.n);
    free(s.seen);
}

static __attribute__((unused)) struct sluice_stats ef_stats(sluice_model *m)
{
    struct sluice_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    return st;
}

#endif
