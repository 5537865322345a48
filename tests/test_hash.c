/* test_hash.c: the hashing layer (src/engine/hash.c) on its own, where the
 * engine cannot steer a worker into a given moment.
 *
 * Checked: a cancel that comes while a worker is delivering a job's
 * completion says "not quiet" (the completion is on its way: freeing the
 * job then would free it under the worker), as hash.h promises; a job cut
 * into pieces gives each piece its own digest, the bytes arriving a few
 * at a time. Every wait is bounded. */
#include "engine/hash.h"
#include "base/digest.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#include <cmocka.h>

typedef struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int hold;  /* completions wait for go */
    int entered, go, calls, last_status;
} gate;

static void gate_init(gate *g)
{
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->lock);
}

/* Waits (10 s at most) until *flag is set; returns whether it was. */
static int wait_flag(gate *g, const int *flag)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&g->lock);
    while (!*flag && pthread_cond_timedwait(&g->cv, &g->lock, &until) == 0)
        ;
    int ok = *flag;
    pthread_mutex_unlock(&g->lock);
    return ok;
}

/* The completion: counts and says it has begun, then, when the gate
 * holds completions, waits for the test's go. */
static void gate_done(void *ctx, sl_hash_job *job, int status)
{
    gate *g = ctx;
    (void)job;
    pthread_mutex_lock(&g->lock);
    g->entered = 1;
    g->calls++;
    g->last_status = status;
    int hold = g->hold;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
    if (hold)
        wait_flag(g, &g->go);
}

static void cancel_while_completing_is_not_quiet(void **state)
{
    (void)state;
    gate g;
    gate_init(&g);
    g.hold = 1;
    sl_hasher *h = NULL;
    sl_err err;
    assert_int_equal(sl_hasher_create(1, SLUICE_ALG_SHA256, gate_done, &g, &h, &err), SLUICE_OK);
    static unsigned char bytes[3 * 4096];
    memset(bytes, 7, sizeof bytes);
    for (int pieces = 0; pieces < 2; pieces++) {
        sl_hash_job *job = NULL;
        assert_int_equal(sl_hash_job_create(h, bytes, sizeof bytes, 1, pieces ? 4096 : 0, NULL, &job),
                         SLUICE_OK);
        g.entered = g.go = 0;
        sl_hash_job_ready(h, job, sizeof bytes);
        assert_true(wait_flag(&g, &g.entered));
        /* the worker is in the completion: it is coming, not quiet */
        assert_int_equal(sl_hash_job_cancel(h, job), 0);
        pthread_mutex_lock(&g.lock);
        g.go = 1;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.lock);
        sl_hasher_wait_idle(h);
        assert_int_equal(g.last_status, SLUICE_OK);
        sl_hash_job_free(job);
    }
    assert_int_equal(g.calls, 2);
    sl_hasher_destroy(h);
    gate_destroy(&g);
}

static void pieces_have_their_own_digests(void **state)
{
    (void)state;
    gate g;
    gate_init(&g);
    sl_hasher *h = NULL;
    sl_err err;
    assert_int_equal(sl_hasher_create(3, SLUICE_ALG_SHA256, gate_done, &g, &h, &err), SLUICE_OK);
    enum { PIECE = 5000, LEN = 7 * PIECE + 123 };
    unsigned char *bytes = malloc(LEN);
    assert_non_null(bytes);
    for (size_t k = 0; k < LEN; k++)
        bytes[k] = (unsigned char)(k * 2654435761u >> 11);
    sl_hash_job *job = NULL;
    assert_int_equal(sl_hash_job_create(h, bytes, LEN, 1, PIECE, NULL, &job), SLUICE_OK);
    assert_int_equal(sl_hash_job_pieces(job), 8);
    for (uint64_t r = 0; r <= LEN; r += 777)
        sl_hash_job_ready(h, job, r);
    sl_hash_job_ready(h, job, LEN);
    assert_true(wait_flag(&g, &g.entered));
    sl_hasher_wait_idle(h);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.last_status, SLUICE_OK);
    assert_int_equal(sl_hash_job_hashed(job), LEN);
    for (uint32_t k = 0; k < 8; k++) {
        size_t lo = (size_t)k * PIECE, hi = lo + PIECE < LEN ? lo + PIECE : LEN;
        uint8_t want[32];
        assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, bytes + lo, hi - lo, want), 0);
        assert_memory_equal(sl_hash_job_piece_digest(job, k), want, 32);
    }
    sl_hash_job_free(job);
    sl_hasher_destroy(h);
    free(bytes);
    gate_destroy(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cancel_while_completing_is_not_quiet),
        cmocka_unit_test(pieces_have_their_own_digests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
