/* test_engine_regress.c: one test per engine bug an outside review found
 * (deadlock of two streams' callbacks, close racing a call's exit,
 * fragmentation taken for exhaustion, one waiter's refusal failing the
 * others, a truncated file failing tensors before its end), and the calls
 * added with the fixes: sluice_trim, cancellation and progress.
 *
 * Every wait is bounded; a test that would hang aborts instead. */
#include "engine_fixture.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024u * 1024u)

/* Aborts the process when a thread cannot be joined in time: a hang is
 * the bug some of these tests look for, and it must not stall ctest. */
static void join_or_abort(pthread_t t, unsigned seconds, const char *what)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    int rc = pthread_timedjoin_np(t, NULL, &until);
    if (rc != 0) {
        fprintf(stderr, "%s: still running after %u s (deadlock)\n", what, seconds);
        abort();
    }
}

/* A flag with a bounded wait. */
typedef struct signal_flag {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int set;
} signal_flag;

#define SIGNAL_FLAG_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}

static void flag_raise(signal_flag *f)
{
    pthread_mutex_lock(&f->lock);
    f->set = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->lock);
}

/* Returns whether the flag was raised within ms milliseconds. */
static int flag_wait(signal_flag *f, unsigned ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&f->lock);
    while (!f->set)
        if (pthread_cond_timedwait(&f->cv, &f->lock, &until) == ETIMEDOUT)
            break;
    int set = f->set;
    pthread_mutex_unlock(&f->lock);
    return set;
}

static char *one_shard(const uint64_t *sizes, size_t n, char **dir_out)
{
    char *dir = tu_tmpdir();
    char *path = tu_join(dir, "model.safetensors");
    uint64_t seed = 0x5eed;
    ef_write_shard(path, "t", sizes, n, 3, &seed);
    *dir_out = dir;
    return path;
}

static const char *name_of(sluice_model *m, size_t i)
{
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
    return info.name;
}

/* ------------------------------------------------------------ bug 1 */

/* t000-t003 and t004-t007: 4 MiB each, one list per stream; t008: 62 MiB,
 * which a 64 MiB pool can never hold beside one 4 MiB handle. */
static const uint64_t two_stream_sizes[] = {
    4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 62 * MiB,
};

typedef struct two_streams {
    sluice_model *m;
    sluice_model *other[2];  /* where side k acquires (NULL: m) */
    pthread_barrier_t both_in_callback;
    const char *names[2][4];
} two_streams;

typedef struct stream_side {
    two_streams *ts;
    int which;
    size_t delivered;
    int big_rc;
    int stream_rc;
} stream_side;

static int acquire_big_in_callback(void *user, sluice_tensor *t, int status,
                                   const struct sluice_tensor_info *info, const char *message)
{
    stream_side *side = user;
    (void)info;
    (void)message;
    assert_int_equal(status, SLUICE_OK);
    if (side->delivered++ == 0) {
        /* Both threads inside a callback, each holding its handle. */
        pthread_barrier_wait(&side->ts->both_in_callback);
        sluice_tensor *big = NULL;
        sluice_model *where = side->ts->other[side->which] ? side->ts->other[side->which]
                                                           : side->ts->m;
        side->big_rc = sluice_acquire(where, "t008", &big);
        sluice_release(big);
    }
    sluice_release(t);
    return 0;
}

static void *run_side(void *arg)
{
    stream_side *side = arg;
    /* across models, side k streams on the model the other side acquires on */
    sluice_model *mine = side->ts->other[1 - side->which] ? side->ts->other[1 - side->which]
                                                          : side->ts->m;
    side->stream_rc = sluice_stream(mine, side->ts->names[side->which], 4,
                                    acquire_big_in_callback, side);
    return NULL;
}

/* across: two models of the same file, each side streaming on one and
 * acquiring on the other (each pool then holds the other side's handle). */
