/* test_alloc_fail.c: the Nth allocation fails, for every N, in sluice_open
 * and in a full verified stream (and acquire) of a small model, and in a
 * remote model's part read (the fault server, tests/remote_fault_server.py).
 *
 * The seam is the linker (alloc_wrap.h): every malloc the library's
 * objects make goes through alloc_wrap.c, which fails the Nth one when
 * armed. The library carries no test hook. Each step must return a clean
 * error (SLUICE_E_NOMEM), leak nothing (LeakSanitizer checks at exit) and
 * leave an open model usable: after each failed stream the same model
 * streams again, with no failure, and every tensor's bytes are checked. */
#include "alloc_wrap.h"
#include "remote_fixture.h"
#include "engine_fixture.h"
#include "mf_fixture.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sluice.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static void arm(long n)
{
    aw_arm(n);
}

static long disarm(void)
{
    return aw_disarm();
}

static char *make_model(void)
{
    char *dir = tu_tmpdir();
    char *p1 = tu_join(dir, "model-00001-of-00002.safetensors");
    char *p2 = tu_join(dir, "model-00002-of-00002.safetensors");
    char *idx = tu_join(dir, "model.safetensors.index.json");
    tu_write_safetensors(p1, "{\"__metadata__\":{\"format\":\"pt\"},"
                             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                             "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}", NULL, 11);
    tu_write_safetensors(p2, "{\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", NULL, 8);
    const char *json = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}";
    tu_write_file(idx, json, strlen(json));
    free(p1);
    free(p2);
    free(idx);
    return dir;
}

/* sluice_open of a sharded model, failing allocation N for N = 0, 1, ...
 * until an open completes without a failure. */
static void test_open(void **state)
{
    (void)state;
    char *dir = make_model();
    /* A canary on descriptor 0: a failed open must close only what it
     * opened (an engine once closed fd 0 for each file it never opened). */
    int saved0 = dup(0), canary = open("/dev/null", O_RDONLY);
    assert_true(saved0 >= 0 && canary >= 0);
    assert_int_equal(dup2(canary, 0), 0);
    struct stat want0;
    assert_int_equal(fstat(0, &want0), 0);
    long n;
    for (n = 0; n < 100000; n++) {
        sluice_model *m = NULL;
        arm(n);
        int rc = sluice_open(dir, NULL, &m);
        long failed = disarm();
        struct stat now0;
        if (fstat(0, &now0) != 0 || now0.st_ino != want0.st_ino || now0.st_dev != want0.st_dev)
            fail_msg("allocation %ld failed: descriptor 0 is no longer the one it was", n);
        if (!failed) {
            assert_int_equal(rc, SLUICE_OK);
            assert_int_equal(sluice_count(m), 3);
            sluice_close(m);
            break;
        }
        if (rc != SLUICE_E_NOMEM)
            fprintf(stderr, "allocation %ld failed: got %d (%s)\n", n, rc, sluice_errmsg(m));
        assert_int_equal(rc, SLUICE_E_NOMEM);
        assert_int_equal(sluice_count(m), 0);
        sluice_close(m); /* NULL when the model itself could not be allocated */
    }
    assert_int_equal(dup2(saved0, 0), 0);
    close(saved0);
    close(canary);
    printf("sluice_open: %ld allocation points, each failed once, all clean\n", n);
    assert_true(n > 5);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- streams */

/* One shard with tensors of mixed sizes: empty, tiny, one chunk, many
 * chunks (300000 bytes in 4 KiB chunks: 74, past the one-word chunk map),
 * plus a REQUIRE manifest of their SHA-256 (the sidecar), so that every
 * byte goes through the digest workers. */
static const uint64_t st_sizes[] = {0, 1, 100, 4096, 300000, 5000, 7, 70000, 33};
#define ST_N (sizeof st_sizes / sizeof st_sizes[0])

typedef struct st_fx {
    char *dir, *file;
    unsigned char *ref[ST_N];   /* each tensor's bytes, read independently */
} st_fx;

static st_fx *st_setup(void)
{
    st_fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->file = tu_join(f->dir, "model.safetensors");
    uint64_t seed = 12345;
    ef_write_shard(f->file, "t", st_sizes, ST_N, 3, &seed);
    sluice_model *m = NULL;
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open(f->file, &o, &m), SLUICE_OK);
    mf_buf man = {0};
    mf_addf(&man, "{");
    for (size_t i = 0; i < ST_N; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        f->ref[i] = tu_pread_range(info.file, info.offset, (size_t)info.nbytes);
        uint8_t d[32];
        char hex[65];
        mf_sha256(f->ref[i], (size_t)info.nbytes, d);
        mf_addf(&man, "%s\"%s\":\"%s\"", i ? "," : "", info.name, mf_hex(d, hex));
    }
    mf_addf(&man, "}");
    assert_int_equal(sluice_close(m), SLUICE_OK);
    char *side = tu_join(f->dir, "model.safetensors.manifest.json");
    mf_write_text(side, man.p);
    free(side);
    mf_buf_free(&man);
    return f;
}

