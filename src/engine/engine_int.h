/* engine_int.h: what the parts of the engine share. Not for other
 * components.
 *
 *   engine.c   life cycle, handles, acquire, release, prefetch, stats, trim
 *   slot.c     the state of every tensor's slot: its only writer, with the
 *              LRU lists and the pool (see the state machine there)
 *   sched.c    plan, streams' read-ahead, demand, the pump, read completion
 *   stream.c   sluice_stream: delivery, cancellation, progress
 *   io.c       the I/O seam; hash.c the hashing layer (neither knows slots)
 *
 * Locking: one mutex per engine, e->lock, guards everything below that is
 * not marked immutable: slots, lists, plan, streams, pool, counters. It is
 * never held across a system call that may copy tensor bytes nor across a
 * digest update: those run with the lock dropped, on reads in flight or
 * hash jobs, whose buffers nobody else touches until they complete.
 * Lock order: e->lock, then the seam's or the hasher's own lock.
 */
#ifndef SLUICE_ENGINE_INT_H
#define SLUICE_ENGINE_INT_H

#include "base/cancel.h"
#include "engine/engine.h"
#include "engine/hash.h"
#include "sources/io.h"
#include "counters/metrics.h"
#include "engine/pool.h"
#include "sources/remote.h"
#include "index/source.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#define SL_NONE SIZE_MAX
#define SL_MAX_SEGS 32              /* tensors one coalesced read may cover */
#define SL_DIRECT_ALIGN 4096u       /* O_DIRECT offsets, lengths, buffers */
#define SL_DIRECT_MIN (64u << 10)   /* smaller tensors are read buffered even with SLUICE_F_DIRECT */
#define SL_HANDLE_QUARANTINE 1024u /* released handles kept before reuse */
#define SL_STREAM_WINDOW 4096u      /* positions a stream may have pinned ahead */

/* The states of a slot (one tensor); slot.c draws the machine. */
typedef enum sl_slot_state {
    SL_SLOT_IDLE = 0,            /* no buffer */
    SL_SLOT_READING,             /* a buffer; chunks read, hashed as they land */
    SL_SLOT_HASHING,             /* every chunk read; the hasher finishes */
    SL_SLOT_READY,               /* the verified bytes, in place */
    SL_SLOT_FAILED               /* failed; waits for its reads and hash job */
} sl_slot_state;

enum { SL_LRU_NONE, SL_LRU_CACHED, SL_LRU_PREFETCHED };

/* How much room a start may take: any unheld buffer (demand), or only
 * buffers already handed out and released (read-ahead). */
enum { SL_ROOM_ANY, SL_ROOM_SPEC };

typedef struct sl_slot {
    /* written by slot.c only */
    sl_slot_state state;
    uint8_t hashed;      /* its digest is computed (a digest to check, or HASH_ALL) */
    uint8_t direct;      /* this load reads an aligned span (data at buf + delta) */
    uint8_t consumed;    /* handed out since it was read */
    uint8_t spent;       /* last handed out by a stream: its room is taken first */
    uint8_t lru;         /* SL_LRU_*: the list it is on */
    uint8_t has_digest;  /* digest holds the SHA-256 of the bytes */
    uint8_t job_busy;    /* the hash job will still call back */
    uint32_t bad_chunk;  /* the first chunk digest that did not match */
    uint32_t refs, pins; /* handles; waiters that will take a handle */
    uint32_t nchunks, issued, done, inflight, prefix;
    uint64_t done_word;  /* chunk completion bits when nchunks <= 64 */
    uint64_t *done_bits; /* else */
    sl_pool_blk *blk;
    unsigned char *buf;  /* the pool buffer */
    const unsigned char *data; /* the tensor's first byte, once READY */
    uint64_t delta;      /* tensor offset - span start (direct only) */
    uint64_t span;       /* bytes read: nbytes, or the aligned span */
    uint64_t chunk;      /* bytes per chunk of this load */
    sl_hash_job *job;
    unsigned char digest[32];
    uint64_t gen;        /* failures so far: waiters compare */
    int err_code;
    char *err_msg;       /* the last failure's detail */
    size_t lprev, lnext; /* LRU */

    /* the source of this load (fallback.c): 0 the model's own files, k a
     * mirror (opts.fallback[k - 1]); written by slot.c and fallback.c */
    uint8_t source;
    uint8_t fb_wait;     /* FAILED, its buffer kept: waits for mirror `source` to open */
    int fb_code;         /* the primary's failure code */
    size_t src_file;     /* source > 0: the mirror's file and offset of the tensor */
    uint64_t src_off;
    char *fb_log;        /* the failures so far of this load, one per source */
    char *fb_note;       /* READY from a mirror: where from and why */
    /* proxies (sluice.h "Proxies"): this load goes to the origin
     * directly (its proxy's bytes failed verification); some of its
     * bytes came through the proxy (sched.c writes it); why it went
     * direct, for sluice_tensor_source */
    uint8_t px_direct, px_used;
    char *px_note;

    /* written by sched.c only: the demand and partial queues */
    uint8_t in_demand, in_partial;
    size_t dnext, pnext;
} sl_slot;

