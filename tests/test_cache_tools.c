/* test_cache_tools.c: `sluice cache`, run as a program
 * (SLUICE_BINARY_DIR/sluice) on a cache filled here through src/cache/cache.c:
 * du and ls show what is there, verify finds a flipped byte (exit 1) and
 * drops that blob, gc --max and clear free what they say, bad
 * arguments exit 2, and ls, du and verify of a directory with no cache
 * create none (and exit 3: cannot open). */
#include "util.h"

#include "cache/cache.h"
#include "base/digest.h"
#include "sluice.h"

#include <errno.h>
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

#include "tool_run.h"

#ifdef SLUICE_HAVE_SQLITE
#include <sqlite3.h>
#endif

#ifdef SLUICE_HAVE_SQLITE

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* `sluice cache verify` exits status and prints summary and a line that
 * starts with kind and names hex. */
static void verify_says(const char *root, const char *dir, int status, const char *summary,
                        const char *kind, const char *hex)
{
    run_result r = run(root, "cache", "--cache-dir", dir, "verify", NULL);
    expect_status(&r, status, summary);
    assert_non_null(strstr(r.out, summary));
    assert_non_null(strstr(r.out, kind));
    assert_non_null(strstr(r.out, hex));
    run_free(&r);
}

static void cache_commands(void **state)
{
    (void)state;
    char *root = tu_tmpdir();
    char *dir = tu_join(root, "cache");
    sl_cache *c = NULL;
    sl_err err = {0};
    assert_int_equal(sl_cache_open(dir, (uint64_t)1 << 30, &c, &err), SLUICE_OK);
    assert_null(sl_cache_warning(c));
    char hex[2][65];
    char *bad_path = NULL;
    for (int i = 0; i < 2; i++) {
        size_t n = 10000 + 5000 * (size_t)i;
        uint8_t *data = malloc(n), d[32];
        assert_non_null(data);
        for (size_t k = 0; k < n; k++)
            data[k] = (uint8_t)(k * 7 + (size_t)i);
        assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, data, n, d), 0);
        assert_int_equal(sl_cache_store(c, SLUICE_ALG_SHA256, d, data, n, "https://h/model", NULL), 1);
        sl_hex_digest(hex[i], d);
        if (i == 1)
            bad_path = sl_cache_blob_path(c, SLUICE_ALG_SHA256, hex[i]);
        free(data);
    }
    sl_cache_close(c);

    run_result r = run(root, "cache", "--cache-dir", dir, "du", NULL);
    expect_status(&r, 0, "du");
    assert_non_null(strstr(r.out, "(25000 bytes) in 2 entries"));
    assert_non_null(strstr(r.out, dir));
    run_free(&r);

    r = run(root, "cache", "ls", "--cache-dir", dir, NULL);
    expect_status(&r, 0, "ls");
    assert_int_equal(count(r.out, "\n"), 2);
    assert_int_equal(count(r.out, "https://h/model"), 2);
    for (int i = 0; i < 2; i++) {
        char want[160];
        snprintf(want, sizeof want, "sha256:%s", hex[i]);
        assert_non_null(strstr(r.out, want));
    }
    run_free(&r);

    r = run(root, "cache", "--cache-dir", dir, "verify", NULL);
    expect_status(&r, 0, "verify (clean)");
    assert_non_null(strstr(r.out, "2 blobs checked, 0 dropped"));
    run_free(&r);

    /* a blob whose entry is gone (as a kill between a fill's rename and
     * its insert leaves it): checked, recorded, not bad */
    char *index = tu_join(dir, "index.sqlite");
    sqlite3 *db = NULL;
    char sql[256];
    snprintf(sql, sizeof sql, "DELETE FROM blobs WHERE digest = '%s'", hex[0]);
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    free(index);
    verify_says(root, dir, 0, "2 blobs checked, 0 dropped, 1 recorded", "RECORDED sha256:", hex[0]);
    r = run(root, "cache", "--cache-dir", dir, "du", NULL);
    assert_non_null(strstr(r.out, "(25000 bytes) in 2 entries"));
    run_free(&r);

    int fd = open(bad_path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "?", 1, 77), 1);
    close(fd);
    verify_says(root, dir, 1, "2 blobs checked, 1 dropped", "BAD sha256:", hex[1]);
    assert_int_not_equal(access(bad_path, F_OK), 0);

    r = run(root, "cache", "--cache-dir", dir, "gc", "--max", "0", NULL);
    expect_status(&r, 0, "gc --max 0");
    assert_non_null(strstr(r.out, "freed 9.8 KiB (10000 bytes) and 1 entries"));
    assert_non_null(strstr(r.out, "(0 bytes) in 0 entries left"));
    run_free(&r);

    r = run(root, "cache", "--cache-dir", dir, "clear", NULL);
    expect_status(&r, 0, "clear");
    assert_non_null(strstr(r.out, "(0 bytes) in 0 entries left"));
    run_free(&r);

    /* $SLUICE_CACHE_DIR when no --cache-dir */
    setenv("SLUICE_CACHE_DIR", dir, 1);
    r = run(root, "cache", "du", NULL);
    unsetenv("SLUICE_CACHE_DIR");
    expect_status(&r, 0, "du from the environment");
    assert_non_null(strstr(r.out, dir));
    run_free(&r);

    static const char *const bad[][4] = {
        {"cache", NULL}, {"cache", "frobnicate", NULL}, {"cache", "gc", "--max", "lots"},
        {"cache", "ls", "--max", "1G"}, {"cache", "ls", "du", NULL}, {"cache", "--cache-dir", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run(root, bad[i][0], bad[i][1], bad[i][2], bad[i][3], NULL);
        expect_status(&r, 2, "bad arguments");
        run_free(&r);
    }
    /* a directory that cannot be a cache */
    char *file = tu_join(root, "plain");
    tu_write_file(file, "x", 1);
    r = run(root, "cache", "--cache-dir", file, "du", NULL);
    expect_status(&r, 3, "a file as the cache");
    assert_non_null(strstr(r.err, file));
    run_free(&r);

    /* ls, du and verify of a directory with no cache (a typo) say so, exit
     * 3 and create nothing, from --cache-dir or the environment; the
     * library call under them does the same, and finds the real one */
    char *typo = tu_join(root, "cahce");
    static const char *const readers[] = {"ls", "du", "verify"};
    for (size_t i = 0; i < sizeof readers / sizeof readers[0]; i++) {
        r = run(root, "cache", "--cache-dir", typo, readers[i], NULL);
        expect_status(&r, 3, readers[i]);
        assert_non_null(strstr(r.err, "no cache at"));
        assert_non_null(strstr(r.err, typo));
        run_free(&r);
        assert_int_not_equal(access(typo, F_OK), 0);
    }
    setenv("SLUICE_CACHE_DIR", typo, 1);
    r = run(root, "cache", "du", NULL);
    unsetenv("SLUICE_CACHE_DIR");
    expect_status(&r, 3, "du of a typo from the environment");
    run_free(&r);
    assert_int_not_equal(access(typo, F_OK), 0);
    sluice_cache *h = NULL;
    assert_int_equal(sluice_cache_open_existing(typo, &h), SLUICE_E_NOT_FOUND);
    assert_non_null(strstr(sluice_cache_errmsg(h), typo));
    sluice_cache_close(h);
    assert_int_not_equal(access(typo, F_OK), 0);
    assert_int_equal(sluice_cache_open_existing(dir, &h), SLUICE_OK);
    sluice_cache_close(h);
    assert_int_equal(sluice_cache_open_existing(dir, NULL), SLUICE_E_INVAL);

    tu_rmtree(root);
    free(typo);
    free(file);
    free(bad_path);
    free(dir);
    free(root);
}

