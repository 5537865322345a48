/* test_remote_proxy.c: remote models read through a proxy (sluice.h
 * "Proxies"), with real servers started by the test (remote_fixture.h):
 * an nginx origin, a real squid caching proxy, and the tests' fault
 * server, which answers as a proxy too (absolute-URI requests) and
 * records what it was sent.
 *  - 8 processes (separate nodes: no cache shared but squid's) load a
 *    model through squid at once: every tensor byte-exact, and the
 *    origin sends the model's bytes about once (<= 1.1 x), not 8 times;
 *  - squid in front of a corrupted copy (the fault server as its parent,
 *    flipping one byte of one tensor): that tensor comes from the origin
 *    directly, verified, counted, named by sluice_tensor_source;
 *  - a proxy that refuses connections, one that answers 503: everything
 *    loads direct, counted;
 *  - Dragonfly mode: the headers dfdaemon reads, on a listener that
 *    records requests, an https:// origin asked as http:// (no CONNECT).
 * Every check compares with the bytes of the local file the origin
 * serves, read with pread. Skipped (77, with the reason) when nginx or
 * squid is not installed or does not start. */
#include "api/engine_hooks.h"
#include "mf_fixture.h"
#include "remote_fixture.h"
#include "util.h"

#include "sluice.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tool_run.h"

#define MIB (1u << 20)
#define NODES 8

static rf_server nginx;
static char *root;          /* served by nginx at / */
static char *bad_root;      /* the same files, for the fault server */
static char *model_path;    /* root/m.safetensors */
static uint64_t model_bytes; /* the model's file and its manifest */
static uint64_t manifest_bytes; /* its manifest, read directly (never through a proxy) */

static const char *const names[] = {"w.a", "w.b", "w.c", "w.d", "w.e", "w.f"};
static const uint64_t sizes[] = {3 * MIB + 5, 1000, 5 * MIB + 7, 64, 2 * MIB, 4 * MIB + 1};
#define NT 6