/* One read in flight: a chunk of one tensor, or several whole small
 * tensors adjacent in a file (one iovec each, so coalescing wastes no
 * byte and every tensor still gets its own aligned buffer). */
typedef struct sl_seg {
    size_t tensor;
    uint32_t chunk;
} sl_seg;

/* A caller's reads of spans of one file (sl_engine_read_spans: a part's
 * row segments), in runs: a local file's spans less than SLUICE_PART_GAP
 * apart are one run (the gap's bytes land in a scratch buffer, dropped),
 * a run at most chunk_bytes and SL_RUN_IOV iovecs; a remote file's spans,
 * cut at chunk_bytes, one run per request of the remote seam (its source's
 * batch_spans: a multi-range request). The pump issues its runs first (a
 * caller waits on them, as on a demand); the caller waits for them all. */
#define SL_RUN_IOV 512
typedef struct sl_run {
    uint64_t offset, len, gap;   /* gap: of len, the bytes dropped */
    struct iovec *iov;           /* the seam's working copy */
    int niov;
    const sl_span *spans;        /* a remote run: its spans (iov NULL) */
    size_t nspans;
} sl_run;

typedef struct sl_spanjob {
    struct sl_spanjob *next;     /* e->jobs */
    const sl_file *f;
    sl_run *runs;
    size_t nrun, issued, done;
    int failed;                  /* a run failed: err says how; no more go out */
    /* the caller's token (NULL: none): once requested no run goes out
     * any more, before the caller has woken to see it (issue_spans) */
    const struct sluice_cancel *cancel;
    uint8_t no_proxy;            /* a remote file's read again directly: its
                                    requests skip the proxy (sl_io_req) */
    uint8_t proxied;             /* some bytes came through the proxy */
    sl_err err;
    pthread_cond_t cv;           /* its caller waits here, woken once: when
                                    sl_spanjob_over (not e->cv, which every
                                    completion of a load wakes) */
} sl_spanjob;

/* Whether nothing of job j is in flight or left to issue: its caller's
 * wait is over (the one rule, for the waiter and for run_done's wakeup). */
static inline int sl_spanjob_over(const sl_spanjob *j)
{
    return j->done == j->issued && (j->failed || j->issued == j->nrun);
}

typedef struct sl_read {
    sl_io_req req;               /* first: the seam hands it back */
    struct sl_read *next_free;
    sl_spanjob *job;             /* a run of this job's (run), not a load; NULL: a load */
    size_t run;
    size_t file;                 /* in the index of its source */
    uint8_t source;              /* 0: the model's files; k: mirror k */
    uint8_t remote;              /* went to the remote seam */
    int direct;                  /* read through the O_DIRECT descriptor */
    uint64_t t_submit;           /* metrics: when it was queued */
    uint64_t offset, len;        /* as first submitted */
    int nseg;
    sl_seg seg[SL_MAX_SEGS];
    struct iovec iov0[SL_MAX_SEGS]; /* as first submitted */
    struct iovec iov[SL_MAX_SEGS];  /* the seam's working copy */
} sl_read;

