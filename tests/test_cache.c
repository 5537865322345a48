/* test_cache.c: the persistent cache's storage (src/cache/cache.c) and its
 * administration (sluice_cache_*): blobs stored and read back, eviction
 * in least recently used order, the budget, leftovers of dead processes,
 * an index that is corrupt, foreign, newer or of version 1, the fault
 * hook (read-only, full, SIGKILL at every step of a fill), the
 * verified-once memo, threads, and the public calls; a real tmpfs full
 * at SQLite's insert, another connection holding the index's lock, a live
 * fill seen from another PID namespace, orphan blobs, a lost index.
 * Databases are made
 * and inspected here with SQLite directly, not through cache.c. */
#define _GNU_SOURCE 1   /* unshare, CLONE_NEWPID */
#include "util.h"

#include "cache/cache.h"
#include "base/digest.h"
#include "sluice.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef SLUICE_HAVE_SQLITE
#include <sqlite3.h>

#define MIB ((uint64_t)1 << 20)

typedef struct fx {
    char *root; /* scratch */
    char *dir;  /* root/cache */
} fx;

static int setup(void **state)
{
    unsetenv("SLUICE_TEST_CACHE_FAULT");
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->root = tu_tmpdir();
    f->dir = tu_join(f->root, "cache");
    *state = f;
    return 0;
}

/* A child a test stopped in the middle of a fill: killed by the teardown
 * if the test failed before it did (a stopped child would hold the test's
 * output open). */
static pid_t stopped_child;

static int teardown(void **state)
{
    fx *f = *state;
    if (stopped_child > 0) {
        kill(stopped_child, SIGKILL);
        waitpid(stopped_child, NULL, 0);
        stopped_child = 0;
    }
    unsetenv("SLUICE_TEST_CACHE_FAULT");
    tu_rmtree(f->root);
    free(f->root);
    free(f->dir);
    free(f);
    return 0;
}

/* n bytes of a pattern that differs with seed. */
static uint8_t *pattern(uint64_t n, unsigned seed)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    for (uint64_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131 + seed * 7919 + (i >> 12)) & 0xff);
    return p;
}

typedef struct blob {
    uint8_t *data;
    uint64_t size;
    uint8_t digest[32];
} blob;

static blob make_blob(uint64_t n, unsigned seed)
{
    blob b = {.data = pattern(n, seed), .size = n};
    assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, b.data, n, b.digest), 0);
    return b;
}

static void blobs_free(blob *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(b[i].data);
}

static sl_cache *open_cache(const char *dir, uint64_t max)
{
    sl_cache *c = NULL;
    sl_err err = {0};
    assert_int_equal(sl_cache_open(dir, max, &c, &err), SLUICE_OK);
    assert_non_null(c);
    return c;
}

static void expect_on(const sl_cache *c)
{
    if (sl_cache_warning(c))
        fail_msg("cache turned off: %s", sl_cache_warning(c));
}

static char *blob_file(const sl_cache *c, const uint8_t digest[32])
{
    char hex[65];
    char *p = sl_cache_blob_path(c, SLUICE_ALG_SHA256, sl_hex_digest(hex, digest));
    assert_non_null(p);
    return p;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* 1 when the blob of b opens and holds exactly b's bytes. */
static int blob_is(sl_cache *c, const blob *b)
{
    char *path = NULL;
    int fd = sl_cache_open_blob(c, SLUICE_ALG_SHA256, b->digest, b->size, &path);
    if (fd < 0)
        return 0;
    assert_non_null(path);
    free(path);
    uint8_t *got = malloc(b->size + 1);
    assert_non_null(got);
    uint64_t n = 0;
    ssize_t r;
    while ((r = pread(fd, got + n, b->size + 1 - n, (off_t)n)) > 0)
        n += (uint64_t)r;
    close(fd);
    int same = n == b->size && memcmp(got, b->data, b->size) == 0;
    free(got);
    return same;
}

static void usage_is(sl_cache *c, uint64_t bytes, uint64_t entries)
{
    uint64_t b = 0, n = 0;
    sl_err err = {0};
    assert_int_equal(sl_cache_usage(c, &b, &n, &err), SLUICE_OK);
    assert_int_equal(b, bytes);
    assert_int_equal(n, entries);
}

/* Regular files below path, recursively. */
static size_t count_files(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *p = tu_join(path, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0)
            n += S_ISDIR(st.st_mode) ? count_files(p) : S_ISREG(st.st_mode);
        free(p);
    }
    closedir(d);
    return n;
}

static size_t count_in(const fx *f, const char *sub)
{
    char *p = tu_join(f->dir, sub);
    size_t n = count_files(p);
    free(p);
    return n;
}

/* Runs sql on the database at path (made if missing). */
static void sql_run(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

static int64_t sql_int(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static int quick_check_ok(const char *path)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &st, NULL), SQLITE_OK);
    int ok = sqlite3_step(st) == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ok;
}

/* ---------------------------------------------------------------- tests */

static void store_open_drop(void **state)
{
    fx *f = *state;
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    expect_on(c);
    blob a = make_blob(100000, 1), b = make_blob(3, 2), z = make_blob(0, 3);
    uint64_t ev = 99;
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, a.digest, a.data, a.size, "here", &ev), 1);
    assert_int_equal(ev, 0);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, NULL, NULL), 1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, z.digest, z.data, z.size, "", NULL), 1);
    /* storing again is fine: same name, same bytes */
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, a.digest, a.data, a.size, "here", NULL), 1);
    assert_true(blob_is(c, &a));
    assert_true(blob_is(c, &b));
    assert_true(blob_is(c, &z));
    usage_is(c, a.size + b.size, 3);
    struct stat st;
    char *pa = blob_file(c, a.digest);
    assert_int_equal(stat(pa, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    /* not under another algorithm */
    assert_int_equal(sl_cache_open_blob(c, SLUICE_ALG_BLAKE3, a.digest, a.size, NULL), -1);

    /* asked with another size: it cannot be that tensor, and is deleted */
    assert_int_equal(sl_cache_open_blob(c, SLUICE_ALG_SHA256, a.digest, a.size + 1, NULL), -1);
    assert_false(exists(pa));
    usage_is(c, b.size, 2);
    /* a blob file cut short: likewise */
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, a.digest, a.data, a.size, "here", NULL), 1);
    assert_int_equal(truncate(pa, 1000), 0);
    assert_int_equal(sl_cache_open_blob(c, SLUICE_ALG_SHA256, a.digest, a.size, NULL), -1);
    assert_false(exists(pa));
    usage_is(c, b.size, 2);

    char *pb = blob_file(c, b.digest);
    sl_cache_drop(c, SLUICE_ALG_SHA256, b.digest);
    assert_false(exists(pb));
    assert_int_equal(sl_cache_open_blob(c, SLUICE_ALG_SHA256, b.digest, b.size, NULL), -1);
    usage_is(c, 0, 1);
    assert_int_equal(count_in(f, "tmp"), 0);
    sl_cache_close(c);
    free(pa);
    free(pb);
    free(a.data);
    free(b.data);
    free(z.data);
}

