/* alloc_wrap.h: the allocation seam of the out-of-memory tests
 * (test_alloc_fail.c, test_manifest_oom.c).
 *
 * The seam is the linker: a test program linked with alloc_wrap.c and
 * SLUICE_ALLOC_WRAP_FLAGS (see alloc.cmake) sends every malloc, calloc,
 * realloc, strdup, posix_memalign and aligned_alloc of its own objects and
 * of the static library's through the wrappers of alloc_wrap.c, which fail
 * the Nth one when armed. The library carries no test hook. Allocations
 * made inside shared libraries (cJSON, OpenSSL, CMocka) are not seen.
 *
 * The count is shared by every thread: armed with n, the (n+1)th
 * allocation from now, whichever thread makes it, fails; later ones
 * succeed. Code that runs while armed (a stream callback, say) must not
 * allocate unless it means to be counted. */
#ifndef SLUICE_TEST_ALLOC_WRAP_H
#define SLUICE_TEST_ALLOC_WRAP_H

/* Arms the seam: allocation number n (0: the next one) fails. */
void aw_arm(long n);

/* Disarms it; returns how many allocations failed since aw_arm (0 or 1). */
long aw_disarm(void);

/* Allocations made through the wrappers since the program started. */
long aw_count(void);

#endif