typedef struct sl_efile {
    int direct_fd;               /* -1: read buffered */
    int fell_back;               /* O_DIRECT was refused for this file */
} sl_efile;

/* A running sluice_stream: positions [lo, hi) of ids are pinned or done.
 * REFUSED: the pump gave up on that position alone (see sl_waiter). */
enum { SL_POS_WAIT = 0, SL_POS_PINNED, SL_POS_DONE, SL_POS_TOO_LARGE, SL_POS_REFUSED };
typedef struct sl_stream {
    struct sl_stream *next;
    const size_t *ids;
    size_t n, lo, hi;
    size_t pinned;               /* positions in [lo, hi) pinned */
    uint64_t pinned_bytes;       /* their tensor bytes */
    int delivering;              /* its callbacks run (handles in transit) */
    unsigned blocked;            /* waits of the thread running its callbacks,
                                    in this engine or another: while > 0, its
                                    callbacks return nothing */
    int in_callback;             /* started from another stream's callback */
    sluice_stream_progress_fn progress;
    void *progress_user;
    uint64_t progress_every_ns, progress_last_ns;
    uint64_t bytes_total, bytes_done;
    size_t done;                 /* positions delivered (either way) */
    sluice_cancel *cancel;
    uint8_t *pstate;
    uint64_t *pgen;              /* slot gen when pinned */
} sl_stream;

/* A thread blocked in acquire on one slot, or in a part acquire waiting
 * for room (slot SL_NONE). The pump may refuse one waiter alone when the
 * room the slot needs is held by that waiter's own stream (it runs in a
 * stream callback, which gives its handles back only when it returns):
 * then only that caller fails, the others go on waiting. */
typedef struct sl_waiter {
    struct sl_waiter *next;
    size_t slot;                 /* SL_NONE: a part acquire's wait for room */
    int in_callback;             /* the thread runs a stream callback */
    int refused;                 /* the pump refused this waiter: err says why */
    sl_err err;
} sl_waiter;

struct sluice_tensor {
    sl_engine *e;                /* immutable */
    size_t index;
    const void *data;
    uint64_t size;
    const struct sluice_tensor_info *info;
    int live;
    int has_digest;
    unsigned char digest[32];
    void *owned;                 /* a range handle's own buffer (data), freed
                                    at release; NULL: the slot's, or none */
    int is_range;                /* a range handle: it holds no reference on
                                    the slot (an empty range owns no buffer) */
    sl_pool_blk *blk;            /* a part handle's bytes in the pool, given
                                    back at release; NULL: none */
    struct sluice_tensor *next_free, *next_all;
};

/* A mirror of the model (fallback.c): opened on first need, by the
 * opener thread. */
enum { SL_MIRROR_UNOPENED = 0, SL_MIRROR_REQUESTED, SL_MIRROR_OPENING, SL_MIRROR_OPEN,
       SL_MIRROR_FAILED };
typedef struct sl_mirror {
    const sl_location *loc;      /* opts.fallback[k - 1], parsed (the model's) */
    int state;
    sl_index ix;                 /* OPEN */
    char *why;                   /* FAILED: the open's error */
} sl_mirror;

