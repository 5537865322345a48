/* sched.c: the plan and the pump of an engine, and what happens when a
 * read or a hash job completes. It reads slots and moves them only
 * through slot.c's transitions (see slot.c for the state machine, and
 * engine_int.h for the lock).
 *
 * The pump fills free read slots (queue_depth of them) in this order:
 *  1. demand: tensors a caller is blocked on (acquire, a stream's head).
 *     They may evict any unheld buffer, but only when eviction can place
 *     the buffer (held buffers may split the pool): nothing is evicted
 *     for nothing. When one cannot get room and nothing is on its way to
 *     give room back (room_may_return: no read in flight, no waiter about
 *     to take a READY tensor and return, no stream callback running whose
 *     thread is not itself waiting in the library), waiting could last for
 *     ever: if a waiter runs in a stream callback (an acquire, one of this
 *     tensor's first, else any, a part acquire's wait for room included:
 *     while it waits nothing ahead of it moves), that
 *     waiter alone is refused (its return gives its stream's room back;
 *     until it has left, room counts as coming back), else the tensor
 *     fails with SLUICE_E_POOL_EXHAUSTED for all its waiters: the room is
 *     held by handles that only their owners can release. (So a thread may
 *     see POOL_EXHAUSTED while another thread holds handles it would
 *     release soon: size the pool for what all threads hold at once.)
 *     While a demand waits for room, nothing speculative starts (it would
 *     take the room first).
 *  2. the remaining chunks of tensors already started (they hold memory).
 *  3. streams' read-ahead, then 4. the plan's read-ahead. Speculative
 *     reads may only evict buffers already handed out and released, or
 *     unused and off a hinted plan (CACHED), never other read-ahead
 *     (PREFETCHED), so read-ahead cannot
 *     thrash itself; it stops when the pool is full of unconsumed data.
 *     A demand that evicted read-ahead pauses the plan's until the next
 *     acquire along the plan or hint (slot.c, evict_one).
 *
 * A tensor is read as one buffer of its own from the pool, in chunks of
 * chunk_bytes; small tensors adjacent in a file and next in the same
 * sequence share one read with one iovec each (no byte wasted, each still
 * 64-byte aligned).
 */
#include "engine/engine_int.h"
#include "base/cancel.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- queues */

void sl_demand(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (s->in_demand)
        return;
    s->in_demand = 1;
    s->dnext = SL_NONE;
    if (e->dq_tail != SL_NONE)
        e->slots[e->dq_tail].dnext = i;
    else
        e->dq_head = i;
    e->dq_tail = i;
}

static void demand_pop(sl_engine *e)
{
    sl_slot *s = &e->slots[e->dq_head];
    e->dq_head = s->dnext;
    if (e->dq_head == SL_NONE)
        e->dq_tail = SL_NONE;
    s->in_demand = 0;
}

/* ---------------------------------------------------------------- reads */

static sl_read *take_read(sl_engine *e)
{
    sl_read *r = e->free_reads;
    if (r) {
        e->free_reads = r->next_free;
        e->inflight++;
        r->job = NULL;
        r->req.spans = NULL;   /* a read of iov, no token: a load's */
        r->req.nspans = 0;
        r->req.cancel = NULL;
    }
    return r;
}

static void put_read(sl_engine *e, sl_read *r)
{
    r->next_free = e->free_reads;
    e->free_reads = r;
    if (--e->inflight == 0)
        pthread_cond_broadcast(&e->cv); /* close waits for this */
}

static void submit_read(sl_engine *e, sl_read *r)
{
    const sl_file *f = sl_read_file(e, r->source, r->file);
    r->req.fd = r->direct ? e->files[r->file].direct_fd : f->fd;
    r->req.offset = r->offset;
    memcpy(r->iov, r->iov0, (size_t)r->nseg * sizeof *r->iov);
    r->req.iov = r->iov;
    r->req.iovcnt = r->nseg;
    r->req.owner = r;
    r->t_submit = sl_metrics_now(&e->met);
    r->remote = (f->src->caps & SL_SRC_NETWORK) != 0;
    const sl_slot *s0 = &e->slots[r->seg[0].tensor];
    r->req.no_proxy = s0->px_direct;
    r->req.demand = s0->in_demand || s0->pins;
    f->src->submit(f, e->io, e->rio, &r->req);
    e->need_flush = 1;
}

