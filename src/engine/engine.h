/* engine.h: the read pipeline of a model (engine.c and its parts).
 *
 *   plan -> ring (io_uring or pread threads) -> pool buffer -> hash -> handle
 *
 * The engine reads what the index says and checks the digests it was
 * given at create; it knows nothing of the model, the manifest or the
 * API's error detail. The API layer (api.c) resolves names, checks
 * arguments, records errors, and brackets every call that may wait or
 * touch the engine after its lock with sl_engine_enter / sl_engine_leave,
 * so that close never frees an engine a call is still inside.
 */
#ifndef SLUICE_ENGINE_H
#define SLUICE_ENGINE_H

#include "base/digest.h"
#include "base/error.h"
#include "index/range.h"
#include "index/index.h"
#include "sluice.h"

#include <stdint.h>

typedef struct sl_engine sl_engine;

/* Creates the engine for an open index (which must outlive it). expect
 * holds ix->ntensors pointers: the digest (opts->algorithm) tensor i must
 * match, or NULL when it is not checked; expect itself may be NULL
 * (nothing checked). The digests are copied. chunks (may be NULL) holds
 * ix->ntensors chunk lists: a checked tensor with chunks is hashed chunk
 * by chunk on several workers and each chunk must match; it is not
 * copied and must outlive the engine. opts must have been checked.
 * mirrors: the locations of opts->fallback, parsed (base/location.h; the
 * model's, which must outlive the engine; NULL when there is none). */
struct sl_location;
int sl_engine_create(const sl_index *ix, const sluice_options *opts,
                     const struct sl_location *const *mirrors, const uint8_t *const *expect,
                     const sl_chunk_digests *chunks, sl_engine **out, sl_err *err);

struct sl_cache;
/* Gives the engine a persistent cache (cache.h; the engine owns it from
 * now, and closes it even when this fails), right after create, before
 * any call: loads of remote tensors use its blobs, and with
 * SLUICE_F_TRUST_UNCHANGED its memo spares hashing local tensors verified
 * before. model: the model's location as messages show it, which the
 * blobs stored record with their tensors' names (borrowed: it outlives
 * the engine). */
int sl_engine_attach_cache(sl_engine *e, struct sl_cache *c, const char *model, sl_err *err);
/* The cache's warning (cache.h), the memo's refusal of a file, or NULL
 * (sluice_cache_warning's order). */
const char *sl_engine_cache_warning(const sl_engine *e);

/* Waits for calls on their way out and reads in flight, and frees the
 * engine. With live handles (or a stream running) it frees nothing and
 * returns SLUICE_E_BUSY. NULL: OK. */
int sl_engine_destroy(sl_engine *e, sl_err *err);

/* A public call enters before it uses the engine and leaves as its very
 * last touch of the engine or the model (after recording its error). */
int sl_engine_enter(sl_engine *e, sl_err *err); /* SLUICE_E_INVAL once close began */
void sl_engine_leave(sl_engine *e);
/* The test pause hook (engine_hooks.h), called between the two. */
void sl_engine_pause_point(sl_engine *e, int where);
enum { SL_PAUSE_STREAM_EXIT = 1, SL_PAUSE_RELEASE_EXIT, SL_PAUSE_ACQUIRE_EXIT, SL_PAUSE_REFUSED,
       SL_PAUSE_VERIFY_EXIT, SL_PAUSE_LOAD_STARTED, SL_PAUSE_BLOB_MISSED, SL_PAUSE_SPANS_WOKEN,
       SL_PAUSE_PART_WAIT, SL_PAUSE_SPANS_ISSUED };

/* A handle on len bytes at buf (malloc'd; the handle owns it and frees
 * it at release) that were read and verified from tensor i: a range
 * (sluice_acquire_range). Counted as a live handle. Lock not held. */
int sl_engine_grant_range(sl_engine *e, size_t i, void *buf, uint64_t len, sluice_tensor **out,
                          sl_err *err);
typedef struct sl_pool_blk sl_pool_blk;
/* The same for a part (sluice_acquire_part): block (malloc'd: info, which
 * describes the part) and data's buffer blk of the pool (NULL for an
 * empty part, sl_engine_part_room) are the handle's, given back at
 * release. */
int sl_engine_grant_part(sl_engine *e, size_t i, void *block, sl_pool_blk *blk, const void *data,
                         uint64_t len, const struct sluice_tensor_info *info, sluice_tensor **out,
                         sl_err *err);

/* A buffer of len bytes of the pool (64-byte aligned) for a part, `what`
 * as messages name it: as an acquire's load takes room, evicting unheld
 * buffers, waiting while room may come back (reads in flight, streams
 * delivering), else SLUICE_E_POOL_EXHAUSTED; SLUICE_E_TOO_LARGE when len
 * exceeds the pool; SLUICE_E_NOMEM; SLUICE_E_CANCELLED when cancel (NULL:
 * none) is requested before room was found (then nothing is taken). len
 * 0: *buf and *blk NULL. Give it back with sl_engine_part_room_free
 * unless a handle took it. Lock not held; a caller inside the engine. */
