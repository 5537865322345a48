/* engine_int.h: what the parts of the engine share (engine.c: public
 * calls and life cycle; sched.c: plan, pump and read completion; hash.c:
 * the workers that hash and finish tensors). Not for other components.
 *
 * Locking: one mutex per engine, e->lock, guards everything below that is
 * not marked immutable: slots, lists, plan, streams, pool, counters. It is
 * never held across a system call that may copy tensor bytes nor across a
 * digest update: those run with the lock dropped, on a slot marked busy or
 * on reads in flight, which nobody else touches.
 *
 * The life of a slot (one tensor):
 *   IDLE --start--> LOADING --(all chunks read, hashed, moved)--> READY
 *   LOADING --(a read or the digest fails)--> IDLE, gen + 1, error kept
 *   READY --(evicted: no refs, no pins)--> IDLE
 * refs count handles; pins count waiters (acquire, streams) that will take
 * a handle when it is READY. A slot with refs or pins is never evicted. A
 * READY slot with neither sits on one of two LRU lists: CACHED (handed out
 * since it was read) or PREFETCHED (read ahead, not yet used).
 */
#ifndef SLUICE_ENGINE_INT_H
#define SLUICE_ENGINE_INT_H

#include "cancel.h"
#include "engine.h"
#include "io.h"
#include "pool.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

#define SL_NONE SIZE_MAX
#define SL_MAX_SEGS 32              /* tensors one coalesced read may cover */
#define SL_DIRECT_ALIGN 4096u       /* O_DIRECT offsets, lengths, buffers */
#define SL_DIRECT_MIN (64u << 10)   /* smaller tensors are read buffered even with SLUICE_F_DIRECT */
#define SL_HANDLE_QUARANTINE 1024u /* released handles kept before reuse */
#define SL_STREAM_WINDOW 4096u      /* positions a stream may have pinned ahead */

enum { SL_IDLE, SL_LOADING, SL_READY };
enum { SL_LRU_NONE, SL_LRU_CACHED, SL_LRU_PREFETCHED };

typedef struct sl_slot {
    uint8_t state;
    uint8_t hashed;      /* hash this tensor (a digest to check, or HASH_ALL) */
    uint8_t direct;      /* this load reads an aligned span (data at buf + delta) */
    uint8_t consumed;    /* handed out since it was read */
    uint8_t spent;       /* last handed out by a stream: recycled first */
    uint8_t failing;     /* this load failed; it is dropped once quiet */
    uint8_t busy;        /* a worker works on it with the lock dropped */
    uint8_t queued;      /* on the worker queue */
    uint8_t worked;      /* the worker finished: digest final, bytes in place */
    uint8_t in_demand, in_partial, lru;
    uint8_t has_digest;
    uint32_t refs, pins;
    uint32_t nchunks, issued, done, inflight, hash_next;
    uint64_t done_word;  /* chunk completion bits when nchunks <= 64 */
    uint64_t *done_bits; /* else */
    sl_pool_blk *blk;
    unsigned char *buf;  /* the pool buffer */
    const unsigned char *data; /* the tensor's first byte, once READY */
    uint64_t delta;      /* tensor offset - span start (direct only) */
    uint64_t span;       /* bytes read: nbytes, or the aligned span */
    uint64_t chunk;      /* bytes per chunk of this load */
    EVP_MD_CTX *md;
    unsigned char digest[32];
    uint64_t gen;        /* failures so far: waiters compare */
    int err_code;
    char *err_msg;       /* the last failure's detail */
    size_t lprev, lnext; /* LRU */
    size_t dnext, pnext, hnext; /* demand, partial and worker queues */
} sl_slot;

/* One read in flight: a chunk of one tensor, or several whole small
 * tensors adjacent in a file (one iovec each, so coalescing wastes no
 * byte and every tensor still gets its own aligned buffer). */
typedef struct sl_seg {
    size_t tensor;
    uint32_t chunk;
} sl_seg;

