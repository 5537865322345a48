/* slot.c: the state of every tensor's slot, and the only code that
 * changes it; with the LRU lists and the pool, which hold its buffer.
 * Other parts of the engine read a slot and call the transitions below.
 *
 *                  start (a buffer, the chunk map, a hash job if needed)
 *        IDLE ─────────────────────────────────────────────► READING
 *        ▲  ▲                                          │       │
 *        │  │ evict: nothing holds it                  │       │ every chunk landed
 *        │  │                                          │       ▼
 *        │  └────────────── READY ◄─────────────────── │ ── HASHING
 *        │                   ▲   no job: every chunk   │       │
 *        │                   │   landed (READING)      │       │ digest mismatch,
 *        │                   └─────────────────────────┘       │ OpenSSL fails
 *        │   drained: no read in flight,   read fails  │       │
 *        └──────── FAILED ◄────────────────────────────┘◄──────┘
 *                  no hash job busy
 *
 *  IDLE     no buffer. Empty tensors are READY for ever and never move.
 *  READING  chunks go out (issued, inflight) and land (done; prefix is the
 *           run of landed chunks from the first); the hash job is told
 *           how many of the tensor's bytes have arrived, in order.
 *  HASHING  every chunk landed; the hash job finishes the digest (or, with
 *           no digest, moves O_DIRECT bytes to an aligned start).
 *  READY    the verified bytes at data. refs (handles) and pins (waiters
 *           about to take a handle) hold it; with neither it sits on an
 *           LRU list: CACHED (handed out since it was read; a stream's
 *           delivery at the head, `spent`, so its room is reused first;
 *           at the head too, unused and not named by a hinted plan) or
 *           PREFETCHED (read ahead, not used yet, wanted by the plan).
 *  FAILED   the error is kept; the buffer waits until no read of it is in
 *           flight and the hash job is quiet, then the slot is IDLE again
 *           with gen + 1: waiters that saw gen move take the error.
 * Invariants: a buffer (blk) exactly in READING, HASHING, READY, FAILED
 * (empty tensors aside); on an LRU list exactly when READY with no refs
 * and no pins; loading_bytes is the span of every READING, HASHING and
 * FAILED slot. Every call holds e->lock except sl_slot_check.
 */
#include "engine/engine_int.h"

#include "base/digest.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* ---------------------------------------------------------------- set-up */

int sl_slots_init(sl_engine *e)
{
    e->slots = calloc(e->n ? e->n : 1, sizeof *e->slots);
    if (!e->slots)
        return SLUICE_E_NOMEM;
    for (int l = 0; l < 3; l++)
        e->lru[l].head = e->lru[l].tail = SL_NONE;
    for (size_t i = 0; i < e->n; i++) {
        sl_slot *s = &e->slots[i];
        s->lprev = s->lnext = s->dnext = s->pnext = SL_NONE;
        s->hashed = (e->flags & SLUICE_F_HASH_ALL) || sl_expected_digest(e, i);
        s->state = e->ix->tensors[i].nbytes == 0 ? SL_SLOT_READY : SL_SLOT_IDLE;
    }
    return SLUICE_OK;
}

void sl_slots_free(sl_engine *e)
{
    for (size_t i = 0; e->slots && i < e->n; i++) {
        free(e->slots[i].err_msg);
        free(e->slots[i].fb_log);
        free(e->slots[i].fb_note);
        free(e->slots[i].px_note);
        free(e->slots[i].done_bits);
        sl_hash_job_free(e->slots[i].job);
    }
    free(e->slots);
    e->slots = NULL;
}

/* ---------------------------------------------------------------- geometry */

static int chunk_done(const sl_slot *s, uint32_t c)
{
    const uint64_t *w = s->done_bits ? s->done_bits : &s->done_word;
    return (int)((w[c >> 6] >> (c & 63)) & 1);
}

static void chunk_set_done(sl_slot *s, uint32_t c)
{
    uint64_t *w = s->done_bits ? s->done_bits : &s->done_word;
    w[c >> 6] |= (uint64_t)1 << (c & 63);
}

int sl_slot_would_be_direct(const sl_engine *e, size_t i)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    const sl_efile *f = &e->files[t->file_index];
    return f->direct_fd >= 0 && !f->fell_back && t->nbytes >= SL_DIRECT_MIN;
}

/* The file range a load of tensor i reads: [*a0, *a0 + *span). */
static void load_range(const sl_engine *e, size_t i, int direct, uint64_t *a0, uint64_t *span)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    if (!direct) {
        *a0 = t->offset;
        *span = t->nbytes;
        return;
    }
    *a0 = t->offset & ~(uint64_t)(SL_DIRECT_ALIGN - 1);
    *span = round_up(t->offset + t->nbytes, SL_DIRECT_ALIGN) - *a0;
}

