/* test_engine_stress.c: many threads on one model (acquire, release,
 * prefetch, two streams, stats at once), per-thread error detail, close
 * with work in flight (read-ahead, hashing, a stream in another thread),
 * and memory bounded by the pool while streaming a model far larger than
 * it. Meant to run clean under ThreadSanitizer too (build with
 * -DSLUICE_TSAN=ON; tools/test.sh runs it so). */
#include "engine_fixture.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

/* The whole model's bytes, by tensor, read once up front: the reference
 * the threads compare with (cheaper than a pread per check). */
typedef struct ref {
    size_t n;
    unsigned char **bytes;
} ref;

static ref *ref_load(sluice_model *m)
{
    ref *r = calloc(1, sizeof *r);
    r->n = sluice_count(m);
    r->bytes = calloc(r->n, sizeof *r->bytes);
    for (size_t i = 0; i < r->n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        r->bytes[i] = info.nbytes ? tu_pread_range(info.file, info.offset, (size_t)info.nbytes) : NULL;
    }
    return r;
}

static void ref_free(ref *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->bytes[i]);
    free(r->bytes);
    free(r);
}

static int same(const ref *r, const sluice_tensor *t)
{
    size_t i = sluice_tensor_info(t)->index;
    size_t len = (size_t)sluice_tensor_size(t);
    return len == 0 || (((uintptr_t)sluice_tensor_data(t) & 63) == 0 &&
                        memcmp(sluice_tensor_data(t), r->bytes[i], len) == 0);
}

/* ---------------------------------------------------------------- threads */

typedef struct shared {
    sluice_model *m;
    const ref *r;
    int iters;
    unsigned errors;          /* counted by each thread, summed after join */
} shared;

typedef struct worker {
    shared *sh;
    uint64_t seed;
    unsigned errors;
} worker;

static void *acquirer(void *p)
{
    worker *w = p;
    sluice_model *m = w->sh->m;
    size_t n = sluice_count(m);
    sluice_tensor *held[2] = {NULL, NULL};
    for (int it = 0; it < w->sh->iters; it++) {
        int slot = (int)(ef_rng(&w->seed) & 1);
        if (held[slot]) {
            if (!same(w->sh->r, held[slot]))
                w->errors++;
            if (sluice_release(held[slot]) != SLUICE_OK)
                w->errors++;
            held[slot] = NULL;
            continue;
        }
        size_t i = (size_t)(ef_rng(&w->seed) % n);
        int rc = sluice_acquire_index(m, i, &held[slot]);
        if (rc != SLUICE_OK) {
            fprintf(stderr, "acquire %zu: %s: %s\n", i, sluice_strerror(rc), sluice_errmsg(m));
            w->errors++;
        }
    }
    for (int k = 0; k < 2; k++)
        if (held[k])
            sluice_release(held[k]);
    return NULL;
}

static int count_cb(void *user, sluice_tensor *t, int status,
                    const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    worker *w = user;
    if (status != SLUICE_OK) {
        fprintf(stderr, "stream: %s\n", message);
        w->errors++;
        return 0;
    }
    if (!same(w->sh->r, t))
        w->errors++;
    sluice_release(t);
    return 0;
}

static void *streamer(void *p)
{
    worker *w = p;
    for (int k = 0; k < 3; k++)
        if (sluice_stream(w->sh->m, NULL, 0, count_cb, w) != SLUICE_OK)
            w->errors++;
    return NULL;
}

/* A second stream at once, over a list: the model's tensors backwards,
 * each twice. */
static void *list_streamer(void *p)
{
    worker *w = p;
    sluice_model *m = w->sh->m;
    size_t n = sluice_count(m);
    const char **names = malloc(2 * n * sizeof *names);
    for (size_t i = 0; i < n; i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, n - 1 - i, &info);
        names[i] = names[n + i] = info.name;
    }
    for (int k = 0; k < 2; k++)
        if (sluice_stream(m, names, 2 * n, count_cb, w) != SLUICE_OK)
            w->errors++;
    free(names);
    return NULL;
}

static void *hinter(void *p)
{
    worker *w = p;
    sluice_model *m = w->sh->m;
    size_t n = sluice_count(m);
    for (int k = 0; k < 200; k++) {
        const char *names[4];
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        for (int j = 0; j < 4; j++) {
            sluice_info(m, (size_t)(ef_rng(&w->seed) % n), &info);
            names[j] = info.name;
        }
        if (sluice_prefetch(m, names, 4) != SLUICE_OK)
            w->errors++;
        struct sluice_stats st = {.size = sizeof st};
        if (sluice_stats(m, &st) != SLUICE_OK || st.pool_high_water > st.pool_bytes)
            w->errors++;
        usleep(200);
    }
    return NULL;
}