static void eviction_lru(void **state)
{
    fx *f = *state;
    const uint64_t n = 10000;
    sl_cache *c = open_cache(f->dir, 3 * n);
    blob b[5];
    for (unsigned i = 0; i < 5; i++)
        b[i] = make_blob(n, 10 + i);
    uint64_t ev = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[i].digest, b[i].data, n, "s", &ev), 1);
        assert_int_equal(ev, 0);
    }
    /* b0 used again: b1 and b2 are now the least recently used */
    sl_cache_touch(c, SLUICE_ALG_SHA256, &b[0].digest, 1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[3].digest, b[3].data, n, "s", &ev), 1);
    assert_int_equal(ev, 1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[4].digest, b[4].data, n, "s", &ev), 1);
    assert_int_equal(ev, 1);
    assert_true(blob_is(c, &b[0]));
    assert_false(blob_is(c, &b[1]));
    assert_false(blob_is(c, &b[2]));
    assert_true(blob_is(c, &b[3]));
    assert_true(blob_is(c, &b[4]));
    for (int i = 1; i <= 2; i++) {
        char *p = blob_file(c, b[i].digest);
        assert_false(exists(p));
        free(p);
    }
    usage_is(c, 3 * n, 3);
    assert_int_equal(count_in(f, "blobs"), 3);

    /* least recently used first in the listing */
    sl_cache_row *rows;
    size_t nr;
    sl_err err = {0};
    assert_int_equal(sl_cache_rows(c, &rows, &nr, &err), SLUICE_OK);
    assert_int_equal(nr, 3);
    char hex[65];
    assert_string_equal(rows[0].digest, sl_hex_digest(hex, b[0].digest));
    assert_string_equal(rows[2].digest, sl_hex_digest(hex, b[4].digest));
    assert_string_equal(rows[2].source, "s");
    sl_cache_rows_free(rows, nr);
    sl_cache_close(c);
    blobs_free(b, 5);
}

static void over_budget_not_stored(void **state)
{
    fx *f = *state;
    sl_cache *c = open_cache(f->dir, 1000);
    blob small = make_blob(600, 1), big = make_blob(1001, 2);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, small.digest, small.data, small.size, "s", NULL), 1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, big.digest, big.data, big.size, "s", NULL), 0);
    expect_on(c); /* too large is no failure */
    assert_true(blob_is(c, &small)); /* nothing was evicted for it */
    assert_false(blob_is(c, &big));
    usage_is(c, 600, 1);
    assert_int_equal(count_in(f, "tmp"), 0);
    sl_cache_close(c);
    free(small.data);
    free(big.data);
}

static void tmp_leftovers(void **state)
{
    fx *f = *state;
    sl_cache_close(open_cache(f->dir, MIB));
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(0);
    int st;
    assert_int_equal(waitpid(child, &st, 0), child); /* its pid is free now */
    char name[128];
    snprintf(name, sizeof name, "%s/tmp/%ld.x.tmp", f->dir, (long)child);
    tu_write_file(name, "dead", 4);
    char mine[128];
    snprintf(mine, sizeof mine, "%s/tmp/%ld.y.tmp", f->dir, (long)getpid());
    tu_write_file(mine, "alive", 5);
    char old[128]; /* a live pid's, but two days old */
    snprintf(old, sizeof old, "%s/tmp/%ld.z.tmp", f->dir, (long)getpid());
    tu_write_file(old, "old", 3);
    struct timespec t[2] = {{.tv_sec = time(NULL) - 2 * 86400}, {.tv_sec = time(NULL) - 2 * 86400}};
    assert_int_equal(utimensat(AT_FDCWD, old, t, 0), 0);
    char foreign[128]; /* not of the form PID.RANDOM.tmp, recent: left */
    snprintf(foreign, sizeof foreign, "%s/tmp/notes.txt", f->dir);
    tu_write_file(foreign, "x", 1);

    sl_cache *c = open_cache(f->dir, MIB);
    expect_on(c);
    assert_false(exists(name));
    assert_true(exists(mine));
    assert_false(exists(old));
    assert_true(exists(foreign));
    sl_cache_close(c);
}

/* The index holds count entries, each recorded from the blobs. */
static void expect_rebuilt(sl_cache *c, size_t count)
{
    sl_cache_row *rows;
    size_t n;
    sl_err err = {0};
    assert_int_equal(sl_cache_rows(c, &rows, &n, &err), SLUICE_OK);
    assert_int_equal(n, count);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(rows[i].source, "rebuilt");
    sl_cache_rows_free(rows, n);
}

/* Makes a cache of three blobs, lets mutate damage its index, opens it
 * again: the index is moved aside to corrupt/ and rebuilt from the blobs. */
static void rebuild_after(fx *f, void (*mutate)(const char *index))
{
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    blob b[3] = {make_blob(5000, 1), make_blob(7, 2), make_blob(123457, 3)};
    for (int i = 0; i < 3; i++)
        assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[i].digest, b[i].data, b[i].size, "s", NULL), 1);
    /* files of other programs in blobs/ are left alone and not recorded */
    char *stray = tu_join(f->dir, "blobs/sha256/README");
    tu_write_file(stray, "hi", 2);
    sl_cache_close(c);
    char *index = tu_join(f->dir, "index.sqlite");
    mutate(index);
    assert_int_equal(count_in(f, "corrupt"), 0);

    c = open_cache(f->dir, 64 * MIB);
    expect_on(c);
    assert_true(count_in(f, "corrupt") >= 1);
    usage_is(c, 5000 + 7 + 123457, 3);
    expect_rebuilt(c, 3);
    for (int i = 0; i < 3; i++)
        assert_true(blob_is(c, &b[i]));
    assert_true(exists(stray));
    sl_cache_close(c);
    assert_true(quick_check_ok(index));
    assert_int_equal(sql_int(index, "PRAGMA user_version"), SL_CACHE_SCHEMA);
    /* and it stays good: the next open moves nothing */
    size_t aside = count_in(f, "corrupt");
    sl_cache_close(open_cache(f->dir, 64 * MIB));
    assert_int_equal(count_in(f, "corrupt"), aside);
    free(index);
    free(stray);
    blobs_free(b, 3);
}

static void truncate_100(const char *index)
{
    assert_int_equal(truncate(index, 100), 0);
}