int sl_slot_too_large(const sl_engine *e, size_t i)
{
    uint64_t a0, span;
    load_range(e, i, sl_slot_would_be_direct(e, i), &a0, &span);
    return round_up(span, SL_POOL_ALIGN) > sl_pool_capacity(e->pool);
}

int sl_slot_too_large_error(const sl_engine *e, size_t i, sl_err *err)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    char q[SL_QUOTE_MAX];
    return sl_fail(err, SLUICE_E_TOO_LARGE,
                   "tensor %s (file %s) is %llu bytes%s, larger than the whole pool budget "
                   "(pool_bytes %llu)",
                   sl_quote(q, sizeof q, t->name, t->name_len), t->file,
                   (unsigned long long)t->nbytes,
                   (e->flags & SLUICE_F_DIRECT) ? " (more with O_DIRECT alignment)" : "",
                   (unsigned long long)e->st.pool_bytes);
}

/* ---------------------------------------------------------------- LRU lists */

static void lru_remove(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (s->lru == SL_LRU_NONE)
        return;
    size_t *head = &e->lru[s->lru].head, *tail = &e->lru[s->lru].tail;
    if (s->lprev != SL_NONE)
        e->slots[s->lprev].lnext = s->lnext;
    else
        *head = s->lnext;
    if (s->lnext != SL_NONE)
        e->slots[s->lnext].lprev = s->lprev;
    else
        *tail = s->lprev;
    s->lprev = s->lnext = SL_NONE;
    s->lru = SL_LRU_NONE;
}

/* Puts slot i on list at the tail (the most recently used)... */
static void lru_push(sl_engine *e, size_t i, int list)
{
    sl_slot *s = &e->slots[i];
    lru_remove(e, i);
    s->lru = (uint8_t)list;
    s->lnext = SL_NONE;
    s->lprev = e->lru[list].tail;
    if (s->lprev != SL_NONE)
        e->slots[s->lprev].lnext = i;
    else
        e->lru[list].head = i;
    e->lru[list].tail = i;
}

/* ...or at the head: the first to be evicted. */
static void lru_push_front(sl_engine *e, size_t i, int list)
{
    sl_slot *s = &e->slots[i];
    lru_remove(e, i);
    s->lru = (uint8_t)list;
    s->lprev = SL_NONE;
    s->lnext = e->lru[list].head;
    if (s->lnext != SL_NONE)
        e->slots[s->lnext].lprev = i;
    else
        e->lru[list].tail = i;
    e->lru[list].head = i;
}

/* Puts a READY slot that nothing holds any more on its LRU list. */
static void unhold(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (s->refs || s->pins || s->state != SL_SLOT_READY || s->lru != SL_LRU_NONE ||
        e->ix->tensors[i].nbytes == 0)
        return;
    if (s->spent)
        /* A stream reads each tensor once: make its buffer the first that
         * room is taken from (the head of the cached list). */
        lru_push_front(e, i, SL_LRU_CACHED);
    else if (!s->consumed && e->plan_pos[i] == SL_NONE)
        /* Unused, and a hinted plan does not name it: read ahead for an
         * earlier plan, landed after the hint that replaced it (or a
         * stream's, stopped before delivering it). As
         * sl_slots_age_prefetched does at the hint: the first room taken;
         * kept as read-ahead, it would hold room that the plan's
         * read-ahead may never take. */
        lru_push_front(e, i, SL_LRU_CACHED);
    else
        lru_push(e, i, s->consumed ? SL_LRU_CACHED : SL_LRU_PREFETCHED);
}

void sl_slot_take(sl_engine *e, size_t i, int by_stream)
{
    sl_slot *s = &e->slots[i];
    s->refs++;
    s->consumed = 1;
    s->spent = (uint8_t)by_stream;
    lru_remove(e, i);
}

void sl_slot_put(sl_engine *e, size_t i)
{
    e->slots[i].refs--;
    unhold(e, i);
}

void sl_slot_pin(sl_engine *e, size_t i)
{
    e->slots[i].pins++;
    lru_remove(e, i);
}

void sl_slot_unpin(sl_engine *e, size_t i)
{
    e->slots[i].pins--;
    unhold(e, i);
}

/* A cached tensor the plan wants again becomes read-ahead, in the plan's
 * order among the rest: a demand evicts the newest read-ahead (evict_one),
 * which must stay the one the plan wants last, not the one its walk
 * passed last (after a hint or an acquire further back, the walk passes
 * tensors the plan wants before what it read ahead already). */
