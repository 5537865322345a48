/* test_errmsg_calls.c: every public call that takes an open model and
 * fails records a message for sluice_errmsg (issue 38, item 7:
 * sluice_read_into of an unknown name left it empty). Each call of
 * include/sluice.h that can fail on an open model is made to fail, and
 * the message read after it must be non-empty and, where the call names
 * a tensor, name it. The cache handle's calls are checked the same way
 * against sluice_cache_errmsg. */
#include "util.h"

#include <sluice.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct fx {
    char *dir, *path;
    sluice_model *m;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    f->path = tu_join(f->dir, "m.safetensors");
    tu_write_safetensors(f->path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                         NULL, 4);
    assert_int_equal(sluice_open(f->path, NULL, &f->m), SLUICE_OK);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    assert_int_equal(sluice_close(f->m), SLUICE_OK);
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

/* rc must be code, and the model's message non-empty (containing want
 * when given); the message is cleared first by a call on another model,
 * so a stale one cannot pass. */
static void expect_msg(sluice_model *m, int rc, int code, const char *want, const char *call)
{
    if (rc != code)
        fail_msg("%s: returned %d (%s), expected %d (%s)", call, rc, sluice_strerror(rc), code,
                 sluice_strerror(code));
    const char *msg = sluice_errmsg(m);
    if (!msg || !*msg)
        fail_msg("%s: failed with %s and left sluice_errmsg empty", call, sluice_strerror(rc));
    if (want && !strstr(msg, want))
        fail_msg("%s: message does not name %s: %s", call, want, msg);
}

static int never(void *user, sluice_tensor *t, int status, const struct sluice_tensor_info *info,
                 const char *message)
{
    (void)status, (void)info, (void)message;
    int *calls = user;
    (*calls)++;
    sluice_release(t);
    return 0;
}

/* A fresh model per check: the thread's message for it starts empty. */
static sluice_model *fresh(const fx *f)
{
    sluice_model *m = NULL;
    assert_int_equal(sluice_open(f->path, NULL, &m), SLUICE_OK);
    assert_string_equal(sluice_errmsg(m), "");
    return m;
}

