/* engine.c: the life cycle of an engine and its loading calls: acquire,
 * release and the handles, prefetch, stats, trim (see engine.h; the API
 * layer, api.c, calls them).
 *
 * The parts: slot.c (each tensor's state, the LRU lists, the pool),
 * sched.c (plan, pump, completions), stream.c (streams), io.c (the seam:
 * io_uring or pread threads), hash.c (the hashing layer), pool.c
 * (buffers). engine_int.h tells how they share the state.
 *
 * Threads of an engine: the seam's (one io_uring reaper, or io_threads
 * pread threads) and the hasher's (hash_threads, started only when some
 * tensor is hashed or SLUICE_F_DIRECT is set). Callers block in acquire
 * and stream on e->cv; stream callbacks run on the stream's caller.
 */
#include "engine/engine_int.h"
#include "base/cancel.h"

#include "base/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* Where the handle of an empty tensor points: aligned, never written. */
static const _Alignas(64) unsigned char empty_bytes[64];

static int env_force_pread(void)
{
    const char *v = getenv("SLUICE_FORCE_PREAD");
    return v && *v && strcmp(v, "0") != 0;
}

/* ---------------------------------------------------------------- life cycle */

/* Opens the O_DIRECT twin of each file, through proc_fd_dir/N (normally
 * /proc/self/fd) so that it is the very file the index opened, not
 * whatever the path names now. Without /proc it reopens the path, which
 * may by now name another file (one renamed over it): that twin is kept
 * only when its device and inode are the original descriptor's; otherwise
 * the file is read buffered through the index's descriptor, counted as a
 * fallback. Tests call it again with another proc_fd_dir (hooks.c). */
void sl_engine_open_direct(sl_engine *e, const char *proc_fd_dir)
{
    for (size_t f = 0; f < e->ix->nfiles; f++) {
        const sl_file *file = &e->ix->files[f];
        if (!(file->src->caps & SL_SRC_DESCRIPTOR)) {
            e->files[f].direct_fd = -1;  /* no descriptor at all: no twin */
            continue;
        }
        int fd = sl_file_reopen(file, proc_fd_dir, O_DIRECT);
        e->files[f].direct_fd = fd;
        if (fd < 0) {
            e->files[f].fell_back = 1;
            e->st.direct_fallbacks++;
            sl_metrics_add(&e->met, &e->met.fallbacks[SL_FALLBACK_OPEN], 1);
        }
    }
}

int sl_hasher_need(sl_engine *e, sl_err *err)
{
    pthread_mutex_lock(&e->lock);
    int have = e->hasher != NULL;
    pthread_mutex_unlock(&e->lock);
    if (have)
        return SLUICE_OK;
    unsigned n = e->hash_threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)(cpus < 64 ? cpus : 64) : 1;
    }
    sl_hasher *h;
    SL_TRY(sl_hasher_create(n, e->alg, sl_hash_done, e, &h, err));
    /* Published under the lock: the pump reads it to start hashed loads. */
    pthread_mutex_lock(&e->lock);
    if (!e->hasher) {
        e->hasher = h;
        h = NULL;
    }
    pthread_mutex_unlock(&e->lock);
    sl_hasher_destroy(h);
    return SLUICE_OK;
}