void sl_slot_keep(sl_engine *e, size_t i)
{
    if (e->slots[i].lru != SL_LRU_CACHED)
        return;
    size_t pos = e->plan_pos[i], after, h = e->last_kept;
    e->last_kept = i;
    if (h < e->n && h != i && e->slots[h].lru == SL_LRU_PREFETCHED && e->plan_pos[h] != SL_NONE &&
        e->plan_pos[h] <= pos) {
        /* the walk goes forward: on from the one it kept last */
        after = h;
        for (size_t nx; (nx = e->slots[after].lnext) != SL_NONE &&
                        e->plan_pos[nx] != SL_NONE && e->plan_pos[nx] <= pos;)
            after = nx;
    } else {
        after = e->lru[SL_LRU_PREFETCHED].tail;
        while (after != SL_NONE && e->plan_pos[after] != SL_NONE && e->plan_pos[after] > pos)
            after = e->slots[after].lprev;
    }
    if (after == SL_NONE) {
        lru_push_front(e, i, SL_LRU_PREFETCHED);
        return;
    }
    sl_slot *s = &e->slots[i];
    lru_remove(e, i);
    s->lru = SL_LRU_PREFETCHED;
    s->lprev = after;
    s->lnext = e->slots[after].lnext;
    if (s->lnext != SL_NONE)
        e->slots[s->lnext].lprev = i;
    else
        e->lru[SL_LRU_PREFETCHED].tail = i;
    e->slots[after].lnext = i;
}

/* After a new hint: what the old plan read ahead and the new one does not
 * name goes to the head of the cached list (the first room taken). What
 * the new plan names stays read-ahead: speculative reads never evict it,
 * so a hint repeated does not evict its own read-ahead to read it again.
 * It is put in the new plan's order: a demand takes its room from the
 * newest read-ahead (evict_one), which must be the one the plan wants
 * last, not the one the old plan did. */
void sl_slots_age_prefetched(sl_engine *e)
{
    for (size_t i = e->lru[SL_LRU_PREFETCHED].tail, prev; i != SL_NONE; i = prev) {
        prev = e->slots[i].lprev;
        if (e->plan_pos[i] == SL_NONE)
            lru_push_front(e, i, SL_LRU_CACHED);
    }
    if (e->lru[SL_LRU_PREFETCHED].head == SL_NONE)
        return;
    for (size_t k = 0; k < e->plan_n; k++) {
        size_t i = e->plan[k];
        if (e->plan_pos[i] == k && e->slots[i].lru == SL_LRU_PREFETCHED)
            lru_push(e, i, SL_LRU_PREFETCHED);
    }
}

/* ---------------------------------------------------------------- partial queue */

/* Started slots with chunks left to issue; the scheduler issues them. */
void sl_slot_partial_push(sl_engine *e, size_t i, int front)
{
    sl_slot *s = &e->slots[i];
    if (s->in_partial)
        return;
    s->in_partial = 1;
    if (front || e->pq_head == SL_NONE) {
        s->pnext = e->pq_head;
        e->pq_head = i;
        if (e->pq_tail == SL_NONE)
            e->pq_tail = i;
    } else {
        s->pnext = SL_NONE;
        e->slots[e->pq_tail].pnext = i;
        e->pq_tail = i;
    }
}

void sl_slot_partial_pop(sl_engine *e)
{
    sl_slot *s = &e->slots[e->pq_head];
    e->pq_head = s->pnext;
    if (e->pq_head == SL_NONE)
        e->pq_tail = SL_NONE;
    s->in_partial = 0;
}

/* ---------------------------------------------------------------- eviction */

/* READY, unheld -> IDLE: the buffer goes back to the pool. */
static void evict(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    lru_remove(e, i);
    sl_pool_free(e->pool, s->blk);
    s->blk = NULL;
    s->buf = NULL;
    s->data = NULL;
    s->state = SL_SLOT_IDLE;
    s->consumed = 0;
    s->spent = 0;
    s->has_digest = 0;
    e->st.evictions++;
}

void sl_slots_evict_unheld(sl_engine *e)
{
    for (int l = SL_LRU_CACHED; l <= SL_LRU_PREFETCHED; l++)
        while (e->lru[l].head != SL_NONE)
            evict(e, e->lru[l].head);
}

/* Frees one unheld buffer: the least recently used of those handed out,
 * else (for demand) the newest read-ahead, the one wanted last. Demand
 * that takes room from the read-ahead pauses the plan's read-ahead until
 * the next acquire along the plan (or hint): the pool cannot hold both,
 * and read-ahead would fill the room again as soon as the demand gives it
 * back (a vocab part, released, then the next part), for the next demand
 * to evict it unused. */
static int evict_one(sl_engine *e, int room)
{
    if (e->lru[SL_LRU_CACHED].head != SL_NONE) {
        evict(e, e->lru[SL_LRU_CACHED].head);
        return 1;
    }
    if (room == SL_ROOM_ANY && e->lru[SL_LRU_PREFETCHED].tail != SL_NONE) {
        evict(e, e->lru[SL_LRU_PREFETCHED].tail);
        e->plan_active = 0;
        return 1;
    }
    return 0;
}

