/* The persistent cache as loads use it (engine_cache.c over cache.c): a
 * remote model served by the test's own nginx loaded cold then warm, rotten
 * and cut blobs, a broken index, a cache that cannot be written, SIGKILL in
 * the middle of fills, several processes and threads on one cache; and the
 * verified-once memo of local files, with what invalidates it.
 * The model is `sluice synth tiny` (41 tensors, with its manifest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "api/engine_hooks.h"
#include "remote_fixture.h"
#include "tool_run.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/time.h>

#ifdef SLUICE_HAVE_SQLITE
#include <sqlite3.h>
#endif

static char *root;          /* served by nginx: root/m is the model */
static char memo_why[512];  /* not empty: root is on no file system the memo trusts */
static char *model;         /* root/m/model.safetensors */
static char *url;           /* its URL */
static rf_server nginx;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char *fresh_cache(void)
{
    char *d = tu_tmpdir();
    return d;
}

/* Removes a folder of the test (a cache of fresh_cache's) and frees its path. */
static void drop_cache(char *dir)
{
    tu_rmtree(dir);
    free(dir);
}

static sluice_options cached_opts(const char *dir)
{
    sluice_options o;
    sluice_options_init(&o);
    o.cache_dir = dir;
    o.pool_bytes = 64u << 20;
    return o;
}

static sluice_model *open_ok(const char *loc, const sluice_options *o)
{
    sluice_model *m = NULL;
    int rc = sluice_open(loc, o, &m);
    if (rc != SLUICE_OK)
        fail_msg("open %s: %s: %s", loc, sluice_strerror(rc), sluice_errmsg(m));
    return m;
}

/* Streams every tensor, comparing its bytes with the local file's (read
 * with pread, not by the library); returns the stats. */
typedef struct check_ctx {
    size_t delivered, failed;
    int first_failure;
} check_ctx;

static int check_cb(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
                    const char *message)
{
    check_ctx *c = user;
    if (status != SLUICE_OK) {
        if (!c->failed)
            c->first_failure = status;
        c->failed++;
        fprintf(stderr, "  stream: %s: %s\n", info ? info->name : "?", message);
        return 0;
    }
    void *want = tu_pread_range(model, info->offset, (size_t)info->nbytes);
    assert_int_equal(sluice_tensor_size(t), info->nbytes);
    assert_memory_equal(sluice_tensor_data(t), want, info->nbytes);
    free(want);
    sluice_release(t);
    c->delivered++;
    return 0;
}

static struct sluice_stats load_all(const char *loc, const sluice_options *o, check_ctx *c)
{
    sluice_model *m = open_ok(loc, o);
    memset(c, 0, sizeof *c);
    sluice_stream(m, NULL, 0, check_cb, c);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return st;
}

/* A fresh cache folder (returned) and *o its options (cached_opts), the
 * model at url loaded once through it (load_all into c): the cache as
 * a cold load fills it. */
static char *filled_cache(sluice_options *o, check_ctx *c)
{
    char *dir = fresh_cache();
    *o = cached_opts(dir);
    load_all(url, o, c);
    return dir;
}

static size_t ntensors, nonempty;

static void count_tensors(void)
{
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = open_ok(model, &o);
    ntensors = sluice_count(m);
    nonempty = 0;
    for (size_t i = 0; i < ntensors; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &ti), SLUICE_OK);
        nonempty += ti.nbytes > 0;
    }
    sluice_close(m);
}

/* The path of one blob in cache dir (the first found), or NULL. */
static char *some_blob(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "find '%s/blobs' -type f | sort | head -n 1", dir);
    FILE *p = popen(cmd, "r");
    char line[1024] = "";
    if (!p)
        return NULL;
    if (!fgets(line, sizeof line, p))
        line[0] = '\0';
    pclose(p);
    line[strcspn(line, "\n")] = '\0';
    return line[0] ? strdup(line) : NULL;
}

static size_t count_files(const char *dir, const char *sub)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "find '%s/%s' -type f 2>/dev/null | wc -l", dir, sub);
    FILE *p = popen(cmd, "r");
    size_t n = 0;
    if (p && fscanf(p, "%zu", &n) != 1)
        n = 0;
    if (p)
        pclose(p);
    return n;
}

/* Flips the lowest bit of the byte at off of path, without the library
 * (the same call puts it back). Safe where cmocka's asserts are not (a
 * pause hook inside the library): it aborts on failure. */
static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char b;
    if (fd < 0 || pread(fd, &b, 1, off) != 1)
        abort();
    b ^= 1;
    if (pwrite(fd, &b, 1, off) != 1)
        abort();
    close(fd);
}

/* One blob of dir (which must have some) with its first byte flipped:
 * its path (malloc'd). */
static char *rot_one_blob(const char *dir)
{
    char *blob = some_blob(dir);
    assert_non_null(blob);
    flip_byte(blob, 0);
    return blob;
}

/* ---------------------------------------------------------------- set-up */

static int setup(void **state)
{
    char why[256];
    (void)state;
    rf_skip_without_curl();
    /* On a disk file system (a /tmp on tmpfs is not one): the memo's
     * tests need one; without any, they skip saying why. */
    root = tu_disk_tmpdir(memo_why, sizeof memo_why);
    if (!root)
        root = tu_tmpdir();
    else
        memo_why[0] = 0;
    chmod(root, 0755);
    char *dir = tu_join(root, "m");
    run_result r = run(root, "synth", "tiny", dir, "--shards", "1", NULL);
    if (r.status != 0)
        fail_msg("sluice synth tiny: %s", r.err);
    run_free(&r);
    model = tu_join(dir, "model.safetensors");
    free(dir);
    count_tensors();
    if (!rf_nginx_start(&nginx, root, NULL, why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        exit(77);
    }
    size_t n = strlen(nginx.base) + 64;
    url = malloc(n);
    snprintf(url, n, "%s/m/model.safetensors", nginx.base);
    /* The memo records files whose mtime and ctime are a second old. */
    sleep_ms(1100);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rf_stop(&nginx);
    tu_rmtree(root);
    free(root);
    free(model);
    free(url);
    return 0;
}

/* ---------------------------------------------------------------- remote */

/* Cold: every tensor fetched and stored. Warm: no tensor request reaches
 * the server (its log grows by what an open alone costs), bytes equal. */
/* Each entry names the tensors stored as it: at least one, of the model
 * at url (as messages show it), each a tensor of that model. */
typedef struct names_seen {
    sluice_model *m;
    size_t entries, names;
} names_seen;

static int names_cb(void *user, const sluice_cache_entry *e)
{
    names_seen *s = user;
    s->entries++;
    assert_true(e->nnames >= 1);
    for (size_t k = 0; k < e->nnames; k++) {
        assert_string_equal(e->names[k].model, url);
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_find_n(s->m, e->names[k].tensor, e->names[k].tensor_len, &ti),
                         SLUICE_OK);
        assert_int_equal(ti.nbytes, e->bytes);
        s->names++;
    }
    return 0;
}

static void test_cold_then_warm(void **state)
{
    (void)state;
    char *dir = fresh_cache();
    sluice_options o = cached_opts(dir);
    check_ctx c;

    size_t before = rf_requests(&nginx);
    sluice_model *m = open_ok(url, &o);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    size_t open_only = rf_requests(&nginx) - before;
    assert_true(open_only >= 1);

    before = rf_requests(&nginx);
    struct sluice_stats cold = load_all(url, &o, &c);
    size_t cold_requests = rf_requests(&nginx) - before;
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.delivered, ntensors);
    assert_int_equal(cold.disk_hits, 0);
    assert_int_equal(cold.disk_misses, nonempty);
    assert_int_equal(cold.disk_stored, nonempty);
    assert_int_equal(cold.disk_degraded, 0);
    assert_true(cold.remote_reads >= 1);
    assert_int_equal(cold_requests, open_only + cold.remote_reads);

    before = rf_requests(&nginx);
    struct sluice_stats warm = load_all(url, &o, &c);
    size_t warm_requests = rf_requests(&nginx) - before;
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.delivered, ntensors);
    assert_int_equal(warm.remote_reads, 0);
    assert_int_equal(warm_requests, open_only);   /* no tensor request at all */
    assert_int_equal(warm.disk_hits, nonempty);
    assert_int_equal(warm.disk_misses, 0);
    assert_int_equal(warm.disk_stored, 0);
    assert_int_equal(warm.tensors_verified, nonempty); /* a blob is verified as it is read */
    fprintf(stderr, "  server requests: open alone %zu, cold load %zu, warm load %zu\n",
            open_only, cold_requests, warm_requests);

    /* the metrics count the same */
    sluice_options mo = o;
    mo.metrics_label = "warm";
    m = open_ok(url, &mo);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_index(m, ntensors - 1, &t), SLUICE_OK);
    sluice_release(t);
    static char text[1 << 16];
    assert_int_equal(sluice_metrics_write(m, text, sizeof text, NULL, SLUICE_METRICS_PROMETHEUS),
                     SLUICE_OK);
    assert_non_null(strstr(text, "sluice_disk_cache_hits_total{model=\"warm\"} 1\n"));
    assert_non_null(strstr(text, "sluice_disk_cache_misses_total{model=\"warm\"} 0\n"));
    assert_non_null(strstr(text, "sluice_disk_cache_degraded{model=\"warm\"} 0\n"));
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* the administration sees what the loads stored */
    sluice_cache *ca = NULL;
    assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
    uint64_t bytes = 0, entries = 0;
    assert_int_equal(sluice_cache_usage(ca, &bytes, &entries), SLUICE_OK);
    assert_int_equal(entries, nonempty);
    /* and the tensors and model each blob holds (issue 38, item 7) */
    names_seen seen = {.m = open_ok(url, &o)};
    assert_int_equal(sluice_cache_list(ca, names_cb, &seen), SLUICE_OK);
    assert_int_equal(seen.entries, nonempty);
    assert_true(seen.names >= nonempty);
    assert_int_equal(sluice_close(seen.m), SLUICE_OK);
    sluice_cache_close(ca);
    drop_cache(dir);
}