static void two_streams_case(int across)
{
    char *dir, *path = one_shard(two_stream_sizes, 9, &dir);
    sluice_options o = ef_opts(64 * MiB, 1 * MiB, 0);
    two_streams ts = {.m = ef_open(path, &o)};
    if (across) {
        ts.other[0] = ef_open(path, &o);
        ts.other[1] = ts.m;
    }
    pthread_barrier_init(&ts.both_in_callback, NULL, 2);
    for (int k = 0; k < 4; k++) {
        ts.names[0][k] = name_of(ts.m, (size_t)k);
        ts.names[1][k] = name_of(ts.m, (size_t)k + 4);
    }
    stream_side sides[2] = {{&ts, 0, 0, 1, 1}, {&ts, 1, 0, 1, 1}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_create(&th[k], NULL, run_side, &sides[k]), 0);
    for (int k = 0; k < 2; k++)
        join_or_abort(th[k], 60, "two streams whose callbacks acquire");
    int refused = 0;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(sides[k].stream_rc, SLUICE_OK);
        assert_int_equal(sides[k].delivered, 4);
        refused += sides[k].big_rc == SLUICE_E_POOL_EXHAUSTED;
        /* One model: neither can ever have it, each holds a handle the
         * other needs. Two models: once one side is refused and its stream
         * ends, its pool is empty, and the other side may get the tensor. */
        if (!across || sides[k].big_rc != SLUICE_OK)
            assert_int_equal(sides[k].big_rc, SLUICE_E_POOL_EXHAUSTED);
    }
    assert_true(refused >= 1);
    pthread_barrier_destroy(&ts.both_in_callback);
    if (across)
        assert_int_equal(sluice_close(ts.other[0]), SLUICE_OK);
    assert_int_equal(sluice_close(ts.m), SLUICE_OK);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void two_stream_callbacks_do_not_deadlock(void **state)
{
    (void)state;
    two_streams_case(0);
}

static void two_models_callbacks_do_not_deadlock(void **state)
{
    (void)state;
    two_streams_case(1);
}

/* ------------------------------------------------------------ bug 7 */

typedef struct refusal {
    sluice_model *m;
    pthread_t plain;
    int plain_rc;
    int callback_rc;
    size_t delivered;
    int nested;              /* the callback streams the tensor instead */
    int nested_status;
} refusal;

/* Held in the refused acquire, before it leaves: a release elsewhere
 * pumps now, while the refused caller's stream still looks blocked. */
static void pump_while_refused(void *ctx, int where)
{
    refusal *r = ctx;
    if (where != 4)
        return;
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(r->m, "t004", &t), SLUICE_OK); /* cached: no wait */
    assert_int_equal(sluice_release(t), SLUICE_OK);                 /* pumps */
}

static int note_nested(void *user, sluice_tensor *t, int status,
                       const struct sluice_tensor_info *info, const char *message)
{
    refusal *r = user;
    (void)info;
    (void)message;
    r->nested_status = status;
    sluice_release(t);
    return 0;
}

static void *plain_acquire_big(void *arg)
{
    refusal *r = arg;
    sluice_tensor *t = NULL;
    r->plain_rc = sluice_acquire(r->m, "t008", &t);
    if (t)
        ef_check_handle(t);
    sluice_release(t);
    return NULL;
}

static int callback_refused_alone(void *user, sluice_tensor *t, int status,
                                  const struct sluice_tensor_info *info, const char *message)
{
    refusal *r = user;
    (void)info;
    (void)message;
    assert_int_equal(status, SLUICE_OK);
    if (r->delivered++ == 0) {
        /* Another thread waits for the big tensor first... */
        struct sluice_stats before = ef_stats(r->m);
        assert_int_equal(pthread_create(&r->plain, NULL, plain_acquire_big, r), 0);
        for (int k = 0; k < 5000 && ef_stats(r->m).acquire_count == before.acquire_count; k++)
            usleep(1000);
        assert_true(ef_stats(r->m).acquire_count > before.acquire_count);
        /* ...then this callback, holding its handle, wants it too: only
         * its own stream could make room, so only it is refused. */
        sluice_tensor *big = NULL;
        if (r->nested) {
            const char *name = "t008";
            r->callback_rc = sluice_stream(r->m, &name, 1, note_nested, r);
        } else {
            r->callback_rc = sluice_acquire(r->m, "t008", &big);
        }
        sluice_release(big);
    }
    sluice_release(t);
    return 0;
}

