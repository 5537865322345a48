/* test_part_engine.c: parts of a local file read through the engine
 * (sl_engine_read_spans): on the model's I/O seam (its attempts move),
 * counted as a load's reads (reads, bytes_read without the gaps,
 * retries), row segments less than SLUICE_PART_GAP apart one read and
 * farther ones a read each, a read at most chunk_bytes; the caller woken
 * when its reads are all back, not at each completion; faults injected
 * in the seam retried (EINTR, EAGAIN, short) or failing the part alone
 * (EIO, the file ending early), never sticking; parts on several
 * threads beside loads of whole tensors with a queue depth of 2, each
 * equal to the file's bytes; a cancelled part (a token requested before
 * the call, or while its reads are in flight) reads nothing more, gives
 * no handle nor pool room, is no failure, and later parts read whole.
 * Runs on both backends (engine.cmake). */
#include "engine_fixture.h"

#include <pthread.h>
#include <time.h>

/* w: BF16 [256, 512], a row 1024 bytes: at world 4 a segment of 256
 * bytes, 768 apart (one read); x: U8 [64, 16384], at world 4 segments of
 * 4096 bytes 12288 apart (a read each). */
#define W_ROWS 256u
#define W_ROW 1024u
#define X_ROWS 64u
#define X_ROW 16384u
#define W_BYTES (W_ROWS * W_ROW)
#define X_BYTES (X_ROWS * X_ROW)

typedef struct fx {
    char *dir, *file;
    unsigned char *bytes; /* w then x, as in the file */
    uint64_t data_start;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_disk_or_tmpdir();
    f->file = tu_join(f->dir, "model.safetensors");
    f->bytes = malloc(W_BYTES + X_BYTES);
    assert_non_null(f->bytes);
    uint64_t seed = 77;
    for (uint64_t b = 0; b < W_BYTES + X_BYTES; b += 8) {
        uint64_t r = ef_rng(&seed);
        memcpy(f->bytes + b, &r, 8);
    }
    char h[256];
    snprintf(h, sizeof h,
             "{\"w\":{\"dtype\":\"BF16\",\"shape\":[%u,%u],\"data_offsets\":[0,%u]},"
             "\"x\":{\"dtype\":\"U8\",\"shape\":[%u,%u],\"data_offsets\":[%u,%u]}}",
             W_ROWS, W_ROW / 2, W_BYTES, X_ROWS, X_ROW, W_BYTES, W_BYTES + X_BYTES);
    tu_write_safetensors(f->file, h, f->bytes, W_BYTES + X_BYTES);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->file);
    free(f->bytes);
    free(f);
    return 0;
}

static sluice_model *open_model(const fx *f, unsigned qd, uint64_t chunk)
{
    sluice_options o = ef_opts(4u << 20, chunk, 0);
    o.verify = SLUICE_VERIFY_OFF;
    o.queue_depth = qd;
    return ef_open(f->file, &o);
}

static struct sluice_stats stats_of(sluice_model *m)
{
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    return st;
}

/* Part rank of n along dim 1 of w (x when is_x) must equal the file's. */
static void check_part(const fx *f, int is_x, uint64_t rank, uint64_t n, const unsigned char *got)
{
    uint64_t rows = is_x ? X_ROWS : W_ROWS, row = is_x ? X_ROW : W_ROW, seg = row / n;
    const unsigned char *whole = f->bytes + (is_x ? W_BYTES : 0);
    for (uint64_t r = 0; r < rows; r++)
        if (memcmp(got + r * seg, whole + r * row + rank * seg, (size_t)seg) != 0)
            fail_msg("%s part %llu of %llu: row %llu differs", is_x ? "x" : "w",
                     (unsigned long long)rank, (unsigned long long)n, (unsigned long long)r);
}

/* On the seam, counted as reads; close rows one read, far rows a read
 * each; a dim-0 part cut at chunk_bytes; acquire_part the same way. */