/* Issues reads for the chunks of slot i while read slots are free. */
static void issue_chunks(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    uint64_t need_end = s->delta + t->nbytes; /* buffer offset past the last byte */
    while (s->state == SL_SLOT_READING && s->issued < s->nchunks) {
        sl_read *r = take_read(e);
        if (!r)
            return;
        uint32_t c = s->issued;
        uint64_t b0 = (uint64_t)c * s->chunk;
        uint64_t b1 = b0 + s->chunk < s->span ? b0 + s->chunk : s->span;
        r->source = s->source;
        r->file = s->source ? s->src_file : t->file_index;
        r->direct = s->direct && !e->files[t->file_index].fell_back;
        r->offset = (s->source ? s->src_off : t->offset) - s->delta + b0;
        r->len = b1 - b0;
        r->nseg = 1;
        r->seg[0] = (sl_seg){i, c};
        r->iov0[0] = (struct iovec){s->buf + b0, (size_t)(b1 - b0)};
        r->req.min_bytes = (need_end < b1 ? need_end : b1) - b0;
        sl_slot_issued(e, i);
        submit_read(e, r);
    }
}

/* One read for k whole tensors, adjacent in one file, each one chunk. */
static void issue_group(sl_engine *e, const size_t *group, int k)
{
    sl_read *r = take_read(e);
    const struct sluice_tensor_info *t0 = &e->ix->tensors[group[0]];
    r->source = 0;
    r->file = t0->file_index;
    r->direct = 0;
    r->offset = t0->offset;
    r->len = 0;
    r->nseg = k;
    for (int j = 0; j < k; j++) {
        sl_slot *s = &e->slots[group[j]];
        uint64_t nb = e->ix->tensors[group[j]].nbytes;
        r->seg[j] = (sl_seg){group[j], 0};
        r->iov0[j] = (struct iovec){s->buf, (size_t)nb};
        r->len += nb;
        sl_slot_issued(e, group[j]);
    }
    r->req.min_bytes = r->len;
    submit_read(e, r);
}

/* Starts ids[0] (IDLE; a read slot must be free) and, in the same read,
 * the positions after it that are small, IDLE and next in the same file.
 * Returns the positions covered (empty tensors on the way included), 0
 * when ids[0] could not start. */
static size_t start_run(sl_engine *e, const size_t *ids, size_t n, int room)
{
    size_t i = ids[0];
    if (sl_slot_start(e, i, room, 1) <= 0)
        return 0;
    sl_slot *s = &e->slots[i];
    if (s->direct || s->nchunks > 1 || s->source) {
        issue_chunks(e, i);
        if (s->issued < s->nchunks)
            sl_slot_partial_push(e, i, 0);
        return 1;
    }
    size_t group[SL_MAX_SEGS];
    int k = 1;
    group[0] = i;
    const struct sluice_tensor_info *prev = &e->ix->tensors[i];
    uint64_t len = prev->nbytes;
    size_t pos = 1;
    for (; pos < n && k < SL_MAX_SEGS; pos++) {
        size_t j = ids[pos];
        const struct sluice_tensor_info *t = &e->ix->tensors[j];
        if (t->file_index != prev->file_index || t->offset != prev->offset + prev->nbytes)
            break;
        if (t->nbytes == 0)
            continue;   /* always READY; covered */
        if (e->slots[j].state != SL_SLOT_IDLE || sl_slot_would_be_direct(e, j) ||
            len + t->nbytes > e->chunk || (e->cache && sl_ecache_probe(e, j)))
            break;  /* (a tensor with a blob reads it, apart) */
        /* no blob: that answer stands for this start, which reads the
         * file with its neighbours (a probe again could find one another
         * process stored just now, and take it for this read's source) */
        if (sl_slot_start(e, j, room, 0) != 1)
            break;
        group[k++] = j;
        len += t->nbytes;
        prev = t;
    }
    issue_group(e, group, k);
    return pos;
}

/* Issues the runs of callers' span reads while read slots are free. */
static void issue_spans(sl_engine *e)
{
    for (sl_spanjob *j = e->jobs; j; j = j->next)
        while (!j->failed && j->issued < j->nrun && !sl_cancel_requested(j->cancel)) {
            sl_read *r = take_read(e);
            if (!r)
                return;
            const sl_run *u = &j->runs[j->issued];
            r->job = j;
            r->run = j->issued++;
            r->source = 0;
            r->direct = 0;
            r->nseg = 0;
            r->offset = u->offset;
            r->len = u->len;
            r->remote = (j->f->src->caps & SL_SRC_NETWORK) != 0;
            r->req.fd = j->f->fd;
            r->req.offset = u->offset;
            r->req.iov = u->iov;
            r->req.iovcnt = u->niov;
            r->req.spans = u->spans;
            r->req.nspans = u->nspans;
            r->req.cancel = j->cancel;
            r->req.min_bytes = u->len;
            r->req.owner = r;
            r->req.no_proxy = j->no_proxy;
            r->req.demand = 1;
            r->t_submit = sl_metrics_now(&e->met);
            j->f->src->submit(j->f, e->io, e->rio, &r->req);
            e->need_flush = 1;
        }
}

/* ---------------------------------------------------------------- sources */