static void hammer(uint32_t flags, uint64_t pool)
{
    char *dir = ef_model(3, ef_sizes, EF_NSIZES, 77);
    sluice_options o = ef_opts(pool, 64u << 10, flags);
    o.queue_depth = 8;
    sluice_model *m = ef_open(dir, &o);
    ref *r = ref_load(m);
    shared sh = {m, r, 400, 0};
    enum { NACQ = 8, NTH = NACQ + 3 };
    pthread_t th[NTH];
    worker w[NTH];
    for (int k = 0; k < NTH; k++) {
        w[k] = (worker){&sh, 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1), 0};
        void *(*fn)(void *) = k < NACQ ? acquirer : k == NACQ ? streamer
                              : k == NACQ + 1 ? list_streamer : hinter;
        assert_int_equal(pthread_create(&th[k], NULL, fn, &w[k]), 0);
    }
    unsigned errors = 0;
    for (int k = 0; k < NTH; k++) {
        pthread_join(th[k], NULL);
        errors += w[k].errors;
    }
    assert_int_equal(errors, 0);
    struct sluice_stats st = ef_stats(m);
    assert_true(st.pool_high_water <= st.pool_bytes);
    assert_int_equal(st.failures, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    ref_free(r);
    tu_rmtree(dir);
    free(dir);
}

static void test_threads(void **state)
{
    (void)state;
    /* 8 threads x 2 handles of at most 300 KB, plus two streams: 8 MiB
     * is room enough that POOL_EXHAUSTED can never be the right answer. */
    hammer(0, 8u << 20);
}

static void test_threads_hashed_direct(void **state)
{
    (void)state;
    hammer(SLUICE_F_HASH_ALL | SLUICE_F_DIRECT, 8u << 20);
}

/* ---------------------------------------------------------------- errors */

typedef struct errarg {
    sluice_model *m;
    const char *name;
    pthread_barrier_t *b;
    int ok;
} errarg;

static void *fail_own(void *p)
{
    errarg *a = p;
    sluice_tensor *t;
    for (int k = 0; k < 200; k++) {
        if (sluice_acquire(a->m, a->name, &t) != SLUICE_E_NOT_FOUND)
            return NULL;
        if (k == 0)
            pthread_barrier_wait(a->b);
        if (!strstr(sluice_errmsg(a->m), a->name))
            return NULL;
    }
    a->ok = 1;
    return NULL;
}