/* sluice_verify of a remote model checks the source, not the cache: with
 * every blob present, one of them rotten, it fetches every tensor from the
 * server and reports them all good (it never read the rotten blob, nor
 * stored anything); a load after it finds the rotten blob and fetches that
 * tensor again, all good; the next load reads every blob. */
static void test_remote_verify_checks_source(void **state)
{
    (void)state;
    sluice_options o;
    check_ctx c;
    char *dir = filled_cache(&o, &c);   /* cold: fills the cache */
    assert_int_equal(c.failed, 0);
    char *blob = rot_one_blob(dir);
    sluice_model *m = open_ok(url, &o);
    size_t before = rf_requests(&nginx);
    struct sluice_verify_report rep = {.size = sizeof rep};
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &rep), SLUICE_OK);
    assert_int_equal(rep.tensors_ok, ntensors);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_true(rf_requests(&nginx) > before);
    assert_int_equal(st.disk_hits, 0);
    assert_int_equal(st.disk_rotten, 0);
    assert_true(st.remote_reads >= 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    /* loads use the cache; the verify stored nothing, so the rotten
     * blob is found by the load, which fetches the tensor and stores it */
    st = load_all(url, &o, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.disk_hits, nonempty - 1);
    assert_int_equal(st.disk_rotten, 1);
    st = load_all(url, &o, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.disk_hits, nonempty);
    assert_int_equal(st.disk_rotten, 0);
    free(blob);
    drop_cache(dir);
}

/* A verify leaves the cache to the loads, on the same model, whatever the
 * verify returned: after a verify that succeeded, and one that failed (a
 * name the model does not have), a load of a trimmed tensor reads its
 * blob. */
static void expect_blob_read(sluice_model *m, uint64_t hits_before)
{
    uint64_t released = 0;
    assert_int_equal(sluice_trim(m, &released), SLUICE_OK);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_index(m, ntensors - 1, &t), SLUICE_OK);
    sluice_release(t);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(st.disk_hits, hits_before + 1);
}

static void test_remote_verify_bypass_ends(void **state)
{
    (void)state;
    sluice_options o;
    check_ctx c;
    char *dir = filled_cache(&o, &c);   /* fills the cache */
    assert_int_equal(c.failed, 0);
    sluice_model *m = open_ok(url, &o);
    struct sluice_verify_report rep = {.size = sizeof rep};
    assert_int_equal(sluice_verify(m, NULL, 0, NULL, &rep), SLUICE_OK);
    expect_blob_read(m, 0);
    const char *const bad[] = {"no.such.tensor"};
    assert_true(sluice_verify(m, bad, 1, NULL, &rep) < 0);
    expect_blob_read(m, 1);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    drop_cache(dir);
}

/* sluice_close right after a cold prefetch: stores run on the hashing
 * threads with the engine's lock dropped; close waits for them (the hasher
 * idle) before the cache goes. Under ASan a store outliving the cache is a
 * use after free; after each close every blob recorded rehashes to its
 * name. Then a stream cancelled from its first callback, stores still on
 * their way, and a trim, must leave the same. */
static int cancel_first(void *user, sluice_tensor *t, int status,
                        const struct sluice_tensor_info *info, const char *message)
{
    (void)status, (void)info, (void)message;
    sluice_cancel_request(user);
    if (t)
        sluice_release(t);
    return 0;
}

static void expect_blobs_sound(const char *dir)
{
    sluice_cache *ca = NULL;
    assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
    uint64_t checked = 0, dropped = 0, bytes = 0, entries = 0;
    assert_int_equal(sluice_cache_verify(ca, &checked, &dropped, NULL, NULL), SLUICE_OK);
    assert_int_equal(dropped, 0);
    assert_int_equal(sluice_cache_usage(ca, &bytes, &entries), SLUICE_OK);
    assert_true(entries <= nonempty);
    sluice_cache_close(ca);
}

static void test_close_cancel_while_storing(void **state)
{
    (void)state;
    for (int round = 0; round < 6; round++) {
        char *dir = fresh_cache();
        sluice_options o = cached_opts(dir);
        sluice_model *m = open_ok(url, &o);
        assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
        if (round & 1) {
            uint64_t released = 0;
            sluice_trim(m, &released);
        }
        assert_int_equal(sluice_close(m), SLUICE_OK);
        expect_blobs_sound(dir);

        m = open_ok(url, &o);
        sluice_cancel *cc = NULL;
        assert_int_equal(sluice_cancel_create(&cc), SLUICE_OK);
        sluice_stream_options so;
        sluice_stream_options_init(&so);
        so.cancel = cc;
        sluice_stream_ex(m, NULL, 0, cancel_first, cc, &so);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        sluice_cancel_free(cc);
        expect_blobs_sound(dir);
        /* what is there loads right */
        check_ctx c;
        load_all(url, &o, &c);
        assert_int_equal(c.failed, 0);
        assert_int_equal(c.delivered, ntensors);
        drop_cache(dir);
    }
}

/* Flips the first byte of every blob in dir. */
static void rot_all_blobs(const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "find '%s/blobs' -type f", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        flip_byte(line, 0);
    }
    pclose(p);
}

/* Rotten blobs of a model with a mirror, their loads ending while the
 * model closes: the blob is dropped and no fetch starts (closing); the
 * failure then goes to the mirrors' code as the model's own, never as a
 * load from a mirror numbered by the cache's source (255, past the
 * mirrors). */
static void test_rotten_blobs_at_close_with_mirror(void **state)
{
    (void)state;
    char *mirror = tu_join(root, "m");
    const char *fb[1] = {mirror};
    for (int round = 0; round < 8; round++) {
        sluice_options o;
        check_ctx c;
        char *dir = filled_cache(&o, &c);   /* fills the cache */
        assert_int_equal(c.failed, 0);
        rot_all_blobs(dir);
        o.fallback = fb;
        o.fallback_count = 1;
        sluice_model *m = open_ok(url, &o);
        assert_int_equal(sluice_prefetch(m, NULL, 0), SLUICE_OK);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        /* and loaded to the end: every tensor right, fetched again */
        o.fallback = NULL;
        o.fallback_count = 0;
        load_all(url, &o, &c);
        assert_int_equal(c.failed, 0);
        drop_cache(dir);
    }
    free(mirror);
}

/* A blob whose byte rotted on disk is caught as it is read, dropped,
 * fetched again and stored again; a cut one is a miss. */
static void test_rotten_blob(void **state)
{
    (void)state;
    sluice_options o;
    check_ctx c;
    char *dir = filled_cache(&o, &c);
    char *blob = rot_one_blob(dir);

    struct sluice_stats st = load_all(url, &o, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.delivered, ntensors);
    assert_int_equal(st.disk_rotten, 1);
    assert_int_equal(st.disk_hits, nonempty - 1);
    assert_int_equal(st.disk_stored, 1);
    assert_int_equal(st.remote_reads, 1);
    assert_int_equal(st.checksum_failures, 1);

    st = load_all(url, &o, &c);   /* stored again, whole */
    assert_int_equal(st.disk_hits, nonempty);
    assert_int_equal(st.disk_rotten, 0);

    assert_int_equal(truncate(blob, 3), 0);   /* cut: not this tensor's size */
    st = load_all(url, &o, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.disk_hits, nonempty - 1);
    assert_int_equal(st.disk_misses, 1);
    assert_int_equal(st.disk_stored, 1);
    free(blob);
    drop_cache(dir);
}

/* Every blob deleted (sluice_cache_clear, as another process's eviction
 * would) in the middle of a warm stream: the loads that had their blob open
 * read it whole, those that start later are misses fetched from the
 * server; every byte right. The pool is small and reads are 4 KiB, one at
 * a time, so that the stream is still loading when it happens. */
typedef struct clear_ctx {
    check_ctx c;
    const char *dir;
    int cleared;
} clear_ctx;

static int clear_at_first(void *user, sluice_tensor *t, int status,
                          const struct sluice_tensor_info *info, const char *message)
{
    clear_ctx *x = user;
    if (!x->cleared) {
        sluice_cache *ca = NULL;
        assert_int_equal(sluice_cache_open(x->dir, &ca), SLUICE_OK);
        assert_int_equal(sluice_cache_clear(ca, NULL, NULL), SLUICE_OK);
        sluice_cache_close(ca);
        x->cleared = 1;
    }
    return check_cb(&x->c, t, status, info, message);
}

static void test_blobs_deleted_while_loading(void **state)
{
    (void)state;
    sluice_options o;
    check_ctx c;
    char *dir = filled_cache(&o, &c);   /* warm */
    o.pool_bytes = 256u << 10;
    o.queue_depth = 1;
    o.chunk_bytes = 4096;
    sluice_model *m = open_ok(url, &o);
    clear_ctx x = {.dir = dir};
    sluice_stream(m, NULL, 0, clear_at_first, &x);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    fprintf(stderr, "  blobs deleted after the first delivery: %llu hits, %llu misses\n",
            (unsigned long long)st.disk_hits, (unsigned long long)st.disk_misses);
    assert_int_equal(x.c.failed, 0);
    assert_int_equal(x.c.delivered, ntensors);
    assert_true(st.disk_hits >= 1);
    assert_true(st.disk_misses >= 1);
    assert_int_equal(st.disk_hits + st.disk_misses, nonempty);
    assert_int_equal(st.disk_rotten, 0);
    drop_cache(dir);
}