#define CHECK(call, code, want)                                   \
    do {                                                          \
        sluice_model *m = fresh(f);                               \
        expect_msg(m, (call), (code), (want), #call);             \
        assert_int_equal(sluice_close(m), SLUICE_OK);             \
    } while (0)

static void every_failing_call_says_why(void **state)
{
    fx *f = *state;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    sluice_tensor *t = NULL;
    uint8_t d[32], buf[8];
    uint64_t cb = 0;
    uint32_t cc = 0;
    size_t needed = 0;
    int calls = 0;
    const char *nope[] = {"nope"};
    char text[64];

    /* the index */
    CHECK(sluice_info(m, 7, &ti), SLUICE_E_INVAL, "sluice_info");
    CHECK(sluice_info(m, 0, NULL), SLUICE_E_INVAL, "sluice_info");
    CHECK(sluice_find(m, "nope", &ti), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_find(m, NULL, &ti), SLUICE_E_INVAL, "name is NULL");
    CHECK(sluice_find_n(m, "nope", 4, NULL), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_file_info(m, 3, &fi), SLUICE_E_INVAL, "sluice_file_info");
    /* loading */
    CHECK(sluice_prefetch(m, nope, 1), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_acquire(m, "nope", &t), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_acquire(m, "a", NULL), SLUICE_E_INVAL, NULL);
    CHECK(sluice_acquire_index(m, 9, &t), SLUICE_E_INVAL, "index");
    CHECK(sluice_read_into(m, "nope", 0, buf, 1), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_read_into(m, "a", 3, buf, 2), SLUICE_E_INVAL, "\"a\"");
    CHECK(sluice_read_into(m, "a", 0, NULL, 2), SLUICE_E_INVAL, "dst");
    CHECK(sluice_acquire_range(m, "nope", 0, 1, &t), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_acquire_range(m, "a", 2, 1, &t), SLUICE_E_INVAL, "byte_end");
    CHECK(sluice_digest_range(m, 5, 0, 1, d), SLUICE_E_INVAL, "sluice_digest_range");
    CHECK(sluice_read_part_into(m, "nope", 0, 0, 2, buf, 2), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_read_part_into(m, "a", 0, 0, 3, buf, 1), SLUICE_E_INVAL, NULL);
    CHECK(sluice_acquire_part(m, "nope", 0, 0, 2, &t), SLUICE_E_NOT_FOUND, "\"nope\"");
    sluice_part_options po = {.size = 1}; /* not from sluice_part_options_init */
    CHECK(sluice_read_part_into_ex(m, "nope", 0, 0, 2, buf, 2, NULL), SLUICE_E_NOT_FOUND,
          "\"nope\"");
    CHECK(sluice_read_part_into_ex(m, "a", 0, 0, 2, buf, 2, &po), SLUICE_E_INVAL,
          "part options");
    CHECK(sluice_acquire_part_ex(m, "nope", 0, 0, 2, &t, NULL), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_acquire_part_ex(m, "a", 0, 0, 2, &t, &po), SLUICE_E_INVAL, "part options");
    CHECK(sluice_digest_part(m, 5, 0, 0, 2, d), SLUICE_E_INVAL, "sluice_digest_part");
    CHECK(sluice_stream(m, nope, 1, never, &calls), SLUICE_E_NOT_FOUND, "\"nope\"");
    CHECK(sluice_stream(m, NULL, 0, NULL, NULL), SLUICE_E_INVAL, NULL);
    CHECK(sluice_stream_ex(m, nope, 1, never, &calls, NULL), SLUICE_E_NOT_FOUND, "\"nope\"");
    assert_int_equal(calls, 0);
    /* verification (the model has no manifest) */
    CHECK(sluice_manifest_tensor(m, 0, d), SLUICE_E_NOT_FOUND, "manifest");
    CHECK(sluice_manifest_tensor(m, 4, d), SLUICE_E_INVAL, "sluice_manifest_tensor");
    CHECK(sluice_manifest_chunks(m, 0, &cb, &cc), SLUICE_E_NOT_FOUND, "manifest");
    CHECK(sluice_manifest_chunks(m, 4, &cb, &cc), SLUICE_E_INVAL, "sluice_manifest_chunks");
    CHECK(sluice_manifest_file(m, 0, d, NULL), SLUICE_E_NOT_FOUND, "manifest");
    CHECK(sluice_manifest_file(m, 2, d, NULL), SLUICE_E_INVAL, "sluice_manifest_file");
    CHECK(sluice_file_header_digest(m, 2, SLUICE_ALG_SHA256, d), SLUICE_E_INVAL,
          "sluice_file_header_digest");
    CHECK(sluice_verify(m, nope, 1, NULL, NULL), SLUICE_E_NOT_FOUND, "\"nope\"");
    /* statistics and metrics */
    CHECK(sluice_stats(m, NULL), SLUICE_E_INVAL, "sluice_stats");
    CHECK(sluice_metrics_write(m, text, sizeof text, &needed, (sluice_metrics_format)99),
          SLUICE_E_INVAL, "format");
    /* close with a live handle: refused, and says why */
    sluice_model *m = fresh(f);
    assert_int_equal(sluice_acquire(m, "a", &t), SLUICE_OK);
    expect_msg(m, sluice_close(m), SLUICE_E_BUSY, NULL, "sluice_close with a live handle");
    assert_int_equal(sluice_release(t), SLUICE_OK);
    assert_int_equal(sluice_close(m), SLUICE_OK);
}

/* The issue's own case, on the fixture's long-lived model: a read of an
 * unknown name after a successful read says which name. */
static void read_into_unknown_name(void **state)
{
    fx *f = *state;
    uint8_t buf[4];
    assert_int_equal(sluice_read_into(f->m, "a", 0, buf, 4), SLUICE_OK);
    expect_msg(f->m, sluice_read_into(f->m, "b.weight", 0, buf, 4), SLUICE_E_NOT_FOUND,
               "\"b.weight\"", "sluice_read_into of an unknown name");
}

/* A model whose open failed, and no model at all: the message is there. */
static void failed_open_and_null(void **state)
{
    fx *f = *state;
    char *missing = tu_join(f->dir, "missing.safetensors");
    sluice_model *m = NULL;
    assert_int_not_equal(sluice_open(missing, NULL, &m), SLUICE_OK);
    expect_msg(m, sluice_find(m, "a", NULL), SLUICE_E_INVAL, "missing.safetensors",
               "sluice_find on a failed open");
    expect_msg(m, sluice_read_into(m, "a", 0, NULL, 0), SLUICE_E_INVAL, "missing.safetensors",
               "sluice_read_into on a failed open");
    sluice_close(m);
    free(missing);
    assert_true(strlen(sluice_errmsg(NULL)) > 0);
}

/* The cache handle: each failing call leaves sluice_cache_errmsg set. */
static void cache_calls_say_why(void **state)
{
    fx *f = *state;
    char *none = tu_join(f->dir, "no-cache-here");
    sluice_cache *c = NULL;
    int rc = sluice_cache_open_existing(none, &c);
    if (rc == SLUICE_E_UNSUPPORTED) {
        sluice_cache_close(c);
        free(none);
        skip();
    }
    assert_int_equal(rc, SLUICE_E_NOT_FOUND);
    assert_non_null(strstr(sluice_cache_errmsg(c), "no-cache-here"));
    uint64_t a = 0, b = 0;
    assert_int_equal(sluice_cache_usage(c, &a, &b), SLUICE_E_INVAL);
    assert_true(strlen(sluice_cache_errmsg(c)) > 0);
    assert_int_equal(sluice_cache_gc(c, 0, &a, &b), SLUICE_E_INVAL);
    assert_true(strlen(sluice_cache_errmsg(c)) > 0);
    assert_int_equal(sluice_cache_verify(c, &a, &b, NULL, NULL), SLUICE_E_INVAL);
    assert_true(strlen(sluice_cache_errmsg(c)) > 0);
    sluice_cache_close(c);
    free(none);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(every_failing_call_says_why, setup, teardown),
        cmocka_unit_test_setup_teardown(read_into_unknown_name, setup, teardown),
        cmocka_unit_test_setup_teardown(failed_open_and_null, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_calls_say_why, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
