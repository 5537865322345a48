/* test_parts.c: tensor-parallel parts (sluice_read_part_into,
 * sluice_acquire_part, sluice_digest_part), part digests in a version 2
 * manifest ("parts"), and the rules (sluice_part_rules_*).
 *
 * A synth model of tensors of 1 to 3 dims and several dtypes; the
 * reference of each part is cut here from the whole tensor's bytes by
 * index arithmetic, and the manifests' digests are OpenSSL's one-shot
 * SHA-256 of those bytes, independent of the library. Checked: every part
 * of every tensor for n in {2, 4, 8} and every dim equals the whole
 * tensor's slice (no manifest, whole digests, part digests), a dim n does
 * not divide is SLUICE_E_INVAL with the numbers; a byte flipped inside
 * rank 3's part fails rank 3 and no other, one outside rank 0's part does
 * not fail rank 0 while a whole load does; bytes read per part, and the
 * fallback (part_fallback_bytes, sluice_part_note once); every field of
 * "parts" is read strictly; the built-in rules and a rules file. */
#include "api/engine_hooks.h"
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>

typedef struct tdesc {
    const char *name, *dtype;
    unsigned esz, ndim;
    uint64_t shape[3];
    int part_dim; /* the dim whose part digests the manifest lists */
} tdesc;

static const tdesc T[] = {
    {"a", "F32", 4, 3, {8, 16, 4}, 1},
    {"b", "BF16", 2, 2, {16, 24}, 1},
    {"c", "U8", 1, 3, {1, 32, 8}, 1},
    {"d", "F16", 2, 1, {40}, 0},
    {"e", "I32", 4, 2, {12, 6}, 0},
};
#define NT (sizeof T / sizeof *T)
static const uint64_t WORLDS[] = {2, 4, 8};

typedef struct fx {
    char *dir, *model, *manifest;
    unsigned char *bytes;
    uint64_t off[NT], nbytes[NT], data_start;
} fx;

