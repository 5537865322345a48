/* hash.h: the hashing layer (hash.c): digests (digest.h) on worker threads over
 * buffers whose bytes arrive in order, while they arrive.
 *
 * It knows nothing of tensors, slots or manifests. A caller makes a job
 * over `len` bytes at `base`, says how many of them have arrived
 * (sl_hash_job_ready, any number of times, growing), and gets one
 * completion when the job is done: the digest of all `len` bytes, or an
 * OpenSSL failure, or the word that a cancelled job is quiet. A job
 * without a digest only waits for its bytes and calls back on a worker
 * thread (the engine uses that to move O_DIRECT bytes off its reaper).
 *
 * A job may be cut into pieces of piece_bytes, each with a digest of its
 * own (a manifest's chunk digests): the pieces of one job hash on several
 * workers at once. One piece is in one worker's hands at a time, so its
 * bytes are hashed in order; different jobs hash in parallel. The completion runs on a worker
 * with no lock of the hasher held, so it may take the caller's lock; the
 * caller may call sl_hash_job_ready and sl_hash_job_cancel while holding
 * that same lock (lock order: the caller's, then the hasher's).
 */
#ifndef SLUICE_HASH_H
#define SLUICE_HASH_H

#include "base/error.h"

#include <stdint.h>

typedef struct sl_hasher sl_hasher;
typedef struct sl_hash_job sl_hash_job;

/* Completion statuses besides SLUICE_OK and SLUICE_E_NOMEM (OpenSSL). */
#define SL_HASH_CANCELLED 1

/* Called once per job, on a worker thread: status SLUICE_OK (the digest
 * is final, or the bytes are all there for a job without one),
 * SLUICE_E_NOMEM (OpenSSL failed), or SL_HASH_CANCELLED. After it the
 * hasher never touches the job again. */
typedef void (*sl_hash_done_fn)(void *ctx, sl_hash_job *job, int status);

/* Starts `threads` workers (at least 1), whose jobs digest with alg.
 * Returns SLUICE_OK or SLUICE_E_NOMEM (no memory, no such digest, no
 * thread). */
int sl_hasher_create(unsigned threads, sluice_algorithm alg, sl_hash_done_fn done, void *ctx,
                     sl_hasher **out, sl_err *err);

/* Lets the jobs in workers' hands finish (their completions run), drops
 * queued ones, joins the workers and frees the hasher. Jobs stay the
 * caller's to free. NULL is a no-op. */
void sl_hasher_destroy(sl_hasher *h);

/* Waits until no job is queued or in a worker's hands (completions
 * included). The caller must not hold a lock that a completion takes. */
void sl_hasher_wait_idle(sl_hasher *h);

/* A job over len bytes at base (len > 0), with a digest or not, in
 * pieces of piece_bytes (0, or len or more: one piece, the whole). Nothing
 * is queued until bytes are ready. Returns SLUICE_OK or SLUICE_E_NOMEM. */
int sl_hash_job_create(sl_hasher *h, const unsigned char *base, uint64_t len, int with_digest,
                       uint64_t piece_bytes, void *owner, sl_hash_job **out);

/* Frees a job that is done, quiet after a cancel, or was never made
 * ready. NULL is a no-op. */
void sl_hash_job_free(sl_hash_job *job);

/* The first `ready` bytes (never fewer than before) have arrived; once
 * all len have, the job completes after hashing them. */
void sl_hash_job_ready(sl_hasher *h, sl_hash_job *job, uint64_t ready);

/* Stops a job. Returns 1 when it is quiet at once (no completion will
 * come: it may be freed), 0 when a worker holds it (its completion will
 * come, SL_HASH_CANCELLED or, when it was already finishing, SLUICE_OK). */
int sl_hash_job_cancel(sl_hasher *h, sl_hash_job *job);

void *sl_hash_job_owner(const sl_hash_job *job);
/* The digest (32 bytes) of the first piece (of the whole, for a job of
 * one piece), valid once the completion said SLUICE_OK on a job with a
 * digest. */
const unsigned char *sl_hash_job_digest(const sl_hash_job *job);
/* The job's pieces, and the digest of piece k (< pieces), likewise. */
uint32_t sl_hash_job_pieces(const sl_hash_job *job);
const unsigned char *sl_hash_job_piece_digest(const sl_hash_job *job, uint32_t k);
/* The most workers that held the job at once. */
unsigned sl_hash_job_parallel_peak(const sl_hash_job *job);
/* Bytes hashed so far. */
uint64_t sl_hash_job_hashed(const sl_hash_job *job);
/* Time spent in its digest calls so far, in ns (metrics). */
uint64_t sl_hash_job_busy_ns(const sl_hash_job *job);

#endif