static void garbage(const char *index)
{
    uint8_t *g = pattern(20000, 77);
    tu_write_file(index, g, 20000);
    free(g);
}

static void foreign_db(const char *index)
{
    assert_int_equal(unlink(index), 0);
    sql_run(index, "CREATE TABLE t(x); INSERT INTO t VALUES(1);");
}

static void index_truncated(void **state)
{
    rebuild_after(*state, truncate_100);
}

static void index_garbage(void **state)
{
    rebuild_after(*state, garbage);
}

static void index_foreign(void **state)
{
    rebuild_after(*state, foreign_db);
}

static void index_newer(void **state)
{
    fx *f = *state;
    blob b = make_blob(1000, 1);
    sl_cache *c = open_cache(f->dir, MIB);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 1);
    sl_cache_close(c);
    char *index = tu_join(f->dir, "index.sqlite");
    sql_run(index, "PRAGMA user_version = 99");
    size_t len0;
    uint8_t *before = tu_read_file(index, &len0);
    assert_non_null(before);

    c = open_cache(f->dir, MIB);
    const char *w = sl_cache_warning(c);
    assert_non_null(w);
    assert_non_null(strstr(w, "99"));
    assert_non_null(strstr(w, "2"));
    /* off: finds nothing, stores nothing, records nothing */
    assert_int_equal(sl_cache_open_blob(c, SLUICE_ALG_SHA256, b.digest, b.size, NULL), -1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    sl_cache_touch(c, SLUICE_ALG_SHA256, &b.digest, 1);
    sl_cache_drop(c, SLUICE_ALG_SHA256, b.digest);
    sl_cache_close(c);
    size_t len1;
    uint8_t *after = tu_read_file(index, &len1);
    assert_non_null(after);
    assert_int_equal(len0, len1);
    assert_memory_equal(before, after, len0);
    assert_int_equal(count_in(f, "corrupt"), 0);
    assert_int_equal(sql_int(index, "PRAGMA user_version"), 99);
    free(before);
    free(after);
    free(index);
    free(b.data);
}

static int memo_calls;
static void on_memo(void *user, uint64_t offset, uint64_t nbytes, const uint8_t digest[32])
{
    const uint8_t *want = user;
    assert_int_equal(offset, 8);
    assert_int_equal(nbytes, 16);
    assert_memory_equal(digest, want, 32);
    memo_calls++;
}

/* A file of the scratch directory and its identity. */
static sl_file_id file_id(const fx *f, const char *name, const char *content)
{
    char *p = tu_join(f->root, name);
    tu_write_file(p, content, strlen(content));
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    sl_file_id id;
    assert_int_equal(sl_file_id_of(fd, &id), 0);
    close(fd);
    free(p);
    return id;
}

static void migrate_v1(void **state)
{
    fx *f = *state;
    blob b = make_blob(4321, 9);
    char hex[65];
    sl_hex_digest(hex, b.digest);
    assert_int_equal(mkdir(f->dir, 0755), 0);
    char sub[512];
    snprintf(sub, sizeof sub, "%s/blobs/sha256/%.2s", f->dir, hex);
    char *blobs = tu_join(f->dir, "blobs");
    assert_int_equal(mkdir(blobs, 0755), 0);
    char *sha = tu_join(blobs, "sha256");
    assert_int_equal(mkdir(sha, 0755), 0);
    assert_int_equal(mkdir(sub, 0755), 0);
    char *path = tu_join(sub, hex);
    tu_write_file(path, b.data, b.size);
    char *index = tu_join(f->dir, "index.sqlite");
    char sql[1024];
    snprintf(sql, sizeof sql,
             "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
             "INSERT INTO meta VALUES('format', 'sluice-cache');"
             "CREATE TABLE blobs(algorithm TEXT, digest TEXT, size INTEGER, source TEXT,"
             " created_ns INTEGER, last_access_ns INTEGER, PRIMARY KEY(algorithm, digest));"
             "INSERT INTO blobs VALUES('sha256', '%s', 4321, 'https://h/m', 5, 6);"
             "PRAGMA user_version = 1;", hex);
    sql_run(index, sql);

    sl_cache *c = open_cache(f->dir, 64 * MIB);
    expect_on(c);
    assert_int_equal(count_in(f, "corrupt"), 0);
    usage_is(c, 4321, 1);
    assert_true(blob_is(c, &b));
    sl_cache_row *rows;
    size_t n;
    sl_err err = {0};
    assert_int_equal(sl_cache_rows(c, &rows, &n, &err), SLUICE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].source, "https://h/m");
    assert_int_equal(rows[0].created_ns, 5);
    sl_cache_rows_free(rows, n);
    /* the memo of version 2 works */
    sl_file_id id = file_id(f, "m", "some bytes of a model file");
    sl_cache_memo_record(c, &id, id.ctime_ns + 2000000000LL, SLUICE_ALG_SHA256, 8, 16, b.digest);
    memo_calls = 0;
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, b.digest);
    assert_int_equal(memo_calls, 1);
    sl_cache_close(c);
    assert_int_equal(sql_int(index, "PRAGMA user_version"), 2);
    assert_int_equal(sql_int(index, "SELECT count(*) FROM memo"), 1);
    free(blobs);
    free(sha);
    free(path);
    free(index);
    free(b.data);
}

static void memo_round_trip(void **state)
{
    fx *f = *state;
    sl_cache *c = open_cache(f->dir, MIB);
    uint8_t d[32], other[32];
    memset(d, 0xab, 32);
    memset(other, 0xcd, 32);
    sl_file_id id = file_id(f, "model", "0123456789abcdef0123456789abcdef");
    int64_t late = (id.mtime_ns > id.ctime_ns ? id.mtime_ns : id.ctime_ns) + 2000000000LL;

    /* just written (identity taken now): not trusted, not recorded */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    sl_cache_memo_record(c, &id, now, SLUICE_ALG_SHA256, 8, 16, d);
    memo_calls = 0;
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, d);
    assert_int_equal(memo_calls, 0);
    /* exactly one second after: still not */
    int64_t edge = (id.mtime_ns > id.ctime_ns ? id.mtime_ns : id.ctime_ns) + 1000000000LL;
    sl_cache_memo_record(c, &id, edge, SLUICE_ALG_SHA256, 8, 16, d);
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, d);
    assert_int_equal(memo_calls, 0);

    /* identity taken two seconds after the last change: recorded */
    sl_cache_memo_record(c, &id, late, SLUICE_ALG_SHA256, 8, 16, d);
    sl_cache_memo_record(c, &id, late, SLUICE_ALG_SHA256, 8, 16, d); /* again: one record */
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, d);
    assert_int_equal(memo_calls, 1);
    /* another algorithm, another identity: nothing */
    sl_cache_memo_each(c, &id, SLUICE_ALG_BLAKE3, on_memo, d);
    sl_file_id changed = id;
    changed.mtime_ns++;
    sl_cache_memo_each(c, &changed, SLUICE_ALG_SHA256, on_memo, d);
    changed = id;
    changed.ctime_ns++;
    sl_cache_memo_each(c, &changed, SLUICE_ALG_SHA256, on_memo, d);
    changed = id;
    changed.ino++;
    sl_cache_memo_each(c, &changed, SLUICE_ALG_SHA256, on_memo, d);
    assert_int_equal(memo_calls, 1);
    sl_cache_close(c);

    /* it persists; a record of the inode under a newer identity replaces it */
    c = open_cache(f->dir, MIB);
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, d);
    assert_int_equal(memo_calls, 2);
    changed = id;
    changed.mtime_ns += 5;
    changed.ctime_ns += 5;
    sl_cache_memo_record(c, &changed, late + 5, SLUICE_ALG_SHA256, 8, 16, other);
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, d);
    assert_int_equal(memo_calls, 2);
    sl_cache_close(c);
    char *index = tu_join(f->dir, "index.sqlite");
    assert_int_equal(sql_int(index, "SELECT count(*) FROM memo"), 1);
    free(index);
}

