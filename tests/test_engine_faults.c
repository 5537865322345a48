/* test_engine_faults.c: faults injected through the I/O seam (EIO, short
 * reads, EINTR, EAGAIN, O_DIRECT refused), a file that shrinks, and digest
 * mismatches: each gives a clean error for that tensor only, or success
 * after retries; never a hang; failures never stick. queue_depth 1 makes
 * the order of read attempts the order of the reads, so a fault hits the
 * read it aims at. Runs on both backends. */
#include "engine_fixture.h"

#include <errno.h>
#include <openssl/evp.h>
#include <unistd.h>

/* t000..: 200000 bytes (4 chunks of 64 KiB), then small ones. */
static const uint64_t sizes[] = {200000, 100, 200, 300, 400, 70000, 50};
#define NSIZES (sizeof sizes / sizeof sizes[0])

typedef struct fx {
    char *dir;
    char *file;
    sluice_model *m;
} fx;

static fx *fx_open(uint32_t flags, uint64_t chunk)
{
    fx *f = calloc(1, sizeof *f);
    f->dir = ef_model(1, sizes, NSIZES, 31);
    f->file = tu_join(f->dir, "model-00001-of-00001.safetensors");
    sluice_options o = ef_opts(4u << 20, chunk, flags);
    o.queue_depth = 1;
    f->m = ef_open(f->dir, &o);
    return f;
}

static void fx_close(fx *f)
{
    assert_int_equal(sluice_close(f->m), SLUICE_OK);
    tu_rmtree(f->dir);
    free(f->file);
    free(f->dir);
    free(f);
}

static int acquire_status(sluice_model *m, const char *name)
{
    sluice_tensor *t = NULL;
    int rc = sluice_acquire(m, name, &t);
    if (rc == SLUICE_OK) {
        ef_check_handle(t);
        assert_int_equal(sluice_release(t), SLUICE_OK);
    } else {
        assert_null(t);
    }
    return rc;
}

static void test_eio_one_tensor(void **state)
{
    (void)state;
    fx *f = fx_open(0, 64u << 10);
    assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_EIO, 2, 1), SLUICE_OK);
    assert_int_equal(acquire_status(f->m, "s0.t000"), SLUICE_E_IO);
    const char *msg = sluice_errmsg(f->m);
    assert_non_null(strstr(msg, "\"s0.t000\""));
    assert_non_null(strstr(msg, f->file));
    assert_non_null(strstr(msg, "offset"));
    assert_non_null(strstr(msg, strerror(EIO)));
    /* That tensor only: the others load, and it loads on the next try. */
    assert_int_equal(acquire_status(f->m, "s0.t003"), SLUICE_OK);
    assert_int_equal(acquire_status(f->m, "s0.t000"), SLUICE_OK);
    struct sluice_stats st = ef_stats(f->m);
    assert_int_equal(st.failures, 1);
    ef_check_orders(f->m, 2);
    fx_close(f);
}

static void retried(sl_io_fault kind, uint64_t count)
{
    fx *f = fx_open(0, 64u << 10);
    assert_int_equal(sl_engine_set_fault(f->m, kind, 1, count), SLUICE_OK);
    assert_int_equal(acquire_status(f->m, "s0.t000"), SLUICE_OK);
    struct sluice_stats st = ef_stats(f->m);
    assert_true(st.retries >= count);
    assert_int_equal(st.failures, 0);
    ef_check_stream(f->m);
    fx_close(f);
}

static void test_short_reads(void **state)
{
    (void)state;
    retried(SL_IO_FAULT_SHORT, 5);
}

static void test_eintr(void **state)
{
    (void)state;
    retried(SL_IO_FAULT_EINTR, 3);
}

static void test_eagain(void **state)
{
    (void)state;
    retried(SL_IO_FAULT_EAGAIN, 4);
}