/* A buffer's owner is a slot, or SL_NONE: a part handle's, never evictable. */
static int evictable_any(void *ctx, size_t owner)
{
    const sl_engine *e = ctx;
    return owner < e->n && e->slots[owner].lru != SL_LRU_NONE;
}

static int evictable_cached(void *ctx, size_t owner)
{
    const sl_engine *e = ctx;
    return owner < e->n && e->slots[owner].lru == SL_LRU_CACHED;
}

/* Why `what` (a buffer of span bytes aligned to align) got no
 * room: held buffers split what is free or evictable, or hold it all. */
static void room_error(sl_engine *e, const char *what, uint64_t span, uint64_t align,
                       sl_err *err)
{
    uint64_t cap = sl_pool_capacity(e->pool), used = sl_pool_in_use(e->pool);
    uint64_t evictable = 0;
    for (int l = SL_LRU_CACHED; l <= SL_LRU_PREFETCHED; l++)
        for (size_t k = e->lru[l].head; k != SL_NONE; k = e->slots[k].lnext)
            evictable += e->slots[k].span;
    if (cap - used + evictable >= round_up(span, SL_POOL_ALIGN)) {
        uint64_t room = sl_pool_largest_room(e->pool, align, evictable_any, e);
        sl_fail(err, SLUICE_E_POOL_EXHAUSTED,
                "%s cannot be placed: the pool "
                "(pool_bytes %llu) has %llu bytes free or evictable, but buffers held by "
                "live handles split them: the largest range that can be made is %llu bytes; "
                "release handles, or give a pool of at least twice the largest tensor",
                what, (unsigned long long)e->st.pool_bytes,
                (unsigned long long)(cap - used + evictable), (unsigned long long)room);
        return;
    }
    sl_fail(err, SLUICE_E_POOL_EXHAUSTED,
            "%s cannot be loaded: the pool "
            "(pool_bytes %llu) is held by live handles (%llu bytes in use, none in flight, "
            "none evictable), and only their release can make room",
            what, (unsigned long long)e->st.pool_bytes, (unsigned long long)(used - evictable));
}

void sl_slot_room_error(sl_engine *e, size_t i, sl_err *err)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    char q[SL_QUOTE_MAX], what[SL_QUOTE_MAX + 1024];
    int direct = sl_slot_would_be_direct(e, i);
    uint64_t a0, span;
    load_range(e, i, direct, &a0, &span);
    snprintf(what, sizeof what, "tensor %s (%llu bytes, file %s, offset %llu)",
             sl_quote(q, sizeof q, t->name, t->name_len), (unsigned long long)t->nbytes, t->file,
             (unsigned long long)t->offset);
    room_error(e, what, span, direct ? SL_DIRECT_ALIGN : SL_POOL_ALIGN, err);
}

void sl_slot_part_room_error(sl_engine *e, const char *what, uint64_t len, sl_err *err)
{
    room_error(e, what, len, SL_POOL_ALIGN, err);
}

/* ---------------------------------------------------------------- errors */

/* "primary, direct: the proxy failed (why)" (or the mirror's label). */
void sl_slot_proxy_note(sl_engine *e, size_t i, const char *why)
{
    sl_slot *s = &e->slots[i];
    if (s->px_note)
        return;     /* the first failure says it */
    char label[512];
    sl_source_label(e, s->source, label, sizeof label);
    size_t cap = strlen(label) + strlen(why) + 48;
    if ((s->px_note = malloc(cap)))
        snprintf(s->px_note, cap, "%s, direct: the proxy failed (%s)", label, why);
}

static void keep_error(sl_slot *s, const sl_err *err)
{
    free(s->err_msg);
    s->err_msg = strdup(err->msg);
    s->err_code = err->code;
}

int sl_slot_failure(const sl_slot *s, sl_err *err)
{
    return sl_fail(err, s->err_code ? s->err_code : SLUICE_E_IO, "%s",
                   s->err_msg ? s->err_msg : "tensor failed (no memory for the detail)");
}

void sl_slot_fail_idle(sl_engine *e, size_t i, const sl_err *err)
{
    keep_error(&e->slots[i], err);
    e->slots[i].gen++;
    e->st.failures++;
    pthread_cond_broadcast(&e->cv);
}

/* ---------------------------------------------------------------- loading */

/* A buffer of span bytes aligned to align, evicting unheld buffers as
 * room allows (SL_ROOM_ANY: read-ahead too). 1 with *buf and *blk (owner
 * SL_NONE), 0 when there is no room (nothing evicted then, when eviction
 * could not place it), -1 when out of memory. Lock held. */