struct sl_engine {
    /* immutable after create (expect: also changed by a test hook, with
     * nothing loading) */
    const sl_index *ix;
    uint32_t flags;
    uint64_t chunk;              /* chunk_bytes */
    uint64_t stream_window;      /* bytes a stream may read ahead of delivery */
    unsigned queue_depth;
    unsigned hash_threads;
    sluice_algorithm alg;           /* of every digest (the manifest's) */
    const uint8_t *empty_digest;    /* alg's digest of no bytes */
    const sl_chunk_digests *chunks; /* per tensor, or NULL (the manifest's) */
    size_t n;
    size_t *order;               /* 0..n-1: the default plan and a NULL stream */
    sl_efile *files;
    unsigned char (*expect)[32]; /* the digest tensor i must match, when expect_has[i] */
    unsigned char *expect_has;

    pthread_mutex_t lock;
    pthread_cond_t cv;           /* a slot became READY or failed; reads drained */
    int closing;
    unsigned calls;              /* public calls inside the engine: close waits for 0 */
    sl_waiter *waiters;
    int need_flush;              /* reads queued on the seam, not yet started */

    sl_slot *slots;
    sl_pool *pool;
    uint64_t loading_bytes;      /* pool bytes of slots READING, HASHING or FAILED */
    struct { size_t head, tail; } lru[3];
    size_t dq_head, dq_tail;     /* demand: callers wait on these */
    size_t pq_head, pq_tail;     /* started, chunks left to issue */

    /* plan */
    size_t *plan, *plan_pos;     /* order / its inverse (SL_NONE: not in plan) */
    size_t plan_n, cursor;
    size_t last_pos;             /* plan position of the last acquire; SL_NONE: none yet */
    size_t last_kept;            /* the slot sl_slot_keep placed last (a hint where to
                                    place the next; checked before use) */
    int plan_active;

    sl_stream *streams;
    unsigned nstreams;

    sl_read *reads, *free_reads;
    unsigned inflight;
    sl_spanjob *jobs;            /* callers' span reads with runs left (sched.c) */
    sl_io *io;
    sl_hasher *hasher;           /* NULL while no tensor needs one */

    /* remote sources and mirrors (remote.c, fallback.c); NULL / 0 when
     * nothing is remote and no mirror is given */
    sl_rio *rio;
    sl_remote_cfg rcfg;          /* the model's, with abort_flag = &abort_fetch */
    int have_rcfg;
    _Atomic int abort_fetch;     /* close: blocking fetches (a mirror's open) stop */
    sl_mirror *mirrors;
    unsigned nmirrors;
    unsigned serving;            /* mirror k serves the index (sl_engine_served_by), or 0 */
    int mirror_caching;          /* a mirror is worth caching (remote): its tensors
                                    are stored as blobs, and looked for there */

    /* the persistent cache (engine_cache.c, cache.c); NULL when none */
    struct sl_cache *cache;      /* owned */
    const char *cache_model;     /* the model as its blobs' names record it (borrowed) */
    sl_file *blob;               /* per tensor: its blob while one is open (fd >= 0) */
    uint8_t *blob_hit;           /* per tensor: a load came from its blob (touched at close) */
    uint8_t *memo;               /* per tensor: the memo vouches for its bytes */
    struct sl_file_id *file_id;  /* per file: a local file's identity at attach */
    int64_t opened_ns;           /* CLOCK_REALTIME when they were taken */
    char *memo_warning;          /* files the memo refused (their file system), or NULL */
    pthread_t opener;
    int opener_started, opener_quit;
    pthread_cond_t opener_cv;
    /* sched.c's sl_mirror_opened (set at create): called by the opener,
     * lock held, once mirror k is open or failed to open */
    void (*fb_opened)(sl_engine *e, unsigned k);

    /* handles */
    /* released handles, oldest first: reused only past SL_HANDLE_QUARANTINE
     * of them, so that a handle released twice is still recognised */
    struct sluice_tensor *hfree, *hfree_tail, *hall;
    size_t hfree_count;
    size_t live_handles;
    unsigned room_waiters;       /* part acquires waiting for room: the pump
                                    wakes them and starts no read-ahead */