/* The flat manifest of the model at path, written to out. */
static void write_manifest(const char *path, const char *out)
{
    sluice_options o;
    sluice_options_init(&o);
    o.flags = SLUICE_F_HASH_ALL;
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    char text[4096];
    size_t len = (size_t)snprintf(text, sizeof text, "{");
    for (size_t i = 0; i < sluice_count(m); i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        uint8_t d[32];
        char hex[65];
        assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
        len += (size_t)snprintf(text + len, sizeof text - len, "%s\"%s\":\"%s\"", i ? "," : "",
                                sluice_tensor_info(t)->name, sluice_digest_hex(d, hex));
        sluice_release(t);
    }
    len += (size_t)snprintf(text + len, sizeof text - len, "}");
    tu_write_file(out, text, len);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static uint64_t file_size(const char *path)
{
    size_t len = 0;
    void *b = tu_read_file(path, &len);
    free(b);
    return len;
}

static int setup(void **state)
{
    char why[256];
    (void)state;
    rf_skip_without_curl();
    if (!rf_squid_binary()) {
        fprintf(stderr, "skipped: squid is not installed (apt-get install -y squid)\n");
        exit(77);
    }
    root = tu_tmpdir();
    chmod(root, 0755);
    model_path = tu_join(root, "m.safetensors");
    mf_write_model(model_path, NT, names, sizes);
    char *mf = tu_join(root, "m.safetensors.manifest.json");
    write_manifest(model_path, mf);
    model_bytes = file_size(model_path) + file_size(mf);
    manifest_bytes = file_size(mf);
    bad_root = tu_tmpdir();
    char *bm = tu_join(bad_root, "m.safetensors"), *bmf = tu_join(bad_root, "m.safetensors.manifest.json");
    tu_copy_file(model_path, bm);
    tu_copy_file(mf, bmf);
    free(bm);
    free(bmf);
    free(mf);
    if (!rf_nginx_start(&nginx, root, NULL, why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        exit(77);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rf_stop(&nginx);
    tu_rmtree(root);
    tu_rmtree(bad_root);
    free(root);
    free(bad_root);
    free(model_path);
    return 0;
}

/* ---------------------------------------------------------------- loading */

/* What one load saw. */
typedef struct outcome {
    int ok;
    char why[600];
    struct sluice_stats st;
    char source[NT][300];   /* sluice_tensor_source of each tensor */
} outcome;

/* Opens loc with o and acquires every tensor (after sluice_prefetch of
 * all when prefetch), comparing each with the local file's bytes. */
static void load_all(const char *loc, const sluice_options *o, int prefetch, outcome *out)
{
    memset(out, 0, sizeof *out);
    sluice_model *m = NULL;
    int rc = sluice_open(loc, o, &m);
    if (rc != SLUICE_OK) {
        snprintf(out->why, sizeof out->why, "open %s: %s: %s", loc, sluice_strerror(rc),
                 sluice_errmsg(m));
        sluice_close(m);
        return;
    }
    if (sluice_count(m) != NT || sluice_verify_state(m, NULL) != 0) {
        snprintf(out->why, sizeof out->why, "open %s: %zu tensors, verify state %d", loc,
                 sluice_count(m), sluice_verify_state(m, NULL));
        sluice_close(m);
        return;
    }
    if (prefetch)
        sluice_prefetch(m, names, NT);
    out->ok = 1;
    for (size_t i = 0; i < NT && out->ok; i++) {
        sluice_tensor *t = NULL;
        rc = sluice_acquire(m, names[i], &t);
        if (rc != SLUICE_OK) {
            snprintf(out->why, sizeof out->why, "acquire %s: %s: %s", names[i],
                     sluice_strerror(rc), sluice_errmsg(m));
            out->ok = 0;
            break;
        }
        const struct sluice_tensor_info *info = sluice_tensor_info(t);
        unsigned char *want = tu_pread_range(model_path, info->offset, (size_t)info->nbytes);
        if (sluice_tensor_size(t) != info->nbytes ||
            (info->nbytes && memcmp(sluice_tensor_data(t), want, (size_t)info->nbytes) != 0)) {
            snprintf(out->why, sizeof out->why, "tensor %s: not the origin's bytes", names[i]);
            out->ok = 0;
        }
        snprintf(out->source[i], sizeof out->source[i], "%s", sluice_tensor_source(t));
        free(want);
        sluice_release(t);
    }
    out->st.size = sizeof out->st;
    sluice_stats(m, &out->st);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

static void opts_with_proxy(sluice_options *o, const char *proxy)
{
    sluice_options_init(o);
    o->http_proxy = proxy;
    o->remote_attempts = 3;
    o->remote_backoff_ms = 20;
    o->remote_connect_timeout_ms = 2000;
    o->remote_stall_timeout_ms = 10000;
    o->pool_bytes = 64 * MIB;
}

static const char *model_url(void)
{
    static char url[128];
    snprintf(url, sizeof url, "%s/m.safetensors", nginx.base);
    return url;
}

/* Starts the fault server on dir, or skips the test. */
static void start_fault_on(rf_server *fault, const char *dir)
{
    char why[256];
    if (!rf_fault_start(fault, SLUICE_FAULT_SERVER, dir, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
}

/* Starts the fault server on bad_root, or skips the test. */
static void start_fault(rf_server *fault)
{
    start_fault_on(fault, bad_root);
}

/* Skips the test when nginx serves no https (no certificate). */
static void need_tls(void)
{
    if (!nginx.tls_port) {
        print_message("skipped: no certificate for nginx's https (openssl)\n");
        skip();
    }
}

/* The fault server's log (malloc'd); the server stopped. */
static char *log_and_stop(rf_server *sv)
{
    char *log = rf_get(sv, "/ctl/log");
    rf_stop(sv);
    return log;
}

/* One load through the fault server as the proxy: started on dir (or
 * the test skips), armed with ctl (none when NULL), then url (NULL: the
 * model at nginx) loaded by load_all with o (opts_with_proxy's when NULL),
 * its http_proxy the fault server. Returns what the server logged
 * (malloc'd), the server stopped. */
static char *load_via_fault(const char *dir, const char *ctl, sluice_options *o, const char *url,
                            int prefetch, outcome *out)
{
    rf_server fault;
    sluice_options plain;
    start_fault_on(&fault, dir);
    if (ctl)
        free(rf_get(&fault, ctl));
    if (!o)
        opts_with_proxy(o = &plain, NULL);
    o->http_proxy = fault.base;
    load_all(url ? url : model_url(), o, prefetch, out);
    o->http_proxy = NULL;
    return log_and_stop(&fault);
}

/* A scratch folder holding a copy of the model (its path in *copy) whose
 * byte `back` bytes before the end is flipped: a proxy's corrupted copy. */
static char *liar_copy(uint64_t back, char **copy)
{
    char *liar = tu_tmpdir();
    *copy = tu_join(liar, "m.safetensors");
    tu_copy_file(model_path, *copy);
    mf_flip_byte(*copy, file_size(*copy) - back);
    return liar;
}

/* Every byte of the load came direct, past the proxy (the manifest, read
 * direct, aside). */
static void expect_every_byte_bypassed(const outcome *out)
{
    assert_int_equal(out->st.proxy_bypass_bytes,
                     out->st.remote_bytes + out->st.remote_open_bytes - manifest_bytes);
}

static void expect_ok(const outcome *out)
{
    if (!out->ok)
        fail_msg("%s", out->why);
}

/* Arms the fault server to flip the middle byte of tensor names[i] once
 * (in whatever reply holds it). */
static void flip_middle(const rf_server *fault, size_t i)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m;
    assert_int_equal(sluice_open(model_path, &o, &m), SLUICE_OK);
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, names[i], &t), SLUICE_OK);
    uint64_t off = sluice_tensor_info(t)->offset + sizes[i] / 2;
    sluice_release(t);
    sluice_close(m);
    char ctl[128];
    snprintf(ctl, sizeof ctl, "/ctl?mode=flipat&count=1&arg=%llu", (unsigned long long)off);
    free(rf_get(fault, ctl));
}

/* ---------------------------------------------------------------- squid */

/* 8 processes, one node each, load the model through squid at once:
 * every tensor is the origin's, no proxy failure, and the origin sends
 * the model's bytes about once. */
static void test_squid_eight_nodes(void **state)
{
    (void)state;
    char why[256];
    rf_server squid;
    if (!rf_squid_start(&squid, 0, why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    uint64_t before = rf_bytes_sent(&nginx);
    int fds[NODES];
    pid_t pids[NODES];
    int go[2];
    assert_int_equal(pipe(go), 0);
    for (int k = 0; k < NODES; k++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pids[k] = fork();
        assert_true(pids[k] >= 0);
        if (pids[k] == 0) {
            alarm(120);     /* a stuck node fails the test, never hangs it */
            close(p[0]);
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) < 0)
                _exit(3);
            sluice_options o;
            opts_with_proxy(&o, squid.base);
            char *cache = tu_tmpdir();  /* the node's own persistent cache */
            o.cache_dir = cache;
            outcome out;
            load_all(model_url(), &o, 1, &out);
            if (out.ok && out.st.disk_stored != NT) {
                snprintf(out.why, sizeof out.why, "%llu blobs stored in the node's cache",
                         (unsigned long long)out.st.disk_stored);
                out.ok = 0;
            }
            tu_rmtree(cache);
            ssize_t w = write(p[1], &out, sizeof out);
            _exit(w == (ssize_t)sizeof out ? 0 : 2);
        }
        close(p[1]);
        fds[k] = p[0];
    }
    close(go[0]);
    close(go[1]);   /* every node starts now */
    int failed = 0;
    uint64_t proxy_failures = 0;
    for (int k = 0; k < NODES; k++) {
        outcome out;
        size_t got = 0;
        while (got < sizeof out) {
            ssize_t r = read(fds[k], (char *)&out + got, sizeof out - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        close(fds[k]);
        int st = 0;
        waitpid(pids[k], &st, 0);
        if (got != sizeof out || !out.ok) {
            print_error("node %d: %s (exit status %d)\n", k,
                        got == sizeof out ? out.why : "no result", st);
            failed++;
            continue;
        }
        proxy_failures += out.st.proxy_failures;
    }
    uint64_t sent = rf_bytes_sent(&nginx) - before;
    print_message("8 nodes through squid: the origin sent %llu bytes for a model of %llu "
                  "(%.2f x)\n", (unsigned long long)sent, (unsigned long long)model_bytes,
                  (double)sent / (double)model_bytes);
    rf_stop(&squid);
    assert_int_equal(failed, 0);
    assert_int_equal(proxy_failures, 0);
    assert_true(sent * 10 <= model_bytes * 11);
}

/* squid in front of a corrupted copy (its parent, the fault server,
 * flips one byte of w.c): w.c is read again from the origin directly,
 * verified; the others come from squid; all counted. */
static void test_squid_corrupt_copy(void **state)
{
    (void)state;
    char why[256];
    rf_server fault, squid;
    start_fault(&fault);
    if (!rf_squid_start(&squid, fault.port, why, sizeof why)) {
        rf_stop(&fault);
        print_message("skipped: %s\n", why);
        skip();
    }
    flip_middle(&fault, 2);
    sluice_options o;
    opts_with_proxy(&o, squid.base);
    outcome out;
    load_all(model_url(), &o, 0, &out);
    char *stats = rf_get(&fault, "/ctl/stats");
    rf_stop(&squid);
    rf_stop(&fault);
    expect_ok(&out);
    assert_non_null(strstr(stats, "faults=1"));
    free(stats);
    assert_int_equal(out.st.proxy_failures, 1);
    assert_int_equal(out.st.proxy_bypass_bytes, sizes[2]);
    assert_int_equal(out.st.checksum_failures, 1);
    assert_int_equal(out.st.failures, 0);
    for (size_t i = 0; i < NT; i++) {
        if (i == 2) {
            assert_non_null(strstr(out.source[i], "primary, direct: the proxy failed"));
            assert_non_null(strstr(out.source[i], "failed verification"));
        } else {
            assert_string_equal(out.source[i], "");
        }
    }
}

/* A proxy that rewrites ETags and flips one byte of w.c (the fault
 * server, its own ETag on every reply), a correct origin (nginx, whose
 * strong ETags differ): w.c is read again from the origin directly, and
 * that request carries no If-Match of the proxy's (the origin's own
 * validator, learned from its first direct reply, is the direct hop's);
 * the load succeeds, counted as one proxy failure and w.c's bypass bytes.
 * Before, the proxy's ETag went to nginx as If-Match, which answered 412
 * and w.c failed with SLUICE_E_FILE_CHANGED ("the object changed after
 * open"). Then the proxy answers 503 to everything, so that every read is
 * direct: reads after the first direct one carry the origin's ETag and
 * load; the object replaced at the origin after open (same size, another
 * ETag) still fails with SLUICE_E_FILE_CHANGED. */
static void test_proxy_rewrites_etag(void **state)
{
    (void)state;
    rf_server fault;
    start_fault(&fault);
    free(rf_get(&fault, "/ctl/etag?value=%22rewritten-by-the-proxy%22"));
    flip_middle(&fault, 2);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    outcome out;
    char *before = rf_log(&nginx);
    load_all(model_url(), &o, 0, &out);
    char *after = rf_log(&nginx);
    expect_ok(&out);
    /* nginx answered no 412 since the load began */
    assert_non_null(before);
    assert_non_null(after);
    if (strstr(after + strlen(before), "412 "))
        fail_msg("the origin was asked If-Match the proxy's ETag:\n%s", after + strlen(before));
    free(before);
    free(after);
    assert_int_equal(out.st.proxy_failures, 1);
    assert_int_equal(out.st.proxy_bypass_bytes, sizes[2]);
    assert_int_equal(out.st.checksum_failures, 1);
    assert_int_equal(out.st.failures, 0);
    assert_non_null(strstr(out.source[2], "primary, direct: the proxy failed"));

    /* every request direct (after the proxy's 503): the origin's ETag */
    free(rf_get(&fault, "/ctl?mode=status&count=1000000&arg=503"));
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model_url(), &o, &m), SLUICE_OK);
    for (size_t i = 0; i < 2; i++) {
        sluice_tensor *t = NULL;
        int rc = sluice_acquire(m, names[i], &t);
        if (rc != SLUICE_OK)
            fail_msg("acquire %s, every request direct: %s", names[i], sluice_errmsg(m));
        sluice_release(t);
    }
    /* the origin's object replaced after open: same size, another ETag
     * (nginx's is its mtime and size) */
    char *copy = tu_join(root, "m.safetensors.new");
    tu_copy_file(model_path, copy);
    struct timespec later[2] = {{.tv_sec = time(NULL) + 100}, {.tv_sec = time(NULL) + 100}};
    assert_int_equal(utimensat(AT_FDCWD, copy, later, 0), 0);
    assert_int_equal(rename(copy, model_path), 0);
    free(copy);
    /* (read_into: read now, whatever the loads read ahead) */
    unsigned char buf[64];
    assert_int_equal(sluice_read_into(m, "w.f", 0, buf, sizeof buf), SLUICE_E_FILE_CHANGED);
    assert_non_null(strstr(sluice_errmsg(m), "412"));
    sluice_close(m);
    rf_stop(&fault);
}

/* A proxy that refuses connections: the first request (the open's probe)
 * goes direct at once, counted, and the proxy is taken for down: every
 * later request goes direct without trying it; every byte fetched is a
 * bypass byte, every tensor names why. */
static void test_proxy_refused(void **state)
{
    (void)state;
    char proxy[64];
    snprintf(proxy, sizeof proxy, "http://127.0.0.1:%u", rf_free_port());
    sluice_options o;
    opts_with_proxy(&o, proxy);
    outcome out;
    load_all(model_url(), &o, 1, &out);
    expect_ok(&out);
    assert_int_equal(out.st.proxy_failures, 1);
    expect_every_byte_bypassed(&out);
    assert_true(out.st.remote_bytes >= model_bytes - 4096);
    assert_int_equal(out.st.failures, 0);
    for (size_t i = 0; i < NT; i++)
        assert_non_null(strstr(out.source[i], "primary, direct: the proxy failed (skipped: it "
                                              "could not be reached"));
}

/* A proxy that accepts and never answers (a stall, 0.5 s): the same, one
 * failure, so the load does not wait 0.5 s a request. */
static void test_proxy_hangs(void **state)
{
    (void)state;
    sluice_options o;
    opts_with_proxy(&o, NULL);
    o.remote_stall_timeout_ms = 500;
    outcome out;
    free(load_via_fault(bad_root, "/ctl?mode=hang&count=100000&arg=30", &o, NULL, 1, &out));
    expect_ok(&out);
    assert_int_equal(out.st.proxy_failures, 1);
    expect_every_byte_bypassed(&out);
    assert_int_equal(out.st.failures, 0);
}

/* A proxy that answers 503 to everything: each request goes direct at
 * its first failure, no retry spent on it; a 5xx does not take the proxy
 * for down (it may be the one object's), so each request is counted. */
static void test_proxy_5xx(void **state)
{
    (void)state;
    outcome out;
    free(load_via_fault(bad_root, "/ctl?mode=status&count=100000&arg=503", NULL, NULL, 0, &out));
    expect_ok(&out);
    /* every request but the manifest's, which goes direct */
    assert_true(out.st.proxy_failures >= out.st.remote_reads + out.st.remote_open_requests - 1);
    expect_every_byte_bypassed(&out);
    assert_int_equal(out.st.remote_retries, 0);
}

/* opts.http_proxy wins over the environment; "" turns proxies off;
 * no_proxy names hosts reached directly. */
static void test_proxy_environment(void **state)
{
    (void)state;
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%u", rf_free_port());
    setenv("http_proxy", dead, 1);
    sluice_options o;
    outcome out;
    /* from the environment: the dead proxy fails, all goes direct */
    opts_with_proxy(&o, NULL);
    load_all(model_url(), &o, 0, &out);
    assert_true(out.ok);
    assert_true(out.st.proxy_failures > 0);
    /* "" wins over it: no proxy at all */
    opts_with_proxy(&o, "");
    load_all(model_url(), &o, 0, &out);
    assert_true(out.ok);
    assert_int_equal(out.st.proxy_failures, 0);
    /* no_proxy names the host: direct, no failure */
    setenv("no_proxy", "localhost, 127.0.0.1", 1);
    opts_with_proxy(&o, NULL);
    load_all(model_url(), &o, 0, &out);
    assert_true(out.ok);
    assert_int_equal(out.st.proxy_failures, 0);
    assert_int_equal(out.st.proxy_bypass_bytes, 0);
    unsetenv("no_proxy");
    unsetenv("http_proxy");
}

/* no_proxy applies to the redirects a request follows: the proxy (the
 * fault server) answers a read of the origin (127.0.0.1, not in no_proxy)
 * with a 302 to the same nginx named "localhost", which no_proxy names:
 * that request goes to nginx directly, never through the proxy, and the
 * bytes are the origin's (before: the proxy got "GET http://localhost:..."
 * too, libcurl told no no_proxy of any kind). */
static void test_no_proxy_redirect_target(void **state)
{
    (void)state;
    rf_server fault;
    start_fault(&fault);
    setenv("no_proxy", "localhost", 1);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    sluice_model *m = NULL;
    int rc = sluice_open(model_url(), &o, &m);
    unsetenv("no_proxy");
    assert_int_equal(rc, SLUICE_OK);
    char ctl[256];
    snprintf(ctl, sizeof ctl, "/ctl?mode=redirect&count=1&arg=http://localhost:%u/m.safetensors",
             nginx.port);
    free(rf_get(&fault, "/ctl/clear"));
    free(rf_get(&fault, ctl));
    unsigned char got[1000];
    rc = sluice_read_into(m, "w.b", 0, got, sizeof got);
    char *log = log_and_stop(&fault);
    if (rc != SLUICE_OK)
        fail_msg("read_into: %s", sluice_errmsg(m));
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire(m, "w.b", &t), SLUICE_OK);
    assert_memory_equal(got, sluice_tensor_data(t), sizeof got);
    sluice_release(t);
    sluice_close(m);
    assert_non_null(strstr(log, "GET http://127.0.0.1:"));
    if (strstr(log, "GET http://localhost:"))
        fail_msg("the redirect to a no_proxy host went through the proxy:\n%s", log);
    free(log);
}

/* ---------------------------------------------------------------- Dragonfly */

/* Dragonfly mode, an https:// origin with a presigned-looking query, the
 * fault server standing for dfdaemon: every request reaches it as a plain
 * absolute-URI GET of the http:// form (never CONNECT), with
 * X-Dragonfly-Use-P2P, the filtered query params, and priority 6 for the
 * open's requests and an acquire's, 3 for read-ahead. */
static void test_dragonfly_headers(void **state)
{
    (void)state;
    need_tls();
    rf_server df;
    start_fault_on(&df, root);
    char url[256];
    snprintf(url, sizeof url, "%s/m.safetensors?X-Amz-Signature=abc&X-Amz-Date=1",
             nginx.tls_base);
    sluice_options o;
    opts_with_proxy(&o, df.base);
    o.proxy_kind = SLUICE_PROXY_DRAGONFLY;
    o.remote_ca_file = nginx.ca_file;
    /* a presigned URL's query is its object's alone (sluice.h): its
     * manifest is asked by its own location */
    char mf[256];
    snprintf(mf, sizeof mf, "%s/m.safetensors.manifest.json", nginx.tls_base);
    o.manifest_path = mf;
    sluice_model *m = NULL;
    int rc = sluice_open(url, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    char *log = rf_get(&df, "/ctl/log");
    free(rf_get(&df, "/ctl/clear"));
    char plain[128];
    snprintf(plain, sizeof plain, "GET http://127.0.0.1:%u/m.safetensors", nginx.tls_port);
    assert_non_null(strstr(log, plain));
    assert_null(strstr(log, "GET https://"));
    assert_non_null(strstr(log, "X-Dragonfly-Use-P2P: true"));
    assert_non_null(strstr(log, "X-Dragonfly-Priority: 6"));
    assert_null(strstr(log, "X-Dragonfly-Priority: 3"));
    assert_non_null(strstr(log, "X-Dragonfly-Filtered-Query-Params: X-Amz-Algorithm,"));
    assert_non_null(strstr(log, ",X-Amz-Signature,"));
    free(log);
    /* read-ahead: priority 3, and nothing else */
    assert_int_equal(sluice_prefetch(m, &names[2], 1), SLUICE_OK);
    struct sluice_stats st = {.size = sizeof st};
    for (int i = 0; i < 1000; i++) {
        sluice_stats(m, &st);
        if (st.tensors_loaded >= 1)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st.tensors_loaded, 1);
    log = rf_get(&df, "/ctl/log");
    free(rf_get(&df, "/ctl/clear"));
    assert_non_null(strstr(log, "X-Dragonfly-Priority: 3"));
    assert_null(strstr(log, "X-Dragonfly-Priority: 6"));
    free(log);
    /* a blocking acquire: priority 6 */
    sluice_tensor *t;
    assert_int_equal(sluice_acquire(m, names[0], &t), SLUICE_OK);
    sluice_release(t);
    log = rf_get(&df, "/ctl/log");
    assert_non_null(strstr(log, "X-Dragonfly-Priority: 6"));
    assert_null(strstr(log, "X-Dragonfly-Priority: 3"));
    free(log);
    st.size = sizeof st;
    sluice_stats(m, &st);
    assert_int_equal(st.proxy_failures, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    rf_stop(&df);
}

/* A plain proxy is not sent Dragonfly's headers. */
static void test_plain_no_dragonfly_headers(void **state)
{
    (void)state;
    outcome out;
    char *log = load_via_fault(root, NULL, NULL, NULL, 0, &out);
    assert_true(out.ok);
    assert_int_equal(out.st.proxy_failures, 0);
    char abs[128];
    snprintf(abs, sizeof abs, "GET %s/m.safetensors", nginx.base);
    assert_non_null(strstr(log, abs));
    assert_null(strstr(log, "X-Dragonfly"));
    free(log);
}

/* A mirror's requests go through the proxy too: a local copy with a
 * flipped byte in w.b, nginx as its mirror, the fault server as the proxy
 * (recording); then a dead proxy: the mirror is read direct, counted. */
static void test_mirror_through_proxy(void **state)
{
    (void)state;
    rf_server px;
    start_fault_on(&px, root);
    char *dir = tu_tmpdir();
    char *local = tu_join(dir, "m.safetensors"), *lmf = tu_join(dir, "m.safetensors.manifest.json");
    char *mf = tu_join(root, "m.safetensors.manifest.json");
    tu_copy_file(model_path, local);
    tu_copy_file(mf, lmf);
    mf_flip_byte(local, file_size(local) - sizes[5] - sizes[4] - sizes[3] - sizes[2] - 10);
    const char *mirrors[] = {model_url()};
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%u", rf_free_port());
    const char *proxies[] = {px.base, dead};
    for (int k = 0; k < 2; k++) {
        sluice_options o;
        opts_with_proxy(&o, proxies[k]);
        o.fallback = mirrors;
        o.fallback_count = 1;
        sluice_model *m = NULL;
        assert_int_equal(sluice_open(local, &o, &m), SLUICE_OK);
        sluice_tensor *t;
        int rc = sluice_acquire(m, "w.b", &t);
        if (rc != SLUICE_OK)
            fail_msg("acquire w.b: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
        const struct sluice_tensor_info *info = sluice_tensor_info(t);
        unsigned char *want = tu_pread_range(model_path, info->offset, (size_t)info->nbytes);
        assert_memory_equal(sluice_tensor_data(t), want, (size_t)info->nbytes);
        free(want);
        assert_non_null(strstr(sluice_tensor_source(t), "fallback 1"));
        sluice_release(t);
        struct sluice_stats st = {.size = sizeof st};
        sluice_stats(m, &st);
        assert_int_equal(st.fallback_tensors, 1);
        if (k == 0)
            assert_int_equal(st.proxy_failures, 0);
        else
            assert_true(st.proxy_failures > 0 && st.proxy_bypass_bytes >= info->nbytes);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    char *log = log_and_stop(&px);
    char abs[128];
    snprintf(abs, sizeof abs, "GET %s/m.safetensors", nginx.base);
    assert_non_null(strstr(log, abs));
    free(log);
    tu_rmtree(dir);
    free(dir);
    free(local);
    free(lmf);
    free(mf);
}

/* The command: --proxy (a dead one: every tensor direct, counted in the
 * metrics `sluice stats` prints), --proxy-kind dragonfly, and a kind it
 * does not know (usage error, 2). */
static void test_command_proxy(void **state)
{
    (void)state;
    if (access(tool, X_OK) != 0) {
        print_message("skipped: %s not built\n", tool);
        skip();
    }
    char proxy[64];
    snprintf(proxy, sizeof proxy, "http://127.0.0.1:%u", rf_free_port());
    char *dir = tu_tmpdir();
    run_result r = run(dir, "stats", model_url(), "--proxy", proxy, NULL);
    expect_status(&r, 0, "sluice stats --proxy DEAD");
    const char *line = strstr(r.out, "\nsluice_proxy_failures_total{");
    assert_non_null(line);
    const char *end = strchr(line, '}');
    assert_non_null(end);
    assert_true(strtoull(end + 1, NULL, 10) > 0);
    run_free(&r);
    r = run(dir, "stats", model_url(), "--proxy", proxy, "--proxy-kind", "dragonfly", NULL);
    expect_status(&r, 0, "sluice stats --proxy DEAD --proxy-kind dragonfly");
    run_free(&r);
    r = run(dir, "stats", model_url(), "--proxy-kind", "squid", NULL);
    expect_status(&r, 2, "sluice stats --proxy-kind squid");
    assert_non_null(strstr(r.err, "not plain or dragonfly"));
    run_free(&r);
    tu_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- review */

/* A proxy that answers 404 for the manifest sidecar (the fault server on a
 * copy of the model with one byte of w.c flipped and no manifest): the
 * origin has the manifest, so the load is verified against it and every
 * tensor is the origin's. A 404 from the proxy is asked of the origin
 * directly: else the proxy alone decides that the model has no manifest,
 * and its bytes are delivered unverified. */
static void test_proxy_404_manifest(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] + sizes[3] + sizes[2] / 2, &lm);   /* in w.c */
    outcome out;
    free(load_via_fault(liar, NULL, NULL, NULL, 0, &out));
    tu_rmtree(liar);
    free(lm);
    free(liar);
    expect_ok(&out);
    assert_int_equal(out.st.failures, 0);
    assert_true(out.st.proxy_failures >= 1);
}

/* no_proxy is sluice's decision alone, read as libcurl reads it: an
 * address range (127.0.0.0/8) names the https:// origin, so a Dragonfly
 * load goes to it directly over TLS, the daemon never asked. Before,
 * sluice did not know CIDR and rewrote the URL to http:// for the daemon,
 * while libcurl, reading no_proxy itself, sent that http:// request (with
 * its token) to the origin directly, in clear: a 400 from its TLS port,
 * counted as the proxy's failure. */
static void test_no_proxy_range_dragonfly(void **state)
{
    (void)state;
    need_tls();
    setenv("no_proxy", "10.1.2.3, 127.0.0.0/8", 1);
    char url[256];
    snprintf(url, sizeof url, "%s/m.safetensors", nginx.tls_base);
    sluice_options o;
    opts_with_proxy(&o, NULL);
    o.proxy_kind = SLUICE_PROXY_DRAGONFLY;
    o.remote_ca_file = nginx.ca_file;
    o.http_token = "secret-token";
    outcome out;
    char *log = load_via_fault(root, NULL, &o, url, 0, &out);
    unsetenv("no_proxy");
    expect_ok(&out);
    assert_int_equal(out.st.proxy_failures, 0);
    assert_int_equal(out.st.proxy_bypass_bytes, 0);
    assert_string_equal(log, "");
    free(log);
}

/* Dragonfly's hop is in clear: credentials for an https:// or s3://
 * origin (a Bearer token, AWS keys) are refused at open when the daemon is
 * not on this host's loopback (a daemon at 192.0.2.1, TEST-NET: nothing is
 * ever sent there); a daemon on loopback, or no credentials, is taken
 * (test_no_proxy_range_dragonfly and test_dragonfly_headers load that
 * way). */
static void test_dragonfly_credentials_off_host_refused(void **state)
{
    (void)state;
    sluice_options o;
    opts_with_proxy(&o, "http://192.0.2.1:4001");
    o.proxy_kind = SLUICE_PROXY_DRAGONFLY;
    o.http_token = "secret-token";
    sluice_model *m = NULL;
    assert_int_equal(sluice_open("https://models.example.com/m.safetensors", &o, &m),
                     SLUICE_E_INVAL);
    assert_non_null(m);
    assert_non_null(strstr(sluice_errmsg(m), "loopback"));
    assert_non_null(strstr(sluice_errmsg(m), "192.0.2.1"));
    assert_null(strstr(sluice_errmsg(m), "secret-token"));
    sluice_close(m);
    o.http_token = NULL;
    setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI", 1);
    m = NULL;
    assert_int_equal(sluice_open("s3://bucket/m.safetensors", &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "AWS keys"));
    assert_null(strstr(sluice_errmsg(m), "wJalrXUtnFEMI"));
    sluice_close(m);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
}

/* Dragonfly mode never tunnels, a redirect included: the daemon relays a
 * 302 to an https:// location (as the Hub's resolve redirects to its
 * CDN); libcurl, following it through the daemon, would open a CONNECT
 * tunnel. It is not followed through the daemon: the request goes to the
 * origin directly (counted), and the daemon is not taken for down. */
static void test_dragonfly_redirect_no_connect(void **state)
{
    (void)state;
    char ctl[256];
    snprintf(ctl, sizeof ctl, "/ctl?mode=redirect&count=100000&arg=https://127.0.0.1:%u/m.safetensors",
             rf_free_port());
    sluice_options o;
    opts_with_proxy(&o, NULL);
    o.proxy_kind = SLUICE_PROXY_DRAGONFLY;
    outcome out;
    char *log = load_via_fault(root, ctl, &o, NULL, 0, &out);
    int connect = strstr(log, "CONNECT ") != NULL;
    free(log);
    expect_ok(&out);
    assert_false(connect);
    /* every request but the manifest's, which goes direct */
    assert_true(out.st.proxy_failures >= out.st.remote_reads + out.st.remote_open_requests - 1);
    assert_int_equal(out.st.failures, 0);
}

/* The proxy's user:password@ is libcurl's as a user name and password
 * apart (CURLOPT_PROXYUSERNAME, CURLOPT_PROXYPASSWORD), percent-decoded,
 * never in the URL it names in its errors: "Unsupported proxy scheme for
 * 'ftp://alice:s3cret@...'" reached sluice_tensor_source once the 30 s
 * for which the proxy was taken for down had passed (this test waits
 * them). The proxy still gets the credentials (Proxy-Authorization). */
/* The proxy's credentials go to the proxy only: a proxy named with
 * user:password@ that answers 503 to everything, an origin that records
 * what it is sent (a second fault server): every request goes direct at
 * once, and none that reached the origin carries Proxy-Authorization or
 * the credentials; the proxy got them. */
static void test_proxy_credentials_stay_with_the_proxy(void **state)
{
    (void)state;
    char why[256], proxy[128], url[128];
    rf_server px, origin;
    start_fault(&px);
    if (!rf_fault_start(&origin, SLUICE_FAULT_SERVER, root, why, sizeof why)) {
        rf_stop(&px);
        print_message("skipped: %s\n", why);
        skip();
    }
    free(rf_get(&px, "/ctl?mode=status&count=1000000&arg=503"));
    snprintf(proxy, sizeof proxy, "http://al%%40ice:p%%3As@127.0.0.1:%u", px.port);
    snprintf(url, sizeof url, "%s/m.safetensors", origin.base);
    sluice_options o;
    opts_with_proxy(&o, proxy);
    outcome out;
    load_all(url, &o, 0, &out);
    char *at_proxy = rf_get(&px, "/ctl/log"), *at_origin = rf_get(&origin, "/ctl/log");
    rf_stop(&px);
    rf_stop(&origin);
    expect_ok(&out);
    assert_true(out.st.proxy_failures >= 3);
    assert_non_null(strstr(at_proxy, "Proxy-Authorization: Basic YWxAaWNlOnA6cw=="));
    assert_non_null(strstr(at_origin, "GET /m.safetensors"));
    if (strcasestr(at_origin, "Proxy-Authorization") || strcasestr(at_origin, "Authorization") ||
        strstr(at_origin, "YWxAaWNlOnA6cw"))
        fail_msg("the origin got the proxy's credentials:\n%s", at_origin);
    free(at_proxy);
    free(at_origin);
}

static void test_proxy_credentials_hidden(void **state)
{
    (void)state;
    rf_server px;
    start_fault_on(&px, root);
    char proxy[128];
    snprintf(proxy, sizeof proxy, "http://al%%40ice:p%%3As@127.0.0.1:%u", px.port);
    sluice_options o;
    opts_with_proxy(&o, proxy);
    outcome out;
    load_all(model_url(), &o, 0, &out);
    char *log = log_and_stop(&px);
    expect_ok(&out);
    assert_int_equal(out.st.proxy_failures, 0);
    /* base64("al@ice:p:s") */
    assert_non_null(strstr(log, "Proxy-Authorization: Basic YWxAaWNlOnA6cw=="));
    free(log);
    opts_with_proxy(&o, "ftp://alice:s3cret@127.0.0.1:1");
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model_url(), &o, &m), SLUICE_OK);
    sleep(31);  /* the proxy is tried again */
    for (size_t i = 0; i < NT; i++) {
        sluice_tensor *t;
        assert_int_equal(sluice_acquire(m, names[i], &t), SLUICE_OK);
        const char *src = sluice_tensor_source(t);
        if (strstr(src, "s3cret") || strstr(src, "alice"))
            fail_msg("tensor %s: source \"%s\"", names[i], src);
        assert_non_null(strstr(src, "primary, direct: the proxy failed"));
        sluice_release(t);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* A proxy that serves a manifest of its own, written for the bytes it
 * flips (the fault server on a copy of the model with one byte of w.c
 * flipped and that copy's manifest): the manifest is what the bytes are
 * checked against, so it is read from the origin directly, never through
 * the proxy; w.c is the origin's (read again directly), every tensor
 * verified. Before, the proxy's manifest was taken and its flipped w.c
 * delivered, "verified". */
static void test_proxy_own_manifest(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] + sizes[3] + sizes[2] / 2, &lm);   /* in w.c */
    char *lmf = tu_join(liar, "m.safetensors.manifest.json");
    write_manifest(lm, lmf);
    outcome out;
    char *log = load_via_fault(liar, NULL, NULL, NULL, 0, &out);
    tu_rmtree(liar);
    free(lm);
    free(lmf);
    free(liar);
    expect_ok(&out);
    assert_null(strstr(log, "manifest.json"));
    assert_non_null(strstr(log, "GET http://"));    /* the tensors through it */
    free(log);
    assert_int_equal(out.st.failures, 0);
    assert_int_equal(out.st.checksum_failures, 1);
    assert_int_equal(out.st.proxy_failures, 1);
}

/* A tensor-parallel part through a proxy that flips its bytes (the fault
 * server on a copy of the model with one byte of w.e's rank 0 flipped):
 * the part is read again from the origin directly, as a load is, not
 * failed with SLUICE_E_CHECKSUM (sluice.h "Proxies": a tensor the origin
 * serves right never fails because of its proxy); sluice_read_into too. */
static void test_part_through_lying_proxy(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] - 100, &lm);   /* in w.e, rank 0 of 2 */
    size_t flen = (size_t)file_size(lm);
    rf_server fault;
    start_fault_on(&fault, liar);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model_url(), &o, &m), SLUICE_OK);
    assert_int_equal(sluice_verify_state(m, NULL), 0);
    size_t half = (size_t)sizes[4] / 2;
    unsigned char *want = tu_pread_range(model_path, flen - sizes[5] - sizes[4], half);
    unsigned char *got = malloc(half);
    int rc = sluice_read_part_into(m, "w.e", 0, 0, 2, got, half);
    if (rc != SLUICE_OK)
        fail_msg("read_part_into through the lying proxy: %s: %s", sluice_strerror(rc),
                 sluice_errmsg(m));
    assert_memory_equal(got, want, half);
    sluice_tensor *t = NULL;
    rc = sluice_acquire_part(m, "w.e", 0, 0, 2, &t);
    if (rc != SLUICE_OK)
        fail_msg("acquire_part through the lying proxy: %s: %s", sluice_strerror(rc),
                 sluice_errmsg(m));
    assert_memory_equal(sluice_tensor_data(t), want, half);
    sluice_release(t);
    memset(got, 0, half);
    rc = sluice_read_into(m, "w.e", 0, got, half);
    if (rc != SLUICE_OK)
        fail_msg("read_into through the lying proxy: %s: %s", sluice_strerror(rc),
                 sluice_errmsg(m));
    assert_memory_equal(got, want, half);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_true(st.proxy_failures >= 3);
    assert_true(st.proxy_bypass_bytes >= 3 * sizes[4]);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    rf_stop(&fault);
    free(want);
    free(got);
    tu_rmtree(liar);
    free(lm);
    free(liar);
}