static uint64_t tensor_bytes(const tdesc *t)
{
    uint64_t n = t->esz;
    for (unsigned k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

/* The reference part: rank r of n along dim of tensor j, cut from the
 * whole tensor's bytes (malloc'd; *len its size). */
static unsigned char *ref_part(const fx *f, size_t j, unsigned dim, uint64_t r, uint64_t n,
                               size_t *len)
{
    const tdesc *t = &T[j];
    uint64_t outer = 1, inner = t->esz;
    for (unsigned k = 0; k < dim; k++)
        outer *= t->shape[k];
    for (unsigned k = dim + 1; k < t->ndim; k++)
        inner *= t->shape[k];
    uint64_t rows = t->shape[dim] / n, seg = rows * inner, stride = t->shape[dim] * inner;
    *len = (size_t)(outer * seg);
    unsigned char *p = malloc(*len ? *len : 1);
    assert_non_null(p);
    const unsigned char *whole = f->bytes + f->off[j];
    for (uint64_t o = 0; o < outer; o++)
        memcpy(p + o * seg, whole + o * stride + r * seg, (size_t)seg);
    return p;
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest, "m.json");
    mf_buf h = {0};
    uint64_t at = 0;
    mf_addf(&h, "{");
    for (size_t j = 0; j < NT; j++) {
        f->nbytes[j] = tensor_bytes(&T[j]);
        f->off[j] = at;
        mf_addf(&h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", j ? "," : "", T[j].name, T[j].dtype);
        for (unsigned k = 0; k < T[j].ndim; k++)
            mf_addf(&h, "%s%llu", k ? "," : "", (unsigned long long)T[j].shape[k]);
        mf_addf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                (unsigned long long)(at + f->nbytes[j]));
        at += f->nbytes[j];
    }
    mf_addf(&h, "}");
    f->bytes = mf_write_hashed_model(f->model, h.p, at, &f->data_start);
    mf_buf_free(&h);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    mf_scratch_free(f->dir, f->model, f->manifest);
    free(f->bytes);
    free(f);
    return 0;
}

/* The version 2 manifest: every tensor's digest, and with parts the part
 * digests of each tensor along its part_dim for the worlds that divide
 * it; extra (may be NULL) replaces tensor a's "parts" value verbatim. */
static void write_manifest(fx *f, int parts, const char *extra)
{
    char h[65];
    mf_buf m = {0};
    mf_addf(&m, MF_V2_HEAD);
    for (size_t j = 0; j < NT; j++) {
        const tdesc *t = &T[j];
        mf_hex_of(f->bytes + f->off[j], (size_t)f->nbytes[j], h);
        mf_addf(&m, "%s  \"%s\": {\"digest\": \"%s\", \"dtype\": \"%s\", \"shape\": [", j ? ",\n" : "",
                t->name, h, t->dtype);
        for (unsigned k = 0; k < t->ndim; k++)
            mf_addf(&m, "%s%llu", k ? ", " : "", (unsigned long long)t->shape[k]);
        mf_addf(&m, "], \"nbytes\": %llu", (unsigned long long)f->nbytes[j]);
        if (extra && j == 0) {
            mf_addf(&m, ", \"parts\": %s", extra);
        } else if (parts) {
            mf_addf(&m, ", \"parts\": {\"dim\": %d, \"digests\": {", t->part_dim);
            int first = 1;
            for (size_t w = 0; w < 3; w++) {
                uint64_t n = WORLDS[w];
                if (t->shape[t->part_dim] % n)
                    continue;
                mf_addf(&m, "%s\"%llu\": [", first ? "" : ", ", (unsigned long long)n);
                first = 0;
                for (uint64_t r = 0; r < n; r++) {
                    size_t plen;
                    unsigned char *p = ref_part(f, j, (unsigned)t->part_dim, r, n, &plen);
                    mf_hex_of(p, plen, h);
                    free(p);
                    mf_addf(&m, "%s\"%s\"", r ? ", " : "", h);
                }
                mf_addf(&m, "]");
            }
            mf_addf(&m, "}}");
        }
        mf_addf(&m, "}");
    }
    mf_addf(&m, "},\n");
    mf_v2_files(&m, f->model, "model.safetensors", f->data_start);
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
}

static int try_open(const fx *f, int with_manifest, sluice_model **m)
{
    sluice_options o;
    sluice_options_init(&o);
    if (with_manifest)
        o.manifest_path = f->manifest;
    else
        o.verify = SLUICE_VERIFY_OFF;
    return sluice_open(f->model, &o, m);
}

static sluice_model *open_model(const fx *f, int with_manifest)
{
    sluice_model *m = NULL;
    if (try_open(f, with_manifest, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    return m;
}

static struct sluice_stats stats_of(sluice_model *m)
{
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    return st;
}

/* Every part of every tensor, n in {2, 4, 8}, every dim, by both calls;
 * each equals the slice, a dim n does not divide is refused. */
static void check_every_part(fx *f, sluice_model *m)
{
    for (size_t j = 0; j < NT; j++)
        for (unsigned dim = 0; dim < T[j].ndim; dim++)
            for (size_t w = 0; w < 3; w++) {
                uint64_t n = WORLDS[w];
                if (T[j].shape[dim] % n) {
                    unsigned char one;
                    assert_int_equal(sluice_read_part_into(m, T[j].name, dim, 0, n, &one, 1),
                                     SLUICE_E_INVAL);
                    char want[96];
                    snprintf(want, sizeof want, "dim %u of size %llu does not split into %llu",
                             dim, (unsigned long long)T[j].shape[dim], (unsigned long long)n);
                    if (!strstr(sluice_errmsg(m), want))
                        fail_msg("%s: %s", want, sluice_errmsg(m));
                    continue;
                }
                for (uint64_t r = 0; r < n; r++) {
                    size_t len;
                    unsigned char *want = ref_part(f, j, dim, r, n, &len);
                    unsigned char *got = malloc(len + 1);
                    assert_non_null(got);
                    int rc = sluice_read_part_into(m, T[j].name, dim, r, n, got, len);
                    if (rc != SLUICE_OK)
                        fail_msg("%s dim %u %llu/%llu: %s", T[j].name, dim,
                                 (unsigned long long)r, (unsigned long long)n, sluice_errmsg(m));
                    if (memcmp(got, want, len) != 0)
                        fail_msg("%s dim %u part %llu of %llu differs from the slice", T[j].name,
                                 dim, (unsigned long long)r, (unsigned long long)n);
                    sluice_tensor *t = NULL;
                    assert_int_equal(sluice_acquire_part(m, T[j].name, dim, r, n, &t), SLUICE_OK);
                    const struct sluice_tensor_info *ti = sluice_tensor_info(t);
                    assert_int_equal(sluice_tensor_size(t), len);
                    assert_int_equal(ti->nbytes, len);
                    assert_int_equal(ti->ndim, T[j].ndim);
                    for (unsigned k = 0; k < T[j].ndim; k++)
                        assert_int_equal(ti->shape[k],
                                         k == dim ? T[j].shape[k] / n : T[j].shape[k]);
                    assert_int_equal((uintptr_t)sluice_tensor_data(t) % 64, 0);
                    assert_memory_equal(sluice_tensor_data(t), want, len);
                    assert_int_equal(sluice_release(t), SLUICE_OK);
                    free(got);
                    free(want);
                }
            }
}

static void test_every_part_unchecked(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 0);
    check_every_part(f, m);
    sluice_close(m);
}

static void test_every_part_whole_digests(void **state)
{
    fx *f = *state;
    write_manifest(f, 0, NULL);
    sluice_model *m = open_model(f, 1);
    check_every_part(f, m);
    sluice_close(m);
}

static void test_every_part_part_digests(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 1);
    check_every_part(f, m);
    /* the library's digest of a part is the manifest's */
    uint8_t d[32];
    char hex[65], want[65];
    assert_int_equal(sluice_digest_part(m, 1, 1, 3, 8, d), SLUICE_OK);
    size_t len;
    unsigned char *p = ref_part(f, 1, 1, 3, 8, &len);
    mf_hex_of(p, len, want);
    free(p);
    assert_string_equal(mf_hex(d, hex), want);
    assert_int_equal(sluice_digest_part(m, 99, 0, 0, 2, d), SLUICE_E_INVAL);
    sluice_close(m);
}

/* Bad arguments: each refused with INVAL and nothing read. */
static void test_bad_arguments(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 0);
    unsigned char buf[4096];
    sluice_tensor *t = (sluice_tensor *)buf;
    assert_int_equal(sluice_read_part_into(m, "b", 2, 0, 2, buf, 384), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "no dim 2"));
    assert_int_equal(sluice_read_part_into(m, "b", 1, 2, 2, buf, 384), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_part_into(m, "b", 1, 0, 0, buf, 384), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_part_into(m, "b", 1, 0, 2, buf, 383), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "384 bytes (768 / 2), len is 383"));
    assert_int_equal(sluice_read_part_into(m, "b", 1, 0, 2, NULL, 384), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_part_into(m, "zz", 1, 0, 2, buf, 384), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_read_part_into(m, NULL, 1, 0, 2, buf, 384), SLUICE_E_INVAL);
    assert_int_equal(sluice_acquire_part(m, "b", 1, 0, 5, &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_int_equal(sluice_acquire_part(m, "b", 1, 0, 2, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_part_into(NULL, "b", 1, 0, 2, buf, 384), SLUICE_E_INVAL);
    assert_int_equal(sluice_acquire_part(NULL, "b", 1, 0, 2, &t), SLUICE_E_INVAL);
    assert_int_equal(sluice_digest_part(NULL, 1, 1, 0, 2, buf), SLUICE_E_INVAL);
    assert_int_equal(sluice_digest_part(m, 1, 1, 0, 2, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_digest_part(m, 1, 1, 0, 5, buf), SLUICE_E_INVAL);
    assert_null(sluice_part_note(NULL));
    assert_null(sluice_part_note(m));
    assert_int_equal(stats_of(m).bytes_read, 0);
    sluice_close(m);
}

/* Packed elements (F4, two to a byte): a part whose rows are not whole
 * bytes is refused, one whose rows are reads. */
static void test_packed_parts(void **state)
{
    fx *f = *state;
    char *path = tu_join(f->dir, "f4.safetensors");
    const unsigned char data[9] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x11};
    tu_write_safetensors(path, "{\"p\":{\"dtype\":\"F4\",\"shape\":[3,2],\"data_offsets\":[0,3]},"
                               "\"q\":{\"dtype\":\"F4\",\"shape\":[2,2,3],\"data_offsets\":[3,9]}}",
                         data, sizeof data);
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    if (sluice_open(path, &o, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    unsigned char buf[4];
    assert_int_equal(sluice_read_part_into(m, "p", 1, 0, 2, buf, 1), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "not whole bytes"));
    assert_int_equal(sluice_read_part_into(m, "q", 1, 0, 2, buf, 1), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_part_into(m, "q", 0, 1, 2, buf, 3), SLUICE_OK);
    assert_memory_equal(buf, data + 6, 3);
    sluice_close(m);
    free(path);
}

/* Tensor b [16, 24] BF16 along dim 1, world 8: each rank's part is 16
 * segments of 6 bytes. A byte inside rank 3's part (row 5, column 3 x 3
 * + 1) fails rank 3 and no other. */
static void test_flip_inside_rank3(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    uint64_t row = 5, seg = 3 * 2, stride = 24 * 2;
    mf_flip_byte(f->model, f->data_start + f->off[1] + row * stride + 3 * seg + 1);
    sluice_model *m = open_model(f, 1);
    unsigned char buf[96];
    for (uint64_t r = 0; r < 8; r++) {
        int rc = sluice_read_part_into(m, "b", 1, r, 8, buf, sizeof buf);
        if (r == 3) {
            assert_int_equal(rc, SLUICE_E_CHECKSUM);
            assert_non_null(strstr(sluice_errmsg(m), "part 3 of 8 along dim 1"));
        } else if (rc != SLUICE_OK) {
            fail_msg("rank %llu: %s", (unsigned long long)r, sluice_errmsg(m));
        }
    }
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_part(m, "b", 1, 3, 8, &t), SLUICE_E_CHECKSUM);
    assert_null(t);
    assert_int_equal(stats_of(m).checksum_failures, 2);
    sluice_close(m);
}

/* A byte outside every part of rank 0 (column 15 of the last row of b:
 * rank 1 of 2's, rank 5 of 8's) does
 * not fail rank 0, whose bytes are the only ones read, while a whole load
 * of the tensor does; along dim 0 (tensor d) too. */
static void test_flip_outside_rank0(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    mf_flip_byte(f->model, f->data_start + f->off[1] + 15 * 48 + 30); /* column 15 */
    mf_flip_byte(f->model, f->data_start + f->off[3] + 79); /* d's last byte: rank 1 of 2 */
    sluice_model *m = open_model(f, 1);
    unsigned char buf[384];
    assert_int_equal(sluice_read_part_into(m, "b", 1, 0, 8, buf, 96), SLUICE_OK);
    assert_int_equal(sluice_read_part_into(m, "b", 1, 0, 2, buf, 384), SLUICE_OK);
    assert_int_equal(sluice_read_part_into(m, "d", 0, 0, 2, buf, 40), SLUICE_OK);
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.bytes_read, 96 + 384 + 40);
    assert_int_equal(st.part_fallback_bytes, 0);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_acquire(m, "d", &t), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_read_part_into(m, "b", 1, 5, 8, buf, 96), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_read_part_into(m, "b", 1, 1, 2, buf, 384), SLUICE_E_CHECKSUM);
    sluice_close(m);
}