/* index.sqlite truncated, or garbage: the open moves it aside, rebuilds it
 * from the blobs, and the load is still warm. */
static void test_broken_index(void **state)
{
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        sluice_options o;
        check_ctx c;
        char *dir = filled_cache(&o, &c);
        char *db = tu_join(dir, "index.sqlite");
        if (kind == 0) {
            assert_int_equal(truncate(db, 100), 0);
        } else {
            char junk[4096];
            for (size_t i = 0; i < sizeof junk; i++)
                junk[i] = (char)(i * 7 + 3);
            tu_write_file(db, junk, sizeof junk);
        }
        char *wal = tu_join(dir, "index.sqlite-wal"), *shm = tu_join(dir, "index.sqlite-shm");
        unlink(wal);
        unlink(shm);
        struct sluice_stats st = load_all(url, &o, &c);
        assert_int_equal(c.failed, 0);
        assert_int_equal(st.disk_hits, nonempty);
        assert_int_equal(st.disk_degraded, 0);
        assert_true(count_files(dir, "corrupt") >= 1);
        sluice_cache *ca = NULL;
        assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
        uint64_t bytes = 0, entries = 0;
        assert_int_equal(sluice_cache_usage(ca, &bytes, &entries), SLUICE_OK);
        assert_int_equal(entries, nonempty);
        sluice_cache_close(ca);
        free(wal);
        free(shm);
        free(db);
        drop_cache(dir);
    }
}

/* A cache that cannot be written (a full disk, a read-only file system,
 * by the fault hook): the load succeeds uncached, with one warning. */
static void test_degraded(void **state)
{
    (void)state;
    static const char *const faults[] = {"enospc@1", "enospc@3", "erofs"};
    for (size_t k = 0; k < sizeof faults / sizeof *faults; k++) {
        char *dir = fresh_cache();
        sluice_options o = cached_opts(dir);
        setenv("SLUICE_TEST_CACHE_FAULT", faults[k], 1);
        sluice_model *m = open_ok(url, &o);
        check_ctx c = {0};
        sluice_stream(m, NULL, 0, check_cb, &c);
        struct sluice_stats st = {.size = sizeof st};
        sluice_stats(m, &st);
        const char *w = sluice_cache_warning(m);
        assert_non_null(w);
        fprintf(stderr, "  %s: %s\n", faults[k], w);
        assert_int_equal(st.disk_degraded, 1);
        assert_int_equal(c.failed, 0);
        assert_int_equal(c.delivered, ntensors);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        unsetenv("SLUICE_TEST_CACHE_FAULT");
        assert_int_equal(count_files(dir, "tmp"), 0);   /* no partial fill left */
        /* later opens without the fault cache again */
        struct sluice_stats again = load_all(url, &o, &c);
        assert_int_equal(again.disk_degraded, 0);
        assert_int_equal(c.failed, 0);
        drop_cache(dir);
    }
}

/* The same on real file systems, where the machine lets the test mount
 * them (root, mounts allowed; else it says so and skips): tmpfs mounts of
 * a few sizes that fill up during the load, so that the full disk is met
 * by a blob's write on some and by SQLite's journal on others (which one
 * depends on the machine), and a read-only tmpfs. What is asserted is the
 * behaviour: every tensor delivered, the cache turned off, nothing left in
 * tmp/, and a warning that names the cache and says the disk is full
 * (the library says "the disk is full" whichever layer met it). */
static void test_degraded_real(void **state)
{
    (void)state;
    static const char *const how[] = {"size=96k", "size=128k", "size=192k", "size=256k",
                                      "size=320k", "size=384k", "ro,size=1m"};
    const size_t nhow = sizeof how / sizeof how[0];
    for (size_t k = 0; k < nhow; k++) {
        int ro = k == nhow - 1;
        char *mnt = tu_tmpdir(), cmd[1024];
        snprintf(cmd, sizeof cmd, "mount -t tmpfs -o %s sluice-test '%s' 2>/dev/null", how[k], mnt);
        if (system(cmd) != 0) {
            fprintf(stderr, "  no tmpfs mount here (%s): the fault hook's test stands in\n",
                    how[k]);
            tu_rmtree(mnt);
            free(mnt);
            skip();
        }
        sluice_options o = cached_opts(mnt);
        sluice_model *m = NULL;
        int rc = sluice_open(url, &o, &m);
        check_ctx c = {0};
        struct sluice_stats st = {.size = sizeof st};
        char warning[512] = "";
        if (rc == SLUICE_OK) {
            sluice_stream(m, NULL, 0, check_cb, &c);
            sluice_stats(m, &st);
            snprintf(warning, sizeof warning, "%s",
                     sluice_cache_warning(m) ? sluice_cache_warning(m) : "");
        }
        sluice_close(m);
        size_t tmp_left = count_files(mnt, "tmp");
        char named[600];
        snprintf(named, sizeof named, "cache %s: turned off: ", mnt);
        snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
        assert_int_equal(system(cmd), 0);
        tu_rmtree(mnt);
        free(mnt);
        fprintf(stderr, "  tmpfs %s: %s (%llu blobs stored first)\n", how[k], warning,
                (unsigned long long)st.disk_stored);
        assert_int_equal(rc, SLUICE_OK);
        assert_int_equal(c.failed, 0);
        assert_int_equal(c.delivered, ntensors);
        assert_int_equal(st.disk_degraded, 1);
        assert_non_null(strstr(warning, named));
        if (ro)
            assert_non_null(strstr(warning, "Read-only"));
        else if (!strstr(warning, "No space left") && !strstr(warning, "disk is full"))
            fail_msg("tmpfs %s: the warning does not say the disk is full: %s", how[k], warning);
        assert_int_equal(tmp_left, 0);
    }
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_stall(int sig)
{
    (void)sig;
    static const char msg[] = "a load stalled on the locked index\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(1);
}

/* Another connection holds index.sqlite's write lock (BEGIN IMMEDIATE, as
 * a `sqlite3` shell would) for a whole cold load: the load takes about as
 * long as one without the lock (each store waits 100 ms at most, then
 * none for a second), every tensor is delivered, the cache stays on with
 * one note, and disk_busy counts the writes put off. Nothing is left
 * outside the index at close; once the lock is let go, a load stores. */
static void test_index_locked(void **state)
{
    (void)state;
#ifndef SLUICE_HAVE_SQLITE
    skip();
#else
    char *dir = fresh_cache();
    sluice_options o = cached_opts(dir);
    check_ctx c;
    double t0 = mono_s();
    struct sluice_stats free_run = load_all(url, &o, &c);   /* the lock free: the yardstick */
    double unlocked = mono_s() - t0;
    assert_int_equal(free_run.disk_stored, nonempty);
    assert_int_equal(free_run.disk_busy, 0);
    sluice_cache *ca = NULL;
    assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
    assert_int_equal(sluice_cache_clear(ca, NULL, NULL), SLUICE_OK);
    sluice_cache_close(ca);

    char *index = tu_join(dir, "index.sqlite");
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    signal(SIGALRM, on_stall);
    alarm(60);   /* unfixed, each of the 39 stores waited 5 s */
    t0 = mono_s();
    sluice_options lo = o;
    lo.metrics_label = "locked";
    sluice_model *m = open_ok(url, &lo);
    memset(&c, 0, sizeof c);
    sluice_stream(m, NULL, 0, check_cb, &c);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    char note[512];
    snprintf(note, sizeof note, "%s", sluice_cache_warning(m) ? sluice_cache_warning(m) : "");
    static char text[1 << 16];
    assert_int_equal(sluice_metrics_write(m, text, sizeof text, NULL, SLUICE_METRICS_PROMETHEUS),
                     SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    double locked = mono_s() - t0;
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    fprintf(stderr, "  cold load %.3f s with the index free, %.3f s with its write lock held "
            "elsewhere; disk_busy %llu, stored %llu; note: %s\n", unlocked, locked,
            (unsigned long long)st.disk_busy, (unsigned long long)st.disk_stored, note);
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.delivered, ntensors);
    assert_true(locked < unlocked + 1.5);
    assert_int_equal(st.disk_degraded, 0);
    assert_true(st.disk_busy >= 1);
    assert_int_equal(st.disk_stored, 0);
    assert_non_null(strstr(note, dir));
    assert_non_null(strstr(note, "write lock"));
    char line[128];
    snprintf(line, sizeof line, "sluice_disk_cache_busy_total{model=\"locked\"} %llu\n",
             (unsigned long long)st.disk_busy);
    assert_non_null(strstr(text, line));
    /* nothing waits outside the index once the model is closed */
    assert_int_equal(count_files(dir, "blobs"), 0);
    assert_int_equal(count_files(dir, "tmp"), 0);

    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    st = load_all(url, &o, &c);   /* the lock let go: stored */
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.disk_stored, nonempty);
    assert_int_equal(st.disk_busy, 0);
    assert_int_equal(count_files(dir, "blobs"), nonempty);

    /* the lock held while a load streams, let go before it closes: the
     * blobs that waited are recorded at close, none lost */
    assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
    assert_int_equal(sluice_cache_clear(ca, NULL, NULL), SLUICE_OK);
    sluice_cache_close(ca);
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    m = open_ok(url, &o);
    memset(&c, 0, sizeof c);
    sluice_stream(m, NULL, 0, check_cb, &c);
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_int_equal(c.failed, 0);
    assert_true(st.disk_busy >= 1);
    uint64_t bytes = 0, entries = 0;
    assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
    assert_int_equal(sluice_cache_usage(ca, &bytes, &entries), SLUICE_OK);
    sluice_cache_close(ca);
    assert_int_equal(entries, nonempty);
    assert_int_equal(count_files(dir, "blobs"), nonempty);
    st = load_all(url, &o, &c);
    assert_int_equal(st.disk_hits, nonempty);
    free(index);
    drop_cache(dir);
#endif
}

