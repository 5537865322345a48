/* stream.c: streams, the fastest path (sluice_stream, sluice_stream_ex):
 * one caller reads a list of tensors (or all) through the pump's
 * read-ahead and gets each as soon as it is ready, in completion order
 * (see engine_int.h, sched.c).
 *
 * A stream pins the positions it has started ([lo, hi) of its list) so
 * that nothing evicts them before delivery; pins become handles when
 * delivered. Its first undelivered tensor is always a demand (sched.c),
 * so it progresses, or learns POOL_EXHAUSTED, whatever else runs. The
 * callbacks run on the caller's thread, in batches, with the lock
 * dropped, never two at once for one stream.
 */
#include "engine/engine_int.h"

#include "base/cancel.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STREAM_BATCH 16

typedef struct delivery {
    sluice_tensor *t;
    int status;
    size_t index;
    char *msg;
} delivery;

/* Takes what is ready among the stream's pinned positions. Lock held. */
static int collect(sl_engine *e, sl_stream *st, delivery *out)
{
    int k = 0;
    for (size_t pos = st->lo; pos < st->hi && k < STREAM_BATCH; pos++) {
        uint8_t ps = st->pstate[pos];
        size_t i = st->ids[pos];
        sl_slot *s = &e->slots[i];
        sl_err err = {0};
        delivery *d = &out[k];
        d->t = NULL;
        d->index = i;
        d->msg = NULL;
        if (ps == SL_POS_TOO_LARGE) {
            e->st.failures++;
            d->status = sl_slot_too_large_error(e, i, &err);
        } else if (ps == SL_POS_REFUSED) {
            e->st.failures++;
            const struct sluice_tensor_info *t = &e->ix->tensors[i];
            char q[SL_QUOTE_MAX];
            d->status = sl_fail(&err, SLUICE_E_POOL_EXHAUSTED,
                                "tensor %s (%llu bytes) cannot be loaded by a stream run from "
                                "a stream callback: the room it needs is held by the calling "
                                "stream, which gives it back only when its callback returns",
                                sl_quote(q, sizeof q, t->name, t->name_len),
                                (unsigned long long)t->nbytes);
        } else if (ps != SL_POS_PINNED) {
            continue;
        } else if (s->state == SL_SLOT_READY || s->gen != st->pgen[pos]) {
            d->status = s->state == SL_SLOT_READY ? sl_grant(e, i, 1, &d->t, &err)
                                                  : sl_slot_failure(s, &err);
            st->pinned--;
            st->pinned_bytes -= e->ix->tensors[i].nbytes;
            sl_slot_unpin(e, i);
            sl_demand_drop_if_unwanted(e, i);
        } else {
            continue;
        }
        if (d->status < 0 && !(d->msg = strdup(err.msg)))
            d->msg = NULL;
        st->pstate[pos] = SL_POS_DONE;
        k++;
    }
    while (st->lo < st->hi && st->pstate[st->lo] == SL_POS_DONE)
        st->lo++;
    return k;
}

/* Calls the progress callback when its interval has passed, or always
 * when final. Lock not held. */
static void report_progress(sl_stream *st, int final)
{
    if (!st->progress)
        return;
    uint64_t now = sl_now_ns();
    if (!final && now - st->progress_last_ns < st->progress_every_ns)
        return;
    st->progress_last_ns = now;
    struct sluice_stream_progress p = {
        .size = sizeof p,
        .tensors_done = st->done,
        .tensors_total = st->n,
        .bytes_done = st->bytes_done,
        .bytes_total = st->bytes_total,
    };
    st->progress(st->progress_user, &p);
}

static void wake_engine(void *ctx)
{
    sl_engine *e = ctx;
    pthread_mutex_lock(&e->lock);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->lock);
}

static int cancelled(const sl_stream *st, sl_err *err)
{
    if (!sl_cancel_requested(st->cancel))
        return 0;
    sl_fail(err, SLUICE_E_CANCELLED, "stream cancelled after %zu of %zu tensors", st->done, st->n);
    return 1;
}

