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

/* Every source failed: the slot's error names them all. */
static void all_failed(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    char q[SL_QUOTE_MAX];
    sl_quote(q, sizeof q, t->name, t->name_len);
    size_t cap = (s->fb_log ? strlen(s->fb_log) : 0) + SL_QUOTE_MAX + 64;
    char *msg = malloc(cap);
    if (msg) {
        snprintf(msg, cap, "tensor %s: every source failed: %s", q, s->fb_log ? s->fb_log : "");
        sl_slot_set_error(e, i, s->fb_code ? s->fb_code : SLUICE_E_IO, msg);
        free(msg);
    }
    free(s->fb_log);
    s->fb_log = NULL;
    s->source = 0;
}

/* Tries mirrors k, k + 1, ... for slot i: 1 when one took it over (or is
 * being opened for it), 0 when none is left. */
static int try_from(sl_engine *e, size_t i, unsigned k)
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
                return 1;
            }
        }
        if (m->state == SL_MIRROR_FAILED) {
            log_failure(s, label, m->why ? m->why : "cannot be opened");
            e->st.fallback_failures++;
            continue;
        }
        size_t file;
        uint64_t off;
        if (!mirror_tensor(e, i, m, &file, &off, why, sizeof why)) {
            log_failure(s, label, why);
            e->st.fallback_failures++;
            continue;
        }
        if (sl_slot_restart(e, i, k, file, off) < 0) {
            log_failure(s, label, "out of memory");
            continue;
        }
        return 1;
    }
    all_failed(e, i);
    return 0;
}

int sl_fallback_next(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    char label[512];
    sl_source_label(e, s->source, label, sizeof label);
    if (s->source == 0) {
        if (!eligible(s->err_code) || !sl_expected_digest(e, i) || e->closing)
            return 0;   /* the error stands as it is */
        s->fb_code = s->err_code;
    } else {
        e->st.fallback_failures++;
    }
    log_failure(s, label, s->err_msg ? s->err_msg : "failed");
    return try_from(e, i, (unsigned)s->source + 1);
}

int sl_fallback_proxy_bypass(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    if (!s->px_used || s->px_direct || s->err_code != SLUICE_E_CHECKSUM || e->closing ||
        s->source == SL_SRC_CACHE)
        return 0;
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    size_t file = s->source ? s->src_file : t->file_index;
    uint64_t off = s->source ? s->src_off : t->offset;
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
        for (size_t i = 0; i < e->n; i++) {
            sl_slot *s = &e->slots[i];
            if (!s->fb_wait || s->source != k)
                continue;
            s->fb_wait = 0;
            if (e->closing || !try_from(e, i, k))
                sl_slot_fail_drained(e, i);
        }
        sl_pump(e);
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
