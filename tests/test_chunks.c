/* test_chunks.c: chunk digests (version 2 "chunk_bytes" and "chunks"),
 * verified ranges and reads into the caller's memory.
 *
 * The model holds one large tensor "big" (BIG bytes, chunk digests of
 * CHUNK bytes, the last chunk shorter) and a small one without chunks.
 * The manifest is written here with OpenSSL's one-shot SHA-256 over the
 * file's bytes, independently of the library. Checked: a chunked tensor
 * loads through the pipeline with its chunks hashed on several workers
 * (the stats say how many at once); one flipped byte in chunk k fails a
 * range covering k, the whole tensor and a stream, and not a range
 * elsewhere; sluice_read_into fills unaligned buffers, reads only the
 * covering chunks, loads a tensor four times the pool, and without chunk
 * digests reads and checks the whole tensor; sluice_acquire_range hands
 * out exactly the range; every chunk field is read strictly. */
#include "mf_fixture.h"
#include "util.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#define CHUNK ((uint64_t)1 << 20)
#define BIG (48 * CHUNK + 12345)
#define SMALL 100
#define NCHUNKS (48 + 1)

typedef struct fx {
    char *dir, *model, *manifest;
    unsigned char *bytes;  /* the data section: big, then small */
    uint64_t data_start;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = mf_scratch(&f->model, "model.safetensors", &f->manifest, "m.json");
    char header[256];
    snprintf(header, sizeof header,
             "{\"big\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]},"
             "\"small\":{\"dtype\":\"U8\",\"shape\":[%d],\"data_offsets\":[%llu,%llu]}}",
             (unsigned long long)BIG, (unsigned long long)BIG, SMALL, (unsigned long long)BIG,
             (unsigned long long)(BIG + SMALL));
    f->bytes = mf_write_hashed_model(f->model, header, BIG + SMALL, &f->data_start);
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

/* The version 2 manifest of the model, big with its chunk digests (or
 * without: chunks 0), with extra text after big's entry keys. */
static void write_manifest(fx *f, int chunks, const char *big_extra)
{
    char big[65], small[65], h[65];
    mf_hex_of(f->bytes, BIG, big);
    mf_hex_of(f->bytes + BIG, SMALL, small);
    mf_buf m = {0};
    mf_addf(&m, MF_V2_HEAD "  \"big\": {\"digest\": \"%s\", \"dtype\": \"U8\", \"shape\": [%llu], "
                "\"nbytes\": %llu",
            big, (unsigned long long)BIG, (unsigned long long)BIG);
    if (chunks) {
        mf_addf(&m, ", \"chunk_bytes\": %llu, \"chunks\": [", (unsigned long long)CHUNK);
        for (uint64_t k = 0; k < NCHUNKS; k++) {
            uint64_t lo = k * CHUNK, hi = lo + CHUNK < BIG ? lo + CHUNK : BIG;
            mf_hex_of(f->bytes + lo, (size_t)(hi - lo), h);
            mf_addf(&m, "%s\"%s\"", k ? ", " : "", h);
        }
        mf_addf(&m, "]");
    }
    mf_addf(&m, "%s},\n  \"small\": {\"digest\": \"%s\", \"dtype\": \"U8\", \"shape\": [%d], "
                "\"nbytes\": %d}},\n",
            big_extra ? big_extra : "", small, SMALL, SMALL);
    mf_v2_files(&m, f->model, "model.safetensors", f->data_start);
    mf_write_text(f->manifest, m.p);
    mf_buf_free(&m);
}

static sluice_model *open_model(const fx *f, uint64_t pool, unsigned hash_threads)
{
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = f->manifest;
    if (pool)
        o.pool_bytes = pool;
    o.hash_threads = hash_threads;
    sluice_model *m = NULL;
    int rc = sluice_open(f->model, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    return m;
}

static struct sluice_stats stats_of(sluice_model *m)
{
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    return st;
}

/* Flips the byte at tensor offset `at` of big in the file (not in
 * f->bytes, which stays the truth). */
static void flip_big(fx *f, uint64_t at)
{
    mf_flip_byte(f->model, f->data_start + at);
}

/* ---------------------------------------------------------------- loading */

static void chunked_tensor_loads_on_several_workers(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 0, 4);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(t), BIG);
    assert_memory_equal(sluice_tensor_data(t), f->bytes, BIG);
    /* the whole digest reported is the manifest's */
    uint8_t d[32], want[32];
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
    mf_sha256(f->bytes, BIG, want);
    assert_memory_equal(d, want, 32);
    sluice_release(t);
    uint64_t cb = 0;
    uint32_t cn = 0;
    assert_int_equal(sluice_manifest_chunks(m, 0, &cb, &cn), SLUICE_OK);
    assert_int_equal(cb, CHUNK);
    assert_int_equal(cn, NCHUNKS);
    assert_int_equal(sluice_manifest_chunks(m, 1, &cb, &cn), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_manifest_chunks(m, 2, &cb, &cn), SLUICE_E_INVAL);
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.chunks_verified, NCHUNKS);
    assert_true(st.tensors_verified >= 1); /* small may have been read along */
    assert_true(st.bytes_hashed == BIG || st.bytes_hashed == BIG + SMALL);
    print_message("hash workers on big at once: %u\n", (unsigned)st.hash_parallel_peak);
    assert_true(st.hash_parallel_peak >= 2);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* one hashing thread: the same result, one worker */
    m = open_model(f, 0, 1);
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_OK);
    sluice_release(t);
    st = stats_of(m);
    assert_int_equal(st.chunks_verified, NCHUNKS);
    assert_int_equal(st.hash_parallel_peak, 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

typedef struct seen {
    int failed, named; /* failures, and those whose message names chunk 17 */
} seen;

/* No assertion in here: a failed one would jump out of the stream. */
static int count_cb(void *user, sluice_tensor *t, int status,
                    const struct sluice_tensor_info *info, const char *message)
{
    seen *s = user;
    if (status != SLUICE_OK) {
        s->failed++;
        s->named += message && strstr(message, "chunk 17 of 49") != NULL;
    }
    sluice_release(t);
    (void)info;
    return 0;
}

static void flipped_chunk_fails_only_what_covers_it(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    uint64_t at = 17 * CHUNK + 5;
    flip_big(f, at);
    sluice_model *m = open_model(f, 0, 2);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_E_CHECKSUM);
    assert_null(t);
    assert_non_null(strstr(sluice_errmsg(m), "mismatch in chunk 17 of 49 (tensor bytes 17825792..18874368)"));
    seen s = {0};
    assert_int_equal(sluice_stream(m, NULL, 0, count_cb, &s), SLUICE_E_CHECKSUM);
    assert_int_equal(s.failed, 1);
    assert_int_equal(s.named, 1);

    unsigned char *buf = malloc(8 * CHUNK);
    assert_non_null(buf);
    /* chunks 10..16 and 18..: not covering 17, they load */
    assert_int_equal(sluice_read_into(m, "big", 10 * CHUNK + 3, buf + 1, 7 * CHUNK - 3), SLUICE_OK);
    assert_memory_equal(buf + 1, f->bytes + 10 * CHUNK + 3, 7 * CHUNK - 3);
    assert_int_equal(sluice_read_into(m, "big", 18 * CHUNK, buf, 4 * CHUNK), SLUICE_OK);
    assert_memory_equal(buf, f->bytes + 18 * CHUNK, 4 * CHUNK);
    /* one byte of chunk 17, even one that is not the flipped one */
    assert_int_equal(sluice_read_into(m, "big", 17 * CHUNK + 100, buf, 1), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "mismatch in chunk 17 of 49"));
    assert_int_equal(sluice_read_into(m, "big", 16 * CHUNK, buf, 2 * CHUNK), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_acquire_range(m, "big", 17 * CHUNK - 1, 17 * CHUNK + 1, &t),
                     SLUICE_E_CHECKSUM);
    assert_null(t);
    assert_int_equal(sluice_acquire_range(m, "big", 16 * CHUNK - 1, 17 * CHUNK, &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(t), CHUNK + 1);
    assert_memory_equal(sluice_tensor_data(t), f->bytes + 16 * CHUNK - 1, CHUNK + 1);
    sluice_release(t);
    struct sluice_stats st = stats_of(m);
    assert_true(st.checksum_failures >= 4);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

typedef struct vf_seen {
    int big_status, named;
    uint8_t big_digest[32];
    int big_has_digest;
} vf_seen;

static int on_item(void *user, const struct sluice_verify_item *it)
{
    vf_seen *v = user;
    if (it->kind == SLUICE_VERIFY_ITEM_TENSOR && it->index == 0) {
        v->big_status = it->status;
        v->named = it->message && strstr(it->message, "mismatch in chunk 17 of 49") != NULL;
        v->big_has_digest = it->has_digest;
        memcpy(v->big_digest, it->digest, 32);
    }
    return 0;
}

/* sluice_verify checks chunk digests as loading does, in its plain pass
 * and in its fused one (whole files with one thread). */
static void verify_checks_chunks(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    uint8_t want[32];
    mf_sha256(f->bytes, BIG, want);
    for (int flipped = 0; flipped < 2; flipped++) {
        if (flipped)
            flip_big(f, 17 * CHUNK + 77);
        for (int fused = 0; fused < 2; fused++) {
            sluice_model *m = open_model(f, 0, 0);
            vf_seen v = {0};
            sluice_verify_options vo;
            sluice_verify_options_init(&vo);
            vo.on_item = on_item;
            vo.user = &v;
            vo.threads = fused ? 1 : 2;
            vo.flags = fused ? SLUICE_VF_FILES : 0;
            int rc = sluice_verify(m, NULL, 0, &vo, NULL);
            if (!flipped) {
                assert_int_equal(rc, SLUICE_OK);
                assert_int_equal(v.big_status, SLUICE_OK);
                assert_true(v.big_has_digest);
                assert_memory_equal(v.big_digest, want, 32);
            } else {
                assert_int_equal(v.big_status, SLUICE_E_CHECKSUM);
                assert_true(v.named);
            }
            assert_int_equal(sluice_close(m), SLUICE_OK);
        }
    }
}

/* Changes hex digit `digit` of the digest that follows `key` in the
 * manifest (skipping `skip` digests of a list). */
static void alter_digest(fx *f, const char *key, int skip, int digit)
{
    size_t len = 0;
    char *text = tu_read_file(f->manifest, &len);
    assert_non_null(text);
    char *p = strstr(text, key);
    assert_non_null(p);
    p += strlen(key) + (size_t)skip * (66 + 2) + 1; /* "hex", "hex", ... */
    assert_true(p + 64 < text + len && p[-1] == '"' && p[64] == '"');
    p[digit] = p[digit] == '0' ? '1' : '0';
    tu_write_file(f->manifest, text, len);
    free(text);
}

/* A manifest digest right but for byte 16 or 31 (the last): a chunk's,
 * seen by the pipeline and by sluice_read_into, and the whole tensor's,
 * seen by sluice_read_into. Every byte of a digest is compared. */
static void every_digest_byte_is_compared(void **state)
{
    fx *f = *state;
    static const int digit[] = {32, 63};
    unsigned char *buf = malloc(CHUNK);
    assert_non_null(buf);
    for (size_t d = 0; d < 2; d++) {
        write_manifest(f, 1, NULL);
        alter_digest(f, "\"chunks\": [", 5, digit[d]);
        sluice_model *m = open_model(f, 0, 2);
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_E_CHECKSUM);
        assert_non_null(strstr(sluice_errmsg(m), "chunk 5 of 49"));
        assert_int_equal(sluice_read_into(m, "big", 5 * CHUNK + 1, buf, 10), SLUICE_E_CHECKSUM);
        assert_non_null(strstr(sluice_errmsg(m), "chunk 5 of 49"));
        assert_int_equal(sluice_read_into(m, "big", 6 * CHUNK, buf, 10), SLUICE_OK);
        assert_int_equal(sluice_close(m), SLUICE_OK);

        write_manifest(f, 0, NULL);
        alter_digest(f, "\"big\": {\"digest\": ", 0, digit[d]);
        m = open_model(f, 0, 2);
        assert_int_equal(sluice_read_into(m, "big", 0, buf, 10), SLUICE_E_CHECKSUM);
        assert_non_null(strstr(sluice_errmsg(m), "mismatch in the whole tensor"));
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    free(buf);
}

/* The same chunked load through O_DIRECT (the tensor starts off a block
 * edge: its bytes are found inside the aligned span and moved) and the
 * pread backend; then a byte of the short last chunk flipped. */
static void chunked_load_direct_and_pread(void **state)
{
    fx *f = *state;
    static const uint32_t flags[] = {SLUICE_F_DIRECT, SLUICE_F_FORCE_PREAD,
                                     SLUICE_F_DIRECT | SLUICE_F_FORCE_PREAD};
    for (int flipped = 0; flipped < 2; flipped++) {
        write_manifest(f, 1, NULL);
        if (flipped)
            flip_big(f, BIG - 3);
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
            sluice_options o;
            sluice_options_init(&o);
            o.manifest_path = f->manifest;
            o.hash_threads = 3;
            o.flags = flags[k];
            sluice_model *m = NULL;
            if (sluice_open(f->model, &o, &m) != SLUICE_OK)
                fail_msg("open: %s", sluice_errmsg(m));
            sluice_tensor *t = NULL;
            int rc = sluice_acquire(m, "big", &t);
            if (flipped) {
                assert_int_equal(rc, SLUICE_E_CHECKSUM);
                assert_non_null(strstr(sluice_errmsg(m), "chunk 48 of 49"));
            } else {
                assert_int_equal(rc, SLUICE_OK);
                assert_memory_equal(sluice_tensor_data(t), f->bytes, BIG);
                sluice_release(t);
                assert_int_equal(stats_of(m).chunks_verified, NCHUNKS);
            }
            assert_int_equal(sluice_acquire(m, "small", &t), SLUICE_OK);
            assert_memory_equal(sluice_tensor_data(t), f->bytes + BIG, SMALL);
            sluice_release(t);
            assert_int_equal(sluice_close(m), SLUICE_OK);
        }
        if (flipped)
            flip_big(f, BIG - 3);
    }
}

