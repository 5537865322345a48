/* test_errmsg.c: the per-thread error detail of sluice_errmsg (errmsg.c):
 * bounded memory whatever threads and models come and go, and no cap on
 * the number of open models. Counting uses the test hook
 * sl_errmsg_live_entries(), so every check is exact, not a timing. */
#include "base/errmsg.h"
#include "base/error.h"
#include "util.h"

#include <sluice.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct fx {
    char *dir, *path;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->path = tu_join(f->dir, "m.safetensors");
    tu_write_safetensors(f->path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", NULL, 4);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

/* A small model on the pread backend: one I/O thread, a small pool, so
 * that a thousand and more of them fit in one process. */
static sluice_model *open_small(const char *path)
{
    sluice_options o;
    sluice_options_init(&o);
    o.flags = SLUICE_F_FORCE_PREAD;
    o.io_threads = 1;
    o.queue_depth = 1;
    o.pool_bytes = 64u << 10;
    o.chunk_bytes = 4096;
    sluice_model *m = NULL;
    int rc = sluice_open(path, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    return m;
}

/* Fails one call on m naming `name`; 1 when errmsg then tells that. */
static int fail_and_check(sluice_model *m, const char *name)
{
    sluice_tensor *t = NULL;
    if (sluice_acquire(m, name, &t) != SLUICE_E_NOT_FOUND || t)
        return 0;
    return strstr(sluice_errmsg(m), name) != NULL;
}

typedef struct one_arg {
    sluice_model *m;
    unsigned k;
    int ok;
} one_arg;

static void *fail_once(void *p)
{
    one_arg *a = p;
    char name[32];
    snprintf(name, sizeof name, "missing-%u", a->k);
    a->ok = fail_and_check(a->m, name);
    return NULL;
}

/* 20,000 threads each fail one call and exit: each thread's detail is
 * freed at its exit, so no entry is left (before: one slot per thread
 * stayed until close, 20 MB for 20,000 threads). */
static void short_lived_threads_leave_nothing(void **state)
{
    fx *f = *state;
    sluice_model *m = open_small(f->path);
    size_t base = sl_errmsg_live_entries();
    for (unsigned k = 0; k < 20000; k++) {
        one_arg a = {m, k, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, fail_once, &a), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_true(a.ok);
        /* the exiting thread ran its destructor before join returned */
        if (sl_errmsg_live_entries() != base)
            fail_msg("after thread %u: %zu entries live, %zu before", k, sl_errmsg_live_entries(), base);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* One long-lived thread failing on many models keeps at most
 * SLUICE_ERRMSG_MODELS entries: the most recent models' messages stay
 * exact, older ones read ""; close drops the closing thread's entry. */
static void long_lived_thread_is_bounded(void **state)
{
    fx *f = *state;
    enum { N = 3 * SLUICE_ERRMSG_MODELS };
    sluice_model *m[N];
    size_t base = sl_errmsg_live_entries();
    char name[32];
    for (unsigned i = 0; i < N; i++) {
        m[i] = open_small(f->path);
        assert_string_equal(sluice_errmsg(m[i]), "");
        snprintf(name, sizeof name, "nope-%u", i);
        assert_true(fail_and_check(m[i], name));
        assert_true(sl_errmsg_live_entries() - base <= SLUICE_ERRMSG_MODELS);
    }
    assert_int_equal(sl_errmsg_live_entries() - base, SLUICE_ERRMSG_MODELS);
    for (unsigned i = 0; i < N; i++) {
        snprintf(name, sizeof name, "nope-%u", i);
        if (i >= N - SLUICE_ERRMSG_MODELS)
            assert_non_null(strstr(sluice_errmsg(m[i]), name));
        else
            assert_string_equal(sluice_errmsg(m[i]), "");
    }
    /* failing again on the newest model reorders nothing else away */
    snprintf(name, sizeof name, "again-%u", N - 1);
    assert_true(fail_and_check(m[N - 1], name));
    snprintf(name, sizeof name, "nope-%u", N - SLUICE_ERRMSG_MODELS);
    assert_non_null(strstr(sluice_errmsg(m[N - SLUICE_ERRMSG_MODELS]), name));
    /* an old model failing again comes back, pushing out the oldest */
    assert_true(fail_and_check(m[0], "back-0"));
    assert_string_equal(sluice_errmsg(m[N - SLUICE_ERRMSG_MODELS]), "");
    assert_int_equal(sl_errmsg_live_entries() - base, SLUICE_ERRMSG_MODELS);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(sluice_close(m[i]), SLUICE_OK);
    assert_int_equal(sl_errmsg_live_entries(), base);
}

typedef struct sweep_arg {
    sluice_model **m;
    size_t n;
    int ok;
} sweep_arg;

/* Fails on every model in turn, each message checked at once. */
static void *sweep(void *p)
{
    sweep_arg *a = p;
    char name[48];
    a->ok = 1;
    for (size_t i = 0; i < a->n; i++) {
        snprintf(name, sizeof name, "thread-nope-%zu", i);
        a->ok &= fail_and_check(a->m[i], name);
    }
    return NULL;
}

/* 1,500 models open at once, more than PTHREAD_KEYS_MAX (1024), which a
 * key per model could not open; each keeps its own message, and another
 * thread's failures do not touch the main thread's. */
static void many_models_at_once(void **state)
{
    fx *f = *state;
    enum { N = 1500 };
    sluice_model **m = calloc(N, sizeof *m);
    assert_non_null(m);
    char name[32];
    for (size_t i = 0; i < N; i++) {
        m[i] = open_small(f->path);
        snprintf(name, sizeof name, "nope-%zu", i);
        assert_true(fail_and_check(m[i], name));
    }
    sweep_arg a = {m, N, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sweep, &a), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(a.ok);
    for (size_t i = N - SLUICE_ERRMSG_MODELS; i < N; i++) {
        snprintf(name, sizeof name, "nope-%zu", i);
        assert_non_null(strstr(sluice_errmsg(m[i]), name));
        assert_null(strstr(sluice_errmsg(m[i]), "thread-"));
    }
    for (size_t i = 0; i < N; i++)
        assert_int_equal(sluice_close(m[i]), SLUICE_OK);
    free(m);
}

/* Cutting messages between UTF-8 characters: sl_utf8_cut on what
 * snprintf cut short, sl_utf8_prefix for "%.*s". */
static void utf8_cuts(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cut[] = {
        {"", ""}, {"a", "a"}, {"a\xc3", "a"}, {"a\xc3\xa9", "a\xc3\xa9"}, {"a\xe2\x82", "a"},
        {"a\xe2\x82\xac", "a\xe2\x82\xac"}, {"a\xf0\x9f\x98", "a"}, {"\xf0", ""},
        {"a\xf0\x9f\x98\x80", "a\xf0\x9f\x98\x80"}, {"\x80\x80", "\x80\x80"},
        {"a\xff", "a\xff"}, {"a\xc0", "a\xc0"},
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        char buf[16];
        strcpy(buf, cut[i].in);
        sl_utf8_cut(buf);
        if (strcmp(buf, cut[i].out) != 0)
            fail_msg("sl_utf8_cut case %zu", i);
    }
    const char *e = "\xc3\xa9\xc3\xa9x"; /* é é x */
    assert_int_equal(sl_utf8_prefix(e, 5, 5), 5);
    assert_int_equal(sl_utf8_prefix(e, 5, 4), 4);
    assert_int_equal(sl_utf8_prefix(e, 5, 3), 2);
    assert_int_equal(sl_utf8_prefix(e, 5, 1), 0);
    assert_int_equal(sl_utf8_prefix("abc", 3, 2), 2);
    const char *euro = "\xe2\x82\xac\xe2\x82\xac";
    assert_int_equal(sl_utf8_prefix(euro, 6, 5), 3);
    assert_int_equal(sl_utf8_prefix(euro, 6, 4), 3);
    assert_int_equal(sl_utf8_prefix(euro, 6, 3), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(short_lived_threads_leave_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(long_lived_thread_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(many_models_at_once, setup, teardown),
        cmocka_unit_test(utf8_cuts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