static void stream_pin(sl_engine *e, sl_stream *st, size_t pos)
{
    size_t i = st->ids[pos];
    sl_slot *s = &e->slots[i];
    sl_slot_pin(e, i);
    st->pinned_bytes += e->ix->tensors[i].nbytes;
    st->pstate[pos] = SL_POS_PINNED;
    st->pgen[pos] = s->gen;
    st->pinned++;
}

/* A stream with nothing pinned makes its next tensor a demand, so that it
 * always progresses (and learns POOL_EXHAUSTED when it cannot). Not while
 * its callbacks run: the handles they hold may be released at once. */
static void stream_head(sl_engine *e, sl_stream *st)
{
    while (st->pinned == 0 && !st->delivering && st->hi < st->n) {
        size_t pos = st->hi++, i = st->ids[pos];
        if (sl_slot_too_large(e, i)) {
            st->pstate[pos] = SL_POS_TOO_LARGE;
            continue;
        }
        stream_pin(e, st, pos);
        if (e->slots[i].state == SL_SLOT_IDLE)
            sl_demand(e, i);
    }
}

/* Bytes the stream holds beyond its head: the head (however large) is
 * being waited for, and reading past it is what keeps the hash workers
 * and the read slots busy meanwhile. */
static uint64_t ahead_bytes(const sl_engine *e, const sl_stream *st)
{
    uint64_t b = st->pinned_bytes;
    if (st->lo < st->hi && st->pstate[st->lo] == SL_POS_PINNED)
        b -= e->ix->tensors[st->ids[st->lo]].nbytes;
    return b;
}

static void stream_ahead(sl_engine *e, sl_stream *st)
{
    while (st->hi < st->n && st->hi - st->lo < SL_STREAM_WINDOW && e->free_reads &&
           ahead_bytes(e, st) < e->stream_window) {
        size_t pos = st->hi, i = st->ids[pos];
        if (sl_slot_too_large(e, i)) {
            st->pstate[pos] = SL_POS_TOO_LARGE;
            st->hi++;
            continue;
        }
        if (e->slots[i].state != SL_SLOT_IDLE) {
            stream_pin(e, st, pos);
            st->hi++;
            continue;
        }
        size_t k = start_run(e, st->ids + pos, st->n - pos, SL_ROOM_SPEC);
        if (!k)
            break;
        for (size_t j = 0; j < k; j++)
            stream_pin(e, st, pos + j);
        st->hi += k;
    }
}

static void plan_ahead(sl_engine *e)
{
    while (e->cursor < e->plan_n && e->free_reads) {
        size_t i = e->plan[e->cursor];
        sl_slot *s = &e->slots[i];
        if (s->state != SL_SLOT_IDLE || sl_slot_too_large(e, i)) {
            /* Wanted again soon: protect it from read-ahead's evictions. */
            sl_slot_keep(e, i);
            e->cursor++;
            continue;
        }
        size_t k = start_run(e, e->plan + e->cursor, e->plan_n - e->cursor, SL_ROOM_SPEC);
        if (!k)
            break;
        e->cursor += k;
    }
}

/* Per thread, not per engine: what the calling thread's own call stack
 * holds (the frames live on it), so a wait in one model can mark the
 * streams of another whose callback it runs. */
static _Thread_local sl_frame *thread_frames;

void sl_frame_push(sl_frame *f, sl_engine *e, sl_stream *st)
{
    f->e = e;
    f->st = st;
    f->next = thread_frames;
    thread_frames = f;
}