static void free_engine(sl_engine *e)
{
    if (!e)
        return;
    sl_fallback_free(e);
    sl_ecache_free(e);
    sl_hasher_destroy(e->hasher);
    sl_io_destroy(e->io);
    sl_rio_destroy(e->rio);
    sl_slots_free(e);
    if (e->files)
        for (size_t f = 0; f < e->ix->nfiles; f++)
            if (e->files[f].direct_fd >= 0)
                close(e->files[f].direct_fd);
    for (struct sluice_tensor *h = e->hall, *n; h; h = n) {
        n = h->next_all;
        free(h);
    }
    if (e->plan != e->order)
        free(e->plan);
    if (e->plan_pos != e->order)
        free(e->plan_pos);
    free(e->order);
    free(e->files);
    free(e->reads);
    free(e->expect);
    free(e->expect_has);
    sl_pool_destroy(e->pool);
    pthread_cond_destroy(&e->opener_cv);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* The engine's own copy of the expected digests. */
static int copy_expected(sl_engine *e, const uint8_t *const *expect, sl_err *err)
{
    if (!expect)
        return SLUICE_OK;
    size_t n1 = e->n ? e->n : 1;
    e->expect = malloc(n1 * sizeof *e->expect);
    e->expect_has = calloc(n1, 1);
    if (!e->expect || !e->expect_has)
        return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
    for (size_t i = 0; i < e->n; i++)
        if (expect[i]) {
            memcpy(e->expect[i], expect[i], 32);
            e->expect_has[i] = 1;
        }
    return SLUICE_OK;
}

/* The mirrors (opened when first needed) and the remote seam, when a
 * file of the model or a mirror is remote: none of it otherwise. */
static int create_remote(sl_engine *e, const sluice_options *opts,
                         const sl_location *const *mirrors, sl_err *err)
{
    int remote = (e->ix->caps_any & SL_SRC_NETWORK) != 0;
    if (opts->fallback_count) {
        e->mirrors = calloc(opts->fallback_count, sizeof *e->mirrors);
        if (!e->mirrors)
            return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
        e->nmirrors = opts->fallback_count;
        for (unsigned k = 0; k < e->nmirrors; k++) {
            e->mirrors[k].loc = mirrors[k];
            remote |= (sl_source_of(mirrors[k])->caps & SL_SRC_NETWORK) != 0;
            e->mirror_caching |= (sl_source_of(mirrors[k])->caps & SL_SRC_WORTH_CACHING) != 0;
        }
    }
    if (e->ix->remote) {
        e->rcfg = *e->ix->remote;
        e->rcfg.abort_flag = &e->abort_fetch;
        e->have_rcfg = 1;
    }
    if (remote && e->have_rcfg)
        SL_TRY(sl_rio_create(&e->rcfg, sl_read_done, e, &e->rio, err));
    return SLUICE_OK;
}

int sl_engine_create(const sl_index *ix, const sluice_options *opts,
                     const sl_location *const *mirrors, const uint8_t *const *expect,
                     const sl_chunk_digests *chunks, sl_engine **out, sl_err *err)
{
    *out = NULL;
    sl_engine *e = calloc(1, sizeof *e);
    if (!e)
        return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
    if (pthread_mutex_init(&e->lock, NULL) != 0) {
        free(e);
        return sl_fail(err, SLUICE_E_NOMEM, "engine: cannot create a mutex");
    }
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->opener_cv, NULL);
    e->fb_opened = sl_mirror_opened;
    e->ix = ix;
    e->flags = opts->flags;
    e->chunk = opts->chunk_bytes;
    /* A stream reads ahead what keeps every read slot busy (and at least
     * 64 MiB), never more than half the pool: memory a stream has not
     * touched yet costs a page fault per page, far more than the copy. */
    e->stream_window = (uint64_t)opts->queue_depth * opts->chunk_bytes;
    if (e->stream_window < ((uint64_t)64 << 20))
        e->stream_window = (uint64_t)64 << 20;
    if (e->stream_window > opts->pool_bytes / 2)
        e->stream_window = opts->pool_bytes / 2;
    e->queue_depth = opts->queue_depth;
    e->hash_threads = opts->hash_threads;
    e->alg = opts->algorithm;
    e->chunks = chunks;
    e->empty_digest = sl_md_empty(opts->algorithm); /* checked by take_options */
    e->n = ix->ntensors;
    e->dq_head = e->dq_tail = e->pq_head = e->pq_tail = SL_NONE;
    e->st.pool_bytes = opts->pool_bytes;
    sl_metrics_init(&e->met);

    int rc;
    size_t n1 = e->n ? e->n : 1;
    e->order = malloc(n1 * sizeof *e->order);
    e->files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *e->files);
    /* Before any failure: free_engine closes the twins that are >= 0. */
    for (size_t f = 0; e->files && f < ix->nfiles; f++)
        e->files[f].direct_fd = -1;
    e->reads = calloc(e->queue_depth, sizeof *e->reads);
    if (!e->order || !e->files || !e->reads) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
        goto fail;
    }
    if ((rc = copy_expected(e, expect, err)) < 0)
        goto fail;
    if (sl_slots_init(e) < 0) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
        goto fail;
    }
    int any_hashed = 0;
    for (size_t i = 0; i < e->n; i++) {
        e->order[i] = i;
        any_hashed |= e->slots[i].hashed;
    }
    e->plan = e->plan_pos = e->order;
    e->plan_n = e->n;
    e->last_pos = SL_NONE;
    e->last_kept = SL_NONE;
    for (unsigned k = 0; k < e->queue_depth; k++) {
        e->reads[k].next_free = e->free_reads;
        e->free_reads = &e->reads[k];
    }
    if ((rc = sl_pool_create(opts->pool_bytes, &e->pool, err)) < 0)
        goto fail;
    if (e->flags & SLUICE_F_DIRECT)
        sl_engine_open_direct(e, "/proc/self/fd");

    sl_io_config cfg = {
        .queue_depth = e->queue_depth,
        .threads = opts->io_threads,
        .force_pread = (e->flags & SLUICE_F_FORCE_PREAD) || env_force_pread(),
        .done = sl_read_done,
        .ctx = e,
    };
    if ((rc = sl_io_create(&cfg, &e->io, err)) < 0)
        goto fail;
    if ((rc = create_remote(e, opts, mirrors, err)) < 0)
        goto fail;
    e->st.backend = sl_io_backend(e->io, &e->st.backend_errno);
    if ((any_hashed || (e->flags & SLUICE_F_DIRECT)) && (rc = sl_hasher_need(e, err)) < 0)
        goto fail;
    *out = e;
    return SLUICE_OK;