static void test_reads_counted(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 8, 64u << 10);
    unsigned char *buf = malloc(X_BYTES);
    assert_non_null(buf);
    struct sluice_stats st0 = stats_of(m);
    uint64_t at0 = sl_engine_io_attempts(m);
    for (uint64_t r = 0; r < 4; r++) {
        assert_int_equal(sluice_read_part_into(m, "w", 1, r, 4, buf, W_BYTES / 4), SLUICE_OK);
        check_part(f, 0, r, 4, buf);
    }
    struct sluice_stats st = stats_of(m);
    /* 256 rows of 256 bytes, 768 apart: 64 KiB of the file a read (chunk_bytes) */
    assert_int_equal(st.reads - st0.reads, 4 * 4);
    assert_int_equal(st.bytes_read - st0.bytes_read, W_BYTES);
    assert_true(sl_engine_io_attempts(m) - at0 >= 16);
    assert_int_equal(st.backend, st0.backend);

    st0 = st;
    assert_int_equal(sluice_read_part_into(m, "x", 1, 3, 4, buf, X_BYTES / 4), SLUICE_OK);
    check_part(f, 1, 3, 4, buf);
    st = stats_of(m);
    assert_int_equal(st.reads - st0.reads, X_ROWS); /* 12288 apart: one read a row */
    assert_int_equal(st.bytes_read - st0.bytes_read, X_BYTES / 4);

    st0 = st;
    assert_int_equal(sluice_read_part_into(m, "x", 0, 1, 2, buf, X_BYTES / 2), SLUICE_OK);
    assert_memory_equal(buf, f->bytes + W_BYTES + X_BYTES / 2, X_BYTES / 2);
    st = stats_of(m);
    assert_int_equal(st.reads - st0.reads, (X_BYTES / 2) / (64u << 10));

    sluice_tensor *t = NULL;
    st0 = st;
    assert_int_equal(sluice_acquire_part(m, "w", 1, 2, 4, &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_size(t), W_BYTES / 4);
    check_part(f, 0, 2, 4, sluice_tensor_data(t));
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(stats_of(m).reads - st0.reads, 4);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void count_woken(void *ctx, int where)
{
    if (where == 8) /* a span read's caller woke (engine_hooks.h) */
        (*(unsigned *)ctx)++;
}

/* The caller of a part read wakes when its reads are all done, not at
 * each completion (nor at another caller's): x at world 4 along dim 1 is
 * 64 reads, two in flight at most. Its wait is woken once; once more when
 * it starts the reads it queued, and one spurious wakeup allowed. */
static void test_woken_once(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 2, 64u << 10);
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    unsigned woken = 0;
    assert_int_equal(sl_engine_set_pause(m, count_woken, &woken), SLUICE_OK);
    struct sluice_stats st0 = stats_of(m);
    assert_int_equal(sluice_read_part_into(m, "x", 1, 1, 4, buf, X_BYTES / 4), SLUICE_OK);
    assert_int_equal(sl_engine_set_pause(m, NULL, NULL), SLUICE_OK);
    check_part(f, 1, 1, 4, buf);
    assert_int_equal(stats_of(m).reads - st0.reads, X_ROWS);
    assert_in_range(woken, 1, 3);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* Faults in the seam: EINTR, EAGAIN and short reads retried (counted),
 * EIO and an early end fail that part alone, and the next part reads. */
static void test_faults(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 1, 8u << 20);
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    const sl_io_fault retried[] = {SL_IO_FAULT_EINTR, SL_IO_FAULT_EAGAIN, SL_IO_FAULT_SHORT};
    for (size_t k = 0; k < 3; k++) {
        uint64_t before = stats_of(m).retries;
        memset(buf, 0, X_BYTES / 4);
        assert_int_equal(sl_engine_set_fault(m, retried[k], 1, 2), SLUICE_OK);
        assert_int_equal(sluice_read_part_into(m, "w", 1, 1, 4, buf, W_BYTES / 4), SLUICE_OK);
        check_part(f, 0, 1, 4, buf);
        assert_true(stats_of(m).retries - before >= 2);
    }
    uint64_t failures = stats_of(m).failures;
    assert_int_equal(sl_engine_set_fault(m, SL_IO_FAULT_EIO, 3, 1), SLUICE_OK);
    assert_int_equal(sluice_read_part_into(m, "x", 1, 0, 4, buf, X_BYTES / 4), SLUICE_E_IO);
    const char *msg = sluice_errmsg(m);
    assert_non_null(strstr(msg, "tensor \"x\""));
    assert_non_null(strstr(msg, "model.safetensors"));
    assert_int_equal(stats_of(m).failures, failures + 1);
    assert_int_equal(sl_engine_set_fault(m, SL_IO_FAULT_EOF, 1, 1), SLUICE_OK);
    assert_int_equal(sluice_read_part_into(m, "x", 1, 0, 4, buf, X_BYTES / 4),
                     SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "shrank after open"));
    sluice_tensor *t = NULL;
    assert_int_equal(sl_engine_set_fault(m, SL_IO_FAULT_EIO, 1, 1), SLUICE_OK);
    assert_int_equal(sluice_acquire_part(m, "w", 1, 0, 4, &t), SLUICE_E_IO);
    assert_null(t);
    /* not sticky */
    assert_int_equal(sluice_read_part_into(m, "x", 1, 0, 4, buf, X_BYTES / 4), SLUICE_OK);
    check_part(f, 1, 0, 4, buf);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

