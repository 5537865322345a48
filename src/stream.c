/* stream.c: sluice_stream, the fastest path: one caller reads a list of
 * tensors (or all) through the pump's read-ahead and gets each as soon as
 * it is ready, in completion order (see engine_int.h, sched.c).
 *
 * A stream pins the positions it has started ([lo, hi) of its list) so
 * that nothing evicts them before delivery; pins become handles when
 * delivered. Its first undelivered tensor is always a demand (sched.c),
 * so it progresses, or learns POOL_EXHAUSTED, whatever else runs. The
 * callbacks run on the caller's thread, in batches, with the lock
 * dropped, never two at once for one stream.
 */
#include "engine_int.h"

#include "model.h"

#include <stdlib.h>
#include <string.h>

static sl_engine *engine_of(sluice_model *m)
{
    return sl_model_usable(m) == SLUICE_OK ? m->engine : NULL;
}

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
            d->status = sl_too_large_error(e, i, &err);
        } else if (ps != SL_POS_PINNED) {
            continue;
        } else if (s->state == SL_READY || s->gen != st->pgen[pos]) {
            d->status = s->state == SL_READY ? sl_grant(e, i, &d->t, &err) : sl_slot_failure(s, &err);
            if (d->status == SLUICE_OK)
                s->spent = 1;
            s->pins--;
            st->pinned--;
            st->pinned_bytes -= e->ix->tensors[i].nbytes;
            sl_unhold(e, i);
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

static int stream_run(sluice_model *m, sl_engine *e, sl_stream *st, sluice_stream_fn fn,
                      void *user, sl_err *err)
{
    delivery batch[STREAM_BATCH];
    int result = SLUICE_OK, first_fail = SLUICE_OK;
    pthread_mutex_lock(&e->lock);
    st->next = e->streams;
    e->streams = st;
    e->nstreams++;
    for (;;) {
        sl_pump(e);
        int k = collect(e, st, batch);
        if (k == 0) {
            if (st->lo >= st->n)
                break;
            /* a stream run from another stream's callback: see sched.c */
            if (st->pstate[st->lo] == SL_POS_PINNED && sl_fail_if_only_self(e, st->ids[st->lo]))
                continue;
            sl_wait(e);
            continue;
        }
        st->delivering = 1;
        st->deliverer = pthread_self();
        sl_unlock(e);
        for (int j = 0; j < k; j++) {
            delivery *d = &batch[j];
            const struct sluice_tensor_info *info = &e->ix->tensors[d->index];
            if (result != SLUICE_OK) {
                sluice_release(d->t);   /* stopped: give back the rest */
            } else {
                if (d->status < 0 && first_fail == SLUICE_OK) {
                    first_fail = d->status;
                    sl_fail(err, d->status, "%s", d->msg ? d->msg : "tensor failed");
                }
                int rc = fn(user, d->t, d->status, info,
                            d->status < 0 ? (d->msg ? d->msg : "tensor failed") : NULL);
                if (rc != 0) {
                    result = rc;
                    sl_fail(err, rc, "stream stopped by its callback (returned %d) at tensor %zu",
                            rc, d->index);
                }
            }
            free(d->msg);
        }
        pthread_mutex_lock(&e->lock);
        st->delivering = 0;
        if (result != SLUICE_OK)
            break;
    }
    /* Unpin what was not delivered and leave. */
    for (size_t pos = st->lo; pos < st->hi; pos++)
        if (st->pstate[pos] == SL_POS_PINNED) {
            e->slots[st->ids[pos]].pins--;
            sl_unhold(e, st->ids[pos]);
        }
    for (sl_stream **p = &e->streams; *p; p = &(*p)->next)
        if (*p == st) {
            *p = st->next;
            break;
        }
    e->nstreams--;
    sl_pump(e);
    sl_unlock(e);
    (void)m;
    return result != SLUICE_OK ? result : first_fail;
}

SLUICE_API int sluice_stream(sluice_model *m, const char *const *names, size_t n,
                             sluice_stream_fn fn, void *user)
{
    sl_err err = {0};
    sl_engine *e = engine_of(m);
    if (!e)
        return SLUICE_E_INVAL;
    if (!fn) {
        sl_fail(&err, SLUICE_E_INVAL, "sluice_stream: the callback is NULL");
        return sl_model_error(m, &err);
    }
    size_t *ids = NULL;
    if (names && sl_resolve(m, names, n, &ids, &err) < 0)
        return sl_model_error(m, &err);
    if (!names)
        n = e->n;
    sl_stream st = {0};
    st.ids = names ? ids : e->order;
    st.n = n;
    st.pstate = calloc(n ? n : 1, 1);
    st.pgen = calloc(n ? n : 1, sizeof *st.pgen);
    int rc;
    if (!st.pstate || !st.pgen)
        rc = sl_fail(&err, SLUICE_E_NOMEM, "sluice_stream: out of memory for %zu tensors", n);
    else
        rc = stream_run(m, e, &st, fn, user, &err);
    free(st.pstate);
    free(st.pgen);
    free(ids);
    return rc < 0 || rc != SLUICE_OK ? sl_model_error(m, &err) : SLUICE_OK;
}