fail:
    free_engine(e);
    return rc;
}

void sl_quiesce(sl_engine *e)
{
    for (;;) {
        while (e->inflight)
            sl_wait(e);
        if (!e->hasher)
            return;
        /* Hash completions take the lock: wait for them without it. */
        sl_unlock(e);
        sl_hasher_wait_idle(e->hasher);
        pthread_mutex_lock(&e->lock);
        if (!e->inflight)
            return;
    }
}

int sl_engine_destroy(sl_engine *e, sl_err *err)
{
    if (!e)
        return SLUICE_OK;
    pthread_mutex_lock(&e->lock);
    for (;;) {
        if (e->live_handles || e->nstreams) {
            size_t live = e->live_handles;
            unsigned streams = e->nstreams;
            pthread_mutex_unlock(&e->lock);
            return sl_fail(err, SLUICE_E_BUSY,
                           "close: %zu tensor handle%s still live and %u stream%s running; "
                           "release every handle first (the model stays open)",
                           live, live == 1 ? " is" : "s are", streams, streams == 1 ? "" : "s");
        }
        /* A call that released the last handle, or a stream that just
         * ended, may still be on its way out: it leaves soon. */
        if (!e->calls)
            break;
        pthread_cond_wait(&e->cv, &e->lock);
    }
    e->closing = 1; /* nothing new starts */
    /* Remote reads in flight are read-ahead nobody waits for (no handle,
     * no stream, no call): stopped now rather than waited for. */
    e->abort_fetch = 1;
    if (e->rio)
        sl_rio_abort(e->rio);
    sl_quiesce(e);
    pthread_mutex_unlock(&e->lock);
    free_engine(e);
    return SLUICE_OK;
}