/* sluice_verify with SLUICE_VF_FILES of a remote model through a proxy
 * that flips a byte of the file (the fault server on a copy with one byte
 * of w.b flipped; the manifest, local by manifest_path, lists the file's
 * SHA-256): the file is read again from the origin directly and passes,
 * as the tensors do, instead of failing as if the origin's file were
 * corrupt. */
static void test_verify_files_through_lying_proxy(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] + sizes[3] + sizes[2] + 10, &lm);   /* in w.b */
    size_t flen = 0;
    unsigned char *orig = tu_read_file(model_path, &flen);
    /* a version 1 manifest: the tensors' digests and the file's */
    char *mfdir = tu_tmpdir();
    char *mfp = tu_join(mfdir, "m.manifest.json");
    {
        sluice_options o;
        sluice_options_init(&o);
        o.flags = SLUICE_F_HASH_ALL;
        o.verify = SLUICE_VERIFY_OFF;
        sluice_model *m;
        assert_int_equal(sluice_open(model_path, &o, &m), SLUICE_OK);
        char text[8192], hex[65];
        uint8_t d[32];
        size_t len = (size_t)snprintf(text, sizeof text, "{\"format\": \"sluice-manifest\", "
                                      "\"version\": 1, \"algorithm\": \"sha256\", \"tensors\": {");
        for (size_t i = 0; i < sluice_count(m); i++) {
            sluice_tensor *t;
            assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
            assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
            len += (size_t)snprintf(text + len, sizeof text - len, "%s\"%s\": {\"sha256\": \"%s\"}",
                                    i ? ", " : "", sluice_tensor_info(t)->name,
                                    sluice_digest_hex(d, hex));
            sluice_release(t);
        }
        mf_sha256(orig, flen, d);
        len += (size_t)snprintf(text + len, sizeof text - len, "}, \"files\": {\"m.safetensors\": "
                                "{\"sha256\": \"%s\", \"size\": %zu}}}", sluice_digest_hex(d, hex),
                                flen);
        tu_write_file(mfp, text, len);
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    rf_server fault;
    start_fault_on(&fault, liar);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    o.manifest_path = mfp;
    sluice_model *m = NULL;
    int rc = sluice_open(model_url(), &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    sluice_verify_options vo;
    sluice_verify_options_init(&vo);
    vo.flags = SLUICE_VF_FILES | SLUICE_VF_NO_TENSORS;
    struct sluice_verify_report rep = {.size = sizeof rep};
    rc = sluice_verify(m, NULL, 0, &vo, &rep);
    char *log = log_and_stop(&fault);
    if (rc != SLUICE_OK)
        fail_msg("verify --files through the lying proxy: %s: %s", sluice_strerror(rc),
                 sluice_errmsg(m));
    assert_non_null(strstr(log, "GET http://"));    /* the file was read through it */
    free(log);
    assert_int_equal(rep.files_ok, 1);
    assert_int_equal(rep.files_failed, 0);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(st.proxy_failures, 1);
    assert_true(st.proxy_bypass_bytes >= flen);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    free(orig);
    tu_rmtree(liar);
    tu_rmtree(mfdir);
    free(lm);
    free(liar);
    free(mfp);
    free(mfdir);
}

/* sluice_verify of a remote model's tensors through a proxy that flips a
 * byte of w.e: the tensor is read again from the origin directly, once,
 * and passes (counted as a load's: one proxy failure, w.e's bytes). */
static void test_verify_tensors_through_lying_proxy(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] - 100, &lm);   /* in w.e */
    rf_server fault;
    start_fault_on(&fault, liar);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    sluice_model *m = NULL;
    int rc = sluice_open(model_url(), &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    struct sluice_verify_report rep = {.size = sizeof rep};
    rc = sluice_verify(m, NULL, 0, NULL, &rep);
    char *log = log_and_stop(&fault);
    if (rc != SLUICE_OK)
        fail_msg("verify through the lying proxy: %s: %s", sluice_strerror(rc),
                 sluice_errmsg(m));
    assert_non_null(strstr(log, "GET http://"));    /* the tensors were read through it */
    free(log);
    assert_int_equal(rep.tensors_ok, NT);
    assert_int_equal(rep.tensors_failed, 0);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(st.proxy_failures, 1);
    assert_int_equal(st.proxy_bypass_bytes, sizes[4]);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    tu_rmtree(liar);
    free(lm);
    free(liar);
}