void sl_frame_pop(sl_frame *f)
{
    for (sl_frame **p = &thread_frames; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
}

int sl_mark_blocked(sl_engine *e, int delta)
{
    for (sl_frame *f = thread_frames; f; f = f->next)
        if (f->e == e)
            f->st->blocked += (unsigned)delta;
    return thread_frames != NULL;
}

int sl_in_callback_elsewhere(const sl_engine *e)
{
    for (const sl_frame *f = thread_frames; f; f = f->next)
        if (f->e != e)
            return 1;
    return 0;
}

int sl_mark_blocked_elsewhere(sl_engine *e, int delta)
{
    int any = 0;
    /* Each frame's engine is alive: its stream is inside it, delivering. */
    for (sl_frame *f = thread_frames; f; f = f->next)
        if (f->e != e) {
            pthread_mutex_lock(&f->e->lock);
            f->st->blocked += (unsigned)delta;
            if (delta > 0)
                sl_pump(f->e);
            sl_unlock(f->e);
            any = 1;
        }
    return any;
}

void sl_demand_drop_if_unwanted(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (!s->in_demand || s->pins)
        return;
    size_t prev = SL_NONE;
    for (size_t d = e->dq_head; d != SL_NONE; prev = d, d = e->slots[d].dnext)
        if (d == i) {
            if (prev == SL_NONE)
                e->dq_head = s->dnext;
            else
                e->slots[prev].dnext = s->dnext;
            if (e->dq_tail == i)
                e->dq_tail = prev;
            break;
        }
    s->in_demand = 0;
}

/* Whether a stream that is not delivering has something to deliver: a
 * READY position (its thread hands it to a callback, which may release),
 * or a refused one (delivered as a failure, the stream moves on and its
 * caller's callback can return). */
static int stream_has_delivery(const sl_engine *e, const sl_stream *st)
{
    for (size_t pos = st->lo; pos < st->hi; pos++)
        if (st->pstate[pos] == SL_POS_REFUSED ||
            (st->pstate[pos] == SL_POS_PINNED && e->slots[st->ids[pos]].state == SL_SLOT_READY))
            return 1;
    return 0;
}

/* Whether room held now will come back without a release from outside
 * the library: reads in flight; a stream's callbacks running, unless
 * their thread is itself waiting in the library; a stream about to hand
 * over a READY tensor; a waiter about to take its READY tensor and
 * return. Handles held by threads outside the library are not counted:
 * they may never come back (see the comment at the top). */
int sl_room_may_return(const sl_engine *e)
{
    if (e->loading_bytes)
        return 1;
    for (const sl_stream *st = e->streams; st; st = st->next) {
        if (st->delivering ? !st->blocked : stream_has_delivery(e, st))
            return 1;
    }
    /* A refused waiter has not left yet: once it has, its stream's
     * callback can return and give room back. */
    for (const sl_waiter *w = e->waiters; w; w = w->next)
        if (w->refused || (w->slot != SL_NONE && e->slots[w->slot].state == SL_SLOT_READY))
            return 1;
    return 0;
}

/* Refuses position pos of a stream run from a callback: it is delivered
 * as a failure and the stream moves on. */
static void refuse_position(sl_engine *e, sl_stream *st, size_t pos)
{
    size_t i = st->ids[pos];
    st->pstate[pos] = SL_POS_REFUSED;
    st->pinned--;
    st->pinned_bytes -= e->ix->tensors[i].nbytes;
    sl_slot_unpin(e, i);
    sl_demand_drop_if_unwanted(e, i);
    pthread_cond_broadcast(&e->cv);
}

/* Demand i (SL_NONE: a part acquire's room) cannot get room and none
 * will come back. A thread waiting inside a stream callback (an acquire,
 * or a part acquire waiting for room) holds its stream's room, which only
 * its return gives back: refuse one such waiter (one of i's first, else
 * any: while it waits nothing ahead of it can move), and let the others
 * wait. Returns 1 when it refused one, 0 when no waiter runs in a
 * callback (then the room is held by handles outside the library). Lock
 * held. */
int sl_refuse_callback_waiter(sl_engine *e, size_t i, const sl_err *why)
{
    for (int any = i == SL_NONE; any <= 1; any++) {
        for (sl_waiter *w = e->waiters; w; w = w->next)
            if (w->in_callback && !w->refused && (any || w->slot == i)) {
                w->refused = 1;
                w->err = *why;
                pthread_cond_broadcast(&e->cv);
                return 1;
            }
        for (sl_stream *st = e->streams; st; st = st->next) {
            if (!st->in_callback)
                continue;
            for (size_t pos = st->lo; pos < st->hi; pos++)
                if (st->pstate[pos] == SL_POS_PINNED &&
                    (any ? e->slots[st->ids[pos]].state == SL_SLOT_IDLE : st->ids[pos] == i)) {
                    refuse_position(e, st, pos);
                    return 1;
                }
        }
    }
    return 0;
}

void sl_pump(sl_engine *e)
{
    if (e->closing)
        return;
    if (e->room_waiters)
        pthread_cond_broadcast(&e->cv); /* room may have come back, or never will */
    issue_spans(e);
    for (sl_stream *st = e->streams; st; st = st->next)
        stream_head(e, st);

    int blocked = 0;
    while (e->dq_head != SL_NONE) {
        size_t i = e->dq_head;
        sl_slot *s = &e->slots[i];
        if (s->state != SL_SLOT_IDLE) {
            demand_pop(e);
            continue;
        }
        if (!e->free_reads) {
            blocked = 1;
            break;
        }
        int rc = sl_slot_start(e, i, SL_ROOM_ANY, 1);
        if (rc == 0 && sl_room_may_return(e)) {
            blocked = 1;    /* wait for it */
            break;
        }
        if (rc == 0) {
            sl_err why;
            sl_slot_room_error(e, i, &why);
            if (sl_refuse_callback_waiter(e, i, &why)) {
                blocked = 1;    /* its return may give room back */
                break;
            }
            demand_pop(e);
            sl_slot_fail_idle(e, i, &why);
            continue;
        }
        demand_pop(e);
        if (rc < 0) {
            const struct sluice_tensor_info *t = &e->ix->tensors[i];
            char q[SL_QUOTE_MAX];
            sl_err err;
            sl_fail(&err, SLUICE_E_NOMEM, "tensor %s (file %s, offset %llu): out of memory",
                    sl_quote(q, sizeof q, t->name, t->name_len), t->file,
                    (unsigned long long)t->offset);
            sl_slot_fail_idle(e, i, &err);
            continue;
        }
        issue_chunks(e, i);
        if (s->issued < s->nchunks)
            sl_slot_partial_push(e, i, 1);
    }

    while (e->pq_head != SL_NONE && e->free_reads) {
        size_t i = e->pq_head;
        sl_slot *s = &e->slots[i];
        if (s->state == SL_SLOT_READING && s->issued < s->nchunks)
            issue_chunks(e, i);
        if (s->state != SL_SLOT_READING || s->issued == s->nchunks)
            sl_slot_partial_pop(e);
    }
    if (blocked || e->room_waiters)
        return; /* nothing speculative takes the room a demand waits for */
    for (sl_stream *st = e->streams; st && e->free_reads; st = st->next)
        stream_ahead(e, st);
    if (e->plan_active)
        plan_ahead(e);
}

void sl_mirror_opened(sl_engine *e, unsigned k)
{
    for (size_t i = 0; i < e->n; i++)
        if (e->slots[i].fb_wait && e->slots[i].source == k)
            sl_slot_resume(e, i);
    sl_pump(e);
}

/* ---------------------------------------------------------------- finishing */

/* The detail of a failed read, for segment tensor i. */
static void read_failure(const sl_engine *e, size_t i, const sl_read *r, sl_err *err)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    const sl_io_req *q = &r->req;
    char qn[SL_QUOTE_MAX];
    sl_quote(qn, sizeof qn, t->name, t->name_len);
    struct stat sb;
    const sl_file *f = sl_read_file(e, r->source, r->file);
    if (q->status) {
        sl_fail(err, q->status, "tensor %s (file %s, offset %llu, %llu bytes): read of %llu bytes "
                "at offset %llu failed: %s", qn, f->path,
                r->source ? (unsigned long long)e->slots[i].src_off : (unsigned long long)t->offset,
                (unsigned long long)t->nbytes, (unsigned long long)r->len,
                (unsigned long long)r->offset, q->detail);
        return;
    }
    if (r->source) {
        /* a mirror's local file */
        sl_fail_errno(err, q->eof ? SLUICE_E_FILE_CHANGED : SLUICE_E_IO, q->eof ? EIO : q->error,
                      "tensor %s (file %s, offset %llu): read of %llu bytes at offset %llu "
                      "failed%s", qn, f->path, (unsigned long long)e->slots[i].src_off,
                      (unsigned long long)r->len, (unsigned long long)r->offset,
                      q->eof ? " (the file ends early)" : "");
        return;
    }
    if (q->eof && fstat(e->ix->files[r->file].fd, &sb) == 0)
        sl_fail(err, SLUICE_E_FILE_CHANGED,
                "tensor %s (file %s, offset %llu, %llu bytes): the file is now %llu bytes, "
                "it ends before the tensor's last byte: it shrank after open",
                qn, t->file, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                (unsigned long long)sb.st_size);
    else if (q->eof)
        sl_fail(err, SLUICE_E_FILE_CHANGED,
                "tensor %s (file %s, offset %llu, %llu bytes): a read met the end of the file "
                "at offset %llu, before the tensor's last byte: it shrank after open",
                qn, t->file, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                (unsigned long long)q->error_offset);
    else
        sl_fail_errno(err, SLUICE_E_IO, q->error,
                      "tensor %s (file %s, offset %llu, %llu bytes): read of %llu bytes at "
                      "offset %llu%s failed at offset %llu",
                      qn, t->file, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                      (unsigned long long)r->len, (unsigned long long)r->offset,
                      r->direct ? " (O_DIRECT)" : "", (unsigned long long)q->error_offset);
}

