/* alloc_wrap.c: see alloc_wrap.h. The __wrap_ functions replace the
 * allocation calls at link time (-Wl,--wrap=...); __real_ reaches libc. */
#include "alloc_wrap.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
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
static atomic_long total;

static int should_fail(void)
{
    atomic_fetch_add(&total, 1);
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
    return should_fail() ? ENOMEM : __real_posix_memalign(p, align, n);
}
void *__wrap_aligned_alloc(size_t align, size_t n)
{
    return should_fail() ? NULL : __real_aligned_alloc(align, n);
}

void aw_arm(long n)
{
    atomic_store(&failures, 0);
    atomic_store(&countdown, n);
}

long aw_disarm(void)
{
    atomic_store(&countdown, -1);
    return atomic_load(&failures);
}

long aw_count(void)
{
    return atomic_load(&total);
}
