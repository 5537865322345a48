/* fallback.c: mirrors of a model (sluice_options.fallback).
 *
 * A load that fails from the model's own files with SLUICE_E_CHECKSUM,
 * SLUICE_E_IO, SLUICE_E_FILE_CHANGED or SLUICE_E_REMOTE, for a tensor
 * the manifest gives a digest for, is not given up: once its slot is
 * drained (FAILED, no read in flight, the hash job quiet: slot.c), the
 * next mirror takes it over, into the same buffer, through the same
 * seam (local file) or remote seam (URL), hashed by the same pipeline
 * against the primary's digest. Waiters see nothing until a source
 * delivers or every one has failed; then the slot fails as usual, its
 * message naming each source's failure, its code the primary's.
 *
 * Mirrors are opened on first need, by one opener thread of the engine
 * (started then): opening reads a mirror's headers (over the network for
 * a URL), which must not run under the engine's lock nor on a thread that
 * serves reads. Meanwhile the slot waits FAILED with its buffer (fb_wait).
 * A mirror's tensor is used only when its name, dtype, shape and size are
 * the primary's. Every function here runs with e->lock held, except the
 * opener's open itself.
 *
 * This file decides and slot.c acts: slot.c, the only writer of a slot's
 * state, asks which source takes a failed load over (sl_fallback_next:
 * a mirror to restart from, one being opened, or none) and restarts or
 * fails the load itself; the opener hands the slots that waited back
 * through e->fb_opened (sched.c's sl_mirror_opened: sl_slot_resume each,
 * then the pump). Nothing here calls slot.c or sched.c.
 */
#include "engine/engine_int.h"
#include "index/header.h"
#include "sources/remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int eligible(int code)
{
    return code == SLUICE_E_CHECKSUM || code == SLUICE_E_IO || code == SLUICE_E_FILE_CHANGED ||
           code == SLUICE_E_REMOTE;
}

/* Appends "label: msg" to the slot's log of failures. */
static void log_failure(sl_slot *s, const char *label, const char *msg)
{
    size_t old = s->fb_log ? strlen(s->fb_log) : 0;
    size_t add = strlen(label) + strlen(msg) + 8;
    char *grown = realloc(s->fb_log, old + add);
    if (!grown)
        return;     /* the message is shorter; the failure still counts */
    snprintf(grown + old, add, "%s%s: %s", old ? "; " : "", label, msg);
    s->fb_log = grown;
}

/* Where mirror m holds tensor i, when it holds the same tensor. */
static int mirror_tensor(const sl_engine *e, size_t i, const sl_mirror *m, size_t *file,
                         uint64_t *off, char *why, size_t cap)
{
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    char q[SL_QUOTE_MAX];
    sl_quote(q, sizeof q, t->name, t->name_len);
    size_t j = sl_index_find(&m->ix, t->name, t->name_len);
    if (j == SIZE_MAX) {
        snprintf(why, cap, "no tensor %s there", q);
        return 0;
    }
    const struct sluice_tensor_info *u = &m->ix.tensors[j];
    if (!sl_tensor_same_kind(u, t)) {
        snprintf(why, cap, "its tensor %s is not the same (dtype %s, %u dimensions, %llu bytes; "
                 "here %s, %u dimensions, %llu bytes, or another shape)", q,
                 sl_dtype_name(u->dtype), (unsigned)u->ndim, (unsigned long long)u->nbytes,
                 sl_dtype_name(t->dtype), (unsigned)t->ndim, (unsigned long long)t->nbytes);
        return 0;
    }
    *file = u->file_index;
    *off = u->offset;
    return 1;
}

static void *opener_main(void *arg);

static void request_open(sl_engine *e, sl_mirror *m)
{
    if (m->state == SL_MIRROR_UNOPENED)
        m->state = SL_MIRROR_REQUESTED;
    if (!e->opener_started) {
        if (pthread_create(&e->opener, NULL, opener_main, e) != 0) {
            m->state = SL_MIRROR_FAILED;
            free(m->why);
            m->why = strdup("cannot start the thread that opens mirrors");
            return;
        }
        e->opener_started = 1;
    }
    pthread_cond_broadcast(&e->opener_cv);
}

void sl_source_label(const sl_engine *e, unsigned k, char *buf, size_t cap)
{
    if (k == 0 && e->serving)
        snprintf(buf, cap, "fallback %u (%s), serving the model", e->serving,
                 e->mirrors[e->serving - 1].loc->shown);
    else if (k == 0)
        snprintf(buf, cap, "primary");
    else
        snprintf(buf, cap, "fallback %u (%s)", k, e->mirrors[k - 1].loc->shown);
}

/* Every source failed: the slot's error names them all (nx). */
static int all_failed(sl_engine *e, size_t i, sl_fb_next *nx)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    char q[SL_QUOTE_MAX];
    sl_quote(q, sizeof q, t->name, t->name_len);
    size_t cap = (s->fb_log ? strlen(s->fb_log) : 0) + SL_QUOTE_MAX + 64;
    nx->code = s->fb_code ? s->fb_code : SLUICE_E_IO;
    if ((nx->msg = malloc(cap)))
        snprintf(nx->msg, cap, "tensor %s: every source failed: %s", q, s->fb_log ? s->fb_log : "");
    free(s->fb_log);
    s->fb_log = NULL;
    s->source = 0;
    return SL_FB_FAILED;
}

/* Tries mirrors k, k + 1, ... for slot i: the one that takes it over
 * (SL_FB_RESTART), or is being opened for it (SL_FB_WAIT), or none is
 * left (SL_FB_FAILED). */