/* Whether segment k of read r failed. A read that met the end of the
 * file brought the bytes before it: a segment wholly among them is
 * whole (a file cut in the middle of a group of small tensors fails
 * only those past the cut). Any other error fails every segment. */
static int segment_failed(const sl_read *r, int k)
{
    if (r->req.error)
        return 1;
    if (!r->req.eof)
        return 0;
    uint64_t end = 0;
    for (int j = 0; j <= k; j++)
        end += r->iov0[j].iov_len;
    return r->nseg == 1 || end > r->req.done_bytes;
}

static void segment_complete(sl_engine *e, const sl_read *r, int k)
{
    size_t i = r->seg[k].tensor;
    if (!segment_failed(r, k)) {
        sl_slot_landed(e, i, r->seg[k].chunk, NULL);
        return;
    }
    sl_err err;
    read_failure(e, i, r, &err);
    sl_slot_landed(e, i, r->seg[k].chunk, &err);
}

/* A local read's retries, in the stats and the metrics. */
static void count_retries(sl_engine *e, const sl_io_req *q)
{
    e->st.retries += q->retries;
    sl_metrics_add(&e->met, &e->met.retries[SL_RETRY_EINTR], q->retries_eintr);
    sl_metrics_add(&e->met, &e->met.retries[SL_RETRY_EAGAIN], q->retries_eagain);
    sl_metrics_add(&e->met, &e->met.retries[SL_RETRY_SHORT],
                   q->retries - q->retries_eintr - q->retries_eagain);
}