/* ---------------------------------------------------------------- read_into */

static void read_into_reads_the_covering_chunks(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 0, 0);
    unsigned char *buf = malloc(BIG + 7);
    assert_non_null(buf);
    /* the whole tensor, at an odd address */
    assert_int_equal(sluice_read_into(m, "big", 0, buf + 7, BIG), SLUICE_OK);
    assert_memory_equal(buf + 7, f->bytes, BIG);
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.bytes_read, BIG);
    assert_int_equal(st.chunks_verified, NCHUNKS);
    /* one eighth, not on chunk edges: only the covering chunks are read */
    uint64_t begin = BIG / 8 * 3 + 999, len = BIG / 8;
    memset(buf, 0xAA, BIG + 7);
    assert_int_equal(sluice_read_into(m, "big", begin, buf + 3, len), SLUICE_OK);
    assert_memory_equal(buf + 3, f->bytes + begin, len);
    /* nothing around the range was written */
    assert_int_equal(buf[2], 0xAA);
    assert_int_equal(buf[3 + len], 0xAA);
    struct sluice_stats st2 = stats_of(m);
    uint64_t read = st2.bytes_read - st.bytes_read;
    uint64_t k0 = begin / CHUNK, k1 = (begin + len - 1) / CHUNK;
    assert_int_equal(read, (k1 - k0 + 1) * CHUNK);
    print_message("1/8 of big: %llu bytes asked, %llu read (%.3f of the tensor)\n",
                  (unsigned long long)len, (unsigned long long)read, (double)read / BIG);
    assert_true(read <= len + 2 * CHUNK);
    /* the short last chunk; and nothing at all */
    assert_int_equal(sluice_read_into(m, "big", BIG - 10, buf, 10), SLUICE_OK);
    assert_memory_equal(buf, f->bytes + BIG - 10, 10);
    assert_int_equal(sluice_read_into(m, "big", BIG, buf, 0), SLUICE_OK);
    assert_int_equal(sluice_read_into(m, "big", 5, NULL, 0), SLUICE_OK);
    /* a tensor without chunk digests: read whole for any range */
    st = stats_of(m);
    assert_int_equal(sluice_read_into(m, "small", 50, buf, 10), SLUICE_OK);
    assert_memory_equal(buf, f->bytes + BIG + 50, 10);
    st2 = stats_of(m);
    assert_int_equal(st2.bytes_read - st.bytes_read, SMALL);
    /* faults */
    assert_int_equal(sluice_read_into(m, "big", BIG - 10, buf, 11), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "outside tensor \"big\""));
    assert_int_equal(sluice_read_into(m, "big", UINT64_MAX, buf, 2), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_into(m, "big", 0, NULL, 1), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_into(m, "nope", 0, buf, 1), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_read_into(m, NULL, 0, buf, 1), SLUICE_E_INVAL);
    assert_int_equal(sluice_read_into(NULL, "big", 0, buf, 1), SLUICE_E_INVAL);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Four times the pool: acquire cannot, read_into can. */