static int take_room(sl_engine *e, uint64_t span, uint64_t align, int room, unsigned char **out,
                     sl_pool_blk **blk)
{
    /* Descriptors first: out of memory must not pass for "no room" (that
     * would evict for nothing, then report POOL_EXHAUSTED). */
    if (sl_pool_reserve(e->pool) < 0)
        return -1;
    /* Fresh pages cost a fault each, on these machines more than reading
     * the bytes: before the buffer grows into untouched memory, reuse what
     * streams have already delivered and released. */
    unsigned char *buf = sl_pool_alloc_below(e->pool, span, align, sl_pool_frontier(e->pool), blk);
    /* Evict nothing for a buffer that eviction cannot place: live
     * buffers may split the arena so that no range is large enough. */
    if (!buf && sl_pool_largest_room(e->pool, align, room == SL_ROOM_ANY ? evictable_any
                                     : evictable_cached, e) < round_up(span, SL_POOL_ALIGN))
        return 0;
    while (!buf && e->lru[SL_LRU_CACHED].head != SL_NONE && e->slots[e->lru[SL_LRU_CACHED].head].spent) {
        evict(e, e->lru[SL_LRU_CACHED].head);
        buf = sl_pool_alloc_below(e->pool, span, align, sl_pool_frontier(e->pool), blk);
    }
    while (!buf && !(buf = sl_pool_alloc(e->pool, span, align, blk)))
        if (!evict_one(e, room))
            return 0;
    sl_pool_set_owner(*blk, SL_NONE);
    *out = buf;
    return 1;
}

int sl_slot_part_room(sl_engine *e, uint64_t len, void **buf, sl_pool_blk **blk)
{
    unsigned char *b = NULL;
    int got = take_room(e, len, SL_POOL_ALIGN, SL_ROOM_ANY, &b, blk);
    *buf = b;
    return got;
}

int sl_slot_start(sl_engine *e, size_t i, int room, int probe)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    /* Before the job is made: the memo may have to hash after all. */
    unsigned source = e->cache ? sl_ecache_before_start(e, i, probe) : 0;
    int direct = sl_slot_would_be_direct(e, i);
    uint64_t a0, span, chunk = direct ? round_up(e->chunk, SL_DIRECT_ALIGN) : e->chunk;
    load_range(e, i, direct, &a0, &span);
    uint64_t align = direct ? SL_DIRECT_ALIGN : SL_POOL_ALIGN;
    sl_pool_blk *blk;
    unsigned char *buf;
    int got = take_room(e, span, align, room, &buf, &blk);
    if (got <= 0)
        return got;
    sl_pool_set_owner(blk, i);
    uint64_t nchunks = (span + chunk - 1) / chunk, delta = t->offset - a0;
    uint64_t *bits = NULL;
    sl_hash_job *job = NULL;
    if (nchunks > 64 && !(bits = calloc((size_t)(nchunks + 63) / 64, sizeof *bits)))
        goto nomem;
    /* A job hashes the bytes as they land; one without a digest moves
     * O_DIRECT bytes to an aligned start off the completion thread. */
    if ((s->hashed || (direct && (delta & (SL_POOL_ALIGN - 1)))) &&
        (!e->hasher || sl_hash_job_create(e->hasher, buf + delta, t->nbytes, s->hashed,
                                          sl_expected_chunks(e, i) ? sl_expected_chunks(e, i)->bytes : 0,
                                          (void *)(uintptr_t)i, &job) < 0))
        goto nomem;
    s->done_word = 0;
    s->done_bits = bits;
    s->job = job;
    s->job_busy = 0;
    s->blk = blk;
    s->buf = buf;
    s->data = NULL;
    s->delta = delta;
    s->span = span;
    s->chunk = chunk;
    s->direct = (uint8_t)direct;
    s->nchunks = (uint32_t)nchunks;
    s->issued = s->done = s->inflight = s->prefix = 0;
    s->consumed = s->has_digest = 0;
    s->source = (uint8_t)source;
    s->src_file = i;    /* a blob: the tensor's own, from its first byte */
    s->src_off = 0;
    s->fb_wait = 0;
    free(s->fb_log);
    free(s->fb_note);
    s->fb_log = s->fb_note = NULL;
    free(s->px_note);
    s->px_note = NULL;
    s->px_direct = s->px_used = 0;
    s->state = SL_SLOT_READING;
    e->loading_bytes += span;
    if (e->cache)
        sl_ecache_started(e, i, source);
    sl_pause_point(e, SL_PAUSE_LOAD_STARTED);
    return 1;

nomem:
    free(bits);
    sl_pool_free(e->pool, blk);
    return -1;
}

void sl_slot_issued(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    s->issued++;
    s->inflight++;
}

/* The end of a load, either way: the chunk map and the job go. */
static void end_load(sl_engine *e, sl_slot *s)
{
    free(s->done_bits);
    s->done_bits = NULL;
    sl_hash_job_free(s->job);
    s->job = NULL;
    e->loading_bytes -= s->span;
}