static void fault_erofs(void **state)
{
    fx *f = *state;
    setenv("SLUICE_TEST_CACHE_FAULT", "erofs", 1);
    sl_cache *c = open_cache(f->dir, MIB);
    unsetenv("SLUICE_TEST_CACHE_FAULT");
    const char *w = sl_cache_warning(c);
    assert_non_null(w);
    assert_non_null(strstr(w, "Read-only file system"));
    assert_non_null(strstr(w, f->dir));
    blob b = make_blob(100, 1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    assert_int_equal(sl_cache_open_blob(c, SLUICE_ALG_SHA256, b.digest, b.size, NULL), -1);
    sl_file_id id = {1, 2, 3, 4, 5};
    sl_cache_memo_record(c, &id, 100000000000LL, SLUICE_ALG_SHA256, 0, 1, b.digest);
    memo_calls = 0;
    sl_cache_memo_each(c, &id, SLUICE_ALG_SHA256, on_memo, b.digest);
    assert_int_equal(memo_calls, 0);
    sl_err err = {0};
    uint64_t x, y;
    assert_int_equal(sl_cache_usage(c, &x, &y, &err), SLUICE_E_IO);
    sl_cache_close(c);
    free(b.data);
}

static void fault_enospc(void **state)
{
    fx *f = *state;
    blob b = make_blob(3 * MIB + MIB / 2, 4);
    setenv("SLUICE_TEST_CACHE_FAULT", "enospc@2", 1); /* the first write */
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    unsetenv("SLUICE_TEST_CACHE_FAULT");
    expect_on(c);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    const char *w = sl_cache_warning(c);
    assert_non_null(w);
    assert_non_null(strstr(w, "No space left on device"));
    assert_non_null(strstr(w, "the disk is full"));   /* as SQLite's SQLITE_FULL reads */
    assert_int_equal(count_in(f, "tmp"), 0);
    assert_int_equal(count_in(f, "blobs"), 0);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    sl_cache_close(c);

    /* the step of the insert: the blob is not kept without its entry */
    setenv("SLUICE_TEST_CACHE_FAULT", "enospc@9", 1);
    c = open_cache(f->dir, 64 * MIB);
    unsetenv("SLUICE_TEST_CACHE_FAULT");
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    assert_non_null(sl_cache_warning(c));
    assert_int_equal(count_in(f, "tmp"), 0);
    assert_int_equal(count_in(f, "blobs"), 0);
    sl_cache_close(c);

    /* malformed values are ignored */
    static const char *const bad[] = {"enospc@0", "enospc@", "enospc@02", "enospc@1x",
                                      "kill@-1", "EROFS", "erofs ", "kill@99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("SLUICE_TEST_CACHE_FAULT", bad[i], 1);
        c = open_cache(f->dir, 64 * MIB);
        unsetenv("SLUICE_TEST_CACHE_FAULT");
        expect_on(c);
        sl_cache_close(c);
    }

    /* without the fault the next open works */
    c = open_cache(f->dir, 64 * MIB);
    expect_on(c);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 1);
    assert_true(blob_is(c, &b));
    sl_cache_close(c);
    free(b.data);
}

/* A real full disk met by SQLite's journal, not by the blob: a tmpfs
 * (mounted here where the machine allows: root, mounts permitted; else
 * skipped, saying so) filled up but for one page, which the blob's 4096
 * bytes take; the insert's WAL frame finds no room (SQLITE_FULL). The
 * warning says "the disk is full" as a blob's ENOSPC does (before:
 * SQLite's "database or disk is full"). */
