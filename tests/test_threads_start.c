/* test_threads_start.c: a component's worker threads started as a group
 * (src/base/threads.c, sl_threads_start) when pthread_create fails part
 * way: on its own, for the hasher (src/engine/hash.c) and for the pread
 * backend (src/sources/io.c).
 *
 * The seam is the linker: this program is linked with
 * -Wl,--wrap=pthread_create (threads.cmake), so the static library's
 * calls reach __wrap_pthread_create below, which fails the Nth call when
 * armed (EAGAIN, as at a thread limit). The library carries no test hook.
 *
 * Checked, for each N below the number of threads asked for:
 * SLUICE_E_NOMEM with "<what>: cannot start a <noun>: <strerror(EAGAIN)>",
 * the N threads started counted (and, on their own, running), the
 * component's create leaving *out NULL with those threads joined and
 * everything freed (LeakSanitizer at exit; a worker left running on a
 * freed hasher is a use after free under ASan); disarmed, the same create
 * works. */
#include "base/threads.h"
#include "engine/hash.h"
#include "sources/io.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

static atomic_int countdown = -1; /* < 0: disarmed; 0: fail this call */
static atomic_int calls;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    atomic_fetch_add(&calls, 1);
    int c = atomic_load(&countdown);
    while (c >= 0 && !atomic_compare_exchange_weak(&countdown, &c, c - 1))
        ;
    if (c == 0)
        return EAGAIN;
    return __real_pthread_create(t, attr, fn, arg);
}

static void arm(int n)
{
    atomic_store(&calls, 0);
    atomic_store(&countdown, n);
}

static void disarm(void)
{
    atomic_store(&countdown, -1);
}

static void expect_message(const sl_err *err, const char *what, const char *noun)
{
    char want[256];
    snprintf(want, sizeof want, "%s: cannot start a %s: %s", what, noun, strerror(EAGAIN));
    assert_int_equal(err->code, SLUICE_E_NOMEM);
    assert_string_equal(err->msg, want);
}

/* ---------------------------------------------------------------- on its own */

typedef struct counter {
    pthread_mutex_t lock;
    unsigned ran;
} counter;

static void *count_main(void *arg)
{
    counter *c = arg;
    pthread_mutex_lock(&c->lock);
    c->ran++;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static void test_partial_start(void **state)
{
    (void)state;
    for (unsigned k = 0; k < 4; k++) {
        counter c = {.lock = PTHREAD_MUTEX_INITIALIZER};
        pthread_t *threads = NULL;
        unsigned started = 0;
        sl_err err = {0};
        arm((int)k);
        int rc = sl_threads_start(&threads, &started, 4, count_main, &c, "work", "worker", &err);
        disarm();
        assert_int_equal(rc, SLUICE_E_NOMEM);
        expect_message(&err, "work", "worker");
        assert_int_equal(started, k);
        assert_int_equal(atomic_load(&calls), (int)k + 1); /* none tried after the failure */
        assert_non_null(threads);
        for (unsigned i = 0; i < started; i++) /* the caller's teardown */
            assert_int_equal(pthread_join(threads[i], NULL), 0);
        free(threads);
        assert_int_equal(c.ran, k); /* the ones counted did run */
    }
    counter c = {.lock = PTHREAD_MUTEX_INITIALIZER};
    pthread_t *threads = NULL;
    unsigned started = 0;
    sl_err err = {0};
    assert_int_equal(sl_threads_start(&threads, &started, 4, count_main, &c, "work", "worker", &err),
                     SLUICE_OK);
    assert_int_equal(started, 4);
    for (unsigned i = 0; i < started; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    free(threads);
    assert_int_equal(c.ran, 4);
}

/* ---------------------------------------------------------------- the hasher */

static void hash_done(void *ctx, sl_hash_job *job, int status)
{
    (void)ctx, (void)job, (void)status;
}

static void test_hasher(void **state)
{
    (void)state;
    for (int k = 0; k < 4; k++) {
        sl_err err = {0};
        sl_hasher *h = (sl_hasher *)&err; /* not NULL: the failure must clear it */
        arm(k);
        int rc = sl_hasher_create(4, SLUICE_ALG_SHA256, hash_done, NULL, &h, &err);
        disarm();
        assert_int_equal(rc, SLUICE_E_NOMEM);
        assert_null(h);
        expect_message(&err, "hashing", "thread");
    }
    sl_err err = {0};
    sl_hasher *h = NULL;
    assert_int_equal(sl_hasher_create(4, SLUICE_ALG_SHA256, hash_done, NULL, &h, &err), SLUICE_OK);
    assert_non_null(h);
    sl_hasher_destroy(h);
}

/* ---------------------------------------------------------------- the pread backend */

static void io_done(void *ctx, sl_io_req *list)
{
    (void)ctx, (void)list;
}

static void test_pread_backend(void **state)
{
    (void)state;
    sl_io_config cfg = {.queue_depth = 4, .threads = 4, .force_pread = 1, .done = io_done};
    for (int k = 0; k < 4; k++) {
        sl_err err = {0};
        sl_io *io = (sl_io *)&err; /* not NULL: the failure must clear it */
        arm(k);
        int rc = sl_io_create(&cfg, &io, &err);
        disarm();
        assert_int_equal(rc, SLUICE_E_NOMEM);
        assert_null(io);
        expect_message(&err, "I/O", "read thread");
    }
    sl_err err = {0};
    sl_io *io = NULL;
    assert_int_equal(sl_io_create(&cfg, &io, &err), SLUICE_OK);
    assert_non_null(io);
    sl_io_destroy(io);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partial_start),
        cmocka_unit_test(test_hasher),
        cmocka_unit_test(test_pread_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