int sl_engine_enter(sl_engine *e, sl_err *err)
{
    pthread_mutex_lock(&e->lock);
    int closing = e->closing;
    if (!closing)
        e->calls++;
    pthread_mutex_unlock(&e->lock);
    return closing ? sl_fail(err, SLUICE_E_INVAL, "the model is being closed") : SLUICE_OK;
}

void sl_engine_leave(sl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    if (--e->calls == 0)
        pthread_cond_broadcast(&e->cv); /* close may be waiting */
    pthread_mutex_unlock(&e->lock);
}

void sl_engine_pause_point(sl_engine *e, int where)
{
    sl_pause_point(e, where);
}

/* ---------------------------------------------------------------- handles */

static int check_empty(sl_engine *e, size_t i, sl_err *err)
{
    const unsigned char *want = sl_expected_digest(e, i);
    if (!want || memcmp(want, e->empty_digest, 32) == 0)
        return SLUICE_OK;
    e->st.failures++;
    return sl_slot_checksum_error(e, i, e->empty_digest, err);
}

/* A handle: a released one past the quarantine, else a new one. Lock
 * held. NULL when out of memory. */
static sluice_tensor *take_handle(sl_engine *e)
{
    sluice_tensor *h = e->hfree_count > SL_HANDLE_QUARANTINE ? e->hfree : NULL;
    if (h) {
        e->hfree = h->next_free;
        if (!e->hfree)
            e->hfree_tail = NULL;
        e->hfree_count--;
    } else {
        if (!(h = calloc(1, sizeof *h)))
            return NULL;
        h->e = e;
        h->next_all = e->hall;
        e->hall = h;
    }
    h->owned = NULL;
    h->blk = NULL;
    h->is_range = 0;
    return h;
}

/* A handle on len bytes at data, in the block owned (freed at release),
 * described by info: a range's or a part's. */
static int grant_owned(sl_engine *e, size_t i, void *owned, sl_pool_blk *blk, const void *data,
                       uint64_t len, const struct sluice_tensor_info *info, sluice_tensor **out,
                       sl_err *err)
{
    pthread_mutex_lock(&e->lock);
    sluice_tensor *h = take_handle(e);
    if (!h) {
        pthread_mutex_unlock(&e->lock);
        return sl_fail(err, SLUICE_E_NOMEM, "acquire_range: out of memory");
    }
    h->index = i;
    h->info = info;
    h->size = len;
    h->owned = owned;
    h->blk = blk;
    h->is_range = 1;
    h->data = len ? data : (const void *)empty_bytes;
    h->live = 1;
    h->has_digest = 0; /* a range, not the tensor: no digest of its own */
    e->live_handles++;
    e->st.bytes_delivered += len;
    pthread_mutex_unlock(&e->lock);
    *out = h;
    return SLUICE_OK;
}

int sl_engine_grant_range(sl_engine *e, size_t i, void *buf, uint64_t len, sluice_tensor **out,
                          sl_err *err)
{
    return grant_owned(e, i, buf, NULL, buf, len, &e->ix->tensors[i], out, err);
}

int sl_engine_grant_part(sl_engine *e, size_t i, void *block, sl_pool_blk *blk, const void *data,
                         uint64_t len, const struct sluice_tensor_info *info, sluice_tensor **out,
                         sl_err *err)
{
    return grant_owned(e, i, block, blk, data, len, info, out, err);
}

/* The token's wake-up of a part waiting for room: every waiter of e->cv
 * looks again (as a stream's, stream.c). */
static void wake_room(void *ctx)
{
    sl_engine *e = ctx;
    pthread_mutex_lock(&e->lock);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lock);
}

