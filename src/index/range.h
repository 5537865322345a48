/* range.h: verified reads of a byte range of a tensor into the caller's
 * memory (range.c), for sluice_read_into and sluice_acquire_range. */
#ifndef SLUICE_RANGE_H
#define SLUICE_RANGE_H

#include "base/digest.h"
#include "base/error.h"
#include "index/index.h"
#include "sources/remote.h"
#include "sluice.h"

#include <stdint.h>

/* What one call did, for the stats. */
typedef struct sl_range_tally {
    uint64_t bytes_read, bytes_hashed, chunks_verified, checksum_failures;
    uint64_t remote_reads, remote_bytes;    /* range requests of a remote file */
    uint64_t part_fallback_bytes;           /* whole tensors read to check a part */
    /* some of the bytes came through the model's proxy: set by a reader
     * that knows (the engine's, from its requests), else by the caller */
    uint8_t through_proxy;
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

/* A reader of many spans of one file at once (the engine's,
 * sl_engine_reader: its seams, under its queue depth; a local file's
 * spans less than SLUICE_PART_GAP apart one read of the ring, a remote
 * file's in multi-range requests of the remote seam): each span's len
 * bytes at offset land in its dst, all of them or an error (err set:
 * SLUICE_E_IO, SLUICE_E_FILE_CHANGED for a file that ends early or an
 * object that changed, SLUICE_E_REMOTE, SLUICE_E_NOMEM). It counts what
 * it read in its own stats, not in a tally. Spans ascending, none
 * overlapping. rc: the remote configuration the read is made under (the
 * index's: the direct hop for a read again directly, whose requests then
 * skip the proxy), NULL for a model without remote files. cancel (may be
 * NULL): once requested, no new read goes out, those in flight are
 * waited for (a remote request's transfer aborted), and the call returns
 * SLUICE_E_CANCELLED. *through_proxy is set to 1 when some of the bytes
 * came through the model's proxy (sluice.h "Proxies"), else left. */
typedef int (*sl_spans_fn)(void *ctx, sluice_cancel *cancel, const sl_file *f,
                           const sl_remote_cfg *rc, const sl_span *spans, size_t n,
                           int *through_proxy, sl_err *err);
typedef struct sl_reader {
    sl_spans_fn read;
    void *ctx;
    sluice_cancel *cancel;  /* NULL: none */
} sl_reader;

/* Rank `rank` of n equal parts of a tensor along dim: count segments of
 * seg bytes, the first at tensor byte first, each stride bytes after the
 * one before (dim 0, or only size-1 dims before it: one segment). */
typedef struct sl_part_geom {
    uint32_t dim;
    uint64_t rank, n;
    uint64_t count, seg, stride, first;
} sl_part_geom;

/* The geometry of rank of n parts of t along dim; SLUICE_E_INVAL (with
 * the numbers) for a dim t lacks, a rank past n, or a dim n does not
 * divide. */
int sl_part_geometry(const struct sluice_tensor_info *t, uint32_t dim, uint64_t rank, uint64_t n,
                     sl_part_geom *g, sl_err *err);

/* Reads the part into dst (count x seg bytes, contiguous), verified:
 * against want_part (the manifest's digest of the part) when given,
 * reading only the segments; else one contiguous part goes the way of
 * sl_range_read (chunk digests, or the whole tensor), and a strided one
 * is checked by hashing the whole tensor (tally->part_fallback_bytes).
 * want NULL and want_part NULL: read only. rd (may be NULL) reads the
 * file's bytes (the engine's reader: every read of the call goes through
 * it, the strided segments in one call: a remote file's in multi-range
 * requests); NULL: its source's table, synchronously, segment by
 * segment. Thread-safe. */
int sl_part_read(const sl_index *ix, size_t i, const sl_part_geom *g, void *dst,
                 const uint8_t *want_part, const uint8_t *want, const sl_chunk_digests *chunks,
                 sluice_algorithm alg, const sl_reader *rd, sl_range_tally *tally, sl_err *err);

/* The digest of the part's bytes laid out contiguously, as the file holds
 * them now (what `sluice manifest --parts` writes). Thread-safe. */
int sl_part_digest(const sl_index *ix, size_t i, const sl_part_geom *g, sluice_algorithm alg,
                   uint8_t out[32], sl_range_tally *tally, sl_err *err);

#endif