/* EAGAIN for ever: the backoff is bounded, the tensor fails, no hang. */
static void test_eagain_forever(void **state)
{
    (void)state;
    fx *f = fx_open(0, 64u << 10);
    assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_EAGAIN, 1, 1000000), SLUICE_OK);
    assert_int_equal(acquire_status(f->m, "s0.t001"), SLUICE_E_IO);
    assert_non_null(strstr(sluice_errmsg(f->m), strerror(EAGAIN)));
    assert_non_null(strstr(sluice_errmsg(f->m), "\"s0.t001\""));
    assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_NONE, 0, 0), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(f->m), SLUICE_OK);
    assert_int_equal(sl_engine_drop_cache(f->m), SLUICE_OK);
    ef_check_orders(f->m, 9);
    fx_close(f);
}

/* One coalesced read of several small tensors fails: each of them fails
 * with its own name; the stream delivers the rest and reports the code. */
static void test_coalesced_failure(void **state)
{
    (void)state;
    fx *f = fx_open(0, 8u << 20);
    assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_EIO, 1, 1), SLUICE_OK);
    ef_stream_seen s = {0};
    s.n = sluice_count(f->m);
    s.seen = calloc(s.n, 1);
    assert_int_equal(sluice_stream(f->m, NULL, 0, ef_stream_cb, &s), SLUICE_E_IO);
    assert_true(s.failed >= 1);
    assert_int_equal(s.failed + s.delivered, s.n);
    assert_non_null(strstr(sluice_errmsg(f->m), strerror(EIO)));
    free(s.seen);
    ef_check_stream(f->m);
    struct sluice_stats st = ef_stats(f->m);
    assert_int_equal(st.failures, s.failed);
    fx_close(f);
}

/* The file shrinks after open: the tensors past the new end fail with
 * FILE_CHANGED; the ones before it still load. */
static void test_file_shrank(void **state)
{
    (void)state;
    fx *f = fx_open(0, 64u << 10);
    struct sluice_tensor_info last = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(f->m, NSIZES - 1, &last), SLUICE_OK);
    assert_int_equal(truncate(f->file, (off_t)last.offset), 0);
    assert_int_equal(acquire_status(f->m, "s0.t006"), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(f->m), "\"s0.t006\""));
    assert_non_null(strstr(sluice_errmsg(f->m), "shrank"));
    assert_int_equal(acquire_status(f->m, "s0.t002"), SLUICE_OK);
    fx_close(f);
}

/* O_DIRECT refused at the first read (EINVAL): that file falls back to
 * buffered reads, counted, and the tensor still loads. */
static void test_direct_fallback(void **state)
{
    (void)state;
    fx *f = fx_open(SLUICE_F_DIRECT, 64u << 10);
    if (ef_stats(f->m).direct_fallbacks != 0) {
        fx_close(f);
        skip(); /* this file system refused O_DIRECT at open already */
    }
    assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_EINVAL, 1, 1), SLUICE_OK);
    assert_int_equal(acquire_status(f->m, "s0.t000"), SLUICE_OK);
    struct sluice_stats st = ef_stats(f->m);
    assert_int_equal(st.direct_fallbacks, 1);
    assert_int_equal(st.failures, 0);
    ef_check_orders(f->m, 4);
    fx_close(f);
}

/* The bytes of tensor name, acquired, compared with want + its offset. */
static void expect_bytes(sluice_model *m, const char *name, const unsigned char *want)
{
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, name, &t), SLUICE_OK);
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    assert_int_equal(sluice_tensor_size(t), info->nbytes);
    assert_memory_equal(sluice_tensor_data(t), want + info->offset, (size_t)info->nbytes);
    assert_int_equal(sluice_release(t), SLUICE_OK);
}

/* Without /proc the O_DIRECT twin is reopened by path. Same file: kept.
 * A file renamed over the path in between: not that file's bytes, but the
 * opened file's, read buffered and counted as a fallback (before: the
 * reopened path was trusted, and the new file was read). */