/* SIGKILL at the Nth step of the fills (temporary file, writes, fsync,
 * rename, directory fsync, insert), then a fresh open: leftovers cleaned,
 * no partial blob ever served, every byte right. */
static void test_sigkill_fills(void **state)
{
    (void)state;
    /* 39 fills of about 6 steps each (every tensor here is one write) */
    static const int points[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 60, 121, 180, 229};
    for (size_t k = 0; k < sizeof points / sizeof *points; k++) {
        int n = points[k];
        char *dir = fresh_cache();
        sluice_options o = cached_opts(dir);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char f[32];
            snprintf(f, sizeof f, "kill@%d", n);
            setenv("SLUICE_TEST_CACHE_FAULT", f, 1);
            sluice_model *m = NULL;
            if (sluice_open(url, &o, &m) != SLUICE_OK)
                _exit(3);
            check_ctx c = {0};
            sluice_stream(m, NULL, 0, check_cb, &c);
            sluice_close(m);
            _exit(0);
        }
        int wst = 0;
        assert_int_equal(waitpid(pid, &wst, 0), pid);
        assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
        /* every file in blobs/ is whole: gc records any that lacks an
         * entry, verify rehashes them all and drops none */
        sluice_cache *ca = NULL;
        assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
        assert_int_equal(sluice_cache_gc(ca, UINT64_MAX, NULL, NULL), SLUICE_OK);
        uint64_t checked = 0, dropped = 0;
        assert_int_equal(sluice_cache_verify(ca, &checked, &dropped, NULL, NULL), SLUICE_OK);
        sluice_cache_close(ca);
        assert_int_equal(dropped, 0);
        check_ctx c;
        struct sluice_stats st = load_all(url, &o, &c);
        assert_int_equal(c.failed, 0);
        assert_int_equal(c.delivered, ntensors);
        assert_int_equal(st.disk_rotten, 0);          /* nothing partial was there */
        assert_int_equal(st.disk_hits + st.disk_misses, nonempty);
        assert_int_equal(count_files(dir, "tmp"), 0); /* the dead child's fill is gone */
        st = load_all(url, &o, &c);
        assert_int_equal(st.disk_hits, nonempty);
        drop_cache(dir);
    }
}

static uint64_t total_bytes(void);
static char *blob_path_of(const char *dir, const uint8_t d[32]);

/* Four processes open the model at once on one cold cache. */
static void test_processes(void **state)
{
    (void)state;
    enum { P = 4 };
    char *dir = fresh_cache();
    sluice_options o = cached_opts(dir);
    int fds[P][2];
    pid_t pids[P];
    size_t before = rf_requests(&nginx);
    for (int p = 0; p < P; p++) {
        assert_int_equal(pipe(fds[p]), 0);
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            check_ctx c;
            struct sluice_stats st = load_all(url, &o, &c);
            uint64_t out[3] = {st.remote_bytes, st.disk_hits, c.failed || c.delivered != ntensors};
            if (write(fds[p][1], out, sizeof out) != sizeof out)
                _exit(2);
            _exit(0);
        }
        close(fds[p][1]);
    }
    uint64_t reads = 0, hits = 0;
    for (int p = 0; p < P; p++) {
        uint64_t in[3];
        assert_int_equal(read(fds[p][0], in, sizeof in), sizeof in);
        close(fds[p][0]);
        int wst;
        assert_int_equal(waitpid(pids[p], &wst, 0), pids[p]);
        assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
        assert_int_equal(in[2], 0);
        reads += in[0];
        hits += in[1];
    }
    size_t server = rf_requests(&nginx) - before;
    uint64_t total = total_bytes();
    fprintf(stderr, "  %d processes at once: %llu tensor bytes fetched for %llu in the model "
            "(each byte %.2f times; at most %d), %llu blob hits, %zu server requests in all\n",
            P, (unsigned long long)reads, (unsigned long long)total,
            (double)reads / (double)total, P, (unsigned long long)hits, server);
    assert_true(reads <= (uint64_t)P * total);
    check_ctx c;
    struct sluice_stats st = load_all(url, &o, &c);
    assert_int_equal(st.disk_hits, nonempty);
    assert_int_equal(st.remote_reads, 0);
    drop_cache(dir);
}

/* Threads of one process, each with its own model on one cache (TSan). */
typedef struct thread_arg {
    const char *dir;
    size_t failed;
} thread_arg;

static void *thread_load(void *p)
{
    thread_arg *a = p;
    sluice_options o = cached_opts(a->dir);
    /* The pread backend: rings made and unmapped on several threads reuse
     * addresses that ThreadSanitizer never saw unmapped (liburing maps
     * them by system call), which it reports as races in the rings. */
    o.flags |= SLUICE_F_FORCE_PREAD;
    for (int k = 0; k < 2; k++) {
        sluice_model *m = NULL;
        if (sluice_open(url, &o, &m) != SLUICE_OK) {
            a->failed++;
            sluice_close(m);
            continue;
        }
        check_ctx c = {0};
        sluice_stream(m, NULL, 0, check_cb, &c);
        a->failed += c.failed + (c.delivered != ntensors);
        sluice_close(m);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    enum { T = 4 };
    char *dir = fresh_cache();
    pthread_t th[T];
    thread_arg a[T];
    for (int t = 0; t < T; t++) {
        a[t] = (thread_arg){dir, 0};
        assert_int_equal(pthread_create(&th[t], NULL, thread_load, &a[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(a[t].failed, 0);
    }
    drop_cache(dir);
}

/* ---------------------------------------------------------------- one probe */

/* A blob that appears (another process stored it) between the
 * scheduler's probe of a tensor, which found none and grouped it with its
 * neighbour's read from the server, and the start of its load: the load
 * is the server's read, never taken for a read of the blob (no hit is
 * counted, and the blob stays). The pause hook at a blob's miss (where 7)
 * puts the blob in place at the first miss of that tensor. */
typedef struct appear_ctx {
    sluice_model *m;
    size_t tensor;
    int done, misses;
    const char *dir, *path, *tmp;
    const void *bytes;
    size_t len;
} appear_ctx;

static void appear_at_miss(void *ctx, int where)
{
    appear_ctx *a = ctx;
    if (where != 7 || sl_engine_pause_tensor(a->m) != a->tensor)
        return;
    a->misses++;
    if (a->done)
        return;
    a->done = 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", a->path);
    if (system(cmd) != 0)
        abort();
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, a->bytes, a->len) != (ssize_t)a->len || close(fd) != 0 ||
        rename(a->tmp, a->path) != 0)
        abort();
}

static void test_one_probe_per_start(void **state)
{
    (void)state;
    /* a small tensor right after another small one, neither the first */
    sluice_options plain;
    sluice_options_init(&plain);
    sluice_model *lm = open_ok(model, &plain);
    size_t g = SIZE_MAX;
    struct sluice_tensor_info prev = SLUICE_TENSOR_INFO_INIT, tg = SLUICE_TENSOR_INFO_INIT;
    for (size_t i = 0; i < ntensors && g == SIZE_MAX; i++) {
        struct sluice_tensor_info x = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(lm, i, &x), SLUICE_OK);
        if (i >= 2 && x.nbytes && x.nbytes <= 8192 && prev.nbytes && prev.nbytes <= 8192 &&
            prev.offset + prev.nbytes == x.offset) {
            g = i;
            tg = x;
        }
        prev = x;
    }
    if (g == SIZE_MAX) {
        sluice_close(lm);
        skip();
    }
    sluice_tensor *t = NULL;
    uint8_t d[32];
    assert_int_equal(sluice_acquire_index(lm, g, &t), SLUICE_OK);
    assert_int_equal(sluice_tensor_digest(t, d), SLUICE_OK);
    sluice_release(t);
    struct sluice_tensor_info t0 = SLUICE_TENSOR_INFO_INIT, tp = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(lm, 0, &t0), SLUICE_OK);
    assert_int_equal(sluice_info(lm, g - 1, &tp), SLUICE_OK);
    char *names[3] = {strdup(t0.name), strdup(tp.name), strdup(tg.name)};
    sluice_close(lm);

    char *dir = fresh_cache();
    char *path = blob_path_of(dir, d), *tmp = tu_join(dir, "appearing");
    void *bytes = tu_pread_range(model, tg.offset, (size_t)tg.nbytes);
    sluice_options o = cached_opts(dir);
    sluice_model *m = open_ok(url, &o);
    appear_ctx a = {m, g, 0, 0, dir, path, tmp, bytes, (size_t)tg.nbytes};
    assert_int_equal(sl_engine_set_pause(m, appear_at_miss, &a), SLUICE_OK);
    /* the first alone (the stream's head), the other two in one read */
    check_ctx c = {0};
    sluice_stream(m, (const char *const *)names, 3, check_cb, &c);
    sl_engine_set_pause(m, NULL, NULL);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    fprintf(stderr, "  blob of tensor %zu put in place at its miss: %d probes missed it, "
            "%llu hits, %llu misses, %llu remote reads\n", g, a.misses,
            (unsigned long long)st.disk_hits, (unsigned long long)st.disk_misses,
            (unsigned long long)st.remote_reads);
    assert_int_equal(a.done, 1);
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.delivered, 3);
    assert_int_equal(a.misses, 1);      /* one probe per start */
    assert_int_equal(st.disk_hits, 0);  /* every byte came from the server */
    assert_int_equal(st.disk_misses, 3);
    assert_int_equal(st.disk_rotten, 0);
    assert_int_equal(st.remote_reads, 2);  /* the head, then the group */
    size_t len = 0;
    void *kept = tu_read_file(path, &len);   /* the blob is still there, whole */
    assert_non_null(kept);
    assert_int_equal(len, tg.nbytes);
    assert_memory_equal(kept, bytes, len);
    free(kept);
    free(bytes);
    free(path);
    free(tmp);
    for (int k = 0; k < 3; k++)
        free(names[k]);
    drop_cache(dir);
}

