/* digest.h: one interface over the digest algorithms a manifest may name
 * (digest.c): SHA-256 through OpenSSL's EVP, BLAKE3 through the upstream
 * C implementation (built from Debian's librust-blake3-dev sources when
 * CMake finds them). Both give 32-byte digests.
 *
 * A context is used by one thread at a time; different contexts are
 * independent.
 */
#ifndef SLUICE_DIGEST_H
#define SLUICE_DIGEST_H

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sl_md sl_md;

/* A tensor's chunk digests (a version 2 manifest's "chunks"): the digest
 * of each consecutive `bytes`-byte chunk of it, the last one shorter.
 * count 0: none. */
typedef struct sl_chunk_digests {
    uint64_t bytes;
    uint32_t count;
    const uint8_t (*digest)[32];
} sl_chunk_digests;

/* 1 when this build can compute alg, else 0 (BLAKE3 without its sources,
 * or a value out of range). */
int sl_md_supported(sluice_algorithm alg);

/* A context, ready for updates. NULL: out of memory, OpenSSL failed, or
 * alg is not supported. */
sl_md *sl_md_new(sluice_algorithm alg);
void sl_md_free(sl_md *md);

/* Starts a new digest on md. 0 or -1 (OpenSSL failed). */
int sl_md_reset(sl_md *md);
int sl_md_update(sl_md *md, const void *p, size_t n);
/* The digest of everything since the last reset into out; md needs a
 * reset before it is used again. 0 or -1. */
int sl_md_final(sl_md *md, uint8_t out[32]);

/* The digest of n bytes at p, in one call. 0 or -1. */
int sl_md_oneshot(sluice_algorithm alg, const void *p, size_t n, uint8_t out[32]);

/* The algorithm md computes. */
sluice_algorithm sl_md_algorithm(const sl_md *md);

/* How messages name alg: "SHA-256", "BLAKE3". */
const char *sl_md_title(sluice_algorithm alg);

/* The digest of no bytes, or NULL for an unsupported alg. */
const uint8_t *sl_md_empty(sluice_algorithm alg);

#endif