    /* test hook: called where a public call has left the lock but not yet
     * the engine (see sl_engine_set_pause) */
    void (*test_pause)(void *ctx, int where);
    void *test_pause_ctx;
    size_t test_pause_tensor;   /* the tensor of the last pause at a blob's miss */

    struct sluice_stats st;      /* the counters */
    sl_metrics met;              /* metrics.h: atomics, no lock */
};

/* ---------------------------------------------------------------- slot.c */

/* Sets up every slot (empty tensors are READY for ever). */
int sl_slots_init(sl_engine *e);
/* Frees what loads left behind (at destroy, with nothing in flight). */
void sl_slots_free(sl_engine *e);

/* The queue of started slots with chunks left to issue (the pump's
 * second source): push (at the front when front, or when a restart
 * makes a slot READING again) and pop of its head. Lock held. */
void sl_slot_partial_push(sl_engine *e, size_t i, int front);
void sl_slot_partial_pop(sl_engine *e);

/* A read of slot i's load went direct because the proxy failed (why):
 * noted for sluice_tensor_source, once a load ("primary, direct: the
 * proxy failed (why)", or the mirror's label). Lock held. */
void sl_slot_proxy_note(sl_engine *e, size_t i, const char *why);
/* Source k of a load as messages name it: "primary", or "fallback K
 * (location)" (SL_SRC_CACHE is not one). fallback.c. */
void sl_source_label(const sl_engine *e, unsigned k, char *buf, size_t cap);

/* IDLE -> READING: a buffer (evicting unheld buffers as room allows),
 * the chunk map, a hash job when needed; the source a blob of the
 * persistent cache when probe and one is there (probe 0: the caller
 * probed and found none, the load reads the model's file). Returns 1, 0
 * when there is no room (nothing was evicted then), -1 when out of
 * memory (slot untouched). */
int sl_slot_start(sl_engine *e, size_t i, int room, int probe);
/* A read of the slot's next chunk (or of the whole of it, in a group)
 * goes out. */
void sl_slot_issued(sl_engine *e, size_t i);
/* A read of chunk c came back: its bytes landed, or (failure non-NULL)
 * the load fails. */
void sl_slot_landed(sl_engine *e, size_t i, uint32_t c, const sl_err *failure);
/* Lock NOT held: checks the digest of a job that completed with status
 * and moves O_DIRECT bytes in place. Returns the verdict for
 * sl_slot_hashed. */
int sl_slot_check(sl_engine *e, size_t i, int status);
/* The hash job's verdict: READY, or FAILED (checksum, OpenSSL). */
void sl_slot_hashed(sl_engine *e, size_t i, int verdict);
/* Slot i waited (fb_wait) for its mirror to open, which is now open or
 * failed: that mirror, or the next, takes the load over, or the load
 * fails. Lock held. */
void sl_slot_resume(sl_engine *e, size_t i);
/* FAILED, drained, and no other source takes it: IDLE, gen + 1. */
void sl_slot_fail_drained(sl_engine *e, size_t i);
/* FAILED and drained: the load begins again from mirror `source`, whose
 * file `file` holds the tensor at `off`, into the same buffer. Returns 1,
 * or -1 when out of memory (the slot is untouched). */
int sl_slot_restart(sl_engine *e, size_t i, unsigned source, size_t file, uint64_t off);
/* Fails an IDLE slot at once (its waiters see gen move). */
void sl_slot_fail_idle(sl_engine *e, size_t i, const sl_err *err);
/* The failure a waiter saw: the slot's last error. */
int sl_slot_failure(const sl_slot *s, sl_err *err);

/* Holds: a handle taken (by a stream: its room is the first reused once
 * released) and given back; a waiter pinned and gone. */
void sl_slot_take(sl_engine *e, size_t i, int by_stream);
void sl_slot_put(sl_engine *e, size_t i);
void sl_slot_pin(sl_engine *e, size_t i);
void sl_slot_unpin(sl_engine *e, size_t i);