static void test_errmsg_per_thread(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, 4, 5);
    sluice_options o = ef_opts(1u << 20, 64u << 10, 0);
    sluice_model *m = ef_open(dir, &o);
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, 2);
    errarg a[2] = {{m, "first-missing", &b, 0}, {m, "second-missing", &b, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, fail_own, &a[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    assert_true(a[0].ok && a[1].ok);
    pthread_barrier_destroy(&b);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- memory */

typedef struct rss_arg {
    int fd;
    unsigned char *buf;       /* reused: the check allocates nothing */
    long peak_kib;
    size_t delivered;
    unsigned bad;
} rss_arg;

static int rss_cb(void *user, sluice_tensor *t, int status,
                  const struct sluice_tensor_info *info, const char *message)
{
    (void)message;
    rss_arg *a = user;
    if (status != SLUICE_OK) {
        a->bad++;
        return 0;
    }
    size_t len = (size_t)info->nbytes;
    if (pread(a->fd, a->buf, len, (off_t)info->offset) != (ssize_t)len ||
        memcmp(a->buf, sluice_tensor_data(t), len) != 0)
        a->bad++;
    sluice_release(t);
    long rss = tu_status_kib("VmRSS:");
    if (rss > a->peak_kib)
        a->peak_kib = rss;
    a->delivered++;
    return 0;
}

static void test_rss_bounded(void **state)
{
    (void)state;
    /* 256 MiB model (one shard, 256 tensors of 1 MiB +- a little), 8 MiB
     * pool: larger than pool + slack by far, so growing by the model fails. */
    uint64_t sizes[256];
    for (int k = 0; k < 256; k++)
        sizes[k] = (1u << 20) + (uint64_t)(k * 977 % 4096);
    char *dir = ef_model(1, sizes, 256, 99);
    char *file = tu_join(dir, "model-00001-of-00001.safetensors");
    sluice_options o = ef_opts(8u << 20, 1u << 20, 0);
    sluice_model *m = ef_open(dir, &o);
    rss_arg a = {0};
    a.fd = open(file, O_RDONLY | O_CLOEXEC);
    assert_true(a.fd >= 0);
    a.buf = malloc((1u << 20) + 4096);
    memset(a.buf, 0, (1u << 20) + 4096);
    long base = tu_status_kib("VmRSS:");
    assert_true(base > 0);
    for (int pass = 0; pass < 2; pass++)
        assert_int_equal(sluice_stream(m, NULL, 0, rss_cb, &a), SLUICE_OK);
    assert_int_equal(a.bad, 0);
    assert_int_equal(a.delivered, 2 * 256);
    struct sluice_stats st = ef_stats(m);
    assert_true(st.pool_high_water <= st.pool_bytes);
    /* Budget + 64 MiB of slack (threads' stacks, sanitizer shadow). */
    long grew = a.peak_kib - base;
    fprintf(stderr, "RSS grew by %ld KiB streaming 2 x 256 MiB through an 8 MiB pool\n", grew);
    assert_true(grew < (8 + 64) * 1024);
    close(a.fd);
    free(a.buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(file);
    free(dir);
}

/* ---------------------------------------------------------------- close */

/* Close right after starting read-ahead of a model far larger than the
 * pool (reads in flight, hashing running): clean, at once, no leak. Then
 * the same after acquiring a few, and with a handle still live: BUSY, and
 * the model goes on working. */
static void close_in_flight(uint32_t flags)
{
    uint64_t sizes[48];
    for (int k = 0; k < 48; k++)
        sizes[k] = 50000 + (uint64_t)k * 3001;
    char *dir = ef_model(2, sizes, 48, 7);
    for (int round = 0; round < 6; round++) {
        sluice_options o = ef_opts(1u << 20, 16u << 10, flags);
        o.queue_depth = 16;
        sluice_model *m = ef_open(dir, &o);
        size_t n = sluice_count(m);
        const char *names[96];
        for (size_t i = 0; i < n; i++) {
            struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
            sluice_info(m, (i * 7) % n, &info);
            names[i] = info.name;
        }
        assert_int_equal(sluice_prefetch(m, names, n), SLUICE_OK);
        if (round & 1) {
            sluice_tensor *t = NULL;
            assert_int_equal(sluice_acquire(m, names[1], &t), SLUICE_OK);
            assert_int_equal(sluice_prefetch(m, names + 2, n - 2), SLUICE_OK);
            /* a live handle: close refuses, frees nothing */
            assert_int_equal(sluice_close(m), SLUICE_E_BUSY);
            assert_non_null(strstr(sluice_errmsg(m), "1 tensor handle is still live"));
            ef_check_handle(t);
            assert_int_equal(sluice_release(t), SLUICE_OK);
            /* released twice: detected while the model is open */
            assert_int_equal(sluice_release(t), SLUICE_E_INVAL);
            ef_acquire_check(m, 3);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_close_in_flight(void **state)
{
    (void)state;
    close_in_flight(0);
    close_in_flight(SLUICE_F_HASH_ALL);
    close_in_flight(SLUICE_F_HASH_ALL | SLUICE_F_DIRECT);
}

/* A stream runs in another thread (held inside its callback) while close
 * is called: close says SLUICE_E_BUSY and frees nothing; the stream goes on
 * to the end; then close succeeds. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inside, open;
    sluice_model *m;
    int rc;
    size_t delivered;
} gate;

static int gate_cb(void *user, sluice_tensor *t, int status,
                   const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    (void)message;
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->inside = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    if (status == SLUICE_OK) {
        g->delivered++;
        sluice_release(t);
    }
    return 0;
}

static void *gate_stream(void *p)
{
    gate *g = p;
    g->rc = sluice_stream(g->m, NULL, 0, gate_cb, g);
    return NULL;
}

static void test_close_while_streaming(void **state)
{
    (void)state;
    char *dir = ef_model(2, ef_sizes, EF_NSIZES, 8);
    sluice_options o = ef_opts(1u << 20, 64u << 10, SLUICE_F_HASH_ALL);
    sluice_model *m = ef_open(dir, &o);
    gate g = {.m = m};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, gate_stream, &g), 0);
    pthread_mutex_lock(&g.mu);
    while (!g.inside)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    /* the stream is inside its first callback, holding its handle */
    assert_int_equal(sluice_close(m), SLUICE_E_BUSY);
    assert_non_null(strstr(sluice_errmsg(m), "1 stream running"));
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(th, NULL);
    assert_int_equal(g.rc, SLUICE_OK);
    assert_int_equal(g.delivered, sluice_count(m));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_threads_hashed_direct),
        cmocka_unit_test(test_errmsg_per_thread),
        cmocka_unit_test(test_rss_bounded),
        cmocka_unit_test(test_close_in_flight),
        cmocka_unit_test(test_close_while_streaming),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