static int try_from(sl_engine *e, size_t i, unsigned k, sl_fb_next *nx)
{
    sl_slot *s = &e->slots[i];
    char label[512], why[512];
    for (; k <= e->nmirrors && !e->closing; k++) {
        sl_mirror *m = &e->mirrors[k - 1];
        sl_source_label(e, k, label, sizeof label);
        if (m->state != SL_MIRROR_OPEN && m->state != SL_MIRROR_FAILED) {
            request_open(e, m);
            if (m->state != SL_MIRROR_FAILED) {
                s->source = (uint8_t)k;
                s->fb_wait = 1;
                return SL_FB_WAIT;
            }
        }
        if (m->state == SL_MIRROR_FAILED) {
            log_failure(s, label, m->why ? m->why : "cannot be opened");
            e->st.fallback_failures++;
            continue;
        }
        if (!mirror_tensor(e, i, m, &nx->file, &nx->off, why, sizeof why)) {
            log_failure(s, label, why);
            e->st.fallback_failures++;
            continue;
        }
        nx->source = k;
        return SL_FB_RESTART;
    }
    return all_failed(e, i, nx);
}

int sl_fallback_next(sl_engine *e, size_t i, sl_fb_next *nx)
{
    sl_slot *s = &e->slots[i];
    char label[512];
    memset(nx, 0, sizeof *nx);
    sl_source_label(e, s->source, label, sizeof label);
    if (s->source == 0) {
        if (!eligible(s->err_code) || !sl_expected_digest(e, i) || e->closing)
            return SL_FB_NONE;  /* the error stands as it is */
        s->fb_code = s->err_code;
    } else {
        e->st.fallback_failures++;
    }
    log_failure(s, label, s->err_msg ? s->err_msg : "failed");
    return try_from(e, i, (unsigned)s->source + 1, nx);
}

int sl_fallback_resume(sl_engine *e, size_t i, sl_fb_next *nx)
{
    memset(nx, 0, sizeof *nx);
    return try_from(e, i, e->slots[i].source, nx);
}

int sl_fallback_no_memory(sl_engine *e, size_t i, sl_fb_next *nx)
{
    char label[512];
    unsigned k = nx->source;
    sl_source_label(e, k, label, sizeof label);
    log_failure(&e->slots[i], label, "out of memory");
    memset(nx, 0, sizeof *nx);
    return try_from(e, i, k + 1, nx);
}

void sl_fallback_delivered(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    e->st.fallback_tensors++;
    e->st.fallback_bytes += e->ix->tensors[i].nbytes;
    char label[512];
    sl_source_label(e, s->source, label, sizeof label);
    size_t cap = strlen(label) + (s->fb_log ? strlen(s->fb_log) : 0) + 32;
    free(s->fb_note);
    if ((s->fb_note = malloc(cap)))
        snprintf(s->fb_note, cap, "%s, after: %s", label, s->fb_log ? s->fb_log : "");
    free(s->fb_log);
    s->fb_log = NULL;
}

/* The opener: opens requested mirrors one at a time, then resumes the
 * slots that wait for each. */
static void *opener_main(void *arg)
{
    sl_engine *e = arg;
    pthread_mutex_lock(&e->lock);
    for (;;) {
        if (e->opener_quit)
            break;
        unsigned k = 0;
        for (unsigned j = 0; j < e->nmirrors && !k; j++)
            if (e->mirrors[j].state == SL_MIRROR_REQUESTED)
                k = j + 1;
        if (!k) {
            pthread_cond_wait(&e->opener_cv, &e->lock);
            continue;
        }
        sl_mirror *m = &e->mirrors[k - 1];
        m->state = SL_MIRROR_OPENING;
        pthread_mutex_unlock(&e->lock);
        sl_index ix;
        sl_err err = {0};
        int rc = sl_index_open_ex(&ix, m->loc, e->have_rcfg ? &e->rcfg : NULL, &err);
        pthread_mutex_lock(&e->lock);
        if (rc == SLUICE_OK) {
            m->ix = ix;
            m->state = SL_MIRROR_OPEN;
        } else {
            free(m->why);
            m->why = strdup(err.msg);
            m->state = SL_MIRROR_FAILED;
        }
        e->fb_opened(e, k);     /* sched.c's: the slots that waited go on */
        sl_unlock(e);
        pthread_mutex_lock(&e->lock);
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

void sl_engine_served_by(sl_engine *e, unsigned k, const char *const *why)
{
    pthread_mutex_lock(&e->lock);
    for (unsigned j = 0; j < k && j < e->nmirrors; j++) {
        sl_mirror *m = &e->mirrors[j];
        m->state = SL_MIRROR_FAILED;
        free(m->why);
        m->why = strdup(j + 1 == k ? "it serves the model (the model's own location could "
                                     "not be opened)"
                        : why && why[j] ? why[j] : "could not be opened");
    }
    e->serving = k <= e->nmirrors ? k : 0;
    pthread_mutex_unlock(&e->lock);
}

void sl_fallback_free(sl_engine *e)
{
    if (e->opener_started) {
        pthread_mutex_lock(&e->lock);
        e->opener_quit = 1;
        e->abort_fetch = 1;
        pthread_cond_broadcast(&e->opener_cv);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->opener, NULL);
        e->opener_started = 0;
    }
    for (unsigned k = 0; e->mirrors && k < e->nmirrors; k++) {
        sl_index_free(&e->mirrors[k].ix);
        free(e->mirrors[k].why);
    }
    free(e->mirrors);
    e->mirrors = NULL;
    e->nmirrors = 0;
}