/* A run of a caller's span read came back: counted as a load's read (a
 * remote one's requests in remote_reads, their bytes, gaps included, in
 * remote_bytes and bytes_read), its failure (the first) kept for the
 * caller, who is woken when the job is over (alone: the other callers'
 * jobs and loads sleep on). */
static void run_done(sl_engine *e, sl_read *r)
{
    sl_spanjob *j = r->job;
    const sl_run *u = &j->runs[r->run];
    const sl_io_req *q = &r->req;
    int bad = q->error || q->eof || q->status;
    if (r->remote) {
        e->st.remote_reads += q->requests;
        e->st.remote_bytes += q->done_bytes;
        e->st.bytes_read += q->done_bytes;
        j->proxied |= q->proxied;
    } else {
        count_retries(e, q);
        e->st.bytes_read += bad ? q->done_bytes : u->len - u->gap;
    }
    e->st.reads++;
    sl_metrics_since(&e->met, SL_H_READ, r->t_submit);
    if (bad && !j->failed) {
        const char *path = j->f->path;
        unsigned long long len = u->len, off = u->offset;
        j->failed = 1;
        if (q->status == SLUICE_E_CANCELLED || sl_cancel_requested(j->cancel))
            sl_fail(&j->err, SLUICE_E_CANCELLED, "read_part: cancelled (its token was "
                    "requested) after %zu of %zu reads", j->done, j->nrun);
        else if (q->status)
            sl_fail(&j->err, q->status, "file %s: read of %llu bytes at offset %llu failed: %s",
                    path, len, off, q->detail);
        else if (q->eof)
            sl_fail(&j->err, SLUICE_E_FILE_CHANGED, "file %s: a read of %llu bytes at offset "
                    "%llu met the end of the file at offset %llu: it shrank after open", path,
                    len, off, (unsigned long long)q->error_offset);
        else
            sl_fail_errno(&j->err, SLUICE_E_IO, q->error, "file %s: read of %llu bytes at "
                          "offset %llu failed at offset %llu", path, len, off,
                          (unsigned long long)q->error_offset);
    }
    j->done++;
    put_read(e, r);
    if (sl_spanjob_over(j))
        pthread_cond_signal(&j->cv);
}

void sl_read_done(void *ctx, sl_io_req *list)
{
    sl_engine *e = ctx;
    pthread_mutex_lock(&e->lock);
    for (sl_io_req *q = list, *next; q; q = next) {
        next = q->next;
        sl_read *r = (sl_read *)q;
        if (r->job) {
            run_done(e, r);
            continue;
        }
        if (r->remote) {
            for (int k = 0; k < r->nseg; k++) {
                /* the proxy's part in each load (sluice.h "Proxies") */
                size_t i = r->seg[k].tensor;
                e->slots[i].px_used |= q->proxied;
                if (q->proxy_why[0])    /* it failed this read, or was skipped */
                    sl_slot_proxy_note(e, i, q->proxy_why);
            }
            e->st.remote_reads++;
            e->st.remote_bytes += q->done_bytes;
            e->st.bytes_read += q->done_bytes;
            e->st.reads++;
            sl_metrics_since(&e->met, SL_H_READ, r->t_submit);
            for (int k = 0; k < r->nseg; k++)
                segment_complete(e, r, k);
            put_read(e, r);
            continue;
        }
        count_retries(e, q);
        e->st.bytes_read += q->done_bytes;
        if (q->error == EINVAL && r->direct) {
            /* The file system refuses O_DIRECT: read this file buffered
             * from now on, this read first (same buffer, same span). */
            sl_efile *f = &e->files[r->file];
            if (!f->fell_back) {
                f->fell_back = 1;
                e->st.direct_fallbacks++;
                sl_metrics_add(&e->met, &e->met.fallbacks[SL_FALLBACK_READ], 1);
            }
            r->direct = 0;
            submit_read(e, r);
            continue;
        }
        e->st.reads++;
        sl_metrics_since(&e->met, SL_H_READ, r->t_submit);
        for (int k = 0; k < r->nseg; k++)
            segment_complete(e, r, k);
        put_read(e, r);
    }
    sl_pump(e);
    sl_unlock(e);
}