/* ---------------------------------------------------------------- memo */

/* The memo's tests need the model on a file system whose times the memo
 * trusts (setup looked for one): else skipped, saying why. */
#define NEED_MEMO()                                                                          \
    do {                                                                                     \
        if (memo_why[0]) {                                                                   \
            fprintf(stderr, "  skipped: no file system here that the memo trusts (%s)\n",    \
                    memo_why);                                                               \
            skip();                                                                          \
        }                                                                                    \
    } while (0)

static struct sluice_stats memo_load(const char *dir, uint32_t flags, const char *manifest,
                                     check_ctx *c)
{
    sluice_options o = cached_opts(dir);
    o.flags |= flags;
    o.manifest_path = manifest;
    return load_all(model, &o, c);
}

static uint64_t total_bytes(void)
{
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = open_ok(model, &o);
    uint64_t total = 0;
    for (size_t i = 0; i < ntensors; i++) {
        struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
        sluice_info(m, i, &ti);
        total += ti.nbytes;
    }
    sluice_close(m);
    return total;
}

/* Rewrites the file in place with the same bytes (a write; mtime and
 * ctime move, the inode stays). */
static void rewrite_in_place(const char *path)
{
    size_t len;
    void *p = tu_read_file(path, &len);
    assert_non_null(p);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, p, len, 0), (ssize_t)len);
    close(fd);
    free(p);
}

/* After a change to the file, once it is a second old: the next load
 * hashes everything (and records), the one after is all memo. */
static void expect_rehashed_then_memo(const char *dir, uint64_t total)
{
    check_ctx c;
    sleep_ms(1100);
    struct sluice_stats st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.memo_tensors, 0);
    assert_int_equal(st.bytes_hashed, total);
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.memo_tensors, nonempty);
    assert_int_equal(st.bytes_hashed, 0);
}

static void test_memo(void **state)
{
    (void)state;
    NEED_MEMO();
    char *dir = fresh_cache();
    uint64_t total = total_bytes();
    check_ctx c;

    /* first load: hashed, and recorded */
    struct sluice_stats st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.memo_tensors, 0);
    assert_int_equal(st.bytes_hashed, total);
    /* second: nothing hashed, bytes still right, digests still reported */
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.memo_tensors, nonempty);
    assert_int_equal(st.memo_bytes, total);
    assert_int_equal(st.bytes_hashed, 0);
    /* without the flag, or with HASH_ALL, everything is hashed */
    st = memo_load(dir, 0, NULL, &c);
    assert_int_equal(st.memo_tensors, 0);
    assert_int_equal(st.bytes_hashed, total);
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED | SLUICE_F_HASH_ALL, NULL, &c);
    assert_int_equal(st.memo_tensors, 0);

    /* touch: identity changed, hashed again; too fresh to be recorded */
    assert_int_equal(utimes(model, NULL), 0);
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(st.memo_tensors, 0);
    assert_int_equal(st.bytes_hashed, total);
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(st.memo_tensors, 0);       /* it was not recorded */
    sleep_ms(1100);
    memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);   /* recorded now */
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(st.memo_tensors, nonempty);

    /* a rewrite in place (same bytes, same inode) */
    rewrite_in_place(model);
    expect_rehashed_then_memo(dir, total);

    /* a copy renamed over it (another inode) */
    char *copy = tu_join(root, "m/model.copy");
    size_t len;
    void *p = tu_read_file(model, &len);
    tu_write_file(copy, p, len);
    free(p);
    assert_int_equal(rename(copy, model), 0);
    free(copy);
    expect_rehashed_then_memo(dir, total);

    /* another manifest: BLAKE3 digests, which the memo never saw */
    char *mf3 = tu_join(dir, "blake3.manifest.json");
    run_result r = run(root, "manifest", model, "--algorithm", "blake3", "-o", mf3, NULL);
    if (r.status == 0) {
        st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, mf3, &c);
        assert_int_equal(c.failed, 0);
        assert_int_equal(st.memo_tensors, 0);
        assert_int_equal(st.bytes_hashed, total);
    }
    run_free(&r);
    free(mf3);
    /* a manifest whose digest of one tensor differs: that one is hashed
     * (and fails), the memo does not vouch for it */
    char *mfpath = tu_join(root, "m/model.safetensors.manifest.json");
    size_t mlen;
    char *text = tu_read_file(mfpath, &mlen);
    assert_non_null(text);
    char *d = strstr(text, "\"digest\": \"");
    int spaced = d != NULL;
    if (!d)
        d = strstr(text, "\"digest\":\"");
    assert_non_null(d);
    d += spaced ? 11 : 10;
    *d = *d == '0' ? '1' : '0';
    char *bad = tu_join(dir, "bad.manifest.json");
    tu_write_file(bad, text, mlen);
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, bad, &c);
    assert_int_equal(c.failed, 1);
    assert_int_equal(c.first_failure, SLUICE_E_CHECKSUM);
    assert_int_equal(st.memo_tensors, nonempty - 1);
    free(bad);
    free(text);
    free(mfpath);
    drop_cache(dir);
}

/* The memo recorded in a fresh cache *dir (a load a second after the
 * file's last change), then an open with the flag that finds it; *ti
 * gets the last tensor's description. */
static sluice_model *open_memo_warm(char **dir, struct sluice_tensor_info *ti)
{
    check_ctx c;
    *dir = fresh_cache();
    sleep_ms(1100);
    memo_load(*dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    sluice_options o = cached_opts(*dir);
    o.flags |= SLUICE_F_TRUST_UNCHANGED;
    sluice_model *m = open_ok(model, &o);
    assert_int_equal(sluice_info(m, ntensors - 1, ti), SLUICE_OK);
    return m;
}

/* A file changed after the open that found the memo: the load compares
 * the identity again and hashes (here: catches the flipped byte). */
static void test_memo_changed_after_open(void **state)
{
    (void)state;
    NEED_MEMO();
    char *dir;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_model *m = open_memo_warm(&dir, &ti);
    size_t last = ntensors - 1;
    flip_byte(model, (off_t)ti.offset);
    sluice_tensor *t = NULL;
    assert_int_equal(sluice_acquire_index(m, last, &t), SLUICE_E_CHECKSUM);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(st.memo_tensors, 0);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    flip_byte(model, (off_t)ti.offset);   /* put it back */
    drop_cache(dir);
}

/* Options: cache_bytes 0 is refused; the flag alone works (no cache named:
 * the default directory, here under a temporary XDG_CACHE_HOME). */
static void test_options(void **state)
{
    (void)state;
    sluice_options o;
    sluice_options_init(&o);
    assert_int_equal(o.cache_bytes, SLUICE_CACHE_DEFAULT_BYTES);
    o.cache_bytes = 0;
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(model, &o, &m), SLUICE_E_INVAL);
    assert_non_null(strstr(sluice_errmsg(m), "cache_bytes"));
    sluice_close(m);

    char *xdg = tu_tmpdir();
    setenv("XDG_CACHE_HOME", xdg, 1);
    unsetenv("SLUICE_CACHE_DIR");
    sluice_options_init(&o);
    o.flags = SLUICE_F_TRUST_UNCHANGED;
    check_ctx c;
    load_all(model, &o, &c);
    char *made = tu_join(xdg, "sluice/index.sqlite");
    assert_int_equal(access(made, F_OK), 0);
    free(made);
    unsetenv("XDG_CACHE_HOME");
    tu_rmtree(xdg);
    free(xdg);
}


/* ---------------------------------------------------------------- descriptors and hostile blobs */

/* Every tensor's digest (a load through the cache at dir, which stores
 * them all). */
static uint8_t (*digests_via(const char *dir))[32]
{
    sluice_options o = cached_opts(dir);
    sluice_model *m = open_ok(url, &o);
    uint8_t (*d)[32] = calloc(ntensors, sizeof *d);
    assert_non_null(d);
    for (size_t i = 0; i < ntensors; i++) {
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        if (sluice_tensor_size(t))
            assert_int_equal(sluice_tensor_digest(t, d[i]), SLUICE_OK);
        sluice_release(t);
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return d;
}

static char *blob_path_of(const char *dir, const uint8_t d[32])
{
    char hex[65];
    for (int k = 0; k < 32; k++)
        snprintf(hex + 2 * k, 3, "%02x", d[k]);
    size_t n = strlen(dir) + 100;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/blobs/sha256/%.2s/%s", dir, hex, hex);
    return p;
}

/* Descriptors of this process open on files under dir. */
static size_t fds_under(const char *dir)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    size_t n = 0, len = strlen(dir);
    struct dirent *x;
    while ((x = readdir(d))) {
        char link[300], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%s", x->d_name);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k <= 0)
            continue;
        target[k] = '\0';
        n += !strncmp(target, dir, len) && strstr(target, "/blobs/");
    }
    closedir(d);
    return n;
}

/* A blob's descriptor lives while its load does: a tensor that only had
 * its blob looked at (next to a tensor read from the server) holds none
 * once nothing is loading. */
