/* test_alloc_fail.c: the Nth allocation fails, for every N.
 *
 * The seam is the linker: this program is linked with --wrap for the
 * allocation calls, so every malloc the library's objects make goes
 * through __wrap_malloc below, which fails the Nth one when armed. The
 * library carries no test hook. Each step must return a clean error
 * (SLUICE_E_NOMEM), leak nothing (LeakSanitizer checks at exit) and leave
 * an open model usable. */
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <sluice.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);

static atomic_long countdown = -1; /* < 0: disarmed; 0: fail this one */
static atomic_long failures;

static int should_fail(void)
{
    long c = atomic_load(&countdown);
    while (c >= 0) {
        if (atomic_compare_exchange_weak(&countdown, &c, c - 1)) {
            if (c == 0) {
                atomic_fetch_add(&failures, 1);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return should_fail() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return should_fail() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return should_fail() ? NULL : __real_strdup(s); }
int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    return should_fail() ? 12 /* ENOMEM */ : __real_posix_memalign(p, align, n);
}
void *__wrap_aligned_alloc(size_t align, size_t n)
{
    return should_fail() ? NULL : __real_aligned_alloc(align, n);
}

static void arm(long n)
{
    atomic_store(&failures, 0);
    atomic_store(&countdown, n);
}

static long disarm(void)
{
    atomic_store(&countdown, -1);
    return atomic_load(&failures);
}

static char *make_model(void)
{
    char *dir = tu_tmpdir();
    char *p1 = tu_join(dir, "model-00001-of-00002.safetensors");
    char *p2 = tu_join(dir, "model-00002-of-00002.safetensors");
    char *idx = tu_join(dir, "model.safetensors.index.json");
    tu_write_safetensors(p1, "{\"__metadata__\":{\"format\":\"pt\"},"
                             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                             "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}", NULL, 11);
    tu_write_safetensors(p2, "{\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", NULL, 8);
    const char *json = "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                       "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}";
    tu_write_file(idx, json, strlen(json));
    free(p1);
    free(p2);
    free(idx);
    return dir;
}

/* sluice_open of a sharded model, failing allocation N for N = 0, 1, ...
 * until an open completes without a failure. */
static void test_open(void **state)
{
    (void)state;
    char *dir = make_model();
    long n;
    for (n = 0; n < 100000; n++) {
        sluice_model *m = NULL;
        arm(n);
        int rc = sluice_open(dir, NULL, &m);
        long failed = disarm();
        if (!failed) {
            assert_int_equal(rc, SLUICE_OK);
            assert_int_equal(sluice_count(m), 3);
            sluice_close(m);
            break;
        }
        if (rc != SLUICE_E_NOMEM)
            fprintf(stderr, "allocation %ld failed: got %d (%s)\n", n, rc, sluice_errmsg(m));
        assert_int_equal(rc, SLUICE_E_NOMEM);
        assert_int_equal(sluice_count(m), 0);
        sluice_close(m); /* NULL when the model itself could not be allocated */
    }
    printf("sluice_open: %ld allocation points, each failed once, all clean\n", n);
    assert_true(n > 5);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
