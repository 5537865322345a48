/* test_metrics.c: the metrics (sluice_metrics_write, _write_models) and the
 * endpoint (sluice_metrics_serve).
 *
 * A model with one tampered tensor (its expected digest replaced through
 * the test hook) is loaded with acquires and a stream; the rendering must
 * count the checksum failure, fill the acquire histogram, escape labels,
 * render several models with one HELP/TYPE per family, and refuse bad
 * input. sluice_verify (no load) with one byte flipped counts its items
 * by kind and result as they are reported. With SLUICE_METRICS_DUMP=DIR in the environment every rendering
 * is also written to DIR (metrics_promtool.sh feeds them to promtool).
 * The endpoint: 200 on GET /metrics, 404, 405, an oversized request, slow
 * clients and 200 connections at once while a load runs.
 */
#include "engine_fixture.h"
#include "mf_fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void dump(const char *name, const char *text)
{
    const char *dir = getenv("SLUICE_METRICS_DUMP");
    if (!dir || !*dir)
        return;
    char *p = tu_join(dir, name);
    tu_write_file(p, text, strlen(text));
    free(p);
}

static char *render(sluice_model *const *ms, size_t n, sluice_metrics_format f)
{
    size_t need = 0;
    assert_int_equal(sluice_metrics_write_models(ms, n, NULL, 0, &need, f), SLUICE_E_BUFFER);
    assert_true(need > 1);
    size_t cap = need + 4096;
    char *buf = malloc(cap);
    assert_non_null(buf);
    int rc = sluice_metrics_write_models(ms, n, buf, cap, &need, f);
    if (rc != SLUICE_OK)
        fail_msg("render: %s: %s", sluice_strerror(rc), sluice_errmsg(ms[0]));
    assert_int_equal(strlen(buf) + 1, need);
    return buf;
}

static int stream_cb(void *user, sluice_tensor *t, int status,
                     const struct sluice_tensor_info *info, const char *msg)
{
    (void)user, (void)info, (void)msg, (void)status;
    sluice_release(t);
    return 0;
}

/* Loads everything: acquires (one fails its checksum) and a stream. */
static void load(sluice_model *m, size_t bad)
{
    size_t n = sluice_count(m);
    unsigned char(*d)[32] = calloc(n, 32);
    unsigned char *has = calloc(n, 1);
    assert_non_null(d);
    assert_non_null(has);
    memset(d[bad], 0xab, 32);
    has[bad] = 1;
    struct sluice_tensor_info info = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, bad, &info), SLUICE_OK);
    assert_true(info.nbytes > 0);
    assert_int_equal(sl_engine_set_digests(m, (const unsigned char(*)[32])d, has), SLUICE_OK);
    for (size_t i = 0; i < n; i++) {
        sluice_tensor *t = NULL;
        int rc = sluice_acquire_index(m, i, &t);
        assert_int_equal(rc, i == bad ? SLUICE_E_CHECKSUM : SLUICE_OK);
        sluice_release(t);
    }
    sluice_stream(m, NULL, 0, stream_cb, NULL);
    free(d);
    free(has);
}

static char *model_dir;

static int setup(void **state)
{
    (void)state;
    model_dir = ef_model(1, ef_sizes, EF_NSIZES, 42);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(model_dir);
    free(model_dir);
    return 0;
}

/* The one rule of content negotiation, shared by sluice_metrics_serve and
 * `sluice serve`'s endpoint: OpenMetrics when Accept names it, in any
 * case, among other types; else the text format 0.0.4. */
