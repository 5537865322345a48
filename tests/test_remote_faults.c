/* test_remote_faults.c: retries, timeouts and cancellation of remote reads
 * against the tests' own fault server (remote_fault_server.py, started
 * here on 127.0.0.1): 503 with and without Retry-After, 429, 404, a 200
 * that ignores Range, a short body, a stall past the timeout, a reset, a
 * flipped byte, an object that grew; each with the right retries
 * (counted), the right final code, nothing unverified handed out, no hang.
 * Skipped (77) when python3 cannot start the server. */
#include "mf_fixture.h"
#include "remote_fixture.h"
#include "util.h"

#include "sluice.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static rf_server srv;
static char *root;
static char model_url[256];
static unsigned char *good_b;   /* the bytes of tensor b */

#define B_SIZE (300u << 10)
#define MANY_N 24u
#define MANY_BYTES (64u << 10)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int setup(void **state)
{
    char why[256];
    rf_skip_without_curl();
    root = tu_tmpdir();
    char *p = tu_join(root, "m.safetensors");
    char header[512];
    snprintf(header, sizeof header,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[1000],\"data_offsets\":[0,1000]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[%u],\"data_offsets\":[1000,%u]}}",
             B_SIZE, 1000 + B_SIZE);
    tu_write_safetensors(p, header, NULL, 1000 + B_SIZE);
    /* its manifest */
    sluice_options o;
    sluice_options_init(&o);
    o.flags = SLUICE_F_HASH_ALL;
    sluice_model *m;
    assert_int_equal(sluice_open(p, &o, &m), SLUICE_OK);
    char text[512], ha[65], hb[65];
    uint8_t d[32];
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "a", &t), SLUICE_OK);
    sluice_tensor_digest(t, d);
    sluice_digest_hex(d, ha);
    sluice_release(t);
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_OK);
    sluice_tensor_digest(t, d);
    sluice_digest_hex(d, hb);
    good_b = malloc(B_SIZE);
    memcpy(good_b, sluice_tensor_data(t), B_SIZE);
    sluice_release(t);
    sluice_close(m);
    int n = snprintf(text, sizeof text, "{\"a\":\"%s\",\"b\":\"%s\"}", ha, hb);
    char *mf = tu_join(root, "m.safetensors.manifest.json");
    tu_write_file(mf, text, (size_t)n);
    free(mf);
    free(p);
    /* MANY_N tensors of MANY_BYTES: many reads queued behind one connection */
    char mh[4096];
    size_t k = (size_t)snprintf(mh, sizeof mh, "{");
    for (unsigned i = 0; i < MANY_N; i++)
        k += (size_t)snprintf(mh + k, sizeof mh - k,
                              "%s\"t%02u\":{\"dtype\":\"U8\",\"shape\":[%u],"
                              "\"data_offsets\":[%u,%u]}", i ? "," : "", i, MANY_BYTES,
                              i * MANY_BYTES, (i + 1) * MANY_BYTES);
    snprintf(mh + k, sizeof mh - k, "}");
    char *pm = tu_join(root, "many.safetensors");
    tu_write_safetensors(pm, mh, NULL, (size_t)MANY_N * MANY_BYTES);
    free(pm);
    if (!rf_fault_start(&srv, SLUICE_FAULT_SERVER, root, why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        exit(77);
    }
    snprintf(model_url, sizeof model_url, "%s/m.safetensors", srv.base);
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    rf_stop(&srv);
    tu_rmtree(root);
    free(root);
    free(good_b);
    (void)state;
    return 0;
}

static void arm(const char *mode, int count, const char *arg)
{
    char q[256];
    snprintf(q, sizeof q, "/ctl?mode=%s&count=%d&arg=%s", mode, count, arg ? arg : "");
    char *r = rf_get(&srv, q);
    assert_non_null(r);
    assert_string_equal(r, "ok");
    free(r);
}

static int faults_served(void)
{
    char *r = rf_get(&srv, "/ctl/stats");
    assert_non_null(r);
    const char *f = strstr(r, "faults=");
    int n = f ? atoi(f + 7) : -1;
    free(r);
    return n;
}

/* Waits (at most 60 s, for a loaded machine) until the fault server has
 * served a fault more than before: a request of the load is on the wire,
 * the event a close under test must come after. */
static void wait_fault_served(int before)
{
    for (int i = 0; i < 600 && faults_served() <= before; i++) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    assert_true(faults_served() > before);
}

static sluice_options fast_options(void)
{
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 4;
    o.remote_backoff_ms = 20;
    o.remote_stall_timeout_ms = 1000;
    o.remote_connect_timeout_ms = 2000;
    o.remote_deadline_ms = 20000;
    return o;
}

/* Opens the model (no fault armed), arms mode, acquires b (the first
 * acquire, at plan position 1: no read-ahead), checks the outcome. */
typedef struct outcome {
    int rc;
    uint64_t retries;
    int faults;
    double seconds;
    char msg[1024];
} outcome;

static outcome run(const sluice_options *o, const char *mode, int count, const char *arg)
{
    outcome out = {0};
    arm("ok", 0, NULL);
    int before = faults_served();
    sluice_model *m;
    int rc = sluice_open(model_url, o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    arm(mode, count, arg);
    double t0 = now_s();
    sluice_tensor *t = NULL;
    out.rc = sluice_acquire(m, "b", &t);
    out.seconds = now_s() - t0;
    snprintf(out.msg, sizeof out.msg, "%s", out.rc ? sluice_errmsg(m) : "");
    if (out.rc == SLUICE_OK) {
        assert_int_equal(sluice_tensor_size(t), B_SIZE);
        assert_memory_equal(sluice_tensor_data(t), good_b, B_SIZE);
        sluice_release(t);
    } else {
        assert_null(t);
    }
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    out.retries = st.remote_retries;
    assert_int_equal(sluice_close(m), SLUICE_OK);
    out.faults = faults_served() - before;
    arm("ok", 0, NULL);
    return out;
}

static void test_503_retried(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "status", 2, "503");
    assert_int_equal(r.rc, SLUICE_OK);
    assert_int_equal(r.retries, 2);
    assert_int_equal(r.faults, 2);
    (void)state;
}

static void test_retry_after(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "status_ra", 1, "503");
    assert_int_equal(r.rc, SLUICE_OK);
    assert_int_equal(r.retries, 1);
    assert_true(r.seconds >= 0.9);  /* Retry-After: 1, not the 20 ms backoff */
    assert_true(r.seconds < 5);
    (void)state;
}

static void test_429_and_500s(void **state)
{
    sluice_options o = fast_options();
    static const char *const codes[] = {"429", "500", "502", "504"};
    for (size_t i = 0; i < 4; i++) {
        outcome r = run(&o, "status", 1, codes[i]);
        assert_int_equal(r.rc, SLUICE_OK);
        assert_int_equal(r.retries, 1);
    }
    (void)state;
}

static void test_permanent_not_retried(void **state)
{
    sluice_options o = fast_options();
    static const char *const codes[] = {"404", "403", "416"};
    for (size_t i = 0; i < 3; i++) {
        outcome r = run(&o, "status", 5, codes[i]);
        assert_int_equal(r.rc, SLUICE_E_REMOTE);
        assert_int_equal(r.retries, 0);
        assert_int_equal(r.faults, 1);
        char want[16];
        snprintf(want, sizeof want, "HTTP %s", codes[i]);
        assert_non_null(strstr(r.msg, want));
    }
    (void)state;
}

static void test_attempts_bounded(void **state)
{
    sluice_options o = fast_options();
    o.remote_attempts = 3;
    outcome r = run(&o, "status", 100, "503");
    assert_int_equal(r.rc, SLUICE_E_REMOTE);
    assert_int_equal(r.faults, 3);
    assert_int_equal(r.retries, 2);
    assert_non_null(strstr(r.msg, "HTTP 503 (after 3 attempts)"));
    (void)state;
}

static void test_deadline_bounded(void **state)
{
    sluice_options o = fast_options();
    o.remote_deadline_ms = 500;
    outcome r = run(&o, "status_ra", 100, "503");   /* Retry-After 1 s > deadline */
    assert_int_equal(r.rc, SLUICE_E_REMOTE);
    assert_true(r.seconds < 1.5);
    assert_non_null(strstr(r.msg, "deadline"));
    (void)state;
}

static void test_range_ignored(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "norange", 1, NULL);
    assert_int_equal(r.rc, SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(r.msg, "ignores Range"));
    assert_int_equal(r.retries, 0);
    (void)state;
}

static void test_object_grew(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "grow", 1, NULL);
    assert_int_equal(r.rc, SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(r.msg, "changed after open"));
    (void)state;
}

/* Replies whose bytes belong elsewhere than asked: refused before any
 * byte lands, never retried, and named as what they are (the manifest
 * would catch most of them too, as SLUICE_E_CHECKSUM: the message shows
 * which check refused them). */
static void wrong_reply(const char *mode, int code, const char *why)
{
    sluice_options o = fast_options();
    outcome r = run(&o, mode, 1, NULL);
    assert_int_equal(r.rc, code);
    if (!strstr(r.msg, why))
        fail_msg("%s: %s", mode, r.msg);
    assert_int_equal(r.retries, 0);
}

static void test_wrong_range_refused(void **state)
{
    wrong_reply("shift", SLUICE_E_FILE_CHANGED, "Content-Range bytes");
    wrong_reply("widen", SLUICE_E_FILE_CHANGED, "Content-Range bytes");
    wrong_reply("nocr", SLUICE_E_REMOTE, "without a Content-Range");
    wrong_reply("long", SLUICE_E_FILE_CHANGED, "more bytes than");
    (void)state;
}

/* A 206 for part of the range (legal): the rest is asked again. */
static void test_partial_range_resumed(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "half", 1, NULL);
    assert_int_equal(r.rc, SLUICE_OK);
    assert_int_equal(r.retries, 1);
    assert_non_null(r.msg);
    (void)state;
}