/* Read-ahead wants slot i again soon: keep it from read-ahead's evictions. */
void sl_slot_keep(sl_engine *e, size_t i);
/* What the old plan read ahead becomes the oldest of the cached. */
void sl_slots_age_prefetched(sl_engine *e);
/* Evicts every READY buffer that nothing holds. */
void sl_slots_evict_unheld(sl_engine *e);

/* Whether tensor i would be read with O_DIRECT, and whether it can never
 * fit in the pool. */
int sl_slot_would_be_direct(const sl_engine *e, size_t i);
int sl_slot_too_large(const sl_engine *e, size_t i);
/* The SLUICE_E_POOL_EXHAUSTED detail for tensor i, which got no room:
 * held by live handles, or split by them ("cannot be placed"). */
void sl_slot_room_error(sl_engine *e, size_t i, sl_err *err);

/* A buffer of len bytes (> 0) for a part handle, taken as a demand's
 * (unheld buffers evicted as room allows): 1 with *buf and *blk, 0 when
 * there is no room now (nothing evicted), -1 when out of memory. The
 * detail of no room for `what` (a part, named). Lock held. */
int sl_slot_part_room(sl_engine *e, uint64_t len, void **buf, sl_pool_blk **blk);
void sl_slot_part_room_error(sl_engine *e, const char *what, uint64_t len, sl_err *err);

/* Whether room held now will come back without a release from outside
 * the library (sched.c). Lock held. */
int sl_room_may_return(const sl_engine *e);
/* No room will come back for tensor i (SL_NONE: for a part): refuses one
 * waiter that runs in a stream callback (one of i's first, else any),
 * whose return gives its stream's room back, with why. 1 when it refused
 * one, else 0. Lock held. */
int sl_refuse_callback_waiter(sl_engine *e, size_t i, const sl_err *why);
/* The SLUICE_E_TOO_LARGE detail of tensor i. */
int sl_slot_too_large_error(const sl_engine *e, size_t i, sl_err *err);
/* The SLUICE_E_CHECKSUM detail of tensor i, whose bytes hashed to got
 * (counted in checksum_failures). */
int sl_slot_checksum_error(sl_engine *e, size_t i, const unsigned char got[32], sl_err *err);


/* ---------------------------------------------------------------- engine_cache.c */

/* The source of a load read from the persistent cache's blob of the
 * tensor (slot.source; the blob is e->blob[i], read from offset 0). */
#define SL_SRC_CACHE 255u

/* Lock held. Whether tensor i would load from a blob: opens it when the
 * tensor is one the cache may hold and its blob is there. */
int sl_ecache_probe(sl_engine *e, size_t i);
/* Lock held, slot i IDLE, before its load is set up: the memo's identity
 * check (a file changed since attach is hashed after all) and, when probe,
 * the probe (0: the caller probed already and found no blob).
 * Returns the load's source: SL_SRC_CACHE or 0. */
unsigned sl_ecache_before_start(sl_engine *e, size_t i, int probe);
/* disk_degraded and disk_busy of the stats. */
void sl_ecache_stats(const sl_engine *e, struct sluice_stats *out);
/* Lock held: slot i, loading unhashed on the memo's word, has all its
 * bytes: 1 when its file's identity is no longer the one taken at attach
 * (the memo no longer vouches for it: it is hashed from now on), else 0. */
int sl_ecache_memo_stale(sl_engine *e, size_t i);
/* Lock held: slot i's load started from source (before_start's): counts
 * a tensor the cache may hold that had no blob (disk_misses). */
void sl_ecache_started(sl_engine *e, size_t i, unsigned source);
/* Lock held: slot i becomes READY (counts a blob's hit or the memo's, and
 * closes the blob). */
void sl_ecache_ready(sl_engine *e, size_t i);
/* Lock held: slot i, loading from its blob, FAILED and drained: the blob
 * is dropped (unless the failure was only out of memory), and the load is
 * the model's own from here on. Returns 1 when it is to start again from
 * the model's file (slot.c restarts it), 0 when closing. */