int sl_engine_part_room(sl_engine *e, const char *what, uint64_t len, sluice_cancel *cancel,
                        void **buf, sl_pool_blk **blk, sl_err *err)
{
    *buf = NULL;
    *blk = NULL;
    if (sl_cancel_requested(cancel))
        return sl_fail(err, SLUICE_E_CANCELLED, "%s: cancelled", what);
    if (!len)
        return SLUICE_OK;
    sl_cancel_reg reg = {.wake = wake_room, .ctx = e};
    sl_cancel_register(cancel, &reg); /* before the lock: the wake-up takes it */
    pthread_mutex_lock(&e->lock);
    if (sl_pool_footprint(len, SL_POOL_ALIGN) > sl_pool_capacity(e->pool)) {
        e->st.failures++;
        pthread_mutex_unlock(&e->lock);
        sl_cancel_unregister(cancel, &reg);
        return sl_fail(err, SLUICE_E_TOO_LARGE, "%s is %llu bytes, larger than the whole pool "
                       "budget (pool_bytes %llu)", what, (unsigned long long)len,
                       (unsigned long long)e->st.pool_bytes);
    }
    /* As an acquire's wait (sl_engine_acquire): the streams whose callbacks
     * this thread runs give nothing back while it waits. */
    int elsewhere = sl_in_callback_elsewhere(e);
    if (elsewhere) {
        sl_unlock(e);
        sl_mark_blocked_elsewhere(e, +1);
        pthread_mutex_lock(&e->lock);
    }
    /* A waiter as an acquire's is (sl_waiter): running in a stream
     * callback, it holds its stream's room, and the pump may refuse it
     * alone so that others waiting for that room are served. */
    sl_waiter w = {.slot = SL_NONE, .in_callback = sl_mark_blocked(e, +1)};
    w.next = e->waiters;
    e->waiters = &w;
    e->room_waiters++;
    int rc;
    for (;;) {
        int got = sl_slot_part_room(e, len, buf, blk);
        if (got > 0) {
            rc = SLUICE_OK;
            break;
        }
        if (got < 0) {
            rc = sl_fail(err, SLUICE_E_NOMEM, "%s: out of memory", what);
            break;
        }
        if (sl_cancel_requested(cancel)) {
            rc = sl_fail(err, SLUICE_E_CANCELLED, "%s: cancelled while waiting for room", what);
            break;
        }
        if (w.refused || !sl_room_may_return(e)) {
            sl_err why;
            sl_slot_part_room_error(e, what, len, &why);
            /* Outside a callback: a waiter in one, whose return gives its
             * stream's room back, is refused instead, as for a demand. */
            if (!w.refused && !w.in_callback && sl_refuse_callback_waiter(e, SL_NONE, &why))
                continue;
            e->st.failures++;
            *err = why;
            rc = why.code;
            break;
        }
        sl_pause_point(e, SL_PAUSE_PART_WAIT);
        sl_wait(e);
    }
    for (sl_waiter **p = &e->waiters; *p; p = &(*p)->next)
        if (*p == &w) {
            *p = w.next;
            break;
        }
    e->room_waiters--;
    sl_mark_blocked(e, -1);
    /* Its stream gives room back again, and a refused part, counted as
     * room that may come back, has left: a demand or another part waiting
     * for room may now be served, or learn it has none. */
    if (e->dq_head != SL_NONE || e->room_waiters)
        sl_pump(e);
    sl_unlock(e);
    sl_cancel_unregister(cancel, &reg);
    if (elsewhere)
        sl_mark_blocked_elsewhere(e, -1);
    return rc;
}

void sl_engine_part_room_free(sl_engine *e, sl_pool_blk *blk)
{
    if (!blk)
        return;
    pthread_mutex_lock(&e->lock);
    sl_pool_free(e->pool, blk);
    sl_pump(e); /* its room may let something start */
    sl_unlock(e);
}