/* Bytes read per rank against the layout: with part digests exactly the
 * part; with whole digests only, a dim-1 part reads its whole tensor
 * (part_fallback_bytes, one note for the model); unchecked, the part. */
static void test_bytes_read(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 1);
    unsigned char buf[1024];
    for (uint64_t r = 0; r < 8; r++) {
        uint64_t before = stats_of(m).bytes_read;
        assert_int_equal(sluice_read_part_into(m, "a", 1, r, 8, buf, 256), SLUICE_OK);
        assert_int_equal(stats_of(m).bytes_read - before, 256);
    }
    assert_int_equal(stats_of(m).bytes_hashed, 8 * 256);
    assert_null(sluice_part_note(m));
    sluice_close(m);

    write_manifest(f, 0, NULL);
    m = open_model(f, 1);
    assert_int_equal(sluice_read_part_into(m, "a", 1, 2, 8, buf, 256), SLUICE_OK);
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.bytes_read, 2048);
    assert_int_equal(st.part_fallback_bytes, 2048);
    const char *note = sluice_part_note(m);
    assert_non_null(note);
    assert_non_null(strstr(note, "part 2 of 8 of tensor \"a\" along dim 1"));
    assert_int_equal(sluice_read_part_into(m, "b", 1, 0, 4, buf, 192), SLUICE_OK);
    assert_ptr_equal(sluice_part_note(m), note); /* said once: still the first */
    assert_non_null(strstr(note, "tensor \"a\""));
    assert_int_equal(stats_of(m).part_fallback_bytes, 2048 + 768);
    /* dim 0 without chunk digests: the whole tensor too */
    assert_int_equal(sluice_read_part_into(m, "a", 0, 1, 2, buf, 1024), SLUICE_OK);
    assert_int_equal(stats_of(m).part_fallback_bytes, 2048 + 768 + 2048);
    sluice_close(m);

    m = open_model(f, 0);
    assert_int_equal(sluice_read_part_into(m, "a", 2, 1, 4, buf, 512), SLUICE_OK);
    st = stats_of(m);
    assert_int_equal(st.bytes_read, 512);
    assert_int_equal(st.part_fallback_bytes, 0);
    assert_null(sluice_part_note(m));
    sluice_close(m);
}