int sl_ecache_refetch(sl_engine *e, size_t i);
/* Hash completion of slot i whose bytes matched (sl_slot_check's verdict
 * ok), lock NOT held: stores a fetched tensor's blob, records the memo.
 * Takes the lock itself, briefly, to decide. */
void sl_ecache_verified(sl_engine *e, size_t i);
/* Destroy: touches the entries read, closes blobs, frees (nothing loading). */
void sl_ecache_free(sl_engine *e);

/* Whether sl_slot_check's verdict means the bytes matched. */
int sl_slot_verdict_ok(int verdict);

/* ---------------------------------------------------------------- sched.c */

/* Starts what can be started: demand first, then chunks of started
 * tensors, then streams' read-ahead, then the plan's. Lock held. */
void sl_pump(sl_engine *e);

/* Mirror k (fallback.c's opener) is open or failed to open: each slot
 * that waited for it goes on (sl_slot_resume), then the pump runs. The
 * opener calls it through e->fb_opened, so that fallback.c, which
 * slot.c asks, calls neither slot.c nor this file. Lock held. */
void sl_mirror_opened(sl_engine *e, unsigned k);
/* The seam's completion callback (ctx is the engine). */
void sl_read_done(void *ctx, sl_io_req *list);
/* The hasher's completion callback (ctx is the engine). */
void sl_hash_done(void *ctx, sl_hash_job *job, int status);


/* ---------------------------------------------------------------- fallback.c */

/* Which source takes a failed load over (fallback.c decides, slot.c
 * restarts or fails the load): none, the error standing as it is
 * (SL_FB_NONE); mirror `source`, whose file `file` holds the tensor at
 * `off` (SL_FB_RESTART); a mirror being opened for it, the slot waiting
 * with fb_wait (SL_FB_WAIT: the opener calls e->fb_opened once it is
 * open); no source left (SL_FB_FAILED: the slot's error becomes code and
 * msg, malloc'd, naming every source's failure; NULL when out of
 * memory). */
enum { SL_FB_NONE = 0, SL_FB_RESTART, SL_FB_WAIT, SL_FB_FAILED };
typedef struct sl_fb_next {
    unsigned source;
    size_t file;
    uint64_t off;
    int code;
    char *msg;
} sl_fb_next;
/* Slot i (FAILED, drained) failed from its present source. Lock held. */
int sl_fallback_next(sl_engine *e, size_t i, sl_fb_next *nx);
/* Slot i waited for its mirror (slot.source) to open: it is open or
 * failed. Lock held. */
int sl_fallback_resume(sl_engine *e, size_t i, sl_fb_next *nx);
/* The restart from nx->source (SL_FB_RESTART) found no memory: the next
 * mirror, logged so. Lock held. */
int sl_fallback_no_memory(sl_engine *e, size_t i, sl_fb_next *nx);
/* A load from a mirror became READY: counted, and its note kept. */
void sl_fallback_delivered(sl_engine *e, size_t i);
/* Stops the opener thread and closes the mirrors (destroy). */
void sl_fallback_free(sl_engine *e);

/* Puts slot i (IDLE) on the demand queue. Lock held. */
void sl_demand(sl_engine *e, size_t i);

/* The streams whose callbacks a thread is running, innermost first: one
 * frame each, on the stack of its stream's delivery, listed per thread
 * (sched.c), on whatever engine (a callback may wait on another model). */
typedef struct sl_frame {
    struct sl_frame *next;
    sl_engine *e;
    sl_stream *st;
} sl_frame;

/* A stream's delivery begins (e's lock held) and ends (held again). */
void sl_frame_push(sl_frame *f, sl_engine *e, sl_stream *st);
void sl_frame_pop(sl_frame *f);

/* The calling thread is about to wait in e (delta +1), or is done (-1):
 * the streams whose callbacks it runs give nothing back meanwhile. Those
 * of e (lock held) are marked here; returns whether the thread runs any
 * stream callback at all, on any engine. */
