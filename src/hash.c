/* hash.c: the engine's workers. They hash tensors with SHA-256 (OpenSSL
 * EVP) while their chunks arrive, check the digest, and put O_DIRECT
 * bytes in place; then the tensor is READY.
 *
 * A slot is on the worker queue at most once and in one worker's hands at
 * most once (queued, busy), so its chunks are hashed in order, one after
 * the other, while different tensors hash in parallel. A worker hashes
 * every chunk that has arrived and goes back to the queue; the read
 * completion requeues the slot when the next chunk lands. Digest updates
 * and the move run with the engine lock dropped: while busy, nobody else
 * touches the slot's buffer or digest context.
 */
#include "engine_int.h"

#include "manifest.h"

#include <stdlib.h>
#include <string.h>

int sl_needs_work(const sl_engine *e, const sl_slot *s)
{
    (void)e;
    return s->hashed || (s->direct && (s->delta & (SL_POOL_ALIGN - 1)));
}

const unsigned char *sl_expected_digest(const sl_engine *e, size_t i)
{
    if (e->test_digest)
        return e->test_has[i] ? e->test_digest[i] : NULL;
    return sl_manifest_tensor_digest(e->manifest, i);
}

void sl_work_enqueue(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    s->queued = 1;
    s->hnext = SL_NONE;
    if (e->hq_tail != SL_NONE)
        e->slots[e->hq_tail].hnext = i;
    else
        e->hq_head = i;
    e->hq_tail = i;
    pthread_cond_signal(&e->wcv);
}

static void hex(char out[65], const unsigned char d[32])
{
    static const char digits[] = "0123456789abcdef";
    for (int k = 0; k < 32; k++) {
        out[2 * k] = digits[d[k] >> 4];
        out[2 * k + 1] = digits[d[k] & 15];
    }
    out[64] = '\0';
}

static void fail_slot(sl_engine *e, size_t i, const sl_err *err)
{
    sl_slot_error(e, i, err);
    e->slots[i].failing = 1;
}

/* Hashes what has arrived of slot i, and finishes it when all has. Lock
 * held on entry and exit; dropped around the work. */
static void work_on(sl_engine *e, size_t i)
{
    sl_slot *s = &e->slots[i];
    const struct sluice_tensor_info *t = &e->ix->tensors[i];
    unsigned char *buf = s->buf;
    uint64_t delta = s->delta, chunk = s->chunk, span = s->span;
    EVP_MD_CTX *md = s->md;
    while (!s->failing) {
        if (s->hashed && s->hash_next < s->nchunks && sl_chunk_done(s, s->hash_next)) {
            /* The tensor's bytes within this chunk (O_DIRECT spans have
             * bytes of neighbours around the tensor). */
            uint64_t b0 = (uint64_t)s->hash_next * chunk;
            uint64_t b1 = b0 + chunk < span ? b0 + chunk : span;
            uint64_t lo = b0 > delta ? b0 : delta;
            uint64_t hi = b1 < delta + t->nbytes ? b1 : delta + t->nbytes;
            uint64_t len = hi > lo ? hi - lo : 0;
            pthread_mutex_unlock(&e->lock);
            int ok = EVP_DigestUpdate(md, buf + lo, (size_t)len) == 1;
            pthread_mutex_lock(&e->lock);
            if (!ok) {
                char q[SL_QUOTE_MAX];
                sl_err err;
                sl_fail(&err, SLUICE_E_NOMEM, "tensor %s (file %s): SHA-256 update failed (OpenSSL)",
                        sl_quote(q, sizeof q, t->name, t->name_len), t->file);
                fail_slot(e, i, &err);
                break;
            }
            s->hash_next++;
            e->st.bytes_hashed += len;
            continue;
        }
        if (s->done < s->nchunks || (s->hashed && s->hash_next < s->nchunks))
            break;      /* more chunks to come; the completion requeues it */

        const unsigned char *want = sl_expected_digest(e, i);
        int hashed = s->hashed;
        unsigned char got[32];
        unsigned got_len = 0;
        pthread_mutex_unlock(&e->lock);
        int ok = !hashed || EVP_DigestFinal_ex(md, got, &got_len) == 1;
        int match = !want || (ok && memcmp(got, want, 32) == 0);
        unsigned char *data = buf + delta;
        if (ok && match && ((uintptr_t)data & (SL_POOL_ALIGN - 1))) {
            /* O_DIRECT put the tensor at its file offset modulo 4096 in
             * the span; move it to the buffer's start so the handle is
             * 64-byte aligned. The moved bytes are the hashed ones. */
            memmove(buf, data, (size_t)t->nbytes);
            data = buf;
        }
        pthread_mutex_lock(&e->lock);
        char q[SL_QUOTE_MAX];
        sl_quote(q, sizeof q, t->name, t->name_len);
        if (!ok) {
            sl_err err;
            sl_fail(&err, SLUICE_E_NOMEM, "tensor %s: SHA-256 final failed (OpenSSL)", q);
            fail_slot(e, i, &err);
        } else if (!match) {
            char hw[65], hg[65];
            hex(hw, want);
            hex(hg, got);
            sl_err err;
            sl_fail(&err, SLUICE_E_CHECKSUM,
                    "tensor %s (file %s, offset %llu, %llu bytes): SHA-256 mismatch: "
                    "expected %s, actual %s",
                    q, t->file, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                    hw, hg);
            fail_slot(e, i, &err);
            e->st.checksum_failures++;
        } else {
            s->data = data;
            if (hashed) {
                memcpy(s->digest, got, 32);
                s->has_digest = 1;
            }
            if (want)
                e->st.tensors_verified++;
            s->worked = 1;
        }
        break;
    }
}