typedef struct race {
    const fx *f;
    sluice_model *m;
    unsigned rank;
} race;

static void *race_parts(void *arg)
{
    race *r = arg;
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    for (int k = 0; k < 20; k++) {
        int is_x = (k + (int)r->rank) % 2;
        uint64_t len = (is_x ? X_BYTES : W_BYTES) / 4;
        assert_int_equal(sluice_read_part_into(r->m, is_x ? "x" : "w", 1, r->rank, 4, buf, len),
                         SLUICE_OK);
        check_part(r->f, is_x, r->rank, 4, buf);
    }
    free(buf);
    return NULL;
}

/* Four ranks on threads and whole loads at once, two reads in flight at
 * most between them: every part right, nothing waits for ever. */
static void test_threads_with_loads(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 2, 16u << 10);
    pthread_t th[4];
    race rc[4];
    for (unsigned k = 0; k < 4; k++) {
        rc[k] = (race){f, m, k};
        assert_int_equal(pthread_create(&th[k], NULL, race_parts, &rc[k]), 0);
    }
    for (int k = 0; k < 10; k++) {
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire(m, k % 2 ? "x" : "w", &t), SLUICE_OK);
        assert_memory_equal(sluice_tensor_data(t), f->bytes + (k % 2 ? W_BYTES : 0),
                            k % 2 ? X_BYTES : W_BYTES);
        assert_int_equal(sluice_release(t), SLUICE_OK);
        assert_int_equal(sl_engine_drop_cache(m), SLUICE_OK);
    }
    for (unsigned k = 0; k < 4; k++)
        pthread_join(th[k], NULL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* A cancelled part read (sluice_read_part_into_ex, sluice_acquire_part_ex):
 * a token requested before the call reads nothing (bytes_read and reads
 * unchanged), gives no handle and takes nothing of the pool, and is no
 * failure; NULL options are no token. */
static void test_cancel_before(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 2, 64u << 10);
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    sluice_cancel *c = NULL;
    assert_int_equal(sluice_cancel_create(&c), SLUICE_OK);
    sluice_cancel_request(c);
    sluice_part_options po;
    assert_int_equal(sluice_part_options_init(&po), SLUICE_OK);
    assert_int_equal(po.size, sizeof po);
    assert_null(po.cancel);
    po.cancel = c;
    struct sluice_stats st0 = stats_of(m);
    assert_int_equal(sluice_read_part_into_ex(m, "x", 1, 1, 4, buf, X_BYTES / 4, &po),
                     SLUICE_E_CANCELLED);
    assert_non_null(strstr(sluice_errmsg(m), "cancelled"));
    sluice_tensor *t = (sluice_tensor *)buf; /* set to NULL on failure */
    assert_int_equal(sluice_acquire_part_ex(m, "w", 1, 2, 4, &t, &po), SLUICE_E_CANCELLED);
    assert_null(t);
    struct sluice_stats st1 = stats_of(m);
    assert_int_equal(st1.bytes_read, st0.bytes_read);
    assert_int_equal(st1.reads, st0.reads);
    assert_int_equal(st1.pool_in_use, st0.pool_in_use);
    assert_int_equal(st1.failures, st0.failures);
    /* NULL options, and options with no token: read as the plain calls */
    assert_int_equal(sluice_read_part_into_ex(m, "x", 1, 1, 4, buf, X_BYTES / 4, NULL), SLUICE_OK);
    check_part(f, 1, 1, 4, buf);
    po.cancel = NULL;
    assert_int_equal(sluice_acquire_part_ex(m, "w", 1, 2, 4, &t, &po), SLUICE_OK);
    check_part(f, 0, 2, 4, sluice_tensor_data(t));
    assert_int_equal(sluice_release(t), SLUICE_OK);
    /* an options size this library does not know */
    po.size = 1;
    assert_int_equal(sluice_read_part_into_ex(m, "x", 1, 1, 4, buf, X_BYTES / 4, &po),
                     SLUICE_E_INVAL);
    assert_int_equal(sluice_part_options_init(NULL), SLUICE_E_INVAL);
    sluice_cancel_free(c);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* where 10 (engine_hooks.h): the part's first reads are out, the lock not
 * held: the token is requested there, once */
typedef struct cancel_at {
    sluice_cancel *c;
    unsigned fired;
} cancel_at;

static void at_spans_issued(void *ctx, int where)
{
    cancel_at *a = ctx;
    if (where == 10 && a->c && !a->fired++)
        sluice_cancel_request(a->c);
}

/* A token requested once the part's first reads are out (x at world 4
 * along dim 1 is 64 reads, two in flight at most), before the part is
 * complete: the ones in flight are waited for, the call
 * says SLUICE_E_CANCELLED and is no failure; later part reads on the same
 * model (the same token reset, and none) are whole. */
static void test_cancel_in_flight(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 2, 64u << 10);
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    cancel_at a = {0};
    assert_int_equal(sluice_cancel_create(&a.c), SLUICE_OK);
    sluice_part_options po;
    assert_int_equal(sluice_part_options_init(&po), SLUICE_OK);
    po.cancel = a.c;
    assert_int_equal(sl_engine_set_pause(m, at_spans_issued, &a), SLUICE_OK);
    struct sluice_stats st0 = stats_of(m);
    assert_int_equal(sluice_read_part_into_ex(m, "x", 1, 1, 4, buf, X_BYTES / 4, &po),
                     SLUICE_E_CANCELLED);
    assert_int_equal(a.fired, 1);
    struct sluice_stats st1 = stats_of(m);
    /* its first reads were out; the rest may have gone out and come back
     * before the request (their completions issue more, no hook holds
     * them): at most the whole part, never more */
    assert_true(st1.reads - st0.reads >= 1);
    assert_true(st1.reads - st0.reads <= X_ROWS);
    assert_true(st1.bytes_read - st0.bytes_read <= X_BYTES / 4);
    assert_int_equal(st1.failures, st0.failures);
    /* the same through an acquire: no handle, its pool buffer given back */
    sluice_cancel_reset(a.c);
    a.fired = 0;
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_part_ex(m, "x", 1, 2, 4, &t, &po), SLUICE_E_CANCELLED);
    assert_int_equal(a.fired, 1);
    assert_null(t);
    assert_int_equal(stats_of(m).pool_in_use, st0.pool_in_use);
    assert_int_equal(sl_engine_set_pause(m, NULL, NULL), SLUICE_OK);
    sluice_cancel_reset(a.c);
    assert_int_equal(sluice_read_part_into_ex(m, "x", 1, 1, 4, buf, X_BYTES / 4, &po), SLUICE_OK);
    check_part(f, 1, 1, 4, buf);
    assert_int_equal(sluice_acquire_part(m, "x", 1, 2, 4, &t), SLUICE_OK);
    check_part(f, 1, 2, 4, sluice_tensor_data(t));
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(stats_of(m).failures, st0.failures);
    sluice_cancel_free(a.c);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* where 10, as at_spans_issued; then the model's reads counted so far
 * (the lock not held), and the hook stays 200 ms: the reads in flight
 * come back meanwhile, and their completions pump, before the caller has
 * woken to see the token */