void sl_engine_range_tally(sl_engine *e, const sl_range_tally *t, int failed)
{
    pthread_mutex_lock(&e->lock);
    e->st.bytes_read += t->bytes_read;
    e->st.bytes_hashed += t->bytes_hashed;
    e->st.chunks_verified += t->chunks_verified;
    e->st.checksum_failures += t->checksum_failures;
    e->st.remote_reads += t->remote_reads;
    e->st.remote_bytes += t->remote_bytes;
    e->st.part_fallback_bytes += t->part_fallback_bytes;
    e->st.failures += failed != 0;
    pthread_mutex_unlock(&e->lock);
}

int sl_grant(sl_engine *e, size_t i, int by_stream, sluice_tensor **out, sl_err *err)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    const sl_slot *s = &e->slots[i];
    if (t->nbytes == 0)
        SL_TRY(check_empty(e, i, err));
    sluice_tensor *h = take_handle(e);
    if (!h)
        return sl_fail(err, SLUICE_E_NOMEM, "acquire: out of memory");
    h->index = i;
    h->info = t;
    h->size = t->nbytes;
    h->data = t->nbytes ? (const void *)s->data : (const void *)empty_bytes;
    h->live = 1;
    h->has_digest = t->nbytes ? s->has_digest : s->hashed;
    memcpy(h->digest, t->nbytes ? s->digest : e->empty_digest, 32);
    sl_slot_take(e, i, by_stream);
    e->live_handles++;
    e->st.bytes_delivered += t->nbytes;
    sl_metrics_first_tensor(&e->met);
    *out = h;
    return SLUICE_OK;
}

int sl_handle_release(sluice_tensor *t)
{
    sl_engine *e = t->e;
    pthread_mutex_lock(&e->lock);
    if (!t->live) {
        pthread_mutex_unlock(&e->lock);
        return SLUICE_E_INVAL;  /* released twice: no model to say it on */
    }
    /* Counted in before the handle is out: close, seeing no handle, must
     * still wait until this call has finished with the engine. */
    e->calls++;
    size_t i = t->index;
    t->live = 0;
    t->next_free = NULL;
    if (e->hfree_tail)
        e->hfree_tail->next_free = t;
    else
        e->hfree = t;
    e->hfree_tail = t;
    e->hfree_count++;
    e->live_handles--;
    void *owned = t->owned;
    t->owned = NULL;
    if (t->blk)
        sl_pool_free(e->pool, t->blk); /* a part's bytes (sluice_acquire_part) */
    t->blk = NULL;
    if (!t->is_range)
        sl_slot_put(e, i);
    sl_pump(e);     /* its room may let something start */
    sl_unlock(e);
    free(owned);    /* a range's own buffer (sluice_acquire_range) */
    sl_pause_point(e, SL_PAUSE_RELEASE_EXIT);
    sl_engine_leave(e);
    return SLUICE_OK;
}

const void *sl_handle_data(const sluice_tensor *t)
{
    return t->data;
}

uint64_t sl_handle_size(const sluice_tensor *t)
{
    return t->size;
}

const struct sluice_tensor_info *sl_handle_info(const sluice_tensor *t)
{
    return t->info;
}

const char *sl_handle_source(const sluice_tensor *t)
{
    /* Written before the slot became READY, under the lock the acquire
     * took; unchanged while a handle holds the slot. */
    const sl_slot *s = &t->e->slots[t->index];
    const char *note = s->fb_note ? s->fb_note : s->px_note;
    return note ? note : "";
}

