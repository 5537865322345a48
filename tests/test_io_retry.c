/* test_io_retry.c: the I/O seam (io.h) schedules its EINTR/EAGAIN retries
 * by time; it does not sleep through the backoff on a thread that serves
 * other requests (the io_uring reaper, or a pread worker).
 *
 * The seam runs here on a clock the test moves by hand (cfg.clock_ns), so
 * "not yet due" is a fact, not a race: a request parked for a retry stays
 * parked until the test moves the clock, and a request submitted beside it
 * completes meanwhile. A seam that slept instead retries without the clock
 * moving (its sleep is real time), and the other request waits behind it:
 * each test then fails at once, it does not hang. Both backends, the pread
 * one with a single worker (where a sleep would stall everything). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "sources/io.h"
#include "util.h"

#define BLOCK 4096

typedef struct rig {
    char *dir;
    int fd;
    unsigned char file[2 * BLOCK];
    sl_io *io;
    atomic_uint_fast64_t now;    /* the seam's clock, in ns */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    sl_io_req *completed[2];     /* in the order the seam finished them */
    int ncompleted;
} rig;

static uint64_t rig_clock(void *ctx)
{
    return atomic_load(&((rig *)ctx)->now);
}

static void rig_done(void *ctx, sl_io_req *list)
{
    rig *g = ctx;
    pthread_mutex_lock(&g->lock);
    for (sl_io_req *r = list; r; r = r->next)
        if (g->ncompleted < 2)
            g->completed[g->ncompleted++] = r;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
}

static rig *rig_open(int force_pread)
{
    rig *g = calloc(1, sizeof *g);
    assert_non_null(g);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cv, NULL);
    atomic_store(&g->now, 1000000000u);
    g->dir = tu_tmpdir();
    char *path = tu_join(g->dir, "data");
    for (size_t i = 0; i < sizeof g->file; i++)
        g->file[i] = (unsigned char)(i * 131 + 7);
    tu_write_file(path, g->file, sizeof g->file);
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(g->fd >= 0);
    free(path);
    sl_io_config cfg = {
        .queue_depth = 4,
        .threads = 1,            /* pread: one worker, which a sleep would stall */
        .force_pread = force_pread,
        .done = rig_done,
        .ctx = g,
        .clock_ns = rig_clock,
        .clock_ctx = g,
    };
    sl_err err;
    assert_int_equal(sl_io_create(&cfg, &g->io, &err), SLUICE_OK);
    printf("backend: %s\n", sl_io_backend(g->io, NULL) == SLUICE_BACKEND_IO_URING ? "io_uring" : "pread");
    return g;
}