static void read_into_needs_no_pool_room(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, BIG / 4, 0);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_E_TOO_LARGE);
    unsigned char *buf = malloc(BIG);
    assert_non_null(buf);
    assert_int_equal(sluice_read_into(m, "big", 0, buf, BIG), SLUICE_OK);
    assert_memory_equal(buf, f->bytes, BIG);
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.pool_high_water, 0);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Without chunk digests the whole tensor is read and checked: a flipped
 * byte anywhere fails any range. */
static void whole_digest_checks_the_whole(void **state)
{
    fx *f = *state;
    write_manifest(f, 0, NULL);
    flip_big(f, BIG - 1);
    sluice_model *m = open_model(f, 0, 0);
    unsigned char buf[16];
    assert_int_equal(sluice_read_into(m, "big", 0, buf, sizeof buf), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "mismatch in the whole tensor"));
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.bytes_read, BIG);
    assert_int_equal(st.chunks_verified, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* No manifest: the bytes, unverified. */
static void unchecked_tensor_reads_plainly(void **state)
{
    fx *f = *state;
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(f->model, &o, &m), SLUICE_OK);
    unsigned char buf[64];
    assert_int_equal(sluice_read_into(m, "big", 1000, buf, sizeof buf), SLUICE_OK);
    assert_memory_equal(buf, f->bytes + 1000, sizeof buf);
    struct sluice_stats st = stats_of(m);
    assert_int_equal(st.bytes_read, sizeof buf);
    assert_int_equal(st.bytes_hashed, 0);
    /* the digest of a range, as the file holds it */
    uint8_t d[32], want[32];
    assert_int_equal(sluice_digest_range(m, 0, 5, 5 + CHUNK, d), SLUICE_OK);
    mf_sha256(f->bytes + 5, CHUNK, want);
    assert_memory_equal(d, want, 32);
    assert_int_equal(sluice_digest_range(m, 0, 5, BIG + 1, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_digest_range(m, 0, 6, 5, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_digest_range(m, 2, 0, 0, d), SLUICE_E_INVAL);
    assert_int_equal(sluice_digest_range(m, 0, 0, 0, NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* ---------------------------------------------------------------- ranges */

static void acquire_range_hands_out_the_range(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 0, 0);
    sluice_tensor *t = NULL, *u = NULL;
    assert_int_equal(sluice_acquire_range(m, "big", 3 * CHUNK + 1, 5 * CHUNK + 2, &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(t), 2 * CHUNK + 1);
    assert_int_equal((uintptr_t)sluice_tensor_data(t) % 64, 0);
    assert_memory_equal(sluice_tensor_data(t), f->bytes + 3 * CHUNK + 1, 2 * CHUNK + 1);
    assert_string_equal(sluice_tensor_info(t)->name, "big");
    uint8_t d[32];
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_E_INVAL);
    /* an empty range; the whole small tensor */
    assert_int_equal(sluice_acquire_range(m, "small", 7, 7, &u), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(u), 0);
    assert_non_null(sluice_tensor_data(u));
    sluice_release(u);
    assert_int_equal(sluice_acquire_range(m, "small", 0, SMALL, &u), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(u), f->bytes + BIG, SMALL);
    /* a live range handle holds the model open */
    assert_int_equal(sluice_close(m), SLUICE_E_BUSY);
    sluice_release(u);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sluice_release(t), SLUICE_E_INVAL);
    /* faults */
    assert_int_equal(sluice_acquire_range(m, "big", 5, 4, &t), SLUICE_E_INVAL);
    assert_null(t);
    assert_int_equal(sluice_acquire_range(m, "big", 0, BIG + 1, &t), SLUICE_E_INVAL);
    /* checked before any memory is taken for the range */
    assert_int_equal(sluice_acquire_range(m, "big", 0, UINT64_MAX, &t), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "outside tensor \"big\""));
    assert_int_equal(sluice_acquire_range(m, "big", 1, UINT64_MAX / 2, &t), SLUICE_E_INVAL);
    assert_int_equal(sluice_acquire_range(m, "none", 0, UINT64_MAX, &t), SLUICE_E_NOT_FOUND);
    assert_null(t);
    assert_int_equal(sluice_acquire_range(m, "none", 0, 1, &t), SLUICE_E_NOT_FOUND);
    assert_int_equal(sluice_acquire_range(m, "big", 0, 1, NULL), SLUICE_E_INVAL);
    /* a whole acquire of the same tensor still works beside ranges */
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(t), f->bytes, BIG);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* An empty range handle owns no buffer, yet it is no handle on the
 * tensor's slot: releasing it must not give back a reference that a
 * whole handle holds (the buffer would be evicted under that handle). */
static void empty_range_leaves_whole_handles_alone(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 0, 0);
    sluice_tensor *t = NULL, *u = NULL;
    assert_int_equal(sluice_acquire(m, "small", &t), SLUICE_OK);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(sluice_acquire_range(m, "small", 9, 9, &u), SLUICE_OK);
        assert_int_equal(sluice_release(u), SLUICE_OK);
    }
    uint64_t released = 0, evictions = stats_of(m).evictions;
    assert_int_equal(sluice_trim(m, &released), SLUICE_OK);
    /* small is held: trim leaves it, its bytes stay */
    assert_int_equal(stats_of(m).evictions, evictions);
    assert_memory_equal(sluice_tensor_data(t), f->bytes + BIG, SMALL);
    assert_int_equal(sluice_release(t), SLUICE_OK);
    /* and, released, it is cached as usual: the next acquire hits */
    struct sluice_stats st = stats_of(m);
    assert_int_equal(sluice_acquire(m, "small", &t), SLUICE_OK);
    assert_int_equal(stats_of(m).cache_hits, st.cache_hits + 1);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* ---------------------------------------------------------------- strictness */

static void expect_open_fault(fx *f, const char *big_extra, int code, const char *needle)
{
    write_manifest(f, 0, big_extra);
    sluice_options o;
    sluice_options_init(&o);
    o.manifest_path = f->manifest;
    sluice_model *m = NULL;
    int rc = sluice_open(f->model, &o, &m);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sluice_errmsg(m));
    sluice_close(m);
    if (rc != code)
        fail_msg("expected %d, got %d: %s\nextra: %s", code, rc, msg, big_extra);
    if (!strstr(msg, needle))
        fail_msg("message lacks \"%s\": %s", needle, msg);
}