typedef struct sl_read {
    sl_io_req req;               /* first: the seam hands it back */
    struct sl_read *next_free;
    size_t file;
    int direct;                  /* read through the O_DIRECT descriptor */
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

/* Opens each file's O_DIRECT twin (engine.c), reopening through
 * proc_fd_dir ("/proc/self/fd"); see there. */
void sl_engine_open_direct(sl_engine *e, const char *proc_fd_dir);

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
    pthread_t deliverer;         /* the thread running them, while delivering */
    unsigned blocked;            /* waits of the deliverer inside the library:
                                    while > 0, its callbacks return nothing */
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

/* A thread blocked in acquire on one slot. The pump may refuse one waiter
 * alone when the room the slot needs is held by that waiter's own stream
 * (it runs in a stream callback, which gives its handles back only when
 * it returns): then only that caller fails, the others go on waiting. */
typedef struct sl_waiter {
    struct sl_waiter *next;
    size_t slot;
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
    struct sluice_tensor *next_free, *next_all;
};

struct sl_engine {
    /* immutable after create */
    const sl_index *ix;
    const sl_manifest *manifest;
    uint32_t flags;
    uint64_t chunk;              /* chunk_bytes */
    uint64_t stream_window;      /* bytes a stream may read ahead of delivery */
    unsigned queue_depth;
    size_t n;
    size_t *order;               /* 0..n-1: the default plan and a NULL stream */
    sl_efile *files;
    EVP_MD *sha256;

    pthread_mutex_t lock;
    pthread_cond_t cv;           /* a slot became READY or failed; reads drained */
    int closing;
    unsigned calls;              /* public calls inside the engine: close waits for 0 */
    sl_waiter *waiters;
    int need_flush;              /* reads queued on the seam, not yet started */

    sl_slot *slots;
    sl_pool *pool;
    uint64_t loading_bytes;      /* pool bytes of LOADING slots */
    struct { size_t head, tail; } lru[3];
    size_t dq_head, dq_tail;     /* demand: callers wait on these */
    size_t pq_head, pq_tail;     /* started, chunks left to issue */

    /* plan */
    size_t *plan, *plan_pos;     /* order / its inverse (SL_NONE: not in plan) */
    size_t plan_n, cursor;
    size_t last_pos;             /* plan position of the last acquire; SL_NONE: none yet */
    int plan_active;

    sl_stream *streams;
    unsigned nstreams;

    sl_read *reads, *free_reads;
    unsigned inflight;
    sl_io *io;

    /* workers (hash.c) */
    pthread_t *workers;
    unsigned nworkers;
    pthread_cond_t wcv;
    int wquit;
    unsigned wbusy;
    size_t hq_head, hq_tail;

    /* handles */
    /* released handles, oldest first: reused only past SL_HANDLE_QUARANTINE
     * of them, so that a handle released twice is still recognised */
    struct sluice_tensor *hfree, *hfree_tail, *hall;
    size_t hfree_count;
    size_t live_handles;

    /* test hook: expected digests instead of the manifest's */
    unsigned char (*test_digest)[32];
    unsigned char *test_has;
    /* test hook: called where a public call has left the lock but not yet
     * the engine (see sl_engine_set_pause) */
    void (*test_pause)(void *ctx, int where);
    void *test_pause_ctx;

    struct sluice_stats st;      /* the counters */
};

/* ---------------------------------------------------------------- sched.c */

/* Starts what can be started: demand first, then chunks of started
 * tensors, then streams' read-ahead, then the plan's. Lock held. */
void sl_pump(sl_engine *e);

/* The seam's completion callback (ctx is the engine). */
void sl_read_done(void *ctx, sl_io_req *list);

/* Puts slot i (IDLE) on the demand queue. Lock held. */
void sl_demand(sl_engine *e, size_t i);

/* Moves slot i on after any change: finishes it (READY, or IDLE after a
 * failure) when nothing works on it any more. Lock held. */
void sl_settle(sl_engine *e, size_t i);

/* Records a failure of slot i (kept for the waiters). Lock held. */
void sl_slot_error(sl_engine *e, size_t i, const sl_err *err);

/* Fails an IDLE slot at once (waiters see gen move). Lock held. */
void sl_fail_idle(sl_engine *e, size_t i, const sl_err *err);

/* Called when a slot's refs or pins fell: puts it on an LRU list when
 * nothing holds it. Lock held. */
void sl_unhold(sl_engine *e, size_t i);

/* LRU list operations. Lock held. */
void sl_lru_remove(sl_engine *e, size_t i);
/* Frees the buffer of unheld READY slot i: the slot becomes IDLE. */
void sl_evict(sl_engine *e, size_t i);
/* Puts slot i on list at the tail (the most recently used)... */
void sl_lru_push(sl_engine *e, size_t i, int list);
/* ...or at the head: the first to be evicted. */
void sl_lru_push_front(sl_engine *e, size_t i, int list);

/* Whether tensor i can never fit in the pool. */
int sl_too_large(const sl_engine *e, size_t i);

/* Adds delta to the blocked count of every stream whose callbacks run on
 * the calling thread (it is about to wait, or done waiting, inside the
 * library). Returns whether there was any. Lock held. */
int sl_mark_blocked(sl_engine *e, int delta);

/* Takes slot i off the demand queue when nobody waits for it any more. */
void sl_demand_drop_if_unwanted(sl_engine *e, size_t i);

/* Whether chunk c of slot s has been read. */
int sl_chunk_done(const sl_slot *s, uint32_t c);

/* ---------------------------------------------------------------- hash.c */

/* Starts n workers. Returns SLUICE_OK or SLUICE_E_NOMEM. Lock not held. */
int sl_workers_start(sl_engine *e, unsigned n, sl_err *err);

/* Stops and joins them (the queue must be empty). */
void sl_workers_stop(sl_engine *e);

/* Queues slot i for a worker. Lock held. */
void sl_work_enqueue(sl_engine *e, size_t i);

/* Whether slot i needs a worker before it is READY. */
int sl_needs_work(const sl_engine *e, const sl_slot *s);

/* The digest slot i must match, or NULL. */
const unsigned char *sl_expected_digest(const sl_engine *e, size_t i);

/* ---------------------------------------------------------------- engine.c */

/* A handle on READY slot i (checks an empty tensor's digest). Lock held. */
int sl_grant(sl_engine *e, size_t i, sluice_tensor **out, sl_err *err);

/* The SLUICE_E_TOO_LARGE detail of tensor i. */
int sl_too_large_error(sl_engine *e, size_t i, sl_err *err);

/* The failure a waiter saw: the slot's last error. Lock held. */
int sl_slot_failure(const sl_slot *s, sl_err *err);

/* Resolves n names of m to indexes (malloc'd into *ids; NULL when n = 0). */
int sl_resolve(sluice_model *m, const char *const *names, size_t n, size_t **ids, sl_err *err);

/* Enters and leaves a public call: sl_engine_destroy waits until every
 * call has left, so a call may touch the engine (and its model) until it
 * calls sl_leave, which is its last touch. Lock not held. */
void sl_enter(sl_engine *e);
void sl_leave(sl_engine *e);

/* Calls the test pause hook, if set, at point `where`. Lock not held. */
void sl_pause_point(sl_engine *e, int where);
enum { SL_PAUSE_STREAM_EXIT = 1, SL_PAUSE_RELEASE_EXIT, SL_PAUSE_ACQUIRE_EXIT };

/* ---------------------------------------------------------------- helpers */

/* Drops the lock, then starts the reads queued meanwhile. */
static inline void sl_unlock(sl_engine *e)
{
    int flush = e->need_flush;
    e->need_flush = 0;
    pthread_mutex_unlock(&e->lock);
    if (flush)
        sl_io_flush(e->io);
}

/* Waits for e->cv, unless queued reads must be started first (then it
 * returns at once, having started them: callers loop on their condition). */
static inline void sl_wait(sl_engine *e)
{
    if (e->need_flush) {
        sl_unlock(e);
        pthread_mutex_lock(&e->lock);
        return;
    }
    pthread_cond_wait(&e->cv, &e->lock);
}

#endif
