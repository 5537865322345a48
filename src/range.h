/* range.h: verified reads of a byte range of a tensor into the caller's
 * memory (range.c), for sluice_read_into and sluice_acquire_range. */
#ifndef SLUICE_RANGE_H
#define SLUICE_RANGE_H

#include "digest.h"
#include "error.h"
#include "index.h"

#include <stdint.h>

/* What one call did, for the stats. */
typedef struct sl_range_tally {
    uint64_t bytes_read, bytes_hashed, chunks_verified, checksum_failures;
    uint64_t remote_reads, remote_bytes;    /* range requests of a remote file */
} sl_range_tally;

/* Reads bytes [begin, begin + len) of tensor i (within its nbytes) into
 * dst. want NULL: the tensor is not checked, the bytes are only read.
 * Else with chunks (may be NULL or empty) every chunk covering the range
 * is read whole and must match its digest; without, the whole tensor is
 * read and must match want. On failure dst holds anything. Thread-safe
 * (pread on the index's descriptors, or range requests through
 * ix->remote for a remote file; nothing shared written). */
int sl_range_read(const sl_index *ix, size_t i, uint64_t begin, uint64_t len, void *dst,
                  const uint8_t *want, const sl_chunk_digests *chunks, sluice_algorithm alg,
                  sl_range_tally *tally, sl_err *err);

/* The digest in alg of bytes [begin, end) of tensor i as the file holds
 * them now (nothing verified). Thread-safe. */
int sl_range_digest(const sl_index *ix, size_t i, uint64_t begin, uint64_t end,
                    sluice_algorithm alg, uint8_t out[32], sl_range_tally *tally, sl_err *err);

#endif