/* The Hub's token ($HF_TOKEN) goes to the Hub only: a model that is not
 * on the Hub (nor any of its mirrors) sends it nowhere, so it does not
 * make Dragonfly mode refuse a daemon off this host's loopback (before,
 * any HF_TOKEN in the environment did: 'these would carry credentials (a
 * Bearer token)'); an hf:// model with it still is refused. */
static void test_dragonfly_hub_token_only_for_the_hub(void **state)
{
    (void)state;
    setenv("HF_TOKEN", "hub-secret", 1);
    sluice_options o;
    opts_with_proxy(&o, "http://192.0.2.1:4001");
    o.proxy_kind = SLUICE_PROXY_DRAGONFLY;
    o.remote_connect_timeout_ms = 300;
    sluice_model *m = NULL;
    int rc = sluice_open(model_url(), &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open with HF_TOKEN set, a model not on the Hub: %s", sluice_errmsg(m));
    sluice_close(m);
    m = NULL;
    assert_int_equal(sluice_open("hf://org/name", &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "loopback"));
    assert_null(strstr(sluice_errmsg(m), "hub-secret"));
    sluice_close(m);
    const char *mirrors[] = {"hf://org/name"};
    o.fallback = mirrors;
    o.fallback_count = 1;
    m = NULL;
    assert_int_equal(sluice_open(model_url(), &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "loopback"));
    sluice_close(m);
    unsetenv("HF_TOKEN");
}

/* The proxy counters now (stats of m). */
static struct sluice_stats stats_now(sluice_model *m)
{
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    return st;
}

/* A part whose bytes did not come through the proxy is not read again
 * directly, as a load is not (sluice_source_direct_again's through_proxy,
 * from the engine's requests): an origin (the fault server) whose w.e has
 * a byte of rank 0 flipped, behind a proxy that is down (refused at open,
 * then skipped): the part fails SLUICE_E_CHECKSUM after one read, one
 * checksum failure, no proxy failure counted for it. Before, a part's
 * bytes were taken to have come through the proxy whenever one was
 * configured: it was read again "directly" (2 checksum failures, a proxy
 * failure). */
static void test_part_direct_not_proxied(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] - 100, &lm);   /* in w.e, rank 0 of 2 */
    rf_server fault;
    start_fault_on(&fault, liar);
    char dead[64], url[300];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%u", rf_free_port());
    snprintf(url, sizeof url, "%s/m.safetensors", fault.base);
    char *mfp = tu_join(root, "m.safetensors.manifest.json");
    sluice_options o;
    opts_with_proxy(&o, dead);
    o.manifest_path = mfp;
    sluice_model *m = NULL;
    if (sluice_open(url, &o, &m) != SLUICE_OK)
        fail_msg("open: %s", sluice_errmsg(m));
    size_t half = (size_t)sizes[4] / 2;
    unsigned char *got = malloc(half);
    assert_non_null(got);
    struct sluice_stats before = stats_now(m), now;
    int rc = sluice_read_part_into(m, "w.e", 0, 0, 2, got, half);
    now = stats_now(m);
    if (rc != SLUICE_E_CHECKSUM || now.checksum_failures - before.checksum_failures != 1 ||
        now.proxy_failures != before.proxy_failures)
        fail_msg("part: %s (%s): %llu checksum failures, %llu proxy failures", sluice_strerror(rc),
                 sluice_errmsg(m),
                 (unsigned long long)(now.checksum_failures - before.checksum_failures),
                 (unsigned long long)(now.proxy_failures - before.proxy_failures));
    assert_int_equal(sluice_close(m), SLUICE_OK);
    rf_stop(&fault);
    free(got);
    free(mfp);
    tu_rmtree(liar);
    free(lm);
    free(liar);
}