static void chunk_fields_are_strict(void **state)
{
    fx *f = *state;
    char ok[65], list[49 * 68 + 64];
    mf_fake_digest(1, ok);
    size_t o = 0;
    for (int k = 0; k < NCHUNKS; k++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s\"%s\"", k ? ", " : "", ok);
    char extra[sizeof list + 128];
    snprintf(extra, sizeof extra, ", \"chunk_bytes\": %llu, \"chunks\": [%s, \"%s\"]",
             (unsigned long long)CHUNK, list, ok);
    expect_open_fault(f, extra, SLUICE_E_MANIFEST_FORMAT, "lists 50 chunk digests; its 50343993 bytes in chunks of 1048576 make 49");
    snprintf(extra, sizeof extra, ", \"chunk_bytes\": %llu, \"chunks\": [\"%s\"]",
             (unsigned long long)CHUNK, ok);
    expect_open_fault(f, extra, SLUICE_E_MANIFEST_FORMAT, "lists 1 chunk digests");
    expect_open_fault(f, ", \"chunk_bytes\": 1048576", SLUICE_E_MANIFEST_FORMAT, "no \"chunks\"");
    expect_open_fault(f, ", \"chunks\": []", SLUICE_E_MANIFEST_FORMAT, "no \"chunk_bytes\"");
    expect_open_fault(f, ", \"chunk_bytes\": 4095, \"chunks\": []", SLUICE_E_MANIFEST_FORMAT,
                      "\"chunk_bytes\" of tensor \"big\" is not an integer in 4096..2^53");
    expect_open_fault(f, ", \"chunk_bytes\": \"1M\", \"chunks\": []", SLUICE_E_MANIFEST_FORMAT,
                      "\"chunk_bytes\"");
    expect_open_fault(f, ", \"chunk_bytes\": 1048576, \"chunks\": {}", SLUICE_E_MANIFEST_FORMAT,
                      "\"chunks\" of tensor \"big\" is not an array of digests");
    snprintf(extra, sizeof extra, ", \"chunk_bytes\": %llu, \"chunks\": [%.*s, \"xyz\"]",
             (unsigned long long)CHUNK, (int)(o - 68), list);
    expect_open_fault(f, extra, SLUICE_E_MANIFEST_DIGEST, "digest of chunk 48 of tensor \"big\"");
    snprintf(extra, sizeof extra, ", \"chunk_bytes\": 1048576, \"chunk_bytes\": 1048576, \"chunks\": [%s]", list);
    expect_open_fault(f, extra, SLUICE_E_MANIFEST_DUPLICATE, "\"chunk_bytes\" twice");
    /* well-formed but wrong chunk digests: the open is fine, the load is not */
    snprintf(extra, sizeof extra, ", \"chunk_bytes\": %llu, \"chunks\": [%s]", (unsigned long long)CHUNK,
             list);
    write_manifest(f, 0, extra);
    sluice_model *m = open_model(f, 0, 0);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "big", &t), SLUICE_E_CHECKSUM);
    assert_non_null(strstr(sluice_errmsg(m), "chunk 0 of 49"));
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* ---------------------------------------------------------------- threads */