/* how 0: the callback acquires; 1: the same, with a pump while the
 * refused caller is still on its way out; 2: the callback streams it. */
static void refusal_case(int how)
{
    char *dir, *path = one_shard(two_stream_sizes, 9, &dir);
    sluice_options o = ef_opts(64 * MiB, 1 * MiB, 0);
    refusal r = {.m = ef_open(path, &o), .plain_rc = 1, .callback_rc = 1, .nested = how == 2,
                 .nested_status = 1};
    if (how == 1) {
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire(r.m, "t004", &t), SLUICE_OK);
        assert_int_equal(sluice_release(t), SLUICE_OK);
        assert_int_equal(sl_engine_set_pause(r.m, pump_while_refused, &r), SLUICE_OK);
    }
    const char *names[4] = {"t000", "t001", "t002", "t003"};
    assert_int_equal(sluice_stream(r.m, names, 4, callback_refused_alone, &r), SLUICE_OK);
    join_or_abort(r.plain, 60, "a plain acquire waiting beside a refused callback");
    assert_int_equal(r.delivered, 4);
    if (how == 2) {
        /* the nested stream delivers the refusal to its callback */
        assert_int_equal(r.callback_rc, SLUICE_E_POOL_EXHAUSTED);
        assert_int_equal(r.nested_status, SLUICE_E_POOL_EXHAUSTED);
    } else {
        assert_int_equal(r.callback_rc, SLUICE_E_POOL_EXHAUSTED);
    }
    if (r.plain_rc != SLUICE_OK)
        fail_msg("case %d: the plain waiter failed too: %s", how, sluice_strerror(r.plain_rc));
    /* one failure: the refused caller's, counted once */
    assert_int_equal(ef_stats(r.m).failures, 1);
    assert_int_equal(sluice_close(r.m), SLUICE_OK);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void refusal_fails_only_the_callback(void **state)
{
    (void)state;
    refusal_case(0);
}

static void refusal_survives_a_pump_before_the_caller_leaves(void **state)
{
    (void)state;
    refusal_case(1);
}

static void refusal_of_a_nested_stream_fails_it_alone(void **state)
{
    (void)state;
    refusal_case(2);
}

/* ------------------------------------------------------------ bug 2 */

typedef struct close_race {
    sluice_model *m;
    int where;               /* the pause point to hold */
    signal_flag paused, go, closed;
    int close_rc;
    sluice_tensor *held;
} close_race;

static void hold_at_exit(void *ctx, int where)
{
    close_race *c = ctx;
    if (where != c->where)
        return;
    flag_raise(&c->paused);
    if (!flag_wait(&c->go, 10000)) {
        fprintf(stderr, "pause hook: never released\n");
        abort();
    }
}

static int release_at_once(void *user, sluice_tensor *t, int status,
                           const struct sluice_tensor_info *info, const char *message)
{
    (void)user;
    (void)info;
    (void)message;
    assert_int_equal(status, SLUICE_OK);
    sluice_release(t);
    return 0;
}

static void *stream_then_exit(void *arg)
{
    close_race *c = arg;
    assert_int_equal(sluice_stream(c->m, NULL, 0, release_at_once, NULL), SLUICE_OK);
    return NULL;
}

static void *release_then_exit(void *arg)
{
    close_race *c = arg;
    assert_int_equal(sluice_release(c->held), SLUICE_OK);
    return NULL;
}

enum { PAUSE_VERIFY_EXIT = 5 }; /* engine_hooks.h */

/* A verify with nothing to verify against fails inside the call, so its
 * message is recorded on the way out, while close waits. */
static void *verify_then_exit(void *arg)
{
    close_race *c = arg;
    assert_int_equal(sluice_verify(c->m, NULL, 0, NULL, NULL), SLUICE_E_MANIFEST);
    return NULL;
}