static void test_blob_fds_bounded(void **state)
{
    (void)state;
    char *dir = fresh_cache();
    uint8_t (*d)[32] = digests_via(dir);
    /* even tensors lose their blob: each is fetched, its neighbour has one */
    size_t gone = 0;
    for (size_t i = 0; i < ntensors; i += 2) {
        char *p = blob_path_of(dir, d[i]);
        gone += unlink(p) == 0;
        free(p);
    }
    assert_true(gone > 4);
    sluice_options o = cached_opts(dir);
    sluice_model *m = open_ok(url, &o);
    for (size_t i = 0; i < ntensors; i += 2) {
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        sluice_release(t);
    }
    size_t held = fds_under(dir);
    /* the odd ones now, read from their blobs */
    for (size_t i = 1; i < ntensors; i += 2) {
        sluice_tensor *t = NULL;
        assert_int_equal(sluice_acquire_index(m, i, &t), SLUICE_OK);
        sluice_release(t);
    }
    held += fds_under(dir);
    fprintf(stderr, "  blob descriptors held with nothing loading: %zu\n", held);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_int_equal(held, 0);
    assert_int_equal(st.disk_misses, gone);
    assert_int_equal(fds_under(dir), 0);
    free(d);
    drop_cache(dir);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "hung on a hostile cache directory\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(1);
}

static void verify_seen(void *user, const sluice_cache_entry *e, const char *why)
{
    (void)e;
    (void)why;
    ++*(size_t *)user;
}

/* Blob paths that are a FIFO, a directory, a symbolic link: each is a
 * miss (never a hang, never served), the load succeeds, and verify gets
 * through them too. */
static void test_hostile_blobs(void **state)
{
    (void)state;
    char *dir = fresh_cache();
    uint8_t (*d)[32] = digests_via(dir);
    size_t made = 0;
    for (size_t i = 0; i < ntensors && made < 3; i++) {
        char *p = blob_path_of(dir, d[i]);
        if (unlink(p) == 0) {
            int rc = made == 0 ? mkfifo(p, 0644) : made == 1 ? mkdir(p, 0755) : symlink(model, p);
            assert_int_equal(rc, 0);
            made++;
        }
        free(p);
    }
    assert_int_equal(made, 3);
    signal(SIGALRM, on_alarm);
    alarm(60);
    sluice_options o = cached_opts(dir);
    check_ctx c;
    struct sluice_stats st = load_all(url, &o, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.delivered, ntensors);
    assert_int_equal(st.disk_hits, nonempty - 3);
    assert_int_equal(st.disk_rotten, 0);
    /* the fills replaced the FIFO and the link: a FIFO again, for verify */
    char *p = blob_path_of(dir, d[ntensors - 1]);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0644), 0);
    free(p);
    sluice_cache *ca = NULL;
    assert_int_equal(sluice_cache_open(dir, &ca), SLUICE_OK);
    uint64_t checked = 0, dropped = 0;
    size_t told = 0;
    assert_int_equal(sluice_cache_verify(ca, &checked, &dropped, verify_seen, &told), SLUICE_OK);
    assert_true(told >= 1);   /* the FIFO, reported (and kept: it could not be read) */
    sluice_cache_close(ca);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    free(d);
    drop_cache(dir);
}

/* A pool that holds a few tensors at a time: starts that find no room are
 * tried again, and each load is still one miss (cold) or one hit (warm). */
static void test_small_pool_counts(void **state)
{
    (void)state;
    char *dir = fresh_cache();
    sluice_options o = cached_opts(dir);
    o.pool_bytes = 192u << 10;
    check_ctx c;
    struct sluice_stats st = load_all(url, &o, &c);
    fprintf(stderr, "  cold: misses %llu stored %llu loaded %llu\n",
            (unsigned long long)st.disk_misses, (unsigned long long)st.disk_stored,
            (unsigned long long)st.tensors_loaded);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.disk_misses, nonempty);
    assert_int_equal(st.disk_stored, nonempty);
    st = load_all(url, &o, &c);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.disk_hits, nonempty);
    assert_int_equal(st.disk_misses, 0);
    drop_cache(dir);
}

/* A write to the file while a tensor the memo vouches for is being read
 * (after its load started and compared the identity): the identity is
 * compared again once the bytes are in, and the tensor is hashed. */
typedef struct flip_ctx {
    int armed;
    off_t at;
} flip_ctx;

static void flip_when_started(void *ctx, int where)
{
    flip_ctx *f = ctx;
    if (where != 6 || !f->armed)   /* a load started (engine_hooks.h) */
        return;
    f->armed = 0;
    flip_byte(model, f->at);
}

static void test_memo_changed_while_read(void **state)
{
    (void)state;
    NEED_MEMO();
    char *dir;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_model *m = open_memo_warm(&dir, &ti);
    size_t last = ntensors - 1;
    flip_ctx f = {1, (off_t)ti.offset};
    assert_int_equal(sl_engine_set_pause(m, flip_when_started, &f), SLUICE_OK);
    sluice_tensor *t = NULL;
    int rc = sluice_acquire_index(m, last, &t);
    assert_int_equal(f.armed, 0);
    if (rc == SLUICE_OK)
        sluice_release(t);
    sl_engine_set_pause(m, NULL, NULL);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    flip_byte(model, f.at);   /* put it back */
    assert_int_equal(rc, SLUICE_E_CHECKSUM);
    assert_int_equal(st.memo_tensors, 0);
    drop_cache(dir);
}

/* A shared mapping of the page of path that holds byte off; *at points
 * at that byte. munmap(*base, pagesize) ends it. */
static unsigned char *map_page(const char *path, off_t off, volatile unsigned char **at)
{
    long pg = sysconf(_SC_PAGESIZE);
    off_t start = off / pg * pg;
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char *p = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, start);
    close(fd);
    assert_true(p != MAP_FAILED);
    *at = p + (off - start);
    return p;
}

/* An open with the flag, its stats after streaming everything, and its
 * cache warning (copied into warning). */
static struct sluice_stats memo_load_warned(const char *path, const char *dir, check_ctx *c,
                                            char *warning, size_t wlen)
{
    sluice_options o = cached_opts(dir);
    o.flags |= SLUICE_F_TRUST_UNCHANGED;
    sluice_model *m = open_ok(path, &o);
    memset(c, 0, sizeof *c);
    sluice_stream(m, NULL, 0, check_cb, c);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    const char *w = sluice_cache_warning(m);
    snprintf(warning, wlen, "%s", w ? w : "");
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return st;
}

/* tmpfs (here a real mount, else /dev/shm): a byte read through a shared
 * mapping and written back changed leaves mtime and ctime as they were
 * (issue 25, item 14), so the memo never records nor trusts a file there
 * and says so; the changed byte fails its digest, from the library and
 * from `sluice cat --trust-unchanged`. */
static void test_memo_refused_on_tmpfs(void **state)
{
    (void)state;
    char *mnt = tu_tmpdir(), cmd[1024];
    int mounted = 0;
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=16m sluice-test '%s' 2>/dev/null", mnt);
    char *base = NULL;
    if (system(cmd) == 0) {
        mounted = 1;
        base = strdup(mnt);
    } else if (access("/dev/shm", W_OK) == 0) {
        base = tu_tmpdir();   /* only for its unique name */
        char *shm = tu_join("/dev/shm", strrchr(base, '/') + 1);
        tu_rmtree(base);
        free(base);
        base = shm;
        if (mkdir(base, 0755) != 0) {
            free(base);
            base = NULL;
        }
    }
    if (!base) {
        fprintf(stderr, "  no tmpfs here (mount refused, no /dev/shm): skipped\n");
        tu_rmtree(mnt);
        free(mnt);
        skip();
    }
    fprintf(stderr, "  tmpfs at %s (%s)\n", base, mounted ? "mounted" : "/dev/shm");
    /* the model and its sidecar copied there */
    char *copy = tu_join(base, "model.safetensors");
    char *side = tu_join(base, "model.safetensors.manifest.json");
    char *mf = tu_join(root, "m/model.safetensors.manifest.json");
    size_t len;
    void *p = tu_read_file(model, &len);
    tu_write_file(copy, p, len);
    free(p);
    p = tu_read_file(mf, &len);
    tu_write_file(side, p, len);
    free(p);
    char *saved = model;
    model = copy;   /* check_cb compares with this file */
    char *dir = fresh_cache();
    sleep_ms(1100);
    uint64_t total = total_bytes();
    /* two loads (the second would be all memo had the first recorded),
     * then the sequence of the report: the byte read through the mapping
     * and written back changed; then the same with `sluice cat`. Results
     * first, checked after the clean-up (the mount must not outlive a
     * failure). */
    check_ctx c[3];
    struct sluice_stats st[3];
    char warning[3][1024];
    for (int k = 0; k < 2; k++)
        st[k] = memo_load_warned(copy, dir, &c[k], warning[k], sizeof warning[k]);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = open_ok(copy, &o);
    sluice_info(m, ntensors - 1, &ti);
    char *name = strdup(ti.name);
    sluice_close(m);
    struct stat before, after;
    stat(copy, &before);
    volatile unsigned char *at;
    unsigned char *page = map_page(copy, (off_t)ti.offset, &at);
    unsigned char was = *at;
    *at = was ^ 1;
    stat(copy, &after);
    int times_moved = before.st_ctim.tv_sec != after.st_ctim.tv_sec ||
                      before.st_ctim.tv_nsec != after.st_ctim.tv_nsec;
    st[2] = memo_load_warned(copy, dir, &c[2], warning[2], sizeof warning[2]);
    run_result r = run(base, "cat", copy, name, "--trust-unchanged", "--cache-dir", dir, NULL);
    *at = was;
    munmap(page, (size_t)sysconf(_SC_PAGESIZE));
    model = saved;
    if (mounted) {
        snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
        if (system(cmd) != 0)
            fprintf(stderr, "  %s failed\n", cmd);
    } else {
        tu_rmtree(base);
    }
    tu_rmtree(mnt);
    tu_rmtree(dir);
    fprintf(stderr, "  warning: %s\n  mapped write on tmpfs: ctime %s; cat --trust-unchanged "
            "exit %d\n", warning[0], times_moved ? "moved" : "unchanged", r.status);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(c[k].failed, k == 2);
        assert_int_equal(st[k].memo_tensors, 0);
        assert_int_equal(st[k].disk_degraded, 0);   /* the cache works; the memo stands aside */
        assert_non_null(strstr(warning[k], "memo not used"));
        assert_non_null(strstr(warning[k], "on tmpfs"));
        assert_non_null(strstr(warning[k], copy));
    }
    assert_int_equal(st[0].bytes_hashed, total);
    assert_int_equal(st[1].bytes_hashed, total);
    assert_int_equal(c[2].first_failure, SLUICE_E_CHECKSUM);
    assert_int_equal(r.status, 1);
    assert_int_equal(r.out_len, 0);
    assert_non_null(strstr(r.err, "memo not used"));
    run_free(&r);
    free(mnt);
    free(base);
    free(dir);
    free(copy);
    free(side);
    free(mf);
    free(name);
}