typedef struct racer {
    fx *f;
    sluice_model *m;
    unsigned seed;
    int bad;        /* wrong bytes or an unexpected status */
} racer;

/* read_into, acquire_range and acquire of big and small, in a loop, each
 * result compared with the truth. No assertion in here (threads). */
static void *race_main(void *arg)
{
    racer *r = arg;
    unsigned char *buf = malloc(3 * CHUNK + 64);
    if (!buf) {
        r->bad++;
        return NULL;
    }
    for (int k = 0; k < 12; k++) {
        uint64_t begin = (uint64_t)rand_r(&r->seed) % BIG;
        uint64_t len = (uint64_t)rand_r(&r->seed) % (2 * CHUNK);
        if (len > BIG - begin)
            len = BIG - begin;
        sluice_tensor *t = NULL;
        switch (k % 4) {
        case 0:
            if (sluice_read_into(r->m, "big", begin, buf + 1, len) != SLUICE_OK ||
                memcmp(buf + 1, r->f->bytes + begin, len) != 0)
                r->bad++;
            break;
        case 1:
            if (sluice_acquire_range(r->m, "big", begin, begin + len, &t) != SLUICE_OK ||
                sluice_tensor_size(t) != len || memcmp(sluice_tensor_data(t), r->f->bytes + begin, len) != 0)
                r->bad++;
            sluice_release(t);
            break;
        case 2:
            if (sluice_acquire(r->m, "big", &t) != SLUICE_OK ||
                memcmp(sluice_tensor_data(t), r->f->bytes, BIG) != 0)
                r->bad++;
            sluice_release(t);
            sluice_trim(r->m, NULL); /* the next acquire reads and hashes again */
            break;
        default:
            if (sluice_acquire(r->m, "small", &t) != SLUICE_OK ||
                memcmp(sluice_tensor_data(t), r->f->bytes + BIG, SMALL) != 0)
                r->bad++;
            sluice_release(t);
            break;
        }
    }
    free(buf);
    return NULL;
}