static void test_format_for_accept(void **state)
{
    (void)state;
    assert_int_equal(sluice_metrics_format_for_accept(NULL), SLUICE_METRICS_PROMETHEUS);
    assert_int_equal(sluice_metrics_format_for_accept(""), SLUICE_METRICS_PROMETHEUS);
    assert_int_equal(sluice_metrics_format_for_accept("text/plain;version=0.0.4"),
                     SLUICE_METRICS_PROMETHEUS);
    assert_int_equal(sluice_metrics_format_for_accept("application/openmetrics-tex"),
                     SLUICE_METRICS_PROMETHEUS);
    assert_int_equal(sluice_metrics_format_for_accept("application/openmetrics-text"),
                     SLUICE_METRICS_OPENMETRICS);
    assert_int_equal(
        sluice_metrics_format_for_accept("application/openmetrics-text;version=1.0.0;q=0.75,"
                                         "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
        SLUICE_METRICS_OPENMETRICS);
    assert_int_equal(sluice_metrics_format_for_accept("text/plain, Application/OpenMetrics-Text"),
                     SLUICE_METRICS_OPENMETRICS);
}

static void test_one_model(void **state)
{
    (void)state;
    sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
    o.metrics_label = "m1";
    sluice_model *m = ef_open(model_dir, &o);
    load(m, 3);
    sl_engine_quiesce(m); /* read-ahead settled: the counters stay put */
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_true(st.checksum_failures >= 1);
    char *p = render(&m, 1, SLUICE_METRICS_PROMETHEUS);
    assert_non_null(strstr(p, "# TYPE sluice_checksum_failures_total counter\n"));
    /* the acquire failed it; the stream (and read-ahead) may read it again */
    char cs[128];
    snprintf(cs, sizeof cs, "sluice_checksum_failures_total{model=\"m1\"} %llu\n",
             (unsigned long long)st.checksum_failures);
    assert_non_null(strstr(p, cs));
    assert_non_null(strstr(p, "# TYPE sluice_acquire_wait_seconds histogram\n"));
    assert_non_null(strstr(p, "sluice_acquire_wait_seconds_bucket{model=\"m1\",le=\"5e-05\"}") ||
                    strstr(p, "sluice_acquire_wait_seconds_bucket{model=\"m1\",le=\"0.00005\"}"));
    char want[128];
    /* every acquire but the one of the tampered tensor, which failed */
    snprintf(want, sizeof want, "sluice_acquire_wait_seconds_count{model=\"m1\"} %zu\n",
             sluice_count(m) - 1);
    assert_non_null(strstr(p, want));
    assert_non_null(strstr(p, "sluice_streams_total{model=\"m1\"} 1\n"));
    assert_non_null(strstr(p, "sluice_stream_duration_seconds_count{model=\"m1\"} 1\n"));
    assert_non_null(strstr(p, "sluice_open_to_first_tensor_seconds_count{model=\"m1\"} 1\n"));
    assert_non_null(strstr(p, "sluice_live_handles{model=\"m1\"} 0\n"));
    assert_non_null(strstr(p, "# TYPE sluice_backend_info gauge\n"));
    assert_true(strstr(p, "sluice_backend_info{model=\"m1\",backend=\"io_uring\"} 1\n") ||
                strstr(p, "sluice_backend_info{model=\"m1\",backend=\"pread\"} 1\n"));
    assert_null(strstr(p, "# EOF"));
    assert_int_equal(count_of(p, "# TYPE "), count_of(p, "# HELP "));
    dump("one.prom", p);
    char *om = render(&m, 1, SLUICE_METRICS_OPENMETRICS);
    assert_non_null(strstr(om, "# TYPE sluice_checksum_failures counter\n"));
    assert_non_null(strstr(om, cs));
    assert_non_null(strstr(om, "le=\"1.0\""));
    assert_true(strlen(om) > 6 && !strcmp(om + strlen(om) - 6, "# EOF\n"));
    dump("one.om", om);
    free(p);
    free(om);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void test_several_models_and_escapes(void **state)
{
    (void)state;
    const char *labels[] = {"a\\b", "quote\"d", "line\nfeed", "ünïcödé"};
    sluice_model *ms[4];
    for (int k = 0; k < 4; k++) {
        sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
        o.metrics_label = labels[k];
        ms[k] = ef_open(model_dir, &o);
        load(ms[k], (size_t)k + 2);
    }
    char *p = render(ms, 4, SLUICE_METRICS_PROMETHEUS);
    assert_int_equal(count_of(p, "# TYPE sluice_checksum_failures_total "), 1);
    assert_int_equal(count_of(p, "sluice_checksum_failures_total{"), 4);
    assert_non_null(strstr(p, "{model=\"a\\\\b\"}"));
    assert_non_null(strstr(p, "{model=\"quote\\\"d\"}"));
    assert_non_null(strstr(p, "{model=\"line\\nfeed\"}"));
    assert_non_null(strstr(p, "{model=\"ünïcödé\"}"));
    dump("several.prom", p);
    char *om = render(ms, 4, SLUICE_METRICS_OPENMETRICS);
    assert_int_equal(count_of(om, "# EOF"), 1);
    dump("several.om", om);
    free(p);
    free(om);

    /* The same model twice, or two with one label: refused. */
    sluice_model *twice[2] = {ms[0], ms[0]};
    char buf[64];
    assert_int_equal(sluice_metrics_write_models(twice, 2, buf, sizeof buf, NULL,
                                                 SLUICE_METRICS_PROMETHEUS),
                     SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(ms[0]), "same label"));
    for (int k = 0; k < 4; k++)
        assert_int_equal(sluice_close(ms[k]), SLUICE_OK);
}

/* Retries by cause, from injected faults. */
static void test_retry_causes(void **state)
{
    (void)state;
    sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
    o.metrics_label = "r";
    sluice_model *m = ef_open(model_dir, &o);
    struct {
        sl_io_fault kind;
        const char *line;
    } cases[] = {{SL_IO_FAULT_EINTR, "sluice_read_retries_total{model=\"r\",cause=\"eintr\"} 2\n"},
                 {SL_IO_FAULT_EAGAIN, "sluice_read_retries_total{model=\"r\",cause=\"eagain\"} 2\n"},
                 {SL_IO_FAULT_SHORT, "sluice_read_retries_total{model=\"r\",cause=\"short\"} 2\n"}};
    for (int k = 0; k < 3; k++) {
        sl_engine_drop_cache(m);
        assert_int_equal(sl_engine_set_fault(m, cases[k].kind, 1, 2), SLUICE_OK);
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire_index(m, 9, &t), SLUICE_OK); /* 200000 bytes */
        sluice_release(t);
        sl_engine_quiesce(m);
        sl_engine_set_fault(m, SL_IO_FAULT_NONE, 0, 0);
        char *p = render(&m, 1, SLUICE_METRICS_PROMETHEUS);
        if (!strstr(p, cases[k].line))
            fail_msg("want %s in:\n%s", cases[k].line, strstr(p, "# HELP sluice_read_retries"));
        free(p);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* The line "name{model=\"v\"<extra>} value\n" is in p. */
static void want_sample(const char *p, const char *name, const char *extra, unsigned long long v)
{
    char line[256];
    snprintf(line, sizeof line, "%s{model=\"v\"%s} %llu\n", name, extra, v);
    if (!strstr(p, line))
        fail_msg("want %s in:\n%s", line, p);
}

#define VERIFY_ITEMS "sluice_verify_items_total"

typedef struct verify_seen {
    sluice_model *m;
    size_t calls;
} verify_seen;

/* The items are counted before the caller's callback sees them. */
static int verify_cb(void *user, const struct sluice_verify_item *it)
{
    verify_seen *s = user;
    (void)it;
    s->calls++;
    char *p = render(&s->m, 1, SLUICE_METRICS_PROMETHEUS);
    unsigned long long sum = 0;
    for (const char *q = p; (q = strstr(q, VERIFY_ITEMS "{model=\"v\",")); q++)
        sum += strtoull(strchr(q, '}') + 2, NULL, 10);
    assert_int_equal(sum, s->calls);
    free(p);
    return 0;
}

/* sluice_verify (no engine load) with one byte of one tensor flipped and
 * whole files asked for, the manifest (flat: no file digests) computed
 * here: one tensor fails its checksum, the file has no digest (error),
 * the others are ok; the bytes hashed are the report's; the load counters
 * stay 0. With SLUICE_METRICS=0 nothing is counted, the callback still
 * called. */
static void test_verify_counts(void **state)
{
    (void)state;
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 7);
    char *shard = tu_join(dir, "model-00001-of-00001.safetensors");
    char *mfp = tu_join(dir, "sluice.manifest.json");
    sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = ef_open(dir, &o);
    mf_buf b = {0};
    mf_addf(&b, "{");
    for (size_t i = 0; i < sluice_count(m); i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &ti), SLUICE_OK);
        void *bytes = tu_pread_range(shard, ti.offset, (size_t)ti.nbytes);
        uint8_t d[32];
        char hex[65];
        mf_sha256(bytes, (size_t)ti.nbytes, d);
        free(bytes);
        mf_addf(&b, "%s\"%s\":\"%s\"", i ? "," : "", ti.name, mf_hex(d, hex));
    }
    mf_addf(&b, "}");
    mf_write_text(mfp, b.p);
    mf_buf_free(&b);
    struct sluice_tensor_info bad = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, "s0.t012", &bad), SLUICE_OK); /* 12345 bytes */
    mf_flip_byte(shard, bad.offset + bad.nbytes / 2);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    for (int on = 1; on >= 0; on--) {
        o = ef_opts(8 << 20, 64 << 10, 0);
        o.metrics_label = "v";
        setenv("SLUICE_METRICS", on ? "1" : "0", 1);
        m = ef_open(dir, &o);
        unsetenv("SLUICE_METRICS");
        size_t n = sluice_count(m);
        verify_seen s = {.m = m};
        sluice_verify_options vo;
        sluice_verify_options_init(&vo);
        vo.flags = SLUICE_VF_FILES;
        vo.threads = 2;
        vo.on_item = on ? verify_cb : NULL;
        vo.user = &s;
        struct sluice_verify_report r = {.size = sizeof r};
        assert_int_not_equal(sluice_verify(m, NULL, 0, &vo, &r), SLUICE_OK);
        assert_int_equal(r.tensors_ok, n - 1);
        assert_int_equal(r.tensors_failed, 1);
        assert_int_equal(r.files_failed, 1);
        assert_int_equal(s.calls, on ? n + 1 : 0);
        char *p = render(&m, 1, SLUICE_METRICS_PROMETHEUS);
        want_sample(p, "sluice_verify_runs_total", "", on);
        want_sample(p, VERIFY_ITEMS, ",kind=\"tensor\",result=\"ok\"", on ? n - 1 : 0);
        want_sample(p, VERIFY_ITEMS, ",kind=\"tensor\",result=\"checksum\"", on);
        want_sample(p, VERIFY_ITEMS, ",kind=\"tensor\",result=\"error\"", 0);
        want_sample(p, VERIFY_ITEMS, ",kind=\"file\",result=\"ok\"", 0);
        want_sample(p, VERIFY_ITEMS, ",kind=\"file\",result=\"checksum\"", 0);
        want_sample(p, VERIFY_ITEMS, ",kind=\"file\",result=\"error\"", on);
        want_sample(p, "sluice_verify_bytes_hashed_total", "", on ? r.bytes_hashed : 0);
        want_sample(p, "sluice_tensors_loaded_total", "", 0);
        want_sample(p, "sluice_checksum_failures_total", "", 0);
        want_sample(p, "sluice_bytes_hashed_total", "", 0);
        assert_int_equal(count_of(p, "# TYPE " VERIFY_ITEMS " counter\n"), 1);
        if (on)
            dump("verify.prom", p);
        free(p);
        char *om = render(&m, 1, SLUICE_METRICS_OPENMETRICS);
        assert_non_null(strstr(om, "# TYPE sluice_verify_items counter\n"));
        if (on)
            dump("verify.om", om);
        free(om);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    tu_rmtree(dir);
    free(dir);
    free(shard);
    free(mfp);
}