/* overlayfs (a container's root), the upper layer on the test's own file
 * system: refused too, since its times are the file's below and its
 * dirty pages cannot be written back through the overlay. */
static void test_memo_refused_on_overlayfs(void **state)
{
    (void)state;
    char *base = tu_tmpdir(), cmd[4096];
    char *lower = tu_join(base, "lower"), *upper = tu_join(base, "upper");
    char *work = tu_join(base, "work"), *merged = tu_join(base, "merged");
    mkdir(lower, 0755);
    mkdir(upper, 0755);
    mkdir(work, 0755);
    mkdir(merged, 0755);
    static const char *const names[] = {"model.safetensors", "model.safetensors.manifest.json"};
    char *mf = tu_join(root, "m/model.safetensors.manifest.json");
    const char *from[] = {model, mf};
    for (int k = 0; k < 2; k++) {
        size_t len;
        void *p = tu_read_file(from[k], &len);
        char *to = tu_join(lower, names[k]);
        tu_write_file(to, p, len);
        free(p);
        free(to);
    }
    free(mf);
    snprintf(cmd, sizeof cmd, "mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s "
             "'%s' 2>/dev/null", lower, upper, work, merged);
    if (system(cmd) != 0) {
        fprintf(stderr, "  no overlay mount here: skipped\n");
        tu_rmtree(base);
        free(base);
        free(lower);
        free(upper);
        free(work);
        free(merged);
        skip();
    }
    char *copy = tu_join(merged, "model.safetensors");
    char *saved = model;
    model = copy;
    char *dir = fresh_cache();
    sleep_ms(1100);
    check_ctx c[2];
    struct sluice_stats st[2];
    char warning[2][1024];
    for (int k = 0; k < 2; k++)
        st[k] = memo_load_warned(copy, dir, &c[k], warning[k], sizeof warning[k]);
    model = saved;
    snprintf(cmd, sizeof cmd, "umount '%s'", merged);
    if (system(cmd) != 0)
        fprintf(stderr, "  %s failed\n", cmd);
    tu_rmtree(base);
    tu_rmtree(dir);
    fprintf(stderr, "  warning: %s\n", warning[1]);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(c[k].failed, 0);
        assert_int_equal(st[k].memo_tensors, 0);
        assert_non_null(strstr(warning[k], "on overlayfs"));
    }
    free(base);
    free(lower);
    free(upper);
    free(work);
    free(merged);
    free(copy);
    free(dir);
}

/* The dirty-page sequence on a file system whose mapped writes fault
 * and move the times (ext4 here): a page dirtied through a shared
 * mapping, a load a second later that verifies and records, then another
 * byte of the same, still writable, page changed through the same
 * mapping: no fault, no new times. The load that records first writes
 * the file's dirty pages back (sl_file_id_settle), which write-protects
 * the mapping, so the second store faults and moves the times: the next
 * load hashes and fails. */
static void test_memo_dirty_page(void **state)
{
    (void)state;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = open_ok(model, &o);
    assert_int_equal(sluice_info(m, ntensors - 1, &ti), SLUICE_OK);
    sluice_close(m);
    long pg = sysconf(_SC_PAGESIZE);
    off_t off = (off_t)ti.offset;
    if ((off + 1) % pg == 0)
        off--;   /* two bytes of the tensor on one page */
    assert_true(ti.nbytes >= 2 && (uint64_t)off >= ti.offset);
    volatile unsigned char *at;
    unsigned char *page = map_page(model, off, &at);
    *at = *at;   /* dirties the page, changes nothing; the times move */
    char *dir = fresh_cache();
    check_ctx c;
    char warning[1024];
    sleep_ms(1100);
    struct sluice_stats st = memo_load_warned(model, dir, &c, warning, sizeof warning);
    if (warning[0]) {
        fprintf(stderr, "  the memo is refused here (%s): skipped\n", warning);
        munmap(page, (size_t)pg);
        drop_cache(dir);
        skip();
    }
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.memo_tensors, 0);   /* hashed, and recorded */
    unsigned char was = at[1];
    at[1] = was ^ 1;
    st = memo_load_warned(model, dir, &c, warning, sizeof warning);
    at[1] = was;
    munmap(page, (size_t)pg);
    assert_int_equal(c.failed, 1);
    assert_int_equal(c.first_failure, SLUICE_E_CHECKSUM);
    assert_int_equal(st.memo_tensors, 0);
    drop_cache(dir);
}

/* A memo-warm open with extra flags. */
static sluice_model *open_memo_flags(const char *dir, uint32_t flags)
{
    sluice_options o = cached_opts(dir);
    o.flags |= SLUICE_F_TRUST_UNCHANGED | flags;
    return open_ok(model, &o);
}

/* The other ways a memo-trusted tensor's bytes can come in: an O_DIRECT
 * load whose tensor sits off 64 bytes (a move job, hashed 0, exists when
 * the file changes under the read), a group of small tensors read at once
 * (the write lands before the group's read), and the calls that must never
 * take the memo's word: sluice_read_into, sluice_acquire_range and
 * sluice_verify. Each one sees the flipped byte. */
static void test_memo_other_paths(void **state)
{
    (void)state;
    NEED_MEMO();
    char *dir;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_model *m = open_memo_warm(&dir, &ti);
    /* a tensor off 64 bytes (else the last one) for the O_DIRECT case, and
     * a small one after another small one for the group */
    size_t odd = ntensors - 1, grouped = SIZE_MAX;
    struct sluice_tensor_info prev = SLUICE_TENSOR_INFO_INIT;
    for (size_t i = 0; i < ntensors; i++) {
        struct sluice_tensor_info x = SLUICE_TENSOR_INFO_INIT;
        assert_int_equal(sluice_info(m, i, &x), SLUICE_OK);
        if (x.nbytes && (x.offset & 63) && odd == ntensors - 1)
            odd = i;
        if (i && grouped == SIZE_MAX && x.nbytes && x.nbytes < 4096 && prev.nbytes &&
            prev.nbytes < 4096 && prev.offset + prev.nbytes == x.offset)
            grouped = i;
        prev = x;
    }
    assert_int_equal(sluice_close(m), SLUICE_OK);

    /* O_DIRECT: the write made once the load started */
    struct sluice_tensor_info to = SLUICE_TENSOR_INFO_INIT;
    m = open_memo_flags(dir, SLUICE_F_DIRECT);
    assert_int_equal(sluice_info(m, odd, &to), SLUICE_OK);
    flip_ctx f = {1, (off_t)to.offset};
    assert_int_equal(sl_engine_set_pause(m, flip_when_started, &f), SLUICE_OK);
    sluice_tensor *t = NULL;
    int rc = sluice_acquire_index(m, odd, &t);
    assert_int_equal(f.armed, 0);
    if (rc == SLUICE_OK)
        sluice_release(t);
    sl_engine_set_pause(m, NULL, NULL);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    flip_byte(model, f.at);
    assert_int_equal(rc, SLUICE_E_CHECKSUM);
    assert_int_equal(st.memo_tensors, 0);

    /* a group: the write made when the stream's first load started */
    if (grouped != SIZE_MAX) {
        struct sluice_tensor_info tg = SLUICE_TENSOR_INFO_INIT;
        sleep_ms(1100);
        check_ctx c;
        memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);    /* the memo again */
        m = open_memo_flags(dir, 0);
        assert_int_equal(sluice_info(m, grouped, &tg), SLUICE_OK);
        flip_ctx g = {1, (off_t)tg.offset};
        assert_int_equal(sl_engine_set_pause(m, flip_when_started, &g), SLUICE_OK);
        memset(&c, 0, sizeof c);
        sluice_stream(m, NULL, 0, check_cb, &c);
        sl_engine_set_pause(m, NULL, NULL);
        sluice_stats(m, &st);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        if (!g.armed)
            flip_byte(model, g.at);   /* put it back, only if the hook flipped it */
        assert_int_equal(g.armed, 0);
        assert_int_equal(c.failed, 1);
        assert_int_equal(c.first_failure, SLUICE_E_CHECKSUM);
        assert_int_equal(st.memo_tensors, 0);
    }

    /* the calls that always hash, on an open that found the memo */
    sleep_ms(1100);
    check_ctx c;
    memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    m = open_memo_flags(dir, 0);
    assert_int_equal(sluice_info(m, ntensors - 1, &ti), SLUICE_OK);   /* names of this open */
    flip_byte(model, (off_t)ti.offset);
    unsigned char *buf = malloc((size_t)ti.nbytes);
    assert_int_equal(sluice_read_into(m, ti.name, 0, buf, ti.nbytes), SLUICE_E_CHECKSUM);
    free(buf);
    assert_int_equal(sluice_acquire_range(m, ti.name, 0, ti.nbytes, &t), SLUICE_E_CHECKSUM);
    struct sluice_verify_report rep = {.size = sizeof rep};
    const char *names[1] = {ti.name};
    assert_int_equal(sluice_verify(m, names, 1, NULL, &rep), SLUICE_E_CHECKSUM);
    assert_int_equal(rep.tensors_failed, 1);
    assert_int_equal(rep.bytes_hashed, ti.nbytes);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    flip_byte(model, (off_t)ti.offset);
    drop_cache(dir);
}