/* Many threads on one chunked model at once (TSan runs this too). */
static void ranges_and_loads_race(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    sluice_model *m = open_model(f, 4 * BIG, 4);
    enum { N = 4 };
    pthread_t th[N];
    racer r[N];
    for (int k = 0; k < N; k++) {
        r[k] = (racer){.f = f, .m = m, .seed = 1234u + (unsigned)k};
        assert_int_equal(pthread_create(&th[k], NULL, race_main, &r[k]), 0);
    }
    for (int k = 0; k < N; k++) {
        assert_int_equal(pthread_join(th[k], NULL), 0);
        assert_int_equal(r[k].bad, 0);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static int cancel_on_first(void *user, sluice_tensor *t, int status,
                           const struct sluice_tensor_info *info, const char *message)
{
    sluice_cancel_request(user);
    sluice_release(t);
    (void)status, (void)info, (void)message;
    return 0;
}

/* A stream cancelled while big's chunks hash (small first, big being read
 * ahead), then closed at once; again with close right after an acquire
 * of small while big hashes on the read-ahead. */
static void cancel_and_close_while_hashing(void **state)
{
    fx *f = *state;
    write_manifest(f, 1, NULL);
    for (int round = 0; round < 4; round++) {
        sluice_model *m = open_model(f, 4 * BIG, 4);
        sluice_cancel *c = NULL;
        assert_int_equal(sluice_cancel_create(&c), SLUICE_OK);
        sluice_stream_options so;
        sluice_stream_options_init(&so);
        so.cancel = c;
        const char *names[] = {"small", "big"};
        int rc = sluice_stream_ex(m, names, 2, cancel_on_first, c, &so);
        assert_true(rc == SLUICE_E_CANCELLED || rc == SLUICE_OK);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        sluice_cancel_free(c);

        m = open_model(f, 4 * BIG, 4);
        const char *order[] = {"small", "big"};
        assert_int_equal(sluice_prefetch(m, order, 2), SLUICE_OK);
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire(m, "small", &t), SLUICE_OK);
        sluice_release(t);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(chunked_tensor_loads_on_several_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(flipped_chunk_fails_only_what_covers_it, setup, teardown),
        cmocka_unit_test_setup_teardown(verify_checks_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(every_digest_byte_is_compared, setup, teardown),
        cmocka_unit_test_setup_teardown(chunked_load_direct_and_pread, setup, teardown),
        cmocka_unit_test_setup_teardown(read_into_reads_the_covering_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(read_into_needs_no_pool_room, setup, teardown),
        cmocka_unit_test_setup_teardown(whole_digest_checks_the_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(unchecked_tensor_reads_plainly, setup, teardown),
        cmocka_unit_test_setup_teardown(acquire_range_hands_out_the_range, setup, teardown),
        cmocka_unit_test_setup_teardown(empty_range_leaves_whole_handles_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(chunk_fields_are_strict, setup, teardown),
        cmocka_unit_test_setup_teardown(ranges_and_loads_race, setup, teardown),
        cmocka_unit_test_setup_teardown(cancel_and_close_while_hashing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