static void disk_full_in_sqlite(void **state)
{
    (void)state;
    char *mnt = tu_tmpdir(), cmd[1024];
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=1m sluice-test '%s' 2>/dev/null", mnt);
    if (system(cmd) != 0) {
        fprintf(stderr, "  no tmpfs mount here: skipped\n");
        tu_rmtree(mnt);
        free(mnt);
        skip();
    }
    char *dir = tu_join(mnt, "cache"), *filler = tu_join(mnt, "filler");
    sl_cache *c = open_cache(dir, 64 * MIB);
    expect_on(c);
    blob b = make_blob(4096, 71);
    int fd = open(filler, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    static uint8_t page[4096];
    off_t len = 0;
    while (pwrite(fd, page, sizeof page, len) == (ssize_t)sizeof page)
        len += (off_t)sizeof page;
    assert_int_equal(errno, ENOSPC);
    assert_int_equal(ftruncate(fd, len - (off_t)sizeof page), 0);   /* one page free */
    close(fd);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    char w[512];
    snprintf(w, sizeof w, "%s", sl_cache_warning(c) ? sl_cache_warning(c) : "");
    sl_cache_close(c);
    char *blobs = tu_join(dir, "blobs"), *tmp = tu_join(dir, "tmp");
    size_t blobs_left = count_files(blobs), tmp_left = count_files(tmp);
    snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
    assert_int_equal(system(cmd), 0);
    fprintf(stderr, "  tmpfs full but for the blob's page: %s\n", w);
    assert_non_null(strstr(w, "recording a blob failed: the disk is full"));
    assert_non_null(strstr(w, dir));
    assert_int_equal(blobs_left, 0);   /* not kept without its entry */
    assert_int_equal(tmp_left, 0);
    free(blobs);
    free(tmp);
    free(b.data);
    free(dir);
    free(filler);
    tu_rmtree(mnt);
    free(mnt);
}

/* SIGKILL at every step of a fill of 3.5 MiB (1 temporary file, 4 writes,
 * fsync, rename, directory fsync, insert: 9 steps), and once past them. */
static void sigkill_every_step(void **state)
{
    fx *f = *state;
    const uint64_t size = 3 * MIB + MIB / 2;
    const unsigned steps = 1 + (unsigned)((size + SL_CACHE_WRITE_MAX - 1) / SL_CACHE_WRITE_MAX) + 4;
    blob b = make_blob(size, 5);
    for (unsigned n = 1; n <= steps + 1; n++) {
        char fault[32];
        snprintf(fault, sizeof fault, "kill@%u", n);
        fflush(NULL);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            setenv("SLUICE_TEST_CACHE_FAULT", fault, 1);
            sl_cache *c = NULL;
            sl_err err;
            if (sl_cache_open(f->dir, 64 * MIB, &c, &err) != SLUICE_OK || sl_cache_warning(c))
                _exit(3);
            int stored = sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL);
            sl_cache_close(c);
            _exit(stored ? 0 : 4);
        }
        int st = 0;
        assert_int_equal(waitpid(child, &st, 0), child);
        if (n <= steps) {
            if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
                fail_msg("%s: the child was not killed (status %#x)", fault, st);
        } else {
            assert_true(WIFEXITED(st));
            assert_int_equal(WEXITSTATUS(st), 0);
        }
        /* the child is dead and reaped: its leftovers go at this open */
        sl_cache *c = open_cache(f->dir, 64 * MIB);
        expect_on(c);
        assert_int_equal(count_in(f, "tmp"), 0);
        char *path = blob_file(c, b.digest);
        char *index = tu_join(f->dir, "index.sqlite");
        int64_t entries = sql_int(index, "SELECT count(*) FROM blobs");
        if (exists(path)) {
            size_t len;
            uint8_t *got = tu_read_file(path, &len);
            assert_non_null(got);
            assert_int_equal(len, size);
            assert_memory_equal(got, b.data, size);
            free(got);
        } else if (entries != 0) {
            fail_msg("%s: an entry without its blob", fault);
        }
        /* killed after the insert, or past every step: recorded */
        assert_int_equal(entries, n >= steps ? 1 : 0);
        assert_true(quick_check_ok(index));
        /* what is left works: a store completes it */
        assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 1);
        assert_true(blob_is(c, &b));
        sl_cache_close(c);
        tu_rmtree(f->dir);
        free(path);
        free(index);
    }
    free(b.data);
}

/* ---------------------------------------------------------------- threads */

typedef struct worker {
    sl_cache *c;
    blob *shared;  /* 4 blobs both threads store and read */
    unsigned seed;
    int bad;       /* a read that returned wrong bytes */
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    for (unsigned i = 0; i < 40; i++) {
        blob own = make_blob(2000 + i * 37, w->seed * 1000 + i);
        sl_cache_store(w->c, SLUICE_ALG_SHA256, own.digest, own.data, own.size, "t", NULL);
        blob *s = &w->shared[(i + w->seed) % 4];
        sl_cache_store(w->c, SLUICE_ALG_SHA256, s->digest, s->data, s->size, "t", NULL);
        int fd = sl_cache_open_blob(w->c, SLUICE_ALG_SHA256, s->digest, s->size, NULL);
        if (fd >= 0) { /* may have been evicted since: then absent, never wrong */
            uint8_t *got = malloc(s->size);
            if (!got || pread(fd, got, s->size, 0) != (ssize_t)s->size ||
                memcmp(got, s->data, s->size) != 0)
                w->bad++;
            free(got);
            close(fd);
        }
        sl_cache_touch(w->c, SLUICE_ALG_SHA256, &own.digest, 1);
        if (i % 5 == 0)
            sl_cache_drop(w->c, SLUICE_ALG_SHA256, own.digest);
        free(own.data);
    }
    return NULL;
}

/* A store whose blob is unlinked (another process's eviction of the same
 * digest) after its rename but before its insert: kept from its insert by
 * a write lock taken here (its entry waits, see "Busy" in cache.h), it
 * sees the blob gone when it tries again at close and records nothing, so
 * that no entry names a missing blob. */
typedef struct store_arg {
    sl_cache *c;
    const blob *b;
    int stored;
} store_arg;

static void *store_thread(void *p)
{
    store_arg *a = p;
    a->stored = sl_cache_store(a->c, SLUICE_ALG_SHA256, a->b->digest, a->b->data, a->b->size,
                               "test", NULL);
    return NULL;
}

static void store_sees_vanished_blob(void **state)
{
    fx *f = *state;
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    expect_on(c);
    blob b = make_blob(4096, 77);
    char *index = tu_join(f->dir, "index.sqlite");
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    store_arg a = {c, &b, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, store_thread, &a), 0);
    char *path = blob_file(c, b.digest);
    /* the rename comes before the insert, which waits for the lock */
    for (int k = 0; k < 20000 && !exists(path); k++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_true(exists(path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    pthread_join(th, NULL);
    sqlite3_close(db);
    assert_int_equal(a.stored, 0);
    usage_is(c, 0, 0);
    assert_false(sl_cache_is_off(c));   /* a passing thing, not a reason to turn off */
    sl_cache_close(c);
    assert_int_equal(sql_int(index, "SELECT count(*) FROM blobs"), 0);
    free(path);
    free(index);
    free(b.data);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The index's write lock held by another connection: a store waits
 * SL_CACHE_BUSY_MS at most, then none for a while; its blob stays in
 * place, its entry waits and is written by the next store that gets the
 * lock (counted in what that store returns), or at close; a blob whose
 * entry still cannot be written at close is deleted. */
static void busy_index(void **state)
{
    fx *f = *state;
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    blob b[4] = {make_blob(3000, 31), make_blob(4000, 32), make_blob(5000, 33), make_blob(6000, 34)};
    char *index = tu_join(f->dir, "index.sqlite");
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    int64_t t0 = mono_ms();
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[0].digest, b[0].data, b[0].size, "s", NULL), 0);
    int64_t first = mono_ms() - t0;
    t0 = mono_ms();
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[1].digest, b[1].data, b[1].size, "s", NULL), 0);
    int64_t second = mono_ms() - t0;
    fprintf(stderr, "  stores with the index locked elsewhere: %lld ms, then %lld ms\n",
            (long long)first, (long long)second);
    /* the first waited for the lock, and not for long (the bound is loose:
     * the fills' fsyncs share a busy machine); the second did not try the
     * lock (its time is printed, not asserted: an fsync alone can take
     * that long here; test_cache_load test_index_locked bounds a whole
     * load) */
    assert_true(first >= SL_CACHE_BUSY_MS * 9 / 10 && first < SL_CACHE_BUSY_MS + 5000);
    assert_int_equal(sl_cache_busy(c), 2);
    assert_false(sl_cache_is_off(c));
    const char *w = sl_cache_warning(c);
    assert_non_null(w);
    assert_non_null(strstr(w, f->dir));
    assert_true(blob_is(c, &b[0]) && blob_is(c, &b[1]));   /* in place, readable */
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    /* the lock let go, past the time of no tries: the next store writes
     * the two entries that waited and its own */
    struct timespec ts = {SL_CACHE_BUSY_RETRY_MS / 1000, (SL_CACHE_BUSY_RETRY_MS % 1000 + 50) * 1000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[2].digest, b[2].data, b[2].size, "s", NULL), 3);
    usage_is(c, 3000 + 4000 + 5000, 3);
    /* locked again through close: the blob that waits is deleted then */
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    nanosleep(&ts, NULL);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[3].digest, b[3].data, b[3].size, "s", NULL), 0);
    char *p3 = blob_file(c, b[3].digest);
    assert_true(exists(p3));
    sl_cache_close(c);
    assert_false(exists(p3));
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    c = open_cache(f->dir, 64 * MIB);
    usage_is(c, 3000 + 4000 + 5000, 3);
    assert_int_equal(count_in(f, "blobs"), 3);
    assert_null(sl_cache_warning(c));
    sl_cache_close(c);
    free(p3);
    free(index);
    blobs_free(b, 4);
}