typedef struct cancel_stay {
    cancel_at a;
    sluice_model *m;
    uint64_t reads_at;  /* reads done just after the request */
} cancel_stay;

static void at_spans_issued_stay(void *ctx, int where)
{
    cancel_stay *s = ctx;
    if (where == 10 && s->a.c && !s->a.fired++) {
        sluice_cancel_request(s->a.c);
        s->reads_at = stats_of(s->m).reads;
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
    }
}

/* A requested token stops the part's reads at once, not when its caller
 * wakes: the completions of the reads in flight issue none of the rest
 * (x at world 4 along dim 1 is 64 reads, two in flight at most). The
 * reads issued by the request were done, or at most two in flight, when
 * the hook counted them: no more than two are done after that. Without
 * the token's check in issue_spans the rest of the 64 went out while the
 * hook stayed. */
static void test_cancel_stops_issuing(void **state)
{
    fx *f = *state;
    cancel_stay s = {{0}, open_model(f, 2, 64u << 10), 0};
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    assert_int_equal(sluice_cancel_create(&s.a.c), SLUICE_OK);
    sluice_part_options po;
    assert_int_equal(sluice_part_options_init(&po), SLUICE_OK);
    po.cancel = s.a.c;
    assert_int_equal(sl_engine_set_pause(s.m, at_spans_issued_stay, &s), SLUICE_OK);
    struct sluice_stats st0 = stats_of(s.m);
    assert_int_equal(sluice_read_part_into_ex(s.m, "x", 1, 1, 4, buf, X_BYTES / 4, &po),
                     SLUICE_E_CANCELLED);
    assert_int_equal(s.a.fired, 1);
    struct sluice_stats st1 = stats_of(s.m);
    assert_true(st1.reads - st0.reads >= 1);
    assert_true(st1.reads <= s.reads_at + 2);
    assert_int_equal(st1.failures, st0.failures);
    assert_int_equal(sl_engine_set_pause(s.m, NULL, NULL), SLUICE_OK);
    sluice_cancel_free(s.a.c);
    free(buf);
    assert_int_equal(sluice_close(s.m), SLUICE_OK);
}