static void *closer(void *arg)
{
    close_race *c = arg;
    do
        c->close_rc = sluice_close(c->m);
    while (c->close_rc == SLUICE_E_BUSY);
    flag_raise(&c->closed);
    return NULL;
}

/* A call that has let go of its last handle or stream is still inside the
 * engine until it returns: a close retried after BUSY must wait for it. */
static void close_race_at(int where)
{
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 21);
    sluice_options o = ef_opts(64 * MiB, 64 * 1024, 0);
    close_race c = {.m = ef_open(dir, &o), .where = where, .paused = SIGNAL_FLAG_INIT,
                    .go = SIGNAL_FLAG_INIT, .closed = SIGNAL_FLAG_INIT, .close_rc = 1};
    assert_int_equal(sl_engine_set_pause(c.m, hold_at_exit, &c), SLUICE_OK);
    pthread_t caller, closing;
    if (where == 2) {
        assert_int_equal(sluice_acquire_index(c.m, 9, &c.held), SLUICE_OK);
        assert_int_equal(pthread_create(&caller, NULL, release_then_exit, &c), 0);
    } else if (where == PAUSE_VERIFY_EXIT) {
        assert_int_equal(pthread_create(&caller, NULL, verify_then_exit, &c), 0);
    } else {
        assert_int_equal(pthread_create(&caller, NULL, stream_then_exit, &c), 0);
    }
    assert_true(flag_wait(&c.paused, 30000));
    assert_int_equal(pthread_create(&closing, NULL, closer, &c), 0);
    /* The caller is held inside the call: close cannot have finished. */
    int closed_early = flag_wait(&c.closed, 300);
    flag_raise(&c.go);
    join_or_abort(caller, 30, "the paused call");
    join_or_abort(closing, 30, "close");
    assert_false(closed_early);
    assert_int_equal(c.close_rc, SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

static void close_waits_for_stream_exit(void **state)
{
    (void)state;
    close_race_at(1);
}

static void close_waits_for_release_exit(void **state)
{
    (void)state;
    close_race_at(2);
}

static void close_waits_for_verify_exit(void **state)
{
    (void)state;
    close_race_at(PAUSE_VERIFY_EXIT);
}

/* ------------------------------------------------------------ bug 3 */

/* t000 45 MiB, t001 10 MiB, t002 60 MiB, in a 100 MiB pool. */
static void placement_is_not_exhaustion(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {45 * MiB, 10 * MiB, 60 * MiB};
    char *dir, *path = one_shard(sizes, 3, &dir);
    sluice_options o = ef_opts(100 * MiB, 1 * MiB, 0);
    sluice_model *m = ef_open(path, &o);
    sluice_tensor *a = NULL, *h = NULL, *big = NULL;
    /* t000 lands at 0, its read-ahead t001 at 45 MiB; t000 is then only
     * cached, t001 held. */
    assert_int_equal(sluice_acquire(m, "t000", &a), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "t001", &h), SLUICE_OK);
    assert_int_equal(sluice_release(a), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    uint64_t evictions = ef_stats(m).evictions;
    /* 90 MiB free or evictable, but no 60 MiB range can be made. */
    assert_int_equal(sluice_acquire(m, "t002", &big), SLUICE_E_POOL_EXHAUSTED);
    const char *msg = sluice_errmsg(m);
    if (!strstr(msg, "cannot be placed") || !strstr(msg, "largest range"))
        fail_msg("message does not tell placement: %s", msg);
    /* ...and nothing was evicted for it: t000 is still a cache hit. */
    assert_int_equal(ef_stats(m).evictions, evictions);
    uint64_t hits = ef_stats(m).cache_hits;
    assert_int_equal(sluice_acquire(m, "t000", &a), SLUICE_OK);
    assert_int_equal(ef_stats(m).cache_hits, hits + 1);
    ef_check_handle(a);
    assert_int_equal(sluice_release(a), SLUICE_OK);
    /* Once the handle that splits the pool goes, the big one fits. */
    assert_int_equal(sluice_release(h), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "t002", &big), SLUICE_OK);
    ef_check_handle(big);
    assert_int_equal(sluice_release(big), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

/* ------------------------------------------------------------ bug 9 */

typedef struct truncated_seen {
    int status[16];
    size_t calls;
} truncated_seen;

static int note_status(void *user, sluice_tensor *t, int status,
                       const struct sluice_tensor_info *info, const char *message)
{
    truncated_seen *s = user;
    (void)message;
    s->status[info->index] = status;
    s->calls++;
    if (t)
        ef_check_handle(t);
    sluice_release(t);
    return 0;
}

/* 16 tensors of 256 KiB read as one coalesced read; the file is cut in
 * the middle of tensor 8 after open. */
static void truncated_file_fails_only_past_its_end(void **state)
{
    (void)state;
    uint64_t sizes[16];
    for (int k = 0; k < 16; k++)
        sizes[k] = 256 * 1024;
    for (int how = 0; how < 2; how++) {
        char *dir, *path = one_shard(sizes, 16, &dir);
        sluice_options o = ef_opts(64 * MiB, 8 * MiB, 0);
        sluice_model *m = ef_open(path, &o);
        struct sluice_tensor_info t8 = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find(m, "t008", &t8), SLUICE_OK);
        assert_int_equal(truncate(path, (off_t)(t8.offset + t8.nbytes / 2)), 0);
        if (how == 0) {
            truncated_seen seen = {0};
            assert_int_equal(sluice_stream(m, NULL, 0, note_status, &seen),
                             SLUICE_E_FILE_CHANGED);
            assert_int_equal(seen.calls, 16);
            for (int k = 0; k < 16; k++)
                if (seen.status[k] != (k < 8 ? SLUICE_OK : SLUICE_E_FILE_CHANGED))
                    fail_msg("stream: tensor %d: %s", k, sluice_strerror(seen.status[k]));
        } else {
            /* t000 alone, then read-ahead reads t001..t015 in one read. */
            sluice_tensor *t = NULL;
            assert_int_equal(sluice_acquire(m, "t000", &t), SLUICE_OK);
            assert_int_equal(sluice_release(t), SLUICE_OK);
            assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
            assert_int_equal(ef_stats(m).failures, 8);
            for (int k = 1; k < 16; k++) {
                char name[8];
                snprintf(name, sizeof name, "t%03d", k);
                int rc = sluice_acquire(m, name, &t);
                if (rc != (k < 8 ? SLUICE_OK : SLUICE_E_FILE_CHANGED))
                    fail_msg("acquire %s: %s: %s", name, sluice_strerror(rc), sluice_errmsg(m));
                if (rc == SLUICE_OK)
                    ef_check_handle(t);
                else if (!strstr(sluice_errmsg(m), "shrank") ||
                         !strstr(sluice_errmsg(m), "the file is now"))
                    fail_msg("acquire %s: %s", name, sluice_errmsg(m));
                sluice_release(t);
            }
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
        free(path);
        tu_rmtree(dir);
        free(dir);
    }
}

/* ------------------------------------------------------------ trim */

static uint64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    unsigned long long size = 0, resident = 0;
    assert_int_equal(fscanf(f, "%llu %llu", &size, &resident), 2);
    fclose(f);
    return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* A hole between two held buffers is given back once: a second trim
 * with nothing loaded in between gives back nothing. */
static void trim_counts_each_page_once(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {8 * MiB, 8 * MiB, 8 * MiB};
    char *dir, *path = one_shard(sizes, 3, &dir);
    sluice_options o = ef_opts(64 * MiB, 1 * MiB, 0);
    sluice_model *m = ef_open(path, &o);
    sluice_tensor *t[3];
    for (int k = 0; k < 3; k++)
        assert_int_equal(sluice_acquire_index(m, (size_t)k, &t[k]), SLUICE_OK);
    assert_int_equal(sluice_release(t[1]), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    uint64_t first = 0, second = 1;
    assert_int_equal(sluice_trim(m, &first), SLUICE_OK);
    assert_int_equal(sluice_trim(m, &second), SLUICE_OK);
    if (first < 7 * MiB || first > 9 * MiB || second != 0)
        fail_msg("trim gave back %llu, then %llu bytes (want about 8 MiB, then 0)",
                 (unsigned long long)first, (unsigned long long)second);
    ef_check_handle(t[0]);
    ef_check_handle(t[2]);
    assert_int_equal(sluice_release(t[0]), SLUICE_OK);
    assert_int_equal(sluice_release(t[2]), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void trim_gives_memory_back(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {48 * MiB, 1 * MiB};
    char *dir, *path = one_shard(sizes, 2, &dir);
    sluice_options o = ef_opts(256 * MiB, 8 * MiB, 0);
    sluice_model *m = ef_open(path, &o);
    sluice_tensor *big = NULL, *small = NULL;
    assert_int_equal(sluice_acquire(m, "t001", &small), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "t000", &big), SLUICE_OK);
    assert_int_equal(sluice_release(big), SLUICE_OK);
    assert_int_equal(sl_engine_quiesce(m), SLUICE_OK);
    uint64_t before = resident_bytes(), released = 0;
    assert_int_equal(sluice_trim(m, &released), SLUICE_OK);
    uint64_t after = resident_bytes();
    assert_true(released >= 40 * MiB);
    assert_true(released <= 64 * MiB);   /* only pages ever touched, not the 256 MiB */
    if (before < after + 40 * MiB)
        fail_msg("resident %llu -> %llu bytes: trim gave back too little",
                 (unsigned long long)before, (unsigned long long)after);
    /* The held handle is untouched; the pool still works. */
    ef_check_handle(small);
    assert_int_equal(sluice_release(small), SLUICE_OK);
    assert_int_equal(sluice_acquire(m, "t000", &big), SLUICE_OK);
    ef_check_handle(big);
    assert_int_equal(sluice_release(big), SLUICE_OK);
    assert_int_equal(sluice_trim(NULL, &released), SLUICE_E_INVAL);
    assert_int_equal(released, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

/* ------------------------------------------------------------ cancel, progress */

typedef struct canceller {
    sluice_cancel *token;
    signal_flag third, requested;
    size_t delivered;
} canceller;

static int pause_at_third(void *user, sluice_tensor *t, int status,
                          const struct sluice_tensor_info *info, const char *message)
{
    canceller *c = user;
    (void)info;
    (void)message;
    assert_int_equal(status, SLUICE_OK);
    sluice_release(t);
    if (++c->delivered == 3) {
        flag_raise(&c->third);
        assert_true(flag_wait(&c->requested, 30000));
    }
    return 0;
}

static void *request_cancel(void *arg)
{
    canceller *c = arg;
    if (flag_wait(&c->third, 30000))
        sluice_cancel_request(c->token);
    flag_raise(&c->requested);
    return NULL;
}

static void cancel_from_another_thread(void **state)
{
    (void)state;
    char *dir = ef_model(2, ef_sizes, EF_NSIZES, 5);
    sluice_options o = ef_opts(64 * MiB, 64 * 1024, 0);
    sluice_model *m = ef_open(dir, &o);
    canceller c = {.third = SIGNAL_FLAG_INIT, .requested = SIGNAL_FLAG_INIT};
    assert_int_equal(sluice_cancel_create(&c.token), SLUICE_OK);
    sluice_stream_options so;
    assert_int_equal(sluice_stream_options_init(&so), SLUICE_OK);
    so.cancel = c.token;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, request_cancel, &c), 0);
    int rc = sluice_stream_ex(m, NULL, 0, pause_at_third, &c, &so);
    join_or_abort(th, 30, "the cancelling thread");
    assert_int_equal(rc, SLUICE_E_CANCELLED);
    assert_non_null(strstr(sluice_errmsg(m), "cancelled"));
    assert_int_equal(c.delivered, 3);
    assert_true(sluice_cancel_requested(c.token));
    /* Still requested: the next stream delivers nothing. */
    c.delivered = 0;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, pause_at_third, &c, &so), SLUICE_E_CANCELLED);
    assert_int_equal(c.delivered, 0);
    /* Reset: it runs to the end; nothing of the stopped streams is held. */
    sluice_cancel_reset(c.token);
    ef_stream_seen seen = {.n = sluice_count(m)};
    seen.seen = calloc(seen.n, 1);
    assert_non_null(seen.seen);
    assert_int_equal(sluice_stream_ex(m, NULL, 0, ef_stream_cb, &seen, &so), SLUICE_OK);
    assert_int_equal(seen.delivered, seen.n);
    free(seen.seen);
    assert_int_equal(ef_stats(m).pool_in_use <= 64 * MiB, 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    sluice_cancel_free(c.token);
    sluice_cancel_free(NULL);
    sluice_cancel_request(NULL);
    assert_int_equal(sluice_cancel_requested(NULL), 0);
    tu_rmtree(dir);
    free(dir);
}

typedef struct late_cancel {
    sluice_cancel *token;
    size_t delivered, n;
} late_cancel;

static int cancel_at_last(void *user, sluice_tensor *t, int status,
                          const struct sluice_tensor_info *info, const char *message)
{
    late_cancel *c = user;
    (void)info;
    (void)message;
    assert_int_equal(status, SLUICE_OK);
    sluice_release(t);
    if (++c->delivered == c->n)
        sluice_cancel_request(c->token);
    return 0;
}

static int cancel_at_first(void *user, sluice_tensor *t, int status,
                           const struct sluice_tensor_info *info, const char *message)
{
    late_cancel *c = user;
    (void)info;
    (void)message;
    (void)status;
    sluice_release(t);
    if (++c->delivered == 1)
        sluice_cancel_request(c->token);
    return 0;
}

static void count_progress(void *user, const struct sluice_stream_progress *p)
{
    (void)p;
    ++*(size_t *)user;
}

/* A cancel after every tensor was delivered is too late to count; the
 * progress callback's last call comes once, also for an empty list and
 * for a stream cancelled in the middle of a batch. */
static void cancel_and_progress_edges(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 13);
    sluice_options o = ef_opts(64 * MiB, 64 * 1024, 0);
    sluice_model *m = ef_open(dir, &o);
    late_cancel c = {.n = sluice_count(m)};
    assert_int_equal(sluice_cancel_create(&c.token), SLUICE_OK);
    size_t calls = 0;
    sluice_stream_options so;
    sluice_stream_options_init(&so);
    so.cancel = c.token;
    so.progress = count_progress;
    so.progress_user = &calls;
    so.progress_interval_ms = 3600 * 1000;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, cancel_at_last, &c, &so), SLUICE_OK);
    assert_int_equal(c.delivered, c.n);
    assert_int_equal(calls, 1);
    sluice_cancel_reset(c.token);
    calls = 0;
    c.delivered = 0;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, cancel_at_first, &c, &so), SLUICE_E_CANCELLED);
    assert_int_equal(c.delivered, 1);
    assert_int_equal(calls, 1);
    sluice_cancel_reset(c.token);
    calls = 0;
    const char *none = NULL;
    assert_int_equal(sluice_stream_ex(m, &none, 0, cancel_at_first, &c, &so), SLUICE_OK);
    assert_int_equal(calls, 1);
    /* the options' tail padding counts as unknown bytes */
    sluice_options padded;
    sluice_options_init(&padded);
    size_t end = offsetof(sluice_options, signature_path) + sizeof padded.signature_path;
    if (end < sizeof padded) {
        ((unsigned char *)&padded)[end] = 1;
        sluice_model *bad = NULL;
        assert_int_equal(sluice_open(dir, &padded, &bad), SLUICE_E_INVAL);
        assert_non_null(strstr(sluice_errmsg(bad), "not zero"));
        sluice_close(bad);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    sluice_cancel_free(c.token);
    tu_rmtree(dir);
    free(dir);
}