static void test_short_body_resumed(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "short", 1, NULL);
    assert_int_equal(r.rc, SLUICE_OK);
    assert_int_equal(r.retries, 1);
    (void)state;
}

static void test_reset_retried(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "reset", 2, NULL);
    assert_int_equal(r.rc, SLUICE_OK);
    assert_int_equal(r.retries, 2);
    (void)state;
}

static void test_stall_times_out(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "stall", 1, "8");
    assert_int_equal(r.rc, SLUICE_OK);
    assert_int_equal(r.retries, 1);
    assert_true(r.seconds < 6);
    (void)state;
}

/* A slow link (the fault server paces every body at 1 MB/s) with many
 * reads queued behind one connection: the deadline (400 ms, less than the
 * whole load takes, more than one read takes) is each read's time on the
 * wire, so every tensor loads, none retried. Before the read's clock
 * started on the wire, the reads queued longest failed ("timed out after
 * 1 milliseconds with 0 bytes received"). The defaults scaled down: 8
 * connections, 32 deep, 8 MiB chunks, 120 s become 1, 32, 64 KiB, 0.4 s. */
typedef struct many_tally {
    unsigned ok, failed;
    char first_failure[512];
} many_tally;

static int many_cb(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
                   const char *message)
{
    many_tally *c = user;
    (void)info;
    if (status == SLUICE_OK) {
        c->ok++;
        sluice_release(t);
    } else if (c->failed++ == 0) {
        snprintf(c->first_failure, sizeof c->first_failure, "%s", message);
    }
    return 0;
}

static void test_slow_link_queued_reads_all_load(void **state)
{
    sluice_options o = fast_options();
    o.remote_connections = 1;
    o.queue_depth = 32;
    o.chunk_bytes = MANY_BYTES;
    o.remote_attempts = 1;          /* a timeout would fail the tensor */
    o.remote_deadline_ms = 400;
    o.remote_stall_timeout_ms = 1000;   /* a busy machine's pauses are no stall */
    char url[300];
    snprintf(url, sizeof url, "%s/many.safetensors", srv.base);
    arm("ok", 0, NULL);
    sluice_model *m;
    assert_int_equal(sluice_open(url, &o, &m), SLUICE_OK);
    arm("slow", 100000, "1000000");
    many_tally c = {0};
    double t0 = now_s();
    int rc = sluice_stream(m, NULL, 0, many_cb, &c);
    double took = now_s() - t0;
    if (rc != SLUICE_OK)
        fail_msg("%u of %u tensors failed (%.2f s): %s", c.failed, MANY_N, took, c.first_failure);
    assert_int_equal(c.ok, MANY_N);
    assert_true(took > 1.0);        /* really slower than the deadline, in all */
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.remote_retries, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    arm("ok", 0, NULL);
    (void)state;
}

/* One read that takes three times the deadline at a steady 200 KB/s:
 * steady progress is never failed by the deadline. Before, the deadline
 * cut the transfer (curl's total timeout) and no retry could follow. */
static void test_slow_read_longer_than_deadline(void **state)
{
    sluice_options o = fast_options();
    o.remote_attempts = 1;
    o.remote_deadline_ms = 500;
    o.remote_stall_timeout_ms = 1000;
    outcome r = run(&o, "slow", 1, "200000");
    if (r.rc != SLUICE_OK)
        fail_msg("%s", r.msg);
    assert_true(r.seconds > 1.0);
    assert_int_equal(r.retries, 0);
    (void)state;
}

/* A server that sends a byte every 100 ms never stalls for the stall
 * timeout, yet is far below 1 KiB/s: each attempt is stopped as too slow
 * within about one window, and the read fails within the deadline plus
 * an attempt, not after the 300 KiB it would take. */
static void test_trickle_fails_within_bound(void **state)
{
    sluice_options o = fast_options();
    o.remote_attempts = 3;
    o.remote_deadline_ms = 1500;
    o.remote_stall_timeout_ms = 500;
    outcome r = run(&o, "trickle", 100, "0.1");
    assert_int_equal(r.rc, SLUICE_E_REMOTE);
    if (!strstr(r.msg, "too slow"))
        fail_msg("%s", r.msg);
    assert_true(r.seconds < 1.5 + 0.5 + 1.5);
    (void)state;
}

/* A slow first byte, then a slow link: nothing for 3 s (under the 4 s
 * stall timeout), then 1500 bytes a second (over the 1 KiB/s floor). The
 * floor's window must run from the first byte: the wait for the reply is
 * the stall timeout's to bound. It ran from the attempt's start, so at
 * 4 s the window held 1.4 s of body, 3072 bytes where it asked 4000:
 * "fewer than 1024 bytes a second for 4000 ms (too slow)", on every
 * attempt alike, for a link that was moving at 1.5 KiB/s. */
static void test_slow_first_byte_then_slow_link(void **state)
{
    enum { LATE_N = 4000 };
    char *p = tu_join(root, "late.safetensors");
    tu_write_safetensors(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4000],"
                            "\"data_offsets\":[0,4000]}}", NULL, LATE_N);
    size_t len;
    unsigned char *file = tu_read_file(p, &len);
    assert_true(file && len > LATE_N);
    char url[400];
    snprintf(url, sizeof url, "%s/late.safetensors", srv.base);
    static unsigned char got[LATE_N];
    for (int blocking = 0; blocking < 2; blocking++) {
        sluice_options o = fast_options();
        o.remote_stall_timeout_ms = 4000;
        o.remote_attempts = 1;
        arm("ok", 0, NULL);
        sluice_model *m;
        if (sluice_open(url, &o, &m) != SLUICE_OK)
            fail_msg("open: %s", sluice_errmsg(m));
        arm("late", 1, "3,1500");
        double t0 = now_s();
        int rc;
        sluice_tensor *t = NULL;
        if (blocking) {
            rc = sluice_read_into(m, "a", 0, got, LATE_N);
        } else if ((rc = sluice_acquire(m, "a", &t)) == SLUICE_OK) {
            memcpy(got, sluice_tensor_data(t), LATE_N);
            sluice_release(t);
        }
        fprintf(stderr, "  %s: %d in %.2f s%s%s\n", blocking ? "sluice_read_into" : "acquire",
                rc, now_s() - t0, rc ? ": " : "", rc ? sluice_errmsg(m) : "");
        if (rc != SLUICE_OK)
            fail_msg("%s: %s", blocking ? "sluice_read_into" : "acquire", sluice_errmsg(m));
        assert_memory_equal(got, file + len - LATE_N, LATE_N);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    arm("ok", 0, NULL);
    unlink(p);
    free(p);
    free(file);
    (void)state;
}

static void test_flipped_byte(void **state)
{
    sluice_options o = fast_options();
    outcome r = run(&o, "flip", 1, NULL);
    assert_int_equal(r.rc, SLUICE_E_CHECKSUM);     /* never retried on the same source */
    assert_int_equal(r.retries, 0);
    (void)state;
}

static void test_close_with_reads_hanging(void **state)
{
    sluice_options o = fast_options();
    o.remote_stall_timeout_ms = 60000;
    o.remote_deadline_ms = 120000;
    arm("ok", 0, NULL);
    sluice_model *m;
    assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
    int before = faults_served();
    arm("hang", 100, "30");
    assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
    wait_fault_served(before);   /* the reads are on the wire */
    double t0 = now_s();
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_true(now_s() - t0 < 2.0);
    arm("ok", 0, NULL);
    (void)state;
}

/* A remote part read whose request hangs (the server answers nothing for
 * 30 s), its token requested once the request is on the wire: the
 * transfer is aborted (libcurl's progress callback), no retry, the call
 * says SLUICE_E_CANCELLED naming the token within 5 s, no failure
 * counted; the next part reads. */
typedef struct part_call {
    sluice_model *m;
    sluice_cancel *c;
    unsigned char *part;
    int rc;
    char msg[512]; /* the call's message (sluice_errmsg is the thread's) */
} part_call;

static void *part_reader(void *p)
{
    part_call *pc = p;
    sluice_part_options po;
    sluice_part_options_init(&po);
    po.cancel = pc->c;
    pc->rc = sluice_read_part_into_ex(pc->m, "b", 0, 1, 2, pc->part, B_SIZE / 2, &po);
    snprintf(pc->msg, sizeof pc->msg, "%s", pc->rc ? sluice_errmsg(pc->m) : "");
    return NULL;
}

static void test_part_cancel_hanging(void **state)
{
    sluice_options o = fast_options();
    o.remote_stall_timeout_ms = 60000;
    o.remote_deadline_ms = 120000;
    arm("ok", 0, NULL);
    part_call pc = {0};
    assert_int_equal(sluice_open(model_url, &o, &pc.m), SLUICE_OK);
    assert_int_equal(sluice_cancel_create(&pc.c), SLUICE_OK);
    pc.part = malloc(B_SIZE / 2);
    assert_non_null(pc.part);
    struct sluice_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    assert_int_equal(sluice_stats(pc.m, &st0), SLUICE_OK);
    int before = faults_served();
    arm("hang", 100, "30");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, part_reader, &pc), 0);
    wait_fault_served(before);   /* the part's request is on the wire */
    double t0 = now_s();
    sluice_cancel_request(pc.c);
    pthread_join(th, NULL);
    double took = now_s() - t0;
    arm("ok", 0, NULL);
    if (pc.rc != SLUICE_E_CANCELLED || took >= 5.0)
        fail_msg("part: %s after %.2f s: %s", sluice_strerror(pc.rc), took, pc.msg);
    if (!strstr(pc.msg, "token"))
        fail_msg("message: %s", pc.msg);
    assert_int_equal(sluice_stats(pc.m, &st1), SLUICE_OK);
    assert_int_equal(st1.failures, st0.failures);
    assert_int_equal(st1.remote_retries, st0.remote_retries);
    /* the aborted request is counted, as a failed one is (sluice.h: what
     * was read before the token was seen is counted) */
    assert_int_equal(st1.remote_reads - st0.remote_reads, 1);
    assert_int_equal(sluice_read_part_into(pc.m, "b", 0, 1, 2, pc.part, B_SIZE / 2), SLUICE_OK);
    assert_memory_equal(pc.part, good_b + B_SIZE / 2, B_SIZE / 2);
    free(pc.part);
    sluice_cancel_free(pc.c);
    assert_int_equal(sluice_close(pc.m), SLUICE_OK);
    (void)state;
}