static void st_teardown(st_fx *f)
{
    for (size_t i = 0; i < ST_N; i++)
        free(f->ref[i]);
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->file);
    free(f);
}

/* A pool smaller than the model, so the stream evicts as it goes. */
static sluice_model *st_open(const st_fx *f)
{
    sluice_options o;
    sluice_options_init(&o);
    o.pool_bytes = 340000;
    o.chunk_bytes = 4096;
    o.queue_depth = 4;
    o.io_threads = 1;
    o.hash_threads = 1;
    sluice_model *m = NULL;
    int rc = sluice_open(f->file, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    assert_int_equal(sluice_verify_mode(m), SLUICE_VERIFY_REQUIRE);
    return m;
}

/* What one stream saw. The callback allocates nothing (it runs armed). */
typedef struct st_seen {
    const st_fx *f;
    unsigned char seen[ST_N];
    unsigned ok, nomem, other, bad_bytes;
    int other_code;
} st_seen;

static int st_cb(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
                 const char *message)
{
    st_seen *s = user;
    (void)message;
    if (!info || info->index >= ST_N || s->seen[info->index]++) {
        s->other++;
        return 0;
    }
    if (status == SLUICE_OK) {
        s->ok++;
        if (!t || sluice_tensor_size(t) != st_sizes[info->index] ||
            (st_sizes[info->index] &&
             memcmp(sluice_tensor_data(t), s->f->ref[info->index], (size_t)st_sizes[info->index])))
            s->bad_bytes++;
        if (sluice_release(t) != SLUICE_OK)
            s->other++;
    } else if (status == SLUICE_E_NOMEM && !t) {
        s->nomem++;
    } else {
        s->other++;
        s->other_code = status;
    }
    return 0;
}

/* A clean stream: every tensor, each once, its bytes the file's. */
static void st_clean(const st_fx *f, sluice_model *m, long n)
{
    st_seen s = {.f = f};
    int rc = sluice_stream(m, NULL, 0, st_cb, &s);
    if (rc != SLUICE_OK || s.ok != ST_N || s.bad_bytes || s.other)
        fail_msg("after allocation %ld failed: clean stream %d (%s), %u ok, %u bad, %u other",
                 n, rc, sluice_errmsg(m), s.ok, s.bad_bytes, s.other);
}

/* sluice_stream over every tensor, failing allocation N = 0, 1, ... until
 * streams run without a failure. Each model is fresh (its first handles
 * and slots are allocated inside the stream); after the failed stream the
 * model streams clean, then again from the file (cache dropped, so every
 * tensor is read and verified once more). */
static void test_stream(void **state)
{
    (void)state;
    st_fx *f = st_setup();
    long n, points = 0, nomem_streams = 0, clean_in_a_row = 0;
    for (n = 0; n < 100000; n++) {
        sluice_model *m = st_open(f);
        st_seen s = {.f = f};
        arm(n);
        int rc = sluice_stream(m, NULL, 0, st_cb, &s);
        long failed = disarm();
        if (s.other || s.bad_bytes)
            fail_msg("allocation %ld failed: a tensor came with status %d, or wrong bytes (%u)",
                     n, s.other_code, s.bad_bytes);
        /* Every tensor comes, once, unless the stream could not start. */
        if (s.ok + s.nomem != ST_N && !(rc == SLUICE_E_NOMEM && s.ok + s.nomem == 0))
            fail_msg("allocation %ld failed: %u of %zu tensors delivered", n, s.ok + s.nomem,
                     (size_t)ST_N);
        if (!failed) {
            assert_int_equal(rc, SLUICE_OK);
            assert_int_equal(s.ok, ST_N);
            assert_int_equal(sluice_close(m), SLUICE_OK);
            /* The count varies a little with the threads' timing: stop
             * after a few N in a row that reach no allocation. */
            if (++clean_in_a_row == 5)
                break;
            continue;
        }
        clean_in_a_row = 0;
        points++;
        if (rc != SLUICE_OK && rc != SLUICE_E_NOMEM)
            fail_msg("allocation %ld failed: stream returned %d (%s)", n, rc, sluice_errmsg(m));
        /* A failed tensor makes the stream fail with its code. */
        if (s.nomem)
            assert_int_equal(rc, SLUICE_E_NOMEM);
        nomem_streams += rc == SLUICE_E_NOMEM;
        st_clean(f, m, n);
        assert_int_equal(sl_engine_drop_cache(m), SLUICE_OK);
        st_clean(f, m, n);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    printf("sluice_stream: %ld allocation points, %ld of them failed the stream with NOMEM, "
           "all clean\n", points, nomem_streams);
    assert_true(points >= 8);
    st_teardown(f);
}

/* The same with acquire (in an order unlike the file's), then prefetch
 * and acquire, on a fresh model for each N; after each failure the model
 * must still give every tensor, verified. Regression: a pool block
 * descriptor that could not be allocated once passed for "no room", so
 * the first acquire of a fresh model failed with SLUICE_E_POOL_EXHAUSTED
 * ("0 bytes in use") instead of SLUICE_E_NOMEM. */
static void test_acquire(void **state)
{
    (void)state;
    st_fx *f = st_setup();
    long n, points = 0, clean_in_a_row = 0;
    for (n = 0; n < 100000; n++) {
        sluice_model *m = st_open(f);
        const char *names[ST_N];
        for (size_t i = 0; i < ST_N; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
            names[i] = info.name;
        }
        int rcs[2 * ST_N + 1];
        unsigned bad = 0;
        arm(n);
        for (size_t c = 0; c < 2 * ST_N + 1; c++) {
            if (c == ST_N) {
                rcs[c] = sluice_prefetch(m, names, ST_N);
                continue;
            }
            size_t k = c < ST_N ? (c * 5) % ST_N : ST_N - 1 - (c - ST_N - 1);
            sluice_tensor *t = NULL;
            rcs[c] = sluice_acquire(m, names[k], &t);
            if (rcs[c] == SLUICE_OK) {
                if (st_sizes[k] && memcmp(sluice_tensor_data(t), f->ref[k], (size_t)st_sizes[k]))
                    bad++;
                sluice_release(t);
            } else if (t) {
                bad++;
            }
        }
        long failed = disarm();
        assert_int_equal(bad, 0);
        for (size_t c = 0; c < 2 * ST_N + 1; c++)
            if (rcs[c] != SLUICE_OK && rcs[c] != SLUICE_E_NOMEM)
                fail_msg("allocation %ld failed: call %zu returned %d (%s)", n, c, rcs[c],
                         sluice_errmsg(m));
        if (failed) {
            points++;
            assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
            for (size_t i = 0; i < ST_N; i++)
                ef_acquire_check(m, i);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
        clean_in_a_row = failed ? 0 : clean_in_a_row + 1;
        if (clean_in_a_row == 5)
            break;  /* as in test_stream */
    }
    printf("acquire + prefetch: %ld allocation points, all clean\n", points);
    assert_true(points > 5);
    st_teardown(f);
}

/* A remote model's strided part (one multi-range request of the remote
 * seam, or under mp416 one refused and then single ranges), allocation N
 * failing for N = 0, 1, ...: each read returns SLUICE_OK with the rows or
 * SLUICE_E_NOMEM, no request reaches the server without its Range header
 * (the fault server's log), and the model reads the next part. Before, a
 * Range value that could not be allocated was left out: the multi-range
 * request went out as a GET of the whole object, its 200 taken for a
 * server that refuses multi-range requests (the file flagged so for good). */
static void remote_part_oom(const char *root, rf_server *srv, const char *mode,
                            const unsigned char *bytes)
{
    enum { ROWS = 64, COLS = 1024 };
    size_t seg = COLS / 4, len = ROWS * seg;
    unsigned char *part = malloc(len);
    assert_non_null(part);
    char url[300], ctl[128];
    snprintf(url, sizeof url, "%s/mc.safetensors", srv->base);
    long points = 0, clean = 0;
    for (long n = 0; n < 100000; n++) {
        sluice_options o;
        sluice_options_init(&o);
        o.verify = SLUICE_VERIFY_OFF;
        o.remote_attempts = 2;
        o.remote_backoff_ms = 5;
        sluice_model *m;
        if (sluice_open(url, &o, &m) != SLUICE_OK)
            fail_msg("open: %s", sluice_errmsg(m));
        snprintf(ctl, sizeof ctl, "/ctl?mode=%s&count=1&arg=", mode);
        free(rf_get(srv, ctl));
        free(rf_get(srv, "/ctl/clear"));
        arm(n);
        int rc = sluice_read_part_into(m, "t", 1, 1, 4, part, len);
        long failed = disarm();
        char *log = rf_get(srv, "/ctl/log");
        assert_non_null(log);
        free(rf_get(srv, "/ctl?mode=ok&count=0&arg="));
        if (rc != SLUICE_OK && rc != SLUICE_E_NOMEM)
            fail_msg("%s, allocation %ld: %s: %s", mode, n, sluice_strerror(rc), sluice_errmsg(m));
        if (rc == SLUICE_OK)
            for (size_t r = 0; r < ROWS; r++)
                if (memcmp(part + r * seg, bytes + r * COLS + seg, seg))
                    fail_msg("%s, allocation %ld: row %zu differs", mode, n, r);
        /* each logged request: "GET PATH", its headers, a blank line */
        for (char *q = log; (q = strstr(q, "GET /mc.safetensors"));) {
            char *end = strstr(q, "\n\n");
            if (end)
                *end = '\0';
            if (!strstr(q, "Range: bytes="))
                fail_msg("%s, allocation %ld: a request without its Range header:\n%s", mode,
                         n, q);
            q = end ? end + 2 : q + strlen(q);
        }
        free(log);
        assert_int_equal(sluice_read_part_into(m, "t", 1, 2, 4, part, len), SLUICE_OK);
        for (size_t r = 0; r < ROWS; r++)
            if (memcmp(part + r * seg, bytes + r * COLS + 2 * seg, seg))
                fail_msg("%s, after allocation %ld: row %zu differs", mode, n, r);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        points += failed;
        clean = failed ? 0 : clean + 1;
        if (clean == 5)
            break;
    }
    printf("remote part (%s): %ld allocation points, all clean\n", mode, points);
    assert_true(points > 3);
    free(part);
    (void)root;
}

/* A remote model at a URL with credentials (user:password@, a presigned
 * query), opened with allocation N failing for N = 0, 1, ...: each open
 * returns SLUICE_OK or an error whose message names the model without
 * them. Before, the open's "out of memory" of its metrics label and of
 * its copy of the path quoted the path as given. */
static void remote_open_oom_secrets(rf_server *srv)
{
    char url[400];
    snprintf(url, sizeof url, "http://user:PW-SECRET@%s/mc.safetensors?X-Amz-Signature=SIG-SECRET",
             srv->base + strlen("http://"));
    long points = 0, clean = 0;
    for (long n = 0; n < 100000; n++) {
        sluice_options o;
        sluice_options_init(&o);
        o.remote_attempts = 2;
        o.remote_backoff_ms = 5;
        sluice_model *m = NULL;
        arm(n);
        int rc = sluice_open(url, &o, &m);
        long failed = disarm();
        const char *msg = sluice_errmsg(m);
        if (rc != SLUICE_OK && strstr(msg, "SECRET"))
            fail_msg("allocation %ld: %s: %s", n, sluice_strerror(rc), msg);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        points += failed;
        clean = failed ? 0 : clean + 1;
        if (clean == 5)
            break;
    }
    printf("remote open with credentials: %ld allocation points, none shown\n", points);
    assert_true(points > 3);
}

static void test_remote_part(void **state)
{
    (void)state;
    /* a library without libcurl: skipped (not rf_skip_without_curl,
     * which would end the other tests too) */
    if (!rf_have_curl()) {
        print_message("skipped: this library was built without libcurl\n");
        skip();
    }
    char why[256];
    rf_server srv;
    char *root = tu_tmpdir();
    enum { ROWS = 64, COLS = 1024 };
    char *p = tu_join(root, "mc.safetensors");
    unsigned char *bytes = mf_write_u8_model(p, "t", ROWS, COLS, NULL);
    if (!rf_fault_start(&srv, SLUICE_SOURCE_DIR "/tests/remote_fault_server.py", root, why,
                        sizeof why)) {
        print_message("skipped: %s\n", why);
        tu_rmtree(root);
        free(root);
        free(p);
        free(bytes);
        skip();
    }
    remote_part_oom(root, &srv, "ok", bytes);
    remote_part_oom(root, &srv, "mp416", bytes);
    remote_open_oom_secrets(&srv);
    rf_stop(&srv);
    tu_rmtree(root);
    free(root);
    free(p);
    free(bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_acquire),
        cmocka_unit_test(test_remote_part),
    };
    if (getenv("SLUICE_TEST_FILTER"))
        cmocka_set_test_filter(getenv("SLUICE_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