static void become_ready(sl_engine *e, size_t i, const unsigned char *data)
{
    sl_slot *s = &e->slots[i];
    end_load(e, s);
    if (e->cache)
        sl_ecache_ready(e, i);
    if (s->source)
        sl_fallback_delivered(e, i);
    s->data = data;
    s->state = SL_SLOT_READY;
    e->st.tensors_loaded++;
    sl_metrics_observe(&e->met, SL_H_TENSOR_SIZE, e->ix->tensors[i].nbytes);
    unhold(e, i);
    pthread_cond_broadcast(&e->cv);
}

/* Slot i (FAILED, drained) failed verification: when the remote source
 * says so (sl_source_direct_again: its bytes came through the proxy, and
 * it was not read directly yet), the same source loads it again, its
 * requests sent with no_proxy (sched.c), before any mirror. Returns 1
 * then, else 0. */
static int direct_again(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (e->closing)
        return 0;
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    size_t file = s->source ? s->src_file : t->file_index;
    uint64_t off = s->source ? s->src_off : t->offset;
    if (!sl_source_direct_again(e->have_rcfg ? &e->rcfg : NULL, sl_read_file(e, s->source, file),
                                s->err_code, s->px_used, s->px_direct))
        return 0;
    char why[600];
    snprintf(why, sizeof why, "its bytes failed verification: %.500s",
             s->err_msg ? s->err_msg : "checksum");
    free(s->px_note);
    s->px_note = NULL;
    sl_slot_proxy_note(e, i, why);
    if (sl_slot_restart(e, i, s->source, file, off) < 0)
        return 0;
    e->st.proxy_failures++;
    s->px_direct = 1;
    s->px_used = 0;
    return 1;
}

/* Acts on fallback.c's answer d for slot i: 1 when a mirror took the
 * load over (restarted from it, or waiting for it to open), 0 when none
 * did (the slot's error then names every source's failure when d says
 * so). */
static int take_over(sl_engine *e, size_t i, int d, sl_fb_next *nx)
{
    while (d == SL_FB_RESTART) {
        if (sl_slot_restart(e, i, nx->source, nx->file, nx->off) > 0)
            return 1;
        d = sl_fallback_no_memory(e, i, nx);
    }
    if (d == SL_FB_WAIT)
        return 1;
    if (d == SL_FB_FAILED && nx->msg) {
        sl_err err;
        sl_fail(&err, nx->code, "%s", nx->msg);
        keep_error(&e->slots[i], &err);
    }
    free(nx->msg);
    nx->msg = NULL;
    return 0;
}

void sl_slot_resume(sl_engine *e, size_t i)
{
    sl_fb_next nx = {0};
    e->slots[i].fb_wait = 0;
    if (e->closing || !take_over(e, i, sl_fallback_resume(e, i, &nx), &nx))
        sl_slot_fail_drained(e, i);
}

/* FAILED -> IDLE once nothing works on the buffer any more, unless the
 * origin directly (its proxy's bytes failed) or a mirror (fallback.c)
 * takes the load over. */
static void drain(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (s->state != SL_SLOT_FAILED || s->inflight || s->job_busy || s->fb_wait)
        return;
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    if (s->source == SL_SRC_CACHE && sl_ecache_refetch(e, i) &&
        sl_slot_restart(e, i, 0, t->file_index, t->offset) > 0)
        return;
    if (direct_again(e, i))
        return;
    sl_fb_next nx;
    if (e->nmirrors && take_over(e, i, sl_fallback_next(e, i, &nx), &nx))
        return;
    sl_slot_fail_drained(e, i);
}

void sl_slot_fail_drained(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    end_load(e, s);
    sl_pool_free(e->pool, s->blk);
    s->blk = NULL;
    s->buf = NULL;
    s->data = NULL;
    s->state = SL_SLOT_IDLE;
    s->gen++;
    e->st.failures++;
    pthread_cond_broadcast(&e->cv);
}

int sl_slot_restart(sl_engine *e, size_t i, unsigned source, size_t file, uint64_t off)
{
    sl_slot *s = &e->slots[i];
    uint64_t nbytes = e->ix->tensors[i].nbytes, chunk = e->chunk;
    uint64_t nchunks = (nbytes + chunk - 1) / chunk;
    uint64_t *bits = NULL;
    sl_hash_job *job = NULL;
    if (nchunks > 64 && !(bits = calloc((size_t)(nchunks + 63) / 64, sizeof *bits)))
        return -1;
    /* Always hashed: only a tensor with a digest to match goes to a mirror. */
    const sl_chunk_digests *chunks = sl_expected_chunks(e, i);
    if (!e->hasher || sl_hash_job_create(e->hasher, s->buf, nbytes, 1, chunks ? chunks->bytes : 0,
                                         (void *)(uintptr_t)i, &job) < 0) {
        free(bits);
        return -1;
    }
    free(s->done_bits);
    s->done_bits = bits;
    s->done_word = 0;
    sl_hash_job_free(s->job);
    s->job = job;
    s->job_busy = 0;
    /* The mirror's bytes land at the buffer's start, unaligned reads. */
    e->loading_bytes -= s->span;
    s->span = nbytes;
    e->loading_bytes += s->span;
    s->delta = 0;
    s->direct = 0;
    s->chunk = chunk;
    s->nchunks = (uint32_t)nchunks;
    s->issued = s->done = s->inflight = s->prefix = 0;
    s->hashed = 1;
    s->source = (uint8_t)source;
    s->src_file = file;
    s->src_off = off;
    s->fb_wait = 0;
    s->state = SL_SLOT_READING;
    sl_slot_partial_push(e, i, 1);
    return 1;
}