/* A proxy's multi-range reply that fails the multipart checks is a
 * reply that fails the range checks (sluice.h "Proxies"): the request is
 * sent again to the origin directly, and the part reads. The fault server
 * as the proxy, armed once with each broken multipart mode, nginx the
 * origin; a strided part of a [64, 1024] U8 tensor (one multi-range
 * request). Before, mr_parse's failure ended the part (SLUICE_E_REMOTE,
 * SLUICE_E_FILE_CHANGED for mpsize) without the origin being asked. */
static void test_part_multipart_lie_goes_direct(void **state)
{
    (void)state;
    enum { ROWS = 64, COLS = 1024 };
    size_t seg = COLS / 4, len = ROWS * seg;
    char *p = tu_join(root, "mpx.safetensors");
    unsigned char *bytes = mf_write_u8_model(p, "t", ROWS, COLS, NULL), *part = malloc(len);
    assert_non_null(part);
    rf_server fault;
    start_fault_on(&fault, root);
    static const char *const modes[] = {"mpcr", "mpsize", "mpnocr", "mplong", "mpextra",
                                        "mptail", "mpboundary"};
    char url[300];
    snprintf(url, sizeof url, "%s/mpx.safetensors", nginx.base);
    for (size_t c = 0; c < sizeof modes / sizeof modes[0]; c++) {
        sluice_options o;
        opts_with_proxy(&o, fault.base);
        o.verify = SLUICE_VERIFY_OFF;
        sluice_model *m = NULL;
        if (sluice_open(url, &o, &m) != SLUICE_OK)
            fail_msg("open: %s", sluice_errmsg(m));
        char ctl[96];
        snprintf(ctl, sizeof ctl, "/ctl?mode=%s&count=1", modes[c]);
        free(rf_get(&fault, ctl));
        struct sluice_stats before = stats_now(m), now;
        memset(part, 0, len);
        int rc = sluice_read_part_into(m, "t", 1, 1, 4, part, len);
        now = stats_now(m);
        if (rc != SLUICE_OK)
            fail_msg("%s through the proxy: %s: %s", modes[c], sluice_strerror(rc),
                     sluice_errmsg(m));
        for (size_t r = 0; r < ROWS; r++)
            if (memcmp(part + r * seg, bytes + r * COLS + seg, seg) != 0)
                fail_msg("%s: row %zu of the part differs from the slice", modes[c], r);
        if (now.proxy_failures - before.proxy_failures != 1)
            fail_msg("%s: %llu proxy failures", modes[c],
                     (unsigned long long)(now.proxy_failures - before.proxy_failures));
        free(rf_get(&fault, "/ctl?mode=ok&count=0"));
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    rf_stop(&fault);
    unlink(p);
    free(p);
    free(part);
    free(bytes);
}

/* A part's token requested while it is read again directly (its bytes
 * through the proxy failed verification): the call returns
 * SLUICE_E_CANCELLED, and the part is not counted in failures, as any
 * cancelled part (sluice.h, sluice_read_part_into_ex). The fault server
 * as the proxy flips a byte of w.e's rank 0 of 2; the engine's pause
 * point 10 (a span read with a token has issued its first reads,
 * engine_hooks.h) requests the token at the first such point after the
 * checksum failure was counted: in the direct re-read. Before, the
 * cancelled re-read left the first read's SLUICE_E_CHECKSUM as the
 * answer, counted in failures. */
typedef struct redo_cancel {
    sluice_cancel *c;
    int calls;      /* pause points 10 seen */
    int cancel_at;  /* the call that requests the token (0: none) */
} redo_cancel;

static void cancel_in_redo(void *ctx, int where)
{
    redo_cancel *rc = ctx;
    if (where == 10 && ++rc->calls == rc->cancel_at)
        sluice_cancel_request(rc->c);
}

static void test_part_cancel_in_direct_reread(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] - 100, &lm);   /* in w.e, rank 0 of 2 */
    rf_server fault;
    start_fault_on(&fault, liar);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model_url(), &o, &m), SLUICE_OK);
    redo_cancel rc = {0};
    assert_int_equal(sluice_cancel_create(&rc.c), SLUICE_OK);
    assert_int_equal(sl_engine_set_pause(m, cancel_in_redo, &rc), SLUICE_OK);
    size_t half = (size_t)sizes[4] / 2;
    unsigned char *got = malloc(half);
    assert_non_null(got);
    sluice_part_options po;
    assert_int_equal(sluice_part_options_init(&po), SLUICE_OK);
    po.cancel = rc.c;
    /* first the span reads counted: the proxy's, then as many directly */
    struct sluice_stats before = stats_now(m), now;
    int r = sluice_read_part_into_ex(m, "w.e", 0, 0, 2, got, half, &po);
    now = stats_now(m);
    if (r != SLUICE_OK || now.proxy_failures - before.proxy_failures != 1 || rc.calls % 2)
        fail_msg("the part through the lying proxy: %s (%s), %llu proxy failures, %d span reads",
                 sluice_strerror(r), sluice_errmsg(m),
                 (unsigned long long)(now.proxy_failures - before.proxy_failures), rc.calls);
    /* then the token requested once the direct re-read has issued its
     * first reads */
    rc.cancel_at = rc.calls / 2 + 1;
    rc.calls = 0;
    before = stats_now(m);
    r = sluice_read_part_into_ex(m, "w.e", 0, 0, 2, got, half, &po);
    now = stats_now(m);
    assert_int_equal(sl_engine_set_pause(m, NULL, NULL), SLUICE_OK);
    if (!sluice_cancel_requested(rc.c))
        fail_msg("the token was not requested (%d span reads)", rc.calls);
    if (r != SLUICE_E_CANCELLED || now.failures != before.failures)
        fail_msg("cancelled in the direct re-read: %s (%s), failures %llu -> %llu",
                 sluice_strerror(r), sluice_errmsg(m), (unsigned long long)before.failures,
                 (unsigned long long)now.failures);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    sluice_cancel_free(rc.c);
    rf_stop(&fault);
    free(got);
    tu_rmtree(liar);
    free(lm);
    free(liar);
}