/* A blob waiting for its entry (the index locked) whose digest another
 * process records meanwhile (the same bytes, its rename or this one's the
 * file in place), the index still locked at close: the blob stays, since
 * an entry names it (before: deleted at close, the other process's entry
 * then named a missing blob, a later miss). */
static void pending_blob_indexed_elsewhere(void **state)
{
    fx *f = *state;
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    blob b = make_blob(3000, 51);
    char *index = tu_join(f->dir, "index.sqlite"), hex[65], sql[512];
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL), 0);
    char *p = blob_file(c, b.digest);
    assert_true(exists(p));
    /* "another process" records the digest, then holds the lock again */
    snprintf(sql, sizeof sql, "INSERT INTO blobs(algorithm, digest, size, source, created_ns, "
             "last_access_ns) VALUES('sha256', '%s', %llu, 'other', 1, 1)",
             sl_hex_digest(hex, b.digest), (unsigned long long)b.size);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    sl_cache_close(c);
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    if (!exists(p))
        fail_msg("an indexed blob was deleted at close: %s", p);
    c = open_cache(f->dir, 64 * MIB);
    assert_true(blob_is(c, &b));
    usage_is(c, 3000, 1);
    sl_cache_close(c);
    free(p);
    free(index);
    free(b.data);
}

/* ---------------------------------------------------------------- repair */

/* A fill held alive in the middle (stopped by the fault hook after its
 * temporary file was made) is left by a cleaner in another PID namespace
 * (where the filler's pid does not exist) and by one in this; once the
 * filler is dead, its temporary file goes at the next clean-up, seen from
 * either namespace. */
static int clean_elsewhere(const fx *f)
{
    fflush(NULL);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        if (unshare(CLONE_NEWPID) != 0)
            _exit(77);
        pid_t q = fork();   /* pid 1 of the new namespace */
        if (q < 0)
            _exit(3);
        if (q == 0) {
            sl_cache *c = NULL;
            sl_err err;
            if (sl_cache_open(f->dir, 64 * MIB, &c, &err) != SLUICE_OK || sl_cache_is_off(c))
                _exit(4);
            sl_cache_close(c);
            _exit(0);
        }
        int st = 0;
        if (waitpid(q, &st, 0) != q)
            _exit(5);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 6);
    }
    int st = 0;
    assert_int_equal(waitpid(p, &st, 0), p);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void tmp_fill_alive(void **state)
{
    fx *f = *state;
    sl_cache_close(open_cache(f->dir, 64 * MIB));
    blob b = make_blob(3 * MIB, 41);
    fflush(NULL);
    pid_t filler = fork();
    assert_true(filler >= 0);
    if (filler == 0) {
        setenv("SLUICE_TEST_CACHE_FAULT", "stop@1", 1);   /* the temporary file made */
        sl_cache *c = NULL;
        sl_err err;
        if (sl_cache_open(f->dir, 64 * MIB, &c, &err) != SLUICE_OK)
            _exit(3);
        sl_cache_store(c, SLUICE_ALG_SHA256, b.digest, b.data, b.size, "s", NULL);
        sl_cache_close(c);
        _exit(0);
    }
    stopped_child = filler;
    int st = 0;
    assert_int_equal(waitpid(filler, &st, WUNTRACED), filler);
    assert_true(WIFSTOPPED(st));
    assert_int_equal(count_in(f, "tmp"), 1);

    int other = clean_elsewhere(f);
    if (other == 77)
        fprintf(stderr, "  no new PID namespace here (unshare: not permitted): this "
                "namespace's clean-up only\n");
    else
        assert_int_equal(other, 0);
    assert_int_equal(count_in(f, "tmp"), 1);   /* alive: kept */
    sl_cache_close(open_cache(f->dir, 64 * MIB));
    assert_int_equal(count_in(f, "tmp"), 1);

    assert_int_equal(kill(filler, SIGKILL), 0);
    assert_int_equal(waitpid(filler, &st, 0), filler);
    stopped_child = 0;
    if (other != 77) {
        assert_int_equal(clean_elsewhere(f), 0);   /* dead: its lock is gone */
    } else {
        sl_cache_close(open_cache(f->dir, 64 * MIB));
    }
    assert_int_equal(count_in(f, "tmp"), 0);
    free(b.data);
}

/* What verify says of each blob (on_bad's record, by kind). */
typedef struct verdicts {
    size_t bad, recorded;
} verdicts;

static void count_verdict(void *user, const sluice_cache_entry *e, const char *why)
{
    verdicts *v = user;
    (void)e;
    if (!strncmp(why, "recorded:", 9))
        v->recorded++;
    else
        v->bad++;
}

/* Blob files no entry names (a kill between a fill's rename and its
 * insert leaves such): verify rehashes them too, records a good one and
 * deletes a bad one; listing and usage see the one recorded. */
