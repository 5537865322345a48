/* test_mirrors.c: mirrors for the whole model (issue 38 item 5). When the
 * model's own location cannot be opened (a closed port, a 404), the open
 * goes on from the first mirror that passes the same checks (the
 * manifest's header digests refuse one whose header differs), says so
 * (sluice_model_location, the commands' note), and a mirror's tensors are
 * kept in the persistent cache: a second open moves no tensor byte.
 * Against a real nginx started by the test (remote_fixture.h); skipped
 * (77) without it. */
#include "remote_fixture.h"
#include "util.h"

#include "sluice.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static rf_server nginx;
static char *root;          /* served at / */
static char down[64];       /* http://127.0.0.1:PORT with nothing listening */

#define MIB (1u << 20)
static const char *const names[] = {"a", "b", "c", "d"};
static const uint64_t sizes[] = {100, 2 * MIB + 17, 0, 3 * MIB + 3};
#define N 4
#define NONEMPTY 3

static void write_model(const char *path, const char *metadata)
{
    char header[2048];
    size_t len = 0;
    uint64_t off = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{%s", metadata ? metadata : "");
    for (size_t i = 0; i < N; i++) {
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s\":{\"dtype\":\"U8\",\"shape\":[%llu],"
                                "\"data_offsets\":[%llu,%llu]}",
                                i || metadata ? "," : "", names[i],
                                (unsigned long long)sizes[i], (unsigned long long)off,
                                (unsigned long long)(off + sizes[i]));
        off += sizes[i];
    }
    snprintf(header + len, sizeof header - len, "}");
    tu_write_safetensors(path, header, NULL, (size_t)off);
}

/* `sluice manifest` (version 2: tensors, files and their header digests) */
static void manifest_of(const char *model, const char *out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/sluice manifest '%s' -o '%s' >/dev/null", SLUICE_BINARY_DIR,
             model, out);
    assert_int_equal(system(cmd), 0);
}

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *at(const char *fmt, ...)
{
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ & 3];
    int n = snprintf(b, 1024, "%s/", nginx.base);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, 1024 - (size_t)n, fmt, ap);
    va_end(ap);
    return b;
}

static int setup(void **state)
{
    char why[256];
    rf_skip_without_curl();
    root = tu_tmpdir();
    chmod(root, 0755);
    /* good/: the model and its sidecar; other/: the same tensors under
     * another header (its metadata), with a sidecar of its own */
    static const char *const dirs[] = {"good", "other"};
    for (int d = 0; d < 2; d++) {
        char *dir = tu_join(root, dirs[d]);
        mkdir(dir, 0755);
        char *p = tu_join(dir, "m.safetensors"), *mf = tu_join(dir, "m.safetensors.manifest.json");
        /* the same length: only the header digest tells them apart */
        write_model(p, d ? "\"__metadata__\":{\"note\":\"bbbb\"}"
                         : "\"__metadata__\":{\"note\":\"aaaa\"}");
        manifest_of(p, mf);
        free(p);
        free(mf);
        free(dir);
    }
    unsigned port = rf_free_port();
    snprintf(down, sizeof down, "http://127.0.0.1:%u", port);
    if (!port || !rf_nginx_start(&nginx, root, NULL, why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        tu_rmtree(root);
        free(root);
        exit(77);
    }
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    rf_stop(&nginx);
    tu_rmtree(root);
    free(root);
    (void)state;
    return 0;
}

static sluice_options quick(void)
{
    sluice_options o;
    sluice_options_init(&o);
    o.remote_attempts = 2;
    o.remote_backoff_ms = 10;
    return o;
}

/* Every tensor acquired, each equal to the good model's bytes. */
static void acquire_all_good(sluice_model *m)
{
    char *p = tu_join(root, "good/m.safetensors");
    for (size_t i = 0; i < sluice_count(m); i++) {
        sluice_tensor *t;
        int rc = sluice_acquire_index(m, i, &t);
        if (rc != SLUICE_OK)
            fail_msg("acquire %zu: %s: %s", i, sluice_strerror(rc), sluice_errmsg(m));
        const struct sluice_tensor_info *ti = sluice_tensor_info(t);
        if (ti->nbytes) {
            void *want = tu_pread_range(p, ti->offset, (size_t)ti->nbytes);
            assert_memory_equal(sluice_tensor_data(t), want, (size_t)ti->nbytes);
            free(want);
        }
        sluice_release(t);
    }
    free(p);
}

/* The absolute offset of tensor name in the local model at path. */
static uint64_t offset_of(const char *path, const char *name)
{
    sluice_options o;
    sluice_options_init(&o);
    o.verify = SLUICE_VERIFY_OFF;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(path, &o, &m), SLUICE_OK);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_find(m, name, &ti), SLUICE_OK);
    sluice_close(m);
    return ti.offset;
}