/* An acquired part's bytes are in the pool (issue 37, item 4): counted in
 * pool_in_use, evicting a cached tensor for its room, refused with
 * SLUICE_E_POOL_EXHAUSTED while handles hold the room (nothing in flight
 * can give it back), and with SLUICE_E_TOO_LARGE beyond the pool; its
 * room comes back at release. Tensor "a" is 2,048 bytes, a part of two
 * along dim 0 1,024. */
static sluice_model *open_pool(const fx *f, uint64_t pool)
{
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = f->manifest;
    o.pool_bytes = pool;
    sluice_model *m = NULL;
    if (sluice_open(f->model, &o, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    return m;
}

static void test_part_in_pool(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_pool(f, 2048);
    sluice_tensor *whole = NULL, *p0 = NULL, *p1 = NULL, *p2 = NULL;
    /* out of the plan's order ("e" then "a"): no read-ahead */
    assert_int_equal(sluice_acquire(m, "e", &whole), SLUICE_OK);
    assert_int_equal(sluice_release(whole), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "a", &whole), SLUICE_OK);
    assert_int_equal(sluice_release(whole), SLUICE_OK); /* cached, evictable */
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.pool_in_use, 2048);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(sluice_acquire_part(m, "a", 0, 0, 2, &p0), SLUICE_OK);
    st = stats_of(m);
    assert_int_equal(st.pool_in_use, 1024);   /* the tensor evicted, the part held */
    assert_int_equal(st.evictions, 2);
    assert_int_equal(sluice_acquire_part(m, "a", 0, 1, 2, &p1), SLUICE_OK);
    assert_int_equal(stats_of(m).pool_in_use, 2048);
    size_t len;
    unsigned char *want = ref_part(f, 0, 0, 1, 2, &len);
    assert_memory_equal(sluice_tensor_data(p1), want, len);
    free(want);
    /* the pool is held by the two parts: a third is refused, not waited for */
    assert_int_equal(sluice_acquire_part(m, "a", 1, 0, 2, &p2), SLUICE_E_POOL_EXHAUSTED);
    assert_null(p2);
    if (!strstr(sluice_errmsg(m), "part 0 of 2 along dim 1 of tensor") ||
        !strstr(sluice_errmsg(m), "only their release can make room"))
        fail_msg("message: %s", sluice_errmsg(m));
    assert_int_equal(sluice_release(p0), SLUICE_OK);
    assert_int_equal(stats_of(m).pool_in_use, 1024);
    assert_int_equal(sluice_acquire_part(m, "a", 1, 0, 2, &p2), SLUICE_OK);
    want = ref_part(f, 0, 1, 0, 2, &len);
    assert_memory_equal(sluice_tensor_data(p2), want, len);
    free(want);
    assert_int_equal(sluice_release(p1), SLUICE_OK);
    assert_int_equal(sluice_release(p2), SLUICE_OK);
    st = stats_of(m);
    assert_int_equal(st.pool_in_use, 0);
    assert_int_equal(st.pool_high_water, 2048);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    m = open_pool(f, 1024);
    assert_int_equal(sluice_acquire_part(m, "a", 0, 0, 1, &p0), SLUICE_E_TOO_LARGE);
    assert_null(p0);
    assert_non_null(strstr(sluice_errmsg(m), "larger than the whole pool budget"));
    assert_int_equal(sluice_acquire_part(m, "a", 0, 1, 2, &p0), SLUICE_OK);
    assert_int_equal(sluice_release(p0), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* A part waiting for room gets it when the room comes back: a stream's
 * callback holds the whole pool (tensor "a") while it runs; another
 * thread's part acquire waits (room a callback holds comes back when it
 * returns), and is served once the callback has released it. */
typedef struct wait_ctx {
    sluice_model *m;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_callback, go, part_waits, part_done, rc;
    sluice_tensor *part;
} wait_ctx;

static void *part_waiter(void *p)
{
    wait_ctx *w = p;
    int rc = sluice_acquire_part(w->m, "a", 0, 1, 2, &w->part);
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->part_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int hold_cb(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
                   const char *message)
{
    (void)info;
    (void)message;
    wait_ctx *w = user;
    assert_int_equal(status, SLUICE_OK);
    pthread_mutex_lock(&w->mu);
    w->in_callback = 1;
    pthread_cond_broadcast(&w->cv);
    while (!w->go)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    sluice_release(t);
    return 0;
}

static void *streamer(void *p)
{
    wait_ctx *w = p;
    const char *names[] = {"a"};
    sluice_stream(w->m, names, 1, hold_cb, w);
    return NULL;
}

/* where 9 (engine_hooks.h): the part acquire waits for room, the engine's
 * lock held until its wait begins, so the release that follows wakes it */
static void at_part_wait(void *ctx, int where)
{
    wait_ctx *w = ctx;
    if (where != 9)
        return;
    pthread_mutex_lock(&w->mu);
    w->part_waits = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void test_part_waits_for_room(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    wait_ctx w = {.m = open_pool(f, 2048), .mu = PTHREAD_MUTEX_INITIALIZER,
                  .cv = PTHREAD_COND_INITIALIZER};
    assert_int_equal(sl_engine_set_pause(w.m, at_part_wait, &w), SLUICE_OK);
    pthread_t ts, tp;
    assert_int_equal(pthread_create(&ts, NULL, streamer, &w), 0);
    pthread_mutex_lock(&w.mu);
    while (!w.in_callback)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    /* the whole pool is "a"'s, held by the callback running: the part waits */
    assert_int_equal(pthread_create(&tp, NULL, part_waiter, &w), 0);
    pthread_mutex_lock(&w.mu);
    while (!w.part_waits && !w.part_done)
        pthread_cond_wait(&w.cv, &w.mu);
    int waited = w.part_waits;
    w.go = 1;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    pthread_join(tp, NULL);
    pthread_join(ts, NULL);
    assert_true(waited);   /* not served beside the callback's whole pool */
    assert_int_equal(w.rc, SLUICE_OK);
    size_t len;
    unsigned char *want = ref_part(f, 0, 0, 1, 2, &len);
    assert_memory_equal(sluice_tensor_data(w.part), want, len);
    free(want);
    assert_int_equal(sluice_release(w.part), SLUICE_OK);
    assert_int_equal(sluice_close(w.m), SLUICE_OK);
}

/* A part acquire waiting for room, its token requested: it stops waiting
 * at once (the callback still holds the pool), says SLUICE_E_CANCELLED,
 * gives no handle, takes no room and is no failure. */
typedef struct cancel_wait {
    wait_ctx w;
    sluice_cancel *c;
} cancel_wait;

static void *part_waiter_cancellable(void *p)
{
    cancel_wait *cw = p;
    sluice_part_options po;
    sluice_part_options_init(&po);
    po.cancel = cw->c;
    cw->w.part = (sluice_tensor *)cw; /* set to NULL on failure */
    int rc = sluice_acquire_part_ex(cw->w.m, "a", 0, 1, 2, &cw->w.part, &po);
    pthread_mutex_lock(&cw->w.mu);
    cw->w.rc = rc;
    cw->w.part_done = 1;
    pthread_cond_broadcast(&cw->w.cv);
    pthread_mutex_unlock(&cw->w.mu);
    return NULL;
}

static void test_part_wait_cancelled(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    cancel_wait cw = {.w = {.m = open_pool(f, 2048), .mu = PTHREAD_MUTEX_INITIALIZER,
                            .cv = PTHREAD_COND_INITIALIZER}};
    wait_ctx *w = &cw.w;
    assert_int_equal(sluice_cancel_create(&cw.c), SLUICE_OK);
    assert_int_equal(sl_engine_set_pause(w->m, at_part_wait, w), SLUICE_OK);
    pthread_t ts, tp;
    assert_int_equal(pthread_create(&ts, NULL, streamer, w), 0);
    pthread_mutex_lock(&w->mu);
    while (!w->in_callback)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    struct sluice_stats st0 = {.size = sizeof st0};
    assert_int_equal(sluice_stats(w->m, &st0), SLUICE_OK);
    assert_int_equal(pthread_create(&tp, NULL, part_waiter_cancellable, &cw), 0);
    pthread_mutex_lock(&w->mu);
    while (!w->part_waits && !w->part_done)
        pthread_cond_wait(&w->cv, &w->mu);
    int waited = w->part_waits;
    pthread_mutex_unlock(&w->mu);
    assert_true(waited);
    sluice_cancel_request(cw.c); /* the callback still holds the whole pool */
    pthread_mutex_lock(&w->mu);
    while (!w->part_done)
        pthread_cond_wait(&w->cv, &w->mu);
    int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    assert_int_equal(rc, SLUICE_E_CANCELLED);
    assert_null(w->part);
    /* the callback still holds the pool: nothing taken, no failure */
    struct sluice_stats st1 = {.size = sizeof st1};
    assert_int_equal(sluice_stats(w->m, &st1), SLUICE_OK);
    assert_int_equal(st1.pool_in_use, st0.pool_in_use);
    assert_int_equal(st1.failures, st0.failures);
    pthread_mutex_lock(&w->mu);
    w->go = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(tp, NULL);
    pthread_join(ts, NULL);
    assert_int_equal(sl_engine_set_pause(w->m, NULL, NULL), SLUICE_OK);
    /* the model goes on: the same part, the token reset */
    sluice_cancel_reset(cw.c);
    sluice_part_options po;
    sluice_part_options_init(&po);
    po.cancel = cw.c;
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_part_ex(w->m, "a", 0, 1, 2, &t, &po), SLUICE_OK);
    size_t len;
    unsigned char *want = ref_part(f, 0, 0, 1, 2, &len);
    assert_memory_equal(sluice_tensor_data(t), want, len);
    free(want);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    sluice_cancel_free(cw.c);
    assert_int_equal(sluice_close(w->m), SLUICE_OK);
}

/* A part acquire waiting inside a stream callback holds its stream's room
 * as an acquire waiting there does (sluice.h, SLUICE_E_POOL_EXHAUSTED):
 * when no other room can come back, that part acquire alone is refused,
 * and an acquire waiting outside any callback goes on waiting and is
 * served once the callback has given its tensor back. Stream 1 holds "a"
 * (2048 bytes) in its callback, which then asks for a part that has no
 * room; stream 2 holds "b" (768 bytes: the pool is full) in its callback
 * meanwhile, so the part waits; a third thread acquires "c"; stream 2's
 * callback returns keeping "b" (a handle held outside the library). */
typedef struct hold2_ctx {
    sluice_model *m;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_cb1, in_cb2, go1, go2, part_waits, part_done, part_rc, c_done, c_rc, s1_done;
    int c_is_part, c_waits; /* the third thread asks for a part of "c" */
    sluice_tensor *b_held, *c;
} hold2_ctx;

static _Thread_local int third_thread;

/* Waits (mu held) until *flag, 10 s at most; 0 when it timed out. */
static int wait_flag(hold2_ctx *h, const int *flag)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    while (!*flag)
        if (pthread_cond_timedwait(&h->cv, &h->mu, &dl) != 0)
            return *flag;
    return 1;
}

static void set_flag(hold2_ctx *h, int *flag)
{
    pthread_mutex_lock(&h->mu);
    *flag = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static int part_in_cb(void *user, sluice_tensor *t, int status,
                      const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    (void)message;
    hold2_ctx *h = user;
    if (status != SLUICE_OK)
        return 0;
    pthread_mutex_lock(&h->mu);
    h->in_cb1 = 1;
    pthread_cond_broadcast(&h->cv);
    wait_flag(h, &h->go1);
    pthread_mutex_unlock(&h->mu);
    sluice_tensor *p = NULL;
    int rc = sluice_acquire_part(h->m, "a", 0, 1, 2, &p);
    if (p)
        sluice_release(p);
    sluice_release(t);
    pthread_mutex_lock(&h->mu);
    h->part_rc = rc;
    h->part_done = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

static int keep_cb(void *user, sluice_tensor *t, int status,
                   const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    (void)message;
    hold2_ctx *h = user;
    pthread_mutex_lock(&h->mu);
    h->b_held = status == SLUICE_OK ? t : NULL;
    h->in_cb2 = 1;
    pthread_cond_broadcast(&h->cv);
    wait_flag(h, &h->go2);
    pthread_mutex_unlock(&h->mu);
    return 0; /* "b" kept: released by the test, later */
}

static void *stream_a(void *p)
{
    hold2_ctx *h = p;
    const char *names[] = {"a"};
    sluice_stream(h->m, names, 1, part_in_cb, h);
    set_flag(h, &h->s1_done);
    return NULL;
}

static void *stream_b(void *p)
{
    hold2_ctx *h = p;
    const char *names[] = {"b"};
    sluice_stream(h->m, names, 1, keep_cb, h);
    return NULL;
}

static void *acquire_c(void *p)
{
    hold2_ctx *h = p;
    third_thread = 1;
    int rc = h->c_is_part ? sluice_acquire_part(h->m, "c", 1, 0, 2, &h->c)
                          : sluice_acquire(h->m, "c", &h->c);
    pthread_mutex_lock(&h->mu);
    h->c_rc = rc;
    h->c_done = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void at_part_wait2(void *ctx, int where)
{
    hold2_ctx *h = ctx;
    if (where == 9)
        set_flag(h, third_thread ? &h->c_waits : &h->part_waits);
}

static void part_in_callback_refused_alone(fx *f, int c_is_part)
{
    write_manifest(f, 1, NULL);
    hold2_ctx h = {.m = open_pool(f, 2048 + 768), .mu = PTHREAD_MUTEX_INITIALIZER,
                   .cv = PTHREAD_COND_INITIALIZER, .c_is_part = c_is_part};
    assert_int_equal(sl_engine_set_pause(h.m, at_part_wait2, &h), SLUICE_OK);
    pthread_t t1, t2, tc;
    assert_int_equal(pthread_create(&t1, NULL, stream_a, &h), 0);
    pthread_mutex_lock(&h.mu);
    assert_true(wait_flag(&h, &h.in_cb1));
    pthread_mutex_unlock(&h.mu);
    assert_int_equal(pthread_create(&t2, NULL, stream_b, &h), 0);
    pthread_mutex_lock(&h.mu);
    assert_true(wait_flag(&h, &h.in_cb2));
    assert_non_null(h.b_held);
    /* the part waits: stream 2's callback runs, its room may come back */
    h.go1 = 1;
    pthread_cond_broadcast(&h.cv);
    assert_true(wait_flag(&h, &h.part_waits));
    pthread_mutex_unlock(&h.mu);
    /* "c" (or its part) waits too (acquire_count is counted under the
     * engine's lock, which the acquire holds until it waits) */
    assert_int_equal(pthread_create(&tc, NULL, acquire_c, &h), 0);
    for (int k = 0; !c_is_part && k < 10000 && stats_of(h.m).acquire_count == 0; k++)
        usleep(1000);
    pthread_mutex_lock(&h.mu);
    if (c_is_part)
        assert_true(wait_flag(&h, &h.c_waits));
    assert_false(h.c_done);
    /* stream 2's callback returns holding "b": only stream 1's room can
     * come back, once its callback's part acquire has been refused */
    h.go2 = 1;
    pthread_cond_broadcast(&h.cv);
    int ended = wait_flag(&h, &h.c_done) && wait_flag(&h, &h.part_done) &&
                wait_flag(&h, &h.s1_done);
    pthread_mutex_unlock(&h.mu);
    if (!ended)
        fail_msg("a wait did not end (c %d, part %d, stream 1 %d)", h.c_done, h.part_done,
                 h.s1_done);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_join(tc, NULL);
    assert_int_equal(h.part_rc, SLUICE_E_POOL_EXHAUSTED);
    if (h.c_rc != SLUICE_OK)
        fail_msg("\"c\"%s, acquired outside any callback, failed (%d) although stream 1's "
                 "room came back once its part acquire was refused",
                 c_is_part ? "'s part" : "", h.c_rc);
    if (c_is_part) {
        size_t len;
        unsigned char *want = ref_part(f, 2, 1, 0, 2, &len);
        assert_memory_equal(sluice_tensor_data(h.c), want, len);
        free(want);
    } else {
        assert_memory_equal(sluice_tensor_data(h.c), f->bytes + f->off[2], f->nbytes[2]);
    }
    assert_int_equal(sluice_release(h.c), SLUICE_OK);
    assert_int_equal(sluice_release(h.b_held), SLUICE_OK);
    assert_int_equal(sluice_close(h.m), SLUICE_OK);
}

static void test_part_in_callback_refused_alone(void **state)
{
    part_in_callback_refused_alone(*state, 0);
}

/* The same with a part of "c" waiting outside any callback: whichever of
 * the two part acquires wakes first, the one in the callback alone is
 * refused. */
static void test_part_outside_callback_served(void **state)
{
    for (int k = 0; k < 20; k++)
        part_in_callback_refused_alone(*state, 1);
}

typedef struct race_arg {
    fx *f;
    sluice_model *m;
    uint64_t rank;
    int bad;
} race_arg;

static void *race_worker(void *p)
{
    race_arg *a = p;
    for (size_t j = 0; j < NT; j++)
        for (unsigned dim = 0; dim < T[j].ndim; dim++) {
            if (T[j].shape[dim] % 4)
                continue;
            size_t len;
            unsigned char *want = ref_part(a->f, j, dim, a->rank, 4, &len);
            unsigned char *got = malloc(len + 1);
            if (!got || sluice_read_part_into(a->m, T[j].name, dim, a->rank, 4, got, len) != 0 ||
                memcmp(got, want, len) != 0 || !sluice_part_note(a->m))
                a->bad = 1;
            free(got);
            free(want);
        }
    return NULL;
}

/* Four threads, one rank each, on one model without part digests: every
 * part right, the note written once and readable from any thread (run
 * under TSan by the sanitizer job). */
static void test_ranks_on_threads(void **state)
{
    fx *f = *state;
    write_manifest(f, 0, NULL);
    sluice_model *m = open_model(f, 1);
    pthread_t tid[4];
    race_arg args[4];
    for (int k = 0; k < 4; k++) {
        args[k] = (race_arg){.f = f, .m = m, .rank = (uint64_t)k};
        assert_int_equal(pthread_create(&tid[k], NULL, race_worker, &args[k]), 0);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(tid[k], NULL);
        assert_false(args[k].bad);
    }
    assert_non_null(strstr(sluice_part_note(m), "of 4 of tensor \"a\""));
    sluice_close(m);
}

/* Every field of "parts" is read strictly. */
static void test_parts_rejected(void **state)
{
    fx *f = *state;
    static const struct {
        const char *parts;
        int code;
        const char *msg;
    } cases[] = {
        {"[1]", SLUICE_E_MANIFEST_FORMAT, "is not an object"},
        {"{\"dim\": 1}", SLUICE_E_MANIFEST_FORMAT, "has no \"digests\""},
        {"{\"digests\": {}}", SLUICE_E_MANIFEST_FORMAT, "has no \"dim\""},
        {"{\"dim\": 1, \"digests\": {}, \"n\": [2]}", SLUICE_E_MANIFEST_FORMAT, "unknown key"},
        {"{\"dim\": 1, \"dim\": 1, \"digests\": {}}", SLUICE_E_MANIFEST_DUPLICATE, "twice"},
        {"{\"dim\": 3, \"digests\": {}}", SLUICE_E_MANIFEST_FORMAT, "a dim of the tensor"},
        {"{\"dim\": 1.5, \"digests\": {}}", SLUICE_E_MANIFEST_FORMAT, "a dim of the tensor"},
        {"{\"dim\": \"1\", \"digests\": {}}", SLUICE_E_MANIFEST_FORMAT, "a dim of the tensor"},
        {"{\"dim\": 1, \"digests\": {}}", SLUICE_E_MANIFEST_FORMAT, "an object of world sizes"},
        {"{\"dim\": 1, \"digests\": [1]}", SLUICE_E_MANIFEST_FORMAT, "an object of world sizes"},
        {"{\"dim\": 1, \"digests\": {\"1\": [\"x\"]}}", SLUICE_E_MANIFEST_FORMAT, "not a world size"},
        {"{\"dim\": 1, \"digests\": {\"02\": []}}", SLUICE_E_MANIFEST_FORMAT, "not a world size"},
        {"{\"dim\": 1, \"digests\": {\"two\": []}}", SLUICE_E_MANIFEST_FORMAT, "not a world size"},
        {"{\"dim\": 1, \"digests\": {\"-2\": []}}", SLUICE_E_MANIFEST_FORMAT, "not a world size"},
        {"{\"dim\": 1, \"digests\": {\"3\": []}}", SLUICE_E_MANIFEST_FORMAT, "does not split"},
        {"{\"dim\": 1, \"digests\": {\"2\": [\"D\"]}}", SLUICE_E_MANIFEST_FORMAT, "array of 2"},
        {"{\"dim\": 1, \"digests\": {\"2\": \"D\"}}", SLUICE_E_MANIFEST_FORMAT, "array of 2"},
        {"{\"dim\": 1, \"digests\": {\"2\": [\"D\", \"zz\"]}}", SLUICE_E_MANIFEST_DIGEST,
         "digest of part 1 of 2"},
        {"{\"dim\": 1, \"digests\": {\"2\": [\"D\", 7]}}", SLUICE_E_MANIFEST_DIGEST, "a number"},
        {"{\"dim\": 1, \"digests\": {\"2\": [\"D\", \"D\"], \"2\": [\"D\", \"D\"]}}",
         SLUICE_E_MANIFEST_DUPLICATE, "world 2 twice"},
    };
    char d[65];
    mf_fake_digest(7, d);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char parts[512];
        size_t o = 0;
        for (const char *c = cases[k].parts; *c && o + 65 < sizeof parts; c++)
            if (*c == 'D' && c[-1] == '"' && c[1] == '"') {
                memcpy(parts + o, d, 64);
                o += 64;
            } else {
                parts[o++] = *c;
            }
        parts[o] = '\0';
        write_manifest(f, 0, parts);
        sluice_model *m = NULL;
        int rc = try_open(f, 1, &m);
        if (rc != cases[k].code || !strstr(sluice_errmsg(m), cases[k].msg))
            fail_msg("case %zu (%s): %d %s, wanted %d with \"%s\"", k, parts, rc,
                     sluice_errmsg(m), cases[k].code, cases[k].msg);
        sluice_close(m);
    }
    sluice_model *m = NULL;
    /* a manifest whose parts are right opens */
    write_manifest(f, 1, NULL);
    assert_int_equal(try_open(f, 1, &m), SLUICE_OK);
    sluice_close(m);
}

/* The built-in rules on Llama naming; a rules text of its own. */
static void test_rules(void **state)
{
    (void)state;
    sluice_part_rules *r = NULL;
    char why[128];
    assert_int_equal(sluice_part_rules_parse(NULL, 0, &r, why, sizeof why), SLUICE_OK);
    static const struct {
        const char *name;
        uint32_t ndim;
        int dim;
    } cases[] = {
        {"model.layers.0.self_attn.q_proj.weight", 2, 0},
        {"model.layers.0.self_attn.k_proj.weight", 2, 0},
        {"model.layers.0.self_attn.v_proj.weight", 2, 0},
        {"model.layers.0.self_attn.q_proj.bias", 1, 0},     /* follows its weight */
        {"model.layers.0.self_attn.o_proj.weight", 2, 1},
        {"model.layers.0.self_attn.o_proj.bias", 1, SLUICE_PART_REPLICATED}, /* no dim 1 */
        {"model.layers.3.mlp.gate_proj.weight", 2, 0},
        {"model.layers.3.mlp.up_proj.weight", 2, 0},
        {"model.layers.3.mlp.down_proj.weight", 2, 1},
        {"model.embed_tokens.weight", 2, 0},
        {"lm_head.weight", 2, 0},
        {"model.norm.weight", 1, SLUICE_PART_REPLICATED},
        {"model.layers.0.input_layernorm.weight", 1, SLUICE_PART_REPLICATED},
        {"model.layers.0.post_attention_layernorm.weight", 1, SLUICE_PART_REPLICATED},
        {"model.rotary_emb.inv_freq", 1, SLUICE_PART_REPLICATED}, /* no rule */
        /* fused: a rank keeps a slice of each stacked matrix, which no one
         * part along dim 0 is (rank 0 of 2 would be all gate, no up) */
        {"model.layers.0.self_attn.qkv_proj.weight", 2, SLUICE_PART_REPLICATED},
        {"model.layers.0.mlp.gate_up_proj.weight", 2, SLUICE_PART_REPLICATED},
        {"model.layers.0.mlp.gate_up_proj.bias", 1, SLUICE_PART_REPLICATED},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int dim = 99;
        assert_int_equal(sluice_part_rules_dim(r, cases[k].name, cases[k].ndim, &dim), SLUICE_OK);
        if (dim != cases[k].dim)
            fail_msg("%s: dim %d, wanted %d", cases[k].name, dim, cases[k].dim);
    }
    sluice_part_rules_free(r);
    assert_non_null(strstr(sluice_part_rules_builtin(), "*.o_proj.weight 1"));

    const char *own = "# mine\n*.o_proj.weight replicated\n\n  *.w2 1  # row\n* 0\n";
    assert_int_equal(sluice_part_rules_parse(own, strlen(own), &r, why, sizeof why), SLUICE_OK);
    int dim;
    assert_int_equal(sluice_part_rules_dim(r, "x.o_proj.weight", 2, &dim), SLUICE_OK);
    assert_int_equal(dim, SLUICE_PART_REPLICATED);
    assert_int_equal(sluice_part_rules_dim(r, "l.w2", 2, &dim), SLUICE_OK);
    assert_int_equal(dim, 1);
    assert_int_equal(sluice_part_rules_dim(r, "l.w2", 1, &dim), SLUICE_E_INVAL);
    assert_int_equal(sluice_part_rules_dim(r, "anything", 1, &dim), SLUICE_OK);
    assert_int_equal(dim, 0);
    assert_int_equal(sluice_part_rules_dim(r, "scalar", 0, &dim), SLUICE_OK);
    assert_int_equal(dim, SLUICE_PART_REPLICATED);
    assert_int_equal(sluice_part_rules_dim(NULL, "x", 1, &dim), SLUICE_E_INVAL);
    sluice_part_rules_free(r);
    sluice_part_rules_free(NULL);

    static const struct {
        const char *text, *why;
    } bad[] = {
        {"*.w", "line 1: a pattern without a dim"},
        {"a 0\n*.w 0 1", "line 2: more than a pattern and a dim"},
        {"*.w x", "line 1: the dim is not a number"},
        {"*.w 01", "line 1: the dim is not a number"},
        {"*.w 8", "line 1: the dim is past 7"},
        {"*.w -1", "line 1: the dim is not a number"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        r = (sluice_part_rules *)why;
        assert_int_equal(sluice_part_rules_parse(bad[k].text, strlen(bad[k].text), &r, why,
                                                 sizeof why), SLUICE_E_INVAL);
        assert_null(r);
        if (!strstr(why, bad[k].why))
            fail_msg("%s: \"%s\", wanted \"%s\"", bad[k].text, why, bad[k].why);
    }
    assert_int_equal(sluice_part_rules_parse("a\0 0", 4, &r, why, sizeof why), SLUICE_E_INVAL);
    /* at most 1024 lines: a file of 1024 newline-ended lines is taken
     * (before: its last newline counted a 1025th line), 1025 are not */
    size_t cap = 1025 * 4 + 1, n = 0;
    char *many = malloc(cap);
    assert_non_null(many);
    for (int k = 0; k < 1024; k++)
        n += (size_t)snprintf(many + n, cap - n, "a %d\n", k % 8);
    if (sluice_part_rules_parse(many, n, &r, why, sizeof why) != SLUICE_OK)
        fail_msg("1024 lines: %s", why);
    assert_int_equal(sluice_part_rules_dim(r, "a", 8, &dim), SLUICE_OK);
    assert_int_equal(dim, 0);
    sluice_part_rules_free(r);
    assert_int_equal(sluice_part_rules_parse(many, n - 1, &r, why, sizeof why), SLUICE_OK);
    sluice_part_rules_free(r);
    n += (size_t)snprintf(many + n, cap - n, "b 1");
    assert_int_equal(sluice_part_rules_parse(many, n, &r, why, sizeof why), SLUICE_E_INVAL);
    assert_non_null(strstr(why, "more than 1024 lines"));
    free(many);
    assert_int_equal(sluice_part_rules_parse(NULL, 0, NULL, NULL, 0), SLUICE_E_INVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_part_unchecked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_part_whole_digests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_part_part_digests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_packed_parts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flip_inside_rank3, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flip_outside_rank0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bytes_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_in_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_waits_for_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_wait_cancelled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_in_callback_refused_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_outside_callback_served, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ranks_on_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parts_rejected, setup, teardown),
        cmocka_unit_test(test_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