/* Close while every read is being retried (503 after 503): the remote
 * thread decides retries while close aborts it (run under TSan). */
static void test_close_while_retrying(void **state)
{
    sluice_options o = fast_options();
    o.remote_attempts = 100;
    o.remote_backoff_ms = 1;
    for (int round = 0; round < 10; round++) {
        arm("ok", 0, NULL);
        sluice_model *m;
        assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
        arm("status", 100000, "503");
        assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
        struct timespec ts = {0, 20000000L * (round % 4)};
        nanosleep(&ts, NULL);
        double t0 = now_s();
        assert_int_equal(sluice_close(m), SLUICE_OK);
        assert_true(now_s() - t0 < 2.0);
    }
    arm("ok", 0, NULL);
    (void)state;
}

/* A fresh folder (returned) holding m.safetensors with one byte of b
 * flipped, *model its path, and the served model's manifest beside it. */
static char *corrupt_copy(char **model)
{
    char *d = tu_tmpdir(), *qm = tu_join(d, "m.safetensors.manifest.json");
    char *p = tu_join(root, "m.safetensors"), *pm = tu_join(root, "m.safetensors.manifest.json");
    *model = tu_join(d, "m.safetensors");
    size_t len;
    unsigned char *bytes = tu_read_file(p, &len);
    bytes[len - 10] ^= 0xff;        /* inside b */
    tu_write_file(*model, bytes, len);
    free(bytes);
    bytes = tu_read_file(pm, &len);
    tu_write_file(qm, bytes, len);
    free(bytes);
    free(qm);
    free(p);
    free(pm);
    return d;
}

/* A local copy whose tensor b fails its digest, a mirror that never
 * answers: the mirror's open hangs on the opener thread while the slot
 * waits; close must still return at once. */
static void test_close_while_mirror_opens(void **state)
{
    char *q, *d = corrupt_copy(&q);
    sluice_options o = fast_options();
    o.remote_stall_timeout_ms = 60000;
    o.remote_deadline_ms = 120000;
    const char *mirrors[] = {model_url};
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m;
    assert_int_equal(sluice_open(q, &o, &m), SLUICE_OK);
    int before = faults_served();
    arm("hang", 100, "30");
    assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
    wait_fault_served(before);      /* b failed, the mirror's open is on the wire */
    double t0 = now_s();
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_true(now_s() - t0 < 2.0);
    arm("ok", 0, NULL);
    tu_rmtree(d);
    free(d);
    free(q);
    (void)state;
}

/* A mirror given as a URL with credentials (user:password@, a presigned
 * query): sluice_tensor_source and the error of a tensor every source
 * failed name the mirror without them. */