typedef struct progress_seen {
    size_t calls, last_tensors;
    uint64_t last_bytes, total_bytes;
    size_t total_tensors;
    int in_callback;
} progress_seen;

static void note_progress(void *user, const struct sluice_stream_progress *p)
{
    progress_seen *s = user;
    assert_int_equal(p->size, sizeof *p);
    assert_false(s->in_callback);
    assert_true(p->tensors_done >= s->last_tensors);
    assert_true(p->bytes_done >= s->last_bytes);
    assert_true(p->tensors_done <= p->tensors_total);
    s->calls++;
    s->last_tensors = p->tensors_done;
    s->last_bytes = p->bytes_done;
    s->total_bytes = p->bytes_total;
    s->total_tensors = p->tensors_total;
}

static int count_and_release(void *user, sluice_tensor *t, int status,
                             const struct sluice_tensor_info *info, const char *message)
{
    (void)info;
    (void)message;
    (void)user;
    assert_int_equal(status, SLUICE_OK);
    sluice_release(t);
    return 0;
}

/* Releases, with seen->in_callback set while it runs, so that the
 * progress callback can check it is never called from inside. */
static int mark_and_release(void *user, sluice_tensor *t, int status,
                            const struct sluice_tensor_info *info, const char *message)
{
    progress_seen *seen = user;
    seen->in_callback = 1;
    int rc = count_and_release(NULL, t, status, info, message);
    seen->in_callback = 0;
    return rc;
}