static void test_direct_reopen_without_proc(void **state)
{
    (void)state;
    fx *f = fx_open(SLUICE_F_DIRECT, 64u << 10);
    if (ef_stats(f->m).direct_fallbacks != 0) {
        fx_close(f);
        skip(); /* this file system refused O_DIRECT at open already */
    }
    size_t len = 0;
    unsigned char *orig = tu_read_file(f->file, &len);
    assert_non_null(orig);
    const char *no_proc = "/nonexistent-proc/self/fd";

    /* the path still names the opened file: O_DIRECT kept */
    assert_int_equal(sl_engine_reopen_direct(f->m, no_proc), SLUICE_OK);
    assert_int_equal(ef_stats(f->m).direct_fallbacks, 0);
    expect_bytes(f->m, "s0.t000", orig);

    /* another file (every data byte different) renamed over the path */
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    assert_int_equal(sluice_file_info(f->m, 0, &fi), SLUICE_OK);
    unsigned char *other = malloc(len);
    assert_non_null(other);
    memcpy(other, orig, len);
    for (size_t i = (size_t)fi.data_start; i < len; i++)
        other[i] ^= 0x5a;
    char *tmp = tu_join(f->dir, "replacement.tmp");
    tu_write_file(tmp, other, len);
    assert_int_equal(rename(tmp, f->file), 0);

    assert_int_equal(sl_engine_drop_cache(f->m), SLUICE_OK);
    assert_int_equal(sl_engine_reopen_direct(f->m, no_proc), SLUICE_OK);
    struct sluice_stats st = ef_stats(f->m);
    assert_int_equal(st.direct_fallbacks, 1);
    expect_bytes(f->m, "s0.t000", orig);   /* 200000 bytes: an O_DIRECT-sized read */
    expect_bytes(f->m, "s0.t005", orig);
    assert_int_equal(ef_stats(f->m).failures, 0);

    free(tmp);
    free(other);
    free(orig);
    fx_close(f);
}

/* ---------------------------------------------------------------- digests */

static void file_digests(sluice_model *m, unsigned char (*d)[32])
{
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        unsigned char *b = tu_pread_range(info.file, info.offset, (size_t)info.nbytes);
        unsigned len;
        EVP_Digest(b, (size_t)info.nbytes, d[i], &len, EVP_sha256(), NULL);
        free(b);
    }
}

/* Acquires tensor i: its bytes are the file's and its digest is d[i]. */
static void acquire_verified(sluice_model *m, size_t i, const unsigned char (*d)[32])
{
    sluice_tensor *t = NULL;
    int rc = sluice_acquire_index(m, i, &t);
    if (rc != SLUICE_OK)
        fail_msg("acquire %zu: %s: %s", i, sluice_strerror(rc), sluice_errmsg(m));
    ef_check_handle(t);
    uint8_t got[32];
    assert_int_equal(sluice_tensor_digest(t, got), SLUICE_OK);
    assert_memory_equal(got, d[i], 32);
    assert_int_equal(sluice_release(t), SLUICE_OK);
}

/* ---------------------------------------------------------------- short reads */

/* Every read attempt short: the seam reports half of what it read and
 * overwrites the rest (io.h), as a real short read into a reused buffer
 * leaves it. Each read must go on for the rest, so the bytes and digests
 * handed out are the file's, for a one-chunk tensor, a tensor of four
 * chunks, and a stream whose small tensors share reads (coalesced). A read
 * taken as complete when short hands out garbage: the digest check fails
 * it, and the bytes compare would too. */
static void test_short_reads_leave_garbage(void **state)
{
    (void)state;
    for (int coalesce = 0; coalesce < 2; coalesce++) {
        /* 8 MiB chunks: every tensor is one chunk, and the stream reads
         * small neighbours together */
        fx *f = fx_open(0, coalesce ? 8u << 20 : 64u << 10);
        size_t n = sluice_count(f->m);
        unsigned char (*d)[32] = calloc(n, 32);
        unsigned char *has = malloc(n);
        assert_non_null(d);
        assert_non_null(has);
        memset(has, 1, n);
        file_digests(f->m, d);
        assert_int_equal(sl_engine_set_digests(f->m, (const unsigned char (*)[32])d, has), SLUICE_OK);
        assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_SHORT, 1, 1000000), SLUICE_OK);
        struct sluice_stats st0 = ef_stats(f->m);
        if (!coalesce) {
            acquire_verified(f->m, 2, (const unsigned char (*)[32])d); /* 200 bytes, one chunk */
            acquire_verified(f->m, 0, (const unsigned char (*)[32])d); /* 200000 bytes, 4 chunks */
        } else {
            ef_check_stream(f->m); /* every tensor verified, bytes compared */
            /* Coalesced: fewer reads than tensors with bytes (the first
             * read of each was short, the rest came by retries). */
            struct sluice_stats st = ef_stats(f->m);
            assert_true(st.reads - st0.reads < n);
            assert_int_equal(st.tensors_verified - st0.tensors_verified, n);
        }
        struct sluice_stats st = ef_stats(f->m);
        assert_true(st.retries > st0.retries);
        assert_int_equal(st.failures, 0);
        assert_int_equal(sl_engine_set_fault(f->m, SL_IO_FAULT_NONE, 0, 0), SLUICE_OK);
        free(d);
        free(has);
        fx_close(f);
    }
}