static void test_bad_input(void **state)
{
    (void)state;
    sluice_model *m = NULL;
    sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
    const char *bad_labels[] = {"", "\xff\xfe", NULL};
    for (int k = 0; bad_labels[k]; k++) {
        o.metrics_label = bad_labels[k];
        assert_int_equal(sluice_open(model_dir, &o, &m), SLUICE_E_INVAL);
        assert_non_null(strstr(sluice_errmsg(m), "metrics_label"));
        sluice_close(m);
    }
    char *longl = malloc(2000);
    assert_non_null(longl);
    memset(longl, 'x', 1999);
    longl[1999] = '\0';
    o.metrics_label = longl;
    assert_int_equal(sluice_open(model_dir, &o, &m), SLUICE_E_INVAL);
    sluice_close(m);
    free(longl);

    o.metrics_label = NULL; /* the path */
    m = ef_open(model_dir, &o);
    char buf[32];
    size_t need = 0;
    assert_int_equal(sluice_metrics_write(NULL, buf, sizeof buf, &need, 0), SLUICE_E_INVAL);
    assert_int_equal(sluice_metrics_write(m, NULL, 10, &need, 0), SLUICE_E_INVAL);
    assert_int_equal(sluice_metrics_write(m, buf, sizeof buf, &need, (sluice_metrics_format)7),
                     SLUICE_E_INVAL);
    assert_int_equal(sluice_metrics_write(m, buf, sizeof buf, &need, 0), SLUICE_E_BUFFER);
    assert_string_equal(buf, "");
    assert_true(need > sizeof buf);
    char *big = malloc(need);
    assert_non_null(big);
    assert_int_equal(sluice_metrics_write(m, big, need, NULL, 0), SLUICE_OK);
    assert_non_null(strstr(big, model_dir)); /* the default label */
    free(big);
    assert_int_equal(sluice_metrics_write_models(NULL, 1, buf, sizeof buf, NULL, 0), SLUICE_E_INVAL);
    assert_int_equal(sluice_metrics_write_models(&m, 0, buf, sizeof buf, NULL, 0), SLUICE_E_INVAL);
    sluice_model *withnull[2] = {m, NULL};
    assert_int_equal(sluice_metrics_write_models(withnull, 2, buf, sizeof buf, NULL, 0),
                     SLUICE_E_INVAL);
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* A failed model renders nothing. */
    o.metrics_label = "";
    assert_int_equal(sluice_open(model_dir, &o, &m), SLUICE_E_INVAL);
    assert_int_equal(sluice_metrics_write(m, buf, sizeof buf, NULL, 0), SLUICE_E_INVAL);
    sluice_close(m);
    assert_string_equal(sluice_strerror(SLUICE_E_BUFFER), "output buffer too small");
    assert_string_equal(sluice_strerror(SLUICE_E_UNSUPPORTED), "not supported by this build");
}