/* READING or HASHING -> FAILED: the error is kept for the waiters. */
static void fail_load(sl_engine *e, size_t i, const sl_err *err)
{
    sl_slot *s = &e->slots[i];
    keep_error(s, err);
    s->state = SL_SLOT_FAILED;
    if (s->job && !s->job_busy && !sl_hash_job_cancel(e->hasher, s->job))
        s->job_busy = 1;    /* a worker holds it: its completion says when */
    drain(e, i);
}

void sl_slot_landed(sl_engine *e, size_t i, uint32_t c, const sl_err *failure)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    s->inflight--;
    if (s->state != SL_SLOT_READING) {
        drain(e, i);
        return;
    }
    if (failure) {
        fail_load(e, i, failure);
        return;
    }
    chunk_set_done(s, c);
    s->done++;
    while (s->prefix < s->nchunks && chunk_done(s, s->prefix))
        s->prefix++;
    if (s->job && s->hashed) {
        /* The tensor's bytes among the chunks landed in order (an O_DIRECT
         * span has bytes of its neighbours around the tensor). */
        uint64_t end = (uint64_t)s->prefix * s->chunk;
        if (end > s->span)
            end = s->span;
        uint64_t ready = end > s->delta ? end - s->delta : 0;
        sl_hash_job_ready(e->hasher, s->job, ready < t->nbytes ? ready : t->nbytes);
    }
    if (s->done < s->nchunks)
        return;
    /* A tensor the memo spares hashing: its file must still be the one
     * the memo vouched for now that the bytes are in, or a write since
     * the load started would go out unverified. */
    if (!s->hashed && e->memo && sl_ecache_memo_stale(e, i)) {
        if (sl_slot_restart(e, i, 0, t->file_index, t->offset) > 0)
            return;
        /* never handed out unverified: no memory to read it again */
        char q[SL_QUOTE_MAX];
        sl_err err;
        sl_fail(&err, SLUICE_E_NOMEM, "tensor %s (file %s): its file changed while it was "
                "read, and there is no memory to read it again, hashed",
                sl_quote(q, sizeof q, t->name, t->name_len), t->file);
        fail_load(e, i, &err);
        return;
    }
    if (!s->job) {
        become_ready(e, i, s->buf + s->delta);
        return;
    }
    s->state = SL_SLOT_HASHING;
    sl_hash_job_ready(e->hasher, s->job, t->nbytes);
}

/* ---------------------------------------------------------------- the hash verdict */

enum { VERDICT_OK, VERDICT_OK_MOVED, VERDICT_QUIET, VERDICT_NOMEM, VERDICT_MISMATCH };

int sl_slot_verdict_ok(int verdict)
{
    return verdict == VERDICT_OK || verdict == VERDICT_OK_MOVED;
}

int sl_slot_check(sl_engine *e, size_t i, int status)
{
    if (status == SL_HASH_CANCELLED)
        return VERDICT_QUIET;
    if (status != SLUICE_OK)
        return VERDICT_NOMEM;
    /* HASHING: nothing else touches the slot until the verdict is in. */
    sl_slot *s = &e->slots[i];
    const unsigned char *want = sl_expected_digest(e, i);
    const sl_chunk_digests *chunks = s->hashed ? sl_expected_chunks(e, i) : NULL;
    if (chunks) {
        /* Every chunk must match; the whole digest then is the manifest's
         * (the bytes are the ones its chunks describe). */
        s->bad_chunk = 0;
        if (sl_hash_job_pieces(s->job) != chunks->count)
            return VERDICT_MISMATCH; /* cannot be: the job was cut by these chunks */
        for (uint32_t k = 0; k < chunks->count; k++)
            if (memcmp(sl_hash_job_piece_digest(s->job, k), chunks->digest[k], 32) != 0) {
                s->bad_chunk = k;
                return VERDICT_MISMATCH;
            }
    } else if (s->hashed && want && memcmp(sl_hash_job_digest(s->job), want, 32) != 0) {
        return VERDICT_MISMATCH;
    }
    unsigned char *data = s->buf + s->delta;
    if (((uintptr_t)data & (SL_POOL_ALIGN - 1)) == 0)
        return VERDICT_OK;
    /* O_DIRECT put the tensor at its file offset modulo 4096 in the span;
     * move it to the buffer's start so the handle is 64-byte aligned.
     * The moved bytes are the hashed ones. */
    memmove(s->buf, data, (size_t)e->ix->tensors[i].nbytes);
    return VERDICT_OK_MOVED;
}