/* where 10: the token requested, the hook staying 200 ms (the reads in
 * flight come back, none of the rest goes out: issue_spans), then reset
 * (one token serving many calls) before the caller has seen it */
static void at_spans_issued_reset(void *ctx, int where)
{
    cancel_at *a = ctx;
    if (where == 10 && a->c && !a->fired++) {
        sluice_cancel_request(a->c);
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
        sluice_cancel_reset(a->c);
    }
}

/* A token requested and reset before the caller saw it: the part goes
 * on and is whole (the caller pumps its held runs, nothing being in
 * flight to do it; without that it waited for ever). */
static void test_cancel_reset_goes_on(void **state)
{
    fx *f = *state;
    sluice_model *m = open_model(f, 2, 64u << 10);
    unsigned char *buf = malloc(X_BYTES / 4);
    assert_non_null(buf);
    cancel_at a = {0};
    assert_int_equal(sluice_cancel_create(&a.c), SLUICE_OK);
    sluice_part_options po;
    assert_int_equal(sluice_part_options_init(&po), SLUICE_OK);
    po.cancel = a.c;
    assert_int_equal(sl_engine_set_pause(m, at_spans_issued_reset, &a), SLUICE_OK);
    assert_int_equal(sluice_read_part_into_ex(m, "x", 1, 1, 4, buf, X_BYTES / 4, &po), SLUICE_OK);
    assert_int_equal(a.fired, 1);
    check_part(f, 1, 1, 4, buf);
    assert_int_equal(sl_engine_set_pause(m, NULL, NULL), SLUICE_OK);
    sluice_cancel_free(a.c);
    free(buf);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reads_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_woken_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_with_loads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_before, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_stops_issuing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_reset_goes_on, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