/* ---------------------------------------------------------------- endpoint */

/* A connection to 127.0.0.1:port from the loopback address 127.0.0.src
 * (the endpoint caps connections per client address). */
static int connect_from(unsigned src, unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + src);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
        connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int connect_to(unsigned port)
{
    return connect_from(1, port);
}

/* Sends req, reads the answer until close (at most 5 s); returns the
 * status code (0: none) and the body in *body (malloc'd) when asked. */
static int http(unsigned port, const char *req, char **body)
{
    int fd = connect_to(port);
    if (fd < 0)
        return 0;
    size_t len = strlen(req);
    if (send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
        close(fd);
        return 0;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0)
            break;
        if (got == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            assert_non_null(buf);
        }
        ssize_t r = recv(fd, buf + got, cap - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    int status = 0;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    if (body) {
        char *b = strstr(buf, "\r\n\r\n");
        *body = strdup(b ? b + 4 : "");
    }
    free(buf);
    return status;
}

typedef struct loader {
    sluice_model *m;
    atomic_int stop;
    atomic_int rounds;
} loader;

static void *load_loop(void *arg)
{
    loader *l = arg;
    while (!atomic_load(&l->stop)) {
        sl_engine_drop_cache(l->m);
        sluice_stream(l->m, NULL, 0, stream_cb, NULL);
        atomic_fetch_add(&l->rounds, 1);
    }
    return NULL;
}

static void test_endpoint(void **state)
{
    (void)state;
    sluice_metrics_server *s = NULL;
    int rc = sluice_metrics_serve(NULL, 0, &s);
    if (rc == SLUICE_E_UNSUPPORTED) {
        print_message("built without libmicrohttpd: endpoint not tested\n");
        skip();
    }
    assert_int_equal(rc, SLUICE_OK);
    unsigned port = sluice_metrics_server_port(s);
    assert_true(port > 0);
    assert_int_equal(sluice_metrics_serve("not an address", 0, &(sluice_metrics_server *){0}),
                     SLUICE_E_INVAL);
    assert_int_equal(sluice_metrics_serve(NULL, 0, NULL), SLUICE_E_INVAL);
    sluice_metrics_server *s2 = NULL;
    assert_int_equal(sluice_metrics_serve("127.0.0.1", port, &s2), SLUICE_E_IO);

    sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
    o.metrics_label = "served";
    sluice_model *m = ef_open(model_dir, &o);
    load(m, 1);
    assert_int_equal(sluice_metrics_server_add(s, m), SLUICE_OK);
    assert_int_equal(sluice_metrics_server_add(s, m), SLUICE_OK);
    assert_int_equal(sluice_metrics_server_add(s, NULL), SLUICE_E_INVAL);

    loader l = {.m = m};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, load_loop, &l), 0);

    char *body = NULL;
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                          &body), 200);
    assert_non_null(strstr(body, "sluice_checksum_failures_total{model=\"served\"} "));
    free(body);
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: "
                                "application/openmetrics-text; version=1.0.0\r\n"
                                "Connection: close\r\n\r\n", &body), 200);
    assert_non_null(strstr(body, "# EOF\n"));
    free(body);
    assert_int_equal(http(port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL), 404);
    assert_int_equal(http(port, "GET /metricsx HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL), 404);
    /* the Accept header's media type in any case */
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: "
                                "Application/OpenMetrics-Text\r\nConnection: close\r\n\r\n",
                          &body), 200);
    assert_non_null(strstr(body, "# EOF\n"));
    free(body);
    /* kept alive: two requests on one connection, two answers */
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                          &body), 200);
    assert_non_null(strstr(body, "HTTP/1.1 200"));
    free(body);
    /* a GET with a body is refused, the body not read */
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                "Connection: close\r\n\r\nhello", NULL), 400);
    const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "PATCH", NULL};
    for (int k = 0; methods[k]; k++) {
        char req[256];
        snprintf(req, sizeof req, "%s /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                 "Connection: close\r\n\r\nhello", methods[k]);
        assert_int_equal(http(port, req, NULL), 405);
    }
    long rss0 = tu_status_kib("VmRSS:");

    /* Oversized: a 1 MiB header. The server answers an error or closes. */
    size_t big = 1 << 20;
    char *req = malloc(big + 128);
    assert_non_null(req);
    int n = snprintf(req, 128, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + n, 'a', big);
    strcpy(req + n + big, "\r\n\r\n");
    int st = http(port, req, NULL);
    assert_true(st == 0 || st >= 400);
    free(req);

    /* Slow clients: 20 connections from 127.0.0.2 that began a request:
     * 8 of them hold a slot (the per-address cap, sluice.h), the others
     * are closed; a scrape from 127.0.0.1 is answered. (The deadline on
     * a whole request: tests/metrics/http_limits.py.) */
    int slow[20];
    for (int k = 0; k < 20; k++) {
        slow[k] = connect_from(2, port);
        assert_true(slow[k] >= 0);
        send(slow[k], "GET /met", 8, MSG_NOSIGNAL);
    }
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                          NULL), 200);

    /* 200 connections at once from one address: 8 are served, the others
     * closed at once (sluice.h); the server lives on, and a scrape works
     * again once they go. */
    int many[200];
    for (int k = 0; k < 200; k++)
        many[k] = connect_from(3, port);
    for (int k = 0; k < 200; k++)
        if (many[k] >= 0)
            close(many[k]);
    for (int k = 0; k < 20; k++)
        close(slow[k]);
    int ok = 0;
    for (int tries = 0; tries < 50 && !ok; tries++) {
        ok = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL) == 200;
        if (!ok)
            usleep(100000);
    }
    assert_true(ok);

    /* A client that begins a request and then sends nothing is cut off
     * after the idle timeout (5 s). */
    int fd = connect_to(port);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, "GET /", 5, MSG_NOSIGNAL), 5);
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 9000), 1);
    char c;
    assert_true(recv(fd, &c, 1, 0) <= 0);
    close(fd);

    int before = atomic_load(&l.rounds);
    usleep(300000);
    atomic_store(&l.stop, 1);
    pthread_join(th, NULL);
    assert_true(atomic_load(&l.rounds) > 0);
    (void)before;
    long rss1 = tu_status_kib("VmRSS:");
    print_message("endpoint: %d load rounds; RSS %ld -> %ld KiB\n", atomic_load(&l.rounds), rss0, rss1);
    assert_true(rss1 - rss0 < 64 * 1024);

    assert_int_equal(sluice_metrics_server_remove(s, m), SLUICE_OK);
    assert_int_equal(sluice_metrics_server_remove(s, m), SLUICE_E_NOT_FOUND);
    assert_int_equal(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                          &body), 200);
    assert_null(strstr(body, "served"));
    free(body);
    sluice_metrics_server_free(s);
    sluice_metrics_server_free(NULL);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* test_metrics --free-port: prints a free TCP port of 127.0.0.1. */