static int stream_run(sl_engine *e, sl_stream *st, sluice_stream_fn fn, void *user, sl_err *err)
{
    delivery batch[STREAM_BATCH];
    int result = SLUICE_OK, first_fail = SLUICE_OK;
    sl_cancel_reg reg = {.wake = wake_engine, .ctx = e};
    sl_cancel_register(st->cancel, &reg);
    /* Run from a callback: the streams whose callbacks this thread runs
     * give nothing back until this stream returns (see sched.c). */
    int elsewhere = sl_mark_blocked_elsewhere(e, +1);
    pthread_mutex_lock(&e->lock);
    st->in_callback = sl_mark_blocked(e, +1);
    st->next = e->streams;
    e->streams = st;
    e->nstreams++;
    for (;;) {
        /* Done: leave at once. A pump now would count this stream, whose
         * thread is about to return to the callback that started it, as
         * giving nothing back. */
        if (st->lo >= st->n)
            break;
        sl_pump(e);
        int k = collect(e, st, batch);
        if (k == 0) {
            if (st->lo >= st->n)
                break;  /* every tensor delivered: a cancel now is too late */
            if (cancelled(st, err)) {
                result = SLUICE_E_CANCELLED;
                break;
            }
            sl_wait(e);
            continue;
        }
        sl_frame frame;
        st->delivering = 1;
        sl_frame_push(&frame, e, st);
        sl_unlock(e);
        for (int j = 0; j < k; j++) {
            delivery *d = &batch[j];
            const struct sluice_tensor_info *info = &e->ix->tensors[d->index];
            if (result == SLUICE_OK && cancelled(st, err))
                result = SLUICE_E_CANCELLED;
            if (result != SLUICE_OK) {
                if (d->t)
                    sl_handle_release(d->t); /* stopped: give back the rest */
            } else {
                if (d->status < 0 && first_fail == SLUICE_OK) {
                    first_fail = d->status;
                    sl_fail(err, d->status, "%s", d->msg ? d->msg : "tensor failed");
                }
                int rc = fn(user, d->t, d->status, info,
                            d->status < 0 ? (d->msg ? d->msg : "tensor failed") : NULL);
                st->done++;
                st->bytes_done += info->nbytes;
                if (rc != 0) {
                    result = rc;
                    sl_fail(err, rc, "stream stopped by its callback (returned %d) at tensor %zu",
                            rc, d->index);
                }
            }
            free(d->msg);
        }
        report_progress(st, 0);
        pthread_mutex_lock(&e->lock);
        st->delivering = 0;
        sl_frame_pop(&frame);
        if (result != SLUICE_OK)
            break;
    }
    /* Unpin what was not delivered and leave. */
    for (size_t pos = st->lo; pos < st->hi; pos++)
        if (st->pstate[pos] == SL_POS_PINNED) {
            size_t i = st->ids[pos];
            sl_slot_unpin(e, i);
            sl_demand_drop_if_unwanted(e, i);
        }
    for (sl_stream **p = &e->streams; *p; p = &(*p)->next)
        if (*p == st) {
            *p = st->next;
            break;
        }
    e->nstreams--;
    sl_mark_blocked(e, -1);
    sl_pump(e);
    sl_unlock(e);
    if (elsewhere)
        sl_mark_blocked_elsewhere(e, -1);
    sl_cancel_unregister(st->cancel, &reg);
    report_progress(st, 1);     /* the last call, always, once */
    return result != SLUICE_OK ? result : first_fail;
}

int sl_engine_stream(sl_engine *e, const size_t *ids, size_t n, sluice_stream_fn fn,
                     void *user, const sluice_stream_options *so, sl_err *err)
{
    if (!ids)
        n = e->n;
    sl_stream st = {0};
    st.ids = ids ? ids : e->order;
    st.n = n;
    st.progress = so->progress;
    st.progress_user = so->progress_user;
    st.progress_every_ns = (uint64_t)so->progress_interval_ms * 1000000u;
    st.progress_last_ns = sl_now_ns(); /* the first call comes an interval in */
    st.cancel = so->cancel;
    for (size_t k = 0; k < n; k++)
        st.bytes_total += e->ix->tensors[st.ids[k]].nbytes;
    st.pstate = calloc(n ? n : 1, 1);
    st.pgen = calloc(n ? n : 1, sizeof *st.pgen);
    uint64_t t0 = sl_metrics_now(&e->met);
    int rc = !st.pstate || !st.pgen
                 ? sl_fail(err, SLUICE_E_NOMEM, "sluice_stream: out of memory for %zu tensors", n)
                 : stream_run(e, &st, fn, user, err);
    sl_metrics_since(&e->met, SL_H_STREAM, t0);
    sl_metrics_add(&e->met, &e->met.streams, 1);
    free(st.pstate);
    free(st.pgen);
    return rc;
}