int sl_slot_checksum_error(sl_engine *e, size_t i, const unsigned char got[32], sl_err *err)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    const sl_slot *s = &e->slots[i];
    char q[SL_QUOTE_MAX], hw[65], hg[65];
    e->st.checksum_failures++;
    /* a load from a mirror names the mirror's file */
    const char *file = s->source ? sl_read_file(e, s->source, s->src_file)->path : t->file;
    uint64_t offset = s->source ? s->src_off : t->offset;
    const sl_chunk_digests *chunks = t->nbytes ? sl_expected_chunks(e, i) : NULL;
    if (chunks) {
        uint32_t k = e->slots[i].bad_chunk;
        uint64_t lo = (uint64_t)k * chunks->bytes;
        uint64_t hi = lo + chunks->bytes < t->nbytes ? lo + chunks->bytes : t->nbytes;
        return sl_fail(err, SLUICE_E_CHECKSUM,
                       "tensor %s (file %s, offset %llu, %llu bytes): %s mismatch in chunk %u "
                       "of %u (tensor bytes %llu..%llu): expected %s, actual %s",
                       sl_quote(q, sizeof q, t->name, t->name_len), file,
                       (unsigned long long)offset, (unsigned long long)t->nbytes,
                       sl_md_title(e->alg), k, chunks->count, (unsigned long long)lo,
                       (unsigned long long)hi, sl_hex_digest(hw, chunks->digest[k]),
                       sl_hex_digest(hg, got));
    }
    return sl_fail(err, SLUICE_E_CHECKSUM,
                   "tensor %s (file %s, offset %llu, %llu bytes): %s mismatch: "
                   "expected %s, actual %s",
                   sl_quote(q, sizeof q, t->name, t->name_len), file,
                   (unsigned long long)offset, (unsigned long long)t->nbytes,
                   sl_md_title(e->alg),
                   sl_hex_digest(hw, sl_expected_digest(e, i)), sl_hex_digest(hg, got));
}

void sl_slot_hashed(sl_engine *e, size_t i, int verdict)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    /* The completion is the job's last word: it goes now. */
    unsigned char got[32];
    const sl_chunk_digests *chunks = sl_expected_chunks(e, i);
    /* Chunked: the digest that failed, or (all matched) the manifest's. */
    if (chunks && verdict == VERDICT_MISMATCH && s->bad_chunk < sl_hash_job_pieces(s->job))
        memcpy(got, sl_hash_job_piece_digest(s->job, s->bad_chunk), 32);
    else
        memcpy(got, chunks ? sl_expected_digest(e, i) : sl_hash_job_digest(s->job), 32);
    if (s->hashed && s->state == SL_SLOT_HASHING) {
        if (chunks) {
            if (verdict == VERDICT_OK || verdict == VERDICT_OK_MOVED)
                e->st.chunks_verified += chunks->count;
            unsigned peak = sl_hash_job_parallel_peak(s->job);
            if (peak > e->st.hash_parallel_peak)
                e->st.hash_parallel_peak = peak;
        }
        e->st.bytes_hashed += sl_hash_job_hashed(s->job);
        sl_metrics_observe(&e->met, SL_H_HASH, sl_hash_job_busy_ns(s->job));
    }
    sl_hash_job_free(s->job);
    s->job = NULL;
    s->job_busy = 0;
    if (s->state == SL_SLOT_FAILED) {
        drain(e, i);    /* the job of a failed load is quiet now */
        return;
    }
    char q[SL_QUOTE_MAX];
    sl_err err;
    sl_quote(q, sizeof q, t->name, t->name_len);
    if (verdict == VERDICT_NOMEM || verdict == VERDICT_QUIET) {
        sl_fail(&err, SLUICE_E_NOMEM, "tensor %s (file %s): %s failed (OpenSSL)", q, t->file,
                sl_md_title(e->alg));
        fail_load(e, i, &err);
        return;
    }
    const unsigned char *want = sl_expected_digest(e, i);
    if (verdict == VERDICT_MISMATCH) {
        sl_slot_checksum_error(e, i, got, &err);
        fail_load(e, i, &err);
        return;
    }
    if (s->hashed) {
        memcpy(s->digest, got, 32);
        s->has_digest = 1;
    }
    if (want && s->hashed)
        e->st.tensors_verified++;
    become_ready(e, i, verdict == VERDICT_OK_MOVED ? s->buf : s->buf + s->delta);
}