static struct sluice_stats stats_of(sluice_model *m)
{
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    return st;
}

/* A primary that cannot be opened (primary_loc), mirror good/: the open
 * goes on from it, its tensors go to the cache, and a second open moves
 * no tensor byte. */
static void served_by_mirror(const char *primary_loc, const char *words)
{
    char *cache = tu_tmpdir();
    const char *mirrors[] = {at("good/m.safetensors")};
    sluice_options o = quick();
    o.fallback = mirrors;
    o.fallback_count = 1;
    o.cache_dir = cache;
    for (int pass = 0; pass < 2; pass++) {
        sluice_model *m = NULL;
        int rc = sluice_open(primary_loc, &o, &m);
        if (rc != SLUICE_OK)
            fail_msg("open %s: %s: %s", primary_loc, sluice_strerror(rc), sluice_errmsg(m));
        unsigned k = 9;
        const char *why = NULL, *loc = sluice_model_location(m, &k, &why);
        assert_int_equal(k, 1);
        assert_string_equal(loc, mirrors[0]);
        assert_non_null(why);
        if (!strstr(why, "primary (") || !strstr(why, words))
            fail_msg("why: %s (wanted \"%s\")", why, words);
        assert_int_equal(sluice_verify_state(m, NULL), SLUICE_VERIFIED);
        acquire_all_good(m);
        struct sluice_stats st = stats_of(m);
        assert_int_equal(st.checksum_failures, 0);
        assert_int_equal(st.fallback_tensors, 0);
        if (pass == 0) {
            assert_int_equal(st.disk_stored, NONEMPTY);
            assert_true(st.remote_bytes > 5 * MIB);
        } else {
            /* the second open: every tensor from the cache */
            assert_int_equal(st.disk_hits, NONEMPTY);
            assert_int_equal(st.disk_misses, 0);
            assert_int_equal(st.remote_reads, 0);
            assert_int_equal(st.remote_bytes, 0);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    tu_rmtree(cache);
    free(cache);
}

static void test_unreachable_primary(void **state)
{
    char loc[128];
    snprintf(loc, sizeof loc, "%s/good/m.safetensors", down);
    served_by_mirror(loc, "Couldn't connect");
    (void)state;
}

static void test_primary_404(void **state)
{
    served_by_mirror(at("nowhere/m.safetensors"), "404");
    (void)state;
}

/* With a manifest named (manifest_path), a mirror whose header is not the
 * one its header digest names is refused and the next tried; with none
 * left, the open fails with the primary's code, naming each failure. */
static void test_mirror_header_refused(void **state)
{
    char loc[128];
    snprintf(loc, sizeof loc, "%s/good/m.safetensors", down);
    char *mf = tu_join(root, "good/m.safetensors.manifest.json");
    const char *mirrors[] = {at("other/m.safetensors"), at("good/m.safetensors")};
    sluice_options o = quick();
    o.fallback = mirrors;
    o.fallback_count = 2;
    o.manifest_path = mf;
    sluice_model *m = NULL;
    int rc = sluice_open(loc, &o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    unsigned k = 0;
    const char *why = NULL;
    assert_string_equal(sluice_model_location(m, &k, &why), mirrors[1]);
    assert_int_equal(k, 2);
    if (!strstr(why, "fallback 1 (") || !strstr(why, "the header of"))
        fail_msg("why: %s", why);
    acquire_all_good(m);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* the header-refused mirror alone: the open fails with the code the
     * primary fails with by itself */
    sluice_options alone = quick();
    m = NULL;
    int primary_rc = sluice_open(loc, &alone, &m);
    assert_true(primary_rc < 0);
    sluice_close(m);
    o.fallback_count = 1;
    m = NULL;
    assert_int_equal(sluice_open(loc, &o, &m), primary_rc);
    const char *msg = sluice_errmsg(m);
    if (!strstr(msg, "primary (") || !strstr(msg, "fallback 1 (") || !strstr(msg, "the header of"))
        fail_msg("message: %s", msg);
    assert_null(sluice_model_location(m, &k, &why));
    sluice_close(m);
    /* a mirror with no manifest beside it serves no open */
    char *bare = tu_join(root, "bare");
    mkdir(bare, 0755);
    char *p = tu_join(root, "good/m.safetensors"), *q = tu_join(bare, "m.safetensors");
    tu_copy_file(p, q);
    const char *bare_mirror[] = {at("bare/m.safetensors")};
    o.fallback = bare_mirror;
    o.manifest_path = NULL;
    m = NULL;
    assert_int_equal(sluice_open(loc, &o, &m), primary_rc);
    if (!strstr(sluice_errmsg(m), "no manifest to check its bytes against"))
        fail_msg("message: %s", sluice_errmsg(m));
    sluice_close(m);
    free(p);
    free(q);
    free(bare);
    free(mf);
    (void)state;
}

/* The model's own location answers: no mirror is asked for the index. */
static void test_primary_up(void **state)
{
    const char *mirrors[] = {at("other/m.safetensors")};
    sluice_options o = quick();
    o.fallback = mirrors;
    o.fallback_count = 1;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(at("good/m.safetensors"), &o, &m), SLUICE_OK);
    unsigned k = 9;
    const char *why = "x";
    assert_string_equal(sluice_model_location(m, &k, &why), at("good/m.safetensors"));
    assert_int_equal(k, 0);
    assert_null(why);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    (void)state;
}

/* A damaged local primary, a remote mirror: the tensor the mirror
 * delivered is kept in the cache, and the next open reads it from there
 * (no fallback, no remote byte); the primary's sound tensors are not
 * copied into the cache. */
static void test_mirror_tensor_cached(void **state)
{
    char *d = tu_tmpdir(), *cache = tu_tmpdir();
    char *p = tu_join(root, "good/m.safetensors"), *pm = tu_join(root, "good/m.safetensors.manifest.json");
    char *q = tu_join(d, "m.safetensors"), *qm = tu_join(d, "m.safetensors.manifest.json");
    tu_copy_file(p, q);
    tu_copy_file(pm, qm);
    /* flip a byte of d */
    uint64_t at_d = offset_of(q, "d") + 5;
    int fd = open(q, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, (off_t)at_d), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at_d), 1);
    close(fd);
    sluice_model *m;
    const char *mirrors[] = {at("good/m.safetensors")};
    sluice_options o = quick();
    o.fallback = mirrors;
    o.fallback_count = 1;
    o.cache_dir = cache;
    for (int pass = 0; pass < 2; pass++) {
        m = NULL;
        assert_int_equal(sluice_open(q, &o, &m), SLUICE_OK);
        assert_int_equal(sluice_model_location(m, NULL, NULL) != NULL, 1);
        acquire_all_good(m);
        struct sluice_stats st = stats_of(m);
        if (pass == 0) {
            assert_int_equal(st.fallback_tensors, 1);
            assert_int_equal(st.disk_stored, 1);    /* d only */
        } else {
            assert_int_equal(st.fallback_tensors, 0);
            assert_int_equal(st.fallback_bytes, 0);
            assert_int_equal(st.checksum_failures, 0);
            assert_int_equal(st.disk_hits, 1);
            assert_int_equal(st.remote_bytes, 0);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
    }
    tu_rmtree(d);
    tu_rmtree(cache);
    free(d);
    free(cache);
    free(p);
    free(pm);
    free(q);
    free(qm);
    (void)state;
}

/* The command line: `sluice cat --fallback` with the primary down, and
 * its note naming the mirror; `sluice verify` refuses to judge a mirror
 * in PATH's place. */
static void test_cat_fallback(void **state)
{
    char *dir = tu_tmpdir(), *out = tu_join(dir, "out"), *errf = tu_join(dir, "err");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/sluice cat %s/good/m.safetensors d --fallback %s >%s 2>%s",
             SLUICE_BINARY_DIR, down, at("good/m.safetensors"), out, errf);
    int st = system(cmd);
    size_t n = 0, en = 0;
    char *got = tu_read_file(out, &n), *err = tu_read_file(errf, &en);
    if (st != 0)
        fail_msg("%s: exit %d: %s", cmd, st, err ? err : "");
    char *p = tu_join(root, "good/m.safetensors");
    assert_int_equal(n, 3 * MIB + 3);
    void *want = tu_pread_range(p, offset_of(p, "d"), n);
    assert_memory_equal(got, want, n);
    if (!err || !strstr(err, "note: fallback 1 ("))
        fail_msg("stderr: %s", err ? err : "");
    free(err);
    /* verify judges PATH's own bytes: a mirror does not stand in */
    snprintf(cmd, sizeof cmd, "%s/sluice verify -q %s/good/m.safetensors --fallback %s "
             ">/dev/null 2>%s", SLUICE_BINARY_DIR, down, at("good/m.safetensors"), errf);
    st = system(cmd);
    err = tu_read_file(errf, &en);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !err || !strstr(err, "cannot be opened"))
        fail_msg("%s: status %d: %s", cmd, st, err ? err : "");
    free(want);
    free(p);
    free(got);
    free(err);
    free(out);
    free(errf);
    tu_rmtree(dir);
    free(dir);
    (void)state;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unreachable_primary),
        cmocka_unit_test(test_primary_404),
        cmocka_unit_test(test_mirror_header_refused),
        cmocka_unit_test(test_primary_up),
        cmocka_unit_test(test_mirror_tensor_cached),
        cmocka_unit_test(test_cat_fallback),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