static int free_port_main(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return 1;
    printf("%u\n", (unsigned)ntohs(a.sin_port));
    close(fd);
    return 0;
}

/* test_metrics --serve PORTFILE SECONDS: for metrics_prometheus.sh. Loads
 * the fixture model with one tampered tensor (every good tensor acquired
 * in reverse order, so that read-ahead stays off, then the tampered one
 * once: exactly one checksum failure), serves its metrics on a free port
 * of 127.0.0.1, writes the port to PORTFILE, and serves for SECONDS. */
static int serve_main(const char *portfile, int seconds)
{
    char *dir = ef_model(1, ef_sizes, EF_NSIZES, 7);
    sluice_options o = ef_opts(8 << 20, 64 << 10, 0);
    o.metrics_label = "tampered";
    sluice_model *m = NULL;
    if (sluice_open(dir, &o, &m) != SLUICE_OK)
        return 1;
    size_t n = sluice_count(m), bad = 5;
    unsigned char(*d)[32] = calloc(n, 32);
    unsigned char *has = calloc(n, 1);
    memset(d[bad], 0xab, 32);
    has[bad] = 1;
    sl_engine_set_digests(m, (const unsigned char(*)[32])d, has);
    int fails = 0;
    for (size_t i = n; i-- > 0;) {
        if (i == bad)
            continue;
        sluice_tensor *t = NULL;
        fails += sluice_acquire_index(m, i, &t) != SLUICE_OK;
        sluice_release(t);
    }
    sluice_tensor *t = NULL;
    fails += sluice_acquire_index(m, bad, &t) != SLUICE_E_CHECKSUM;
    sluice_metrics_server *s = NULL;
    int rc = fails ? SLUICE_E_CHECKSUM : sluice_metrics_serve(NULL, 0, &s);
    if (rc == SLUICE_E_UNSUPPORTED) {
        printf("SKIP: built without libmicrohttpd: no metrics endpoint\n");
        return 77;
    }
    if (rc != SLUICE_OK || sluice_metrics_server_add(s, m) != SLUICE_OK)
        return 1;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", portfile);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return 1;
    fprintf(f, "%u\n", sluice_metrics_server_port(s));
    fclose(f);
    rename(tmp, portfile);
    sleep((unsigned)seconds);
    sluice_metrics_server_remove(s, m);
    sluice_metrics_server_free(s);
    sluice_close(m);
    tu_rmtree(dir);
    free(dir);
    free(d);
    free(has);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--free-port"))
        return free_port_main();
    if (argc == 4 && !strcmp(argv[1], "--serve"))
        return serve_main(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_for_accept),
        cmocka_unit_test(test_one_model),
        cmocka_unit_test(test_several_models_and_escapes),
        cmocka_unit_test(test_retry_causes),
        cmocka_unit_test(test_verify_counts),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_endpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