static void verify_orphans(void **state)
{
    fx *f = *state;
    blob b[4] = {make_blob(1000, 51), make_blob(2000, 52), make_blob(3000, 53), make_blob(4000, 54)};
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[0].digest, b[0].data, b[0].size, "s", NULL), 1);
    assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[1].digest, b[1].data, b[1].size, "s", NULL), 1);
    char *good = blob_file(c, b[2].digest), *bad = blob_file(c, b[3].digest);
    sl_cache_close(c);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\" \"$(dirname '%s')\"", good, bad);
    assert_int_equal(system(cmd), 0);
    tu_write_file(good, b[2].data, b[2].size);
    b[3].data[100] ^= 1;   /* named for its digest, one byte off */
    tu_write_file(bad, b[3].data, b[3].size);

    sluice_cache *h = NULL;
    assert_int_equal(sluice_cache_open(f->dir, &h), SLUICE_OK);
    uint64_t checked = 0, dropped = 0, bytes = 0, n = 0;
    verdicts v = {0};
    assert_int_equal(sluice_cache_verify(h, &checked, &dropped, count_verdict, &v), SLUICE_OK);
    assert_int_equal(checked, 4);
    assert_int_equal(dropped, 1);
    assert_int_equal(v.bad, 1);
    assert_int_equal(v.recorded, 1);
    assert_false(exists(bad));
    assert_true(exists(good));
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(bytes, 1000 + 2000 + 3000);
    /* and again: nothing left to say */
    memset(&v, 0, sizeof v);
    assert_int_equal(sluice_cache_verify(h, &checked, &dropped, count_verdict, &v), SLUICE_OK);
    assert_int_equal(checked, 3);
    assert_int_equal(dropped, 0);
    assert_int_equal(v.bad + v.recorded, 0);
    sluice_cache_close(h);
    free(good);
    free(bad);
    blobs_free(b, 4);
}

/* index.sqlite deleted, or emptied: the open makes it again with the
 * blobs already there (listing, usage and the budget see them). */
static void index_deleted_or_empty(void **state)
{
    fx *f = *state;
    blob b[3] = {make_blob(1500, 61), make_blob(2500, 62), make_blob(3500, 63)};
    for (int kind = 0; kind < 2; kind++) {
        sl_cache *c = open_cache(f->dir, 64 * MIB);
        for (int i = 0; i < 3; i++)
            assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[i].digest, b[i].data, b[i].size, "s", NULL), 1);
        sl_cache_close(c);
        char *index = tu_join(f->dir, "index.sqlite");
        static const char *const side[] = {"-wal", "-shm"};
        for (int k = 0; k < 2; k++) {
            char p[1024];
            snprintf(p, sizeof p, "%s%s", index, side[k]);
            unlink(p);
        }
        if (kind == 0)
            assert_int_equal(unlink(index), 0);
        else
            assert_int_equal(truncate(index, 0), 0);
        c = open_cache(f->dir, 64 * MIB);
        expect_on(c);
        usage_is(c, 1500 + 2500 + 3500, 3);
        expect_rebuilt(c, 3);
        /* the budget sees them: a store past it evicts the oldest */
        sl_cache_close(c);
        c = open_cache(f->dir, 9000);
        blob more = make_blob(2000, 64);
        uint64_t ev = 0;
        assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, more.digest, more.data, more.size, "s", &ev), 1);
        assert_true(ev >= 1);
        sl_cache_close(c);
        free(more.data);
        free(index);
        tu_rmtree(f->dir);
    }
    blobs_free(b, 3);
}

static void two_threads(void **state)
{
    fx *f = *state;
    const uint64_t budget = 30000;
    sl_cache *c = open_cache(f->dir, budget);
    blob shared[4];
    for (unsigned i = 0; i < 4; i++)
        shared[i] = make_blob(3000, 500 + i);
    worker w[2] = {{c, shared, 1, 0}, {c, shared, 2, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    expect_on(c);
    assert_int_equal(w[0].bad + w[1].bad, 0);
    uint64_t bytes, n;
    sl_err err = {0};
    assert_int_equal(sl_cache_usage(c, &bytes, &n, &err), SLUICE_OK);
    assert_true(bytes <= budget);
    assert_int_equal(count_in(f, "blobs"), n);
    assert_int_equal(count_in(f, "tmp"), 0);
    sl_cache_close(c);
    for (int i = 0; i < 4; i++)
        free(shared[i].data);
}

/* ---------------------------------------------------------------- public calls */

typedef struct seen {
    size_t n, present;
    char digest[65];
    char why[256];
} seen;

static int on_entry(void *user, const sluice_cache_entry *e)
{
    seen *s = user;
    s->n++;
    s->present += e->present != 0;
    assert_int_equal(e->algorithm, SLUICE_ALG_SHA256);
    assert_int_equal(strlen(e->digest), 64);
    assert_string_equal(e->source, "https://example/m.safetensors");
    assert_true(e->created_ns > 0 && e->last_access_ns >= e->created_ns);
    return 0;
}

static int stop_at_first(void *user, const sluice_cache_entry *e)
{
    (void)e;
    (*(int *)user)++;
    return 42;
}

static void on_bad(void *user, const sluice_cache_entry *e, const char *why)
{
    seen *s = user;
    s->n++;
    memcpy(s->digest, e->digest, 65);
    snprintf(s->why, sizeof s->why, "%s", why);
}

static void public_api(void **state)
{
    fx *f = *state;
    blob b[3] = {make_blob(1000, 1), make_blob(2000, 2), make_blob(3000, 3)};
    sl_cache *c = open_cache(f->dir, 64 * MIB);
    for (int i = 0; i < 3; i++)
        assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, b[i].digest, b[i].data, b[i].size,
                                        "https://example/m.safetensors", NULL), 1);
    char *p0 = blob_file(c, b[0].digest), *p1 = blob_file(c, b[1].digest);
    sl_cache_close(c);

    sluice_cache *h = NULL;
    assert_int_equal(sluice_cache_open(f->dir, &h), SLUICE_OK);
    assert_string_equal(sluice_cache_errmsg(h), "");
    assert_string_equal(sluice_cache_path(h), f->dir);
    seen s = {0};
    assert_int_equal(sluice_cache_list(h, on_entry, &s), SLUICE_OK);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.present, 3);
    int calls = 0;
    assert_int_equal(sluice_cache_list(h, stop_at_first, &calls), 42);
    assert_int_equal(calls, 1);
    uint64_t bytes = 0, n = 0;
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_OK);
    assert_int_equal(bytes, 6000);
    assert_int_equal(n, 3);

    /* one byte flipped: verify finds it, drops it, says which */
    int fd = open(p1, O_RDWR);
    assert_true(fd >= 0);
    uint8_t x;
    assert_int_equal(pread(fd, &x, 1, 1500), 1);
    x ^= 0x40;
    assert_int_equal(pwrite(fd, &x, 1, 1500), 1);
    close(fd);
    uint64_t checked = 0, dropped = 0;
    memset(&s, 0, sizeof s);
    assert_int_equal(sluice_cache_verify(h, &checked, &dropped, on_bad, &s), SLUICE_OK);
    assert_int_equal(checked, 3);
    assert_int_equal(dropped, 1);
    assert_int_equal(s.n, 1);
    char hex[65];
    assert_string_equal(s.digest, sl_hex_digest(hex, b[1].digest));
    assert_non_null(strstr(s.why, "SHA-256"));
    assert_false(exists(p1));
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_OK);
    assert_int_equal(n, 2);
    memset(&s, 0, sizeof s);
    assert_int_equal(sluice_cache_verify(h, &checked, &dropped, NULL, NULL), SLUICE_OK);
    assert_int_equal(checked, 2);
    assert_int_equal(dropped, 0);

    /* gc: an entry whose blob is gone goes; a blob no entry names is recorded */
    assert_int_equal(unlink(p0), 0);
    tu_write_file(p1, b[1].data, b[1].size); /* put back by hand, unrecorded */
    uint64_t freed = 0, freed_n = 0;
    assert_int_equal(sluice_cache_gc(h, UINT64_MAX, &freed, &freed_n), SLUICE_OK);
    assert_int_equal(freed, 0);
    assert_int_equal(freed_n, 1);
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_OK);
    assert_int_equal(bytes, 5000);
    assert_int_equal(n, 2);
    /* down to a budget, least recently used first (b[1], recorded last, stays) */
    assert_int_equal(sluice_cache_gc(h, 2500, &freed, NULL), SLUICE_OK);
    assert_int_equal(freed, 3000);
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_OK);
    assert_int_equal(bytes, 2000);
    assert_int_equal(sluice_cache_clear(h, &freed, &freed_n), SLUICE_OK);
    assert_int_equal(freed, 2000);
    assert_int_equal(freed_n, 1);
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_OK);
    assert_int_equal(bytes + n, 0);
    assert_int_equal(count_in(f, "blobs"), 0);
    assert_int_equal(sluice_cache_list(h, NULL, NULL), SLUICE_E_INVAL);
    assert_string_not_equal(sluice_cache_errmsg(h), "");
    sluice_cache_close(h);

    /* a path that is a regular file */
    char *file = tu_join(f->root, "plain");
    tu_write_file(file, "x", 1);
    h = NULL;
    assert_int_equal(sluice_cache_open(file, &h), SLUICE_E_IO);
    assert_non_null(h);
    assert_non_null(strstr(sluice_cache_errmsg(h), file));
    assert_int_equal(sluice_cache_usage(h, &bytes, &n), SLUICE_E_INVAL);
    sluice_cache_close(h);
    sluice_cache_close(NULL);
    assert_int_equal(sluice_cache_open(f->dir, NULL), SLUICE_E_INVAL);

    /* NULL: $SLUICE_CACHE_DIR */
    setenv("SLUICE_CACHE_DIR", f->dir, 1);
    assert_int_equal(sluice_cache_open(NULL, &h), SLUICE_OK);
    assert_string_equal(sluice_cache_path(h), f->dir);
    sluice_cache_close(h);
    unsetenv("SLUICE_CACHE_DIR");
    free(file);
    free(p0);
    free(p1);
    blobs_free(b, 3);
}