int sl_engine_part_room(sl_engine *e, const char *what, uint64_t len, sluice_cancel *cancel,
                        void **buf, sl_pool_blk **blk, sl_err *err);
void sl_engine_part_room_free(sl_engine *e, sl_pool_blk *blk);

/* Reads n spans of file f (spans ascending, none overlapping) into their
 * dst through the engine's seams and waits for them: a local file's
 * through the io_uring ring or its pread threads, spans less than
 * SLUICE_PART_GAP apart one read, a read at most chunk_bytes; a remote
 * file's through the remote seam, cut at chunk_bytes, one read per
 * request it makes of them (f's source's batch_spans: a multi-range
 * request, or a coalesced range where the server refuses those), under rc
 * (the direct hop: its requests skip the proxy). Up to queue_depth reads
 * are in flight, shared with the loads (the pump issues these first: the
 * caller waits). Counted as a load's reads are (reads, the read
 * histogram, bytes_read: the spans' bytes, not a local file's gaps;
 * retries; a remote file's requests and their bytes, gaps included, in
 * remote_reads and remote_bytes). Returns SLUICE_OK, SLUICE_E_IO,
 * SLUICE_E_FILE_CHANGED (the file ends early, the object changed),
 * SLUICE_E_REMOTE or SLUICE_E_NOMEM; with cancel (NULL: none) requested,
 * before the call or while it waits, SLUICE_E_CANCELLED: no read goes out
 * any more, those in flight are waited for (they write into the spans'
 * dst; a remote one's transfer is aborted). *through_proxy: set to 1
 * when some of a remote file's bytes came through the proxy, else left.
 * Lock not held; a caller inside the engine (sl_engine_enter). */
int sl_engine_read_spans(sl_engine *e, sluice_cancel *cancel, const sl_file *f,
                         const sl_remote_cfg *rc, const sl_span *spans, size_t n,
                         int *through_proxy, sl_err *err);
/* That function as a reader for the range reads (range.h), cancel its
 * token (NULL: none). */
sl_reader sl_engine_reader(sl_engine *e, sluice_cancel *cancel);

/* The persistent cache's side of a part (engine_cache.c): want its part
 * digest (NULL: none, nothing cached), kept only for a part of a file
 * worth caching (a remote one) of a model with a cache. Part_cached reads
 * the blob of want into dst (len bytes) and hashes it: 1 when it matched
 * (counted as a disk hit, bytes_hashed), else 0 (a miss; a blob that
 * failed is dropped, disk_rotten). Part_store stores len verified bytes
 * at data as that blob, recorded as tensor name (name_len bytes) of the
 * model. Lock not held; a caller inside the engine. */
int sl_engine_part_cached(sl_engine *e, size_t i, const uint8_t want[32], void *dst, uint64_t len);
void sl_engine_part_store(sl_engine *e, size_t i, const uint8_t want[32], const void *data,
                          uint64_t len, const char *name, size_t name_len);

/* Adds a range read's figures (range.h) to the stats; failed: it failed. */
void sl_engine_range_tally(sl_engine *e, const sl_range_tally *t, int failed);

/* sluice_acquire of tensor i (< ix->ntensors). */
int sl_engine_acquire(sl_engine *e, size_t i, sluice_tensor **out, sl_err *err);

/* sluice_prefetch: ids (malloc'd, n > 0, taken by the engine) or n = 0
 * (ids NULL) for the model's order. Returns SLUICE_OK or SLUICE_E_NOMEM. */
int sl_engine_prefetch(sl_engine *e, size_t *ids, size_t n, sl_err *err);

/* sluice_stream_ex over ids (NULL: every tensor, n ignored), with checked
 * options. */
int sl_engine_stream(sl_engine *e, const size_t *ids, size_t n, sluice_stream_fn fn,
                     void *user, const sluice_stream_options *so, sl_err *err);

/* The counters, whole (the API copies the caller's part). */
void sl_engine_stats(sl_engine *e, struct sluice_stats *out);
/* What the model was opened to verify against (sluice_verification),
 * for the stats' unverified field. */
void sl_engine_note_verification(sl_engine *e, uint32_t state);

/* sluice_trim: returns the bytes given back. */
uint64_t sl_engine_trim(sl_engine *e);

/* The model's own location could not be opened and mirror k (1-based)
 * serves its index (the engine's "model's files" are that mirror's,
 * api/open_mirror.c): mirrors 1..k are not tried again for a failed
 * tensor (why[j], may be NULL: mirror j + 1's failure at open), and
 * messages name mirror k where they would say "primary". Right after
 * create. */
void sl_engine_served_by(sl_engine *e, unsigned k, const char *const *why);

/* Handles: sluice_release (enters and leaves by itself: a handle knows
 * its engine) and the accessors. */
int sl_handle_release(sluice_tensor *t);
const void *sl_handle_data(const sluice_tensor *t);
uint64_t sl_handle_size(const sluice_tensor *t);
const struct sluice_tensor_info *sl_handle_info(const sluice_tensor *t);
int sl_handle_digest(const sluice_tensor *t, uint8_t digest[32]);
const char *sl_handle_source(const sluice_tensor *t);

#endif