/* Stores n bytes (pattern seed) as a blob of c named (model, tensor of
 * tlen bytes; model NULL: unnamed, as an older sluice stores); its hex. */
static void store_named(sl_cache *c, uint8_t seed, const char *model, const char *tensor,
                        size_t tlen, char hex[65])
{
    uint8_t data[5000], d[32];
    for (size_t k = 0; k < sizeof data; k++)
        data[k] = (uint8_t)(k * 13 + seed);
    assert_int_equal(sl_md_oneshot(SLUICE_ALG_SHA256, data, sizeof data, d), 0);
    sluice_cache_name name = {model, tensor, tlen};
    assert_int_equal(sl_cache_store_named(c, SLUICE_ALG_SHA256, d, data, sizeof data,
                                          "https://h/m/model.safetensors", model ? &name : NULL,
                                          NULL), 1);
    sl_hex_digest(hex, d);
}

/* `sluice cache ls` names the tensors and models of its blobs, and --json
 * gives the same as one object; a blob stored twice under two names lists
 * both; a cache whose index lacks the names table (made by a sluice
 * before it) lists its blobs without names, and records names again. */
static void cache_ls_names(void **state)
{
    (void)state;
    char *root = tu_tmpdir();
    char *dir = tu_join(root, "cache");
    sl_cache *c = NULL;
    sl_err err = {0};
    char hex[3][65], h2[65];
    assert_int_equal(sl_cache_open(dir, (uint64_t)1 << 30, &c, &err), SLUICE_OK);
    store_named(c, 1, "https://h/m", "model.embed_tokens.weight", 25, hex[0]);
    store_named(c, 1, "https://h/other", "tied \"q\"\n", 9, h2);   /* the same bytes */
    assert_string_equal(hex[0], h2);
    store_named(c, 2, NULL, NULL, 0, hex[1]);
    sl_cache_close(c);

    run_result r = run(root, "cache", "ls", "--cache-dir", dir, NULL);
    expect_status(&r, 0, "ls");
    assert_non_null(strstr(r.out, "tensor \"model.embed_tokens.weight\" of https://h/m\n"));
    assert_non_null(strstr(r.out, "tensor \"tied \\\"q\\\"\\n\" of https://h/other\n"));
    assert_int_equal(count(r.out, "\n"), 4);   /* two entries, two names */
    run_free(&r);

    r = run(root, "cache", "ls", "--json", "--cache-dir", dir, NULL);
    expect_status(&r, 0, "ls --json");
    char want[512];
    snprintf(want, sizeof want, "\"digest\": \"%s\"", hex[0]);
    assert_non_null(strstr(r.out, want));
    assert_non_null(strstr(r.out, "\"names\": [{\"model\": \"https://h/m\", \"tensor\": "
                                  "\"model.embed_tokens.weight\"}, {\"model\": \"https://h/other\", "
                                  "\"tensor\": \"tied \\\"q\\\"\\n\"}]"));
    assert_non_null(strstr(r.out, "\"names\": []"));
    assert_non_null(strstr(r.out, "\"source\": \"https://h/m/model.safetensors\""));
    assert_int_equal(r.out[0], '{');
    assert_non_null(strstr(r.out, "]}\n"));
    run_free(&r);
    r = run(root, "cache", "du", "--json", "--cache-dir", dir, NULL);
    expect_status(&r, 2, "du --json");
    run_free(&r);

    /* an older sluice's index: no names table; listed without names, and
     * the table is back after the next open, recording again */
    char *index = tu_join(dir, "index.sqlite");
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "DROP TABLE names", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    sluice_cache *h = NULL;
    assert_int_equal(sluice_cache_open_existing(dir, &h), SLUICE_OK);
    sluice_cache_close(h);
    assert_int_equal(sl_cache_open(dir, (uint64_t)1 << 30, &c, &err), SLUICE_OK);
    store_named(c, 3, "https://h/m", "lm_head.weight", 14, hex[2]);
    sl_cache_close(c);
    r = run(root, "cache", "ls", "--cache-dir", dir, NULL);
    expect_status(&r, 0, "ls after the names table was dropped");
    assert_null(strstr(r.out, "embed_tokens"));
    assert_non_null(strstr(r.out, "tensor \"lm_head.weight\" of https://h/m\n"));
    assert_int_equal(count(r.out, "\n"), 4);   /* three entries, one name */
    run_free(&r);

    /* gc drops the names with their blob */
    r = run(root, "cache", "--cache-dir", dir, "gc", "--max", "0", NULL);
    expect_status(&r, 0, "gc --max 0");
    run_free(&r);
    assert_int_equal(sqlite3_open(index, &db), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*) FROM names", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(st, 0), 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(index);
    tu_rmtree(root);
    free(dir);
    free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(cache_commands),
                                       cmocka_unit_test(cache_ls_names)};
    return cmocka_run_group_tests(tests, tool_group_setup, NULL);
}

#else

int main(void)
{
    fprintf(stderr, "built without SQLite: skipping\n");
    return 77;
}

#endif