/* "Read again from the origin directly, once" is one rule, the remote
 * source's, for the engine's loads and the blocking reads alike: through
 * a proxy that flips a byte of w.e (its rank 0 of 2), a range
 * (sluice_read_into), a part (sluice_read_part_into) and a load
 * (sluice_acquire) of it each give the origin's bytes, each read again
 * directly exactly once: one proxy failure each, never none or two, and
 * at least the bytes asked fetched directly. */
static void test_direct_again_once_each(void **state)
{
    (void)state;
    char *lm;
    char *liar = liar_copy(sizes[5] + sizes[4] - 100, &lm);
    uint64_t off = file_size(lm) - sizes[5] - sizes[4];    /* w.e's first byte */
    rf_server fault;
    start_fault_on(&fault, liar);
    sluice_options o;
    opts_with_proxy(&o, fault.base);
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model_url(), &o, &m), SLUICE_OK);
    size_t half = (size_t)sizes[4] / 2;
    unsigned char *want = tu_pread_range(model_path, off, (size_t)sizes[4]);
    unsigned char *got = calloc(1, (size_t)sizes[4]);
    struct sluice_stats before = stats_now(m), now;
    /* a range */
    int rc = sluice_read_into(m, "w.e", 0, got, half);
    if (rc != SLUICE_OK)
        fail_msg("read_into: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    assert_memory_equal(got, want, half);
    now = stats_now(m);
    assert_int_equal(now.proxy_failures - before.proxy_failures, 1);
    assert_true(now.proxy_bypass_bytes - before.proxy_bypass_bytes >= half);
    before = now;
    /* a part */
    memset(got, 0, half);
    rc = sluice_read_part_into(m, "w.e", 0, 0, 2, got, half);
    if (rc != SLUICE_OK)
        fail_msg("read_part_into: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    assert_memory_equal(got, want, half);
    now = stats_now(m);
    assert_int_equal(now.proxy_failures - before.proxy_failures, 1);
    assert_true(now.proxy_bypass_bytes - before.proxy_bypass_bytes >= half);
    before = now;
    /* a load: the engine's, asynchronous */
    sluice_tensor *t = NULL;
    rc = sluice_acquire(m, "w.e", &t);
    if (rc != SLUICE_OK)
        fail_msg("acquire: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    assert_memory_equal(sluice_tensor_data(t), want, (size_t)sizes[4]);
    assert_non_null(strstr(sluice_tensor_source(t), "primary, direct: the proxy failed (its "
                                                    "bytes failed verification"));
    sluice_release(t);
    now = stats_now(m);
    assert_int_equal(now.proxy_failures - before.proxy_failures, 1);
    assert_true(now.proxy_bypass_bytes - before.proxy_bypass_bytes >= sizes[4]);
    assert_int_equal(now.failures, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    rf_stop(&fault);
    free(want);
    free(got);
    tu_rmtree(liar);
    free(lm);
    free(liar);
}

/* Each proxy has its own health: with http_proxy a dead proxy and
 * https_proxy a working one (the fault server standing for dfdaemon, so
 * that https:// is asked of it as http://), a model whose local file and
 * first mirror (http://, the fault server on the same bad copy) fail
 * w.b takes it from its second mirror (https://, nginx), whose requests
 * go through the https proxy although the http one was taken for down a
 * moment before (before: one health for both, so the second mirror's
 * requests skipped the working proxy and went direct). */
static void test_proxy_health_per_hop(void **state)
{
    (void)state;
    need_tls();
    char *dir = tu_tmpdir();
    char *local = tu_join(dir, "m.safetensors"), *lmf = tu_join(dir, "m.safetensors.manifest.json");
    char *mf = tu_join(root, "m.safetensors.manifest.json");
    tu_copy_file(model_path, local);
    tu_copy_file(mf, lmf);
    mf_flip_byte(local, file_size(local) - sizes[5] - sizes[4] - sizes[3] - sizes[2] - 10);
    rf_server bad, df;
    start_fault_on(&bad, dir);
    start_fault_on(&df, root);
    char dead[64], first[128], second[128];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%u", rf_free_port());
    snprintf(first, sizeof first, "%s/m.safetensors", bad.base);
    snprintf(second, sizeof second, "%s/m.safetensors", nginx.tls_base);
    setenv("http_proxy", dead, 1);
    setenv("https_proxy", df.base, 1);
    const char *mirrors[] = {first, second};
    sluice_options o;
    opts_with_proxy(&o, NULL);
    o.proxy_kind = SLUICE_PROXY_DRAGONFLY;
    o.remote_ca_file = nginx.ca_file;
    o.fallback = mirrors;
    o.fallback_count = 2;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(local, &o, &m), SLUICE_OK);
    sluice_tensor *t = NULL;
    int rc = sluice_acquire(m, "w.b", &t);
    if (rc != SLUICE_OK)
        fail_msg("acquire w.b: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    const struct sluice_tensor_info *info = sluice_tensor_info(t);
    unsigned char *want = tu_pread_range(model_path, info->offset, (size_t)info->nbytes);
    assert_memory_equal(sluice_tensor_data(t), want, (size_t)info->nbytes);
    free(want);
    assert_non_null(strstr(sluice_tensor_source(t), "fallback 2"));
    sluice_release(t);
    struct sluice_stats st = stats_now(m);
    assert_int_equal(st.proxy_failures, 1);     /* the dead proxy, once */
    assert_int_equal(sluice_close(m), SLUICE_OK);
    unsetenv("http_proxy");
    unsetenv("https_proxy");
    char *log = log_and_stop(&df);
    char plain[128];
    snprintf(plain, sizeof plain, "GET http://127.0.0.1:%u/m.safetensors", nginx.tls_port);
    int seen = strstr(log, plain) != NULL;
    free(log);
    if (!seen)
        fail_msg("the https proxy was skipped: its log has no %s", plain);
    rf_stop(&bad);
    tu_rmtree(dir);
    free(dir);
    free(local);
    free(lmf);
    free(mf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_squid_eight_nodes),
        cmocka_unit_test(test_squid_corrupt_copy),
        cmocka_unit_test(test_proxy_rewrites_etag),
        cmocka_unit_test(test_proxy_refused),
        cmocka_unit_test(test_proxy_hangs),
        cmocka_unit_test(test_proxy_5xx),
        cmocka_unit_test(test_proxy_environment),
        cmocka_unit_test(test_no_proxy_redirect_target),
        cmocka_unit_test(test_dragonfly_headers),
        cmocka_unit_test(test_plain_no_dragonfly_headers),
        cmocka_unit_test(test_mirror_through_proxy),
        cmocka_unit_test(test_command_proxy),
        cmocka_unit_test(test_proxy_404_manifest),
        cmocka_unit_test(test_no_proxy_range_dragonfly),
        cmocka_unit_test(test_dragonfly_redirect_no_connect),
        cmocka_unit_test(test_dragonfly_credentials_off_host_refused),
        cmocka_unit_test(test_dragonfly_hub_token_only_for_the_hub),
        cmocka_unit_test(test_proxy_credentials_hidden),
        cmocka_unit_test(test_proxy_credentials_stay_with_the_proxy),
        cmocka_unit_test(test_proxy_own_manifest),
        cmocka_unit_test(test_part_through_lying_proxy),
        cmocka_unit_test(test_verify_files_through_lying_proxy),
        cmocka_unit_test(test_verify_tensors_through_lying_proxy),
        cmocka_unit_test(test_direct_again_once_each),
        cmocka_unit_test(test_part_direct_not_proxied),
        cmocka_unit_test(test_part_multipart_lie_goes_direct),
        cmocka_unit_test(test_part_cancel_in_direct_reread),
        cmocka_unit_test(test_proxy_health_per_hop),
    };
    if (getenv("SLUICE_TEST_FILTER"))
        cmocka_set_test_filter(getenv("SLUICE_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