void sl_hash_done(void *ctx, sl_hash_job *job, int status)
{
    sl_engine *e = ctx;
    size_t i = (size_t)(uintptr_t)sl_hash_job_owner(job);
    int verdict = sl_slot_check(e, i, status); /* the compare and the move, unlocked */
    if (e->cache && sl_slot_verdict_ok(verdict))
        sl_ecache_verified(e, i);  /* a blob stored, the memo recorded */
    pthread_mutex_lock(&e->lock);
    sl_slot_hashed(e, i, verdict);
    sl_pump(e);     /* a failure gave room back */
    sl_unlock(e);
}

/* ---------------------------------------------------------------- span reads */

/* Cuts spans into runs (engine_int.h, sl_spanjob): the next span joins the
 * run before it when it starts less than SLUICE_PART_GAP past its end and
 * the run stays within max bytes and SL_RUN_IOV iovecs (its gap's bytes go
 * to scratch, placed by give_scratch); a span longer than max is cut. runs
 * and iov hold the upper bounds the caller counted. Returns the runs made. */
static size_t cut_runs(const sl_span *sp, size_t n, uint64_t max, sl_run *runs,
                       struct iovec *iov)
{
    size_t nrun = 0, niov = 0;
    sl_run *u = NULL;
    for (size_t k = 0; k < n; k++) {
        uint64_t pos = sp[k].offset, left = sp[k].len;
        unsigned char *d = sp[k].dst;
        while (left) {
            uint64_t end = u ? u->offset + u->len : 0, gap = pos - end;
            int join = u && pos >= end && gap < SLUICE_PART_GAP && u->len + gap < max &&
                       u->niov + 2 <= SL_RUN_IOV;
            if (join && gap) {
                iov[niov++] = (struct iovec){NULL, (size_t)gap}; /* give_scratch */
                u->niov++;
                u->len += gap;
                u->gap += gap;
            } else if (!join) {
                u = &runs[nrun++];
                *u = (sl_run){.offset = pos, .iov = &iov[niov]};
            }
            uint64_t take = left < max - u->len ? left : max - u->len;
            iov[niov++] = (struct iovec){d, (size_t)take};
            u->niov++;
            u->len += take;
            pos += take;
            d += take;
            left -= take;
        }
    }
    return nrun;
}

/* Points the gaps of each run that has any at a scratch page of that run's
 * own (a span's dst is never NULL: a gap's iovec is): runs in flight at
 * once are read by different threads, and within one run the gaps land one
 * after another. Returns the pages (NULL with *failed set when out of
 * memory; NULL and no failure when no run has a gap). */
static unsigned char *give_scratch(sl_run *runs, size_t nrun, int *failed)
{
    size_t pages = 0;
    for (size_t r = 0; r < nrun; r++)
        pages += runs[r].gap != 0;
    *failed = 0;
    if (!pages)
        return NULL;
    unsigned char *scratch = malloc(pages * (size_t)SLUICE_PART_GAP);
    if (!scratch) {
        *failed = 1;
        return NULL;
    }
    size_t page = 0;
    for (size_t r = 0; r < nrun; r++) {
        if (!runs[r].gap)
            continue;
        for (int v = 0; v < runs[r].niov; v++)
            if (!runs[r].iov[v].iov_base)
                runs[r].iov[v].iov_base = scratch + page * (size_t)SLUICE_PART_GAP;
        page++;
    }
    return scratch;
}

/* The token's wake-up of a span job's caller (sl_cancel_register). */
typedef struct spans_wake {
    sl_engine *e;
    sl_spanjob *j;
} spans_wake;

static void wake_spans(void *ctx)
{
    spans_wake *w = ctx;
    pthread_mutex_lock(&w->e->lock);
    pthread_cond_signal(&w->j->cv);
    if (w->e->rio && w->j->f->src->batch_spans)
        sl_rio_flush(w->e->rio); /* its transfers on the wire see the token now */
    pthread_mutex_unlock(&w->e->lock);
}

/* Cuts a remote file's spans into runs: a span longer than max is cut
 * into pieces of max bytes, each a run (a range of its own, straight into
 * its dst); the spans between such, one run per request the remote seam
 * makes of them (f's source's batch_spans: a multi-range request, or one
 * coalesced range). cut (as many spans as runs holds) gets the spans the
 * runs point at. Returns the runs made. */
static size_t remote_runs(const sl_file *f, const sl_span *sp, size_t n, uint64_t max,
                          sl_span *cut, sl_run *runs)
{
    size_t pieces = 0, nrun = 0;
    for (size_t k = 0; k < n;) {
        size_t base = pieces;
        if (sp[k].len > max) {
            for (uint64_t at = 0; at < sp[k].len; at += max) {
                uint64_t take = sp[k].len - at < max ? sp[k].len - at : max;
                cut[pieces] = (sl_span){sp[k].offset + at, take, sp[k].dst + at};
                runs[nrun++] = (sl_run){.offset = sp[k].offset + at, .len = take,
                                        .spans = &cut[pieces++], .nspans = 1};
            }
            k++;
            continue;
        }
        for (; k < n && sp[k].len <= max; k++)
            if (sp[k].len)
                cut[pieces++] = sp[k];
        for (size_t s = base; s < pieces;) {
            size_t take = f->src->batch_spans(f, cut + s, pieces - s);
            const sl_span *last = &cut[s + take - 1];
            runs[nrun++] = (sl_run){.offset = cut[s].offset,
                                    .len = last->offset + last->len - cut[s].offset,
                                    .spans = cut + s, .nspans = take};
            s += take;
        }
    }
    return nrun;
}