static void checksum(uint32_t flags)
{
    fx *f = fx_open(flags, 64u << 10);
    size_t n = sluice_count(f->m);
    unsigned char (*d)[32] = calloc(n, 32);
    unsigned char *has = malloc(n);
    memset(has, 1, n);
    file_digests(f->m, d);
    d[0][5] ^= 1;   /* s0.t000 (4 chunks) must fail */
    d[4][0] ^= 1;   /* s0.t004 (small) too */
    assert_int_equal(sl_engine_set_digests(f->m, (const unsigned char (*)[32])d, has), SLUICE_OK);

    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t reads = ef_stats(f->m).reads;
        assert_int_equal(acquire_status(f->m, "s0.t000"), SLUICE_E_CHECKSUM);
        const char *msg = sluice_errmsg(f->m);
        char hex[65];
        for (int k = 0; k < 32; k++)
            snprintf(hex + 2 * k, 3, "%02x", d[0][k]);
        assert_non_null(strstr(msg, "\"s0.t000\""));
        assert_non_null(strstr(msg, f->file));
        assert_non_null(strstr(msg, hex));      /* expected */
        d[0][5] ^= 1;
        for (int k = 0; k < 32; k++)
            snprintf(hex + 2 * k, 3, "%02x", d[0][k]);
        d[0][5] ^= 1;
        assert_non_null(strstr(msg, hex));      /* actual */
        assert_true(ef_stats(f->m).reads > reads); /* read again, not cached */
    }
    for (size_t i = 1; i < n; i++) {
        sluice_tensor *t;
        int rc = sluice_acquire_index(f->m, i, &t);
        if (i == 4) {
            assert_int_equal(rc, SLUICE_E_CHECKSUM);
            continue;
        }
        assert_int_equal(rc, SLUICE_OK);
        uint8_t got[32];
        assert_int_equal(sluice_tensor_digest(t, got), SLUICE_OK);
        assert_memory_equal(got, d[i], 32);
        ef_check_handle(t);
        sluice_release(t);
    }
    ef_stream_seen s = {0};
    s.n = n;
    s.seen = calloc(n, 1);
    assert_int_equal(sluice_stream(f->m, NULL, 0, ef_stream_cb, &s), SLUICE_E_CHECKSUM);
    assert_int_equal(s.failed, 2);
    free(s.seen);
    struct sluice_stats st = ef_stats(f->m);
    assert_int_equal(st.checksum_failures, st.failures);
    assert_true(st.checksum_failures >= 5);
    assert_true(st.tensors_verified >= n - 2);
    assert_true(st.bytes_hashed > 0);
    free(d);
    free(has);
    fx_close(f);
}

static void test_checksum(void **state)
{
    (void)state;
    checksum(0);
}

static void test_checksum_direct(void **state)
{
    (void)state;
    checksum(SLUICE_F_DIRECT);
}

/* Writes the flat manifest {"name": "hex", ...} of digests d at path. */
static void write_manifest(sluice_model *m, const char *path, const unsigned char (*d)[32])
{
    size_t n = sluice_count(m), cap = 64 + n * 128, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    len += (size_t)snprintf(text + len, cap - len, "{");
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info info;
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        char hex[65];
        sluice_digest_hex(d[i], hex);
        len += (size_t)snprintf(text + len, cap - len, "%s\"%s\": \"%s\"", i ? ", " : "", info.name, hex);
    }
    len += (size_t)snprintf(text + len, cap - len, "}\n");
    tu_write_file(path, text, len);
    free(text);
}