int sl_mark_blocked(sl_engine *e, int delta);
/* The same for the streams of other engines, each under its own lock: e's
 * lock NOT held. On +1 it pumps them, so that a demand there that can now
 * never get room is refused. Returns whether there was any. */
int sl_mark_blocked_elsewhere(sl_engine *e, int delta);
/* Whether the calling thread runs a callback of a stream of another engine. */
int sl_in_callback_elsewhere(const sl_engine *e);

/* Takes slot i off the demand queue when nobody waits for it any more. */
void sl_demand_drop_if_unwanted(sl_engine *e, size_t i);

/* ---------------------------------------------------------------- engine.c */

/* A handle on READY slot i (checks an empty tensor's digest). Lock held. */
int sl_grant(sl_engine *e, size_t i, int by_stream, sluice_tensor **out, sl_err *err);


/* Starts the hasher if it is not running yet. Lock not held. */
int sl_hasher_need(sl_engine *e, sl_err *err);

/* Waits until no read is in flight and the hasher is idle. Lock held
 * (dropped while waiting). */
void sl_quiesce(sl_engine *e);

/* Opens each file's O_DIRECT twin, reopening through proc_fd_dir
 * ("/proc/self/fd"); see engine.c. */
void sl_engine_open_direct(sl_engine *e, const char *proc_fd_dir);

/* ---------------------------------------------------------------- helpers */

static inline uint64_t sl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The digest tensor i must match, or NULL. The small reads of the
 * engine's state are inline here, so that its files need not call one
 * another both ways for them (docs/layout.md, the calls check). */
static inline const unsigned char *sl_expected_digest(const sl_engine *e, size_t i)
{
    return e->expect_has && e->expect_has[i] ? e->expect[i] : NULL;
}

/* Tensor i's chunk digests when it is checked chunk by chunk, else NULL. */
static inline const sl_chunk_digests *sl_expected_chunks(const sl_engine *e, size_t i)
{
    return sl_expected_digest(e, i) && e->chunks && e->chunks[i].count ? &e->chunks[i] : NULL;
}

/* The file a read goes to: of the model, of a mirror, or a cache's blob. */
static inline const sl_file *sl_read_file(const sl_engine *e, unsigned source, size_t file)
{
    if (source == SL_SRC_CACHE)
        return &e->blob[file];
    return source ? &e->mirrors[source - 1].ix.files[file] : &e->ix->files[file];
}

/* Whether slot i is hashed (the memo's say); only with nothing loading. */
static inline void sl_slot_set_hashed(sl_engine *e, size_t i, int hashed)
{
    e->slots[i].hashed = (uint8_t)hashed;
}

/* The test pause hook (sl_engine_pause_point, for the engine's own files). */
static inline void sl_pause_point(sl_engine *e, int where)
{
    if (e->test_pause)
        e->test_pause(e->test_pause_ctx, where);
}

/* Drops the lock, then starts the reads queued meanwhile. */
static inline void sl_unlock(sl_engine *e)
{
    int flush = e->need_flush;
    e->need_flush = 0;
    pthread_mutex_unlock(&e->lock);
    if (flush) {
        sl_io_flush(e->io);
        if (e->rio)
            sl_rio_flush(e->rio);
    }
}

/* Waits for cv (with e->lock), unless queued reads must be started first
 * (then it returns at once, having started them: callers loop on their
 * condition). */
static inline void sl_wait_on(sl_engine *e, pthread_cond_t *cv)
{
    if (e->need_flush) {
        sl_unlock(e);
        pthread_mutex_lock(&e->lock);
        return;
    }
    pthread_cond_wait(cv, &e->lock);
}

/* sl_wait_on e->cv. */
static inline void sl_wait(sl_engine *e)
{
    sl_wait_on(e, &e->cv);
}

#endif