static void rig_close(rig *g)
{
    sl_io_destroy(g->io);
    close(g->fd);
    tu_rmtree(g->dir);
    free(g->dir);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* A read of block k of the file into buf. */
static void rig_submit(rig *g, sl_io_req *r, struct iovec *iov, unsigned char *buf, int k)
{
    memset(r, 0, sizeof *r);
    memset(buf, 0, BLOCK);
    *iov = (struct iovec){buf, BLOCK};
    r->fd = g->fd;
    r->offset = (uint64_t)k * BLOCK;
    r->iov = iov;
    r->iovcnt = 1;
    r->min_bytes = BLOCK;
    sl_io_submit(g->io, r);
}

static int rig_count(rig *g)
{
    pthread_mutex_lock(&g->lock);
    int n = g->ncompleted;
    pthread_mutex_unlock(&g->lock);
    return n;
}

static void rig_wait_completions(rig *g, int n)
{
    pthread_mutex_lock(&g->lock);
    while (g->ncompleted < n)
        pthread_cond_wait(&g->cv, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

/* Waits until `attempts` attempts were made and one request is parked for
 * its retry, or until more than `completions` requests completed (which a
 * seam that sleeps through the backoff gets to instead). Polls: parking
 * has no callback, and either state comes without the test's help. */
static void rig_wait_parked(rig *g, uint64_t attempts, int completions)
{
    while ((sl_io_attempts(g->io) < attempts || sl_io_retries_waiting(g->io) != 1) &&
           rig_count(g) <= completions)
        sched_yield();
}

static void check_read(rig *g, const sl_io_req *r, const unsigned char *buf, int k, uint32_t retries)
{
    assert_int_equal(r->error, 0);
    assert_int_equal(r->eof, 0);
    assert_int_equal(r->done_bytes, BLOCK);
    assert_int_equal(r->retries, retries);
    assert_memory_equal(buf, g->file + (size_t)k * BLOCK, BLOCK);
}

/* Two reads submitted together; the first attempt (whichever read it is)
 * fails with EAGAIN. The other read completes, with the clock standing
 * still; the faulted one stays parked until the clock reaches its due
 * time, then completes. */
static void retry_does_not_stall(int force_pread)
{
    rig *g = rig_open(force_pread);
    sl_io_req a, b;
    struct iovec ia, ib;
    unsigned char ba[BLOCK], bb[BLOCK];
    sl_io_set_fault(g->io, SL_IO_FAULT_EAGAIN, 1, 1);
    rig_submit(g, &a, &ia, ba, 0);
    rig_submit(g, &b, &ib, bb, 1);
    sl_io_flush(g->io);

    rig_wait_completions(g, 1);
    sl_io_req *first = g->completed[0], *other = first == &a ? &b : &a;
    if (first->retries != 0)
        fail_msg("the faulted read completed first, with the clock standing still: the seam "
                 "slept through its backoff instead of parking it");
    check_read(g, first, first == &a ? ba : bb, first == &a ? 0 : 1, 0);

    rig_wait_parked(g, 2, 1);
    if (rig_count(g) != 1)
        fail_msg("the faulted read was retried before the clock reached its due time");
    assert_int_equal(sl_io_retries_waiting(g->io), 1);

    atomic_fetch_add(&g->now, 50000); /* the first backoff: 50 us */
    rig_wait_completions(g, 2);
    assert_ptr_equal(g->completed[1], other);
    check_read(g, other, other == &a ? ba : bb, other == &a ? 0 : 1, 1);
    assert_int_equal(sl_io_retries_waiting(g->io), 0);
    assert_int_equal(sl_io_attempts(g->io), 3);
    rig_close(g);
}

static void test_retry_does_not_stall_uring(void **state)
{
    (void)state;
    retry_does_not_stall(0);
}

static void test_retry_does_not_stall_pread(void **state)
{
    (void)state;
    retry_does_not_stall(1);
}

/* EAGAIN on every attempt of one read: it is parked after each of the
 * first SL_IO_MAX_ATTEMPTS - 1 attempts, due 50 us, 100 us, ... 12.8 ms
 * (then 12.8 ms again) after the failure, by the seam's clock; the last
 * attempt's EAGAIN is the result. */
static void backoff_schedule(int force_pread)
{
    rig *g = rig_open(force_pread);
    sl_io_req a;
    struct iovec ia;
    unsigned char ba[BLOCK];
    sl_io_set_fault(g->io, SL_IO_FAULT_EAGAIN, 1, 1000);
    rig_submit(g, &a, &ia, ba, 0);
    sl_io_flush(g->io);
    uint64_t waited = 0;
    for (uint32_t k = 0; k + 1 < SL_IO_MAX_ATTEMPTS; k++) {
        rig_wait_parked(g, k + 1, 0);
        if (rig_count(g) != 0)
            fail_msg("attempt %u: the read went on without the clock moving", k + 1);
        uint64_t now = atomic_load(&g->now), want = (uint64_t)50000 << (k < 8 ? k : 8);
        /* parked: the seam is done with the request until the clock moves */
        assert_int_equal(a.due_ns - now, want);
        waited += want;
        atomic_store(&g->now, a.due_ns);
    }
    rig_wait_completions(g, 1);
    assert_int_equal(a.error, EAGAIN);
    assert_int_equal(a.retries, SL_IO_MAX_ATTEMPTS - 1);
    assert_int_equal(sl_io_attempts(g->io), SL_IO_MAX_ATTEMPTS);
    printf("EAGAIN %d times: %.2f ms of backoff by the seam's clock\n", SL_IO_MAX_ATTEMPTS,
           (double)waited / 1e6);
    rig_close(g);
}

static void test_backoff_schedule_uring(void **state)
{
    (void)state;
    backoff_schedule(0);
}

static void test_backoff_schedule_pread(void **state)
{
    (void)state;
    backoff_schedule(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_does_not_stall_uring),
        cmocka_unit_test(test_retry_does_not_stall_pread),
        cmocka_unit_test(test_backoff_schedule_uring),
        cmocka_unit_test(test_backoff_schedule_pread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