/* A right digest but for one bit of byte `at` (16: just past a compare of
 * the first 16 bytes; 31: the last byte), for a tensor of four chunks and
 * a small one, given by the digest table or by a manifest file. Both fail
 * with SLUICE_E_CHECKSUM, by acquire and by stream; the others load. */
static void digest_tail(int at, int by_manifest)
{
    fx *f = fx_open(0, 64u << 10);
    size_t n = sluice_count(f->m);
    unsigned char (*d)[32] = calloc(n, 32);
    unsigned char *has = malloc(n);
    assert_non_null(d);
    assert_non_null(has);
    memset(has, 1, n);
    file_digests(f->m, d);
    d[0][at] ^= 0x01; /* s0.t000, 4 chunks */
    d[4][at] ^= 0x80; /* s0.t004, 400 bytes */
    char *manifest = tu_join(f->dir, "digests.json");
    if (by_manifest) {
        write_manifest(f->m, manifest, (const unsigned char (*)[32])d);
        assert_int_equal(sluice_close(f->m), SLUICE_OK);
        sluice_options o = ef_opts(4u << 20, 64u << 10, 0);
        o.queue_depth = 1;
        o.manifest_path = manifest;
        o.verify = SLUICE_VERIFY_REQUIRE;
        f->m = ef_open(f->dir, &o);
    } else {
        assert_int_equal(sl_engine_set_digests(f->m, (const unsigned char (*)[32])d, has), SLUICE_OK);
    }
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || i == 4) {
            assert_int_equal(acquire_status(f->m, i ? "s0.t004" : "s0.t000"), SLUICE_E_CHECKSUM);
            assert_non_null(strstr(sluice_errmsg(f->m), i ? "\"s0.t004\"" : "\"s0.t000\""));
        } else {
            acquire_verified(f->m, i, (const unsigned char (*)[32])d);
        }
    }
    assert_int_equal(sl_engine_drop_cache(f->m), SLUICE_OK);
    ef_stream_seen s = {0};
    s.n = n;
    s.seen = calloc(n, 1);
    assert_non_null(s.seen);
    assert_int_equal(sluice_stream(f->m, NULL, 0, ef_stream_cb, &s), SLUICE_E_CHECKSUM);
    assert_int_equal(s.failed, 2);
    assert_int_equal(s.delivered, n - 2);
    assert_false(s.seen[0] == 0 || s.seen[4] == 0);
    free(s.seen);
    assert_true(ef_stats(f->m).checksum_failures >= 4);
    free(manifest);
    free(d);
    free(has);
    fx_close(f);
}

static void test_digest_byte_16_table(void **state)
{
    (void)state;
    digest_tail(16, 0);
}

static void test_digest_byte_31_table(void **state)
{
    (void)state;
    digest_tail(31, 0);
}

static void test_digest_byte_16_manifest(void **state)
{
    (void)state;
    digest_tail(16, 1);
}

static void test_digest_byte_31_manifest(void **state)
{
    (void)state;
    digest_tail(31, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eio_one_tensor),
        cmocka_unit_test(test_short_reads),
        cmocka_unit_test(test_eintr),
        cmocka_unit_test(test_eagain),
        cmocka_unit_test(test_eagain_forever),
        cmocka_unit_test(test_coalesced_failure),
        cmocka_unit_test(test_file_shrank),
        cmocka_unit_test(test_direct_fallback),
        cmocka_unit_test(test_direct_reopen_without_proc),
        cmocka_unit_test(test_checksum),
        cmocka_unit_test(test_checksum_direct),
        cmocka_unit_test(test_short_reads_leave_garbage),
        cmocka_unit_test(test_digest_byte_16_table),
        cmocka_unit_test(test_digest_byte_31_table),
        cmocka_unit_test(test_digest_byte_16_manifest),
        cmocka_unit_test(test_digest_byte_31_manifest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