static void progress_reaches_the_total(void **state)
{
    (void)state;
    char *dir = ef_model(2, ef_sizes, EF_NSIZES, 9);
    sluice_options o = ef_opts(64 * MiB, 64 * 1024, 0);
    sluice_model *m = ef_open(dir, &o);
    uint64_t total = 0;
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &info), SLUICE_OK);
        total += info.nbytes;
    }
    progress_seen seen = {0};
    sluice_stream_options so;
    sluice_stream_options_init(&so);
    so.progress = note_progress;
    so.progress_user = &seen;
    so.progress_interval_ms = 0;        /* every batch */
    assert_int_equal(sluice_stream_ex(m, NULL, 0, mark_and_release, &seen, &so), SLUICE_OK);
    assert_true(seen.calls >= 1);
    assert_int_equal(seen.last_tensors, sluice_count(m));
    assert_int_equal(seen.total_tensors, sluice_count(m));
    assert_int_equal(seen.last_bytes, total);
    assert_int_equal(seen.total_bytes, total);
    /* A long interval: only the final call. */
    memset(&seen, 0, sizeof seen);
    so.progress_interval_ms = 3600 * 1000;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, count_and_release, NULL, &so), SLUICE_OK);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.last_tensors, sluice_count(m));
    /* Options from a newer header: a zero tail is fine, a set one is not. */
    struct {
        sluice_stream_options o;
        unsigned char tail[16];
    } newer;
    memset(&newer, 0, sizeof newer);
    sluice_stream_options_init(&newer.o);
    newer.o.size = sizeof newer;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, count_and_release, NULL, &newer.o), SLUICE_OK);
    newer.tail[3] = 1;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, count_and_release, NULL, &newer.o),
                     SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "not zero"));
    so.size = 1;
    assert_int_equal(sluice_stream_ex(m, NULL, 0, count_and_release, NULL, &so), SLUICE_E_INVAL);
    assert_int_equal(sluice_stream_options_init(NULL), SLUICE_E_INVAL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_stream_callbacks_do_not_deadlock),
        cmocka_unit_test(two_models_callbacks_do_not_deadlock),
        cmocka_unit_test(refusal_fails_only_the_callback),
        cmocka_unit_test(refusal_survives_a_pump_before_the_caller_leaves),
        cmocka_unit_test(refusal_of_a_nested_stream_fails_it_alone),
        cmocka_unit_test(close_waits_for_stream_exit),
        cmocka_unit_test(close_waits_for_release_exit),
        cmocka_unit_test(close_waits_for_verify_exit),
        cmocka_unit_test(placement_is_not_exhaustion),
        cmocka_unit_test(truncated_file_fails_only_past_its_end),
        cmocka_unit_test(trim_gives_memory_back),
        cmocka_unit_test(trim_counts_each_page_once),
        cmocka_unit_test(cancel_from_another_thread),
        cmocka_unit_test(progress_reaches_the_total),
        cmocka_unit_test(cancel_and_progress_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