int sl_engine_read_spans(sl_engine *e, sluice_cancel *cancel, const sl_file *f,
                         const sl_remote_cfg *rc_of, const sl_span *spans, size_t n,
                         int *through_proxy, sl_err *err)
{
    uint64_t max = e->chunk, pieces = 0;
    for (size_t k = 0; k < n; k++)
        pieces += spans[k].len / max + 2; /* the first may end the run before */
    /* at most one run and two iovecs (a gap, a piece) per piece; a remote
     * file's: a run and a span (in the room of two iovecs) per piece */
    _Static_assert(sizeof(sl_span) <= 2 * sizeof(struct iovec), "a span in two iovecs' room");
    int remote = f->src->batch_spans != NULL;
    sl_spanjob j = {.f = f, .cancel = cancel,
                    .no_proxy = remote && rc_of && sl_remote_direct_hop(rc_of)};
    pthread_cond_init(&j.cv, NULL);
    int big = pieces > SIZE_MAX / (2 * sizeof(struct iovec));
    unsigned char *scratch = NULL;
    j.runs = big ? NULL : malloc((size_t)pieces * sizeof *j.runs);
    void *iov = big ? NULL : malloc((size_t)pieces * 2 * sizeof(struct iovec));
    int rc = SLUICE_OK, no_room = !j.runs || !iov;
    if (!no_room && remote) {
        j.nrun = remote_runs(f, spans, n, max, iov, j.runs);
    } else if (!no_room) {
        j.nrun = cut_runs(spans, n, max, j.runs, iov);
        scratch = give_scratch(j.runs, j.nrun, &no_room);
    }
    spans_wake w = {e, &j};
    sl_cancel_reg reg = {.wake = wake_spans, .ctx = &w};
    if (no_room) {
        rc = sl_fail(err, SLUICE_E_NOMEM, "read_part: out of memory for %zu spans", n);
    } else if (sl_cancel_requested(cancel)) {
        rc = sl_fail(err, SLUICE_E_CANCELLED, "read_part: cancelled (its token was requested)");
    } else {
        sl_cancel_register(cancel, &reg); /* before the lock: the wake-up takes it */
        pthread_mutex_lock(&e->lock);
        sl_spanjob **tail = &e->jobs;
        while (*tail)
            tail = &(*tail)->next;
        *tail = &j;
        sl_pump(e);
        if (cancel && e->test_pause) { /* first runs out, lock not held (a test's hook) */
            sl_unlock(e);
            sl_pause_point(e, SL_PAUSE_SPANS_ISSUED);
            pthread_mutex_lock(&e->lock);
        }
        for (;;) {
            /* cancelled: no run goes out any more (as after a failed run);
             * those in flight write into dst, so they are waited for */
            if (!j.failed && sl_cancel_requested(cancel)) {
                j.failed = 1;
                sl_fail(&j.err, SLUICE_E_CANCELLED, "read_part: cancelled (its token was "
                        "requested) after %zu of %zu reads", j.done, j.nrun);
            }
            if (sl_spanjob_over(&j))
                break;
            /* nothing in flight, runs left: the token held them back
             * (issue_spans) and was reset since; no completion is coming
             * to issue them, so the caller does */
            if (j.done == j.issued)
                sl_pump(e);
            sl_wait_on(e, &j.cv);
            sl_pause_point(e, SL_PAUSE_SPANS_WOKEN);
        }
        for (sl_spanjob **p = &e->jobs; *p; p = &(*p)->next)
            if (*p == &j) {
                *p = j.next;
                break;
            }
        sl_unlock(e);
        sl_cancel_unregister(cancel, &reg);
        if (j.proxied)
            *through_proxy = 1;
        if (j.failed) {
            *err = j.err;
            rc = j.err.code;
        }
    }
    free(scratch);
    free(j.runs);
    free(iov);
    pthread_cond_destroy(&j.cv);
    return rc;
}

static int reader_spans(void *ctx, sluice_cancel *cancel, const sl_file *f,
                        const sl_remote_cfg *rc, const sl_span *spans, size_t n,
                        int *through_proxy, sl_err *err)
{
    return sl_engine_read_spans(ctx, cancel, f, rc, spans, n, through_proxy, err);
}

sl_reader sl_engine_reader(sl_engine *e, sluice_cancel *cancel)
{
    return (sl_reader){reader_spans, e, cancel};
}