/* A byte changed and the file's mtime set back to what it was: only the
 * ctime says so, and that is enough for the memo to stand aside. */
static void test_memo_mtime_set_back(void **state)
{
    (void)state;
    NEED_MEMO();
    char *dir = fresh_cache();
    check_ctx c;
    sleep_ms(1100);
    memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    struct sluice_stats st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    assert_int_equal(st.memo_tensors, nonempty);
    struct stat before;
    assert_int_equal(stat(model, &before), 0);
    sluice_options o;
    sluice_options_init(&o);
    sluice_model *m = open_ok(model, &o);
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    assert_int_equal(sluice_info(m, ntensors - 1, &ti), SLUICE_OK);
    sluice_close(m);
    int fd = open(model, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, (off_t)ti.offset), 1);
    b ^= 1;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)ti.offset), 1);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    assert_int_equal(futimens(fd, times), 0);
    sleep_ms(1100);   /* old enough for the memo to record it */
    st = memo_load(dir, SLUICE_F_TRUST_UNCHANGED, NULL, &c);
    b ^= 1;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)ti.offset), 1);   /* put it back */
    close(fd);
    assert_int_equal(c.failed, 1);
    assert_int_equal(c.first_failure, SLUICE_E_CHECKSUM);
    assert_int_equal(st.memo_tensors, 0);
    drop_cache(dir);
}

/* The digest table replaced after open (the engine hook), leaving tensors
 * the memo vouched for with no digest at all: they load plain, the memo
 * claims nothing for them. */
static void test_memo_then_no_digests(void **state)
{
    (void)state;
    NEED_MEMO();
    char *dir;
    check_ctx c;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    sluice_model *m = open_memo_warm(&dir, &ti);
    unsigned char (*d)[32] = calloc(ntensors, 32);
    unsigned char *has = calloc(ntensors, 1);
    assert_int_equal(sl_engine_set_digests(m, (const unsigned char (*)[32])d, has), SLUICE_OK);
    memset(&c, 0, sizeof c);
    sluice_stream(m, NULL, 0, check_cb, &c);
    struct sluice_stats st = {.size = sizeof st};
    sluice_stats(m, &st);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    assert_int_equal(c.failed, 0);
    assert_int_equal(st.memo_tensors, 0);
    free(d);
    free(has);
    drop_cache(dir);
}

/* ---------------------------------------------------------------- parts */

/* A part with a part digest (issue 37, item 4) of a remote model is kept
 * as the blob of that digest: a later open reads it from the cache (no
 * request for tensor bytes, counted as a disk hit) and hashes it again; a
 * damaged blob is detected, dropped and the part fetched again. A dim-1
 * part of 4 of a [64, 256] BF16 tensor (64 rows of 128 bytes). */
static struct sluice_stats part_once(const char *loc, const sluice_options *o, int acquire,
                                     const void *want, size_t len)
{
    sluice_model *m = open_ok(loc, o);
    void *got = calloc(1, len);
    assert_non_null(got);
    sluice_tensor *t = NULL;
    int rc = acquire ? sluice_acquire_part(m, "l.o_proj.weight", 1, 1, 4, &t)
                     : sluice_read_part_into(m, "l.o_proj.weight", 1, 1, 4, got, len);
    if (rc != SLUICE_OK)
        fail_msg("part: %s: %s", sluice_strerror(rc), sluice_errmsg(m));
    assert_memory_equal(acquire ? sluice_tensor_data(t) : got, want, len);
    if (t)
        assert_int_equal(sluice_release(t), SLUICE_OK);
    free(got);
    struct sluice_stats st = {.size = sizeof st};
    assert_int_equal(sluice_stats(m, &st), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
    return st;
}

static void test_part_blobs(void **state)
{
    (void)state;
    char *dir = tu_join(root, "pp"), *path = tu_join(dir, "model.safetensors");
    mkdir(dir, 0755);
    const size_t nbytes = 64 * 256 * 2, len = nbytes / 4;
    unsigned char *bytes = malloc(nbytes);
    assert_non_null(bytes);
    for (size_t k = 0; k < nbytes; k++)
        bytes[k] = (unsigned char)(k * 131 + (k >> 9));
    char header[256], mpath[4096];
    snprintf(header, sizeof header, "{\"l.o_proj.weight\":{\"dtype\":\"BF16\",\"shape\":"
             "[64,256],\"data_offsets\":[0,%zu]}}", nbytes);
    tu_write_safetensors(path, header, bytes, nbytes);
    snprintf(mpath, sizeof mpath, "%s.manifest.json", path);
    run_result r = run(root, "manifest", path, "--parts", "builtin", "--worlds", "4", "-q", "-o",
                       mpath, NULL);
    if (r.status != 0)
        fail_msg("sluice manifest --parts: %s", r.err);
    run_free(&r);
    unsigned char *want = malloc(len);
    assert_non_null(want);
    for (size_t row = 0; row < 64; row++)   /* rank 1 of 4 along dim 1 */
        memcpy(want + row * 128, bytes + row * 512 + 128, 128);
    char loc[1024];
    snprintf(loc, sizeof loc, "%s/pp/model.safetensors", nginx.base);
    char *cache = fresh_cache();
    sluice_options o = cached_opts(cache);

    struct sluice_stats st = part_once(loc, &o, 1, want, len);   /* cold: fetched, stored */
    assert_int_equal(st.disk_hits, 0);
    assert_int_equal(st.disk_misses, 1);
    assert_int_equal(st.disk_stored, 1);
    assert_true(st.remote_reads >= 1);
    assert_int_equal(count_files(cache, "blobs"), 1);

    for (int acquire = 0; acquire <= 1; acquire++) {   /* warm: from the blob, no request */
        size_t before = rf_requests(&nginx);
        sluice_model *m = open_ok(loc, &o);
        assert_int_equal(sluice_close(m), SLUICE_OK);
        size_t open_only = rf_requests(&nginx) - before;
        before = rf_requests(&nginx);
        st = part_once(loc, &o, acquire, want, len);
        assert_int_equal(rf_requests(&nginx) - before, open_only);
        assert_int_equal(st.disk_hits, 1);
        assert_int_equal(st.disk_hit_bytes, len);
        assert_int_equal(st.disk_misses, 0);
        assert_int_equal(st.disk_stored, 0);
        assert_int_equal(st.bytes_read, 0);
        assert_int_equal(st.remote_reads, 0);
        assert_int_equal(st.remote_bytes, 0);
        assert_int_equal(st.bytes_hashed, len);   /* verified again as it is read */
    }

    char *blob = rot_one_blob(cache);   /* damaged: detected, dropped, fetched again */
    st = part_once(loc, &o, 1, want, len);
    assert_int_equal(st.disk_hits, 0);
    assert_int_equal(st.disk_rotten, 1);
    assert_int_equal(st.disk_stored, 1);
    assert_true(st.remote_reads >= 1);
    st = part_once(loc, &o, 0, want, len);   /* stored again, whole */
    assert_int_equal(st.disk_hits, 1);
    assert_int_equal(st.disk_rotten, 0);

    free(blob);
    free(want);
    free(bytes);
    drop_cache(cache);
    free(path);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cold_then_warm),
        cmocka_unit_test(test_remote_verify_checks_source),
        cmocka_unit_test(test_remote_verify_bypass_ends),
        cmocka_unit_test(test_close_cancel_while_storing),
        cmocka_unit_test(test_rotten_blobs_at_close_with_mirror),
        cmocka_unit_test(test_rotten_blob),
        cmocka_unit_test(test_blobs_deleted_while_loading),
        cmocka_unit_test(test_broken_index),
        cmocka_unit_test(test_degraded),
        cmocka_unit_test(test_degraded_real),
        cmocka_unit_test(test_index_locked),
        cmocka_unit_test(test_sigkill_fills),
        cmocka_unit_test(test_processes),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_one_probe_per_start),
        cmocka_unit_test(test_memo),
        cmocka_unit_test(test_memo_changed_after_open),
        cmocka_unit_test(test_memo_changed_while_read),
        cmocka_unit_test(test_memo_mtime_set_back),
        cmocka_unit_test(test_memo_other_paths),
        cmocka_unit_test(test_memo_then_no_digests),
        cmocka_unit_test(test_memo_refused_on_tmpfs),
        cmocka_unit_test(test_memo_refused_on_overlayfs),
        cmocka_unit_test(test_memo_dirty_page),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_blob_fds_bounded),
        cmocka_unit_test(test_hostile_blobs),
        cmocka_unit_test(test_small_pool_counts),
        cmocka_unit_test(test_part_blobs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