static void *worker_main(void *arg)
{
    sl_engine *e = arg;
    pthread_mutex_lock(&e->lock);
    for (;;) {
        if (e->need_flush) {
            sl_unlock(e);
            pthread_mutex_lock(&e->lock);
            continue;
        }
        if (e->hq_head == SL_NONE) {
            if (e->wquit)
                break;
            pthread_cond_wait(&e->wcv, &e->lock);
            continue;
        }
        size_t i = e->hq_head;
        sl_slot *s = &e->slots[i];
        e->hq_head = s->hnext;
        if (e->hq_head == SL_NONE)
            e->hq_tail = SL_NONE;
        s->queued = 0;
        s->busy = 1;
        e->wbusy++;
        work_on(e, i);
        s->busy = 0;
        e->wbusy--;
        sl_settle(e, i);
        sl_pump(e);     /* a failure gave room back */
        if (e->wbusy == 0 && e->hq_head == SL_NONE)
            pthread_cond_broadcast(&e->cv); /* close waits for this */
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

int sl_workers_start(sl_engine *e, unsigned n, sl_err *err)
{
    if (n == 0)
        n = 1;
    pthread_t *w = calloc(n, sizeof *w);
    if (!w)
        return sl_fail(err, SLUICE_E_NOMEM, "engine: out of memory");
    pthread_mutex_lock(&e->lock);
    e->workers = w;
    e->wquit = 0;
    pthread_mutex_unlock(&e->lock);
    for (unsigned k = 0; k < n; k++) {
        int rc = pthread_create(&w[k], NULL, worker_main, e);
        if (rc != 0) {
            pthread_mutex_lock(&e->lock);
            e->nworkers = k;
            pthread_mutex_unlock(&e->lock);
            sl_workers_stop(e);
            return sl_fail_errno(err, SLUICE_E_NOMEM, rc, "engine: cannot start a hash thread");
        }
    }
    pthread_mutex_lock(&e->lock);
    e->nworkers = n;
    pthread_mutex_unlock(&e->lock);
    return SLUICE_OK;
}

void sl_workers_stop(sl_engine *e)
{
    pthread_mutex_lock(&e->lock);
    e->wquit = 1;
    pthread_cond_broadcast(&e->wcv);
    unsigned n = e->nworkers;
    pthread_t *w = e->workers;
    e->nworkers = 0;
    e->workers = NULL;
    pthread_mutex_unlock(&e->lock);
    for (unsigned k = 0; k < n; k++)
        pthread_join(w[k], NULL);
    free(w);
}