int sl_handle_digest(const sluice_tensor *t, uint8_t digest[32])
{
    if (!t->has_digest)
        return SLUICE_E_INVAL;
    memcpy(digest, t->digest, 32);
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- acquire */

/* Read-ahead follows the caller along the plan, as the kernel's follows a
 * reader along a file: it goes on from an acquire that continues the plan
 * (the next few positions, so that several threads walking it together
 * count), or any acquire when the caller gave the plan with
 * sluice_prefetch; after a jump in the default plan it pauses, so that
 * acquires in random order read nothing nobody asked for. Lock held. */
static void follow_caller(sl_engine *e, size_t pos)
{
    if (pos == SL_NONE)
        return;
    int hinted = e->plan != e->order;
    /* A tensor the plan names twice (pos is its first place): an acquire
     * that continues the plan is at its next place after the previous
     * acquire's, not back at the first (read-ahead would read again from
     * there what was used and evicted). */
    if (hinted && e->last_pos != SL_NONE && pos <= e->last_pos) {
        size_t i = e->plan[pos];
        for (size_t k = e->last_pos + 1; k < e->plan_n && k <= e->last_pos + 8; k++)
            if (e->plan[k] == i) {
                pos = k;
                break;
            }
    }
    int in_order = e->last_pos == SL_NONE ? pos == 0 : pos > e->last_pos && pos <= e->last_pos + 8;
    e->last_pos = pos;
    e->plan_active = hinted || in_order;
    e->cursor = pos + 1;
}

int sl_engine_acquire(sl_engine *e, size_t i, sluice_tensor **out, sl_err *err)
{
    pthread_mutex_lock(&e->lock);
    e->st.acquire_count++;
    sl_slot *s = &e->slots[i];
    int rc;
    follow_caller(e, e->plan_pos[i]);
    if (s->state == SL_SLOT_READY) {
        if ((rc = sl_grant(e, i, 0, out, err)) == SLUICE_OK) {
            e->st.cache_hits++;
            sl_metrics_observe(&e->met, SL_H_ACQUIRE_WAIT, 0);
        }
        sl_unlock(e);
        return rc;
    }
    if (sl_slot_too_large(e, i)) {
        e->st.failures++;
        rc = sl_slot_too_large_error(e, i, err);
        pthread_mutex_unlock(&e->lock);
        return rc;
    }
    uint64_t t0 = sl_now_ns();
    /* While this thread waits, the streams whose callbacks it runs give
     * nothing back: the pump must know, or two such threads could each
     * wait for the other's room for ever, also across two models. Those of
     * other engines are marked under their own locks, never nested. */
    int elsewhere = sl_in_callback_elsewhere(e);
    if (elsewhere) {
        sl_unlock(e);
        sl_mark_blocked_elsewhere(e, +1);
        pthread_mutex_lock(&e->lock);
    }
    uint64_t gen = s->gen;  /* failures from here on are this wait's */
    sl_waiter w = {.slot = i, .in_callback = sl_mark_blocked(e, +1)};
    w.next = e->waiters;
    e->waiters = &w;
    sl_slot_pin(e, i);
    if (w.in_callback)
        sl_pump(e); /* a demand already queued may now be hopeless */
    for (;;) {
        if (s->state == SL_SLOT_READY) {
            rc = sl_grant(e, i, 0, out, err);
            break;
        }
        if (s->gen != gen) {
            rc = sl_slot_failure(s, err);
            break;
        }
        if (w.refused) {
            if (e->test_pause) {
                /* A test holds the refused caller before it leaves. */
                sl_unlock(e);
                sl_pause_point(e, SL_PAUSE_REFUSED);
                pthread_mutex_lock(&e->lock);
            }
            e->st.failures++;
            rc = sl_fail(err, w.err.code, "%s", w.err.msg);
            break;
        }
        if (s->state == SL_SLOT_IDLE && !s->in_demand) {
            sl_demand(e, i);
            sl_pump(e);
            continue;   /* the pump may have failed it already */
        }
        sl_wait(e);
    }
    for (sl_waiter **p = &e->waiters; *p; p = &(*p)->next)
        if (*p == &w) {
            *p = w.next;
            break;
        }
    sl_mark_blocked(e, -1);
    sl_slot_unpin(e, i);
    sl_demand_drop_if_unwanted(e, i);
    uint64_t waited = sl_now_ns() - t0;
    e->st.acquire_wait_ns += waited;
    sl_metrics_add(&e->met, &e->met.cache_misses, 1);
    if (rc == SLUICE_OK) /* the histogram is of acquires served */
        sl_metrics_observe(&e->met, SL_H_ACQUIRE_WAIT, waited);
    /* A demand, or a part waiting for room (which counted this refused
     * caller as room that may come back), may now learn it has none. */
    if (e->dq_head != SL_NONE || e->room_waiters)
        sl_pump(e);
    sl_unlock(e);
    if (elsewhere)
        sl_mark_blocked_elsewhere(e, -1);
    return rc;
}

/* ---------------------------------------------------------------- plan */

int sl_engine_prefetch(sl_engine *e, size_t *ids, size_t n, sl_err *err)
{
    size_t *pos = NULL;
    if (n) {
        if (!(pos = malloc((e->n ? e->n : 1) * sizeof *pos))) {
            free(ids);
            return sl_fail(err, SLUICE_E_NOMEM, "prefetch: out of memory");
        }
        for (size_t i = 0; i < e->n; i++)
            pos[i] = SL_NONE;
        for (size_t k = n; k-- > 0;)
            pos[ids[k]] = k;    /* a repeated name: its first place */
    }
    pthread_mutex_lock(&e->lock);
    if (e->plan != e->order)
        free(e->plan);
    if (e->plan_pos != e->order)
        free(e->plan_pos);
    e->plan = n ? ids : e->order;
    e->plan_pos = n ? pos : e->order;
    e->plan_n = n ? n : e->n;
    e->cursor = 0;
    e->last_pos = SL_NONE;
    e->plan_active = 1;
    /* What the old plan read ahead, nobody used and the new one does not
     * name may now make room for the new one. */
    sl_slots_age_prefetched(e);
    sl_pump(e);
    sl_unlock(e);
    return SLUICE_OK;
}

/* ---------------------------------------------------------------- stats, trim */

void sl_engine_stats(sl_engine *e, struct sluice_stats *out)
{
    pthread_mutex_lock(&e->lock);
    *out = e->st;
    out->pool_in_use = sl_pool_in_use(e->pool);
    out->pool_high_water = sl_pool_high_water(e->pool);
    pthread_mutex_unlock(&e->lock);
    sl_ecache_stats(e, out);
    /* The model's remote requests outside tensor reads (open's headers,
     * index.json and manifest, mirrors' opens), and every retry by
     * cause, tensor reads' included: the remote tally. */
    const sl_remote_tally *t = e->have_rcfg ? e->rcfg.tally : NULL;
    if (t) {
        out->remote_open_requests = atomic_load_explicit(&t->requests, memory_order_relaxed);
        out->remote_open_bytes = atomic_load_explicit(&t->bytes, memory_order_relaxed);
        out->remote_retries = 0;
        for (int k = 0; k < SL_RRETRY_COUNT_; k++)
            out->remote_retries += atomic_load_explicit(&t->retries[k], memory_order_relaxed);
        /* the proxy's failures: the requests' (the tally) and the loads'
         * whose bytes from it failed verification (e->st) */
        out->proxy_failures += atomic_load_explicit(&t->proxy_failures, memory_order_relaxed);
        out->proxy_bypass_bytes =
            atomic_load_explicit(&t->proxy_bypass_bytes, memory_order_relaxed);
    }
}

void sl_engine_note_verification(sl_engine *e, uint32_t state)
{
    pthread_mutex_lock(&e->lock);
    e->st.unverified = state;
    pthread_mutex_unlock(&e->lock);
}

uint64_t sl_engine_trim(sl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    /* Only what sits on the LRU lists: nothing holds it, nobody waits. */
    sl_slots_evict_unheld(e);
    /* Read-ahead would fill it again at once: it resumes with the next
     * acquire along the plan. */
    e->plan_active = 0;
    uint64_t given = sl_pool_trim(e->pool);
    pthread_mutex_unlock(&e->lock);
    return given;
}