static void dir_for(void **state)
{
    (void)state;
    sluice_options o;
    sluice_options_init(&o);
    char *d = NULL;
    sl_err err = {0};
    unsetenv("SLUICE_CACHE_DIR");
    assert_int_equal(sl_cache_dir_for(&o, &d, &err), SLUICE_OK);
    assert_null(d); /* nothing named: no cache */
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    o.flags = SLUICE_F_CACHE_DEFAULT;
    assert_int_equal(sl_cache_dir_for(&o, &d, &err), SLUICE_OK);
    assert_string_equal(d, "/x/cache/sluice");
    free(d);
    setenv("XDG_CACHE_HOME", "relative", 1); /* not absolute: ignored */
    setenv("HOME", "/home/u", 1);
    o.flags = SLUICE_F_TRUST_UNCHANGED;
    assert_int_equal(sl_cache_dir_for(&o, &d, &err), SLUICE_OK);
    assert_string_equal(d, "/home/u/.cache/sluice");
    free(d);
    setenv("SLUICE_CACHE_DIR", "/env/c", 1);
    assert_int_equal(sl_cache_dir_for(&o, &d, &err), SLUICE_OK);
    assert_string_equal(d, "/env/c");
    free(d);
    o.cache_dir = "/opt/c";
    assert_int_equal(sl_cache_dir_for(&o, &d, &err), SLUICE_OK);
    assert_string_equal(d, "/opt/c");
    free(d);
    unsetenv("SLUICE_CACHE_DIR");
    unsetenv("XDG_CACHE_HOME");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(store_open_drop, setup, teardown),
        cmocka_unit_test_setup_teardown(eviction_lru, setup, teardown),
        cmocka_unit_test_setup_teardown(over_budget_not_stored, setup, teardown),
        cmocka_unit_test_setup_teardown(tmp_leftovers, setup, teardown),
        cmocka_unit_test_setup_teardown(index_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(index_garbage, setup, teardown),
        cmocka_unit_test_setup_teardown(index_foreign, setup, teardown),
        cmocka_unit_test_setup_teardown(index_newer, setup, teardown),
        cmocka_unit_test_setup_teardown(migrate_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(memo_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_erofs, setup, teardown),
        cmocka_unit_test_setup_teardown(fault_enospc, setup, teardown),
        cmocka_unit_test(disk_full_in_sqlite),
        cmocka_unit_test_setup_teardown(sigkill_every_step, setup, teardown),
        cmocka_unit_test_setup_teardown(two_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(store_sees_vanished_blob, setup, teardown),
        cmocka_unit_test_setup_teardown(busy_index, setup, teardown),
        cmocka_unit_test_setup_teardown(pending_blob_indexed_elsewhere, setup, teardown),
        cmocka_unit_test_setup_teardown(tmp_fill_alive, setup, teardown),
        cmocka_unit_test_setup_teardown(verify_orphans, setup, teardown),
        cmocka_unit_test_setup_teardown(index_deleted_or_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(public_api, setup, teardown),
        cmocka_unit_test(dir_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without SQLite: the cache is always off */

static void off_without_sqlite(void **state)
{
    (void)state;
    char *root = tu_tmpdir();
    sl_cache *c = NULL;
    sl_err err = {0};
    assert_int_equal(sl_cache_open(root, 1000, &c, &err), SLUICE_OK);
    assert_non_null(strstr(sl_cache_warning(c), "without SQLite"));
    sl_cache_close(c);
    sluice_cache *h = NULL;
    assert_int_equal(sluice_cache_open(root, &h), SLUICE_E_UNSUPPORTED);
    sluice_cache_close(h);
    tu_rmtree(root);
    free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(off_without_sqlite)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