static void test_mirror_secrets_not_shown(void **state)
{
    char *q, *d = corrupt_copy(&q);
    char mirror[400];
    snprintf(mirror, sizeof mirror, "http://user:PW-SECRET@%s/m.safetensors",
             srv.base + strlen("http://"));
    const char *mirrors[] = {mirror};
    sluice_options o = fast_options();
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m;
    arm("ok", 0, NULL);
    assert_int_equal(sluice_open(q, &o, &m), SLUICE_OK);
    sluice_tensor *t;
    if (sluice_acquire(m, "b", &t) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    const char *src = sluice_tensor_source(t);
    if (strstr(src, "SECRET") || !strstr(src, "fallback 1 (http://"))
        fail_msg("source: %s", src);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a presigned mirror that refuses: the tensor's error names both
     * sources, the mirror without its signature */
    snprintf(mirror, sizeof mirror, "http://user:PW-SECRET@%s/m.safetensors?X-Amz-Signature=SIG-SECRET",
             srv.base + strlen("http://"));
    assert_int_equal(sluice_open(q, &o, &m), SLUICE_OK);
    arm("status", 100, "403");
    int rc = sluice_acquire(m, "b", &t);
    const char *msg = sluice_errmsg(m);
    if (rc != SLUICE_E_CHECKSUM)
        fail_msg("%d: %s", rc, msg);
    if (strstr(msg, "SECRET") || !strstr(msg, "fallback 1 (http://"))
        fail_msg("error: %s", msg);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the model itself at such a URL: a tensor's error names its file
     * without the password */
    snprintf(mirror, sizeof mirror, "http://user:PW-SECRET@%s/m.safetensors",
             srv.base + strlen("http://"));
    arm("ok", 0, NULL);
    o.fallback_count = 0;
    assert_int_equal(sluice_open(mirror, &o, &m), SLUICE_OK);
    arm("flip", 1, NULL);
    rc = sluice_acquire(m, "b", &t);
    msg = sluice_errmsg(m);
    if (rc != SLUICE_E_CHECKSUM || strstr(msg, "SECRET") || !strstr(msg, "file http://127.0.0.1:"))
        fail_msg("%d: %s", rc, msg);
    /* the manifest it found is named without the password too (the
     * path `sluice verify` prints) */
    const char *mp = sluice_manifest_path(m);
    if (!mp || strstr(mp, "SECRET") || !strstr(mp, "m.safetensors.manifest.json"))
        fail_msg("sluice_manifest_path: %s", mp ? mp : "(null)");
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* ... and a missing sidecar under REQUIRE names it without it too */
    char *nm = tu_join(root, "nomanifest.safetensors"), *p = tu_join(root, "m.safetensors");
    size_t len;
    unsigned char *bytes = tu_read_file(p, &len);
    tu_write_file(nm, bytes, len);
    free(bytes);
    free(p);
    snprintf(mirror, sizeof mirror, "http://user:PW-SECRET@%s/nomanifest.safetensors",
             srv.base + strlen("http://"));
    o.verify = SLUICE_VERIFY_REQUIRE;
    rc = sluice_open(mirror, &o, &m);
    msg = sluice_errmsg(m);
    if (rc != SLUICE_E_MANIFEST || strstr(msg, "SECRET") || !strstr(msg, "sidecar http://127"))
        fail_msg("%d: %s", rc, msg);
    sluice_close(m);
    /* the open's own refusals of such a model without a manifest: a
     * signature asked (the sidecar looked for is named) and a mirror
     * given (the model is named) name it without its password or query
     * (before: both held it as given) */
    snprintf(mirror, sizeof mirror, "http://user:PW-SECRET@%s/nomanifest.safetensors"
             "?X-Amz-Signature=SIG-SECRET", srv.base + strlen("http://"));
    sluice_options so = fast_options();
    static const char *const keys[] = {"/nonexistent/key.pub"};
    so.trusted_keys = keys;
    so.ntrusted_keys = 1;
    rc = sluice_open(mirror, &so, &m);
    msg = sluice_errmsg(m);
    if (rc != SLUICE_E_SIGNATURE || strstr(msg, "SECRET") ||
        !strstr(msg, "no sidecar http://127.0.0.1:"))
        fail_msg("signature asked: %d: %s", rc, msg);
    sluice_close(m);
    so = fast_options();
    const char *good[] = {model_url};
    so.fallback = good;
    so.fallback_count = 1;
    rc = sluice_open(mirror, &so, &m);
    msg = sluice_errmsg(m);
    if (rc != SLUICE_E_INVAL || strstr(msg, "SECRET") ||
        !strstr(msg, "http://127.0.0.1:") || !strstr(msg, "fallback mirrors need a manifest"))
        fail_msg("a mirror given: %d: %s", rc, msg);
    sluice_close(m);
    unlink(nm);
    free(nm);
    arm("ok", 0, NULL);
    tu_rmtree(d);
    free(d);
    free(q);
    (void)state;
}

/* A model opened at a URL with credentials (user:password@, a query):
 * the note of a part checked by its whole tensor (sluice_part_note, which
 * `sluice shard` prints and Python's load_shard warns with) and the error
 * of a tensor name the model lacks show the location without them. */
static void test_part_note_secrets_not_shown(void **state)
{
    char secret[400];
    snprintf(secret, sizeof secret, "http://user:PW-SECRET@%s/m.safetensors?X-Amz-Signature=SIG-SECRET",
             srv.base + strlen("http://"));
    char manifest[400];
    snprintf(manifest, sizeof manifest, "%s/m.safetensors.manifest.json", srv.base);
    arm("ok", 0, NULL);
    sluice_options o = fast_options();
    o.manifest_path = manifest;
    sluice_model *m;
    if (sluice_open(secret, &o, &m) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    unsigned char *part = malloc(B_SIZE / 2);
    assert_non_null(part);
    /* no chunk digests: rank 1 of 2 of b is checked by reading all of b */
    if (sluice_read_part_into(m, "b", 0, 1, 2, part, B_SIZE / 2) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    assert_memory_equal(part, good_b + B_SIZE / 2, B_SIZE / 2);
    free(part);
    const char *note = sluice_part_note(m);
    if (!note || strstr(note, "SECRET") || !strstr(note, "http://127.0.0.1:"))
        fail_msg("note: %s", note ? note : "(null)");
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_part(m, "nosuch", 0, 0, 2, &t), SLUICE_E_NOT_FOUND);
    const char *msg = sluice_errmsg(m);
    if (strstr(msg, "SECRET") || !strstr(msg, "no tensor named \"nosuch\" in http://127.0.0.1:"))
        fail_msg("error: %s", msg);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    (void)state;
}

/* A dim-1 part of a remote tensor checked by its whole tensor (no part
 * digests): the tensor is read a bounce buffer (4 MiB) at a time, not as
 * two range requests per row. U8 [64, 100000] (6.4 MB: a row segment
 * straddles the 4 MiB boundary), rank 1 of 4: 2 requests, the part equal
 * to the slice (fails before: 129 requests, one per row segment and one
 * per gap between them). */
#define TP_ROWS 64u
#define TP_COLS 100000u
static void test_part_fallback_few_requests(void **state)
{
    size_t nb = (size_t)TP_ROWS * TP_COLS;
    char *p = tu_join(root, "tp.safetensors");
    uint64_t data_start;
    unsigned char *bytes = mf_write_u8_model(p, "t", TP_ROWS, TP_COLS, &data_start);
    sluice_options o;
    sluice_options_init(&o);
    o.flags = SLUICE_F_HASH_ALL;
    sluice_model *m;
    assert_int_equal(sluice_open(p, &o, &m), SLUICE_OK);
    sluice_tensor *t;
    uint8_t d[32];
    char hex[65], text[128];
    assert_int_equal(sluice_acquire(m, "t", &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
    sluice_release(t);
    sluice_close(m);
    int n = snprintf(text, sizeof text, "{\"t\":\"%s\"}", sluice_digest_hex(d, hex));
    char *mf = tu_join(root, "tp.safetensors.manifest.json");
    tu_write_file(mf, text, (size_t)n);
    char url[300];
    snprintf(url, sizeof url, "%s/tp.safetensors", srv.base);
    arm("ok", 0, NULL);
    o = fast_options();
    if (sluice_open(url, &o, &m) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    size_t seg = TP_COLS / 4, len = TP_ROWS * seg;
    unsigned char *part = malloc(len);
    assert_non_null(part);
    if (sluice_read_part_into(m, "t", 1, 1, 4, part, len) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    for (size_t r = 0; r < TP_ROWS; r++)
        if (memcmp(part + r * seg, bytes + r * TP_COLS + seg, seg) != 0)
            fail_msg("row %zu of the part differs from the slice", r);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.part_fallback_bytes, nb);
    assert_int_equal(st.bytes_read, nb);
    if (st.remote_reads != 2)
        fail_msg("%llu range requests for one tensor of %zu bytes",
                 (unsigned long long)st.remote_reads, nb);
    /* a byte of another rank's columns flipped: the whole-tensor check fails */
    assert_int_equal(sluice_close(m), SLUICE_OK);
    mf_flip_byte(p, data_start + 5 * TP_COLS + 3 * seg + 7);
    assert_int_equal(sluice_open(url, &o, &m), SLUICE_OK);
    assert_int_equal(sluice_read_part_into(m, "t", 1, 1, 4, part, len), SLUICE_E_CHECKSUM);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unlink(p);
    unlink(mf);
    free(p);
    free(mf);
    free(part);
    free(bytes);
    (void)state;
}

/* A dim-1 part read without verification (rows of 256 bytes, 768 apart):
 * one multi-range request answered multipart; a server that answers it
 * with 200, one range or 416 gets single coalesced ranges instead (and so
 * does every later part of that file, at once); every
 * malformed multipart reply fails the read with the reason, never a
 * crash or a wrong byte taken. */
static void test_part_multipart_faults(void **state)
{
    enum { ROWS = 64, COLS = 1024 };
    size_t seg = COLS / 4, len = ROWS * seg;
    char *p = tu_join(root, "mp.safetensors");
    unsigned char *bytes = mf_write_u8_model(p, "t", ROWS, COLS, NULL), *part = malloc(len);
    assert_non_null(part);
    char url[300];
    snprintf(url, sizeof url, "%s/mp.safetensors", srv.base);
    static const struct {
        const char *mode;
        int rc;
        const char *says;
        unsigned reads;
    } cases[] = {
        {"ok", SLUICE_OK, NULL, 1},
        {"norange", SLUICE_OK, NULL, 1},   /* then one range of the 64 rows */
        {"mpone", SLUICE_OK, NULL, 1},
        {"mp416", SLUICE_OK, NULL, 1},
        {"mpnoboundary", SLUICE_OK, NULL, 1},
        {"mpcr", SLUICE_E_REMOTE, "is bytes", 0},
        {"mpsize", SLUICE_E_FILE_CHANGED, "changed after open", 0},
        {"mpnocr", SLUICE_E_REMOTE, "has no Content-Range", 0},
        {"mplong", SLUICE_E_REMOTE, "longer than its Content-Range", 0},
        {"mpextra", SLUICE_E_REMOTE, "more parts than", 0},
        {"mpcut", SLUICE_E_REMOTE, "multipart reply", 0},
        {"mptail", SLUICE_E_REMOTE, "after its closing boundary", 0},
        {"mpboundary", SLUICE_E_REMOTE, "no boundary line before part 2", 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sluice_options o = fast_options();
        o.verify = SLUICE_VERIFY_OFF;
        sluice_model *m;
        arm("ok", 0, NULL);
        if (sluice_open(url, &o, &m) != SLUICE_OK)
            fail_msg("%s", sluice_errmsg(m));
        struct sluice_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
        assert_int_equal(sluice_stats(m, &st0), SLUICE_OK);
        arm(cases[c].mode, 1, NULL);
        memset(part, 0, len);
        int rc = sluice_read_part_into(m, "t", 1, 1, 4, part, len);
        if (rc != cases[c].rc)
            fail_msg("%s: %s (%s)", cases[c].mode, sluice_strerror(rc), sluice_errmsg(m));
        assert_int_equal(sluice_stats(m, &st1), SLUICE_OK);
        if (rc == SLUICE_OK) {
            for (size_t r = 0; r < ROWS; r++)
                if (memcmp(part + r * seg, bytes + r * COLS + seg, seg) != 0)
                    fail_msg("%s: row %zu of the part differs from the slice", cases[c].mode, r);
            if (st1.remote_reads - st0.remote_reads != cases[c].reads)
                fail_msg("%s: %llu requests", cases[c].mode,
                         (unsigned long long)(st1.remote_reads - st0.remote_reads));
        } else if (!strstr(sluice_errmsg(m), cases[c].says)) {
            fail_msg("%s: %s", cases[c].mode, sluice_errmsg(m));
        }
        if (rc == SLUICE_OK && strncmp(cases[c].mode, "mp", 2) == 0) {
            /* the file is known for a server without multi-range (which
             * it still is): the next part is one single-range request,
             * no multi-range first */
            arm(cases[c].mode, 100, NULL);
            char *a = rf_get(&srv, "/ctl/stats");
            assert_non_null(a);
            long before = atol(strstr(a, "requests=") + 9);
            free(a);
            assert_int_equal(sluice_read_part_into(m, "t", 1, 2, 4, part, len), SLUICE_OK);
            a = rf_get(&srv, "/ctl/stats");
            assert_non_null(a);
            long after = atol(strstr(a, "requests=") + 9);
            free(a);
            if (after - before != 1)
                fail_msg("%s: %ld requests for the next part", cases[c].mode, after - before);
            for (size_t r = 0; r < ROWS; r++)
                if (memcmp(part + r * seg, bytes + r * COLS + 2 * seg, seg) != 0)
                    fail_msg("%s: row %zu of part 2 differs", cases[c].mode, r);
            arm("ok", 0, NULL);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    arm("ok", 0, NULL);
    unlink(p);
    free(p);
    free(part);
    free(bytes);
    (void)state;
}

/* A remote model's part reads are the engine's reads, as a load's are:
 * each read the remote seam made for them is in reads and in the read
 * histogram (sluice_read_duration_seconds), one per request here: a
 * dim-0 part of b checked by reading the whole tensor (two ranges, one
 * through the bounce buffer), and a strided part of a [64, 1024] tensor
 * (one multi-range request). Before, they were read on the caller's
 * thread outside the engine: remote_reads moved, reads and the
 * histogram did not. */
static long long sample(const char *text, const char *name, const char *extra);
static char *metrics_of(sluice_model *m);

static void test_part_reads_are_engine_reads(void **state)
{
    enum { ROWS = 64, COLS = 1024 };
    size_t seg = COLS / 4, len = ROWS * seg;
    char *p = tu_join(root, "pe.safetensors");
    unsigned char *bytes = mf_write_u8_model(p, "t", ROWS, COLS, NULL);
    unsigned char *part = malloc(len > B_SIZE / 2 ? len : B_SIZE / 2);
    assert_non_null(part);
    char url[300];
    snprintf(url, sizeof url, "%s/pe.safetensors", srv.base);
    arm("ok", 0, NULL);
    static const struct {
        int strided;
        unsigned requests;
    } cases[] = {{0, 2}, {1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sluice_options o = fast_options();
        o.metrics_label = "faults";
        if (cases[c].strided)
            o.verify = SLUICE_VERIFY_OFF;
        sluice_model *m;
        if (sluice_open(cases[c].strided ? url : model_url, &o, &m) != SLUICE_OK)
            fail_msg("%s", sluice_errmsg(m));
        struct sluice_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
        assert_int_equal(sluice_stats(m, &st0), SLUICE_OK);
        char *text = metrics_of(m);
        long long h0 = sample(text, "sluice_read_duration_seconds_count", NULL);
        free(text);
        int rc = cases[c].strided ? sluice_read_part_into(m, "t", 1, 1, 4, part, len)
                                  : sluice_read_part_into(m, "b", 0, 1, 2, part, B_SIZE / 2);
        if (rc != SLUICE_OK)
            fail_msg("part: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
        if (cases[c].strided) {
            for (size_t r = 0; r < ROWS; r++)
                if (memcmp(part + r * seg, bytes + r * COLS + seg, seg) != 0)
                    fail_msg("row %zu of the part differs from the slice", r);
        } else {
            assert_memory_equal(part, good_b + B_SIZE / 2, B_SIZE / 2);
        }
        assert_int_equal(sluice_stats(m, &st1), SLUICE_OK);
        text = metrics_of(m);
        long long h1 = sample(text, "sluice_read_duration_seconds_count", NULL);
        free(text);
        if (st1.remote_reads - st0.remote_reads != cases[c].requests ||
            st1.reads - st0.reads != cases[c].requests || h0 < 0 ||
            h1 - h0 != (long long)cases[c].requests)
            fail_msg("%s part: %llu requests, %llu reads, %lld in the read histogram; %u "
                     "expected of each", cases[c].strided ? "strided" : "dim-0",
                     (unsigned long long)(st1.remote_reads - st0.remote_reads),
                     (unsigned long long)(st1.reads - st0.reads), h1 - h0, cases[c].requests);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    unlink(p);
    free(p);
    free(part);
    free(bytes);
    (void)state;
}

/* A remote part waits for the engine's queue depth, shared with loads:
 * queue_depth 1, an acquire of a whose read the server holds 4 s (fault
 * late) on the wire, then a part of b (two requests): its requests go out
 * only once the load's read is done, so when the part returns, that read
 * is in reads with the part's two. Before, the part's requests went out
 * from the calling thread at once and it returned while the load still
 * waited: reads had moved by 0. */
typedef struct acquire_call {
    sluice_model *m;
    int rc;
} acquire_call;

static void *acquirer(void *p)
{
    acquire_call *ac = p;
    sluice_tensor *t = NULL;
    ac->rc = sluice_acquire(ac->m, "a", &t);
    sluice_release(t);
    return NULL;
}

static void test_part_under_queue_depth(void **state)
{
    sluice_options o = fast_options();
    o.queue_depth = 1;
    o.remote_stall_timeout_ms = 60000;
    o.remote_deadline_ms = 120000;
    arm("ok", 0, NULL);
    acquire_call ac = {0};
    if (sluice_open(model_url, &o, &ac.m) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(ac.m));
    struct sluice_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    assert_int_equal(sluice_stats(ac.m, &st0), SLUICE_OK);
    int before = faults_served();
    arm("late", 1, "4,10000000");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, acquirer, &ac), 0);
    wait_fault_served(before); /* the load's read is on the wire, held */
    unsigned char *part = malloc(B_SIZE / 2);
    assert_non_null(part);
    int rc = sluice_read_part_into(ac.m, "b", 0, 1, 2, part, B_SIZE / 2);
    if (rc != SLUICE_OK)
        fail_msg("part: %s: %s", sluice_strerror(rc), sluice_errmsg(ac.m));
    assert_int_equal(sluice_stats(ac.m, &st1), SLUICE_OK);
    if (st1.reads - st0.reads < 3)
        fail_msg("the part returned with %llu reads done: its requests did not wait for the "
                 "load's read (queue_depth 1)", (unsigned long long)(st1.reads - st0.reads));
    assert_memory_equal(part, good_b + B_SIZE / 2, B_SIZE / 2);
    pthread_join(th, NULL);
    assert_int_equal(ac.rc, SLUICE_OK);
    arm("ok", 0, NULL);
    free(part);
    assert_int_equal(sluice_close(ac.m), SLUICE_OK);
    (void)state;
}

/* The sample of name{model="LABEL",extra} in text (-1 when absent). */
static long long sample(const char *text, const char *name, const char *extra)
{
    char head[256];
    snprintf(head, sizeof head, "\n%s{model=\"faults\"%s%s} ", name, extra ? "," : "",
             extra ? extra : "");
    const char *p = strstr(text, head);
    return p ? strtoll(p + strlen(head), NULL, 10) : -1;
}

static char *metrics_of(sluice_model *m)
{
    size_t need = 0;
    assert_int_equal(sluice_metrics_write(m, NULL, 0, &need, SLUICE_METRICS_PROMETHEUS),
                     SLUICE_E_BUFFER);
    char *text = malloc(need + 4096);
    assert_int_equal(sluice_metrics_write(m, text, need + 4096, NULL, SLUICE_METRICS_PROMETHEUS),
                     SLUICE_OK);
    return text;
}

/* 503 twice during open: the open's retries are counted (remote_retries
 * 2, cause "status"), and its requests (the first 8 bytes, the header,
 * the sidecar) are in remote_reads, before any tensor is read. Then a
 * local copy whose tensor fails, delivered by a mirror at the fault
 * server: the exposition shows the mirror (fallback_* families) and the
 * mirror's own requests. Before, remote_retries was 0 after the open and
 * the exposition had no remote_* nor fallback_* family. */
static void test_open_and_mirror_counted(void **state)
{
    sluice_options o = fast_options();
    o.metrics_label = "faults";
    int before = faults_served();
    arm("status", 2, "503");
    sluice_model *m;
    if (sluice_open(model_url, &o, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    assert_int_equal(faults_served() - before, 2);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.remote_retries, 2);
    assert_int_equal(st.remote_reads, 0);     /* no tensor read yet */
    assert_true(st.remote_open_requests >= 3);   /* 8 bytes, the header, the sidecar */
    assert_true(st.remote_open_bytes > 8);
    char *text = metrics_of(m);
    assert_int_equal(sample(text, "sluice_remote_retries_total", "cause=\"status\""), 2);
    assert_int_equal(sample(text, "sluice_remote_requests_total", "kind=\"open\""),
                     (long long)st.remote_open_requests);
    assert_int_equal(sample(text, "sluice_remote_bytes_total", "kind=\"open\""),
                     (long long)st.remote_open_bytes);
    free(text);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    arm("ok", 0, NULL);

    char *q, *d = corrupt_copy(&q);
    const char *mirrors[] = {model_url};
    o.fallback = mirrors;
    o.fallback_count = 1;
    assert_int_equal(sluice_open(q, &o, &m), SLUICE_OK);
    sluice_tensor *t;
    if (sluice_acquire(m, "b", &t) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    sluice_release(t);
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.fallback_tensors, 1);
    text = metrics_of(m);
    assert_int_equal(sample(text, "sluice_checksum_failures_total", NULL), 1);
    assert_int_equal(sample(text, "sluice_fallback_tensors_total", NULL), 1);
    assert_int_equal(sample(text, "sluice_fallback_bytes_total", NULL), B_SIZE);
    assert_int_equal(sample(text, "sluice_fallback_failures_total", NULL), 0);
    /* the mirror's open (8 bytes, header) and its range read */
    assert_true(sample(text, "sluice_remote_requests_total", "kind=\"open\"") >= 2);
    assert_int_equal(sample(text, "sluice_remote_requests_total", "kind=\"tensor\""), 1);
    free(text);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(d);
    free(d);
    free(q);
    (void)state;
}

/* `sluice CMD URL [NAME]`: exit status, and its stderr in *err. */
static int cli(const char *cmd, const char *url, const char *name, char **err)
{
    char *d = tu_tmpdir(), *ep = tu_join(d, "stderr"), line[2048];
    snprintf(line, sizeof line, "'%s/sluice' %s '%s' %s >/dev/null 2>'%s'", SLUICE_BINARY_DIR,
             cmd, url, name ? name : "", ep);
    int st = system(line);
    size_t len;
    *err = tu_read_file(ep, &len);
    if (!*err)
        *err = strdup("");
    tu_rmtree(d);
    free(d);
    free(ep);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* A remote model whose sidecar answers 404 opens unverified, and says so:
 * sluice_verify_state (SLUICE_UNVERIFIED_NO_MANIFEST, naming the sidecar
 * without the password), the stats' unverified 1, the gauge
 * sluice_unverified 1, and `sluice cat` / `sluice stats` warn on stderr
 * (exit 0); with the sidecar served, verified and no warning; policy OFF
 * is told apart (2). A manifest the caller names (a URL, or a local path)
 * that cannot be fetched fails the open under DEFAULT and IF_PRESENT,
 * instead of going without. The decision (sluice.h, sluice_verify_state):
 * DEFAULT stays "REQUIRE when a manifest is in play": a remote model
 * without one opens, unverified and visible; REQUIRE refuses it. Before,
 * nothing but sluice_manifest_path() == NULL told the 404 apart. */
static void test_missing_manifest_visible(void **state)
{
    char *nm = tu_join(root, "nomanifest.safetensors"), *p = tu_join(root, "m.safetensors");
    size_t len;
    unsigned char *bytes = tu_read_file(p, &len);
    tu_write_file(nm, bytes, len);
    free(bytes);
    char url[400], secret_url[400];
    snprintf(url, sizeof url, "%s/nomanifest.safetensors", srv.base);
    snprintf(secret_url, sizeof secret_url, "http://user:PW-SECRET@%s/nomanifest.safetensors",
             srv.base + strlen("http://"));
    arm("ok", 0, NULL);
    sluice_options o = fast_options();
    o.metrics_label = "faults";
    sluice_model *m;
    if (sluice_open(secret_url, &o, &m) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    const char *where = NULL;
    assert_int_equal(sluice_verify_state(m, &where), SLUICE_UNVERIFIED_NO_MANIFEST);
    assert_non_null(where);
    if (!strstr(where, "/nomanifest.safetensors.manifest.json") || strstr(where, "SECRET"))
        fail_msg("where: %s", where);
    assert_null(sluice_manifest_path(m));
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.unverified, SLUICE_UNVERIFIED_NO_MANIFEST);
    char *text = metrics_of(m);
    assert_int_equal(sample(text, "sluice_unverified", NULL), 1);
    free(text);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* verified: the served model with its sidecar, opened with
     * credentials and a query in the model's URL and in the manifest's:
     * *where shows neither (as for the sidecar not found above) */
    char secret_model[400], secret_mf[512];
    snprintf(secret_model, sizeof secret_model, "http://user:PW-SECRET@%s/m.safetensors",
             srv.base + strlen("http://"));
    snprintf(secret_mf, sizeof secret_mf, "%s.manifest.json?X-Amz-Signature=SIG-SECRET",
             secret_model);
    for (int k = 0; k < 3; k++) {
        o.manifest_path = k == 2 ? secret_mf : NULL;
        if (sluice_open(k ? secret_model : model_url, &o, &m) != SLUICE_OK)
            fail_msg("%d: %s", k, sluice_errmsg(m));
        assert_int_equal(sluice_verify_state(m, &where), SLUICE_VERIFIED);
        assert_non_null(where);
        if (!strstr(where, "/m.safetensors.manifest.json") || strstr(where, "SECRET"))
            fail_msg("%d: where: %s", k, where);
        assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
        assert_int_equal(st.unverified, 0);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    o.manifest_path = NULL;
    /* off by policy */
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, &where), SLUICE_UNVERIFIED_OFF);
    assert_null(where);
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.unverified, SLUICE_UNVERIFIED_OFF);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(NULL, &where), SLUICE_E_INVAL);
    assert_null(where);

    /* a manifest the caller names and the server lacks: the open fails */
    char absent[400];
    snprintf(absent, sizeof absent, "%s/absent.manifest.json", srv.base);
    static const sluice_verify_policy policies[] = {SLUICE_VERIFY_DEFAULT,
                                                    SLUICE_VERIFY_IF_PRESENT};
    for (size_t k = 0; k < 2; k++) {
        o.verify = policies[k];
        o.manifest_path = absent;
        int rc = sluice_open(url, &o, &m);
        if (rc != SLUICE_E_MANIFEST || !strstr(sluice_errmsg(m), "absent.manifest.json"))
            fail_msg("policy %d, URL: %d %s", (int)policies[k], rc, sluice_errmsg(m));
        sluice_close(m);
        char *local = tu_join(root, "absent-local.manifest.json");
        o.manifest_path = local;
        rc = sluice_open(url, &o, &m);
        if (rc != SLUICE_E_MANIFEST)
            fail_msg("policy %d, local path: %d %s", (int)policies[k], rc, sluice_errmsg(m));
        sluice_close(m);
        free(local);
    }
    o.manifest_path = NULL;
    /* REQUIRE refuses the model without one */
    o.verify = SLUICE_VERIFY_REQUIRE;
    assert_int_equal(sluice_open(url, &o, &m), SLUICE_E_MANIFEST);
    sluice_close(m);

    /* the commands warn on every run that reads tensors */
    char *err = NULL;
    assert_int_equal(cli("cat", url, "a", &err), 0);
    if (!strstr(err, "warning: not verified: no manifest found"))
        fail_msg("sluice cat stderr: %s", err);
    free(err);
    assert_int_equal(cli("stats", url, NULL, &err), 0);
    if (!strstr(err, "warning: not verified: no manifest found"))
        fail_msg("sluice stats stderr: %s", err);
    free(err);
    assert_int_equal(cli("cat", model_url, "a", &err), 0);
    if (strstr(err, "warning"))
        fail_msg("sluice cat of a verified model: %s", err);
    free(err);
    unlink(nm);
    free(nm);
    free(p);
    (void)state;
}

/* ROOT/models/m.safetensors (the bucket "models" of this server as an S3
 * endpoint, path-style), and AWS keys with a session token in the
 * environment. */
static void s3_bucket_and_keys(void)
{
    char *d = tu_join(root, "models");
    mkdir(d, 0755);
    char *src = tu_join(root, "m.safetensors"), *dst = tu_join(d, "m.safetensors");
    size_t len;
    void *bytes = tu_read_file(src, &len);
    tu_write_file(dst, bytes, len);
    free(bytes);
    free(src);
    free(dst);
    free(d);
    setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-SECRET", 1);
    setenv("AWS_SESSION_TOKEN", "session-SECRET", 1);
}

static char *last_headers(void)
{
    char *r = rf_get(&srv, "/ctl/headers");
    assert_non_null(r);
    return r;
}

/* The request format: a bearer token on http(s)://, SigV4 on s3://, and
 * no secret in any message. */
static void test_request_format(void **state)
{
    static const char token[] = "tok-SECRET-123";
    sluice_options o = fast_options();
    o.http_token = token;
    o.verify = SLUICE_VERIFY_OFF;   /* the last request of the open is then a range read */
    sluice_model *m;
    assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
    char *h = last_headers();
    assert_non_null(strstr(h, "Authorization: Bearer tok-SECRET-123"));
    assert_non_null(strstr(h, "Range: bytes="));
    free(h);
    sluice_close(m);
    /* a failure names the place, never the token */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/absent.safetensors", srv.base);
    assert_int_equal(sluice_open(missing, &o, &m), SLUICE_E_NO_FILES);
    assert_null(strstr(sluice_errmsg(m), "SECRET"));
    sluice_close(m);
    /* SLUICE_HTTP_TOKEN when the option is not set */
    setenv("SLUICE_HTTP_TOKEN", "env-token", 1);
    o.http_token = NULL;
    assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
    h = last_headers();
    assert_non_null(strstr(h, "Authorization: Bearer env-token"));
    free(h);
    sluice_close(m);
    unsetenv("SLUICE_HTTP_TOKEN");

    /* s3:// path-style against this server: ROOT/models/m.safetensors */
    s3_bucket_and_keys();
    sluice_options_init(&o);
    o.s3_endpoint = srv.base;
    o.s3_region = "eu-west-3";
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open("s3://models/m.safetensors", &o, &m), SLUICE_OK);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(t), good_b, B_SIZE);
    sluice_release(t);
    h = last_headers();
    assert_non_null(strstr(h, "GET /models/m.safetensors"));
    assert_non_null(strstr(h, "Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"));
    assert_non_null(strstr(h, "/eu-west-3/s3/aws4_request"));
    assert_non_null(strstr(h, "x-amz-content-sha256: e3b0c442"));
    assert_non_null(strstr(h, "x-amz-security-token: session-SECRET"));
    assert_non_null(strcasestr(h, "x-amz-date: "));
    free(h);
    sluice_close(m);
    assert_int_equal(sluice_open("s3://models/absent.safetensors", &o, &m), SLUICE_E_NO_FILES);
    assert_null(strstr(sluice_errmsg(m), "SECRET"));
    assert_non_null(strstr(sluice_errmsg(m), "s3://models/absent.safetensors"));
    sluice_close(m);
    /* anonymous: no Authorization at all */
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    assert_int_equal(sluice_open("s3://models/m.safetensors", &o, &m), SLUICE_OK);
    h = last_headers();
    assert_null(strstr(h, "Authorization"));
    free(h);
    sluice_close(m);
    (void)state;
}

/* The headers of the logged request whose Host is host (malloc'd "" when
 * none): a block of the fault server's /ctl/log. */
static char *request_to(const char *host)
{
    char *log = rf_get(&srv, "/ctl/log"), want[128];
    assert_non_null(log);
    snprintf(want, sizeof want, "\nHost: %s\n", host);
    char *hit = strstr(log, want), *out;
    if (!hit) {
        out = strdup("");
    } else {
        char *start = hit, *end = strstr(hit, "\n\n");
        while (start > log && strncmp(start, "GET ", 4) != 0)
            start--;
        out = strndup(start, end ? (size_t)(end - start) : strlen(start));
    }
    free(log);
    return out;
}

/* Credentials stay with their host when a reply redirects elsewhere (the
 * same server named "localhost", another host to libcurl): a Bearer
 * token (http_token) is not sent there and the load goes on; a signed
 * s3:// request (AWS keys, a session token) follows no redirect at all:
 * SigV4 signs for the endpoint's host, so the other host could not take
 * it, and the session token, a header of sluice's own, would go along
 * (before: 'x-amz-security-token: session-SECRET' at the redirect's
 * target). */
static void test_credentials_not_redirected(void **state)
{
    char elsewhere[64], target[256];
    snprintf(elsewhere, sizeof elsewhere, "localhost:%u", srv.port);
    sluice_options o = fast_options();
    o.http_token = "tok-SECRET-123";
    sluice_model *m;
    assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
    free(rf_get(&srv, "/ctl/clear"));
    snprintf(target, sizeof target, "http://%s/m.safetensors", elsewhere);
    arm("redirect", 1, target);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_OK);
    assert_memory_equal(sluice_tensor_data(t), good_b, B_SIZE);
    sluice_release(t);
    sluice_close(m);
    arm("ok", 0, NULL);
    char *h = request_to(elsewhere);
    if (!*h || strstr(h, "Authorization") || strstr(h, "SECRET"))
        fail_msg("the request redirected to %s:\n%s", elsewhere, h);
    free(h);

    s3_bucket_and_keys();
    o = fast_options();
    o.s3_endpoint = srv.base;
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(sluice_open("s3://models/m.safetensors", &o, &m), SLUICE_OK);
    free(rf_get(&srv, "/ctl/clear"));
    snprintf(target, sizeof target, "http://%s/models/m.safetensors", elsewhere);
    arm("redirect", 1, target);
    t = NULL;
    assert_int_equal(sluice_acquire(m, "b", &t), SLUICE_E_REMOTE);
    if (!strstr(sluice_errmsg(m), "HTTP 302") || !strstr(sluice_errmsg(m), "not followed"))
        fail_msg("%s", sluice_errmsg(m));
    assert_null(strstr(sluice_errmsg(m), "SECRET"));
    sluice_close(m);
    arm("ok", 0, NULL);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    h = request_to(elsewhere);
    if (*h)
        fail_msg("a signed request followed its redirect to %s:\n%s", elsewhere, h);
    free(h);
    (void)state;
}

/* Loads b with the fault server's replies carrying "ETag: " value (as
 * given, %-encoded for the control request); the request log after. */
static char *load_with_etag(const char *value)
{
    char q[256];
    snprintf(q, sizeof q, "/ctl/etag?value=%s", value);
    free(rf_get(&srv, q));
    free(rf_get(&srv, "/ctl/clear"));
    sluice_options o = fast_options();
    sluice_model *m;
    assert_int_equal(sluice_open(model_url, &o, &m), SLUICE_OK);
    sluice_tensor *t = NULL;
    if (sluice_acquire(m, "b", &t) != SLUICE_OK)
        fail_msg("ETag %s: %s", value, sluice_errmsg(m));
    assert_memory_equal(sluice_tensor_data(t), good_b, B_SIZE);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(rf_get(&srv, "/ctl/etag"));
    char *log = rf_get(&srv, "/ctl/log");
    assert_non_null(log);
    return log;
}

/* An ETag with a bare CR ('"x"\rX-Injected: 1') or another byte no
 * entity-tag may hold is no validator: the model loads and no request
 * echoes it (before: 'If-Match: "x"\rX-Injected: 1', which the server read
 * as a header of the reply's choosing); a well-formed one is asked with
 * If-Match on the reads after the first. */
static void test_etag_control_bytes(void **state)
{
    static const char *const bad[] = {"%22x%22%0DX-Injected:%201", "%22a%22b%22",
                                      "%22a%20b%22", "%22a%09X-Injected%22"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *log = load_with_etag(bad[i]);
        if (strstr(log, "X-Injected") || strcasestr(log, "If-Match"))
            fail_msg("ETag %s echoed:\n%s", bad[i], log);
        free(log);
    }
    char *log = load_with_etag("%22good-1%22");
    if (!strstr(log, "If-Match: \"good-1\""))
        fail_msg("a well-formed ETag not asked with If-Match:\n%s", log);
    free(log);
    /* whitespace after the value (OWS, RFC 9110 5.5) is not part of it:
     * still a validator (before: dropped as malformed, no If-Match) */
    log = load_with_etag("%22good-2%22%20%09%20");
    if (!strstr(log, "If-Match: \"good-2\"\r") && !strstr(log, "If-Match: \"good-2\"\n"))
        fail_msg("an ETag followed by whitespace not asked with If-Match:\n%s", log);
    free(log);
    (void)state;
}

/* Each item's message of a verify, appended to the context's text. */
static int collect_messages(void *user, const struct sluice_verify_item *it)
{
    char *text = user;
    size_t n = strlen(text);
    snprintf(text + n, 8192 - n, "%s|%s\n", it->name, it->message ? it->message : "");
    return 0;
}

/* A location with credentials (user:password@) and a query (a presigned
 * signature), the model's and a mirror's: it is parsed once at open, and
 * every message, metric label and source string shows it the same way,
 * "http://127.0.0.1:PORT/NAME?...", never the password nor the query: the
 * error of a failed load, a verify's refusals (tensor and whole file),
 * sluice_tensor_source of a tensor a mirror delivered, the metrics. */
static void test_location_shown_alike(void **state)
{
    const char *host = srv.base + strlen("http://");
    char secret[400], shown[400], mirror[400], mirror_shown[400];
    snprintf(secret, sizeof secret, "http://user:PW-SECRET@%s/m.safetensors?X-Amz-Signature=SIG-SECRET", host);
    snprintf(shown, sizeof shown, "%s/m.safetensors?...", srv.base);
    snprintf(mirror, sizeof mirror, "http://mirror:MIRROR-SECRET@%s/m.safetensors?token=TOKEN-SECRET", host);
    snprintf(mirror_shown, sizeof mirror_shown, "fallback 1 (%s/m.safetensors?...)", srv.base);
    arm("ok", 0, NULL);
    /* the sidecar is found beside it (its name without the query) */
    sluice_options o = fast_options();
    o.verify = SLUICE_VERIFY_REQUIRE;
    sluice_model *m;
    if (sluice_open(secret, &o, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    const char *mp = sluice_manifest_path(m);
    if (!mp || strstr(mp, "SECRET") || strcmp(mp, shown) == 0 || !strstr(mp, srv.base))
        fail_msg("manifest path: %s", mp ? mp : "(null)");
    /* a failed load: its error names the file as shown */
    sluice_tensor *t = NULL;
    arm("flip", 1, NULL);
    int rc = sluice_acquire(m, "b", &t);
    const char *msg = sluice_errmsg(m);
    if (rc != SLUICE_E_CHECKSUM || strstr(msg, "SECRET") || !strstr(msg, shown))
        fail_msg("load: %d: %s", rc, msg);
    /* a verify's refusals: the tensor's and the whole file's */
    char *text = calloc(1, 8192);
    assert_non_null(text);
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_FILES;
    vo.on_item = collect_messages;
    vo.user = text;
    arm("flip", 100, NULL);
    rc = sluice_verify(m, NULL, 0, &vo, NULL);
    arm("ok", 0, NULL);
    /* the first failure reported: a tensor's, or the file's (no digest in
     * the manifest), as they finish */
    if ((rc != SLUICE_E_CHECKSUM && rc != SLUICE_E_MANIFEST_MISSING) ||
        !strstr(text, "SHA-256 mismatch") || !strstr(text, "the manifest has no digest") ||
        strstr(text, "SECRET") || strstr(text, "X-Amz") || !strstr(text, shown))
        fail_msg("verify: %d: %s", rc, text);
    free(text);
    /* the refusal of a digest-only verify names the model as shown
     * (before: the location as given, password and signature) */
    vo.flags = SLUICE_VF_DIGEST_ONLY;
    vo.on_item = NULL;
    rc = sluice_verify(m, NULL, 0, &vo, NULL);
    msg = sluice_errmsg(m);
    if (rc != SLUICE_E_UNSUPPORTED || strstr(msg, "SECRET") || strstr(msg, "X-Amz") ||
        !strstr(msg, shown))
        fail_msg("digest-only verify: %d: %s", rc, msg);
    /* the metrics' label */
    text = metrics_of(m);
    char label[500];
    snprintf(label, sizeof label, "model=\"%s\"", shown);
    if (strstr(text, "SECRET") || strstr(text, "X-Amz") || !strstr(text, label))
        fail_msg("metrics do not name %s, or leak: %.2000s", label, text);
    free(text);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* a mirror at such a location delivers what the model's bytes failed */
    const char *mirrors[] = {mirror};
    o.fallback = mirrors;
    o.fallback_count = 1;
    if (sluice_open(secret, &o, &m) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    arm("flip", 1, NULL);
    if (sluice_acquire(m, "b", &t) != SLUICE_OK)
        fail_msg("%s", sluice_errmsg(m));
    const char *src = sluice_tensor_source(t);
    if (strstr(src, "SECRET") || strstr(src, "token=") || !strstr(src, mirror_shown) ||
        !strstr(src, shown))
        fail_msg("source: %s", src);
    sluice_release(t);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    arm("ok", 0, NULL);
    (void)state;
}

/* The last verify item of one kind (SLUICE_VERIFY_ITEM_*) reported. */
typedef struct item_seen {
    int kind;
    int status, has_digest;
    uint64_t bytes;
    char message[1024];
} item_seen;

static int item_of_kind(void *user, const struct sluice_verify_item *it)
{
    item_seen *s = user;
    if (it->kind == s->kind) {
        s->status = it->status;
        s->has_digest = it->has_digest;
        s->bytes = it->bytes;
        snprintf(s->message, sizeof s->message, "%s", it->message);
    }
    return 0;
}

/* sluice_verify's whole files of a remote model (SLUICE_VF_FILES, a
 * local manifest listing the file's SHA-256 and size), read with range
 * requests: the right digest and size pass, every byte hashed; a read the
 * server refuses (404) fails the file with the read's own error, nothing
 * hashed; a listed size that is not the file's fails it naming both. */
static void test_verify_files_remote(void **state)
{
    char *p = tu_join(root, "m.safetensors"), *dir = tu_tmpdir();
    char *mfp = tu_join(dir, "m.manifest.json");
    size_t flen = 0;
    unsigned char *bytes = tu_read_file(p, &flen);
    assert_non_null(bytes);
    uint8_t d[32];
    char hex[65];
    mf_sha256(bytes, flen, d);
    mf_hex(d, hex);
    for (int round = 0; round < 3; round++) {
        mf_buf b = {0};
        mf_addf(&b, "{\"format\": \"sluice-manifest\", \"version\": 1, \"algorithm\": "
                    "\"sha256\", \"files\": {\"m.safetensors\": {\"sha256\": \"%s\", "
                    "\"size\": %zu}}}", hex, round == 2 ? flen + 1 : flen);
        mf_write_text(mfp, b.p);
        mf_buf_free(&b);
        sluice_options o = fast_options();
        o.manifest_path = mfp;
        o.verify = SLUICE_VERIFY_IF_PRESENT;   /* it lists no tensor */
        sluice_model *m = NULL;
        int rc = sluice_open(model_url, &o, &m);
        if (rc != SLUICE_OK)
            fail_msg("open: %s", sluice_errmsg(m));
        if (round == 1)
            arm("status", 1, "404");
        sluice_verify_options vo;
        sluice_verify_options_init(&vo);
        vo.flags = SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS;
        item_seen seen = {.kind = SLUICE_VERIFY_ITEM_FILE};
        vo.on_item = item_of_kind;
        vo.user = &seen;
        struct sluice_verify_report r = {.size = sizeof r};
        rc = sluice_verify(m, NULL, 0, &vo, &r);
        if (round == 0) {
            if (rc != SLUICE_OK)
                fail_msg("verify --files: %s", sluice_errmsg(m));
            assert_int_equal(r.files_ok, 1);
            assert_int_equal(r.bytes_hashed, flen);
            assert_int_equal(seen.status, SLUICE_OK);
            assert_true(seen.has_digest);
            assert_int_equal(seen.bytes, flen);
            assert_string_equal(seen.message, "");
        } else if (round == 1) {
            assert_int_equal(rc, SLUICE_E_REMOTE);
            assert_int_equal(r.files_failed, 1);
            assert_int_equal(r.bytes_hashed, 0);
            assert_int_equal(seen.status, SLUICE_E_REMOTE);
            assert_false(seen.has_digest);
            if (!strstr(seen.message, "HTTP 404") || !strstr(sluice_errmsg(m), "HTTP 404") ||
                strncmp(seen.message, "file ", 5) != 0)
                fail_msg("item: %s; model: %s", seen.message, sluice_errmsg(m));
        } else {
            char want[128];
            snprintf(want, sizeof want, ": %zu bytes, the manifest says %zu", flen, flen + 1);
            assert_int_equal(rc, SLUICE_E_CHECKSUM);
            assert_int_equal(r.files_failed, 1);
            assert_int_equal(seen.status, SLUICE_E_CHECKSUM);
            assert_true(seen.has_digest);
            assert_int_equal(r.bytes_hashed, flen);
            if (!strstr(seen.message, want) || strncmp(seen.message, "file ", 5) != 0)
                fail_msg("item: %s", seen.message);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    free(bytes);
    free(p);
    free(mfp);
    tu_rmtree(dir);
    free(dir);
    (void)state;
}

/* A remote tensor whose read fails (404) in sluice_verify: the item's
 * message, and the model's, name the tensor, its file and offset, as
 * every other verify failure does, with the read's own error (before:
 * only "URL: HTTP 404", no tensor named). */
static void test_verify_read_failure_names_tensor(void **state)
{
    sluice_options o = fast_options();
    sluice_model *m = NULL;
    int rc = sluice_open(model_url, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    arm("status", 1, "404");
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    item_seen seen = {.kind = SLUICE_VERIFY_ITEM_TENSOR};
    vo.on_item = item_of_kind;
    vo.user = &seen;
    const char *const b[] = {"b"};
    rc = sluice_verify(m, b, 1, &vo, NULL);
    arm("ok", 0, NULL);
    assert_int_equal(rc, SLUICE_E_REMOTE);
    assert_int_equal(seen.status, SLUICE_E_REMOTE);
    assert_false(seen.has_digest);
    if (strncmp(seen.message, "tensor \"b\" (file ", 16) != 0 || !strstr(seen.message, "HTTP 404") ||
        !strstr(seen.message, "read at offset") || strncmp(sluice_errmsg(m), "tensor \"b\"", 10) != 0)
        fail_msg("item: %s; model: %s", seen.message, sluice_errmsg(m));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    (void)state;
}

/* A remote tensor of several pieces: big.safetensors, one tensor of
 * 40 MiB + 5 of varied bytes (a piece hashed out of order, or from the
 * wrong one of a thread's two buffers, would change its digest). */
#define BIG_BYTES ((size_t)(40u << 20) + 5)

typedef struct verify_call {
    sluice_model *m;
    sluice_cancel *c;
    int rc;
    char msg[512];
} verify_call;

/* This program is linked with -Wl,--wrap=pthread_create (remote.cmake):
 * armed, a thread that may not start threads (any but the test's and
 * its verifier: the verifying threads) is refused one (EAGAIN, as at a
 * thread limit), so that each verifying thread runs without its fetcher
 * (verify.c fetch_start). Disarmed, every call goes through. */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
static atomic_int refuse_threads, threads_refused;
static _Thread_local int may_start_threads;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    if (atomic_load(&refuse_threads) && !may_start_threads) {
        atomic_fetch_add(&threads_refused, 1);
        return EAGAIN;
    }
    return __real_pthread_create(t, attr, fn, arg);
}

static void *verifier(void *p)
{
    verify_call *vc = p;
    may_start_threads = 1;
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.cancel = vc->c;
    vc->rc = sluice_verify(vc->m, NULL, 0, &vo, NULL);
    snprintf(vc->msg, sizeof vc->msg, "%s", vc->rc ? sluice_errmsg(vc->m) : "");
    return NULL;
}

/* sluice_verify reads a remote item in pieces, the next fetched while
 * one is hashed: the 40 MiB tensor in 3 requests, its digest right (the
 * pieces hashed in order); a byte flipped in its last piece fails it; the
 * request of its second piece refused (404) fails it at that piece's
 * offset; a cancel while a piece crawls (2 MB/s) returns
 * SLUICE_E_CANCELLED at once, the fetching thread stopped with it
 * (ASan/TSan: nothing left running, nothing leaked). no_fetcher: each
 * verifying thread is refused its fetcher (pthread_create fails), and
 * reads its pieces itself, one after the other, with the same results. */
static void verify_pieces(int no_fetcher)
{
    may_start_threads = 1;
    atomic_store(&threads_refused, 0);
    atomic_store(&refuse_threads, no_fetcher);
    char *p = tu_join(root, "big.safetensors");
    uint64_t data_start;
    unsigned char *bytes = mf_write_u8_model(p, "z", BIG_BYTES, 0, &data_start);
    uint8_t d[32];
    char hex[65], text[128], url[300];
    mf_sha256(bytes, BIG_BYTES, d);
    int n = snprintf(text, sizeof text, "{\"z\":\"%s\"}", mf_hex(d, hex));
    char *mf = tu_join(root, "big.safetensors.manifest.json");
    tu_write_file(mf, text, (size_t)n);
    snprintf(url, sizeof url, "%s/big.safetensors", srv.base);
    sluice_options o = fast_options();
    verify_call vc = {0};
    arm("ok", 0, NULL);
    if (sluice_open(url, &o, &vc.m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(vc.m));
    struct sluice_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    assert_int_equal(sluice_stats(vc.m, &st0), SLUICE_OK);
    struct sluice_verify_report r = {.size = sizeof r};
    int rc = sluice_verify(vc.m, NULL, 0, NULL, &r);
    if (rc != SLUICE_OK)
        fail_msg("verify: %s", sluice_errmsg(vc.m));
    assert_int_equal(r.bytes_hashed, BIG_BYTES);
    assert_int_equal(sluice_stats(vc.m, &st1), SLUICE_OK);
    assert_int_equal(st1.remote_reads - st0.remote_reads, 3);   /* 16 + 16 + 8 MiB */
    /* a byte of the last piece flipped on the wire */
    char at[32];
    snprintf(at, sizeof at, "%zu", (size_t)data_start + (size_t)(35u << 20));
    arm("flipat", 1, at);
    rc = sluice_verify(vc.m, NULL, 0, NULL, &r);
    arm("ok", 0, NULL);
    if (rc != SLUICE_E_CHECKSUM || !strstr(sluice_errmsg(vc.m), "tensor \"z\""))
        fail_msg("flipped: %s: %s", sluice_strerror(rc), sluice_errmsg(vc.m));
    /* the second piece refused (404) while the first is hashed: the item
     * fails at that piece's offset, not the first's nor the third's */
    size_t second = (size_t)data_start + (size_t)(16u << 20);
    char want[64];
    snprintf(at, sizeof at, "%zu", second + 1000);
    snprintf(want, sizeof want, "read at offset %zu failed", second);
    arm("statusat", 10, at);
    rc = sluice_verify(vc.m, NULL, 0, NULL, &r);
    arm("ok", 0, NULL);
    if (rc != SLUICE_E_REMOTE || !strstr(sluice_errmsg(vc.m), want))
        fail_msg("404 in the second piece: %s: %s", sluice_strerror(rc), sluice_errmsg(vc.m));
    /* a cancel while a piece crawls */
    assert_int_equal(sluice_cancel_create(&vc.c), SLUICE_OK);
    int before = faults_served();
    arm("slow", 100, "2000000");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, verifier, &vc), 0);
    wait_fault_served(before);  /* a piece is on the wire */
    double t0 = now_s();
    sluice_cancel_request(vc.c);
    pthread_join(th, NULL);
    double took = now_s() - t0;
    arm("ok", 0, NULL);
    if (vc.rc != SLUICE_E_CANCELLED || took >= 5.0)
        fail_msg("verify: %s after %.2f s: %s", sluice_strerror(vc.rc), took, vc.msg);
    sluice_cancel_free(vc.c);
    atomic_store(&refuse_threads, 0);
    /* the fetchers refused: one a verify (its one thread), none else */
    assert_int_equal(atomic_load(&threads_refused), no_fetcher ? 4 : 0);
    assert_int_equal(sluice_close(vc.m), SLUICE_OK);
    unlink(p);
    unlink(mf);
    free(p);
    free(mf);
    free(bytes);
}

static void test_verify_pieces(void **state)
{
    verify_pieces(0);
    (void)state;
}

static void test_verify_pieces_without_fetcher(void **state)
{
    verify_pieces(1);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_503_retried),
        cmocka_unit_test(test_verify_files_remote),
        cmocka_unit_test(test_verify_read_failure_names_tensor),
        cmocka_unit_test(test_verify_pieces),
        cmocka_unit_test(test_verify_pieces_without_fetcher),
        cmocka_unit_test(test_etag_control_bytes),
        cmocka_unit_test(test_credentials_not_redirected),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_429_and_500s),
        cmocka_unit_test(test_permanent_not_retried),
        cmocka_unit_test(test_attempts_bounded),
        cmocka_unit_test(test_deadline_bounded),
        cmocka_unit_test(test_range_ignored),
        cmocka_unit_test(test_object_grew),
        cmocka_unit_test(test_wrong_range_refused),
        cmocka_unit_test(test_partial_range_resumed),
        cmocka_unit_test(test_short_body_resumed),
        cmocka_unit_test(test_reset_retried),
        cmocka_unit_test(test_stall_times_out),
        cmocka_unit_test(test_slow_link_queued_reads_all_load),
        cmocka_unit_test(test_slow_read_longer_than_deadline),
        cmocka_unit_test(test_trickle_fails_within_bound),
        cmocka_unit_test(test_slow_first_byte_then_slow_link),
        cmocka_unit_test(test_flipped_byte),
        cmocka_unit_test(test_close_with_reads_hanging),
        cmocka_unit_test(test_part_cancel_hanging),
        cmocka_unit_test(test_close_while_retrying),
        cmocka_unit_test(test_close_while_mirror_opens),
        cmocka_unit_test(test_mirror_secrets_not_shown),
        cmocka_unit_test(test_part_note_secrets_not_shown),
        cmocka_unit_test(test_location_shown_alike),
        cmocka_unit_test(test_part_fallback_few_requests),
        cmocka_unit_test(test_part_multipart_faults),
        cmocka_unit_test(test_part_reads_are_engine_reads),
        cmocka_unit_test(test_part_under_queue_depth),
        cmocka_unit_test(test_request_format),
        cmocka_unit_test(test_open_and_mirror_counted),
        cmocka_unit_test(test_missing_manifest_visible),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
